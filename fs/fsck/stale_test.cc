// Issue 18, items 2 and 3: damaged allocation state or a damaged newest roots
// block must not make mount go on with older state silently. Mount
// (read-write) refuses with the reason; a read-only open says why; fsck -n
// reports it (exit 4); fsck -y rebuilds the allocation state from the btrees
// (exit 1, then clean, every file intact) and lost roots from a node scan.
// Since format version 3 the allocation state is the alloc btree
// (docs/format/alloc.md): its damage is a damaged node (dropped, then the
// state rebuilt) or a hostile record. Item 4: a damaged journal entry that
// durable ones follow is refused the same way, and fsck -y replays past it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "alloc/format.h"
#include "btree/format.h"
#include "btree/tree.h"
#include "data/data.h"
#include "fsck/fsck.h"
#include "fsck/testing.h"
#include "journal/format.h"
#include "posix/fs.h"
#include "sb/format.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

using posix::Caller;
using posix::Filesystem;
using namespace fixture;  // NOLINT: the test images' helpers

TEST(FsckStaleTest, DamagedAllocNodeRefusesMountAndFsckRebuildsTheAllocationState) {
  Image img;
  Populate(img, 3, 8);
  img.DamageNewest(false);  // the alloc tree's root
  store::OpenReport rep;
  Diag d;
  Status st = img.Open(false, &rep, &d);
  ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << "a read-write mount used a damaged alloc node: " << d.text;
  EXPECT_NE(std::string(d.text).find("btree 4 root"), std::string::npos) << d.text;
  const Repair fix = ExpectReportedRepairedClean(img, "would drop the damaged level-0 node",
                                                 "rebuilt every member's allocation state");
  EXPECT_EQ(fix.report.find("stale extent pointer"), std::string::npos) << fix.report;  // not checked against it
  EXPECT_EQ(fix.repair.find("data lost"), std::string::npos) << fix.repair;
  img.ExpectFiles(24);
  // And new writes after the rebuild overwrite nothing.
  img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 24, 40); });
  img.ExpectFiles(40);
  auto [r4, out4] = img.Fsck(false);
  EXPECT_EQ(r4.exit_code, kExitClean) << out4;
}

// The same for a damaged alloc *leaf* below an interior root: the mount
// reads no leaf before it loads the allocator, so it is the load's walk that
// meets the damage -- and refuses in one line naming the node and fsck -y;
// fsck -n reports it, fsck -y drops it and rebuilds the allocation state.
TEST(FsckStaleTest, DamagedAllocLeafBelowTheRootIsRefusedAndRepaired) {
  Image img(4096);  // 4 KiB nodes: at most 84 records a leaf
  const std::string chunk(256 << 10, 'z');
  std::vector<std::string> names;
  img.WithFs([&](Filesystem& fs, store::Store& e) {
    // About 150 data buckets, each with a record.
    for (int i = 0; i < 150; i++) {
      const std::string name = "z" + std::to_string(i);
      auto a = fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
      ASSERT_TRUE(a.ok());
      std::string c = chunk;
      c[0] = char(i);
      ASSERT_TRUE(fs.Write(a.value().ino, 0, c.data(), u32(c.size())).ok());
      ASSERT_TRUE(fs.Fsync(a.value().ino).ok());
      names.push_back(name);
    }
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
  });
  ASSERT_EQ(names.size(), 150u);
  // An alloc leaf of a tree of two levels or more.
  u64 leaf = 0;
  u32 alloc_leaves = 0, root_level = 0;
  {
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = true;
    ASSERT_TRUE(testing::OpenStore(&e, {img.dev.get()}, oo).ok());
    struct Ctx {
      u64* leaf;
      u32* leaves;
      u32* root_level;
    } ctx{&leaf, &alloc_leaves, &root_level};
    Diag d;
    ASSERT_TRUE(e.btrees()
                    .ForEachNode(
                        [](void* c, const btree::Btrees::NodeVisit& v) -> Status {
                          auto* x = static_cast<Ctx*>(c);
                          if (v.node->info().btree_id != btree::kBtreeAlloc) return Status::Ok();
                          if (v.node->info().level > *x->root_level) *x->root_level = v.node->info().level;
                          if (v.node->info().level == 0 && ++*x->leaves == 2)
                            *x->leaf = btree::PtrCopy(*v.ptr, 0).offset;
                          return Status::Ok();
                        },
                        &ctx, &d)
                    .ok())
        << d.text;
    ASSERT_TRUE(e.Close().ok());
  }
  ASSERT_GE(root_level, 1u) << "the alloc tree is one leaf";
  ASSERT_NE(leaf, 0u);
  u8 b;
  img.dev->ReadRaw(leaf + 200, &b, 1);
  b ^= 0x40;
  img.dev->WriteRaw(leaf + 200, &b, 1);

  store::OpenReport rep;
  Diag d;
  Status st = img.Open(false, &rep, &d);
  ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << "a read-write mount used a damaged alloc leaf: " << d.text;
  const std::string line(d.text);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_NE(line.find("alloc: btree 4: level-0 node at member 0 offset " + std::to_string(leaf) + ": "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("checksum mismatch"), std::string::npos) << line;
  EXPECT_NE(line.find("fsck -y"), std::string::npos) << line;
  const Repair fix = ExpectReportedRepairedClean(img, "would drop the damaged level-0 node",
                                                 "rebuilt every member's allocation state");
  EXPECT_EQ(fix.repair.find("data lost"), std::string::npos) << fix.repair;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    for (size_t i = 0; i < names.size(); i++) {
      auto a = fs.Lookup(posix::kRootIno, names[i].data(), u32(names[i].size()));
      ASSERT_TRUE(a.ok()) << names[i];
      std::string got(chunk.size(), '\0');
      auto n = fs.Read(a.value().ino, 0, got.data(), u32(got.size()));
      ASSERT_TRUE(n.ok()) << names[i] << ": " << n.status().Message();
      std::string want = chunk;
      want[0] = char(i);
      EXPECT_TRUE(n.value() == want.size() && got == want) << names[i];
    }
  });
}

// A record that fails its checks (docs/format/alloc.md, "Validity"): a
// read-write mount refuses in one line naming the member, the bucket and the
// rule; fsck -n reports it; fsck -y rebuilds the allocation state -- the bad
// record replaced, whatever version it claims -- and every file reads back.
// Also a key outside every member's buckets: deleted; and a record that
// looks like one (the merge rule would keep it against an older version)
// but breaks a rule: replaced all the same.
TEST(FsckStaleTest, AHostileAllocRecordIsReportedAndRepaired) {
  for (int kind = 0; kind < 4; kind++) {
    SCOPED_TRACE("kind " + std::to_string(kind));
    Image img;
    Populate(img, 2, 6);
    u64 bucket = 0;
    img.WithFs([&](Filesystem&, store::Store& e) {
      // A user bucket with data in it.
      for (u64 b = 0; b < e.alloc().nbuckets(0) && bucket == 0; b++)
        if (e.alloc().Get(0, b).state == alloc::BucketState::kUser) bucket = b;
      ASSERT_NE(bucket, 0u);
      alloc::AllocRecord rec;
      alloc::EncodeRecord(e.alloc().Get(0, bucket), &rec);
      btree::Pos pos{btree::kBtreeAlloc, 0, bucket};
      if (kind == 0) rec.state = 9;                             // unknown state
      if (kind == 1) rec.version.set(~u64(0));                  // a version no change count reaches
      if (kind == 2) pos.offset = e.alloc().nbuckets(0) + 7;    // outside the member
      if (kind == 3) {                                          // free with data, a high version
        rec.state = u8(alloc::BucketState::kFree);
        rec.live_sectors.set(8);
        rec.version.set(rec.version.get() + 1000);
      }
      btree::Transaction tx(&e.btrees());
      ASSERT_TRUE(tx.Set(pos, &rec, sizeof(rec)).ok());
      ASSERT_TRUE(tx.Commit().ok());
    });
    store::OpenReport rep;
    Diag d;
    Status st = img.Open(false, &rep, &d);
    ASSERT_EQ(st.code(), Err::kCorrupt) << "a read-write mount took a hostile record";
    const std::string line(d.text);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_NE(line.find("alloc: member ssd.a bucket"), std::string::npos) << line;
    const char* const why[] = {"unknown state 9", "version out of range", "outside the member",
                               "free, yet with live or cached sectors"};
    EXPECT_NE(line.find(why[kind]), std::string::npos)
        << line;
    EXPECT_NE(line.find("fsck -y"), std::string::npos) << line;
    store::OpenReport ro;
    ASSERT_TRUE(img.Open(true, &ro, &d).ok()) << d.text;  // read-only: goes on, says why
    EXPECT_EQ(ro.bad_alloc_records, 1u);
    ExpectReportedRepairedClean(img, "alloc: member ssd.a bucket", "rebuilt every member's allocation state");
    img.ExpectFiles(12);
    if (kind != 2) {
      img.WithFs([&](Filesystem&, store::Store& e) {
        EXPECT_EQ(e.alloc().Get(0, bucket).state, alloc::BucketState::kUser);  // the extents' bucket again
      });
    }
    img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 12, 20); });
    img.ExpectFiles(20);
  }
}

// A damaged newest roots block: the mount refuses (never the older roots),
// fsck -n reports it and writes nothing, fsck -y rebuilds every tree from
// the newest copies of its leaves a node scan finds, and every file is back.
TEST(FsckStaleTest, DamagedNewestRootsRefusesMountAndFsckRebuildsThem) {
  Image img;
  Populate(img, 3, 8);
  img.DamageNewest(true);
  store::OpenReport rep;
  Diag d;
  Status st = img.Open(false, &rep, &d);
  ASSERT_EQ(st.code(), Err::kCorrupt) << "a read-write mount used the older roots";
  EXPECT_NE(std::string(d.text).find("btree roots"), std::string::npos) << d.text;
  EXPECT_NE(std::string(d.text).find("fsck -y"), std::string::npos) << d.text;
  store::OpenReport ro;
  ASSERT_TRUE(img.Open(true, &ro, &d).ok()) << d.text;
  EXPECT_TRUE(ro.stale_roots);
  ExpectReportedRepairedClean(img, "btree roots", "btree roots: rebuilt every tree");
  img.ExpectFiles(24);
}

// Both roots slots damaged: no roots block at all. fsck -y rebuilds the
// trees from the node scan alone.
TEST(FsckStaleTest, BothRootsSlotsDamagedAreRebuiltFromANodeScan) {
  Image img;
  Populate(img, 3, 8);
  std::vector<u8> junk(2 * btree::kRootsSlotSize, 0x5a);
  img.dev->WriteRaw(btree::kRootsOffset, junk.data(), junk.size());
  store::OpenReport rep;
  Diag d;
  ASSERT_FALSE(img.Open(false, &rep, &d).ok());
  ExpectReportedRepairedClean(img, nullptr, "no valid roots block");
  img.ExpectFiles(24);
}

// After a crash: the journal's entries record the durable roots gen, so a
// damaged newest roots block is caught even though the superblock (written
// at mount) names an older one.
TEST(FsckStaleTest, DamagedRootsAfterACrashAreCaughtThroughTheJournal) {
  Image img;
  Populate(img, 1, 4);
  std::vector<u8> cut = img.WithFs([](Filesystem& fs, store::Store& e) {
    MakeFiles(fs, 4, 10);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    MakeFiles(fs, 10, 12);  // (fsync: an entry written after the checkpoints)
  }, /*crash=*/true);
  Image after(cut);
  after.DamageNewest(true);
  store::OpenReport rep;
  Diag d;
  Status st = after.Open(false, &rep, &d);
  ASSERT_EQ(st.code(), Err::kCorrupt) << "a read-write mount used the older roots";
  EXPECT_NE(std::string(d.text).find("journal"), std::string::npos) << d.text;
}

// A crash, then the alloc tree's root damaged: whatever the journal still
// holds, the files fsynced before the cut are intact -- through fsck -y's
// drop of the node and rebuild after the mount's refusal. Never silently
// lost.
TEST(FsckStaleTest, DamagedAllocNodeAfterACrashNeverLosesFsyncedFiles) {
  for (int round = 0; round < 3; round++) {
    Image img;
    Populate(img, 1, 4);
    std::vector<u8> cut = img.WithFs([&](Filesystem& fs, store::Store& e) {
      MakeFiles(fs, 4, 10);
      for (int k = 0; k <= round; k++) ASSERT_TRUE(e.btrees().Checkpoint().ok());
      MakeFiles(fs, 10, 14);
    }, /*crash=*/true);
    Image after(cut);
    after.DamageNewest(false);
    store::OpenReport rep;
    Diag d;
    Status st = after.Open(false, &rep, &d);
    ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << d.text;
    auto [r, out] = after.Fsck(true);
    EXPECT_EQ(r.exit_code, kExitRepaired) << out;
    EXPECT_EQ(out.find("data lost"), std::string::npos) << out;
    after.ExpectFiles(14);
    auto [r2, out2] = after.Fsck(false);
    EXPECT_EQ(r2.exit_code, kExitClean) << "round " << round << ": " << out2;
  }
}

// The rebuild marks node buckets first; an extent that points into one (a
// damaged pointer) must not turn it into a user bucket, which deleting the
// file would later free under live nodes. It is a bad extent, deleted by the
// data pass, and the trees stay whole.
TEST(FsckStaleTest, RebuildNeverGivesANodeBucketToAnExtent) {
  Image img;
  Populate(img, 3, 8);
  img.WithFs([](Filesystem&, store::Store& e) {
    u64 node_off = 0;
    Diag d;
    // A node of the inodes tree: the edit below leaves it where it is.
    ASSERT_TRUE(e.btrees().ForEachNode([](void* ctx, const btree::Btrees::NodeVisit& v) -> Status {
      if (v.node->info().btree_id == btree::kBtreeInodes) *static_cast<u64*>(ctx) = btree::PtrCopy(*v.ptr, 0).offset;
      return Status::Ok();
    }, &node_off, &d).ok()) << d.text;
    ASSERT_NE(node_off, 0u);
    // Point the first extent of some file into that node's bucket.
    btree::Iterator it(&e.btrees(), btree::kBtreeExtents);
    ASSERT_TRUE(it.SeekToFirst().ok());
    ASSERT_TRUE(it.Valid());
    data::Extent x;
    ASSERT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &x).ok());
    x.ptrs[0].offset = e.sb().BucketOffset(e.sb().BucketOf(node_off));
    std::vector<u8> v(data::kExtentValueMax);
    v.resize(data::BuildExtent(x, v.data()).value());
    const btree::Pos pos = it.pos();
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Set(pos, v.data(), u32(v.size())).ok());
    ASSERT_TRUE(tx.Commit().ok());
  });
  img.DamageNewest(false);
  auto [r, out] = img.Fsck(true);
  EXPECT_NE(out.find("rebuilt every member's allocation state"), std::string::npos) << out;
  EXPECT_NE(out.find("(1 bad extents left to the data pass)"), std::string::npos) << out;
  auto [r2, out2] = img.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  // Every file but the one whose extent was damaged reads back.
  int intact = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    for (int i = 0; i < 24; i++) {
      const std::string name = "f" + std::to_string(i);
      auto a = fs.Lookup(posix::kRootIno, name.data(), u32(name.size()));
      ASSERT_TRUE(a.ok()) << name;
      const std::string want = Content(i);
      std::string got(want.size(), '\0');
      auto rd = fs.Read(a.value().ino, 0, got.data(), u32(got.size()));
      intact += rd.ok() && got == want;
    }
    // Deleting them all frees no node bucket: the trees still walk afterwards.
    for (int i = 0; i < 24; i++) {
      const std::string name = "f" + std::to_string(i);
      ASSERT_TRUE(fs.Unlink(posix::kRootIno, name.data(), u32(name.size())).ok()) << name;
    }
    MakeFiles(fs, 100, 110);
  });
  EXPECT_EQ(intact, 23);
  auto [r3, out3] = img.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
}

// Issue 18, item 4: replay stopped at a damaged entry though durable entries
// followed, and dropped every fsync after it with only a warning. Now a
// read-write mount refuses, fsck -n reports it (exit 4), and fsck -y replays
// every surviving entry and repairs what the lost one changed: files fsynced
// after the damage are there.
TEST(FsckStaleTest, DamagedJournalEntryBeforeDurableOnesRefusesMountAndFsckReplaysPastIt) {
  Image img;
  Populate(img, 1, 4);
  std::vector<u8> cut = img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 4, 16); }, /*crash=*/true);
  Image after(cut);
  const std::vector<EntryAt> entries = JournalEntries(after);
  ASSERT_GE(entries.size(), 12u);
  const EntryAt victim = entries[entries.size() / 3];  // fsynced files follow it
  u8 v;
  after.dev->ReadRaw(victim.off + 60, &v, 1);  // (reserved header bytes: the crc fails)
  v ^= 0x5a;
  after.dev->WriteRaw(victim.off + 60, &v, 1);

  store::OpenReport rep;
  Diag d;
  Status st = after.Open(false, &rep, &d);
  ASSERT_EQ(st.code(), Err::kCorrupt) << "a read-write mount dropped the entries after the damage";
  EXPECT_NE(std::string(d.text).find("journal: entry " + std::to_string(victim.seq) + " is damaged"),
            std::string::npos) << d.text;
  EXPECT_NE(std::string(d.text).find("fsck -y"), std::string::npos) << d.text;
  store::OpenReport ro;
  ASSERT_TRUE(after.Open(true, &ro, &d).ok()) << d.text;  // read-only: up to the damage
  EXPECT_EQ(ro.replay.gap_at, victim.seq);
  // (The newest entry may be an unordered flush entry, which proves nothing.)
  EXPECT_GT(ro.replay.durable_end, victim.seq + 1);
  EXPECT_LE(ro.replay.durable_end, entries.back().seq);
  EXPECT_EQ(ro.replay.lost_entries, 1u);
  EXPECT_FALSE(ro.replayed_past_damage);

  const Repair fix =
      ExpectReportedRepairedClean(after, "is damaged, but later entries up to", "replayed every surviving entry");
  EXPECT_NE(fix.repair.find("rebuilt every member's allocation state"), std::string::npos) << fix.repair;
  // Files of the mount before, and those fsynced well after the damage.
  after.ExpectFiles(4);
  after.ExpectFiles(16, 13);
  // New writes overwrite nothing.
  after.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 16, 24); });
  after.ExpectFiles(24, 16);
  after.ExpectFiles(16, 13);
  auto [r4, out4] = after.Fsck(false);
  EXPECT_EQ(r4.exit_code, kExitClean) << out4;
}

// A journal that ends in a torn entry (nothing durable after it) is an
// ordinary crash: the mount goes on, fsck calls it a note.
TEST(FsckStaleTest, ATornLastJournalEntryIsNoDamage) {
  Image img;
  Populate(img, 1, 4);
  std::vector<u8> cut = img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 4, 8); }, /*crash=*/true);
  Image after(cut);
  const std::vector<EntryAt> entries = JournalEntries(after);
  ASSERT_GE(entries.size(), 2u);
  u8 v;
  after.dev->ReadRaw(entries.back().off + 60, &v, 1);
  v ^= 0x5a;
  after.dev->WriteRaw(entries.back().off + 60, &v, 1);
  auto [r, out] = after.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  store::OpenReport rep;
  Diag d;
  ASSERT_TRUE(after.Open(false, &rep, &d).ok()) << d.text;
  EXPECT_EQ(rep.replay.durable_end, 0u);
}

// Found by tierlab crash (with tables): a cut while a mount persists what it
// replayed could leave the new roots durable and the allocation state not, so
// a reachable node's bucket was "free". With the alloc btree the same holds
// by design for the mount's checkpoint: it runs before the journal, so the
// records of the buckets it takes are in memory only until a later
// checkpoint -- a cut in between leaves them free on disk. The trees are the
// truth: the next mount marks the buckets before it allocates anything
// (Btrees::ReconcileBuckets), so fsck -n calls it a note of an unclean image,
// not an error.
TEST(FsckStaleTest, NodesInBucketsTheRecordsCallFreeAfterACutOpenAreANote) {
  Image img(256 * 1024);  // every node written goes to a new bucket
  Populate(img, 2, 6);
  const std::vector<u8> crashed =
      img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 12, 20); }, /*crash=*/true);
  // The mount after the crash, up to the end of its open: replayed, then its
  // checkpoint's nodes and roots written; the cut right then.
  Image reopened(crashed);
  std::vector<u8> opened;
  {
    store::Store e;
    ASSERT_TRUE(testing::OpenStore(&e, {reopened.dev.get()}).ok());
    opened = reopened.dev->SnapshotDurable();
    ASSERT_TRUE(e.Close().ok());
  }
  Image cut(opened);
  auto [r, out] = cut.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  ASSERT_NE(out.find("nodes but is free (not cleanly unmounted: the next mount marks it)"), std::string::npos)
      << "the cut did not leave a node in a bucket the records call free:\n" << out;
  cut.ExpectFiles(20);
  cut.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 20, 40); });  // overwrites no node
  cut.ExpectFiles(40);
  auto [r2, out2] = cut.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_EQ(out2.find("but is free"), std::string::npos) << out2;
}

// Found by tierlab crash: a cut while a mount writes the superblocks leaves the
// copies different (or one torn). On an image not cleanly unmounted that is a
// note (every open uses the newer valid copy, and the mount writes both); fsck
// exited 4. On a clean image it stays an error (FsckTest).
TEST(FsckStaleTest, SuperblockCopiesCutShortAfterACrashAreANote) {
  Image img;
  Populate(img, 1, 4);
  const std::vector<u8> cut = img.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 4, 8); }, true);
  Image after(cut);
  const u8 junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  after.dev->WriteRaw(sb::kSbBackupOffset + 300, junk, sizeof(junk));
  auto [r, out] = after.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("superblock copies disagree (backup: "), std::string::npos) << out;
  EXPECT_NE(out.find("(not cleanly unmounted: the next mount writes both)"), std::string::npos) << out;
  after.ExpectFiles(8);
  auto [r2, out2] = after.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_EQ(out2.find("disagree"), std::string::npos) << out2;
  // A cut between a clean unmount's two writes: the primary clean, the backup
  // still the mounted (unclean) one.
  std::vector<u8> mounted_sb(sb::kSbSize);
  after.WithFs([&](Filesystem&, store::Store&) {
    after.dev->ReadRaw(sb::kSbBackupOffset, mounted_sb.data(), mounted_sb.size());
  });
  after.dev->WriteRaw(sb::kSbBackupOffset, mounted_sb.data(), mounted_sb.size());
  auto [r3, out3] = after.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  EXPECT_NE(out3.find("superblock copies disagree (different contents) (not cleanly"), std::string::npos) << out3;
}

// Found by tierlab crash (with tables): an allocation table written while a
// free's journal entry (and the transaction before it that dropped the
// extent) was not yet durable held the free. A crash then left a live extent
// in a bucket the table called free -- the next writes there destroy the
// file (fsck -n: "stale extent pointer"). An alloc leaf is journal-ordered: a
// checkpoint right after the free flushes the journal before its roots block,
// so whatever state survives the crash, the free and the extent's drop come
// together.
TEST(FsckStaleTest, AFreeIsNeverCheckpointedBeforeItsJournalEntry) {
  Image img;
  const std::string big(1 << 20, 'q');  // four buckets of its own
  img.WithFs([&](Filesystem& fs, store::Store&) {
    auto a = fs.Mknod(posix::kRootIno, "big", 3, posix::kModeReg | 0644, 0, kRoot);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(fs.Write(a.value().ino, 0, big.data(), u32(big.size())).ok());
    ASSERT_TRUE(fs.Fsync(a.value().ino).ok());
  });
  const std::vector<u8> cut = img.WithFs([&](Filesystem& fs, store::Store& e) {
    auto a = fs.Lookup(posix::kRootIno, "big", 3);
    ASSERT_TRUE(a.ok());
    const u64 frees = e.alloc().Stats().frees;
    posix::SetAttr set;
    set.valid = posix::kSetSize;
    set.size = 0;
    ASSERT_TRUE(fs.SetAttrs(a.value().ino, set).ok());  // no fsync: the entry may not be durable yet
    ASSERT_GT(e.alloc().Stats().frees, frees) << "the truncate freed no bucket";
    ASSERT_TRUE(e.btrees().Checkpoint().ok());  // the alloc leaf written right then
  }, /*crash=*/true);
  Image after(cut);
  auto [r, out] = after.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_EQ(out.find("stale extent pointer"), std::string::npos) << out;
  // Whichever state survived, writes after the mount destroy nothing.
  after.WithFs([](Filesystem& fs, store::Store&) { MakeFiles(fs, 0, 40); });
  after.ExpectFiles(40);
  after.WithFs([&](Filesystem& fs, store::Store&) {
    auto a = fs.Lookup(posix::kRootIno, "big", 3);
    ASSERT_TRUE(a.ok());
    std::string got(big.size(), '\0');
    auto n = fs.Read(a.value().ino, 0, got.data(), u32(got.size()));
    ASSERT_TRUE(n.ok()) << n.status().Message();
    if (n.value() != 0) {  // the truncate was lost with its entry: the old data, whole
      EXPECT_EQ(n.value(), big.size());
      EXPECT_TRUE(got == big);
    }
  });
  auto [r2, out2] = after.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
}

}  // namespace
}  // namespace tfs::fsck
