// The reconcile index's keys (docs/design/tiering.md, step 22-3d): one key
// of kBtreeReconcile per extent that needs work, derived from the extent
// and the member table by one rule (ReconcileOf, data/policy.h), so that an
// engine finds work by reading key ranges -- one destination's work is one
// range -- and never scans the extents.
//
//   key    (u64(dest) << 56 | ino, end)   dest: Work::dest (bits 0-6 a
//          kDest* code, bit 7 stuck); ino < 2^56 (btree::kInoLimit); end:
//          the extent's key offset
//   value  ReconcileFormat (8 bytes): the reasons (kWork* bits), reserved
//          bytes (0), since (seconds of the real-time clock when the key was
//          set: a write restarts it, as does any edit that moves the key --
//          a new end, another destination; an edit that keeps the key's
//          position and work keeps it)
//
// This file is the one that knows those bytes. Step 22-3d-1 (this file)
// builds the codec and QueueReconcile, tested; 22-3d-2 calls QueueReconcile
// beside every QueueBackpointers, with the index's feature, the journal
// bounds, the backlog accounting and fsck's check.
//
// Pure functions (no lock, no I/O; QueueReconcile only queues into the
// caller's transaction). Kernel-safe.
#ifndef TFS_DATA_RECONCILE_H_
#define TFS_DATA_RECONCILE_H_

#include "btree/format.h"
#include "btree/key.h"
#include "btree/tree.h"
#include "data/extent.h"
#include "data/policy.h"
#include "platform/types.h"
#include "util/endian.h"
#include "util/status.h"

namespace tfs::data {

struct ReconcileFormat {  // 8 bytes
  u8 reasons;             // kWork* bits, at least one
  u8 reserved[3];         // 0
  Le32 since;             // seconds (platform::RealTimeNs / 1e9, wrapping in 2106)
};
static_assert(sizeof(ReconcileFormat) == 8, "reconcile value size");

inline constexpr u8 kWorkKnown = kWorkDurability | kWorkPlacement | kWorkCompress | kWorkCacheOnly;
inline constexpr u8 kDestLast = kDestNoIo;  // the highest code a work key has

// A parsed key.
struct ReconcileKey {
  u8 dest = 0;     // Work::dest
  u64 ino = 0;
  u64 end = 0;
  u8 reasons = 0;
  u32 since = 0;

  btree::Pos pos() const { return btree::Pos{btree::kBtreeReconcile, (u64(dest) << 56) | ino, end}; }
  bool SameWork(const ReconcileKey& o) const { return dest == o.dest && ino == o.ino && end == o.end && reasons == o.reasons; }
};

// The first and last positions of one destination byte's range.
inline btree::Pos ReconcileRangeFirst(u8 dest) { return btree::Pos{btree::kBtreeReconcile, u64(dest) << 56, 0}; }
inline btree::Pos ReconcileRangeLast(u8 dest) {
  return btree::Pos{btree::kBtreeReconcile, (u64(dest) << 56) | (btree::kInoLimit - 1), ~u64(0)};
}

// kCorrupt unless (pos, value) is a work key as ReconcileOf makes them: of
// kBtreeReconcile, a dest code 1..kDestLast (0 is the cookies', step
// 22-3e), stuck only for durability work alone, cache-only work either
// with placement or durability work or alone on kDestNoIo (and kDestNoIo
// only for it); an inode 1..2^56-1; an end of at least 1; 8 bytes, reasons
// nonzero with no unknown bit, reserved bytes zero. Any since is valid.
Status ParseReconcile(const btree::Pos& pos, const u8* value, u32 len, ReconcileKey* out);
// k's value (what ParseReconcile accepts for k.pos()).
ReconcileFormat BuildReconcile(const ReconcileKey& k);

// The key extent e has under table t, its since `since` (false: e needs
// no work, *out untouched). *policy_bad (optional) is set when e's policy
// was unreadable (ReconcileOf read it as unset).
bool ReconcileKeyOf(const MemberTable& t, const Extent& e, u32 since, ReconcileKey* out, bool* policy_bad = nullptr);

// Queues into tx the index change an extent change makes -- `old` (the
// extent as the tree holds it; null: none) becoming `now` (null: deleted):
// old's key deleted unless now's is at its position, now's key set unless
// old's is the same work (same position and reasons: its since kept).
// A new key's since is `now_s`. *policy_bad as ReconcileKeyOf (either
// extent's). At most one delete and one set; kTooBig as Transaction::Set.
//
// The order of calls in one transaction matters, unlike backpointers'
// (keyed by member blocks, never shared by two live extents): keys are
// positioned by the extent's end, which an old extent and a new one may
// share, and the later of a delete and a set of one position wins. So the
// deletes of what an edit removes go before the sets of what it adds (the
// write path's punch before its new extents), and an edit that cuts an
// extent in two pairs the old extent with the piece that keeps its end.
// old's key is computed under today's table: a change of the table (22-9)
// or of the filesystem's options must re-key the index before extents are
// edited under it (22-3e's cookies), else fsck's check finds a stray key.
Status QueueReconcile(btree::Transaction* tx, const MemberTable& t, const Extent* old, const Extent* now, u32 now_s,
                      bool* policy_bad = nullptr);

}  // namespace tfs::data

#endif  // TFS_DATA_RECONCILE_H_
