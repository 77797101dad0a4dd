// Smoke tests of the tree layer through the store: random updates against a
// std::map across splits, merges and root changes; clean reopen; a power cut
// after a durable commit; a checkpoint mid-way. The thorough model, concurrency
// and corruption suites are in tree_test.cc.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "btree/tree.h"
#include "mount/testing.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::btree {
namespace {

using store::Store;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

constexpr u64 kSize = 64ull << 20;
using Model = std::map<std::pair<u64, u64>, u64>;

std::unique_ptr<MemDevice> Dev(std::vector<uint8_t> image = {}) {
  MemDeviceOptions o;
  o.name = "ssd0";
  o.size = kSize;
  o.volatile_cache = true;
  o.initial_image = std::move(image);
  return std::make_unique<MemDevice>(o);
}

Status Open(Store* e, MemDevice* d, bool writer = false) {
  store::OpenOptions o;
  o.btree.writer_thread = writer;
  o.btree.cache_bytes = 1 << 20;
  return testing::OpenStore(e, {d}, o);
}

void ExpectTreeEquals(Btrees& t, const Model& m) {
  Iterator it(&t, kBtreeTest);
  ASSERT_TRUE(it.SeekToFirst().ok());
  auto mi = m.begin();
  for (; it.Valid(); (void)it.Next(), ++mi) {
    ASSERT_NE(mi, m.end());
    ASSERT_EQ(it.pos(), (Pos{kBtreeTest, mi->first.first, mi->first.second}));
    ASSERT_EQ(it.val_bytes(), 8u);
    u64 v;
    memcpy(&v, it.value(), 8);
    ASSERT_EQ(v, mi->second);
  }
  ASSERT_EQ(mi, m.end());
  auto ri = m.rbegin();
  ASSERT_TRUE(it.SeekToLast().ok());
  for (; it.Valid(); (void)it.Prev(), ++ri) {
    ASSERT_NE(ri, m.rend());
    ASSERT_EQ(it.pos(), (Pos{kBtreeTest, ri->first.first, ri->first.second}));
  }
  ASSERT_EQ(ri, m.rend());
  for (const auto& [k, v] : m) {
    u64 got = 0;
    auto r = t.Get(Pos{kBtreeTest, k.first, k.second}, &got, 8);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(got, v);
  }
}

TEST(TreeSmokeTest, RandomUpdatesReopenAndPowerCut) {
  auto d = Dev();
  ASSERT_TRUE(testing::FormatMembers({d.get()}, testing::SmallFormat(4096)).ok());
  Model m;
  std::mt19937_64 rng(7);
  {
    Store e;
    ASSERT_TRUE(Open(&e, d.get()).ok());
    Btrees& t = e.btrees();
    for (int i = 0; i < 30000; i++) {
      Transaction tx(&t);
      u64 k = rng() % 20000;
      if (rng() % 3 == 0) {
        ASSERT_TRUE(tx.Delete(Pos{kBtreeTest, k, 0}).ok());
        m.erase({k, 0});
      } else {
        u64 v = rng();
        ASSERT_TRUE(tx.Set(Pos{kBtreeTest, k, 0}, &v, 8).ok());
        m[{k, 0}] = v;
      }
      auto r = tx.Commit();
      ASSERT_TRUE(r.ok()) << r.status().Message();
      if (i == 15000) {
        ASSERT_TRUE(t.Checkpoint().ok());
      }
    }
    ExpectTreeEquals(t, m);
    Stats s = t.GetStats();
    EXPECT_GT(s.splits, 0u);
    EXPECT_GT(s.root_grows, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  {
    Store e;
    ASSERT_TRUE(Open(&e, d.get()).ok());
    ExpectTreeEquals(e.btrees(), m);
    // Delete almost everything: merges and root shrink.
    for (auto it = m.begin(); it != m.end();) {
      if (it->first.first % 500 == 0) {
        ++it;
        continue;
      }
      Transaction tx(&e.btrees());
      ASSERT_TRUE(tx.Delete(Pos{kBtreeTest, it->first.first, 0}).ok());
      ASSERT_TRUE(tx.Commit().ok());
      it = m.erase(it);
    }
    ExpectTreeEquals(e.btrees(), m);
    EXPECT_GT(e.btrees().GetStats().merges, 0u);
    EXPECT_GT(e.btrees().GetStats().root_shrinks, 0u);
    EXPECT_EQ(e.btrees().GetStats().depth[kBtreeTest], 1u);
    // A durable commit, then more that are not, then a power cut.
    Transaction tx(&e.btrees());
    u64 v = 42;
    ASSERT_TRUE(tx.Set(Pos{kBtreeTest, 1, 1}, &v, 8).ok());
    ASSERT_TRUE(tx.Commit(journal::CommitMode::kFlush).ok());
    m[{1, 1}] = 42;
    auto cut = Dev(d->SnapshotDurable());
    Store e2;
    ASSERT_TRUE(Open(&e2, cut.get()).ok());
    ExpectTreeEquals(e2.btrees(), m);
    ASSERT_TRUE(e2.Close().ok());
    ASSERT_TRUE(e.Close().ok());
  }
}

}  // namespace
}  // namespace tfs::btree
