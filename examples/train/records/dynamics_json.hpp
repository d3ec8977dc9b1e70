// The dynamics diagnostics over training (DynamicsPoint, checkpoint.hpp) as JSON, one form for the
// checkpoint's state and the study's results: [[step, tokens, [[q_disp, k_disp, [tau...]], ...]], ...].
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <coupledqk/core/error.hpp>
#include <coupledqk/io/json_read.hpp>

#include "records/checkpoint.hpp"

namespace coupledqk::train {

inline nlohmann::json dynamics_curve_to_json(const std::vector<DynamicsPoint>& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const DynamicsPoint& p : curve) {
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerDynamics& l : p.layers) layers.push_back({l.q_displacement, l.k_displacement, l.tau});
    out.push_back({p.step, p.tokens, layers});
  }
  return out;
}

/// The inverse; io_error "<where> holds <excerpt>; expected ..." for anything else (finite
/// non-negative displacements and times; non-negative integer steps and tokens).
inline std::vector<DynamicsPoint> dynamics_curve_from_json(const nlohmann::json& j, const std::string& where) {
  auto fail = [&](const nlohmann::json& v, const char* expected) {
    return io_error(where + " holds " + io::json_excerpt(v) + "; expected " + expected);
  };
  auto count = [&](const nlohmann::json& v) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0))
      throw fail(v, "a non-negative integer step and token count");
    return v.get<Index>();
  };
  auto finite = [&](const nlohmann::json& v) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      throw fail(v, "a finite non-negative displacement or integration time");
    return v.get<double>();
  };
  if (!j.is_array()) throw fail(j, "an array of [step, tokens, layers]");
  std::vector<DynamicsPoint> out;
  for (const nlohmann::json& p : j) {
    if (!p.is_array() || p.size() != 3 || !p[2].is_array()) throw fail(p, "[step, tokens, [[q_disp, k_disp, [tau...]], ...]]");
    DynamicsPoint d;
    d.step = count(p[0]);
    d.tokens = count(p[1]);
    for (const nlohmann::json& l : p[2]) {
      if (!l.is_array() || l.size() != 3 || !l[2].is_array()) throw fail(l, "a layer [q_disp, k_disp, [tau...]]");
      LayerDynamics x;
      x.q_displacement = finite(l[0]);
      x.k_displacement = finite(l[1]);
      for (const nlohmann::json& t : l[2]) x.tau.push_back(finite(t));
      d.layers.push_back(std::move(x));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace coupledqk::train
