// Store: the persistent store -- device set, superblock, allocator, journal and
// btrees -- that the data path, posix and the background engines run on. It
// formats a filesystem and brings one up and down; nothing in it runs by itself
// beyond the journal's and btrees' own writers. fsck opens a Store alone; a
// mount opens one inside its mount::Instance (mount/instance.h). (Called
// engine::Engine before issue 20: "engine" is DESIGN.md's word for the
// background workers in bg/.)
//
// Open() (docs/format/alloc.md, "Mount order"): read every device's
// superblock (backup copy if the primary is bad), refuse device sets that are
// not exactly one filesystem, build the device set in member order; read the
// journal's durable prefix (unless the filesystem was unmounted cleanly) and
// the roots block; open the btrees (roots and interior nodes), replay the
// journal's btree keys into them -- allocation records are btree keys of
// kBtreeAlloc -- and then load the allocator by one walk of the alloc btree;
// reconcile the node buckets with the trees, checkpoint what replay applied,
// record the journal floor in the superblock, clear the clean flag and start
// the journal. Close() checkpoints the trees (the allocation state with
// them), stops the journal and marks the superblock clean.
//
// The allocator persists its changes through the Store (PersistAlloc): each
// change is a kBtreeAlloc key, committed in a btree transaction -- a reclaim
// commit for the changes a checkpoint makes for its own node buckets.
//
// Replay applies keys by type; a key type this build does not know is a corrupt
// journal (kCorrupt), never silently skipped.
//
// Thread safety: Open/Close from one thread; the subsystems it exposes are
// thread-safe themselves. The caller owns the BlockDevices and keeps them open
// until Close() returns (or the Store is destroyed).
#ifndef TFS_STORE_STORE_H_
#define TFS_STORE_STORE_H_

#include "alloc/accounting.h"
#include "alloc/allocator.h"
#include "btree/tree.h"
#include "dev/device_set.h"
#include "dev/missing_device.h"
#include "journal/journal.h"
#include "platform/block_device.h"
#include "sb/superblock.h"
#include "util/diag.h"

namespace tfs::store {

struct FormatMember {
  BlockDevice* bdev = nullptr;
  const char* label = nullptr;
  u8 durability = 1;
};

struct FormatOptions {
  const char* foreground_target = "";  // "" = no preference
  const char* background_target = "";
  const char* promote_target = "";
  const char* metadata_target = "";    // "" = the foreground target, else every member
  u32 bucket_size = 1 << 20;
  u32 btree_node_size = 256 << 10;
  u8 data_replicas = 1;
  u8 metadata_replicas = 1;
  sb::ChecksumType checksum = sb::ChecksumType::kCrc32c;
  sb::CompressionType compression = sb::CompressionType::kNone;
  u32 journal_buckets = 0;             // per journal member; 0 = automatic
};

// Writes a new filesystem over `members` (an empty roots block, then the
// superblocks; no allocation record: every bucket is in its absent-record
// state, docs/format/alloc.md).
// Errors name the offending device or option in `diag`: bad or duplicate labels,
// unresolvable targets, devices too small, bad sizes.
Status Format(const FormatMember* members, u32 count, const FormatOptions& options, Diag* diag);

class Store;

// fsck -y's rebuild of allocation state that may be wrong (nodes dropped,
// bad allocation records, a journal replayed past damage): called on a
// writable open after replay and the allocator's load, before anything is
// allocated or written; it rebuilds the allocator's state from the trees
// (Allocator::BeginRebuild .. EndRebuild, whose records Open's checkpoint
// writes).
using RebuildAllocFn = Status (*)(void* ctx, Store& store);

struct OpenOptions {
  bool read_only = false;  // no journal, no superblock or tree writes (show, fsck -n)
  dev::QueueConfig queue;
  journal::Config journal;
  btree::Options btree;
  RebuildAllocFn rebuild_alloc = nullptr;  // see RebuildAllocFn; without it a bad record refuses read-write
  void* rebuild_ctx = nullptr;
  // fsck -y, with rebuild_alloc: a journal damaged in the middle (entries after
  // the damage durable, ReplayResult::durable_end) is replayed past the damage
  // -- every surviving entry up to the newest durable one -- and the allocation
  // state rebuilt, instead of refused (docs/format/journal.md, "Damage in the
  // middle").
  bool replay_past_damage = false;
  // fsck -y, with rebuild_alloc and btree.drop_bad_nodes: lost roots (no
  // valid roots block, or one older than the filesystem) are rebuilt from a
  // node scan (btree::Options::rebuild_from_scan) instead of refused.
  bool rebuild_roots = false;
  // Incompatible features (sb::kSbFeatureFlags bits) the caller's writes may
  // use: a read-write open records them in the superblock before anything
  // else is written, so builds that do not know them refuse the filesystem
  // from then on. The store writes no such key itself: posix does (its
  // mount records them with AddFeatures; fsck -y passes kSbXattrChunks).
  u16 features = 0;
  // -o degraded (docs/design/copies.md, "Step 5c"): members missing from the
  // devices given are opened as dev::MissingDevice placeholders instead of
  // refused, when every journal entry, btree node and extent keeps a copy
  // on the members given (else refused, naming what would be missing).
  // Read-only opens only, for now.
  bool degraded = false;
  // Tests only: false when the user buckets' counts are the test's own
  // (Allocator::SetLiveSectors, with no accounting keys beside them) --
  // no cross-check of the accounting, and no user bucket freed for
  // counting nothing (docs/format/alloc.md, "Mount order" 6 and 7).
  bool data_counts = true;
};

struct OpenReport {
  bool was_clean = false;
  u32 used_backup_sb = 0;  // members whose primary superblock copy was unusable
  journal::ReplayResult replay;
  u64 replayed_keys = 0;
  // Older state than the filesystem (docs/format/btree.md, "Which roots block
  // is current"): the roots block is older than the superblock or the journal
  // prove. A read-write open refuses (kCorrupt, the reason in its Diag) unless
  // rebuild_roots rebuilds the trees; a read-only one goes on and says why here.
  bool stale_roots = false;
  Diag stale_why;  // the reason, one line
  // The allocation records the load took, and the bad ones it skipped
  // (docs/format/alloc.md, "Validity": the bucket keeps its absent-record
  // state); alloc_why is the first bad one's line. A read-write open refuses
  // a bad record unless rebuild_alloc rebuilds the allocation state.
  u64 alloc_records = 0;
  u64 bad_alloc_records = 0;  // accounting keys among them (alloc/accounting.h)
  Diag alloc_why;
  bool alloc_rebuilt = false;  // rebuild_alloc ran
  // The check of the space accounting (docs/format/alloc.md, "Mount"): the
  // replicas totals' sectors, each times its set's members, against the
  // user buckets' live counts. A read-write open refuses a mismatch (one line)
  // unless it is fsck's (rebuild_alloc: its accounting pass recounts);
  // nothing is freed then. empty_freed: user buckets counting nothing that
  // the open freed (Allocator::FreeEmptyUserBuckets).
  bool acct_mismatch = false;
  u64 acct_replicas_sectors = 0;  // the replicas totals, each times its set's members
  u64 acct_bucket_sectors = 0;    // the buckets' live counts
  u64 empty_freed = 0;
  // Free buckets the newest replayed group's data checks read, held off the
  // free list until the open's superblock (Allocator::HoldFree), and how
  // many of them an allocation took before that (nothing else was free).
  u64 held_buckets = 0;
  u64 held_taken = 0;
  bool roots_rebuilt = false;  // rebuild_roots rebuilt the trees from a node scan
  // Journal damage (replay.durable_end != 0) was replayed past
  // (OpenOptions::replay_past_damage); a read-write open without that refuses,
  // a read-only one replays up to the damage only.
  bool replayed_past_damage = false;
  // Trees an earlier fsck -y dropped damaged nodes of and did not finish
  // repairing (the superblock's lost_data_btrees at open, 1 << btree id): a
  // power cut ended it between the trees' write and the namespace repair. A
  // read-write open refuses unless it is fsck's (btree::Options::drop_bad_nodes),
  // which finishes the repair; a read-only one goes on.
  u32 lost_data_btrees = 0;
  // The incompatible feature bits the superblock had before this open.
  u16 features = 0;
};

class Store {
 public:
  Store() = default;
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // `bdevs` in any order.
  Status Open(BlockDevice* const* bdevs, u32 count, const OpenOptions& options, Diag* diag,
              OpenReport* report = nullptr);
  // Durable shutdown: the trees (allocation state included) checkpointed,
  // the journal flushed and stopped, superblocks marked clean (unless the
  // trees could not be left with nothing dirty: then unclean, and the next
  // mount replays the journal). Idempotent.
  Status Close();

  const sb::Superblock& sb() const { return sb_; }
  // Trees whose dropped nodes' repair is unfinished: the superblock's record
  // (OpenReport::lost_data_btrees) and, after a read-write open, those it
  // dropped nodes of.
  u32 lost_data_btrees() const { return sb_.lost_data_btrees; }
  // fsck: the namespace repair that depended on the dropped nodes is done;
  // Close()'s superblock write records it (read-write opens only).
  void ClearLostData() {
    MutexLock l(sb_mu_);
    sb_.lost_data_btrees = 0;
  }
  // fsck: the incompatible features the filesystem has from now on (bits of
  // sb::kSbFeatureFlags; others are ignored) -- fewer when nothing needs one,
  // so that older builds can mount it again. Close()'s superblock write
  // records it (read-write opens only).
  void SetFeatures(u16 features) {
    MutexLock l(sb_mu_);
    sb_.flags = u16((sb_.flags & ~sb::kSbFeatureFlags) | (features & sb::kSbFeatureFlags));
  }
  // fsck -y's accounting pass (sb::kSbAcctRepair): BeginAcctRepair records
  // durably, now, that a repair of the buckets' counts is under way (before
  // the first); EndAcctRepair clears it in memory once the pass has ended,
  // and Close()'s superblock write records that -- after the checkpoint that
  // writes the repaired records, so a cut before leaves the flag set.
  // Read-write opens only (kInvalidArgument otherwise).
  Status BeginAcctRepair();
  void EndAcctRepair() {
    MutexLock l(sb_mu_);
    sb_.flags &= u16(~sb::kSbAcctRepair);
    acct_flag_durable_ = false;
  }
  // posix's mount: records incompatible features (sb::kSbFeatureFlags bits)
  // in the superblocks now, once what the older format lacked is added
  // (posix::Filesystem::Mount). The fields beside the flags are the ones the
  // open wrote; read-write opens only (kInvalidArgument otherwise).
  Status AddFeatures(u16 features);
  bool read_only() const { return read_only_; }
  // Member health (docs/design/copies.md, 5c-3): a member marked failed
  // while mounted (dev::DeviceSet::MarkFailed) is named missing in the
  // superblocks of the members left at once -- by the store's own health
  // thread, which nothing waits for (the write goes to slow members too) --
  // so that if it comes back having been mounted alone and written, the
  // two are refused as two histories even after a crash. Tests: waits
  // until the superblocks on disk name every member marked so far, and
  // returns the last such write's status.
  Status SyncFailedMembers();
  dev::DeviceSet& devs() { return devs_; }
  alloc::Allocator& alloc() { return alloc_; }
  // The accounting keys' totals (alloc/accounting.h), loaded with the
  // allocator by the walk of the alloc btree.
  alloc::Accounting& acct() { return acct_; }
  const alloc::Accounting& acct() const { return acct_; }
  // Sets accounting keys to `n` totals (a total of 0 deletes its key) in
  // btree transactions, then the totals in memory: the mount's check of the
  // totals against the extents and fsck's repairs, while nothing else
  // commits (no commit hook may stage meanwhile). With `whole`, every other
  // accounting key in the tree is deleted too (fsck's rebuild: want[] is
  // every total). kTooBig never: a batch too big for one entry is split.
  Status RepairAcct(const alloc::AcctValue* want, u32 n, bool whole);
  journal::Journal& journal() { return journal_; }
  btree::Btrees& btrees() { return btrees_; }
  bool open() const { return open_; }

 private:
  // Writes sb_ to every member neither missing nor failed (naming the
  // failed ones) and keeps it as sb_disk_.
  Status WriteSuperblocks();
  // The health thread's write: sb_disk_ (what the last WriteSuperblocks
  // wrote -- never sb_, which may hold changes that must wait for Close's
  // checkpoint: fsck's EndAcctRepair, ClearLostData, SetFeatures) with the
  // failed members named and the next seq. sb_mu_ held.
  Status NameFailedMembersLocked();
  Status WriteSuperblockCopies(const sb::Superblock& s);
  // Whether the roots are the newest the superblock and the journal prove
  // durable (fills rep's stale_* fields).
  void CheckCurrent(const btree::Roots& roots, OpenReport& rep) const;
  // The allocator's load: one walk of the alloc btree (docs/format/alloc.md,
  // "Mount order"); with `journal_keys`, the replayed entries' alloc keys
  // newer than the roots block on top (the node scan's preliminary state,
  // before replay). Bad records are counted in rep (and keys outside every
  // member noted in bad_alloc_keys_); kCorrupt only for a walk that fails
  // (`why`, when not null: the node it failed on, Iterator::SetDiag).
  Status LoadAlloc(bool journal_keys, OpenReport& rep, Diag* why = nullptr);
  // The cross-check of the accounting keys against the bucket records
  // (fills rep's acct_* fields). False when it could not run (no memory).
  bool CheckAccounting(OpenReport& rep) const;
  static Status LoadAllocForScan(void* self);
  // The allocator's persistence sink (alloc::PersistFn).
  static Result<u64> PersistAlloc(void* self, const alloc::RecordChange* changes, u32 n, alloc::BucketState owner,
                                  alloc::PersistProgress* progress);
  // The open's hold (Allocator::HoldFree) of the free buckets the newest
  // replayed group's data checks read (rep.replay.checked): counts them in
  // rep.held_buckets. kNoMemory only.
  Status HoldCheckedBuckets(OpenReport& rep);
  // Deletes the alloc keys the load found outside every member's buckets
  // (fsck -y's rebuild: they are no bucket's record).
  Status DeleteBadAllocKeys();
  static Status ApplyBtreeKey(void* self, u64 seq, const journal::Key& key);
  // The health thread (SyncFailedMembers): started by a writable open,
  // stopped first thing by Close.
  static void OnMemberFailed(void* self);
  static void HealthMain(void* self);
  void StopHealth();
  // Journal reclaim: checkpoint the btrees (on their writer).
  static void ReclaimHook(void* self, u64 seq);

  // The placeholders of a degraded open's missing members: declared before
  // devs_, so that they outlive its queues.
  struct MissingDevices {
    dev::MissingDevice* d[dev::kMaxDevices] = {};
    MissingDevices() = default;
    MissingDevices(const MissingDevices&) = delete;
    MissingDevices& operator=(const MissingDevices&) = delete;
    ~MissingDevices();
  };
  // The checks of a degraded open that need no tree (the journal's rings,
  // the btree's copies): kNotFound with a Diag when something may have no
  // copy on the members given.
  Status CheckDegradedMetadata(Diag* diag) const;
  // The data's: every kReplicas set with sectors has a member given.
  Status CheckDegradedData(Diag* diag) const;

  sb::Superblock sb_{};
  MissingDevices missing_devs_;
  dev::DeviceSet devs_;
  alloc::Allocator alloc_;
  alloc::Accounting acct_;
  journal::Journal journal_;
  btree::Btrees btrees_;
  bool open_ = false;
  bool read_only_ = false;
  bool journal_started_ = false;
  bool acct_flag_durable_ = false;  // kSbAcctRepair is on the devices (the open found it, or BeginAcctRepair wrote it)
  // Open: what LoadAlloc needs of the open in progress.
  const btree::Roots* loading_roots_ = nullptr;
  const journal::ReplayResult* loading_replay_ = nullptr;
  OpenReport* loading_rep_ = nullptr;
  Vector<btree::Pos> bad_alloc_keys_;  // alloc keys outside every member (DeleteBadAllocKeys)
  // The superblock's writers (WriteSuperblocks and the fields they change
  // while mounted: AddFeatures, Begin/EndAcctRepair, ClearLostData,
  // SetFeatures, the health thread).
  Mutex sb_mu_;
  sb::Superblock sb_disk_{};  // sb_mu_: the copy last written (WriteSuperblocks)
  platform::Thread health_;
  Mutex health_mu_;
  CondVar health_cv_;                 // a mark, a stop, a write done
  bool health_stop_ = false;          // health_mu_
  bool health_running_ = false;       // health_mu_: the thread has not returned
  dev::DevMask health_named_ = 0;     // health_mu_: the failed members the superblocks on disk name
  Status health_status_;              // health_mu_: the last write's
};

// The accounting half of a commit hook's prepare, under commit_mu (the
// data path's and AcctCommit's): stages n changes (alloc::Accounting::
// Stage, into staged[0..n)) and writes their records into tx's SetLater
// slots first_slot.. first_slot + n - 1. Publishing is the caller's
// (Accounting::Publish) once the journal took the entry.
Status StageAcctInto(Store* store, btree::Transaction* tx, u32 first_slot, const alloc::AcctChange* changes, u32 n,
                     alloc::AcctValue* staged);

// One accounting total changed by a transaction that is not the data
// path's (which stages its own: data/data.h) -- posix's inode count, +1 in
// the transaction that creates an inode, -1 in the one that frees it
// (docs/format/alloc.md, "Accounting keys"). Queue reserves the key's slot
// (Transaction::SetLater) and sets the transaction's commit hook: under
// commit_mu it stages the published total plus `change` (alloc::Accounting
// ::Stage: stopped at 0 or the bound, counted), and once the journal took
// the entry publishes it -- so the key's values follow journal order, as
// the data path's. The object outlives the Commit; the transaction has no
// other hook. On a store without a journal (read-only) Queue refuses.
class AcctCommit {
 public:
  Status Queue(Store* store, btree::Transaction* tx, alloc::AcctKind kind, u64 offset, i64 change);

 private:
  static Status Prepare(void* ctx, btree::Transaction* tx);
  static void Finish(void* ctx, u64 seq, bool journaled);

  Store* store_ = nullptr;
  alloc::AcctChange change_{};
  alloc::AcctValue staged_{};
  u32 slot_ = 0;
  btree::CommitHook hook_{};
};

}  // namespace tfs::store

#endif  // TFS_STORE_STORE_H_
