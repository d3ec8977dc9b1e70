// The CUDA DeviceTrainer (device.hpp): coupledqk::cuda::Gpt and coupledqk::cuda::AdamW behind the
// trainer's device interface. The one translation unit that compiles the registry's device models
// (44 variants x 2 precisions, through cuda::make_gpt).
#include <cuda_runtime.h>

#include <memory>
#include <sstream>
#include <string>

#include <coupledqk/cuda/gpt.cuh>

#include "device.hpp"

namespace coupledqk::train {

namespace {

namespace cu = coupledqk::cuda;

/// A kernel of this binary, to ask the runtime whether it has an image for the device's architecture.
__global__ void probe_kernel(int* out) {
  if (out) *out = 1;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:" + std::to_string(device);
  }
  std::ostringstream os;
  os << "cuda:" << device << " " << prop.name << " (compute capability " << prop.major << "." << prop.minor << ", "
     << (prop.totalGlobalMem >> 20) << " MiB)";
  return os.str();
}

class CudaTrainer final : public DeviceTrainer {
 public:
  CudaTrainer(const GptConfig& config, cu::Precision precision) : model_(cu::make_gpt(config, precision)) {}

  std::string description() const override {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) (void)cudaGetLastError();
    return device_name(device) + ", " +
           (model_->precision() == cu::Precision::bf16 ? "bf16 activations (float32 masters and gradients)"
                                                       : "float32");
  }

  void from_host(AnyGpt<float>& model, AdamW<float>* optimizer) override {
    model_->upload(model);
    if (optimizer) {
      optimizer_ = std::make_unique<cu::AdamW>(*model_, optimizer->config());
      optimizer_->upload(*optimizer);
    }
  }

  void to_host(AnyGpt<float>& model, AdamW<float>& optimizer) override {
    model_->download(model);
    require(optimizer_ != nullptr, "cuda trainer: to_host before the optimiser was set up (from_host with one)");
    optimizer_->download(optimizer);
  }

  float step_loss(TokenSpan tokens, TokenSpan targets, Index batch) override {
    model_->zero_grad();
    return model_->loss(tokens, targets, batch);
  }

  StepReport optimizer_step() override {
    require(optimizer_ != nullptr, "cuda trainer: optimizer_step before the optimiser was set up (from_host with one)");
    return optimizer_->step();
  }

  float evaluate(TokenSpan tokens, TokenSpan targets, Index batch) override {
    return model_->evaluate(tokens, targets, batch);
  }

 private:
  std::unique_ptr<cu::AnyGpt> model_;
  std::unique_ptr<cu::AdamW> optimizer_;
};

}  // namespace

std::string cuda_unavailable_reason() {
  const std::string why = cu::no_device_reason();
  if (!why.empty()) return why;
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    int device = 0;
    cudaDeviceProp prop{};
    std::ostringstream os;
    os << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
    if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
      os << "; device " << device << " is " << prop.name << ", compute capability " << prop.major << "." << prop.minor
         << " (rebuild with -DCMAKE_CUDA_ARCHITECTURES=native or that architecture)";
    (void)cudaGetLastError();
    return os.str();
  }
  return "";
}

std::unique_ptr<DeviceTrainer> make_cuda_trainer(const GptConfig& config, const std::string& precision) {
  cu::Precision p = cu::Precision::f32;
  try {
    p = cu::parse_precision(precision);
  } catch (const std::exception& e) {
    throw invalid_argument(std::string("--precision: ") + e.what());
  }
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw cu::cuda_error("--device cuda: no CUDA device is usable (" + why + ")");
  return std::make_unique<CudaTrainer>(config, p);
}

}  // namespace coupledqk::train
