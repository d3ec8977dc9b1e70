// Training on a device other than the CPU, behind a small interface, so that trainer.cpp stays the
// one training loop for every device (docs/training.md, "--device and --precision").
//
// The CPU model (coupledqk::AnyGpt<float>) and the CPU optimiser (coupledqk::AdamW<float>) remain
// the storage format: a run initialises and restores them on the host, hands them to the device
// with from_host(), and copies the device's state back with to_host() before every checkpoint. A
// checkpoint written by either device therefore resumes on the other.
//
// make_cuda_trainer() lives in cuda_trainer.cu (library coupledqk_cuda_train, built where nvcc is;
// trainer.cpp sees COUPLEDQK_WITH_CUDA then).
#pragma once

#include <memory>
#include <string>

#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

namespace coupledqk::train {

/// A model and its optimiser on a device.
class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;

  /// "cuda:0 NVIDIA H100 80GB HBM3 (compute capability 9.0), bf16 activations".
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
};

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
std::unique_ptr<DeviceTrainer> make_cuda_trainer(const GptConfig& config, const std::string& precision);

}  // namespace coupledqk::train
