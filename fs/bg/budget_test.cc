// A member's background budget (bg/budget.h): limits on I/Os and bytes,
// and the limit's adaptation to the read states it is given (no device, no
// clock: each case hands Admit the state it is about).
#include "bg/budget.h"

#include <gtest/gtest.h>

namespace tfs::bg {
namespace {

using Verdict = Budget::Verdict;

constexpr u64 kMs = 1'000'000;

// A member answering in 5 ms, nothing old at the device.
dev::ReadState Healthy() {
  dev::ReadState rs;
  rs.ewma_ns = 5 * kMs;
  return rs;
}

// Its oldest request past half its late bound (250 ms: 8 x 5 ms is below the floor).
dev::ReadState Slow() {
  dev::ReadState rs = Healthy();
  rs.oldest_ns = 200 * kMs;
  return rs;
}

dev::ReadState StallingByAge() {
  dev::ReadState rs = Healthy();
  rs.oldest_ns = 300 * kMs;
  return rs;
}

dev::ReadState StalledQuiet() {
  dev::ReadState rs = Healthy();
  rs.stalled = true;
  return rs;
}

struct Woken {
  int n = 0;
  static void Wake(void* self) { static_cast<Woken*>(self)->n++; }
};

class BudgetTest : public ::testing::Test {
 protected:
  void SetUp() override { b_.Init(BudgetConfig{4, 1 << 20}, &Woken::Wake, &woken_); }
  u32 Limit() const { return u32(b_.GetStats().limit); }
  // Admits n I/Os of `bytes` on a healthy member; all must be admitted.
  void Fill(int n, u64 bytes = 4096) {
    for (int i = 0; i < n; i++) ASSERT_EQ(b_.Admit(bytes, Healthy()), Verdict::kAdmitted) << i;
  }

  Budget b_;
  Woken woken_;
};

TEST_F(BudgetTest, AnIdleMemberGetsTheWholeBudgetAtOnce) {
  EXPECT_EQ(Limit(), 4u);
  Fill(4);
  EXPECT_EQ(b_.Admit(4096, Healthy()), Verdict::kBusy);
  BudgetStats s = b_.GetStats();
  EXPECT_EQ(s.ios, 4u);
  EXPECT_EQ(s.bytes, 4u * 4096);
  EXPECT_EQ(s.admitted, 4u);
  EXPECT_EQ(s.refused_busy, 1u);
  // The release after a refusal wakes the engines, once.
  EXPECT_EQ(woken_.n, 0);
  b_.Release(4096);
  EXPECT_EQ(woken_.n, 1);
  b_.Release(4096);
  EXPECT_EQ(woken_.n, 1) << "no refusal since the last release: no wake";
  Fill(2);
  EXPECT_EQ(b_.GetStats().ios, 4u);
}

TEST_F(BudgetTest, BytesAreLimitedButOneIoAlwaysGoes) {
  // One I/O larger than max_bytes on an idle member: admitted.
  ASSERT_EQ(b_.Admit(3 << 20, Healthy()), Verdict::kAdmitted);
  EXPECT_EQ(b_.Admit(4096, Healthy()), Verdict::kBusy) << "past max_bytes with one out";
  b_.Release(3 << 20);
  EXPECT_EQ(woken_.n, 1);
  Fill(2, 512 << 10);  // 1 MiB out: the byte limit exactly
  EXPECT_EQ(b_.Admit(1, Healthy()), Verdict::kBusy);
  b_.Release(512 << 10);
  Fill(1, 512 << 10);
}

TEST_F(BudgetTest, AStallingMemberGetsNothingUntilItIsHealthy) {
  Fill(3);
  EXPECT_EQ(b_.Admit(4096, StallingByAge()), Verdict::kStalling);
  EXPECT_EQ(Limit(), 0u);
  EXPECT_EQ(b_.Admit(4096, StalledQuiet()), Verdict::kStalling);
  // What was out comes back; the refusal's release wakes the engines, but
  // while the member stalls nothing is admitted, however empty its budget.
  for (int i = 0; i < 3; i++) b_.Release(4096);
  EXPECT_EQ(woken_.n, 1);
  EXPECT_EQ(b_.GetStats().ios, 0u);
  EXPECT_EQ(b_.Admit(4096, StalledQuiet()), Verdict::kStalling);
  BudgetStats s = b_.GetStats();
  EXPECT_EQ(s.refused_stalling, 3u);
  EXPECT_EQ(s.lowered, 1u) << "cut to 0 once";
  // Healthy again: it starts over at one and grows one per window.
  ASSERT_EQ(b_.Admit(4096, Healthy()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 1u);
  EXPECT_EQ(b_.Admit(4096, Healthy()), Verdict::kBusy);
  b_.Release(4096);  // a window of 1 at limit 1
  Fill(2);
  EXPECT_EQ(Limit(), 2u);
  EXPECT_EQ(b_.Admit(4096, Healthy()), Verdict::kBusy);
}

TEST_F(BudgetTest, ASlowMemberHalvesOncePerCompletionAndAHealthyOneGrowsBack) {
  Fill(4);
  for (int i = 0; i < 4; i++) b_.Release(4096);
  // Slow: halved at the first look, not again until a completion is seen.
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 2u);
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 2u);
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kBusy);
  b_.Release(4096);
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kBusy) << "halved to 1 with 1 out";
  EXPECT_EQ(Limit(), 1u);
  b_.Release(4096);
  // Never below one while merely slow.
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 1u);
  b_.Release(4096);
  EXPECT_EQ(b_.GetStats().lowered, 2u);
  // Healthy: +1 after each `limit` completions at that limit, up to max_ios.
  u32 grew = 0;
  for (int round = 0; round < 20 && Limit() < 4; round++) {
    const u32 before = Limit();
    Fill(1);  // (the look that may grow it)
    b_.Release(4096);
    if (Limit() > before) grew++;
  }
  EXPECT_EQ(Limit(), 4u);
  EXPECT_EQ(grew, 3u);
  Fill(4);
  EXPECT_EQ(b_.Admit(4096, Healthy()), Verdict::kBusy);
  for (int i = 0; i < 4; i++) b_.Release(4096);
  EXPECT_EQ(Limit(), 4u) << "never past max_ios";
}

// Back from a stall at 1 on any look that is not stalling, a slow one
// included (a member that stays slow must not stay at 0: nothing would wake
// an engine waiting for it).
TEST_F(BudgetTest, ASlowLookAfterAStallRestartsAtOne) {
  EXPECT_EQ(b_.Admit(4096, StalledQuiet()), Verdict::kStalling);
  EXPECT_EQ(Limit(), 0u);
  ASSERT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 1u);
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kBusy);
  b_.Release(4096);
  EXPECT_EQ(b_.GetStats().raised, 1u);
}

// An I/O given back unsent (Cancel) is no completion: the limit neither
// grows nor may be cut again for it; it still wakes a refused engine.
TEST_F(BudgetTest, ACancelIsNoCompletion) {
  ASSERT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);  // 4 -> 2
  EXPECT_EQ(Limit(), 2u);
  ASSERT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(b_.Admit(4096, Slow()), Verdict::kBusy);
  b_.Cancel(4096);
  EXPECT_EQ(woken_.n, 1) << "room back: the refused engine is woken";
  b_.Cancel(4096);
  ASSERT_EQ(b_.Admit(4096, Slow()), Verdict::kAdmitted);
  EXPECT_EQ(Limit(), 2u) << "no completion since the cut: not cut again";
  b_.Cancel(4096);
  // Healthy: with no completions at this limit, no growth either.
  for (int i = 0; i < 10; i++) {
    ASSERT_EQ(b_.Admit(4096, Healthy()), Verdict::kAdmitted);
    b_.Cancel(4096);
  }
  EXPECT_EQ(Limit(), 2u);
  const BudgetStats s = b_.GetStats();
  EXPECT_EQ(s.ios, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(s.raised, 0u);
  EXPECT_EQ(s.lowered, 1u);
}

}  // namespace
}  // namespace tfs::bg
