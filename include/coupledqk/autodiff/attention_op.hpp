// A whole attention layer as ONE tape node, with the layer's analytic backward.
//
//     y = ops::attention(tape, layer, x, batch, &grad);    x, y: [B*T, D], rows ordered (b, t)
//
// The node's closure owns the layer's Attention::Context (what the layer's forward keeps: its
// input, the evolved Q', K', V, the scoring output and probabilities, the dynamics' states); its
// backward calls layer.backward(ctx, dy, *grad), which accumulates (+=) the layer's parameter
// gradients straight into `grad` (the model's gradient buffer), and accumulates dx into x.
// When nothing requires a gradient (x is a constant and grad is null) the layer runs without a
// context and nothing is kept.
#pragma once

#include "../attention.hpp"
#include "ops.hpp"

namespace coupledqk::ops {

/// `layer` and `grad` must outlive the tape's backward. grad: null to leave the layer's parameters
/// out of the backward (frozen), else a buffer from layer.zero_gradients().
template <class S, class I, class Sc>
Var attention(Tape<S>& t, const Attention<S, I, Sc>& layer, Var x, Index batch,
              typename Attention<S, I, Sc>::Parameters* grad) {
  using Layer = Attention<S, I, Sc>;
  const Index N = t.rows(x), D = layer.config().dim;
  require(t.cols(x) == D, "attention op: x has ", t.cols(x), " columns; the layer's dim is D = ", D);
  const bool req = t.requires_grad(x) || grad != nullptr;
  const Var y = t.push(N, D, req);
  if (!req) {
    Matrix<S> out = layer.forward(t.value(x), batch, nullptr);
    t.output(y).swap(out);  // the layer allocated it anyway: no copy
    return y;
  }
  struct Backward {
    const Layer* layer;
    typename Layer::Parameters* grad;
    Var x, y;
    typename Layer::Context ctx;
    void operator()(Tape<S>& tp) {
      // dy: [B*T, D] -> dx: [B*T, D]; parameter gradients += into *grad
      if (grad) {
        Matrix<S> dx = layer->backward(ctx, tp.grad(y), *grad);
        tp.accumulate_move(x, dx);
      } else {
        typename Layer::Parameters scratch = layer->zero_gradients();
        Matrix<S> dx = layer->backward(ctx, tp.grad(y), scratch);
        tp.accumulate_move(x, dx);
      }
    }
  };
  Backward& b = t.set_backward(y, Backward{&layer, grad, x, y, {}});
  Matrix<S> out = layer.forward(t.value(x), batch, &b.ctx);
  t.output(y).swap(out);
  return y;
}

}  // namespace coupledqk::ops
