// coupledqk-study report: the markdown report, its JSON numbers and its plots (study/report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "analysis/gnuplot.hpp"

namespace coupledqk::train::study {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string f(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}



/// The estimate as text: "mean [lo, hi]" with the claim's unit.
std::string show_estimate(const ClaimResult& r) {
  const Estimate& e = r.estimate;
  if (e.n == 0) return "-";
  const bool percent = r.claim->test != ClaimTest::spread_ratio && r.claim->test != ClaimTest::tokens_to_target &&
                       r.claim->test != ClaimTest::tokens_to_match;
  const char* fm = percent ? "%+.2f%%" : "%.2fx";
  const char* fb = percent ? "%+.2f" : "%.2f";
  if (e.n < 2) return f(fm, e.mean) + " (1 seed)";
  return f(fm, e.mean) + " [" + f(fb, e.lo) + ", " + f(fb, e.hi) + "]";
}

/// The runs of an arm that are finished, by seed: those that trained to the end, or (with_diverged)
/// also those that diverged.
std::vector<const RunResult*> arm_results(const Plan& plan, const std::map<std::string, RunResult>& results,
                                          const ArmRef& arm, bool with_diverged = false) {
  std::vector<const RunResult*> out;
  for (const Group& g : plan.groups)
    if (g.name == arm.group)
      for (std::uint64_t s : g.seeds)
        if (const RunSpec* spec = plan.find(arm, s)) {
          const auto it = results.find(spec->id);
          if (it != results.end() && (with_diverged || !it->second.diverged())) out.push_back(&it->second);
        }
  return out;
}

/// Text for a plot (gnuplot_string keeps a small alphabet): "$best-3c = drift" -> "best-3c = drift",
/// and on one line (a label in a .tsv comment cannot start a data row).
std::string plot_text(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '$'), s.end());
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

/// Markdown with every `$` outside code (fenced blocks, inline backticks) written `\$`: a choice's
/// label ("$best-3c") would otherwise open a formula in renderers with maths (GitHub's).
std::string escape_dollars(const std::string& md) {
  std::string out;
  out.reserve(md.size() + 64);
  bool fence = false, inline_code = false, line_start = true;
  for (std::size_t i = 0; i < md.size(); ++i) {
    const char c = md[i];
    if (line_start && md.compare(i, 3, "```") == 0) {
      fence = !fence;
      out += "```";
      i += 2;
      line_start = false;
      continue;
    }
    line_start = c == '\n';
    if (c == '\n') inline_code = false;  // an unclosed backtick does not run past its line
    if (!fence && c == '`') inline_code = !inline_code;
    if (!fence && !inline_code && c == '$' && (i == 0 || md[i - 1] != '\\')) out += '\\';
    out += c;
  }
  return out;
}

/// The arms of a claim, in order.
std::vector<ArmRef> claim_arms(const Claim& c) {
  if (c.test == ClaimTest::shift) return {c.a, c.b, c.c, c.d};
  if (c.test == ClaimTest::tokens_to_match) {
    std::vector<ArmRef> arms{c.a};
    arms.insert(arms.end(), c.ladder.begin(), c.ladder.end());
    return arms;
  }
  return {c.a, c.b};
}

/// Loss spikes and stalls of one run's validation curve (the rules in the plan's notes).
struct Stability {
  int spikes = 0;          ///< evaluations whose validation loss is above the previous one's
  double worst_rise = 0;   ///< the largest such rise, % of the loss
  bool stalled = false;    ///< < 0.5% improvement over 3 evaluation intervals before the last quarter
};
Stability stability_of(const RunResult& r) {
  Stability s;
  const auto& c = r.curve;
  for (std::size_t i = 1; i < c.size(); ++i)
    if (c[i].loss > c[i - 1].loss) {
      ++s.spikes;
      s.worst_rise = std::max(s.worst_rise, 100 * (c[i].loss - c[i - 1].loss) / c[i - 1].loss);
    }
  if (!c.empty()) {
    const double last_quarter = 0.75 * static_cast<double>(c.back().step);
    for (std::size_t i = 0; i + 3 < c.size(); ++i)
      if (static_cast<double>(c[i + 3].step) <= last_quarter && c[i + 3].loss > c[i].loss * (1 - 0.005)) s.stalled = true;
  }
  return s;
}

/// The largest mean tau over heads and the largest k displacement of any layer at any evaluation.
std::pair<double, double> max_tau_force(const RunResult& r) {
  double tau = 0, force = 0;
  for (const DynamicsPoint& p : r.dynamics_curve)
    for (const LayerDynamics& l : p.layers) {
      double t = 0;
      for (double x : l.tau) t += x;
      if (!l.tau.empty()) tau = std::max(tau, t / static_cast<double>(l.tau.size()));
      force = std::max(force, l.k_displacement);
    }
  return {tau, force};
}

/// x of an arm in a figure: its parameters, its tokens, or the value of a flag in its identity.
double figure_x(const Plan& plan, const std::string& x, const ArmRef& arm, const std::vector<const RunResult*>& runs) {
  if (runs.empty()) return std::nan("");
  if (x == "parameters") return static_cast<double>(runs.front()->parameters);
  if (x == "tokens") return static_cast<double>(runs.front()->tokens);
  const std::string key = "\n" + x + "=";
  const std::string id = "\n" + runs.front()->identity;
  const auto at = id.find(key);
  (void)plan;
  (void)arm;
  if (at == std::string::npos) return std::nan("");
  return std::strtod(id.c_str() + at + key.size(), nullptr);
}

/// Mean and min/max over seeds of the validation curve at each evaluation (points of the first run).
struct Band {
  std::vector<double> tokens, mean, lo, hi;
};
Band band(const std::vector<const RunResult*>& runs) {
  Band b;
  if (runs.empty()) return b;
  const auto& first = runs.front()->curve;
  for (std::size_t i = 0; i < first.size(); ++i) {
    double sum = 0, lo = 1e300, hi = 0;
    int n = 0;
    for (const RunResult* r : runs)
      if (i < r->curve.size()) {
        sum += r->curve[i].ppl;
        lo = std::min(lo, r->curve[i].ppl);
        hi = std::max(hi, r->curve[i].ppl);
        ++n;
      }
    b.tokens.push_back(static_cast<double>(first[i].tokens));
    b.mean.push_back(sum / n);
    b.lo.push_back(lo);
    b.hi.push_back(hi);
  }
  return b;
}

bool have_gnuplot() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

bool run_gnuplot(const fs::path& script) { return train::run_gnuplot(script.string()); }

/// A plot folder of an earlier report: only regular .tsv, .gp and .png files (what write_report
/// writes), so that replacing it loses nothing else.
bool is_plot_folder(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".tsv" && ext != ".gp" && ext != ".png")) return false;
  }
  return !ec;
}

const char* const colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

}  // namespace

std::vector<std::string> write_report(const Plan& plan, const Store& store, const ReportOptions& o) {
  const auto& results = store.results();
  const std::vector<ClaimResult> claims = evaluate(plan, results);
  const fs::path out(o.out);
  const fs::path final_stem = out.parent_path() / out.stem();  // docs/reproduction -> plots in docs/reproduction/
  const fs::path final_json = out.parent_path() / (out.stem().string() + ".json");
  std::error_code ec;
  // Every input is checked before anything is written: the targets, the notes file.
  if (out.filename().empty() || out.stem().empty() || out.stem().string()[0] == '.')
    throw invalid_argument("--out '" + o.out + "' must name a file (e.g. docs/reproduction.md)");
  if (fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    throw invalid_argument("--out '" + o.out + "' exists and is not a file");
  if (fs::exists(final_json, ec) && !fs::is_regular_file(final_json, ec))
    throw invalid_argument("the report's numbers go to '" + final_json.string() + "', which exists and is not a file");
  if (fs::exists(final_stem, ec) && (!fs::is_directory(final_stem, ec) || !is_plot_folder(final_stem)))
    throw invalid_argument("the report's plots go to '" + final_stem.string() + "', which exists and holds other "
                           "things than an earlier report's plots (.tsv, .gp, .png); choose another --out");
  std::string notes_text;
  if (!plan.notes_file.empty()) {
    const fs::path notes = fs::path(plan.path).parent_path() / plan.notes_file;
    std::ifstream in(notes);
    if (!in) throw io_error("plan '" + plan.path + "' names notes file '" + notes.string() + "', which cannot be read");
    std::ostringstream ss;
    ss << in.rdbuf();
    notes_text = ss.str();
  }
  // Everything is written into a temporary folder beside the report and moved into place at the
  // end; on any error the temporary folder (and any folder created for it) is removed, so a failed
  // report leaves the targets as they were.
  fs::path created;  // the first folder of out's parent that did not exist
  for (fs::path p = fs::absolute(out, ec).parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path())
    created = p;
  const fs::path tmp = out.parent_path() / ("." + out.stem().string() + ".report-" + std::to_string(::getpid()));
  fs::create_directories(tmp / out.stem(), ec);
  if (ec) throw io_error("cannot create the folder '" + (tmp / out.stem()).string() + "': " + ec.message());
  struct Cleanup {
    fs::path tmp, created;
    bool done = false;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(tmp, e);
      if (!done && !created.empty()) fs::remove_all(created, e);
    }
  } cleanup{tmp, created};
  const fs::path stem = tmp / out.stem();
  const std::string plots_rel = out.stem().string();  // links relative to the markdown
  std::vector<std::string> written;
  const bool gnuplot = have_gnuplot();
  std::vector<std::string> plot_failures;

  // ---- plots
  std::map<std::string, std::string> claim_plot;  // claim id -> png (relative)
  for (const ClaimResult& cr : claims) {
    const Claim& c = *cr.claim;
    const std::vector<ArmRef> arms = claim_arms(c);
    const std::string name = "claim-" + file_safe(c.id);
    const fs::path tsv = stem / (name + ".tsv"), gp = stem / (name + ".gp"), png = stem / (name + ".png");
    std::ofstream data(tsv);
    int blocks = 0;
    std::vector<std::string> titles;
    for (const ArmRef& arm : arms) {
      const auto runs = arm_results(plan, results, arm);
      if (runs.empty()) continue;
      const Band b = band(runs);
      data << "# " << arm.text() << " (" << runs.size() << " seeds)\n# tokens\tmean\tmin\tmax\n";
      for (std::size_t i = 0; i < b.tokens.size(); ++i)
        data << f("%.0f", b.tokens[i]) << "\t" << b.mean[i] << "\t" << b.lo[i] << "\t" << b.hi[i] << "\n";
      data << "\n\n";
      titles.push_back(plot_text(arm.group + "/" + plan.shown_label(arm)) + " (" + std::to_string(runs.size()) + " seeds)");
      ++blocks;
    }
    data.close();
    if (!blocks) {
      fs::remove(tsv, ec);
      continue;
    }
    written.push_back(tsv.string());
    std::ofstream g(gp);
    g << "set terminal pngcairo size 900,560 font 'sans,10'\nset output '" << png.filename().string() << "'\n"
      << "set title " << gnuplot_string("Claim " + c.id + ": validation perplexity (mean; band: min-max over seeds)")
      << "\n"
      << "set xlabel 'training tokens'\nset ylabel 'validation perplexity (log scale)'\nset logscale y\nset grid\n"
      << "set key outside right top\nset format x '%.1s%c'\nset style fill transparent solid 0.18 noborder\n";
    if ((c.test == ClaimTest::tokens_to_target || c.test == ClaimTest::tokens_to_match) && cr.a_ppl > 0)
      g << "set arrow from graph 0, first " << cr.a_ppl << " to graph 1, first " << cr.a_ppl
        << " nohead dt 2 lc rgb '#555555'\nset label " << gnuplot_string(plot_text(c.a.text()) + " final") << " at graph 0.02, first "
        << cr.a_ppl * 1.02 << "\n";
    g << "plot ";
    for (int i = 0; i < blocks; ++i) {
      const char* col = colours[i % 6];
      g << (i ? ", \\\n     " : "") << "'" << tsv.filename().string() << "' index " << i
        << " using 1:3:4 with filledcurves lc rgb '" << col << "' notitle, \\\n     '" << tsv.filename().string()
        << "' index " << i << " using 1:2 with linespoints lw 2 pt 7 ps 0.5 lc rgb '" << col << "' title "
        << gnuplot_string(titles[static_cast<std::size_t>(i)]);
    }
    g << "\n";
    g.close();
    if (gnuplot) {
      if (run_gnuplot(gp)) {
        claim_plot[c.id] = plots_rel + "/" + name + ".png";
        written.push_back(png.string());
      } else {
        plot_failures.push_back(gp.string());
      }
    }
    written.push_back(gp.string());
  }

  // per-seed paired differences of the paired claims, with the mean and its interval: one panel
  // per claim, each on its own scale (an arm at -41% must not flatten the others)
  std::string paired_plot;
  {
    const fs::path tsv = stem / "paired.tsv", gp = stem / "paired.gp", png = stem / "paired.png";
    std::ofstream data(tsv);
    std::vector<std::string> ids;
    for (const ClaimResult& cr : claims) {
      const ClaimTest t = cr.claim->test;
      if (t != ClaimTest::better && t != ClaimTest::worse && t != ClaimTest::equivalent) continue;
      if (cr.values.empty()) continue;
      ids.push_back(cr.claim->id);
      data << "# claim " << cr.claim->id << ": seed, change %\n";
      for (std::size_t i = 0; i < cr.values.size(); ++i) data << cr.seeds[i] << "\t" << cr.values[i] << "\n";
      data << "\n\n# mean, lo, hi\n0\t" << cr.estimate.mean << "\t" << cr.estimate.lo << "\t" << cr.estimate.hi << "\n\n\n";
    }
    data.close();
    if (!ids.empty()) {
      written.push_back(tsv.string());
      const int n = static_cast<int>(ids.size()), cols = std::min(n, 5), rows_n = (n + cols - 1) / cols;
      std::ofstream g(gp);
      g << "set terminal pngcairo size " << 260 * cols << "," << 230 * rows_n + 50 << " font 'sans,8'\nset output '"
        << png.filename().string() << "'\nset multiplot layout " << rows_n << "," << cols
        << " title 'Paired valid-ppl change of a vs b per seed (%; negative: a is better): seeds (dots), mean and 95% CI (bar at 0); each panel its own scale'\n"
        << "set grid ytics\nset key off\nset xrange [-0.8:*]\nset xtics ('mean' 0)\nset offsets 0, 0.6, graph 0.1, graph 0.1\n";
      for (int i = 0; i < n; ++i)
        g << "set title " << gnuplot_string("claim " + ids[static_cast<std::size_t>(i)]) << "\nplot '" << tsv.filename().string()
          << "' index " << 2 * i << " using 1:2 with points pt 7 ps 0.7 lc rgb '#1f77b4', '" << tsv.filename().string()
          << "' index " << 2 * i + 1 << " using 1:2:3:4 with yerrorbars pt 5 ps 0.9 lw 2 lc rgb '#d62728', 0 with lines lc rgb '#000000'\n";
      g << "unset multiplot\n";
      g.close();
      written.push_back(gp.string());
      if (gnuplot) {
        if (run_gnuplot(gp)) {
          paired_plot = plots_rel + "/paired.png";
          written.push_back(png.string());
        } else {
          plot_failures.push_back(gp.string());
        }
      }
    } else {
      fs::remove(tsv, ec);
    }
  }

  // step sweeps: per group, the variants of one attention name with several step counts
  std::vector<std::pair<std::string, std::string>> sweep_plots;  // title, png
  for (const Group& g : plan.groups) {
    std::map<std::string, std::vector<const VariantSpec*>> by_name;
    for (const VariantSpec& v : g.variants) by_name[v.attention].push_back(&v);
    for (const auto& [name, vs] : by_name) {
      if (vs.size() < 2) continue;
      const std::string base = "steps-" + file_safe(g.name) + "-" + file_safe(name);
      const fs::path tsv = stem / (base + ".tsv"), gp = stem / (base + ".gp"), png = stem / (base + ".png");
      std::ofstream data(tsv);
      data << "# steps\tmean valid ppl\tlo\thi\tseeds\n";
      int rows = 0;
      for (const VariantSpec* v : vs) {
        std::vector<double> ppl;
        for (const RunResult* r : arm_results(plan, results, ArmRef{g.name, v->label})) ppl.push_back(r->valid_ppl);
        const Estimate e = mean_ci(ppl);
        if (e.n == 0) continue;
        data << v->steps << "\t" << e.mean << "\t" << e.lo << "\t" << e.hi << "\t" << e.n << "\n";
        ++rows;
      }
      data.close();
      if (rows < 2) {
        fs::remove(tsv, ec);
        continue;
      }
      written.push_back(tsv.string());
      std::ofstream gs(gp);
      gs << "set terminal pngcairo size 700,480 font 'sans,10'\nset output '" << png.filename().string() << "'\n"
         << "set title " << gnuplot_string(g.name + "/" + name + ": final validation perplexity vs integration steps (mean, 95% CI)")
         << "\n"
         << "set xlabel 'steps N'\nset ylabel 'validation perplexity'\nset grid\nset xrange [0:8]\nset key off\n"
         << "plot '" << tsv.filename().string() << "' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '#1f77b4'\n";
      gs.close();
      written.push_back(gp.string());
      if (gnuplot) {
        if (run_gnuplot(gp)) {
          sweep_plots.emplace_back(g.name + "/" + name, plots_rel + "/" + base + ".png");
          written.push_back(png.string());
        } else {
          plot_failures.push_back(gp.string());
        }
      }
    }
  }

  // the plan's figures: one panel per series, each on its own scale, x from the arms
  std::vector<std::pair<std::string, std::string>> figure_plots;  // title, png
  for (const Figure& fig : plan.figures) {
    const std::string base = "figure-" + file_safe(fig.id);
    const fs::path gp = stem / (base + ".gp"), png = stem / (base + ".png");
    std::vector<std::pair<std::string, int>> panels;  // label, rows
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
    for (std::size_t si = 0; si < fig.series.size(); ++si) {  // one data file per panel
      const Figure::Series& series = fig.series[si];
      const fs::path tsv = stem / (base + "-" + std::to_string(si) + ".tsv");
      std::ofstream data(tsv);
      data << "# " << plot_text(series.label) << "\n# x\tmean\tlo\thi\tseeds\n";
      int rows = 0;
      for (const auto& [a, b] : series.pairs) {
        const auto ra = arm_results(plan, results, a);
        std::vector<double> values;
        if (fig.kind == "change") {
          const auto rb = arm_results(plan, results, b);
          std::map<std::uint64_t, double> bs;
          for (const RunResult* r : rb) bs[r->seed] = r->valid_ppl;
          for (const RunResult* r : ra)
            if (bs.count(r->seed)) values.push_back(100 * (r->valid_ppl - bs[r->seed]) / bs[r->seed]);
        } else {
          for (const RunResult* r : ra) values.push_back(r->valid_ppl);
        }
        const double x = figure_x(plan, fig.x, a, ra);
        if (values.empty() || !std::isfinite(x)) continue;
        const Estimate e = mean_ci(values);
        data << x << "\t" << e.mean << "\t" << e.lo << "\t" << e.hi << "\t" << e.n << "\n";
        xmin = std::min(xmin, x);
        xmax = std::max(xmax, x);
        ++rows;
      }
      data.close();
      written.push_back(tsv.string());
      panels.emplace_back(series.label, rows);
    }
    if (std::none_of(panels.begin(), panels.end(), [](const auto& p) { return p.second > 0; })) {
      figure_plots.emplace_back(fig.title, "");  // said in the report: no finished runs yet
      for (std::size_t si = 0; si < fig.series.size(); ++si) {
        fs::remove(stem / (base + "-" + std::to_string(si) + ".tsv"), ec);
        written.pop_back();
      }
      continue;
    }
    // one x range for every panel, wide enough for a single point
    const double x0 = fig.log_x ? xmin / 1.5 : xmin - std::max(1e-9, 0.1 * (xmax - xmin) + (xmax == xmin ? 0.5 * std::fabs(xmin) + 1 : 0));
    const double x1 = fig.log_x ? xmax * 1.5 : xmax + std::max(1e-9, 0.1 * (xmax - xmin) + (xmax == xmin ? 0.5 * std::fabs(xmax) + 1 : 0));
    const int n = static_cast<int>(panels.size());
    const int cols = n <= 2 ? n : (n <= 4 ? 2 : 3), rows_n = (n + cols - 1) / cols;
    std::ofstream g(gp);
    g << "set terminal pngcairo size " << 480 * cols << "," << 340 * rows_n + 40 << " font 'sans,9'\nset output '"
      << png.filename().string() << "'\nset multiplot layout " << rows_n << "," << cols << " title "
      << gnuplot_string(plot_text(fig.title) + " (mean, 95% CI)") << "\nset grid\nset key off\n"
      << (fig.log_x ? "set logscale x\n" : "") << "set xlabel " << gnuplot_string(fig.x) << "\nset ylabel "
      << gnuplot_string(fig.kind == "change" ? "change of valid ppl vs b (%)" : "final valid ppl") << "\n"
      << "set xrange [" << x0 << ":" << x1 << "]\nset offsets 0, 0, graph 0.05, graph 0.05\n";
    for (int i = 0; i < n; ++i) {
      g << "set title " << gnuplot_string(plot_text(panels[static_cast<std::size_t>(i)].first)) << "\n";
      if (panels[static_cast<std::size_t>(i)].second == 0) {
        g << "unset arrow\nset label 1 'no finished runs yet' at graph 0.3, graph 0.5\nplot [] [0:1] NaN notitle\nunset label 1\n";
        continue;
      }
      g << (fig.kind == "change" ? "set arrow 1 from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'\n"
                                 : "unset arrow 1\n")
        << "plot '" << base << "-" << i << ".tsv' using 1:2:3:4 with yerrorlines pt 7 lw 2 lc rgb '" << colours[i % 6]
        << "' notitle\n";
    }
    g << "unset multiplot\n";
    g.close();
    written.push_back(gp.string());
    if (gnuplot) {
      if (run_gnuplot(gp)) {
        figure_plots.emplace_back(fig.title, plots_rel + "/" + base + ".png");
        written.push_back(png.string());
      } else {
        plot_failures.push_back(gp.string());
      }
    }
  }

  // the dynamics over training: per layer, |q'-q|/|q|, |k'-k|/|k| and mean tau against tokens,
  // mean over seeds, one panel per quantity and layer, one line per arm
  std::string dynamics_plot;
  {
    std::vector<std::pair<std::string, std::vector<const RunResult*>>> arms;  // arms with diagnostics over training
    std::set<std::string> seen_runs;
    for (const Group& g : plan.groups)
      for (const VariantSpec& v : g.variants) {
        const ArmRef arm{g.name, v.label};
        auto runs = arm_results(plan, results, arm);
        runs.erase(std::remove_if(runs.begin(), runs.end(), [](const RunResult* r) { return r->dynamics_curve.empty(); }),
                   runs.end());
        if (runs.empty() || g.name != plan.groups.front().name) continue;  // the first group: the main comparison
        arms.emplace_back(plot_text(arm.group + "/" + plan.shown_label(arm)), runs);
      }
    std::size_t layers = 0;
    for (const auto& [label, runs] : arms)
      for (const RunResult* r : runs)
        for (const DynamicsPoint& p : r->dynamics_curve) layers = std::max(layers, p.layers.size());
    if (!arms.empty() && layers > 0) {
      const fs::path tsv = stem / "dynamics.tsv", gp = stem / "dynamics.gp", png = stem / "dynamics.png";
      std::ofstream data(tsv);
      for (const auto& [label, runs] : arms) {
        data << "# " << label << " (" << runs.size() << " seeds)\n# tokens";
        for (std::size_t l = 0; l < layers; ++l) data << "\tq" << l << "\tk" << l << "\ttau" << l;
        data << "\n";
        const auto& first = runs.front()->dynamics_curve;
        for (std::size_t i = 0; i < first.size(); ++i) {
          data << first[i].tokens;
          for (std::size_t l = 0; l < layers; ++l) {
            double q = 0, k = 0, t = 0;
            int n = 0;
            for (const RunResult* r : runs)
              if (i < r->dynamics_curve.size() && l < r->dynamics_curve[i].layers.size()) {
                const LayerDynamics& d = r->dynamics_curve[i].layers[l];
                q += d.q_displacement;
                k += d.k_displacement;
                double tau = 0;
                for (double x : d.tau) tau += x;
                t += d.tau.empty() ? 0 : tau / static_cast<double>(d.tau.size());
                ++n;
              }
            data << "\t" << (n ? q / n : 0) << "\t" << (n ? k / n : 0) << "\t" << (n ? t / n : 0);
          }
          data << "\n";
        }
        data << "\n\n";
      }
      data.close();
      written.push_back(tsv.string());
      std::ofstream g(gp);
      const std::size_t cols = 3, rows_n = layers;
      g << "set terminal pngcairo size 1500," << 320 * rows_n + 110 << " font 'sans,9'\nset output '" << png.filename().string()
        << "'\nset multiplot layout " << rows_n << "," << cols << " title "
        << gnuplot_string("Dynamics over training (" + arms.front().second.front()->group +
                          " group; mean over seeds, on the first validation windows)")
        << "\nset grid\nset xlabel 'training tokens'\nset format x '%.1s%c'\n";
      const char* what[] = {"relative displacement of q", "relative displacement of k (3c: force impulse over k)",
                            "tau (mean over heads)"};
      for (std::size_t l = 0; l < layers; ++l)
        for (std::size_t qty = 0; qty < 3; ++qty) {
          g << "set title " << gnuplot_string("layer " + std::to_string(l) + ": " + what[qty]) << "\n";
          const bool legend = l == 0 && qty == 2;
          g << (legend ? "set key outside right top\n" : "set key off\n") << "plot ";
          for (std::size_t a = 0; a < arms.size(); ++a)
            g << (a ? ", \\\n     " : "") << "'" << tsv.filename().string() << "' index " << a << " using 1:"
              << 2 + 3 * l + qty << " with linespoints pt 7 ps 0.4 lw 2 lc rgb '" << colours[a % 6] << "'"
              << (a >= 6 ? " dt 2" : "") << " title " << gnuplot_string(arms[a].first);
          g << "\n";
        }
      g << "unset multiplot\n";
      g.close();
      written.push_back(gp.string());
      if (gnuplot) {
        if (run_gnuplot(gp)) {
          dynamics_plot = plots_rel + "/dynamics.png";
          written.push_back(png.string());
        } else {
          plot_failures.push_back(gp.string());
        }
      }
    }
  }

  // ---- the numbers as JSON (for tests and other tools)
  {
    json j;
    j["plan"] = plan.name;
    j["runs"] = plan.runs.size();
    j["finished"] = results.size();
    json cs = json::array();
    for (const ClaimResult& cr : claims) {
      json c;
      c["id"] = cr.claim->id;
      c["test"] = to_string(cr.claim->test);
      c["seeds"] = cr.seeds;
      c["values"] = cr.values;
      c["n"] = cr.estimate.n;
      c["mean"] = cr.estimate.mean;
      c["sd"] = cr.estimate.sd;
      c["lo"] = cr.estimate.lo;
      c["hi"] = cr.estimate.hi;
      c["a_ppl"] = cr.a_ppl;
      c["b_ppl"] = cr.b_ppl;
      c["runs_needed"] = cr.runs_needed;
      c["runs_done"] = cr.runs_done;
      c["versions"] = cr.versions;
      c["verdict"] = cr.verdict;
      c["diverged"] = cr.diverged;
      if (cr.claim->test == ClaimTest::tokens_to_match) c["censored"] = cr.censored;
      cs.push_back(c);
    }
    j["claims"] = cs;
    json ch = json::array();
    for (const Choice& c : plan.choices) {
      json x;
      x["name"] = c.name;
      x["resolved"] = c.resolved;
      if (c.kind == Choice::Kind::variant) x["value"] = c.value;
      else x["per_label"] = c.per_label;
      json sc = json::object();
      for (const auto& [k, v] : c.scores) sc[k] = {{"mean_valid_loss", v.first}, {"seeds", v.second}};
      x["scores"] = sc;
      ch.push_back(x);
    }
    j["choices"] = ch;
    const fs::path path = tmp / final_json.filename();
    std::ofstream js(path);
    js << j.dump(1) << "\n";
    if (!js) throw io_error("cannot write '" + path.string() + "'");
  }

  // ---- the markdown
  double cpu_seconds = 0;
  std::map<std::string, int> machines, versions;
  std::set<int> threads;
  for (const auto& [id, r] : results) {
    cpu_seconds += r.train_seconds * std::max(1, r.threads);
    machines[r.machine + " (" + r.device + ")"]++;
    versions[r.code_version]++;
    threads.insert(r.threads);
  }
  std::ostringstream md;
  md << "# Reproduction study: does coupling help? (plan `" << plan.name << "`)\n\n"
     << "<!-- Generated by `coupledqk-study report`: edit the plan (" << plan.path
     << ") or its notes file and regenerate, rather than this file. -->\n\n";
  if (!plan.description.empty()) md << plan.description << "\n\n";
  std::map<std::string, const ClaimResult*> claim_by_id;
  for (const ClaimResult& cr : claims) claim_by_id[cr.claim->id] = &cr;
  if (!plan.summary.title.empty()) {
    md << "## " << plan.summary.title << "\n\n| claim |";
    for (const std::string& c : plan.summary.columns) md << " " << c << " |";
    md << "\n|---|";
    for (std::size_t i = 0; i < plan.summary.columns.size(); ++i) md << "---|";
    md << "\n";
    for (const Summary::Row& row : plan.summary.rows) {
      md << "| " << row.label << " |";
      for (const std::string& id : row.claims) {
        if (id.empty()) {
          md << " - |";
          continue;
        }
        const ClaimResult& cr = *claim_by_id.at(id);
        md << " **" << cr.verdict << "** " << show_estimate(cr) << " (" << id << ", " << cr.seeds.size() << " seeds"
           << (cr.runs_done < cr.runs_needed ? ", " + std::to_string(cr.runs_done) + "/" + std::to_string(cr.runs_needed) + " runs" : "")
           << ") |";
      }
      md << "\n";
    }
    md << "\nEach cell: the verdict by the rule stated before the runs, the estimate with its 95% interval (a % change "
       << "of validation perplexity, negative = better, or a ratio), the claim it comes from (details below) and its "
       << "seeds. A cell with runs still missing is computed on the complete seeds.\n\n";
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  md << "- **Runs**: " << results.size() << " of " << plan.runs.size() << " finished";
  if (results.size() < plan.runs.size()) md << " (" << plan.runs.size() - results.size() << " pending: see below)";
  md << "; report generated " << date << ".\n"
     << "- **CPU time so far**: " << f("%.1f", cpu_seconds / 3600) << " core-hours of training ("
     << "sum over runs of training seconds x threads; evaluations and data preparation excluded)"
     << (plan.cpu_time.empty() ? std::string(".") : "; the plan's estimate for all runs: " + plan.cpu_time + ".") << "\n";
  md << "- **Machines**: ";
  bool first = true;
  for (const auto& [m, n] : machines) {
    md << (first ? "" : "; ") << m << ": " << n << " runs";
    first = false;
  }
  md << (machines.empty() ? "none yet" : "") << "; threads per run: ";
  first = true;
  for (int t : threads) {
    md << (first ? "" : ", ") << t;
    first = false;
  }
  md << "\n- **Code versions** (`git describe` of the build): ";
  first = true;
  for (const auto& [v, n] : versions) {
    md << (first ? "" : "; ") << "`" << v << "`: " << n << " runs";
    first = false;
  }
  md << (versions.size() > 1 ? " (**mixed**: claims whose runs span several versions are marked below)" : "") << "\n";
  if (!store.orphans().empty())
    md << "- " << store.orphans().size() << " stored results belong to runs this plan no longer has; they are not used.\n";
  md << "\n## The claims\n\n"
     << "| claim | comparison | seeds | a: valid ppl | b: valid ppl | estimate [95% CI] | paper | verdict |\n"
     << "|---|---|---:|---:|---:|---:|---|---|\n";
  for (const ClaimResult& cr : claims) {
    const Claim& c = *cr.claim;
    auto shown = [&](const ArmRef& a) { return a.group + "/" + plan.shown_label(a); };
    std::string comparison = "a = " + shown(c.a) + ", b = " + shown(c.b);
    if (c.test == ClaimTest::shift) comparison += "; vs c = " + shown(c.c) + ", d = " + shown(c.d);
    if (c.test == ClaimTest::tokens_to_match) {
      comparison = "a = " + shown(c.a) + "; ladder = ";
      for (std::size_t i = 0; i < c.ladder.size(); ++i) comparison += (i ? ", " : "") + shown(c.ladder[i]);
    }
    std::string verdict = "**" + cr.verdict + "**";
    if (cr.verdict != "pending" && cr.runs_done < cr.runs_needed)
      verdict += " (partial: " + std::to_string(cr.runs_done) + "/" + std::to_string(cr.runs_needed) + " runs)";
    if (cr.verdict == "pending")
      verdict += " (" + std::to_string(cr.runs_done) + "/" + std::to_string(cr.runs_needed) + " runs)";
    if (cr.versions.size() > 1) verdict += " (mixed code versions)";
    if (cr.diverged > 0) verdict += " (" + std::to_string(cr.diverged) + " seeds left out: a run diverged)";
    if (cr.censored > 0) verdict += " (" + std::to_string(cr.censored) + " seeds extrapolated beyond the ladder)";
    md << "| " << c.id << ". " << c.title << " | " << comparison << " (" << to_string(c.test)
       << (c.test == ClaimTest::equivalent ? ", margin ±" + f("%.2g", c.margin) + "%" : std::string()) << ") | "
       << cr.seeds.size() << " | " << (cr.seeds.empty() ? "-" : f("%.2f", cr.a_ppl)) << " | "
       << (cr.seeds.empty() ? "-" : f("%.2f", cr.b_ppl)) << " | " << show_estimate(cr) << " | " << c.paper << " | "
       << verdict << " |\n";
  }
  md << "\n**How to read it.** Each seed trains every variant of a group from the same initial shared weights and "
     << "on the same batches, so differences are paired by seed. Perplexities are on the whole validation split "
     << "at the end of training (the test split is in the per-arm table). The estimate is the mean over seeds with "
     << "a two-sided 95% Student-t interval (n - 1 degrees of freedom). Verdicts, stated before any run:\n\n"
     << "- `better` (the paper says a beats b): **reproduced** if the whole interval of the % change is below 0, "
     << "**contradicted** if it is entirely above 0, else **inconclusive**; `worse` the other way round.\n"
     << "- `equivalent` (the paper says no difference): **reproduced** if the interval lies inside ±margin, "
     << "**contradicted** if it lies entirely outside, else **inconclusive**.\n"
     << "- `spread_ratio`: ratio of the seed standard deviations of a and b, with the F-distribution interval; "
     << "reproduced if it is entirely above 1.\n"
     << "- `tokens_to_target`: per seed, the training tokens at which b's validation curve first reaches a's final "
     << "validation perplexity (log-linear between evaluations; the end of b's run if it never does), over the "
     << "tokens a trained on; reproduced if the interval is entirely above 1 (b needs more data).\n"
     << "- `shift`: the % change of a vs b minus the % change of c vs d, with Welch's interval; reproduced if "
     << "entirely above 0 (coupling helps less, or hurts more, in the a/b setting).\n"
     << "- `tokens_to_match`: per seed, the tokens the ladder's variant (runs at growing budgets, each with its own "
     << "full schedule) needs to reach a's final validation perplexity, linear in log tokens between the final "
     << "perplexities of the two budgets that bracket it (outside the ladder: extrapolated along the nearest "
     << "segment and counted as censored), over a's tokens; reproduced if the interval is entirely above 1.\n"
     << "- A seed with a diverged run is left out of the claims that name it (the stability table lists it).\n"
     << "- **pending**: fewer than 2 seeds with every run finished. A claim is computed on the seeds that are "
     << "complete; `partial` says how many of its runs are.\n\n";
  if (!paired_plot.empty()) md << "![paired differences per seed](" << paired_plot << ")\n\n";

  if (!plan.choices.empty()) {
    md << "## What the plan chose\n\nThe plan's rules pick from finished runs (the lowest mean final validation loss "
       << "over the seeds of the group; a diverged run counts as infinitely bad); the groups that use a choice are "
       << "trained once it is made.\n\n";
    for (const Choice& ch : plan.choices) {
      md << "- **" << ch.name << "**: ";
      if (ch.kind == Choice::Kind::variant) {
        md << "the variant of group `" << ch.groups.front() << "` among ";
        for (std::size_t i = 0; i < ch.among.size(); ++i) md << (i ? ", " : "") << "`" << ch.among[i] << "`";
        md << ": " << (ch.resolved ? "**" + ch.value + "**" : std::string("not yet (its runs are not all finished)"));
      } else {
        md << "`" << ch.flag << "` per variant, among groups ";
        for (std::size_t i = 0; i < ch.groups.size(); ++i) md << (i ? ", " : "") << "`" << ch.groups[i] << "`";
        md << ": ";
        if (ch.per_label.empty()) md << "not yet";
        bool firstl = true;
        for (const auto& entry : ch.per_label) {
          const std::string& label = entry.first;  // not a structured binding: a C++17 lambda cannot capture one
          const auto& value = entry.second;
          const std::string& gname = ch.per_label_group.at(label);
          // at an end of the sweep (by the flag's numeric value): the rule says extend it
          std::vector<std::pair<double, std::string>> values;
          for (const std::string& gn : ch.groups) {
            const Group& gg = plan.groups[plan.group_index.at(gn)];
            if (std::any_of(gg.variants.begin(), gg.variants.end(), [&](const VariantSpec& v) { return v.label == label; }))
              values.emplace_back(std::strtod((gg.set.count(ch.flag) ? gg.set.at(ch.flag) : plan.defaults.at(ch.flag)).c_str(), nullptr), gn);
          }
          std::sort(values.begin(), values.end());
          const bool edge = values.size() > 2 && (values.front().second == gname || values.back().second == gname);
          md << (firstl ? "" : "; ") << "`" << label << "` " << value << " (" << gname << ")"
             << (edge ? " **at the end of the sweep: extend it**" : "");
          firstl = false;
        }
      }
      if (!ch.scores.empty()) {
        md << ". Mean final valid loss (seeds): ";
        bool firsts = true;
        for (const auto& [k, v] : ch.scores) {
          md << (firsts ? "" : ", ") << k << " " << (std::isfinite(v.first) ? f("%.4f", v.first) : std::string("diverged")) << " ("
             << v.second << ")";
          firsts = false;
        }
      }
      md << "\n";
    }
    md << "\n";
  }
  for (const auto& [title, png] : figure_plots)
    md << (png.empty() ? "*(figure: " + title + ": no finished runs yet)*" : "![" + title + "](" + png + ")") << "\n\n";

  md << "## Per claim\n\n";
  for (const ClaimResult& cr : claims) {
    const Claim& c = *cr.claim;
    md << "### " << c.id << ". " << c.title << "\n\n"
       << "- statistic: " << cr.statistic << "\n- paper: " << (c.paper.empty() ? "-" : c.paper) << "\n"
       << "- estimate: " << show_estimate(cr) << "; verdict **" << cr.verdict << "** (" << cr.runs_done << "/"
       << cr.runs_needed << " runs finished)\n";
    if (!cr.values.empty()) {
      md << "- per seed: ";
      const bool percent = c.test != ClaimTest::tokens_to_target && c.test != ClaimTest::tokens_to_match;
      for (std::size_t i = 0; i < cr.values.size(); ++i)
        md << (i ? ", " : "") << "seed " << cr.seeds[i] << ": " << f(percent ? "%+.2f%%" : "%.2fx", cr.values[i]);
      md << "\n";
    }
    if (cr.diverged > 0) md << "- " << cr.diverged << " seeds left out: one of their runs diverged\n";
    if (cr.censored > 0) md << "- " << cr.censored << " seeds extrapolated: a's perplexity lies outside the ladder's\n";
    md << "\n";
    const auto it = claim_plot.find(c.id);
    if (it != claim_plot.end()) md << "![claim " << c.id << " curves](" << it->second << ")\n\n";
  }
  for (const auto& [title, png] : sweep_plots) md << "![step sweep " << title << "](" << png << ")\n\n";

  // per-arm table and diagnostics
  md << "## Every arm\n\n"
     << "| arm | seeds done | valid ppl (mean ± sd) | test ppl | parameters | dynamics | tokens | tokens/s |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  std::ostringstream diag;
  for (const Group& g : plan.groups)
    for (const VariantSpec& v : g.variants) {
      const ArmRef arm{g.name, v.label};
      const auto runs = arm_results(plan, results, arm);
      std::vector<double> vp, tp, tps;
      for (const RunResult* r : runs) {
        vp.push_back(r->valid_ppl);
        tp.push_back(r->test_ppl);
        tps.push_back(r->tokens_per_s);
      }
      const Estimate ev = mean_ci(vp), et = mean_ci(tp), es = mean_ci(tps);
      md << "| " << arm.group << "/" << plan.shown_label(arm) << " | " << runs.size() << "/" << g.seeds.size() << " | "
         << (runs.empty() ? "-" : f("%.2f", ev.mean) + " ± " + f("%.2f", ev.sd)) << " | "
         << (runs.empty() ? "-" : f("%.2f", et.mean)) << " | "
         << (runs.empty() ? "-" : std::to_string(runs.front()->parameters)) << " | "
         << (runs.empty() ? "-" : f("%.2f%%", 100.0 * static_cast<double>(runs.front()->dynamics_parameters) /
                                                 static_cast<double>(runs.front()->parameters)))
         << " | " << (runs.empty() ? "-" : std::to_string(runs.front()->tokens)) << " | "
         << (runs.empty() ? "-" : f("%.0f", es.mean)) << " |\n";
      if (runs.empty() || runs.front()->dynamics.empty()) continue;
      const std::size_t layers = runs.front()->dynamics.size();
      for (std::size_t l = 0; l < layers; ++l) {
        std::vector<double> tau, dq, dk;
        for (const RunResult* r : runs) {
          if (l >= r->dynamics.size()) continue;
          double t = 0;
          for (double x : r->dynamics[l].tau) t += x;
          if (!r->dynamics[l].tau.empty()) tau.push_back(t / static_cast<double>(r->dynamics[l].tau.size()));
          dq.push_back(r->dynamics[l].q_displacement);
          dk.push_back(r->dynamics[l].k_displacement);
        }
        const Estimate a = mean_ci(tau), b = mean_ci(dq), c = mean_ci(dk);
        diag << "| " << arm.group << "/" << plan.shown_label(arm) << " | " << l << " | " << f("%.3f", a.mean) << " ± " << f("%.3f", a.sd) << " | "
             << f("%.4f", b.mean) << " ± " << f("%.4f", b.sd) << " | " << f("%.4f", c.mean) << " ± " << f("%.4f", c.sd)
             << " |\n";
      }
    }
  md << "\nvalid ppl: mean ± sample standard deviation over the finished seeds; tokens/s: training throughput "
     << "(evaluations excluded), which depends on the machine's load and thread count.\n\n";
  md << "## Did the learned map leave the identity?\n\n"
     << "After training, on the first validation windows: per layer, the integration time tau (mean over heads; "
     << "it starts at the plan's init-time, 1 by default) and the mean relative displacement of queries and keys "
     << "over (token, head) pairs, |q' - q| / |q| and |k' - k| / |k|. With `dynamics-init-scale 0` the map starts "
     << "as the identity (displacement 0). Mean ± sd over seeds.\n\n";
  if (diag.str().empty()) {
    md << "(no run with dynamics has finished yet)\n\n";
  } else {
    md << "| arm | layer | tau | \\|q'-q\\|/\\|q\\| | \\|k'-k\\|/\\|k\\| |\n|---|---:|---:|---:|---:|\n"
       << diag.str() << "\n";
  }

  if (!dynamics_plot.empty())
    md << "Over training (at every evaluation; the k displacement of reading 3c is the force's impulse against |k|, "
       << "`drift` has none):\n\n![dynamics over training](" << dynamics_plot << ")\n\n";

  // stability: seed spread, spikes, stalls, divergence; for arms with dynamics, tau and force
  {
    std::ostringstream st;
    bool any_dynamics = false;
    for (const Group& g : plan.groups)
      for (const VariantSpec& v : g.variants) {
        const ArmRef arm{g.name, v.label};
        const auto all = arm_results(plan, results, arm, true);
        if (all.empty()) continue;
        std::vector<double> ppl;
        int spikes = 0, stalled = 0, diverged = 0;
        double worst = 0;
        std::vector<std::string> flagged;  // runs with a stall or a rise > 1%
        std::vector<double> taus, forces;
        for (const RunResult* r : all) {
          if (r->diverged()) {
            ++diverged;
            flagged.push_back("seed " + std::to_string(r->seed) + " diverged at step " + std::to_string(r->diverged_at));
            continue;
          }
          ppl.push_back(r->valid_ppl);
          const Stability sb = stability_of(*r);
          spikes += sb.spikes;
          worst = std::max(worst, sb.worst_rise);
          stalled += sb.stalled;
          const auto [tau, force] = max_tau_force(*r);
          if (!r->dynamics_curve.empty()) {
            any_dynamics = true;
            taus.push_back(tau);
            forces.push_back(force);
          }
          if (sb.stalled || sb.worst_rise > 1)
            flagged.push_back("seed " + std::to_string(r->seed) + (sb.stalled ? " stalled" : "") +
                              (sb.worst_rise > 1 ? " rise " + f("%.1f%%", sb.worst_rise) : "") +
                              (r->dynamics_curve.empty() ? "" : " (max tau " + f("%.2f", tau) + ", max |k'-k|/|k| " + f("%.3f", force) + ")"));
        }
        const Estimate e = mean_ci(ppl);
        const Estimate et = mean_ci(taus), ef = mean_ci(forces);
        st << "| " << arm.group << "/" << plan.shown_label(arm) << " | " << all.size() << " | "
           << (e.n >= 2 ? f("%.2f", e.sd) + " (" + f("%.2f%%", 100 * e.sd / e.mean) + ")" : "-") << " | " << spikes << " | "
           << f("%.2f%%", worst) << " | " << stalled << " | " << diverged << " | "
           << (taus.empty() ? "-" : f("%.2f", et.mean) + " / " + f("%.3f", ef.mean)) << " | ";
        for (std::size_t i = 0; i < flagged.size(); ++i) st << (i ? "; " : "") << flagged[i];
        st << " |\n";
      }
    if (!st.str().empty() && (any_dynamics || !plan.choices.empty())) {
      md << "## Training stability\n\nPer arm: the seed standard deviation of the final validation perplexity; "
         << "loss spikes (evaluations whose validation loss is above the previous one's: count over seeds and the "
         << "largest rise); stalls (less than 0.5% improvement over 3 evaluation intervals before the last quarter of "
         << "the schedule); diverged runs; for arms with dynamics, the mean over seeds of each run's largest tau (mean "
         << "over heads) and largest |k'-k|/|k| at any evaluation; and the runs that stalled, rose by more than 1% or "
         << "diverged, with their own largest tau and force.\n\n"
         << "| arm | runs | seed sd of valid ppl | spikes | largest rise | stalls | diverged | max tau / max force | flagged runs |\n"
         << "|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
         << st.str() << "\n";
    }
  }

  // the wall-clock view: training tokens/s of each arm of the first group against its first
  // variant, paired by seed (runs that shared the machine at the same time see the same load)
  if (!plan.choices.empty() || !plan.figures.empty()) {
    const Group& g0 = plan.groups.front();
    const ArmRef base{g0.name, g0.variants.front().label};
    std::map<std::uint64_t, double> base_speed;
    for (const RunResult* r : arm_results(plan, results, base)) base_speed[r->seed] = r->tokens_per_s;
    std::ostringstream wc;
    for (const VariantSpec& v : g0.variants) {
      const ArmRef arm{g0.name, v.label};
      std::vector<double> speed, ratio;
      for (const RunResult* r : arm_results(plan, results, arm)) {
        speed.push_back(r->tokens_per_s);
        if (base_speed.count(r->seed) && base_speed[r->seed] > 0) ratio.push_back(base_speed[r->seed] / r->tokens_per_s);
      }
      if (speed.empty()) continue;
      const Estimate es = mean_ci(speed), er = mean_ci(ratio);
      wc << "| " << arm.group << "/" << plan.shown_label(arm) << " | " << speed.size() << " | " << f("%.0f", es.mean) << " | "
         << (er.n >= 2 ? f("%.3f", er.mean) + " [" + f("%.3f", er.lo) + ", " + f("%.3f", er.hi) + "]"
                       : er.n == 1 ? f("%.3f", er.mean) + " (1 seed)" : std::string("-"))
         << " |\n";
    }
    if (!wc.str().empty())
      md << "## Wall-clock view\n\nTraining throughput of the arms of group `" << g0.name << "` (evaluations excluded), "
         << "and the time per token of each against `" << base.text() << "`, paired by seed (mean, 95% CI). The runs "
         << "shared the machine with other work, so these ratios are rough; a speed claim needs the benchmarks "
         << "(docs/performance.md).\n\n| arm | runs | tokens/s | time per token vs " << base.variant << " |\n|---|---:|---:|---:|\n"
         << wc.str() << "\n";
  }

  // the run budget: training core-hours per group (a run two groups share counts in its first group)
  if (!plan.choices.empty() || !plan.figures.empty()) {
    md << "## Run budget\n\n| group | runs finished / listed | core-hours of training | rerun it |\n|---|---:|---:|---|\n";
    std::set<std::string> counted;
    for (const Group& g : plan.groups) {
      double seconds = 0;
      int done = 0, listed = 0;
      for (std::uint64_t seed : g.seeds)
        for (const VariantSpec& v : g.variants) {
          ++listed;
          const RunSpec* spec = plan.find(ArmRef{g.name, v.label}, seed);
          if (!spec || !results.count(spec->id)) continue;
          ++done;
          if (counted.insert(spec->id).second) {
            const RunResult& r = results.at(spec->id);
            seconds += r.train_seconds * std::max(1, r.threads);
          }
        }
      md << "| " << g.name << " | " << done << " / " << listed << " | " << f("%.2f", seconds / 3600) << " | `coupledqk-study run "
         << plan.path << " --group " << g.name << "` |\n";
    }
    md << "\nTraining time only (evaluations and data preparation excluded), measured on the machines above while "
       << "other work shared them; `--group` trains the runs of one group that have no result (with "
       << "`--rerun-other-versions`, also those of another code version).\n\n";
  }

  // pending runs
  std::vector<const RunSpec*> pending;
  for (const RunSpec& r : plan.runs)
    if (!store.done(r)) pending.push_back(&r);
  std::ostringstream waiting;
  for (const Group& g : plan.groups) {
    const auto w = g.waiting_for(plan.choices);
    if (w.empty()) continue;
    waiting << "- group `" << g.name << "` (" << g.seeds.size() * g.variants.size() << " runs) waits for choice";
    for (std::size_t i = 0; i < w.size(); ++i) waiting << (i ? ", " : " ") << "`" << w[i] << "`";
    waiting << "\n";
  }
  if (!waiting.str().empty()) md << "## Groups waiting for a choice\n\n" << waiting.str() << "\n";
  if (!pending.empty()) {
    md << "## Pending runs\n\n" << pending.size() << " runs have no result yet: ";
    for (std::size_t i = 0; i < pending.size() && i < 40; ++i) md << (i ? ", " : "") << pending[i]->title();
    if (pending.size() > 40) md << ", ... (" << pending.size() - 40 << " more)";
    md << ".\n\n";
  }
  if (!plan.notes_file.empty()) md << notes_text << "\n";
  md << "## Reproduce\n\n```sh\n" << o.command << "\n```\n\n"
     << "`run` trains what is missing and can be stopped and repeated (`--max-minutes`, Ctrl-C: an interrupted run "
     << "resumes from its checkpoint); `--shard i/n` splits the runs over machines and `merge` gathers their results. "
     << "Per-run results (curves, diagnostics, code version): `" << store.dir() << "`.\n";
  if (!gnuplot) md << "\n(gnuplot is not installed: no plots; the data are in " << final_stem.string() << "/*.tsv)\n";
  for (const std::string& p : plot_failures)
    md << "\n(gnuplot failed on " << (final_stem / fs::path(p).filename()).string() << ")\n";
  {
    std::ofstream mdout(tmp / out.filename());
    mdout << escape_dollars(md.str());
    if (!mdout) throw io_error("cannot write '" + (tmp / out.filename()).string() + "'");
  }

  // ---- into place: the plot folder (an earlier one set aside, then removed), the JSON, the markdown
  const fs::path old_plots = tmp / ".old-plots";
  const bool had_plots = fs::exists(final_stem, ec);
  if (had_plots) fs::rename(final_stem, old_plots, ec);
  if (!ec) fs::rename(stem, final_stem, ec);
  if (ec) {
    std::error_code e;
    if (had_plots && !fs::exists(final_stem, e)) fs::rename(old_plots, final_stem, e);
    throw io_error("cannot move the plots into '" + final_stem.string() + "': " + ec.message());
  }
  fs::rename(tmp / final_json.filename(), final_json, ec);
  if (!ec) fs::rename(tmp / out.filename(), out, ec);
  if (ec) throw io_error("cannot write '" + out.string() + "': " + ec.message());
  cleanup.done = true;
  for (std::string& w : written) w = (final_stem / fs::path(w).filename()).string();
  written.insert(written.begin(), final_json.string());
  written.insert(written.begin(), out.string());
  return written;
}

}  // namespace coupledqk::train::study
