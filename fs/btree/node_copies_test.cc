// Btree node copies written by the checkpoint (docs/design/copies.md, "Step
// 5b-2 in detail"): a filesystem of two SSDs with metadata_replicas 2 over
// MemDevices, its test tree filled and rewritten through checkpoints.
//
//  - Every node pointer names two copies on distinct members, and each copy
//    parses on its own, against its parent's pointer, into the same node;
//    the need is declared on both members; remount and fsck are clean.
//  - After a power cut, every copy the durable roots block reaches is whole.
//  - Each member reuses its own holes as nodes are rewritten: the two
//    members' footprints alike and bounded.
//  - A member with no free bucket leaves the copy set: the nodes written
//    then have one copy (degraded, counted), the checkpoint succeeds, and
//    every key reads back after a remount; fsck is clean.
//  - A member of the copy set refused a bucket is replaced by another of
//    the target (one copy on two SSDs, two on three); the only member asks
//    again anywhere (one SSD): nothing degraded either way.
//  - A damaged copy of the root, an interior node or a leaf: read from the
//    other copy, the node rewritten by the next checkpoint (counted); a
//    read-only open reads past it and rewrites nothing; every copy damaged
//    is corrupt, as one copy was.
//  - A copy whose write fails: the checkpoint succeeds with the node's
//    other copy (counted), a cut then reads every key, and the next
//    checkpoint rewrites the node whole.
//  - fsck reads every copy: each damaged one an error naming it, and -y
//    rewrites its node.
//  - A member that missed a roots block is stale: its damaged copies are
//    fsck notes, the mark persists until fsck -y has verified every copy.
//  - With three members and two copies wanted, each node has two copies,
//    and every member of the target carries the declared need.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "btree/format.h"
#include "btree/tree.h"
#include "data/testing.h"
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
  // On `devs` if given (devices over these), else on these; checkpoints
  // only when asked with `no_writer`.
  Status Open(Store* e, bool read_only = false, std::vector<BlockDevice*> devs = {}, bool no_writer = false) {
    store::OpenOptions oo;
    oo.read_only = read_only;
    oo.btree.writer_thread = !no_writer;
    oo.data_counts = false;  // (the btree alone: no data path)
    return testing::OpenStore(e, devs.empty() ? List() : devs, oo);
  }
  // fsck -n (-y with `repair`): its exit code, and its output in *out.
  int Check(std::string* out, bool repair = false) {
    std::vector<BlockDevice*> l = List();
    fsck::Options o;
    o.repair = repair;
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
  std::vector<NodePtrFormat> test_nodes;  // the test tree's, top-down
  std::string problem;  // the first thing wrong, empty if none
};

// Visits each node: its copies are on distinct members, and each copy's
// bytes parse on their own (against the node's identity and range, as its
// parent names them) into a node whose image is the walk's node's.
Status VisitNode(void* ctx, const Btrees::NodeVisit& v) {
  auto* w = static_cast<Walk*>(ctx);
  w->nodes++;
  if (v.ptr->btree_id == kBtreeTest) w->test_nodes.push_back(*v.ptr);
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

constexpr u32 kKeys = 3000;

// After the last close: the walk finds nothing wrong with any copy, every
// key k reads back with round last(k)'s value (the open's btree counters
// into *stats if given), and fsck -n is clean. The walk.
template <typename Last>
Walk ExpectWholeAndClean(Members& ms, Last last, Stats* stats = nullptr) {
  Walk w = WalkNodes(ms);
  EXPECT_TRUE(w.problem.empty()) << w.problem;
  {
    Store e;
    EXPECT_TRUE(ms.Open(&e).ok());
    ExpectKeys(e, kKeys, last);
    if (stats != nullptr) *stats = e.btrees().GetStats();
    EXPECT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
  return w;
}
// Every key of round r (for ExpectKeys, ExpectWholeAndClean).
auto Round(u32 r) {
  return [r](u32) { return r; };
}

// Damages copy c of the node p points to (bytes of its first set: the
// set's checksum fails).
void DamageCopy(Members& ms, const NodePtrFormat& p, u32 c) {
  const NodeCopy at = PtrCopy(p, c);
  const std::vector<u8> junk(64, 0xa5);
  ms.devs[at.member]->WriteRaw(at.offset + 256, junk.data(), junk.size());
}

// The test tree's root, a node of level 1 and a leaf, from a walk.
struct ThreeNodes {
  NodePtrFormat root{}, interior{}, leaf{};
};
ThreeNodes PickNodes(const Walk& w) {
  ThreeNodes t;
  EXPECT_FALSE(w.test_nodes.empty());
  if (w.test_nodes.empty()) return t;
  t.root = w.test_nodes.front();
  EXPECT_GE(t.root.level, 2u) << "the test tree is too shallow";
  bool interior = false, leaf = false;
  for (const NodePtrFormat& p : w.test_nodes) {
    if (p.level == 1 && !interior) {
      t.interior = p;
      interior = true;
    }
    if (p.level == 0 && !leaf) {
      t.leaf = p;
      leaf = true;
    }
  }
  EXPECT_TRUE(interior && leaf);
  return t;
}

// A filesystem of two SSDs, two copies, the test tree's keys set.
void FillTwoCopies(Members& ms) {
  ASSERT_TRUE(ms.Format(2).ok());
  Store e;
  ASSERT_TRUE(ms.Open(&e).ok());
  SetKeys(e, kKeys, 1, 0);
  ASSERT_TRUE(e.Close().ok());
}

// Opens e over `devs` (no writer thread), writes round 0 (every key) and
// checkpoints it, then sets round 1 (every other key): dirty nodes for the
// next checkpoint.
void OpenWithRound1(Members& ms, Store* e, std::vector<BlockDevice*> devs) {
  ASSERT_TRUE(ms.Open(e, false, std::move(devs), /*no_writer=*/true).ok());
  SetKeys(*e, kKeys, 1, 0);
  ASSERT_TRUE(e->btrees().Checkpoint().ok());
  SetKeys(*e, kKeys, 2, 1);
}

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
  const Walk w = ExpectWholeAndClean(ms, [](u32 k) { return k % 3 == 0 ? 1u : 0u; });
  EXPECT_GT(w.nodes, 20u);
  EXPECT_EQ(w.by_copies[2], w.nodes);
  EXPECT_EQ(w.members_seen, (std::set<u32>{0, 1}));
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

// Copy 1 of the test tree's root, of a node of level 1 and of a leaf
// damaged: the open reads the root and the interior node from copy 2, a
// lookup the leaf; each is dirtied (counted), and the next checkpoint
// writes every copy anew -- after it, every copy the trees name is whole.
TEST(NodeCopiesTest, ADamagedCopyIsReadFromTheOtherAndTheNodeRewritten) {
  Members ms(2);
  ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
  const ThreeNodes t = PickNodes(WalkNodes(ms));
  for (const NodePtrFormat* p : {&t.root, &t.interior, &t.leaf}) DamageCopy(ms, *p, 0);
  EXPECT_FALSE(WalkNodes(ms).problem.empty());  // (the damage shows)
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    ExpectKeys(e, kKeys, Round(0));
    const Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.node_copy_retries, 3u);
    EXPECT_EQ(s.node_repairs, 3u);
    EXPECT_EQ(s.corrupt_reads, 0u);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  Stats after;
  const Walk w = ExpectWholeAndClean(ms, Round(0), &after);
  EXPECT_EQ(w.by_copies[2], w.nodes);
  EXPECT_EQ(after.node_copy_retries, 0u);
}

// Member 1's node writes fail (its roots block and journal still write):
// the checkpoint succeeds, each node keeping its copy on member 0
// (counted), and a power cut then leaves a filesystem that reads every
// key. Member 1 is marked failed (5c-3): the next checkpoint rewrites the
// nodes whose copy failed on member 0 alone (degraded, counted in the
// roots block), even with member 1 writing again -- nothing is written
// to a failed member for the rest of the mount; after it every copy the
// trees name is whole, and member 1 is stale at the next open.
TEST(NodeCopiesTest, ACopyThatFailsToWriteLeavesItsNodeOnTheOtherUntilRewritten) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(kRootsOffset + 2 * kRootsSlotSize);
  std::unique_ptr<Members> cut;
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e, false, {ms.devs[0].get(), &gate}, /*no_writer=*/true).ok());
    SetKeys(e, kKeys, 1, 0);
    gate.Fail(true);
    const Status st = e.btrees().Checkpoint();
    ASSERT_TRUE(st.ok()) << st.Message();
    EXPECT_GT(gate.failed(), 0u);
    EXPECT_EQ(e.btrees().GetStats().node_copy_write_errors, gate.failed());
    EXPECT_EQ(e.devs().failed(), 2u);
    cut = ms.AfterPowerCut();
    gate.Fail(false);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    EXPECT_EQ(gate.failed(), e.btrees().GetStats().node_copy_write_errors);  // (none sent since)
    EXPECT_GT(e.btrees().roots().degraded_on[0], 0u);
    EXPECT_EQ(e.btrees().roots().stale_until[1], e.btrees().roots().gen);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = ExpectWholeAndClean(ms, Round(0));
  EXPECT_GT(w.by_copies[1], 0u);
  EXPECT_EQ(w.by_copies[1] + w.by_copies[2], w.nodes);
  // The cut: the roots block names the copies that failed, and the reads
  // fall back past them.
  EXPECT_FALSE(WalkNodes(*cut).problem.empty());
  Store e;
  ASSERT_TRUE(cut->Open(&e).ok());
  ExpectKeys(e, kKeys, Round(0));
  ASSERT_TRUE(e.Close().ok());
}

// A slot that fails every write (a bad sector on member 1, in a bucket
// that keeps other nodes): the node whose copy failed is rewritten, and
// its slot is never handed out again as a hole -- without that, the next
// node given it fails too, every other checkpoint (0 1 1 2 2 3 ... over
// rounds of one leaf's rewrite).
TEST(NodeCopiesTest, ASlotThatFailedAWriteIsNotReusedAsAHole) {
  Members ms(2);
  ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
  const ThreeNodes t = PickNodes(WalkNodes(ms));
  const u32 c1 = PtrCopy(t.leaf, 0).member == 1 ? 0 : 1;  // (the copy on member 1)
  const u64 bad = PtrCopy(t.leaf, c1).offset;
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(bad, bad + kNode);
  gate.Fail(true);
  Store e;
  ASSERT_TRUE(ms.Open(&e, false, {ms.devs[0].get(), &gate}, /*no_writer=*/true).ok());
  // The leaf's first position: every round rewrites the leaf, its parent
  // and the root, taking the holes the last round left.
  const Pos key{kBtreeTest, t.leaf.min_inode.get(), t.leaf.min_offset.get()};
  for (u32 round = 1; round <= 12; round++) {
    Transaction tx(&e.btrees());
    u8 v[40];
    memset(v, int(round), sizeof(v));
    ASSERT_TRUE(tx.Set(key, v, sizeof(v)).ok());
    ASSERT_TRUE(tx.Commit().ok());
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
  }
  EXPECT_GE(gate.failed(), 1u) << "the bad slot was never written: the test does not test";
  EXPECT_LE(e.btrees().GetStats().node_copy_write_errors, 1u);
  ASSERT_TRUE(e.Close().ok());
}

// fsck reads every copy: copy 2 of a leaf and of an interior node damaged
// (never read: copy 1 serves) are each an error naming the copy; fsck -y rewrites both nodes, after which the
// check is clean and every copy the trees name is whole.
TEST(NodeCopiesTest, FsckFindsEachDamagedCopyAndRepairRewritesItsNode) {
  Members ms(2);
  ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
  const ThreeNodes t = PickNodes(WalkNodes(ms));
  DamageCopy(ms, t.leaf, 1);
  DamageCopy(ms, t.interior, 1);  // (copy 1 serves: the writable open does not dirty it, RewriteNode does)
  std::string out;
  EXPECT_EQ(ms.Check(&out), fsck::kExitUncorrected) << out;
  // The line that names copy `copy` of p damaged and copy `serves` serving.
  auto has_line = [&](const NodePtrFormat& p, u32 copy, u32 serves) {
    const NodeCopy at = PtrCopy(p, copy);
    const std::string head = "level-" + std::to_string(p.level) + " node seq " + std::to_string(p.seq.get()) +
                             ": copy " + std::to_string(copy + 1) + " on member ssd." + char('a' + at.member) +
                             " offset " + std::to_string(at.offset) + " is damaged (";
    const size_t at_head = out.find(head);
    if (at_head == std::string::npos) return false;
    const std::string l = out.substr(at_head, out.find('\n', at_head) - at_head);
    return l.find("checksum mismatch); copy " + std::to_string(serves) + " serves") != std::string::npos;
  };
  EXPECT_TRUE(has_line(t.leaf, 1, 1)) << out;
  EXPECT_TRUE(has_line(t.interior, 1, 1)) << out;
  out.clear();
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitRepaired) << out;
  EXPECT_NE(out.find("level-0 node seq " + std::to_string(t.leaf.seq.get()) + ": every copy is written anew"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("level-1 node seq " + std::to_string(t.interior.seq.get()) + ": every copy is written anew"),
            std::string::npos)
      << out;
  ExpectWholeAndClean(ms, Round(0));
}

// The gen a node's image records (NodeHeader::gen), from its first copy.
u64 NodeGen(Members& ms, const NodePtrFormat& p) {
  const NodeCopy at = PtrCopy(p, 0);
  std::vector<u8> raw(kNode);
  ms.devs[at.member]->ReadRaw(at.offset, raw.data(), raw.size());
  return reinterpret_cast<const NodeHeader*>(raw.data())->gen.get();
}

// The stale members a read-only open's roots block names.
u64 StaleMembers(Members& ms) {
  Store e;
  EXPECT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  const u64 stale = StaleMask(e.btrees().roots());
  EXPECT_TRUE(e.Close().ok());
  return stale;
}

// Member 1 fails every btree write, its roots block's included, while
// member 0 takes them (a cut that reaches the members at different
// moments, as tierlab crash --metadata-replicas 2 found): member 0 holds
// the newest roots block, which names member 1's copies that were never
// written. (Before 5c-3 the checkpoint failed; now member 1 is marked
// failed at its first node copy's error, the roots block goes to member 0
// alone and says member 1 is stale, and the checkpoint succeeds.) After
// the cut member 1 is stale: every
// key reads from member 0's copies; fsck -n calls the damaged copies
// expected (notes: exit clean); the mark survives the checkpoints of a
// writable open (which rewrites the nodes it reads); fsck -y verifies or
// rewrites every copy and clears it. Without the mark the same damage is
// an error (FsckFindsEachDamagedCopyAndRepairRewritesItsNode).
TEST(NodeCopiesTest, AMemberThatMissedTheRootsBlockIsStaleUntilFsckRewritesIt) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(0);
  std::unique_ptr<Members> cut;
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {ms.devs[0].get(), &gate}));
    gate.Fail(true);
    EXPECT_TRUE(e.btrees().Checkpoint().ok());
    EXPECT_GT(gate.failed(), 1u);  // node copies (not the roots block: member 1 was marked failed)
    EXPECT_EQ(e.btrees().roots().stale_since[1], e.btrees().roots().gen);
    cut = ms.AfterPowerCut();
    e.Close().IgnoreError();
  }
  auto last = [](u32 k) { return k % 2 == 0 ? 1u : 0u; };
  std::unique_ptr<Members> cut2 = cut->AfterPowerCut();  // (a second copy of the cut)
  EXPECT_EQ(StaleMembers(*cut), 2u);
  std::string out;
  EXPECT_EQ(cut->Check(&out), fsck::kExitClean) << out;
  EXPECT_NE(out.find("member ssd.b is stale: it missed roots gens"), std::string::npos) << out;
  EXPECT_NE(out.find("serves (ssd.b missed a checkpoint's end: expected; fsck -y rewrites it)"), std::string::npos)
      << out;
  // fsck -y on the cut: every damaged copy rewritten, the mark cleared.
  out.clear();
  EXPECT_EQ(cut2->Check(&out, /*repair=*/true), fsck::kExitClean) << out;  // (notes, no error)
  EXPECT_NE(out.find("every copy on the stale members is whole: they are stale no longer"), std::string::npos)
      << out;
  EXPECT_EQ(StaleMembers(*cut2), 0u);
  const Walk w2 = ExpectWholeAndClean(*cut2, last);
  EXPECT_EQ(w2.by_copies[2], w2.nodes);
  // A writable open of the cut: every key (read past member 1's copies
  // where they come first); its checkpoints keep the mark (on both
  // members now), and the copies it did not read stay damaged.
  {
    Store e;
    ASSERT_TRUE(cut->Open(&e, false, {}, /*no_writer=*/true).ok());
    ExpectKeys(e, kKeys, last);
    EXPECT_EQ(e.btrees().GetStats().stale_members, 1u);
    SetKeys(e, 1, 1, 1);  // (key 0 to the value it has: its leaf written after the window)
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  EXPECT_EQ(StaleMembers(*cut), 2u);
  // The window ends at the gen the member was found behind at: a copy on it
  // of a node written later (every member written) is an error, not a note.
  {
    std::unique_ptr<Members> later = cut->AfterPowerCut();
    u64 until = 0;
    {
      Store e;
      ASSERT_TRUE(later->Open(&e, /*read_only=*/true).ok());
      until = e.btrees().roots().stale_until[1];
      ASSERT_TRUE(e.Close().ok());
    }
    ASSERT_NE(until, 0u);
    const Walk wl = WalkNodes(*later);
    NodePtrFormat newer{};
    bool have = false;
    for (const NodePtrFormat& p : wl.test_nodes)
      if (!have && NodeGen(*later, p) > until) {
        newer = p;
        have = true;
      }
    ASSERT_TRUE(have) << "no node written after gen " << until;
    DamageCopy(*later, newer, PtrCopy(newer, 0).member == 1 ? 0 : 1);
    std::string lo;
    EXPECT_EQ(later->Check(&lo), fsck::kExitUncorrected) << lo;
    const std::string head = "node seq " + std::to_string(newer.seq.get()) + ": copy";
    const size_t at = lo.find(head);
    ASSERT_NE(at, std::string::npos) << lo;
    EXPECT_EQ(lo.substr(at, lo.find('\n', at) - at).find("expected"), std::string::npos) << lo;
  }
  out.clear();
  EXPECT_EQ(cut->Check(&out), fsck::kExitClean) << out;
  EXPECT_NE(out.find("member ssd.b is stale: it missed roots gens"), std::string::npos) << out;
  EXPECT_NE(out.find("missed a checkpoint's end: expected"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(cut->Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  EXPECT_NE(out.find("every copy is written anew"), std::string::npos) << out;
  EXPECT_EQ(StaleMembers(*cut), 0u);
  ExpectWholeAndClean(*cut, last);
}

// Rot in member 1's roots slots is no missed checkpoint: with both slots
// damaged the member is not stale at all, and with only its newest one
// damaged it is stale from the newest gen only -- either way a damaged copy
// of a node written before stays an error (fsck exit 4), as without the
// rot (the review of 5b-4's first piece: a mark that covered every copy on
// the member hid such damage as a note).
TEST(NodeCopiesTest, ARottedRootsBlockExcusesNoOlderDamage) {
  for (int both = 0; both < 2; both++) {
    SCOPED_TRACE(both ? "both slots rotted" : "the newest slot rotted");
    Members ms(2);
    ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
    u64 gen = 0;
    {
      Store e;
      ASSERT_TRUE(ms.Open(&e).ok());
      SetKeys(e, 1, 1, 1);  // (a last checkpoint or two: one leaf, alloc records)
      ASSERT_TRUE(e.Close().ok());
      gen = e.btrees().roots().gen;
    }
    const Walk w = WalkNodes(ms);
    NodePtrFormat old{};
    bool have = false;
    for (const NodePtrFormat& p : w.test_nodes) {
      const u64 g = NodeGen(ms, p);
      EXPECT_NE(g, 0u);  // (every image records its gen)
      if (g != 0 && g < gen && !have) {
        old = p;
        have = true;
      }
    }
    ASSERT_TRUE(have) << "no node older than gen " << gen;
    DamageCopy(ms, old, PtrCopy(old, 0).member == 1 ? 0 : 1);  // (its copy on member 1)
    const std::vector<u8> junk(64, 0x5a);
    for (u32 slot = 0; slot < 2; slot++)
      if (both || slot == (gen & 1)) ms.devs[1]->WriteRaw(kRootsOffset + slot * kRootsSlotSize + 256, junk.data(),
                                                          junk.size());
    EXPECT_EQ(StaleMembers(ms), both ? 0u : 2u);
    std::string out;
    EXPECT_EQ(ms.Check(&out), fsck::kExitUncorrected) << out;
    EXPECT_NE(out.find("node seq " + std::to_string(old.seq.get()) + ": copy"), std::string::npos) << out;
    EXPECT_EQ(out.find("expected"), std::string::npos) << out;
  }
}

// Only member 1's roots block write fails (its node copies are written):
// the checkpoint succeeds on member 0's (5c-3: member 1 marked failed);
// member 1 is stale with nothing damaged, and fsck -y, which then rewrites
// no node, still clears the mark (its last checkpoint writes a roots block
// with nothing dirty).
TEST(NodeCopiesTest, AStaleMemberWithNoDamagedCopyIsClearedByFsck) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(kRootsOffset, kRootsOffset + 2 * kRootsSlotSize);
  std::unique_ptr<Members> cut;
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e, false, {ms.devs[0].get(), &gate}, /*no_writer=*/true).ok());
    SetKeys(e, kKeys, 1, 0);
    gate.Fail(true);
    EXPECT_TRUE(e.btrees().Checkpoint().ok());
    EXPECT_EQ(gate.failed(), 1u);
    EXPECT_EQ(e.devs().failed(), 2u);
    cut = ms.AfterPowerCut();
    e.Close().IgnoreError();
  }
  EXPECT_EQ(StaleMembers(*cut), 2u);
  std::string out;
  EXPECT_EQ(cut->Check(&out), fsck::kExitClean) << out;
  EXPECT_NE(out.find("member ssd.b is stale"), std::string::npos) << out;
  EXPECT_EQ(out.find("is damaged"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(cut->Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  EXPECT_EQ(out.find("every copy is written anew"), std::string::npos) << out;
  EXPECT_NE(out.find("they are stale no longer"), std::string::npos) << out;
  EXPECT_EQ(StaleMembers(*cut), 0u);
  ExpectWholeAndClean(*cut, Round(0));
}

// A read-only open reads past the damaged copy but rewrites nothing: the
// damage is still there after it.
TEST(NodeCopiesTest, AReadOnlyOpenReadsPastADamagedCopyAndLeavesIt) {
  Members ms(2);
  ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
  const ThreeNodes t = PickNodes(WalkNodes(ms));
  DamageCopy(ms, t.leaf, 0);
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
    ExpectKeys(e, kKeys, Round(0));
    const Stats s = e.btrees().GetStats();
    EXPECT_GE(s.node_copy_retries, 1u);
    EXPECT_EQ(s.node_repairs, 0u);
    EXPECT_EQ(s.dirty_nodes, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  EXPECT_FALSE(WalkNodes(ms).problem.empty());
}

// Both copies of a leaf damaged: its keys fail as one copy's did (a
// corrupt-class error), every other key reads.
TEST(NodeCopiesTest, EveryCopyDamagedIsCorruptAsOneCopyWas) {
  Members ms(2);
  ASSERT_NO_FATAL_FAILURE(FillTwoCopies(ms));
  const ThreeNodes t = PickNodes(WalkNodes(ms));
  DamageCopy(ms, t.leaf, 0);
  DamageCopy(ms, t.leaf, 1);
  Store e;
  ASSERT_TRUE(ms.Open(&e).ok());
  u32 bad = 0;
  for (u32 k = 0; k < kKeys; k++) {
    Vector<u8> got;
    const Status st = e.btrees().Get(KeyPos(k), &got);
    if (!st.ok()) {
      EXPECT_EQ(st.error_class(), ErrorClass::kCorrupt) << st.Message();
      bad++;
      continue;
    }
    u8 want[40];
    Value(k, 0, want);
    ASSERT_EQ(got.size(), sizeof(want));
    EXPECT_EQ(memcmp(got.data(), want, sizeof(want)), 0);
  }
  EXPECT_GT(bad, 0u);
  EXPECT_LT(bad, kKeys / 4);
  const Stats s = e.btrees().GetStats();
  EXPECT_GT(s.corrupt_reads, 0u);
  EXPECT_EQ(s.node_repairs, 0u);
  e.Close().IgnoreError();
}

// Btree buckets on member m (a read-only open).
u64 BtreeBuckets(Members& ms, u32 m) {
  Store e;
  EXPECT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  const u64 n = e.alloc().Usage(m).by_state[u32(alloc::BucketState::kBtree)];
  EXPECT_TRUE(e.Close().ok());
  return n;
}

// Rounds of rewrites of different parts of the tree, each a checkpoint:
// the slots the old copies leave become holes of their own member, which
// the next copies there take, so that the two members' footprints stay
// alike and within twice what the nodes fill. (Holes sent to one member's
// pool only: that member's footprint drifts from the other's, 9 buckets
// against 5 here. Whether holes make a member smaller than fresh buckets
// would depends on the workload; this checks that each member keeps its
// own.)
TEST(NodeCopiesTest, EachMemberReusesItsOwnHoles) {
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

// Two SSDs, two copies: the test tree's keys set and checkpointed, then
// every free bucket of member 1 taken (into *taken) and four rounds of
// rewrites -- enough to need more than member 1's holes and open bucket,
// so member 1 leaves the copy set and nodes are written degraded, their
// one copy on member 0. The btree counters of that mount into *stats if
// given; the mount is closed.
void WriteDegradedNodes(Members& ms, std::vector<alloc::BucketRef>* taken, Stats* stats = nullptr) {
  ASSERT_TRUE(ms.Format(2).ok());
  Store e;
  ASSERT_TRUE(ms.Open(&e).ok());
  SetKeys(e, kKeys, 1, 0);
  ASSERT_TRUE(e.btrees().Checkpoint().ok());
  EXPECT_EQ(e.btrees().roots().degraded_nodes, 0u);
  ASSERT_NO_FATAL_FAILURE(TakeFreeBuckets(e, 1, taken));
  EXPECT_GT(taken->size(), 100u);
  for (u32 round = 1; round <= 4; round++) {
    SetKeys(e, kKeys, 1, round);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
  }
  if (stats != nullptr) *stats = e.btrees().GetStats();
  ASSERT_TRUE(e.Close().ok());
}

// Three rounds of rewrites, each checkpoint's first request for a btree
// bucket refused for want of space (the allocator's test hook, as a
// member with no free bucket would): the checkpoints succeed. Every key
// reads back after, and fsck is clean. The btree counters in *out.
void RewriteRefusingOneBucketEach(Members& ms, Stats* out) {
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
    *out = e.btrees().GetStats();
    ASSERT_TRUE(e.Close().ok());
  }
  ExpectWholeAndClean(ms, Round(3));
}

// A member of the copy set refused a bucket is replaced by another member
// of the target that is not in the set: one copy on two SSDs, and two on
// three (a swap each time). One SSD, one copy: the set's only member has
// no other to take its place and never leaves the set -- it asks the
// allocator again for a bucket anywhere the nodes may go (as one copy did
// before copies: a full target's nodes spill rather than fail). Nothing is
// degraded either way.
TEST(NodeCopiesTest, AMemberRefusedABucketIsReplacedOrAsksAgain) {
  for (u32 members : {1u, 2u, 3u}) {
    SCOPED_TRACE(std::to_string(members) + " members");
    Members ms(members);
    ASSERT_TRUE(ms.Format(u8(members > 1 ? members - 1 : 1)).ok());
    Stats s;
    ASSERT_NO_FATAL_FAILURE(RewriteRefusingOneBucketEach(ms, &s));
    EXPECT_EQ(s.copy_set_swaps, members > 1 ? 3u : 0u);
    EXPECT_EQ(s.copy_set_leaves, 0u);
    EXPECT_EQ(s.degraded_nodes, 0u);
  }
}

// Member 1's free buckets all taken (user buckets, at the btree's own
// watermark): it leaves the copy set, the nodes the checkpoint writes have
// their copy on member 0 only -- degraded, counted -- and nothing fails.
TEST(NodeCopiesTest, AMemberWithoutFreeBucketsLeavesTheCopySetAndNodesAreDegraded) {
  Members ms(2);
  std::vector<alloc::BucketRef> taken;
  Stats s;
  ASSERT_NO_FATAL_FAILURE(WriteDegradedNodes(ms, &taken, &s));
  EXPECT_GT(s.degraded_nodes, 0u);
  EXPECT_GE(s.copy_set_leaves, 1u);
  const Walk w = ExpectWholeAndClean(ms, Round(4));
  EXPECT_GT(w.by_copies[1], 0u);
  EXPECT_EQ(w.by_copies[1] + w.by_copies[2], w.nodes);
}

// The roots block's degraded counts (Roots::degraded_nodes, degraded_on)
// of a read-only open, and whether the open's gauge says the same.
struct Counts {
  u64 total = 0;
  u32 on[2] = {};
};
Counts DegradedCounts(Members& ms) {
  Counts c;
  Store e;
  EXPECT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  c.total = e.btrees().roots().degraded_nodes;
  c.on[0] = e.btrees().roots().degraded_on[0];
  c.on[1] = e.btrees().roots().degraded_on[1];
  EXPECT_EQ(e.btrees().GetStats().degraded_reachable, c.total);
  EXPECT_TRUE(e.Close().ok());
  return c;
}

// A degraded read-only open with only member `given` of two: its Diag's
// text, empty when it opened (and every key of round `last` read back).
std::string OpenDegradedWith(Members& ms, u32 given, u32 last) {
  Store e;
  store::OpenOptions oo;
  oo.read_only = true;
  oo.degraded = true;
  oo.btree.writer_thread = false;  // (the accounting checked: which data it may reach)
  std::vector<BlockDevice*> devs{ms.devs[given].get()};
  Diag diag;
  const Status st = e.Open(devs.data(), 1, oo, &diag);
  if (!st.ok()) return std::string(st.Message()) + ": " + diag.text;
  ExpectKeys(e, kKeys, Round(last));
  EXPECT_TRUE(e.Close().ok());
  return "";
}

// Rewrites the roots block on every member (both slots) with member m's
// degraded count set to `count` (the checksum made good): a count that
// disagrees with the trees.
void SetDegradedOn(Members& ms, u32 m, u32 count) {
  for (auto& d : ms.devs) {
    std::vector<u8> raw(2 * kRootsSlotSize);
    d->ReadRaw(kRootsOffset, raw.data(), raw.size());
    for (u32 slot = 0; slot < 2; slot++) {
      auto* r = reinterpret_cast<RootsFormat*>(raw.data() + slot * kRootsSlotSize);
      r->degraded_on[m].set(count);
      r->csum.set(platform::Crc32cSkippingField(r, kRootsSlotSize, __builtin_offsetof(RootsFormat, csum)));
    }
    d->WriteRaw(kRootsOffset, raw.data(), raw.size());
  }
}

// Nodes written degraded (member 1 without free buckets: one copy, on
// member 0) are counted in the roots block -- in all and on member 0, as
// many as the walk finds with one copy -- and the count goes back to 0 as
// they are rewritten whole once member 1 has room. A degraded mount
// decides from it: without member 1 every key reads (no degraded node has
// a copy there); without member 0 it is refused, naming the count. fsck
// agrees with the count (clean), finds a count that disagrees (an error)
// and -y writes the recount.
TEST(NodeCopiesTest, DegradedNodesAreCountedInTheRootsBlockAndDecideADegradedMount) {
  Members ms(2);
  std::vector<alloc::BucketRef> taken;
  Stats s;
  ASSERT_NO_FATAL_FAILURE(WriteDegradedNodes(ms, &taken, &s));
  EXPECT_GT(s.degraded_reachable, 0u);
  const Walk w = ExpectWholeAndClean(ms, Round(4));  // (fsck -n: the counts agree)
  ASSERT_GT(w.by_copies[1], 0u);
  Counts c = DegradedCounts(ms);
  EXPECT_EQ(c.total, w.by_copies[1]);
  EXPECT_EQ(c.on[0], w.by_copies[1]);
  EXPECT_EQ(c.on[1], 0u);

  EXPECT_EQ(OpenDegradedWith(ms, 0, 4), "");
  const std::string refused = OpenDegradedWith(ms, 1, 4);
  EXPECT_NE(refused.find(std::to_string(c.on[0]) + " btree nodes written with fewer copies"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("missing member ssd.a"), std::string::npos) << refused;

  // A count too low (a degraded mount without ssd.a would go on): an
  // error naming both; -y writes the recount. Too high (the safe side): a
  // note, and -y writes it too.
  for (const bool low : {true, false}) {
    SCOPED_TRACE(low ? "too low" : "too high");
    SetDegradedOn(ms, low ? 0 : 1, low ? 1 : 7);
    const std::string want = low ? "ssd.a 1/" + std::to_string(c.on[0]) : "ssd.b 7/0";
    std::string out;
    EXPECT_EQ(ms.Check(&out), low ? fsck::kExitUncorrected : fsck::kExitClean) << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_EQ(out.find("the safe side") != std::string::npos, !low) << out;
    out.clear();
    EXPECT_EQ(ms.Check(&out, /*repair=*/true), low ? fsck::kExitRepaired : fsck::kExitClean) << out;
    EXPECT_NE(out.find("degraded node counts are the recount now"), std::string::npos) << out;
    out.clear();
    EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
    EXPECT_EQ(out.find("degraded node pointers"), std::string::npos) << out;
    const Counts now = DegradedCounts(ms);
    EXPECT_EQ(now.total, c.total);
    EXPECT_EQ(now.on[0], c.on[0]);
    EXPECT_EQ(now.on[1], 0u);
  }

  // Member 1's buckets back: every node rewritten whole, none degraded.
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e).ok());
    ASSERT_TRUE(e.alloc().FreeBuckets(taken.data(), u32(taken.size())).ok());
    for (u32 round = 5; round <= 6; round++) {
      SetKeys(e, kKeys, 1, round);
      ASSERT_TRUE(e.btrees().Checkpoint().ok());
    }
    EXPECT_EQ(e.btrees().GetStats().degraded_count_short, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w2 = ExpectWholeAndClean(ms, Round(6));
  EXPECT_EQ(w2.by_copies[1], 0u);
  c = DegradedCounts(ms);
  EXPECT_EQ(c.total, 0u);
  EXPECT_EQ(c.on[0], 0u);
  EXPECT_EQ(OpenDegradedWith(ms, 1, 6), "");
}

// A degraded interior node (its one copy on member 0) damaged: fsck -y
// drops it and recovers its keys from the node scan. Its pointer leaves
// the count (Impl::dropped_ptrs; its children here have two copies, so the
// count is exact again): the next fsck -n finds the counts as the walk
// does, and every key reads back. (A dropped subtree's own degraded
// pointers would stay counted: too high, a note -- docs/format/btree.md.)
TEST(NodeCopiesTest, ADroppedDegradedNodeLeavesTheCount) {
  Members ms(2);
  std::vector<alloc::BucketRef> taken;
  ASSERT_NO_FATAL_FAILURE(WriteDegradedNodes(ms, &taken));
  const Walk w = WalkNodes(ms);
  // The first degraded level-1 node, and how many of its children (the
  // leaves after it in the walk's depth-first order) are degraded too.
  NodePtrFormat victim{};
  bool found = false;
  u64 degraded_children = 0;
  for (const NodePtrFormat& p : w.test_nodes) {
    if (found && p.level > 0) break;
    if (found && PtrCopies(p) == 1) degraded_children++;
    if (!found && p.level == 1 && PtrCopies(p) == 1) {
      victim = p;
      found = true;
    }
  }
  ASSERT_TRUE(found) << "no degraded level-1 node";
  DamageCopy(ms, victim, 0);
  std::string out;
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitRepaired) << out;
  // Exact: the walk's, plus the dropped node's degraded children (not
  // known, still counted), not plus the dropped node itself.
  EXPECT_EQ(DegradedCounts(ms).total, WalkNodes(ms).by_copies[1] + degraded_children);
  out.clear();
  EXPECT_EQ(ms.Check(&out), fsck::kExitClean) << out;
  EXPECT_EQ(out.find("degraded node pointers") != std::string::npos, degraded_children != 0) << out;
  if (degraded_children != 0) {
    EXPECT_NE(out.find("(too high: the safe side)"), std::string::npos) << out;
    out.clear();
    EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitClean) << out;  // (a note: not counted repaired)
    EXPECT_EQ(DegradedCounts(ms).total, WalkNodes(ms).by_copies[1]);
  }
  Store e;
  ASSERT_TRUE(ms.Open(&e, /*read_only=*/true).ok());
  ExpectKeys(e, kKeys, Round(4));
  ASSERT_TRUE(e.Close().ok());
}

// Step 6c-3 (docs/design/copies.md): the checkpoint does not wait out a
// stalling member. GateDevice parks member 1's requests; the queue then
// sees them at the device past the member's late bound (250 ms at least),
// i.e. stalling. No timing is asserted: a give-up needs the park, and a
// wait (the only other outcome) shows up as the checkpoint not returning.

// A writable open of ms reads every key k with round last(k)'s value.
template <typename Last>
void ExpectKeysOn(Members& ms, Last last) {
  Store e;
  ASSERT_TRUE(ms.Open(&e).ok());
  ExpectKeys(e, kKeys, last);
  ASSERT_TRUE(e.Close().ok());
}

// Runs a checkpoint while `gate` parks requests. One that has not returned
// within 60 s waited out the park (a give-up that never came): a failure,
// and the gate is opened so that the test ends rather than hangs.
Status CheckpointPast(Store& e, testing::GateDevice& gate) {
  std::atomic<bool> done{false};
  Status st;
  std::thread t([&] {
    st = e.btrees().Checkpoint();
    done = true;
  });
  for (int i = 0; i < 6000 && !done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done) {
    ADD_FAILURE() << "the checkpoint waited for the parked requests";
    gate.Open();
  }
  t.join();
  return st;
}

// Until pred() holds, for at most 60 s (a failure then: the test ends
// rather than hangs).
template <typename Pred>
void AwaitOrFail(Pred pred, const char* what) {
  for (int i = 0; i < 6000 && !pred(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!pred()) ADD_FAILURE() << "never happened: " << what;
}

// Runs `op` (a checkpoint, a close) in another thread that must wait for
// what `parked` holds: once ready() holds (or op returned) and `settle_ms`
// more have passed, op must not have returned -- it cannot, whatever the
// timing, before the release -- then parked is opened and op's result
// returned.
template <typename Op, typename Ready>
Status RunWaitingFor(testing::GateDevice& parked, Op op, Ready ready, const char* what, int settle_ms = 0) {
  std::atomic<bool> done{false};
  Status st;
  std::thread t([&] {
    st = op();
    done = true;
  });
  AwaitOrFail([&] { return ready() || done.load(); }, what);
  if (settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
  EXPECT_FALSE(done.load()) << "it did not wait for the parked requests";
  parked.Open();
  t.join();
  return st;
}

// The newest valid-looking roots slot on member m (gen 0: none).
RootsFormat RootsOn(Members& ms, u32 m) {
  std::vector<u8> raw(2 * kRootsSlotSize);
  ms.devs[m]->ReadRaw(kRootsOffset, raw.data(), raw.size());
  RootsFormat best{};
  for (u32 slot = 0; slot < 2; slot++) {
    const auto* r = reinterpret_cast<const RootsFormat*>(raw.data() + slot * kRootsSlotSize);
    if (r->magic.get() == kRootsMagic && r->gen.get() > best.gen.get()) memcpy(&best, r, sizeof(best));
  }
  return best;
}
u64 RootsGenOn(Members& ms, u32 m) { return RootsOn(ms, m).gen.get(); }

// The last round that set key k, rounds r0..r3 having set keys that are
// multiples of 1, 2, 3, 5 (as many rounds as `rounds`).
u32 LastOf(u32 k, u32 rounds) {
  const u32 every[] = {1, 2, 3, 5};
  u32 last = 0;
  for (u32 r = 0; r < rounds; r++)
    if (k % every[r] == 0) last = r;
  return last;
}
auto Rounds(u32 rounds) {
  return [rounds](u32 k) { return LastOf(k, rounds); };
}

// Member 1's node writes parked (its roots block not): the checkpoint
// gives them up once member 0's copies are written and flushed, and
// succeeds -- every node rewritten next time, member 1 not failed but
// stale in the roots block, held (the next checkpoint writes nothing
// there, its nodes degraded), the parked writes' buckets never freed
// while they are out, however often the nodes are rewritten. A power cut
// meanwhile: every key read (member 1's copies fall back), fsck -y clears
// the mark. Released: the next checkpoint lets the late writes go, member
// 1 takes copies and the roots block again and the mark ends; everything
// whole and clean after the unmount.
TEST(NodeCopiesTest, AStallingMembersNodeWritesAreGivenUpAndTheNodesRewrittenWithoutIt) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(kRootsOffset + 2 * kRootsSlotSize);
  std::unique_ptr<Members> cut;
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {ms.devs[0].get(), &gate}));
    gate.Close();
    Status st = CheckpointPast(e, gate);
    ASSERT_TRUE(st.ok()) << st.Message();
    const std::vector<u64> parked = gate.ParkedOffsets();
    ASSERT_FALSE(parked.empty());
    // (Those past the queue's slots wait in it: out as well.)
    Stats s = e.btrees().GetStats();
    const u64 late = s.node_copies_late;
    EXPECT_GE(late, parked.size());
    EXPECT_EQ(s.late_node_ios, late);
    EXPECT_EQ(s.held_members, 1u);
    EXPECT_EQ(s.node_copy_write_errors, 0u);
    EXPECT_EQ(e.devs().failed(), 0u);  // (a stall is no failure)
    EXPECT_EQ(e.btrees().roots().stale_since[1], e.btrees().roots().gen);
    EXPECT_EQ(e.btrees().roots().stale_since[0], 0u);
    EXPECT_EQ(e.btrees().GetStats().stale_members, 1u);
    // Held: the rewrites (and a new round) go to member 0 alone, nothing
    // more is parked, no roots block reaches member 1, and the parked
    // writes' buckets stay the btree's.
    const u64 degraded_before = s.degraded_nodes;
    const u64 gen_on_1 = RootsGenOn(ms, 1);
    for (u32 round = 2; round <= 3; round++) {
      SetKeys(e, kKeys, 3, 2);  // (twice: the second a rewrite of the same values)
      st = CheckpointPast(e, gate);
      ASSERT_TRUE(st.ok()) << st.Message();
    }
    EXPECT_EQ(gate.ParkedOffsets().size(), parked.size());
    EXPECT_EQ(RootsGenOn(ms, 1), gen_on_1);
    EXPECT_GT(RootsGenOn(ms, 0), gen_on_1);
    s = e.btrees().GetStats();
    EXPECT_GT(s.degraded_nodes, degraded_before);
    EXPECT_EQ(s.node_copies_late, late);
    EXPECT_EQ(s.late_node_ios, late);
    EXPECT_GT(e.btrees().roots().degraded_on[0], 0u);
    for (u64 off : parked) {
      const alloc::Bucket bk = e.alloc().Get(1, e.sb().BucketOf(off));
      EXPECT_EQ(bk.state, alloc::BucketState::kBtree) << "the bucket of a late write at " << off << " was freed";
    }
    EXPECT_NE(e.btrees().roots().stale_since[1], 0u);
    cut = ms.AfterPowerCut();
    // Released: let go at the next checkpoint's start; member 1 back in.
    gate.Open();
    e.btrees().WaitLateIos();  // (the released I/Os' completions)
    SetKeys(e, kKeys, 5, 3);
    st = e.btrees().Checkpoint();
    ASSERT_TRUE(st.ok()) << st.Message();
    s = e.btrees().GetStats();
    EXPECT_EQ(s.late_node_ios, 0u);
    EXPECT_EQ(s.held_members, 0u);
    EXPECT_EQ(e.btrees().roots().stale_since[1], 0u);
    EXPECT_EQ(e.btrees().GetStats().stale_members, 0u);
    EXPECT_EQ(e.devs().failed(), 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  const Walk w = ExpectWholeAndClean(ms, Rounds(4));
  EXPECT_EQ(StaleMembers(ms), 0u);
  EXPECT_GT(w.by_copies[2], 0u);
  // The cut: member 1 stale (from the block on member 0), every key read.
  EXPECT_EQ(StaleMembers(*cut), 2u);
  ExpectKeysOn(*cut, Rounds(3));
  std::string out;
  EXPECT_EQ(cut->Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  EXPECT_EQ(StaleMembers(*cut), 0u);
  ExpectWholeAndClean(*cut, Rounds(3));
}

// Member 1's flushes parked: its copies are written but never flushed;
// given up as its writes would be (counted a late flush), the member held
// and stale; released, everything as before.
TEST(NodeCopiesTest, AStallingMembersFlushIsGivenUpLikeItsWrites) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kFlush, IoOrigin::kBtree);
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {ms.devs[0].get(), &gate}));
    gate.Close();
    const Status st = CheckpointPast(e, gate);
    ASSERT_TRUE(st.ok()) << st.Message();
    EXPECT_EQ(gate.parked(), 1u);
    const Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.node_flushes_late, 1u);
    EXPECT_GT(s.node_copies_late, 0u);
    EXPECT_EQ(s.late_node_ios, 1u);
    EXPECT_EQ(s.held_members, 1u);
    EXPECT_EQ(e.devs().failed(), 0u);
    EXPECT_EQ(e.btrees().roots().stale_since[1], e.btrees().roots().gen);
    SetKeys(e, kKeys, 3, 2);
    ASSERT_TRUE(CheckpointPast(e, gate).ok());
    EXPECT_EQ(gate.parked(), 1u);  // (held: no second flush)
    gate.Open();
    e.btrees().WaitLateIos();  // (the released I/Os' completions)
    SetKeys(e, kKeys, 5, 3);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    EXPECT_EQ(e.btrees().GetStats().held_members, 0u);
    EXPECT_EQ(e.btrees().GetStats().node_flushes_late, 1u);
    EXPECT_EQ(e.btrees().roots().stale_until[1], 0u);
    EXPECT_EQ(e.btrees().roots().stale_since[1], 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  ExpectWholeAndClean(ms, Rounds(4));
  EXPECT_EQ(StaleMembers(ms), 0u);
}

// Member 1's roots write parked: once member 0 took the block it is given
// up, member 1 held (no roots write there while one is out: both slots
// alternate) and not stale (its copies were written and flushed); the next
// checkpoint writes nodes and the block without it. A cut meanwhile: the
// mount finds member 1's block older (stale from then), every key read.
TEST(NodeCopiesTest, AStallingMembersRootsWriteIsGivenUpOnceAnotherTookTheBlock) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(kRootsOffset, kRootsOffset + 2 * kRootsSlotSize);
  std::unique_ptr<Members> cut;
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {ms.devs[0].get(), &gate}));
    gate.Close();
    ASSERT_TRUE(CheckpointPast(e, gate).ok());
    EXPECT_EQ(gate.parked(), 1u);
    Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.roots_writes_late, 1u);
    EXPECT_EQ(s.node_copies_late, 0u);
    EXPECT_EQ(s.held_members, 1u);
    EXPECT_EQ(e.btrees().roots().stale_since[1], 0u);
    const u64 degraded_before = s.degraded_nodes;
    SetKeys(e, kKeys, 3, 2);
    ASSERT_TRUE(CheckpointPast(e, gate).ok());
    EXPECT_EQ(gate.parked(), 1u);
    EXPECT_GT(e.btrees().GetStats().degraded_nodes, degraded_before);
    cut = ms.AfterPowerCut();
    gate.Open();
    e.btrees().WaitLateIos();  // (the released I/Os' completions)
    SetKeys(e, kKeys, 5, 3);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    s = e.btrees().GetStats();
    EXPECT_EQ(s.held_members, 0u);
    EXPECT_EQ(s.late_node_ios, 0u);
    ASSERT_TRUE(e.Close().ok());
  }
  ExpectWholeAndClean(ms, Rounds(4));
  EXPECT_EQ(StaleMembers(ms), 0u);
  EXPECT_EQ(StaleMembers(*cut), 2u);
  ExpectKeysOn(*cut, Rounds(3));
}

// Nothing is given up that would leave a node without a durable copy:
// member 1's node writes parked and member 0's flushes failing (member 0
// marked failed), the checkpoint waits for member 1's writes and succeeds
// with them once released. And an unmount during a stall waits for the
// late writes (nothing freed under them), then is clean.
TEST(NodeCopiesTest, ACheckpointWaitsForALateCopyThatIsANodesLastAndCloseWaitsForLateWrites) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate1(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate1.GateFrom(kRootsOffset + 2 * kRootsSlotSize);
  testing::GateDevice gate0(ms.devs[0].get(), IoOp::kFlush, IoOrigin::kBtree);
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {&gate0, &gate1}));
    gate1.Close();
    gate0.Fail(true);
    // Past member 1's late bound (at most dev::kLateMaxNs, 1 s: the
    // checkpoint has looked at giving it up; no copy of those nodes is
    // durable elsewhere).
    const Status st = RunWaitingFor(
        gate1, [&] { return e.btrees().Checkpoint(); }, [&] { return gate1.parked() != 0; },
        "member 1's writes parked", 1200);
    ASSERT_TRUE(st.ok()) << st.Message();
    EXPECT_EQ(e.btrees().GetStats().node_copies_late, 0u);
    EXPECT_EQ(e.devs().failed(), 1u);  // (member 0's flush)
    ASSERT_TRUE(e.Close().ok());
  }
  // (Member 0 failed: a remount sees it stale; fsck -y verifies it.)
  std::string out;
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  ExpectWholeAndClean(ms, Rounds(2));
  // The unmount: member 1's node writes given up, then Close during the
  // stall -- it returns only once they are released, and is clean.
  {
    Store e;
    ASSERT_TRUE(ms.Open(&e, false, {ms.devs[0].get(), &gate1}, /*no_writer=*/true).ok());
    SetKeys(e, kKeys, 3, 2);
    gate1.Close();
    ASSERT_TRUE(CheckpointPast(e, gate1).ok());
    ASSERT_GT(e.btrees().GetStats().late_node_ios, 0u);
    const Status st = RunWaitingFor(
        gate1, [&] { return e.Close(); }, [] { return true; }, "", 300);
    ASSERT_TRUE(st.ok()) << st.Message();
  }
  ExpectWholeAndClean(ms, Rounds(3));
  EXPECT_EQ(StaleMembers(ms), 0u);
}

// Member 1 given up (its node writes parked), then member 0 fails the
// roots block: no member took it, so member 1 is taken back -- its late
// writes waited for (released here), flushed, the block written there --
// and the checkpoint succeeds with member 0 marked failed; every key reads
// after a remount, and fsck -y leaves everything clean.
TEST(NodeCopiesTest, AGivenUpMemberIsTakenBackWhenNoOtherTookTheRootsBlock) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate1(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate1.GateFrom(kRootsOffset + 2 * kRootsSlotSize);
  testing::GateDevice gate0(ms.devs[0].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate0.GateFrom(kRootsOffset, kRootsOffset + 2 * kRootsSlotSize);
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {&gate0, &gate1}));
    gate1.Close();
    gate0.Fail(true);
    // Given up (counted as the node writes end), then waited for again
    // once member 0 failed the roots block.
    const Status st = RunWaitingFor(
        gate1, [&] { return e.btrees().Checkpoint(); },
        [&] { return e.btrees().GetStats().node_copies_late != 0 && gate0.failed() != 0; },
        "a give-up, then member 0's roots write");
    ASSERT_TRUE(st.ok()) << st.Message();
    const Stats s = e.btrees().GetStats();
    EXPECT_EQ(s.late_taken_back, 1u);
    EXPECT_GT(s.node_copies_late, 0u);
    EXPECT_EQ(e.devs().failed(), 1u);
    EXPECT_EQ(RootsGenOn(ms, 1), e.btrees().roots().gen);
    // (Its copies waited for and flushed: the block it alone holds does not
    // call it stale for them.)
    EXPECT_EQ(e.btrees().roots().stale_since[1], 0u);
    EXPECT_EQ(RootsOn(ms, 1).stale_since[1].get(), 0u);
    gate0.Fail(false);
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  ExpectWholeAndClean(ms, Rounds(2));
}

// Member 1 held (its roots write given up), then, two checkpoints on
// (the block's slot the late write's), member 0 fails the roots block:
// member 1 is taken back -- its late roots write waited for (released
// here) before the block goes to the same slot -- and the checkpoint
// succeeds.
TEST(NodeCopiesTest, AHeldMemberIsTakenBackWhenNoOtherTookTheRootsBlock) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate1(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate1.GateFrom(kRootsOffset, kRootsOffset + 2 * kRootsSlotSize);
  testing::GateDevice gate0(ms.devs[0].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate0.GateFrom(kRootsOffset, kRootsOffset + 2 * kRootsSlotSize);
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {&gate0, &gate1}));
    gate1.Close();
    ASSERT_TRUE(CheckpointPast(e, gate1).ok());
    ASSERT_EQ(e.btrees().GetStats().held_members, 1u);
    SetKeys(e, kKeys, 3, 2);
    ASSERT_TRUE(CheckpointPast(e, gate1).ok());  // (held: member 0 alone)
    ASSERT_EQ(gate1.parked(), 1u);
    SetKeys(e, kKeys, 5, 3);
    gate0.Fail(true);
    const Status st = RunWaitingFor(
        gate1, [&] { return e.btrees().Checkpoint(); }, [&] { return gate0.failed() != 0; },
        "member 0's roots write");
    ASSERT_TRUE(st.ok()) << st.Message();
    EXPECT_EQ(e.btrees().GetStats().late_taken_back, 1u);
    EXPECT_EQ(e.devs().failed(), 1u);
    EXPECT_EQ(RootsGenOn(ms, 1), e.btrees().roots().gen);  // (the newer write landed last)
    gate0.Fail(false);
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  ExpectWholeAndClean(ms, Rounds(4));
}

// Member 1's node writes given up, then ending in an error: the member is
// marked failed when they are let go (5c-3), and the filesystem goes on
// with member 0; fsck -y then verifies member 1, everything clean.
TEST(NodeCopiesTest, ALateWriteThatFailsMarksItsMemberFailed) {
  Members ms(2);
  ASSERT_TRUE(ms.Format(2).ok());
  testing::GateDevice gate(ms.devs[1].get(), IoOp::kWrite, IoOrigin::kBtree);
  gate.GateFrom(kRootsOffset + 2 * kRootsSlotSize);
  {
    Store e;
    ASSERT_NO_FATAL_FAILURE(OpenWithRound1(ms, &e, {ms.devs[0].get(), &gate}));
    gate.Close();
    ASSERT_TRUE(CheckpointPast(e, gate).ok());
    ASSERT_GT(e.btrees().GetStats().late_node_ios, 0u);
    EXPECT_EQ(e.devs().failed(), 0u);
    gate.OpenFailing();
    e.btrees().WaitLateIos();
    EXPECT_EQ(e.devs().failed(), 2u);
    EXPECT_EQ(e.btrees().GetStats().late_node_ios, 0u);
    SetKeys(e, kKeys, 3, 2);
    ASSERT_TRUE(e.btrees().Checkpoint().ok());
    ASSERT_TRUE(e.Close().ok());
  }
  std::string out;
  EXPECT_EQ(ms.Check(&out, /*repair=*/true), fsck::kExitClean) << out;
  ExpectWholeAndClean(ms, Rounds(3));
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
