#include "base/philox.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/base/chi_square.h"

namespace specd {
namespace {

// Reject uniformity when p < kRejectP. Seeds are fixed, so each test is deterministic: a pass
// means these draws are unremarkable, not that the test is lucky today.
constexpr double kRejectP = 1e-4;

struct KnownAnswer {
  PhiloxCounter ctr;
  PhiloxKey key;
  std::array<uint32_t, 4> want;
};

// The three philox4x32 10-round lines of Random123's tests/kat_vectors
// (github.com/DEShawResearch/random123): counter[4] key[2] -> output[4].
constexpr KnownAnswer kRandom123Kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox4x32_10Test, MatchesRandom123KnownAnswerVectors) {
  for (const KnownAnswer& kat : kRandom123Kat) {
    EXPECT_EQ(Philox4x32_10(kat.ctr, kat.key), kat.want) << std::hex << "counter " << kat.ctr[0];
  }
}

TEST(PhiloxKeyFromSeedTest, LowWordFirst) {
  EXPECT_EQ(PhiloxKeyFromSeed(0x299f31d0a4093822ull), (PhiloxKey{0xa4093822, 0x299f31d0}));
  EXPECT_EQ(PhiloxKeyFromSeed(0), (PhiloxKey{0, 0}));
  EXPECT_EQ(PhiloxKeyFromSeed(~uint64_t{0}), (PhiloxKey{0xffffffff, 0xffffffff}));
}

TEST(UniformFromWordsTest, BitLevelConstruction) {
  EXPECT_EQ(UniformFromWords(0, 0), 0.0);
  // All 53 bits set: the largest value, 1 - 2^-53.
  EXPECT_EQ(UniformFromWords(0xffffffff, 0xffffffff), 1.0 - 0x1.0p-53);
  // The low 11 bits of x1 are dropped; bit 11 of x1 is the least significant bit of u.
  EXPECT_EQ(UniformFromWords(0, 0x7ff), 0.0);
  EXPECT_EQ(UniformFromWords(0, 0x800), 0x1.0p-53);
  EXPECT_EQ(UniformFromWords(0, 0x80000000), 0x1.0p-33);
  // x0 supplies the top 32 bits.
  EXPECT_EQ(UniformFromWords(0x80000000, 0), 0.5);
  EXPECT_EQ(UniformFromWords(1, 0), 0x1.0p-32);
  // By hand: 0x6627e8d5 << 21 = 0xCC4FD1AA00000, 0xe169c58d >> 11 = 0x1C2D38,
  // or-ed: 0xCC4FD1ABC2D38, times 2^-53.
  EXPECT_EQ(UniformFromWords(0x6627e8d5, 0xe169c58d), 0xCC4FD1ABC2D38 * 0x1.0p-53);
  EXPECT_EQ(UniformFromWords(0x6627e8d5, 0xe169c58d), 0x1.989fa35785a7p-2);
}

TEST(StreamUniformTest, KeyAndCounterLayoutFollowTheKnownAnswers) {
  // seed 0, counter (position 0, DRAFT_SAMPLE, 0, 0) is the all-zero KAT:
  // words 6627e8d5 e169c58d -> 0xCC4FD1ABC2D38 * 2^-53.
  EXPECT_EQ(StreamUniform(0, 0, Purpose::kDraftSample, 0, 0), 0xCC4FD1ABC2D38 * 0x1.0p-53);
  // The all-ones KAT: words 408f276d 41c83b0e.
  // 0x408f276d << 21 = 0x811E4EDA00000, 0x41c83b0e >> 11 = 0x83907 -> 0x811E4EDA83907.
  EXPECT_EQ(StreamUniform(~uint64_t{0}, 0xffffffff, static_cast<Purpose>(0xffffffff), 0xffffffff,
                          0xffffffff),
            0x811E4EDA83907 * 0x1.0p-53);
  // The pi KAT: seed = key[1] << 32 | key[0]; counter = (position, purpose, index, sample).
  // Words d16cfe09 94fdcceb: 0xd16cfe09 << 21 = 0x1A2D9FC1200000, 0x94fdcceb >> 11 = 0x129FB9.
  EXPECT_EQ(StreamUniform(0x299f31d0a4093822ull, 0x243f6a88, static_cast<Purpose>(0x85a308d3),
                          0x13198a2e, 0x03707344),
            0x1A2D9FC1329FB9 * 0x1.0p-53);
}

TEST(StreamUniformTest, PurposeNumberingIsStable) {
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kDraftSample), 0u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kAccept), 1u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kBonus), 2u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kCandidate), 3u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kCandidateAccept), 4u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kResidualFallback), 5u);
  EXPECT_EQ(static_cast<uint32_t>(Purpose::kTargetSample), 6u);
}

TEST(StreamUniformTest, InUnitIntervalOnA53BitGrid) {
  for (uint32_t pos = 0; pos < 20000; ++pos) {
    const double u = StreamUniform(0x5eed, pos, Purpose::kAccept);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double scaled = u * 0x1.0p53;
    ASSERT_EQ(scaled, std::floor(scaled)) << "u=" << u << " is not a multiple of 2^-53";
  }
}

TEST(StreamUniformTest, EveryCounterFieldAndTheSeedSelectAStream) {
  constexpr Purpose kPurposes[] = {Purpose::kDraftSample,     Purpose::kAccept,
                                   Purpose::kBonus,           Purpose::kCandidate,
                                   Purpose::kCandidateAccept, Purpose::kResidualFallback,
                                   Purpose::kTargetSample};
  // The high word of the seed must matter as much as the low word.
  constexpr uint64_t kSeeds[] = {0, 1, uint64_t{1} << 32, 0xdeadbeefcafef00dull};
  std::set<double> seen;
  int64_t drawn = 0;
  for (const uint64_t seed : kSeeds) {
    for (uint32_t pos = 0; pos < 12; ++pos) {
      for (const Purpose purpose : kPurposes) {
        for (uint32_t index = 0; index < 4; ++index) {
          for (uint32_t sample = 0; sample < 3; ++sample) {
            seen.insert(StreamUniform(seed, pos, purpose, index, sample));
            ++drawn;
          }
        }
      }
    }
  }
  // 4032 draws on a 2^53 grid: any repeat means two counters share a stream.
  EXPECT_EQ(static_cast<int64_t>(seen.size()), drawn);
}

TEST(StreamUniformTest, DefaultIndexAndSampleAreZero) {
  EXPECT_EQ(StreamUniform(42, 7, Purpose::kBonus), StreamUniform(42, 7, Purpose::kBonus, 0, 0));
}

TEST(StreamUniformTest, ChiSquareUniformityAlongPositions) {
  constexpr int kBins = 256;
  constexpr int kDraws = 1 << 18;
  for (const Purpose purpose : {Purpose::kAccept, Purpose::kCandidate}) {
    std::vector<int64_t> observed(kBins, 0);
    for (uint32_t pos = 0; pos < kDraws; ++pos) {
      const double u = StreamUniform(0x0123456789abcdefull, pos, purpose);
      ++observed[static_cast<size_t>(u * kBins)];
    }
    const std::vector<double> expected(kBins, static_cast<double>(kDraws) / kBins);
    const testing::ChiSquareResult r = testing::PearsonChiSquare(observed, expected);
    EXPECT_EQ(r.df, kBins - 1);
    EXPECT_GE(r.p_value, kRejectP) << "chi2=" << r.statistic << " df=" << r.df;
  }
}

TEST(StreamUniformTest, ChiSquareUniformityAlongCandidateIndices) {
  constexpr int kBins = 64;
  constexpr int kDraws = 1 << 16;
  std::vector<int64_t> observed(kBins, 0);
  for (uint32_t index = 0; index < kDraws; ++index) {
    ++observed[static_cast<size_t>(StreamUniform(7, 1000, Purpose::kCandidate, index) * kBins)];
  }
  const std::vector<double> expected(kBins, static_cast<double>(kDraws) / kBins);
  const testing::ChiSquareResult r = testing::PearsonChiSquare(observed, expected);
  EXPECT_GE(r.p_value, kRejectP) << "chi2=" << r.statistic << " df=" << r.df;
}

TEST(StreamUniformTest, ChiSquareIndependenceOfNeighbouringPositions) {
  // Pairs (u_pos, u_pos+1) on a 16x16 grid: neighbours must look independent, because
  // consecutive decisions of one request read consecutive positions.
  constexpr int kSide = 16;
  constexpr int kPairs = 1 << 17;
  std::vector<int64_t> observed(kSide * kSide, 0);
  double prev = StreamUniform(99, 0, Purpose::kTargetSample);
  for (uint32_t pos = 1; pos <= kPairs; ++pos) {
    const double next = StreamUniform(99, pos, Purpose::kTargetSample);
    ++observed[static_cast<size_t>(prev * kSide) * kSide + static_cast<size_t>(next * kSide)];
    prev = next;
  }
  const std::vector<double> expected(kSide * kSide, static_cast<double>(kPairs) / (kSide * kSide));
  const testing::ChiSquareResult r = testing::PearsonChiSquare(observed, expected);
  EXPECT_GE(r.p_value, kRejectP) << "chi2=" << r.statistic << " df=" << r.df;
}

}  // namespace
}  // namespace specd
