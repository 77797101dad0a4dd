// File data (fs.h): Read, Write (with its privilege removal, DropPrivs),
// WriteThrough, Seek (SEEK_DATA, SEEK_HOLE), Fallocate, and truncation --
// SetAttrs, whose size change is its hard part, with PunchPast -- and
// CommitData, the commit of prepared data the write buffer uses too.
//
// Locking. A regular file's data and size are guarded by its data lock
// (DataGuard, taken before its inode lock): exclusive for what reads, merges
// and rewrites blocks, shrinks the file or touches its write buffer; shared
// for whole-block writes with no buffered run (several may run at once, as
// O_DIRECT writes do on ext4). Device I/O happens under the data lock only:
// DataPath::Prepare writes the blobs, and the inode lock is taken just to
// commit them (CommitData). Both locks are the inode's own (fs.h, the
// slow-member rule): a write stuck in a stalled HDD holds up only its file.
// No table mutex is held across I/O or a commit (DebugNoSharedLock).
#include "posix/fs.h"

#include "posix/internal.h"
#include "posix/opts.h"

namespace tfs::posix {

using btree::Transaction;

namespace {

constexpr u64 kMaxFileSize = u64(1) << 50;  // bytes (EFBIG beyond)
}  // namespace

// --- SetAttrs: truncation, and the other attributes with it ------------------

Result<Attr> Filesystem::SetAttrs(u64 ino, const SetAttr& set) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const u32 type = f.mode.get() & kModeTypeMask;
  if ((set.valid & kSetSize) != 0) {
    if (type == kModeDir) return Err::kIsDir;
    if (type != kModeReg) return Err::kInvalidArgument;
    if (set.size > kMaxFileSize) return Err::kTooBig;
  }
  // A regular file's data changes (truncate), and its buffered writes go out
  // first so that sizes and times stay in order: under its data lock, with
  // the I/O (a new last block with zeros past the size) before the inode lock.
  const bool data = type == kModeReg && ((set.valid & kSetSize) != 0 || Buffering(ino));
  DataGuard data_lock(this, data ? ino : 0, true);
  TFS_TRY(data_lock.status());
  data::Prepared* tail = nullptr;
  data::Delta tail_delta;
  Status st = [&]() -> Status {
    if (!data) return Status::Ok();
    TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
    TFS_TRY(ReadInode(ino, &f));
    if ((set.valid & kSetSize) != 0 && set.size < f.size.get() && set.size % kBlock != 0)
      TFS_TRY(PrepareZero(ino, set.size / kBlock, u32(set.size % kBlock), kBlock, &tail, &tail_delta));
    return Status::Ok();
  }();
  if (st.ok()) {
    const u64 lock[1] = {ino};
    Locked locked(this, lock, 1);
    st = locked.status();
    if (st.ok()) st = ReadInode(ino, &f);
    const i64 now = Now();
    bool shrink = false;  // a size is set and does not grow: blocks past it go
    u64 punch_from = 0;   // ... from this block on
    usize reserve = 0;    // ... and the last batch keeps this much room (PunchPast)
    if (st.ok()) {
      if ((set.valid & kSetMode) != 0) f.mode.set(type | (set.mode & kModePermMask));
      if ((set.valid & kSetUid) != 0) f.uid.set(set.uid);
      if ((set.valid & kSetGid) != 0) f.gid.set(set.gid);
      if ((set.valid & kSetSize) != 0) {
        // Not growing frees blocks past the size even if it stays (fallocated
        // with KEEP_SIZE), as ext4 does.
        if (set.size != f.size.get()) SetTime(&f.mtime_ns, now);
        shrink = set.size <= f.size.get();
        // From the partial last block if it is rewritten below, else the
        // first block past the size: PunchPast and the final punch agree.
        punch_from = tail != nullptr ? set.size / kBlock : (set.size + kBlock - 1) / kBlock;
        if (shrink) {
          // Room kept in the last batch's transaction for the rest of it:
          // the tail block and its records, and the inode.
          reserve = Transaction::KeyBytes(u32(sizeof(f)));
          if (tail != nullptr) {
            auto tb = data_->PreparedJournalBytes(*tail, tail_delta);
            st = tb.status();
            if (st.ok()) reserve += tb.value();
          }
          if (st.ok()) st = PunchPast(ino, &f, punch_from, reserve);
        }
        f.size.set(set.size);
      }
    }
    if (st.ok()) {
      if ((set.valid & kSetAtime) != 0) SetTime(&f.atime_ns, set.atime_ns);
      if ((set.valid & kSetAtimeNow) != 0) SetTime(&f.atime_ns, now);
      if ((set.valid & kSetMtime) != 0) SetTime(&f.mtime_ns, set.mtime_ns);
      if ((set.valid & kSetMtimeNow) != 0) SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      Transaction tx(trees_);
      // One transaction: the last batch of the punch past the size (PunchPast
      // committed any before), from the partial last block on if there is
      // one, that block again with zeros past the size, and the inode. (Both
      // punches computed against the tree before it would overlap.)
      if (shrink) {
        bool more = false;
        st = data_->QueuePunch(&tx, ino, punch_from, ~u64(0), &tail_delta, kBatchExtents, reserve, &more);
        // (PunchPast left what this batch takes, by the same bound: never.)
        if (st.ok() && more) st = Err::kTooBig;
        if (st.ok() && tail != nullptr) st = data_->QueuePreparedOverPunch(&tx, *tail, ExtentPolicy(f));
      } else if (tail != nullptr) {
        st = data_->QueuePrepared(&tx, *tail, ExtentPolicy(f), &tail_delta);
      }
      if (st.ok()) {
        f.sectors.set(u64(i64(f.sectors.get()) + tail_delta.sectors));
        st = tx.Set(InodePos(ino), &f, sizeof(f));
      }
      if (st.ok()) {
        DebugNoSharedLock();
        st = data_->Commit(data::kForegroundWrite, &tx, tail_delta);
        tail_delta = data::Delta{};  // applied or aborted
      }
    }
  }
  data_->Abort(tail_delta);  // (nothing left if it was committed)
  platform::Delete(tail);
  TFS_TRY(st);
  ctr_.setattrs.FetchAdd(1, MemOrder::kRelaxed);
  return ToAttr(ino, f);
}

Status Filesystem::CommitData(u64 ino, const data::Prepared* p, data::Delta* delta, u64 min_size, i64 mtime,
                              journal::CommitMode mode) {
  // An HDD's flush before the inode lock: opens and stats of this file do not
  // wait for it.
  DebugNoSharedLock();
  Status fst = data_->FlushSlowMembers(data::kForegroundWrite, delta);
  if (!fst.ok()) {
    data_->Abort(*delta);
    return fst;
  }
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  InodeFormat f;
  Transaction tx(trees_);
  Status st = locked.status();
  if (st.ok()) st = ReadInode(ino, &f);
  if (st.ok() && p != nullptr) st = data_->QueuePrepared(&tx, *p, ExtentPolicy(f), delta);
  if (st.ok()) {
    f.size.set(Max(f.size.get(), min_size));
    f.sectors.set(u64(i64(f.sectors.get()) + delta->sectors));
    if (mtime != 0) {
      SetTime(&f.mtime_ns, mtime);
      SetTime(&f.ctime_ns, mtime);
    }
    st = tx.Set(InodePos(ino), &f, sizeof(f));
  }
  if (!st.ok()) {
    data_->Abort(*delta);  // failed before the commit
    return st;
  }
  DebugNoSharedLock();
  return data_->Commit(data::kForegroundWrite, &tx, *delta, mode);
}

u32 Filesystem::WriteChunk(const InodeFormat& f) {
  const u32 forced = write_chunk_for_test_.Load(MemOrder::kRelaxed);
  if (forced != 0) return forced;
  return data_->WriteBlocksFitting(WriteContext(f), Transaction::KeyBytes(u32(sizeof(InodeFormat))));
}

Result<u32> Filesystem::WriteChunkOf(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  return WriteChunk(f);
}

Status Filesystem::CommitBlocks(u64 ino, const InodeFormat& f, u64 first, const u8* blocks, u32 nb, u32 chunk,
                                u64 size, i64 mtime, journal::CommitMode mode) {
  data::Prepared* p = platform::New<data::Prepared>();
  if (p == nullptr) return Err::kNoMemory;
  Status st = Status::Ok();
  for (u32 done = 0; st.ok() && done < nb;) {
    const u32 n = Min(chunk, nb - done);
    data::Delta delta;
    DebugNoSharedLock();
    st = data_->Prepare(WriteContext(f), ino, first + done, blocks + u64(done) * kBlock, n, Compress(f), p, &delta);
    if (!st.ok()) {
      data_->Abort(delta);
      break;
    }
    st = CommitData(ino, p, &delta, Min(size, (first + done + n) * kBlock), mtime, mode);
    if (st.code() == Err::kTooBig && n > 1) {
      // The entry cannot hold it (CommitData aborted the delta: the blocks
      // written go back): the same blocks again, half as many at a time.
      ctr_.write_splits.FetchAdd(1, MemOrder::kRelaxed);
      chunk = (n + 1) / 2;
      st = Status::Ok();
      continue;
    }
    if (st.code() == Err::kTooBig) {
      // One block cannot: no fault of the file's size (EFBIG would say so).
      platform::Log(platform::LogLevel::kError, "posix: a one-block write of inode %llu does not fit a journal entry",
                    static_cast<unsigned long long>(ino));
      st = Err::kIo;
    }
    done += n;
  }
  platform::Delete(p);
  return st;
}

Status Filesystem::PrepareZero(u64 ino, u64 block, u32 from, u32 to, data::Prepared** out, data::Delta* delta) {
  *out = nullptr;
  auto mapped = data_->HasBlockData(ino, block);
  TFS_TRY(mapped.status());
  if (!mapped.value()) return Status::Ok();  // a hole or unwritten block reads as zeros already
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  u8* buf = static_cast<u8*>(platform::Alloc(kBlock, kBlock));
  data::Prepared* p = platform::New<data::Prepared>();
  Status st = buf == nullptr || p == nullptr ? Status(Err::kNoMemory)
                                             : data_->ReadBlocks(data::kForegroundRead, ino, block, 1, buf);
  if (st.ok()) {
    MemSet(buf + from, 0, to - from);
    DebugNoSharedLock();
    st = data_->Prepare(WriteContext(f), ino, block, buf, 1, Compress(f), p, delta);
  }
  platform::Free(buf);
  if (!st.ok()) {  // (the caller aborts the delta)
    platform::Delete(p);
    return st;
  }
  *out = p;
  return Status::Ok();
}

Status Filesystem::ZeroInBlock(u64 ino, u64 block, u32 from, u32 to, i64 mtime) {
  data::Prepared* p;
  data::Delta delta;
  Status st = PrepareZero(ino, block, from, to, &p, &delta);
  if (!st.ok()) {
    data_->Abort(delta);
    return st;
  }
  if (p == nullptr) return Status::Ok();
  st = CommitData(ino, p, &delta, 0, mtime);
  platform::Delete(p);
  return st;
}

Result<u32> Filesystem::Write(u64 ino, u64 off, const void* buf, u32 len, u32 flags, Writer* writer) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return Err::kTooBig;
  if (len == 0) return u32(0);
  TFS_TRY(MetadataRoom());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
  // The VFS's file_remove_privs, before the data, for buffered and direct
  // writes alike. A write of a file with neither setid bits nor
  // security.capability pays two bit tests here: nothing is read, locked,
  // committed or asked of the front end.
  if ((flags & kWritePrivsRemoved) == 0 &&
      (SetidWriteDrops(f.mode.get()) != 0 || (f.flags.get() & kInodeFlagCaps) != 0))
    TFS_TRY(DropPrivs(ino, f, writer));
  const u8* in = static_cast<const u8*>(buf);
  const u64 nb = (off + len + kBlock - 1) / kBlock - off / kBlock;
  if ((flags & kWriteDirect) == 0 && nb <= kBufferBlocks / 2 && MayBuffer(ino)) {
    // The buffer is found under the data lock: the memory-pressure shrinker
    // (ShrinkBuffers) frees an open file's buffer under it. (MayBuffer keeps
    // writes that cannot be buffered off the exclusive lock.)
    DataGuard data(this, ino, true);
    TFS_TRY(data.status());
    Buffered* b = FindBuffer(ino, true);
    if (b != nullptr) {
      TFS_TRY(ReadInode(ino, &f));  // the size, now stable
      return WriteBuffered(ino, &f, b, off, in, len);
    }
  }
  // Whole blocks and nothing buffered: the shared data lock (the blocks are
  // replaced, not merged).
  if (off % kBlock == 0 && len % kBlock == 0) {
    DataGuard data(this, ino, false);
    TFS_TRY(data.status());
    if (!Buffering(ino)) {
      ctr_.writes_direct.FetchAdd(1, MemOrder::kRelaxed);
      return WriteThrough(ino, f, off, in, len);  // (f's size is not used for whole blocks)
    }
  }
  // Straight through, after whatever is buffered (so the order holds).
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  TFS_TRY(ReadInode(ino, &f));  // the size, now stable
  ctr_.writes_direct.FetchAdd(1, MemOrder::kRelaxed);
  return WriteThrough(ino, f, off, in, len);
}

u32 Filesystem::SetidWriteDrops(u32 mode) {
  u32 drop = mode & kModeSetuid;
  // Setgid without group execute marks mandatory locking, not a privilege
  // (Linux 6.1's should_remove_suid; 6.2 and later also drop it when the
  // writer is not in the file's group and lacks CAP_FSETID).
  if ((mode & kModeSetgid) != 0 && (mode & 0010) != 0) drop |= kModeSetgid;
  return drop;
}

Status Filesystem::DropPrivs(u64 ino, const InodeFormat& seen, Writer* writer) {
  // The capability question first, outside the lock (a front end answers it
  // with a syscall), and only when there are setid bits to take: the bits
  // the writer would lose as the inode was seen. A chmod racing the write
  // orders before or after it either way (the VFS holds the inode lock
  // across both; the outcome is one of the two orders here too).
  u32 drop = SetidWriteDrops(seen.mode.get());
  if (drop != 0 && writer != nullptr && writer->may_keep_setid != nullptr &&
      writer->may_keep_setid(writer->ctx))
    drop = 0;
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  drop &= f.mode.get();
  const bool caps = (f.flags.get() & kInodeFlagCaps) != 0;
  if (drop == 0 && !caps) return Status::Ok();  // gone meanwhile, or kept
  Transaction tx(trees_);
  if (caps) {
    const NameTable t = XattrTable(ino, f);
    Entry e;
    XattrChunksFormat chunks;
    TFS_TRY(FindEntry(trees_, t, kXattrCaps, kXattrCapsLen, &e, &chunks));
    if (e.found) TFS_TRY(QueueRemoveXattr(&tx, t, e, chunks));
    f.flags.set(u16(f.flags.get() & ~kInodeFlagCaps));
  }
  f.mode.set(f.mode.get() & ~drop);
  SetTime(&f.ctime_ns, Now());
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  TFS_TRY(tx.Commit(journal::CommitMode::kNoFlush).status());
  if (writer != nullptr) writer->dropped = true;
  return Status::Ok();
}

Result<u32> Filesystem::WriteThrough(u64 ino, InodeFormat f, u64 off, const u8* buf, u32 len) {
  // Block-aligned, so that the blobs go to the device without another copy.
  const u64 span = (off + len + kBlock - 1) / kBlock - off / kBlock;
  const u32 chunk = WriteChunk(f);
  u8* blocks = static_cast<u8*>(platform::Alloc(Min<u64>(span, chunk + 1) * kBlock, kBlock));
  Status st = blocks == nullptr ? Status(Err::kNoMemory) : Status::Ok();
  for (u32 done = 0; st.ok() && done < len;) {
    const u64 pos = off + done;
    const u64 b0 = pos / kBlock;
    const u32 skip = u32(pos % kBlock);
    const u32 n = u32(Min<u64>(len - done, u64(chunk) * kBlock - skip));
    const u64 b1 = (pos + n + kBlock - 1) / kBlock;
    const u32 nb = u32(b1 - b0);
    // Blocks the write covers only in part keep their other bytes (zeros past
    // the end of the file: the tail of its last block is always zero). Only
    // an exclusive data lock holder gets here with such blocks.
    const u64 size_blocks = (f.size.get() + kBlock - 1) / kBlock;
    auto complete = [&](u64 blk, u8* at) {
      if (blk < size_blocks) return data_->ReadBlocks(data::kForegroundRead, ino, blk, 1, at);
      MemSet(at, 0, kBlock);
      return Status::Ok();
    };
    if (skip != 0) st = complete(b0, blocks);
    if (st.ok() && (pos + n) % kBlock != 0 && !(nb == 1 && skip != 0))
      st = complete(b1 - 1, blocks + u64(nb - 1) * kBlock);
    if (!st.ok()) break;
    MemCopy(blocks + skip, buf + done, n);
    st = CommitBlocks(ino, f, b0, blocks, nb, chunk, pos + n, Now(), journal::CommitMode::kNoFlush);
    f.size.set(Max(f.size.get(), pos + n));
    done += n;
  }
  platform::Free(blocks);
  TFS_TRY(st);
  return len;
}

Result<u64> Filesystem::Seek(u64 ino, i64 offset, bool data) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  // The data lock keeps new buffered writes out while the extents are read.
  DataGuard g(this, ino, true);
  TFS_TRY(g.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
  const u64 size = f.size.get();
  if (offset < 0 || u64(offset) >= size) return Err::kNoSuchOffset;  // (ext4's answers)
  const u64 off = u64(offset);
  const u64 block = TFS_TRY(data_->SeekBlock(ino, off / kBlock, data));
  if (data) {
    if (block == data::DataPath::kNoBlock || block * kBlock >= size) return Err::kNoSuchOffset;
    return Max(off, block * kBlock);
  }
  return Min(size, Max(off, block * kBlock));
}

Result<u32> Filesystem::Read(u64 ino, u64 off, void* buf, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  const u32 s = Stripe(ino);
  for (;;) {
    // A buffered run is newer than the extents: note it first, read the
    // extents, then lay the run over them -- unless it was written out in
    // between (the extents read may predate that commit): then again. The
    // inode (its size) is read after the note: a run written out before it
    // has committed its size (FlushRun empties the buffer after the commit),
    // so a note of an empty buffer never pairs with a size from before.
    u64 size = 0;
    const Buffered* b = nullptr;
    u64 gen = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (o.ino == ino && o.buf != nullptr && o.buf->blocks > 0) {
          b = o.buf;
          gen = b->gen;
          size = b->size;
        }
    }
    InodeFormat f;
    TFS_TRY(ReadInode(ino, &f));
    if (IsDir(f)) return Err::kIsDir;
    if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
    size = Max(size, f.size.get());
    if (off >= size || len == 0) return u32(0);
    const u32 n = u32(Min<u64>(len, size - off));
    const u64 b0 = off / kBlock;
    const u64 b1 = (off + n + kBlock - 1) / kBlock;
    u8* blocks = static_cast<u8*>(platform::Alloc((b1 - b0) * kBlock, kBlock));  // (read into directly)
    if (blocks == nullptr) return Err::kNoMemory;
    Status st = data_->ReadBlocks(data::kForegroundRead, ino, b0, u32(b1 - b0), blocks);
    bool again = false;
    if (st.ok() && b != nullptr) {
      SharedLock l(open_mu_[s]);
      // The same buffer (generations are unique) holding the same run?
      again = true;
      for (const OpenCount& o : open_[s])
        if (o.ino == ino && o.buf == b && b->gen == gen) again = false;
      // (Only then is b still a buffer: the shrinker frees an open file's
      // buffer, under open_mu_.)
      const u64 lo = again ? 0 : Max(b0, b->first);
      const u64 hi = again ? 0 : Min(b1, b->first + b->blocks);
      if (lo < hi) MemCopy(blocks + (lo - b0) * kBlock, b->data + (lo - b->first) * kBlock, (hi - lo) * kBlock);
    }
    if (st.ok() && !again) MemCopy(buf, blocks + off % kBlock, n);
    platform::Free(blocks);
    TFS_TRY(st);
    if (!again) return n;
  }
}

Status Filesystem::PunchPast(u64 ino, InodeFormat* f, u64 keep, usize reserve) {
  // A batch of extents per transaction, all but the last: the caller queues
  // that one into the transaction that sets the size (QueuePunch from the
  // same block `keep`, with the same bounds), so a truncate of one batch is
  // one transaction. A batch is kBatchExtents extents, or fewer when their
  // keys and records would not leave `reserve` bytes of the journal entry.
  // A crash between the batches of a longer one leaves holes in what was
  // being truncated away. The caller commits *f.
  for (;;) {
    Transaction tx(trees_);
    data::Delta delta;
    bool more = false;
    TFS_TRY(data_->QueuePunch(&tx, ino, keep, ~u64(0), &delta, kBatchExtents, reserve, &more));
    if (!more) {
      data_->Abort(delta);  // the caller's batch (a punch reserved nothing: this releases nothing)
      return Status::Ok();
    }
    f->sectors.set(u64(i64(f->sectors.get()) + delta.sectors));
    TFS_TRY(tx.Set(InodePos(ino), f, sizeof(*f)));
    DebugNoSharedLock();
    TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
  }
}

Status Filesystem::Fallocate(u64 ino, u32 mode, u64 off, u64 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if ((mode & ~u32(kFallocKeepSize | kFallocPunchHole | kFallocZeroRange)) != 0) return Err::kNotSupported;
  const bool punch = (mode & kFallocPunchHole) != 0;
  const bool zero = (mode & kFallocZeroRange) != 0;
  const bool keep = (mode & kFallocKeepSize) != 0;
  if (!punch) TFS_TRY(MetadataRoom());
  // As vfs_fallocate: punching keeps the size and excludes zeroing.
  if ((punch && zero) || (punch && !keep)) return Err::kNotSupported;
  if (len == 0) return Err::kInvalidArgument;
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return Err::kTooBig;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kNoDevice;
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  TFS_TRY(ReadInode(ino, &f));
  const u64 end = off + len;
  const i64 now = Now();
  if (punch || zero) {
    // Bytes of the range in blocks it covers only in part become zeros (their
    // I/O first, under the data lock alone); the whole blocks inside it are
    // freed.
    const u64 size_blocks = (f.size.get() + kBlock - 1) / kBlock;
    const u64 first_whole = (off + kBlock - 1) / kBlock;
    const u64 end_whole = end / kBlock;
    if (off / kBlock == (end - 1) / kBlock && (off % kBlock != 0 || end % kBlock != 0)) {
      if (off / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, off / kBlock, u32(off % kBlock), u32((end - 1) % kBlock) + 1, now));
    } else {
      if (off % kBlock != 0 && off / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, off / kBlock, u32(off % kBlock), kBlock, now));
      if (end % kBlock != 0 && end / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, end / kBlock, 0, u32(end % kBlock), now));
    }
    for (bool more = first_whole < end_whole; more;) {
      const u64 lock[1] = {ino};
      Locked locked(this, lock, 1);
      TFS_TRY(locked.status());
      TFS_TRY(ReadInode(ino, &f));
      Transaction tx(trees_);
      data::Delta delta;
      TFS_TRY(data_->QueuePunch(&tx, ino, first_whole, end_whole, &delta, kBatchExtents,
                                Transaction::KeyBytes(u32(sizeof(f))), &more));
      f.sectors.set(u64(i64(f.sectors.get()) + delta.sectors));
      SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
      DebugNoSharedLock();
      TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
    }
    if (punch) {
      const u64 lock[1] = {ino};
      Locked locked(this, lock, 1);
      TFS_TRY(locked.status());
      TFS_TRY(ReadInode(ino, &f));
      SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      Transaction tx(trees_);
      TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
      DebugNoSharedLock();
      return tx.Commit(journal::CommitMode::kNoFlush).status();
    }
  }
  // Preallocation (and the rest of zeroing): unwritten extents over the holes
  // of every block the range touches (zeroing: its whole blocks are holes by
  // now, and its partial blocks either hold data, zeroed above, or are holes).
  const u64 first = off / kBlock;
  const u64 last = (end + kBlock - 1) / kBlock;
  u64 at = first;
  do {
    const u64 lock[1] = {ino};
    Locked locked(this, lock, 1);
    TFS_TRY(locked.status());
    TFS_TRY(ReadInode(ino, &f));
    Transaction tx(trees_);
    data::Delta delta;
    u64 next = at;
    Status st = at < last ? data_->QueueReserve(&tx, ino, at, last, &delta, kBatchExtents, &next) : Status::Ok();
    if (st.ok()) {
      SetTime(&f.ctime_ns, now);
      if (next == last && !keep && end > f.size.get()) {
        f.size.set(end);
        SetTime(&f.mtime_ns, now);
      }
      f.sectors.set(u64(i64(f.sectors.get()) + delta.sectors));
      st = tx.Set(InodePos(ino), &f, sizeof(f));
    }
    if (!st.ok()) {
      data_->Abort(delta);  // failed before the commit
      return st;
    }
    DebugNoSharedLock();
    TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
    at = next;
  } while (at < last);
  return Status::Ok();
}

bool Filesystem::Compress(const InodeFormat& f) const { return CompressNewData(f, compress_all_); }

}  // namespace tfs::posix
