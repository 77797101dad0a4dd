// Extents with two copies (docs/design/copies.md, step 1) in a real
// filesystem of two members. Nothing writes them yet, so the test makes one:
// a file written through posix, a second copy of its blocks written on the
// other member by the data path (Prepare with that member as the target),
// and the pointer added with data::AddPtr in a transaction the data path
// commits (so the accounting counts both copies). Then: a read falls back to
// the good copy when the first is damaged, and fails only when both are;
// fsck finds the extent clean; and fsck -y drops a stale pointer -- the
// second or the first -- keeping the extent and its data. The backpointers
// follow every change: one per copy, set with AddPtr's transaction, and the
// dropped copy's deleted with fsck's.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/backpointer.h"
#include "data/data.h"
#include "fsck/fsck.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "userspace/platform/mem_device.h"

namespace tfs {
namespace {

using fsck::kExitClean;
using fsck::kExitRepaired;
using fsck::kExitUncorrected;

constexpr u32 kBlocks = 3;

struct TwoCopies {
  std::unique_ptr<userspace::MemDevice> a = testing::MemMember();
  std::unique_ptr<userspace::MemDevice> b = testing::MemMember();
  u64 ino = 0;
  std::string content;
  data::Extent::Ptr ptrs[2];  // the extent's copies, as made

  TwoCopies() {
    EXPECT_TRUE(testing::FormatMembers({a.get(), b.get()}).ok());
    for (u32 i = 0; i < kBlocks * data::kBlockSize; i++) content.push_back(char('A' + (i * 7 + i / 4096) % 26));
    Make();
  }
  std::vector<BlockDevice*> Devs() { return {a.get(), b.get()}; }

  // Runs fn on the mounted filesystem.
  void WithFs(const std::function<void(testing::MountedFs&)>& fn) {
    testing::MountedFs m(Devs());
    ASSERT_TRUE(m.open());
    fn(m);
  }

  // The file's one extent; its value is kept in *v (e.crcs points into it).
  static data::Extent ExtentOf(testing::MountedFs& m, u64 ino, std::vector<u8>* v) {
    data::Extent e;
    btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
    EXPECT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino, 0}).ok());
    EXPECT_TRUE(it.Valid() && it.pos().inode == ino);
    if (!it.Valid()) return e;
    v->assign(it.value(), it.value() + it.val_bytes());
    EXPECT_TRUE(data::ParseExtent(it.pos(), v->data(), u32(v->size()), &e).ok());
    return e;
  }

  void Make() {
    WithFs([&](testing::MountedFs& m) {
      auto f = m.fs.Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
      ASSERT_TRUE(f.ok());
      ino = f.value().ino;
      ASSERT_EQ(m.fs.Write(ino, 0, content.data(), u32(content.size())).value(), content.size());
      ASSERT_TRUE(m.fs.Fsync(ino).ok());
      std::vector<u8> v;
      const data::Extent e = ExtentOf(m, ino, &v);
      ASSERT_EQ(e.nr_ptrs, 1u);
      ASSERT_EQ(e.blocks(), kBlocks);
      // The second copy, on the other member, by the data path.
      const u8 other = u8(1 - e.ptrs[0].dev);
      const data::IoContext ctx = {IoOrigin::kReconcile, dev::IoClass::kBackground, alloc::Watermark::kBackground,
                                   data::Target{data::TargetKind::kMember, other}};
      data::Prepared p;
      data::Delta delta;
      ASSERT_TRUE(m.data.Prepare(ctx, ino, e.start, reinterpret_cast<const u8*>(content.data()), kBlocks, false, &p,
                                 &delta).ok());
      ASSERT_EQ(p.items.size(), 1u);
      data::Extent copy;
      ASSERT_TRUE(data::ParseExtent(btree::Pos{btree::kBtreeExtents, ino, p.items[0].end}, p.items[0].value,
                                    p.items[0].len, &copy).ok());
      ASSERT_EQ(copy.ptrs[0].dev, other);
      u8 buf[data::kExtentValueMax];
      auto len = data::AddPtr(e, copy.ptrs[0], copy.crcs, buf);  // (the same bytes: the same crcs)
      ASSERT_TRUE(len.ok());
      data::Extent added;
      ASSERT_TRUE(data::ParseExtent(btree::Pos{btree::kBtreeExtents, ino, e.end}, buf, len.value(), &added).ok());
      btree::Transaction tx(&m.store->btrees());
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeExtents, ino, e.end}, buf, len.value()).ok());
      ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &e, &added).ok());
      delta.ino = ino;
      delta.sectors = 0;  // the file holds the same blocks
      ASSERT_TRUE(m.data.Commit(ctx, &tx, delta).ok());
      const data::Extent two = ExtentOf(m, ino, &v);
      ASSERT_EQ(two.nr_ptrs, 2u);
      ptrs[0] = two.ptrs[0];
      ptrs[1] = two.ptrs[1];
    });
  }

  // The device of member `dev` (members are "ssd.a" and "ssd.b", in that order).
  userspace::MemDevice* Member(u32 dev) { return dev == 0 ? a.get() : b.get(); }

  // Flips a byte of block `block` of copy `c` on its member.
  void Damage(u32 c, u32 block) {
    const data::Extent::Ptr& p = ptrs[c];
    const u64 at = p.offset + (u64(p.blob_offset) + block) * data::kBlockSize + 100;
    u8 x;
    Member(p.dev)->ReadRaw(at, &x, 1);
    x ^= 0x40;
    Member(p.dev)->WriteRaw(at, &x, 1);
  }

  std::pair<fsck::Report, std::string> Fsck(bool repair) {
    std::vector<BlockDevice*> devs = Devs();
    std::string out;
    fsck::Options o;
    o.repair = repair;
    fsck::Report r = fsck::Check(devs.data(), u32(devs.size()), o, [](void* ctx, const char* line) {
      *static_cast<std::string*>(ctx) += std::string(line) + "\n";
    }, &out);
    return {r, out};
  }

  // Sets the generation of copy `c` one behind its bucket's (a pointer left
  // from before the bucket was reused).
  void MakeStale(u32 c) {
    WithFs([&](testing::MountedFs& m) {
      std::vector<u8> v;
      data::Extent e = ExtentOf(m, ino, &v);
      ASSERT_EQ(e.nr_ptrs, 2u);
      const data::Extent was = e;
      e.ptrs[c].gen = u8(e.ptrs[c].gen - 1);
      u8 buf[data::kExtentValueMax];
      auto len = data::BuildExtent(e, buf);
      ASSERT_TRUE(len.ok());
      btree::Transaction tx(&m.store->btrees());
      ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeExtents, ino, e.end}, buf, len.value()).ok());
      ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &was, &e).ok());  // (the same: gen is not in them)
      ASSERT_TRUE(tx.Commit().ok());
    });
  }

  // The backpointers tree: what the extents imply, nothing else; one per
  // copy, on the copies' members.
  void ExpectBackpointers(const std::vector<u32>& devs) {
    WithFs([&](testing::MountedFs& m) {
      std::vector<std::string> bad;
      data::BackpointerCheckStats stats;
      ASSERT_TRUE(data::CheckBackpointers(&m.store->btrees(), m.store->sb(), [](void* ctx, const data::BackpointerMismatch& x) {
        static_cast<std::vector<std::string>*>(ctx)->push_back(std::to_string(x.kind) + "@" + std::to_string(x.pos.inode) +
                                                               ":" + std::to_string(x.pos.offset));
        return Status::Ok();
      }, &bad, &stats).ok());
      EXPECT_TRUE(bad.empty()) << bad.size() << " mismatches, first " << bad[0];
      EXPECT_EQ(stats.keys, devs.size());
      std::vector<u32> got;
      btree::Iterator it(&m.store->btrees(), btree::kBtreeBackpointers);
      ASSERT_TRUE(it.SeekToFirst().ok());
      for (; it.Valid(); (void)it.Next()) {
        data::Backpointer bp;
        ASSERT_TRUE(data::ParseBackpointer(it.pos(), it.value(), it.val_bytes(), &bp).ok());
        EXPECT_EQ(bp.ino, ino);
        EXPECT_EQ(bp.blocks, kBlocks);
        got.push_back(bp.dev);
      }
      EXPECT_EQ(got, devs);
    });
  }

  // The file reads back whole, from a fresh mount; the extent's copies now.
  void ExpectContent(u32 copies, u32 first_dev) {
    WithFs([&](testing::MountedFs& m) {
      std::string got(content.size(), '\0');
      auto r = m.fs.Read(ino, 0, got.data(), u32(got.size()));
      ASSERT_TRUE(r.ok()) << r.status().Message();
      EXPECT_TRUE(got == content);
      std::vector<u8> v;
      const data::Extent e = ExtentOf(m, ino, &v);
      EXPECT_EQ(e.nr_ptrs, copies);
      EXPECT_EQ(e.ptrs[0].dev, first_dev);
      EXPECT_EQ(m.data.GetStats().copy_retries, 0u);
    });
  }
};

TEST(CopiesTest, TwoCopiesOnDistinctMembersReadAndCheckClean) {
  TwoCopies t;
  EXPECT_NE(t.ptrs[0].dev, t.ptrs[1].dev);
  EXPECT_FALSE(t.ptrs[0].cached || t.ptrs[1].cached);
  auto [r, out] = t.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_EQ(r.errors, 0u) << out;
  EXPECT_EQ(out.find("holds no extent"), std::string::npos) << out;  // both buckets count
  EXPECT_NE(out.find("backpointers: 2 keys, 2 implied by the pointers of 1 extents"), std::string::npos) << out;
  t.ExpectContent(2, t.ptrs[0].dev);
  t.ExpectBackpointers({0, 1});
}

TEST(CopiesTest, AReadFallsBackToTheGoodCopy) {
  TwoCopies t;
  t.Damage(0, 1);
  t.WithFs([&](testing::MountedFs& m) {
    std::string got(t.content.size(), '\0');
    auto r = m.fs.Read(t.ino, 0, got.data(), u32(got.size()));
    ASSERT_TRUE(r.ok()) << r.status().Message();
    EXPECT_TRUE(got == t.content);
    const data::Stats s = m.data.GetStats();
    EXPECT_EQ(s.csum_errors, 1u);
    EXPECT_EQ(s.copy_retries, 1u);
  });
  // With the second copy damaged too (another block), no copy reads whole:
  // the read fails as the first copy did, and returns no bytes.
  t.Damage(1, 2);
  t.WithFs([&](testing::MountedFs& m) {
    char buf[kBlocks * data::kBlockSize];
    EXPECT_EQ(m.fs.Read(t.ino, 0, buf, sizeof(buf)).status().code(), Err::kDataCorrupt);
    EXPECT_EQ(m.data.GetStats().csum_errors, 2u);
    // Block 0 is good in both; block 2 in the first.
    EXPECT_EQ(m.fs.Read(t.ino, 0, buf, data::kBlockSize).value(), data::kBlockSize);
    EXPECT_EQ(m.fs.Read(t.ino, 2 * data::kBlockSize, buf, data::kBlockSize).value(), data::kBlockSize);
    EXPECT_EQ(memcmp(buf, t.content.data() + 2 * data::kBlockSize, data::kBlockSize), 0);
  });
}

// A stale second pointer: fsck -n reports it, -y drops it (not the extent),
// and the next check is clean; the data reads from the first copy.
TEST(CopiesTest, FsckDropsAStaleSecondPointer) {
  TwoCopies t;
  t.MakeStale(1);
  auto [r1, out1] = t.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitUncorrected) << out1;
  EXPECT_NE(out1.find("stale extent pointer, inode " + std::to_string(t.ino) + " at block 0 (copy 2 of 2)"),
            std::string::npos)
      << out1;
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_EQ(r2.repaired, r2.errors) << out2;
  EXPECT_NE(out2.find("dropped 1 bad pointer of the extent of inode " + std::to_string(t.ino) +
                      " at blocks [0, 3); its other copies keep the data"),
            std::string::npos)
      << out2;
  EXPECT_EQ(out2.find("data lost"), std::string::npos) << out2;
  EXPECT_NE(out2.find("backpointers: 1 keys, 1 implied by the pointers of 1 extents"), std::string::npos) << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out2 << out3;
  t.ExpectContent(1, t.ptrs[0].dev);
  t.ExpectBackpointers({t.ptrs[0].dev});
}

// The same with the first pointer stale: the second copy is what is left.
TEST(CopiesTest, FsckDropsAStaleFirstPointer) {
  TwoCopies t;
  t.MakeStale(0);
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_NE(out2.find("(copy 1 of 2)"), std::string::npos) << out2;
  EXPECT_NE(out2.find("dropped 1 bad pointer"), std::string::npos) << out2;
  EXPECT_NE(out2.find("backpointers: 1 keys, 1 implied by the pointers of 1 extents"), std::string::npos) << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out2 << out3;
  t.ExpectContent(1, t.ptrs[1].dev);
  t.ExpectBackpointers({t.ptrs[1].dev});
}

// Both stale: no copy is left, and the extent goes as a lost one does.
TEST(CopiesTest, FsckDeletesAnExtentWithNoGoodCopy) {
  TwoCopies t;
  t.MakeStale(0);
  t.MakeStale(1);
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
  EXPECT_EQ(r2.repaired, r2.errors) << out2;
  EXPECT_NE(out2.find("its bucket holds other data now (data lost)"), std::string::npos) << out2;
  EXPECT_NE(out2.find("backpointers: 0 keys, 0 implied"), std::string::npos) << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out2 << out3;
  t.ExpectBackpointers({});
  t.WithFs([&](testing::MountedFs& m) {
    std::string got(t.content.size(), 'x');
    ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
    EXPECT_TRUE(got == std::string(t.content.size(), '\0'));  // a hole now
  });
}

}  // namespace
}  // namespace tfs
