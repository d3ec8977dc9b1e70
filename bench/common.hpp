// What the two files of coupledqk-bench share: the measured SGEMM peak and the FLOP count of an
// attention layer (bench/flops.hpp).
#pragma once

#include <string>

#include <coupledqk/variants.hpp>  // layers and models by name: the compiled table

#include "flops.hpp"

namespace coupledqk_bench {

/// The SGEMM peak in GFLOP/s that peak_frac divides by: the library's own 2048 x 2048 SGEMM on the
/// benchmark's threads, measured once in main(), or the machine's given by --peak-gflops.
inline double g_peak_gflops = 0;

/// Useful floating-point work of one attention layer forward: bench/flops.hpp (shared with the
/// GPU benchmark), where the formula is written out.
inline double forward_flops(const std::string& variant, int steps, double B, double T, double D, double H,
                            double m) {
  return coupledqk::bench::layer_forward_flops(variant, steps, B, T, D, H, m);
}

/// Registers the GPT training-step cases (bench_gpt.cpp).
void register_gpt_benchmarks();

}  // namespace coupledqk_bench
