// coupledqk-study's claims (study/claims.hpp): every claim of the plan on the finished runs.
#include "claims.hpp"

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


namespace coupledqk::train::study {

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

double log_tokens_to_match(const std::vector<std::pair<double, double>>& points, double target, bool& censored) {
  require(points.size() >= 2, "log_tokens_to_match: need at least 2 budgets; got ", points.size());
  censored = false;
  auto on = [&](std::size_t i) {  // the line through points i and i+1, at the target
    const auto [x0, y0] = points[i];
    const auto [x1, y1] = points[i + 1];
    return y0 == y1 ? (target <= y0 ? x0 : x1) : x0 + (target - y0) * (x1 - x0) / (y1 - y0);
  };
  if (points.front().second <= target) {  // the smallest budget already matches: extrapolated below
    censored = true;
    return std::min(on(0), points.front().first);
  }
  for (std::size_t i = 0; i + 1 < points.size(); ++i)
    if (points[i + 1].second <= target) return on(i);
  censored = true;  // the largest budget falls short: extrapolated above
  const std::size_t n = points.size();
  return points[n - 1].second < points[n - 2].second ? std::max(on(n - 2), points.back().first) : points.back().first;
}

std::vector<ClaimResult> evaluate(const Plan& plan, const std::map<std::string, RunResult>& results) {
  std::vector<ClaimResult> out;
  for (const Claim& claim : plan.claims) {
    ClaimResult cr;
    cr.claim = &claim;
    std::set<std::string> versions;
    const bool four = claim.test == ClaimTest::shift;
    std::vector<ArmRef> arms{claim.a, claim.b};
    if (four) arms = {claim.a, claim.b, claim.c, claim.d};
    if (claim.test == ClaimTest::tokens_to_match) {
      arms = {claim.a};
      arms.insert(arms.end(), claim.ladder.begin(), claim.ladder.end());
    }
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
    // Seeds whose runs of every arm named are finished; a seed with a diverged run is left out and
    // counted (the stability report lists it).
    std::set<std::uint64_t> diverged_seeds;
    auto seeds_of = [&](const std::vector<ArmRef>& xs) {
      std::vector<std::uint64_t> s;
      for (std::uint64_t seed : plan.group_of(xs.front(), claim.id).seeds) {
        bool all = true, diverged = false;
        for (const ArmRef& x : xs) {
          const RunResult* r = result_of(x, seed);
          all &= r != nullptr;
          diverged |= r && r->diverged();
        }
        if (all && diverged) diverged_seeds.insert(seed);
        if (all && !diverged) s.push_back(seed);
      }
      return s;
    };
    auto seeds_with = [&](const ArmRef& x, const ArmRef& y) { return seeds_of({x, y}); };
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
          if (const RunResult* r = result_of(claim.a, s); r && !r->diverged()) a.push_back(r->valid_ppl);
        for (std::uint64_t s : plan.group_of(claim.b, claim.id).seeds)
          if (const RunResult* r = result_of(claim.b, s); r && !r->diverged()) b.push_back(r->valid_ppl);
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
      case ClaimTest::tokens_to_match: {
        cr.seeds = seeds_of(arms);
        for (std::uint64_t s : cr.seeds) {
          const RunResult* a = result_of(claim.a, s);
          std::vector<std::pair<double, double>> points;  // (log tokens, log final valid ppl) of the ladder
          for (const ArmRef& l : claim.ladder) {
            const RunResult* r = result_of(l, s);
            points.emplace_back(std::log(static_cast<double>(r->tokens)), std::log(r->valid_ppl));
          }
          bool censored = false;
          const double t = log_tokens_to_match(points, std::log(a->valid_ppl), censored);
          cr.censored += censored;
          cr.values.push_back(std::exp(t) / static_cast<double>(a->tokens));
        }
        cr.estimate = mean_ci(cr.values);
        cr.statistic = "tokens " + claim.ladder.front().variant + " (each budget its own full schedule) needs to match " +
                       claim.a.text() + "'s final valid ppl / the tokens " + claim.a.text() +
                       " trained on; interpolated in log tokens between budgets";
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
    cr.diverged = static_cast<int>(diverged_seeds.size());
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
        case ClaimTest::tokens_to_match:
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
