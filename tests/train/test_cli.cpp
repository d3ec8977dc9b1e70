// The command-line tools end to end, through their binaries: coupledqk-train (train, refuse to
// overwrite, resume, bad flags, generate, --device/--precision) and coupledqk-compare, on a tiny
// generated corpus. The --device cuda case runs everywhere: without CUDA support or without a GPU
// it checks the refusal (message, nothing written); on a GPU machine it trains there and moves the
// checkpoints between the devices.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>

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

  r = run_tool(dir, COUPLEDQK_TRAIN_BIN,
               "generate --checkpoint '" + ckpt + "' --prompt 'Kalo' --tokens 12 --seed 3 --no-stop --threads 1");
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("Kalo", 0) == 0);
  CHECK(r.out.size() > 8);
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
  CHECK(contains(r.out, "(min-max)"));
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
}
