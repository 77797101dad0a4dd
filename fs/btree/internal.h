// What the btree's own files share: the cached node, the trees' state
// (Btrees::Tree, Btrees::Impl, with what guards each field), pure helpers on
// positions and node pointers, and TreeOps, whose static functions are the
// machinery (a friend of Btrees, so they reach Impl). Each is defined, under
// the comment that says what it does, in the file its group below names;
// the few that lookups and iterators call from several files stay inline
// here. Private to fs/btree/: nothing outside it includes this header (the
// API is tree.h, which also states the lock order every file keeps).
#ifndef TFS_BTREE_INTERNAL_H_
#define TFS_BTREE_INTERNAL_H_

#include "btree/tree.h"
#include "sb/format.h"
#include "util/list.h"
#include "util/log_limit.h"

namespace tfs::btree {

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
  NodePtrFormat ptr{};            // where the node's copies are on disk (none: never written)
  CachedNode* parent = nullptr;   // null for the root
  Vector<CachedNode*> children;   // interior: the cached child of each key, or null
  Atomic<u32> refs{1};            // the tree's own reference + iterators + checkpoints
  Atomic<u64> version{0};         // bumped by every change (iterators re-read)
  // Changed since the last image. Set and cleared under the leaf lock or the
  // tree lock exclusive; the checkpoint's collection passes read it under the
  // tree lock shared, racing a committer, and check again under the leaf lock.
  Atomic<u8> dirty{0};
  u64 compacted_version = ~u64(0);  // version at which a merge check compacted it
  // A merge with this sibling built and given up (the merged node too
  // full): its size and this node's then. While the sibling is unchanged
  // the merge is not built again unless this node shrank enough for it to
  // fit (the merged size follows this node's).
  const void* merge_failed_sib = nullptr;  // (with its image's seq: an address may be reused)
  u64 merge_failed_sib_seq = 0;
  u64 merge_failed_sib_version = ~u64(0);
  u64 merge_failed_used = 0;    // the merged node's used bytes
  u64 merge_failed_n_used = 0;  // this node's then
  ListNode lru;                   // on Impl::lru while in the tree (cache_mu)
  u8 tree_id = 0;                 // its tree, set before it joins the LRU (cache_mu)
  u8 tree_level = 0;              // its level, set with tree_id (interior_nodes)
  u32 charged = 0;                // bytes counted in the cache
  // Read from copy repair_from (> 0) after copy 0 failed with repair_why
  // (ReadNode); NoteRepair dirties it when it is linked, and clears these.
  u8 repair_from = 0;
  Status repair_why;
};

// The bytes of a CachedNode a lookup reads: through the node's first two sets.
inline constexpr uptr kHotBytes = 256;

inline bool IsMin(const Pos& p) { return p.inode == 0 && p.offset == 0; }
inline bool IsMax(const Pos& p) { return p.inode == ~u64(0) && p.offset == ~u64(0); }
inline Pos Succ(Pos p) {
  if (++p.offset == 0) p.inode++;
  return p;
}
inline Pos Pred(Pos p) {
  if (p.offset-- == 0) p.inode--;
  return p;
}

inline Pos PtrMin(const NodePtrFormat& p) { return Pos{p.btree_id, p.min_inode.get(), p.min_offset.get()}; }

inline NodePtrFormat ReadPtr(KeyRef k) {
  NodePtrFormat p;
  MemCopy(&p, k.value(), sizeof(p));
  return p;
}

inline bool StatusIsCorrupt(const Status& st) { return st.error_class() == ErrorClass::kCorrupt; }
// What Options::drop_bad_nodes drops: damage, not a node of a newer format.
inline bool Droppable(const Status& st) { return StatusIsCorrupt(st) && st.code() != Err::kBadVersion; }

inline bool HoldsBtree(const sb::Superblock& sb, u32 m) { return (sb.members[m].data_allowed & sb::kDataBtree) != 0; }

// A checkpoint's phase-3 I/Os and what they read (checkpoint.cc).
struct PhaseIo;
struct PhaseBatch;

struct Btrees::Tree {
  u8 id = 0;
  RwLock lock;
  CachedNode* root = nullptr;
  Vector<NodePtrFormat> dead_slots;  // slots of replaced nodes (tree lock exclusive)
  // Slots of the scan's copies a recovery took keys from (KeepCopy): held
  // like dead_slots until the next roots block, but no tree pointer (never
  // in Roots::degraded_nodes).
  Vector<NodePtrFormat> kept_slots;
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
  u64 applied_seq = 0;  // newest journal entry applied (by a normal commit, or replay)
  bool committing = false;  // a commit is between its journal commit and its apply
  // Newest journal entry a reclaim commit (Transaction::SetReclaim: the
  // allocation records of a checkpoint's node buckets) applied. Reclaim
  // commits are made by the checkpoint itself (or while nothing commits),
  // so none is in flight when a checkpoint decides what it covers.
  u64 reclaim_applied = 0;
  journal::Pin pin;     // oldest applied entry not yet in a checkpoint
  Status failed;        // sticky: memory no longer matches the journal

  // Cache.
  platform::Shrinker shrinker;  // registered while open (memory pressure)
  Mutex cache_mu;
  IntrusiveList<CachedNode, &CachedNode::lru> lru;
  Atomic<u64> cached_bytes{0};
  Atomic<u64> cached_nodes{0};
  Atomic<u64> dirty_nodes{0};
  Atomic<u64> stale_members{0};  // the roots block's (as the next one will say): for GetStats
  Atomic<u64> degraded_reachable{0};  // Roots::degraded_nodes of the last roots block: for GetStats
  // What PublishNeed counts: cached interior nodes, nodes never written (no
  // slot yet), and the bound a running checkpoint started from (0 when none
  // runs).
  Atomic<u64> interior_nodes{0};
  Atomic<u64> unwritten_nodes{0};
  Atomic<u64> ckpt_hold{0};
  Atomic<u64> ckpt_taken{0};  // nodes the running checkpoint has taken slots for (AllocSlot)
  // PublishNeed: the need is computed and stored under this (a leaf lock), so
  // the last store is never an older, lower value.
  Mutex need_mu;
  // Some node may not be cached: set for good once an interior node is read from
  // disk (its children are not) or a node is evicted. Until then every node is
  // in memory and commits skip their prefetch descent.
  Atomic<u8> partial{0};

  // Node slots in btree buckets, one pool per member (docs/design/copies.md,
  // "Step 5b-2 in detail"). Only the checkpoint takes slots (ckpt_mu);
  // frees and the mount's holes come under slot_mu too.
  Mutex slot_mu;
  Vector<u16> live[dev::kMaxDevices];  // live node slots per bucket
  // Free slots in btree buckets that still hold live nodes (a node rewritten
  // elsewhere, its slot released after the roots block that stopped pointing
  // at it): taken before any other, so that the trees' footprint follows
  // their size instead of growing with every bucket a cold node pins. The
  // holes of a freed bucket are purged after the frees (holes_stale).
  struct Hole {
    u8 gen;  // the bucket's, checked again when taken
    u64 offset;
  };
  struct SlotPool {
    bool open_valid = false;
    alloc::BucketRef open_bucket;
    u32 open_next = 0;
    // Empty buckets a running checkpoint took ahead (ReserveBucket: for its
    // exclusive phase, or one when phase 1 ran out of slots): slots are
    // taken from them only as nodes are imaged, and what is left goes back
    // whole at the checkpoint's end -- never a slot burnt in a bucket that
    // stays.
    Vector<alloc::BucketRef> reserved;
    Vector<Hole> holes;
    // Slots a copy failed to write to (the write phase): never made holes
    // when the node's rewrite frees them (a bad sector would fail every
    // node given it), unused until their bucket empties. Few: a plain list.
    Vector<u64> bad;
    // Buckets a late node write (6c-3) may still land in, one entry per
    // write: never freed while listed (ReleaseHoldLocked).
    Vector<u64> held;
    // Slots the next node images can take here without a new bucket: the
    // holes, the rest of the open bucket and the reserved buckets; and of
    // them, the reserved buckets' (PublishNeed declares them as held).
    Atomic<u64> avail_slots{0};
    Atomic<u64> reserved_slots{0};
  };
  SlotPool pool[dev::kMaxDevices];
  bool holes_stale = false;  // a bucket was freed since the last purge
  // The running checkpoint's copy set (ChooseCopySet, at its start; the
  // checkpoint's own, under ckpt_mu): the members each node it images gets
  // a copy on, in the pointer's order. A member the allocator cannot serve
  // is replaced by another of the target, or leaves it (the nodes after
  // are degraded); the last one left spills to any capable member.
  u8 copy_set[kMaxNodeCopies] = {};
  u32 copy_set_n = 0;
  dev::DevMask copy_set_refused = 0;  // members the allocator refused a bucket this checkpoint
  dev::DevMask copy_set_avoid = 0;    // members BestMember passes over (held_members, or none)
  u32 wanted_durability = 1;  // metadata_replicas
  Mutex seq_mu;  // rng (NewSeq: committers creating nodes, never behind slot_mu's allocations)
  u64 rng = 0;

  // Checkpoints.
  Mutex ckpt_mu;  // one checkpoint at a time
  // The roots block to be written differs from the last one in more than its
  // roots (ClearStaleMembers): the next checkpoint writes one even with
  // nothing dirty. Under ckpt_mu.
  bool roots_changed = false;
  // The gen the running checkpoint's roots block will have: each image it
  // takes records it (NodeHeader::gen). Under ckpt_mu.
  u64 image_gen = 0;
  // Step 6c-3 (docs/design/copies.md): the node writes, flushes and roots
  // writes a checkpoint gave up on a stalling member and that are still out,
  // in the batches (PhaseBatch, checkpoint.cc) that hold what they read;
  // reaped at each checkpoint's start and end (ReapLate) and waited for by
  // Close (WaitLate). Under
  // ckpt_mu, but for the two atomics: phase_events (bumped by every phase-3
  // completion: the checkpoint sleeps on it) and phase_out (phase-3 I/Os
  // submitted and not completed: a completion's last touch, Close waits
  // for 0).
  PhaseBatch* late_batches = nullptr;
  Atomic<u32> phase_events{0};
  Atomic<u32> phase_out{0};
  // Members with a late I/O still out (as of the last ReapLate): left out
  // of the copy set and of the roots writes until it completes.
  dev::DevMask held_members = 0;
  // Members the roots block marks stale for copies given up (stale_since
  // was 0 then): a later roots block written to the member (not held,
  // nothing given up) clears the mark, the given-up copies' nodes being
  // rewritten by then.
  dev::DevMask late_stale = 0;
  // Set by Close: its checkpoints give nothing up (an unmount waits out a
  // stall, as the journal's Stop does).
  bool closing = false;
  // Nonzero while a checkpoint holds ckpt_mu, and from the start of Close:
  // when reclaim commits may be made with a journal attached (a cheap check,
  // not of the calling thread: Transaction::Commit).
  Atomic<u32> reclaim_ok{0};
  bool opened = false;  // Open() finished: Close() checkpoints
  // Open (read-write, or drop_bad_nodes): the offsets of every node slot the
  // trees use, per member, for ReconcileBuckets' holes (all or none:
  // used_ok false without the memory for them).
  Vector<u64> used[dev::kMaxDevices];
  bool used_ok = false;

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
  // Pointers of the nodes dropped (NoteLost): no longer reached, so the
  // first checkpoint drops them from Roots::degraded_nodes (ckpt_mu).
  Vector<NodePtrFormat> dropped_ptrs;
  // NoteRepair's warnings: at most one line per 10 s (a read-only mount reads
  // a node past its bad copy again after every eviction).
  LogLimit repair_log;
  LogLimit late_log;  // 6c-3's node copies given up: one line per 10 s
  u64 s_dropped = 0, s_scanned = 0, s_copies = 0, s_recovered = 0;
};

// All the machinery lives in this class so that it can reach Btrees' privates.
class TreeOps {
 public:
  using Tree = Btrees::Tree;
  using Impl = Btrees::Impl;

  // Here: the few that the lookup path and the iterators call from several
  // files, kept inline.

  static void Unref(CachedNode* n) {
    if (n->refs.FetchSub(1, MemOrder::kAcqRel) == 1) platform::Delete(n);
  }
  static void Ref(CachedNode* n) { n->refs.FetchAdd(1, MemOrder::kRelaxed); }

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

  static void MaybeEvict(Impl* im) {
    if (im->cached_bytes.Load(MemOrder::kRelaxed) > im->opt.cache_bytes) EvictIfNeeded(im);
  }

  // --- cache.cc: a node's life in the cache, reading nodes in, eviction -----

  static CachedNode* NewNode(Impl* im);
  static void Charge(Impl* im, CachedNode* n);
  static void Kill(Impl* im, Tree& t, CachedNode* n);
  static u64 NewSeq(Impl* im);
  static Status CheckInterior(const Impl* im, const Node& node, Diag* diag);
  static Status ReadCopy(Impl* im, const NodePtrFormat& ptr, u32 i, const Pos& max, CachedNode** out, Diag* diag);
  static Status ReadNode(Impl* im, const NodePtrFormat& ptr, const Pos& max, CachedNode** out, Diag* diag,
                         bool count_corrupt = true);
  static void NoteRepair(Impl* im, CachedNode* n);
  static Status FetchMiss(Impl* im, Tree& t, const Miss& miss, Diag* diag = nullptr);
  static u64 ShrinkCount(void* ctx);
  static u64 ShrinkScan(void* ctx, u64 pages);
  static bool StillPointsTo(Impl* im, Tree& t, const Miss& miss);
  static bool Evictable(const CachedNode* n);
  static void EvictIfNeeded(Impl* im);
  static u64 EvictTo(Impl* im, u64 goal, bool wait);
  static Status ReadRaw(Impl* im, u32 m, u64 off, u32 len, u8* buf);

  // --- interior.cc: structure changes (tree lock exclusive) -----------------

  struct Edit {
    Pos pos;
    const NodePtrFormat* ptr;  // null: remove the key
    CachedNode* child;
  };
  static u32 ChildIndex(const CachedNode* p, const CachedNode* c);
  static Status RebuildInterior(Impl* im, CachedNode* p, const Edit* edits, u32 nedits);
  static Status MakeNode(Impl* im, u8 id, u8 level, const Pos& min, const Pos& max, const Node* const* srcs,
                         u32 nsrcs, CachedNode** out);
  // Drops a node MakeNode made that was never linked into a tree (a split,
  // a merge or a root growth given up): what MakeNode counted -- dirty,
  // unwritten -- is taken back and the need published again. Without it
  // each merge given up left unwritten_nodes one higher for the rest of the
  // mount, and the declared need (metadata_need) grew with them.
  static void DiscardNode(Impl* im, CachedNode* n);
  static Status TakeChildren(CachedNode* dst, const CachedNode* src);
  static Status Split(Impl* im, Tree& t, CachedNode* n, bool append, const Pos& at);
  static void ShrinkRoot(Impl* im, Tree& t);
  static void TryMerge(Impl* im, Tree& t, CachedNode* n);
  static void MergeUp(Impl* im, Tree& t, CachedNode* n);

  // --- checkpoint.cc: the slot need, node slots, checkpoints, the writer thread ---

  static u64 CheckpointSlots(Impl* im);
  static void PublishNeed(Impl* im);
  struct Job;
  // Phase 3 (step 6c-3): the I/Os in batches, given up late on a stalling member.
  static void PhaseDone(dev::Io* io, Status st);
  static PhaseBatch* NewBatch(Impl* im, u32 cap);
  static PhaseIo* AddIo(Impl* im, PhaseBatch* b, u8 kind, u32 member, IoOp op, u64 offset, void* buf, u32 bytes,
                        u8 flags);
  static void SubmitPhaseIo(Impl* im, PhaseIo* p);
  static void FreeBatch(Impl* im, PhaseBatch* b);
  static void ReapLate(Impl* im);
  static void WaitLate(Impl* im);
  static bool CanGiveUp(Impl* im, const PhaseBatch* b, u32 nwrites, u32 m, dev::DevMask gave_up,
                        dev::DevMask flushed_ok);
  static Status WriteNodeCopies(Impl* im, Vector<Job>& jobs, PhaseBatch* b, bool may_give_up, dev::DevMask* gave_up);
  static bool MemberBusy(Impl* im, const PhaseBatch* b, u32 m);
  static dev::DevMask DurableMask(const Impl* im, dev::DevMask mask);
  static bool TakeBack(Impl* im, PhaseBatch* b, u32 m, Roots* roots, dev::DevMask unmark);
  static Status WriteRoots(Impl* im, Roots* roots, PhaseBatch* b, bool may_give_up, dev::DevMask gave_up,
                           dev::DevMask unmark, dev::DevMask* taken_back);
  static void NoteAvailLocked(Impl* im, u32 m);
  static bool IsOpenLocked(Impl* im, u32 m, u64 b);
  static bool HoleValidLocked(Impl* im, u32 m, const Impl::Hole& h);
  static void PurgeHolesLocked(Impl* im);
  static bool TakeSlotLocked(Impl* im, u32 m, NodeCopy* dst);
  static u32 BestMember(Impl* im, dev::DevMask skip, bool durable_only);
  static dev::DevMask CopySetMask(const Impl* im);
  static void ChooseCopySet(Impl* im);
  static void LeaveCopySetLocked(Impl* im, u32 i);
  static Status AllocSlot(Impl* im, NodePtrFormat* dst, bool may_allocate = true);
  // Roots::degraded_nodes/degraded_on with p added or dropped (PtrDegraded).
  static void CountDegraded(Impl* im, Roots* roots, const NodePtrFormat& p, bool add);
  static Status ReserveBucket(Impl* im, u32 i);
  static u64 AvailSlots(Impl* im);
  static Status ReserveSlots(Impl* im, u64 slots);
  static void ReturnReserved(Impl* im, bool free_them);
  static void CloseOpenLocked(Impl* im, u32 m, Vector<alloc::BucketRef>* frees);
  static void FindHoles(Impl* im, Vector<u64>* used);
  static void FreeSlot(Impl* im, const NodePtrFormat& p, Vector<alloc::BucketRef>* frees);
  static void FreeCopySlot(Impl* im, const NodeCopy& c, Vector<alloc::BucketRef>* frees);
  static bool DropLiveLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees);
  static void FreeEmptyLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees);
  static bool HeldLocked(Impl* im, u32 m, u64 b);
  static void ReleaseHoldLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees);
  static void FreeBuckets(Impl* im, const Vector<alloc::BucketRef>& frees);
  static void PurgeHoles(Impl* im);
  static void ReleaseOpenBucket(Impl* im);
  static Status TakeImage(Impl* im, Tree& t, CachedNode* n, Vector<Job>* jobs);
  static void Install(Impl* im, Job& j, const NodePtrFormat& slot, Vector<NodePtrFormat>* to_free);
  static Result<bool> CollectExclusive(CachedNode* n, Vector<CachedNode*>* out);
  static void CollectDirtyLeaves(CachedNode* n, Vector<CachedNode*>* out);
  static Status RunCheckpoint(Impl* im, Roots* roots_out, bool final = false);
  static Status ReserveAhead(Impl* im);
  static bool JournalBelow(Impl* im, u32 num, u32 den, u32 min_free);
  static bool JournalNeedsRoom(Impl* im);
  static void WriterMain(void* arg);

  // --- recover.cc: damaged nodes (Options::drop_bad_nodes) ------------------

  static void KillChain(Impl* im, Tree& t, CachedNode* n);
  static Status MakeEmptySubtree(Impl* im, Tree& t, u8 level, const Pos& min, const Pos& max, CachedNode** out);
  static Status NoteLost(Impl* im, const Tree& t, const NodePtrFormat& p, const Pos& min, const Pos& max,
                         const Diag& why, const Status& st);
  struct Gap;
  struct Copy;
  static bool Overlaps(const Pos& a_lo, const Pos& a_hi, const Pos& b_lo, const Pos& b_hi);
  static bool Wanted(const Vector<Gap>& gaps, u8 id, const Pos& lo, const Pos& hi);
  static Status ScanCopies(Impl* im, const Vector<u64>* used, const Vector<Gap>& gaps, Vector<Copy>* copies);
  static Status KeepCopy(Impl* im, const Copy& c, Vector<u64>* used);
  static Status RecoverLost(Impl* im, Vector<u64>* used);

  // --- tree.cc: applying one update, read-mostly leaves, prefetch -----------

  static Status ApplyKey(Impl* im, const KeyInput& key, u64 seq);
  static bool KeepsNewer(const KeyRef& cur, const KeyInput& key);
  static void ReadMostly(Impl* im, CachedNode* leaf);
  static void MergeForReads(Impl* im, CachedNode* leaf);
  static void MergeQueued(Impl* im);
  static void DropMergeQueue(Impl* im);
  static Status Prefetch(Impl* im, const Pos& pos);
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_INTERNAL_H_
