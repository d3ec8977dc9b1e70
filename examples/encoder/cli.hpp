// coupledqk-encoder's command line, run and report (docs/encoder.md). main.cpp calls run_main();
// the tests call parse_options() and run_main() in-process.
//
// Exit codes: 0 done; 2 a bad flag or value (unknown flag, missing or malformed value, out of
// range, an unknown variant, a corpus with fewer than 2 classes at these settings); 1 any other
// failure (a corpus that cannot be read, a file that cannot be written).
#pragma once

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "encoder.hpp"
#include "analysis/gnuplot.hpp"
#include "records/progress.hpp"  // cpu_model
#include "trainer.hpp"   // set_threads

namespace coupledqk::encoder {

struct Options {
  std::string corpus = "sotu";
  std::string cache;                 ///< empty: train::default_cache_dir()
  std::string out = "encoder-out";
  std::vector<std::string> variants{builtin_variants.first_without_dynamics(), builtin_variants.first_with_dynamics()};
  int integrator_steps = 1;
  int presidents = 0;
  int min_addresses = 8;
  int vocab = 2000;
  Index seq = 64;
  Index min_tokens = 16;
  Index dim = 64, heads = 4, layers = 2;
  Index batch = 32, steps = 2000, warmup = 50;
  double lr = 2e-3, weight_decay = 0.1;
  double dynamics_init_scale = 0.0;
  std::uint64_t seed = 1;
  int threads = 1;
  bool balanced = true;
  bool plot = true;
  bool quiet = false;
  bool help = false;
};

inline std::string usage() {
  return R"(coupledqk-encoder: which president wrote a passage of a State of the Union address?
A bidirectional encoder (padded batches, rotary positions, mean pool, linear classifier) per
attention variant, trained on the same data with the same seeds, evaluated on held-out addresses.

  --corpus SPEC          sotu (default), or a folder of year_first[_middle]_last_party.txt files
  --cache DIR            corpus and tokenizer cache (default: $COUPLEDQK_CACHE or <source>/.cache)
  --out DIR              report folder: encoder.md, confusion-<variant>.{dat,png}, loss.{dat,png}
                         (default encoder-out)
  --variants A,B,...     attention variants to compare, by name (default standard,leapfrog)
  --variant NAME         one variant only (same as --variants NAME)
  --integrator-steps N   integration steps of the coupled variants (default 1)
  --min-addresses N      classes: presidents with at least N addresses (default 8, >= 2)
  --presidents K         keep the K of them with the most addresses (default 0: all)
  --vocab V              tokenizer size, trained on the training addresses (default 2000)
  --seq T                passage length in tokens, at most (default 64)
  --min-tokens N         drop passages shorter than N tokens (default 16)
  --dim D --heads H --layers L   model (default 64, 4, 2; D/H even)
  --batch B              passages per step (default 32)
  --sampling MODE        balanced (default: a president uniformly, then one of his passages) or
                         uniform (every passage equally often)
  --steps S              training steps (default 2000)
  --lr X                 peak learning rate (default 0.002), --warmup W steps (default 50; at most --steps)
  --weight-decay X       AdamW on matrices (default 0.1)
  --dynamics-init-scale X  the coupled layers' AttentionConfig::dynamics_init_scale (default 0:
                         every variant starts as exactly standard attention)
  --seed N               initialisation and batch order (default 1)
  --threads N            threads (default 1; 0: the idle cores)
  --no-plot              write the .dat files but do not run gnuplot
  --quiet                no progress lines
  --help                 this text
)";
}

namespace detail {
inline long long parse_integer(const std::string& flag, const std::string& text, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw invalid_argument(flag + " expects an integer; got '" + io::detail::quote(text) + "'");
  if (v < lo || v > hi)
    throw invalid_argument(flag + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; got " +
                           std::to_string(v));
  return v;
}
inline double parse_real(const std::string& flag, const std::string& text, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw invalid_argument(flag + " expects a finite number; got '" + io::detail::quote(text) + "'");
  if (v < lo || v > hi) {
    std::ostringstream os;
    os << flag << " must be in [" << lo << ", " << hi << "]; got " << v;
    throw invalid_argument(os.str());
  }
  return v;
}
inline std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  if (out.empty()) throw invalid_argument(flag + " expects one or more variant names separated by ','; got '" +
                                          io::detail::quote(text) + "'");
  return out;
}
}  // namespace detail

/// The options of `args` (without the program name): "--flag value" or "--flag=value". Throws
/// invalid_argument, naming the flag and the value, for an unknown flag, a missing or malformed
/// value, a value out of range, an unknown or repeated variant, or inconsistent sizes.
inline Options parse_options(const std::vector<std::string>& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool has_value = false;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto need = [&]() -> const std::string& {
      if (!has_value) {
        if (i + 1 >= args.size()) throw invalid_argument(flag + " needs a value (see --help)");
        value = args[++i];
        has_value = true;
      }
      return value;
    };
    auto integer = [&](long long lo, long long hi) { return detail::parse_integer(flag, need(), lo, hi); };
    auto real = [&](double lo, double hi) { return detail::parse_real(flag, need(), lo, hi); };
    auto no_value = [&]() {
      if (has_value) throw invalid_argument(flag + " takes no value; got '" + io::detail::quote(value) + "'");
    };
    if (flag == "--help" || flag == "-h") { no_value(); o.help = true; }
    else if (flag == "--no-plot") { no_value(); o.plot = false; }
    else if (flag == "--quiet") { no_value(); o.quiet = true; }
    else if (flag == "--sampling") {
      const std::string& m = need();
      if (m != "balanced" && m != "uniform")
        throw invalid_argument("--sampling is '" + io::detail::quote(m) + "'; expected balanced or uniform");
      o.balanced = m == "balanced";
    }
    else if (flag == "--corpus") o.corpus = need();
    else if (flag == "--cache") o.cache = need();
    else if (flag == "--out") o.out = need();
    else if (flag == "--variants") o.variants = detail::split_list(flag, need());
    else if (flag == "--variant") o.variants = {need()};
    else if (flag == "--integrator-steps") o.integrator_steps = static_cast<int>(integer(1, max_steps));
    else if (flag == "--min-addresses") o.min_addresses = static_cast<int>(integer(2, 100000));
    else if (flag == "--presidents") o.presidents = static_cast<int>(integer(0, 100000));
    else if (flag == "--vocab") o.vocab = static_cast<int>(integer(train::Tokenizer::min_vocab_size, 1 << 20));
    else if (flag == "--seq") o.seq = integer(2, 4096);
    else if (flag == "--min-tokens") o.min_tokens = integer(1, 4096);
    else if (flag == "--dim") o.dim = integer(2, 4096);
    else if (flag == "--heads") o.heads = integer(1, 256);
    else if (flag == "--layers") o.layers = integer(1, 64);
    else if (flag == "--batch") o.batch = integer(1, 65536);
    else if (flag == "--steps") o.steps = integer(1, 100000000);
    else if (flag == "--warmup") o.warmup = integer(0, 100000000);
    else if (flag == "--lr") o.lr = real(0, 10);
    else if (flag == "--weight-decay") o.weight_decay = real(0, 10);
    else if (flag == "--dynamics-init-scale") o.dynamics_init_scale = real(0, 10);
    else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(integer(0, INT64_MAX));
    else if (flag == "--threads") o.threads = static_cast<int>(integer(0, 1024));
    else
      throw invalid_argument("unknown flag '" + io::detail::quote(args[i]) + "' (see --help for the flags)");
  }
  if (o.help) return o;
  require(o.min_tokens <= o.seq, "--min-tokens (", o.min_tokens, ") must be at most --seq (", o.seq, ")");
  require(o.dim % o.heads == 0 && (o.dim / o.heads) % 2 == 0, "--dim must be a multiple of --heads with an even ",
          "head width D/H (rotary positions); got --dim ", o.dim, ", --heads ", o.heads);
  std::set<std::string> seen;
  for (const std::string& v : o.variants) {
    require(seen.insert(v).second, "--variants names '", io::detail::quote(v), "' twice");
    try {
      const auto info = builtin_variants.info(v);  // throws for an unknown name, listing the accepted ones
      (void)builtin_variants.index_of(v, info.has_dynamics ? o.integrator_steps : 1);
    } catch (const invalid_argument& e) {
      throw invalid_argument(std::string("--variants: ") + e.what());
    }
  }
  return o;
}

// ---- the report -------------------------------------------------------------------------------

inline std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

inline std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

/// The comparison table (text, also in encoder.md).
inline std::string results_table(const Task& task, const std::vector<RunResult>& runs, const Baselines& b) {
  std::ostringstream os;
  char line[512];
  const char* row = "| %-30s | %9s | %10s | %10s | %9s | %10s | %11s | %10s | %8s |\n";
  std::snprintf(line, sizeof line, row, "variant", "params", "dyn params", "train loss", "test loss", "test acc",
                "mean recall", "addr. acc", "train s");
  os << line;
  os << "|" << std::string(32, '-');
  for (int w : {11, 12, 12, 11, 12, 13, 12, 10}) os << "|" << std::string(static_cast<std::size_t>(w), '-');
  os << "|\n";
  auto num = [](const char* fmt, double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  for (const RunResult& r : runs) {
    std::snprintf(line, sizeof line, row, r.variant.c_str(), std::to_string(r.parameters).c_str(),
                  std::to_string(r.dynamics_parameters).c_str(), num("%.4f", r.final_train_loss).c_str(),
                  num("%.4f", r.test_loss).c_str(), percent(r.test_accuracy).c_str(), percent(r.mean_recall).c_str(),
                  percent(r.address_accuracy).c_str(), num("%.1f", r.train_seconds).c_str());
    os << line;
  }
  const std::string majority = "majority: " + task.labels[static_cast<std::size_t>(b.majority_class)];
  const std::string chance = percent(b.chance);
  std::snprintf(line, sizeof line, row, majority.substr(0, 30).c_str(), "", "", "", "",
                percent(b.majority_accuracy).c_str(), chance.c_str(), "", "");
  os << line;
  std::snprintf(line, sizeof line, row, ("chance (1/" + std::to_string(task.classes.size()) + ")").c_str(), "", "", "",
                num("%.4f", std::log(static_cast<double>(task.classes.size()))).c_str(), chance.c_str(),
                chance.c_str(), chance.c_str(), "");
  os << line;
  return os.str();
}

/// The confusion matrix as text: rows true, columns predicted, counts; class numbers as headers.
inline std::string confusion_text(const Task& task, const RunResult& r) {
  std::ostringstream os;
  const std::size_t C = task.classes.size();
  char cell[64];
  os << "    true \\ predicted";
  for (std::size_t c = 0; c < C; ++c) {
    std::snprintf(cell, sizeof cell, " %4zu", c);
    os << cell;
  }
  os << "   total  recall\n";
  for (std::size_t t = 0; t < C; ++t) {
    Index total = 0;
    for (Index n : r.confusion[t]) total += n;
    std::snprintf(cell, sizeof cell, "%2zu %-17s", t, task.labels[t].substr(0, 17).c_str());
    os << cell;
    for (std::size_t p = 0; p < C; ++p) {
      std::snprintf(cell, sizeof cell, " %4ld", static_cast<long>(r.confusion[t][p]));
      os << cell;
    }
    std::snprintf(cell, sizeof cell, "  %6ld  %6s\n", static_cast<long>(total),
                  total ? percent(static_cast<double>(r.confusion[t][t]) / static_cast<double>(total)).c_str() : "-");
    os << cell;
  }
  return os.str();
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw io_error("encoder: cannot write " + path.string());
}

/// Writes confusion-<variant>.dat (row-normalised), its gnuplot script and (with plot) the .png;
/// returns whether the plot was made.
inline bool write_confusion_plot(const std::filesystem::path& dir, const Task& task, const RunResult& r, bool plot) {
  const std::size_t C = task.classes.size();
  const std::string stem = "confusion-" + train::file_safe(r.variant);
  std::ostringstream dat;
  dat << "# " << r.variant << ": rows = true president, columns = predicted (classes 0.." << C - 1
      << "), fraction of the row's test passages\n";
  for (std::size_t t = 0; t < C; ++t) {
    Index total = 0;
    for (Index n : r.confusion[t]) total += n;
    for (std::size_t p = 0; p < C; ++p) {
      char v[32];
      std::snprintf(v, sizeof v, "%s%.4f", p ? " " : "",
                    total ? static_cast<double>(r.confusion[t][p]) / static_cast<double>(total) : 0.0);
      dat << v;
    }
    dat << "\n";
  }
  write_text(dir / (stem + ".dat"), dat.str());
  std::ostringstream tics;
  for (std::size_t c = 0; c < C; ++c) tics << (c ? ", " : "") << train::gnuplot_string(task.labels[c]) << " " << c;
  std::ostringstream gp;
  const int size = 360 + 34 * static_cast<int>(C);
  gp << "set terminal pngcairo size " << size + 120 << "," << size << " font 'sans,9'\n"
     << "set output " << train::gnuplot_string(stem + ".png") << "\n"
     << "set title " << train::gnuplot_string(r.variant + ": test passages by true president (rows), fraction predicted as each (accuracy " + percent(r.test_accuracy) + ")") << "\n"
     << "set xlabel 'predicted'\nset ylabel 'true'\n"
     << "set xtics (" << tics.str() << ") rotate by 50 right\n"
     << "set ytics (" << tics.str() << ")\n"
     << "set xrange [-0.5:" << C - 0.5 << "]\nset yrange [" << C - 0.5 << ":-0.5]\n"
     << "set cbrange [0:1]\nset palette defined (0 'white', 1 '#08306b')\nset size ratio -1\n"
     << "plot " << train::gnuplot_string(stem + ".dat") << " matrix with image notitle\n";
  write_text(dir / (stem + ".gp"), gp.str());
  return plot && train::run_gnuplot((dir / (stem + ".gp")).string());
}

/// loss.dat (step, one column per variant, a running mean over 20 steps) and loss.png.
inline bool write_loss_plot(const std::filesystem::path& dir, const std::vector<RunResult>& runs, bool plot) {
  std::ostringstream dat;
  dat << "# step";
  for (const RunResult& r : runs) dat << " " << r.variant;
  dat << "  (training loss, mean of the last 20 steps)\n";
  const std::size_t n = runs.front().losses.size();
  for (std::size_t s = 0; s < n; ++s) {
    dat << s + 1;
    for (const RunResult& r : runs) {
      const std::size_t b = s >= 19 ? s - 19 : 0;
      double sum = 0;
      for (std::size_t k = b; k <= s; ++k) sum += r.losses[k];
      char v[32];
      std::snprintf(v, sizeof v, " %.5f", sum / static_cast<double>(s - b + 1));
      dat << v;
    }
    dat << "\n";
  }
  write_text(dir / "loss.dat", dat.str());
  std::ostringstream gp;
  gp << "set terminal pngcairo size 800,500 font 'sans,10'\nset output 'loss.png'\n"
     << "set title 'training loss (cross-entropy, running mean of 20 steps)'\nset xlabel 'step'\nset ylabel 'loss'\n"
     << "set key top right\nplot ";
  for (std::size_t k = 0; k < runs.size(); ++k)
    gp << (k ? ", " : "") << "'loss.dat' using 1:" << k + 2 << " with lines lw 2 title "
       << train::gnuplot_string(runs[k].variant);
  gp << "\n";
  write_text(dir / "loss.gp", gp.str());
  return plot && train::run_gnuplot((dir / "loss.gp").string());
}

// ---- the run ------------------------------------------------------------------------------------

inline int run(const Options& o, const std::string& command_line) {
  const auto wall0 = std::chrono::steady_clock::now();
  const int threads = train::set_threads(o.threads);  // 0: the idle cores, as coupledqk-train
  const std::string cache = o.cache.empty() ? train::default_cache_dir() : o.cache;
  auto say = [&](const std::string& s) {
    if (!o.quiet) std::cout << s << std::endl;
  };

  const Task task = make_task(train::load_corpus(o.corpus, cache), o.min_addresses, o.presidents);
  const std::size_t C = task.classes.size();
  const auto tok = train::Tokenizer::train_or_load(task_documents(task.train), train::corpus_key(o.corpus) + "-encoder",
                                                   o.vocab, cache);
  auto encode = [&](std::string_view s) { return tok.encode(s); };
  const std::vector<Example> train_ex = make_examples(task.train, encode, o.seq, o.min_tokens);
  const std::vector<Example> test_ex = make_examples(task.test, encode, o.seq, o.min_tokens);
  require(!train_ex.empty() && !test_ex.empty(), "encoder: no passages of at least --min-tokens ", o.min_tokens,
          " tokens on the ", train_ex.empty() ? "training" : "test", " side; lower --min-tokens");
  const Baselines base = baselines(train_ex, test_ex, C);
  {
    std::ostringstream os;
    os << "corpus " << o.corpus << ": " << task.presidents_in_corpus << " presidents, " << C << " classes (at least "
       << o.min_addresses << " addresses" << (o.presidents ? ", the " + std::to_string(o.presidents) + " with most" : "")
       << "), " << task.train.size() << " training / " << task.test.size() << " test addresses, " << train_ex.size()
       << " / " << test_ex.size() << " passages of " << o.min_tokens << ".." << o.seq << " tokens; tokenizer "
       << tok.vocab_size() << " pieces (" << (tok.trained() ? "trained" : "cached") << "); " << threads << " thread(s)";
    say(os.str());
  }

  std::vector<RunResult> runs;
  for (const std::string& v : o.variants) {
    EncoderConfig ec;
    ec.vocab = tok.vocab_size();
    ec.dim = o.dim;
    ec.heads = o.heads;
    ec.layers = o.layers;
    ec.classes = static_cast<Index>(C);
    ec.variant = v;
    ec.steps = builtin_variants.info(v).has_dynamics ? o.integrator_steps : 1;
    ec.dynamics_init_scale = o.dynamics_init_scale;
    TrainConfig tc;
    tc.batch = o.batch;
    tc.steps = o.steps;
    tc.lr = o.lr;
    tc.warmup = o.warmup;
    tc.weight_decay = o.weight_decay;
    tc.seed = o.seed;
    tc.pad_id = tok.pad_id();
    tc.balanced = o.balanced;
    const Index every = std::max<Index>(1, o.steps / 10);
    double window = 0;
    Index in_window = 0;
    runs.push_back(train_and_evaluate(ec, tc, train_ex, test_ex, static_cast<int>(task.test.size()),
                                      [&](Index s, double l) {
                                        window += l;
                                        ++in_window;
                                        if (s % every == 0 || s == o.steps) {
                                          char line[128];
                                          std::snprintf(line, sizeof line, "%-16s step %6ld/%ld  loss %.4f",
                                                        v.c_str(), static_cast<long>(s), static_cast<long>(o.steps),
                                                        window / static_cast<double>(in_window));
                                          say(line);
                                          window = 0;
                                          in_window = 0;
                                        }
                                      }));
    const RunResult& r = runs.back();
    char line[256];
    std::snprintf(line, sizeof line, "%-16s test accuracy %s (passages), %s (addresses), %.1f s training", v.c_str(),
                  percent(r.test_accuracy).c_str(), percent(r.address_accuracy).c_str(), r.train_seconds);
    say(line);
  }
  const double wall = detail::seconds_since(wall0);

  namespace fs = std::filesystem;
  const fs::path dir(o.out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw io_error("encoder: cannot create the report folder " + dir.string() + ": " + ec.message());
  bool plotted = true;
  for (const RunResult& r : runs) plotted = write_confusion_plot(dir, task, r, o.plot) && plotted;
  plotted = write_loss_plot(dir, runs, o.plot) && plotted;

  const std::string table = results_table(task, runs, base);
  std::ostringstream md;
  md << "# coupledqk-encoder: which president wrote the passage?\n\n"
     << "Command: `" << command_line << "`\n\n"
     << "Machine: " << train::cpu_model() << ", " << threads << " thread(s); wall time " << seconds_text(wall)
     << " (loading, tokenizer, every variant's training and evaluation).\n\n"
     << "Data: corpus `" << o.corpus << "`, " << C << " classes (presidents with at least " << o.min_addresses
     << " addresses" << (o.presidents ? ", the " + std::to_string(o.presidents) + " with most" : "") << "), split by address: "
     << task.train.size() << " training and " << task.test.size() << " test addresses, " << train_ex.size() << " / "
     << test_ex.size() << " passages of " << o.min_tokens << ".." << o.seq << " tokens (tokenizer of "
     << tok.vocab_size() << " pieces trained on the training addresses).\n\n"
     << "Model: D = " << o.dim << ", H = " << o.heads << ", L = " << o.layers << ", bidirectional, rotary positions, "
     << "mean pool, linear head; " << o.steps << " steps of " << o.batch << " passages, AdamW lr " << o.lr
     << " (warm-up " << o.warmup << ", cosine), seed " << o.seed << ", dynamics init scale "
     << o.dynamics_init_scale << (o.integrator_steps > 1 ? ", " + std::to_string(o.integrator_steps) + " integration steps" : "")
     << ".\n\n"
     << "Sampling: " << (o.balanced ? "balanced (a president uniformly, then one of his passages)" : "uniform over passages")
     << ". Train loss: the mean of the last tenth of the steps. Test accuracy: over test passages; mean recall: the "
     << "mean over presidents of the share of his test passages recognised; addr. acc: over test addresses (the class "
     << "with the largest summed log-probability of the address's passages). Majority: always the president with the "
     << "most training passages.\n\n"
     << table << "\n## Classes\n\n| # | president | addresses | train passages | test passages |\n|---|---|---|---|---|\n";
  const std::vector<Index> ntrain = class_counts(train_ex, C), ntest = class_counts(test_ex, C);
  for (std::size_t c = 0; c < C; ++c)
    md << "| " << c << " | " << task.labels[c] << " | " << task.addresses[c] << " | " << ntrain[c] << " | " << ntest[c]
       << " |\n";
  for (const RunResult& r : runs)
    md << "\n## Confusion: " << r.variant << "\n\n![confusion " << r.variant << "](confusion-"
       << train::file_safe(r.variant) << ".png)\n\n```\n" << confusion_text(task, r) << "```\n";
  md << "\n![training loss](loss.png)\n";
  write_text(dir / "encoder.md", md.str());

  std::cout << "\n" << table << "\nreport: " << (dir / "encoder.md").string()
            << (plotted ? "" : o.plot ? " (gnuplot failed or is missing: the .dat and .gp files are there, no .png)"
                                      : " (--no-plot: .dat and .gp files only)")
            << "\nwall time " << seconds_text(wall) << "\n";
  return 0;
}

/// The whole program: parses argv, runs, and maps errors to exit codes (2: a bad flag or value,
/// 1: anything else), each printed as "coupledqk-encoder: error: <message>" on stderr.
inline int run_main(int argc, const char* const* argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string command = "coupledqk-encoder";
  for (const auto& a : args) command += " " + train::shell_quote(a);
  try {
    const Options o = parse_options(args);
    if (o.help) {
      std::cout << usage();
      return 0;
    }
    return run(o, command);
  } catch (const invalid_argument& e) {
    std::cout.flush();
    std::cerr << "coupledqk-encoder: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "coupledqk-encoder: error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace coupledqk::encoder
