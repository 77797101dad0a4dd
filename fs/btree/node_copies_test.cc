// Btree node copies written by the checkpoint (docs/design/copies.md, "Step
// 5b-2 in detail"): a filesystem of two SSDs with metadata_replicas 2 over
// MemDevices, its test tree filled and rewritten through checkpoints.
//
//  - Every node pointer names two copies on distinct members, and each copy
//    parses on its own, against its parent's pointer, into the same node;
//    the need is declared on both members; remount and fsck are clean.
//  - After a power cut, every copy the durable roots block reaches is whole.
//  - The footprint of each member follows the trees' size as nodes are
//    rewritten (its own holes), the two members alike.
//  - A member with no free bucket leaves the copy set: the nodes written
//    then have one copy (degraded, counted), the checkpoint succeeds, and
//    every key reads back after a remount; fsck is clean.
//  - One copy, the copy set's member refused a bucket: the last member
//    never leaves the set (a bucket elsewhere in the target), nothing is
//    degraded.
//  - With three members and two copies wanted, each node has two copies,
//    and every member of the target carries the declared need.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "btree/tree.h"
#include "fsck/fsck.h"
#include "mount/testing.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::btree {
namespace {

using store::Store;
using userspace::MemDevice;

constexpr u32 kNode = 4096;
constexpr u32 kBucket = 64 * 1024;  // 16 slots a bucket

struct Members {
  std::vector<std::unique_ptr<MemDevice>> devs;

  // Volatile write caches: what a power cut leaves is AfterPowerCut's.
  explicit Members(u32 n, std::vector<std::vector<uint8_t>> images = {}) {
    for (u32 i = 0; i < n; i++) {
      userspace::MemDeviceOptions o;
      o.name = "mem" + std::to_string(i);
      o.size = testing::kMemberBytes;
      o.seed = i + 1;
      o.volatile_cache = true;
      if (!images.empty()) o.initial_image = std::move(images[i]);
      devs.push_back(std::make_unique<MemDevice>(o));
    }
  }
  std::unique_ptr<Members> AfterPowerCut() const {
    std::vector<const MemDevice*> all;
    for (const auto& d : devs) all.push_back(d.get());
    return std::make_unique<Members>(u32(devs.size()), MemDevice::SnapshotDurable(all));  // one instant
  }
  std::vector<BlockDevice*> List() const {
    std::vector<BlockDevice*> l;
    for (const auto& d : devs) l.push_back(d.get());
    return l;
  }
  // Every member an SSD that may hold nodes ("ssd.a", "ssd.b", ...).
  Status Format(u8 metadata_replicas) {
    store::FormatOptions o = testing::SmallFormat(kNode);
    o.bucket_size = kBucket;
    o.metadata_replicas = metadata_replicas;
    return testing::FormatMembers(List(), o);
  }
  Status Open(Store* e, bool read_only = false) {
    store::OpenOptions oo;
    oo.read_only = read_only;
    oo.data_counts = false;  // (the btree alone: no data path)
    return testing::OpenStore(e, List(), oo);
  }
  // fsck -n: its exit code, and its output in *out.
  int Check(std::string* out) {
    std::vector<BlockDevice*> l = List();
    fsck::Options o;
    o.repair = false;
    fsck::Report r = fsck::Check(l.data(), u32(l.size()), o, [](void* ctx, const char* line) {
      *static_cast<std::string*>(ctx) += std::string(line) + "\n";
    }, out);
    return r.exit_code;
  }
};

// Key k of the test tree, and its value in round `round`.
Pos KeyPos(u32 k) { return Pos{kBtreeTest, k * 7919u % 100003u, k}; }
void Value(u32 k, u32 round, u8 (&v)[40]) { memset(v, int((k + round * 31) & 0xff), sizeof(v)); }

// Sets keys [0, n) whose index is a multiple of `every` to round's value.
void SetKeys(Store& e, u32 n, u32 every, u32 round) {
  for (u32 k = 0; k < n;) {
    Transaction tx(&e.btrees());
    for (u32 j = 0; j < 100 && k < n; k++) {
      if (k % every != 0) continue;
      u8 v[40];
      Value(k, round, v);
      ASSERT_TRUE(tx.Set(KeyPos(k), v, sizeof(v)).ok());
      j++;
    }
    ASSERT_TRUE(tx.Commit().ok());
  }
}

// Every key of [0, n) reads back with the value of the round that last set
// it (`last(k)`).
template <typename Last>
void ExpectKeys(Store& e, u32 n, Last last) {
  for (u32 k = 0; k < n; k++) {
    u8 want[40];
    Value(k, last(k), want);
    Vector<u8> got;
    ASSERT_TRUE(e.btrees().Get(KeyPos(k), &got).ok()) << "key " << k;
    ASSERT_EQ(got.size(), sizeof(want));
    ASSERT_EQ(memcmp(got.data(), want, sizeof(want)), 0) << "key " << k;
  }
}

// What the walk of every node found.
struct Walk {
  Members* ms = nullptr;
  u32 nodes = 0;
  u32 by_copies[kMaxNodeCopies + 1] = {};
  std::set<u32> members_seen;
  std::string problem;  // the first thing wrong, empty if none
};

// Visits each node: its copies are on distinct members, and each copy's
// bytes parse on their own (against the node's identity and range, as its
// parent names them) into a node whose image is the walk's node's.
Status VisitNode(void* ctx, const Btrees::NodeVisit& v) {
  auto* w = static_cast<Walk*>(ctx);
  w->nodes++;
  const u32 n = PtrCopies(*v.ptr);
  w->by_copies[n <= kMaxNodeCopies ? n : 0]++;
  std::vector<u8> want(kNode), raw(kNode), got(kNode);
  const u32 want_bytes = v.node->WriteImage(want.data(), v.node->info().seq, nullptr);
  std::set<u32> members;
  for (u32 c = 0; c < n && w->problem.empty(); c++) {
    const NodeCopy at = PtrCopy(*v.ptr, c);
    w->members_seen.insert(at.member);
    if (!members.insert(at.member).second) w->problem = "two copies on member " + std::to_string(at.member);
    w->ms->devs[at.member]->ReadRaw(at.offset, raw.data(), raw.size());
    Node copy;
    Diag diag;
    const NodeInfo expect = v.node->info();
    Status st = copy.Parse(raw.data(), raw.size(), &expect, &diag);
    if (!st.ok()) {
      w->problem = "copy " + std::to_string(c) + " does not parse: " + diag.text;
      break;
    }
    const u32 bytes = copy.WriteImage(got.data(), copy.info().seq, nullptr);
    if (bytes != want_bytes || memcmp(got.data(), want.data(), bytes) != 0)
      w->problem = "copy " + std::to_string(c) + " is another node";
  }
  return Status::Ok();
}

Walk WalkNodes(Members& ms) {
  Walk w;
  w.ms = &ms;
  Store e;
  EXPECT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  Diag diag;
  EXPECT_TRUE(e.btrees().ForEachNode(VisitNode, &w, &diag).ok()) << diag.text;
  EXPECT_TRUE(e.Close().ok());
  return w;
}

// Btree buckets on member m (a read-only open).
u64 BtreeBuckets(Members& ms, u32 m) {
  Store e;
  EXPECT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  const u64 n = e.alloc().Usage(m).by_state[u32(alloc::BucketState::kBtree)];
  EXPECT_TRUE(e.Close().ok());
  return n;
}

constexpr u32 kKeys = 3000;

TEST(NodeCopiesTest, EveryNodeHasACopyOnEachSsdAndEachCopyIsTheNode) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    SetKeys(e, kKeys, 1, 0);
    // Dirty nodes: the next checkpoint's need is declared on both members.
    for (u32 m = 0; m < 2; m++) EXPECT_GT(e.alloc().Usage(m).metadata_need, 2u) << "member " << m;
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    SetKeys(e, kKeys, 3, 1);
    const Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.degraded_nodes, 0u);
    EXPECT_EQ(s.copy_set_leaves, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_GT(w.nodes, 20u);
  EXPECT_EQ(w.by_copies[2], w.nodes);
  EXPECT_EQ(w.members_seen, (std::set<u32>{0, 1}));
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    ExpectKeys(e, kKeys, [](u32 k) { return k % 3 == 0 ? 1u : 0u; });
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
}

// A power cut after checkpoints (the last one's images in flight with
// nothing after it): every copy the durable roots block reaches is on its
// member's media, whole -- each member written was flushed before the
// roots block.
TEST(NodeCopiesTest, AfterAPowerCutEveryCopyTheRootsBlockReachesIsWhole) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  Store e;
  ASSERT_TRUE(ms.Open(&e).ok());
  for (u32 round = 0; round < 4; round++) {
    SetKeys(e, kKeys, round == 0 ? 1 : 2 + round, round);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
  }
  std::unique_ptr<Members> cut = ms.AfterPowerCut();
  ASSERT_TRUE(e.Close().ok());
  const Walk w = WalkNodes(*cut);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_GT(w.nodes, 20u);
  EXPECT_EQ(w.by_copies[2], w.nodes);
}

// Rounds of rewrites, each a checkpoint: the slots the old copies leave
// become holes of their own member, and the next copies there fill them,
// so that neither member's btree buckets grow past what the nodes fill
// (without a member's holes, every cold node would pin a bucket there).
TEST(NodeCopiesTest, EachMembersFootprintFollowsTheTreesSize) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  u64 hole_slots = 0;
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    SetKeys(e, kKeys, 1, 0);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    for (u32 round = 1; round <= 40; round++) {
      SetKeys(e, kKeys, 7 + round % 5, round);  // (a different part each round)
      ASSERT_TRUE(e.btrees().Checkpoint().ok());
    }
    hole_slots = e.btrees().GetStats().hole_slots;
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_EQ(w.by_copies[2], w.nodes);
  EXPECT_GT(hole_slots, 0u);
  const u64 fill = (w.nodes + kBucket / kNode - 1) / (kBucket / kNode);  // buckets the nodes fill
  const u64 b0 = BtreeBuckets(ms, 0), b1 = BtreeBuckets(ms, 1);
  EXPECT_LE(b0, 2 * fill + 4) << w.nodes << " nodes";
  EXPECT_LE(b1, 2 * fill + 4) << w.nodes << " nodes";
  EXPECT_LE(b0 > b1 ? b0 - b1 : b1 - b0, 2u) << b0 << " vs " << b1;
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
}

// Takes every free bucket of member m (user buckets, at the btree's own
// watermark), into *taken.
void TakeFreeBuckets(Store& e, u32 m, std::vector<alloc::BucketRef>* taken) {
  for (;;) {
    auto r = e.alloc().Allocate(dev::DevMask(1) << m, 0, alloc::BucketState::kUser, alloc::Watermark::kBtree);
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), Err::kNoSpace) << r.status().Message();
      return;
    }
    taken->push_back(r.value());
  }
}

// One copy on two SSDs, the copy set's member refused a bucket (the
// allocator's test hook: the next btree bucket asked for is refused for
// want of space): the last member left never leaves the set -- it takes a
// bucket on any member of the target, as one copy did before copies -- so
// the checkpoint succeeds and nothing is degraded.
TEST(NodeCopiesTest, TheCopySetsLastMemberRefusedABucketTakesOneElsewhere) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(1).ok());
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    SetKeys(e, kKeys, 1, 0);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    struct Refuse {
      std::atomic<int> left{0};
      std::atomic<int> refused{0};
    } refuse;
    e.alloc().SetAllocFaultForTest(
        [](void* ctx, alloc::BucketState purpose, bool) {
          auto* r = static_cast<Refuse*>(ctx);
          if (purpose != alloc::BucketState::kBtree || r->left.load() == 0) return Status::Ok();
          r->left--;
          r->refused++;
          return Status(Err::kNoSpace);
        },
        &refuse);
    for (u32 round = 1; round <= 3; round++) {
      SetKeys(e, kKeys, 1, round);
      refuse.left = 1;
      const Status st = e.btrees().Checkpoint();
      ASSERT_TRUE(st.ok()) << st.Message();
    }
    e.alloc().SetAllocFaultForTest(nullptr, nullptr);
    EXPECT_EQ(refuse.refused.load(), 3);
    const Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.degraded_nodes, 0u);
    EXPECT_EQ(s.copy_set_leaves, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_EQ(w.by_copies[1], w.nodes);
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    ExpectKeys(e, kKeys, [](u32) { return 3u; });
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
}

// Member 1's free buckets all taken (user buckets, at the btree's own
// watermark): it leaves the copy set, the nodes the checkpoint writes have
// their copy on member 0 only -- degraded, counted -- and nothing fails.
TEST(NodeCopiesTest, AMemberWithoutFreeBucketsLeavesTheCopySetAndNodesAreDegraded) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    SetKeys(e, kKeys, 1, 0);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    std::vector<alloc::BucketRef> taken;
    ASSERT_NO_FATAL_FAILURE(TakeFreeBuckets(e, 1, &taken));
    EXPECT_GT(taken.size(), 100u);
    // Rewrites enough to need more than member 1's holes and open bucket.
    for (u32 round = 1; round <= 4; round++) {
      SetKeys(e, kKeys, 1, round);
      ASSERT_TRUE(e.btrees().Checkpoint().ok());
    }
    const Stats s = e.btrees().GetStats();
    EXPECT_GT(s.degraded_nodes, 0u);
    EXPECT_GE(s.copy_set_leaves, 1u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_GT(w.by_copies[1], 0u);
  EXPECT_EQ(w.by_copies[1] + w.by_copies[2], w.nodes);
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    ExpectKeys(e, kKeys, [](u32) { return 4u; });
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
}

// Three members, two copies wanted: two copies a node, on distinct
// members, and the need declared on all three (any may be chosen).
TEST(NodeCopiesTest, ThreeMembersTwoCopiesEachNodeHasTwo) {
  Members ms(3);
  ASSERT_TRUE(ms.Format(2).ok());
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    SetKeys(e, kKeys, 1, 0);
    for (u32 m = 0; m < 3; m++) EXPECT_GT(e.alloc().Usage(m).metadata_need, 2u) << "member " << m;
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    EXPECT_EQ(e.btrees().GetStats().degraded_nodes, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  EXPECT_EQ(w.by_copies[2], w.nodes);
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
}

}  // namespace
}  // namespace tfs::btree
