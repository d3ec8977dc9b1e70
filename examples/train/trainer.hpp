// Training a GPT with coupled query-key attention on a corpus (docs/training.md):
//
//   TrainOptions o;  o.attention = "leapfrog";  o.budget_tokens = 1'000'000;
//   TrainData data = prepare_data(o);            // load, split 90/5/5, tokenizer, token streams
//   Progress progress;                           // bar on a terminal, lines otherwise
//   TrainResult r = train(o, data, progress);    // AdamW + cosine schedule; valid/test perplexity
//
// Each step draws B windows of T+1 tokens from the training stream at uniformly random offsets
// (a dedicated coupledqk::Rng whose state is checkpointed), runs model.loss (forward + backward)
// and one AdamW update. Same seed, data, thread count and binary: bit-identical losses. A run
// stopped and resumed from its checkpoint ends with exactly the parameters of an uninterrupted run.
// With device = "cuda" the same loop runs the model and the optimiser on the GPU (trainer/backend.hpp);
// the checkpoints stay the CPU model's and optimiser's, so runs move freely between the devices.
//
// Under mpirun (distributed/communicator.hpp, docs/distributed.md) the same call trains the same model on N
// processes: every rank draws the same B windows and computes the gradient of its B/N of them;
// rank 0's initial parameters are broadcast; the gradients are averaged (a fixed-order sum) before
// clipping and AdamW, so every rank applies the same update; evaluations are split over the ranks
// and summed; rank 0 alone prints, writes the metrics and the one checkpoint, which resumes with
// any N. Each step's results then differ from one process's by the rounding of the split sums.
//
// The trainer's rooms (examples/train/trainer/, docs/design.md "The training application"):
// options.hpp (TrainOptions, validation, the schedule, the flags), run_plan.hpp (preflight, data,
// resume, the number of steps, the sampler, the checkpoint writer), backend.hpp (where it trains:
// the CPU backend and the CUDA one behind one interface; threads), reducer.hpp (the gradient
// reduction and the other collectives), evaluation.hpp (perplexity of a stream), result.hpp
// (TrainResult, its summary) and loop.cpp (train(): step, reduce, update, evaluate, save). This
// header includes them all.
#pragma once

#include "trainer/backend.hpp"
#include "trainer/evaluation.hpp"
#include "trainer/options.hpp"
#include "trainer/result.hpp"
#include "trainer/run_plan.hpp"

namespace coupledqk::train {

/// Installs a SIGINT / SIGTERM handler after which train() stops at the end of the current step,
/// writes its checkpoint (when it has a path) and returns with `interrupted` set; a second signal
/// terminates as usual. interrupted(): whether a signal arrived.
void install_interrupt_handler();
bool interrupted();

/// Trains as the options say (see the file comment). Throws invalid_argument / io_error on bad
/// input before anything is written.
TrainResult train(const TrainOptions& o, const TrainData& data, Progress& progress);

}  // namespace coupledqk::train
