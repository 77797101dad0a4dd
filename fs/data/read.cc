// Reads of file data (data.h): ReadBlocks finds the extents over the range
// (phase 1, FindPieces), then reads each from one of its copies (phase 2:
// pin the bucket, read, verify every block it returns): a mismatch is
// kDataCorrupt and counted, never the bytes. An extent with one copy is read
// by ReadCopy, into the caller's buffer when it is aligned. One with several
// is read by a Flight (ReadCopies; docs/design/copies.md, "Step 6"): the
// copies ranked by their members' health and latency (OrderCopies), the
// best read first into the flight's own buffer; if it has not answered
// within its member's hedge bound the next is read too (hedged), a copy that
// fails starts the next at once (read_retries), and the first good answer
// is copied out. The read fails only when every copy did, with the
// best-ranked failing copy's error -- unless a copy was stale (its bucket
// freed since the lookup, maybe: the extent was overwritten), then the
// lookup is repeated first. A copy that failed (a checksum mismatch, an I/O
// error) while another served is queued for repair (repair.cc). Holes and unwritten
// extents read as zeros; a compressed blob is read and decompressed whole.
// HasData, HasBlockData and SeekBlock answer from the extents alone.
//
// Reads need no lock of the caller's. Phase 1 waits out, and is repeated
// after, an extent commit of the inode's stripe applying its keys
// (applying_), so a read never sees half a commit; phase 2 pins the bucket
// (Pin, under the accounting mutex, dropped before the I/O) so an overwrite
// committing meanwhile cannot free and reuse it under the read, and starts
// again if it was freed since phase 1. No lock is held across I/O.
#include "data/data.h"
#include "data/internal.h"

#include "platform/platform.h"

namespace tfs::data {

using btree::Iterator;

// One extent's part of a read, found in phase 1 of ReadBlocks.
struct DataPath::Piece {
  Extent e;   // e.crcs: the read's own copy of block lo's crc onwards (null: no plain copy)
  u64 lo, hi;
};

namespace {

// Whether a and b are the same extent (range and pointers; the crcs follow
// from the pointers' blobs).
bool SameExtent(const Extent& a, const Extent& b) {
  if (a.ino != b.ino || a.start != b.start || a.end != b.end || a.nr_ptrs != b.nr_ptrs) return false;
  for (u32 i = 0; i < a.nr_ptrs && i < kMaxPtrs; i++)
    if (!SamePtr(a.ptrs[i], b.ptrs[i])) return false;
  return true;
}

// Where block lo of e sits in copy p's blob, in bytes from the blob's start
// (a plain copy: from p.offset on the device; a compressed one: in its
// decompressed blocks).
u64 BlobByte(const Extent& e, const Extent::Ptr& p, u64 lo) {
  return (u64(p.blob_offset) + (lo - e.start)) * kBlockSize;
}

// The read's bounce buffer (an extent's worth), allocated on first use;
// null when memory is short.
u8* Bounce(u8** tmp) {
  if (*tmp == nullptr) *tmp = static_cast<u8*>(platform::Alloc(u64(kMaxExtentBlocks) * kBlockSize, kBlockSize));
  return *tmp;
}

}  // namespace

void DataPath::CountRead(const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi) {
  ctr_.bytes_read.FetchAdd(p.compressed ? e.DiskBlocks(p) * kBlockSize : (hi - lo) * kBlockSize, MemOrder::kRelaxed);
  ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
}

Status DataPath::FindPieces(u64 ino, u64 first, u64 end, Vector<Piece>* pieces, u8* crcs) {
  TFS_TRY(pieces->Resize(0));
  u32 ncrc = 0;
  u64 covered_to = 0;  // the end of the extent before (the first may start before `first`)
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  Status st = it.Seek(ExtentPos(ino, first + 1));
  for (; st.ok() && it.Valid() && it.pos().inode == ino; st = it.Next()) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    // Keys come in order, so the extents of one committed state are disjoint;
    // an overlap means the walk crossed a commit: kAgain (and the crcs,
    // sized for disjoint pieces of the range, stay in bounds).
    if (e.start < covered_to) return Err::kAgain;
    covered_to = e.end;
    if (e.unwritten) continue;  // zeros
    TFS_TRY(pieces->PushBack(Piece{}));
    Piece& p = (*pieces)[pieces->size() - 1];
    p.e = e;
    p.lo = Max(e.start, first);
    p.hi = Min(e.end, end);
    // Only the crcs this read needs (the plain copies' blocks; a compressed
    // copy's crc is in its pointer).
    if (e.crcs != nullptr) {
      const u32 count = u32(p.hi - p.lo);
      MemCopy(crcs + 4 * ncrc, e.crcs + 4 * (p.lo - e.start), 4 * count);
      p.e.crcs = crcs + 4 * ncrc;  // block lo's
      ncrc += count;
    }
  }
  return st;
}

Status DataPath::ReadCopy(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi, u8* out,
                          u8** tmp, bool* stale) {
  *stale = false;
  // The pointer must land in one bucket.
  u64 b;
  if (!PtrInBucket(store_->sb(), e, p, &b)) return Err::kCorrupt;
  // A user bucket of the pointer's generation, held until the read is done.
  // If it is not (any more), an overwrite committed and freed it since phase
  // 1, or the copy is stale: the caller decides.
  if (!Pin(p.dev, b, p.gen)) {
    *stale = true;
    return Err::kAgain;
  }
  // Into the caller's buffer if it is aligned for O_DIRECT devices (it then
  // holds unverified bytes until the check below passes or fails the copy),
  // else through a bounce buffer; a compressed blob always decompresses into
  // one.
  const bool direct = !p.compressed && reinterpret_cast<uptr>(out) % kBlockSize == 0;
  if (!direct && Bounce(tmp) == nullptr) {
    Unpin(p.dev, b);
    return Err::kNoMemory;
  }
  const u64 len = (hi - lo) * kBlockSize;
  if (p.compressed) {
    Status st = ReadCompressed(ctx, e, p, *tmp);
    Unpin(p.dev, b);
    TFS_TRY(st);
    MemCopy(out, *tmp + BlobByte(e, p, lo), len);
    CountRead(e, p, lo, hi);
    return Status::Ok();
  }
  const u64 at = p.offset + BlobByte(e, p, lo);
  u8* into = direct ? out : *tmp;
  Status st = ContextIo(ctx, store_->devs().member(p.dev)->queue(), IoOp::kRead, at, into, len);
  Unpin(p.dev, b);
  TFS_TRY(st);
  TFS_TRY(CheckBlocks(e, p, lo, hi, into, at));
  if (!direct) MemCopy(out, *tmp, len);
  CountRead(e, p, lo, hi);
  return Status::Ok();
}

void DataPath::FlightCopyDone(dev::Io* io, Status st) {
  auto* c = static_cast<Flight::Copy*>(io->caller_data);
  Flight* f = c->flight;
  c->err.Store(i32(st.code()), MemOrder::kRelaxed);
  c->done.Store(1, MemOrder::kRelease);
  f->events.FetchAdd(1, MemOrder::kAcqRel);
  // The reference goes before the wake, so a reader that saw `done` waits
  // at most for these two atomics to free the flight itself. The wake then
  // names an address that may be freed: neither the futex (private) nor
  // wake_up_var reads it, and a spurious wake is allowed to any waiter.
  const u32* word = f->events.Address();
  if (f->refs.FetchSub(1, MemOrder::kAcqRel) == 1) {
    // The waiter has left: the flight goes on the list the next read (a
    // write's: the next write), or Close, takes. The data path outlives
    // it: Close waits for every abandoned flight to arrive here first. (No
    // waiter: no wake.)
    DataPath* dp = f->dp;
    SpinGuard l(dp->reap_mu_);
    Flight** list = f->write ? &dp->late_ : &dp->reap_;
    f->next = *list;
    *list = f;
    return;
  }
  tfs_plat_wake(word, 0);
}

void DataPath::FreeFlight(Flight* f) {
  for (u32 i = 0; i < f->submitted; i++) platform::Free(f->copies[i].buf);
  platform::Free(f->data);
  platform::Delete(f);
}

void DataPath::FinishFlight(Flight* f) {
  // (Not on a store closed already -- a test's crash: the next mount
  // counts from the records, where pending space is nothing.)
  for (u32 c = 0; f->write && store_->open() && c < f->submitted; c++) {
    const Flight::Copy& k = f->copies[c];
    if (k.late) Account(k.dev, k.bucket, -i64(k.pending));  // (its request is done: the space is free to go)
  }
  FreeFlight(f);
}

void DataPath::Reap(bool writes) {
  Flight* list;
  {
    SpinGuard l(reap_mu_);
    Flight** from = writes ? &late_ : &reap_;
    list = *from;
    *from = nullptr;
  }
  while (list != nullptr) {
    Flight* next = list->next;
    FinishFlight(list);
    (writes ? ctr_.late_writes : ctr_.abandoned_reads).FetchSub(1, MemOrder::kRelaxed);
    list = next;
  }
}

void DataPath::LeaveFlight(Flight* f, bool settled) {
  // This thread waits for no more of the flight's copies: what is still out
  // (a late copy, a hedge's loser) is reaped elsewhere from now on.
  tfs_plat_io_leave();
  // Every copy's completion taken: each is past its stores, at most a wake
  // and its reference away -- waited for a little (review helper-74:
  // leaving at once counted such a flight abandoned and left it on the reap
  // list until the next read). Bounded: a kernel completion deferred to
  // this CPU's work could not run while this spins.
  for (u32 spins = 0; settled && spins < kLeaveSpins && f->refs.Load(MemOrder::kAcquire) != 1; spins++)
    tfs_plat_spin_yield();
  if (f->refs.Load(MemOrder::kAcquire) == 1) {
    FinishFlight(f);
    return;
  }
  // Abandoned: counted before the reference goes (the last completion puts
  // the flight on its list, whose Reap uncounts it).
  auto& gauge = f->write ? ctr_.late_writes : ctr_.abandoned_reads;
  gauge.FetchAdd(1, MemOrder::kRelaxed);
  if (f->refs.FetchSub(1, MemOrder::kAcqRel) == 1) {
    gauge.FetchSub(1, MemOrder::kRelaxed);
    FinishFlight(f);
  }
}

void DataPath::NoteReadFailure(u32 dev, const Status& st) {
  if (dev::IsDeviceFailure(st)) read_error_ns_[dev % dev::kMaxDevices].Store(platform::NowNs(), MemOrder::kRelaxed);
}

u64 DataPath::HedgeBoundNs(const dev::ReadState& rs) {
  return dev::ScaledBoundNs(rs.samples >= kHedgeMinSamples ? rs.p99_ns : rs.ewma_ns, 4, kHedgeMinNs, kHedgeMaxNs);
}

void DataPath::OrderCopies(const Extent& e, u8* order, u64* bound) const {
  struct Rank {
    u32 rank;  // 0 healthy, 1 a recent I/O error, 2 stalled or stalling, 3 failed or missing
    u64 wait;  // expected: EWMA x (1 + in flight + queued); 0: no latency known yet
    bool fast;  // in the foreground or promote target
  };
  Rank r[kMaxPtrs];
  const u64 now = platform::NowNs();
  const dev::DevMask gone = store_->devs().unavailable();
  const dev::DevMask fast = members_.fg_target | members_.promote_target;
  const u32 n = Min<u32>(e.nr_ptrs, kMaxPtrs);
  for (u32 c = 0; c < n; c++) {
    order[c] = u8(c);
    const u32 d = e.ptrs[c].dev;
    const dev::DevMask bit = dev::DevMask(1) << (d % dev::kMaxDevices);
    dev::Member* m = store_->devs().member(d);
    if (m == nullptr || (gone & bit) != 0) {
      r[c] = Rank{3, 0, false};
      bound[c] = kHedgeMaxNs;
      continue;
    }
    const dev::ReadState rs = m->queue().GetReadState();
    bound[c] = HedgeBoundNs(rs);
    u32 rank = 0;
    const u64 err = read_error_ns_[d % dev::kMaxDevices].Load(MemOrder::kRelaxed);
    if (err != 0 && now < err + kReadErrorMemoryNs) rank = 1;  // (err may be newer than now)
    if (rs.stalled || rs.oldest_ns > bound[c]) rank = 2;
    r[c] = Rank{rank, rs.ewma_ns * (1 + u64(rs.in_flight) + rs.queued), (fast & bit) != 0};
  }
  if (listed_order_) return;
  // Whether copy a goes before copy b listed ahead of it.
  auto before = [&](const Rank& a, const Rank& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    // (A member not read yet is taken as its tier's: the fast tier first.)
    if (a.wait == 0 || b.wait == 0) return a.fast && !b.fast;
    return 2 * a.wait < b.wait && b.wait - a.wait > kReorderMarginNs;
  };
  // (Insertion: a copy moves ahead only past copies it clearly beats.)
  for (u32 i = 1; i < n; i++)
    for (u32 j = i; j > 0 && before(r[order[j]], r[order[j - 1]]); j--) {
      const u8 t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
}

bool DataPath::ReadCopies(const IoContext& ctx, const Extent& e, u64 lo, u64 hi, u8* out, u8** tmp, Status* failed,
                          bool* stale_copy) {
  u8 order[kMaxPtrs];
  u64 bound[kMaxPtrs];
  OrderCopies(e, order, bound);
  const u32 n = Min<u32>(e.nr_ptrs, kMaxPtrs);
  if (order[0] != 0) ctr_.copies_reordered.FetchAdd(1, MemOrder::kRelaxed);
  Flight* f = platform::New<Flight>();
  if (f == nullptr) {
    *failed = Err::kNoMemory;
    return false;
  }
  f->dp = this;
  // Reads nobody waits for are not hedged: background work takes the copy
  // chosen (never a stalled member while a healthy one has a copy) and
  // its retries, and never doubles its reads.
  const bool hedging = hedging_ &&
                       (ctx.io_class == dev::IoClass::kForegroundSync || ctx.io_class == dev::IoClass::kForegroundAsync);
  const u64 len = (hi - lo) * kBlockSize;
  u32 next = 0;       // order[next]: the next copy to try
  u32 out_now = 0;    // copies submitted whose completion the reader has not taken
  u64 deadline = platform::kForever;
  bool served = false;
  bool no_memory = false;
  // Each failed copy's error by its place in `order` (the error reported is
  // the best-ranked copy's, whichever failed first; kNoMemory wins).
  Status errors[kMaxPtrs];
  auto note = [&](u32 place, Status st) {
    if (st.code() == Err::kNoMemory) no_memory = true;
    errors[place] = st;
  };
  // Submits the next copy that can be read (a bad pointer fails it, a
  // stale one is skipped, as ReadCopy does); `hedge`: beside one in flight.
  auto launch = [&](bool hedge) {
    while (next < n && !no_memory) {
      const u32 place = next;
      const u32 c = order[next++];
      const Extent::Ptr& p = e.ptrs[c];
      if (place > 0 && !hedge) ctr_.read_retries.FetchAdd(1, MemOrder::kRelaxed);  // (an earlier copy failed or was skipped)
      u64 b;
      if (!PtrInBucket(store_->sb(), e, p, &b)) {
        note(place, Err::kCorrupt);
        continue;
      }
      if (!Pin(p.dev, b, p.gen)) {
        *stale_copy = true;
        continue;
      }
      Flight::Copy& k = f->copies[f->submitted];
      const u64 bytes = p.compressed ? e.DiskBlocks(p) * kBlockSize : len;
      k.buf = static_cast<u8*>(platform::Alloc(bytes, kBlockSize));
      if (k.buf == nullptr) {
        Unpin(p.dev, b);
        note(place, Err::kNoMemory);
        return;
      }
      k.flight = f;
      k.ptr = c;
      k.place = place;
      k.bucket = b;
      k.pinned = true;
      k.hedge = hedge;
      k.at = p.compressed ? p.offset : p.offset + BlobByte(e, p, lo);
      k.io.req.op = IoOp::kRead;
      k.io.req.origin = ctx.origin;
      k.io.req.offset = k.at;
      k.io.req.length = bytes;
      k.io.req.buf = k.buf;
      k.io.cls = ctx.io_class;
      k.io.done = FlightCopyDone;
      k.io.caller_data = &k;
      f->submitted++;
      f->refs.FetchAdd(1, MemOrder::kAcqRel);
      out_now++;
      if (hedge) ctr_.hedged.FetchAdd(1, MemOrder::kRelaxed);
      deadline = hedging && next < n ? platform::NowNs() + bound[c] : platform::kForever;
      // (Never inline: a member that stalls would hold this thread inside
      // Submit, past any hedge. As a flight: this thread may reap it itself
      // in tfs_plat_wait_io, below.)
      store_->devs().member(p.dev)->queue().SubmitFlight(&k.io);
      return;
    }
  };
  launch(false);
  while (!served && !no_memory) {
    if (out_now == 0) {
      if (next >= n) break;  // every copy tried
      launch(false);
      continue;
    }
    // Completions first (a copy done and one timed out: the answer wins).
    const u32 ev = f->events.Load(MemOrder::kAcquire);
    bool took = false;
    for (u32 i = 0; i < f->submitted && !served && !no_memory; i++) {
      Flight::Copy& k = f->copies[i];
      if (k.seen || k.done.Load(MemOrder::kAcquire) == 0) continue;
      k.seen = true;
      took = true;
      out_now--;
      const Extent::Ptr& p = e.ptrs[k.ptr];
      Unpin(p.dev, k.bucket);
      k.pinned = false;
      Status st = Status(Err(k.err.Load(MemOrder::kRelaxed)));
      if (st.ok() && p.compressed) {
        st = Bounce(tmp) == nullptr ? Status(Err::kNoMemory) : CheckBlob(e, p, k.buf, *tmp);
        if (st.ok()) MemCopy(out, *tmp + BlobByte(e, p, lo), len);
      } else if (st.ok()) {
        st = CheckBlocks(e, p, lo, hi, k.buf, k.at);
        if (st.ok()) MemCopy(out, k.buf, len);
      }
      if (st.ok()) {
        served = true;
        CountRead(e, p, lo, hi);
        if (k.hedge) ctr_.hedge_wins.FetchAdd(1, MemOrder::kRelaxed);
        break;
      }
      NoteReadFailure(p.dev, st);
      note(k.place, st);
      launch(false);  // (at once, beside any copy still out)
    }
    if (took) continue;
    const u64 now = platform::NowNs();
    if (now >= deadline) {
      launch(true);
      if (out_now > 0 && next >= n) deadline = platform::kForever;
      continue;
    }
    tfs_plat_wait_io(f->events.Address(), ev, deadline == platform::kForever ? platform::kForever : deadline - now);
  }
  if (!served) {
    for (u32 i = 0; i < n; i++)
      if (!errors[i].ok() && (failed->ok() || errors[i].code() == Err::kNoMemory)) *failed = errors[i];
  } else {
    // The copies that failed while another was good: bad copies to rewrite
    // from a good one (6b; a timeout is a slow member, not a bad copy).
    for (u32 i = 0; i < n; i++)
      if (errors[i].code() == Err::kDataCorrupt || errors[i].code() == Err::kIo)
        QueueRepair(e, order[i], errors[i].code() == Err::kIo);
  }
  // Leave: every pin dropped (a copy still out reads into its own buffer,
  // dropped unread); the flight freed now, or by Reap once its copies
  // complete.
  for (u32 i = 0; i < f->submitted; i++) {
    Flight::Copy& k = f->copies[i];
    if (k.pinned) Unpin(e.ptrs[k.ptr].dev, k.bucket);
    k.pinned = false;
  }
  LeaveFlight(f, out_now == 0);
  return served;
}

Status DataPath::ReadBlocks(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, u8* buf) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  // Flights abandoned by earlier reads whose copies have completed since.
  if (ctr_.abandoned_reads.Load(MemOrder::kRelaxed) != 0) Reap();
  const u64 end = first + nblocks;
  // Phase 1 finds the extents, copying what phase 2 needs, and is repeated
  // if an extent commit of this inode overlapped it: a commit replaces keys
  // one by one, and a walk through the middle of one could see neither the
  // old nor the new extent of a block (and read zeros that were never
  // there). Phase 2 pins each bucket and reads it; if the bucket was freed
  // since phase 1, everything starts again. The pieces: one per extent found
  // (a few for most reads), not one per block.
  Vector<Piece> pieces;
  u8* crcs = static_cast<u8*>(platform::Alloc(u64(nblocks) * 4, 16));
  u8* tmp = nullptr;
  Status st = crcs == nullptr ? Status(Err::kNoMemory) : pieces.Reserve(Min<u32>(nblocks, 4));
  const u32 s = CommitStripe(ino);
  u32 stale = 0;
  u32 torn = 0;
  // The extent of the last piece that failed with a stale copy (see below).
  Extent failed_extent;
  bool failed_before = false;
  for (u32 attempt = 0; st.ok(); attempt++) {
    if (attempt > 0) platform::SleepNs(attempt < 8 ? 1000 : 100000);
    // While a commit of this stripe applies its keys (microseconds: no journal
    // wait in between; at most a read of an evicted leaf from the metadata
    // target), wait; never count that against the read.
    const u64 v = applying_[s].Load(MemOrder::kSeqCst);
    if ((v & 1) != 0) {
      ctr_.lookup_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    st = FindPieces(ino, first, end, &pieces, crcs);
    const bool walk_torn = st.code() == Err::kAgain;
    if (walk_torn) st = Status::Ok();
    if (!st.ok()) break;
    // A walk no apply overlapped (the counter did not move) sees one committed
    // state, which never has overlapping extents: torn, it found extents that
    // overlap for good (fsck reports them), which would make phase 1 repeat
    // forever; after kMaxTornWalks such walks the read fails instead. A walk
    // an apply overlapped is retried and never counted.
    const bool raced = applying_[s].Load(MemOrder::kSeqCst) != v;
    if (walk_torn && !raced && ++torn > kMaxTornWalks) {
      platform::Log(platform::LogLevel::kError, "data: inode %llu: extents overlap under a read",
                    (unsigned long long)ino);
      st = Err::kCorrupt;
      break;
    }
    if (walk_torn || raced) {
      ctr_.lookup_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    if (lookup_hook_ != nullptr) lookup_hook_(lookup_hook_ctx_);
    MemSet(buf, 0, u64(nblocks) * kBlockSize);
    bool again = false;
    for (u32 i = 0; st.ok() && !again && i < pieces.size(); i++) {
      const Extent& e = pieces[i].e;
      const u64 lo = pieces[i].lo;
      u8* out = buf + (lo - first) * kBlockSize;
      // The copies in order; the first good one wins. A copy whose bucket is
      // not the one it names is skipped: stale (a cached copy whose bucket
      // was invalidated: normal), or freed by an overwrite since phase 1.
      // If no copy read, the lookup is repeated when a copy was stale -- an
      // overwrite may have replaced the extent -- and the failure reported
      // when none was, or when the repeated lookup found the same extent
      // again (then its stale copies are stale for good: an overwrite
      // removes the extent before it frees a bucket).
      Status failed = Status::Ok();
      bool stale_copy = false;
      bool done = false;
      if (e.nr_ptrs > 1) {
        done = ReadCopies(ctx, e, lo, pieces[i].hi, out, &tmp, &failed, &stale_copy);
      } else {
        Status cs = ReadCopy(ctx, e, e.ptrs[0], lo, pieces[i].hi, out, &tmp, &stale_copy);
        done = cs.ok();
        if (!done && !stale_copy) failed = cs;
      }
      if (done) continue;
      if (!failed.ok() && (!stale_copy || failed.code() == Err::kNoMemory ||
                           (failed_before && SameExtent(e, failed_extent)))) {
        st = failed;
        break;
      }
      // (stale_copy: some copy was, every one if none failed; e.nr_ptrs is at least 1.)
      TFS_BUG_ON(!stale_copy);
      if (++stale > kMaxStaleLookups) {
        // A pointer that stays wrong, or a failing copy whose extent kept
        // changing: its failure.
        st = failed.ok() ? Status(Err::kCorrupt) : failed;
        break;
      }
      if (!failed.ok()) {
        failed_extent = e;
        failed_extent.crcs = nullptr;
        failed_before = true;
      }
      ctr_.stale_lookups.FetchAdd(1, MemOrder::kRelaxed);
      again = true;
    }
    if (!again) break;
  }
  platform::Free(tmp);
  platform::Free(crcs);
  return st;
}

Status DataPath::ReadCompressed(const IoContext& ctx, const Extent& e, const Extent::Ptr& p, u8* out) {
  const u64 disk = e.DiskBlocks(p) * kBlockSize;
  u8* z = static_cast<u8*>(platform::Alloc(disk, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  Status st = ContextIo(ctx, store_->devs().member(p.dev)->queue(), IoOp::kRead, p.offset, z, disk);
  if (st.ok()) st = CheckBlob(e, p, z, out);
  platform::Free(z);
  return st;
}

Status DataPath::CheckBlocks(const Extent& e, const Extent::Ptr& p, u64 lo, u64 hi, const u8* data, u64 at) {
  for (u64 blk = lo; blk < hi; blk++) {
    if (platform::Crc32c(data + (blk - lo) * kBlockSize, kBlockSize) == e.BlockCrc(blk - lo)) continue;
    ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
    platform::Log(platform::LogLevel::kError, "data: checksum mismatch: inode %llu block %llu (member %u offset %llu)",
                  (unsigned long long)e.ino, (unsigned long long)blk, unsigned(p.dev),
                  (unsigned long long)(at + (blk - lo) * kBlockSize));
    return Err::kDataCorrupt;
  }
  return Status::Ok();
}

Status DataPath::CheckBlob(const Extent& e, const Extent::Ptr& p, const u8* z, u8* out) {
  if (platform::Crc32c(z, p.disk_bytes) != p.crc) {
    ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
    platform::Log(platform::LogLevel::kError,
                  "data: checksum mismatch: inode %llu compressed blob at block %llu (member %u offset %llu)",
                  (unsigned long long)e.ino, (unsigned long long)(e.start - p.blob_offset), unsigned(p.dev),
                  (unsigned long long)p.offset);
    return Err::kDataCorrupt;
  }
  // A blob that passes its crc but does not decompress to exactly its
  // blocks was written wrong: corrupt, never partial data.
  const u64 want = u64(p.stored_blocks) * kBlockSize;
  auto r = platform::ZstdDecompress(out, want, z, p.disk_bytes);
  if (!r.ok() || r.value() != want) return Err::kDataCorrupt;
  ctr_.compressed_reads.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

Result<bool> DataPath::HasData(u64 ino) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, 0)));
  return it.Valid() && it.pos().inode == ino;
}

Result<bool> DataPath::HasBlockData(u64 ino, u64 block) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, block + 1)));
  if (!it.Valid() || it.pos().inode != ino) return false;
  Extent e;
  TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
  return e.start <= block && !e.unwritten;
}

Result<u64> DataPath::SeekBlock(u64 ino, u64 block, bool data) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, block + 1)));  // the first extent ending past `block`
  u64 cur = block;
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.unwritten) continue;
    if (data) return Max(cur, e.start);
    if (e.start > cur) return cur;  // a gap, or an unwritten extent, before it
    cur = e.end;
  }
  return data ? kNoBlock : cur;
}

}  // namespace tfs::data
