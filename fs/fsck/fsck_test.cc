#include "fsck/fsck.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mount/testing.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

struct Fs {
  std::unique_ptr<userspace::MemDevice> ssd, hdd;
  std::vector<std::string> lines;

  // node_size: small nodes make a multi-level tree out of a few thousand keys.
  // metadata_everywhere: both members hold btree nodes (no foreground or
  // metadata target).
  explicit Fs(u32 node_size = 64 << 10, bool metadata_everywhere = false) {
    userspace::MemDeviceOptions o;
    o.size = 32 << 20;
    o.name = "ssd0";
    ssd = std::make_unique<userspace::MemDevice>(o);
    o.name = "hdd0";
    hdd = std::make_unique<userspace::MemDevice>(o);
    store::FormatOptions f = testing::TwoTierFormat();
    f.btree_node_size = node_size;
    if (metadata_everywhere) f.foreground_target = f.metadata_target = "";
    testing::FormatTwoTier(ssd.get(), hdd.get(), f).IgnoreError();  // (a failure is the test's already)
  }
  Report Run(bool repair) {
    lines.clear();
    BlockDevice* devs[2] = {hdd.get(), ssd.get()};
    Options o;
    o.repair = repair;
    return Check(devs, 2, o, [](void* ctx, const char* line) {
      static_cast<std::vector<std::string>*>(ctx)->push_back(line);
    }, &lines);
  }
  // Opens the filesystem (read-write unless `oo` says); the caller closes it.
  Status Open(store::Store* e, const store::OpenOptions& oo = store::OpenOptions{}) {
    return testing::OpenStore(e, {ssd.get(), hdd.get()}, oo);
  }
  userspace::MemDevice* Member(u8 m) { return m == 0 ? ssd.get() : hdd.get(); }
  std::string Text() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

TEST(FsckTest, FreshFilesystemIsClean) {
  Fs fs;
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(r.errors, 0u);
}

TEST(FsckTest, CorruptPrimarySuperblockIsReportedAndRepaired) {
  Fs fs;
  u8 junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  fs.hdd->WriteRaw(sb::kSbPrimaryOffset + 300, junk, sizeof(junk));
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("superblock copies disagree"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

TEST(FsckTest, AllocationStateThatContradictsTheLayoutIsRepaired) {
  Fs fs;
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    u64 jb = e.sb().members[0].journal_first_bucket;
    ASSERT_TRUE(e.alloc().RepairState(0, jb, alloc::BucketState::kUser).ok());      // journal bucket lost
    ASSERT_TRUE(e.alloc().RepairState(1, 20, alloc::BucketState::kJournal).ok());   // stray journal bucket
    ASSERT_TRUE(e.Close().ok());
  }
  // Records that contradict the layout fail their checks (docs/format/alloc.md,
  // "Validity"): a mount refuses, fsck -n reports them, fsck -y rebuilds.
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_EQ(r.errors, 2u) << fs.Text();
  EXPECT_NE(fs.Text().find("state user where the layout has journal"), std::string::npos) << fs.Text();
  EXPECT_NE(fs.Text().find("1 more bad allocation records"), std::string::npos) << fs.Text();
  {
    store::Store e;
    BlockDevice* devs[2] = {fs.ssd.get(), fs.hdd.get()};
    Diag d;
    EXPECT_EQ(e.Open(devs, 2, store::OpenOptions{}, &d).code(), Err::kCorrupt) << d.text;
  }
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

// Records with versions at the top of what is valid or plausible, next to a
// bad record that makes fsck -y rebuild the allocation state (which writes
// every record at its version + 1): one fsck -y run, and the filesystem
// mounts (before: the rebuild wrote 2^63, which the next mount refused as
// out of range; only a second fsck -y converged).
TEST(FsckTest, OneRepairConvergesForVersionsAtTheLimit) {
  Fs fs;
  const u64 versions[] = {alloc::kRecordVersionLimit - 1, alloc::kRecordVersionPlausible - 1};
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    btree::Transaction tx(&e.btrees());
    for (u32 i = 0; i < 2; i++) {
      alloc::Bucket b = e.alloc().Get(1, 30 + i);
      ASSERT_EQ(b.state, alloc::BucketState::kFree);
      b.version = versions[i];
      alloc::AllocRecord rec;
      alloc::EncodeRecord(b, &rec);
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, 1, 30 + i}, &rec, sizeof(rec)).ok());
    }
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.alloc().RepairState(1, 20, alloc::BucketState::kJournal).ok());  // a bad record: a rebuild
    ASSERT_TRUE(e.Close().ok());
  }
  Report r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok()) << fs.Text();
    for (u32 i = 0; i < 2; i++) {
      EXPECT_EQ(e.alloc().Get(1, 30 + i).state, alloc::BucketState::kFree);
      EXPECT_LT(e.alloc().Get(1, 30 + i).version, alloc::kRecordVersionRebase);
    }
    ASSERT_TRUE(e.Close().ok());
  }
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

TEST(FsckTest, UncleanShutdownIsANoteNotAnError) {
  Fs fs;
  store::Store e;
  ASSERT_TRUE(fs.Open(&e).ok());
  ASSERT_TRUE(e.alloc().Allocate(0b10, 0, alloc::BucketState::kUser, alloc::Watermark::kForeground).ok());
  ASSERT_TRUE(e.journal().Flush().ok());
  // fsck while "crashed" (the store never closed); read-only, so it changes nothing.
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_NE(fs.Text().find("not cleanly unmounted"), std::string::npos) << fs.Text();
}

// A device set that is not one whole filesystem cannot be checked at all:
// fsck(8)'s operational error (8), not "errors left uncorrected" (4).
TEST(FsckTest, MissingMemberOrNoSuperblockIsAnOperationalError) {
  Fs fs;
  BlockDevice* devs[1] = {fs.ssd.get()};
  Report r = Check(devs, 1, Options{}, nullptr, nullptr);
  EXPECT_EQ(r.exit_code, kExitOperational);
  userspace::MemDeviceOptions o;
  o.size = 32 << 20;
  userspace::MemDevice blank(o);
  BlockDevice* one[1] = {&blank};
  r = Check(one, 1, Options{}, nullptr, nullptr);
  EXPECT_EQ(r.exit_code, kExitOperational);
  BlockDevice* foreign[3] = {fs.ssd.get(), fs.hdd.get(), &blank};
  r = Check(foreign, 3, Options{}, nullptr, nullptr);
  EXPECT_EQ(r.exit_code, kExitOperational);
}

// A filesystem with 4 KiB nodes and a test tree of `nkeys` keys (three levels).
void FillTree(Fs& fs, u32 nkeys) {
  store::Store e;
  ASSERT_TRUE(fs.Open(&e).ok());
  for (u32 k = 0; k < nkeys;) {
    btree::Transaction tx(&e.btrees());
    for (u32 j = 0; j < 100 && k < nkeys; j++, k++) {
      u8 v[40];
      memset(v, int(k), sizeof(v));
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeTest, k * 7919u % 100003u, k}, v, sizeof(v)).ok());
    }
    ASSERT_TRUE(tx.Commit().ok());
  }
  ASSERT_TRUE(e.Close().ok());
}

struct NodeAt {
  u8 member, level;
  u64 offset;
};

// Where the nodes of the test tree are (a read-only open; the alloc tree's,
// which holds the allocation records, are left out).
std::vector<NodeAt> Nodes(Fs& fs) {
  store::Store e;
  store::OpenOptions oo;
  oo.read_only = true;
  Diag d;
  std::vector<NodeAt> out;
  EXPECT_TRUE(fs.Open(&e, oo).ok());
  Status st = e.btrees().ForEachNode(
      [](void* ctx, const btree::Btrees::NodeVisit& v) {
        if (v.node->info().btree_id == btree::kBtreeTest)
          static_cast<std::vector<NodeAt>*>(ctx)->push_back(
              NodeAt{u8(btree::PtrCopy(*v.ptr, 0).member), v.node->info().level, btree::PtrCopy(*v.ptr, 0).offset});
        return Status::Ok();
      },
      &out, &d);
  EXPECT_TRUE(st.ok()) << d.text;
  EXPECT_TRUE(e.Close().ok());
  return out;
}

TEST(FsckTest, MultiLevelTreeIsCleanWithStatistics) {
  Fs fs(4096);
  FillTree(fs, 3000);
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(r.errors, 0u) << fs.Text();
  EXPECT_NE(fs.Text().find("btree test: "), std::string::npos) << fs.Text();
  EXPECT_NE(fs.Text().find(" 3000 keys, depth 3"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

// Flips one byte of the node at `n` (its set checksum then fails).
void Damage(Fs& fs, const NodeAt& n) {
  u8 b;
  fs.Member(n.member)->ReadRaw(n.offset + 200, &b, 1);
  b ^= 0x40;
  fs.Member(n.member)->WriteRaw(n.offset + 200, &b, 1);
}

// The test tree's keys, each checked against FillTree's value; -1 if the
// filesystem does not open (read-write, as a mount would), -3 if the walk
// fails (its Status in *walk).
long CountTestKeys(Fs& fs, Status* walk = nullptr) {
  store::Store e;
  BlockDevice* devs[2] = {fs.ssd.get(), fs.hdd.get()};
  Diag d;
  if (!e.Open(devs, 2, store::OpenOptions{}, &d).ok()) return -1;
  long n = 0;
  btree::Iterator it(&e.btrees(), btree::kBtreeTest);
  Status st;
  for (st = it.SeekToFirst(); st.ok() && it.Valid(); st = it.Next()) {
    const u8 want = u8(it.pos().offset);
    if (it.val_bytes() != 40 || it.value()[0] != want || it.value()[39] != want) return -2;
    n++;
  }
  if (!st.ok()) n = -3;
  if (walk != nullptr) *walk = st;
  EXPECT_TRUE(e.Close().ok());
  return n;
}

const NodeAt* NthNode(const std::vector<NodeAt>& nodes, u8 level, size_t nth) {
  for (const NodeAt& n : nodes)
    if (n.level == level && nth-- == 0) return &n;
  return nullptr;
}

// One bad leaf: named, the rest of the tree still walked (-n); -y drops it and
// says what it lost, and the filesystem is clean and usable afterwards.
TEST(FsckTest, CorruptLeafIsNamedAndTheWalkGoesOn) {
  Fs fs(4096);
  FillTree(fs, 3000);
  std::vector<NodeAt> nodes = Nodes(fs);
  const NodeAt* victim = NthNode(nodes, 0, 4);
  ASSERT_NE(victim, nullptr);
  Damage(fs, *victim);
  const std::string where = "level-0 node at member ssd.a offset " + std::to_string(victim->offset);
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_EQ(r.errors, 1u) << fs.Text();
  EXPECT_NE(fs.Text().find(where), std::string::npos) << fs.Text();
  // The other leaves were still walked: every node but the bad one is counted.
  EXPECT_NE(fs.Text().find("btree test: " + std::to_string(nodes.size() - 1) + " nodes"), std::string::npos)
      << fs.Text();
  EXPECT_NE(fs.Text().find("depth 3, 1 bad"), std::string::npos) << fs.Text();
  EXPECT_NE(fs.Text().find("would drop the damaged " + where), std::string::npos) << fs.Text();
  Status walk;
  EXPECT_EQ(CountTestKeys(fs, &walk), -3) << "a mount reads the bad leaf and fails";
  // ... with what the front ends return for damaged metadata: EUCLEAN
  // ("Structure needs cleaning": run fsck), as docs/usage.md says -- not EIO,
  // which is a device's failure or a file data block's checksum.
  EXPECT_EQ(walk.code(), Err::kBadChecksum);
  EXPECT_EQ(walk.ToErrno(), -EUCLEAN);
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  EXPECT_NE(fs.Text().find(where), std::string::npos) << fs.Text();
  // No other copy of a leaf written once: its keys are gone, and fsck says so.
  EXPECT_NE(fs.Text().find("dropped the damaged " + where), std::string::npos) << fs.Text();
  EXPECT_NE(fs.Text().find("its keys are lost"), std::string::npos) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  const long left = CountTestKeys(fs);
  EXPECT_GT(left, 2900) << fs.Text();
  EXPECT_LT(left, 3000) << fs.Text();
}

// The children of a bad interior node are intact: the node scan finds them
// (no pointer names them any more) and every key comes back.
TEST(FsckTest, DamagedInteriorNodeIsRebuiltFromItsChildren) {
  Fs fs(4096);
  FillTree(fs, 3000);
  std::vector<NodeAt> nodes = Nodes(fs);
  const NodeAt* victim = NthNode(nodes, 1, 1);
  ASSERT_NE(victim, nullptr);
  Damage(fs, *victim);
  EXPECT_EQ(CountTestKeys(fs), -1) << "a mount reads every interior node";
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("would drop the damaged level-1 node"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  EXPECT_NE(fs.Text().find("dropped the damaged level-1 node at member ssd.a offset " +
                           std::to_string(victim->offset)),
            std::string::npos)
      << fs.Text();
  EXPECT_EQ(fs.Text().find("are lost"), std::string::npos) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_NE(fs.Text().find(" 3000 keys, depth"), std::string::npos) << fs.Text();
  EXPECT_EQ(CountTestKeys(fs), 3000);
}

// A node of a previous filesystem left in a free bucket is never taken as a
// copy: the scan takes only nodes naming this filesystem's uuid.
TEST(FsckTest, NodeScanIgnoresAnotherFilesystemsNodes) {
  Fs old(4096);
  FillTree(old, 3000);
  Fs fs(4096);  // formatted over the same bytes below
  std::vector<u8> all(32 << 20);
  old.ssd->ReadRaw(0, all.data(), all.size());
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());  // the new filesystem's layout, then its buckets replaced by the old ones
    ASSERT_TRUE(e.Close().ok());
  }
  // Keep the new superblocks, roots, tables and journal (the first buckets);
  // every bucket the old filesystem had nodes in comes back.
  for (const NodeAt& n : Nodes(old)) fs.ssd->WriteRaw(n.offset, all.data() + n.offset, 4096);
  FillTree(fs, 300);
  std::vector<NodeAt> nodes = Nodes(fs);
  ASSERT_NE(nodes.size(), 0u);
  Damage(fs, nodes[0]);  // the root
  Report r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  const long left = CountTestKeys(fs);
  EXPECT_GE(left, 0) << fs.Text();
  EXPECT_LE(left, 300) << "keys of the old filesystem came back: " << fs.Text();
}

// A btree bucket that holds no node: an unmount's final checkpoint leaves the
// buckets it emptied so (docs/format/alloc.md), so fsck -n calls it a note,
// and the next read-write mount -- fsck -y's among them -- frees it.
TEST(FsckTest, BtreeBucketWithoutNodesIsANoteAndTheMountFreesIt) {
  Fs fs(4096);
  FillTree(fs, 500);
  u64 stray = 0;
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    // A data bucket of the ssd no one uses, marked btree.
    const sb::Member& m = e.sb().members[0];
    for (u64 b = m.journal_first_bucket + m.journal_nbuckets; b < m.nbuckets; b++) {
      if (e.alloc().Get(0, b).state == alloc::BucketState::kFree) {
        stray = b;
        break;
      }
    }
    ASSERT_NE(stray, 0u);
    ASSERT_TRUE(e.alloc().RepairState(0, stray, alloc::BucketState::kBtree).ok());
    ASSERT_TRUE(e.Close().ok());
  }
  const std::string line = "bucket " + std::to_string(stray) + " holds no node (left by the unmount's last checkpoint";
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(r.notes, 1u) << fs.Text();
  EXPECT_NE(fs.Text().find(line), std::string::npos) << fs.Text();
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    EXPECT_EQ(e.alloc().Get(0, stray).state, alloc::BucketState::kFree);
    ASSERT_TRUE(e.Close().ok());
  }
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(fs.Text().find("holds no node"), std::string::npos) << fs.Text();
}

// A mount that changes nothing still checkpoints, which opens a bucket for its
// reserve of slots; unmount must free it again.
TEST(FsckTest, MountAndUnmountLeaveNoEmptyBtreeBucket) {
  Fs fs(4096);
  FillTree(fs, 500);
  for (int i = 0; i < 2; i++) {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    ASSERT_TRUE(e.Close().ok());
    Report r = fs.Run(false);
    EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
    EXPECT_EQ(fs.Text().find("holds no node"), std::string::npos) << fs.Text();
  }
}

// Two pointers to one slot: a level-1 node's second child pointer is bent to its
// first child's slot (the set checksum recomputed, so the node itself verifies).
TEST(FsckTest, SlotReferencedTwiceIsReported) {
  Fs fs(4096);
  FillTree(fs, 3000);
  std::vector<NodeAt> nodes = Nodes(fs);
  const NodeAt* parent = nullptr;
  for (const NodeAt& n : nodes)
    if (n.level == 1 && parent == nullptr) parent = &n;
  ASSERT_NE(parent, nullptr);
  std::vector<u8> img(4096);
  userspace::MemDevice* dev = fs.Member(parent->member);
  dev->ReadRaw(parent->offset, img.data(), img.size());
  const size_t set = sizeof(btree::NodeHeader);
  const size_t key0 = set + sizeof(btree::SetHeader);
  const size_t key1 = key0 + btree::KeySpace(sizeof(btree::NodePtrFormat));
  const size_t ptr_offset = sizeof(btree::KeyHeader) + offsetof(btree::NodePtrFormat, offset);
  memcpy(&img[key1 + ptr_offset], &img[key0 + ptr_offset], 8);
  auto* sh = reinterpret_cast<btree::SetHeader*>(&img[set]);
  sh->csum.set(platform::Crc32cSkippingField(sh, sh->bytes.get(), offsetof(btree::SetHeader, csum)));
  dev->WriteRaw(parent->offset, img.data(), img.size());
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("is referenced twice"), std::string::npos) << fs.Text();
}

// Pointers with copies, before the checkpoint writes any (step 5b-1): a
// leaf's image copied to a bucket of the other member (both hold btree
// nodes) and named as the second copy in its parent's key (the set
// checksum recomputed). The mount
// counts both slots (its bucket reconciled to btree), fsck references and
// counts both, the allocation rebuild marks both buckets, and the leaf's
// next write frees both slots (the copy's bucket free at the next mount).
TEST(FsckTest, ASecondCopyOfALeafIsCountedCheckedRebuiltAndFreedWithTheFirst) {
  // One node a bucket (no holes: the copy's bucket holds nothing else).
  constexpr u32 kNode = 256 << 10;
  Fs fs(kNode, /*metadata_everywhere=*/true);
  FillTree(fs, 10000);
  const std::vector<NodeAt> nodes = Nodes(fs);
  const NodeAt* parent = NthNode(nodes, 1, 0);
  ASSERT_NE(parent, nullptr);
  std::vector<u8> img(kNode);
  fs.Member(parent->member)->ReadRaw(parent->offset, img.data(), img.size());
  const size_t set = sizeof(btree::NodeHeader);
  const size_t key0 = set + sizeof(btree::SetHeader);
  auto* key = reinterpret_cast<btree::KeyHeader*>(&img[key0]);
  auto* ptr = reinterpret_cast<btree::NodePtrFormat*>(&img[key0 + sizeof(btree::KeyHeader)]);
  ASSERT_EQ(btree::PtrCopies(*ptr), 1u);
  const btree::NodeCopy first = btree::PtrCopy(*ptr, 0);
  const u8 other = u8(1 - first.member);
  u64 bucket = 0, at = 0;
  {
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = true;
    ASSERT_TRUE(fs.Open(&e, oo).ok());
    for (u64 b = e.sb().members[other].nbuckets; b-- > 0 && at == 0;)
      if (e.alloc().Get(other, b).state == alloc::BucketState::kFree) at = e.sb().BucketOffset(bucket = b);
    ASSERT_TRUE(e.Close().ok());
  }
  ASSERT_NE(at, 0u);
  std::vector<u8> leaf(kNode);
  fs.Member(u8(first.member))->ReadRaw(first.offset, leaf.data(), leaf.size());
  fs.Member(other)->WriteRaw(at, leaf.data(), leaf.size());
  btree::AddPtrCopy(ptr, other, at);
  auto* sh = reinterpret_cast<btree::SetHeader*>(&img[set]);
  sh->csum.set(platform::Crc32cSkippingField(sh, sh->bytes.get(), offsetof(btree::SetHeader, csum)));
  fs.Member(parent->member)->WriteRaw(parent->offset, img.data(), img.size());
  const btree::Pos leaf_max{btree::kBtreeTest, key->inode.get(), key->offset.get()};
  auto state = [&] {
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = true;
    EXPECT_TRUE(fs.Open(&e, oo).ok());
    const alloc::BucketState st = e.alloc().Get(other, bucket).state;
    EXPECT_TRUE(e.Close().ok());
    return st;
  };
  // The mount counts the copy's slot: its bucket becomes btree.
  EXPECT_EQ(CountTestKeys(fs), 10000);
  EXPECT_EQ(state(), alloc::BucketState::kBtree);
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  // The rebuild marks the copy's bucket (without it the bucket would be
  // free and hold a node: the next check's error).
  {
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = true;  // (a read-write close would move the root)
    ASSERT_TRUE(fs.Open(&e, oo).ok());
    const btree::NodeCopy root = btree::PtrCopy(e.btrees().roots().roots[btree::kBtreeAlloc], 0);
    ASSERT_TRUE(e.Close().ok());
    Damage(fs, NodeAt{u8(root.member), 0, root.offset});
  }
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  EXPECT_NE(fs.Text().find("rebuilt every member's allocation state"), std::string::npos) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(state(), alloc::BucketState::kBtree);
  // The leaf rewritten: both slots released; the copy's bucket, empty, is
  // free after the next mount.
  {
    store::Store e;
    ASSERT_TRUE(fs.Open(&e).ok());
    btree::Transaction tx(&e.btrees());
    u8 v[40];
    memset(v, int(u8(leaf_max.offset)), sizeof(v));
    ASSERT_TRUE(tx.Set(leaf_max, v, sizeof(v)).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  EXPECT_EQ(CountTestKeys(fs), 10000);
  EXPECT_EQ(state(), alloc::BucketState::kFree);
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

// The message names the root once, with where it is and what is wrong (it
// used to format its own text into itself: "btree 2 root: btree 2 root: d magic").
// fsck -y rebuilds the tree from the leaves the node scan finds.
TEST(FsckTest, DamagedRootNodeIsNamedOnceAndRebuilt) {
  Fs fs(4096);
  FillTree(fs, 3000);
  const NodeAt* root = nullptr;
  std::vector<NodeAt> nodes = Nodes(fs);
  for (const NodeAt& n : nodes)
    if (n.level == 2) root = &n;
  ASSERT_NE(root, nullptr);
  Damage(fs, *root);
  {
    store::Store e;
    BlockDevice* devs[2] = {fs.ssd.get(), fs.hdd.get()};
    Diag d;
    ASSERT_FALSE(e.Open(devs, 2, store::OpenOptions{}, &d).ok());
    const std::string text = d.text;
    const std::string where = "root (member " + std::to_string(root->member) + ", offset " +
                              std::to_string(root->offset) + "): ";
    EXPECT_NE(text.find(where), std::string::npos) << text;
    EXPECT_EQ(text.find("root: btree"), std::string::npos) << text;
    EXPECT_EQ(text.find(" root"), text.rfind(" root")) << text;
  }
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("would drop the damaged level-2 node"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  EXPECT_NE(fs.Text().find("3000 keys recovered"), std::string::npos) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(CountTestKeys(fs), 3000);
}

TEST(FsckTest, UnreadableRootsBlockIsUncorrectable) {
  Fs fs;
  std::vector<u8> junk(2 * btree::kRootsSlotSize, 0x5a);
  fs.ssd->WriteRaw(btree::kRootsOffset, junk.data(), junk.size());
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("roots"), std::string::npos) << fs.Text();
}

}  // namespace
}  // namespace tfs::fsck
