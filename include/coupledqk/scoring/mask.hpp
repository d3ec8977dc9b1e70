// Which keys a query sees: the attention mask, and how a batch is laid out in rows.
//
// A mask is a small run-time description, not a template parameter: causal or bidirectional,
// optionally within a sliding window w. For query t of a sequence of length L it allows the keys
//
//     causal                  0 <= t' <= t
//     causal, window w        t - w < t' <= t
//     bidirectional           0 <= t' < L
//     bidirectional, window w |t - t'| < w,  0 <= t' < L
//
// always one contiguous range [begin(t), end(t, L)) that contains t, so every query sees at least
// itself and both ends move forward with t (the tiled kernels skip the tiles outside it).
//
// A batch of B sequences is laid out in rows of [rows, D] in one of three ways:
//
//     equal    B sequences of T tokens, rows b*T .. b*T + T-1                (the default)
//     padded   B sequences right-padded to T: sequence b holds lengths[b] <= T tokens at rows
//              b*T .. b*T + lengths[b]-1; the padding rows produce zeros and get zero gradient
//     packed   B sequences end to end (flash-attention's varlen cu_seqlens): sequence b is rows
//              offsets[b] .. offsets[b+1]-1, offsets = (0, ..., rows); no row is padding
//
// Positions (rotary embeddings) count from 0 at each sequence's first token.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/types.hpp"

namespace coupledqk {

/// Causal or bidirectional attention, optionally within a window (0 = no window).
struct Mask {
  bool causal = true;
  Index window = 0;

  bool is_default() const { return causal && window == 0; }
  /// The first key query t sees, and one past its last in a sequence of `length` tokens.
  Index begin(Index t) const { return window > 0 ? std::max<Index>(0, t - window + 1) : 0; }
  Index end(Index t, Index length) const {
    if (causal) return t + 1;
    return window > 0 ? std::min(length, t + window) : length;
  }
};

inline void validate(const Mask& m) {
  require(m.window >= 0, "attention mask: window must be >= 0 (0 means no window); got ", m.window);
}

/// "causal", "bidirectional", "causal, window 128", ...
inline std::string to_string(const Mask& m) {
  std::string s = m.causal ? "causal" : "bidirectional";
  if (m.window > 0) s += ", window " + std::to_string(m.window);
  return s;
}

enum class SequenceLayout { equal, padded, packed };

inline const char* to_string(SequenceLayout l) {
  return l == SequenceLayout::padded ? "padded" : l == SequenceLayout::packed ? "packed" : "equal";
}

/// How the rows of one call are cut into sequences (see the top of this file).
class Sequences {
 public:
  Sequences() = default;

  /// B sequences of T tokens each.
  static Sequences equal(Index batch, Index seq) {
    require(batch > 0, "sequences: batch (B) must be positive; got ", batch);
    require(seq > 0, "sequences: sequence length (T) must be positive; got ", seq);
    Sequences s;
    s.layout_ = SequenceLayout::equal;
    s.batch_ = batch;
    s.seq_ = seq;
    return s;
  }

  /// lengths.size() sequences right-padded to `seq` rows each; 1 <= lengths[b] <= seq.
  static Sequences padded(Index seq, std::vector<Index> lengths) {
    require(!lengths.empty(), "sequences: padded lengths are empty; expected one length per sequence (B >= 1)");
    require(seq > 0, "sequences: padded sequence length (T) must be positive; got ", seq);
    for (std::size_t b = 0; b < lengths.size(); ++b)
      require(lengths[b] >= 1 && lengths[b] <= seq, "sequences: length of sequence ", b, " is ", lengths[b],
              "; expected 1..", seq, " (the padded length T)");
    Sequences s;
    s.layout_ = SequenceLayout::padded;
    s.batch_ = static_cast<Index>(lengths.size());
    s.seq_ = seq;
    s.lengths_ = std::move(lengths);
    return s;
  }

  /// offsets.size() - 1 sequences packed end to end: offsets[0] = 0, strictly increasing (no empty
  /// sequence), offsets.back() = the number of rows.
  static Sequences packed(std::vector<Index> offsets) {
    require(offsets.size() >= 2, "sequences: packed offsets hold ", offsets.size(),
            " value(s); expected B+1 >= 2 values (0, ..., rows)");
    require(offsets[0] == 0, "sequences: packed offsets must start at 0; got ", offsets[0]);
    Index longest = 0;
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      require(offsets[b + 1] > offsets[b], "sequences: packed offsets must increase strictly (no empty sequence); ",
              "offsets[", b, "] = ", offsets[b], ", offsets[", b + 1, "] = ", offsets[b + 1]);
      longest = std::max(longest, offsets[b + 1] - offsets[b]);
    }
    Sequences s;
    s.layout_ = SequenceLayout::packed;
    s.batch_ = static_cast<Index>(offsets.size()) - 1;
    s.seq_ = longest;
    s.offsets_ = std::move(offsets);
    return s;
  }

  SequenceLayout layout() const { return layout_; }
  Index batch() const { return batch_; }
  /// T: rows per sequence (equal, padded); the longest sequence (packed).
  Index seq() const { return seq_; }
  /// Rows of the whole batch: B*T, or offsets.back() when packed.
  Index rows() const { return layout_ == SequenceLayout::packed ? offsets_.back() : batch_ * seq_; }
  /// First row of sequence b, and its number of (valid) tokens.
  Index start(Index b) const {
    return layout_ == SequenceLayout::packed ? offsets_[static_cast<std::size_t>(b)] : b * seq_;
  }
  Index length(Index b) const {
    const auto i = static_cast<std::size_t>(b);
    if (layout_ == SequenceLayout::packed) return offsets_[i + 1] - offsets_[i];
    return layout_ == SequenceLayout::padded ? lengths_[i] : seq_;
  }
  /// True when every row is a token of its sequence (no padding).
  bool dense() const { return layout_ != SequenceLayout::padded; }
  /// True for B sequences of T rows each (equal or padded): rows (b, t) with t = row % T.
  bool strided() const { return layout_ != SequenceLayout::packed; }
  const std::vector<Index>& lengths() const { return lengths_; }
  const std::vector<Index>& offsets() const { return offsets_; }

  /// The position of every row within its sequence (0 at its first token; padding rows continue).
  void positions_into(std::vector<Index>& out) const {
    out.resize(static_cast<std::size_t>(rows()));
    for (Index b = 0; b < batch_; ++b) {
      const Index r0 = start(b), n = strided() ? seq_ : length(b);
      for (Index t = 0; t < n; ++t) out[static_cast<std::size_t>(r0 + t)] = t;
    }
  }

  bool operator==(const Sequences& o) const {
    return layout_ == o.layout_ && batch_ == o.batch_ && seq_ == o.seq_ && lengths_ == o.lengths_ &&
           offsets_ == o.offsets_;
  }
  bool operator!=(const Sequences& o) const { return !(*this == o); }

 private:
  SequenceLayout layout_ = SequenceLayout::equal;
  Index batch_ = 0, seq_ = 0;
  std::vector<Index> lengths_, offsets_;
};

}  // namespace coupledqk
