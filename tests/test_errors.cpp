// Bad input raises coupledqk::invalid_argument whose message names the value seen and what is
// accepted; nothing is broadcast or truncated silently.
#include <doctest/doctest.h>

// The calls by name (make_attention<float/double>) go to the compiled table (coupledqk::variants_layers,
// built once for the whole project), so this file does not instantiate every variant again.
#include <coupledqk/variants.hpp>

#include <cmath>
#include <limits>

#include "policies.hpp"

using namespace cqk_test;

namespace {

// Runs f, requires it to throw coupledqk::invalid_argument, returns the message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const coupledqk::invalid_argument& e) {
    return e.what();
  }
  FAIL("no coupledqk::invalid_argument was thrown");
  return {};
}

AttentionConfig config(Index dim, Index heads, Index hidden = 0) {
  AttentionConfig c;
  c.dim = dim;
  c.heads = heads;
  c.hidden = hidden;
  return c;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("config errors") {
  using L = Attention<double, Leapfrog<1>, Softmax>;
  auto msg = error_of([] { L(config(10, 4)); });
  CHECK(contains(msg, "divisible"));
  CHECK(contains(msg, "D = 10"));
  CHECK(contains(msg, "H = 4"));
  CHECK(contains(error_of([] { L(config(0, 4)); }), "got 0"));
  CHECK(contains(error_of([] { L(config(8, 0)); }), "heads (H) must be positive; got 0"));
  CHECK(contains(error_of([] { L(config(8, 2, -1)); }), "got -1"));
  msg = error_of([] { Attention<double, Identity, Differential>(config(12, 3)); });
  CHECK(contains(msg, "even"));
  CHECK(contains(msg, "heads = 3"));
  msg = error_of([] { Attention<double, Uncoupled<1>, Softmax>(config(8, 2, 5)); });
  CHECK(contains(msg, "m = 5"));
  auto cfg = config(8, 2);
  cfg.memory = DynamicsMemory::recompute;
  msg = error_of([&] { Attention<double, Euler<1>, Softmax>{cfg}; });
  CHECK(contains(msg, "reversible"));
  CHECK(contains(msg, "euler"));
  cfg = config(8, 2);
  cfg.init_time = 0;
  CHECK(contains(error_of([&] { L{cfg}; }), "init_time"));
}

TEST_CASE("forward shape and value errors") {
  const Attention<double, Leapfrog<2>, Softmax> layer(config(8, 2), 1);
  auto msg = error_of([&] { layer.forward(Matrix<double>::Zero(6, 7), 2); });
  CHECK(contains(msg, "7 columns"));
  CHECK(contains(msg, "D = 8"));
  msg = error_of([&] { layer.forward(Matrix<double>::Zero(7, 8), 2); });
  CHECK(contains(msg, "7 rows"));
  CHECK(contains(msg, "B = 2"));
  CHECK(contains(error_of([&] { layer.forward(Matrix<double>::Zero(6, 8), 0); }), "got 0"));
  CHECK(contains(error_of([&] { layer.forward(Matrix<double>::Zero(0, 8), 1); }), "no rows"));
  Matrix<double> x = Matrix<double>::Zero(6, 8);
  x(4, 3) = std::numeric_limits<double>::quiet_NaN();
  msg = error_of([&] { layer.forward(x, 2); });
  CHECK(contains(msg, "non-finite"));
  CHECK(contains(msg, "row 4, column 3"));
  x(4, 3) = std::numeric_limits<double>::infinity();
  CHECK(contains(error_of([&] { layer.forward(x, 2); }), "inf"));
}

TEST_CASE("backward errors") {
  const Attention<double, Euler<1>, Softmax> layer(config(8, 2), 1);
  decltype(layer)::Context ctx;
  auto grad = layer.zero_gradients();
  CHECK(contains(error_of([&] { layer.backward(ctx, Matrix<double>::Zero(6, 8), grad); }), "no forward"));
  layer.forward(Matrix<double>::Ones(6, 8), 2, &ctx);
  auto msg = error_of([&] { layer.backward(ctx, Matrix<double>::Zero(6, 9), grad); });
  CHECK(contains(msg, "[6, 9]"));
  CHECK(contains(msg, "expected [6, 8]"));
  Matrix<double> dy = Matrix<double>::Zero(6, 8);
  dy(0, 0) = std::numeric_limits<double>::infinity();
  CHECK(contains(error_of([&] { layer.backward(ctx, dy, grad); }), "non-finite"));
  decltype(grad) empty;
  CHECK(contains(error_of([&] { layer.backward(ctx, Matrix<double>::Zero(6, 8), empty); }), "zero_gradients"));
}

TEST_CASE("registry errors list what is accepted") {
  auto msg = error_of([] { make_attention<double>("leapfrg", 1, config(8, 2)); });
  CHECK(contains(msg, "'leapfrg'"));
  CHECK(contains(msg, "standard, leapfrog, euler, uncoupled, diff, diff-leapfrog, diff-euler, diff-uncoupled"));
  msg = error_of([] { make_attention<double>("euler", 0, config(8, 2)); });
  CHECK(contains(msg, "1..7"));
  CHECK(contains(msg, "got 0"));
  CHECK(contains(error_of([] { make_attention<float>("leapfrog", 8, config(8, 2)); }), "got 8"));
}

TEST_CASE("non-finite parameters are reported by name") {
  auto layer = make_attention<double>("leapfrog", 1, config(8, 2));
  layer->check_parameters();
  for (auto& v : layer->parameters())
    if (v.name == "dyn.a") v.data[1] = std::numeric_limits<double>::quiet_NaN();
  const auto msg = error_of([&] { layer->check_parameters(); });
  CHECK(contains(msg, "dyn.a"));
  CHECK(contains(msg, "flat index 1"));
}
