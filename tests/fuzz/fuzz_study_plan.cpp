// libFuzzer target: coupledqk-study's plan reader (examples/train/study/plan.cpp) -- the bounded JSON
// reader (depth, size, duplicate keys), every key and flag of a plan checked by the CLI's rules, the
// runs resolved and the claims' arms looked up. Any input must pass or raise
// coupledqk::invalid_argument / coupledqk::io_error; a plan that passes names only names.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "study.hpp"

namespace cs = coupledqk::train::study;
namespace ct = coupledqk::train;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const cs::Plan p = cs::parse_plan(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    // What a passing plan promises the report and the results folder: names, never paths.
    if (!ct::name_error(p.name).empty()) std::abort();
    for (const cs::Group& g : p.groups)
      if (!ct::name_error(g.name).empty()) std::abort();
    for (const cs::Claim& c : p.claims)
      if (!ct::name_error(c.id).empty()) std::abort();
    for (const cs::RunSpec& r : p.runs)
      if (r.file_name().find('/') != std::string::npos) std::abort();
    (void)cs::evaluate(p, {});
  } catch (const coupledqk::invalid_argument&) {
  } catch (const coupledqk::io_error&) {
  }
  return 0;
}
