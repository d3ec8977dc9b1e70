// Benchmarks of the CUDA specialisations (Google Benchmark, timed with CUDA events).
//
//     coupledqk-bench-cuda [google benchmark flags, e.g. --benchmark_filter=layer/leapfrog]
//
// Without a usable device it prints "skipped: no CUDA device (...)" and exits 0.
// Every case reports TFLOP/s of useful work (bench/flops.hpp: the formulas) and MFU, its fraction of
// the GPU's peak measured by this binary with a large cuBLAS GEMM in the same precision (bf16
// operands with float accumulation, or float32 without TF32). Names:
//     cuda/layer/<variant>/<steps>/<precision>/<pass>/B<B>/T<T>/D<D>      pass: fwd or fwdbwd
//     cuda/gpt/<variant>/<steps>/<precision>/V<V>/D<D>/L<L>/H<H>/T<T>/B<B>  (one training step:
//                                   forward, backward, AdamW with clipping)
//     cuda/gemm/<precision>/<n>
// The variants come from the variant table (coupledqk::builtin_variants): every one the device
// supports (cuda::device_support_of: its integrator's DeviceDynamics and its scoring's DeviceScoring)
// at 1 step, and the table's first symplectic flow (the paper's integrator) at 3 steps too; the GPT
// step for the table's first variant without dynamics (the baseline) and that flow.
// The issue's shape is B=16, T=1024, D=512, H=8 (d=64), bf16.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <coupledqk/coupledqk.hpp>
#include <coupledqk/cuda/attention.cuh>
#include <coupledqk/cuda/gpt.cuh>

#include "flops.hpp"

namespace cqk = coupledqk;
namespace cu = coupledqk::cuda;

namespace {

double g_peak_tflops[2] = {0, 0};  // [f32, bf16], measured once in main()

/// Times `fn` (device work on the default stream) with CUDA events: milliseconds per call, after
/// one warm-up, as the mean over `reps` back-to-back calls.
template <class F>
double event_ms(F&& fn, int reps) {
  fn();
  cudaEvent_t a, b;
  COUPLEDQK_CUDA_CHECK(cudaEventCreate(&a));
  COUPLEDQK_CUDA_CHECK(cudaEventCreate(&b));
  COUPLEDQK_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) fn();
  COUPLEDQK_CUDA_CHECK(cudaEventRecord(b));
  COUPLEDQK_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  COUPLEDQK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  COUPLEDQK_CUDA_CHECK(cudaEventDestroy(a));
  COUPLEDQK_CUDA_CHECK(cudaEventDestroy(b));
  return ms / reps;
}

template <class T>
cu::DeviceBuffer<T> random_device(std::size_t n, std::uint64_t seed, double std) {
  cqk::Rng rng(seed);
  std::vector<float> h(n);
  for (auto& x : h) x = static_cast<float>(std * rng.normal());
  cu::DeviceBuffer<float> f;
  f.upload(h);
  cu::DeviceBuffer<T> out(n);
  cu::convert<T, float>(f.data(), out.data(), static_cast<cu::Index>(n));
  return out;
}

/// C = A B, n x n x n, in storage T with float accumulation (TF32 off for float): TFLOP/s.
template <class T>
double gemm_tflops(int n) {
  cu::Blas blas;
  auto a = random_device<T>(std::size_t(n) * n, 1, 1.0), b = random_device<T>(std::size_t(n) * n, 2, 1.0);
  cu::DeviceBuffer<T> c(std::size_t(n) * n);
  const double ms = event_ms([&] { cu::gemm<T, T>(blas, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); }, 20);
  return 2.0 * n * n * double(n) / (ms / 1e3) / 1e12;
}

template <class T>
void gemm_benchmark(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  double tflops = 0;
  for (auto _ : state) {
    tflops = gemm_tflops<T>(n);
    state.SetIterationTime(2.0 * n * n * double(n) / (tflops * 1e12));
  }
  state.counters["TFLOPS"] = tflops;
}

template <class I, class Sc, class T>
void layer_benchmark(benchmark::State& state, std::string variant, bool backward, int B, int T_, int D) {
  cqk::AttentionConfig cfg;
  cfg.dim = D;
  cfg.heads = D / 64;
  cfg.dynamics_init_scale = 0.1;
  const cqk::Attention<float, I, Sc> host(cfg, 1);
  cu::Attention<I, Sc, T> layer(cfg);
  cu::DeviceBuffer<float> params(static_cast<std::size_t>(layer.parameter_count())), grads(params.size());
  cu::upload_parameters(host.params, params.data());
  cu::DeviceBuffer<T> params_t(params.size());
  cu::convert<T, float>(params.data(), params_t.data(), static_cast<cu::Index>(params.size()));
  const std::size_t n = std::size_t(B) * T_ * D;
  auto x = random_device<T>(n, 3, 1.0);
  auto dy = random_device<float>(n, 4, 1.0);
  cu::DeviceBuffer<T> y(n);
  cu::DeviceBuffer<float> dx(n);
  grads.zero();
  cu::Blas blas;
  typename cu::Attention<I, Sc, T>::Context ctx;
  auto run = [&] {
    layer.forward(blas, params.data(), params_t.data(), x.data(), B, T_, y.data(), ctx, backward);
    if (backward) layer.backward(blas, params.data(), params_t.data(), ctx, dy.data(), dx.data(), grads.data());
  };
  double ms = 0;
  for (auto _ : state) {
    ms = event_ms(run, 10);
    state.SetIterationTime(ms / 1e3);
  }
  const double flops = (backward ? 3 : 1) * cqk::bench::layer_forward_flops(variant, I::steps, B, T_, D, cfg.heads, 64);
  const double tflops = flops / (ms / 1e3) / 1e12;
  state.counters["TFLOPS"] = tflops;
  state.counters["mfu"] = tflops / g_peak_tflops[std::is_same_v<T, cu::bf16> ? 1 : 0];
  state.counters["tokens_per_s"] = double(B) * T_ / (ms / 1e3);
}

/// One training step of the GPU GPT: zero the gradients, forward + backward, AdamW (with the
/// global-norm clipping, which synchronises once per step as the trainer's does).
void gpt_benchmark(benchmark::State& state, std::string variant, int steps, cu::Precision precision, int V, int D,
                   int L, int H, int T, int B) {
  cqk::GptConfig c;
  c.vocab = V;
  c.dim = D;
  c.layers = L;
  c.heads = H;
  c.context = T;
  c.attention = variant;
  c.steps = steps;
  c.dynamics_init_scale = 0.1;
  auto host = cqk::make_gpt<float>(c, 1);
  auto model = cu::make_gpt(c, precision);
  model->upload(*host);
  cqk::AdamWConfig oc;
  oc.lr = 3e-4;
  oc.total_steps = 1000000;
  cu::AdamW opt(*model, oc);
  cqk::Rng rng(5);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(V));
    targets[i] = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(V));
  }
  auto step = [&] {
    model->zero_grad();
    model->loss(tokens, targets, B);
    opt.step();
  };
  double ms = 0;
  for (auto _ : state) {
    ms = event_ms(step, 5);
    state.SetIterationTime(ms / 1e3);
  }
  const double tflops = cqk::bench::gpt_step_flops(variant, steps, V, D, L, H, T, B) / (ms / 1e3) / 1e12;
  state.counters["TFLOPS"] = tflops;
  state.counters["mfu"] = tflops / g_peak_tflops[precision == cu::Precision::bf16 ? 1 : 0];
  state.counters["tokens_per_s"] = double(B) * T / (ms / 1e3);
}

template <class I, class Sc>
void register_layer(const std::string& variant) {
  const int B = 16, T = 1024, D = 512;
  for (bool bf16 : {true, false})
    for (bool bwd : {false, true}) {
      const std::string name = "cuda/layer/" + variant + "/" + std::to_string(I::steps) + "/" + (bf16 ? "bf16" : "f32") +
                               "/" + (bwd ? "fwdbwd" : "fwd") + "/B" + std::to_string(B) + "/T" + std::to_string(T) +
                               "/D" + std::to_string(D);
      if (bf16)
        benchmark::RegisterBenchmark(name.c_str(), layer_benchmark<I, Sc, cu::bf16>, variant, bwd, B, T, D)
            ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
      else
        benchmark::RegisterBenchmark(name.c_str(), layer_benchmark<I, Sc, float>, variant, bwd, B, T, D)
            ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    }
}

// ---- the cases, from the variant table --------------------------------------------------------

using Table = std::decay_t<decltype(cqk::builtin_variants)>;
template <std::size_t K>
using Entry = std::tuple_element_t<K, typename Table::entries>;
template <std::size_t K>
using EntryAtOne = typename Entry<K>::family::template at<1>;  // the entry's integrator at 1 step

/// The first entry (in table order) whose integrator satisfies Pred, or Table::size.
template <template <class> class Pred, std::size_t... K>
constexpr std::size_t first_entry(std::index_sequence<K...>) {
  std::size_t out = Table::size;
  ((out == Table::size && Pred<EntryAtOne<K>>::value ? (out = K, 0) : 0), ...);
  return out;
}
template <class I>
struct is_baseline : std::bool_constant<!I::has_dynamics> {};
template <class I>
struct is_symplectic_flow : std::bool_constant<I::has_dynamics && I::is_symplectic> {};
constexpr auto kEntries = std::make_index_sequence<Table::size>{};
constexpr std::size_t kBaseline = first_entry<is_baseline>(kEntries);
constexpr std::size_t kFlow = first_entry<is_symplectic_flow>(kEntries);
static_assert(kBaseline < Table::size && kFlow < Table::size,
              "bench_cuda: the variant table needs an entry without dynamics and one with a symplectic flow");

/// Entry K's layer benchmarks at 1 step (and at 3 for the flow), if the device supports it.
template <std::size_t K>
void register_entry(const std::string& name) {
  using Sc = typename Entry<K>::scoring;
  if constexpr (cu::device_support_of<EntryAtOne<K>, Sc>().both()) {
    register_layer<EntryAtOne<K>, Sc>(name);
    if constexpr (K == kFlow) register_layer<typename Entry<K>::family::template at<3>, Sc>(name);
  }
}
template <std::size_t... K>
void register_layers(const std::vector<std::string>& names, std::index_sequence<K...>) {
  (register_entry<K>(names[K]), ...);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string why = cu::no_device_reason();
  if (!why.empty()) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  COUPLEDQK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_peak_tflops[0] = gemm_tflops<float>(8192);
  g_peak_tflops[1] = gemm_tflops<cu::bf16>(8192);
  std::fprintf(stderr, "coupledqk-bench-cuda: %s (sm_%d%d, %d SMs); cuBLAS GEMM peak f32 %.1f, bf16 %.1f TFLOP/s (n = 8192)\n",
               prop.name, prop.major, prop.minor, prop.multiProcessorCount, g_peak_tflops[0], g_peak_tflops[1]);

  benchmark::RegisterBenchmark("cuda/gemm/f32/8192", gemm_benchmark<float>)->Arg(8192)->UseManualTime()->Iterations(1);
  benchmark::RegisterBenchmark("cuda/gemm/bf16/8192", gemm_benchmark<cu::bf16>)->Arg(8192)->UseManualTime()->Iterations(1);
  const std::vector<std::string> names = cqk::builtin_variants.names();
  register_layers(names, kEntries);
  // The paper-like model of the issue: D=512, L=8, H=8, T=1024, V=8192 (about 30M parameters).
  for (const std::string& v : {names[kBaseline], names[kFlow]})
    for (cu::Precision p : {cu::Precision::bf16, cu::Precision::f32}) {
      const int V = 8192, D = 512, L = 8, H = 8, T = 1024, B = 16;
      const std::string name = "cuda/gpt/" + v + "/1/" + cu::to_string(p) + "/V" + std::to_string(V) + "/D" +
                               std::to_string(D) + "/L" + std::to_string(L) + "/H" + std::to_string(H) + "/T" +
                               std::to_string(T) + "/B" + std::to_string(B);
      benchmark::RegisterBenchmark(name.c_str(), gpt_benchmark, v, 1, p, V, D, L, H, T, B)
          ->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
