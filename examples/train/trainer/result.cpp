#include "result.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace coupledqk::train {

double final_train_loss(const std::vector<float>& losses) {
  if (losses.empty()) return std::nan("");
  const std::size_t n = std::min<std::size_t>(20, losses.size());
  double s = 0;
  for (std::size_t i = losses.size() - n; i < losses.size(); ++i) s += losses[i];
  return s / static_cast<double>(n);
}

std::string summary_json(const TrainOptions& o, const TrainResult& r) {
  nlohmann::ordered_json j;
  j["type"] = "summary";
  j["attention"] = r.config.attention;
  j["steps"] = r.config.steps;
  j["corpus"] = o.corpus;
  j["seed"] = o.seed;
  // A run without a final evaluation has NaN perplexities, written as null.
  visit_run_record(r, [&](const char* key, const auto& v, bool) { j[key] = v; });
  j["dynamics_percent"] = r.dynamics_percent;
  j["ranks"] = r.ranks;
  j["device"] = r.device;
  j["precision"] = r.precision;
  j["steps_done"] = r.steps_done;
  j["total_steps"] = r.total_steps;
  j["stopped_early"] = r.stopped_early;
  j["final_train_loss"] = r.final_train_loss;
  if (r.ranks > 1) {
    j["allreduce_seconds"] = r.reduce_seconds;
    j["allreduce_floats"] = r.reduced_floats;
  }
  j["wall_seconds"] = r.wall_seconds;
  return j.dump();
}

}  // namespace coupledqk::train
