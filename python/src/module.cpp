// coupledqk._C: the pybind11 + libtorch glue between torch tensors and the library's layer
// (kernels.hpp). Everything here checks what Python hands over and copies no more than the layer
// needs; the layer code itself is compiled in kernels_float.cpp and kernels_double.cpp.
//
// Errors reach Python as exceptions naming the value seen and what is accepted: TypeError for a
// wrong dtype, ValueError for a wrong shape, device or setting (coupledqk::invalid_argument derives
// from std::invalid_argument, which pybind11 turns into ValueError).
#include <torch/extension.h>

#include <coupledqk/version.hpp>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels.hpp"

namespace py = pybind11;
namespace cp = coupledqk::python;
using coupledqk::Index;

namespace {

std::string shape_string(at::IntArrayRef shape) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}
std::string shape_string(const std::vector<Index>& shape) {
  return shape_string(at::IntArrayRef(std::vector<int64_t>(shape.begin(), shape.end())));
}
/// The dtype as Python spells it (torch.float32, not c10's "Float").
std::string dtype_string(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}

coupledqk::DynamicsMemory parse_memory(const std::string& m) {
  if (m == "store") return coupledqk::DynamicsMemory::store;
  if (m == "recompute") return coupledqk::DynamicsMemory::recompute;
  throw py::value_error("memory must be 'store' or 'recompute'; got '" + m + "'");
}

coupledqk::Positions parse_positions(const std::string& p) {
  if (p == "none") return coupledqk::Positions::none;
  if (p == "rope") return coupledqk::Positions::rope;
  throw py::value_error("positions must be 'none' or 'rope'; got '" + p + "'");
}

coupledqk::RopeOrder parse_rope_order(const std::string& o) {
  if (o == "dynamics-then-rotate") return coupledqk::RopeOrder::dynamics_then_rotate;
  if (o == "rotate-then-dynamics") return coupledqk::RopeOrder::rotate_then_dynamics;
  throw py::value_error("rope_order must be 'dynamics-then-rotate' or 'rotate-then-dynamics'; got '" + o + "'");
}

/// The mask and positions keywords of the Python module (strings as Python spells them).
struct MaskSettings {
  bool causal = true;
  Index window = 0;
  std::string positions = "none";
  double rope_base = coupledqk::default_rope_base;
  std::string rope_order = "dynamics-then-rotate";
};

/// An AttentionConfig from the Python module's keywords (memory, positions and rope order by name).
coupledqk::AttentionConfig attention_config(Index dim, Index heads, Index hidden, int layer_index, double init_std,
                                            double dynamics_init_scale, double init_time, const std::string& memory,
                                            bool reference_kernels, const MaskSettings& mask = {}) {
  coupledqk::AttentionConfig c;
  c.dim = dim;
  c.heads = heads;
  c.hidden = hidden;
  c.layer_index = layer_index;
  c.init_std = init_std;
  c.dynamics_init_scale = dynamics_init_scale;
  c.init_time = init_time;
  c.memory = parse_memory(memory);
  c.reference_kernels = reference_kernels;
  c.causal = mask.causal;
  c.window = mask.window;
  c.positions = parse_positions(mask.positions);
  c.rope_base = mask.rope_base;
  c.rope_order = parse_rope_order(mask.rope_order);
  return c;
}


/// The dtypes the layer runs in: float32 and float64; TypeError for anything else.
void require_dtype(const at::Tensor& t, const std::string& what) {
  const auto s = t.scalar_type();
  if (s != at::kFloat && s != at::kDouble)
    throw py::type_error(what + " has dtype " + dtype_string(s) + "; expected torch.float32 or torch.float64" +
                         (at::isFloatingType(s) ? " (convert with .float() or .double())" : ""));
}

/// The CPU only: this build of the extension has no CUDA path.
void require_cpu(const at::Tensor& t, const std::string& what) {
  if (!t.device().is_cpu())
    throw py::value_error(what + " is on device '" + t.device().str() +
                          "'; coupledqk's torch extension runs on the CPU only (it is built without CUDA): "
                          "move the module and its input with .cpu()");
}

/// The integer values of a [n] tensor of valid lengths or offsets (int32 or int64, CPU), checked.
std::vector<Index> index_values(const at::Tensor& t, const std::string& what, const std::string& meaning) {
  require_cpu(t, what);
  const auto st = t.scalar_type();
  if (st != at::kLong && st != at::kInt && st != at::kShort && st != at::kChar && st != at::kByte)
    throw py::type_error(what + " has dtype " + dtype_string(st) + "; expected an integer tensor (torch.int64 or "
                         "torch.int32) of " + meaning);
  if (t.dim() != 1)
    throw py::value_error(what + " has shape " + shape_string(t.sizes()) + "; expected a 1-D tensor of " + meaning);
  const at::Tensor v = t.to(at::kLong).contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  return std::vector<Index>(p, p + v.numel());
}

/// What one forward kept, for the autograd Function's backward.
class PassHandle {
 public:
  PassHandle(std::shared_ptr<void> pass, at::ScalarType dtype, std::vector<std::vector<Index>> shapes,
             std::vector<int64_t> y_shape)
      : pass_(std::move(pass)), dtype_(dtype), shapes_(std::move(shapes)), y_shape_(std::move(y_shape)) {}

  /// (dx, [grad of every parameter, specs order]) for dy = dLoss/dy.
  std::pair<at::Tensor, std::vector<at::Tensor>> backward(const at::Tensor& dy_in) const {
    require_cpu(dy_in, "the gradient of y");
    if (dy_in.sizes() != at::IntArrayRef(y_shape_))
      throw py::value_error("the gradient of y has shape " + shape_string(dy_in.sizes()) + "; expected " +
                            shape_string(y_shape_) + ", the shape of y");
    const at::Tensor dy = dy_in.to(dtype_).contiguous();
    at::Tensor dx = at::empty(y_shape_, dy.options());
    std::vector<at::Tensor> grads;
    for (const auto& s : shapes_) grads.push_back(at::empty(std::vector<int64_t>(s.begin(), s.end()), dy.options()));
    const int threads = at::get_num_threads();
    if (dtype_ == at::kFloat)
      run<float>(dy, dx, grads, threads);
    else
      run<double>(dy, dx, grads, threads);
    return {dx, grads};
  }

 private:
  template <class S>
  void run(const at::Tensor& dy, at::Tensor& dx, std::vector<at::Tensor>& grads, int threads) const {
    std::vector<S*> g;
    for (auto& t : grads) g.push_back(t.data_ptr<S>());
    const S* dyp = dy.data_ptr<S>();
    S* dxp = dx.data_ptr<S>();
    py::gil_scoped_release release;
    static_cast<const cp::Pass<S>*>(pass_.get())->backward(dyp, dxp, g, threads);
  }

  std::shared_ptr<void> pass_;
  at::ScalarType dtype_;
  std::vector<std::vector<Index>> shapes_;
  std::vector<int64_t> y_shape_;
};

/// One variant with one configuration, in float32 and float64 (each built when first used).
class Layer {
 public:
  Layer(std::string attention, int steps, Index dim, Index heads, Index hidden, int layer_index, double init_std,
        double dynamics_init_scale, double init_time, const std::string& memory, bool reference_kernels,
        bool causal, Index window, const std::string& positions, double rope_base, const std::string& rope_order)
      : attention_(std::move(attention)),
        steps_(steps),
        memory_(memory),
        mask_{causal, window, positions, rope_base, rope_order},
        config_(attention_config(dim, heads, hidden, layer_index, init_std, dynamics_init_scale, init_time, memory,
                                 reference_kernels, mask_)) {
    cp::check_attention(attention_, steps_, config_);  // the name, the steps and the config, before allocating
    kernel<double>();
  }

  /// [(name, shape)] of every parameter, in the library's order.
  std::vector<std::pair<std::string, std::vector<Index>>> specs() {
    std::vector<std::pair<std::string, std::vector<Index>>> out;
    for (const auto& s : kernel<double>().specs()) out.emplace_back(s.name, s.shape);
    return out;
  }

  /// The library's initial parameters for `seed` (Attention(config, seed)), in `dtype`.
  std::vector<at::Tensor> initial_parameters(std::uint64_t seed, py::object dtype_obj) {
    const at::ScalarType dtype = torch::python::detail::py_object_to_dtype(dtype_obj);
    if (dtype != at::kFloat && dtype != at::kDouble)
      throw py::type_error("dtype must be torch.float32 or torch.float64; got " + dtype_string(dtype));
    std::vector<at::Tensor> out;
    for (const auto& s : kernel<double>().specs())
      out.push_back(at::empty(std::vector<int64_t>(s.shape.begin(), s.shape.end()), at::TensorOptions(dtype)));
    if (dtype == at::kFloat)
      init<float>(seed, out);
    else
      init<double>(seed, out);
    return out;
  }

  /// y = layer(x) for x [B, T, D] (lengths: none, or a [B] tensor of the valid lengths of
  /// right-padded sequences) or x [N, D] packed (offsets: a [B+1] tensor 0, ..., N), and the
  /// parameters in specs() order; with the pass for the backward when keep.
  std::pair<at::Tensor, std::optional<PassHandle>> forward(const at::Tensor& x_in, const std::vector<at::Tensor>& params,
                                                           bool keep, const std::optional<at::Tensor>& lengths,
                                                           const std::optional<at::Tensor>& offsets) {
    const Index D = config_.dim;
    require_cpu(x_in, "x");
    require_dtype(x_in, "x");
    coupledqk::Sequences seqs;
    if (offsets) {
      if (lengths) throw py::value_error("give lengths (padded) or offsets (packed), not both");
      if (x_in.dim() != 2 || x_in.size(1) != D)
        throw py::value_error("packed x has shape " + shape_string(x_in.sizes()) + "; expected [N, " +
                              std::to_string(D) + "] (every sequence's tokens end to end, dim = " + std::to_string(D) +
                              ")");
      seqs = coupledqk::Sequences::packed(index_values(*offsets, "offsets", "B+1 row offsets 0, ..., N"));
      if (seqs.rows() != x_in.size(0))
        throw py::value_error("offsets end at " + std::to_string(seqs.rows()) + "; x holds N = " +
                              std::to_string(x_in.size(0)) + " rows");
    } else {
      if (x_in.dim() != 3 || x_in.size(2) != D)
        throw py::value_error("x has shape " + shape_string(x_in.sizes()) + "; expected [B, T, " + std::to_string(D) +
                              "] (batch, sequence, dim = " + std::to_string(D) + ")");
      if (x_in.size(0) == 0 || x_in.size(1) == 0)
        throw py::value_error("x has shape " + shape_string(x_in.sizes()) + "; expected B > 0 and T > 0");
      if (lengths) {
        std::vector<Index> l = index_values(*lengths, "lengths", "the B valid lengths");
        if (static_cast<int64_t>(l.size()) != x_in.size(0))
          throw py::value_error("lengths holds " + std::to_string(l.size()) + " values; x holds B = " +
                                std::to_string(x_in.size(0)) + " sequences");
        seqs = coupledqk::Sequences::padded(x_in.size(1), std::move(l));
      } else {
        seqs = coupledqk::Sequences::equal(x_in.size(0), x_in.size(1));
      }
    }
    const at::ScalarType dtype = x_in.scalar_type();
    const auto& specs = kernel<double>().specs();
    if (params.size() != specs.size())
      throw py::value_error("attention '" + attention_ + "' takes " + std::to_string(specs.size()) +
                            " parameter tensors; got " + std::to_string(params.size()));
    std::vector<at::Tensor> p;
    std::vector<std::vector<Index>> shapes;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::string what = "parameter '" + specs[i].name + "'";
      require_cpu(params[i], what);
      if (params[i].scalar_type() != dtype)
        throw py::type_error(what + " has dtype " + dtype_string(params[i].scalar_type()) + " but x has " +
                             dtype_string(dtype) + "; the input and every parameter must share one dtype "
                             "(convert the module with .float() or .double(), or the input with .to())");
      const std::vector<int64_t> want(specs[i].shape.begin(), specs[i].shape.end());
      if (params[i].sizes() != at::IntArrayRef(want))
        throw py::value_error(what + " has shape " + shape_string(params[i].sizes()) + "; expected " +
                              shape_string(specs[i].shape) + " for attention '" + attention_ + "'");
      p.push_back(params[i].contiguous());
      shapes.push_back(specs[i].shape);
    }
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    std::shared_ptr<void> pass =
        dtype == at::kFloat ? run<float>(x, seqs, p, y, keep) : run<double>(x, seqs, p, y, keep);
    if (!keep) return {y, std::nullopt};
    return {y, PassHandle(std::move(pass), dtype, std::move(shapes), x.sizes().vec())};
  }

  const std::string& attention() const { return attention_; }
  int steps() const { return steps_; }

  /// The constructor's arguments, for pickling (copy.deepcopy, torch.save of a whole model).
  py::tuple arguments() const {
    return py::make_tuple(attention_, steps_, config_.dim, config_.heads, config_.hidden, config_.layer_index,
                          config_.init_std, config_.dynamics_init_scale, config_.init_time, memory_,
                          config_.reference_kernels, mask_.causal, mask_.window, mask_.positions, mask_.rope_base,
                          mask_.rope_order);
  }

 private:
  template <class S>
  cp::Kernel<S>& kernel() {
    auto& k = std::get<std::unique_ptr<cp::Kernel<S>>>(kernels_);
    if (!k) k = cp::make_kernel<S>(attention_, steps_, config_);
    return *k;
  }

  template <class S>
  void init(std::uint64_t seed, std::vector<at::Tensor>& out) {
    std::vector<S*> ptrs;
    for (auto& t : out) ptrs.push_back(t.data_ptr<S>());
    kernel<S>().initial_parameters(seed, ptrs);
  }

  template <class S>
  std::shared_ptr<void> run(const at::Tensor& x, const coupledqk::Sequences& seqs, const std::vector<at::Tensor>& p,
                            at::Tensor& y, bool keep) {
    cp::Kernel<S>& k = kernel<S>();
    std::vector<const S*> ptrs;
    for (const auto& t : p) ptrs.push_back(t.data_ptr<S>());
    const S* xp = x.data_ptr<S>();
    S* yp = y.data_ptr<S>();
    const int threads = at::get_num_threads();
    py::gil_scoped_release release;
    return k.forward(xp, seqs, ptrs, yp, keep, threads);
  }

  std::string attention_;
  int steps_;
  std::string memory_;
  MaskSettings mask_;
  coupledqk::AttentionConfig config_;
  std::tuple<std::unique_ptr<cp::Kernel<float>>, std::unique_ptr<cp::Kernel<double>>> kernels_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "coupledqk's attention layers (the library's own kernels) for PyTorch; use the coupledqk package";
  m.attr("version") = coupledqk::version;
  m.attr("max_steps") = cp::max_steps();
  m.attr("cuda") = false;
  m.def("variants", [] {
    py::list out;
    for (const auto& v : cp::variants()) {
      py::dict d;
      d["name"] = v.name;
      d["integrator"] = v.integrator;
      d["scoring"] = v.scoring;
      d["has_dynamics"] = v.has_dynamics;
      d["is_reversible"] = v.is_reversible;
      d["is_symplectic"] = v.is_symplectic;
      d["is_coupled"] = v.is_coupled;
      d["order"] = v.order;
      d["has_steps"] = v.has_steps;
      out.append(d);
    }
    return out;
  }, "Every attention variant of the library's table (builtin_variants), in table order, as dicts.");

  m.def(
      "check_attention",
      [](const std::string& attention, int steps, Index dim, Index heads, Index hidden, int layer_index,
         double init_std, double dynamics_init_scale, double init_time, const std::string& memory, bool causal,
         Index window, const std::string& positions, double rope_base, const std::string& rope_order) {
        cp::check_attention(attention, steps,
                            attention_config(dim, heads, hidden, layer_index, init_std, dynamics_init_scale,
                                             init_time, memory, false,
                                             MaskSettings{causal, window, positions, rope_base, rope_order}));
      },
      py::arg("attention"), py::arg("steps"), py::arg("dim"), py::arg("heads"), py::arg("hidden"),
      py::arg("layer_index"), py::arg("init_std"), py::arg("dynamics_init_scale"), py::arg("init_time"),
      py::arg("memory"), py::arg("causal") = true, py::arg("window") = 0, py::arg("positions") = "none",
      py::arg("rope_base") = coupledqk::default_rope_base, py::arg("rope_order") = "dynamics-then-rotate",
      "ValueError, in the library's words, unless the library's layer takes these settings; builds nothing.");
  m.def(
      "check_gpt",
      [](Index vocab, Index dim, Index layers, Index heads, Index context, Index hidden, const std::string& attention,
         int steps, double init_std, double dynamics_init_scale, double init_time, const std::string& memory) {
        cp::check_gpt(vocab, dim, layers, heads, context, hidden, attention, steps, init_std,
                      attention_config(dim, heads, hidden, 0, init_std, dynamics_init_scale, init_time, memory,
                                       false));
      },
      py::arg("vocab"), py::arg("dim"), py::arg("layers"), py::arg("heads"), py::arg("context"), py::arg("hidden"),
      py::arg("attention"), py::arg("steps"), py::arg("init_std"), py::arg("dynamics_init_scale"),
      py::arg("init_time"), py::arg("memory"),
      "ValueError, in the library's words (validate(GptConfig), the layers' rules), unless a GPT of these "
      "settings can be built; builds nothing.");

  py::class_<PassHandle>(m, "Pass", "What one forward kept for its backward.")
      .def("backward", &PassHandle::backward, py::arg("dy"),
           "(dx, [grad of each parameter]) for dy = dLoss/dy; gradients are written, not accumulated.");

  py::class_<Layer>(m, "Layer", "One attention variant with one configuration (float32 and float64).")
      .def(py::init<std::string, int, Index, Index, Index, int, double, double, double, std::string, bool, bool, Index,
                    std::string, double, std::string>(),
           py::arg("attention"), py::arg("steps"), py::arg("dim"), py::arg("heads"), py::arg("hidden"),
           py::arg("layer_index"), py::arg("init_std"), py::arg("dynamics_init_scale"), py::arg("init_time"),
           py::arg("memory"), py::arg("reference_kernels"), py::arg("causal") = true, py::arg("window") = 0,
           py::arg("positions") = "none", py::arg("rope_base") = coupledqk::default_rope_base,
           py::arg("rope_order") = "dynamics-then-rotate")
      .def("specs", &Layer::specs, "[(name, shape)] of every parameter, in the library's order.")
      .def("initial_parameters", &Layer::initial_parameters, py::arg("seed"), py::arg("dtype"))
      .def("forward", &Layer::forward, py::arg("x"), py::arg("params"), py::arg("keep"),
           py::arg("lengths") = py::none(), py::arg("offsets") = py::none())
      .def(py::pickle([](const Layer& l) { return l.arguments(); },
                      [](const py::tuple& a) {
                        // 11 values: a layer pickled before masks and positions existed (causal, no window, none)
                        if (a.size() != 11 && a.size() != 16)
                          throw py::value_error("coupledqk._C.Layer: a pickled state has " + std::to_string(a.size()) +
                                                " values; expected 16 (or 11, from before masks and positions)");
                        const bool full = a.size() == 16;
                        return Layer(a[0].cast<std::string>(), a[1].cast<int>(), a[2].cast<Index>(), a[3].cast<Index>(),
                                     a[4].cast<Index>(), a[5].cast<int>(), a[6].cast<double>(), a[7].cast<double>(),
                                     a[8].cast<double>(), a[9].cast<std::string>(), a[10].cast<bool>(),
                                     full ? a[11].cast<bool>() : true, full ? a[12].cast<Index>() : 0,
                                     full ? a[13].cast<std::string>() : "none",
                                     full ? a[14].cast<double>() : coupledqk::default_rope_base,
                                     full ? a[15].cast<std::string>() : "dynamics-then-rotate");
                      }))
      .def_property_readonly("attention", &Layer::attention)
      .def_property_readonly("steps", &Layer::steps);
}
