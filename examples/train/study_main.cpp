// coupledqk-study: runs a reproduction study described by a plan file (studies/*.json), run by run,
// storing each finished run's result; reports the paper's claims with paired confidence intervals.
//
//   coupledqk-study run studies/claims-cpu.json --max-minutes 120     # what is missing, resumable
//   coupledqk-study status studies/claims-cpu.json
//   coupledqk-study report studies/claims-cpu.json                    # docs/reproduction.md + plots
//   coupledqk-study merge studies/claims-cpu.json OTHER_RESULTS_DIR   # results of other shards
//
// docs/reproduction.md (the report) and docs/training.md describe the plan format and the rules.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>

#include "study.hpp"

namespace ct = coupledqk::train;
namespace cs = coupledqk::train::study;
namespace fs = std::filesystem;
using coupledqk::Index;

namespace {



/// "i/n" with 1 <= i <= n.
std::pair<int, int> parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  const std::string a = text.substr(0, slash), b = slash == std::string::npos ? "" : text.substr(slash + 1);
  const std::uint64_t top = 1000000;
  if (slash == std::string::npos || !ct::unsigned_error(a, top).empty() || !ct::unsigned_error(b, top).empty() ||
      std::stoull(b) < 1 || std::stoull(a) < 1 || std::stoull(a) > std::stoull(b))
    throw coupledqk::invalid_argument("--shard '" + ct::bounded_quote(text) +
                                      "'; expected i/n with 1 <= i <= n <= 1000000 (e.g. 1/2 and 2/2)");
  return {static_cast<int>(std::stoull(a)), static_cast<int>(std::stoull(b))};
}

/// Seconds per training token of the finished runs with the same model shape (else of all), for
/// estimates; computed once per store state, so that estimating every run is linear in the plan.
class Speeds {
 public:
  Speeds(const cs::Plan& plan, const cs::Store& store) {
    std::map<std::string, const cs::RunSpec*> by_id;
    for (const cs::RunSpec& s : plan.runs) by_id[s.id] = &s;
    for (const auto& [id, r] : store.results()) {
      const auto it = by_id.find(id);
      if (it == by_id.end() || r.tokens <= 0) continue;
      all_ += r.train_seconds;
      all_tokens_ += static_cast<double>(r.tokens);
      auto& shape = by_shape_[shape_of(*it->second)];
      shape.first += r.train_seconds;
      shape.second += static_cast<double>(r.tokens);
    }
  }
  double per_token(const cs::RunSpec& run) const {
    const auto it = by_shape_.find(shape_of(run));
    if (it != by_shape_.end() && it->second.second > 0) return it->second.first / it->second.second;
    return all_tokens_ > 0 ? all_ / all_tokens_ : 0;
  }
  /// Seconds a run would take (0: unknown).
  double estimate(const cs::RunSpec& run) const {
    // steps > 1 integrate N sub-steps: a rough factor (measured runs of the same shape dominate anyway)
    return per_token(run) * static_cast<double>(ct::effective_budget_tokens(run.options)) *
           (1.0 + 0.1 * (run.variant.steps - 1));
  }

 private:
  static std::string shape_of(const cs::RunSpec& s) {
    const auto& o = s.options;
    return std::to_string(o.dim) + "," + std::to_string(o.layers) + "," + std::to_string(o.seq) + "," +
           std::to_string(o.vocab) + "," + std::to_string(o.heads) + "," + o.device;
  }
  std::map<std::string, std::pair<double, double>> by_shape_;
  double all_ = 0, all_tokens_ = 0;
};

std::string duration(double s) { return s > 0 ? ct::format_duration(s) : std::string("unknown"); }

struct Common {
  std::string plan_path, results, device;
};

cs::Plan load(const Common& c) {
  std::map<std::string, std::string> overrides;
  if (!c.device.empty()) overrides["device"] = c.device;
  return cs::load_plan(c.plan_path, overrides);
}

std::string results_dir(const Common& c, const cs::Plan& plan) {
  if (!c.results.empty()) return c.results;
  return (fs::path(c.plan_path).parent_path() / "results" / plan.name).string();
}

/// The runs this process is responsible for (its shard), in plan order, as indices into plan.runs
/// (which grows as choices are resolved), from index `from` on.
std::vector<std::size_t> shard_runs(const cs::Plan& plan, std::pair<int, int> shard, std::size_t from = 0) {
  std::vector<std::size_t> out;
  for (std::size_t i = from; i < plan.runs.size(); ++i)
    if (cs::in_shard(plan.runs[i], shard)) out.push_back(i);
  return out;
}

/// "group g waits for choice(s) x, y" lines of the groups whose runs do not exist yet.
void print_waiting(const cs::Plan& plan) {
  for (const cs::Group& g : plan.groups) {
    const auto w = g.waiting_for(plan.choices);
    if (w.empty()) continue;
    std::string list;
    for (const auto& n : w) list += (list.empty() ? "" : ", ") + n;
    std::cout << "  group " << g.name << ": waits for choice " << list << " (" << g.seeds.size() * g.variants.size()
              << " runs once made)\n";
  }
  for (const cs::Choice& ch : plan.choices) {
    if (ch.kind == cs::Choice::Kind::variant && ch.resolved) std::cout << "  choice " << ch.name << " = " << ch.value << "\n";
    for (const auto& [label, value] : ch.per_label)
      std::cout << "  choice " << ch.name << " for " << label << " = " << value << " (group " << ch.per_label_group.at(label) << ")\n";
  }
}

int status(const Common& c) {
  cs::Plan plan = load(c);
  cs::Store store(plan, results_dir(c, plan));
  cs::resolve(plan, store);
  std::map<std::string, int> versions;
  for (const auto& [id, r] : store.results()) versions[r.code_version]++;
  std::cout << "plan " << plan.name << " (" << plan.path << "): " << store.results().size() << " of " << plan.runs.size()
            << " runs finished, results in " << store.dir() << "\n";
  double left = 0;
  bool unknown = false;
  const Speeds speeds(plan, store);
  print_waiting(plan);
  for (const cs::Group& g : plan.groups) {
    if (!g.expanded) continue;
    int done = 0, total = 0;
    for (std::uint64_t s : g.seeds)
      for (const cs::VariantSpec& v : g.variants) {
        const cs::RunSpec* r = plan.find(cs::ArmRef{g.name, v.label}, s);
        ++total;
        done += store.done(*r);
      }
    std::cout << "  group " << g.name << ": " << done << "/" << total << "\n";
  }
  for (const cs::RunSpec& r : plan.runs)
    if (!store.done(r)) {
      const double e = speeds.estimate(r);
      left += e;
      unknown |= e <= 0;
    }
  std::cout << "estimated time left (one process): " << (unknown && left == 0 ? "unknown" : duration(left))
            << (unknown && left > 0 ? " (plus runs of shapes not measured yet)" : "") << "\n";
  for (const auto& [v, n] : versions)
    std::cout << "code version " << v << ": " << n << " runs" << (v == cs::code_version() ? " (this build)" : "") << "\n";
  if (!store.orphans().empty())
    std::cout << store.orphans().size() << " stored results are not runs of this plan (kept, not used)\n";
  return 0;
}

int report(const Common& c, const std::string& out, int argc, char** argv) {
  cs::Plan plan = load(c);
  cs::Store store(plan, results_dir(c, plan));
  cs::resolve(plan, store);
  cs::ReportOptions o;
  o.out = out;
  o.command = "build/examples/train/coupledqk-study run " + ct::shell_quote(plan.path) + "\n";
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + ct::shell_quote(i == 0 ? "build/examples/train/coupledqk-study" : argv[i]);
  o.command += cmd;
  const auto files = cs::write_report(plan, store, o);
  std::cout << "wrote " << files.front() << " (" << store.results().size() << " of " << plan.runs.size()
            << " runs) and " << files.size() - 1 << " files beside it\n";
  for (const cs::ClaimResult& r : cs::evaluate(plan, store.results()))
    std::cout << "  claim " << r.claim->id << ": " << r.verdict << " (" << r.runs_done << "/" << r.runs_needed
              << " runs)\n";
  return 0;
}

int merge(const Common& c, const std::vector<std::string>& dirs) {
  cs::Plan plan = load(c);
  cs::Store store(plan, results_dir(c, plan));
  cs::resolve(plan, store);
  for (const std::string& d : dirs) {
    // Results of runs that exist once a choice is resolved are copied in further rounds.
    int copied = 0, present = 0;
    for (;;) {
      const auto [c1, p1] = store.merge(d);
      copied += c1;
      present = p1;
      if (c1 == 0 || cs::resolve(plan, store) == 0) break;
    }
    std::cout << "merged " << d << ": " << copied << " results copied, " << present << " already here\n";
  }
  return 0;
}

struct RunFlags {
  double max_minutes = 0;
  int max_runs = 0;
  std::string shard = "1/1";
  std::vector<std::string> groups;  ///< --group: only the runs these groups list (empty: all)
  int threads = -1;
  bool threads_given = false;  ///< --threads was on the command line (else: the plan's)
  std::string work;
  std::string progress = "lines";
  bool rerun_other_versions = false;
  bool keep_checkpoints = false;
  Index stop_run_after_steps = 0;
  Index checkpoint_every = 64;
  Index diagnostic_windows = 16;
};

/// Trains one run (resuming its checkpoint when there is one); returns false when it stopped early.
bool train_one(const cs::Plan& plan, cs::Store& store, const cs::RunSpec& run, const RunFlags& f, int threads,
               const fs::path& work, std::map<std::string, std::unique_ptr<ct::TrainData>>& data_cache, bool first,
               ct::TrainResult& out) {
  ct::TrainOptions o = run.options;
  o.threads = threads;
  o.checkpoint = (work / (run.id + ".safetensors")).string();
  o.metrics = (work / (run.id + ".jsonl")).string();
  o.checkpoint_every = f.checkpoint_every;
  std::error_code ec;
  o.resume = fs::exists(o.checkpoint, ec);
  if (!o.resume) fs::remove(o.metrics, ec);  // from a run that died before its first checkpoint
  o.stop_after_steps = first ? f.stop_run_after_steps : 0;
  o.progress = ct::parse_progress_mode(f.progress);
  ct::preflight(o);
  const std::string key = ct::corpus_key(o.corpus) + "|" + std::to_string(o.vocab) + "|" + o.cache_dir;
  auto& data = data_cache[key];
  if (!data) data = std::make_unique<ct::TrainData>(ct::prepare_data(o));
  // the dynamics diagnostics on the first validation windows at every evaluation (the last: the
  // final parameters)
  o.dynamics_probe_windows = f.diagnostic_windows;
  ct::Progress progress(o.progress, run.title());
  if (o.resume) progress.message("resuming " + run.title() + " from its checkpoint");
  cs::RunResult r;
  try {
    out = ct::train(o, *data, progress);
  } catch (const coupledqk::runtime_error& e) {
    // A loss that is not finite ends the run, not the study: stored as diverged (the stability
    // report lists it; claims leave its seed out and say so). Anything else is an error.
    const std::string what = e.what();
    const std::string marker = "training diverged at step ";
    const auto at = what.find(marker);
    if (at == std::string::npos) throw;
    r.diverged_at = std::strtoll(what.c_str() + at + marker.size(), nullptr, 10);
    if (r.diverged_at <= 0) throw;
    progress.message(run.title() + ": " + what + "; stored as diverged");
    out.valid_loss = out.valid_ppl = out.test_loss = out.test_ppl = std::nan("");
    out.tokens = (r.diverged_at - 1) * o.batch * o.seq;
    out.total_steps = (ct::effective_budget_tokens(o) + o.batch * o.seq - 1) / (o.batch * o.seq);
    std::error_code ec;
    if (fs::exists(o.checkpoint, ec)) {  // what was measured before it diverged
      const ct::Checkpoint ck = ct::read_checkpoint(o.checkpoint);
      out.curve = ck.info.state.curve;
      out.dynamics = ck.info.state.dynamics;
      out.train_seconds = ck.info.state.elapsed;
    }
  }
  if (!r.diverged() && (out.interrupted || out.stopped_early)) return false;
  if (!out.dynamics.empty())
    for (const coupledqk::LayerDynamics& d : out.dynamics.back().layers)
      r.dynamics.push_back(cs::LayerDiagnostics{d.tau, d.q_displacement, d.k_displacement});
  r.dynamics_curve = out.dynamics;
  r.plan = plan.name;
  r.id = run.id;
  r.identity = run.identity;
  r.group = run.group;
  r.variant = run.variant.label;
  r.seed = run.seed;
  r.code_version = cs::code_version();
  static_cast<ct::RunRecord&>(r) = out;  // the record the trainer and the store share, curve included
  r.steps = out.total_steps;
  r.device = out.device_name.empty() ? out.device : out.device_name;
  r.machine = ct::cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores";
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  r.date = date;
  store.save(r);
  if (!f.keep_checkpoints) {
    fs::remove(o.checkpoint, ec);
    fs::remove(o.metrics, ec);
  }
  return true;
}

/// The number of processes an MPI launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE), 1 without one.
int launched_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 1) return n;
    }
  return 1;
}

int run(const Common& c, const RunFlags& f) {
  if (const int n = launched_processes(); n > 1)
    throw coupledqk::invalid_argument(
        "coupledqk-study was started as " + std::to_string(n) + " processes by an MPI launcher; every one would train "
        "and store the same runs. Spread a study over processes or machines with --shard i/n (one per process, no "
        "launcher) and gather the results with merge (docs/training.md)");
  const auto wall_start = std::chrono::steady_clock::now();
  auto minutes = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count() / 60;
  };
  // Every flag is checked before anything is read or created.
  const auto shard = parse_shard(f.shard);
  if (!(std::isfinite(f.max_minutes) && f.max_minutes >= 0))
    throw coupledqk::invalid_argument("--max-minutes must be a finite number >= 0 (0: no limit); got " +
                                      std::to_string(f.max_minutes));
  if (f.max_runs < 0)
    throw coupledqk::invalid_argument("--max-runs must be >= 0 (0: no limit); got " + std::to_string(f.max_runs));
  if (f.checkpoint_every < 1)
    throw coupledqk::invalid_argument("--checkpoint-every must be >= 1; got " + std::to_string(f.checkpoint_every));
  if (f.stop_run_after_steps < 0)
    throw coupledqk::invalid_argument("--stop-run-after-steps must be >= 0; got " + std::to_string(f.stop_run_after_steps));
  if (f.threads_given && !ct::threads_error(f.threads).empty())
    throw coupledqk::invalid_argument(ct::threads_error(f.threads));
  ct::parse_progress_mode(f.progress);
  if (!f.work.empty()) {
    std::error_code ec;
    if (fs::exists(f.work, ec) && !fs::is_directory(f.work, ec))
      throw coupledqk::invalid_argument("--work '" + f.work + "' exists and is not a folder");
  }
  cs::Plan plan = load(c);
  cs::Store store(plan, results_dir(c, plan));
  cs::resolve(plan, store);
  // Runs are indices into plan.runs: it grows when a finished run resolves a choice.
  std::vector<std::size_t> todo;
  std::map<std::string, int> other_versions;
  std::size_t total = 0;
  // --group: the runs these groups list (a run another group shares is trained once, for both)
  for (const std::string& g : f.groups)
    if (!plan.group_index.count(g)) {
      std::string list;
      for (const cs::Group& x : plan.groups) list += (list.empty() ? "" : ", ") + x.name;
      throw coupledqk::invalid_argument("--group '" + ct::bounded_quote(g) + "': the plan has no such group; groups: " + list);
    }
  auto wanted = [&](std::size_t i) {
    if (f.groups.empty()) return true;
    for (const auto& [key, index] : plan.arms)
      if (index == i)
        for (const std::string& g : f.groups)
          if (key.compare(0, g.size() + 1, g + "/") == 0) return true;
    return false;
  };
  auto take = [&](std::size_t from) {
    for (std::size_t i : shard_runs(plan, shard, from)) {
      if (!wanted(i)) continue;
      const cs::RunSpec& r = plan.runs[i];
      ++total;
      if (!store.done(r)) {
        todo.push_back(i);
        continue;
      }
      const std::string& v = store.results().at(r.id).code_version;
      if (v != cs::code_version()) {
        other_versions[v]++;
        if (f.rerun_other_versions) todo.push_back(i);
      }
    }
  };
  take(0);
  std::size_t done = total - todo.size();
  std::cout << "plan " << plan.name << ": " << plan.runs.size() << " runs";
  if (shard.second > 1) std::cout << ", shard " << shard.first << "/" << shard.second << ": " << total;
  std::cout << "; " << done << " finished, " << todo.size() << " to run; results in " << store.dir() << std::endl;
  print_waiting(plan);
  for (const auto& [v, n] : other_versions)
    std::cout << "note: " << n << " stored results come from code version " << v << " (this build: "
              << cs::code_version() << "); "
              << (f.rerun_other_versions ? "training them again (--rerun-other-versions)"
                                         : "used as they are and flagged in the report; --rerun-other-versions "
                                           "trains them again")
              << std::endl;
  // Every run's options are checked before anything trains (unknown names, sizes, devices).
  for (std::size_t i : todo) {
    ct::TrainOptions o = plan.runs[i].options;
    o.threads = 1;
    ct::validate(o);
  }
  const fs::path work = f.work.empty() ? fs::path(ct::default_cache_dir()) / "study" / plan.name : fs::path(f.work);
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) throw coupledqk::io_error("cannot create the work folder '" + work.string() + "': " + ec.message());
  const int threads = ct::set_threads(f.threads_given ? f.threads : plan.threads);
  ct::install_interrupt_handler();
  std::map<std::string, std::unique_ptr<ct::TrainData>> data_cache;
  int ran = 0;
  for (std::size_t k = 0; k < todo.size(); ++k) {
    const cs::RunSpec* r = &plan.runs[todo[k]];
    double left = 0;
    bool unknown = false;
    const Speeds speeds(plan, store);
    for (std::size_t x : todo)
      if (!store.done(plan.runs[x]) || x == todo[k]) {
        const double e = speeds.estimate(plan.runs[x]);
        left += e;
        unknown |= e <= 0;
      }
    if (f.max_runs > 0 && ran >= f.max_runs) {
      std::cout << "stopping: --max-runs " << f.max_runs << " reached; " << total - done
                << " runs left (run the command again to continue)" << std::endl;
      return 0;
    }
    const double estimate = speeds.estimate(*r);
    if (f.max_minutes > 0 && (minutes() >= f.max_minutes || minutes() + estimate / 60 > f.max_minutes)) {
      std::cout << "stopping: --max-minutes " << f.max_minutes << " (" << std::fixed << std::setprecision(1)
                << minutes() << " min used; the next run needs about " << duration(estimate) << "); " << total - done
                << " runs left" << std::endl;
      return 0;
    }
    std::cout << "[" << done + 1 << "/" << total << "] " << r->title() << " (id " << r->id << ", " << threads
              << " thread" << (threads == 1 ? "" : "s") << "); about " << duration(left)
              << (unknown ? " (+ unmeasured shapes)" : "") << " left" << std::endl;
    ct::TrainResult res;
    const bool finished = train_one(plan, store, *r, f, threads, work, data_cache, ran == 0, res);
    ++ran;
    if (!finished) {
      std::cout << (res.interrupted ? "interrupted" : "stopped (--stop-run-after-steps)") << ": " << r->title()
                << " at step " << res.steps_done << " of " << res.total_steps
                << "; its checkpoint resumes it on the next run of this command" << std::endl;
      return res.interrupted ? 130 : 0;
    }
    ++done;
    std::cout << "[" << done << "/" << total << "] done " << r->title() << ": valid ppl " << std::fixed
              << std::setprecision(3) << res.valid_ppl << ", test ppl " << res.test_ppl << ", "
              << std::setprecision(0) << res.tokens_per_s << " tokens/s, " << std::setprecision(1) << res.wall_seconds
              << " s" << std::defaultfloat << std::endl;
    // A finished run may resolve a choice (and another shard's results may have landed meanwhile).
    const std::size_t known = plan.runs.size();
    store.reload();
    if (cs::resolve(plan, store) > 0) {
      const std::size_t before = todo.size();
      take(known);
      std::cout << "choices resolved: " << todo.size() - before << " new runs for this process" << std::endl;
      print_waiting(plan);
      for (std::size_t i = before; i < todo.size(); ++i) {
        ct::TrainOptions o = plan.runs[todo[i]].options;
        o.threads = 1;
        ct::validate(o);
      }
    }
  }
  std::cout << "all " << total << " runs " << (shard.second > 1 ? "of this shard " : "") << "finished; "
            << "coupledqk-study report " << ct::shell_quote(plan.path) << " writes the report" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run a reproduction study from a plan file, resumably, and report the paper's claims with "
               "paired confidence intervals (docs/reproduction.md)",
               "coupledqk-study"};
  app.require_subcommand(1);
  Common common;
  RunFlags rf;
  std::string out = "docs/reproduction.md";
  std::vector<std::string> merge_dirs;
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("plan", common.plan_path, "the plan file (e.g. studies/claims-cpu.json)")->required();
    sub->add_option("--results", common.results, "results folder (default: <plan folder>/results/<plan name>)");
    sub->add_option("--device", common.device, "train on this device instead of the plan's (cpu, cuda); "
                                               "it is part of each run's identity");
  };
  CLI::App* run_cmd = app.add_subcommand("run", "train the plan's runs that have no result yet");
  add_common(run_cmd);
  run_cmd->add_option("--max-minutes", rf.max_minutes,
                      "stop between runs before this many minutes have passed (0: no limit)");
  run_cmd->add_option("--max-runs", rf.max_runs, "stop after this many runs (0: no limit)");
  run_cmd->add_option("--shard", rf.shard, "run only shard i of n (runs i, i+n, ... in plan order), e.g. 1/2")
      ->capture_default_str();
  run_cmd->add_option("--group", rf.groups, "train only the runs of this group (repeatable; default: every group)");
  run_cmd->add_option("--threads", rf.threads, "threads per run (default: the plan's; 0: the idle cores)");
  run_cmd->add_option("--work", rf.work, "folder for checkpoints of unfinished runs (default: <cache>/study/<plan>)");
  run_cmd->add_option("--progress", rf.progress, "progress display: auto, bar, lines, off")->capture_default_str();
  run_cmd->add_option("--checkpoint-every", rf.checkpoint_every, "steps between checkpoints of a run")
      ->capture_default_str();
  run_cmd->add_flag("--rerun-other-versions", rf.rerun_other_versions,
                    "train again the runs whose stored result comes from another code version");
  run_cmd->add_flag("--keep-checkpoints", rf.keep_checkpoints, "keep each finished run's checkpoint in the work folder");
  run_cmd->add_option("--stop-run-after-steps", rf.stop_run_after_steps,
                      "stop the first run after this many steps as if interrupted (tests)");
  CLI::App* status_cmd = app.add_subcommand("status", "runs finished and left, code versions, time left");
  add_common(status_cmd);
  CLI::App* report_cmd = app.add_subcommand("report", "write the report (markdown, JSON, PNG plots)");
  add_common(report_cmd);
  report_cmd->add_option("--out", out, "the markdown file; plots go to a folder of its name beside it")
      ->capture_default_str();
  CLI::App* merge_cmd = app.add_subcommand("merge", "copy the results of other shards' folders into this one");
  add_common(merge_cmd);
  merge_cmd->add_option("dirs", merge_dirs, "results folders to merge")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  rf.threads_given = run_cmd->count("--threads") > 0;
  try {
    if (*run_cmd) return run(common, rf);
    if (*status_cmd) return status(common);
    if (*report_cmd) return report(common, out, argc, argv);
    if (*merge_cmd) return merge(common, merge_dirs);
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "coupledqk-study: error: " << e.what() << std::endl;
    return 1;
  }
}
