// Backpointers on a mounted filesystem and under fsck (issue 21 step 4;
// docs/design/copies.md "As built: step 4"): after every kind of extent
// change -- writes, overwrites that split extents (plain and compressed),
// punch, truncate, fallocate, unlink of a closed and of an open file -- the
// tree holds exactly what the extents imply (data::CheckBackpointers, the
// check fsck runs), also after a remount and after power cuts at every
// point of a workload; the largest transactions the write path makes (a 1
// MiB overwrite of 256 four-copy extents on 64 KiB buckets) and the frees'
// batches over scattered four-copy extents fit the entry; damage to
// the tree is found by fsck -n, one line each, and repaired by -y; the
// namespace pass's extent repairs keep the tree in step themselves.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/backpointer.h"
#include "data/data.h"
#include "fsck/testing.h"

namespace tfs::fsck {
namespace {

using namespace fixture;  // NOLINT: the test images' helpers

// Four in-memory members formatted with 64 KiB buckets -- the smallest
// journal entries a transaction must fit -- and `replicas` data copies.
struct SmallBucketMembers {
  std::vector<std::unique_ptr<userspace::MemDevice>> members;
  std::vector<BlockDevice*> devs;
  store::FormatOptions fo;
};

Status FormatSmallBuckets(SmallBucketMembers* s, u8 replicas) {
  for (int i = 0; i < 4; i++) {
    s->members.push_back(testing::MemMember());
    s->devs.push_back(s->members.back().get());
  }
  s->fo = testing::SmallFormat();
  s->fo.bucket_size = 64 * 1024;
  s->fo.data_replicas = replicas;
  return testing::FormatMembers(s->devs, s->fo);
}

// The differences between the tree and the extents (empty: they agree), and
// how many backpointers the extents imply.
struct Agreement {
  std::vector<std::string> diffs;
  u64 expected = 0;
  u64 keys = 0;
};

Agreement Check(store::Store& s) {
  Agreement a;
  data::BackpointerCheckStats stats;
  Status st = data::CheckBackpointers(&s.btrees(), s.sb(), [](void* ctx, const data::BackpointerMismatch& m) {
    static const char* const kKinds[] = {"missing", "wrong", "stray", "shared"};
    static_cast<std::vector<std::string>*>(ctx)->push_back(std::string(kKinds[m.kind]) + " at member " +
                                                           std::to_string(m.pos.inode) + " offset " +
                                                           std::to_string(m.pos.offset));
    return Status::Ok();
  }, &a.diffs, &stats);
  EXPECT_TRUE(st.ok()) << st.Message();
  a.expected = stats.expected;
  a.keys = stats.keys;
  return a;
}

// Pointers of all extents (each has a backpointer on these images).
u64 Pointers(store::Store& s) {
  u64 n = 0;
  btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
  EXPECT_TRUE(it.SeekToFirst().ok());
  for (; it.Valid(); (void)it.Next()) {
    data::Extent e;
    EXPECT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
    n += e.nr_ptrs;
  }
  return n;
}

#define EXPECT_AGREE(store, what)                                                          \
  do {                                                                                     \
    const Agreement a_ = Check(store);                                                     \
    EXPECT_TRUE(a_.diffs.empty()) << (what) << ": " << a_.diffs.size() << " differences, " \
                                  << (a_.diffs.empty() ? "" : a_.diffs[0]);                \
    EXPECT_EQ(a_.keys, Pointers(store)) << (what);                                         \
  } while (0)

u64 MakeFile(Filesystem& fs, const std::string& name) {
  auto a = fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
  EXPECT_TRUE(a.ok());
  return a.ok() ? a.value().ino : 0;
}

std::string Pattern(u32 blocks, char c) {
  std::string s(blocks * data::kBlockSize, c);
  for (size_t i = 0; i < s.size(); i += 97) s[i] = char('A' + (i / 4096) % 26);
  return s;
}

// Every extent change posix makes, each followed by the check.
void Workload(Filesystem& fs, store::Store& s, bool check) {
  auto agree = [&](const char* what) {
    if (check) EXPECT_AGREE(s, what);
  };
  const u64 a = MakeFile(fs, "a");
  ASSERT_TRUE(fs.Write(a, 0, Pattern(40, 'a').data(), 40 * data::kBlockSize).ok());
  agree("write");
  ASSERT_TRUE(fs.Write(a, 10 * data::kBlockSize, Pattern(2, 'b').data(), 2 * data::kBlockSize).ok());
  agree("overwrite inside an extent (split in three)");
  ASSERT_TRUE(fs.Write(a, 4 * data::kBlockSize + 100, "xyz", 3).ok());  // a partial block: read, merged, rewritten
  agree("partial-block overwrite");
  const u64 z = MakeFile(fs, "z");
  ASSERT_TRUE(fs.SetFlags(z, Filesystem::kFsComprFl).ok());
  ASSERT_TRUE(fs.Write(z, 0, std::string(48 * data::kBlockSize, 'z').data(), 48 * data::kBlockSize).ok());
  ASSERT_TRUE(fs.Write(z, 20 * data::kBlockSize, Pattern(1, 'q').data(), data::kBlockSize).ok());
  agree("compressed write and a split of a compressed blob");
  ASSERT_TRUE(fs.Fallocate(a, posix::kFallocPunchHole | posix::kFallocKeepSize, 15 * data::kBlockSize,
                           9 * data::kBlockSize + 10)
                  .ok());
  agree("punch");
  ASSERT_TRUE(fs.Fallocate(a, 0, 60 * data::kBlockSize, 8 * data::kBlockSize).ok());
  ASSERT_TRUE(fs.Write(a, 62 * data::kBlockSize, Pattern(2, 'u').data(), 2 * data::kBlockSize).ok());
  agree("fallocate and a write into it");
  posix::SetAttr sa;
  sa.valid = posix::kSetSize;
  sa.size = 30 * data::kBlockSize + 5;
  ASSERT_TRUE(fs.SetAttrs(a, sa).ok());
  agree("truncate with a partial last block");
  sa.size = 7 * data::kBlockSize;
  ASSERT_TRUE(fs.SetAttrs(z, sa).ok());
  agree("truncate of a compressed file");
  // Many small extents, then freed: a closed file at unlink, an open one at release.
  const u64 m = MakeFile(fs, "many");
  for (u32 i = 0; i < 300; i += 2) ASSERT_TRUE(fs.Write(m, u64(i) * data::kBlockSize, "m", 1).ok());
  agree("many small extents");
  ASSERT_TRUE(fs.Unlink(posix::kRootIno, "many", 4).ok());
  agree("unlink");
  ASSERT_TRUE(fs.Open(z, 0).ok());
  ASSERT_TRUE(fs.Unlink(posix::kRootIno, "z", 1).ok());
  agree("unlink of an open file");
  ASSERT_TRUE(fs.Release(z).ok());
  agree("release of an unlinked file");
  const u64 b = MakeFile(fs, "b");
  ASSERT_TRUE(fs.Write(b, 0, Pattern(300, 'b').data(), 300 * data::kBlockSize).ok());
  ASSERT_TRUE(fs.Fsync(b).ok());
  agree("a large write");
}

TEST(BackpointersTest, FollowEveryExtentChange) {
  Image img;
  img.WithFs([&](Filesystem& fs, store::Store& s) { Workload(fs, s, true); });
  img.WithFs([&](Filesystem&, store::Store& s) {
    EXPECT_AGREE(s, "after a remount");
    EXPECT_GT(Pointers(s), 10u);
  });
  auto [r, out] = img.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find(", 0 problem(s)\n"), std::string::npos) << out;
}

// Power cuts during the workload: the durable state, or a torn mix of what
// was written since the last flush, replays to trees that agree (and check
// clean). Each cut is checked as it is taken.
void ExpectCutAgrees(const std::vector<u8>& cut, u64* nonempty) {
  Image after(cut);
  auto [r, out] = after.Fsck(false);  // (replays the journal in memory)
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  after.WithFs([&](Filesystem&, store::Store& s) {
    EXPECT_AGREE(s, "after the cut");
    *nonempty += Pointers(s) > 0;
  });
}

TEST(BackpointersTest, AgreeAfterPowerCuts) {
  Image base;
  Image img(base.dev->SnapshotDurable(), /*volatile_cache=*/true);
  u64 seed = 7, cuts = 0, nonempty = 0;
  img.WithFs([&](Filesystem& fs, store::Store&) {
    const u64 a = MakeFile(fs, "a");
    const u64 c = MakeFile(fs, "c");
    ASSERT_TRUE(fs.SetFlags(c, Filesystem::kFsComprFl).ok());
    std::mt19937_64 rng(1);
    for (int i = 0; i < 40 && !::testing::Test::HasFailure(); i++) {
      const u64 f = i % 3 == 2 ? c : a;
      const u32 at = u32(rng() % 64), n = 1 + u32(rng() % 20);
      switch (rng() % 4) {
        case 0:
        case 1:
          ASSERT_TRUE(fs.Write(f, u64(at) * data::kBlockSize, Pattern(n, char('a' + i % 26)).data(),
                               n * data::kBlockSize).ok());
          break;
        case 2:
          ASSERT_TRUE(fs.Fallocate(f, posix::kFallocPunchHole | posix::kFallocKeepSize, u64(at) * data::kBlockSize,
                                   u64(n) * data::kBlockSize).ok());
          break;
        default: {
          posix::SetAttr sa;
          sa.valid = posix::kSetSize;
          sa.size = u64(at) * data::kBlockSize + 99;
          ASSERT_TRUE(fs.SetAttrs(f, sa).ok());
        }
      }
      if (i % 5 == 4) {
        ASSERT_TRUE(fs.Fsync(f).ok());
      }
      if (i % 4 != 3) continue;
      SCOPED_TRACE("cuts after operation " + std::to_string(i));
      ExpectCutAgrees(img.dev->SnapshotDurable(), &nonempty);
      ExpectCutAgrees(userspace::MemDevice::SnapshotTorn({img.dev.get()}, seed++)[0], &nonempty);
      cuts += 2;
    }
  });
  EXPECT_EQ(cuts, 20u);
  EXPECT_GT(nonempty, 10u);  // the cuts kept data (fsyncs), not just empty files
}

// The largest transactions the write path makes: a 1 MiB overwrite of 256
// one-block extents with four copies each, on 64 KiB buckets (the
// smallest: their 64 KiB journal entries are the smallest a transaction
// must fit) -- in transactions of posix's write chunk there
// (DataPath::WriteBlocksFitting: with records, a fragmented file's 1 MiB
// would not fit one; the scattered case is
// BatchesOfScatteredFourCopyExtentsFitTheEntry, the staggered one
// AnOverwriteOfAFragmentedFourCopyFileOnStaggeredBucketsFitsItsTransactions).
// Each punches up to a chunk's extents and four backpointers each and sets
// new extents with theirs.
TEST(BackpointersTest, AMiBOverwriteOfManyFourCopyExtentsFitsItsTransactions) {
  SmallBucketMembers sm;
  ASSERT_TRUE(FormatSmallBuckets(&sm, 1).ok());
  std::vector<BlockDevice*>& devs = sm.devs;
  testing::MountedFs m(devs);
  ASSERT_TRUE(m.open());
  const u64 ino = MakeFile(m.fs, "f");
  constexpr u32 kN = 256;
  const std::string old = Pattern(kN, 'o');
  for (u32 i = 0; i < kN; i++)
    ASSERT_TRUE(m.fs.Write(ino, u64(i) * data::kBlockSize, old.data() + u64(i) * data::kBlockSize, data::kBlockSize)
                    .ok());
  // Three more copies of each, as copies_test.cc makes one (Prepare on the
  // member, AddPtr, the backpointers in the same transaction).
  for (u32 i = 0; i < kN; i++) {
    std::vector<u8> v;
    data::Extent e;
    {
      btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
      ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino, i + 1}).ok());
      ASSERT_TRUE(it.Valid() && it.pos().offset == i + 1);
      v.assign(it.value(), it.value() + it.val_bytes());
      ASSERT_TRUE(data::ParseExtent(it.pos(), v.data(), u32(v.size()), &e).ok());
    }
    ASSERT_EQ(e.nr_ptrs, 1u);
    data::Delta delta;
    u8 buf[data::kExtentValueMax];
    std::vector<u8> crcs(e.crcs, e.crcs + 4);
    data::Extent now = e;
    now.crcs = crcs.data();
    for (u8 dev = 0; dev < 4; dev++) {
      if (dev == e.ptrs[0].dev) continue;
      const data::IoContext ctx = {IoOrigin::kReconcile, dev::IoClass::kBackground, alloc::Watermark::kBackground,
                                   data::Target{data::TargetKind::kMember, dev}};
      data::Prepared p;
      ASSERT_TRUE(m.data.Prepare(ctx, ino, i, reinterpret_cast<const u8*>(old.data()) + u64(i) * data::kBlockSize, 1,
                                 false, &p, &delta).ok());
      data::Extent copy;
      ASSERT_TRUE(data::ParseExtent(btree::Pos{btree::kBtreeExtents, ino, p.items[0].end}, p.items[0].value,
                                    p.items[0].len, &copy).ok());
      ASSERT_EQ(copy.ptrs[0].dev, dev);
      auto len = data::AddPtr(now, copy.ptrs[0], copy.crcs, buf);
      ASSERT_TRUE(len.ok());
      std::vector<u8> nv(buf, buf + len.value());
      ASSERT_TRUE(data::ParseExtent(btree::Pos{btree::kBtreeExtents, ino, e.end}, nv.data(), u32(nv.size()), &now).ok());
      crcs.assign(now.crcs, now.crcs + 4);
      now.crcs = crcs.data();
    }
    ASSERT_EQ(now.nr_ptrs, 4u);
    const u32 len = data::BuildExtent(now, buf).value();
    btree::Transaction tx(&m.store->btrees());
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeExtents, ino, e.end}, buf, len).ok());
    ASSERT_TRUE(data::QueueBackpointers(&tx, m.store->sb(), &e, &now).ok());
    delta.ino = ino;
    delta.sectors = 0;
    ASSERT_TRUE(m.data.Commit(data::kForegroundWrite, &tx, delta).ok());
  }
  EXPECT_AGREE(*m.store, "256 four-copy extents");
  ASSERT_EQ(Pointers(*m.store), 4u * kN);
  // (Allocation records are committed apart, by the allocator: step 3a.)
  auto commits = [&] { return m.store->btrees().GetStats().commits - m.store->alloc().Stats().record_commits; };
  const u64 before = commits();
  const std::string neu = Pattern(kN, 'n');
  auto w = m.fs.Write(ino, 0, neu.data(), u32(neu.size()));
  ASSERT_TRUE(w.ok()) << w.status().Message();
  const u32 chunk = m.fs.WriteChunkOf(ino).value();
  EXPECT_EQ(commits(), before + (kN + chunk - 1) / chunk) << "transactions of " << chunk << " blocks";
  EXPECT_EQ(m.fs.GetStats().write_splits, 0u);
  EXPECT_AGREE(*m.store, "after the overwrite");
  std::string got(neu.size(), '\0');
  ASSERT_TRUE(m.fs.Read(ino, 0, got.data(), u32(got.size())).ok());
  EXPECT_TRUE(got == neu);
}

// Writes blocks [0, n) of each of the `files` files (four data replicas on
// four members: FormatSmallBuckets) as one-block extents, each in buckets no
// other extent uses: block i of each file, then the rest of the write
// point's four buckets (one per member) with a filler, so that the next
// block i lands in new ones. Checks the shape: n extents a file, 4 n
// distinct buckets.
void ScatterFourCopyBlocks(testing::MountedFs& m, const store::FormatOptions& fo, const u64* ino, int files, u32 n,
                           const std::string& block) {
  const u64 fill = MakeFile(m.fs, "fill");
  const u32 per_bucket = u32(fo.bucket_size / data::kBlockSize);
  const std::string rest = Pattern(per_bucket - u32(files), 'f');
  for (u32 i = 0; i < n; i++) {
    for (int k = 0; k < files; k++) {
      auto w = m.fs.Write(ino[k], u64(i) * data::kBlockSize, block.data(), u32(block.size()), Filesystem::kWriteDirect);
      ASSERT_TRUE(w.ok()) << w.status().Message();
    }
    auto w = m.fs.Write(fill, u64(i) * rest.size(), rest.data(), u32(rest.size()), Filesystem::kWriteDirect);
    ASSERT_TRUE(w.ok()) << w.status().Message();
  }
  for (int k = 0; k < files; k++) {
    std::set<std::pair<u32, u64>> buckets;
    u32 extents = 0;
    btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
    ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino[k], 0}).ok());
    for (; it.Valid() && it.pos().inode == ino[k]; (void)it.Next(), extents++) {
      data::Extent e;
      ASSERT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
      ASSERT_EQ(e.nr_ptrs, 4u);
      for (u32 p = 0; p < e.nr_ptrs; p++) buckets.insert({e.ptrs[p].dev, e.ptrs[p].offset / fo.bucket_size});
    }
    ASSERT_EQ(extents, n) << "file " << k;
    ASSERT_EQ(buckets.size(), 4u * n) << "file " << k;
  }
}

// Staggers the write point's four buckets (after ScatterFourCopyBlocks
// filled them to their ends): a block written with one copy, one with two,
// one with three -- the slots then stand 3, 2, 1 and 0 blocks into their
// buckets, so a four-copy write's copies cross bucket ends at four different
// blocks and its extents split at each (four times as many as with aligned
// buckets).
void StaggerWritePoint(testing::MountedFs& m) {
  const std::string one = Pattern(1, 's');
  for (int copies = 1; copies <= 3; copies++) {
    const u64 f = MakeFile(m.fs, "stagger" + std::to_string(copies));
    const std::string r = std::to_string(copies);
    ASSERT_TRUE(m.fs.SetXattr(f, "tierfs.replicas", 15, r.data(), u32(r.size()), 0, Filesystem::kFrontEndChecked).ok());
    ASSERT_TRUE(m.fs.Write(f, 0, one.data(), u32(one.size()), Filesystem::kWriteDirect).ok());
  }
}

// Writes `bytes` from offset 0 through the write buffer (an open file:
// 64 KiB writes fill runs, fsync writes the last out), then closes it.
void WriteBuffered(Filesystem& fs, u64 ino, const std::string& bytes) {
  ASSERT_TRUE(fs.OpenInode(ino).ok());
  constexpr u32 kPiece = 16 * data::kBlockSize;
  for (u64 off = 0; off < bytes.size(); off += kPiece) {
    auto b = fs.Write(ino, off, bytes.data() + off, u32(Min<u64>(kPiece, bytes.size() - off)));
    ASSERT_TRUE(b.ok()) << b.status().Message();
  }
  ASSERT_TRUE(fs.Fsync(ino).ok());
  EXPECT_TRUE(fs.Release(ino).ok());
}

u32 ExtentsOf(store::Store& s, u64 ino) {
  u32 n = 0;
  btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
  EXPECT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino, 0}).ok());
  for (; it.Valid() && it.pos().inode == ino; (void)it.Next()) n++;
  return n;
}

// Review 3b N1: the overwrite of a fragmented four-copy file -- 256
// one-block extents in buckets of their own -- by a write whose copies'
// buckets are staggered. The punch (a backpointer whiteout and a record per
// copy and extent) and the new extents (split at every copy's bucket end:
// ~4x as many pieces, each with four backpointers and four data checks)
// together did not fit posix's 512 KiB transactions in 64 KiB entries:
// the 1 MiB write failed with EFBIG at every try, direct or buffered.
// WriteBlocksFitting bounds both sides: each transaction fits the first time
// (no split).
TEST(BackpointersTest, AnOverwriteOfAFragmentedFourCopyFileOnStaggeredBucketsFitsItsTransactions) {
  SmallBucketMembers sm;
  ASSERT_TRUE(FormatSmallBuckets(&sm, 4).ok());
  testing::MountedFs m(sm.devs);
  ASSERT_TRUE(m.open());
  constexpr u32 kN = 256;
  u64 ino[2] = {MakeFile(m.fs, "direct"), MakeFile(m.fs, "buffered")};
  ASSERT_NO_FATAL_FAILURE(ScatterFourCopyBlocks(m, sm.fo, ino, 2, kN, Pattern(1, 'o')));
  ASSERT_NO_FATAL_FAILURE(StaggerWritePoint(m));
  const u32 chunk = m.fs.WriteChunkOf(ino[0]).value();
  EXPECT_LT(chunk, 128u);  // (posix's old 512 KiB, which N1 did not fit)
  // A file wanting one copy writes more blocks a transaction (its new
  // extents have one copy each; the old ones may have four).
  const u64 single = MakeFile(m.fs, "single");
  ASSERT_TRUE(m.fs.SetXattr(single, "tierfs.replicas", 15, "1", 1, 0, Filesystem::kFrontEndChecked).ok());
  EXPECT_GT(m.fs.WriteChunkOf(single).value(), chunk);
  const std::string neu = Pattern(kN, 'n');
  auto w = m.fs.Write(ino[0], 0, neu.data(), u32(neu.size()), Filesystem::kWriteDirect);
  ASSERT_TRUE(w.ok()) << w.status().Message();
  ASSERT_NO_FATAL_FAILURE(WriteBuffered(m.fs, ino[1], neu));
  EXPECT_GT(m.fs.GetStats().flushes_full + m.fs.GetStats().flushes_fsync, 0u);
  EXPECT_EQ(m.fs.GetStats().write_splits, 0u) << "chunk " << chunk;
  EXPECT_EQ(m.fs.GetStats().flush_errors, 0u);
  // Staggered indeed: far more pieces than 1 MiB in aligned 64 KiB buckets.
  EXPECT_GT(ExtentsOf(*m.store, ino[0]), 2 * kN / 16);
  EXPECT_AGREE(*m.store, "after the overwrites");
  for (u64 f : ino) {
    std::string got(neu.size(), '\0');
    ASSERT_TRUE(m.fs.Read(f, 0, got.data(), u32(got.size())).ok());
    EXPECT_TRUE(got == neu) << f;
  }
}

// A transaction the journal entry cannot hold after all (the chunk forced to
// 1 MiB over the same fragmented file and staggered buckets) is written and
// committed again in halves: the write succeeds, counted, the data and the
// backpointers are right, and the space the failed tries took went back.
TEST(BackpointersTest, AWriteTheJournalEntryCannotHoldIsDoneAgainInHalves) {
  SmallBucketMembers sm;
  ASSERT_TRUE(FormatSmallBuckets(&sm, 4).ok());
  const std::string neu = Pattern(256, 'n');
  u64 ino[2];
  {
    testing::MountedFs m(sm.devs);
    ASSERT_TRUE(m.open());
    ino[0] = MakeFile(m.fs, "direct");
    ino[1] = MakeFile(m.fs, "buffered");
    ASSERT_NO_FATAL_FAILURE(ScatterFourCopyBlocks(m, sm.fo, ino, 2, 256, Pattern(1, 'o')));
    ASSERT_NO_FATAL_FAILURE(StaggerWritePoint(m));
    m.fs.SetWriteChunkForTest(256);
    auto w = m.fs.Write(ino[0], 0, neu.data(), u32(neu.size()), Filesystem::kWriteDirect);
    ASSERT_TRUE(w.ok()) << w.status().Message();
    const u64 direct_splits = m.fs.GetStats().write_splits;
    EXPECT_GE(direct_splits, 1u);
    ASSERT_NO_FATAL_FAILURE(WriteBuffered(m.fs, ino[1], neu));
    EXPECT_GT(m.fs.GetStats().flushes_full + m.fs.GetStats().flushes_fsync, 0u);
    EXPECT_GT(m.fs.GetStats().write_splits, direct_splits) << "a 512 KiB run halved";
    EXPECT_EQ(m.fs.GetStats().flush_errors, 0u);
    EXPECT_AGREE(*m.store, "after the halved writes");
  }
  {
    // The counts the commits recorded are the extents' (no try that failed
    // moved one).
    testing::MountedFs m(sm.devs);
    ASSERT_TRUE(m.open());
    u64 counts = 0, totals = 0;
    ASSERT_TRUE(m.data.VerifyAgainstExtents(&counts, &totals).ok());
    EXPECT_EQ(counts, 0u);
    EXPECT_EQ(totals, 0u);
    for (u64 f : ino) {
      std::string got(neu.size(), '\0');
      ASSERT_TRUE(m.fs.Read(f, 0, got.data(), u32(got.size())).ok());
      EXPECT_TRUE(got == neu) << f;
    }
    EXPECT_AGREE(*m.store, "after a remount");
  }
  auto [rep, out] = RunFsck(sm.devs.data(), u32(sm.devs.size()), false);
  EXPECT_EQ(rep.exit_code, kExitClean) << out;
}

// The batches that free extents -- unlink, the mount's orphan pass,
// truncate (PunchPast and its last batch, with a partial tail block) and
// punch-hole -- and a 1 MiB overwrite, over files of 300 one-block
// extents, each in buckets no other extent of the file uses, four copies
// each, on 64 KiB buckets (the smallest journal entries). Every punched
// pointer costs a backpointer whiteout and its bucket a record, so a batch
// of 256 such extents is about 98 KiB: before review 3b F1 each of these
// failed with kTooBig at every try (unlink, truncate and the write EFBIG,
// and the orphan's filesystem failed every mount). Batches are bounded by
// journal bytes now, and writes go in transactions whose worst case fits
// the entry (WriteBlocksFitting): more of them, each fits.
TEST(BackpointersTest, BatchesOfScatteredFourCopyExtentsFitTheEntry) {
  SmallBucketMembers sm;
  ASSERT_TRUE(FormatSmallBuckets(&sm, 4).ok());
  std::vector<BlockDevice*>& devs = sm.devs;
  auto& members = sm.members;
  const store::FormatOptions& fo = sm.fo;
  constexpr u32 kN = 300;
  constexpr u64 kTruncTo = 7 * data::kBlockSize + 100;  // a partial last block: the tail's path
  constexpr int kFiles = 5;
  const char* const names[kFiles] = {"unlinked", "truncated", "punched", "orphan", "overwritten"};
  u64 ino[kFiles];
  const std::string one = Pattern(1, 'a');
  std::vector<std::vector<u8>> images;
  {
    testing::MountedFs m(devs);
    ASSERT_TRUE(m.open());
    for (int k = 0; k < kFiles; k++) ino[k] = MakeFile(m.fs, names[k]);
    ASSERT_NO_FATAL_FAILURE(ScatterFourCopyBlocks(m, fo, ino, kFiles, kN, one));
    const u64 cut0 = m.data.GetStats().punch_batches_cut;
    Status st = m.fs.Unlink(posix::kRootIno, "unlinked", 8);
    EXPECT_TRUE(st.ok()) << "unlink: " << st.Message();
    posix::SetAttr sa;
    sa.valid = posix::kSetSize;
    sa.size = kTruncTo;
    auto tr = m.fs.SetAttrs(ino[1], sa);
    EXPECT_TRUE(tr.ok()) << "truncate: " << tr.status().Message();
    st = m.fs.Fallocate(ino[2], posix::kFallocPunchHole | posix::kFallocKeepSize, 0, u64(kN) * data::kBlockSize);
    EXPECT_TRUE(st.ok()) << "punch: " << st.Message();
    EXPECT_GE(m.data.GetStats().punch_batches_cut, cut0 + 3);  // each of the three took more than one batch
    const std::string neu = Pattern(256, 'n');
    auto w = m.fs.Write(ino[4], 0, neu.data(), u32(neu.size()), Filesystem::kWriteDirect);
    EXPECT_TRUE(w.ok()) << "overwrite: " << w.status().Message();
    // The orphan: unlinked while open, and the power goes before its release.
    ASSERT_TRUE(m.fs.OpenInode(ino[3]).ok());
    ASSERT_TRUE(m.fs.Unlink(posix::kRootIno, "orphan", 6).ok());
    ASSERT_TRUE(m.store->journal().Flush().ok());
    std::vector<const userspace::MemDevice*> d;
    for (auto& mem : members) d.push_back(mem.get());
    images = userspace::MemDevice::SnapshotDurable(d);
    EXPECT_TRUE(m.fs.Release(ino[3]).ok());
  }
  // The next mount's orphan pass frees it, in batches.
  std::vector<std::unique_ptr<userspace::MemDevice>> cut;
  std::vector<BlockDevice*> cut_devs;
  for (auto& img : images) {
    userspace::MemDeviceOptions o;
    o.name = "ssd0";
    o.size = img.size();
    o.initial_image = img;
    cut.push_back(std::make_unique<userspace::MemDevice>(o));
    cut_devs.push_back(cut.back().get());
  }
  {
    testing::MountedFs m(cut_devs);
    ASSERT_TRUE(m.open()) << "the orphan pass failed the mount";
    EXPECT_EQ(m.fs.GetStats().orphans_freed, 1u);
    for (u64 gone : {ino[0], ino[3]}) EXPECT_FALSE(m.fs.GetAttr(gone).ok()) << gone;
    EXPECT_FALSE(m.data.HasData(ino[2]).value());
    auto a = m.fs.GetAttr(ino[1]);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a.value().size, kTruncTo);
    std::string got(kTruncTo, '\0');
    auto r = m.fs.Read(ino[1], 0, got.data(), u32(got.size()));
    ASSERT_TRUE(r.ok());
    for (u32 i = 0; i < 7; i++) EXPECT_TRUE(got.compare(i * data::kBlockSize, data::kBlockSize, one) == 0) << i;
    EXPECT_TRUE(got.compare(7 * data::kBlockSize, 100, one, 0, 100) == 0);
    std::string over(256 * data::kBlockSize, '\0');
    ASSERT_TRUE(m.fs.Read(ino[4], 0, over.data(), u32(over.size())).ok());
    EXPECT_TRUE(over == Pattern(256, 'n'));
    EXPECT_AGREE(*m.store, "after the frees");
  }
  std::string out;
  Options o;
  Report rep = Check(cut_devs.data(), u32(cut_devs.size()), o, [](void* ctx, const char* line) {
    *static_cast<std::string*>(ctx) += std::string(line) + "\n";
  }, &out);
  EXPECT_EQ(rep.exit_code, kExitClean) << out;
}

// Replicas (issue 21 step 5a): two members formatted with two data
// replicas, so posix's writes put two copies in every extent (the data
// path's WriteCopies), one on each member.
struct TwoReplicas {
  std::vector<std::unique_ptr<userspace::MemDevice>> mems;
  std::vector<BlockDevice*> devs;

  TwoReplicas() {
    for (int i = 0; i < 2; i++) {
      mems.push_back(testing::MemMember());
      devs.push_back(mems.back().get());
    }
    store::FormatOptions fo = testing::SmallFormat();
    fo.data_replicas = 2;
    EXPECT_TRUE(testing::FormatMembers(devs, fo).ok());
  }

  void WithFs(const std::function<void(Filesystem&, store::Store&)>& fn) {
    testing::MountedFs m(devs);
    ASSERT_TRUE(m.open());
    fn(m.fs, *m.store);
  }

  std::pair<Report, std::string> Fsck(bool repair) { return RunFsck(devs.data(), u32(devs.size()), repair); }

  // Both members' durable bytes.
  std::vector<std::vector<u8>> Bytes() const {
    return userspace::MemDevice::SnapshotDurable({mems[0].get(), mems[1].get()});
  }
};

// Every written extent of the store has two copies on distinct members, and
// the tree holds each copy's own backpointer (the one BackpointerOf gives);
// returns the extents checked.
u64 ExpectTwoCopiesEachWithItsBackpointer(store::Store& s) {
  u64 n = 0;
  btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
  EXPECT_TRUE(it.SeekToFirst().ok());
  for (; it.Valid(); (void)it.Next()) {
    std::vector<u8> v(it.value(), it.value() + it.val_bytes());
    data::Extent e;
    EXPECT_TRUE(data::ParseExtent(it.pos(), v.data(), u32(v.size()), &e).ok());
    if (e.unwritten) continue;
    n++;
    EXPECT_EQ(e.nr_ptrs, 2u) << "extent " << e.ino << ":" << e.end;
    if (e.nr_ptrs != 2) continue;
    EXPECT_NE(e.ptrs[0].dev, e.ptrs[1].dev);
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      data::Backpointer want, have;
      EXPECT_TRUE(data::BackpointerOf(s.sb(), e, e.ptrs[i], &want));
      btree::Iterator bt(&s.btrees(), btree::kBtreeBackpointers);
      EXPECT_TRUE(bt.Seek(want.pos()).ok());
      EXPECT_TRUE(bt.Valid() && bt.pos() == want.pos()) << "no backpointer for copy " << i << " of extent " << e.ino
                                                        << ":" << e.end;
      if (!bt.Valid() || bt.pos() != want.pos()) continue;
      EXPECT_TRUE(data::ParseBackpointer(bt.pos(), bt.value(), bt.val_bytes(), &have).ok());
      EXPECT_TRUE(have.SameValue(want)) << "copy " << i << " of extent " << e.ino << ":" << e.end;
    }
  }
  return n;
}

// Every kind of extent change posix makes, on replicated extents (writes,
// overwrites splitting two-copy extents, plain and compressed, punch,
// truncate, fallocate, unlinks): after each, and after a remount, one
// backpointer per copy, each on its copy's member, and nothing else; fsck
// -n is clean.
TEST(BackpointersTest, EveryCopyOfAReplicatedWriteHasItsOwn) {
  TwoReplicas t;
  t.WithFs([&](Filesystem& fs, store::Store& s) { Workload(fs, s, true); });
  t.WithFs([&](Filesystem&, store::Store& s) {
    EXPECT_AGREE(s, "after a remount");
    EXPECT_GT(ExpectTwoCopiesEachWithItsBackpointer(s), 5u);
    // Both members hold backpointers (each copy's is on its own member).
    u64 per[2] = {0, 0};
    btree::Iterator it(&s.btrees(), btree::kBtreeBackpointers);
    ASSERT_TRUE(it.SeekToFirst().ok());
    for (; it.Valid(); (void)it.Next()) per[it.pos().inode < 2 ? it.pos().inode : 0]++;
    EXPECT_EQ(per[0], per[1]);
    EXPECT_EQ(per[0] + per[1], Pointers(s));
  });
  auto [r, out] = t.Fsck(false);
  EXPECT_EQ(r.exit_code, kExitClean) << out;
  EXPECT_NE(out.find(", 0 problem(s)\n"), std::string::npos) << out;
}

// The backpointer of the second copy of a replicated extent lost (deleted
// behind the filesystem's back): fsck -n names it (member, block, the
// extent) and exits 4; -y sets it from the extent; the next check is clean
// and the tree is what the writes made.
TEST(FsckBackpointersTest, AMissingBackpointerOfASecondCopyIsRepaired) {
  TwoReplicas t;
  u64 ino = 0;
  t.WithFs([&](Filesystem& fs, store::Store& s) {
    ino = MakeFile(fs, "r");
    ASSERT_TRUE(fs.Write(ino, 0, Pattern(24, 'r').data(), 24 * data::kBlockSize).ok());
    ASSERT_TRUE(fs.Write(ino, 8 * data::kBlockSize, Pattern(4, 's').data(), 4 * data::kBlockSize).ok());
    ASSERT_TRUE(fs.Fsync(ino).ok());
    EXPECT_EQ(ExpectTwoCopiesEachWithItsBackpointer(s), 3u);  // [0, 8), [8, 12), [12, 24)
  });
  // The second copy of the extent [8, 12): its backpointer, and its keys before.
  data::Backpointer lost;
  std::vector<std::pair<btree::Pos, std::vector<u8>>> keys;
  t.WithFs([&](Filesystem&, store::Store& s) {
    btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
    ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, ino, 12}).ok());
    ASSERT_TRUE(it.Valid() && it.pos().inode == ino && it.pos().offset == 12);
    data::Extent e;
    ASSERT_TRUE(data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
    ASSERT_EQ(e.nr_ptrs, 2u);
    ASSERT_TRUE(data::BackpointerOf(s.sb(), e, e.ptrs[1], &lost));
    btree::Iterator bt(&s.btrees(), btree::kBtreeBackpointers);
    ASSERT_TRUE(bt.SeekToFirst().ok());
    for (; bt.Valid(); (void)bt.Next())
      keys.emplace_back(bt.pos(), std::vector<u8>(bt.value(), bt.value() + bt.val_bytes()));
  });
  ASSERT_EQ(keys.size(), 6u);
  {
    store::Store e;
    ASSERT_TRUE(testing::OpenStore(&e, t.devs).ok());
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Delete(lost.pos()).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  const std::string label = lost.dev == 0 ? "ssd.a" : "ssd.b";
  const std::string line = "backpointers: missing at member " + label + " block " + std::to_string(lost.block) +
                           " piece " + std::to_string(lost.piece) + ": the extent inode " + std::to_string(ino) +
                           " blocks [8, 12) points there";
  const Repair fix = ExpectReportedRepairedClean(t, line.c_str(), line.c_str());
  EXPECT_EQ(fix.checked.errors, 1u) << fix.report;
  EXPECT_EQ(fix.fixed.repaired, 1u) << fix.repair;
  EXPECT_NE(fix.repair.find("backpointers: 1 missing, 0 wrong, 0 with no extent: rewritten from the extents"),
            std::string::npos)
      << fix.repair;
  t.WithFs([&](Filesystem& fs, store::Store& s) {
    EXPECT_EQ(ExpectTwoCopiesEachWithItsBackpointer(s), 3u);
    std::vector<std::pair<btree::Pos, std::vector<u8>>> now;
    btree::Iterator bt(&s.btrees(), btree::kBtreeBackpointers);
    ASSERT_TRUE(bt.SeekToFirst().ok());
    for (; bt.Valid(); (void)bt.Next())
      now.emplace_back(bt.pos(), std::vector<u8>(bt.value(), bt.value() + bt.val_bytes()));
    EXPECT_TRUE(now == keys);
    std::string got(24 * data::kBlockSize, '\0');
    ASSERT_TRUE(fs.Read(ino, 0, got.data(), u32(got.size())).ok());
    std::string want = Pattern(24, 'r');
    want.replace(8 * data::kBlockSize, 4 * data::kBlockSize, Pattern(4, 's'));
    EXPECT_TRUE(got == want);
  });
}

// --- fsck ----------------------------------------------------------------------------

// Writes (or deletes, value null) backpointer keys behind the filesystem's back.
void Poke(Image& img, const std::vector<std::pair<btree::Pos, std::vector<u8>>>& keys) {
  store::Store e;
  BlockDevice* b = img.dev.get();
  ASSERT_TRUE(testing::OpenStore(&e, {b}).ok());
  btree::Transaction tx(&e.btrees());
  for (const auto& [pos, v] : keys)
    ASSERT_TRUE((v.empty() ? tx.Delete(pos) : tx.Set(pos, v.data(), u32(v.size()))).ok());
  ASSERT_TRUE(tx.Commit().ok());
  ASSERT_TRUE(e.Close().ok());
}

std::vector<std::pair<btree::Pos, std::vector<u8>>> TreeKeys(Image& img) {
  std::vector<std::pair<btree::Pos, std::vector<u8>>> out;
  img.WithFs([&](Filesystem&, store::Store& s) {
    btree::Iterator it(&s.btrees(), btree::kBtreeBackpointers);
    EXPECT_TRUE(it.SeekToFirst().ok());
    for (; it.Valid(); (void)it.Next())
      out.emplace_back(it.pos(), std::vector<u8>(it.value(), it.value() + it.val_bytes()));
  });
  return out;
}

size_t Count(const std::string& out, const std::string& what) {
  size_t n = 0;
  for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) n++;
  return n;
}

// Random damage to the tree -- keys deleted, values changed (bits flipped,
// cut short, another key's value), stray keys added -- is found by -n, one
// line each with a count, and nothing written; -y repairs it all, and the
// next check is clean with the files intact.
TEST(FsckBackpointersTest, RandomDamageIsFoundAndRepaired) {
  for (u32 seed = 1; seed <= 8; seed++) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Image img;
    Populate(img, 2, 6);
    img.WithFs([&](Filesystem& fs, store::Store&) {  // split some extents
      for (int i = 0; i < 12; i += 3) {
        const std::string name = "f" + std::to_string(i);
        const u64 ino = fs.Lookup(posix::kRootIno, name.data(), u32(name.size())).value().ino;
        const std::string c = Content(i);
        ASSERT_TRUE(fs.Write(ino, 4096, c.data() + 4096, 4096).ok());
      }
    });
    const auto keys = TreeKeys(img);
    ASSERT_GT(keys.size(), 15u);
    std::mt19937_64 rng(seed);
    std::set<std::pair<u64, u64>> touched;
    std::vector<std::pair<btree::Pos, std::vector<u8>>> poke;
    u32 missing = 0, wrong = 0, stray = 0;
    const u32 n = 3 + u32(rng() % 8);
    while (poke.size() < n) {
      const auto& [pos, value] = keys[rng() % keys.size()];
      btree::Pos at = pos;
      std::vector<u8> v = value;
      const u32 kind = u32(rng() % 5);
      if (kind == 4) {  // a stray: a piece no write made, or past every member
        at.offset |= 0xe0 + rng() % 16;
        if (rng() % 2 == 0) at.inode = 1 + rng() % 300;
      }
      if (!touched.insert({at.inode, at.offset}).second) continue;
      switch (kind) {
        case 0:
          v.clear();
          missing++;
          break;
        case 1:
          v[rng() % v.size()] ^= u8(1u << (rng() % 8));
          wrong++;
          break;
        case 2:
          v.resize(rng() % v.size());
          if (v.empty()) v.push_back(0);
          wrong++;
          break;
        case 3: {
          const std::vector<u8>& w = keys[rng() % keys.size()].second;
          if (w == v) {
            touched.erase({at.inode, at.offset});
            continue;
          }
          v = w;
          wrong++;
          break;
        }
        default:
          stray++;
          break;
      }
      poke.emplace_back(at, v);
    }
    Poke(img, poke);
    const std::string summary = "backpointers: " + std::to_string(missing) + " missing, " + std::to_string(wrong) +
                                " wrong, " + std::to_string(stray) + " with no extent; 'tierfs fsck -y'";
    const Repair fix = ExpectReportedRepairedClean(img, summary.c_str(), nullptr);
    EXPECT_EQ(fix.checked.errors, n) << fix.report;
    EXPECT_EQ(Count(fix.report, "backpointers: missing at "), missing) << fix.report;
    EXPECT_EQ(Count(fix.report, "backpointers: wrong at "), wrong) << fix.report;
    EXPECT_EQ(Count(fix.report, "backpointers: no extent points at "), stray) << fix.report;
    EXPECT_EQ(fix.fixed.errors, n) << fix.repair;
    EXPECT_EQ(fix.fixed.repaired, n) << fix.repair;
    EXPECT_TRUE(TreeKeys(img) == keys) << "the repair rebuilt exactly the keys the writes made";
    img.ExpectFiles(12);
    if (::testing::Test::HasFailure()) break;
  }
}

// The whole tree lost: every backpointer missing. -n lists the first 20
// and counts the rest; -y sets them all (in batches) and the check is clean.
TEST(FsckBackpointersTest, AWholeTreeLostIsListedCappedAndRebuilt) {
  Image img;
  Populate(img, 1, 4);
  img.WithFs([&](Filesystem& fs, store::Store&) {
    const u64 ino = MakeFile(fs, "many");
    for (u32 i = 0; i < 400; i += 2) ASSERT_TRUE(fs.Write(ino, u64(i) * data::kBlockSize, "m", 1).ok());
  });
  const auto keys = TreeKeys(img);
  ASSERT_GT(keys.size(), 200u);
  std::vector<std::pair<btree::Pos, std::vector<u8>>> poke;
  for (const auto& k : keys) poke.emplace_back(k.first, std::vector<u8>{});
  Poke(img, poke);
  const std::string more = "backpointers: " + std::to_string(keys.size() - 20) + " more finding(s) not listed";
  const Repair fix = ExpectReportedRepairedClean(img, more.c_str(), "rewritten from the extents");
  EXPECT_EQ(fix.checked.errors, keys.size()) << fix.report;
  EXPECT_EQ(Count(fix.report, "backpointers: missing at "), 20u) << fix.report;
  EXPECT_EQ(fix.fixed.repaired, keys.size()) << fix.repair;
  EXPECT_TRUE(TreeKeys(img) == keys);
}

// The namespace pass's extent repairs change the backpointers in their own
// transactions: deleting the extents of an inode whose record is gone, and
// trimming an overlap, leave the backpointer pass nothing to do.
TEST(FsckBackpointersTest, NamespaceRepairsKeepTheTreeInStep) {
  Image img;
  Populate(img, 1, 6);
  u64 victim = 0, other = 0;
  std::vector<std::pair<btree::Pos, std::vector<u8>>> extents;
  img.WithFs([&](Filesystem& fs, store::Store& s) {
    victim = fs.Lookup(posix::kRootIno, "f1", 2).value().ino;
    other = fs.Lookup(posix::kRootIno, "f3", 2).value().ino;
    btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
    ASSERT_TRUE(it.Seek(btree::Pos{btree::kBtreeExtents, other, 0}).ok());
    for (; it.Valid() && it.pos().inode == other; (void)it.Next())
      extents.emplace_back(it.pos(), std::vector<u8>(it.value(), it.value() + it.val_bytes()));
  });
  ASSERT_FALSE(extents.empty());
  // f1's inode record goes (its extents are then of a missing inode); f3's
  // first extent is copied one block later (an overlap; the copy shares the
  // blob, so its blocks are claimed twice -- a note).
  btree::Pos copy = extents[0].first;
  copy.offset += 1;
  {
    store::Store e;
    BlockDevice* b = img.dev.get();
    ASSERT_TRUE(testing::OpenStore(&e, {b}).ok());
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Delete(btree::Pos{btree::kBtreeInodes, victim, 0}).ok());
    ASSERT_TRUE(tx.Set(copy, extents[0].second.data(), u32(extents[0].second.size())).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  auto [r1, out1] = img.Fsck(true);
  EXPECT_EQ(r1.exit_code, kExitRepaired) << out1;
  EXPECT_NE(out1.find("deleted the extent of inode " + std::to_string(victim)), std::string::npos) << out1;
  EXPECT_NE(out1.find("overlapped blocks of earlier extents"), std::string::npos) << out1;
  EXPECT_NE(out1.find("is claimed by 2 pointers"), std::string::npos) << out1;
  EXPECT_NE(out1.find(", 0 problem(s)\n"), std::string::npos) << "the namespace pass left the tree in step\n" << out1;
  EXPECT_EQ(out1.find("backpointers: missing"), std::string::npos) << out1;
  EXPECT_EQ(out1.find("backpointers: wrong"), std::string::npos) << out1;
  EXPECT_EQ(out1.find("backpointers: no extent"), std::string::npos) << out1;
  auto [r2, out2] = img.Fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  img.WithFs([&](Filesystem&, store::Store& s) {
    const Agreement a = Check(s);
    ASSERT_EQ(a.diffs.size(), 1u);
    EXPECT_EQ(a.diffs[0].rfind("shared", 0), 0u) << a.diffs[0];
    EXPECT_EQ(a.keys, Pointers(s) - 1);  // the two claimants share a key
  });
}

// fsck's overlap trim (TrimEarlier) over hundreds of four-copy extents: an
// extent key covering 450 one-block extents before it (an unwritten one:
// damage, no write makes it) makes -y delete all 450 and their 1800
// backpointers -- about 72 KiB of journal keys, more than the 64 KiB entry
// of 64 KiB buckets. The trim commits in batches that fit (before: one
// transaction, kTooBig, and fsck -y failed).
TEST(FsckBackpointersTest, AnOverlapOfHundredsOfFourCopyExtentsIsTrimmedInBatches) {
  SmallBucketMembers sm;
  ASSERT_TRUE(FormatSmallBuckets(&sm, 4).ok());
  std::vector<BlockDevice*>& devs = sm.devs;
  constexpr u32 kN = 450;
  u64 ino = 0;
  {
    testing::MountedFs m(devs);
    ASSERT_TRUE(m.open());
    ino = MakeFile(m.fs, "f");
    const std::string one = Pattern(1, 'a');
    for (u32 i = 0; i < kN; i++) {
      auto w = m.fs.Write(ino, u64(i) * data::kBlockSize, one.data(), u32(one.size()), Filesystem::kWriteDirect);
      ASSERT_TRUE(w.ok()) << w.status().Message();
    }
    ASSERT_EQ(Pointers(*m.store), 4u * kN);
  }
  {
    store::Store e;
    ASSERT_TRUE(testing::OpenStore(&e, devs).ok());
    u8 v[data::kUnwrittenValueBytes];
    btree::Transaction tx(&e.btrees());
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeExtents, ino, kN + 1}, v, data::BuildUnwritten(kN + 1, v)).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  auto fsck = [&](bool repair) {
    std::string out;
    Options o;
    o.repair = repair;
    Report r = Check(devs.data(), u32(devs.size()), o, [](void* ctx, const char* line) {
      *static_cast<std::string*>(ctx) += std::string(line) + "\n";
    }, &out);
    return std::pair<Report, std::string>(r, out);
  };
  auto [r1, out1] = fsck(true);
  EXPECT_EQ(r1.exit_code, kExitRepaired) << out1;
  EXPECT_NE(out1.find("dropped " + std::to_string(kN) + " overlapped blocks of earlier extents"), std::string::npos)
      << out1;
  auto [r2, out2] = fsck(false);
  EXPECT_EQ(r2.exit_code, kExitClean) << out2;
  testing::MountedFs m(devs);
  ASSERT_TRUE(m.open());
  EXPECT_EQ(Pointers(*m.store), 0u);  // the unwritten extent alone
  EXPECT_AGREE(*m.store, "after the trim");
}

}  // namespace
}  // namespace tfs::fsck
