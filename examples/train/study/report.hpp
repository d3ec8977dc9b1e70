// coupledqk-study's report: docs/reproduction.md from the plan and its finished runs.
#pragma once

#include <string>
#include <vector>

#include "claims.hpp"
#include "plan.hpp"
#include "store.hpp"

namespace coupledqk::train::study {

struct ReportOptions {
  std::string out = "docs/reproduction.md";  ///< the markdown; plots go to <stem>/ beside it
  std::string command;                       ///< the commands quoted in the report
};
/// Writes the markdown report, a JSON of the claims' numbers (<stem>.json) and the PNG plots
/// (gnuplot; a note in the report where it is missing). Returns the files written.
std::vector<std::string> write_report(const Plan& plan, const Store& store, const ReportOptions& o);

}  // namespace coupledqk::train::study
