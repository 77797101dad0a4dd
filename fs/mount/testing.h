// Test fixtures shared by the core's tests: members formatted in memory with
// the tests' small geometry (256 KiB buckets, 64 KiB nodes, so a few MiB of
// metadata make many buckets and nodes), alone or in the two-tier SSD + HDD
// shape; a store opened on them; and posix on that store, brought up and
// down in the order mount::Instance keeps (store, data path, posix; down in
// reverse), for tests that need to reach each layer or crash between them.
// Each helper that formats or opens reports a failure as a test failure with
// the Diag's text, and returns the status for the caller's ASSERT.
// Tests only (kernel_safe_check.py skips testing.h headers); the fixtures of
// one subsystem (fsck/testing.h) build on these.
#ifndef TFS_MOUNT_TESTING_H_
#define TFS_MOUNT_TESTING_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/data.h"
#include "posix/fs.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::testing {

inline constexpr u64 kMemberBytes = 64ull << 20;

// The tests' format options: small buckets and nodes, the rest defaults.
inline store::FormatOptions SmallFormat(u32 node_size = 64 * 1024) {
  store::FormatOptions fo;
  fo.bucket_size = 256 * 1024;
  fo.btree_node_size = node_size;
  return fo;
}

// The two-tier shape's options (members "ssd.a" and "hdd.b"): metadata on the
// SSD, new data on `data_on`, the HDD the background target; small geometry.
inline store::FormatOptions TwoTierFormat(const char* data_on = "ssd") {
  store::FormatOptions fo = SmallFormat();
  fo.foreground_target = data_on;
  fo.metadata_target = "ssd";
  fo.background_target = "hdd";
  return fo;
}

// An in-memory member ("ssd0"), blank.
inline std::unique_ptr<userspace::MemDevice> MemMember(u64 size = kMemberBytes) {
  userspace::MemDeviceOptions o;
  o.name = "ssd0";
  o.size = size;
  return std::make_unique<userspace::MemDevice>(o);
}

// Formats devs[i] as member labels[i] (none given: "ssd.a", "ssd.b", ...).
inline Status FormatMembers(const std::vector<BlockDevice*>& devs, const store::FormatOptions& fo = SmallFormat(),
                            const std::vector<const char*>& labels = {}, const std::vector<u8>& durability = {}) {
  std::vector<std::string> names;
  for (size_t i = 0; i < devs.size(); i++)
    names.push_back(i < labels.size() ? std::string(labels[i]) : "ssd." + std::string(1, char('a' + i)));
  std::vector<store::FormatMember> m;
  for (size_t i = 0; i < devs.size(); i++) m.push_back({devs[i], names[i].c_str(), i < durability.size() ? durability[i] : u8(1)});
  Diag diag;
  Status st = store::Format(m.data(), u32(m.size()), fo, &diag);
  EXPECT_TRUE(st.ok()) << "format: " << st.Message() << ": " << diag.text;
  return st;
}

// Formats `ssd` as "ssd.a" and `hdd` as "hdd.b".
inline Status FormatTwoTier(BlockDevice* ssd, BlockDevice* hdd, const store::FormatOptions& fo = TwoTierFormat()) {
  return FormatMembers({ssd, hdd}, fo, {"ssd.a", "hdd.b"});
}

// Formats `dev` alone as member "ssd.a".
inline void FormatOne(BlockDevice* dev, const store::FormatOptions& fo = SmallFormat()) {
  FormatMembers({dev}, fo).IgnoreError();  // (a failure is the test's already)
}

// A blank member, formatted.
inline std::unique_ptr<userspace::MemDevice> FormattedMember(const store::FormatOptions& fo = SmallFormat()) {
  auto dev = MemMember();
  FormatOne(dev.get(), fo);
  return dev;
}

// Opens `s` on `devs` (any order).
inline Status OpenStore(store::Store* s, const std::vector<BlockDevice*>& devs,
                        const store::OpenOptions& oo = store::OpenOptions{}, store::OpenReport* rep = nullptr) {
  Diag diag;
  Status st = s->Open(devs.data(), u32(devs.size()), oo, &diag, rep);
  EXPECT_TRUE(st.ok()) << "store open: " << st.Message() << ": " << diag.text;
  return st;
}

// posix on a store on `devs`, up in mount::Instance's order (store, data
// path, posix) and down in reverse, with each layer in reach. Mount() after
// setting `devs` and the options (the constructor with devices does it); a
// stage that fails is a test failure and leaves it not open(). A test type
// that derives from it and owns the devices calls Unmount() in its own
// destructor (the devices go before this one's runs).
// posix's options for the fixtures: the repair worker (docs/design/copies.md,
// "Step 6b") off -- a test that counts what a read does, checks the counts
// while nothing commits (VerifyAgainstExtents) or closes the store under a
// mounted posix (Crash) wants no background commit; the repair tests turn
// it on, or call Filesystem::RepairQueued themselves.
inline posix::Filesystem::Options TestFsOptions() {
  posix::Filesystem::Options o;
  o.repair_copies = false;
  return o;
}

struct MountedFs {
  std::vector<BlockDevice*> devs;
  store::OpenOptions store_options;
  posix::Filesystem::Options fs_options = TestFsOptions();
  std::unique_ptr<store::Store> store;  // a new one each Mount (a Store opens once)
  data::DataPath data;                  // (mount::Instance owns it; posix borrows it)
  posix::Filesystem fs;

  MountedFs() = default;
  explicit MountedFs(std::vector<BlockDevice*> d, const store::OpenOptions& so = store::OpenOptions{},
                     const posix::Filesystem::Options& po = TestFsOptions())
      : devs(std::move(d)), store_options(so), fs_options(po) {
    Mount();
  }
  ~MountedFs() { Unmount(); }
  MountedFs(const MountedFs&) = delete;
  MountedFs& operator=(const MountedFs&) = delete;

  bool open() const { return store != nullptr && store->open(); }
  // Store, data path, posix; what opened is closed again if a later stage fails.
  void Mount() {
    store = std::make_unique<store::Store>();
    if (!OpenStore(store.get(), devs, store_options).ok()) return;
    const char* stage = "data path open";
    Status st = data.Open(store.get());
    if (st.ok()) {
      stage = "posix mount";
      st = fs.Mount(store.get(), &data, fs_options);
    }
    if (!st.ok()) {
      ADD_FAILURE() << stage << ": " << st.Message();
      data.Close();
      store->Close().IgnoreError();
    }
  }
  // posix's unmount, the data path's close, the store's (each must succeed).
  void Unmount() {
    if (!open()) return;
    Status st = fs.Unmount();
    EXPECT_TRUE(st.ok()) << "posix unmount: " << st.Message();
    data.Close();
    st = store->Close();
    EXPECT_TRUE(st.ok()) << "store close: " << st.Message();
  }
  // A clean unmount and a mount again.
  void Remount() {
    Unmount();
    Mount();
  }
  // A crash as posix sees it: the store closed under a mounted posix, so what
  // posix's unmount does (write buffers out, open orphans freed) is not done.
  // Final: a new MountedFs on the devices mounts what it left.
  void Crash() {
    ASSERT_TRUE(open());
    Status st = store->Close();
    EXPECT_TRUE(st.ok()) << "store close: " << st.Message();
  }
};

}  // namespace tfs::testing

#endif  // TFS_MOUNT_TESTING_H_
