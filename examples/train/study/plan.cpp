// coupledqk-study's plan (study/plan.hpp): parsing and checking, run identity, choices.
#include "plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <coupledqk/io/json_read.hpp>
#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/registry.hpp>

#include "data/corpora.hpp"
#include "data/fnv1a.hpp"
#include "store.hpp"
#include "records/dynamics_json.hpp"


namespace coupledqk::train::study {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


/// The run id's hash: FNV-1a (fnv1a.hpp) started from 1469598103934665603, not FNV's offset
/// basis 14695981039346656037 (a digit was lost when this was first written). Kept: every stored
/// result is filed under an id made with it, so changing it would orphan studies/results.
std::uint64_t run_id_hash(const std::string& s) { return fnv1a64(s, 1469598103934665603ull); }

std::string hex16(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

/// Limits of the plan's JSON (json_read.hpp): a plan of the repository is a few kB and nests 4
/// levels (root, groups, a group, its "set").
constexpr io::json_limits plan_limits{4u << 20, 8};
/// Most runs a plan may resolve to (groups x seeds x variants), checked before any is resolved.
constexpr std::size_t max_plan_runs = 20000;

std::string shown(const json& v) { return io::json_excerpt(v); }


/// The JSON value of a flag as the text the flag would take on the command line.
std::string flag_text(const json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v.get<double>());
    return b;
  }
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  throw invalid_argument(where + ": expected a number or a string; got " + shown(v));
}

/// Flags a plan may not set: they come from the variants and seeds, or do not change the run.
const std::set<std::string>& reserved_flags() {
  static const std::set<std::string> r{"attention", "steps", "seed", "cache", "threads", "seconds"};
  return r;
}

/// Refuses a flag a plan may not set, or one the trainer does not have (naming those it has).
void check_flag_name(TrainOptions& o, const std::string& name, const std::string& where) {
  if (reserved_flags().count(name))
    throw invalid_argument(where + ": '" + name + "' cannot be set here (variants and seeds come from the groups; "
                                                    "threads, cache and seconds are not part of a run)");
  std::vector<FlagSpec> flags = train_flags(o, false);
  for (const FlagSpec& f : flags)
    if (f.name == "--" + name) return;
  std::string accepted;
  for (const FlagSpec& f : flags)
    if (!reserved_flags().count(f.name.substr(2))) accepted += (accepted.empty() ? "" : ", ") + f.name.substr(2);
  throw invalid_argument(where + ": unknown flag '" + bounded_quote(name) + "'; accepted: " + accepted);
}

/// Sets flag `name` (without "--") of `o` from its text, through train_flags (the trainer's own list).
void set_flag(TrainOptions& o, const std::string& name, const std::string& text, const std::string& where) {
  check_flag_name(o, name, where);
  std::vector<FlagSpec> flags = train_flags(o, false);
  for (FlagSpec& f : flags) {
    if (f.name != "--" + name) continue;
    auto bad = [&](const char* expected) {
      return invalid_argument(where + ": '" + name + "' = '" + bounded_quote(text) + "' is not " + expected);
    };
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          char* end = nullptr;
          if constexpr (std::is_same_v<T, std::string>) {
            *target = text;
          } else if constexpr (std::is_same_v<T, bool>) {
            if (text != "true" && text != "false") throw bad("true or false");
            *target = text == "true";
          } else if constexpr (std::is_same_v<T, double>) {
            const double v = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !std::isfinite(v)) throw bad("a finite number");
            *target = v;
          } else {  // the CLI's integer rule (records/progress.hpp): no sign, no wrapping
            const std::string e = unsigned_error(text, static_cast<std::uint64_t>(std::numeric_limits<T>::max()));
            if (!e.empty()) throw invalid_argument(where + ": '--" + name + "' = " + e);
            *target = static_cast<T>(std::strtoull(text.c_str(), nullptr, 10));
          }
        },
        f.target);
    return;
  }
}

/// "name=value" of a flag's current value (doubles to 17 significant digits).
std::string flag_line(const FlagSpec& f) {
  const std::string name = f.name.substr(2);
  return std::visit(
      [&](auto* target) -> std::string {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return name + "=" + *target;
        } else if constexpr (std::is_same_v<T, double>) {
          char b[64];
          std::snprintf(b, sizeof b, "%.17g", *target);
          return name + "=" + b;
        } else if constexpr (std::is_same_v<T, bool>) {
          return name + "=" + (*target ? "true" : "false");
        } else {
          return name + "=" + std::to_string(*target);
        }
      },
      f.target);
}

/// The identity of a run: "name=value" of every flag that changes what is trained, sorted. Flags
/// added after the first studies (positions, rope-base, rope-order, window) are left out at their
/// default values, so that the runs stored before them keep their ids.
std::string identity_of(const TrainOptions& options) {
  TrainOptions o = options;
  o.budget_tokens = effective_budget_tokens(o);
  TrainOptions defaults;
  const std::vector<FlagSpec> default_flags = train_flags(defaults, false);
  const std::set<std::string> later{"positions", "rope-base", "rope-order", "window"};
  std::vector<std::string> lines{"attention=" + o.attention, "steps=" + std::to_string(o.steps)};
  const std::vector<FlagSpec> flags = train_flags(o, false);
  for (std::size_t i = 0; i < flags.size(); ++i) {
    const std::string name = flags[i].name.substr(2);
    if (name == "cache" || name == "threads" || name == "seconds") continue;
    const std::string line = flag_line(flags[i]);
    if (later.count(name) && line == flag_line(default_flags[i])) continue;
    lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

void check_keys(const json& j, const std::set<std::string>& allowed, const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().rfind("_", 0) == 0) continue;  // "_comment" and the like
    if (!allowed.count(it.key())) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw invalid_argument(where + ": unknown key '" + bounded_quote(it.key()) + "'; accepted: " + list);
    }
  }
}

const json& need(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw invalid_argument(where + ": missing \"" + key + "\"");
  return j.at(key);
}

std::string need_string(const json& j, const char* key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_string() || v.get<std::string>().empty())
    throw invalid_argument(where + ": \"" + key + "\" must be a non-empty string; got " + shown(v));
  return v.get<std::string>();
}

ArmRef parse_arm(const json& j, const char* key, const std::string& where) {
  const std::string text = need_string(j, key, where);
  const auto slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size())
    throw invalid_argument(where + ": \"" + key + "\" = '" + bounded_quote(text) + "'; expected group/variant (e.g. sotu/leapfrog)");
  return ArmRef{text.substr(0, slash), text.substr(slash + 1)};
}

}  // namespace

VariantSpec parse_variant(const std::string& text, const std::string& where) {
  VariantSpec v = parse_variant_spec(text, where);
  if (!builtin_variants.contains(v.attention))
    throw invalid_argument(where + ": unknown attention variant '" + bounded_quote(v.attention) + "'; accepted: " +
                           builtin_variants.names_joined());
  return v;
}

std::string RunSpec::file_name() const {
  return file_safe(group + "-" + variant.label + "-seed" + std::to_string(seed) + "-" + id) + ".json";
}

std::string RunSpec::title() const { return group + "/" + variant.label + " seed " + std::to_string(seed); }

const char* to_string(ClaimTest t) {
  switch (t) {
    case ClaimTest::better: return "better";
    case ClaimTest::worse: return "worse";
    case ClaimTest::equivalent: return "equivalent";
    case ClaimTest::spread_ratio: return "spread_ratio";
    case ClaimTest::tokens_to_target: return "tokens_to_target";
    case ClaimTest::shift: return "shift";
    case ClaimTest::tokens_to_match: return "tokens_to_match";
  }
  return "?";
}

const RunSpec* Plan::find(const ArmRef& arm, std::uint64_t seed) const {
  const auto it = arms.find(arm.text() + "#" + std::to_string(seed));
  if (it != arms.end()) return &runs[it->second];
  // "group/$choice" of a group that lists the choice's candidates: the chosen one, once chosen
  if (!arm.variant.empty() && arm.variant[0] == '$')
    if (const Choice* c = choice(arm.variant.substr(1)); c && c->kind == Choice::Kind::variant && c->resolved)
      return find(ArmRef{arm.group, c->value}, seed);
  return nullptr;
}

const Group& Plan::group_of(const ArmRef& arm, const std::string& claim_id) const {
  const auto it = group_index.find(arm.group);
  if (it != group_index.end()) {
    const Group& g = groups[it->second];
    for (const VariantSpec& v : g.variants)
      if (v.label == arm.variant) return g;
    if (!arm.variant.empty() && arm.variant[0] == '$')
      if (const Choice* c = choice(arm.variant.substr(1)); c && c->kind == Choice::Kind::variant) {
        const bool all = std::all_of(c->among.begin(), c->among.end(), [&](const std::string& label) {
          return std::any_of(g.variants.begin(), g.variants.end(), [&](const VariantSpec& v) { return v.label == label; });
        });
        if (all) return g;  // whichever it picks, the group has it
      }
    std::vector<std::string> list;
    for (const VariantSpec& v : g.variants) list.push_back(v.label);
    throw invalid_argument("plan '" + path + "': claim " + bounded_quote(claim_id) + " names '" + bounded_quote(arm.text()) +
                           "', but group '" + g.name + "' has no variant '" + bounded_quote(arm.variant) +
                           "'; it has: " + io::detail::join_names(list));
  }
  std::vector<std::string> list;
  for (const Group& g : groups) list.push_back(g.name);
  throw invalid_argument("plan '" + path + "': claim " + bounded_quote(claim_id) + " names '" + bounded_quote(arm.text()) +
                         "', but there is no group '" + bounded_quote(arm.group) + "'; groups: " + io::detail::join_names(list));
}

namespace {
/// A plan's name, a group's name, a claim's id: names (records/progress.hpp), never paths or code.
std::string need_name(const json& j, const char* key, const std::string& where) {
  const json& v = need(j, key, where);
  const std::string bad = v.is_string() ? name_error(v.get<std::string>()) : "must be a string";
  if (!bad.empty()) throw invalid_argument(where + ": \"" + key + "\" = " + shown(v) + " " + bad);
  return v.get<std::string>();
}

/// Flag values of an object ("defaults", "set") as command-line text, with where each was given.
std::map<std::string, std::string> flag_values(const json& d, const std::string& where, const char* what) {
  if (!d.is_object()) throw invalid_argument(where + ": \"" + what + "\" must be an object of flag values; got " + shown(d));
  std::map<std::string, std::string> out;
  for (auto it = d.begin(); it != d.end(); ++it)
    if (it.key().rfind("_", 0) != 0) out[it.key()] = flag_text(it.value(), where + " " + what + "." + bounded_quote(it.key()));
  return out;
}
}  // namespace

const Choice* Plan::choice(const std::string& name) const {
  for (const Choice& c : choices)
    if (c.name == name) return &c;
  return nullptr;
}

std::string Plan::shown_label(const ArmRef& arm) const {
  const auto it = group_index.find(arm.group);
  if (it == group_index.end()) return arm.variant;
  const Group& g = groups[it->second];
  for (std::size_t i = 0; i < g.variants.size(); ++i) {
    const VariantSpec& v = g.variants[i];
    if (v.label != arm.variant || g.variant_choice[i].empty() || v.attention.empty()) continue;
    return v.label + " = " + v.attention + (v.steps > 1 ? ":" + std::to_string(v.steps) : "");
  }
  if (!arm.variant.empty() && arm.variant[0] == '$')
    if (const Choice* c = choice(arm.variant.substr(1)); c && c->resolved && c->kind == Choice::Kind::variant)
      return arm.variant + " = " + c->value;
  return arm.variant;
}

std::pair<std::string, std::string> split_choice_ref(const std::string& ref) {
  const auto colon = ref.find(':');
  if (colon == std::string::npos) return {ref, ""};
  return {ref.substr(0, colon), ref.substr(colon + 1)};
}

std::vector<std::string> Group::waiting_for(const std::vector<Choice>& choices) const {
  std::vector<std::string> out;
  if (expanded) return out;
  auto find = [&](const std::string& name) -> const Choice* {
    for (const Choice& c : choices)
      if (c.name == name) return &c;
    return nullptr;
  };
  std::set<std::string> seen;
  auto add = [&](const std::string& n) {
    if (seen.insert(n).second) out.push_back(n);
  };
  for (const std::string& n : variant_choice)
    if (!n.empty()) {
      const Choice* c = find(n);
      if (!c || !c->resolved) add(n);
    }
  for (const auto& [flag, ref] : set_choice) {
    const auto [n, fixed] = split_choice_ref(ref);
    const Choice* c = find(n);
    if (!c) {
      add(n);
      continue;
    }
    for (const VariantSpec& v : variants)
      if (!c->per_label.count(fixed.empty() ? v.label : fixed)) add(n);
  }
  return out;
}

namespace {

/// Makes the runs of a group whose choices are all resolved (Plan::runs, arms, run_index).
void expand_group(Plan& p, Group& g) {
  const std::string gw = "plan '" + p.path + "' group '" + g.name + "'";
  for (std::uint64_t seed : g.seeds)
    for (std::size_t vi = 0; vi < g.variants.size(); ++vi) {
      VariantSpec v = g.variants[vi];
      if (!g.variant_choice[vi].empty()) {
        const Choice* c = p.choice(g.variant_choice[vi]);
        require(c && c->resolved, "study: group '", g.name, "' expanded before its choice '", g.variant_choice[vi], "'");
        const VariantSpec chosen = parse_variant(c->value, gw);
        v.attention = chosen.attention;
        if (v.steps == 0) v.steps = chosen.steps;
        g.variants[vi].attention = v.attention;
        g.variants[vi].steps = v.steps;
      }
      RunSpec r;
      r.group = g.name;
      r.variant = v;
      r.seed = seed;
      r.options = g.base;
      for (const auto& [flag, ref] : g.set_choice) {
        const auto [name, fixed] = split_choice_ref(ref);
        const std::string label = fixed.empty() ? v.label : fixed;
        const Choice* c = p.choice(name);
        require(c && c->per_label.count(label), "study: group '", g.name, "' expanded before its choice '", name, "'");
        set_flag(r.options, flag, c->per_label.at(label), gw + " (choice " + name + ")");
      }
      r.options.attention = v.attention;
      r.options.steps = v.steps;
      r.options.seed = seed;
      r.options.budget_seconds = 0;
      try {
        validate_explicit(r.options, [&](const std::string& flag) { return g.given.count(flag) > 0; });
      } catch (const std::exception& e) {
        throw invalid_argument(gw + ", variant '" + v.label + "', seed " + std::to_string(seed) + ": " + e.what());
      }
      r.identity = identity_of(r.options);
      r.id = hex16(run_id_hash(r.identity));
      if (!p.run_index.count(r.identity)) {
        p.run_index[r.identity] = p.runs.size();
        p.runs.push_back(r);
      }
      p.arms[g.name + "/" + v.label + "#" + std::to_string(seed)] = p.run_index[r.identity];
    }
  g.expanded = true;
}

/// "choices": [{"name", "group", "among"} | {"name", "flag", "groups"}]; every reference of a group
/// checked against them, and no choice may depend on itself through the groups it reads.
void parse_choices(Plan& p, const json& cs, const std::string& where) {
  if (!cs.is_array()) throw invalid_argument(where + ": \"choices\" must be an array; got " + shown(cs));
  auto group_named = [&](const std::string& name, const std::string& cw) -> const Group& {
    const auto it = p.group_index.find(name);
    if (it == p.group_index.end()) {
      std::vector<std::string> list;
      for (const Group& g : p.groups) list.push_back(g.name);
      throw invalid_argument(cw + ": there is no group '" + bounded_quote(name) + "'; groups: " + io::detail::join_names(list));
    }
    return p.groups[it->second];
  };
  for (std::size_t ci = 0; ci < cs.size(); ++ci) {
    const json& cj = cs[ci];
    const std::string cw = where + " choices[" + std::to_string(ci) + "]";
    if (!cj.is_object()) throw invalid_argument(cw + ": expected an object; got " + shown(cj));
    check_keys(cj, {"name", "group", "among", "flag", "groups"}, cw);
    Choice c;
    c.name = need_name(cj, "name", cw);
    if (p.choice(c.name)) throw invalid_argument(cw + ": choice name '" + c.name + "' is used twice");
    if (cj.contains("flag")) {
      if (cj.contains("group") || cj.contains("among"))
        throw invalid_argument(cw + ": a choice has either \"group\" and \"among\" (a variant) or \"flag\" and \"groups\" (a flag's value), not both");
      c.kind = Choice::Kind::flag;
      c.flag = need_string(cj, "flag", cw);
      TrainOptions probe;
      check_flag_name(probe, c.flag, cw);
      const json& gs = need(cj, "groups", cw);
      if (!gs.is_array() || gs.size() < 2)
        throw invalid_argument(cw + ": \"groups\" must be an array of at least 2 group names (the sweep); got " + shown(gs));
      for (const json& gn : gs) {
        if (!gn.is_string()) throw invalid_argument(cw + ": every group must be a name; got " + shown(gn));
        const Group& g = group_named(gn.get<std::string>(), cw);
        if (!g.set.count(c.flag) && !p.defaults.count(c.flag))
          throw invalid_argument(cw + ": group '" + g.name + "' of the sweep does not set '" + bounded_quote(c.flag) +
                                 "' (in its \"set\" or the plan's \"defaults\")");
        if (g.set_choice.count(c.flag))
          throw invalid_argument(cw + ": group '" + g.name + "' of the sweep takes its '" + c.flag + "' from a choice");
        if (std::find(c.groups.begin(), c.groups.end(), g.name) != c.groups.end())
          throw invalid_argument(cw + ": group '" + g.name + "' is listed twice");
        c.groups.push_back(g.name);
      }
    } else {
      c.kind = Choice::Kind::variant;
      const Group& g = group_named(need_string(cj, "group", cw), cw);
      c.groups.push_back(g.name);
      const json& among = need(cj, "among", cw);
      if (!among.is_array() || among.empty())
        throw invalid_argument(cw + ": \"among\" must be a non-empty array of the group's variants; got " + shown(among));
      for (const json& a : among) {
        if (!a.is_string()) throw invalid_argument(cw + ": every candidate must be a string; got " + shown(a));
        const std::string label = a.get<std::string>();
        if (std::none_of(g.variants.begin(), g.variants.end(), [&](const VariantSpec& v) { return v.label == label; }))
          throw invalid_argument(cw + ": group '" + g.name + "' has no variant '" + bounded_quote(label) + "'");
        if (!label.empty() && label[0] == '$')
          throw invalid_argument(cw + ": a candidate cannot itself be a choice ('" + bounded_quote(label) + "')");
        if (std::find(c.among.begin(), c.among.end(), label) != c.among.end())
          throw invalid_argument(cw + ": candidate '" + bounded_quote(label) + "' is listed twice");
        c.among.push_back(label);
      }
    }
    p.choices.push_back(c);
  }
  // Every reference names a choice of the right kind.
  for (const Group& g : p.groups) {
    const std::string gw = where + " group '" + g.name + "'";
    for (std::size_t vi = 0; vi < g.variants.size(); ++vi) {
      const std::string& n = g.variant_choice[vi];
      if (n.empty()) continue;
      const Choice* c = p.choice(n);
      if (!c || c->kind != Choice::Kind::variant)
        throw invalid_argument(gw + ": variant '" + bounded_quote(g.variants[vi].label) + "' names no variant choice of the plan (\"choices\" with \"group\" and \"among\")");
    }
    for (const auto& [flag, ref] : g.set_choice) {
      const auto [n, fixed] = split_choice_ref(ref);
      const Choice* c = p.choice(n);
      if (!c || c->kind != Choice::Kind::flag || c->flag != flag)
        throw invalid_argument(gw + ": set." + flag + " = '$" + bounded_quote(ref) + "' names no choice of '" + flag + "' (\"choices\" with \"flag\": \"" + flag + "\")");
      std::vector<std::string> labels{fixed};
      if (fixed.empty()) {
        labels.clear();
        for (const VariantSpec& v : g.variants) labels.push_back(v.label);
      }
      for (const std::string& label : labels) {
        bool swept = false;
        for (const std::string& sg : c->groups) {
          const Group& s = p.groups[p.group_index.at(sg)];
          swept |= std::any_of(s.variants.begin(), s.variants.end(), [&](const VariantSpec& x) { return x.label == label; });
        }
        if (!swept)
          throw invalid_argument(gw + ": '" + bounded_quote(label) + "' takes its " + flag + " from choice '" + n +
                                 "', whose groups have no variant of that label");
      }
    }
  }
  // No cycle: a choice may not wait, through the groups it reads, for itself.
  std::map<std::string, int> state;  // 1: on the path, 2: done
  std::function<void(const std::string&, std::vector<std::string>&)> visit = [&](const std::string& name,
                                                                                 std::vector<std::string>& path) {
    if (state[name] == 2) return;
    path.push_back(name);
    if (state[name] == 1) {
      std::string loop;
      for (const auto& n : path) loop += (loop.empty() ? "" : " -> ") + n;
      throw invalid_argument(where + ": choices wait for each other in a circle: " + loop);
    }
    state[name] = 1;
    const Choice* c = p.choice(name);
    for (const std::string& gn : c->groups) {
      const Group& g = p.groups[p.group_index.at(gn)];
      std::set<std::string> deps(g.variant_choice.begin(), g.variant_choice.end());
      for (const auto& [f, ref] : g.set_choice) deps.insert(split_choice_ref(ref).first);
      deps.erase("");
      for (const std::string& d : deps) visit(d, path);
    }
    state[name] = 2;
    path.pop_back();
  };
  for (const Choice& c : p.choices) {
    std::vector<std::string> path;
    visit(c.name, path);
  }
}

/// The arms of "figures": [{"id", "title", "kind": "change" | "ppl", "x", "log_x", "series":
/// [{"label", "pairs": [["g/a", "g/b"], ...]} | {"label", "arms": ["g/a", ...]}]}].
void parse_figures(Plan& p, const json& fs, const std::string& where) {
  if (!fs.is_array()) throw invalid_argument(where + ": \"figures\" must be an array; got " + shown(fs));
  std::set<std::string> ids;
  auto arm_of = [&](const json& v, const std::string& w) {
    if (!v.is_string()) throw invalid_argument(w + ": expected \"group/variant\"; got " + shown(v));
    json holder = {{"arm", v}};
    ArmRef a = parse_arm(holder, "arm", w);
    p.group_of(a, w);
    return a;
  };
  for (std::size_t fi = 0; fi < fs.size(); ++fi) {
    const json& fj = fs[fi];
    const std::string fw = where + " figures[" + std::to_string(fi) + "]";
    if (!fj.is_object()) throw invalid_argument(fw + ": expected an object; got " + shown(fj));
    check_keys(fj, {"id", "title", "kind", "x", "log_x", "series"}, fw);
    Figure f;
    f.id = need_name(fj, "id", fw);
    if (!ids.insert(f.id).second) throw invalid_argument(fw + ": figure id '" + f.id + "' is used twice");
    f.title = need_string(fj, "title", fw);
    f.kind = need_string(fj, "kind", fw);
    if (f.kind != "change" && f.kind != "ppl")
      throw invalid_argument(fw + ": unknown kind '" + bounded_quote(f.kind) + "'; accepted: change, ppl");
    f.x = need_string(fj, "x", fw);
    if (f.x != "parameters" && f.x != "tokens") {
      TrainOptions probe;
      check_flag_name(probe, f.x, fw + " x");
    }
    if (fj.contains("log_x")) {
      if (!fj.at("log_x").is_boolean()) throw invalid_argument(fw + ": \"log_x\" must be true or false; got " + shown(fj.at("log_x")));
      f.log_x = fj.at("log_x").get<bool>();
    }
    const json& ss = need(fj, "series", fw);
    if (!ss.is_array() || ss.empty()) throw invalid_argument(fw + ": \"series\" must be a non-empty array; got " + shown(ss));
    for (std::size_t si = 0; si < ss.size(); ++si) {
      const json& sj = ss[si];
      const std::string sw = fw + " series[" + std::to_string(si) + "]";
      if (!sj.is_object()) throw invalid_argument(sw + ": expected an object; got " + shown(sj));
      check_keys(sj, {"label", "pairs", "arms"}, sw);
      Figure::Series series;
      series.label = need_string(sj, "label", sw);
      const char* key = f.kind == "change" ? "pairs" : "arms";
      const json& items = need(sj, key, sw);
      if (!items.is_array() || items.empty()) throw invalid_argument(sw + ": \"" + key + "\" must be a non-empty array; got " + shown(items));
      for (const json& it : items) {
        if (f.kind == "change") {
          if (!it.is_array() || it.size() != 2)
            throw invalid_argument(sw + ": every pair must be [\"group/a\", \"group/b\"]; got " + shown(it));
          series.pairs.emplace_back(arm_of(it[0], sw), arm_of(it[1], sw));
        } else {
          const ArmRef a = arm_of(it, sw);
          series.pairs.emplace_back(a, a);
        }
      }
      f.series.push_back(std::move(series));
    }
    p.figures.push_back(std::move(f));
  }
}

}  // namespace

Plan parse_plan(const std::string& text, const std::string& source,
                const std::map<std::string, std::string>& overrides) {
  const std::string where = "plan '" + source + "'";
  const json j = io::read_json<invalid_argument>(text, where, plan_limits);
  if (!j.is_object()) throw invalid_argument(where + ": expected a JSON object at the top; got " + j.type_name());
  check_keys(j, {"plan", "description", "notes", "threads", "defaults", "groups", "claims", "cpu_time", "choices", "figures",
                 "summary"},
             where);
  Plan p;
  p.path = source;
  p.name = need_name(j, "plan", where);
  if (j.contains("description")) p.description = need_string(j, "description", where);
  if (j.contains("notes")) {
    // a file beside the plan: a name, so that a shared plan cannot pull any other file into a report
    p.notes_file = need_name(j, "notes", where);
  }
  if (j.contains("cpu_time")) p.cpu_time = need_string(j, "cpu_time", where);
  if (j.contains("threads")) {
    const json& t = j.at("threads");
    const std::string bad = threads_error(t.is_number_integer() ? t.get<long long>() : -1);
    if (!t.is_number_integer() || !bad.empty())
      throw invalid_argument(where + ": \"threads\" must be an integer in [0, " + std::to_string(max_threads) +
                             "] (0: every idle core); got " + shown(t));
    p.threads = t.get<int>();
  }
  if (j.contains("defaults")) p.defaults = flag_values(j.at("defaults"), where, "defaults");
  const json& groups = need(j, "groups", where);
  if (!groups.is_array() || groups.empty())
    throw invalid_argument(where + ": \"groups\" must be a non-empty array; got " + shown(groups));
  // Every check below is linear in the plan's size: sets and maps, never a scan of what came before.
  std::size_t resolved = 0;
  for (const json& gj : groups)
    if (gj.is_object() && gj.contains("seeds") && gj.contains("variants") && gj.at("seeds").is_array() &&
        gj.at("variants").is_array())
      resolved += gj.at("seeds").size() * gj.at("variants").size();
  if (resolved > max_plan_runs)
    throw invalid_argument(where + ": its groups list " + std::to_string(resolved) + " runs (seeds x variants); at most " +
                           std::to_string(max_plan_runs) + " are accepted in one plan (split it)");
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const json& gj = groups[gi];
    const std::string gw = where + " groups[" + std::to_string(gi) + "]";
    if (!gj.is_object()) throw invalid_argument(gw + ": expected an object; got " + shown(gj));
    check_keys(gj, {"name", "variants", "seeds", "set"}, gw);
    Group g;
    g.name = need_name(gj, "name", gw);
    if (p.group_index.count(g.name)) throw invalid_argument(gw + ": group name '" + g.name + "' is used twice");
    const json& vs = need(gj, "variants", gw);
    if (!vs.is_array() || vs.empty())
      throw invalid_argument(gw + ": \"variants\" must be a non-empty array; got " + shown(vs));
    std::set<std::string> labels;
    for (const json& v : vs) {
      if (!v.is_string()) throw invalid_argument(gw + ": every variant must be a string; got " + shown(v));
      const std::string text = v.get<std::string>();
      VariantSpec spec;
      std::string choice;
      if (!text.empty() && text[0] == '$') {  // a choice's variant: "$name" or "$name:N"
        spec = parse_variant_spec(text.substr(1), gw);
        choice = spec.attention;
        const std::string bad = name_error(choice);
        if (!bad.empty()) throw invalid_argument(gw + ": variant '" + bounded_quote(text) + "' names a choice " + bad);
        spec.label = text;
        spec.attention.clear();
        if (text.find(':') == std::string::npos) spec.steps = 0;  // the candidate's own step count
      } else {
        spec = parse_variant(text, gw);
      }
      if (!labels.insert(spec.label).second)
        throw invalid_argument(gw + ": variant '" + bounded_quote(spec.label) + "' is listed twice");
      g.variants.push_back(spec);
      g.variant_choice.push_back(choice);
    }
    const json& ss = need(gj, "seeds", gw);
    if (!ss.is_array() || ss.empty())
      throw invalid_argument(gw + ": \"seeds\" must be a non-empty array of integers; got " + shown(ss));
    std::set<std::uint64_t> seen;
    for (const json& s : ss) {
      if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<long long>() >= 0))
        throw invalid_argument(gw + ": every seed must be a non-negative integer; got " + shown(s));
      const auto seed = s.get<std::uint64_t>();
      if (!seen.insert(seed).second)
        throw invalid_argument(gw + ": seed " + std::to_string(seed) + " is listed twice");
      g.seeds.push_back(seed);
    }
    if (gj.contains("set")) g.set = flag_values(gj.at("set"), gw, "set");
    // The group's options: the trainer's defaults, the plan's, the group's, the overrides. A value
    // given anywhere is checked as the CLI checks it (validate_explicit: --tokens 0 is an error, not
    // the default budget). A value "$choice" is set when the group's runs are made.
    for (const auto& [k, v] : p.defaults) set_flag(g.base, k, v, where + " defaults"), g.given.insert("--" + k);
    for (const auto& [k, v] : g.set) {
      if (!v.empty() && v[0] == '$') {  // "$choice", or "$choice:label" (that label's value)
        const auto colon = v.find(':');
        const std::string bad = name_error(v.substr(1, colon == std::string::npos ? std::string::npos : colon - 1));
        if (!bad.empty()) throw invalid_argument(gw + " set." + bounded_quote(k) + ": '" + bounded_quote(v) + "' names a choice " + bad);
        check_flag_name(g.base, k, gw + " set");
        g.set_choice[k] = v.substr(1);
      } else {
        set_flag(g.base, k, v, gw + " set");
      }
      g.given.insert("--" + k);
    }
    for (const auto& [k, v] : overrides) {
      set_flag(g.base, k, v, "command line");
      g.given.insert("--" + k);
      g.set_choice.erase(k);  // the command line replaces the plan's values, chosen ones too
    }
    {
      const auto& known = known_corpora();
      std::error_code ec;
      if (std::find(known.begin(), known.end(), g.base.corpus) == known.end() && !fs::exists(g.base.corpus, ec)) {
        std::string list;
        for (const auto& c : known) list += (list.empty() ? "" : ", ") + c;
        throw invalid_argument(gw + ": unknown corpus '" + bounded_quote(g.base.corpus) + "'; accepted: " + list +
                               ", or an existing file or folder");
      }
    }
    p.group_index[g.name] = p.groups.size();
    p.groups.push_back(std::move(g));
  }
  // (without "choices" too: a group naming "$x" must then be refused, not wait forever)
  parse_choices(p, j.contains("choices") ? j.at("choices") : json::array(), where);
  for (Group& g : p.groups)
    if (g.waiting_for(p.choices).empty()) expand_group(p, g);
  if (j.contains("claims")) {
    const json& cs = j.at("claims");
    if (!cs.is_array()) throw invalid_argument(where + ": \"claims\" must be an array; got " + shown(cs));
    std::set<std::string> ids;
    for (std::size_t ci = 0; ci < cs.size(); ++ci) {
      const json& cj = cs[ci];
      const std::string cw = where + " claims[" + std::to_string(ci) + "]";
      if (!cj.is_object()) throw invalid_argument(cw + ": expected an object; got " + shown(cj));
      check_keys(cj, {"id", "title", "paper", "test", "a", "b", "c", "d", "margin", "ladder"}, cw);
      Claim c;
      c.id = need_name(cj, "id", cw);
      if (!ids.insert(c.id).second) throw invalid_argument(cw + ": claim id '" + c.id + "' is used twice");
      c.title = need_string(cj, "title", cw);
      if (cj.contains("paper")) c.paper = need_string(cj, "paper", cw);
      const std::string test = need_string(cj, "test", cw);
      const std::vector<ClaimTest> all{ClaimTest::better,       ClaimTest::worse,           ClaimTest::equivalent,
                                       ClaimTest::spread_ratio, ClaimTest::tokens_to_target, ClaimTest::shift,
                                       ClaimTest::tokens_to_match};
      bool found = false;
      std::string names;
      for (ClaimTest t : all) {
        names += (names.empty() ? "" : ", ") + std::string(to_string(t));
        if (test == to_string(t)) {
          c.test = t;
          found = true;
        }
      }
      if (!found) throw invalid_argument(cw + ": unknown test '" + bounded_quote(test) + "'; accepted: " + names);
      c.a = parse_arm(cj, "a", cw);
      p.group_of(c.a, c.id);
      if (c.test == ClaimTest::tokens_to_match) {
        if (cj.contains("b")) throw invalid_argument(cw + ": test 'tokens_to_match' takes \"ladder\", not \"b\"");
        const json& l = need(cj, "ladder", cw);
        if (!l.is_array() || l.size() < 2)
          throw invalid_argument(cw + ": \"ladder\" must be an array of at least 2 arms (group/variant) at growing budgets; got " + shown(l));
        for (const json& x : l) {
          json holder = {{"arm", x}};
          const ArmRef arm = parse_arm(holder, "arm", cw + " ladder");
          p.group_of(arm, c.id);
          c.ladder.push_back(arm);
        }
        c.b = c.ladder.front();
      } else {
        if (cj.contains("ladder")) throw invalid_argument(cw + ": \"ladder\" belongs to test 'tokens_to_match' only");
        c.b = parse_arm(cj, "b", cw);
        p.group_of(c.b, c.id);
      }
      if (c.test == ClaimTest::shift) {
        c.c = parse_arm(cj, "c", cw);
        c.d = parse_arm(cj, "d", cw);
        p.group_of(c.c, c.id);
        p.group_of(c.d, c.id);
      } else if (cj.contains("c") || cj.contains("d")) {
        throw invalid_argument(cw + ": \"c\" and \"d\" belong to test 'shift' only");
      }
      if (cj.contains("margin")) {
        const json& m = cj.at("margin");
        if (!m.is_number() || !(m.get<double>() > 0) || !std::isfinite(m.get<double>()))
          throw invalid_argument(cw + ": \"margin\" must be a positive number (percent); got " + shown(m));
        c.margin = m.get<double>();
      }
      p.claims.push_back(c);
    }
  }
  if (j.contains("figures")) parse_figures(p, j.at("figures"), where);
  if (j.contains("summary")) {
    const json& sj = j.at("summary");
    const std::string sw = where + " summary";
    if (!sj.is_object()) throw invalid_argument(sw + ": expected an object; got " + shown(sj));
    check_keys(sj, {"title", "columns", "rows"}, sw);
    p.summary.title = need_string(sj, "title", sw);
    const json& cols = need(sj, "columns", sw);
    if (!cols.is_array() || cols.empty()) throw invalid_argument(sw + ": \"columns\" must be a non-empty array; got " + shown(cols));
    for (const json& c : cols) {
      if (!c.is_string() || c.get<std::string>().empty()) throw invalid_argument(sw + ": every column must be a non-empty string; got " + shown(c));
      p.summary.columns.push_back(c.get<std::string>());
    }
    std::set<std::string> ids;
    for (const Claim& c : p.claims) ids.insert(c.id);
    const json& rows = need(sj, "rows", sw);
    if (!rows.is_array() || rows.empty()) throw invalid_argument(sw + ": \"rows\" must be a non-empty array; got " + shown(rows));
    for (std::size_t ri = 0; ri < rows.size(); ++ri) {
      const json& rj = rows[ri];
      const std::string rw = sw + " rows[" + std::to_string(ri) + "]";
      if (!rj.is_object()) throw invalid_argument(rw + ": expected an object; got " + shown(rj));
      check_keys(rj, {"label", "claims"}, rw);
      Summary::Row row;
      row.label = need_string(rj, "label", rw);
      const json& cs = need(rj, "claims", rw);
      if (!cs.is_array() || cs.size() != p.summary.columns.size())
        throw invalid_argument(rw + ": \"claims\" must be an array of " + std::to_string(p.summary.columns.size()) +
                               " claim ids or \"\" (one per column); got " + shown(cs));
      for (const json& c : cs) {
        if (!c.is_string()) throw invalid_argument(rw + ": every cell must be a claim id or \"\"; got " + shown(c));
        const std::string id = c.get<std::string>();
        if (!id.empty() && !ids.count(id)) throw invalid_argument(rw + ": no claim '" + bounded_quote(id) + "' in the plan");
        row.claims.push_back(id);
      }
      p.summary.rows.push_back(std::move(row));
    }
  }
  return p;
}

Plan load_plan(const std::string& path, const std::map<std::string, std::string>& overrides) {
  return parse_plan(read_text_file(path, "plan", plan_limits.max_bytes), path, overrides);
}

// ---- choices ----------------------------------------------------------------------------------------

namespace {
/// Mean final validation loss of a group's runs of one label over the group's seeds; false while
/// one of them is missing. A diverged run counts as +infinity.
bool mean_loss(const Plan& p, const std::map<std::string, RunResult>& results, const Group& g, const std::string& label,
               double& mean, int& n) {
  mean = 0;
  n = 0;
  for (std::uint64_t seed : g.seeds) {
    const RunSpec* spec = p.find(ArmRef{g.name, label}, seed);
    if (!spec) return false;
    const auto it = results.find(spec->id);
    if (it == results.end()) return false;
    mean += it->second.diverged() ? std::numeric_limits<double>::infinity() : it->second.valid_loss;
    ++n;
  }
  mean /= n;
  return n > 0;
}

/// Resolves what the finished runs allow; true when something new was resolved.
bool resolve_choices(Plan& p, const std::map<std::string, RunResult>& results) {
  bool changed = false;
  for (Choice& c : p.choices) {
    if (c.kind == Choice::Kind::variant) {
      if (c.resolved) continue;
      const Group& g = p.groups[p.group_index.at(c.groups[0])];
      if (!g.expanded) continue;
      std::map<std::string, std::pair<double, int>> scores;
      bool all = true;
      for (const std::string& label : c.among) {
        double m = 0;
        int n = 0;
        all &= mean_loss(p, results, g, label, m, n);
        scores[label] = {m, n};
      }
      if (!all) continue;
      std::string best = c.among.front();
      for (const std::string& label : c.among)
        if (scores[label].first < scores[best].first) best = label;
      c.scores = scores;
      c.value = best;
      c.resolved = true;
      changed = true;
    } else {
      // per label: every sweep group that has it, expanded and finished
      std::set<std::string> labels;
      for (const std::string& gn : c.groups)
        for (const VariantSpec& v : p.groups[p.group_index.at(gn)].variants) labels.insert(v.label);
      for (const std::string& label : labels) {
        if (c.per_label.count(label)) continue;
        bool all = true;
        std::string best;
        double best_mean = 0;
        std::map<std::string, std::pair<double, int>> scores;
        for (const std::string& gn : c.groups) {
          const Group& g = p.groups[p.group_index.at(gn)];
          if (std::none_of(g.variants.begin(), g.variants.end(), [&](const VariantSpec& v) { return v.label == label; }))
            continue;
          double m = 0;
          int n = 0;
          if (!g.expanded || !mean_loss(p, results, g, label, m, n)) {
            all = false;
            break;
          }
          scores[gn + " " + label] = {m, n};
          if (best.empty() || m < best_mean) best = gn, best_mean = m;
        }
        if (!all || best.empty()) continue;
        const Group& g = p.groups[p.group_index.at(best)];
        c.per_label[label] = g.set.count(c.flag) ? g.set.at(c.flag) : p.defaults.at(c.flag);
        c.per_label_group[label] = best;
        for (const auto& [k, v] : scores) c.scores[k] = v;
        changed = true;
      }
      c.resolved = !labels.empty() && c.per_label.size() == labels.size();
    }
  }
  for (Group& g : p.groups)
    if (!g.expanded && g.waiting_for(p.choices).empty()) {
      expand_group(p, g);
      changed = true;
    }
  return changed;
}
}  // namespace

std::size_t resolve(Plan& plan, Store& store) {
  const std::size_t before = plan.runs.size();
  while (resolve_choices(plan, store.results())) store.refresh();
  return plan.runs.size() - before;
}

bool in_shard(const RunSpec& run, std::pair<int, int> shard) {
  if (shard.second <= 1) return true;
  const std::uint64_t h = std::strtoull(run.id.c_str(), nullptr, 16);
  return static_cast<int>(h % static_cast<std::uint64_t>(shard.second)) == shard.first - 1;
}

}  // namespace coupledqk::train::study
