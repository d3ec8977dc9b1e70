// Benchmarks of the attention layer on the CPU (Google Benchmark).
//
//     coupledqk-bench [--threads N] [--peak-gflops G] [google benchmark flags, e.g. --benchmark_filter=leapfrog/1/fwd]
//
// Every case reports GFLOP/s of useful work ("GFLOPS") and its fraction of a peak ("peak_frac"). The
// binary measures the library's own SGEMM (coupledqk::gemm, the driver every product of the model
// goes through: 2048 x 2048 x 2048 float on the same threads) and prints it; the peak is that figure
// unless --peak-gflops gives the machine's (bench/peers/side_by_side.py passes OpenBLAS's SGEMM on
// the CPU's own kernels, bench/peers/openblas.py), so that peak_frac is a fraction of what the
// machine can do rather than of what this library's GEMM does.
// Names: layer/<variant>/<steps>/<pass>/B<B>/T<T>/D<D> with pass fwd or fwdbwd;
// mask/<kind>/<variant>/<pass>/B<B>/T<T>/D<D> for the masks and layouts (kind: causal, bidir,
// causal-w<w>, bidir-w<w>; padded-half and packed-half: B sequences of T/2 tokens, right-padded to T
// or packed end to end; GFLOP/s count the pairs each mask lets through); the GPT training step cases
// (gpt/...) are in bench_gpt.cpp. narrow/<product>/<gemm|small_gemm>: one product of a dynamics chunk on
// one thread (peak_frac: of one thread's share of the peak).
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

// C = A B with A, B, C [n, n] float through coupledqk::gemm: 2 n^3 flops.
double measure_sgemm_gflops(int n, double seconds) {
  cqk::Matrix<float> a = cqk::Matrix<float>::Random(n, n), b = cqk::Matrix<float>::Random(n, n), c(n, n);
  cqk::gemm<float>(a, false, b, false, c);  // warm-up (sizes the packing buffers)
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    cqk::gemm<float>(a, false, b, false, c);
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

/// The mask and layout of a mask/... case: the layer's config and the rows' sequences.
struct MaskCase {
  bool causal = true;
  cqk::Index window = 0;
  enum { equal, padded_half, packed_half } layout = equal;
};

MaskCase parse_mask_kind(const std::string& kind) {
  MaskCase m;
  if (kind == "padded-half") {
    m.layout = MaskCase::padded_half;
  } else if (kind == "packed-half") {
    m.layout = MaskCase::packed_half;
  } else {
    m.causal = kind.rfind("causal", 0) == 0;
    const std::size_t w = kind.find("-w");
    if (w != std::string::npos) m.window = std::stol(kind.substr(w + 2));
  }
  return m;
}

/// Query-key pairs a sequence of L tokens lets through under the mask.
double visible_pairs(const MaskCase& m, double L) {
  double pairs = 0;
  for (cqk::Index t = 0; t < static_cast<cqk::Index>(L); ++t) {
    const cqk::Mask mask{m.causal, m.window};
    pairs += static_cast<double>(mask.end(t, static_cast<cqk::Index>(L)) - mask.begin(t));
  }
  return pairs;
}

void mask_benchmark(benchmark::State& state, std::string kind, std::string variant, bool backward, int B, int T,
                    int D) {
  const MaskCase m = parse_mask_kind(kind);
  cqk::AttentionConfig cfg;
  cfg.dim = D;
  cfg.heads = D / 64;
  cfg.dynamics_init_scale = 0.1;
  cfg.causal = m.causal;
  cfg.window = m.window;
  auto layer = cqk::make_attention<float>(variant, 1, cfg, 1);
  cqk::Sequences seqs = cqk::Sequences::equal(B, T);
  double tokens = double(B) * T, pairs = B * visible_pairs(m, T);
  if (m.layout != MaskCase::equal) {
    const int L = T / 2;
    std::vector<cqk::Index> lengths(B, L), offsets(B + 1);
    for (int b = 0; b <= B; ++b) offsets[b] = cqk::Index(b) * L;
    seqs = m.layout == MaskCase::padded_half ? cqk::Sequences::padded(T, lengths) : cqk::Sequences::packed(offsets);
    tokens = double(B) * L;
    pairs = B * visible_pairs(m, L);
  }
  cqk::Rng rng(2);
  cqk::Matrix<float> x(seqs.rows(), D), dy(seqs.rows(), D);
  rng.fill_normal(x, 1.0);
  rng.fill_normal(dy, 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    cqk::Matrix<float> y = layer->forward(x, seqs);
    if (backward) {
      cqk::Matrix<float> dx = layer->backward(dy);
      benchmark::DoNotOptimize(dx.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // useful work: the projections of the valid tokens (8 tokens D^2) and, per visible pair, q.k and
  // p v over every head (4 D); forward + backward counts 3x
  const double flops = (backward ? 3 : 1) * (8.0 * tokens * D * D + 4.0 * pairs * D);
  state.counters["GFLOPS"] = flops * double(state.iterations()) / seconds / 1e9;
  state.counters["peak_frac"] = state.counters["GFLOPS"] / g_peak_gflops;
  state.counters["tokens_per_s"] = tokens * double(state.iterations()) / seconds;
  state.counters["pairs"] = pairs;
  state.SetLabel(std::to_string(cqk::max_threads()) + " threads");
}

// The library's SGEMM (coupledqk::gemm), and Eigen's own product driver beside it.
void sgemm_benchmark(benchmark::State& state, bool eigen_driver) {
  const int n = static_cast<int>(state.range(0));
  cqk::Matrix<float> a = cqk::Matrix<float>::Random(n, n), b = cqk::Matrix<float>::Random(n, n), c(n, n);
  for (auto _ : state) {
    if (eigen_driver)
      c.noalias() = a * b;
    else
      cqk::gemm<float>(a, false, b, false, c);
    benchmark::DoNotOptimize(c.data());
  }
  const double gflops_per_iteration = 2.0 * n * n * double(n) / 1e9;
  state.counters["GFLOPS"] = benchmark::Counter(gflops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_frac"] =
      benchmark::Counter(gflops_per_iteration / g_peak_gflops, benchmark::Counter::kIsIterationInvariantRate);
}

// One product of a dynamics chunk (256 rows, head size 64, hidden width 64) on one thread, as the
// layer runs it inside its parallel loop over chunks: coupledqk::gemm against coupledqk::small_gemm
// (core/small_gemm.hpp). product: x_At = x A^T (op(B) copied), act_B = act B (op(B) in place),
// actT_ybar = act^T ybar (op(A) transposed, depth 256). GFLOP/s of 2 M N K.
void narrow_benchmark(benchmark::State& state, std::string product, bool small) {
  const cqk::Index P = 256, d = 64;
  const bool ta = product == "actT_ybar", tb = product == "x_At";
  cqk::Rng rng(6);
  cqk::Matrix<float> a(P, d), b(ta ? P : d, d), c(ta ? d : P, d);
  rng.fill_normal(a, 1.0);
  rng.fill_normal(b, 1.0);
  const int threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);  // as inside the layer's parallel loop: gemm on the calling thread
  for (auto _ : state) {
    if (small)
      cqk::small_gemm<float>(a, ta, b, tb, c);
    else
      cqk::gemm<float>(a, ta, b, tb, c);
    benchmark::DoNotOptimize(c.data());
  }
  Eigen::setNbThreads(threads);
  const double gflops_per_iteration = 2.0 * double(P) * double(d) * double(d) / 1e9;
  state.counters["GFLOPS"] = benchmark::Counter(gflops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_frac"] = benchmark::Counter(gflops_per_iteration / g_peak_gflops * cqk::max_threads(),
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  // --threads N (ours): OpenMP threads for Eigen and the attention loops. --peak-gflops G (ours): the
  // machine's SGEMM peak to divide by (default: the library's SGEMM measured here).
  std::vector<char*> args;
  double given_peak = 0;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      const int threads = std::atoi(argv[++i]);
      if (threads < 1) {
        std::fprintf(stderr, "coupledqk-bench: --threads must be a positive integer; got '%s'\n", argv[i]);
        return 2;
      }
#ifdef _OPENMP
      omp_set_num_threads(threads);
#endif
      continue;
    }
    if (std::strcmp(argv[i], "--peak-gflops") == 0 && i + 1 < argc) {
      given_peak = std::atof(argv[++i]);
      if (!(given_peak > 0)) {
        std::fprintf(stderr, "coupledqk-bench: --peak-gflops must be a positive number (GFLOP/s); got '%s'\n",
                     argv[i]);
        return 2;
      }
      continue;
    }
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  const double own = measure_sgemm_gflops(2048, 2.0);
  g_peak_gflops = given_peak > 0 ? given_peak : own;
  std::fprintf(stderr, "coupledqk-bench: library SGEMM %.1f GFLOP/s on %d threads (coupledqk::gemm, n = 2048)\n", own,
               cqk::max_threads());
#if defined(EIGEN_VECTORIZE_AVX512)
  const char* isa = "AVX-512";
#elif defined(EIGEN_VECTORIZE_AVX2) && defined(EIGEN_VECTORIZE_FMA)
  const char* isa = "AVX2 + FMA";
#elif defined(EIGEN_VECTORIZE_AVX)
  const char* isa = "AVX";
#elif defined(EIGEN_VECTORIZE_SSE2)
  const char* isa = "SSE2";
#else
  const char* isa = "no SIMD";
#endif
  std::fprintf(stderr, "coupledqk-bench: instruction set: %s (Eigen packets of %d floats)\n", isa,
               static_cast<int>(Eigen::internal::packet_traits<float>::size));
  // the kernel under coupledqk::gemm (Eigen's, or OpenBLAS's with -DCOUPLEDQK_BLAS=OpenBLAS, and then
  // the core OpenBLAS detected, or why it is not used)
  std::fprintf(stderr, "coupledqk-bench: gemm backend: %s\n", cqk::gemm_backend_description().c_str());
  benchmark::AddCustomContext("gemm_backend", cqk::gemm_backend_description());
  benchmark::AddCustomContext("instruction_set", isa);
  std::fprintf(stderr, "coupledqk-bench: SGEMM peak %.1f GFLOP/s (%s)\n", g_peak_gflops,
               given_peak > 0 ? "--peak-gflops" : "the library's SGEMM above");

  benchmark::RegisterBenchmark("sgemm", sgemm_benchmark, false)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("sgemm-eigen", sgemm_benchmark, true)
      ->Arg(2048)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (const char* product : {"x_At", "act_B", "actT_ybar"})
    for (bool small : {false, true})
      benchmark::RegisterBenchmark((std::string("narrow/") + product + (small ? "/small_gemm" : "/gemm")).c_str(),
                                   narrow_benchmark, product, small)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
  for (const std::string& v : cqk::attention_names())
    for (int steps : {1, 3}) {
      if (!cqk::builtin_variants.info(v).has_dynamics && steps != 1) continue;
      for (bool bwd : {false, true})
        for (int D : {256, 512})
          for (int T : {128, 256, 512, 1024}) {
            const int B = 4;
            const std::string name = std::string("layer/") + v + "/" + std::to_string(steps) + "/" +
                                     (bwd ? "fwdbwd" : "fwd") + "/B" + std::to_string(B) + "/T" + std::to_string(T) +
                                     "/D" + std::to_string(D);
            benchmark::RegisterBenchmark(name.c_str(), layer_benchmark, v, steps, bwd, B, T, D)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime()
                ->MinTime(0.5);
          }
    }
  // masks: a long sequence under each mask, and half-length sequences padded or packed
  for (const std::string variant :
       {cqk::builtin_variants.first_without_dynamics(), cqk::builtin_variants.first_with_dynamics()})
    for (bool bwd : {false, true}) {
      auto add = [&](const std::string& kind, int B, int T) {
        const std::string name = "mask/" + kind + "/" + variant + "/" + (bwd ? "fwdbwd" : "fwd") + "/B" +
                                 std::to_string(B) + "/T" + std::to_string(T) + "/D512";
        benchmark::RegisterBenchmark(name.c_str(), mask_benchmark, kind, variant, bwd, B, T, 512)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(0.5);
      };
      for (const char* kind : {"causal", "bidir", "causal-w128", "bidir-w128"}) add(kind, 1, 4096);
      for (const char* kind : {"causal", "padded-half", "packed-half"}) add(kind, 8, 1024);
    }
  coupledqk_bench::register_gpt_benchmarks();  // bench_gpt.cpp
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
