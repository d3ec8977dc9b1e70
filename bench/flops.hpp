// Useful floating-point work of the attention layer, shared by the CPU and the GPU benchmarks. The
// variant-specific parts come from the policies, through the variant table (registry.hpp:
// VariantInfo): nothing here knows a variant's name.
//
// One layer forward (multiply-adds count 2):
//   projections  Q, K, V, O:                     4 * 2 B T D^2
//   scoring: the scoring policy's score_flops(B, T, D)
//            (Softmax: the causal half of Q K^T and P V, 2 B T^2 D; Differential: 3 B T^2 D)
//   dynamics: the integrator's flops_per_pair(d, m) per (token, head) pair, B T H pairs
//            (leapfrog N steps: 2N+1 field evaluations of 4 d m; euler 2N; uncoupled 2N of half
//            width; affine 12 d m N)
// Forward + backward counts 3x the forward (the backward does two products per forward product);
// work a backward repeats (recomputed scores, the recomputed dynamics trajectory) is not counted.
// A policy that gives no FLOP formula makes the count "not available" (std::nullopt, printed as
// n/a), never 0: a missing formula must not inflate a fraction of peak.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include <coupledqk/registry.hpp>

namespace coupledqk::bench {

/// One layer forward of the variant `info` with `steps` steps; nullopt when a policy has no formula.
inline std::optional<double> layer_forward_flops(const VariantInfo& info, int steps, double B, double T, double D,
                                                 double H, double m) {
  if (!info.score_flops || !info.dynamics_flops_per_pair) return std::nullopt;
  const double d = D / H, pairs = B * T * H;
  return 8 * B * T * D * D + info.score_flops(B, T, D) + info.dynamics_flops_per_pair(steps, d, m) * pairs;
}

/// The same for a name of the built-in table, as a double: NaN when not available (a benchmark
/// counter then reads "nan", never a made-up rate).
inline double layer_forward_flops(const std::string& variant, int steps, double B, double T, double D, double H,
                                  double m) {
  return layer_forward_flops(builtin_variants.info(variant), steps, B, T, D, H, m)
      .value_or(std::numeric_limits<double>::quiet_NaN());
}

/// Useful work of one GPT training step (forward + backward; a matrix product counts 3x its
/// forward). Element-wise work (LayerNorm, GELU, softmax + cross-entropy, embeddings, AdamW) is not
/// counted. Per block: the attention layer above, MLP fc [D, 4D] and proj [4D, D] = 16 B T D^2;
/// once: the tied logits 2 B T D V.
///     step = 3 [ L (attention + 16 B T D^2) + 2 B T D V ]
/// NaN when the variant's policies give no formula.
inline double gpt_step_flops(const std::string& variant, int steps, double V, double D, double L, double H, double T,
                             double B) {
  const double attention = layer_forward_flops(variant, steps, B, T, D, H, D / H);
  return 3 * (L * (attention + 16 * B * T * D * D) + 2 * B * T * D * V);
}

}  // namespace coupledqk::bench
