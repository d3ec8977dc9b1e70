// The CPU models the GPT's CUDA tests compare against (test_cuda_gpt.cu), compiled once in
// cpu_models.cpp for the three builds of that test (nvcc, the emulator's `emulated` and
// `exact_bf16` flavours): each build used to instantiate the same float and double Gpt<S, I, Sc>
// of every variant below once more (issue 26: the project's build time, docs/design.md). The tests
// hold them as AnyGpt<S>, which is all they use; the maths is the one header's either way.
#pragma once

#include <cstdint>
#include <memory>

#include <coupledqk/model/gpt.hpp>

#include "../support/variant.hpp"

namespace coupledqk::cuda::testing {

using ::cqk_test::Variant;  // tests/support/variant.hpp

// The variants whose device model test_cuda_gpt.cu checks against the CPU, each at float and double.
#define COUPLEDQK_GPT_VARIANTS                                                                               \
  ::cqk_test::Variant<Identity, Softmax>, ::cqk_test::Variant<Leapfrog<1>, Softmax>, \
      ::cqk_test::Variant<Leapfrog<3>, Softmax>, ::cqk_test::Variant<Euler<1>, Softmax>, \
      ::cqk_test::Variant<Uncoupled<1>, Softmax>,                                           \
      ::cqk_test::Variant<Identity, Differential>,                                          \
      ::cqk_test::Variant<Leapfrog<1>, Differential>,                                       \
      ::cqk_test::Variant<Affine<2>, Differential>,                                         \
      ::cqk_test::Variant<NewtonLeapfrog<1>, Softmax>,                                      \
      ::cqk_test::Variant<Drift<1>, Differential>
// ... and the ones it builds besides (the device trainer's case: a registry model by type).
#define COUPLEDQK_CPU_MODEL_EXTRA_VARIANTS ::cqk_test::Variant<Leapfrog<2>, Differential>

/// A new Gpt<S, I, Sc>(config, seed). Defined in cpu_models.cpp for S = float and double and every
/// variant of the two lists above; any other is a link error naming it.
template <class S, class I, class Sc>
std::unique_ptr<::coupledqk::AnyGpt<S>> cpu_model(const ::coupledqk::GptConfig& config, std::uint64_t seed);

}  // namespace coupledqk::cuda::testing
