// A small deterministic random number generator.
//
// std::normal_distribution is implementation-defined, so the same seed would give different
// parameters with another standard library. This one is fully specified: splitmix64 to seed,
// xoshiro256** to generate, Box-Muller for normals.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include <Eigen/Core>

namespace coupledqk {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) { reseed(seed); }

  void reseed(std::uint64_t seed) {
    std::uint64_t x = seed;
    for (auto& s : state_) s = splitmix64(x);
    has_spare_ = false;
  }

  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// Standard normal (Box-Muller, both values used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586476925 * u2;
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

  /// Fills an Eigen object with N(0, stddev^2) entries (in storage order).
  template <class Dense>
  void fill_normal(Dense& m, double stddev) {
    for (Eigen::Index i = 0; i < m.size(); ++i)
      m.data()[i] = static_cast<typename Dense::Scalar>(stddev * normal());
  }

  /// The full state, for checkpoints.
  std::array<std::uint64_t, 4> state() const { return state_; }
  void set_state(const std::array<std::uint64_t, 4>& s) {
    state_ = s;
    has_spare_ = false;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix64(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  std::array<std::uint64_t, 4> state_{};
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace coupledqk
