// coupledqk-study's result store (study/store.hpp): results as JSON, the folder, merging folders.
#include "store.hpp"

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
#include "records/dynamics_json.hpp"


#include <coupledqk/io/atomic_file.hpp>

#include <type_traits>

namespace coupledqk::train::study {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// Limits of the JSON the study reads (json_read.hpp): a result holds a curve of a few hundred points.
constexpr io::json_limits result_limits{16u << 20, 8};


}  // namespace

std::string read_text_file(const std::string& path, const char* what, std::size_t max_bytes) {
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

// ---- results ------------------------------------------------------------------------------------

namespace {

/// The plain fields of a stored result, listed once: the run's RunRecord (trainer/result.hpp, the
/// same list the trainer's summary walks), then the study's own. The JSON writer and reader below
/// both walk this list, f(key, member, nullable). A nullable number is written as null when it is
/// not finite (a diverged run's perplexities) and read back as NaN only for a diverged run. The
/// structured fields (format, version, diverged_at, curve, dynamics, dynamics_curve) are written and
/// read beside it.
template <class Result, class F>
void visit_result_fields(Result& r, F&& f) {
  f("plan", r.plan, false);
  f("id", r.id, false);
  f("identity", r.identity, false);
  f("group", r.group, false);
  f("variant", r.variant, false);
  f("seed", r.seed, false);
  f("code_version", r.code_version, false);
  visit_run_record(r, f);
  f("steps", r.steps, false);
  f("device", r.device, false);
  f("machine", r.machine, false);
  f("date", r.date, false);
}

}  // namespace

std::string to_json(const RunResult& r) {
  json j;
  j["format"] = "coupledqk-study-result";
  j["version"] = 1;
  visit_result_fields(r, [&](const char* key, const auto& v, bool nullable) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>)
      j[key] = nullable && !std::isfinite(v) ? json(nullptr) : json(v);
    else
      j[key] = v;
  });
  if (r.diverged()) j["diverged_at"] = r.diverged_at;
  json curve = json::array();
  for (const CurvePoint& c : r.curve) curve.push_back({c.step, c.tokens, c.loss, c.ppl});
  j["curve"] = curve;
  json dyn = json::array();
  for (const LayerDiagnostics& d : r.dynamics)
    dyn.push_back({{"tau", d.tau}, {"q_displacement", d.q_displacement}, {"k_displacement", d.k_displacement}});
  j["dynamics"] = dyn;
  if (!r.dynamics_curve.empty()) j["dynamics_curve"] = dynamics_curve_to_json(r.dynamics_curve);
  return j.dump(1) + "\n";
}

namespace {
/// Typed fields of a stored result, each error naming the file, the key and the value seen.
struct ResultReader {
  const std::string& source;
  [[noreturn]] void fail(const std::string& key, const std::string& expected, const json* v) const {
    throw io_error("result '" + source + "' is malformed: \"" + key + "\" " +
                   (v ? "is " + io::json_excerpt(*v) : std::string("is missing")) + "; expected " + expected);
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
    throw io_error("result '" + source + "' has format version " + io::json_excerpt(j.at("version")) + "; this build reads 1");
  if (j.contains("diverged_at")) {
    r.diverged_at = f.count<Index>(j, "diverged_at");
    if (r.diverged_at == 0) f.fail("diverged_at", "the step the loss was not finite (>= 1), or no such field", &j.at("diverged_at"));
  }
  // A diverged run has no perplexities (null); any other run has all four.
  visit_result_fields(r, [&](const char* key, auto& v, bool nullable) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>)
      v = f.text(j, key);
    else if constexpr (std::is_same_v<T, double>)
      v = nullable && r.diverged() && f.at(j, key).is_null() ? std::nan("") : f.number(j, key);
    else
      v = f.count<T>(j, key);
  });
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
  if (j.contains("dynamics_curve"))
    r.dynamics_curve = dynamics_curve_from_json(j.at("dynamics_curve"), "result '" + source + "' field 'dynamics_curve'");
  if (!r.diverged() && !(std::isfinite(r.valid_ppl) && r.valid_ppl > 0 && std::isfinite(r.test_ppl) && r.test_ppl > 0))
    throw io_error("result '" + source + "' holds a non-positive or non-finite perplexity");
  return r;
}

Store::Store(const Plan& plan, std::string dir) : plan_(plan), dir_(std::move(dir)) { reload(); }

void Store::reload() {
  // Nothing is created here: the folder appears with the first result saved (a refused command
  // leaves no empty folder behind).
  all_.clear();
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    refresh();
    return;
  }
  if (!fs::is_directory(dir_, ec))
    throw io_error("the results folder '" + dir_ + "' exists but is not a folder");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.is_regular_file() && e.path().extension() == ".json" && e.path().filename().string()[0] != '.')
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    RunResult r = result_from_json(read_text_file(f.string(), "result", result_limits.max_bytes), f.string());
    if (r.plan != plan_.name)
      throw io_error("result '" + f.string() + "' belongs to plan '" + bounded_quote(r.plan) + "', not to '" + plan_.name +
                     "' (the plan of this folder); move it to that plan's results folder");
    if (all_.count(r.id))
      throw io_error("results '" + all_.at(r.id).file + "' and '" + f.string() + "' are the same run (id " + r.id +
                     "); keep one");
    all_[r.id] = r;
  }
  refresh();
}

void Store::refresh() {
  std::map<std::string, const RunSpec*> by_id;
  for (const RunSpec& r : plan_.runs) by_id[r.id] = &r;
  results_.clear();
  orphans_.clear();
  for (const auto& [id, r] : all_) {
    const auto it = by_id.find(id);
    if (it == by_id.end()) {
      orphans_.push_back(r.file);
      continue;
    }
    if (it->second->identity != r.identity)
      throw io_error("result '" + r.file + "' has id " + bounded_quote(r.id) + " but its configuration differs from the plan's run "
                     "with that id (" + it->second->title() + "); the file was edited or comes from elsewhere");
    results_[id] = r;
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
  all_[r.id] = stored;
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

}  // namespace coupledqk::train::study
