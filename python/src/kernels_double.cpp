// make_kernel<double>: every built-in variant in double precision (see kernels_impl.hpp).
#include "kernels_impl.hpp"

namespace coupledqk::python {

template std::unique_ptr<Kernel<double>> make_kernel<double>(const std::string&, int, const AttentionConfig&);

}  // namespace coupledqk::python
