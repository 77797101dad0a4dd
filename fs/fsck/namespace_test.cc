// fsck's namespace pass: clean on a namespace built by posix::Filesystem (with
// collisions, tombstones, links, symlinks, xattrs), and each kind of damage --
// written straight into the btrees -- reported with exit code 4.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsck/fsck.h"
#include "posix/fs.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

using posix::Caller;
using posix::Filesystem;

struct Fixture {
  std::unique_ptr<userspace::MemDevice> dev;
  u64 dir = 0, file = 0, link = 0, sub = 0;

  Fixture() {
    userspace::MemDeviceOptions o;
    o.name = "ssd0";
    o.size = 64ull << 20;
    dev = std::make_unique<userspace::MemDevice>(o);
    engine::FormatMember m = {dev.get(), "ssd.a", 1};
    engine::FormatOptions fo;
    fo.bucket_size = 256 * 1024;
    fo.btree_node_size = 64 * 1024;
    Diag diag;
    EXPECT_TRUE(engine::Format(&m, 1, fo, &diag).ok()) << diag.text;
    // A namespace with everything in it; directories hash into two slots, so
    // chains are long and removals leave tombstones.
    WithFs([&](Filesystem& fs, btree::Btrees&) {
      const Caller who{0, 0};
      dir = fs.Mkdir(posix::kRootIno, "dir", 3, 0755, who).value().ino;
      sub = fs.Mkdir(dir, "sub", 3, 0755, who).value().ino;
      for (int i = 0; i < 40; i++) {
        const std::string n = "f" + std::to_string(i);
        ASSERT_TRUE(fs.Mknod(dir, n.data(), u32(n.size()), posix::kModeReg | 0644, 0, who).ok());
      }
      for (int i = 0; i < 40; i += 3) {
        const std::string n = "f" + std::to_string(i);
        ASSERT_TRUE(fs.Unlink(dir, n.data(), u32(n.size())).ok());
      }
      file = fs.Lookup(dir, "f1", 2).value().ino;
      ASSERT_TRUE(fs.Link(file, posix::kRootIno, "hard", 4).ok());
      // Data: one extent of three blocks, then its middle block overwritten
      // (three extents, two of them pieces of the first blob).
      const std::string bytes(3 * 4096, 'd');
      ASSERT_TRUE(fs.Write(file, 0, bytes.data(), u32(bytes.size())).ok());
      ASSERT_TRUE(fs.Write(file, 4096 + 10, "xyz", 3).ok());
      const std::string target(3000, 't');
      link = fs.Symlink(posix::kRootIno, "sym", 3, target.data(), u32(target.size()), who).value().ino;
      ASSERT_TRUE(fs.SetXattr(file, "user.x", 6, "v", 1, 0).ok());
    }, 1);
  }

  // Mounts, runs fn, unmounts cleanly.
  void WithFs(const std::function<void(Filesystem&, btree::Btrees&)>& fn, u32 hash_bits = 62) {
    BlockDevice* b = dev.get();
    engine::Engine e;
    Diag diag;
    ASSERT_TRUE(e.Open(&b, 1, engine::OpenOptions{}, &diag).ok()) << diag.text;
    Filesystem fs;
    Filesystem::Options o;
    o.dir_hash_bits = hash_bits;
    ASSERT_TRUE(fs.Mount(&e, o).ok());
    fn(fs, e.btrees());
    ASSERT_TRUE(fs.Unmount().ok());
    ASSERT_TRUE(e.Close().ok());
  }

  // Writes (or deletes, value null) one key behind the filesystem's back.
  void Poke(const btree::Pos& pos, const void* value, u32 len) {
    WithFs([&](Filesystem&, btree::Btrees& t) {
      btree::Transaction tx(&t);
      ASSERT_TRUE((value != nullptr ? tx.Set(pos, value, len) : tx.Delete(pos)).ok());
      ASSERT_TRUE(tx.Commit().ok());
    });
  }

  std::pair<Report, std::string> Fsck() {
    BlockDevice* b = dev.get();
    std::string out;
    Report r = Check(&b, 1, Options{}, [](void* ctx, const char* line) {
      *static_cast<std::string*>(ctx) += std::string(line) + "\n";
    }, &out);
    return {r, out};
  }

  std::vector<u8> Value(const btree::Pos& pos) {
    std::vector<u8> v(btree::kMaxValueBytes);
    WithFs([&](Filesystem&, btree::Btrees& t) {
      auto r = t.Get(pos, v.data(), u32(v.size()));
      ASSERT_TRUE(r.ok());
      v.resize(r.value());
    });
    return v;
  }

  posix::InodeFormat Inode(u64 ino) {
    posix::InodeFormat f{};
    WithFs([&](Filesystem&, btree::Btrees& t) {
      ASSERT_TRUE(t.Get(btree::Pos{btree::kBtreeInodes, ino, 0}, &f, sizeof(f)).ok());
    });
    return f;
  }
};

TEST(FsckNamespaceTest, CleanNamespaceIsClean) {
  Fixture fx;
  auto [r, out] = fx.Fsck();
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("namespace: 30 inodes (3 directories), 30 entries, 1 xattrs, 3 extents, 0 problem(s)"), std::string::npos)
      << out;
}

TEST(FsckNamespaceTest, EachDamageIsReported) {
  struct Case {
    const char* what;
    std::function<void(Fixture&)> damage;
    const char* expect;
  };
  const Case cases[] = {
      {"wrong nlink", [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.file);
         i.nlink.set(5);
         f.Poke(btree::Pos{btree::kBtreeInodes, f.file, 0}, &i, sizeof(i));
       }, "wrong link count of inode"},
      {"entry to nothing", [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 0}, nullptr, 0);
       }, "entry names a missing inode"},
      {"unreachable inode", [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.file);
         f.Poke(btree::Pos{btree::kBtreeInodes, 9999, 0}, &i, sizeof(i));
       }, "unreachable inode 9999"},
      {"directory link count", [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.dir);
         i.nlink.set(2);
         f.Poke(btree::Pos{btree::kBtreeInodes, f.dir, 0}, &i, sizeof(i));
       }, "wrong link count of directory"},
      {"wrong parent", [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.sub);
         i.parent.set(posix::kRootIno);
         f.Poke(btree::Pos{btree::kBtreeInodes, f.sub, 0}, &i, sizeof(i));
       }, "wrong parent of directory"},
      {"corrupt inode", [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeInodes, f.file, 0}, "junk", 4);
       }, "corrupt record of inode"},
      {"tombstone ending a chain", [](Fixture& f) {
         posix::DirentFormat t{};
         t.type = posix::kDtTombstone;
         f.Poke(btree::Pos{btree::kBtreeDirents, f.dir, posix::kSlotEnd - 1}, &t, sizeof(t));
       }, "a tombstone ends a chain"},
      {"truncated symlink", [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 2}, nullptr, 0);
       }, "incomplete symlink target"},
      {"wrong sector count", [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.file);
         i.sectors.set(8);
         f.Poke(btree::Pos{btree::kBtreeInodes, f.file, 0}, &i, sizeof(i));
       }, "wrong sector count of inode"},
      {"stale extent pointer", [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         v[16 + 1] ^= 1;  // ExtentPtr::gen
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 1}, v.data(), u32(v.size()));
       }, "stale extent pointer"},
      {"overlapping extents", [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 3});
         v[4] = 2;  // blocks: [1, 3) now overlaps [1, 2)
         v.resize(16 + 16 + 4 * 2);
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 3}, v.data(), u32(v.size()));
       }, "overlapping extents"},
      {"extent of a directory", [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         f.Poke(btree::Pos{btree::kBtreeExtents, f.dir, 1}, v.data(), u32(v.size()));
       }, "extent of a missing or non-regular inode"},
      {"ownerless xattr", [](Fixture& f) {
         u8 v[16 + 6 + 1] = {};
         v[8] = posix::kXattrValue;
         v[9] = 6;
         v[10] = 1;
         memcpy(v + 16, "user.y", 6);
         f.Poke(btree::Pos{btree::kBtreeXattrs, 7777, 100}, v, sizeof(v));
       }, "bad or ownerless xattr key"},
  };
  for (const Case& c : cases) {
    Fixture fx;
    c.damage(fx);
    auto [r, out] = fx.Fsck();
    EXPECT_EQ(r.exit_code, kExitUncorrected) << c.what << "\n" << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.what << "\n" << out;
  }
}

TEST(FsckNamespaceTest, AnOrphanIsANoteNotAnError) {
  Fixture fx;
  // Unlink while open, then "crash": close the engine without the Filesystem's
  // unmount (which would free it).
  BlockDevice* b = fx.dev.get();
  {
    engine::Engine e;
    Diag diag;
    ASSERT_TRUE(e.Open(&b, 1, engine::OpenOptions{}, &diag).ok());
    Filesystem fs;
    ASSERT_TRUE(fs.Mount(&e).ok());
    ASSERT_TRUE(fs.OpenInode(fx.link).ok());
    ASSERT_TRUE(fs.Unlink(posix::kRootIno, "sym", 3).ok());
    ASSERT_TRUE(e.Close().ok());
  }
  auto [r, out] = fx.Fsck();
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("is an orphan"), std::string::npos) << out;
}

// Unwritten extents (fallocate) hold no pointer: clean, and counted in the
// sector count; one claiming a pointer is a corrupt extent.
TEST(FsckNamespaceTest, UnwrittenExtentsAreCheckedToo) {
  Fixture fx;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    ASSERT_TRUE(fs.Fallocate(fx.file, posix::kFallocKeepSize, 8 * 4096, 3 * 4096).ok());
  });
  auto [r, out] = fx.Fsck();
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("4 extents, 0 problem(s)"), std::string::npos) << out;
  std::vector<u8> v = fx.Value(btree::Pos{btree::kBtreeExtents, fx.file, 11});
  ASSERT_EQ(v.size(), 16u);
  v[2] = 1;  // nr_ptrs
  fx.Poke(btree::Pos{btree::kBtreeExtents, fx.file, 11}, v.data(), u32(v.size()));
  auto [r2, out2] = fx.Fsck();
  EXPECT_EQ(r2.exit_code, kExitUncorrected) << out2;
  EXPECT_NE(out2.find("data: corrupt extent"), std::string::npos) << out2;
}

}  // namespace
}  // namespace tfs::fsck
