// The run plan: what a training run trains on and for how long, before and around the loop. The
// checks that fail fast (preflight), the data (prepare_data), the ranks' agreement on both, the
// checkpoint to resume (read by rank 0, sent to the others), the number of steps (a token budget,
// or a --seconds budget from the measured speed), the batch sampler, the restore of a resumed run,
// and the checkpoint writer (docs/training.md, "Checkpoints and resuming").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "records/checkpoint.hpp"
#include "distributed/communicator.hpp"
#include "records/progress.hpp"
#include "data/tokenizer.hpp"
#include "backend.hpp"
#include "options.hpp"

namespace coupledqk::train {

/// The checks that need neither data nor training: validate(o), the model can be built, the device
/// (--device cuda: this build has CUDA support and a CUDA device is usable), and the checkpoint
/// rules (--checkpoint naming an existing file needs --resume; --resume needs an existing,
/// readable coupledqk checkpoint whose model matches the flags). Run it before the (slow) data
/// preparation so that bad input fails fast. Never writes anything.
void preflight(const TrainOptions& o);

/// Data for training: the corpus split 90/5/5 by document, the tokenizer trained on the training
/// split, and the token streams (all cached under cache_dir).
struct TrainData {
  std::string corpus_key;
  Tokenizer tokenizer;
  std::string tokenizer_bytes;  ///< the .model file, stored in checkpoints
  TokenStreams streams;
  SplitStats stats;
};
TrainData prepare_data(const TrainOptions& o, Progress* progress = nullptr);

// ---- the pieces of a run that the training loop (loop.cpp) puts together ------------------------

/// The batch sampler's seed: derived from the run's seed, distinct from the model's initialisation.
std::uint64_t sampler_seed(std::uint64_t seed);

/// B random windows of T+1 tokens: tokens = window[0, T), targets = window[1, T]. Rows [first,
/// first + count) of them are kept (a rank's share; all B by default); the generator advances by
/// all B draws, so every rank's sampler stays the one of a single process.
void sample_batch(const std::vector<std::int32_t>& stream, Index batch, Index seq, Rng& rng,
                  std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets, Index first = 0,
                  Index count = -1);

/// Collective, before anything is trained: every rank has rank 0's flags and data, else every rank
/// throws collective_error naming the ranks and the differences (docs/distributed.md).
void check_ranks_agree(const TrainOptions& o, const TrainData& data, Communicator& comm);

/// The data must fit the options (the tokenizer's vocabulary, a training split longer than --seq,
/// validation and test splits of at least 2 tokens); throws naming the sizes otherwise.
void check_data_fits(const TrainOptions& o, const TrainData& data);

/// --resume: the checkpoint (preflight checked it is readable and that its model matches), read by
/// rank 0 and sent to the others, so that the ranks need no shared file system. Null without --resume.
std::unique_ptr<Checkpoint> read_resume_checkpoint(const TrainOptions& o, Communicator& comm);

/// The length of the run: the resumed checkpoint's under --seconds, else the token budget's, else
/// (a new --seconds run) as many steps as fit, measured with three calls of `step` on batches of
/// a separate generator (the model's sampler is untouched; not reproducible). `step` trains one
/// batch of this rank's rows (forward, backward and the gradient reduction, no update).
Index plan_total_steps(const TrainOptions& o, const Checkpoint* resumed, const TrainData& data, Index first_row,
                       Index local_batch, Communicator& comm,
                       const std::function<void(const std::vector<std::int32_t>&, const std::vector<std::int32_t>&)>& step,
                       Progress& progress);

/// A resumed run's restore: the checkpoint must match the run (else invalid_argument listing the
/// differences); the host model, the optimiser and the sampler take its state, which is returned.
/// Says (on `progress`) when the continuation will not be bit-identical (other ranks, device,
/// precision or, on the host, thread count) and where it resumes.
RunState restore_run(const TrainOptions& o, const Checkpoint& ckpt, const RunFingerprint& run, Model& model,
                     AdamW<float>& opt, Rng& sampler, int ranks, int threads, bool on_host, Progress& progress);

/// Writes the run's checkpoint (rank 0, when the run has a --checkpoint path): the host model and
/// optimiser, refreshed from the backend first, with the run's state.
class CheckpointWriter {
 public:
  CheckpointWriter(const TrainOptions& o, const TrainData& data, const RunFingerprint& run, int threads, int ranks,
                   bool root);
  /// `state` gets the sampler's state, the elapsed time and the curves before it is written.
  void save(RunState& state, const Rng& sampler, double elapsed, const std::vector<CurvePoint>& curve,
            const std::vector<DynamicsPoint>& dynamics, Model& model, AdamW<float>& opt, Backend& backend);

 private:
  const TrainOptions& o_;
  const TrainData& data_;
  CheckpointInfo info_;
  bool root_;
};

}  // namespace coupledqk::train
