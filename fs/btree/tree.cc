// The btrees: cache, descent, updates, structure changes, checkpoints, mount
// (see tree.h for the model and the lock order, docs/design/btree.md for why).
#include "btree/tree.h"

#include "dev/io_queue.h"
#include "sb/format.h"
#include "util/list.h"
#include "util/sort.h"

namespace tfs::btree {

// ---------------------------------------------------------------------------
// Cached nodes.

// What a lookup touches comes first -- the lock, the clock bit, the read count,
// then the node with its sets inline -- so that these few lines can be
// prefetched together as soon as the parent yields the pointer (Descend).
struct CachedNode {
  RwLock lock;                    // leaves: contents (interior nodes: the tree lock)
  Atomic<u8> accessed{0};         // clock bit for eviction
  Atomic<u8> dead{0};             // replaced by a structure change
  Atomic<u8> merge_queued{0};     // on Impl::merge_queue
  Atomic<u32> reads{0};           // lookups since the last update (approximate; see ReadMostly)
  Node node;
  NodePtrFormat ptr{};            // where the node is on disk (kNoMember: never written)
  CachedNode* parent = nullptr;   // null for the root
  Vector<CachedNode*> children;   // interior: the cached child of each key, or null
  Atomic<u32> refs{1};            // the tree's own reference + iterators + checkpoints
  Atomic<u64> version{0};         // bumped by every change (iterators re-read)
  // Changed since the last image. Set and cleared under the leaf lock or the
  // tree lock exclusive; the checkpoint's collection passes read it under the
  // tree lock shared, racing a committer, and check again under the leaf lock.
  Atomic<u8> dirty{0};
  u64 compacted_version = ~u64(0);  // version at which a merge check compacted it
  ListNode lru;                   // on Impl::lru while in the tree (cache_mu)
  u8 tree_id = 0;                 // its tree, set before it joins the LRU (cache_mu)
  u8 tree_level = 0;              // its level, set with tree_id (interior_nodes)
  u32 charged = 0;                // bytes counted in the cache
};

namespace {

constexpr u32 kIterBatchMin = 32;
// The bytes of a CachedNode a lookup reads: through the node's first two sets.
constexpr uptr kHotBytes = 256;
// Lookups of a leaf with several sets, without an update in between, after which
// the leaf is merged into one set (TreeOps::ReadMostly).
constexpr u32 kReadsBeforeMerge = 64;
constexpr u32 kIterBatchMax = 1024;
constexpr u32 kPtrKeySpace = KeySpace(sizeof(NodePtrFormat));

u64 SplitMix(u64* state) {
  u64 z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool IsMin(const Pos& p) { return p.inode == 0 && p.offset == 0; }
bool IsMax(const Pos& p) { return p.inode == ~u64(0) && p.offset == ~u64(0); }
Pos Succ(Pos p) {
  if (++p.offset == 0) p.inode++;
  return p;
}
Pos Pred(Pos p) {
  if (p.offset-- == 0) p.inode--;
  return p;
}

Pos PtrMin(const NodePtrFormat& p) { return Pos{p.btree_id, p.min_inode.get(), p.min_offset.get()}; }

NodePtrFormat ReadPtr(KeyRef k) {
  NodePtrFormat p;
  MemCopy(&p, k.value(), sizeof(p));
  return p;
}

NodePtrFormat EmptyPtr(u8 id) {
  NodePtrFormat p;
  MemSet(&p, 0, sizeof(p));
  p.member = kNoMember;
  p.btree_id = id;
  return p;
}

bool StatusIsCorrupt(const Status& st) { return st.error_class() == ErrorClass::kCorrupt; }
// What Options::drop_bad_nodes drops: damage, not a node of a newer format.
bool Droppable(const Status& st) { return StatusIsCorrupt(st) && st.code() != Err::kBadVersion; }

// Adds n to a counter that only one thread at a time writes (see Impl).
void BumpSerial(Atomic<u64>& c, u64 n = 1) { c.Store(c.Load(MemOrder::kRelaxed) + n, MemOrder::kRelaxed); }

}  // namespace

struct Btrees::Tree {
  u8 id = 0;
  RwLock lock;
  CachedNode* root = nullptr;
  Vector<NodePtrFormat> dead_slots;  // slots of replaced nodes (tree lock exclusive)
};

struct Btrees::Impl {
  dev::DeviceSet* devs = nullptr;
  alloc::Allocator* alloc = nullptr;
  journal::Journal* journal = nullptr;
  sb::Superblock sb{};
  Options opt;
  u32 node_size = 0;
  u32 slots_per_bucket = 0;
  dev::DevMask capable = 0;  // members that may hold btree nodes
  dev::DevMask target = 0;   // where new nodes go first
  Tree trees[kNrBtreeIds];

  // Transactions.
  Mutex commit_mu;      // one commit + apply at a time
  Mutex state_mu;       // the three below (never held while taking commit_mu)
  u64 applied_seq = 0;  // newest journal entry applied
  bool committing = false;  // a commit is between its journal commit and its apply
  journal::Pin pin;     // oldest applied entry not yet in a checkpoint
  Status failed;        // sticky: memory no longer matches the journal

  // Cache.
  platform::Shrinker shrinker;  // registered while open (memory pressure)
  Mutex cache_mu;
  IntrusiveList<CachedNode, &CachedNode::lru> lru;
  Atomic<u64> cached_bytes{0};
  Atomic<u64> cached_nodes{0};
  Atomic<u64> dirty_nodes{0};
  // What PublishNeed counts: cached interior nodes, nodes never written (no
  // slot yet), and the bound a running checkpoint started from (0 when none
  // runs).
  Atomic<u64> interior_nodes{0};
  Atomic<u64> unwritten_nodes{0};
  Atomic<u64> ckpt_hold{0};
  Atomic<u64> ckpt_taken{0};  // slots the running checkpoint has taken (AllocSlot)
  // PublishNeed: the need is computed and stored under this (a leaf lock), so
  // the last store is never an older, lower value.
  Mutex need_mu;
  // Some node may not be cached: set for good once an interior node is read from
  // disk (its children are not) or a node is evicted. Until then every node is
  // in memory and commits skip their prefetch descent.
  Atomic<u8> partial{0};

  // Node slots in btree buckets.
  Mutex slot_mu;
  Vector<u16> live[dev::kMaxDevices];  // live node slots per bucket
  bool open_valid = false;
  alloc::BucketRef open_bucket;
  u32 open_next = 0;
  // Empty buckets a running checkpoint took ahead (ReserveBucket: for its
  // exclusive phase, or one when phase 1 ran out of slots): slots are taken
  // from them only as nodes are imaged, and
  // what is left goes back whole at the checkpoint's end -- never a slot
  // burnt in a bucket that stays.
  Vector<alloc::BucketRef> reserved;
  // Free slots in btree buckets that still hold live nodes (a node rewritten
  // elsewhere, its slot released after the roots block that stopped pointing
  // at it): taken before any other, so that the trees' footprint follows
  // their size instead of growing with every bucket a cold node pins. The
  // holes of a freed bucket are purged after the frees (holes_stale).
  struct Hole {
    u8 member;
    u8 gen;  // the bucket's, checked again when taken
    u64 offset;
  };
  Vector<Hole> holes;
  bool holes_stale = false;  // a bucket was freed since the last purge
  // Slots the next node images can take without a new bucket: the holes,
  // the rest of the open bucket and the reserved buckets; and of them, the
  // reserved buckets' (PublishNeed declares them as held).
  Atomic<u64> avail_slots{0};
  Atomic<u64> reserved_slots{0};
  Mutex seq_mu;  // rng (NewSeq: committers creating nodes, never behind slot_mu's allocations)
  u64 rng = 0;

  // Checkpoints.
  Mutex ckpt_mu;  // one checkpoint at a time
  bool opened = false;  // Open() finished: Close() checkpoints

  // Writer thread.
  Mutex wmu;
  CondVar wcv;       // wakes the writer
  CondVar done_cv;   // a checkpoint finished
  bool wake = false;
  bool stop = false;
  bool writer_running = false;
  u64 ckpt_done = 0;
  platform::Thread writer;
  // Read-mostly leaves for the writer to merge into one set (ReadMostly), each
  // holding a reference.
  Vector<CachedNode*> merge_queue;

  // Stats (relaxed counters: btree/tree.h's table).
  struct Live {
    TFS_COUNTER_ATOMICS(TFS_BTREE_COUNTERS)
  } ctr;
  // cache_hits is their sum. Counters of the apply path (this one and, in
  // ctr, inserts, deletes, commits, compactions) have serialized writers
  // (commit_mu, or the single-threaded replay), so they are bumped with a
  // load and a store (BumpSerial), not a locked read-modify-write (each of
  // those costs as much as a cache miss).
  Atomic<u64> c_hits{0};
  Atomic<u64> c_apply_hits{0};
  // Options::drop_bad_nodes (written by Open only, before anything reads them).
  Vector<LostNode> lost;
  u64 s_dropped = 0, s_scanned = 0, s_copies = 0, s_recovered = 0;
};

// ---------------------------------------------------------------------------
// Roots blocks.

namespace {

bool HoldsBtree(const sb::Superblock& sb, u32 m) { return (sb.members[m].data_allowed & sb::kDataBtree) != 0; }

Status CheckPtrShape(const NodePtrFormat& p, u8 id, u32 nr_members, Diag* diag, const char* what) {
  if (p.btree_id != id || p.level > kMaxLevel || (p.member != kNoMember && p.member >= nr_members))
    return DiagError(diag, Err::kCorrupt, "%s: bad node pointer (btree %u, level %u, member %u)", what,
                     unsigned(p.btree_id), unsigned(p.level), unsigned(p.member));
  return Status::Ok();
}

}  // namespace

Status ReadRoots(dev::DeviceSet& devs, const sb::Superblock& sb, Roots* out, Diag* diag) {
  u8* buf = static_cast<u8*>(platform::Alloc(2 * kRootsSlotSize, 4096, false));
  if (buf == nullptr) return Err::kNoMemory;
  bool found = false;
  u32 bad = 0;
  Status io;  // the first read that failed
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (!HoldsBtree(sb, m)) continue;
    Status st = dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kRead, kRootsOffset, buf, 2 * kRootsSlotSize, 0,
                                 IoOrigin::kBtree);
    if (!st.ok()) {
      bad++;
      if (io.ok()) io = st;
      continue;
    }
    for (u32 slot = 0; slot < 2; slot++) {
      const auto* r = reinterpret_cast<const RootsFormat*>(buf + slot * kRootsSlotSize);
      if (r->magic.get() != kRootsMagic || r->version.get() != kNodeVersion || r->nroots.get() != kNrBtreeIds ||
          MemCompare(r->fs_uuid, sb.fs_uuid, 16) != 0 ||
          r->csum.get() != platform::Crc32cSkippingField(r, kRootsSlotSize, __builtin_offsetof(RootsFormat, csum))) {
        bad++;
        continue;
      }
      bool shape_ok = true;
      for (u32 t = 0; t < kNrBtreeIds; t++) {
        const NodePtrFormat& p = r->roots[t];
        if (!CheckPtrShape(p, u8(t), sb.nr_members, nullptr, "roots").ok() ||
            (p.member != kNoMember && !IsMin(PtrMin(p))))
          shape_ok = false;
      }
      if (!shape_ok) {
        bad++;
        continue;
      }
      if (found && r->gen.get() <= out->gen) continue;
      found = true;
      out->gen = r->gen.get();
      out->journal_seq = r->journal_seq.get();
      out->node_seq_hi = r->node_seq_hi.get();
      MemCopy(out->roots, r->roots, sizeof(out->roots));
    }
  }
  platform::Free(buf);
  // Not read is not damaged: fsck must not rebuild trees it could not read.
  if (!found && !io.ok())
    return DiagError(diag, io, "btree roots: reading the roots block failed: %s", io.Message());
  if (!found)
    return DiagError(diag, Err::kCorrupt, "btree roots: no valid roots block on any member (%u copies rejected)",
                     bad);
  out->rejected = bad;
  if (bad > 0)
    platform::Log(platform::LogLevel::kWarn, "btree roots: %u roots block cop%s rejected; using gen %llu", bad,
                  bad == 1 ? "y" : "ies", (unsigned long long)out->gen);
  return Status::Ok();
}

namespace {

Status WriteRootsBlock(dev::DeviceSet& devs, const sb::Superblock& sb, const Roots& roots) {
  auto* r = static_cast<RootsFormat*>(platform::Alloc(kRootsSlotSize, 4096, true));
  if (r == nullptr) return Err::kNoMemory;
  r->magic.set(kRootsMagic);
  r->version.set(kNodeVersion);
  r->nroots.set(kNrBtreeIds);
  MemCopy(r->fs_uuid, sb.fs_uuid, 16);
  r->gen.set(roots.gen);
  r->journal_seq.set(roots.journal_seq);
  r->node_seq_hi.set(roots.node_seq_hi);
  MemCopy(r->roots, roots.roots, sizeof(r->roots));
  r->csum.set(platform::Crc32cSkippingField(r, kRootsSlotSize, __builtin_offsetof(RootsFormat, csum)));
  const u64 off = kRootsOffset + (roots.gen & 1) * kRootsSlotSize;
  Status first;
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (!HoldsBtree(sb, m)) continue;
    Status st = dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kWrite, off, r, kRootsSlotSize, IoRequest::kFua,
                                 IoOrigin::kBtree);
    if (!st.ok() && first.ok()) first = st;
  }
  platform::Free(r);
  return first;
}

}  // namespace

Status FormatRoots(dev::DeviceSet& devs, const sb::Superblock& sb) {
  Roots roots;
  roots.gen = 1;
  for (u32 t = 0; t < kNrBtreeIds; t++) roots.roots[t] = EmptyPtr(u8(t));
  // Both slots, so that no stale block from an earlier filesystem survives.
  TFS_TRY(WriteRootsBlock(devs, sb, roots));
  roots.gen = kFormatRootsGen;
  return WriteRootsBlock(devs, sb, roots);
}

// All the machinery lives in this class so that it can reach Btrees' privates.
class TreeOps {
 public:
  using Tree = Btrees::Tree;
  using Impl = Btrees::Impl;

  // --- cache bookkeeping ---------------------------------------------------

  // Nodes of 64 KiB and more get a whole page for their CachedNode (~1.9 KiB):
  // a lookup's first miss in a leaf is its CachedNode, and a page-sized
  // allocation is one the userspace platform serves from huge pages (its arena
  // starts at 4 KiB), which spares that miss a TLB walk; next to the node's
  // buffer the extra 2 KiB is under 1%. Freed by platform::Delete as usual.
  static CachedNode* NewNode(Impl* im) {
    static_assert(alignof(CachedNode) <= 64, "allocated 64-byte aligned");
    const usize bytes = im->node_size >= 64 * 1024 ? Max<usize>(sizeof(CachedNode), 4096) : sizeof(CachedNode);
    void* mem = platform::Alloc(bytes, 64);
    return mem == nullptr ? nullptr : new (mem) CachedNode();
  }

  static void Charge(Impl* im, CachedNode* n) {
    n->charged = n->node.node_size();
    // Eviction walks the LRU of every tree holding one tree's lock: it must not
    // read the node's contents, which another tree's writer may be rebuilding.
    n->tree_id = n->node.info().btree_id;
    n->tree_level = n->node.info().level;
    im->cached_bytes.FetchAdd(n->charged, MemOrder::kRelaxed);
    im->cached_nodes.FetchAdd(1, MemOrder::kRelaxed);
    if (n->tree_level > 0) {
      im->interior_nodes.FetchAdd(1, MemOrder::kRelaxed);
      PublishNeed(im);
    }
    MutexLock l(im->cache_mu);
    im->lru.PushBack(n);
  }

  static void Unref(CachedNode* n) {
    if (n->refs.FetchSub(1, MemOrder::kAcqRel) == 1) platform::Delete(n);
  }
  static void Ref(CachedNode* n) { n->refs.FetchAdd(1, MemOrder::kRelaxed); }

  // The node slots a checkpoint would take now (docs/design/space.md). Phase
  // 1 takes one per dirty node it images; phase 2 a spare per node of the
  // exclusive set -- cached interior nodes and nodes never written (phase 1
  // may have taken one for them already) -- plus 1 + 2 * kMaxLevel for
  // structure that changes before it locks.
  static u64 CheckpointSlots(Impl* im) {
    return im->dirty_nodes.Load(MemOrder::kRelaxed) + im->interior_nodes.Load(MemOrder::kRelaxed) +
           im->unwritten_nodes.Load(MemOrder::kRelaxed) + 1 + 2 * kMaxLevel;
  }
  // Tells the allocator how many free buckets the next checkpoint may take on
  // the metadata target (alloc.h, SetMetadataNeed): CheckpointSlots, or, if
  // larger, what is left of the bound a running checkpoint started from (it
  // clears dirty flags before it has taken its slots: the bound less the
  // slots it took), less the slots at hand (holes, the open bucket's rest,
  // the buckets it reserved, which the allocator also gets as `held`: they
  // are back when it ends, and the growth room counts them), in
  // whole buckets, plus two: the tree growing while the checkpoint runs (it
  // then reserves more) and a spare. Called whenever a count changes; user
  // data leaves that much free.
  static void PublishNeed(Impl* im) {
    if (im->alloc == nullptr || im->slots_per_bucket == 0) return;
    MutexLock l(im->need_mu);
    const u64 hold = im->ckpt_hold.Load(MemOrder::kRelaxed);
    const u64 taken = im->ckpt_taken.Load(MemOrder::kRelaxed);
    const u64 left = hold > taken ? hold - taken : 0;  // the running checkpoint's
    const u64 avail = im->avail_slots.Load(MemOrder::kRelaxed);
    const u64 bound = Max<u64>(CheckpointSlots(im), left);
    const u64 slots = bound > avail ? bound - avail : 0;
    const u64 need = (slots + im->slots_per_bucket - 1) / im->slots_per_bucket + 2;
    const u64 held = im->reserved_slots.Load(MemOrder::kRelaxed) / im->slots_per_bucket;
    for (u32 m : dev::Bits(im->target)) im->alloc->SetMetadataNeed(m, need, held);
  }

  static void SetDirty(Impl* im, CachedNode* n) {
    if (n->dirty.Load(MemOrder::kRelaxed) == 0) {
      n->dirty.Store(1, MemOrder::kRelaxed);
      im->dirty_nodes.FetchAdd(1, MemOrder::kRelaxed);
      PublishNeed(im);
    }
  }
  static void ClearDirty(Impl* im, CachedNode* n) {
    if (n->dirty.Load(MemOrder::kRelaxed) != 0) {
      n->dirty.Store(0, MemOrder::kRelaxed);
      im->dirty_nodes.FetchSub(1, MemOrder::kRelaxed);
    }
  }

  // Takes a node out of its tree (tree lock exclusive): its slot is released by
  // the next checkpoint, its memory when the last reference goes.
  static void Kill(Impl* im, Tree& t, CachedNode* n) {
    if (n->ptr.member != kNoMember) t.dead_slots.PushBack(n->ptr).IgnoreError();  // see Reserve in callers
    ClearDirty(im, n);
    n->dead.Store(1, MemOrder::kRelease);
    n->version.FetchAdd(1, MemOrder::kRelease);
    {
      MutexLock l(im->cache_mu);
      if (n->lru.linked()) im->lru.Remove(n);
    }
    im->cached_bytes.FetchSub(n->charged, MemOrder::kRelaxed);
    im->cached_nodes.FetchSub(1, MemOrder::kRelaxed);
    if (n->ptr.member == kNoMember) im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);
    if (n->tree_level > 0 && n->charged != 0) im->interior_nodes.FetchSub(1, MemOrder::kRelaxed);
    PublishNeed(im);
    n->charged = 0;
    Unref(n);
  }

  static u64 NewSeq(Impl* im) {
    MutexLock l(im->seq_mu);
    u64 s;
    do {
      s = SplitMix(&im->rng);
    } while (s == 0);
    return s;
  }

  // Key index of child `c` in its parent (interior nodes hold one set).
  static u32 ChildIndex(const CachedNode* p, const CachedNode* c) {
    const Set& s = p->node.set(0);
    u32 i = s.LowerBound(c->node.info().max);
    TFS_BUG_ON(i >= s.size() || p->children[i] != c);
    return i;
  }

  // --- descent ---------------------------------------------------------------

  struct Miss {
    NodePtrFormat ptr;
    Pos max;
  };

  // Walks from the root to the node at `level` covering pos (tree lock held, any
  // mode). Null with *miss set when a node on the way is not cached.
  static CachedNode* Descend(Impl*, Tree& t, const Pos& pos, u8 level, Miss* miss) {
    CachedNode* n = t.root;
    while (n->node.info().level > level) {
      const Set& s = n->node.set(0);
      u32 i = s.LowerBound(pos);
      TFS_BUG_ON(i >= s.size());  // the root covers everything; children partition it
      CachedNode* c = n->children[i];
      if (c == nullptr) {
        KeyRef k = s.Key(i);
        miss->ptr = ReadPtr(k);
        miss->max = k.pos();
        return nullptr;
      }
      // Start loading the child's lock, node and sets at once: they are
      // independent lines, which the lock's atomic operation would otherwise
      // fetch one after another.
      for (uptr line = 0; line < kHotBytes; line += 64)
        __builtin_prefetch(reinterpret_cast<const u8*>(c) + line);
      if (c->accessed.Load(MemOrder::kRelaxed) == 0) c->accessed.Store(1, MemOrder::kRelaxed);
      n = c;
    }
    return n;
  }

  // --- reading nodes -----------------------------------------------------------

  // Checks an interior node read from disk: child pointers of the right btree and
  // level, covering [min, max] exactly.
  static Status CheckInterior(const Impl* im, const Node& node, Diag* diag) {
    const NodeInfo& info = node.info();
    if (node.nsets() != 1)
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: interior node with %u sets",
                       (unsigned long long)info.seq, node.nsets());
    const Set& s = node.set(0);
    Pos expect_min = info.min;
    for (u32 i = 0; i < s.size(); i++) {
      KeyRef k = s.Key(i);
      if (k.type() != kKeyValue || k.val_bytes() != sizeof(NodePtrFormat))
        return DiagError(diag, Err::kCorrupt, "btree node seq %llu: key %u is not a child pointer",
                         (unsigned long long)info.seq, i);
      NodePtrFormat p = ReadPtr(k);
      if (p.member == kNoMember || p.member >= im->sb.nr_members || p.btree_id != info.btree_id ||
          p.level + 1 != info.level || PtrMin(p) != expect_min)
        return DiagError(diag, Err::kCorrupt,
                         "btree node seq %llu: child %u has a bad pointer (member, btree, level or min)",
                         (unsigned long long)info.seq, i);
      if (IsMax(k.pos()) ? i + 1 != s.size() : false)
        return DiagError(diag, Err::kCorrupt, "btree node seq %llu: keys after the max",
                         (unsigned long long)info.seq);
      expect_min = Succ(k.pos());
    }
    if (s.size() == 0 || s.Key(s.size() - 1).pos() != info.max)
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: children do not cover the node's range",
                       (unsigned long long)info.seq);
    return Status::Ok();
  }

  // Reads and verifies the node `ptr` points to, with no lock held.
  // Counts a corrupt read in corrupt_reads if count_corrupt (FetchMiss counts
  // its own: only when the pointer did not move meanwhile).
  static Status ReadNode(Impl* im, const NodePtrFormat& ptr, const Pos& max, CachedNode** out, Diag* diag,
                         bool count_corrupt = true) {
    const u32 ns = im->node_size;
    const u64 off = ptr.offset.get();
    if (ptr.member == kNoMember || ptr.member >= im->sb.nr_members || off % ns != 0 ||
        off < sb::kBucketsOffset || off - sb::kBucketsOffset >= im->sb.members[ptr.member].nbuckets * im->sb.bucket_size)
      return DiagError(diag, Err::kCorrupt, "btree: pointer to member %u offset %llu is outside the btree area",
                       unsigned(ptr.member), (unsigned long long)off);
    u8* buf = static_cast<u8*>(platform::Alloc(ns, 4096, false));
    if (buf == nullptr) return Err::kNoMemory;
    Status st = ReadRaw(im, ptr.member, off, ns, buf);
    im->ctr.node_reads.FetchAdd(1, MemOrder::kRelaxed);
    im->ctr.node_read_bytes.FetchAdd(ns, MemOrder::kRelaxed);
    if (!st.ok()) {
      platform::Free(buf);
      return DiagError(diag, st, "btree: reading node at member %u offset %llu: %s", unsigned(ptr.member),
                       (unsigned long long)off, st.Message());
    }
    CachedNode* n = NewNode(im);
    if (n == nullptr) {
      platform::Free(buf);
      return Err::kNoMemory;
    }
    NodeInfo expect;
    expect.btree_id = ptr.btree_id;
    expect.level = ptr.level;
    expect.seq = ptr.seq.get();
    expect.min = PtrMin(ptr);
    expect.max = max;
    st = n->node.Parse(buf, ns, &expect, diag);
    platform::Free(buf);
    if (st.ok() && ptr.level > 0) {
      st = CheckInterior(im, n->node, diag);
      if (st.ok()) st = n->children.Resize(n->node.set(0).size());
      if (st.ok())
        for (usize i = 0; i < n->children.size(); i++) n->children[i] = nullptr;
      im->partial.Store(1, MemOrder::kRelaxed);
    }
    if (!st.ok()) {
      platform::Delete(n);
      if (count_corrupt && StatusIsCorrupt(st)) im->ctr.corrupt_reads.FetchAdd(1, MemOrder::kRelaxed);
      return st;
    }
    n->ptr = ptr;
    *out = n;
    return Status::Ok();
  }

  // Reads the missing node and links it under its parent, if the parent still
  // points to that very node. Called with no lock held.
  static Status FetchMiss(Impl* im, Tree& t, const Miss& miss, Diag* diag = nullptr) {
    im->ctr.cache_misses.FetchAdd(1, MemOrder::kRelaxed);
    im->ctr.restarts.FetchAdd(1, MemOrder::kRelaxed);
    CachedNode* n = nullptr;
    Status st = ReadNode(im, miss.ptr, miss.max, &n, diag, false);
    if (!st.ok()) {
      // A pointer that changed while we read is not corruption: retry the
      // descent (its slot may hold another node by now: a hole reused).
      if (StatusIsCorrupt(st)) {
        if (!StillPointsTo(im, t, miss)) return Status::Ok();
        im->ctr.corrupt_reads.FetchAdd(1, MemOrder::kRelaxed);
      }
      return st;
    }
    bool linked = false;
    {
      WriteGuard g(t.lock);
      if (t.root != nullptr) {
        Miss m2;
        CachedNode* p = Descend(im, t, miss.max, u8(miss.ptr.level + 1), &m2);
        if (p != nullptr && p->node.info().level == miss.ptr.level + 1) {
          const Set& s = p->node.set(0);
          u32 i = s.LowerBound(miss.max);
          if (i < s.size() && p->children[i] == nullptr && ReadPtr(s.Key(i)).seq.get() == miss.ptr.seq.get()) {
            n->accessed.Store(1, MemOrder::kRelaxed);
            p->children[i] = n;
            n->parent = p;
            // Charged before the tree lock goes: once it does, a writer can
            // split or merge the node and Kill it, which uncharges and frees
            // it; charging it after that put freed memory on the LRU.
            Charge(im, n);
            linked = true;
          }
        }
      }
    }
    if (!linked) {
      platform::Delete(n);
      return Status::Ok();
    }
    if (im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "fetch.linked");
    // No eviction here: the caller restarts to use this node. Operations evict
    // when they finish (MaybeEvict), and the clock bit spares it one pass.
    return Status::Ok();
  }

  static void MaybeEvict(Impl* im) {
    if (im->cached_bytes.Load(MemOrder::kRelaxed) > im->opt.cache_bytes) EvictIfNeeded(im);
  }

  // The memory-pressure shrinker (platform.h's rules: no waiting for a lock,
  // no I/O, no allocation). count: the clean nodes' bytes, in pages; scan:
  // evicts clean nodes down to what was asked, from the trees whose lock is
  // free right now.
  static u64 ShrinkCount(void* ctx) {
    Impl* im = static_cast<Impl*>(ctx);
    const u64 cached = im->cached_bytes.Load(MemOrder::kRelaxed);
    const u64 dirty = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size;
    return cached > dirty ? (cached - dirty) / platform::kShrinkPage : 0;
  }
  static u64 ShrinkScan(void* ctx, u64 pages) {
    Impl* im = static_cast<Impl*>(ctx);
    im->ctr.shrinks.FetchAdd(1, MemOrder::kRelaxed);
    const u64 cached = im->cached_bytes.Load(MemOrder::kRelaxed);
    const u64 want = Min(pages, cached / platform::kShrinkPage) * platform::kShrinkPage;
    const u64 freed = EvictTo(im, cached - want, /*wait=*/false);
    im->ctr.shrunk_bytes.FetchAdd(freed, MemOrder::kRelaxed);
    return freed / platform::kShrinkPage;
  }

  static bool StillPointsTo(Impl* im, Tree& t, const Miss& miss) {
    ReadGuard g(t.lock);
    if (t.root == nullptr) return false;
    Miss m2;
    CachedNode* p = Descend(im, t, miss.max, u8(miss.ptr.level + 1), &m2);
    if (p == nullptr || p->node.info().level != miss.ptr.level + 1) return false;
    const Set& s = p->node.set(0);
    u32 i = s.LowerBound(miss.max);
    return i < s.size() && ReadPtr(s.Key(i)).seq.get() == miss.ptr.seq.get();
  }

  // --- eviction ----------------------------------------------------------------

  static bool Evictable(const CachedNode* n) {
    if (n->dirty.Load(MemOrder::kRelaxed) != 0 || n->parent == nullptr || n->ptr.member == kNoMember) return false;
    if (n->refs.Load(MemOrder::kAcquire) != 1) return false;
    for (usize i = 0; i < n->children.size(); i++)
      if (n->children[i] != nullptr) return false;
    return true;
  }

  // Evicts clean nodes, least recently used first (clock), until the cache is
  // within 90% of its bound. Takes each tree's lock exclusively in turn.
  static void EvictIfNeeded(Impl* im) {
    const u64 limit = im->opt.cache_bytes;
    if (im->cached_bytes.Load(MemOrder::kRelaxed) <= limit) return;
    (void)EvictTo(im, limit - limit / 10, /*wait=*/true);
  }

  // Evicts clean nodes until the cache holds at most `goal` bytes, one pass of
  // the clock; each tree under its lock, exclusive: waited for if `wait`,
  // else a tree whose lock is taken is skipped. Returns the bytes evicted.
  static u64 EvictTo(Impl* im, u64 goal, bool wait) {
    const u64 before = im->cached_bytes.Load(MemOrder::kRelaxed);
    for (u32 id = 0; id < kNrBtreeIds && im->cached_bytes.Load(MemOrder::kRelaxed) > goal; id++) {
      Tree& t = im->trees[id];
      if (wait) {
        t.lock.WriteLock();
      } else if (!t.lock.TryWriteLock()) {
        continue;
      }
      CachedNode* victims = nullptr;
      if (wait) {
        im->cache_mu.Lock();
      } else if (!im->cache_mu.TryLock()) {
        t.lock.WriteUnlock();
        continue;
      }
      {
        usize budget = im->lru.size();  // one pass: a node used since the last one survives
        CachedNode* n = im->lru.front();
        while (n != nullptr && budget-- > 0 && im->cached_bytes.Load(MemOrder::kRelaxed) > goal) {
          CachedNode* next = im->lru.Next(n);
          if (n->tree_id == id && Evictable(n)) {
            if (n->accessed.Load(MemOrder::kRelaxed) != 0) {
              n->accessed.Store(0, MemOrder::kRelaxed);
              im->lru.Remove(n);
              im->lru.PushBack(n);
            } else {
              im->lru.Remove(n);
              CachedNode* p = n->parent;
              p->children[ChildIndex(p, n)] = nullptr;
              im->partial.Store(1, MemOrder::kRelaxed);
              im->cached_bytes.FetchSub(n->charged, MemOrder::kRelaxed);
              im->cached_nodes.FetchSub(1, MemOrder::kRelaxed);
              if (n->tree_level > 0) im->interior_nodes.FetchSub(1, MemOrder::kRelaxed);
              n->parent = victims;  // chain for freeing outside cache_mu
              victims = n;
              im->ctr.evictions.FetchAdd(1, MemOrder::kRelaxed);
            }
          }
          n = next;
        }
      }
      im->cache_mu.Unlock();
      while (victims != nullptr) {
        CachedNode* next = victims->parent;
        Unref(victims);
        victims = next;
      }
      t.lock.WriteUnlock();
    }
    const u64 after = im->cached_bytes.Load(MemOrder::kRelaxed);
    return before > after ? before - after : 0;
  }

  // --- structure changes (tree lock exclusive) -----------------------------------

  struct Edit {
    Pos pos;
    const NodePtrFormat* ptr;  // null: remove the key
    CachedNode* child;
  };

  // Rebuilds interior node p with `edits` (sorted by pos) applied, keeping its
  // children array in step. kNoSpace if the result does not fit.
  static Status RebuildInterior(Impl* im, CachedNode* p, const Edit* edits, u32 nedits) {
    const Set* old = p->node.nsets() > 0 ? &p->node.set(0) : nullptr;  // a new root has none
    const u32 n_old = old != nullptr ? old->size() : 0;
    Vector<KeyInput> keys;
    Vector<CachedNode*> kids;
    TFS_TRY(keys.Reserve(n_old + nedits));
    TFS_TRY(kids.Reserve(n_old + nedits));
    u32 i = 0, e = 0;
    while (i < n_old || e < nedits) {
      KeyInput in;
      if (e < nedits && (i == n_old || edits[e].pos <= old->KeyPos(i))) {
        if (i < n_old && edits[e].pos == old->KeyPos(i)) i++;  // replaced or removed
        if (edits[e].ptr != nullptr) {
          in.pos = edits[e].pos;
          in.type = kKeyValue;
          in.value = edits[e].ptr;
          in.val_bytes = sizeof(NodePtrFormat);
          keys.PushBack(in).IgnoreError();
          kids.PushBack(edits[e].child).IgnoreError();
        }
        e++;
        continue;
      }
      KeyRef k = old->Key(i);
      in.pos = k.pos();
      in.type = k.type();
      in.value = k.value();
      in.val_bytes = k.val_bytes();
      keys.PushBack(in).IgnoreError();
      kids.PushBack(p->children[i]).IgnoreError();
      i++;
    }
    // On the heap: a Node holds its sets inline (~1.6 KiB), too much for a
    // kernel stack frame.
    Node* fresh = platform::New<Node>();
    if (fresh == nullptr) return Err::kNoMemory;
    Status st = fresh->Init(im->node_size, p->node.info());
    if (st.ok()) st = fresh->AppendSet(keys.data(), keys.size(), 0);
    if (st.ok()) p->node.Swap(*fresh);
    platform::Delete(fresh);
    TFS_TRY(st);
    p->children = Move(kids);
    for (usize j = 0; j < p->children.size(); j++)
      if (p->children[j] != nullptr) p->children[j]->parent = p;
    SetDirty(im, p);
    p->version.FetchAdd(1, MemOrder::kRelease);
    return Status::Ok();
  }

  static Status MakeNode(Impl* im, u8 id, u8 level, const Pos& min, const Pos& max, const Node* const* srcs,
                         u32 nsrcs, CachedNode** out) {
    CachedNode* n = NewNode(im);
    if (n == nullptr) return Err::kNoMemory;
    NodeInfo info;
    info.btree_id = id;
    info.level = level;
    info.seq = NewSeq(im);
    info.min = min;
    info.max = max;
    Status st = nsrcs == 0 ? n->node.Init(im->node_size, info) : n->node.InitFrom(im->node_size, info, srcs, nsrcs);
    if (!st.ok()) {
      platform::Delete(n);
      return st;
    }
    n->ptr = EmptyPtr(id);
    n->ptr.level = level;
    n->ptr.seq.set(info.seq);
    n->ptr.min_inode.set(min.inode);
    n->ptr.min_offset.set(min.offset);
    n->dirty.Store(1, MemOrder::kRelaxed);
    im->dirty_nodes.FetchAdd(1, MemOrder::kRelaxed);
    im->unwritten_nodes.FetchAdd(1, MemOrder::kRelaxed);
    PublishNeed(im);
    *out = n;
    return Status::Ok();
  }

  // Gives `dst` the cached children of `src` whose keys fall in dst's range
  // (split: part of src's; merge: all of each source's).
  static Status TakeChildren(CachedNode* dst, const CachedNode* src) {
    if (dst->node.info().level == 0) return Status::Ok();
    const Set& s = dst->node.set(0);
    const Set& from = src->node.set(0);
    if (dst->children.size() != s.size()) {
      TFS_TRY(dst->children.Resize(s.size()));
      for (usize i = 0; i < s.size(); i++) dst->children[i] = nullptr;
    }
    u32 j = from.LowerBound(dst->node.info().min);
    u32 i = j < from.size() ? s.LowerBound(from.KeyPos(j)) : s.size();
    for (; j < from.size() && from.KeyPos(j) <= dst->node.info().max; i++, j++) {
      TFS_BUG_ON(i >= s.size() || from.KeyPos(j) != s.KeyPos(i));
      dst->children[i] = src->children[j];
      if (dst->children[i] != nullptr) dst->children[i]->parent = dst;
    }
    return Status::Ok();
  }

  // Splits n in two (and its parent first if it has no room for another
  // child). `append` favours a left node nearly full (sequential inserts).
  static Status Split(Impl* im, Tree& t, CachedNode* n, bool append, const Pos& at) {
    TFS_TRY(t.dead_slots.Reserve(t.dead_slots.size() + 2 * (kMaxLevel + 2)));
    if (n->parent != nullptr && n->parent->node.free_bytes() < kPtrKeySpace)
      TFS_TRY(Split(im, t, n->parent, false, at));
    const NodeInfo info = n->node.info();
    Pos mid;
    if (!n->node.SplitPoint(append ? 9 : 1, append ? 10 : 2, &mid)) {
      // One key (of the largest sizes): split the range around it so the new
      // key lands in the other half.
      NodeIter it(n->node);
      it.SeekToFirst();
      if (!it.Valid()) return Err::kNoSpace;
      const Pos k = it.pos();
      if (at > k) {
        mid = k;
      } else if (at < k && k != info.min) {
        mid = Pred(k);
      } else {
        return Err::kNoSpace;
      }
      if (mid == info.max) return Err::kNoSpace;
    }
    const Node* src[] = {&n->node};
    CachedNode* a = nullptr;
    CachedNode* b = nullptr;
    TFS_TRY(MakeNode(im, info.btree_id, info.level, info.min, mid, src, 1, &a));
    Status st = MakeNode(im, info.btree_id, info.level, Succ(mid), info.max, src, 1, &b);
    if (st.ok()) st = TakeChildren(a, n);
    if (st.ok()) st = TakeChildren(b, n);
    if (st.ok()) {
      Edit edits[2] = {{mid, &a->ptr, a}, {info.max, &b->ptr, b}};
      if (n->parent == nullptr) {
        CachedNode* r = nullptr;
        st = MakeNode(im, info.btree_id, u8(info.level + 1), Pos::Min(info.btree_id), Pos::Max(info.btree_id),
                      nullptr, 0, &r);
        if (st.ok()) {
          st = RebuildInterior(im, r, edits, 2);
          if (!st.ok()) {
            ClearDirty(im, r);
            platform::Delete(r);
          } else {
            t.root = r;
            Charge(im, r);
            im->ctr.root_grows.FetchAdd(1, MemOrder::kRelaxed);
          }
        }
      } else {
        st = RebuildInterior(im, n->parent, edits, 2);
      }
    }
    if (!st.ok()) {
      // Nothing was linked: give the children back and drop the new nodes.
      CachedNode* made[2] = {a, b};
      for (CachedNode* x : made) {
        if (x == nullptr) continue;
        for (usize i = 0; i < x->children.size(); i++)
          if (x->children[i] != nullptr) x->children[i]->parent = n;
        ClearDirty(im, x);
        platform::Delete(x);
      }
      return st;
    }
    Charge(im, a);
    Charge(im, b);
    Kill(im, t, n);
    im->ctr.splits.FetchAdd(1, MemOrder::kRelaxed);
    return Status::Ok();
  }

  // Root shrink: an interior root with one (cached) child hands the tree to it
  // (the child already covers the whole range).
  static void ShrinkRoot(Impl* im, Tree& t) {
    while (t.root != nullptr && t.root->node.info().level > 0 && t.root->node.set(0).size() == 1 &&
           t.root->children[0] != nullptr) {
      CachedNode* old = t.root;
      CachedNode* c = old->children[0];
      c->parent = nullptr;
      old->children[0] = nullptr;
      t.root = c;
      Kill(im, t, old);
      im->ctr.root_shrinks.FetchAdd(1, MemOrder::kRelaxed);
    }
  }

  // Merges underfull n with a cached sibling when the result is at most 3/4 full,
  // then its parent likewise; finally shrinks the root while it has one child.
  static void TryMerge(Impl* im, Tree& t, CachedNode* n) {
    MergeUp(im, t, n);
    ShrinkRoot(im, t);
  }

  static void MergeUp(Impl* im, Tree& t, CachedNode* n) {
    if (!t.dead_slots.Reserve(t.dead_slots.size() + 3 * (kMaxLevel + 2)).ok()) return;
    for (;;) {
      CachedNode* p = n->parent;
      if (p == nullptr) return;
      if (n->node.live_estimate() >= im->node_size / 4) return;
      const u32 i = ChildIndex(p, n);
      CachedNode* left = nullptr;
      CachedNode* right = nullptr;
      if (i + 1 < p->children.size() && p->children[i + 1] != nullptr) {
        left = n;
        right = p->children[i + 1];
      } else if (i > 0 && p->children[i - 1] != nullptr) {
        left = p->children[i - 1];
        right = n;
      } else {
        return;  // no cached sibling: a later update retries
      }
      // Live bytes are at most the estimates (which miss overwritten versions):
      // rule out merges that cannot fit before building anything, compacting a
      // node to learn its real size only when that could change the answer --
      // the sibling at most once per version of it, so that each update of a
      // nearly empty node next to a full one does not rebuild the full one.
      const u64 limit = im->node_size / 4 * 3 + sizeof(NodeHeader);
      CachedNode* sib = left == n ? right : left;
      u64 sib_live = sib->node.live_estimate();
      if (sib_live > limit && sib->node.nsets() > 1 && sib->compacted_version != sib->version.Load()) {
        if (!sib->node.Compact(0).ok()) return;
        sib->compacted_version = sib->version.Load();
        sib_live = sib->node.used_bytes();
      }
      if (sib_live > limit) return;
      if (n->node.live_estimate() + sib_live > limit || n->node.nsets() > 1) {
        if (n->node.nsets() > 1 && !n->node.Compact(0).ok()) return;
        if (n->node.used_bytes() + sib_live > limit) {
          if (sib->node.nsets() <= 1 || sib->compacted_version == sib->version.Load()) return;
          if (!sib->node.Compact(0).ok()) return;
          sib->compacted_version = sib->version.Load();
          if (n->node.used_bytes() + sib->node.used_bytes() > limit) return;
        }
      }
      if (n->node.used_bytes() >= im->node_size / 4) return;
      const Node* src[] = {&left->node, &right->node};
      CachedNode* m = nullptr;
      const NodeInfo& li = left->node.info();
      const NodeInfo& ri = right->node.info();
      if (!MakeNode(im, li.btree_id, li.level, li.min, ri.max, src, 2, &m).ok()) return;
      if (m->node.used_bytes() > im->node_size / 4 * 3 || !TakeChildren(m, left).ok() ||
          !TakeChildren(m, right).ok()) {
        for (usize k = 0; k < m->children.size(); k++) {
          CachedNode* c = m->children[k];
          if (c != nullptr) c->parent = k < left->children.size() ? left : right;
        }
        ClearDirty(im, m);
        platform::Delete(m);
        return;
      }
      Edit edits[2] = {{li.max, nullptr, nullptr}, {ri.max, &m->ptr, m}};
      if (!RebuildInterior(im, p, edits, 2).ok()) {
        for (usize k = 0; k < m->children.size(); k++) {
          CachedNode* c = m->children[k];
          if (c != nullptr) c->parent = k < left->children.size() ? left : right;
        }
        ClearDirty(im, m);
        platform::Delete(m);
        return;
      }
      Charge(im, m);
      left->children.Clear();
      right->children.Clear();
      Kill(im, t, left);
      Kill(im, t, right);
      im->ctr.merges.FetchAdd(1, MemOrder::kRelaxed);
      n = p;
    }
  }

  // --- applying one update -------------------------------------------------------

  // Applies one key to its leaf (commit_mu held, or replay). May read nodes.
  static Status ApplyKey(Impl* im, const KeyInput& key, u64 seq) {
    Tree& t = im->trees[key.pos.btree_id];
    const bool del = key.type == kKeyWhiteout;
    for (;;) {
      Miss miss;
      t.lock.ReadLock();
      if (t.root == nullptr) {
        t.lock.ReadUnlock();
        if (del) return Status::Ok();
        WriteGuard g(t.lock);
        if (t.root == nullptr) {
          CachedNode* r = nullptr;
          TFS_TRY(MakeNode(im, key.pos.btree_id, 0, Pos::Min(key.pos.btree_id), Pos::Max(key.pos.btree_id), nullptr,
                           0, &r));
          t.root = r;
          Charge(im, r);
        }
        continue;
      }
      CachedNode* leaf = Descend(im, t, key.pos, 0, &miss);
      if (leaf == nullptr) {
        t.lock.ReadUnlock();
        TFS_TRY(FetchMiss(im, t, miss));
        continue;
      }
      BumpSerial(im->c_apply_hits);
      leaf->lock.WriteLock();
      Status st;
      bool merge = false;
      bool append = false;
      KeyRef old = del ? leaf->node.Find(key.pos) : KeyRef();
      if (del && !old.valid()) {
        st = Status::Ok();  // nothing to delete
      } else {
        const u32 old_space = del ? old.space() : 0;
        const u64 compactions = leaf->node.compactions();
        st = leaf->node.Upsert(key, seq);
        if (leaf->node.compactions() != compactions) BumpSerial(im->ctr.compactions, leaf->node.compactions() - compactions);
        if (st.ok()) {
          SetDirty(im, leaf);
          leaf->version.FetchAdd(1, MemOrder::kRelease);
          if (leaf->reads.Load(MemOrder::kRelaxed) != 0) leaf->reads.Store(0, MemOrder::kRelaxed);
          if (del) leaf->node.NoteDead(old_space + KeySpace(0));
          merge = del && leaf->parent != nullptr && leaf->node.live_estimate() < im->node_size / 4;
        } else if (st.code() == Err::kNoSpace) {
          NodeIter it(leaf->node);
          it.SeekToLast();
          append = !it.Valid() || it.pos() < key.pos;
        }
      }
      leaf->lock.WriteUnlock();
      t.lock.ReadUnlock();
      if (st.ok()) {
        if (merge) {
          WriteGuard g(t.lock);
          Miss m2;
          CachedNode* l2 = t.root != nullptr ? Descend(im, t, key.pos, 0, &m2) : nullptr;
          if (l2 != nullptr) TryMerge(im, t, l2);
        }
        return st;
      }
      if (st.code() != Err::kNoSpace) return st;
      {
        WriteGuard g(t.lock);
        Miss m2;
        CachedNode* l2 = Descend(im, t, key.pos, 0, &m2);
        if (l2 == nullptr) continue;  // evicted meanwhile: re-read, retry
        TFS_TRY(Split(im, t, l2, append, key.pos));
      }
      im->ctr.restarts.FetchAdd(1, MemOrder::kRelaxed);
    }
  }

  // A lookup in `leaf`, which had several sets, just ended (tree lock shared,
  // leaf lock not held). Every lookup searches each set of the leaf, newest
  // first; a leaf read many times without being updated is merged into one set,
  // so later lookups search one. Only the layout changes, not the keys, so the
  // node stays clean. The count is approximate (racing readers may lose an
  // increment); an update resets it.
  static void ReadMostly(Impl* im, CachedNode* leaf) {
    const u32 r = leaf->reads.Load(MemOrder::kRelaxed) + 1;
    leaf->reads.Store(r, MemOrder::kRelaxed);
    if (r < kReadsBeforeMerge) return;
    // The writer thread merges it, off the lookup's path (a merge rewrites the
    // whole node: ~0.2 ms for 256 KiB). Without one, the reader does.
    if (im->writer_running) {
      if (leaf->merge_queued.Load(MemOrder::kRelaxed) != 0 || leaf->merge_queued.Exchange(1) != 0) return;
      Ref(leaf);
      bool queued;
      {
        MutexLock l(im->wmu);
        queued = !im->stop && im->merge_queue.PushBack(leaf).ok();
        if (queued) im->wcv.Signal();
      }
      if (!queued) {
        leaf->merge_queued.Store(0, MemOrder::kRelaxed);
        Unref(leaf);
      }
      return;
    }
    if (!leaf->lock.TryWriteLock()) return;
    MergeForReads(im, leaf);
    leaf->lock.WriteUnlock();
  }

  // Merges a leaf's sets into one (leaf write-locked). Its contents do not
  // change, so it stays clean.
  static void MergeForReads(Impl* im, CachedNode* leaf) {
    platform::NoFsScope nofs;  // a lookup's merge: Compact allocates under the leaf lock
    if (leaf->node.nsets() >= 2 && leaf->node.Compact(0).ok()) {
      leaf->version.FetchAdd(1, MemOrder::kRelease);
      im->ctr.read_merges.FetchAdd(1, MemOrder::kRelaxed);
    }
    leaf->reads.Store(0, MemOrder::kRelaxed);
  }

  // The writer thread: merges the queued leaves that are still in the tree and
  // have seen no update since they were queued.
  static void MergeQueued(Impl* im) {
    Vector<CachedNode*> batch;
    {
      MutexLock l(im->wmu);
      batch = Move(im->merge_queue);
    }
    for (CachedNode* n : batch) {
      Tree& t = im->trees[n->tree_id];  // (not its contents: no lock held yet)
      {
        ReadGuard g(t.lock);
        if (n->dead.Load(MemOrder::kAcquire) == 0 && n->reads.Load(MemOrder::kRelaxed) >= kReadsBeforeMerge) {
          n->lock.WriteLock();
          MergeForReads(im, n);
          n->lock.WriteUnlock();
        }
      }
      n->merge_queued.Store(0, MemOrder::kRelaxed);
      Unref(n);
    }
  }

  // At unmount, after the writer stopped: drops what it had not merged.
  static void DropMergeQueue(Impl* im) {
    for (CachedNode* n : im->merge_queue) {
      n->merge_queued.Store(0, MemOrder::kRelaxed);
      Unref(n);
    }
    im->merge_queue.Clear();
  }

  // Makes sure the leaf for pos is cached (no lock held on return).
  static Status Prefetch(Impl* im, const Pos& pos) {
    Tree& t = im->trees[pos.btree_id];
    for (;;) {
      Miss miss;
      {
        ReadGuard g(t.lock);
        if (t.root == nullptr || Descend(im, t, pos, 0, &miss) != nullptr) return Status::Ok();
      }
      TFS_TRY(FetchMiss(im, t, miss));
    }
  }

  // --- checkpoints ------------------------------------------------------------------

  struct Job {
    CachedNode* node;
    Tree* tree;
    u8* img;
    u32 bytes;
    u64 seq;
    NodePtrFormat dst;
    bool installed;
  };

  // avail_slots from the holes, the open bucket and the reserved ones.
  // slot_mu held.
  static void NoteAvailLocked(Impl* im) {
    const u64 open = im->open_valid ? im->slots_per_bucket - im->open_next : 0;
    const u64 reserved = u64(im->reserved.size()) * im->slots_per_bucket;
    im->avail_slots.Store(u64(im->holes.size()) + open + reserved, MemOrder::kRelaxed);
    im->reserved_slots.Store(reserved, MemOrder::kRelaxed);
  }

  static bool IsOpenLocked(Impl* im, u32 m, u64 b) {
    return im->open_valid && im->open_bucket.dev == m && im->open_bucket.bucket == b;
  }

  // Whether hole h can still be taken: its bucket is still the btree's (the
  // same incarnation) and has room, and is not freed (no live node and not
  // being filled). slot_mu held.
  static bool HoleValidLocked(Impl* im, const Impl::Hole& h) {
    const u64 b = im->sb.BucketOf(h.offset);
    if (h.member >= im->sb.nr_members || b >= im->live[h.member].size()) return false;
    const u16 live = im->live[h.member][b];
    if (live >= im->slots_per_bucket || (live == 0 && !IsOpenLocked(im, h.member, b))) return false;
    const alloc::Bucket bk = im->alloc->Get(h.member, b);
    return bk.state == alloc::BucketState::kBtree && bk.gen == h.gen;
  }

  // Drops the holes that can no longer be taken -- those of freed buckets
  // (after a checkpoint's frees, before anything is allocated again, so a
  // freed bucket is recognised by live 0) -- so that avail_slots counts only
  // what AllocSlot can take. One pass when a bucket was freed since the
  // last; slot_mu held.
  static void PurgeHolesLocked(Impl* im) {
    if (!im->holes_stale) return;
    im->holes_stale = false;
    usize k = 0;
    for (usize i = 0; i < im->holes.size(); i++) {
      const Impl::Hole h = im->holes[i];
      if (HoleValidLocked(im, h)) im->holes[k++] = h;
    }
    while (im->holes.size() > k) im->holes.PopBack();
    NoteAvailLocked(im);
  }

  // Takes a slot without the allocator: a hole, else the open bucket's
  // next, else a reserved bucket's first (it becomes the open one). False
  // when none is left. slot_mu held.
  static bool TakeSlotLocked(Impl* im, NodePtrFormat* dst) {
    while (!im->holes.empty()) {
      const Impl::Hole h = im->holes.back();
      im->holes.PopBack();
      if (!HoleValidLocked(im, h)) continue;  // (not reached: purged after every free)
      im->ckpt_taken.FetchAdd(1, MemOrder::kRelaxed);
      dst->member = h.member;
      dst->offset.set(h.offset);
      im->live[h.member][im->sb.BucketOf(h.offset)]++;
      im->ctr.hole_slots.FetchAdd(1, MemOrder::kRelaxed);
      return true;
    }
    if (!im->open_valid || im->open_next >= im->slots_per_bucket) {
      if (im->reserved.empty()) return false;
      im->open_bucket = im->reserved.back();
      im->reserved.PopBack();
      im->open_valid = true;
      im->open_next = 0;
    }
    const u32 m = im->open_bucket.dev;
    const u64 b = im->open_bucket.bucket;
    im->ckpt_taken.FetchAdd(1, MemOrder::kRelaxed);
    dst->member = u8(m);
    dst->offset.set(im->sb.BucketOffset(b) + u64(im->open_next) * im->node_size);
    im->open_next++;
    im->live[m][b]++;
    return true;
  }

  // A node slot for a checkpoint's image. With may_allocate, a new bucket
  // is reserved when nothing is left; without (the exclusive phase, which
  // holds a tree lock and must not wait for the allocator) the caller has
  // checked AvailSlots.
  static Status AllocSlot(Impl* im, NodePtrFormat* dst, bool may_allocate = true) {
    for (;;) {
      bool taken;
      {
        MutexLock l(im->slot_mu);
        taken = TakeSlotLocked(im, dst);
        NoteAvailLocked(im);
      }
      if (taken) break;
      if (!may_allocate) return Err::kNoSpace;  // (not reached: see above)
      TFS_TRY(ReserveBucket(im));
    }
    PublishNeed(im);
    return Status::Ok();
  }

  // One more empty bucket among the reserved. Allocate runs without slot_mu
  // (it may settle the journal).
  static Status ReserveBucket(Impl* im) {
    auto r = im->alloc->Allocate(im->target, im->capable, alloc::BucketState::kBtree, alloc::Watermark::kBtree);
    if (!r.ok()) return r.status();
    MutexLock l(im->slot_mu);
    Status st = im->reserved.PushBack(r.value());
    if (!st.ok()) {
      im->alloc->Free(r.value()).IgnoreError();
      return st;
    }
    im->ctr.reserved_buckets.FetchAdd(1, MemOrder::kRelaxed);
    NoteAvailLocked(im);
    return Status::Ok();
  }

  // The slots AllocSlot can take without the allocator, exactly.
  static u64 AvailSlots(Impl* im) {
    MutexLock l(im->slot_mu);
    PurgeHolesLocked(im);
    return im->avail_slots.Load(MemOrder::kRelaxed);
  }

  // Takes empty buckets ahead until `slots` node slots can be taken without
  // the allocator. Only the checkpoint (ckpt_mu) takes slots, so what it
  // counted stays.
  static Status ReserveSlots(Impl* im, u64 slots) {
    while (AvailSlots(im) < slots) TFS_TRY(ReserveBucket(im));
    PublishNeed(im);
    return Status::Ok();
  }

  // The checkpoint's end (every path): the reserved buckets it did not use
  // go back to the allocator, empty (pending until the journal settles, as
  // every free).
  static void ReturnReserved(Impl* im) {
    {
      MutexLock l(im->slot_mu);
      for (const alloc::BucketRef& r : im->reserved) {
        im->alloc->Free(r).IgnoreError();
        im->ctr.returned_buckets.FetchAdd(1, MemOrder::kRelaxed);
      }
      im->reserved.Clear();
      NoteAvailLocked(im);
    }
    PublishNeed(im);
  }

  // At mount: the holes of the btree buckets the trees use in part, from the
  // offsets of their nodes (each member's list sorted here). Only an
  // optimisation: without memory there are just no holes.
  static void FindHoles(Impl* im, Vector<u64>* used) {
    MutexLock l(im->slot_mu);
    for (u32 m = 0; m < im->sb.nr_members; m++) {
      if ((im->target & (dev::DevMask(1) << m)) == 0) continue;  // (as FreeSlot)
      Vector<u64>& u = used[m];
      Sort(u.data(), u.size(), [](u64 a, u64 b) { return a < b; });
      for (usize i = 0; i < u.size();) {
        const u64 b = im->sb.BucketOf(u[i]);
        usize j = i;
        bool shared = false;
        while (j < u.size() && im->sb.BucketOf(u[j]) == b) {
          if (j > i && u[j] == u[j - 1]) {  // (one of them fails its read check)
            platform::Log(platform::LogLevel::kWarn, "btree: two node pointers share the slot at %llu of member %u",
                          (unsigned long long)u[j], m);
            // Its live count is off: no holes in it now (a later free of
            // one of the two may still make one, of a slot whose other
            // pointer already fails its read check).
            shared = true;
          }
          j++;
        }
        const alloc::Bucket bk = im->alloc->Get(m, b);
        if (!shared && bk.state == alloc::BucketState::kBtree && im->live[m][b] < im->slots_per_bucket) {
          usize k = i;
          for (u32 slot = 0; slot < im->slots_per_bucket; slot++) {
            const u64 off = im->sb.BucketOffset(b) + u64(slot) * im->node_size;
            while (k < j && u[k] < off) k++;
            if (k < j && u[k] == off) continue;
            if (!im->holes.PushBack(Impl::Hole{u8(m), bk.gen, off}).ok()) {
              im->holes.Clear();
              NoteAvailLocked(im);
              return;
            }
          }
        }
        i = j;
      }
    }
    NoteAvailLocked(im);  // (every hole found is valid: no purge)
  }

  // Releases a node slot after the roots block that stopped pointing at it
  // is durable. Its bucket is freed once it holds no node (and is not being
  // filled); otherwise the slot becomes a hole. The caller purges the holes
  // of freed buckets after its frees (PurgeHoles).
  static void FreeSlot(Impl* im, const NodePtrFormat& p) {
    if (p.member == kNoMember) return;
    MutexLock l(im->slot_mu);
    const u32 m = p.member;
    const u64 b = im->sb.BucketOf(p.offset.get());
    if (m >= im->sb.nr_members || b >= im->live[m].size() || im->live[m][b] == 0) return;
    const alloc::Bucket bk = im->alloc->Get(m, b);
    const bool open = IsOpenLocked(im, m, b);
    // (Without memory for the hole the slot stays unused until the bucket goes.)
    // Holes only on the metadata target: nodes that spilled elsewhere drain
    // back as they are rewritten.
    if (--im->live[m][b] != 0 || (open && im->open_next < im->slots_per_bucket)) {
      if (bk.state == alloc::BucketState::kBtree && (im->target & (dev::DevMask(1) << m)) != 0)
        im->holes.PushBack(Impl::Hole{u8(m), bk.gen, p.offset.get()}).IgnoreError();
      NoteAvailLocked(im);
      return;
    }
    if (open) im->open_valid = false;
    im->holes_stale = true;
    NoteAvailLocked(im);
    if (bk.state == alloc::BucketState::kBtree) im->alloc->Free(alloc::BucketRef{m, b, bk.gen}).IgnoreError();
  }
  static void PurgeHoles(Impl* im) {
    MutexLock l(im->slot_mu);
    PurgeHolesLocked(im);
  }

  // At unmount: the bucket slots were being taken from is no longer "being
  // filled"; freed if it holds no live node (a checkpoint's unused reserve),
  // so that a clean filesystem has no btree bucket without nodes.
  static void ReleaseOpenBucket(Impl* im) {
    MutexLock l(im->slot_mu);
    if (!im->open_valid) return;
    im->open_valid = false;
    const u32 m = im->open_bucket.dev;
    const u64 b = im->open_bucket.bucket;
    if (im->live[m][b] == 0) {
      alloc::Bucket bk = im->alloc->Get(m, b);
      if (bk.state == alloc::BucketState::kBtree) im->alloc->Free(alloc::BucketRef{m, b, bk.gen}).IgnoreError();
      im->holes_stale = true;
    }
    PurgeHolesLocked(im);
    NoteAvailLocked(im);  // (the open bucket's rest is gone)
  }

  // Takes the image of n (which must not change meanwhile) into a new job.
  static Status TakeImage(Impl* im, Tree& t, CachedNode* n, Vector<Job>* jobs) {
    Job j;
    j.node = n;
    j.tree = &t;
    j.img = static_cast<u8*>(platform::Alloc(im->node_size, 4096, false));
    if (j.img == nullptr) return Err::kNoMemory;
    j.seq = NewSeq(im);
    j.bytes = n->node.WriteImage(j.img, j.seq, im->sb.fs_uuid);
    j.dst = n->ptr;
    j.installed = false;
    Status st = jobs->PushBack(j);
    if (!st.ok()) {
      platform::Free(j.img);
      return st;
    }
    Ref(n);
    ClearDirty(im, n);
    return Status::Ok();
  }

  // Gives job j its slot and points the node (and its parent's key) at it.
  // Tree lock exclusive.
  static void Install(Impl* im, Job& j, const NodePtrFormat& slot, Vector<NodePtrFormat>* to_free) {
    CachedNode* n = j.node;
    j.dst.member = slot.member;
    j.dst.offset = slot.offset;
    j.dst.seq.set(j.seq);
    j.installed = true;
    if (n->dead.Load(MemOrder::kAcquire) != 0) {
      to_free->PushBack(j.dst).IgnoreError();  // nobody points there
      return;
    }
    if (n->ptr.member != kNoMember) {
      to_free->PushBack(n->ptr).IgnoreError();
    } else {
      im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);  // the checkpoint's hold covers it
    }
    n->ptr = j.dst;
    n->node.SetSeq(j.seq);
    n->version.FetchAdd(1, MemOrder::kRelease);
    if (n->parent != nullptr) {
      CachedNode* p = n->parent;
      p->node.OverwriteValue(p->node.set(0).Key(ChildIndex(p, n)), &n->ptr);
      SetDirty(im, p);
    }
  }

  // Post-order: collects the nodes the exclusive phase must image -- nodes never
  // written, interior nodes that changed, and every ancestor of those (installing
  // a child's new location changes its parent). True if n was collected.
  static Result<bool> CollectExclusive(CachedNode* n, Vector<CachedNode*>* out) {
    bool below = false;
    for (usize i = 0; i < n->children.size(); i++) {
      if (n->children[i] == nullptr) continue;
      bool c = TFS_TRY(CollectExclusive(n->children[i], out));
      below = below || c;
    }
    const bool changed_interior = n->dirty.Load(MemOrder::kRelaxed) != 0 && n->node.info().level > 0;
    const bool need = below || n->ptr.member == kNoMember || changed_interior;
    if (need) TFS_TRY(out->PushBack(n));
    return need;
  }

  static void CollectDirtyLeaves(CachedNode* n, Vector<CachedNode*>* out) {
    if (n->node.info().level == 0) {
      if (n->dirty.Load(MemOrder::kRelaxed) != 0) out->PushBack(n).IgnoreError();
      return;
    }
    for (usize i = 0; i < n->children.size(); i++)
      if (n->children[i] != nullptr) CollectDirtyLeaves(n->children[i], out);
  }

  static Status RunCheckpoint(Impl* im, Roots* roots_out) {
    MutexLock ck(im->ckpt_mu);
    // The need stays at least what this checkpoint may take until it is done
    // (it clears dirty flags before it has taken its slots).
    struct Hold {
      Impl* im;
      explicit Hold(Impl* i) : im(i) {
        im->ckpt_taken.Store(0, MemOrder::kRelaxed);
        im->ckpt_hold.Store(CheckpointSlots(im), MemOrder::kRelaxed);
        PublishNeed(im);
      }
      ~Hold() {
        im->ckpt_hold.Store(0, MemOrder::kRelaxed);
        im->ckpt_taken.Store(0, MemOrder::kRelaxed);
        PublishNeed(im);
      }
    } hold(im);
    u64 covered;
    if (im->journal != nullptr) {
      // Close the open journal entry if it holds applied commits, so that it can
      // be covered (below) rather than replayed at the next mount.
      u64 applied;
      {
        MutexLock c(im->state_mu);
        applied = im->applied_seq;
      }
      if (im->journal->next_seq() <= applied) TFS_TRY(im->journal->Flush());
    }
    {
      // Not commit_mu: a committer may be waiting for journal room while holding
      // it, and this checkpoint is what makes room.
      MutexLock c(im->state_mu);
      // After a failed apply the trees hold part of a transaction: never persist
      // that (replay of the journal applies the whole of it instead).
      if (!im->failed.ok()) return im->failed;
      // The roots block will claim every journal entry up to `covered`: each must
      // be fully applied before the images below are taken, and no later commit
      // may join it. Commits are serialized and their seqs never decrease, so
      // entries before applied_seq are complete; entry applied_seq itself is only
      // if no commit is in flight and the journal has moved past it (else a commit
      // could still land in it after this snapshot and be skipped by replay).
      // Claiming one entry less is always safe: replay applies it again, and
      // applying an entry's updates again in order is idempotent.
      covered = im->applied_seq;
      if (covered > 0 && im->journal != nullptr && (im->committing || im->journal->next_seq() <= covered))
        covered--;
    }
    Vector<Job> jobs;
    Vector<NodePtrFormat> to_free;
    struct Reserved {  // ReserveSlots' buckets go back on every path
      Impl* im;
      ~Reserved() { ReturnReserved(im); }
    } reserved{im};
    Status st;
    Roots roots = *roots_out;
    // Phase 1: dirty leaves, each under its own lock, the tree lock shared.
    for (u32 id = 0; id < kNrBtreeIds && st.ok(); id++) {
      Tree& t = im->trees[id];
      Vector<CachedNode*> leaves;
      {
        ReadGuard g(t.lock);
        if (t.root != nullptr) CollectDirtyLeaves(t.root, &leaves);
        for (CachedNode* n : leaves) Ref(n);
      }
      for (CachedNode* n : leaves) {
        if (st.ok()) {
          ReadGuard g(t.lock);
          if (n->dead.Load() == 0) {
            n->lock.ReadLock();
            if (n->dirty.Load(MemOrder::kRelaxed) != 0) {
              st = TakeImage(im, t, n, &jobs);
            }
            n->lock.ReadUnlock();
          }
        }
        Unref(n);
      }
    }
    // Slots for the images taken, and a reserve for the exclusive phase.
    for (usize i = 0; i < jobs.size() && st.ok(); i++) {
      NodePtrFormat s = jobs[i].dst;
      st = AllocSlot(im, &s);
      if (st.ok()) {
        jobs[i].dst.member = s.member;
        jobs[i].dst.offset = s.offset;
      }
    }
    // Phase 2: per tree, exclusive: install, then image interior and new nodes.
    for (u32 id = 0; id < kNrBtreeIds && st.ok(); id++) {
      Tree& t = im->trees[id];
      // Buckets are reserved only when the slots at hand (holes, the open
      // bucket's rest, reserved buckets) do not cover the exclusive set, and
      // then with room for structure that changes before we lock.
      bool reserve = false;
      for (;;) {
        u64 need = 0;
        {
          ReadGuard g(t.lock);
          if (t.root != nullptr) {
            Vector<CachedNode*> v;
            st = CollectExclusive(t.root, &v).status();
            need = v.size() + (reserve ? 1 + 2 * kMaxLevel : 0);
          }
        }
        if (st.ok() && need > 0 && AvailSlots(im) < need) {
          if (!reserve) need += 1 + 2 * kMaxLevel;
          reserve = true;
          st = ReserveSlots(im, need);
        }
        if (!st.ok()) break;
        WriteGuard g(t.lock);
        for (Job& j : jobs)
          if (j.tree == &t && !j.installed) Install(im, j, j.dst, &to_free);
        Vector<CachedNode*> v;
        if (t.root != nullptr) st = CollectExclusive(t.root, &v).status();
        if (!st.ok()) break;
        if (v.size() > AvailSlots(im)) {  // grew meanwhile: reserve more
          reserve = true;
          continue;
        }
        for (CachedNode* n : v) {
          // The slot first: taking the image clears the node's dirty flag.
          NodePtrFormat s = EmptyPtr(u8(id));
          st = AllocSlot(im, &s, false);
          if (!st.ok()) break;
          st = TakeImage(im, t, n, &jobs);
          if (!st.ok()) break;  // (the filesystem fails: the slot stays unused)
          Install(im, jobs.back(), s, &to_free);
        }
        for (const NodePtrFormat& d : t.dead_slots) to_free.PushBack(d).IgnoreError();
        t.dead_slots.Clear();
        roots.roots[id] = t.root != nullptr ? t.root->ptr : EmptyPtr(u8(id));
        break;
      }
    }
    // Nothing new since the last roots block: write nothing.
    if (st.ok() && jobs.empty() && to_free.empty() && covered <= roots_out->journal_seq) {
      return Status::Ok();
    }
    // Phase 3, no locks: write-ahead (the journal holds everything the images
    // contain), node writes, flush, roots block.
    if (st.ok() && im->journal != nullptr) st = im->journal->Flush();
    dev::DevMask written = 0;
    if (st.ok() && !jobs.empty()) {
      dev::Io* ios = static_cast<dev::Io*>(platform::Alloc(sizeof(dev::Io) * jobs.size(), 16, false));
      if (ios == nullptr) st = Err::kNoMemory;
      if (st.ok()) {
        for (usize i = 0; i < jobs.size(); i++) new (&ios[i]) dev::Io();
        dev::IoBatch batch(u32(jobs.size()));
        for (usize i = 0; i < jobs.size(); i++) {
          dev::Io& io = ios[i];
          io.req.op = IoOp::kWrite;
          io.req.origin = IoOrigin::kBtree;
          io.req.offset = jobs[i].dst.offset.get();
          io.req.length = jobs[i].bytes;
          io.req.buf = jobs[i].img;
          io.cls = dev::IoClass::kBtree;
          io.done = dev::IoBatch::Done;
          io.caller_data = &batch;
          written |= dev::DevMask(1) << jobs[i].dst.member;
          im->ctr.node_writes.FetchAdd(1, MemOrder::kRelaxed);
          im->ctr.node_write_bytes.FetchAdd(jobs[i].bytes, MemOrder::kRelaxed);
        }
        for (usize i = 0; i < jobs.size(); i++) im->devs->member(jobs[i].dst.member)->queue().Submit(&ios[i]);
        st = batch.Wait();
        for (usize i = 0; i < jobs.size(); i++) ios[i].~Io();
        platform::Free(ios);
      }
    }
    for (u32 m = 0; m < im->sb.nr_members && st.ok(); m++) {
      if ((written & (dev::DevMask(1) << m)) == 0) continue;
      st = dev::QueueSyncIo(im->devs->member(m)->queue(), IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kBtree);
    }
    if (st.ok()) {
      roots.gen = roots_out->gen + 1;
      roots.journal_seq = Max(covered, roots_out->journal_seq);
      st = WriteRootsBlock(*im->devs, im->sb, roots);
    }
    for (Job& j : jobs) {
      platform::Free(j.img);
      Unref(j.node);
    }
    if (!st.ok()) {
      // The images are not durable; the previous roots block still stands. The
      // nodes were marked clean: the filesystem must not go on as if they were.
      MutexLock c(im->state_mu);
      if (im->failed.ok()) im->failed = st;
      return st;
    }
    *roots_out = roots;
    // Entries written from now on record this roots block as durable: a mount
    // that finds an older one (this one damaged) knows it (Store::Open).
    if (im->journal != nullptr) im->journal->NoteRootsGen(roots.gen);
    for (const NodePtrFormat& s : to_free) FreeSlot(im, s);
    PurgeHoles(im);  // those of the buckets just freed
    // The journal up to `covered` is no longer needed.
    if (im->journal != nullptr) {
      MutexLock c(im->state_mu);
      if (im->pin.active && im->pin.seq <= covered) {
        // Entries after `covered` still matter: applied ones, and the entry of a
        // commit in flight (which relied on this pin when it started). The new
        // pin is taken before the old one is dropped: in between, an entry the
        // journal writes would record a last_seq past them, and replay would
        // start after them (CheckpointsRacingCommitsLoseNothing).
        journal::Pin next;
        const bool needed = im->applied_seq > covered || im->committing;
        const Status pst = needed ? im->journal->PinAt(&next, covered + 1) : Status::Ok();
        if (pst.ok()) {
          im->journal->PinDrop(&im->pin);
          im->pin = next;  // inactive if nothing after `covered` needs it
        } else {
          // Keep the old pin: it holds those entries too (and older ones).
          platform::Log(platform::LogLevel::kWarn, "btree: journal pin not moved: %s", pst.Message());
        }
      }
    }
    im->ctr.checkpoints.FetchAdd(1, MemOrder::kRelaxed);
    return Status::Ok();
  }

  // --- writer thread --------------------------------------------------------------

  // Journal ring room (lock-free hint): the writer checkpoints once half of the
  // ring is held, commits wait once three quarters are -- and, on small rings,
  // while fewer free buckets remain than a checkpoint's write-ahead flush entry
  // could need beside the reserve -- so the journal never fills with commits
  // that flush would need room for.
  static bool JournalBelow(Impl* im, u32 num, u32 den, u32 min_free) {
    if (im->journal == nullptr) return false;
    u32 free, ring;
    im->journal->Room(&free, &ring);
    if (ring == 0) return false;
    return u64(free) * den < u64(ring) * num || free < min_free;
  }

  // Whether the journal needs room that the trees hold (their pin is set).
  static bool JournalNeedsRoom(Impl* im) {
    bool pinned;
    {
      MutexLock c(im->state_mu);
      pinned = im->pin.active;
    }
    return pinned && JournalBelow(im, 1, 2, 4);
  }

  static void WriterMain(void* arg);

  // --- damaged nodes (Options::drop_bad_nodes; docs/design/fsck.md) --------------

  // Kills an unlinked chain of new nodes (each the only child of the one above).
  static void KillChain(Impl* im, Tree& t, CachedNode* n) {
    while (n != nullptr) {
      CachedNode* next = n->children.size() > 0 ? n->children[0] : nullptr;
      Kill(im, t, n);
      n = next;
    }
  }

  // What takes a dropped node's place: an empty leaf covering [min, max] and,
  // for a node of `level` > 0, one empty interior node per level above it, each
  // with the one below as its only child. Charged and dirty; *out is the top.
  static Status MakeEmptySubtree(Impl* im, Tree& t, u8 level, const Pos& min, const Pos& max, CachedNode** out) {
    CachedNode* n = nullptr;
    TFS_TRY(MakeNode(im, t.id, 0, min, max, nullptr, 0, &n));
    Charge(im, n);
    for (u32 l = 1; l <= level; l++) {
      CachedNode* p = nullptr;
      Status st = MakeNode(im, t.id, u8(l), min, max, nullptr, 0, &p);
      if (st.ok()) {
        const Edit e{max, &n->ptr, n};
        st = RebuildInterior(im, p, &e, 1);
        if (!st.ok()) {
          ClearDirty(im, p);
          im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);  // (MakeNode's)
          platform::Delete(p);
        }
      }
      if (!st.ok()) {
        KillChain(im, t, n);
        return st;
      }
      Charge(im, p);
      n = p;
    }
    *out = n;
    return Status::Ok();
  }

  // Records a node dropped at open (and says so in the log).
  static Status NoteLost(Impl* im, const Tree& t, const NodePtrFormat& p, const Pos& min, const Pos& max,
                         const Diag& why, const Status& st) {
    LostNode ln;
    ln.btree_id = t.id;
    ln.level = p.level;
    ln.min = min;
    ln.max = max;
    ln.ptr = p;
    if (why.empty()) {
      (void)DiagError(&ln.why, st, "%s", st.Message());
    } else {
      ln.why = why;
    }
    if (p.member == kNoMember) {
      platform::Log(platform::LogLevel::kWarn, "btree %u: rebuilding the tree from a node scan: %s", unsigned(t.id),
                    ln.why.text);
    } else {
      platform::Log(platform::LogLevel::kWarn,
                    "btree %u: dropping the damaged level-%u node at member %u offset %llu: %s", unsigned(t.id),
                    unsigned(p.level), unsigned(p.member), (unsigned long long)p.offset.get(), ln.why.text);
    }
    TFS_TRY(im->lost.PushBack(ln));
    im->s_dropped++;
    return Status::Ok();
  }

  // A part of a lost range no copy has covered yet.
  struct Gap {
    u8 id;
    u32 lost;  // index in im->lost
    Pos lo, hi;
  };
  // A valid leaf of this filesystem in a slot no pointer names.
  struct Copy {
    u8 member;
    u8 id;
    u64 offset;
    u64 journal_seq;  // the newest entry its sets hold: copies newer first
    Pos min, max;
  };

  static bool Overlaps(const Pos& a_lo, const Pos& a_hi, const Pos& b_lo, const Pos& b_hi) {
    return !(a_hi < b_lo || b_hi < a_lo);
  }

  // Whether [lo, hi] of tree id overlaps a part of a lost range still uncovered.
  static bool Wanted(const Vector<Gap>& gaps, u8 id, const Pos& lo, const Pos& hi) {
    for (const Gap& g : gaps)
      if (g.id == id && Overlaps(g.lo, g.hi, lo, hi)) return true;
    return false;
  }

  // Reads `len` bytes at `off` of member m into buf (no lock held): a node,
  // or a whole bucket for the node scan.
  static Status ReadRaw(Impl* im, u32 m, u64 off, u32 len, u8* buf) {
    dev::Io io;
    io.req.op = IoOp::kRead;
    io.req.origin = IoOrigin::kBtree;
    io.req.offset = off;
    io.req.length = len;
    io.req.buf = buf;
    io.cls = dev::IoClass::kForegroundSync;
    return dev::SubmitAndWait(im->devs->member(m)->queue(), &io);
  }

  // The node scan: every node slot of a member that may hold btree nodes, in
  // buckets the allocator calls free or btree, that no pointer of the trees
  // names (`used`, per member, sorted) and holds a valid leaf of this
  // filesystem overlapping a lost range is a candidate copy.
  static Status ScanCopies(Impl* im, const Vector<u64>* used, const Vector<Gap>& gaps, Vector<Copy>* copies) {
    const u32 ns = im->node_size;
    const u32 bs = im->sb.bucket_size;
    u8* buf = static_cast<u8*>(platform::Alloc(bs, 4096, false));
    Node* node = platform::New<Node>();
    if (buf == nullptr || node == nullptr) {
      platform::Free(buf);
      platform::Delete(node);
      return Err::kNoMemory;
    }
    Status st;
    for (u32 m = 0; m < im->sb.nr_members && st.ok(); m++) {
      if ((im->capable & (dev::DevMask(1) << m)) == 0) continue;
      const Vector<u64>& u = used[m];
      usize ui = 0;  // first used offset >= this bucket's
      for (u64 b = 0; b < im->sb.members[m].nbuckets && st.ok(); b++) {
        const alloc::BucketState state = im->alloc->Get(m, b).state;
        if (state != alloc::BucketState::kFree && state != alloc::BucketState::kBtree) continue;
        const u64 base = sb::kBucketsOffset + b * bs;
        Status rd = ReadRaw(im, m, base, bs, buf);
        if (!rd.ok()) {
          // It may hold the copy that matters: no repair from a partial scan.
          platform::Log(platform::LogLevel::kError, "btree: node scan: member %u bucket %llu unreadable: %s", m,
                        (unsigned long long)b, rd.Message());
          st = rd;
          break;
        }
        for (u32 s = 0; s < im->slots_per_bucket; s++) {
          const u64 off = base + u64(s) * ns;
          while (ui < u.size() && u[ui] < off) ui++;
          if (ui < u.size() && u[ui] == off) continue;  // the trees' own node
          const u8* p = buf + usize(s) * ns;
          const auto* h = reinterpret_cast<const NodeHeader*>(p);
          if (h->magic.get() != kNodeMagic) continue;
          im->s_scanned++;
          if (MemCompare(h->fs_uuid, im->sb.fs_uuid, sizeof(h->fs_uuid)) != 0 || h->level != 0 ||
              h->btree_id >= kNrBtreeIds)
            continue;
          const u8 id = h->btree_id;
          const Pos lo{id, h->min_inode.get(), h->min_offset.get()};
          const Pos hi{id, h->max_inode.get(), h->max_offset.get()};
          if (!Wanted(gaps, id, lo, hi)) continue;
          Diag d;
          if (!node->Parse(p, ns, nullptr, &d).ok()) continue;  // checksums: damaged or torn
          u64 js = 0;
          for (u32 i = 0; i < node->nsets(); i++) js = Max(js, node->set(i).journal_seq());
          st = copies->PushBack(Copy{u8(m), id, off, js, node->info().min, node->info().max});
          if (!st.ok()) break;
        }
      }
    }
    platform::Delete(node);
    platform::Free(buf);
    return st;
  }

  // A copy keys were taken from stays as it is until the roots block that no
  // longer needs it is durable (a cut during the repair leaves the old roots,
  // and the next fsck needs the same copies): its slot counts as live and as
  // used (no hole, its bucket not freed, and the allocation rebuild marks it
  // through the tree's dead slots, Btrees::ForEachSlot), and is released by
  // the checkpoint's end like the slot of any node it replaced.
  static Status KeepCopy(Impl* im, const Copy& c, Vector<u64>* used) {
    NodePtrFormat p{};
    p.member = c.member;
    p.btree_id = c.id;
    p.offset.set(c.offset);
    Tree& t = im->trees[c.id];
    TFS_TRY(t.dead_slots.PushBack(p));
    TFS_TRY(used[c.member].PushBack(c.offset));
    im->live[c.member][im->sb.BucketOf(c.offset)]++;
    return Status::Ok();
  }

  // Fills the ranges of the dropped nodes from the newest copies the node scan
  // finds: each position of a lost range takes its keys from the newest copy
  // (by the journal entries its sets hold) whose range covers it. Applied as
  // replay applies keys, before the journal's own replay (newer still).
  static Status RecoverLost(Impl* im, Vector<u64>* used) {
    Vector<Gap> gaps;
    for (u32 i = 0; i < im->lost.size(); i++)
      TFS_TRY(gaps.PushBack(Gap{im->lost[i].btree_id, i, im->lost[i].min, im->lost[i].max}));
    for (u32 m = 0; m < im->sb.nr_members; m++)
      Sort(used[m].data(), used[m].size(), [](u64 a, u64 b) { return a < b; });
    Vector<Copy> copies;
    TFS_TRY(ScanCopies(im, used, gaps, &copies));
    im->s_copies = copies.size();
    Sort(copies.data(), copies.size(), [](const Copy& a, const Copy& b) {
      return a.journal_seq != b.journal_seq ? a.journal_seq > b.journal_seq : a.offset < b.offset;
    });
    u8* buf = static_cast<u8*>(platform::Alloc(im->node_size, 4096, false));
    Node* node = platform::New<Node>();
    Status st = buf != nullptr && node != nullptr ? Status::Ok() : Status(Err::kNoMemory);
    for (usize ci = 0; ci < copies.size() && st.ok() && !gaps.empty(); ci++) {
      const Copy& c = copies[ci];
      if (!Wanted(gaps, c.id, c.min, c.max)) continue;
      Diag d;
      if (!ReadRaw(im, c.member, c.offset, im->node_size, buf).ok() ||
          !node->Parse(buf, im->node_size, nullptr, &d).ok())
        continue;
      Vector<Gap> left;
      bool used_copy = false;
      for (usize gi = 0; gi < gaps.size() && st.ok(); gi++) {
        const Gap g = gaps[gi];
        if (g.id != c.id || !Overlaps(g.lo, g.hi, c.min, c.max)) {
          st = left.PushBack(g);
          continue;
        }
        const Pos a = g.lo < c.min ? c.min : g.lo;
        const Pos b = c.max < g.hi ? c.max : g.hi;
        LostNode& ln = im->lost[g.lost];
        NodeIter it(*node);
        for (it.Seek(a); it.Valid() && it.pos() <= b && st.ok(); it.Next()) {
          const KeyRef k = it.key();
          KeyInput in;
          in.pos = it.pos();
          in.type = kKeyValue;
          in.value = k.value();
          in.val_bytes = k.val_bytes();
          st = ApplyKey(im, in, c.journal_seq);
          if (!st.ok()) break;
          ln.recovered_keys++;
          im->s_recovered++;
        }
        if (st.ok() && !used_copy) {
          st = KeepCopy(im, c, used);
          used_copy = true;
        }
        ln.copies++;
        ln.newest_copy_seq = Max(ln.newest_copy_seq, c.journal_seq);
        if (st.ok() && g.lo < a) st = left.PushBack(Gap{g.id, g.lost, g.lo, Pred(a)});
        if (st.ok() && b < g.hi) st = left.PushBack(Gap{g.id, g.lost, Succ(b), g.hi});
      }
      if (st.ok()) gaps = Move(left);
    }
    platform::Delete(node);
    platform::Free(buf);
    TFS_TRY(st);
    for (u32 i = 0; i < im->lost.size(); i++) {
      bool covered = true;
      for (const Gap& g : gaps) covered = covered && g.lost != i;
      im->lost[i].fully_covered = covered;
    }
    return Status::Ok();
  }
};

// ---------------------------------------------------------------------------
// Btrees.

u64 DefaultCacheBytes() {
  const u64 mem = platform::MemoryBytes();
  if (mem == 0) return 256ull << 20;
  return Max<u64>(mem / 8, 64ull << 20);
}

Btrees::Btrees() = default;

Btrees::~Btrees() {
  Close().IgnoreError();
}

static void FreeSubtree(CachedNode* n) {
  for (usize i = 0; i < n->children.size(); i++)
    if (n->children[i] != nullptr) FreeSubtree(n->children[i]);
  TreeOps::Unref(n);
}

Status Btrees::Open(dev::DeviceSet* devs, alloc::Allocator* alloc, const sb::Superblock& sb, const Roots& roots,
                    const Options& options, Diag* diag) {
  if (impl_ != nullptr) return Err::kInvalidArgument;
  const u32 ns = sb.btree_node_size;
  if (options.node_size != 0 && options.node_size != ns)
    return DiagError(diag, Err::kInvalidArgument, "btree: node size %u does not match the filesystem's %u",
                     options.node_size, ns);
  if (ns < kMinNodeSize || ns > kMaxNodeSize || sb.bucket_size < ns)
    return DiagError(diag, Err::kInvalidArgument, "btree: node size %u does not fit buckets of %u", ns,
                     sb.bucket_size);
  Impl* im = platform::New<Impl>();
  if (im == nullptr) return Err::kNoMemory;
  impl_ = im;
  im->devs = devs;
  im->alloc = alloc;
  im->sb = sb;
  im->opt = options;
  if (im->opt.cache_bytes == 0) im->opt.cache_bytes = DefaultCacheBytes();
  im->node_size = ns;
  node_size_ = ns;
  im->slots_per_bucket = sb.bucket_size / ns;
  platform::RandomBytes(&im->rng, sizeof(im->rng));
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (HoldsBtree(sb, m)) im->capable |= dev::DevMask(1) << m;
    Status st = im->live[m].Resize(sb.members[m].nbuckets);
    if (!st.ok()) return st;
    for (usize b = 0; b < im->live[m].size(); b++) im->live[m][b] = 0;
  }
  im->target = im->capable;
  if (sb.options.metadata_target[0] != '\0') {
    auto r = devs->ResolveTarget(sb.options.metadata_target);
    if (r.ok() && (r.value() & im->capable) != 0) im->target = r.value() & im->capable;
  }
  roots_ = roots;
  bool root_read[kNrBtreeIds] = {};
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    t.id = u8(id);
    const NodePtrFormat& rp = roots.roots[id];
    if (options.rebuild_from_scan) {
      Diag why;
      (void)DiagError(&why, Err::kCorrupt, "the roots block naming its root is lost");
      TFS_TRY(TreeOps::NoteLost(im, t, rp, Pos::Min(u8(id)), Pos::Max(u8(id)), why, Err::kCorrupt));
      TFS_TRY(TreeOps::MakeEmptySubtree(im, t, 0, Pos::Min(u8(id)), Pos::Max(u8(id)), &t.root));
      continue;
    }
    if (rp.member == kNoMember) continue;
    CachedNode* r = nullptr;
    Diag why;
    Status st = TreeOps::ReadNode(im, rp, Pos::Max(u8(id)), &r, &why);
    if (!st.ok() && options.drop_bad_nodes && Droppable(st)) {
      TFS_TRY(TreeOps::NoteLost(im, t, rp, Pos::Min(u8(id)), Pos::Max(u8(id)), why, st));
      // A leaf root: the recovered keys grow the tree again.
      TFS_TRY(TreeOps::MakeEmptySubtree(im, t, 0, Pos::Min(u8(id)), Pos::Max(u8(id)), &t.root));
      continue;
    }
    if (!st.ok()) {
      return DiagError(diag, st, "btree %u root (member %u, offset %llu): %s", id, unsigned(rp.member),
                       (unsigned long long)rp.offset.get(), why.empty() ? st.Message() : why.text);
    }
    t.root = r;
    root_read[id] = true;
    TreeOps::Charge(im, r);
  }
  // Every slot the trees use, reading interior nodes (they stay cached).
  // Their offsets, per member, for FindHoles (read-write mounts): all of
  // them or none (without memory, no holes; a partial list would make holes
  // of used slots).
  struct Used {
    Vector<u64> v[dev::kMaxDevices];
    bool ok = true;
    void Add(u32 m, u64 off) {
      if (ok && !v[m].PushBack(off).ok()) ok = false;
    }
  } used;
  struct Walk {
    // Counts slot `off` of member m as live (and used).
    static Status Count(Impl* im, u32 m, u64 off, Used* used, Diag* diag) {
      const u64 b = im->sb.BucketOf(off);
      if (++im->live[m][b] > im->slots_per_bucket)
        return DiagError(diag, Err::kCorrupt, "btree: more nodes than fit in bucket %llu of member %u",
                         (unsigned long long)b, m);
      if (used != nullptr) used->Add(m, off);
      return Status::Ok();
    }
    // `drop` (Options::drop_bad_nodes): leaves are read and verified too, and
    // a child that fails is replaced by an empty subtree.
    static Status Visit(Impl* im, Tree& t, CachedNode* n, Used* used, bool drop, Diag* diag) {
      const NodePtrFormat& p = n->ptr;
      TFS_TRY(Count(im, p.member, p.offset.get(), used, diag));
      if (n->node.info().level == 0) return Status::Ok();
      Vector<u32> bad;  // children dropped
      const Set& s = n->node.set(0);
      for (u32 i = 0; i < s.size(); i++) {
        NodePtrFormat cp = ReadPtr(s.Key(i));
        const Pos cmax = s.Key(i).pos();
        if (cp.level == 0 && !drop) {
          const u64 cb = im->sb.BucketOf(cp.offset.get());
          const u64 off = cp.offset.get();
          if (off < sb::kBucketsOffset || off % im->node_size != 0 || cb >= im->live[cp.member].size())
            return DiagError(diag, Err::kCorrupt, "btree: leaf pointer outside the btree area");
          TFS_TRY(Count(im, cp.member, off, used, diag));
          continue;
        }
        CachedNode* c = nullptr;
        Diag why;
        Status st = TreeOps::ReadNode(im, cp, cmax, &c, &why);
        if (!st.ok() && drop && Droppable(st)) {
          TFS_TRY(TreeOps::NoteLost(im, t, cp, PtrMin(cp), cmax, why, st));
          TFS_TRY(bad.PushBack(i));
          continue;
        }
        if (!st.ok()) {
          if (diag != nullptr) *diag = why;
          return st;
        }
        if (cp.level == 0) {  // verified; read again when used
          platform::Delete(c);
          TFS_TRY(Count(im, cp.member, cp.offset.get(), used, diag));
          continue;
        }
        c->parent = n;
        n->children[i] = c;
        TreeOps::Charge(im, c);
        TFS_TRY(Visit(im, t, c, used, drop, diag));
      }
      if (bad.empty()) return Status::Ok();
      // The replacements, linked in one rebuild of n (which moves its keys).
      Vector<TreeOps::Edit> edits;
      TFS_TRY(edits.Reserve(bad.size()));
      Status st;
      for (u32 i : bad) {
        const NodePtrFormat cp = ReadPtr(s.Key(i));
        CachedNode* sub = nullptr;
        st = TreeOps::MakeEmptySubtree(im, t, cp.level, PtrMin(cp), s.Key(i).pos(), &sub);
        if (!st.ok()) break;
        edits.PushBack(TreeOps::Edit{s.Key(i).pos(), &sub->ptr, sub}).IgnoreError();  // reserved
      }
      if (st.ok()) st = TreeOps::RebuildInterior(im, n, edits.data(), u32(edits.size()));
      if (!st.ok()) {
        for (const TreeOps::Edit& e : edits) TreeOps::KillChain(im, t, e.child);
      }
      return st;
    }
  };
  const bool collect = !options.read_only || options.drop_bad_nodes;
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    if (root_read[id])
      TFS_TRY(Walk::Visit(im, im->trees[id], im->trees[id].root, collect ? &used : nullptr, options.drop_bad_nodes,
                          diag));
  }
  if (!im->lost.empty()) {
    if (!used.ok) return Err::kNoMemory;
    TFS_TRY(TreeOps::RecoverLost(im, used.v));
  }
  TreeOps::PublishNeed(im);
  if (!options.read_only) {
    // Buckets a crash left allocated to an unfinished checkpoint are freed; a
    // bucket the trees use is marked as btree (replay already did, normally).
    for (u32 m = 0; m < sb.nr_members; m++) {
      for (u64 b = 0; b < im->live[m].size(); b++) {
        alloc::Bucket bk = alloc->Get(m, b);
        if (im->live[m][b] != 0 && bk.state != alloc::BucketState::kBtree) {
          platform::Log(platform::LogLevel::kWarn, "btree: member %u bucket %llu holds nodes but was %s", m,
                        (unsigned long long)b, alloc::BucketStateName(bk.state));
          TFS_TRY(alloc->RepairState(m, b, alloc::BucketState::kBtree));
        } else if (im->live[m][b] == 0 && bk.state == alloc::BucketState::kBtree) {
          TFS_TRY(alloc->Free(alloc::BucketRef{m, b, bk.gen}));
        }
      }
    }
    if (used.ok) TreeOps::FindHoles(im, used.v);
    TreeOps::PublishNeed(im);
  }
  {
    MutexLock c(im->state_mu);
    im->applied_seq = roots.journal_seq;
  }
  lost_ = Move(im->lost);
  im->opened = true;
  // (A platform that cannot take the hook leaves the cache at its bound.)
  Status sh = im->shrinker.Register(&TreeOps::ShrinkCount, &TreeOps::ShrinkScan, im, "btree-cache");
  if (!sh.ok())
    platform::Log(platform::LogLevel::kWarn, "btree: no memory-pressure hook for the node cache: %s", sh.Message());
  return Status::Ok();
}

void Btrees::AttachJournal(journal::Journal* journal) {
  Impl* im = impl_;
  if (im == nullptr) return;
  im->journal = journal;
  if (im->opt.writer_thread && journal != nullptr && !im->writer_running) {
    im->stop = false;
    if (im->writer.Start(TreeOps::WriterMain, this, "tfs-btree-writer").ok()) im->writer_running = true;
  }
}

void TreeOps::WriterMain(void* arg) {
  auto* self = static_cast<Btrees*>(arg);
  Impl* im = self->impl_;
  MutexLock l(im->wmu);
  while (!im->stop) {
    const bool memory = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size > im->opt.cache_bytes / 2;
    const bool room = JournalNeedsRoom(im);
    // Space: the metadata member is down to the btree's growth room (user data
    // at its floor): write the dirty nodes so that the need drops
    // (docs/design/space.md).
    const bool space = im->dirty_nodes.Load(MemOrder::kRelaxed) > 0 && im->alloc->MetadataTight();
    if (!im->wake && !memory && !room && !space) {
      if (!im->merge_queue.empty()) {
        im->wmu.Unlock();
        MergeQueued(im);
        im->wmu.Lock();
        continue;
      }
      (void)im->wcv.WaitFor(im->wmu, 100 * platform::kNsPerMs);
      continue;
    }
    im->wake = false;
    im->wmu.Unlock();
    // The allocator's pin holds the journal too: checkpoint it as well when the
    // journal needs room (journal reclaim would, once the ring is full).
    Status st = room ? im->alloc->CheckpointForRoom(true) : Status::Ok();
    if (st.ok()) st = self->Checkpoint();
    // Make the ring space the checkpoints released reusable at once.
    if (st.ok() && im->journal != nullptr) st = im->journal->AdvanceLastSeq();
    if (!st.ok()) platform::Log(platform::LogLevel::kError, "btree: checkpoint failed: %s", st.Message());
    EvictIfNeeded(im);
    im->wmu.Lock();
    im->ckpt_done++;
    im->done_cv.Broadcast();
    // Do not spin when a checkpoint cannot help (or failed).
    if (!st.ok() || (room && !memory && JournalBelow(im, 1, 2, 4)) || (space && !room && !memory))
      (void)im->wcv.WaitFor(im->wmu, (st.ok() ? 100 : 1000) * platform::kNsPerMs);
  }
}

void Btrees::ReclaimHook(void* self, u64) {
  auto* b = static_cast<Btrees*>(self);
  Impl* im = b->impl_;
  if (im == nullptr) return;
  MutexLock l(im->wmu);
  im->wake = true;
  im->wcv.Signal();
}

Status Btrees::Checkpoint() {
  if (impl_ == nullptr) return Err::kInvalidArgument;
  return TreeOps::RunCheckpoint(impl_, &roots_);
}

Status Btrees::Close() {
  Impl* im = impl_;
  if (im == nullptr) return Status::Ok();
  im->shrinker.Unregister();  // returns once no scan runs
  if (im->writer_running) {
    {
      MutexLock l(im->wmu);
      im->stop = true;
      im->wcv.Signal();
    }
    im->writer.Join();
    im->writer_running = false;
  }
  TreeOps::DropMergeQueue(im);
  Status st;
  // Nothing commits any more, so this checkpoint covers every journal entry (a
  // clean filesystem is mounted without replay).
  if (!im->opt.read_only && im->opened) st = Checkpoint();
  if (st.ok() && !im->opt.read_only) TreeOps::ReleaseOpenBucket(im);
  if (im->journal != nullptr && im->pin.active) im->journal->PinDrop(&im->pin);
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    if (t.root != nullptr) FreeSubtree(t.root);
    t.root = nullptr;
  }
  platform::Delete(im);
  impl_ = nullptr;
  return st;
}

Status Btrees::ApplyReplayed(u64 seq, const journal::Key& key) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  if (seq <= roots_.journal_seq) return Status::Ok();  // the trees already hold it
  if (key.len < sizeof(KeyHeader)) return Err::kCorrupt;
  const auto* h = static_cast<const KeyHeader*>(key.val);
  KeyInput in;
  in.pos = KeyRef(h).pos();
  in.type = h->type;
  in.val_bytes = h->val_bytes.get();
  in.value = h + 1;
  if (in.pos.btree_id >= kNrBtreeIds || (in.type != kKeyValue && in.type != kKeyWhiteout) ||
      in.val_bytes > kMaxValueBytes || KeySpace(in.val_bytes) > key.len ||
      (in.type == kKeyWhiteout && in.val_bytes != 0))
    return Err::kCorrupt;
  TFS_TRY(TreeOps::ApplyKey(im, in, seq));
  TreeOps::MaybeEvict(im);
  MutexLock c(im->state_mu);
  if (seq > im->applied_seq) im->applied_seq = seq;
  return Status::Ok();
}

Status Btrees::Get(const Pos& pos, Vector<u8>* value) {
  for (;;) {
    u8 small[64];
    auto r = Get(pos, small, sizeof(small));
    if (!r.ok()) return r.status();
    TFS_TRY(value->Resize(r.value()));
    if (r.value() <= sizeof(small)) {
      MemCopy(value->data(), small, r.value());
      return Status::Ok();
    }
    auto r2 = Get(pos, value->data(), u32(value->size()));
    if (!r2.ok()) return r2.status();
    if (r2.value() == value->size()) return Status::Ok();
    // Changed size in between: again.
  }
}

Result<u32> Btrees::Get(const Pos& pos, void* buf, u32 cap) {
  Impl* im = impl_;
  if (im == nullptr || pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  Tree& t = im->trees[pos.btree_id];
  im->ctr.lookups.FetchAdd(1, MemOrder::kRelaxed);
  for (;;) {
    TreeOps::Miss miss;
    t.lock.ReadLock();
    if (t.root == nullptr) {
      t.lock.ReadUnlock();
      return Err::kNotFound;
    }
    CachedNode* leaf = TreeOps::Descend(im, t, pos, 0, &miss);
    if (leaf != nullptr) im->c_hits.FetchAdd(1, MemOrder::kRelaxed);
    if (leaf == nullptr) {
      t.lock.ReadUnlock();
      TFS_TRY(TreeOps::FetchMiss(im, t, miss));
      continue;
    }
    leaf->lock.ReadLock();
    KeyRef k = leaf->node.Find(pos);
    u32 len = 0;
    if (k.valid()) {
      len = k.val_bytes();
      MemCopy(buf, k.value(), Min(len, cap));
    }
    const bool several_sets = leaf->node.nsets() >= 2;
    leaf->lock.ReadUnlock();
    if (several_sets) TreeOps::ReadMostly(im, leaf);
    t.lock.ReadUnlock();
    TreeOps::MaybeEvict(im);
    if (!k.valid()) return Err::kNotFound;
    return len;
  }
}

Status Btrees::ForEachSlot(Status (*fn)(void* ctx, const NodePtrFormat& ptr), void* ctx) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  struct Walk {
    static Status Visit(Impl* im, const CachedNode* n, Status (*fn)(void*, const NodePtrFormat&), void* ctx) {
      if (n->ptr.member != kNoMember) TFS_TRY(fn(ctx, n->ptr));
      if (n->node.info().level == 0) return Status::Ok();
      const Set& s = n->node.set(0);
      for (u32 i = 0; i < s.size(); i++) {
        if (i < n->children.size() && n->children[i] != nullptr) {
          TFS_TRY(Visit(im, n->children[i], fn, ctx));
          continue;
        }
        const NodePtrFormat cp = ReadPtr(s.Key(i));
        if (cp.level == 0) {
          TFS_TRY(fn(ctx, cp));
          continue;
        }
        CachedNode* c = nullptr;  // evicted: read, walked, dropped
        TFS_TRY(TreeOps::ReadNode(im, cp, s.Key(i).pos(), &c, nullptr));
        Status st = Visit(im, c, fn, ctx);
        platform::Delete(c);
        TFS_TRY(st);
      }
      return Status::Ok();
    }
  };
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    if (t.root != nullptr) TFS_TRY(Walk::Visit(im, t.root, fn, ctx));
    // Slots of nodes replaced since the last roots block (and copies fsck
    // recovered from): that block still names them until the next one.
    for (const NodePtrFormat& p : t.dead_slots) TFS_TRY(fn(ctx, p));
  }
  return Status::Ok();
}


Stats Btrees::GetStats() const {
  Stats s;
  MemSet(&s, 0, sizeof(s));
  Impl* im = impl_;
  if (im == nullptr) return s;
  auto L = [](const Atomic<u64>& a) { return a.Load(MemOrder::kRelaxed); };
  TFS_COUNTER_LOAD(TFS_BTREE_COUNTERS, im->ctr, s);
  s.cache_hits = L(im->c_hits) + L(im->c_apply_hits);
  s.dropped_nodes = im->s_dropped;
  s.scanned_slots = im->s_scanned;
  s.scan_copies = im->s_copies;
  s.recovered_keys = im->s_recovered;
  s.cached_nodes = L(im->cached_nodes);
  s.cached_bytes = L(im->cached_bytes);
  s.dirty_nodes = L(im->dirty_nodes);
  s.dirty_bytes = s.dirty_nodes * im->node_size;
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    ReadGuard g(t.lock);
    s.depth[id] = t.root != nullptr ? t.root->node.info().level + 1u : 0;
  }
  return s;
}

Status Btrees::ForEachNode(Status (*fn)(void* ctx, const NodeVisit& v), void* ctx, Diag* diag) {
  // The continuing walk, stopped by the first bad node.
  struct Stop {
    Status (*fn)(void*, const NodeVisit&);
    void* ctx;
    Diag* diag;
    static Status Visit(void* c, const NodeVisit& v) {
      auto* s = static_cast<Stop*>(c);
      return s->fn(s->ctx, v);
    }
    static Status Bad(void* c, const NodeError& e) {
      return DiagError(static_cast<Stop*>(c)->diag, e.status, "%s", e.text);
    }
  };
  Stop stop{fn, ctx, diag};
  return ForEachNodeContinuing(Stop::Visit, Stop::Bad, &stop);
}

Status Btrees::ForEachNodeContinuing(Status (*fn)(void* ctx, const NodeVisit& v),
                                     Status (*bad)(void* ctx, const NodeError& e), void* ctx) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  struct Walk {
    static Status Visit(Impl* im, const NodePtrFormat& p, const Pos& max, Status (*fn)(void*, const NodeVisit&),
                        Status (*bad)(void*, const NodeError&), void* ctx) {
      CachedNode* n = nullptr;
      Diag d;
      Status st = TreeOps::ReadNode(im, p, max, &n, &d);
      if (!st.ok()) return bad(ctx, NodeError{&p, max, st, d.empty() ? st.Message() : d.text});
      NodeVisit v{&n->node, &p};
      st = fn(ctx, v);
      if (st.ok() && n->node.info().level > 0) {
        const Set& s = n->node.set(0);
        for (u32 i = 0; i < s.size() && st.ok(); i++) {
          NodePtrFormat cp = ReadPtr(s.Key(i));
          st = Visit(im, cp, s.Key(i).pos(), fn, bad, ctx);
        }
      }
      platform::Delete(n);
      return st;
    }
  };
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    const NodePtrFormat& rp = roots_.roots[id];
    if (rp.member == kNoMember) continue;
    TFS_TRY(Walk::Visit(im, rp, Pos::Max(u8(id)), fn, bad, ctx));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Transactions.

Transaction::~Transaction() = default;

void Transaction::Reset() {
  keys_.Clear();
  checks_.Clear();
  n_ = 0;
  nchecks_ = 0;
  apply_seq_ = nullptr;
}

Status Transaction::AddDataCheck(const void* check, u32 len) {
  if (len < sizeof(journal::DataCheckFormat) || len > journal::DataCheckBytes(journal::kMaxDataCheckBytes / 4096))
    return Err::kInvalidArgument;
  const usize space = journal::KeySpace(len);  // header + padded value, as in the entry
  if (JournalBytes() + space > JournalLimit()) return Err::kTooBig;
  const usize at = checks_.size();
  TFS_TRY(checks_.Grow(at + space));
  TFS_TRY(checks_.Resize(at + space));
  auto* kh = reinterpret_cast<journal::KeyHeader*>(checks_.data() + at);
  kh->type.set(journal::kKeyDataCheck);
  kh->reserved.set(0);
  kh->len.set(len);
  MemCopy(checks_.data() + at + sizeof(journal::KeyHeader), check, len);
  MemSet(checks_.data() + at + sizeof(journal::KeyHeader) + len, 0, space - sizeof(journal::KeyHeader) - len);
  nchecks_++;
  return Status::Ok();
}

usize Transaction::JournalBytes() const {
  return keys_.size() + usize(n_) * sizeof(journal::KeyHeader) + checks_.size() + sizeof(journal::EntryHeader);
}

usize Transaction::JournalLimit() const {
  const journal::Journal* j = trees_->impl_ != nullptr ? trees_->impl_->journal : nullptr;
  return j != nullptr ? j->max_entry_bytes() : journal::Config{}.max_entry_bytes;
}

Status Transaction::Set(const Pos& pos, const void* value, u32 len) {
  KeyInput in;
  in.pos = pos;
  in.type = kKeyValue;
  in.value = value;
  in.val_bytes = len;
  if (pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  TFS_TRY(CheckKeyInput(in, pos.btree_id));
  return Append(in);
}

Status Transaction::Append(const KeyInput& in) {
  // One journal commit carries the whole transaction: it must fit in an entry
  // (entry header, then an 8-byte journal key header per key).
  const usize space = KeySpace(in.val_bytes);
  if (JournalBytes() + space + sizeof(journal::KeyHeader) > JournalLimit()) return Err::kTooBig;
  const usize at = keys_.size();
  TFS_TRY(keys_.Grow(at + space));
  TFS_TRY(keys_.Resize(at + space));
  PackKey(keys_.data() + at, in);
  n_++;
  return Status::Ok();
}

Status Transaction::Delete(const Pos& pos) {
  if (pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  KeyInput in;
  in.pos = pos;
  in.type = kKeyWhiteout;
  return Append(in);
}

Result<u64> Transaction::Commit(journal::CommitMode mode, dev::DevMask deps) {
  Btrees::Impl* im = trees_->impl_;
  if (im == nullptr) {
    Reset();
    return Err::kInvalidArgument;
  }
  if (n_ == 0) {
    Reset();
    return u64(0);
  }
  // Throttle: while dirty nodes fill the cache, or the journal ring is three
  // quarters held, wait for the writer's checkpoint (no lock held).
  if (im->writer_running) {
    for (int round = 0; round < 50; round++) {
      const bool memory = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size > im->opt.cache_bytes;
      if (!memory && !TreeOps::JournalBelow(im, 1, 4, 3)) break;
      MutexLock l(im->wmu);
      if (im->stop) break;
      const u64 seen = im->ckpt_done;
      im->wake = true;
      im->wcv.Signal();
      im->ctr.throttles.FetchAdd(1, MemOrder::kRelaxed);
      while (im->ckpt_done == seen && !im->stop) (void)im->done_cv.WaitFor(im->wmu, 100 * platform::kNsPerMs);
    }
  }
  // The leaves to update are read now, before the journal commit, with no lock
  // held -- unless every node is cached (then ApplyKey cannot miss; were one
  // evicted meanwhile, ApplyKey would read it itself: slower, still correct).
  // The journal's view of the keys (kept between commits: no allocation per commit).
  Vector<journal::Key>& jkeys = jkeys_;
  const bool prefetch = im->partial.Load(MemOrder::kRelaxed) != 0;
  jkeys.Clear();
  Status st = jkeys.Reserve(n_ + nchecks_);
  for (usize off = 0; st.ok() && off < keys_.size();) {
    const auto* h = reinterpret_cast<const KeyHeader*>(keys_.data() + off);
    const u32 space = KeySpace(h->val_bytes.get());
    jkeys.PushBack(journal::Key{journal::kKeyBtree, space, h}).IgnoreError();
    if (prefetch) st = TreeOps::Prefetch(im, KeyRef(h).pos());
    off += space;
  }
  for (usize off = 0; st.ok() && off < checks_.size();) {
    const auto* kh = reinterpret_cast<const journal::KeyHeader*>(checks_.data() + off);
    jkeys.PushBack(journal::Key{journal::kKeyDataCheck, kh->len.get(), kh + 1}).IgnoreError();
    off += journal::KeySpace(kh->len.get());
  }
  if (!st.ok()) {
    Reset();
    return st;
  }
  u64 seq = 0;
  {
    MutexLock c(im->commit_mu);
    bool need_pin;
    {
      MutexLock sl(im->state_mu);
      st = im->failed;
      seq = im->applied_seq + 1;  // without a journal (tests): order only
      im->committing = true;      // see RunCheckpoint's `covered` and pin
      // The trees hold one pin, on the oldest entry not yet in a checkpoint; it
      // keeps every newer entry in the ring too. Only without one does this
      // commit pin its entry (a checkpoint that drops the pin while a commit is
      // in flight re-pins past what it covered, see RunCheckpoint).
      need_pin = !im->pin.active;
    }
    if (st.ok() && im->journal != nullptr) {
      journal::Pin local;
      auto r = im->journal->Commit(jkeys.data(), u32(jkeys.size()), deps,
                                   mode == journal::CommitMode::kFlushNext ? mode : journal::CommitMode::kNoFlush,
                                   need_pin ? &local : nullptr);
      if (!r.ok()) {
        st = r.status();
      } else {
        seq = r.value();
        if (need_pin) {
          MutexLock sl(im->state_mu);
          TFS_BUG_ON(im->pin.active);  // only this commit or a checkpoint sets it
          im->pin = local;
        }
      }
    }
    if (st.ok() && im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "commit.journaled");
    Atomic<u64>* const apply_seq = apply_seq_;
    if (apply_seq != nullptr) apply_seq->FetchAdd(1, MemOrder::kSeqCst);  // odd: applying
    for (usize i = 0; st.ok() && i < n_; i++) {  // the btree keys (data checks follow)
      const auto* h = static_cast<const KeyHeader*>(jkeys[i].val);
      KeyInput in;
      in.pos = KeyRef(h).pos();
      in.type = h->type;
      in.val_bytes = h->val_bytes.get();
      in.value = h + 1;
      st = TreeOps::ApplyKey(im, in, seq);
      BumpSerial(in.type == kKeyWhiteout ? im->ctr.deletes : im->ctr.inserts);
    }
    if (apply_seq != nullptr) apply_seq->FetchAdd(1, MemOrder::kSeqCst);  // even: applied (or failed)
    if (st.ok()) BumpSerial(im->ctr.commits);
    MutexLock sl(im->state_mu);
    im->committing = false;
    if (st.ok()) {
      im->applied_seq = seq;
    } else if (seq != 0 && im->journal != nullptr && im->failed.ok() && st.code() != Err::kTooBig) {
      // Journaled (or possibly journaled) but not fully applied: stop here.
      im->failed = st;
    }
  }
  Reset();
  TreeOps::MaybeEvict(im);
  if (!st.ok()) return st;
  if (mode == journal::CommitMode::kFlush && im->journal != nullptr) TFS_TRY(im->journal->Flush());
  return seq;
}

// ---------------------------------------------------------------------------
// Iterators: batches of keys copied from one leaf.

Iterator::Iterator(Btrees* trees, u8 btree_id, u32 first_batch)
    : trees_(trees), id_(btree_id), first_batch_(first_batch == 0 ? kIterBatchMin : Min(first_batch, kIterBatchMax)) {}

Iterator::~Iterator() {
  if (leaf_ != nullptr) TreeOps::Unref(leaf_);
}

Status Iterator::Seek(const Pos& pos) { return Move(Dir::kSeek, pos); }
Status Iterator::SeekForPrev(const Pos& pos) { return Move(Dir::kSeekForPrev, pos); }
Status Iterator::SeekToFirst() { return Move(Dir::kSeek, Pos::Min(id_)); }
Status Iterator::SeekToLast() { return Move(Dir::kSeekForPrev, Pos::Max(id_)); }

Status Iterator::Next() { return Step(true); }
Status Iterator::Prev() { return Step(false); }

Status Iterator::Step(bool forward) {
  if (!valid_) return Err::kInvalidArgument;
  // Inside the batch, while the leaf is unchanged: no lock, no search.
  const bool more = forward ? idx_ + 1 < offsets_.size() : idx_ > 0;
  if (leaf_ != nullptr && more && leaf_->version.Load(MemOrder::kAcquire) == leaf_version_) {
    SetCurrent(forward ? idx_ + 1 : idx_ - 1);
    return Status::Ok();
  }
  if (forward ? IsMax(pos_) : IsMin(pos_)) {
    valid_ = false;
    return Status::Ok();
  }
  batch_limit_ = Min<u32>(batch_limit_ * 2, kIterBatchMax);
  return Fill(forward, forward ? Succ(pos_) : Pred(pos_));
}

Status Iterator::Move(Dir dir, const Pos& pos) {
  valid_ = false;
  if (pos.btree_id != id_ || trees_->impl_ == nullptr) return Err::kInvalidArgument;
  batch_limit_ = first_batch_;
  return Fill(dir == Dir::kSeek, pos);
}

void Iterator::SetCurrent(u32 i) {
  idx_ = i;
  KeyRef k(reinterpret_cast<const KeyHeader*>(batch_.data() + offsets_[i]));
  pos_ = k.pos();
  value_ptr_ = k.value();
  value_len_ = k.val_bytes();
  valid_ = true;
}

// Copies up to batch_limit_ keys from the leaf holding `from`: the first keys >= from
// (forward) or the last keys <= from (backward), crossing to the next leaf while
// one has none.
Status Iterator::Fill(bool forward, Pos from) {
  Btrees::Impl* im = trees_->impl_;
  Btrees::Tree& t = im->trees[id_];
  valid_ = false;
  for (;;) {
    TreeOps::Miss miss;
    t.lock.ReadLock();
    if (t.root == nullptr) {
      t.lock.ReadUnlock();
      return Status::Ok();
    }
    CachedNode* leaf = TreeOps::Descend(im, t, from, 0, &miss);
    if (leaf != nullptr) im->c_hits.FetchAdd(1, MemOrder::kRelaxed);
    if (leaf == nullptr) {
      t.lock.ReadUnlock();
      TFS_TRY(TreeOps::FetchMiss(im, t, miss));
      continue;
    }
    if (leaf != leaf_) {
      TreeOps::Ref(leaf);
      if (leaf_ != nullptr) TreeOps::Unref(leaf_);
      leaf_ = leaf;
    }
    leaf->lock.ReadLock();
    leaf_version_ = leaf->version.Load(MemOrder::kAcquire);
    const NodeInfo info = leaf->node.info();
    batch_.Clear();
    offsets_.Clear();
    Status st;
    NodeIter it(leaf->node);
    u32 n = 0;
    if (forward) {
      it.Seek(from);
    } else {
      it.SeekForPrev(from);
    }
    for (; it.Valid() && n < batch_limit_ && st.ok(); n++) {
      KeyRef k = it.key();
      const usize at = batch_.size();
      st = offsets_.PushBack(u32(at));
      if (st.ok()) st = batch_.Append(reinterpret_cast<const u8*>(k.raw()), k.space());
      if (forward) {
        it.Next();
      } else {
        it.Prev();
      }
    }
    leaf->lock.ReadUnlock();
    t.lock.ReadUnlock();
    TFS_TRY(st);
    TreeOps::MaybeEvict(im);
    if (n > 0) {
      if (!forward) {  // keep the batch in ascending order
        for (u32 i = 0, j = n - 1; i < j; i++, j--) Swap(offsets_[i], offsets_[j]);
      }
      SetCurrent(forward ? 0 : n - 1);
      return Status::Ok();
    }
    // Nothing in this leaf on that side: move to the neighbour.
    if (forward) {
      if (IsMax(info.max)) return Status::Ok();
      from = Succ(info.max);
    } else {
      if (IsMin(info.min)) return Status::Ok();
      from = Pred(info.min);
    }
  }
}

}  // namespace tfs::btree
