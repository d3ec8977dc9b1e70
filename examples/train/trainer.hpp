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
// With device = "cuda" the same loop runs the model and the optimiser on the GPU (device.hpp); the
// checkpoints stay the CPU model's and optimiser's, so runs move freely between the devices.
//
// Under mpirun (distributed.hpp, docs/distributed.md) the same call trains the same model on N
// processes: every rank draws the same B windows and computes the gradient of its B/N of them;
// rank 0's initial parameters are broadcast; the gradients are averaged (a fixed-order sum) before
// clipping and AdamW, so every rank applies the same update; evaluations are split over the ranks
// and summed; rank 0 alone prints, writes the metrics and the one checkpoint, which resumes with
// any N. Each step's results then differ from one process's by the rounding of the split sums.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <coupledqk/autodiff/tape.hpp>

#include "checkpoint.hpp"
#include "progress.hpp"
#include "tokenizer.hpp"

namespace coupledqk::train {

/// Defaults of the main job (coupledqk-compare) and of coupledqk-train, which differ only in the
/// vocabulary; docs/training.md gives the measurements behind them.
struct Defaults {
  static constexpr int vocab = 8192;          ///< coupledqk-train
  static constexpr int compare_vocab = 4096;  ///< coupledqk-compare: half the output layer's cost
  static constexpr Index dim = 128, layers = 2, heads = 4, seq = 128, batch = 16;
  static constexpr Index budget_tokens = 524'288;  // 256 steps of B*T = 2048 tokens
  static constexpr double lr = 2e-3;
  static constexpr Index eval_every = 32;
  static constexpr Index eval_tokens = 8192;
  static constexpr int threads = 0;  ///< automatic: idle_cores()
};

/// The most threads --threads accepts (training and generation).
inline constexpr int max_threads = 1024;
/// What is wrong with a --threads value; "" when it is in [0, max_threads]. The one rule of
/// validate(), coupledqk-study's --threads and a plan's "threads".
std::string threads_error(long long threads);

struct TrainOptions {
  // ---- data
  std::string corpus = "sotu";  ///< a corpus name, a file or a folder (load_corpus)
  std::string cache_dir = default_cache_dir();  ///< corpora, tokenizers, token streams (empty: the default)
  int vocab = Defaults::vocab;  ///< SentencePiece vocabulary size V
  // ---- model
  /// a name of the variant table (attention_names()); default: its first entry without dynamics
  std::string attention = builtin_variants.first_without_dynamics();
  int steps = 1;                       ///< integration sub-steps N
  Index hidden = 0;                    ///< dynamics width m; 0: D/H
  Index dim = Defaults::dim, layers = Defaults::layers, heads = Defaults::heads;
  Index seq = Defaults::seq;  ///< T, the training sequence length; the model's context is T
  double dynamics_init_scale = 0.0;
  double init_time = 1.0;
  std::string positions = "learned";  ///< learned (wpe), rope or none (GptConfig::positions)
  double rope_base = default_rope_base;
  std::string rope_order = "dynamics-then-rotate";  ///< or rotate-then-dynamics
  Index window = 0;  ///< causal sliding window of every layer; 0: none
  // ---- optimisation
  Index batch = Defaults::batch;  ///< B sequences per step
  Index budget_tokens = 0;        ///< total_steps = ceil(budget_tokens / (B*T)); reproducible
  double budget_seconds = 0;      ///< total_steps estimated from the speed of a few probe steps
  double lr = Defaults::lr;       ///< peak learning rate
  double min_lr = -1;             ///< floor of the cosine decay; < 0: 10% of lr
  Index warmup = -1;              ///< linear warm-up steps; < 0: 5% of total steps, at least 1
  double weight_decay = 0.1;
  double clip = 1.0;              ///< global gradient-norm clipping; 0 disables it
  std::uint64_t seed = 1;         ///< model initialisation and batch sampling
  int threads = Defaults::threads; ///< Eigen/OpenMP threads; 0: idle_cores() (or the checkpoint's on resume)
  // ---- device
  std::string device = "cpu";     ///< "cpu" or "cuda" (a build with COUPLEDQK_CUDA and a usable GPU)
  std::string precision = "f32";  ///< activation storage on the device: "f32" or "bf16" (cuda only)
  // ---- evaluation
  Index eval_every = Defaults::eval_every;    ///< steps between validation evaluations; 0: only at the end
  Index eval_tokens = Defaults::eval_tokens;  ///< cap of validation tokens for periodic evaluations; 0: all
  // ---- checkpoints and logs
  std::string checkpoint;     ///< checkpoint file (written at the end, every checkpoint_every steps)
  Index checkpoint_every = 0;
  bool resume = false;        ///< continue from `checkpoint`
  std::string metrics;        ///< JSON-lines file (appended to when resuming)
  Index stop_after_steps = 0; ///< stop as if interrupted once this many steps are done (checkpoint written)
  ProgressMode progress = ProgressMode::automatic;
  // ---- diagnostics (not flags: they change what is measured, never what is trained)
  /// At every evaluation, the dynamics diagnostics (Gpt::dynamics_diagnostics) of the first this
  /// many validation windows of length seq, into TrainResult::dynamics (and the checkpoint, so a
  /// resumed run keeps them); 0: none. Host models only (not --device cuda).
  Index dynamics_probe_windows = 0;
};

/// The token budget in effect: budget_tokens, or Defaults::budget_tokens when neither budget is set.
Index effective_budget_tokens(const TrainOptions& o);

/// Throws coupledqk::invalid_argument listing every problem with the options (sizes, ranges,
/// budgets, flag combinations) and, through make_gpt, an unknown variant or step count.
void validate(const TrainOptions& o);

/// validate(o), after refusing an explicit value of a flag whose field uses a "not given" value for
/// its default (--tokens 0, --seconds 0, --warmup -5, --min-lr -0.5): only an absent flag takes the
/// default. `given(name)` says whether the flag was on the command line.
void validate_explicit(const TrainOptions& o, const std::function<bool(const std::string&)>& given);

/// A lower bound on the memory a run of these sizes needs (float32 parameters, gradients and
/// AdamW state, and one step's logits and block inputs), with the flags of its largest term,
/// and the machine's physical memory (0: unknown). validate() refuses a run that cannot fit.
struct MemoryEstimate {
  double parameters = 0, activations = 0;  ///< floats
  double bytes = 0, available = 0;
  const char* dominant_flags = "";
};
MemoryEstimate estimate_memory(const TrainOptions& o);

/// The checks that need neither data nor training: validate(o), the model can be built, the device
/// (--device cuda: this build has CUDA support and a CUDA device is usable), and the checkpoint
/// rules (--checkpoint naming an existing file needs --resume; --resume needs an existing,
/// readable coupledqk checkpoint whose model matches the flags). Run it before the (slow) data
/// preparation so that bad input fails fast. Never writes anything.
void preflight(const TrainOptions& o);

/// The model's configuration for these options (context = seq).
GptConfig model_config(const TrainOptions& o);

/// The cores that are idle now: the idle share of all CPUs over 0.25 s (/proc/stat) times the
/// core count, rounded down after adding 0.3, at least 1 (every core where /proc/stat is missing).
/// Several threads are much slower than one when another process competes for the cores (Eigen's
/// GEMM threads spin-wait on each other), so the automatic count avoids busy cores.
int idle_cores();

/// Sets Eigen's and OpenMP's thread counts (0: idle_cores(), shared among the ranks of a
/// distributed run on this machine) and returns the count. Without OpenMP: 1.
int set_threads(int threads);

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

/// Mean cross-entropy and perplexity over non-overlapping windows of `seq` tokens of a stream
/// (each predicting its next tokens), `batch` windows at a time. max_tokens > 0 caps the tokens
/// scored (whole windows, at least one); 0 scores the whole stream.
struct Perplexity {
  double loss = 0, ppl = 0;
  Index tokens = 0;
};
/// One part of such an evaluation: the windows [count * part / parts, count * (part + 1) / parts)
/// of the `count` that evaluate_stream scores, `batch` at a time; total = the sum of their
/// token losses. Part 0 of 1 is evaluate_stream's computation, in its order.
struct PartialLoss {
  double total = 0;
  Index tokens = 0;        ///< tokens of this part
  Index all_tokens = 0;    ///< tokens of every part
};
Perplexity evaluate_stream(const Model& model, Tape<float>& tape, const std::vector<std::int32_t>& stream,
                           Index seq, Index batch, Index max_tokens = 0);
/// The same with any evaluator: loss(tokens, targets, batch) -> mean loss of the batch (e.g. a device's).
using BatchLoss = std::function<float(TokenSpan tokens, TokenSpan targets, Index batch)>;
Perplexity evaluate_stream(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                           Index max_tokens = 0);
PartialLoss evaluate_part(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                          Index max_tokens, int part, int parts);

/// Whether this build can train on CUDA (--device cuda), i.e. it was configured with COUPLEDQK_CUDA.
bool cuda_support_compiled();

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

/// Installs a SIGINT / SIGTERM handler after which train() stops at the end of the current step,
/// writes its checkpoint (when it has a path) and returns with `interrupted` set; a second signal
/// terminates as usual. interrupted(): whether a signal arrived.
void install_interrupt_handler();
bool interrupted();

/// Trains as the options say (see the file comment). Throws invalid_argument / io_error on bad
/// input before anything is written.
TrainResult train(const TrainOptions& o, const TrainData& data, Progress& progress);

/// The result as one JSON object ("type": "summary"), as written at the end of the metrics file.
std::string summary_json(const TrainOptions& o, const TrainResult& r);

// ---- command-line flags, described without a CLI library ----------------------------------------

/// One flag bound to a field of the options (the mains turn these into CLI11 options).
struct FlagSpec {
  std::string name;  ///< "--dim"
  std::string help;
  std::variant<std::string*, int*, Index*, double*, std::uint64_t*, bool*> target;
  bool show_default = true;  ///< false where the field's initial value is a "not given" marker
};

/// The flags of a training run. run_flags: include the flags that only make sense for one run
/// (--attention, --steps, --checkpoint*, --resume, --metrics, --stop-after-steps).
std::vector<FlagSpec> train_flags(TrainOptions& o, bool run_flags);

/// Registers the flags with a CLI11-like `app` (add_option(name, value, help) returning an option
/// with capture_default_str(); add_flag(name, bool, help)), without this header depending on it.
template <class App>
void add_flags(App& app, const std::vector<FlagSpec>& specs) {
  for (const FlagSpec& f : specs)
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_same_v<T, bool>) {
            app.add_flag(f.name, *target, f.help);
          } else {
            auto* opt = app.add_option(f.name, *target, f.help);
            if (f.show_default) opt->capture_default_str();
            // CLI11 wraps "-1" and 2^64 into an unsigned field: the one integer rule refuses them.
            if constexpr (std::is_same_v<T, std::uint64_t>)
              opt->check([](const std::string& text) {
                return unsigned_error(text, std::numeric_limits<std::uint64_t>::max());
              });
          }
        },
        f.target);
}

}  // namespace coupledqk::train
