// Affine<N>: the invertible affine coupling (method spec section 3b), N alternating steps of
//
//     k <- k * exp(h s_k(q)) + h t_k(q)        the key update reads q
//     q <- q * exp(h s_q(k)) + h t_q(k)        the query update reads the updated k
//
// with h = tau / N and the conditioners of dynamics/affine_coupling.hpp. Properties:
//   * exactly invertible in closed form (inverse() below: undo q, then k, step by step), hence
//     is_reversible: DynamicsMemory::recompute rebuilds every state from (q', k') in the backward
//     and keeps nothing, so its memory does not grow with N;
//   * log |det J| = h * (sum of every s_k and s_q evaluated) (log_det() below); det J = 1 when
//     S = s0 = 0 (volume-preserving), and not symplectic in general (a non-zero s changes volume);
//   * the identity when S = s0 = T = t0 = 0 (the initialisation): exactly standard attention.
// `order` is 1: each step agrees with the flow of dk/dt = k s_k(q) + t_k(q), dq/dt = q s_q(k) +
// t_q(k) to O(h^2) (a Lie splitting). It is not a Hamiltonian flow, so the energy tests skip it.
#pragma once

#include "../dynamics/affine_coupling.hpp"
#include "policy.hpp"

namespace coupledqk {

/// What Affine needs between and inside forward and backward (its own scratch, kept in the trace).
template <class S>
struct AffineScratch {
  Vector<S> h;             // [P] sub-step sizes
  Matrix<S> u, st, E, G;   // [P, m], [P, 2d] s | t, [P, d] exp(h s), [P, 2d] cotangents of s | t
  Matrix<S> ubar;          // [P, m]
  Matrix<S> q, k;          // [P, d] states (recompute mode, inverse)
  Matrix<S> wk, wq;        // [m, 2d] stacked [S^T T^T] of each conditioner
  Matrix<S> dwk, dwq;      // [m, 2d] their gradients
};

template <int Steps>
struct Affine {
  static_assert(Steps >= 1, "Affine: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = 1;  // see the opening comment
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = true;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "affine";

  /// Forward FLOPs per (q, k) pair: per step two conditioners, each [d x m] then [m x 2d] (s and t):
  /// 2 (2 d m + 4 d m) = 12 d m, so 12 d m N.
  static constexpr double flops_per_pair(double d, double m) { return 12.0 * d * m * Steps; }

  template <class S>
  using parameters = AffineParameters<S>;
  template <class S>
  using scratch = AffineScratch<S>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  // q, k: [P, d] in place. keep->states (store mode): q_0, k_0, ..., q_{N-1}, k_{N-1}, the input of
  // every step; nothing in recompute mode.
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S, scratch<S>>* keep, DynamicsMemory memory) {
    scratch<S> local;
    scratch<S>& w = keep ? keep->scratch : local;
    check_shapes(p, tau, q, k);
    w.h = tau / S(Steps);
    AffineCoupling<S>::stack(p.k, w.wk);
    AffineCoupling<S>::stack(p.q, w.wq);
    const bool store = keep != nullptr && memory == DynamicsMemory::store;
    if (keep) keep->states.resize(store ? 2 * Steps : 0);
    for (int s = 0; s < Steps; ++s) {
      if (store) {
        keep->states[2 * s] = q;  // same size step after step: no allocation
        keep->states[2 * s + 1] = k;
      }
      AffineCoupling<S>::condition(p.k, w.wk, q, w.u, w.st);
      AffineCoupling<S>::update(w.st, w.h, k);
      AffineCoupling<S>::condition(p.q, w.wq, k, w.u, w.st);
      AffineCoupling<S>::update(w.st, w.h, q);
    }
  }

  // Store mode reads the kept inputs; recompute mode walks back from (q_out, k_out) with the
  // closed-form inverse, one step at a time, interleaved with the vjps (memory flat in N).
  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S, scratch<S>>& keep,
                       const ConstMatrixRef<S>& q_out, const ConstMatrixRef<S>& k_out, MatrixRef<S> dq,
                       MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau, DynamicsMemory memory) {
    scratch<S>& w = keep.scratch;
    const bool recompute = memory == DynamicsMemory::recompute;
    require(recompute || static_cast<int>(keep.states.size()) == 2 * Steps, "Affine::backward: the forward kept ",
            keep.states.size(), " states, expected ", 2 * Steps, " (was forward run with a trace in store mode?)");
    w.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    AffineCoupling<S>::stack(p.k, w.wk);
    AffineCoupling<S>::stack(p.q, w.wq);
    w.dwk.setZero(w.wk.rows(), w.wk.cols());
    w.dwq.setZero(w.wq.rows(), w.wq.cols());
    if (recompute) {
      w.q = q_out;
      w.k = k_out;
    }
    for (int s = Steps - 1; s >= 0; --s) {
      // q_{s+1} = q_s exp(h s_q(k_{s+1})) + h t_q(k_{s+1})
      const ConstMatrixRef<S> k_next =
          recompute ? ConstMatrixRef<S>(w.k)
                    : (s + 1 < Steps ? ConstMatrixRef<S>(keep.states[2 * s + 3]) : k_out);
      AffineCoupling<S>::condition(p.q, w.wq, k_next, w.u, w.st);
      if (recompute) AffineCoupling<S>::undo(w.st, w.h, w.q);  // w.q = q_s
      const ConstMatrixRef<S> q_s = recompute ? ConstMatrixRef<S>(w.q) : ConstMatrixRef<S>(keep.states[2 * s]);
      AffineCoupling<S>::vjp(p.q, w.wq, k_next, w.u, w.st, w.h, inv_steps, q_s, dq, dk, grad.q, w.dwq, dtau, w.E,
                             w.G, w.ubar);
      // k_{s+1} = k_s exp(h s_k(q_s)) + h t_k(q_s)
      AffineCoupling<S>::condition(p.k, w.wk, q_s, w.u, w.st);
      if (recompute) AffineCoupling<S>::undo(w.st, w.h, w.k);  // w.k = k_s
      const ConstMatrixRef<S> k_s = recompute ? ConstMatrixRef<S>(w.k) : ConstMatrixRef<S>(keep.states[2 * s + 1]);
      AffineCoupling<S>::vjp(p.k, w.wk, q_s, w.u, w.st, w.h, inv_steps, k_s, dk, dq, grad.k, w.dwk, dtau, w.E, w.G,
                             w.ubar);
    }
    AffineCoupling<S>::unstack_add(w.dwk, grad.k);
    AffineCoupling<S>::unstack_add(w.dwq, grad.q);
  }

  /// The exact inverse of forward: (q', k') -> (q, k) in place, undoing q then k, last step first.
  template <class S>
  static void inverse(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k) {
    AffineScratch<S> w;
    check_shapes(p, tau, q, k);
    w.h = tau / S(Steps);
    AffineCoupling<S>::stack(p.k, w.wk);
    AffineCoupling<S>::stack(p.q, w.wq);
    for (int s = Steps - 1; s >= 0; --s) {
      AffineCoupling<S>::condition(p.q, w.wq, k, w.u, w.st);
      AffineCoupling<S>::undo(w.st, w.h, q);
      AffineCoupling<S>::condition(p.k, w.wk, q, w.u, w.st);
      AffineCoupling<S>::undo(w.st, w.h, k);
    }
  }

  /// log |det d(q', k') / d(q, k)| of every pair [P], from the formula h * sum(s) over every
  /// conditioner evaluation of the forward from (q, k).
  template <class S>
  static Vector<S> log_det(const parameters<S>& p, const Vector<S>& tau, const ConstMatrixRef<S>& q0,
                           const ConstMatrixRef<S>& k0) {
    AffineScratch<S> w;
    check_shapes(p, tau, q0, k0);
    Matrix<S> q = q0, k = k0;
    w.h = tau / S(Steps);
    AffineCoupling<S>::stack(p.k, w.wk);
    AffineCoupling<S>::stack(p.q, w.wq);
    Vector<S> out = Vector<S>::Zero(q.rows());
    const Index d = q.cols();
    for (int s = 0; s < Steps; ++s) {
      AffineCoupling<S>::condition(p.k, w.wk, q, w.u, w.st);
      AffineCoupling<S>::add_log_det(w.st, w.h, d, out);
      AffineCoupling<S>::update(w.st, w.h, k);
      AffineCoupling<S>::condition(p.q, w.wq, k, w.u, w.st);
      AffineCoupling<S>::add_log_det(w.st, w.h, d, out);
      AffineCoupling<S>::update(w.st, w.h, q);
    }
    return out;
  }

 private:
  template <class S, class Q, class K>
  static void check_shapes(const parameters<S>& p, const Vector<S>& tau, const Q& q, const K& k) {
    const Index d = p.k.dim();
    require(q.cols() == d && k.cols() == d && q.rows() == k.rows() && tau.size() == q.rows(),
            "Affine: q is [", q.rows(), ", ", q.cols(), "], k is [", k.rows(), ", ", k.cols(), "], tau has ",
            tau.size(), " entries; expected q, k [P, ", d, "] (d from the parameters) and tau [P]");
  }
};

}  // namespace coupledqk
