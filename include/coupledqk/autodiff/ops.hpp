// Tape ops for a GPT: each is one node with its forward and, right below it, its backward.
//
// Conventions: every activation is [N, C] row-major with one token per row (N = B*T). A vector
// parameter (bias, gain) is a [1, C] leaf. Backward closures read grad(y) and accumulate (+=) into
// their inputs' gradients (tape.accumulate*: the first write into an internal node is a plain =).
// An input that requires no gradient gets none (its product is never formed).
// What each node keeps for the backward is stated per op; input values are read from the tape.
// Memory: an op's backward forms its input's gradient in the node's scratch (tape.scratch, kept
// across steps) and hands it over with accumulate_move, or writes it in place (grad_target + gemm);
// so the same graph built step after step allocates nothing after its first step.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/error.hpp"
#include "../core/gemm.hpp"
#include "../core/types.hpp"
#include "kernels.hpp"
#include "tape.hpp"

namespace coupledqk::ops {

namespace detail {
template <class S>
void require_shape(const Tape<S>& t, Var v, Index rows, Index cols, const char* op, const char* what) {
  require(t.rows(v) == rows && t.cols(v) == cols, op, ": ", what, " is [", t.rows(v), ", ", t.cols(v),
          "]; expected [", rows, ", ", cols, "]");
}
}  // namespace detail

// ---- embedding lookup ------------------------------------------------------------------------
// table: [V, D]; ids: n ids in [0, V); y: [n, D], y[i] = table[ids[i]].
// Keeps: a copy of the ids. Backward: dtable[ids[i]] += dy[i], i = 0..n-1 in order (scatter-add;
// repeated ids sum, deterministically).
namespace detail {
/// The lookup of n rows; id(i) gives the row of output i (already checked to be in range).
template <class S, class Id>
Var embedding_rows(Tape<S>& t, Var table, Index n, Id id) {
  const Index D = t.cols(table);
  const Var y = t.push(n, D, t.requires_grad(table));
  {
    const auto tab = t.value(table);
    Matrix<S>& out = t.output(y);
    for (Index i = 0; i < n; ++i) out.row(i) = tab.row(id(i));
  }
  if (!t.requires_grad(y)) return y;
  std::vector<std::int32_t>& ids = t.index(y);  // keeps its capacity across clears
  ids.resize(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = id(i);
  t.set_backward(y, [table, y](Tape<S>& tp) {
    const auto dy = tp.grad(y);                  // [n, D]
    const std::vector<std::int32_t>& id = tp.index(y);
    MatrixMap<S> dtab = tp.grad(table);          // [V, D], accumulated
    for (std::size_t i = 0; i < id.size(); ++i) dtab.row(id[i]) += dy.row(static_cast<Index>(i));
  });
  return y;
}
}  // namespace detail

template <class S>
Var embedding(Tape<S>& t, Var table, const std::int32_t* ids, Index n) {
  const Index V = t.rows(table);
  require(n > 0 && ids != nullptr, "embedding: needs at least one id; got n = ", n);
  for (Index i = 0; i < n; ++i)
    require(ids[i] >= 0 && ids[i] < V, "embedding: id ", ids[i], " at position ", i,
            " is outside the table's rows [0, ", V, ")");
  return detail::embedding_rows(t, table, n, [ids](Index i) { return ids[i]; });
}

// ---- position embedding ------------------------------------------------------------------------
// table: [C, D]; y: [n, D] with y[i] = table[i % seq] (rows ordered (b, t): t restarts every seq
// rows). The same node as embedding() with the ids i % seq, without an id array from the caller.
template <class S>
Var position_embedding(Tape<S>& t, Var table, Index n, Index seq) {
  require(n > 0 && seq > 0 && n % seq == 0, "position_embedding: n = ", n, " rows must be a positive ",
          "multiple of the sequence length ", seq);
  require(seq <= t.rows(table), "position_embedding: sequence length ", seq, " exceeds the table's ",
          t.rows(table), " rows");
  return detail::embedding_rows(t, table, n, [seq](Index i) { return static_cast<std::int32_t>(i % seq); });
}

// ---- linear / matmul -------------------------------------------------------------------------
// The products go through coupledqk::gemm (core/gemm.hpp): Eigen's kernel, buffers kept per thread.
// x: [N, in]; w: [in, out] (stored [in, out] as in the attention layer); b: [1, out] or Var{}.
// y = x w + b: [N, out]. Keeps nothing (reads x, w).
// Backward: dx += dy w^T; dw += x^T dy; db += sum_rows(dy).
template <class S>
Var linear(Tape<S>& t, Var x, Var w, Var b = Var{}) {
  const Index N = t.rows(x), in = t.cols(x), out = t.cols(w);
  detail::require_shape(t, w, in, out, "linear", "weight w");
  if (b.valid()) detail::require_shape(t, b, 1, out, "linear", "bias b");
  const bool req = t.requires_grad(x) || t.requires_grad(w) || (b.valid() && t.requires_grad(b));
  const Var y = t.push(N, out, req);
  {
    Matrix<S>& o = t.output(y);
    gemm<S>(t.value(x), false, t.value(w), false, o);
    if (b.valid()) o.rowwise() += t.value(b).row(0);
  }
  if (!req) return y;
  t.set_backward(y, [x, w, b, y](Tape<S>& tp) {
    const auto dy = tp.grad(y);  // [N, out]
    if (tp.requires_grad(x)) {
      auto g = tp.grad_target(x);  // dx (+)= dy w^T
      gemm<S>(dy, false, tp.value(w), true, g.buffer, S(1), g.add);
    }
    if (tp.requires_grad(w)) {
      auto g = tp.grad_target(w);  // dw (+)= x^T dy
      gemm<S>(tp.value(x), true, dy, false, g.buffer, S(1), g.add);
    }
    if (b.valid() && tp.requires_grad(b)) tp.accumulate(b, dy.colwise().sum());
  });
  return y;
}

/// y = x w: linear without a bias.
template <class S>
Var matmul(Tape<S>& t, Var x, Var w) {
  return linear(t, x, w);
}

// ---- matmul with a transposed weight (tied output embedding) ----------------------------------
// x: [N, D]; w: [V, D]; y = x w^T: [N, V]. Keeps nothing.
// Backward: dx += dy w; dw += dy^T x.
template <class S>
Var matmul_transposed(Tape<S>& t, Var x, Var w) {
  const Index N = t.rows(x), D = t.cols(x), V = t.rows(w);
  detail::require_shape(t, w, V, D, "matmul_transposed", "weight w");
  const bool req = t.requires_grad(x) || t.requires_grad(w);
  const Var y = t.push(N, V, req);
  gemm<S>(t.value(x), false, t.value(w), true, t.output(y));
  if (!req) return y;
  t.set_backward(y, [x, w, y](Tape<S>& tp) {
    const auto dy = tp.grad(y);  // [N, V]
    if (tp.requires_grad(x)) {
      auto g = tp.grad_target(x);  // dx (+)= dy w
      gemm<S>(dy, false, tp.value(w), false, g.buffer, S(1), g.add);
    }
    if (tp.requires_grad(w)) {
      auto g = tp.grad_target(w);  // dw (+)= dy^T x
      gemm<S>(dy, true, tp.value(x), false, g.buffer, S(1), g.add);
    }
  });
  return y;
}

// ---- add (residual) --------------------------------------------------------------------------
// a, b: [N, C]; y = a + b. Keeps nothing. Backward: da += dy; db += dy.
template <class S>
Var add(Tape<S>& t, Var a, Var b) {
  detail::require_shape(t, b, t.rows(a), t.cols(a), "add", "second operand");
  const bool req = t.requires_grad(a) || t.requires_grad(b);
  const Var y = t.push(t.rows(a), t.cols(a), req);
  t.output(y).noalias() = t.value(a) + t.value(b);
  if (!req) return y;
  t.set_backward(y, [a, b, y](Tape<S>& tp) {
    const auto dy = tp.grad(y);
    tp.accumulate(a, dy);
    tp.accumulate(b, dy);
  });
  return y;
}

// ---- LayerNorm -------------------------------------------------------------------------------
// x: [N, D]; g, b: [1, D]; y: [N, D] (kernels::layer_norm_forward, eps 1e-5).
// Keeps: aux = [N, 2] (mean, 1/std) per row. Backward: kernels::layer_norm_backward.
template <class S>
Var layer_norm(Tape<S>& t, Var x, Var g, Var b) {
  const Index N = t.rows(x), D = t.cols(x);
  detail::require_shape(t, g, 1, D, "layer_norm", "gain g");
  detail::require_shape(t, b, 1, D, "layer_norm", "bias b");
  const bool req = t.requires_grad(x) || t.requires_grad(g) || t.requires_grad(b);
  const Var y = t.push(N, D, req);
  kernels::layer_norm_forward<S>(t.value(x), t.value(g), t.value(b), t.output(y), req ? &t.aux(y) : nullptr);
  if (!req) return y;
  t.set_backward(y, [x, g, b, y](Tape<S>& tp) {
    Matrix<S>& dx = tp.scratch(y);  // kept across steps: no allocation after the first
    kernels::layer_norm_backward<S>(tp.value(x), tp.value(g), tp.aux(y), tp.grad(y), dx,
                                    tp.requires_grad(g) ? tp.grad(g).data() : nullptr,
                                    tp.requires_grad(b) ? tp.grad(b).data() : nullptr);
    tp.accumulate_move(x, dx);
  });
  return y;
}

// ---- GELU (tanh form) ------------------------------------------------------------------------
// x, y: [N, C]. Keeps nothing (reads x). Backward: dx += dy * gelu'(x).
template <class S>
Var gelu(Tape<S>& t, Var x) {
  const bool req = t.requires_grad(x);
  const Var y = t.push(t.rows(x), t.cols(x), req);
  kernels::gelu_forward<S>(t.value(x), t.output(y));
  if (!req) return y;
  t.set_backward(y, [x, y](Tape<S>& tp) {
    Matrix<S>& dx = tp.scratch(y);
    kernels::gelu_backward<S>(tp.value(x), tp.grad(y), dx);
    tp.accumulate_move(x, dx);
  });
  return y;
}

// ---- softmax cross-entropy, mean over rows ----------------------------------------------------
// logits: [N, V]; targets: N ids in [0, V); y: [1, 1] = mean_r (logsumexp(z_r) - z_r[t_r]).
// Keeps: aux = softmax(logits) [N, V] (formed without gradients too, so that loss and evaluation
// agree bit for bit; see kernels::cross_entropy_forward) and a copy of the targets. Backward:
// dlogits += dy/N * (p - onehot), formed in place of p and handed to the logits node without a copy.
template <class S>
Var cross_entropy(Tape<S>& t, Var logits, const std::int32_t* targets, Index n) {
  const Index N = t.rows(logits), V = t.cols(logits);
  require(n == N && targets != nullptr, "cross_entropy: ", n, " targets for ", N,
          " rows of logits; expected one target per row");
  for (Index i = 0; i < n; ++i)
    require(targets[i] >= 0 && targets[i] < V, "cross_entropy: target ", targets[i], " at position ", i,
            " is outside the vocabulary [0, ", V, ")");
  const bool req = t.requires_grad(logits);
  const Var y = t.push(1, 1, req);
  t.output(y)(0, 0) = kernels::cross_entropy_forward<S>(t.value(logits), targets, t.aux(y), &t.scratch(y));
  if (!req) return y;
  t.index(y).assign(targets, targets + n);
  t.set_backward(y, [logits, y](Tape<S>& tp) {
    Matrix<S>& p = tp.aux(y);  // [N, V] -> dlogits
    kernels::cross_entropy_backward<S>(p, tp.index(y).data(), tp.grad(y)(0, 0));
    tp.accumulate_move(logits, p);
  });
  return y;
}

}  // namespace coupledqk::ops
