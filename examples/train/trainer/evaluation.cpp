#include "evaluation.hpp"

#include <algorithm>
#include <cmath>

namespace coupledqk::train {

Perplexity evaluate_stream(const Model& model, Tape<float>& tape, const std::vector<std::int32_t>& stream,
                           Index seq, Index batch, Index max_tokens) {
  const BatchLoss loss = [&](TokenSpan tokens, TokenSpan targets, Index nb) {
    return model.evaluate(tape, tokens, targets, nb);
  };
  return evaluate_stream(loss, stream, seq, batch, max_tokens);
}

Perplexity evaluate_stream(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                           Index max_tokens) {
  const PartialLoss part = evaluate_part(loss, stream, seq, batch, max_tokens, 0, 1);
  Perplexity p;
  p.tokens = part.all_tokens;
  p.loss = part.total / static_cast<double>(p.tokens);
  p.ppl = std::exp(p.loss);
  return p;
}

PartialLoss evaluate_part(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                          Index max_tokens, int part, int parts) {
  const Index N = static_cast<Index>(stream.size());
  require(N >= 2, "evaluate: the stream holds ", N, " token(s); at least 2 are needed (one to predict)");
  require(seq > 0 && batch > 0, "evaluate: seq and batch must be positive; got ", seq, ", ", batch);
  require(parts > 0 && part >= 0 && part < parts, "evaluate: part ", part, " of ", parts, " does not exist");
  const Index W = std::min(seq, N - 1);
  Index count = (N - 1) / W;
  if (max_tokens > 0) count = std::min(count, std::max<Index>(1, max_tokens / W));
  const Index first = count * part / parts, end = count * (part + 1) / parts;
  std::vector<std::int32_t> tokens, targets;
  double total = 0;
  for (Index i = first; i < end; i += batch) {
    const Index nb = std::min(batch, end - i);
    tokens.resize(static_cast<std::size_t>(nb * W));
    targets.resize(tokens.size());
    for (Index b = 0; b < nb; ++b) {
      const auto s = static_cast<std::ptrdiff_t>((i + b) * W);
      std::copy(stream.begin() + s, stream.begin() + s + W, tokens.begin() + b * W);
      std::copy(stream.begin() + s + 1, stream.begin() + s + 1 + W, targets.begin() + b * W);
    }
    total += static_cast<double>(loss(tokens, targets, nb)) * static_cast<double>(nb * W);
  }
  return PartialLoss{total, (end - first) * W, count * W};
}

}  // namespace coupledqk::train
