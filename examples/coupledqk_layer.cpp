// coupledqk-layer: one attention layer's forward and backward on a case read from a safetensors file.
//
//     coupledqk-layer INPUT.safetensors OUTPUT.safetensors [--recompute]
//     coupledqk-layer --variants      (the variant table, one line each: name, has_dynamics,
//                                      is_reversible as 0/1, tab-separated; for the parity test)
//
// INPUT holds x and dy [B, T, D], the layer's parameters (wq, wk, wv, wo [D, D] stored [in, out],
// dyn.* and the scoring's tensors, exactly the names and shapes of the variant's parameters()),
// all of one dtype, F32 (run in float) or F64 (run in double), and string metadata:
//
//     attention    variant name (standard, leapfrog, euler, uncoupled, affine, diff, diff-leapfrog, ...)
//     steps        integration steps, 1..7
//     heads        H, query/key pairs per token
//     m            dynamics hidden width (optional; 0 or absent means D/H)
//     layer_index  0-based layer index (differential lambda_init)
//     causal       optional: 1 (default) or 0 (bidirectional)
//     window       optional: sliding window w, 0 (default) = none
//     lengths      optional: L0,L1,... the valid lengths of the B right-padded sequences of x
//     offsets      optional: 0,o1,...,N packed sequences; x and dy are then [1, N, D]
//     positions    optional: none (default) or rope
//     rope_base    optional: the rotation's base (default 10000)
//     rope_order   optional: dynamics-then-rotate (default) or rotate-then-dynamics
//
// OUTPUT receives y [B, T, D], grad.x [B, T, D] and grad.<name> for every parameter: the gradients
// of sum(y * dy). Same dtype as the input; metadata copied from the input. OUTPUT is replaced
// atomically and only on success. Exit status: 0 success, 1 error, 2 usage error.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/registry.hpp>
#include <coupledqk/variants.hpp>  // the table is compiled once, in coupledqk::variants

namespace {

namespace io = coupledqk::io;

/// The variants whose integrator is reversible (DynamicsMemory::recompute), from the variant table.
std::string reversible_variants() {
  std::vector<std::string> out;
  for (const auto& info : coupledqk::builtin_variants.infos())
    if (info.is_reversible && info.has_dynamics) out.push_back(info.name);
  return coupledqk::join_names(out);
}

std::string usage_text() {
  return "usage: coupledqk-layer INPUT.safetensors OUTPUT.safetensors [--recompute]\n"
    "       coupledqk-layer --variants\n"
    "\n"
    "Runs one coupledqk attention layer forward and backward on the case in INPUT and writes\n"
    "y and the gradients of sum(y * dy) to OUTPUT.\n"
    "\n"
    "INPUT tensors (all F32 or all F64; F32 runs in float, F64 in double):\n"
    "  x, dy            [B, T, D]\n"
    "  wq, wk, wv, wo   [D, D], stored [in, out]\n"
    "  dyn.*            dynamics parameters of the variant (none for standard and diff)\n"
    "  lq1, lk1, lq2, lk2 [d], subln [2d]   differential variants only (d = D/H)\n"
    "INPUT metadata (string values):\n"
    "  attention    " + coupledqk::builtin_variants.names_joined(" | ") + "\n"
    "  steps        integration steps, 1..7\n"
    "  heads        H (D must be divisible by H; even for the differential variants)\n"
    "  m            dynamics hidden width (optional; 0 or absent: D/H)\n"
    "  layer_index  0-based layer index\n"
    "  causal       optional: 1 (default) or 0 (bidirectional)\n"
    "  window       optional: sliding window w (0, the default: none)\n"
    "  lengths      optional: L0,L1,... valid lengths of the B right-padded sequences\n"
    "  offsets      optional: 0,o1,...,N packed sequences (x, dy are then [1, N, D])\n"
    "  positions    optional: none (default) or rope\n"
    "  rope_base    optional: base of the rotary frequencies (default 10000)\n"
    "  rope_order   optional: dynamics-then-rotate (default) or rotate-then-dynamics\n"
    "OUTPUT tensors: y, grad.x [B, T, D] and grad.<name> for every parameter; same dtype,\n"
    "metadata copied from INPUT. OUTPUT is written atomically, and left untouched on error.\n"
    "\n"
    "options:\n"
    "  --recompute  rebuild the dynamics' states in backward instead of storing them\n"
    "               (reversible integrators only: " + reversible_variants() + ",\n"
    "               and the variants without dynamics)\n"
    "  --variants   print the variant table (name, has_dynamics, is_reversible: 0/1, tab-separated)\n"
    "  -h, --help   show this help\n"
    "\n"
    "exit status: 0 success, 1 error, 2 usage error\n";
}

/// "safetensors file 'PATH': ", the prefix of every message about the input.
std::string in_file(const std::string& path) { return "safetensors file '" + path + "': "; }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string input, output;
  bool recompute = false;
  bool help = false;
  bool variants = false;
};

options parse_arguments(int argc, char** argv) {
  options o;
  std::vector<std::string> positional;
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!only_positional && a == "--") {
      only_positional = true;
    } else if (!only_positional && (a == "-h" || a == "--help")) {
      o.help = true;
    } else if (!only_positional && a == "--recompute") {
      o.recompute = true;
    } else if (!only_positional && a == "--variants") {
      o.variants = true;
    } else if (!only_positional && a.size() > 1 && a[0] == '-') {
      throw usage_error("unknown option '" + a + "'; accepted: --recompute, --variants, --help");
    } else {
      positional.push_back(a);
    }
  }
  if (o.help) return o;
  if (o.variants) {
    if (!positional.empty() || o.recompute)
      throw usage_error("--variants takes no other argument; got " + std::to_string(positional.size()) +
                        " argument(s)" + (o.recompute ? " and --recompute" : ""));
    return o;
  }
  if (positional.size() != 2)
    throw usage_error("expected 2 arguments, INPUT and OUTPUT; got " + std::to_string(positional.size()));
  o.input = positional[0];
  o.output = positional[1];
  return o;
}

/// A metadata integer: optional '-', then decimal digits only, within [lo, hi].
long long metadata_integer(const io::file& f, const std::string& key, const std::string* value, long long lo,
                           long long hi, const std::string& accepted) {
  const std::string where = in_file(f.source) + "metadata '" + key + "'";
  if (!value) {
    std::vector<std::string> keys;
    for (const auto& kv : f.metadata) keys.push_back(kv.first);
    throw coupledqk::io_error(where + " is missing; expected " + accepted +
                              " (metadata keys present: " + io::detail::join_names(keys) + ")");
  }
  const std::string& s = *value;
  std::size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  bool ok = i < s.size();
  for (std::size_t j = i; ok && j < s.size(); ++j) ok = s[j] >= '0' && s[j] <= '9';
  long long v = 0;
  if (ok) {
    errno = 0;
    char* end = nullptr;
    v = std::strtoll(s.c_str(), &end, 10);
    ok = errno == 0 && end == s.c_str() + s.size();
  }
  if (!ok)
    throw coupledqk::io_error(where + " is \"" + io::detail::quote(s) + "\", which is not an integer; expected " +
                              accepted);
  if (v < lo || v > hi) throw coupledqk::io_error(where + " is " + s + "; expected " + accepted);
  return v;
}

/// A metadata list of integers "a,b,c", each within [lo, hi].
std::vector<coupledqk::Index> metadata_integers(const io::file& f, const std::string& key, const std::string& value,
                                                long long lo, long long hi, const std::string& accepted) {
  std::vector<coupledqk::Index> out;
  std::size_t from = 0;
  while (true) {
    const std::size_t comma = value.find(',', from);
    const std::string item = value.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    out.push_back(static_cast<coupledqk::Index>(
        metadata_integer(f, key + "[" + std::to_string(out.size()) + "]", &item, lo, hi, accepted)));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

/// A metadata word among `accepted` (absent: the first).
std::string metadata_word(const io::file& f, const std::string& key, const std::vector<std::string>& accepted) {
  const std::string* v = f.find_meta(key);
  if (!v) return accepted.front();
  for (const auto& a : accepted)
    if (*v == a) return a;
  throw coupledqk::io_error(in_file(f.source) + "metadata '" + key + "' is '" + io::detail::quote(*v) +
                            "'; expected one of " + coupledqk::join_names(accepted));
}

struct case_settings {
  std::string attention;
  int steps = 0;
  coupledqk::Index heads = 0, hidden = 0;
  int layer_index = 0;
  bool causal = true;
  coupledqk::Index window = 0;
  std::vector<coupledqk::Index> lengths, offsets;  // padded / packed sequences (empty: none)
  coupledqk::Positions positions = coupledqk::Positions::none;
  double rope_base = coupledqk::default_rope_base;
  coupledqk::RopeOrder rope_order = coupledqk::RopeOrder::dynamics_then_rotate;
};

case_settings read_settings(const io::file& f) {
  case_settings c;
  const std::string* attention = f.find_meta("attention");
  if (!attention) {
    std::vector<std::string> keys;
    for (const auto& kv : f.metadata) keys.push_back(kv.first);
    throw coupledqk::io_error(in_file(f.source) + "metadata 'attention' is missing; expected one of " +
                              coupledqk::builtin_variants.names_joined() +
                              " (metadata keys present: " + io::detail::join_names(keys) + ")");
  }
  c.attention = *attention;
  if (!coupledqk::builtin_variants.contains(c.attention))
    throw coupledqk::io_error(in_file(f.source) + "metadata 'attention' is '" + io::detail::quote(c.attention) +
                              "'; expected one of " + coupledqk::builtin_variants.names_joined());
  const long long int_max = std::numeric_limits<int>::max();
  c.steps = static_cast<int>(metadata_integer(f, "steps", f.find_meta("steps"), 1, coupledqk::max_steps,
                                              "an integer in 1.." + std::to_string(coupledqk::max_steps)));
  c.heads = static_cast<coupledqk::Index>(
      metadata_integer(f, "heads", f.find_meta("heads"), 1, int_max, "a positive integer (H)"));
  const std::string* m = f.find_meta("m");
  c.hidden = m ? static_cast<coupledqk::Index>(metadata_integer(
                     f, "m", m, 0, int_max, "an integer >= 0 (dynamics hidden width; 0 means D/H)"))
               : 0;
  c.layer_index = static_cast<int>(
      metadata_integer(f, "layer_index", f.find_meta("layer_index"), 0, int_max, "an integer >= 0"));
  c.causal = metadata_word(f, "causal", {"1", "0"}) == "1";
  if (const std::string* w = f.find_meta("window"))
    c.window = static_cast<coupledqk::Index>(
        metadata_integer(f, "window", w, 0, int_max, "an integer >= 0 (0: no window)"));
  if (const std::string* l = f.find_meta("lengths"))
    c.lengths = metadata_integers(f, "lengths", *l, 1, int_max, "positive integers separated by ','");
  if (const std::string* o = f.find_meta("offsets"))
    c.offsets = metadata_integers(f, "offsets", *o, 0, std::numeric_limits<long long>::max(),
                                  "integers >= 0 separated by ','");
  if (!c.lengths.empty() && !c.offsets.empty())
    throw coupledqk::io_error(in_file(f.source) + "metadata has both 'lengths' (padded) and 'offsets' (packed); "
                              "give one of them");
  c.positions = metadata_word(f, "positions", {"none", "rope"}) == "rope" ? coupledqk::Positions::rope
                                                                            : coupledqk::Positions::none;
  if (const std::string* b = f.find_meta("rope_base")) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(b->c_str(), &end);
    if (b->empty() || errno != 0 || end != b->c_str() + b->size() || !std::isfinite(v) || v <= 1)
      throw coupledqk::io_error(in_file(f.source) + "metadata 'rope_base' is \"" + io::detail::quote(*b) +
                                "\"; expected a finite number > 1");
    c.rope_base = v;
  }
  c.rope_order = metadata_word(f, "rope_order", {"dynamics-then-rotate", "rotate-then-dynamics"}) ==
                         "rotate-then-dynamics"
                     ? coupledqk::RopeOrder::rotate_then_dynamics
                     : coupledqk::RopeOrder::dynamics_then_rotate;
  return c;
}

/// [B, T, D] of x (and dy), checked.
std::vector<std::int64_t> activation_shape(const io::file& f) {
  const io::tensor& x = f.at("x");
  if (x.shape.size() != 3 || x.numel() == 0)
    throw coupledqk::io_error(in_file(f.source) + "tensor 'x' has shape " + shape_string(x.shape) +
                              "; expected [B, T, D] with B, T, D > 0");
  const io::tensor& dy = f.at("dy");
  if (dy.shape != x.shape)
    throw coupledqk::io_error(in_file(f.source) + "tensor 'dy' has shape " + shape_string(dy.shape) +
                              "; expected " + shape_string(x.shape) + ", the shape of x");
  return x.shape;
}

template <class S>
void run(const io::file& in, const case_settings& settings, bool recompute, const std::string& output) {
  using coupledqk::Index;
  const std::vector<std::int64_t> shape = activation_shape(in);
  const Index B = static_cast<Index>(shape[0]), T = static_cast<Index>(shape[1]),
              D = static_cast<Index>(shape[2]);
  // Sizes from the file, checked before anything is allocated from them: the dynamics width
  // cannot exceed the parameters the file holds. (B*T*D is the size of x, which the file holds; the
  // fast attention path keeps no [T, T] matrix, so T costs time, not memory.)
  double held = 0;
  for (const auto& t : in.tensors) held += static_cast<double>(t.numel());
  if (static_cast<double>(settings.hidden) > held)
    throw coupledqk::io_error(in_file(in.source) + "metadata 'm' is " + std::to_string(settings.hidden) +
                              ", more than the " + std::to_string(static_cast<long long>(held)) +
                              " elements the file holds; the dynamics' tensors cannot match it");

  coupledqk::AttentionConfig config;
  config.dim = D;
  config.heads = settings.heads;
  config.hidden = settings.hidden;
  config.layer_index = settings.layer_index;
  config.memory = recompute ? coupledqk::DynamicsMemory::recompute : coupledqk::DynamicsMemory::store;
  config.causal = settings.causal;
  config.window = settings.window;
  config.positions = settings.positions;
  config.rope_base = settings.rope_base;
  config.rope_order = settings.rope_order;
  // The rows' layout: B equal sequences, B right-padded ones, or packed (x [1, N, D]).
  coupledqk::Sequences seqs = coupledqk::Sequences::equal(B, T);
  try {
    if (!settings.lengths.empty()) {
      if (static_cast<Index>(settings.lengths.size()) != B)
        throw coupledqk::invalid_argument("metadata 'lengths' holds " + std::to_string(settings.lengths.size()) +
                                          " lengths; x holds B = " + std::to_string(B) + " sequences");
      seqs = coupledqk::Sequences::padded(T, settings.lengths);
    } else if (!settings.offsets.empty()) {
      if (B != 1)
        throw coupledqk::invalid_argument("metadata 'offsets' (packed sequences) needs x of shape [1, N, D]; got " +
                                          shape_string(shape));
      seqs = coupledqk::Sequences::packed(settings.offsets);
      if (seqs.rows() != T)
        throw coupledqk::invalid_argument("metadata 'offsets' ends at " + std::to_string(seqs.rows()) +
                                          "; x holds N = " + std::to_string(T) + " rows");
    }
  } catch (const coupledqk::invalid_argument& e) {
    throw coupledqk::io_error(in_file(in.source) + e.what());
  }
  auto layer = coupledqk::make_attention<S>(settings.attention, settings.steps, config, 0);

  // The file must hold exactly x, dy and the variant's parameters.
  const std::vector<coupledqk::TensorView<S>> params = layer->parameters();
  std::vector<std::string> accepted{"x", "dy"};
  for (const auto& v : params) accepted.push_back(v.name);
  const std::set<std::string> accepted_set(accepted.begin(), accepted.end());
  std::vector<std::string> extra;
  for (const auto& t : in.tensors)
    if (!accepted_set.count(t.name)) extra.push_back(t.name);
  if (!extra.empty())
    throw coupledqk::io_error(in_file(in.source) + "unexpected tensor" + (extra.size() > 1 ? "s " : " ") +
                              io::detail::join_names(extra) + " for attention '" + settings.attention +
                              "'; accepted: " + coupledqk::join_names(accepted));
  io::load_into(in, params);
  layer->check_parameters();

  coupledqk::Matrix<S> x(B * T, D), dy(B * T, D);
  in.at("x").copy_to(x.data(), static_cast<std::size_t>(x.size()));
  in.at("dy").copy_to(dy.data(), static_cast<std::size_t>(dy.size()));

  const coupledqk::Matrix<S> y = seqs.layout() == coupledqk::SequenceLayout::equal ? layer->forward(x, B)
                                                                                  : layer->forward(x, seqs);
  layer->zero_gradients();
  const coupledqk::Matrix<S> dx = layer->backward(dy);

  io::file out;
  out.metadata = in.metadata;
  out.tensors.push_back(io::tensor::from<S>("y", shape, y.data()));
  out.tensors.push_back(io::tensor::from<S>("grad.x", shape, dx.data()));
  for (const auto& g : layer->gradients()) out.tensors.push_back(io::from_view(g, "grad." + g.name));
  io::write(output, out);
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  try {
    opts = parse_arguments(argc, argv);
  } catch (const usage_error& e) {
    std::cerr << "coupledqk-layer: error: " << e.what() << "\n\n" << usage_text();
    return 2;
  }
  if (opts.help) {
    std::cout << usage_text();
    return 0;
  }
  if (opts.variants) {
    for (const auto& info : coupledqk::builtin_variants.infos())
      std::cout << info.name << '\t' << info.has_dynamics << '\t' << info.is_reversible << '\n';
    return 0;
  }
  try {
    const io::file in = io::read(opts.input);
    const case_settings settings = read_settings(in);
    // One dtype for every tensor: F32 (float) or F64 (double).
    const io::tensor& x = in.at("x");
    if (x.type != io::dtype::F32 && x.type != io::dtype::F64)
      throw coupledqk::io_error(in_file(in.source) + "tensor 'x' has dtype " + io::to_string(x.type) +
                                "; expected F32 or F64");
    for (const auto& t : in.tensors)
      if (t.type != x.type)
        throw coupledqk::io_error(in_file(in.source) + "tensor '" + io::detail::quote(t.name) + "' has dtype " +
                                  io::to_string(t.type) + " but 'x' has " + io::to_string(x.type) +
                                  "; all tensors must share one dtype (F32 or F64)");
    if (x.type == io::dtype::F64)
      run<double>(in, settings, opts.recompute, opts.output);
    else
      run<float>(in, settings, opts.recompute, opts.output);
  } catch (const coupledqk::invalid_argument& e) {
    std::cerr << "coupledqk-layer: error: " << in_file(opts.input) << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "coupledqk-layer: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
