// Checks the chi-square p-value helper against closed forms that share no code with it:
// df = 1 is erfc(sqrt(x / 2)); even df = 2m is the Poisson tail exp(-x/2) sum_{k<m} (x/2)^k / k!.
#include "tests/base/chi_square.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace specd::testing {
namespace {

double EvenDfSurvival(double x, int df) {
  const double half = x / 2.0;
  double term = 1.0;
  double sum = 0.0;
  for (int k = 0; k < df / 2; ++k) {
    if (k > 0) term *= half / k;
    sum += term;
  }
  return std::exp(-half) * sum;
}

TEST(ChiSquarePValueTest, MatchesErfcForOneDegreeOfFreedom) {
  for (const double x : {0.001, 0.1, 1.0, 3.841458820694124, 10.0, 30.0}) {
    const double want = std::erfc(std::sqrt(x / 2.0));
    EXPECT_NEAR(ChiSquarePValue(x, 1), want, 1e-12 + 1e-9 * want) << "x=" << x;
  }
}

TEST(ChiSquarePValueTest, MatchesPoissonTailForEvenDegreesOfFreedom) {
  for (const int df : {2, 4, 10, 50, 100, 254}) {
    for (const double scale : {0.2, 0.8, 1.0, 1.3, 2.0}) {
      const double x = scale * df;
      const double want = EvenDfSurvival(x, df);
      EXPECT_NEAR(ChiSquarePValue(x, df), want, 1e-12 + 1e-9 * want) << "df=" << df << " x=" << x;
    }
  }
}

TEST(ChiSquarePValueTest, TextbookCriticalValues) {
  // 5% critical values from any chi-square table.
  EXPECT_NEAR(ChiSquarePValue(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquarePValue(18.307, 10), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquarePValue(124.342, 100), 0.05, 1e-4);
}

TEST(PearsonChiSquareTest, PoolsSmallCellsAndComputesStatistic) {
  const std::vector<int64_t> observed = {10, 1, 3, 7};
  const std::vector<double> expected = {8.0, 2.0, 3.0, 8.0};
  const ChiSquareResult r = PearsonChiSquare(observed, expected);
  // Cells 1 and 2 pool to observed 4, expected 5: 2^2/8 + 1^2/5 + 1^2/8.
  EXPECT_DOUBLE_EQ(r.statistic, 4.0 / 8.0 + 1.0 / 5.0 + 1.0 / 8.0);
  EXPECT_EQ(r.df, 2);
  EXPECT_NEAR(r.p_value, std::exp(-r.statistic / 2.0), 1e-12);
}

}  // namespace
}  // namespace specd::testing
