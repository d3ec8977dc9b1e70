// "name[:steps]": how coupledqk-compare's --variants and coupledqk-study's plans name a variant.
#pragma once

#include <cstdlib>
#include <string>

#include <coupledqk/core/error.hpp>
#include <coupledqk/io/quote.hpp>  // io::detail::quote: a bounded excerpt of the text
#include <coupledqk/registry.hpp>

namespace coupledqk::train {

struct VariantSpec {
  std::string label;      ///< as written: "leapfrog:3"
  std::string attention;  ///< "leapfrog"
  int steps = 1;
};

/// "leapfrog:3" -> {label, attention, steps}; invalid_argument "<where>: '<text>' has step count ..."
/// for a bad step count. The name itself is not checked here (the registry does that).
inline VariantSpec parse_variant_spec(const std::string& text, const std::string& where) {
  VariantSpec v;
  v.label = text;
  const auto colon = text.find(':');
  v.attention = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string s = text.substr(colon + 1);
    char* end = nullptr;
    const long n = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || n < 1 || n > max_steps)
      throw invalid_argument(where + ": '" + io::detail::quote(text) + "' has step count '" + io::detail::quote(s) +
                             "'; expected 1.." +
                             std::to_string(max_steps));
    v.steps = static_cast<int>(n);
  }
  return v;
}

}  // namespace coupledqk::train
