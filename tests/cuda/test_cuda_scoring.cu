// Parity of the CUDA scoring policies (cuda/include/coupledqk/cuda/scoring.cuh, flash.cuh) with the
// CPU reference (coupledqk::Softmax / coupledqk::Differential on the reference path, in double):
// forward o and backward dq, dk, dv, dparams, for float and bf16 storage (bf16 takes the tensor-core
// kernels where they apply); determinism and accumulation of dparams; causality; the flash kernels
// on their own (FMA and tensor-core) with uneven widths and padded strides, against a naive double
// reference; errors for unsupported widths.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <coupledqk/cuda/flash.cuh>
#include <coupledqk/cuda/scoring.cuh>
#include <coupledqk/scoring/differential.hpp>
#include <coupledqk/scoring/softmax.hpp>

#include "cuda_test_support.cuh"

namespace {

using coupledqk::Index;
using coupledqk::Matrix;
using coupledqk::cuda::bf16;
using coupledqk::cuda::DeviceBuffer;
namespace cq = coupledqk::cuda;
namespace ct = coupledqk::cuda::testing;

struct Shape {
  Index batch, seq, heads, head_dim;
};
// T = 150, 257, 100: not multiples of the 64-row tiles; T = 1: a single visible key.
const Shape kShapes[] = {{2, 1, 2, 16}, {2, 150, 4, 32}, {1, 257, 2, 64}, {3, 64, 8, 64}, {1, 100, 2, 128}};

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-4 : coupledqk::cuda::testing::bf16_tolerance();
}
template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "bf16";
}

/// What the device holds: x rounded to storage T and back.
template <class T>
std::vector<float> stored(const std::vector<float>& x) {
  return ct::to_host(ct::to_device<T>(x));
}

Matrix<double> to_matrix(const std::vector<float>& v, Index rows, Index cols) {
  REQUIRE(v.size() == static_cast<std::size_t>(rows * cols));
  Matrix<double> m(rows, cols);
  for (Index i = 0; i < rows * cols; ++i) m.data()[i] = v[static_cast<std::size_t>(i)];
  return m;
}
template <class Dense>
std::vector<float> to_floats(const Dense& m) {
  std::vector<float> v(static_cast<std::size_t>(m.size()));
  for (Index i = 0; i < m.size(); ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(m.data()[i]);
  return v;
}

// ---- CPU reference --------------------------------------------------------------------------------

struct Reference {
  std::vector<float> o, dq, dk, dv;
  std::vector<std::string> names;           // the parameter tensors, in visit order
  std::vector<std::vector<float>> dparams;  // their gradients
};

/// The CPU scoring on its reference path in double; mask and seqs as the shape's (seqs null: B
/// equal sequences of s.seq rows).
template <class Scoring>
Reference reference(const Shape& s, int layer_index, const std::vector<float>& params, const std::vector<float>& q,
                    const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_o,
                    const coupledqk::Mask& mask = {}, const coupledqk::Sequences* seqs = nullptr) {
  using Params = typename Scoring::template parameters<double>;
  coupledqk::ScoringShape sh{s.batch, s.seq, s.heads, s.head_dim, layer_index, /*reference=*/true, mask};
  if (seqs && seqs->layout() != coupledqk::SequenceLayout::equal) sh.sequences = seqs;
  coupledqk::Rng rng(7);
  Params p = Scoring::template make_parameters<double>(sh, rng);  // the shapes; values replaced below
  std::size_t off = 0;
  p.visit([&](const char*, auto& t) {
    for (Index i = 0; i < t.size(); ++i) t.data()[i] = params.at(off++);
  });
  REQUIRE(off == params.size());

  const Index R = seqs ? seqs->rows() : s.batch * s.seq, D = s.heads * s.head_dim;
  const Matrix<double> Q = to_matrix(q, R, D), K = to_matrix(k, R, D), V = to_matrix(v, R, D);
  const Matrix<double> dO = to_matrix(d_o, R, D);
  Matrix<double> O, dQ, dK, dV;
  typename Scoring::template saved<double> keep;
  Scoring::template forward<double>(p, sh, Q, K, V, O, &keep);
  Params grad = coupledqk::zeros_like(p);
  Scoring::template backward<double>(p, sh, Q, K, V, O, keep, dO, dQ, dK, dV, grad);

  Reference r{to_floats(O), to_floats(dQ), to_floats(dK), to_floats(dV), {}, {}};
  grad.visit([&](const char* name, const auto& t) {
    r.names.push_back(name);
    r.dparams.push_back(to_floats(t));
  });
  return r;
}

/// lq*, lk* ~ N(0, 0.1^2) [d] each, subln ~ 1 + N(0, 0.1^2) [2d]; nothing for Softmax.
template <class Scoring>
std::vector<float> random_parameters(Index head_dim, std::uint64_t seed) {
  const Index n = cq::DeviceScoring<Scoring>::parameter_count(head_dim);
  if (n == 0) return {};
  REQUIRE(n == 6 * head_dim);
  std::vector<float> p = ct::random_vector(static_cast<std::size_t>(n), seed, 0.1);
  for (Index i = 4 * head_dim; i < n; ++i) p[static_cast<std::size_t>(i)] += 1.0f;
  return p;
}

// ---- parity ---------------------------------------------------------------------------------------------

template <class Scoring, class T>
void check_parity(const Shape& s, int layer_index, std::uint64_t seed) {
  using DS = cq::DeviceScoring<Scoring>;
  INFO(Scoring::name, " ", type_name<T>(), ": B = ", s.batch, ", T = ", s.seq, ", H = ", s.heads,
       ", d = ", s.head_dim, ", layer_index = ", layer_index);
  const Index R = s.batch * s.seq, D = s.heads * s.head_dim, n = R * D;
  const std::size_t un = static_cast<std::size_t>(n);
  const double tol = tolerance<T>();

  const std::vector<float> params = random_parameters<Scoring>(s.head_dim, seed + 10);
  const std::size_t np = params.size();
  DeviceBuffer<T> q = ct::to_device<T>(ct::random_vector(un, seed + 1));
  DeviceBuffer<T> k = ct::to_device<T>(ct::random_vector(un, seed + 2));
  DeviceBuffer<T> v = ct::to_device<T>(ct::random_vector(un, seed + 3));
  const std::vector<float> d_o_host = ct::random_vector(un, seed + 4);
  DeviceBuffer<float> d_o = ct::to_device<float>(d_o_host);
  DeviceBuffer<float> p_dev = ct::to_device<float>(params);

  // the reference takes exactly what the device holds (bf16-rounded inputs for bf16)
  const Reference ref =
      reference<Scoring>(s, layer_index, params, ct::to_host(q), ct::to_host(k), ct::to_host(v), d_o_host);

  const cq::ScoringDims dims{s.batch, s.seq, s.heads, s.head_dim, layer_index};
  typename DS::template Saved<T> saved;
  DeviceBuffer<T> o = ct::poisoned<T>(un);
  DS::template forward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o.data(), &saved, nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o_host = ct::to_host(o);
  CHECK(ct::relative_error(o_host, ref.o) <= tol);

  DeviceBuffer<float> dq = ct::poisoned<float>(un), dk = ct::poisoned<float>(un), dv = ct::poisoned<float>(un);
  DeviceBuffer<float> dparams(np);
  dparams.zero();
  DS::template backward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o.data(), saved, d_o.data(), dq.data(),
                           dk.data(), dv.data(), dparams.data(), nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> dq1 = ct::to_host(dq), dk1 = ct::to_host(dk), dv1 = ct::to_host(dv);
  // dq, dk vanish exactly when every row sees one key (T = 1: dS = P (dP - D) = dP - dP), and the
  // device's dP - D is a difference of two float sums in different orders: measure them against at
  // least a tenth of the scale of dv (the same order as dq, dk whenever they do not vanish).
  double dv_scale = 0;
  for (float x : ref.dv) dv_scale = std::max(dv_scale, std::abs(double(x)));
  CHECK(ct::relative_error(dq1, ref.dq, 1e-1 * dv_scale) <= tol);
  CHECK(ct::relative_error(dk1, ref.dk, 1e-1 * dv_scale) <= tol);
  CHECK(ct::relative_error(dv1, ref.dv) <= tol);
  // dparams: the flat block relative to its largest reference entry, and subln on its own. lq*, lk*
  // are not held to the tolerance on their own scale: their gradient is d lambda exp(.) times the
  // other vector, and d lambda = -sum(dA . O2) is ill-conditioned -- RMSNorm is scale-invariant,
  // so sum(dA . A) = 0, and as O1 and O2 align (exactly at T = 1, where both are v_0) d lambda
  // cancels down to the round-off of its terms (and, in bf16, of the stored O1, O2).
  const std::vector<float> dp1 = ct::to_host(dparams);
  std::vector<float> dp_ref;
  for (std::size_t t = 0; t < ref.dparams.size(); ++t) {
    if (ref.names[t] == "subln") {
      const std::vector<float> got(dp1.begin() + static_cast<std::ptrdiff_t>(dp_ref.size()),
                                   dp1.begin() + static_cast<std::ptrdiff_t>(dp_ref.size() + ref.dparams[t].size()));
      INFO("parameter subln");
      CHECK(ct::relative_error(got, ref.dparams[t]) <= tol);
    }
    dp_ref.insert(dp_ref.end(), ref.dparams[t].begin(), ref.dparams[t].end());
  }
  REQUIRE(dp_ref.size() == np);
  CHECK(ct::relative_error(dp1, dp_ref) <= tol);

  // Once more on fresh poison: dq, dk, dv are bitwise the same (no atomics, fixed reduction order),
  // and dparams accumulates (+=), here to twice the gradient.
  dq.poison();
  dk.poison();
  dv.poison();
  DS::template backward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o.data(), saved, d_o.data(), dq.data(),
                           dk.data(), dv.data(), dparams.data(), nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ct::to_host(dq) == dq1);
  CHECK(ct::to_host(dk) == dk1);
  CHECK(ct::to_host(dv) == dv1);
  const std::vector<float> dp2 = ct::to_host(dparams);
  for (std::size_t i = 0; i < np; ++i) CHECK(dp2[i] == 2.0f * dp1[i]);

  // Inference (no Saved) gives the same output.
  DeviceBuffer<T> o2 = ct::poisoned<T>(un);
  DS::template forward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o2.data(), nullptr, nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ct::to_host(o2) == o_host);
}

template <class Scoring, class T>
void check_all_shapes() {
  std::uint64_t seed = 1000;
  for (const Shape& s : kShapes)
    for (int layer_index : {0, 3}) {
      check_parity<Scoring, T>(s, layer_index, seed);
      seed += 100;
    }
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("DeviceScoring<Softmax> matches the CPU reference, float storage") {
  check_all_shapes<coupledqk::Softmax, float>();
}
#endif
TEST_CASE("DeviceScoring<Softmax> matches the CPU reference, bf16 storage") {
  check_all_shapes<coupledqk::Softmax, bf16>();
}
#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("DeviceScoring<Differential> matches the CPU reference, float storage") {
  check_all_shapes<coupledqk::Differential, float>();
}
#endif
TEST_CASE("DeviceScoring<Differential> matches the CPU reference, bf16 storage") {
  check_all_shapes<coupledqk::Differential, bf16>();
}

// ---- causality ------------------------------------------------------------------------------------------

template <class Scoring, class T>
void check_causality() {
  using DS = cq::DeviceScoring<Scoring>;
  const Shape s{2, 150, 4, 32};
  const Index D = s.heads * s.head_dim, n = s.batch * s.seq * D;
  const std::size_t un = static_cast<std::size_t>(n);
  const cq::ScoringDims dims{s.batch, s.seq, s.heads, s.head_dim, 2};
  DeviceBuffer<float> p_dev = ct::to_device<float>(random_parameters<Scoring>(s.head_dim, 5));
  const std::vector<float> q0 = ct::random_vector(un, 11), k0 = ct::random_vector(un, 12), v0 = ct::random_vector(un, 13);

  auto run = [&](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
    DeviceBuffer<T> qd = ct::to_device<T>(q), kd = ct::to_device<T>(k), vd = ct::to_device<T>(v);
    DeviceBuffer<T> o = ct::poisoned<T>(un);
    DS::template forward<T>(dims, p_dev.data(), qd.data(), kd.data(), vd.data(), o.data(), nullptr, nullptr);
    COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
    return ct::to_host(o);
  };
  const std::vector<float> base = run(q0, k0, v0);
  for (Index t0 : {Index(0), Index(63), Index(64), Index(100)}) {
    INFO(Scoring::name, " ", type_name<T>(), ": tokens after t = ", t0, " changed");
    std::vector<float> q = q0, k = k0, v = v0;
    const std::vector<float> noise = ct::random_vector(un, 100 + static_cast<std::uint64_t>(t0));
    for (Index b = 0; b < s.batch; ++b)
      for (Index t = t0 + 1; t < s.seq; ++t)
        for (Index c = 0; c < D; ++c) {
          const std::size_t i = static_cast<std::size_t>((b * s.seq + t) * D + c);
          q[i] += noise[i];
          k[i] -= noise[i];
          v[i] += 2.0f * noise[i];
        }
    const std::vector<float> changed = run(q, k, v);
    bool past_same = true, future_differs = false;
    for (Index b = 0; b < s.batch; ++b)
      for (Index t = 0; t < s.seq; ++t)
        for (Index c = 0; c < D; ++c) {
          const std::size_t i = static_cast<std::size_t>((b * s.seq + t) * D + c);
          if (t <= t0 && !(changed[i] == base[i])) past_same = false;
          if (t > t0 && changed[i] != base[i]) future_differs = true;
        }
    CHECK(past_same);
    CHECK(future_differs);
  }
}

TEST_CASE("device scoring is causal: rows <= t do not change when later tokens do") {
#if COUPLEDQK_TEST_FLOAT_CASES
  check_causality<coupledqk::Softmax, float>();
#endif
  check_causality<coupledqk::Softmax, bf16>();
#if COUPLEDQK_TEST_FLOAT_CASES
  check_causality<coupledqk::Differential, float>();
#endif
  check_causality<coupledqk::Differential, bf16>();
}

// ---- masks and sequences ------------------------------------------------------------------------------

using coupledqk::SequenceLayout;

/// A mask and a layout of the rows (include/coupledqk/scoring/mask.hpp); the windows cut and skip
/// 64-row tiles at T = 150, the sequences start off the tiles when packed.
struct MaskCase {
  const char* name;
  coupledqk::Mask mask;
  SequenceLayout layout;
};
const MaskCase kMaskCases[] = {
    {"causal", {true, 0}, SequenceLayout::equal},
    {"bidirectional", {false, 0}, SequenceLayout::equal},
    {"causal, window 40", {true, 40}, SequenceLayout::equal},
    {"bidirectional, window 40", {false, 40}, SequenceLayout::equal},
    {"causal, padded", {true, 0}, SequenceLayout::padded},
    {"bidirectional, window 20, padded", {false, 20}, SequenceLayout::padded},
    {"bidirectional, packed", {false, 0}, SequenceLayout::packed},
    {"causal, window 30, packed", {true, 30}, SequenceLayout::packed},
};

/// B sequences of lengths T, 37, 1, 90, ... (at most T): padded to T, packed (the longest one
/// second, so that the others start off the tiles) or, equal, all T long.
coupledqk::Sequences sequences_of(const Shape& s, SequenceLayout layout) {
  const Index some[] = {s.seq, 37, 1, 90};
  std::vector<Index> lengths;
  for (Index b = 0; b < s.batch; ++b) lengths.push_back(std::min(s.seq, some[b % 4]));
  if (layout == SequenceLayout::padded) return coupledqk::Sequences::padded(s.seq, lengths);
  if (layout == SequenceLayout::packed) {
    if (lengths.size() > 1) std::swap(lengths[0], lengths[1]);
    std::vector<Index> offsets{0};
    for (Index n : lengths) offsets.push_back(offsets.back() + n);
    return coupledqk::Sequences::packed(offsets);
  }
  return coupledqk::Sequences::equal(s.batch, s.seq);
}

/// Whether row r of a layout is padding.
bool is_padding(const coupledqk::Sequences& seqs, Index r) {
  if (seqs.layout() != SequenceLayout::padded) return false;
  return r % seqs.seq() >= seqs.length(r / seqs.seq());
}

template <class Scoring, class T>
void check_masked(const Shape& s, const MaskCase& mc, std::uint64_t seed) {
  using DS = cq::DeviceScoring<Scoring>;
  const coupledqk::Sequences seqs = sequences_of(s, mc.layout);
  INFO(std::string(Scoring::name), " ", std::string(type_name<T>()), ", ", std::string(mc.name), ": B = ", s.batch, ", T = ", s.seq, ", H = ", s.heads,
       ", d = ", s.head_dim);
  const Index R = seqs.rows(), D = s.heads * s.head_dim;
  const std::size_t un = static_cast<std::size_t>(R * D);
  const double tol = tolerance<T>();
  const int layer_index = 1;

  const std::vector<float> params = random_parameters<Scoring>(s.head_dim, seed + 10);
  DeviceBuffer<float> p_dev = ct::to_device<float>(params.empty() ? std::vector<float>{0.0f} : params);
  const std::vector<float> q0 = ct::random_vector(un, seed + 1), k0 = ct::random_vector(un, seed + 2),
                           v0 = ct::random_vector(un, seed + 3), d_o0 = ct::random_vector(un, seed + 4);

  cq::DeviceSequences device_seqs;
  device_seqs.set(seqs, nullptr);
  cq::ScoringDims dims{seqs.batch(), seqs.seq(), s.heads, s.head_dim, layer_index};
  dims.mask = device_seqs.mask(mc.mask);
  struct Run {
    std::vector<float> o, dq, dk, dv, dparams;
  };
  auto run = [&](const std::vector<float>& qh, const std::vector<float>& kh, const std::vector<float>& vh,
                 const std::vector<float>& d_oh) {
    DeviceBuffer<T> q = ct::to_device<T>(qh), k = ct::to_device<T>(kh), v = ct::to_device<T>(vh);
    DeviceBuffer<float> d_o = ct::to_device<float>(d_oh);
    typename DS::template Saved<T> saved;
    DeviceBuffer<T> o = ct::poisoned<T>(un);
    DS::template forward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o.data(), &saved, nullptr);
    DeviceBuffer<float> dq = ct::poisoned<float>(un), dk = ct::poisoned<float>(un), dv = ct::poisoned<float>(un);
    DeviceBuffer<float> dparams(p_dev.size());
    dparams.zero();
    DS::template backward<T>(dims, p_dev.data(), q.data(), k.data(), v.data(), o.data(), saved, d_o.data(),
                             dq.data(), dk.data(), dv.data(), dparams.data(), nullptr);
    COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
    return Run{ct::to_host(o), ct::to_host(dq), ct::to_host(dk), ct::to_host(dv), ct::to_host(dparams)};
  };
  const Run got = run(q0, k0, v0, d_o0);
  const Reference ref = reference<Scoring>(s, layer_index, params, stored<T>(q0), stored<T>(k0), stored<T>(v0),
                                           d_o0, mc.mask, &seqs);
  CHECK(ct::relative_error(got.o, ref.o) <= tol);
  double dv_scale = 0;
  for (float x : ref.dv) dv_scale = std::max(dv_scale, std::abs(double(x)));
  CHECK(ct::relative_error(got.dq, ref.dq, 1e-1 * dv_scale) <= tol);
  CHECK(ct::relative_error(got.dk, ref.dk, 1e-1 * dv_scale) <= tol);
  CHECK(ct::relative_error(got.dv, ref.dv) <= tol);
  std::vector<float> dp_ref;
  for (const auto& t : ref.dparams) dp_ref.insert(dp_ref.end(), t.begin(), t.end());
  if (!dp_ref.empty()) CHECK(ct::relative_error(got.dparams, dp_ref) <= tol);

  if (seqs.layout() != SequenceLayout::padded) return;
  // Padding rows: output exactly 0, gradients exactly 0, and nothing depends on what they hold.
  bool zero = true;
  for (Index r = 0; r < R; ++r)
    for (Index c = 0; c < D; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * D + c);
      if (is_padding(seqs, r) && (got.o[i] != 0.0f || got.dq[i] != 0.0f || got.dk[i] != 0.0f || got.dv[i] != 0.0f))
        zero = false;
    }
  CHECK(zero);
  std::vector<float> q1 = q0, k1 = k0, v1 = v0, d_o1 = d_o0;
  const std::vector<float> noise = ct::random_vector(un, seed + 5, 3.0);
  for (Index r = 0; r < R; ++r)
    if (is_padding(seqs, r))
      for (Index c = 0; c < D; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * D + c);
        q1[i] += noise[i];
        k1[i] -= noise[i];
        v1[i] *= 2.0f;
        d_o1[i] += noise[i];
      }
  const Run other = run(q1, k1, v1, d_o1);
  CHECK(other.o == got.o);
  CHECK(other.dq == got.dq);
  CHECK(other.dk == got.dk);
  CHECK(other.dv == got.dv);
  CHECK(other.dparams == got.dparams);
}

// d = 32: bf16 on the tensor-core kernels for both scorings; d = 128: Differential's values are
// 256 wide, so bf16 takes the FMA kernels with 32-row key tiles.
template <class Scoring, class T>
void check_masked_all() {
  std::uint64_t seed = 5000;
  for (const Shape& s : {Shape{3, 150, 4, 32}, Shape{2, 100, 2, 128}})
    for (const MaskCase& mc : kMaskCases) check_masked<Scoring, T>(s, mc, seed += 100);
}

TEST_CASE("masks and sequences: DeviceScoring<Softmax> matches the CPU reference, float and bf16 storage") {
#if COUPLEDQK_TEST_FLOAT_CASES
  check_masked_all<coupledqk::Softmax, float>();
#endif
  check_masked_all<coupledqk::Softmax, bf16>();
}
TEST_CASE("masks and sequences: DeviceScoring<Differential> matches the CPU reference, float and bf16 storage") {
#if COUPLEDQK_TEST_FLOAT_CASES
  check_masked_all<coupledqk::Differential, float>();
#endif
  check_masked_all<coupledqk::Differential, bf16>();
}

// A window skips the key tiles none of a query tile's rows reach: with T = 150 and w = 20 the last
// query tile (rows 128..149) starts reading at key 109, so key tile 0 (rows 0..63) is never loaded
// for it, in the forward and in dQ. NaN there leaves those rows finite (a visited tile would spread
// it: its masked entries still multiply V by 0), while the rows that do read tile 0 turn NaN.
template <class T>
void check_window_skips_tiles(bool causal) {
  using DS = cq::DeviceScoring<coupledqk::Softmax>;
  const Shape s{1, 150, 2, 32};
  const Index D = s.heads * s.head_dim, R = s.seq;
  const std::size_t un = static_cast<std::size_t>(R * D);
  INFO(std::string(type_name<T>()), causal ? " causal" : " bidirectional", ", window 20");
  std::vector<float> qh = ct::random_vector(un, 71), kh = ct::random_vector(un, 72), vh = ct::random_vector(un, 73);
  for (std::size_t i = 0; i < static_cast<std::size_t>(64 * D); ++i) kh[i] = vh[i] = NAN;
  DeviceBuffer<T> q = ct::to_device<T>(qh), k = ct::to_device<T>(kh), v = ct::to_device<T>(vh);
  DeviceBuffer<float> d_o = ct::to_device<float>(ct::random_vector(un, 74)), dummy = ct::to_device<float>({0.0f});
  cq::ScoringDims dims{1, s.seq, s.heads, s.head_dim, 0};
  dims.mask.causal = causal;
  dims.mask.window = 20;
  typename DS::template Saved<T> saved;
  DeviceBuffer<T> o = ct::poisoned<T>(un);
  DS::template forward<T>(dims, nullptr, q.data(), k.data(), v.data(), o.data(), &saved, nullptr);
  DeviceBuffer<float> dq = ct::poisoned<float>(un), dk = ct::poisoned<float>(un), dv = ct::poisoned<float>(un);
  DS::template backward<T>(dims, nullptr, q.data(), k.data(), v.data(), o.data(), saved, d_o.data(), dq.data(),
                           dk.data(), dv.data(), dummy.data(), nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> oh = ct::to_host(o), dqh = ct::to_host(dq);
  bool last_tile_finite = true, first_tile_nan = false;
  for (Index r = 0; r < R; ++r)
    for (Index c = 0; c < D; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * D + c);
      if (r >= 128 && !(std::isfinite(oh[i]) && std::isfinite(dqh[i]))) last_tile_finite = false;
      if (r < 64 && std::isnan(oh[i])) first_tile_nan = true;
    }
  CHECK(last_tile_finite);
  CHECK(first_tile_nan);
}

TEST_CASE("masks: a window skips the key tiles its query tile does not reach (forward and dQ)") {
  for (bool causal : {true, false}) {
#if COUPLEDQK_TEST_FLOAT_CASES
    check_window_skips_tiles<float>(causal);
#endif
    check_window_skips_tiles<bf16>(causal);
  }
}

// ---- the flash kernels on their own: uneven widths, padded strides, lse -----------------------------------

using Kernels = cq::flash_detail::Kernels;

const char* kernels_name(Kernels k) {
  return k == Kernels::fma ? "FMA kernels" : k == Kernels::tensor_cores ? "tensor-core kernels" : "automatic";
}

template <class T>
void check_flash_layout(Index dqk, Index dvw, Kernels kernels) {
  INFO(type_name<T>(), ", ", kernels_name(kernels), ": dqk = ", dqk, ", dv = ", dvw);
  constexpr Index B = 2, L = 77, H = 3;
  cq::FlashLayout l;
  l.batch = B, l.seq = L, l.heads = H, l.dqk = dqk, l.dv = dvw;
  l.q_row = H * dqk + 8, l.q_head = dqk;            // padded rows
  l.k_row = H * (dqk + 3), l.k_head = dqk + 3;      // padded heads
  l.v_row = H * dvw + 5, l.v_head = dvw;
  l.o_row = H * (dvw + 2) + 1, l.o_head = dvw + 2;
  l.scale = 0.3f;
  const std::size_t nq = static_cast<std::size_t>(B * L * l.q_row), nk = static_cast<std::size_t>(B * L * l.k_row),
                    nv = static_cast<std::size_t>(B * L * l.v_row), no = static_cast<std::size_t>(B * L * l.o_row),
                    nl = static_cast<std::size_t>(B * H * L);
  DeviceBuffer<T> q = ct::to_device<T>(ct::random_vector(nq, 31)), k = ct::to_device<T>(ct::random_vector(nk, 32)),
                  v = ct::to_device<T>(ct::random_vector(nv, 33));
  const std::vector<float> d_o_host = ct::random_vector(no, 34);
  DeviceBuffer<float> d_o = ct::to_device<float>(d_o_host);
  DeviceBuffer<T> o = ct::poisoned<T>(no);
  DeviceBuffer<float> lse = ct::poisoned<float>(nl), dq = ct::poisoned<float>(nq), dk = ct::poisoned<float>(nk),
                      dv = ct::poisoned<float>(nv);
  cq::flash_detail::forward<T>(l, q.data(), k.data(), v.data(), o.data(), lse.data(), kernels, nullptr);
  cq::flash_detail::backward<T>(l, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(), dq.data(),
                                dk.data(), dv.data(), /*accumulate_dv=*/false, kernels, nullptr);
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> qh = ct::to_host(q), kh = ct::to_host(k), vh = ct::to_host(v);

  // naive double reference over the covered elements, gathered into dense vectors
  std::vector<float> o_ref, o_got, lse_ref, lse_got, dq_ref, dq_got, dk_ref, dk_got, dv_ref, dv_got;
  const std::vector<float> oh = ct::to_host(o), lh = ct::to_host(lse), dqh = ct::to_host(dq), dkh = ct::to_host(dk),
                           dvh = ct::to_host(dv);
  auto at = [](Index b, Index t, Index h, Index i, Index row, Index head) {
    return static_cast<std::size_t>((b * L + t) * row + h * head + i);
  };
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      Matrix<double> P = Matrix<double>::Zero(L, L), dP = Matrix<double>::Zero(L, L);
      Matrix<double> O = Matrix<double>::Zero(L, dvw);
      for (Index t = 0; t < L; ++t) {
        double mx = -INFINITY;
        for (Index j = 0; j <= t; ++j) {
          double s = 0;
          for (Index i = 0; i < dqk; ++i) s += double(qh[at(b, t, h, i, l.q_row, l.q_head)]) * kh[at(b, j, h, i, l.k_row, l.k_head)];
          P(t, j) = l.scale * s;
          mx = std::max(mx, P(t, j));
        }
        double sum = 0;
        for (Index j = 0; j <= t; ++j) sum += std::exp(P(t, j) - mx);
        const double lse_t = mx + std::log(sum);
        for (Index j = 0; j <= t; ++j) P(t, j) = std::exp(P(t, j) - lse_t);
        lse_ref.push_back(static_cast<float>(lse_t));
        lse_got.push_back(lh[static_cast<std::size_t>((b * H + h) * L + t)]);
        for (Index c = 0; c < dvw; ++c) {
          for (Index j = 0; j <= t; ++j) O(t, c) += P(t, j) * vh[at(b, j, h, c, l.v_row, l.v_head)];
          o_ref.push_back(static_cast<float>(O(t, c)));
          o_got.push_back(oh[at(b, t, h, c, l.o_row, l.o_head)]);
        }
      }
      // dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO
      for (Index t = 0; t < L; ++t) {
        double delta = 0;
        for (Index j = 0; j <= t; ++j) {
          for (Index c = 0; c < dvw; ++c)
            dP(t, j) += double(d_o_host[at(b, t, h, c, l.o_row, l.o_head)]) * vh[at(b, j, h, c, l.v_row, l.v_head)];
          delta += P(t, j) * dP(t, j);
        }
        for (Index j = 0; j <= t; ++j) dP(t, j) = l.scale * P(t, j) * (dP(t, j) - delta);
      }
      for (Index t = 0; t < L; ++t) {
        for (Index i = 0; i < dqk; ++i) {
          double gq = 0, gk = 0;
          for (Index j = 0; j <= t; ++j) gq += dP(t, j) * kh[at(b, j, h, i, l.k_row, l.k_head)];
          for (Index r = t; r < L; ++r) gk += dP(r, t) * qh[at(b, r, h, i, l.q_row, l.q_head)];
          dq_ref.push_back(static_cast<float>(gq));
          dq_got.push_back(dqh[at(b, t, h, i, l.q_row, l.q_head)]);
          dk_ref.push_back(static_cast<float>(gk));
          dk_got.push_back(dkh[at(b, t, h, i, l.k_row, l.k_head)]);
        }
        for (Index c = 0; c < dvw; ++c) {
          double g = 0;
          for (Index r = t; r < L; ++r) g += P(r, t) * d_o_host[at(b, r, h, c, l.o_row, l.o_head)];
          dv_ref.push_back(static_cast<float>(g));
          dv_got.push_back(dvh[at(b, t, h, c, l.v_row, l.v_head)]);
        }
      }
    }
  const double tol = tolerance<T>();
  CHECK(ct::relative_error(o_got, o_ref) <= tol);
  CHECK(ct::relative_error(lse_got, lse_ref) <= tol);
  CHECK(ct::relative_error(dq_got, dq_ref) <= tol);
  CHECK(ct::relative_error(dk_got, dk_ref) <= tol);
  CHECK(ct::relative_error(dv_got, dv_ref) <= tol);
}

TEST_CASE("flash kernels: uneven widths, padded strides, lse; FMA and tensor-core kernels") {
  for (auto [dqk, dvw] : {std::pair<Index, Index>{40, 72}, {8, 200}, {128, 3}, {1, 1}, {64, 128}}) {
#if COUPLEDQK_TEST_FLOAT_CASES
    check_flash_layout<float>(dqk, dvw, Kernels::automatic);
#endif
    check_flash_layout<bf16>(dqk, dvw, Kernels::fma);
    // the tensor-core kernels take values up to 128 wide (sm_80+, which the CUDA tests build for)
    if (dvw <= 128) check_flash_layout<bf16>(dqk, dvw, Kernels::tensor_cores);
  }
}

// ---- errors ---------------------------------------------------------------------------------------------

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("unsupported head widths are rejected with a message naming the value") {
  DeviceBuffer<float> buf(4096);
  for (Index bad : {Index(0), Index(200)}) {
    cq::FlashLayout l;
    l.batch = 1, l.seq = 4, l.heads = 1, l.dqk = bad, l.dv = 16;
    l.q_row = l.k_row = l.v_row = l.o_row = 256;
    const std::string m = message_of([&] {
      cq::flash_forward<float>(l, buf.data(), buf.data(), buf.data(), buf.data(), buf.data());
    });
    INFO(m);
    CHECK(m.find("dqk = " + std::to_string(bad)) != std::string::npos);
    CHECK(m.find("128") != std::string::npos);  // what is accepted

    const cq::ScoringDims dims{1, 4, 2, bad, 0};
    for (const std::string& sm :
         {message_of([&] {
            cq::DeviceScoring<coupledqk::Softmax>::forward<float>(dims, nullptr, buf.data(), buf.data(), buf.data(),
                                                                  buf.data(), nullptr, nullptr);
          }),
          message_of([&] {
            cq::DeviceScoring<coupledqk::Differential>::forward<float>(dims, buf.data(), buf.data(), buf.data(),
                                                                       buf.data(), buf.data(), nullptr, nullptr);
          })}) {
      INFO(sm);
      CHECK(sm.find("head_dim = " + std::to_string(bad)) != std::string::npos);
    }
  }
  cq::FlashLayout l;
  l.batch = 1, l.seq = 4, l.heads = 1, l.dqk = 16, l.dv = 300;
  l.q_row = l.k_row = l.v_row = l.o_row = 512;
  const std::string m = message_of([&] {
    cq::flash_backward<float>(l, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                              buf.data(), buf.data());
  });
  INFO(m);
  CHECK(m.find("dv = 300") != std::string::npos);
  const cq::ScoringDims odd{1, 4, 3, 16, 0};
  CHECK(message_of([&] {
          cq::DeviceScoring<coupledqk::Differential>::forward<float>(odd, buf.data(), buf.data(), buf.data(),
                                                                     buf.data(), buf.data(), nullptr, nullptr);
        }).find("heads = 3") != std::string::npos);
}
#endif

}  // namespace
