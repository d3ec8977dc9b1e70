// Identity: standard attention, q' = q and k' = k. No parameters, no integration time.
#pragma once

#include "policy.hpp"

namespace coupledqk {

struct Identity {
  static constexpr int steps = 1;
  static constexpr int order = 0;
  static constexpr bool is_symplectic = true;  // the identity map preserves Omega exactly
  static constexpr bool is_coupled = false;
  static constexpr bool is_reversible = true;
  static constexpr bool has_dynamics = false;
  static constexpr const char* name = "identity";

  /// No dynamics: no work.
  static constexpr double flops_per_pair(double, double) { return 0; }

  template <class S>
  using parameters = EmptyParameters<S>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape&, Rng&) {
    return {};
  }
  template <class S>
  static void forward(const parameters<S>&, const Vector<S>&, MatrixRef<S>, MatrixRef<S>,
                      StateTrace<S>*, DynamicsMemory) {}
  template <class S>
  static void backward(const parameters<S>&, const Vector<S>&, const StateTrace<S>&,
                       const ConstMatrixRef<S>&, const ConstMatrixRef<S>&, MatrixRef<S>,
                       MatrixRef<S>, parameters<S>&, Vector<S>&, DynamicsMemory) {}
};

}  // namespace coupledqk
