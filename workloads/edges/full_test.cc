// A full filesystem (issue 18, "ENOSPC is only ENOSPC"): user data fills the
// SSD -- the only metadata member -- and then, with an HDD, every member. The
// btree, which lives on the SSD only, must still have room for its
// checkpoints: user data spills to the HDD before it takes the space metadata
// needs, creating empty files and deleting files still work when nothing is
// left for data, and a full filesystem unmounts, mounts again and checks
// clean. Before, data took every SSD bucket: "btree: checkpoint failed: no
// space left on device", then rm, unmount and remount failed.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "fsck/fsck.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs {
namespace {

using posix::Filesystem;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

const posix::Caller kUser{1000, 1000};

std::unique_ptr<MemDevice> Mem(const char* name, uint64_t size) {
  MemDeviceOptions o;
  o.name = name;
  o.size = size;
  o.volatile_cache = true;
  return std::make_unique<MemDevice>(o);
}

// ssd.a (data and metadata, the foreground target) and optionally hdd.b (user
// data only, the fallback), small buckets and nodes so that a few MiB of
// metadata is many buckets' worth of checkpoints.
struct Full : testing::MountedFs {
  std::vector<std::unique_ptr<MemDevice>> mem;

  Full(bool with_hdd, uint64_t ssd_mib) {
    mem.push_back(Mem("ssd0", ssd_mib << 20));
    if (with_hdd) mem.push_back(Mem("hdd0", 48ull << 20));
    for (auto& d : mem) devs.push_back(d.get());
    store::FormatOptions fo = testing::TwoTierFormat();
    if (!with_hdd) fo.background_target = "";
    fo.journal_buckets = journal::kMinRingBuckets;
    if (!testing::FormatMembers(devs, fo, {"ssd.a", "hdd.b"}).ok()) return;
    Mount();
  }
  ~Full() { Unmount(); }
  // A clean unmount (it must succeed on a full filesystem), fsck -n clean,
  // and a mount again.
  void RemountAndCheck() {
    Status u = fs.Unmount();
    ASSERT_TRUE(u.ok()) << "unmount of a full filesystem: " << u.Message();
    data.Close();
    Status c = store->Close();
    ASSERT_TRUE(c.ok()) << "close of a full filesystem: " << c.Message();
    store.reset();
    std::string out;
    fsck::Report r = fsck::Check(devs.data(), u32(devs.size()), fsck::Options{},
                                 [](void* ctx, const char* line) {
                                   *static_cast<std::string*>(ctx) += std::string(line) + "\n";
                                 },
                                 &out);
    EXPECT_EQ(r.exit_code, fsck::kExitClean) << out;
    Mount();
  }
  Result<posix::Attr> Create(const std::string& name) {
    return fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kUser);
  }
  // Writes 256 KiB files until a write fails; returns that failure, and the
  // number of files with all their data in `files`. Only the data may fail:
  // creating the next file must still work when data no longer fits.
  Status FillData(int* files) {
    std::string block(256 * 1024, 'd');
    for (int i = 0; i < 100000; i++) {
      const std::string name = "fill" + std::to_string(i);
      Result<posix::Attr> a = Create(name);
      EXPECT_TRUE(a.ok()) << "creating " << name << " (its data not written yet): " << a.status().Message();
      if (!a.ok()) return a.status();
      block[0] = char('a' + i % 26);
      Result<u32> w = fs.Write(a.value().ino, 0, block.data(), u32(block.size()));
      Status st = w.ok() ? fs.Fsync(a.value().ino) : w.status();
      if (st.ok() && w.value() != block.size()) st = Err::kIo;
      fs.Release(a.value().ino).IgnoreError();
      if (!st.ok()) {
        const std::string& n = name;
        fs.Unlink(posix::kRootIno, n.data(), u32(n.size())).IgnoreError();  // its data did not fit
        return st;
      }
      ++*files;
    }
    return Err::kInvalidArgument;  // never full
  }
  // The metadata member (ssd.a) keeps what the btree declared it needs.
  void ExpectBtreeRoom() {
    const alloc::DeviceUsage u = store->alloc().Usage(0);
    const u64 free = u.by_state[u32(alloc::BucketState::kFree)];  // pending frees included
    EXPECT_GT(u.metadata_need, 0u);
    EXPECT_GE(free, u.metadata_need) << "user data took the btree's room";
  }
  // Every fill file with an odd number (the even ones were deleted) reads back
  // its first block (first byte 'a' + i % 26).
  void ExpectOddFilesIntact(int files) {
    std::string buf(4096, '\0');
    for (int i = 3; i < files; i += 2) {
      const std::string name = "fill" + std::to_string(i);
      Result<posix::Attr> a = fs.Lookup(posix::kRootIno, name.data(), u32(name.size()));
      ASSERT_TRUE(a.ok()) << name;
      EXPECT_EQ(a.value().size, 256u * 1024) << name;
      Result<u32> r = fs.Read(a.value().ino, 0, buf.data(), u32(buf.size()));
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().Message();
      EXPECT_EQ(buf[0], char('a' + i % 26)) << name;
      EXPECT_EQ(buf[1], 'd') << name;
    }
  }
};

// What a full filesystem must still do: create empty files, delete, sync.
void FullStillWorks(Full& t, int files) {
  for (int i = 0; i < 32; i++) {
    Result<posix::Attr> a = t.Create("empty" + std::to_string(i));
    ASSERT_TRUE(a.ok()) << "creating an empty file on a full filesystem: " << a.status().Message();
    t.fs.Release(a.value().ino).IgnoreError();
  }
  Result<posix::Attr> d = t.fs.Mkdir(posix::kRootIno, "dir", 3, posix::kModeDir | 0755, kUser);
  ASSERT_TRUE(d.ok()) << "mkdir on a full filesystem: " << d.status().Message();
  Status rn = t.fs.Rename(posix::kRootIno, "empty0", 6, d.value().ino, "moved", 5, 0);
  ASSERT_TRUE(rn.ok()) << "rename on a full filesystem: " << rn.Message();
  // Truncating a file to half its size frees part of its data.
  Result<posix::Attr> f1 = t.fs.Lookup(posix::kRootIno, "fill1", 5);
  ASSERT_TRUE(f1.ok());
  posix::SetAttr half;
  half.valid = posix::kSetSize;
  half.size = 128 * 1024;
  Result<posix::Attr> tr = t.fs.SetAttrs(f1.value().ino, half);
  ASSERT_TRUE(tr.ok()) << "truncate on a full filesystem: " << tr.status().Message();
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok());
  // Deleting half the files frees their space: writes work again.
  for (int i = 0; i < files; i += 2) {
    const std::string name = "fill" + std::to_string(i);
    Status st = t.fs.Unlink(posix::kRootIno, name.data(), u32(name.size()));
    ASSERT_TRUE(st.ok()) << "rm on a full filesystem: " << st.Message();
  }
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok());
  Result<posix::Attr> a = t.Create("after");
  ASSERT_TRUE(a.ok()) << a.status().Message();
  std::string block(64 * 1024, 'z');
  Result<u32> w = t.fs.Write(a.value().ino, 0, block.data(), u32(block.size()));
  ASSERT_TRUE(w.ok()) << "a write after deleting: " << w.status().Message();
  ASSERT_TRUE(t.fs.Fsync(a.value().ino).ok());
  t.fs.Release(a.value().ino).IgnoreError();
}

// SSD + HDD: the SSD fills to its reserve and data spills to the HDD; when the
// HDD is full too, a write fails with ENOSPC and nothing else does.
TEST(FullFilesystem, SpillsToTheHddBeforeMetadataSpaceAndStaysUsable) {
  Full t(/*with_hdd=*/true, 24);
  ASSERT_TRUE(t.open());
  int files = 0;
  Status st = t.FillData(&files);
  EXPECT_EQ(st.code(), Err::kNoSpace) << st.Message();
  EXPECT_GT(t.store->alloc().Stats().fallbacks, 0u) << "no data spilled onto the HDD";
  const alloc::DeviceUsage hdd = t.store->alloc().Usage(1);
  EXPECT_GT(hdd.by_state[u32(alloc::BucketState::kUser)], hdd.nbuckets / 2) << "the HDD did not fill";
  t.ExpectBtreeRoom();
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok()) << "a checkpoint of a full filesystem";
  FullStillWorks(t, files);
  t.RemountAndCheck();
  ASSERT_TRUE(t.open());
  t.ExpectOddFilesIntact(files);
}

// One member: nothing to spill to. Data stops at the reserve; metadata goes on.
TEST(FullFilesystem, OneMemberFullStaysUsableAndRemounts) {
  Full t(/*with_hdd=*/false, 24);
  ASSERT_TRUE(t.open());
  int files = 0;
  Status st = t.FillData(&files);
  EXPECT_EQ(st.code(), Err::kNoSpace) << st.Message();
  ASSERT_GT(files, 8);
  t.ExpectBtreeRoom();
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok()) << "a checkpoint of a full filesystem";
  FullStillWorks(t, files);
  t.RemountAndCheck();
  ASSERT_TRUE(t.open());
  t.ExpectOddFilesIntact(files);
}

// Metadata alone filling the metadata member: with data already at its floor,
// creates with long names and xattrs grow the btree until they get ENOSPC --
// and then the btree still checkpoints, deletes work, the filesystem unmounts,
// mounts and checks clean. Without the refusal, the growth would take the room
// of the checkpoint ("btree: checkpoint failed") and nothing would work.
TEST(FullFilesystem, MetadataGrowthStopsWithEnospcBeforeTheCheckpointsRoom) {
  Full t(/*with_hdd=*/false, 24);
  ASSERT_TRUE(t.open());
  int files = 0;
  Status st = t.FillData(&files);
  ASSERT_EQ(st.code(), Err::kNoSpace) << st.Message();
  const std::string xv(2000, 'x');
  int made = 0;
  Status grow;
  for (int i = 0; i < 200000 && grow.ok(); i++) {
    const std::string name = "meta-" + std::string(180, char('a' + i % 26)) + "-" + std::to_string(i);
    Result<posix::Attr> a = t.Create(name);
    if (!a.ok()) {
      grow = a.status();
      break;
    }
    grow = t.fs.SetXattr(a.value().ino, "user.x", 6, xv.data(), u32(xv.size()), 0, Filesystem::kFrontEndChecked);
    t.fs.Release(a.value().ino).IgnoreError();
    if (grow.ok()) made++;
  }
  ASSERT_EQ(grow.code(), Err::kNoSpace) << "metadata never filled the member: " << grow.Message();
  EXPECT_GT(made, 20);
  EXPECT_GT(t.store->alloc().Stats().metadata_refused, 0u);
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok()) << "the btree's room was taken";
  // Deletes always work; then metadata may grow again.
  for (int i = 0; i < made; i++) {
    const std::string name = "meta-" + std::string(180, char('a' + i % 26)) + "-" + std::to_string(i);
    Status u = t.fs.Unlink(posix::kRootIno, name.data(), u32(name.size()));
    ASSERT_TRUE(u.ok()) << "rm of " << i << " on a metadata-full filesystem: " << u.Message();
  }
  ASSERT_TRUE(t.store->btrees().Checkpoint().ok());
  Result<posix::Attr> again = t.Create("again");
  ASSERT_TRUE(again.ok()) << "a create after the deletes: " << again.status().Message();
  t.fs.Release(again.value().ino).IgnoreError();
  t.RemountAndCheck();
  ASSERT_TRUE(t.open());
}

}  // namespace
}  // namespace tfs
