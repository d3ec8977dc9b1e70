// The sizes and initial scales of one layer's dynamics, shared by the dynamics' building blocks
// (dynamics/*.hpp) and the integrator policies (integrators/*.hpp), which include this, never the
// other way round.
#pragma once

#include "../core/types.hpp"

namespace coupledqk {

/// Sizes and initial scales for the dynamics of one layer.
struct DynamicsShape {
  Index head_dim = 0;       ///< d
  Index hidden = 0;         ///< m
  double init_scale = 0.0;  ///< std of the parts that are zero at init (a, c; P*2); 0 = standard attention
};

}  // namespace coupledqk
