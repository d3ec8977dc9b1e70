// train(): the training loop, in the order of llm.c's: sample a batch -> forward + backward (the
// backend) -> reduce the gradients (the reducer) -> clip + update (AdamW) -> evaluate / save. What
// comes before the loop (options, data, resume, the number of steps) is the run plan's.
#include "../trainer.hpp"

#include "reducer.hpp"
#include "text.hpp"

#include <cmath>
#include <csignal>

namespace coupledqk::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_signal(int sig) {
  g_signal = sig;
  std::signal(sig, SIG_DFL);  // a second one terminates
}
}  // namespace

void install_interrupt_handler() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

bool interrupted() { return g_signal != 0; }

TrainResult train(const TrainOptions& o, const TrainData& data, Progress& shown) {
  const double session_start = now_seconds();
  Communicator& comm = world();
  const int ranks = comm.size();
  together(comm, [&] { preflight(o); });
  check_ranks_agree(o, data, comm);  // the same flags and data on every rank, or a clear error on all
  // Rank 0 alone prints (and writes: the checkpoint writer and the metrics below).
  Progress silent(ProgressMode::off, "", nullptr);
  Progress& progress = comm.root() ? shown : silent;
  TrainResult r;
  r.ranks = ranks;
  r.distributed = comm.description();

  std::unique_ptr<Checkpoint> ckpt = read_resume_checkpoint(o, comm);
  // Automatic thread count on resume: the checkpoint's, so that the continuation is exact.
  r.threads = set_threads(o.threads == 0 && ckpt && ckpt->info.ranks == ranks ? ckpt->info.threads : o.threads);
  const Index B = o.batch, T = o.seq;
  // This rank's rows of every global batch of B: [rank * Bl, (rank + 1) * Bl) (validate() checked
  // that B splits evenly).
  const Index Bl = B / ranks, first_row = comm.rank() * Bl;
  check_data_fits(o, data);

  auto model = make_gpt<float>(model_config(o), o.seed);
  if (ranks > 1 && !o.resume) broadcast_parameters(comm, *model);
  r.config = model->config();
  const ParameterReport params = model->parameter_report();
  r.parameters = params.total;
  r.dynamics_parameters = params.dynamics;
  r.dynamics_percent = params.dynamics_percent;
  r.device = o.device;
  r.precision = o.precision;
  // The model where it trains (--device cuda: a copy on the GPU; the host model and optimiser stay
  // the checkpoint format, refreshed from the device to save), and the gradients' reduction.
  std::unique_ptr<Backend> backend;
  together(comm, [&] { backend = make_backend(o, *model); });
  GradientReducer reduce(comm, *backend);
  r.device_name = backend->description();
  r.distributed += reduce.description();
  if (!backend->on_host()) progress.message("device: " + r.device_name);
  if (ranks > 1)
    progress.message("distributed: " + r.distributed + "; global batch " + std::to_string(B) + " = " +
                     std::to_string(ranks) + " x " + std::to_string(Bl) + " sequences, " +
                     std::to_string(r.threads) + " thread(s) per rank");
  const BatchLoss eval_loss = [&](TokenSpan tk, TokenSpan tg, Index nb) { return backend->evaluate(tk, tg, nb); };
  auto evaluate = [&](const std::vector<std::int32_t>& stream, Index max_tokens) {
    return evaluate_split(comm, eval_loss, stream, T, B, Bl, max_tokens);
  };

  const Index total_steps = plan_total_steps(
      o, ckpt.get(), data, first_row, Bl, comm,
      [&](const std::vector<std::int32_t>& tk, const std::vector<std::int32_t>& tg) {
        reduce(backend->step_loss(tk, tg, Bl));
      },
      progress);
  model->zero_grad();  // after a --seconds probe's steps
  reduce.reset_seconds();
  require(o.warmup <= total_steps, "--warmup ", o.warmup, " exceeds the run's ", total_steps, " steps");
  r.total_steps = total_steps;

  const RunFingerprint run = fingerprint(o, total_steps, data.tokenizer.model_hash());
  AdamW<float> opt(model->parameters(), model->gradients(), optimiser_config(o, total_steps));
  Rng sampler(sampler_seed(o.seed));
  RunState state;
  if (ckpt) {
    state = restore_run(o, *ckpt, run, *model, opt, sampler, ranks, r.threads, backend->on_host(), progress);
    ckpt.reset();
  }
  backend->from_host(*model, &opt);  // parameters (restored or initial) and the optimiser state
  r.start_step = state.step;
  r.curve = state.curve;
  r.dynamics = state.dynamics;
  // The dynamics' diagnostics at an evaluation (dynamics_probe_windows): a forward pass on the
  // first validation windows that touches neither the parameters nor the sampler.
  const Index probe_windows = backend->on_host() ? std::min<Index>(o.dynamics_probe_windows,
                                                                   static_cast<Index>(data.streams.valid.size()) / T)
                                                 : 0;
  const std::vector<std::int32_t> probe_tokens(data.streams.valid.begin(),
                                               data.streams.valid.begin() + std::max<Index>(0, probe_windows) * T);
  auto probe = [&]() {
    if (probe_windows <= 0) return;
    DynamicsPoint d{state.step, state.tokens_seen, {}};
    for (LayerDynamics& l : backend->dynamics_diagnostics(
             TokenSpan{probe_tokens.data(), static_cast<Index>(probe_tokens.size())}, probe_windows))
      if (!l.tau.empty()) d.layers.push_back(std::move(l));
    if (d.layers.empty()) return;  // no block has dynamics
    if (!r.dynamics.empty() && r.dynamics.back().step == state.step) r.dynamics.pop_back();
    r.dynamics.push_back(std::move(d));
  };
  if (state.step == 0) probe();  // where the map starts

  CheckpointWriter writer(o, data, run, r.threads, ranks, comm.root());
  const double elapsed_before = state.elapsed;
  auto elapsed = [&] { return elapsed_before + (now_seconds() - session_start); };
  auto save = [&] { writer.save(state, sampler, elapsed(), r.curve, r.dynamics, *model, opt, *backend); };
  MetricsLog metrics;
  if (!o.metrics.empty() && comm.root()) metrics = MetricsLog(o.metrics, o.resume);

  // ---- the loop
  std::vector<std::int32_t> tokens, targets;
  double train_time = 0;
  Index session_tokens = 0;
  while (state.step < total_steps) {
    const double t0 = now_seconds();
    sample_batch(data.streams.train, B, T, sampler, tokens, targets, first_row, Bl);
    const GradientReducer::Reduced step = reduce(backend->step_loss(tokens, targets, Bl));
    const float loss = step.loss;
    if (!std::isfinite(loss))
      throw runtime_error("training diverged at step " + std::to_string(state.step + 1) + ": the loss is " +
                          fmt("%g", loss) + "; lower --lr (now " + fmt("%g", o.lr) + ") or keep --clip");
    const StepReport rep = backend->optimizer_step();  // clip + AdamW
    train_time += now_seconds() - t0;
    ++state.step;
    state.tokens_seen = state.step * B * T;
    session_tokens += B * T;
    r.losses.push_back(loss);
    r.grad_norms.push_back(rep.grad_norm);

    StepMetrics m;
    m.step = state.step;
    m.total_steps = total_steps;
    m.tokens = state.tokens_seen;
    m.loss = loss;
    m.lr = rep.lr;
    m.grad_norm = rep.grad_norm;
    m.tokens_per_s = static_cast<double>(session_tokens) / train_time;
    m.elapsed = elapsed();
    progress.step(m);
    metrics.step(m);

    if (o.eval_every > 0 && state.step % o.eval_every == 0 && state.step < total_steps) {
      const Perplexity p = evaluate(data.streams.valid, o.eval_tokens);
      r.curve.push_back(CurvePoint{state.step, state.tokens_seen, p.loss, p.ppl});
      probe();
      const EvalMetrics e{state.step, state.tokens_seen, "valid", p.tokens, p.loss, p.ppl, elapsed()};
      progress.eval(e);
      metrics.eval(e);
    }
    if (o.stop_after_steps > 0 && state.step == o.stop_after_steps && state.step < total_steps) {
      r.stopped_early = true;
      save();
      progress.message("stopped after step " + std::to_string(state.step) + " as asked (--stop-after-steps)" +
                       (o.checkpoint.empty() ? std::string() : "; checkpoint written to '" + o.checkpoint + "'"));
      break;
    }
    // Several ranks stop at the same step: the one whose interruption the step's reduction carried.
    if ((ranks == 1 ? interrupted() : step.interrupted) && state.step < total_steps) {
      r.stopped_early = r.interrupted = true;
      save();
      progress.message("interrupted after step " + std::to_string(state.step) +
                       (o.checkpoint.empty() ? std::string("; no --checkpoint, nothing saved")
                                             : "; checkpoint written to '" + o.checkpoint + "' (continue with --resume)"));
      break;
    }
    if (o.checkpoint_every > 0 && state.step % o.checkpoint_every == 0 && state.step < total_steps) save();
  }
  progress.finish();

  r.steps_done = state.step;
  r.tokens = state.tokens_seen;
  r.tokens_per_s = train_time > 0 ? static_cast<double>(session_tokens) / train_time : 0;
  r.reduce_seconds = reduce.seconds();
  r.reduced_floats = ranks > 1 ? backend->gradient_count() : 0;
  r.last_loss = r.losses.empty() ? std::nan("") : r.losses.back();
  r.final_train_loss = final_train_loss(r.losses);

  if (!r.stopped_early) {
    const Perplexity v = evaluate(data.streams.valid, 0);
    const Perplexity t = evaluate(data.streams.test, 0);
    r.valid_loss = v.loss;
    r.valid_ppl = v.ppl;
    r.test_loss = t.loss;
    r.test_ppl = t.ppl;
    // The curve's points are all measured on the same tokens (the --eval-tokens cap), so its last
    // point is too; the table's numbers above use the whole splits.
    const bool capped = o.eval_tokens > 0 && o.eval_tokens < v.tokens;
    const Perplexity c = capped ? evaluate(data.streams.valid, o.eval_tokens) : v;
    if (!r.curve.empty() && r.curve.back().step == state.step) r.curve.pop_back();
    r.curve.push_back(CurvePoint{state.step, state.tokens_seen, c.loss, c.ppl});
    probe();
    const double el = elapsed();
    const EvalMetrics ev{state.step, state.tokens_seen, "valid", v.tokens, v.loss, v.ppl, el};
    const EvalMetrics et{state.step, state.tokens_seen, "test", t.tokens, t.loss, t.ppl, el};
    progress.eval(ev);
    progress.eval(et);
    metrics.eval(ev);
    metrics.eval(et);
    save();
  } else {
    r.valid_loss = r.valid_ppl = r.test_loss = r.test_ppl = std::nan("");
  }
  r.train_seconds = elapsed();
  r.wall_seconds = now_seconds() - session_start;
  metrics.line(summary_json(o, r));
  return r;
}

}  // namespace coupledqk::train
