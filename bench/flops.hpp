// Useful floating-point work of the attention layer, shared by the CPU and the GPU benchmarks.
//
// One layer forward (multiply-adds count 2):
//   projections  Q, K, V, O:                     4 * 2 B T D^2
//   causal scores and weighted values (Softmax):  2 B T^2 D        (only the unmasked half of
//                                                                   Q K^T and P V: 2 * 2 B T^2 D / 2)
//   Differential: per differential head two score matrices of width d and values of width 2d:
//                                                 3 B T^2 D
//   dynamics, per (token, head) pair, one evaluation of grad V or grad T = two [d x m] products:
//     4 d m flops; leapfrog 2N+1 evaluations, euler 2N, uncoupled 2N of half width (2 d m each).
//   affine: per step two conditioners, each [d x m] then [m x 2d] (S and T): 6 d m flops each,
//     12 d m N per pair.
// Forward + backward counts 3x the forward (the backward does two products per forward product);
// work a backward repeats (recomputed scores, the recomputed dynamics trajectory) is not counted.
#pragma once

#include <string>

namespace coupledqk::bench {

inline double layer_forward_flops(const std::string& variant, int steps, double B, double T, double D, double H,
                                  double m) {
  const bool diff = variant.rfind("diff", 0) == 0;
  const double d = D / H, pairs = B * T * H;
  double f = 8 * B * T * D * D + (diff ? 3 : 2) * B * T * T * D;
  const std::string integ = diff ? (variant == "diff" ? "standard" : variant.substr(5)) : variant;
  if (integ == "leapfrog") f += (2 * steps + 1) * 4 * d * m * pairs;
  if (integ == "euler") f += 2 * steps * 4 * d * m * pairs;
  if (integ == "uncoupled") f += 2 * steps * 2 * d * m * pairs;
  if (integ == "affine") f += steps * 12 * d * m * pairs;
  return f;
}

/// Useful work of one GPT training step (forward + backward; a matrix product counts 3x its
/// forward). Element-wise work (LayerNorm, GELU, softmax + cross-entropy, embeddings, AdamW) is not
/// counted. Per block: the attention layer above, MLP fc [D, 4D] and proj [4D, D] = 16 B T D^2;
/// once: the tied logits 2 B T D V.
///     step = 3 [ L (attention + 16 B T D^2) + 2 B T D V ]
inline double gpt_step_flops(const std::string& variant, int steps, double V, double D, double L, double H, double T,
                             double B) {
  const double attention = layer_forward_flops(variant, steps, B, T, D, H, D / H);
  return 3 * (L * (attention + 16 * B * T * D * D) + 2 * B * T * D * V);
}

}  // namespace coupledqk::bench
