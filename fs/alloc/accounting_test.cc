// The accounting keys (alloc/accounting.h, docs/format/alloc.md "Accounting
// keys"): encode and parse round trips, every validity rule against hostile
// bytes (each a kCorrupt with a one-line Diag), and the totals' life:
// the load (the last key of a position wins), the commit hook's Stage
// (changes nothing, makes room) and Publish (a stop at 0 or at the bound
// counted), a repair's Set (a total of 0 forgets the set). The keys in a
// store and across remounts and cuts: fs/data/account_test.cc; hostile keys
// on an image: fs/fsck/accounting_test.cc.
#include "alloc/accounting.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace tfs::alloc {
namespace {

sb::Superblock ThreeMembers() {
  sb::Superblock s;
  memset(&s, 0, sizeof(s));
  s.nr_members = 3;
  s.bucket_size = 1 << 20;
  s.btree_node_size = 64 * 1024;
  s.block_size = 4096;
  for (u32 m = 0; m < 3; m++) s.members[m].nbuckets = 10;
  return s;
}

AcctRecord Rec(AcctKind kind, u64 sectors) {
  AcctRecord r;
  EncodeAcct(kind, sectors, &r);
  return r;
}

Status Parse(const sb::Superblock& s, u64 inode, u64 offset, const AcctRecord& r, u64* sectors, Diag* d) {
  return ParseAcct(s, inode, offset, &r, sizeof(r), sectors, d);
}

TEST(AcctRecordTest, EncodeParseRoundTrip) {
  const sb::Superblock s = ThreeMembers();
  u64 got = 0;
  Diag d;
  ASSERT_TRUE(Parse(s, AcctInode(AcctKind::kReserved), 0, Rec(AcctKind::kReserved, 12345), &got, &d).ok()) << d.text;
  EXPECT_EQ(got, 12345u);
  ASSERT_TRUE(Parse(s, AcctInode(AcctKind::kReplicas), 0x5, Rec(AcctKind::kReplicas, 8), &got, &d).ok()) << d.text;
  EXPECT_EQ(got, 8u);
  // The bound: every member's buckets full of logical sectors.
  EXPECT_EQ(AcctMax(s, AcctKind::kReplicas), 30u * (1 << 20) / 512 * kCountFactor);
  ASSERT_TRUE(Parse(s, AcctInode(AcctKind::kReplicas), 0x7, Rec(AcctKind::kReplicas, AcctMax(s, AcctKind::kReplicas)), &got, &d)
                  .ok());
  // The inode count: a count, bounded by the members' bytes in 128-byte records.
  ASSERT_TRUE(Parse(s, AcctInode(AcctKind::kInodes), 0, Rec(AcctKind::kInodes, 7), &got, &d).ok()) << d.text;
  EXPECT_EQ(got, 7u);
  EXPECT_EQ(AcctMax(s, AcctKind::kInodes), 30u * (1 << 20) / kInodeMinBytes);
  EXPECT_TRUE(IsAcctKey(AcctInode(AcctKind::kReserved)));
  EXPECT_FALSE(IsAcctKey(2));
}

TEST(AcctRecordTest, HostileKeysAreCorruptInOneLine) {
  const sb::Superblock s = ThreeMembers();
  struct Case {
    const char* what;
    u64 inode, offset;
    AcctRecord r;
    u32 len;
  };
  AcctRecord reserved_set = Rec(AcctKind::kReplicas, 8);
  reserved_set.reserved[3] = 1;
  std::vector<Case> cases = {
      {"kind past the kinds", kAcctInodeBase + kAcctKinds, 0, Rec(AcctKind::kReserved, 8), 16},
      {"a value of another kind", AcctInode(AcctKind::kReplicas), 1, Rec(AcctKind::kReserved, 8), 16},
      {"reserved bytes", AcctInode(AcctKind::kReplicas), 1, reserved_set, 16},
      {"short value", AcctInode(AcctKind::kReplicas), 1, Rec(AcctKind::kReplicas, 8), 15},
      {"reserved at offset 1", AcctInode(AcctKind::kReserved), 1, Rec(AcctKind::kReserved, 8), 16},
      {"mask 0", AcctInode(AcctKind::kReplicas), 0, Rec(AcctKind::kReplicas, 8), 16},
      {"a bit past the members", AcctInode(AcctKind::kReplicas), 0x9, Rec(AcctKind::kReplicas, 8), 16},
      {"a bit far past", AcctInode(AcctKind::kReplicas), u64(1) << 40, Rec(AcctKind::kReplicas, 8), 16},
      {"too many sectors", AcctInode(AcctKind::kReplicas), 0x3, Rec(AcctKind::kReplicas, AcctMax(s, AcctKind::kReplicas) + 1), 16},
      {"inodes at offset 2", AcctInode(AcctKind::kInodes), 2, Rec(AcctKind::kInodes, 8), 16},
      {"an inode count at a reserved key", AcctInode(AcctKind::kReserved), 0, Rec(AcctKind::kInodes, 8), 16},
      {"too many inodes", AcctInode(AcctKind::kInodes), 0, Rec(AcctKind::kInodes, AcctMax(s, AcctKind::kInodes) + 1), 16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    u64 got = 77;
    Diag d;
    Status st = ParseAcct(s, c.inode, c.offset, &c.r, c.len, &got, &d);
    EXPECT_EQ(st.code(), Err::kCorrupt);
    EXPECT_FALSE(d.empty());
    EXPECT_EQ(std::string(d.text).find('\n'), std::string::npos);
    EXPECT_EQ(got, 77u);  // untouched
  }
  // Five members: no set of more than kAcctMaxMembers.
  sb::Superblock five = ThreeMembers();
  five.nr_members = 5;
  for (u32 m = 0; m < 5; m++) five.members[m].nbuckets = 10;
  u64 got;
  Diag d;
  EXPECT_TRUE(Parse(five, AcctInode(AcctKind::kReplicas), 0xf, Rec(AcctKind::kReplicas, 8), &got, &d).ok());
  EXPECT_EQ(Parse(five, AcctInode(AcctKind::kReplicas), 0x1f, Rec(AcctKind::kReplicas, 8), &got, &d).code(),
            Err::kCorrupt);
}

TEST(AccountingTest, LoadTakesTheLastKeyOfAPositionAndRefusesBadOnes) {
  const sb::Superblock s = ThreeMembers();
  Accounting a;
  ASSERT_TRUE(a.Init(s).ok());
  a.BeginLoad();
  AcctRecord r = Rec(AcctKind::kReplicas, 80);
  ASSERT_TRUE(a.LoadKey(AcctInode(AcctKind::kReplicas), 0x3, &r, sizeof(r)).ok());
  r = Rec(AcctKind::kReplicas, 16);
  ASSERT_TRUE(a.LoadKey(AcctInode(AcctKind::kReplicas), 0x1, &r, sizeof(r)).ok());
  r = Rec(AcctKind::kReplicas, 24);  // (the journal's, over the tree's)
  ASSERT_TRUE(a.LoadKey(AcctInode(AcctKind::kReplicas), 0x3, &r, sizeof(r)).ok());
  r = Rec(AcctKind::kReserved, 40);
  ASSERT_TRUE(a.LoadKey(AcctInode(AcctKind::kReserved), 0, &r, sizeof(r)).ok());
  r = Rec(AcctKind::kReserved, 41);
  Diag d;
  EXPECT_EQ(a.LoadKey(AcctInode(AcctKind::kReplicas), 0x2, &r, sizeof(r), &d).code(), Err::kCorrupt);
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(a.reserved_sectors(), 40u);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x3), 24u);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x1), 16u);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x2), 0u);
  ReplicasEntry e[4];
  ASSERT_EQ(a.Replicas(e, 4), 2u);
  EXPECT_EQ(e[0].members, 0x1u);  // in mask order
  EXPECT_EQ(e[1].members, 0x3u);
  EXPECT_EQ(a.Stats().keys_loaded, 4u);
  EXPECT_EQ(a.Stats().replicas_entries, 2u);
  r = Rec(AcctKind::kInodes, 9);
  ASSERT_TRUE(a.LoadKey(AcctInode(AcctKind::kInodes), 0, &r, sizeof(r)).ok());
  EXPECT_EQ(a.inodes(), 9u);
  EXPECT_EQ(a.Get(AcctKind::kInodes, 0), 9u);
  EXPECT_EQ(a.Get(AcctKind::kInodes, 1), 0u);
  a.BeginLoad();
  EXPECT_EQ(a.Replicas(e, 4), 0u);
  EXPECT_EQ(a.reserved_sectors(), 0u);
  EXPECT_EQ(a.inodes(), 0u);
}

TEST(AccountingTest, StageChangesNothingAndPublishCountsWhatItMet) {
  const sb::Superblock s = ThreeMembers();
  Accounting a;
  ASSERT_TRUE(a.Init(s).ok());
  AcctChange ch[3] = {{AcctKind::kReplicas, 0x1, 64}, {AcctKind::kReplicas, 0x6, 8}, {AcctKind::kReserved, 0, 16}};
  AcctValue v[3];
  ASSERT_TRUE(a.Stage(ch, 3, v).ok());
  EXPECT_EQ(v[0].sectors, 64u);
  EXPECT_EQ(v[1].sectors, 8u);
  EXPECT_EQ(v[2].sectors, 16u);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x1), 0u);  // staged, not published
  EXPECT_EQ(a.Replicas(nullptr, 0), 0u);
  a.Publish(v, 3);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x1), 64u);
  EXPECT_EQ(a.Get(AcctKind::kReplicas, 0x6), 8u);
  EXPECT_EQ(a.reserved_sectors(), 16u);
  EXPECT_EQ(a.Stats().acct_records, 3u);
  // Below 0 and past the bound: stopped there, counted only when published.
  AcctChange bad[2] = {{AcctKind::kReplicas, 0x1, -100}, {AcctKind::kReplicas, 0x6, i64(AcctMax(s, AcctKind::kReplicas))}};
  ASSERT_TRUE(a.Stage(bad, 2, v).ok());
  EXPECT_TRUE(v[0].underflow);
  EXPECT_EQ(v[0].sectors, 0u);
  EXPECT_TRUE(v[1].overflow);
  EXPECT_EQ(v[1].sectors, AcctMax(s, AcctKind::kReplicas));
  EXPECT_EQ(a.Stats().acct_underflows, 0u);
  a.Publish(v, 2);
  EXPECT_EQ(a.Stats().acct_underflows, 1u);
  EXPECT_EQ(a.Stats().acct_overflows, 1u);
  // The inode count: its own total and bound.
  AcctChange ino[1] = {{AcctKind::kInodes, 0, 3}};
  ASSERT_TRUE(a.Stage(ino, 1, v).ok());
  a.Publish(v, 1);
  ino[0].sectors = -1;
  ASSERT_TRUE(a.Stage(ino, 1, v).ok());
  a.Publish(v, 1);
  EXPECT_EQ(a.inodes(), 2u);
  EXPECT_EQ(a.reserved_sectors(), 16u);  // (untouched)
  ino[0].sectors = i64(AcctMax(s, AcctKind::kInodes));
  ASSERT_TRUE(a.Stage(ino, 1, v).ok());
  EXPECT_TRUE(v[0].overflow);
  EXPECT_EQ(v[0].sectors, AcctMax(s, AcctKind::kInodes));
  // A total of 0 stays a set (its key holds 0); a repair's 0 forgets it.
  EXPECT_EQ(a.Replicas(nullptr, 0), 2u);
  AcctValue fix;
  fix.kind = AcctKind::kReplicas;
  fix.offset = 0x1;
  fix.sectors = 0;
  ASSERT_TRUE(a.MakeRoom(1).ok());
  a.Set(&fix, 1);
  ReplicasEntry e[4];
  ASSERT_EQ(a.Replicas(e, 4), 1u);
  EXPECT_EQ(e[0].members, 0x6u);
  EXPECT_EQ(a.Stats().acct_repairs, 1u);
}

TEST(AccountingTest, ManySetsStayInMaskOrder) {
  sb::Superblock s = ThreeMembers();
  s.nr_members = 8;
  for (u32 m = 0; m < 8; m++) s.members[m].nbuckets = 10;
  Accounting a;
  ASSERT_TRUE(a.Init(s).ok());
  // Every set of 1..4 of 8 members, added in a scrambled order, one commit each.
  std::vector<u32> masks;
  for (u32 m = 1; m < 256; m++)
    if (__builtin_popcount(m) <= 4) masks.push_back((m * 97) % 256);
  u64 want = 0;
  for (u32 mask : masks) {
    if (mask == 0 || __builtin_popcount(mask) > 4) continue;
    AcctChange c{AcctKind::kReplicas, mask, i64(mask) * 8};
    AcctValue v;
    ASSERT_TRUE(a.Stage(&c, 1, &v).ok());
    a.Publish(&v, 1);
    want++;
  }
  std::vector<ReplicasEntry> e(a.Replicas(nullptr, 0));
  ASSERT_EQ(e.size(), want);
  a.Replicas(e.data(), u32(e.size()));
  for (size_t i = 0; i < e.size(); i++) {
    EXPECT_EQ(e[i].sectors, u64(e[i].members) * 8);
    if (i > 0) {
      EXPECT_LT(e[i - 1].members, e[i].members);
    }
  }
}

// The copies the sets say: by count, and with members out (missing or
// failed) degraded (another copy left) or unavailable (none).
TEST(AccountingTest, SummarizeCopiesCountsDegradedAndUnavailableData) {
  const ReplicasEntry sets[] = {
      {0b0001, 100},  // one copy on member 0
      {0b0010, 0},    // a set emptied: nothing
      {0b0011, 40},   // two copies: 0 and 1
      {0b0110, 8},    // two copies: 1 and 2
      {0b1111, 2},    // four copies
      {0b0100, 16},   // one copy on member 2
  };
  CopiesSummary c = SummarizeCopies(sets, 6, 0);
  EXPECT_EQ(c.sectors, 166u);
  EXPECT_EQ(c.by_copies[1], 116u);
  EXPECT_EQ(c.by_copies[2], 48u);
  EXPECT_EQ(c.by_copies[3], 0u);
  EXPECT_EQ(c.by_copies[4], 2u);
  EXPECT_EQ(c.degraded, 0u);
  EXPECT_EQ(c.unavailable, 0u);
  // Member 1 out: {0,1}, {1,2} and {0..3} keep a copy; nothing lost.
  c = SummarizeCopies(sets, 6, 0b0010);
  EXPECT_EQ(c.degraded, 50u);
  EXPECT_EQ(c.unavailable, 0u);
  EXPECT_EQ(c.unavailable_sets, 0u);
  // Members 1 and 2 out: {1,2} and {2} have no copy left.
  c = SummarizeCopies(sets, 6, 0b0110);
  EXPECT_EQ(c.degraded, 42u);
  EXPECT_EQ(c.unavailable, 24u);
  EXPECT_EQ(c.unavailable_sets, 2u);
  EXPECT_EQ(c.sectors, 166u) << "the totals do not depend on who is out";
}

}  // namespace
}  // namespace tfs::alloc
