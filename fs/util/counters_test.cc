// The counter table: one row gives the snapshot field, the live atomic (only
// for counters and gauges), the relaxed load and the JSON.
#include "util/counters.h"

#include <gtest/gtest.h>

#include <string>

namespace tfs {
namespace {

#define TEST_COUNTERS(X, A)             \
  X(ops, counter, "operations")         \
  X(now, gauge, "in progress")          \
  A(by_kind, 3, counter, "ops by kind") \
  X(computed, level, "filled later")  \
  X(summed, total, "filled later too")  \
  X(busy, flag, "busy now")

struct Snap {
  TFS_COUNTER_FIELDS(TEST_COUNTERS)
};
struct Live {
  TFS_COUNTER_ATOMICS(TEST_COUNTERS)
};

constexpr CounterInfo kInfo[] = {TFS_COUNTER_INFO(TEST_COUNTERS)};

TEST(CountersTest, OneTableGivesFieldsAtomicsLoadsAndJson) {
  // Level, total and flag rows have no atomic: only ops, now and by_kind[3] do.
  static_assert(sizeof(Live) == 5 * sizeof(u64));
  static_assert(sizeof(Snap) == 8 * sizeof(u64));
  Live live;
  Bump(live.ops, 5);
  Bump(live.now, 3);
  Drop(live.now);
  Bump(live.by_kind[2]);
  Snap s;
  EXPECT_EQ(s.ops + s.by_kind[2] + s.computed, 0u) << "a snapshot starts zeroed";
  TFS_COUNTER_LOAD(TEST_COUNTERS, live, s);
  s.computed = 7;
  s.summed = 9;
  s.busy = 1;
  EXPECT_EQ(s.ops, 5u);
  EXPECT_EQ(s.now, 2u);
  EXPECT_EQ(s.by_kind[2], 1u);

  std::string out;
  JsonOut w([](void* ctx, const char* p, u32 n) { static_cast<std::string*>(ctx)->append(p, n); }, &out);
  w.BeginObject();
  TFS_COUNTER_JSON(TEST_COUNTERS, w, s);
  w.EndObject();
  EXPECT_TRUE(w.complete());
  EXPECT_EQ(out, R"({"ops":5,"now":2,"by_kind":[0,0,1],"computed":7,"summed":9,"busy":true})");

  ASSERT_EQ(sizeof(kInfo) / sizeof(kInfo[0]), 6u);
  EXPECT_STREQ(kInfo[2].name, "by_kind");
  EXPECT_EQ(kInfo[2].count, 3u);
  EXPECT_EQ(kInfo[1].kind, CounterKind::kGauge);
  EXPECT_EQ(kInfo[5].kind, CounterKind::kFlag);
  EXPECT_TRUE(CounterMonotonic(kInfo[4].kind) && CounterMonotonic(kInfo[0].kind));
  EXPECT_FALSE(CounterMonotonic(kInfo[3].kind) || CounterMonotonic(kInfo[1].kind));
  EXPECT_STREQ(kInfo[3].help, "filled later");
}

}  // namespace
}  // namespace tfs
