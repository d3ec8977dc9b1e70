// The CUDA Backend (trainer/backend.hpp): coupledqk::cuda::Gpt and coupledqk::cuda::AdamW behind the
// trainer's device interface. The one translation unit that compiles the registry's device models
// (every variant of the table x 2 precisions, through cuda::make_gpt).
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include <coupledqk/cuda/gpt.cuh>

#ifdef COUPLEDQK_WITH_NCCL
#include <nccl.h>
#endif

#include "trainer/backend.hpp"

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

#ifdef COUPLEDQK_WITH_NCCL
void nccl_check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw cu::cuda_error(std::string(call) + " failed: " + ncclGetErrorString(r) + " (NCCL_DEBUG=WARN tells more)");
}
#endif

class CudaTrainer final : public Backend {
 public:
  CudaTrainer(const GptConfig& config, cu::Precision precision) : model_(cu::make_gpt(config, precision)) {}
  ~CudaTrainer() override {
#ifdef COUPLEDQK_WITH_NCCL
    if (nccl_) ncclCommDestroy(nccl_);
#endif
  }

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

  Index gradient_count() const override { return model_->parameter_count(); }

  void gradients_to_host(float* out) override {
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(out, model_->gradients(), bytes(), cudaMemcpyDeviceToHost, model_->stream()));
    COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  }

  void gradients_from_host(const float* in) override {
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(model_->gradients(), in, bytes(), cudaMemcpyHostToDevice, model_->stream()));
    COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  }

  std::string collectives() const override {
#ifdef COUPLEDQK_WITH_NCCL
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "NCCL";
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
    return "";
#endif
  }

  std::string new_collectives_id() override {
#ifdef COUPLEDQK_WITH_NCCL
    ncclUniqueId id;
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return std::string(id.internal, sizeof id.internal);
#else
    throw invalid_argument("cuda trainer: this build has no NCCL (configure where NCCL is installed to train on several GPUs)");
#endif
  }

  void join_collectives(const std::string& id, int rank, int size) override {
#ifdef COUPLEDQK_WITH_NCCL
    ncclUniqueId u;
    require(id.size() == sizeof u.internal, "cuda trainer: an NCCL id of ", id.size(), " bytes; expected ",
            sizeof u.internal);
    std::copy(id.begin(), id.end(), u.internal);
    nccl_check(ncclCommInitRank(&nccl_, size, u, rank), "ncclCommInitRank");
#else
    (void)id;
    (void)rank;
    (void)size;
    throw invalid_argument("cuda trainer: this build has no NCCL (configure where NCCL is installed to train on several GPUs)");
#endif
  }

  void average_gradients() override {
#ifdef COUPLEDQK_WITH_NCCL
    require(nccl_ != nullptr, "cuda trainer: average_gradients before join_collectives");
    // ncclAvg: the sum (NCCL's fixed ring/tree order for this rank count and topology) over size.
    nccl_check(ncclAllReduce(model_->gradients(), model_->gradients(), static_cast<std::size_t>(gradient_count()),
                             ncclFloat32, ncclAvg, nccl_, model_->stream()),
               "ncclAllReduce");
    COUPLEDQK_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
#else
    throw invalid_argument("cuda trainer: this build has no NCCL (configure where NCCL is installed to train on several GPUs)");
#endif
  }

 private:
  std::size_t bytes() const { return static_cast<std::size_t>(model_->parameter_count()) * sizeof(float); }

  std::unique_ptr<cu::AnyGpt> model_;
  std::unique_ptr<cu::AdamW> optimizer_;
#ifdef COUPLEDQK_WITH_NCCL
  ncclComm_t nccl_ = nullptr;
#endif
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

int select_cuda_device(int local_rank, int local_size) {
#ifdef COUPLEDQK_WITH_NCCL
  const bool exclusive = true;
#else
  const bool exclusive = false;
#endif
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    (void)cudaGetLastError();
    return 0;  // make_cuda_trainer says why no device is usable
  }
  if (exclusive && local_size > count)
    throw invalid_argument("--device cuda: " + std::to_string(local_size) + " ranks on this machine but " +
                           std::to_string(count) + " CUDA device(s); NCCL needs one GPU per rank (start at most " +
                           std::to_string(count) + " ranks per machine, e.g. mpirun --map-by ppr:" +
                           std::to_string(count) + ":node)");
  const int device = local_rank % count;
  COUPLEDQK_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

std::unique_ptr<Backend> make_cuda_trainer(const GptConfig& config, const std::string& precision) {
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
