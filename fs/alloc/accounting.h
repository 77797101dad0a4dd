// Accounting: the totals the bucket records cannot give (docs/design/copies.md,
// "Accounting records"; format: docs/format/alloc.md, "Accounting keys") --
// the unwritten (fallocate) sectors of the filesystem (kReserved), the
// sectors of extents per set of members their copies are on (kReplicas,
// bcachefs's replicas entries: degraded data and sole copies are read from
// them) and the inodes in use (kInodes: posix's mount reads it instead of
// walking every inode). Each is one key of the alloc btree above the
// members' range (alloc/format.h, kAcctInodeBase) holding the total itself.
//
// Who changes them: a commit hook, under the btree's commit_mu -- the data
// path's for the first two, store::AcctCommit's for the inode count (Stage:
// the new totals of the keys a transaction changes, from the published
// ones plus its change; Publish once the journal took them),
// so the keys' values follow journal order and the last one replayed is the
// total. The Store loads them at mount (BeginLoad, LoadKey per key: the
// last value wins, so the journal's keys may be loaded over the tree's) and
// repairs them (Store::RepairAcct: the mount's check, fsck), while nothing
// else commits. Everything that is a sum over buckets (per member, per
// target, by state) is the allocator's, not kept here.
//
// Thread safety: every method from any thread; mu_ guards the totals and
// is held only for a few memory operations (the commit hook takes it under
// commit_mu), never across I/O or a btree call.
#ifndef TFS_ALLOC_ACCOUNTING_H_
#define TFS_ALLOC_ACCOUNTING_H_

#include "alloc/format.h"
#include "dev/device_set.h"
#include "platform/sync.h"
#include "sb/superblock.h"
#include "util/counters.h"
#include "util/diag.h"
#include "util/vector.h"

namespace tfs::alloc {

// The key of (kind, offset): its inode in the alloc btree.
inline u64 AcctInode(AcctKind kind) { return kAcctInodeBase + u64(kind); }

// Parses the accounting key (inode, offset) and its value against the
// filesystem's geometry: kCorrupt with a one-line Diag for an inode past
// the kinds, a value of another size or kind, reserved bytes set, a
// kReserved or kInodes key at an offset other than 0, a kReplicas mask of
// 0 or more than kAcctMaxMembers bits or a bit past the members, and a
// total beyond what the members can hold (AcctMax).
Status ParseAcct(const sb::Superblock& sb, u64 inode, u64 offset, const void* val, u32 len, u64* sectors,
                 Diag* diag);
void EncodeAcct(AcctKind kind, u64 sectors, AcctRecord* out);
// The most a valid key of `kind` may hold: sectors, every member's buckets
// full of logical sectors (kCountFactor times their own); inodes, every
// member's bytes in records of kInodeMinBytes.
u64 AcctMax(const sb::Superblock& sb, AcctKind kind);
inline constexpr u64 kInodeMinBytes = 128;  // an inode record's value alone (posix::InodeFormat)

// One transaction's change of one key (one per key: the caller sums).
struct AcctChange {
  AcctKind kind = AcctKind::kReserved;
  u64 offset = 0;   // kReplicas: the member mask; kReserved, kInodes: 0
  i64 sectors = 0;  // the net change (kInodes: of the count)
};
// A key's new total: Stage's (from a change), or a repair's.
struct AcctValue {
  AcctKind kind = AcctKind::kReserved;
  u64 offset = 0;
  u64 sectors = 0;
  // Stage: the change would have gone below 0, or past AcctMax
  // (stopped there; counted by Publish: damage, fsck recounts).
  bool underflow = false;
  bool overflow = false;
};
struct ReplicasEntry {
  dev::DevMask members = 0;
  u64 sectors = 0;
};

// What the kReplicas totals say of the data's copies (tierfs ctl, tierfs
// show, a degraded mount's check): the sectors of extents by how many
// members hold a counted copy of them (cached copies are not counted), and,
// of those with a copy on an `out` member (missing or failed), the ones
// with a copy on another member too (degraded: readable, one copy short
// until the reconcile) and the ones without (unavailable: every copy on
// `out` members; `unavailable_sets` sets of members).
struct CopiesSummary {
  u64 sectors = 0;
  u64 by_copies[kAcctMaxMembers + 1] = {};  // [n]: sectors with n copies ([0] unused)
  u64 degraded = 0;
  u64 unavailable = 0;
  u32 unavailable_sets = 0;
};
CopiesSummary SummarizeCopies(const ReplicasEntry* sets, usize n, dev::DevMask out);

#define TFS_ACCT_COUNTERS(X, A)                                                                               \
  X(keys_loaded, level, "accounting keys the mount loaded from the alloc btree")                            \
  X(acct_records, counter, "accounting keys extent transactions carried (one per total a commit changed)")  \
  X(acct_underflows, counter, "totals that would have gone below 0 in a journaled commit: stopped at 0 (damage; fsck recounts)") \
  X(acct_overflows, counter, "totals that would have passed what the members can hold: stopped there (damage)") \
  X(acct_repairs, counter, "accounting keys set to what the extents say (the mount's check, fsck)")         \
  X(replicas_entries, level, "sets of members data has copies on (kReplicas keys in memory)")

struct AcctStats {
  TFS_COUNTER_FIELDS(TFS_ACCT_COUNTERS)
};

class Accounting {
 public:
  Accounting() = default;
  Accounting(const Accounting&) = delete;
  Accounting& operator=(const Accounting&) = delete;

  // Every total 0, for sb's geometry.
  Status Init(const sb::Superblock& sb);
  // The mount's load (nothing else uses it meanwhile): BeginLoad forgets
  // every total; LoadKey takes one key's (ParseAcct's kCorrupt for a bad
  // one: the total is left as it was), replacing what an earlier key of
  // the same position gave; kNoMemory (not a bad key) when a new set
  // finds no room.
  void BeginLoad();
  Status LoadKey(u64 inode, u64 offset, const void* val, u32 len, Diag* diag = nullptr);

  // The commit hook's prepare (under commit_mu): each change's new total
  // (published + change) into out[i], with its key's record; changes no
  // total. Makes room for the sets not seen before, so that Publish cannot
  // fail: kNoMemory (the commit fails, nothing journaled) without it.
  Status Stage(const AcctChange* changes, u32 n, AcctValue* out);
  // Once the journal took them: the staged totals become the published
  // ones (a total of 0 stays a key of 0: SetLater slots hold values).
  // Counts what Stage met.
  void Publish(const AcctValue* staged, u32 n);
  // Room for `n` sets more (kNoMemory): a repair makes it before its
  // commit, so that Set, after the commit, cannot fail.
  Status MakeRoom(u32 n);
  // A repair's totals (Store::RepairAcct, after its commit and MakeRoom(n)):
  // a total of 0 forgets the set (its key was deleted).
  void Set(const AcctValue* values, u32 n);

  u64 reserved_sectors() const;
  u64 inodes() const;  // the kInodes total
  // The total of one key (0 when none).
  u64 Get(AcctKind kind, u64 offset) const;
  // Every kReplicas total, zeros included, in mask order: into out[0..cap);
  // returns how many there are.
  u32 Replicas(ReplicasEntry* out, u32 cap) const;
  // Every kReplicas total into *out, sized to what it holds (a set added
  // between its two looks is left for the next call). kNoMemory.
  Status ReplicasInto(Vector<ReplicasEntry>* out) const;
  AcctStats Stats() const;

 private:
  // The entry of `mask` in replicas_ (sorted by mask), or where it would go.
  usize FindLocked(dev::DevMask mask, bool* found) const TFS_REQUIRES(mu_);
  // Sets one total (mu_ held; room made): a new mask inserted in order.
  void PutLocked(AcctKind kind, u64 offset, u64 sectors) TFS_REQUIRES(mu_);
  // A one-key kind's total (kReserved, kInodes); null for kReplicas.
  u64* ScalarLocked(AcctKind kind) TFS_REQUIRES(mu_);

  sb::Superblock sb_{};
  u64 max_[kAcctKinds] = {};  // AcctMax of each kind
  mutable Mutex mu_;
  u64 reserved_ TFS_GUARDED_BY(mu_) = 0;
  u64 inodes_ TFS_GUARDED_BY(mu_) = 0;
  Vector<ReplicasEntry> replicas_ TFS_GUARDED_BY(mu_);
  u64 keys_loaded_ TFS_GUARDED_BY(mu_) = 0;
  struct Live {
    TFS_COUNTER_ATOMICS(TFS_ACCT_COUNTERS)
  } ctr_;
};

}  // namespace tfs::alloc

#endif  // TFS_ALLOC_ACCOUNTING_H_
