#include "trainer.hpp"

#include "device.hpp"
#include "distributed.hpp"
#include "fnv1a.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#endif
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace coupledqk::train {

namespace {

std::string cache_of(const TrainOptions& o) { return o.cache_dir.empty() ? default_cache_dir() : o.cache_dir; }

/// The batch sampler's seed: derived from the run's seed, distinct from the model's initialisation.
std::uint64_t sampler_seed(std::uint64_t seed) { return seed ^ 0x73616d706c657273ull; /* "samplers" */ }

Index total_steps_for_tokens(Index budget, Index batch, Index seq) {
  const Index per_step = batch * seq;  // validate() bounds B*T by the memory estimate
  return std::max<Index>(1, budget / per_step + (budget % per_step != 0));  // ceil, without overflow
}

Index resolve_warmup(const TrainOptions& o, Index total_steps) {
  if (o.warmup >= 0) return o.warmup;
  const Index w = static_cast<Index>(std::llround(0.05 * static_cast<double>(total_steps)));
  return std::min(total_steps, std::max<Index>(1, w));
}

double resolve_min_lr(const TrainOptions& o) { return o.min_lr >= 0 ? o.min_lr : 0.1 * o.lr; }

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

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + l;
  return out;
}

/// B random windows of T+1 tokens: tokens = window[0, T), targets = window[1, T]. Rows [first,
/// first + count) of them are kept (a rank's share; all B by default); the generator advances by
/// all B draws, so every rank's sampler stays the one of a single process.
void sample_batch(const std::vector<std::int32_t>& stream, Index batch, Index seq, Rng& rng,
                  std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets, Index first = 0,
                  Index count = -1) {
  if (count < 0) count = batch;
  const auto starts = static_cast<std::uint64_t>(static_cast<Index>(stream.size()) - seq);  // >= 1
  tokens.resize(static_cast<std::size_t>(count * seq));
  targets.resize(tokens.size());
  for (Index b = 0; b < batch; ++b) {
    const auto s = static_cast<std::ptrdiff_t>(rng.next_u64() % starts);
    if (b < first || b >= first + count) continue;
    std::copy(stream.begin() + s, stream.begin() + s + seq, tokens.begin() + (b - first) * seq);
    std::copy(stream.begin() + s + 1, stream.begin() + s + 1 + seq, targets.begin() + (b - first) * seq);
  }
}

/// The tensors' values in one flat buffer (and back): the messages of the collectives.
std::size_t total_size(const std::vector<TensorView<float>>& views) {
  std::size_t n = 0;
  for (const auto& v : views) n += static_cast<std::size_t>(v.size());
  return n;
}
void pack(const std::vector<TensorView<float>>& views, std::vector<float>& flat) {
  flat.resize(total_size(views));
  std::size_t at = 0;
  for (const auto& v : views) {
    std::copy(v.data, v.data + v.size(), flat.begin() + static_cast<std::ptrdiff_t>(at));
    at += static_cast<std::size_t>(v.size());
  }
}
void unpack(const std::vector<float>& flat, const std::vector<TensorView<float>>& views) {
  std::size_t at = 0;
  for (const auto& v : views) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at), flat.begin() + static_cast<std::ptrdiff_t>(at + v.size()),
              v.data);
    at += static_cast<std::size_t>(v.size());
  }
}

/// The flags that must agree between the ranks, one "--name value" line each: every flag of a run
/// but --cache (a machine's own folder) and --threads (a machine's own cores).
std::string flag_lines(TrainOptions o) {
  std::string out;
  for (const FlagSpec& f : train_flags(o, true)) {
    if (f.name == "--cache" || f.name == "--threads") continue;
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          std::ostringstream os;
          if constexpr (std::is_same_v<T, double>) {
            // The shortest text that reads back as the same double: "0.003", not "0.0030000000000000001".
            for (int digits = 6; digits <= 17; ++digits) {
              std::ostringstream t;
              t.precision(digits);
              t << *target;
              if (std::strtod(t.str().c_str(), nullptr) == *target || digits == 17) {
                os << t.str();
                break;
              }
            }
          } else if constexpr (std::is_same_v<T, bool>) {
            os << (*target ? "true" : "false");
          } else {
            os << *target;
          }
          out += f.name + " " + os.str() + "\n";
        },
        f.target);
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// A description of the prepared data that differs when any token, split or the tokenizer does.
std::string data_fingerprint(const TrainData& data) {
  std::uint64_t h = fnv1a64_bytes(data.tokenizer_bytes.data(), data.tokenizer_bytes.size());
  for (const auto* s : {&data.streams.train, &data.streams.valid, &data.streams.test}) {
    const std::uint64_t n = s->size();
    h = fnv1a64_bytes(&n, sizeof n, h);
    h = fnv1a64_bytes(s->data(), s->size() * sizeof(std::int32_t), h);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "train/valid/test " + std::to_string(data.streams.train.size()) + "/" +
         std::to_string(data.streams.valid.size()) + "/" + std::to_string(data.streams.test.size()) +
         " tokens, vocabulary " + std::to_string(data.tokenizer.vocab_size()) + ", fingerprint " + hex;
}

/// Collective, before anything is trained: every rank has rank 0's flags and data, else every rank
/// throws collective_error naming the ranks and the differences (docs/distributed.md).
void check_ranks_agree(const TrainOptions& o, const TrainData& data, Communicator& comm) {
  if (comm.size() == 1) return;
  std::string flags = flag_lines(o), root_flags = flags;
  comm.broadcast(root_flags);
  std::string error;
  if (flags != root_flags) {
    const auto mine = split_lines(flags), theirs = split_lines(root_flags);
    std::string diffs;
    for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
      const std::string a = i < mine.size() ? mine[i] : "(none)", b = i < theirs.size() ? theirs[i] : "(none)";
      if (a != b) diffs += (diffs.empty() ? "" : "; ") + a + " here vs " + b + " on rank 0";
    }
    error = "started with other flags than rank 0 (every rank must get the same flags): " + diffs;
  }
  std::string fp = data_fingerprint(data), root_fp = fp;
  comm.broadcast(root_fp);
  if (fp != root_fp)
    error += (error.empty() ? "" : "; and ") + std::string("read other data than rank 0 (corpus '") + o.corpus +
             "': " + fp + " here vs " + root_fp + " on rank 0; every rank must read the same corpus and tokenizer)";
  comm.agree(error);
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error("cannot read '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string fmt(const char* format, double v) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

/// Creates and removes a file in `dir` the way the checkpoint writer does; throws io_error naming
/// the flag (--checkpoint, --metrics) and the reason when the folder takes no new file (permissions,
/// a read-only file system).
void require_writable_folder(const char* flag, const std::string& checkpoint, const std::filesystem::path& dir) {
#if defined(__unix__) || defined(__APPLE__)
  const std::filesystem::path probe =
      dir / ("." + std::filesystem::path(checkpoint).filename().string() + ".tmp." +
             std::to_string(static_cast<long>(::getpid())) + ".probe");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return;  // a file of that name exists: the folder is writable enough to have it
    throw io_error(std::string(flag) + " '" + checkpoint + "': cannot create a file in the folder '" + dir.string() +
                   "' (" + std::strerror(err) + "); it could not be written during the run");
  }
  ::close(fd);
  ::unlink(probe.c_str());
#else
  (void)flag;
  (void)checkpoint;
  (void)dir;
#endif
}

/// --device cuda needs a build with CUDA support and a usable device; throws saying which is missing.
void require_cuda_device() {
#ifdef COUPLEDQK_WITH_CUDA
  select_cuda_device(world().local_rank(), world().local_size());  // one GPU per rank of this machine
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw runtime_error("--device cuda: no CUDA device is usable (" + why + ")");
#else
  throw invalid_argument(
      "--device cuda: this build has no CUDA support (configure with -DCOUPLEDQK_CUDA=ON where nvcc is installed)");
#endif
}

/// The device trainer of --device cuda (null for the CPU), holding the host model's parameters.
std::unique_ptr<DeviceTrainer> make_device_trainer(const TrainOptions& o, Model& model) {
  if (o.device != "cuda") return nullptr;
  require_cuda_device();
#ifdef COUPLEDQK_WITH_CUDA
  auto dev = make_cuda_trainer(model.config(), o.precision);
  dev->from_host(model, nullptr);
  return dev;
#else
  (void)model;
  return nullptr;  // not reached: require_cuda_device() threw
#endif
}

}  // namespace

bool cuda_support_compiled() {
#ifdef COUPLEDQK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// ---- options ---------------------------------------------------------------------------------------

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

void preflight(const TrainOptions& o) {
  namespace fs = std::filesystem;
  validate(o);
  make_gpt<float>(model_config(o), o.seed);  // unknown variant, step count, sizes the layer rejects
  if (o.device == "cuda") require_cuda_device();
  if (!world().root()) return;  // rank 0 alone reads the checkpoint and writes files (docs/distributed.md)
  if (!o.metrics.empty()) {
    const fs::path p(o.metrics);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw io_error("--metrics '" + o.metrics + "': the folder '" + dir.string() + "' does not exist");
    if (fs::is_directory(p, ec)) throw io_error("--metrics '" + o.metrics + "' is a folder; give a file path");
    require_writable_folder("--metrics", o.metrics, dir);
  }
  if (o.checkpoint.empty()) return;
  std::error_code ec;
  const bool exists = fs::exists(o.checkpoint, ec);
  if (exists && fs::is_directory(o.checkpoint, ec))
    throw io_error("--checkpoint '" + o.checkpoint + "' is a folder; give a file path");
  const fs::path p(o.checkpoint);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!o.resume) {
    if (exists)
      throw invalid_argument("checkpoint '" + o.checkpoint +
                             "' exists; pass --resume to continue that run, or choose another path");
    if (!fs::is_directory(dir, ec))
      throw io_error("--checkpoint '" + o.checkpoint + "': the folder '" + dir.string() + "' does not exist");
  }
  if (o.resume && !exists)
    throw io_error("--resume: there is no checkpoint at '" + o.checkpoint +
                   "'; drop --resume to start a new run there");
  // The checkpoint is written next to itself (a temporary file, then a rename): find out now, not
  // after the whole training, that the folder takes no new file.
  require_writable_folder("--checkpoint", o.checkpoint, dir);
  // Temporaries of earlier writes of this checkpoint whose process was killed mid-write.
  if (const std::size_t n = io::remove_stale_temporaries(o.checkpoint))
    std::fprintf(stderr, "note: removed %zu stale temporary file(s) of '%s' left by a killed run\n", n,
                 o.checkpoint.c_str());
  if (!o.resume) return;
  const Checkpoint ckpt = read_checkpoint(o.checkpoint);
  // Everything but the tokenizer (that needs the data) and, for a --seconds budget, the step count.
  const bool by_seconds = o.budget_seconds > 0;
  const Index total = by_seconds ? ckpt.info.run.total_steps
                                 : total_steps_for_tokens(effective_budget_tokens(o), o.batch, o.seq);
  const auto diffs = compare_runs(fingerprint(o, total, ckpt.info.run.tokenizer_hash), ckpt.info.run, !by_seconds);
  if (!diffs.empty())
    throw invalid_argument("checkpoint '" + o.checkpoint + "' does not match the flags (" +
                           std::to_string(diffs.size()) + " difference" + (diffs.size() > 1 ? "s" : "") +
                           "):" + join_lines(diffs));
  verify_checkpoint(ckpt);  // NaN weights, non-float tensors, a damaged optimiser state or tokenizer
}

int idle_cores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#ifdef _OPENMP
  cores = omp_get_num_procs();
#endif
  cores = std::max(1, cores);
  // Busy and idle jiffies of all CPUs from the first line of /proc/stat, twice, 0.25 s apart.
  auto sample = [](double& busy, double& idle) {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (!(in >> cpu) || cpu != "cpu") return false;
    for (double& x : v)
      if (!(in >> x)) return false;
    idle = v[3] + v[4];  // idle + iowait
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return true;
  };
  double b0 = 0, i0 = 0, b1 = 0, i1 = 0;
  if (!sample(b0, i0)) return cores;
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  if (!sample(b1, i1) || b1 + i1 <= b0 + i0) return cores;
  const double idle_fraction = (i1 - i0) / ((b1 + i1) - (b0 + i0));
  return std::clamp(static_cast<int>(std::floor(idle_fraction * cores + 0.3)), 1, cores);
}

int set_threads(int threads) {
#ifdef _OPENMP
  if (threads <= 0) threads = std::max(1, idle_cores() / world().local_size());
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  return threads;
#else
  (void)threads;
  return 1;
#endif
}

// ---- data ------------------------------------------------------------------------------------------

TrainData prepare_data(const TrainOptions& o, Progress* progress) {
  const double t0 = now_seconds();
  const std::string cache = cache_of(o);
  Split split = split_documents(load_corpus(o.corpus, cache));
  const std::string key = corpus_key(o.corpus);
  Tokenizer tok = Tokenizer::train_or_load(split.train, key, o.vocab, cache);
  TokenStreams streams = tokenize_split(split, tok, cache, key);
  SplitStats stats = split_stats(split, streams);
  std::string bytes = read_file_bytes(tok.model_path());
  if (progress) {
    std::ostringstream os;
    os << "data: corpus '" << o.corpus << "' (" << stats.train.documents + stats.valid.documents + stats.test.documents
       << " documents), vocab " << tok.vocab_size() << (tok.trained() ? " (tokenizer trained now)" : "")
       << ", tokens train/valid/test " << streams.train.size() << "/" << streams.valid.size() << "/"
       << streams.test.size() << ", " << fmt("%.1f", now_seconds() - t0) << " s";
    progress->message(os.str());
  }
  return TrainData{key, std::move(tok), std::move(bytes), std::move(streams), stats};
}

Perplexity evaluate_stream(const Model& model, Tape<float>& tape, const std::vector<std::int32_t>& stream,
                           Index seq, Index batch, Index max_tokens) {
  const BatchLoss loss = [&](TokenSpan tokens, TokenSpan targets, Index nb) {
    return model.evaluate(tape, tokens, targets, nb);
  };
  return evaluate_stream(loss, stream, seq, batch, max_tokens);
}

Perplexity evaluate_stream(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                           Index max_tokens) {
  const PartialLoss part = evaluate_part(loss, stream, seq, batch, max_tokens, 0, 1);
  Perplexity p;
  p.tokens = part.all_tokens;
  p.loss = part.total / static_cast<double>(p.tokens);
  p.ppl = std::exp(p.loss);
  return p;
}

PartialLoss evaluate_part(const BatchLoss& loss, const std::vector<std::int32_t>& stream, Index seq, Index batch,
                          Index max_tokens, int part, int parts) {
  const Index N = static_cast<Index>(stream.size());
  require(N >= 2, "evaluate: the stream holds ", N, " token(s); at least 2 are needed (one to predict)");
  require(seq > 0 && batch > 0, "evaluate: seq and batch must be positive; got ", seq, ", ", batch);
  require(parts > 0 && part >= 0 && part < parts, "evaluate: part ", part, " of ", parts, " does not exist");
  const Index W = std::min(seq, N - 1);
  Index count = (N - 1) / W;
  if (max_tokens > 0) count = std::min(count, std::max<Index>(1, max_tokens / W));
  const Index first = count * part / parts, end = count * (part + 1) / parts;
  std::vector<std::int32_t> tokens, targets;
  double total = 0;
  for (Index i = first; i < end; i += batch) {
    const Index nb = std::min(batch, end - i);
    tokens.resize(static_cast<std::size_t>(nb * W));
    targets.resize(tokens.size());
    for (Index b = 0; b < nb; ++b) {
      const auto s = static_cast<std::ptrdiff_t>((i + b) * W);
      std::copy(stream.begin() + s, stream.begin() + s + W, tokens.begin() + b * W);
      std::copy(stream.begin() + s + 1, stream.begin() + s + 1 + W, targets.begin() + b * W);
    }
    total += static_cast<double>(loss(tokens, targets, nb)) * static_cast<double>(nb * W);
  }
  return PartialLoss{total, (end - first) * W, count * W};
}

// ---- interruption ----------------------------------------------------------------------------------

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_signal(int sig) {
  g_signal = sig;
  std::signal(sig, SIG_DFL);  // a second one terminates
}
}  // namespace

void install_interrupt_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

bool interrupted() { return g_signal != 0; }

// ---- training --------------------------------------------------------------------------------------

TrainResult train(const TrainOptions& o, const TrainData& data, Progress& shown) {
  const double session_start = now_seconds();
  Communicator& comm = world();
  const int ranks = comm.size();
  together(comm, [&] { preflight(o); });
  check_ranks_agree(o, data, comm);  // the same flags and data on every rank, or a clear error on all
  // Rank 0 alone prints (and writes: see save() and the metrics below).
  Progress silent(ProgressMode::off, "", nullptr);
  Progress& progress = comm.root() ? shown : silent;
  TrainResult r;
  r.ranks = ranks;
  r.distributed = comm.description();

  // Resume: the checkpoint (preflight checked it is readable and that its model matches), read by
  // rank 0 and sent to the others, so that the ranks need no shared file system.
  std::unique_ptr<Checkpoint> ckpt;
  if (o.resume && ranks == 1) {
    ckpt = std::make_unique<Checkpoint>(read_checkpoint(o.checkpoint));
  } else if (o.resume) {
    std::vector<unsigned char> bytes;
    together(comm, [&] {
      if (!comm.root()) return;
      const std::string b = read_file_bytes(o.checkpoint);
      bytes.assign(b.begin(), b.end());
    });
    comm.broadcast(bytes);
    together(comm, [&] { ckpt = std::make_unique<Checkpoint>(checkpoint_from_file(io::parse(bytes, o.checkpoint))); });
  }
  // Automatic thread count on resume: the checkpoint's, so that the continuation is exact.
  if (o.threads == 0 && ckpt && ckpt->info.ranks == ranks) r.threads = set_threads(ckpt->info.threads);
  else r.threads = set_threads(o.threads);
  const Index B = o.batch, T = o.seq;
  // This rank's rows of every global batch of B: [rank * Bl, (rank + 1) * Bl) (validate() checked
  // that B splits evenly).
  const Index Bl = B / ranks, first_row = comm.rank() * Bl;

  // The data must fit the options.
  require(data.tokenizer.vocab_size() == o.vocab, "the tokenizer has ", data.tokenizer.vocab_size(),
          " pieces but --vocab is ", o.vocab);
  require(static_cast<Index>(data.streams.train.size()) >= T + 1, "the training split has ",
          data.streams.train.size(), " tokens; --seq ", T, " needs at least ", T + 1,
          " (use a shorter --seq or more text)");
  require(data.streams.valid.size() >= 2 && data.streams.test.size() >= 2, "the validation and test splits hold ",
          data.streams.valid.size(), " and ", data.streams.test.size(), " tokens; each needs at least 2");

  auto model = make_gpt<float>(model_config(o), o.seed);
  std::vector<float> flat;  // messages of the collectives: parameters at the start, then gradients
  if (ranks > 1 && !o.resume) {
    // Rank 0 initialises; the others take its parameters (the same seed gives the same ones, but a
    // rank with other threads or another build must not start elsewhere).
    const auto params = model->parameters();
    pack(params, flat);
    comm.broadcast(flat.data(), flat.size() * sizeof(float));
    unpack(flat, params);
  }
  r.config = model->config();
  r.params = model->parameter_report();
  r.device = o.device;
  r.precision = o.precision;
  r.device_name = "cpu";
  // --device cuda: the model (and, below, the optimiser) on the GPU; the host model and optimiser
  // stay the checkpoint format (initialised and restored here, refreshed from the device to save).
  std::unique_ptr<DeviceTrainer> dev;
  together(comm, [&] { dev = make_device_trainer(o, *model); });
  // --device cuda on several ranks: NCCL between the GPUs where this build has it (rank 0's
  // unique id sent through MPI), else through MPI from host memory.
  bool nccl = false;
  if (dev && ranks > 1 && !dev->collectives().empty()) {
    std::string id = comm.root() ? dev->new_collectives_id() : std::string();
    comm.broadcast(id);
    dev->join_collectives(id, comm.rank(), ranks);
    nccl = true;
  }
  if (ranks > 1)
    r.distributed += dev ? (nccl ? ", gradients all-reduced by " + dev->collectives() + " between the GPUs"
                                 : std::string(", gradients all-reduced through MPI from host memory"))
                         : std::string();
  if (dev) {
    r.device_name = dev->description();
    progress.message("device: " + r.device_name);
  }
  if (ranks > 1)
    progress.message("distributed: " + r.distributed + "; global batch " + std::to_string(B) + " = " +
                     std::to_string(ranks) + " x " + std::to_string(Bl) + " sequences, " +
                     std::to_string(r.threads) + " thread(s) per rank");

  Tape<float> tape;
  // One training step's forward + backward of this rank's rows (gradients zeroed first), and one
  // batch's evaluation.
  auto step_loss = [&](const std::vector<std::int32_t>& tk, const std::vector<std::int32_t>& tg) -> float {
    if (dev) return dev->step_loss(tk, tg, Bl);
    model->zero_grad();
    // An activation that overflowed to inf / NaN inside the forward (the layers refuse non-finite
    // inputs) is the loss diverging: the caller's check reports it, on every rank alike.
    try {
      return model->loss(tape, tk, tg, Bl);
    } catch (const non_finite_error&) {
      return std::numeric_limits<float>::quiet_NaN();
    }
  };
  const BatchLoss eval_loss = [&](TokenSpan tk, TokenSpan tg, Index nb) -> float {
    return dev ? dev->evaluate(tk, tg, nb) : model->evaluate(tape, tk, tg, nb);
  };
  // The gradients (and the loss) of the step: the mean over the ranks, the same bits on every rank,
  // before clipping and AdamW; and whether any rank was interrupted (all stop at the same step).
  // One process: untouched.
  struct Reduced {
    float loss;
    bool interrupted;
  };
  double reduce_time = 0;
  auto all_reduce = [&](float loss) -> Reduced {
    if (ranks == 1) return {loss, interrupted()};
    const double t0 = now_seconds();
    if (nccl) {
      dev->average_gradients();
    } else if (dev) {
      flat.resize(static_cast<std::size_t>(dev->gradient_count()));
      dev->gradients_to_host(flat.data());
      comm.sum(flat.data(), flat.size(), 1.0 / ranks);
      dev->gradients_from_host(flat.data());
    } else {
      const auto grads = model->gradients();
      pack(grads, flat);
      comm.sum(flat.data(), flat.size(), 1.0 / ranks);
      unpack(flat, grads);
    }
    double small[2] = {static_cast<double>(loss), interrupted() ? 1.0 : 0.0};
    comm.sum(small, 2);
    reduce_time += now_seconds() - t0;
    return {static_cast<float>(small[0] / ranks), small[1] > 0};
  };
  // An evaluation split over the ranks (each its share of the windows, Bl at a time), summed.
  auto evaluate = [&](const std::vector<std::int32_t>& stream, Index max_tokens) -> Perplexity {
    if (ranks == 1) return evaluate_stream(eval_loss, stream, T, B, max_tokens);
    const PartialLoss part = evaluate_part(eval_loss, stream, T, Bl, max_tokens, comm.rank(), ranks);
    double total = part.total;
    comm.sum(&total, 1);
    Perplexity p;
    p.tokens = part.all_tokens;
    p.loss = total / static_cast<double>(p.tokens);
    p.ppl = std::exp(p.loss);
    return p;
  };

  // The length of the run.
  Index total_steps = 0;
  if (o.budget_seconds > 0 && ckpt) {
    total_steps = ckpt->info.run.total_steps;
  } else if (o.budget_seconds > 0) {
    // Probe: a few forward + backward passes on batches from a separate generator (the model and
    // the sampler are untouched), then as many steps as fit, periodic evaluations included
    // (a forward-only token costs about a third of a training token). Not reproducible.
    Rng probe(o.seed + 12345);
    std::vector<std::int32_t> tk, tg;
    double step_time = 0;
    for (int i = 0; i < 3; ++i) {
      sample_batch(data.streams.train, B, T, probe, tk, tg, first_row, Bl);
      const double t0 = now_seconds();
      all_reduce(step_loss(tk, tg));
      if (i > 0) step_time += (now_seconds() - t0) / 2;
    }
    model->zero_grad();
    reduce_time = 0;
    // Rank 0's estimate stands on every rank: all ranks must run the same steps.
    comm.broadcast(&step_time, sizeof step_time);
    step_time *= 1.05;  // the optimiser update
    const Index eval_tokens =
        o.eval_tokens > 0 ? std::min<Index>(o.eval_tokens, static_cast<Index>(data.streams.valid.size()))
                          : static_cast<Index>(data.streams.valid.size());
    const double eval_cost = o.eval_every > 0 ? 0.35 * step_time * static_cast<double>(eval_tokens) /
                                                    static_cast<double>(B * T) / static_cast<double>(o.eval_every)
                                              : 0.0;
    total_steps = std::max<Index>(1, static_cast<Index>(o.budget_seconds / (step_time + eval_cost)));
    progress.message("--seconds " + fmt("%g", o.budget_seconds) + ": " + fmt("%.3f", step_time) +
                     " s per step measured, so " + std::to_string(total_steps) + " steps (" +
                     format_count(static_cast<double>(total_steps * B * T)) + " tokens)");
  } else {
    total_steps = total_steps_for_tokens(effective_budget_tokens(o), B, T);
  }
  require(o.warmup <= total_steps, "--warmup ", o.warmup, " exceeds the run's ", total_steps, " steps");
  r.total_steps = total_steps;

  const RunFingerprint run = fingerprint(o, total_steps, data.tokenizer.model_hash());
  AdamW<float> opt(model->parameters(), model->gradients(), optimiser_config(o, total_steps));
  Rng sampler(sampler_seed(o.seed));
  RunState state;
  if (ckpt) {
    const auto diffs = compare_runs(run, ckpt->info.run, o.budget_seconds <= 0);
    if (!diffs.empty())
      throw invalid_argument("checkpoint '" + o.checkpoint + "' does not match the flags (" +
                             std::to_string(diffs.size()) + " difference" + (diffs.size() > 1 ? "s" : "") +
                             "):" + join_lines(diffs));
    restore_model(*ckpt, *model);
    restore_optimizer(*ckpt, opt);
    state = ckpt->info.state;
    sampler.set_state(state.sampler);
    if (ckpt->info.ranks != ranks)
      progress.message("note: the checkpoint was written by " + std::to_string(ckpt->info.ranks) +
                       " process(es), this session runs on " + std::to_string(ranks) +
                       "; the continuation is correct but not bit-identical (the gradient sums are split "
                       "differently)");
    else if (ckpt->info.device != o.device || ckpt->info.precision != o.precision)
      progress.message("note: the checkpoint was written on " + ckpt->info.device + " (" + ckpt->info.precision +
                       "), this session runs on " + o.device + " (" + o.precision +
                       "); the continuation is correct but not bit-identical");
    else if (!dev && ckpt->info.threads != r.threads)
      progress.message("note: the checkpoint was written with " + std::to_string(ckpt->info.threads) +
                       " thread(s), this session uses " + std::to_string(r.threads) +
                       "; the continuation is exact only with the same thread count");
    progress.message("resuming '" + o.checkpoint + "' at step " + std::to_string(state.step) + " of " +
                     std::to_string(total_steps));
    ckpt.reset();
  }
  if (dev) dev->from_host(*model, &opt);  // parameters (restored or initial) and the optimiser state
  r.start_step = state.step;
  r.curve = state.curve;
  r.dynamics = state.dynamics;
  // The dynamics' diagnostics at an evaluation (dynamics_probe_windows): a forward pass on the
  // first validation windows that touches neither the parameters nor the sampler.
  const Index probe_windows =
      dev ? 0 : std::min<Index>(o.dynamics_probe_windows, static_cast<Index>(data.streams.valid.size()) / T);
  std::vector<std::int32_t> probe_tokens;
  if (probe_windows > 0)
    probe_tokens.assign(data.streams.valid.begin(), data.streams.valid.begin() + probe_windows * T);
  auto probe = [&]() {
    if (probe_windows <= 0) return;
    DynamicsPoint d{state.step, state.tokens_seen, {}};
    for (LayerDynamics& l :
         model->dynamics_diagnostics(tape, TokenSpan{probe_tokens.data(), static_cast<Index>(probe_tokens.size())},
                                     probe_windows))
      if (!l.tau.empty()) d.layers.push_back(std::move(l));
    if (d.layers.empty()) return;  // no block has dynamics
    if (!r.dynamics.empty() && r.dynamics.back().step == state.step) r.dynamics.pop_back();
    r.dynamics.push_back(std::move(d));
  };
  if (state.step == 0) probe();  // where the map starts

  CheckpointInfo info;
  info.run = run;
  info.threads = r.threads;
  info.ranks = ranks;
  info.budget_tokens = o.budget_seconds > 0 ? 0 : effective_budget_tokens(o);
  info.budget_seconds = o.budget_seconds;
  info.device = o.device;
  info.precision = o.precision;
  const double elapsed_before = state.elapsed;
  auto save = [&]() {
    if (o.checkpoint.empty() || !comm.root()) return;  // rank 0 writes the one checkpoint
    state.sampler = sampler.state();
    state.elapsed = elapsed_before + (now_seconds() - session_start);
    state.curve = r.curve;
    state.dynamics = r.dynamics;
    info.state = state;
    if (dev) dev->to_host(*model, opt);  // the checkpoint holds the host model and optimiser
    write_checkpoint(o.checkpoint, *model, opt, data.tokenizer_bytes, info);
  };

  MetricsLog metrics;
  if (!o.metrics.empty() && comm.root()) metrics = MetricsLog(o.metrics, o.resume);

  // ---- the loop
  std::vector<std::int32_t> tokens, targets;
  double train_time = 0;
  Index session_tokens = 0;
  while (state.step < total_steps) {
    const double t0 = now_seconds();
    sample_batch(data.streams.train, B, T, sampler, tokens, targets, first_row, Bl);
    const Reduced step = all_reduce(step_loss(tokens, targets));
    const float loss = step.loss;
    if (!std::isfinite(loss))
      throw runtime_error("training diverged at step " + std::to_string(state.step + 1) + ": the loss is " +
                               fmt("%g", loss) + "; lower --lr (now " + fmt("%g", o.lr) + ") or keep --clip");
    const StepReport rep = dev ? dev->optimizer_step() : opt.step();
    train_time += now_seconds() - t0;
    ++state.step;
    state.tokens_seen = state.step * B * T;
    session_tokens += B * T;
    r.losses.push_back(loss);
    r.grad_norms.push_back(rep.grad_norm);

    StepMetrics m;
    m.step = state.step;
    m.total_steps = total_steps;
    m.tokens = state.tokens_seen;
    m.loss = loss;
    m.lr = rep.lr;
    m.grad_norm = rep.grad_norm;
    m.tokens_per_s = static_cast<double>(session_tokens) / train_time;
    m.elapsed = elapsed_before + (now_seconds() - session_start);
    progress.step(m);
    metrics.step(m);

    if (o.eval_every > 0 && state.step % o.eval_every == 0 && state.step < total_steps) {
      const Perplexity p = evaluate(data.streams.valid, o.eval_tokens);
      r.curve.push_back(CurvePoint{state.step, state.tokens_seen, p.loss, p.ppl});
      probe();
      const EvalMetrics e{state.step, state.tokens_seen, "valid", p.tokens, p.loss, p.ppl,
                          elapsed_before + (now_seconds() - session_start)};
      progress.eval(e);
      metrics.eval(e);
    }
    if (o.stop_after_steps > 0 && state.step == o.stop_after_steps && state.step < total_steps) {
      r.stopped_early = true;
      save();
      progress.message("stopped after step " + std::to_string(state.step) + " as asked (--stop-after-steps)" +
                       (o.checkpoint.empty() ? std::string() : "; checkpoint written to '" + o.checkpoint + "'"));
      break;
    }
    // Several ranks stop at the same step: the one whose interruption the step's reduction carried.
    if ((ranks == 1 ? interrupted() : step.interrupted) && state.step < total_steps) {
      r.stopped_early = r.interrupted = true;
      save();
      progress.message("interrupted after step " + std::to_string(state.step) +
                       (o.checkpoint.empty() ? std::string("; no --checkpoint, nothing saved")
                                             : "; checkpoint written to '" + o.checkpoint + "' (continue with --resume)"));
      break;
    }
    if (o.checkpoint_every > 0 && state.step % o.checkpoint_every == 0 && state.step < total_steps) save();
  }
  progress.finish();

  r.steps_done = state.step;
  r.tokens_seen = state.tokens_seen;
  r.tokens_per_s = train_time > 0 ? static_cast<double>(session_tokens) / train_time : 0;
  r.reduce_seconds = reduce_time;
  r.reduced_floats = ranks > 1 ? static_cast<Index>(total_size(model->gradients())) : 0;
  r.last_loss = r.losses.empty() ? std::nan("") : r.losses.back();
  if (!r.losses.empty()) {
    const std::size_t n = std::min<std::size_t>(20, r.losses.size());
    double s = 0;
    for (std::size_t i = r.losses.size() - n; i < r.losses.size(); ++i) s += r.losses[i];
    r.final_train_loss = s / static_cast<double>(n);
  } else {
    r.final_train_loss = std::nan("");
  }

  if (!r.stopped_early) {
    const Perplexity v = evaluate(data.streams.valid, 0);
    const Perplexity t = evaluate(data.streams.test, 0);
    r.valid_loss = v.loss;
    r.valid_ppl = v.ppl;
    r.test_loss = t.loss;
    r.test_ppl = t.ppl;
    // The curve's points are all measured on the same tokens (the --eval-tokens cap), so its last
    // point is too; the table's numbers above use the whole splits.
    const bool capped = o.eval_tokens > 0 && o.eval_tokens < v.tokens;
    const Perplexity c = capped ? evaluate(data.streams.valid, o.eval_tokens) : v;
    if (!r.curve.empty() && r.curve.back().step == state.step) r.curve.pop_back();
    r.curve.push_back(CurvePoint{state.step, state.tokens_seen, c.loss, c.ppl});
    probe();
    const double el = elapsed_before + (now_seconds() - session_start);
    const EvalMetrics ev{state.step, state.tokens_seen, "valid", v.tokens, v.loss, v.ppl, el};
    const EvalMetrics et{state.step, state.tokens_seen, "test", t.tokens, t.loss, t.ppl, el};
    progress.eval(ev);
    progress.eval(et);
    metrics.eval(ev);
    metrics.eval(et);
    save();
  } else {
    r.valid_loss = r.valid_ppl = r.test_loss = r.test_ppl = std::nan("");
  }
  r.train_seconds = elapsed_before + (now_seconds() - session_start);
  r.wall_seconds = now_seconds() - session_start;
  metrics.line(summary_json(o, r));
  return r;
}

std::string summary_json(const TrainOptions& o, const TrainResult& r) {
  nlohmann::ordered_json j;
  j["type"] = "summary";
  j["attention"] = r.config.attention;
  j["steps"] = r.config.steps;
  j["corpus"] = o.corpus;
  j["seed"] = o.seed;
  j["parameters"] = r.params.total;
  j["dynamics_parameters"] = r.params.dynamics;
  j["dynamics_percent"] = r.params.dynamics_percent;
  j["threads"] = r.threads;
  j["ranks"] = r.ranks;
  j["device"] = r.device;
  j["precision"] = r.precision;
  j["steps_done"] = r.steps_done;
  j["total_steps"] = r.total_steps;
  j["tokens"] = r.tokens_seen;
  j["stopped_early"] = r.stopped_early;
  j["final_train_loss"] = r.final_train_loss;
  j["valid_loss"] = r.valid_loss;
  j["valid_ppl"] = r.valid_ppl;
  j["test_loss"] = r.test_loss;
  j["test_ppl"] = r.test_ppl;
  j["tokens_per_s"] = r.tokens_per_s;
  if (r.ranks > 1) {
    j["allreduce_seconds"] = r.reduce_seconds;
    j["allreduce_floats"] = r.reduced_floats;
  }
  j["train_seconds"] = r.train_seconds;
  j["wall_seconds"] = r.wall_seconds;
  return j.dump();
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
