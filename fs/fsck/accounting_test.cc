// fsck's accounting pass (fsck/accounting.cc; docs/design/copies.md, "As
// built: step 3b-4"): hostile counts in the buckets' allocation records --
// raised, lowered, zeroed under live extents, a cached count changed, counts
// in a node bucket -- are each reported by fsck -n in one line, set from the
// extents by fsck -y, clean at the next check, and a walk of the extents
// after the next mount (DataPath::VerifyAgainstExtents) finds nothing. The lines are capped at 10 a
// member. The superblock's kSbAcctRepair (a repair cut short) keeps
// read-write mounts off until fsck -y finishes it. The accounting keys
// (alloc/accounting.h) the same way: a total raised, lowered, its key
// deleted, the reserved total changed -- one line each, set by -y; a key
// whose bytes are bad makes the allocation state stale and -y rewrites the
// keys whole.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "alloc/allocator.h"
#include "alloc/format.h"
#include "btree/tree.h"
#include "data/data.h"
#include "fsck/fsck.h"
#include "fsck/testing.h"
#include "mount/testing.h"
#include "sb/format.h"
#include "sb/superblock.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

using posix::Filesystem;
using namespace fixture;  // NOLINT: the test images' helpers

// Edits the records of the buckets `which` picks as hostile bytes would:
// `edit` changes each, written one version ahead of the allocator's (the
// newest wins at the next load), through a store opened without the data
// path -- so no mount's check sets them right before fsck sees them.
// Returns the buckets edited, with their records as written.
std::vector<std::pair<u64, alloc::AllocRecord>> EditRecords(Image& img,
                                                             const std::function<bool(const alloc::Bucket&)>& which,
                                                             const std::function<void(alloc::AllocRecord&)>& edit) {
  std::vector<std::pair<u64, alloc::AllocRecord>> out;
  store::Store e;
  store::OpenOptions oo;
  if (!testing::OpenStore(&e, {img.dev.get()}, oo).ok()) {
    ADD_FAILURE() << "open";
    return out;
  }
  btree::Transaction tx(&e.btrees());
  for (u64 b = 0; b < e.alloc().nbuckets(0); b++) {
    const alloc::Bucket k = e.alloc().Get(0, b);
    if (!which(k)) continue;
    alloc::AllocRecord rec;
    alloc::EncodeRecord(k, &rec);
    edit(rec);
    rec.version.set(rec.version.get() + 1);
    EXPECT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, 0, b}, &rec, sizeof(rec)).ok());
    out.push_back({b, rec});
  }
  EXPECT_TRUE(tx.Commit().ok());
  EXPECT_TRUE(e.Close().ok());
  // The load takes them (the store's own close wrote nothing newer).
  store::Store r;
  oo.read_only = true;
  EXPECT_TRUE(testing::OpenStore(&r, {img.dev.get()}, oo).ok());
  for (const auto& [b, rec] : out) {
    const alloc::Bucket k = r.alloc().Get(0, b);
    EXPECT_EQ(k.live_sectors, rec.live_sectors.get()) << b;
    EXPECT_EQ(k.cached_sectors, rec.cached_sectors.get()) << b;
  }
  EXPECT_TRUE(r.Close().ok());
  return out;
}

// EditRecords of the first bucket `which` picks.
std::vector<std::pair<u64, alloc::AllocRecord>> EditFirstRecord(
    Image& img, const std::function<bool(const alloc::Bucket&)>& which,
    const std::function<void(alloc::AllocRecord&)>& edit) {
  bool picked = false;
  return EditRecords(img, [&](const alloc::Bucket& k) { return !picked && (picked = which(k)); }, edit);
}

usize CountOf(const std::string& s, const std::string& what) {
  usize n = 0;
  for (usize at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) n++;
  return n;
}

// The mount after the repair finds every record as the extents count it.
void ExpectMountFindsNothing(Image& img) {
  testing::MountedFs m({img.dev.get()});
  ASSERT_TRUE(m.open());
  u64 counts = 0, totals = 0;
  ASSERT_TRUE(m.data.VerifyAgainstExtents(&counts, &totals).ok());
  EXPECT_EQ(counts, 0u);
  EXPECT_EQ(totals, 0u);
}

// Sets (or, with `del`, deletes) the accounting key (kind, offset) to
// `rec`'s bytes through a store opened without the data path (whose
// mount would set it right before fsck sees it). Returns the total the
// store had before.
u64 EditAcct(Image& img, alloc::AcctKind kind, u64 offset, bool del, const void* rec, u32 len) {
  store::Store e;
  store::OpenOptions oo;
  if (!testing::OpenStore(&e, {img.dev.get()}, oo).ok()) {
    ADD_FAILURE() << "open";
    return 0;
  }
  const u64 was = e.acct().Get(kind, offset);
  btree::Transaction tx(&e.btrees());
  const btree::Pos pos{btree::kBtreeAlloc, alloc::AcctInode(kind), offset};
  EXPECT_TRUE((del ? tx.Delete(pos) : tx.Set(pos, rec, len)).ok());
  EXPECT_TRUE(tx.Commit().ok());
  EXPECT_TRUE(e.Close().ok());
  return was;
}
u64 SetAcct(Image& img, alloc::AcctKind kind, u64 offset, u64 sectors) {
  alloc::AcctRecord r;
  alloc::EncodeAcct(kind, sectors, &r);
  return EditAcct(img, kind, offset, false, &r, sizeof(r));
}

TEST(FsckAccountingTest, AHostileCountIsReportedInOneLineAndSetFromTheExtents) {
  const char* const kinds[] = {"raised", "lowered", "zeroed", "cached changed"};
  for (int kind = 0; kind < 4; kind++) {
    SCOPED_TRACE(kinds[kind]);
    Image img;
    Populate(img, 2, 6);
    u32 live = 0;
    const auto edited = EditFirstRecord(
        img,
        [&](const alloc::Bucket& k) {
          if (k.state != alloc::BucketState::kUser || k.live_sectors < 16) return false;
          live = k.live_sectors;
          return true;
        },
        [&](alloc::AllocRecord& r) {
          if (kind == 0) r.live_sectors.set(r.live_sectors.get() + 8);
          if (kind == 1) r.live_sectors.set(r.live_sectors.get() - 8);
          if (kind == 2) r.live_sectors.set(0);
          if (kind == 3) r.cached_sectors.set(r.cached_sectors.get() + 24);
        });
    ASSERT_EQ(edited.size(), 1u);
    const u64 b = edited[0].first;
    const alloc::AllocRecord& rec = edited[0].second;
    const std::string line = "alloc: member ssd.a bucket " + std::to_string(b) + " counts " +
                             std::to_string(rec.live_sectors.get()) + " live / " +
                             std::to_string(rec.cached_sectors.get()) + " cached sectors, its extents " +
                             std::to_string(live) + " / 0";
    const Repair fix = ExpectReportedRepairedClean(img, line.c_str(), "alloc: set the counts of 1 bucket to");
    EXPECT_EQ(CountOf(fix.report, " counts "), 1u) << fix.report;  // one line
    EXPECT_EQ(fix.checked.errors, 1u) << fix.report;
    ExpectMountFindsNothing(img);
    img.ExpectFiles(12);
  }
}

TEST(FsckAccountingTest, CountsInANodeBucketsRecordAreZeroed) {
  Image img;
  Populate(img, 2, 6);
  const auto edited = EditFirstRecord(
      img, [](const alloc::Bucket& k) { return k.state == alloc::BucketState::kBtree; },
      [](alloc::AllocRecord& r) { r.live_sectors.set(8); });
  ASSERT_EQ(edited.size(), 1u);
  const std::string line =
      "alloc: member ssd.a bucket " + std::to_string(edited[0].first) + " is btree, yet its record counts 8 live";
  ExpectReportedRepairedClean(img, line.c_str(), "alloc: zeroed the counts of 1 bucket that is not user");
  ExpectMountFindsNothing(img);
  img.ExpectFiles(12);
}

// Every user bucket's counts zeroed: ten lines, then one counting the rest;
// -y sets them all in one batch.
TEST(FsckAccountingTest, ManyWrongBucketsAreReportedInTenLinesAndACount) {
  Image img;
  const std::string chunk(256 << 10, 'q');
  img.WithFs([&](Filesystem& fs, store::Store&) {
    for (int i = 0; i < 16; i++) {
      const std::string name = "q" + std::to_string(i);
      auto a = fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
      ASSERT_TRUE(a.ok());
      ASSERT_TRUE(fs.Write(a.value().ino, 0, chunk.data(), u32(chunk.size())).ok());
      ASSERT_TRUE(fs.Fsync(a.value().ino).ok());
    }
  });
  const auto edited = EditRecords(
      img, [](const alloc::Bucket& k) { return k.state == alloc::BucketState::kUser && k.live_sectors != 0; },
      [](alloc::AllocRecord& r) { r.live_sectors.set(0); });
  ASSERT_GT(edited.size(), 12u);
  const std::string more = "alloc: member ssd.a: " + std::to_string(edited.size() - 10) +
                           " more buckets whose counts are not their extents'";
  const std::string set = "alloc: set the counts of " + std::to_string(edited.size()) + " buckets";
  const Repair fix = ExpectReportedRepairedClean(img, more.c_str(), set.c_str());
  EXPECT_EQ(CountOf(fix.report, " live / "), 10u) << fix.report;
  EXPECT_EQ(fix.checked.errors, edited.size()) << fix.report;
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  ExpectMountFindsNothing(img);
}

// A repair of the counts cut short (the flag set by hand, as a cut would
// leave it): a read-write mount refuses in one line, a read-only open goes
// on; fsck -n reports it, fsck -y finishes the pass and clears the flag.
TEST(FsckAccountingTest, ARepairCutShortKeepsMountsOffUntilFsckFinishesIt) {
  Image img;
  Populate(img, 2, 6);
  sb::Superblock s = img.SbOf();
  s.flags |= sb::kSbAcctRepair;
  ASSERT_TRUE(sb::Write(*img.dev, s, s.dev_idx).ok());
  store::OpenReport rep;
  Diag d;
  Status st = img.Open(false, &rep, &d);
  ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << "a read-write open went on";
  EXPECT_EQ(std::string(d.text), "a repair of the space accounting was cut short; run 'tierfs fsck -y'");
  ASSERT_TRUE(img.Open(true, &rep, &d).ok()) << d.text;
  ExpectReportedRepairedClean(img, "cut short in its repair of the space accounting",
                              "finished the repair of the space accounting");
  EXPECT_EQ(img.SbOf().flags & sb::kSbAcctRepair, 0);
  ExpectMountFindsNothing(img);
  img.ExpectFiles(12);
}

// Whether `req` writes a superblock copy (the backup only, unless
// `either`) whose flags carry kSbAcctRepair.
bool WritesAcctRepair(const IoRequest* req, bool either) {
  if (req->op != IoOp::kWrite || req->length < sizeof(sb::SuperblockFormat)) return false;
  if (req->offset != sb::kSbBackupOffset && !(either && req->offset == sb::kSbPrimaryOffset)) return false;
  return (static_cast<const sb::SuperblockFormat*>(req->buf)->flags.get() & sb::kSbAcctRepair) != 0;
}

// What a cut right after fsck -y has recorded its repair would leave: a
// device that, once the superblock's backup copy (written second) has been
// written with kSbAcctRepair, keeps the durable image at the next request.
class FlagWatch final : public BlockDevice {
 public:
  explicit FlagWatch(userspace::MemDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    {
      // (Submit runs on fsck's thread, the journal writer's and completions'.)
      std::lock_guard<std::mutex> l(mu_);
      if (armed_ && image_.empty()) image_ = inner_->SnapshotDurable();
      if (WritesAcctRepair(req, false)) armed_ = true;
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }
  std::vector<u8> image() {
    std::lock_guard<std::mutex> l(mu_);
    return image_;
  }

 private:
  userspace::MemDevice* const inner_;
  std::mutex mu_;
  bool armed_ = false;
  std::vector<u8> image_;
};

// fsck -y records the repair durably, and a cut right after that leaves the
// flag with the old counts: the mount refuses the image and the next fsck -y
// repairs it. (It does not prove the order against RepairCounts: that
// commit's journal entry reaches the device only later, so a flag written
// just after it would pass too.)
TEST(FsckAccountingTest, ACutAfterFsckRecordedTheRepairKeepsTheMountOff) {
  Image img;
  Populate(img, 2, 6);
  const auto edited = EditFirstRecord(
      img, [](const alloc::Bucket& k) { return k.state == alloc::BucketState::kUser && k.live_sectors >= 16; },
      [](alloc::AllocRecord& r) { r.live_sectors.set(r.live_sectors.get() - 8); });
  ASSERT_EQ(edited.size(), 1u);
  FlagWatch watch(img.dev.get());
  auto [r, out] = img.Fsck(true, &watch);
  EXPECT_EQ(r.exit_code, kExitRepaired) << out;
  EXPECT_EQ(img.SbOf().flags & sb::kSbAcctRepair, 0);  // cleared at the end
  ASSERT_FALSE(watch.image().empty()) << "fsck -y never wrote the flag";
  Image cut(watch.image());
  EXPECT_NE(cut.SbOf().flags & sb::kSbAcctRepair, 0);
  {
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = true;
    ASSERT_TRUE(testing::OpenStore(&e, {cut.dev.get()}, oo).ok());
    EXPECT_EQ(e.alloc().Get(0, edited[0].first).live_sectors, edited[0].second.live_sectors.get());  // not yet set
    EXPECT_TRUE(e.Close().ok());
  }
  store::OpenReport rep;
  Diag d;
  EXPECT_TRUE(cut.Open(false, &rep, &d).Is(ErrorClass::kCorrupt)) << "a read-write open went on";
  ExpectReportedRepairedClean(cut, "cut short in its repair of the space accounting", "alloc: set the counts of 1");
  ExpectMountFindsNothing(cut);
  cut.ExpectFiles(12);
}

// The first superblock write carrying the flag fails (kIo); everything
// else, later writes of the flag too, passes.
class FlagWriteFails final : public BlockDevice {
 public:
  explicit FlagWriteFails(userspace::MemDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    if (WritesAcctRepair(req, true) && !failed_.exchange(true)) {
      req->done(req, Status(Err::kIo));
      return;
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }

 private:
  userspace::MemDevice* const inner_;
  std::atomic<bool> failed_{false};
};

// fsck -y that cannot record its repair in the superblock repairs no count
// (the flag comes first) and exits with fsck(8)'s operational error, the
// reason in its line (the unmount's superblock write then records the flag:
// the mount stays off); the next -y on a working device repairs it.
TEST(FsckAccountingTest, ARepairThatCannotRecordItselfIsAnOperationalError) {
  Image img;
  Populate(img, 2, 6);
  const auto edited = EditFirstRecord(
      img, [](const alloc::Bucket& k) { return k.state == alloc::BucketState::kUser && k.live_sectors >= 16; },
      [](alloc::AllocRecord& r) { r.live_sectors.set(r.live_sectors.get() + 8); });
  ASSERT_EQ(edited.size(), 1u);
  FlagWriteFails failing(img.dev.get());
  auto [r, out] = img.Fsck(true, &failing);
  EXPECT_EQ(r.exit_code, kExitOperational) << out;
  EXPECT_NE(out.find("recording the repair of the counts in the superblock failed"), std::string::npos) << out;
  EXPECT_EQ(out.find("alloc: set the counts"), std::string::npos) << out;
  EXPECT_NE(img.SbOf().flags & sb::kSbAcctRepair, 0) << "the mount must stay off";
  ExpectReportedRepairedClean(img, " counts ", "alloc: set the counts of 1");
}

// Watches the order of fsck -y's writes: a journal write submitted while
// the superblock on the device does not carry kSbAcctRepair is counted
// (`unflagged`). The first superblock write that carries the flag is held
// until a journal write comes (at most 500 ms): a repair committed before
// the flag was recorded has its entry written meanwhile, whatever the
// journal's timing (its writer writes an entry within write_delay).
class FlagOrderWatch final : public BlockDevice {
 public:
  explicit FlagOrderWatch(userspace::MemDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    if (req->op == IoOp::kWrite && req->origin == IoOrigin::kJournal) {
      sb::SuperblockFormat f;
      inner_->ReadRaw(sb::kSbPrimaryOffset, &f, sizeof(f));
      std::lock_guard<std::mutex> l(mu_);
      if ((f.flags.get() & sb::kSbAcctRepair) == 0) unflagged_++;
      journal_writes_++;
      cv_.notify_all();
    } else if (WritesAcctRepair(req, true)) {
      std::unique_lock<std::mutex> l(mu_);
      if (!held_) {
        held_ = true;
        const u64 before = journal_writes_;
        cv_.wait_for(l, std::chrono::milliseconds(500), [&] { return journal_writes_ != before; });
      }
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }
  u64 unflagged() {
    std::lock_guard<std::mutex> l(mu_);
    return unflagged_;
  }
  bool held() {
    std::lock_guard<std::mutex> l(mu_);
    return held_;
  }

 private:
  userspace::MemDevice* const inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  u64 journal_writes_ = 0;
  u64 unflagged_ = 0;
};

// The data pass edits extents without the data path (a file's extents
// deleted, its inode gone): the buckets' counts and the totals still count
// them until the accounting pass. fsck -y records kSbAcctRepair before
// that first edit, so no journal entry of the run reaches the device
// before the flag (before: the edits' entries did, and a cut then left
// the mount going on, on counts the edits had made wrong); a cut after it
// keeps the mount off until the next fsck -y finishes the repair.
TEST(FsckAccountingTest, TheFlagIsRecordedBeforeTheDataPassesFirstEdit) {
  Image img;
  Populate(img, 2, 6);
  u64 victim = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) { victim = fs.Lookup(posix::kRootIno, "f1", 2).value().ino; });
  {
    store::Store e;
    ASSERT_TRUE(testing::OpenStore(&e, {img.dev.get()}).ok());
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Delete(btree::Pos{btree::kBtreeInodes, victim, 0}).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  const std::vector<u8> before = img.Bytes();
  FlagOrderWatch watch(img.dev.get());
  auto [r, out] = img.Fsck(true, &watch);
  EXPECT_EQ(r.exit_code, kExitRepaired) << out;
  EXPECT_NE(out.find("deleted the extent of inode " + std::to_string(victim)), std::string::npos) << out;
  EXPECT_TRUE(watch.held()) << "fsck -y never wrote the flag";
  EXPECT_EQ(watch.unflagged(), 0u) << "journal entries reached the device before the flag";
  EXPECT_EQ(img.SbOf().flags & sb::kSbAcctRepair, 0);  // cleared at the end

  // A cut once the flag is recorded (here: the image before, the flag set
  // by hand, as the namespace pass's edits may not have reached the
  // journal yet) keeps the mount off; fsck -y finishes it.
  Image cut(before);
  sb::Superblock s = cut.SbOf();
  s.flags |= sb::kSbAcctRepair;
  ASSERT_TRUE(sb::Write(*cut.dev, s, s.dev_idx).ok());
  store::OpenReport rep;
  Diag d;
  EXPECT_TRUE(cut.Open(false, &rep, &d).Is(ErrorClass::kCorrupt)) << "a read-write open went on";
  auto [r2, out2] = cut.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_NE(out2.find("cut short in its repair of the space accounting"), std::string::npos) << out2;
  EXPECT_EQ(cut.SbOf().flags & sb::kSbAcctRepair, 0);
  auto [r3, out3] = cut.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  ExpectMountFindsNothing(cut);
  cut.ExpectFiles(1);
  cut.ExpectFiles(12, 2);
}

// fsck -y that repairs nothing writes no superblock with the flag (it is
// written before the first repair, not for every run).
TEST(FsckAccountingTest, ARepairRunWithNothingToRepairWritesNoFlag) {
  Image img;
  Populate(img, 1, 4);
  struct Count final : BlockDevice {
    userspace::MemDevice* inner;
    std::atomic<u32> flagged{0};
    explicit Count(userspace::MemDevice* d) : inner(d) {}
    void Submit(IoRequest* req) override {
      if (WritesAcctRepair(req, true)) flagged++;
      inner->Submit(req);
    }
    const BlockDeviceInfo& Info() const override { return inner->Info(); }
    const char* Name() const override { return inner->Name(); }
  } watch(img.dev.get());
  auto [r, out] = img.Fsck(true, &watch);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_EQ(watch.flagged.load(), 0u);
}

// A hostile accounting total -- the data's set raised, lowered, its key
// deleted; the reserved total set where nothing is unwritten -- is one
// line of fsck -n, set from the extents by -y, clean after; the mount's
// own check then finds nothing.
TEST(FsckAccountingTest, AHostileAccountingTotalIsReportedInOneLineAndSetFromTheExtents) {
  const char* const kinds[] = {"raised", "lowered", "deleted", "reserved"};
  for (int kind = 0; kind < 4; kind++) {
    SCOPED_TRACE(kinds[kind]);
    Image img;
    Populate(img, 2, 6);
    std::string line;
    if (kind == 3) {
      ASSERT_EQ(SetAcct(img, alloc::AcctKind::kReserved, 0, 80), 0u);
      line = "alloc: the reserved total is 80 sectors, the unwritten extents hold 0";
    } else {
      u64 was;
      u64 now = 0;
      if (kind == 2) {
        was = EditAcct(img, alloc::AcctKind::kReplicas, 1, true, nullptr, 0);
      } else {
        store::Store e;
        store::OpenOptions oo;
        oo.read_only = true;
        ASSERT_TRUE(testing::OpenStore(&e, {img.dev.get()}, oo).ok());
        const u64 have = e.acct().Get(alloc::AcctKind::kReplicas, 1);
        ASSERT_TRUE(e.Close().ok());
        ASSERT_GT(have, 8u);
        now = kind == 0 ? have + 8 : have - 8;
        was = SetAcct(img, alloc::AcctKind::kReplicas, 1, now);
      }
      ASSERT_GT(was, 0u);
      line = "alloc: the total of data on members 0x1 is " + std::to_string(now) + " sectors, its extents hold " +
             std::to_string(was);
    }
    const Repair fix = ExpectReportedRepairedClean(img, line.c_str(), "alloc: set 1 accounting total to what the trees hold");
    EXPECT_EQ(fix.checked.errors, 1u) << fix.report;
    ExpectMountFindsNothing(img);
    img.ExpectFiles(12);
  }
}

// A hostile inode count -- raised, lowered, its key deleted -- is one line
// of fsck -n (against a walk of the inode records), set by -y, clean after;
// statfs then counts the files again.
TEST(FsckAccountingTest, AHostileInodeCountIsReportedInOneLineAndSetFromTheRecords) {
  const char* const kinds[] = {"raised", "lowered", "deleted"};
  for (int kind = 0; kind < 3; kind++) {
    SCOPED_TRACE(kinds[kind]);
    Image img;
    Populate(img, 2, 6);
    u64 now = 0, was = 0;
    if (kind == 2) {
      was = EditAcct(img, alloc::AcctKind::kInodes, 0, true, nullptr, 0);
    } else {
      now = kind == 0 ? 20 : 5;
      was = SetAcct(img, alloc::AcctKind::kInodes, 0, now);
    }
    ASSERT_EQ(was, 13u);  // the root and twelve files
    const std::string line =
        "alloc: the inode count is " + std::to_string(now) + ", the inode records number " + std::to_string(was);
    const Repair fix = ExpectReportedRepairedClean(img, line.c_str(), "alloc: set 1 accounting total to what the trees hold");
    EXPECT_EQ(fix.checked.errors, 1u) << fix.report;
    img.WithFs([&](Filesystem& fs, store::Store& s) {
      EXPECT_EQ(s.acct().inodes(), 13u);
      posix::StatFs st;
      ASSERT_TRUE(fs.GetStatFs(&st).ok());
      EXPECT_EQ(st.files - st.files_free, 13u);
    });
    img.ExpectFiles(12);
  }
}

// An accounting key whose bytes break a rule (here: a value of another
// kind) is a bad allocation record: a read-write mount refuses in one line,
// fsck -n reports it, and -y rebuilds the allocation state -- the keys
// rewritten whole from the extents, the inode count from the inode records
// (a wrong one here: the rebuild sets it, so the accounting pass after it
// finds nothing to say).
TEST(FsckAccountingTest, ABadAccountingKeyIsRebuiltWithTheAllocationState) {
  Image img;
  Populate(img, 2, 6);
  ASSERT_EQ(SetAcct(img, alloc::AcctKind::kInodes, 0, 5), 13u);
  alloc::AcctRecord r;
  alloc::EncodeAcct(alloc::AcctKind::kReserved, 8, &r);  // at a replicas key
  ASSERT_GT(EditAcct(img, alloc::AcctKind::kReplicas, 1, false, &r, sizeof(r)), 0u);
  store::OpenReport rep;
  Diag d;
  Status st = img.Open(false, &rep, &d);
  ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << "a read-write open went on";
  EXPECT_NE(std::string(d.text).find("accounting key (kind 1, 1): its value says kind 0"), std::string::npos) << d.text;
  EXPECT_EQ(std::string(d.text).find('\n'), std::string::npos);
  const Repair fix = ExpectReportedRepairedClean(img, "its value says kind 0", nullptr);
  EXPECT_EQ(fix.repair.find("the inode count is"), std::string::npos) << fix.repair;
  ExpectMountFindsNothing(img);
  img.ExpectFiles(12);
  img.WithFs([&](Filesystem&, store::Store& s) { EXPECT_EQ(s.acct().inodes(), 13u); });
}

}  // namespace
}  // namespace tfs::fsck
