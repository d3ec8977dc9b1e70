// A whole attention layer as ONE tape node, with the layer's analytic backward.
//
//     y = ops::attention(tape, layer, x, batch, &grad);    x, y: [B*T, D], rows ordered (b, t)
//     y = ops::attention(tape, layer, x, seqs, &grad);     padded or packed sequences (scoring/mask.hpp)
//
// The node keeps the layer's Attention::Context (what the layer's forward keeps: its input, the
// evolved Q', K', V, the scoring output and statistics, the dynamics' states, and the backward's
// workspace) in its tape workspace, which survives tape.clear(): the same graph built step after
// step reuses every buffer and allocates nothing after the first step. Its backward calls
// layer.backward_into(ctx, dy, *grad, dx), which accumulates (+=) the layer's parameter gradients
// straight into `grad` (the model's gradient buffer), and dx goes to x.
// When nothing requires a gradient (x is a constant and grad is null) the layer runs without a
// context and nothing is kept.
#pragma once

#include "../attention.hpp"
#include "../autodiff/ops.hpp"

namespace coupledqk::ops {

namespace detail {
/// The node; Batch is B (an Index: B sequences of T rows) or a Sequences (padded or packed).
template <class S, class I, class Sc, class Batch>
Var attention_node(Tape<S>& t, const Attention<S, I, Sc>& layer, Var x, const Batch& batch,
                   typename Attention<S, I, Sc>::Parameters* grad) {
  using Layer = Attention<S, I, Sc>;
  const Index N = t.rows(x), D = layer.config().dim;
  require(t.cols(x) == D, "attention op: x has ", t.cols(x), " columns; the layer's dim is D = ", D);
  const bool req = t.requires_grad(x) || grad != nullptr;
  const Var y = t.push(N, D, req);
  if (!req) {
    layer.forward_into(t.value(x), batch, nullptr, t.output(y));
    return y;
  }
  using Context = typename Layer::Context;
  struct Backward {
    const Layer* layer;
    typename Layer::Parameters* grad;
    Var x, y;
    Context* ctx;  // in the node's workspace
    void operator()(Tape<S>& tp) {
      // dy: [B*T, D] -> dx: [B*T, D] (in the node's scratch); parameter gradients += into *grad
      Matrix<S>& dx = tp.scratch(y);
      if (grad) {
        layer->backward_into(*ctx, tp.grad(y), *grad, dx);
      } else {
        typename Layer::Parameters frozen = layer->zero_gradients();
        layer->backward_into(*ctx, tp.grad(y), frozen, dx);
      }
      tp.accumulate_move(x, dx);
    }
  };
  Context& ctx = t.template workspace<Context>(y);
  t.set_backward(y, Backward{&layer, grad, x, y, &ctx});
  layer.forward_into(t.value(x), batch, &ctx, t.output(y));
  return y;
}
}  // namespace detail

/// `layer` and `grad` must outlive the tape's backward. grad: null to leave the layer's parameters
/// out of the backward (frozen), else a buffer from layer.zero_gradients().
template <class S, class I, class Sc>
Var attention(Tape<S>& t, const Attention<S, I, Sc>& layer, Var x, Index batch,
              typename Attention<S, I, Sc>::Parameters* grad) {
  return detail::attention_node(t, layer, x, batch, grad);
}

/// The same over sequences of their own lengths (right-padded or packed); x: [seqs.rows(), D].
/// `seqs` is copied into the node: it need not outlive the call.
template <class S, class I, class Sc>
Var attention(Tape<S>& t, const Attention<S, I, Sc>& layer, Var x, const Sequences& seqs,
              typename Attention<S, I, Sc>::Parameters* grad) {
  return detail::attention_node(t, layer, x, seqs, grad);
}

}  // namespace coupledqk::ops
