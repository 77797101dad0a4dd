// The repair worker (fs.h; docs/design/copies.md, "Step 6b"): a thread of
// a writable mount that takes the bad copies reads queued in the data path
// and rewrites each from a good copy. posix runs it because the re-key of
// an extent must be serialized with the inode's other extent commits, and
// those are serialized by the inode lock: the I/O (read a good copy, write
// the new one) happens with no lock held, the inode lock is taken only to
// re-key and commit, as a write's (file.cc, "Locking").
#include "posix/fs.h"

#include "posix/internal.h"

namespace tfs::posix {

void Filesystem::RepairerMain(void* self) {
  Filesystem* fs = static_cast<Filesystem*>(self);
  for (;;) {
    // The sequence is read before the checks: a queue or a stop after them
    // changes it, and the wait returns at once (no lost wake-up). One
    // repair between looks at the stop flag: an unmount waits for one
    // repair's I/O at most (DataPath::Close counts the rest dropped).
    const u32 seq = fs->data_->RepairSeq();
    if (fs->repairer_stop_.Load(MemOrder::kAcquire)) break;
    if (fs->RepairQueued(1) == 0) fs->data_->WaitRepairs(seq, platform::kForever);
  }
}

void Filesystem::StopRepairer() {
  if (!repairer_.running()) return;
  repairer_stop_.Store(true, MemOrder::kRelease);
  data_->KickRepairs();
  repairer_.Join();
}

u32 Filesystem::RepairQueued(u32 max) {
  if (data_ == nullptr) return 0;
  u32 n = 0;
  data::CopyRepair r;
  while (n < max && data_->TakeRepair(&r)) {
    RepairOne(r).IgnoreError();  // (counted and logged by NoteRepair)
    n++;
  }
  return n;
}

Status Filesystem::RepairOne(const data::CopyRepair& r) {
  data::Replacement* rp = platform::New<data::Replacement>();
  data::Delta delta;
  const data::IoContext ctx = data::DataPath::RepairContext(r);
  DebugNoSharedLock();
  Status st = rp == nullptr ? Status(Err::kNoMemory) : data_->PrepareRepair(r, rp, &delta);
  // An HDD's flush before the inode lock, as a write's (CommitData).
  if (st.ok()) st = data_->FlushSlowMembers(ctx, &delta);
  if (st.ok()) {
    const u64 lock[1] = {r.ino};
    Locked locked(this, lock, 1);
    st = locked.status();
    btree::Transaction tx(trees_);
    if (st.ok()) st = data_->QueueReplacePtr(&tx, *rp, &delta);
    if (st.ok()) {
      st = data_->Commit(ctx, &tx, delta);
      delta = data::Delta{};  // applied or aborted
    }
  }
  data_->Abort(delta);  // (nothing left if it was committed)
  data_->NoteRepair(r, rp, st);
  platform::Delete(rp);
  return st;
}

}  // namespace tfs::posix
