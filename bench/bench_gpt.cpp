// Benchmarks of one GPT training step on the CPU (Google Benchmark), part of coupledqk-bench.
//
//     coupledqk-bench --threads 2 --benchmark_filter=^gpt/
//
// Names: gpt/<variant>/<steps>/step/V<V>/D<D>/L<L>/H<H>/T<T>/B<B>. One iteration is one training
// step exactly as the trainer's CPU backend (examples/train/trainer/backend.cpp) takes it: model.zero_grad(), model.loss() (forward and
// backward on a tape reused from step to step) and one AdamW update (clipping, decay, schedule).
// One step runs before timing (it sizes every buffer). Shapes:
//   - the main job's (coupledqk-compare; examples/train/trainer.hpp Defaults, vocabulary 4096):
//     V=4096, D=128, L=2, H=4, T=128, B=16;
//   - the paper's model shape, D=512, L=8, H=8, T=512 with V=8192 and B=4 (2048 tokens, as the main
//     job's step; about 3 s per step on 2 cores).
// Counters: tokens_per_s, GFLOPS (useful work, formula below, over wall time), peak_frac (GFLOPS
// over the SGEMM peak: the library's SGEMM measured by this binary, or --peak-gflops),
// allocs_per_step (heap allocations inside the timed steps: this executable counts every malloc,
// see tests/support/malloc_counter.hpp; 0 expected).
#define COUPLEDQK_DEFINE_MALLOC_COUNTER
#include "malloc_counter.hpp"

#include <benchmark/benchmark.h>

#include <coupledqk/core/parallel.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "common.hpp"

namespace cqk = coupledqk;

namespace coupledqk_bench {

namespace {

struct GptShape {
  int V, D, L, H, T, B;
};

// Useful floating-point work of one training step (a multiply-add counts 2; every matrix product
// counts 3x its forward for forward + backward, as in the "6 N" rule: the backward forms two
// products per forward product). Element-wise work (LayerNorm, GELU, softmax + cross-entropy, the
// embedding lookups, AdamW) is not counted.
//   per block, forward, over the B T tokens (bench/flops.hpp, through forward_flops in common.hpp):
//     attention projections Q, K, V, O        8 B T D^2
//     causal scores and P V (unmasked half)   2 B T^2 D
//     dynamics (leapfrog N steps: 2N+1 evaluations of grad V or grad T per (token, head) pair, two
//     [d x m] products each)                   (2N+1) 4 d m B T H
//   MLP, per block: fc [D, 4D] and proj [4D, D]  2 * 2 B T D 4D = 16 B T D^2
//   logits (tied output embedding)            2 B T D V
//   step = 3 [ L (8 B T D^2 + 2 B T^2 D + dynamics + 16 B T D^2) + 2 B T D V ]
// With 12 L D^2 non-embedding matrix parameters this is 6 N_params B T + 6 L B T^2 D + 3 x dynamics +
// 6 B T D V (the logits, 2 B T D V x 3).
double step_flops(const std::string& variant, int steps, const GptShape& s) {
  const double B = s.B, T = s.T, D = s.D, V = s.V, L = s.L, H = s.H;
  const double attention = forward_flops(variant, steps, B, T, D, H, D / H);
  const double mlp = 16 * B * T * D * D;
  const double logits = 2 * B * T * D * V;
  return 3 * (L * (attention + mlp) + logits);
}

std::string shape_name(const GptShape& s) {
  return "V" + std::to_string(s.V) + "/D" + std::to_string(s.D) + "/L" + std::to_string(s.L) + "/H" +
         std::to_string(s.H) + "/T" + std::to_string(s.T) + "/B" + std::to_string(s.B);
}

void gpt_step_benchmark(benchmark::State& state, std::string variant, int steps, GptShape s) {
  cqk::GptConfig c;
  c.vocab = s.V;
  c.dim = s.D;
  c.layers = s.L;
  c.heads = s.H;
  c.context = s.T;
  c.attention = variant;
  c.steps = steps;
  c.dynamics_init_scale = 0.1;  // live dynamics (the work does not depend on the values)
  auto model = cqk::make_gpt<float>(c, 1);
  cqk::AdamWConfig oc;
  oc.lr = 6e-4;
  oc.warmup_steps = 100;
  oc.total_steps = 10000;
  cqk::AdamW<float> opt(model->parameters(), model->gradients(), oc);
  cqk::Tape<float> tape;
  cqk::Rng rng(2);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(s.B) * s.T), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(s.V));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(s.V));
  auto step = [&] {
    model->zero_grad();
    const float loss = model->loss(tape, tokens, targets, s.B);
    opt.step();
    return loss;
  };
  step();  // warm-up: every buffer gets its size
  long long allocs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    malloc_counter::Scope scope;
    benchmark::DoNotOptimize(step());
    allocs += scope.count();
  }
  // Rates from wall time (the work is spread over threads).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double it = static_cast<double>(state.iterations());
  const double gflops = step_flops(variant, steps, s) * it / seconds / 1e9;
  state.counters["tokens_per_s"] = double(s.B) * s.T * it / seconds;
  state.counters["GFLOPS"] = gflops;
  state.counters["peak_frac"] = gflops / g_peak_gflops;
  state.counters["GFLOP_per_step"] = step_flops(variant, steps, s) / 1e9;
  state.counters["allocs_per_step"] = malloc_counter::available() ? static_cast<double>(allocs) / it : -1.0;
  state.SetLabel(std::to_string(cqk::max_threads()) + " threads");
}

}  // namespace

void register_gpt_benchmarks() {
  const GptShape shapes[] = {{4096, 128, 2, 4, 128, 16},   // the main job (coupledqk-compare)
                             {8192, 512, 8, 8, 512, 4}};   // the paper's shape
  for (const GptShape& s : shapes)
    // the table's first entry without dynamics and its first with (standard, leapfrog)
    for (const char* v : {cqk::builtin_variants.first_without_dynamics(), cqk::builtin_variants.first_with_dynamics()}) {
      const std::string name = std::string("gpt/") + v + "/1/step/" + shape_name(s);
      // timed for --benchmark_min_time seconds (at least one step)
      benchmark::RegisterBenchmark(name.c_str(), gpt_step_benchmark, std::string(v), 1, s)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
}

}  // namespace coupledqk_bench
