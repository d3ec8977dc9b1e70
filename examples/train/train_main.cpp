// coupledqk-train: trains one GPT with coupled query-key attention on a corpus, with checkpoints
// and metrics; `coupledqk-train generate` continues a prompt from a checkpoint.
// docs/training.md describes the flags, the checkpoint format and the guarantees; under mpirun
// (docs/distributed.md) the processes train one model together.
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "distributed/communicator.hpp"
#include "generation/generate.hpp"
#include "trainer.hpp"

namespace ct = coupledqk::train;

namespace {

int fail(const std::string& message) {
  std::fflush(stdout);
  std::cerr << "coupledqk-train: error: " << message << std::endl;
  return 1;
}

void print_result(const ct::TrainOptions& o, const ct::TrainResult& r) {
  std::printf("variant          %s (steps %d)\n", r.config.attention.c_str(), r.config.steps);
  std::printf("model            V=%ld D=%ld L=%ld H=%ld T=%ld, %ld parameters (dynamics %ld, %.3f%%)\n",
              static_cast<long>(r.config.vocab), static_cast<long>(r.config.dim), static_cast<long>(r.config.layers),
              static_cast<long>(r.config.heads), static_cast<long>(r.config.context), static_cast<long>(r.parameters),
              static_cast<long>(r.dynamics_parameters), r.dynamics_percent);
  std::printf("training         %ld/%ld steps, %ld tokens, %d thread(s)%s, %.1f s of training\n",
              static_cast<long>(r.steps_done), static_cast<long>(r.total_steps), static_cast<long>(r.tokens),
              r.threads, r.ranks > 1 ? " per process" : "", r.train_seconds);
  if (r.ranks > 1) std::printf("processes        %d (%s)\n", r.ranks, r.distributed.c_str());
  if (r.device != "cpu") std::printf("device           %s\n", r.device_name.c_str());
  std::printf("throughput       %.0f tokens/s (this session, evaluations excluded)\n", r.tokens_per_s);
  if (r.ranks > 1 && r.steps_done > r.start_step) {
    const double steps = static_cast<double>(r.steps_done - r.start_step);
    // This session's training time, from its tokens and throughput.
    const double session_tokens = steps * static_cast<double>(r.tokens) / static_cast<double>(r.steps_done);
    const double train_time = r.tokens_per_s > 0 ? session_tokens / r.tokens_per_s : 0;
    std::printf("all-reduce       %.3f ms per step for %ld floats (%.1f%% of the training time)\n",
                1e3 * r.reduce_seconds / steps, static_cast<long>(r.reduced_floats),
                train_time > 0 ? 100 * r.reduce_seconds / train_time : 0.0);
  }
  std::printf("train loss       %.4f (mean of the last steps)\n", r.final_train_loss);
  if (r.stopped_early) {
    std::printf("stopped early    after step %ld (%s)%s\n", static_cast<long>(r.steps_done),
                r.interrupted ? "interrupted" : "--stop-after-steps", o.checkpoint.empty() ? "" : "; resume with --resume");
  } else {
    std::printf("valid perplexity %.3f (loss %.4f)\n", r.valid_ppl, r.valid_loss);
    std::printf("test perplexity  %.3f (loss %.4f)\n", r.test_ppl, r.test_loss);
  }
  if (!o.checkpoint.empty()) std::printf("checkpoint       %s\n", o.checkpoint.c_str());
  std::printf("wall time        %.1f s\n", r.wall_seconds);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT with coupled query-key attention on a corpus (docs/training.md)",
               "coupledqk-train"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  ct::TrainOptions o;
  std::string progress = "auto";
  ct::add_flags(app, ct::train_flags(o, true));
  app.add_option("--progress", progress, "progress display: auto (bar on a terminal), bar, lines, off")
      ->capture_default_str();

  CLI::App* gen = app.add_subcommand("generate", "continue a prompt with a trained checkpoint");
  ct::GenerateOptions g;
  gen->add_option("--checkpoint", g.checkpoint, "checkpoint written by coupledqk-train")->required();
  gen->add_option("--prompt", g.prompt, "text to continue (empty: the start of a new document)")->capture_default_str();
  gen->add_option("--tokens", g.tokens, "tokens to generate (at most)")->capture_default_str();
  gen->add_option("--temperature", g.temperature, "sampling temperature (0: greedy)")->capture_default_str();
  gen->add_option("--top-k", g.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  gen->add_option("--seed", g.seed, "sampling seed")->capture_default_str();
  gen->add_option("--threads", g.threads, "threads (0: the idle cores)")->capture_default_str();
  bool no_stop = false;
  gen->add_flag("--no-stop", no_stop, "keep going past the end-of-document token");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  ct::Communicator* comm = nullptr;
  try {
    if (*gen) {
      g.stop_at_eos = !no_stop;
      if (g.prompt.empty())  // allowed: the model starts a document (docs/training.md)
        std::fprintf(stderr, "note: empty --prompt: generating the start of a new document\n");
      const ct::Generation out = ct::generate(g);
      std::cout << out.text << std::endl;
      std::fprintf(stderr, "[%zu tokens in %.2f s, %.1f tokens/s%s]\n", out.ids.size(), out.seconds,
                   out.tokens_per_s, out.ended_at_eos ? ", stopped at end of document" : "");
      return 0;
    }
    comm = &ct::world();  // under mpirun: MPI_Init, this process's rank (docs/distributed.md)
    ct::together(*comm, [&] { ct::validate_explicit(o, [&](const std::string& flag) { return app.count(flag) > 0; }); });
    ct::install_interrupt_handler();
    // Rank 0 alone prints (and writes the checkpoint and the metrics).
    std::optional<ct::Progress> bar;
    if (comm->root()) bar.emplace(ct::parse_progress_mode(progress));
    else bar.emplace(ct::ProgressMode::off, "", nullptr);
    ct::together(*comm, [&] { ct::preflight(o); });  // bad flags or checkpoints fail before the data is prepared
    // The first rank of each machine prepares the data (filling its cache: a tokenizer trained once),
    // then the others read it. A rank that fails takes every rank down with its message.
    std::optional<ct::TrainData> data;
    ct::together(*comm, [&] {
      if (comm->local_rank() == 0) data.emplace(ct::prepare_data(o, &*bar));
    });
    ct::together(*comm, [&] {
      if (comm->local_rank() != 0) data.emplace(ct::prepare_data(o, &*bar));
    });
    const ct::TrainResult r = ct::train(o, *data, *bar);
    if (comm->root()) print_result(o, r);
    bar.reset();
    comm->finalize();
    return r.interrupted ? 130 : 0;
  } catch (const ct::collective_error& e) {
    // Every rank failed together: rank 0 says why, all exit.
    const int code = !comm || comm->root() ? fail(e.what()) : 1;
    if (comm) comm->finalize();
    return code;
  } catch (const std::exception& e) {
    // One rank alone: the others may wait for it in a collective, so the whole job ends here.
    if (comm && comm->size() > 1)
      comm->abort("coupledqk-train: error on rank " + std::to_string(comm->rank()) + " of " +
                  std::to_string(comm->size()) + ": " + e.what() + " (ending every rank)");
    return fail(e.what());
  }
}
