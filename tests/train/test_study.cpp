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
    // the diagnostics at every evaluation survive the interruption and the resume
    CHECK(a.value("dynamics_curve", json()) == b.value("dynamics_curve", json()));
    if (a["variant"] == "leapfrog") {
      REQUIRE(a["dynamics_curve"].size() == 5);  // step 0, then every 4 of 16 steps
      CHECK(a["dynamics_curve"][0][0] == 0);
      CHECK(a["dynamics_curve"][4][0] == 16);
      CHECK(a["dynamics_curve"][4][2][0] == json::array({a["dynamics"][0]["q_displacement"], a["dynamics"][0]["k_displacement"],
                                                      a["dynamics"][0]["tau"]}));
    } else {
      CHECK(!a.contains("dynamics_curve"));
    }
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

TEST_CASE("study: tokens to match along a budget ladder, interpolated in log tokens") {
  // final log ppl 5.0, 4.6, 4.4 at log tokens 10, 11, 12
  const std::vector<std::pair<double, double>> ladder{{10, 5.0}, {11, 4.6}, {12, 4.4}};
  bool censored = true;
  CHECK(cs::log_tokens_to_match(ladder, 4.8, censored) == doctest::Approx(10.5));
  CHECK(!censored);
  CHECK(cs::log_tokens_to_match(ladder, 4.5, censored) == doctest::Approx(11.5));
  CHECK(!censored);
  CHECK(cs::log_tokens_to_match(ladder, 4.6, censored) == doctest::Approx(11));
  // outside the ladder: extrapolated along the nearest segment, flagged
  CHECK(cs::log_tokens_to_match(ladder, 5.2, censored) == doctest::Approx(9.5));
  CHECK(censored);
  CHECK(cs::log_tokens_to_match(ladder, 4.2, censored) == doctest::Approx(13));
  CHECK(censored);
  // a ladder that stops improving: its largest budget, a lower bound
  CHECK(cs::log_tokens_to_match({{10, 5.0}, {11, 4.6}, {12, 4.7}}, 4.0, censored) == doctest::Approx(12));
  CHECK(censored);
}

TEST_CASE("coupledqk-study: a plan that chooses from its own finished runs, and a run that diverges") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string plan = dir / "plan.json", results = dir / "results";
  const std::string defaults = R"("defaults": {"corpus": ")" + d.corpus + R"(", "vocab": 400, "dim": 32, "layers": 2,
    "heads": 4, "seq": 32, "batch": 4, "tokens": 1024, "lr": 0.003, "eval-every": 4, "eval-tokens": 0})";
  write_file(plan, R"({"plan": "c", "threads": 1, )" + defaults + R"(,
  "choices": [{"name": "best", "group": "g", "among": ["euler", "leapfrog"]},
              {"name": "blr", "flag": "lr", "groups": ["lo", "hi"]}],
  "groups": [{"name": "g", "variants": ["standard", "euler", "leapfrog"], "seeds": [1, 2]},
             {"name": "lo", "set": {"lr": 0.001}, "variants": ["standard", "$best"], "seeds": [1, 2]},
             {"name": "hi", "set": {"lr": 0.01}, "variants": ["standard", "$best"], "seeds": [1, 2]},
             {"name": "tuned", "set": {"lr": "$blr"}, "variants": ["standard", "$best"], "seeds": [1, 2, 3]},
             {"name": "steps", "variants": ["$best:2"], "seeds": [1, 2]},
             {"name": "more", "set": {"tokens": 2048}, "variants": ["standard"], "seeds": [1, 2]},
             {"name": "wild", "set": {"lr": 1000, "clip": 0}, "variants": ["standard"], "seeds": [1, 2]}],
  "claims": [{"id": "1", "title": "best beats standard", "test": "better", "a": "g/$best", "b": "g/standard"},
             {"id": "2", "title": "tuned", "test": "better", "a": "tuned/$best", "b": "tuned/standard"},
             {"id": "3", "title": "budget", "test": "tokens_to_match", "a": "g/$best", "ladder": ["g/standard", "more/standard"]},
             {"id": "4", "title": "wild", "test": "worse", "a": "wild/standard", "b": "g/standard"}],
  "figures": [{"id": "lr", "title": "ppl by lr", "kind": "ppl", "x": "lr", "log_x": true,
               "series": [{"label": "standard", "arms": ["lo/standard", "hi/standard"]}]}]})");
  const std::string base = "'" + plan + "' --results '" + results + "'";
  Ran r = run_study(dir, "status " + base);
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "0 of 10 runs finished"));  // g (6), more (2), wild (2): the others wait
  CHECK(contains(r.out, "group lo: waits for choice best"));
  CHECK(contains(r.out, "group tuned: waits for choice best, blr"));

  r = run_study(dir, "run " + base + " --work '" + (dir / "work") + "' --progress off");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "choices resolved"));
  CHECK(contains(r.err, "wild/standard seed 1: training diverged at step"));
  CHECK(contains(r.out, "all "));
  // what the rules chose, recomputed from the stored results
  std::map<std::string, json> by;  // "group/variant#seed" -> result
  for (const auto& [name, text] : result_files(results)) {
    const json j = json::parse(text);
    by[j["group"].get<std::string>() + "/" + j["variant"].get<std::string>() + "#" + std::to_string(j["seed"].get<int>())] = j;
  }
  auto mean_loss = [&](const std::string& arm) {
    return (by.at(arm + "#1")["valid_loss"].get<double>() + by.at(arm + "#2")["valid_loss"].get<double>()) / 2;
  };
  const std::string best = mean_loss("g/leapfrog") < mean_loss("g/euler") ? "leapfrog" : "euler";
  const json& stepped = by.at("steps/$best:2#1");
  CHECK(contains(stepped["identity"].get<std::string>(), "attention=" + best + "\n"));
  CHECK(contains(stepped["identity"].get<std::string>(), "steps=2\n"));
  for (const std::string label : {"standard", "$best"}) {
    const std::string lr = mean_loss("lo/" + label) <= mean_loss("hi/" + label) ? "lr=0.001\n" : "lr=0.01\n";
    CHECK(contains(by.at("tuned/" + label + "#3")["identity"].get<std::string>(), lr));
  }
  r = run_study(dir, "status " + base);
  CHECK(contains(r.out, "choice best = " + best));
  CHECK(contains(r.out, "of 21 runs finished") == false);  // tuned seeds 1, 2 are the sweep's runs
  // the diverged runs: stored, without perplexities, left out of the claim that names them
  const json& wild = by.at("wild/standard#1");
  CHECK(wild["diverged_at"].get<int>() >= 1);
  CHECK(wild["valid_ppl"].is_null());
  const std::string md = dir / "report.md";
  r = run_study(dir, "report " + base + " --out '" + md + "'");
  INFO(r.out, r.err);
  REQUIRE(r.status == 0);
  const json rep = json::parse(read_file(dir / "report.json"));
  const json& c4 = rep["claims"][3];
  CHECK(c4["verdict"] == "pending");
  CHECK(c4["diverged"] == 2);
  // claim 3 from the stored numbers: the tokens standard needs to reach best's final perplexity
  const json& c3 = rep["claims"][2];
  REQUIRE(c3["values"].size() == 2);
  for (int seed : {1, 2}) {
    const std::string s = "#" + std::to_string(seed);
    std::vector<std::pair<double, double>> ladder;
    for (const std::string arm : {"g/standard", "more/standard"})
      ladder.emplace_back(std::log(by.at(arm + s)["tokens"].get<double>()), by.at(arm + s)["valid_loss"].get<double>());
    bool censored = false;
    const double t = cs::log_tokens_to_match(ladder, by.at("g/" + best + s)["valid_loss"].get<double>(), censored);
    CHECK(c3["values"][seed - 1].get<double>() == doctest::Approx(std::exp(t) / 1024));
  }
  const std::string text = read_file(md);
  CHECK(contains(text, "\\$best = " + best));  // "$" outside code is escaped for markdown with maths
  CHECK(!contains(text, " $best"));
  CHECK(contains(text, "diverged"));
}

TEST_CASE("coupledqk-study: plans that choose are checked before anything runs") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string plan = dir / "plan.json";
  auto check_plan = [&](const std::string& choices, const std::string& groups, const std::string& message) {
    write_file(plan, R"({"plan": "t", "defaults": {"corpus": ")" + d.corpus + R"(", "vocab": 400, "dim": 32, "heads": 4,
      "seq": 32, "lr": 0.003}, "choices": [)" + choices + R"(], "groups": [{"name": "g", "variants": ["standard", "euler"],
      "seeds": [1]}, {"name": "h", "set": {"lr": 0.01}, "variants": ["standard", "euler"], "seeds": [1]}, )" + groups + "]}");
    const Ran r = run_study(dir, "status '" + plan + "' --results '" + (dir / "res") + "'");
    INFO(r.out, r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, message));
    CHECK(!fs::exists(dir / "res"));
  };
  const std::string ok = R"({"name": "b", "group": "g", "among": ["euler"]})";
  check_plan(ok, R"({"name": "x", "variants": ["$nope"], "seeds": [1]})", "variant '$nope' names no variant choice");
  check_plan(R"({"name": "b", "group": "g", "among": ["leapfrog"]})", R"({"name": "x", "variants": ["$b"], "seeds": [1]})",
             "group 'g' has no variant 'leapfrog'");
  check_plan(R"({"name": "b", "group": "zz", "among": ["euler"]})", R"({"name": "x", "variants": ["$b"], "seeds": [1]})",
             "there is no group 'zz'; groups: g, h, x");
  check_plan(R"({"name": "l", "flag": "lr", "groups": ["g", "g"]})", R"({"name": "x", "variants": ["standard"], "seeds": [1]})",
             "group 'g' is listed twice");
  check_plan(R"({"name": "l", "flag": "dimm", "groups": ["g", "h"]})", R"({"name": "x", "variants": ["standard"], "seeds": [1]})",
             "unknown flag 'dimm'");
  check_plan(R"({"name": "l", "flag": "lr", "groups": ["g", "h"]})", R"({"name": "x", "set": {"lr": "$l"}, "variants": ["leapfrog"], "seeds": [1]})",
             "'leapfrog' takes its lr from choice 'l', whose groups have no variant of that label");
  check_plan(R"({"name": "l", "flag": "lr", "groups": ["g", "h"]})", R"({"name": "x", "set": {"dim": "$l"}, "variants": ["standard"], "seeds": [1]})",
             "names no choice of 'dim'");
  check_plan(ok + R"(, {"name": "b", "group": "g", "among": ["euler"]})", R"({"name": "x", "variants": ["standard"], "seeds": [1]})",
             "choice name 'b' is used twice");
  // a choice that waits for itself through the group it reads
  check_plan(R"({"name": "c", "group": "x", "among": ["euler"]})", R"({"name": "x", "variants": ["euler", "$c:2"], "seeds": [1]})",
             "choices wait for each other in a circle: c -> c");
  check_plan(ok, R"({"name": "x", "variants": ["$b$"], "seeds": [1]})", "names a choice");
  // no "choices" at all: a reference is refused, not left waiting
  write_file(plan, R"({"plan": "t", "defaults": {"corpus": ")" + d.corpus + R"("}, "groups": [{"name": "x",
    "variants": ["$best"], "seeds": [1]}]})");
  const Ran r = run_study(dir, "status '" + plan + "' --results '" + (dir / "res") + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "variant '$best' names no variant choice"));
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

// ---- hostile plans, results and flags (issue 23): no crash, no command, no silent default, nothing
// left behind. Each case asserts the exit status, the message and that the folder is unchanged.
namespace {

/// Every file and folder under `dir` with its content: what "nothing on disk changed" compares.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    out[rel] = e.is_regular_file() ? read_file(e.path()) : std::string("<dir>");
  }
  return out;
}

/// Any file named `name` below `dir`.
bool exists_below(const fs::path& dir, const std::string& name) {
  if (!fs::exists(dir)) return false;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == name) return true;
  return false;
}

Ran run_compare(const TempDir& dir, const std::string& args) {
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = " COUPLEDQK_CACHE='" + tiny_data().cache + "' '" + std::string(COUPLEDQK_COMPARE_BIN) + "' " +
                          args + " > '" + out + "' 2> '" + err + "'";
  const int raw = std::system(cmd.c_str());
  Ran r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

/// Fake results for every run of a plan (no training): enough for the report's tables and plots.
void fake_results(const cs::Plan& p, const std::string& dir) {
  for (const cs::RunSpec& s : p.runs) {
    cs::RunResult r;
    r.plan = p.name;
    r.id = s.id;
    r.identity = s.identity;
    r.group = s.group;
    r.variant = s.variant.label;
    r.seed = s.seed;
    r.code_version = cs::code_version();
    const double base = (s.variant.attention == "standard" ? 50.0 : 48.0) + static_cast<double>(s.seed);
    r.valid_ppl = r.test_ppl = base;
    r.valid_loss = r.test_loss = std::log(base);
    r.tokens = 2048;
    r.steps = 16;
    r.parameters = 1000;
    r.threads = 1;
    r.device = "cpu";
    r.machine = "test";
    r.date = "2026-01-01";
    for (int i = 1; i <= 4; ++i)
      r.curve.push_back(coupledqk::train::CurvePoint{4 * i, 512 * i, std::log(base * (5 - i)), base * (5 - i)});
    write_file(fs::path(dir) / s.file_name(), cs::to_json(r));
  }
}

}  // namespace

TEST_CASE("coupledqk-study: hostile plans are refused with bounded messages, linearly, changing nothing") {
  TinyData& d = tiny_data();
  TempDir dir;
  const fs::path world = dir.path / "w";
  fs::create_directories(world);
  const std::string plan = (world / "plan.json").string();
  auto check_plan = [&](const std::string& text, const std::vector<std::string>& messages) {
    write_file(plan, text);
    const auto before = snapshot(world);
    const Ran r = run_study(dir, "status '" + plan + "'");  // default results folder: beside the plan
    INFO(r.err.substr(0, 2000));
    CHECK(r.status == 1);
    for (const std::string& m : messages) CHECK(contains(r.err, m));
    CHECK(r.err.size() < 4000);  // a bounded excerpt, never the value serialised whole
    CHECK(snapshot(world) == before);
    return r;
  };
  const json valid = json::parse(tiny_plan("t", d.corpus));
  auto with = [&](const std::function<void(json&)>& edit) {
    json j = valid;
    edit(j);
    return j.dump();
  };
  // deep nesting where a string or a number is expected: refused while reading (no stack overflow)
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  check_plan("{\"plan\": " + deep + ", \"groups\": []}",
             {"nests JSON arrays or objects more than 8 levels deep (at plan[0][0]", "at most 8 are accepted"});
  std::string deep_dim = tiny_plan("t", d.corpus);
  deep_dim.replace(deep_dim.find("\"dim\": 32"), 9, "\"dim\": " + deep);
  check_plan(deep_dim, {"more than 8 levels deep (at defaults.dim[0][0]"});
  check_plan(with([&](json& j) { j["defaults"]["dim"] = json::array({json::array({json::array({1})})}); }),
             {"defaults.dim: expected a number or a string; got [[[1]]]"});
  // a huge value where a string is expected: quoted by a bounded excerpt
  check_plan(with([&](json& j) { j["plan"] = json::array({std::string(1 << 20, 'x')}); }),
             {"\"plan\" = [\"xxxx", "bytes in all)", "must be a string"});
  check_plan(with([&](json& j) { j["defaults"]["corpus"] = std::string(100000, 'c'); }),
             {"unknown corpus 'cccc", "(100000 bytes in all)"});
  // duplicate keys, at the top and inside a group
  check_plan("{\"plan\": \"t\", \"plan\": \"u\", \"groups\": []}", {"has the key 'plan' twice (in the top level)"});
  std::string dup = tiny_plan("t", d.corpus);
  dup.replace(dup.find("\"dim\": 32"), 9, "\"dim\": 32, \"dim\": 64");
  check_plan(dup, {"has the key 'dim' twice (in defaults)"});
  // names are names: never a path, "." or ".."
  for (const std::string name : {"..", ".", "../x", "a/b", ".hidden", ""})
    check_plan(with([&](json& j) { j["plan"] = name; }), {"\"plan\" = \"" + name + "\""});
  check_plan(with([&](json& j) { j["plan"] = ".."; }), {"must not start with '.' (it is a name, not a path)"});
  check_plan(with([&](json& j) { j["plan"] = std::string(65, 'p'); }), {"at most 64 are accepted"});
  check_plan(with([&](json& j) { j["groups"][0]["name"] = ".."; }), {"groups[0]: \"name\" = \"..\" must not start with '.'"});
  check_plan(with([&](json& j) { j["notes"] = "../../secret.md"; }), {"\"notes\" = \"../../secret.md\" must use letters"});
  check_plan(with([&](json& j) { j["claims"][0]["id"] = "1 x"; }), {"claims[0]: \"id\" = \"1 x\" must use letters"});
  // values the CLI refuses are refused in a plan, with the CLI's words
  const Ran tokens0 = check_plan(with([&](json& j) { j["defaults"]["tokens"] = 0; }),
                                 {"--tokens must be a positive number of tokens; got 0"});
  check_plan(with([&](json& j) { j["defaults"]["min-lr"] = -0.5; }), {"--min-lr must be finite and >= 0; got -0.5"});
  check_plan(with([&](json& j) { j["defaults"]["warmup"] = "-5"; }), {"'--warmup' = '-5' is not a non-negative integer"});
  check_plan(with([&](json& j) { j["defaults"]["dim"] = -1; }), {"'--dim' = '-1' is not a non-negative integer"});
  check_plan(with([&](json& j) { j["defaults"]["dim"] = "99999999999999999999"; }),
             {"'--dim' = '99999999999999999999' is out of range; expected an integer in [0, "});
  check_plan(with([&](json& j) { j["threads"] = -5; }), {"\"threads\" must be an integer in [0, 1024] (0: every idle core); got -5"});
  check_plan(with([&](json& j) { j["threads"] = "4"; }), {"\"threads\" must be an integer in [0, 1024]", "got \"4\""});
  check_plan(with([&](json& j) { j["groups"][0]["seeds"] = json::parse("[1, 18446744073709551616]"); }),
             {"every seed must be a non-negative integer; got 1.8446744073709552e+19"});
  check_plan(with([&](json& j) { j["groups"][0]["seeds"] = json::array({1, -1}); }),
             {"every seed must be a non-negative integer; got -1"});
  check_plan(with([&](json& j) { j["claims"][1]["margin"] = -1; }), {"\"margin\" must be a positive number"});
  {  // the same words as the CLI
    const Ran cli = run_compare(dir, "--corpus '" + d.corpus + "' --tokens 0 --out '" + (world / "cmp").string() + "'");
    CHECK(cli.status != 0);
    CHECK(contains(cli.err, "--tokens must be a positive number of tokens; got 0"));
    CHECK(contains(tokens0.err, "--tokens must be a positive number of tokens; got 0"));
    CHECK(!fs::exists(world / "cmp"));
  }
  // size limit, before parsing
  check_plan("{\"plan\": \"t\", \"description\": \"" + std::string(5u << 20, 'd') + "\", \"groups\": []}",
             {"is 5242926 bytes long; at most 4194304 bytes are accepted"});
  // too many runs for one plan, before any is resolved
  {
    json j = valid;
    j["groups"][0]["seeds"] = json::array();
    for (int s = 0; s < 30000; ++s) j["groups"][0]["seeds"].push_back(s);
    check_plan(j.dump(), {"its groups list 60000 runs (seeds x variants); at most 20000 are accepted"});
  }
  // many groups: checked in time linear in the plan's size (a duplicated name at the end)
  {
    json j = valid;
    j["claims"] = json::array();
    j["groups"] = json::array();
    for (int g = 0; g < 4000; ++g)
      j["groups"].push_back({{"name", "g" + std::to_string(g)}, {"variants", {"standard"}}, {"seeds", {1}}});
    j["groups"].push_back({{"name", "g0"}, {"variants", {"standard"}}, {"seeds", {1}}});
    const double t0 = coupledqk::train::now_seconds();
    check_plan(j.dump(), {"groups[4000]: group name 'g0' is used twice"});
    CHECK(coupledqk::train::now_seconds() - t0 < 30);
  }
}

TEST_CASE("coupledqk-study: a plan cannot run a command through any of its strings") {
  TinyData& d = tiny_data();
  TempDir dir;
  const fs::path world = dir.path / "w";
  fs::create_directories(world);
  const std::string pwned = (world / "PWNED").string();
  // Every way a string could become a command: shell substitution, gnuplot's backquotes and
  // system(), a quote that ends a gnuplot string, a new line that starts a gnuplot command.
  const std::string payload = "x'; system('touch " + pwned + "'); print '`touch " + pwned + "`$(touch " + pwned +
                              ")\"\n!touch " + pwned + "\nsystem \"touch PWNED\"\n`touch PWNED`";
  const std::string plan = (world / "plan.json").string();
  const json valid = json::parse(tiny_plan("t", d.corpus, "\"standard\", \"leapfrog\", \"leapfrog:2\""));

  // 1. free text (description, cpu_time, claim titles and paper figures): data in the report
  {
    json j = valid;
    j["description"] = payload;
    j["cpu_time"] = payload;
    for (json& c : j["claims"]) {
      c["title"] = payload;
      c["paper"] = payload;
    }
    write_file(plan, j.dump());
    const cs::Plan p = cs::load_plan(plan);
    const std::string results = (world / "results" / "t").string();
    fake_results(p, results);
    const Ran r = run_study(dir, "report '" + plan + "' --out '" + (world / "report.md").string() + "'");
    INFO(r.out, r.err);
    REQUIRE(r.status == 0);
    CHECK(fs::exists(world / "report" / "paired.gp"));
    CHECK(contains(read_file(world / "report.md"), "system('touch"));  // quoted as text, not run
    CHECK(!exists_below(dir.path, "PWNED"));
    CHECK(!exists_below(fs::current_path(), "PWNED"));
    CHECK(!fs::exists(world / "report" / ".old-plots"));
  }
  // 2. every string that names something: refused before anything runs or is written
  const std::vector<std::pair<std::string, std::function<void(json&)>>> fields{
      {"plan", [&](json& j) { j["plan"] = payload; }},
      {"notes", [&](json& j) { j["notes"] = payload; }},
      {"defaults.corpus", [&](json& j) { j["defaults"]["corpus"] = payload; }},
      {"defaults.device", [&](json& j) { j["defaults"]["device"] = payload; }},
      {"defaults.precision", [&](json& j) { j["defaults"]["precision"] = payload; }},
      {"group name", [&](json& j) { j["groups"][0]["name"] = payload; }},
      {"variant", [&](json& j) { j["groups"][0]["variants"][0] = payload; }},
      {"claim id", [&](json& j) { j["claims"][0]["id"] = payload; }},
      {"claim test", [&](json& j) { j["claims"][0]["test"] = payload; }},
      {"claim a", [&](json& j) { j["claims"][0]["a"] = "g/" + payload; }},
      {"claim b", [&](json& j) { j["claims"][0]["b"] = payload + "/standard"; }},
      {"flag name", [&](json& j) { j["groups"][0]["set"] = {{payload, 1}}; }},
  };
  for (const auto& [field, edit] : fields) {
    INFO(field);
    json j = valid;
    edit(j);
    write_file(plan, j.dump());
    const auto before = snapshot(world);
    for (const std::string cmd : {"report --out '" + (world / "r2.md").string() + "'", std::string("status"),
                                  std::string("run --progress off")}) {
      const Ran r = run_study(dir, cmd + " '" + plan + "'");
      INFO(cmd, r.err.substr(0, 2000));
      CHECK(r.status != 0);
      CHECK(r.err.size() < 4000);
    }
    CHECK(snapshot(world) == before);
    CHECK(!exists_below(dir.path, "PWNED"));
  }
}

TEST_CASE("coupledqk-study: refused flags and failed reports leave everything as it was") {
  TinyData& d = tiny_data();
  TempDir dir;
  const fs::path world = dir.path / "w";
  fs::create_directories(world);
  const std::string plan = (world / "plan.json").string();
  write_file(plan, tiny_plan("t", d.corpus));
  const std::string work = (world / "work").string();
  const std::vector<std::pair<std::string, std::string>> refused{
      {"--shard 3/2", "--shard '3/2'; expected i/n with 1 <= i <= n"},
      {"--shard 0/2", "--shard '0/2'"},
      {"--shard 1/0", "--shard '1/0'"},
      {"--shard -1/2", "--shard '-1/2'"},
      {"--shard 1/2x", "--shard '1/2x'"},
      {"--shard 4294967297/4294967298", "--shard '4294967297/4294967298'"},
      {"--max-minutes -1", "--max-minutes must be a finite number >= 0"},
      {"--max-minutes nan", "--max-minutes"},
      {"--max-runs -1", "--max-runs must be >= 0"},
      {"--threads -5", "--threads must be in [0, 1024] (0: every idle core); got -5"},
      {"--threads 5000", "--threads must be in [0, 1024] (0: every idle core); got 5000"},
      {"--checkpoint-every 0", "--checkpoint-every must be >= 1"},
      {"--stop-run-after-steps -2", "--stop-run-after-steps must be >= 0"},
      {"--progress loud", "loud"},
      {"--work '" + plan + "'", "exists and is not a folder"},
      {"--device tpu", "--device 'tpu' is not one of: cpu, cuda"},
  };
  const auto before = snapshot(world);
  const auto cache_before = snapshot(fs::path(d.cache) / "study");
  for (const auto& [flags, message] : refused) {
    INFO(flags);
    const Ran r = run_study(dir, "run '" + plan + "' " + flags);  // default results folder
    INFO(r.err);
    CHECK(r.status != 0);
    CHECK(contains(r.err, message));
    CHECK(snapshot(world) == before);  // no empty results folder
    CHECK(snapshot(fs::path(d.cache) / "study") == cache_before);  // no work folder
  }

  // a failed report writes nothing: notes that cannot be read, into a folder that did not exist
  json j = json::parse(tiny_plan("t", d.corpus));
  j["notes"] = "missing.md";
  write_file(plan, j.dump());
  fake_results(cs::load_plan(plan), (world / "results" / "t").string());
  auto report = [&](const std::string& out) {
    const auto snap = snapshot(world);
    const Ran r = run_study(dir, "report '" + plan + "' --out '" + out + "'");
    CHECK(r.status == 1);
    CHECK(snapshot(world) == snap);
    return r;
  };
  Ran r = report((world / "new" / "sub" / "report.md").string());
  CHECK(contains(r.err, "names notes file"));
  CHECK(!fs::exists(world / "new"));
  // plots never go into a folder that holds something else; an earlier report stays as it was
  write_file(world / "mine" / "keep.txt", "mine");
  r = report((world / "mine.md").string());
  CHECK(contains(r.err, "holds other things than an earlier report's plots"));
  write_file(world / "notes.md", "notes");
  j["notes"] = "notes.md";
  write_file(plan, j.dump());
  Ran ok = run_study(dir, "report '" + plan + "' --out '" + (world / "rep.md").string() + "'");
  REQUIRE(ok.status == 0);
  CHECK(contains(read_file(world / "rep.md"), "notes"));
  fs::remove(world / "notes.md");
  r = report((world / "rep.md").string());
  CHECK(contains(r.err, "names notes file"));
  // a report again replaces the earlier one whole (no stale plots, no temporary folder)
  write_file(world / "notes.md", "notes");
  write_file(world / "rep" / "claim-stale.png", "old");
  ok = run_study(dir, "report '" + plan + "' --out '" + (world / "rep.md").string() + "'");
  REQUIRE(ok.status == 0);
  CHECK(!fs::exists(world / "rep" / "claim-stale.png"));
  CHECK(fs::exists(world / "rep" / "paired.tsv"));
  for (const auto& e : fs::directory_iterator(world)) CHECK(e.path().filename().string().rfind(".rep", 0) != 0);
}

TEST_CASE("coupledqk-study: hostile result files are refused naming the file and the key; nothing changes") {
  TinyData& d = tiny_data();
  TempDir dir;
  const fs::path world = dir.path / "w";
  const std::string plan = (world / "plan.json").string();
  write_file(plan, tiny_plan("t", d.corpus));
  const fs::path results = world / "results" / "t";
  fake_results(cs::load_plan(plan), results.string());
  const fs::path victim = fs::directory_iterator(results)->path();
  const json good = json::parse(read_file(victim));
  auto check_result = [&](const std::string& text, const std::string& message) {
    write_file(victim, text);
    const auto before = snapshot(world);
    const Ran r = run_study(dir, "report '" + plan + "' --out '" + (world / "rep.md").string() + "'");
    INFO(r.err.substr(0, 2000));
    CHECK(r.status == 1);
    CHECK(contains(r.err, victim.filename().string()));
    CHECK(contains(r.err, message));
    CHECK(r.err.size() < 4000);
    CHECK(snapshot(world) == before);
  };
  std::string deep = good.dump();
  deep.replace(deep.find("\"seed\":"), 7, "\"seed\":" + std::string(100000, '[') + std::string(100000, ']') + ",\"x\":");
  check_result(deep, "nests JSON arrays or objects more than 8 levels deep (at seed[0][0]");
  std::string dup = good.dump();
  dup.replace(dup.find("\"seed\":"), 7, "\"seed\":1,\"seed\":");
  check_result(dup, "has the key 'seed' twice");
  auto with = [&](const char* key, const json& v) {
    json j = good;
    j[key] = v;
    return j.dump();
  };
  check_result(with("seed", -1), "\"seed\" is -1; expected a non-negative integer");
  check_result(with("tokens", "many"), "\"tokens\" is \"many\"; expected a non-negative integer");
  check_result(with("plan", json::array({std::string(100000, 'p')})), "\"plan\" is [\"pppp");
  check_result(with("curve", json::array({json::array({1, 2, 3})})), "\"curve[0]\" is [1,2,3]; expected a curve point");
  check_result(with("curve", json::array({json::array({1, -2, 3, 4})})), "\"curve[0][1]\" is -2");
  check_result(with("dynamics", json::array({{{"tau", {1, "x"}}}})), "\"dynamics[0].tau[1]\" is \"x\"; expected a number");
  check_result(with("valid_ppl", 0), "non-positive or non-finite perplexity");
  check_result(good.dump() + std::string(17u << 20, ' '), "bytes long; at most 16777216 bytes are accepted");
}

TEST_CASE("coupledqk-compare: integer flags refuse negative and overlong values instead of wrapping") {
  TinyData& d = tiny_data();
  TempDir dir;
  const fs::path world = dir.path / "w";
  fs::create_directories(world);
  const std::string out = (world / "cmp").string();
  for (const auto& [value, message] :
       std::vector<std::pair<std::string, std::string>>{{"-1", "'-1' is not a non-negative integer"},
                                                        {"18446744073709551616", "'18446744073709551616' is out of range"},
                                                        {"99999999999999999999999", "is out of range"},
                                                        {"1e3", "'1e3' is not a non-negative integer"},
                                                        {"+5", "'+5' is not a non-negative integer"}}) {
    INFO(value);
    const Ran r = run_compare(dir, "--corpus '" + d.corpus + "' --seed " + value + " --out '" + out + "'");
    CHECK(r.status != 0);
    CHECK(contains(r.err, "--seed"));
    CHECK(contains(r.err, message));
    CHECK(contains(r.err, "expected an integer in [0, 18446744073709551615]"));
    CHECK(fs::is_empty(world));
  }
}

TEST_CASE("study run ids: positions and window enter a run's identity only away from their defaults") {
  TinyData& d = tiny_data();
  const cs::Plan p = cs::parse_plan(R"({"plan": "t", "defaults": {"corpus": ")" + d.corpus + R"(", "vocab": 400, "dim": 32,
    "heads": 4, "seq": 32}, "groups": [{"name": "g", "variants": ["standard"], "seeds": [1]},
    {"name": "r", "set": {"positions": "rope", "rope-base": 500, "window": 8}, "variants": ["standard"], "seeds": [1]}]})",
                            "plan.json");
  REQUIRE(p.runs.size() == 2);
  const std::string& plain = p.runs[0].identity;
  const std::string& rope = p.runs[1].identity;
  // the runs stored before these flags existed keep their ids
  for (const char* flag : {"positions=", "rope-base=", "rope-order=", "window="}) CHECK(!contains(plain, flag));
  CHECK(contains(rope, "positions=rope\n"));
  CHECK(contains(rope, "rope-base=500\n"));
  CHECK(contains(rope, "window=8\n"));
  CHECK(!contains(rope, "rope-order="));  // at its default
  CHECK(p.runs[0].id != p.runs[1].id);
}
