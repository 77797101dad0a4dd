// Backpointers (data/backpointer.h): the value's round trip and hostile
// bytes, the one rule that gives a pointer its backpointer, what
// QueueBackpointers queues for an extent change, copygc's bucket query on a
// mounted filesystem, and the windowed cross-check with a tiny memory bound.
#include "data/backpointer.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "data/data.h"
#include "mount/testing.h"
#include "posix/fs.h"
#include "userspace/platform/mem_device.h"

namespace tfs::data {
namespace {

btree::Pos BpPos(u32 dev, u64 block, u32 piece) { return Backpointer{dev, block, piece}.pos(); }

Backpointer Sample() {
  Backpointer bp;
  bp.dev = 3;
  bp.block = (sb::kBucketsOffset >> 12) + 77;
  bp.piece = 5;
  bp.ino = 4242;
  bp.end = 1000;
  bp.blocks = 9;
  return bp;
}

std::vector<u8> Bytes(const Backpointer& bp) {
  const BackpointerFormat f = BuildBackpointer(bp);
  const u8* p = reinterpret_cast<const u8*>(&f);
  return std::vector<u8>(p, p + sizeof(f));
}

TEST(BackpointerFormatTest, RoundTrip) {
  {
    const Backpointer bp = Sample();
    const std::vector<u8> v = Bytes(bp);
    ASSERT_EQ(v.size(), 24u);
    Backpointer got;
    ASSERT_TRUE(ParseBackpointer(bp.pos(), v.data(), u32(v.size()), &got).ok());
    EXPECT_EQ(got.dev, bp.dev);
    EXPECT_EQ(got.block, bp.block);
    EXPECT_EQ(got.piece, bp.piece);
    EXPECT_TRUE(got.SameValue(bp));
    EXPECT_TRUE(got.pos() == bp.pos());
  }
  // The key: member in inode, (block << 8) | piece in offset.
  const btree::Pos p = BpPos(7, 0x123456, 0xab);
  EXPECT_EQ(p.btree_id, btree::kBtreeBackpointers);
  EXPECT_EQ(p.inode, 7u);
  EXPECT_EQ(p.offset, (u64(0x123456) << 8) | 0xab);
  // Bytes as documented (docs/format/backpointers.md).
  const std::vector<u8> v = Bytes(Sample());
  EXPECT_EQ(v[0], 4242 & 0xff);
  EXPECT_EQ(v[1], 4242 >> 8);
  EXPECT_EQ(v[8], 1000 & 0xff);
  EXPECT_EQ(v[16], 9);
  EXPECT_EQ(v[20] | v[21] | v[22] | v[23], 0);  // flags and reserved
}

TEST(BackpointerFormatTest, HostileValuesAreCorrupt) {
  const Backpointer bp = Sample();
  const std::vector<u8> good = Bytes(bp);
  Backpointer out;
  auto parse = [&](const btree::Pos& pos, const std::vector<u8>& v) {
    return ParseBackpointer(pos, v.data(), u32(v.size()), &out);
  };
  ASSERT_TRUE(parse(bp.pos(), good).ok());
  // Every length but 24.
  for (u32 n = 0; n < 64; n++) {
    if (n == 24) continue;
    std::vector<u8> v(n, 0);
    std::copy(good.begin(), good.begin() + std::min<size_t>(n, 24), v.begin());
    EXPECT_EQ(parse(bp.pos(), v).code(), Err::kCorrupt) << n;
  }
  // Every bit of flags and reserved bytes (bit 0 of flags meant "cached"
  // before cached copies lost their backpointers: refused too).
  for (u32 byte = 20; byte < 24; byte++)
    for (u32 bit = 0; bit < 8; bit++) {
      std::vector<u8> v = good;
      v[byte] ^= u8(1u << bit);
      EXPECT_EQ(parse(bp.pos(), v).code(), Err::kCorrupt) << byte << "." << bit;
    }
  auto with = [&](u32 blocks, u64 end) {
    Backpointer b = bp;
    b.blocks = blocks;
    b.end = end;
    return Bytes(b);
  };
  EXPECT_EQ(parse(bp.pos(), with(0, 10)).code(), Err::kCorrupt);                      // no blocks
  EXPECT_EQ(parse(bp.pos(), with(kMaxExtentBlocks + 1, 1000)).code(), Err::kCorrupt);  // more than an extent holds
  EXPECT_EQ(parse(bp.pos(), with(10, 9)).code(), Err::kCorrupt);                      // starts before block 0
  EXPECT_TRUE(parse(bp.pos(), with(kMaxExtentBlocks, kMaxExtentBlocks)).ok());
  // An owner past the inode numbers' limit.
  for (const u64 ino : {btree::kInoLimit, ~u64(0)}) {
    Backpointer b = bp;
    b.ino = ino;
    EXPECT_EQ(parse(bp.pos(), Bytes(b)).code(), Err::kCorrupt) << ino;
  }
  {
    Backpointer b = bp;
    b.ino = btree::kInoLimit - 1;
    EXPECT_TRUE(parse(bp.pos(), Bytes(b)).ok());
  }
  // Another tree, or a member no pointer can name.
  btree::Pos p = bp.pos();
  p.btree_id = btree::kBtreeExtents;
  EXPECT_EQ(parse(p, good).code(), Err::kCorrupt);
  p = bp.pos();
  p.inode = 256;
  EXPECT_EQ(parse(p, good).code(), Err::kCorrupt);
  p.inode = ~u64(0);
  EXPECT_EQ(parse(p, good).code(), Err::kCorrupt);
  // Any key offset parses (block and piece are its bits); the value is checked.
  p = bp.pos();
  p.offset = ~u64(0);
  ASSERT_TRUE(parse(p, good).ok());
  EXPECT_EQ(out.piece, kBpMaxPiece);
  EXPECT_EQ(out.block, ~u64(0) >> 8);
  // Random bytes never crash, and what parses rebuilds to itself.
  u64 seed = 1;
  for (int i = 0; i < 20000; i++) {
    std::vector<u8> v = good;
    for (u8& b : v) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      if ((seed >> 60) == 0) b = u8(seed >> 40);
    }
    if (parse(bp.pos(), v).ok()) {
      EXPECT_TRUE(Bytes(out) == v);
    }
  }
}

sb::Superblock Geometry(u32 members, u64 nbuckets, u32 bucket_size = 1 << 20) {
  sb::Superblock s{};
  s.bucket_size = bucket_size;
  s.nr_members = members;
  for (u32 m = 0; m < members; m++) s.members[m].nbuckets = nbuckets;
  return s;
}

Extent Plain(u64 ino, u64 end, u32 blocks) {
  Extent e;
  e.ino = ino;
  e.end = end;
  e.start = end - blocks;
  return e;
}

TEST(BackpointerRuleTest, APointerInsideTheBucketsHasOneOutsideNone) {
  const sb::Superblock s = Geometry(2, 10);
  Extent e = Plain(9, 50, 4);
  Extent::Ptr p;
  p.dev = 1;
  p.offset = sb::kBucketsOffset + 3 * (1 << 20) + 8 * kBlockSize;
  p.blob_offset = 6;
  Backpointer bp;
  ASSERT_TRUE(BackpointerOf(s, e, p, &bp));
  EXPECT_EQ(bp.dev, 1u);
  EXPECT_EQ(bp.block, p.offset / kBlockSize);
  EXPECT_EQ(bp.piece, 6u);
  EXPECT_EQ(bp.ino, 9u);
  EXPECT_EQ(bp.end, 50u);
  EXPECT_EQ(bp.blocks, 4u);
  // A cached copy has none (its bucket may be dropped and reused while the
  // extent still names it).
  p.cached = true;
  Backpointer none;
  EXPECT_FALSE(BackpointerOf(s, e, p, &none));
  p.cached = false;
  // The bucket's range holds it.
  btree::Pos first, last;
  BucketBackpointerRange(s, 1, 3, &first, &last);
  EXPECT_TRUE(first <= bp.pos() && bp.pos() <= last);
  BucketBackpointerRange(s, 1, 2, &first, &last);
  EXPECT_TRUE(last < bp.pos());
  BucketBackpointerRange(s, 1, 4, &first, &last);
  EXPECT_TRUE(bp.pos() < first);
  // The last block of a bucket with the largest piece is still inside its range.
  Extent::Ptr q = p;
  q.offset = sb::kBucketsOffset + 4 * (1 << 20) - kBlockSize;
  q.blob_offset = kBpMaxPiece;
  ASSERT_TRUE(BackpointerOf(s, e, q, &bp));
  BucketBackpointerRange(s, 1, 3, &first, &last);
  EXPECT_TRUE(bp.pos() == last);
  // None: a member the filesystem lacks, before the first bucket, past the
  // last, a piece the key cannot hold.
  Extent::Ptr r = p;
  r.dev = 2;
  EXPECT_FALSE(BackpointerOf(s, e, r, &bp));
  r = p;
  r.offset = sb::kBucketsOffset - kBlockSize;
  EXPECT_FALSE(BackpointerOf(s, e, r, &bp));
  r.offset = sb::kBucketsOffset + 10 * (1 << 20);
  EXPECT_FALSE(BackpointerOf(s, e, r, &bp));
  r = p;
  r.blob_offset = kBpMaxPiece + 1;
  EXPECT_FALSE(BackpointerOf(s, e, r, &bp));
}

// What a transaction holds, key by key (type and position; value for sets).
struct Queued {
  std::vector<std::tuple<bool, u64, u64>> ops;  // (set, dev, offset)
};

// Runs QueueBackpointers on a transaction of a throwaway filesystem's trees
// and reads back what it queued by committing it into an empty tree.
class QueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = testing::FormattedMember();
    ASSERT_TRUE(testing::OpenStore(&store_, {dev_.get()}).ok());
  }
  void TearDown() override { EXPECT_TRUE(store_.Close().ok()); }
  std::map<std::pair<u64, u64>, Backpointer> Tree() {
    std::map<std::pair<u64, u64>, Backpointer> out;
    btree::Iterator it(&store_.btrees(), btree::kBtreeBackpointers);
    EXPECT_TRUE(it.SeekToFirst().ok());
    for (; it.Valid(); (void)it.Next()) {
      Backpointer bp;
      EXPECT_TRUE(ParseBackpointer(it.pos(), it.value(), it.val_bytes(), &bp).ok());
      out[{it.pos().inode, it.pos().offset}] = bp;
    }
    return out;
  }
  u32 Apply(const Extent* old, const Extent* now) {
    btree::Transaction tx(&store_.btrees());
    EXPECT_TRUE(QueueBackpointers(&tx, store_.sb(), old, now).ok());
    const u32 n = tx.size();
    EXPECT_TRUE(tx.Commit().ok());
    return n;
  }
  Extent::Ptr Ptr(u8 dev, u32 bucket, u32 blob_offset) {
    Extent::Ptr p;
    p.dev = dev;
    p.offset = store_.sb().BucketOffset(bucket);
    p.blob_offset = blob_offset;
    return p;
  }
  std::unique_ptr<userspace::MemDevice> dev_;
  store::Store store_;
};

TEST_F(QueueTest, DeletesWhatGoesSetsWhatComesLeavesTheRest) {
  Extent a = Plain(5, 20, 4);
  a.nr_ptrs = 1;
  a.ptrs[0] = Ptr(0, 10, 0);
  EXPECT_EQ(Apply(nullptr, &a), 1u);  // created: one set
  ASSERT_EQ(Tree().size(), 1u);
  EXPECT_EQ(Apply(&a, &a), 0u);  // unchanged: nothing
  // The piece after an overwrite of the first block: another position.
  Extent b = Plain(5, 20, 3);
  b.nr_ptrs = 1;
  b.ptrs[0] = Ptr(0, 10, 1);
  EXPECT_EQ(Apply(&a, &b), 2u);
  auto t = Tree();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.begin()->second.piece, 1u);
  EXPECT_EQ(t.begin()->second.blocks, 3u);
  // The piece before a punch keeps the position: one set, no delete.
  Extent c = Plain(5, 18, 1);
  c.nr_ptrs = 1;
  c.ptrs[0] = Ptr(0, 10, 1);
  EXPECT_EQ(Apply(&b, &c), 1u);
  t = Tree();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.begin()->second.end, 18u);
  // A second copy added, then marked cached (its backpointer goes), then
  // promoted again (it comes back): only it changes.
  Extent d = c;
  d.nr_ptrs = 2;
  d.ptrs[1] = Ptr(0, 30, 0);
  d.ptrs[1].dev = 0;  // (one member: another bucket stands for another member here)
  EXPECT_EQ(Apply(&c, &d), 1u);
  EXPECT_EQ(Tree().size(), 2u);
  Extent e = d;
  e.ptrs[1].cached = true;
  EXPECT_EQ(Apply(&d, &e), 1u);
  EXPECT_EQ(Tree().size(), 1u);
  EXPECT_EQ(Apply(&e, &e), 0u);  // a cached copy left as it is: nothing
  EXPECT_EQ(Apply(&e, &d), 1u);
  EXPECT_EQ(Tree().size(), 2u);
  // A pointer outside the buckets has none, and is not deleted either.
  Extent f = d;
  f.ptrs[1].offset = 4096;
  EXPECT_EQ(Apply(&d, &f), 1u);  // d's second goes
  EXPECT_EQ(Tree().size(), 1u);
  // Deleted; an unwritten extent has none.
  EXPECT_EQ(Apply(&f, nullptr), 1u);
  EXPECT_TRUE(Tree().empty());
  Extent u = Plain(5, 100, 50);
  u.unwritten = true;
  EXPECT_EQ(Apply(nullptr, &u), 0u);
  EXPECT_EQ(Apply(&u, nullptr), 0u);
}

// A delete and a set of one position in one transaction: the later wins (a
// split: the old extent's key first, then the front piece's).
TEST_F(QueueTest, ASetAfterADeleteOfThePositionWins) {
  Extent a = Plain(5, 20, 4);
  a.nr_ptrs = 1;
  a.ptrs[0] = Ptr(0, 10, 0);
  Apply(nullptr, &a);
  Extent back = Plain(5, 20, 1);
  back.nr_ptrs = 1;
  back.ptrs[0] = Ptr(0, 10, 3);
  Extent front = Plain(5, 17, 1);
  front.nr_ptrs = 1;
  front.ptrs[0] = Ptr(0, 10, 0);
  btree::Transaction tx(&store_.btrees());
  ASSERT_TRUE(QueueBackpointers(&tx, store_.sb(), &a, &back).ok());
  ASSERT_TRUE(QueueBackpointers(&tx, store_.sb(), nullptr, &front).ok());
  ASSERT_TRUE(tx.Commit().ok());
  auto t = Tree();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.begin()->second.end, 17u);
  EXPECT_EQ(t.rbegin()->second.end, 20u);
}

// --- on a mounted filesystem -----------------------------------------------------

std::vector<std::string> Mismatches(btree::Btrees* t, const sb::Superblock& s, BackpointerCheckStats* stats = nullptr,
                                    u64 max_entries = kBpCheckEntries) {
  std::vector<std::string> out;
  Status st = CheckBackpointers(t, s, [](void* ctx, const BackpointerMismatch& m) {
    static const char* const kKinds[] = {"missing", "wrong", "stray", "shared"};
    static_cast<std::vector<std::string>*>(ctx)->push_back(std::string(kKinds[m.kind]) + " " +
                                                           std::to_string(m.pos.inode) + ":" +
                                                           std::to_string(m.pos.offset));
    return Status::Ok();
  }, &out, stats, max_entries);
  EXPECT_TRUE(st.ok()) << st.Message();
  return out;
}

// Files spread over many buckets (64 KiB buckets: 16 blocks each), split by
// overwrites, some compressed.
void Populate(testing::MountedFs& m, std::vector<u64>* inos) {
  const posix::Caller root{0, 0};
  for (int i = 0; i < 6; i++) {
    const std::string name = "f" + std::to_string(i);
    const u64 ino = m.fs.Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, root)
                        .value()
                        .ino;
    inos->push_back(ino);
    if (i % 3 == 2) {
      ASSERT_TRUE(m.fs.SetFlags(ino, posix::Filesystem::kFsComprFl).ok());
    }
    std::string data(40 * kBlockSize, char('a' + i));
    for (size_t j = 0; j < data.size(); j += 7) data[j] = char(j / 4096);
    ASSERT_TRUE(m.fs.Write(ino, 0, data.data(), u32(data.size())).ok());
    ASSERT_TRUE(m.fs.Write(ino, 5 * kBlockSize, data.data(), kBlockSize).ok());
    ASSERT_TRUE(m.fs.Write(ino, 21 * kBlockSize, data.data(), 2 * kBlockSize).ok());
    ASSERT_TRUE(m.fs.Fsync(ino).ok());
  }
}

store::FormatOptions SmallBuckets() {
  store::FormatOptions fo = testing::SmallFormat();
  fo.bucket_size = 64 * 1024;
  return fo;
}

// copygc's query: every bucket's backpointers are exactly the pointers into
// it, in order.
TEST(BackpointerBucketTest, ForEachInBucketListsWhatLivesInTheBucket) {
  auto dev = testing::FormattedMember(SmallBuckets());
  testing::MountedFs m({dev.get()});
  ASSERT_TRUE(m.open());
  std::vector<u64> inos;
  Populate(m, &inos);
  const sb::Superblock& s = m.store->sb();
  // What the extents say: bucket -> (ino, end, blob_offset).
  std::map<u64, std::set<std::tuple<u64, u64, u32>>> want;
  btree::Iterator it(&m.store->btrees(), btree::kBtreeExtents);
  ASSERT_TRUE(it.SeekToFirst().ok());
  u64 ptrs = 0;
  for (; it.Valid(); (void)it.Next()) {
    Extent e;
    ASSERT_TRUE(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok());
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      want[s.BucketOf(e.ptrs[i].offset)].insert({e.ino, e.end, e.ptrs[i].blob_offset});
      ptrs++;
    }
  }
  ASSERT_GT(want.size(), 8u);
  ASSERT_GT(ptrs, 20u);
  u64 seen = 0;
  for (u64 b = 0; b < s.members[0].nbuckets; b++) {
    struct Got {
      std::set<std::tuple<u64, u64, u32>> set;
      btree::Pos last{};
      bool ordered = true;
    } got;
    ASSERT_TRUE(ForEachInBucket(&m.store->btrees(), s, 0, b, [](void* ctx, const Backpointer& bp) {
      auto* g = static_cast<Got*>(ctx);
      g->ordered = g->ordered && (g->set.empty() || g->last < bp.pos());
      g->last = bp.pos();
      g->set.insert({bp.ino, bp.end, bp.piece});
      return Status::Ok();
    }, &got).ok());
    EXPECT_TRUE(got.ordered);
    auto w = want.find(b);
    if (w == want.end()) {
      EXPECT_TRUE(got.set.empty()) << "bucket " << b;
    } else {
      EXPECT_TRUE(got.set == w->second) << "bucket " << b;
      seen += got.set.size();
    }
  }
  EXPECT_EQ(seen, ptrs);
  // A bucket or member the filesystem lacks.
  auto none = [](void*, const Backpointer&) { return Status::Ok(); };
  EXPECT_EQ(ForEachInBucket(&m.store->btrees(), s, 0, s.members[0].nbuckets, none, nullptr).code(),
            Err::kInvalidArgument);
  EXPECT_EQ(ForEachInBucket(&m.store->btrees(), s, 1, 0, none, nullptr).code(), Err::kInvalidArgument);
  // fn's error stops the walk; a value that does not parse is kCorrupt.
  const u64 b = want.begin()->first;
  EXPECT_EQ(ForEachInBucket(&m.store->btrees(), s, 0, b, [](void*, const Backpointer&) {
              return Status(Err::kAgain);
            }, nullptr).code(),
            Err::kAgain);
  btree::Pos first, last;
  BucketBackpointerRange(s, 0, b, &first, &last);
  btree::Transaction tx(&m.store->btrees());
  ASSERT_TRUE(tx.Set(last, "junk", 4).ok());
  ASSERT_TRUE(tx.Commit().ok());
  EXPECT_EQ(ForEachInBucket(&m.store->btrees(), s, 0, b, none, nullptr).code(), Err::kCorrupt);
}

// The cross-check with a memory bound of a few entries walks the extents
// once per window and finds the same differences as with room for all.
TEST(BackpointerCheckTest, SmallWindowsFindWhatOneWindowFinds) {
  auto dev = testing::FormattedMember(SmallBuckets());
  testing::MountedFs m({dev.get()});
  ASSERT_TRUE(m.open());
  std::vector<u64> inos;
  Populate(m, &inos);
  btree::Btrees* t = &m.store->btrees();
  const sb::Superblock& s = m.store->sb();
  BackpointerCheckStats one;
  EXPECT_TRUE(Mismatches(t, s, &one).empty());
  EXPECT_EQ(one.passes, 1u);
  ASSERT_GT(one.expected, 20u);
  EXPECT_EQ(one.keys, one.expected);
  // Damage: delete every third, rewrite every fifth, and add strays between.
  std::vector<btree::Pos> keys;
  btree::Iterator it(t, btree::kBtreeBackpointers);
  ASSERT_TRUE(it.SeekToFirst().ok());
  for (; it.Valid(); (void)it.Next()) keys.push_back(it.pos());
  btree::Transaction tx(t);
  u32 damaged = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    if (i % 3 == 0) {
      ASSERT_TRUE(tx.Delete(keys[i]).ok());
      damaged++;
    } else if (i % 5 == 0) {
      Backpointer b = Sample();
      const BackpointerFormat f = BuildBackpointer(b);
      ASSERT_TRUE(tx.Set(keys[i], &f, sizeof(f)).ok());
      damaged++;
    }
    if (i % 4 == 1) {
      btree::Pos p = keys[i];
      p.offset |= 0xf0;  // a piece no write makes
      const BackpointerFormat f = BuildBackpointer(Sample());
      ASSERT_TRUE(tx.Set(p, &f, sizeof(f)).ok());
      damaged++;
    }
  }
  ASSERT_TRUE(tx.Commit().ok());
  const std::vector<std::string> all = Mismatches(t, s);
  EXPECT_EQ(all.size(), damaged);
  for (u64 max : {4u, 5u, 7u, 16u}) {
    BackpointerCheckStats st;
    EXPECT_EQ(Mismatches(t, s, &st, max), all) << max;
    EXPECT_GE(st.passes, one.expected / max) << max;
    EXPECT_EQ(st.expected, one.expected) << max;
    EXPECT_EQ(st.extents, one.extents) << max;
  }
}

}  // namespace
}  // namespace tfs::data
