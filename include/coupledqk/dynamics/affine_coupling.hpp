// Invertible affine coupling (method spec section 3b; docs/method.md "Affine coupling"): the
// pieces the Affine<N> policy (integrators/affine.hpp) is built from, batched over rows.
//
// One conditioner reads a state c [P, d] and gives a log-scale s and a shift t, both [P, d]:
//
//     u = tanh(c A^T + a)              A: [m, d], a: [m]          u: [P, m]
//     s = 2 tanh((u S^T + s0) / 2)     S: [d, m], s0 ("s"): [d]   soft-clamped to (-2, 2)
//     t = u T^T + t0                   T: [d, m], t0 ("t"): [d]
//
// and moves the other state x [P, d], row r with its own sub-step h_r:
//
//     x' = x * exp(h s) + h t          (update)       x = (x' - h t) * exp(-h s)   (undo)
//
// Because s and t depend only on c, which the update leaves alone, the undo is exact in closed
// form and the update's Jacobian in x is diagonal: log |det dx'/dx| = h * sum(s).
//
// S and T are applied as one product with the stacked weight W = [S^T T^T] ([m, 2d]), so the
// conditioner costs two GEMMs: [P, d] x [d, m] and [P, m] x [m, 2d]; its vjp four.
#pragma once

#include <cmath>

#include "../core/error.hpp"
#include "../core/small_gemm.hpp"
#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "hamiltonian.hpp"  // DynamicsShape

namespace coupledqk {

/// The parameters of one conditioner (one of s_k, t_k or s_q, t_q). Names as in the spec.
template <class Scalar>
struct AffineConditioner {
  Matrix<Scalar> A;     // [m, d]
  Vector<Scalar> a;     // [m]
  Matrix<Scalar> S, T;  // [d, m]
  Vector<Scalar> s, t;  // [d]  (the spec's s0, t0)

  AffineConditioner() = default;

  /// A ~ N(0, 1/d); a = 0; S, s0, T, t0 ~ N(0, init_scale^2) (0 by default: the identity map).
  AffineConditioner(Index d, Index m, double init_scale, Rng& rng)
      : A(m, d), a(Vector<Scalar>::Zero(m)), S(d, m), T(d, m), s(d), t(d) {
    rng.fill_normal(A, 1.0 / std::sqrt(static_cast<double>(d)));
    rng.fill_normal(S, init_scale);
    rng.fill_normal(s, init_scale);
    rng.fill_normal(T, init_scale);
    rng.fill_normal(t, init_scale);
  }

  Index dim() const { return A.cols(); }
  Index hidden() const { return A.rows(); }
};

/// Both conditioners of a layer: `k` moves the key (reading q), `q` moves the query (reading the
/// updated k). File names: k.A k.a k.S k.s k.T k.t q.A ... (the layer prefixes "dyn.").
/// Parameters per layer: 2 (3 m d + m + 2 d), plus H for dyn.rho (in the layer).
template <class Scalar>
struct AffineParameters : NamedTensors<AffineParameters<Scalar>> {
  AffineConditioner<Scalar> k, q;

  AffineParameters() = default;
  AffineParameters(const DynamicsShape& shape, Rng& rng) {
    require(shape.head_dim >= 1, "Affine: the head width d must be at least 1; got d = ", shape.head_dim);
    require(shape.hidden >= 1, "Affine: the conditioner hidden width m must be at least 1; got m = ",
            shape.hidden);
    require(std::isfinite(shape.init_scale) && shape.init_scale >= 0,
            "Affine: the initial scale of S, s0, T, t0 must be finite and >= 0; got ", shape.init_scale);
    k = AffineConditioner<Scalar>(shape.head_dim, shape.hidden, shape.init_scale, rng);
    q = AffineConditioner<Scalar>(shape.head_dim, shape.hidden, shape.init_scale, rng);
  }

  template <class Self, class F>
  static void fields(Self& p, F& f) {
    f("k.A", p.k.A);
    f("k.a", p.k.a);
    f("k.S", p.k.S);
    f("k.s", p.k.s);
    f("k.T", p.k.T);
    f("k.t", p.k.t);
    f("q.A", p.q.A);
    f("q.a", p.q.a);
    f("q.S", p.q.S);
    f("q.s", p.q.s);
    f("q.T", p.q.T);
    f("q.t", p.q.t);
  }
};

/// Batched conditioner and coupling update, their inverse and their vector-Jacobian product.
/// Every output buffer is resized only when its shape changes: called with the same buffers
/// call after call, nothing is allocated.
template <class Scalar>
struct AffineCoupling {
  using Cond = AffineConditioner<Scalar>;
  using Mat = Matrix<Scalar>;
  using Vec = Vector<Scalar>;

  /// w = [S^T T^T]: [m, 2d], the stacked weight of the two output heads.
  static void stack(const Cond& p, Mat& w) {
    const Index d = p.dim(), m = p.hidden();
    w.resize(m, 2 * d);
    w.leftCols(d) = p.S.transpose();
    w.rightCols(d) = p.T.transpose();
  }

  /// u = tanh(c A^T + a) [P, m]; st = [s | t] [P, 2d] (s already soft-clamped). w: stack(p).
  static void condition(const Cond& p, const Mat& w, const ConstMatrixRef<Scalar>& c, Mat& u, Mat& st) {
    const Index P = c.rows(), d = p.dim(), m = p.hidden();
    u.resize(P, m);
    small_gemm<Scalar>(c, false, p.A, true, u);
    u.rowwise() += p.a.transpose();
    u.array() = u.array().tanh();
    st.resize(P, 2 * d);
    small_gemm<Scalar>(u, false, w, false, st);
    st.leftCols(d).rowwise() += p.s.transpose();
    st.rightCols(d).rowwise() += p.t.transpose();
    st.leftCols(d).array() = Scalar(2) * (Scalar(0.5) * st.leftCols(d).array()).tanh();
  }

  /// x <- x * exp(h s) + h t, row r with h[r].
  static void update(const Mat& st, const Vec& h, MatrixRef<Scalar> x) {
    const Index d = x.cols();
    x.array() = x.array() * (st.leftCols(d).array().colwise() * h.array()).exp() +
                st.rightCols(d).array().colwise() * h.array();
  }

  /// The exact inverse of update: x <- (x - h t) * exp(-h s).
  static void undo(const Mat& st, const Vec& h, MatrixRef<Scalar> x) {
    const Index d = x.cols();
    x.array() = (x.array() - st.rightCols(d).array().colwise() * h.array()) *
                (-(st.leftCols(d).array().colwise() * h.array())).exp();
  }

  /// h * sum(s) per row: log |det| of one update's Jacobian. Accumulates into out [P].
  static void add_log_det(const Mat& st, const Vec& h, Index d, Vec& out) {
    out.array() += h.array() * st.leftCols(d).array().rowwise().sum();
  }

  /// Backward of one update x_out = x * exp(h s(c)) + h t(c), h = tau / N.
  ///   x:    [P, d] the moved state before the update
  ///   c:    [P, d] the state the conditioner read; u, st: condition(p, w, c)
  ///   dx:   [P, d] cotangent of x_out on entry, of x on exit (=)
  ///   dc:   [P, d] cotangent of c (+=)
  ///   grad: A, a, s, t (+=); dw [m, 2d] (+=): the gradient of w, i.e. of [S^T T^T]
  ///   dtau: [P] (+=); E, G, ubar: scratch ([P, d], [P, 2d], [P, m])
  static void vjp(const Cond& p, const Mat& w, const ConstMatrixRef<Scalar>& c, const Mat& u, const Mat& st,
                  const Vec& h, Scalar inv_steps, const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> dx,
                  MatrixRef<Scalar> dc, Cond& grad, Mat& dw, Vec& dtau, Mat& E, Mat& G, Mat& ubar) {
    const Index P = x.rows(), d = p.dim(), m = p.hidden();
    const auto s = st.leftCols(d).array();
    const auto t = st.rightCols(d).array();
    E.resize(P, d);
    E.array() = (s.colwise() * h.array()).exp();
    // d x_out / d h = x E s + t;  d h / d tau = 1 / N
    dtau.array() += inv_steps * (dx.array() * (x.array() * E.array() * s + t)).rowwise().sum();
    G.resize(P, 2 * d);
    // d/d(pre-clamp s): dx * x E h * (1 - (s/2)^2);   d/dt: dx h
    G.leftCols(d).array() = (dx.array() * x.array() * E.array()).colwise() * h.array() *
                            (Scalar(1) - Scalar(0.25) * s.square());
    G.rightCols(d).array() = dx.array().colwise() * h.array();
    dx.array() *= E.array();
    small_gemm<Scalar>(u, true, G, false, dw, Scalar(1), true);  // dw += u^T G
    grad.s.noalias() += G.leftCols(d).colwise().sum().transpose();
    grad.t.noalias() += G.rightCols(d).colwise().sum().transpose();
    ubar.resize(P, m);
    small_gemm<Scalar>(G, false, w, true, ubar);  // ubar = G w^T
    ubar.array() *= Scalar(1) - u.array().square();
    grad.a.noalias() += ubar.colwise().sum().transpose();
    small_gemm<Scalar>(ubar, true, c, false, grad.A, Scalar(1), true);  // dA += ubar^T c
    small_gemm<Scalar>(ubar, false, p.A, false, dc, Scalar(1), true);   // dc += ubar A
  }

  /// Folds a stacked weight gradient dw [m, 2d] into grad.S, grad.T (+=).
  static void unstack_add(const Mat& dw, Cond& grad) {
    const Index d = grad.S.rows();
    grad.S.noalias() += dw.leftCols(d).transpose();
    grad.T.noalias() += dw.rightCols(d).transpose();
  }
};

}  // namespace coupledqk
