// Rotary position embeddings on the device: the rotation of include/coupledqk/positions/rope.hpp
// (rotate-half; the CPU's own cos/sin tables, angles computed in double and rounded once to float,
// uploaded), applied in place to q and k [rows, H*d] of storage T, or, inverse, to their float
// cotangents (the backward of the rotation is the rotation by the opposite angles).
//
//     y_i       = x_i cos(p w_i) - x_{i+d/2} sin(p w_i)        w_i = base^(-2i/d)
//     y_{i+d/2} = x_{i+d/2} cos(p w_i) + x_i sin(p w_i)
//
// Positions count from 0 at each sequence's first token, as on the CPU: row r is at r % T for B
// sequences of T rows (equal or padded; padding rows continue), at r - offsets[b] for packed ones
// (offsets on the device, FlashMask::offsets; a binary search over the B + 1 of them).
#pragma once

#include <string>
#include <vector>

#include <coupledqk/positions/rope.hpp>

#include "flash.cuh"
#include "runtime.cuh"

namespace coupledqk::cuda {

namespace rope_detail {

constexpr int kThreads = 256;

// The position of row r: r % seq, or its offset in its packed sequence.
__device__ __forceinline__ Index position(Index r, Index seq, const Index* offsets, Index batch) {
  if (!offsets) return r % seq;
  Index lo = 0, hi = batch;  // offsets[lo] <= r < offsets[hi]
  while (hi - lo > 1) {
    const Index mid = (lo + hi) / 2;
    if (offsets[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return r - offsets[lo];
}

// One thread per (tensor, row, head, i < d/2) of x0 and x1 [rows, heads * d], in place; sign = -1
// turns by the opposite angles. cos_t, sin_t: [positions, d/2].
template <class E>
__global__ void __launch_bounds__(kThreads)
    rotate_kernel(E* __restrict__ x0, E* __restrict__ x1, Index rows, Index heads, int d,
                  const float* __restrict__ cos_t, const float* __restrict__ sin_t, float sign, Index seq,
                  const Index* __restrict__ offsets, Index batch) {
  const int half = d / 2;
  const Index per_tensor = rows * heads * half, n = 2 * per_tensor;
  for (Index w = Index(blockIdx.x) * kThreads + threadIdx.x; w < n; w += Index(gridDim.x) * kThreads) {
    E* const x = w < per_tensor ? x0 : x1;
    const Index u = w < per_tensor ? w : w - per_tensor;
    const int i = static_cast<int>(u % half);
    const Index rh = u / half, r = rh / heads, h = rh % heads;
    const Index p = position(r, seq, offsets, batch);
    const float c = cos_t[p * half + i], si = sign * sin_t[p * half + i];
    E* const a = x + r * heads * d + h * d;
    const float xa = to_float(a[i]), xb = to_float(a[i + half]);
    a[i] = from_float<E>(xa * c - xb * si);
    a[i + half] = from_float<E>(xb * c + xa * si);
  }
}

}  // namespace rope_detail

/// The rotation of heads head_dim wide for positions 0..positions-1 with a base, on the device:
/// the CPU Rope<float>'s tables, built and uploaded by prepare() only when one of the three
/// changes. Not thread-safe; one per layer context.
class DeviceRope {
 public:
  /// Throws coupledqk::invalid_argument as coupledqk::Rope does (odd width, base <= 1, ...).
  void prepare(Index head_dim, Index positions, double base, cudaStream_t stream) {
    if (head_dim == d_ && positions == positions_ && base == base_) return;
    // The CPU rotation's own tables, read through its public rotate(): a head of ones in its first
    // half and zeros in its second turns at position p into (cos p w_i, sin p w_i), exactly
    // (1 c - 0 s = c, 0 c + 1 s = s), so the device uses the same rounded values without a second
    // copy of the formula.
    const Rope<float> rope(head_dim, positions, base);
    const Index half = head_dim / 2;
    Matrix<float> unit(positions, head_dim);
    unit.leftCols(half).setOnes();
    unit.rightCols(half).setZero();
    rope.rotate(unit, positions);
    host_cos_.resize(static_cast<std::size_t>(positions * half));
    host_sin_.resize(static_cast<std::size_t>(positions * half));
    for (Index p = 0; p < positions; ++p)
      for (Index i = 0; i < half; ++i) {
        host_cos_[static_cast<std::size_t>(p * half + i)] = unit(p, i);
        host_sin_[static_cast<std::size_t>(p * half + i)] = unit(p, half + i);
      }
    cos_.reserve(host_cos_.size());
    sin_.reserve(host_sin_.size());
    // from pageable memory: returns once the host copy is staged (stream-ordered after earlier readers)
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(cos_.data(), host_cos_.data(), sizeof(float) * host_cos_.size(),
                                         cudaMemcpyHostToDevice, stream));
    COUPLEDQK_CUDA_CHECK(cudaMemcpyAsync(sin_.data(), host_sin_.data(), sizeof(float) * host_sin_.size(),
                                         cudaMemcpyHostToDevice, stream));
    d_ = head_dim;
    positions_ = positions;
    base_ = base;
  }

  /// Rotates x0 and x1 [rows, heads * d] (storage or float cotangents) in place, every row at its
  /// position in its sequence: B sequences of `seq` rows, or packed by `mask.offsets` (batch + 1
  /// of them); inverse: the backward. Asynchronous on `stream`.
  template <class E>
  void rotate(E* x0, E* x1, Index rows, Index heads, Index batch, Index seq, const FlashMask& mask, bool inverse,
              cudaStream_t stream) const {
    if (d_ == 0)
      throw ::coupledqk::invalid_argument("coupledqk::cuda::DeviceRope::rotate: no tables; call prepare() first");
    if (seq > positions_)
      throw ::coupledqk::invalid_argument("coupledqk::cuda::DeviceRope::rotate: sequences of up to " +
                                          std::to_string(seq) + " positions; the tables hold " +
                                          std::to_string(positions_));
    if (rows <= 0 || heads <= 0) return;
    const Index n = 2 * rows * heads * (d_ / 2);
    launch(rope_detail::rotate_kernel<E>, grid_for(n, rope_detail::kThreads), rope_detail::kThreads, 0, stream, x0,
           x1, rows, heads, static_cast<int>(d_), cos_.data(), sin_.data(), inverse ? -1.0f : 1.0f, seq, mask.offsets,
           batch);
  }

 private:
  Index d_ = 0, positions_ = 0;
  double base_ = 0;
  std::vector<float> host_cos_, host_sin_;
  DeviceBuffer<float> cos_, sin_;  // [positions, d/2]
};

}  // namespace coupledqk::cuda
