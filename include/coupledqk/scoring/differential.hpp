// Differential scoring (Ye et al., "Differential Transformer"): H/2 differential heads, each made of
// two query/key sub-heads of size d (sub-heads 2g and 2g+1) and a value of size 2d:
//
//     A_g    = softmax(Q1 K1^T / sqrt(d) + mask) - lambda * softmax(Q2 K2^T / sqrt(d) + mask)
//     lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 l)
//     O_g    = (1 - lambda_init) * RMSNorm(A_g V_g) * subln      (RMSNorm over the 2d channels)
//
// l is the 0-based layer index. lq*, lk*: [d], subln: [2d], shared by the heads of a layer. The mask
// (causal by default) and the sequences are the shape's (scoring/mask.hpp); padding rows give 0.
#pragma once

#include <vector>

#include "../core/error.hpp"
#include "../core/parameters.hpp"
#include "../core/random.hpp"
#include "../core/parallel.hpp"
#include "masked_softmax.hpp"
#include "policy.hpp"
#include "flash_softmax.hpp"

namespace coupledqk {

template <class S>
struct DifferentialParameters : NamedTensors<DifferentialParameters<S>> {
  Vector<S> lq1, lk1, lq2, lk2;  // [d]
  Vector<S> subln;               // [2d]

  template <class Self, class F>
  static void fields(Self& s, F& f) {
    f("lq1", s.lq1);
    f("lk1", s.lk1);
    f("lq2", s.lq2);
    f("lk2", s.lk2);
    f("subln", s.subln);
  }
};

struct Differential {
  static constexpr const char* name = "differential";
  static constexpr double rms_eps = 1e-5;
  /// Forward FLOPs of B sequences of T tokens at width D: per differential head two causal score
  /// matrices of width d and values of width 2d, 3 B T^2 D over the H/2 heads.
  static constexpr double score_flops(double B, double T, double D) { return 3 * B * T * T * D; }
  static constexpr bool supports_masks = true;

  template <class S>
  using parameters = DifferentialParameters<S>;

  /// Kept for the backward: lambda; the un-normalised output A V [B*T, D] and its inverse RMS per
  /// (row, differential head) [B*T, H/2]. Reference path: both probability matrices of every
  /// (batch, differential head). Fast path: the two attention outputs P1 V and P2 V [B*T, D] and
  /// their log-sum-exps [B*H/2, T].
  template <class S>
  struct saved {
    std::vector<Matrix<S>> probs1, probs2;
    Matrix<S> o1, o2, lse1, lse2;
    Matrix<S> av;
    Matrix<S> inv_rms;
    S lambda = 0;
    mutable Matrix<S> dav, do2;  // backward's workspace (reused call after call), not kept state
    mutable std::vector<typename FlashSoftmax<S>::Workspace> work;  // tiles, one set per thread
  };

  static double lambda_init(int layer_index) { return 0.8 - 0.6 * std::exp(-0.3 * layer_index); }

  static void validate(const ScoringShape& sh) {
    require(sh.heads >= 2 && sh.heads % 2 == 0,
            "Differential scoring pairs the heads (sub-heads 2g and 2g+1 form differential head g), ",
            "so the head count must be even; got heads = ", sh.heads);
    require(sh.layer_index >= 0, "Differential scoring: layer_index must be >= 0; got ", sh.layer_index);
  }

  /// lq*, lk* ~ N(0, 0.1^2); subln = 1.
  template <class S>
  static parameters<S> make_parameters(const ScoringShape& sh, Rng& rng) {
    parameters<S> p;
    for (Vector<S>* v : {&p.lq1, &p.lk1, &p.lq2, &p.lk2}) {
      v->resize(sh.head_dim);
      rng.fill_normal(*v, 0.1);
    }
    p.subln = Vector<S>::Ones(2 * sh.head_dim);
    return p;
  }

  template <class S>
  static S lambda(const parameters<S>& p, int layer_index) {
    return std::exp(p.lq1.dot(p.lk1)) - std::exp(p.lq2.dot(p.lk2)) + S(lambda_init(layer_index));
  }

  template <class S>
  static void forward(const parameters<S>& p, const ScoringShape& sh, const Matrix<S>& q,
                      const Matrix<S>& k, const Matrix<S>& v, Matrix<S>& o, saved<S>* keep) {
    const Index T = sh.seq, d = sh.head_dim, G = sh.heads / 2, BG = sh.batch * G;
    const S scale = S(1) / std::sqrt(S(d));
    const S lam = lambda(p, sh.layer_index);
    const S out_scale = S(1) - S(lambda_init(sh.layer_index));
    o.resize(q.rows(), q.cols());
    saved<S> local;
    saved<S>& s = keep ? *keep : local;
    s.lambda = lam;
    s.av.resize(q.rows(), q.cols());
    s.inv_rms.resize(q.rows(), G);
    if (sh.padded()) {  // the padding rows: A V = 0, O = 0
      o.setZero();
      s.av.setZero();
      s.inv_rms.setZero();
    }
    if (sh.reference) {
      s.probs1.assign(BG, Matrix<S>());
      s.probs2.assign(BG, Matrix<S>());
    } else {
      s.o1.resize(q.rows(), q.cols());
      s.o2.resize(q.rows(), q.cols());
      if (sh.padded()) {
        s.o1.setZero();
        s.o2.setZero();
      }
      s.lse1.resize(BG, T);
      s.lse2.resize(BG, T);
      FlashSoftmax<S>::prepare(s.work, T, 2 * d);
    }
    parallel_for(BG, [&](Index bg) {
      const Index b = bg / G, g = bg % G;
      const Index r0 = sh.start(b), L = sh.length(b), c1 = 2 * g * d, c2 = (2 * g + 1) * d, cv = 2 * g * d;
      auto av = s.av.block(r0, cv, L, 2 * d);
      if (sh.reference) {
        Matrix<S>& P1 = s.probs1[bg];
        Matrix<S>& P2 = s.probs2[bg];
        MaskedSoftmax<S>::probabilities(q.block(r0, c1, L, d), k.block(r0, c1, L, d), scale, P1, sh.mask);
        MaskedSoftmax<S>::probabilities(q.block(r0, c2, L, d), k.block(r0, c2, L, d), scale, P2, sh.mask);
        av.noalias() = (P1 - lam * P2) * v.block(r0, cv, L, 2 * d);
      } else {
        // A V = P1 V - lambda P2 V: two flash attentions with values of width 2d
        auto& w = s.work[static_cast<std::size_t>(thread_index())];
        FlashSoftmax<S>::forward(q.block(r0, c1, L, d), k.block(r0, c1, L, d), v.block(r0, cv, L, 2 * d),
                                 scale, s.o1.block(r0, cv, L, 2 * d), s.lse1.row(bg).data(), w, sh.mask);
        FlashSoftmax<S>::forward(q.block(r0, c2, L, d), k.block(r0, c2, L, d), v.block(r0, cv, L, 2 * d),
                                 scale, s.o2.block(r0, cv, L, 2 * d), s.lse2.row(bg).data(), w, sh.mask);
        av = s.o1.block(r0, cv, L, 2 * d) - lam * s.o2.block(r0, cv, L, 2 * d);
      }
      for (Index i = 0; i < L; ++i) {
        const S r = S(1) / std::sqrt(av.row(i).squaredNorm() / S(2 * d) + S(rms_eps));
        s.inv_rms(r0 + i, g) = r;
        o.block(r0 + i, cv, 1, 2 * d).array() = (out_scale * r) * av.row(i).array() * p.subln.transpose().array();
      }
    });
  }

  // One new query per sequence against its cached keys and values (incremental decoding).
  // q: [1, D] evolved; keys (evolved), values: [n, D], the keys its mask lets it see; o: [1, D] (=).
  template <class S>
  static void decode(const parameters<S>& p, const ScoringShape& sh, const ConstMatrixRef<S>& q,
                     const ConstBlockRef<S>& keys, const ConstBlockRef<S>& values, MatrixRef<S> o) {
    const Index d = sh.head_dim, G = sh.heads / 2, n = keys.rows();
    const S scale = S(1) / std::sqrt(S(d));
    const S lam = lambda(p, sh.layer_index);
    const S out_scale = S(1) - S(lambda_init(sh.layer_index));
    Vector<S> p1, p2;
    for (Index g = 0; g < G; ++g) {
      const Index c1 = 2 * g * d, c2 = (2 * g + 1) * d, cv = 2 * g * d;
      MaskedSoftmax<S>::last_row(q.block(0, c1, 1, d), keys.block(0, c1, n, d), scale, p1);
      MaskedSoftmax<S>::last_row(q.block(0, c2, 1, d), keys.block(0, c2, n, d), scale, p2);
      const Matrix<S> av = (p1 - lam * p2).transpose() * values.block(0, cv, n, 2 * d);
      const S r = S(1) / std::sqrt(av.squaredNorm() / S(2 * d) + S(rms_eps));
      o.block(0, cv, 1, 2 * d).array() = (out_scale * r) * av.array() * p.subln.transpose().array();
    }
  }

  // o: the forward's output (unused: what is needed is in `s`); d_o: its cotangent.
  // dq, dk, dv are written (=); grad accumulates (+=).
  template <class S>
  static void backward(const parameters<S>& p, const ScoringShape& sh, const Matrix<S>& q,
                       const Matrix<S>& k, const Matrix<S>& v, const Matrix<S>&, const saved<S>& s,
                       const Matrix<S>& d_o, Matrix<S>& dq, Matrix<S>& dk, Matrix<S>& dv,
                       parameters<S>& grad) {
    const Index T = sh.seq, d = sh.head_dim, G = sh.heads / 2, BG = sh.batch * G;
    const S scale = S(1) / std::sqrt(S(d));
    const S lam = s.lambda;
    const S out_scale = S(1) - S(lambda_init(sh.layer_index));
    dq.setZero(q.rows(), q.cols());
    dk.setZero(k.rows(), k.cols());
    dv.setZero(v.rows(), v.cols());
    // Through o = out_scale * r * av * subln, r = (mean(av^2) + eps)^(-1/2), row by row, serially
    // (subln's gradient is a sum over every row).
    Matrix<S>& dav = s.dav;
    dav.resize(q.rows(), q.cols());
    if (sh.padded()) dav.setZero();  // the padding rows: no gradient flows back from them
    auto is_padding = [&](Index row) {
      if (!sh.padded()) return false;
      const Index b = row / T;
      return row - b * T >= sh.length(b);
    };
    for (Index row = 0; row < q.rows(); ++row) {
      if (is_padding(row)) continue;
      for (Index g = 0; g < G; ++g) {
        const Index cv = 2 * g * d;
        const S r = s.inv_rms(row, g);
        const auto avr = s.av.block(row, cv, 1, 2 * d).array();
        const auto doi = d_o.block(row, cv, 1, 2 * d).array();
        grad.subln.array() += (out_scale * r) * (avr * doi).transpose();
        const auto gi = out_scale * doi * p.subln.transpose().array();  // an expression
        const S mean_go = (gi * avr).sum() / S(2 * d);
        dav.block(row, cv, 1, 2 * d).array() = r * (gi - avr * (r * r * mean_go));
      }
    }
    S dlambda = 0;
    if (sh.reference) {
      Matrix<S> dA, dP2;
      for (Index bg = 0; bg < BG; ++bg) {
        const Index b = bg / G, g = bg % G;
        const Index r0 = sh.start(b), L = sh.length(b), c1 = 2 * g * d, c2 = (2 * g + 1) * d, cv = 2 * g * d;
        const Matrix<S>& P1 = s.probs1[bg];
        const Matrix<S>& P2 = s.probs2[bg];
        const auto davb = dav.block(r0, cv, L, 2 * d);
        dv.block(r0, cv, L, 2 * d).noalias() = (P1 - lam * P2).transpose() * davb;
        dA.noalias() = davb * v.block(r0, cv, L, 2 * d).transpose();
        dlambda -= (dA.array() * P2.array()).sum();
        dP2 = -lam * dA;
        MaskedSoftmax<S>::backward(P1, dA, q.block(r0, c1, L, d), k.block(r0, c1, L, d), scale,
                                   dq.block(r0, c1, L, d), dk.block(r0, c1, L, d));
        MaskedSoftmax<S>::backward(P2, dP2, q.block(r0, c2, L, d), k.block(r0, c2, L, d), scale,
                                   dq.block(r0, c2, L, d), dk.block(r0, c2, L, d));
      }
    } else {
      // av = o1 - lambda o2: d o1 = dav, d o2 = -lambda dav, d lambda = -sum(dav * o2)
      dlambda = -(dav.array() * s.o2.array()).sum();
      Matrix<S>& do2 = s.do2;
      do2 = -lam * dav;
      FlashSoftmax<S>::prepare(s.work, T, 2 * d);
      parallel_for(BG, [&](Index bg) {
        const Index b = bg / G, g = bg % G;
        const Index r0 = sh.start(b), L = sh.length(b), c1 = 2 * g * d, c2 = (2 * g + 1) * d, cv = 2 * g * d;
        FlashSoftmax<S>::backward(q.block(r0, c1, L, d), k.block(r0, c1, L, d), v.block(r0, cv, L, 2 * d),
                                  s.o1.block(r0, cv, L, 2 * d), dav.block(r0, cv, L, 2 * d),
                                  s.lse1.row(bg).data(), scale, dq.block(r0, c1, L, d),
                                  dk.block(r0, c1, L, d), dv.block(r0, cv, L, 2 * d),
                                  s.work[static_cast<std::size_t>(thread_index())], sh.mask);
        FlashSoftmax<S>::backward(q.block(r0, c2, L, d), k.block(r0, c2, L, d), v.block(r0, cv, L, 2 * d),
                                  s.o2.block(r0, cv, L, 2 * d), do2.block(r0, cv, L, 2 * d),
                                  s.lse2.row(bg).data(), scale, dq.block(r0, c2, L, d),
                                  dk.block(r0, c2, L, d), dv.block(r0, cv, L, 2 * d),
                                  s.work[static_cast<std::size_t>(thread_index())], sh.mask);
      });
    }
    const S e1 = std::exp(p.lq1.dot(p.lk1)), e2 = std::exp(p.lq2.dot(p.lk2));
    grad.lq1 += (dlambda * e1) * p.lk1;
    grad.lk1 += (dlambda * e1) * p.lq1;
    grad.lq2 -= (dlambda * e2) * p.lk2;
    grad.lk2 -= (dlambda * e2) * p.lq2;
  }
};

}  // namespace coupledqk
