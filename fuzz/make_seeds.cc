// Writes the fuzz targets' seed inputs into DIR/<target>/ (the committed
// corpus, fuzz/corpus/, came from `fuzz_make_seeds fuzz/corpus`): valid
// superblocks, nodes, journal rings and values as the store writes them, so
// the fuzzers start from deep inside each parser.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "btree/node.h"
#include "btree/tree.h"
#include "data/extent.h"
#include "dev/device_set.h"
#include "fuzz/fuzz.h"
#include "journal/journal.h"
#include "platform/platform.h"
#include "posix/fs.h"
#include "sb/format.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

using namespace tfs;

namespace {

std::string g_dir;

void Put(const std::string& target, const std::string& name, const void* p, size_t n) {
  const std::string d = g_dir + "/" + target;
  mkdir(d.c_str(), 0755);
  const std::string path = d + "/" + name;
  FILE* f = fopen(path.c_str(), "wb");
  if (f == nullptr || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "fuzz_make_seeds: cannot write %s\n", path.c_str());
    exit(1);
  }
}

void Need(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "fuzz_make_seeds: %s failed\n", what);
    exit(1);
  }
}

void Superblocks() {
  auto dev = fuzz::Formatted(64ull << 20);
  std::vector<u8> buf(sb::kSbSize);
  dev->ReadRaw(sb::kSbPrimaryOffset, buf.data(), buf.size());
  Put("superblock", "formatted", buf.data(), buf.size());
}

void Nodes() {
  for (int variant = 0; variant < 2; variant++) {
    btree::Node n;
    btree::NodeInfo info;
    info.btree_id = btree::kBtreeTest;
    info.seq = 7;
    info.min = btree::Pos::Min(btree::kBtreeTest);
    info.max = btree::Pos::Max(btree::kBtreeTest);
    Need(n.Init(variant == 0 ? 4096 : 16384, info).ok(), "node init");
    for (u64 i = 0; i < (variant == 0 ? 12 : 90); i++) {
      btree::KeyInput k;
      k.pos = btree::Pos{btree::kBtreeTest, i % 5, i * 37 % 101};
      u64 v[3] = {i, i * i, ~i};
      k.value = v;
      k.val_bytes = u32(8 * (1 + i % 3));
      if (i % 7 == 6) {
        k.type = btree::kKeyWhiteout;
        k.value = nullptr;
        k.val_bytes = 0;
      }
      Need(n.Upsert(k, 100 + i).ok(), "node upsert");
    }
    std::vector<u8> img(n.node_size() + 4096);
    u8* p = reinterpret_cast<u8*>((reinterpret_cast<uintptr_t>(img.data()) + 4095) & ~uintptr_t(4095));
    memset(p, 0, n.node_size());
    (void)n.WriteImage(p, 8);  // (zero-padded to the node size the header names)
    Put("node", variant == 0 ? "leaf-4k" : "leaf-16k-sets", p, n.node_size());
  }
}

void Journal() {
  const sb::Superblock s = fuzz::JournalSuperblock();
  userspace::MemDeviceOptions o;
  o.name = "ssd.a";
  o.size = fuzz::kJournalDevSize;
  userspace::MemDevice dev(o);
  std::deque<journal::Pin> pins;
  {
    dev::DeviceSet devs;
    Need(devs.Add(&dev, "ssd.a", dev::QueueConfig{}).ok(), "device set");
    journal::Journal j;
    Status st = j.Start(&devs, s, 1, journal::Config{});
    if (!st.ok()) fprintf(stderr, "journal start: %s\n", st.Message());
    Need(st.ok(), "journal start");
    // (Pins are held, so the entries must fit the 4-bucket ring: 10 do.)
    for (u64 i = 0; i < 10; i++) {
      u64 v[4] = {i, i + 1, i + 2, i + 3};
      journal::Key keys[2] = {{journal::kKeyTest, 8, v}, {journal::kKeyTest, u32(8 * (1 + i % 4)), v}};
      pins.emplace_back();
      const journal::CommitMode mode = i % 3 == 2 ? journal::CommitMode::kFlush : journal::CommitMode::kNoFlush;
      Need(j.Commit(keys, i % 2 ? 2 : 1, 0, mode, &pins.back()).ok(), "journal commit");
    }
    Need(j.Stop().ok(), "journal stop");
    for (journal::Pin& p : pins) j.PinDrop(&p);
  }
  const u32 ring = fuzz::kJournalBucket * fuzz::kJournalRingBuckets;
  std::vector<u8> buf(ring);
  dev.ReadRaw(s.BucketOffset(s.members[0].journal_first_bucket), buf.data(), ring);
  // Trailing zeros are the fuzzer's to add.
  size_t n = ring;
  while (n > 0 && buf[n - 1] == 0) n--;
  Put("journal", "ring-10-commits", buf.data(), (n + 4095) / 4096 * 4096);
}

void Values() {
  auto dev = fuzz::Formatted(fuzz::kValuesDevSize, fuzz::kValuesBucket, fuzz::kValuesNode);
  Diag diag;
  BlockDevice* b = dev.get();
  store::Store e;
  Need(e.Open(&b, 1, store::OpenOptions{}, &diag).ok(), "open");
  data::DataPath data;
  Need(data.Open(&e).ok(), "data path");
  posix::Filesystem fs;
  Need(fs.Mount(&e, &data).ok(), "mount");
  const posix::Caller root{0, 0};
  auto d = fs.Mkdir(posix::kRootIno, "dir", 3, 0755, root);
  Need(d.ok(), "mkdir");
  for (int i = 0; i < 3; i++) {
    const std::string name = "file" + std::to_string(i);
    auto a = fs.Mknod(d.value().ino, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, root);
    Need(a.ok(), "mknod");
    const std::string c(4096 * (1 + i) + 100, char('x' + i));
    Need(fs.Write(a.value().ino, 0, c.data(), u32(c.size())).ok(), "write");
    Need(fs.SetXattr(a.value().ino, "user.seed", 9, "value", 5, 0, posix::Filesystem::kFrontEndChecked).ok(),
         "setxattr");
    Need(fs.Fsync(a.value().ino).ok(), "fsync");
  }
  struct Kind {
    u8 btree_id;
    u8 selector;
    const char* name;
  };
  for (const Kind& k : {Kind{btree::kBtreeExtents, 0, "extent"}, Kind{btree::kBtreeInodes, 1, "inode"},
                        Kind{btree::kBtreeDirents, 2, "dirent"}, Kind{btree::kBtreeXattrs, 3, "xattr"},
                        Kind{btree::kBtreeBackpointers, 4, "backpointer"}, Kind{btree::kBtreeAlloc, 5, "alloc"}}) {
    btree::Iterator it(&e.btrees(), k.btree_id);
    int n = 0;
    for (Status st = it.SeekToFirst(); st.ok() && it.Valid() && n < 3; st = it.Next(), n++) {
      std::vector<u8> in;
      in.push_back(k.selector);
      if (k.selector == 0 || k.selector >= 4) {  // (the key too)
        const btree::Pos p = it.pos();
        in.insert(in.end(), reinterpret_cast<const u8*>(&p.inode), reinterpret_cast<const u8*>(&p.inode) + 8);
        in.insert(in.end(), reinterpret_cast<const u8*>(&p.offset), reinterpret_cast<const u8*>(&p.offset) + 8);
      }
      in.insert(in.end(), it.value(), it.value() + it.val_bytes());
      Put("values", std::string(k.name) + "-" + std::to_string(n), in.data(), in.size());
    }
  }
  // Node pointers (selector 6; the first byte also picks the members, 1
  // for 6, 2 for 13): the roots after a checkpoint, an empty tree's root,
  // and a pointer with two copies built from the first.
  {
    Need(e.btrees().Checkpoint().ok(), "checkpoint");
    const btree::Roots& r = e.btrees().roots();
    auto put = [](const char* name, u8 selector, const btree::NodePtrFormat& p) {
      std::vector<u8> in = {selector};
      in.insert(in.end(), reinterpret_cast<const u8*>(&p), reinterpret_cast<const u8*>(&p) + sizeof(p));
      Put("values", name, in.data(), in.size());
    };
    const btree::NodePtrFormat& ext = r.roots[btree::kBtreeExtents];
    Need(btree::PtrCopies(ext) == 1, "an extents root");
    put("node-ptr-root", 6, ext);
    put("node-ptr-empty", 6, btree::EmptyPtr(btree::kBtreeTest));
    btree::NodePtrFormat two = ext;
    btree::AddPtrCopy(&two, 1, btree::PtrCopy(ext, 0).offset);
    put("node-ptr-2-copies", 13, two);
  }
  // Accounting keys (alloc keys above the members: alloc/accounting.h).
  {
    btree::Iterator it(&e.btrees(), btree::kBtreeAlloc);
    int n = 0;
    for (Status st = it.Seek(btree::Pos{btree::kBtreeAlloc, alloc::kAcctInodeBase, 0}); st.ok() && it.Valid() && n < 4;
         st = it.Next(), n++) {
      const btree::Pos p = it.pos();
      std::vector<u8> in = {5};
      in.insert(in.end(), reinterpret_cast<const u8*>(&p.inode), reinterpret_cast<const u8*>(&p.inode) + 8);
      in.insert(in.end(), reinterpret_cast<const u8*>(&p.offset), reinterpret_cast<const u8*>(&p.offset) + 8);
      in.insert(in.end(), it.value(), it.value() + it.val_bytes());
      Put("values", "acct-" + std::to_string(n), in.data(), in.size());
    }
  }
  // Extents with several copies (nothing writes them yet): built with the
  // extent API from the first extent above.
  {
    btree::Iterator it(&e.btrees(), btree::kBtreeExtents);
    Need(it.SeekToFirst().ok() && it.Valid(), "seek");
    const btree::Pos pos = it.pos();
    data::Extent x;
    Need(data::ParseExtent(pos, it.value(), it.val_bytes(), &x).ok(), "parse extent");
    std::vector<u8> crcs(x.crcs, x.crcs + 4 * x.blocks());
    x.crcs = crcs.data();
    auto put = [&](const char* name, const data::Extent& v) {
      u8 buf[data::kExtentValueMax];
      auto len = data::BuildExtent(v, buf);
      Need(len.ok(), name);
      std::vector<u8> in = {0};
      in.insert(in.end(), reinterpret_cast<const u8*>(&pos.inode), reinterpret_cast<const u8*>(&pos.inode) + 8);
      in.insert(in.end(), reinterpret_cast<const u8*>(&pos.offset), reinterpret_cast<const u8*>(&pos.offset) + 8);
      in.insert(in.end(), buf, buf + len.value());
      Put("values", name, in.data(), in.size());
    };
    data::Extent::Ptr zp{};  // a compressed copy of the same blocks
    zp.dev = 1;
    zp.offset = x.ptrs[0].offset + (4ull << 20);
    zp.compressed = true;
    zp.stored_blocks = u8(x.blocks());
    zp.disk_bytes = 1000;
    zp.crc = 0x12345678;
    data::Extent two = x;
    two.ptrs[1] = x.ptrs[0];
    two.ptrs[1].dev = 1;
    two.ptrs[1].cached = true;
    two.nr_ptrs = 2;
    put("extent-2-copies", two);
    data::Extent four = two;
    four.ptrs[2] = zp;
    four.ptrs[2].dev = 2;
    four.ptrs[3] = zp;
    four.ptrs[3].dev = 3;
    four.ptrs[3].cached = true;
    four.nr_ptrs = 4;
    put("extent-4-copies-mixed", four);
    data::Extent zz = x;
    zz.ptrs[0] = zp;
    zz.ptrs[0].dev = 0;
    zz.ptrs[1] = zp;
    zz.nr_ptrs = 2;
    zz.crcs = nullptr;
    put("extent-2-compressed-copies", zz);
    data::Extent edge = two;  // a plain blob ending at 128 blocks, the most there is
    edge.ptrs[0].blob_offset = data::kMaxExtentBlocks - x.blocks();
    put("extent-plain-blob-end", edge);
  }
  // A chunked xattr's entry (its descriptor after the name), of a file made
  // last so that the seeds above stay what they were.
  auto big = fs.Mknod(d.value().ino, "big", 3, posix::kModeReg | 0644, 0, root);
  Need(big.ok(), "mknod");
  const std::string v(5000, 'b');
  Need(fs.SetXattr(big.value().ino, "user.big", 8, v.data(), u32(v.size()), 0,
                   posix::Filesystem::kFrontEndChecked).ok(), "setxattr");
  {
    btree::Iterator it(&e.btrees(), btree::kBtreeXattrs);
    Need(it.Seek(btree::Pos{btree::kBtreeXattrs, big.value().ino, 0}).ok() && it.Valid(), "seek");
    std::vector<u8> in = {3};
    in.insert(in.end(), it.value(), it.value() + it.val_bytes());
    Put("values", "xattr-chunked", in.data(), in.size());
  }
  Need(fs.Unmount().ok(), "unmount");
  data.Close();
  Need(e.Close().ok(), "close");
}

void FsckPatches() {
  const u8 clean[] = {0};
  const u8 crashed[] = {1};
  Put("fsck", "clean-unpatched", clean, sizeof(clean));
  Put("fsck", "crashed-unpatched", crashed, sizeof(crashed));
  // One byte in block 0 (the superblock), and four in some later block.
  const u8 p1[] = {0, 0, 0, 100, 0, 1, 0xff};
  const u8 p2[] = {1, 37, 0, 64, 0, 4, 1, 2, 3, 4};
  Put("fsck", "clean-sb-byte", p1, sizeof(p1));
  Put("fsck", "crashed-block-37", p2, sizeof(p2));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  g_dir = argv[1];
  mkdir(g_dir.c_str(), 0755);
  Superblocks();
  Nodes();
  Journal();
  Values();
  FsckPatches();
  printf("fuzz_make_seeds: wrote the seeds under %s\n", g_dir.c_str());
  return 0;
}
