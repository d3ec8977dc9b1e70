// Eigen aliases used throughout coupledqk.
//
// Every activation is a row-major matrix whose rows are tokens: a batch [B, T, D] is stored as a
// [B*T, D] matrix with row index b*T + t. Because rows are contiguous, the same memory read as a
// [B*T*H, d] matrix holds one (token, head) pair per row -- the layout the integrators work on.
#pragma once

#include <Eigen/Core>
#include <cstdint>

namespace coupledqk {

using Index = Eigen::Index;

template <class S>
using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using MatrixRef = Eigen::Ref<Matrix<S>>;
template <class S>
using ConstMatrixRef = Eigen::Ref<const Matrix<S>>;
template <class S>
using MatrixMap = Eigen::Map<Matrix<S>>;
template <class S>
using ConstMatrixMap = Eigen::Map<const Matrix<S>>;
/// A block of a row-major matrix (e.g. one head's columns of [B*T, D] rows).
template <class S>
using ConstBlockRef = Eigen::Ref<const Matrix<S>, 0, Eigen::OuterStride<>>;
template <class S>
using BlockRef = Eigen::Ref<Matrix<S>, 0, Eigen::OuterStride<>>;

/// What the backward of the dynamics keeps from the forward.
enum class DynamicsMemory {
  store,      ///< keep the state before every sub-step (any integrator); splitting methods also keep
              ///< each stage's field and activations, so their backward evaluates no field again
  recompute,  ///< keep nothing; rebuild the states by running the flow backwards (reversible only)
};

inline const char* to_string(DynamicsMemory m) {
  return m == DynamicsMemory::store ? "store" : "recompute";
}

}  // namespace coupledqk
