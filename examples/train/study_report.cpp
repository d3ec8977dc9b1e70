// coupledqk-study report: the markdown report, its JSON numbers and its plots (study.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gnuplot.hpp"
#include "study.hpp"

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
  const bool percent = r.claim->test != ClaimTest::spread_ratio && r.claim->test != ClaimTest::tokens_to_target;
  const char* fm = percent ? "%+.2f%%" : "%.2fx";
  const char* fb = percent ? "%+.2f" : "%.2f";
  if (e.n < 2) return f(fm, e.mean) + " (1 seed)";
  return f(fm, e.mean) + " [" + f(fb, e.lo) + ", " + f(fb, e.hi) + "]";
}

/// The runs of an arm that are finished, by seed.
std::vector<const RunResult*> arm_results(const Plan& plan, const std::map<std::string, RunResult>& results,
                                          const ArmRef& arm) {
  std::vector<const RunResult*> out;
  for (const Group& g : plan.groups)
    if (g.name == arm.group)
      for (std::uint64_t s : g.seeds)
        if (const RunSpec* spec = plan.find(arm, s)) {
          const auto it = results.find(spec->id);
          if (it != results.end()) out.push_back(&it->second);
        }
  return out;
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
    std::vector<ArmRef> arms{c.a, c.b};
    if (c.test == ClaimTest::shift) arms = {c.a, c.b, c.c, c.d};
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
      titles.push_back(arm.text() + " (" + std::to_string(runs.size()) + " seeds)");
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
      << "set key top right\nset format x '%.1s%c'\nset style fill transparent solid 0.18 noborder\n";
    if (c.test == ClaimTest::tokens_to_target && cr.a_ppl > 0)
      g << "set arrow from graph 0, first " << cr.a_ppl << " to graph 1, first " << cr.a_ppl
        << " nohead dt 2 lc rgb '#555555'\nset label " << gnuplot_string(c.a.text() + " final") << " at graph 0.02, first "
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

  // per-seed paired differences of the paired claims, with the mean and its interval
  std::string paired_plot;
  {
    const fs::path tsv = stem / "paired.tsv", gp = stem / "paired.gp", png = stem / "paired.png";
    std::ofstream data(tsv);
    std::ofstream means;
    int x = 0;
    std::string tics;
    data << "# x\tclaim\tseed\tchange %\n";
    std::ostringstream mean_lines;
    for (const ClaimResult& cr : claims) {
      const ClaimTest t = cr.claim->test;
      if (t != ClaimTest::better && t != ClaimTest::worse && t != ClaimTest::equivalent) continue;
      ++x;
      tics += (tics.empty() ? "" : ", ") + gnuplot_string(cr.claim->id) + " " + std::to_string(x);
      for (std::size_t i = 0; i < cr.values.size(); ++i)
        data << x << "\t" << cr.claim->id << "\t" << cr.seeds[i] << "\t" << cr.values[i] << "\n";
      if (cr.estimate.n >= 1)
        mean_lines << x << "\t" << cr.estimate.mean << "\t" << cr.estimate.lo << "\t" << cr.estimate.hi << "\n";
    }
    data << "\n\n# x\tmean\tlo\thi\n" << mean_lines.str();
    data.close();
    if (x) {
      written.push_back(tsv.string());
      std::ofstream g(gp);
      g << "set terminal pngcairo size 900,520 font 'sans,10'\nset output '" << png.filename().string() << "'\n"
        << "set title 'Paired validation-perplexity change per seed (a vs b, %), mean and 95% CI'\n"
        << "set ylabel 'change of a vs b (%), negative: a is better'\nset xlabel 'claim'\nset grid ytics\n"
        << "set xrange [0.5:" << x + 0.5 << "]\nset xtics (" << tics << ")\nset key top left\n"
        << "set arrow from graph 0, first 0 to graph 1, first 0 nohead lc rgb '#000000'\n"
        << "plot '" << tsv.filename().string() << "' index 0 using ($1-0.12):4 with points pt 7 ps 0.8 lc rgb '#1f77b4' title 'seed', \\\n"
        << "     '" << tsv.filename().string() << "' index 1 using ($1+0.12):2:3:4 with yerrorbars pt 5 ps 1 lw 2 lc rgb '#d62728' "
        << "title 'mean, 95% CI'\n";
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
      cs.push_back(c);
    }
    j["claims"] = cs;
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
    std::string comparison = "a = " + c.a.text() + ", b = " + c.b.text();
    if (c.test == ClaimTest::shift) comparison += "; vs c = " + c.c.text() + ", d = " + c.d.text();
    std::string verdict = "**" + cr.verdict + "**";
    if (cr.verdict != "pending" && cr.runs_done < cr.runs_needed)
      verdict += " (partial: " + std::to_string(cr.runs_done) + "/" + std::to_string(cr.runs_needed) + " runs)";
    if (cr.verdict == "pending")
      verdict += " (" + std::to_string(cr.runs_done) + "/" + std::to_string(cr.runs_needed) + " runs)";
    if (cr.versions.size() > 1) verdict += " (mixed code versions)";
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
     << "- **pending**: fewer than 2 seeds with every run finished. A claim is computed on the seeds that are "
     << "complete; `partial` says how many of its runs are.\n\n";
  if (!paired_plot.empty()) md << "![paired differences per seed](" << paired_plot << ")\n\n";

  md << "## Per claim\n\n";
  for (const ClaimResult& cr : claims) {
    const Claim& c = *cr.claim;
    md << "### " << c.id << ". " << c.title << "\n\n"
       << "- statistic: " << cr.statistic << "\n- paper: " << (c.paper.empty() ? "-" : c.paper) << "\n"
       << "- estimate: " << show_estimate(cr) << "; verdict **" << cr.verdict << "** (" << cr.runs_done << "/"
       << cr.runs_needed << " runs finished)\n";
    if (!cr.values.empty()) {
      md << "- per seed: ";
      const bool percent = c.test != ClaimTest::tokens_to_target;
      for (std::size_t i = 0; i < cr.values.size(); ++i)
        md << (i ? ", " : "") << "seed " << cr.seeds[i] << ": " << f(percent ? "%+.2f%%" : "%.2fx", cr.values[i]);
      md << "\n";
    }
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
      md << "| " << arm.text() << " | " << runs.size() << "/" << g.seeds.size() << " | "
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
        diag << "| " << arm.text() << " | " << l << " | " << f("%.3f", a.mean) << " ± " << f("%.3f", a.sd) << " | "
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

  // pending runs
  std::vector<const RunSpec*> pending;
  for (const RunSpec& r : plan.runs)
    if (!store.done(r)) pending.push_back(&r);
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
    mdout << md.str();
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
