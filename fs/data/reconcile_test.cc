// The reconcile index's keys (data/reconcile.h): the codec round-trips and
// refuses hostile bytes; an extent's key is ReconcileOf's work at the
// extent's position under its destination; QueueReconcile queues exactly the
// change an extent change makes, keeping a key's since while its work is
// the same.
#include "data/reconcile.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "data/testing.h"
#include "mount/testing.h"

namespace tfs::data {
namespace {

MemberTable TwoTier() { return testing::TwoTierTable(); }

const std::vector<u8> kCrcs(4 * 16, 0x5a);

Extent On(u64 ino, u64 end, std::initializer_list<std::pair<u8, bool>> ptrs) {
  return testing::ExtentOn(ino, end, 4, ptrs, kCrcs.data());
}

TEST(ReconcileKeyTest, RoundTripsAndRefusesHostileBytes) {
  ReconcileKey k;
  k.dest = kDestMember + 1;
  k.ino = 77;
  k.end = 12;
  k.reasons = kWorkPlacement | kWorkCompress;
  k.since = 0xfedcba98u;
  EXPECT_EQ(k.pos().inode, (u64(kDestMember + 1) << 56) | 77);
  ReconcileFormat f = BuildReconcile(k);
  ReconcileKey out;
  ASSERT_TRUE(ParseReconcile(k.pos(), reinterpret_cast<const u8*>(&f), sizeof(f), &out).ok());
  EXPECT_TRUE(out.SameWork(k));
  EXPECT_EQ(out.since, k.since);
  // Every key a ranged read of its destination sees is inside the range.
  EXPECT_TRUE(ReconcileRangeFirst(k.dest) <= k.pos() && k.pos() <= ReconcileRangeLast(k.dest));
  EXPECT_TRUE(ReconcileRangeLast(k.dest) < ReconcileRangeFirst(u8(k.dest + 1)));

  auto parse = [&](const ReconcileKey& key, const ReconcileFormat& v, u32 len = sizeof(ReconcileFormat)) {
    return ParseReconcile(key.pos(), reinterpret_cast<const u8*>(&v), len, &out);
  };
  struct Case {
    const char* name;
    void (*edit)(ReconcileKey&, ReconcileFormat&);
  };
  const Case cases[] = {
      {"cookie code", [](ReconcileKey& x, ReconcileFormat&) { x.dest = kDestCookie; }},
      {"code past the last", [](ReconcileKey& x, ReconcileFormat&) { x.dest = kDestLast + 1; }},
      {"stuck code past the last", [](ReconcileKey& x, ReconcileFormat& v) {
         x.dest = kDestStuck | (kDestLast + 1);
         v.reasons = kWorkDurability;
       }},
      {"inode 0", [](ReconcileKey& x, ReconcileFormat&) { x.ino = 0; }},
      {"end 0", [](ReconcileKey& x, ReconcileFormat&) { x.end = 0; }},
      {"no reason", [](ReconcileKey&, ReconcileFormat& v) { v.reasons = 0; }},
      {"unknown reason", [](ReconcileKey&, ReconcileFormat& v) { v.reasons |= 0x10; }},
      {"reserved", [](ReconcileKey&, ReconcileFormat& v) { v.reserved[2] = 1; }},
      {"stuck placement", [](ReconcileKey& x, ReconcileFormat&) { x.dest |= kDestStuck; }},
      {"no-I/O with placement", [](ReconcileKey& x, ReconcileFormat&) { x.dest = kDestNoIo; }},
      {"stuck no-I/O", [](ReconcileKey& x, ReconcileFormat& v) {
         x.dest = kDestNoIo | kDestStuck;
         v.reasons = kWorkDurability;
       }},
      {"cache-only on a member", [](ReconcileKey&, ReconcileFormat& v) { v.reasons = kWorkCacheOnly; }},
      {"compression with cache-only, no move", [](ReconcileKey&, ReconcileFormat& v) {
         v.reasons = kWorkCompress | kWorkCacheOnly;
       }},
  };
  for (const Case& c : cases) {
    ReconcileKey x = k;
    ReconcileFormat v = BuildReconcile(x);
    c.edit(x, v);
    EXPECT_EQ(parse(x, v).code(), Err::kCorrupt) << c.name;
  }
  for (u32 len : {0u, 7u, 9u, 16u}) EXPECT_EQ(parse(k, f, len).code(), Err::kCorrupt) << len;
  btree::Pos other = k.pos();
  other.btree_id = btree::kBtreeExtents;
  EXPECT_EQ(ParseReconcile(other, reinterpret_cast<const u8*>(&f), sizeof(f), &out).code(), Err::kCorrupt);
  // The valid edges: stuck durability, cache-only without I/O, the last inode.
  ReconcileKey edge = k;
  edge.dest = (kDestMember + 0) | kDestStuck;
  edge.reasons = kWorkDurability;
  edge.ino = btree::kInoLimit - 1;
  EXPECT_TRUE(parse(edge, BuildReconcile(edge)).ok());
  EXPECT_EQ(out.ino, btree::kInoLimit - 1);
  EXPECT_EQ(out.dest, edge.dest);
  edge.dest = kDestNoIo;
  edge.reasons = kWorkCacheOnly;
  EXPECT_TRUE(parse(edge, BuildReconcile(edge)).ok());
  // Random bytes (biased towards valid ones) never crash, and what parses
  // rebuilds to the same bytes.
  std::mt19937 rng(223);
  u32 parsed = 0;
  for (int i = 0; i < 20000; i++) {
    const u64 dest = rng() % 2 == 0 ? rng() % 0x100 : 1 + rng() % kDestLast;
    btree::Pos p{btree::kBtreeReconcile, (dest << 56) | ((u64(rng()) << 32 | rng()) & (btree::kInoLimit - 1)),
                 rng() % 4};
    ReconcileFormat v;
    u8* b = reinterpret_cast<u8*>(&v);
    for (u32 j = 0; j < sizeof(v); j++) b[j] = u8(rng() % 3 == 0 ? 0 : rng());
    if (rng() % 2 == 0) {
      v.reasons = u8(rng() % 16);
      v.reserved[0] = v.reserved[1] = v.reserved[2] = 0;
    }
    if (!ParseReconcile(p, b, sizeof(v), &out).ok()) continue;
    parsed++;
    EXPECT_TRUE(out.pos() == p);
    const ReconcileFormat back = BuildReconcile(out);
    EXPECT_EQ(memcmp(&back, &v, sizeof(v)), 0);
  }
  EXPECT_GT(parsed, 1000u);  // (the round trip ran)
}

TEST(ReconcileKeyTest, AnExtentsKeyIsItsWorkAtItsPosition) {
  const MemberTable t = TwoTier();
  ReconcileKey k;
  bool bad = false;
  ASSERT_TRUE(ReconcileKeyOf(t, On(5, 40, {{0, false}}), 1234, &k, &bad));
  EXPECT_FALSE(bad);
  EXPECT_EQ(k.dest, kDestMember + 1);
  EXPECT_EQ(k.ino, 5u);
  EXPECT_EQ(k.end, 40u);
  EXPECT_EQ(k.reasons, kWorkPlacement);
  EXPECT_EQ(k.since, 1234u);
  EXPECT_FALSE(ReconcileKeyOf(t, On(5, 40, {{0, true}, {1, false}}), 1, &k));  // placed: nothing
  Extent e = On(5, 40, {{0, false}});
  e.policy.reserved = 9;  // unreadable: the filesystem's options, and said so
  ASSERT_TRUE(ReconcileKeyOf(t, e, 1, &k, &bad));
  EXPECT_TRUE(bad);
  // No key can hold inode 0 or one past the limit (the parsers refuse such
  // extents before they get here).
  for (const u64 ino : {u64(0), btree::kInoLimit, ~u64(0)})
    EXPECT_FALSE(ReconcileKeyOf(t, On(ino, 40, {{0, false}}), 1, &k)) << ino;
}

// QueueReconcile on a throwaway filesystem's trees, read back by committing.
class QueueReconcileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = testing::FormattedMember();
    ASSERT_TRUE(testing::OpenStore(&store_, {dev_.get()}).ok());
  }
  void TearDown() override { EXPECT_TRUE(store_.Close().ok()); }
  std::vector<ReconcileKey> Tree() {
    std::vector<ReconcileKey> out;
    btree::Iterator it(&store_.btrees(), btree::kBtreeReconcile);
    EXPECT_TRUE(it.SeekToFirst().ok());
    for (; it.Valid(); (void)it.Next()) {
      ReconcileKey k;
      EXPECT_TRUE(ParseReconcile(it.pos(), it.value(), it.val_bytes(), &k).ok());
      out.push_back(k);
    }
    return out;
  }
  u32 Apply(const Extent* old, const Extent* now, u32 now_s) {
    btree::Transaction tx(&store_.btrees());
    EXPECT_TRUE(QueueReconcile(&tx, t_, old, now, now_s).ok());
    const u32 n = tx.size();
    EXPECT_TRUE(tx.Commit().ok());
    return n;
  }
  MemberTable t_ = TwoTier();
  std::unique_ptr<userspace::MemDevice> dev_;
  store::Store store_;
};

TEST_F(QueueReconcileTest, QueuesExactlyTheChangeAndKeepsTheAgeOfTheSameWork) {
  const Extent a = On(5, 40, {{0, false}});  // on the ssd: placement to the hdd
  EXPECT_EQ(Apply(nullptr, &a, 100), 1u);
  auto tree = Tree();
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree[0].reasons, kWorkPlacement);
  EXPECT_EQ(tree[0].since, 100u);
  // An edit that leaves the work as it was: nothing queued, the age kept.
  Extent a2 = a;
  a2.ptrs[0].offset = 1 << 20;
  EXPECT_EQ(Apply(&a, &a2, 200), 0u);
  EXPECT_EQ(Tree()[0].since, 100u);
  // The same position with other work: one set, the age restarts.
  Extent b = a2;
  b.policy.compression = kCompressZstd;
  EXPECT_EQ(Apply(&a2, &b, 300), 1u);
  tree = Tree();
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree[0].reasons, kWorkPlacement | kWorkCompress);
  EXPECT_EQ(tree[0].since, 300u);
  // The hdd copy written: cache-only work, another destination -- the old
  // key deleted, the new one set.
  Extent c = On(5, 40, {{0, false}, {1, false}});
  EXPECT_EQ(Apply(&b, &c, 400), 2u);
  tree = Tree();
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree[0].dest, kDestNoIo);
  EXPECT_EQ(tree[0].reasons, kWorkCacheOnly);
  // Done: the key goes; nothing comes.
  const Extent d = On(5, 40, {{0, true}, {1, false}});
  EXPECT_EQ(Apply(&c, &d, 500), 1u);
  EXPECT_TRUE(Tree().empty());
  EXPECT_EQ(Apply(&d, &d, 600), 0u);
  // A punch's piece keeps its end when the back is cut: another position
  // (the end moved) -- delete and set.
  EXPECT_EQ(Apply(nullptr, &a, 700), 1u);
  Extent front = a;
  front.end = 38;
  EXPECT_EQ(Apply(&a, &front, 800), 2u);
  tree = Tree();
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree[0].end, 38u);
  // Deleted; an unwritten extent has none.
  EXPECT_EQ(Apply(&front, nullptr, 900), 1u);
  EXPECT_TRUE(Tree().empty());
  Extent u;
  u.ino = 5;
  u.start = 0;
  u.end = 64;
  u.unwritten = true;
  EXPECT_EQ(Apply(nullptr, &u, 1000), 0u);
  EXPECT_TRUE(Tree().empty());
}

// A delete of an extent and a set of a new one at the same position in one
// transaction (a foreground overwrite: the punch, then the write) leave the
// new key, its age restarted -- the set after the delete wins.
TEST_F(QueueReconcileTest, AnUnreadablePolicyIsReported) {
  Extent a = On(5, 40, {{0, false}});
  a.policy.flags = 0x80;
  btree::Transaction tx(&store_.btrees());
  bool bad = false;
  ASSERT_TRUE(QueueReconcile(&tx, t_, nullptr, &a, 1, &bad).ok());
  EXPECT_TRUE(bad);
  bad = false;
  ASSERT_TRUE(QueueReconcile(&tx, t_, &a, nullptr, 1, &bad).ok());
  EXPECT_TRUE(bad);
}

TEST_F(QueueReconcileTest, AnOverwriteRestartsTheAge) {
  const Extent a = On(5, 40, {{0, false}});
  EXPECT_EQ(Apply(nullptr, &a, 100), 1u);
  btree::Transaction tx(&store_.btrees());
  ASSERT_TRUE(QueueReconcile(&tx, t_, &a, nullptr, 200).ok());
  ASSERT_TRUE(QueueReconcile(&tx, t_, nullptr, &a, 200).ok());
  ASSERT_TRUE(tx.Commit().ok());
  const auto tree = Tree();
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree[0].since, 200u);
}

}  // namespace
}  // namespace tfs::data
