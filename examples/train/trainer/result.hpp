// What a training run gives back: TrainResult (the numbers of the run and of this session) and its
// one-line JSON summary, the last line of the metrics file.
#pragma once

#include <string>
#include <vector>

#include "../checkpoint.hpp"
#include "options.hpp"

namespace coupledqk::train {

struct TrainResult {
  GptConfig config;
  ParameterReport params;
  int threads = 0;                   ///< per process
  int ranks = 1;                     ///< processes (mpirun -np N)
  std::string distributed = "one process";  ///< Communicator::description(), and the GPU reduction
  std::string device = "cpu";        ///< TrainOptions::device
  std::string precision = "f32";     ///< TrainOptions::precision
  std::string device_name;           ///< e.g. "cpu" or "cuda:0 NVIDIA H100 ... , bf16 activations ..."
  Index start_step = 0;              ///< steps already done when this session started (resume)
  Index steps_done = 0, total_steps = 0;
  Index tokens_seen = 0;
  bool stopped_early = false;        ///< stop_after_steps or a signal: no final evaluation
  bool interrupted = false;          ///< stopped by SIGINT / SIGTERM (install_interrupt_handler)
  std::vector<float> losses;         ///< training loss of every step of this session
  std::vector<double> grad_norms;    ///< gradient norm of every step of this session
  double last_loss = 0;              ///< the last step's loss
  double final_train_loss = 0;       ///< mean loss of the last (up to) 20 steps
  double valid_loss = 0, valid_ppl = 0;  ///< whole validation split, at the end
  double test_loss = 0, test_ppl = 0;    ///< whole test split, at the end
  double tokens_per_s = 0;           ///< training throughput of this session (evaluations excluded)
  double reduce_seconds = 0;         ///< of which in the gradient all-reduce (several ranks; rank 0's clock)
  Index reduced_floats = 0;          ///< floats per all-reduce (the parameter count)
  double train_seconds = 0;          ///< training time, all sessions (RunState::elapsed)
  double wall_seconds = 0;           ///< this session, evaluations and checkpoints included
  std::vector<CurvePoint> curve;     ///< (tokens seen, valid ppl): periodic evaluations, then the final one
  std::vector<DynamicsPoint> dynamics;  ///< at the same evaluations, when TrainOptions::dynamics_probe_windows > 0
};

/// Mean of the last (up to) 20 of `losses`; NaN when there are none.
double final_train_loss(const std::vector<float>& losses);

/// The result as one JSON object ("type": "summary"), as written at the end of the metrics file.
std::string summary_json(const TrainOptions& o, const TrainResult& r);

}  // namespace coupledqk::train
