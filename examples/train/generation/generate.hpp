// Text generation from a checkpoint: the tokenizer around the library's KV-cache decoder and
// sampler (include/coupledqk/model/decoder.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <coupledqk/model/decoder.hpp>

#include "records/checkpoint.hpp"

namespace coupledqk::train {

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
