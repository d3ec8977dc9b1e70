// The trainer's backend: where a model and its optimiser train, behind one small interface, so that
// the training loop (loop.cpp) is the same for every device (docs/training.md, "--device and
// --precision"). Two implement it: the CPU backend (make_cpu_backend, backend.cpp: the host model
// itself, with its tape) and the CUDA one (make_cuda_trainer, cuda_backend.cu).
//
// The CPU model (coupledqk::AnyGpt<float>) and the CPU optimiser (coupledqk::AdamW<float>) remain
// the storage format: a run initialises and restores them on the host, hands them to the backend
// with from_host(), and copies the backend's state back with to_host() before every checkpoint (a
// no-op on the CPU). A checkpoint written on either device therefore resumes on the other.
//
// make_cuda_trainer() lives in cuda_backend.cu (library coupledqk_cuda_train, built where nvcc is;
// backend.cpp sees COUPLEDQK_WITH_CUDA then).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

namespace coupledqk::train {

struct TrainOptions;

/// A model and its optimiser where they train.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu", or "cuda:0 NVIDIA H100 80GB HBM3 (compute capability 9.0), bf16 activations".
  virtual std::string description() const = 0;

  /// Copies the host model's parameters to the device and, when `optimizer` is given, creates the
  /// device optimiser with its configuration and copies its state (m, v, step count). The host
  /// model must be the variant and sizes the trainer was made for.
  virtual void from_host(AnyGpt<float>& model, AdamW<float>* optimizer) = 0;
  /// Copies the device parameters and optimiser state into the host model and optimiser.
  virtual void to_host(AnyGpt<float>& model, AdamW<float>& optimizer) = 0;

  /// zero_grad, then forward + backward of one batch: the mean loss (gradients stay on the device).
  virtual float step_loss(TokenSpan tokens, TokenSpan targets, Index batch) = 0;
  /// One AdamW update (from_host with an optimiser first): AdamW<float>::step's report.
  virtual StepReport optimizer_step() = 0;
  /// Mean loss of a batch without gradients.
  virtual float evaluate(TokenSpan tokens, TokenSpan targets, Index batch) = 0;

  // ---- data-parallel training (docs/distributed.md): the gradients of the last step_loss, as ONE
  // flat buffer of gradient_count() floats in the order of the host model's gradients() views.
  virtual Index gradient_count() const = 0;
  /// Device -> host and host -> device copies of that buffer (reduction through MPI).
  virtual void gradients_to_host(float* out) = 0;
  virtual void gradients_from_host(const float* in) = 0;
  /// "NCCL 2.27.3" where this build reduces between GPUs directly, "" otherwise.
  virtual std::string collectives() const = 0;
  /// Rank 0: a new NCCL unique id (bytes to send to the other ranks).
  virtual std::string new_collectives_id() = 0;
  /// Every rank, with rank 0's id: joins the NCCL communicator of `size` ranks.
  virtual void join_collectives(const std::string& id, int rank, int size) = 0;
  /// The mean of the gradient buffers of every rank, in place on every device (NCCL all-reduce;
  /// deterministic for a fixed rank count and topology). join_collectives first.
  virtual void average_gradients() = 0;

  // ---- the host model as trained (the CPU backend): its diagnostics and its thread count matter
  /// Whether the host model is the one trained (updated by every step), not a copy refreshed by to_host.
  virtual bool on_host() const { return false; }
  /// Gpt::dynamics_diagnostics of the trained model on `windows` windows of `tokens` (on_host() only).
  virtual std::vector<LayerDynamics> dynamics_diagnostics(TokenSpan tokens, Index windows) {
    (void)tokens;
    (void)windows;
    throw runtime_error(description() + ": the dynamics diagnostics need the host model (the CPU backend)");
  }
};

/// The CPU backend: `model` trained in place with its own tape; from_host binds the optimiser.
std::unique_ptr<Backend> make_cpu_backend(AnyGpt<float>& model);

/// The backend of o.device for `model` (initialised on the host): the CPU's, or the CUDA device's
/// (needs a build with CUDA support and a usable device; throws saying which is missing), which then
/// holds a copy of the model's parameters.
std::unique_ptr<Backend> make_backend(const TrainOptions& o, AnyGpt<float>& model);

/// --device cuda needs a build with CUDA support and a usable device; throws saying which is missing.
void require_cuda_device();

/// Whether this build can train on CUDA (--device cuda), i.e. it was configured with COUPLEDQK_CUDA.
bool cuda_support_compiled();

/// The cores that are idle now: the idle share of all CPUs over 0.25 s (/proc/stat) times the
/// core count, rounded down after adding 0.3, at least 1 (every core where /proc/stat is missing).
/// Several threads are much slower than one when another process competes for the cores (Eigen's
/// GEMM threads spin-wait on each other), so the automatic count avoids busy cores.
int idle_cores();

/// Sets Eigen's and OpenMP's thread counts (0: idle_cores(), shared among the ranks of a
/// distributed run on this machine) and returns the count. Without OpenMP: 1.
int set_threads(int threads);

/// Makes the GPU of this process the node-local rank's one (cudaSetDevice(local_rank mod the device
/// count)) and returns its index. A build with NCCL refuses more ranks on a machine than GPUs
/// (NCCL needs one GPU per rank), naming both counts; without NCCL the ranks share them.
int select_cuda_device(int local_rank, int local_size);

/// "" when a CUDA device is usable by this build, else why not (no driver, no device, no kernel
/// image for the GPU's architecture, ...).
std::string cuda_unavailable_reason();

/// A trainer for `config` (any registry variant) on the current CUDA device (0 unless
/// select_cuda_device chose another) with activations stored in
/// `precision` ("f32" or "bf16"). Throws coupledqk::cuda::cuda_error (a std::runtime_error) when
/// no device is usable, invalid_argument for a bad configuration or precision.
std::unique_ptr<Backend> make_cuda_trainer(const GptConfig& config, const std::string& precision);

}  // namespace coupledqk::train
