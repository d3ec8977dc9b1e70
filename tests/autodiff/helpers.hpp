// Shared helpers of the autodiff, model and optimiser tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <coupledqk/autodiff/ops.hpp>
#include <coupledqk/autodiff/tape.hpp>
#include <coupledqk/core/parameters.hpp>
#include <coupledqk/core/random.hpp>
#include <coupledqk/testing/gradcheck.hpp>

namespace cqk_ad_test {

using namespace coupledqk;

/// A purely relative doctest::Approx: |x - v| <= e * max(|x|, |v|). (doctest's default scale of 1
/// adds an absolute floor of e, which would let 0.02 pass for 0.005 at e = 0.05.)
inline doctest::Approx rel(double v, double e = 1e-12) { return doctest::Approx(v).epsilon(e).scale(0); }

inline Matrix<double> random_matrix(Index rows, Index cols, Rng& rng, double stddev = 1.0) {
  Matrix<double> m(rows, cols);
  rng.fill_normal(m, stddev);
  return m;
}

/// One tensor's result of a gradient check.
struct TensorError {
  std::string name;
  double error = 0;  ///< max |analytic - numeric| / max |numeric|
  double scale = 0;  ///< max |numeric|: a gradient that is all zero would pass trivially
};

/// Central-difference check of a tape graph in double. `inputs` are bound as parameter leaves (so
/// their gradients arrive through the external-buffer path); `build(tape, leaves)` returns the
/// output node y. The checked function is f = sum(y * R) for a fixed random R of y's shape (R = 1
/// for a scalar y).
inline std::vector<TensorError> check_graph(
    std::vector<Matrix<double>> inputs,
    const std::function<Var(Tape<double>&, const std::vector<Var>&)>& build, std::uint64_t seed = 5,
    double eps = 1e-6) {
  Tape<double> tape;
  auto f = [&](const std::vector<Matrix<double>>& in) {
    tape.clear();
    std::vector<Var> leaves;
    for (const auto& m : in) leaves.push_back(tape.parameter(m, nullptr));
    return build(tape, leaves);
  };
  // analytic
  std::vector<Matrix<double>> grads;
  for (const auto& m : inputs) grads.push_back(Matrix<double>::Zero(m.rows(), m.cols()));
  tape.clear();
  std::vector<Var> leaves;
  for (std::size_t i = 0; i < inputs.size(); ++i) leaves.push_back(tape.parameter(inputs[i], &grads[i]));
  const Var y = build(tape, leaves);
  Rng rng(seed);
  const Matrix<double> R = tape.rows(y) == 1 && tape.cols(y) == 1 ? Matrix<double>::Ones(1, 1)
                                                                  : random_matrix(tape.rows(y), tape.cols(y), rng);
  tape.backward(y, R);
  auto objective = [&](const std::vector<Matrix<double>>& in) {
    const Var out = f(in);
    return (tape.value(out).array() * R.array()).sum();
  };
  std::vector<TensorError> out;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Matrix<double> numeric(inputs[i].rows(), inputs[i].cols());
    for (Index j = 0; j < inputs[i].size(); ++j) {
      const double v = inputs[i].data()[j];
      inputs[i].data()[j] = v + eps;
      const double lp = objective(inputs);
      inputs[i].data()[j] = v - eps;
      const double lm = objective(inputs);
      inputs[i].data()[j] = v;
      numeric.data()[j] = (lp - lm) / (2 * eps);
    }
    out.push_back({"input " + std::to_string(i), testing::max_relative_error(grads[i], numeric),
                   numeric.cwiseAbs().maxCoeff()});
  }
  return out;
}

/// Deterministic token ids in [0, vocab).
inline std::vector<std::int32_t> random_ids(Index n, Index vocab, Rng& rng) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng.next_u64() % static_cast<std::uint64_t>(vocab));
  return ids;
}

/// Copies of every tensor behind a list of views (for bitwise comparisons and restores).
template <class S>
std::vector<std::vector<S>> snapshot(const std::vector<TensorView<S>>& views) {
  std::vector<std::vector<S>> out;
  for (const auto& v : views) out.emplace_back(v.data, v.data + v.size());
  return out;
}
template <class S>
void restore(const std::vector<TensorView<S>>& views, const std::vector<std::vector<S>>& data) {
  for (std::size_t i = 0; i < views.size(); ++i) std::copy(data[i].begin(), data[i].end(), views[i].data);
}

}  // namespace cqk_ad_test
