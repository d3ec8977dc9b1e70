// coupledqk-study: the statistics against hand-computed values, and a tiny plan end to end through
// the binary: interrupted mid-run and between runs, resumed without repeating finished runs (and
// ending with the results of an uninterrupted study), the report's numbers recomputed here from the
// stored results, and bad input (plans, foreign or edited results, other code versions).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "study.hpp"

#ifndef COUPLEDQK_STUDY_BIN
#error "COUPLEDQK_STUDY_BIN must name the coupledqk-study binary"
#endif

using namespace cqk_train_test;
namespace cs = coupledqk::train::study;
using json = nlohmann::json;

namespace {

struct Ran {
  int status = -1;
  std::string out, err;
};

Ran run_study(const TempDir& dir, const std::string& args, const std::string& env = "") {
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = env + " COUPLEDQK_CACHE='" + tiny_data().cache + "' '" + std::string(COUPLEDQK_STUDY_BIN) + "' " +
                          args + " > '" + out + "' 2> '" + err + "'";
  const int raw = std::system(cmd.c_str());
  Ran r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::string tiny_plan(const std::string& name, const std::string& corpus, const std::string& variants = "\"standard\", \"leapfrog\"") {
  return R"({
  "plan": ")" + name + R"(",
  "description": "two variants x two seeds, a few steps",
  "threads": 1,
  "defaults": {"corpus": ")" + corpus + R"(", "vocab": 400, "dim": 32, "layers": 2, "heads": 4, "seq": 32,
               "batch": 4, "tokens": 2048, "lr": 0.003, "eval-every": 4, "eval-tokens": 0,
               "dynamics-init-scale": 0.05},
  "groups": [{"name": "g", "variants": [)" + variants + R"(], "seeds": [1, 2]}],
  "claims": [
    {"id": "1", "title": "leapfrog beats standard", "test": "better", "a": "g/leapfrog", "b": "g/standard"},
    {"id": "2", "title": "leapfrog is standard", "test": "equivalent", "margin": 0.5, "a": "g/leapfrog", "b": "g/standard"},
    {"id": "3", "title": "sample efficiency", "test": "tokens_to_target", "a": "g/leapfrog", "b": "g/standard"}
  ]
})";
}

std::map<std::string, std::string> result_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") out[e.path().filename().string()] = read_file(e.path());
  return out;
}

}  // namespace

TEST_CASE("study statistics against hand-computed values") {
  // I_x(a, b) for integers: sum_{j=a}^{a+b-1} C(a+b-1, j) x^j (1-x)^(a+b-1-j); a=2, b=3, x=0.4: 0.5248
  CHECK(cs::incomplete_beta(2, 3, 0.4) == doctest::Approx(0.5248).epsilon(1e-12));
  CHECK(cs::incomplete_beta(0.5, 0.5, 0.5) == doctest::Approx(0.5).epsilon(1e-12));
  // Student t quantiles (tables): 12.7062 (1 df), 4.3027 (2), 2.7764 (4), 2.0860 (20)
  CHECK(cs::t_quantile(0.975, 1) == doctest::Approx(12.706205).epsilon(1e-6));
  CHECK(cs::t_quantile(0.975, 2) == doctest::Approx(4.302653).epsilon(1e-6));
  CHECK(cs::t_quantile(0.975, 4) == doctest::Approx(2.776445).epsilon(1e-6));
  CHECK(cs::t_quantile(0.975, 20) == doctest::Approx(2.085963).epsilon(1e-6));
  CHECK(cs::t_quantile(0.025, 4) == doctest::Approx(-2.776445).epsilon(1e-6));
  // F quantiles (tables): F_0.975(4, 4) = 9.6045, F_0.975(2, 4) = 10.649; F_0.025(4, 4) = 1 / 9.6045
  CHECK(cs::f_quantile(0.975, 4, 4) == doctest::Approx(9.6045).epsilon(1e-4));
  CHECK(cs::f_quantile(0.975, 2, 4) == doctest::Approx(10.649).epsilon(1e-4));
  CHECK(cs::f_quantile(0.025, 4, 4) == doctest::Approx(1 / 9.6045).epsilon(1e-4));
  // mean 2.5, sd sqrt(5/3) = 1.290994, half-width 3.182446 * 1.290994 / 2 (t_0.975(3) = 3.182446)
  const cs::Estimate e = cs::mean_ci({1, 2, 3, 4});
  CHECK(e.n == 4);
  CHECK(e.mean == doctest::Approx(2.5));
  CHECK(e.sd == doctest::Approx(1.2909944));
  CHECK(e.lo == doctest::Approx(2.5 - 2.0542603).epsilon(1e-6));
  CHECK(e.hi == doctest::Approx(2.5 + 2.0542603).epsilon(1e-6));
  // Welch: a = {1,2,3} (var 1), b = {2,4,6,8} (var 20/3): se^2 = 1/3 + 5/3 = 2,
  // df = 4 / ((1/3)^2/2 + (5/3)^2/3) = 4.0754717
  const cs::Estimate w = cs::welch_ci({1, 2, 3}, {2, 4, 6, 8});
  CHECK(w.mean == doctest::Approx(-3));
  CHECK(w.sd == doctest::Approx(std::sqrt(2.0)));
  CHECK(w.hi - w.mean == doctest::Approx(cs::t_quantile(0.975, 4.0754717) * std::sqrt(2.0)).epsilon(1e-9));
  CHECK(cs::t_quantile(0.975, 4.0754717) == doctest::Approx(2.7574).epsilon(1e-3));  // 1/df-interpolated between 2.7764 (4) and 2.5706 (5)
  // one value: a point, no interval
  const cs::Estimate one = cs::mean_ci({3});
  CHECK(one.n == 1);
  CHECK(one.lo == 3);
  CHECK(one.hi == 3);
}

TEST_CASE("coupledqk-study: a tiny plan interrupted, resumed, reported; the same as uninterrupted") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string plan = dir / "plan.json";
  write_file(plan, tiny_plan("tiny", d.corpus));
  const std::string results = dir / "results", work = dir / "work";
  const std::string base = "'" + plan + "' --results '" + results + "'";
  const std::string run = "run " + base + " --work '" + work + "' --progress off";

  // 1. the first run stops after 3 of its 16 steps: a checkpoint, no result
  Ran r = run_study(dir, run + " --stop-run-after-steps 3");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "4 runs; 0 finished, 4 to run"));
  CHECK(contains(r.out, "stopped (--stop-run-after-steps): g/standard seed 1 at step 3 of 16"));
  CHECK(result_files(results).empty());
  CHECK(!fs::is_empty(work));

  // 2. two runs: the first resumes from its checkpoint
  r = run_study(dir, run + " --max-runs 2");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "resuming"));
  CHECK(contains(r.out, "stopping: --max-runs 2 reached; 2 runs left"));
  const auto after_two = result_files(results);
  REQUIRE(after_two.size() == 2);

  // 3. to completion, without repeating the finished runs (their files are untouched)
  r = run_study(dir, run);
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "2 finished, 2 to run"));
  CHECK(contains(r.out, "[4/4] done"));
  CHECK(!contains(r.out, "[1/4]"));
  const auto all = result_files(results);
  REQUIRE(all.size() == 4);
  for (const auto& [name, text] : after_two) CHECK(all.at(name) == text);
  // nothing left to do
  r = run_study(dir, run);
  CHECK(r.status == 0);
  CHECK(contains(r.out, "4 finished, 0 to run"));

  // 4. the same plan uninterrupted, elsewhere: the same results, bit for bit
  const std::string results2 = dir / "results2";
  r = run_study(dir, "run '" + plan + "' --results '" + results2 + "' --work '" + (dir / "work2") + "' --progress off");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  const auto straight = result_files(results2);
  REQUIRE(straight.size() == 4);
  for (const auto& [name, text] : all) {
    const json a = json::parse(text), b = json::parse(straight.at(name));
    CHECK(a["valid_ppl"].get<double>() == b["valid_ppl"].get<double>());
    CHECK(a["test_ppl"].get<double>() == b["test_ppl"].get<double>());
    CHECK(a["curve"] == b["curve"]);
    CHECK(a["dynamics"] == b["dynamics"]);
  }

  // 5. the report, its numbers recomputed here from the stored results
  const std::string md = dir / "report.md";
  r = run_study(dir, "report " + base + " --out '" + md + "'");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  REQUIRE(fs::exists(md));
  const json rep = json::parse(read_file(dir / "report.json"));
  std::map<std::pair<std::string, std::uint64_t>, json> by;  // (variant, seed) -> result
  for (const auto& [name, text] : all) {
    const json j = json::parse(text);
    by[{j["variant"].get<std::string>(), j["seed"].get<std::uint64_t>()}] = j;
    // diagnostics: leapfrog from a non-zero start moved q and k; standard has none
    if (j["variant"] == "leapfrog") {
      REQUIRE(j["dynamics"].size() == 2);
      CHECK(j["dynamics"][0]["q_displacement"].get<double>() > 1e-4);
      CHECK(j["dynamics"][0]["tau"].size() == 4);
    } else {
      CHECK(j["dynamics"].empty());
    }
  }
  std::vector<double> change;
  for (std::uint64_t s : {1, 2}) {
    const double a = by[{"leapfrog", s}]["valid_ppl"].get<double>(), b = by[{"standard", s}]["valid_ppl"].get<double>();
    change.push_back(100 * (a - b) / b);
  }
  const double mean = (change[0] + change[1]) / 2, sd = std::fabs(change[0] - change[1]) / std::sqrt(2.0);
  const double half = 12.706205 * sd / std::sqrt(2.0);  // t_0.975 with 1 degree of freedom
  const json& c1 = rep["claims"][0];
  CHECK(c1["id"] == "1");
  CHECK(c1["n"] == 2);
  CHECK(c1["values"][0].get<double>() == doctest::Approx(change[0]).epsilon(1e-12));
  CHECK(c1["mean"].get<double>() == doctest::Approx(mean).epsilon(1e-12));
  CHECK(c1["sd"].get<double>() == doctest::Approx(sd).epsilon(1e-9));
  CHECK(c1["lo"].get<double>() == doctest::Approx(mean - half).epsilon(1e-6));
  CHECK(c1["hi"].get<double>() == doctest::Approx(mean + half).epsilon(1e-6));
  const std::string v1 = mean + half < 0 ? "reproduced" : mean - half > 0 ? "contradicted" : "inconclusive";
  CHECK(c1["verdict"] == v1);
  const json& c2 = rep["claims"][1];
  const std::string v2 = (mean - half > -0.5 && mean + half < 0.5) ? "reproduced"
                         : (mean - half > 0.5 || mean + half < -0.5) ? "contradicted"
                                                                    : "inconclusive";
  CHECK(c2["verdict"] == v2);
  const json& c3 = rep["claims"][2];
  REQUIRE(c3["values"].size() == 2);
  for (std::size_t i = 0; i < 2; ++i) CHECK(c3["values"][i].get<double>() > 0);
  CHECK(c1["a_ppl"].get<double>() == doctest::Approx((by[{"leapfrog", 1}]["valid_ppl"].get<double>() +
                                                       by[{"leapfrog", 2}]["valid_ppl"].get<double>()) / 2));
  const std::string text = read_file(md);
  CHECK(contains(text, "4 of 4 finished"));
  CHECK(contains(text, "| 1. leapfrog beats standard |"));
  CHECK(contains(text, "Did the learned map leave the identity?"));

  // 6. another code version: kept, noted by run and status, flagged in the report
  {
    const std::string name = all.begin()->first;
    json j = json::parse(all.begin()->second);
    j["code_version"] = "some-other-version";
    write_file(fs::path(results) / name, j.dump(1));
    r = run_study(dir, "status " + base);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "code version some-other-version: 1 runs"));
    r = run_study(dir, run);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "1 stored results come from code version some-other-version"));
    r = run_study(dir, "report " + base + " --out '" + md + "'");
    CHECK(r.status == 0);
    CHECK(contains(read_file(md), "mixed code versions"));
  }

  // 7. merge: shard 2's folder into an empty one
  {
    const std::string merged = dir / "merged";
    r = run_study(dir, "merge '" + plan + "' --results '" + merged + "' '" + results2 + "'");
    INFO(r.out, r.err);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "4 results copied, 0 already here"));
    CHECK(result_files(merged).size() == 4);
    r = run_study(dir, "merge '" + plan + "' --results '" + merged + "' '" + (dir / "nowhere") + "'");
    CHECK(r.status == 1);
    CHECK(contains(r.err, "nowhere' is not a folder of study results"));
  }
}

TEST_CASE("coupledqk-study: bad plans and foreign results give clear errors and lose nothing") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string plan = dir / "plan.json";
  auto check_plan = [&](const std::string& text, const std::string& message) {
    write_file(plan, text);
    const Ran r = run_study(dir, "status '" + plan + "' --results '" + (dir / "res") + "'");
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, message));
  };
  check_plan(tiny_plan("t", d.corpus, "\"standard\", \"leapfrg\""),
             "unknown attention variant 'leapfrg'; accepted: standard, leapfrog");
  check_plan(tiny_plan("t", d.corpus, "\"standard\", \"leapfrog:9\""), "step count '9'; expected 1..7");
  check_plan(tiny_plan("t", dir / "no-such-corpus"), "unknown corpus '" + (dir / "no-such-corpus") + "'; accepted: sotu");
  check_plan("{\"plan\": \"t\", \"groups\": [", "is not valid JSON");
  check_plan("", "is not valid JSON");
  check_plan(std::string("\x89PNG\r\n\x1a\n\0\0", 10), "is not valid JSON");
  check_plan("{\"plan\": \"t\", \"groups\": [{\"name\": \"g\", \"variants\": [\"standard\"], \"seeds\": [1], "
             "\"set\": {\"dimm\": 3}}]}",
             "unknown flag 'dimm'; accepted: corpus, vocab, m, dim");
  check_plan("{\"plan\": \"t\", \"groups\": [{\"name\": \"g\", \"variants\": [\"standard\"], \"seeds\": [1], "
             "\"set\": {\"seed\": 3}}]}",
             "'seed' cannot be set here");
  check_plan("{\"plan\": \"t\", \"groupz\": []}", "unknown key 'groupz'");
  check_plan("{\"plan\": \"t\", \"defaults\": {\"corpus\": \"" + d.corpus + "\", \"dim\": 30, \"heads\": 4}, "
             "\"groups\": [{\"name\": \"g\", \"variants\": [\"standard\"], \"seeds\": [1]}]}",
             "--dim (D) must be divisible by --heads (H); got D = 30, H = 4");
  std::string bad_claim = tiny_plan("t", d.corpus);
  bad_claim.replace(bad_claim.find("\"g/standard\""), 12, "\"g/euler\"");
  check_plan(bad_claim, "claim 1 names 'g/euler', but group 'g' has no variant 'euler'; it has: standard, leapfrog");
  check_plan(std::string("{\"plan\": \"t\", \"threads\": -1, \"groups\": []}"), "\"threads\" must be an integer");

  // a stored result of another plan, or an edited one: an error naming the file; the file stays
  write_file(plan, tiny_plan("t", d.corpus));
  const std::string res = dir / "res";
  const cs::Plan p = cs::load_plan(plan);
  cs::RunResult foreign;
  foreign.plan = "another-plan";
  foreign.id = p.runs[0].id;
  foreign.identity = p.runs[0].identity;
  foreign.valid_ppl = foreign.test_ppl = 10;
  write_file(fs::path(res) / "x.json", cs::to_json(foreign));
  Ran r = run_study(dir, "run '" + plan + "' --results '" + res + "' --progress off");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "belongs to plan 'another-plan', not to 't'"));
  CHECK(contains(r.err, "x.json"));
  CHECK(fs::exists(fs::path(res) / "x.json"));
  foreign.plan = "t";
  foreign.identity = "dim=1\n";
  write_file(fs::path(res) / "x.json", cs::to_json(foreign));
  r = run_study(dir, "report '" + plan + "' --results '" + res + "' --out '" + (dir / "rep.md") + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "configuration differs from the plan's run"));
  write_file(fs::path(res) / "x.json", "{\"format\": \"coupledqk-study-result\", \"version\": 1}");
  r = run_study(dir, "status '" + plan + "' --results '" + res + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "x.json' is malformed"));
  CHECK(fs::exists(fs::path(res) / "x.json"));
  CHECK(!fs::exists(dir / "rep.md"));
  r = run_study(dir, "run '" + plan + "' --results '" + (dir / "res2") + "' --shard 3/2");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--shard '3/2'; expected i/n with 1 <= i <= n"));
  // under an MPI launcher every process would train the same runs: refused, pointing to --shard
  r = run_study(dir, "run '" + plan + "' --results '" + (dir / "res3") + "'", "OMPI_COMM_WORLD_SIZE=2");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "started as 2 processes by an MPI launcher"));
  CHECK(contains(r.err, "--shard i/n"));
}
