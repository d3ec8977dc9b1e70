// coupledqk-study's claims: each claim of the plan evaluated on the finished runs (paired % changes,
// spread ratios, token ratios, shifts), with its 95% interval and verdict.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis/statistics.hpp"
#include "plan.hpp"
#include "store.hpp"

namespace coupledqk::train::study {

// The statistics (analysis/statistics.hpp), under the study's names too.
using train::Estimate;
using train::f_cdf;
using train::f_quantile;
using train::incomplete_beta;
using train::mean_ci;
using train::t_cdf;
using train::t_quantile;
using train::welch_ci;

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

}  // namespace coupledqk::train::study
