// The write buffer (fs.h; docs/design/posix.md "The write buffer"): per open
// regular file one run of contiguous dirty blocks (Buffered, up to
// kBufferBlocks), filled by small writes (WriteBuffered) and written out as
// one extent (FlushRun) when a write does not fit it, at close (FlushBuffer),
// by Fsync, by the flusher thread once it is buffer_age_ms old (FlushAged),
// and under memory pressure (the shrinker's AskShrink asks the flusher, whose
// ShrinkBuffers writes runs out and frees their buffers).
//
// A run changes only under its inode's exclusive data lock and, for the
// bytes readers see, the stripe's open_mu_; readers copy it under open_mu_
// alone. open_mu_ is never held across I/O, a commit or another lock. The
// shrinker's callbacks (BufferPages, AskShrink) take no lock, do no I/O and
// allocate nothing (platform.h's rules): they read a counter and wake the
// flusher.
#include "posix/fs.h"

#include "posix/internal.h"

namespace tfs::posix {

Filesystem::Buffered* Filesystem::FindBuffer(u64 ino, bool create) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (OpenCount& o : open_[s]) {
    if (o.ino != ino) continue;
    if (o.buf != nullptr || !create) return o.buf;
    if (buffers_.FetchAdd(1, MemOrder::kRelaxed) >= opt_.write_buffers) {
      buffers_.FetchSub(1, MemOrder::kRelaxed);
      return nullptr;  // all in use: write through
    }
    Buffered* b = platform::New<Buffered>();
    u8* data = static_cast<u8*>(platform::Alloc(u64(kBufferBlocks) * kBlock, kBlock));
    if (b == nullptr || data == nullptr) {
      platform::Delete(b);
      platform::Free(data);
      buffers_.FetchSub(1, MemOrder::kRelaxed);
      return nullptr;
    }
    b->data = data;
    b->gen = buf_gen_.FetchAdd(1, MemOrder::kRelaxed);
    o.buf = b;
    return b;
  }
  return nullptr;  // not open (a caller without a handle): write through
}

bool Filesystem::MayBuffer(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s])
    if (o.ino == ino) return o.buf != nullptr || buffers_.Load(MemOrder::kRelaxed) < opt_.write_buffers;
  return false;
}

void Filesystem::FreeBuffer(Buffered* b) {
  if (b == nullptr) return;
  if (b->blocks > 0) ctr_.buffers_dropped.FetchAdd(1, MemOrder::kRelaxed);
  platform::Free(b->data);
  platform::Delete(b);
  buffers_.FetchSub(1, MemOrder::kRelaxed);
}

bool Filesystem::Buffering(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s])
    if (o.ino == ino) return o.buf != nullptr && o.buf->blocks > 0;
  return false;
}

Status Filesystem::FlushRun(u64 ino, Buffered* b, FlushCause cause) {
  if (b == nullptr || b->blocks == 0) return Status::Ok();
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  // Fsync flushes the journal right after: the writer thread need not wake.
  if (st.ok())
    st = CommitBlocks(ino, f, b->first, b->data, b->blocks, WriteChunk(f), b->size, b->mtime_ns,
                      cause == kFlushFsync ? journal::CommitMode::kFlushNext : journal::CommitMode::kNoFlush);
  if (!st.ok()) {  // the run stays (even a part committed: the same bytes), for the next flush to try again
    ctr_.flush_errors.FetchAdd(1, MemOrder::kRelaxed);
    return st;
  }
  Bump(cause == kFlushFull    ? ctr_.flushes_full
       : cause == kFlushClose ? ctr_.flushes_close
       : cause == kFlushFsync ? ctr_.flushes_fsync
       : cause == kFlushAge   ? ctr_.flushes_age
       : cause == kFlushPressure ? ctr_.flushes_pressure
                              : ctr_.flushes_other);
  ctr_.bytes_flushed.FetchAdd(u64(b->blocks) * kBlock, MemOrder::kRelaxed);
  SharedLock l(open_mu_[Stripe(ino)]);
  b->blocks = 0;
  b->gen = buf_gen_.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

Status Filesystem::FlushBuffer(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  // Nothing buffered (the common close): no lock at all, so a close never
  // waits for another writer of the file -- one stuck in a stalled HDD's
  // write, say. A write that returned before this close began is in the run.
  {
    const u32 s = Stripe(ino);
    SharedLock l(open_mu_[s]);
    bool buffered = false;
    for (const OpenCount& o : open_[s]) buffered |= o.ino == ino && o.buf != nullptr && o.buf->blocks > 0;
    if (!buffered) {
      ctr_.closes_unbuffered.FetchAdd(1, MemOrder::kRelaxed);
      return Status::Ok();
    }
  }
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  return FlushRun(ino, FindBuffer(ino, false), kFlushClose);
}

Status Filesystem::Fsync(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  {
    DataGuard data(this, ino, true);
    TFS_TRY(data.status());
    TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushFsync));
  }
  return store_->journal().Flush();
}

void Filesystem::OverlayBuffered(u64 ino, Attr* a) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s]) {
    if (o.ino != ino || o.buf == nullptr || o.buf->blocks == 0) continue;
    a->size = Max(a->size, o.buf->size);
    a->mtime_ns = a->ctime_ns = o.buf->mtime_ns;
    a->sectors += u64(o.buf->blocks) * (kBlock / 512);  // at most: some may replace blocks
  }
}

void Filesystem::FlusherMain(void* self) {
  Filesystem* fs = static_cast<Filesystem*>(self);
  const u64 period = Max<u64>(u64(fs->opt_.buffer_age_ms) * 1000000 / 4, 1000000);
  for (;;) {
    // The kick is read before the checks: a stop or a shrinker's ask after
    // them changes it, and the wait returns at once (no lost wake-up; the
    // shrinker may not take a lock to signal).
    const u32 kick = fs->flusher_kick_.Load(MemOrder::kAcquire);
    if (fs->flusher_stop_.Load(MemOrder::kAcquire)) break;
    if (fs->shrink_pages_.Load(MemOrder::kAcquire) == 0) (void)tfs_plat_wait(fs->flusher_kick_.Address(), kick, period);
    if (fs->flusher_stop_.Load(MemOrder::kAcquire)) break;
    const u64 shrink = fs->shrink_pages_.Exchange(0, MemOrder::kAcqRel);
    if (shrink > 0) (void)fs->ShrinkBuffers(shrink);
    fs->FlushAged();
  }
}

void Filesystem::KickFlusher() {
  flusher_kick_.FetchAdd(1, MemOrder::kAcqRel);
  tfs_plat_wake(flusher_kick_.Address(), 0);
}

void Filesystem::StopFlusher() {
  shrinker_.Unregister();  // (returns once no call of it runs: none asks the flusher after this)
  if (!flusher_.running()) return;
  flusher_stop_.Store(true, MemOrder::kRelease);
  KickFlusher();
  flusher_.Join();
}

u64 Filesystem::BufferPages(void* self) {
  const Filesystem* fs = static_cast<const Filesystem*>(self);
  return u64(fs->buffers_.Load(MemOrder::kRelaxed)) * (u64(kBufferBlocks) * kBlock / platform::kShrinkPage);
}

u64 Filesystem::AskShrink(void* self, u64 pages) {
  Filesystem* fs = static_cast<Filesystem*>(self);
  // The largest ask not yet served, not their sum: a look that finds the
  // buffers not yet freed asks again for the same pages.
  u64 cur = fs->shrink_pages_.Load(MemOrder::kAcquire);
  while (cur < pages && !fs->shrink_pages_.CompareExchange(cur, pages, MemOrder::kAcqRel)) {
  }
  fs->KickFlusher();
  return 0;  // (freed by the flusher, not here: the next count shows it)
}

u64 Filesystem::ShrinkBuffers(u64 pages) {
  constexpr u64 kPagesPerBuffer = u64(kBufferBlocks) * kBlock / platform::kShrinkPage;
  u64 freed = 0;
  for (u32 s = 0; s < kStripes && freed < pages; s++) {
    u64 inos[16];
    u32 n = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (n < 16 && o.buf != nullptr) inos[n++] = o.ino;
    }
    for (u32 i = 0; i < n && freed < pages; i++) {
      // Under the inode's data lock, exclusive: no write or read of it uses
      // the buffer meanwhile. A run that does not go out keeps its buffer.
      DataGuard data(this, inos[i], true);
      if (!data.status().ok()) continue;
      Buffered* b = FindBuffer(inos[i], false);
      if (b == nullptr) continue;
      if (b->blocks > 0) {
        Status st = FlushRun(inos[i], b, kFlushPressure);
        if (!st.ok()) {
          platform::Log(platform::LogLevel::kError, "posix: writing out buffered data of inode %llu: %s",
                        (unsigned long long)inos[i], st.Message());
          continue;
        }
      }
      {
        SharedLock l(open_mu_[s]);
        b = nullptr;
        for (OpenCount& o : open_[s])
          if (o.ino == inos[i] && o.buf != nullptr && o.buf->blocks == 0) {
            b = o.buf;
            o.buf = nullptr;
          }
      }
      if (b == nullptr) continue;
      FreeBuffer(b);
      ctr_.buffers_shrunk.FetchAdd(1, MemOrder::kRelaxed);
      freed += kPagesPerBuffer;
    }
  }
  return freed;
}

void Filesystem::FlushAged() {
  const u64 now = platform::NowNs();
  const u64 age = u64(opt_.buffer_age_ms) * 1000000;
  for (u32 s = 0; s < kStripes; s++) {
    u64 inos[16];
    u32 n = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (n < 16 && o.buf != nullptr && o.buf->blocks > 0 && now - o.buf->since_ns >= age) inos[n++] = o.ino;
    }
    for (u32 i = 0; i < n; i++) {
      DataGuard data(this, inos[i], true);
      if (!data.status().ok()) continue;  // out of memory: at the next round
      Buffered* b = FindBuffer(inos[i], false);  // (the last Release takes the data lock too)
      if (b == nullptr || b->blocks == 0 || now - b->since_ns < age) continue;
      Status st = FlushRun(inos[i], b, kFlushAge);
      if (!st.ok())
        platform::Log(platform::LogLevel::kError, "posix: writing out buffered data of inode %llu: %s",
                      (unsigned long long)inos[i], st.Message());
    }
  }
}

Result<u32> Filesystem::WriteBuffered(u64 ino, InodeFormat* f, Buffered* b, u64 off, const u8* buf, u32 len) {
  const u64 b0 = off / kBlock;
  const u64 b1 = (off + len + kBlock - 1) / kBlock;
  // The run takes writes that start inside it or right after it and end
  // within its capacity; anything else writes it out first.
  if (b->blocks > 0 && (b0 < b->first || b0 > b->first + b->blocks || b1 > b->first + kBufferBlocks)) {
    TFS_TRY(FlushRun(ino, b, kFlushFull));
    TFS_TRY(ReadInode(ino, f));  // its new size
  }
  const u64 first = b->blocks > 0 ? b->first : b0;
  const u64 have_end = first + b->blocks;
  // Blocks new to the run that the write covers in part keep their other
  // bytes: read them (zeros past the end of the file) before taking the lock.
  u64 edge_block[2] = {~u64(0), ~u64(0)};
  const u64 size_blocks = (f->size.get() + kBlock - 1) / kBlock;
  const u64 new_from = Max(b0, have_end);
  const u64 partial[2] = {off % kBlock != 0 ? b0 : ~u64(0), (off + len) % kBlock != 0 ? b1 - 1 : ~u64(0)};
  u8* edge = nullptr;  // two blocks
  for (u32 i = 0; i < 2; i++) {
    const u64 blk = partial[i];
    if (blk == ~u64(0) || blk < new_from || blk == edge_block[0]) continue;
    if (edge == nullptr && (edge = static_cast<u8*>(platform::Alloc(2 * kBlock, kBlock))) == nullptr)
      return Err::kNoMemory;
    Status st = blk < size_blocks ? data_->ReadBlocks(data::kForegroundRead, ino, blk, 1, edge + i * kBlock)
                                  : Status::Ok();
    if (!st.ok()) {
      platform::Free(edge);
      return st;
    }
    if (blk >= size_blocks) MemSet(edge + i * kBlock, 0, kBlock);
    edge_block[i] = blk;
  }
  const i64 now = Now();
  SharedLock l(open_mu_[Stripe(ino)]);
  if (b->blocks == 0) {
    b->first = b0;
    b->size = f->size.get();
    b->since_ns = platform::NowNs();
  }
  for (u64 blk = new_from; blk < b1; blk++) {
    u8* slot = b->data + (blk - b->first) * kBlock;
    if (blk == edge_block[0]) {
      MemCopy(slot, edge, kBlock);
    } else if (blk == edge_block[1]) {
      MemCopy(slot, edge + kBlock, kBlock);
    } else {
      MemSet(slot, 0, kBlock);  // the write covers it whole
    }
  }
  platform::Free(edge);
  MemCopy(b->data + (off - b->first * kBlock), buf, len);
  b->blocks = u32(Max<u64>(b->first + b->blocks, b1) - b->first);
  b->size = Max(b->size, off + len);
  b->mtime_ns = now;
  ctr_.writes_buffered.FetchAdd(1, MemOrder::kRelaxed);
  return len;
}

}  // namespace tfs::posix
