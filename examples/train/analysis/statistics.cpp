// The statistics of the study and of coupledqk-compare (statistics.hpp).
#include "analysis/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <coupledqk/core/error.hpp>

namespace coupledqk::train {

namespace {
/// Continued fraction of the incomplete beta function (modified Lentz's method).
double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300, eps = 1e-15;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 1000; ++m) {
    const double m2 = 2.0 * m;
    double num = m * (b - m) * x / ((a - 1 + m2) * (a + m2));
    d = 1 + num * d;
    c = 1 + num / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1 + m2));
    d = 1 + num * d;
    c = 1 + num / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < eps) break;
  }
  return h;
}

double bisect(double lo, double hi, double target, const std::function<double(double)>& cdf) {
  for (int i = 0; i < 300; ++i) {
    const double mid = 0.5 * (lo + hi);
    (cdf(mid) < target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
}  // namespace

double incomplete_beta(double a, double b, double x) {
  require(a > 0 && b > 0, "incomplete_beta: a and b must be positive; got a = ", a, ", b = ", b);
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

double t_cdf(double t, double df) {
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
  return t > 0 ? 1 - tail : tail;
}

double t_quantile(double p, double df) {
  require(p > 0 && p < 1 && df > 0, "t_quantile: need 0 < p < 1 and df > 0; got p = ", p, ", df = ", df);
  return bisect(-1e6, 1e6, p, [df](double t) { return t_cdf(t, df); });
}

double f_cdf(double f, double d1, double d2) {
  if (f <= 0) return 0;
  return incomplete_beta(0.5 * d1, 0.5 * d2, d1 * f / (d1 * f + d2));
}

double f_quantile(double p, double d1, double d2) {
  require(p > 0 && p < 1 && d1 > 0 && d2 > 0, "f_quantile: need 0 < p < 1, d1, d2 > 0; got p = ", p);
  return bisect(0, 1e9, p, [d1, d2](double f) { return f_cdf(f, d1, d2); });
}

Estimate mean_ci(const std::vector<double>& x) {
  Estimate e;
  e.n = static_cast<int>(x.size());
  if (x.empty()) return e;
  for (double v : x) e.mean += v;
  e.mean /= e.n;
  e.lo = e.hi = e.mean;
  if (e.n < 2) return e;
  double q = 0;
  for (double v : x) q += (v - e.mean) * (v - e.mean);
  e.sd = std::sqrt(q / (e.n - 1));
  const double half = t_quantile(0.975, e.n - 1) * e.sd / std::sqrt(static_cast<double>(e.n));
  e.lo = e.mean - half;
  e.hi = e.mean + half;
  return e;
}

Estimate welch_ci(const std::vector<double>& a, const std::vector<double>& b) {
  const Estimate ea = mean_ci(a), eb = mean_ci(b);
  Estimate e;
  e.n = std::min(ea.n, eb.n);
  e.mean = ea.mean - eb.mean;
  e.lo = e.hi = e.mean;
  if (ea.n < 2 || eb.n < 2) return e;
  const double va = ea.sd * ea.sd / ea.n, vb = eb.sd * eb.sd / eb.n, se = std::sqrt(va + vb);
  e.sd = se;
  if (se == 0) return e;
  const double df = (va + vb) * (va + vb) / (va * va / (ea.n - 1) + vb * vb / (eb.n - 1));
  const double half = t_quantile(0.975, df) * se;
  e.lo = e.mean - half;
  e.hi = e.mean + half;
  return e;
}

}  // namespace coupledqk::train
