#include "backend.hpp"

#include "distributed/communicator.hpp"
#include "options.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace coupledqk::train {

namespace {

/// The host model trained in place: zero_grad, Gpt::loss on its tape, AdamW<float>::step.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Model& model) : model_(model) {}

  std::string description() const override { return "cpu"; }

  void from_host(Model& model, AdamW<float>* optimizer) override {
    require(&model == &model_, "cpu backend: from_host with another model than the one it trains");
    if (optimizer) optimizer_ = optimizer;
  }
  void to_host(Model& model, AdamW<float>& optimizer) override {
    require(&model == &model_ && &optimizer == optimizer_,
            "cpu backend: to_host with another model or optimiser than the ones it trains");
  }

  float step_loss(TokenSpan tokens, TokenSpan targets, Index batch) override {
    model_.zero_grad();
    // An activation that overflowed to inf / NaN inside the forward (the layers refuse non-finite
    // inputs) is the loss diverging: the caller's check reports it, on every rank alike.
    try {
      return model_.loss(tape_, tokens, targets, batch);
    } catch (const non_finite_error&) {
      return std::numeric_limits<float>::quiet_NaN();
    }
  }
  StepReport optimizer_step() override {
    require(optimizer_ != nullptr, "cpu backend: optimizer_step before the optimiser was set (from_host with one)");
    return optimizer_->step();
  }
  float evaluate(TokenSpan tokens, TokenSpan targets, Index batch) override {
    return model_.evaluate(tape_, tokens, targets, batch);
  }

  Index gradient_count() const override {
    Index n = 0;
    for (const auto& v : model_.gradients()) n += v.size();
    return n;
  }
  void gradients_to_host(float* out) override {
    for (const auto& v : model_.gradients()) out = std::copy(v.data, v.data + v.size(), out);
  }
  void gradients_from_host(const float* in) override {
    for (const auto& v : model_.gradients()) {
      std::copy(in, in + v.size(), v.data);
      in += v.size();
    }
  }
  std::string collectives() const override { return ""; }
  std::string new_collectives_id() override { throw no_collectives(); }
  void join_collectives(const std::string&, int, int) override { throw no_collectives(); }
  void average_gradients() override { throw no_collectives(); }

  bool on_host() const override { return true; }
  std::vector<LayerDynamics> dynamics_diagnostics(TokenSpan tokens, Index windows) override {
    return model_.dynamics_diagnostics(tape_, tokens, windows);
  }

 private:
  static runtime_error no_collectives() {
    return runtime_error("cpu backend: no device collectives (its gradients are reduced from host memory)");
  }

  Model& model_;
  AdamW<float>* optimizer_ = nullptr;
  Tape<float> tape_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Model& model) { return std::make_unique<CpuBackend>(model); }

void require_cuda_device() {
#ifdef COUPLEDQK_WITH_CUDA
  select_cuda_device(world().local_rank(), world().local_size());  // one GPU per rank of this machine
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw runtime_error("--device cuda: no CUDA device is usable (" + why + ")");
#else
  throw invalid_argument(
      "--device cuda: this build has no CUDA support (configure with -DCOUPLEDQK_CUDA=ON where nvcc is installed)");
#endif
}

std::unique_ptr<Backend> make_backend(const TrainOptions& o, Model& model) {
  if (o.device != "cuda") return make_cpu_backend(model);
  require_cuda_device();
#ifdef COUPLEDQK_WITH_CUDA
  auto dev = make_cuda_trainer(model.config(), o.precision);
  dev->from_host(model, nullptr);
  return dev;
#else
  return nullptr;  // not reached: require_cuda_device() threw
#endif
}

bool cuda_support_compiled() {
#ifdef COUPLEDQK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int idle_cores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#ifdef _OPENMP
  cores = omp_get_num_procs();
#endif
  cores = std::max(1, cores);
  // Busy and idle jiffies of all CPUs from the first line of /proc/stat, twice, 0.25 s apart.
  auto sample = [](double& busy, double& idle) {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (!(in >> cpu) || cpu != "cpu") return false;
    for (double& x : v)
      if (!(in >> x)) return false;
    idle = v[3] + v[4];  // idle + iowait
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return true;
  };
  double b0 = 0, i0 = 0, b1 = 0, i1 = 0;
  if (!sample(b0, i0)) return cores;
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  if (!sample(b1, i1) || b1 + i1 <= b0 + i0) return cores;
  const double idle_fraction = (i1 - i0) / ((b1 + i1) - (b0 + i0));
  return std::clamp(static_cast<int>(std::floor(idle_fraction * cores + 0.3)), 1, cores);
}

int set_threads(int threads) {
#ifdef _OPENMP
  if (threads <= 0) threads = std::max(1, idle_cores() / world().local_size());
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  return threads;
#else
  (void)threads;
  return 1;
#endif
}

}  // namespace coupledqk::train
