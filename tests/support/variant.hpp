// One layer or model configuration under test, by type: the integrator and scoring policies and
// the dynamics' memory mode. The typed lists of tests/policies.hpp, the double models of
// tests/autodiff/test_gpt.cpp and the CPU models of tests/cuda/cpu_models.hpp all use this one.
#pragma once

#include <coupledqk/core/types.hpp>

namespace cqk_test {

template <class I, class Sc, coupledqk::DynamicsMemory M = coupledqk::DynamicsMemory::store>
struct Variant {
  using integrator = I;
  using scoring = Sc;
  static constexpr coupledqk::DynamicsMemory memory = M;
};

}  // namespace cqk_test
