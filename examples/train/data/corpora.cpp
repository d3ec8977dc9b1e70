// The training example's data pipeline: see data.hpp and docs/data.md.
#include "data/corpora.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <new>
#include <nlohmann/json.hpp>

#include <coupledqk/io/json_read.hpp>
#include <numeric>
#include <sstream>
#include <system_error>
#include <utility>

#ifndef COUPLEDQK_SOURCE_DIR
#error "COUPLEDQK_SOURCE_DIR must name the source tree (set by examples/train/CMakeLists.txt)"
#endif

namespace fs = std::filesystem;

namespace coupledqk::train {

using detail::concat;

namespace {

constexpr const char* kAccepted = "sotu, brown, moby-dick";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool blank(std::string_view line) { return trim(line).empty(); }

/// Lines of `text` without their '\n' (a final empty line after a trailing '\n' is not reported).
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(concat("cannot open '", path.string(), "' for reading"));
  std::string bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::bad_alloc&) {
    std::error_code ec;
    throw io_error(concat("'", path.string(), "' (", fs::file_size(path, ec), " bytes) does not fit in memory"));
  }
  if (in.bad()) throw io_error(concat("error while reading '", path.string(), "'"));
  return bytes;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string with_commas(std::size_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// ---- named corpora -----------------------------------------------------------------------------

/// The sha256 pinned for `name` in <source>/data/corpora.tsv, or "" when the table is unreadable.
std::string pinned_sha256(const std::string& name) {
  std::ifstream in(fs::path(source_dir()) / "data" / "corpora.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string n, pkg, sha;
    if (std::getline(fields, n, '\t') && n == name && std::getline(fields, pkg, '\t') &&
        std::getline(fields, sha, '\t'))
      return sha;
  }
  return "";
}

bool verified(const fs::path& dir, const std::string& name) {
  std::ifstream in(dir / ".verified");
  std::string marker;
  if (!(in >> marker) || marker.empty()) return false;
  const std::string want = pinned_sha256(name);
  return want.empty() || marker == want;
}

void fetch(const std::string& name, const std::string& cache_dir) {
  const fs::path script = fs::path(source_dir()) / "scripts" / "fetch-data";
  if (!fs::exists(script))
    throw io_error(concat("corpus '", name, "' is not in the cache ", cache_dir, "/data/", name,
                          " and the fetch script ", script.string(),
                          " does not exist; fetch it from a source tree with scripts/fetch-data --cache ",
                          cache_dir, " ", name, ", or pass a text file or folder instead"));
  std::cerr << "data: corpus '" << name << "' is not in " << cache_dir << "/data/" << name
            << "; fetching it with scripts/fetch-data\n"
            << std::flush;
  const std::string command =
      concat(shell_quote(script.string()), " --cache ", shell_quote(cache_dir), " ", shell_quote(name));
  const int rc = std::system(command.c_str());
  if (rc != 0)
    throw io_error(concat("could not fetch corpus '", name, "': '", command, "' failed (status ", rc,
                          "; its messages are above)"));
}

std::vector<fs::path> sorted_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Document> load_sotu(const fs::path& root) {
  std::vector<Document> docs;
  for (const auto& path : sorted_files(root / "data"))
    if (path.extension() == ".txt")
      docs.push_back({path.stem().string(), std::string(trim(check_text(read_file(path), path.string())))});
  return docs;
}

bool is_brown_file(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

std::vector<Document> load_brown(const fs::path& root) {
  std::vector<Document> docs;
  for (const auto& path : sorted_files(root))
    if (is_brown_file(path.filename().string()))
      docs.push_back({path.filename().string(), brown_to_text(check_text(read_file(path), path.string()))});
  return docs;
}

std::vector<Document> load_moby_dick(const fs::path& root) {
  auto chapter = [&](const std::string& stem) -> nlohmann::json {
    const fs::path path = root / "data" / (stem + ".json");
    // the project's bounded JSON reader (io/json_read.hpp): a chapter is a small flat object
    return io::read_json(check_text(read_file(path), path.string()), "'" + path.string() + "'",
                         io::json_limits{64u << 20, 8});
  };
  auto field = [](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  std::vector<Document> docs;
  // Front matter, the chapters in numerical order, the epilogue (each text starts with its heading).
  for (const char* stem : {"etymology", "extracts"})
    docs.push_back({stem, std::string(trim(field(chapter(stem), "text")))});
  int n = 0;
  while (fs::exists(root / "data" / concat("chapter_", n + 1, ".json"))) {
    ++n;
    const auto j = chapter(concat("chapter_", n));
    docs.push_back({concat("chapter_", n),
                    concat("CHAPTER ", n, ". ", field(j, "title"), "\n\n", trim(field(j, "text")))});
  }
  if (n == 0)
    throw io_error(concat("no chapter_1.json in ", (root / "data").string(), "; is the cache complete?"));
  docs.push_back({"epilogue", std::string(trim(field(chapter("epilogue"), "text")))});
  return docs;
}

std::vector<Document> load_named(const std::string& name, const std::string& cache_dir) {
  const fs::path root = fs::path(cache_dir) / "data" / name;
  if (!verified(root, name)) {
    fetch(name, cache_dir);
    if (!verified(root, name))
      throw io_error(
          concat("corpus '", name, "' is still not verified in ", root.string(),
                 " after scripts/fetch-data succeeded (no .verified marker matching data/corpora.tsv)"));
  }
  std::vector<Document> docs = name == "sotu"    ? load_sotu(root)
                               : name == "brown" ? load_brown(root)
                                                 : load_moby_dick(root);
  docs.erase(std::remove_if(docs.begin(), docs.end(), [](const Document& d) { return d.text.empty(); }),
             docs.end());
  if (docs.size() < 3)
    throw io_error(concat("corpus '", name, "' in ", root.string(), " holds ", docs.size(),
                          " documents with text; expected hundreds. Delete that folder and fetch it again"));
  return docs;
}

// ---- user files and folders --------------------------------------------------------------------

bool hidden(const fs::path& relative) {
  for (const auto& part : relative) {
    const std::string s = part.string();
    if (!s.empty() && s[0] == '.' && s != "." && s != "..") return true;
  }
  return false;
}

std::vector<Document> load_folder(const fs::path& dir) {
  std::vector<std::pair<std::string, fs::path>> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  if (ec) throw io_error(concat("cannot list folder '", dir.string(), "': ", ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) throw io_error(concat("cannot list folder '", dir.string(), "': ", ec.message()));
    const fs::path rel = it->path().lexically_relative(dir);
    if (hidden(rel)) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.emplace_back(rel.generic_string(), it->path());
  }
  std::sort(files.begin(), files.end());
  std::vector<Document> docs;
  for (const auto& [name, path] : files) {
    std::string text(trim(check_text(read_file(path), path.string())));
    if (!text.empty()) docs.push_back({name, std::move(text)});
  }
  if (docs.empty())
    throw io_error(
        concat("folder '", dir.string(), "' holds no text: ", files.size(),
               " non-hidden regular files, none with text; expected a folder of UTF-8 text files, one "
               "document per file"));
  return docs;
}

std::vector<Document> load_file(const fs::path& path) {
  std::string text = check_text(read_file(path), path.string());
  if (trim(text).empty())
    throw io_error(concat("file '", path.string(), "' is empty (", text.size(),
                          " bytes, no text); expected UTF-8 text with at least 3 paragraphs"));
  return split_text_file(path.filename().string(), text, path.string());
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------

const std::vector<std::string>& known_corpora() {
  static const std::vector<std::string> names{"sotu", "brown", "moby-dick"};
  return names;
}

std::string source_dir() { return COUPLEDQK_SOURCE_DIR; }

std::string default_cache_dir() {
  const char* env = std::getenv("COUPLEDQK_CACHE");
  if (env != nullptr && *env != '\0') return env;
  return (fs::path(source_dir()) / ".cache").string();
}

std::vector<Document> load_corpus(const std::string& spec, const std::string& cache_dir) {
  const auto& known = known_corpora();
  if (std::find(known.begin(), known.end(), spec) != known.end()) return load_named(spec, cache_dir);
  const fs::path path(spec);
  std::error_code ec;
  const auto status = spec.empty() ? fs::file_status(fs::file_type::not_found) : fs::status(path, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
      throw io_error(concat("cannot access '", spec, "': ", ec.message()));
    throw io_error(
        concat("'", spec, "' is not a known corpus (", kAccepted, ") nor an existing file or folder"));
  }
  if (fs::is_directory(status)) return load_folder(path);
  if (fs::is_regular_file(status)) return load_file(path);
  throw io_error(concat("'", spec, "' is neither a regular file nor a folder; expected a known corpus (",
                        kAccepted, "), a UTF-8 text file or a folder of them"));
}

std::string corpus_key(const std::string& spec) {
  const auto& known = known_corpora();
  if (std::find(known.begin(), known.end(), spec) != known.end()) return spec;
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(spec), ec);
  if (ec) abs = fs::absolute(spec).lexically_normal();
  std::string base = abs.filename().string();
  if (base.empty()) base = abs.parent_path().filename().string();
  std::string safe;
  for (char c : base) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (safe.size() < 40) safe += ok ? c : '_';
  }
  if (safe.empty()) safe = "corpus";
  return concat(safe, "-", hex(fnv1a64(abs.string()), 8));
}

std::vector<Document> split_text_file(const std::string& name, std::string_view text,
                                      const std::string& source) {
  // Sections (at least two blank lines between) and paragraphs (at least one), as line ranges.
  struct Block {
    std::vector<std::string_view> lines;
  };
  std::vector<Block> sections(1), paragraphs(1);
  int blank_run = 0;
  for (std::string_view line : lines_of(text)) {
    if (blank(line)) {
      ++blank_run;
      continue;
    }
    if (blank_run >= 1 && !paragraphs.back().lines.empty()) paragraphs.emplace_back();
    if (blank_run >= 2 && !sections.back().lines.empty()) sections.emplace_back();
    if (blank_run == 1 && !sections.back().lines.empty())
      sections.back().lines.emplace_back();  // keep one blank line
    blank_run = 0;
    sections.back().lines.push_back(line);
    paragraphs.back().lines.push_back(line);
  }
  auto join = [](const std::vector<std::string_view>& lines) {
    std::string out;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += '\n';
      out += lines[i];
    }
    return std::string(trim(out));
  };
  auto doc_name = [&](std::size_t i) {
    std::string number = std::to_string(i + 1);
    if (number.size() < 4) number.insert(0, 4 - number.size(), '0');
    return concat(name, "#", number);
  };
  if (paragraphs.back().lines.empty()) paragraphs.pop_back();
  if (sections.back().lines.empty()) sections.pop_back();

  std::vector<Document> docs;
  if (sections.size() >= 3) {
    for (std::size_t i = 0; i < sections.size(); ++i) docs.push_back({doc_name(i), join(sections[i].lines)});
    return docs;
  }
  if (paragraphs.size() < 3)
    throw io_error(concat("too few documents in file '", source.empty() ? name : source,
                          "': ", sections.size(), " section(s) and ", paragraphs.size(),
                          " paragraph(s); need at least 3 documents to split into train/valid/test. Separate "
                          "documents by two blank lines or paragraphs by one, or pass a folder of files"));
  std::vector<std::string> texts;
  std::size_t total = 0;
  for (const auto& p : paragraphs) {
    texts.push_back(join(p.lines));
    total += texts.back().size();
  }
  const std::size_t count = std::min(texts.size(), std::max<std::size_t>(20, total / 16384));
  // Close a document once the running size reaches its share (k+1) * total / count, keeping at
  // least one paragraph for each document still to come.
  std::string current;
  std::size_t done = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    if (!current.empty()) current += "\n\n";
    current += texts[i];
    done += texts[i].size();
    const std::size_t left_docs = count - docs.size() - 1, left_paragraphs = texts.size() - i - 1;
    const bool share_reached =
        static_cast<double>(done) >= static_cast<double>(docs.size() + 1) * total / count;
    if (left_docs == 0 ? left_paragraphs == 0 : (share_reached || left_paragraphs <= left_docs)) {
      docs.push_back({doc_name(docs.size()), std::move(current)});
      current.clear();
    }
  }
  return docs;
}

std::string check_text(std::string bytes, const std::string& what) {
  std::size_t start = 0;
  if (bytes.size() >= 3 && bytes.compare(0, 3, "\xEF\xBB\xBF") == 0) start = 3;
  const std::size_t nul = bytes.find('\0', start);
  if (nul != std::string::npos)
    throw io_error(concat("'", what, "' looks binary: it contains a NUL byte (at offset ", nul,
                          "); expected UTF-8 text"));
  std::string out;
  out.reserve(bytes.size());
  std::size_t invalid = 0, control = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = start; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      if (c == '\r') {
        out += '\n';
        i += (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
        continue;
      }
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\f') || c == 0x7f) ++control;
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A multi-byte sequence: the lead byte fixes its length and the range of its second byte
    // (excluding overlong forms, surrogates and code points above U+10FFFF).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= n && s[i + 1] >= lo && s[i + 1] <= hi;
    for (int k = 2; ok && k < len; ++k) ok = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (ok) {
      out.append(bytes, i, static_cast<std::size_t>(len));
      i += static_cast<std::size_t>(len);
    } else {
      ++invalid;
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  const std::size_t checked = n - start;
  if ((invalid + control) * 100 > checked) {
    throw io_error(concat("'", what, "' looks binary or is not UTF-8: ", invalid, " of its ", checked,
                          " bytes are not valid UTF-8 and ", control,
                          " are control characters (more than 1% together); expected UTF-8 text"));
  }
  if (invalid > 0)
    std::cerr << "data: warning: '" << what << "': " << invalid
              << " bytes that are not valid UTF-8 replaced by U+FFFD\n";
  return out;
}

std::string brown_to_text(std::string_view tagged) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  auto attaches_left = [&](const std::string& w) {  // no space before
    static const char* const list[] = {",", ".", ";", ":", "!", "?", ")", "]", "}", "%", "''"};
    for (const char* x : list)
      if (w == x) return true;
    const std::string l = lower(w);
    for (const char* x : {"n't", "'s", "'ll", "'re", "'ve", "'d", "'m"})
      if (l == x) return true;
    return false;
  };
  std::string out, paragraph;
  bool glue = true;          // no space before the next word (paragraph start, after `` or ()
  bool single_open = false;  // a standalone ' seen an odd number of times in this paragraph
  auto flush = [&]() {
    if (paragraph.empty()) return;
    if (!out.empty()) out += "\n\n";
    out += paragraph;
    paragraph.clear();
    glue = true;
    single_open = false;
  };
  for (std::string_view line : lines_of(tagged)) {
    if (blank(line)) {
      flush();
      continue;
    }
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && is_space(line[i])) ++i;
      std::size_t j = i;
      while (j < line.size() && !is_space(line[j])) ++j;
      if (j == i) break;
      std::string_view token = line.substr(i, j - i);
      i = j;
      const std::size_t slash = token.rfind('/');
      std::string word(slash == std::string_view::npos || slash == 0 ? token : token.substr(0, slash));
      bool space = !glue, glue_next = false;
      if (word == "``") {
        word = "\"";
        glue_next = true;
      } else if (word == "''") {
        word = "\"";
        space = false;
      } else if (word == "'") {
        if (single_open)
          space = false;
        else
          glue_next = true;
        single_open = !single_open;
      } else if (word == "(" || word == "[" || word == "{") {
        glue_next = true;
      } else if (attaches_left(word)) {
        space = false;
        // "Jr. ." ends a sentence once; the corpus repeats some ";" and "?" at sentence ends.
        if (word.size() == 1 && std::strchr(".;?!", word[0]) != nullptr && !paragraph.empty() &&
            paragraph.back() == word[0])
          continue;
      }
      if (space && !paragraph.empty()) paragraph += ' ';
      paragraph += word;
      glue = glue_next;
    }
  }
  flush();
  return out;
}

Split split_documents(std::vector<Document> docs) {
  if (docs.size() < 3)
    throw io_error(concat("too few documents to split: ", docs.size(),
                          "; need at least 3 (one each for train, valid and test)"));
  for (std::size_t i = 0; i < docs.size(); ++i)
    if (docs[i].name.empty())
      throw io_error(concat("document ", i, " has no name; the split is by document name"));
  std::vector<std::size_t> order(docs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<std::uint64_t> h(docs.size());
  for (std::size_t i = 0; i < docs.size(); ++i) h[i] = name_hash(docs[i].name);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (h[a] != h[b]) return h[a] < h[b];
    if (docs[a].name != docs[b].name) return docs[a].name < docs[b].name;
    return a < b;
  });
  const std::size_t n = docs.size();
  const std::size_t n_valid = std::max<std::size_t>(1, (n * 5 + 50) / 100);
  const std::size_t n_test = std::max<std::size_t>(1, (n * 5 + 50) / 100);
  std::vector<int> where(n, 0);  // 0 train, 1 valid, 2 test
  for (std::size_t r = 0; r < n_valid; ++r) where[order[r]] = 1;
  for (std::size_t r = n_valid; r < n_valid + n_test; ++r) where[order[r]] = 2;
  Split split;
  for (std::size_t i = 0; i < n; ++i) {
    auto& target = where[i] == 0 ? split.train : where[i] == 1 ? split.valid : split.test;
    target.push_back(std::move(docs[i]));
  }
  return split;
}

TextStats text_stats(const std::vector<Document>& docs) {
  TextStats s;
  s.documents = docs.size();
  for (const auto& d : docs) {
    s.bytes += d.text.size();
    bool in_word = false;
    for (char c : d.text) {
      if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++s.characters;
      const bool space = is_space(c);
      if (!space && !in_word) ++s.words;
      in_word = !space;
    }
  }
  return s;
}

SplitStats split_stats(const Split& split) {
  return {text_stats(split.train), text_stats(split.valid), text_stats(split.test)};
}

std::string format_stats(const SplitStats& stats) {
  TextStats total;
  for (const TextStats* s : {&stats.train, &stats.valid, &stats.test}) {
    total.documents += s->documents;
    total.bytes += s->bytes;
    total.characters += s->characters;
    total.words += s->words;
    total.tokens += s->tokens;
  }
  const bool tokens = total.tokens > 0;
  std::ostringstream os;
  auto row = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                 const std::string& e) {
    os << a << std::string(a.size() < 6 ? 6 - a.size() : 0, ' ');
    for (const std::string* x : {&b, &c, &d})
      os << std::string(x->size() < 13 ? 13 - x->size() : 1, ' ') << *x;
    if (tokens) os << std::string(e.size() < 13 ? 13 - e.size() : 1, ' ') << e;
    os << '\n';
  };
  row("split", "documents", "characters", "words", "tokens");
  const std::pair<const char*, const TextStats*> rows[] = {
      {"train", &stats.train}, {"valid", &stats.valid}, {"test", &stats.test}, {"total", &total}};
  for (const auto& [name, s] : rows)
    row(name, with_commas(s->documents), with_commas(s->characters), with_commas(s->words),
        with_commas(s->tokens));
  return os.str();
}

std::uint64_t name_hash(std::string_view name) {
  // FNV-1a alone barely mixes its last bytes into the high bits ("ca01".."cr09" would rank by
  // prefix); the SplitMix64 finaliser spreads every input bit over the whole word.
  std::uint64_t z = fnv1a64(name);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string hex(std::uint64_t value, int digits) {
  static const char* const d = "0123456789abcdef";
  std::string out(static_cast<std::size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = d[value & 0xF];
    value >>= 4;
  }
  return out;
}

}  // namespace coupledqk::train
