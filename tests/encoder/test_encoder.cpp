// The encoder example (examples/encoder, docs/encoder.md): the file-name parser, the split by
// address, passages, the masked mean pool's gradient, the model's padding invariance and
// gradients, a tiny end-to-end run on a generated folder corpus, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <coupledqk/testing/gradcheck.hpp>

#include "cli.hpp"
#include "support/files.hpp"

namespace {

namespace fs = std::filesystem;
using namespace coupledqk;
using namespace coupledqk::encoder;
using cqk_test_support::contains;
using cqk_test_support::error_of;
using cqk_test_support::TempDir;
using cqk_test_support::write_file;

std::vector<train::Document> docs_of(const std::vector<std::string>& names) {
  std::vector<train::Document> out;
  for (const auto& n : names) out.push_back({n, "Text of " + n + "."});
  return out;
}

/// Pseudo-English of one of a few authors: each has words of its own syllables, plus shared ones,
/// so that who wrote a passage is learnable from its words. Paragraphs separated by blank lines.
std::string author_text(int author, std::uint64_t seed, int paragraphs) {
  static const char* const own[3][6] = {{"ka", "lo", "mi", "ren", "tas", "vo"},
                                        {"dor", "pel", "shi", "nu", "gra", "bel"},
                                        {"tor", "an", "is", "ek", "quo", "zim"}};
  static const char* const shared[] = {"the", "of", "and", "to", "we", "our", "nation", "people"};
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 777;
  auto next = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  std::string text;
  for (int p = 0; p < paragraphs; ++p) {
    if (p) text += "\n\n";
    const int sentences = 3 + static_cast<int>(next() % 3);
    for (int t = 0; t < sentences; ++t) {
      if (t) text += ' ';
      const int words = 5 + static_cast<int>(next() % 6);
      for (int w = 0; w < words; ++w) {
        std::string word;
        if (next() % 3 == 0) {
          word = shared[next() % 8];
        } else {
          const int n = 1 + static_cast<int>(next() % 3);
          for (int k = 0; k < n; ++k) word += own[author][next() % 6];
        }
        if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
        text += (w ? " " : "") + word;
      }
      text += ".";
    }
  }
  return text;
}

/// A folder corpus: `per_author` addresses by each of `authors` presidents.
void write_corpus(const fs::path& dir, int authors, int per_author, int paragraphs = 20) {
  static const char* const names[] = {"alma_k_reed_x", "boris_dale_y", "cora_lynn_vance_zz"};
  for (int a = 0; a < authors; ++a)
    for (int i = 0; i < per_author; ++i)
      write_file(dir / ("addresses/" + std::to_string(1900 + 10 * a + i) + "_" + names[a] + ".txt"),
                 author_text(a, static_cast<std::uint64_t>(100 * a + i + 1), paragraphs));
}

int run_args(std::vector<std::string> args) {
  std::vector<const char*> argv{"coupledqk-encoder"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return run_main(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("encoder: the president and party from the file name") {
  const AddressName a = parse_address_name("1850_millard_fillmore_w.txt");
  CHECK(a.year == 1850);
  CHECK(a.president == "millard_fillmore");
  CHECK(a.party == "w");
  // The folder part of a folder corpus's name, and no extension (the sotu loader's names).
  CHECK(parse_address_name("data/1989_george_bush_r.txt").president == "george_bush");
  CHECK(parse_address_name("2001_george_w_bush_r").president == "george_w_bush");
  CHECK(parse_address_name("1989_george_bush_r").president != parse_address_name("2005_george_w_bush_r").president);
  // Multi-letter party suffixes are the last field only.
  const AddressName j = parse_address_name("1801_thomas_jefferson_dr");
  CHECK(j.president == "thomas_jefferson");
  CHECK(j.party == "dr");
  CHECK(parse_address_name("1841_john_tyler_wd").party == "wd");
  CHECK(parse_address_name("1865_andrew_johnson_nu").president == "andrew_johnson");
  CHECK(parse_address_name("1934_franklin_d_roosevelt_d.txt").president == "franklin_d_roosevelt");
  CHECK(display_name("george_w_bush") == "George W. Bush");
  CHECK(display_name("franklin_d_roosevelt") == "Franklin D. Roosevelt");

  for (const char* bad : {"README.txt", "1850_fillmore", "18x0_millard_fillmore_w", "1850_Millard_fillmore_w",
                          "1850__fillmore_w", "1850_millard_fillmore_", "1850_millard_fillmore_w2"}) {
    CAPTURE(bad);
    const std::string e = error_of<io_error>([&] { parse_address_name(bad); });
    CHECK(contains(e, bad));
    CHECK(contains(e, "year_first[_middle]_last_party"));
  }
}

TEST_CASE("encoder: classes and the split by address") {
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) names.push_back("data/" + std::to_string(1801 + i) + "_thomas_jefferson_dr.txt");
  for (int i = 0; i < 4; ++i) names.push_back(std::to_string(1989 + i) + "_george_bush_r");
  for (int i = 0; i < 8; ++i) names.push_back(std::to_string(2001 + i) + "_george_w_bush_r");
  for (int i = 0; i < 2; ++i) names.push_back(std::to_string(1961 + i) + "_john_f_kennedy_d");
  names.push_back("1849_zachary_taylor_w");
  const auto docs = docs_of(names);

  const Task t = make_task(docs, 2, 0);
  REQUIRE(t.classes.size() == 4);  // taylor has one address
  CHECK(t.presidents_in_corpus == 5);
  // Classes in order of their first address; george_bush and george_w_bush are two.
  CHECK(t.classes == std::vector<std::string>{"thomas_jefferson", "john_f_kennedy", "george_bush", "george_w_bush"});
  CHECK(t.labels[1] == "John F. Kennedy");
  // No address on both sides; every address of a class on one side; every class on both sides.
  std::set<std::string> train, test;
  for (const auto& a : t.train) train.insert(a.name);
  for (const auto& a : t.test) test.insert(a.name);
  CHECK(train.size() == t.train.size());
  CHECK(test.size() == t.test.size());
  for (const auto& n : test) CHECK(train.count(n) == 0);
  CHECK(train.size() + test.size() == names.size() - 1);
  std::vector<int> in_train(4, 0), in_test(4, 0);
  for (const auto& a : t.train) ++in_train[static_cast<std::size_t>(a.label)];
  for (const auto& a : t.test) ++in_test[static_cast<std::size_t>(a.label)];
  CHECK(in_train == std::vector<int>{6, 1, 3, 6});
  CHECK(in_test == std::vector<int>{2, 1, 1, 2});
  // Every fourth address (i % 4 == 3) of a class goes to test; of fewer than 4, the last.
  CHECK(test.count("data/1804_thomas_jefferson_dr.txt") == 1);
  CHECK(test.count("data/1808_thomas_jefferson_dr.txt") == 1);
  CHECK(test.count("1962_john_f_kennedy_d") == 1);
  CHECK(test.count("1992_george_bush_r") == 1);
  for (const auto& a : t.train) CHECK(t.classes[static_cast<std::size_t>(a.label)] == parse_address_name(a.name).president);

  // --presidents K: the K with the most addresses (ties: the earlier first address).
  const Task k = make_task(docs, 2, 2);
  CHECK(k.classes == std::vector<std::string>{"thomas_jefferson", "george_w_bush"});
  const Task m = make_task(docs, 4, 0);
  CHECK(m.classes.size() == 3);

  // Fewer than 2 classes, and bad arguments.
  const auto few = docs_of({"1989_george_bush_r", "1990_george_bush_r", "1991_george_bush_r", "1961_john_f_kennedy_d"});
  const std::string one = error_of<coupledqk::invalid_argument>([&] { make_task(few, 3, 0); });
  CHECK(contains(one, "1 president(s) with at least 3 addresses"));
  CHECK(contains(one, "expected at least 2 classes"));
  CHECK(contains(one, "george_bush (3), john_f_kennedy (1)"));
  CHECK(contains(error_of<coupledqk::invalid_argument>([&] { make_task(few, 2, 0); }), "expected at least 2 classes"));
  CHECK(contains(error_of<coupledqk::invalid_argument>([&] { make_task(docs, 1, 0); }), "--min-addresses must be >= 2"));
  CHECK(contains(error_of<coupledqk::invalid_argument>([&] { make_task({}, 2, 0); }), "0 president(s)"));
  CHECK(contains(error_of<io_error>([&] { make_task(docs_of({"notes.txt"}), 2, 0); }), "notes.txt"));
}

TEST_CASE("encoder: passages are whole sentences within a paragraph") {
  CHECK(paragraphs_of("a b.\n\n  \nc d.\ne f.\n\n") == std::vector<std::string_view>{"a b.", "c d.\ne f."});
  CHECK(paragraphs_of("one line only") == std::vector<std::string_view>{"one line only"});
  CHECK(sentences_of("One two. Three? \"Four!\" Five") ==
        std::vector<std::string_view>{"One two.", "Three?", "\"Four!\"", "Five"});
  CHECK(sentences_of("3.5 percent.") == std::vector<std::string_view>{"3.5 percent."});

  // One id per word: sentence lengths 3, 2, 4, 6 | 2 (second paragraph), seq 6, min 2.
  auto words = [](std::string_view s) {
    std::vector<std::int32_t> ids;
    bool in = false;
    for (char c : s) {
      if (c != ' ' && !in) ids.push_back(static_cast<std::int32_t>(ids.size()) + 10);
      in = c != ' ';
    }
    return ids;
  };
  Address a;
  a.label = 1;
  a.text = "a b c. d e. f g h i. j k l m n o.\n\nx y. z.";
  const auto ex = make_examples({a}, words, 6, 2);
  std::vector<std::size_t> lengths;
  for (const auto& e : ex) {
    lengths.push_back(e.ids.size());
    CHECK(e.label == 1);
    CHECK(e.address == 0);
  }
  // [3+2], [4], [6], [2+1]: a sentence that does not fit starts the next passage, never across a paragraph
  CHECK(lengths == std::vector<std::size_t>{5, 4, 6, 3});
  // longer than seq: pieces of seq tokens; shorter than min_tokens: dropped
  a.text = "a b c d e f g h i j k l m n.";
  const auto cut = make_examples({a}, words, 6, 3);
  REQUIRE(cut.size() == 2);  // 6, 6 (the last 2 tokens are dropped)
  CHECK(cut[0].ids.size() == 6);
  CHECK(cut[1].ids.size() == 6);
  CHECK(contains(error_of<coupledqk::invalid_argument>([&] { make_examples({a}, words, 4, 5); }), "--min-tokens"));

  // A padded batch: T = the longest passage, padding with the pad id.
  const Batch b = make_batch(ex, {1, 0}, 3);
  CHECK(b.seqs.seq() == 5);
  CHECK(b.seqs.lengths() == std::vector<Index>{4, 5});
  CHECK(b.tokens.size() == 10);
  CHECK(b.tokens[4] == 3);
  CHECK(b.labels == std::vector<std::int32_t>{1, 1});
}

TEST_CASE("encoder: the masked mean pool's gradient against central differences") {
  const Index D = 3;
  for (const Sequences& seqs : {Sequences::padded(5, {3, 5, 1}), Sequences::packed({0, 2, 6, 7})}) {
    const Index N = seqs.rows();
    Rng rng(7);
    Matrix<double> x(N, D), w(seqs.batch(), D);
    rng.fill_normal(x, 1.0);
    rng.fill_normal(w, 1.0);
    auto loss = [&](const Matrix<double>& input) {
      Tape<double> t;
      const Var y = mean_pool(t, t.constant(input), seqs);
      return (t.value(y).array() * w.array()).sum();
    };
    Matrix<double> grad = Matrix<double>::Zero(N, D);
    Tape<double> t;
    const Var xv = t.parameter(x, &grad);
    const Var y = mean_pool(t, xv, seqs);
    CHECK(t.rows(y) == seqs.batch());
    t.backward(y, w);
    Matrix<double> numeric(N, D), xp = x;
    const double eps = 1e-6;
    for (Index i = 0; i < x.size(); ++i) {
      const double v = xp.data()[i];
      xp.data()[i] = v + eps;
      const double lp = loss(xp);
      xp.data()[i] = v - eps;
      const double lm = loss(xp);
      xp.data()[i] = v;
      numeric.data()[i] = (lp - lm) / (2 * eps);
    }
    CHECK(testing::max_relative_error(grad, numeric) < 1e-8);
    if (!seqs.dense()) {  // padding rows: exactly zero
      CHECK(grad.middleRows(3, 2).cwiseAbs().maxCoeff() == 0.0);
      CHECK(grad.middleRows(11, 4).cwiseAbs().maxCoeff() == 0.0);
    }
    // the forward: sequence 1's mean
    Tape<double> f;
    const Matrix<double> mean = f.value(mean_pool(f, f.constant(x), seqs));
    CHECK((mean.row(1) - x.middleRows(seqs.start(1), seqs.length(1)).colwise().mean()).norm() < 1e-14);
  }
}

TEST_CASE("encoder: padding changes no logit; whole-model gradients") {
  for (const std::string variant : {"standard", "leapfrog"}) {
    CAPTURE(variant);
    EncoderConfig c;
    c.vocab = 20;
    c.dim = 8;
    c.heads = 2;
    c.layers = 2;
    c.classes = 3;
    c.variant = variant;
    c.dynamics_init_scale = 0.3;  // dynamics that move q and k from the start
    c.init_std = 0.3;
    Encoder<double> model(c, 11);
    std::vector<Example> ex{{{4, 5, 6, 7, 8, 9, 10}, 0, 0}, {{11, 12, 13, 14}, 1, 0}, {{15, 16}, 2, 0}};
    Batch b = make_batch(ex, {0, 1, 2}, 3);
    Tape<double> t;
    const Matrix<double> z = model.predict(t, b);
    REQUIRE(z.rows() == 3);
    REQUIRE(z.cols() == 3);
    // Other padding tokens: the same logits, bit for bit.
    Batch other = b;
    for (std::size_t r = 0; r < other.tokens.size(); ++r) {
      const Index bi = static_cast<Index>(r) / other.seqs.seq(), ti = static_cast<Index>(r) % other.seqs.seq();
      if (ti >= other.seqs.length(bi)) other.tokens[r] = static_cast<std::int32_t>((r * 7) % 20);
    }
    CHECK(other.tokens != b.tokens);
    CHECK((model.predict(t, other) - z).cwiseAbs().maxCoeff() == 0.0);
    // Each passage alone (no padding): the same logits up to rounding.
    for (std::size_t i = 0; i < ex.size(); ++i) {
      const Matrix<double> alone = model.predict(t, make_batch(ex, {i}, 3));
      CHECK((alone.row(0) - z.row(static_cast<Index>(i))).cwiseAbs().maxCoeff() < 1e-12);
    }
    // The loss's gradient against central differences, on entries of every tensor; the padding
    // rows give the pad id's embedding row no gradient.
    model.zero_grad();
    model.loss(t, b);
    auto params = model.parameters();
    auto grads = model.gradients();
    REQUIRE(params.size() == grads.size());
    CHECK(params.front().name == "wte");
    CHECK(params.back().name == "head.b");
    for (Index j = 0; j < c.dim; ++j) CHECK(grads[0].data[3 * c.dim + j] == 0.0);  // pad id 3
    Tape<double> e;
    auto loss_now = [&] {
      e.clear();
      const Var l = ops::cross_entropy(e, model.logits(e, b, false), b.labels.data(), b.size());
      return e.scalar(l);
    };
    double worst = 0;
    int checked = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      const Index n = params[k].size();
      for (Index i : {Index(0), n / 2, n - 1}) {
        double& w = params[k].data[i];
        const double v = w, eps = 1e-5;
        w = v + eps;
        const double lp = loss_now();
        w = v - eps;
        const double lm = loss_now();
        w = v;
        const double numeric = (lp - lm) / (2 * eps), analytic = grads[k].data[i];
        const double err = std::abs(numeric - analytic) / std::max(1e-6, std::abs(numeric) + std::abs(analytic));
        if (err > 1e-5) {
          INFO(params[k].name, " entry ", i);
          CHECK(err <= 1e-5);
        }
        worst = std::max(worst, err);
        ++checked;
      }
    }
    CHECK(checked > 40);
    MESSAGE(variant, ": ", checked, " gradient entries, worst relative error ", worst);
    if (variant == "leapfrog") CHECK(model.dynamics_parameter_count() > 0);
  }
}

TEST_CASE("encoder: a tiny run learns who wrote the passage; the program writes its report") {
  TempDir dir("encoder");
  write_corpus(dir.path / "corpus", 3, 4);
  const auto docs = train::load_corpus((dir.path / "corpus").string(), dir / "cache");
  const Task task = make_task(docs, 4, 0);
  REQUIRE(task.classes.size() == 3);
  const auto tok = train::Tokenizer::train_or_load(task_documents(task.train), "tiny-encoder", 384, dir / "cache");
  auto encode = [&](std::string_view s) { return tok.encode(s); };
  const auto train_ex = make_examples(task.train, encode, 24, 4);
  const auto test_ex = make_examples(task.test, encode, 24, 4);
  REQUIRE(train_ex.size() > 100);
  REQUIRE(test_ex.size() > 20);
  EncoderConfig c;
  c.vocab = tok.vocab_size();
  c.dim = 16;
  c.heads = 2;
  c.layers = 1;
  c.classes = 3;
  TrainConfig tc;
  tc.batch = 16;
  tc.steps = 60;
  tc.warmup = 5;
  tc.lr = 1e-2;
  tc.pad_id = tok.pad_id();
  for (const std::string variant : {"standard", "leapfrog"}) {
    CAPTURE(variant);
    c.variant = variant;
    tc.balanced = variant == "standard";  // both ways of drawing batches
    const RunResult r = train_and_evaluate(c, tc, train_ex, test_ex, static_cast<int>(task.test.size()));
    REQUIRE(r.losses.size() == 60);
    MESSAGE(variant, ": loss ", r.losses.front(), " -> ", r.final_train_loss, ", test accuracy ", r.test_accuracy);
    CHECK(std::abs(r.losses.front() - std::log(3.0)) < 0.1);  // near chance at the start
    CHECK(r.final_train_loss < 0.5 * r.losses.front());       // training reduces the loss
    CHECK(r.test_accuracy > 0.6);                            // chance: 1/3
    CHECK(r.mean_recall > 0.6);
    Index total = 0;
    for (const auto& row : r.confusion)
      for (Index n : row) total += n;
    CHECK(total == static_cast<Index>(test_ex.size()));
  }

  // The program end to end (a few steps): the report and the data files.
  const fs::path out = dir.path / "out";
  CHECK(run_args({"--corpus", (dir.path / "corpus").string(), "--cache", dir / "cache", "--out", out.string(),
                  "--min-addresses", "4", "--vocab", "384", "--seq", "24", "--min-tokens", "4", "--dim", "16",
                  "--heads", "2", "--layers", "1", "--batch", "8", "--steps", "5", "--warmup", "1", "--quiet",
                  "--no-plot"}) == 0);
  const std::string md = cqk_test_support::read_file(out / "encoder.md");
  CHECK(contains(md, "| standard"));
  CHECK(contains(md, "| leapfrog"));
  CHECK(contains(md, "chance (1/3)"));
  CHECK(contains(md, "mean recall"));
  CHECK(contains(md, "Alma K. Reed"));
  CHECK(fs::exists(out / "confusion-standard.dat"));
  CHECK(fs::exists(out / "confusion-leapfrog.gp"));
  CHECK(fs::exists(out / "loss.dat"));

  // A corpus of one president: a clear error, exit code 2.
  write_corpus(dir.path / "one", 1, 4, 3);
  CHECK(run_args({"--corpus", (dir.path / "one").string(), "--cache", dir / "cache", "--out", out.string(),
                  "--min-addresses", "2", "--quiet"}) == 2);
  const std::string e = error_of<coupledqk::invalid_argument>(
      [&] { make_task(train::load_corpus((dir.path / "one").string(), dir / "cache"), 2, 0); });
  CHECK(contains(e, "expected at least 2 classes"));
  // A file whose name says no president: exit code 1 (bad data, not a bad flag).
  write_file(dir.path / "one" / "notes.txt", "Some notes.");
  CHECK(run_args({"--corpus", (dir.path / "one").string(), "--cache", dir / "cache", "--out", out.string(),
                  "--quiet"}) == 1);
}

TEST_CASE("encoder: bad flags") {
  auto err = [](std::vector<std::string> args) {
    return error_of<coupledqk::invalid_argument>([&] { parse_options(args); });
  };
  CHECK(contains(err({"--bogus"}), "unknown flag '--bogus'"));
  CHECK(contains(err({"--dim", "abc"}), "--dim expects an integer; got 'abc'"));
  CHECK(contains(err({"--dim=0"}), "--dim must be in [2, 4096]; got 0"));
  CHECK(contains(err({"--steps"}), "--steps needs a value"));
  CHECK(contains(err({"--lr", "fast"}), "--lr expects a finite number; got 'fast'"));
  CHECK(contains(err({"--lr", "nan"}), "--lr expects a finite number"));
  CHECK(contains(err({"--variants", "standard,nope"}), "unknown attention variant 'nope'"));
  CHECK(contains(err({"--variants", "standard,nope"}), "leapfrog"));  // the accepted names
  CHECK(contains(err({"--variants", "standard,standard"}), "twice"));
  CHECK(contains(err({"--variants", ","}), "one or more variant names"));
  CHECK(contains(err({"--dim", "64", "--heads", "3"}), "even head width"));
  CHECK(contains(err({"--dim", "12", "--heads", "4"}), "even head width"));  // D/H = 3
  CHECK(contains(err({"--seq", "8", "--min-tokens", "9"}), "--min-tokens (9) must be at most --seq (8)"));
  CHECK(contains(err({"--vocab", "100"}), "--vocab must be in [384"));
  CHECK(contains(err({"--min-addresses", "1"}), "--min-addresses must be in [2"));
  CHECK(contains(err({"--quiet=yes"}), "--quiet takes no value"));
  CHECK(contains(err({"--sampling", "random"}), "--sampling is 'random'; expected balanced or uniform"));
  CHECK(contains(err({"--integrator-steps", "99"}), "--integrator-steps must be in [1, "));

  const Options d = parse_options({});
  CHECK(d.variants == std::vector<std::string>{"standard", "leapfrog"});
  const Options o = parse_options({"--variant", "euler", "--dim=32", "--heads", "2", "--threads", "0"});
  CHECK(o.variants == std::vector<std::string>{"euler"});
  CHECK(o.dim == 32);
  CHECK(o.threads == 0);
  CHECK(o.balanced);
  CHECK_FALSE(parse_options({"--sampling=uniform"}).balanced);
  CHECK(parse_options({"--help"}).help);
  CHECK(run_args({"--bogus"}) == 2);
  CHECK(run_args({"--dim", "x"}) == 2);
  CHECK(run_args({"--help"}) == 0);
}
