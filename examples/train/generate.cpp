#include "generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include <coupledqk/autodiff/kernels.hpp>

#include "trainer.hpp"

namespace coupledqk::train {

namespace {

/// A [D] vector as the [1, D] row the kernels take.
ConstMatrixMap<float> row_of(const Vector<float>& v) { return ConstMatrixMap<float>(v.data(), 1, v.size()); }

/// The decoder of a compiled model Gpt<float, I, Sc>:
///   x  = wte[id] + wpe[pos]                                                        [1, D]
///   x += attn_l.decode(ln1_l(x), cache_l);  x += proj_l(gelu(fc_l(ln2_l(x))))     per block
///   logits = ln_f(x) wte^T                                                         [1, V]
template <class G>
class DecoderImpl final : public Decoder {
 public:
  explicit DecoderImpl(G& model) : model_(model) { reset(); }

  Vector<float> next(std::int32_t id) override {
    const GptConfig& c = model_.config();
    require(pos_ < c.context, "decoder: the context of ", c.context, " tokens is full; reset() or start again");
    require(id >= 0 && id < c.vocab, "decoder: token id ", id, " is outside the vocabulary [0, ", c.vocab, ")");
    const GptTensors<float>& p = model_.tensors();
    x_ = p.wte.row(id) + p.wpe.row(pos_);
    for (Index l = 0; l < c.layers; ++l) {
      const GptBlock<float>& b = p.h[static_cast<std::size_t>(l)];
      kernels::layer_norm_forward<float>(x_, row_of(b.ln1_g), row_of(b.ln1_b), a_, nullptr);
      x_ += model_.layer(l).decode(a_, caches_[static_cast<std::size_t>(l)]);
      kernels::layer_norm_forward<float>(x_, row_of(b.ln2_g), row_of(b.ln2_b), a_, nullptr);
      h_.noalias() = a_ * b.fc_w;                                          // [1, 4D]
      h_ += row_of(b.fc_b);
      h_ = h_.unaryExpr([](float v) { return kernels::gelu(v); });
      x_.noalias() += h_ * b.proj_w;                                       // [1, D]
      x_ += row_of(b.proj_b);
    }
    kernels::layer_norm_forward<float>(x_, row_of(p.lnf_g), row_of(p.lnf_b), a_, nullptr);
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
  G& model_;
  std::vector<typename G::Layer::KVCache> caches_;
  Index pos_ = 0;
  Matrix<float> x_, a_, h_;  // residual stream, normalised input, MLP hidden
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(Model& model) {
  return visit_gpt(model, [](auto& g) -> std::unique_ptr<Decoder> {
    return std::make_unique<DecoderImpl<std::decay_t<decltype(g)>>>(g);
  });
}

Matrix<float> incremental_logits(Model& model, const std::vector<std::int32_t>& ids) {
  auto dec = make_decoder(model);
  require(static_cast<Index>(ids.size()) <= dec->capacity(), "incremental_logits: ", ids.size(),
          " ids exceed the context of ", dec->capacity());
  Matrix<float> out(static_cast<Index>(ids.size()), model.config().vocab);
  for (std::size_t i = 0; i < ids.size(); ++i) out.row(static_cast<Index>(i)) = dec->next(ids[i]).transpose();
  return out;
}

std::int32_t sample_token(const Vector<float>& logits, double temperature, Index top_k, Rng& rng) {
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
  for (Index i = 0; i < k; ++i) sum += (w[static_cast<std::size_t>(i)] = std::exp((logits[order[static_cast<std::size_t>(i)]] - top) / temperature));
  double u = rng.uniform() * sum;
  for (Index i = 0; i < k; ++i) {
    u -= w[static_cast<std::size_t>(i)];
    if (u < 0) return static_cast<std::int32_t>(order[static_cast<std::size_t>(i)]);
  }
  return static_cast<std::int32_t>(order[static_cast<std::size_t>(k - 1)]);
}

Generation generate(Model& model, const Tokenizer& tok, const GenerateOptions& o) {
  require(o.tokens >= 0, "--tokens must be >= 0; got ", o.tokens);
  require(std::isfinite(o.temperature) && o.temperature >= 0, "--temperature must be finite and >= 0 (0: greedy); got ",
          o.temperature);
  require(o.top_k >= 0, "--top-k must be >= 0 (0: no limit); got ", o.top_k);
  require(tok.vocab_size() == model.config().vocab, "the tokenizer has ", tok.vocab_size(),
          " pieces but the model's vocabulary is ", model.config().vocab);
  const double t0 = now_seconds();
  Generation g;
  // The streams put eos before every document but the first, so eos reads as "a document starts".
  g.prompt_ids.push_back(tok.eos_id());
  for (std::int32_t id : tok.encode(o.prompt)) g.prompt_ids.push_back(id);
  auto dec = make_decoder(model);
  const Index C = dec->capacity();
  std::vector<std::int32_t> all = g.prompt_ids;
  // A prompt longer than the context: keep its end.
  if (static_cast<Index>(all.size()) > C) all.erase(all.begin(), all.end() - C);
  Vector<float> logits;
  for (std::int32_t id : all) logits = dec->next(id);
  Rng rng(o.seed);
  for (Index n = 0; n < o.tokens; ++n) {
    const std::int32_t id = sample_token(logits, o.temperature, o.top_k, rng);
    if (o.stop_at_eos && id == tok.eos_id()) {
      g.ended_at_eos = true;
      break;
    }
    g.ids.push_back(id);
    all.push_back(id);
    if (n + 1 == o.tokens) break;
    if (dec->position() == C) {
      // Context full: rebuild the caches from the last half of the context.
      dec->reset();
      const std::size_t keep = static_cast<std::size_t>(std::max<Index>(1, C / 2));
      for (std::size_t i = all.size() - keep; i < all.size(); ++i) logits = dec->next(all[i]);
    } else {
      logits = dec->next(id);
    }
  }
  // Decoded together with the prompt: SentencePiece drops the word-initial space of the first
  // piece of a decoded run, which would glue the continuation to the prompt.
  std::vector<std::int32_t> text_ids(g.prompt_ids.begin() + 1, g.prompt_ids.end());
  text_ids.insert(text_ids.end(), g.ids.begin(), g.ids.end());
  g.text = tok.decode(text_ids);
  if (g.text.compare(0, o.prompt.size(), o.prompt) == 0) {
    g.continuation = g.text.substr(o.prompt.size());
  } else {  // not expected (decoding is lossless); keep the prompt as given
    g.continuation = tok.decode(g.ids);
    g.text = o.prompt + g.continuation;
  }
  g.seconds = now_seconds() - t0;
  g.tokens_per_s = g.seconds > 0 ? static_cast<double>(g.ids.size()) / g.seconds : 0;
  return g;
}

Generation generate(const GenerateOptions& o) {
  require(!o.checkpoint.empty(), "generate needs --checkpoint PATH");
  require(o.threads >= 0 && o.threads <= max_threads, "--threads must be in [0, ", max_threads,
          "] (0: the idle cores); got ", o.threads);
  set_threads(o.threads);
  const Checkpoint ckpt = read_checkpoint(o.checkpoint);
  auto model = load_model(ckpt);
  const Tokenizer tok = load_tokenizer(ckpt);
  return generate(*model, tok, o);
}

}  // namespace coupledqk::train
