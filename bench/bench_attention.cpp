// Benchmarks of the attention layer on the CPU (Google Benchmark).
//
//     coupledqk-bench [--threads N] [google benchmark flags, e.g. --benchmark_filter=leapfrog/1/softmax/T512]
//
// Every case reports GFLOP/s of useful work ("GFLOPS") and its fraction of the machine's peak
// ("peak_frac"), the peak being a large Eigen SGEMM measured by this binary on the same threads.
// Names: layer/<variant>/<steps>/<pass>/B<B>/T<T>/D<D> with pass fwd or fwdbwd; the GPT training
// step cases (gpt/...) are in bench_gpt.cpp.
#include <benchmark/benchmark.h>

#include <coupledqk/coupledqk.hpp>
#include <coupledqk/core/parallel.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"

namespace cqk = coupledqk;
using coupledqk_bench::g_peak_gflops;  // measured once in main()
using coupledqk_bench::forward_flops;

namespace {

// C = A B with A, B, C [n, n] float: 2 n^3 flops.
double measure_sgemm_gflops(int n, double seconds) {
  cqk::Matrix<float> a = cqk::Matrix<float>::Random(n, n), b = cqk::Matrix<float>::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm-up
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    c.noalias() = a * b;
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  benchmark::DoNotOptimize(c.data());
  return 2.0 * n * n * double(n) * reps / elapsed / 1e9;
}

void layer_benchmark(benchmark::State& state, std::string variant, int steps, bool backward, int B, int T, int D) {
  cqk::AttentionConfig cfg;
  cfg.dim = D;
  cfg.heads = D / 64;  // head size 64
  cfg.dynamics_init_scale = 0.1;
  auto layer = cqk::make_attention<float>(variant, steps, cfg, 1);
  cqk::Rng rng(2);
  cqk::Matrix<float> x(B * T, D), dy(B * T, D);
  rng.fill_normal(x, 1.0);
  rng.fill_normal(dy, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    cqk::Matrix<float> y = layer->forward(x, B);
    if (backward) {
      cqk::Matrix<float> dx = layer->backward(dy);
      benchmark::DoNotOptimize(dx.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  // Rates from wall time (the work is spread over threads; CPU time of one thread would overstate).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = (backward ? 3 : 1) * forward_flops(variant, steps, B, T, D, cfg.heads, D / cfg.heads);
  const double gflops = flops * double(state.iterations()) / seconds / 1e9;
  state.counters["GFLOPS"] = gflops;
  state.counters["peak_frac"] = gflops / g_peak_gflops;
  state.counters["tokens_per_s"] = double(B) * T * double(state.iterations()) / seconds;
  state.SetLabel(std::to_string(cqk::max_threads()) + " threads");
}

void sgemm_benchmark(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  cqk::Matrix<float> a = cqk::Matrix<float>::Random(n, n), b = cqk::Matrix<float>::Random(n, n), c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n * n * double(n) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);  // real time
}

}  // namespace

int main(int argc, char** argv) {
  // --threads N (ours): OpenMP threads for Eigen and the attention loops.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
#ifdef _OPENMP
      omp_set_num_threads(std::atoi(argv[++i]));
#else
      ++i;
#endif
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  g_peak_gflops = measure_sgemm_gflops(2048, 2.0);
  std::fprintf(stderr, "coupledqk-bench: SGEMM peak %.1f GFLOP/s on %d threads (Eigen, n = 2048)\n", g_peak_gflops,
               cqk::max_threads());

  benchmark::RegisterBenchmark("sgemm", sgemm_benchmark)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
  const char* variants[] = {"standard", "leapfrog", "euler", "uncoupled", "diff", "diff-leapfrog", "diff-euler", "diff-uncoupled",
                            "affine",   "diff-affine"};
  for (const char* v : variants)
    for (int steps : {1, 3}) {
      if ((std::string(v) == "standard" || std::string(v) == "diff") && steps != 1) continue;
      for (bool bwd : {false, true})
        for (int D : {256, 512})
          for (int T : {128, 256, 512, 1024}) {
            const int B = 4;
            const std::string name = std::string("layer/") + v + "/" + std::to_string(steps) + "/" +
                                     (bwd ? "fwdbwd" : "fwd") + "/B" + std::to_string(B) + "/T" + std::to_string(T) +
                                     "/D" + std::to_string(D);
            benchmark::RegisterBenchmark(name.c_str(), layer_benchmark, std::string(v), steps, bwd, B, T, D)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime()
                ->MinTime(0.5);
          }
    }
  coupledqk_bench::register_gpt_benchmarks();  // bench_gpt.cpp
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
