// Text generation from a checkpoint with a KV cache per layer.
//
// Decoder runs the GPT one token at a time: the attention layers through Attention::decode (their
// KVCache holds the EVOLVED keys K' and the values of the tokens so far, so the dynamics run once
// per token), everything else (embeddings, LayerNorm, MLP, ln_f, tied logits) with the plain
// kernels of autodiff/kernels.hpp. Its logits equal model.logits() of the whole sequence to float
// round-off (tests/train/test_generate.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <coupledqk/core/random.hpp>
#include <coupledqk/core/types.hpp>

#include "checkpoint.hpp"

namespace coupledqk::train {

/// Incremental forward of one sequence (batch 1).
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Feeds the token at position position() and returns the logits [V] of the next token.
  /// Throws invalid_argument when the context is full (position() == capacity()) or the id is
  /// outside the vocabulary.
  virtual Vector<float> next(std::int32_t id) = 0;
  /// Empties the caches (position 0).
  virtual void reset() = 0;
  virtual Index position() const = 0;
  /// The model's context: positions 0..capacity()-1.
  virtual Index capacity() const = 0;
};

/// A decoder over `model` (which must outlive it), for any registry variant (through visit_gpt).
std::unique_ptr<Decoder> make_decoder(Model& model);

/// The logits [n, V] of a sequence of n <= context ids, computed token by token with the decoder.
Matrix<float> incremental_logits(Model& model, const std::vector<std::int32_t>& ids);

/// Samples a token from logits: temperature <= 0 is greedy (argmax); otherwise softmax(logits /
/// temperature) restricted to the top_k largest (top_k <= 0: all), drawn with `rng`.
std::int32_t sample_token(const Vector<float>& logits, double temperature, Index top_k, Rng& rng);

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt;
  Index tokens = 200;          ///< tokens to generate (at most)
  double temperature = 0.8;
  Index top_k = 40;
  std::uint64_t seed = 1;
  int threads = 1;             ///< 0: idle_cores()
  bool stop_at_eos = true;     ///< stop at the end-of-document token
};

struct Generation {
  std::string text;                     ///< prompt + continuation
  std::string continuation;
  std::vector<std::int32_t> prompt_ids; ///< eos (document start) + encoded prompt
  std::vector<std::int32_t> ids;        ///< generated ids
  bool ended_at_eos = false;
  double seconds = 0;
  double tokens_per_s = 0;
};

/// Loads the checkpoint (model + tokenizer) and continues the prompt. When the context fills
/// up, the cache is rebuilt from the last half of the context and generation goes on.
Generation generate(const GenerateOptions& o);

/// The same with an already loaded model and tokenizer.
Generation generate(Model& model, const Tokenizer& tokenizer, const GenerateOptions& o);

}  // namespace coupledqk::train
