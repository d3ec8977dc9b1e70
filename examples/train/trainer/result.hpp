// What a training run gives back: RunRecord (the numbers a finished run is known by, listed once),
// TrainResult (that record, plus the numbers of this session) and its one-line JSON summary, the
// last line of the metrics file. The study's stored result (study/store.hpp) is the same record
// plus the study's own fields.
#pragma once

#include <string>
#include <vector>

#include "records/checkpoint.hpp"
#include "options.hpp"

namespace coupledqk::train {

/// The numbers a finished run is known by, shared by the trainer's result, its summary line and
/// the study's stored result: one struct, and one list of its plain fields (visit_run_record) that
/// every writer and reader of them walks, so a field is added in one place.
struct RunRecord {
  Index parameters = 0;              ///< the model's parameters
  Index dynamics_parameters = 0;     ///< of which in the query-key dynamics
  int threads = 0;                   ///< per process
  Index tokens = 0;                  ///< tokens trained on, all sessions (step * batch * seq)
  double valid_loss = 0, valid_ppl = 0;  ///< whole validation split, at the end (NaN: none)
  double test_loss = 0, test_ppl = 0;    ///< whole test split, at the end (NaN: none)
  double tokens_per_s = 0;           ///< training throughput of the last session (evaluations excluded)
  double train_seconds = 0;          ///< training time, all sessions (RunState::elapsed)
  std::vector<CurvePoint> curve;     ///< (tokens seen, valid ppl): periodic evaluations, then the final one
};

/// The plain fields of a RunRecord, listed once: f(key, member, nullable), in the order they are
/// written. A nullable number is not finite when the run has no value for it (stopped early or
/// diverged: no final evaluation); the curve is structured and written by each writer beside them.
template <class Record, class F>
void visit_run_record(Record& r, F&& f) {
  f("parameters", r.parameters, false);
  f("dynamics_parameters", r.dynamics_parameters, false);
  f("threads", r.threads, false);
  f("tokens", r.tokens, false);
  f("valid_loss", r.valid_loss, true);
  f("valid_ppl", r.valid_ppl, true);
  f("test_loss", r.test_loss, true);
  f("test_ppl", r.test_ppl, true);
  f("tokens_per_s", r.tokens_per_s, false);
  f("train_seconds", r.train_seconds, false);
}

struct TrainResult : RunRecord {
  GptConfig config;
  double dynamics_percent = 0;       ///< 100 * dynamics_parameters / parameters
  int ranks = 1;                     ///< processes (mpirun -np N)
  std::string distributed = "one process";  ///< Communicator::description(), and the GPU reduction
  std::string device = "cpu";        ///< TrainOptions::device
  std::string precision = "f32";     ///< TrainOptions::precision
  std::string device_name;           ///< e.g. "cpu" or "cuda:0 NVIDIA H100 ... , bf16 activations ..."
  Index start_step = 0;              ///< steps already done when this session started (resume)
  Index steps_done = 0, total_steps = 0;
  bool stopped_early = false;        ///< stop_after_steps or a signal: no final evaluation
  bool interrupted = false;          ///< stopped by SIGINT / SIGTERM (install_interrupt_handler)
  std::vector<float> losses;         ///< training loss of every step of this session
  std::vector<double> grad_norms;    ///< gradient norm of every step of this session
  double last_loss = 0;              ///< the last step's loss
  double final_train_loss = 0;       ///< mean loss of the last (up to) 20 steps
  double reduce_seconds = 0;         ///< of which in the gradient all-reduce (several ranks; rank 0's clock)
  Index reduced_floats = 0;          ///< floats per all-reduce (the parameter count)
  double wall_seconds = 0;           ///< this session, evaluations and checkpoints included
  std::vector<DynamicsPoint> dynamics;  ///< at the same evaluations, when TrainOptions::dynamics_probe_windows > 0
};

/// Mean of the last (up to) 20 of `losses`; NaN when there are none.
double final_train_loss(const std::vector<float>& losses);

/// The result as one JSON object ("type": "summary"), as written at the end of the metrics file.
std::string summary_json(const TrainOptions& o, const TrainResult& r);

}  // namespace coupledqk::train
