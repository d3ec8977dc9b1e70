#include "options.hpp"

#include "text.hpp"
#include "distributed/communicator.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace coupledqk::train {

namespace {

Index resolve_warmup(const TrainOptions& o, Index total_steps) {
  if (o.warmup >= 0) return o.warmup;
  const Index w = static_cast<Index>(std::llround(0.05 * static_cast<double>(total_steps)));
  return std::min(total_steps, std::max<Index>(1, w));
}

double resolve_min_lr(const TrainOptions& o) { return o.min_lr >= 0 ? o.min_lr : 0.1 * o.lr; }

}  // namespace

Index total_steps_for_tokens(Index budget, Index batch, Index seq) {
  const Index per_step = batch * seq;  // validate() bounds B*T by the memory estimate
  return std::max<Index>(1, budget / per_step + (budget % per_step != 0));  // ceil, without overflow
}

AdamWConfig optimiser_config(const TrainOptions& o, Index total_steps) {
  AdamWConfig c;
  c.lr = o.lr;
  c.min_lr = resolve_min_lr(o);
  c.warmup_steps = resolve_warmup(o, total_steps);
  c.total_steps = total_steps;
  c.weight_decay = o.weight_decay;
  c.clip_norm = o.clip;
  return c;
}

RunFingerprint fingerprint(const TrainOptions& o, Index total_steps, const std::string& tokenizer_hash) {
  RunFingerprint f;
  f.model = model_config(o);
  f.corpus = corpus_key(o.corpus);
  f.tokenizer_hash = tokenizer_hash;
  f.batch = o.batch;
  f.seq = o.seq;
  f.lr = o.lr;
  f.min_lr = resolve_min_lr(o);
  f.warmup = resolve_warmup(o, total_steps);
  f.total_steps = total_steps;
  f.weight_decay = o.weight_decay;
  f.clip = o.clip;
  f.seed = o.seed;
  return f;
}

Index effective_budget_tokens(const TrainOptions& o) {
  if (o.budget_tokens > 0) return o.budget_tokens;
  return o.budget_seconds > 0 ? 0 : Defaults::budget_tokens;
}

GptConfig model_config(const TrainOptions& o) {
  GptConfig c;
  c.vocab = o.vocab;
  c.dim = o.dim;
  c.layers = o.layers;
  c.heads = o.heads;
  c.context = o.seq;
  c.hidden = o.hidden;
  c.attention = o.attention;
  c.steps = o.steps;
  c.dynamics_init_scale = o.dynamics_init_scale;
  c.init_time = o.init_time;
  c.positions = parse_gpt_positions(o.positions, "--positions");
  c.rope_base = o.rope_base;
  c.rope_order = parse_rope_order(o.rope_order, "--rope-order");
  c.window = o.window;
  return c;
}
static double physical_memory_bytes() {
#if defined(__unix__) || defined(__APPLE__)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<double>(pages) * static_cast<double>(page);
#endif
  return 0;  // unknown
}
MemoryEstimate estimate_memory(const TrainOptions& o) {
  // In double: the sizes may be anything a flag holds, and no product may overflow. Lower bounds
  // (the model holds more: layer norms, biases, the dynamics' other tensors, cached activations).
  const double V = o.vocab, D = static_cast<double>(o.dim), L = static_cast<double>(o.layers),
               H = static_cast<double>(o.heads), T = static_cast<double>(o.seq), B = static_cast<double>(o.batch);
  const double d = H > 0 ? D / H : D, m = o.hidden > 0 ? static_cast<double>(o.hidden) : d;
  // (an unknown name is refused later, by preflight; until then count it as having dynamics)
  const bool dynamics =
      !builtin_variants.contains(o.attention) || builtin_variants.info(o.attention).has_dynamics;
  MemoryEstimate e;
  // wte [V, D], wpe [T, D], per block wq wk wv wo [D, D] and the MLP's [D, 4D] + [4D, D], the
  // dynamics' maps at least [d, m] and [m, d] per head.
  struct Term {
    double floats;
    const char* flags;
  };
  const Term params[] = {{V * D, "--vocab, --dim"},
                         {T * D, "--seq, --dim"},
                         {L * 12 * D * D, "--dim, --layers"},
                         {dynamics ? L * H * 2 * d * m : 0, "--m, --layers"}};
  // One step's activations: the logits [B*T, V], and per block at least its input [B*T, D]. (Not
  // the scores [B, H, T, T]: the fast attention path keeps only their row log-sum-exps.)
  const Term activations[] = {{B * T * V, "--batch, --seq, --vocab"}, {L * B * T * D, "--batch, --seq, --dim"}};
  double largest = -1;
  for (const Term& t : params) {
    e.parameters += t.floats;
    if (4 * t.floats > largest) largest = 4 * t.floats, e.dominant_flags = t.flags;
  }
  for (const Term& t : activations) {
    e.activations += t.floats;
    if (t.floats > largest) largest = t.floats, e.dominant_flags = t.flags;
  }
  // float32: parameters, gradients and AdamW's two moments; the activations once.
  e.bytes = 4 * (4 * e.parameters + e.activations);
  e.available = physical_memory_bytes();
  return e;
}

std::string threads_error(long long threads) {
  if (threads >= 0 && threads <= max_threads) return "";
  return "--threads must be in [0, " + std::to_string(max_threads) + "] (0: every idle core); got " +
         std::to_string(threads);
}

void validate(const TrainOptions& o) {
  std::vector<std::string> bad;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(what);
  };
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  check(!o.corpus.empty(), "--corpus is empty; give a corpus name (sotu, brown, moby-dick), a file or a folder");
  check(o.vocab >= Tokenizer::min_vocab_size && o.vocab <= Tokenizer::max_vocab_size,
        "--vocab " + s(o.vocab) + " is outside [" + s(Tokenizer::min_vocab_size) + ", " +
            s(Tokenizer::max_vocab_size) + "]");
  check(o.dim > 0, "--dim (D) must be positive; got " + s(o.dim));
  check(o.layers > 0, "--layers (L) must be positive; got " + s(o.layers));
  check(o.heads > 0, "--heads (H) must be positive; got " + s(o.heads));
  check(o.dim <= 0 || o.heads <= 0 || o.dim % o.heads == 0,
        "--dim (D) must be divisible by --heads (H); got D = " + s(o.dim) + ", H = " + s(o.heads));
  check(o.hidden >= 0, "--m (dynamics hidden width) must be >= 0 (0: D/H); got " + s(o.hidden));
  check(o.seq > 0, "--seq (T) must be positive; got " + s(o.seq));
  check(o.batch > 0, "--batch (B) must be positive; got " + s(o.batch));
  const int ranks = world().size();
  check(o.batch <= 0 || o.batch % ranks == 0,
        "--batch (B) " + s(o.batch) + " does not split evenly over the " + s(ranks) +
            " processes of this run: the global batch must be a multiple of the process count (e.g. --batch " +
            (o.batch >= ranks ? s(o.batch / ranks * ranks) + " or " : std::string()) +
            s((o.batch / ranks + 1) * ranks) + ")");
  check(o.budget_tokens >= 0, "--tokens must be positive; got " + s(o.budget_tokens));
  check(std::isfinite(o.budget_seconds) && o.budget_seconds >= 0,
        "--seconds must be positive; got " + s(o.budget_seconds));
  check(!(o.budget_tokens > 0 && o.budget_seconds > 0),
        "pass exactly one budget: --tokens " + s(o.budget_tokens) + " and --seconds " + s(o.budget_seconds) +
            " were both given");
  check(std::isfinite(o.lr) && o.lr > 0, "--lr must be finite and > 0; got " + s(o.lr));
  check(o.min_lr < 0 || (std::isfinite(o.min_lr) && o.min_lr <= o.lr),
        "--min-lr must be in [0, --lr = " + s(o.lr) + "]; got " + s(o.min_lr));
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
        "--weight-decay must be finite and >= 0; got " + s(o.weight_decay));
  check(std::isfinite(o.clip) && o.clip >= 0, "--clip must be finite and >= 0 (0 disables it); got " + s(o.clip));
  check(threads_error(o.threads).empty(), threads_error(o.threads));
  check(o.eval_every >= 0, "--eval-every must be >= 0 (0: only at the end); got " + s(o.eval_every));
  check(o.eval_tokens >= 0, "--eval-tokens must be >= 0 (0: the whole split); got " + s(o.eval_tokens));
  check(o.checkpoint_every >= 0, "--checkpoint-every must be >= 0; got " + s(o.checkpoint_every));
  check(o.stop_after_steps >= 0, "--stop-after-steps must be >= 0; got " + s(o.stop_after_steps));
  check(std::isfinite(o.dynamics_init_scale) && o.dynamics_init_scale >= 0,
        "--dynamics-init-scale must be finite and >= 0; got " + s(o.dynamics_init_scale));
  check(std::isfinite(o.init_time) && o.init_time > 0, "--init-time must be finite and > 0; got " + s(o.init_time));
  check(o.positions == "learned" || o.positions == "rope" || o.positions == "none",
        "--positions '" + o.positions + "' is not one of: learned, rope, none");
  check(o.rope_order == "dynamics-then-rotate" || o.rope_order == "rotate-then-dynamics",
        "--rope-order '" + o.rope_order + "' is not one of: dynamics-then-rotate, rotate-then-dynamics");
  check(std::isfinite(o.rope_base) && o.rope_base > 1, "--rope-base must be finite and > 1; got " + s(o.rope_base));
  check(o.positions != "rope" || o.heads <= 0 || o.dim % o.heads != 0 || (o.dim / o.heads) % 2 == 0,
        "--positions rope needs an even head width --dim / --heads; got " + s(o.dim) + " / " + s(o.heads) + " = " +
            s(o.heads > 0 ? o.dim / o.heads : 0));
  check(o.window >= 0, "--window must be >= 0 (0: no window); got " + s(o.window));
  check(o.device == "cpu" || o.device == "cuda", "--device '" + o.device + "' is not one of: cpu, cuda");
  check(o.precision == "f32" || o.precision == "bf16",
        "--precision '" + o.precision + "' is not one of: f32, bf16");
  check(!(o.device == "cpu" && o.precision == "bf16"),
        "--precision bf16 needs --device cuda (the CPU path computes in float32 only)");
  check(!o.resume || !o.checkpoint.empty(), "--resume needs --checkpoint PATH (the checkpoint to continue)");
  check(o.checkpoint_every == 0 || !o.checkpoint.empty(), "--checkpoint-every needs --checkpoint PATH");
  if (bad.empty()) {
    // Sizes a flag can hold but no machine can: say so now, naming the flags, instead of
    // std::bad_alloc (or an overflowing size) when the model or the first batch is allocated.
    const MemoryEstimate e = estimate_memory(o);
    auto gb = [](double bytes) { return fmt("%.3g GB", bytes / 1e9); };
    if (e.available > 0 && e.bytes > e.available)
      check(false, std::string(e.dominant_flags) + ": training with --vocab " + s(o.vocab) + " --dim " + s(o.dim) +
                       " --layers " + s(o.layers) + " --heads " + s(o.heads) + " --seq " + s(o.seq) + " --batch " +
                       s(o.batch) + (o.hidden > 0 ? " --m " + s(o.hidden) : std::string()) + " needs at least " +
                       gb(e.bytes) + " (" + fmt("%.3g", e.parameters) + " parameters with their gradients and AdamW " +
                       "state, " + fmt("%.3g", e.activations) + " activations per step), more than this machine's " +
                       gb(e.available) + " of memory; lower " + e.dominant_flags);
  }
  if (bad.empty() && o.warmup >= 0 && o.budget_tokens >= 0) {
    const Index total = total_steps_for_tokens(effective_budget_tokens(o), o.batch, o.seq);
    check(o.budget_seconds > 0 || o.warmup <= total,
          "--warmup " + s(o.warmup) + " exceeds the run's " + s(total) + " steps");
  }
  if (!bad.empty()) {
    if (bad.size() == 1) throw invalid_argument(bad[0]);
    throw invalid_argument("invalid options:" + join_lines(bad));
  }
}

void validate_explicit(const TrainOptions& o, const std::function<bool(const std::string&)>& given) {
  std::vector<std::string> bad;
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  // Flags whose field uses a "not given" value (0 or < 0) for the default: an explicit value in
  // that range is an error, never the default.
  if (given("--tokens") && o.budget_tokens <= 0)
    bad.push_back("--tokens must be a positive number of tokens; got " + s(o.budget_tokens) +
                  " (leave the flag out for the default of " + s(Defaults::budget_tokens) + ")");
  if (given("--seconds") && !(std::isfinite(o.budget_seconds) && o.budget_seconds > 0))
    bad.push_back("--seconds must be a positive, finite number of seconds; got " + s(o.budget_seconds));
  if (given("--warmup") && o.warmup < 0)
    bad.push_back("--warmup must be >= 0 steps; got " + s(o.warmup) +
                  " (leave the flag out for the default: 5% of the steps, at least 1)");
  if (given("--min-lr") && !(std::isfinite(o.min_lr) && o.min_lr >= 0))
    bad.push_back("--min-lr must be finite and >= 0; got " + s(o.min_lr) + " (leave the flag out for the default: 10% of --lr)");
  if (!bad.empty()) {
    if (bad.size() == 1) throw invalid_argument(bad[0]);
    throw invalid_argument("invalid options:" + join_lines(bad));
  }
  validate(o);
}

// ---- flags -----------------------------------------------------------------------------------------

std::vector<FlagSpec> train_flags(TrainOptions& o, bool run_flags) {
  std::vector<FlagSpec> f;
  f.push_back({"--corpus", "corpus: sotu, brown, moby-dick, a text file or a folder of text files", &o.corpus});
  f.push_back({"--cache", "cache folder for corpora, tokenizers and token streams ($COUPLEDQK_CACHE, else "
                          "<source>/.cache)", &o.cache_dir});
  f.push_back({"--vocab", "SentencePiece BPE vocabulary size V", &o.vocab});
  if (run_flags) {
    f.push_back({"--attention", "attention variant: " + builtin_variants.names_joined(), &o.attention});
    f.push_back({"--steps", "integration sub-steps N of the dynamics (1..7)", &o.steps});
  }
  f.push_back({"--m", "dynamics hidden width m (0: D/H)", &o.hidden});
  f.push_back({"--dim", "model width D", &o.dim});
  f.push_back({"--layers", "number of blocks L", &o.layers});
  f.push_back({"--heads", "attention heads H (query/key pairs per token)", &o.heads});
  f.push_back({"--seq", "sequence length T (the model's context)", &o.seq});
  f.push_back({"--batch", "sequences per step B", &o.batch});
  f.push_back({"--tokens", "token budget: ceil(tokens / (B*T)) steps (default " +
                               std::to_string(Defaults::budget_tokens) + " unless --seconds)", &o.budget_tokens, false});
  f.push_back({"--seconds", "time budget instead of --tokens: steps estimated from measured speed "
                            "(not reproducible)", &o.budget_seconds, false});
  f.push_back({"--lr", "peak learning rate (AdamW, after warm-up)", &o.lr});
  f.push_back({"--min-lr", "floor of the cosine decay (default: 10% of --lr)", &o.min_lr, false});
  f.push_back({"--warmup", "linear warm-up steps (default: 5% of the steps, at least 1)", &o.warmup, false});
  f.push_back({"--weight-decay", "decoupled weight decay on matrices", &o.weight_decay});
  f.push_back({"--clip", "global gradient-norm clipping (0: off)", &o.clip});
  f.push_back({"--dynamics-init-scale",
               "std of the dynamics' output weights at init: a, c; P*2; affine S, s0, T, t0 (0: standard at init)",
               &o.dynamics_init_scale});
  f.push_back({"--init-time", "integration time tau at init", &o.init_time});
  f.push_back({"--positions", "positions: learned (a wpe table, GPT-2), rope (rotary q, k in every layer) or none",
               &o.positions});
  f.push_back({"--rope-base", "rotary base (frequencies base^(-2i/d)); with --positions rope", &o.rope_base});
  f.push_back({"--rope-order", "with --positions rope: dynamics-then-rotate (the dynamics see position-free q, k) "
                               "or rotate-then-dynamics", &o.rope_order});
  f.push_back({"--window", "causal sliding window of every layer: each token reads its last W tokens (0: all)",
               &o.window});
  f.push_back({"--seed", "seed of the initialisation and the batch sampler", &o.seed});
  f.push_back({"--threads", "threads for Eigen's GEMMs and OpenMP loops; 0: the cores idle at start (all of them on an "
                            "idle machine, 1 when other processes are busy; a resumed run: the checkpoint's count). "
                            "Results are bit-identical only for the same count", &o.threads});
  f.push_back({"--device", "where the model trains: cpu, or cuda (a build with CUDA support and a GPU); checkpoints "
                           "move freely between the two", &o.device});
  f.push_back({"--precision", "activation storage on the device: f32, or bf16 (cuda only; float32 masters, "
                              "gradients and optimiser state)", &o.precision});
  f.push_back({"--eval-every", "steps between validation evaluations (0: only at the end)", &o.eval_every});
  f.push_back({"--eval-tokens", "validation tokens scored by periodic evaluations (0: all; the final one uses all)",
               &o.eval_tokens});
  if (run_flags) {
    f.push_back({"--checkpoint", "checkpoint file: written at the end and every --checkpoint-every steps",
                 &o.checkpoint});
    f.push_back({"--checkpoint-every", "steps between checkpoints (0: only at the end)", &o.checkpoint_every});
    f.push_back({"--resume", "continue the run saved in --checkpoint (the flags must match it)", &o.resume});
    f.push_back({"--metrics", "metrics file, JSON lines (appended to when resuming)", &o.metrics});
    f.push_back({"--stop-after-steps", "stop as if interrupted after this many steps, writing the checkpoint "
                                       "(for tests)", &o.stop_after_steps});
  }
  return f;
}

}  // namespace coupledqk::train
