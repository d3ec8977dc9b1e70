// Parity of the fused device dynamics (cuda/include/coupledqk/cuda/dynamics.cuh) with the CPU
// policies run in double: forward q', k' and backward dq, dk, dparams, drho, for every policy,
// several shapes, float and bf16 storage. Device outputs start poisoned (NaN); dparams and drho start
// at small random values, so the test also checks that the backward adds (+=) into them.
#include "cuda_test_support.cuh"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <coupledqk/cuda/dynamics.cuh>
#include <coupledqk/integrators/leapfrog.hpp>
#include <coupledqk/integrators/velocity.hpp>

#include "../../examples/forest_ruth.hpp"

// ---- compile-time: which policies have device dynamics -------------------------------------------
namespace dynamics_test {

namespace cq = coupledqk;
using cq::cuda::has_device_dynamics;

// A complete policy the device code does not know (not a splitting, not Euler, not Uncoupled).
struct NotAPolicyWeKnow {
  static constexpr int steps = 1;
  static constexpr int order = 1;
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = false;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "custom";
  template <class S>
  using parameters = cq::HamiltonianParameters<S>;
  // A complete CPU policy (CheckIntegrator checks these signatures) that the device knows nothing of.
  template <class S>
  static parameters<S> make_parameters(const cq::DynamicsShape& shape, cq::Rng& rng) {
    return parameters<S>(shape, rng);
  }
  template <class S>
  static void forward(const parameters<S>&, const cq::Vector<S>&, cq::MatrixRef<S>, cq::MatrixRef<S>,
                      cq::StateTrace<S>*, cq::DynamicsMemory) {}
  template <class S>
  static void backward(const parameters<S>&, const cq::Vector<S>&, const cq::StateTrace<S>&,
                       const cq::ConstMatrixRef<S>&, const cq::ConstMatrixRef<S>&, cq::MatrixRef<S>,
                       cq::MatrixRef<S>, parameters<S>&, cq::Vector<S>&, cq::DynamicsMemory) {}
};
static_assert(cq::CheckIntegrator<NotAPolicyWeKnow>::value);

static_assert(has_device_dynamics<cq::Identity>);
static_assert(has_device_dynamics<cq::Leapfrog<1>> && has_device_dynamics<cq::Leapfrog<7>>);
static_assert(has_device_dynamics<cq::Euler<1>> && has_device_dynamics<cq::Euler<7>>);
static_assert(has_device_dynamics<cq::Uncoupled<1>> && has_device_dynamics<cq::Uncoupled<7>>);
static_assert(has_device_dynamics<ForestRuth<2>> && has_device_dynamics<ForestRuth<7>>);
static_assert(has_device_dynamics<cq::Affine<1>> && has_device_dynamics<cq::Affine<7>>);
static_assert(has_device_dynamics<cq::SymplecticSplitting<cq::LeapfrogScheme, 4>>);
static_assert(!has_device_dynamics<NotAPolicyWeKnow>);
static_assert(has_device_dynamics<cq::Drift<1>> && has_device_dynamics<cq::NewtonEuler<3>>);
static_assert(has_device_dynamics<cq::NewtonLeapfrog<7>> && has_device_dynamics<cq::UnitLeapfrog<7>>);
static_assert(!has_device_dynamics<cq::Leapfrog<40>>);  // 81 merged stages > 64

// A consumer's own family, added without editing the library: one DeviceDynamics specialisation
// (here of one policy; a family selects its policies by a trait). Its kernels only count the calls.
struct ConsumerFlow {
  static constexpr int steps = 1;
  static constexpr int order = 1;
  static constexpr bool is_symplectic = false;
  static constexpr bool is_coupled = true;
  static constexpr bool is_reversible = false;
  static constexpr bool has_dynamics = true;
  static constexpr const char* name = "consumer-flow";
  template <class S>
  using parameters = cq::HamiltonianParameters<S>;
};
inline int consumer_forward_calls = 0;
inline int consumer_backward_calls = 0;

}  // namespace dynamics_test

namespace coupledqk::cuda {
template <>
struct DeviceDynamics<dynamics_test::ConsumerFlow> {
  static constexpr bool supported = true;
  static void validate(const DynamicsDims& dims, const char* fn) { dynamics_detail::validate_head_dim(dims, fn, 16); }
  template <class T>
  static void forward(const DynamicsDims&, const float*, const float*, const T*, const T*, T*, T*, cudaStream_t) {
    ++dynamics_test::consumer_forward_calls;
  }
  template <class T>
  static void backward(const DynamicsDims&, const float*, const float*, const T*, const T*, float*, float*, float*,
                       float*, cudaStream_t) {
    ++dynamics_test::consumer_backward_calls;
  }
};
}  // namespace coupledqk::cuda
static_assert(coupledqk::cuda::has_device_dynamics<dynamics_test::ConsumerFlow>);

namespace {

using namespace coupledqk;
using coupledqk::cuda::bf16;
using coupledqk::cuda::DeviceBuffer;
using coupledqk::cuda::DynamicsDims;
namespace ct = coupledqk::cuda::testing;

struct Shape {
  Index P, H, d, m;
};

std::string describe(const Shape& s) {
  return "P=" + std::to_string(s.P) + " H=" + std::to_string(s.H) + " d=" + std::to_string(s.d) +
         " m=" + std::to_string(s.m);
}

double softplus_d(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/// Random parameters with every term active: the spec initialisation with a, c, P*2 ~ N(0, 0.5^2),
/// plus N(0, 0.3^2) on every vector (biases too); every value rounded to float (the device's copy).
template <class I>
typename I::template parameters<double> random_parameters(Index d, Index m, std::uint64_t seed) {
  Rng rng(seed);
  DynamicsShape shape;
  shape.head_dim = d;
  shape.hidden = m;
  shape.init_scale = 0.5;
  // Affine: S, s0, T, t0 ~ N(0, 1/m), so that s and t are O(1) at every m. With 0.5 every log-scale
  // saturates near +-2 at d = m = 128, the states grow by e^{2h} per update, and drho becomes a sum
  // that cancels to within float32 round-off of the recomputing (inverse-based) backward (4.8e-4
  // measured against the 1e-4 bound, with every bf16 rounding turned off).
  if constexpr (std::is_base_of_v<Affine<I::steps>, I>) shape.init_scale = 1.0 / std::sqrt(static_cast<double>(m));
  auto p = I::template make_parameters<double>(shape, rng);
  p.visit([&](const char*, auto& t) {
    using Dense = std::decay_t<decltype(t)>;
    for (Index i = 0; i < t.size(); ++i) {
      double v = t.data()[i];
      if constexpr (Dense::ColsAtCompileTime == 1) v += 0.3 * rng.normal();
      t.data()[i] = static_cast<double>(static_cast<float>(v));
    }
  });
  return p;
}

template <class Params>
std::vector<float> flatten(const Params& p) {
  std::vector<float> v;
  p.visit([&](const char*, const auto& t) {
    for (Index i = 0; i < t.size(); ++i) v.push_back(static_cast<float>(t.data()[i]));
  });
  return v;
}

/// (name, offset, size) of each tensor in the flat layout.
struct Slot {
  std::string name;
  std::size_t offset, size;
};
template <class Params>
std::vector<Slot> slots(const Params& p) {
  std::vector<Slot> out;
  std::size_t off = 0;
  p.visit([&](const char* name, const auto& t) {
    out.push_back({name, off, static_cast<std::size_t>(t.size())});
    off += static_cast<std::size_t>(t.size());
  });
  return out;
}

struct Reference {
  std::vector<float> q, k, dq, dk, dparams, drho;
};

/// The CPU policy in double, tau per row = softplus(rho[r % H]), drho by the chain rule of
/// attention.hpp (sum over the head's rows of dtau * sigmoid(rho_h)).
template <class I>
Reference reference(const typename I::template parameters<double>& p, const Shape& s, const std::vector<float>& rho,
                    const std::vector<float>& q_in, const std::vector<float>& k_in, const std::vector<float>& dq_out,
                    const std::vector<float>& dk_out) {
  const Index P = s.P, d = s.d, H = s.H;
  Matrix<double> q(P, d), k(P, d), dq(P, d), dk(P, d);
  for (Index i = 0; i < P * d; ++i) {
    q.data()[i] = q_in[static_cast<std::size_t>(i)];
    k.data()[i] = k_in[static_cast<std::size_t>(i)];
    dq.data()[i] = dq_out[static_cast<std::size_t>(i)];
    dk.data()[i] = dk_out[static_cast<std::size_t>(i)];
  }
  Vector<double> tau(P);
  for (Index r = 0; r < P; ++r) tau[r] = softplus_d(rho[static_cast<std::size_t>(r % H)]);
  trace_of<I, double> trace;
  I::template forward<double>(p, tau, q, k, &trace, DynamicsMemory::store);
  auto grad = zeros_like(p);
  Vector<double> dtau = Vector<double>::Zero(P);
  I::template backward<double>(p, tau, trace, q, k, dq, dk, grad, dtau, DynamicsMemory::store);
  Reference ref;
  auto to_float = [](const Matrix<double>& m) {
    std::vector<float> v(static_cast<std::size_t>(m.size()));
    for (Index i = 0; i < m.size(); ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(m.data()[i]);
    return v;
  };
  ref.q = to_float(q);
  ref.k = to_float(k);
  ref.dq = to_float(dq);
  ref.dk = to_float(dk);
  ref.dparams = flatten(grad);
  std::vector<double> drho(static_cast<std::size_t>(H), 0.0);
  if (I::has_dynamics)
    for (Index r = 0; r < P; ++r)
      drho[static_cast<std::size_t>(r % H)] += dtau[r] * sigmoid_d(rho[static_cast<std::size_t>(r % H)]);
  ref.drho.assign(drho.begin(), drho.end());
  return ref;
}

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-4 : coupledqk::cuda::testing::bf16_tolerance();
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "bf16";
}

std::vector<float> slice_of(const std::vector<float>& v, std::size_t off, std::size_t n) {
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(off), v.begin() + static_cast<std::ptrdiff_t>(off + n));
}

std::vector<float> plus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

/// One policy, one shape, one storage type: forward and backward against the CPU in double.
template <class I, class T>
void check_parity(const Shape& s, std::uint64_t seed) {
  const std::string shape = describe(s);
  CAPTURE(shape);
  const std::string policy = I::name;
  CAPTURE(policy);
  const std::string type = type_name<T>();
  CAPTURE(type);
  const auto n = static_cast<std::size_t>(s.P * s.d);
  const auto p = random_parameters<I>(s.d, s.m, seed);
  const std::vector<float> flat = flatten(p);
  const std::vector<float> rho = ct::random_vector(static_cast<std::size_t>(s.H), seed + 1, 0.5);
  std::vector<float> q = ct::random_vector(n, seed + 2), k = ct::random_vector(n, seed + 3);
  if (std::is_same_v<T, bf16>)
    for (std::size_t i = 0; i < n; ++i) {
      q[i] = round_bf16(q[i]);
      k[i] = round_bf16(k[i]);
    }
  const std::vector<float> dq_out = ct::random_vector(n, seed + 4), dk_out = ct::random_vector(n, seed + 5);
  const Reference ref = reference<I>(p, s, rho, q, k, dq_out, dk_out);
  const DynamicsDims dims{s.P, s.H, s.d, s.m};
  const double tol = tolerance<T>();

  DeviceBuffer<float> params_d, rho_d;
  params_d.upload(flat);
  rho_d.upload(rho);
  DeviceBuffer<T> q_d = ct::to_device<T>(q), k_d = ct::to_device<T>(k);

  // forward, out of place, into poisoned outputs
  DeviceBuffer<T> qo = ct::poisoned<T>(n), ko = ct::poisoned<T>(n);
  cuda::dynamics_forward<I, T>(dims, params_d.data(), rho_d.data(), q_d.data(), k_d.data(), qo.data(), ko.data());
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ct::relative_error(ct::to_host(qo), ref.q) <= tol);
  CHECK(ct::relative_error(ct::to_host(ko), ref.k) <= tol);

  // backward: dq, dk in place; dparams, drho accumulate onto small random values
  DeviceBuffer<float> dq_d, dk_d, dparams_d, drho_d;
  dq_d.upload(dq_out);
  dk_d.upload(dk_out);
  const std::vector<float> g0 = ct::random_vector(flat.size(), seed + 6, 0.01);
  const std::vector<float> r0 = ct::random_vector(rho.size(), seed + 7, 0.01);
  dparams_d.upload(g0);
  drho_d.upload(r0);
  cuda::dynamics_backward<I, T>(dims, params_d.data(), rho_d.data(), q_d.data(), k_d.data(), dq_d.data(),
                                dk_d.data(), dparams_d.data(), drho_d.data());
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ct::relative_error(dq_d.download(), ref.dq) <= tol);
  CHECK(ct::relative_error(dk_d.download(), ref.dk) <= tol);
  const std::vector<float> dparams = dparams_d.download();
  for (const Slot& slot : slots(p)) {
    CAPTURE(slot.name);
    const std::vector<float> want = plus(slice_of(g0, slot.offset, slot.size), slice_of(ref.dparams, slot.offset, slot.size));
    CHECK(ct::relative_error(slice_of(dparams, slot.offset, slot.size), want) <= tol);
  }
  CHECK(ct::relative_error(drho_d.download(), plus(r0, ref.drho)) <= tol);
}

const Shape kShapes[] = {{37 * 4, 4, 16, 16}, {1000, 8, 64, 64}, {333, 3, 32, 48}, {130, 2, 128, 128}};

template <class I>
void check_policy(std::uint64_t seed) {
  for (const Shape& s : kShapes) {
#if COUPLEDQK_TEST_FLOAT_CASES
    check_parity<I, float>(s, seed);
#endif
    check_parity<I, bf16>(s, seed + 100);
    seed += 1000;
  }
}

}  // namespace

TEST_CASE("device dynamics: Identity copies forward and leaves the cotangents alone") { check_policy<Identity>(11); }
TEST_CASE("device dynamics: Leapfrog<1> matches the CPU") { check_policy<Leapfrog<1>>(21); }
TEST_CASE("device dynamics: Leapfrog<3> matches the CPU") { check_policy<Leapfrog<3>>(31); }
TEST_CASE("device dynamics: Euler<1> matches the CPU") { check_policy<Euler<1>>(41); }
TEST_CASE("device dynamics: Euler<3> matches the CPU") { check_policy<Euler<3>>(51); }
TEST_CASE("device dynamics: Uncoupled<1> matches the CPU") { check_policy<Uncoupled<1>>(61); }
TEST_CASE("device dynamics: Uncoupled<3> matches the CPU") { check_policy<Uncoupled<3>>(71); }
TEST_CASE("device dynamics: Affine<1> matches the CPU") { check_policy<Affine<1>>(111); }
// the velocity family (method spec 3c): its own kernels (velocity.cuh)
TEST_CASE("device dynamics: drift (1 and 3 steps) matches the CPU") {
  check_policy<Drift<1>>(131);
  check_policy<Drift<3>>(132);
}
TEST_CASE("device dynamics: newton-euler<1> matches the CPU") { check_policy<NewtonEuler<1>>(141); }
TEST_CASE("device dynamics: newton-euler<3> matches the CPU") { check_policy<NewtonEuler<3>>(151); }
TEST_CASE("device dynamics: newton-leapfrog<1> matches the CPU") { check_policy<NewtonLeapfrog<1>>(161); }
TEST_CASE("device dynamics: newton-leapfrog<3> matches the CPU") { check_policy<NewtonLeapfrog<3>>(171); }
TEST_CASE("device dynamics: unit-leapfrog<1> matches the CPU") { check_policy<UnitLeapfrog<1>>(181); }
TEST_CASE("device dynamics: unit-leapfrog<3> matches the CPU") { check_policy<UnitLeapfrog<3>>(191); }
TEST_CASE("device dynamics: Affine<3> matches the CPU") { check_policy<Affine<3>>(121); }
TEST_CASE("device dynamics: Forest-Ruth<2> (examples/forest_ruth.hpp) matches the CPU") {
  check_policy<ForestRuth<2>>(81);
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("device dynamics: many tiles per block, more heads than the shared drho accumulator holds") {
  // 200003 pairs of d = m = 16: several tiles per resident block (and a partial last tile);
  // H = 1300 > 1024 takes the per-pair global drho path.
  const Shape s{200003, 1300, 16, 16};
  check_parity<Leapfrog<2>, float>(s, 91);
  check_parity<Euler<2>, float>(s, 92);
  check_parity<Uncoupled<2>, float>(s, 93);
}
#endif

template <class I, class T>
void check_in_place(std::uint64_t seed) {
  const Shape s{1000, 8, 64, 64};
  const std::string policy = I::name;
  CAPTURE(policy);
  const auto n = static_cast<std::size_t>(s.P * s.d);
  const auto p = random_parameters<I>(s.d, s.m, seed);
  DeviceBuffer<float> params_d, rho_d;
  params_d.upload(flatten(p));
  rho_d.upload(ct::random_vector(static_cast<std::size_t>(s.H), seed + 1, 0.5));
  const std::vector<float> q = ct::random_vector(n, seed + 2), k = ct::random_vector(n, seed + 3);
  DeviceBuffer<T> q_d = ct::to_device<T>(q), k_d = ct::to_device<T>(k);
  DeviceBuffer<T> qo = ct::poisoned<T>(n), ko = ct::poisoned<T>(n);
  const DynamicsDims dims{s.P, s.H, s.d, s.m};
  cuda::dynamics_forward<I, T>(dims, params_d.data(), rho_d.data(), q_d.data(), k_d.data(), qo.data(), ko.data());
  cuda::dynamics_forward<I, T>(dims, params_d.data(), rho_d.data(), q_d.data(), k_d.data(), q_d.data(), k_d.data());
  COUPLEDQK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> a = ct::to_host(qo), b = ct::to_host(q_d), c = ct::to_host(ko), e = ct::to_host(k_d);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(c.data(), e.data(), c.size() * sizeof(float)) == 0);
  if (I::has_dynamics) CHECK(ct::relative_error(b, q) > 1e-3);  // the dynamics did move q
}

TEST_CASE("device dynamics: in-place forward (q_out == q_in) equals out of place, bit for bit") {
#if COUPLEDQK_TEST_FLOAT_CASES
  check_in_place<Leapfrog<2>, float>(101);
#endif
  check_in_place<Leapfrog<2>, bf16>(102);
#if COUPLEDQK_TEST_FLOAT_CASES
  check_in_place<Euler<2>, float>(103);
#endif
  check_in_place<Uncoupled<1>, bf16>(104);
#if COUPLEDQK_TEST_FLOAT_CASES
  check_in_place<Affine<2>, float>(106);
#endif
  check_in_place<Affine<1>, bf16>(107);
#if COUPLEDQK_TEST_FLOAT_CASES
  check_in_place<Identity, float>(105);
#endif
}

TEST_CASE("device dynamics: no pairs is a no-op") {
  const DynamicsDims dims{0, 4, 64, 64};
#if COUPLEDQK_TEST_FLOAT_CASES
  CHECK_NOTHROW(cuda::dynamics_forward<Leapfrog<1>, float>(dims, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr));
#endif
  CHECK_NOTHROW(cuda::dynamics_backward<Euler<2>, bf16>(dims, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         nullptr, nullptr));
}

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}
}  // namespace

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("device dynamics: unsupported shapes are rejected with the value and what is accepted") {
  DeviceBuffer<float> params(2 * 200 * 200 + 4 * 200), rho(4), buf(1000 * 200);
  auto forward = [&](Index d, Index m) {
    return error_of([&] {
      cuda::dynamics_forward<Leapfrog<1>, float>(DynamicsDims{1000, 4, d, m}, params.data(), rho.data(), buf.data(),
                                                 buf.data(), buf.data(), buf.data());
    });
  };
  const std::string d0 = forward(0, 64), d200 = forward(200, 64), m200 = forward(64, 200);
  CHECK(d0.find("head_dim d = 0") != std::string::npos);
  CHECK(d200.find("head_dim d = 200") != std::string::npos);
  CHECK(d200.find("1 <= d <= 128") != std::string::npos);
  CHECK(m200.find("hidden m = 200") != std::string::npos);
  const std::string back = error_of([&] {
    cuda::dynamics_backward<Euler<1>, float>(DynamicsDims{1000, 4, 200, 64}, params.data(), rho.data(), buf.data(),
                                             buf.data(), buf.data(), buf.data(), params.data(), rho.data());
  });
  CHECK(back.find("head_dim d = 200") != std::string::npos);
  const std::string odd = error_of([&] {
    cuda::dynamics_forward<Uncoupled<1>, float>(DynamicsDims{1000, 4, 64, 63}, params.data(), rho.data(), buf.data(),
                                                buf.data(), buf.data(), buf.data());
  });
  CHECK(odd.find("hidden m = 63") != std::string::npos);
  const std::string heads = error_of([&] {
    cuda::dynamics_forward<Euler<1>, float>(DynamicsDims{1000, 0, 64, 64}, params.data(), rho.data(), buf.data(),
                                            buf.data(), buf.data(), buf.data());
  });
  CHECK(heads.find("heads H = 0") != std::string::npos);
  const std::string identity = error_of([&] {
    cuda::dynamics_forward<Identity, float>(DynamicsDims{1000, 4, 0, 0}, nullptr, nullptr, buf.data(), buf.data(),
                                            buf.data(), buf.data());
  });
  CHECK(identity.find("head_dim d = 0") != std::string::npos);
}
#endif

TEST_CASE("device dynamics: launch plans (printed for the record)") {
  const DynamicsDims paper{16 * 1024 * 8, 8, 64, 64}, wide{4096, 2, 128, 128};
  for (const DynamicsDims& dims : {paper, wide}) {
    for (bool backward : {false, true}) {
      const auto lp = cuda::dynamics_launch_plan<Leapfrog<1>, bf16>(dims, backward);
      const std::string what = backward ? "backward" : "forward";
      const std::string where = backward ? std::string(", grads in ") + (lp.layout.grads_shared ? "shared" : "global") +
                                               " memory, trajectory in " + (lp.layout.traj_shared ? "shared" : "global") +
                                               " memory, scratch " + std::to_string(lp.scratch_bytes) + " B"
                                         : std::string();
      MESSAGE("leapfrog<1> bf16 d=" << dims.head_dim << " m=" << dims.hidden << " " << what << ": rows/tile "
                                    << lp.layout.rows << ", shared " << lp.shared_bytes << " B, " << lp.blocks
                                    << " blocks (" << lp.blocks_per_sm << "/SM)" << where);
      CHECK(lp.blocks >= 1);
    }
  }
}

#if COUPLEDQK_TEST_FLOAT_CASES
TEST_CASE("device dynamics: a consumer's family is one DeviceDynamics specialisation, reached after the shared checks") {
  using dynamics_test::ConsumerFlow;
  DeviceBuffer<float> buf(64);
  float* b = buf.data();
  const DynamicsDims dims{4, 2, 8, 8};
  const int forward_before = dynamics_test::consumer_forward_calls;
  const int backward_before = dynamics_test::consumer_backward_calls;
  cuda::dynamics_forward<ConsumerFlow, float>(dims, b, b, b, b, b, b);
  cuda::dynamics_backward<ConsumerFlow, float>(dims, b, b, b, b, b, b, b, b);
  CHECK(dynamics_test::consumer_forward_calls == forward_before + 1);
  CHECK(dynamics_test::consumer_backward_calls == backward_before + 1);
  // its own validation, and the shared checks, run before its kernels
  const std::string wide = error_of([&] {
    cuda::dynamics_forward<ConsumerFlow, float>(DynamicsDims{4, 2, 32, 8}, b, b, b, b, b, b);
  });
  CHECK(wide.find("head_dim d = 32 is not supported; accepted: 1 <= d <= 16") != std::string::npos);
  const std::string no_params = error_of([&] {
    cuda::dynamics_backward<ConsumerFlow, float>(dims, nullptr, b, b, b, b, b, b, b);
  });
  CHECK(no_params.find("params is null") != std::string::npos);
  const std::string no_heads = error_of([&] {
    cuda::dynamics_forward<ConsumerFlow, float>(DynamicsDims{4, 0, 8, 8}, b, b, b, b, b, b);
  });
  CHECK(no_heads.find("heads H = 0") != std::string::npos);
  CHECK(dynamics_test::consumer_forward_calls == forward_before + 1);
  CHECK(dynamics_test::consumer_backward_calls == backward_before + 1);
  // a family without launch_plan reports no launch
  CHECK(cuda::dynamics_launch_plan<ConsumerFlow, float>(dims, false).blocks == 0);
}
#endif
