// Pearson chi-square goodness of fit for the randomness and sampling tests.
//
// The p-value is the regularised upper incomplete gamma Q(df/2, x/2), computed with the series
// and the continued fraction of Press et al., "Numerical Recipes", 3rd ed., section 6.2. Its own
// test checks it against the closed forms for df = 1 (erfc) and even df (a Poisson tail sum).
#ifndef SPECD_TESTS_BASE_CHI_SQUARE_H_
#define SPECD_TESTS_BASE_CHI_SQUARE_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace specd::testing {

// Q(a, x) = Gamma(a, x) / Gamma(a) for a > 0, x >= 0.
inline double RegularizedGammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefactor = a * std::log(x) - x - std::lgamma(a);
  constexpr double kEps = 1e-15;
  constexpr int kMaxIter = 100000;
  if (x < a + 1.0) {
    // Series for P(a, x); Q = 1 - P.
    double term = 1.0 / a;
    double sum = term;
    for (int n = 1; n < kMaxIter; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::abs(term) < std::abs(sum) * kEps) break;
    }
    return 1.0 - sum * std::exp(log_prefactor);
  }
  // Continued fraction for Q(a, x), modified Lentz's method.
  constexpr double kTiny = std::numeric_limits<double>::min() / kEps;
  double b = x + 1.0 - a;
  double c = 1.0 / kTiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i < kMaxIter; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1.0) < kEps) break;
  }
  return std::exp(log_prefactor) * h;
}

// P(X >= statistic) for X ~ chi-square with `df` degrees of freedom.
inline double ChiSquarePValue(double statistic, double df) {
  return RegularizedGammaQ(df / 2.0, statistic / 2.0);
}

struct ChiSquareResult {
  double statistic = 0.0;
  int64_t df = 0;
  double p_value = 1.0;
};

// Pearson's test of `observed` counts against `expected` counts (same length, same total).
// Adjacent cells with expected < min_expected are pooled with their right neighbour (the last
// pool joins its left one) so the chi-square approximation holds; df = pooled cells - 1.
inline ChiSquareResult PearsonChiSquare(std::span<const int64_t> observed,
                                        std::span<const double> expected,
                                        double min_expected = 5.0) {
  std::vector<double> pooled_obs;
  std::vector<double> pooled_exp;
  double obs_acc = 0.0;
  double exp_acc = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    obs_acc += static_cast<double>(observed[i]);
    exp_acc += expected[i];
    if (exp_acc >= min_expected) {
      pooled_obs.push_back(obs_acc);
      pooled_exp.push_back(exp_acc);
      obs_acc = 0.0;
      exp_acc = 0.0;
    }
  }
  if (exp_acc > 0.0 || obs_acc > 0.0) {
    if (pooled_obs.empty()) {
      pooled_obs.push_back(0.0);
      pooled_exp.push_back(0.0);
    }
    pooled_obs.back() += obs_acc;
    pooled_exp.back() += exp_acc;
  }
  ChiSquareResult result;
  for (size_t i = 0; i < pooled_obs.size(); ++i) {
    const double diff = pooled_obs[i] - pooled_exp[i];
    result.statistic += diff * diff / pooled_exp[i];
  }
  result.df = static_cast<int64_t>(pooled_obs.size()) - 1;
  result.p_value = result.df > 0 ? ChiSquarePValue(result.statistic, result.df) : 1.0;
  return result;
}

}  // namespace specd::testing

#endif  // SPECD_TESTS_BASE_CHI_SQUARE_H_
