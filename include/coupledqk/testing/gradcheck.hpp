// Central finite differences against a layer's analytic backward, in double precision.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../attention.hpp"

namespace coupledqk::testing {

/// Largest |a - n| over largest |n|: the relative error of one tensor's gradient.
template <class A, class B>
double max_relative_error(const A& analytic, const B& numeric) {
  const double den = std::max(static_cast<double>(numeric.cwiseAbs().maxCoeff()), 1e-300);
  return static_cast<double>((analytic - numeric).cwiseAbs().maxCoeff()) / den;
}

struct GradientError {
  std::string name;
  double error = 0;  ///< max_relative_error(analytic, numeric)
  double scale = 0;  ///< largest |numeric|, to spot an all-zero gradient that would pass trivially
};

/// Checks d(sum(y * dy))/d(x) and /d(every parameter) of `layer` against central differences with
/// step eps. Returns one entry per tensor ("x" first, then the parameters in visit order). batch: B
/// (B sequences of equal length) or a Sequences (padded or packed, scoring/mask.hpp).
template <class Layer, class Batch>
std::vector<GradientError> check_gradients(Layer layer, const Matrix<double>& x, const Batch& batch,
                                           const Matrix<double>& dy, double eps = 1e-6) {
  static_assert(std::is_same_v<typename Layer::scalar, double>, "gradient checks run in double");
  auto loss = [&](const Layer& l, const Matrix<double>& input) {
    return (l.forward(input, batch).array() * dy.array()).sum();
  };
  typename Layer::Context ctx;
  layer.forward(x, batch, &ctx);
  auto grad = layer.zero_gradients();
  const Matrix<double> dx = layer.backward(ctx, dy, grad);

  std::vector<GradientError> out;
  {
    Matrix<double> xp = x, numeric(x.rows(), x.cols());
    for (Index i = 0; i < x.size(); ++i) {
      const double v = xp.data()[i];
      xp.data()[i] = v + eps;
      const double lp = loss(layer, xp);
      xp.data()[i] = v - eps;
      const double lm = loss(layer, xp);
      xp.data()[i] = v;
      numeric.data()[i] = (lp - lm) / (2 * eps);
    }
    out.push_back({"x", max_relative_error(dx, numeric), numeric.cwiseAbs().maxCoeff()});
  }
  std::vector<TensorView<double>> params, grads;
  append_views<double>(layer.params, "", params);
  append_views<double>(grad, "", grads);
  for (std::size_t t = 0; t < params.size(); ++t) {
    const Index n = params[t].size();
    Eigen::Map<Vector<double>> analytic(grads[t].data, n);
    Vector<double> numeric(n);
    for (Index i = 0; i < n; ++i) {
      double& w = params[t].data[i];
      const double v = w;
      w = v + eps;
      const double lp = loss(layer, x);
      w = v - eps;
      const double lm = loss(layer, x);
      w = v;
      numeric[i] = (lp - lm) / (2 * eps);
    }
    out.push_back({params[t].name, max_relative_error(analytic, numeric), numeric.cwiseAbs().maxCoeff()});
  }
  return out;
}

}  // namespace coupledqk::testing
