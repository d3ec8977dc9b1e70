// Small text helpers of the trainer's messages.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace coupledqk::train {

/// Each line on its own indented line: the list of an error message.
inline std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + l;
  return out;
}

/// One number through a printf format ("%.3g").
inline std::string fmt(const char* format, double v) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

}  // namespace coupledqk::train
