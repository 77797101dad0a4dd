// fsck's namespace pass: clean on a namespace built by posix::Filesystem (with
// collisions, tombstones, links, symlinks, xattrs), and each kind of damage --
// written straight into the btrees -- reported with exit code 4 by a check that
// writes nothing, repaired by -y (exit 1), clean on the next check, and the
// filesystem mounts with what survived.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/data.h"
#include "fsck/fsck.h"
#include "fsck/testing.h"
#include "posix/fs.h"
#include "posix/opts.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

using posix::Caller;
using posix::Filesystem;

const std::string kLinkTarget(3000, 't');

// How a mount opens the store (mount::Instance; posix's Mount records the
// features).
store::OpenOptions MountOptions() { return store::OpenOptions{}; }

// The fixture file's chunked xattr "user.big": three chunk keys (2048, 2048,
// 904 bytes) at id 0.
std::string BigXattr() {
  std::string v(5000, '\0');
  for (size_t i = 0; i < v.size(); i++) v[i] = char('a' + (i * 7 + i / 2048) % 26);
  return v;
}
btree::Pos ChunkPos(u64 ino, u64 id, u32 i) {
  return btree::Pos{btree::kBtreeXattrs, ino, posix::XattrChunkOffset(id, i)};
}

// An inline xattr entry's bytes (name, then value).
std::vector<u8> XattrEntry(const std::string& name, const std::string& value) {
  posix::DirentFormat de{};
  de.type = posix::kXattrValue;
  de.name_len = u8(name.size());
  de.value_len.set(u16(value.size()));
  std::vector<u8> e(sizeof(de));
  memcpy(e.data(), &de, sizeof(de));
  e.insert(e.end(), name.begin(), name.end());
  e.insert(e.end(), value.begin(), value.end());
  return e;
}

// Writes n inline xattr entries of `ino` behind the filesystem's back, at
// slots from `first` up (whatever their names hash to: fsck does not check
// an xattr's reachability), in transactions of 500.
void PokeXattrs(BlockDevice* b, u64 ino, u64 first, u32 n) {
  store::Store e;
  ASSERT_TRUE(testing::OpenStore(&e, {b}).ok());
  for (u32 done = 0; done < n;) {
    btree::Transaction tx(&e.btrees());
    for (u32 k = 0; k < 500 && done < n; k++, done++) {
      const std::vector<u8> v = XattrEntry("user.p" + std::to_string(done), "v");
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeXattrs, ino, first + done}, v.data(), u32(v.size())).ok());
    }
    ASSERT_TRUE(tx.Commit().ok());
  }
  ASSERT_TRUE(e.Close().ok());
}

// The file's bytes: three blocks of 'd' with "xyz" at 4096 + 10.
std::string FileBytes() {
  std::string b(3 * 4096, 'd');
  b.replace(4096 + 10, 3, "xyz");
  return b;
}

// FileBytes with block `lost` read as a hole (its extent dropped by a repair).
std::string FileBytesWithout(u64 lost) {
  std::string b = FileBytes();
  b.replace(lost * 4096, 4096, std::string(4096, '\0'));
  return b;
}

struct Fixture {
  std::unique_ptr<userspace::MemDevice> dev;
  u64 dir = 0, file = 0, link = 0, sub = 0;
  std::map<std::string, u64> in_dir;  // the names in dir and their inodes

  // `image`: start from these bytes instead of formatting.
  explicit Fixture(const std::vector<u8>* image = nullptr) {
    userspace::MemDeviceOptions o;
    o.name = "ssd0";
    o.size = 64ull << 20;
    if (image != nullptr) {
      o.initial_image = *image;
      dev = std::make_unique<userspace::MemDevice>(o);
      return;
    }
    dev = testing::FormattedMember();
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
      link = fs.Symlink(posix::kRootIno, "sym", 3, kLinkTarget.data(), u32(kLinkTarget.size()), who).value().ino;
      ASSERT_TRUE(fs.SetXattr(file, "user.x", 6, "v", 1, 0, Filesystem::kFrontEndChecked).ok());
      const std::string big = BigXattr();
      ASSERT_TRUE(fs.SetXattr(file, "user.big", 8, big.data(), u32(big.size()), 0, Filesystem::kFrontEndChecked).ok());
      for (const std::string& n : Names(fs, dir)) in_dir[n] = fs.Lookup(dir, n.data(), u32(n.size())).value().ino;
    }, 1);
  }

  static std::set<std::string> Names(Filesystem& fs, u64 d) {
    std::set<std::string> out;
    Status st = fs.ReadDir(d, 0, [](void* ctx, const char* name, u32 len, u64, u8, u64) {
      const std::string n(name, len);
      if (n != "." && n != "..") static_cast<std::set<std::string>*>(ctx)->insert(n);
      return true;
    }, &out);
    EXPECT_TRUE(st.ok()) << st.Message();
    return out;
  }

  std::set<std::string> DirNames() const {
    std::set<std::string> out;
    for (const auto& [n, ino] : in_dir) out.insert(n);
    return out;
  }

  // Mounts, runs fn, unmounts cleanly.
  void WithFs(const std::function<void(Filesystem&, btree::Btrees&)>& fn, u32 hash_bits = 62) {
    Filesystem::Options o;
    o.dir_hash_bits = hash_bits;
    testing::MountedFs m({dev.get()}, MountOptions(), o);
    ASSERT_TRUE(m.open());
    fn(m.fs, m.store->btrees());
  }

  // Writes (or deletes, value null) one key behind the filesystem's back (on
  // the store alone: a mount would act on the damage done so far).
  void Poke(const btree::Pos& pos, const void* value, u32 len) {
    store::Store e;
    ASSERT_TRUE(testing::OpenStore(&e, {dev.get()}).ok());
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE((value != nullptr ? tx.Set(pos, value, len) : tx.Delete(pos)).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }

  // A check (-n), or with repair a repair run (-y); on_line sees every line.
  std::pair<Report, std::string> Fsck(bool repair = false,
                                      const std::function<void(const std::string&)>& on_line = nullptr) {
    BlockDevice* b = dev.get();
    struct Sink {
      std::string out;
      const std::function<void(const std::string&)>* on_line;
    } sink{"", &on_line};
    Options o;
    o.repair = repair;
    Report r = Check(&b, 1, o, [](void* ctx, const char* line) {
      auto* s = static_cast<Sink*>(ctx);
      s->out += std::string(line) + "\n";
      if (*s->on_line) (*s->on_line)(line);
    }, &sink);
    return {r, sink.out};
  }

  std::vector<u8> Bytes() const { return dev->SnapshotDurable(); }

  // The slot of `name` in directory d (0: none).
  u64 Slot(u64 d, const std::string& name) {
    u64 slot = 0;
    WithFs([&](Filesystem&, btree::Btrees& t) {
      btree::Iterator it(&t, btree::kBtreeDirents);
      ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeDirents, d, 0}).ok());
      for (; it.Valid() && it.pos().inode == d;) {
        posix::DirentFormat de;
        const char* n;
        if (posix::ParseNamedEntry(btree::kBtreeDirents, it.value(), it.val_bytes(), &de, &n).ok() &&
            de.type != posix::kDtTombstone && std::string(n, de.name_len) == name)
          slot = it.pos().offset;
        ASSERT_TRUE(it.Next().ok());
      }
    });
    return slot;
  }

  // Adds an entry behind the filesystem's back, where a lookup finds it (the
  // first empty slot of its chain).
  void PutEntry(u64 d, const std::string& name, u64 ino, u8 type) {
    const posix::InodeFormat f = Inode(d);
    u64 slot = posix::NameHash(f.hash_seed.get(), f.hash_bits, name.data(), u32(name.size()));
    while (!Value(btree::Pos{btree::kBtreeDirents, d, slot}, true).empty()) slot++;
    std::vector<u8> v(16 + name.size());
    posix::DirentFormat de{};
    de.ino.set(ino);
    de.type = type;
    de.name_len = u8(name.size());
    memcpy(v.data(), &de, 16);
    memcpy(v.data() + 16, name.data(), name.size());
    Poke(btree::Pos{btree::kBtreeDirents, d, slot}, v.data(), u32(v.size()));
  }

  void SetInode(u64 ino, const std::function<void(posix::InodeFormat&)>& change) {
    posix::InodeFormat i = Inode(ino);
    change(i);
    Poke(btree::Pos{btree::kBtreeInodes, ino, 0}, &i, sizeof(i));
  }

  // The value at pos (empty if absent and that is allowed).
  std::vector<u8> Value(const btree::Pos& pos, bool may_be_absent = false) {
    std::vector<u8> v(btree::kMaxValueBytes);
    WithFs([&](Filesystem&, btree::Btrees& t) {
      auto r = t.Get(pos, v.data(), u32(v.size()));
      if (may_be_absent && r.status().Is(ErrorClass::kNotFound)) {
        v.clear();
        return;
      }
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

// An extent value like `like` (written, plain copies) but of `blocks` blocks
// from `offset` blocks into its blob with these crcs (through the extent API:
// tests do not know the byte layout either).
std::vector<u8> ExtentValue(const std::vector<u8>& like, u32 blocks, u32 offset, const std::vector<u32>& crcs) {
  data::Extent e;
  const btree::Pos any{btree::kBtreeExtents, 1, 1000};
  EXPECT_TRUE(data::ParseExtent(any, like.data(), u32(like.size()), &e).ok());
  e.start = e.end - blocks;
  for (u32 i = 0; i < e.nr_ptrs; i++) e.ptrs[i].blob_offset = offset;
  std::vector<u8> c(4 * crcs.size());
  memcpy(c.data(), crcs.data(), c.size());  // (a little-endian host)
  e.crcs = c.data();
  std::vector<u8> v(data::kExtentValueMax);
  auto len = data::BuildExtent(e, v.data());
  EXPECT_TRUE(len.ok());
  v.resize(len.ok() ? len.value() : 0);
  return v;
}

// An extent value with `edit` applied to it (through the extent API).
template <typename Fn>
std::vector<u8> Edited(const std::vector<u8>& value, Fn edit) {
  data::Extent e;
  const btree::Pos any{btree::kBtreeExtents, 1, 1000};
  EXPECT_TRUE(data::ParseExtent(any, value.data(), u32(value.size()), &e).ok());
  edit(e);
  std::vector<u8> v(data::kExtentValueMax);
  auto len = data::BuildExtent(e, v.data());
  EXPECT_TRUE(len.ok());
  v.resize(len.ok() ? len.value() : 0);
  return v;
}

// The crc of block i of a plain extent value.
u32 Crc(const std::vector<u8>& extent, u32 i) {
  data::Extent e;
  const btree::Pos any{btree::kBtreeExtents, 1, 1000};
  EXPECT_TRUE(data::ParseExtent(any, extent.data(), u32(extent.size()), &e).ok());
  return e.BlockCrc(i);
}

// Whether an extent value's (only) copy is compressed.
bool Compressed(const std::vector<u8>& extent) {
  data::Extent e;
  const btree::Pos any{btree::kBtreeExtents, 1, 1000};
  return data::ParseExtent(any, extent.data(), u32(extent.size()), &e).ok() && e.nr_ptrs == 1 &&
         e.ptrs[0].compressed;
}

TEST(FsckNamespaceTest, CleanNamespaceIsClean) {
  Fixture fx;
  auto [r, out] = fx.Fsck();
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("namespace: 30 inodes (3 directories), 30 entries, 2 xattrs, 3 extents, 0 problem(s)"), std::string::npos)
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
         v = Edited(v, [](data::Extent& e) { e.ptrs[0].gen ^= 1; });
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 1}, v.data(), u32(v.size()));
       }, "stale extent pointer"},
      {"overlapping extents", [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 3});
         v = ExtentValue(v, 2, 0, {Crc(v, 0), Crc(v, 0)});  // blocks: [1, 3) now overlaps [1, 2)
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
  // Unlink while open, then "crash": close the store without the Filesystem's
  // unmount (which would free it).
  {
    testing::MountedFs m({fx.dev.get()}, MountOptions());
    ASSERT_TRUE(m.open());
    ASSERT_TRUE(m.fs.OpenInode(fx.link).ok());
    ASSERT_TRUE(m.fs.Unlink(posix::kRootIno, "sym", 3).ok());
    m.Crash();
  }
  auto [r, out] = fx.Fsck();
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find("is an orphan"), std::string::npos) << out;
}

// Freeing a file's data takes a transaction per batch of extents; a crash
// between them leaves an orphan with part of its data. Each batch sets the
// inode's sector count to what is left, so that orphan checks clean (a note)
// at every commit of the free -- it was "wrong sector count" (exit 4) when only
// the extents went.
TEST(FsckNamespaceTest, AnOrphanFreedHalfWayIsStillANote) {
  Fixture fx;
  BlockDevice* b = fx.dev.get();
  struct Cut {
    store::Store* e = nullptr;
    userspace::MemDevice* dev = nullptr;
    bool armed = false;
    std::vector<std::vector<u8>> images;  // what a power cut at each commit leaves
  } cut;
  cut.dev = fx.dev.get();
  store::OpenOptions oo;
  oo.btree.test_point_ctx = &cut;
  oo.btree.test_point = [](void* ctx, const char* point) {
    auto* c = static_cast<Cut*>(ctx);
    if (!c->armed || std::string(point) != "commit.journaled") return;
    ASSERT_TRUE(c->e->journal().Flush().ok());  // this commit and every one before it durable
    c->images.push_back(c->dev->SnapshotDurable());
  };
  {
    store::Store e;
    cut.e = &e;
    Diag diag;
    ASSERT_TRUE(e.Open(&b, 1, oo, &diag).ok()) << diag.text;
    data::DataPath data;
    ASSERT_TRUE(data.Open(&e).ok());
    Filesystem fs;
    ASSERT_TRUE(fs.Mount(&e, &data).ok());
    const Caller who{0, 0};
    const u64 f = fs.Mknod(posix::kRootIno, "big", 3, posix::kModeReg | 0644, 0, who).value().ino;
    const std::string block(4096, 'b');
    for (u64 i = 0; i < 600; i++)  // 600 one-block extents (every other block): three batches
      ASSERT_TRUE(fs.Write(f, 2 * i * 4096, block.data(), 4096).ok());
    ASSERT_TRUE(fs.Fsync(f).ok());
    ASSERT_TRUE(fs.OpenInode(f).ok());
    ASSERT_TRUE(fs.Unlink(posix::kRootIno, "big", 3).ok());
    cut.armed = true;
    ASSERT_TRUE(fs.Release(f).ok());  // the free: its batches, then the inode
    cut.armed = false;
    ASSERT_TRUE(fs.Unmount().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  ASSERT_GE(cut.images.size(), 3u);
  u32 orphans = 0;
  for (usize i = 0; i < cut.images.size(); i++) {
    Fixture at(&cut.images[i]);
    auto [r, out] = at.Fsck();
    EXPECT_EQ(r.exit_code, kExitClean) << "a cut at commit " << i << " of the free:\n" << out;
    if (out.find("is an orphan") != std::string::npos) orphans++;
  }
  EXPECT_GE(orphans, 2u);  // cuts between the batches, not only before or after the free
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

// --- repairs ---------------------------------------------------------------------

std::string Contents(Filesystem& fs, u64 ino) {
  auto a = fs.GetAttr(ino);
  EXPECT_TRUE(a.ok());
  if (!a.ok()) return "";
  std::string b(a.value().size, '?');
  auto r = fs.Read(ino, 0, b.data(), u32(b.size()));
  EXPECT_TRUE(r.ok()) << r.status().Message();
  if (!r.ok()) return "";
  b.resize(r.value());
  return b;
}

std::string LinkTarget(Filesystem& fs, u64 ino) {
  std::string b(4096, '\0');
  auto r = fs.ReadLink(ino, b.data(), u32(b.size()));
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return "";
  b.resize(r.value());
  return b;
}

u64 LookupIno(Filesystem& fs, u64 dir, const std::string& name) {
  auto a = fs.Lookup(dir, name.data(), u32(name.size()));
  EXPECT_TRUE(a.ok()) << name << ": " << a.status().Message();
  return a.ok() ? a.value().ino : 0;
}

// What the fixture's namespace holds when nothing was lost.
void ExpectFixtureFile(Filesystem& fs, const Fixture& f) {
  EXPECT_EQ(Contents(fs, f.file), FileBytes());
  char v[8];
  auto x = fs.GetXattr(f.file, "user.x", 6, v, sizeof(v));
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(std::string(v, x.value()), "v");
  std::string big(posix::kXattrSizeMax, '\0');
  auto b = fs.GetXattr(f.file, "user.big", 8, big.data(), u32(big.size()));
  ASSERT_TRUE(b.ok()) << b.status().Message();
  EXPECT_TRUE(big.substr(0, b.value()) == BigXattr());
  EXPECT_EQ(fs.GetAttr(f.file).value().nlink, 2u);
  EXPECT_EQ(fs.GetAttr(f.file).value().sectors, 24u);
}
void ExpectFixtureIntact(Filesystem& fs, const Fixture& f) {
  EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard", "sym"}));
  EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
  EXPECT_EQ(LookupIno(fs, posix::kRootIno, "hard"), f.file);
  EXPECT_EQ(LookupIno(fs, f.dir, "sub"), f.sub);
  EXPECT_EQ(LookupIno(fs, f.sub, ".."), f.dir);
  EXPECT_EQ(LookupIno(fs, f.dir, ".."), posix::kRootIno);
  EXPECT_EQ(fs.GetAttr(f.dir).value().nlink, 3u);
  EXPECT_EQ(fs.GetAttr(posix::kRootIno).value().nlink, 3u);
  EXPECT_EQ(LinkTarget(fs, f.link), kLinkTarget);
  ExpectFixtureFile(fs, f);
}

// /lost+found: a directory of root's, mode 0700; returns its inode.
u64 LostFound(Filesystem& fs) {
  auto a = fs.Lookup(posix::kRootIno, "lost+found", 10);
  EXPECT_TRUE(a.ok());
  if (!a.ok()) return 0;
  EXPECT_EQ(a.value().mode, posix::kModeDir | 0700);
  EXPECT_EQ(a.value().uid, 0u);
  return a.value().ino;
}

std::string Hash(u64 ino) { return "#" + std::to_string(ino); }

struct RepairCase {
  const char* what;
  std::function<void(Fixture&)> damage;
  const char* found;     // in the check's output
  const char* repaired;  // in the repair run's output
  std::function<void(Fixture&, Filesystem&)> verify;  // mounted after the repair
};

// Damage, check (reports, writes nothing), repair (exit 1, every error
// repaired), check again (clean), mount and verify, and a last check after the
// mount (clean).
void RunRepairCase(const RepairCase& c) {
  SCOPED_TRACE(c.what);
  Fixture fx;
  c.damage(fx);
  const fixture::Repair fix = fixture::ExpectReportedRepairedClean(fx, c.found, c.repaired);
  EXPECT_EQ(fix.checked.repaired, 0u);
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) { c.verify(fx, fs); });
  auto [r4, out4] = fx.Fsck();
  EXPECT_EQ(r4.exit_code, kExitClean) << out4;
}

TEST(FsckRepairTest, EachDamageIsRepaired) {
  const RepairCase cases[] = {
      {"wrong nlink",
       [](Fixture& f) { f.SetInode(f.file, [](posix::InodeFormat& i) { i.nlink.set(5); }); },
       "wrong link count of inode", "set the link count of inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"entry to nothing",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 0}, nullptr, 0); },
       "entry names a missing inode", "removed entry 'sym'",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard"}));
         EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
         ExpectFixtureFile(fs, f);
       }},
      {"unreachable inode",
       [](Fixture& f) {
         posix::InodeFormat i = f.Inode(f.file);
         f.Poke(btree::Pos{btree::kBtreeInodes, 9999, 0}, &i, sizeof(i));
       },
       "unreachable inode 9999", "reattached inode 9999 as /lost+found/#9999",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard", "sym", "lost+found"}));
         const u64 lf = LostFound(fs);
         EXPECT_EQ(Fixture::Names(fs, lf), (std::set<std::string>{"#9999"}));
         EXPECT_EQ(LookupIno(fs, lf, "#9999"), 9999u);
         EXPECT_EQ(fs.GetAttr(9999).value().nlink, 1u);
         EXPECT_EQ(fs.GetAttr(9999).value().sectors, 0u);  // a copied inode: no extents of its own
         EXPECT_EQ(Contents(fs, 9999), std::string(3 * 4096, '\0'));
         EXPECT_EQ(fs.GetAttr(posix::kRootIno).value().nlink, 4u);
         ExpectFixtureFile(fs, f);
       }},
      {"directory link count",
       [](Fixture& f) { f.SetInode(f.dir, [](posix::InodeFormat& i) { i.nlink.set(2); }); },
       "wrong link count of directory", "set the link count of directory",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"wrong parent",
       [](Fixture& f) { f.SetInode(f.sub, [](posix::InodeFormat& i) { i.parent.set(posix::kRootIno); }); },
       "wrong parent of directory", "set the parent of directory",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"corrupt inode",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, f.file, 0}, "junk", 4); },
       "corrupt record of inode", "deleted the record of inode",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "sym"}));
         std::set<std::string> names = f.DirNames();
         names.erase("f1");
         EXPECT_EQ(Fixture::Names(fs, f.dir), names);
         EXPECT_FALSE(fs.GetAttr(f.file).ok());
         EXPECT_EQ(LinkTarget(fs, f.link), kLinkTarget);
       }},
      {"tombstone ending a chain",
       [](Fixture& f) {
         posix::DirentFormat t{};
         t.type = posix::kDtTombstone;
         f.Poke(btree::Pos{btree::kBtreeDirents, f.dir, posix::kSlotEnd - 1}, &t, sizeof(t));
       },
       "a tombstone ends a chain", "deleted the tombstones ending the chain",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"truncated symlink",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 2}, nullptr, 0); },
       "incomplete symlink target", "deleted symlink",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard"}));
         EXPECT_FALSE(fs.GetAttr(f.link).ok());
         ExpectFixtureFile(fs, f);
       }},
      {"file turned symlink",  // (one bit of its mode): no target at all
       [](Fixture& f) {
         f.SetInode(f.in_dir.at("f2"), [](posix::InodeFormat& i) { i.mode.set(posix::kModeLink | 0644); });
       },
       "bad symlink target of inode", "deleted symlink",
       [](Fixture& f, Filesystem& fs) {
         std::set<std::string> names = f.DirNames();
         names.erase("f2");
         EXPECT_EQ(Fixture::Names(fs, f.dir), names);
         EXPECT_EQ(LinkTarget(fs, f.link), kLinkTarget);
       }},
      {"the newest inode deleted, then one reattached",  // lost+found's number is above both
       [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 2}, nullptr, 0);  // the symlink: the last inode made
         f.Poke(btree::Pos{btree::kBtreeDirents, f.dir, f.Slot(f.dir, "f2")}, nullptr, 0);
       },
       "incomplete symlink target", "reattached inode",
       [](Fixture& f, Filesystem& fs) {
         const u64 lf = LostFound(fs);
         EXPECT_GT(lf, f.link);
         EXPECT_EQ(LookupIno(fs, lf, Hash(f.in_dir.at("f2"))), f.in_dir.at("f2"));
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard", "lost+found"}));
       }},
      {"symlink chunks of the wrong lengths",  // (their sum is right)
       [](Fixture& f) {
         const std::string a(952, 't'), b(2048, 't');
         f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 1}, a.data(), u32(a.size()));
         f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 2}, b.data(), u32(b.size()));
       },
       "bad symlink target of inode", "deleted symlink",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard"}));
         ExpectFixtureFile(fs, f);
       }},
      {"wrong sector count",
       [](Fixture& f) { f.SetInode(f.file, [](posix::InodeFormat& i) { i.sectors.set(8); }); },
       "wrong sector count of inode", "set the sector count of inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"stale extent pointer",
       [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         v = Edited(v, [](data::Extent& e) { e.ptrs[0].gen ^= 1; });
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 1}, v.data(), u32(v.size()));
       },
       "stale extent pointer", "(data lost)",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Contents(fs, f.file), FileBytesWithout(0));  // block 0 is a hole now
         EXPECT_EQ(fs.GetAttr(f.file).value().sectors, 16u);
       }},
      {"overlapping extents",
       [](Fixture& f) {
         // (ino, 3) becomes blocks [1, 3) of the first blob (two 'd' blocks; the
         // overwrite "xyz" went elsewhere): it overlaps (ino, 2), the overwrite.
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 3});
         v = ExtentValue(v, 2, 1, {Crc(v, 0), Crc(v, 0)});
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 3}, v.data(), u32(v.size()));
       },
       "overlapping extents", "kept blocks [1, 3) of the extent ending last, dropped 1",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Contents(fs, f.file), std::string(3 * 4096, 'd'));  // the later key wins: "xyz" is lost
         EXPECT_EQ(fs.GetAttr(f.file).value().sectors, 24u);
       }},
      {"extent of a directory",
       [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         f.Poke(btree::Pos{btree::kBtreeExtents, f.dir, 1}, v.data(), u32(v.size()));
       },
       "extent of a missing or non-regular inode", "deleted the extent of inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"extent of a missing inode",
       [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         f.Poke(btree::Pos{btree::kBtreeExtents, 8888, 1}, v.data(), u32(v.size()));
       },
       "extent of a missing or non-regular inode 8888", "deleted the extent of inode 8888",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"extent outside the buckets",
       [](Fixture& f) {
         std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
         v = Edited(v, [](data::Extent& e) { e.ptrs[0].offset = 1ull << 40; });
         f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 1}, v.data(), u32(v.size()));
       },
       "extent points outside the buckets", "points outside the buckets (data lost)",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Contents(fs, f.file), FileBytesWithout(0));
         EXPECT_EQ(fs.GetAttr(f.file).value().sectors, 16u);
       }},
      {"corrupt extent",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 2}, "junk", 4); },
       "corrupt extent", "deleted extent key",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Contents(fs, f.file), FileBytesWithout(1));
         EXPECT_EQ(fs.GetAttr(f.file).value().sectors, 16u);
       }},
      {"data past the size",
       [](Fixture& f) { f.SetInode(f.file, [](posix::InodeFormat& i) { i.size.set(100); }); },
       "has data past its size", "set the size of inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"ownerless xattr",
       [](Fixture& f) {
         u8 v[16 + 6 + 1] = {};
         v[8] = posix::kXattrValue;
         v[9] = 6;
         v[10] = 1;
         memcpy(v + 16, "user.y", 6);
         f.Poke(btree::Pos{btree::kBtreeXattrs, 7777, 100}, v, sizeof(v));
       },
       "bad or ownerless xattr key", "removed xattr key (7777, 100): no such inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"corrupt xattr",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeXattrs, f.file, 200}, "junk", 4); },
       "bad or ownerless xattr key", "removed xattr key",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"wrong entry type",
       [](Fixture& f) {
         const btree::Pos at{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "hard")};
         std::vector<u8> v = f.Value(at);
         v[8] = posix::kDtLink;
         f.Poke(at, v.data(), u32(v.size()));
       },
       "entry type differs", "set the type of entry 'hard'",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"unreachable entry",
       [](Fixture& f) {
         // 'sym' leaves its chain (the root hashes names into slots 16 and 17).
         const btree::Pos at{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "sym")};
         std::vector<u8> v = f.Value(at);
         f.Poke(at, nullptr, 0);
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, 100}, v.data(), u32(v.size()));
       },
       "unreachable entry in directory 1: 'sym' at slot 100", "moved entry 'sym' in directory 1 from slot 100",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"unreachable entry of the wrong type",
       [](Fixture& f) {
         const btree::Pos at{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "sym")};
         std::vector<u8> v = f.Value(at);
         v[8] = posix::kDtReg;
         f.Poke(at, nullptr, 0);
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, 100}, v.data(), u32(v.size()));
       },
       "entry type differs from its inode's, in directory 1: 'sym'", "(type set to its inode's)",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"corrupt entry",
       [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "sym")}, "junk", 4);
       },
       "corrupt entry in directory 1", "reattached inode",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"dir", "hard", "lost+found"}));
         const u64 lf = LostFound(fs);
         EXPECT_EQ(LookupIno(fs, lf, Hash(f.link)), f.link);
         EXPECT_EQ(LinkTarget(fs, f.link), kLinkTarget);
         ExpectFixtureFile(fs, f);
       }},
      {"unreachable directory",
       [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "dir")}, nullptr, 0);
       },
       "unreachable directory", "as /lost+found/#",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"hard", "sym", "lost+found"}));
         const u64 lf = LostFound(fs);
         EXPECT_EQ(Fixture::Names(fs, lf), (std::set<std::string>{Hash(f.dir)}));
         EXPECT_EQ(LookupIno(fs, lf, Hash(f.dir)), f.dir);
         EXPECT_EQ(LookupIno(fs, f.dir, ".."), lf);  // the whole subtree came along
         EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
         EXPECT_EQ(LookupIno(fs, f.sub, ".."), f.dir);
         EXPECT_EQ(fs.GetAttr(lf).value().nlink, 3u);
         EXPECT_EQ(fs.GetAttr(posix::kRootIno).value().nlink, 3u);
         ExpectFixtureFile(fs, f);
       }},
      {"orphan that entries name",
       [](Fixture& f) {
         f.SetInode(f.file, [](posix::InodeFormat& i) { i.nlink.set(0); });
         const u64 ino = f.file;
         f.Poke(btree::Pos{btree::kBtreeInodes, 0, f.file}, &ino, 8);
       },
       "is an orphan (unlinked) but entries name it", "is linked again",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},  // (a mount would have freed it)
      {"orphan key of a linked inode",
       [](Fixture& f) {
         const u64 ino = f.file;
         f.Poke(btree::Pos{btree::kBtreeInodes, 0, f.file}, &ino, 8);
       },
       "orphan key for a linked or missing inode", "deleted orphan key",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"bad orphan key",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, 0, 5555}, "junk", 4); },
       "bad orphan key", "deleted orphan key 5555",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"stray key",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, f.file, 1}, "junk", 4); },
       "stray key in the inodes btree", "deleted key",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"key at inode number 2^64-1",  // (a target's chunk: the mount refuses any key past 2^56)
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, ~u64(0), 1}, "abcd", 4); },
       "key (18446744073709551615, 1) of the inodes btree: inode numbers stay below 2^56",
       "deleted key (18446744073709551615, 1)", [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"orphan key past the limit",
       [](Fixture& f) {
         const u64 ino = btree::kInoLimit;
         f.Poke(btree::Pos{btree::kBtreeInodes, 0, btree::kInoLimit}, &ino, 8);
       },
       "bad orphan key", "deleted orphan key 72057594037927936",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"keys past 2^56 while a directory needs /lost+found",  // (its number: below the limit, after the rest)
       [](Fixture& f) {
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "dir")}, nullptr, 0);
         f.Poke(btree::Pos{btree::kBtreeXattrs, btree::kInoLimit, 5}, "junk", 4);
         f.Poke(btree::Pos{btree::kBtreeExtents, btree::kInoLimit + 7, 9}, "junk", 4);
         f.Poke(btree::Pos{btree::kBtreeDirents, ~u64(0), 5}, "junk", 4);
       },
       "unreachable directory", "as /lost+found/#",
       [](Fixture& f, Filesystem& fs) {
         const u64 lf = LostFound(fs);
         EXPECT_GT(lf, f.sub);
         EXPECT_LT(lf, btree::kInoLimit);
         EXPECT_EQ(LookupIno(fs, lf, Hash(f.dir)), f.dir);
         EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
         ExpectFixtureFile(fs, f);
       }},
      {"inode record at number 2^56 named by an entry",
       [](Fixture& f) {
         const posix::InodeFormat rec = f.Inode(f.file);  // (a valid record, a file's)
         f.PutEntry(posix::kRootIno, "last", btree::kInoLimit, posix::kDtReg);
         f.Poke(btree::Pos{btree::kBtreeInodes, btree::kInoLimit, 0}, &rec, sizeof(rec));
       },
       "key (72057594037927936, 0) of the inodes btree", "(an inode record: its names, data and xattrs follow)",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"duplicate name",
       [](Fixture& f) { f.PutEntry(posix::kRootIno, "sym", f.in_dir.at("f2"), posix::kDtReg); },
       "duplicate name in directory 1: 'sym'", "removed entry 'sym'",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);
         EXPECT_EQ(fs.GetAttr(f.in_dir.at("f2")).value().nlink, 1u);
       }},
      {"directory with two names",
       [](Fixture& f) { f.PutEntry(posix::kRootIno, "sub2", f.sub, posix::kDtDir); },
       "directory with two names", "removed entry 'sub2'",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},  // the name its parent agrees with stays
      {"root with a name",
       [](Fixture& f) { f.PutEntry(f.sub, "up", posix::kRootIno, posix::kDtDir); },
       "the root directory has a name", "the root directory has no name",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);
         EXPECT_EQ(fs.GetAttr(f.sub).value().nlink, 2u);
       }},
      {"directory loop",
       [](Fixture& f) {
         // dir leaves the root and moves into its own subdirectory: dir -> sub -> dir.
         f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "dir")}, nullptr, 0);
         f.PutEntry(f.sub, "loop", f.dir, posix::kDtDir);
         f.SetInode(f.dir, [&](posix::InodeFormat& i) { i.parent.set(f.sub); });
         f.SetInode(f.sub, [](posix::InodeFormat& i) { i.nlink.set(3); });
       },
       "is in a loop of directories that the root does not reach", "removed the entry naming directory",
       [](Fixture& f, Filesystem& fs) {
         const u64 lf = LostFound(fs);
         EXPECT_EQ(LookupIno(fs, lf, Hash(f.dir)), f.dir);
         EXPECT_EQ(LookupIno(fs, f.dir, ".."), lf);
         EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
         EXPECT_EQ(Fixture::Names(fs, f.sub), std::set<std::string>{});
         EXPECT_EQ(fs.GetAttr(f.sub).value().nlink, 2u);
         ExpectFixtureFile(fs, f);
       }},
      {"missing root",
       [](Fixture& f) {
         f.WithFs([](Filesystem& fs, btree::Btrees&) {
           ASSERT_TRUE(fs.SetXattr(posix::kRootIno, "user.r", 6, "r", 1, 0, Filesystem::kFrontEndChecked).ok());
         });
         f.Poke(btree::Pos{btree::kBtreeInodes, posix::kRootIno, 0}, nullptr, 0);
       },
       "no root directory", "made a new, empty root directory (inode 1); its old xattrs deleted",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);  // its entries found their slots under the new hash seed
         EXPECT_EQ(fs.GetAttr(posix::kRootIno).value().mode, posix::kModeDir | 0755);
         EXPECT_EQ(fs.ListXattr(posix::kRootIno, nullptr, 0).value(), 0u);
       }},
      {"entries of a missing directory",
       [](Fixture& f) { f.Poke(btree::Pos{btree::kBtreeInodes, f.dir, 0}, nullptr, 0); },
       "entries of a missing or non-directory inode", "deleted the",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"hard", "sym", "lost+found"}));
         const u64 lf = LostFound(fs);
         // Every inode dir named but f1 (also /hard) is in lost+found now.
         std::set<std::string> want;
         for (const auto& [name, ino] : f.in_dir)
           if (name != "f1") want.insert(Hash(ino));
         EXPECT_EQ(Fixture::Names(fs, lf), want);
         EXPECT_EQ(LookupIno(fs, f.sub, ".."), lf);
         EXPECT_EQ(fs.GetAttr(lf).value().nlink, 3u);
         EXPECT_EQ(fs.GetAttr(f.in_dir.at("f2")).value().nlink, 1u);
         EXPECT_EQ(Contents(fs, f.file), FileBytes());
         EXPECT_EQ(fs.GetAttr(f.file).value().nlink, 1u);
       }},
  };
  for (const RepairCase& c : cases) RunRepairCase(c);
}

// Overlaps in both shapes: an earlier extent wholly inside a later one (deleted)
// and one reaching into the next (trimmed to the blocks before it).
TEST(FsckRepairTest, OverlapsKeepTheLaterExtentAndTrimTheEarlier) {
  Fixture fx;
  u64 a = 0, g = 0;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    const Caller who{0, 0};
    a = fs.Mknod(posix::kRootIno, "a", 1, posix::kModeReg | 0644, 0, who).value().ino;
    g = fs.Mknod(posix::kRootIno, "g", 1, posix::kModeReg | 0644, 0, who).value().ino;
    const std::string ab = std::string(4096, 'a') + std::string(4096, 'b');
    const std::string cd = std::string(4096, 'c') + std::string(4096, 'd');
    const std::string xyz = std::string(4096, 'x') + std::string(4096, 'y') + std::string(4096, 'z');
    ASSERT_TRUE(fs.Write(a, 0, ab.data(), u32(ab.size())).ok());     // (a, 2): [0, 2)
    ASSERT_TRUE(fs.Write(a, 8192, cd.data(), u32(cd.size())).ok());  // (a, 4): [2, 4)
    ASSERT_TRUE(fs.Write(g, 0, xyz.data(), u32(xyz.size())).ok());   // (g, 3): [0, 3)
  });
  // (a, 3): g's blob, blocks [0, 3): over all of (a, 2) and the first block of (a, 4).
  std::vector<u8> v = fx.Value(btree::Pos{btree::kBtreeExtents, g, 3});
  fx.Poke(btree::Pos{btree::kBtreeExtents, a, 3}, v.data(), u32(v.size()));
  const fixture::Repair fix = fixture::ExpectReportedRepairedClean(
      fx, nullptr, "kept blocks [0, 3) of the extent ending last, dropped 2 ");
  EXPECT_NE(fix.repair.find("kept blocks [2, 4) of the extent ending last, dropped 1 "), std::string::npos)
      << fix.repair;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    // (a, 3) won over (a, 2); (a, 4) won over the last block of (a, 3), which
    // keeps its first two blocks as (a, 2).
    EXPECT_EQ(Contents(fs, a), std::string(4096, 'x') + std::string(4096, 'y') + std::string(4096, 'c') +
                                   std::string(4096, 'd'));
    EXPECT_EQ(fs.GetAttr(a).value().sectors, 32u);
    EXPECT_EQ(Contents(fs, g), std::string(4096, 'x') + std::string(4096, 'y') + std::string(4096, 'z'));
    ExpectFixtureFile(fs, fx);
  });
  EXPECT_FALSE(fx.Value(btree::Pos{btree::kBtreeExtents, a, 2}).empty());
  EXPECT_TRUE(fx.Value(btree::Pos{btree::kBtreeExtents, a, 3}, true).empty());
}

// The pieces earlier extents keep are what an overwrite leaves, whatever their
// kind: a compressed extent keeps pointing into its whole blob, an unwritten
// one becomes a shorter reservation.
TEST(FsckRepairTest, OverlapsTrimCompressedAndUnwrittenExtents) {
  Fixture fx;
  u64 z = 0, u = 0, w = 0;
  std::string zdata;
  for (int i = 0; i < 16; i++) zdata += std::string(4096, char('a' + i));
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    const Caller who{0, 0};
    z = fs.Mknod(posix::kRootIno, "z", 1, posix::kModeReg | 0644, 0, who).value().ino;
    u = fs.Mknod(posix::kRootIno, "u", 1, posix::kModeReg | 0644, 0, who).value().ino;
    w = fs.Mknod(posix::kRootIno, "w", 1, posix::kModeReg | 0644, 0, who).value().ino;
    ASSERT_TRUE(fs.SetFlags(z, Filesystem::kFsComprFl).ok());
    ASSERT_TRUE(fs.Write(z, 0, zdata.data(), u32(zdata.size())).ok());  // (z, 16): one compressed blob
    ASSERT_TRUE(fs.Fallocate(u, 0, 0, 8 * 4096).ok());                  // (u, 8): unwritten
    const std::string wdata(4 * 4096, 'w');
    ASSERT_TRUE(fs.Write(w, 0, wdata.data(), u32(wdata.size())).ok());  // (w, 4)
  });
  const std::vector<u8> zv = fx.Value(btree::Pos{btree::kBtreeExtents, z, 16});
  ASSERT_TRUE(Compressed(zv));
  ASSERT_EQ(fx.Value(btree::Pos{btree::kBtreeExtents, u, 8})[1], data::kExtentUnwritten);
  // (z, 20): unwritten [8, 20) over the blob's second half; (u, 10): w's
  // blocks at [6, 10), over the reservation's end.
  u8 unwritten[data::kExtentValueMax];
  fx.Poke(btree::Pos{btree::kBtreeExtents, z, 20}, unwritten, data::BuildUnwritten(12, unwritten));
  const std::vector<u8> wv = fx.Value(btree::Pos{btree::kBtreeExtents, w, 4});
  fx.Poke(btree::Pos{btree::kBtreeExtents, u, 10}, wv.data(), u32(wv.size()));
  const fixture::Repair fix = fixture::ExpectReportedRepairedClean(
      fx, nullptr, "kept blocks [8, 20) of the extent ending last, dropped 8 ");
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  EXPECT_NE(fix.repair.find("kept blocks [6, 10) of the extent ending last, dropped 2 "), std::string::npos)
      << fix.repair;
  EXPECT_NE(fix.repair.find("set the size of inode " + std::to_string(u) + " to 40960"), std::string::npos)
      << fix.repair;
  std::vector<u8> piece = fx.Value(btree::Pos{btree::kBtreeExtents, z, 8});
  EXPECT_TRUE(Compressed(piece));
  EXPECT_EQ(piece.size(), zv.size());  // the same blob and crc, 8 blocks of it
  EXPECT_EQ(fx.Value(btree::Pos{btree::kBtreeExtents, u, 6})[1], data::kExtentUnwritten);
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    EXPECT_EQ(Contents(fs, z), zdata.substr(0, 8 * 4096) + std::string(8 * 4096, '\0'));
    EXPECT_EQ(Contents(fs, u), std::string(6 * 4096, '\0') + std::string(4 * 4096, 'w'));
    EXPECT_EQ(fs.GetAttr(z).value().sectors, 20u * 8);  // reservations count, as the data path counts them
    EXPECT_EQ(fs.GetAttr(u).value().sectors, 10u * 8);
    ExpectFixtureFile(fs, fx);
  });
}

// Random damage -- keys lost, bits flipped, values cut short, keys copied to a
// neighbouring position or over another key -- in every tree of the namespace: one repair run leaves a
// filesystem that checks clean and mounts, and every name in it can be looked
// up and every inode read (symlinks) or stat'ed. FSCK_SEED0, FSCK_SEEDS and
// FSCK_PER (damages per run) in the environment make longer runs.
TEST(FsckRepairTest, RandomDamageIsRepairedInOneRun) {
  const u32 seeds = getenv("FSCK_SEEDS") ? u32(atoi(getenv("FSCK_SEEDS"))) : 30;
  const int per = getenv("FSCK_PER") ? atoi(getenv("FSCK_PER")) : 6;
  const u32 seed0 = getenv("FSCK_SEED0") ? u32(atoi(getenv("FSCK_SEED0"))) : 1;
  for (u32 seed = seed0; seed < seed0 + seeds; seed++) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Fixture fx;
    std::mt19937_64 rng(seed);
    fx.WithFs([&](Filesystem& fs, btree::Btrees&) {  // deeper trees, a link across them
      const Caller who{0, 0};
      const u64 a = fs.Mkdir(fx.sub, "a", 1, 0755, who).value().ino;
      const u64 b = fs.Mkdir(a, "b", 1, 0755, who).value().ino;
      const u64 c = fs.Mkdir(fx.dir, "c", 1, 0755, who).value().ino;
      for (u64 d : {a, b, c})
        for (int i = 0; i < 4; i++) {
          const std::string n = "g" + std::to_string(i);
          const u64 ino = fs.Mknod(d, n.data(), u32(n.size()), posix::kModeReg | 0644, 0, who).value().ino;
          ASSERT_TRUE(fs.Write(ino, 4096 * u64(i), n.data(), u32(n.size())).ok());
        }
      ASSERT_TRUE(fs.Link(fx.file, b, "h", 1).ok());
      // A compressed file and reserved (unwritten) space, inside and past a size.
      const u64 z = fs.Mknod(c, "z", 1, posix::kModeReg | 0644, 0, who).value().ino;
      ASSERT_TRUE(fs.SetFlags(z, Filesystem::kFsComprFl).ok());
      const std::string zdata(12 * 4096, 'z');
      ASSERT_TRUE(fs.Write(z, 0, zdata.data(), u32(zdata.size())).ok());
      ASSERT_TRUE(fs.Fallocate(z, posix::kFallocKeepSize, 12 * 4096, 4 * 4096).ok());
      const u64 r = fs.Mknod(a, "r", 1, posix::kModeReg | 0644, 0, who).value().ino;
      ASSERT_TRUE(fs.Fallocate(r, 0, 0, 6 * 4096).ok());
    }, 2);
    std::vector<std::pair<btree::Pos, std::vector<u8>>> keys;
    fx.WithFs([&](Filesystem&, btree::Btrees& t) {
      for (u8 id : {btree::kBtreeInodes, btree::kBtreeDirents, btree::kBtreeExtents, btree::kBtreeXattrs}) {
        btree::Iterator it(&t, id);
        ASSERT_TRUE(it.SeekToFirst().ok());
        for (; it.Valid();) {
          keys.emplace_back(it.pos(), std::vector<u8>(it.value(), it.value() + it.val_bytes()));
          ASSERT_TRUE(it.Next().ok());
        }
      }
    });
    std::string done;
    for (int i = 0; i < per; i++) {
      const auto& [pos, value] = keys[rng() % keys.size()];
      std::vector<u8> v = value;
      btree::Pos at = pos;
      switch (rng() % 5) {
        case 0:
          fx.Poke(at, nullptr, 0);
          done += "deleted";
          break;
        case 1:
          v[rng() % v.size()] ^= u8(1u << (rng() % 8));
          fx.Poke(at, v.data(), u32(v.size()));
          done += "flipped a bit of";
          break;
        case 2:
          at.offset += 1 + rng() % 3;
          fx.Poke(at, v.data(), u32(v.size()));
          done += "copied";
          break;
        case 3:
          v.resize(rng() % v.size());
          fx.Poke(at, v.data(), u32(v.size()));
          done += "cut short";
          break;
        default: {  // another key's value here
          const std::vector<u8>& w = keys[rng() % keys.size()].second;
          fx.Poke(at, w.data(), u32(w.size()));
          done += "overwrote";
          break;
        }
      }
      done += " (" + std::to_string(pos.btree_id) + ", " + std::to_string(pos.inode) + ", " +
              std::to_string(pos.offset) + "); ";
    }
    SCOPED_TRACE(done);
    const std::vector<u8> before = fx.Bytes();
    auto [r1, out1] = fx.Fsck();
    EXPECT_TRUE(fx.Bytes() == before) << "the check wrote to the device";
    auto [r2, out2] = fx.Fsck(true);
    EXPECT_TRUE(r2.exit_code == kExitRepaired || r2.exit_code == kExitClean) << out2;
    EXPECT_EQ(r2.repaired, r2.errors) << out2;
    auto [r3, out3] = fx.Fsck();
    EXPECT_EQ(r3.exit_code, kExitClean) << out2 << out3;
    fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
      std::vector<u64> dirs = {posix::kRootIno};
      std::set<u64> seen;
      while (!dirs.empty()) {
        const u64 d = dirs.back();
        dirs.pop_back();
        if (!seen.insert(d).second) {
          ADD_FAILURE() << "directory " << d << " reached twice";
          continue;
        }
        for (const std::string& n : Fixture::Names(fs, d)) {
          auto a = fs.Lookup(d, n.data(), u32(n.size()));
          ASSERT_TRUE(a.ok()) << d << "/" << n << ": " << a.status().Message();
          const u32 type = a.value().mode & posix::kModeTypeMask;
          if (type == posix::kModeDir) {
            EXPECT_EQ(LookupIno(fs, a.value().ino, ".."), d);
            dirs.push_back(a.value().ino);
          } else if (type == posix::kModeLink) {
            char buf[4096];
            EXPECT_TRUE(fs.ReadLink(a.value().ino, buf, sizeof(buf)).ok()) << n;
          }
        }
      }
    });
    auto [r4, out4] = fx.Fsck();
    EXPECT_EQ(r4.exit_code, kExitClean) << out4;
  }
}

// Several kinds at once, with repairs that depend on each other; and a power cut
// during the repair run leaves a filesystem that the next run repairs.
TEST(FsckRepairTest, ManyDamagesAtOnceAndAPowerCutDuringTheRepair) {
  auto damage = [](Fixture& f) {
    f.SetInode(f.file, [](posix::InodeFormat& i) { i.nlink.set(7); });
    f.SetInode(f.sub, [](posix::InodeFormat& i) { i.parent.set(9); });
    f.Poke(btree::Pos{btree::kBtreeDirents, posix::kRootIno, f.Slot(posix::kRootIno, "dir")}, nullptr, 0);
    f.Poke(btree::Pos{btree::kBtreeInodes, f.link, 2}, nullptr, 0);
    posix::InodeFormat i = f.Inode(f.in_dir.at("f2"));
    f.Poke(btree::Pos{btree::kBtreeInodes, 9999, 0}, &i, sizeof(i));
    std::vector<u8> v = f.Value(btree::Pos{btree::kBtreeExtents, f.file, 1});
    v[16 + 1] ^= 1;
    f.Poke(btree::Pos{btree::kBtreeExtents, f.file, 1}, v.data(), u32(v.size()));
    posix::DirentFormat t{};
    t.type = posix::kDtTombstone;
    f.Poke(btree::Pos{btree::kBtreeDirents, f.dir, 5000}, &t, sizeof(t));
  };
  auto verify = [](Fixture& f, Filesystem& fs) {
    EXPECT_EQ(Fixture::Names(fs, posix::kRootIno), (std::set<std::string>{"hard", "lost+found"}));
    const u64 lf = LostFound(fs);
    EXPECT_EQ(Fixture::Names(fs, lf), (std::set<std::string>{Hash(f.dir), "#9999"}));
    EXPECT_EQ(Fixture::Names(fs, f.dir), f.DirNames());
    EXPECT_EQ(LookupIno(fs, f.sub, ".."), f.dir);
    EXPECT_EQ(Contents(fs, f.file), FileBytesWithout(0));
    EXPECT_EQ(fs.GetAttr(f.file).value().nlink, 2u);
    EXPECT_EQ(fs.GetAttr(9999).value().nlink, 1u);
  };
  Fixture fx;
  damage(fx);
  std::vector<std::vector<u8>> cuts;  // the device at a few points of the repair run
  u32 lines = 0;
  auto [r2, out2] = fx.Fsck(true, [&](const std::string& line) {
    if (line.rfind("namespace: ", 0) != 0 && line.rfind("data: ", 0) != 0) return;
    if (++lines != 3 && lines != 9 && lines != 16) return;
    // Repairs commit without a flush; the journal makes them durable within a
    // second (flush_delay). A power cut then keeps the repairs made so far.
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    cuts.push_back(fx.Bytes());
  });
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_EQ(r2.repaired, r2.errors) << out2;
  auto [r3, out3] = fx.Fsck();
  EXPECT_EQ(r3.exit_code, kExitClean) << out2 << out3;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) { verify(fx, fs); });
  EXPECT_FALSE(cuts.empty());
  for (const std::vector<u8>& image : cuts) {
    Fixture cut(&image);
    cut.dir = fx.dir;
    cut.file = fx.file;
    cut.link = fx.link;
    cut.sub = fx.sub;
    cut.in_dir = fx.in_dir;
    auto [c1, o1] = cut.Fsck(true);
    EXPECT_NE(c1.exit_code, kExitUncorrected) << o1;
    EXPECT_NE(c1.exit_code, kExitOperational) << o1;
    auto [c2, o2] = cut.Fsck();
    EXPECT_EQ(c2.exit_code, kExitClean) << o1 << o2;
    cut.WithFs([&](Filesystem& fs, btree::Btrees&) { verify(cut, fs); });
  }
}

}  // namespace
}  // namespace tfs::fsck

namespace tfs::fsck {
namespace {

// A damaged leaf of each posix tree (here each tree is one leaf, its root,
// written once: no older copy): fsck -n reports it and still checks the rest;
// fsck -y drops it and repairs what depended on it (recreating the inodes
// whose records were lost); the next check is clean and the
// filesystem mounts with the root directory readable.
TEST(FsckRepairTest, ADamagedLeafOfEachTreeIsRepaired) {
  for (u8 id : {btree::kBtreeInodes, btree::kBtreeDirents, btree::kBtreeExtents, btree::kBtreeXattrs}) {
    SCOPED_TRACE("btree " + std::to_string(id));
    Fixture f;
    const u64 root_offset = fixture::DamageRoot(f.dev.get(), id);
    ASSERT_NE(root_offset, 0u);
    const std::string dropped =
        "dropped the damaged level-0 node at member ssd.a offset " + std::to_string(root_offset);
    const fixture::Repair fix =
        fixture::ExpectReportedRepairedClean(f, "would drop the damaged level-0 node", dropped.c_str());
    EXPECT_NE(fix.report.find("namespace:"), std::string::npos) << "the namespace pass ran: " << fix.report;
    const std::string& out2 = fix.repair;
    f.WithFs([&](Filesystem& fs, btree::Btrees&) {
      const std::set<std::string> root = Fixture::Names(fs, posix::kRootIno);
      if (id != btree::kBtreeInodes) return;
      // The lost records are recreated from what survives of their inodes: the
      // file (its extents) and dir (its entries) keep their names and the
      // file its bytes; the empty files and the symlink are gone.
      EXPECT_TRUE(root.count("hard") == 1 && root.count("dir") == 1) << out2;
      auto a = fs.Lookup(posix::kRootIno, "hard", 4);
      ASSERT_TRUE(a.ok()) << out2;
      EXPECT_EQ(a.value().ino, f.file);
      std::string b(3 * 4096, '\0');
      auto r = fs.Read(f.file, 0, b.data(), u32(b.size()));
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r.value(), b.size());
      EXPECT_TRUE(b == FileBytes()) << "the recreated file's data";
      EXPECT_EQ(Fixture::Names(fs, f.dir).count("f1"), 1u) << out2;
    });
    if (id == btree::kBtreeInodes) {
      EXPECT_NE(out2.find("recreated inode " + std::to_string(f.file) + " as a regular file"), std::string::npos)
          << out2;
    }
  }
}

}  // namespace
}  // namespace tfs::fsck

namespace tfs::fsck {
namespace {

// The slot of xattr `name` of inode `ino` (0: none).
u64 XattrSlot(Fixture& f, u64 ino, const std::string& name) {
  u64 slot = 0;
  f.WithFs([&](Filesystem&, btree::Btrees& t) {
    btree::Iterator it(&t, btree::kBtreeXattrs);
    ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeXattrs, ino, 0}).ok());
    for (; it.Valid() && it.pos().inode == ino && it.pos().offset < posix::kSlotEnd;) {
      posix::DirentFormat de;
      const char* n;
      if (posix::ParseNamedEntry(btree::kBtreeXattrs, it.value(), it.val_bytes(), &de, &n).ok() &&
          de.type != posix::kDtTombstone && std::string(n, de.name_len) == name)
        slot = it.pos().offset;
      ASSERT_TRUE(it.Next().ok());
    }
  });
  return slot;
}

// Rewrites the chunk descriptor of f.file's chunked xattr `name` (in its
// entry: a 16-byte header, the name, the descriptor) with edit(d) applied.
void EditDescriptor(Fixture& f, const std::string& name, const std::function<void(posix::XattrChunksFormat&)>& edit) {
  const btree::Pos at{btree::kBtreeXattrs, f.file, XattrSlot(f, f.file, name)};
  std::vector<u8> v = f.Value(at);
  posix::XattrChunksFormat d;
  memcpy(&d, v.data() + 16 + name.size(), sizeof(d));
  edit(d);
  if (::testing::Test::HasFatalFailure()) return;  // (edit's ASSERTs)
  memcpy(v.data() + 16 + name.size(), &d, sizeof(d));
  f.Poke(at, v.data(), u32(v.size()));
}

// A second chunked xattr of f.file, "user.other" (3000 bytes 'o', id 1).
void AddOther(Fixture& f) {
  const std::string other(3000, 'o');
  f.WithFs([&](Filesystem& fs, btree::Btrees&) {
    ASSERT_TRUE(fs.SetXattr(f.file, "user.other", 10, other.data(), u32(other.size()), 0,
                            Filesystem::kFrontEndChecked).ok());
  });
}

// The fixture file without "user.big": "user.x" alone, the data intact.
void ExpectBigXattrGone(Fixture& f, Filesystem& fs) {
  char buf[64];
  auto l = fs.ListXattr(f.file, buf, sizeof(buf));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(std::string(buf, l.value()), std::string("user.x\0", 7));
  EXPECT_EQ(fs.GetXattr(f.file, "user.big", 8, nullptr, 0).status().code(), Err::kNoData);
  EXPECT_EQ(Contents(fs, f.file), FileBytes());
}

// Chunked xattrs: a chunk missing, of the wrong length or with changed bytes
// (the value goes with all its chunks), chunks no value claims (deleted), a
// descriptor that does not parse or shares another's id (the entry goes, its
// chunks follow as unclaimed), and more chunks than an inode may have.
TEST(FsckRepairTest, DamagedChunkedXattrsAreRepaired) {
  const RepairCase cases[] = {
      {"a chunk missing", [](Fixture& f) { f.Poke(ChunkPos(f.file, 0, 1), nullptr, 0); },
       "is damaged: chunk 1 of 3 is missing", "and its chunks (damaged)", ExpectBigXattrGone},
      {"the last chunk missing", [](Fixture& f) { f.Poke(ChunkPos(f.file, 0, 2), nullptr, 0); },
       "is damaged: chunk 2 of 3 is missing", "and its chunks (damaged)", ExpectBigXattrGone},
      {"a chunk too short", [](Fixture& f) { f.Poke(ChunkPos(f.file, 0, 0), "short", 5); },
       "is damaged: chunk 0 of 3 is of the wrong length", "and its chunks (damaged)",
       ExpectBigXattrGone},
      {"the last chunk too long",
       [](Fixture& f) {
         const std::string c(2048, 'c');
         f.Poke(ChunkPos(f.file, 0, 2), c.data(), u32(c.size()));
       },
       "is damaged: chunk 2 of 3 is of the wrong length", "and its chunks (damaged)",
       ExpectBigXattrGone},
      {"a byte of a chunk changed",
       [](Fixture& f) {
         std::vector<u8> v = f.Value(ChunkPos(f.file, 0, 1));
         v[100] ^= 4;
         f.Poke(ChunkPos(f.file, 0, 1), v.data(), u32(v.size()));
       },
       "is damaged: its 5000 bytes fail their crc", "and its chunks (damaged)", ExpectBigXattrGone},
      {"a chunk past a value's count", [](Fixture& f) { f.Poke(ChunkPos(f.file, 0, 3), "extra", 5); },
       "belongs to no value of its inode", "deleted xattr chunk",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"a chunk of no value", [](Fixture& f) { f.Poke(ChunkPos(f.file, 9, 0), "stray", 5); },
       "belongs to no value of its inode", "deleted xattr chunk",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"a chunk of a missing inode", [](Fixture& f) { f.Poke(ChunkPos(7777, 0, 0), "stray", 5); },
       "bad or ownerless xattr key (7777, 9223372036854775808)", "no such inode",
       [](Fixture& f, Filesystem& fs) { ExpectFixtureIntact(fs, f); }},
      {"a descriptor whose length fits inline",
       [](Fixture& f) { EditDescriptor(f, "user.big", [](posix::XattrChunksFormat& d) { d.value_len.set(100); }); },
       "bad or ownerless xattr key", "deleted xattr chunk", ExpectBigXattrGone},
      {"two values with one id",
       [](Fixture& f) {
         AddOther(f);
         EditDescriptor(f, "user.other", [](posix::XattrChunksFormat& d) {
           ASSERT_EQ(d.id.get(), 1u);
           d.id.set(0);  // user.big's
         });
       },
       "has the id 0 of another value of its inode", "deleted xattr chunk",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);
         EXPECT_EQ(fs.GetXattr(f.file, "user.other", 10, nullptr, 0).status().code(), Err::kNoData);
       }},
      {"two values with one id (the later one keeps it)",  // (with the case above: both slot orders)
       [](Fixture& f) {
         AddOther(f);
         EditDescriptor(f, "user.big", [](posix::XattrChunksFormat& d) {
           ASSERT_EQ(d.id.get(), 0u);
           d.id.set(1);  // user.other's
         });
       },
       "has the id 1 of another value of its inode", "deleted xattr chunk",
       [](Fixture& f, Filesystem& fs) {
         EXPECT_EQ(fs.GetXattr(f.file, "user.big", 8, nullptr, 0).status().code(), Err::kNoData);
         char buf[4096];
         auto o = fs.GetXattr(f.file, "user.other", 10, buf, sizeof(buf));
         ASSERT_TRUE(o.ok()) << o.status().Message();
         EXPECT_EQ(std::string(buf, o.value()), std::string(3000, 'o'));
         EXPECT_EQ(Contents(fs, f.file), FileBytes());
       }},
      {"more chunks than an inode may have",
       [](Fixture& f) {
         // 31 values of 64 KiB and user.big: 995 chunks, what posix allows;
         // then one more value of 30 chunks behind its back.
         f.WithFs([&](Filesystem& fs, btree::Btrees&) {
           const std::string v(posix::kXattrSizeMax, 'm');
           for (int i = 0; i < 31; i++) {
             const std::string n = "user.m" + std::to_string(i);
             ASSERT_TRUE(fs.SetXattr(f.file, n.data(), u32(n.size()), v.data(), u32(v.size()), 0,
                                     Filesystem::kFrontEndChecked).ok()) << i;
           }
         });
         const std::string name = "user.poked";
         const std::string v(30 * posix::kXattrChunkBytes, 'p');
         const posix::NameTable t = posix::XattrTable(f.file, f.Inode(f.file));
         u64 slot = posix::NameHash(t.seed, t.bits, name.data(), u32(name.size()));
         while (!f.Value(btree::Pos{btree::kBtreeXattrs, f.file, slot}, true).empty()) slot++;
         store::Store e;
         ASSERT_TRUE(testing::OpenStore(&e, {f.dev.get()}).ok());
         btree::Transaction tx(&e.btrees());
         for (u32 i = 0; i < 30; i++)
           ASSERT_TRUE(tx.Set(ChunkPos(f.file, 40, i), v.data() + i * posix::kXattrChunkBytes,
                              posix::kXattrChunkBytes).ok());
         posix::DirentFormat de{};
         de.type = posix::kXattrChunked;
         de.name_len = u8(name.size());
         de.value_len.set(sizeof(posix::XattrChunksFormat));
         posix::XattrChunksFormat d{};
         d.value_len.set(u32(v.size()));
         d.crc.set(platform::Crc32c(v.data(), v.size()));
         d.id.set(40);
         std::vector<u8> entry(sizeof(de) + name.size() + sizeof(d));
         memcpy(entry.data(), &de, sizeof(de));
         memcpy(entry.data() + sizeof(de), name.data(), name.size());
         memcpy(entry.data() + sizeof(de) + name.size(), &d, sizeof(d));
         ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeXattrs, f.file, slot}, entry.data(), u32(entry.size())).ok());
         ASSERT_TRUE(tx.Commit().ok());
         ASSERT_TRUE(e.Close().ok());
       },
       "has 1025 xattr chunks, more than 1024", "(over the inode's bound)",
       [](Fixture& f, Filesystem& fs) {
         // One value went (the one in the last slot): 33 names are left, each readable.
         std::string names(8192, '\0');
         auto l = fs.ListXattr(f.file, names.data(), u32(names.size()));
         ASSERT_TRUE(l.ok());
         u32 count = 0;
         std::string buf(posix::kXattrSizeMax, '\0');
         for (size_t at = 0; at < l.value();) {
           const std::string n(names.data() + at);
           at += n.size() + 1;
           count++;
           EXPECT_TRUE(fs.GetXattr(f.file, n.data(), u32(n.size()), buf.data(), u32(buf.size())).ok()) << n;
         }
         EXPECT_EQ(count, 33u);
         EXPECT_EQ(Contents(fs, f.file), FileBytes());
       }},
      {"chunks of several values, a damaged one between whole ones and a stray among them",
       [](Fixture& f) {
         const std::string o1(3000, '1'), o2(3000, '2');
         f.WithFs([&](Filesystem& fs, btree::Btrees&) {
           ASSERT_TRUE(fs.SetXattr(f.file, "user.o1", 7, o1.data(), u32(o1.size()), 0,
                                   Filesystem::kFrontEndChecked).ok());
           ASSERT_TRUE(fs.SetXattr(f.file, "user.o2", 7, o2.data(), u32(o2.size()), 0,
                                   Filesystem::kFrontEndChecked).ok());
         });
         ASSERT_EQ(f.Value(ChunkPos(f.file, 1, 1)).size(), 3000u - posix::kXattrChunkBytes);  // o1's id is 1
         f.Poke(ChunkPos(f.file, 1, 0), nullptr, 0);
         f.Poke(ChunkPos(f.file, 3, 4), "stray", 5);
       },
       "is damaged: chunk 0 of 2 is missing", "and its chunks (damaged)",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);
         EXPECT_EQ(fs.GetXattr(f.file, "user.o1", 7, nullptr, 0).status().code(), Err::kNoData);
         std::string v(3000, '\0');
         auto r = fs.GetXattr(f.file, "user.o2", 7, v.data(), u32(v.size()));
         ASSERT_TRUE(r.ok());
         EXPECT_EQ(v, std::string(3000, '2'));
       }},
      {"more table keys than an inode may have",
       [](Fixture& f) { PokeXattrs(f.dev.get(), f.file, posix::kSlotEnd - 1000, 140); },
       "has 142 xattr table keys, more than 128", "deleted the 14 xattr table keys",
       [](Fixture& f, Filesystem& fs) {
         ExpectFixtureIntact(fs, f);  // (user.x and user.big hash below the poked slots)
         std::string names(8192, '\0');
         auto l = fs.ListXattr(f.file, names.data(), u32(names.size()));
         ASSERT_TRUE(l.ok());
         EXPECT_EQ(std::count(names.begin(), names.begin() + l.value(), '\0'), 128);
       }},
  };
  for (const RepairCase& c : cases) RunRepairCase(c);
}

namespace {

// Runs fn on the image's store, with no posix mount (which would upgrade
// what an older build left).
void WithStore(fixture::Image& img, const std::function<void(store::Store&)>& fn) {
  store::Store e;
  ASSERT_TRUE(testing::OpenStore(&e, {img.dev.get()}).ok());
  fn(e);
  ASSERT_TRUE(e.Close().ok());
}

// Flips kInodeFlagCaps of `ino` behind posix's back.
// The inode's committed record, read and parsed on the store alone.
void ReadInodeOf(store::Store& e, u64 ino, posix::InodeFormat* f) {
  u8 v[sizeof(posix::InodeFormat)];
  auto r = e.btrees().Get(btree::Pos{btree::kBtreeInodes, ino, 0}, v, sizeof(v));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(posix::ParseInode(v, r.value(), f).ok());
}

void FlipCapsFlag(fixture::Image& img, u64 ino) {
  WithStore(img, [&](store::Store& e) {
    posix::InodeFormat f;
    ASSERT_NO_FATAL_FAILURE(ReadInodeOf(e, ino, &f));
    f.flags.set(u16(f.flags.get() ^ posix::kInodeFlagCaps));
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeInodes, ino, 0}, &f, sizeof(f)).ok());
    ASSERT_TRUE(tx.Commit().ok());
  });
}

// What a build before the features leaves (or `which` of them).
void DropFeatureFlag(fixture::Image& img, u16 which = posix::kSbFeatures) {
  sb::Superblock s = img.SbOf();
  s.flags &= u16(~which);
  s.seq++;
  ASSERT_TRUE(sb::Write(*img.dev, s, 0).ok());
}

u16 CapsFlagOf(fixture::Image& img, u64 ino) {
  u16 flags = 0xffff;
  WithStore(img, [&](store::Store& e) {
    posix::InodeFormat f;
    ASSERT_NO_FATAL_FAILURE(ReadInodeOf(e, ino, &f));
    flags = u16(f.flags.get() & posix::kInodeFlagCaps);
  });
  return flags;
}

}  // namespace

// kSbXattrChunks: format leaves it off (an older build mounts a new
// filesystem); every read-write mount sets it, and fsck -y clears it again
// while nothing needs it -- no chunked xattr entry, no chunk key, no inode
// with kInodeFlagCaps -- so an older build can mount the filesystem again
// (the downgrade path). A flag missing while chunked xattrs exist (damage,
// or the flag lost) is an error fsck -y repairs; an older build's
// filesystem (no flag, inline xattrs) checks clean and mounts.
TEST(FsckNamespaceTest, TheChunkedXattrFlagFollowsWhatNeedsIt) {
  auto flag = [](fixture::Image& img) { return (img.SbOf().flags & sb::kSbXattrChunks) != 0; };
  fixture::Image img;
  EXPECT_FALSE(flag(img));  // format: no feature yet
  u64 ino = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ino = fs.Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, fixture::kRoot).value().ino;
    ASSERT_TRUE(fs.SetXattr(ino, "user.a", 6, "old", 3, 0, Filesystem::kFrontEndChecked).ok());
  });
  EXPECT_TRUE(flag(img));  // a read-write mount
  // Unused: the normal state after a mount -- -n says nothing and writes
  // nothing; -y clears it and says so.
  auto [r1, out1] = img.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitClean) << out1;
  EXPECT_EQ(out1.find("chunked-xattrs flag"), std::string::npos) << out1;
  EXPECT_TRUE(flag(img)) << "fsck -n wrote the superblock";
  auto [r2, out2] = img.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_NE(out2.find("cleared the chunked-xattrs flag, which nothing uses"), std::string::npos) << out2;
  EXPECT_FALSE(flag(img));
  auto [r3, out3] = img.Fsck(true);  // nothing to say the second time
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  EXPECT_EQ(out3.find("chunked-xattrs flag"), std::string::npos) << out3;
  EXPECT_FALSE(flag(img));

  // What needs it keeps it: a chunked value; a capability (its inode flag).
  const std::string big(20000, 'b');
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ASSERT_TRUE(fs.SetXattr(ino, "user.big", 8, big.data(), u32(big.size()), 0, Filesystem::kFrontEndChecked).ok());
  });
  auto [r4, out4] = img.Fsck(true);
  EXPECT_EQ(r4.exit_code, kExitClean) << out4;
  EXPECT_TRUE(flag(img)) << out4;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ASSERT_TRUE(fs.RemoveXattr(ino, "user.big", 8, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(fs.SetXattr(ino, "security.capability", 19, "cap", 3, 0, Filesystem::kFrontEndChecked).ok());
  });
  auto [r5, out5] = img.Fsck(true);
  EXPECT_EQ(r5.exit_code, kExitClean) << out5;
  EXPECT_TRUE(flag(img)) << out5;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ASSERT_TRUE(fs.RemoveXattr(ino, "security.capability", 19, Filesystem::kFrontEndChecked).ok());
  });
  auto [r6, out6] = img.Fsck(true);
  EXPECT_EQ(r6.exit_code, kExitClean) << out6;
  EXPECT_FALSE(flag(img)) << out6;

  // The flag lost while a chunked value exists: an error, -y sets it.
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ASSERT_TRUE(fs.SetXattr(ino, "user.big", 8, big.data(), u32(big.size()), 0, Filesystem::kFrontEndChecked).ok());
  });
  DropFeatureFlag(img);
  fixture::ExpectReportedRepairedClean(img, "chunked-xattrs flag is missing", nullptr);
  EXPECT_TRUE(flag(img));

  // An older build's filesystem (no flag, inline xattrs only) checks clean
  // and mounts; the mount marks it.
  img.WithFs([&](Filesystem& fs, store::Store&) {
    ASSERT_TRUE(fs.RemoveXattr(ino, "user.big", 8, Filesystem::kFrontEndChecked).ok());
  });
  DropFeatureFlag(img);
  auto [r10, out10] = img.Fsck(false);
  EXPECT_EQ(r10.exit_code, kExitClean) << out10;
  EXPECT_EQ(out10.find("chunked-xattrs flag"), std::string::npos) << out10;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    char v[8];
    auto got = fs.GetXattr(ino, "user.a", 6, v, sizeof(v));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(std::string(v, got.value()), "old");
  });
  EXPECT_TRUE(flag(img));
}

// A filesystem an older build gave security.capability xattrs (no inode
// flag, no superblock feature): fsck -n calls it a note (exit 0); the first
// read-write mount records kSbXattrChunks, flags the inodes
// (posix.caps_flagged), then records kSbCapsFlagged; a mount's upgrade cut
// before that (some flagged, kSbCapsFlagged missing) is notes too, which the
// next mount finishes. fsck -y upgrades it as the mount does.
TEST(FsckRepairTest, AFilesystemFromBeforeTheCapabilityFlagIsUpgraded) {
  fixture::Image img;
  u64 a = 0, b = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    a = fs.Mknod(posix::kRootIno, "a", 1, posix::kModeReg | 0755, 0, fixture::kRoot).value().ino;
    b = fs.Mknod(posix::kRootIno, "b", 1, posix::kModeReg | 0755, 0, fixture::kRoot).value().ino;
    ASSERT_TRUE(fs.SetXattr(a, "security.capability", 19, "cap", 3, 0, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(fs.SetXattr(b, "security.capability", 19, "cap", 3, 0, Filesystem::kFrontEndChecked).ok());
  });
  EXPECT_EQ(img.SbOf().flags & posix::kSbFeatures, posix::kSbFeatures);
  auto older_build = [&] {
    if (CapsFlagOf(img, a) != 0) FlipCapsFlag(img, a);
    if (CapsFlagOf(img, b) != 0) FlipCapsFlag(img, b);
    DropFeatureFlag(img);
  };
  const std::string note_a = "inode " + std::to_string(a) + " has a security.capability xattr from before the "
                             "capability flag: the next read-write mount flags it";
  older_build();
  auto [r1, out1] = img.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitClean) << out1;
  EXPECT_NE(out1.find(note_a), std::string::npos) << out1;
  EXPECT_EQ(r1.notes, 2u) << out1;
  img.WithFs([&](Filesystem& fs, store::Store&) { EXPECT_EQ(fs.GetStats().caps_flagged, 2u); });
  EXPECT_EQ(img.SbOf().flags & posix::kSbFeatures, posix::kSbFeatures);
  EXPECT_EQ(CapsFlagOf(img, a), posix::kInodeFlagCaps);
  EXPECT_EQ(CapsFlagOf(img, b), posix::kInodeFlagCaps);
  auto [r2, out2] = img.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_EQ(r2.notes, 0u) << out2;
  img.WithFs([&](Filesystem& fs, store::Store&) { EXPECT_EQ(fs.GetStats().caps_flagged, 0u); });  // done once

  // Cut short: a flagged, b not, kSbCapsFlagged not recorded.
  FlipCapsFlag(img, b);
  DropFeatureFlag(img, sb::kSbCapsFlagged);
  auto [r3, out3] = img.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  EXPECT_EQ(r3.notes, 1u) << out3;
  EXPECT_NE(out3.find("inode " + std::to_string(b) + " has a security.capability xattr from before"),
            std::string::npos) << out3;
  img.WithFs([&](Filesystem& fs, store::Store&) { EXPECT_EQ(fs.GetStats().caps_flagged, 1u); });
  EXPECT_EQ(CapsFlagOf(img, b), posix::kInodeFlagCaps);
  EXPECT_EQ(img.SbOf().flags & posix::kSbFeatures, posix::kSbFeatures);
  EXPECT_EQ(img.Fsck(false).first.exit_code, kExitClean);

  // fsck -y, as the mount.
  older_build();
  auto [r4, out4] = img.Fsck(true);
  EXPECT_EQ(r4.exit_code, kExitClean) << out4;
  EXPECT_NE(out4.find("flagged it"), std::string::npos) << out4;
  EXPECT_NE(out4.find("recorded that every security.capability is flagged"), std::string::npos) << out4;
  EXPECT_EQ(img.SbOf().flags & posix::kSbFeatures, posix::kSbFeatures);
  EXPECT_EQ(CapsFlagOf(img, a), posix::kInodeFlagCaps);
  auto [r5, out5] = img.Fsck(false);
  EXPECT_EQ(r5.exit_code, kExitClean) << out5;
  EXPECT_EQ(r5.notes, 0u) << out5;

  // A power cut right after the upgrading mount: kSbCapsFlagged on disk
  // only with every flag (the flags' journal entries are flushed before the
  // superblock's FUA write records it).
  older_build();
  {
    fixture::Image vol(img.dev->SnapshotDurable(), /*volatile_cache=*/true);
    fixture::Image cut(vol.WithFs([](Filesystem&, store::Store&) {}, /*crash=*/true));
    EXPECT_TRUE((cut.SbOf().flags & sb::kSbCapsFlagged) != 0);
    EXPECT_EQ(CapsFlagOf(cut, a), posix::kInodeFlagCaps);
    EXPECT_EQ(CapsFlagOf(cut, b), posix::kInodeFlagCaps);
    EXPECT_EQ(cut.Fsck(false).first.exit_code, kExitClean);
  }
  img.WithFs([](Filesystem&, store::Store&) {});  // (the upgrade, for what follows)

  // Flags without kSbXattrChunks no mount leaves: an error, -y sets it.
  DropFeatureFlag(img);
  auto [r6, out6] = img.Fsck(false);
  EXPECT_EQ(r6.exit_code, kExitUncorrected) << out6;
  EXPECT_NE(out6.find("chunked-xattrs flag is missing"), std::string::npos) << out6;
  EXPECT_EQ(img.Fsck(true).first.exit_code, kExitRepaired);

  // An inode too damaged to read does not stop the mount: the others are
  // flagged, kSbCapsFlagged waits (the next mount tries again).
  older_build();
  WithStore(img, [&](store::Store& e) {
    u8 v[sizeof(posix::InodeFormat)];
    auto r = e.btrees().Get(btree::Pos{btree::kBtreeInodes, b, 0}, v, sizeof(v));
    ASSERT_TRUE(r.ok());
    v[0] ^= 0x7f;  // the version: kCorrupt
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeInodes, b, 0}, v, r.value()).ok());
    ASSERT_TRUE(tx.Commit().ok());
  });
  img.WithFs([&](Filesystem& fs, store::Store&) { EXPECT_EQ(fs.GetStats().caps_flagged, 1u); });
  EXPECT_EQ(img.SbOf().flags & posix::kSbFeatures, sb::kSbXattrChunks);
  EXPECT_EQ(CapsFlagOf(img, a), posix::kInodeFlagCaps);
}

// kInodeFlagCaps agrees with the security.capability xattr: a flag missing
// (on a filesystem with the feature) and a flag without the xattr are each
// one error, -y sets or clears the flag.
TEST(FsckRepairTest, TheCapabilityFlagFollowsItsXattr) {
  fixture::Image img;
  u64 with = 0, without = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    with = fs.Mknod(posix::kRootIno, "with", 4, posix::kModeReg | 0755, 0, fixture::kRoot).value().ino;
    without = fs.Mknod(posix::kRootIno, "without", 7, posix::kModeReg | 0755, 0, fixture::kRoot).value().ino;
    ASSERT_TRUE(fs.SetXattr(with, "security.capability", 19, "cap", 3, 0, Filesystem::kFrontEndChecked).ok());
  });
  FlipCapsFlag(img, with);
  FlipCapsFlag(img, without);
  const std::string no_flag = "inode " + std::to_string(with) + " has a security.capability xattr but not its flag";
  const fixture::Repair fix = fixture::ExpectReportedRepairedClean(img, no_flag.c_str(), nullptr);
  EXPECT_NE(fix.report.find("inode " + std::to_string(without) + " has the security.capability flag but no such xattr"),
            std::string::npos) << fix.report;
}

// The inodes' options (posix/opts.h): set ones check clean; a value naming
// a member the filesystem does not have, replicas out of range, reserved
// bytes in use, a compression flag that disagrees with the option and one
// without the option (damage: no path sets one without the other) are each
// one error; -y unsets the bad options, zeroes the bytes, makes the flag
// follow the option (a flag alone: compression=zstd), and the good options
// stay.
TEST(FsckRepairTest, DamagedInodeOptionsAreCleared) {
  Fixture fx;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    ASSERT_TRUE(fs.SetXattr(fx.file, "tierfs.replicas", 15, "2", 1, 0, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(
        fs.SetXattr(fx.file, "tierfs.foreground_target", 24, "ssd", 3, 0, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(
        fs.SetXattr(fx.file, "tierfs.promote_target", 21, "ssd.a", 5, 0, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(fs.SetXattr(fx.dir, "tierfs.compression", 18, "zstd", 4, 0, Filesystem::kFrontEndChecked).ok());
  });
  auto [r0, out0] = fx.Fsck();
  ASSERT_EQ(r0.exit_code, kExitClean) << out0;
  fx.SetInode(fx.file, [](posix::InodeFormat& i) {
    i.foreground_target.set(posix::kOptTargetMember + 7);  // member 7 of 1
    i.replicas = 9;
  });
  fx.SetInode(fx.dir, [](posix::InodeFormat& i) {
    i.reserved0[2] = 1;
    i.flags.set(u16(i.flags.get() & ~posix::kInodeFlagCompress));  // compression zstd, flag clear
  });
  // The flag without the option: no path writes it (each that sets the
  // flag sets zstd with it), so it is damage, and zstd the repair.
  fx.SetInode(fx.sub, [](posix::InodeFormat& i) { i.flags.set(u16(i.flags.get() | posix::kInodeFlagCompress)); });
  const std::string file = "inode " + std::to_string(fx.file);
  const std::string dir = "inode " + std::to_string(fx.dir);
  const std::string sub = "inode " + std::to_string(fx.sub);
  const fixture::Repair fix = fixture::ExpectReportedRepairedClean(fx, "5 problem(s)", nullptr);
  const std::string& out1 = fix.report;
  const std::string& out2 = fix.repair;
  EXPECT_NE(out1.find(file + ": bad option foreground_target: stored value 8 names no member or group of this "
                             "filesystem"),
            std::string::npos) << out1;
  EXPECT_NE(out1.find(file + ": bad option replicas: stored value 9 is outside 1..4"), std::string::npos) << out1;
  EXPECT_NE(out1.find(dir + ": reserved option bytes or bits are not zero"), std::string::npos) << out1;
  EXPECT_NE(out1.find(dir + ": the compression flag (chattr +c) is clear but its compression option is zstd"),
            std::string::npos) << out1;
  EXPECT_NE(out1.find(sub + ": the compression flag (chattr +c) is set without its compression option (the flag "
                            "mirrors compression=zstd)"),
            std::string::npos) << out1;
  EXPECT_NE(out2.find(file + ": unset option foreground_target (the filesystem's applies)"), std::string::npos)
      << out2;
  EXPECT_NE(out2.find(file + ": unset option replicas"), std::string::npos) << out2;
  EXPECT_NE(out2.find(dir + ": zeroed its reserved option bytes"), std::string::npos) << out2;
  EXPECT_NE(out2.find(dir + ": made its compression flag follow its compression option"), std::string::npos) << out2;
  EXPECT_NE(out2.find(sub + ": set its compression option to zstd, the one value its flag mirrors"), std::string::npos)
      << out2;
  fx.WithFs([&](Filesystem& fs, btree::Btrees&) {
    char v[32];
    EXPECT_EQ(fs.GetXattr(fx.file, "tierfs.replicas", 15, v, sizeof(v)).status().code(), Err::kNoData);
    EXPECT_EQ(fs.GetXattr(fx.file, "tierfs.foreground_target", 24, v, sizeof(v)).status().code(), Err::kNoData);
    ASSERT_EQ(fs.GetXattr(fx.file, "tierfs.promote_target", 21, v, sizeof(v)).value(), 5u);  // kept
    EXPECT_EQ(std::string(v, 5), "ssd.a");
    ASSERT_EQ(fs.GetXattr(fx.dir, "tierfs.compression", 18, v, sizeof(v)).value(), 4u);
    EXPECT_EQ(fs.GetFlags(fx.dir).value(), Filesystem::kFsComprFl);
    ASSERT_EQ(fs.GetXattr(fx.sub, "tierfs.compression", 18, v, sizeof(v)).value(), 4u);
    EXPECT_EQ(std::string(v, 4), "zstd");
    EXPECT_EQ(fs.GetFlags(fx.sub).value(), Filesystem::kFsComprFl);
    EXPECT_TRUE(Contents(fs, fx.file) == FileBytes());
  });
}

// An orphan whose xattr table holds more keys than posix allows cannot be
// freed (its keys are deleted in one transaction, which then does not fit a
// journal entry): the mount that frees it fails. fsck reports the keys past
// the bound and -y deletes them; then the mount frees the orphan.
TEST(FsckRepairTest, AnOrphanWithTooManyXattrKeysIsRepairedAndThenFreed) {
  Fixture fx;
  BlockDevice* b = fx.dev.get();
  {
    testing::MountedFs m({b}, MountOptions());
    ASSERT_TRUE(m.open());
    ASSERT_TRUE(m.fs.OpenInode(fx.file).ok());
    ASSERT_TRUE(m.fs.Unlink(posix::kRootIno, "hard", 4).ok());
    ASSERT_TRUE(m.fs.Unlink(fx.dir, "f1", 2).ok());
    m.Crash();  // the orphan stays
  }
  PokeXattrs(b, fx.file, posix::kSlotEnd - 20000, 12000);
  auto mounts = [&] {
    store::Store e;
    Diag diag;
    EXPECT_TRUE(e.Open(&b, 1, MountOptions(), &diag).ok()) << diag.text;
    data::DataPath data;
    EXPECT_TRUE(data.Open(&e).ok());
    Filesystem fs;
    const bool ok = fs.Mount(&e, &data).ok();
    if (ok) {
      EXPECT_TRUE(fs.Unmount().ok());
    }
    EXPECT_TRUE(e.Close().ok());
    return ok;
  };
  EXPECT_FALSE(mounts());
  auto [r1, out1] = fx.Fsck();
  EXPECT_EQ(r1.exit_code, kExitUncorrected) << out1;
  EXPECT_NE(out1.find("has 12002 xattr table keys, more than 128"), std::string::npos) << out1;
  auto [r2, out2] = fx.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_NE(out2.find("deleted the 11874 xattr table keys"), std::string::npos) << out2;
  EXPECT_TRUE(mounts());
  fx.WithFs([&](Filesystem&, btree::Btrees& t) {
    btree::Iterator it(&t, btree::kBtreeXattrs);
    ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeXattrs, fx.file, 0}).ok());
    EXPECT_FALSE(it.Valid() && it.pos().inode == fx.file) << "the orphan's xattrs outlived it";
  });
  auto [r3, out3] = fx.Fsck();
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
}

}  // namespace
}  // namespace tfs::fsck
