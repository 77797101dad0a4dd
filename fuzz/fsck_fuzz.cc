// fsck over mutated small images. Two base images are built once: a cleanly
// unmounted filesystem and one cut off with its journal unreplayed, each with
// files, a directory, a symlink and an xattr. The input picks one (first byte)
// and patches it: repeated records of a block index (2 bytes, taken modulo the
// image's non-zero 4 KiB blocks: metadata and data, not empty space), an
// offset in the block (2 bytes), a length (1 byte, at most 16) and that many
// bytes. Then fsck -n, fsck -y and fsck -n again run on the result. Besides
// crashes, hangs and sanitizer reports: exit codes are fsck(8)'s, and after a
// -y that says everything was corrected (0 or 1) the next -n is clean.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fsck/fsck.h"
#include "fuzz/fuzz.h"
#include "posix/fs.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

using namespace tfs;

namespace {

constexpr u64 kImageSize = 16ull << 20;
constexpr u32 kBlock = 4096;

struct Base {
  std::vector<u8> image;
  std::vector<u32> blocks;  // indexes of its non-zero 4 KiB blocks
};

void Populate(posix::Filesystem& fs, int from, int to) {
  const posix::Caller root{0, 0};
  auto d = fs.Mkdir(posix::kRootIno, "d", 1, 0755, root);
  const u64 dir = d.ok() ? d.value().ino : posix::kRootIno;
  for (int i = from; i < to; i++) {
    const std::string name = "f" + std::to_string(i);
    auto a = fs.Mknod(i % 2 ? dir : posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, root);
    if (!a.ok()) fuzz::Fail("populate: mknod");
    const std::string c(5000 + 3000 * i, char('a' + i));
    if (!fs.Write(a.value().ino, 0, c.data(), u32(c.size())).ok()) fuzz::Fail("populate: write");
    if (!fs.Fsync(a.value().ino).ok()) fuzz::Fail("populate: fsync");
    if (i == from) {
      (void)fs.SetXattr(a.value().ino, "user.k", 6, "value", 5, 0, posix::Filesystem::kFrontEndChecked);
      (void)fs.Symlink(dir, "l", 1, name.data(), u32(name.size()), root);
    }
  }
}

Base Build(bool crash) {
  auto formatted = fuzz::Formatted(kImageSize, 64 * 1024, 16 * 1024);
  userspace::MemDevice& dev = *formatted;
  Diag diag;
  Base b;
  BlockDevice* bd = &dev;
  {
    store::Store e;
    if (!e.Open(&bd, 1, store::OpenOptions{}, &diag).ok()) fuzz::Fail(diag.text);
    data::DataPath data;
    if (!data.Open(&e).ok()) fuzz::Fail("data path");
    posix::Filesystem fs;
    if (!fs.Mount(&e, &data).ok()) fuzz::Fail("mount");
    Populate(fs, 0, 6);
    if (crash) b.image = dev.SnapshotDurable();
    if (!fs.Unmount().ok()) fuzz::Fail("unmount");
    data.Close();
    if (!e.Close().ok()) fuzz::Fail("unmount");
  }
  if (!crash) b.image = dev.SnapshotDurable();
  static const u8 zero[kBlock] = {};
  for (u32 i = 0; i < kImageSize / kBlock; i++) {
    if (memcmp(b.image.data() + u64(i) * kBlock, zero, kBlock) != 0) b.blocks.push_back(i);
  }
  return b;
}

void Ignore(void*, const char*) {}

int Fsck(BlockDevice* dev, bool repair) {
  fsck::Options o;
  o.repair = repair;
  return fsck::Check(&dev, 1, o, Ignore, nullptr).exit_code;
}

bool FsckCode(int c) {
  return c == fsck::kExitClean || c == fsck::kExitRepaired || c == fsck::kExitUncorrected ||
         c == fsck::kExitOperational;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Quiet();
  static const Base bases[2] = {Build(false), Build(true)};
  if (size < 1 || size > 4096) return 0;
  const Base& base = bases[data[0] & 1];
  userspace::MemDeviceOptions o;
  o.name = "ssd0";
  o.size = kImageSize;
  o.initial_image = base.image;
  userspace::MemDevice dev(o);
  for (size_t p = 1; p + 5 <= size;) {
    const u32 block = base.blocks[(u32(data[p]) | u32(data[p + 1]) << 8) % base.blocks.size()];
    const u32 off = (u32(data[p + 2]) | u32(data[p + 3]) << 8) % kBlock;
    u32 len = data[p + 4] % 17;
    p += 5;
    if (len > size - p) len = u32(size - p);
    if (len > kBlock - off) len = kBlock - off;
    dev.WriteRaw(u64(block) * kBlock + off, data + p, len);
    p += len;
  }
  const int n = Fsck(&dev, false);
  const int y = Fsck(&dev, true);
  const int again = Fsck(&dev, false);
  if (!FsckCode(n) || !FsckCode(y) || !FsckCode(again)) fuzz::Fail("an exit code fsck(8) does not have");
  if ((y == fsck::kExitClean || y == fsck::kExitRepaired) && again != fsck::kExitClean)
    fuzz::Fail("fsck -y said every error was corrected, but the next fsck -n finds more");
  return 0;
}
