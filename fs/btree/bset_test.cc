// Sorted sets: the builder's input checks and the Eytzinger search, checked
// against std::lower_bound over the same positions for every set size up to a few
// hundred keys (every tree shape: perfect, one short, one over) and random larger
// sets, with probes at, between, before and after the keys.
#include "btree/bset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace tfs::btree {
namespace {

struct Built {
  std::vector<u8> buf;
  Set set;
};

// Value sizes that differ from key to key (kMixedSizes as Build's val_bytes):
// 0..40 bytes, so that keys of one block take different space.
constexpr u32 kMixedSizes = ~0u;
u32 ValBytes(u32 val_bytes, const Pos& p) { return val_bytes == kMixedSizes ? u32(p.offset * 7 % 41) : val_bytes; }

// A set of `positions` (sorted, unique) with values of `val_bytes` bytes.
void Build(const std::vector<Pos>& positions, u32 val_bytes, Built* out, Set::Form form = Set::Form::kAuto) {
  usize bytes = sizeof(SetHeader) + 8;
  for (const Pos& p : positions) bytes += KeySpace(ValBytes(val_bytes, p));
  out->buf.assign(bytes, 0xee);
  SetBuilder b(out->buf.data(), u32(out->buf.size()), kBtreeTest, 42, 7);
  std::vector<u8> val(kMaxValueBytes);
  for (const Pos& p : positions) {
    const u32 n = ValBytes(val_bytes, p);
    for (u32 i = 0; i < n; i++) val[i] = u8(p.offset + i);
    KeyInput k{p, kKeyValue, val.data(), n};
    ASSERT_TRUE(b.Add(k).ok());
  }
  b.Finish();
  ASSERT_TRUE(out->set.Index(reinterpret_cast<const SetHeader*>(out->buf.data()), kBtreeTest, form).ok());
}

void CheckAgainstModel(const std::vector<Pos>& positions, const Set& set, const std::vector<Pos>& probes) {
  ASSERT_EQ(set.size(), positions.size());
  for (u32 i = 0; i < set.size(); i++) ASSERT_EQ(set.KeyPos(i), positions[i]);
  for (const Pos& q : probes) {
    u32 want = u32(std::lower_bound(positions.begin(), positions.end(), q) - positions.begin());
    ASSERT_EQ(set.LowerBound(q), want) << "probe " << q.inode << ":" << q.offset << " n=" << positions.size();
    bool present = want < positions.size() && positions[want] == q;
    ASSERT_EQ(set.Find(q), present ? want : set.size());
    KeyRef k = set.FindKey(q);
    ASSERT_EQ(k.valid(), present);
    if (present) {
      ASSERT_EQ(k.raw(), set.Key(want).raw());
    }
  }
}

// Both sealed forms of the same keys against the model: the packed one when the
// keys fit it (checked: `packs`), and the wide one always.
void CheckBothForms(const std::vector<Pos>& positions, u32 val_bytes, const std::vector<Pos>& probes, bool packs) {
  Built b;
  Build(positions, val_bytes, &b);
  ASSERT_EQ(b.set.packed(), packs);
  CheckAgainstModel(positions, b.set, probes);
  Built w;
  Build(positions, val_bytes, &w, Set::Form::kWide);
  ASSERT_FALSE(w.set.packed());
  CheckAgainstModel(positions, w.set, probes);
}

// Probes at, just before and just after every key in both fields, and the ends.
std::vector<Pos> ProbesAround(const std::vector<Pos>& positions) {
  std::vector<Pos> probes;
  for (const Pos& p : positions)
    for (u64 di : {u64(-1), u64(0), u64(1)})
      for (u64 d : {u64(-1), u64(0), u64(1)}) probes.push_back(Pos{kBtreeTest, p.inode + di, p.offset + d});
  probes.push_back(Pos::Min(kBtreeTest));
  probes.push_back(Pos::Max(kBtreeTest));
  probes.push_back(Pos::Max(kBtreeTest - 1));  // before every key: another btree
  probes.push_back(Pos::Min(kBtreeTest + 1));  // after every key
  return probes;
}

TEST(SetTest, LowerBoundMatchesModelForEverySmallSize) {
  for (u32 n = 1; n <= 300; n++) {
    std::vector<Pos> positions;
    for (u32 i = 0; i < n; i++) positions.push_back(Pos{kBtreeTest, i / 3, 10 * u64(i)});
    std::vector<Pos> probes;
    for (const Pos& p : positions) {
      probes.push_back(p);
      probes.push_back(Pos{kBtreeTest, p.inode, p.offset + 1});
      if (p.offset > 0) probes.push_back(Pos{kBtreeTest, p.inode, p.offset - 1});
    }
    probes.push_back(Pos::Min(kBtreeTest));
    probes.push_back(Pos::Max(kBtreeTest));
    probes.push_back(Pos::Max(kBtreeTest - 1));  // before every key: another btree
    probes.push_back(Pos::Min(kBtreeTest + 1));  // after every key
    Built b;
    Build(positions, n % 17, &b);
    CheckAgainstModel(positions, b.set, probes);
  }
}

// The open (in-order) form answers exactly as the Eytzinger form, and Seal /
// Unseal convert between them, for every small size and every probe.
TEST(SetTest, OpenFormMatchesModelAndSealsAndUnseals) {
  for (u32 n = 1; n <= 130; n++) {
    std::vector<Pos> positions;
    for (u32 i = 0; i < n; i++) positions.push_back(Pos{kBtreeTest, i / 5, 7 * u64(i)});
    std::vector<Pos> probes;
    for (const Pos& p : positions) {
      probes.push_back(p);
      probes.push_back(Pos{kBtreeTest, p.inode, p.offset + 1});
    }
    probes.push_back(Pos::Min(kBtreeTest));
    probes.push_back(Pos::Max(kBtreeTest));
    probes.push_back(Pos::Max(kBtreeTest - 1));
    probes.push_back(Pos::Min(kBtreeTest + 1));
    Built b;
    Build(positions, n % 13, &b);
    ASSERT_TRUE(b.set.Unseal().ok());
    ASSERT_TRUE(b.set.open());
    CheckAgainstModel(positions, b.set, probes);
    b.set.Seal();
    ASSERT_FALSE(b.set.open());
    CheckAgainstModel(positions, b.set, probes);
  }
}

TEST(SetTest, LowerBoundMatchesModelOnRandomSets) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 20; round++) {
    u32 n = u32(rng() % 20000) + 1;
    std::vector<Pos> positions;
    for (u32 i = 0; i < n; i++) positions.push_back(Pos{kBtreeTest, rng() % 64, rng() % 1000});
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    std::vector<Pos> probes;
    for (int i = 0; i < 2000; i++) probes.push_back(Pos{kBtreeTest, rng() % 66, rng() % 1002});
    Built b;
    Build(positions, 8, &b);
    CheckAgainstModel(positions, b.set, probes);
  }
}

TEST(SetTest, ExtremePositions) {
  std::vector<Pos> positions = {Pos::Min(kBtreeTest), Pos{kBtreeTest, 0, ~u64(0)},
                                Pos{kBtreeTest, ~u64(0), 0}, Pos::Max(kBtreeTest)};
  Built b;
  Build(positions, 0, &b);
  CheckAgainstModel(positions, b.set, positions);
}

// The packed form at the edges of its 64 bits: offsets using all of them (one
// inode), inodes using all of them (one offset), the two fields sharing them
// exactly, and one bit too many (the wide form then). Probes outside a field's
// range, below its base or past its width, take every branch of packing a probe.
TEST(SetTest, PackedFormAtTheEdgesOfItsRange) {
  std::mt19937_64 rng(11);
  struct Shape {
    u64 inode0;
    u32 ibits;  // inodes inode0 .. inode0 + 2^ibits - 1
    u64 offset0;
    u32 obits;  // offsets offset0 .. offset0 + 2^obits - 1
    bool packs;
  };
  const Shape shapes[] = {
      {0, 0, 0, 64, true},            // one inode, offsets over all 64 bits
      {~u64(0), 0, 5, 60, true},      // the last inode
      {0, 64, 7, 0, true},            // one offset, inodes over all 64 bits
      {1000, 2, 100, 62, true},       // 2 + 62 bits
      {1000, 3, 100, 62, false},      // 3 + 62: too wide
      {1u << 20, 40, 1u << 30, 24, true},
      {1u << 20, 40, 1u << 30, 25, false},
      {42, 0, 0, 0, true},            // one key's worth of range
  };
  for (const Shape& sh : shapes) {
    auto field = [&](u64 base, u32 bits, u64 r) { return bits == 0 ? base : base + (bits == 64 ? r : r % (u64(1) << bits)); };
    auto top = [&](u64 base, u32 bits) { return bits == 0 ? base : base + (bits == 64 ? ~u64(0) : (u64(1) << bits) - 1); };
    std::vector<Pos> positions;
    // The range's corners, so that it needs all its bits, then random keys.
    positions.push_back(Pos{kBtreeTest, sh.inode0, sh.offset0});
    positions.push_back(Pos{kBtreeTest, top(sh.inode0, sh.ibits), top(sh.offset0, sh.obits)});
    positions.push_back(Pos{kBtreeTest, sh.inode0, top(sh.offset0, sh.obits)});
    positions.push_back(Pos{kBtreeTest, top(sh.inode0, sh.ibits), sh.offset0});
    for (int i = 0; i < 600; i++)
      positions.push_back(Pos{kBtreeTest, field(sh.inode0, sh.ibits, rng()), field(sh.offset0, sh.obits, rng())});
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    std::vector<Pos> probes = ProbesAround(positions);
    for (int i = 0; i < 2000; i++) probes.push_back(Pos{kBtreeTest, rng(), rng()});
    CheckBothForms(positions, 8, probes, sh.packs);
  }
}

// Small sets of every size, in both forms, with keys of several inodes; keys of
// one size (a block's keys found by stride), of sizes that differ (walked), and
// of the largest size (too big for a packed block's stride).
TEST(SetTest, BothFormsMatchModelForEverySmallSize) {
  for (u32 val_bytes : {8u, kMixedSizes, kMaxValueBytes}) {
    for (u32 n = 1; n <= 140; n++) {
      std::vector<Pos> positions;
      for (u32 i = 0; i < n; i++) positions.push_back(Pos{kBtreeTest, 3 + i / 7, 1000 + 5 * u64(i % 7)});
      CheckBothForms(positions, val_bytes, ProbesAround(positions), true);
    }
  }
}

TEST(SetTest, BuilderRejectsBadInput) {
  std::vector<u8> buf(4096);
  SetBuilder b(buf.data(), u32(buf.size()), kBtreeTest, 1, 0);
  u8 v[kMaxValueBytes + 1] = {};
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kKeyValue, v, kMaxValueBytes + 1}).code(), Err::kTooBig);
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeInodes, 1, 1}, kKeyValue, v, 1}).code(), Err::kInvalidArgument);
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kKeyInvalid, v, 1}).code(), Err::kInvalidArgument);
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kNrKeyTypes, v, 1}).code(), Err::kInvalidArgument);
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kKeyWhiteout, v, 1}).code(), Err::kInvalidArgument);
  ASSERT_TRUE(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kKeyValue, v, 5}).ok());
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 1, 1}, kKeyValue, v, 5}).code(), Err::kInvalidArgument);  // equal
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 0, 9}, kKeyValue, v, 5}).code(), Err::kInvalidArgument);  // smaller
  ASSERT_TRUE(b.Add(KeyInput{Pos{kBtreeTest, 1, 2}, kKeyWhiteout, nullptr, 0}).ok());
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 2, 0}, kKeyValue, v, kMaxValueBytes}).ok(), true);
  // Full: header 32 + key 32 + whiteout 24 + max key 2072 = 2160; another needs 2072.
  EXPECT_EQ(b.Add(KeyInput{Pos{kBtreeTest, 3, 0}, kKeyValue, v, kMaxValueBytes}).code(), Err::kNoSpace);
  EXPECT_EQ(b.nkeys(), 3u);
  EXPECT_EQ(b.Finish(), 32u + 32 + 24 + 2072);
}

}  // namespace
}  // namespace tfs::btree
