// make_kernel<double>: the compiled table's layers in double precision (see kernels_impl.hpp); and the
// settings checks of kernels.hpp (the library's own rules, no layer built).
#include "kernels_impl.hpp"

#include <coupledqk/model/gpt.hpp>  // validate(GptConfig)

#include <limits>

namespace coupledqk::python {

template std::unique_ptr<Kernel<double>> make_kernel<double>(const std::string&, int, const AttentionConfig&);

void check_attention(const std::string& attention, int steps, const AttentionConfig& config) {
  with_variant(attention, steps, [&](auto integrator, auto scoring) {
    Attention<double, typename decltype(integrator)::type, typename decltype(scoring)::type>::check_config(config);
    return 0;
  });
}

void check_gpt(Index vocab, Index dim, Index layers, Index heads, Index context, Index hidden,
               const std::string& attention, int steps, double init_std, const AttentionConfig& layer) {
  GptConfig c;
  c.vocab = vocab;
  c.dim = dim;
  c.layers = layers;
  c.heads = heads;
  c.context = context;
  c.hidden = hidden;
  c.attention = attention;
  c.steps = steps;
  c.init_std = init_std;
  c.dynamics_init_scale = layer.dynamics_init_scale;
  c.init_time = layer.init_time;
  c.memory = layer.memory;
  validate(c);
  check_attention(attention, steps, c.attention_config(0));
  if (layers - 1 <= std::numeric_limits<int>::max())
    check_attention(attention, steps, c.attention_config(static_cast<int>(layers - 1)));
}

}  // namespace coupledqk::python
