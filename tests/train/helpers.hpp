// Shared helpers of the trainer tests: a tiny generated corpus in a temporary folder (no network),
// tiny training options, and small file utilities.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "support/files.hpp"
#include "trainer.hpp"

namespace cqk_train_test {

namespace fs = std::filesystem;
using namespace coupledqk;
using namespace coupledqk::train;

using cqk_test_support::contains;
using cqk_test_support::error_of;
using cqk_test_support::read_file;
using cqk_test_support::TempDir;
using cqk_test_support::write_file;

/// Pseudo-English: words built from a fixed syllable list, so the text has the repetition BPE needs
/// for a 400-piece vocabulary, with some structure for a model to learn (word 2 of a pair often
/// follows word 1). ASCII only.
inline std::string tiny_text(std::uint64_t seed, int paragraphs) {
  static const char* const syllables[] = {"ka", "lo", "mi", "ren", "tas", "vo", "dor", "pel", "shi", "nu",
                                          "gra", "bel", "tor", "an", "is", "ek", "quo", "zim", "ful", "wy"};
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  auto next = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  std::vector<std::string> lexicon;
  std::uint64_t ls = 99;
  for (int i = 0; i < 120; ++i) {
    std::string w;
    ls = ls * 6364136223846793005ull + 1442695040888963407ull;
    const int n = 1 + static_cast<int>((ls >> 60) % 3);
    for (int k = 0; k < n; ++k) w += syllables[(ls >> (8 * k + 20)) % 20];
    lexicon.push_back(w);
  }
  std::string text;
  for (int p = 0; p < paragraphs; ++p) {
    if (p) text += "\n\n";
    const int sentences = 3 + static_cast<int>(next() % 4);
    for (int t = 0; t < sentences; ++t) {
      if (t) text += ' ';
      const int words = 4 + static_cast<int>(next() % 9);
      std::size_t prev = next() % lexicon.size();
      for (int w = 0; w < words; ++w) {
        // Half of the time the next word is determined by the previous one.
        const std::size_t id = next() % 2 ? (prev * 7 + 3) % lexicon.size() : next() % lexicon.size();
        std::string word = lexicon[id];
        if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
        text += (w ? " " : "") + word;
        if (w + 1 < words && next() % 9 == 0) text += ",";
        prev = id;
      }
      text += next() % 5 == 0 ? "?" : ".";
    }
  }
  return text;
}

/// A folder of 30 small documents (about 40 KB): 26 train, 2 valid, 2 test after the split.
inline void write_tiny_corpus(const fs::path& dir, int documents = 30) {
  for (int d = 0; d < documents; ++d) {
    char name[32];
    std::snprintf(name, sizeof name, "doc%02d.txt", d);
    write_file(dir / name, tiny_text(static_cast<std::uint64_t>(d + 1), 6));
  }
}

/// Options of a tiny run (V 400, D 32, L 2, H 4, T 32, B 4, 24 steps) on `corpus` with `cache`.
inline TrainOptions tiny_options(const std::string& corpus, const std::string& cache) {
  TrainOptions o;
  o.corpus = corpus;
  o.cache_dir = cache;
  o.vocab = 400;
  o.dim = 32;
  o.layers = 2;
  o.heads = 4;
  o.seq = 32;
  o.batch = 4;
  o.budget_tokens = 24 * 4 * 32;
  o.lr = 3e-3;
  o.eval_every = 8;
  o.eval_tokens = 256;
  o.threads = 1;
  o.progress = ProgressMode::off;
  return o;
}

/// Every tensor of a checkpoint whose name starts with `prefix`, as raw bytes (for bit-for-bit
/// comparisons of two checkpoints).
inline std::vector<std::pair<std::string, std::vector<unsigned char>>> checkpoint_tensors(const std::string& path,
                                                                                          const std::string& prefix) {
  std::vector<std::pair<std::string, std::vector<unsigned char>>> out;
  for (const auto& t : io::read(path).tensors)
    if (t.name.rfind(prefix, 0) == 0) out.emplace_back(t.name, t.bytes);
  return out;
}

/// The corpus and its prepared data, built once per test binary.
struct TinyData {
  TempDir dir{"data"};
  std::string corpus, cache;
  TrainData data;
  TinyData()
      : corpus((dir.path / "corpus").string()), cache((dir.path / "cache").string()), data(make(corpus, cache)) {}
  static TrainData make(const std::string& corpus, const std::string& cache) {
    write_tiny_corpus(corpus);
    return prepare_data(tiny_options(corpus, cache));
  }
};

inline TinyData& tiny_data() {
  static TinyData d;
  return d;
}

/// Runs train() with progress off.
inline TrainResult run(const TrainOptions& o) {
  Progress quiet(ProgressMode::off);
  return coupledqk::train::train(o, tiny_data().data, quiet);
}

}  // namespace cqk_train_test
