// Rotary position embeddings (positions/rope.hpp, issue 22 item 2): the rotate-half convention as
// PyTorch models write it, the properties that make it a position code (a rotation per head,
// identity at 0, scores that depend on the offset m - n only), its backward by central
// differences in double, and the errors.
#include <doctest/doctest.h>

#include <coupledqk/core/random.hpp>
#include <coupledqk/positions/rope.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace coupledqk;

namespace {

Matrix<double> random_rows(Index rows, Index cols, std::uint64_t seed) {
  Rng rng(seed);
  Matrix<double> x(rows, cols);
  rng.fill_normal(x, 1.0);
  return x;
}

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("rope: y = x * cos + rotate_half(x) * sin, PyTorch's way of writing it") {
  // The form of GPT-NeoX / LLaMA code: cos and sin of [freqs, freqs] (each frequency twice),
  // rotate_half(x) = cat(-x2, x1). Written here from that form, not from the header's loop.
  const Index d = 8, H = 3, T = 5;
  const double base = 500.0;
  const Rope<double> rope(d, T, base);
  const Matrix<double> x = random_rows(2 * T, H * d, 1);
  Matrix<double> y = x;
  rope.rotate(y, T);
  for (Index r = 0; r < x.rows(); ++r) {
    const double p = static_cast<double>(r % T);
    for (Index h = 0; h < H; ++h) {
      for (Index j = 0; j < d; ++j) {
        const Index i = j % (d / 2);
        const double w = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(d));
        const double rotated_half = j < d / 2 ? -x(r, h * d + j + d / 2) : x(r, h * d + j - d / 2);
        const double want = x(r, h * d + j) * std::cos(p * w) + rotated_half * std::sin(p * w);
        CHECK(y(r, h * d + j) == doctest::Approx(want).epsilon(1e-14));
      }
    }
  }
}

TEST_CASE("rope: a rotation per head; position 0 is the identity; the inverse undoes it") {
  const Index d = 16, H = 2, T = 64;
  const Rope<double> rope(d, T);
  const Matrix<double> x = random_rows(T, H * d, 2);
  Matrix<double> y = x;
  rope.rotate(y, T);
  CHECK(y.row(0) == x.row(0));
  for (Index r = 0; r < T; ++r)
    for (Index h = 0; h < H; ++h)
      CHECK(y.row(r).segment(h * d, d).norm() == doctest::Approx(x.row(r).segment(h * d, d).norm()).epsilon(1e-14));
  rope.rotate(y, T, /*inverse=*/true);
  CHECK((y - x).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("rope: <R_m q, R_n k> depends on m - n only (relative positions)") {
  const Index d = 32, T = 40;
  const Rope<double> rope(d, T);
  const Matrix<double> q = random_rows(1, d, 3), k = random_rows(1, d, 4);
  auto score = [&](Index m, Index n) {
    Matrix<double> a = q, b = k;
    rope.rotate_at(a, {m});
    rope.rotate_at(b, {n});
    return a.row(0).dot(b.row(0));
  };
  for (Index offset : {0, 1, 5, 17}) {
    const double s0 = score(offset, 0);
    for (Index shift : {1, 3, 10, 22}) CHECK(score(offset + shift, shift) == doctest::Approx(s0).epsilon(1e-12));
  }
  // ... and does depend on it (the code carries position at all).
  CHECK(std::abs(score(1, 0) - score(0, 0)) > 1e-3);
}

TEST_CASE("rope: float rotates by double's angles, to float precision") {
  const Index d = 8, T = 1000;
  const Rope<double> rd(d, T);
  const Rope<float> rf(d, T);
  const Matrix<double> x = random_rows(T, d, 5);
  Matrix<double> yd = x;
  Matrix<float> yf = x.cast<float>();
  rd.rotate(yd, T);
  rf.rotate(yf, T);
  CHECK((yf.cast<double>() - yd).cwiseAbs().maxCoeff() < 1e-5);
}

TEST_CASE("rope: the backward (inverse rotation) matches central differences") {
  const Index d = 6, H = 2, T = 4;
  const Rope<double> rope(d, T, 77.0);
  const Matrix<double> x = random_rows(2 * T, H * d, 6), w = random_rows(2 * T, H * d, 7);
  auto loss = [&](const Matrix<double>& in) {
    Matrix<double> y = in;
    rope.rotate(y, T);
    return (y.array() * w.array()).sum();
  };
  Matrix<double> grad = w;
  rope.rotate(grad, T, /*inverse=*/true);  // dL/dx = R^T dL/dy
  const double h = 1e-6;
  for (Index r = 0; r < x.rows(); ++r)
    for (Index c = 0; c < x.cols(); ++c) {
      Matrix<double> a = x, b = x;
      a(r, c) += h;
      b(r, c) -= h;
      CHECK(grad(r, c) == doctest::Approx((loss(a) - loss(b)) / (2 * h)).epsilon(1e-8));
    }
}

TEST_CASE("rope: packed rows at their own positions equal the same rows rotated as sequences") {
  const Index d = 4, T = 6;
  const Rope<double> rope(d, T);
  const Matrix<double> x = random_rows(2 * T, d, 8);
  Matrix<double> a = x, b = x;
  rope.rotate(a, T);
  std::vector<Index> pos;
  for (Index r = 0; r < 2 * T; ++r) pos.push_back(r % T);
  rope.rotate_at(b, pos);
  CHECK(a == b);
  // A table that starts at position 5 (a decoder's newest token) rotates as the full one does.
  Matrix<double> c = x.topRows(1), e = x.topRows(1);
  rope.rotate_at(c, {5});
  Rope<double>(d, 1, default_rope_base, 5).rotate_at(e, {5});
  CHECK(c == e);
  CHECK(error_of([] {
          Matrix<float> x1(1, 4);
          Rope<float>(4, 1, default_rope_base, 5).rotate_at(x1, {4});
        }).find("position 4 of row 0 is outside 5..5") != std::string::npos);
}

TEST_CASE("rope: what it refuses, with the value seen") {
  CHECK(error_of([] { Rope<float>(7, 8); }).find("must be even and positive") != std::string::npos);
  CHECK(error_of([] { Rope<float>(7, 8); }).find("got d = 7") != std::string::npos);
  CHECK(error_of([] { Rope<float>(8, 8, 1.0); }).find("base must be finite and > 1") != std::string::npos);
  CHECK(error_of([] { Rope<float>(8, 8, 1.0); }).find("got 1") != std::string::npos);
  CHECK(error_of([] { Rope<float>(8, 8, std::nan("")); }).find("base must be finite") != std::string::npos);
  CHECK(error_of([] { Rope<float>(8, 0); }).find("must be positive; got 0") != std::string::npos);
  CHECK(error_of([] {
          const Rope<float> r(4, 8);
          Matrix<float> x(9, 4);
          r.rotate(x, 9);
        }).find("sequence length 9 is outside 1..8") != std::string::npos);
  CHECK(error_of([] {
          const Rope<float> r(4, 8);
          Matrix<float> x(6, 4);
          r.rotate(x, 4);
        }).find("6 rows are not a whole number of sequences of length 4") != std::string::npos);
  CHECK(error_of([] {
          const Rope<float> r(4, 8);
          Matrix<float> x(2, 6);
          r.rotate(x, 2);
        }).find("width 6 are not whole heads of width d = 4") != std::string::npos);
  CHECK(error_of([] {
          const Rope<float> r(4, 8);
          Matrix<float> x(1, 4);
          r.rotate_at(x, {8});
        }).find("position 8 of row 0 is outside 0..7") != std::string::npos);
}
