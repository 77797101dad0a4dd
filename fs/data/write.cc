// Writes, punches and reservations of file data (data.h): Prepare writes a
// write's blobs -- whole 4 KiB blocks, zstd-compressed where that saves a
// block -- into space from ctx's write point, and builds their extent values;
// the Queue* calls put extent keys into the caller's transaction (the new
// ones, what an overwrite or punch leaves of the old ones, unwritten ones for
// fallocate), each with its backpointers (backpointer.h: QueueBackpointers,
// in the same transaction), and record in a Delta how the space accounting
// is to move;
// Commit commits the transaction with the records of the buckets whose
// counts move (account.cc), or Aborts the delta.
//
// Prepare needs no lock (its blobs are new) and does its device I/O before
// anything is queued: each blob to every copy at once (WriteCopies: one
// submission per copy, one wait for all), a copy that fails dropped (the
// extent keeps the others; counted); the Queue* calls for one inode and the
// commit that follows must be serialized by the caller (posix's inode
// stripe). Data is
// written and completed before its commit, which names the members written
// (Delta::deps); data on a member without a journal ring is flushed before
// the commit enters the journal (the slow-member rule). No lock of the data
// path is held across I/O or a btree call.
#include "data/backpointer.h"
#include "data/data.h"
#include "data/internal.h"

#include "platform/platform.h"

namespace tfs::data {

using btree::Iterator;

bool DataPath::Stalling(u32 dev) const {
  const dev::Member* m = store_->devs().member(dev);
  return m != nullptr && dev::Stalling(m->queue().GetReadState(/*p99=*/false));
}

Status DataPath::WriteCopies(const IoContext& ctx, const Space* sp, u32 copies, const u8* data, u64 len,
                             Status* per, bool* late) {
  for (u32 c = 0; c < copies; c++) late[c] = false;
  if (copies == 1) {  // (the one-copy write as it always was: submitted and waited for)
    // O_DIRECT devices need aligned buffers: copy only data that is not.
    u8* buf = nullptr;
    if (reinterpret_cast<uptr>(data) % kBlockSize != 0) {
      buf = static_cast<u8*>(platform::Alloc(len, kBlockSize));
      if (buf == nullptr) return Err::kNoMemory;
      MemCopy(buf, data, len);
    }
    u8* from = buf != nullptr ? buf : const_cast<u8*>(data);
    per[0] = ContextIo(ctx, store_->devs().member(sp[0].ref.dev)->queue(), IoOp::kWrite, sp[0].offset, from, len);
    platform::Free(buf);
    return Status::Ok();
  }
  // Every copy is submitted before any is waited for: the write takes as
  // long as its slowest copy, not the sum (the queues never block a
  // submission). From the write's own copy of the data: a copy left behind
  // still reads it after the caller has its buffer back. Without memory for
  // that copy, from the caller's buffer if it is aligned -- and then no
  // copy is left behind (nor when kMaxLateWrites are out already: their
  // buffers and their space are bounded).
  Flight* f = platform::New<Flight>();
  if (f == nullptr) return Err::kNoMemory;
  f->dp = this;
  f->write = true;
  f->data = static_cast<u8*>(platform::Alloc(len, kBlockSize));
  const u8* from = f->data;
  if (f->data != nullptr) {
    MemCopy(f->data, data, len);
  } else if (reinterpret_cast<uptr>(data) % kBlockSize == 0) {
    from = data;
  } else {
    platform::Delete(f);
    return Err::kNoMemory;
  }
  const bool may_leave =
      late_copies_ && f->data != nullptr && ctr_.late_writes.Load(MemOrder::kRelaxed) < kMaxLateWrites;
  dev::LateWatch<kMaxPtrs> watch;  // per copy
  for (u32 c = 0; c < copies; c++) {
    Flight::Copy& k = f->copies[c];
    k.flight = f;
    k.dev = sp[c].ref.dev;
    k.bucket = sp[c].ref.bucket;
    k.pending = u32(len / kBlockSize);
    k.io.req.op = IoOp::kWrite;
    k.io.req.origin = ctx.origin;
    k.io.req.offset = sp[c].offset;
    k.io.req.length = len;
    k.io.req.buf = const_cast<u8*>(from);
    k.io.cls = ctx.io_class;
    k.io.done = FlightCopyDone;
    k.io.caller_data = &k;
  }
  f->submitted = copies;
  f->refs.FetchAdd(copies, MemOrder::kAcqRel);
  const u64 start = platform::NowNs();
  for (u32 c = 0; c < copies; c++) watch.Start(c, store_->devs().member(f->copies[c].dev)->queue(), start);
  // (Never inline: a member that stalls would hold this thread inside
  // Submit, past any bound. As a flight: this thread may reap its copies
  // itself in tfs_plat_wait_io, below.)
  for (u32 c = 0; c < copies; c++) store_->devs().member(f->copies[c].dev)->queue().SubmitFlight(&f->copies[c].io);
  u32 out = copies;
  bool written = false;  // some copy is on its member
  while (out > 0) {
    const u32 ev = f->events.Load(MemOrder::kAcquire);
    for (u32 c = 0; c < copies; c++) {
      Flight::Copy& k = f->copies[c];
      if (k.seen || k.done.Load(MemOrder::kAcquire) == 0) continue;
      k.seen = true;
      out--;
      per[c] = Status(Err(k.err.Load(MemOrder::kRelaxed)));
      written |= per[c].ok();
    }
    if (out == 0) break;
    // Once a copy is written, the others are waited for up to their
    // members' late bounds; before, as long as it takes (no copy is
    // anywhere else). A copy past its bound is left behind only if its
    // member is stalling (its oldest request past the bound, or a stall):
    // a busy member's queue may simply not have sent it yet -- its bound
    // starts again.
    u32 open = 0;  // copies not seen
    for (u32 c = 0; c < copies; c++) open |= f->copies[c].seen ? 0 : 1u << c;
    const u64 deadline = written && may_leave ? watch.Deadline(open) : platform::kForever;
    const u64 now = platform::NowNs();
    if (now >= deadline) {
      u32 out_now = 0;  // (one that completed since the look above is seen next time round)
      for (u32 c = 0; c < copies; c++) out_now |= f->copies[c].done.Load(MemOrder::kAcquire) != 0 ? 0 : 1u << c;
      for (u32 c : dev::Bits(watch.Late(open & out_now, now))) {
        Flight::Copy& k = f->copies[c];
        k.late = true;
        k.seen = true;  // (the writer is done with it; its completion is Reap(true)'s)
        late[c] = true;
        per[c] = Err::kIoTimeout;
        out--;
        ctr_.late_copies.FetchAdd(1, MemOrder::kRelaxed);
      }
      continue;
    }
    tfs_plat_wait_io(f->events.Address(), ev, deadline == platform::kForever ? platform::kForever : deadline - now);
  }
  // Freed now (a late copy that completed meanwhile: its space back), or
  // left to the completions of its late copies (late_writes; Reap(true)).
  bool left = false;
  for (u32 c = 0; c < copies; c++) left |= f->copies[c].late;
  LeaveFlight(f, !left);
  return Status::Ok();
}

Status DataPath::RecordCopies(const Space* sp, u32 copies, u32 blocks, u32 pending, Delta* delta) {
  for (u32 c = 0; c < copies; c++) {
    Status st = delta->changes.PushBack(Delta::Change{.dev = sp[c].ref.dev,
                                                      .bucket = sp[c].ref.bucket,
                                                      .blocks = i64(blocks),
                                                      .pending = i64(pending),
                                                      .gen = sp[c].ref.gen});
    if (!st.ok()) {
      // The recorded ones go back with Abort; these are in no delta.
      for (u32 k = c; k < copies; k++) Account(sp[k].ref.dev, sp[k].ref.bucket, -i64(pending));
      return st;
    }
  }
  return Status::Ok();
}

void DataPath::LogCopyError(u32 dev, const Status& st, bool late) {
  const u32 m = dev % dev::kMaxDevices;
  char more[64];
  if (!(late ? late_copy_log_[m] : copy_error_log_[m]).Admit(kCopyErrorLogNs, more, sizeof(more))) return;
  if (late) {
    platform::Log(platform::LogLevel::kWarn,
                  "data: write of a copy to member %u did not complete within its late bound: the extent is "
                  "committed with its other copies (degraded)%s",
                  unsigned(m), more);
    return;
  }
  platform::Log(platform::LogLevel::kError, "data: write of a copy to member %u failed: %s%s", unsigned(m),
                st.Message(), more);
}

void DataPath::LogCopyAllocError(const Status& st) {
  char more[64];
  if (!copy_alloc_error_log_.Admit(kCopyErrorLogNs, more, sizeof(more))) return;
  platform::Log(platform::LogLevel::kError,
                "data: allocating a bucket for a further copy failed: %s: the write goes on with fewer copies%s",
                st.Message(), more);
}

Status DataPath::KeepWritten(const IoContext& ctx, const Space* sp, u32 copies, const Status* per, const bool* late,
                             u64 first_change, u64 blocks, Delta* delta, Extent* x) {
  x->nr_ptrs = 0;
  u32 durability = 0;
  Status first_error = Status::Ok();
  for (u32 c = 0; c < copies; c++) {
    Delta::Change& ch = delta->changes[first_change + c];
    if (!per[c].ok()) {
      // Its space back now (the bucket may go once empty) -- a late copy's
      // once its request completes (Reap(true): it still writes there); the
      // others keep the data.
      if (!late[c]) Account(ch.dev, ch.bucket, -ch.pending);
      ch.blocks = 0;
      ch.pending = 0;
      if (first_error.ok()) first_error = per[c];
      if (copies > 1 && !late[c]) ctr_.copy_write_errors.FetchAdd(1, MemOrder::kRelaxed);
      if (copies > 1) LogCopyError(sp[c].ref.dev, per[c], late[c]);  // (one copy: the write fails with its error)
      continue;
    }
    Extent::Ptr& p = x->ptrs[x->nr_ptrs++];
    p = Extent::Ptr{};
    p.dev = u8(sp[c].ref.dev);
    p.gen = sp[c].ref.gen;
    p.offset = sp[c].offset;
    delta->deps |= dev::DevMask(1) << sp[c].ref.dev;
    durability += members_.durability[sp[c].ref.dev];
  }
  if (x->nr_ptrs == 0) return first_error;
  // A member is sole when the other copies count for nothing: one pointer,
  // or the others all on cache-only members (durability 0) -- losing its
  // copy loses the data's every counted copy.
  for (u32 i = 0; i < x->nr_ptrs; i++) {
    const u32 own = members_.durability[x->ptrs[i].dev];
    if (durability - own == 0) delta->sole |= dev::DevMask(1) << x->ptrs[i].dev;
  }
  // Its sectors join the total of the set its copies are on.
  TFS_TRY(delta->AddSet(CountedMembers(store_->sb(), *x), i64(blocks) * (kBlockSize / 512)));
  if (x->nr_ptrs > 1) ctr_.replica_copies.FetchAdd(x->nr_ptrs - 1, MemOrder::kRelaxed);
  if (durability < Wanted(ctx)) {
    ctr_.degraded_writes.FetchAdd(1, MemOrder::kRelaxed);
    ctr_.degraded_sectors.FetchAdd(blocks * (kBlockSize / 512), MemOrder::kRelaxed);
  }
  return Status::Ok();
}

Status DataPath::QueueWrite(const IoContext& ctx, btree::Transaction* tx, u64 ino, u64 first, const u8* blocks,
                            u32 nblocks, Delta* delta, bool compress) {
  Prepared* p = platform::New<Prepared>();
  if (p == nullptr) return Err::kNoMemory;
  Status st = Prepare(ctx, ino, first, blocks, nblocks, compress, p, delta);
  if (st.ok()) st = QueuePrepared(tx, *p, Policy{}, delta);
  platform::Delete(p);
  return st;
}

Result<u64> DataPath::UnwrittenBlocks(u64 ino, u64 first, u64 end) {
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u64 n = 0;
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    if (e.unwritten) n += Min(e.end, end) - Max(e.start, first);
  }
  return n;
}

Status DataPath::QueuePrepared(btree::Transaction* tx, const Prepared& p, const Policy& policy, Delta* delta) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  TFS_TRY(QueuePunch(tx, p.ino, p.first, p.first + p.blocks, delta));
  return QueuePreparedOverPunch(tx, p, policy);
}

Status DataPath::QueuePreparedOverPunch(btree::Transaction* tx, const Prepared& p, const Policy& policy) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  for (const Prepared::Item& item : p.items) {
    Extent e;
    TFS_TRY(ParseExtent(ExtentPos(p.ino, item.end), item.value, item.len, &e));
    // The policy of the caller's inode as it is now (under its lock), with
    // what Prepare learnt of the blocks (kPolicyIncompressible). The same
    // length: the journal bounds do not change.
    const u8 learnt = e.policy.flags;
    e.policy = policy;
    e.policy.flags |= learnt;
    u8 value[kExtentValueMax];
    const u32 len = TFS_TRY(BuildExtent(e, value));
    TFS_TRY(tx->Set(ExtentPos(p.ino, item.end), value, len));
    TFS_TRY(QueueBackpointers(tx, store_->sb(), nullptr, &e));
    TFS_TRY(QueueDataChecks(tx, e));  // (e.crcs: the item's, as written)
  }
  return Status::Ok();
}

Status DataPath::QueueDataChecks(btree::Transaction* tx, const Extent& e) {
  // The blobs were just written whole: a check per copy covers it with the
  // crcs the extent already holds (per block, or a compressed blob's one), so
  // replay can tell whether it reached the disk (journal/format.h,
  // kKeyDataCheck).
  for (u32 i = 0; i < e.nr_ptrs; i++) {
    const Extent::Ptr& p = e.ptrs[i];
    // A member without a journal is flushed by the committer (Commit): its
    // data is durable before the entry, and replay has nothing to check.
    if ((journal_members_ & (dev::DevMask(1) << p.dev)) == 0) continue;
    const u32 ncrcs = p.compressed ? 1 : e.blocks();
    u8 buf[sizeof(journal::DataCheckFormat) + 4 * kMaxExtentBlocks];
    auto* dc = reinterpret_cast<journal::DataCheckFormat*>(buf);
    MemSet(dc, 0, sizeof(*dc));
    dc->member.set(p.dev);
    dc->offset.set(p.offset + u64(p.compressed ? 0 : p.blob_offset) * kBlockSize);
    dc->length.set(p.compressed ? p.disk_bytes : ncrcs * kBlockSize);
    dc->unit.set(p.compressed ? p.disk_bytes : kBlockSize);
    if (p.compressed) {
      Le32 c;
      c.set(p.crc);
      MemCopy(buf + sizeof(*dc), &c, 4);
    } else {
      MemCopy(buf + sizeof(*dc), e.crcs, 4 * ncrcs);
    }
    TFS_TRY(tx->AddDataCheck(buf, journal::DataCheckBytes(ncrcs)));
  }
  return Status::Ok();
}

Status DataPath::Prepare(const IoContext& ctx, u64 ino, u64 first, const u8* blocks, u32 nblocks, bool compress,
                         Prepared* p, Delta* delta) {
  if (store_ == nullptr || nblocks == 0) return Err::kInvalidArgument;
  // Late copies of earlier writes whose requests have completed since: their space back.
  if (ctr_.late_writes.Load(MemOrder::kRelaxed) != 0) Reap(/*writes=*/true);
  p->ino = ino;
  p->first = first;
  p->blocks = nblocks;
  TFS_TRY(p->items.Resize(0));
  auto covered = UnwrittenBlocks(ino, first, first + nblocks);  // reserved blocks this write replaces
  TFS_TRY(covered.status());
  u8 crcs[4 * kMaxExtentBlocks];
  // Plain blocks are written up to `plain_end`: all of them, or (compressing)
  // the current chunk when zstd did not save a block.
  u32 plain_end = compress ? 0 : nblocks;
  for (u32 done = 0; done < nblocks;) {
    if (done >= plain_end) {
      const u32 n = Min(nblocks - done, kMaxCompressedBlocks);
      Status st = WriteCompressed(ctx, p, first + done, blocks + u64(done) * kBlockSize, n, covered.value(), delta);
      if (st.ok()) {
        done += n;
        continue;
      }
      if (st.code() != Err::kNotSupported) return st;
      ctr_.incompressible.FetchAdd(1, MemOrder::kRelaxed);
      plain_end = done + n;
    }
    Space sp[kMaxPtrs];
    u32 copies;
    u32 got;
    TFS_TRY(Reserve(ctx, Min(plain_end - done, kMaxExtentBlocks), covered.value(), false, sp, &copies, &got));
    // Recorded at once, so that Abort gives the reserved space back whatever fails next.
    const u64 first_change = delta->changes.size();
    TFS_TRY(RecordCopies(sp, copies, got, got, delta));
    const u8* data = blocks + u64(done) * kBlockSize;
    Status per[kMaxPtrs];
    bool late[kMaxPtrs];
    TFS_TRY(WriteCopies(ctx, sp, copies, data, u64(got) * kBlockSize, per, late));
    for (u32 i = 0; i < got; i++) {
      Le32 c;
      c.set(platform::Crc32c(data + u64(i) * kBlockSize, kBlockSize));
      MemCopy(crcs + 4 * i, &c, 4);
    }
    // One plain pointer per copy written; they share the crcs.
    Extent x;
    x.start = first + done;
    x.end = x.start + got;
    // Plain although compression was asked for: zstd saved nothing here.
    if (compress) x.policy.flags = kPolicyIncompressible;
    TFS_TRY(KeepWritten(ctx, sp, copies, per, late, first_change, got, delta, &x));
    x.crcs = crcs;
    TFS_TRY(p->items.PushBack(Prepared::Item{}));
    Prepared::Item& item = p->items[p->items.size() - 1];
    item.end = x.end;
    item.len = TFS_TRY(BuildExtent(x, item.value));
    delta->sectors += i64(got) * (kBlockSize / 512);
    ctr_.bytes_written.FetchAdd(u64(got) * kBlockSize, MemOrder::kRelaxed);
    ctr_.extents_written.FetchAdd(1, MemOrder::kRelaxed);
    done += got;
  }
  return Status::Ok();
}

Status DataPath::WriteCompressed(const IoContext& ctx, Prepared* p, u64 first, const u8* data, u32 nblocks,
                                 u64 covered, Delta* delta) {
  if (nblocks < 2) return Err::kNotSupported;  // nothing to save
  const u64 in = u64(nblocks) * kBlockSize;
  const u64 cap = in - kBlockSize;  // it must save a block
  u8* z = static_cast<u8*>(platform::Alloc(in, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  auto r = platform::ZstdCompress(z, cap, data, in);
  if (!r.ok()) {
    platform::Free(z);
    return r.status().code() == Err::kNoSpace ? Status(Err::kNotSupported) : r.status();
  }
  const u32 zbytes = u32(r.value());
  const u32 zblocks = (zbytes + kBlockSize - 1) / kBlockSize;
  MemSet(z + zbytes, 0, u64(zblocks) * kBlockSize - zbytes);
  Space sp[kMaxPtrs];
  u32 copies;
  u32 got;
  Status st = Reserve(ctx, zblocks, covered, true, sp, &copies, &got);
  const u64 first_change = delta->changes.size();
  if (st.ok()) st = RecordCopies(sp, copies, nblocks, zblocks, delta);
  Status per[kMaxPtrs];
  bool late[kMaxPtrs];
  if (st.ok()) st = WriteCopies(ctx, sp, copies, z, u64(zblocks) * kBlockSize, per, late);
  Extent x;
  x.start = first;
  x.end = first + nblocks;
  if (st.ok()) st = KeepWritten(ctx, sp, copies, per, late, first_change, nblocks, delta, &x);
  if (st.ok()) {
    // One compressed pointer per copy written: the whole blob, its own crc.
    const u32 crc = platform::Crc32c(z, zbytes);
    for (u32 c = 0; c < x.nr_ptrs; c++) {
      Extent::Ptr& ptr = x.ptrs[c];
      ptr.compressed = true;
      ptr.stored_blocks = u8(nblocks);
      ptr.disk_bytes = zbytes;
      ptr.crc = crc;
    }
    st = p->items.PushBack(Prepared::Item{});
    if (st.ok()) {
      Prepared::Item& item = p->items[p->items.size() - 1];
      item.end = x.end;
      auto len = BuildExtent(x, item.value);
      st = len.status();
      if (st.ok()) item.len = len.value();
    }
  }
  platform::Free(z);
  TFS_TRY(st);
  delta->sectors += i64(nblocks) * (kBlockSize / 512);
  ctr_.bytes_written.FetchAdd(u64(zblocks) * kBlockSize, MemOrder::kRelaxed);
  ctr_.extents_written.FetchAdd(1, MemOrder::kRelaxed);
  ctr_.compressed_in.FetchAdd(in, MemOrder::kRelaxed);
  ctr_.compressed_out.FetchAdd(zbytes, MemOrder::kRelaxed);
  return Status::Ok();
}

Result<usize> DataPath::PreparedJournalBytes(const Prepared& p, const Delta& delta) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  // Measured, not restated: p queued into a transaction of its own.
  btree::Transaction scratch(trees_);
  const usize room = scratch.Room();
  TFS_TRY(QueuePreparedOverPunch(&scratch, p, Policy{}));  // (a policy changes no length)
  // (The accounting keys: the delta's sets, a set per item at most, the
  // reserved total.)
  return room - scratch.Room() +
         delta.changes.size() * btree::Transaction::KeyBytes(u32(sizeof(alloc::AllocRecord))) +
         (delta.sets.size() + p.items.size() + 1) * btree::Transaction::KeyBytes(u32(sizeof(alloc::AcctRecord)));
}

usize WriteJournalBytes(u32 nblocks, u32 bucket_blocks, u32 members, u32 copies) {
  using btree::Transaction;
  const u64 n = nblocks;
  const u64 o = Min<u32>(Max<u32>(members, 1), kMaxPtrs);
  const u64 c = Min<u32>(Max<u32>(copies, 1), kMaxPtrs);
  const u64 b = Max<u32>(bucket_blocks, 1);
  const u64 record = Transaction::KeyBytes(u32(sizeof(alloc::AllocRecord)));
  const u64 bp = Transaction::KeyBytes(u32(sizeof(BackpointerFormat)));
  const u64 whiteout = Transaction::KeyBytes(0);
  // The punch: n extents at worst, and the two edge pieces set again.
  const u64 punch = n * (whiteout + o * (whiteout + record)) + 2 * (Transaction::KeyBytes(kExtentValueMax) + o * bp);
  // The new extents: a copy's blocks cross at most ceil(n / b) bucket ends.
  const u64 crossings = (n + b - 1) / b;
  const u64 pieces = Min<u64>(n, 1 + c * crossings + (n - 1) / kMaxCompressedBlocks);
  const u32 header = u32(sizeof(ExtentFormat) + c * sizeof(ExtentPtr));
  // (A piece's crcs are in its value: 4 bytes a block, and 8 of padding.)
  const u64 written = pieces * (Transaction::KeyBytes(header) + 8 + c * bp) + 4 * n + c * (crossings + 1) * record;
  // A data check per copy of each piece (QueueDataCheck), the crcs again.
  const u64 checks = c * (pieces * (journal::KeySpace(u32(sizeof(journal::DataCheckFormat))) + 8) + 4 * n);
  // The accounting keys: a set per extent at most, and no more than the
  // sets of 1..kMaxPtrs members there are; the reserved total.
  u64 subsets = 0, choose = 1;
  for (u64 k = 1; k <= kMaxPtrs && k <= Max<u32>(members, 1); k++) {
    choose = choose * (Max<u32>(members, 1) - k + 1) / k;
    subsets += choose;
  }
  const u64 sets = Min<u64>(n + pieces, subsets) + 1;
  const u64 acct = sets * Transaction::KeyBytes(u32(sizeof(alloc::AcctRecord)));
  return usize(punch + written + checks + acct);
}

u32 DataPath::WriteBlocksFitting(const IoContext& ctx, usize reserve) {
  if (store_ == nullptr) return 1;
  btree::Transaction scratch(trees_);
  const usize room = scratch.Room();
  // What the range holds may have a copy on every member; the new extents
  // have the copies ctx wants (on distinct members).
  const u32 members = store_->sb().nr_members;
  const u32 copies = Min(Wanted(ctx), Min<u32>(members, kMaxPtrs));
  const u32 bucket = u32(Min<u64>(bucket_blocks_, ~0u));
  // Largest fitting by bisection (WriteJournalBytes grows with nblocks).
  u32 lo = 1, hi = kWriteBlocksMax;
  while (lo < hi) {
    const u32 mid = lo + (hi - lo + 1) / 2;
    if (WriteJournalBytes(mid, bucket, members, copies) + reserve <= room) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

Status DataPath::QueuePunch(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys,
                            usize reserve, bool* more) {
  if (more != nullptr) *more = false;
  if (store_ == nullptr || end <= first) return store_ == nullptr ? Status(Err::kInvalidArgument) : Status::Ok();
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[kExtentValueMax];
  u32 touched = 0;
  // A batch's bound in journal bytes (review 3b F1): the keys queued so far
  // are in tx->Room(); the bucket records Commit adds for this punch's
  // changes are not yet -- `records` counts them (one per change, but a
  // change of a bucket one of the last few changes named: consecutive
  // extents share buckets). An extent's worst case: both pieces' keys (each
  // at most its value), two backpointer keys per pointer (its own rewritten
  // or deleted, and the back piece's), a record per pointer, an accounting
  // key (its set's; the reserved total's, counted once: `acct` starts at 1).
  const bool batch = max_keys != ~0u;
  const usize record_bytes = btree::Transaction::KeyBytes(u32(sizeof(alloc::AllocRecord)));
  const usize acct_bytes = btree::Transaction::KeyBytes(u32(sizeof(alloc::AcctRecord)));
  const usize first_set = delta->sets.size();
  const usize bp_bytes = btree::Transaction::KeyBytes(u32(sizeof(BackpointerFormat)));
  const usize first_change = delta->changes.size();
  usize records = 0;
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    if (touched == max_keys) {
      if (more != nullptr) *more = true;
      break;
    }
    if (batch && touched > 0) {
      const usize worst =
          2 * btree::Transaction::KeyBytes(it.val_bytes()) + e.nr_ptrs * (2 * bp_bytes + record_bytes) + acct_bytes;
      const usize acct = (delta->sets.size() - first_set + 1) * acct_bytes;
      if (records * record_bytes + acct + worst + reserve > tx->Room()) {
        ctr_.punch_batches_cut.FetchAdd(1, MemOrder::kRelaxed);
        if (more != nullptr) *more = true;
        break;
      }
    }
    touched++;
    const u64 lo = Max(e.start, first);
    const u64 hi = Min(e.end, end);
    // The pieces (parsed back for their backpointers; their crcs, which
    // point into `value`, are not used after).
    const bool has_back = e.end > end, has_front = e.start < first;
    Extent back, front;
    if (has_back) {  // the piece after the range keeps the key
      const u32 len = TFS_TRY(BuildPiece(e, end - e.start, u32(e.end - end), value));
      TFS_TRY(tx->Set(ExtentPos(ino, e.end), value, len));
      TFS_TRY(ParseExtent(ExtentPos(ino, e.end), value, len, &back));
    } else {
      TFS_TRY(tx->Delete(ExtentPos(ino, e.end)));
    }
    if (has_front) {  // the piece before the range: a new key at `first`
      const u32 len = TFS_TRY(BuildPiece(e, 0, u32(first - e.start), value));
      TFS_TRY(tx->Set(ExtentPos(ino, first), value, len));
      TFS_TRY(ParseExtent(ExtentPos(ino, first), value, len, &front));
    }
    // The backpointers (QueueBackpointers): the front piece keeps e's
    // positions (its pointers' blob offsets are e's), so e's are rewritten
    // for it -- or moved to the back piece, or deleted -- and a back piece
    // beside a front one gets new ones.
    TFS_TRY(QueueBackpointers(tx, store_->sb(), &e, has_front ? &front : has_back ? &back : nullptr));
    if (has_front && has_back) TFS_TRY(QueueBackpointers(tx, store_->sb(), nullptr, &back));
    if (e.unwritten) delta->unreserved += hi - lo;
    // Its set's total loses the blocks (a set of none: nothing counted).
    TFS_TRY(delta->AddSet(CountedMembers(store_->sb(), e), -i64(hi - lo) * (kBlockSize / 512)));
    // Each copy releases the blocks in its bucket (live, or cached); a bad
    // pointer or a stale cached one was never counted (PtrCounts).
    for (u32 i = 0; i < e.nr_ptrs; i++) {
      const Extent::Ptr& ptr = e.ptrs[i];
      u64 b;
      if (!PtrCounts(ptr, &b)) continue;
      const i64 n = -i64(hi - lo);
      bool seen = false;  // a record Commit adds for a change before already
      for (usize k = delta->changes.size(); k > first_change && k + 2 * kMaxPtrs > delta->changes.size() && !seen; k--)
        seen = delta->changes[k - 1].dev == ptr.dev && delta->changes[k - 1].bucket == b;
      records += !seen;
      TFS_TRY(delta->changes.PushBack(
          Delta::Change{.dev = ptr.dev, .bucket = b, .blocks = ptr.cached ? 0 : n, .cached = ptr.cached ? n : 0}));
    }
    delta->sectors -= i64(hi - lo) * (kBlockSize / 512);
  }
  return Status::Ok();
}

Status DataPath::QueueReserve(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys,
                              u64* next) {
  *next = first;
  if (store_ == nullptr || end < first) return Err::kInvalidArgument;
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[kUnwrittenValueBytes];  // an unwritten extent's value: the header alone
  u64 at = first;
  u32 keys = 0;
  while (at < end && keys < max_keys) {
    // The next extent at or after `at`: blocks before it are a hole.
    u64 hole_end = end;
    bool covered = false;
    if (it.Valid() && it.pos().inode == ino) {
      Extent e;
      TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
      if (e.start <= at) {
        covered = true;
        at = Min(e.end, end);
        TFS_TRY(it.Next());
      } else {
        hole_end = Min(e.start, end);
      }
    }
    if (covered) continue;
    const u32 n = u32(Min<u64>(hole_end - at, kMaxUnwrittenBlocks));
    {
      MutexLock a(acct_mu_);
      const u64 free = FreeBlocksLocked();
      if (free < reserved_ || free - reserved_ < n) {
        ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
        return Err::kNoSpace;
      }
      reserved_ += n;
    }
    delta->reserved += n;  // counted now, so that Abort returns it whatever fails next
    TFS_TRY(tx->Set(ExtentPos(ino, at + n), value, BuildUnwritten(n, value)));
    delta->sectors += i64(n) * (kBlockSize / 512);
    at += n;
    keys++;
  }
  *next = at;
  return Status::Ok();
}

Status DataPath::FlushMembers(const IoContext& ctx, dev::DevMask mask) {
  for (u32 m : dev::Bits(mask)) {
    TFS_TRY(ContextIo(ctx, store_->devs().member(m)->queue(), IoOp::kFlush, 0, nullptr, 0));
    ctr_.slow_member_flushes.FetchAdd(1, MemOrder::kRelaxed);
  }
  return Status::Ok();
}

Status DataPath::FlushSlowMembers(const IoContext& ctx, Delta* delta) {
  const dev::DevMask slow = delta->deps & ~journal_members_;
  TFS_TRY(FlushMembers(ctx, slow));
  delta->deps &= ~slow;  // durable now: the commit depends on journal members only
  return Status::Ok();
}

Status DataPath::Commit(const IoContext& ctx, btree::Transaction* tx, const Delta& delta, journal::CommitMode mode) {
  // Data on members without a journal, if the caller did not flush it
  // already (FlushSlowMembers).
  const dev::DevMask slow = delta.deps & ~journal_members_;
  Status fst = FlushMembers(ctx, slow);
  if (!fst.ok()) {
    Abort(delta);
    return fst;
  }
  // The records of the buckets whose counts move, computed by the commit
  // hook in journal order (account.cc).
  CommitCounts cc;
  Status qst = QueueCounts(tx, delta, &cc);
  if (!qst.ok()) {
    tx->Reset();
    Abort(delta);
    return qst;
  }
  // Readers of this inode's extents see the commit whole or not at all (see
  // ReadBlocks): its stripe's counter is odd while the keys are applied.
  tx->SetApplySeq(&applying_[CommitStripe(delta.ino)]);
  // (The members whose flush the journal may lose: every extent there has
  // another copy, whose checksums a read verifies: 5c-3.)
  auto r = tx->Commit(mode, delta.deps & ~slow, delta.deps & ~slow & ~delta.sole);
  store_->alloc().LogCountNote(cc.note, cc.published);  // (out of commit_mu)
  if (!r.ok() && !cc.published) {  // nothing published: as if never committed
    Abort(delta);
    DropHolds(&cc);
    return r.status();
  }
  // Published -- also when an apply failed after the journal took the entry
  // (the trees are failed then: no frees, the next mount makes them).
  if (r.ok()) TestPoint("commit.applying");
  Apply(delta, &cc, r.ok());
  return r.status();
}

}  // namespace tfs::data
