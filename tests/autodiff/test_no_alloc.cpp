// No heap allocation inside a training step after the first one (docs/performance-notes.md).
//
// This executable replaces glibc's allocation functions by counting ones
// (tests/support/malloc_counter.hpp): every malloc, calloc, realloc and aligned allocation of the
// process is seen, whoever makes it (operator new, Eigen's aligned_malloc, libgomp). A training step
// is what the trainer does: zero_grad, model.loss (forward + backward on a reused tape), AdamW
// step. After one warm-up step, the next steps must allocate nothing, for every attention variant,
// on one thread and (CTest runs this file a second time with OMP_NUM_THREADS=2) on two.
//
// Also here: coupledqk::gemm (core/gemm.hpp), which the step's large products go through, gives the
// same bits as Eigen's single-threaded product on any thread count.
#define COUPLEDQK_DEFINE_MALLOC_COUNTER
#include "support/malloc_counter.hpp"

#include <doctest/doctest.h>

// The calls by name (make_gpt<float>) go to the compiled table (coupledqk::variants_models,
// built once for the whole project), so this file does not instantiate every variant again.
#include <coupledqk/variants.hpp>

#include <coupledqk/core/gemm.hpp>
#include <coupledqk/core/parallel.hpp>
#include <coupledqk/model/gpt.hpp>
#include <coupledqk/optim/adamw.hpp>

#include <memory>
#include <sstream>
#include <string>

#include "helpers.hpp"

using namespace cqk_ad_test;

namespace {

struct Trainer {
  std::unique_ptr<AnyGpt<float>> model;
  std::unique_ptr<AdamW<float>> opt;
  Tape<float> tape;
  std::vector<std::int32_t> tokens, targets;
  Index batch = 0;

  Trainer(const std::string& variant, int steps, DynamicsMemory memory, Index B, Index T) : batch(B) {
    GptConfig c;
    c.vocab = 256;
    c.dim = 64;
    c.layers = 2;
    c.heads = 4;
    c.context = T;
    c.attention = variant;
    c.steps = steps;
    c.dynamics_init_scale = 0.1;
    c.memory = memory;
    model = make_gpt<float>(c, 3);
    AdamWConfig oc;
    oc.lr = 1e-3;
    oc.warmup_steps = 2;
    oc.total_steps = 10;
    opt = std::make_unique<AdamW<float>>(model->parameters(), model->gradients(), oc);
    Rng rng(4);
    tokens = random_ids(B * T, c.vocab, rng);
    targets = random_ids(B * T, c.vocab, rng);
  }

  /// One training step; returns the allocations it made (and their sizes, for messages).
  long long step(std::string* sizes = nullptr) {
    long long n = 0;
    std::vector<std::size_t> seen;
    {
      malloc_counter::Scope scope;
      model->zero_grad();
      const float loss = model->loss(tape, tokens, targets, batch);
      opt->step();
      n = scope.count();
      seen = scope.sizes();
      if (!(loss > 0)) n = -1;  // a step that did not run properly cannot pass
    }
    if (sizes) {
      std::ostringstream os;
      for (std::size_t s : seen) os << s << " ";
      *sizes = os.str();
    }
    return n;
  }
};

void check_steps(const std::string& variant, int steps, DynamicsMemory memory) {
  INFO("variant ", variant, ", ", steps, " step(s), memory ", to_string(memory), ", threads ", max_threads());
  Trainer t(variant, steps, memory, 4, 64);
  CHECK(t.step() > 0);  // the warm-up step sizes every buffer
  for (int s = 2; s <= 3; ++s) {
    std::string sizes;
    const long long n = t.step(&sizes);
    INFO("step ", s, ": allocation sizes ", sizes);
    CHECK(n == 0);
  }
}

}  // namespace

TEST_CASE("the allocation counter sees operator new and Eigen's allocations") {
  if (!malloc_counter::available()) {
    MESSAGE("not glibc: allocations are not counted here, the other cases are skipped");
    return;
  }
  long long n = 0;
  {
    malloc_counter::Scope scope;
    auto v = std::make_unique<std::vector<int>>(100);
    Matrix<float> m(50, 50);
    m.setZero();
    n = scope.count();
  }
  CHECK(n >= 3);
}

TEST_CASE("a training step after the first allocates nothing, for every variant") {
  if (!malloc_counter::available()) return;
  MESSAGE("threads: ", max_threads());
  for (const char* v : {"standard", "leapfrog", "euler", "uncoupled", "diff", "diff-leapfrog", "affine"})
    check_steps(v, 1, DynamicsMemory::store);
  check_steps("leapfrog", 3, DynamicsMemory::store);
  check_steps("leapfrog", 2, DynamicsMemory::recompute);
  check_steps("diff-affine", 3, DynamicsMemory::store);
  check_steps("affine", 2, DynamicsMemory::recompute);
}

#ifdef _OPENMP
TEST_CASE("no allocation after the first step on three threads either") {
  // More threads than some products have panels: every parallel region still uses a team of the
  // same size (libgomp allocates a new team when the size changes).
  if (!malloc_counter::available()) return;
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  Eigen::setNbThreads(3);
  check_steps("standard", 1, DynamicsMemory::store);
  check_steps("leapfrog", 1, DynamicsMemory::store);
  omp_set_num_threads(before);
  Eigen::setNbThreads(before);
}

TEST_CASE("a training run gives the same bits on one thread and on two") {
  // Every parallel loop of the step computes each output the same way whatever the thread count
  // (fixed chunks, one thread per row or head, gemm's panels), so the whole run is thread-count
  // independent.
  auto run = [](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    Eigen::setNbThreads(threads);
    Trainer t("leapfrog", 1, DynamicsMemory::store, 4, 64);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) {
      t.model->zero_grad();
      losses.push_back(t.model->loss(t.tape, t.tokens, t.targets, t.batch));
      t.opt->step();
    }
    auto params = snapshot(t.model->parameters());
    omp_set_num_threads(before);
    Eigen::setNbThreads(before);
    return std::make_pair(losses, params);
  };
  const auto one = run(1), two = run(2);
  CHECK(one.first == two.first);
  CHECK(one.second == two.second);
}
#endif

TEST_CASE("gemm: the same bits as Eigen's single-threaded product, on 1, 2 and 3 threads") {
  Rng rng(8);
  struct Case {
    Index m, n, k;
    bool ta, tb;
  };
  const Case cases[] = {{256, 64, 64, false, false},  {256, 256, 64, false, true}, {64, 256, 256, true, false},
                        {300, 70, 33, false, false},  {37, 500, 300, true, true},  {500, 37, 120, false, true},
                        {1000, 96, 64, false, false}, {96, 1000, 64, true, false}, {5, 7, 3, false, false},
                        {700, 300, 200, false, true}, {333, 900, 100, true, false}};
  const int before = max_threads();
  for (const Case& c : cases) {
    INFO("[", c.m, " x ", c.k, "] x [", c.k, " x ", c.n, "], transposed: ", c.ta, " ", c.tb);
    const Matrix<float> A = random_matrix(c.ta ? c.k : c.m, c.ta ? c.m : c.k, rng).cast<float>();
    const Matrix<float> B = random_matrix(c.tb ? c.n : c.k, c.tb ? c.k : c.n, rng).cast<float>();
    Matrix<float> C0 = random_matrix(c.m, c.n, rng).cast<float>();
    // Eigen, one thread: C = op(A) op(B) and C0 + op(A) op(B)
    Eigen::setNbThreads(1);
    Matrix<float> ref(c.m, c.n), ref_acc = C0;
    if (!c.ta && !c.tb) {
      ref.noalias() = A * B;
      ref_acc.noalias() += A * B;
    } else if (!c.ta) {
      ref.noalias() = A * B.transpose();
      ref_acc.noalias() += A * B.transpose();
    } else if (!c.tb) {
      ref.noalias() = A.transpose() * B;
      ref_acc.noalias() += A.transpose() * B;
    } else {
      ref.noalias() = A.transpose() * B.transpose();
      ref_acc.noalias() += A.transpose() * B.transpose();
    }
    const bool tiny = c.m + c.n + c.k < 20;  // Eigen itself uses a coefficient-wise product there
    if (gemm_backend() == GemmBackend::openblas) {
      // OpenBLAS's kernel (-DCOUPLEDQK_BLAS=OpenBLAS): its rounding, not Eigen's; the reference for
      // the thread counts below is gemm's own one-thread product, checked against Eigen's here.
#ifdef _OPENMP
      omp_set_num_threads(1);
#endif
      Matrix<float> C(c.m, c.n), Cacc = C0;
      gemm<float>(A, c.ta, B, c.tb, C);
      gemm<float>(A, c.ta, B, c.tb, Cacc, 1.0f, true);
      CHECK((C - ref).cwiseAbs().maxCoeff() <= 1e-4f * std::max(1.0f, ref.cwiseAbs().maxCoeff()));
      CHECK((Cacc - ref_acc).cwiseAbs().maxCoeff() <= 1e-4f * std::max(1.0f, ref_acc.cwiseAbs().maxCoeff()));
      ref = C;
      ref_acc = Cacc;
    }
    for (int threads : {1, 2, 3}) {
      INFO("threads ", threads);
#ifdef _OPENMP
      omp_set_num_threads(threads);
#endif
      Eigen::setNbThreads(threads);
      Matrix<float> C(c.m, c.n), Cacc = C0;
      gemm<float>(A, c.ta, B, c.tb, C);
      gemm<float>(A, c.ta, B, c.tb, Cacc, 1.0f, true);
      if (tiny && gemm_backend() == GemmBackend::eigen) {
        CHECK((C - ref).cwiseAbs().maxCoeff() <= 1e-5f);
      } else {
        CHECK((C.array() == ref.array()).all());
        CHECK((Cacc.array() == ref_acc.array()).all());
      }
    }
  }
  // a block with an outer stride as the output
  Matrix<float> big = Matrix<float>::Zero(300, 200), a = random_matrix(100, 64, rng).cast<float>(),
                b = random_matrix(64, 50, rng).cast<float>();
  gemm<float>(a, false, b, false, big.block(10, 20, 100, 50));
  CHECK((big.block(10, 20, 100, 50) - a * b).cwiseAbs().maxCoeff() <= 1e-4f);
  CHECK(big.block(0, 0, 10, 200).cwiseAbs().maxCoeff() == 0.0f);
#ifdef _OPENMP
  omp_set_num_threads(before);
#endif
  Eigen::setNbThreads(before);
}

TEST_CASE("gemm's backend: OpenBLAS only on its proper kernels, and a clear error where it is not there") {
  using detail::openblas_core_too_narrow;
  // (core OpenBLAS reports, CPU has AVX-512, CPU has AVX2 + FMA, Intel)
  CHECK(openblas_core_too_narrow("SkylakeX", true, true, true).empty());
  CHECK(openblas_core_too_narrow("Cooperlake", true, true, true).empty());
  CHECK(openblas_core_too_narrow("SAPPHIRERAPIDS", true, true, true).empty());
  CHECK(openblas_core_too_narrow("Zen", true, true, false).empty());  // AMD Zen 4: AVX2 kernels are its own
  CHECK(openblas_core_too_narrow("Haswell", false, true, true).empty());
  CHECK(openblas_core_too_narrow("Prescott", false, false, true).empty());
  const std::string generic = openblas_core_too_narrow("Prescott", true, true, true);
  CHECK(generic.find("'Prescott'") != std::string::npos);
  CHECK(generic.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK_FALSE(openblas_core_too_narrow("Haswell", true, true, true).empty());  // AVX2 kernels on an AVX-512 Xeon
  CHECK(openblas_core_too_narrow("Prescott", false, true, false).find("OPENBLAS_CORETYPE=Haswell") !=
        std::string::npos);
  // (openblas_get_parallel(): 0 single-threaded build, 1 pthreads, 2 OpenMP)
  CHECK(detail::openblas_build_unsafe(1).empty());
  CHECK(detail::openblas_build_unsafe(2).empty());
  CHECK(detail::openblas_build_unsafe(0).find("libopenblas-pthread-dev") != std::string::npos);

  const GemmBackend was = gemm_backend();
  MESSAGE("gemm backend: ", gemm_backend_description());
  set_gemm_backend(GemmBackend::eigen);
  CHECK(gemm_backend() == GemmBackend::eigen);
  Rng rng(3);
  const Matrix<float> A = random_matrix(200, 64, rng).cast<float>(), B = random_matrix(64, 90, rng).cast<float>();
  Matrix<float> C(200, 90), ref(200, 90);
  Eigen::setNbThreads(1);
  ref.noalias() = A * B;
  gemm<float>(A, false, B, false, C);
  CHECK((C.array() == ref.array()).all());  // Eigen's kernel chosen: Eigen's bits
#ifdef COUPLEDQK_USE_OPENBLAS
  if (was == GemmBackend::openblas) {
    set_gemm_backend(GemmBackend::openblas);
    CHECK(gemm_backend_description().find("OpenBLAS") == 0);
  }
#else
  CHECK(was == GemmBackend::eigen);
  try {
    set_gemm_backend(GemmBackend::openblas);
    FAIL("set_gemm_backend(openblas) without OpenBLAS did not throw");
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("'openblas' is not available") != std::string::npos);
    CHECK(what.find("COUPLEDQK_BLAS=OpenBLAS") != std::string::npos);
    CHECK(what.find("accepted: eigen") != std::string::npos);
  }
#endif
  set_gemm_backend(was);
  Eigen::setNbThreads(max_threads());
}
