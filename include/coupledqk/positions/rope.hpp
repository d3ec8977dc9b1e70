// Rotary position embeddings (RoPE, Su et al. 2021) in the rotate-half convention of GPT-NeoX,
// LLaMA and most PyTorch models since: within each head of even width d, the coordinates i and
// i + d/2 (i = 0..d/2-1) of a token at position p are rotated by the angle p * base^(-2i/d):
//
//     y_i       = x_i cos(p w_i) - x_{i+d/2} sin(p w_i)        w_i = base^(-2i/d), base = 10000 by default
//     y_{i+d/2} = x_{i+d/2} cos(p w_i) + x_i sin(p w_i)
//
// (PyTorch: y = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[d/2:], x[:d/2]).) Each
// head's map is a rotation: norms are kept, position 0 is the identity, <R_m q, R_n k> depends on
// m - n only, and the backward of y = R_p x is dx = R_p^T dy = R_{-p} dy (rotate(..., inverse)).
// The angles are computed in double and rounded once to S, so float and double rotate by the same
// angles to their precision.
//
//     coupledqk::Rope<float> rope(head_dim, context);       // tables for positions 0..context-1
//     rope.rotate(q, seq);                                   // q [B*T, H*d], rows (b, t): p = t
//     rope.rotate(dq, seq, /*inverse=*/true);                // its backward
//     coupledqk::Rope<float> at_t(head_dim, 1, base, t);     // decoding: the table of position t alone
//     at_t.rotate_at(q_row, {t});
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/types.hpp"

namespace coupledqk {

/// The default base of the rotation frequencies (RoFormer, GPT-NeoX, LLaMA 1 and 2).
inline constexpr double default_rope_base = 10000.0;

/// Throws a descriptive coupledqk::invalid_argument unless a rotation of heads `head_dim` wide with
/// frequencies base^(-2i/d) over `positions` positions from `first` on is defined.
inline void validate_rope(Index head_dim, double base, Index positions, Index first = 0) {
  require(head_dim > 0 && head_dim % 2 == 0,
          "rope: the head width d must be even and positive (coordinates i and i + d/2 rotate together); got d = ",
          head_dim);
  require(std::isfinite(base) && base > 1, "rope: base must be finite and > 1 (frequencies base^(-2i/d)); got ",
          base);
  require(positions > 0, "rope: the number of positions (the context) must be positive; got ", positions);
  require(first >= 0, "rope: the first position must be >= 0; got ", first);
}

template <class S>
class Rope {
 public:
  /// Rotations of heads `head_dim` wide for positions first..first+positions-1 (the model's
  /// context from 0; a decoder's newest token alone).
  Rope(Index head_dim, Index positions, double base = default_rope_base, Index first = 0)
      : d_(head_dim), positions_(positions), first_(first), base_(base) {
    validate_rope(head_dim, base, positions, first);
    const Index half = d_ / 2;
    cos_.resize(positions_, half);
    sin_.resize(positions_, half);
    for (Index i = 0; i < half; ++i) {
      const double w = std::pow(base_, -2.0 * static_cast<double>(i) / static_cast<double>(d_));
      for (Index p = 0; p < positions_; ++p) {
        const double a = static_cast<double>(first_ + p) * w;
        cos_(p, i) = static_cast<S>(std::cos(a));
        sin_(p, i) = static_cast<S>(std::sin(a));
      }
    }
  }

  Index head_dim() const { return d_; }
  Index positions() const { return positions_; }
  Index first() const { return first_; }
  double base() const { return base_; }

  /// Rotates every head of x [rows, H*d] in place, row r at position first + r % seq (rows ordered
  /// (b, t) of sequences of length seq); inverse: by the opposite angles (the backward of the rotation).
  void rotate(MatrixRef<S> x, Index seq, bool inverse = false) const {
    require(seq > 0 && seq <= positions_, "rope: sequence length ", seq, " is outside 1..", positions_,
            " (the positions the rotation was built for)");
    require(x.rows() % seq == 0, "rope: ", x.rows(), " rows are not a whole number of sequences of length ", seq);
    check_width(x.cols());
    for (Index r = 0; r < x.rows(); ++r) rotate_row(x, r, r % seq, inverse);
  }

  /// Rotates row r of x [rows, H*d] at positions[r] (packed sequences, decoding at absolute positions).
  void rotate_at(MatrixRef<S> x, const std::vector<Index>& positions, bool inverse = false) const {
    require(static_cast<Index>(positions.size()) == x.rows(), "rope: ", positions.size(), " positions for ",
            x.rows(), " rows; one per row is needed");
    check_width(x.cols());
    for (Index r = 0; r < x.rows(); ++r) {
      const Index p = positions[static_cast<std::size_t>(r)];
      require(p >= first_ && p - first_ < positions_, "rope: position ", p, " of row ", r, " is outside ", first_,
              "..", first_ + positions_ - 1, " (the positions the rotation was built for)");
      rotate_row(x, r, p - first_, inverse);
    }
  }

 private:
  void check_width(Index cols) const {
    require(cols > 0 && cols % d_ == 0, "rope: rows of width ", cols, " are not whole heads of width d = ", d_);
  }

  /// Row r of x by the table's row j (position first + j).
  void rotate_row(MatrixRef<S>& x, Index r, Index j, bool inverse) const {
    const Index half = d_ / 2;
    S* row = x.row(r).data();
    const S* c = cos_.row(j).data();
    const S* s = sin_.row(j).data();
    const S sign = inverse ? S(-1) : S(1);
    for (Index h = 0; h < x.cols(); h += d_) {
      S* a = row + h;
      S* b = a + half;
      for (Index i = 0; i < half; ++i) {
        const S xa = a[i], xb = b[i], si = sign * s[i];
        a[i] = xa * c[i] - xb * si;
        b[i] = xb * c[i] + xa * si;
      }
    }
  }

  Index d_, positions_, first_;
  double base_;
  Matrix<S> cos_, sin_;  // [positions, d/2]: row j is position first + j
};

}  // namespace coupledqk
