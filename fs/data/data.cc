// The data path's first step (see data.h and docs/design/data.md).
#include "data/data.h"

#include "dev/io_queue.h"
#include "platform/platform.h"
#include "sb/format.h"

namespace tfs::data {

using btree::Iterator;
using btree::Pos;

namespace {

constexpr u32 kValueMax = kExtentValueMax;
// Keys an extent lookup copies at first: a read or write of a few blocks
// needs the extent at its start and maybe one more (later steps double it).
constexpr u32 kPointBatch = 2;

Pos ExtentPos(u64 ino, u64 end) { return Pos{btree::kBtreeExtents, ino, end}; }

// One request for ctx on a member's queue, waited for: tagged with ctx's
// origin, queued in ctx's class.
Status ContextIo(const IoContext& ctx, dev::IoQueue& queue, IoOp op, u64 offset, void* buf, u64 length) {
  dev::Io io;
  io.req.op = op;
  io.req.origin = ctx.origin;
  io.req.offset = offset;
  io.req.length = length;
  io.req.buf = buf;
  io.cls = ctx.io_class;
  return dev::SubmitAndWait(queue, &io);
}

// An extent value for `e` holding `blocks` blocks from `offset` with these crcs.
u32 BuildExtent(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, const u8* crcs) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.nr_ptrs = 1;
  h.blocks.set(blocks);
  h.offset.set(offset);
  MemCopy(buf, &h, sizeof(h));
  MemCopy(buf + sizeof(h), &ptr, sizeof(ptr));
  MemCopy(buf + sizeof(h) + sizeof(ptr), crcs, 4 * usize(blocks));
  return u32(sizeof(h) + sizeof(ptr)) + 4 * blocks;
}

// An unwritten extent's value: the header alone.
u32 BuildUnwritten(u8* buf, u32 blocks) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = kExtentUnwritten;
  h.blocks.set(blocks);
  MemCopy(buf, &h, sizeof(h));
  return u32(sizeof(h));
}

// A compressed extent's value: blocks [offset, offset + blocks) of a blob of
// stored_blocks blocks kept as disk_bytes compressed bytes whose crc is `crc`.
u32 BuildCompressed(u8* buf, const ExtentPtr& ptr, u32 offset, u32 blocks, u32 stored_blocks, u32 disk_bytes,
                    const u8* crc) {
  ExtentFormat h;
  MemSet(&h, 0, sizeof(h));
  h.version = kExtentVersion;
  h.flags = kExtentCompressed;
  h.nr_ptrs = 1;
  h.stored_blocks = u8(stored_blocks);
  h.blocks.set(blocks);
  h.offset.set(offset);
  h.disk_bytes.set(disk_bytes);
  MemCopy(buf, &h, sizeof(h));
  MemCopy(buf + sizeof(h), &ptr, sizeof(ptr));
  MemCopy(buf + sizeof(h) + sizeof(ptr), crc, 4);
  return u32(sizeof(h) + sizeof(ptr)) + 4;
}

}  // namespace

u32 BuildPiece(u8* buf, const Extent& e, u64 skip, u32 blocks) {
  if (e.unwritten) return BuildUnwritten(buf, blocks);
  if (e.compressed) return BuildCompressed(buf, e.ptr, e.offset + u32(skip), blocks, e.stored_blocks, e.disk_bytes, e.crcs);
  return BuildExtent(buf, e.ptr, e.offset + u32(skip), blocks, e.crcs + 4 * skip);
}

Status ParseExtent(const Pos& pos, const u8* value, u32 len, Extent* out) {
  if (len < sizeof(ExtentFormat)) return Err::kCorrupt;
  ExtentFormat h;
  MemCopy(&h, value, sizeof(h));
  const u32 blocks = h.blocks.get();
  if (h.version != kExtentVersion || blocks == 0 || pos.offset < blocks) return Err::kCorrupt;
  if (h.flags == kExtentUnwritten) {
    if (h.nr_ptrs != 0 || blocks > kMaxUnwrittenBlocks || h.offset.get() != 0 || h.stored_blocks != 0 ||
        h.disk_bytes.get() != 0 || len != sizeof(h))
      return Err::kCorrupt;
  } else if (h.flags == kExtentCompressed) {
    const u32 stored = h.stored_blocks;
    if (h.nr_ptrs != 1 || stored == 0 || stored > kMaxCompressedBlocks || blocks > stored ||
        h.offset.get() > stored - blocks || h.disk_bytes.get() == 0 || h.disk_bytes.get() >= stored * kBlockSize ||
        len != sizeof(h) + sizeof(ExtentPtr) + 4)
      return Err::kCorrupt;
  } else if (h.flags != 0 || h.nr_ptrs != 1 || blocks > kMaxExtentBlocks || h.stored_blocks != 0 ||
             h.disk_bytes.get() != 0 || len != sizeof(h) + sizeof(ExtentPtr) + 4 * blocks) {
    return Err::kCorrupt;
  }
  out->ino = pos.inode;
  out->end = pos.offset;
  out->start = pos.offset - blocks;
  out->offset = h.offset.get();
  out->unwritten = h.flags == kExtentUnwritten;
  out->compressed = h.flags == kExtentCompressed;
  out->stored_blocks = h.stored_blocks;
  out->disk_bytes = h.disk_bytes.get();
  if (out->unwritten) {
    MemSet(&out->ptr, 0, sizeof(ExtentPtr));
    out->crcs = nullptr;
  } else {
    MemCopy(&out->ptr, value + sizeof(h), sizeof(ExtentPtr));
    out->crcs = value + sizeof(h) + sizeof(ExtentPtr);
  }
  return Status::Ok();
}

DataPath::~DataPath() { Close(); }

Status DataPath::Open(store::Store* store) {
  if (store_ != nullptr || store == nullptr || !store->open()) return Err::kInvalidArgument;
  store_ = store;
  trees_ = &store->btrees();
  const sb::Superblock& sb = store->sb();
  bucket_blocks_ = sb.bucket_size / kBlockSize;
  journal_members_ = 0;
  for (u32 m = 0; m < sb.nr_members; m++)
    if (sb.members[m].journal_nbuckets > 0) journal_members_ |= dev::DevMask(1) << m;
  // The targets, once: the superblock's options do not change while mounted.
  // One that names nothing is no preference (the fallback: every member).
  const char* names[] = {sb.options.foreground_target, sb.options.background_target, sb.options.promote_target};
  for (u32 k = 0; k < 3; k++) {
    auto t = store->devs().ResolveTarget(names[k]);
    targets_[k] = t.ok() ? t.value() : 0;
  }
  alloc::Allocator& a = store->alloc();
  for (u32 d = 0; d < a.members(); d++) {
    TFS_TRY(live_[d].Resize(a.nbuckets(d)));
    TFS_TRY(pending_[d].Resize(a.nbuckets(d)));
    TFS_TRY(reads_[d].Resize(a.nbuckets(d)));
    TFS_TRY(held_[d].Resize(a.nbuckets(d)));
  }
  // Live blocks per bucket, from the extents: the one record of what is live.
  Iterator it(trees_, btree::kBtreeExtents);
  Status st = it.SeekToFirst();
  u64 bad = 0;
  reserved_ = 0;
  for (; st.ok() && it.Valid(); st = it.Next()) {
    Extent e;
    const bool parsed = ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok();
    if (parsed && e.unwritten) {
      reserved_ += e.end - e.start;
      continue;
    }
    if (!parsed || e.ptr.dev >= a.members() || e.ptr.offset.get() < sb::kBucketsOffset) {
      bad++;
      continue;
    }
    const u64 b = sb.BucketOf(e.ptr.offset.get());
    if (b >= live_[e.ptr.dev].size()) {
      bad++;
      continue;
    }
    live_[e.ptr.dev][b] += u32(e.end - e.start);
  }
  if (!st.ok()) return st;
  if (bad > 0) platform::Log(platform::LogLevel::kError, "data: %llu extents with bad pointers (fsck)", (unsigned long long)bad);
  // User buckets no extent points into (a crash between allocating and
  // committing, or the last write point of a crash): free them.
  for (u32 d = 0; d < a.members(); d++)
    for (u64 b = 0; b < live_[d].size(); b++) {
      const alloc::Bucket k = a.Get(d, b);
      if (k.state != alloc::BucketState::kUser || live_[d][b] != 0) continue;
      TFS_TRY(a.Free(alloc::BucketRef{d, b, k.gen}));
      ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
    }
  return Status::Ok();
}

void DataPath::Close() {
  if (store_ == nullptr) return;
  {
    MutexLock t(wps_mu_);
    const u32 n = nr_wps_.Load(MemOrder::kAcquire);
    for (u32 i = 0; i < n; i++) {
      WritePoint* wp = wps_[i];
      bool free_it = false;
      alloc::BucketRef ref{};
      {
        MutexLock l(wp->mu);
        if (wp->open) {
          MutexLock a(acct_mu_);
          held_[wp->ref.dev][wp->ref.bucket] = 0;
          free_it = ReleaseLocked(wp->ref.dev, wp->ref.bucket, &ref);
          wp->open = false;
        }
      }
      if (free_it && store_->alloc().Free(ref).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
      platform::Delete(wp);
      wps_[i] = nullptr;
    }
    nr_wps_.Store(0, MemOrder::kRelease);
  }
  for (auto& v : live_) v.Resize(0).IgnoreError();
  for (auto& v : pending_) v.Resize(0).IgnoreError();
  for (auto& v : reads_) v.Resize(0).IgnoreError();
  for (auto& v : held_) v.Resize(0).IgnoreError();
  reserved_ = 0;
  store_ = nullptr;
  trees_ = nullptr;
}

u64 DataPath::FreeBlocksLocked() const {
  const alloc::Allocator& a = store_->alloc();
  u64 buckets = 0;
  for (u32 d = 0; d < a.members(); d++) {
    const alloc::DeviceUsage u = a.Usage(d);
    const u64 free = u.by_state[u32(alloc::BucketState::kFree)] + u.pending_free;
    const u64 floor = a.FreeFloor(d, alloc::Watermark::kForeground);
    if (free > floor) buckets += free - floor;
  }
  // What is left in the write points (each read once: a write point moving
  // on meanwhile is the same race as an allocation right after this).
  u64 blocks = buckets * bucket_blocks_;
  const u32 n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++) blocks += wps_[i]->left.Load(MemOrder::kRelaxed);
  return blocks;
}

Result<DataPath::WritePoint*> DataPath::FindWritePoint(const IoContext& ctx) {
  // Lock-free for the ones that exist (every write looks its up).
  u32 n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++)
    if (wps_[i]->target == ctx.target && wps_[i]->io_class == ctx.io_class) return wps_[i];
  MutexLock t(wps_mu_);
  n = nr_wps_.Load(MemOrder::kAcquire);
  for (u32 i = 0; i < n; i++)
    if (wps_[i]->target == ctx.target && wps_[i]->io_class == ctx.io_class) return wps_[i];
  if (n == kMaxWritePoints) {
    platform::Log(platform::LogLevel::kError, "data: more than %u write points asked for", kMaxWritePoints);
    return Err::kInvalidArgument;
  }
  WritePoint* wp = platform::New<WritePoint>();
  if (wp == nullptr) return Err::kNoMemory;
  wp->target = ctx.target;
  wp->io_class = ctx.io_class;
  wps_[n] = wp;
  nr_wps_.Store(n + 1, MemOrder::kRelease);
  return wp;
}

bool DataPath::WritePointBucket(const IoContext& ctx, alloc::BucketRef* out) {
  auto wp = FindWritePoint(ctx);
  if (!wp.ok()) return false;
  MutexLock l(wp.value()->mu);
  *out = wp.value()->ref;
  return wp.value()->open;
}

bool DataPath::ReleaseLocked(u32 dev, u64 bucket, alloc::BucketRef* ref) {
  if (live_[dev][bucket] != 0 || pending_[dev][bucket] != 0 || held_[dev][bucket] != 0) return false;
  if (reads_[dev][bucket] != 0) {
    reads_[dev][bucket] |= kDoomed;  // the last read frees it (Unpin)
    return false;
  }
  *ref = alloc::BucketRef{dev, bucket, store_->alloc().Get(dev, bucket).gen};
  return true;
}

Status DataPath::Reserve(const IoContext& ctx, u32 want, u64 covered, bool whole, alloc::BucketRef* ref,
                         u64* offset, u32* got) {
  auto found = FindWritePoint(ctx);
  TFS_TRY(found.status());
  WritePoint& wp = *found.value();
  alloc::BucketRef retired{};
  bool retire = false;
  Status st;
  {
    MutexLock l(wp.mu);
    if (!wp.open || wp.used == bucket_blocks_ || (whole && bucket_blocks_ - wp.used < want)) {
      const dev::DevMask target = ctx.target.kind == TargetKind::kMember
                                      ? dev::DevMask(1) << (ctx.target.member % dev::kMaxDevices)
                                      : targets_[u32(ctx.target.kind) % kTargetKinds];
      auto r = store_->alloc().Allocate(target, store_->devs().all(), alloc::BucketState::kUser, ctx.watermark);
      if (!r.ok()) return r.status();
      MutexLock a(acct_mu_);
      if (wp.open) {
        // All of it overwritten already, and no write in flight into it:
        // freed (or by the last read of it).
        held_[wp.ref.dev][wp.ref.bucket] = 0;
        retire = ReleaseLocked(wp.ref.dev, wp.ref.bucket, &retired);
      }
      wp.ref = r.value();
      wp.used = 0;
      wp.left.Store(bucket_blocks_, MemOrder::kRelaxed);
      wp.open = true;
      held_[wp.ref.dev][wp.ref.bucket] = 1;
      ctr_.buckets_opened.FetchAdd(1, MemOrder::kRelaxed);
    }
    const u32 n = u32(Min<u64>(want, bucket_blocks_ - wp.used));
    MutexLock a(acct_mu_);
    // The reservations of others must still fit in what stays free.
    const u64 others = reserved_ > covered ? reserved_ - covered : 0;
    if (others > 0 && FreeBlocksLocked() < others + n) {
      ctr_.reserve_refused.FetchAdd(1, MemOrder::kRelaxed);
      st = Err::kNoSpace;
    } else {
      *ref = wp.ref;
      *got = n;
      *offset = store_->sb().BucketOffset(wp.ref.bucket) + wp.used * kBlockSize;
      wp.used += n;
      wp.left.Store(bucket_blocks_ - wp.used, MemOrder::kRelaxed);
      pending_[wp.ref.dev][wp.ref.bucket] += n;
    }
  }
  if (retire && store_->alloc().Free(retired).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
  return st;
}

Status DataPath::WriteBlob(const IoContext& ctx, u32 dev, u64 offset, const u8* data, u32 nblocks) {
  const u64 len = u64(nblocks) * kBlockSize;
  // O_DIRECT devices need aligned buffers: copy only data that is not.
  u8* buf = nullptr;
  if (reinterpret_cast<uptr>(data) % kBlockSize != 0) {
    buf = static_cast<u8*>(platform::Alloc(len, kBlockSize));
    if (buf == nullptr) return Err::kNoMemory;
    MemCopy(buf, data, len);
  }
  Status st = ContextIo(ctx, store_->devs().member(dev)->queue(), IoOp::kWrite, offset,
                        buf != nullptr ? buf : const_cast<u8*>(data), len);
  platform::Free(buf);
  return st;
}

Status DataPath::QueueWrite(const IoContext& ctx, btree::Transaction* tx, u64 ino, u64 first, const u8* blocks,
                            u32 nblocks, Delta* delta, bool compress) {
  Prepared* p = platform::New<Prepared>();
  if (p == nullptr) return Err::kNoMemory;
  Status st = Prepare(ctx, ino, first, blocks, nblocks, compress, p, delta);
  if (st.ok()) st = QueuePrepared(tx, *p, delta);
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

Status DataPath::QueuePrepared(btree::Transaction* tx, const Prepared& p, Delta* delta) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  TFS_TRY(QueuePunch(tx, p.ino, p.first, p.first + p.blocks, delta));
  return QueuePreparedOverPunch(tx, p);
}

Status DataPath::QueuePreparedOverPunch(btree::Transaction* tx, const Prepared& p) {
  if (store_ == nullptr || p.blocks == 0) return Err::kInvalidArgument;
  for (const Prepared::Item& item : p.items) {
    TFS_TRY(tx->Set(ExtentPos(p.ino, item.end), item.value, item.len));
    TFS_TRY(QueueDataCheck(tx, item));
  }
  return Status::Ok();
}

Status DataPath::QueueDataCheck(btree::Transaction* tx, const Prepared::Item& item) {
  // The blob was just written whole: the check covers it with the crcs the
  // extent already holds (per block, or the compressed blob's one), so replay
  // can tell whether it reached the disk (journal/format.h, kKeyDataCheck).
  Extent e;
  TFS_TRY(ParseExtent(ExtentPos(0, item.end), item.value, item.len, &e));
  if (e.unwritten) return Status::Ok();
  // A member without a journal is flushed by the committer (Commit): its data
  // is durable before the entry, and replay has nothing to check.
  if ((journal_members_ & (dev::DevMask(1) << e.ptr.dev)) == 0) return Status::Ok();
  const u32 ncrcs = e.compressed ? 1 : u32(e.end - e.start);
  u8 buf[sizeof(journal::DataCheckFormat) + 4 * kMaxExtentBlocks];
  auto* dc = reinterpret_cast<journal::DataCheckFormat*>(buf);
  MemSet(dc, 0, sizeof(*dc));
  dc->member.set(e.ptr.dev);
  dc->offset.set(e.ptr.offset.get());
  dc->length.set(e.compressed ? e.disk_bytes : ncrcs * kBlockSize);
  dc->unit.set(e.compressed ? e.disk_bytes : kBlockSize);
  MemCopy(buf + sizeof(*dc), e.crcs, 4 * ncrcs);
  return tx->AddDataCheck(buf, journal::DataCheckBytes(ncrcs));
}

Status DataPath::Prepare(const IoContext& ctx, u64 ino, u64 first, const u8* blocks, u32 nblocks, bool compress,
                         Prepared* p, Delta* delta) {
  if (store_ == nullptr || nblocks == 0) return Err::kInvalidArgument;
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
    alloc::BucketRef ref;
    u64 offset;
    u32 got;
    TFS_TRY(Reserve(ctx, Min(plain_end - done, kMaxExtentBlocks), covered.value(), false, &ref, &offset, &got));
    // Recorded at once, so that Abort gives the reserved space back whatever fails next.
    Status st = delta->changes.PushBack(Delta::Change{ref.dev, ref.bucket, i64(got), i64(got)});
    if (!st.ok()) {
      Account(ref.dev, ref.bucket, 0, -i64(got));
      return st;
    }
    delta->deps |= dev::DevMask(1) << ref.dev;
    const u8* data = blocks + u64(done) * kBlockSize;
    TFS_TRY(WriteBlob(ctx, ref.dev, offset, data, got));
    for (u32 i = 0; i < got; i++) {
      Le32 c;
      c.set(platform::Crc32c(data + u64(i) * kBlockSize, kBlockSize));
      MemCopy(crcs + 4 * i, &c, 4);
    }
    ExtentPtr ptr;
    MemSet(&ptr, 0, sizeof(ptr));
    ptr.dev = u8(ref.dev);
    ptr.gen = ref.gen;
    ptr.offset.set(offset);
    TFS_TRY(p->items.PushBack(Prepared::Item{}));
    Prepared::Item& item = p->items[p->items.size() - 1];
    item.end = first + done + got;
    item.len = BuildExtent(item.value, ptr, 0, got, crcs);
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
  alloc::BucketRef ref;
  u64 offset;
  u32 got;
  Status st = Reserve(ctx, zblocks, covered, true, &ref, &offset, &got);
  if (st.ok()) {
    st = delta->changes.PushBack(Delta::Change{ref.dev, ref.bucket, i64(nblocks), i64(zblocks)});
    if (!st.ok()) Account(ref.dev, ref.bucket, 0, -i64(zblocks));
  }
  if (st.ok()) {
    delta->deps |= dev::DevMask(1) << ref.dev;
    st = ContextIo(ctx, store_->devs().member(ref.dev)->queue(), IoOp::kWrite, offset, z,
                   u64(zblocks) * kBlockSize);
  }
  if (st.ok()) {
    Le32 c;
    c.set(platform::Crc32c(z, zbytes));
    ExtentPtr ptr;
    MemSet(&ptr, 0, sizeof(ptr));
    ptr.dev = u8(ref.dev);
    ptr.gen = ref.gen;
    ptr.offset.set(offset);
    st = p->items.PushBack(Prepared::Item{});
    if (st.ok()) {
      Prepared::Item& item = p->items[p->items.size() - 1];
      item.end = first + nblocks;
      item.len = BuildCompressed(item.value, ptr, 0, nblocks, nblocks, zbytes, reinterpret_cast<const u8*>(&c));
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

Status DataPath::QueuePunch(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys) {
  if (store_ == nullptr || end <= first) return store_ == nullptr ? Status(Err::kInvalidArgument) : Status::Ok();
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[kValueMax];
  u32 touched = 0;
  for (; it.Valid() && it.pos().inode == ino && touched < max_keys; TFS_TRY(it.Next())) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    touched++;
    const u64 lo = Max(e.start, first);
    const u64 hi = Min(e.end, end);
    if (e.start < first)  // the piece before the range: a new key at `first`
      TFS_TRY(tx->Set(ExtentPos(ino, first), value, BuildPiece(value, e, 0, u32(first - e.start))));
    if (e.end > end) {  // the piece after it keeps the key
      TFS_TRY(tx->Set(ExtentPos(ino, e.end), value, BuildPiece(value, e, end - e.start, u32(e.end - end))));
    } else {
      TFS_TRY(tx->Delete(ExtentPos(ino, e.end)));
    }
    if (e.unwritten) {
      delta->unreserved += hi - lo;
    } else {
      const u64 b = store_->sb().BucketOf(e.ptr.offset.get());
      TFS_TRY(delta->changes.PushBack(Delta::Change{e.ptr.dev, b, -i64(hi - lo), 0}));
    }
    delta->sectors -= i64(hi - lo) * (kBlockSize / 512);
  }
  return Status::Ok();
}

Result<u32> DataPath::CountExtentsFrom(u64 ino, u64 first, u32 limit) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u32 n = 0;
  for (; it.Valid() && it.pos().inode == ino && n < limit; TFS_TRY(it.Next())) n++;
  return n;
}

Status DataPath::QueueReserve(btree::Transaction* tx, u64 ino, u64 first, u64 end, Delta* delta, u32 max_keys,
                              u64* next) {
  *next = first;
  if (store_ == nullptr || end < first) return Err::kInvalidArgument;
  delta->ino = ino;
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  TFS_TRY(it.Seek(ExtentPos(ino, first + 1)));
  u8 value[sizeof(ExtentFormat)];
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
    TFS_TRY(tx->Set(ExtentPos(ino, at + n), value, BuildUnwritten(value, n)));
    delta->sectors += i64(n) * (kBlockSize / 512);
    at += n;
    keys++;
  }
  *next = at;
  return Status::Ok();
}

void DataPath::Account(u32 dev, u64 bucket, i64 blocks, i64 pending) {
  bool free_it = false;
  alloc::BucketRef ref{};
  {
    MutexLock l(acct_mu_);
    if (dev >= dev::kMaxDevices || bucket >= live_[dev].size()) return;
    u32& live = live_[dev][bucket];
    u32& pend = pending_[dev][bucket];
    TFS_BUG_ON((blocks < 0 && u64(-blocks) > live) || (pending < 0 && u64(-pending) > pend));
    live = u32(i64(live) + blocks);
    pend = u32(i64(pend) + pending);
    if (blocks < 0) ctr_.blocks_released.FetchAdd(u64(-blocks), MemOrder::kRelaxed);
    free_it = ReleaseLocked(dev, bucket, &ref);
  }
  if (free_it && store_->alloc().Free(ref).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
}

void DataPath::Apply(const Delta& delta) {
  // Gains first (reserved space becomes live): a bucket losing and gaining in
  // one delta never looks empty.
  for (const Delta::Change& c : delta.changes)
    if (c.pending > 0) Account(c.dev, c.bucket, c.blocks, -c.pending);
  for (const Delta::Change& c : delta.changes)
    if (c.blocks < 0) Account(c.dev, c.bucket, c.blocks, 0);
  if (delta.unreserved > 0) {
    MutexLock a(acct_mu_);
    TFS_BUG_ON(delta.unreserved > reserved_);
    reserved_ -= delta.unreserved;
  }
}

void DataPath::Abort(const Delta& delta) {
  // The space reserved for it is unreferenced: its bucket may go once empty.
  for (const Delta::Change& c : delta.changes)
    if (c.pending > 0) Account(c.dev, c.bucket, 0, -c.pending);
  if (delta.reserved > 0) {
    MutexLock a(acct_mu_);
    TFS_BUG_ON(delta.reserved > reserved_);
    reserved_ -= delta.reserved;
  }
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
  // Readers of this inode's extents see the commit whole or not at all (see
  // ReadBlocks): its stripe's counter is odd while the keys are applied.
  tx->SetApplySeq(&applying_[CommitStripe(delta.ino)]);
  auto r = tx->Commit(mode, delta.deps & ~slow);
  if (!r.ok()) {
    Abort(delta);
    return r.status();
  }
  Apply(delta);
  return Status::Ok();
}

bool DataPath::Pin(u32 dev, u64 bucket, u8 gen) {
  MutexLock a(acct_mu_);
  const alloc::Bucket k = store_->alloc().Get(dev, bucket);
  if (k.gen != gen || k.state != alloc::BucketState::kUser) return false;
  reads_[dev][bucket]++;
  return true;
}

void DataPath::Unpin(u32 dev, u64 bucket) {
  alloc::BucketRef ref{};
  {
    MutexLock a(acct_mu_);
    u32& r = reads_[dev][bucket];
    TFS_BUG_ON((r & ~kDoomed) == 0);
    r--;
    if (r != kDoomed) return;
    r = 0;  // the last read of a bucket emptied meanwhile: free it now
    ref = alloc::BucketRef{dev, bucket, store_->alloc().Get(dev, bucket).gen};
  }
  if (store_->alloc().Free(ref).ok()) ctr_.buckets_freed.FetchAdd(1, MemOrder::kRelaxed);
}

// One extent's part of a read, found in phase 1 of ReadBlocks.
struct DataPath::Piece {
  Extent e;   // e.crcs: the read's own copy of block lo's crc onwards (compressed: the blob's)
  u64 lo, hi;
};

Status DataPath::FindPieces(u64 ino, u64 first, u64 end, Piece* pieces, u32* n, u8* crcs) {
  *n = 0;
  u32 ncrc = 0;
  u64 covered_to = 0;  // the end of the extent before (the first may start before `first`)
  Iterator it(trees_, btree::kBtreeExtents, kPointBatch);
  Status st = it.Seek(ExtentPos(ino, first + 1));
  for (; st.ok() && it.Valid() && it.pos().inode == ino; st = it.Next()) {
    Extent e;
    TFS_TRY(ParseExtent(it.pos(), it.value(), it.val_bytes(), &e));
    if (e.start >= end) break;
    // Keys come in order, so the extents of one committed state are disjoint;
    // an overlap means the walk crossed a commit: kAgain (and the arrays,
    // sized for disjoint pieces of the range, stay in bounds).
    if (e.start < covered_to) return Err::kAgain;
    covered_to = e.end;
    if (e.unwritten) continue;  // zeros
    Piece& p = pieces[(*n)++];
    p.e = e;
    p.lo = Max(e.start, first);
    p.hi = Min(e.end, end);
    // Only the crcs this read needs: the blocks' own, or the blob's one.
    const u32 count = e.compressed ? 1 : u32(p.hi - p.lo);
    MemCopy(crcs + 4 * ncrc, e.compressed ? e.crcs : e.crcs + 4 * (p.lo - e.start), 4 * count);
    p.e.crcs = crcs + 4 * ncrc;  // block lo's (or the blob's)
    ncrc += count;
  }
  return st;
}

Status DataPath::ReadBlocks(const IoContext& ctx, u64 ino, u64 first, u32 nblocks, u8* buf) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  const u64 end = first + nblocks;
  // Phase 1 finds the extents, copying what phase 2 needs, and is repeated
  // if an extent commit of this inode overlapped it: a commit replaces keys
  // one by one, and a walk through the middle of one could see neither the
  // old nor the new extent of a block (and read zeros that were never
  // there). Phase 2 pins each bucket and reads it; if the bucket was freed
  // since phase 1, everything starts again.
  Piece* pieces = static_cast<Piece*>(platform::Alloc(u64(nblocks) * sizeof(Piece), 16));
  u8* crcs = static_cast<u8*>(platform::Alloc(u64(nblocks) * 4, 16));
  u8* tmp = nullptr;
  Status st = pieces == nullptr || crcs == nullptr ? Status(Err::kNoMemory) : Status::Ok();
  const u32 s = CommitStripe(ino);
  const sb::Superblock& sb = store_->sb();
  u32 stale = 0;
  u32 torn = 0;
  for (u32 attempt = 0; st.ok(); attempt++) {
    if (attempt > 0) platform::SleepNs(attempt < 8 ? 1000 : 100000);
    // While a commit of this stripe applies its keys (microseconds: no journal
    // wait in between; at most a read of an evicted leaf from the metadata
    // target), wait; never count that against the read.
    const u64 v = applying_[s].Load(MemOrder::kSeqCst);
    if ((v & 1) != 0) {
      ctr_.read_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    u32 n = 0;
    st = FindPieces(ino, first, end, pieces, &n, crcs);
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
      ctr_.read_retries.FetchAdd(1, MemOrder::kRelaxed);
      continue;
    }
    MemSet(buf, 0, u64(nblocks) * kBlockSize);
    bool again = false;
    for (u32 i = 0; st.ok() && !again && i < n; i++) {
      const Extent& e = pieces[i].e;
      const u64 lo = pieces[i].lo;
      const u64 hi = pieces[i].hi;
      const u64 at = e.ptr.offset.get() + (u64(e.offset) + (lo - e.start)) * kBlockSize;
      const u64 len = (hi - lo) * kBlockSize;
      // The pointer must land in one bucket.
      const u64 b = sb.BucketOf(e.ptr.offset.get());
      if (e.ptr.dev >= sb.nr_members || b >= store_->alloc().nbuckets(e.ptr.dev) ||
          e.ptr.offset.get() + e.DiskBlocks() * kBlockSize > sb.BucketOffset(b) + sb.bucket_size) {
        st = Err::kCorrupt;
        break;
      }
      // A user bucket of the pointer's generation, held until the read is
      // done. If it is not (any more), an overwrite committed and freed it
      // since phase 1: again. A pointer that stays wrong is corrupt.
      if (!Pin(e.ptr.dev, b, e.ptr.gen)) {
        if (++stale > kMaxStaleLookups) {
          st = Err::kCorrupt;
          break;
        }
        ctr_.stale_lookups.FetchAdd(1, MemOrder::kRelaxed);
        again = true;
        break;
      }
      // Into the caller's buffer if it is aligned for O_DIRECT devices (it then
      // holds unverified bytes until the check below passes or fails the read),
      // else through a bounce buffer; a compressed blob always decompresses
      // into one.
      const bool direct = !e.compressed && reinterpret_cast<uptr>(buf) % kBlockSize == 0;
      if (!direct && tmp == nullptr) tmp = static_cast<u8*>(platform::Alloc(u64(kMaxExtentBlocks) * kBlockSize, kBlockSize));
      if (!direct && tmp == nullptr) {
        Unpin(e.ptr.dev, b);
        st = Err::kNoMemory;
        break;
      }
      if (e.compressed) {
        st = ReadCompressed(ctx, e, tmp);
        Unpin(e.ptr.dev, b);
        if (!st.ok()) break;
        MemCopy(buf + (lo - first) * kBlockSize, tmp + (u64(e.offset) + (lo - e.start)) * kBlockSize, len);
        ctr_.bytes_read.FetchAdd(e.DiskBlocks() * kBlockSize, MemOrder::kRelaxed);
        ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
        continue;
      }
      u8* into = direct ? buf + (lo - first) * kBlockSize : tmp;
      st = ContextIo(ctx, store_->devs().member(e.ptr.dev)->queue(), IoOp::kRead, at, into, len);
      Unpin(e.ptr.dev, b);
      if (!st.ok()) break;
      for (u64 blk = lo; blk < hi; blk++) {
        const u8* data = into + (blk - lo) * kBlockSize;
        Le32 want;
        MemCopy(&want, e.crcs + 4 * (blk - lo), 4);
        if (platform::Crc32c(data, kBlockSize) != want.get()) {
          ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
          platform::Log(platform::LogLevel::kError,
                        "data: checksum mismatch: inode %llu block %llu (member %u offset %llu)",
                        (unsigned long long)ino, (unsigned long long)blk, unsigned(e.ptr.dev),
                        (unsigned long long)(at + (blk - lo) * kBlockSize));
          st = Err::kDataCorrupt;
          break;
        }
      }
      if (!st.ok()) break;
      if (!direct) MemCopy(buf + (lo - first) * kBlockSize, tmp, len);
      ctr_.bytes_read.FetchAdd(len, MemOrder::kRelaxed);
      ctr_.blocks_read.FetchAdd(hi - lo, MemOrder::kRelaxed);
    }
    if (!again) break;
  }
  platform::Free(tmp);
  platform::Free(crcs);
  platform::Free(pieces);
  return st;
}

Status DataPath::ReadCompressed(const IoContext& ctx, const Extent& e, u8* out) {
  const u64 disk = e.DiskBlocks() * kBlockSize;
  u8* z = static_cast<u8*>(platform::Alloc(disk, kBlockSize));
  if (z == nullptr) return Err::kNoMemory;
  Status st = ContextIo(ctx, store_->devs().member(e.ptr.dev)->queue(), IoOp::kRead, e.ptr.offset.get(), z, disk);
  if (st.ok()) {
    Le32 want;
    MemCopy(&want, e.crcs, 4);
    if (platform::Crc32c(z, e.disk_bytes) != want.get()) {
      ctr_.csum_errors.FetchAdd(1, MemOrder::kRelaxed);
      platform::Log(platform::LogLevel::kError,
                    "data: checksum mismatch: inode %llu compressed blob at block %llu (member %u offset %llu)",
                    (unsigned long long)e.ino, (unsigned long long)(e.start - e.offset), unsigned(e.ptr.dev),
                    (unsigned long long)e.ptr.offset.get());
      st = Err::kDataCorrupt;
    }
  }
  if (st.ok()) {
    // A blob that passes its crc but does not decompress to exactly its
    // blocks was written wrong: corrupt, never partial data.
    const u64 want = u64(e.stored_blocks) * kBlockSize;
    auto r = platform::ZstdDecompress(out, want, z, e.disk_bytes);
    if (!r.ok() || r.value() != want) st = Err::kDataCorrupt;
  }
  if (st.ok()) ctr_.compressed_reads.FetchAdd(1, MemOrder::kRelaxed);
  platform::Free(z);
  return st;
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

Stats DataPath::GetStats() const {
  Stats s;
  TFS_COUNTER_LOAD(TFS_DATA_COUNTERS, ctr_, s);
  s.write_points = nr_wps_.Load(MemOrder::kAcquire);
  MutexLock a(acct_mu_);
  s.blocks_reserved = reserved_;
  return s;
}

}  // namespace tfs::data
