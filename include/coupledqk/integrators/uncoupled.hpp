// Uncoupled: the matched-capacity MLP baseline. q and k each get their own residual tanh MLP and
// never see each other, so the Jacobian is block-diagonal. Per step:
//
//     q <- q + h Pq2 tanh(Pq1 q + pq),   k <- k + h Pk2 tanh(Pk1 k + pk)
//
// Pq1, Pk1: [m/2, d]; pq, pk: [m/2]; Pq2, Pk2: [d, m/2]. Like the coupled policies it has a learned
// integration time per head (h = softplus(rho_h) / N): the only difference under test is coupling.
#pragma once

#include "../dynamics/tanh_map.hpp"
#include "policy.hpp"

namespace coupledqk {

template <class S>
struct UncoupledParameters : NamedTensors<UncoupledParameters<S>> {
  Matrix<S> Pq1, Pk1;  // [m/2, d]
  Vector<S> pq, pk;    // [m/2]
  Matrix<S> Pq2, Pk2;  // [d, m/2]

  UncoupledParameters() = default;

  /// P*1 ~ N(0, 1/d); p* = 0; P*2 ~ N(0, init_scale^2) (0 by default: exact standard attention).
  UncoupledParameters(const DynamicsShape& shape, Rng& rng) {
    require(shape.hidden >= 2 && shape.hidden % 2 == 0, "Uncoupled: the hidden width m must be even ",
            "and at least 2 (each of q and k gets m/2 units); got m = ", shape.hidden);
    const Index r = shape.hidden / 2, d = shape.head_dim;
    const double w_std = 1.0 / std::sqrt(static_cast<double>(d));
    Pq1.resize(r, d);
    Pk1.resize(r, d);
    Pq2.resize(d, r);
    Pk2.resize(d, r);
    pq = Vector<S>::Zero(r);
    pk = Vector<S>::Zero(r);
    rng.fill_normal(Pq1, w_std);
    rng.fill_normal(Pk1, w_std);
    rng.fill_normal(Pq2, shape.init_scale);
    rng.fill_normal(Pk2, shape.init_scale);
  }

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("Pq1", s.Pq1);
    f("Pk1", s.Pk1);
    f("pq", s.pq);
    f("pk", s.pk);
    f("Pq2", s.Pq2);
    f("Pk2", s.Pk2);
  }
};

/// The buffers of Uncoupled: sub-step sizes, the two output matrices transposed (and their
/// gradients), activations, the field and its cotangent.
template <class S>
struct UncoupledScratch {
  Vector<S> h;                      // [P] sub-step sizes
  Matrix<S> bq, bk, dbq, dbk;       // Pq2^T, Pk2^T [m/2, d] and their gradients
  Matrix<S> act, f, bar;            // [P, m/2] activations, [P, d] field and its cotangent
  TanhScratch<S> tanh;
};

template <int Steps>
struct Uncoupled {
  static_assert(Steps >= 1, "Uncoupled: the step count must be at least 1");

  static constexpr int steps = Steps;
  static constexpr int order = 1;  // explicit Euler on each MLP field
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = false;
  static constexpr bool is_reversible = false;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "uncoupled";

  /// Forward FLOPs per (q, k) pair: per step two fields of half width m/2, each [d x m/2] then
  /// [m/2 x d]: 2 N (2 d m).
  static constexpr double flops_per_pair(double d, double m) { return 2.0 * Steps * 2 * d * m; }

  template <class S>
  using parameters = UncoupledParameters<S>;
  template <class S>
  using scratch = UncoupledScratch<S>;

  template <class S>
  static parameters<S> make_parameters(const DynamicsShape& shape, Rng& rng) {
    return parameters<S>(shape, rng);
  }

  // keep->states: the input of every step, q_0, k_0, ..., q_{N-1}, k_{N-1}.
  template <class S>
  static void forward(const parameters<S>& p, const Vector<S>& tau, MatrixRef<S> q, MatrixRef<S> k,
                      StateTrace<S, scratch<S>>* keep, DynamicsMemory memory) {
    require(memory == DynamicsMemory::store,
            "Uncoupled: DynamicsMemory::recompute needs a reversible integrator; Uncoupled is not "
            "(use DynamicsMemory::store)");
    scratch<S> local;
    scratch<S>& ws = keep ? keep->scratch : local;
    ws.h = tau / S(Steps);
    ws.bq = p.Pq2.transpose();
    ws.bk = p.Pk2.transpose();
    if (keep) keep->states.resize(2 * Steps);
    for (int s = 0; s < Steps; ++s) {
      if (keep) {
        keep->states[2 * s] = q;  // same size step after step: no allocation
        keep->states[2 * s + 1] = k;
      }
      TanhMap<S>::apply(q, p.Pq1, p.pq, nullptr, ws.bq, ws.act, ws.f, ws.tanh);
      q.array() += ws.f.array().colwise() * ws.h.array();
      TanhMap<S>::apply(k, p.Pk1, p.pk, nullptr, ws.bk, ws.act, ws.f, ws.tanh);
      k.array() += ws.f.array().colwise() * ws.h.array();
    }
  }

  template <class S>
  static void backward(const parameters<S>& p, const Vector<S>& tau, const StateTrace<S, scratch<S>>& keep,
                       const ConstMatrixRef<S>&, const ConstMatrixRef<S>&, MatrixRef<S> dq,
                       MatrixRef<S> dk, parameters<S>& grad, Vector<S>& dtau, DynamicsMemory) {
    require(static_cast<int>(keep.states.size()) == 2 * Steps, "Uncoupled::backward: the forward kept ",
            keep.states.size(), " states, expected ", 2 * Steps);
    scratch<S>& ws = keep.scratch;
    ws.h = tau / S(Steps);
    const S inv_steps = S(1) / S(Steps);
    ws.bq = p.Pq2.transpose();
    ws.bk = p.Pk2.transpose();
    ws.dbq.setZero(ws.bq.rows(), ws.bq.cols());
    ws.dbk.setZero(ws.bk.rows(), ws.bk.cols());
    for (int s = Steps - 1; s >= 0; --s) {
      branch_vjp(keep.states[2 * s], p.Pq1, p.pq, ws.bq, inv_steps, dq, grad.Pq1, grad.pq, ws.dbq, dtau, ws);
      branch_vjp(keep.states[2 * s + 1], p.Pk1, p.pk, ws.bk, inv_steps, dk, grad.Pk1, grad.pk, ws.dbk, dtau, ws);
    }
    grad.Pq2 += ws.dbq.transpose();
    grad.Pk2 += ws.dbk.transpose();
  }

 private:
  // x_out = x_in + h f(x_in): dx_in = dx_out + J_f^T (h dx_out); dtau += rowdot(dx_out, f) / N.
  template <class S>
  static void branch_vjp(const Matrix<S>& x_in, const Matrix<S>& P1, const Vector<S>& bias,
                         const Matrix<S>& B, S inv_steps, MatrixRef<S> dx, Matrix<S>& dP1,
                         Vector<S>& dbias, Matrix<S>& dB, Vector<S>& dtau, scratch<S>& ws) {
    TanhMap<S>::apply(x_in, P1, bias, nullptr, B, ws.act, ws.f, ws.tanh);
    dtau.noalias() += inv_steps * row_dot<S>(dx, ws.f);
    ws.bar = (dx.array().colwise() * ws.h.array()).matrix();  // fbar
    TanhMap<S>::vjp(x_in, ws.act, P1, nullptr, B, ws.bar, dx, dP1, dbias, nullptr, dB, ws.tanh);
  }
};

}  // namespace coupledqk
