// coupledqk-study's result store: one JSON file per finished run in the plan's results folder,
// each recording the plan's name and the code version that produced it (results of another plan
// are an error, results of another code version are kept and flagged, never silently mixed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plan.hpp"

namespace coupledqk::train::study {

/// Dynamics diagnostics of one layer (LayerDynamics, stored).
struct LayerDiagnostics {
  std::vector<double> tau;
  double q_displacement = 0, k_displacement = 0;
};

/// The stored result of a finished run: the trainer's RunRecord (trainer/result.hpp: perplexities,
/// throughput, parameters, the curve), copied from the run's TrainResult as one record, and the
/// study's own fields.
struct RunResult : RunRecord {
  std::string plan, id, identity, group, variant, code_version;
  std::uint64_t seed = 0;
  Index steps = 0;  ///< the run's training steps (TrainResult::total_steps)
  std::string device, machine, date;
  std::vector<LayerDiagnostics> dynamics;  ///< per layer; empty for standard attention
  std::vector<DynamicsPoint> dynamics_curve;  ///< the same at every evaluation (empty in older results)
  /// The step whose loss was not finite (the trainer stopped there), 0 for a finished run; its
  /// perplexities are then NaN ("null" in the file) and only the stability report uses it.
  Index diverged_at = 0;
  std::string file;  ///< where it was read from (not stored)
  bool diverged() const { return diverged_at > 0; }
};
std::string to_json(const RunResult& r);
RunResult result_from_json(const std::string& text, const std::string& source);

/// The code version compiled into this binary: "git describe --always --dirty" of the source tree
/// at build time, or "unknown".
std::string code_version();

/// The results folder of a plan: every <run file>.json in it.
class Store {
 public:
  /// Reads every result of the folder (created when missing). A file of another plan, or one
  /// whose identity does not match the run of the plan with its id, is an error naming the file;
  /// results of runs the plan no longer has are kept and listed in orphans().
  Store(const Plan& plan, std::string dir);
  const std::string& dir() const { return dir_; }
  /// Finished runs by id (the plan's runs only).
  const std::map<std::string, RunResult>& results() const { return results_; }
  const std::vector<std::string>& orphans() const { return orphans_; }
  /// Matches the folder's results against the plan's runs again (after resolve() added runs).
  void refresh();
  /// Reads the folder again (results other processes saved meanwhile), then refresh().
  void reload();
  bool done(const RunSpec& run) const { return results_.count(run.id) > 0; }
  /// Writes a result atomically (temporary file + rename) and records it.
  void save(const RunResult& r);
  /// Checks another folder's results against the plan and copies those this one lacks; returns
  /// {copied, already here (same id)}.
  std::pair<int, int> merge(const std::string& other_dir);

 private:
  const Plan& plan_;
  std::string dir_;
  std::map<std::string, RunResult> all_;  ///< every result of the folder, by id
  std::map<std::string, RunResult> results_;
  std::vector<std::string> orphans_;
};

/// The text of the file `path` (io_error naming `what` and the path when it is not a regular file,
/// is longer than `max_bytes` or cannot be read).
std::string read_text_file(const std::string& path, const char* what, std::size_t max_bytes);

}  // namespace coupledqk::train::study
