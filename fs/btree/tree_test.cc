// The btree tree layer (btree/tree.h) on a real store over MemDevices.
//
//  - BtreeModelTest: random transactions (values 0..300 bytes and, 1 in 33, of
//    kMaxValueBytes; overwrites, deletes, commits spanning two btrees) against a
//    std::map model, in 4 KiB nodes so that splits, merges, root growth and shrink
//    all happen (asserted through Stats); iterator seeks and walks (also an
//    iterator kept open across commits) and Gets compared with the model; power
//    cuts (durable snapshots of the MemDevices) at random points, between random
//    Checkpoint()s. After a cut the reopened trees must equal the model after some
//    prefix of the commit sequence that contains every commit acknowledged durable
//    (kFlush, or followed by a Checkpoint()): commits are atomic and the journal
//    is ordered. Half the time the test carries on from the recovered filesystem.
//  - Concurrent*: two writers on disjoint key ranges, two readers scanning and
//    getting (order, self-checking values, nothing committed before the scan
//    missing), a Checkpoint() loop and the writer thread; once with the tree
//    cached, once with a cache of 8 nodes under a tree of ~100 (evictions).
//  - BtreeCorruption*: bytes of a written leaf edited in the image (header byte,
//    key byte, zeroed, another valid leaf's bytes; a byte past used_bytes as the
//    control): that leaf's keys give Corrupt-class errors (Get, iterators, commits,
//    ForEachNode), every other key reads correctly. Also interior nodes, roots
//    blocks, and scans with a cache of 2..16 nodes.
//  - Edge cases (empty and one-key trees, Pos::Min/Max and btree boundaries, one
//    kMaxValueBytes key per node, bad input, too-big transactions, replay, a full
//    journal) and a 1M-key sequential tree.
// A Watchdog turns a hang into a failure that prints the btree counters.
#include "btree/tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mount/testing.h"
#include "platform/platform.h"
#include "store/store.h"
#include "userspace/platform/mem_device.h"

namespace tfs::btree {
namespace {

using store::Store;
using journal::CommitMode;
using userspace::MemDevice;
using userspace::MemDeviceOptions;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// The second btree of cross-tree transactions: next to kBtreeTest, so that a
// btree-id boundary is crossed by every scan that runs off the end of either tree.
constexpr u8 kOther = kBtreeReconcile;

std::string Str(Status st) {
  if (st.ok()) return "Ok";
  return std::string(st.Name()) + " (" + st.Message() + ")";
}

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    ::tfs::Status st_ = (expr);                                          \
    ASSERT_TRUE(st_.ok()) << #expr << " -> " << ::tfs::btree::Str(st_); \
  } while (0)
#define EXPECT_OK(expr)                                                  \
  do {                                                                   \
    ::tfs::Status st_ = (expr);                                          \
    EXPECT_TRUE(st_.ok()) << #expr << " -> " << ::tfs::btree::Str(st_); \
  } while (0)

using MKey = std::tuple<u8, u64, u64>;
using Model = std::map<MKey, std::string>;

MKey K(const Pos& p) { return {p.btree_id, p.inode, p.offset}; }
Pos P(const MKey& k) { return Pos{std::get<0>(k), std::get<1>(k), std::get<2>(k)}; }
Pos T(u64 inode, u64 offset) { return Pos{kBtreeTest, inode, offset}; }

std::string PosStr(const Pos& p) {
  char b[80];
  snprintf(b, sizeof(b), "(%u, %llu, %llu)", unsigned(p.btree_id), (unsigned long long)p.inode,
           (unsigned long long)p.offset);
  return b;
}
std::string KeyStr(const MKey& k) { return PosStr(P(k)); }

std::string Bytes(const u8* p, usize n) { return n == 0 ? std::string() : std::string(reinterpret_cast<const char*>(p), n); }
std::string Val(const Iterator& it) { return Bytes(it.value(), it.val_bytes()); }
std::string Val(const Vector<u8>& v) { return Bytes(v.data(), v.size()); }

// Turns a hang into a failure: unless destroyed within `seconds`, prints what was
// running and the watched btrees' counters, then aborts (ctest runs each test case
// in its own process, so only that case fails).
class Watchdog {
 public:
  Watchdog(std::string what, double seconds) : what_(std::move(what)) {
    if (kSanitized) seconds = std::min(seconds * 4, 280.0);  // under ctest's 300 s
    th_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
      fprintf(stderr, "\nWATCHDOG: %s did not finish within %.0f s (hang or livelock)\n", what_.c_str(), seconds);
      if (trees_ != nullptr) {
        Stats s = trees_->GetStats();
        fprintf(stderr,
                "  btree stats: node_reads %llu evictions %llu restarts %llu cache_misses %llu cached_nodes %llu "
                "dirty_nodes %llu checkpoints %llu commits %llu\n",
                (unsigned long long)s.node_reads, (unsigned long long)s.evictions, (unsigned long long)s.restarts,
                (unsigned long long)s.cache_misses, (unsigned long long)s.cached_nodes,
                (unsigned long long)s.dirty_nodes, (unsigned long long)s.checkpoints, (unsigned long long)s.commits);
      }
      fflush(stderr);
      std::abort();
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  // The btrees whose counters to print on expiry (null: none).
  void Watch(Btrees* t) {
    std::lock_guard<std::mutex> l(mu_);
    trees_ = t;
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Btrees* trees_ = nullptr;
  std::thread th_;
};

std::string CurrentTest() {
  const ::testing::TestInfo* i = ::testing::UnitTest::GetInstance()->current_test_info();
  return i == nullptr ? std::string("?") : std::string(i->test_suite_name()) + "." + i->name();
}

// ---------------------------------------------------------------------------
// Filesystems on MemDevices.

constexpr u64 kDevSize = 32ull << 20;

struct Fs {
  std::vector<std::unique_ptr<MemDevice>> devs;
  u64 size;
  bool volatile_cache;

  Fs(u32 n, u64 dev_size, bool vcache = true, std::vector<std::vector<uint8_t>> images = {})
      : size(dev_size), volatile_cache(vcache) {
    for (u32 i = 0; i < n; i++) {
      MemDeviceOptions o;
      o.name = "mem" + std::to_string(i);
      o.size = dev_size;
      o.volatile_cache = vcache;
      o.seed = i + 1;
      if (!images.empty()) o.initial_image = std::move(images[i]);
      devs.push_back(std::make_unique<MemDevice>(o));
    }
  }
  Fs(const Fs&) = delete;
  Fs& operator=(const Fs&) = delete;

  // Every member may hold btree nodes (no metadata target).
  Status Format(u32 node_size, u32 bucket_size = 256 * 1024, u32 journal_buckets = 0, u8 metadata_replicas = 1) {
    store::FormatOptions o = testing::SmallFormat(node_size);
    o.bucket_size = bucket_size;
    o.journal_buckets = journal_buckets;
    o.metadata_replicas = metadata_replicas;
    return testing::FormatMembers(List(), o);  // "ssd.a", "ssd.b", ...
  }
  std::vector<BlockDevice*> List() const {
    std::vector<BlockDevice*> l;
    for (const auto& d : devs) l.push_back(d.get());
    return l;
  }
  // What a power cut at this instant leaves.
  std::unique_ptr<Fs> AfterPowerCut() const {
    std::vector<const MemDevice*> all;
    for (const auto& d : devs) all.push_back(d.get());
    std::vector<std::vector<uint8_t>> images = MemDevice::SnapshotDurable(all);  // one instant for all
    return std::make_unique<Fs>(u32(devs.size()), size, volatile_cache, std::move(images));
  }
};

store::OpenOptions EngineOptions(const Options& bo) {
  store::OpenOptions o;
  o.btree = bo;
  o.journal.write_delay_ns = 100 * platform::kNsPerUs;
  o.data_counts = false;  // (records written by hand: no accounting keys beside their counts)
  return o;
}

Status OpenEngine(Store* e, Fs& fs, const Options& bo, store::OpenReport* rep = nullptr,
                  const store::OpenOptions* oo = nullptr) {
  return testing::OpenStore(e, fs.List(), oo != nullptr ? *oo : EngineOptions(bo), rep);
}

// ---------------------------------------------------------------------------
// Reading trees and comparing with a model.

// A full forward scan of tree `id` into `out`; positions must strictly increase and
// belong to the tree. Then a backward scan (starting with one-key batches, as
// the data path's iterators do) must give the same keys in reverse.
void ScanTree(Btrees& t, u8 id, Model* out) {
  Iterator it(&t, id);
  ASSERT_OK(it.SeekToFirst());
  std::vector<MKey> fwd;
  while (it.Valid()) {
    ASSERT_EQ(it.pos().btree_id, id) << PosStr(it.pos());
    if (!fwd.empty()) {
      ASSERT_LT(fwd.back(), K(it.pos())) << "forward scan not increasing";
    }
    fwd.push_back(K(it.pos()));
    (*out)[K(it.pos())] = Val(it);
    ASSERT_OK(it.Next());
  }
  Iterator back(&t, id, /*first_batch=*/1);
  ASSERT_OK(back.SeekToLast());
  usize i = fwd.size();
  while (back.Valid()) {
    ASSERT_GT(i, 0u) << "backward scan found more keys than forward: " << PosStr(back.pos());
    i--;
    ASSERT_EQ(K(back.pos()), fwd[i]) << "backward scan differs from forward";
    ASSERT_EQ(Val(back), (*out)[fwd[i]]);
    ASSERT_OK(back.Prev());
  }
  ASSERT_EQ(i, 0u) << "backward scan found fewer keys than forward";
}

// The keys of tree `id` in the model.
Model Slice(const Model& m, u8 id) {
  Model s;
  for (auto it = m.lower_bound(MKey{id, 0, 0}); it != m.end() && std::get<0>(it->first) == id; ++it) s.insert(*it);
  return s;
}

std::string DescribeDiff(const Model& want, const Model& got, int limit = 6) {
  std::ostringstream o;
  int n = 0;
  usize total = 0;
  for (const auto& [k, v] : want) {
    auto g = got.find(k);
    if (g == got.end() || g->second != v) {
      total++;
      if (n++ < limit) {
        o << "\n  " << KeyStr(k) << ": want " << v.size() << " bytes, "
          << (g == got.end() ? std::string("absent") : "got " + std::to_string(g->second.size()) + " bytes (different)");
      }
    }
  }
  for (const auto& [k, v] : got) {
    if (want.count(k) == 0) {
      total++;
      if (n++ < limit) o << "\n  " << KeyStr(k) << ": want absent, got " << v.size() << " bytes";
    }
  }
  return std::to_string(total) + " keys differ:" + o.str();
}

// Every Get of a model key returns its value (both Get forms).
void GetsMatch(Btrees& t, const Model& m, u8 id) {
  Vector<u8> v;
  for (auto it = m.lower_bound(MKey{id, 0, 0}); it != m.end() && std::get<0>(it->first) == id; ++it) {
    Status st = t.Get(P(it->first), &v);
    ASSERT_TRUE(st.ok()) << KeyStr(it->first) << ": " << Str(st);
    ASSERT_EQ(Val(v), it->second) << KeyStr(it->first);
  }
}

// ---------------------------------------------------------------------------
// Commits and their log.

struct Op {
  MKey key;
  bool del = false;
  std::string val;
};
using CommitOps = std::vector<Op>;

void Apply(const CommitOps& c, Model* m) {
  for (const Op& op : c) {
    if (op.del) {
      m->erase(op.key);
    } else {
      (*m)[op.key] = op.val;
    }
  }
}

Status Queue(Transaction& tx, const Op& op) {
  if (op.del) return tx.Delete(P(op.key));
  return tx.Set(P(op.key), op.val.data(), u32(op.val.size()));
}

// The first k >= from such that applying log[0, k) gives `got`, or -1 (with `why`).
long MatchPrefix(const std::vector<CommitOps>& log, usize from, const Model& got, std::string* why) {
  Model m;
  for (usize i = 0; i < from; i++) Apply(log[i], &m);
  long diff = 0;
  for (const auto& [k, v] : m) {
    auto g = got.find(k);
    if (g == got.end() || g->second != v) diff++;
  }
  for (const auto& [k, v] : got) diff += m.count(k) == 0 ? 1 : 0;
  if (diff == 0) return long(from);
  Model at_from = m;
  auto same = [&](const MKey& k) {
    auto a = m.find(k);
    auto b = got.find(k);
    if (a == m.end()) return b == got.end();
    return b != got.end() && a->second == b->second;
  };
  for (usize i = from; i < log.size(); i++) {
    for (const Op& op : log[i]) {
      bool before = same(op.key);
      if (op.del) {
        m.erase(op.key);
      } else {
        m[op.key] = op.val;
      }
      bool after = same(op.key);
      diff += long(before) - long(after);
    }
    if (diff == 0) return long(i + 1);
  }
  *why = "no prefix of commits [" + std::to_string(from) + ", " + std::to_string(log.size()) +
         "] matches.\n vs the last durable commit (" + std::to_string(from) + "): " + DescribeDiff(at_from, got) +
         "\n vs the last commit (" + std::to_string(log.size()) + "): " + DescribeDiff(m, got);
  return -1;
}

void AddStats(Stats* t, const Stats& s) {
  t->lookups += s.lookups;
  t->inserts += s.inserts;
  t->deletes += s.deletes;
  t->commits += s.commits;
  t->restarts += s.restarts;
  t->splits += s.splits;
  t->merges += s.merges;
  t->root_grows += s.root_grows;
  t->root_shrinks += s.root_shrinks;
  t->compactions += s.compactions;
  t->cache_hits += s.cache_hits;
  t->cache_misses += s.cache_misses;
  t->evictions += s.evictions;
  t->node_reads += s.node_reads;
  t->corrupt_reads += s.corrupt_reads;
  t->node_writes += s.node_writes;
  t->checkpoints += s.checkpoints;
}

// ---------------------------------------------------------------------------
// 1. Randomized model test with power cuts.

struct ModelParams {
  u64 seed;
  bool writer_thread;
  u64 cache_nodes;  // cache_bytes in nodes
  u32 grow_to;      // keys in kBtreeTest before deleting most of them
  u32 big_value = kMaxValueBytes;  // 1 value in 33 has this size
  u8 metadata_replicas = 1;        // copies of every node (both members)
};

std::ostream& operator<<(std::ostream& o, const ModelParams& p) {
  return o << "seed " << p.seed << (p.writer_thread ? " writer" : " no-writer") << " cache " << p.cache_nodes
           << " nodes, big values " << p.big_value << " bytes, " << unsigned(p.metadata_replicas)
           << " node cop" << (p.metadata_replicas == 1 ? "y" : "ies");
}

class ModelRun {
 public:
  explicit ModelRun(const ModelParams& p) : p_(p), rng_(p.seed) {
    opts_.cache_bytes = p.cache_nodes * kNode;
    opts_.node_size = 0;
    opts_.writer_thread = p.writer_thread;
  }

  ~ModelRun() {
    live_it_.reset();
    if (e_) e_->Close().IgnoreError();  // a failed test: best effort
  }

  void Run() {
    fs_ = std::make_unique<Fs>(2, kDevSize);
    ASSERT_OK(fs_->Format(kNode, 256 * 1024, 0, p_.metadata_replicas));
    e_ = std::make_unique<Store>();
    ASSERT_OK(OpenEngine(e_.get(), *fs_, opts_));
    wd_.Watch(&e_->btrees());
    ASSERT_EQ(e_->btrees().node_size(), kNode);

    // Grow: mostly inserts, until the test tree is 3 levels deep or more.
    while (Count(kBtreeTest) < p_.grow_to || Count(kOther) < p_.grow_to / 8) {
      ASSERT_NO_FATAL_FAILURE(Step(kGrow));
    }
    ASSERT_NO_FATAL_FAILURE(CheckAll("after growth"));
    ASSERT_NO_FATAL_FAILURE(CrashCheck(true));
    // Shrink: delete nearly everything (merges, root shrinks), the other tree entirely.
    while (Count(kBtreeTest) > 20 || Count(kOther) > 0) ASSERT_NO_FATAL_FAILURE(Step(kShrink));
    ASSERT_NO_FATAL_FAILURE(CheckAll("after shrinking"));
    ASSERT_OK(e_->btrees().Checkpoint());
    {
      // Every node made and not yet written is dirty: none dropped is left
      // counted in the checkpoint's slot need (a merge given up used to
      // leave its node counted for the rest of the mount: review helper-79).
      // (Looked at again while a checkpoint of the writer thread, or a
      // reading between the two counters, shows it otherwise for a moment:
      // a leak stays.)
      Stats s = e_->btrees().GetStats();
      for (int i = 0; i < 200 && s.unwritten_nodes > s.dirty_nodes; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        s = e_->btrees().GetStats();
      }
      EXPECT_LE(s.unwritten_nodes, s.dirty_nodes) << s.merges_given_up << " merges given up";  // (Seed5: 2)
    }
    durable_ = log_.size();
    ASSERT_NO_FATAL_FAILURE(CrashCheck(false));
    // Mixed.
    for (int i = 0; i < 400; i++) ASSERT_NO_FATAL_FAILURE(Step(kMixed));
    ASSERT_NO_FATAL_FAILURE(CheckAll("after mixed updates"));
    ASSERT_NO_FATAL_FAILURE(CrashCheck(true));

    // A clean close keeps everything; a clean open replays nothing.
    live_it_.reset();
    AddStats(&totals_, e_->btrees().GetStats());
    ASSERT_OK(e_->Close());
    wd_.Watch(nullptr);
    e_ = std::make_unique<Store>();
    store::OpenReport rep;
    ASSERT_OK(OpenEngine(e_.get(), *fs_, opts_, &rep));
    wd_.Watch(&e_->btrees());
    EXPECT_TRUE(rep.was_clean);
    EXPECT_EQ(rep.replayed_keys, 0u);
    Model got;
    ASSERT_NO_FATAL_FAILURE(ScanTree(e_->btrees(), kBtreeTest, &got));
    ASSERT_NO_FATAL_FAILURE(ScanTree(e_->btrees(), kOther, &got));
    ASSERT_TRUE(got == model_) << "after a clean close and open: " << DescribeDiff(model_, got);
    ASSERT_NO_FATAL_FAILURE(ExpectEveryCopy(e_->btrees(), "after a clean close and open"));
    AddStats(&totals_, e_->btrees().GetStats());
    wd_.Watch(nullptr);
    ASSERT_OK(e_->Close());
    e_.reset();

    // Every structural path ran.
    EXPECT_GT(totals_.splits, 0u);
    EXPECT_GT(totals_.merges, 0u);
    EXPECT_GT(totals_.root_grows, 0u);
    // A root shrinks once merges bring it down to one child. Merges use only
    // cached siblings (a merge never reads), and with 2 KiB values in 4 KiB nodes
    // a leaf holding one merges with nothing non-empty: with a cache smaller
    // than the tree, whether it happens depends on which keys and nodes
    // survive. Required when the whole tree stays cached.
    if (p_.cache_nodes >= 1024) {
      EXPECT_GT(totals_.root_shrinks, 0u);
    }
    EXPECT_GT(totals_.checkpoints, 0u);
    EXPECT_EQ(totals_.degraded_nodes, 0u);
    EXPECT_GE(max_depth_, 3u) << "the test tree never reached 3 levels";
    EXPECT_GE(crashes_, 8u);
    if (opts_.cache_bytes < (1u << 20)) {
      EXPECT_GT(totals_.evictions, 0u);
      EXPECT_GT(totals_.node_reads, 0u);
    }
    printf("[ model ] %s: %zu commits, %u power cuts (%u lost non-durable commits), depth %llu, splits %llu "
           "merges %llu grows %llu shrinks %llu checkpoints %llu evictions %llu reads %llu restarts %llu\n",
           ToString().c_str(), total_commits_, crashes_, lossy_crashes_, (unsigned long long)max_depth_,
           (unsigned long long)totals_.splits, (unsigned long long)totals_.merges,
           (unsigned long long)totals_.root_grows, (unsigned long long)totals_.root_shrinks,
           (unsigned long long)totals_.checkpoints, (unsigned long long)totals_.evictions,
           (unsigned long long)totals_.node_reads, (unsigned long long)totals_.restarts);
  }

 private:
  static constexpr u32 kNode = 4096;
  static constexpr u64 kInodes = 40, kOffsets = 400;        // kBtreeTest key space
  static constexpr u64 kOtherInodes = 8, kOtherOffsets = 200;
  enum Phase { kGrow, kShrink, kMixed };

  std::string ToString() const {
    std::ostringstream o;
    o << p_;
    return o.str();
  }

  usize Count(u8 id) const { return counts_[id]; }

  // A commit's updates, with what the model held at each position before it.
  std::string Describe(const CommitOps& c) const {
    std::ostringstream o;
    for (const Op& op : c) {
      auto m = model_.find(op.key);
      o << "\n  " << KeyStr(op.key) << (op.del ? " delete" : " set " + std::to_string(op.val.size()) + " bytes")
        << " (was " << (m == model_.end() ? std::string("absent") : std::to_string(m->second.size()) + " bytes")
        << ")";
    }
    return o.str();
  }

  void ApplyCounted(const CommitOps& c) {
    for (const Op& op : c) {
      bool had = model_.count(op.key) != 0;
      counts_[std::get<0>(op.key)] += (op.del ? 0 : 1) - (had ? 1 : 0);
    }
    Apply(c, &model_);
  }

  std::string RandomValue() {
    u32 len = rng_() % 33 == 0 ? p_.big_value : u32(rng_() % 301);
    std::string v(len, '\0');
    u64 x = rng_();
    for (u32 i = 0; i < len; i++) {
      if (i % 8 == 0) x = x * 6364136223846793005ull + 1442695040888963407ull;
      v[i] = char(x >> (8 * (i % 8)));
    }
    return v;
  }

  MKey RandomKey(u8 id) {
    if (id == kBtreeTest && rng_() % 100 == 0) {
      // Extreme positions.
      u64 a = rng_() % 2 ? 0 : ~u64(0), b = rng_() % 2 ? 0 : ~u64(0);
      return {id, a, b};
    }
    if (id == kBtreeTest) return {id, 1 + rng_() % kInodes, rng_() % kOffsets};
    return {id, 1 + rng_() % kOtherInodes, rng_() % kOtherOffsets};
  }

  // A random existing key of tree id, if any.
  std::optional<MKey> ExistingKey(u8 id) {
    if (Count(id) == 0) return std::nullopt;
    MKey q = RandomKey(id);
    auto it = model_.lower_bound(q);
    if (it == model_.end() || std::get<0>(it->first) != id) it = model_.lower_bound(MKey{id, 0, 0});
    return it->first;
  }

  void Step(Phase phase) {
    CommitOps c;
    std::set<MKey> used;
    int nops = rng_() % 10 == 0 ? 1 + int(rng_() % 40) : 1 + int(rng_() % 5);
    bool cross = rng_() % 4 == 0;
    for (int i = 0; i < nops; i++) {
      u8 id = cross && rng_() % 2 ? kOther : u8(kBtreeTest);
      int r = int(rng_() % 100);
      int insert_pct = phase == kGrow ? 80 : phase == kShrink ? 5 : 40;
      int overwrite_pct = phase == kGrow ? 15 : phase == kShrink ? 10 : 30;
      Op op;
      if (phase == kShrink && id == kOther && Count(kOther) == 0) id = kBtreeTest;
      if (r < insert_pct) {
        op.key = RandomKey(id);
        op.val = RandomValue();
      } else {
        std::optional<MKey> k = ExistingKey(id);
        if (!k) continue;
        op.key = *k;
        if (r < insert_pct + overwrite_pct) {
          op.val = RandomValue();
        } else {
          op.del = true;
        }
      }
      if (!used.insert(op.key).second) continue;
      c.push_back(std::move(op));
    }
    if (c.empty()) return;
    CommitMode mode = rng_() % 5 == 0 ? CommitMode::kFlush : CommitMode::kNoFlush;
    Transaction tx(&e_->btrees());
    for (const Op& op : c) ASSERT_OK(Queue(tx, op));
    ASSERT_EQ(tx.size(), u32(c.size()));
    Result<u64> seq = tx.Commit(mode);
    ASSERT_TRUE(seq.ok()) << ToString() << ": commit " << log_.size() << " failed: " << Str(seq.status())
                          << "; its updates:" << Describe(c);
    ASSERT_EQ(tx.size(), 0u);
    ASSERT_GE(*seq, last_seq_) << "journal sequence went backwards";
    last_seq_ = *seq;
    log_.push_back(c);
    ApplyCounted(c);
    total_commits_++;
    if (mode == CommitMode::kFlush) durable_ = log_.size();

    since_checkpoint_++;
    if (rng_() % 100 == 0 || (!opts_.writer_thread && since_checkpoint_ >= 150)) {
      ASSERT_OK(e_->btrees().Checkpoint());
      // The checkpoint wrote every dirty leaf, after making the journal durable up
      // to what they hold: every commit so far survives a power cut now.
      durable_ = log_.size();
      since_checkpoint_ = 0;
    }
    if (rng_() % 4 == 0) {
      ASSERT_NO_FATAL_FAILURE(LiveIteratorStep());
    }
    if (rng_() % 100 == 0) {
      ASSERT_NO_FATAL_FAILURE(QuickCheck());
    }
    if (total_commits_ % 32 == 0) {
      Stats s = e_->btrees().GetStats();
      max_depth_ = std::max(max_depth_, s.depth[kBtreeTest]);
    }
    if (rng_() % 200 == 0) {
      ASSERT_NO_FATAL_FAILURE(CrashCheck(rng_() % 2 == 0));
    }
  }

  // Expected positions within one tree.
  std::optional<MKey> InTree(Model::const_iterator it, u8 id) const {
    if (it == model_.end() || std::get<0>(it->first) != id) return std::nullopt;
    return it->first;
  }
  std::optional<MKey> LowerBound(const Pos& q) const { return InTree(model_.lower_bound(K(q)), q.btree_id); }
  std::optional<MKey> After(const Pos& q) const { return InTree(model_.upper_bound(K(q)), q.btree_id); }
  std::optional<MKey> Before(const Pos& q) const {  // last < q
    auto it = model_.lower_bound(K(q));
    if (it == model_.begin()) return std::nullopt;
    return InTree(--it, q.btree_id);
  }
  std::optional<MKey> AtOrBefore(const Pos& q) const {  // last <= q
    auto it = model_.upper_bound(K(q));
    if (it == model_.begin()) return std::nullopt;
    return InTree(--it, q.btree_id);
  }

  void ExpectAt(const Iterator& it, const std::optional<MKey>& want, const std::string& what) {
    if (!want) {
      ASSERT_FALSE(it.Valid()) << ToString() << ": " << what << ": want no key, at " << PosStr(it.pos());
      return;
    }
    ASSERT_TRUE(it.Valid()) << ToString() << ": " << what << ": want " << KeyStr(*want) << ", iterator invalid";
    ASSERT_EQ(K(it.pos()), *want) << ToString() << ": " << what << ": at " << PosStr(it.pos());
    ASSERT_EQ(Val(it), model_.at(*want)) << ToString() << ": " << what << ": value of " << KeyStr(*want);
  }

  Pos RandomQuery(u8 id) {
    MKey k = RandomKey(id);
    Pos q = P(k);
    if (rng_() % 4 == 0) q.offset += 1;  // often between keys
    if (rng_() % 50 == 0) q = rng_() % 2 ? Pos::Min(id) : Pos::Max(id);
    return q;
  }

  // Seeks of every kind and short mixed walks, on both trees; Gets of present and
  // absent keys.
  void QuickCheck() {
    Btrees& t = e_->btrees();
    for (u8 id : {u8(kBtreeTest), kOther}) {
      Iterator it(&t, id);
      for (int i = 0; i < 25; i++) {
        Pos q = RandomQuery(id);
        int kind = int(rng_() % 4);
        std::optional<MKey> want;
        std::string what;
        if (kind == 0) {
          ASSERT_OK(it.Seek(q));
          want = LowerBound(q);
          what = "Seek " + PosStr(q);
        } else if (kind == 1) {
          ASSERT_OK(it.SeekForPrev(q));
          want = AtOrBefore(q);
          what = "SeekForPrev " + PosStr(q);
        } else if (kind == 2) {
          ASSERT_OK(it.SeekToFirst());
          want = LowerBound(Pos::Min(id));
          what = "SeekToFirst";
        } else {
          ASSERT_OK(it.SeekToLast());
          want = AtOrBefore(Pos::Max(id));
          what = "SeekToLast";
        }
        ASSERT_NO_FATAL_FAILURE(ExpectAt(it, want, what));
        for (int s = 0; s < 12 && it.Valid(); s++) {
          Pos at = it.pos();
          if (rng_() % 2) {
            ASSERT_OK(it.Next());
            ASSERT_NO_FATAL_FAILURE(ExpectAt(it, After(at), what + " then Next from " + PosStr(at)));
          } else {
            ASSERT_OK(it.Prev());
            ASSERT_NO_FATAL_FAILURE(ExpectAt(it, Before(at), what + " then Prev from " + PosStr(at)));
          }
        }
      }
      Vector<u8> v;
      for (int i = 0; i < 25; i++) {
        MKey k = RandomKey(id);
        auto m = model_.find(k);
        Status st = t.Get(P(k), &v);
        if (m == model_.end()) {
          ASSERT_EQ(st, Status(Err::kNotFound)) << ToString() << ": Get " << KeyStr(k) << " (absent): " << Str(st);
        } else {
          ASSERT_TRUE(st.ok()) << ToString() << ": Get " << KeyStr(k) << ": " << Str(st);
          ASSERT_EQ(Val(v), m->second) << ToString() << ": Get " << KeyStr(k);
          // The bounded form: the full length, at most cap bytes copied.
          u8 buf[16];
          memset(buf, 0xee, sizeof(buf));
          Result<u32> n = t.Get(P(k), buf, 8);
          ASSERT_OK(n.status());
          ASSERT_EQ(*n, u32(m->second.size()));
          ASSERT_EQ(Bytes(buf, std::min<usize>(8, m->second.size())), m->second.substr(0, 8));
          ASSERT_EQ(buf[8], 0xee) << "Get copied more than cap bytes";
        }
      }
    }
  }

  // An iterator kept across commits (it holds no lock): each move must see every
  // commit made before it, whatever splits and merges happened meanwhile.
  void LiveIteratorStep() {
    if (!live_it_) live_it_ = std::make_unique<Iterator>(&e_->btrees(), kBtreeTest);
    Iterator& it = *live_it_;
    if (!it.Valid() || rng_() % 10 == 0) {
      Pos q = RandomQuery(kBtreeTest);
      ASSERT_OK(it.Seek(q));
      return ExpectAt(it, LowerBound(q), "live iterator Seek " + PosStr(q));
    }
    Pos at = it.pos();
    if (rng_() % 2) {
      ASSERT_OK(it.Next());
      ASSERT_NO_FATAL_FAILURE(ExpectAt(it, After(at), "live iterator Next from " + PosStr(at)));
    } else {
      ASSERT_OK(it.Prev());
      ASSERT_NO_FATAL_FAILURE(ExpectAt(it, Before(at), "live iterator Prev from " + PosStr(at)));
    }
  }

  void CheckAll(const char* when) {
    Model got;
    ASSERT_NO_FATAL_FAILURE(ScanTree(e_->btrees(), kBtreeTest, &got));
    ASSERT_NO_FATAL_FAILURE(ScanTree(e_->btrees(), kOther, &got));
    ASSERT_TRUE(got == model_) << ToString() << " " << when << ": " << DescribeDiff(model_, got);
    ASSERT_NO_FATAL_FAILURE(GetsMatch(e_->btrees(), model_, kBtreeTest));
    ASSERT_NO_FATAL_FAILURE(GetsMatch(e_->btrees(), model_, kOther));
    ASSERT_NO_FATAL_FAILURE(QuickCheck());
    Stats s = e_->btrees().GetStats();
    max_depth_ = std::max(max_depth_, s.depth[kBtreeTest]);
  }

  // Every node the last roots block reaches has metadata_replicas copies,
  // each of which reads and verifies on its own.
  void ExpectEveryCopy(Btrees& t, const std::string& when) {
    struct Copies {
      Btrees* t;
      u32 want, nodes = 0, short_of = 0, bad = 0;
    } copies{&t, p_.metadata_replicas};
    ASSERT_OK(t.ForEachNode(
        [](void* ctx, const Btrees::NodeVisit& v) {
          auto* c = static_cast<Copies*>(ctx);
          c->nodes++;
          if (PtrCopies(*v.ptr) != c->want) c->short_of++;
          for (u32 i = 0; i < PtrCopies(*v.ptr); i++)
            if (!c->t->CheckCopy(*v.ptr, i, v.node->info().max, nullptr).ok()) c->bad++;
          return Status::Ok();
        },
        &copies));
    EXPECT_GT(copies.nodes, 0u) << when;
    EXPECT_EQ(copies.short_of, 0u) << when << ": nodes without " << copies.want << " copies, of " << copies.nodes;
    EXPECT_EQ(copies.bad, 0u) << when << ": copies that do not verify";
  }

  // A power cut now: the durable images, reopened, must hold exactly the model after
  // some prefix of the commits that includes every durable one (and, with
  // node copies, every copy the cut's roots block reaches verifies). With
  // `adopt` the test goes on from the recovered filesystem.
  void CrashCheck(bool adopt) {
    crashes_++;
    std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
    if (p_.metadata_replicas > 1) {
      // What the cut left, before a writable open changes it.
      Store ro;
      store::OpenOptions oo = EngineOptions(opts_);
      oo.read_only = true;
      ASSERT_OK(OpenEngine(&ro, *cut, opts_, nullptr, &oo));
      ASSERT_NO_FATAL_FAILURE(ExpectEveryCopy(ro.btrees(), "power cut " + std::to_string(crashes_)));
      ASSERT_OK(ro.Close());
    }
    auto e2 = std::make_unique<Store>();
    store::OpenReport rep;
    ASSERT_OK(OpenEngine(e2.get(), *cut, opts_, &rep));
    EXPECT_FALSE(rep.was_clean);
    Model got;
    for (u8 id = 0; id < kNrBtreeIds; id++) {
      if (id == kBtreeAlloc) continue;  // the allocator's records (of the node buckets), not the model's
      ASSERT_NO_FATAL_FAILURE(ScanTree(e2->btrees(), id, &got)) << ToString() << " power cut " << crashes_;
    }
    std::string why;
    long k = MatchPrefix(log_, durable_, got, &why);
    ASSERT_GE(k, 0) << ToString() << ", power cut " << crashes_ << " after commit " << log_.size()
                    << " (durable " << durable_ << "): " << why;
    if (usize(k) < log_.size()) lossy_crashes_++;
    if (!adopt) {
      AddStats(&totals_, e2->btrees().GetStats());
      ASSERT_OK(e2->Close());
      return;
    }
    live_it_.reset();
    AddStats(&totals_, e_->btrees().GetStats());
    wd_.Watch(nullptr);
    ASSERT_OK(e_->Close());
    e_ = std::move(e2);
    wd_.Watch(&e_->btrees());
    fs_ = std::move(cut);
    log_.resize(usize(k));
    durable_ = log_.size();  // open checkpointed what it replayed
    last_seq_ = 0;           // the recovered journal may reuse sequences of lost entries
    model_.clear();
    for (usize i = 0; i < kNrBtreeIds; i++) counts_[i] = 0;
    for (const CommitOps& c : log_) ApplyCounted(c);
    ASSERT_TRUE(got == model_);
  }

  Watchdog wd_{CurrentTest(), 150};
  ModelParams p_;
  std::mt19937_64 rng_;
  Options opts_;
  std::unique_ptr<Fs> fs_;
  std::unique_ptr<Store> e_;
  std::unique_ptr<Iterator> live_it_;
  std::vector<CommitOps> log_;  // every commit of the current history, in order
  usize durable_ = 0;           // log_[0, durable_) survives any power cut
  Model model_;                 // = log_ applied in order
  usize counts_[kNrBtreeIds] = {};
  u64 last_seq_ = 0;
  usize since_checkpoint_ = 0;
  usize total_commits_ = 0;
  u32 crashes_ = 0, lossy_crashes_ = 0;
  u64 max_depth_ = 0;
  Stats totals_{};
};

class BtreeModelTest : public ::testing::TestWithParam<ModelParams> {};

TEST_P(BtreeModelTest, RandomizedAgainstMapWithPowerCuts) {
  ModelParams p = GetParam();
  if (kSanitized) p.grow_to = p.grow_to * 2 / 3;
  ModelRun run(p);
  run.Run();
}

INSTANTIATE_TEST_SUITE_P(Seeds, BtreeModelTest,
                         ::testing::Values(ModelParams{1, false, 16384, 4000},  // 64 MiB: no eviction
                                           ModelParams{2, true, 64, 4000},      // 256 KiB cache
                                           ModelParams{3, true, 16384, 5000},
                                           ModelParams{4, false, 48, 3500},
                                           // two big values fit in a 4 KiB node
                                           ModelParams{5, true, 16384, 4000, 1900},
                                           // a copy of every node on each member
                                           ModelParams{6, true, 64, 4000, kMaxValueBytes, 2}),
                         [](const ::testing::TestParamInfo<ModelParams>& i) {
                           return "Seed" + std::to_string(i.param.seed);
                         });

// ---------------------------------------------------------------------------
// 2. Concurrency.

constexpr u32 kWriters = 2;

// A value that names its key and generation, so a reader can check any value it
// sees without knowing what the writer did: [inode ^ offset << 8 (8 bytes)]
// [gen (8 bytes)] then a byte pattern of a length derived from the key and gen.
std::string ConcValue(u64 ino, u64 off, u64 gen) {
  u32 len = 16 + u32((off * 7 + gen * 13) % 100);
  std::string v(len, '\0');
  u64 tag = ino ^ (off << 8);
  memcpy(&v[0], &tag, 8);
  memcpy(&v[8], &gen, 8);
  for (u32 i = 16; i < len; i++) v[i] = char(ino * 31 + off * 17 + gen * 7 + i);
  return v;
}

bool ConcValueOk(const Pos& p, const u8* data, u32 len) {
  if (len < 16) return false;
  u64 gen;
  memcpy(&gen, data + 8, 8);
  return Bytes(data, len) == ConcValue(p.inode, p.offset, gen);
}

// Keys with offset % 4 != 0 are permanent (never deleted once inserted); those
// with offset % 4 == 0 are churned. Below an insert frontier f, a writer has
// f - ceil(f / 4) permanent keys.
u64 PermanentBelow(u64 f) { return f - (f + 3) / 4; }

// kWriters writers, two readers and a checkpointer; the readers and the
// checkpointer run until the writers are done.
template <typename Writer, typename Reader, typename Checkpointer>
void RunThreads(Writer& writer, Reader& reader, Checkpointer& checkpointer, std::atomic<bool>* writers_done) {
  std::vector<std::thread> writers, others;
  for (u32 w = 0; w < kWriters; w++) writers.emplace_back(writer, w);
  for (u32 r = 0; r < 2; r++) others.emplace_back(reader, r);
  others.emplace_back(checkpointer);
  for (auto& th : writers) th.join();
  *writers_done = true;
  for (auto& th : others) th.join();
}

// The concurrency tests' store: `fs` formatted with `node`-byte nodes, the
// writer thread on, a cache of `cache_bytes`; *o: the options, to open again.
void OpenConcurrent(Fs& fs, u32 node, u64 cache_bytes, Store* e, Options* o) {
  ASSERT_OK(fs.Format(node));
  *o = Options{};
  o->cache_bytes = cache_bytes;
  o->node_size = 0;
  o->writer_thread = true;
  ASSERT_OK(OpenEngine(e, fs, *o));
}

void RunConcurrent(u64 kKeys, u64 cache_nodes, bool expect_eviction) {
  constexpr u32 kNode = 16384;
  Fs fs(2, 64ull << 20);
  Watchdog wd(CurrentTest(), 90);
  Store e;
  Options o;
  ASSERT_NO_FATAL_FAILURE(OpenConcurrent(fs, kNode, cache_nodes * kNode, &e, &o));
  Btrees& t = e.btrees();
  wd.Watch(&t);

  std::atomic<u64> frontier[kWriters];
  for (auto& f : frontier) f.store(0);
  std::atomic<bool> writers_done{false};
  std::atomic<int> failures{0};
  std::map<u64, u64> state[kWriters];  // offset -> gen, per writer; read after join
  std::atomic<u64> scans{0}, checkpoints{0};

  auto writer = [&](u32 w) {
    std::mt19937_64 rng(100 + w);
    const u64 ino = w + 1;
    std::map<u64, u64>& st = state[w];
    u64 next = 0;
    for (int round = 0; failures.load() == 0; round++) {
      if (next >= kKeys && round > int(kKeys / 4)) break;
      Transaction tx(&t);
      std::set<u64> used;
      std::vector<std::pair<u64, std::optional<u64>>> changes;
      int n = 1 + int(rng() % 16);
      for (int i = 0; i < n; i++) {
        int r = int(rng() % 10);
        u64 off;
        std::optional<u64> gen;
        if (r < 6 && next < kKeys) {
          off = next;
          if (!used.insert(off).second) continue;
          next++;
          gen = 0;
        } else if (r < 8 && !st.empty()) {
          auto it = st.lower_bound(rng() % kKeys);
          if (it == st.end()) it = st.begin();
          off = it->first;
          if (!used.insert(off).second) continue;
          gen = it->second + 1;
        } else {
          if (next < 4) continue;
          off = 4 * (rng() % ((next + 3) / 4));
          if (!used.insert(off).second) continue;
          auto it = st.find(off);
          if (it == st.end()) {
            gen = 1 + rng() % 1000;
          }  // else: delete
        }
        Status s = gen ? tx.Set(Pos{kBtreeTest, ino, off}, ConcValue(ino, off, *gen).data(),
                                u32(ConcValue(ino, off, *gen).size()))
                       : tx.Delete(Pos{kBtreeTest, ino, off});
        if (!s.ok()) {
          ADD_FAILURE() << "writer " << w << " queue: " << Str(s);
          failures++;
          return;
        }
        changes.push_back({off, gen});
      }
      Result<u64> seq = tx.Commit(rng() % 20 == 0 ? CommitMode::kFlush : CommitMode::kNoFlush);
      if (!seq.ok()) {
        ADD_FAILURE() << "writer " << w << " commit: " << Str(seq.status());
        failures++;
        return;
      }
      for (auto& [off, gen] : changes) {
        if (gen) {
          st[off] = *gen;
        } else {
          st.erase(off);
        }
      }
      frontier[w].store(next, std::memory_order_release);
    }
  };

  auto fail = [&](const std::string& what) {
    if (failures.fetch_add(1) < 10) ADD_FAILURE() << what;
  };

  auto reader = [&](u32 r) {
    std::mt19937_64 rng(200 + r);
    u64 my_scans = 0;
    while ((!writers_done.load() || my_scans < 2) && failures.load() == 0) {
      u64 f[kWriters];
      for (u32 w = 0; w < kWriters; w++) f[w] = frontier[w].load(std::memory_order_acquire);
      int kind = int(rng() % 3);
      Iterator it(&t, kBtreeTest);
      u64 seen[kWriters] = {};
      Status st = kind == 0 ? it.SeekToFirst()
                  : kind == 1 ? it.SeekToLast()
                              : it.Seek(Pos{kBtreeTest, 1 + rng() % kWriters, rng() % kKeys});
      std::optional<Pos> prev;
      int steps = 0;
      while (st.ok() && it.Valid() && (kind != 2 || steps < 300)) {
        Pos p = it.pos();
        if (p.btree_id != kBtreeTest || p.inode < 1 || p.inode > kWriters || p.offset >= kKeys) {
          fail("reader saw a foreign key " + PosStr(p));
          return;
        }
        if (prev && (kind == 1 ? !(p < *prev) : !(*prev < p))) {
          fail("reader " + std::to_string(r) + ": order broken: " + PosStr(*prev) + " then " + PosStr(p));
          return;
        }
        if (!ConcValueOk(p, it.value(), it.val_bytes())) {
          fail("reader: bad value at " + PosStr(p) + " (" + std::to_string(it.val_bytes()) + " bytes)");
          return;
        }
        if (p.offset % 4 != 0 && p.offset < f[p.inode - 1]) seen[p.inode - 1]++;
        prev = p;
        steps++;
        st = kind == 1 ? it.Prev() : it.Next();
      }
      if (!st.ok()) {
        fail("reader: iterator error " + Str(st));
        return;
      }
      if (kind != 2) {
        for (u32 w = 0; w < kWriters; w++) {
          if (seen[w] != PermanentBelow(f[w])) {
            fail("reader " + std::to_string(r) + (kind == 0 ? " forward" : " backward") + " scan saw " +
                 std::to_string(seen[w]) + " of the " + std::to_string(PermanentBelow(f[w])) +
                 " permanent keys writer " + std::to_string(w) + " had committed before the scan");
            return;
          }
        }
        my_scans++;
        scans++;
      }
      Vector<u8> v;
      for (int i = 0; i < 20; i++) {
        u32 w = u32(rng() % kWriters);
        if (f[w] < 2) continue;
        u64 off = rng() % f[w];
        if (off % 4 == 0) off = off + 1 < f[w] ? off + 1 : off - 1;
        Pos p{kBtreeTest, w + 1, off};
        Status gs = t.Get(p, &v);
        if (!gs.ok() || !ConcValueOk(p, v.data(), u32(v.size()))) {
          fail("reader Get " + PosStr(p) + ": " + Str(gs));
          return;
        }
      }
    }
  };

  auto checkpointer = [&] {
    while (!writers_done.load() && failures.load() == 0) {
      Status s = t.Checkpoint();
      if (!s.ok()) {
        fail("Checkpoint: " + Str(s));
        return;
      }
      checkpoints++;
      platform::SleepNs(2 * platform::kNsPerMs);
    }
  };

  u64 t0 = platform::NowNs();
  RunThreads(writer, reader, checkpointer, &writers_done);
  ASSERT_EQ(failures.load(), 0);
  Stats s = t.GetStats();
  printf("[ concurrent ] %llu keys, cache %llu nodes: %.2f s, %llu full scans, %llu checkpoints (%llu total), evictions %llu, node reads %llu, "
         "restarts %llu, depth %llu\n",
         (unsigned long long)kKeys, (unsigned long long)cache_nodes, double(platform::NowNs() - t0) / 1e9,
         (unsigned long long)scans.load(),
         (unsigned long long)checkpoints.load(), (unsigned long long)s.checkpoints,
         (unsigned long long)s.evictions, (unsigned long long)s.node_reads, (unsigned long long)s.restarts,
         (unsigned long long)s.depth[kBtreeTest]);
  if (expect_eviction) {
    EXPECT_GT(s.evictions, 0u);
    EXPECT_GT(s.node_reads, 0u);
    EXPECT_GT(s.cache_misses, 0u);
  }
  EXPECT_GE(s.depth[kBtreeTest], 2u);
  EXPECT_GE(scans.load(), 4u);

  Model want;
  for (u32 w = 0; w < kWriters; w++) {
    for (auto& [off, gen] : state[w]) want[MKey{kBtreeTest, w + 1, off}] = ConcValue(w + 1, off, gen);
  }
  Model got;
  ASSERT_NO_FATAL_FAILURE(ScanTree(t, kBtreeTest, &got));
  ASSERT_TRUE(got == want) << DescribeDiff(want, got);
  wd.Watch(nullptr);
  ASSERT_OK(e.Close());

  Store e2;
  ASSERT_OK(OpenEngine(&e2, fs, o));
  wd.Watch(&e2.btrees());
  got.clear();
  ASSERT_NO_FATAL_FAILURE(ScanTree(e2.btrees(), kBtreeTest, &got));
  ASSERT_TRUE(got == want) << "after reopen: " << DescribeDiff(want, got);
  wd.Watch(nullptr);
  ASSERT_OK(e2.Close());
}

// The tree stays cached: concurrency alone.
TEST(BtreeTreeTest, ConcurrentWritersReadersCheckpoints) { RunConcurrent(kSanitized ? 4000 : 20000, 4096, false); }

// A cache of 8 nodes under a tree of ~100: evictions and re-reads while the
// threads run.
TEST(BtreeTreeTest, ConcurrentWritersReadersCheckpointsAndEviction) {
  RunConcurrent(kSanitized ? 2000 : 6000, 8, true);
}

// Every operation lands on a leaf that was just read back in: a cache of 8
// small nodes under a tree of ~100 leaves, writers deleting in a sweep
// (merges), then inserting at random offsets (splits), readers fetching
// leaves the writers are about to change, checkpoints making leaves clean and
// so evictable. (The race below, a fetched leaf split before it was charged,
// needs a gap this test rarely hits: 0 of 8 ASan runs; the next test forces it.)
TEST(BtreeTreeTest, FetchedLeavesSplitAndMergedUnderEviction) {
  constexpr u32 kNode = 4096;
  constexpr u64 kOffsets = 4000;
  const u64 kOps = kSanitized ? 1000 : 10000;
  Fs fs(2, 64ull << 20);
  Watchdog wd(CurrentTest(), 90);
  Store e;
  Options o;
  ASSERT_NO_FATAL_FAILURE(OpenConcurrent(fs, kNode, 8 * kNode, &e, &o));
  Btrees& t = e.btrees();
  wd.Watch(&t);
  // Writer w owns the offsets with off % kWriters == w, so its model is exact.
  std::map<u64, u64> state[kWriters];
  for (u64 off = 0; off < kOffsets;) {
    Transaction tx(&t);
    for (int i = 0; i < 100 && off < kOffsets; i++, off++) {
      const std::string v = ConcValue(1, off, 1);
      ASSERT_OK(tx.Set(Pos{kBtreeTest, 1, off}, v.data(), u32(v.size())));
      state[off % kWriters][off] = 1;
    }
    ASSERT_OK(tx.Commit().status());
  }
  ASSERT_OK(t.Checkpoint());
  std::atomic<int> failures{0};
  std::atomic<bool> writers_done{false};
  auto fail = [&](const std::string& what) {
    if (failures.fetch_add(1) < 10) ADD_FAILURE() << what;
  };
  auto writer = [&](u32 w) {
    std::mt19937_64 rng(500 + w);
    std::map<u64, u64>& st = state[w];
    constexpr u64 kMine = kOffsets / kWriters;
    for (u64 i = 0; i < kMine + kOps && failures.load() == 0; i++) {
      // First both writers sweep up the keyspace deleting 7 of every 8 keys,
      // so leaves empty next to just-visited (cached) siblings and merge; then
      // kOps inserts and some deletes at random (splits).
      const bool shrink = i < kMine;
      const u64 k = shrink ? i : rng() % kMine;
      const u64 off = k * kWriters + w;
      auto it = st.find(off);
      if (shrink && (it == st.end() || k % 8 == 0)) continue;
      Transaction tx(&t);
      Status s;
      std::optional<u64> gen;
      if (it != st.end() && (shrink || rng() % 4 == 0)) {
        s = tx.Delete(Pos{kBtreeTest, 1, off});
      } else {
        gen = it == st.end() ? 1 : it->second + 1;
        const std::string v = ConcValue(1, off, *gen);
        s = tx.Set(Pos{kBtreeTest, 1, off}, v.data(), u32(v.size()));
      }
      Result<u64> seq = s.ok() ? tx.Commit() : Result<u64>(s);
      if (!seq.ok()) return fail("writer " + std::to_string(w) + ": " + Str(seq.status()));
      if (gen) {
        st[off] = *gen;
      } else {
        st.erase(off);
      }
    }
  };
  auto reader = [&](u32 r) {
    std::mt19937_64 rng(600 + r);
    Vector<u8> v;
    while (!writers_done.load() && failures.load() == 0) {
      Pos p{kBtreeTest, 1, rng() % kOffsets};
      Status gs = t.Get(p, &v);
      if (gs.ok() ? !ConcValueOk(p, v.data(), u32(v.size())) : gs != Status(Err::kNotFound))
        return fail("reader Get " + PosStr(p) + ": " + Str(gs));
    }
  };
  auto checkpointer = [&] {
    while (!writers_done.load() && failures.load() == 0) {
      Status s = t.Checkpoint();
      if (!s.ok()) return fail("Checkpoint: " + Str(s));
      platform::SleepNs(platform::kNsPerMs);
    }
  };
  RunThreads(writer, reader, checkpointer, &writers_done);
  ASSERT_EQ(failures.load(), 0);
  Stats s = t.GetStats();
  printf("[ fetched ] %llu random ops per writer after the sweep: splits %llu, merges %llu, evictions %llu, "
         "node reads %llu\n",
         (unsigned long long)kOps, (unsigned long long)s.splits, (unsigned long long)s.merges,
         (unsigned long long)s.evictions, (unsigned long long)s.node_reads);
  EXPECT_GT(s.splits, 0u);
  EXPECT_GT(s.merges, 0u);
  EXPECT_GT(s.evictions, 1000u);
  Model want;
  for (u32 w = 0; w < kWriters; w++)
    for (auto& [off, gen] : state[w]) want[MKey{kBtreeTest, 1, off}] = ConcValue(1, off, gen);
  Model got;
  ASSERT_NO_FATAL_FAILURE(ScanTree(t, kBtreeTest, &got));
  ASSERT_TRUE(got == want) << DescribeDiff(want, got);
  wd.Watch(nullptr);
  ASSERT_OK(e.Close());
}

// A leaf read on demand and split by a writer right after it was linked into
// the tree, before the reader's FetchMiss went on. Until 2026-12 FetchMiss
// charged the node to the cache (and put it on the LRU) only after releasing
// the tree lock: the split killed and freed it first, and the late charge put
// freed memory on the LRU (glibc in CI: "corrupted size vs. prev_size"; under
// make test-asan: a heap-use-after-free in Charge). The test point holds the
// reader in exactly that gap.
TEST(BtreeTreeTest, LeafSplitRightAfterItsFetch) {
  constexpr u32 kNode = 4096;
  Fs fs(2, 64ull << 20);
  ASSERT_OK(fs.Format(kNode));
  struct Gap {
    std::mutex mu;
    std::condition_variable cv;
    std::thread::id reader;
    bool armed = false, held = false, go = false;
  } gap;
  Options o;
  o.cache_bytes = 3 * kNode;
  o.node_size = 0;
  o.writer_thread = false;
  o.test_point_ctx = &gap;
  o.test_point = [](void* ctx, const char* point) {
    auto* g = static_cast<Gap*>(ctx);
    if (strcmp(point, "fetch.linked") != 0) return;
    std::unique_lock<std::mutex> l(g->mu);
    if (!g->armed || std::this_thread::get_id() != g->reader) return;
    g->armed = false;
    g->held = true;
    g->cv.notify_all();
    g->cv.wait(l, [g] { return g->go; });
  };
  Store e;
  ASSERT_OK(OpenEngine(&e, fs, o));
  Btrees& t = e.btrees();
  Model want;
  auto set = [&](Transaction& tx, u64 off, u64 gen) {
    const std::string v = ConcValue(1, off, gen);
    want[MKey{kBtreeTest, 1, off}] = v;
    return tx.Set(Pos{kBtreeTest, 1, off}, v.data(), u32(v.size()));
  };
  // ~10 leaves: offsets 0, 10, ..., 3990.
  for (u64 off = 0; off < 4000;) {
    Transaction tx(&t);
    for (int i = 0; i < 50; i++, off += 10) ASSERT_OK(set(tx, off, 1));
    ASSERT_OK(tx.Commit().status());
  }
  ASSERT_OK(t.Checkpoint());
  // Reading the far end evicts the first leaf (clean after the checkpoint).
  Vector<u8> v;
  for (u64 off = 3990; off >= 2000; off -= 10) ASSERT_OK(t.Get(Pos{kBtreeTest, 1, off}, &v));
  const Stats before = t.GetStats();
  Status read_st;
  std::thread reader([&] {
    {
      std::lock_guard<std::mutex> l(gap.mu);
      gap.reader = std::this_thread::get_id();
      gap.armed = true;
    }
    Vector<u8> rv;
    read_st = t.Get(Pos{kBtreeTest, 1, 10}, &rv);
    if (read_st.ok() && !ConcValueOk(Pos{kBtreeTest, 1, 10}, rv.data(), u32(rv.size()))) read_st = Err::kCorrupt;
  });
  bool held;
  {
    std::unique_lock<std::mutex> l(gap.mu);
    held = gap.cv.wait_for(l, std::chrono::seconds(60), [&] { return gap.held; });
  }
  Status split_st;
  if (held) {
    // The reader is in the gap, holding no lock: fill its leaf until it splits.
    // (No ASSERT before the reader is released and joined.)
    Transaction tx(&t);
    for (u64 off = 1; off < 300 && split_st.ok(); off += 2) split_st = set(tx, off, 7);
    if (split_st.ok()) split_st = tx.Commit().status();
  }
  {
    std::lock_guard<std::mutex> l(gap.mu);
    gap.go = true;
    gap.cv.notify_all();
  }
  reader.join();
  ASSERT_TRUE(held) << "the reader never fetched the evicted first leaf (cache misses "
                    << before.cache_misses << "); the test's setup no longer makes the gap";
  ASSERT_OK(split_st);
  ASSERT_OK(read_st);
  const Stats after = t.GetStats();
  EXPECT_GT(after.splits, before.splits);
  EXPECT_GT(after.cache_misses, before.cache_misses);
  // The cache's books still balance: every key read (evicting and fetching
  // again), a checkpoint, and the same trees after a reopen.
  for (const auto& [k, val] : want) {
    ASSERT_OK(t.Get(P(k), &v));
    ASSERT_EQ(Val(v), val) << KeyStr(k);
  }
  ASSERT_OK(t.Checkpoint());
  // Evicts what the checkpoint made clean (a node used since the last pass
  // survives one: its clock bit).
  for (int i = 0; i < 3; i++) ASSERT_OK(t.Get(Pos{kBtreeTest, 1, 0}, &v));
  EXPECT_LE(t.GetStats().cached_bytes, o.cache_bytes);
  ASSERT_OK(e.Close());
  Options o2 = o;
  o2.test_point = nullptr;
  Store e2;
  ASSERT_OK(OpenEngine(&e2, fs, o2));
  Model got;
  ASSERT_NO_FATAL_FAILURE(ScanTree(e2.btrees(), kBtreeTest, &got));
  ASSERT_TRUE(got == want) << DescribeDiff(want, got);
  ASSERT_OK(e2.Close());
}

// ---------------------------------------------------------------------------
// 3. Corruption.

struct Visited {
  u8 member;
  u64 offset;  // bytes on the member
  u64 seq;
  u8 level;
  u8 btree_id;
  Pos min, max;
  u32 used_bytes;
  std::vector<MKey> keys;  // leaves only
};

// Every node of every tree, top-down, with consistency checks of each visit.
Status CollectNodes(Btrees& t, std::vector<Visited>* out) {
  auto fn = [](void* ctx, const Btrees::NodeVisit& v) -> Status {
    auto* nodes = static_cast<std::vector<Visited>*>(ctx);
    Visited n;
    n.member = PtrCopy(*v.ptr, 0).member;
    n.offset = PtrCopy(*v.ptr, 0).offset;
    n.seq = v.ptr->seq.get();
    n.level = v.ptr->level;
    n.btree_id = v.ptr->btree_id;
    const NodeInfo& info = v.node->info();
    n.min = info.min;
    n.max = info.max;
    n.used_bytes = v.node->used_bytes();
    EXPECT_EQ(info.seq, n.seq) << "pointer and node disagree on seq";
    EXPECT_EQ(info.level, n.level);
    EXPECT_EQ(info.btree_id, n.btree_id);
    EXPECT_EQ(info.min, (Pos{n.btree_id, v.ptr->min_inode.get(), v.ptr->min_offset.get()}));
    if (info.level == 0) {
      NodeIter it(*v.node);
      for (it.SeekToFirst(); it.Valid(); it.Next()) n.keys.push_back(K(it.pos()));
    }
    nodes->push_back(std::move(n));
    return Status::Ok();
  };
  return t.ForEachNode(fn, out);
}

Pos Successor(const Pos& p) {
  if (p.offset != ~u64(0)) return Pos{p.btree_id, p.inode, p.offset + 1};
  return Pos{p.btree_id, p.inode + 1, 0};
}

std::vector<Visited> LeavesOf(const std::vector<Visited>& nodes, u8 id) {
  std::vector<Visited> leaves;
  for (const Visited& n : nodes) {
    if (n.btree_id == id && n.level == 0) leaves.push_back(n);
  }
  std::sort(leaves.begin(), leaves.end(), [](const Visited& a, const Visited& b) { return a.min < b.min; });
  return leaves;
}

// The leaves of a tree partition [Min, Max] and hold the model's keys.
void ExpectLeavesPartition(const std::vector<Visited>& leaves, const Model& model, u8 id) {
  ASSERT_FALSE(leaves.empty());
  EXPECT_EQ(leaves.front().min, Pos::Min(id));
  EXPECT_EQ(leaves.back().max, Pos::Max(id));
  Model seen;
  for (usize i = 0; i < leaves.size(); i++) {
    if (i > 0) {
      EXPECT_EQ(leaves[i].min, Successor(leaves[i - 1].max)) << "leaf " << i << " of " << leaves.size();
    }
    for (const MKey& k : leaves[i].keys) {
      EXPECT_LE(leaves[i].min, P(k));
      EXPECT_GE(leaves[i].max, P(k));
      seen[k] = "";
    }
  }
  Model want;
  for (const auto& [k, v] : Slice(model, id)) want[k] = "";
  EXPECT_TRUE(seen == want) << DescribeDiff(want, seen);
}

std::string CorruptValue(u64 i) { return std::string(60 + i % 90, char('a' + i % 26)) + std::to_string(i); }

enum class Damage { kHeaderByte, kKeyByte, kZeroed, kOtherLeaf, kUnusedTail };

const char* DamageName(Damage d);
void PrintTo(Damage d, std::ostream* os) { *os << DamageName(d); }

const char* DamageName(Damage d) {
  switch (d) {
    case Damage::kHeaderByte: return "HeaderByte";
    case Damage::kKeyByte: return "KeyByte";
    case Damage::kZeroed: return "Zeroed";
    case Damage::kOtherLeaf: return "OtherLeaf";
    case Damage::kUnusedTail: return "UnusedTail";
  }
  return "?";
}

class BtreeCorruption : public ::testing::Test {
 protected:
  static constexpr u32 kNode = 4096;

  // Formats, writes `n` keys of kBtreeTest and a few of kOther, closes; then opens
  // again (tiny cache) to find every node, and closes again.
  void Build(u64 n) {
    fs_ = std::make_unique<Fs>(2, kDevSize);
    ASSERT_OK(fs_->Format(kNode));
    {
      Store e;
      ASSERT_OK(OpenEngine(&e, *fs_, Opts()));
      for (u64 i = 0; i < n;) {
        Transaction tx(&e.btrees());
        for (u64 j = 0; j < 50 && i < n; j++, i++) {
          MKey k{kBtreeTest, 1 + i / 100, (i % 100) * 3};
          model_[k] = CorruptValue(i);
          ASSERT_OK(tx.Set(P(k), model_[k].data(), u32(model_[k].size())));
        }
        ASSERT_OK(tx.Commit().status());
      }
      Transaction tx(&e.btrees());
      for (u64 i = 0; i < 5; i++) {
        MKey k{kOther, i, i};
        model_[k] = CorruptValue(i);
        ASSERT_OK(tx.Set(P(k), model_[k].data(), u32(model_[k].size())));
      }
      ASSERT_OK(tx.Commit().status());
      ASSERT_OK(e.Close());
    }
    Store e;
    ASSERT_OK(OpenEngine(&e, *fs_, Opts()));
    ASSERT_OK(CollectNodes(e.btrees(), &nodes_));
    ASSERT_OK(e.Close());
    // A clean open and close writes no node: the locations still hold.
    Store again;
    ASSERT_OK(OpenEngine(&again, *fs_, Opts()));
    std::vector<Visited> nodes2;
    ASSERT_OK(CollectNodes(again.btrees(), &nodes2));
    ASSERT_OK(again.Close());
    ASSERT_EQ(nodes2.size(), nodes_.size());
    for (usize i = 0; i < nodes_.size(); i++) {
      ASSERT_EQ(nodes2[i].seq, nodes_[i].seq) << "a clean open/close rewrote node " << i;
      ASSERT_EQ(nodes2[i].offset, nodes_[i].offset);
    }
    leaves_ = LeavesOf(nodes_, kBtreeTest);
    ASSERT_NO_FATAL_FAILURE(ExpectLeavesPartition(leaves_, model_, kBtreeTest));
    ASSERT_GE(leaves_.size(), 8u);
  }

  Options Opts() const {
    Options o;
    o.cache_bytes = 8 * kNode;  // every leaf is read from the device (TinyCache goes smaller)
    o.node_size = 0;
    o.writer_thread = false;
    return o;
  }

  MemDevice& Dev(const Visited& n) { return *fs_->devs[n.member]; }

  Watchdog wd_{CurrentTest(), 60};
  std::unique_ptr<Fs> fs_;
  Model model_;
  std::vector<Visited> nodes_;
  std::vector<Visited> leaves_;
};

class BtreeCorruptionTest : public BtreeCorruption, public ::testing::WithParamInterface<Damage> {};

bool IsCorrupt(Status st) { return st.Is(ErrorClass::kCorrupt); }

TEST_P(BtreeCorruptionTest, DamagedLeafIsCorruptOthersReadable) {
  const Damage damage = GetParam();
  ASSERT_NO_FATAL_FAILURE(Build(3000));
  usize vi = leaves_.size() / 2;
  while (vi + 3 < leaves_.size() &&
         (leaves_[vi].keys.size() < 2 || (damage == Damage::kUnusedTail && leaves_[vi].used_bytes >= kNode))) {
    vi++;
  }
  const Visited victim = leaves_[vi];
  ASSERT_GE(victim.keys.size(), 2u);
  const Visited& donor = leaves_[vi + 2];
  MemDevice& dev = Dev(victim);
  std::vector<u8> buf(kNode);
  switch (damage) {
    case Damage::kHeaderByte:  // a byte of the seq: the header checksum fails
      dev.ReadRaw(victim.offset + 17, buf.data(), 1);
      buf[0] ^= 0x10;
      dev.WriteRaw(victim.offset + 17, buf.data(), 1);
      break;
    case Damage::kKeyByte: {  // a value byte of a key in the middle of the node
      u64 at = victim.offset + sizeof(NodeHeader) + sizeof(SetHeader) + (victim.used_bytes - 128) / 2;
      dev.ReadRaw(at, buf.data(), 1);
      buf[0] ^= 0x01;
      dev.WriteRaw(at, buf.data(), 1);
      break;
    }
    case Damage::kZeroed:  // a lost write
      memset(buf.data(), 0, kNode);
      dev.WriteRaw(victim.offset, buf.data(), kNode);
      break;
    case Damage::kOtherLeaf:  // a valid node, but not the one the parent points to
      Dev(donor).ReadRaw(donor.offset, buf.data(), kNode);
      dev.WriteRaw(victim.offset, buf.data(), kNode);
      break;
    case Damage::kUnusedTail:  // beyond used_bytes: not part of the node (control)
      ASSERT_LT(victim.used_bytes, kNode);
      dev.ReadRaw(victim.offset + kNode - 1, buf.data(), 1);
      buf[0] ^= 0xff;
      dev.WriteRaw(victim.offset + kNode - 1, buf.data(), 1);
      break;
  }
  const bool expect_corrupt = damage != Damage::kUnusedTail;
  auto in_victim = [&](const MKey& k) { return expect_corrupt && P(k) >= victim.min && P(k) <= victim.max; };

  Store e;
  ASSERT_OK(OpenEngine(&e, *fs_, Opts()));  // leaves are not read at open
  Btrees& t = e.btrees();
  wd_.Watch(&t);
  Vector<u8> v;
  for (int pass = 0; pass < 2; pass++) {  // a bad leaf stays bad: never cached as good
    for (const auto& [k, want] : Slice(model_, kBtreeTest)) {
      Status st = t.Get(P(k), &v);
      if (in_victim(k)) {
        ASSERT_TRUE(IsCorrupt(st)) << KeyStr(k) << " in the damaged leaf: " << Str(st);
      } else {
        ASSERT_TRUE(st.ok()) << KeyStr(k) << ": " << Str(st);
        ASSERT_EQ(Val(v), want) << KeyStr(k);
      }
    }
  }
  // Bounded Get too.
  u8 small[8];
  Result<u32> r = t.Get(P(victim.keys[0]), small, sizeof(small));
  if (expect_corrupt) {
    EXPECT_TRUE(IsCorrupt(r.status())) << Str(r.status());
  } else {
    EXPECT_TRUE(r.ok());
  }

  // Forward: exactly the keys before the damaged leaf, then the error.
  std::vector<MKey> want_keys;
  for (const auto& [k, val] : Slice(model_, kBtreeTest)) want_keys.push_back(k);
  {
    Iterator it(&t, kBtreeTest);
    Status st = it.SeekToFirst();
    usize i = 0;
    while (st.ok() && it.Valid()) {
      ASSERT_LT(i, want_keys.size());
      ASSERT_EQ(K(it.pos()), want_keys[i]);
      ASSERT_EQ(Val(it), model_[want_keys[i]]);
      ASSERT_FALSE(in_victim(want_keys[i])) << "iterator returned a key of the damaged leaf";
      i++;
      st = it.Next();
    }
    if (expect_corrupt) {
      ASSERT_TRUE(IsCorrupt(st)) << Str(st);
      EXPECT_FALSE(it.Valid());
      ASSERT_LT(i, want_keys.size());
      EXPECT_TRUE(in_victim(want_keys[i])) << "forward scan stopped at " << KeyStr(want_keys[i]) << ", not at the damaged leaf";
    } else {
      ASSERT_OK(st);
      EXPECT_EQ(i, want_keys.size());
    }
  }
  // Backward: exactly the keys after it, then the error.
  {
    Iterator it(&t, kBtreeTest);
    Status st = it.SeekToLast();
    usize i = want_keys.size();
    while (st.ok() && it.Valid()) {
      ASSERT_GT(i, 0u);
      i--;
      ASSERT_EQ(K(it.pos()), want_keys[i]);
      ASSERT_EQ(Val(it), model_[want_keys[i]]);
      st = it.Prev();
    }
    if (expect_corrupt) {
      ASSERT_TRUE(IsCorrupt(st)) << Str(st);
      EXPECT_FALSE(it.Valid());
      ASSERT_GT(i, 0u);
      EXPECT_TRUE(in_victim(want_keys[i - 1])) << "backward scan stopped at " << KeyStr(want_keys[i - 1]);
    } else {
      ASSERT_OK(st);
      EXPECT_EQ(i, 0u);
    }
  }
  // Seeks into the damaged leaf fail; seeks elsewhere work.
  {
    Iterator it(&t, kBtreeTest);
    Status st = it.Seek(P(victim.keys[1]));
    if (expect_corrupt) {
      EXPECT_TRUE(IsCorrupt(st)) << Str(st);
      EXPECT_FALSE(it.Valid());
      st = it.SeekForPrev(P(victim.keys[1]));
      EXPECT_TRUE(IsCorrupt(st)) << Str(st);
    } else {
      EXPECT_OK(st);
    }
    ASSERT_OK(it.Seek(P(leaves_.back().keys[0])));
    ASSERT_TRUE(it.Valid());
    EXPECT_EQ(K(it.pos()), leaves_.back().keys[0]);
  }
  // The other tree is untouched.
  Model other;
  ASSERT_NO_FATAL_FAILURE(ScanTree(t, kOther, &other));
  EXPECT_TRUE(other == Slice(model_, kOther));
  // A commit that must update the damaged leaf fails and changes nothing; one that
  // updates other leaves works.
  {
    Transaction tx(&t);
    std::string nv = "new value";
    ASSERT_OK(tx.Set(P(victim.keys[0]), nv.data(), u32(nv.size())));
    ASSERT_OK(tx.Set(P(leaves_[0].keys[0]), nv.data(), u32(nv.size())));
    Result<u64> c = tx.Commit(CommitMode::kFlush);
    if (expect_corrupt) {
      EXPECT_TRUE(IsCorrupt(c.status())) << Str(c.status());
      ASSERT_OK(t.Get(P(leaves_[0].keys[0]), &v));
      EXPECT_EQ(Val(v), model_[leaves_[0].keys[0]]) << "a failed commit was partly applied";
    } else {
      ASSERT_OK(c.status());
    }
    Transaction tx2(&t);
    ASSERT_OK(tx2.Set(P(leaves_.back().keys[0]), nv.data(), u32(nv.size())));
    ASSERT_OK(tx2.Commit().status());
    ASSERT_OK(t.Get(P(leaves_.back().keys[0]), &v));
    EXPECT_EQ(Val(v), nv);
  }
  Stats s = t.GetStats();
  if (expect_corrupt) {
    EXPECT_GT(s.corrupt_reads, 0u);
    std::vector<Visited> ignored;
    Status fe = CollectNodes(t, &ignored);
    EXPECT_TRUE(IsCorrupt(fe)) << "ForEachNode over a damaged leaf: " << Str(fe);
  } else {
    EXPECT_EQ(s.corrupt_reads, 0u);
  }
  wd_.Watch(nullptr);
  EXPECT_OK(e.Close());
}

INSTANTIATE_TEST_SUITE_P(Damages, BtreeCorruptionTest,
                         ::testing::Values(Damage::kHeaderByte, Damage::kKeyByte, Damage::kZeroed,
                                           Damage::kOtherLeaf, Damage::kUnusedTail),
                         [](const ::testing::TestParamInfo<Damage>& i) { return DamageName(i.param); });

// An interior node is read at open: damage fails the open (Corrupt class) or, if
// the open succeeds, every read of that tree; never wrong data.
TEST_F(BtreeCorruption, DamagedInteriorNode) {
  ASSERT_NO_FATAL_FAILURE(Build(3000));
  const Visited* interior = nullptr;
  for (const Visited& n : nodes_) {
    if (n.btree_id == kBtreeTest && n.level > 0) interior = &n;
  }
  ASSERT_NE(interior, nullptr) << "the tree has no interior node";
  std::vector<u8> b(1);
  MemDevice& dev = Dev(*interior);
  u64 at = interior->offset + interior->used_bytes / 2;
  dev.ReadRaw(at, b.data(), 1);
  b[0] ^= 0x40;
  dev.WriteRaw(at, b.data(), 1);
  Store e;
  Diag diag;
  std::vector<BlockDevice*> l = fs_->List();
  Status st = e.Open(l.data(), u32(l.size()), EngineOptions(Opts()), &diag);
  if (!st.ok()) {
    EXPECT_TRUE(IsCorrupt(st)) << Str(st) << ": " << diag.text;
    return;
  }
  Vector<u8> v;
  u64 corrupt = 0;
  for (const auto& [k, want] : Slice(model_, kBtreeTest)) {
    Status g = e.btrees().Get(P(k), &v);
    if (g.ok()) {
      EXPECT_EQ(Val(v), want) << KeyStr(k);
    } else {
      EXPECT_TRUE(IsCorrupt(g)) << Str(g);
      corrupt++;
    }
  }
  EXPECT_GT(corrupt, 0u) << "open succeeded and no read noticed the damaged interior node";
  ASSERT_OK(e.Close());
}

// A node cache of a few nodes under a tree of ~100 leaves three levels deep: every
// leaf is read from the device (and evicted) during a scan; scans and Gets must
// still make progress and see every key.
TEST_F(BtreeCorruption, TinyCache) {
  ASSERT_NO_FATAL_FAILURE(Build(3000));
  for (u64 nodes : {16, 8, 4, 3, 2}) {
    Options o = Opts();
    o.cache_bytes = nodes * kNode;
    Store e;
    ASSERT_OK(OpenEngine(&e, *fs_, o));
    wd_.Watch(&e.btrees());
    Model got;
    ASSERT_NO_FATAL_FAILURE(ScanTree(e.btrees(), kBtreeTest, &got)) << "cache of " << nodes << " nodes";
    EXPECT_TRUE(got == Slice(model_, kBtreeTest)) << "cache of " << nodes << " nodes";
    ASSERT_NO_FATAL_FAILURE(GetsMatch(e.btrees(), model_, kBtreeTest)) << "cache of " << nodes << " nodes";
    Stats s = e.btrees().GetStats();
    EXPECT_GE(s.depth[kBtreeTest], 3u);
    EXPECT_GT(s.evictions, 0u);
    // Two scans and one Get per key: a few reads per key at worst (a path of three
    // nodes may not fit), not a thrash.
    const usize keys = Slice(model_, kBtreeTest).size();
    EXPECT_LE(s.node_reads, 4 * keys + 20 * leaves_.size()) << "cache of " << nodes << " nodes: reads thrash";
    wd_.Watch(nullptr);
    ASSERT_OK(e.Close());
  }
}

// Formats fs with 4 KiB nodes and opens it without the writer thread
// (checkpoints by hand); *o: the options it was opened with.
void FormatAndOpen(Fs& fs, Store* e, Options* o) {
  ASSERT_OK(fs.Format(4096));
  o->writer_thread = false;
  ASSERT_OK(OpenEngine(e, fs, *o));
}

// Calls fn(member, byte offset, bytes) for each roots block slot of fs that
// has the roots magic.
template <typename Fn>
void ForEachRootsSlot(Fs& fs, Fn fn) {
  for (u32 m = 0; m < fs.devs.size(); m++) {
    for (u64 s = 0; s < 2; s++) {
      RootsFormat f;
      const u64 at = kRootsOffset + s * kRootsSlotSize;
      fs.devs[m]->ReadRaw(at, &f, sizeof(f));
      if (f.magic.get() == kRootsMagic) fn(m, at, f);
    }
  }
}

// Roots blocks: ReadRoots finds the newest valid slot; with every slot damaged the
// filesystem does not open (Corrupt class).
TEST(BtreeTreeTest, RootsBlocks) {
  Watchdog wd(CurrentTest(), 60);
  Fs fs(2, kDevSize);
  Options o;
  Store e;
  ASSERT_NO_FATAL_FAILURE(FormatAndOpen(fs, &e, &o));
  Btrees& t = e.btrees();
  u64 gen0 = t.roots().gen;
  for (int i = 0; i < 3; i++) {
    Transaction tx(&t);
    std::string v = "v" + std::to_string(i);
    ASSERT_OK(tx.Set(T(1, u64(i)), v.data(), u32(v.size())));
    Result<u64> seq = tx.Commit();
    ASSERT_OK(seq.status());
    ASSERT_OK(t.Checkpoint());
    EXPECT_GT(t.roots().gen, gen0);
    EXPECT_GE(t.roots().journal_seq, *seq) << "the roots do not claim the commit the checkpoint wrote";
    gen0 = t.roots().gen;
  }
  Roots r;
  Diag diag;
  ASSERT_OK(ReadRoots(e.devs(), e.sb(), &r, &diag));
  EXPECT_EQ(r.gen, t.roots().gen);
  EXPECT_EQ(r.journal_seq, t.roots().journal_seq);
  EXPECT_EQ(r.roots[kBtreeTest].seq.get(), t.roots().roots[kBtreeTest].seq.get());
  EXPECT_TRUE(SamePtrCopies(r.roots[kBtreeTest], t.roots().roots[kBtreeTest]));
  EXPECT_TRUE(PtrEmpty(r.roots[kBtreeInodes]));  // untouched trees stay empty

  // Damage the newest slot on every member: the older one is used.
  u64 newest = 0, older = 0;
  ForEachRootsSlot(fs, [&](u32, u64, const RootsFormat& f) { newest = std::max(newest, f.gen.get()); });
  EXPECT_EQ(newest, r.gen);
  ForEachRootsSlot(fs, [&](u32 m, u64 at, const RootsFormat& f) {
    if (f.gen.get() == newest) {
      u8 x = 0x55;
      fs.devs[m]->WriteRaw(at + 100, &x, 1);
    } else {
      older = std::max(older, f.gen.get());
    }
  });
  ASSERT_GT(older, 0u);
  Roots r2;
  ASSERT_OK(ReadRoots(e.devs(), e.sb(), &r2, &diag));
  EXPECT_EQ(r2.gen, older);
  // Every slot damaged.
  for (u32 m = 0; m < fs.devs.size(); m++) {
    std::vector<u8> junk(2 * kRootsSlotSize, 0x5a);
    fs.devs[m]->WriteRaw(kRootsOffset, junk.data(), junk.size());
  }
  Status st = ReadRoots(e.devs(), e.sb(), &r2, &diag);
  EXPECT_TRUE(IsCorrupt(st)) << Str(st);
  ASSERT_OK(e.Close());  // writes a new roots block
  for (u32 m = 0; m < fs.devs.size(); m++) {
    std::vector<u8> junk(2 * kRootsSlotSize, 0x5a);
    fs.devs[m]->WriteRaw(kRootsOffset, junk.data(), junk.size());
  }
  Store e2;
  std::vector<BlockDevice*> l = fs.List();
  st = e2.Open(l.data(), u32(l.size()), EngineOptions(o), &diag);
  EXPECT_TRUE(IsCorrupt(st)) << "open without a valid roots block: " << Str(st);
}

// Node pointers (format 2, NodePtrFormat with copies): every parse rule on
// its own. Whatever NodePtrProblem accepts, PtrCopies and PtrCopy read
// within the copies given.
TEST(NodePtrTest, EveryParseRuleRefusesItsOwnBreak) {
  // Members of 16 buckets of 1 MiB, 4 KiB nodes.
  auto geometry = [](u32 members) {
    sb::Superblock g{};
    g.nr_members = members;
    g.bucket_size = 1 << 20;
    g.btree_node_size = 4096;
    for (u32 m = 0; m < members; m++) {
      g.members[m].nbuckets = 16;
      g.members[m].data_allowed = sb::kDataAll;
    }
    return g;
  };
  const sb::Superblock g2 = geometry(2), g3 = geometry(3), g4 = geometry(4);
  auto one = [] {
    NodePtrFormat p = EmptyPtr(kBtreeTest);
    p.seq.set(7);
    AddPtrCopy(&p, 1, 3 << 20);
    return p;
  };
  EXPECT_EQ(NodePtrProblem(one(), g2, 4096, false), nullptr);
  EXPECT_EQ(NodePtrProblem(EmptyPtr(kBtreeTest), g2, 4096, true), nullptr);
  NodePtrFormat four = EmptyPtr(kBtreeTest);
  for (u32 m = 0; m < 4; m++) AddPtrCopy(&four, 3 - m, (1 + m) << 20);
  EXPECT_EQ(NodePtrProblem(four, g4, 4096, false), nullptr);
  EXPECT_EQ(PtrCopies(four), 4u);
  EXPECT_EQ(PtrCopy(four, 3).member, 0u);
  EXPECT_EQ(PtrCopy(four, 3).offset, u64(4) << 20);
  EXPECT_STREQ(NodePtrProblem(four, g3, 4096, false), "a copy on no member");
  // A member that may not hold btree nodes holds no copy.
  sb::Superblock user_only = g2;
  user_only.members[1].data_allowed = sb::kDataUser;
  EXPECT_STREQ(NodePtrProblem(one(), user_only, 4096, false), "a copy on a member that holds no btree nodes");
  // The last copy's offset, never read while the first serves, is checked too.
  four.offset[3].set(17 << 20);
  EXPECT_STREQ(NodePtrProblem(four, g4, 4096, false), "a copy outside the btree area");
  struct Case {
    const char* name;
    void (*bend)(NodePtrFormat* p);
    const char* why;
  };
  const Case cases[] = {
      {"no copy where one is needed", [](NodePtrFormat* p) { ClearPtrCopies(p); }, "a copy count out of range"},
      {"five copies", [](NodePtrFormat* p) { p->nr = 5; }, "a copy count out of range"},
      {"nr past the entries used", [](NodePtrFormat* p) { p->nr = 2; }, "a copy on no member"},
      {"a copy on member 0xff", [](NodePtrFormat* p) { p->member[0] = kNoMember; }, "a copy on no member"},
      {"a copy on member 2 of 2", [](NodePtrFormat* p) { p->member[0] = 2; }, "a copy on no member"},
      {"two copies on one member", [](NodePtrFormat* p) { AddPtrCopy(p, 1, 5 << 20); }, "two copies on one member"},
      {"an offset before the bucket area", [](NodePtrFormat* p) { p->offset[0].set(64 << 10); },
       "a copy outside the btree area"},
      {"an offset past the member's buckets", [](NodePtrFormat* p) { p->offset[0].set(17 << 20); },
       "a copy outside the btree area"},
      {"an offset inside a slot", [](NodePtrFormat* p) { p->offset[0].set((3 << 20) + 512); },
       "a copy outside the btree area"},
      {"a second copy's offset outside", [](NodePtrFormat* p) { AddPtrCopy(p, 0, 0); },
       "a copy outside the btree area"},
      {"an unused entry's member set", [](NodePtrFormat* p) { p->member[3] = 0; }, "an unused copy entry not cleared"},
      {"an unused entry's offset set", [](NodePtrFormat* p) { p->offset[1].set(4096); },
       "an unused copy entry not cleared"},
      {"reserved0", [](NodePtrFormat* p) { p->reserved0 = 1; }, "reserved bytes not zero"},
      {"reserved1", [](NodePtrFormat* p) { p->reserved1.set(1); }, "reserved bytes not zero"},
  };
  for (const Case& c : cases) {
    NodePtrFormat p = one();
    c.bend(&p);
    EXPECT_STREQ(NodePtrProblem(p, g2, 4096, false), c.why) << c.name;
    // A root may have no copy; every other break stays one.
    if (&c != &cases[0]) {
      EXPECT_NE(NodePtrProblem(p, g2, 4096, true), nullptr) << c.name;
    }
  }
  // An empty pointer is a root's only: refused as a child.
  EXPECT_STREQ(NodePtrProblem(EmptyPtr(kBtreeTest), g2, 4096, false), "a copy count out of range");
}

// A roots block slot whose entry breaks a parse rule (its checksum good) is
// rejected as a whole; the mount takes the other slot, and a slot bent on
// every member leaves the older roots.
TEST(NodePtrTest, AHostileRootsEntryRejectsItsSlot) {
  Watchdog wd(CurrentTest(), 60);
  for (int bend = 0; bend < 6; bend++) {
    Fs fs(2, kDevSize);
    Options o;
    Store e;
    ASSERT_NO_FATAL_FAILURE(FormatAndOpen(fs, &e, &o));
    Btrees& t = e.btrees();
    for (int i = 0; i < 2; i++) {
      Transaction tx(&t);
      ASSERT_OK(tx.Set(T(1, u64(i)), "v", 1));
      ASSERT_OK(tx.Commit().status());
      ASSERT_OK(t.Checkpoint());
    }
    const u64 newest = t.roots().gen;
    ForEachRootsSlot(fs, [&](u32 m, u64 at, RootsFormat f) {
      if (f.gen.get() != newest) return;
      EXPECT_EQ(f.version.get(), kRootsVersion);
      NodePtrFormat& test = f.roots[kBtreeTest];
      NodePtrFormat& empty = f.roots[kBtreeInodes];
      ASSERT_EQ(PtrCopies(test), 1u);
      ASSERT_TRUE(PtrEmpty(empty));
      if (bend == 0) AddPtrCopy(&test, PtrCopy(test, 0).member, PtrCopy(test, 0).offset);  // one member twice
      if (bend == 1) test.nr = 0;              // the tree's root dropped, its copy left
      if (bend == 2) empty.seq.set(1);         // an empty root that names a node
      if (bend == 3) empty.member[2] = 0;      // a stray entry in an empty root
      if (bend == 4) empty.level = 1;          // an empty root above a level
      if (bend == 5) empty.min_offset.set(1);  // an empty root not from the tree's min
      f.csum.set(platform::Crc32cSkippingField(&f, kRootsSlotSize, offsetof(RootsFormat, csum)));
      fs.devs[m]->WriteRaw(at, &f, sizeof(f));
    });
    ASSERT_FALSE(HasFatalFailure());
    Roots r;
    Diag diag;
    ASSERT_OK(ReadRoots(e.devs(), e.sb(), &r, &diag));
    EXPECT_EQ(r.gen, newest - 1) << "bend " << bend;
    EXPECT_EQ(r.rejected, 2u) << "bend " << bend;
    ASSERT_OK(e.Close());
  }
}

// An interior node whose child pointer breaks a parse rule (its set
// checksum recomputed, so only the rule can catch it) fails its read with
// the rule named -- a second copy's offset too, though only the first copy
// is read (the mount counts every copy's slot).
TEST_F(BtreeCorruption, AHostileChildPointerIsRefusedWithItsRule) {
  struct Bend {
    const char* why;
    bool same_member;  // the second copy on the first's member, else on the other
    u64 offset;        // the second copy's (~0: the slot after the first's)
  };
  // One member twice; a second copy, never read, outside its member's buckets.
  const Bend bends[] = {{"two copies on one member", true, ~u64(0)}, {"a copy outside the btree area", false, 0}};
  for (const Bend& bend : bends) {
    model_.clear();
    nodes_.clear();
    leaves_.clear();
    ASSERT_NO_FATAL_FAILURE(Build(3000));
    const Visited* interior = nullptr;
    for (const Visited& n : nodes_)
      if (n.btree_id == kBtreeTest && n.level == 1 && interior == nullptr) interior = &n;
    ASSERT_NE(interior, nullptr);
    MemDevice& dev = Dev(*interior);
    std::vector<u8> img(kNode);
    dev.ReadRaw(interior->offset, img.data(), img.size());
    const size_t set = sizeof(NodeHeader);
    const size_t key1 = set + sizeof(SetHeader) + KeySpace(sizeof(NodePtrFormat));
    auto* p = reinterpret_cast<NodePtrFormat*>(&img[key1 + sizeof(KeyHeader)]);
    ASSERT_EQ(PtrCopies(*p), 1u);
    const NodeCopy first = PtrCopy(*p, 0);
    const u32 member = bend.same_member ? first.member : 1 - first.member;
    AddPtrCopy(p, member, bend.offset == ~u64(0) ? first.offset + kNode : bend.offset);
    auto* sh = reinterpret_cast<SetHeader*>(&img[set]);
    sh->csum.set(platform::Crc32cSkippingField(sh, sh->bytes.get(), offsetof(SetHeader, csum)));
    dev.WriteRaw(interior->offset, img.data(), img.size());
    Store e;
    Diag diag;
    std::vector<BlockDevice*> l = fs_->List();
    Status st = e.Open(l.data(), u32(l.size()), EngineOptions(Opts()), &diag);
    ASSERT_TRUE(IsCorrupt(st)) << bend.why << ": " << Str(st);
    const std::string want =
        "seq " + std::to_string(interior->seq) + ": child 1 has a bad pointer (" + bend.why + ")";
    EXPECT_NE(std::string(diag.text).find(want), std::string::npos) << diag.text;
  }
}

// ---------------------------------------------------------------------------
// 4. Edge cases.

class BtreeEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = std::make_unique<Fs>(1, kDevSize);
    ASSERT_OK(fs_->Format(4096));
    opts_.writer_thread = false;
    ASSERT_NO_FATAL_FAILURE(Reopen(true));
  }
  void TearDown() override {
    wd_.Watch(nullptr);
    if (e_) EXPECT_OK(e_->Close());
  }
  void Reopen(bool first = false) {
    wd_.Watch(nullptr);
    if (!first) ASSERT_OK(e_->Close());
    e_ = std::make_unique<Store>();
    ASSERT_OK(OpenEngine(e_.get(), *fs_, opts_, &rep_));
    wd_.Watch(&e_->btrees());
  }
  Btrees& t() { return e_->btrees(); }
  void Set(const Pos& p, const std::string& v, CommitMode m = CommitMode::kNoFlush) {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(p, v.data(), u32(v.size())));
    ASSERT_OK(tx.Commit(m).status());
  }
  void Del(const Pos& p) {
    Transaction tx(&t());
    ASSERT_OK(tx.Delete(p));
    ASSERT_OK(tx.Commit().status());
  }
  // Everything in tree id, forward; checks backward gives the same.
  std::vector<std::pair<Pos, std::string>> All(u8 id = kBtreeTest) {
    Model m;
    ScanTree(t(), id, &m);
    std::vector<std::pair<Pos, std::string>> out;
    for (auto& [k, v] : m) out.push_back({P(k), v});
    return out;
  }

  Watchdog wd_{CurrentTest(), 60};
  std::unique_ptr<Fs> fs_;
  Options opts_;
  std::unique_ptr<Store> e_;
  store::OpenReport rep_;
};

TEST_F(BtreeEdgeTest, EmptyTree) {
  EXPECT_EQ(e_->btrees().node_size(), 4096u);
  Vector<u8> v;
  EXPECT_EQ(t().Get(T(1, 1), &v), Status(Err::kNotFound));
  u8 b[4];
  EXPECT_EQ(t().Get(T(1, 1), b, 4).status(), Status(Err::kNotFound));
  Iterator it(&t(), kBtreeTest);
  ASSERT_OK(it.SeekToFirst());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekToLast());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.Seek(Pos::Min(kBtreeTest)));
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekForPrev(Pos::Max(kBtreeTest)));
  EXPECT_FALSE(it.Valid());
  // Deleting an absent key is not an error.
  Del(T(3, 3));
  EXPECT_TRUE(All().empty());
}

TEST_F(BtreeEdgeTest, OneKeyTree) {
  Set(T(5, 5), "x");
  Vector<u8> v;
  ASSERT_OK(t().Get(T(5, 5), &v));
  EXPECT_EQ(Val(v), "x");
  EXPECT_EQ(t().Get(T(5, 4), &v), Status(Err::kNotFound));
  EXPECT_EQ(t().Get(T(5, 6), &v), Status(Err::kNotFound));
  EXPECT_EQ(t().Get(Pos{kOther, 5, 5}, &v), Status(Err::kNotFound));  // same inode/offset, other tree
  Iterator it(&t(), kBtreeTest);
  ASSERT_OK(it.SeekToFirst());
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(5, 5));
  EXPECT_EQ(Val(it), "x");
  ASSERT_OK(it.Next());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekToLast());
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(5, 5));
  ASSERT_OK(it.Prev());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.Seek(T(0, 0)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(5, 5));
  ASSERT_OK(it.Seek(T(5, 5)));
  ASSERT_TRUE(it.Valid());
  ASSERT_OK(it.Seek(T(5, 6)));
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekForPrev(T(5, 4)));
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekForPrev(T(5, 5)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(5, 5));
  ASSERT_OK(it.SeekForPrev(Pos::Max(kBtreeTest)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(5, 5));
  EXPECT_GE(t().GetStats().depth[kBtreeTest], 1u);
  // Overwrite, then delete: empty again.
  Set(T(5, 5), "");
  ASSERT_OK(t().Get(T(5, 5), &v));
  EXPECT_EQ(v.size(), 0u);
  Del(T(5, 5));
  EXPECT_EQ(t().Get(T(5, 5), &v), Status(Err::kNotFound));
  ASSERT_OK(it.SeekToFirst());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.SeekToLast());
  EXPECT_FALSE(it.Valid());
  // And still empty after a clean close and open.
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_TRUE(rep_.was_clean);
  EXPECT_TRUE(All().empty());
  EXPECT_EQ(t().Get(T(5, 5), &v), Status(Err::kNotFound));
}

TEST_F(BtreeEdgeTest, MaxValuesOnePerNode) {
  constexpr int kN = 40;
  auto value = [](int i, int gen) {
    std::string s(kMaxValueBytes, char('A' + (i + gen) % 26));
    memcpy(&s[0], &i, sizeof(i));
    memcpy(&s[kMaxValueBytes - sizeof(gen)], &gen, sizeof(gen));
    return s;
  };
  // Inserted in a scattered order, some several per transaction.
  std::vector<int> order;
  for (int i = 0; i < kN; i++) order.push_back((i * 17) % kN);
  for (usize i = 0; i < order.size();) {
    Transaction tx(&t());
    for (int j = 0; j < 3 && i < order.size(); j++, i++) {
      std::string v = value(order[i], 0);
      ASSERT_OK(tx.Set(T(1, u64(order[i])), v.data(), u32(v.size())));
    }
    ASSERT_OK(tx.Commit().status());
  }
  auto check = [&](int gen_of_even, bool odd_deleted) {
    std::vector<std::pair<Pos, std::string>> all = All();
    usize want = odd_deleted ? kN / 2 : kN;
    ASSERT_EQ(all.size(), want);
    usize j = 0;
    for (int i = 0; i < kN; i++) {
      if (odd_deleted && i % 2) continue;
      EXPECT_EQ(all[j].first, T(1, u64(i)));
      EXPECT_EQ(all[j].second, value(i, i % 2 ? 0 : gen_of_even)) << i;
      j++;
    }
  };
  ASSERT_NO_FATAL_FAILURE(check(0, false));
  ASSERT_OK(t().Checkpoint());  // ForEachNode walks what the last roots block reaches
  std::vector<Visited> nodes;
  ASSERT_OK(CollectNodes(t(), &nodes));
  std::vector<Visited> leaves = LeavesOf(nodes, kBtreeTest);
  EXPECT_GE(leaves.size(), usize(kN));  // a 4 KiB node holds one such key
  for (const Visited& l : leaves) EXPECT_LE(l.keys.size(), 1u);
  EXPECT_GT(t().GetStats().splits, 0u);
  // Delete the odd ones: leaves empty out and merge.
  for (int i = 1; i < kN; i += 2) Del(T(1, u64(i)));
  ASSERT_NO_FATAL_FAILURE(check(0, true));
  ASSERT_OK(t().Checkpoint());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ASSERT_NO_FATAL_FAILURE(check(0, true));
  // Overwrite the even ones (old and new versions cannot share a 4 KiB node).
  for (int i = 0; i < kN; i += 2) ASSERT_NO_FATAL_FAILURE(Set(T(1, u64(i)), value(i, 1)));
  ASSERT_NO_FATAL_FAILURE(check(1, true));
  ASSERT_OK(t().Checkpoint());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ASSERT_NO_FATAL_FAILURE(check(1, true));
}

// A key of the largest size alone in its 4 KiB leaf gets a new value of the same
// size (old and new cannot share the node), in a transaction that also sets a key
// elsewhere. The commit must succeed; whatever it returns, it is all or nothing --
// in memory, after a power cut that keeps its journal entry (which must mount),
// and after a clean close.
TEST_F(BtreeEdgeTest, OverwriteMaxValueAloneInLeaf) {
  std::string a(kMaxValueBytes, 'a'), b(kMaxValueBytes, 'b');
  for (u64 i = 0; i < 3; i++) Set(T(1, i), a, CommitMode::kFlush);  // three leaves
  Transaction tx(&t());
  ASSERT_OK(tx.Set(T(0, 5), "first", 5));  // applied before the big key
  ASSERT_OK(tx.Set(T(1, 1), b.data(), u32(b.size())));
  Result<u64> r = tx.Commit(CommitMode::kFlush);
  EXPECT_OK(r.status());
  const std::string want = r.ok() ? "bbbb" : "aaaa";
  auto expect_all_or_nothing = [&](Btrees& trees, const char* when) {
    Vector<u8> v;
    Status st = trees.Get(T(1, 1), &v);
    ASSERT_TRUE(st.ok()) << when << ": " << Str(st);
    EXPECT_EQ(Val(v).substr(0, 4), want) << when;
    st = trees.Get(T(0, 5), &v);
    EXPECT_EQ(st.ok(), r.ok()) << when << ": the other key of the " << (r.ok() ? "committed" : "failed")
                               << " transaction is " << (st.ok() ? "present" : "absent");
  };
  ASSERT_NO_FATAL_FAILURE(expect_all_or_nothing(t(), "in memory"));
  // The btrees still take commits.
  Transaction tx2(&t());
  ASSERT_OK(tx2.Set(T(2, 0), "x", 1));
  EXPECT_OK(tx2.Commit(CommitMode::kFlush).status());
  // Whatever the journal holds must be replayable.
  EXPECT_OK(e_->journal().Flush());
  std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
  Store e2;
  if (OpenEngine(&e2, *cut, opts_).ok()) {  // (a failed open is reported inside)
    ASSERT_NO_FATAL_FAILURE(expect_all_or_nothing(e2.btrees(), "after a power cut"));
    EXPECT_OK(e2.Close());
  }
  // A clean close keeps the same (and reports a failure if the trees diverged).
  wd_.Watch(nullptr);
  Status closed = e_->Close();
  if (r.ok()) EXPECT_OK(closed);
  e_ = std::make_unique<Store>();
  ASSERT_OK(OpenEngine(e_.get(), *fs_, opts_));
  wd_.Watch(&e_->btrees());
  ASSERT_NO_FATAL_FAILURE(expect_all_or_nothing(t(), "after a clean close and open"));
}

TEST_F(BtreeEdgeTest, BadInput) {
  Transaction tx(&t());
  std::string big(kMaxValueBytes + 1, 'z');
  EXPECT_EQ(tx.Set(T(1, 1), big.data(), u32(big.size())), Status(Err::kTooBig));
  EXPECT_EQ(tx.size(), 0u);
  EXPECT_TRUE(tx.Set(Pos{kNrBtreeIds, 1, 1}, "a", 1).Is(ErrorClass::kInvalid));
  EXPECT_TRUE(tx.Set(Pos{0xff, 1, 1}, "a", 1).Is(ErrorClass::kInvalid));
  EXPECT_TRUE(tx.Delete(Pos{kNrBtreeIds, 1, 1}).Is(ErrorClass::kInvalid));
  EXPECT_EQ(tx.size(), 0u);
  ASSERT_OK(tx.Set(T(1, 1), big.data(), kMaxValueBytes));  // exactly the maximum is fine
  EXPECT_EQ(tx.size(), 1u);
  ASSERT_OK(tx.Commit().status());
  Vector<u8> v;
  ASSERT_OK(t().Get(T(1, 1), &v));
  EXPECT_EQ(v.size(), usize(kMaxValueBytes));
  // Iterator over a bad btree id finds nothing rather than crashing? It must at
  // least not return keys of another tree.
  Iterator it(&t(), kOther);
  ASSERT_OK(it.SeekToFirst());
  EXPECT_FALSE(it.Valid());
}

TEST_F(BtreeEdgeTest, TransactionLargerThanAJournalEntryIsTooBig) {
  Transaction tx(&t());
  std::string v(kMaxValueBytes, 'q');
  u32 queued = 0;
  Status st;
  for (u32 i = 0; i < 1000; i++) {  // 2 MiB: eight times the largest journal entry
    st = tx.Set(T(2, i), v.data(), u32(v.size()));
    if (!st.ok()) break;
    queued++;
  }
  if (st.ok()) {
    ADD_FAILURE() << "Set queued " << queued << " keys of 2 KiB, more than one journal entry holds, without kTooBig";
    // Then at least the commit must refuse it whole.
    Result<u64> r = tx.Commit(CommitMode::kFlush);
    EXPECT_EQ(r.status(), Status(Err::kTooBig)) << Str(r.status());
    EXPECT_TRUE(All().empty()) << "a refused commit was applied";
    return;
  }
  ASSERT_EQ(st, Status(Err::kTooBig)) << "after " << queued << " keys of 2 KiB";
  EXPECT_EQ(tx.size(), queued);  // the refused one was not queued
  EXPECT_GT(queued, 10u);
  ASSERT_OK(tx.Commit(CommitMode::kFlush).status());
  std::vector<std::pair<Pos, std::string>> all = All();
  ASSERT_EQ(all.size(), queued);
  EXPECT_EQ(all.back().first, T(2, queued - 1));
}

TEST_F(BtreeEdgeTest, ResetAndDestroyedTransactionsApplyNothing) {
  {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(1, 1), "a", 1));
    ASSERT_OK(tx.Delete(T(1, 2)));
    EXPECT_EQ(tx.size(), 2u);
    tx.Reset();
    EXPECT_EQ(tx.size(), 0u);
    ASSERT_OK(tx.Set(T(1, 3), "c", 1));
    ASSERT_OK(tx.Commit().status());
  }
  {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(1, 4), "d", 1));
  }  // destroyed uncommitted
  std::vector<std::pair<Pos, std::string>> all = All();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].first, T(1, 3));
  // A transaction is reusable after Commit.
  Transaction tx(&t());
  ASSERT_OK(tx.Set(T(1, 5), "e", 1));
  ASSERT_OK(tx.Commit().status());
  ASSERT_OK(tx.Set(T(1, 6), "f", 1));
  ASSERT_OK(tx.Commit().status());
  EXPECT_EQ(All().size(), 3u);
}

TEST_F(BtreeEdgeTest, ExtremePositionsAndTreeBoundaries) {
  // Keys at both ends of kBtreeTest and in the trees on either side of it.
  Set(Pos::Min(kBtreeTest), "min");
  Set(Pos::Max(kBtreeTest), "max");
  Set(T(7, 7), "mid");
  Set(Pos::Max(kBtreeReconcile), "prev tree");  // id 6
  Set(Pos::Min(kBtreeInodes), "tree 0");
  Vector<u8> v;
  ASSERT_OK(t().Get(Pos::Min(kBtreeTest), &v));
  EXPECT_EQ(Val(v), "min");
  ASSERT_OK(t().Get(Pos::Max(kBtreeTest), &v));
  EXPECT_EQ(Val(v), "max");
  Iterator it(&t(), kBtreeTest);
  ASSERT_OK(it.SeekToFirst());
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), Pos::Min(kBtreeTest));
  ASSERT_OK(it.Prev());
  EXPECT_FALSE(it.Valid()) << "Prev from Min left the tree: " << PosStr(it.pos());
  ASSERT_OK(it.SeekToLast());
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), Pos::Max(kBtreeTest));
  EXPECT_EQ(Val(it), "max");
  ASSERT_OK(it.Next());
  EXPECT_FALSE(it.Valid());
  ASSERT_OK(it.Seek(Pos::Max(kBtreeTest)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), Pos::Max(kBtreeTest));
  ASSERT_OK(it.SeekForPrev(Pos::Min(kBtreeTest)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), Pos::Min(kBtreeTest));
  ASSERT_OK(it.Seek(T(7, 8)));
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), Pos::Max(kBtreeTest));
  ASSERT_OK(it.Prev());
  ASSERT_TRUE(it.Valid());
  EXPECT_EQ(it.pos(), T(7, 7));
  Iterator prev_tree(&t(), kBtreeReconcile);
  ASSERT_OK(prev_tree.SeekToLast());
  ASSERT_TRUE(prev_tree.Valid());
  EXPECT_EQ(prev_tree.pos(), Pos::Max(kBtreeReconcile));
  ASSERT_OK(prev_tree.Next());
  EXPECT_FALSE(prev_tree.Valid()) << "Next crossed into another tree: " << PosStr(prev_tree.pos());
  EXPECT_EQ(All(kBtreeTest).size(), 3u);
  EXPECT_EQ(All(kBtreeReconcile).size(), 1u);
  EXPECT_EQ(All(kBtreeInodes).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_EQ(All(kBtreeTest).size(), 3u);
  ASSERT_OK(t().Get(Pos::Max(kBtreeTest), &v));
  EXPECT_EQ(Val(v), "max");
  Del(Pos::Min(kBtreeTest));
  Del(Pos::Max(kBtreeTest));
  EXPECT_EQ(All(kBtreeTest).size(), 1u);
}

// kFlush commits survive a power cut with no checkpoint (replayed from the
// journal); a commit that was never written does not; a replay is checkpointed at
// open so a second cut needs no replay of it.
TEST_F(BtreeEdgeTest, ReplayAfterPowerCut) {
  wd_.Watch(nullptr);
  ASSERT_OK(e_->Close());
  e_.reset();
  store::OpenOptions oo = EngineOptions(opts_);
  oo.journal.write_delay_ns = 60 * platform::kNsPerSec;  // no-flush entries stay in memory
  oo.journal.flush_delay_ns = 60 * platform::kNsPerSec;
  Store e;
  ASSERT_OK(OpenEngine(&e, *fs_, opts_, nullptr, &oo));
  {
    Transaction tx(&e.btrees());
    for (u64 i = 0; i < 100; i++) ASSERT_OK(tx.Set(T(1, i), &i, sizeof(i)));
    ASSERT_OK(tx.Commit(CommitMode::kFlush).status());
  }
  {
    Transaction tx(&e.btrees());
    ASSERT_OK(tx.Set(T(2, 0), "lost", 4));
    ASSERT_OK(tx.Commit(CommitMode::kNoFlush).status());
  }
  std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
  Store e2;
  store::OpenReport rep;
  ASSERT_OK(OpenEngine(&e2, *cut, opts_, &rep));
  EXPECT_FALSE(rep.was_clean);
  EXPECT_GE(rep.replayed_keys, 100u);
  Model got;
  ASSERT_NO_FATAL_FAILURE(ScanTree(e2.btrees(), kBtreeTest, &got));
  EXPECT_EQ(got.size(), 100u);
  EXPECT_EQ(got.count(MKey{kBtreeTest, 2, 0}), 0u) << "an entry never written came back";
  ASSERT_OK(e.Close());
  // Replay was checkpointed at open: a second cut finds the keys without it.
  std::unique_ptr<Fs> cut2 = cut->AfterPowerCut();
  Store e3;
  ASSERT_OK(OpenEngine(&e3, *cut2, opts_, &rep));
  Model got2;
  ASSERT_NO_FATAL_FAILURE(ScanTree(e3.btrees(), kBtreeTest, &got2));
  EXPECT_TRUE(got2 == got) << DescribeDiff(got, got2);
  ASSERT_OK(e3.Close());
  ASSERT_OK(e2.Close());
}

// The merge rule of alloc keys (docs/format/alloc.md, "Newest version
// wins"): two changes of one bucket may reach the tree in either order, and
// the record with the higher version stays -- whether the older one arrives
// second by a normal commit or a reclaim commit. A whiteout always applies,
// an implausible (hostile) current value never blocks its replacement, and
// other trees keep last-writer-wins. Without the rule, every older record
// arriving second would win.
std::string AllocRec(u64 version, u32 live, u8 state = u8(alloc::BucketState::kUser)) {
  alloc::AllocRecord r;
  memset(&r, 0, sizeof(r));
  r.gen = 3;
  r.oldest_gen = 3;
  r.state = state;
  r.live_sectors.set(live);
  r.version.set(version);
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

u64 RecVersion(Btrees& t, const Pos& p) {
  Vector<u8> v;
  EXPECT_OK(t.Get(p, &v));
  if (v.size() != sizeof(alloc::AllocRecord)) return ~u64(0);
  alloc::AllocRecord r;
  memcpy(&r, v.data(), sizeof(r));
  return r.version.get();
}

TEST_F(BtreeEdgeTest, AllocKeysKeepTheNewerVersion) {
  // The last bucket of member 0: the allocator takes it last (no node here).
  const Pos p{kBtreeAlloc, 0, e_->alloc().nbuckets(0) - 1};
  Set(p, AllocRec(5, 10));
  Set(p, AllocRec(3, 30));  // older, second
  EXPECT_EQ(RecVersion(t(), p), 5u) << "an older record arriving second replaced the newer";
  Set(p, AllocRec(7, 70));
  EXPECT_EQ(RecVersion(t(), p), 7u);
  Set(p, AllocRec(7, 71));  // the same change again: kept as it is
  {
    Vector<u8> v;
    ASSERT_OK(t().Get(p, &v));
    ASSERT_EQ(v.size(), sizeof(alloc::AllocRecord));
    alloc::AllocRecord r;
    memcpy(&r, v.data(), sizeof(r));
    EXPECT_EQ(r.version.get(), 7u);
    EXPECT_EQ(r.live_sectors.get(), 70u) << "an equal version replaced the record in the leaf";
  }
  {
    Transaction tx(&t());
    const std::string older = AllocRec(6, 60);
    ASSERT_OK(tx.Set(p, older.data(), u32(older.size())));
    tx.SetReclaim();
    ASSERT_OK(tx.Commit().status());
  }
  EXPECT_EQ(RecVersion(t(), p), 7u) << "a reclaim commit's older record replaced the newer";
  {
    // A reclaim commit takes alloc keys only (their order does not matter).
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(1, 1), "x", 1));
    tx.SetReclaim();
    EXPECT_EQ(tx.Commit().status(), Status(Err::kInvalidArgument));
  }
  Del(p);
  Set(p, AllocRec(1, 1));  // after a whiteout any version
  EXPECT_EQ(RecVersion(t(), p), 1u);
  Set(p, AllocRec(100, 1, 9));  // hostile: unknown state
  Set(p, AllocRec(2, 2));
  EXPECT_EQ(RecVersion(t(), p), 2u) << "a hostile record blocked its replacement";
  Set(p, AllocRec(alloc::kRecordVersionPlausible + 5, 1));  // hostile: a version no count reaches
  Set(p, AllocRec(4, 4));
  EXPECT_EQ(RecVersion(t(), p), 4u);
  // Other trees: the last write wins, whatever the bytes.
  Set(T(9, 9), AllocRec(5, 10));
  Set(T(9, 9), AllocRec(3, 30));
  EXPECT_EQ(RecVersion(t(), T(9, 9)), 3u);
}

// ... and across replay, which applies entries in journal order: an older
// record journaled after a newer one (the newer one checkpointed, or only in
// the journal) leaves the newer one after a power cut.
TEST_F(BtreeEdgeTest, AllocKeysKeepTheNewerVersionAcrossReplay) {
  const Pos p{kBtreeAlloc, 0, e_->alloc().nbuckets(0) - 1};
  const Pos q{kBtreeAlloc, 0, e_->alloc().nbuckets(0) - 2};
  Set(p, AllocRec(9, 90));
  ASSERT_OK(t().Checkpoint());  // p's newer record in the written leaf
  Set(p, AllocRec(8, 80));      // replayed over it
  Set(q, AllocRec(12, 120));    // both only in the journal, newer first
  Set(q, AllocRec(11, 110), CommitMode::kFlush);
  EXPECT_EQ(RecVersion(t(), p), 9u);
  EXPECT_EQ(RecVersion(t(), q), 12u);
  std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
  Store e2;
  store::OpenReport rep;
  ASSERT_OK(OpenEngine(&e2, *cut, opts_, &rep));
  EXPECT_FALSE(rep.was_clean);
  EXPECT_GE(rep.replayed_keys, 3u);
  EXPECT_EQ(RecVersion(e2.btrees(), p), 9u) << "replay put the older record back";
  EXPECT_EQ(RecVersion(e2.btrees(), q), 12u) << "replay in journal order kept the older record";
  EXPECT_EQ(e2.alloc().Get(0, p.offset).version, 9u);  // what the allocator loaded
  EXPECT_EQ(e2.alloc().Get(0, q.offset).live_sectors, 120u);
  ASSERT_OK(e2.Close());
}

// The commit hook (docs/design/copies.md, "Step 3b"): SetLater slots are
// queued with zeros and filled by prepare under commit_mu, before the
// journal commit, so what the journal holds and the tree applies are the
// hook's bytes; finish follows the apply with the entry's sequence and
// `journaled`. A prepare that fails journals and applies nothing, tells
// finish so, and leaves the trees working. A hook is refused on a reclaim
// commit, and SetLater outside the alloc tree.
TEST_F(BtreeEdgeTest, TheCommitHookFillsLaterValuesInsideTheCommit) {
  const Pos p{kBtreeAlloc, 0, e_->alloc().nbuckets(0) - 1};
  struct Ctx {
    std::string value;          // what prepare writes into slot 0
    Status fail;                // prepare's answer
    std::vector<std::string> calls;
    u64 finish_seq = 0;
    bool finish_journaled = false;
    static Status Prepare(void* c, Transaction* tx) {
      auto* x = static_cast<Ctx*>(c);
      x->calls.push_back("prepare");
      EXPECT_EQ(tx->later_slots(), 1u);
      const u8* v = tx->LaterValue(0);
      for (u32 i = 0; i < x->value.size(); i++) EXPECT_EQ(v[i], 0) << "a slot is zeros until the hook fills it";
      if (!x->fail.ok()) return x->fail;
      memcpy(tx->LaterValue(0), x->value.data(), x->value.size());
      return Status::Ok();
    }
    static void Finish(void* c, u64 seq, bool journaled) {
      auto* x = static_cast<Ctx*>(c);
      x->calls.push_back("finish");
      x->finish_seq = seq;
      x->finish_journaled = journaled;
    }
  } ctx;
  const CommitHook hook{Ctx::Prepare, Ctx::Finish, &ctx};
  ctx.value = AllocRec(5, 50);
  {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(1, 1), "a", 1));
    auto slot = tx.SetLater(p, u32(ctx.value.size()));
    ASSERT_OK(slot.status());
    EXPECT_EQ(slot.value(), 0u);
    tx.SetCommitHook(&hook);
    auto r = tx.Commit();
    ASSERT_OK(r.status());
    EXPECT_EQ(ctx.calls, (std::vector<std::string>{"prepare", "finish"}));
    EXPECT_TRUE(ctx.finish_journaled);
    EXPECT_EQ(ctx.finish_seq, r.value());
    EXPECT_NE(r.value(), 0u);
  }
  EXPECT_EQ(RecVersion(t(), p), 5u);  // the hook's bytes, in the tree
  // A failing prepare: nothing journaled or applied, finish told so, the
  // trees still take commits.
  ctx.calls.clear();
  ctx.value = AllocRec(6, 60);
  ctx.fail = Status(Err::kCorrupt);
  {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(1, 2), "b", 1));
    ASSERT_OK(tx.SetLater(p, u32(ctx.value.size())).status());
    tx.SetCommitHook(&hook);
    EXPECT_EQ(tx.Commit().status(), Status(Err::kCorrupt));
    EXPECT_EQ(ctx.calls, (std::vector<std::string>{"prepare", "finish"}));
    EXPECT_FALSE(ctx.finish_journaled);
    EXPECT_EQ(ctx.finish_seq, 0u);
  }
  Vector<u8> v;
  EXPECT_EQ(t().Get(T(1, 2), &v), Status(Err::kNotFound));
  EXPECT_EQ(RecVersion(t(), p), 5u);
  Set(T(1, 3), "c");  // not failed
  // After a power cut the journal gives back what the hook wrote.
  ctx.calls.clear();
  ctx.fail = Status::Ok();
  ctx.value = AllocRec(7, 70);
  {
    Transaction tx(&t());
    ASSERT_OK(tx.SetLater(p, u32(ctx.value.size())).status());
    tx.SetCommitHook(&hook);
    ASSERT_OK(tx.Commit(CommitMode::kFlush).status());
  }
  {
    std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
    Store e2;
    store::OpenReport rep;
    ASSERT_OK(OpenEngine(&e2, *cut, opts_, &rep));
    EXPECT_FALSE(rep.was_clean);
    EXPECT_EQ(RecVersion(e2.btrees(), p), 7u);
    EXPECT_EQ(e2.alloc().Get(0, p.offset).live_sectors, 70u);
    ASSERT_OK(e2.Close());
  }
  // Refused: a hook on a reclaim commit; SetLater outside the alloc tree or
  // of a bad length.
  {
    Transaction tx(&t());
    ASSERT_OK(tx.SetLater(p, 24).status());
    tx.SetCommitHook(&hook);
    tx.SetReclaim();
    EXPECT_EQ(tx.Commit().status(), Status(Err::kInvalidArgument));
    EXPECT_EQ(tx.SetLater(T(1, 1), 24).status(), Status(Err::kInvalidArgument));
    EXPECT_EQ(tx.SetLater(p, 0).status(), Status(Err::kInvalidArgument));
    EXPECT_EQ(tx.SetLater(p, Transaction::kMaxLaterBytes + 1).status(), Status(Err::kInvalidArgument));
  }
}

// SetLater slots with no hook to fill them: Commit refuses before anything
// happens (review 3b F8) -- before, the slot's zeros were journaled and
// applied as a record (free, gen 0, version 0), which for a journal
// bucket is a bad record the next read-write mount refuses.
TEST_F(BtreeEdgeTest, LaterSlotsWithoutAHookAreRefused) {
  const Pos p{kBtreeAlloc, 0, e_->alloc().nbuckets(0) - 1};
  Set(p, AllocRec(3, 30));
  const u64 commits = t().GetStats().commits;
  {
    Transaction tx(&t());
    ASSERT_OK(tx.Set(T(2, 1), "a", 1));
    ASSERT_OK(tx.SetLater(p, 24).status());
    EXPECT_EQ(tx.Commit().status(), Status(Err::kInvalidArgument));
    EXPECT_EQ(tx.size(), 0u);  // the queue is empty afterwards, as after any commit
  }
  EXPECT_EQ(t().GetStats().commits, commits);
  Vector<u8> v;
  EXPECT_EQ(t().Get(T(2, 1), &v), Status(Err::kNotFound));
  EXPECT_EQ(RecVersion(t(), p), 3u);  // the record as it was, not zeros
  Set(T(2, 2), "b");  // the trees still take commits
}

// The journal fills (a 1 MiB ring, several MiB of commits, nobody calls
// Checkpoint): its reclaim hook must get the trees checkpointed so that commits
// keep going; a power cut afterwards loses nothing that was flushed.
TEST(BtreeTreeTest, FullJournalIsReclaimedByCheckpoints) {
  Watchdog wd(CurrentTest(), 60);
  Fs fs(1, kDevSize);
  ASSERT_OK(fs.Format(16384, 256 * 1024, /*journal_buckets=*/4));
  Store e;
  ASSERT_OK(OpenEngine(&e, fs, Options{}));
  wd.Watch(&e.btrees());
  const u64 n = 100000;  // ~5 MiB of journal keys
  for (u64 i = 0; i < n;) {
    Transaction tx(&e.btrees());
    for (int j = 0; j < 256 && i < n; j++, i++) ASSERT_OK(tx.Set(T(1, i), &i, sizeof(i)));
    ASSERT_OK(tx.Commit(i == n ? CommitMode::kFlush : CommitMode::kNoFlush).status());
  }
  // The trees' writer checkpoints once half the ring is held and commits wait
  // at three quarters, so the ring need never fill (the reclaim hook is the
  // fallback): several checkpoints must have run.
  EXPECT_GE(e.btrees().GetStats().checkpoints, 2u);
  std::unique_ptr<Fs> cut = fs.AfterPowerCut();
  Store e2;
  ASSERT_OK(OpenEngine(&e2, *cut, Options{}));
  wd.Watch(&e2.btrees());
  Iterator it(&e2.btrees(), kBtreeTest);
  ASSERT_OK(it.SeekToFirst());
  u64 count = 0;
  for (; it.Valid(); count++) {
    ASSERT_EQ(it.pos(), T(1, count));
    ASSERT_OK(it.Next());
  }
  EXPECT_EQ(count, n);
  wd.Watch(nullptr);
  ASSERT_OK(e2.Close());
  ASSERT_OK(e.Close());
}

// Node slots and the trees' footprint: checkpoints that each rewrite a few
// leaves (and the root) of a tree of ~40 leaves, four node slots per bucket.
// Every rewritten node's old slot becomes a hole in a bucket that cold
// leaves keep; the exclusive phase's spare slots, taken ahead, used to be
// burnt in the bucket being filled. Both grew the btree's buckets to about
// one per leaf (the spill profile's SSD, at its data floor, then refused
// every create). Now holes are filled first (also those a mount finds) and
// spares are whole buckets given back: the buckets stay within two of the
// nodes' compact count.
TEST(BtreeTreeTest, CheckpointsRewritingFewNodesKeepTheFootprintCompact) {
  Watchdog wd(CurrentTest(), 120);
  Fs fs(1, kDevSize);
  ASSERT_OK(fs.Format(16384, 65536));  // 4 slots per bucket
  Options bo;
  bo.writer_thread = false;
  auto e = std::make_unique<Store>();
  ASSERT_OK(OpenEngine(e.get(), fs, bo));
  wd.Watch(&e->btrees());
  const u32 spb = 65536 / 16384;
  const std::string base(1000, 'v');
  const u64 nkeys = 600;
  std::map<u64, std::string> model;
  for (u64 i = 0; i < nkeys; i += 50) {
    Transaction tx(&e->btrees());
    for (u64 k = i; k < i + 50; k++) {
      ASSERT_OK(tx.Set(T(1, k), base.data(), u32(base.size())));
      model[k] = base;
    }
    ASSERT_OK(tx.Commit().status());
    ASSERT_OK(e->btrees().Checkpoint());  // (no writer thread: the journal is small)
  }
  u64 rng = 42;
  auto footprint = [&](const char* when, u64 round) {
    const Stats s = e->btrees().GetStats();
    const u64 buckets = e->alloc().Usage(0).by_state[uint8_t(alloc::BucketState::kBtree)];
    const u64 compact = (s.cached_nodes + spb - 1) / spb;
    EXPECT_LE(buckets, compact + 2) << when << ", round " << round << ": " << s.cached_nodes << " nodes in "
                                    << buckets << " btree buckets";
    return buckets <= compact + 2;
  };
  ASSERT_GE(e->btrees().GetStats().cached_nodes, 30u);
  auto rounds = [&](const char* when, int n) {
    for (int r = 0; r < n; r++) {
      Transaction tx(&e->btrees());
      for (int j = 0; j < 2; j++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const u64 k = (rng >> 33) % nkeys;
        std::string v = base;
        v[0] = char('a' + r % 26);
        ASSERT_OK(tx.Set(T(1, k), v.data(), u32(v.size())));
        model[k] = v;
      }
      ASSERT_OK(tx.Commit().status());
      ASSERT_OK(e->btrees().Checkpoint());
      if (!footprint(when, u64(r))) return;
    }
  };
  ASSERT_NO_FATAL_FAILURE(rounds("first mount", 300));
  EXPECT_GT(e->btrees().GetStats().hole_slots, 100u);
  // A remount finds the holes from the nodes' offsets.
  wd.Watch(nullptr);
  ASSERT_OK(e->Close());
  e = std::make_unique<Store>();
  ASSERT_OK(OpenEngine(e.get(), fs, bo));
  wd.Watch(&e->btrees());
  {
    Model m;  // (reads every leaf: the footprint check counts cached nodes)
    ASSERT_NO_FATAL_FAILURE(ScanTree(e->btrees(), kBtreeTest, &m));
    ASSERT_EQ(m.size(), model.size());
  }
  ASSERT_NO_FATAL_FAILURE(rounds("after a remount", 200));
  EXPECT_GT(e->btrees().GetStats().hole_slots, 50u);
  // And every key reads back, after a power cut too.
  std::unique_ptr<Fs> cut = fs.AfterPowerCut();
  Store e2;
  ASSERT_OK(OpenEngine(&e2, *cut, bo));
  for (Btrees* t : {&e->btrees(), &e2.btrees()}) {
    Vector<u8> v;
    for (const auto& [k, want] : model) {
      ASSERT_TRUE(t->Get(T(1, k), &v).ok()) << k;
      ASSERT_EQ(Val(v), want) << k;
    }
  }
  ASSERT_OK(e2.Close());
  wd.Watch(nullptr);
  ASSERT_OK(e->Close());
}

// Checkpoints racing commits: a commit can join the open journal entry after a
// checkpoint has decided which entries its roots block covers. That entry must
// not be claimed (replay would skip the commit while its leaf was imaged
// without it). Each round: a committer runs while checkpoints run, stops; a
// flush makes every commit durable; a power cut then must lose nothing.
TEST(BtreeTreeTest, CheckpointsRacingCommitsLoseNothing) {
  Watchdog wd(CurrentTest(), 120);
  Fs fs(1, kDevSize);
  ASSERT_OK(fs.Format(16384));
  Options bo;
  bo.writer_thread = false;  // checkpoints only from the racing thread below
  store::OpenOptions oo = EngineOptions(bo);
  oo.journal.write_delay_ns = 60 * platform::kNsPerSec;  // entries stay open until a flush
  for (int round = 0; round < 6; round++) {
    Store e;
    ASSERT_OK(OpenEngine(&e, fs, bo, nullptr, &oo));
    wd.Watch(&e.btrees());
    std::atomic<bool> stop{false};
    std::atomic<u64> committed{0};
    std::atomic<int> errors{0};
    const u64 base = u64(round) << 32;
    std::vector<u64> seqs(400000);  // journal entry of each commit (diagnostics)
    std::atomic<bool> writer_done{false};
    std::thread writer([&] {
      struct Done {
        std::atomic<bool>& d;
        ~Done() { d = true; }
      } done{writer_done};
      for (u64 i = 0; !stop.load() && i < 400000; i++) {
        Transaction tx(&e.btrees());
        u64 v = base + i;
        if (!tx.Set(T(1, base + i), &v, sizeof(v)).ok()) {
          errors++;
          return;
        }
        auto r = tx.Commit();
        if (!r.ok()) {
          errors++;
          return;
        }
        seqs[i] = r.value();
        committed.store(i + 1);
      }
    });
    // A few checkpoints while the writer runs; the writer stops right after the
    // last one, so nothing checkpoints what that one missed.
    while (committed.load() < 2000) std::this_thread::yield();
    for (int c = 0; c < 3; c++) ASSERT_OK(e.btrees().Checkpoint());
    stop = true;
    // (If this thread is descheduled long enough, the writer fills the ring
    // before it sees `stop` and waits for room that only a checkpoint makes:
    // the btree writer thread is off. Another checkpoint then, while it
    // waits -- it covers more, which the checks below do not mind.)
    for (int waited = 0; !writer_done.load(); waited++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (waited % 20 == 19) ASSERT_OK(e.btrees().Checkpoint());
    }
    writer.join();
    ASSERT_EQ(errors.load(), 0);
    {
      Transaction tx(&e.btrees());
      u64 v = 1;
      ASSERT_OK(tx.Set(T(2, round), &v, sizeof(v)));
      ASSERT_OK(tx.Commit(CommitMode::kFlush).status());  // every commit above is durable
    }
    const u64 n = committed.load();
    std::unique_ptr<Fs> cut = fs.AfterPowerCut();
    const Roots cut_roots = e.btrees().roots();  // the last roots block written (with FUA)
    Store e2;
    store::OpenReport rep;
    ASSERT_OK(OpenEngine(&e2, *cut, bo, &rep, &oo));
    wd.Watch(&e2.btrees());
    auto why = [&](u64 lost) {
      std::ostringstream o;
      o << "round " << round << ": commit " << lost << " of " << n << " (journal entry " << seqs[lost]
        << ") lost; roots cover entries <= " << cut_roots.journal_seq << "; replay: " << rep.replay.entries.size()
        << " entries from " << (rep.replay.entries.empty() ? 0 : rep.replay.entries[0].seq) << ", next_seq "
        << rep.replay.next_seq << ", gap_at " << rep.replay.gap_at << ", discarded " << rep.replay.discarded_entries
        << ", replayed keys " << rep.replayed_keys;
      return o.str();
    };
    Iterator it(&e2.btrees(), kBtreeTest);
    ASSERT_OK(it.Seek(T(1, base)));
    u64 count = 0;
    for (; it.Valid() && it.pos() < T(1, base + n); count++) {
      ASSERT_EQ(it.pos(), T(1, base + count)) << why(count);
      ASSERT_OK(it.Next());
    }
    EXPECT_EQ(count, n) << (count < n ? why(count) : std::string("round ") + std::to_string(round));
    wd.Watch(nullptr);
    ASSERT_OK(e2.Close());
    ASSERT_OK(e.Close());
  }
}

// A leaf read many times without an update is merged into one set
// (TreeOps::ReadMostly) -- by the writer thread when there is one, else by the
// lookup itself: same answers, iterators and updates unaffected, nothing
// written, and an update restarts the count.
void ReadMostlyLeavesAreMerged(bool writer_thread) {
  Watchdog wd(CurrentTest(), 60);
  Fs fs(1, kDevSize);
  ASSERT_OK(fs.Format(65536));
  Options bo;
  bo.writer_thread = writer_thread;
  Store e;
  ASSERT_OK(OpenEngine(&e, fs, bo));
  wd.Watch(&e.btrees());
  Btrees& t = e.btrees();
  // Random order: the leaf collects several sets.
  std::mt19937_64 rng(9);
  std::vector<u64> keys;
  for (u64 i = 0; i < 600; i++) keys.push_back(i * 7);
  std::shuffle(keys.begin(), keys.end(), rng);
  for (u64 k : keys) {
    Transaction tx(&t);
    ASSERT_OK(tx.Set(T(1, k), &k, sizeof(k)));
    ASSERT_OK(tx.Commit().status());
  }
  ASSERT_OK(t.Checkpoint());
  const Stats before = t.GetStats();
  EXPECT_EQ(before.read_merges, 0u);
  for (int round = 0; round < 100; round++) {
    for (u64 k = 0; k < 600; k += 37) {
      u64 v = 0;
      auto r = t.Get(T(1, k * 7), &v, sizeof(v));
      ASSERT_OK(r.status());
      ASSERT_EQ(v, k * 7);
      ASSERT_EQ(t.Get(T(1, k * 7 + 1), &v, sizeof(v)).status().code(), Err::kNotFound);
    }
  }
  Stats after = t.GetStats();
  for (int i = 0; i < 1000 && writer_thread && after.read_merges == 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the writer merges it
    after = t.GetStats();
  }
  EXPECT_GE(after.read_merges, 1u) << "a read-only leaf with several sets was never merged";
  EXPECT_EQ(after.dirty_nodes, 0u) << "merging a leaf for reads must not dirty it";
  EXPECT_EQ(after.node_writes, before.node_writes);
  Model m;
  ASSERT_NO_FATAL_FAILURE(ScanTree(t, kBtreeTest, &m));
  EXPECT_EQ(m.size(), 600u);
  // Updates still land, and the merged leaf keeps answering.
  {
    Transaction tx(&t);
    u64 v = 12345;
    ASSERT_OK(tx.Set(T(1, 7), &v, sizeof(v)));
    ASSERT_OK(tx.Delete(T(1, 14)));
    ASSERT_OK(tx.Commit().status());
  }
  u64 v = 0;
  ASSERT_OK(t.Get(T(1, 7), &v, sizeof(v)).status());
  EXPECT_EQ(v, 12345u);
  EXPECT_EQ(t.Get(T(1, 14), &v, sizeof(v)).status().code(), Err::kNotFound);
  wd.Watch(nullptr);
  ASSERT_OK(e.Close());
}

TEST(BtreeTreeTest, ReadMostlyLeavesAreMergedByLookups) { ReadMostlyLeavesAreMerged(false); }
TEST(BtreeTreeTest, ReadMostlyLeavesAreMergedByTheWriter) { ReadMostlyLeavesAreMerged(true); }

// Mount replays more updates than the node cache holds as dirty nodes (no
// checkpoint runs during replay): it must still finish and keep everything.
TEST_F(BtreeEdgeTest, ReplayLargerThanTheCache) {
  // ~300 KiB of keys in ~100 4 KiB leaves, checkpointed; then an update in every
  // leaf, journaled only; then a power cut.
  for (u64 i = 0; i < 3000;) {
    Transaction tx(&t());
    for (int j = 0; j < 100; j++, i++) {
      std::string v(80, char('a' + i % 26));
      ASSERT_OK(tx.Set(T(1, i), v.data(), u32(v.size())));
    }
    ASSERT_OK(tx.Commit(CommitMode::kFlush).status());
  }
  ASSERT_OK(t().Checkpoint());
  for (u64 i = 0; i < 3000; i += 10) Set(T(1, i), "new", CommitMode::kFlush);
  std::unique_ptr<Fs> cut = fs_->AfterPowerCut();
  Options small = opts_;
  small.cache_bytes = 16 * 4096;
  Store e2;
  store::OpenReport rep;
  ASSERT_OK(OpenEngine(&e2, *cut, small, &rep));
  EXPECT_GE(rep.replayed_keys, 300u);
  wd_.Watch(&e2.btrees());
  Model got;
  ASSERT_NO_FATAL_FAILURE(ScanTree(e2.btrees(), kBtreeTest, &got));
  EXPECT_EQ(got.size(), 3000u);
  for (u64 i = 0; i < 3000; i++) {
    EXPECT_EQ((got[MKey{kBtreeTest, 1, i}]), i % 10 == 0 ? std::string("new") : std::string(80, char('a' + i % 26)))
        << i;
  }
  wd_.Watch(&e_->btrees());
  ASSERT_OK(e2.Close());
}

// ---------------------------------------------------------------------------
// 5. A large tree: 1M sequential keys with 8-byte values in 256 KiB nodes.

u64 LargeValue(u64 i) { return i * 0x9e3779b97f4a7c15ull ^ 0x1234; }
Pos LargePos(u64 i) { return T(i >> 16, i & 0xffff); }

TEST(BtreeTreeTest, MillionSequentialKeys) {
  const u64 n = kSanitized ? 100000 : 1000000;
  Watchdog wd(CurrentTest(), 120);
  Fs fs(1, 256ull << 20, /*vcache=*/false);
  // A 64 MiB journal holds every commit: this test is about the tree (a full
  // journal is FullJournalIsReclaimedByCheckpoints).
  ASSERT_OK(fs.Format(kDefaultNodeSize, 1 << 20, /*journal_buckets=*/64));
  Options o;  // defaults: 256 MiB cache, writer thread
  Store e;
  ASSERT_OK(OpenEngine(&e, fs, o));
  Btrees& t = e.btrees();
  wd.Watch(&t);
  ASSERT_EQ(t.node_size(), kDefaultNodeSize);
  u64 t0 = platform::NowNs();
  for (u64 i = 0; i < n;) {
    Transaction tx(&t);
    for (u32 j = 0; j < 512 && i < n; j++, i++) {
      u64 v = LargeValue(i);
      ASSERT_OK(tx.Set(LargePos(i), &v, sizeof(v)));
    }
    ASSERT_OK(tx.Commit().status());
  }
  u64 t1 = platform::NowNs();
  Iterator it(&t, kBtreeTest);
  ASSERT_OK(it.SeekToFirst());
  u64 count = 0;
  for (; it.Valid(); count++) {
    ASSERT_EQ(it.pos(), LargePos(count));
    u64 v;
    ASSERT_EQ(it.val_bytes(), 8u);
    memcpy(&v, it.value(), 8);
    ASSERT_EQ(v, LargeValue(count));
    ASSERT_OK(it.Next());
  }
  EXPECT_EQ(count, n);
  u64 t2 = platform::NowNs();
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; i++) {
    u64 k = rng() % n;
    u64 v = 0;
    Result<u32> r = t.Get(LargePos(k), &v, sizeof(v));
    ASSERT_OK(r.status());
    ASSERT_EQ(*r, 8u);
    ASSERT_EQ(v, LargeValue(k));
  }
  u64 beyond = 0;
  EXPECT_EQ(t.Get(LargePos(n), &beyond, 8).status(), Status(Err::kNotFound));
  u64 t3 = platform::NowNs();
  Stats s = t.GetStats();
  EXPECT_GE(s.depth[kBtreeTest], 2u);
  printf("[ large ] %llu keys: insert %.2f s, scan %.2f s, 20k gets %.2f s; depth %llu, splits %llu, "
         "checkpoints %llu, cached %llu nodes\n",
         (unsigned long long)n, double(t1 - t0) / 1e9, double(t2 - t1) / 1e9, double(t3 - t2) / 1e9,
         (unsigned long long)s.depth[kBtreeTest], (unsigned long long)s.splits,
         (unsigned long long)s.checkpoints, (unsigned long long)s.cached_nodes);
  wd.Watch(nullptr);
  ASSERT_OK(e.Close());

  Store e2;
  store::OpenReport rep;
  ASSERT_OK(OpenEngine(&e2, fs, o, &rep));
  EXPECT_TRUE(rep.was_clean);
  for (int i = 0; i < 2000; i++) {
    u64 k = rng() % n;
    u64 v = 0;
    Result<u32> r = e2.btrees().Get(LargePos(k), &v, sizeof(v));
    ASSERT_OK(r.status());
    ASSERT_EQ(v, LargeValue(k));
  }
  Iterator last(&e2.btrees(), kBtreeTest);
  ASSERT_OK(last.SeekToLast());
  ASSERT_TRUE(last.Valid());
  EXPECT_EQ(last.pos(), LargePos(n - 1));
  ASSERT_OK(e2.Close());
}

}  // namespace
}  // namespace tfs::btree
