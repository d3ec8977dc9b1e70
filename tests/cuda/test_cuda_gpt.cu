// The GPT on the GPU (cuda/gpt.cuh, cuda/kernels.cuh) against the CPU model (model/gpt.hpp):
//
//   * the non-attention kernels against autodiff/kernels.hpp and optim/adamw.hpp;
//   * for standard, leapfrog (1 and 3 steps), euler, uncoupled, diff, diff-leapfrog at a tiny size
//     (V=64, D=32, L=2, H=4, T=24 -- not a multiple of 16 -- B=3, dynamics_init_scale 0.3): the loss
//     and every gradient tensor against a double CPU model holding the same parameters (float:
//     relative error <= 1e-4 per tensor, max-norm; bf16: <= 2e-2, L2 norm; each tensor's scale
//     floored at a small fraction of the whole gradient's), evaluate(), gradient accumulation;
//   * 10 AdamW steps on the same batches on both devices: loss curves within 1e-3 relative (float),
//     then the device state downloaded into a fresh CPU model and optimiser continues the run;
//   * the device trainer of coupledqk-train (when this test links coupledqk_cuda_train);
//   * rotary positions in both orders, no positions, and a causal window (GptConfig::positions,
//     ::rope_order, ::window): loss and every gradient as above, standard, leapfrog, diff-leapfrog;
//   * errors: a host model of another variant, bad ids, T > context.
// Without a usable device the whole executable is skipped (test_cuda_main.cu, exit 77).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <coupledqk/autodiff/kernels.hpp>
#include <coupledqk/cuda/gpt.cuh>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

#include "cpu_models.hpp"
#include "cuda_test_support.cuh"

#if __has_include("trainer/backend.hpp") && __has_include("records/checkpoint.hpp")
#include "trainer/backend.hpp"
#define COUPLEDQK_TEST_DEVICE_TRAINER 1
#endif

namespace {

using namespace coupledqk;
using coupledqk::cuda::bf16;
using coupledqk::cuda::DeviceBuffer;
using coupledqk::cuda::testing::bf16_tolerance;
using coupledqk::cuda::testing::cpu_model;
using coupledqk::cuda::testing::Variant;
using coupledqk::cuda::testing::random_vector;
using coupledqk::cuda::testing::relative_error;
using coupledqk::cuda::testing::relative_l2;
using coupledqk::cuda::testing::to_device;
using coupledqk::cuda::testing::to_host;

constexpr Index kB = 3, kT = 24;

GptConfig tiny_config() {
  GptConfig c;
  c.vocab = 64;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.context = kT;
  c.dynamics_init_scale = 0.3;  // the dynamics are not the identity at init
  return c;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch random_batch(std::uint64_t seed, Index vocab, Index n) {
  Rng rng(seed);
  Batch b;
  for (Index i = 0; i < n; ++i) b.tokens.push_back(static_cast<std::int32_t>(rng.next_u64() % std::uint64_t(vocab)));
  for (Index i = 0; i < n; ++i) b.targets.push_back(static_cast<std::int32_t>(rng.next_u64() % std::uint64_t(vocab)));
  return b;
}

template <class S>
std::vector<float> flat(const TensorView<S>& v) {
  std::vector<float> out(static_cast<std::size_t>(v.size()));
  for (Index i = 0; i < v.size(); ++i) out[static_cast<std::size_t>(i)] = static_cast<float>(v.data[i]);
  return out;
}

template <class S>
std::vector<float> flat_all(const std::vector<TensorView<S>>& views) {
  std::vector<float> out;
  for (const auto& v : views)
    for (Index i = 0; i < v.size(); ++i) out.push_back(static_cast<float>(v.data[i]));
  return out;
}

/// Copies the float model's parameters into a double model of the same variant and sizes.
void copy_parameters(AnyGpt<float>& from, AnyGpt<double>& to) {
  auto src = from.parameters();
  auto dst = to.parameters();
  REQUIRE(src.size() == dst.size());
  for (std::size_t k = 0; k < src.size(); ++k) {
    REQUIRE(src[k].name == dst[k].name);
    for (Index i = 0; i < src[k].size(); ++i) dst[k].data[i] = static_cast<double>(src[k].data[i]);
  }
}

template <class T>
constexpr bool is_bf16 = std::is_same_v<T, bf16>;

// ---- the whole model: loss and gradients ------------------------------------------------------------

template <class I, class Sc, class T>
void check_gradients(const GptConfig& cfg = tiny_config()) {
  // (the CPU models are compiled once for the three builds of this test: cpu_models.hpp)
  const auto host_model = cpu_model<float, I, Sc>(cfg, 5);
  const auto ref_model = cpu_model<double, I, Sc>(cfg, 5);
  AnyGpt<float>& host = *host_model;
  AnyGpt<double>& ref = *ref_model;
  copy_parameters(host, ref);
  const Batch batch = random_batch(17, cfg.vocab, kB * kT);

  Tape<double> tape;
  ref.zero_grad();
  const double want = ref.loss(tape, batch.tokens, batch.targets, kB);

  cuda::Gpt<I, Sc, T> dev(cfg);
  CHECK(dev.config().attention == host.config().attention);
  CHECK(dev.parameter_count() == host.parameter_report().total);
  CHECK(dev.parameter_report().dynamics == host.parameter_report().dynamics);
  dev.upload(host);
  CHECK(dev.download_parameters() == flat_all(host.parameters()));  // upload is a plain copy
  dev.zero_grad();
  const float got = dev.loss(batch.tokens, batch.targets, kB);
  const double loss_tol = is_bf16<T> ? bf16_tolerance() : 1e-4;
  INFO("variant ", host.config().attention, " steps ", host.config().steps, ", ", cuda::to_string(dev.precision()));
  INFO("positions ", std::string(to_string(cfg.positions)), ", rope order ", std::string(to_string(cfg.rope_order)),
       ", window ", cfg.window);
  INFO("loss: device ", got, ", CPU (double) ", want);
  CHECK(std::abs(got - want) / std::abs(want) <= loss_tol);

  host.zero_grad();
  dev.download_gradients(host);
  const auto g_dev = host.gradients();
  const auto g_ref = ref.gradients();
  REQUIRE(g_dev.size() == g_ref.size());
  // Each tensor's error relative to its own scale, floored at a small fraction of the whole
  // gradient's (so that a tensor whose gradient nearly cancels is not judged on round-off alone).
  const std::vector<float> all_ref = flat_all(g_ref);
  double max_all = 0, l2_all = 0;
  for (float x : all_ref) max_all = std::max(max_all, double(std::abs(x))), l2_all += double(x) * double(x);
  l2_all = std::sqrt(l2_all);
  for (std::size_t k = 0; k < g_ref.size(); ++k) {
    const std::vector<float> a = flat(g_dev[k]), b = flat(g_ref[k]);
    const double e_max = relative_error(a, b, 1e-3 * max_all), e_l2 = relative_l2(a, b, 1e-2 * l2_all);
    INFO("gradient ", g_ref[k].name, ": max-norm relative error ", e_max, ", L2 relative error ", e_l2);
    if (is_bf16<T>)
      CHECK(e_l2 <= bf16_tolerance());
    else
      CHECK(e_max <= 1e-4);
  }

  // evaluate: the same loss, no gradients
  const std::vector<float> g1 = dev.download_gradients();
  const float e = dev.evaluate(batch.tokens, batch.targets, kB);
  CHECK(std::abs(e - got) <= 1e-5f * std::abs(got));
  CHECK(dev.download_gradients() == g1);

  // gradients accumulate across calls until zero_grad
  const float again = dev.loss(batch.tokens, batch.targets, kB);
  CHECK(std::abs(again - got) <= 1e-5f * std::abs(got));
  std::vector<float> twice = g1;
  for (float& x : twice) x *= 2;
  CHECK(relative_error(dev.download_gradients(), twice, 1e-12) <= 1e-5);
  dev.zero_grad();
  const std::vector<float> zeros = dev.download_gradients();
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.f; }));
}

// ---- 10 AdamW steps on both devices -----------------------------------------------------------------

template <class I, class Sc, class T>
void check_training() {
  const GptConfig cfg = tiny_config();
  AdamWConfig oc;
  oc.lr = 3e-3;
  oc.min_lr = 3e-4;
  oc.warmup_steps = 2;
  oc.total_steps = 10;
  oc.weight_decay = 0.1;
  oc.clip_norm = 1.0;
  const int steps = 10;

  const auto host_model = cpu_model<float, I, Sc>(cfg, 7);
  AnyGpt<float>& host = *host_model;
  coupledqk::AdamW<float> opt_cpu(host.parameters(), host.gradients(), oc);
  cuda::Gpt<I, Sc, T> dev(cfg);
  dev.upload(host);
  cuda::AdamW opt_dev(dev, oc);
  Tape<float> tape;
  INFO("variant ", host.config().attention, " steps ", host.config().steps, ", ", cuda::to_string(dev.precision()));

  // Step s on both devices with the same batch: a CPU model and optimiser, and the device's.
  struct Both {
    float lc, ld;
    StepReport rc, rd;
  };
  const auto step_both = [&](AnyGpt<float>& cpu, coupledqk::AdamW<float>& opt, int s) {
    const Batch b = random_batch(100 + std::uint64_t(s), cfg.vocab, kB * kT);
    Both r{};
    cpu.zero_grad();
    r.lc = cpu.loss(tape, b.tokens, b.targets, kB);
    r.rc = opt.step();
    dev.zero_grad();
    r.ld = dev.loss(b.tokens, b.targets, kB);
    r.rd = opt_dev.step();
    return r;
  };

  const double loss_tol = is_bf16<T> ? 2e-2 : 1e-3;
  for (int s = 0; s < steps; ++s) {
    const Both r = step_both(host, opt_cpu, s);
    const float lc = r.lc, ld = r.ld;
    const StepReport &rc = r.rc, &rd = r.rd;
    INFO("step ", s + 1, ": loss CPU ", lc, " device ", ld, "; grad norm CPU ", rc.grad_norm, " device ", rd.grad_norm);
    CHECK(std::abs(ld - lc) / std::abs(lc) <= loss_tol);
    CHECK(std::abs(rd.grad_norm - rc.grad_norm) / rc.grad_norm <= (is_bf16<T> ? 5e-2 : 1e-3));
    CHECK(rd.lr == rc.lr);
    CHECK(rd.step == rc.step);
    CHECK(!rd.skipped);
  }
  CHECK(opt_dev.steps_done() == steps);

  // The device state into a fresh CPU model (another seed: everything must come from the device)
  // and a fresh CPU optimiser.
  const auto host2_model = cpu_model<float, I, Sc>(cfg, 99);
  AnyGpt<float>& host2 = *host2_model;
  coupledqk::AdamW<float> opt2(host2.parameters(), host2.gradients(), oc);
  dev.download(host2);
  opt_dev.download(opt2);
  CHECK(flat_all(host2.parameters()) == dev.download_parameters());
  CHECK(opt2.steps_done() == steps);
  {
    const auto st = opt2.state();
    const std::size_t K = host2.parameters().size();
    std::vector<float> m, v;
    for (std::size_t k = 0; k < K; ++k)
      for (Index i = 0; i < st[k].size(); ++i) m.push_back(st[k].data[i]);
    for (std::size_t k = K; k < 2 * K; ++k)
      for (Index i = 0; i < st[k].size(); ++i) v.push_back(st[k].data[i]);
    CHECK(m == opt_dev.download_m());
    CHECK(v == opt_dev.download_v());
  }
  if (!is_bf16<T>) {
    // The two trajectories agree to float round-off. (Measured in L2: AdamW's first updates are
    // +-lr whatever the gradient's size, so the rare entry whose gradient is zero to round-off may
    // move differently on the two devices; a max-norm would fail on that alone.)
    const auto a = host2.parameters();
    const auto b = host.parameters();
    const std::vector<float> fa = flat_all(a), fb = flat_all(b);
    CHECK(relative_l2(fa, fb) <= 1e-3);
    const double scale = std::sqrt(std::inner_product(fb.begin(), fb.end(), fb.begin(), 0.0));
    for (std::size_t k = 0; k < a.size(); ++k) {
      INFO("parameter ", a[k].name);
      CHECK(relative_l2(flat(a[k]), flat(b[k]), 1e-3 * scale) <= 5e-2);
    }
  }

  // The CPU continues from the downloaded state exactly where the device does.
  for (int s = steps; s < steps + 2; ++s) {
    const Both r = step_both(host2, opt2, s);
    const float lc = r.lc, ld = r.ld;
    const StepReport &rc = r.rc, &rd = r.rd;
    INFO("continued step ", s + 1, ": loss CPU ", lc, " device ", ld);
    CHECK(std::abs(ld - lc) / std::abs(lc) <= (is_bf16<T> ? 2e-2 : 1e-4));
    CHECK(rc.step == rd.step);
    CHECK(rc.lr == rd.lr);
  }

  // And back: the CPU state uploaded into a fresh device optimiser round-trips bit for bit.
  cuda::Gpt<I, Sc, T> dev2(cfg);
  dev2.upload(host2);
  cuda::AdamW opt_dev2(dev2, oc);
  opt_dev2.upload(opt2);
  CHECK(opt_dev2.steps_done() == opt2.steps_done());
  CHECK(dev2.download_parameters() == flat_all(host2.parameters()));
  const auto host3_model = cpu_model<float, I, Sc>(cfg, 3);
  AnyGpt<float>& host3 = *host3_model;
  coupledqk::AdamW<float> opt3(host3.parameters(), host3.gradients(), oc);
  opt_dev2.download(opt3);
  CHECK(flat_all(opt3.state()) == flat_all(opt2.state()));
}

}  // namespace

// ---- kernels against the CPU kernels ----------------------------------------------------------------

TEST_CASE("kernels: LayerNorm forward and backward match autodiff/kernels.hpp") {
  const Index N = 37, D = 50;  // neither a multiple of 32
  const auto xh = random_vector(std::size_t(N * D), 1, 2.0), gh = random_vector(std::size_t(D), 2),
             bh = random_vector(std::size_t(D), 3), dyh = random_vector(std::size_t(N * D), 4);
  Matrix<float> x = ConstMatrixMap<float>(xh.data(), N, D), g = ConstMatrixMap<float>(gh.data(), 1, D),
                b = ConstMatrixMap<float>(bh.data(), 1, D), dy = ConstMatrixMap<float>(dyh.data(), N, D);
  Matrix<float> y(N, D), stats, dx;
  kernels::layer_norm_forward<float>(x, g, b, y, &stats);
  std::vector<float> dg_want(std::size_t(D), 0.5f), db_want(std::size_t(D), -0.25f);
  kernels::layer_norm_backward<float>(x, g, stats, dy, dx, dg_want.data(), db_want.data());

  auto xd = to_device<float>(xh);
  auto gd = to_device<float>(gh);
  auto bd = to_device<float>(bh);
  auto dyd = to_device<float>(dyh);
  auto yd = cuda::testing::poisoned<float>(std::size_t(N * D));
  DeviceBuffer<float> mean{std::size_t(N)}, rstd{std::size_t(N)}, dxd{std::size_t(N * D)};
  DeviceBuffer<float> part{std::size_t(2 * cuda::kernels::column_chunks(N) * D)};
  auto dgd = to_device<float>(std::vector<float>(std::size_t(D), 0.5f));
  auto dbd = to_device<float>(std::vector<float>(std::size_t(D), -0.25f));
  cuda::kernels::layer_norm_forward<float>(xd.data(), gd.data(), bd.data(), yd.data(), mean.data(), rstd.data(), N, D,
                                           nullptr);
  cuda::kernels::layer_norm_backward<float>(xd.data(), gd.data(), mean.data(), rstd.data(), dyd.data(), dxd.data(),
                                            false, dgd.data(), dbd.data(), part.data(), N, D, nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(relative_error(yd.download(), std::vector<float>(y.data(), y.data() + y.size())) <= 1e-5);
  CHECK(relative_error(dxd.download(), std::vector<float>(dx.data(), dx.data() + dx.size())) <= 1e-5);
  CHECK(relative_error(dgd.download(), dg_want) <= 1e-5);
  CHECK(relative_error(dbd.download(), db_want) <= 1e-5);
  std::vector<float> mu(static_cast<std::size_t>(N)), rs(static_cast<std::size_t>(N));
  for (Index r = 0; r < N; ++r) mu[std::size_t(r)] = stats(r, 0), rs[std::size_t(r)] = stats(r, 1);
  CHECK(relative_error(mean.download(), mu) <= 1e-5);
  CHECK(relative_error(rstd.download(), rs) <= 1e-5);

  // accumulate: dx += the same
  cuda::kernels::layer_norm_backward<float>(xd.data(), gd.data(), mean.data(), rstd.data(), dyd.data(), dxd.data(),
                                            true, nullptr, nullptr, part.data(), N, D, nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  Matrix<float> dx2 = 2 * dx;
  CHECK(relative_error(dxd.download(), std::vector<float>(dx2.data(), dx2.data() + dx2.size())) <= 1e-5);

  // bf16 storage: within bf16 round-off
  auto xb = to_device<bf16>(xh);
  auto yb = cuda::testing::poisoned<bf16>(std::size_t(N * D));
  cuda::kernels::layer_norm_forward<bf16>(xb.data(), gd.data(), bd.data(), yb.data(), mean.data(), rstd.data(), N, D,
                                          nullptr);
  CHECK(relative_error(to_host(yb), std::vector<float>(y.data(), y.data() + y.size())) <= 2e-2);
}

TEST_CASE("kernels: GELU, bias + GELU, bias + residual, column sums") {
  const Index N = 19, C = 70;
  const auto ah = random_vector(std::size_t(N * C), 5, 2.0), biash = random_vector(std::size_t(C), 6),
             rh = random_vector(std::size_t(N * C), 7), dh = random_vector(std::size_t(N * C), 8);
  auto a = to_device<float>(ah);
  auto bias = to_device<float>(biash);
  auto resid = to_device<float>(rh);
  auto d = to_device<float>(dh);
  auto pre = cuda::testing::poisoned<float>(std::size_t(N * C));
  auto out = cuda::testing::poisoned<float>(std::size_t(N * C));
  auto res = cuda::testing::poisoned<float>(std::size_t(N * C));
  cuda::kernels::bias_gelu_forward<float>(a.data(), bias.data(), pre.data(), out.data(), N, C, nullptr);
  cuda::kernels::bias_residual<float>(resid.data(), a.data(), bias.data(), res.data(), N, C, nullptr);
  cuda::kernels::gelu_backward<float>(pre.data(), d.data(), N * C, nullptr);
  auto sums = to_device<float>(std::vector<float>(std::size_t(C), 1.f));
  DeviceBuffer<float> part{std::size_t(cuda::kernels::column_chunks(N) * C)};
  cuda::kernels::column_sums(a.data(), N, C, sums.data(), part.data(), nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> pre_w(ah.size()), out_w(ah.size()), res_w(ah.size()), d_w(ah.size()), sums_w(std::size_t(C), 1.f);
  for (Index r = 0; r < N; ++r)
    for (Index c = 0; c < C; ++c) {
      const std::size_t i = std::size_t(r * C + c);
      pre_w[i] = ah[i] + biash[std::size_t(c)];
      out_w[i] = kernels::gelu(pre_w[i]);
      res_w[i] = rh[i] + (ah[i] + biash[std::size_t(c)]);
      d_w[i] = dh[i] * kernels::gelu_grad(pre_w[i]);
      sums_w[std::size_t(c)] += ah[i];
    }
  CHECK(relative_error(pre.download(), pre_w) <= 1e-6);
  CHECK(relative_error(out.download(), out_w) <= 1e-5);
  CHECK(relative_error(res.download(), res_w) <= 1e-6);
  CHECK(relative_error(d.download(), d_w) <= 1e-5);
  CHECK(relative_error(sums.download(), sums_w) <= 1e-5);
}

TEST_CASE("kernels: softmax cross-entropy matches autodiff/kernels.hpp") {
  const Index N = 5, V = 1000;
  const auto zh = random_vector(std::size_t(N * V), 9, 3.0);
  std::vector<std::int32_t> t{3, 999, 0, 512, 77};
  Matrix<float> z = ConstMatrixMap<float>(zh.data(), N, V), probs;
  const float want = kernels::cross_entropy_forward<float>(z, t.data(), probs);
  kernels::cross_entropy_backward<float>(probs, t.data(), 1.f);

  auto zd = to_device<float>(zh);
  DeviceBuffer<std::int32_t> td;
  td.upload(t);
  DeviceBuffer<float> rows{std::size_t(N)};
  DeviceBuffer<double> sum(1);
  cuda::kernels::cross_entropy(zd.data(), td.data(), rows.data(), sum.data(), N, V, true, 1.f / float(N), nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const double got = sum.download()[0] / double(N);
  CHECK(std::abs(got - want) <= 1e-5 * std::abs(want));
  CHECK(relative_error(zd.download(), std::vector<float>(probs.data(), probs.data() + probs.size())) <= 1e-5);
}

TEST_CASE("kernels: AdamW update and gradient norm match optim/adamw.hpp") {
  Matrix<float> w = ConstMatrixMap<float>(random_vector(63, 10).data(), 7, 9);
  Vector<float> bvec = Eigen::Map<const Vector<float>>(random_vector(5, 11).data(), 5);
  Matrix<float> gw(7, 9);
  Vector<float> gb(5);
  std::vector<TensorView<float>> params{{"w", {7, 9}, w.data()}, {"b", {5}, bvec.data()}};
  std::vector<TensorView<float>> grads{{"w", {7, 9}, gw.data()}, {"b", {5}, gb.data()}};
  AdamWConfig oc;
  oc.lr = 1e-2;
  oc.warmup_steps = 1;
  oc.total_steps = 3;
  oc.clip_norm = 0.5;  // clips: the gradients below have a norm of about 8
  coupledqk::AdamW<float> cpu(params, grads, oc);

  // the same tensors flat on the device: w then b, decay on w only
  std::vector<float> p0(w.data(), w.data() + 63);
  p0.insert(p0.end(), bvec.data(), bvec.data() + 5);
  auto p = to_device<float>(p0);
  DeviceBuffer<float> g(68), m(68), v(68);
  m.zero();
  v.zero();
  std::vector<std::uint8_t> mask(68, 0);
  std::fill(mask.begin(), mask.begin() + 63, std::uint8_t(1));
  DeviceBuffer<std::uint8_t> maskd;
  maskd.upload(mask);
  DeviceBuffer<bf16> shadow(68);
  DeviceBuffer<double> partials(cuda::kernels::norm_blocks), norm(1);
  for (int s = 1; s <= 3; ++s) {
    const auto gh = random_vector(68, 20 + std::uint64_t(s));
    std::copy(gh.begin(), gh.begin() + 63, gw.data());
    std::copy(gh.begin() + 63, gh.end(), gb.data());
    g.upload(gh);
    const StepReport r = cpu.step();
    cuda::kernels::sum_squares(g.data(), 68, partials.data(), norm.data(), nullptr);
    COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
    const double dev_norm = std::sqrt(norm.download()[0]);
    CHECK(std::abs(dev_norm - r.grad_norm) <= 1e-12 * r.grad_norm);
    const auto k = cuda::kernels::adamw_constants(oc.beta1, oc.beta2, oc.eps, oc.weight_decay, r.lr, r.clip_scale, r.step);
    cuda::kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), maskd.data(), shadow.data(), 68, k, nullptr);
    COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> want(w.data(), w.data() + 63);
  want.insert(want.end(), bvec.data(), bvec.data() + 5);
  CHECK(relative_error(p.download(), want) <= 1e-6);
  CHECK(relative_error(to_host(shadow), want) <= 1e-2);
  const auto st = cpu.state();
  std::vector<float> m_want = flat(st[0]), v_want = flat(st[2]);
  const auto mb = flat(st[1]), vb = flat(st[3]);
  m_want.insert(m_want.end(), mb.begin(), mb.end());
  v_want.insert(v_want.end(), vb.begin(), vb.end());
  CHECK(relative_error(m.download(), m_want) <= 1e-6);
  CHECK(relative_error(v.download(), v_want) <= 1e-6);
}

// ---- the model ----------------------------------------------------------------------------------------

// (COUPLEDQK_GPT_VARIANTS: cpu_models.hpp, where their CPU models are compiled)

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE_TEMPLATE("cuda gpt: loss and every gradient match the CPU model (float32)", V, COUPLEDQK_GPT_VARIANTS) {
  check_gradients<typename V::integrator, typename V::scoring, float>();
}
#endif

TEST_CASE_TEMPLATE("cuda gpt: loss and every gradient match the CPU model (bf16)", V, COUPLEDQK_GPT_VARIANTS) {
  check_gradients<typename V::integrator, typename V::scoring, bf16>();
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE_TEMPLATE("cuda gpt: 10 AdamW steps follow the CPU; the CPU continues from the device state (float32)", V,
                   COUPLEDQK_GPT_VARIANTS) {
  check_training<typename V::integrator, typename V::scoring, float>();
}
#endif

TEST_CASE_TEMPLATE("cuda gpt: 10 AdamW steps follow the CPU; the CPU continues from the device state (bf16)", V,
                   COUPLEDQK_GPT_VARIANTS) {
  check_training<typename V::integrator, typename V::scoring, bf16>();
}

/// The tiny model with rotary positions (both orders, with and without a window), no positions,
/// and learned positions with a window.
std::vector<GptConfig> positions_configs() {
  std::vector<GptConfig> out;
  for (int which = 0; which < 4; ++which) {
    GptConfig c = tiny_config();
    c.positions = which == 3 ? GptPositions::none : which == 0 ? GptPositions::learned : GptPositions::rope;
    c.rope_order = which == 2 ? RopeOrder::rotate_then_dynamics : RopeOrder::dynamics_then_rotate;
    c.window = which == 1 ? 0 : 5 + which;  // 5: learned, 7: rope rotate-then-dynamics, 8: none
    out.push_back(c);
  }
  return out;
}

TEST_CASE_TEMPLATE("cuda gpt: rope in both orders, no positions, windows: loss and every gradient match the CPU model",
                   V, Variant<Identity, Softmax>, Variant<Leapfrog<1>, Softmax>, Variant<Leapfrog<1>, Differential>) {
  for (const GptConfig& c : positions_configs()) {
#if COUPLEDQK_TEST_FLOAT_CASES
    check_gradients<typename V::integrator, typename V::scoring, float>(c);
#endif
    check_gradients<typename V::integrator, typename V::scoring, bf16>(c);
  }
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("cuda gpt: layout, workspace growth and errors") {
  const GptConfig cfg = tiny_config();
  const auto host_model = cpu_model<float, Leapfrog<1>, Softmax>(cfg, 1);
  AnyGpt<float>& host = *host_model;
  cuda::Gpt<Leapfrog<1>, Softmax, float> dev(cfg);
  // the specs are the CPU views: names, shapes, contiguous
  const auto views = host.parameters();
  const auto& specs = dev.parameter_specs();
  REQUIRE(specs.size() == views.size());
  Index off = 0;
  for (std::size_t k = 0; k < specs.size(); ++k) {
    CHECK(specs[k].name == views[k].name);
    CHECK(specs[k].shape == views[k].shape);
    CHECK(specs[k].offset == off);
    CHECK(specs[k].decay == (views[k].shape.size() == 2));
    off += specs[k].size;
  }
  CHECK(off == dev.parameter_count());
  dev.upload(host);

  // a smaller batch after a larger one, then a larger one again (grow-only workspaces)
  for (Index B : {Index(3), Index(1), Index(4)}) {
    for (Index T : {kT, Index(7)}) {
      const Batch b = random_batch(40 + std::uint64_t(B * T), cfg.vocab, B * T);
      Tape<float> tape;
      const float want = host.evaluate(tape, b.tokens, b.targets, B);
      const float got = dev.evaluate(b.tokens, b.targets, B);
      INFO("B = ", B, ", T = ", T);
      CHECK(std::abs(got - want) <= 1e-4f * std::abs(want));
    }
  }

  // another variant with the same shapes (3 steps) is refused
  const auto other = cpu_model<float, Leapfrog<3>, Softmax>(cfg, 1);
  CHECK_THROWS_WITH_AS(dev.upload(*other), doctest::Contains("the host model is 'leapfrog' (3 steps)"),
                       coupledqk::invalid_argument);
  GptConfig bigger = cfg;
  bigger.dim = 48;
  const auto wide = cpu_model<float, Leapfrog<1>, Softmax>(bigger, 1);
  CHECK_THROWS_AS(dev.download(*wide), coupledqk::invalid_argument);

  Batch b = random_batch(3, cfg.vocab, kB * kT);
  b.tokens[5] = 64;
  CHECK_THROWS_WITH_AS(dev.loss(b.tokens, b.targets, kB), doctest::Contains("outside the vocabulary"),
                       coupledqk::invalid_argument);
  const Batch long_batch = random_batch(4, cfg.vocab, 2 * (kT + 1));
  CHECK_THROWS_WITH_AS(dev.evaluate(long_batch.tokens, long_batch.targets, 2), doctest::Contains("exceeds the context"),
                       coupledqk::invalid_argument);
  const Batch ok = random_batch(5, cfg.vocab, kB * kT);
  CHECK_THROWS_WITH_AS(dev.loss(ok.tokens, std::vector<std::int32_t>(3, 0), kB), doctest::Contains("3 targets for 72"),
                       coupledqk::invalid_argument);
}

// ---- device support: checked per policy, refused at run time --------------------------------------

/// Softmax's maths under another type: a complete scoring policy without a DeviceScoring.
struct HostOnlyScoring : Softmax {
  static constexpr const char* name = "host-only-scoring";
};

/// A complete integrator policy of no family the device code knows (no DeviceDynamics): newton-euler
/// with a force of its own (the device's velocity kernels take only the default SiluForce).
struct HostOnlyForce : SiluForce {};
struct HostOnlyFlow : NewtonEuler<1, HostOnlyForce> {
  static constexpr const char* name = "host-only-flow";
};
static_assert(CheckIntegrator<HostOnlyFlow>::value);
static_assert(!cuda::DeviceScoring<HostOnlyScoring>::supported && !cuda::has_device_dynamics<HostOnlyFlow>);

/// A consumer's table holding both: it compiles (nothing device-side is instantiated for them).
constexpr VariantTable host_only_variants{
    variant<Identity, HostOnlyScoring>("plain-host-scoring"),
    variant<HostOnlyFlow, Softmax>("host-flow"),
    variant<HostOnlyFlow, HostOnlyScoring>("host-flow-host-scoring"),
};

std::string make_gpt_error(const std::string& name) {
  GptConfig cfg = tiny_config();
  cfg.attention = name;
  cfg.steps = 1;
  try {
    (void)cuda::make_gpt(cfg, cuda::Precision::f32, host_only_variants);
  } catch (const coupledqk::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("cuda gpt: a variant whose integrator or scoring has no device kernels is refused at run time, by name") {
  // Every built-in variant has device kernels (the velocity family's since velocity.cuh).
  for (const std::string& name : builtin_variants.names())
    for (int steps = 1; steps <= max_steps; ++steps) {
      INFO(name, " ", steps);
      CHECK(cuda::variant_supported(name, steps));
    }
  CHECK_FALSE(cuda::variant_supported("nope", 1));
  CHECK_FALSE(cuda::variant_supported("leapfrog", max_steps + 1));

  CHECK_FALSE(cuda::variant_supported(host_only_variants, "plain-host-scoring", 1));
  CHECK_FALSE(cuda::variant_supported(host_only_variants, "host-flow", 1));
  CHECK_FALSE(cuda::variant_supported(host_only_variants, "host-flow-host-scoring", 1));
  const cuda::DeviceSupport scoring_only = cuda::device_support(host_only_variants, "plain-host-scoring");
  CHECK(scoring_only.integrator);
  CHECK_FALSE(scoring_only.scoring);
  const cuda::DeviceSupport flow_only = cuda::device_support(host_only_variants, "host-flow");
  CHECK_FALSE(flow_only.integrator);
  CHECK(flow_only.scoring);
  const cuda::DeviceSupport leapfrog = cuda::device_support("diff-leapfrog", 3);
  CHECK((leapfrog.integrator && leapfrog.scoring && leapfrog.both()));
  CHECK_THROWS_WITH_AS(cuda::device_support(host_only_variants, "nope"), doctest::Contains("unknown attention variant 'nope'"),
                       coupledqk::invalid_argument);

  const std::string scoring = make_gpt_error("plain-host-scoring");
  CHECK(scoring.find("attention 'plain-host-scoring'") != std::string::npos);
  CHECK(scoring.find("its scoring 'host-only-scoring' has no device kernels") != std::string::npos);
  CHECK(scoring.find("its integrator") == std::string::npos);
  const std::string flow = make_gpt_error("host-flow");
  CHECK(flow.find("attention 'host-flow'") != std::string::npos);
  CHECK(flow.find("its integrator 'host-only-flow' has no device kernels") != std::string::npos);
  CHECK(flow.find("its scoring") == std::string::npos);
  const std::string both = make_gpt_error("host-flow-host-scoring");
  CHECK(both.find("its integrator 'host-only-flow'") != std::string::npos);
  CHECK(both.find("its scoring 'host-only-scoring'") != std::string::npos);
}
#endif

#ifdef COUPLEDQK_TEST_DEVICE_TRAINER
TEST_CASE("cuda trainer (coupledqk-train --device cuda): registry models, host <-> device, steps") {
  using namespace coupledqk::train;
  CHECK(cuda_unavailable_reason().empty());
  const GptConfig cfg = tiny_config();
  // (the CPU model by type, compiled once: make_gpt<float> would compile the whole table into this test)
  auto host = cpu_model<float, Leapfrog<2>, Differential>(cfg, 3);
  REQUIRE(host->config().attention == "diff-leapfrog");
  AdamWConfig oc;
  oc.lr = 1e-3;
  oc.total_steps = 5;
  coupledqk::AdamW<float> opt(host->parameters(), host->gradients(), oc);
  for (const char* precision : {"f32", "bf16"}) {
    INFO("precision ", precision);
    auto dev = make_cuda_trainer(host->config(), precision);
    CHECK(dev->description().find(std::string(precision) == "bf16" ? "bf16" : "float32") != std::string::npos);
    dev->from_host(*host, &opt);
    const Batch b = random_batch(8, cfg.vocab, kB * kT);
    Tape<float> tape;
    host->zero_grad();
    const float want = host->loss(tape, b.tokens, b.targets, kB);
    const float got = dev->step_loss(b.tokens, b.targets, kB);
    CHECK(std::abs(got - want) <= (std::string(precision) == "bf16" ? 2e-2 : 1e-4) * std::abs(want));
    CHECK(std::abs(dev->evaluate(b.tokens, b.targets, kB) - got) <= 1e-5f * std::abs(got));
    const StepReport r = dev->optimizer_step();
    CHECK(r.step == 1);
    auto back = cpu_model<float, Leapfrog<2>, Differential>(cfg, 99);
    coupledqk::AdamW<float> opt_back(back->parameters(), back->gradients(), oc);
    dev->to_host(*back, opt_back);
    CHECK(opt_back.steps_done() == 1);
    CHECK(flat_all(back->parameters()) != flat_all(host->parameters()));  // one update was taken
  }
  GptConfig bad = host->config();
  bad.attention = "nope";
  CHECK_THROWS_WITH_AS(make_cuda_trainer(bad, "f32"), doctest::Contains("unknown attention variant 'nope'"),
                       coupledqk::invalid_argument);
  CHECK_THROWS_WITH_AS(make_cuda_trainer(host->config(), "fp8"), doctest::Contains("unknown precision 'fp8'"),
                       coupledqk::invalid_argument);
}
#endif
