// The training data pipeline (examples/train/data/corpora.hpp, tokenizer.hpp): loading, the split, the
// tokenizer and the token cache, on small corpora generated in a temporary folder (no network).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "data/corpora.hpp"
#include "support/files.hpp"
#include "data/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace coupledqk::train;

namespace {

using cqk_test_support::contains;
using cqk_test_support::error_of;
using cqk_test_support::TempDir;

void write(const fs::path& path, const std::string& bytes) { cqk_test_support::write_file(path, bytes); }
std::string read(const fs::path& path) { return cqk_test_support::read_file(path); }

// Deterministic English-like text with numbers, punctuation, quotes and a few non-ASCII characters.
struct TextGen {
  std::uint64_t state;
  explicit TextGen(std::uint64_t seed) : state(seed * 6364136223846793005ull + 1442695040888963407ull) {}
  std::uint32_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(state >> 33);
  }
  std::string word() {
    static const char* const words[] = {
        "the",      "of",         "and",      "to",      "in",       "a",        "is",      "that",
        "for",      "it",         "as",       "was",     "with",     "be",       "by",      "on",
        "not",      "he",         "this",     "are",     "or",       "his",      "from",    "at",
        "which",    "but",        "have",     "an",      "had",      "they",     "you",     "were",
        "their",    "one",        "all",      "we",      "can",      "her",      "has",     "there",
        "been",     "if",         "more",     "when",    "will",     "would",    "who",     "so",
        "no",       "government", "people",   "nation",  "congress", "country",  "year",    "states",
        "united",   "public",     "great",    "world",   "peace",    "war",      "new",     "law",
        "power",    "president",  "american", "service", "system",   "time",     "economy", "freedom",
        "citizens", "federal",    "program",  "whale",   "ship",     "captain",  "sea",     "ocean",
        "harpoon",  "sailor",     "voyage",   "deck",    "boat",     "crew",     "café",    "naïve",
        "résumé",   "Zürich",     "São",      "Paulo",   "über",     "jalapeño", "déjà",    "vu"};
    return words[next() % (sizeof words / sizeof words[0])];
  }
  std::string sentence() {
    std::string s;
    const int n = 5 + static_cast<int>(next() % 14);
    for (int i = 0; i < n; ++i) {
      std::string w = word();
      if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      if (next() % 17 == 0) w = std::to_string(next() % 100000);
      if (next() % 23 == 0)
        w = "$" + std::to_string(next() % 1000) + "," + std::to_string(100 + next() % 900);
      if (next() % 29 == 0) w = "\"" + w + "\"";
      if (!s.empty()) s += ' ';
      s += w;
      if (i + 1 < n && next() % 11 == 0) s += next() % 2 ? "," : ";";
      if (i + 1 < n && next() % 41 == 0) s += " \xE2\x80\x94";  // an em dash
    }
    const char* ends[] = {".", ".", ".", "?", "!", "..."};
    return s + ends[next() % 6];
  }
  std::string paragraph() {
    std::string p;
    const int n = 2 + static_cast<int>(next() % 5);
    for (int i = 0; i < n; ++i) p += (i ? " " : "") + sentence();
    return p;
  }
  std::string document(int paragraphs) {
    std::string d;
    for (int i = 0; i < paragraphs; ++i) d += (i ? "\n\n" : "") + paragraph();
    return d;
  }
};

std::vector<Document> make_docs(int n, std::uint64_t seed = 7) {
  TextGen gen(seed);
  std::vector<Document> docs;
  for (int i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "doc_%03d.txt", i);
    docs.push_back({name, gen.document(3 + i % 4)});
  }
  return docs;
}

std::vector<std::string> names(const std::vector<Document>& docs) {
  std::vector<std::string> out;
  for (const auto& d : docs) out.push_back(d.name);
  return out;
}

}  // namespace

// ---- split -------------------------------------------------------------------------------------

TEST_CASE("split: deterministic 90/5/5 by document, disjoint, complete, corpus order kept") {
  for (int n : {3, 20, 100, 233, 500}) {
    CAPTURE(n);
    const auto docs = make_docs(n);
    const Split a = split_documents(docs), b = split_documents(docs);
    CHECK(names(a.train) == names(b.train));
    CHECK(names(a.valid) == names(b.valid));
    CHECK(names(a.test) == names(b.test));
    const std::size_t expect = std::max<std::size_t>(1, (static_cast<std::size_t>(n) * 5 + 50) / 100);
    CHECK(a.valid.size() == expect);
    CHECK(a.test.size() == expect);
    CHECK(a.train.size() == static_cast<std::size_t>(n) - 2 * expect);
    std::set<std::string> all;
    for (const auto* part : {&a.train, &a.valid, &a.test}) {
      for (const auto& d : *part) all.insert(d.name);
      CHECK(std::is_sorted(part->begin(), part->end(),
                           [](const Document& x, const Document& y) { return x.name < y.name; }));
    }
    CHECK(all.size() == static_cast<std::size_t>(n));  // disjoint and complete
  }
  // Depends on names only: the texts do not matter, and the input order does not either.
  auto docs = make_docs(100);
  const Split a = split_documents(docs);
  for (auto& d : docs) d.text = "changed";
  std::reverse(docs.begin(), docs.end());
  const Split b = split_documents(docs);
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  CHECK(sorted(names(a.valid)) == sorted(names(b.valid)));
  CHECK(sorted(names(a.test)) == sorted(names(b.test)));
  // Similar names are spread: brown-like names "ca01".."cr27" do not rank by prefix.
  std::vector<Document> brown;
  for (char c = 'a'; c <= 'r'; ++c)
    for (int k = 1; k <= 27; ++k)
      brown.push_back({std::string("c") + c + (k < 10 ? "0" : "") + std::to_string(k), "x"});
  const Split spread = split_documents(brown);
  std::set<char> categories;
  for (const auto& d : spread.valid) categories.insert(d.name[1]);
  CHECK(categories.size() >= 8);
  // Fixed across platforms and releases: the hash is specified (FNV-1a 64, SplitMix64 finaliser).
  CHECK(fnv1a64("") == 14695981039346656037ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(hex(0xab, 4) == "00ab");
  CHECK(name_hash("ca01") == 0x0093c106cfdaeee9ull);
}

TEST_CASE("split: too few documents") {
  const auto msg = error_of<coupledqk::io_error>([] { split_documents(make_docs(2)); });
  CHECK(contains(msg, "too few documents"));
  CHECK(contains(msg, "2"));
  CHECK(contains(msg, "at least 3"));
}

// ---- loading -----------------------------------------------------------------------------------

TEST_CASE("load: a folder is one document per file, recursively, sorted, hidden and empty files skipped") {
  TempDir dir;
  const auto docs = make_docs(12);
  for (std::size_t i = 0; i < docs.size(); ++i)
    write(dir.path / (i % 3 == 0 ? "sub/" : "") / docs[i].name, "\n" + docs[i].text + "\n\n");
  write(dir.path / ".hidden.txt", "not a document");
  write(dir.path / ".git" / "config", "not a document");
  write(dir.path / "empty.txt", "  \n\n");
  write(dir.path / "windows.txt", "\xEF\xBB\xBFline one\r\nline two\rline three\r\n");
  const auto loaded = load_corpus(dir.str(), dir.str());
  REQUIRE(loaded.size() == docs.size() + 1);
  CHECK(loaded[0].name == "doc_001.txt");
  CHECK(std::is_sorted(loaded.begin(), loaded.end(), [](auto& a, auto& b) { return a.name < b.name; }));
  CHECK(loaded.back().name == "windows.txt");
  CHECK(loaded.back().text == "line one\nline two\nline three");  // BOM dropped, CR LF and CR to LF
  for (const auto& d : loaded)
    if (d.name == "sub/doc_000.txt") CHECK(d.text == docs[0].text);  // trimmed, otherwise unchanged
  CHECK(corpus_key(dir.str()) == corpus_key(dir.str() + "/"));
  CHECK(corpus_key(dir.str()).rfind(dir.path.filename().string() + "-", 0) == 0);
  CHECK(corpus_key("sotu") == "sotu");
}

TEST_CASE("load: a single file is split at double blank lines, else paragraphs are grouped") {
  TempDir dir;
  TextGen gen(3);
  std::string sections;
  for (int i = 0; i < 5; ++i) sections += gen.document(2) + "\n\n \n\n";
  write(dir.path / "sections.txt", sections);
  const auto a = load_corpus((dir.path / "sections.txt").string(), dir.str());
  REQUIRE(a.size() == 5);
  CHECK(a[0].name == "sections.txt#0001");
  CHECK(a[4].name == "sections.txt#0005");
  CHECK(contains(a[0].text, "\n\n"));  // paragraphs inside a section are kept

  std::string paragraphs;
  for (int i = 0; i < 45; ++i) paragraphs += gen.paragraph() + "\n\n";
  write(dir.path / "paragraphs.txt", paragraphs);
  const auto b = load_corpus((dir.path / "paragraphs.txt").string(), dir.str());
  CHECK(b.size() == 20);  // at least 20 documents when there are enough paragraphs
  std::size_t joined = 0;
  for (const auto& d : b) joined += std::count(d.text.begin(), d.text.end(), '\n') / 2 + 1;
  CHECK(joined == 45);  // every paragraph in exactly one document, in order
  CHECK(b[0].text.rfind(paragraphs.substr(0, 40), 0) == 0);

  write(dir.path / "few.txt", "One paragraph.\nStill the first.\n\nA second one.\n");
  for (int i = 3; i <= 5; ++i) {
    std::string p;
    for (int k = 0; k < i; ++k) p += "Paragraph " + std::to_string(k) + ".\n\n";
    write(dir.path / "p.txt", p);
    CHECK(load_corpus((dir.path / "p.txt").string(), dir.str()).size() == static_cast<std::size_t>(i));
  }
  const auto msg =
      error_of<coupledqk::io_error>([&] { load_corpus((dir.path / "few.txt").string(), dir.str()); });
  CHECK(contains(msg, "too few documents"));
  CHECK(contains(msg, "2 paragraph(s)"));
  CHECK(contains(msg, "few.txt"));
}

TEST_CASE("load: bad inputs raise io_error saying what is wrong") {
  TempDir dir;
  auto load_error = [&](const std::string& spec) {
    return error_of<coupledqk::io_error>([&] { load_corpus(spec, dir.str()); });
  };
  {
    const auto msg = load_error((dir.path / "missing.txt").string());
    CHECK(contains(msg, "missing.txt"));
    CHECK(contains(msg, "not a known corpus (sotu, brown, moby-dick) nor an existing file or folder"));
    CHECK(contains(load_error("shakespeare"), "'shakespeare' is not a known corpus"));
    CHECK(contains(load_error(""), "not a known corpus"));
  }
  write(dir.path / "empty.txt", "");
  CHECK(contains(load_error((dir.path / "empty.txt").string()), "is empty"));
  write(dir.path / "blank.txt", " \n\t\n\n");
  CHECK(contains(load_error((dir.path / "blank.txt").string()), "is empty"));
  {
    std::string bytes;
    TextGen gen(11);
    for (int i = 0; i < 4096; ++i) bytes += static_cast<char>(gen.next() & 0xFF);
    bytes[100] = '\0';
    write(dir.path / "random.bin", bytes);
    const auto msg = load_error((dir.path / "random.bin").string());
    CHECK(contains(msg, "random.bin"));
    CHECK(contains(msg, "binary"));
    CHECK(contains(msg, "NUL"));
  }
  {
    std::string latin1;  // Latin-1, not UTF-8, no NUL: many bytes invalid
    for (int i = 0; i < 50; ++i)
      latin1 +=
          "Caf\xE9 na\xEFve \xFC"
          "ber.\n\n";
    write(dir.path / "latin1.txt", latin1);
    const auto msg = load_error((dir.path / "latin1.txt").string());
    CHECK(contains(msg, "not UTF-8"));
    CHECK(contains(msg, "1%"));
  }
  {
    fs::create_directories(dir.path / "empty_folder");
    const auto msg = load_error((dir.path / "empty_folder").string());
    CHECK(contains(msg, "holds no text"));
    CHECK(contains(msg, "0 non-hidden regular files"));
    write(dir.path / "blank_folder" / "a.txt", "");
    write(dir.path / "blank_folder" / "b.txt", "\n\n");
    CHECK(contains(load_error((dir.path / "blank_folder").string()),
                   "2 non-hidden regular files, none with text"));
  }
  {
    write(dir.path / "mixed" / "a.txt", "Some text.");
    write(dir.path / "mixed" / "image.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
    const auto msg = load_error((dir.path / "mixed").string());
    CHECK(contains(msg, "image.png"));
    CHECK(contains(msg, "binary"));
  }
  // A few stray bytes are replaced, not fatal.
  const std::string fixed = check_text(std::string(200, 'a') + "\xFF" + std::string(200, 'b'), "stray");
  CHECK(fixed == std::string(200, 'a') + "\xEF\xBF\xBD" + std::string(200, 'b'));
}

TEST_CASE("brown: tags stripped, words rejoined into readable text") {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at "
      "investigation/nn "
      "of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' "
      "that/cs "
      "any/dti irregularities/nns took/vbd place/nn ./.\n"
      "It/pps didn't/dod* cost/vb $1,000/nns ,/, nor/cc 1-1/2/cd hours/nns (/( or/cc more/ap )/) ;/. ;/. "
      "they/ppss were/bed '/' pro/jj '/' letters/nns --/-- all/abn of/in them/ppo !/.\n"
      "\n\n\tMr./np Pye/np Jr./np ./. Why/wrb ?/.\n";
  CHECK(
      brown_to_text(tagged) ==
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
      "produced "
      "\"no evidence\" that any irregularities took place. It didn't cost $1,000, nor 1-1/2 hours (or more); "
      "they were 'pro' letters -- all of them!\n\n"
      "Mr. Pye Jr. Why?");
}

TEST_CASE("stats: documents, characters, words; a printable table") {
  std::vector<Document> docs{{"a", "Zürich is  big.\nYes"}, {"b", "one two three"}, {"c", "x"}};
  const TextStats s = text_stats(docs);
  CHECK(s.documents == 3);
  CHECK(s.words == 4 + 3 + 1);
  CHECK(s.characters == 19 + 13 + 1);
  CHECK(s.bytes == 20 + 13 + 1);
  SplitStats split{s, s, s};
  split.train.tokens = 1234567;
  const std::string table = format_stats(split);
  CHECK(contains(table, "train"));
  CHECK(contains(table, "total"));
  CHECK(contains(table, "1,234,567"));
  CHECK(contains(table, "tokens"));
}

// ---- tokenizer ---------------------------------------------------------------------------------

TEST_CASE("tokenizer: deterministic, cached, lossless") {
  const auto split = split_documents(make_docs(24));
  TempDir c1, c2;
  const Tokenizer a = Tokenizer::train_or_load(split.train, "unit", 600, c1.str());
  const Tokenizer b = Tokenizer::train_or_load(split.train, "unit", 600, c2.str());
  CHECK(a.trained());
  CHECK(a.vocab_size() == 600);
  CHECK(a.eos_id() == 2);
  CHECK(a.pad_id() == 3);
  CHECK(a.piece(a.eos_id()) == "</s>");
  CHECK(fs::path(a.model_path()).parent_path() == c1.path / "tokenizers");
  CHECK(fs::path(a.model_path()).filename().string().rfind("unit-v600-", 0) == 0);
  CHECK(fs::path(a.model_path()).filename() == fs::path(b.model_path()).filename());
  CHECK(read(a.model_path()) == read(b.model_path()));  // identical model bytes
  CHECK(a.model_hash() == b.model_hash());

  const Tokenizer cached = Tokenizer::train_or_load(split.train, "unit", 600, c1.str());
  CHECK_FALSE(cached.trained());
  CHECK(cached.model_path() == a.model_path());

  const std::string unseen =
      "  Leading spaces, two  spaces,\ttabs,\nnew lines\n\nand a blank line; Ünïcödé 東京 🐳 ~`|\\ 12345.67 ";
  for (const std::string& text : {split.valid[0].text, split.test[0].text, unseen, std::string()}) {
    const auto ids = a.encode(text);
    CHECK(ids == b.encode(text));
    CHECK(ids == cached.encode(text));
    CHECK(a.decode(ids) == text);  // lossless
  }
  CHECK(a.encode(split.train[0].text).size() < split.train[0].text.size() / 2);  // it does compress
  // Line by line: '\n' is its byte piece, and the next line starts with a word-initial piece.
  const auto x = a.encode("the nation"), y = a.encode("The people"), xy = a.encode("the nation\nThe people");
  REQUIRE(xy.size() == x.size() + 1 + y.size());
  CHECK(a.piece(xy[x.size()]) == "<0x0A>");
  CHECK(a.piece(xy[x.size() + 1]).rfind("\xE2\x96\x81", 0) == 0);  // "▁"
  CHECK(std::equal(y.begin(), y.end(), xy.begin() + static_cast<long>(x.size()) + 1));
  CHECK(contains(error_of<coupledqk::invalid_argument>([&] { a.decode({5, 600}); }), "600"));

  // Another vocabulary size or other training text: another model file.
  auto other = split.train;
  other[0].text += " More.";
  CHECK(Tokenizer::train_or_load(other, "unit", 600, c1.str()).model_path() != a.model_path());
}

TEST_CASE("tokenizer: vocabulary size out of range or too large for the text") {
  const auto split = split_documents(make_docs(6));
  TempDir cache;
  const auto large = error_of<coupledqk::invalid_argument>(
      [&] { Tokenizer::train_or_load(split.train, "unit", 50000, cache.str()); });
  CHECK(contains(large, "vocab_size 50000 is too large"));
  CHECK(contains(large, "at most"));
  const auto small = error_of<coupledqk::invalid_argument>(
      [&] { Tokenizer::train_or_load(split.train, "unit", 100, cache.str()); });
  CHECK(contains(small, "vocab_size 100 is out of range"));
  CHECK(contains(small, "384"));
  const auto none = error_of<coupledqk::io_error>([&] {
    Tokenizer::train_or_load({{"a", "  "}}, "unit", 500, cache.str());
  });
  CHECK(contains(none, "no training text"));
  CHECK((!fs::exists(cache.path / "tokenizers") ||
         fs::is_empty(cache.path / "tokenizers")));  // nothing written
}

TEST_CASE("token streams: documents joined by eos, cached, corrupt cache rebuilt") {
  const auto split = split_documents(make_docs(24));
  TempDir cache;
  const Tokenizer tok = Tokenizer::train_or_load(split.train, "unit", 500, cache.str());
  const TokenStreams s = tokenize_split(split, tok, cache.str(), "unit");
  std::vector<std::int32_t> expect;
  for (const auto& d : split.valid) {
    const auto ids = tok.encode(d.text);
    expect.insert(expect.end(), ids.begin(), ids.end());
    expect.push_back(tok.eos_id());
  }
  CHECK(s.valid == expect);
  CHECK(std::count(s.train.begin(), s.train.end(), tok.eos_id()) == static_cast<long>(split.train.size()));
  CHECK(s.test.back() == tok.eos_id());
  CHECK(encode_documents(split.train, tok) == s.train);

  const SplitStats stats = split_stats(split, s);
  CHECK(stats.train.tokens == s.train.size());
  CHECK(stats.valid.documents == split.valid.size());

  // Cached files: one folder per corpus key, tokenizer and split content.
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(cache.path / "tokens"))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 3);
  CHECK(files[0].filename() == "test.bin");
  CHECK(files[1].filename() == "train.bin");
  CHECK(fs::file_size(files[1]) == 32 + 4 * s.train.size());
  CHECK(read(files[1]).substr(0, 8) == "CQKTOKEN");

  CHECK(tokenize_split(split, tok, cache.str(), "unit").train == s.train);  // from the cache

  // Corrupt each file in a different way: every one is detected and rebuilt, nothing crashes.
  std::string bytes = read(files[1]);
  bytes[40] = static_cast<char>(bytes[40] ^ 0x5A);  // a payload bit flip: checksum
  write(files[1], bytes);
  write(files[0], read(files[0]).substr(0, 50));  // truncated
  write(files[2], "garbage");                     // shorter than the header
  const TokenStreams again = tokenize_split(split, tok, cache.str(), "unit");
  CHECK(again.train == s.train);
  CHECK(again.valid == s.valid);
  CHECK(again.test == s.test);
  CHECK(read(files[1]).size() == 32 + 4 * s.train.size());
  CHECK(read(files[2]).size() == 32 + 4 * s.valid.size());
}

// ---- a real corpus, when it is already in the cache ----------------------------------------------

TEST_CASE("real corpora from the cache (skipped when not fetched)") {
  const std::string cache = default_cache_dir();
  struct Expect {
    const char* name;
    std::size_t documents;
  };
  for (const Expect& e : {Expect{"sotu", 233}, Expect{"brown", 500}, Expect{"moby-dick", 138}}) {
    if (!fs::exists(fs::path(cache) / "data" / e.name / ".verified")) {
      MESSAGE("skipped corpus '", e.name, "': not in the cache ", cache, " (run scripts/fetch-data ", e.name,
              ")");
      continue;
    }
    CAPTURE(e.name);
    const auto docs = load_corpus(e.name, cache);
    CHECK(docs.size() == e.documents);
    const Split split = split_documents(docs);
    CHECK(split.valid.size() == (e.documents * 5 + 50) / 100);
    CHECK(split.train.size() + split.valid.size() + split.test.size() == e.documents);
    const TextStats s = text_stats(docs);
    CHECK(s.words > 200000);
    for (const auto& d : docs) CHECK_FALSE(d.text.empty());
    if (std::string(e.name) == "brown") {
      CHECK(docs[0].text.rfind("The Fulton County Grand Jury said Friday", 0) == 0);
      CHECK_FALSE(contains(docs[0].text, "/at"));
    }
    if (std::string(e.name) == "moby-dick") {
      CHECK(docs[2].name == "chapter_1");
      CHECK(docs[2].text.rfind("CHAPTER 1. Loomings.\n\nCall me Ishmael.", 0) == 0);
      CHECK(docs.back().name == "epilogue");
    }
  }
}

// ---- measurements (not run by default) ---------------------------------------------------------
// test_data --no-skip -tc='measure*' : for each corpus in the cache, its statistics, SentencePiece
// BPE training time at vocab 4096 and 8192 (in a fresh temporary cache) and token counts per split.
TEST_CASE("measure: corpora, tokenizer training time, tokens" * doctest::skip()) {
  const std::string cache = default_cache_dir();
  for (const std::string& name : known_corpora()) {
    if (!fs::exists(fs::path(cache) / "data" / name / ".verified")) {
      MESSAGE("skipped corpus '", name, "': not in the cache ", cache);
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&t0] {
      const auto t1 = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
      return s;
    };
    const Split split = split_documents(load_corpus(name, cache));
    std::printf("\n== %s: loaded and split in %.2f s\n%s", name.c_str(), seconds(),
                format_stats(split_stats(split)).c_str());
    for (int vocab : {4096, 8192}) {
      TempDir tmp;
      seconds();
      const Tokenizer tok = Tokenizer::train_or_load(split.train, name, vocab, tmp.str());
      const double train = seconds();
      const TokenStreams streams = tokenize_split(split, tok, tmp.str(), name);
      const double encode = seconds();
      const SplitStats stats = split_stats(split, streams);
      std::printf(
          "-- vocab %d: SentencePiece BPE training %.2f s, encoding all splits %.2f s, "
          "%.3f tokens per word (train)\n%s",
          vocab, train, encode,
          static_cast<double>(stats.train.tokens) / static_cast<double>(stats.train.words),
          format_stats(stats).c_str());
      std::fflush(stdout);
      CHECK(tok.decode(tok.encode(split.valid[0].text)) == split.valid[0].text);
    }
  }
}
