// core/small_gemm.hpp, the dynamics' narrow products: against a long-double product on every
// storage order and the kernel's edge cases (row and column tails, padded and in-place op(B),
// strided blocks, alpha and accumulation), the same bits for a row alone and inside a batch,
// gemm's bits where it hands over to gemm, no allocation even on the first call, shape errors.
#define COUPLEDQK_DEFINE_MALLOC_COUNTER
#include "support/malloc_counter.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <coupledqk/core/random.hpp>
#include <coupledqk/core/small_gemm.hpp>
#include <limits>
#include <stdexcept>
#include <string>

using namespace coupledqk;

namespace {

template <class S>
Matrix<S> random_matrix(Index r, Index c, Rng& rng) {
  Matrix<S> m(r, c);
  rng.fill_normal(m, 1.0);
  return m;
}

/// Largest |C - ref| / (|alpha| sum_k |a_ik||b_kj| + |C0_ij|), the error per unit of the sum's magnitude.
template <class S>
double relative_error(const Matrix<S>& A, bool ta, const Matrix<S>& B, bool tb, const Matrix<S>& C0,
                      const Matrix<S>& C, S alpha, bool accumulate) {
  const Index M = C.rows(), N = C.cols(), K = ta ? A.rows() : A.cols();
  double worst = 0;
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) {
      long double sum = 0, mag = 0;
      for (Index k = 0; k < K; ++k) {
        const long double a = ta ? A(k, i) : A(i, k), b = tb ? B(j, k) : B(k, j);
        sum += a * b;
        mag += std::fabs(a * b);
      }
      long double ref = static_cast<long double>(alpha) * sum, scale = std::fabs(static_cast<long double>(alpha)) * mag;
      if (accumulate) {
        ref += C0(i, j);
        scale += std::fabs(static_cast<long double>(C0(i, j)));
      }
      const double err = static_cast<double>(std::fabs(static_cast<long double>(C(i, j)) - ref) /
                                             (scale + std::numeric_limits<long double>::min()));
      worst = std::max(worst, err);
    }
  return worst;
}

template <class S>
void check_shapes() {
  Rng rng(11);
  const double eps = std::numeric_limits<S>::epsilon();
  int cases = 0;
  for (Index M : {1, 5, 6, 7, 13, 40})
    for (Index N : {1, 3, 15, 16, 17, 48, 64, 65, 100})
      for (Index K : {1, 7, 64, 129})
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2, acc = (M + N + K + t) % 2 == 0;
          const S alpha = (t == 3) ? S(-0.5) : S(1);
          const Matrix<S> A = ta ? random_matrix<S>(K, M, rng) : random_matrix<S>(M, K, rng);
          const Matrix<S> B = tb ? random_matrix<S>(N, K, rng) : random_matrix<S>(K, N, rng);
          const Matrix<S> C0 = random_matrix<S>(M, N, rng);
          Matrix<S> C = C0;
          REQUIRE(small_gemm_takes<S>(M, N, K, tb));
          small_gemm<S>(A, ta, B, tb, C, alpha, acc);
          INFO("M ", M, " N ", N, " K ", K, " trans_a ", ta, " trans_b ", tb, " accumulate ", acc);
          // A sum of K products in order: error below K + 2 roundings of its magnitude.
          CHECK(relative_error(A, ta, B, tb, C0, C, alpha, acc) <= (K + 2) * eps);
          ++cases;
        }
  CHECK(cases == 6 * 9 * 4 * 4);
}

}  // namespace

TEST_CASE("small_gemm matches a long-double product on every storage order, float and double") {
  check_shapes<float>();
  check_shapes<double>();
}

TEST_CASE("small_gemm on blocks of larger matrices (outer strides other than the width)") {
  Rng rng(5);
  const Matrix<float> bigA = random_matrix<float>(40, 90, rng), bigB = random_matrix<float>(70, 80, rng);
  Matrix<float> bigC = Matrix<float>::Zero(50, 100);
  // op(A) = bigA rows 3..22, cols 10..74 [20, 65]; op(B) = bigB block [65, 33]; C = block of bigC.
  const auto A = bigA.block(3, 10, 20, 65);
  const auto B = bigB.block(2, 40, 65, 33);
  small_gemm<float>(A, false, B, false, bigC.block(7, 60, 20, 33));
  const Matrix<float> ref = (A.cast<double>() * B.cast<double>()).cast<float>();
  CHECK((bigC.block(7, 60, 20, 33) - ref).cwiseAbs().maxCoeff() < 1e-4f);
  // Nothing outside the block was written.
  Matrix<float> outside = bigC;
  outside.block(7, 60, 20, 33).setZero();
  CHECK(outside.cwiseAbs().maxCoeff() == 0.0f);
  // Transposed operands through blocks: C = op(A) op(B) with A^T, B^T stored as blocks.
  const auto At = bigA.block(0, 0, 33, 21);  // op(A) = At^T [21, 33]
  const auto Bt = bigB.block(5, 7, 17, 33);  // op(B) = Bt^T [33, 17]
  Matrix<float> C(21, 17);
  small_gemm<float>(At, true, Bt, true, C);
  const Matrix<float> ref2 = (At.transpose().cast<double>() * Bt.transpose().cast<double>()).cast<float>();
  CHECK((C - ref2).cwiseAbs().maxCoeff() < 1e-4f);
}

TEST_CASE("small_gemm: a row alone gives the bits it gets inside a batch") {
  Rng rng(8);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const Index M = 256, K = 64, N = 64;
    const Matrix<float> A = ta ? random_matrix<float>(K, M, rng) : random_matrix<float>(M, K, rng);
    const Matrix<float> B = tb ? random_matrix<float>(N, K, rng) : random_matrix<float>(K, N, rng);
    Matrix<float> all(M, N);
    small_gemm<float>(A, ta, B, tb, all);
    for (Index i : {0, 5, 6, 131, 255}) {
      Matrix<float> one(1, N);
      const Matrix<float> a_row = ta ? Matrix<float>(A.col(i)) : Matrix<float>(A.row(i));  // [K, 1] or [1, K]
      small_gemm<float>(a_row, ta, B, tb, one);
      INFO("trans_a ", ta, " trans_b ", tb, " row ", i);
      CHECK((one.row(0).array() == all.row(i).array()).all());
    }
  }
}

TEST_CASE("small_gemm hands wide, deep or large products to gemm, with gemm's bits") {
  Rng rng(3);
  struct Shape {
    Index M, N, K;
    bool tb;
  };
  for (const Shape s : {Shape{8, 300, 16, false}, Shape{8, 40, 300, true}, Shape{2048, 64, 64, false}}) {
    INFO("M ", s.M, " N ", s.N, " K ", s.K, " trans_b ", s.tb);
    CHECK_FALSE(small_gemm_takes<float>(s.M, s.N, s.K, s.tb));
    const Matrix<float> A = random_matrix<float>(s.M, s.K, rng);
    const Matrix<float> B = s.tb ? random_matrix<float>(s.N, s.K, rng) : random_matrix<float>(s.K, s.N, rng);
    Matrix<float> C1 = random_matrix<float>(s.M, s.N, rng), C2 = C1;
    small_gemm<float>(A, false, B, s.tb, C1, 0.5f, true);
    gemm<float>(A, false, B, s.tb, C2, 0.5f, true);
    CHECK((C1.array() == C2.array()).all());
  }
  // Deep but in place (B not transposed, N whole packets): the kernel keeps it.
  CHECK(small_gemm_takes<float>(6, 64, 1000, false));
  // Empty depth: C = 0, or C unchanged when accumulating.
  Matrix<float> A(4, 0), B(0, 5), C = Matrix<float>::Constant(4, 5, 2.0f);
  small_gemm<float>(A, false, B, false, C, 1.0f, true);
  CHECK((C.array() == 2.0f).all());
  small_gemm<float>(A, false, B, false, C);
  CHECK((C.array() == 0.0f).all());
}

TEST_CASE("small_gemm allocates nothing, even on its first call") {
  if (!malloc_counter::available()) return;
  Rng rng(2);
  // Sizes the dynamics of a chunk use (d = 64, m = 128, 2d = 128), in double (never called before here).
  const Matrix<double> x = random_matrix<double>(256, 64, rng), W = random_matrix<double>(128, 64, rng);
  Matrix<double> act(256, 128), y(256, 64), G(128, 64);
  long long n = 0;
  {
    malloc_counter::Scope scope;
    small_gemm<double>(x, false, W, true, act);          // x W^T: copied op(B)
    small_gemm<double>(act, false, W, false, y);         // act W: in place
    small_gemm<double>(act, true, y, false, G, 1.0, true);  // act^T y: transposed A, depth 256
    n = scope.count();
  }
  CHECK(n == 0);
  CHECK(y.allFinite());
}

TEST_CASE("small_gemm: a shape mismatch is an error that names the shapes") {
  Matrix<float> A(4, 3), B(5, 2), C(4, 2);
  A.setOnes();
  B.setOnes();
  C.setZero();
  try {
    small_gemm<float>(A, false, B, false, C);
    FAIL("no error for [4, 3] x [5, 2]");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    CHECK(m.find("op(A) is [4, 3]") != std::string::npos);
    CHECK(m.find("op(B) is [5, 2]") != std::string::npos);
  }
  CHECK((C.array() == 0.0f).all());  // nothing written
}
