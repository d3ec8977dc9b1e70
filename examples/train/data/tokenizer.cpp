// SentencePiece BPE tokenizer and cached token streams: see tokenizer.hpp and docs/data.md.
#include "data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <coupledqk/io/atomic_file.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <thread>
#include <unordered_map>
#include <utility>

#ifndef COUPLEDQK_SENTENCEPIECE_VERSION
#define COUPLEDQK_SENTENCEPIECE_VERSION "unknown"
#endif

namespace fs = std::filesystem;

namespace coupledqk::train {

using detail::concat;

namespace {

// Bump when the way training lines are cut changes (the options are hashed themselves).
constexpr const char* kRecipe = "coupledqk-bpe-1";
// SentencePiece drops training lines longer than max_sentence_length bytes; lines are cut below it.
constexpr std::size_t kMaxLine = 4096;
constexpr std::size_t kMaxSentenceLength = 8192;

/// The printable ASCII characters that occur in `lines`. (SentencePiece's BPE trainer aborts the
/// process on a required character that does not occur.)
std::string printable_ascii_in(const std::vector<std::string>& lines) {
  bool seen[128] = {};
  for (const auto& line : lines)
    for (char c : line)
      if (c > ' ' && c <= '~') seen[static_cast<int>(c)] = true;
  std::string chars;
  for (char c = '!'; c <= '~'; ++c)
    if (seen[static_cast<int>(c)]) chars += c;
  return chars;
}

std::unordered_map<std::string, std::string> trainer_options(int vocab_size,
                                                             const std::string& required_chars) {
  return {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "0.9995"},
      // Printable ASCII seen in the text: always pieces, however rare (sotu has few 'Q's).
      {"required_chars", required_chars},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "3"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxSentenceLength)},
      {"num_threads", "1"},  // stored in the model; BPE training does not use more
      {"minloglevel", "2"},  // errors only (not stored in the model)
  };
}

/// Training lines: every non-blank line of every document, cut at spaces (or, without one, at a
/// UTF-8 character boundary) into pieces of at most kMaxLine bytes.
std::vector<std::string> training_lines(const std::vector<Document>& docs) {
  std::vector<std::string> lines;
  for (const auto& doc : docs) {
    std::string_view text = doc.text;
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t nl = text.find('\n', start);
      if (nl == std::string_view::npos) nl = text.size();
      std::string_view line = text.substr(start, nl - start);
      start = nl + 1;
      while (line.size() > kMaxLine) {
        std::size_t cut = line.rfind(' ', kMaxLine);
        std::size_t skip = 1;
        if (cut == std::string_view::npos || cut == 0) {
          cut = kMaxLine;
          while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
          skip = 0;
        }
        lines.emplace_back(line.substr(0, cut));
        line.remove_prefix(cut + skip);
      }
      if (line.find_first_not_of(" \t\f\v") != std::string_view::npos) lines.emplace_back(line);
    }
  }
  return lines;
}

class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<std::string>& lines_;
  std::size_t i_ = 0;
};

/// The number after `marker` in `message`, or -1.
long number_after(const std::string& message, const std::string& marker) {
  const std::size_t at = message.find(marker);
  if (at == std::string::npos) return -1;
  std::size_t i = at + marker.size();
  while (i < message.size() && message[i] == ' ') ++i;
  long value = 0;
  bool any = false;
  while (i < message.size() && message[i] >= '0' && message[i] <= '9') {
    value = value * 10 + (message[i++] - '0');
    any = true;
  }
  return any ? value : -1;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(concat("cannot open '", path.string(), "' for reading"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Writes `bytes` to `path` durably and atomically (io::write_file_atomically: temporary file,
/// fsync, rename), creating its folder first.
void write_atomically(const fs::path& path, const std::string& bytes) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw io_error(concat("cannot create folder '", path.parent_path().string(), "': ", ec.message()));
  io::write_file_atomically(path.string(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

// ---- token files ------------------------------------------------------------------------------

constexpr char kMagic[8] = {'C', 'Q', 'K', 'T', 'O', 'K', 'E', 'N'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeader = 32;

void put(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

std::uint64_t get(const std::string& in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

std::string token_file(const std::vector<std::int32_t>& ids, int vocab_size) {
  std::string payload;
  payload.reserve(ids.size() * 4);
  for (std::int32_t id : ids) put(payload, static_cast<std::uint32_t>(id), 4);
  std::string out(kMagic, sizeof kMagic);
  put(out, kVersion, 4);
  put(out, static_cast<std::uint32_t>(vocab_size), 4);
  put(out, ids.size(), 8);
  put(out, fnv1a64(payload), 8);
  return out + payload;
}


std::uint64_t documents_hash(const std::vector<Document>& docs, std::uint64_t h) {
  for (const auto& d : docs) {
    h = fnv1a64(std::to_string(d.name.size()), h);
    h = fnv1a64(d.name, fnv1a64(":", h));
    h = fnv1a64(std::to_string(d.text.size()), fnv1a64(":", h));
    h = fnv1a64(d.text, fnv1a64(":", h));
  }
  return h;
}

}  // namespace

// ---- token files: the reader --------------------------------------------------------------

bool parse_token_file(const std::string& bytes, int vocab_size, std::vector<std::int32_t>& ids,
                      std::string& why) {
  auto fail = [&](std::string reason) {
    why = std::move(reason);
    return false;
  };
  if (bytes.size() < kHeader) return fail(concat("only ", bytes.size(), " bytes, shorter than the header"));
  if (bytes.compare(0, sizeof kMagic, kMagic, sizeof kMagic) != 0) return fail("bad magic");
  if (get(bytes, 8, 4) != kVersion)
    return fail(concat("version ", get(bytes, 8, 4), ", expected ", kVersion));
  if (get(bytes, 12, 4) != static_cast<std::uint64_t>(vocab_size))
    return fail(concat("vocabulary ", get(bytes, 12, 4), ", expected ", vocab_size));
  const std::uint64_t count = get(bytes, 16, 8);
  if (count > (bytes.size() - kHeader) / 4 || kHeader + count * 4 != bytes.size())
    return fail(concat("size ", bytes.size(), " bytes does not match the count ", count));
  if (fnv1a64(std::string_view(bytes).substr(kHeader)) != get(bytes, 24, 8)) return fail("checksum mismatch");
  ids.resize(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint64_t v = get(bytes, kHeader + 4 * i, 4);
    if (v >= static_cast<std::uint64_t>(vocab_size)) return fail(concat("id ", v, " out of range"));
    ids[i] = static_cast<std::int32_t>(v);
  }
  return true;
}

// ---- Tokenizer --------------------------------------------------------------------------------

Tokenizer Tokenizer::from_bytes(const std::string& bytes, const std::string& path) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(bytes);
  if (!status.ok())
    throw io_error(concat("'", path, "' is not a valid SentencePiece model: ", status.ToString()));
  Tokenizer t;
  const int newline = sp->PieceToId("<0x0A>");
  t.newline_id_ = newline > 0 && sp->IsByte(newline) ? newline : -1;
  t.sp_ = std::move(sp);
  t.path_ = path;
  t.hash_ = hex(fnv1a64(bytes));
  return t;
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  return from_bytes(read_bytes(model_path), model_path);
}

Tokenizer Tokenizer::train_or_load(const std::vector<Document>& train_docs, const std::string& corpus_key,
                                   int vocab_size, const std::string& cache_dir) {
  require(vocab_size >= min_vocab_size && vocab_size <= max_vocab_size, "vocab_size ", vocab_size,
          " is out of range; accepted: ", min_vocab_size, " to ", max_vocab_size,
          " (the model holds 256 byte pieces and 4 special pieces)");
  require(!corpus_key.empty() && corpus_key.find('/') == std::string::npos, "corpus key '", corpus_key,
          "' must be a non-empty file-name-safe string (see corpus_key())");
  const std::vector<std::string> lines = training_lines(train_docs);
  if (lines.empty())
    throw io_error(
        concat("no training text for the tokenizer: ", train_docs.size(), " training documents, all blank"));

  // The file name's hash covers everything the model depends on: the recipe (how lines are cut),
  // the SentencePiece release, every trainer option and the training lines.
  const auto options = trainer_options(vocab_size, printable_ascii_in(lines));
  std::map<std::string, std::string> sorted(options.begin(), options.end());
  std::uint64_t h = fnv1a64(kRecipe);
  h = fnv1a64(COUPLEDQK_SENTENCEPIECE_VERSION, fnv1a64("\n", h));
  for (const auto& [key, value] : sorted) h = fnv1a64(value, fnv1a64("=", fnv1a64(key, fnv1a64("\n", h))));
  for (const auto& line : lines) h = fnv1a64(line, fnv1a64("\n", h));
  const fs::path path =
      fs::path(cache_dir) / "tokenizers" / concat(corpus_key, "-v", vocab_size, "-", hex(h, 12), ".model");

  std::error_code ec;
  if (fs::exists(path, ec)) {
    try {
      Tokenizer t = load(path.string());
      if (t.vocab_size() == vocab_size) return t;
      std::cerr << "tokenizer: cached model " << path.string() << " has " << t.vocab_size()
                << " pieces, expected " << vocab_size << "; training again\n";
    } catch (const io_error& e) {
      std::cerr << "tokenizer: cached model unusable (" << e.what() << "); training again\n";
    }
  }

  std::size_t bytes = 0;
  for (const auto& line : lines) bytes += line.size();
  std::cerr << "tokenizer: training SentencePiece BPE, vocab " << vocab_size << ", on " << lines.size()
            << " lines (" << bytes << " bytes) of " << train_docs.size() << " training documents\n"
            << std::flush;
  sentencepiece::SetRandomGeneratorSeed(1);  // BPE draws nothing at random; fixed all the same
  LineIterator iterator(lines);
  std::string model;
  const auto t0 = std::chrono::steady_clock::now();
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator, &model);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!status.ok()) {
    const std::string message = status.ToString();
    const long at_most = number_after(message, "Please set it to a value <=");
    if (at_most >= 0)
      throw invalid_argument(concat("vocab_size ", vocab_size, " is too large for this training text (",
                                    bytes, " bytes): SentencePiece BPE can make at most ", at_most,
                                    " pieces from it; use a vocab_size of at most ", at_most,
                                    " (or more text)"));
    const long needed = number_after(message, std::to_string(vocab_size) + " vs");
    if (message.find("smaller than required_chars") != std::string::npos && needed >= 0)
      throw invalid_argument(concat(
          "vocab_size ", vocab_size, " is too small for this training text: it needs at least ", needed,
          " (4 special pieces, 256 byte pieces, and one per character kept by character_coverage)"));
    throw io_error(concat("SentencePiece could not train a BPE model of vocab_size ", vocab_size, " on ",
                          lines.size(), " lines: ", message));
  }
  write_atomically(path, model);
  Tokenizer t = from_bytes(model, path.string());
  t.trained_ = true;
  t.train_seconds_ = seconds;
  std::cerr << "tokenizer: trained in " << seconds << " s; saved " << path.string() << "\n";
  return t;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  std::vector<int> ids;
  auto encode_line = [&](std::string_view line) {
    const auto status = sp_->Encode(line, &ids);
    if (!status.ok()) throw io_error(concat("SentencePiece could not encode a text: ", status.ToString()));
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (newline_id_ < 0) {
    encode_line(text);
    return out;
  }
  // Line by line, as the model was trained: every line starts a word (gets the "▁" prefix), and
  // each '\n' is its byte piece.
  std::size_t start = 0;
  while (true) {
    const std::size_t nl = text.find('\n', start);
    encode_line(text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    if (nl == std::string_view::npos) break;
    out.push_back(newline_id_);
    start = nl + 1;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  const int n = vocab_size();
  for (std::size_t i = 0; i < ids.size(); ++i)
    require(ids[i] >= 0 && ids[i] < n, "token id ", ids[i], " at position ", i,
            " is out of range; accepted: 0 to ", n - 1);
  std::string text, line;
  std::vector<int> segment;
  // Segment by segment between newline pieces, so that each line drops its own "▁" prefix again.
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i < ids.size() && ids[i] != newline_id_) {
      segment.push_back(ids[i]);
      continue;
    }
    const auto status = sp_->Decode(segment, &line);
    if (!status.ok()) throw io_error(concat("SentencePiece could not decode: ", status.ToString()));
    text += line;
    if (i < ids.size()) text += '\n';
    segment.clear();
  }
  return text;
}

std::string Tokenizer::piece(std::int32_t id) const {
  require(id >= 0 && id < vocab_size(), "token id ", id, " is out of range; accepted: 0 to ",
          vocab_size() - 1);
  return sp_->IdToPiece(id);
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
std::int32_t Tokenizer::unk_id() const { return sp_->unk_id(); }
std::int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
std::int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
std::int32_t Tokenizer::pad_id() const { return sp_->pad_id(); }

// ---- token streams ----------------------------------------------------------------------------

std::vector<std::int32_t> encode_documents(const std::vector<Document>& docs, const Tokenizer& tokenizer) {
  require(tokenizer.eos_id() >= 0, "the tokenizer ", tokenizer.model_path(), " has no eos id");
  std::vector<std::vector<std::int32_t>> parts(docs.size());
  const unsigned threads =
      std::max(1u, std::min({std::thread::hardware_concurrency(), 8u, static_cast<unsigned>(docs.size())}));
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    while (!failed) {
      const std::size_t i = next++;
      if (i >= docs.size()) break;
      try {
        parts[i] = tokenizer.encode(docs[i].text);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  std::size_t total = 0;
  for (const auto& p : parts) total += p.size() + 1;
  std::vector<std::int32_t> stream;
  stream.reserve(total);
  for (const auto& p : parts) {
    stream.insert(stream.end(), p.begin(), p.end());
    stream.push_back(tokenizer.eos_id());
  }
  return stream;
}

TokenStreams tokenize_split(const Split& split, const Tokenizer& tokenizer, const std::string& cache_dir,
                            const std::string& corpus_key) {
  require(!corpus_key.empty() && corpus_key.find('/') == std::string::npos, "corpus key '", corpus_key,
          "' must be a non-empty file-name-safe string (see corpus_key())");
  std::uint64_t h = fnv1a64("train");
  h = documents_hash(split.train, h);
  h = documents_hash(split.valid, fnv1a64("valid", h));
  h = documents_hash(split.test, fnv1a64("test", h));
  const fs::path dir = fs::path(cache_dir) / "tokens" /
                       concat(corpus_key, "-", tokenizer.model_hash().substr(0, 12), "-", hex(h, 12));
  TokenStreams streams;
  const std::pair<const char*, std::pair<const std::vector<Document>*, std::vector<std::int32_t>*>> parts[] =
      {{"train", {&split.train, &streams.train}},
       {"valid", {&split.valid, &streams.valid}},
       {"test", {&split.test, &streams.test}}};
  for (const auto& [name, part] : parts) {
    const fs::path file = dir / concat(name, ".bin");
    std::error_code ec;
    if (fs::exists(file, ec)) {
      std::string why;
      try {
        if (parse_token_file(read_bytes(file), tokenizer.vocab_size(), *part.second, why)) continue;
      } catch (const io_error& e) {
        why = e.what();
      }
      std::cerr << "tokens: cache file " << file.string() << " is corrupt (" << why << "); rebuilding it\n";
    }
    *part.second = encode_documents(*part.first, tokenizer);
    write_atomically(file, token_file(*part.second, tokenizer.vocab_size()));
  }
  return streams;
}

SplitStats split_stats(const Split& split, const TokenStreams& streams) {
  SplitStats s = split_stats(split);
  s.train.tokens = streams.train.size();
  s.valid.tokens = streams.valid.size();
  s.test.tokens = streams.test.size();
  return s;
}

}  // namespace coupledqk::train
