// Allocator: buckets per member, their states, generations and live counts, free
// lists, allocation by target with fallback, and reserves by watermark.
//
// Reserves keep background work from taking the space the foreground needs (see
// docs/design/io-queues.md): on each member, an allocation at watermark W succeeds
// only while the member keeps more free buckets than W's floor:
//
//   kBackground (reconcile, promote)   floor = foreground + copygc + btree reserves
//   kForeground (user writes)          floor = copygc + btree reserves
//   kCopygc (evacuation, frees space)  floor = btree reserve
//   kBtree, kJournal                   floor = 0
//
// The btree reserve is what the btree declares its next checkpoint may take on
// the member (SetMetadataNeed, docs/design/space.md) plus room for metadata to
// grow: the larger of a fixed share (buckets/128) and the need itself. So when a
// metadata member fills, user data spills to the fallback (or gets ENOSPC)
// while the btree still has room to checkpoint and grow; once metadata growth
// has eaten the growth room, MetadataRoom() is false and the operations that
// add metadata get ENOSPC, while deletes (which may use the copygc reserve)
// and checkpoints go on: deleting, unmount and mount keep working on a full
// filesystem.
//
// Targets are tried first; the fallback mask only when no target member can serve
// the request at its watermark (the fast tier is genuinely full).
//
// A freed bucket is not handed out again until the journal entry recording the
// free is durable: otherwise new data could overwrite a bucket that, after a crash,
// the old (still referenced) extent points at -- and *settled* (journal.h,
// settled_seq): while replay may still read the newest unordered entry's data to
// check it, new data there would fail the check (so would a discard: none may be
// issued earlier either). Until then it waits on a pending list; an allocation
// that finds nothing else forces a journal Settle().
//
// Persistence (docs/format/alloc.md): every bucket's state is a record in the
// alloc btree, on the metadata target -- never on the member itself, so a
// slow or stalled member's allocation state holds up no commit and no journal
// reclaim. Every change (Allocate, Free, FreeBuckets, SetLiveSectors,
// RepairState, the rebuild) takes the bucket's new state and version + 1
// under mu_ -- but AllocateUnrecorded, whose record the bucket's first
// extent transaction writes (StageCounts), and the free of a bucket so
// allocated and never recorded -- and then, outside it, hands the records to the persistence sink
// (SetPersist): the Store commits them as kBtreeAlloc keys and returns the
// journal sequence (0 before the journal runs), which the pending-free rule
// waits on. The allocator calls no btree code (btree/ depends on alloc/).
// Changes made for a btree bucket (`owner` kBtree: a checkpoint's allocation
// of a node bucket, the free of its last slot) are made only by a checkpoint
// or while nothing else commits; the sink commits them at the journal's
// reclaim watermark, never waiting for ring room. Mount loads the state with
// one walk of the alloc btree: BeginLoad, LoadRecord per key, Finish.
//
// Thread safety: all methods from any thread (the load and rebuild ones while
// nothing else uses the allocator). `mu_` guards the bucket arrays, their
// per-member sums and the free lists; it is never held across the sink,
// journal calls or device I/O, nor for a walk of a member's buckets outside
// the load, the rebuild and the checked builds' check of the sums: the
// btree's commit hook takes it under commit_mu (StageCounts,
// PublishCounts), so every hold is a few memory operations per bucket.
#ifndef TFS_ALLOC_ALLOCATOR_H_
#define TFS_ALLOC_ALLOCATOR_H_

#include "alloc/format.h"
#include "dev/device_set.h"
#include "journal/journal.h"
#include "platform/atomic.h"
#include "platform/sync.h"
#include "sb/superblock.h"
#include "util/counters.h"
#include "util/diag.h"
#include "util/vector.h"

namespace tfs::alloc {

enum class Watermark : u8 { kBackground = 0, kForeground, kCopygc, kBtree, kJournal };
inline constexpr u32 kWatermarkCount = 5;
const char* WatermarkName(Watermark w);

// The state the device layout fixes for bucket `b` of member `m` (the journal
// ring), or kFree for a bucket the layout leaves to the allocator. It is also
// what an absent record means. fsck checks it.
BucketState LayoutState(const sb::Member& m, u64 b);

struct BucketRef {
  u32 dev = 0;
  u64 bucket = 0;
  u8 gen = 0;
};

struct Bucket {
  u8 gen = 0;
  // The oldest generation a pointer into the bucket may still carry
  // (format.h, kGenGuard): gen until a free leaves pointers behind -- a
  // bucket freed with cached sectors counted (its cached copies dropped:
  // their pointers stay, stale) or already behind keeps it, one freed with
  // nothing counting in it moves it along with gen. Raised by a generation
  // pass (RaiseOldestGen).
  u8 oldest_gen = 0;
  BucketState state = BucketState::kFree;
  bool recorded = false;  // the alloc btree holds (or will hold) a record of it
  // Allocated for user data by AllocateUnrecorded and not yet recorded: the
  // tree still holds the bucket's free record (or none); the first extent
  // transaction counting in it writes its record (state user), and a free
  // before that commits nothing.
  bool unrecorded = false;
  u32 live_sectors = 0;
  u32 cached_sectors = 0;
  u64 version = 0;
};

// One bucket's count change from one extent transaction, and what
// StageCounts made of it (docs/design/copies.md, "Step 3b"). The data path
// fills dev, bucket, live and cached (sectors; net: the transaction's gains
// and losses of the bucket summed); StageCounts the rest.
struct CountStage {
  u32 dev = 0;
  u64 bucket = 0;
  i64 live = 0;
  i64 cached = 0;
  // StageCounts: the bucket's new state (the published one plus the change,
  // version + 1) when `changed`, else the published one as it is; and its
  // record, the value the transaction journals.
  Bucket b;
  bool changed = false;
  AllocRecord rec{};
  // StageCounts: what the change met, counted by PublishCounts -- so only
  // for a commit the journal took (a refused one, or its retry, counts
  // nothing): a live or cached count that would have gone below 0, one that
  // would have passed MaxCountSectors, a loss in a bucket that is not user.
  bool live_underflow = false;
  bool cached_underflow = false;
  bool overflow = false;
  bool foreign_loss = false;
};

// What StageCounts and PublishCounts found worth a log line, carried out of
// commit_mu to the committing thread, which logs it (LogCountNote) once the
// commit returned: no log line is written under commit_mu (a console or a
// pipe that stops draining would hold every commit).
struct CountNote {
  const char* what = nullptr;  // the first damage or bug StageCounts met (null: none)
  bool error = false;          // a bug: StageCounts refused the commit (kCorrupt)
  u32 dev = 0;
  u64 bucket = 0;
  i64 have = 0, change = 0;
  u64 broken = 0;  // PublishCounts: buckets another change had changed meanwhile (a bug)
};

// A member's buckets summed (Usage): kept up to date by every change of a
// bucket's state or counts, under mu_, so that Usage never walks the
// buckets.
struct BucketSums {
  u64 by_state[kBucketStateCount] = {};
  u64 live_sectors = 0;
  u64 cached_sectors = 0;
};

// A user bucket's counts as the mount's check (or fsck) finds them.
struct CountFix {
  u32 dev = 0;
  u64 bucket = 0;
  u32 live_sectors = 0;
  u32 cached_sectors = 0;
};

// A generation pass's finding for one bucket (RaiseOldestGen): `oldest`,
// the oldest generation of the pointers into it the pass found and kept
// -- or, for none, the bucket's gen when the pass began (a pointer added
// since carries that gen or a newer one).
struct OldestRaise {
  u32 dev = 0;
  u64 bucket = 0;
  u8 oldest = 0;
};

// One bucket's new state, for the persistence sink.
struct RecordChange {
  u32 dev;
  u64 bucket;
  Bucket b;
  // The record starts the bucket's versions again (RebaseVersions): the
  // sink deletes the key first (a whiteout always applies), in the same
  // transaction.
  bool replace = false;
};

// The most sectors a bucket of `state` may count live or cached (records'
// validity, fsck): kCountFactor times the bucket's for user and cached
// buckets, the bucket's own for the others.
u64 MaxCountSectors(const sb::Superblock& sb, BucketState state);

// The record of `b`.
void EncodeRecord(const Bucket& b, AllocRecord* out);
// Parses the record of bucket `bucket` of member `dev` (the key's position)
// against the filesystem's geometry (docs/format/alloc.md, "Validity"):
// kCorrupt with a one-line Diag for a bad one.
Status ParseRecord(const sb::Superblock& sb, u64 dev, u64 bucket, const void* val, u32 len, Bucket* out,
                   Diag* diag);

// How far a persistence sink got: the first `committed` changes are in the
// journal (or, before it runs, applied), in entries up to `seq`. All of
// them on success; on an error, those of the pieces committed before it
// (a batch too big for one journal entry is committed in pieces).
struct PersistProgress {
  u32 committed = 0;
  u64 seq = 0;
  u32 transactions = 0;  // the commits that carried them
};

// Persists `n` bucket changes (the Store: kBtreeAlloc keys in a btree
// transaction) and returns the journal sequence that holds them (0 before
// the journal runs), filling `progress`. `owner` is the state the change is
// made for (a free: the state it had); kBtree changes come from checkpoints
// and must never wait for journal room.
using PersistFn = Result<u64> (*)(void* ctx, const RecordChange* changes, u32 n, BucketState owner,
                                  PersistProgress* progress);

struct Reserves {
  u64 foreground = 0;
  u64 copygc = 0;
  u64 btree = 0;
};

struct DeviceUsage {
  u64 nbuckets = 0;
  u64 pending_free = 0;  // freed, waiting for the free to be durable
  u64 by_state[kBucketStateCount] = {};
  u64 live_sectors = 0;   // summed over its buckets (logical sectors: see AllocRecord)
  u64 cached_sectors = 0;
  u64 gen_blocked = 0;   // free buckets the generation guard holds back (among by_state[free])
  Reserves reserves;     // btree: the reserve in force (need + growth room)
  u64 metadata_need = 0; // what the btree declared (SetMetadataNeed)
};

// The allocator's counters (util/counters.h), kept under its lock. The
// arrays are by Watermark (background, foreground, copygc, btree, journal).
#define TFS_ALLOC_COUNTERS(X, A)                                                                       \
  A(allocs, ::tfs::alloc::kWatermarkCount, counter, "buckets allocated, by watermark")                              \
  A(refused, ::tfs::alloc::kWatermarkCount, counter, "allocations refused (no space after fallback), by watermark") \
  X(fallbacks, counter, "allocations served outside their target")                                     \
  X(flush_waits, counter, "allocations that flushed the journal to reuse freed buckets")               \
  X(frees, counter, "buckets freed")                                                                   \
  X(unrecorded_allocs, counter, "user buckets allocated without a record commit (recorded by their first extent transaction)") \
  X(unrecorded_frees, counter, "of those, freed before any transaction recorded them: no commit, reusable at once") \
  X(record_commits, counter, "transactions committing allocation records (alloc btree keys)")           \
  X(records, counter, "records those commits carried")                                                 \
  X(record_errors, counter, "record commits that failed (the change stays in memory; a free is never reused)") \
  X(records_loaded, level, "records the mount loaded from the alloc btree")                            \
  X(rebased_records, counter, "records a mount started again at version 1 (RebaseVersions)")           \
  X(count_records, counter, "bucket records extent transactions carried (one per bucket whose counts a commit changed)") \
  X(count_underflows, counter, "user buckets' live counts that would have gone below 0 in a journaled commit: stopped at 0 (damage; fsck recounts)") \
  X(cached_underflows, counter, "user buckets' cached counts uncounted that were never counted (a cached pointer current by a hostile generation: the guard keeps stale ones from wrapping)") \
  X(count_overflows, counter, "counts that would have passed what the bucket can count: stopped there (damage)") \
  X(foreign_losses, counter, "journaled losses in buckets that are not user buckets: pointers never counted there (damage fsck owns); the record kept as it is") \
  X(count_repairs, counter, "bucket counts set to what the extents say (fsck)")     \
  X(empty_freed_at_mount, counter, "user buckets whose records counted nothing, freed by the mount")     \
  X(replay_held, counter, "free buckets a mount held off the free list until its superblock (the newest replayed group's data checks read them)") \
  X(replay_held_taken, counter, "of those, released before then because an allocation found nothing else free (a cut before the superblock may lose that group)") \
  X(metadata_refused, counter, "operations that add metadata refused with ENOSPC (MetadataRoom)")     \
  X(gen_guard_blocked, counter, "free buckets a free or a settle held back at the generation guard (gen kGenGuard past oldest_gen: stale pointers may remain); a mount's load holds such buckets back uncounted") \
  X(gen_guard_waiting, level, "free buckets the guard holds back now, waiting for a generation pass")   \
  X(gen_guard_released, counter, "of those, handed back to the free list by a generation pass")        \
  X(oldest_raised, counter, "buckets whose oldest_gen a generation pass raised")

struct AllocStats {
  TFS_COUNTER_FIELDS(TFS_ALLOC_COUNTERS)
};

class Allocator {
 public:
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Sets up the bucket arrays for every member of `sb`: every bucket in its
  // absent-record state (LayoutState, gen 0, version 0). No sink and no
  // journal yet: changes are only in memory.
  Status Init(const sb::Superblock& sb);
  // Where changes are persisted from now on (Store::Open, before the trees
  // open). Not while changes are made.
  void SetPersist(PersistFn fn, void* ctx);
  // The sink set now (tests put a sink in front of it that fails chosen
  // changes, and SetPersist it back after).
  void GetPersist(PersistFn* fn, void** ctx) const;
  // Frees wait for the journal to settle them from now on (mount: once the
  // journal runs). Until then a free is reusable at once.
  void SetJournal(journal::Journal* journal);

  // Mount's load (nothing else uses the allocator meanwhile): BeginLoad
  // puts every bucket back in its absent-record state; LoadRecord takes the
  // record of one key of the alloc btree (inode = member, offset = bucket)
  // unless the bucket already holds a record of a newer or equal version
  // (so the journal's keys may be applied over the tree's: the node scan's
  // preliminary state, Store::Open); kCorrupt with a Diag for a bad record
  // or position (the bucket is left as it was). Finish rebuilds the free
  // lists (every free bucket reusable: nothing is pending at mount).
  void BeginLoad();
  Status LoadRecord(u64 dev, u64 bucket, const void* val, u32 len, Diag* diag = nullptr);
  Status Finish();

  // fsck's rebuild of allocation state the trees contradict or that may have
  // lost changes (docs/format/alloc.md, "fsck"): BeginRebuild resets every
  // bucket to its layout state (journal buckets; everything else free,
  // generations kept, counts 0, versions bumped past every record in the
  // tree); RebuildMark marks one bucket as holding btree nodes or user data
  // of generation `gen` (user only; a second mark of one bucket keeps the
  // newer generation's -- a cached pointer's too: a bucket whose only
  // pointer is a stale cached one comes back at its generation, counting it
  // cached, since the generations loaded are what a rebuild distrusts; a
  // read verifies that copy's blocks and falls back); once every
  // bucket is marked, RebuildCount adds a
  // counted pointer's sectors (data::PtrCountsIn, data::PtrSectors: the data
  // path's rule, against the marked state) to a user bucket's live or
  // cached count, up to MaxCountSectors; EndRebuild rebuilds the free lists
  // and persists a record for every bucket that has one or is not in its
  // absent-record state. No journal may be attached (Store::Open's rebuild
  // hook). RebuildMark returns false and changes nothing for a bucket that
  // cannot hold `state`: outside the member, the layout's (journal), or
  // already holding the other kind (nodes are marked first: an extent
  // pointing into a node bucket is bad, never the bucket's new owner);
  // RebuildCount for a bucket that is not user.
  void BeginRebuild();
  bool RebuildMark(u32 dev, u64 bucket, BucketState state, u8 gen);
  bool RebuildCount(u32 dev, u64 bucket, bool cached, u32 sectors);
  Status EndRebuild();
  // A read-write mount's, after the load (and a rebuild), before the journal
  // runs: every bucket whose version is kRecordVersionRebase or more (only
  // a hostile record, or fsck's rebuild past one, gets there) starts again
  // at version 1 -- its key deleted, then its record written, in one
  // transaction (RecordChange::replace). Returns how many; the caller must
  // checkpoint them before the journal runs (a journaled change of version
  // 2 would otherwise lose to the old version in the tree after a crash).
  Result<u64> RebaseVersions();
  // A read-write mount's, once the journal runs (Store::Open, after the
  // check of the accounting): every user bucket whose record counts
  // nothing -- recorded, then emptied by a punch whose free a cut or a
  // failed commit lost -- is freed (FreeBuckets: journaled record commits,
  // pending until settled like any free). Returns how many (counted:
  // empty_freed_at_mount). The counts are trusted: the caller has checked
  // them against the accounting keys.
  Result<u64> FreeEmptyUserBuckets();
  // A read-write mount's, before anything allocates (Store::Open): a free
  // bucket the newest replayed group's data checks read (journal.h,
  // ReplayResult::checked) leaves the free list -- held on the pending list
  // -- until ReleaseHeld, which the mount calls once its superblock has
  // moved the journal past that group. Until then a cut makes the next
  // mount check the group again, and the mount's checkpoint must not have
  // written nodes over the data it reads (or the group, acknowledged, is
  // dropped). An allocation that finds nothing else free takes them back
  // (all of them, counted: replay_held_taken) rather than fail the mount.
  // `buckets`: n of member `dev`, sorted, each once -- one pass over its
  // free list. Returns how many were free and are now held (counted:
  // replay_held). Not once the journal is attached.
  u64 HoldFree(u32 dev, const u64* buckets, usize n);
  // Puts the held buckets that are still free back on the free list;
  // returns how many were held.
  u64 ReleaseHeld();
  // The replay_held_taken counter alone (Stats() is large for a kernel
  // stack frame that already holds the mount's).
  u64 HeldTaken() const;
  // The live counts of user buckets summed, by a walk of every member's
  // buckets (the mount's cross-check, while nothing else runs: O(buckets)
  // under mu_). Other states' counts (damage) are left out.
  u64 UserLiveSectors() const;

  // Allocates a free bucket on a member of `target` (else of `fallback`) that
  // accepts `purpose` data, at watermark `wm`. kNoSpace if none can.
  Result<BucketRef> Allocate(dev::DevMask target, dev::DevMask fallback, BucketState purpose,
                             Watermark wm);
  // Allocate for user data without a record commit (docs/design/copies.md,
  // "Allocation (piece 3b-3): folded"): the bucket leaves the free list in
  // memory only (unrecorded), and the first extent transaction that counts
  // in it records it (state user, its gen, the counts: StageCounts) in the
  // entry that holds the extent -- so the write point, which allocates
  // under its mutex, never waits there for a commit (commit_mu, journal
  // room). A cut before that record leaves the bucket free in the tree,
  // which no durable pointer names. Counted: unrecorded_allocs.
  Result<BucketRef> AllocateUnrecorded(dev::DevMask target, dev::DevMask fallback, Watermark wm);
  // Tests: `fn` is asked before every allocation takes a bucket; an error
  // it returns is the allocation's -- as a record commit or a journal
  // settle that failed, the errors an allocation has besides kNoSpace
  // (an unrecorded one has only the settle's). Null: none.
  using AllocFaultFn = Status (*)(void* ctx, BucketState purpose, bool recorded);
  void SetAllocFaultForTest(AllocFaultFn fn, void* ctx);
  // Frees a bucket (its generation is bumped). kInvalidArgument for a stale
  // ref. Its counts go to 0: a bucket freed with cached sectors counted has
  // its cached copies dropped -- their pointers, left in their extents, are
  // stale from now on -- and keeps its oldest_gen (as one already behind
  // does); one with nothing counted and oldest_gen == gen moves oldest_gen
  // to the new gen (no pointer names it). An unrecorded bucket (AllocateUnrecorded, no transaction counted
  // in it) commits nothing and keeps its generation -- the tree says free
  // already and no durable pointer names it -- and is reusable at once
  // (counted: unrecorded_frees); FreeBuckets does the same.
  Status Free(const BucketRef& ref);
  // Frees `n` buckets with one record commit (a checkpoint's emptied node
  // buckets, the data path's emptied user buckets; split in pieces only when
  // too big for one journal entry); stale refs are skipped. The first error
  // is returned; `freed` (if given): the frees whose records committed --
  // what n calls of Free would have returned ok for.
  Status FreeBuckets(const BucketRef* refs, u32 n, u32* freed = nullptr);
  Status SetLiveSectors(const BucketRef& ref, u32 live_sectors);
  // A generation pass's end (fsck -y today; docs/format/alloc.md,
  // "Generations"): each bucket's oldest_gen becomes raises[i].oldest if
  // that is newer than its oldest_gen and not newer than its gen (mod 256:
  // within the guard's window), else it is left (a raise never lowers it);
  // a user bucket is left too -- its record changes only in its extent
  // transactions while in use (StageCounts), and the guard acts on frees:
  // the pass after its free raises it -- unless `user_too` (fsck: no
  // extent transaction commits meanwhile; an unrecorded one is still left);
  // a free bucket the guard held back that is now below it goes back on
  // the free list (gen_guard_released). The changed records persisted in
  // one commit (split as needed); counted: oldest_raised. *raised (if
  // given): how many changed. kInvalidArgument for a bucket outside the
  // members (after the others).
  Status RaiseOldestGen(const OldestRaise* raises, u32 n, u64* raised = nullptr, bool user_too = false);

  // The counts of user buckets (docs/design/copies.md, "Step 3b"): changed
  // only inside the extent transactions that change them, by the data
  // path's commit hook, under the btree's commit_mu -- so each record is
  // the state every earlier journaled commit left plus this one's change,
  // and the records' version order is their journal order.
  // StageCounts (the hook's prepare): the new state and record of each
  // stage's bucket -- the published counts plus the change, version + 1; a
  // count that would go below 0 stops at 0 (live: count_underflows, logged;
  // cached: cached_underflows, not logged: see docs/design/copies.md "As
  // built: step 1"), one that would pass MaxCountSectors stops there
  // (count_overflows). A bucket that is not a user bucket (a loss of a
  // pointer never counted there: damage fsck owns) keeps its state and
  // record as they are (foreign_losses); a gain there is a bug (kCorrupt,
  // logged: nothing adds a counted pointer into a bucket it did not get
  // from Allocate or AllocateUnrecorded). Changes
  // nothing shared: what it met (underflows, overflows, losses in other
  // buckets) is marked in the stages and counted by PublishCounts, the
  // first damage or bug noted in *note for LogCountNote.
  Status StageCounts(CountStage* stages, u32 n, CountNote* note);
  // The hook's finish, once the journal took the records: the staged states
  // become the published ones, and what StageCounts met is counted.
  // Requires that nothing else changed those buckets since StageCounts (the
  // invariant: a bucket with a change in flight is held -- by pending
  // blocks or by the counted pointer a loss removes -- so it is neither
  // freed nor allocated meanwhile); a breach is noted in *note (broken).
  void PublishCounts(const CountStage* stages, u32 n, CountNote* note);
  // After the commit returned, with no lock held: logs what the note says
  // -- damage only if the commit was `published` (else nothing was stopped
  // anywhere), a bug always -- each kind at most once per 10 s.
  void LogCountNote(const CountNote& note, bool published);
  // Sets user buckets' counts (version + 1, persisted through the sink like
  // any change): the mount's check of the counts against the extents
  // (DataPath::Open) and fsck. A bucket that is not user is skipped
  // (kInvalidArgument, after the others).
  Status RepairCounts(const CountFix* fixes, u32 n);

  // fsck repair (and the mount's reconciliation of node buckets): force a
  // bucket's state, persisted like any change. Not for normal operation.
  Status RepairState(u32 dev, u64 bucket, BucketState state);

  // The btree's declaration: `buckets` free buckets on `dev` its next
  // checkpoint may take, beyond the `held` empty buckets it has taken ahead
  // (a running checkpoint's reserve, back when it ends). The btree reserve
  // becomes need + max(fixed share, need + held); cheap (one relaxed store), called whenever the btree's size changes.
  void SetMetadataNeed(u32 dev, u64 buckets, u64 held = 0);
  // Whether metadata may grow (posix: creates, links, xattrs, data writes --
  // they add keys): every member with a declared need keeps that need plus
  // its copygc reserve free or pending. The copygc reserve is then left for
  // what must always work (deletes and truncates dirty and split nodes too).
  // Counted (metadata_refused) when false.
  bool MetadataRoom();
  // Whether MetadataRoom would refuse now, without counting it (statfs).
  bool MetadataShort() const;
  // Whether the btree has begun to eat its growth room on some member (free
  // and pending buckets below its reserve): its writer checkpoints then, so
  // that dirty nodes become clean and the need drops.
  bool MetadataTight() const;

  Bucket Get(u32 dev, u64 bucket) const;
  // The member's sums (kept: O(1) under mu_; checked builds also recount
  // them by a walk and stop on a difference), reserves and pending frees.
  DeviceUsage Usage(u32 dev) const;
  // Buckets of `dev` in state free: reusable now or once their free
  // settles (the free and pending lists). O(1) under mu_. 0 for a member
  // SetUnavailable names.
  u64 FreeCount(u32 dev) const;
  // Members no bucket is allocated on from now on: a degraded mount's
  // missing ones (Store::Open, before anything allocates). Their records
  // stay and change as always (a free of a bucket there is recorded); only
  // Allocate and AllocateUnrecorded pass them by, as members without a
  // free bucket (a write with too few members goes degraded, counted by
  // its caller).
  void SetUnavailable(dev::DevMask mask);
  // Members marked failed while mounted (dev::DeviceSet::failed_mask, read
  // at every choice) are unavailable too (step 5c-3). Set before anything
  // allocates; the mask outlives the allocator's use of it.
  void WatchFailed(const Atomic<dev::DevMask>* failed);
  // SetUnavailable's and the failed ones.
  dev::DevMask unavailable() const;
  // Tests: recounts the member's sums by a walk of its buckets into
  // *scanned (if given) and says whether they are the kept ones.
  bool SumsMatchScan(u32 dev, BucketSums* scanned = nullptr) const;
  AllocStats Stats() const;
  u64 FreeFloor(u32 dev, Watermark wm) const;
  u32 members() const { return nr_; }
  u64 nbuckets(u32 dev) const { return dev < nr_ ? devices_[dev].buckets.size() : 0; }

 private:
  struct Dev {
    Vector<Bucket> buckets;
    Vector<u64> free_list;  // free (durably) bucket numbers; allocation pops from the back
    u64 free_count = 0;
    // Free and settled, but gen kGenGuard past oldest_gen: off the free
    // list until a generation pass raises oldest_gen (RaiseOldestGen).
    Vector<u64> blocked;
    struct Pending {
      u64 bucket;
      u64 seq;  // journal entry that records the free (kUnjournaled while it commits)
    };
    Vector<Pending> pending;  // freed, not yet reusable
    Reserves reserves;
    BucketSums sums;  // of buckets[]: every change of a state or count moves them (Resum)
    Atomic<u64> metadata_need{0};  // SetMetadataNeed; read without mu_
    Atomic<u64> metadata_held{0};
    u8 data_allowed = 0;
  };
  static constexpr u64 kUnjournaled = ~u64(0);
  // A pending entry HoldFree made: only ReleaseHeld (or an allocation that
  // finds nothing else) releases it.
  static constexpr u64 kHeld = ~u64(0) - 1;
  // Moves every held entry to the free list (mu_ held); returns how many.
  u64 ReleaseHeldLocked();

  // Whether some member with a declared metadata need has fewer free and
  // pending buckets than that need plus its copygc reserve (MetadataRoom) or,
  // with `growth`, than its btree reserve (MetadataTight). mu_ held.
  bool MetadataShortLocked(bool growth) const;
  // The member's sums by a walk of its buckets (mu_ held).
  BucketSums ScanSumsLocked(u32 dev) const;
  // Sets every member's sums from a walk (mu_ held): after BeginLoad and
  // BeginRebuild, which change every bucket.
  void ResumAllLocked();
  // Hands `n` changes to the sink (mu_ not held); returns the journal
  // sequence (0 without a sink or a journal). Counted. `progress` (if
  // given): how far it got (PersistProgress), on an error too.
  Result<u64> Persist(const RecordChange* changes, u32 n, BucketState owner, PersistProgress* progress = nullptr);
  // The free of bucket `b` of `d` (mu_ held): the change, and the bucket on
  // the pending list (with a journal) or the free list. False for a stale
  // ref or a bucket that cannot be freed. *persist: whether the change is to
  // be committed (false for an unrecorded bucket: back on the free list).
  bool FreeLocked(u32 dev, const BucketRef& ref, RecordChange* change, BucketState* was, bool* persist);
  // Records the sequence a free's commit returned on its pending entry.
  void NotePendingSeq(u32 dev, u64 bucket, u64 seq);
  // Changes buckets with one record commit (split as needed) for `owner`:
  // under mu_, edit(i, &dev, &bucket) for i < n changes one bucket and says
  // which (1), changes nothing (0) or refuses a bad entry (-1: the call's
  // kInvalidArgument, after the others); each changed bucket's version is
  // bumped and its record persisted. *changed (if given): how many.
  template <typename Edit>
  Status EditBuckets(u32 n, BucketState owner, u64* changed, Edit edit);
  // Puts free bucket `b` on the free list -- or, at the generation guard,
  // on the blocked list (counted if `count`: a free or a settle, not a
  // load) (mu_ held).
  void ListFreeLocked(Dev& d, u64 b, bool count = true);
  // Takes bucket `b` off the blocked list; whether it was there (mu_ held).
  bool UnlistBlockedLocked(Dev& d, u64 b);
  // Takes bucket `b` off the free list, the blocked list or the pending
  // list, if it is on one (mu_ held).
  void UnlistFreeLocked(Dev& d, u64 b);
  // Moves the pending entries whose seq `release(seq)` picks to the free
  // list; returns how many. Requires mu_ (ReleasePending, ReleaseHeldLocked).
  template <typename Release>
  u64 ReleaseWhere(Dev& d, Release release);
  // Moves pending frees settled by `settled_seq` (Journal::settled_seq) to the
  // free list; held ones stay. Requires mu_.
  void ReleasePending(Dev& d, u64 settled_seq);
  // One allocation attempt; kNoSpace with *pending_seen if only pending buckets
  // could have served it.
  Result<BucketRef> TryAllocate(dev::DevMask target, dev::DevMask fallback, BucketState purpose,
                                Watermark wm, bool record, bool* pending_seen);
  Result<BucketRef> AllocateWith(dev::DevMask target, dev::DevMask fallback, BucketState purpose, Watermark wm,
                                 bool record);
  bool Usable(u32 dev, BucketState purpose, Watermark wm) const;
  dev::DevMask all_devices() const { return nr_ >= 32 ? ~dev::DevMask(0) : (dev::DevMask(1) << nr_) - 1; }

  journal::Journal* journal_ = nullptr;
  PersistFn persist_ = nullptr;
  void* persist_ctx_ = nullptr;
  AllocFaultFn alloc_fault_ TFS_GUARDED_BY(mu_) = nullptr;
  void* alloc_fault_ctx_ TFS_GUARDED_BY(mu_) = nullptr;
  sb::Superblock sb_{};
  u32 nr_ = 0;
  dev::DevMask unavailable_ = 0;  // SetUnavailable (mu_)
  const Atomic<dev::DevMask>* failed_ = nullptr;  // WatchFailed (mu_)
  dev::DevMask UnavailableLocked() const TFS_REQUIRES(mu_) {
    return unavailable_ | (failed_ != nullptr ? failed_->Load(MemOrder::kAcquire) : 0);
  }
  Dev devices_[dev::kMaxDevices];

  mutable Mutex mu_;
  AllocStats stats_{};
  // LogCountNote's last line of damage and of a bug (platform::NowNs + 1;
  // 0: never), under mu_.
  u64 underflow_logged_ns_ = 0;
  u64 count_bug_logged_ns_ = 0;
  u64 held_ = 0;  // pending entries of kHeld (HoldFree), under mu_
};

}  // namespace tfs::alloc

#endif  // TFS_ALLOC_ALLOCATOR_H_
