// The reconcile index's keys (reconcile.h).
#include "data/reconcile.h"

namespace tfs::data {

namespace {

constexpr u64 kInoMask = btree::kInoLimit - 1;

// The rules of ParseReconcile on the decoded form.
bool ValidKey(const ReconcileKey& k) {
  const u8 code = k.dest & u8(~kDestStuck);
  const bool stuck = (k.dest & kDestStuck) != 0;
  if (code == kDestCookie || code > kDestLast || k.ino == 0 || k.ino > kInoMask || k.end == 0) return false;
  if (k.reasons == 0 || (k.reasons & ~kWorkKnown) != 0) return false;
  if (stuck && k.reasons != kWorkDurability) return false;
  // Cache-only work rides a move that does I/O, or goes alone without a
  // destination (ReconcileOf never makes it otherwise).
  const bool io = (k.reasons & (kWorkPlacement | kWorkDurability)) != 0;
  if ((k.reasons & kWorkCacheOnly) != 0 && !io && (k.reasons != kWorkCacheOnly || code != kDestNoIo)) return false;
  if (code == kDestNoIo && k.reasons != kWorkCacheOnly) return false;
  return true;
}

}  // namespace

Status ParseReconcile(const btree::Pos& pos, const u8* value, u32 len, ReconcileKey* out) {
  if (pos.btree_id != btree::kBtreeReconcile || len != sizeof(ReconcileFormat)) return Err::kCorrupt;
  ReconcileFormat f;
  MemCopy(&f, value, sizeof(f));
  if (f.reserved[0] != 0 || f.reserved[1] != 0 || f.reserved[2] != 0) return Err::kCorrupt;
  ReconcileKey k;
  k.dest = u8(pos.inode >> 56);
  k.ino = pos.inode & kInoMask;
  k.end = pos.offset;
  k.reasons = f.reasons;
  k.since = f.since.get();
  if (!ValidKey(k)) return Err::kCorrupt;
  *out = k;
  return Status::Ok();
}

ReconcileFormat BuildReconcile(const ReconcileKey& k) {
  ReconcileFormat f;
  MemSet(&f, 0, sizeof(f));
  f.reasons = k.reasons;
  f.since.set(k.since);
  return f;
}

bool ReconcileKeyOf(const MemberTable& t, const Extent& e, u32 since, ReconcileKey* out, bool* policy_bad) {
  const Work w = ReconcileOf(t, e);
  if (policy_bad != nullptr && w.policy_bad) *policy_bad = true;
  if (w.reasons == 0) return false;
  ReconcileKey k;
  k.dest = w.dest;
  k.ino = e.ino;
  k.end = e.end;
  k.reasons = w.reasons;
  k.since = since;
  // (An extent of an inode number no key can hold is not the index's to
  // take: the parsers refuse it before it gets here.)
  if (!ValidKey(k)) return false;
  *out = k;
  return true;
}

Status QueueReconcile(btree::Transaction* tx, const MemberTable& t, const Extent* old, const Extent* now, u32 now_s,
                      bool* policy_bad) {
  ReconcileKey o, n;
  const bool has_o = old != nullptr && ReconcileKeyOf(t, *old, now_s, &o, policy_bad);
  const bool has_n = now != nullptr && ReconcileKeyOf(t, *now, now_s, &n, policy_bad);
  if (has_o && !(has_n && n.pos() == o.pos())) TFS_TRY(tx->Delete(o.pos()));
  if (has_n && !(has_o && o.SameWork(n))) {
    const ReconcileFormat f = BuildReconcile(n);
    TFS_TRY(tx->Set(n.pos(), &f, sizeof(f)));
  }
  return Status::Ok();
}

}  // namespace tfs::data
