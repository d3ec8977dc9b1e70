// coupledqk-compare: trains several attention variants on the same data, token budget and seeds,
// one after another in this process, and reports their perplexities side by side (a table on
// stdout and in <out>/compare.md, the validation curves as TSV and as a PNG drawn by gnuplot).
// docs/training.md gives the defaults and what they cost. Under mpirun every run is data-parallel
// over the processes (docs/distributed.md); rank 0 alone prints and writes the files.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "distributed/communicator.hpp"
#include "analysis/gnuplot.hpp"
#include "analysis/statistics.hpp"
#include "trainer.hpp"
#include "analysis/variant_spec.hpp"

namespace ct = coupledqk::train;
namespace fs = std::filesystem;
using ct::cpu_model;
using ct::Estimate;
using ct::mean_ci;
using ct::file_safe;
using ct::shell_quote;
using coupledqk::Index;

namespace {

using Variant = ct::VariantSpec;

/// "standard,leapfrog:3" -> variants; invalid_argument for an empty item, a bad step count or a
/// repeated label. (Unknown names are reported by preflight, with the accepted list.)
std::vector<Variant> parse_variants(const std::string& list) {
  std::vector<Variant> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (item.empty())
      throw coupledqk::invalid_argument("--variants '" + list + "' has an empty item; expected names with an optional "
                                        ":steps, separated by commas (e.g. standard,leapfrog:3)");
    Variant v = ct::parse_variant_spec(item, "--variants");
    for (const Variant& o : out)
      if (o.label == v.label) throw coupledqk::invalid_argument("--variants: '" + v.label + "' is listed twice");
    out.push_back(v);
  }
  if (out.empty()) throw coupledqk::invalid_argument("--variants is empty; e.g. standard,leapfrog");
  return out;
}




std::string fmt(const char* format, double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

std::string with_commas(long long v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (v < 0 ? "-" : "") + out;
}

/// A perplexity over seeds: the mean, with the sample standard deviation for 2 or more seeds.
std::string show_ppl(const Estimate& e) {
  if (e.n < 2) return fmt("%.2f", e.mean);
  return fmt("%.2f", e.mean) + " ± " + fmt("%.2f", e.sd);
}
/// A paired change over seeds: the mean, with its 95% t interval for 2 or more seeds (the study's
/// statistics, analysis/statistics.hpp).
std::string show_change(const Estimate& e) {
  if (e.n < 2) return fmt("%+.2f%%", e.mean);
  return fmt("%+.2f%%", e.mean) + " [" + fmt("%+.2f", e.lo) + ", " + fmt("%+.2f", e.hi) + "]";
}
std::string spread_note(std::size_t seeds) {
  if (seeds == 1) return "one seed: no spread";
  return "perplexities: mean ± sample standard deviation over " + std::to_string(seeds) +
         " seeds; changes: mean [95% t interval] of the per-seed changes" +
         (seeds == 2 ? " (2 seeds: the interval is wide by construction)" : "");
}

/// Valid perplexity of the unigram model with the training split's counts (add-one smoothing):
/// what a model that ignores context can reach.
double unigram_ppl(const ct::TokenStreams& s, int vocab) {
  std::vector<double> count(static_cast<std::size_t>(vocab), 1.0);
  for (std::int32_t id : s.train) count[static_cast<std::size_t>(id)] += 1;
  const double total = static_cast<double>(s.train.size()) + vocab;
  double nll = 0;
  for (std::size_t i = 1; i < s.valid.size(); ++i) nll -= std::log(count[static_cast<std::size_t>(s.valid[i])] / total);
  return std::exp(nll / static_cast<double>(s.valid.size() - 1));
}

struct Row {
  Variant variant;
  std::vector<ct::TrainResult> runs;
};

/// The row every change is measured against: --baseline's label when given, else the first row
/// whose variant has no dynamics, taking the variant table's order (its first such entry, then the
/// rest), else the first row.
const Row* baseline_row(const std::vector<Row>& rows, const std::string& baseline) {
  for (const Row& r : rows)
    if (!baseline.empty() && r.variant.label == baseline) return &r;
  for (const auto& info : coupledqk::builtin_variants.infos())
    if (!info.has_dynamics)
      for (const Row& r : rows)
        if (r.variant.attention == info.name) return &r;
  return &rows.front();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train several attention variants on the same data, budget and seeds; compare their perplexities "
               "(docs/training.md)",
               "coupledqk-compare"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  ct::TrainOptions o;
  o.vocab = ct::Defaults::compare_vocab;
  // default: the table's first entry without dynamics and its first with (standard,leapfrog)
  std::string variants_flag = std::string(coupledqk::builtin_variants.first_without_dynamics()) + "," +
                              coupledqk::builtin_variants.first_with_dynamics();
  int seeds = 2;
  std::string out_dir = "results";
  std::string progress = "auto";
  std::string baseline;
  app.add_option("--variants", variants_flag,
                 "variants to compare, comma-separated, each with an optional :steps (e.g. standard,leapfrog:3)")
      ->capture_default_str();
  app.add_option("--baseline", baseline,
                 "the variant (a label of --variants) every change is measured against; default: the first "
                 "variant without dynamics in the variant table's order (standard), else the first listed");
  app.add_option("--seeds", seeds, "runs per variant, with seeds --seed, --seed + 1, ...")->capture_default_str();
  app.add_option("--out", out_dir, "folder for compare.md, curves.tsv, curves_mean.tsv, valid_ppl.png, metrics/")
      ->capture_default_str();
  ct::add_flags(app, ct::train_flags(o, false));
  app.add_option("--progress", progress, "progress display: auto (bar on a terminal), bar, lines, off")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  ct::Communicator* comm = nullptr;
  try {
    const auto wall_start = std::chrono::steady_clock::now();
    comm = &ct::world();  // under mpirun: MPI_Init, this process's rank (docs/distributed.md)
    const ct::ProgressMode mode = comm->root() ? ct::parse_progress_mode(progress) : ct::ProgressMode::off;
    std::FILE* const shown = comm->root() ? stderr : nullptr;  // rank 0 alone prints
    std::vector<Variant> variants;
    ct::together(*comm, [&] {
      variants = parse_variants(variants_flag);
      if (seeds < 1) throw coupledqk::invalid_argument("--seeds must be >= 1; got " + std::to_string(seeds));
      if (!baseline.empty() && std::none_of(variants.begin(), variants.end(),
                                            [&](const Variant& v) { return v.label == baseline; })) {
        std::string labels;
        for (const Variant& v : variants) labels += (labels.empty() ? "" : ", ") + v.label;
        throw coupledqk::invalid_argument("--baseline '" + (baseline.size() <= 64 ? baseline : baseline.substr(0, 64) + "...") +
                                          "' is not one of the compared variants; accepted: " + labels);
      }
      ct::validate_explicit(o, [&](const std::string& flag) { return app.count(flag) > 0; });
      // Every variant's options are checked before anything runs.
      for (const Variant& v : variants) {
        ct::TrainOptions vo = o;
        vo.attention = v.attention;
        vo.steps = v.steps;
        ct::preflight(vo);
      }
    });
    o.threads = ct::set_threads(o.threads);  // decided once, for every run
    ct::install_interrupt_handler();
    ct::together(*comm, [&] {
      if (!comm->root()) return;
      std::error_code ec;
      fs::create_directories(fs::path(out_dir) / "metrics", ec);
      if (ec) throw coupledqk::io_error("cannot create the output folder '" + out_dir + "': " + ec.message());
    });

    ct::Progress main_progress(mode, "", shown);
    // The first rank of each machine prepares the data (its cache), then the others read it.
    std::optional<ct::TrainData> prepared;
    ct::together(*comm, [&] {
      if (comm->local_rank() == 0) prepared.emplace(ct::prepare_data(o, &main_progress));
    });
    ct::together(*comm, [&] {
      if (comm->local_rank() != 0) prepared.emplace(ct::prepare_data(o, &main_progress));
    });
    const ct::TrainData& data = *prepared;
    const double unigram = unigram_ppl(data.streams, o.vocab);
    const int threads = o.threads;

    std::vector<Row> rows;
    for (const Variant& v : variants) rows.push_back(Row{v, {}});
    for (int s = 0; s < seeds; ++s)
      for (Row& row : rows) {
        ct::TrainOptions ro = o;
        ro.attention = row.variant.attention;
        ro.steps = row.variant.steps;
        ro.seed = o.seed + static_cast<std::uint64_t>(s);
        ro.metrics = (fs::path(out_dir) / "metrics" /
                      (file_safe(row.variant.label) + "-seed" + std::to_string(ro.seed) + ".jsonl"))
                         .string();
        ct::Progress p(mode, row.variant.label + " seed " + std::to_string(ro.seed), shown);
        row.runs.push_back(ct::train(ro, data, p));
        const ct::TrainResult& r = row.runs.back();
        if (r.interrupted) {
          if (comm->root()) std::cerr << "coupledqk-compare: interrupted; no table" << std::endl;
          comm->finalize();
          return 130;
        }
        p.message("valid ppl " + fmt("%.3f", r.valid_ppl) + ", test ppl " + fmt("%.3f", r.test_ppl) + ", " +
                  fmt("%.0f", r.tokens_per_s) + " tokens/s, " + fmt("%.1f", r.wall_seconds) + " s");
      }

    if (!comm->root()) {  // rank 0 writes the table and the files
      comm->finalize();
      return 0;
    }

    // ---- the table
    const Row* ref = baseline_row(rows, baseline);
    auto ppl_stat = [](const Row& r, bool test) {
      std::vector<double> v;
      for (const auto& x : r.runs) v.push_back(test ? x.test_ppl : x.valid_ppl);
      return mean_ci(v);
    };
    // Changes are paired by seed: with the same seed, every variant starts from the same weights
    // (the dynamics' own parameters aside) and sees the same batches.
    auto change = [&](const Row& r, bool test) {
      std::vector<double> d;
      for (std::size_t s = 0; s < r.runs.size(); ++s) {
        const double a = test ? r.runs[s].test_ppl : r.runs[s].valid_ppl;
        const double b = test ? ref->runs[s].test_ppl : ref->runs[s].valid_ppl;
        d.push_back(100 * (a - b) / b);
      }
      return show_change(mean_ci(d));
    };
    struct Line {
      std::vector<std::string> cells;
    };
    const std::vector<std::string> header{"variant", "parameters", "dynamics", "valid ppl", "test ppl",
                                          "valid vs " + ref->variant.label, "test vs " + ref->variant.label,
                                          "tokens/s"};
    std::vector<Line> lines;
    for (const Row& r : rows) {
      const Estimate v = ppl_stat(r, false), t = ppl_stat(r, true);
      std::vector<double> tps;
      for (const auto& x : r.runs) tps.push_back(x.tokens_per_s);
      const auto& first = r.runs.front();
      const bool is_ref = &r == ref;
      lines.push_back(Line{{r.variant.label, with_commas(first.parameters), fmt("%.2f%%", first.dynamics_percent), show_ppl(v),
                            show_ppl(t),
                            is_ref ? "ref" : change(r, false), is_ref ? "ref" : change(r, true),
                            with_commas(std::llround(mean_ci(tps).mean))}});
    }
    std::vector<std::size_t> width(header.size());
    auto utf8_len = [](const std::string& s) {
      std::size_t n = 0;
      for (unsigned char c : s) n += (c & 0xC0) != 0x80;
      return n;
    };
    for (std::size_t c = 0; c < header.size(); ++c) {
      width[c] = utf8_len(header[c]);
      for (const Line& l : lines) width[c] = std::max(width[c], utf8_len(l.cells[c]));
    }
    auto pad = [&](const std::string& s, std::size_t c) {
      const std::string fill(width[c] - utf8_len(s), ' ');
      return c == 0 ? s + fill : fill + s;
    };
    std::ostringstream table, md;
    for (std::size_t c = 0; c < header.size(); ++c) table << (c ? "  " : "") << pad(header[c], c);
    table << "\n";
    for (const Line& l : lines) {
      for (std::size_t c = 0; c < header.size(); ++c) table << (c ? "  " : "") << pad(l.cells[c], c);
      table << "\n";
    }
    md << "|";
    for (const auto& h : header) md << " " << h << " |";
    md << "\n|";
    for (std::size_t c = 0; c < header.size(); ++c) md << (c == 0 ? "---|" : "---:|");
    md << "\n";
    for (const Line& l : lines) {
      md << "|";
      for (const auto& cell : l.cells) md << " " << cell << " |";
      md << "\n";
    }

    // ---- curves: raw, and the mean over seeds per variant
    const fs::path out(out_dir);
    {
      std::ofstream tsv(out / "curves.tsv");
      tsv << "variant\tseed\tstep\ttokens\tvalid_loss\tvalid_ppl\n";
      for (const Row& r : rows)
        for (std::size_t s = 0; s < r.runs.size(); ++s)
          for (const auto& p : r.runs[s].curve)
            tsv << r.variant.label << "\t" << o.seed + s << "\t" << p.step << "\t" << p.tokens << "\t" << p.loss << "\t"
                << p.ppl << "\n";
      std::ofstream mean(out / "curves_mean.tsv");
      for (const Row& r : rows) {
        mean << "# " << r.variant.label << "\n# tokens\tmean valid ppl\n";
        const std::size_t n = r.runs.front().curve.size();
        for (std::size_t i = 0; i < n; ++i) {
          double sum = 0;
          for (const auto& run : r.runs) sum += run.curve[std::min(i, run.curve.size() - 1)].ppl;
          mean << r.runs.front().curve[i].tokens << "\t" << sum / static_cast<double>(r.runs.size()) << "\n";
        }
        mean << "\n\n";
      }
      if (!tsv || !mean) throw coupledqk::io_error("cannot write the curves in '" + out_dir + "'");
    }
    std::string plot_note;
    {
      std::ofstream gp(out / "plot.gp");
      gp << "set terminal pngcairo size 960,600 font 'sans,11'\n"
         << "set output 'valid_ppl.png'\n"  // gnuplot runs in the output folder: no path in the script
         << "set title "
         << ct::gnuplot_string("Validation perplexity vs training tokens (" + o.corpus + ", mean over " +
                               std::to_string(seeds) + " seed" + (seeds > 1 ? "s" : "") + ")")
         << "\n"
         << "set xlabel 'training tokens'\nset ylabel 'validation perplexity (log scale)'\n"
         << "set logscale y\nset grid\nset key top right\nset format x '%.0s%c'\n"
         << "set datafile separator '\\t'\n"
         << "plot ";
      for (std::size_t i = 0; i < rows.size(); ++i)
        gp << (i ? ", \\\n     " : "") << "'curves_mean.tsv' index " << i
           << " using 1:2 with linespoints lw 2 pt 7 ps 0.6 title " << ct::gnuplot_string(rows[i].variant.label);
      gp << "\n";
    }
    if (std::system("command -v gnuplot > /dev/null 2>&1") == 0) {
      if (!ct::run_gnuplot((out / "plot.gp").string()))
        plot_note = "gnuplot failed; the curves are in curves.tsv and curves_mean.tsv";
    } else {
      plot_note = "gnuplot is not installed (Debian: gnuplot-nox); no plot, the curves are in curves_mean.tsv";
    }

    // ---- report
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + shell_quote(argv[i]);
    const ct::TrainResult& first = rows.front().runs.front();
    std::ostringstream setup;
    setup << "corpus " << o.corpus << " (" << data.stats.train.documents << "/" << data.stats.valid.documents << "/"
          << data.stats.test.documents << " documents; " << with_commas(static_cast<long long>(data.streams.train.size()))
          << "/" << with_commas(static_cast<long long>(data.streams.valid.size())) << "/"
          << with_commas(static_cast<long long>(data.streams.test.size())) << " tokens train/valid/test), vocab "
          << o.vocab << "; model D=" << o.dim << " L=" << o.layers << " H=" << o.heads << " T=" << o.seq
          << "; batch " << o.batch << ", " << with_commas(first.tokens) << " tokens (" << first.total_steps
          << " steps) per run, lr " << o.lr << " cosine to " << (o.min_lr >= 0 ? o.min_lr : 0.1 * o.lr)
          << ", seeds " << o.seed << ".." << o.seed + static_cast<std::uint64_t>(seeds - 1);
    std::time_t now = std::time(nullptr);
    char date[64];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
    const std::string machine =
        cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores, " +
        std::to_string(threads) + " thread(s)" +
        (comm->size() > 1 ? " per process, " + std::to_string(comm->size()) + " processes (" + comm->description() + ")"
                          : std::string());

    std::cout << "\n" << setup.str() << "\n"
              << "unigram baseline (training counts): valid ppl " << fmt("%.1f", unigram) << "\n\n"
              << table.str() << "(" << spread_note(static_cast<std::size_t>(seeds))
              << "; perplexities on the whole validation and test splits; changes paired by seed)\n"
              << "wall time " << fmt("%.1f", wall) << " s on " << machine << "\n"
              << "wrote " << (out / "compare.md").string() << ", curves.tsv, curves_mean.tsv"
              << (plot_note.empty() ? ", valid_ppl.png" : "") << " and metrics/ in " << out_dir << "\n";
    if (!plot_note.empty()) std::cout << "note: " << plot_note << "\n";

    std::ofstream report(out / "compare.md");
    report << "# coupledqk-compare\n\n"
           << "```sh\n" << command << "\n```\n\n"
           << "- date: " << date << "\n"
           << "- machine: " << machine << "\n"
           << "- setup: " << setup.str() << "\n"
           << "- unigram baseline (training counts, add-one): valid ppl " << fmt("%.1f", unigram) << "\n"
           << "- wall time: " << fmt("%.1f", wall) << " s (data preparation included)\n\n"
           << md.str() << "\n"
           << "Perplexities on the whole validation and test splits at the end of training; "
           << spread_note(static_cast<std::size_t>(seeds)) << ". Changes (negative is better) are relative to "
           << ref->variant.label << ", paired by seed (same seed: same initial shared weights, same batches), "
           << "then averaged over seeds. tokens/s: training throughput, evaluations excluded.\n\n";
    if (plot_note.empty())
      report << "![validation perplexity vs training tokens](valid_ppl.png)\n\n";
    else
      report << "(" << plot_note << ")\n\n";
    report << "Files: `curves.tsv` (every evaluation of every run), `curves_mean.tsv` (mean over seeds), "
           << "`plot.gp`, `metrics/*.jsonl` (per step).\n";
    if (!report) throw coupledqk::io_error("cannot write '" + (out / "compare.md").string() + "'");
    comm->finalize();
    return 0;
  } catch (const ct::collective_error& e) {
    // Every rank failed together: rank 0 says why, all exit.
    if (!comm || comm->root()) {
      std::fflush(stdout);
      std::cerr << "coupledqk-compare: error: " << e.what() << std::endl;
    }
    if (comm) comm->finalize();
    return 1;
  } catch (const std::exception& e) {
    // One rank alone: the others may wait for it in a collective, so the whole job ends here.
    if (comm && comm->size() > 1)
      comm->abort("coupledqk-compare: error on rank " + std::to_string(comm->rank()) + " of " +
                  std::to_string(comm->size()) + ": " + e.what() + " (ending every rank)");
    std::fflush(stdout);
    std::cerr << "coupledqk-compare: error: " << e.what() << std::endl;
    return 1;
  }
}
