// coupledqk-study's plan, result store and statistics (study.hpp); the report is in study_report.cpp.
#include "study.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <coupledqk/io/json_read.hpp>
#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/registry.hpp>

#include "data.hpp"


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

/// Limits of the JSON the study reads (json_read.hpp): a plan of the repository is a few kB and nests
/// 4 levels (root, groups, a group, its "set"); a result holds a curve of a few hundred points.
constexpr io::json_limits plan_limits{4u << 20, 8};
constexpr io::json_limits result_limits{16u << 20, 8};
/// Most runs a plan may resolve to (groups x seeds x variants), checked before any is resolved.
constexpr std::size_t max_plan_runs = 20000;

std::string shown(const json& v) { return io::json_excerpt(v); }

std::string read_text(const std::string& path, const char* what, std::size_t max_bytes) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw io_error(std::string(what) + " '" + path + "' does not exist or is not a regular file");
  const auto size = fs::file_size(path, ec);
  if (!ec && size > max_bytes)
    throw io_error(std::string(what) + " '" + path + "' is " + std::to_string(size) + " bytes long; at most " +
                   std::to_string(max_bytes) + " bytes are accepted (is it the right file?)");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) throw io_error(std::string("cannot read ") + what + " '" + path + "'");
  return ss.str();
}

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

/// Sets flag `name` (without "--") of `o` from its text, through train_flags (the trainer's own list).
void set_flag(TrainOptions& o, const std::string& name, const std::string& text, const std::string& where) {
  if (reserved_flags().count(name))
    throw invalid_argument(where + ": '" + name + "' cannot be set here (variants and seeds come from the groups; "
                                                    "threads, cache and seconds are not part of a run)");
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
          } else {  // the CLI's integer rule (progress.hpp): no sign, no wrapping
            const std::string e = unsigned_error(text, static_cast<std::uint64_t>(std::numeric_limits<T>::max()));
            if (!e.empty()) throw invalid_argument(where + ": '--" + name + "' = " + e);
            *target = static_cast<T>(std::strtoull(text.c_str(), nullptr, 10));
          }
        },
        f.target);
    return;
  }
  std::string accepted;
  for (const FlagSpec& f : flags)
    if (!reserved_flags().count(f.name.substr(2))) accepted += (accepted.empty() ? "" : ", ") + f.name.substr(2);
  throw invalid_argument(where + ": unknown flag '" + bounded_quote(name) + "'; accepted: " + accepted);
}

/// The identity of a run: "name=value" of every flag that changes what is trained, sorted.
std::string identity_of(const TrainOptions& options) {
  TrainOptions o = options;
  o.budget_tokens = effective_budget_tokens(o);
  std::vector<std::string> lines{"attention=" + o.attention, "steps=" + std::to_string(o.steps)};
  for (const FlagSpec& f : train_flags(o, false)) {
    const std::string name = f.name.substr(2);
    if (name == "cache" || name == "threads" || name == "seconds") continue;
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_same_v<T, std::string>) {
            lines.push_back(name + "=" + *target);
          } else if constexpr (std::is_same_v<T, double>) {
            char b[64];
            std::snprintf(b, sizeof b, "%.17g", *target);
            lines.push_back(name + "=" + b);
          } else if constexpr (std::is_same_v<T, bool>) {
            lines.push_back(name + "=" + (*target ? "true" : "false"));
          } else {
            lines.push_back(name + "=" + std::to_string(*target));
          }
        },
        f.target);
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
  }
  return "?";
}

const RunSpec* Plan::find(const ArmRef& arm, std::uint64_t seed) const {
  const auto it = arms.find(arm.text() + "#" + std::to_string(seed));
  return it == arms.end() ? nullptr : &runs[it->second];
}

const Group& Plan::group_of(const ArmRef& arm, const std::string& claim_id) const {
  const auto it = group_index.find(arm.group);
  if (it != group_index.end()) {
    const Group& g = groups[it->second];
    for (const VariantSpec& v : g.variants)
      if (v.label == arm.variant) return g;
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
/// A plan's name, a group's name, a claim's id: names (progress.hpp), never paths or code.
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

Plan parse_plan(const std::string& text, const std::string& source,
                const std::map<std::string, std::string>& overrides) {
  const std::string where = "plan '" + source + "'";
  const json j = io::read_json<invalid_argument>(text, where, plan_limits);
  if (!j.is_object()) throw invalid_argument(where + ": expected a JSON object at the top; got " + j.type_name());
  check_keys(j, {"plan", "description", "notes", "threads", "defaults", "groups", "claims", "cpu_time"}, where);
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
  std::map<std::string, std::size_t> by_identity;
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
      VariantSpec spec = parse_variant(v.get<std::string>(), gw);
      if (!labels.insert(spec.label).second)
        throw invalid_argument(gw + ": variant '" + bounded_quote(spec.label) + "' is listed twice");
      g.variants.push_back(spec);
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
    // the default budget).
    TrainOptions base;
    std::set<std::string> given;
    for (const auto& [k, v] : p.defaults) set_flag(base, k, v, where + " defaults"), given.insert("--" + k);
    for (const auto& [k, v] : g.set) set_flag(base, k, v, gw + " set"), given.insert("--" + k);
    for (const auto& [k, v] : overrides) set_flag(base, k, v, "command line"), given.insert("--" + k);
    {
      const auto& known = known_corpora();
      std::error_code ec;
      if (std::find(known.begin(), known.end(), base.corpus) == known.end() && !fs::exists(base.corpus, ec)) {
        std::string list;
        for (const auto& c : known) list += (list.empty() ? "" : ", ") + c;
        throw invalid_argument(gw + ": unknown corpus '" + bounded_quote(base.corpus) + "'; accepted: " + list +
                               ", or an existing file or folder");
      }
    }
    for (std::uint64_t seed : g.seeds)
      for (const VariantSpec& v : g.variants) {
        RunSpec r;
        r.group = g.name;
        r.variant = v;
        r.seed = seed;
        r.options = base;
        r.options.attention = v.attention;
        r.options.steps = v.steps;
        r.options.seed = seed;
        r.options.budget_seconds = 0;
        try {
          validate_explicit(r.options, [&](const std::string& flag) { return given.count(flag) > 0; });
        } catch (const std::exception& e) {
          throw invalid_argument(gw + ", variant '" + v.label + "', seed " + std::to_string(seed) + ": " + e.what());
        }
        r.identity = identity_of(r.options);
        r.id = hex16(run_id_hash(r.identity));
        if (!by_identity.count(r.identity)) {
          by_identity[r.identity] = p.runs.size();
          p.runs.push_back(r);
        }
        p.arms[g.name + "/" + v.label + "#" + std::to_string(seed)] = by_identity[r.identity];
      }
    p.group_index[g.name] = p.groups.size();
    p.groups.push_back(g);
  }
  if (j.contains("claims")) {
    const json& cs = j.at("claims");
    if (!cs.is_array()) throw invalid_argument(where + ": \"claims\" must be an array; got " + shown(cs));
    std::set<std::string> ids;
    for (std::size_t ci = 0; ci < cs.size(); ++ci) {
      const json& cj = cs[ci];
      const std::string cw = where + " claims[" + std::to_string(ci) + "]";
      if (!cj.is_object()) throw invalid_argument(cw + ": expected an object; got " + shown(cj));
      check_keys(cj, {"id", "title", "paper", "test", "a", "b", "c", "d", "margin"}, cw);
      Claim c;
      c.id = need_name(cj, "id", cw);
      if (!ids.insert(c.id).second) throw invalid_argument(cw + ": claim id '" + c.id + "' is used twice");
      c.title = need_string(cj, "title", cw);
      if (cj.contains("paper")) c.paper = need_string(cj, "paper", cw);
      const std::string test = need_string(cj, "test", cw);
      const std::vector<ClaimTest> all{ClaimTest::better,      ClaimTest::worse,           ClaimTest::equivalent,
                                       ClaimTest::spread_ratio, ClaimTest::tokens_to_target, ClaimTest::shift};
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
      c.b = parse_arm(cj, "b", cw);
      p.group_of(c.a, c.id);
      p.group_of(c.b, c.id);
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
  return p;
}

Plan load_plan(const std::string& path, const std::map<std::string, std::string>& overrides) {
  return parse_plan(read_text(path, "plan", plan_limits.max_bytes), path, overrides);
}

// ---- results ------------------------------------------------------------------------------------

std::string to_json(const RunResult& r) {
  json j;
  j["format"] = "coupledqk-study-result";
  j["version"] = 1;
  j["plan"] = r.plan;
  j["id"] = r.id;
  j["identity"] = r.identity;
  j["group"] = r.group;
  j["variant"] = r.variant;
  j["seed"] = r.seed;
  j["code_version"] = r.code_version;
  j["valid_loss"] = r.valid_loss;
  j["valid_ppl"] = r.valid_ppl;
  j["test_loss"] = r.test_loss;
  j["test_ppl"] = r.test_ppl;
  j["tokens_per_s"] = r.tokens_per_s;
  j["train_seconds"] = r.train_seconds;
  j["tokens"] = r.tokens;
  j["steps"] = r.steps;
  j["parameters"] = r.parameters;
  j["dynamics_parameters"] = r.dynamics_parameters;
  j["threads"] = r.threads;
  j["device"] = r.device;
  j["machine"] = r.machine;
  j["date"] = r.date;
  json curve = json::array();
  for (const CurvePoint& c : r.curve) curve.push_back({c.step, c.tokens, c.loss, c.ppl});
  j["curve"] = curve;
  json dyn = json::array();
  for (const LayerDiagnostics& d : r.dynamics)
    dyn.push_back({{"tau", d.tau}, {"q_displacement", d.q_displacement}, {"k_displacement", d.k_displacement}});
  j["dynamics"] = dyn;
  return j.dump(1) + "\n";
}

namespace {
/// Typed fields of a stored result, each error naming the file, the key and the value seen.
struct ResultReader {
  const std::string& source;
  [[noreturn]] void fail(const std::string& key, const std::string& expected, const json* v) const {
    throw io_error("result '" + source + "' is malformed: \"" + key + "\" " +
                   (v ? "is " + shown(*v) : std::string("is missing")) + "; expected " + expected);
  }
  const json& at(const json& j, const char* key) const {
    if (!j.is_object() || !j.contains(key)) fail(key, "a field of that name", nullptr);
    return j.at(key);
  }
  std::string text(const json& j, const char* key) const {
    const json& v = at(j, key);
    if (!v.is_string()) fail(key, "a string", &v);
    return v.get<std::string>();
  }
  double number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail(key, "a number", &v);
    return v.get<double>();
  }
  double number(const json& j, const char* key) const { return number(at(j, key), std::string(key)); }
  template <class T>
  T count(const json& v, const std::string& key) const {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0))
      fail(key, "a non-negative integer", &v);
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) fail(key, "an integer in range", &v);
    return static_cast<T>(u);
  }
  template <class T>
  T count(const json& j, const char* key) const {
    return count<T>(at(j, key), std::string(key));
  }
  const json& array(const json& j, const char* key) const {
    const json& v = at(j, key);
    if (!v.is_array()) fail(key, "an array", &v);
    return v;
  }
};
}  // namespace

RunResult result_from_json(const std::string& text, const std::string& source) {
  RunResult r;
  r.file = source;
  const json j = io::read_json(text, "result '" + source + "'", result_limits);
  if (!j.is_object() || !j.contains("format") || j.at("format") != "coupledqk-study-result")
    throw io_error("result '" + source + "' is not a coupledqk-study result (no \"format\": \"coupledqk-study-result\")");
  const ResultReader f{source};
  if (!f.at(j, "version").is_number_integer() || f.at(j, "version").get<long long>() != 1)
    throw io_error("result '" + source + "' has format version " + shown(j.at("version")) + "; this build reads 1");
  r.plan = f.text(j, "plan");
  r.id = f.text(j, "id");
  r.identity = f.text(j, "identity");
  r.group = f.text(j, "group");
  r.variant = f.text(j, "variant");
  r.seed = f.count<std::uint64_t>(j, "seed");
  r.code_version = f.text(j, "code_version");
  r.valid_loss = f.number(j, "valid_loss");
  r.valid_ppl = f.number(j, "valid_ppl");
  r.test_loss = f.number(j, "test_loss");
  r.test_ppl = f.number(j, "test_ppl");
  r.tokens_per_s = f.number(j, "tokens_per_s");
  r.train_seconds = f.number(j, "train_seconds");
  r.tokens = f.count<Index>(j, "tokens");
  r.steps = f.count<Index>(j, "steps");
  r.parameters = f.count<Index>(j, "parameters");
  r.dynamics_parameters = f.count<Index>(j, "dynamics_parameters");
  r.threads = f.count<int>(j, "threads");
  r.device = f.text(j, "device");
  r.machine = f.text(j, "machine");
  r.date = f.text(j, "date");
  const json& curve = f.array(j, "curve");
  for (std::size_t i = 0; i < curve.size(); ++i) {
    const json& c = curve[i];
    const std::string key = "curve[" + std::to_string(i) + "]";
    if (!c.is_array() || c.size() != 4) f.fail(key, "a curve point [step, tokens, loss, ppl]", &c);
    r.curve.push_back(CurvePoint{f.count<Index>(c[0], key + "[0]"), f.count<Index>(c[1], key + "[1]"),
                                 f.number(c[2], key + "[2]"), f.number(c[3], key + "[3]")});
  }
  const json& dynamics = f.array(j, "dynamics");
  for (std::size_t i = 0; i < dynamics.size(); ++i) {
    const json& d = dynamics[i];
    const std::string key = "dynamics[" + std::to_string(i) + "]";
    if (!d.is_object()) f.fail(key, "an object {tau, q_displacement, k_displacement}", &d);
    LayerDiagnostics l;
    const json& tau = f.array(d, "tau");
    for (std::size_t k = 0; k < tau.size(); ++k) l.tau.push_back(f.number(tau[k], key + ".tau[" + std::to_string(k) + "]"));
    l.q_displacement = f.number(d, "q_displacement");
    l.k_displacement = f.number(d, "k_displacement");
    r.dynamics.push_back(std::move(l));
  }
  if (!(std::isfinite(r.valid_ppl) && r.valid_ppl > 0 && std::isfinite(r.test_ppl) && r.test_ppl > 0))
    throw io_error("result '" + source + "' holds a non-positive or non-finite perplexity");
  return r;
}

Store::Store(const Plan& plan, std::string dir) : plan_(plan), dir_(std::move(dir)) {
  // Nothing is created here: the folder appears with the first result saved (a refused command
  // leaves no empty folder behind).
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return;
  if (!fs::is_directory(dir_, ec))
    throw io_error("the results folder '" + dir_ + "' exists but is not a folder");
  std::map<std::string, const RunSpec*> by_id;
  for (const RunSpec& r : plan_.runs) by_id[r.id] = &r;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.is_regular_file() && e.path().extension() == ".json" && e.path().filename().string()[0] != '.')
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    RunResult r = result_from_json(read_text(f.string(), "result", result_limits.max_bytes), f.string());
    if (r.plan != plan_.name)
      throw io_error("result '" + f.string() + "' belongs to plan '" + bounded_quote(r.plan) + "', not to '" + plan_.name +
                     "' (the plan of this folder); move it to that plan's results folder");
    const auto it = by_id.find(r.id);
    if (it == by_id.end()) {
      orphans_.push_back(f.string());
      continue;
    }
    if (it->second->identity != r.identity)
      throw io_error("result '" + f.string() + "' has id " + bounded_quote(r.id) + " but its configuration differs from the plan's run "
                     "with that id (" + it->second->title() + "); the file was edited or comes from elsewhere");
    if (results_.count(r.id))
      throw io_error("results '" + results_.at(r.id).file + "' and '" + f.string() + "' are the same run (id " + r.id +
                     "); keep one");
    results_[r.id] = r;
  }
}

void Store::save(const RunResult& r) {
  const RunSpec* spec = nullptr;
  for (const RunSpec& s : plan_.runs)
    if (s.id == r.id) spec = &s;
  require(spec != nullptr, "study: saving a result whose id ", r.id, " is not a run of plan '", plan_.name, "'");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw io_error("cannot create the results folder '" + dir_ + "': " + ec.message());
  const std::string path = (fs::path(dir_) / spec->file_name()).string();
  const std::string text = to_json(r);
  io::write_file_atomically(path, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  RunResult stored = r;
  stored.file = path;
  results_[r.id] = stored;
}

std::pair<int, int> Store::merge(const std::string& other_dir) {
  std::error_code ec;
  if (!fs::is_directory(other_dir, ec))
    throw io_error("merge: '" + other_dir + "' is not a folder of study results (it does not exist or is not a folder)");
  if (fs::equivalent(other_dir, dir_, ec)) throw invalid_argument("merge: '" + other_dir + "' is this plan's own results folder");
  const Store other(plan_, other_dir);  // checks every file against the plan first: nothing is copied on error
  int copied = 0, present = 0;
  for (const auto& [id, r] : other.results()) {
    if (results_.count(id)) {
      ++present;
      continue;
    }
    save(r);
    ++copied;
  }
  return {copied, present};
}

// ---- statistics -----------------------------------------------------------------------------------

namespace {
/// Continued fraction of the incomplete beta function (modified Lentz's method).
double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300, eps = 1e-15;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 1000; ++m) {
    const double m2 = 2.0 * m;
    double num = m * (b - m) * x / ((a - 1 + m2) * (a + m2));
    d = 1 + num * d;
    c = 1 + num / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1 + m2));
    d = 1 + num * d;
    c = 1 + num / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < eps) break;
  }
  return h;
}

double bisect(double lo, double hi, double target, const std::function<double(double)>& cdf) {
  for (int i = 0; i < 300; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
}  // namespace

double incomplete_beta(double a, double b, double x) {
  require(a > 0 && b > 0, "incomplete_beta: a and b must be positive; got a = ", a, ", b = ", b);
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

double t_cdf(double t, double df) {
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
  return t > 0 ? 1 - tail : tail;
}

double t_quantile(double p, double df) {
  require(p > 0 && p < 1 && df > 0, "t_quantile: need 0 < p < 1 and df > 0; got p = ", p, ", df = ", df);
  return bisect(-1e6, 1e6, p, [df](double t) { return t_cdf(t, df); });
}

double f_cdf(double f, double d1, double d2) {
  if (f <= 0) return 0;
  return incomplete_beta(0.5 * d1, 0.5 * d2, d1 * f / (d1 * f + d2));
}

double f_quantile(double p, double d1, double d2) {
  require(p > 0 && p < 1 && d1 > 0 && d2 > 0, "f_quantile: need 0 < p < 1, d1, d2 > 0; got p = ", p);
  return bisect(0, 1e9, p, [d1, d2](double f) { return f_cdf(f, d1, d2); });
}

Estimate mean_ci(const std::vector<double>& x) {
  Estimate e;
  e.n = static_cast<int>(x.size());
  if (x.empty()) return e;
  for (double v : x) e.mean += v;
  e.mean /= e.n;
  e.lo = e.hi = e.mean;
  if (e.n < 2) return e;
  double q = 0;
  for (double v : x) q += (v - e.mean) * (v - e.mean);
  e.sd = std::sqrt(q / (e.n - 1));
  const double half = t_quantile(0.975, e.n - 1) * e.sd / std::sqrt(static_cast<double>(e.n));
  e.lo = e.mean - half;
  e.hi = e.mean + half;
  return e;
}

Estimate welch_ci(const std::vector<double>& a, const std::vector<double>& b) {
  const Estimate ea = mean_ci(a), eb = mean_ci(b);
  Estimate e;
  e.n = std::min(ea.n, eb.n);
  e.mean = ea.mean - eb.mean;
  e.lo = e.hi = e.mean;
  if (ea.n < 2 || eb.n < 2) return e;
  const double va = ea.sd * ea.sd / ea.n, vb = eb.sd * eb.sd / eb.n, se = std::sqrt(va + vb);
  e.sd = se;
  if (se == 0) return e;
  const double df = (va + vb) * (va + vb) / (va * va / (ea.n - 1) + vb * vb / (eb.n - 1));
  const double half = t_quantile(0.975, df) * se;
  e.lo = e.mean - half;
  e.hi = e.mean + half;
  return e;
}

// ---- evaluation ---------------------------------------------------------------------------------------

namespace {

/// Tokens at which a curve first reaches `target` (log-linear interpolation between points); the
/// last point's tokens and `censored` when it never does.
double tokens_to_reach(const std::vector<CurvePoint>& curve, double target, bool& censored) {
  censored = false;
  for (std::size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].ppl > target) continue;
    if (i == 0) return static_cast<double>(curve[0].tokens);
    const double y0 = std::log(curve[i - 1].ppl), y1 = std::log(curve[i].ppl), y = std::log(target);
    const double f = y0 == y1 ? 1.0 : (y0 - y) / (y0 - y1);
    return static_cast<double>(curve[i - 1].tokens) + f * static_cast<double>(curve[i].tokens - curve[i - 1].tokens);
  }
  censored = true;
  return curve.empty() ? 0.0 : static_cast<double>(curve.back().tokens);
}

}  // namespace

std::vector<ClaimResult> evaluate(const Plan& plan, const std::map<std::string, RunResult>& results) {
  std::vector<ClaimResult> out;
  for (const Claim& claim : plan.claims) {
    ClaimResult cr;
    cr.claim = &claim;
    std::set<std::string> versions;
    const bool four = claim.test == ClaimTest::shift;
    std::vector<ArmRef> arms{claim.a, claim.b};
    if (four) arms = {claim.a, claim.b, claim.c, claim.d};
    auto result_of = [&](const ArmRef& arm, std::uint64_t seed) -> const RunResult* {
      const RunSpec* spec = plan.find(arm, seed);
      if (!spec) return nullptr;
      const auto it = results.find(spec->id);
      return it == results.end() ? nullptr : &it->second;
    };
    // runs needed and done
    for (const ArmRef& arm : arms)
      for (std::uint64_t s : plan.group_of(arm, claim.id).seeds) {
        ++cr.runs_needed;
        if (const RunResult* r = result_of(arm, s)) {
          ++cr.runs_done;
          versions.insert(r->code_version);
        }
      }
    cr.versions.assign(versions.begin(), versions.end());
    auto seeds_with = [&](const ArmRef& x, const ArmRef& y) {
      std::vector<std::uint64_t> s;
      for (std::uint64_t seed : plan.group_of(x, claim.id).seeds)
        if (result_of(x, seed) && result_of(y, seed)) s.push_back(seed);
      return s;
    };
    auto changes = [&](const ArmRef& x, const ArmRef& y, const std::vector<std::uint64_t>& seeds) {
      std::vector<double> d;
      for (std::uint64_t s : seeds) {
        const double a = result_of(x, s)->valid_ppl, b = result_of(y, s)->valid_ppl;
        d.push_back(100 * (a - b) / b);
      }
      return d;
    };
    auto mean_ppl = [&](const ArmRef& arm, const std::vector<std::uint64_t>& seeds) {
      double sum = 0;
      for (std::uint64_t s : seeds) sum += result_of(arm, s)->valid_ppl;
      return seeds.empty() ? 0.0 : sum / static_cast<double>(seeds.size());
    };
    switch (claim.test) {
      case ClaimTest::better:
      case ClaimTest::worse:
      case ClaimTest::equivalent: {
        cr.seeds = seeds_with(claim.a, claim.b);
        cr.values = changes(claim.a, claim.b, cr.seeds);
        cr.estimate = mean_ci(cr.values);
        cr.statistic = "valid ppl change of " + claim.a.text() + " vs " + claim.b.text() + ", %, paired by seed";
        break;
      }
      case ClaimTest::spread_ratio: {
        std::vector<double> a, b;
        for (std::uint64_t s : plan.group_of(claim.a, claim.id).seeds)
          if (const RunResult* r = result_of(claim.a, s)) a.push_back(r->valid_ppl);
        for (std::uint64_t s : plan.group_of(claim.b, claim.id).seeds)
          if (const RunResult* r = result_of(claim.b, s)) b.push_back(r->valid_ppl);
        cr.seeds = seeds_with(claim.a, claim.b);
        const Estimate ea = mean_ci(a), eb = mean_ci(b);
        cr.estimate.n = std::min(ea.n, eb.n);
        if (ea.n >= 2 && eb.n >= 2 && eb.sd > 0) {
          const double ratio = ea.sd / eb.sd, f = ratio * ratio;
          cr.estimate.mean = ratio;
          cr.estimate.sd = 0;
          cr.estimate.lo = std::sqrt(f / f_quantile(0.975, ea.n - 1, eb.n - 1));
          cr.estimate.hi = std::sqrt(f / f_quantile(0.025, ea.n - 1, eb.n - 1));
        }
        cr.statistic = "seed standard deviation of " + claim.a.text() + " / that of " + claim.b.text() +
                       " (valid ppl; F interval)";
        break;
      }
      case ClaimTest::tokens_to_target: {
        cr.seeds = seeds_with(claim.a, claim.b);
        for (std::uint64_t s : cr.seeds) {
          const RunResult* a = result_of(claim.a, s);
          const RunResult* b = result_of(claim.b, s);
          bool censored = false;
          const double t = tokens_to_reach(b->curve, a->valid_ppl, censored);
          cr.values.push_back(t / static_cast<double>(a->tokens));
        }
        cr.estimate = mean_ci(cr.values);
        cr.statistic = "tokens " + claim.b.text() + " needs to reach " + claim.a.text() +
                       "'s final valid ppl / the tokens " + claim.a.text() + " trained on";
        break;
      }
      case ClaimTest::shift: {
        const auto s1 = seeds_with(claim.a, claim.b), s2 = seeds_with(claim.c, claim.d);
        cr.seeds = s1;
        const auto d1 = changes(claim.a, claim.b, s1), d2 = changes(claim.c, claim.d, s2);
        cr.values = d1;
        cr.estimate = welch_ci(d1, d2);
        cr.estimate.n = static_cast<int>(std::min(s1.size(), s2.size()));
        cr.statistic = "(% change of " + claim.a.text() + " vs " + claim.b.text() + ") - (% change of " +
                       claim.c.text() + " vs " + claim.d.text() + "), Welch interval";
        break;
      }
    }
    cr.a_ppl = mean_ppl(claim.a, cr.seeds);
    cr.b_ppl = mean_ppl(claim.b, cr.seeds);
    const Estimate& e = cr.estimate;
    if (e.n < 2) {
      cr.verdict = "pending";
    } else {
      switch (claim.test) {
        case ClaimTest::better: cr.verdict = e.hi < 0 ? "reproduced" : e.lo > 0 ? "contradicted" : "inconclusive"; break;
        case ClaimTest::worse:
        case ClaimTest::shift: cr.verdict = e.lo > 0 ? "reproduced" : e.hi < 0 ? "contradicted" : "inconclusive"; break;
        case ClaimTest::spread_ratio:
        case ClaimTest::tokens_to_target:
          cr.verdict = e.lo > 1 ? "reproduced" : e.hi < 1 ? "contradicted" : "inconclusive";
          break;
        case ClaimTest::equivalent:
          cr.verdict = (e.lo > -claim.margin && e.hi < claim.margin) ? "reproduced"
                       : (e.lo > claim.margin || e.hi < -claim.margin) ? "contradicted"
                                                                       : "inconclusive";
          break;
      }
    }
    out.push_back(cr);
  }
  return out;
}

}  // namespace coupledqk::train::study
