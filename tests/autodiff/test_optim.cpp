// AdamW against a hand-computed update, the schedule at known steps, clipping, the decay mask,
// the state views (save/restore) and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <coupledqk/optim/adamw.hpp>

#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

/// Two tensors, a matrix "W" [2, 3] (decayed) and a vector "b" [3] (not), with gradient buffers.
struct Toy {
  Matrix<double> W{2, 3}, gW{2, 3};
  Vector<double> b{3}, gb{3};
  Toy() {
    W << 0.5, -1.0, 2.0, 0.25, 0.0, -0.75;
    b << 0.1, -0.2, 0.3;
    gW.setZero();
    gb.setZero();
  }
  std::vector<TensorView<double>> params() {
    return {{"W", {2, 3}, W.data()}, {"b", {3}, b.data()}};
  }
  std::vector<TensorView<double>> grads() {
    return {{"W", {2, 3}, gW.data()}, {"b", {3}, gb.data()}};
  }
};

AdamWConfig constant_lr(double lr) {
  AdamWConfig c;
  c.lr = lr;
  c.min_lr = lr;
  c.total_steps = 1000;
  return c;
}

}  // namespace

TEST_CASE("AdamW: two steps against the update written out by hand") {
  Toy toy;
  AdamWConfig cfg = constant_lr(0.1);
  cfg.clip_norm = 0;  // clipping is tested on its own
  AdamW<double> opt(toy.params(), toy.grads(), cfg);
  const double lr = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  // the same arithmetic, one scalar at a time
  Matrix<double> W = toy.W, mW = Matrix<double>::Zero(2, 3), vW = Matrix<double>::Zero(2, 3);
  Vector<double> b = toy.b, mb = Vector<double>::Zero(3), vb = Vector<double>::Zero(3);
  Rng rng(1);
  for (int t = 1; t <= 2; ++t) {
    rng.fill_normal(toy.gW, 1.0);
    rng.fill_normal(toy.gb, 1.0);
    const StepReport r = opt.step();
    CHECK(r.step == t);
    CHECK(r.lr == lr);
    CHECK(!r.skipped);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (Index i = 0; i < 6; ++i) {
      const double g = toy.gW.data()[i];
      mW.data()[i] = b1 * mW.data()[i] + (1 - b1) * g;
      vW.data()[i] = b2 * vW.data()[i] + (1 - b2) * g * g;
      const double mhat = mW.data()[i] / bc1, vhat = vW.data()[i] / bc2;
      W.data()[i] = W.data()[i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
    }
    for (Index i = 0; i < 3; ++i) {
      const double g = toy.gb[i];
      mb[i] = b1 * mb[i] + (1 - b1) * g;
      vb[i] = b2 * vb[i] + (1 - b2) * g * g;
      b[i] -= lr * (mb[i] / bc1) / (std::sqrt(vb[i] / bc2) + eps);  // no decay on vectors
    }
    CHECK((toy.W - W).cwiseAbs().maxCoeff() <= 1e-14);
    CHECK((toy.b - b).cwiseAbs().maxCoeff() <= 1e-14);
  }
}

TEST_CASE("AdamW: the first step moves every entry by about lr against its gradient's sign") {
  Toy toy;
  AdamWConfig cfg = constant_lr(0.01);
  cfg.weight_decay = 0;
  AdamW<double> opt(toy.params(), toy.grads(), cfg);
  toy.gb << 0.3, -0.02, 0.1;
  const Vector<double> before = toy.b;
  opt.step();
  CHECK(toy.b[0] == rel(before[0] - 0.01, 1e-6));
  CHECK(toy.b[1] == rel(before[1] + 0.01, 1e-6));
  CHECK(toy.b[2] == rel(before[2] - 0.01, 1e-6));
}

TEST_CASE("AdamW: decoupled weight decay on matrices only") {
  Toy toy;  // zero gradients: the only change is the decay
  AdamWConfig cfg = constant_lr(0.5);
  AdamW<double> opt(toy.params(), toy.grads(), cfg);
  CHECK(AdamW<double>::decays(toy.params()[0]));
  CHECK(!AdamW<double>::decays(toy.params()[1]));
  const Matrix<double> W = toy.W;
  const Vector<double> b = toy.b;
  opt.step();
  CHECK(toy.W == W * (1 - 0.5 * 0.1));
  CHECK(toy.b == b);
}

TEST_CASE("schedule: linear warm-up, cosine decay to min_lr, then flat") {
  CosineSchedule s{1.0, 0.1, 10, 110};
  CHECK(s.at(0) == rel(0.1));
  CHECK(s.at(4) == rel(0.5));
  CHECK(s.at(9) == rel(1.0));
  CHECK(s.at(10) == rel(1.0));
  CHECK(s.at(35) == rel(0.1 + 0.45 * (1 + std::sqrt(0.5))));  // a quarter of the decay
  CHECK(s.at(60) == rel(0.55));                               // half-way
  CHECK(s.at(109) == rel(0.1 + 0.45 * (1 + std::cos(3.14159265358979323846 * 99 / 100))));
  CHECK(s.at(110) == 0.1);
  CHECK(s.at(5000) == 0.1);
  for (Index i = 10; i < 110; ++i) CHECK(s.at(i + 1) <= s.at(i));
  // no warm-up: the first step already has the peak rate
  CHECK(CosineSchedule{2.0, 0.0, 0, 4}.at(0) == 2.0);
  // the default floor is 10% of the peak
  AdamWConfig c;
  c.lr = 3e-4;
  CHECK(c.schedule().min_lr == rel(3e-5));
  // the optimiser steps through it
  Toy toy;
  c.warmup_steps = 4;
  c.total_steps = 8;
  AdamW<double> opt(toy.params(), toy.grads(), c);
  for (Index i = 0; i < 10; ++i) CHECK(opt.step().lr == c.schedule().at(i));
}

TEST_CASE("clipping: global norm over all tensors, reported before clipping") {
  Toy toy;
  AdamWConfig cfg = constant_lr(0.1);
  cfg.clip_norm = 1.0;
  AdamW<double> opt(toy.params(), toy.grads(), cfg);
  toy.gW.setZero();
  toy.gW(0, 0) = 3.0;
  toy.gb << 0.0, 4.0, 0.0;  // global norm 5
  StepReport r = opt.step();
  CHECK(r.grad_norm == rel(5.0));
  CHECK(r.clip_scale == rel(0.2));
  auto state = opt.state();
  CHECK(state[0].name == "m.W");
  CHECK(state[0].data[0] == rel(0.1 * 3.0 * 0.2));   // m = (1 - beta1) * clipped g
  CHECK(state[1].data[1] == rel(0.1 * 4.0 * 0.2));
  CHECK(toy.gW(0, 0) == 3.0);                                     // the buffers are not modified
  // below the threshold: untouched
  toy.gW.setZero();
  toy.gb << 0.0, 0.5, 0.0;
  r = opt.step();
  CHECK(r.grad_norm == rel(0.5));
  CHECK(r.clip_scale == 1.0);
  // clip_norm 0 disables clipping
  Toy other;
  cfg.clip_norm = 0;
  AdamW<double> unclipped(other.params(), other.grads(), cfg);
  other.gb << 0.0, 40.0, 0.0;
  r = unclipped.step();
  CHECK(r.grad_norm == rel(40.0));
  CHECK(r.clip_scale == 1.0);
}

TEST_CASE("state views: names, and a restored optimiser continues bit for bit") {
  Toy a, b;
  AdamWConfig cfg = constant_lr(0.05);
  cfg.total_steps = 20;
  cfg.min_lr = 0.005;
  AdamW<double> opt_a(a.params(), a.grads(), cfg);
  Rng rng(3);
  for (int t = 0; t < 3; ++t) {
    rng.fill_normal(a.gW, 1.0);
    rng.fill_normal(a.gb, 1.0);
    opt_a.step();
  }
  auto sa = opt_a.state();
  std::vector<std::string> names;
  for (const auto& v : sa) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{"m.W", "m.b", "v.W", "v.b", "step"});
  CHECK(sa[0].shape == std::vector<Index>{2, 3});
  CHECK(sa.back().data[0] == 3.0);
  // a fresh optimiser on a copy of the parameters, restored from the views
  b.W = a.W;
  b.b = a.b;
  AdamW<double> opt_b(b.params(), b.grads(), cfg);
  restore(opt_b.state(), snapshot(sa));
  CHECK(opt_b.steps_done() == 3);
  for (int t = 0; t < 3; ++t) {
    rng.fill_normal(a.gW, 1.0);
    rng.fill_normal(a.gb, 1.0);
    b.gW = a.gW;
    b.gb = a.gb;
    const StepReport ra = opt_a.step(), rb = opt_b.step();
    CHECK(ra.lr == rb.lr);
    CHECK(ra.step == rb.step);
  }
  CHECK(a.W == b.W);
  CHECK(a.b == b.b);
  // a corrupt step count is refused
  opt_b.state().back().data[0] = 2.5;
  CHECK_THROWS_WITH_AS(opt_b.step(), doctest::Contains("step state holds 2.5"), coupledqk::invalid_argument);
  // ... and so is one past what converts to an Index (a fuzzed checkpoint held 7.2e25: undefined
  // behaviour in the conversion before the bound), or infinity.
  for (double bad : {7.23684e25, std::ldexp(1.0, 53) + 2, std::numeric_limits<double>::infinity()}) {
    opt_b.state().back().data[0] = bad;
    CHECK_THROWS_AS(opt_b.steps_done(), coupledqk::invalid_argument);
  }
  opt_b.state().back().data[0] = std::ldexp(1.0, 53);
  CHECK(opt_b.steps_done() == (Index(1) << 53));
}

TEST_CASE("a non-finite gradient norm skips the step and changes nothing") {
  Toy toy;
  AdamW<double> opt(toy.params(), toy.grads(), constant_lr(0.1));
  toy.gb << 1.0, std::numeric_limits<double>::infinity(), 0.0;
  const Matrix<double> W = toy.W;
  const StepReport r = opt.step();
  CHECK(r.skipped);
  CHECK(!std::isfinite(r.grad_norm));
  CHECK(r.step == 0);
  CHECK(opt.steps_done() == 0);
  CHECK(toy.W == W);
  for (const auto& v : opt.state())
    for (Index i = 0; i < v.size(); ++i) CHECK(v.data[i] == 0.0);
}

TEST_CASE("bad optimiser configurations and mismatched lists are rejected") {
  using doctest::Contains;
  Toy toy;
  auto make = [&](AdamWConfig c) { return AdamW<double>(toy.params(), toy.grads(), c); };
  AdamWConfig c = constant_lr(0.1);
  c.beta1 = 1.0;
  CHECK_THROWS_WITH_AS(make(c), Contains("beta1 must be in [0, 1); got 1"), coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.beta2 = -0.1;
  CHECK_THROWS_WITH_AS(make(c), Contains("beta2 must be in [0, 1)"), coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.eps = 0;
  CHECK_THROWS_WITH_AS(make(c), Contains("eps must be finite and > 0"), coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.warmup_steps = 2000;
  CHECK_THROWS_WITH_AS(make(c), Contains("warmup_steps must be in [0, total_steps = 1000]; got 2000"),
                       coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.min_lr = 0.2;
  CHECK_THROWS_WITH_AS(make(c), Contains("min_lr must be finite and in [0, max_lr = 0.1]; got 0.2"),
                       coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.total_steps = 0;
  CHECK_THROWS_WITH_AS(make(c), Contains("total_steps must be >= 1; got 0"), coupledqk::invalid_argument);
  c = constant_lr(0.1);
  c.clip_norm = -1;
  CHECK_THROWS_WITH_AS(make(c), Contains("clip_norm must be finite and >= 0"), coupledqk::invalid_argument);
  auto grads = toy.grads();
  std::swap(grads[0], grads[1]);
  CHECK_THROWS_WITH_AS(AdamW<double>(toy.params(), grads, constant_lr(0.1)),
                       Contains("tensor 0 is 'W' but its gradient is 'b'"), coupledqk::invalid_argument);
  grads.pop_back();
  CHECK_THROWS_WITH_AS(AdamW<double>(toy.params(), grads, constant_lr(0.1)),
                       Contains("2 parameter tensors but 1 gradient tensors"), coupledqk::invalid_argument);
}

TEST_CASE("global norm: the fixed pieces cover every entry once (against a plain long double sum)") {
  // Sizes around the piece length: one piece, exactly one, one entry more, several with a tail
  // that is not a multiple of the eight accumulators.
  Rng rng(11);
  std::vector<Vector<float>> data;
  for (Index n : {Index(1), Index(7), adamw_piece, adamw_piece + 1, 3 * adamw_piece + 13}) {
    data.emplace_back(n);
    rng.fill_normal(data.back(), 1.0);
  }
  std::vector<TensorView<float>> views;
  long double plain = 0;
  for (std::size_t k = 0; k < data.size(); ++k) {
    views.push_back({"t" + std::to_string(k), {data[k].size()}, data[k].data()});
    for (Index i = 0; i < data[k].size(); ++i) plain += static_cast<long double>(data[k][i]) * data[k][i];
  }
  const auto pieces = optimiser_pieces(views);
  CHECK(pieces.size() == 1 + 1 + 1 + 2 + 4);
  Index covered = 0;
  for (const auto& p : pieces) covered += p.size;
  CHECK(covered == 1 + 7 + adamw_piece + adamw_piece + 1 + 3 * adamw_piece + 13);
  const double norm = global_norm(views);
  CHECK(norm == doctest::Approx(std::sqrt(static_cast<double>(plain))).epsilon(1e-12));
  // one entry changed anywhere (here: the tail of the last piece) changes the norm
  data.back()[data.back().size() - 1] += 100.0f;
  CHECK(global_norm(views) > norm + 1.0);
}
