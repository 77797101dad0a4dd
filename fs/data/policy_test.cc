// The extent's policy (data/policy.h): the member table a filesystem builds,
// target codes made canonical, and PolicyOf refusing every byte this
// filesystem cannot hold (as the unset policy, never a parse failure).
#include "data/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "data/data.h"
#include "data/reconcile.h"
#include "data/testing.h"
#include "mount/testing.h"

namespace tfs::data {
namespace {

// Members 0..4: "ssd.a" "hdd.b" "ssd.c" "hdd.d" "nvme" (a group of its own).
MemberTable Table() {
  MemberTable t;
  t.count = 5;
  const dev::DevMask ssd = 0b00101, hdd = 0b01010, nvme = 0b10000;
  const dev::DevMask g[5] = {ssd, hdd, ssd, hdd, nvme};
  for (u32 m = 0; m < 5; m++) {
    t.group[m] = g[m];
    t.durability[m] = 1;
  }
  t.durable = 0b11111;
  return t;
}

TEST(PolicyTest, TargetCodesAreMadeCanonical) {
  const MemberTable t = Table();
  // Members 0..4 are codes 1..5; a member past them names nothing.
  for (u16 m = 0; m < 5; m++) {
    EXPECT_EQ(CanonicalTarget(t, u16(kTargetMember + m)), kTargetMember + m);
    EXPECT_EQ(TargetMembers(t, u16(kTargetMember + m)), dev::DevMask(1) << m);
  }
  EXPECT_EQ(CanonicalTarget(t, kTargetMember + 5), 0);
  EXPECT_EQ(TargetMembers(t, kTargetMember + 5), 0u);
  // A group by any of its members is the group by its lowest.
  EXPECT_EQ(CanonicalTarget(t, kTargetGroup | 2), kTargetGroup | 0);
  EXPECT_EQ(CanonicalTarget(t, kTargetGroup | 3), kTargetGroup | 1);
  EXPECT_EQ(CanonicalTarget(t, kTargetGroup | 1), kTargetGroup | 1);
  EXPECT_EQ(CanonicalTarget(t, kTargetGroup | 4), kTargetGroup | 4);
  EXPECT_EQ(TargetMembers(t, kTargetGroup | 3), 0b01010u);
  // Nothing else is a code.
  for (u16 bad : {u16(kTargetGroup | 5), u16(kTargetGroup | 0xff), u16(0x200), u16(0x201), u16(0xffff), u16(0x80)})
    EXPECT_EQ(CanonicalTarget(t, bad), 0) << bad;
  EXPECT_EQ(CanonicalTarget(t, 0), 0);
  EXPECT_EQ(TargetMembers(t, 0), 0u);
}

TEST(PolicyTest, PolicyOfRefusesWhatTheFilesystemCannotHold) {
  const MemberTable t = Table();
  Extent e;
  e.policy = Policy{u16(kTargetGroup | 2), u16(kTargetMember + 3), 2, kCompressZstd, kPolicyIncompressible, 0};
  Policy p;
  ASSERT_TRUE(PolicyOf(e, t, &p));
  EXPECT_EQ(p.fg_target, kTargetGroup | 0);  // canonical
  EXPECT_EQ(p.bg_target, kTargetMember + 3);
  EXPECT_EQ(p.replicas, 2);
  EXPECT_EQ(p.compression, kCompressZstd);
  EXPECT_EQ(p.flags, kPolicyIncompressible);
  struct Case {
    const char* name;
    void (*edit)(Policy&);
  };
  const Case cases[] = {
      {"fg member past the members", [](Policy& q) { q.fg_target = kTargetMember + 5; }},
      {"bg group of no member", [](Policy& q) { q.bg_target = kTargetGroup | 9; }},
      {"bg neither member nor group", [](Policy& q) { q.bg_target = 0x300; }},
      {"replicas 5", [](Policy& q) { q.replicas = kPolicyReplicasMax + 1; }},
      {"compression 3", [](Policy& q) { q.compression = 3; }},
      {"unknown flag", [](Policy& q) { q.flags = 2; }},
      {"reserved", [](Policy& q) { q.reserved = 1; }},
  };
  for (const Case& c : cases) {
    Extent x = e;
    c.edit(x.policy);
    Policy out{1, 1, 1, 1, 1, 1};
    EXPECT_FALSE(PolicyOf(x, t, &out)) << c.name;
    EXPECT_EQ(out, Policy{}) << c.name;
  }
  // The unset policy is valid, and stays unset.
  Extent z;
  ASSERT_TRUE(PolicyOf(z, t, &p));
  EXPECT_EQ(p, Policy{});
}

// A filesystem's table: its groups by label, durability, targets and
// defaults, as the data path builds it at Open.
TEST(PolicyTest, TheDataPathBuildsTheTableFromTheStore) {
  auto a = testing::MemMember(), b = testing::MemMember(), c = testing::MemMember();
  store::FormatOptions fo = testing::TwoTierFormat();
  fo.data_replicas = 2;
  fo.compression = sb::CompressionType::kZstd;
  ASSERT_TRUE(testing::FormatMembers({a.get(), b.get(), c.get()}, fo, {"ssd.a", "hdd.b", "hdd.c"}, {1, 1, 0}).ok());
  store::Store store;
  ASSERT_TRUE(testing::OpenStore(&store, {a.get(), b.get(), c.get()}).ok());
  DataPath data;
  ASSERT_TRUE(data.Open(&store).ok());
  const MemberTable& t = data.members();
  ASSERT_EQ(t.count, 3u);
  dev::DevMask ssd = 0, hdd = 0, durable = 0;
  for (u32 m = 0; m < 3; m++) {
    const std::string label = store.sb().members[m].label;
    (label.rfind("ssd", 0) == 0 ? ssd : hdd) |= dev::DevMask(1) << m;
    if (label != "hdd.c") durable |= dev::DevMask(1) << m;
    EXPECT_EQ(t.durability[m], label == "hdd.c" ? 0 : 1) << label;
  }
  for (u32 m = 0; m < 3; m++) EXPECT_EQ(t.group[m], (ssd >> m) & 1 ? ssd : hdd) << m;
  EXPECT_EQ(t.fg_target, ssd);
  EXPECT_EQ(t.bg_target, hdd);
  EXPECT_EQ(t.promote_target, 0u);  // (names nothing)
  EXPECT_EQ(t.durable, durable);
  EXPECT_EQ(t.data_replicas, 2u);
  EXPECT_TRUE(t.compress);
  data.Close();
  EXPECT_TRUE(store.Close().ok());
}

// --- ReconcileOf (step 22-3c) -----------------------------------------------

MemberTable TwoTier() { return testing::TwoTierTable(); }

std::vector<u8> Crcs16() { return std::vector<u8>(4 * 16, 0x5a); }

Extent On(std::initializer_list<std::pair<u8, bool>> ptrs, const std::vector<u8>& crcs, u32 blocks = 4) {
  return testing::ExtentOn(7, blocks, blocks, ptrs, crcs.data());
}

TEST(ReconcileTest, ADemotionIsPlacementThenACacheOnlyChangeThenNothing) {
  const MemberTable t = TwoTier();
  const std::vector<u8> c = Crcs16();
  Work w = ReconcileOf(t, On({{0, false}}, c));  // written on the ssd
  EXPECT_EQ(w.reasons, kWorkPlacement);
  EXPECT_EQ(w.dest, kDestMember + 1);
  EXPECT_EQ(w.members, 0b10u);
  w = ReconcileOf(t, On({{0, false}, {1, false}}, c));  // the hdd copy written: the ssd one is surplus
  EXPECT_EQ(w.reasons, kWorkCacheOnly);
  EXPECT_EQ(w.dest, kDestNoIo);
  EXPECT_EQ(w.members, 0u);
  w = ReconcileOf(t, On({{0, true}, {1, false}}, c));  // the ssd copy cached
  EXPECT_EQ(w.reasons, 0);
  // No background target: nothing to do for a file with one copy.
  MemberTable none = t;
  none.bg_target = 0;
  EXPECT_EQ(ReconcileOf(none, On({{0, false}}, c)).reasons, 0);
  // The file's own target overrides the filesystem's: ssd as background.
  Extent e = On({{0, false}}, c);
  e.policy.bg_target = kTargetMember + 0;
  EXPECT_EQ(ReconcileOf(t, e).reasons, 0);
  // Unwritten: nothing.
  Extent u;
  u.end = 8;
  u.unwritten = true;
  EXPECT_EQ(ReconcileOf(t, u).reasons, 0);
}

TEST(ReconcileTest, DurabilityWorkGoesToTheForegroundTargetAndIsStuckWhenNoMemberCanTakeIt) {
  MemberTable t = TwoTier();
  t.bg_target = 0;
  t.data_replicas = 2;
  const std::vector<u8> c = Crcs16();
  // Two copies wanted, the foreground target (ssd, one member) holds one:
  // stuck -- no member of it lacks a copy.
  Work w = ReconcileOf(t, On({{0, false}}, c));
  EXPECT_EQ(w.reasons, kWorkDurability);
  EXPECT_EQ(w.dest, (kDestMember + 0) | kDestStuck);
  // Without a foreground target, any member: the hdd takes it.
  t.fg_target = 0;
  w = ReconcileOf(t, On({{0, false}}, c));
  EXPECT_EQ(w.reasons, kWorkDurability);
  EXPECT_EQ(w.dest, kDestAny);
  EXPECT_EQ(w.members, 0b11u);
  // A copy on a member of durability 0 counts nothing, and once two
  // durable copies exist it is surplus.
  MemberTable three = t;
  three.count = 3;
  three.group[2] = 0b100;
  three.durability[2] = 0;
  w = ReconcileOf(three, On({{2, false}, {0, false}}, c));
  EXPECT_EQ(w.reasons, kWorkDurability);
  EXPECT_EQ(w.members, 0b11u);
  w = ReconcileOf(three, On({{2, false}, {0, false}, {1, false}}, c));
  EXPECT_EQ(w.reasons, kWorkCacheOnly);
  // Replicas in the policy: 1 needs nothing more.
  Extent e = On({{0, false}}, c);
  e.policy.replicas = 1;
  EXPECT_EQ(ReconcileOf(t, e).reasons, 0);
}

TEST(ReconcileTest, CompressionEndsWhenZstdSavedNothing) {
  MemberTable t = TwoTier();
  t.bg_target = 0;
  t.compress = true;
  const std::vector<u8> c = Crcs16();
  Extent e = On({{0, false}}, c);
  Work w = ReconcileOf(t, e);
  EXPECT_EQ(w.reasons, kWorkCompress);
  EXPECT_EQ(w.dest, kDestMember + 0);  // rewritten on its own member
  e.policy.flags = kPolicyIncompressible;
  EXPECT_EQ(ReconcileOf(t, e).reasons, 0);
  e.policy = Policy{};
  e.policy.compression = kCompressNone;  // the file's option over the filesystem's
  EXPECT_EQ(ReconcileOf(t, e).reasons, 0);
  // With a placement due, the move writes compressed copies; then the ssd
  // copy is surplus, and made cached alone -- not rewritten compressed to be
  // dropped next, nor keyed under the ssd (parked when the ssd is full).
  t.bg_target = 0b10;
  w = ReconcileOf(t, On({{0, false}}, c));
  EXPECT_EQ(w.reasons, kWorkPlacement | kWorkCompress);
  EXPECT_EQ(w.dest, kDestMember + 1);
  Extent moved = On({{0, false}, {1, false}}, c);
  moved.ptrs[1].compressed = true;
  moved.ptrs[1].stored_blocks = 4;
  moved.ptrs[1].disk_bytes = 100;
  w = ReconcileOf(t, moved);
  EXPECT_EQ(w.reasons, kWorkCacheOnly);
  EXPECT_EQ(w.dest, kDestNoIo);
  moved.ptrs[0].cached = true;
  EXPECT_EQ(ReconcileOf(t, moved).reasons, 0);
}

TEST(ReconcileTest, ABadPolicyIsReadAsUnsetAndSaidSo) {
  const MemberTable t = TwoTier();
  const std::vector<u8> c = Crcs16();
  Extent e = On({{0, false}}, c);
  e.policy.bg_target = kTargetMember + 0;  // would keep it on the ssd
  e.policy.reserved = 1;                   // ... but the policy is bad: the filesystem's (hdd)
  const Work w = ReconcileOf(t, e);
  EXPECT_TRUE(w.policy_bad);
  EXPECT_EQ(w.reasons, kWorkPlacement);
  EXPECT_EQ(w.dest, kDestMember + 1);
}

TEST(ReconcileTest, DestinationCodesNameMembersByTheirSet) {
  const MemberTable t = Table();  // ssd {0,2}, hdd {1,3}, nvme {4}
  EXPECT_EQ(DestOf(t, 0b00100), kDestMember + 2);
  EXPECT_EQ(DestOf(t, 0b00101), kDestGroup + 0);
  EXPECT_EQ(DestOf(t, 0b01010), kDestGroup + 1);
  EXPECT_EQ(DestOf(t, 0b10000), kDestMember + 4);  // a group of one is its member
  EXPECT_EQ(DestOf(t, 0b00011), kDestAny);          // not one group
  EXPECT_EQ(DestOf(t, 0b11111), kDestAny);
  EXPECT_EQ(DestOf(t, 0), kDestAny);
  EXPECT_EQ(DestOf(t, dev::DevMask(1) << 7), kDestAny);  // past the members
  // 32 members, the last in a group with the first: every code fits.
  MemberTable big;
  big.count = 32;
  for (u32 m = 0; m < 32; m++) big.group[m] = dev::DevMask(1) << m;
  big.group[0] = big.group[31] = (dev::DevMask(1) << 31) | 1;
  EXPECT_EQ(DestOf(big, dev::DevMask(1) << 31), kDestMember + 31);
  EXPECT_EQ(DestOf(big, big.group[31]), kDestGroup + 0);
  EXPECT_EQ(DestOf(big, ~dev::DevMask(0)), kDestAny);
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetMember + 31)), kTargetMember + 31);
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetMember + 32)), 0);
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetGroup | 31)), kTargetGroup | 0);
  EXPECT_EQ(TargetMembers(big, u16(kTargetGroup | 31)), big.group[0]);
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetGroup | 32)), 0);
  big.count = 40;  // (a table past the members' limit is read as 32)
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetMember + 35)), 0);
  EXPECT_EQ(CanonicalTarget(big, u16(kTargetGroup | 35)), 0);
  EXPECT_EQ(DestOf(big, dev::DevMask(1) << 31), kDestMember + 31);
}

// A model of the engine (step 22-4 builds the real one): one step of the
// work w names, done as the engine will -- a copy on a member of the
// destination that lacks one (in place of a cached copy, or of a copy
// outside the destination when the extent is full), compressed when
// compression is due (zstd may save nothing: then the extent is marked
// incompressible), a plain copy rewritten compressed on its own member, a
// surplus copy made cached. False when it cannot: work no engine could do.
bool DoStep(const MemberTable& t, const Work& w, Extent* e, std::mt19937& rng, const std::vector<u8>& crcs) {
  const bool zstd = (w.reasons & kWorkCompress) != 0;
  auto compressed = [&](Extent::Ptr* p) {
    if (rng() % 4 == 0) {  // zstd saved nothing
      e->policy.flags |= kPolicyIncompressible;
      p->compressed = false;
      p->stored_blocks = 0;
      p->disk_bytes = 0;
      return;
    }
    p->compressed = true;
    p->stored_blocks = u8(e->blocks());
    p->disk_bytes = 100;
    p->blob_offset = 0;
  };
  auto fix_crcs = [&] { e->crcs = e->HasPlain() ? crcs.data() : nullptr; };
  if ((w.reasons & (kWorkPlacement | kWorkDurability)) != 0) {
    dev::DevMask durable_has = 0, any_has = 0;
    for (u32 i = 0; i < e->nr_ptrs; i++) {
      any_has |= dev::DevMask(1) << e->ptrs[i].dev;
      if (!e->ptrs[i].cached) durable_has |= dev::DevMask(1) << e->ptrs[i].dev;
    }
    const dev::DevMask cand = w.members & ~durable_has;
    if (cand == 0) return false;
    Extent::Ptr np;
    np.dev = u8(__builtin_ctz(cand));
    if (zstd) compressed(&np);
    u32 at = e->nr_ptrs;
    for (u32 i = 0; i < e->nr_ptrs; i++)
      if (e->ptrs[i].dev == np.dev) at = i;  // its cached copy
    // A full extent gives up, in this order: a cached copy, a copy that
    // counts nothing (durability 0), a copy neither on the background
    // target nor in the destination.
    const dev::DevMask keep = w.members | w.background;
    for (u32 i = 0; i < e->nr_ptrs && at == e->nr_ptrs && e->nr_ptrs == kMaxPtrs; i++)
      if (e->ptrs[i].cached) at = i;
    for (u32 i = 0; i < e->nr_ptrs && at == e->nr_ptrs && e->nr_ptrs == kMaxPtrs; i++)
      if (t.durability[e->ptrs[i].dev] == 0) at = i;
    for (u32 i = 0; i < e->nr_ptrs && at == e->nr_ptrs && e->nr_ptrs == kMaxPtrs; i++)
      if ((keep & (dev::DevMask(1) << e->ptrs[i].dev)) == 0) at = i;
    if (at == e->nr_ptrs) {
      if (e->nr_ptrs == kMaxPtrs) return false;
      e->nr_ptrs++;
    }
    e->ptrs[at] = np;
    fix_crcs();
    return true;
  }
  if ((w.reasons & kWorkCompress) != 0) {
    for (u32 i = 0; i < e->nr_ptrs; i++) {
      Extent::Ptr& p = e->ptrs[i];
      if (p.cached || p.compressed || (w.members & (dev::DevMask(1) << p.dev)) == 0) continue;
      compressed(&p);
      fix_crcs();
      return true;
    }
    return false;
  }
  if ((w.reasons & kWorkCacheOnly) != 0) {
    for (u32 i = 0; i < e->nr_ptrs; i++) {
      if (e->ptrs[i].cached) continue;
      Extent x = *e;
      x.ptrs[i].cached = true;
      if ((ReconcileOf(t, x).reasons & (kWorkDurability | kWorkPlacement)) != 0) continue;
      *e = x;
      return true;
    }
    return false;
  }
  return false;
}

std::string Describe(const Extent& e) {
  std::string s = "policy fg " + std::to_string(e.policy.fg_target) + " bg " + std::to_string(e.policy.bg_target) +
                  " r " + std::to_string(e.policy.replicas) + " c " + std::to_string(e.policy.compression) + " f " +
                  std::to_string(e.policy.flags) + " ptrs";
  for (u32 i = 0; i < e.nr_ptrs; i++)
    s += " " + std::to_string(e.ptrs[i].dev) + (e.ptrs[i].cached ? "c" : "") + (e.ptrs[i].compressed ? "z" : "");
  return s;
}
std::string Describe(const MemberTable& t) {
  std::string s = "members " + std::to_string(t.count) + ":";
  for (u32 m = 0; m < t.count; m++) s += " g" + std::to_string(t.group[m]) + "/d" + std::to_string(t.durability[m]);
  return s + " fg " + std::to_string(t.fg_target) + " bg " + std::to_string(t.bg_target) + " r " +
         std::to_string(t.data_replicas) + " z " + std::to_string(t.compress) + "\n";
}

// Random member tables, extents and policies: the work ReconcileOf names is
// always work the engine can do, and doing it ends -- in nothing to do, or
// in stuck durability work -- within a few steps, never a loop.
TEST(ReconcileTest, DoingTheWorkAlwaysEndsInNothingOrStuck) {
  std::mt19937 rng(2203);
  const std::vector<u8> crcs = Crcs16();
  u32 ended_stuck = 0, ended_done = 0, max_steps = 0;
  for (int round = 0; round < 20000; round++) {
    MemberTable t;
    t.count = 1 + rng() % 6;
    u32 gid[6];
    for (u32 m = 0; m < t.count; m++) gid[m] = rng() % 3;
    for (u32 m = 0; m < t.count; m++) {
      for (u32 i = 0; i < t.count; i++)
        if (gid[i] == gid[m]) t.group[m] |= dev::DevMask(1) << i;
      const u8 durs[5] = {0, 1, 1, 1, 2};
      t.durability[m] = durs[rng() % 5];
      if (t.durability[m] > 0) t.durable |= dev::DevMask(1) << m;
    }
    auto target = [&]() -> dev::DevMask {
      const u32 k = rng() % 3;
      const u32 m = rng() % t.count;
      return k == 0 ? 0 : k == 1 ? dev::DevMask(1) << m : t.group[m];
    };
    t.fg_target = target();
    t.bg_target = target();
    t.data_replicas = 1 + rng() % 3;
    t.compress = rng() % 2 == 0;
    auto code = [&]() -> u16 {
      const u32 k = rng() % 3;
      const u32 m = rng() % t.count;
      return k == 0 ? 0 : k == 1 ? u16(kTargetMember + m) : u16(kTargetGroup | m);
    };
    Extent e;
    e.ino = 9;
    e.start = 0;
    e.end = 1 + rng() % 16;
    e.policy.fg_target = code();
    e.policy.bg_target = code();
    e.policy.replicas = u8(rng() % 5);
    e.policy.compression = u8(rng() % 3);
    e.policy.flags = u8(rng() % 4 == 0 ? kPolicyIncompressible : 0);
    const u32 n = 1 + rng() % std::min<u32>(t.count, kMaxPtrs);
    dev::DevMask used = 0;
    while (e.nr_ptrs < n) {
      const u32 m = rng() % t.count;
      if ((used & (dev::DevMask(1) << m)) != 0) continue;
      used |= dev::DevMask(1) << m;
      Extent::Ptr& p = e.ptrs[e.nr_ptrs++];
      p.dev = u8(m);
      p.cached = e.nr_ptrs > 1 && rng() % 3 == 0;
      if (rng() % 3 == 0 && e.blocks() > 1) {
        p.compressed = true;
        p.stored_blocks = u8(e.blocks());
        p.disk_bytes = 100;
      }
    }
    e.crcs = e.HasPlain() ? crcs.data() : nullptr;
    ASSERT_TRUE(CheckExtent(e).ok()) << round;
    bool ended = false;
    std::string trace;
    for (u32 step = 0; step < 24 && !ended; step++) {
      const Work w = ReconcileOf(t, e);
      trace += Describe(e) + " -> reasons " + std::to_string(w.reasons) + " dest " + std::to_string(w.dest) + "\n";
      ASSERT_FALSE(w.policy_bad) << round;
      // Every work ReconcileOf names is a key the index can hold.
      ReconcileKey key;
      EXPECT_EQ(ReconcileKeyOf(t, e, 1, &key), w.reasons != 0) << round;
      if (w.reasons == 0) {
        ended = true;
        ended_done++;
        max_steps = std::max(max_steps, step);
        break;
      }
      EXPECT_EQ(w.members & ~t.durable, 0u) << round;
      if ((w.dest & kDestStuck) != 0) {
        EXPECT_EQ(w.reasons, kWorkDurability) << round;
        ended = true;
        ended_stuck++;
        max_steps = std::max(max_steps, step);
        break;
      }
      // Cache-only work is never behind a destination unless a move that
      // does I/O anyway carries it.
      if ((w.reasons & (kWorkPlacement | kWorkDurability)) == 0 && (w.reasons & kWorkCacheOnly) != 0) {
        EXPECT_EQ(w.reasons, kWorkCacheOnly) << round;
      }
      if (w.reasons == kWorkCacheOnly) {
        EXPECT_EQ(w.dest, kDestNoIo) << round;
      } else {
        EXPECT_NE(w.dest, kDestNoIo) << round;
        EXPECT_NE(w.members, 0u) << round;
      }
      ASSERT_TRUE(DoStep(t, w, &e, rng, crcs)) << "round " << round << " step " << step << ": reasons "
                                              << unsigned(w.reasons) << " dest " << unsigned(w.dest) << "\n"
                                              << Describe(t) << trace;
      ASSERT_TRUE(CheckExtent(e).ok()) << round;
    }
    ASSERT_TRUE(ended) << "round " << round << ": the work did not end\n" << Describe(t) << trace;
  }
  // Both endings happen, and the work is short.
  EXPECT_GT(ended_done, 10000u);
  EXPECT_GT(ended_stuck, 100u);
  EXPECT_LE(max_steps, 12u);
}

}  // namespace
}  // namespace tfs::data
