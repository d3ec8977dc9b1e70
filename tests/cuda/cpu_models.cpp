// The definitions of cpu_models.hpp: every listed variant's CPU model at float and double.
#include "cpu_models.hpp"

#include <tuple>

namespace coupledqk::cuda::testing {

template <class S, class I, class Sc>
std::unique_ptr<::coupledqk::AnyGpt<S>> cpu_model(const ::coupledqk::GptConfig& config, std::uint64_t seed) {
  return std::make_unique<::coupledqk::Gpt<S, I, Sc>>(config, seed);
}

/// Taking each definition's address instantiates it in this translation unit (the explicit
/// instantiation below emits the table, so the definitions are emitted with it).
template <class... V>
struct CpuModelDefinitions {
  static constexpr auto definitions =
      std::make_tuple(&cpu_model<float, typename V::integrator, typename V::scoring>...,
                      &cpu_model<double, typename V::integrator, typename V::scoring>...);
};
template struct CpuModelDefinitions<COUPLEDQK_GPT_VARIANTS, COUPLEDQK_CPU_MODEL_EXTRA_VARIANTS>;

}  // namespace coupledqk::cuda::testing
