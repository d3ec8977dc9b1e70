// Leapfrog (Stormer-Verlet, kick-drift-kick): symplectic, time-reversible, second order.
//
//     k <- k - (h/2) grad V(q);   q <- q + h grad T(k);   k <- k - (h/2) grad V(q)
#pragma once

#include "splitting.hpp"

namespace coupledqk {

struct LeapfrogScheme {
  static constexpr std::array<Stage, 3> stages{
      {{StageKind::kick, 0.5}, {StageKind::drift, 1.0}, {StageKind::kick, 0.5}}};
  static constexpr int order = 2;
  static constexpr const char* name = "leapfrog";
};

template <int Steps>
struct Leapfrog : SymplecticSplitting<LeapfrogScheme, Steps> {};

}  // namespace coupledqk
