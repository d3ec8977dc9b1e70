// The statistics of the study and of coupledqk-compare: Student's t and Fisher's F distributions,
// means with t intervals, Welch's interval of a difference of means.
#pragma once

#include <vector>

namespace coupledqk::train {

/// Regularised incomplete beta I_x(a, b); Student's t and Fisher's F distribution functions and
/// their quantiles (by bisection on the distribution function).
double incomplete_beta(double a, double b, double x);
double t_cdf(double t, double df);
double t_quantile(double p, double df);
double f_cdf(double f, double d1, double d2);
double f_quantile(double p, double d1, double d2);

/// Mean with a two-sided 95% t interval (n >= 2; n == 1: the interval is the point, sd 0).
struct Estimate {
  double mean = 0, sd = 0, lo = 0, hi = 0;
  int n = 0;
};
Estimate mean_ci(const std::vector<double>& x);
/// Difference of means a - b with Welch's 95% interval.
Estimate welch_ci(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace coupledqk::train
