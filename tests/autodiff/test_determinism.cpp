// Determinism: identical training runs give bit-identical losses, parameters and optimiser state;
// a reused tape gives the same bits as a fresh one; a run checkpointed (parameters + optimiser
// state) and resumed in a new model continues bit for bit.
//
// CTest runs it twice: OMP_NUM_THREADS=1, and (where CMake finds OpenMP) OMP_NUM_THREADS=2, so that
// Eigen's GEMMs, the attention layer's loops and the row kernels run on two threads.
#include <doctest/doctest.h>

#include <coupledqk/core/gemm_backend.hpp>
#include <coupledqk/core/parallel.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

using Model = Gpt<float, Leapfrog<2>, Softmax>;

GptConfig config() {
  GptConfig c;
  c.vocab = 64;
  c.dim = 64;
  c.layers = 2;
  c.heads = 4;
  c.context = 32;
  c.dynamics_init_scale = 0.3;
  return c;
}

AdamWConfig optimiser() {
  AdamWConfig o;
  o.lr = 3e-3;
  o.warmup_steps = 2;
  o.total_steps = 8;
  return o;
}

constexpr Index kBatch = 8;

/// The batch of step s: a fixed function of s.
void batch(Index s, std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) {
  Rng rng(1000 + static_cast<std::uint64_t>(s));
  tokens = random_ids(kBatch * 32, 64, rng);
  targets = random_ids(kBatch * 32, 64, rng);
}

struct Run {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<std::vector<float>> params, state;
};

/// Steps [from, to) of training. fresh_tape: a new Tape every step instead of one reused.
void train(Model& model, AdamW<float>& opt, Index from, Index to, bool fresh_tape, Run& out) {
  Tape<float> reused;
  std::vector<std::int32_t> tokens, targets;
  for (Index s = from; s < to; ++s) {
    batch(s, tokens, targets);
    model.zero_grad();
    Tape<float> fresh;
    out.losses.push_back(model.loss(fresh_tape ? fresh : reused, tokens, targets, kBatch));
    out.norms.push_back(opt.step().grad_norm);
  }
  out.params = snapshot(model.parameters());
  out.state = snapshot(opt.state());
}

Run full_run(bool fresh_tape) {
  Model model(config(), 42);
  AdamW<float> opt(model.parameters(), model.gradients(), optimiser());
  Run r;
  train(model, opt, 0, 8, fresh_tape, r);
  return r;
}

void check_identical(const Run& a, const Run& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step ", i);
    CHECK(a.losses[i] == b.losses[i]);
    CHECK(a.norms[i] == b.norms[i]);
  }
  CHECK(a.params == b.params);
  CHECK(a.state == b.state);
}

}  // namespace

/// Eigen's thread count follows OpenMP's (OMP_NUM_THREADS); set it explicitly anyway.
static void use_all_threads() {
#if defined(_OPENMP)
  Eigen::setNbThreads(max_threads());
#endif
  CHECK(Eigen::nbThreads() == max_threads());
}

TEST_CASE("two identical training runs are bit-identical") {
  use_all_threads();
  MESSAGE("threads: ", max_threads(), " (Eigen: ", Eigen::nbThreads(), "); gemm backend: ", gemm_backend_description());
  const Run a = full_run(false), b = full_run(false);
  check_identical(a, b);
  // training did something (the check above is not comparing two untouched models)
  Model untouched(config(), 42);
  CHECK(a.params != snapshot(untouched.parameters()));
  CHECK(a.state.back()[0] == 8.0f);
}

TEST_CASE("the row kernels give the same bits on one thread and on all threads") {
  Rng rng(5);
  const Index N = 300, D = 200;  // above the kernels' threshold for going parallel
  Matrix<float> x(N, D), dy(N, D), g(1, D), b(1, D);
  for (Matrix<float>* m : {&x, &dy, &g, &b}) rng.fill_normal(*m, 1.0);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.next_u64() % D);
  struct Out {
    Matrix<float> y, stats, dx, gelu, dgelu, probs;
    std::vector<float> dg, db;
    float loss = 0;
  };
  auto run = [&] {
    Out o;
    o.y.resize(N, D);
    o.dg.assign(D, 0.0f);
    o.db.assign(D, 0.0f);
    kernels::layer_norm_forward<float>(x, g, b, o.y, &o.stats);
    kernels::layer_norm_backward<float>(x, g, o.stats, dy, o.dx, o.dg.data(), o.db.data());
    o.gelu.resize(N, D);
    kernels::gelu_forward<float>(x, o.gelu);
    kernels::gelu_backward<float>(x, dy, o.dgelu);
    o.loss = kernels::cross_entropy_forward<float>(x, targets.data(), o.probs);
    kernels::cross_entropy_backward<float>(o.probs, targets.data(), 1.0f);
    return o;
  };
  const int all = max_threads();
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
  const Out one = run();
#if defined(_OPENMP)
  omp_set_num_threads(all);
#endif
  const Out many = run();
  MESSAGE("row kernels: 1 thread against ", all);
  CHECK(one.y == many.y);
  CHECK(one.stats == many.stats);
  CHECK(one.dx == many.dx);
  CHECK(one.dg == many.dg);
  CHECK(one.db == many.db);
  CHECK(one.gelu == many.gelu);
  CHECK(one.dgelu == many.dgelu);
  CHECK(one.loss == many.loss);
  CHECK(one.probs == many.probs);
}

TEST_CASE("AdamW and the global gradient norm give the same bits on one thread and on all threads") {
  // Several pieces per tensor (optimiser_pieces), a decayed matrix and a vector, and a norm above
  // the clipping threshold so that the norm's bits reach the parameters through the clip factor.
  Rng rng(9);
  const Index rows = 3 * adamw_piece / 256 + 1, cols = 256, n = 2 * adamw_piece + 77;
  struct State {
    Matrix<float> W;
    Vector<float> b;
  };
  Matrix<float> gW(rows, cols);
  Vector<float> gb(n);
  rng.fill_normal(gW, 1.0);
  rng.fill_normal(gb, 1.0);
  State init{Matrix<float>(rows, cols), Vector<float>(n)};
  rng.fill_normal(init.W, 0.1);
  rng.fill_normal(init.b, 0.1);
  struct Out {
    Matrix<float> W;
    Vector<float> b;
    std::vector<std::vector<float>> state;
    double norm = 0;
  };
  auto run = [&] {
    Out o{init.W, init.b, {}, 0};
    std::vector<TensorView<float>> params{{"W", {rows, cols}, o.W.data()}, {"b", {n}, o.b.data()}};
    std::vector<TensorView<float>> grads{{"W", {rows, cols}, gW.data()}, {"b", {n}, gb.data()}};
    AdamW<float> opt(params, grads, optimiser());
    for (int step = 0; step < 3; ++step) o.norm = opt.step().grad_norm;
    for (const auto& t : opt.state()) o.state.emplace_back(t.data, t.data + t.size());
    return o;
  };
  const int all = max_threads();
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
  const Out one = run();
#if defined(_OPENMP)
  omp_set_num_threads(all);
#endif
  const Out many = run();
  MESSAGE("AdamW: 1 thread against ", all);
  CHECK(one.norm > 1.0);  // clipped
  CHECK(one.norm == many.norm);
  CHECK(one.W == many.W);
  CHECK(one.b == many.b);
  CHECK(one.state == many.state);
  CHECK(one.W != init.W);  // the optimiser did something
}

TEST_CASE("a reused tape gives the same bits as a fresh tape every step") {
  use_all_threads();
  check_identical(full_run(false), full_run(true));
}

TEST_CASE("checkpoint after 4 steps, resume in a new model and optimiser: bit-identical continuation") {
  use_all_threads();
  const Run reference = full_run(false);
  // first half, then save parameters and optimiser state
  Run first;
  std::vector<std::vector<float>> saved_params, saved_state;
  {
    Model model(config(), 42);
    AdamW<float> opt(model.parameters(), model.gradients(), optimiser());
    train(model, opt, 0, 4, false, first);
    saved_params = first.params;
    saved_state = first.state;
  }
  // a model with other initial values, restored from the checkpoint
  Model model(config(), 7);
  AdamW<float> opt(model.parameters(), model.gradients(), optimiser());
  restore(model.parameters(), saved_params);
  restore(opt.state(), saved_state);
  Run second;
  train(model, opt, 4, 8, false, second);
  Run joined = second;
  joined.losses.insert(joined.losses.begin(), first.losses.begin(), first.losses.end());
  joined.norms.insert(joined.norms.begin(), first.norms.begin(), first.norms.end());
  check_identical(reference, joined);
}
