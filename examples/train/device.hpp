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
};

/// "" when a CUDA device is usable by this build, else why not (no driver, no device, no kernel
/// image for the GPU's architecture, ...).
std::string cuda_unavailable_reason();

/// A trainer for `config` (any registry variant) on CUDA device 0 with activations stored in
/// `precision` ("f32" or "bf16"). Throws coupledqk::cuda::cuda_error (a std::runtime_error) when
/// no device is usable, invalid_argument for a bad configuration or precision.
std::unique_ptr<DeviceTrainer> make_cuda_trainer(const GptConfig& config, const std::string& precision);

}  // namespace coupledqk::train
