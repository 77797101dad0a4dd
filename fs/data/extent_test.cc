// The extent API (data/extent.h, format v2): every kind of extent with 1..4
// copies round-trips through BuildExtent and ParseExtent to the same bytes;
// pieces and pointer edits build what they say; and every rule of the
// format refuses the value that breaks it (hostile bytes, edited through the
// on-disk structs -- this test alone may know them), random bytes included.
#include "data/extent.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace tfs::data {
namespace {

constexpr u64 kIno = 42;

btree::Pos At(u64 end) { return btree::Pos{btree::kBtreeExtents, kIno, end}; }

Extent::Ptr Plain(u8 dev, u64 offset, u32 blob_offset = 0, bool cached = false) {
  Extent::Ptr p;
  p.dev = dev;
  p.gen = u8(dev * 7 + 1);
  p.offset = offset;
  p.blob_offset = blob_offset;
  p.cached = cached;
  return p;
}

Extent::Ptr Compressed(u8 dev, u64 offset, u8 stored, u32 disk_bytes, u32 blob_offset = 0, bool cached = false) {
  Extent::Ptr p = Plain(dev, offset, blob_offset, cached);
  p.compressed = true;
  p.stored_blocks = stored;
  p.disk_bytes = disk_bytes;
  p.crc = 0xc0ffee00u + dev;
  return p;
}

// Crcs for `blocks` blocks: block i's is i * 0x01010101 + 5.
std::vector<u8> Crcs(u32 blocks) {
  std::vector<u8> c(4 * blocks);
  for (u32 i = 0; i < blocks; i++) {
    Le32 v;
    v.set(i * 0x01010101u + 5);
    memcpy(c.data() + 4 * i, &v, 4);
  }
  return c;
}

Extent Make(u64 start, u64 end, std::initializer_list<Extent::Ptr> ptrs, const std::vector<u8>* crcs) {
  Extent e;
  e.ino = kIno;
  e.start = start;
  e.end = end;
  for (const Extent::Ptr& p : ptrs) e.ptrs[e.nr_ptrs++] = p;
  e.crcs = crcs != nullptr ? crcs->data() : nullptr;
  return e;
}

std::vector<u8> Build(const Extent& e) {
  std::vector<u8> v(kExtentValueMax);
  auto len = BuildExtent(e, v.data());
  EXPECT_TRUE(len.ok()) << len.status().Message();
  v.resize(len.ok() ? len.value() : 0);
  return v;
}

void ExpectSamePtr(const Extent::Ptr& a, const Extent::Ptr& b) {
  EXPECT_EQ(a.dev, b.dev);
  EXPECT_EQ(a.gen, b.gen);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.blob_offset, b.blob_offset);
  EXPECT_EQ(a.cached, b.cached);
  EXPECT_EQ(a.compressed, b.compressed);
  EXPECT_EQ(a.stored_blocks, b.stored_blocks);
  EXPECT_EQ(a.disk_bytes, b.disk_bytes);
  EXPECT_EQ(a.crc, b.crc);
}

// Builds e, parses it back (equal fields, crcs in the value) and rebuilds it
// to the same bytes.
std::vector<u8> RoundTrip(const Extent& e) {
  std::vector<u8> v = Build(e);
  Extent x;
  EXPECT_TRUE(ParseExtent(At(e.end), v.data(), u32(v.size()), &x).ok());
  EXPECT_EQ(x.ino, kIno);
  EXPECT_EQ(x.start, e.start);
  EXPECT_EQ(x.end, e.end);
  EXPECT_EQ(x.unwritten, e.unwritten);
  EXPECT_EQ(x.nr_ptrs, e.nr_ptrs);
  for (u32 i = 0; i < e.nr_ptrs && i < x.nr_ptrs; i++) ExpectSamePtr(x.ptrs[i], e.ptrs[i]);
  EXPECT_EQ(x.crcs != nullptr, e.crcs != nullptr);
  if (x.crcs != nullptr && e.crcs != nullptr) {
    EXPECT_EQ(memcmp(x.crcs, e.crcs, 4 * e.blocks()), 0);
    EXPECT_EQ(x.crcs, v.data() + v.size() - 4 * e.blocks());  // the crcs end the value
  }
  const u32 plain = e.HasPlain() ? 4 * e.blocks() : 0;
  EXPECT_EQ(v.size(), sizeof(ExtentFormat) + e.nr_ptrs * sizeof(ExtentPtr) + plain);
  EXPECT_TRUE(Build(x) == v);
  return v;
}

TEST(ExtentTest, LayoutSizes) {
  EXPECT_EQ(sizeof(ExtentFormat), 16u);
  EXPECT_EQ(sizeof(ExtentPtr), 32u);
  EXPECT_EQ(kExtentValueMax, 16u + 4 * 32 + 4 * 128);
}

TEST(ExtentTest, EveryKindRoundTripsWithOneToFourCopies) {
  const std::vector<u8> c125 = Crcs(125), c5 = Crcs(5);
  {
    Extent u;
    u.start = 100;
    u.end = 100 + kMaxUnwrittenBlocks;
    u.unwritten = true;
    std::vector<u8> v = RoundTrip(u);
    EXPECT_EQ(v.size(), 16u);
    u8 b[kExtentValueMax];
    ASSERT_EQ(BuildUnwritten(kMaxUnwrittenBlocks, b), 16u);
    EXPECT_EQ(memcmp(b, v.data(), 16), 0);
  }
  for (u32 n = 1; n <= kMaxPtrs; n++) {
    SCOPED_TRACE("copies " + std::to_string(n));
    // Plain copies, the first authoritative, the others cached or not (the
    // fourth's blob ends at 128 blocks: the most a plain blob holds).
    Extent p = Make(1000, 1125, {}, &c125);
    for (u32 i = 0; i < n; i++) p.ptrs[p.nr_ptrs++] = Plain(u8(3 * i), (1ull << 20) * (i + 1), i, i == 2);
    RoundTrip(p);
    // Compressed copies only: no crcs.
    Extent z = Make(7, 12, {}, nullptr);
    for (u32 i = 0; i < n; i++) z.ptrs[z.nr_ptrs++] = Compressed(u8(i + 10), 4096 * (i + 300), 16, 4096 * 15 + 1, 11);
    RoundTrip(z);
    // Mixed: plain first, then compressed (cached) ones; and compressed first.
    Extent m = Make(7, 12, {Plain(0, 1 << 20, 3)}, &c5);
    for (u32 i = 1; i < n; i++) m.ptrs[m.nr_ptrs++] = Compressed(u8(i), 4096 * (i + 300), 5, 1, 0, true);
    RoundTrip(m);
    Extent r = Make(7, 12, {Compressed(9, 1 << 22, 8, 20000, 3)}, &c5);
    for (u32 i = 1; i < n; i++) r.ptrs[r.nr_ptrs++] = Plain(u8(i), 4096 * (i + 300), 0, true);
    if (n == 1) r.crcs = nullptr;
    RoundTrip(r);
  }
}

TEST(ExtentTest, PiecesOfSeveralCopiesAdvanceEveryPointer) {
  const std::vector<u8> c = Crcs(10);
  Extent e = Make(20, 30, {Plain(0, 1 << 20, 2), Compressed(1, 2 << 20, 16, 9000, 4, true), Plain(2, 3 << 20, 0, true)},
                  &c);
  std::vector<u8> v = Build(e);
  Extent parsed;
  ASSERT_TRUE(ParseExtent(At(30), v.data(), u32(v.size()), &parsed).ok());
  u8 buf[kExtentValueMax];
  // The middle: blocks [23, 27).
  auto len = BuildPiece(parsed, 3, 4, buf);
  ASSERT_TRUE(len.ok());
  Extent p;
  ASSERT_TRUE(ParseExtent(At(27), buf, len.value(), &p).ok());
  EXPECT_EQ(p.start, 23u);
  ASSERT_EQ(p.nr_ptrs, 3u);
  EXPECT_EQ(p.ptrs[0].blob_offset, 5u);
  EXPECT_EQ(p.ptrs[1].blob_offset, 7u);
  EXPECT_EQ(p.ptrs[2].blob_offset, 3u);
  for (u32 i = 0; i < 3; i++) {
    EXPECT_EQ(p.ptrs[i].offset, e.ptrs[i].offset);
    EXPECT_EQ(p.ptrs[i].cached, e.ptrs[i].cached);
  }
  // A compressed copy keeps its whole blob and crc.
  EXPECT_EQ(p.ptrs[1].stored_blocks, 16u);
  EXPECT_EQ(p.ptrs[1].disk_bytes, 9000u);
  EXPECT_EQ(p.ptrs[1].crc, e.ptrs[1].crc);
  for (u32 i = 0; i < 4; i++) EXPECT_EQ(p.BlockCrc(i), e.BlockCrc(3 + i));
  EXPECT_EQ(p.DiskBlocks(p.ptrs[0]), 5u + 4);
  EXPECT_EQ(p.DiskBlocks(p.ptrs[1]), 3u);  // ceil(9000 / 4096)
  // Into the buffer the extent was parsed from.
  len = BuildPiece(parsed, 0, 10, v.data());
  ASSERT_TRUE(len.ok());
  EXPECT_TRUE(std::vector<u8>(v.begin(), v.begin() + len.value()) == Build(e));
  // Outside the extent, or a compressed copy's blob overrun: refused.
  EXPECT_EQ(BuildPiece(e, 0, 0, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(BuildPiece(e, 8, 3, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(BuildPiece(e, 11, 1, buf).status(), Status(Err::kInvalidArgument));
  Extent tight = e;
  tight.ptrs[1].stored_blocks = 14;  // blob_offset 4 + 10 blocks: exactly
  ASSERT_TRUE(BuildExtent(tight, buf).ok());
  tight.ptrs[1].blob_offset = 5;
  EXPECT_EQ(BuildExtent(tight, buf).status(), Status(Err::kInvalidArgument));
}

TEST(ExtentTest, PointerEdits) {
  const std::vector<u8> c = Crcs(4), other = Crcs(5);
  const Extent one = Make(0, 4, {Plain(0, 1 << 20)}, &c);
  u8 buf[kExtentValueMax];
  Extent x;
  // AddPtr: a plain copy shares the crcs (and must hold the same bytes).
  auto len = AddPtr(one, Plain(1, 2 << 20, 0, true), c.data(), buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_EQ(x.nr_ptrs, 2u);
  EXPECT_TRUE(x.ptrs[1].cached);
  EXPECT_EQ(len.value(), 16u + 2 * 32 + 4 * 4);
  EXPECT_TRUE(AddPtr(one, Plain(1, 2 << 20), nullptr, buf).ok());  // e's crcs serve
  EXPECT_EQ(AddPtr(one, Plain(1, 2 << 20), other.data() + 4, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(AddPtr(one, Plain(0, 2 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));  // same member
  // A compressed extent gains a plain copy only with its crcs.
  const Extent z = Make(0, 4, {Compressed(0, 1 << 20, 4, 100)}, nullptr);
  EXPECT_EQ(AddPtr(z, Plain(1, 2 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));
  len = AddPtr(z, Plain(1, 2 << 20), c.data(), buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  ASSERT_NE(x.crcs, nullptr);
  EXPECT_EQ(memcmp(x.crcs, c.data(), c.size()), 0);
  // Four at most.
  Extent four = Make(0, 4, {Plain(0, 1 << 20), Plain(1, 1 << 20), Plain(2, 1 << 20), Plain(3, 1 << 20)}, &c);
  EXPECT_EQ(AddPtr(four, Plain(4, 1 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));
  Extent unwritten = Make(0, 4, {}, nullptr);
  unwritten.unwritten = true;
  EXPECT_EQ(AddPtr(unwritten, Plain(4, 1 << 20), c.data(), buf).status(), Status(Err::kInvalidArgument));

  // DropPtr: dropping the last plain copy takes the crcs with it; dropping the
  // last authoritative copy is refused (that is deleting the extent).
  const Extent mixed = Make(0, 4, {Plain(0, 1 << 20, 0, true), Compressed(1, 2 << 20, 4, 100), Plain(2, 3 << 20)}, &c);
  std::vector<u8> v = Build(mixed);
  Extent m;
  ASSERT_TRUE(ParseExtent(At(4), v.data(), u32(v.size()), &m).ok());
  len = DropPtr(m, 0, buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_EQ(x.nr_ptrs, 2u);
  EXPECT_EQ(x.ptrs[0].dev, 1u);
  EXPECT_EQ(x.ptrs[1].dev, 2u);
  len = DropPtr(x, 1, buf);  // into the buffer x was parsed from
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_EQ(x.nr_ptrs, 1u);
  EXPECT_TRUE(x.ptrs[0].compressed);
  EXPECT_EQ(x.crcs, nullptr);
  EXPECT_EQ(len.value(), 16u + 32);
  EXPECT_EQ(DropPtr(x, 0, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(DropPtr(x, 1, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(DropPtr(m, 1, buf).status().ok(), true);
  const Extent cached_rest = Make(0, 4, {Plain(0, 1 << 20), Plain(1, 2 << 20, 0, true)}, &c);
  EXPECT_EQ(DropPtr(cached_rest, 0, buf).status(), Status(Err::kInvalidArgument));
  // Dropping from a value in place (the crcs move down over the dropped pointer).
  v = Build(mixed);
  ASSERT_TRUE(ParseExtent(At(4), v.data(), u32(v.size()), &m).ok());
  len = DropPtr(m, 1, v.data());
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), v.data(), len.value(), &x).ok());
  EXPECT_EQ(memcmp(x.crcs, c.data(), c.size()), 0);

  // ReplacePtr: the copy in its place (the order kept), on its own member
  // or another; the crcs rules as AddPtr's.
  len = ReplacePtr(mixed, 2, Plain(2, 5 << 20), nullptr, buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  ASSERT_EQ(x.nr_ptrs, 3u);
  EXPECT_EQ(x.ptrs[0].dev, 0u);
  EXPECT_EQ(x.ptrs[1].dev, 1u);
  EXPECT_EQ(x.ptrs[2].dev, 2u);
  EXPECT_EQ(x.ptrs[2].offset, u64(5) << 20);
  EXPECT_EQ(memcmp(x.crcs, c.data(), c.size()), 0);
  EXPECT_EQ(ReplacePtr(mixed, 2, Plain(3, 5 << 20), c.data(), buf).status().ok(), true);  // another member
  EXPECT_EQ(ReplacePtr(mixed, 2, Plain(1, 5 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));  // twice
  EXPECT_EQ(ReplacePtr(mixed, 2, Plain(2, 5 << 20), other.data() + 4, buf).status(),
            Status(Err::kInvalidArgument));  // other bytes
  EXPECT_EQ(ReplacePtr(mixed, 3, Plain(3, 5 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(ReplacePtr(cached_rest, 0, Plain(0, 5 << 20, 0, true), nullptr, buf).status(),
            Status(Err::kInvalidArgument));  // no authoritative copy left
  // The last plain copy replaced by a compressed one takes the crcs away;
  // a compressed extent gets a plain copy only with its crcs.
  len = ReplacePtr(one, 0, Compressed(0, 5 << 20, 4, 100), nullptr, buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_EQ(x.crcs, nullptr);
  EXPECT_EQ(len.value(), 16u + 32);
  EXPECT_EQ(ReplacePtr(z, 0, Plain(0, 5 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));
  len = ReplacePtr(z, 0, Plain(0, 5 << 20), c.data(), buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  ASSERT_NE(x.crcs, nullptr);
  EXPECT_EQ(memcmp(x.crcs, c.data(), c.size()), 0);

  // SetCached: any copy, but never the last authoritative one.
  len = SetCached(mixed, 2, true, buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_TRUE(x.ptrs[2].cached);
  EXPECT_EQ(SetCached(x, 1, true, buf).status(), Status(Err::kInvalidArgument));
  len = SetCached(x, 0, false, buf);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(ParseExtent(At(4), buf, len.value(), &x).ok());
  EXPECT_FALSE(x.ptrs[0].cached);
  EXPECT_EQ(SetCached(x, 3, true, buf).status(), Status(Err::kInvalidArgument));
}

// The edits take an Extent from anywhere: one that breaks a rule, or an index
// that is not one of its pointers, is refused before a pointer is read or
// written (a pointer count past the array once sent DropPtr and SetCached
// gigabytes past it, and AddPtr compared terabytes of crcs).
TEST(ExtentTest, EditsCheckTheExtentBeforeIndexingIt) {
  const std::vector<u8> c = Crcs(4);
  const Extent two = Make(0, 4, {Plain(0, 1 << 20), Plain(1, 2 << 20, 0, true)}, &c);
  u8 buf[kExtentValueMax];
  for (u32 i : {2u, 3u, 4u, 1000u, ~0u}) {
    EXPECT_EQ(DropPtr(two, i, buf).status(), Status(Err::kInvalidArgument)) << i;
    EXPECT_EQ(SetCached(two, i, true, buf).status(), Status(Err::kInvalidArgument)) << i;
  }
  Extent many = two;
  many.nr_ptrs = 1u << 30;
  EXPECT_EQ(DropPtr(many, 0, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(SetCached(many, (1u << 30) - 1, false, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(BuildPiece(many, 1, 2, buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(AddPtr(many, Plain(2, 3 << 20), nullptr, buf).status(), Status(Err::kInvalidArgument));
  Extent long_one = two;  // 2^40 blocks: far past its 4 crcs
  long_one.end = 1ull << 40;
  const std::vector<u8> same = c;
  EXPECT_EQ(AddPtr(long_one, Plain(2, 3 << 20), same.data(), buf).status(), Status(Err::kInvalidArgument));
  EXPECT_EQ(BuildPiece(long_one, 0, 2, buf).status(), Status(Err::kInvalidArgument));
  Extent unwritten_with_ptrs = two;  // (breaks a rule too)
  unwritten_with_ptrs.unwritten = true;
  EXPECT_EQ(DropPtr(unwritten_with_ptrs, 1, buf).status(), Status(Err::kInvalidArgument));
  // The valid extent still edits.
  EXPECT_TRUE(DropPtr(two, 1, buf).ok());
  EXPECT_TRUE(SetCached(two, 1, false, buf).ok());
}

// The policy bytes (header bytes 8..15) are never a reason a value does not
// parse: any bytes there round-trip, and every build and edit keeps them.
TEST(ExtentTest, AnyPolicyBytesParseAndEveryEditKeepsThem) {
  const std::vector<u8> c = Crcs(4);
  Extent e = Make(10, 14, {Plain(0, 1 << 20), Plain(1, 2 << 20, 0, true)}, &c);
  std::mt19937 rng(22);
  for (int round = 0; round < 200; round++) {
    std::vector<u8> v = Build(e);
    for (u32 i = 8; i < 16; i++) v[i] = u8(rng());
    Extent x;
    ASSERT_TRUE(ParseExtent(At(14), v.data(), u32(v.size()), &x).ok()) << round;
    Le16 fg, bg;
    memcpy(&fg, v.data() + 8, 2);
    memcpy(&bg, v.data() + 10, 2);
    EXPECT_EQ(x.policy.fg_target, fg.get());
    EXPECT_EQ(x.policy.bg_target, bg.get());
    EXPECT_EQ(x.policy.replicas, v[12]);
    EXPECT_EQ(x.policy.compression, v[13]);
    EXPECT_EQ(x.policy.flags, v[14]);
    EXPECT_EQ(x.policy.reserved, v[15]);
    u8 buf[kExtentValueMax];
    auto same = BuildExtent(x, buf);
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(std::vector<u8>(buf, buf + same.value()), v);
    auto keeps = [&](Result<u32> r, u64 end, const char* what) {
      ASSERT_TRUE(r.ok()) << what;
      Extent y;
      ASSERT_TRUE(ParseExtent(At(end), buf, r.value(), &y).ok()) << what;
      EXPECT_EQ(y.policy, x.policy) << what;
    };
    keeps(BuildPiece(x, 1, 2, buf), 13, "piece");
    keeps(AddPtr(x, Plain(2, 3 << 20), nullptr, buf), 14, "add");
    keeps(DropPtr(x, 1, buf), 14, "drop");
    keeps(ReplacePtr(x, 1, Plain(3, 4 << 20), nullptr, buf), 14, "replace");
    keeps(SetCached(x, 1, false, buf), 14, "cached");
  }
}

// A valid value to break: two plain copies and a compressed one, 3 blocks.
struct Sample {
  std::vector<u8> crcs = Crcs(3);
  Extent e = Make(5, 8, {Plain(0, 1 << 20, 1), Compressed(1, 2 << 20, 4, 5000, 1, true), Plain(2, 3 << 20)}, &crcs);
  std::vector<u8> v = Build(e);
  ExtentFormat* h() { return reinterpret_cast<ExtentFormat*>(v.data()); }
  ExtentPtr* p(u32 i) { return reinterpret_cast<ExtentPtr*>(v.data() + 16 + 32 * i); }
  Status Parse(u64 end = 8) {
    Extent x;
    return ParseExtent(At(end), v.data(), u32(v.size()), &x);
  }
};

TEST(ExtentTest, EveryRuleRefusesHostileValues) {
  ASSERT_TRUE(Sample().Parse().ok());
  struct Case {
    const char* name;
    void (*edit)(Sample&);
    u64 end = 8;  // the key's offset
  };
  const Case cases[] = {
      {"version 1", [](Sample& s) { s.h()->version = 1; }},
      {"unknown extent flag", [](Sample& s) { s.h()->flags = 2; }},
      {"header reserved", [](Sample& s) { s.h()->reserved = 1; }},
      {"zero blocks", [](Sample& s) { s.h()->blocks.set(0); }},
      {"no pointer", [](Sample& s) {
         s.h()->nr_ptrs = 0;
         s.v.erase(s.v.begin() + 16, s.v.begin() + 16 + 3 * 32);
       }},
      {"five pointers", [](Sample& s) {
         s.h()->nr_ptrs = 5;
         s.v.insert(s.v.begin() + 16, s.v.begin() + 16, s.v.begin() + 16 + 2 * 32);
       }},
      {"pointers on one member", [](Sample& s) { s.p(2)->dev = 0; }},
      {"every copy cached", [](Sample& s) {
         s.p(0)->flags = kPtrCached;
         s.p(2)->flags = kPtrCached;
       }},
      {"unknown pointer flag", [](Sample& s) { s.p(0)->flags = 4; }},
      {"pointer reserved", [](Sample& s) { s.p(1)->reserved[0] = 1; }},
      {"compressed stored_blocks 0", [](Sample& s) { s.p(1)->stored_blocks = 0; }},
      {"compressed stored_blocks 17", [](Sample& s) { s.p(1)->stored_blocks = 17; }},
      {"compressed blob overrun", [](Sample& s) { s.p(1)->blob_offset.set(2); }},
      {"compressed disk_bytes 0", [](Sample& s) { s.p(1)->disk_bytes.set(0); }},
      {"compressed disk_bytes saves nothing", [](Sample& s) { s.p(1)->disk_bytes.set(4 * 4096); }},
      {"plain blob past 128 blocks", [](Sample& s) { s.p(2)->blob_offset.set(126); }},
      {"plain blob_offset huge", [](Sample& s) { s.p(0)->blob_offset.set(0xffffffffu); }},
      {"plain with stored_blocks", [](Sample& s) { s.p(0)->stored_blocks = 1; }},
      {"plain with disk_bytes", [](Sample& s) { s.p(0)->disk_bytes.set(1); }},
      {"plain with a crc", [](Sample& s) { s.p(2)->crc.set(1); }},
      {"a crc short", [](Sample& s) { s.v.pop_back(); }},
      {"a byte more", [](Sample& s) { s.v.push_back(0); }},
      {"no crcs for plain copies", [](Sample& s) { s.v.resize(16 + 3 * 32); }},
      {"crcs without a plain copy", [](Sample& s) {
         s.v.erase(s.v.begin() + 16 + 2 * 32, s.v.begin() + 16 + 3 * 32);
         s.v.erase(s.v.begin() + 16, s.v.begin() + 16 + 32);
         s.h()->nr_ptrs = 1;
         s.p(0)->flags = kPtrCompressed;
       }},
      {"plain of 129 blocks", [](Sample& s) {
         s.v.erase(s.v.begin() + 16 + 32, s.v.begin() + 16 + 2 * 32);  // (the compressed copy)
         s.h()->nr_ptrs = 2;
         s.h()->blocks.set(129);
         s.v.resize(16 + 2 * 32 + 4 * 129);
       }, 200},
      {"pointer count without its pointers", [](Sample& s) { s.v.resize(16 + 32); }},
      {"unwritten with a pointer", [](Sample& s) { s.h()->flags = kExtentUnwritten; }},
      {"unwritten with bytes after", [](Sample& s) {
         s.h()->flags = kExtentUnwritten;
         s.h()->nr_ptrs = 0;
         s.v.resize(17);
       }},
      {"unwritten too long", [](Sample& s) {
         s.h()->flags = kExtentUnwritten;
         s.h()->nr_ptrs = 0;
         s.h()->blocks.set(kMaxUnwrittenBlocks + 1);
         s.v.resize(16);
       }, kMaxUnwrittenBlocks + 1},
  };
  for (const Case& c : cases) {
    Sample s;
    c.edit(s);
    EXPECT_EQ(s.Parse(c.end), Status(Err::kCorrupt)) << c.name;
  }
  // A plain blob of exactly 128 blocks is fine.
  Sample edge;
  edge.p(2)->blob_offset.set(125);
  EXPECT_TRUE(edge.Parse().ok());
  // An unwritten extent with the header alone is fine; one starting before block 0 is not.
  Sample u;
  u.h()->flags = kExtentUnwritten;
  u.h()->nr_ptrs = 0;
  u.v.resize(16);
  EXPECT_TRUE(u.Parse().ok());
  EXPECT_EQ(u.Parse(2), Status(Err::kCorrupt));
  EXPECT_EQ(Sample().Parse(2), Status(Err::kCorrupt));
  // An inode number past the limit (btree::kInoLimit); the one below it is fine.
  {
    Sample s;
    Extent x;
    for (const u64 ino : {btree::kInoLimit, ~u64(0)})
      EXPECT_EQ(ParseExtent(btree::Pos{btree::kBtreeExtents, ino, 8}, s.v.data(), u32(s.v.size()), &x),
                Status(Err::kCorrupt))
          << ino;
    EXPECT_TRUE(ParseExtent(btree::Pos{btree::kBtreeExtents, btree::kInoLimit - 1, 8}, s.v.data(), u32(s.v.size()), &x).ok());
  }
  // Nothing invalid is built either.
  Sample b;
  Extent bad = b.e;
  bad.ptrs[2].dev = 0;
  u8 buf[kExtentValueMax];
  EXPECT_EQ(BuildExtent(bad, buf).status(), Status(Err::kInvalidArgument));
  bad = b.e;
  bad.crcs = nullptr;
  EXPECT_EQ(BuildExtent(bad, buf).status(), Status(Err::kInvalidArgument));
}

// Random bytes -- flipped, cut, spliced into valid values, and noise -- never
// crash the parser, and whatever it accepts rebuilds to the same bytes.
TEST(ExtentTest, RandomBytesNeverCrash) {
  std::mt19937 rng(2121);
  Extent unwritten = Make(0, 9, {}, nullptr);
  unwritten.unwritten = true;
  const std::vector<std::vector<u8>> seeds = {Sample().v, Build(unwritten),
                                              Build(Make(0, 1, {Compressed(0, 1 << 20, 1, 7)}, nullptr))};
  u32 accepted = 0;
  for (int i = 0; i < 200000; i++) {
    std::vector<u8> v;
    if (i % 4 == 3) {
      v.resize(rng() % (kExtentValueMax + 8));
      for (u8& b : v) b = u8(rng());
      if (!v.empty() && rng() % 2) v[0] = kExtentVersion;
    } else {
      v = seeds[i % 3];
      const int flips = 1 + int(rng() % 3);
      for (int f = 0; f < flips && !v.empty(); f++) v[rng() % v.size()] ^= u8(1u << (rng() % 8));
      if (rng() % 8 == 0) v.resize(rng() % (v.size() + 1));
    }
    // In a buffer of exactly its size: a read past it is the sanitizers' to catch.
    std::unique_ptr<u8[]> exact(new u8[v.size()]);
    if (!v.empty()) memcpy(exact.get(), v.data(), v.size());
    Extent x;
    const u64 end = 8 + rng() % 4;
    if (!ParseExtent(At(end), exact.get(), u32(v.size()), &x).ok()) continue;
    accepted++;
    u8 buf[kExtentValueMax];
    auto len = BuildExtent(x, buf);
    ASSERT_TRUE(len.ok());
    ASSERT_EQ(len.value(), v.size());
    ASSERT_EQ(memcmp(buf, v.data(), v.size()), 0);
  }
  EXPECT_GT(accepted, 0u);
}

}  // namespace
}  // namespace tfs::data
