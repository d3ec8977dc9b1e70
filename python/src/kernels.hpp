// The library's attention layer behind a torch-free interface, so that the pybind11 + libtorch
// glue (module.cpp) compiles no layer code. The layers themselves are the compiled table's
// (coupledqk::variants_layers: every variant of builtin_variants at every step count, float and
// double, compiled once for the project); kernels_float.cpp and kernels_double.cpp wrap it.
//
// Shapes: x, y, dy, dx are [rows, D] row-major (rows as a Sequences lays them out: B*T, rows ordered
// (b, t), or packed sequences end to end); every parameter is row-major
// with the shape its TensorSpec names (specs(), the order of Attention::parameter_specs).
#pragma once

#include <coupledqk/attention.hpp>
#include <coupledqk/registry.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace coupledqk::python {

/// The run-time names of builtin_variants, in table order, and what each is (the table's own
/// facts: registry.hpp, VariantInfo).
std::vector<VariantInfo> variants();
/// Largest step count compiled in (coupledqk::max_steps).
int max_steps();

/// What one forward kept for its backward: a copy of the parameters and the layer's Context.
template <class S>
class Pass {
 public:
  virtual ~Pass() = default;
  /// dy [B*T, D] -> dx (=) and the gradient of every parameter (=), in specs() order. May be called
  /// more than once (each call recomputes from what the forward kept).
  virtual void backward(const S* dy, S* dx, const std::vector<S*>& grads, int threads) const = 0;
};

/// One compiled layer Attention<S, Integrator, Scoring>, chosen at run time by name and steps.
template <class S>
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const std::vector<TensorSpec>& specs() const = 0;
  virtual const AttentionConfig& config() const = 0;
  /// The library's own initialisation for `seed` (Attention(config, seed)), written in specs() order.
  virtual void initial_parameters(std::uint64_t seed, const std::vector<S*>& out) const = 0;
  /// y = layer(x) for x [seqs.rows(), D] (B equal, right-padded or packed sequences); params in specs() order. When keep, returns what the
  /// backward needs (the configured DynamicsMemory applies); otherwise nullptr. threads > 0 sets
  /// the OpenMP thread count of the calling thread first. A pass let go of is kept for the next
  /// forward (one at most), so that repeated steps reuse its buffers.
  virtual std::shared_ptr<Pass<S>> forward(const S* x, const Sequences& seqs, const std::vector<const S*>& params,
                                           S* y, bool keep, int threads) const = 0;
};

/// The layer `attention` with `steps` steps from builtin_variants. Throws coupledqk::invalid_argument
/// (a ValueError in Python) for an unknown name, steps outside 1..max_steps or an unusable config.
template <class S>
std::unique_ptr<Kernel<S>> make_kernel(const std::string& attention, int steps, const AttentionConfig& config);

/// Throws coupledqk::invalid_argument (a ValueError in Python), in the library's own words, unless
/// make_kernel(attention, steps, config) would accept these: a name of the table, steps in
/// 1..max_steps, a config the layer takes (Attention::check_config: sizes, the scoring's shape
/// rules, recompute only for reversible integrators). Builds and allocates nothing, so that the
/// Python module refuses a setting with the words the C++ API and the tools use.
void check_attention(const std::string& attention, int steps, const AttentionConfig& config);

/// The same for a GPT of these sizes (validate(GptConfig), then check_attention for its blocks'
/// layers: the first and the last differ only in layer_index).
void check_gpt(Index vocab, Index dim, Index layers, Index heads, Index context, Index hidden,
               const std::string& attention, int steps, double init_std, const AttentionConfig& layer);

extern template std::unique_ptr<Kernel<float>> make_kernel<float>(const std::string&, int, const AttentionConfig&);
extern template std::unique_ptr<Kernel<double>> make_kernel<double>(const std::string&, int, const AttentionConfig&);

}  // namespace coupledqk::python
