#include "generation/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include <coupledqk/model/decoder.hpp>

#include "records/progress.hpp"
#include "trainer.hpp"

namespace coupledqk::train {

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
