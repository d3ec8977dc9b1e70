// coupledqk-study's plan (docs/reproduction.md): groups of variants x seeds, the choices a plan's
// own rule makes from finished runs, the claims and figures. A run is identified by its full
// configuration: every training flag that changes what is trained (train_flags without --cache and
// --threads), written as "name=value" lines; its id is a hash of that text. Same configuration =
// same run, whatever group lists it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "trainer.hpp"
#include "analysis/variant_spec.hpp"

namespace coupledqk::train::study {

using VariantSpec = train::VariantSpec;  ///< a group's variant: "leapfrog:3" (analysis/variant_spec.hpp)

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

class Store;  // store.hpp
/// Resolves every choice whose runs are finished and adds the runs of the groups that waited for
/// it, until nothing changes (the store re-reads its folder's results for the new runs). Returns
/// the number of runs added.
std::size_t resolve(Plan& plan, Store& store);

/// Whether shard i of n (1-based) trains a run: by its id, so that a run's shard does not depend on
/// which choices were resolved when the plan was read.
bool in_shard(const RunSpec& run, std::pair<int, int> shard);

}  // namespace coupledqk::train::study
