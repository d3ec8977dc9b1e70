// Incremental decoding of a GPT with a KV cache per layer, and sampling from its logits.
//
// GptDecoder<G> runs the compiled model G = Gpt<S, I, Sc> one token at a time: the attention layers
// through Attention::decode (their KVCache holds the EVOLVED keys K' and the values of the tokens
// so far, so the dynamics run once per token), everything else (embeddings, LayerNorm, MLP, ln_f,
// tied logits) with the plain kernels of autodiff/kernels.hpp:
//
//     x  = wte[id] (+ wpe[pos] with learned positions; rope: the layers rotate at pos)  [1, D]
//     x += attn_l.decode(ln1_l(x), cache_l);  x += proj_l(gelu(fc_l(ln2_l(x))))     per block
//     logits = ln_f(x) wte^T                                                         [1, V]
//
// Its logits equal model.logits() of the whole sequence to round-off (tests/autodiff/test_gpt.cpp).
// make_decoder(model) asks the model (AnyGpt::make_decoder): the compiled Gpt<S, I, Sc> behind an
// AnyGpt knows its own policies, so no variant table is needed. gpt.hpp includes this file at its
// end, so the decoder is there wherever a model is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "../autodiff/kernels.hpp"
#include "../core/error.hpp"
#include "../core/random.hpp"
#include "../core/types.hpp"
#include "gpt.hpp"

namespace coupledqk {

/// Incremental forward of one sequence (batch 1).
template <class S>
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Feeds the token at position position() and returns the logits [V] of the next token.
  /// Throws invalid_argument when the context is full (position() == capacity()) or the id is
  /// outside the vocabulary.
  virtual Vector<S> next(std::int32_t id) = 0;
  /// Empties the caches (position 0).
  virtual void reset() = 0;
  virtual Index position() const = 0;
  /// The model's context: positions 0..capacity()-1.
  virtual Index capacity() const = 0;
};

/// The decoder of a compiled model G = Gpt<S, I, Sc> (which must outlive it).
template <class G>
class GptDecoder final : public Decoder<typename G::scalar> {
  using S = typename G::scalar;

 public:
  explicit GptDecoder(G& model) : model_(model) { reset(); }

  Vector<S> next(std::int32_t id) override {
    const GptConfig& c = model_.config();
    require(pos_ < c.context, "decoder: the context of ", c.context, " tokens is full; reset() or start again");
    require(id >= 0 && id < c.vocab, "decoder: token id ", id, " is outside the vocabulary [0, ", c.vocab, ")");
    const GptTensors<S>& p = model_.tensors();
    x_ = p.wte.row(id);
    if (c.positions == GptPositions::learned) x_ += p.wpe.row(pos_);
    for (Index l = 0; l < c.layers; ++l) {
      const GptBlock<S>& b = p.h[static_cast<std::size_t>(l)];
      kernels::layer_norm_forward<S>(x_, row_of(b.ln1_g), row_of(b.ln1_b), a_, nullptr);
      x_ += model_.layer(l).decode(a_, caches_[static_cast<std::size_t>(l)]);
      kernels::layer_norm_forward<S>(x_, row_of(b.ln2_g), row_of(b.ln2_b), a_, nullptr);
      h_.noalias() = a_ * b.fc_w;  // [1, 4D]
      h_ += row_of(b.fc_b);
      h_ = h_.unaryExpr([](S v) { return kernels::gelu(v); });
      x_.noalias() += h_ * b.proj_w;  // [1, D]
      x_ += row_of(b.proj_b);
    }
    kernels::layer_norm_forward<S>(x_, row_of(p.lnf_g), row_of(p.lnf_b), a_, nullptr);
    ++pos_;
    return (p.wte * a_.transpose());  // [V, 1]: the tied output embedding
  }

  void reset() override {
    const GptConfig& c = model_.config();
    caches_.clear();
    for (Index l = 0; l < c.layers; ++l) caches_.push_back(model_.layer(l).make_cache(1, c.context));
    pos_ = 0;
    x_.resize(1, c.dim);
    a_.resize(1, c.dim);
  }

  Index position() const override { return pos_; }
  Index capacity() const override { return model_.config().context; }

 private:
  /// A [D] vector as the [1, D] row the kernels take.
  static ConstMatrixMap<S> row_of(const Vector<S>& v) { return ConstMatrixMap<S>(v.data(), 1, v.size()); }

  G& model_;
  std::vector<typename G::Layer::KVCache> caches_;
  Index pos_ = 0;
  Matrix<S> x_, a_, h_;  // residual stream, normalised input, MLP hidden
};

template <class S, class I, class Sc>
std::unique_ptr<Decoder<S>> Gpt<S, I, Sc>::make_decoder() {
  return std::make_unique<GptDecoder<Gpt<S, I, Sc>>>(*this);
}

/// A decoder over `model` (which must outlive it), of any variant, a consumer's table's too.
template <class S>
std::unique_ptr<Decoder<S>> make_decoder(AnyGpt<S>& model) {
  return model.make_decoder();
}

/// The logits [n, V] of a sequence of n <= context ids, computed token by token with a decoder.
template <class S>
Matrix<S> incremental_logits(Decoder<S>& dec, Index vocab, const std::vector<std::int32_t>& ids) {
  require(static_cast<Index>(ids.size()) <= dec.capacity(), "incremental_logits: ", ids.size(),
          " ids exceed the context of ", dec.capacity());
  dec.reset();
  Matrix<S> out(static_cast<Index>(ids.size()), vocab);
  for (std::size_t i = 0; i < ids.size(); ++i) out.row(static_cast<Index>(i)) = dec.next(ids[i]).transpose();
  return out;
}

/// The same with a decoder made for `model` (a built-in variant).
template <class S>
Matrix<S> incremental_logits(AnyGpt<S>& model, const std::vector<std::int32_t>& ids) {
  auto dec = make_decoder(model);
  return incremental_logits(*dec, model.config().vocab, ids);
}

/// Samples a token from logits: temperature <= 0 is greedy (argmax, the first of ties); otherwise
/// softmax(logits / temperature) restricted to the top_k largest (top_k <= 0: all), drawn with `rng`.
template <class S>
std::int32_t sample_token(const Vector<S>& logits, double temperature, Index top_k, Rng& rng) {
  const Index V = logits.size();
  require(V > 0, "sample_token: no logits");
  if (temperature <= 0) {
    Index best = 0;
    for (Index i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<std::int32_t>(best);
  }
  const Index k = top_k > 0 ? std::min(top_k, V) : V;
  std::vector<Index> order(static_cast<std::size_t>(V));
  std::iota(order.begin(), order.end(), Index(0));
  // Largest first; ties by id, so the choice never depends on the sort's implementation.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](Index a, Index b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double top = static_cast<double>(logits[order[0]]);
  std::vector<double> w(static_cast<std::size_t>(k));
  double sum = 0;
  for (Index i = 0; i < k; ++i)
    sum += (w[static_cast<std::size_t>(i)] =
                std::exp((static_cast<double>(logits[order[static_cast<std::size_t>(i)]]) - top) / temperature));
  double u = rng.uniform() * sum;
  for (Index i = 0; i < k; ++i) {
    u -= w[static_cast<std::size_t>(i)];
    if (u < 0) return static_cast<std::int32_t>(order[static_cast<std::size_t>(i)]);
  }
  return static_cast<std::int32_t>(order[static_cast<std::size_t>(k - 1)]);
}

}  // namespace coupledqk
