// Extents with several copies (docs/design/copies.md, step 1) in a real
// filesystem of two to four members. Nothing writes them yet, so the test
// makes them: a file written through posix, each further copy of its blocks
// written on the next member by the data path (Prepare with that member as
// the target; plain or compressed, cached or not), and the pointers added
// with data::AddPtr in a transaction the data path commits (so the
// accounting counts every copy). Then: a read falls back to a good copy --
// plain or compressed -- when one is damaged, fails only when all are, and
// looks the extent up again when a copy was stale; cached copies count apart
// from live ones, across remounts and punches; a stale cached copy is normal
// (counted nowhere, dropped by fsck -y without an error); fsck -y drops bad
// pointers -- any of them, several of four -- keeps the extent while a good
// copy is left (promoting a cached one if it is the only good one), and says
// copy by copy why an extent with none is lost; and a crash after the commit
// of a two-copy extent keeps it only if the journal's data check of each
// copy holds. The backpointers follow every change: one per copy that is not
// cached, set with AddPtr's transaction, a dropped copy's deleted and a
// promoted one's set with fsck's; a stale cached copy whose bucket holds new
// data leaves that data's backpointer alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/backpointer.h"
#include "data/data.h"
#include "fsck/fsck.h"
#include "fsck/testing.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "userspace/platform/mem_device.h"

namespace tfs {
namespace {

using fsck::kExitClean;
using fsck::kExitRepaired;
using fsck::fixture::ExpectReportedRepairedClean;
using fsck::fixture::Repair;

// The extents' counts per bucket (member, bucket) -> (live, cached)
// sectors, recounted from the extents tree by the one rule (data::PtrBucket,
// data::PtrCountsIn against the allocator's state, data::PtrSectors): what
// the allocator's counts must be.
std::map<std::pair<u32, u64>, std::pair<u64, u64>> RecountExtents(testing::MountedFs& m) {
  std::map<std::pair<u32, u64>, std::pair<u64, u64>> counts;
  btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
  EXPECT_TRUE(it.SeekToFirst().ok());
  for (; it.Valid(); it.Next().IgnoreError()) {
    std::vector<u8> v(it.value(), it.value() + it.val_bytes());
    data::Extent e;
    EXPECT_TRUE(data::ParseExtent(it.pos(), v.data(), u32(v.size()), &e).ok());
    if (e.unwritten) continue;
    for (u32 c = 0; c < e.nr_ptrs; c++) {
      const data::Extent::Ptr& p = e.ptrs[c];
      u64 b;
      EXPECT_TRUE(data::PtrBucket(m.store->sb(), p, &b));
      const alloc::Bucket k = m.store->alloc().Get(p.dev, b);
      if (!data::PtrCountsIn(p, k.state == alloc::BucketState::kUser, k.gen)) continue;
      auto& w = counts[{p.dev, b}];
      (p.cached ? w.second : w.first) += data::PtrSectors(e);
    }
  }
  return counts;
}

constexpr u32 kBlocks = 3;

// One more copy: on the next member, compressed or plain, cached or not.
struct CopySpec {
  bool cached = false;
  bool compressed = false;
};

struct Copies {
  std::vector<std::unique_ptr<userspace::MemDevice>> mems;
  u64 ino = 0;
  std::string content;
  std::vector<data::Extent::Ptr> ptrs;  // the extent's copies, as made, in its order

  // A file of kBlocks blocks on the member its write lands on, and one copy
  // more per spec, each on the next member (members "ssd.a", "ssd.b", ...:
  // one a copy, `members` at least). With `last_first` the last copy made is
  // listed first.
  explicit Copies(const std::vector<CopySpec>& more = {CopySpec{}}, bool last_first = false, u32 members = 0) {
    for (size_t i = 0; i < std::max<size_t>(members, 1 + more.size()); i++) mems.push_back(testing::MemMember());
    EXPECT_TRUE(testing::FormatMembers(Devs()).ok());
    for (u32 i = 0; i < kBlocks * data::kBlockSize; i++) content.push_back(char('A' + (i * 7 + i / 4096) % 26));
    Make(more, last_first);
  }
  std::vector<BlockDevice*> Devs() {
    std::vector<BlockDevice*> d;
    for (auto& m : mems) d.push_back(m.get());
    return d;
  }
  u32 members() const { return u32(mems.size()); }

  // Runs fn on the mounted filesystem.
  void WithFs(const std::function<void(testing::MountedFs&)>& fn) {
    // (No repair worker -- the fixture's default: a damaged copy stays as
    // the test made it.)
    testing::MountedFs m(Devs());
    ASSERT_TRUE(m.open());
    // (The tests count what reading the copies in order, one at a time, does.)
    m.data.SetListedReadOrderForTest(true);
    m.data.SetHedgingForTest(false);
    fn(m);
  }

  static btree::Pos At(u64 ino, u64 end) { return btree::Pos{btree::kBtreeExtents, ino, end}; }

  // The file's one extent; its value is kept in *v (e.crcs points into it).
  static data::Extent ExtentOf(testing::MountedFs& m, u64 ino, std::vector<u8>* v) {
    data::Extent e;
    btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
    EXPECT_TRUE(it.Seek(At(ino, 0)).ok());
    EXPECT_TRUE(it.Valid() && it.pos().inode == ino);
    if (!it.Valid()) return e;
    v->assign(it.value(), it.value() + it.val_bytes());
    EXPECT_TRUE(data::ParseExtent(it.pos(), v->data(), u32(v->size()), &e).ok());
    return e;
  }

  // A context writing on member `dev` alone (the engines' class).
  static data::IoContext On(u32 dev) {
    return {IoOrigin::kReconcile, dev::IoClass::kBackground, alloc::Watermark::kBackground,
            data::Target{data::TargetKind::kMember, u8(dev)}};
  }

  void Make(const std::vector<CopySpec>& more, bool last_first) {
    WithFs([&](testing::MountedFs& m) {
      auto f = m.fs.Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
      ASSERT_TRUE(f.ok());
      ino = f.value().ino;
      ASSERT_EQ(m.fs.Write(ino, 0, content.data(), u32(content.size())).value(), content.size());
      ASSERT_TRUE(m.fs.Fsync(ino).ok());
      std::vector<u8> v;
      data::Extent x = ExtentOf(m, ino, &v);
      ASSERT_EQ(x.nr_ptrs, 1u);
      ASSERT_EQ(x.blocks(), kBlocks);
      const data::Extent one = x;  // (for the backpointers; its crcs are not used)
      // The other copies, each on the next member, by the data path; one
      // commit adds them all.
      data::Delta delta;
      std::vector<std::unique_ptr<data::Prepared>> preps;
      u32 dev = x.ptrs[0].dev;
      u8 buf[data::kExtentValueMax];
      for (const CopySpec& spec : more) {
        dev = (dev + 1) % members();
        preps.push_back(std::make_unique<data::Prepared>());
        data::Prepared* p = preps.back().get();
        const size_t before = delta.changes.size();
        ASSERT_TRUE(m.data.Prepare(On(dev), ino, x.start, reinterpret_cast<const u8*>(content.data()), kBlocks,
                                   spec.compressed, p, &delta).ok());
        ASSERT_EQ(p->items.size(), 1u);
        data::Extent copy;
        ASSERT_TRUE(data::ParseExtent(At(ino, p->items[0].end), p->items[0].value, p->items[0].len, &copy).ok());
        ASSERT_EQ(copy.ptrs[0].dev, dev);
        ASSERT_EQ(copy.ptrs[0].compressed, spec.compressed);
        data::Extent::Ptr q = copy.ptrs[0];
        q.cached = spec.cached;
        if (spec.cached) {  // what the write reserved counts as cached, not live
          for (size_t i = before; i < delta.changes.size(); i++) {
            delta.changes[i].cached = delta.changes[i].blocks;
            delta.changes[i].blocks = 0;
          }
        }
        auto len = data::AddPtr(x, q, copy.crcs, buf);  // (a plain copy: the same bytes, the same crcs)
        ASSERT_TRUE(len.ok());
        v.assign(buf, buf + len.value());
        ASSERT_TRUE(data::ParseExtent(At(ino, x.end), v.data(), u32(v.size()), &x).ok());
      }
      if (last_first) {
        data::Extent y = x;
        y.ptrs[0] = x.ptrs[x.nr_ptrs - 1];
        for (u32 i = 1; i < x.nr_ptrs; i++) y.ptrs[i] = x.ptrs[i - 1];
        auto len = data::BuildExtent(y, buf);
        ASSERT_TRUE(len.ok());
        v.assign(buf, buf + len.value());
      }
      data::Extent now;
      ASSERT_TRUE(data::ParseExtent(At(ino, x.end), v.data(), u32(v.size()), &now).ok());
      btree::Transaction tx(&m.store->btrees());
      ASSERT_TRUE(tx.Set(At(ino, x.end), v.data(), u32(v.size())).ok());
      ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &one, &now).ok());
      delta.ino = ino;
      delta.sectors = 0;  // the file holds the same blocks
      // The prepared extents are not inserted: the file's extent moves
      // from its one copy's set to its copies'.
      delta.sets.Clear();
      ASSERT_TRUE(data::MoveSet(m.store->sb(), one, now, &delta).ok());
      ASSERT_TRUE(m.data.Commit(On(dev), &tx, delta).ok());
      const data::Extent all = ExtentOf(m, ino, &v);
      ASSERT_EQ(all.nr_ptrs, 1 + more.size());
      ptrs.assign(all.ptrs, all.ptrs + all.nr_ptrs);
    });
  }

  // The device of member `dev` (members are formatted in the order of mems).
  userspace::MemDevice* Member(u32 dev) { return mems[dev].get(); }

  // Flips a byte of block `block` of copy `c` on its member (a compressed
  // copy: a byte of its blob, whichever block).
  void Damage(u32 c, u32 block) {
    const data::Extent::Ptr& p = ptrs[c];
    const u64 at = p.compressed ? p.offset + p.disk_bytes / 2
                                : p.offset + (u64(p.blob_offset) + block) * data::kBlockSize + 100;
    u8 x;
    Member(p.dev)->ReadRaw(at, &x, 1);
    x ^= 0x40;
    Member(p.dev)->WriteRaw(at, &x, 1);
  }

  std::pair<fsck::Report, std::string> Fsck(bool repair) {
    std::vector<BlockDevice*> devs = Devs();
    return fsck::fixture::RunFsck(devs.data(), u32(devs.size()), repair);
  }

  // Every member's durable bytes.
  std::vector<std::vector<u8>> Bytes() const {
    std::vector<const userspace::MemDevice*> d;
    for (const auto& m : mems) d.push_back(m.get());
    return userspace::MemDevice::SnapshotDurable(d);
  }

  // Rewrites the extent's key with edit(e) applied (no accounting: the next
  // mount counts what the extents say).
  void EditExtent(const std::function<void(data::Extent&)>& edit) {
    WithFs([&](testing::MountedFs& m) {
      std::vector<u8> v;
      data::Extent e = ExtentOf(m, ino, &v);
      ASSERT_EQ(e.nr_ptrs, ptrs.size());
      const data::Extent was = e;
      edit(e);
      u8 buf[data::kExtentValueMax];
      auto len = data::BuildExtent(e, buf);
      ASSERT_TRUE(len.ok());
      btree::Transaction tx(&m.store->btrees());
      ASSERT_TRUE(tx.Set(At(ino, e.end), buf, len.value()).ok());
      // The backpointers follow (a copy moved outside the buckets loses
      // its): only the extent is damaged.
      ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &was, &e).ok());
      ASSERT_TRUE(tx.Commit().ok());
    });
  }

  // Sets the generation of copy `c` one behind its bucket's (a pointer left
  // from before the bucket was reused).
  void MakeStale(u32 c) {
    EditExtent([&](data::Extent& e) { e.ptrs[c].gen = u8(e.ptrs[c].gen - 1); });
  }

  // Makes cached copy c stale as the cache letting its bucket go does
  // (issue 22's eviction): the allocator frees the bucket with its cached
  // sectors counted -- its generation bumped, its oldest generation kept
  // (the generation guard) -- and the pointer stays in the extent. (A
  // cached copy made stale by MakeStale is older than its bucket's oldest
  // generation: the guard broken, damage.)
  void DropCache(u32 c) {
    WithFs([&](testing::MountedFs& m) {
      const u64 b = BucketOf(m, ptrs[c]);
      const alloc::Bucket k = m.store->alloc().Get(ptrs[c].dev, b);
      ASSERT_TRUE(ptrs[c].cached);
      ASSERT_EQ(k.state, alloc::BucketState::kUser);
      ASSERT_EQ(k.live_sectors, 0u);
      ASSERT_GT(k.cached_sectors, 0u);
      ASSERT_TRUE(m.store->alloc().Free(alloc::BucketRef{ptrs[c].dev, b, k.gen}).ok());
      const alloc::Bucket now = m.store->alloc().Get(ptrs[c].dev, b);
      ASSERT_EQ(now.oldest_gen, ptrs[c].gen);
    });
  }

  // Points copy `c` past the end of its member.
  void MakeOutside(u32 c) {
    EditExtent([&](data::Extent& e) { e.ptrs[c].offset = 1ull << 40; });
  }

  // The bucket copy `c` lies in.
  static u64 BucketOf(testing::MountedFs& m, const data::Extent::Ptr& p) {
    u64 b = 0;
    EXPECT_TRUE(data::PtrBucket(m.store->sb(), p, &b));
    return b;
  }
  // The live and cached blocks counted in copy c's bucket.
  std::pair<u32, u32> Counts(testing::MountedFs& m, u32 c) {
    u32 live = 0, cached = 0;
    m.data.BucketCounts(ptrs[c].dev, BucketOf(m, ptrs[c]), &live, &cached);
    return {live, cached};
  }

  // The backpointers tree: what the extents imply, nothing else; one per
  // copy that is not cached, on the copies' members (`devs`, any order).
  void ExpectBackpointers(std::vector<u32> devs) {
    WithFs([&](testing::MountedFs& m) {
      std::vector<std::string> bad;
      data::BackpointerCheckStats stats;
      ASSERT_TRUE(data::CheckBackpointers(&m.store->btrees(), m.store->sb(),
                                          [](void* ctx, const data::BackpointerMismatch& x) {
                                            static_cast<std::vector<std::string>*>(ctx)->push_back(
                                                std::to_string(x.kind) + "@" + std::to_string(x.pos.inode) + ":" +
                                                std::to_string(x.pos.offset));
                                            return Status::Ok();
                                          },
                                          &bad, &stats).ok());
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
      std::sort(devs.begin(), devs.end());  // (the tree's order: by member)
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
      EXPECT_EQ(m.data.GetStats().read_retries, 0u);
    });
  }
};

std::string Str(u64 v) { return std::to_string(v); }

TEST(CopiesTest, TwoCopiesOnDistinctMembersReadAndCheckClean) {
  Copies t;
  EXPECT_NE(t.ptrs[0].dev, t.ptrs[1].dev);
  EXPECT_FALSE(t.ptrs[0].cached || t.ptrs[1].cached);
  auto [r, out] = t.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_EQ(r.errors, 0u) << out;
  EXPECT_EQ(out.find("holds no extent"), std::string::npos) << out;  // both buckets count
  EXPECT_NE(out.find("backpointers: 2 keys, 2 implied by the pointers of 1 extents"), std::string::npos) << out;
  t.ExpectContent(2, t.ptrs[0].dev);
  t.ExpectBackpointers({t.ptrs[0].dev, t.ptrs[1].dev});
}

TEST(CopiesTest, AReadFallsBackToTheGoodCopy) {
  Copies t;
  t.Damage(0, 1);
  t.WithFs([&](testing::MountedFs& m) {
    std::string got(t.content.size(), '\0');
    auto r = m.fs.Read(t.ino, 0, got.data(), u32(got.size()));
    ASSERT_TRUE(r.ok()) << r.status().Message();
    EXPECT_TRUE(got == t.content);
    const data::Stats s = m.data.GetStats();
    EXPECT_EQ(s.csum_errors, 1u);
    EXPECT_EQ(s.read_retries, 1u);
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

// A plain and a compressed copy of the same blocks: each one alone reads the
// file, whichever is listed first.
TEST(CopiesTest, APlainAndACompressedCopyEachReadTheFile) {
  for (bool compressed_first : {false, true}) {
    SCOPED_TRACE(compressed_first ? "compressed first" : "plain first");
    Copies t({CopySpec{.compressed = true}}, compressed_first);
    const u32 plain = compressed_first ? 1 : 0, zstd = 1 - plain;
    ASSERT_TRUE(t.ptrs[zstd].compressed);
    ASSERT_FALSE(t.ptrs[plain].compressed);
    auto [r, out] = t.Fsck(false);
    EXPECT_EQ(r.exit_code, kExitClean) << out;
    // The first copy damaged: the other reads the file.
    t.Damage(0, 1);
    t.WithFs([&](testing::MountedFs& m) {
      std::string got(t.content.size(), '\0');
      auto rd = m.fs.Read(t.ino, 0, got.data(), u32(got.size()));
      ASSERT_TRUE(rd.ok()) << rd.status().Message();
      EXPECT_TRUE(got == t.content);
      const data::Stats s = m.data.GetStats();
      EXPECT_EQ(s.read_retries, 1u);
      EXPECT_GE(s.csum_errors, 1u);
      // The compressed copy read (and decompressed) only when the plain one failed.
      EXPECT_EQ(s.compressed_reads, compressed_first ? 0u : 1u);
    });
    t.Damage(0, 1);  // (undone: the first copy reads again)
    t.WithFs([&](testing::MountedFs& m) {
      std::string got(t.content.size(), '\0');
      ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
      EXPECT_TRUE(got == t.content);
      EXPECT_EQ(m.data.GetStats().read_retries, 0u);
      EXPECT_EQ(m.data.GetStats().compressed_reads, compressed_first ? 1u : 0u);
    });
  }
}

// Step 6b's repair of mixed copies (docs/design/copies.md, "Step 6b"): a
// bad copy is rewritten as its good source is stored -- from a compressed
// copy, a compressed clone (its blob whole); from a plain one, plain blocks
// sharing the extent's crcs -- on its own member; a bad cached copy is
// dropped, not rewritten. Each time the file reads without a retry after,
// the cached count leaves the dropped copy's bucket, and fsck is clean.
TEST(CopiesTest, ARepairRewritesABadCopyAsItsSourceIsStoredAndDropsABadCachedOne) {
  struct Case {
    const char* name;
    std::vector<CopySpec> more;
    bool last_first;
  };
  const Case cases[] = {
      {"plain bad, compressed source", {CopySpec{.compressed = true}}, false},
      {"compressed bad, plain source", {CopySpec{.compressed = true}}, true},
      {"cached bad", {CopySpec{.cached = true}}, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Copies t(c.more, c.last_first);
    ASSERT_EQ(t.ptrs.size(), 2u);
    const data::Extent::Ptr bad = t.ptrs[0], source = t.ptrs[1];
    t.Damage(0, 1);
    t.WithFs([&](testing::MountedFs& m) {
      std::string got(t.content.size(), '\0');
      ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
      EXPECT_TRUE(got == t.content);
      EXPECT_EQ(m.data.GetStats().repairs_queued, 1u);
      const u64 b = Copies::BucketOf(m, bad);
      EXPECT_EQ(m.fs.RepairQueued(4), 1u);
      const data::Stats s = m.data.GetStats();
      std::vector<u8> v;
      const data::Extent e = Copies::ExtentOf(m, t.ino, &v);
      if (bad.cached) {
        EXPECT_EQ(s.repair_cached_dropped, 1u);
        EXPECT_EQ(s.repaired, 0u);
        ASSERT_EQ(e.nr_ptrs, 1u);
        EXPECT_EQ(e.ptrs[0].offset, source.offset);
        u32 live = 0, cached = 0;
        m.data.BucketCounts(bad.dev, b, &live, &cached);
        EXPECT_EQ(cached, 0u);
      } else {
        EXPECT_EQ(s.repaired, 1u);
        ASSERT_EQ(e.nr_ptrs, 2u);
        EXPECT_EQ(e.ptrs[0].dev, bad.dev);
        EXPECT_NE(e.ptrs[0].offset, bad.offset);
        EXPECT_EQ(e.ptrs[0].compressed, source.compressed);
        EXPECT_EQ(e.HasPlain(), !source.compressed);
        if (source.compressed) {
          EXPECT_EQ(e.ptrs[0].crc, source.crc);
          EXPECT_EQ(e.ptrs[0].disk_bytes, source.disk_bytes);
        }
      }
      EXPECT_EQ(s.repair_failed, 0u);
      ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
      EXPECT_TRUE(got == t.content);
      EXPECT_EQ(m.data.GetStats().read_retries, s.read_retries);
      // The counts and the replicas totals are what the extents say.
      u64 counts = 0, totals = 0;
      ASSERT_TRUE(m.data.VerifyAgainstExtents(&counts, &totals).ok());
      EXPECT_EQ(counts, 0u);
      EXPECT_EQ(totals, 0u);
    });
    auto [r, out] = t.Fsck(false);
    EXPECT_EQ(r.exit_code, kExitClean) << out;
  }
}

// A cached copy counts its blocks as cached in its bucket, never as live;
// the authoritative copy counts them live -- after the commit, across a
// remount, and after punches (which release both), the last of which frees
// the cached copy's bucket.
TEST(CopiesTest, CachedCopiesCountApartAcrossRemountsAndPunches) {
  Copies t({CopySpec{.cached = true}});
  ASSERT_FALSE(t.ptrs[0].cached);
  ASSERT_TRUE(t.ptrs[1].cached);
  auto expect = [&](testing::MountedFs& m, u32 blocks) {
    EXPECT_EQ(t.Counts(m, 0), (std::pair<u32, u32>{blocks, 0}));
    EXPECT_EQ(t.Counts(m, 1), (std::pair<u32, u32>{0, blocks}));
  };
  t.WithFs([&](testing::MountedFs& m) {
    expect(m, kBlocks);
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0, data::kBlockSize).ok());
    expect(m, kBlocks - 1);
  });
  t.WithFs([&](testing::MountedFs& m) {
    expect(m, kBlocks - 1);  // what the extents say at mount
    const u64 b = Copies::BucketOf(m, t.ptrs[1]);
    ASSERT_EQ(m.store->alloc().Get(t.ptrs[1].dev, b).state, alloc::BucketState::kUser);
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0,
                               kBlocks * data::kBlockSize).ok());
    expect(m, 0);
    // Nothing holds the cached copy's bucket any more (no write point since the remount).
    EXPECT_NE(m.store->alloc().Get(t.ptrs[1].dev, b).state, alloc::BucketState::kUser);
  });
  auto [r, out] = t.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
}

// fsck -y's rebuild of the allocation state counts what the data path
// counts (docs/design/copies.md, "As built: step 3b-1"): per bucket, the
// file blocks of every pointer not cached as live sectors and of every
// current cached one as cached sectors -- logical sectors, a piece of a
// split blob counting its own blocks (not its blob's from the start, nor a
// compressed blob whole per piece). Here an extent of a plain copy, a cached
// copy and a compressed copy, split by a punch into two pieces; a hostile
// record makes fsck -y rebuild; then every bucket's record says exactly
// what the data path counts.
TEST(CopiesTest, FsckRebuildCountsWhatTheDataPathCounts) {
  Copies t({CopySpec{.cached = true}, CopySpec{.compressed = true}});
  ASSERT_EQ(t.ptrs.size(), 3u);
  ASSERT_TRUE(t.ptrs[1].cached);
  ASSERT_TRUE(t.ptrs[2].compressed);
  t.WithFs([&](testing::MountedFs& m) {
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, data::kBlockSize,
                               data::kBlockSize).ok());
    std::vector<u8> v;
    const data::Extent e = Copies::ExtentOf(m, t.ino, &v);
    ASSERT_EQ(e.blocks(), 1u);  // the first piece; the second ends the file
    ASSERT_EQ(e.nr_ptrs, 3u);
    // Hostile: an unknown state in the record of the plain copy's bucket.
    const u64 b = Copies::BucketOf(m, t.ptrs[0]);
    alloc::AllocRecord rec;
    alloc::EncodeRecord(m.store->alloc().Get(t.ptrs[0].dev, b), &rec);
    rec.state = 9;
    btree::Transaction tx(&m.store->btrees());
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, t.ptrs[0].dev, b}, &rec, sizeof(rec)).ok());
    ASSERT_TRUE(tx.Commit().ok());
  });
  auto [r, out] = t.Fsck(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << out;
  EXPECT_NE(out.find("rebuilt every member's allocation state"), std::string::npos) << out;
  t.WithFs([&](testing::MountedFs& m) {
    // The rebuild's counts and accounting totals are the extents'.
    u64 counts = 0, totals = 0;
    ASSERT_TRUE(m.data.VerifyAgainstExtents(&counts, &totals).ok());
    EXPECT_EQ(counts, 0u);
    EXPECT_EQ(totals, 0u);
    // Every bucket's counts are the extents' recount (and the allocator's
    // kept sums its buckets').
    const auto recount = RecountExtents(m);
    u64 buckets = 0;
    for (u32 d = 0; d < t.members(); d++) {
      EXPECT_TRUE(m.store->alloc().SumsMatchScan(d)) << "member " << d;
      for (u64 b = 0; b < m.store->alloc().nbuckets(d); b++) {
        const alloc::Bucket k = m.store->alloc().Get(d, b);
        auto w = recount.find({d, b});
        const std::pair<u64, u64> want = w == recount.end() ? std::pair<u64, u64>{0, 0} : w->second;
        EXPECT_EQ((std::pair<u64, u64>{k.live_sectors, k.cached_sectors}), want)
            << "member " << d << " bucket " << b << " (" << alloc::BucketStateName(k.state) << ")";
        buckets += k.state == alloc::BucketState::kUser;
      }
    }
    EXPECT_EQ(buckets, 3u);
    // The two pieces hold 2 blocks: live on the plain and the compressed
    // copies' members, cached on the cached copy's.
    auto rec = [&](u32 c) { return m.store->alloc().Get(t.ptrs[c].dev, Copies::BucketOf(m, t.ptrs[c])); };
    EXPECT_EQ(rec(0).live_sectors, 2u * 8);
    EXPECT_EQ(rec(0).cached_sectors, 0u);
    EXPECT_EQ(rec(1).live_sectors, 0u);
    EXPECT_EQ(rec(1).cached_sectors, 2u * 8);
    EXPECT_EQ(rec(2).live_sectors, 2u * 8);
  });
  auto [r2, out2] = t.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
}

// A copy added to an extent whose blob the accounting counts already (here
// another file's extent on the other member: the copy reserved nothing)
// counts its blocks live in that bucket as the commit applies, as the next
// mount counts them; a punch of either extent then uncounts only its own,
// and the other's data stays.
TEST(CopiesTest, ACopyOfACommittedBlobCountsLive) {
  Copies t({}, false, 2);  // f: one copy, two members
  u32 dev = 0;
  u64 gino = 0, gb = 0;
  t.WithFs([&](testing::MountedFs& m) {
    dev = 1 - t.ptrs[0].dev;
    auto g = m.fs.Mknod(posix::kRootIno, "g", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
    ASSERT_TRUE(g.ok());
    gino = g.value().ino;
    {
      btree::Transaction tx(&m.store->btrees());
      data::Delta delta;
      ASSERT_TRUE(m.data.QueueWrite(Copies::On(dev), &tx, gino, 0, reinterpret_cast<const u8*>(t.content.data()),
                                    kBlocks, &delta).ok());
      ASSERT_TRUE(m.data.Commit(Copies::On(dev), &tx, delta).ok());
    }
    std::vector<u8> gv, fv;
    const data::Extent ge = Copies::ExtentOf(m, gino, &gv);
    const data::Extent fe = Copies::ExtentOf(m, t.ino, &fv);
    ASSERT_EQ(ge.ptrs[0].dev, dev);
    gb = Copies::BucketOf(m, ge.ptrs[0]);
    u32 live, cached;
    m.data.BucketCounts(dev, gb, &live, &cached);
    ASSERT_EQ(live, kBlocks);
    // g's blob becomes f's second copy: nothing reserved, kBlocks live more.
    u8 buf[data::kExtentValueMax];
    auto len = data::AddPtr(fe, ge.ptrs[0], ge.crcs, buf);
    ASSERT_TRUE(len.ok());
    btree::Transaction tx(&m.store->btrees());
    ASSERT_TRUE(tx.Set(Copies::At(t.ino, fe.end), buf, len.value()).ok());
    data::Extent now;
    ASSERT_TRUE(data::ParseExtent(Copies::At(t.ino, fe.end), buf, len.value(), &now).ok());
    data::Delta delta;
    delta.ino = t.ino;
    ASSERT_TRUE(delta.changes
                    .PushBack(data::Delta::Change{.dev = dev, .bucket = gb, .blocks = kBlocks, .gen = ge.ptrs[0].gen})
                    .ok());
    ASSERT_TRUE(data::MoveSet(m.store->sb(), fe, now, &delta).ok());
    ASSERT_TRUE(m.data.Commit(Copies::On(dev), &tx, delta).ok());
    m.data.BucketCounts(dev, gb, &live, &cached);
    EXPECT_EQ(live, 2 * kBlocks);
    EXPECT_EQ(cached, 0u);
  });
  t.WithFs([&](testing::MountedFs& m) {
    u32 live, cached;
    m.data.BucketCounts(dev, gb, &live, &cached);
    EXPECT_EQ(live, 2 * kBlocks);  // the mount counts what the commit counted
    // f goes: g's blocks stay counted, and read.
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0,
                               kBlocks * data::kBlockSize).ok());
    m.data.BucketCounts(dev, gb, &live, &cached);
    EXPECT_EQ(live, kBlocks);
    EXPECT_EQ(m.store->alloc().Get(dev, gb).state, alloc::BucketState::kUser);
    std::string got(t.content.size(), '\0');
    ASSERT_TRUE(m.data.ReadBlocks(data::kForegroundRead, gino, 0, kBlocks, reinterpret_cast<u8*>(got.data())).ok());
    EXPECT_TRUE(got == t.content);
    // Then g: nothing is left, and nothing went below zero.
    btree::Transaction tx(&m.store->btrees());
    data::Delta delta;
    ASSERT_TRUE(m.data.QueuePunch(&tx, gino, 0, kBlocks, &delta).ok());
    ASSERT_TRUE(m.data.Commit(Copies::On(dev), &tx, delta).ok());
    m.data.BucketCounts(dev, gb, &live, &cached);
    EXPECT_EQ(live, 0u);
    EXPECT_NE(m.store->alloc().Get(dev, gb).state, alloc::BucketState::kUser);
  });
}

// The test points of CopyRacingItsPunch: holds the thread that asked at
// the data path's "commit.applying" until released; at the btree's
// "commit.journaled" in the armed thread, releases it and waits until its
// commit returned or it freed the bucket (whichever comes: before the fix
// its free's record commit waits for the commit_mu the armed thread holds).
struct PunchRace {
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id puncher, armed;
  bool reached = false, released = false, applied = false;
  alloc::Allocator* alloc = nullptr;
  u32 dev = 0;
  u64 bucket = 0;

  static void DataPoint(void* ctx, const char* point) {
    auto* r = static_cast<PunchRace*>(ctx);
    std::unique_lock<std::mutex> l(r->mu);
    if (std::this_thread::get_id() != r->puncher || strcmp(point, "commit.applying") != 0 || r->reached) return;
    r->reached = true;
    r->cv.notify_all();
    r->cv.wait(l, [&] { return r->released; });
  }
  static void BtreePoint(void* ctx, const char* point) {
    auto* r = static_cast<PunchRace*>(ctx);
    {
      std::lock_guard<std::mutex> l(r->mu);
      if (std::this_thread::get_id() != r->armed || strcmp(point, "commit.journaled") != 0) return;
      r->armed = std::thread::id();
      r->released = true;
      r->cv.notify_all();
    }
    for (;;) {  // (under commit_mu: the allocator's mu_ comes after it)
      {
        std::lock_guard<std::mutex> l(r->mu);
        if (r->applied) return;
      }
      if (r->alloc->Get(r->dev, r->bucket).state != alloc::BucketState::kUser) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

// A new pointer into a committed blob (a gain without pending blocks)
// racing the punch of the blob's own extent (review 3b F3): g's punch
// publishes its bucket's count 0 and is held before its Apply; f's commit
// adding a copy of g's blob is journaled, and g's Apply -- which frees a
// bucket its commit emptied -- runs before f's publish. Before, the bucket
// was freed under f's staged record (checked builds stopped at
// PublishCounts' invariant; others kept the free, and f's new copy named a
// freed bucket: fsck found it stale). Now f's commit holds every bucket it
// gains in from before its commit: g's Apply leaves the bucket, f's count
// keeps it, and fsck is clean. A gain into a bucket already freed is
// refused (kAgain), not kCorrupt.
TEST(CopiesTest, ACopyOfACommittedBlobRacingItsPunchKeepsTheBucket) {
  Copies t({}, false, 2);  // f: one copy, two members
  u32 dev = 0;
  u64 gino = 0;
  t.WithFs([&](testing::MountedFs& m) {  // g's blob, on the other member (its write point let go at unmount)
    dev = 1 - t.ptrs[0].dev;
    auto g = m.fs.Mknod(posix::kRootIno, "g", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
    ASSERT_TRUE(g.ok());
    gino = g.value().ino;
    btree::Transaction tx(&m.store->btrees());
    data::Delta delta;
    ASSERT_TRUE(m.data.QueueWrite(Copies::On(dev), &tx, gino, 0, reinterpret_cast<const u8*>(t.content.data()),
                                  kBlocks, &delta).ok());
    ASSERT_TRUE(m.data.Commit(Copies::On(dev), &tx, delta).ok());
  });
  PunchRace race;
  store::OpenOptions so;
  so.btree.test_point = PunchRace::BtreePoint;
  so.btree.test_point_ctx = &race;
  {
    testing::MountedFs m(t.Devs(), so);
    ASSERT_TRUE(m.open());
    m.data.SetTestPointForTest(PunchRace::DataPoint, &race);
    std::vector<u8> gv, fv;
    const data::Extent ge = Copies::ExtentOf(m, gino, &gv);
    const data::Extent fe = Copies::ExtentOf(m, t.ino, &fv);
    ASSERT_EQ(ge.ptrs[0].dev, dev);
    const u64 gb = Copies::BucketOf(m, ge.ptrs[0]);
    race.alloc = &m.store->alloc();
    race.dev = dev;
    race.bucket = gb;
    // g's punch: published, held before its Apply.
    Status pst;
    std::thread punch([&] {
      {
        std::lock_guard<std::mutex> l(race.mu);
        race.puncher = std::this_thread::get_id();
      }
      btree::Transaction tx(&m.store->btrees());
      data::Delta delta;
      pst = m.data.QueuePunch(&tx, gino, 0, kBlocks, &delta);
      if (pst.ok()) pst = m.data.Commit(Copies::On(dev), &tx, delta);
      std::lock_guard<std::mutex> l(race.mu);
      race.applied = true;
    });
    {
      std::unique_lock<std::mutex> l(race.mu);
      race.cv.wait(l, [&] { return race.reached; });
    }
    u32 live, cached;
    m.data.BucketCounts(dev, gb, &live, &cached);
    ASSERT_EQ(live, 0u);  // published
    ASSERT_EQ(m.store->alloc().Get(dev, gb).state, alloc::BucketState::kUser);  // not freed yet
    // f's copy of g's blob, committed now.
    u8 buf[data::kExtentValueMax];
    auto len = data::AddPtr(fe, ge.ptrs[0], ge.crcs, buf);
    ASSERT_TRUE(len.ok());
    data::Extent now;
    ASSERT_TRUE(data::ParseExtent(Copies::At(t.ino, fe.end), buf, len.value(), &now).ok());
    btree::Transaction tx(&m.store->btrees());
    ASSERT_TRUE(tx.Set(Copies::At(t.ino, fe.end), buf, len.value()).ok());
    ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &fe, &now).ok());
    data::Delta delta;
    delta.ino = t.ino;
    ASSERT_TRUE(delta.changes
                    .PushBack(data::Delta::Change{.dev = dev, .bucket = gb, .blocks = kBlocks, .gen = ge.ptrs[0].gen})
                    .ok());
    ASSERT_TRUE(data::MoveSet(m.store->sb(), fe, now, &delta).ok());
    {
      std::lock_guard<std::mutex> l(race.mu);
      race.armed = std::this_thread::get_id();
    }
    Status fst = m.data.Commit(Copies::On(dev), &tx, delta);
    punch.join();
    ASSERT_TRUE(pst.ok()) << pst.Message();
    ASSERT_TRUE(fst.ok()) << fst.Message();
    // The bucket stays: f's copy counts in it, and reads.
    EXPECT_EQ(m.store->alloc().Get(dev, gb).state, alloc::BucketState::kUser);
    EXPECT_EQ(m.store->alloc().Get(dev, gb).gen, ge.ptrs[0].gen);
    m.data.BucketCounts(dev, gb, &live, &cached);
    EXPECT_EQ(live, kBlocks);
    m.data.SetTestPointForTest(nullptr, nullptr);
    // A gain into a bucket freed meanwhile is refused, as "look again": g's
    // blob again, after f's punch emptied and freed the bucket.
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0,
                               kBlocks * data::kBlockSize).ok());
    ASSERT_NE(m.store->alloc().Get(dev, gb).state, alloc::BucketState::kUser);
    const u64 refused = m.data.GetStats().gains_refused;
    btree::Transaction tx2(&m.store->btrees());
    ASSERT_TRUE(tx2.Set(Copies::At(t.ino, fe.end), buf, len.value()).ok());
    data::Delta d2;
    d2.ino = t.ino;
    ASSERT_TRUE(
        d2.changes.PushBack(data::Delta::Change{.dev = dev, .bucket = gb, .blocks = kBlocks, .gen = ge.ptrs[0].gen})
            .ok());
    EXPECT_EQ(m.data.Commit(Copies::On(dev), &tx2, d2).code(), Err::kAgain);
    EXPECT_EQ(m.data.GetStats().gains_refused, refused + 1);
    // ... and one naming no generation is a caller's bug.
    btree::Transaction tx3(&m.store->btrees());
    ASSERT_TRUE(tx3.Set(Copies::At(t.ino, fe.end), buf, len.value()).ok());
    data::Delta d3;
    d3.ino = t.ino;
    ASSERT_TRUE(d3.changes.PushBack(data::Delta::Change{.dev = dev, .bucket = gb, .blocks = kBlocks}).ok());
    EXPECT_EQ(m.data.Commit(Copies::On(dev), &tx3, d3).code(), Err::kInvalidArgument);
  }
  auto [r, out] = t.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
}

// A stale second pointer: fsck -n reports it, -y drops it (not the extent),
// and the next check is clean; the data reads from the first copy.
TEST(CopiesTest, FsckDropsAStaleSecondPointer) {
  Copies t;
  t.MakeStale(1);
  const std::string found = "stale extent pointer, inode " + Str(t.ino) + " at block 0 (copy 2 of 2)";
  const std::string dropped = "dropped 1 bad pointer of the extent of inode " + Str(t.ino) +
                              " at blocks [0, 3); its other copies keep the data";
  const Repair fix = ExpectReportedRepairedClean(t, found.c_str(), dropped.c_str());
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  EXPECT_EQ(fix.repair.find("data lost"), std::string::npos) << fix.repair;
  EXPECT_NE(fix.repair.find("backpointers: 1 keys, 1 implied by the pointers of 1 extents"), std::string::npos)
      << fix.repair;
  t.ExpectContent(1, t.ptrs[0].dev);
  t.ExpectBackpointers({t.ptrs[0].dev});
}

// The same with the first pointer stale: the second copy is what is left.
TEST(CopiesTest, FsckDropsAStaleFirstPointer) {
  Copies t;
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

// Two bad pointers of three, and of four (one of the good ones cached): both
// go in one repair, the rest keep their order and the data.
TEST(CopiesTest, FsckDropsTwoBadPointersOfThreeAndOfFour) {
  {
    Copies t({CopySpec{}, CopySpec{}});
    t.MakeStale(0);
    t.MakeOutside(1);
    auto [r, out] = t.Fsck(true);
    EXPECT_EQ(r.exit_code, kExitRepaired) << out;
    EXPECT_EQ(r.repaired, r.errors) << out;
    EXPECT_NE(out.find("dropped 2 bad pointers of the extent of inode " + Str(t.ino) +
                       " at blocks [0, 3); its other copies keep the data"),
              std::string::npos)
        << out;
    auto [r2, out2] = t.Fsck(false);
    EXPECT_EQ(r2.exit_code, kExitClean) << out << out2;
    t.ExpectContent(1, t.ptrs[2].dev);
    t.ExpectBackpointers({t.ptrs[2].dev});
  }
  {
    Copies t({CopySpec{}, CopySpec{.cached = true}, CopySpec{}});
    t.MakeStale(1);
    t.MakeStale(3);
    auto [r, out] = t.Fsck(true);
    EXPECT_EQ(r.exit_code, kExitRepaired) << out;
    EXPECT_NE(out.find("(copy 2 of 4)"), std::string::npos) << out;
    EXPECT_NE(out.find("(copy 4 of 4)"), std::string::npos) << out;
    EXPECT_NE(out.find("dropped 2 bad pointers"), std::string::npos) << out;
    auto [r2, out2] = t.Fsck(false);
    EXPECT_EQ(r2.exit_code, kExitClean) << out << out2;
    t.ExpectContent(2, t.ptrs[0].dev);
    t.WithFs([&](testing::MountedFs& m) {
      std::vector<u8> v;
      const data::Extent e = Copies::ExtentOf(m, t.ino, &v);
      ASSERT_EQ(e.nr_ptrs, 2u);
      EXPECT_EQ(e.ptrs[1].dev, t.ptrs[2].dev);
      EXPECT_TRUE(e.ptrs[1].cached);
      EXPECT_EQ(t.Counts(m, 0), (std::pair<u32, u32>{kBlocks, 0}));
      EXPECT_EQ(t.Counts(m, 2), (std::pair<u32, u32>{0, kBlocks}));
    });
    t.ExpectBackpointers({t.ptrs[0].dev});  // (the cached copy has none)
  }
}

// The only authoritative copy is bad and a good cached copy is left: -y
// promotes the cached copy (it holds the extent's bytes) instead of deleting
// the extent, in one line, and the file keeps its data.
TEST(CopiesTest, FsckPromotesTheGoodCachedCopyOfABadOne) {
  Copies t({CopySpec{.cached = true}});
  t.MakeStale(0);
  const std::string promoted = "data: dropped 1 bad pointer of the extent of inode " + Str(t.ino) +
                               " at blocks [0, 3) and promoted its cached copy on member " + Str(t.ptrs[1].dev) +
                               "\n";
  const Repair fix = ExpectReportedRepairedClean(t, "(copy 1 of 2)", promoted.c_str());
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  EXPECT_NE(fix.repair.find("data: promoted 1 cached copy whose authoritative copy was bad"), std::string::npos)
      << fix.repair;
  EXPECT_EQ(fix.repair.find("data lost"), std::string::npos) << fix.repair;
  t.ExpectContent(1, t.ptrs[1].dev);
  t.ExpectBackpointers({t.ptrs[1].dev});  // (not cached any more: it has one now)
  t.WithFs([&](testing::MountedFs& m) {
    std::vector<u8> v;
    EXPECT_FALSE(Copies::ExtentOf(m, t.ino, &v).ptrs[0].cached);
    EXPECT_EQ(t.Counts(m, 1), (std::pair<u32, u32>{kBlocks, 0}));  // live now
  });
}

// No good copy: the extent goes as a lost one does, and the line says why,
// copy by copy.
TEST(CopiesTest, FsckDeletesAnExtentWithNoGoodCopyAndSaysWhyForEach) {
  struct Case {
    std::vector<CopySpec> more;
    std::function<void(Copies&)> damage;
    const char* why;
  };
  const Case cases[] = {
      {{CopySpec{}},
       [](Copies& t) {
         t.MakeStale(0);
         t.MakeStale(1);
       },
       "copy 1 is in a bucket that holds other data now; copy 2 is in a bucket that holds other data now"},
      {{CopySpec{}},
       [](Copies& t) {
         t.MakeOutside(0);
         t.MakeStale(1);
       },
       "copy 1 points outside the buckets; copy 2 is in a bucket that holds other data now"},
      {{CopySpec{.cached = true}},
       [](Copies& t) {
         t.DropCache(1);
         t.MakeStale(0);
       },
       "copy 1 is in a bucket that holds other data now; copy 2 is a stale cached copy"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    Copies t(c.more);
    c.damage(t);
    auto [r2, out2] = t.Fsck(true);
    EXPECT_EQ(r2.exit_code, kExitRepaired) << out2;
    EXPECT_EQ(r2.repaired, r2.errors) << out2;
    EXPECT_NE(out2.find("data: deleted the extent of inode " + Str(t.ino) + " at blocks [0, 3): " + c.why +
                        " (data lost)"),
              std::string::npos)
        << out2;
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
}

// A cached copy whose bucket has another generation is stale: normal (the
// cache let the bucket go), not damage. It counts nowhere, fsck -n is clean
// and says how many there are, and fsck -y drops it without calling it a
// repair -- and, no stale pointer left, raises the bucket's oldest
// generation (the generation pass).
TEST(CopiesTest, AStaleCachedCopyIsNormal) {
  Copies t({CopySpec{.cached = true}});
  t.DropCache(1);
  t.WithFs([&](testing::MountedFs& m) {
    u64 counts = 0, totals = 0;
    ASSERT_TRUE(m.data.VerifyAgainstExtents(&counts, &totals).ok());
    EXPECT_EQ(counts, 0u);
    EXPECT_EQ(totals, 0u);
    EXPECT_NE(m.store->alloc().Get(t.ptrs[1].dev, Copies::BucketOf(m, t.ptrs[1])).state, alloc::BucketState::kUser);
  });
  auto [r1, out1] = t.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitClean) << out1;
  EXPECT_EQ(r1.errors, 0u) << out1;
  EXPECT_NE(out1.find("data: 1 stale cached pointer (their cache buckets hold other data now: not damage; fsck -y "
                      "drops them)"),
            std::string::npos)
      << out1;
  t.WithFs([&](testing::MountedFs& m) {
    EXPECT_EQ(t.Counts(m, 0), (std::pair<u32, u32>{kBlocks, 0}));
    EXPECT_EQ(t.Counts(m, 1), (std::pair<u32, u32>{0, 0}));
    EXPECT_NE(m.store->alloc().Get(t.ptrs[1].dev, Copies::BucketOf(m, t.ptrs[1])).state, alloc::BucketState::kUser);
    // Reads skip it; a punch does not uncount it.
    std::string got(t.content.size(), '\0');
    ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
    EXPECT_TRUE(got == t.content);
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0, data::kBlockSize).ok());
    EXPECT_EQ(t.Counts(m, 0), (std::pair<u32, u32>{kBlocks - 1, 0}));
  });
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_EQ(r2.errors, 0u) << out2;
  EXPECT_NE(out2.find("data: 1 stale cached pointer dropped"), std::string::npos) << out2;
  EXPECT_NE(out2.find("alloc: generation pass: the oldest generation of 1 bucket raised"), std::string::npos)
      << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  EXPECT_EQ(out3.find("stale cached"), std::string::npos) << out3;
  t.WithFs([&](testing::MountedFs& m) {
    std::vector<u8> v;
    const data::Extent e = Copies::ExtentOf(m, t.ino, &v);
    EXPECT_EQ(e.nr_ptrs, 1u);
    EXPECT_EQ(e.ptrs[0].dev, t.ptrs[0].dev);
    const alloc::Bucket k = m.store->alloc().Get(t.ptrs[1].dev, Copies::BucketOf(m, t.ptrs[1]));
    EXPECT_EQ(k.oldest_gen, k.gen);
  });
}

// The generation guard (docs/format/alloc.md, "Generations"): a stale
// cached pointer stays in its extent while its bucket is reused 300 times
// -- more than the 256 generations a u8 has -- and never looks current:
// the bucket's gen stops kGenGuard generations past the pointer's and the
// bucket waits, free, off the free list, across a remount too. fsck -n
// says so (a note); fsck -y drops the stale pointer and raises the oldest
// generation (the generation pass), and the bucket is allocated again.
// Without the guard the 256th reuse hands the bucket out at the pointer's
// generation, and the pointer would count and read as current.
TEST(CopiesTest, AStaleCachedPointerNeverLooksCurrentWhileItsBucketIsReused) {
  Copies t({CopySpec{.cached = true}});
  t.DropCache(1);
  const data::Extent::Ptr p = t.ptrs[1];
  const dev::DevMask member = dev::DevMask(1) << p.dev;
  u64 b = 0;
  t.WithFs([&](testing::MountedFs& m) {
    alloc::Allocator& a = m.store->alloc();
    b = Copies::BucketOf(m, p);
    u32 reused = 0;
    for (int i = 0; i < 300; i++) {
      ASSERT_TRUE(m.store->journal().Settle().ok());  // (the last free reusable: the allocator takes it first)
      Result<alloc::BucketRef> r = a.Allocate(member, 0, alloc::BucketState::kUser, alloc::Watermark::kForeground);
      ASSERT_TRUE(r.ok()) << r.status().Name();
      if (r->bucket == b) {
        reused++;
        ASSERT_FALSE(data::PtrCountsIn(p, true, r->gen)) << "reuse " << reused << ": the stale pointer is current";
      }
      ASSERT_TRUE(a.Free(*r).ok());
    }
    EXPECT_EQ(reused, alloc::kGenGuard - 1u);
    const alloc::Bucket k = a.Get(p.dev, b);
    EXPECT_EQ(k.state, alloc::BucketState::kFree);
    EXPECT_EQ(alloc::GenGap(k.gen, p.gen), alloc::kGenGuard);
    EXPECT_EQ(k.oldest_gen, p.gen);
    EXPECT_EQ(a.Stats().gen_guard_blocked, 1u);
  });
  t.WithFs([&](testing::MountedFs& m) {
    EXPECT_EQ(m.store->alloc().Usage(p.dev).gen_blocked, 1u) << "held back after a remount too";
    EXPECT_EQ(m.store->alloc().Stats().gen_guard_waiting, 1u);
    // statfs leaves it out of the free space (writes cannot have it).
    posix::StatFs st;
    ASSERT_TRUE(m.fs.GetStatFs(&st).ok());
    u64 free_buckets = 0;
    for (u32 d = 0; d < m.store->sb().nr_members; d++) {
      const alloc::DeviceUsage u = m.store->alloc().Usage(d);
      free_buckets += u.by_state[u32(alloc::BucketState::kFree)] - u.gen_blocked;
    }
    EXPECT_EQ(st.blocks_free, free_buckets * (m.store->sb().bucket_size / 4096) - m.data.GetStats().blocks_reserved);
    std::string got(t.content.size(), '\0');
    ASSERT_TRUE(m.fs.Read(t.ino, 0, got.data(), u32(got.size())).ok());
    EXPECT_TRUE(got == t.content);
  });
  auto [r1, out1] = t.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitClean) << out1;
  EXPECT_NE(out1.find("data: 1 stale cached pointer (their"), std::string::npos) << out1;
  EXPECT_NE(out1.find("alloc: 1 free bucket waits for a generation pass"), std::string::npos) << out1;
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_NE(out2.find("data: 1 stale cached pointer dropped"), std::string::npos) << out2;
  EXPECT_NE(out2.find("alloc: generation pass: the oldest generation of "), std::string::npos) << out2;
  EXPECT_NE(out2.find("(the buckets the generation guard held back are free again)"), std::string::npos) << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  EXPECT_EQ(out3.find("generation"), std::string::npos) << out3;
  t.WithFs([&](testing::MountedFs& m) {
    alloc::Allocator& a = m.store->alloc();
    EXPECT_EQ(a.Usage(p.dev).gen_blocked, 0u);
    const alloc::Bucket k = a.Get(p.dev, b);
    EXPECT_EQ(k.oldest_gen, k.gen);
    bool again = false;
    for (int i = 0; i < 8 && !again; i++) {  // (other free buckets may come first)
      Result<alloc::BucketRef> r = a.Allocate(member, 0, alloc::BucketState::kUser, alloc::Watermark::kForeground);
      ASSERT_TRUE(r.ok());
      again = r->bucket == b;
    }
    EXPECT_TRUE(again);
  });
}

// The guard broken (a hostile or damaged record whose oldest generation is
// newer than a stale cached pointer into its bucket): fsck -n calls it an
// error, naming the generations; -y drops the pointer, and the next check
// is clean.
TEST(CopiesTest, AStaleCachedPointerOlderThanItsBucketsOldestGenerationIsDamage) {
  Copies t({CopySpec{.cached = true}});
  t.DropCache(1);
  const data::Extent::Ptr p = t.ptrs[1];
  t.WithFs([&](testing::MountedFs& m) {
    const u64 b = Copies::BucketOf(m, p);
    const alloc::Bucket k = m.store->alloc().Get(p.dev, b);
    ASSERT_EQ(k.oldest_gen, p.gen);
    const alloc::OldestRaise raise{p.dev, b, k.gen};  // (what a pass that missed the pointer would do)
    ASSERT_TRUE(m.store->alloc().RaiseOldestGen(&raise, 1).ok());
  });
  const std::string found = "data: stale cached pointer older than its bucket's oldest generation, inode " +
                            Str(t.ino) + " at block 0 (copy 2 of 2)";
  const Repair fix = ExpectReportedRepairedClean(t, found.c_str(), "dropped 1 bad pointer");
  EXPECT_EQ(fix.fixed.repaired, fix.fixed.errors) << fix.repair;
  t.ExpectContent(1, t.ptrs[0].dev);
}

// A stale cached copy is normal (the cache let its bucket go), and so is
// the bucket then holding new data -- at the very blocks the stale copy
// points at. The new data's backpointer is the one the tree holds there:
// the stale copy has none to collide with (cached copies have none), so
// fsck -n is clean, and fsck -y's dropping of the stale pointer leaves the
// new extent's backpointer alone.
TEST(CopiesTest, AStaleCachedCopysBucketHoldingNewDataKeepsTheNewBackpointer) {
  Copies t({CopySpec{.cached = true}});
  t.DropCache(1);
  const data::Extent::Ptr p = t.ptrs[1];
  u64 g = 0;
  t.WithFs([&](testing::MountedFs& m) {
    ASSERT_NE(m.store->alloc().Get(p.dev, Copies::BucketOf(m, p)).state, alloc::BucketState::kUser);  // freed
    ASSERT_TRUE(m.store->journal().Settle().ok());  // (a freed bucket is reused once its free settled)
    auto f = m.fs.Mknod(posix::kRootIno, "g", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
    ASSERT_TRUE(f.ok());
    g = f.value().ino;
    // Writes on the stale copy's member (the file's foreground target)
    // until an extent starts at its blocks.
    const std::string n = "tierfs.foreground_target", label = m.store->sb().members[p.dev].label;
    ASSERT_TRUE(m.fs.SetXattr(g, n.data(), u32(n.size()), label.data(), u32(label.size()), 0,
                              posix::Filesystem::kFrontEndChecked).ok());
    bool there = false;
    for (u64 off = 0; !there && off < 4096; off += kBlocks) {
      ASSERT_TRUE(m.fs.Write(g, off * data::kBlockSize, t.content.data(), u32(t.content.size())).ok());
      ASSERT_TRUE(m.fs.Fsync(g).ok());
      btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
      ASSERT_TRUE(it.Seek(Copies::At(g, off + 1)).ok());
      ASSERT_TRUE(it.Valid() && it.pos().inode == g);
      data::Extent w;
      ASSERT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &w).ok());
      there = w.ptrs[0].dev == p.dev && w.ptrs[0].offset == p.offset;
    }
    ASSERT_TRUE(there);
  });
  auto [r1, out1] = t.Fsck(false);
  EXPECT_EQ(r1.exit_code, kExitClean) << out1;
  EXPECT_EQ(r1.errors, 0u) << out1;
  EXPECT_NE(out1.find("data: 1 stale cached pointer"), std::string::npos) << out1;
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  EXPECT_EQ(r2.errors, 0u) << out2;
  EXPECT_NE(out2.find("data: 1 stale cached pointer dropped"), std::string::npos) << out2;
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, kExitClean) << out3;
  t.WithFs([&](testing::MountedFs& m) {
    // The bucket's backpointers name the new file's extent there.
    struct Found {
      u64 block;
      u64 ino = 0;
    } found{p.offset / data::kBlockSize};
    ASSERT_TRUE(data::ForEachInBucket(&m.store->btrees(), m.store->sb(), p.dev, Copies::BucketOf(m, p),
                                      [](void* ctx, const data::Backpointer& bp) {
                                        auto* f = static_cast<Found*>(ctx);
                                        if (bp.block == f->block && bp.piece == 0) f->ino = bp.ino;
                                        return Status::Ok();
                                      },
                                      &found).ok());
    EXPECT_EQ(found.ino, g);
  });
}

// A cached pointer one generation ahead of its bucket (hostile, or a stale
// one after the u8 wraps) counts nowhere at mount, and the mount frees its
// bucket -- which makes the bucket's generation the pointer's. Once the
// bucket holds data again the pointer looks current, and a punch uncounts
// blocks never counted: the cache count stops at 0 (counted), never a crash.
TEST(CopiesTest, ACachedPointerCurrentAgainAfterItsBucketIsReusedPunchesSafely) {
  Copies t({CopySpec{.cached = true}});
  t.EditExtent([&](data::Extent& e) { e.ptrs[1].gen = u8(e.ptrs[1].gen + 1); });
  t.WithFs([&](testing::MountedFs& m) {  // its record counting nothing: the mount frees it
    const alloc::CountFix none{t.ptrs[1].dev, Copies::BucketOf(m, t.ptrs[1]), 0, 0};
    ASSERT_TRUE(m.store->alloc().RepairCounts(&none, 1).ok());
  });
  t.WithFs([&](testing::MountedFs& m) {
    const data::Extent::Ptr p = [&] {
      std::vector<u8> v;
      return Copies::ExtentOf(m, t.ino, &v).ptrs[1];
    }();
    const u64 b = Copies::BucketOf(m, p);
    ASSERT_NE(m.store->alloc().Get(p.dev, b).state, alloc::BucketState::kUser);  // freed at mount
    ASSERT_EQ(m.store->alloc().Get(p.dev, b).gen, p.gen);
    // Write on the pointer's member until its bucket holds data again (its
    // free settled first: a bucket is reused only then).
    ASSERT_TRUE(m.store->journal().Settle().ok());
    auto f = m.fs.Mknod(posix::kRootIno, "g", 1, posix::kModeReg | 0644, 0, posix::Caller{0, 0});
    ASSERT_TRUE(f.ok());
    const u64 g = f.value().ino;
    bool reused = false;
    for (u64 off = 0; !reused && off < (u64(1) << 20); off += kBlocks) {
      data::Prepared prep;
      data::Delta delta;
      const Status st = m.data.Prepare(Copies::On(p.dev), g, off, reinterpret_cast<const u8*>(t.content.data()),
                                       kBlocks, false, &prep, &delta);
      ASSERT_TRUE(st.ok()) << st.Name() << " at block " << off;
      data::Extent w;
      ASSERT_TRUE(data::ParseExtent(Copies::At(g, prep.items[0].end), prep.items[0].value, prep.items[0].len, &w).ok());
      u64 wb = 0;
      reused = w.ptrs[0].dev == p.dev && data::PtrBucket(m.store->sb(), w.ptrs[0], &wb) && wb == b;
      btree::Transaction tx(&m.store->btrees());
      for (const auto& item : prep.items) ASSERT_TRUE(tx.Set(Copies::At(g, item.end), item.value, item.len).ok());
      delta.ino = g;
      ASSERT_TRUE(m.data.Commit(Copies::On(p.dev), &tx, delta).ok());
    }
    ASSERT_TRUE(reused);
    const alloc::Bucket k = m.store->alloc().Get(p.dev, b);
    ASSERT_EQ(k.state, alloc::BucketState::kUser);
    ASSERT_EQ(k.gen, p.gen);  // the stale pointer looks current now
    // Punching the first file uncounts its cached blocks there: none were counted.
    ASSERT_TRUE(m.fs.Fallocate(t.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, 0,
                               u64(kBlocks) * data::kBlockSize).ok());
    EXPECT_EQ(m.store->alloc().Stats().cached_underflows, 1u);
    u32 live = 0, cached = 0;
    m.data.BucketCounts(p.dev, b, &live, &cached);
    EXPECT_EQ(cached, 0u);
    EXPECT_GT(live, 0u);  // the second file's data keeps its bucket
  });
}

// A read whose copies are one stale and one failing looks the extent up
// again before it reports the failure: an overwrite may have replaced the
// extent since the lookup (here a commit between the lookup and the reads
// makes the stale copy current again). If the second lookup finds the same
// extent, its stale copy is stale for good and the failure is the answer,
// after that one lookup.
TEST(CopiesTest, AReadWithAStaleCopyLooksAgainBeforeFailing) {
  Copies t;
  t.MakeStale(0);
  t.Damage(1, 1);
  t.WithFs([&](testing::MountedFs& m) {
    char buf[kBlocks * data::kBlockSize];
    EXPECT_EQ(m.fs.Read(t.ino, 0, buf, sizeof(buf)).status().code(), Err::kDataCorrupt);
    EXPECT_EQ(m.data.GetStats().stale_lookups, 1u);
  });
  t.WithFs([&](testing::MountedFs& m) {
    struct Hook {
      testing::MountedFs* m;
      u64 ino;
      u8 gen;
      int calls = 0;
    } hook{&m, t.ino, t.ptrs[0].gen};
    m.data.SetLookupHookForTest([](void* ctx) {
      auto* h = static_cast<Hook*>(ctx);
      if (h->calls++ > 0) return;
      std::vector<u8> v;
      data::Extent e = Copies::ExtentOf(*h->m, h->ino, &v);
      e.ptrs[0].gen = h->gen;
      u8 buf[data::kExtentValueMax];
      auto len = data::BuildExtent(e, buf);
      ASSERT_TRUE(len.ok());
      btree::Transaction tx(&h->m->store->btrees());
      ASSERT_TRUE(tx.Set(Copies::At(h->ino, e.end), buf, len.value()).ok());
      ASSERT_TRUE(tx.Commit().ok());
    }, &hook);
    std::string got(t.content.size(), '\0');
    auto r = m.fs.Read(t.ino, 0, got.data(), u32(got.size()));
    m.data.SetLookupHookForTest(nullptr, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().Message();
    EXPECT_TRUE(got == t.content);
    EXPECT_EQ(hook.calls, 2);
    EXPECT_EQ(m.data.GetStats().stale_lookups, 1u);
  });
}

// A two-copy extent written by the data path carries a journal data check per
// copy: a power cut that kept the commit's (unordered) flush entry but not the
// second copy's blocks is caught at replay, which then keeps the extent as it
// was before -- never one pointing at blocks that never reached the disk.
TEST(CopiesTest, ReplayChecksEveryCopysDataAfterACut) {
  Copies t({}, false, 2);
  const std::string now(t.content.size(), 'n');
  std::vector<std::vector<u8>> images;
  data::Extent::Ptr lost{};
  t.WithFs([&](testing::MountedFs& m) {
    // Both copies, one Prepare each, in one extent: one item with two pointers.
    data::Delta delta;
    data::Prepared p[2];
    for (u32 d = 0; d < 2; d++)
      ASSERT_TRUE(m.data.Prepare(Copies::On(d), t.ino, 0, reinterpret_cast<const u8*>(now.data()), kBlocks, false,
                                 &p[d], &delta).ok());
    data::Extent x[2];
    for (u32 d = 0; d < 2; d++) {
      ASSERT_EQ(p[d].items.size(), 1u);
      ASSERT_TRUE(data::ParseExtent(Copies::At(t.ino, kBlocks), p[d].items[0].value, p[d].items[0].len, &x[d]).ok());
    }
    auto len = data::AddPtr(x[0], x[1].ptrs[0], x[1].crcs, p[0].items[0].value);
    ASSERT_TRUE(len.ok());
    p[0].items[0].len = len.value();
    lost = x[1].ptrs[0];
    btree::Transaction tx(&m.store->btrees());
    ASSERT_TRUE(m.data.QueuePrepared(&tx, p[0], data::Policy{}, &delta).ok());
    ASSERT_TRUE(m.data.Commit(Copies::On(0), &tx, delta, journal::CommitMode::kFlush).ok());
    images = userspace::MemDevice::SnapshotDurable({t.mems[0].get(), t.mems[1].get()});
  });
  // The cut kept the entry, and the first copy, but not the second copy's
  // blocks (as a cache that had not written them yet): the members as they
  // were then (not what the unmount wrote after), the blocks zero.
  ASSERT_EQ(images.size(), 2u);
  std::vector<u8>& img = images[lost.dev];
  memset(img.data() + lost.offset, 0, kBlocks * data::kBlockSize);
  for (u32 d = 0; d < 2; d++) t.mems[d]->WriteRaw(0, images[d].data(), images[d].size());
  store::Store s;
  store::OpenOptions oo;
  oo.read_only = true;
  store::OpenReport rep;
  ASSERT_TRUE(testing::OpenStore(&s, t.Devs(), oo, &rep).ok());
  EXPECT_NE(rep.replay.unverified_seq, 0u);
  EXPECT_GE(rep.replay.checked_bytes, 2u * kBlocks * data::kBlockSize);
  btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
  ASSERT_TRUE(it.Seek(Copies::At(t.ino, 0)).ok());
  ASSERT_TRUE(it.Valid() && it.pos().inode == t.ino);
  data::Extent e;
  ASSERT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
  EXPECT_EQ(e.nr_ptrs, 1u);  // the extent from before the cut
  EXPECT_EQ(e.ptrs[0].offset, t.ptrs[0].offset);
  EXPECT_TRUE(s.Close().ok());
}

// The extent's policy (data/policy.h) and its superblock feature
// (kSbExtentPolicy): a policy this filesystem can hold checks clean and
// keeps the feature; one it cannot (a target naming no member) is reported
// and reset to unset by -y -- the extent and its data kept; with no policy
// left, -y clears the feature (a note), and the feature missing while an
// extent records a policy is an error -y repairs.
TEST(CopiesTest, FsckResetsABadPolicyAndTheFeatureFollowsThePolicies) {
  Copies t(std::vector<CopySpec>{});
  auto flag = [&] {
    sb::Superblock s;
    EXPECT_TRUE(sb::Read(*t.Member(0), &s).ok());
    return (s.flags & sb::kSbExtentPolicy) != 0;
  };
  auto drop_flag = [&] {
    for (u32 m = 0; m < t.members(); m++) {
      sb::Superblock s;
      ASSERT_TRUE(sb::Read(*t.Member(m), &s).ok());
      s.flags &= u16(~sb::kSbExtentPolicy);
      s.seq++;
      ASSERT_TRUE(sb::Write(*t.Member(m), s, u16(m)).ok());
    }
  };
  auto policy = [&] {
    data::Policy p;
    t.WithFs([&](testing::MountedFs& m) {
      std::vector<u8> v;
      p = Copies::ExtentOf(m, t.ino, &v).policy;
    });
    return p;
  };
  const data::Policy good{u16(data::kTargetMember + 0), 0, 1, data::kCompressNone, data::kPolicyIncompressible, 0};
  t.EditExtent([&](data::Extent& e) { e.policy = good; });
  EXPECT_TRUE(flag());  // (the mounts record it)
  auto [r1, out1] = t.Fsck(true);
  EXPECT_EQ(r1.exit_code, fsck::kExitClean) << out1;
  EXPECT_EQ(out1.find("extent-policy flag"), std::string::npos) << out1;
  EXPECT_TRUE(flag());
  EXPECT_EQ(policy(), good);

  // A target code naming no member (one member here): reset, data kept.
  t.EditExtent([&](data::Extent& e) { e.policy.bg_target = data::kTargetMember + 7; });
  fsck::fixture::ExpectReportedRepairedClean(t, "records a policy this filesystem cannot hold",
                                             "reset the policy of the extent");
  EXPECT_EQ(policy(), data::Policy{});
  t.WithFs([&](testing::MountedFs& m) {
    std::string back(t.content.size(), '\0');
    ASSERT_EQ(m.fs.Read(t.ino, 0, back.data(), u32(back.size())).value(), back.size());
    EXPECT_TRUE(back == t.content);
  });

  // No policy left: -y clears the feature and says so; the next mount sets it.
  auto [r2, out2] = t.Fsck(true);
  EXPECT_EQ(r2.exit_code, fsck::kExitClean) << out2;
  EXPECT_NE(out2.find("cleared the extent-policy flag, which nothing uses"), std::string::npos) << out2;
  EXPECT_FALSE(flag());

  // The feature lost while a policy exists: an error, -y sets it.
  t.EditExtent([&](data::Extent& e) { e.policy = good; });
  drop_flag();
  auto [r3, out3] = t.Fsck(false);
  EXPECT_EQ(r3.exit_code, fsck::kExitUncorrected) << out3;
  EXPECT_NE(out3.find("the extent-policy flag is missing"), std::string::npos) << out3;
  EXPECT_FALSE(flag()) << "fsck -n wrote";
  auto [r4, out4] = t.Fsck(true);
  EXPECT_EQ(r4.exit_code, fsck::kExitRepaired) << out4;
  EXPECT_NE(out4.find("set the extent-policy flag"), std::string::npos) << out4;
  EXPECT_TRUE(flag());
  EXPECT_EQ(t.Fsck(false).first.exit_code, fsck::kExitClean);
}

}  // namespace

}  // namespace tfs
