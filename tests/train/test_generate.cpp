// Generation (examples/train/generation/generate.hpp): the incremental decoder with a KV cache per layer gives
// the logits of the full forward, for every kind of variant; sampling; generating from a checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <coupledqk/autodiff/tape.hpp>
#include <coupledqk/registry.hpp>

#include "generation/generate.hpp"
#include "helpers.hpp"

using namespace cqk_train_test;

namespace {

GptConfig small_config(const std::string& attention, int steps) {
  GptConfig c;
  c.vocab = 53;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.context = 24;
  c.attention = attention;
  c.steps = steps;
  c.dynamics_init_scale = 0.5;  // dynamics far from the identity
  c.init_std = 0.1;             // larger weights: the attention is far from uniform
  return c;
}

/// max |a - b| / max(1, max |b|)
double relative_error(const Matrix<float>& a, const Matrix<float>& b) {
  return (a - b).cwiseAbs().maxCoeff() / std::max(1.0f, b.cwiseAbs().maxCoeff());
}

}  // namespace

TEST_CASE("incremental logits (KV cache of evolved keys) == full-forward logits, every kind of variant") {
  // every name of the table (a new family is covered without editing this list), at 1 and 3
  // sub-steps where it takes steps
  std::vector<std::pair<std::string, int>> variants;
  for (const std::string& name : builtin_variants.names()) {
    variants.emplace_back(name, 1);
    if (builtin_variants.info(name).has_steps) variants.emplace_back(name, 3);
  }
  REQUIRE(variants.size() >= 9);
  Rng rng(3);
  std::vector<std::int32_t> ids(24);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng.next_u64() % 53);
  for (const auto& [name, steps] : variants) {
    CAPTURE(name);
    CAPTURE(steps);
    auto model = make_gpt<float>(small_config(name, steps), 11);
    Tape<float> tape;
    const Matrix<float> full = model->logits(tape, ids, 1);  // [24, 53]
    const Matrix<float> inc = incremental_logits(*model, ids);
    REQUIRE(inc.rows() == full.rows());
    REQUIRE(inc.cols() == full.cols());
    const double err = relative_error(inc, full);
    CHECK(err < 2e-5);
    // the logits vary with the position (the test is not comparing constants)
    CHECK((full.row(23) - full.row(0)).cwiseAbs().maxCoeff() > 1e-2f);
    // and a prefix gives the first rows
    const std::vector<std::int32_t> prefix(ids.begin(), ids.begin() + 7);
    CHECK(relative_error(incremental_logits(*model, prefix), full.topRows(7)) < 2e-5);
  }
}

TEST_CASE("the decoder refuses a full context and ids outside the vocabulary; reset() starts over") {
  auto model = make_gpt<float>(small_config("leapfrog", 1), 2);
  auto dec = make_decoder(*model);
  CHECK(dec->capacity() == 24);
  CHECK(contains(error_of<invalid_argument>([&] { dec->next(53); }), "outside the vocabulary"));
  Vector<float> first = dec->next(5);
  for (int i = 1; i < 24; ++i) dec->next(7);
  CHECK(dec->position() == 24);
  CHECK(contains(error_of<invalid_argument>([&] { dec->next(1); }), "context of 24 tokens is full"));
  dec->reset();
  CHECK(dec->position() == 0);
  CHECK(dec->next(5) == first);
}

TEST_CASE("sampling: greedy, top-k, temperature, seeded") {
  Vector<float> logits(6);
  logits << 0.5f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f;
  Rng rng(1);
  CHECK(sample_token(logits, 0.0, 0, rng) == 1);  // argmax, first of the ties
  for (int i = 0; i < 50; ++i) CHECK(sample_token(logits, 1.0, 1, rng) == 1);
  // top-3: only ids 1, 5, 3 ever; frequencies close to the softmax over them
  std::vector<int> count(6, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[static_cast<std::size_t>(sample_token(logits, 1.0, 3, rng))];
  CHECK(count[0] + count[2] + count[4] == 0);
  const double z = 2 * std::exp(2.0) + std::exp(1.9);
  CHECK(count[1] / double(n) == doctest::Approx(std::exp(2.0) / z).epsilon(0.05));
  CHECK(count[3] / double(n) == doctest::Approx(std::exp(1.9) / z).epsilon(0.05));
  // a low temperature is nearly greedy; the same seed gives the same draws
  Rng a(9), b(9);
  std::vector<std::int32_t> da, db;
  for (int i = 0; i < 100; ++i) {
    da.push_back(sample_token(logits, 0.7, 0, a));
    db.push_back(sample_token(logits, 0.7, 0, b));
  }
  CHECK(da == db);
  int ones = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::int32_t id = sample_token(logits, 0.01, 0, rng);  // ids 1 and 5 tie for the maximum
    ones += id == 1 || id == 5;
  }
  CHECK(ones == 1000);
}

TEST_CASE("generate from a checkpoint: self-contained, seeded, continues past the context") {
  TempDir dir;
  TinyData& d = tiny_data();
  TrainOptions o = tiny_options(d.corpus, d.cache);
  o.attention = "leapfrog";
  o.checkpoint = dir / "model.safetensors";
  o.budget_tokens = 60 * 4 * 32;
  run(o);

  GenerateOptions g;
  g.checkpoint = o.checkpoint;
  g.prompt = "Kalo mi";
  g.tokens = 80;  // more than the context of 32: the cache is rebuilt on the way
  g.seed = 4;
  g.threads = 1;
  g.stop_at_eos = false;
  const Generation a = generate(g);
  CHECK(a.ids.size() == 80);
  CHECK(a.text.rfind("Kalo mi", 0) == 0);
  CHECK(a.text == g.prompt + a.continuation);
  // the continuation keeps its word-initial space (decoded together with the prompt)
  const std::vector<std::int32_t> mi = d.data.tokenizer.encode("Kalo mi");
  std::vector<std::int32_t> joined(mi);
  joined.insert(joined.end(), a.ids.begin(), a.ids.end());
  CHECK(a.text == d.data.tokenizer.decode(joined));
  CHECK(a.prompt_ids.front() == d.data.tokenizer.eos_id());
  CHECK(a.continuation.size() > 40);
  const Generation b = generate(g);
  CHECK(a.ids == b.ids);
  g.seed = 5;
  CHECK(generate(g).ids != a.ids);
  // greedy decoding of the trained model reproduces the argmax of the full forward
  g.temperature = 0;
  g.tokens = 10;
  const Generation greedy = generate(g);
  const Checkpoint ckpt = read_checkpoint(o.checkpoint);
  auto model = load_model(ckpt);
  std::vector<std::int32_t> seq = greedy.prompt_ids;
  Tape<float> tape;
  for (std::int32_t id : greedy.ids) {
    const Matrix<float> logits = model->logits(tape, seq, 1);
    Index best = 0;
    logits.row(logits.rows() - 1).maxCoeff(&best);
    CHECK(best == id);
    seq.push_back(id);
  }
  // the checkpoint must be a coupledqk checkpoint
  g.checkpoint = dir / "missing.safetensors";
  CHECK(contains(error_of<io_error>([&] { generate(g); }), "missing.safetensors"));
}
