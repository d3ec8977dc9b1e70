// The trainer (examples/train/trainer.hpp, records/checkpoint.hpp): determinism, checkpoint round trip,
// stop + resume == uninterrupted, and every bad input, on a tiny generated corpus.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "helpers.hpp"

using namespace cqk_train_test;

namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TrainOptions leapfrog_options(const std::string& checkpoint = "") {
  TinyData& d = tiny_data();
  TrainOptions o = tiny_options(d.corpus, d.cache);
  o.attention = "leapfrog";
  o.steps = 2;
  o.dynamics_init_scale = 0.2;  // the dynamics act from the first step
  o.checkpoint = checkpoint;
  return o;
}

}  // namespace

TEST_CASE("the tiny corpus is prepared: 400-piece tokenizer, three non-empty streams") {
  const TrainData& d = tiny_data().data;
  CHECK(d.tokenizer.vocab_size() == 400);
  CHECK(d.streams.train.size() > 5000);
  CHECK(d.streams.valid.size() > 100);
  CHECK(d.streams.test.size() > 100);
  CHECK(!d.tokenizer_bytes.empty());
}

TEST_CASE("training lowers the loss, evaluates, and reports what it did") {
  TinyData& d = tiny_data();
  TrainOptions o = tiny_options(d.corpus, d.cache);
  o.budget_tokens = 48 * 4 * 32;
  const TrainResult r = run(o);
  REQUIRE(r.losses.size() == 48);
  CHECK(r.total_steps == 48);
  CHECK(r.steps_done == 48);
  CHECK(r.tokens == 48 * 4 * 32);
  CHECK(r.losses.front() > std::log(400.0) - 0.5);  // about uniform at init
  CHECK(r.final_train_loss < r.losses.front() - 1.0);
  CHECK(std::isfinite(r.valid_ppl));
  CHECK(r.valid_ppl < 400);
  CHECK(std::isfinite(r.test_ppl));
  CHECK(r.test_ppl < 400);
  // periodic evaluations at steps 8, 16, ..., 40, then the final one
  REQUIRE(r.curve.size() == 6);
  CHECK(r.curve.front().step == 8);
  CHECK(r.curve.back().step == 48);
  CHECK(r.curve.back().tokens == r.tokens);
  CHECK(r.dynamics_parameters == 0);
  CHECK(r.tokens_per_s > 0);
}

TEST_CASE("two runs with the same seed are bit-identical; another seed is not") {
  TempDir dir;
  TrainOptions o = leapfrog_options();
  o.metrics = dir / "a.jsonl";
  const TrainResult a = run(o);
  o.metrics = dir / "b.jsonl";
  const TrainResult b = run(o);
  REQUIRE(a.losses.size() == 24);
  CHECK(a.losses == b.losses);
  CHECK(a.grad_norms == b.grad_norms);
  CHECK(a.valid_loss == b.valid_loss);
  CHECK(a.test_loss == b.test_loss);
  // the metrics files agree on every deterministic field
  const auto ma = read_jsonl(dir / "a.jsonl"), mb = read_jsonl(dir / "b.jsonl");
  REQUIRE(ma.size() == mb.size());
  int steps = 0;
  for (std::size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["type"] == mb[i]["type"]);
    if (ma[i]["type"] == "step") {
      ++steps;
      CHECK(ma[i]["loss"] == mb[i]["loss"]);
      CHECK(ma[i]["grad_norm"] == mb[i]["grad_norm"]);
      CHECK(ma[i]["lr"] == mb[i]["lr"]);
      CHECK(ma[i]["tokens"] == mb[i]["tokens"]);
      for (const char* key : {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed"})
        CHECK(ma[i].contains(key));
    }
    if (ma[i]["type"] == "eval") CHECK(ma[i].contains(ma[i]["split"].get<std::string>() + "_ppl"));
  }
  CHECK(steps == 24);
  CHECK(ma.back()["type"] == "summary");
  CHECK(ma.back()["valid_ppl"] == mb.back()["valid_ppl"]);

  TrainOptions other = leapfrog_options();
  other.seed = 2;
  CHECK(run(other).losses != a.losses);
}

TEST_CASE("checkpoint round trip: metadata, model, optimiser state and tokenizer") {
  TempDir dir;
  const std::string path = dir / "ckpt.safetensors";
  TrainOptions o = leapfrog_options(path);
  o.eval_every = 4;
  o.stop_after_steps = 10;
  const TrainResult r = run(o);
  REQUIRE(r.stopped_early);
  CHECK(std::isnan(r.valid_ppl));
  const Checkpoint c = read_checkpoint(path);
  const CheckpointInfo& i = c.info;
  CHECK(i.run.model.attention == "leapfrog");
  CHECK(i.run.model.steps == 2);
  CHECK(i.run.model.vocab == 400);
  CHECK(i.run.model.dim == 32);
  CHECK(i.run.model.context == 32);
  CHECK(i.run.model.dynamics_init_scale == 0.2);
  CHECK(i.run.batch == 4);
  CHECK(i.run.lr == 3e-3);
  CHECK(i.run.min_lr == doctest::Approx(3e-4));
  CHECK(i.run.total_steps == 24);
  CHECK(i.run.warmup == 1);
  CHECK(i.run.seed == 1);
  CHECK(i.run.tokenizer_hash == tiny_data().data.tokenizer.model_hash());
  CHECK(i.run.corpus == corpus_key(tiny_data().corpus));
  CHECK(i.state.step == 10);
  CHECK(i.state.tokens_seen == 10 * 4 * 32);
  CHECK(i.state.elapsed > 0);
  CHECK(i.state.curve.size() == 2);  // evaluations at steps 4 and 8
  CHECK(i.threads == 1);
  CHECK(i.budget_tokens == 24 * 4 * 32);

  // the JSON round trip is exact, the sampler's state included
  const CheckpointInfo again = checkpoint_info_from_json(to_json(i), "x");
  CHECK(to_json(again) == to_json(i));
  CHECK(again.state.sampler == i.state.sampler);

  // a model and an optimiser restored from the file hold exactly the file's tensors
  auto model = load_model(c);
  AdamWConfig oc;
  oc.total_steps = 24;
  AdamW<float> opt(model->parameters(), model->gradients(), oc);
  restore_optimizer(c, opt);
  CHECK(opt.steps_done() == 10);
  const std::string tmp = dir / "rewritten.safetensors";
  write_checkpoint(tmp, *model, opt, tokenizer_bytes(c), i);
  CHECK(checkpoint_tensors(tmp, "model.") == checkpoint_tensors(path, "model."));
  CHECK(checkpoint_tensors(tmp, "opt.") == checkpoint_tensors(path, "opt."));
  CHECK(checkpoint_tensors(tmp, "tokenizer.") == checkpoint_tensors(path, "tokenizer."));
  CHECK(checkpoint_tensors(path, "model.").size() == model->parameters().size());
  CHECK(checkpoint_tensors(path, "opt.").size() == 2 * model->parameters().size() + 1);
  // the embedded tokenizer is the one trained for the run
  CHECK(tokenizer_bytes(c) == tiny_data().data.tokenizer_bytes);
  const Tokenizer tok = load_tokenizer(c);
  CHECK(tok.model_hash() == tiny_data().data.tokenizer.model_hash());
  CHECK(tok.encode("Kalo mi rentas.") == tiny_data().data.tokenizer.encode("Kalo mi rentas."));
}

TEST_CASE("stopped, then resumed from the checkpoint == uninterrupted, bit for bit") {
  TempDir dir;
  // uninterrupted
  TrainOptions full = leapfrog_options(dir / "full.safetensors");
  full.eval_every = 5;
  full.metrics = dir / "full.jsonl";
  const TrainResult a = run(full);
  // interrupted after 13 steps (between evaluations and checkpoints), then resumed
  TrainOptions part = leapfrog_options(dir / "part.safetensors");
  part.eval_every = 5;
  part.metrics = dir / "part.jsonl";
  part.stop_after_steps = 13;
  const TrainResult b1 = run(part);
  REQUIRE(b1.stopped_early);
  REQUIRE(b1.losses.size() == 13);
  part.stop_after_steps = 0;
  part.resume = true;
  const TrainResult b2 = run(part);
  CHECK(b2.start_step == 13);
  REQUIRE(b2.losses.size() == 11);

  std::vector<float> joined = b1.losses;
  joined.insert(joined.end(), b2.losses.begin(), b2.losses.end());
  CHECK(joined == a.losses);
  CHECK(b2.last_loss == a.last_loss);
  CHECK(b2.valid_loss == a.valid_loss);
  CHECK(b2.test_loss == a.test_loss);
  REQUIRE(b2.curve.size() == a.curve.size());
  for (std::size_t i = 0; i < a.curve.size(); ++i) {
    CHECK(b2.curve[i].step == a.curve[i].step);
    CHECK(b2.curve[i].loss == a.curve[i].loss);
  }
  // the final parameters and optimiser state are identical
  CHECK(checkpoint_tensors(dir / "part.safetensors", "model.") == checkpoint_tensors(dir / "full.safetensors", "model."));
  CHECK(checkpoint_tensors(dir / "part.safetensors", "opt.") == checkpoint_tensors(dir / "full.safetensors", "opt."));
  // the resumed run appended to the metrics: 24 step lines in all
  int steps = 0;
  for (const auto& j : read_jsonl(dir / "part.jsonl")) steps += j["type"] == "step";
  CHECK(steps == 24);
  // and a finished run resumed again trains no more, with the same final numbers
  const TrainResult b3 = run(part);
  CHECK(b3.losses.empty());
  CHECK(b3.valid_loss == a.valid_loss);
  CHECK(checkpoint_tensors(dir / "part.safetensors", "model.") == checkpoint_tensors(dir / "full.safetensors", "model."));
}

TEST_CASE("rotary positions and a window: trained, recorded in the checkpoint, resumed bit for bit") {
  TempDir dir;
  auto rope_options = [&](const std::string& path) {
    TrainOptions o = leapfrog_options(path);
    o.positions = "rope";
    o.rope_base = 500;
    o.rope_order = "rotate-then-dynamics";
    o.window = 8;
    return o;
  };
  const TrainResult full = run(rope_options(dir / "full.safetensors"));
  CHECK(full.valid_loss < std::log(400.0));
  TrainOptions part = rope_options(dir / "part.safetensors");
  part.stop_after_steps = 9;
  run(part);
  const Checkpoint c = read_checkpoint(dir / "part.safetensors");
  const GptConfig& m = c.info.run.model;
  CHECK(m.positions == GptPositions::rope);
  CHECK(m.rope_base == 500);
  CHECK(m.rope_order == RopeOrder::rotate_then_dynamics);
  CHECK(m.window == 8);
  const auto meta = nlohmann::json::parse(*io::read(dir / "part.safetensors").find_meta("coupledqk"));
  CHECK(meta["version"] == 2);  // earlier readers refuse it by version instead of missing wpe
  CHECK(meta["model"]["positions"] == "rope");
  CHECK(checkpoint_tensors(dir / "part.safetensors", "model.wpe").empty());
  CHECK(load_model(c)->config().positions == GptPositions::rope);
  // the flags must match the checkpoint's positions and window
  TrainOptions wrong = part;
  wrong.stop_after_steps = 0;
  wrong.resume = true;
  wrong.positions = "learned";
  wrong.window = 0;
  const std::string msg = error_of<invalid_argument>([&] { run(wrong); });
  CHECK(contains(msg, "--positions: learned (flags) vs rope (checkpoint)"));
  CHECK(contains(msg, "--window: 0 (flags) vs 8 (checkpoint)"));
  part.stop_after_steps = 0;
  part.resume = true;
  const TrainResult resumed = run(part);
  CHECK(resumed.valid_loss == full.valid_loss);
  CHECK(checkpoint_tensors(dir / "part.safetensors", "model.") == checkpoint_tensors(dir / "full.safetensors", "model."));
  // a default model still writes version 1, which earlier builds read
  TrainOptions plain = leapfrog_options(dir / "plain.safetensors");
  plain.stop_after_steps = 2;
  run(plain);
  const auto plain_meta = nlohmann::json::parse(*io::read(dir / "plain.safetensors").find_meta("coupledqk"));
  CHECK(plain_meta["version"] == 1);
  CHECK(plain_meta["model"]["positions"] == "learned");
  // and a version-1 file without the new fields reads as learned positions, no window
  nlohmann::json old = plain_meta;
  for (const char* k : {"positions", "rope_base", "rope_order", "window"}) old["model"].erase(k);
  const CheckpointInfo info = checkpoint_info_from_json(old.dump(), "old");
  CHECK(info.run.model.positions == GptPositions::learned);
  CHECK(info.run.model.window == 0);
  // a hostile positions name is refused, quoted
  old["model"]["positions"] = "rope\n; rm -rf";
  CHECK(contains(error_of<io_error>([&] { checkpoint_info_from_json(old.dump(), "old"); }),
                 "field 'model.positions' is \"rope\\x0a; rm -rf\"; expected learned, rope or none"));
}

TEST_CASE("periodic checkpoints are complete checkpoints") {
  TempDir dir;
  TrainOptions o = leapfrog_options(dir / "c.safetensors");
  o.checkpoint_every = 7;
  o.stop_after_steps = 9;  // after the checkpoint of step 7
  run(o);
  CHECK(read_checkpoint(dir / "c.safetensors").info.state.step == 9);
}

// ---- bad input -------------------------------------------------------------------------------------

TEST_CASE("bad corpora: missing, empty, binary") {
  TempDir dir;
  TrainOptions o = tiny_options(dir / "missing", dir / "cache");
  std::string msg = error_of<io_error>([&] { prepare_data(o); });
  CHECK(contains(msg, "missing"));
  write_file(dir.path / "empty.txt", "");
  o.corpus = dir / "empty.txt";
  CHECK(contains(error_of<io_error>([&] { prepare_data(o); }), "is empty"));
  std::string binary(4096, '\0');
  for (std::size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>((i * 7919) % 256);
  write_file(dir.path / "random.bin", binary);
  o.corpus = dir / "random.bin";
  msg = error_of<io_error>([&] { prepare_data(o); });
  CHECK(contains(msg, "random.bin"));
  CHECK(contains(msg, "binary"));
  CHECK(read_file(dir.path / "random.bin") == binary);  // data files are never modified
}

TEST_CASE("bad options: unknown variant, impossible sizes, budgets, flag combinations") {
  TinyData& d = tiny_data();
  auto bad = [&](auto change) {
    TrainOptions o = tiny_options(d.corpus, d.cache);
    change(o);
    return error_of<invalid_argument>([&] { run(o); });
  };
  std::string msg = bad([](TrainOptions& o) { o.attention = "leapfrogg"; });
  CHECK(contains(msg, "unknown attention variant 'leapfrogg'"));
  CHECK(contains(msg, "standard, leapfrog"));
  CHECK(contains(bad([](TrainOptions& o) { o.steps = 9; }), "steps must be in 1..7"));
  msg = bad([](TrainOptions& o) { o.dim = 30; });
  CHECK(contains(msg, "--dim (D) must be divisible by --heads (H)"));
  CHECK(contains(msg, "D = 30, H = 4"));
  CHECK(contains(bad([](TrainOptions& o) { o.attention = "diff"; o.heads = 2; o.dim = 30; o.layers = 0; }),
                 "--layers (L) must be positive"));
  CHECK(contains(bad([](TrainOptions& o) { o.seq = 0; }), "--seq (T) must be positive"));
  msg = bad([](TrainOptions& o) { o.seq = 200000; o.budget_tokens = 200000; });
  CHECK(contains(msg, "--seq 200000 needs at least 200001"));
  CHECK(contains(bad([](TrainOptions& o) { o.budget_seconds = 5; }), "exactly one budget"));
  CHECK(contains(bad([](TrainOptions& o) { o.vocab = 100; }), "--vocab 100 is outside [384"));
  CHECK(contains(bad([](TrainOptions& o) { o.lr = -1; }), "--lr must be finite and > 0"));
  CHECK(contains(bad([](TrainOptions& o) { o.min_lr = 1; }), "--min-lr must be in [0, --lr"));
  CHECK(contains(bad([](TrainOptions& o) { o.warmup = 1000; }), "--warmup 1000 exceeds the run's 24 steps"));
  CHECK(contains(bad([](TrainOptions& o) { o.resume = true; }), "--resume needs --checkpoint"));
  msg = bad([](TrainOptions& o) { o.dim = 30; o.batch = 0; });
  CHECK(contains(msg, "invalid options"));  // several problems: all listed
  CHECK(contains(msg, "--batch (B) must be positive"));
  CHECK(contains(msg, "divisible"));
  CHECK(contains(bad([](TrainOptions& o) { o.positions = "rotary"; }), "--positions 'rotary' is not one of: learned, rope, none"));
  CHECK(contains(bad([](TrainOptions& o) { o.rope_order = "after"; }),
                 "--rope-order 'after' is not one of: dynamics-then-rotate, rotate-then-dynamics"));
  CHECK(contains(bad([](TrainOptions& o) { o.rope_base = 0.5; }), "--rope-base must be finite and > 1; got 0.5"));
  CHECK(contains(bad([](TrainOptions& o) { o.window = -2; }), "--window must be >= 0 (0: no window); got -2"));
  CHECK(contains(bad([](TrainOptions& o) { o.positions = "rope"; o.dim = 36; o.heads = 12; }),
                 "--positions rope needs an even head width --dim / --heads; got 36 / 12 = 3"));
  // the vocabulary must match the prepared data
  CHECK(contains(bad([](TrainOptions& o) { o.vocab = 512; }), "the tokenizer has 400 pieces but --vocab is 512"));
}

TEST_CASE("bad checkpoints are refused and never modified") {
  TempDir dir;
  const std::string good = dir / "good.safetensors";
  TrainOptions o = leapfrog_options(good);
  o.stop_after_steps = 6;
  run(o);
  const std::string good_bytes = read_file(good);
  REQUIRE(good_bytes.size() > 1000);

  auto resume_error = [&](const std::string& path, auto change) {
    TrainOptions r = leapfrog_options(path);
    r.resume = true;
    change(r);
    const std::string before = read_file(path);
    std::string msg;
    try {
      run(r);
      FAIL("nothing was thrown");
    } catch (const std::exception& e) {
      msg = e.what();
    }
    CHECK(read_file(path) == before);  // untouched, byte for byte
    return msg;
  };
  auto same = [](TrainOptions&) {};

  SUBCASE("an existing checkpoint without --resume") {
    TrainOptions r = leapfrog_options(good);
    const std::string msg = error_of<invalid_argument>([&] { run(r); });
    CHECK(contains(msg, "exists; pass --resume"));
    CHECK(contains(msg, "or choose another path"));
    CHECK(read_file(good) == good_bytes);
  }
  SUBCASE("--resume without a checkpoint file") {
    const std::string msg = error_of<io_error>([&] {
      TrainOptions r = leapfrog_options(dir / "none.safetensors");
      r.resume = true;
      run(r);
    });
    CHECK(contains(msg, "no checkpoint at"));
    CHECK(!fs::exists(dir.path / "none.safetensors"));
  }
  SUBCASE("flags that do not match the checkpoint: every difference listed") {
    const std::string msg = resume_error(good, [](TrainOptions& r) {
      r.lr = 1e-3;
      r.dim = 64;
      r.attention = "euler";
      r.seed = 5;
    });
    CHECK(contains(msg, "does not match the flags (5 differences)"));
    CHECK(contains(msg, "--lr: 0.001 (flags) vs 0.003 (checkpoint)"));
    CHECK(contains(msg, "--dim: 64 (flags) vs 32 (checkpoint)"));
    CHECK(contains(msg, "--attention: euler (flags) vs leapfrog (checkpoint)"));
    CHECK(contains(msg, "--seed: 5 (flags) vs 1 (checkpoint)"));
    CHECK(contains(msg, "--min-lr: 0.0001 (flags) vs 0.0003 (checkpoint)"));  // its default follows --lr
    CHECK(contains(resume_error(good, [](TrainOptions& r) { r.budget_tokens *= 2; }),
                   "total steps (from --tokens / --batch / --seq): 48 (flags) vs 24 (checkpoint)"));
  }
  SUBCASE("a truncated checkpoint") {
    const std::string path = dir / "truncated.safetensors";
    write_file(path, good_bytes.substr(0, good_bytes.size() / 2));
    const std::string msg = resume_error(path, same);
    CHECK(contains(msg, "truncated.safetensors"));
    CHECK(contains(msg, "not a readable checkpoint"));
  }
  SUBCASE("a corrupted header") {
    std::string bytes = good_bytes;
    const auto at = bytes.find("\"dtype\"");
    REQUIRE(at != std::string::npos);
    bytes[at + 1] = '\x01';
    const std::string path = dir / "corrupt.safetensors";
    write_file(path, bytes);
    CHECK(contains(resume_error(path, same), "not a readable checkpoint"));
  }
  SUBCASE("corrupted metadata (still valid safetensors)") {
    io::file f = io::read(good);
    f.metadata["coupledqk"] = f.metadata["coupledqk"].substr(0, 40);
    const std::string path = dir / "meta.safetensors";
    io::write(path, f);
    CHECK(contains(resume_error(path, same), "the 'coupledqk' metadata is not valid JSON"));
    nlohmann::json j = nlohmann::json::parse(io::read(good).meta("coupledqk"));
    j["model"].erase("dim");
    f.metadata["coupledqk"] = j.dump();
    io::write(path, f);
    CHECK(contains(resume_error(path, same), "no field 'model.dim'"));
    j = nlohmann::json::parse(io::read(good).meta("coupledqk"));
    j["format"] = "something-else";
    f.metadata["coupledqk"] = j.dump();
    io::write(path, f);
    CHECK(contains(resume_error(path, same), "format 'something-else'; expected 'coupledqk-train-checkpoint'"));
  }
  SUBCASE("a tensor missing or misshapen") {
    io::file f = io::read(good);
    f.tensors.erase(f.tensors.begin() + 3);
    const std::string path = dir / "missing.safetensors";
    io::write(path, f);
    CHECK(contains(resume_error(path, same), "missing tensor"));
  }
  SUBCASE("a random file") {
    const std::string path = dir / "random.safetensors";
    std::string bytes(2000, 'x');
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
    write_file(path, bytes);
    CHECK(contains(resume_error(path, same), "not a readable checkpoint"));
  }
  SUBCASE("a foreign safetensors file (no coupledqk metadata)") {
    io::file f;
    const std::vector<float> w{1, 2, 3, 4};
    f.add(io::tensor::from<float>("weight", {2, 2}, w.data()));
    const std::string path = dir / "foreign.safetensors";
    io::write(path, f);
    const std::string msg = resume_error(path, same);
    CHECK(contains(msg, "not a coupledqk training checkpoint"));
    CHECK(contains(msg, "weight"));
  }
  CHECK(read_file(good) == good_bytes);
}

TEST_CASE("a --seconds budget: the step count comes from measured speed and is kept on resume") {
  TempDir dir;
  TinyData& d = tiny_data();
  TrainOptions o = tiny_options(d.corpus, d.cache);
  o.budget_tokens = 0;
  o.budget_seconds = 0.3;
  o.checkpoint = dir / "s.safetensors";
  o.stop_after_steps = 2;
  const TrainResult a = run(o);
  CHECK(a.total_steps > 2);
  CHECK(a.stopped_early);
  const Checkpoint c = read_checkpoint(o.checkpoint);
  CHECK(c.info.budget_seconds == 0.3);
  CHECK(c.info.budget_tokens == 0);
  CHECK(c.info.run.total_steps == a.total_steps);
  o.stop_after_steps = 0;
  o.resume = true;
  o.budget_seconds = 99;  // the checkpoint's step count stands
  const TrainResult b = run(o);
  CHECK(b.total_steps == a.total_steps);
  CHECK(b.steps_done == a.total_steps);
}

TEST_CASE("same seed, different variants: the shared weights start equal (compare's pairing)") {
  GptConfig c;
  c.vocab = 50;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.context = 16;
  auto standard = make_gpt<float>(c, 7);
  c.attention = "leapfrog";
  c.steps = 3;
  c.dynamics_init_scale = 0.1;
  auto leapfrog = make_gpt<float>(c, 7);
  std::map<std::string, std::vector<float>> shared;
  for (const auto& v : standard->parameters()) shared[v.name].assign(v.data, v.data + v.size());
  int same = 0, dynamics = 0;
  for (const auto& v : leapfrog->parameters()) {
    const auto it = shared.find(v.name);
    if (it == shared.end()) {
      ++dynamics;
      CHECK(contains(v.name, ".dyn."));
      continue;
    }
    CHECK(std::vector<float>(v.data, v.data + v.size()) == it->second);
    ++same;
  }
  CHECK(same == static_cast<int>(shared.size()));
  CHECK(dynamics > 0);
}

TEST_CASE("progress: a redrawn bar on a terminal, plain lines otherwise") {
  auto capture = [](ProgressMode mode) {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
      Progress p(mode, "leapfrog seed 1", f);
      for (Index s = 1; s <= 3; ++s) p.step(StepMetrics{s, 3, s * 100, 5.0, 1e-3, 0.5, 1000, 0.1 * s});
      p.eval(EvalMetrics{3, 300, "valid", 64, 4.0, std::exp(4.0), 0.4});
    }
    std::rewind(f);
    std::string out;
    char buffer[512];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) out.append(buffer, n);
    std::fclose(f);
    return out;
  };
  const std::string bar = capture(ProgressMode::bar);
  CHECK(contains(bar, "\rleapfrog seed 1: ["));
  CHECK(contains(bar, "step 3/3"));
  CHECK(contains(bar, "loss 5.0000"));
  CHECK(contains(bar, "tok/s"));
  CHECK(contains(bar, "ETA"));
  CHECK(contains(bar, "lr 1.00e-03"));
  CHECK(contains(bar, "valid perplexity 54.598"));
  const std::string lines = capture(ProgressMode::lines);
  CHECK(!contains(lines, "\r"));
  CHECK(contains(lines, "leapfrog seed 1: step 1/3"));
  CHECK(contains(lines, "leapfrog seed 1: step 3/3"));  // the last step is always shown
  CHECK(!contains(lines, "step 2/3"));                   // then at most one line per 10 s
  CHECK(capture(ProgressMode::off).empty());  // neither steps nor evaluations (messages only)
  CHECK(format_duration(75) == "1m15s");
  CHECK(format_duration(3725) == "1h02m");
  CHECK(format_duration(4.25) == "4.2s");
  CHECK(format_count(12345) == "12.3k");
  CHECK(format_count(2500000) == "2.50M");
}
