// Test fixtures for fsck's tests: a one-member posix filesystem in memory
// (`Image`), files whose bytes say which file they are (`Content`), the
// journal entries on an image, and the check / repair / check sequence a
// damaged image goes through (`ExpectReportedRepairedClean`, for any
// fixture). Tests only; each test binary includes it once.
#ifndef TFS_FSCK_TESTING_H_
#define TFS_FSCK_TESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "alloc/format.h"
#include "btree/format.h"
#include "fsck/fsck.h"
#include "journal/format.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "sb/format.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck::fixture {

using posix::Caller;
using posix::Filesystem;

inline const Caller kRoot{0, 0};

inline std::string Content(int i) { return std::string(20000 + 997 * i, char('a' + i % 26)); }

inline u64 DamageRoot(userspace::MemDevice* dev, u8 id);

// fsck of the members `devs` (a repair run, -y, with `repair`; else a check,
// -n): its report, and its output a line each.
inline std::pair<Report, std::string> RunFsck(BlockDevice* const* devs, u32 count, bool repair) {
  std::string out;
  Options o;
  o.repair = repair;
  Report r = Check(devs, count, o, [](void* ctx, const char* line) {
    *static_cast<std::string*>(ctx) += std::string(line) + "\n";
  }, &out);
  return {r, out};
}

struct Image {
  std::unique_ptr<userspace::MemDevice> dev;

  // Node size 64 KiB: four nodes to a bucket (node_size = bucket: a bucket each).
  explicit Image(u32 node_size = 64 * 1024) : dev(testing::FormattedMember(testing::SmallFormat(node_size))) {}
  // From an image's bytes; with `volatile_cache` writes stay volatile until a
  // flush or FUA (what a power cut would leave: dev->SnapshotDurable()).
  explicit Image(const std::vector<u8>& bytes, bool volatile_cache = false) {
    userspace::MemDeviceOptions o;
    o.name = "ssd0";
    o.size = bytes.size();
    o.initial_image = bytes;
    o.volatile_cache = volatile_cache;
    dev = std::make_unique<userspace::MemDevice>(o);
  }

  // Mounts read-write, runs fn, unmounts; with `crash` the store is left
  // open and what a power cut would leave is returned instead.
  std::vector<u8> WithFs(const std::function<void(Filesystem&, store::Store&)>& fn, bool crash = false) {
    testing::MountedFs m({dev.get()});  // as a mount opens it (posix's Mount records the features)
    if (!m.open()) return {};
    fn(m.fs, *m.store);
    std::vector<u8> cut;
    if (crash) cut = dev->SnapshotDurable();
    return cut;  // (m unmounts)
  }

  Status Open(bool read_only, store::OpenReport* rep, Diag* diag) {
    BlockDevice* b = dev.get();
    store::Store e;
    store::OpenOptions oo;
    oo.read_only = read_only;
    Status st = e.Open(&b, 1, oo, diag, rep);
    if (st.ok()) {
      EXPECT_TRUE(e.Close().ok());
    }
    return st;
  }

  // fsck of the image, or of what `through` (a device over this image's)
  // shows.
  std::pair<Report, std::string> Fsck(bool repair, BlockDevice* through = nullptr) {
    BlockDevice* b = through != nullptr ? through : dev.get();
    return RunFsck(&b, 1, repair);
  }

  // Damages the newest state of the allocation records (`roots` false: the
  // alloc tree's root node, whose checks then fail) or flips a byte inside
  // the newest valid copy of the roots block.
  void DamageNewest(bool roots) {
    if (!roots) {
      ASSERT_NE(DamageRoot(dev.get(), btree::kBtreeAlloc), 0u) << "no alloc tree";
      return;
    }
    u64 best_off = 0, best = 0;
    for (u32 slot = 0; slot < 2; slot++) {
      const u64 off = btree::kRootsOffset + slot * btree::kRootsSlotSize;
      btree::RootsFormat r;
      dev->ReadRaw(off, &r, sizeof(r));
      const u64 n = r.gen.get();
      if (n > best) {
        best = n;
        best_off = off;
      }
    }
    ASSERT_GT(best, 2u);  // a newer copy than format's
    const u64 at = best_off + 200;
    u8 v;
    dev->ReadRaw(at, &v, 1);
    v ^= 0x5a;
    dev->WriteRaw(at, &v, 1);
  }

  // The image's durable bytes (what a power cut would leave).
  std::vector<u8> Bytes() const { return dev->SnapshotDurable(); }

  sb::Superblock SbOf() {
    sb::Superblock s;
    Diag d;
    EXPECT_TRUE(sb::Read(*dev, &s, &d).ok()) << d.text;
    return s;
  }

  // Every file f<i> for from <= i < to reads back its content.
  void ExpectFiles(int to, int from = 0) {
    WithFs([&](Filesystem& fs, store::Store&) {
      for (int i = from; i < to; i++) {
        const std::string name = "f" + std::to_string(i);
        auto a = fs.Lookup(posix::kRootIno, name.data(), u32(name.size()));
        ASSERT_TRUE(a.ok()) << name;
        const std::string want = Content(i);
        std::string got(want.size(), '\0');
        auto r = fs.Read(a.value().ino, 0, got.data(), u32(got.size()));
        ASSERT_TRUE(r.ok()) << name << ": " << r.status().Message();
        EXPECT_EQ(r.value(), want.size()) << name;
        EXPECT_TRUE(got == want) << name;
      }
    });
  }
};

inline void MakeFiles(Filesystem& fs, int from, int to) {
  for (int i = from; i < to; i++) {
    const std::string name = "f" + std::to_string(i);
    auto a = fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
    ASSERT_TRUE(a.ok());
    const std::string c = Content(i);
    ASSERT_TRUE(fs.Write(a.value().ino, 0, c.data(), u32(c.size())).ok());
    ASSERT_TRUE(fs.Fsync(a.value().ino).ok());
  }
}

// Several mounts, each with files: the trees and roots move well past format's.
inline void Populate(Image& img, int mounts, int per_mount) {
  for (int m = 0; m < mounts; m++)
    img.WithFs([&](Filesystem& fs, store::Store&) { MakeFiles(fs, m * per_mount, (m + 1) * per_mount); });
}

// Flips a byte in the first set's header of tree `id`'s root node (whose
// checks then fail); returns the node's offset (0: the tree has no root).
inline u64 DamageRoot(userspace::MemDevice* dev, u8 id) {
  btree::NodePtrFormat root{};
  store::Store e;
  store::OpenOptions oo;
  oo.read_only = true;
  if (!testing::OpenStore(&e, {dev}, oo).ok()) return 0;
  root = e.btrees().roots().roots[id];
  EXPECT_TRUE(e.Close().ok());
  if (btree::PtrEmpty(root)) return 0;
  const u64 off = btree::PtrCopy(root, 0).offset;
  u8 byte;
  dev->ReadRaw(off + 100, &byte, 1);
  byte ^= 0x10;
  dev->WriteRaw(off + 100, &byte, 1);
  return off;
}

struct EntryAt {
  u64 off;  // of its header on the image
  u64 seq;
};

// The valid-looking journal entries on the image that replay would consider
// (magic, and seq at or above the superblock's floor), oldest first.
inline std::vector<EntryAt> JournalEntries(Image& img) {
  const sb::Superblock s = img.SbOf();
  u64 word;
  memcpy(&word, s.fs_uuid, 8);
  const sb::Member& m = s.members[0];
  std::vector<EntryAt> out;
  for (u32 b = 0; b < m.journal_nbuckets; b++) {
    const u64 base = s.BucketOffset(m.journal_first_bucket + b);
    for (u32 pos = 0; pos + sizeof(journal::EntryHeader) <= s.bucket_size; pos += journal::kJournalBlock) {
      journal::EntryHeader h;
      img.dev->ReadRaw(base + pos, &h, sizeof(h));
      if (h.magic.get() == (journal::kJournalMagic ^ word) && h.seq.get() >= s.journal_seq)
        out.push_back({base + pos, h.seq.get()});
    }
  }
  std::sort(out.begin(), out.end(), [](const EntryAt& a, const EntryAt& b) { return a.seq < b.seq; });
  return out;
}

// What fsck -n and fsck -y said of a damaged image.
struct Repair {
  Report checked;      // fsck -n's
  std::string report;  // fsck -n's output
  Report fixed;        // fsck -y's
  std::string repair;  // fsck -y's output
};

// fsck -n reports the damage (exit 4, saying `reported` if given) and
// writes nothing; fsck -y repairs it (exit 1, saying `repaired` if given);
// and fsck -n then finds the image clean. Their results, for the caller's
// further checks. `img` is any fixture with Fsck(repair), giving the Report
// and the output, and Bytes(), its members' durable bytes.
template <typename Img>
Repair ExpectReportedRepairedClean(Img& img, const char* reported, const char* repaired) {
  const auto before = img.Bytes();
  auto [r, out] = img.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << out;
  EXPECT_TRUE(img.Bytes() == before) << "fsck -n wrote";
  if (reported != nullptr) {
    EXPECT_NE(out.find(reported), std::string::npos) << out;
  }
  auto [r2, out2] = img.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  if (repaired != nullptr) {
    EXPECT_NE(out2.find(repaired), std::string::npos) << out2;
  }
  auto [r3, out3] = img.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << "after the repair:\n" << out2 << "the next check:\n" << out3;
  return {r, out, r2, out2};
}

}  // namespace tfs::fsck::fixture

#endif  // TFS_FSCK_TESTING_H_
