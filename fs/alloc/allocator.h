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
// Persistence (docs/format/alloc.md): every change is journaled (no-flush) as an
// AllocKey with the bucket's new change version; Checkpoint() writes the table of
// every member that changed since its last table write to the slot not used
// last time (a member nothing changed on -- an idle HDD -- is not written, save
// once to bring a stale older slot level) and then drops the journal pin that
// kept those keys in the ring.
//
// Slow members (docs/format/alloc.md, "Slow members"): a member that holds no
// journal ring (an HDD) may stall, and the checkpoints that journal room needs
// must not wait for it. CheckpointForRoom() writes a slow member's table in
// the background (an asynchronous write and flush through its queue, at most
// one per member) and, meanwhile, *relogs* the member: every bucket that
// differs from its newest durable table is journaled again as it is now, so
// the member's journal pin moves to the journal's head instead of holding the
// ring until its table is on disk. Replay (newest version wins) is unchanged.
// The write's steps (records, flush, head) follow one another on the device
// set's deferred work (dev::DeviceSet::work()), never inside a completion.
//
// Load() + Apply() of replayed keys rebuild the state
// without scanning any other metadata.
//
// Thread safety: all methods from any thread. `mu_` guards the bucket arrays and
// free lists; it is never held across journal commits or device I/O.
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

// The state the device layout fixes for bucket `b` of member `m` (allocation table
// or journal ring), or kFree for a bucket the layout leaves to the allocator.
// Format sets these; fsck checks them.
BucketState LayoutState(const sb::Member& m, u64 b);

struct BucketRef {
  u32 dev = 0;
  u64 bucket = 0;
  u8 gen = 0;
};

struct Bucket {
  u8 gen = 0;
  BucketState state = BucketState::kFree;
  u32 live_sectors = 0;
  u32 version = 0;
};

struct Reserves {
  u64 foreground = 0;
  u64 copygc = 0;
  u64 btree = 0;
};

struct DeviceUsage {
  u64 nbuckets = 0;
  u64 pending_free = 0;  // freed, waiting for the free to be durable
  u64 by_state[kBucketStateCount] = {};
  u64 live_sectors = 0;
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
  X(checkpoints, counter, "allocator checkpoints")                                                     \
  X(table_writes, counter, "member tables written by checkpoints")                                     \
  X(tables_unchanged, counter, "member tables a checkpoint skipped: nothing changed")                  \
  X(background_table_writes, counter, "slow members' tables started in the background")               \
  X(background_table_errors, counter, "of which failed (the changes stay pinned)")                     \
  X(relogs, counter, "slow members' changes journaled again")                                          \
  X(relogged_buckets, counter, "buckets those relogs carried")                                         \
  X(relogs_too_big, counter, "relogs skipped (too many changed buckets): the checkpoint waited")       \
  X(metadata_refused, counter, "operations that add metadata refused with ENOSPC (MetadataRoom)")

struct AllocStats {
  TFS_COUNTER_FIELDS(TFS_ALLOC_COUNTERS)
};

// What Load found on one member: the slot it uses and whether the other slot
// was unusable (then the one used may be older than the member's newest
// table; Store::Open decides from the superblock and the journal whether it
// provably is -- docs/format/alloc.md, "Which slot is current").
struct LoadedTable {
  u64 checkpoint = 0;    // checkpoint number of the slot in use
  u64 journal_seq = 0;   // its header's journal_seq: changes journaled from this entry on are not in it
  i32 slot = -1;         // 0 or 1
  i32 rejected = -1;     // the other slot, if it could not be read or failed its checks (-1: none)
  bool rejected_io = false;  // ... because of an I/O error
  // The rejected slot's header checkpoint when its header passes its own
  // check (TableHeader::head_csum) and names this member's table (0: unknown).
  // Tables are written header last (its own block, once the records are
  // durable), so a slot whose write a crash cut short still shows the older
  // checkpoint it held before.
  u64 rejected_checkpoint = 0;
};

class Allocator {
 public:
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Sets up empty bucket arrays for every member of `sb`. The journal may be null
  // (format, fsck); then changes are not journaled.
  Status Init(dev::DeviceSet* devs, const sb::Superblock& sb, journal::Journal* journal);
  // Starts journaling changes (mount: after replay and the first checkpoint, once
  // the journal runs). Until then changes are only in memory and the tables.
  void SetJournal(journal::Journal* journal);
  // The journal has stopped (a clean unmount): tables from now on hold every
  // free, settled or not -- no replay will come after them.
  void JournalStopped() { journal_stopped_.Store(true, MemOrder::kRelaxed); }
  // A new filesystem: table and journal buckets marked, everything else free.
  void InitFresh();
  // Reads every member's newest valid table slot. kCorrupt (with Diag) if a member
  // has none.
  Status Load(Diag* diag = nullptr);
  // Applies one replayed kKeyAlloc key (newer versions win; order-independent).
  Status Apply(const journal::Key& key);
  // Rebuilds free lists after Load/Apply.
  Status Finish();
  // What Load found on `dev`.
  const LoadedTable& loaded(u32 dev) const { return devices_[dev].loaded; }
  // The checkpoint number of `dev`'s newest durable table (the superblock
  // records it at mount and unmount).
  u64 DurableCheckpoint(u32 dev) const;
  // The journal sequence tables record as their journal_seq while no journal is
  // attached (mount before the journal starts: the sequence it will start at;
  // unmount after it stopped: the next one). Changes journaled from that entry
  // on are not in the table.
  void SetJournalSeqFloor(u64 seq);

  // fsck's rebuild of a table that is older than the filesystem
  // (docs/design/fsck.md): BeginRebuild resets every bucket to its layout
  // state (table and journal buckets; everything else free, generations kept,
  // versions bumped past every replayed key); RebuildMark marks one bucket
  // as holding btree nodes or user data of generation `gen` (user only) and adds `sectors`
  // to its live count (a second mark of one bucket keeps the newer
  // generation's); EndRebuild rebuilds the free lists. No journal may be
  // attached; the caller checkpoints after. RebuildMark returns false and
  // changes nothing for a bucket that cannot hold `state`: outside the
  // member, the layout's (superblock, tables, journal), or already holding
  // the other kind (nodes are marked first: an extent pointing into a node
  // bucket is bad, never the bucket's new owner).
  void BeginRebuild();
  bool RebuildMark(u32 dev, u64 bucket, BucketState state, u8 gen, u32 sectors);
  Status EndRebuild();

  // Allocates a free bucket on a member of `target` (else of `fallback`) that
  // accepts `purpose` data, at watermark `wm`. kNoSpace if none can.
  Result<BucketRef> Allocate(dev::DevMask target, dev::DevMask fallback, BucketState purpose,
                             Watermark wm);
  // Frees a bucket (its generation is bumped). kInvalidArgument for a stale ref.
  Status Free(const BucketRef& ref);
  Status SetLiveSectors(const BucketRef& ref, u32 live_sectors);

  // fsck repair: force a bucket's state (journaled like any change; free lists
  // are rebuilt). Not for normal operation.
  Status RepairState(u32 dev, u64 bucket, BucketState state);

  ~Allocator();  // waits for background table writes
  // Waits until no background table write is in flight (Store::Close, on
  // every path, before the journal goes).
  void WaitForBackgroundWrites();

  // Writes the tables of the members that changed since their last table write
  // (durably) and releases the journal space their changes held; first waits
  // for background table writes. Mount, unmount, fsck and format: a slow
  // member is written and waited for like any other.
  Status Checkpoint();
  // Checkpoint for journal room (the btree writer when the ring fills, and
  // the journal's reclaim hook), which never waits for a slow member: fast
  // members' tables are written as Checkpoint writes them; a changed slow
  // member's table write is started in the background, and with `relog` its
  // changes are journaled again and made durable (Journal::Flush: journal
  // members only), and the pins they held dropped. Not with `relog` from the
  // journal's own writer (its reclaim hook): a Flush there would wait for itself.
  Status CheckpointForRoom(bool relog);
  // The journal's reclaim hook: CheckpointForRoom(false).
  static void ReclaimHook(void* self, u64 seq);

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
  DeviceUsage Usage(u32 dev) const;
  AllocStats Stats() const;
  u64 FreeFloor(u32 dev, Watermark wm) const;
  u32 members() const { return nr_; }
  u64 nbuckets(u32 dev) const { return dev < nr_ ? devices_[dev].buckets.size() : 0; }

 private:
  struct Dev {
    Vector<Bucket> buckets;
    Vector<u64> free_list;  // free (durably) bucket numbers; allocation pops from the back
    u64 free_count = 0;
    struct Pending {
      u64 bucket;
      u64 seq;        // journal entry that records the free (kUnjournaled while it commits)
      Bucket before;  // the bucket before the free: what a table holds until the free settles
    };
    Vector<Pending> pending;  // freed, not yet reusable
    Reserves reserves;
    Atomic<u64> metadata_need{0};  // SetMetadataNeed; read without mu_
    Atomic<u64> metadata_held{0};
    u8 data_allowed = 0;
    u32 table_buckets = 0;
    u64 checkpoint = 0;     // number of the newest valid slot on disk
    u32 last_slot = 1;      // slot written last (the next checkpoint uses the other)
    // Bucket changes made (under mu_, with the change itself), and the count a
    // table on disk holds: the table needs writing while they differ.
    u64 changes = 0;
    u64 written_changes = 0;
    // The slot not written last holds an older state than the newest one (a
    // fallback to it would lose changes): Checkpoint rewrites it.
    bool other_slot_stale = true;
    LoadedTable loaded;  // what Load found
    // Slow members only (no journal ring on it; see CheckpointForRoom), all
    // under mu_:
    bool slow = false;
    journal::Pin pin;              // oldest journaled change in no durable table or relog
    Vector<u32> durable_version;   // per bucket: the version its newest durable table holds
    bool writing = false;          // a background table write in flight
    u64 write_round = 0;           // the room round (room_round_) that started it
    journal::Pin writing_pin;      // what that write covers (moved to a relog if one runs first)
  };
  struct TableWrite;  // one background table write
  // Its completions (which only queue the next step on the device set's
  // deferred work: completion context) and that next step (process context).
  static void OnTableWritten(dev::Io* io, Status st);
  static void ContinueTableWrite(void* arg);
  void SubmitTableIo(TableWrite* w, dev::Io* io, IoOp op, u64 at, u64 len);
  void FinishTableWrite(TableWrite* w, Status st);
  // Starts a slow member's background table write (mu_ not held).
  void StartTableWrite(u32 dev);
  // Relogs a slow member (see CheckpointForRoom; checkpoint_mu_ held) out of
  // *budget buckets; *relogged false if it has more changed buckets than that.
  Status Relog(u32 dev, u64* budget, bool* relogged);
  u64 RelogBudget() const;
  // Whether some member with a declared metadata need has fewer free and
  // pending buckets than that need plus its copygc reserve (MetadataRoom) or,
  // with `growth`, than its btree reserve (MetadataTight). mu_ held.
  bool MetadataShortLocked(bool growth) const;
  // The synchronous checkpoint of the members in `mask` (checkpoint_mu_ held;
  // none of them with a background write in flight).
  // `converge`: also rewrite unchanged members whose older slot is stale.
  // `counted`: a success counts as a checkpoint (not the second pass of one).
  Status WriteTables(dev::DevMask mask, bool converge, bool counted = true);
  // Merges `p` into `into`, keeping the older; returns the pin to drop.
  static journal::Pin KeepOlder(journal::Pin* into, journal::Pin p);

  // Journals one bucket change and keeps the allocator's pin armed; returns the
  // journal sequence (0 without a journal).
  // Journals bucket `bucket`'s new state `b`; `owner` is the state the change is
  // made for (a free: the state it had), which decides its journal Room.
  Result<u64> JournalChange(u32 dev, u64 bucket, const Bucket& b, BucketState owner);
  // Moves pending frees settled by `settled_seq` (Journal::settled_seq) to the
  // free list. Requires mu_.
  void ReleasePending(Dev& d, u64 settled_seq);
  // A copy of `d`'s buckets for a table (mu_ held): every free not yet settled
  // by `settled` is written as the bucket was before it. A table is not
  // journal-ordered: written with the free, a crash that lost the free's entry
  // (and the transaction before it that dropped the extent) would leave a live
  // extent in a bucket the table calls free -- found by tierlab crash.
  // *left_out says whether any was: the member's table then does not hold
  // every change (written_changes stays behind, so the next checkpoint writes
  // it again). The free's journal entry is not kept pinned for it (a ring
  // full of unsettled frees could then never settle them): if the ring moves
  // past it before that next table and a crash follows, the bucket comes back
  // as it was, unreferenced, and the mount frees it again (DataPath::Open,
  // Btrees::Open).
  Status TableCopy(const Dev& d, u64 settled, Vector<Bucket>* out, bool* left_out) const;
  // The settled journal sequence tables go by (TableCopy); everything once the
  // journal has stopped.
  u64 TableSettledSeq() const;
  static constexpr u64 kUnjournaled = ~u64(0);
  // One allocation attempt; kNoSpace with *pending_seen if only pending buckets
  // could have served it.
  Result<BucketRef> TryAllocate(dev::DevMask target, dev::DevMask fallback, BucketState purpose,
                                Watermark wm, bool* pending_seen);
  Status WriteTable(u32 dev, const Bucket* snapshot, u64 nbuckets, u64 checkpoint, u32 slot,
                    u64 journal_seq);
  // The head of a table slot (its header block, or a logical block if larger):
  // written last, alone, once the rest of the slot is durable.
  u64 TableHeadBytes(u32 dev, u64 slot_bytes) const;
  // A table slot's bytes (slot_bytes long, 4 KiB aligned; platform::Free it).
  u8* BuildTable(u32 dev, const Bucket* snapshot, u64 nbuckets, u64 checkpoint, u64 journal_seq);
  bool Usable(u32 dev, BucketState purpose, Watermark wm) const;
  // The journal_seq a table written now records (see SetJournalSeqFloor).
  u64 TableJournalSeq() const;
  Atomic<u64> journal_seq_floor_{0};
  Atomic<bool> journal_stopped_{false};
  dev::DevMask all_devices() const { return nr_ >= 32 ? ~dev::DevMask(0) : (dev::DevMask(1) << nr_) - 1; }

  dev::DeviceSet* devs_ = nullptr;
  journal::Journal* journal_ = nullptr;
  sb::Superblock sb_{};
  u32 nr_ = 0;
  Dev devices_[dev::kMaxDevices];

  mutable Mutex mu_;
  CondVar table_cv_;     // a background table write finished (with mu_)
  u64 room_round_ = 0;   // CheckpointForRoom calls (under checkpoint_mu_; read under mu_ too)
  journal::Pin pin_;     // fast members: oldest journaled change not yet checkpointed
  Mutex checkpoint_mu_;  // one checkpoint at a time
  AllocStats stats_{};
};

}  // namespace tfs::alloc

#endif  // TFS_ALLOC_ALLOCATOR_H_
