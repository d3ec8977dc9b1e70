// The encoder example's reusable pieces (docs/encoder.md): which president wrote a passage of a
// State of the Union address, with a small bidirectional model over padded batches.
//
//   Task task = make_task(load_corpus("sotu", cache), 8, 0);          // classes, split by address
//   Tokenizer tok = Tokenizer::train_or_load(task_documents(task.train), "sotu-encoder", 2000, cache);
//   auto train = make_examples(task.train, tok, 64, 16);              // passages of whole sentences
//   Encoder<float> model(config, seed);                               // embedding -> blocks -> pool -> linear
//   RunResult r = train_and_evaluate(config, options, train, test, task.test.size());
//
// The model (one tape node per op, autodiff/ops.hpp; parameters updated by optim/adamw.hpp):
//
//   x      = wte[tokens]                                     [B*T, D], B passages right-padded to T
//   block l (pre-LayerNorm), l = 0..L-1:
//     x   += attn_l(ln1_l(x))     bidirectional (causal = false), rotary positions, padded Sequences
//     x   += proj_l(gelu(fc_l(ln2_l(x))))                    fc: [D, 4D] + b, proj: [4D, D] + b
//   x      = ln_f(x)
//   p      = mean_pool(x)         the mean of each passage's valid rows        [B, D]
//   logits = p head.w + head.b                                                [B, C]
//   loss   = mean cross-entropy(logits, president)
//
// Padding rows never reach a valid row: attention reads only a sequence's own valid keys and
// outputs 0 on padding rows, LayerNorm, the MLP and the residuals are row-wise, and the pool reads
// valid rows only; so what the padding holds changes no logit (tested) and gets no gradient.
// The attention layers are made by name through the library's compiled table
// (make_attention<S>(variant, steps, config)), so any built-in variant trains here.
//
// Errors: a bad argument raises coupledqk::invalid_argument, a document name that is not
// year_first[_middle]_last_party raises coupledqk::io_error; each message says what was wrong, the
// value seen and what is accepted.
#pragma once

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <coupledqk/autodiff/ops.hpp>
#include <coupledqk/autodiff/tape.hpp>
#include <coupledqk/core/error.hpp>
#include <coupledqk/core/parameters.hpp>
#include <coupledqk/core/random.hpp>
#include <coupledqk/optim/adamw.hpp>
#include <coupledqk/variants.hpp>  // the layers by name from the compiled table (links coupledqk::variants_layers)

#include "data/corpora.hpp"
#include "data/tokenizer.hpp"

namespace coupledqk::encoder {

// ---- presidents from file names -----------------------------------------------------------------

/// What a State of the Union file name says: "2001_george_w_bush_r.txt" -> year 2001, president
/// "george_w_bush", party "r".
struct AddressName {
  int year = 0;
  std::string president;  ///< the name fields joined by '_' (first[_middle]_last)
  std::string party;      ///< the last field (w, r, d, dr, nu, wd, f, n, ...)
};

/// Parses year_first[_middle]_last_party, with or without ".txt", after the last '/' (a folder
/// corpus names its documents by relative path). Every field is non-empty; the year is 4 digits;
/// the name and party fields are lowercase ASCII letters. "1989_george_bush_r" and
/// "2001_george_w_bush_r" are two presidents: the whole name is the key. Throws io_error otherwise.
inline AddressName parse_address_name(const std::string& name) {
  std::string base = name;
  if (const auto slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  if (base.size() > 4 && base.compare(base.size() - 4, 4, ".txt") == 0) base.resize(base.size() - 4);
  std::vector<std::string> fields;
  for (std::size_t start = 0;;) {
    const auto end = base.find('_', start);
    fields.push_back(base.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  auto fail = [&](const std::string& why) {
    throw io_error("encoder: the document name '" + io::detail::quote(name) + "' " + why +
                   "; expected year_first[_middle]_last_party[.txt] (e.g. 1989_george_bush_r.txt, "
                   "2001_george_w_bush_r.txt): the author of each address is read from its file name");
  };
  if (fields.size() < 3) fail("has " + std::to_string(fields.size()) + " '_'-separated field(s), fewer than 3");
  const std::string& year = fields.front();
  if (year.size() != 4 || !std::all_of(year.begin(), year.end(), [](unsigned char c) { return std::isdigit(c); }))
    fail("does not start with a 4-digit year (got '" + io::detail::quote(year) + "')");
  for (std::size_t i = 1; i < fields.size(); ++i)
    if (fields[i].empty() ||
        !std::all_of(fields[i].begin(), fields[i].end(), [](unsigned char c) { return c >= 'a' && c <= 'z'; }))
      fail("has a field that is empty or not lowercase letters ('" + io::detail::quote(fields[i]) + "')");
  AddressName out;
  out.year = std::stoi(year);
  out.party = fields.back();
  for (std::size_t i = 1; i + 1 < fields.size(); ++i) out.president += (i > 1 ? "_" : "") + fields[i];
  return out;
}

/// "george_w_bush" -> "George W. Bush": each field capitalised, a one-letter field an initial.
inline std::string display_name(const std::string& key) {
  std::string out;
  std::size_t start = 0;
  while (start <= key.size()) {
    const auto end = std::min(key.find('_', start), key.size());
    std::string f = key.substr(start, end - start);
    if (!f.empty()) {
      f[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(f[0])));
      if (f.size() == 1) f += '.';
      out += (out.empty() ? "" : " ") + f;
    }
    start = end + 1;
  }
  return out;
}

// ---- the task: classes and the split by address ---------------------------------------------------

/// One address of a class.
struct Address {
  std::string name;  ///< the document's name
  int year = 0;
  int label = 0;     ///< index into Task::classes
  std::string text;
};

struct Task {
  std::vector<std::string> classes;  ///< president keys ("george_w_bush"), ordered by first address
  std::vector<std::string> labels;   ///< display names ("George W. Bush"), same order
  std::vector<int> addresses;        ///< addresses per class in the corpus
  std::vector<Address> train, test;  ///< every address of a class, on exactly one side
  int presidents_in_corpus = 0;      ///< all presidents, the ones left out included
};

/// The classes and the split. Classes: the presidents with at least `min_addresses` addresses
/// (>= 2); with presidents = K > 0, the K of them with the most addresses (ties: the earlier first
/// address). Split, per class, by address, never by passage: the class's addresses in corpus order
/// (by year), index i = 0, 1, ...; i % 4 == 3 goes to test (every fourth address, spread over the
/// term), and a class with fewer than 4 addresses sends its last one; every other address trains.
/// So every class has at least one address on each side. Throws invalid_argument for
/// min_addresses < 2, presidents < 0, or fewer than 2 classes; io_error for a name that does not
/// parse (parse_address_name).
inline Task make_task(const std::vector<train::Document>& docs, int min_addresses, int presidents) {
  require(min_addresses >= 2, "encoder: --min-addresses must be >= 2 (each class needs an address to train on ",
          "and one to test on); got ", min_addresses);
  require(presidents >= 0, "encoder: --presidents must be >= 0 (0: every president with at least --min-addresses ",
          "addresses); got ", presidents);
  struct Group {
    std::vector<std::size_t> docs;
    int first_year = 0;
  };
  std::map<std::string, Group> groups;
  std::vector<AddressName> names;
  names.reserve(docs.size());
  for (std::size_t i = 0; i < docs.size(); ++i) {
    names.push_back(parse_address_name(docs[i].name));
    Group& g = groups[names.back().president];
    if (g.docs.empty() || names.back().year < g.first_year) g.first_year = names.back().year;
    g.docs.push_back(i);
  }
  std::vector<std::string> eligible;
  for (const auto& [key, g] : groups)
    if (static_cast<int>(g.docs.size()) >= min_addresses) eligible.push_back(key);
  std::sort(eligible.begin(), eligible.end(), [&](const std::string& a, const std::string& b) {
    const Group &ga = groups[a], &gb = groups[b];
    if (ga.docs.size() != gb.docs.size()) return ga.docs.size() > gb.docs.size();
    if (ga.first_year != gb.first_year) return ga.first_year < gb.first_year;
    return a < b;
  });
  if (presidents > 0 && static_cast<std::size_t>(presidents) < eligible.size()) eligible.resize(static_cast<std::size_t>(presidents));
  if (eligible.size() < 2) {
    std::string seen;
    for (const auto& [key, g] : groups)
      seen += (seen.empty() ? "" : ", ") + key + " (" + std::to_string(g.docs.size()) + ")";
    throw invalid_argument("encoder: the corpus (" + std::to_string(docs.size()) + " addresses) has " +
                           std::to_string(eligible.size()) + " president(s) with at least " +
                           std::to_string(min_addresses) + " addresses; expected at least 2 classes. Presidents " +
                           "seen (addresses): " + (seen.empty() ? std::string("none") : seen.substr(0, 400)) +
                           ". Lower --min-addresses or use a corpus with more presidents");
  }
  std::sort(eligible.begin(), eligible.end(), [&](const std::string& a, const std::string& b) {
    const Group &ga = groups[a], &gb = groups[b];
    return ga.first_year != gb.first_year ? ga.first_year < gb.first_year : a < b;
  });
  Task task;
  task.presidents_in_corpus = static_cast<int>(groups.size());
  for (std::size_t c = 0; c < eligible.size(); ++c) {
    const Group& g = groups[eligible[c]];
    task.classes.push_back(eligible[c]);
    task.labels.push_back(display_name(eligible[c]));
    task.addresses.push_back(static_cast<int>(g.docs.size()));
    const std::size_t n = g.docs.size();
    for (std::size_t i = 0; i < n; ++i) {
      const train::Document& d = docs[g.docs[i]];
      Address a{d.name, names[g.docs[i]].year, static_cast<int>(c), d.text};
      const bool test = n < 4 ? i + 1 == n : i % 4 == 3;
      (test ? task.test : task.train).push_back(std::move(a));
    }
  }
  return task;
}

/// The addresses as Documents (to train the tokenizer on the training side only).
inline std::vector<train::Document> task_documents(const std::vector<Address>& addresses) {
  std::vector<train::Document> out;
  out.reserve(addresses.size());
  for (const Address& a : addresses) out.push_back({a.name, a.text});
  return out;
}

// ---- passages -------------------------------------------------------------------------------------

/// The blocks of `text` separated by blank lines (whitespace-only lines count as blank), trimmed,
/// empty ones dropped.
inline std::vector<std::string_view> paragraphs_of(std::string_view text) {
  std::vector<std::string_view> out;
  auto flush = [&](std::size_t b, std::size_t e) {
    while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
    if (e > b) out.push_back(text.substr(b, e - b));
  };
  std::size_t block = 0, line = 0;
  while (line < text.size()) {
    std::size_t end = text.find('\n', line);
    if (end == std::string_view::npos) end = text.size();
    const bool blank = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line),
                                   text.begin() + static_cast<std::ptrdiff_t>(end),
                                   [](unsigned char c) { return std::isspace(c); });
    if (blank) {
      flush(block, line);
      block = end + 1;
    }
    line = end + 1;
  }
  if (block < text.size()) flush(block, text.size());
  return out;
}

/// The sentences of a paragraph: cut after '.', '!' or '?' (and any closing quotes or brackets)
/// followed by whitespace; the whitespace is dropped. An abbreviation ("Mr.") cuts too, which only
/// moves where a passage may end.
inline std::vector<std::string_view> sentences_of(std::string_view p) {
  std::vector<std::string_view> out;
  std::size_t start = 0, i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '.' || c == '!' || c == '?') {
      std::size_t j = i + 1;
      while (j < p.size() && (p[j] == '"' || p[j] == '\'' || p[j] == ')' || p[j] == ']')) ++j;
      if (j < p.size() && std::isspace(static_cast<unsigned char>(p[j]))) {
        out.push_back(p.substr(start, j - start));
        while (j < p.size() && std::isspace(static_cast<unsigned char>(p[j]))) ++j;
        start = j;
      }
      i = j;
    } else {
      ++i;
    }
  }
  if (start < p.size()) out.push_back(p.substr(start));
  return out;
}

/// One passage to classify.
struct Example {
  std::vector<std::int32_t> ids;
  int label = 0;
  int address = 0;  ///< index of its address in the list make_examples was given
};

/// The passages of addresses: each paragraph (paragraphs_of; the corpus as fetched has none inside
/// an address, so an address is one paragraph) is cut into runs of whole sentences of at most `seq`
/// tokens (greedily: a sentence that does not fit starts the next passage; one longer than `seq` is
/// cut into pieces of `seq` tokens); passages never cross a paragraph. Passages shorter than
/// `min_tokens` are dropped. `encode` maps text to token ids (e.g. a Tokenizer's encode).
template <class Encode>
std::vector<Example> make_examples(const std::vector<Address>& addresses, const Encode& encode, Index seq,
                                   Index min_tokens) {
  require(seq >= 1 && min_tokens >= 1 && min_tokens <= seq, "encoder: passages need 1 <= --min-tokens <= --seq; got ",
          "--min-tokens ", min_tokens, ", --seq ", seq);
  std::vector<Example> out;
  const auto limit = static_cast<std::size_t>(seq);
  for (std::size_t a = 0; a < addresses.size(); ++a) {
    std::vector<std::int32_t> buf;
    auto flush = [&]() {
      if (static_cast<Index>(buf.size()) >= min_tokens)
        out.push_back(Example{buf, addresses[a].label, static_cast<int>(a)});
      buf.clear();
    };
    for (std::string_view para : paragraphs_of(addresses[a].text)) {
      for (std::string_view sentence : sentences_of(para)) {
        const std::vector<std::int32_t> ids = encode(sentence);
        if (!buf.empty() && buf.size() + ids.size() > limit) flush();
        std::size_t i = 0;
        while (ids.size() - i > limit) {  // a sentence longer than a passage: pieces of seq tokens
          buf.assign(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(i + limit));
          flush();
          i += limit;
        }
        buf.insert(buf.end(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids.end());
      }
      flush();
    }
  }
  return out;
}

/// Examples per class.
inline std::vector<Index> class_counts(const std::vector<Example>& ex, std::size_t classes) {
  std::vector<Index> n(classes, 0);
  for (const Example& e : ex) ++n.at(static_cast<std::size_t>(e.label));
  return n;
}

// ---- batches --------------------------------------------------------------------------------------

/// B passages right-padded to T = the longest of them: tokens [B*T] (padding: `pad`), the padded
/// Sequences, and the labels [B].
struct Batch {
  std::vector<std::int32_t> tokens;
  Sequences seqs;
  std::vector<std::int32_t> labels;
  Index size() const { return static_cast<Index>(labels.size()); }
};

inline Batch make_batch(const std::vector<Example>& examples, const std::vector<std::size_t>& which, std::int32_t pad) {
  require(!which.empty(), "encoder: a batch needs at least one passage");
  std::size_t T = 0;
  for (std::size_t i : which) T = std::max(T, examples.at(i).ids.size());
  require(T > 0, "encoder: a batch of empty passages");
  Batch b;
  b.tokens.assign(which.size() * T, pad);
  std::vector<Index> lengths;
  for (std::size_t k = 0; k < which.size(); ++k) {
    const Example& e = examples[which[k]];
    std::copy(e.ids.begin(), e.ids.end(), b.tokens.begin() + static_cast<std::ptrdiff_t>(k * T));
    lengths.push_back(static_cast<Index>(e.ids.size()));
    b.labels.push_back(e.label);
  }
  b.seqs = Sequences::padded(static_cast<Index>(T), std::move(lengths));
  return b;
}

// ---- two tape ops ---------------------------------------------------------------------------------

/// Masked mean pool. x: [seqs.rows(), D] (padded or packed rows); y: [B, D], y_b = the mean of
/// sequence b's valid rows (padding rows are never read). Keeps a copy of the sequences.
/// Backward: dx[row r of sequence b] += dy_b / L_b for its valid rows; padding rows get exactly 0.
template <class S>
Var mean_pool(Tape<S>& t, Var x, const Sequences& seqs) {
  const Index N = t.rows(x), D = t.cols(x), B = seqs.batch();
  require(B > 0 && N == seqs.rows(), "mean_pool: x has ", N, " rows; the sequences hold ", seqs.rows(), " (", B,
          " sequences)");
  const bool req = t.requires_grad(x);
  const Var y = t.push(B, D, req);
  {
    const auto xv = t.value(x);
    Matrix<S>& out = t.output(y);
    for (Index b = 0; b < B; ++b) {
      const Index r0 = seqs.start(b), L = seqs.length(b);
      out.row(b) = xv.middleRows(r0, L).colwise().sum() / S(L);
    }
  }
  if (!req) return y;
  t.set_backward(y, [x, y, seqs](Tape<S>& tp) {
    const auto dy = tp.grad(y);  // [B, D]
    Matrix<S>& dx = tp.scratch(y);
    dx.setZero(tp.rows(x), tp.cols(x));
    for (Index b = 0; b < seqs.batch(); ++b) {
      const Index r0 = seqs.start(b), L = seqs.length(b);
      dx.middleRows(r0, L).rowwise() = dy.row(b) / S(L);
    }
    tp.accumulate_move(x, dx);
  });
  return y;
}

/// A layer made by name (AnyAttention, registry.hpp) as one tape node over padded or packed
/// sequences: the layer keeps the context of this forward, and the node's backward calls its
/// backward, which accumulates (+=) the parameter gradients into the layer's own buffer
/// (layer.gradients()). One node per layer per tape (the layer holds one context). When x needs
/// no gradient and with_gradients is false, no backward is recorded. (ops::attention is the same
/// node for a compiled Attention<S, I, Sc> and a gradient buffer of the caller's.)
template <class S>
Var attention_by_name(Tape<S>& t, AnyAttention<S>& layer, Var x, const Sequences& seqs, bool with_gradients) {
  const Index N = t.rows(x), D = layer.config().dim;
  require(t.cols(x) == D, "attention: x has ", t.cols(x), " columns; the layer's dim is D = ", D);
  const bool req = t.requires_grad(x) || with_gradients;
  const Var y = t.push(N, D, req);
  t.output(y) = layer.forward(t.value(x), seqs);
  if (!req) return y;
  AnyAttention<S>* l = &layer;
  t.set_backward(y, [l, x, y](Tape<S>& tp) {
    Matrix<S> dx = l->backward(tp.grad(y));
    tp.accumulate_move(x, dx);
  });
  return y;
}

// ---- the model ------------------------------------------------------------------------------------

struct EncoderConfig {
  Index vocab = 0;    ///< V
  Index dim = 64;     ///< D
  Index heads = 4;    ///< H (D/H even: rotary positions)
  Index layers = 2;   ///< L
  Index classes = 0;  ///< C
  std::string variant = builtin_variants.first_without_dynamics();  ///< a built-in variant name (registry.hpp)
  int steps = 1;                     ///< its integration steps
  double init_std = 0.02;            ///< GPT-2's
  double rope_base = default_rope_base;
  double dynamics_init_scale = 0.0;  ///< AttentionConfig's (0: a coupled layer starts as standard)

  AttentionConfig attention_config(int layer) const {
    AttentionConfig c;
    c.dim = dim;
    c.heads = heads;
    c.layer_index = layer;
    c.init_std = init_std;
    c.dynamics_init_scale = dynamics_init_scale;
    c.causal = false;  // an encoder: every token reads every valid token of its passage
    c.positions = Positions::rope;
    c.rope_base = rope_base;
    return c;
  }
};

inline void validate(const EncoderConfig& c) {
  require(c.vocab > 0 && c.vocab <= INT32_MAX, "encoder: vocab must be in [1, 2^31); got ", c.vocab);
  require(c.dim > 0, "encoder: --dim must be positive; got ", c.dim);
  require(c.heads > 0 && c.dim % c.heads == 0 && (c.dim / c.heads) % 2 == 0, "encoder: --dim must be a ",
          "multiple of --heads with an even head width D/H (rotary positions); got --dim ", c.dim, ", --heads ",
          c.heads);
  require(c.layers > 0, "encoder: --layers must be positive; got ", c.layers);
  require(c.classes >= 2, "encoder: needs at least 2 classes; got ", c.classes);
}

/// The encoder (see the top of this file). Parameter names: wte, h.<l>.ln1.g/b, h.<l>.attn.<the
/// layer's tensors>, h.<l>.ln2.g/b, h.<l>.mlp.fc.w/b, h.<l>.mlp.proj.w/b, ln_f.g/b, head.w, head.b.
/// Initialisation from one seed (GPT-2's): wte, fc.w, head.w ~ N(0, init_std^2), proj.w and the
/// attention's wo scaled by 1/sqrt(2L), biases 0, gains 1; each layer from its own drawn seed.
template <class S>
class Encoder {
 public:
  Encoder(const EncoderConfig& config, std::uint64_t seed) : config_(config) {
    validate(config_);
    const Index V = config_.vocab, D = config_.dim, M = 4 * config_.dim, C = config_.classes;
    const double resid = 1.0 / std::sqrt(2.0 * static_cast<double>(config_.layers));
    Rng rng(seed);
    wte_.resize(V, D);
    rng.fill_normal(wte_, config_.init_std);
    for (Index l = 0; l < config_.layers; ++l) {
      GptBlock<S> b;
      b.ln1_g = Vector<S>::Ones(D);
      b.ln1_b = Vector<S>::Zero(D);
      b.ln2_g = Vector<S>::Ones(D);
      b.ln2_b = Vector<S>::Zero(D);
      b.fc_w.resize(D, M);
      rng.fill_normal(b.fc_w, config_.init_std);
      b.fc_b = Vector<S>::Zero(M);
      b.proj_w.resize(M, D);
      rng.fill_normal(b.proj_w, config_.init_std * resid);
      b.proj_b = Vector<S>::Zero(D);
      h_.push_back(std::move(b));
      attn_.push_back(make_attention<S>(config_.variant, config_.steps, config_.attention_config(static_cast<int>(l)),
                                        rng.next_u64()));
      for (auto& v : attn_.back()->parameters())
        if (v.name == "wo")
          for (Index i = 0; i < v.size(); ++i) v.data[i] *= S(resid);
    }
    lnf_g_ = Vector<S>::Ones(D);
    lnf_b_ = Vector<S>::Zero(D);
    head_w_.resize(D, C);
    rng.fill_normal(head_w_, config_.init_std);
    head_b_ = Vector<S>::Zero(C);
    gwte_ = Matrix<S>::Zero(V, D);
    gh_ = h_;
    glnf_g_ = lnf_g_;
    glnf_b_ = lnf_b_;
    ghead_w_ = head_w_;
    ghead_b_ = head_b_;
    zero_grad();
  }

  const EncoderConfig& config() const { return config_; }

  /// Logits [B, C] of a batch as a tape node; with_gradients: the backward accumulates into the
  /// model's gradients.
  Var logits(Tape<S>& t, const Batch& batch, bool with_gradients) {
    const Index N = static_cast<Index>(batch.tokens.size());
    require(N == batch.seqs.rows() && batch.size() == batch.seqs.batch(), "encoder: the batch holds ", N,
            " tokens and ", batch.size(), " labels for sequences of ", batch.seqs.rows(), " rows");
    auto bind = [&](const auto& value, auto& grad) { return t.parameter(value, with_gradients ? &grad : nullptr); };
    const Var wte = bind(wte_, gwte_);
    Var x = ops::embedding(t, wte, batch.tokens.data(), N);
    for (std::size_t l = 0; l < h_.size(); ++l) {
      const GptBlock<S>& p = h_[l];
      GptBlock<S>& g = gh_[l];
      Var a = ops::layer_norm(t, x, bind(p.ln1_g, g.ln1_g), bind(p.ln1_b, g.ln1_b));
      a = attention_by_name(t, *attn_[l], a, batch.seqs, with_gradients);
      x = ops::add(t, x, a);
      Var m = ops::layer_norm(t, x, bind(p.ln2_g, g.ln2_g), bind(p.ln2_b, g.ln2_b));
      m = ops::linear(t, m, bind(p.fc_w, g.fc_w), bind(p.fc_b, g.fc_b));
      m = ops::gelu(t, m);
      m = ops::linear(t, m, bind(p.proj_w, g.proj_w), bind(p.proj_b, g.proj_b));
      x = ops::add(t, x, m);
    }
    x = ops::layer_norm(t, x, bind(lnf_g_, glnf_g_), bind(lnf_b_, glnf_b_));
    const Var pooled = mean_pool(t, x, batch.seqs);
    return ops::linear(t, pooled, bind(head_w_, ghead_w_), bind(head_b_, ghead_b_));
  }

  /// Mean cross-entropy of the batch; the gradients are ACCUMULATED (zero_grad() between steps).
  S loss(Tape<S>& t, const Batch& batch) {
    t.clear();
    const Var l = ops::cross_entropy(t, logits(t, batch, true), batch.labels.data(), batch.size());
    const S value = t.scalar(l);
    t.backward(l);
    t.clear();
    return value;
  }

  /// Logits [B, C] without gradients.
  Matrix<S> predict(Tape<S>& t, const Batch& batch) {
    t.clear();
    Matrix<S> out = t.value(logits(t, batch, false));
    t.clear();
    return out;
  }

  void zero_grad() {
    gwte_.setZero();
    for (auto& g : gh_) {
      for (auto* v : {&g.ln1_g, &g.ln1_b, &g.ln2_g, &g.ln2_b, &g.fc_b, &g.proj_b}) v->setZero();
      g.fc_w.setZero();
      g.proj_w.setZero();
    }
    for (auto& a : attn_) a->zero_gradients();
    glnf_g_.setZero();
    glnf_b_.setZero();
    ghead_w_.setZero();
    ghead_b_.setZero();
  }

  std::vector<TensorView<S>> parameters() { return views(false); }
  std::vector<TensorView<S>> gradients() { return views(true); }

  Index parameter_count() {
    Index n = 0;
    for (const auto& v : parameters()) n += v.size();
    return n;
  }
  Index dynamics_parameter_count() const {
    Index n = 0;
    for (const auto& a : attn_) n += a->dynamics_parameter_count();
    return n;
  }

 private:
  std::vector<TensorView<S>> views(bool grads) {
    std::vector<TensorView<S>> out;
    auto add = [&](const std::string& name, auto& value, auto& grad) {
      auto& t = grads ? grad : value;
      out.push_back(TensorView<S>{name, shape_of(t), t.data()});
    };
    add("wte", wte_, gwte_);
    for (std::size_t l = 0; l < h_.size(); ++l) {
      GptBlock<S>&p = h_[l], &g = gh_[l];
      const std::string h = "h." + std::to_string(l) + ".";
      add(h + "ln1.g", p.ln1_g, g.ln1_g);
      add(h + "ln1.b", p.ln1_b, g.ln1_b);
      for (auto& v : grads ? attn_[l]->gradients() : attn_[l]->parameters())
        out.push_back(TensorView<S>{h + "attn." + v.name, v.shape, v.data});
      add(h + "ln2.g", p.ln2_g, g.ln2_g);
      add(h + "ln2.b", p.ln2_b, g.ln2_b);
      add(h + "mlp.fc.w", p.fc_w, g.fc_w);
      add(h + "mlp.fc.b", p.fc_b, g.fc_b);
      add(h + "mlp.proj.w", p.proj_w, g.proj_w);
      add(h + "mlp.proj.b", p.proj_b, g.proj_b);
    }
    add("ln_f.g", lnf_g_, glnf_g_);
    add("ln_f.b", lnf_b_, glnf_b_);
    add("head.w", head_w_, ghead_w_);
    add("head.b", head_b_, ghead_b_);
    return out;
  }

  EncoderConfig config_;
  Matrix<S> wte_, gwte_;
  std::vector<GptBlock<S>> h_, gh_;
  std::vector<std::unique_ptr<AnyAttention<S>>> attn_;
  Vector<S> lnf_g_, lnf_b_, glnf_g_, glnf_b_;
  Matrix<S> head_w_, ghead_w_;
  Vector<S> head_b_, ghead_b_;
};

// ---- training and evaluation ----------------------------------------------------------------------

struct TrainConfig {
  Index batch = 32;
  Index steps = 2000;
  double lr = 2e-3;
  Index warmup = 50;
  double weight_decay = 0.1;
  std::uint64_t seed = 1;
  Index eval_batch = 64;
  std::int32_t pad_id = 3;  ///< the tokenizer's pad id
  /// false: passages drawn uniformly (classes as often as they have passages); true: a class
  /// uniformly, then one of its passages (every president as often, whatever his addresses' length).
  bool balanced = true;
};

struct RunResult {
  std::string variant;
  Index parameters = 0, dynamics_parameters = 0;
  std::vector<double> losses;     ///< the training loss of every step
  double final_train_loss = 0;    ///< mean of the last tenth of the steps (at least 1)
  double test_loss = 0;           ///< mean cross-entropy over the test passages
  double test_accuracy = 0;       ///< passage level
  double mean_recall = 0;         ///< passage level, the mean over classes of the share of its passages recognised
  double address_accuracy = 0;    ///< address level: the class of the summed log-probabilities of its passages
  std::vector<std::vector<Index>> confusion;  ///< [true][predicted] passage counts
  double train_seconds = 0, eval_seconds = 0;
};

namespace detail {
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace detail

/// Evaluates `model` on `test` (batches of similar lengths, no gradients; `tape` is cleared and
/// reused): loss, accuracy, confusion, address-level accuracy over `addresses` test addresses
/// (Example::address).
template <class S>
void evaluate(Encoder<S>& model, Tape<S>& tape, const std::vector<Example>& test, int addresses, Index eval_batch,
              std::int32_t pad, RunResult& r) {
  const auto C = static_cast<std::size_t>(model.config().classes);
  require(!test.empty(), "encoder: no test passages");
  std::vector<std::size_t> order(test.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return test[a].ids.size() < test[b].ids.size(); });
  r.confusion.assign(C, std::vector<Index>(C, 0));
  std::vector<std::vector<double>> votes(static_cast<std::size_t>(addresses), std::vector<double>(C, 0.0));
  std::vector<int> address_label(static_cast<std::size_t>(addresses), -1);
  double loss = 0;
  Index correct = 0;
  for (std::size_t k = 0; k < order.size(); k += static_cast<std::size_t>(eval_batch)) {
    const std::vector<std::size_t> which(order.begin() + static_cast<std::ptrdiff_t>(k),
                                         order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), k + static_cast<std::size_t>(eval_batch))));
    const Batch b = make_batch(test, which, pad);
    const Matrix<S> z = model.predict(tape, b);
    for (Index i = 0; i < z.rows(); ++i) {
      const Example& e = test[which[static_cast<std::size_t>(i)]];
      const double m = static_cast<double>(z.row(i).maxCoeff());
      double sum = 0;
      for (Index c = 0; c < z.cols(); ++c) sum += std::exp(static_cast<double>(z(i, c)) - m);
      const double lse = m + std::log(sum);
      Index pred = 0;
      z.row(i).maxCoeff(&pred);
      loss += lse - static_cast<double>(z(i, e.label));
      correct += pred == e.label;
      ++r.confusion[static_cast<std::size_t>(e.label)][static_cast<std::size_t>(pred)];
      require(e.address >= 0 && e.address < addresses, "encoder: a test passage's address ", e.address,
              " is outside [0, ", addresses, ")");
      auto& v = votes[static_cast<std::size_t>(e.address)];
      for (std::size_t c = 0; c < C; ++c) v[c] += static_cast<double>(z(i, static_cast<Index>(c))) - lse;
      address_label[static_cast<std::size_t>(e.address)] = e.label;
    }
  }
  r.test_loss = loss / static_cast<double>(test.size());
  r.test_accuracy = static_cast<double>(correct) / static_cast<double>(test.size());
  double recall = 0;
  std::size_t present = 0;
  for (std::size_t c = 0; c < C; ++c) {
    Index n = 0;
    for (Index k : r.confusion[c]) n += k;
    if (n == 0) continue;
    ++present;
    recall += static_cast<double>(r.confusion[c][c]) / static_cast<double>(n);
  }
  r.mean_recall = present ? recall / static_cast<double>(present) : 0.0;
  int right = 0, seen = 0;
  for (std::size_t a = 0; a < votes.size(); ++a) {
    if (address_label[a] < 0) continue;
    ++seen;
    right += std::max_element(votes[a].begin(), votes[a].end()) - votes[a].begin() == address_label[a];
  }
  r.address_accuracy = seen ? static_cast<double>(right) / seen : 0.0;
}

/// Trains one model (float) on `train` and evaluates it on `test`: every step draws `batch`
/// passages with replacement (TrainConfig::balanced; a Rng of its own from the seed, so two
/// variants see the same batches), one AdamW update (warm-up + cosine schedule, clipping at 1). `progress(step, loss)`
/// is called after each step when given.
inline RunResult train_and_evaluate(const EncoderConfig& config, const TrainConfig& tc, const std::vector<Example>& train,
                                    const std::vector<Example>& test, int test_addresses,
                                    const std::function<void(Index, double)>& progress = {}) {
  require(!train.empty(), "encoder: no training passages (is --min-tokens larger than every passage?)");
  require(tc.batch >= 1 && tc.steps >= 1, "encoder: --batch and --steps must be >= 1; got ", tc.batch, ", ", tc.steps);
  RunResult r;
  r.variant = config.variant;
  Encoder<float> model(config, tc.seed);
  r.parameters = model.parameter_count();
  r.dynamics_parameters = model.dynamics_parameter_count();
  AdamWConfig oc;
  oc.lr = tc.lr;
  oc.warmup_steps = std::min(tc.warmup, tc.steps);
  oc.total_steps = tc.steps;
  oc.weight_decay = tc.weight_decay;
  AdamW<float> opt(model.parameters(), model.gradients(), oc);
  Rng data_rng(tc.seed * 0x9E3779B97F4A7C15ull + 0x5EED);
  Tape<float> tape;
  std::vector<std::size_t> which(static_cast<std::size_t>(tc.batch));
  std::vector<std::vector<std::size_t>> by_class;  // the classes that have training passages
  {
    std::vector<std::vector<std::size_t>> all(static_cast<std::size_t>(config.classes));
    for (std::size_t i = 0; i < train.size(); ++i) all.at(static_cast<std::size_t>(train[i].label)).push_back(i);
    for (auto& m : all)
      if (!m.empty()) by_class.push_back(std::move(m));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (Index s = 0; s < tc.steps; ++s) {
    for (auto& w : which) {
      if (tc.balanced) {
        const auto& members = by_class[static_cast<std::size_t>(data_rng.next_u64() % by_class.size())];
        w = members[static_cast<std::size_t>(data_rng.next_u64() % members.size())];
      } else {
        w = static_cast<std::size_t>(data_rng.next_u64() % train.size());
      }
    }
    const Batch b = make_batch(train, which, tc.pad_id);
    model.zero_grad();
    const double l = model.loss(tape, b);
    require(std::isfinite(l), "encoder: the training loss is not finite at step ", s + 1, " (", l,
            "); lower --lr");
    opt.step();
    r.losses.push_back(l);
    if (progress) progress(s + 1, l);
  }
  r.train_seconds = detail::seconds_since(t0);
  const std::size_t tail = std::max<std::size_t>(1, r.losses.size() / 10);
  r.final_train_loss =
      std::accumulate(r.losses.end() - static_cast<std::ptrdiff_t>(tail), r.losses.end(), 0.0) / static_cast<double>(tail);
  const auto t1 = std::chrono::steady_clock::now();
  evaluate(model, tape, test, test_addresses, tc.eval_batch, tc.pad_id, r);
  r.eval_seconds = detail::seconds_since(t1);
  return r;
}

/// Baselines on the test passages: always the most frequent class of the training passages, and
/// 1/C.
struct Baselines {
  int majority_class = 0;
  double majority_accuracy = 0;
  double chance = 0;
};
inline Baselines baselines(const std::vector<Example>& train, const std::vector<Example>& test, std::size_t classes) {
  Baselines b;
  const std::vector<Index> n = class_counts(train, classes);
  b.majority_class = static_cast<int>(std::max_element(n.begin(), n.end()) - n.begin());
  Index hit = 0;
  for (const Example& e : test) hit += e.label == b.majority_class;
  b.majority_accuracy = test.empty() ? 0.0 : static_cast<double>(hit) / static_cast<double>(test.size());
  b.chance = 1.0 / static_cast<double>(classes);
  return b;
}

}  // namespace coupledqk::encoder
