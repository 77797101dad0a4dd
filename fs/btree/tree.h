// The btrees of one filesystem: node cache, descent, transactions, iterators,
// splits and merges, write-out (checkpoints) and mount (docs/design/btree.md).
//
// Structure. One tree per BtreeId. Leaves (level 0) hold the keys; an interior
// node holds one key per child, at the child's max position, whose value is a
// NodePtrFormat (where the child lives, its seq and its min). Every node covers
// [min, max]; the children of a node partition its range exactly.
//
// Updates. A Transaction collects updates (set / delete) across btrees and commits
// them as one journal commit, then applies them to the in-memory leaves; a
// crash either replays the whole commit or none of it. Leaves take the keys into
// their open set (btree/node.h); the nodes are written later.
//
// Write-out (Checkpoint). Dirty nodes are written copy-on-write to fresh slots in
// btree buckets, children before parents; then the journal is made durable up to
// everything the written nodes contain (write-ahead rule), the devices written are
// flushed, and a roots block (btree/format.h) naming the new roots and the journal
// sequence they contain is written with FUA. Only then are the old slots released
// and the journal pin moved. A crash at any point leaves the previous roots block
// and every node it reaches intact; mount replays the journal from there.
// Checkpoints run on the btree writer thread: when the journal asks for space
// (reclaim hook), when dirty bytes pass half the cache, or on request.
//
// Concurrency and lock order (never reversed):
//   commit_mu_      one transaction commit + apply at a time (orders the apply of
//                   updates to the same position exactly as the journal orders them)
//   tree lock       per btree RwLock: shared for lookups, iterators and leaf updates;
//                   exclusive for structure changes (split, merge, root change) and
//                   for installing the new pointers a checkpoint wrote
//   leaf lock       per cached leaf RwLock: shared to read, exclusive to update;
//                   at most one leaf lock is held at a time
//   cache_mu_       the node cache's hash table and LRU (innermost, never held while
//                   taking another lock)
// Interior nodes change only under the exclusive tree lock, so readers holding it
// shared walk them without node locks. **No lock is ever held across device I/O**:
// a lookup that needs a node not in the cache drops every lock, reads and verifies
// the node with none held, inserts it into the cache and restarts (counted in
// Stats::restarts); a checkpoint snapshots a node under its lock and writes the
// copy with no lock held. The two exceptions are not node locks: commit_mu_ is
// held across the journal commit (which may wait for journal buffer space) so
// that apply order equals journal order, and ckpt_mu (one checkpoint at a
// time, taken before any other) across a whole checkpoint, its writes
// included; readers never take either.
//
// Node cache. Bounded by Options::cache_bytes. Clean, unreferenced nodes are
// evicted least-recently-used first; dirty nodes are never evicted (the writer is
// woken to clean them). Under memory pressure the platform's shrinker
// (platform::Shrinker) evicts below the bound too: clean nodes only, and only
// from trees whose lock it gets without waiting. Nodes read from disk are checksum-verified and must be
// exactly the node the parent points to: a bad node is a kCorrupt-class error for
// the operation (Stats::corrupt_reads), never a crash.
#ifndef TFS_BTREE_TREE_H_
#define TFS_BTREE_TREE_H_

#include "alloc/allocator.h"
#include "btree/format.h"
#include "btree/key.h"
#include "btree/node.h"
#include "dev/device_set.h"
#include "journal/journal.h"
#include "platform/atomic.h"
#include "platform/platform.h"
#include "platform/sync.h"
#include "sb/superblock.h"
#include "util/counters.h"
#include "util/diag.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::btree {

struct CachedNode;
class Btrees;

struct Options {
  // Node cache bound (dirty nodes may exceed it briefly); 0: DefaultCacheBytes().
  u64 cache_bytes = 0;
  u32 node_size = 0;               // 0 = the superblock's btree_node_size
  bool writer_thread = true;       // false: checkpoints only when called (tests)
  bool read_only = false;          // no allocator changes, no writes (show, fsck -n)
  // fsck only (docs/design/fsck.md, "Damaged nodes"): Open reads every node,
  // leaves too, and a node that fails verification (a kCorrupt-class error
  // but kBadVersion: checksums, identity, structure, a pointer outside the
  // btree area; a read that fails still fails the open) is dropped instead: an empty node
  // covering its range takes its place (for an interior node, a chain of
  // empty nodes down to a leaf, so every leaf stays at level 0), and what it
  // held is recovered from the newest other copies a node scan finds (every
  // node slot of this filesystem no pointer names, in free and btree
  // buckets: copies a checkpoint replaced, and the children of a dropped
  // interior node). LostNodes() lists what was dropped and recovered. With
  // read_only the replacement lives in memory only.
  bool drop_bad_nodes = false;
  // fsck -y only, with drop_bad_nodes, when the roots block is lost (damaged,
  // or older than the filesystem): nothing the roots name is read; every tree
  // is rebuilt from the newest copies the node scan finds (all of it held in
  // memory until the next checkpoint writes it), and LostNodes() lists one
  // whole-range entry per tree (ptr: what the stale roots named, if any).
  bool rebuild_from_scan = false;
  // Tests only (null otherwise): called at named points between the steps of a
  // concurrent algorithm, with no tree or node lock held, so a test can run
  // another thread into the gap a race needs. Points: "fetch.linked" (a node
  // read on demand has just been linked into its tree; a committer's descent
  // gets there holding commit_mu, so hold only readers there);
  // "commit.throttled" (a commit is past the throttle and has not taken
  // commit_mu yet: no lock held); "commit.waiting" (the commit found
  // commit_mu held and is about to wait for it: no lock held);
  // "commit.journaled" (a commit is in the journal and none of its keys is
  // applied yet; the committer holds commit_mu there).
  void (*test_point)(void* ctx, const char* point) = nullptr;
  void* test_point_ctx = nullptr;
  // drop_bad_nodes: called by Open once the trees are read and before the
  // node scan, which reads only buckets the allocator calls free or btree:
  // it loads what is known of the allocation state by then (the Store: the
  // alloc tree as read and the journal's alloc keys). Null: the allocator as
  // it is.
  Status (*before_scan)(void* ctx) = nullptr;
  void* before_scan_ctx = nullptr;
};

// The btrees' counters (util/counters.h).
#define TFS_BTREE_COUNTERS(X, A)                                                                    \
  X(lookups, counter, "keys read")                                                                  \
  X(inserts, counter, "keys set")                                                                   \
  X(deletes, counter, "keys deleted")                                                               \
  X(commits, counter, "transactions committed")                                                     \
  X(commit_waits, counter, "commits that found commit_mu held as they came to it (a glance: it may be free by the lock)")                   \
  X(restarts, counter, "descents restarted (node read, structure change)")                         \
  X(splits, counter, "nodes split")                                                                 \
  X(merges, counter, "nodes merged")                                                                \
  X(merges_given_up, counter, "merges built and given up (the merged node came out too full, or its parent had no room)") \
  X(root_grows, counter, "trees that grew a level")                                                 \
  X(root_shrinks, counter, "trees that lost a level")                                               \
  X(compactions, counter, "leaf compactions caused by updates")                                     \
  X(read_merges, counter, "leaves merged into one set after many lookups")                          \
  X(cache_hits, total, "descents (lookup, iterator refill, update) that found every node cached") \
  X(cache_misses, counter, "nodes read on demand")                                                  \
  X(evictions, counter, "nodes evicted from the cache")                                             \
  X(shrinks, counter, "memory-pressure calls that asked the cache to give memory back")             \
  X(shrunk_bytes, counter, "bytes of nodes they evicted")                                           \
  X(node_reads, counter, "nodes read")                                                              \
  X(node_read_bytes, counter, "bytes of nodes read")                                                \
  X(corrupt_reads, counter, "node reads that found damage")                                         \
  X(node_copy_retries, counter, "node copies that failed a read (I/O or checks) before another copy served") \
  X(node_repairs, counter, "nodes dirtied to be rewritten because a copy failed while another served") \
  X(node_copy_write_errors, counter, "node copies whose write or flush failed while another copy was written") \
  X(node_copies_late, counter, "node copies a checkpoint gave up on a stalling member past its late bound (the node kept its other copies; rewritten)") \
  X(node_flushes_late, counter, "flushes a checkpoint gave up on a stalling member past its late bound") \
  X(roots_writes_late, counter, "roots block writes given up on a stalling member once another member took the block") \
  X(late_taken_back, counter, "members given up in a checkpoint and waited for after all: no other member took the roots block") \
  X(late_node_ios, gauge, "node writes, flushes and roots writes given up and still out (as of the checkpoints' last look)") \
  X(held_members, gauge, "members left out of checkpoints' copy sets and roots writes while a late I/O there is out") \
  X(node_writes, counter, "nodes written")                                                          \
  X(node_write_bytes, counter, "bytes of nodes written")                                            \
  X(checkpoints, counter, "checkpoints done")                                                       \
  X(reserved_buckets, counter, "empty buckets checkpoints took for node slots")                     \
  X(returned_buckets, counter, "of which went back unused at the checkpoint's end (whole)")         \
  X(hole_slots, counter, "node slots reused in buckets that still hold other nodes")                \
  X(degraded_nodes, counter, "node images written with fewer copies than metadata_replicas asks") \
  X(copy_set_swaps, counter, "members of a checkpoint's copy set replaced by another of the target (no free bucket)") \
  X(copy_set_leaves, counter, "members that left a checkpoint's copy set (no free bucket, and no other member to take)") \
  X(throttles, counter, "commits that waited for a checkpoint (memory, journal)")                   \
  X(reclaim_commits, counter, "reclaim commits (a checkpoint's allocation records, the mount's, the unmount's)") \
  X(alloc_older_kept, counter, "alloc records not applied: the leaf held a newer version (merge rule)") \
  X(reconcile_frees, counter, "mount: btree buckets no tree reaches, freed")                        \
  X(reconcile_marks, counter, "mount: buckets holding nodes, marked btree")                         \
  X(degraded_count_short, counter, "degraded pointers dropped that the roots block's count did not hold (fsck recounts)") \
  X(stale_members, level, "members the roots block marks stale (a roots block missed; fsck -y clears)") \
  X(degraded_reachable, level, "node pointers the roots block reaches with fewer copies than metadata_replicas") \
  X(cached_nodes, level, "nodes in the cache now")                                                \
  X(cached_bytes, level, "their bytes")                                                           \
  X(dirty_nodes, level, "of which dirty now")                                                     \
  X(dirty_bytes, level, "their bytes")                                                            \
  X(unwritten_nodes, level, "nodes made and never written (in the checkpoint's slot need; 0 once the trees are clean)") \
  A(depth, ::tfs::btree::kNrBtreeIds, level, "levels per tree now (0: empty)")                                 \
  X(dropped_nodes, level, "open with drop_bad_nodes: damaged nodes dropped")                      \
  X(scanned_slots, level, "node slots the scan read (node headers outside the trees)")            \
  X(scan_copies, level, "of which valid copies of a lost range")                                  \
  X(recovered_keys, level, "keys the scan recovered")

struct Stats {
  TFS_COUNTER_FIELDS(TFS_BTREE_COUNTERS)
};

// A node Options::drop_bad_nodes dropped, and what the node scan recovered of
// its range.
struct LostNode {
  u8 btree_id = 0;
  u8 level = 0;         // the dropped node's (its replacement's top)
  Pos min{}, max{};     // the range it covered (its parent's pointer)
  NodePtrFormat ptr{};  // where it was
  Diag why;             // what was wrong with it
  u64 recovered_keys = 0;  // keys taken from other copies into its range
  u32 copies = 0;          // copies they came from
  u64 newest_copy_seq = 0;  // the newest journal entry those copies held (0: none)
  bool fully_covered = false;  // the copies covered its whole range
};

// The node cache bound when Options::cache_bytes is 0: an eighth of the machine's
// memory (256 MiB if unknown), at least 64 MiB. Like a page cache, the btree is
// fastest when its working set is cached; a smaller bound still works (nodes are
// evicted and read again) and is what memory-tight deployments set.
u64 DefaultCacheBytes();

// The copies of a node pointer (format.h, NodePtrFormat). A pointer read
// from disk is used only after NodePtrProblem; PtrCopies bounds nr for the
// pointers built in memory as well.
struct NodeCopy {
  u32 member;
  u64 offset;
};
inline u32 PtrCopies(const NodePtrFormat& p) { return p.nr <= kMaxNodeCopies ? p.nr : 0; }
inline NodeCopy PtrCopy(const NodePtrFormat& p, u32 i) { return NodeCopy{p.member[i], p.offset[i].get()}; }
// No copy: an empty tree's root, or a node never written.
inline bool PtrEmpty(const NodePtrFormat& p) { return p.nr == 0; }
// Drops every copy (nr 0, every entry unused).
void ClearPtrCopies(NodePtrFormat* p);
// A pointer of btree id with no copy and nothing else set: an empty tree's
// root as a roots block holds it, and a new node's before its first write.
NodePtrFormat EmptyPtr(u8 id);
// Appends a copy; the caller keeps nr below kMaxNodeCopies and the members
// distinct.
void AddPtrCopy(NodePtrFormat* p, u32 member, u64 offset);
// Gives dst the copies of src (src may be *dst); the rest of dst stays.
void SetPtrCopies(NodePtrFormat* dst, const NodePtrFormat& src);
// The same copies, in the same order.
bool SamePtrCopies(const NodePtrFormat& a, const NodePtrFormat& b);
// The parse rules of a pointer read from disk -- an interior node's key or a
// roots block's entry (the bytes are hostile): nr 1..kMaxNodeCopies (0 only
// when `may_be_empty`, an empty tree's root), the first nr entries distinct
// members of sb that may hold btree nodes, each copy's offset a node slot
// of its member's bucket area (NodeSlotInArea: every copy is counted and
// freed by its slot, read or not), the rest unused (kNoMember, offset 0),
// reserved bytes 0. The level and btree are the caller's to check. Null
// when the pointer keeps them, else what it breaks (for the caller's one
// line).
const char* NodePtrProblem(const NodePtrFormat& p, const sb::Superblock& sb, u32 node_size, bool may_be_empty);
// Whether p names copies whose members' durability falls short of the
// filesystem's metadata_replicas (an image written degraded: what
// Roots::degraded_nodes counts). False for an empty pointer.
bool PtrDegraded(const NodePtrFormat& p, const sb::Superblock& sb);
// Whether `offset` is a node slot of member m's bucket area.
bool NodeSlotInArea(const sb::Superblock& sb, u32 node_size, u32 m, u64 offset);

// Where the trees are on disk: what a roots block holds.
struct Roots {
  u64 gen = 0;
  u64 journal_seq = 0;  // journal entries <= this are contained in the trees
  u64 node_seq_hi = 0;
  // RootsFormat::stale_since/stale_until: as read, plus every member
  // ReadRoots found behind (a valid roots block older than `gen`: the gens
  // after its newest, up to `gen`, are the ones it missed).
  u64 stale_since[dev::kMaxDevices] = {};
  u64 stale_until[dev::kMaxDevices] = {};
  // RootsFormat::degraded_nodes/degraded_on: the pointers this block
  // reaches whose copies fall short of metadata_replicas, in all and per
  // member holding a copy of one. Kept by each checkpoint (+ its new
  // pointers, - the ones it drops); fsck recounts.
  u64 degraded_nodes = 0;
  u32 degraded_on[dev::kMaxDevices] = {};
  NodePtrFormat roots[kNrBtreeIds];
  u32 rejected = 0;  // ReadRoots: slots that could not be read or failed their checks
};

// The members Roots::stale_since marks (bit m: member m).
inline u64 StaleMask(const Roots& r) {
  u64 mask = 0;
  for (u32 m = 0; m < dev::kMaxDevices; m++)
    if (r.stale_since[m] != 0) mask |= u64(1) << m;
  return mask;
}

// The gen of the newest roots block format writes (slot 0 holds gen 1, slot 1 gen 2).
inline constexpr u64 kFormatRootsGen = 2;

// Reads the newest valid roots block of the filesystem (every member that may
// hold btree nodes). kCorrupt with a Diag if none is valid.
Status ReadRoots(dev::DeviceSet& devs, const sb::Superblock& sb, Roots* out, Diag* diag = nullptr);
// Writes the roots block of a new filesystem (every tree empty) to every member
// that may hold btree nodes (Format).
Status FormatRoots(dev::DeviceSet& devs, const sb::Superblock& sb);

class Transaction;

// Work a transaction's owner does inside its commit (docs/design/copies.md,
// "Step 3b"): fills values that must be computed in journal order -- the
// data path's bucket records, each the published state plus this
// transaction's change, so that a record's version order is its journal
// order. Both calls run under commit_mu with no tree, leaf or node lock
// held; they must not do device I/O, call btree code, or wait for anything
// but short mutexes below commit_mu in the lock order (the allocator's
// mu_). Lifetime: the hook and its ctx outlive the Commit they are set for.
struct CommitHook {
  // After the throttle, the prefetch and the failed-trees check, before the
  // journal commit: writes the value of every slot queued with SetLater
  // (Transaction::LaterValue). Changes no shared state (it stages). An
  // error: nothing is journaled or applied, Commit returns it (after
  // finish(ctx, 0, false)).
  Status (*prepare)(void* ctx, Transaction* tx) = nullptr;
  // After the last key is applied -- inside the SetApplySeq window, so a
  // reader that meets the published state waits for the keys that go with
  // it -- or after a failure, whenever prepare ran. `journaled`: the
  // journal took the entry `seq` (without a journal: the keys were applied);
  // true also when an apply failed after it (the trees are failed then:
  // what the journal holds is what memory must say). False: prepare failed
  // (nothing journaled; the trees go on), the journal refused the entry
  // (kTooBig: nothing written; the trees go on), or the journal failed (then
  // the trees are failed and the next mount replays whatever reached disk).
  void (*finish)(void* ctx, u64 seq, bool journaled) = nullptr;
  void* ctx = nullptr;
};

// A set of updates to commit atomically. Not thread-safe; one per thread.
class Transaction {
 public:
  explicit Transaction(Btrees* trees) : trees_(trees) {}
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // Queues a value (kKeyValue) at pos; len <= kMaxValueBytes. kInvalidArgument /
  // kTooBig for bad input (nothing queued); kTooBig also when the transaction would
  // not fit in one journal entry.
  [[nodiscard]] Status Set(const Pos& pos, const void* value, u32 len);
  // Queues a deletion (a whiteout): deleting an absent key is not an error.
  [[nodiscard]] Status Delete(const Pos& pos);
  // Queues a `len`-byte value at pos whose bytes the commit hook writes
  // (zeros until then): sized, counted against the journal entry (kTooBig
  // as for Set) and prefetched like any key, so the hook only fills bytes.
  // Returns the slot's index (0, 1, ... in the order queued). kBtreeAlloc
  // positions only, len 1..kMaxLaterBytes (kInvalidArgument otherwise).
  static constexpr u32 kMaxLaterBytes = 64;
  [[nodiscard]] Result<u32> SetLater(const Pos& pos, u32 len);
  // Inside CommitHook::prepare: slot i's value, `len` bytes as queued.
  u8* LaterValue(u32 i) { return keys_.data() + later_[i] + sizeof(KeyHeader); }
  u32 later_slots() const { return u32(later_.size()); }
  // The hook of the next Commit (one; null: none). Cleared by Commit and
  // Reset. Not with SetReclaim (Commit: kInvalidArgument).
  void SetCommitHook(const CommitHook* hook) { hook_ = hook; }
  // Adds a journal data check (journal::DataCheckFormat and its crcs, `len`
  // bytes) for data the queued keys point at. Once a transaction carries one, it
  // must carry one for every device range its Commit `deps` stand for. Nothing
  // is applied to a tree; kTooBig as for Set.
  [[nodiscard]] Status AddDataCheck(const void* check, u32 len);
  // The journal bytes still free in this transaction's entry: what more
  // keys may take before Set, Delete, SetLater or AddDataCheck return
  // kTooBig (a caller that splits its work into batches stops before that).
  usize Room() const;
  // The journal bytes one queued key with a `val_bytes`-byte value takes
  // (a whiteout: 0), headers and padding included.
  static constexpr usize KeyBytes(u32 val_bytes) { return KeySpace(val_bytes) + sizeof(journal::KeyHeader); }
  // Journals every queued update in one commit and applies them; returns the
  // journal sequence. kFlush returns once that commit is durable; kFlushNext is
  // kNoFlush from a caller that flushes the journal next. `deps`: the
  // members holding data these keys point at (written and completed before the
  // commit): the entry becomes durable only after they are flushed. The queue is
  // empty afterwards, whatever the result. Errors: kIo from the journal (the
  // filesystem must go read-only), kCorrupt / kIo reading a leaf that must be
  // updated (nothing was journaled or applied then); kInvalidArgument, before
  // anything happens, for SetLater slots without a commit hook to fill them
  // (they would journal zeros) or a hook with SetReclaim. `lossable`: the
  // members of deps whose data here all has a copy elsewhere
  // (journal::Journal::Commit).
  Result<u64> Commit(journal::CommitMode mode = journal::CommitMode::kNoFlush, dev::DevMask deps = 0,
                     dev::DevMask lossable = 0);
  // For readers that must see this commit's keys all or none (the data path's
  // extent readers, which walk a file's extents in batches): Commit makes `seq`
  // odd just before it applies the first key to a tree and even again after
  // the last -- after the throttle and the journal commit, so such a reader
  // waits for the apply only (in memory, or a read of an evicted leaf from
  // the metadata target), never for the journal.
  // Commits apply one at a time, so one counter may serve many transactions.
  // Cleared by Commit and Reset.
  void SetApplySeq(Atomic<u64>* seq) { apply_seq_ = seq; }
  // Makes the next Commit a *reclaim commit* (docs/format/alloc.md,
  // "Checkpoints and the recursion"): journaled at the journal's reclaim
  // watermark (never waits for ring room), not throttled, and applied
  // without commit_mu -- for kBtreeAlloc keys only (kInvalidArgument
  // otherwise), whose apply order does not matter (newest version wins).
  // Only from a checkpoint (the allocation records of its node buckets) or
  // while nothing else commits (mount, unmount): at most one is in flight,
  // never while a checkpoint decides what it covers. With a journal
  // attached and neither a checkpoint nor Close running, Commit makes it an
  // ordinary commit. Cleared by Commit and Reset.
  void SetReclaim() { reclaim_ = true; }
  void Reset();
  u32 size() const { return n_; }

 private:
  friend class Btrees;
  Status Append(const KeyInput& in);
  // Commit of a reclaim transaction (SetReclaim).
  Result<u64> CommitReclaim();
  // The journal bytes the commit takes so far, and what one entry may hold.
  usize JournalBytes() const;
  usize JournalLimit() const;
  Btrees* trees_;
  Vector<u8> keys_;  // journal keys: KeyHeader + padded value, back to back
  Vector<u8> checks_;  // data checks, each padded to 8 (journal::KeySpace - header)
  u32 nchecks_ = 0;
  Vector<journal::Key> jkeys_;  // Commit's list of them for the journal
  u32 n_ = 0;
  Atomic<u64>* apply_seq_ = nullptr;  // see SetApplySeq
  bool reclaim_ = false;              // see SetReclaim
  Vector<u32> later_;                 // SetLater: offsets into keys_ of the slots' keys
  const CommitHook* hook_ = nullptr;  // see SetCommitHook
  // Commit allocates under node locks and the journal's. A Transaction lives
  // on the stack of the thread that made it (the scope is that thread's).
  platform::NoFsScope nofs_;
};

// A cursor over one btree. Holds no lock between calls (it remembers a position
// and a reference to its leaf), so threads may insert while it moves; each call
// sees every commit applied before it started. Not thread-safe; one per thread.
class Iterator {
 public:
  // `first_batch`: keys a Seek copies at first (0: the default, 32); later
  // steps double it. A caller that looks at one or two keys after a seek
  // (the data path's extent lookups) saves copying the rest.
  Iterator(Btrees* trees, u8 btree_id, u32 first_batch = 0);
  ~Iterator();
  Iterator(const Iterator&) = delete;
  Iterator& operator=(const Iterator&) = delete;

  // First key >= pos / last key <= pos / first / last. Errors (kCorrupt, kIo) leave
  // the iterator invalid.
  [[nodiscard]] Status Seek(const Pos& pos);
  [[nodiscard]] Status SeekForPrev(const Pos& pos);
  [[nodiscard]] Status SeekToFirst();
  [[nodiscard]] Status SeekToLast();
  // Next key after / last key before the current one (only while Valid()).
  [[nodiscard]] Status Next();
  [[nodiscard]] Status Prev();

  // Where a node that cannot be read or fails its checks is described, in
  // one line naming the tree, the level, the member and the offset (the
  // Status alone says only what failed): null (the default) for nowhere.
  // The mount's load of the allocator names a damaged alloc leaf with it.
  void SetDiag(Diag* diag) { diag_ = diag; }

  bool Valid() const { return valid_; }
  Pos pos() const { return pos_; }
  // The current value: a copy owned by the iterator, valid until it moves.
  const u8* value() const { return value_ptr_; }
  u32 val_bytes() const { return value_len_; }

 private:
  enum class Dir : u8 { kSeek, kSeekForPrev };
  Status Move(Dir dir, const Pos& pos);
  // Copies up to batch_limit_ keys of the leaf holding `from`, moving to the
  // neighbouring leaf while that side of it has none.
  Status Fill(bool forward, Pos from);
  void SetCurrent(u32 i);
  // Next (forward) or Prev.
  Status Step(bool forward);

  Btrees* trees_;
  u8 id_;
  bool valid_ = false;
  Pos pos_{};
  const u8* value_ptr_ = nullptr;
  u32 value_len_ = 0;
  // A batch of keys copied (packed, as in the node) from leaf_ while its version
  // was leaf_version_: Next/Prev inside the batch cost no lock while the leaf is
  // unchanged; any change to the leaf (or its replacement) sends them back to it.
  Vector<u8> batch_;
  Vector<u32> offsets_;
  u32 idx_ = 0;
  u32 batch_limit_ = 32;
  u32 first_batch_ = 32;
  CachedNode* leaf_ = nullptr;  // referenced: its version stays readable
  u64 leaf_version_ = 0;
  Diag* diag_ = nullptr;  // see SetDiag
};

class Btrees {
 public:
  Btrees();
  ~Btrees();
  Btrees(const Btrees&) = delete;
  Btrees& operator=(const Btrees&) = delete;

  // Attaches to a filesystem whose roots are `roots` (ReadRoots). No journal
  // until AttachJournal: updates (replay's, the mount's) are applied without
  // journaling. Reads every interior node to learn which node slots are in
  // use; changes no allocation state (the allocator is loaded from the alloc
  // tree after replay: ReconcileBuckets then).
  Status Open(dev::DeviceSet* devs, alloc::Allocator* alloc, const sb::Superblock& sb,
              const Roots& roots, const Options& options, Diag* diag = nullptr);
  // Read-write mounts, once the allocator is loaded (Store::Open): frees the
  // btree buckets no tree reaches (a checkpoint a crash interrupted, or the
  // buckets an unmount's last checkpoint emptied) and marks as btree every
  // bucket that holds nodes, then finds the holes (free slots in buckets that
  // hold nodes). Before anything else commits.
  Status ReconcileBuckets();
  // Starts journaling updates (and the writer thread, unless disabled).
  void AttachJournal(journal::Journal* journal);
  // Replay: applies one journal key of entry `seq` (a kKeyBtree key) unless the
  // trees already contain that entry (seq <= roots journal_seq).
  Status ApplyReplayed(u64 seq, const journal::Key& key);
  // Writes every dirty node and a new roots block. Safe to call concurrently with
  // everything else; one checkpoint runs at a time.
  Status Checkpoint();
  // Waits until every node write, flush and roots write a checkpoint gave
  // up on a stalling member (docs/design/copies.md, "Step 6c-3") has ended,
  // and lets them go (what Close and every checkpoint's start do; tests).
  void WaitLateIos();
  // fsck -y, once every copy of every node on the members in `mask` has been
  // verified or rewritten: the next roots block no longer calls them stale
  // (Roots::stale_since; the next Checkpoint writes one even with nothing
  // dirty).
  void ClearStaleMembers(u64 mask);
  // The next Checkpoint writes a roots block even with nothing dirty (a
  // writable degraded open whose roots gen moved on: Store::Open).
  void NoteRootsChanged();
  // fsck -y, after its walk recounted the degraded pointers a roots block
  // reaches: `recorded` is what that block said (Roots::degraded_nodes,
  // degraded_on), `recount` what the walk found. The counts the next roots
  // block carries (written even with nothing dirty) become the current ones
  // moved by (recount - recorded): checkpoints since the walk changed them
  // by exactly what they added and dropped (or left them higher, when one
  // dropped a pointer the count did not hold: degraded_count_short -- too
  // high is the safe side). kBusy, nothing changed, when a count would
  // leave its range (fsck -y again corrects it).
  struct DegradedCounts {
    u64 total = 0;
    u64 on[dev::kMaxDevices] = {};
  };
  Status AdjustDegradedCounts(const DegradedCounts& recorded, const DegradedCounts& recount);
  // Stops the writer, checkpoints until nothing is dirty (the checkpoints'
  // own allocation records dirty alloc leaves: at most a few rounds, then a
  // final checkpoint that takes its buckets before imaging and frees none,
  // docs/format/alloc.md), detaches from the journal. *settled (if given):
  // whether the trees on disk then hold everything, allocation records
  // included; false if a node stayed dirty (the journal still holds it).
  // Idempotent.
  Status Close(bool* settled = nullptr);
  // Close without writing anything (a mount that fails or refuses after the
  // trees opened: the allocator may not be loaded, so no checkpoint may
  // allocate). Idempotent.
  void Abandon();
  // Drops the journal pin a Close that did not settle kept (an error, or a
  // node left dirty): until the journal has stopped, an entry it writes
  // would otherwise record a last_seq past every entry since the last roots
  // block, and the next mount's replay would start after them. The Store
  // calls it after Journal::Stop (the destructor does too). Idempotent.
  void DetachJournal();

  // Reads the value at pos into `value` (resized). kNotFound if absent.
  Status Get(const Pos& pos, Vector<u8>* value);
  // Reads the value at pos into buf (at most cap bytes); returns its length, which
  // may exceed cap (then only cap bytes were copied). kNotFound if absent.
  Result<u32> Get(const Pos& pos, void* buf, u32 cap);

  // The journal's reclaim hook: wakes the writer to checkpoint (never blocks).
  static void ReclaimHook(void* self, u64 seq);

  Stats GetStats() const;
  const Roots& roots() const { return roots_; }  // the last roots block written or read
  // Options::drop_bad_nodes: what Open dropped (empty otherwise).
  const Vector<LostNode>& lost_nodes() const { return lost_; }
  u32 node_size() const { return node_size_; }

  // For fsck: visits every node of every tree as the last roots block left them,
  // top-down, reading each from disk (nodes changed since the last checkpoint are
  // seen in their checkpointed version). fn returns non-Ok to stop.
  struct NodeVisit {
    const Node* node;
    const NodePtrFormat* ptr;  // how the parent (or the roots block) points to it
    u32 served;                // the copy that was read (the ones before it failed)
  };
  Status ForEachNode(Status (*fn)(void* ctx, const NodeVisit& v), void* ctx, Diag* diag = nullptr);
  // For fsck: like ForEachNode, but a node that cannot be read or fails
  // verification (checksums, identity, interior structure) does not end the walk:
  // `bad` is told which pointer led to it and why, its subtree is skipped and the
  // walk goes on with the next sibling. fn or bad return non-Ok to stop.
  struct NodeError {
    const NodePtrFormat* ptr;  // the pointer (of the parent or the roots block)
    Pos max;                   // the max that pointer implies
    Status status;             // kCorrupt-class: a bad node; else e.g. kIo, kNoMemory
    const char* text;          // the Diag: which node and what is wrong
  };
  Status ForEachNodeContinuing(Status (*fn)(void* ctx, const NodeVisit& v),
                               Status (*bad)(void* ctx, const NodeError& e), void* ctx);
  // For fsck's rebuild of allocation state: calls fn with every copy of every
  // node the trees reach now (in memory: nodes changed since the last
  // checkpoint at their old slots, nodes never written not at all), reading
  // interior nodes that are not cached, and with every slot the last roots
  // block may still name (nodes replaced since, copies drop_bad_nodes took
  // keys from): all of them must stay allocated until the next roots block. Only while nothing else uses the
  // trees (Store::Open's rebuild hook). fn is called once per copy of each
  // node (its member and offset) and returns non-Ok to stop.
  using SlotFn = Status (*)(void* ctx, const NodeCopy& copy);
  Status ForEachSlot(SlotFn fn, void* ctx);
  // For fsck: reads and verifies copy i of the node p names, whose max is
  // `max` (as a read of the node checks it), and keeps nothing. A
  // kCorrupt-class error (or the read's) with the reason in *diag.
  Status CheckCopy(const NodePtrFormat& p, u32 i, const Pos& max, Diag* diag);
  // For fsck -y: dirties the node of tree `id` at `level` whose range
  // holds `pos` (reading it and its ancestors if needed), so that the next
  // checkpoint writes every copy of it anew and releases the old ones (a
  // damaged copy while another served). Counted in node_repairs.
  // kNotFound when the tree has no node at that level.
  Status RewriteNode(u8 id, u8 level, const Pos& pos);

 private:
  friend class Transaction;
  friend class Iterator;
  friend class TreeOps;
  struct Tree;
  struct Impl;
  Impl* impl_ = nullptr;
  Roots roots_{};
  u32 node_size_ = 0;
  Vector<LostNode> lost_;  // Options::drop_bad_nodes: what Open dropped
  // Close: the trees' pin when they did not settle (DetachJournal drops it).
  journal::Journal* kept_journal_ = nullptr;
  journal::Pin kept_pin_{};
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_TREE_H_
