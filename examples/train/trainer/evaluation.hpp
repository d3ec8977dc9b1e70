// Perplexity of a model on a token stream: non-overlapping windows, a batch at a time, with any
// evaluator (the host model's, a backend's) and split over the ranks of a distributed run.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <coupledqk/autodiff/tape.hpp>

#include "records/checkpoint.hpp"

namespace coupledqk::train {

/// Mean cross-entropy and perplexity over non-overlapping windows of `seq` tokens of a stream
/// (each predicting its next tokens), `batch` windows at a time. max_tokens > 0 caps the tokens
/// scored (whole windows, at least one); 0 scores the whole stream.
struct Perplexity {
  double loss = 0, ppl = 0;
  Index tokens = 0;
};
/// One part of such an evaluation: the windows [count * part / parts, count * (part + 1) / parts)
/// of the `count` that evaluate_stream scores, `batch` at a time; total = the sum of their
/// token losses. Part 0 of 1 is evaluate_stream's computation, in its order.
struct PartialLoss {
  double total = 0;
  Index tokens = 0;        ///< tokens of this part
  Index all_tokens = 0;    ///< tokens of every part
};
Perplexity evaluate_stream(const Model& model, Tape<float>& tape, const std::vector<std::int32_t>& stream,
                           Index seq, Index batch, Index max_tokens = 0);
/// The same with any evaluator: loss(tokens, targets, batch) -> mean loss of the batch (e.g. a device's).
using BatchLoss = std::function<float(TokenSpan tokens, TokenSpan targets, Index batch)>;
Perplexity evaluate_stream(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                           Index max_tokens = 0);
PartialLoss evaluate_part(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                          Index max_tokens, int part, int parts);

}  // namespace coupledqk::train
