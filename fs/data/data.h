// The data path, first step: file data as copy-on-write extents with a crc32c per
// 4 KiB block (docs/design/data.md; format: docs/format/inodes-extents.md).
//
// An extent is the key kBtreeExtents (ino, end block) whose value (extent.h,
// the one API that knows its bytes) says how many blocks it holds and where
// its copies are: up to kMaxPtrs pointers (member, generation, byte offset of
// the blob, how far into the blob the extent starts -- a piece of a split
// extent keeps its blob -- cached or not, compressed or not), and each
// block's crc32c, shared by the plain copies.
//
// Replicas (docs/design/copies.md, "As built: step 5a"): a write wants
// ctx.replicas copies (else the filesystem's data_replicas), counted by the
// members' durability. Its write point keeps up to kMaxPtrs open buckets
// and the write takes one on each of that many distinct members of its
// target (chosen by member: write_point.cc); the blob goes to all the copies
// at once (one submission each, completions joined) and the extent gets one
// pointer per copy written. Too few members (the target has fewer, one is
// full, a copy's write fails): the write goes on with the copies it has --
// degraded, counted (degraded_writes, degraded_sectors) -- and fails only
// when no copy was written. Extra copies come from the target alone: the
// allocator's fallback to any member serves the first copy only, so a
// replica never lands on a slow member the target does not name.
//
// Writing: whole 4 KiB blocks. Space comes from a write point (one open bucket,
// filled in order) -- one per (target, I/O class) of the callers' IoContexts
// (io_context.h), so a background writer never shares a bucket with the
// foreground nor waits on its write point's lock; the data is written and completed
// before the caller commits the transaction that QueueWrite filled: the new
// extent keys and the trimmed or deleted old ones. The commit must name the
// members written (Delta::deps: every copy written, and no other member) so
// that it becomes durable only after they are flushed. Commit moves the
// space accounting with the transaction (below); a bucket no extent points
// into any more (and no write in flight has space in) is then freed.
// Abort(delta) after a failed commit.
//
// Space accounting (docs/design/copies.md, "As built: step 3b-2"): every
// pointer that is not cached counts its extent's blocks as live sectors in
// its bucket; a current cached pointer counts them as cached, apart (a
// cached copy is not what keeps the data), and a stale one nowhere
// (data::PtrCountsIn, data::PtrSectors). The counts are the allocator's --
// each bucket's record in the alloc btree -- and change only inside the
// extent transaction that changes them: Commit gives the transaction a
// commit hook that computes the buckets' new records under the btree's
// commit_mu (in journal order) and publishes them once journaled, so the
// extent change and its buckets' records are one journal entry and a crash
// keeps both or neither. Open trusts them (step 3b-5b: no walk of the
// extents; the store cross-checks them against the accounting keys and
// frees user buckets whose records count nothing -- emptied by a punch
// whose free a crash or a failed commit lost). A bucket is freed when
// neither count, nor a write in flight, nor a write point holds it.
//
// Reading verifies every block it returns; a mismatch is kDataCorrupt (EIO at
// the FUSE edge) and counted, never the bytes. Holes read as zeros. The
// copies of an extent are ranked by their members' health and latency, the
// best read first, the next too when it has not answered within its
// member's hedge bound (hedged) or failed (read_retries), and the first
// good answer is used; only when every copy fails is the read an error, the
// best-ranked failing copy's (docs/design/copies.md, "Step 6"). A read pins the bucket it
// reads from (Pin/Unpin), so an overwrite committing meanwhile cannot free and
// reuse it under the read; a read that found a copy stale (freed since its
// lookup, or a stale cached copy) and none good looks again before it fails.
//
// Compressed extents (QueueWrite with compress): each chunk of up to
// kMaxCompressedBlocks blocks is zstd-compressed and, if that saves at least a
// block, stored as one blob of disk_bytes bytes with one crc32c over them (a
// read must fetch and decompress the whole blob anyway). Pieces of a split
// compressed extent keep pointing into their blob. A bucket's live count is
// the file blocks whose data it holds (logical, so a compressed bucket may
// count more than it has): zero still means nothing points into it.
//
// Unwritten extents (fallocate) have no pointer and no blob: they read as
// zeros and hold a *reservation* of as many blocks (bcachefs's reservation
// keys). The sum of the reservations is kept in memory (from the kReserved
// accounting key at Open) and is space no other write may take: a write that does
// not replace reserved blocks gets kNoSpace rather than eat into them, and
// QueueReserve refuses what free space cannot cover. A write over reserved
// blocks releases them as it commits.
//
// Ownership: the mount (mount::Instance) owns the data path and opens it on
// the store before posix and the background engines, which borrow it; it
// closes after them.
//
// Thread safety: all methods from any thread. Prepare needs no lock (its
// blobs are new); the Queue* calls for one inode and the commit that follows
// them must be serialized by the caller (the posix layer's inode stripe);
// reads need no lock. Lock order: the write point table's mutex, or one write
// point's, then the accounting mutex; none is held across I/O or a btree call.
// The commit hook (account.cc) runs under the btree's commit_mu and takes
// only the allocator's mutex.
#ifndef TFS_DATA_DATA_H_
#define TFS_DATA_DATA_H_

#include "alloc/allocator.h"
#include "btree/tree.h"
#include "data/extent.h"
#include "data/io_context.h"
#include "data/policy.h"
#include "platform/atomic.h"
#include "platform/sync.h"
#include "store/store.h"
#include "util/counters.h"
#include "util/log_limit.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::data {

// New extents whose blobs are written (their space pending in a Delta) but
// that are not yet in any transaction. Prepare does a write's device I/O with
// no inode lock held; the caller then queues them under its lock with
// QueuePrepared, which also removes what the range held (QueueWrite does both
// at once).
struct Prepared {
  struct Item {
    u64 end;  // the key's offset: the extent's end block
    u32 len;
    u8 value[kExtentValueMax];
  };
  u64 ino = 0;
  u64 first = 0;
  u32 blocks = 0;
  Vector<Item> items;
};

// The journal bytes a write of `nblocks` blocks queues at worst when no
// other writer shares its write point, the records its commit adds
// included: the punch of what the range held (an extent a block at worst:
// its whiteout, and per copy -- one on each of `members` members, kMaxPtrs
// at most -- a backpointer whiteout and its bucket's record; the two
// extents cut at the range's edges set again whole, with their
// backpointers) and the new extents with `copies` copies (split wherever a
// copy's bucket ends -- the copies' buckets need not be aligned with each
// other -- and every kMaxCompressedBlocks: each with a backpointer per
// copy; a crc per block; a record per bucket a copy touches; a data check
// per copy); and an accounting key per set of members the extents have
// copies on (at most one per extent, at most the sets `members` members
// make) and the reserved total's. Copies 1..kMaxPtrs, `bucket_blocks` >= 1
// (review 3b N1: the new extents' side was a fixed 12 KiB, which a
// fragmented four-copy file's overwrite on 64 KiB buckets exceeded).
usize WriteJournalBytes(u32 nblocks, u32 bucket_blocks, u32 members, u32 copies);
inline constexpr u32 kWriteBlocksMax = 256;  // blocks a write transaction carries at most (1 MiB)

// The counts the extents say (docs/design/copies.md, "Step 3b": the one
// rule), from one walk of the extents tree: each pointer's bucket
// (PtrBucket), whether it counts there against `a`'s states and generations
// (PtrCountsIn: user buckets only), what it adds (PtrSectors). Shared by
// fsck's rebuild of the allocation state, its accounting pass and the
// tests' check (DataPath::VerifyAgainstExtents), so that all count alike. Memory: 8 bytes a
// bucket, never per extent. Thread safety: reads the trees and the
// allocator (Get) like any reader; the caller runs it alone (mount, fsck).
struct ExtentCounts {
  // Per member: bucket b's live sectors at [2b], cached at [2b + 1]
  // (saturating at ~0u: past MaxCountSectors anyway).
  // Buckets that are not user read 0 (their pointers are foreign_buckets').
  Vector<u32> sums[dev::kMaxDevices];
  u64 bad_extents = 0;       // unparsable, or with a pointer outside every bucket (fsck's)
  u64 unwritten_blocks = 0;  // blocks of unwritten extents (reservations: no bucket)
  u64 foreign_buckets = 0;   // buckets that are not user with pointers that would count there (fsck drops them)
  // The kReplicas totals (alloc/accounting.h): sectors per set of members
  // an extent's counted non-cached pointers are on (CountedMembers), in
  // mask order; and the unwritten blocks' sectors are the kReserved total.
  Vector<alloc::ReplicasEntry> replicas;
  u32 live(u32 dev, u64 bucket) const { return sums[dev][2 * bucket]; }
  u32 cached(u32 dev, u64 bucket) const { return sums[dev][2 * bucket + 1]; }
};
Status CountExtents(btree::Btrees* trees, const sb::Superblock& sb, const alloc::Allocator& a, ExtentCounts* out);
// The accounting totals (alloc/accounting.h) the counts say: the kReserved
// total first (the unwritten blocks' sectors, 0 included), then every
// kReplicas set's, in mask order. For the mount's check, fsck's pass and
// its rebuild (which writes them whole).
Status AcctTotals(const ExtentCounts& counts, Vector<alloc::AcctValue>* out);

// Space changes a write or punch makes, applied once its transaction commits.
struct Delta {
  // One bucket's change, its fields in the order Account takes them (and
  // named at every construction: .dev = ..., .blocks = ...).
  struct Change {
    u32 dev = 0;
    u64 bucket = 0;
    i64 blocks = 0;   // live (file) blocks gained or lost
    i64 cached = 0;   // cached (file) blocks gained or lost (a cached pointer's: never live)
    i64 pending = 0;  // disk blocks reserved for the write (released by Apply or Abort)
    // A gain's (blocks or cached > 0): the generation of the bucket the
    // gained pointer names. Without pending blocks (a new pointer into a
    // blob committed before), Commit refuses the gain (kAgain) unless the
    // bucket is still the user bucket of that generation, and not being
    // freed, and holds it until the counts are published. kNoGen: none
    // given (kInvalidArgument for a gain).
    u32 gen = kNoGen;
    static constexpr u32 kNoGen = 0x100;
  };
  Vector<Change> changes;
  // The kReplicas totals it changes (alloc/accounting.h): per set of
  // members an extent's counted non-cached pointers are on
  // (CountedMembers), the sectors gained or lost -- one entry per set
  // (AddSet sums). Whoever adds or removes a counted pointer of an extent
  // moves its sectors from the old set to the new one.
  struct SetChange {
    dev::DevMask members = 0;
    i64 sectors = 0;
  };
  Vector<SetChange> sets;
  [[nodiscard]] Status AddSet(dev::DevMask members, i64 sectors);
  // Whether it changes nothing (a punch that found no extent).
  bool empty() const { return changes.empty() && sets.empty() && reserved == 0 && unreserved == 0; }
  dev::DevMask deps = 0;   // members written
  // Members holding an extent's only counted copy (its one pointer, or the
  // one not on a cache-only member): the journal may go on without a member
  // of deps whose flush fails (5c-3) only if it is not one of these.
  dev::DevMask sole = 0;
  i64 sectors = 0;         // change of the inode's allocated 512-byte sectors
  u64 ino = 0;             // the inode whose extents it changes (set by the Queue* calls)
  u64 reserved = 0;        // unwritten blocks added (counted at once; Abort returns them)
  u64 unreserved = 0;      // unwritten blocks removed (released by Apply)
};

// The kReplicas change of an extent whose pointers change from `from` to
// `to` (the same blocks: a copy added or dropped, one made cached): its
// sectors leave from's set and join to's (nothing when the sets are the
// same). For whoever re-keys an extent outside QueueWrite and QueuePunch
// (which keep the sets themselves).
Status MoveSet(const sb::Superblock& sb, const Extent& from, const Extent& to, Delta* delta);

// A copy a read found bad (docs/design/copies.md, "Step 6b"): queued by
// the read that another copy served, taken by the mount's repair worker
// (posix's), which rewrites it from a good copy. Plain values.
struct CopyRepair {
  u64 ino = 0;
  u64 end = 0;    // the extent's key (its end block)
  u64 start = 0;  // its first block, as read
  Extent::Ptr bad;   // the pointer as read
  bool io_error = false;  // the read failed with an I/O error (else: a checksum mismatch)
};

// The new copy of a repair (or a move) prepared: written, its space
// pending in the caller's Delta, in no transaction yet; and the extent's
// value as it was seen, which QueueReplacePtr commits over only if the
// tree still holds it byte for byte. ~750 bytes: on the heap in the kernel.
struct Replacement {
  u64 ino = 0;
  u64 end = 0;
  u8 seen[kExtentValueMax];
  u32 seen_len = 0;
  Extent::Ptr old;       // the pointer replaced
  bool has_new = false;  // false: `old` is dropped (a cached copy), not replaced
  Extent::Ptr now;       // the new copy (has_new)
};

// The data path's counters (util/counters.h).
#define TFS_DATA_COUNTERS(X, A)                                                                          \
  X(bytes_written, counter, "file data bytes written")                                                   \
  X(extents_written, counter, "extents written")                                                         \
  X(bytes_read, counter, "file data bytes read")                                                         \
  X(blocks_read, counter, "blocks read from members")                                                    \
  X(blocks_released, counter, "blocks overwritten, punched or freed")                                    \
  X(csum_errors, counter, "blocks whose checksum did not match")                                         \
  X(buckets_opened, counter, "buckets opened for new data")                                              \
  X(write_points, level, "write points open (one per target and I/O class in use)")                     \
  X(buckets_freed, counter, "data buckets freed")                                                        \
  X(blocks_reserved, level, "unwritten blocks (fallocate) committed or queued now")                    \
  X(reserve_refused, counter, "writes and fallocates refused to keep reservations whole")                \
  X(reserve_underflows, counter, "commits releasing more unwritten blocks than the sum held (a reserved total too low: damage, fsck)") \
  X(compressed_in, counter, "bytes given to zstd")                                                       \
  X(compressed_out, counter, "bytes stored for them")                                                    \
  X(incompressible, counter, "chunks stored plain: zstd saved less than a block")                        \
  X(compressed_reads, counter, "blobs read and decompressed")                                            \
  X(stale_lookups, counter, "reads that found a bucket freed since their lookup, and looked again")      \
  X(lookup_retries, counter, "extent lookups of reads repeated: a commit of the inode overlapped")       \
  X(read_retries, counter, "copies read because a copy read before failed (checksum, I/O error, bad or stale pointer)") \
  X(hedged, counter, "copies read beside another that had not answered within its member's hedge bound") \
  X(hedge_wins, counter, "reads a hedged copy answered first")                                            \
  X(copies_reordered, counter, "reads of several copies whose first choice was not the extent's first copy (health, latency)") \
  X(abandoned_reads, gauge, "reads of copies still at a member that no reader waits for (a hedge's loser)") \
  X(slow_member_flushes, counter, "commits that flushed a member without a journal (an HDD) before entering it") \
  X(write_point_fallbacks, counter, "writes sent to the foreground target's write point (the table was full)") \
  X(gains_refused, counter, "commits refused (kAgain): a pointer they add names a bucket freed, reused or being freed since it was read") \
  X(punch_batches_cut, counter, "punch batches (truncate, punch, free) ended early to fit the journal entry")         \
  X(replica_copies, counter, "copies written beside an extent's first (replicas)")                                      \
  X(copy_write_errors, counter, "copies whose write failed: the extent kept the copies written")                        \
  X(copy_alloc_errors, counter, "further copies whose bucket's allocation failed, not for want of space: the write went on with fewer")     \
  X(degraded_writes, counter, "extents written with fewer copies than wanted (too few members, full or failing)")      \
  X(degraded_sectors, counter, "512-byte sectors of those extents")                                    \
  X(late_copies, counter, "copies a replicated write left behind: not written within their member's late bound") \
  X(late_writes, gauge, "replicated writes left to their copies' completions (a late copy still at its member: its space held until done)") \
  X(copies_passed_stalling, counter, "replicated writes whose further copies passed over stalling members (the write went degraded)") \
  X(repairs_queued, counter, "bad copies (checksum, I/O error) a read served by another copy queued for repair") \
  X(repairs_dropped, counter, "bad copies not repaired: the queue was full, or they were left in it at unmount (a later read queues them again)") \
  X(repairs_waiting, gauge, "repairs queued and not yet taken")                                        \
  X(repaired, counter, "bad copies rewritten from a good copy (on their own member)")                  \
  X(repair_cached_dropped, counter, "bad cached copies dropped (not rewritten)")                      \
  X(repair_skipped, counter, "repairs not done: the extent changed since the read, or the copy's member failed since (the reconcile's)") \
  X(repair_failed, counter, "repairs that failed (no space on the member, no good copy, an I/O error): logged")

struct Stats {
  TFS_COUNTER_FIELDS(TFS_DATA_COUNTERS)
};

class DataPath {
 public:
  DataPath() = default;
  ~DataPath();
  DataPath(const DataPath&) = delete;
  DataPath& operator=(const DataPath&) = delete;

  // Takes the counts, the reservations and the replicas totals as the
  // store loaded them (the bucket records, the accounting keys: no walk of
  // the extents, step 3b-5b -- the store cross-checked them and freed the
  // user buckets counting nothing). The store stays open until Close.
  Status Open(store::Store* store);
  void Close();
  // Tests and the benchmarks' checks: one walk of the extents (CountExtents,
  // AcctTotals) against what the mount trusts -- the user buckets whose
  // counts differ, and the accounting totals that differ (or sets with
  // sectors no extent has). Changes nothing. While nothing commits.
  Status VerifyAgainstExtents(u64* counts_wrong, u64* totals_wrong);

  bool open() const { return store_ != nullptr; }
  store::Store* store() const { return store_; }
  // The members as Open found them (policy.h): what extents' policies are
  // read against.
  const MemberTable& members() const { return members_; }

  // Writes `nblocks` whole blocks at file block `first` for `ctx` (its
  // target's write point, its origin, class and watermark) and queues their
  // extents into tx, replacing whatever the range held; compressed where zstd
  // saves a block if `compress`. The extents have the unset policy (tests;
  // posix writes through Prepare and QueuePrepared).
  Status QueueWrite(const IoContext& ctx, btree::Transaction* tx, u64 ino, u64 first, const u8* blocks,
                    u32 nblocks, Delta* delta, bool compress = false);
  // QueueWrite in two steps (see Prepared). Delta collects both; a Prepare
  // that fails, or whose transaction does not commit, is undone by Abort.
  Status Prepare(const IoContext& ctx, u64 ino, u64 first, const u8* blocks, u32 nblocks, bool compress,
                 Prepared* out, Delta* delta);
  // QueuePrepared stamps `policy` (the file's options as they are when the
  // transaction is queued: under the inode's lock, not Prepare's earlier
  // read) into every extent it queues, keeping the flags Prepare set
  // (kPolicyIncompressible: compression was asked for and zstd saved
  // nothing). A policy changes no value's length.
  Status QueuePrepared(btree::Transaction* tx, const Prepared& p, const Policy& policy, Delta* delta);
  // QueuePrepared for a caller that has queued the punch of p's blocks itself
  // (in the same transaction: a truncate's punch from p's first block on).
  Status QueuePreparedOverPunch(btree::Transaction* tx, const Prepared& p, const Policy& policy);
  // Queues the removal of the blocks in [first, end) (holes afterwards).
  // With max_keys (a batch of a truncate, punch or free; the caller commits
  // and calls again for the rest): at most max_keys extents, and it stops
  // before an extent whose worst case -- its keys, backpointers and the
  // bucket records Commit adds for it (Transaction::KeyBytes) -- would not
  // leave `reserve` journal bytes of the entry for what the caller queues
  // after (the inode; a tail and its records: PreparedJournalBytes); always
  // one extent at least. *more (optional): whether it stopped before the end
  // (an extent of the range is left). Without max_keys (a write's own
  // punch, which must be whole) it queues everything, kTooBig if that does
  // not fit.
  Status QueuePunch(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys = ~0u,
                    usize reserve = 0, bool* more = nullptr);
  // The journal bytes QueuePreparedOverPunch queues for p, and the records
  // Commit adds for delta's changes (at most one each): what a caller
  // punching in batches before p keeps room for (QueuePunch's reserve).
  Result<usize> PreparedJournalBytes(const Prepared& p, const Delta& delta);
  // The most blocks (kWriteBlocksMax at most, 1 at least) one write for
  // ctx may carry in a transaction so that its worst case alone on its
  // write point (WriteJournalBytes: this filesystem's bucket size, the
  // copies ctx wants, old extents with a copy on every member, kMaxPtrs at
  // most) leaves `reserve` bytes of a journal entry for what the caller
  // queues beside it (the inode). Writers sharing the write point can end
  // each other's buckets sooner -- more pieces than the bound has: the
  // caller redoes a transaction refused with kTooBig in smaller pieces.
  u32 WriteBlocksFitting(const IoContext& ctx, usize reserve);
  // Queues unwritten extents over the holes of [first, end), at most max_keys
  // of them, and sets *next to where it stopped (end when done). kNoSpace if
  // free space minus the reservations cannot hold the holes queued.
  Status QueueReserve(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys,
                      u64* next);
  // When a delta is given up before its commit, or by Commit when its
  // commit published nothing (it failed before the journal took the entry):
  // the space its writes reserved goes back, and so do its reservations; a
  // bucket left empty is freed. (The counts never moved: they move only in
  // a journaled commit. A commit whose apply failed after the journal took
  // it published them: Commit releases that one as a successful one, not
  // with Abort.)
  void Abort(const Delta& delta);
  // The slow-member rule for the journal (docs/format/journal.md): data on a
  // member that holds no journal ring (an HDD) is flushed by its own
  // committer before the commit enters the journal, and the commit depends on
  // journal members only -- so no later commit's flush (an SSD-only fsync)
  // ever waits for that member; a commit of HDD data waits for the HDD, as it
  // must. FlushSlowMembers does it ahead of the commit (so a caller can do it
  // before taking its inode lock) and takes those members out of
  // delta->deps; Commit does it for whatever is left. The flushes carry
  // ctx's origin and class.
  Status FlushSlowMembers(const IoContext& ctx, Delta* delta);
  // Commits tx (kNoFlush, with delta.deps) with the records of the buckets
  // whose counts the delta changes (one per bucket: the changes summed, in
  // sectors; computed and published by the commit hook), then releases the
  // space the writes reserved and frees the buckets the commit emptied -- or
  // Aborts the delta if the commit fails (kTooBig too when the records do
  // not fit the journal entry beside the keys). A commit whose apply failed
  // after the journal took it (the trees are failed) published the counts:
  // its delta is released as a successful one's, without the frees. Every
  // bucket the delta gains in is held from before the commit until then (by
  // the write's pending blocks, or a transient one: HoldGains), so no free
  // can come between the count's staging and its publishing; a gain whose
  // bucket is no longer the user bucket of its Change::gen, or is being
  // freed, refuses the commit (kAgain, counted: gains_refused; the caller
  // reads the extent again).
  // The end of every write, punch and reservation: nothing else moves the
  // counts.
  Status Commit(const IoContext& ctx, btree::Transaction* tx, const Delta& delta,
                journal::CommitMode mode = journal::CommitMode::kNoFlush);

  // Reads blocks [first, first + nblocks) into buf (nblocks * kBlockSize bytes;
  // read into directly if kBlockSize-aligned, else through a bounce buffer)
  // with ctx's origin and class. On failure buf's contents are unspecified.
  Status ReadBlocks(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, u8* buf);
  // Whether the inode has any extent.
  Result<bool> HasData(u64 ino);
  // Whether a written extent (not a hole, not unwritten) holds the block.
  Result<bool> HasBlockData(u64 ino, u64 block);
  // The first block at or after `block` that written extents hold (`data`;
  // kNoBlock if none) or that they do not (a hole; past the last extent at
  // most). Unwritten extents read as zeros and count as holes, as ext4 and
  // XFS report them. Buffered writes are the caller's (posix::Filesystem).
  static constexpr u64 kNoBlock = ~u64(0);
  Result<u64> SeekBlock(u64 ino, u64 block, bool data);

  // The repair of bad copies (docs/design/copies.md, "Step 6b"). The queue:
  // TakeRepair pops the oldest entry (false: none); a waiter reads
  // RepairSeq, then, finding nothing, WaitRepairs(seq) until a queue or
  // KickRepairs changes it (or the timeout passes).
  bool TakeRepair(CopyRepair* out);
  u32 RepairSeq() const { return repair_seq_.Load(MemOrder::kAcquire); }
  void WaitRepairs(u32 seq, u64 timeout_ns);
  void KickRepairs();
  // The context of a repair's I/O: the background class and watermark,
  // origin kReconcile, space on the bad copy's member, one copy.
  static IoContext RepairContext(const CopyRepair& r);
  // A repair's first step, no lock held (device I/O): r's extent looked up
  // again -- kAgain if it no longer has r.bad (changed: nothing to do);
  // kMissing if r.bad's member is failed or missing (the reconcile's) --
  // then, unless r.bad is cached (dropped, no I/O), a good copy read and
  // verified (the copies ranked as a read ranks them, r.bad left out) and
  // written to new space on r.bad's member (RepairContext; kNoSpace if that
  // member has none): a compressed source's blob whole, a plain one's
  // extent blocks. The new space is pending in *delta (Abort it if the
  // repair goes no further). *out: the extent as seen and the new pointer.
  Status PrepareRepair(const CopyRepair& r, Replacement* out, Delta* delta);
  // The re-key (a repair's, later the mover's), under the caller's
  // serialization of the inode's extent commits (posix's inode lock): if
  // the extent still holds r.seen byte for byte (else kAgain), queues into
  // tx its new value -- r.old replaced by r.now in its place, or dropped --
  // with the backpointers swapped, r.now's journal data check, and in
  // *delta r.old's blocks uncounted, the replicas set moved, the sole-copy
  // mark. The caller commits (Commit) or aborts the delta.
  Status QueueReplacePtr(btree::Transaction* tx, const Replacement& r, Delta* delta);
  // A repair's outcome, counted (repaired, repair_cached_dropped,
  // repair_skipped for kAgain and kMissing, repair_failed) and logged (at
  // most one line per kRepairLogNs each for the repaired and the failed);
  // every entry TakeRepair hands out ends here.
  void NoteRepair(const CopyRepair& r, const Replacement* done, Status st);

  Stats GetStats() const;
  // The blocks a bucket's counts hold now (the allocator's, published):
  // live (pointers not cached) and cached (0 for a bucket outside the
  // members). For tests and the ctl document.
  void BucketCounts(u32 dev, u64 bucket, u32* live, u32* cached) const;
  // The bucket ctx's write point has open (false: none yet). For tests and
  // the ctl document.
  bool WritePointBucket(const IoContext& ctx, alloc::BucketRef* out);
  // Tests: at most `n` write points for targets other than kForeground (at
  // most kMaxWritePoints - kIoClassCount), to reach the full table's
  // fallback. Before the first write.
  void LimitWritePointsForTest(u32 n) { wp_limit_ = Min<u32>(n, kMaxWritePoints - dev::kIoClassCount); }
  // Tests: the copies of an extent are read in the order it lists them,
  // not ranked by their members' health and latency (hedges and retries as
  // ever): for tests that damage a chosen copy and count what the read did.
  void SetListedReadOrderForTest(bool on) { listed_order_ = on; }
  // Writes with late copies out at once, at most (each holds its data's
  // copy and its space): past it, a replicated write waits for every copy.
  static constexpr u64 kMaxLateWrites = 32;
  // Tests: no hedged reads (a copy is read only when the one before it
  // failed), for tests that count exact results: a hedge bound of 2 ms is
  // passed by a test device's thread descheduled under load.
  void SetHedgingForTest(bool on) { hedging_ = on; }
  // Tests: replicated writes wait for every copy and pass no member over
  // (6c off), for tests that hold copies and count exact results.
  void SetLateCopiesForTest(bool on) { late_copies_ = on; }
  // Tests: the blocks reserved for writes not yet applied or aborted on
  // member `dev`, all its buckets (0 whenever nothing is being written).
  u64 PendingBlocksForTest(u32 dev) const;
  // Tests: fn(ctx) runs after each extent lookup of a read (phase 1) and
  // before its device reads, with no lock held -- a commit in between, as
  // another thread's could land. Before the first read; null to remove.
  void SetLookupHookForTest(void (*fn)(void*), void* ctx) {
    lookup_hook_ = fn;
    lookup_hook_ctx_ = ctx;
  }
  // Tests: fn(ctx, point) runs, with no data path lock held, at
  // "commit.applying" (Commit: the transaction committed, before Apply) and
  // "free.decided" (FreeReleased, before it frees the buckets ReleaseLocked
  // or the last Unpin chose). Before the first commit;
  // null to remove.
  void SetTestPointForTest(void (*fn)(void*, const char*), void* ctx) {
    test_point_ = fn;
    test_point_ctx_ = ctx;
  }

 private:
  // An open bucket new data of one (target, class) is appended to. Created on
  // first use, kept until Close (the table only grows: a handful of
  // contexts exist, kMaxWritePoints at most -- files' targets add one per
  // member or group they name). Keyed by the target WritePointTarget makes
  // of ctx's, so targets with the same members share one.
  //
  // A write point has up to kMaxPtrs open buckets (slots); a write takes
  // one per copy it wants, on distinct members, chosen by member rather
  // than by index (Reserve): any open slot with room on a member the copy
  // may use, and a new bucket only when none has room. Files of the target
  // wanting 1 and 2 copies share it. WritePointBucket reports slot 0 (the
  // one a one-copy write point fills and refills).
  struct WritePoint {
    struct Slot {
      bool open = false;       // under mu
      alloc::BucketRef ref{};  // under mu
      u64 used = 0;            // blocks handed out, under mu
    };
    Target target;
    dev::IoClass io_class = dev::IoClass::kForegroundSync;
    Mutex mu;
    Slot slots[kMaxPtrs];
    Atomic<u64> left{0};  // blocks not handed out, all slots (FreeBlocksLocked reads it without mu)
  };
  // The key of t's write point: a member's group of one member is that
  // member (kMember), a larger group is named by its first member, and a
  // member index is taken modulo kMaxDevices (as Reserve's mask takes it) --
  // so no two keys place data on the same members, and at most
  // kSbTargetKinds + 2 * kMaxDevices targets have write points.
  Target WritePointTarget(Target t) const;
  // ctx's write point (WritePointTarget's), created if new (kNoMemory). When
  // the table is full (it cannot be while the bound below holds), the
  // filesystem's foreground target's write point of ctx's class instead
  // (counted: write_point_fallbacks): a write still lands, on the
  // filesystem's target, never fails for want of a table entry.
  Result<WritePoint*> FindWritePoint(const IoContext& ctx);
  // Space Reserve found for one copy: the bucket and the byte offset in it.
  struct Space {
    alloc::BucketRef ref{};
    u64 offset = 0;
  };
  // Space for up to `want` blocks (*got, the same for every copy) at ctx's
  // write point, on as many distinct members (*copies, into out[]) as it
  // takes to reach the copies ctx wants by durability (Wanted), kMaxPtrs at
  // most: the first from the write point's target (else any member, the
  // allocator's fallback), the others from the target's members of nonzero
  // durability only. Fewer when too few members have room (degraded: the
  // caller counts it); kNoSpace (or the allocator's error) only when no
  // copy has space -- no open slot has room and no bucket is free -- or
  // unless what stays free after the first copy covers the reservations
  // other than `covered` (the reserved blocks this write replaces) --
  // further copies are dropped before the reservations would be eaten
  // into. `whole`: all `want` blocks or none (a compressed blob): a slot
  // with less room left is passed over (a new bucket goes into another
  // slot, or replaces the emptiest).
  Status Reserve(const IoContext& ctx, u32 want, u64 covered, bool whole, Space* out, u32* copies, u32* got);
  // The copies ctx wants (its replicas, else the filesystem's for the
  // foreground write path and one for any other origin), 1..kMaxPtrs.
  u32 Wanted(const IoContext& ctx) const;
  // Writes `len` bytes of `data` to every copy in sp[0..copies) at once
  // (one submission each, then one wait): each copy's result in per[].
  // Two or more copies (docs/design/copies.md, "Step 6c"): from a copy of
  // the data the write owns (a Flight), never submitted inline, and once
  // some copy is written a copy still out after its member's late bound
  // (LateBoundNs, from its submission) is left behind: per[c] kIoTimeout
  // and late[c] true -- its space stays pending until its request
  // completes (Reap(true) gives it back), counted late_copies. Returns
  // kNoMemory if the copy of the data or the requests could not be
  // allocated (nothing written), else ok.
  Status WriteCopies(const IoContext& ctx, const Space* sp, u32 copies, const u8* data, u64 len, Status* per,
                     bool* late);
  // After WriteCopies: a copy that failed gives its space back (its change
  // in delta, from index first_change on, zeroed) and is counted; a late
  // one's change is zeroed too, its space left to Reap(true); the written
  // ones become x's pointers (dev, gen, offset; the caller fills the rest)
  // and join delta->deps; an extent whose copies count less than ctx
  // wants is counted degraded (blocks: its file blocks). The first copy's
  // error when none was written.
  Status KeepWritten(const IoContext& ctx, const Space* sp, u32 copies, const Status* per, const bool* late,
                     u64 first_change, u64 blocks, Delta* delta, Extent* x);
  // Whether member `dev` is stalling (6c, dev::Stalling): its queue
  // reports a stall, or its oldest request at the device is older than its
  // late bound (dev::LateBoundNs). Further copies of a write pass it over
  // (Reserve).
  bool Stalling(u32 dev) const;

  // KeepWritten's log line for a copy whose write failed: at most one per
  // member per kCopyErrorLogNs, naming the failures not logged since.
  void LogCopyError(u32 dev, const Status& st, bool late);
  // Reserve's for a further copy whose bucket's allocation failed other
  // than for want of space (a journal settle's error): at most one per
  // kCopyErrorLogNs, the same way.
  void LogCopyAllocError(const Status& st);
  // Frees buckets ReleaseLocked gave out (no lock of the data path's held
  // but, in Close when memory is short, wps_mu_) with one record commit
  // (Allocator::FreeBuckets; Free for one, or for each when the batch's
  // list cannot be allocated), counting those freed (buckets_freed). One
  // the allocator did not free (still the user bucket of its ref's
  // generation) loses its kFreeing mark: the next mount frees it. The
  // allocator's first error.
  Status FreeReleased(const alloc::BucketRef* refs, u32 n);
  // Records the pending space of sp[0..copies) (`blocks` live, `pending`
  // disk blocks each) in delta, or gives it back when the delta cannot grow.
  Status RecordCopies(const Space* sp, u32 copies, u32 blocks, u32 pending, Delta* delta);
  // One chunk of QueueWrite, stored compressed: kNotSupported if zstd does not
  // save a block (the caller stores it plain).
  Status WriteCompressed(const IoContext& ctx, Prepared* p, u64 first, const u8* data, u32 nblocks, u64 covered,
                         Delta* delta);
  // Unwritten blocks in [first, end) (the reservation a write there replaces).
  Result<u64> UnwrittenBlocks(u64 ino, u64 first, u64 end);
  // Reads and decompresses the blob of e's compressed pointer p into out
  // (p.stored_blocks blocks; CheckBlob).
  Status ReadCompressed(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u8* out);
  // Reads blocks [lo, hi) of piece e from its copy p into buf (the read's
  // buffer for block lo) through bounce buffer *tmp (allocated on first
  // use) and verifies them. *stale (and kAgain) if p's bucket is not (any
  // more) the one it names: freed since the lookup, or a stale copy.
  Status ReadCopy(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi, u8* buf, u8** tmp,
                  bool* stale);
  // Whether pointer p counts in a bucket, and which (*bucket): the
  // accounting's one rule, so Open and QueuePunch count and uncount the same
  // pointers. A pointer outside the buckets (data::PtrBucket: the same for
  // every piece of an extent) counts nowhere (fsck's business); a cached
  // pointer counts only while it is current -- its bucket a user bucket of
  // its generation. A stale cached pointer (its bucket was invalidated or
  // reused) is normal, not damage: it counts nowhere, and fsck -y drops it.
  // A counted cached pointer stays current: its count keeps the bucket from
  // being freed but by the cache letting it go; and a stale one never looks
  // current again, however often its bucket is reused (the generation guard:
  // docs/format/alloc.md, "Generations").
  bool PtrCounts(const Extent::Ptr& p, u64* bucket) const;
  // A read holds the bucket it reads from: Pin fails if the bucket is no
  // longer the user bucket of generation `gen` (freed since the lookup), or
  // is being freed (kFreeing: the free is decided and not yet made); while
  // pinned, a bucket that empties is only marked, and the last Unpin frees
  // it.
  bool Pin(u32 dev, u64 bucket, u8 gen);
  void Unpin(u32 dev, u64 bucket);
  static constexpr u32 kDoomed = 1u << 31;  // reads_: emptied while read
  // Reads of an extent with several copies (read.cc; docs/design/copies.md,
  // "Step 6"): a Flight reads the best copy into its own buffer and, if it
  // has not answered within its member's hedge bound, the next one too;
  // the first good answer is copied out. A copy that fails starts the next
  // at once (read_retries). Returns whether a copy served blocks [lo, hi)
  // of e into out; else *failed is the best-ranked failing copy's error and
  // *stale_copy whether a copy was stale (as ReadCopy's *stale).
  struct Flight;
  bool ReadCopies(const IoContext& ctx, const Extent& e, u64 lo, u64 hi, u8* out, u8** tmp, Status* failed,
                  bool* stale_copy);
  // e's copies best first into order[] (indices of e.ptrs), and each one's
  // hedge bound: ranked by their members' health, then by expected wait
  // where it differs clearly, then the fast tier when no latency is known
  // yet; ties keep e's order.
  void OrderCopies(const Extent& e, u8* order, u64* bound) const;
  // A member's hedge bound from its read state: 4 x the p99 of its window
  // (fewer than kHedgeMinSamples: 4 x its EWMA; none: the ceiling), within
  // [kHedgeMinNs, kHedgeMaxNs].
  static u64 HedgeBoundNs(const dev::ReadState& rs);
  // A copy's read on member `dev` failed with st: an I/O error (not a
  // checksum mismatch) ranks the member below the healthy ones for
  // kReadErrorMemoryNs (read_error_ns_). ReadCopies' and ReadGoodCopy's.
  void NoteReadFailure(u32 dev, const Status& st);
  static constexpr u64 kHedgeMinNs = 2'000'000ull;
  static constexpr u64 kHedgeMaxNs = 50'000'000ull;
  static constexpr u32 kHedgeMinSamples = 16;
  // A later copy goes first by expected wait only when it is under half
  // the earlier one's and kReorderMarginNs less (noise of a few requests
  // never reorders two members of one kind).
  static constexpr u64 kReorderMarginNs = 1'000'000ull;
  // A member whose read failed with an I/O error ranks below the healthy
  // ones for this long (read_error_ns_).
  static constexpr u64 kReadErrorMemoryNs = 10'000'000'000ull;
  // A reader whose copies have all answered waits this many spins (yields in
  // userspace) for their completions' last steps before it leaves the
  // flight to Reap.
  static constexpr u32 kLeaveSpins = 1000;
  // The checks of a copy read into `data` (blocks [lo, hi) of e's plain
  // copy p, read at device offset `at`; or p's whole compressed blob,
  // decompressed into `out`, p.stored_blocks blocks): a mismatch is logged,
  // counted and kDataCorrupt.
  Status CheckBlocks(const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi, const u8* data, u64 at);
  // Counts blocks [lo, hi) of e served from copy p (bytes_read: what was
  // read from the member -- a compressed copy's whole blob).
  void CountRead(const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi);
  Status CheckBlob(const Extent& e, const Extent::Ptr& p, const u8* z, u8* out);
  // Queues a repair of e's copy `c` (ReadCopies, for a copy that failed
  // while another served): unless the store is read-only, c's member is
  // failed or missing, or the same copy is queued already; full:
  // repairs_dropped.
  void QueueRepair(const Extent& e, u32 c, bool io_error);
  // Close's: what is still queued is dropped (repairs_dropped).
  void DropRepairs();
  // PrepareRepair's read of a good copy of e other than copy `skip`, whole,
  // verified, into buf (kMaxExtentBlocks blocks; a compressed copy's blob
  // as stored, decompressed into `scratch` to be checked): the copy that
  // served (*from), or the best-ranked copy's error.
  Status ReadGoodCopy(const IoContext& ctx, const Extent& e, u32 skip, u8* buf, u8* scratch, u32* from);
  // Completion of a flight's copy (dev::Io::done): an atomic store, a
  // wake, and -- for the last reference of a flight its reader left -- a
  // push on the reap list. Nothing freed, no sleep.
  static void FlightCopyDone(dev::Io* io, Status st);
  void FreeFlight(Flight* f);
  // A flight done with: a write's late copies' pending blocks given back
  // (Account: their requests are done), then freed.
  void FinishFlight(Flight* f);
  // Finishes the abandoned flights that have completed: the reads' (reap_,
  // abandoned_reads: at the next read, and Close) or, `writes`, the
  // replicated writes' (late_, late_writes: from a writer's context -- a
  // freed bucket is a record commit -- and Close).
  void Reap(bool writes = false);
  // The waiter (reader, writer) leaves flight f: when `settled` (every
  // completion it waits for taken) it waits up to kLeaveSpins for their
  // last steps; then finishes f if it holds the last reference, else counts
  // it abandoned (abandoned_reads, late_writes) for the last completion.
  void LeaveFlight(Flight* f, bool settled);
  struct Piece;
  // ReadBlocks' phase 1: the extents over [first, end) into `pieces` (one
  // per extent: it grows as they are found), with the crcs the read needs
  // copied into `crcs` (end - first of them at most).
  Status FindPieces(u64 ino, u64 first, u64 end, Vector<Piece>* pieces, u8* crcs);
  // Adds the journal data check of each copy of e to `tx` (its blobs just
  // written whole: a prepared item's, a repair's new copy).
  Status QueueDataChecks(btree::Transaction* tx, const Extent& e);
  // Extent commits' applies to the tree, per stripe of inodes (see ReadBlocks):
  // odd while one is applying its keys (btree::Transaction::SetApplySeq), bumped
  // by two for each. A commit that waits for the journal or a device is not
  // applying: readers do not wait for it.
  static constexpr u32 kCommitStripes = 256;
  static u32 CommitStripe(u64 ino) { return u32((ino * 0x9e3779b97f4a7c15ull) >> 56); }
  Atomic<u64> applying_[kCommitStripes] = {};
  static constexpr u32 kMaxStaleLookups = 16;
  // Walks of a read's extents that found them overlapping (a torn walk) while
  // no apply ran: this many mean extents that overlap for good (fsck reports
  // them), and the read fails as corrupt. (A walk that raced an apply is
  // retried and not counted.)
  static constexpr u32 kMaxTornWalks = 2000;
  // Blocks free for user data: free and soon-free buckets above the foreground
  // floor, plus what is left in the write points. Under acct_mu_.
  u64 FreeBlocksLocked() const TFS_REQUIRES(acct_mu_);
  Status FlushMembers(const IoContext& ctx, dev::DevMask mask);
  // Moves a bucket's pending blocks by `pending` and frees it once its
  // counts, pending blocks and write point hold are all zero -- if it is
  // still at generation `gen` (kCurrentGen: the caller held it until now,
  // by the pending blocks or the hold it drops).
  static constexpr u32 kCurrentGen = 0x100;
  void Account(u32 dev, u64 bucket, i64 pending, u32 gen = kCurrentGen);
  // A user bucket (of generation `gen`, see Account) no extent, write or
  // write point holds any more: freed now, or by the last read that has it
  // pinned (kDoomed). Sets *ref, marks the bucket kFreeing and returns true
  // when the caller is to free it (after dropping acct_mu_: FreeReleased).
  bool ReleaseLocked(u32 dev, u64 bucket, alloc::BucketRef* ref, u32 gen = kCurrentGen) TFS_REQUIRES(acct_mu_);
  // held_'s bits. kFreeing: the bucket's free is decided (ReleaseLocked, the
  // last Unpin) and not made yet -- Pin and a commit's gain refuse it, so
  // nothing takes it between the decision and the Free (which bumps its
  // generation: from then on the state says so). A write point taking a
  // bucket from the allocator (a new life) sets held_ to kWritePointHold,
  // clearing it; a Free that fails clears it (FreeReleased).
  static constexpr u8 kWritePointHold = 1;
  static constexpr u8 kFreeing = 2;
  // One commit's count changes (Commit's stack): a stage per bucket whose
  // counts the delta changes, in the order of their SetLater slots (from
  // first_slot), and the hook that stages and publishes them.
  struct CommitCounts {
    DataPath* dp = nullptr;
    Vector<alloc::CountStage> stages;
    u32 first_slot = 0;
    // The accounting totals it changes (the delta's sets and reserved
    // blocks, in sectors), their slots from first_acct_slot, and what
    // Accounting::Stage made of them.
    Vector<alloc::AcctChange> acct;
    Vector<alloc::AcctValue> acct_staged;
    u32 first_acct_slot = 0;
    btree::CommitHook hook;
    bool published = false;  // FinishCounts published the stages
    alloc::CountNote note;   // what the hook met, logged by Commit after tx->Commit (no log under commit_mu)
    // The buckets the delta gains in, each held by one pending block from
    // QueueCounts until Apply or the abort (DropHolds).
    Vector<alloc::BucketRef> holds;
  };
  // Before tx->Commit: sums the delta per bucket (sectors), queues one
  // SetLater slot per bucket whose counts change (kBtreeAlloc (dev,
  // bucket), a record), holds the buckets it gains in (HoldGains) and sets
  // the hook. kTooBig if the records do not fit the entry, kAgain (or
  // kInvalidArgument) from HoldGains; the caller aborts (no hold is left).
  Status QueueCounts(btree::Transaction* tx, const Delta& delta, CommitCounts* cc);
  // Every gaining change names its gen (else kInvalidArgument). Under
  // acct_mu_, the bucket of each gain without pending blocks of its own (a
  // new pointer into a committed blob) must still be the user bucket of
  // that gen and not kFreeing (else kAgain, counted); then each stage that
  // gains in a bucket the delta has no pending blocks in takes one, listed
  // in cc->holds (pending blocks hold their buckets until Apply or Abort
  // already: a write takes no lock here). All or nothing.
  Status HoldGains(const Delta& delta, CommitCounts* cc);
  // Drops cc's holds (Account: a bucket nothing holds any more is freed).
  void DropHolds(CommitCounts* cc);
  // The commit hook (btree::CommitHook), under commit_mu: PrepareCounts
  // stages the new counts (Allocator::StageCounts) and writes the records
  // into the slots; FinishCounts publishes them once journaled.
  static Status PrepareCounts(void* ctx, btree::Transaction* tx);
  static void FinishCounts(void* ctx, u64 seq, bool journaled);
  // After a commit that published its counts: releases the writes' pending
  // blocks, the holds and the removed reservations, and (`frees`: the
  // commit succeeded) frees the buckets the commit emptied, at the
  // generation they were emptied at. Without `frees` (the apply failed
  // after the journal took the entry: the trees are failed, nothing
  // commits) those are left to the next mount.
  void Apply(const Delta& delta, CommitCounts* cc, bool frees);

  store::Store* store_ = nullptr;
  btree::Btrees* trees_ = nullptr;
  u64 bucket_blocks_ = 0;
  dev::DevMask journal_members_ = 0;  // members holding a journal ring
  // The members, their groups and durability, the superblock's targets and
  // data_replicas: built at Open (further copies go to durable members only).
  MemberTable members_;
  // The write points: entries [0, nr_wps_) are set (published with release)
  // and stay until Close; wps_mu_ serializes adding one. Every key
  // (WritePointTarget) in every class fits; the last kIoClassCount entries
  // are kept for the foreground target's, so the fallback always has one.
  static constexpr u32 kMaxWritePoints = 402;
  static_assert(kMaxWritePoints >= (kSbTargetKinds + 2 * dev::kMaxDevices) * dev::kIoClassCount,
                "a write point for every superblock target, member and group in every I/O class");
  static_assert(kTargetKinds == kSbTargetKinds + 2, "a new target kind needs its write points counted above");
  Mutex wps_mu_;
  WritePoint* wps_[kMaxWritePoints] = {};
  Atomic<u32> nr_wps_{0};
  // Entries a target other than kForeground may take (tests lower it to
  // reach the fallback); the rest are the foreground target's.
  u32 wp_limit_ = kMaxWritePoints - dev::kIoClassCount;
  mutable Mutex acct_mu_;
  Vector<u32> pending_[dev::kMaxDevices];  // blocks reserved by writes not yet applied or aborted
  Vector<u32> reads_[dev::kMaxDevices];    // reads in flight per bucket (| kDoomed)
  Vector<u8> held_[dev::kMaxDevices];      // kWritePointHold: a write point's open bucket; kFreeing
  u64 reserved_ = 0;           // unwritten blocks, under acct_mu_
  // The logs of failed copies, at most one line per kCopyErrorLogNs each: a
  // failing member fails every copy of every extent, a failing record
  // commit every further copy's allocation (util/log_limit.h).
  static constexpr u64 kCopyErrorLogNs = 10'000'000'000ull;
  LogLimit copy_error_log_[dev::kMaxDevices];  // KeepWritten's, per member
  LogLimit late_copy_log_[dev::kMaxDevices];   // KeepWritten's for late copies, per member
  LogLimit copy_alloc_error_log_;              // Reserve's (further copies' allocations)
  // Per member: when a copy's read there last failed with an I/O error
  // (NowNs; 0: never).
  Atomic<u64> read_error_ns_[dev::kMaxDevices] = {};
  // The repair queue (QueueRepair, TakeRepair): a ring of kRepairQueue.
  static constexpr u32 kRepairQueue = 64;
  static constexpr u64 kRepairLogNs = 10'000'000'000ull;
  SpinLock repair_mu_;
  CopyRepair repairs_[kRepairQueue] TFS_GUARDED_BY(repair_mu_);
  u32 repair_head_ TFS_GUARDED_BY(repair_mu_) = 0;  // the oldest entry
  u32 repair_count_ TFS_GUARDED_BY(repair_mu_) = 0;
  // The entry TakeRepair handed out, until its NoteRepair (a read finding
  // the same bad copy meanwhile does not queue it again).
  CopyRepair repair_taken_ TFS_GUARDED_BY(repair_mu_);
  bool repair_busy_ TFS_GUARDED_BY(repair_mu_) = false;
  Atomic<u32> repair_seq_{0};  // bumped (and woken) by each queue and KickRepairs
  LogLimit repaired_log_;
  LogLimit repair_failed_log_;
  SpinLock reap_mu_;
  Flight* reap_ TFS_GUARDED_BY(reap_mu_) = nullptr;  // abandoned flights completed (Flight::next)
  Flight* late_ TFS_GUARDED_BY(reap_mu_) = nullptr;  // writes' flights with late copies, completed
  bool listed_order_ = false;                         // SetListedReadOrderForTest
  bool hedging_ = true;                               // SetHedgingForTest
  bool late_copies_ = true;                           // SetLateCopiesForTest
  void (*lookup_hook_)(void*) = nullptr;  // SetLookupHookForTest
  void* lookup_hook_ctx_ = nullptr;
  void (*test_point_)(void*, const char*) = nullptr;  // SetTestPointForTest
  void* test_point_ctx_ = nullptr;
  void TestPoint(const char* point) {
    if (test_point_ != nullptr) test_point_(test_point_ctx_, point);
  }
  struct Live {
    TFS_COUNTER_ATOMICS(TFS_DATA_COUNTERS)
  } ctr_;
};

}  // namespace tfs::data

#endif  // TFS_DATA_DATA_H_
