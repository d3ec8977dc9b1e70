#include "run_plan.hpp"

#include "text.hpp"
#include "data/fnv1a.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#endif
#include <cerrno>

namespace coupledqk::train {

namespace {

std::string cache_of(const TrainOptions& o) { return o.cache_dir.empty() ? default_cache_dir() : o.cache_dir; }


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

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error("cannot read '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

}  // namespace

std::uint64_t sampler_seed(std::uint64_t seed) { return seed ^ 0x73616d706c657273ull; /* "samplers" */ }

void sample_batch(const std::vector<std::int32_t>& stream, Index batch, Index seq, Rng& rng,
                  std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets, Index first,
                  Index count) {
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

void check_data_fits(const TrainOptions& o, const TrainData& data) {
  const Index T = o.seq;
  require(data.tokenizer.vocab_size() == o.vocab, "the tokenizer has ", data.tokenizer.vocab_size(),
          " pieces but --vocab is ", o.vocab);
  require(static_cast<Index>(data.streams.train.size()) >= T + 1, "the training split has ",
          data.streams.train.size(), " tokens; --seq ", T, " needs at least ", T + 1,
          " (use a shorter --seq or more text)");
  require(data.streams.valid.size() >= 2 && data.streams.test.size() >= 2, "the validation and test splits hold ",
          data.streams.valid.size(), " and ", data.streams.test.size(), " tokens; each needs at least 2");
}

std::unique_ptr<Checkpoint> read_resume_checkpoint(const TrainOptions& o, Communicator& comm) {
  const int ranks = comm.size();
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
  return ckpt;
}

Index plan_total_steps(const TrainOptions& o, const Checkpoint* ckpt, const TrainData& data, Index first_row,
                       Index Bl, Communicator& comm,
                       const std::function<void(const std::vector<std::int32_t>&, const std::vector<std::int32_t>&)>& step,
                       Progress& progress) {
  const Index B = o.batch, T = o.seq;
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
      step(tk, tg);
      if (i > 0) step_time += (now_seconds() - t0) / 2;
    }
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
  return total_steps;
}

RunState restore_run(const TrainOptions& o, const Checkpoint& ckpt, const RunFingerprint& run, Model& model,
                     AdamW<float>& opt, Rng& sampler, int ranks, int threads, bool on_host, Progress& progress) {
  RunState state;
  const auto diffs = compare_runs(run, ckpt.info.run, o.budget_seconds <= 0);
  if (!diffs.empty())
    throw invalid_argument("checkpoint '" + o.checkpoint + "' does not match the flags (" +
                           std::to_string(diffs.size()) + " difference" + (diffs.size() > 1 ? "s" : "") +
                           "):" + join_lines(diffs));
  restore_model(ckpt, model);
  restore_optimizer(ckpt, opt);
  state = ckpt.info.state;
  sampler.set_state(state.sampler);
  if (ckpt.info.ranks != ranks)
    progress.message("note: the checkpoint was written by " + std::to_string(ckpt.info.ranks) +
                     " process(es), this session runs on " + std::to_string(ranks) +
                     "; the continuation is correct but not bit-identical (the gradient sums are split "
                     "differently)");
  else if (ckpt.info.device != o.device || ckpt.info.precision != o.precision)
    progress.message("note: the checkpoint was written on " + ckpt.info.device + " (" + ckpt.info.precision +
                     "), this session runs on " + o.device + " (" + o.precision +
                     "); the continuation is correct but not bit-identical");
  else if (on_host && ckpt.info.threads != threads)
    progress.message("note: the checkpoint was written with " + std::to_string(ckpt.info.threads) +
                     " thread(s), this session uses " + std::to_string(threads) +
                     "; the continuation is exact only with the same thread count");
  progress.message("resuming '" + o.checkpoint + "' at step " + std::to_string(state.step) + " of " +
                   std::to_string(run.total_steps));
  return state;
}

CheckpointWriter::CheckpointWriter(const TrainOptions& o, const TrainData& data, const RunFingerprint& run,
                                   int threads, int ranks, bool root)
    : o_(o), data_(data), root_(root) {
  info_.run = run;
  info_.threads = threads;
  info_.ranks = ranks;
  info_.budget_tokens = o.budget_seconds > 0 ? 0 : effective_budget_tokens(o);
  info_.budget_seconds = o.budget_seconds;
  info_.device = o.device;
  info_.precision = o.precision;
}

void CheckpointWriter::save(RunState& state, const Rng& sampler, double elapsed, const std::vector<CurvePoint>& curve,
                            const std::vector<DynamicsPoint>& dynamics, Model& model, AdamW<float>& opt,
                            Backend& backend) {
  if (o_.checkpoint.empty() || !root_) return;  // rank 0 writes the one checkpoint
  state.sampler = sampler.state();
  state.elapsed = elapsed;
  state.curve = curve;
  state.dynamics = dynamics;
  info_.state = state;
  backend.to_host(model, opt);  // the checkpoint holds the host model and optimiser (a no-op on the CPU)
  write_checkpoint(o_.checkpoint, model, opt, data_.tokenizer_bytes, info_);
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

}  // namespace coupledqk::train
