// The library's own physics checks for integrator policies (method spec section 5), usable on any
// policy -- including one a user writes (see examples/forest_ruth.hpp).
//
// All work on a single (q, k) pair: q, k are [1, d] rows and tau the integration time.
#pragma once

#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "../dynamics/hamiltonian.hpp"
#include "../integrators/policy.hpp"

namespace coupledqk::testing {

/// (q', k') of one pair after Integrator's flow over time tau.
template <class I, class S>
void flow(const typename I::template parameters<S>& p, S tau, Matrix<S>& q, Matrix<S>& k) {
  Vector<S> t = Vector<S>::Constant(q.rows(), tau);
  I::template forward<S>(p, t, q, k, nullptr, DynamicsMemory::store);
}

/// The Jacobian J = d(q', k') / d(q, k) of one pair, [2d, 2d], built row by row from the policy's
/// own backward (so it is exact to round-off, and also exercises the backward).
template <class I, class S>
Matrix<S> jacobian(const typename I::template parameters<S>& p, const Matrix<S>& q0,
                   const Matrix<S>& k0, S tau, DynamicsMemory memory = DynamicsMemory::store) {
  const Index d = q0.cols();
  Matrix<S> q = q0, k = k0;
  Vector<S> t = Vector<S>::Constant(1, tau);
  trace_of<I, S> keep;
  I::template forward<S>(p, t, q, k, &keep, memory);
  Matrix<S> J(2 * d, 2 * d);
  for (Index i = 0; i < 2 * d; ++i) {
    Matrix<S> dq = Matrix<S>::Zero(1, d), dk = Matrix<S>::Zero(1, d);
    (i < d ? dq(0, i) : dk(0, i - d)) = S(1);
    auto grad = zeros_like(p);
    Vector<S> dtau = Vector<S>::Zero(1);
    I::template backward<S>(p, t, keep, q, k, dq, dk, grad, dtau, memory);
    J.block(i, 0, 1, d) = dq;
    J.block(i, d, 1, d) = dk;
  }
  return J;
}

/// Omega = [[0, I], [-I, 0]] in R^{2d x 2d}.
template <class S>
Matrix<S> omega(Index d) {
  Matrix<S> W = Matrix<S>::Zero(2 * d, 2 * d);
  W.block(0, d, d, d).setIdentity();
  W.block(d, 0, d, d) = -Matrix<S>::Identity(d, d);
  return W;
}

/// ||J^T Omega J - Omega||_F: zero (to round-off) exactly when the flow map is symplectic.
template <class I, class S>
S symplecticity_defect(const typename I::template parameters<S>& p, const Matrix<S>& q,
                       const Matrix<S>& k, S tau) {
  const Matrix<S> J = jacobian<I, S>(p, q, k, tau);
  const Matrix<S> W = omega<S>(q.cols());
  return (J.transpose() * W * J - W).norm();
}

/// Largest entry of the off-diagonal blocks dq'/dk and dk'/dq: zero when q and k are uncoupled.
template <class I, class S>
S coupling_strength(const typename I::template parameters<S>& p, const Matrix<S>& q,
                    const Matrix<S>& k, S tau) {
  const Matrix<S> J = jacobian<I, S>(p, q, k, tau);
  const Index d = q.cols();
  return std::max(J.block(0, d, d, d).cwiseAbs().maxCoeff(), J.block(d, 0, d, d).cwiseAbs().maxCoeff());
}

namespace detail {
template <class I, class S, class = void>
struct has_inverse : std::false_type {};
template <class I, class S>
struct has_inverse<I, S, std::void_t<decltype(I::template inverse<S>(
                             std::declval<const typename I::template parameters<S>&>(), std::declval<const Vector<S>&>(),
                             std::declval<MatrixRef<S>>(), std::declval<MatrixRef<S>>()))>> : std::true_type {};
}  // namespace detail

/// Runs the flow over tau, then undoes it from the result; returns the max distance to the start.
/// A policy with a closed-form `inverse(p, tau, q, k)` (Affine) is undone by it; any other by its
/// own flow over -tau, which is round-off for a time-reversible (symmetric) method.
template <class I, class S>
S reversibility_error(const typename I::template parameters<S>& p, const Matrix<S>& q0,
                      const Matrix<S>& k0, S tau) {
  Matrix<S> q = q0, k = k0;
  flow<I, S>(p, tau, q, k);
  if constexpr (detail::has_inverse<I, S>::value)
    I::template inverse<S>(p, Vector<S>::Constant(q.rows(), tau), q, k);
  else
    flow<I, S>(p, -tau, q, k);
  return std::max((q - q0).cwiseAbs().maxCoeff(), (k - k0).cwiseAbs().maxCoeff());
}

/// Energy drift over a fixed total time: the flow is applied `repeats` times with time
/// total_time / repeats each (sub-step h = total_time / (repeats * I::steps)); returns the largest
/// |H(q_n, k_n) - H(q_0, k_0)| seen along the way. Needs a Hamiltonian policy (I::hamiltonian).
template <class I, class S>
S energy_drift(const typename I::template parameters<S>& p, const Matrix<S>& q0, const Matrix<S>& k0,
               S total_time, int repeats) {
  Matrix<S> q = q0, k = k0;
  const S h0 = I::hamiltonian::template energy<S>(p, q, k)[0];
  S worst = 0;
  for (int n = 0; n < repeats; ++n) {
    flow<I, S>(p, total_time / S(repeats), q, k);
    worst = std::max(worst, std::abs(I::hamiltonian::template energy<S>(p, q, k)[0] - h0));
  }
  return worst;
}

/// Least-squares slope of log(drift) against log(h) over `repeats` = r0, 2 r0, 4 r0, ...
/// (`levels` values): the observed convergence order of the energy error.
template <class I, class S>
double energy_convergence_order(const typename I::template parameters<S>& p, const Matrix<S>& q0,
                                const Matrix<S>& k0, S total_time, int r0 = 4, int levels = 4) {
  std::vector<double> x, y;
  for (int l = 0, r = r0; l < levels; ++l, r *= 2) {
    const double h = static_cast<double>(total_time) / (r * I::steps);
    x.push_back(std::log(h));
    y.push_back(std::log(static_cast<double>(energy_drift<I, S>(p, q0, k0, total_time, r))));
  }
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / x.size();
    my += y[i] / y.size();
  }
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  return sxy / sxx;
}

/// Random Hamiltonian parameters with O(1) dynamics (a, c ~ N(0, scale^2), b, e ~ N(0, 0.1^2)), for
/// checks that need the flow to do something.
template <class S>
HamiltonianParameters<S> random_hamiltonian(Index d, Index m, Rng& rng, double scale = 1.0) {
  HamiltonianParameters<S> p(DynamicsShape{d, m, scale}, rng);
  rng.fill_normal(p.b, 0.1);
  rng.fill_normal(p.e, 0.1);
  return p;
}

}  // namespace coupledqk::testing
