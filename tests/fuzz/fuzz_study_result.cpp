// libFuzzer target: the inputs of `coupledqk-study report` -- a stored result file read by
// result_from_json (bounded JSON, typed fields naming the key), then used for every run of a small
// plan and evaluated by every claim test (paired changes, spreads, tokens to target, shifts; the
// statistics on whatever numbers the file holds). Any input must pass or raise coupledqk::io_error /
// coupledqk::invalid_argument.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "study.hpp"

namespace cs = coupledqk::train::study;

namespace {
const cs::Plan& plan() {
  static const cs::Plan p = cs::parse_plan(R"({
    "plan": "fuzz", "defaults": {"corpus": "sotu", "vocab": 400, "dim": 32, "layers": 1, "heads": 4, "seq": 32,
                                 "batch": 4, "tokens": 2048},
    "groups": [{"name": "g", "variants": ["standard", "leapfrog", "euler:2"], "seeds": [1, 2, 3]}],
    "claims": [
      {"id": "1", "title": "t", "test": "better", "a": "g/leapfrog", "b": "g/standard"},
      {"id": "2", "title": "t", "test": "worse", "a": "g/leapfrog", "b": "g/standard"},
      {"id": "3", "title": "t", "test": "equivalent", "margin": 1, "a": "g/leapfrog", "b": "g/standard"},
      {"id": "4", "title": "t", "test": "spread_ratio", "a": "g/leapfrog", "b": "g/standard"},
      {"id": "5", "title": "t", "test": "tokens_to_target", "a": "g/leapfrog", "b": "g/standard"},
      {"id": "6", "title": "t", "test": "shift", "a": "g/leapfrog", "b": "g/standard", "c": "g/euler:2", "d": "g/standard"}
    ]})", "fuzz-plan.json");
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const cs::RunResult r = cs::result_from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    // The same numbers for every run, and the fuzzed curve scaled per run so that arms differ.
    std::map<std::string, cs::RunResult> results;
    double k = 1;
    for (const cs::RunSpec& s : plan().runs) {
      cs::RunResult x = r;
      x.id = s.id;
      x.valid_ppl *= k;
      for (auto& p : x.curve) p.ppl *= k;
      k *= 1.01;
      results[s.id] = x;
    }
    (void)cs::evaluate(plan(), results);
    (void)cs::to_json(r);
  } catch (const coupledqk::io_error&) {
  } catch (const coupledqk::invalid_argument&) {
  }
  return 0;
}
