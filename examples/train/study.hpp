// coupledqk-study: a reproduction study of the paper's claims, described by a plan file, built up
// run by run over several invocations (docs/reproduction.md, docs/training.md).
//
//   Plan plan = load_plan("studies/claims-cpu.json");   // groups of variants x seeds, the claims
//   Store store(plan, results_dir);                      // one JSON file per finished run
//   ... train the runs store.missing() names, store.save(result) each ...
//   Report r = evaluate(plan, store.results());          // paired differences, CIs, verdicts
//
// A run is identified by its full configuration: every training flag that changes what is trained
// (train_flags without --cache and --threads), written as "name=value" lines; its id is a hash of
// that text. Same configuration = same run, whatever group lists it. Results record the plan's
// name and the code version that produced them: results of another plan are an error, results of
// another code version are kept and flagged (status, report), never silently mixed.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "trainer.hpp"
#include "variant_spec.hpp"

namespace coupledqk::train::study {

using VariantSpec = train::VariantSpec;  ///< a group's variant: "leapfrog:3" (variant_spec.hpp)

/// "leapfrog:3" -> {label, attention, steps} (parse_variant_spec), and the name checked against the
/// registry; invalid_argument naming `where` for a bad step count or an unknown name.
VariantSpec parse_variant(const std::string& text, const std::string& where);

/// One run of the plan, fully resolved.
struct RunSpec {
  std::string group;       ///< the first group listing it
  VariantSpec variant;
  std::uint64_t seed = 0;
  TrainOptions options;    ///< everything but the execution settings (threads, cache, checkpoint, ...)
  std::string identity;    ///< "name=value" lines of every flag that changes the run, sorted
  std::string id;          ///< 16 hex digits of a 64-bit FNV-1a hash of identity
  /// "<group>-<variant>-seed<k>-<id>.json", file-name safe.
  std::string file_name() const;
  /// "sotu/leapfrog:3 seed 2"
  std::string title() const;
};

/// What a claim compares.
enum class ClaimTest {
  better,            ///< a has lower perplexity than b (paired % change of a vs b < 0)
  worse,             ///< a has higher perplexity than b
  equivalent,        ///< |paired % change| < margin
  spread_ratio,      ///< a's seed standard deviation over b's, with an F interval; paper: ratio > 1
  tokens_to_target,  ///< tokens b's curve needs to reach a's final validation perplexity, / a's tokens
  shift,             ///< (change of a vs b) - (change of c vs d): the paper says > 0 (Welch interval)
  tokens_to_match,   ///< tokens the `ladder` arms (one variant, growing budgets, each its own full
                     ///< schedule) need to reach a's final validation perplexity, / a's tokens:
                     ///< interpolated in log tokens between the final perplexities; the paper: > 1
};
const char* to_string(ClaimTest t);

/// "group/variant" of the plan.
struct ArmRef {
  std::string group, variant;
  std::string text() const { return group + "/" + variant; }
};

struct Claim {
  std::string id, title;
  std::string paper;  ///< the paper's figure, quoted in the report
  ClaimTest test = ClaimTest::better;
  ArmRef a, b, c, d;  ///< c, d: shift only; b: tokens_to_match's first ladder arm
  std::vector<ArmRef> ladder;  ///< tokens_to_match: the arms at growing budgets
  double margin = 1.0;  ///< equivalent: percent
};

/// A decision the plan's own rule makes from finished runs, so that a plan states before any run
/// what it will pick (docs/reproduction.md, "Plans that choose"). A group uses it as a variant
/// "$name" or "$name:N" (kind variant) or as a flag value "$name" in its "set" (kind flag).
struct Choice {
  enum class Kind { variant, flag };
  std::string name;
  Kind kind = Kind::variant;
  /// variant: the one group read; flag: the groups of the sweep (each sets `flag`)
  std::vector<std::string> groups;
  std::vector<std::string> among;  ///< variant: the candidate labels of the group
  std::string flag;                ///< flag: the flag chosen per variant label ("lr")
  // ---- resolved (resolve()): the candidate (variant) or group (flag) with the lowest mean final
  // validation loss over the seeds of its group, every run of the candidates finished (a diverged
  // run counts as infinitely bad); ties go to the first listed.
  bool resolved = false;                   ///< variant: the value is known
  std::string value;                       ///< variant: the chosen label ("newton-leapfrog")
  std::map<std::string, std::string> per_label;  ///< flag: variant label -> the chosen group's value
  std::map<std::string, std::string> per_label_group;  ///< flag: variant label -> the chosen group
  /// What the rule saw: (label or "group label") -> mean final validation loss and seeds.
  std::map<std::string, std::pair<double, int>> scores;
};

struct Group {
  std::string name;
  std::vector<VariantSpec> variants;  ///< a choice's variant until resolved: label "$best", attention ""
  std::vector<std::uint64_t> seeds;
  std::map<std::string, std::string> set;  ///< flag overrides of this group (on top of the defaults)
  // ---- choices (Choice): the runs of a group that uses one exist once it is resolved
  std::vector<std::string> variant_choice;  ///< per variant: the choice it names, or ""
  /// flag -> the choice that gives its value: "name" (the run's own label's value) or "name:label"
  std::map<std::string, std::string> set_choice;
  bool expanded = false;  ///< its runs are in Plan::runs
  TrainOptions base;       ///< its options before the variant, seed and choices
  std::set<std::string> given;  ///< flags given explicitly (validate_explicit)
  /// The choices it waits for (empty once expanded).
  std::vector<std::string> waiting_for(const std::vector<Choice>& choices) const;
};

/// "name:label" -> {name, label}; "name" -> {name, ""}.
std::pair<std::string, std::string> split_choice_ref(const std::string& ref);

/// A figure of the report (kind "change": the paired % change of each pair's a vs b; kind "ppl":
/// each arm's mean final validation perplexity), with 95% intervals, against x: "parameters",
/// "tokens", or a flag's value (e.g. "lr"). One panel per series, each on its own scale.
struct Figure {
  std::string id, title, kind, x;
  struct Series {
    std::string label;
    std::vector<std::pair<ArmRef, ArmRef>> pairs;  ///< change: (a, b); ppl: (arm, unused)
  };
  std::vector<Series> series;
  bool log_x = false;
};

/// The report's first table (optional): rows of claims side by side, one column per reading or
/// setting; a cell names a claim id or is empty.
struct Summary {
  std::string title;
  std::vector<std::string> columns;
  struct Row {
    std::string label;
    std::vector<std::string> claims;  ///< one per column; "" for none
  };
  std::vector<Row> rows;
};

struct Plan {
  std::string name;         ///< "claims-cpu": names the results folder; stored in every result
  std::string path;         ///< the plan file
  std::string description;  ///< one paragraph, for the report
  std::string notes_file;   ///< optional markdown included by the report: a file name beside the plan
  std::string cpu_time;     ///< the plan's own statement of its total CPU time (quoted by the report)
  int threads = 0;          ///< default --threads of `run` (0: automatic)
  std::map<std::string, std::string> defaults;  ///< flag values for every run
  std::vector<Group> groups;
  std::vector<RunSpec> runs;  ///< unique configurations, in plan order (groups, then seeds, then variants)
  std::vector<Claim> claims;
  std::map<std::string, std::size_t> arms;  ///< "group/variant#seed" -> index in runs
  std::map<std::string, std::size_t> group_index;  ///< group name -> index in groups
  std::vector<Choice> choices;
  std::vector<Figure> figures;
  Summary summary;  ///< empty title: none
  std::map<std::string, std::size_t> run_index;  ///< identity -> index in runs

  const Choice* choice(const std::string& name) const;
  /// What an arm's label stands for: "$best-3c" -> "$best-3c (newton-leapfrog)" once resolved.
  std::string shown_label(const ArmRef& arm) const;

  /// The run of group/variant with this seed, or nullptr.
  const RunSpec* find(const ArmRef& arm, std::uint64_t seed) const;
  /// The seeds of a group/variant (invalid_argument naming the claim when the arm does not exist).
  const Group& group_of(const ArmRef& arm, const std::string& claim_id) const;
};

/// Parses and checks a plan (invalid_argument / io_error naming the file and the problem: malformed
/// JSON, unknown keys, flags, variants, step counts or corpora, empty groups, bad seeds, claims that
/// name arms the plan does not have). `overrides`: flag values that replace the plan's for every run
/// (e.g. {"device": "cuda"} from the command line).
Plan load_plan(const std::string& path, const std::map<std::string, std::string>& overrides = {});
Plan parse_plan(const std::string& text, const std::string& source,
                const std::map<std::string, std::string>& overrides = {});

class Store;
/// Resolves every choice whose runs are finished and adds the runs of the groups that waited for
/// it, until nothing changes (the store re-reads its folder's results for the new runs). Returns
/// the number of runs added.
std::size_t resolve(Plan& plan, Store& store);

/// Whether shard i of n (1-based) trains a run: by its id, so that a run's shard does not depend on
/// which choices were resolved when the plan was read.
bool in_shard(const RunSpec& run, std::pair<int, int> shard);

/// Dynamics diagnostics of one layer (LayerDynamics, stored).
struct LayerDiagnostics {
  std::vector<double> tau;
  double q_displacement = 0, k_displacement = 0;
};

/// The stored result of a finished run.
struct RunResult {
  std::string plan, id, identity, group, variant, code_version;
  std::uint64_t seed = 0;
  double valid_loss = 0, valid_ppl = 0, test_loss = 0, test_ppl = 0;
  double tokens_per_s = 0, train_seconds = 0;
  Index tokens = 0, steps = 0, parameters = 0, dynamics_parameters = 0;
  int threads = 0;
  std::string device, machine, date;
  std::vector<CurvePoint> curve;
  std::vector<LayerDiagnostics> dynamics;  ///< per layer; empty for standard attention
  std::vector<DynamicsPoint> dynamics_curve;  ///< the same at every evaluation (empty in older results)
  /// The step whose loss was not finite (the trainer stopped there), 0 for a finished run; its
  /// perplexities are then NaN ("null" in the file) and only the stability report uses it.
  Index diverged_at = 0;
  std::string file;  ///< where it was read from (not stored)
  bool diverged() const { return diverged_at > 0; }
};
std::string to_json(const RunResult& r);
RunResult result_from_json(const std::string& text, const std::string& source);

/// The code version compiled into this binary: "git describe --always --dirty" of the source tree
/// at build time, or "unknown".
std::string code_version();

/// The results folder of a plan: every <run file>.json in it.
class Store {
 public:
  /// Reads every result of the folder (created when missing). A file of another plan, or one
  /// whose identity does not match the run of the plan with its id, is an error naming the file;
  /// results of runs the plan no longer has are kept and listed in orphans().
  Store(const Plan& plan, std::string dir);
  const std::string& dir() const { return dir_; }
  /// Finished runs by id (the plan's runs only).
  const std::map<std::string, RunResult>& results() const { return results_; }
  const std::vector<std::string>& orphans() const { return orphans_; }
  /// Matches the folder's results against the plan's runs again (after resolve() added runs).
  void refresh();
  /// Reads the folder again (results other processes saved meanwhile), then refresh().
  void reload();
  bool done(const RunSpec& run) const { return results_.count(run.id) > 0; }
  /// Writes a result atomically (temporary file + rename) and records it.
  void save(const RunResult& r);
  /// Checks another folder's results against the plan and copies those this one lacks; returns
  /// {copied, already here (same id)}.
  std::pair<int, int> merge(const std::string& other_dir);

 private:
  const Plan& plan_;
  std::string dir_;
  std::map<std::string, RunResult> all_;  ///< every result of the folder, by id
  std::map<std::string, RunResult> results_;
  std::vector<std::string> orphans_;
};

// ---- statistics ----------------------------------------------------------------------------

/// Regularised incomplete beta I_x(a, b); Student's t and Fisher's F distribution functions and
/// their quantiles (by bisection on the distribution function).
double incomplete_beta(double a, double b, double x);
double t_cdf(double t, double df);
double t_quantile(double p, double df);
double f_cdf(double f, double d1, double d2);
double f_quantile(double p, double d1, double d2);

/// Mean with a two-sided 95% t interval (n >= 2; n == 1: the interval is the point, sd 0).
struct Estimate {
  double mean = 0, sd = 0, lo = 0, hi = 0;
  int n = 0;
};
Estimate mean_ci(const std::vector<double>& x);
/// Difference of means a - b with Welch's 95% interval.
Estimate welch_ci(const std::vector<double>& a, const std::vector<double>& b);

// ---- evaluation and report --------------------------------------------------------------------

struct ClaimResult {
  const Claim* claim = nullptr;
  std::vector<std::uint64_t> seeds;  ///< seeds with every run finished (paired tests)
  std::vector<double> values;        ///< per seed: % change, token ratio; spread_ratio: empty
  Estimate estimate;                 ///< mean and 95% interval of the claim's statistic
  double a_ppl = 0, b_ppl = 0;       ///< mean final validation perplexity of a and b over `seeds`
  int runs_needed = 0, runs_done = 0;
  int censored = 0;                  ///< tokens_to_match: seeds whose crossing lies outside the ladder (extrapolated)
  int diverged = 0;                  ///< seeds left out because one of their runs diverged
  std::vector<std::string> versions;  ///< code versions of the runs used
  std::string verdict;               ///< reproduced, contradicted, inconclusive, pending
  std::string statistic;             ///< what the estimate is, in words
};

/// The log tokens at which log final perplexity reaches `target` along budgets (log tokens, log
/// ppl), growing: linear between the two budgets that bracket it; outside them extrapolated along
/// the nearest segment (never inside the ladder) and `censored` set (the largest budget itself
/// when the last two do not improve: a lower bound).
double log_tokens_to_match(const std::vector<std::pair<double, double>>& points, double target, bool& censored);

/// Evaluates every claim on the finished runs.
std::vector<ClaimResult> evaluate(const Plan& plan, const std::map<std::string, RunResult>& results);

struct ReportOptions {
  std::string out = "docs/reproduction.md";  ///< the markdown; plots go to <stem>/ beside it
  std::string command;                       ///< the commands quoted in the report
};
/// Writes the markdown report, a JSON of the claims' numbers (<stem>.json) and the PNG plots
/// (gnuplot; a note in the report where it is missing). Returns the files written.
std::vector<std::string> write_report(const Plan& plan, const Store& store, const ReportOptions& o);

}  // namespace coupledqk::train::study
