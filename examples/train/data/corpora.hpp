// The training example's data pipeline: corpora as documents, a deterministic train/valid/test
// split by document, and simple statistics. The tokenizer and the token streams are in
// tokenizer.hpp. docs/data.md describes the corpora, the rules and the cache layout.
//
// Errors: bad input (a missing path, no text, a binary file, too few documents, an unknown corpus)
// raises coupledqk::io_error; a bad argument (e.g. a vocabulary size out of range) raises
// coupledqk::invalid_argument. Every message says what was wrong, the value seen and what is
// accepted.
#pragma once

#include <coupledqk/core/error.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/fnv1a.hpp"  // fnv1a64: the split and cache keys

namespace coupledqk::train {

/// One document: a unique name (a file name, a chapter, "file.txt#0003") and its UTF-8 text.
/// Documents never cross the split boundaries and are separated by an end-of-document token.
struct Document {
  std::string name;
  std::string text;
};

/// The corpora that load_corpus() fetches by name: {"sotu", "brown", "moby-dick"}
/// (pinned in data/corpora.tsv).
const std::vector<std::string>& known_corpora();

/// The source tree this library was built from (scripts/fetch-data and data/corpora.tsv live there).
std::string source_dir();

/// $COUPLEDQK_CACHE when set and non-empty, else <source dir>/.cache.
std::string default_cache_dir();

/// Loads a corpus as documents, in a fixed order.
///  - "sotu" | "brown" | "moby-dick": read from <cache_dir>/data/<name>; when it is missing or not
///    verified against data/corpora.tsv, runs `<source dir>/scripts/fetch-data --cache <cache_dir>
///    <name>` first (saying so on stderr). One document per address / sample / chapter.
///  - a folder: every regular file below it (recursively, sorted by relative path; names starting
///    with '.' skipped) is one document named by its relative path; files with no text are skipped.
///  - a file: split into documents by split_text_file().
/// Text is checked and normalised by check_text(). Throws io_error on a missing path, no text,
/// a binary file, a fetch failure, or a name that is neither a known corpus nor an existing path.
std::vector<Document> load_corpus(const std::string& spec, const std::string& cache_dir);

/// A short, file-name-safe key for `spec` in cache file names: the corpus name for a known corpus,
/// else "<file or folder name, sanitised>-<8 hex digits of a hash of the absolute path>".
std::string corpus_key(const std::string& spec);

/// The file-splitting rule for a single user file (`name` names the documents "name#0001", ...):
///  1. sections separated by two or more blank lines (whitespace-only lines count as blank) are the
///     documents, when there are at least 3 of them;
///  2. otherwise paragraphs (separated by one or more blank lines) are grouped, in order, into
///     min(#paragraphs, max(20, bytes / 16 KiB)) documents of about equal size, when there are at
///     least 3 paragraphs;
///  3. otherwise io_error ("too few documents").
/// `text` must already be normalised (check_text()); `source` names the file in messages
/// (default: `name`).
std::vector<Document> split_text_file(const std::string& name, std::string_view text,
                                      const std::string& source = "");

/// Checks that `bytes` (the content of `what`, a file name for messages) is text, and normalises it:
/// a UTF-8 byte-order mark is dropped, CR LF and lone CR become LF. Throws io_error when it holds a
/// NUL byte, or when more than 1% of its bytes are not valid UTF-8 or are control characters other
/// than tab, LF, CR and form feed. Below that threshold, invalid bytes become U+FFFD and a warning is
/// printed on stderr.
std::string check_text(std::string bytes, const std::string& what);

/// Brown corpus (form C) to readable text: part-of-speech tags stripped (each token split at its
/// last '/'), `` and '' become ", no space before , . ; : ! ? ) '' ' and n't-like suffixes, none after
/// `` and (. Sentences of one paragraph (consecutive non-blank lines) are joined by a space;
/// paragraphs are separated by one blank line.
std::string brown_to_text(std::string_view tagged);

/// Train, validation and test documents.
struct Split {
  std::vector<Document> train, valid, test;
};

/// Splits documents 90/5/5 by document, deterministically: documents are ranked by name_hash() of
/// their name (ties by name, then by position); the first round(5%) (at least 1)
/// are the validation set, the next round(5%) (at least 1) the test set, the rest the training set.
/// Within a split, documents keep their corpus order. Needs at least 3 documents, each with a name
/// (io_error otherwise). Depends only on the names, so adding a document moves few others.
Split split_documents(std::vector<Document> docs);

/// Size of a set of documents. `characters` counts Unicode code points, `words` runs of
/// non-whitespace, `tokens` the length of its token stream (filled by tokenizer.hpp's
/// split_stats(split, streams); 0 when not tokenized).
struct TextStats {
  std::size_t documents = 0, bytes = 0, characters = 0, words = 0, tokens = 0;
};
TextStats text_stats(const std::vector<Document>& docs);

struct SplitStats {
  TextStats train, valid, test;
};
SplitStats split_stats(const Split& split);

/// A small aligned table, one row per split plus the total, e.g.
///   split   documents   characters      words     tokens
///   train         209    9,664,210  1,611,520  2,083,000
std::string format_stats(const SplitStats& stats);


/// The split's rank key: fnv1a64(name) passed through the SplitMix64 finaliser, so that similar
/// names ("ca01", "ca02", ...) land far apart.
std::uint64_t name_hash(std::string_view name);

/// `value` as `digits` lowercase hex digits (the low ones), e.g. hex(0xab, 4) == "00ab".
std::string hex(std::uint64_t value, int digits = 16);

}  // namespace coupledqk::train
