// The training run's options: TrainOptions (every flag of coupledqk-train), their defaults and
// their validation, the schedule they imply (steps, warm-up, AdamW's configuration), the model's
// configuration, and the flags described without a CLI library (docs/training.md).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <coupledqk/autodiff/tape.hpp>
#include <coupledqk/optim/adamw.hpp>

#include "records/checkpoint.hpp"
#include "records/progress.hpp"
#include "data/tokenizer.hpp"

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

/// The model's configuration for these options (context = seq).
GptConfig model_config(const TrainOptions& o);

/// The steps of a token budget: ceil(budget / (batch * seq)), at least 1.
Index total_steps_for_tokens(Index budget, Index batch, Index seq);
/// AdamW's configuration for a run of total_steps (warm-up and floor resolved from their defaults).
AdamWConfig optimiser_config(const TrainOptions& o, Index total_steps);
/// What a checkpoint must match to continue this run (compare_runs).
RunFingerprint fingerprint(const TrainOptions& o, Index total_steps, const std::string& tokenizer_hash);

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
