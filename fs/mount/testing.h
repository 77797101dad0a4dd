// Test fixtures shared by the core's tests: one member formatted in memory
// with the tests' small geometry (256 KiB buckets, 64 KiB nodes, so a few MiB
// of metadata make many buckets and nodes).
// Tests only (kernel_safe_check.py skips testing.h headers); the fixtures of
// one subsystem (fsck/testing.h) build on these.
#ifndef TFS_MOUNT_TESTING_H_
#define TFS_MOUNT_TESTING_H_

#include <gtest/gtest.h>

#include <memory>

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

// An in-memory member ("ssd0"), blank.
inline std::unique_ptr<userspace::MemDevice> MemMember(u64 size = kMemberBytes) {
  userspace::MemDeviceOptions o;
  o.name = "ssd0";
  o.size = size;
  return std::make_unique<userspace::MemDevice>(o);
}

// Formats `dev` alone as member "ssd.a" (a test failure if it does not).
inline void FormatOne(BlockDevice* dev, const store::FormatOptions& fo = SmallFormat()) {
  store::FormatMember m = {dev, "ssd.a", 1};
  Diag diag;
  EXPECT_TRUE(store::Format(&m, 1, fo, &diag).ok()) << diag.text;
}

// A blank member, formatted.
inline std::unique_ptr<userspace::MemDevice> FormattedMember(const store::FormatOptions& fo = SmallFormat()) {
  auto dev = MemMember();
  FormatOne(dev.get(), fo);
  return dev;
}

}  // namespace tfs::testing

#endif  // TFS_MOUNT_TESTING_H_
