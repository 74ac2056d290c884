#include "kernels/cpu/bandwidth.h"

#include "gtest/gtest.h"

namespace specd::kernels {
namespace {

// Only sanity: the figure is positive and finite. Its size is a benchmark matter.
TEST(BandwidthTest, MeasuresAPositiveRate) {
  const double one = MeasureReadBandwidthGBps(1, size_t{16} << 20);
  EXPECT_GT(one, 0.0);
  EXPECT_LT(one, 1e6);
  EXPECT_GT(MeasureReadBandwidthGBps(2, (size_t{16} << 20) + 100), 0.0);
}

TEST(BandwidthTest, TooSmallABufferGivesZero) { EXPECT_EQ(MeasureReadBandwidthGBps(1, 100), 0.0); }

}  // namespace
}  // namespace specd::kernels
