// make_kernel<float>: every built-in variant in single precision (see kernels_impl.hpp).
#include "kernels_impl.hpp"

namespace coupledqk::python {

template std::unique_ptr<Kernel<float>> make_kernel<float>(const std::string&, int, const AttentionConfig&);

std::vector<VariantInfo> variants() {
  std::vector<VariantInfo> out;
  for (const auto& name : builtin_variants.names())
    out.push_back(with_variant(name, 1, [&](auto integrator, auto scoring) {
      using I = typename decltype(integrator)::type;
      using Sc = typename decltype(scoring)::type;
      return VariantInfo{name, I::name, Sc::name, I::has_dynamics, I::is_reversible};
    }));
  return out;
}

int max_steps() { return coupledqk::max_steps; }

}  // namespace coupledqk::python
