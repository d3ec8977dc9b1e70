// The command-line tools end to end, through their binaries: coupledqk-train (train, refuse to
// overwrite, resume, bad flags, generate, --device/--precision) and coupledqk-compare, on a tiny
// generated corpus. The --device cuda case runs everywhere: without CUDA support or without a GPU
// it checks the refusal (message, nothing written); on a GPU machine it trains there and moves the
// checkpoints between the devices.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>

#include <coupledqk/io/safetensors.hpp>
#include <coupledqk/registry.hpp>

#include "helpers.hpp"

#ifndef COUPLEDQK_TRAIN_BIN
#error "COUPLEDQK_TRAIN_BIN must name the coupledqk-train binary"
#endif
#ifndef COUPLEDQK_COMPARE_BIN
#error "COUPLEDQK_COMPARE_BIN must name the coupledqk-compare binary"
#endif

using namespace cqk_train_test;

namespace {

struct Ran {
  int status = -1;  ///< exit status
  std::string out, err;
};

/// Runs `binary args` in the shell with stdout and stderr captured in files of `dir`.
Ran run_tool(const TempDir& dir, const std::string& binary, const std::string& args) {
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = "'" + binary + "' " + args + " > '" + out + "' 2> '" + err + "'";
  const int raw = std::system(cmd.c_str());
  Ran r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::string tiny_flags(const TinyData& d) {
  return "--corpus '" + d.corpus + "' --cache '" + d.cache +
         "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 2048 --lr 0.003 "
         "--eval-every 8 --eval-tokens 256 --threads 1 --progress lines";
}

/// `coupledqk-train generate` from `ckpt` (prompt 'Kalo', seed 3, one thread): it must succeed and
/// continue the prompt.
Ran generate_kalo(const TempDir& dir, const std::string& ckpt, int tokens) {
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + ckpt + "' --prompt 'Kalo' --tokens " +
                                                 std::to_string(tokens) + " --seed 3 --no-stop --threads 1");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("Kalo", 0) == 0);
  CHECK(r.out.size() > 8);
  return r;
}

}  // namespace

TEST_CASE("coupledqk-train: train, refuse to overwrite, resume, mismatch, generate") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string ckpt = dir / "run.safetensors";
  const std::string base = tiny_flags(d) + " --attention leapfrog --checkpoint '" + ckpt + "'";

  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, base + " --stop-after-steps 5 --metrics '" + (dir / "m.jsonl") + "'");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "stopped early"));
  CHECK(contains(r.err, "step 1/16"));  // plain progress lines (not a terminal)
  REQUIRE(fs::exists(ckpt));
  const std::string saved = read_file(ckpt);

  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, base);
  CHECK(r.status == 1);
  CHECK(contains(r.err, "coupledqk-train: error: checkpoint '" + ckpt + "' exists; pass --resume"));
  CHECK(read_file(ckpt) == saved);

  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, base + " --resume --lr 0.01");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--lr: 0.01 (flags) vs 0.003 (checkpoint)"));
  CHECK(read_file(ckpt) == saved);

  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, base + " --resume --metrics '" + (dir / "m.jsonl") + "'");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "resuming"));
  CHECK(contains(r.out, "valid perplexity"));
  CHECK(contains(r.out, "test perplexity"));
  CHECK(contains(read_file(dir / "m.jsonl"), "\"type\":\"summary\""));

  r = generate_kalo(dir, ckpt, 12);
  const std::string first = r.out;
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN,
               "generate --checkpoint '" + ckpt + "' --prompt 'Kalo' --tokens 12 --seed 3 --no-stop --threads 1");
  CHECK(r.out == first);

  // not a checkpoint
  write_file(dir.path / "notes.txt", "just some text, not a checkpoint at all\n");
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + (dir / "notes.txt") + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "coupledqk-train: error: checkpoint '"));
  CHECK(read_file(dir.path / "notes.txt") == "just some text, not a checkpoint at all\n");
}

TEST_CASE("coupledqk-train: every name of the variant table trains, stops, resumes bit for bit and generates") {
  // The table is the list (the velocity family of spec 3c included): a new entry is covered here
  // without editing this test. Dynamics far from their initial map (--dynamics-init-scale 0.2),
  // two sub-steps where the family takes steps.
  TinyData& d = tiny_data();
  for (const std::string& name : builtin_variants.names()) {
    CAPTURE(name);
    const VariantInfo info = builtin_variants.info(name);
    TempDir dir;
    const std::string full = dir / "full.safetensors", part = dir / "part.safetensors";
    const std::string flags = tiny_flags(d) + " --progress off --attention " + name +
                              (info.has_steps ? " --steps 2" : "") +
                              (info.has_dynamics ? " --dynamics-init-scale 0.2" : "");
    Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint '" + full + "'");
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "valid perplexity"));
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint '" + part + "' --stop-after-steps 7");
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "stopped early"));
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint '" + part + "' --resume");
    REQUIRE(r.status == 0);
    // the resumed run ends where the uninterrupted one did: every parameter and optimiser tensor
    const auto model = checkpoint_tensors(full, "model.");
    CHECK(model.size() > 10);
    CHECK(checkpoint_tensors(part, "model.") == model);
    CHECK(checkpoint_tensors(part, "opt.") == checkpoint_tensors(full, "opt."));
    if (info.has_dynamics) {  // the checkpoint holds the layer's dynamics under the spec's names
      bool rho = false;
      for (const auto& [tensor, bytes] : model) rho = rho || contains(tensor, ".dyn.rho");
      CHECK(rho);
    }
    generate_kalo(dir, part, 10);
  }
}

TEST_CASE("coupledqk-train: bad flags and bad input exit non-zero with a message") {
  TinyData& d = tiny_data();
  TempDir dir;
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --attention nope");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "coupledqk-train: error: unknown attention variant 'nope'"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --dim 30");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "divisible"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --seconds 3");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "exactly one budget"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "--corpus '" + (dir / "absent") + "' --cache '" + (dir / "c") + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "absent"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "--dim");  // CLI11's own parse error and exit code
  CHECK(r.status != 0);
  CHECK(contains(r.err, "--dim"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "--no-such-flag 3");
  CHECK(r.status != 0);
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "--help");
  CHECK(r.status == 0);
  CHECK(contains(r.out, "--checkpoint"));
  CHECK(contains(r.out, "generate"));
}

TEST_CASE("coupledqk-compare: table, Markdown report, curves and plot") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string out = dir / "results";
  Ran r = run_tool(dir, COUPLEDQK_COMPARE_BIN,
                   tiny_flags(d) + " --variants standard,leapfrog:2 --seeds 2 --out '" + out + "'");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.out, "variant"));
  CHECK(contains(r.out, "leapfrog:2"));
  CHECK(contains(r.out, "valid vs standard"));
  // the study's statistics: perplexities mean ± sd, paired changes with their 95% t interval
  CHECK(contains(r.out, "changes: mean [95% t interval] of the per-seed changes"));
  CHECK(contains(r.out, " ± "));
  CHECK(contains(r.out, "% ["));
  const std::string md = read_file(fs::path(out) / "compare.md");
  CHECK(contains(md, "| variant | parameters | dynamics | valid ppl | test ppl |"));
  CHECK(contains(md, "| standard |"));
  CHECK(contains(md, "| leapfrog:2 |"));
  CHECK(contains(md, "--variants standard,leapfrog:2"));  // the exact command
  CHECK(contains(md, "thread(s)"));
  const std::string curves = read_file(fs::path(out) / "curves.tsv");
  CHECK(contains(curves, "variant\tseed\tstep\ttokens\tvalid_loss\tvalid_ppl"));
  CHECK(contains(curves, "leapfrog:2\t2\t16\t2048\t"));
  CHECK(fs::exists(fs::path(out) / "metrics" / "leapfrog-2-seed2.jsonl"));
  if (std::system("command -v gnuplot > /dev/null 2>&1") == 0) CHECK(fs::file_size(fs::path(out) / "valid_ppl.png") > 1000);

  r = run_tool(dir, COUPLEDQK_COMPARE_BIN, tiny_flags(d) + " --variants standard,bogus --out '" + out + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "coupledqk-compare: error: unknown attention variant 'bogus'"));
  r = run_tool(dir, COUPLEDQK_COMPARE_BIN, tiny_flags(d) + " --variants leapfrog:9 --out '" + out + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "step count '9'"));
}

TEST_CASE("coupledqk-train: SIGINT stops after the current step with a checkpoint; --resume continues") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string ckpt = dir / "int.safetensors";
  // A budget far too large to finish before the signal arrives.
  const std::string args = tiny_flags(d) + " --tokens 100000000 --eval-every 0 --checkpoint '" + ckpt + "'";
  const std::string cmd = "'" + std::string(COUPLEDQK_TRAIN_BIN) + "' " + args + " > '" + (dir / "out.txt") +
                          "' 2> '" + (dir / "err.txt") + "' & pid=$!; sleep 2; kill -INT $pid; wait $pid; echo $? > '" +
                          (dir / "status.txt") + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  INFO(read_file(dir / "err.txt"));
  CHECK(read_file(dir / "status.txt") == "130\n");
  CHECK(contains(read_file(dir / "err.txt"), "interrupted after step"));
  CHECK(contains(read_file(dir / "out.txt"), "stopped early"));
  REQUIRE(fs::exists(ckpt));
  const Checkpoint c = read_checkpoint(ckpt);
  CHECK(c.info.state.step > 0);
  CHECK(c.info.state.step < c.info.run.total_steps);
}

TEST_CASE("coupledqk-train: --device and --precision; without CUDA (support or device) a clear error, nothing written") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string ckpt = dir / "dev.safetensors", metrics = dir / "dev.jsonl", cache = dir / "fresh-cache";

  // --precision is the GPU's: with the CPU, bf16 is refused (before anything is read or written)
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --precision bf16 --checkpoint '" + ckpt + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "coupledqk-train: error: --precision bf16 needs --device cuda"));
  CHECK(!fs::exists(ckpt));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --device tpu");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--device 'tpu' is not one of: cpu, cuda"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, tiny_flags(d) + " --device cuda --precision fp8");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--precision 'fp8' is not one of: f32, bf16"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "--help");
  CHECK(contains(r.out, "--device"));
  CHECK(contains(r.out, "--precision"));

  // --device cuda, with a cache folder that does not exist yet: it must still not exist after a refusal
  const std::string flags = "--corpus '" + d.corpus + "' --cache '" + cache +
                            "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 2048 --lr 0.003 "
                            "--eval-every 8 --eval-tokens 256 --threads 1 --progress lines --attention leapfrog "
                            "--checkpoint '" + ckpt + "' --metrics '" + metrics + "'";
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --device cuda --stop-after-steps 5");
  INFO(r.err);
  if (!cuda_support_compiled()) {
    CHECK(r.status == 1);
    CHECK(contains(r.err, "coupledqk-train: error: --device cuda: this build has no CUDA support (configure with "
                          "-DCOUPLEDQK_CUDA=ON where nvcc is installed)"));
  } else if (r.status != 0) {
    CHECK(r.status == 1);
    CHECK(contains(r.err, "coupledqk-train: error: --device cuda: no CUDA device is usable ("));
  }
  if (r.status != 0) {
    CHECK(!fs::exists(ckpt));
    CHECK(!fs::exists(metrics));
    CHECK(!fs::exists(cache));
    return;
  }

  // A usable GPU (a CUDA build on a GPU machine): the run trained there; its checkpoint resumes on
  // the CPU, and a CPU checkpoint resumes on the GPU in bf16.
  CHECK(contains(r.out, "device           cuda:"));
  REQUIRE(fs::exists(ckpt));
  CHECK(read_checkpoint(ckpt).info.device == "cuda");
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --device cpu --resume");
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "note: the checkpoint was written on cuda (f32), this session runs on cpu (f32)"));
  CHECK(contains(r.out, "valid perplexity"));
  CHECK(read_checkpoint(ckpt).info.device == "cpu");

  const std::string ckpt2 = dir / "cpu.safetensors";
  const std::string flags2 = tiny_flags(d) + " --attention euler --checkpoint '" + ckpt2 + "'";
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags2 + " --stop-after-steps 5");
  REQUIRE(r.status == 0);
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags2 + " --device cuda --precision bf16 --resume");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(contains(r.err, "this session runs on cuda (bf16)"));
  CHECK(contains(r.out, "test perplexity"));
  const Checkpoint c = read_checkpoint(ckpt2);
  CHECK(c.info.device == "cuda");
  CHECK(c.info.precision == "bf16");
  CHECK(c.info.state.step == c.info.run.total_steps);

  // Rotary positions (both orders), no positions and a window train on the device as on the CPU:
  // the same run on both, every validation point of the curve within float round-off (f32), the
  // device checkpoint records the settings, holds no wpe, and resumes on the CPU.
  struct Setting {
    const char* flags;
    const char* attention;
  };
  const Setting settings[] = {Setting{"--positions rope --window 9", "leapfrog"},
                              Setting{"--positions rope --rope-order rotate-then-dynamics", "diff-leapfrog"},
                              Setting{"--positions none --window 5", "standard"}};
  for (const Setting& s : settings) {
    CAPTURE(s.flags);
    CAPTURE(s.attention);
    const std::string on_dev = dir / "rope-dev.safetensors", on_cpu = dir / "rope-cpu.safetensors";
    fs::remove(on_dev);
    fs::remove(on_cpu);
    const std::string f = tiny_flags(d) + " --attention " + s.attention + " " + s.flags;
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, f + " --device cuda --checkpoint '" + on_dev + "'");
    INFO(r.err);
    REQUIRE(r.status == 0);
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, f + " --checkpoint '" + on_cpu + "'");
    INFO(r.err);
    REQUIRE(r.status == 0);
    const Checkpoint dev = read_checkpoint(on_dev), cpu = read_checkpoint(on_cpu);
    CHECK(dev.info.device == "cuda");
    CHECK(dev.info.run.model.positions == cpu.info.run.model.positions);
    CHECK(dev.info.run.model.rope_order == cpu.info.run.model.rope_order);
    CHECK(dev.info.run.model.window == cpu.info.run.model.window);
    CHECK(dev.info.run.model.positions != GptPositions::learned);
    CHECK(!dev.file.contains("model.wpe"));
    REQUIRE(dev.info.state.curve.size() == cpu.info.state.curve.size());
    REQUIRE(dev.info.state.curve.size() >= 2);
    for (std::size_t i = 0; i < dev.info.state.curve.size(); ++i) {
      CAPTURE(i);
      CHECK(dev.info.state.curve[i].step == cpu.info.state.curve[i].step);
      CHECK(std::abs(dev.info.state.curve[i].loss - cpu.info.state.curve[i].loss) <=
            2e-3 * std::abs(cpu.info.state.curve[i].loss));
    }
    // the device's checkpoint continues on the CPU (a run of 16 steps stopped at 5 on the device;
    // the first setting only: the emulator is slow)
    if (&s != &settings[0]) continue;
    fs::remove(on_dev);
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, f + " --device cuda --stop-after-steps 5 --checkpoint '" + on_dev + "'");
    REQUIRE(r.status == 0);
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, f + " --resume --checkpoint '" + on_dev + "'");
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "test perplexity"));
  }
}

// ---- issue 14: hostile files and bad flags --------------------------------------------------------

namespace {

/// `ckpt` with one change to its parsed content, written to `out`.
template <class Edit>
void edited_copy(const std::string& ckpt, const std::string& out, Edit edit) {
  coupledqk::io::file f = coupledqk::io::read(ckpt);
  edit(f);
  coupledqk::io::write(out, f);
}

/// A file holding the 8-byte length and `header` only.
void write_raw_safetensors(const std::string& path, const std::string& header) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xff);
  write_file(path, bytes + header);
}

}  // namespace

TEST_CASE("coupledqk-train: an explicit flag value that is not accepted is an error naming the flag, never the default") {
  TinyData& d = tiny_data();
  TempDir dir;
  // A fresh cache: the flags must be refused before any data is prepared there.
  const std::string flags = "--corpus '" + d.corpus + "' --cache '" + (dir / "cache") + "' --threads 1 --progress off";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--tokens 0", "--tokens must be a positive number of tokens; got 0"},
      {"--tokens -3", "--tokens"},
      {"--seconds 0", "--seconds must be a positive, finite number of seconds; got 0"},
      {"--warmup -5", "--warmup must be >= 0 steps; got -5"},
      {"--min-lr -0.5", "--min-lr must be finite and >= 0; got -0.5"},
      {"--threads 100000", "--threads must be in [0, 1024]"},
      {"--seq 1000000000", "--seq"},
      {"--dim 1000000000000 --heads 1", "--dim"},
      {"--batch 100000000000 --seq 100000", "--batch"},
  };
  for (const auto& [args, message] : cases) {
    const Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " " + args);
    INFO(args << ": " << r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, "coupledqk-train: error: "));
    CHECK(contains(r.err, message));
    CHECK_FALSE(contains(r.err, "bad_alloc"));
    CHECK_FALSE(fs::exists(dir.path / "cache"));
  }
  // Sizes beyond memory say how much is needed and what the machine has.
  const Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --seq 1000000000");
  CHECK(contains(r.err, "of memory; lower --batch, --seq, --vocab"));
}

TEST_CASE("coupledqk-train: hostile checkpoints are refused in the preflight, with the file named, nothing written") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string cache = dir / "cache";
  const std::string ckpt = dir / "run.safetensors";
  const std::string flags = "--corpus '" + d.corpus + "' --cache '" + d.cache +
                            "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 2048 "
                            "--eval-every 0 --threads 1 --progress off --attention leapfrog";
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint '" + ckpt + "' --stop-after-steps 1");
  INFO(r.err);
  REQUIRE(r.status == 0);
  // The same flags, but a fresh cache folder: a refusal in the preflight leaves it absent.
  const std::string resume_flags = "--corpus '" + d.corpus + "' --cache '" + cache +
                                   "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 2048 "
                                   "--eval-every 0 --threads 1 --progress off --attention leapfrog --resume";

  // 1. a header nesting arrays 100,000 deep (200 KB): every reader died with SIGSEGV (exit 139).
  const std::string deep = dir / "deep.safetensors";
  write_raw_safetensors(deep, "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}");
  const std::string deep_bytes = read_file(deep);
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + deep + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, deep));
  CHECK(contains(r.err, "more than 8 levels deep"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, resume_flags + " --checkpoint '" + deep + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "more than 8 levels deep"));
  CHECK(read_file(deep) == deep_bytes);
  // ... and inside the checkpoint's own JSON metadata.
  const std::string deep_meta = dir / "deep-meta.safetensors";
  edited_copy(ckpt, deep_meta, [](coupledqk::io::file& f) {
    f.metadata["coupledqk"] = "{\"format\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  });
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + deep_meta + "'");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "'coupledqk' metadata nests JSON arrays or objects more than 8 levels deep"));

  // 2. a NaN weight, a non-float tensor, a damaged optimiser state, a damaged tokenizer: refused
  // before the data is prepared (the fresh cache stays absent), the file unchanged.
  struct Case {
    const char* name;
    std::function<void(coupledqk::io::file&)> edit;
    const char* message;
    bool generate_refuses = true;  // generation reads no optimiser state
  };
  auto tensor = [](coupledqk::io::file& f, const std::string& name) -> coupledqk::io::tensor& {
    for (auto& t : f.tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    throw 0;
  };
  const std::vector<Case> cases{
      {"nan-weight",
       [&](coupledqk::io::file& f) {
         const float nan = std::nanf("");
         std::memcpy(tensor(f, "model.h.1.mlp.fc.w").bytes.data() + 4, &nan, 4);
       },
       "holds a non-finite value"},
      {"int-tensor", [&](coupledqk::io::file& f) { tensor(f, "model.h.0.ln1.g").type = coupledqk::io::dtype::I32; },
       "has dtype I32; expected a floating-point dtype"},
      {"opt-step", [&](coupledqk::io::file& f) { tensor(f, "opt.step").bytes.assign(4, 0); }, "opt.step", false},
      {"tokenizer",
       [&](coupledqk::io::file& f) {
         tensor(f, "tokenizer.model").bytes.assign(64, 7);
         tensor(f, "tokenizer.model").shape = {64};
       },
       "tokenizer.model is not a SentencePiece model"},
      {"huge-dim",
       [&](coupledqk::io::file& f) {
         std::string& meta = f.metadata["coupledqk"];
         meta.replace(meta.find("\"dim\":32"), 8, "\"dim\":1000000000000");
       },
       "model.wte has shape [400, 32] but the metadata's model"},
  };
  for (const Case& c : cases) {
    const std::string bad = dir / (std::string(c.name) + ".safetensors");
    edited_copy(ckpt, bad, c.edit);
    const std::string before = read_file(bad);
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, resume_flags + " --checkpoint '" + bad + "'");
    INFO(c.name << ": " << r.err);
    CHECK(r.status == 1);
    CHECK(contains(r.err, bad));
    CHECK(contains(r.err, c.message));
    CHECK_FALSE(fs::exists(cache));
    CHECK(read_file(bad) == before);
    r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + bad + "' --tokens 3");
    CHECK(r.status == (c.generate_refuses ? 1 : 0));
    if (c.generate_refuses) CHECK(contains(r.err, c.message));
  }
}

TEST_CASE("coupledqk-train: an unwritable checkpoint folder fails before training; stale temporaries are removed") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string cache = dir / "cache";
  const std::string flags = "--corpus '" + d.corpus + "' --cache '" + cache +
                            "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 2048 "
                            "--eval-every 0 --threads 1 --progress off";
  // /proc takes no new file, not even from root (a chmod'ed folder would not stop root).
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint /proc/coupledqk-test.safetensors");
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--checkpoint '/proc/coupledqk-test.safetensors': cannot create a file in the folder '/proc'"));
  CHECK_FALSE(fs::exists(cache));  // refused before the data was prepared
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --metrics /proc/coupledqk-test.jsonl");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--metrics '/proc/coupledqk-test.jsonl': cannot create a file in the folder '/proc'"));
  CHECK_FALSE(fs::exists(cache));

  // A write killed mid-way left ".NAME.tmp.PID.N"; the next run of that checkpoint removes it (its
  // process is gone) but keeps a live process's.
  const std::string ckpt = dir / "run.safetensors";
  const fs::path stale = dir.path / ".run.safetensors.tmp.999999999.3";   // above any Linux pid_max
  const fs::path live = dir.path / (".run.safetensors.tmp." + std::to_string(::getpid()) + ".0");
  write_file(stale, std::string(4096, 'x'));
  write_file(live, "in progress");
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, flags + " --checkpoint '" + ckpt + "' --stop-after-steps 1");
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.err, "removed 1 stale temporary file(s)"));
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));
  CHECK(fs::exists(ckpt));
}

TEST_CASE("coupledqk-train generate: --threads is checked; an empty --prompt starts a document and says so") {
  TinyData& d = tiny_data();
  TempDir dir;
  const std::string ckpt = dir / "run.safetensors";
  Ran r = run_tool(dir, COUPLEDQK_TRAIN_BIN,
                   "--corpus '" + d.corpus + "' --cache '" + d.cache +
                       "' --vocab 400 --dim 32 --layers 2 --heads 4 --seq 32 --batch 4 --tokens 256 --eval-every 0 "
                       "--threads 1 --progress off --checkpoint '" + ckpt + "'");
  INFO(r.err);
  REQUIRE(r.status == 0);
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + ckpt + "' --threads -1");
  CHECK(r.status == 1);
  CHECK(contains(r.err, "--threads must be in [0, 1024] (0: the idle cores); got -1"));
  r = run_tool(dir, COUPLEDQK_TRAIN_BIN, "generate --checkpoint '" + ckpt + "' --prompt '' --tokens 5 --threads 1");
  CHECK(r.status == 0);
  CHECK(contains(r.err, "note: empty --prompt: generating the start of a new document"));
}

#ifdef COUPLEDQK_LAYER_BIN
TEST_CASE("coupledqk-layer: hostile layer files exit 1 with the file and the problem named; OUTPUT never written") {
  TempDir dir;
  const std::string out = dir / "out.safetensors";
  auto layer_file = [&](const std::string& name, const std::string& header, std::size_t data_bytes = 0) {
    const std::string path = dir / name;
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xff);
    write_file(path, bytes + header + std::string(data_bytes, '\0'));
    return path;
  };
  const std::string meta = R"("__metadata__":{"attention":"leapfrog","steps":"1","heads":"1","layer_index":"0")";
  const std::vector<std::tuple<std::string, std::string, std::size_t, std::string>> cases{
      // a header nesting arrays 100,000 deep: exit 139 before
      {"deep", "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0, "more than 8 levels deep"},
      // a shape whose dimensions multiply past 2^63 before a zero
      {"overflow", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,2,0],\"data_offsets\":[0,0]}}", 0,
       "multiply past 2^63 - 1"},
      // a 100 KB attention name, quoted in the message with a bounded length
      {"bad-variant",
       "{\"__metadata__\":{\"attention\":\"" + std::string(100000, 'v') + "\",\"steps\":\"1\",\"heads\":\"1\",\"layer_index\":\"0\"},"
       "\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1],\"data_offsets\":[0,4]}}",
       4, "bytes in all"},
      // a dynamics width far beyond what the file holds: std::bad_alloc before
      {"huge-m", "{" + meta + R"(,"m":"2000000000"},"x":{"dtype":"F32","shape":[1,1,1],"data_offsets":[0,4]},"dy":{"dtype":"F32","shape":[1,1,1],"data_offsets":[4,8]}})",
       8, "metadata 'm' is 2000000000, more than the 2 elements the file holds"},
  };
  for (const auto& [name, header, data, message] : cases) {
    const std::string in = layer_file(name + ".safetensors", header, data);
    const Ran r = run_tool(dir, COUPLEDQK_LAYER_BIN, "'" + in + "' '" + out + "'");
    INFO(name << ": " << r.err.substr(0, 600));
    CHECK(r.status == 1);
    CHECK(contains(r.err, in));
    CHECK(contains(r.err, message));
    CHECK(r.err.size() < 2000);
    CHECK_FALSE(fs::exists(out));
  }
}
#endif
