// make_kernel<float>: the compiled table's layers in single precision (see kernels_impl.hpp).
#include "kernels_impl.hpp"

namespace coupledqk::python {

template std::unique_ptr<Kernel<float>> make_kernel<float>(const std::string&, int, const AttentionConfig&);

std::vector<VariantInfo> variants() { return builtin_variants.infos(); }

int max_steps() { return coupledqk::max_steps; }

}  // namespace coupledqk::python
