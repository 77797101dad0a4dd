// Spec parsers: accept the documented grammar, reject everything else with a
// message that names the bad piece.
#include "workloads/probe/spec.h"

#include <gtest/gtest.h>

namespace tfs::probe {
namespace {

TEST(SpecTest, ParsesMixWithSpacesAndOmittedOps) {
  Mix m;
  std::string err;
  ASSERT_TRUE(ParseMix("read=50, write = 30,fsync=0.5", &m, &err)) << err;
  EXPECT_DOUBLE_EQ(m[int(OpType::kRead)], 50);
  EXPECT_DOUBLE_EQ(m[int(OpType::kWrite)], 30);
  EXPECT_DOUBLE_EQ(m[int(OpType::kFsync)], 0.5);
  EXPECT_DOUBLE_EQ(m[int(OpType::kStat)], 0);
  EXPECT_EQ(MixToString(m), "read=50,write=30,fsync=0.5");
}

TEST(SpecTest, RejectsBadMixes) {
  Mix m;
  std::string err;
  EXPECT_FALSE(ParseMix("read=50,bogus=3", &m, &err));
  EXPECT_NE(err.find("unknown op 'bogus'"), std::string::npos) << err;
  EXPECT_FALSE(ParseMix("read", &m, &err));
  EXPECT_NE(err.find("NAME=WEIGHT"), std::string::npos) << err;
  EXPECT_FALSE(ParseMix("read=-1", &m, &err));
  EXPECT_FALSE(ParseMix("read=abc", &m, &err));
  EXPECT_FALSE(ParseMix("read=0,write=0", &m, &err));
  EXPECT_NE(err.find("no op with a positive weight"), std::string::npos) << err;
  EXPECT_FALSE(ParseMix("read=1,", &m, &err));
  EXPECT_FALSE(ParseMix("", &m, &err));
}

TEST(SpecTest, OpNamesRoundTrip) {
  for (int i = 0; i < kOpTypes; i++) {
    auto op = static_cast<OpType>(i);
    ASSERT_EQ(OpFromName(OpName(op)), op);
  }
  EXPECT_FALSE(OpFromName("Read").has_value());
}

TEST(SpecTest, ParsesDurations) {
  uint64_t ns = 0;
  std::string err;
  ASSERT_TRUE(ParseDuration("1.5s", &ns, &err));
  EXPECT_EQ(ns, 1'500'000'000u);
  ASSERT_TRUE(ParseDuration("250ms", &ns, &err));
  EXPECT_EQ(ns, 250'000'000u);
  ASSERT_TRUE(ParseDuration("40us", &ns, &err));
  EXPECT_EQ(ns, 40'000u);
  ASSERT_TRUE(ParseDuration("7", &ns, &err));
  EXPECT_EQ(ns, 7'000'000'000u);
  ASSERT_TRUE(ParseDuration("2min", &ns, &err));
  EXPECT_EQ(ns, 120'000'000'000u);
  EXPECT_FALSE(ParseDuration("10 parsecs", &ns, &err));
  EXPECT_FALSE(ParseDuration("-1s", &ns, &err));
  EXPECT_FALSE(ParseDuration("s", &ns, &err));
  EXPECT_FALSE(ParseDuration("1e30s", &ns, &err));
}

TEST(SpecTest, ParsesSizes) {
  uint64_t b = 0;
  std::string err;
  ASSERT_TRUE(ParseSize("4096", &b, &err));
  EXPECT_EQ(b, 4096u);
  ASSERT_TRUE(ParseSize("64K", &b, &err));
  EXPECT_EQ(b, 65536u);
  ASSERT_TRUE(ParseSize("1.5M", &b, &err));
  EXPECT_EQ(b, 1572864u);
  ASSERT_TRUE(ParseSize("2G", &b, &err));
  EXPECT_EQ(b, 2ull << 30);
  EXPECT_FALSE(ParseSize("12X", &b, &err));
  EXPECT_NE(err.find("12X"), std::string::npos);
}

TEST(SpecTest, ParsesInjections) {
  InjectDelay d;
  std::string err;
  ASSERT_TRUE(ParseInjectDelay("2ms:0.01", &d, &err)) << err;
  EXPECT_EQ(d.delay_ns, 2'000'000u);
  EXPECT_DOUBLE_EQ(d.fraction, 0.01);
  EXPECT_FALSE(ParseInjectDelay("2ms", &d, &err));
  EXPECT_FALSE(ParseInjectDelay("2ms:1.5", &d, &err));
  InjectStall s;
  ASSERT_TRUE(ParseInjectStall("5s:1s", &s, &err)) << err;
  EXPECT_EQ(s.at_ns, 5'000'000'000u);
  EXPECT_EQ(s.length_ns, 1'000'000'000u);
  EXPECT_FALSE(ParseInjectStall("5s", &s, &err));
  Arrivals a;
  EXPECT_TRUE(ParseArrivals("poisson", &a, &err));
  EXPECT_EQ(a, Arrivals::kPoisson);
  EXPECT_FALSE(ParseArrivals("bursty", &a, &err));
}

TEST(SpecTest, ValidateChecksRanges) {
  ProbeSpec s;
  s.rate = 100;
  s.duration_ns = 1'000'000'000;
  std::string err;
  EXPECT_TRUE(Validate(s, &err)) << err;
  s.rate = 0;
  EXPECT_FALSE(Validate(s, &err));
  s.rate = 100;
  s.threads = 0;
  EXPECT_FALSE(Validate(s, &err));
  s.threads = 1;
  s.working_set = 100;
  EXPECT_FALSE(Validate(s, &err));
}

}  // namespace
}  // namespace tfs::probe
