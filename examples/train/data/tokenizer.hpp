// The training example's tokenizer (SentencePiece BPE, trained on the training split only) and the
// token streams of a split, both cached on disk. See docs/data.md for the options and cache keys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpora.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace coupledqk::train {

/// A SentencePiece BPE model. Lossless: decode(encode(text)) == text for any UTF-8 text (identity
/// normalisation, whitespace kept, byte fallback for characters outside the vocabulary). Text is
/// encoded line by line, as the model was trained: each '\n' is the byte piece <0x0A> and the
/// first word of every line gets the word-initial "▁" piece.
/// Special ids: unk 0, bos 1, eos 2 (the end-of-document token), pad 3. Copies share the model;
/// encode() and decode() may be called from several threads.
class Tokenizer {
 public:
  /// 4 special pieces + 256 byte pieces + 94 printable ASCII characters + "▁" + a little room.
  /// SentencePiece may ask for more (one piece per character kept by character_coverage), which
  /// is reported with its numbers.
  static constexpr int min_vocab_size = 384;
  static constexpr int max_vocab_size = 1 << 20;

  /// The model for `train_docs` at <cache_dir>/tokenizers/<corpus_key>-v<vocab_size>-<hash>.model,
  /// where <hash> is 12 hex digits of a hash of the training text and the training options: loaded
  /// when that file exists and is a valid model of that size, else trained on `train_docs` (the
  /// training split only) and written atomically (temporary file + rename). Training is
  /// deterministic: the same documents give the same model bytes.
  /// Throws invalid_argument when vocab_size is outside [min_vocab_size, max_vocab_size] or too
  /// large or too small for this text (with SentencePiece's bound), io_error on an empty training
  /// text or when the cache cannot be written.
  static Tokenizer train_or_load(const std::vector<Document>& train_docs, const std::string& corpus_key,
                                 int vocab_size, const std::string& cache_dir);

  /// Loads any SentencePiece model file (io_error when it cannot be read or parsed).
  static Tokenizer load(const std::string& model_path);
  /// The same from the file's bytes (e.g. a checkpoint's tokenizer.model); `path` names it in
  /// messages and is model_path().
  static Tokenizer from_bytes(const std::string& bytes, const std::string& path);

  std::vector<std::int32_t> encode(std::string_view text) const;
  /// Control ids (bos, eos, pad) decode to nothing; an id outside [0, vocab_size()) is an
  /// invalid_argument.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  /// The text of one piece ("▁the", "<0x0A>", "</s>"), for inspection.
  std::string piece(std::int32_t id) const;

  int vocab_size() const;
  std::int32_t unk_id() const;
  std::int32_t bos_id() const;
  std::int32_t eos_id() const;
  std::int32_t pad_id() const;
  const std::string& model_path() const { return path_; }
  /// 16 hex digits of FNV-1a 64 over the model file's bytes: keys the token cache.
  const std::string& model_hash() const { return hash_; }
  /// True when train_or_load() trained this model now, false when it was loaded.
  bool trained() const { return trained_; }
  /// Seconds SentencePiece took to train it (0 when loaded).
  double train_seconds() const { return train_seconds_; }

 private:
  Tokenizer() = default;

  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  std::string path_, hash_;
  std::int32_t newline_id_ = -1;  // the byte piece <0x0A>; -1 for models without byte fallback
  bool trained_ = false;
  double train_seconds_ = 0;
};

/// The token streams of a split: each document encoded on its own and followed by eos_id(), in
/// the split's document order.
struct TokenStreams {
  std::vector<std::int32_t> train, valid, test;
};

/// Encodes documents into one stream (each followed by eos), using several threads; the result
/// does not depend on the number of threads.
std::vector<std::int32_t> encode_documents(const std::vector<Document>& docs, const Tokenizer& tokenizer);

/// The split's streams, cached at <cache_dir>/tokens/<corpus_key>-<model hash>-<split hash>/
/// {train,valid,test}.bin (<split hash>: 12 hex digits of a hash of every document's split, name
/// and text). Each file: 32-byte header (magic "CQKTOKEN", u32 version 1, u32 vocab size, u64 count,
/// u64 FNV-1a 64 of the payload), then count little-endian int32 ids. A file that is missing or
/// fails any check (size, magic, version, vocabulary, checksum, id range) is rebuilt, with a note
/// on stderr.
TokenStreams tokenize_split(const Split& split, const Tokenizer& tokenizer, const std::string& cache_dir,
                            const std::string& corpus_key);

/// Reads a token cache file's bytes (the format above) for a vocabulary of `vocab_size`: fills `ids`
/// and returns true, or returns false with the reason in `why` (size, magic, version, vocabulary,
/// checksum, an id out of range). Never throws for bad bytes.
bool parse_token_file(const std::string& bytes, int vocab_size, std::vector<std::int32_t>& ids, std::string& why);

/// split_stats(split) with the token counts (stream lengths, eos included) filled in.
SplitStats split_stats(const Split& split, const TokenStreams& streams);

}  // namespace coupledqk::train
