// Training checkpoints: ONE safetensors file, written atomically (io::write: temporary file, fsync,
// rename), that holds everything a run needs to continue bit for bit, and everything generation
// needs (the tokenizer included):
//
//   model.<name>      F32, every parameter of the GPT (AnyGpt::parameters() names and shapes)
//   opt.<name>        F32, the AdamW state: opt.m.<name>, opt.v.<name>, opt.step [1]
//   tokenizer.model   U8, the bytes of the SentencePiece model file
//   __metadata__      {"coupledqk": "<JSON>"}, the JSON described in docs/training.md:
//                     format + version, model config, the options that fix the trajectory, and the
//                     run's state (step, tokens seen, elapsed seconds, sampler RNG, eval curve)
//
// Reading is strict: a file that is not safetensors, or safetensors without the "coupledqk"
// metadata, or with another format name or a newer version, or with missing or misshapen tensors,
// raises coupledqk::io_error naming the file and what was wrong.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/model/decoder.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>
// The library's model construction by name compiles every built-in variant (each with its decoder,
// Gpt::make_decoder): the compiled table (coupledqk::variants) holds it, so no file of the example
// pays that compile time.
#include <coupledqk/variants.hpp>

#include "data/tokenizer.hpp"

namespace coupledqk::train {

using Model = AnyGpt<float>;

}  // namespace coupledqk::train



namespace coupledqk::train {

/// The format name and version in the "coupledqk" metadata.
inline constexpr const char* checkpoint_format = "coupledqk-train-checkpoint";
/// The newest version read (and written for models with rotary or no positions, or a window;
/// version 1 for the rest, so that earlier builds still read those).
inline constexpr int checkpoint_version = 2;

/// One point of the validation curve.
struct CurvePoint {
  Index step = 0;
  Index tokens = 0;       ///< training tokens seen
  double loss = 0;        ///< mean validation cross-entropy (nats/token)
  double ppl = 0;         ///< exp(loss)
};

/// The dynamics diagnostics of every block with dynamics at one evaluation (TrainOptions::
/// dynamics_probe_windows): how far the learned map moves queries and keys, and the integration
/// times, over training.
struct DynamicsPoint {
  Index step = 0;
  Index tokens = 0;
  std::vector<LayerDynamics> layers;  ///< blocks whose attention has dynamics, in order
};

/// Everything that fixes a run's trajectory: the model, the data and the optimisation. A resume
/// must match it field for field.
struct RunFingerprint {
  GptConfig model;
  std::string corpus;          ///< corpus_key() of the corpus spec
  std::string tokenizer_hash;  ///< Tokenizer::model_hash()
  Index batch = 0, seq = 0;
  double lr = 0, min_lr = 0;
  Index warmup = 0, total_steps = 0;
  double weight_decay = 0, clip = 0;
  std::uint64_t seed = 0;
};

/// Where a run stands.
struct RunState {
  Index step = 0;                          ///< optimiser updates done
  Index tokens_seen = 0;                   ///< step * batch * seq
  double elapsed = 0;                      ///< seconds of training so far (all sessions)
  std::array<std::uint64_t, 4> sampler{};  ///< state of the batch sampler's coupledqk::Rng
  std::vector<CurvePoint> curve;           ///< periodic validation results so far
  std::vector<DynamicsPoint> dynamics;     ///< dynamics diagnostics at those evaluations (when probed)
};

/// The "coupledqk" metadata of a checkpoint.
struct CheckpointInfo {
  RunFingerprint run;
  RunState state;
  int threads = 0;             ///< thread count of the session that wrote it (bit-identity needs the same)
  int ranks = 1;               ///< processes of the session that wrote it (bit-identity needs the same; any resumes)
  Index budget_tokens = 0;     ///< the budget the run was started with (one of the two is > 0)
  double budget_seconds = 0;
  std::string device = "cpu";     ///< where the session that wrote it trained (informative: any device resumes)
  std::string precision = "f32";  ///< its activation storage (f32, bf16)
};

/// The JSON text stored under the "coupledqk" metadata key, and its inverse (io_error on anything
/// malformed; `source` names the file in messages).
std::string to_json(const CheckpointInfo& info);
CheckpointInfo checkpoint_info_from_json(const std::string& text, const std::string& source);

/// Writes the checkpoint atomically (io_error on failure; an existing file is then untouched).
void write_checkpoint(const std::string& path, Model& model, AdamW<float>& optimizer,
                      const std::string& tokenizer_bytes, const CheckpointInfo& info);

/// A checkpoint read from disk and checked: the coupledqk metadata parses, and every model tensor
/// and tokenizer.model are present with the shapes the metadata's model config implies.
struct Checkpoint {
  io::file file;
  CheckpointInfo info;
};
Checkpoint read_checkpoint(const std::string& path);
/// The same checks on a file already read (file.source names it in messages).
Checkpoint checkpoint_from_file(io::file file);

/// Every check a run or a generation makes before it uses the checkpoint, without the data: the
/// model builds from the metadata and every model tensor is present, shaped, floating-point and
/// finite; the optimiser state is complete and agrees with the metadata's step; tokenizer.model is
/// a SentencePiece model. Throws io_error naming the file and the problem. (The preflight of
/// --resume runs it, so a damaged checkpoint fails before the data is prepared.)
void verify_checkpoint(const Checkpoint& ckpt);

/// The differences between the run the flags describe and the checkpoint's, one line each:
/// "--lr: 0.002 (flags) vs 0.001 (checkpoint)". Empty when they match. check_total_steps: false
/// for a --seconds budget (the checkpoint's estimate of the total step count stands).
std::vector<std::string> compare_runs(const RunFingerprint& flags, const RunFingerprint& checkpoint,
                                      bool check_total_steps = true);

/// Copies the model tensors into `model` (its config must be the checkpoint's) and checks that
/// they are finite.
void restore_model(const Checkpoint& ckpt, Model& model);
/// Copies the optimiser state (m, v, step) into `optimizer`; checks its step against the metadata.
void restore_optimizer(const Checkpoint& ckpt, AdamW<float>& optimizer);

/// A model built from the checkpoint's config, holding its parameters.
std::unique_ptr<Model> load_model(const Checkpoint& ckpt);
/// The bytes of tokenizer.model, and the tokenizer they hold.
std::string tokenizer_bytes(const Checkpoint& ckpt);
Tokenizer load_tokenizer(const Checkpoint& ckpt);

/// The views with `prefix` prepended to their names (e.g. "model.").
std::vector<TensorView<float>> prefixed(std::vector<TensorView<float>> views, const std::string& prefix);

}  // namespace coupledqk::train
