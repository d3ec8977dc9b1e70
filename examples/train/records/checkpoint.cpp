#include "records/checkpoint.hpp"
#include "records/dynamics_json.hpp"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include <coupledqk/io/json_read.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif


namespace coupledqk::train {

namespace {

using json = nlohmann::ordered_json;

std::string where(const std::string& source) { return "checkpoint '" + source + "': "; }

/// A value from the file, fit for a message (bounded length; see io::detail::excerpt).
std::string shown(const json& v) { return io::detail::excerpt(v); }

/// Longest string field accepted in the metadata (names, hashes, corpus keys are far shorter).
constexpr std::size_t max_string_field = 1024;

// ---- reading JSON fields with messages that name the field -----------------------------------

const json& field(const json& obj, const char* key, const std::string& path, const std::string& source) {
  if (!obj.is_object() || !obj.contains(key))
    throw io_error(where(source) + "the coupledqk metadata has no field '" + path + key +
                   "'; the file was not written by this version of coupledqk-train, or was edited");
  return obj.at(key);
}

template <class T>
T get(const json& obj, const char* key, const std::string& path, const std::string& source) {
  const json& v = field(obj, key, path, source);
  try {
    if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number()) throw std::runtime_error("not a number");
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw std::runtime_error("not an integer");
      // get<T>() would wrap a value outside T's range silently.
      const bool fits = v.is_number_unsigned()
                            ? v.template get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())
                            : v.template get<std::int64_t>() >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
                                  v.template get<std::int64_t>() <= static_cast<std::int64_t>(std::numeric_limits<T>::max());
      if (!fits) throw std::runtime_error("outside the range of the field's type");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) throw std::runtime_error("not a string");
      if (v.get_ref<const std::string&>().size() > max_string_field)
        throw std::runtime_error("a string of " + std::to_string(v.get_ref<const std::string&>().size()) +
                                 " bytes; at most " + std::to_string(max_string_field) + " are accepted");
    }
    return v.get<T>();
  } catch (const std::exception& e) {
    throw io_error(where(source) + "field '" + path + key + "' holds " + shown(v) + " (" + e.what() + ")");
  }
}

/// A u64 stored as a decimal string (JSON numbers are doubles to many readers).
std::uint64_t get_u64_string(const json& v, const std::string& name, const std::string& source) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos) {
      errno = 0;
      char* end = nullptr;
      const unsigned long long x = std::strtoull(s.c_str(), &end, 10);
      if (errno == 0 && end && *end == '\0') return static_cast<std::uint64_t>(x);
    }
  }
  throw io_error(where(source) + "field '" + name + "' holds " + shown(v) +
                 "; expected an unsigned 64-bit integer written as a decimal string");
}

/// Two different numbers with the fewest significant digits (at least 6) that tell them apart.
std::pair<std::string, std::string> format_pair(double a, double b) {
  auto with = [](double v, int digits) {
    std::ostringstream os;
    os.precision(digits);
    os << v;
    return os.str();
  };
  for (int digits = 6; digits < 17; ++digits)
    if (with(a, digits) != with(b, digits)) return {with(a, digits), with(b, digits)};
  return {with(a, 17), with(b, 17)};
}


}  // namespace

std::vector<TensorView<float>> prefixed(std::vector<TensorView<float>> views, const std::string& prefix) {
  for (auto& v : views) v.name = prefix + v.name;
  return views;
}

// ---- metadata ------------------------------------------------------------------------------------

std::string to_json(const CheckpointInfo& info) {
  const GptConfig& m = info.run.model;
  const RunFingerprint& r = info.run;
  json j;
  j["format"] = checkpoint_format;
  // Version 2 only for what version 1 cannot describe (other positions, a window): readers of
  // version 1 refuse those by their version instead of missing a wpe tensor.
  const bool v2 = m.positions != GptPositions::learned || m.window != 0;
  j["version"] = v2 ? checkpoint_version : 1;
  j["model"] = {{"vocab", m.vocab},
                {"dim", m.dim},
                {"layers", m.layers},
                {"heads", m.heads},
                {"context", m.context},
                {"hidden", m.hidden},
                {"attention", m.attention},
                {"steps", m.steps},
                {"init_std", m.init_std},
                {"dynamics_init_scale", m.dynamics_init_scale},
                {"init_time", m.init_time},
                {"positions", to_string(m.positions)},
                {"rope_base", m.rope_base},
                {"rope_order", to_string(m.rope_order)},
                {"window", m.window}};
  j["training"] = {{"corpus", r.corpus},
                   {"tokenizer_hash", r.tokenizer_hash},
                   {"batch", r.batch},
                   {"seq", r.seq},
                   {"lr", r.lr},
                   {"min_lr", r.min_lr},
                   {"warmup", r.warmup},
                   {"total_steps", r.total_steps},
                   {"weight_decay", r.weight_decay},
                   {"clip", r.clip},
                   {"seed", std::to_string(r.seed)},
                   {"budget_tokens", info.budget_tokens},
                   {"budget_seconds", info.budget_seconds},
                   {"threads", info.threads},
                   {"ranks", info.ranks},
                   {"device", info.device},
                   {"precision", info.precision}};
  json rng = json::array();
  for (std::uint64_t s : info.state.sampler) rng.push_back(std::to_string(s));
  json curve = json::array();
  for (const CurvePoint& p : info.state.curve) curve.push_back(json::array({p.step, p.tokens, p.loss, p.ppl}));
  j["state"] = {{"step", info.state.step},
                {"tokens_seen", info.state.tokens_seen},
                {"elapsed_seconds", info.state.elapsed},
                {"sampler_rng", rng},
                {"curve", curve}};
  if (!info.state.dynamics.empty()) j["state"]["dynamics"] = dynamics_curve_to_json(info.state.dynamics);
  return j.dump();
}

CheckpointInfo checkpoint_info_from_json(const std::string& text, const std::string& source) {
  // The project's bounded JSON reader (json_read.hpp): the safetensors header's depth limit, and a
  // duplicated key is an error rather than one of its values silently kept.
  const json j = io::read_json<io_error, json>(text, where(source) + "the 'coupledqk' metadata",
                               io::json_limits{io::max_header_bytes, io::max_header_depth});
  if (!j.is_object()) throw io_error(where(source) + "the 'coupledqk' metadata is not a JSON object");
  const std::string format = get<std::string>(j, "format", "", source);
  if (format != checkpoint_format)
    throw io_error(where(source) + "format '" + io::detail::quote(format) + "'; expected '" + checkpoint_format + "'");
  const int version = get<int>(j, "version", "", source);
  if (version < 1 || version > checkpoint_version)
    throw io_error(where(source) + "format version " + std::to_string(version) + "; this build reads version " +
                   std::to_string(checkpoint_version) + " (is it from a newer coupledqk?)");
  CheckpointInfo info;
  const json& m = field(j, "model", "", source);
  GptConfig& c = info.run.model;
  c.vocab = get<Index>(m, "vocab", "model.", source);
  c.dim = get<Index>(m, "dim", "model.", source);
  c.layers = get<Index>(m, "layers", "model.", source);
  c.heads = get<Index>(m, "heads", "model.", source);
  c.context = get<Index>(m, "context", "model.", source);
  c.hidden = get<Index>(m, "hidden", "model.", source);
  c.attention = get<std::string>(m, "attention", "model.", source);
  c.steps = get<int>(m, "steps", "model.", source);
  c.init_std = get<double>(m, "init_std", "model.", source);
  c.dynamics_init_scale = get<double>(m, "dynamics_init_scale", "model.", source);
  c.init_time = get<double>(m, "init_time", "model.", source);
  // Written since rotary positions and windows (docs/masks-and-positions.md): optional, so that
  // earlier checkpoints (learned positions, no window) still read.
  try {
    if (m.contains("positions"))
      c.positions = parse_gpt_positions(get<std::string>(m, "positions", "model.", source), "field 'model.positions'");
    if (m.contains("rope_order"))
      c.rope_order = parse_rope_order(get<std::string>(m, "rope_order", "model.", source), "field 'model.rope_order'");
  } catch (const invalid_argument& e) {
    throw io_error(where(source) + e.what());
  }
  if (m.contains("rope_base")) c.rope_base = get<double>(m, "rope_base", "model.", source);
  if (m.contains("window")) c.window = get<Index>(m, "window", "model.", source);
  try {
    validate(c);
  } catch (const std::exception& e) {
    throw io_error(where(source) + "unusable model configuration: " + e.what());
  }
  const json& t = field(j, "training", "", source);
  RunFingerprint& r = info.run;
  r.corpus = get<std::string>(t, "corpus", "training.", source);
  r.tokenizer_hash = get<std::string>(t, "tokenizer_hash", "training.", source);
  r.batch = get<Index>(t, "batch", "training.", source);
  r.seq = get<Index>(t, "seq", "training.", source);
  r.lr = get<double>(t, "lr", "training.", source);
  r.min_lr = get<double>(t, "min_lr", "training.", source);
  r.warmup = get<Index>(t, "warmup", "training.", source);
  r.total_steps = get<Index>(t, "total_steps", "training.", source);
  r.weight_decay = get<double>(t, "weight_decay", "training.", source);
  r.clip = get<double>(t, "clip", "training.", source);
  r.seed = get_u64_string(field(t, "seed", "training.", source), "training.seed", source);
  info.budget_tokens = get<Index>(t, "budget_tokens", "training.", source);
  info.budget_seconds = get<double>(t, "budget_seconds", "training.", source);
  info.threads = get<int>(t, "threads", "training.", source);
  // Written since --device: optional, so that earlier checkpoints (CPU, float32) still read.
  if (t.contains("device")) info.device = get<std::string>(t, "device", "training.", source);
  if (t.contains("precision")) info.precision = get<std::string>(t, "precision", "training.", source);
  // Written since distributed training (docs/distributed.md): optional, earlier checkpoints had one process.
  if (t.contains("ranks")) info.ranks = get<int>(t, "ranks", "training.", source);
  if (info.ranks < 1)
    throw io_error(where(source) + "field 'training.ranks' holds " + std::to_string(info.ranks) +
                   "; expected a process count of at least 1");
  const json& s = field(j, "state", "", source);
  info.state.step = get<Index>(s, "step", "state.", source);
  info.state.tokens_seen = get<Index>(s, "tokens_seen", "state.", source);
  info.state.elapsed = get<double>(s, "elapsed_seconds", "state.", source);
  const json& rng = field(s, "sampler_rng", "state.", source);
  if (!rng.is_array() || rng.size() != 4)
    throw io_error(where(source) + "field 'state.sampler_rng' holds " + shown(rng) +
                   "; expected 4 unsigned 64-bit integers written as strings");
  for (std::size_t i = 0; i < 4; ++i)
    info.state.sampler[i] = get_u64_string(rng[i], "state.sampler_rng[" + std::to_string(i) + "]", source);
  const json& curve = field(s, "curve", "state.", source);
  if (!curve.is_array()) throw io_error(where(source) + "field 'state.curve' is not an array");
  for (const json& p : curve) {
    if (!p.is_array() || p.size() != 4 || !p[0].is_number_integer() || !p[1].is_number_integer() ||
        !p[2].is_number() || !p[3].is_number())
      throw io_error(where(source) + "field 'state.curve' holds " + shown(p) +
                     "; expected [step, tokens, loss, ppl]");
    info.state.curve.push_back(CurvePoint{p[0].get<Index>(), p[1].get<Index>(), p[2].get<double>(), p[3].get<double>()});
  }
  // Written since the study's diagnostics over training: optional.
  if (s.contains("dynamics")) info.state.dynamics = dynamics_curve_from_json(s.at("dynamics"), where(source) + "field 'state.dynamics'");
  if (r.batch <= 0 || r.seq <= 0 || r.total_steps < 1 || info.state.step < 0 || info.state.step > r.total_steps)
    throw io_error(where(source) + "inconsistent training state (batch " + std::to_string(r.batch) + ", seq " +
                   std::to_string(r.seq) + ", step " + std::to_string(info.state.step) + " of " +
                   std::to_string(r.total_steps) + ")");
  return info;
}

// ---- files ---------------------------------------------------------------------------------------

void write_checkpoint(const std::string& path, Model& model, AdamW<float>& optimizer,
                      const std::string& tokenizer_bytes, const CheckpointInfo& info) {
  io::file f;
  f.source = path;
  f.metadata["coupledqk"] = to_json(info);
  for (const auto& v : model.parameters()) f.add(io::from_view(v, "model." + v.name));
  for (const auto& v : optimizer.state()) f.add(io::from_view(v, "opt." + v.name));
  f.add(io::tensor::from<std::uint8_t>("tokenizer.model", {static_cast<std::int64_t>(tokenizer_bytes.size())},
                                       reinterpret_cast<const std::uint8_t*>(tokenizer_bytes.data())));
  io::write(path, f);
}

Checkpoint read_checkpoint(const std::string& path) {
  io::file file;
  try {
    file = io::read(path);
  } catch (const io_error& e) {
    throw io_error(where(path) + "not a readable checkpoint: " + e.what());
  }
  return checkpoint_from_file(std::move(file));
}

Checkpoint checkpoint_from_file(io::file file) {
  Checkpoint c;
  c.file = std::move(file);
  const std::string& path = c.file.source;
  const std::string* meta = c.file.find_meta("coupledqk");
  if (!meta) {
    const auto names = c.file.names();
    std::string list;
    for (std::size_t i = 0; i < names.size() && i < 8; ++i) list += (i ? ", " : "") + io::detail::quote(names[i]);
    if (names.size() > 8) list += ", ...";
    throw io_error(where(path) + "a safetensors file, but not a coupledqk training checkpoint: it has no 'coupledqk' "
                   "metadata (it holds " + std::to_string(names.size()) + " tensor(s)" +
                   (list.empty() ? "" : ": " + list) + ")");
  }
  c.info = checkpoint_info_from_json(*meta, path);
  const io::tensor* tok = c.file.find("tokenizer.model");
  if (!tok || tok->type != io::dtype::U8 || tok->shape.size() != 1 || tok->bytes.empty())
    throw io_error(where(path) + "no tokenizer.model tensor (U8, 1-D, non-empty); the checkpoint is incomplete");
  if (!c.file.find("opt.step"))
    throw io_error(where(path) + "no opt.step tensor; the checkpoint is incomplete");
  // Sizes from the metadata are checked against the tensors the file holds before any model is
  // built from them: a config edited to D = 10^12 must not reach an allocation.
  const GptConfig& m = c.info.run.model;
  auto expect_shape = [&](const std::string& name, std::vector<std::int64_t> shape) {
    const io::tensor* t = c.file.find(name);
    if (!t)
      throw io_error(where(path) + "no " + name + " tensor, which the metadata's model needs; the checkpoint is "
                     "incomplete");
    if (t->shape != shape)
      throw io_error(where(path) + name + " has shape " + io::detail::format_shape(t->shape) + " but the metadata's model " +
                     "(V = " + std::to_string(m.vocab) + ", D = " + std::to_string(m.dim) + ", T = " +
                     std::to_string(m.context) + ") needs " + io::detail::format_shape(shape));
  };
  expect_shape("model.wte", {m.vocab, m.dim});
  if (m.positions == GptPositions::learned) expect_shape("model.wpe", {m.context, m.dim});
  std::int64_t floats = 0;  // elements of the model's tensors (each checked by the reader, < 2^63)
  std::size_t model_tensors = 0;
  for (const io::tensor& t : c.file.tensors)
    if (t.name.compare(0, 6, "model.") == 0) {
      ++model_tensors;
      floats = t.numel() > std::numeric_limits<std::int64_t>::max() - floats ? std::numeric_limits<std::int64_t>::max()
                                                                            : floats + t.numel();
    }
  if (static_cast<std::uint64_t>(m.layers) > model_tensors)
    throw io_error(where(path) + "the metadata says " + std::to_string(m.layers) + " layers but the file holds only " +
                   std::to_string(model_tensors) + " model tensors");
  for (Index l = 0; l < m.layers; ++l) expect_shape("model.h." + std::to_string(l) + ".attn.wq", {m.dim, m.dim});
  // The dynamics of a coupled or uncoupled layer hold at least a [d, m] map per layer (none for a
  // variant without dynamics, which ignores m; an unknown name counts as having them).
  const bool dynamics =
      !builtin_variants.contains(m.attention) || builtin_variants.info(m.attention).has_dynamics;
  const double d = static_cast<double>(m.dim) / static_cast<double>(m.heads);
  const double width = m.hidden > 0 ? static_cast<double>(m.hidden) : d;
  if (m.hidden > floats || (dynamics && static_cast<double>(m.layers) * d * width > static_cast<double>(floats)))
    throw io_error(where(path) + "the metadata's dynamics width m = " + std::to_string(m.hidden) + " (d = D/H = " +
                   std::to_string(m.dim / m.heads) + ", " + std::to_string(m.layers) +
                   " layers) needs more parameters than the " + std::to_string(floats) + " the file holds");
  return c;
}

void verify_checkpoint(const Checkpoint& ckpt) {
  auto model = load_model(ckpt);  // every model tensor present, shaped, floating-point and finite
  AdamW<float> optimizer(model->parameters(), model->gradients(), AdamWConfig{});
  restore_optimizer(ckpt, optimizer);  // every opt.* tensor, and opt.step agreeing with the metadata
  load_tokenizer(ckpt);                // a SentencePiece model
}

// ---- comparing runs ------------------------------------------------------------------------------

std::vector<std::string> compare_runs(const RunFingerprint& f, const RunFingerprint& c, bool check_total_steps) {
  std::vector<std::string> out;
  auto add = [&](const std::string& flag, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(flag + ": " + a + " (flags) vs " + b + " (checkpoint)");
  };
  auto num = [&](const std::string& flag, double a, double b) {
    if (a == b) return;
    const auto [sa, sb] = format_pair(a, b);
    out.push_back(flag + ": " + sa + " (flags) vs " + sb + " (checkpoint)");
  };
  auto integer = [&](const std::string& flag, Index a, Index b) { add(flag, std::to_string(a), std::to_string(b)); };
  add("--corpus (corpus key)", f.corpus, c.corpus);
  integer("--vocab", f.model.vocab, c.model.vocab);
  add("tokenizer (model hash; the corpus text or tokenizer recipe changed)", f.tokenizer_hash, c.tokenizer_hash);
  add("--attention", f.model.attention, c.model.attention);
  integer("--steps", f.model.steps, c.model.steps);
  integer("--dim", f.model.dim, c.model.dim);
  integer("--layers", f.model.layers, c.model.layers);
  integer("--heads", f.model.heads, c.model.heads);
  integer("--m (dynamics hidden width)", f.model.hidden, c.model.hidden);
  integer("--seq (model context)", f.model.context, c.model.context);
  num("init_std", f.model.init_std, c.model.init_std);
  num("--dynamics-init-scale", f.model.dynamics_init_scale, c.model.dynamics_init_scale);
  num("--init-time", f.model.init_time, c.model.init_time);
  add("--positions", to_string(f.model.positions), to_string(c.model.positions));
  if (f.model.positions == GptPositions::rope || c.model.positions == GptPositions::rope) {
    num("--rope-base", f.model.rope_base, c.model.rope_base);
    add("--rope-order", to_string(f.model.rope_order), to_string(c.model.rope_order));
  }
  integer("--window", f.model.window, c.model.window);
  integer("--batch", f.batch, c.batch);
  if (f.seq != f.model.context || c.seq != c.model.context) integer("--seq", f.seq, c.seq);
  num("--lr", f.lr, c.lr);
  num("--min-lr", f.min_lr, c.min_lr);
  integer("--warmup", f.warmup, c.warmup);
  if (check_total_steps) integer("total steps (from --tokens / --batch / --seq)", f.total_steps, c.total_steps);
  num("--weight-decay", f.weight_decay, c.weight_decay);
  num("--clip", f.clip, c.clip);
  add("--seed", std::to_string(f.seed), std::to_string(c.seed));
  return out;
}

// ---- restoring -----------------------------------------------------------------------------------

void restore_model(const Checkpoint& ckpt, Model& model) {
  io::load_into(ckpt.file, prefixed(model.parameters(), "model."));
  try {
    model.check_parameters();
  } catch (const std::exception& e) {
    throw io_error(where(ckpt.file.source) + e.what());
  }
}

void restore_optimizer(const Checkpoint& ckpt, AdamW<float>& optimizer) {
  io::load_into(ckpt.file, prefixed(optimizer.state(), "opt."));
  Index steps = -1;
  try {
    steps = optimizer.steps_done();
  } catch (const std::exception& e) {
    throw io_error(where(ckpt.file.source) + e.what());
  }
  if (steps != ckpt.info.state.step)
    throw io_error(where(ckpt.file.source) + "opt.step holds " + std::to_string(steps) +
                   " but the metadata says step " + std::to_string(ckpt.info.state.step) + "; the file is inconsistent");
}

std::unique_ptr<Model> load_model(const Checkpoint& ckpt) {
  std::unique_ptr<Model> model;
  try {
    model = make_gpt<float>(ckpt.info.run.model, 0);
  } catch (const std::exception& e) {
    throw io_error(where(ckpt.file.source) + "cannot build its model: " + e.what());
  }
  restore_model(ckpt, *model);
  return model;
}

std::string tokenizer_bytes(const Checkpoint& ckpt) {
  const io::tensor& t = ckpt.file.at("tokenizer.model");
  return std::string(t.bytes.begin(), t.bytes.end());
}

Tokenizer load_tokenizer(const Checkpoint& ckpt) {
  // From the bytes: no temporary file that a kill could leave behind.
  try {
    return Tokenizer::from_bytes(tokenizer_bytes(ckpt), ckpt.file.source + ":tokenizer.model");
  } catch (const std::exception& e) {
    throw io_error(where(ckpt.file.source) + "tokenizer.model is not a SentencePiece model: " + e.what());
  }
}

}  // namespace coupledqk::train
