// The name tables' rules (names.h) on raw keys of a store with no posix on it,
// as fsck calls them: probing and removal around a key that does not parse,
// which posix refuses (Damaged::kFail) and fsck walks past (kOccupied).
#include "posix/names.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mount/testing.h"

namespace tfs::posix {
namespace {

constexpr u64 kDir = 100;  // the table's owner (no inode needed)
constexpr u64 kSeed = 7;
// One hash bit: two home slots, kFirstSlot and kFirstSlot + 1.
const NameTable kTable{btree::kBtreeDirents, kDir, kSeed, 1};

btree::Pos Slot(u64 slot) { return btree::Pos{btree::kBtreeDirents, kDir, slot}; }

// n distinct names whose home slot is kFirstSlot.
std::vector<std::string> NamesHomedFirst(u32 n) {
  std::vector<std::string> out;
  for (u32 i = 0; out.size() < n; i++) {
    std::string s = "n" + std::to_string(i);
    if (NameHash(kSeed, 1, s.data(), u32(s.size())) == kFirstSlot) out.push_back(s);
  }
  return out;
}

struct NamesTest : ::testing::Test {
  std::unique_ptr<userspace::MemDevice> dev = testing::FormattedMember();
  store::Store store;
  btree::Btrees* trees = nullptr;

  void SetUp() override {
    ASSERT_TRUE(testing::OpenStore(&store, {dev.get()}).ok());
    trees = &store.btrees();
  }
  void TearDown() override { EXPECT_TRUE(store.Close().ok()); }

  // Slots from kFirstSlot on: a name ("" a tombstone, "!" a key that does not parse).
  void Write(const std::vector<std::string>& slots) {
    btree::Transaction tx(trees);
    for (size_t i = 0; i < slots.size(); i++) {
      u8 v[kDirentMax];
      u32 len;
      if (slots[i] == "!") {
        len = 3;  // shorter than any entry's header
        MemSet(v, 0xee, len);
      } else if (slots[i].empty()) {
        DirentFormat d;
        MemSet(&d, 0, sizeof(d));
        d.type = kDtTombstone;
        MemCopy(v, &d, sizeof(d));
        len = sizeof(d);
      } else {
        len = BuildDirent(v, 1000 + i, kDtReg, slots[i].data(), u32(slots[i].size()));
      }
      ASSERT_TRUE(tx.Set(Slot(kFirstSlot + i), v, len).ok());
    }
    ASSERT_TRUE(tx.Commit().ok());
  }
  bool Has(u64 slot) {
    u8 v[kDirentMax];
    return trees->Get(Slot(slot), v, sizeof(v)).ok();
  }
  Status Remove(u64 slot, Damaged damaged) {
    btree::Transaction tx(trees);
    TFS_TRY(QueueRemoveEntry(trees, &tx, btree::kBtreeDirents, kDir, slot, damaged));
    return tx.Commit().status();
  }
};

TEST_F(NamesTest, ADamagedKeyFailsAProbeOrIsWalkedPast) {
  const std::vector<std::string> n = NamesHomedFirst(3);
  Write({n[0], "!", n[1]});
  Entry e;
  EXPECT_TRUE(FindEntry(trees, kTable, n[0].data(), u32(n[0].size()), &e).ok());  // before the damage
  EXPECT_TRUE(e.found);
  EXPECT_EQ(e.slot, kFirstSlot);
  EXPECT_EQ(e.ino, 1000u);
  EXPECT_TRUE(FindEntry(trees, kTable, n[1].data(), u32(n[1].size()), &e).Is(ErrorClass::kCorrupt));
  // fsck's walk: the damaged key occupies its slot, the chain runs on.
  ASSERT_TRUE(FindEntry(trees, kTable, n[1].data(), u32(n[1].size()), &e, nullptr, Damaged::kOccupied).ok());
  EXPECT_TRUE(e.found);
  EXPECT_EQ(e.slot, kFirstSlot + 2);
  ASSERT_TRUE(FindEntry(trees, kTable, n[2].data(), u32(n[2].size()), &e, nullptr, Damaged::kOccupied).ok());
  EXPECT_FALSE(e.found);
  EXPECT_EQ(e.free, kFirstSlot + 3);  // the gap, not the damaged slot
}

// An entry naming an inode number past the limit (btree::kInoLimit) does
// not parse; the last number below it does.
TEST(NamesFormatTest, AnEntryPastTheInodeLimitIsCorrupt) {
  for (const u64 ino : {btree::kInoLimit - 1, btree::kInoLimit, ~u64(0)}) {
    u8 v[kDirentMax];
    const u32 len = BuildDirent(v, ino, kDtReg, "a", 1);
    DirentFormat d;
    const char* name = nullptr;
    EXPECT_EQ(ParseNamedEntry(btree::kBtreeDirents, v, len, &d, &name).ok(), ino < btree::kInoLimit) << ino;
  }
}

TEST_F(NamesTest, ARemovalKeepsChainsWholeAndStopsAtADamagedKey) {
  const std::vector<std::string> n = NamesHomedFirst(3);
  // The next slot in use: a tombstone.
  Write({n[0], n[1]});
  ASSERT_TRUE(Remove(kFirstSlot, Damaged::kFail).ok());
  Entry e;
  ASSERT_TRUE(FindEntry(trees, kTable, n[0].data(), u32(n[0].size()), &e).ok());
  EXPECT_FALSE(e.found);
  EXPECT_EQ(e.free, kFirstSlot);
  ASSERT_TRUE(FindEntry(trees, kTable, n[1].data(), u32(n[1].size()), &e).ok());
  EXPECT_EQ(e.slot, kFirstSlot + 1);
  // The chain's end: the entry goes with the tombstones before it.
  ASSERT_TRUE(Remove(kFirstSlot + 1, Damaged::kFail).ok());
  EXPECT_FALSE(Has(kFirstSlot));
  EXPECT_FALSE(Has(kFirstSlot + 1));
  // A damaged key before those tombstones: posix refuses, fsck keeps it.
  Write({"!", "", n[2]});
  EXPECT_TRUE(Remove(kFirstSlot + 2, Damaged::kFail).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(Has(kFirstSlot + 2));  // (nothing committed)
  ASSERT_TRUE(Remove(kFirstSlot + 2, Damaged::kOccupied).ok());
  EXPECT_TRUE(Has(kFirstSlot));
  EXPECT_FALSE(Has(kFirstSlot + 1));
  EXPECT_FALSE(Has(kFirstSlot + 2));
}

}  // namespace
}  // namespace tfs::posix
