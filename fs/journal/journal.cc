// Journal writer: group commit, scoped pre-flush, ring placement, pins and reclaim
// (see journal.h for the contract and docs/format/journal.md for the bytes).
//
// Invariants:
//  - entries are written one at a time by the holder of the writer's role, in
//    sequence order; an entry is written only after the previous WriteEntry ended
//    (its flushes included), so any entry on disk proves the ones before it durable
//    if they were flush entries;
//  - an entry is durable only if written with FUA after a pre-flush of every member
//    in (pending deps | its deps | journal members with non-FUA entries) that holds
//    durability debt (ordered), or written first and then flushed together with all
//    of those (unordered: only when every commit since the last durable entry is
//    dependency-free or carries data checks); durable_seq_ only moves on such writes;
//  - settled_seq_ <= durable_seq_: entries up to it are durable and no replay will
//    check their data again, so space they free may be reused (an unordered entry's
//    group settles with the next durable entry, or at once if written ordered);
//  - ring bucket b is overwritten only if bucket_seq[b] < durable_last_seq_, i.e. a
//    durable entry has recorded that nothing in it is needed any more;
//  - mu_ is dropped around device I/O and around the reclaim hook.
#include "journal/journal.h"

#include "util/bits.h"

namespace tfs::journal {

using dev::DevMask;
using dev::Io;
using dev::IoClass;

struct Journal::Buf {
  u8* data = nullptr;  // max_entry_bytes, 4 KiB aligned; header at the start
  u32 used = 0;        // header + keys
  u32 nkeys = 0;
  u32 ncommits = 0;
  u64 seq = 0;
  bool need_flush = false;
  bool full = false;  // a commit did not fit: write it now
  bool reclaim = false;  // holds a Watermark::kReclaim commit: may use the reserve
  u32 admitted = 0;      // kNormal commits fit up to this size (Admits)
  DevMask deps = 0;
  DevMask sole = 0;  // members of deps holding some data's only copy (Commit's deps & ~lossable)
  u64 first_commit_ns = 0;
  bool unchecked = false;    // a commit with deps and no data checks joined
  bool force_ordered = false;  // Settle(), Stop: write it ordered
  u64 check_bytes = 0;       // bytes its data checks cover

  void Reset(u64 s) {
    unchecked = false;
    force_ordered = false;
    check_bytes = 0;
    used = sizeof(EntryHeader);
    nkeys = 0;
    ncommits = 0;
    seq = s;
    need_flush = false;
    full = false;
    reclaim = false;
    admitted = 0;
    deps = 0;
    sole = 0;
    first_commit_ns = 0;
  }
  bool empty() const { return nkeys == 0 && !need_flush; }
};

namespace {

u32 RoundUp(u32 v, u32 to) { return (v + to - 1) / to * to; }

void PrepareIo(Io* io, IoOp op, u64 offset, void* buf, u64 len, u8 flags) {
  io->req.op = op;
  io->req.flags = flags;
  io->req.origin = IoOrigin::kJournal;
  io->req.offset = offset;
  io->req.length = len;
  io->req.buf = buf;
  io->cls = IoClass::kJournal;
}

}  // namespace

Journal::~Journal() {
  Stop().IgnoreError();  // errors were reported to committers already
  for (Buf*& b : bufs_) {
    if (b != nullptr) platform::Free(b->data);
    platform::Delete(b);
    b = nullptr;
  }
  for (Histogram*& h : latency_) {
    platform::Delete(h);
    h = nullptr;
  }
}

Status Journal::Start(dev::DeviceSet* devs, const sb::Superblock& sb, u64 next_seq,
                      const Config& config) {
  if (started_ || next_seq == 0) return Err::kInvalidArgument;
  devs_ = devs;
  config_ = config;
  bucket_size_ = sb.bucket_size;
  if (config_.max_entry_bytes > bucket_size_) config_.max_entry_bytes = bucket_size_;
  config_.max_entry_bytes = config_.max_entry_bytes / kJournalBlock * kJournalBlock;
  if (config_.max_entry_bytes < kJournalBlock) return Err::kInvalidArgument;
  u64 uuid_word = 0;
  MemCopy(&uuid_word, sb.fs_uuid, 8);
  magic_ = kJournalMagic ^ uuid_word;
  replicas_ = sb.options.metadata_replicas;
  wanted_replicas_ = replicas_;
  verified_ = sb.options.checksum != sb::ChecksumType::kNone;
  for (IoSlot& slot : flush_slots_) slot.journal = this;
  for (IoSlot& slot : write_slots_) slot.journal = this;
  NoteRootsGen(sb.roots_gen);

  ring_members_ = 0;
  u32 sb_rings = 0;  // rings formatted, missing ones included
  for (u32 i = 0; i < sb.nr_members; i++) {
    const sb::Member& m = sb.members[i];
    if (m.journal_nbuckets != 0) sb_rings++;
    // A degraded mount's missing member has no ring: its entries go to the
    // rings there are (its own holds only entries older than next_seq,
    // which replay ignores once the superblock says so).
    if (m.journal_nbuckets == 0 || ((devs->missing() >> i) & 1) != 0) continue;
    if (devs->member(i) == nullptr) return Err::kInvalidArgument;
    TFS_TRY(rings_.EmplaceBack());
    Ring& r = rings_.back();
    r.member = i;
    r.first_bucket = m.journal_first_bucket;
    r.nbuckets = m.journal_nbuckets;
    TFS_TRY(r.bucket_seq.Resize(r.nbuckets));
    ring_members_ |= DevMask(1) << i;
  }
  if (rings_.empty()) return Err::kInvalidArgument;
  for (const Ring& r : rings_) {
    // A ring must hold the bucket being filled, the reserve, the slack commits
    // leave (Admits) and one more.
    if (r.nbuckets < config_.reserve_buckets + 3) return Err::kInvalidArgument;
  }
  if (replicas_ > rings_.size()) replicas_ = u32(rings_.size());
  if (wanted_replicas_ > sb_rings) wanted_replicas_ = sb_rings;  // (a format with fewer: not degraded)

  for (Buf*& b : bufs_) {
    b = platform::New<Buf>();
    if (b == nullptr) return Err::kNoMemory;
    b->data = static_cast<u8*>(platform::Alloc(config_.max_entry_bytes, 4096, true));
    if (b->data == nullptr) return Err::kNoMemory;
  }
  for (Histogram*& h : latency_) {
    h = platform::New<Histogram>();
    if (h == nullptr) return Err::kNoMemory;
  }
  bufs_[0]->Reset(next_seq);
  bufs_[1]->Reset(next_seq + 1);
  open_ = 0;
  written_seq_ = durable_seq_ = settled_seq_ = next_seq - 1;
  pending_unchecked_ = false;
  pending_check_bytes_ = 0;
  durable_last_seq_ = next_seq;  // everything before next_seq is persisted elsewhere
  pin_base_ = next_seq;
  stop_ = false;
  failed_ = Status::Ok();
  TFS_TRY(writer_.Start(WriterMain, this, "tierfs-journal"));
  started_ = true;
  PublishRoom();
  return Status::Ok();
}

Status Journal::Stop() {
  if (!started_) return failed_;
  {
    MutexLock lock(mu_);
    stop_ = true;
    cv_.Signal();
  }
  writer_.Join();
  // I/Os given up late are still at their members: they name this
  // journal's slots (an unmount waits out a stall here, as the data
  // path's late copies do).
  while (slots_busy_.Load(MemOrder::kAcquire) != 0) platform::SleepNs(platform::kNsPerMs);
  NoteLateIos();
  started_ = false;
  MutexLock lock(mu_);
  done_cv_.Broadcast();
  return failed_;
}

void Journal::SetReclaimHook(void (*fn)(void*, u64), void* ctx) {
  MutexLock lock(mu_);
  reclaim_fn_ = fn;
  reclaim_ctx_ = ctx;
}

Result<u64> Journal::Commit(const Key* keys, u32 nkeys, DevMask deps, CommitMode mode, Pin* pin,
                            Watermark wm, DevMask lossable) {
  const bool timed =
      mode == CommitMode::kFlush || nofl_commits_.FetchAdd(1, MemOrder::kRelaxed) % kNoFlushSample == 0;
  const u64 start = timed ? platform::NowNs() : 0;
  u32 space = 0;
  u64 check_bytes = 0;
  bool checked = false;
  for (u32 i = 0; i < nkeys; i++) {
    if (keys[i].type == kKeyInvalid) return Err::kInvalidArgument;
    if (keys[i].type == kKeyDataCheck) {
      // Well formed, and about data the commit depends on.
      if (DataCheckWellFormed(keys[i].val, keys[i].len) == 0) return Err::kInvalidArgument;
      const auto* dc = static_cast<const DataCheckFormat*>(keys[i].val);
      if (dc->member.get() >= dev::kMaxDevices || !(deps & (DevMask(1) << dc->member.get())))
        return Err::kInvalidArgument;
      check_bytes += dc->length.get();
      checked = true;
    }
    if (keys[i].len > config_.max_entry_bytes) return Err::kTooBig;
    space += KeySpace(keys[i].len);
    if (space > config_.max_entry_bytes - sizeof(EntryHeader)) return Err::kTooBig;
  }
  MutexLock lock(mu_);
  if (!started_ || stop_) return Err::kInvalidArgument;
#if TFS_LOCK_CHECKS
  // Lock rule (docs/design/core.md): a commit's flush set is its own debt,
  // and a slow member never joins one. deps enter the entry's pre-flush, so
  // they name journal members only: a member without a ring (an HDD) is
  // flushed by its committer before the commit and left out
  // (data::DataPath::Commit); named here, it would be flushed for every
  // foreground commit that shares the entry.
  if (TFS_UNLIKELY((deps & ~ring_members_) != 0)) {
    platform::Log(platform::LogLevel::kFatal,
                  "lock rule: a commit depends on member(s) 0x%llx without a journal ring; "
                  "its committer must flush them itself (data::DataPath::Commit)",
                  static_cast<unsigned long long>(deps & ~ring_members_));
    TFS_BUG_ON(true);
  }
#endif
  Buf* buf;
  bool waited = false;
  for (;;) {
    if (!failed_.ok()) return failed_;
    // Stop() may have begun while we waited for room: the writer may be gone.
    if (stop_) return Err::kInvalidArgument;
    buf = bufs_[open_];
    const u32 need = buf->used + space;
    if (need > config_.max_entry_bytes) {
      // The open entry is full: the writer takes it as soon as it is free.
      buf->full = true;
      cv_.Signal();
      done_cv_.Wait(mu_);
      continue;
    }
    if (wm == Watermark::kReclaim) {
      // Joining an entry of admitted commits, reclaim keys may not grow it
      // past the blocks its admission counted: placed as admitted it could
      // then not fit where admission found room, and -- being a reclaim
      // entry now -- would take the reserve whole, leaving no room for the
      // entry that records a newer last_seq (a full ring for good, seen
      // once alloc records became btree keys: docs/format/alloc.md). Such
      // keys wait for the next entry instead (the writer writes this one
      // without reclaim: it was admitted).
      if (buf->admitted != 0 && RoundUp(need, kJournalBlock) > RoundUp(buf->admitted, kJournalBlock)) {
        buf->full = true;
        cv_.Signal();
        done_cv_.Wait(mu_);
        continue;
      }
      buf->reclaim = true;
      break;
    }
    if (need <= buf->admitted) break;
    // Admitting the entry at its largest size once spares a check per commit.
    if (Admits(config_.max_entry_bytes)) {
      buf->admitted = config_.max_entry_bytes;
      break;
    }
    if (Admits(need)) {
      buf->admitted = need;
      break;
    }
    // No ring room for it: the writer makes some (MakeRoom); wait.
    if (!waited) stats_.room_waits++;
    waited = true;
    room_waiters_++;
    cv_.Signal();
    (void)done_cv_.WaitFor(mu_, 50 * platform::kNsPerMs);
    room_waiters_--;
  }
  if (pin != nullptr) {
    TFS_BUG_ON(pin->active);
    TFS_TRY(PinAdd(buf->seq));
    pin->seq = buf->seq;
    pin->active = true;
  }
  u8* p = buf->data + buf->used;
  for (u32 i = 0; i < nkeys; i++) {
    auto* kh = reinterpret_cast<KeyHeader*>(p);
    kh->type.set(keys[i].type);
    kh->reserved.set(0);
    kh->len.set(keys[i].len);
    MemCopy(p + sizeof(KeyHeader), keys[i].val, keys[i].len);
    u32 ks = KeySpace(keys[i].len);
    MemSet(p + sizeof(KeyHeader) + keys[i].len, 0, ks - sizeof(KeyHeader) - keys[i].len);
    p += ks;
  }
  if (buf->nkeys == 0 && buf->ncommits == 0) buf->first_commit_ns = timed ? start : platform::NowNs();
  buf->used += space;
  buf->nkeys += nkeys;
  buf->ncommits++;
  buf->deps |= deps;
  buf->sole |= deps & ~lossable;
  if (deps != 0 && !checked) buf->unchecked = true;
  buf->check_bytes += check_bytes;
  u64 seq = buf->seq;
  stats_.commits++;
  stats_.keys += nkeys;
  if (mode == CommitMode::kFlush) {
    stats_.flush_commits++;
    buf->need_flush = true;
    TFS_TRY(WaitDurable(seq, /*settle=*/false));
  } else if ((buf->ncommits == 1 && mode != CommitMode::kFlushNext && writer_wakes_ns_ != 0 &&
              writer_wakes_ns_ - buf->first_commit_ns > config_.write_delay_ns) ||
             (buf->used > config_.max_entry_bytes / 2 && buf->used - space <= config_.max_entry_bytes / 2)) {
    // The writer's clock starts with an entry's first commit, and an entry half
    // full is written at once: only those two moments need the writer woken
    // (waking it on every later commit cost a futex call per commit) -- and the
    // first only if the writer would sleep past the entry's write_delay (under
    // fsyncs, committers write most entries themselves, and each woken writer
    // cost them a futex call and a CPU). An awake writer (0) looks at the open
    // entry before it sleeps again.
    cv_.Signal();
  }
  if (timed) latency_[mode == CommitMode::kFlush]->Record(platform::NowNs() - start);
  return seq;
}

Status Journal::Flush() {
  MutexLock lock(mu_);
  if (!started_) return failed_;
  Buf* open = bufs_[open_];
  // Everything committed lives in entries up to open->seq (if it has keys) or
  // open->seq - 1; nothing to do if those are durable already.
  const u64 target = open->nkeys > 0 ? open->seq : open->seq - 1;
  if (durable_seq_ >= target) return failed_;
  return WaitDurable(target, /*settle=*/false);
}

Status Journal::Settle() {
  MutexLock lock(mu_);
  if (!started_) return failed_;
  const Buf* open = bufs_[open_];
  const u64 target = open->nkeys > 0 ? open->seq : open->seq - 1;
  if (settled_seq_ >= target) return failed_;
  return WaitDurable(target, /*settle=*/true);
}

Status Journal::WaitDurable(u64 target, bool settle) {
  while ((settle ? settled_seq_ : durable_seq_) < target && failed_.ok()) {
    if (writing_) {
      // Someone is writing: the entry may be ours; it wakes us when done.
      done_cv_.Wait(mu_);
      continue;
    }
    // The target is the open entry or was written before it: the open entry
    // (empty or not), written as a flush entry -- ordered, to settle -- makes
    // it durable (settled).
    Buf* open = bufs_[open_];
    open->need_flush = true;
    if (settle) open->force_ordered = true;
    if (!stop_ && CanPlaceOpen()) {
      stats_.caller_entries++;
      WriteOpen();
      if (writer_parked_) cv_.Signal();
      continue;
    }
    // The writer thread must write it (ring room needs reclaim, or Stop).
    cv_.Signal();
    done_cv_.Wait(mu_);
  }
  return failed_;
}

Status Journal::AdvanceLastSeq() {
  MutexLock lock(mu_);
  if (!started_) return failed_;
  Buf* open = bufs_[open_];
  u64 last = MinPinnedSeq();
  if (last > open->seq) last = open->seq;
  if (last <= durable_last_seq_) return failed_;
  open->need_flush = true;
  return WaitDurable(open->seq, /*settle=*/false);
}

Status Journal::PinAdd(u64 seq) {
  TFS_BUG_ON(seq < pin_base_);
  u64 idx = seq - pin_base_;
  // Sequence numbers are dense: the vector spans only the pinned window.
  if (idx >= pin_counts_.size()) TFS_TRY(pin_counts_.Resize(usize(idx + 1)));
  pin_counts_[usize(idx)]++;
  return Status::Ok();
}

void Journal::PinRelease(u64 seq) {
  TFS_BUG_ON(seq < pin_base_ || seq - pin_base_ >= pin_counts_.size());
  u32& c = pin_counts_[usize(seq - pin_base_)];
  TFS_BUG_ON(c == 0);
  c--;
  // Drop leading zero counts so the vector stays short -- but only for sealed
  // entries: the open entry can still gain pins, so pin_base_ never passes it.
  const u64 open_seq = bufs_[open_]->seq;
  usize zeros = 0;
  while (zeros < pin_counts_.size() && pin_counts_[zeros] == 0 && pin_base_ + zeros < open_seq) zeros++;
  if (zeros > 0 && zeros * 2 >= pin_counts_.size()) {
    for (usize i = zeros; i < pin_counts_.size(); i++) pin_counts_[i - zeros] = pin_counts_[i];
    Status st = pin_counts_.Resize(pin_counts_.size() - zeros);
    st.IgnoreError();  // shrinking never allocates
    pin_base_ += zeros;
  }
}

void Journal::PinDrop(Pin* pin) {
  if (pin == nullptr || !pin->active) return;
  MutexLock lock(mu_);
  const u64 oldest = MinPinnedSeq();
  PinRelease(pin->seq);
  pin->active = false;
  // Only a move of the oldest pin frees ring space: wake whoever waits for it.
  if (MinPinnedSeq() != oldest) {
    done_cv_.Broadcast();
    cv_.Signal();
  }
}

Status Journal::PinAt(Pin* pin, u64 seq) {
  MutexLock lock(mu_);
  TFS_BUG_ON(pin->active);
  if (seq < pin_base_) seq = pin_base_;
  TFS_TRY(PinAdd(seq));
  pin->seq = seq;
  pin->active = true;
  return Status::Ok();
}

u64 Journal::MinPinnedSeq() const {
  for (usize i = 0; i < pin_counts_.size(); i++) {
    if (pin_counts_[i] != 0) return pin_base_ + i;
  }
  return ~u64(0);
}

void Journal::NoteRootsGen(u64 gen) {
  u64 cur = roots_gen_.Load(MemOrder::kRelaxed);
  while (cur < gen && !roots_gen_.CompareExchange(cur, gen, MemOrder::kRelease)) {
  }
}

u64 Journal::next_seq() const {
  MutexLock lock(mu_);
  return bufs_[open_] != nullptr ? bufs_[open_]->seq : 0;
}

u64 Journal::durable_seq() const {
  MutexLock lock(mu_);
  return durable_seq_;
}

u64 Journal::settled_seq() const {
  MutexLock lock(mu_);
  return settled_seq_;
}

Stats Journal::GetStats() const {
  MutexLock lock(mu_);
  Stats s = stats_;
  s.next_seq = bufs_[open_] != nullptr ? bufs_[open_]->seq : 0;
  s.durable_seq = durable_seq_;
  s.last_seq = durable_last_seq_;
  u32 ring = 0, free = 0;
  LiveRoom(&ring, &free);
  s.ring_buckets = ring;
  s.free_buckets = free;
  s.flushes_out = PopCount(SlotsOut(flush_slots_, /*late_only=*/true));
  s.rings_held = PopCount(SlotsOut(write_slots_, /*late_only=*/true));
  return s;
}

void Journal::ReadLatency(CommitMode mode, Histogram* out) const {
  MutexLock lock(mu_);
  out->Reset();
  if (latency_[mode == CommitMode::kFlush] != nullptr) out->Merge(*latency_[mode == CommitMode::kFlush]);
}

void Journal::WriterMain(void* arg) { static_cast<Journal*>(arg)->WriterLoop(); }

bool Journal::ReadyToWrite(u64 now, u64* wait_ns) const {
  const Buf* open = bufs_[open_];
  *wait_ns = platform::kForever;
  if (open->need_flush || open->full) return true;
  bool nondurable = durable_seq_ < written_seq_;
  if (stop_) return open->nkeys > 0 || nondurable;
  if (open->nkeys > 0) {
    if (open->used > config_.max_entry_bytes / 2) return true;
    u64 age = now - open->first_commit_ns;
    if (age >= config_.write_delay_ns) return true;
    *wait_ns = config_.write_delay_ns - age;
  }
  if (nondurable) {
    u64 age = now - oldest_nondurable_ns_;
    if (age >= config_.flush_delay_ns) return true;
    u64 left = config_.flush_delay_ns - age;
    if (left < *wait_ns) *wait_ns = left;
  }
  return false;
}

void Journal::WriteOpen() {
  Buf* buf = bufs_[open_];
  // A timed flush (nothing durable for flush_delay) or stop makes this entry
  // durable; the last entry before stop also settles everything (ordered).
  if (stop_ || (durable_seq_ < written_seq_ &&
                platform::NowNs() - oldest_nondurable_ns_ >= config_.flush_delay_ns))
    buf->need_flush = true;
  if (stop_) buf->force_ordered = true;
  open_ ^= 1;
  bufs_[open_]->Reset(buf->seq + 1);
  writing_ = true;
  Status st = WriteEntry(buf);  // drops and retakes mu_
  writing_ = false;
  if (!st.ok() && failed_.ok()) {
    failed_ = st;
    platform::Log(platform::LogLevel::kError, "journal: write of entry %llu failed: %s",
                  (unsigned long long)buf->seq, st.Message());
  }
  done_cv_.Broadcast();
}

void Journal::WriterLoop() {
  MutexLock lock(mu_);
  for (;;) {
    if (writing_) {
      // A committer writes an entry (WaitDurable); it wakes us when done.
      writer_parked_ = true;
      cv_.Wait(mu_);
      writer_parked_ = false;
      continue;
    }
    u64 wait_ns;
    if (failed_.ok() && ReadyToWrite(platform::NowNs(), &wait_ns)) {
      WriteOpen();
      continue;
    }
    if (stop_ && (bufs_[open_]->empty() || !failed_.ok())) break;
    if (!failed_.ok()) {
      done_cv_.Broadcast();
      if (stop_) break;
      cv_.Wait(mu_);
      continue;
    }
    if (room_waiters_ > 0) {
      MakeRoom();  // may drop mu_
      if (bufs_[open_]->need_flush) continue;
      if (wait_ns > 50 * platform::kNsPerMs) wait_ns = 50 * platform::kNsPerMs;
    }
    const u64 now = platform::NowNs();
    writer_wakes_ns_ = wait_ns >= platform::kForever - now ? platform::kForever : now + wait_ns;
    (void)cv_.WaitFor(mu_, wait_ns);
    writer_wakes_ns_ = 0;
  }
}

u32 Journal::FreeBuckets(const Ring& r) const {
  u32 n = 0;
  for (u32 b = 0; b < r.nbuckets; b++) {
    if (b != r.cur && r.bucket_seq[b] < durable_last_seq_) n++;
  }
  return n;
}

void Journal::MakeRoom() {
  Buf* open = bufs_[open_];
  u64 last = MinPinnedSeq();
  if (last > open->seq) last = open->seq;
  if (last > durable_last_seq_) {
    // Pins were dropped: the space is reusable once a durable entry records it.
    open->need_flush = true;
    return;
  }
  // Once per change of the recorded last_seq (a reclaim round), or every 50 ms.
  const u64 now = platform::NowNs();
  if (reclaim_fn_ == nullptr) return;
  if (hook_last_seq_ == durable_last_seq_ && now - last_hook_ns_ < 50 * platform::kNsPerMs) return;
  last_hook_ns_ = now;
  hook_last_seq_ = durable_last_seq_;
  stats_.reclaim_calls++;
  auto fn = reclaim_fn_;
  void* ctx = reclaim_ctx_;
  const u64 seq = open->seq;
  mu_.Unlock();
  fn(ctx, seq);
  mu_.Lock();
}

bool Journal::Admits(u32 open_bytes) const {
  u32 sizes[2];
  u32 n = 0;
  if (unplaced_ != nullptr) sizes[n++] = RoundUp(unplaced_->used, kJournalBlock);
  sizes[n++] = RoundUp(open_bytes, kJournalBlock);
  // Place() opens a bucket for an ordinary entry while more than the reserve is
  // free; commits are admitted only while one bucket more stays free, so that
  // kReclaim keys joining their entries cannot push them into the reserve.
  const u32 keep = config_.reserve_buckets + 1;
  const u32 want = Min(replicas_, LiveRings());
  // (No ring left: admitted, and the entry's write fails every commit.)
  if (want == 0) return true;
  u32 fit = 0;
  for (const Ring& r : rings_) {
    if (RingOut(r)) continue;
    u32 free = FreeBuckets(r);
    u32 off = r.cur_reserve ? bucket_size_ : r.offset;
    u32 b = r.cur;
    bool ok = true;
    for (u32 i = 0; i < n && ok; i++) {
      if (off + sizes[i] <= bucket_size_) {
        off += sizes[i];
        continue;
      }
      b = (b + 1) % r.nbuckets;
      ok = free > keep && r.bucket_seq[b] < durable_last_seq_;
      free--;
      off = sizes[i];
    }
    if (ok) fit++;
  }
  return fit >= want;
}

bool Journal::RingOut(const Ring& r) const { return ((devs_->failed() >> r.member) & 1) != 0; }

bool Journal::RingHeld(const Ring& r) const { return write_slots_[r.member].busy.Load(MemOrder::kAcquire) != 0; }

u32 Journal::LiveRings() const {
  u32 n = 0;
  for (const Ring& r : rings_) n += RingOut(r) ? 0 : 1;
  return n;
}

void Journal::LiveRoom(u32* ring_buckets, u32* free_buckets) const {
  bool any = false;
  *ring_buckets = *free_buckets = 0;
  for (const Ring& r : rings_) {
    if (RingOut(r)) continue;
    const u32 f = FreeBuckets(r);
    if (!any || r.nbuckets < *ring_buckets) *ring_buckets = r.nbuckets;
    if (!any || f < *free_buckets) *free_buckets = f;
    any = true;
  }
}

bool Journal::CanPlaceOpen() const {
  const Buf* buf = bufs_[open_];
  const u32 bytes = RoundUp(buf->used, kJournalBlock);
  u32 ring_idx[dev::kMaxDevices];
  u32 nrings;
  if (Choose(bytes, /*allow_reserve=*/false, ring_idx, &nrings)) return true;
  // WriteEntry's second try, for the entries reclaim needs.
  u64 last_seq = MinPinnedSeq();
  if (last_seq > buf->seq) last_seq = buf->seq;
  return (last_seq > durable_last_seq_ || buf->nkeys == 0 || buf->reclaim) &&
         Choose(bytes, /*allow_reserve=*/true, ring_idx, &nrings);
}

bool Journal::Place(u32 bytes, bool allow_reserve, u32* ring_idx, u32* nrings, u64* offsets) {
  bool passed = false;
  if (!Choose(bytes, allow_reserve, ring_idx, nrings, &passed)) return false;
  if (passed) stats_.rings_passed_stalling++;
  for (u32 k = 0; k < *nrings; k++) {
    Ring& r = rings_[ring_idx[k]];
    if (r.offset + bytes > bucket_size_ || (!allow_reserve && r.cur_reserve)) {
      r.cur_reserve = FreeBuckets(r) < config_.reserve_buckets + 1;
      r.cur = (r.cur + 1) % r.nbuckets;
      r.offset = 0;
      r.bucket_seq[r.cur] = 0;
    }
    offsets[k] = sb::kBucketsOffset + (r.first_bucket + r.cur) * u64(bucket_size_) + r.offset;
    r.offset += bytes;
  }
  return true;
}

bool Journal::Choose(u32 bytes, bool allow_reserve, u32* ring_idx, u32* nrings, bool* passed) const {
  // Prefer the rings with the most free space; an entry goes to `replicas_` rings.
  // Only the entries reclaim needs may use the reserve (see journal.h), and a
  // bucket opened from the reserve takes no others.
  // A failed member's ring is out (RingOut): fewer rings then. With more
  // rings than the entry takes, a stalling member's comes after every
  // other (6c-2: the entry's write would wait out the stall).
  // A held ring (RingHeld) is out until its late write completes.
  u32 chosen = 0;
  bool used[dev::kMaxDevices] = {};
  bool stalling[dev::kMaxDevices] = {};
  u32 usable = 0;
  for (u32 i = 0; i < rings_.size(); i++) {
    used[i] = RingOut(rings_[i]) || RingHeld(rings_[i]);
    usable += used[i] ? 0 : 1;
  }
  const u32 want = Min(replicas_, usable);
  if (want == 0) return false;
  if (want < usable)
    for (u32 i = 0; i < rings_.size(); i++)
      stalling[i] = !used[i] && dev::Stalling(devs_->member(rings_[i].member)->queue().GetReadState(/*p99=*/false));
  while (chosen < want) {
    i32 best = -1, roomiest = -1;  // (roomiest: by free space alone)
    for (u32 i = 0; i < rings_.size(); i++) {
      if (used[i]) continue;
      const Ring& r = rings_[i];
      if (RingOut(r)) continue;
      u32 free = FreeBuckets(r);
      bool fits_here = r.offset + bytes <= bucket_size_ && (allow_reserve || !r.cur_reserve);
      u32 next = (r.cur + 1) % r.nbuckets;
      bool next_ok = r.bucket_seq[next] < durable_last_seq_ &&
                     (allow_reserve || free >= config_.reserve_buckets + 1);
      if (!fits_here && !next_ok) continue;
      if (roomiest < 0 || free > FreeBuckets(rings_[roomiest])) roomiest = i32(i);
      if (best < 0 || (stalling[best] && !stalling[i]) ||
          (stalling[best] == stalling[i] && free > FreeBuckets(rings_[best])))
        best = i32(i);
    }
    if (best < 0) return false;
    if (passed != nullptr && roomiest != best && stalling[roomiest]) *passed = true;
    used[best] = true;
    ring_idx[chosen++] = u32(best);
  }
  *nrings = chosen;
  return true;
}

void Journal::SubmitLatched(dev::LatchedIo* ios, u32 n, const u32* members, Status* per, bool skip_failed) {
  u32 go[dev::kMaxDevices];
  u32 ngo = 0;
  for (u32 k = 0; k < n; k++) {
    // (A member marked failed since it was chosen gets nothing: kMissing.)
    per[k] = skip_failed && ((devs_->failed() >> members[k]) & 1) != 0 ? Status(Err::kMissing) : Status::Ok();
    if (per[k].ok()) go[ngo++] = k;
  }
  if (ngo == 0) return;
  Latch latch(ngo);
  for (u32 j = 0; j < ngo; j++) {
    dev::LatchedIo& l = ios[go[j]];
    l.latch = &latch;
    l.err.Store(0, MemOrder::kRelaxed);
    l.io.done = dev::LatchedIo::Done;
    l.io.caller_data = &l;
  }
  // The writer waits for them next: the last I/O may run in this thread.
  for (u32 j = 0; j < ngo; j++)
    devs_->member(members[go[j]])->queue().Submit(&ios[go[j]].io, /*waiting=*/j + 1 == ngo);
  latch.Wait();
  for (u32 j = 0; j < ngo; j++) per[go[j]] = ios[go[j]].status();
}

void Journal::SlotDone(dev::Io* io, Status st) {
  auto* slot = static_cast<IoSlot*>(io->caller_data);
  Journal* j = slot->journal;
  slot->err.Store(i32(st.code()), MemOrder::kRelaxed);
  slot->busy.Store(0, MemOrder::kRelease);  // (the writer may submit in it again from here)
  j->slot_events_.FetchAdd(1, MemOrder::kAcqRel);
  tfs_plat_wake(j->slot_events_.Address(), 0);
  j->slots_busy_.FetchSub(1, MemOrder::kAcqRel);  // (the last touch: Stop waits for it)
}

namespace {

void SubmitInSlot(dev::DeviceSet* devs, u32 member, dev::Io* io, Atomic<i32>* err, Atomic<u32>* busy,
                  Atomic<u32>* slots_busy, bool waiting) {
  err->Store(0, MemOrder::kRelaxed);
  busy->Store(1, MemOrder::kRelease);
  slots_busy->FetchAdd(1, MemOrder::kAcqRel);
  devs->member(member)->queue().Submit(io, waiting);
}

}  // namespace

void Journal::SubmitFlush(u32 member, bool waiting) {
  IoSlot& slot = flush_slots_[member];
  PrepareIo(&slot.io, IoOp::kFlush, 0, nullptr, 0, 0);
  slot.io.done = SlotDone;
  slot.io.caller_data = &slot;
  SubmitInSlot(devs_, member, &slot.io, &slot.err, &slot.busy, &slots_busy_, waiting);
}

DevMask Journal::SlotsOut(const IoSlot* slots, bool late_only) const {
  DevMask out = 0;
  for (u32 i = 0; i < dev::kMaxDevices; i++)
    if (slots[i].busy.Load(MemOrder::kAcquire) != 0 && (!late_only || slots[i].late.Load(MemOrder::kRelaxed) != 0))
      out |= DevMask(1) << i;
  return out;
}

void Journal::NoteLateIos() {
  IoSlot* const lists[] = {flush_slots_, write_slots_};
  for (IoSlot* slots : lists) {
    for (u32 i = 0; i < dev::kMaxDevices; i++) {
      IoSlot& slot = slots[i];
      if (slot.late.Load(MemOrder::kRelaxed) == 0 || slot.busy.Load(MemOrder::kAcquire) != 0) continue;
      slot.late.Store(0, MemOrder::kRelaxed);
      platform::Free(slot.owned);
      slot.owned = nullptr;
      const Status st = Status(Err(slot.err.Load(MemOrder::kRelaxed)));
      if (!st.ok()) devs_->MarkFailed(i, st);
    }
  }
}

void Journal::WriteRings(Buf* buf, u32 bytes, u8 flags, const u32* members, const u64* offsets, u32 n,
                         Status* per, DevMask* late) {
  NoteLateIos();
  *late = 0;
  DevMask mask = 0;
  dev::LateWatch<dev::kMaxDevices> watch;  // (one ring alone is never left: not watched)
  const u64 start = platform::NowNs();
  // Never inline when another ring could take the entry: a stalled member
  // would hold this thread inside Submit; one ring alone may be.
  for (u32 k = 0; k < n; k++) {
    const u32 m = members[k];
    // (A member marked failed since it was chosen gets nothing: kMissing.)
    per[k] = ((devs_->failed() >> m) & 1) != 0 ? Status(Err::kMissing) : Status::Ok();
    if (!per[k].ok()) continue;
    IoSlot& slot = write_slots_[m];
    PrepareIo(&slot.io, IoOp::kWrite, offsets[k], buf->data, bytes, flags);
    slot.io.done = SlotDone;
    slot.io.caller_data = &slot;
    if (n > 1) watch.Start(m, devs_->member(m)->queue(), start);
    mask |= DevMask(1) << m;
    SubmitInSlot(devs_, m, &slot.io, &slot.err, &slot.busy, &slots_busy_, /*waiting=*/n == 1);
  }
  Status got[dev::kMaxDevices];
  DevMask pending = mask, took = 0;
  while (pending != 0) {
    const u32 ev = slot_events_.Load(MemOrder::kAcquire);
    for (u32 m : dev::Bits(pending)) {
      if (write_slots_[m].busy.Load(MemOrder::kAcquire) != 0) continue;
      got[m] = Status(Err(write_slots_[m].err.Load(MemOrder::kRelaxed)));
      pending &= ~(DevMask(1) << m);
      if (got[m].ok() && ((devs_->failed() >> m) & 1) == 0) took |= DevMask(1) << m;
    }
    if (pending == 0) break;
    // Once a ring took the entry, the others are waited for up to their
    // members' late bounds; past it, one is given up if its member is
    // stalling (else its bound starts again).
    const u64 deadline = took != 0 && *late == 0 ? watch.Deadline(pending) : platform::kForever;
    const u64 now = platform::NowNs();
    if (now >= deadline) {
      for (u32 m : dev::Bits(watch.Late(pending, now))) {
        if (*late != 0) continue;
        // The write reads buf's bytes until it completes: they become its
        // slot's, and buf gets a fresh copy (none: waited for).
        u8* fresh = static_cast<u8*>(platform::Alloc(config_.max_entry_bytes, kJournalBlock));
        if (fresh == nullptr) {
          watch.Restart(m, now);
          continue;
        }
        MemCopy(fresh, buf->data, bytes);
        write_slots_[m].owned = buf->data;
        write_slots_[m].late.Store(1, MemOrder::kRelaxed);
        buf->data = fresh;
        *late = DevMask(1) << m;
        got[m] = Err::kIoTimeout;
        pending &= ~*late;
      }
      continue;
    }
    tfs_plat_wait(slot_events_.Address(), ev, deadline == platform::kForever ? platform::kForever : deadline - now);
  }
  for (u32 k = 0; k < n; k++)
    if (per[k].ok()) per[k] = got[members[k]];
}

Status Journal::PreFlush(DevMask want, DevMask needed, DevMask* given_up, DevMask* late) {
  NoteLateIos();
  const DevMask skip = want & devs_->failed() & ~needed;
  DevMask mask = want & ~skip;
  *given_up = skip;
  *late = 0;
  if (mask == 0) return Status::Ok();
  // One member may be given up late (6c-2), when nothing else is and a
  // read verifies every copy it would serve instead.
  const bool may_leave = verified_ && skip == 0;
  DevMask again = 0;  // an earlier flush still out: waited for, then flushed again
  for (u32 i : dev::Bits(mask & SlotsOut(flush_slots_))) {
    const DevMask bit = DevMask(1) << i;
    if (may_leave && *late == 0 && (needed & bit) == 0) {
      *late = bit;  // (still stuck: given up again at once)
    } else {
      again |= bit;
    }
  }
  mask &= ~*late;
  // Those that may be left are never done inline (a stalled member would
  // hold this thread inside Submit); the last needed one may be.
  const DevMask leavable = may_leave && *late == 0 ? mask & ~needed & ~again : 0;
  dev::LateWatch<dev::kMaxDevices> watch;
  const u64 start = platform::NowNs();
  for (u32 i : dev::Bits(leavable)) {
    watch.Start(i, devs_->member(i)->queue(), start);
    SubmitFlush(i, /*waiting=*/false);
  }
  const DevMask rest = mask & ~leavable & ~again;
  u32 left = PopCount(rest);
  for (u32 i : dev::Bits(rest)) SubmitFlush(i, /*waiting=*/--left == 0);
  Status per[dev::kMaxDevices];
  DevMask pending = mask;
  while (pending != 0) {
    const u32 ev = slot_events_.Load(MemOrder::kAcquire);
    for (u32 i : dev::Bits(pending)) {
      const DevMask bit = DevMask(1) << i;
      if (flush_slots_[i].busy.Load(MemOrder::kAcquire) != 0) continue;
      if ((again & bit) != 0) {  // (its earlier flush is done: its result, then this entry's)
        again &= ~bit;
        IoSlot& slot = flush_slots_[i];
        const Status old = Status(Err(slot.err.Load(MemOrder::kRelaxed)));
        if (slot.late.Load(MemOrder::kRelaxed) != 0) slot.late.Store(0, MemOrder::kRelaxed);
        if (!old.ok()) {  // (data the entry needs there may be gone: as this flush failing)
          per[i] = old;
          pending &= ~bit;
          continue;
        }
        SubmitFlush(i, /*waiting=*/false);
        continue;
      }
      per[i] = Status(Err(flush_slots_[i].err.Load(MemOrder::kRelaxed)));
      pending &= ~bit;
    }
    if (pending == 0) break;
    // A leavable flush past its bound is given up only while its member
    // is stalling: a busy member's queue may simply not have sent it yet
    // (its bound starts again).
    const u64 deadline = *late == 0 ? watch.Deadline(pending & leavable) : platform::kForever;
    const u64 now = platform::NowNs();
    if (now >= deadline) {
      for (u32 i : dev::Bits(watch.Late(pending & leavable, now))) {
        if (*late != 0) continue;
        flush_slots_[i].late.Store(1, MemOrder::kRelaxed);
        *late = DevMask(1) << i;
        pending &= ~*late;
      }
      continue;
    }
    tfs_plat_wait(slot_events_.Address(), ev, deadline == platform::kForever ? platform::kForever : deadline - now);
  }
  *given_up |= *late;
  Status first, fatal;
  for (u32 i : dev::Bits(mask & ~*late)) {
    if (per[i].ok()) continue;
    const DevMask bit = DevMask(1) << i;
    devs_->MarkFailed(i, per[i]);  // (every one marked, before deciding)
    if (first.ok()) first = per[i];
    if ((devs_->failed() & bit) != 0 && (needed & bit) == 0) {
      *given_up |= bit;
    } else if (fatal.ok()) {
      fatal = per[i];  // (its only copies may be gone: the entry must not say they are durable)
    }
  }
  if (!fatal.ok()) return fatal;
  if (PopCount(*given_up) >= 2) return first.ok() ? Status(Err::kIo) : first;
  return Status::Ok();
}

bool Journal::WaitHeldRing(bool any) {
  const u32 ev = slot_events_.Load(MemOrder::kAcquire);  // (before looking: a write ending meanwhile wakes)
  bool free_ring = false;
  for (const Ring& r : rings_) free_ring |= !RingOut(r) && !RingHeld(r);
  if (free_ring && !any) return false;
  if ((SlotsOut(write_slots_, /*late_only=*/true) & ~devs_->failed()) == 0) return !free_ring;  // (one ended: again)
  mu_.Unlock();
  tfs_plat_wait(slot_events_.Address(), ev, 50 * platform::kNsPerMs);
  NoteLateIos();  // (without mu_, as every MarkFailed; the writer's role is held)
  mu_.Lock();
  return true;
}

// Find ring space. Commits were admitted only with room for their entries
// (Admits), so this normally succeeds at once. Entries reclaim needs may use
// the reserve: an empty (flush) entry, one with kReclaim commits, and one made
// durable to record a newer last_seq, which frees ring space. Otherwise, if
// pins hold the space, ask owners to persist and drop them. `built`: the
// entry's header is written already (a second placement after every ring
// it went to failed: 5c-3) -- the reserve or nothing (kIo), or a held
// ring once its late write ends (6c-2).
Status Journal::PlaceEntry(Buf* buf, u32 bytes, bool built, u64* last_seq, u32* ring_idx, u32* nrings,
                           u64* offsets) {
  for (;;) {
    if (LiveRings() == 0) return Err::kIo;  // (every ring's member failed: no room will come)
    if (Place(bytes, /*allow_reserve=*/false, ring_idx, nrings, offsets)) return Status::Ok();
    // Every live ring held by a late write (6c-2): not a want of space --
    // wait for one to complete (or fail: then its member is out).
    if (WaitHeldRing(/*any=*/false)) continue;
    if (built) {
      // An entry already admitted and written once: the reserve, as the
      // entries reclaim needs; never a wait -- only this writer could write
      // the durable entry that frees ring space (review helper-73) -- but
      // for a held ring's late write to end (review helper-81).
      if (Place(bytes, /*allow_reserve=*/true, ring_idx, nrings, offsets)) {
        stats_.reserve_entries++;
        return Status::Ok();
      }
      if (WaitHeldRing(/*any=*/true)) continue;
      return Err::kIo;
    }
    const bool advances = *last_seq > durable_last_seq_;
    if (advances || buf->nkeys == 0 || buf->reclaim) {
      if (advances) buf->need_flush = true;
      if (Place(bytes, /*allow_reserve=*/true, ring_idx, nrings, offsets)) {
        stats_.reserve_entries++;
        return Status::Ok();
      }
    }
    stats_.space_waits++;
    auto fn = reclaim_fn_;
    void* ctx = reclaim_ctx_;
    stats_.reclaim_calls++;
    mu_.Unlock();
    if (fn != nullptr) fn(ctx, buf->seq);
    mu_.Lock();
    u64 new_last = MinPinnedSeq();
    if (new_last > buf->seq) new_last = buf->seq;
    // Nothing released: wait for a pin drop (PinDrop wakes done_cv_) or a timeout.
    if (new_last == *last_seq) (void)done_cv_.WaitFor(mu_, 50 * platform::kNsPerMs);
    *last_seq = MinPinnedSeq();
    if (*last_seq > buf->seq) *last_seq = buf->seq;
  }
}

Status Journal::WriteEntry(Buf* buf) {
  // Called with mu_ held; drops it for I/O.
  u32 bytes = RoundUp(buf->used, kJournalBlock);
  u64 last_seq = MinPinnedSeq();
  if (last_seq > buf->seq) last_seq = buf->seq;
  u32 ring_idx[dev::kMaxDevices];
  u64 offsets[dev::kMaxDevices];
  u32 nrings = 0;
  unplaced_ = buf;
  Status pst = PlaceEntry(buf, bytes, /*built=*/false, &last_seq, ring_idx, &nrings, offsets);
  if (!pst.ok()) {
    unplaced_ = nullptr;
    return pst;
  }
  unplaced_ = nullptr;

  const bool flush = buf->need_flush;
  DevMask preflush = 0;
  if (flush) preflush = (pending_deps_ | buf->deps | nonfua_written_) & devs_->DebtMask();
  // What has its only copy on one member: data (the commits' sole deps)
  // and entries written to one ring, since the last durable entry. A failed
  // member is flushed only for these (PreFlush).
  const DevMask needed = pending_sole_ | buf->sole | nonfua_sole_;
#ifdef TIERFS_PLANT_PREFLUSH_ALL
  // The lab's planted regression (CMake TIERFS_PLANT_PREFLUSH_ALL, never in a
  // real build): every durable entry pre-flushes every member, the slow ones too.
  if (flush) preflush = devs_->size() >= 8 * sizeof(DevMask) ? ~DevMask(0) : (DevMask(1) << devs_->size()) - 1;
#endif
  // Unordered (write, then flush the entry and what it depends on together) saves
  // the pre-flush round trip when there is one to save, and only if replay can tell
  // whether the group's data made it: every commit since the last durable entry
  // is dependency-free or carries data checks, within the bytes replay may read.
  // Never when a member to flush is marked failed (5c-3): its flush may be
  // skipped or given up, and replay would then check the group's data and
  // find the copy there missing (review helper-72) -- nor when one has a
  // flush given up late still out (6c-2: it would be given up again).
  DevMask ring_members = 0;
  for (u32 k = 0; k < nrings; k++) ring_members |= DevMask(1) << rings_[ring_idx[k]].member;
  bool unordered = flush && preflush != 0 && !buf->force_ordered && !stop_ && !pending_unchecked_ &&
                   !buf->unchecked && pending_check_bytes_ + buf->check_bytes <= config_.max_unordered_check_bytes &&
                   ((preflush | ring_members) & (devs_->failed() | SlotsOut(flush_slots_))) == 0;

  // Fill in the header; zero the padding; checksum.
  auto* h = reinterpret_cast<EntryHeader*>(buf->data);
  MemSet(h, 0, sizeof(*h));
  h->magic.set(magic_);
  h->version.set(kJournalVersion);
  h->flags.set(flush ? u16(kEntryFlush | (unordered ? kEntryUnordered : 0)) : u16(0));
  h->seq.set(buf->seq);
  h->last_seq.set(last_seq);
  h->roots_gen.set(roots_gen_.Load(MemOrder::kAcquire));
  h->bytes.set(bytes);
  h->payload_bytes.set(buf->used - u32(sizeof(EntryHeader)));
  h->nkeys.set(buf->nkeys);
  MemSet(buf->data + buf->used, 0, bytes - buf->used);
  h->csum.set(platform::Crc32cSkippingField(buf->data, bytes, __builtin_offsetof(EntryHeader, csum)));

  for (u32 i : dev::Bits(preflush)) stats_.preflushes[i]++;
  mu_.Unlock();

  DevMask given_up = 0, late = 0;
  bool stats_rewritten = false;  // (an unordered entry written again, ordered)
  Status st = unordered ? Status::Ok() : PreFlush(preflush, needed, &given_up, &late);
  // Each ring's write on its own: one that fails with a device error marks
  // its member failed (5c-3) and leaves the ring set; the entry counts
  // written when a ring whose member is not failed took it (degraded then,
  // as a missing ring's); when every ring chosen failed so, the rings left
  // take it. A ring that failed without its member being marked stays in
  // the set lacking this entry: the entry fails, as always.
  Status per[dev::kMaxDevices];
  u32 took = 0, ring_errors = 0;
  DevMask took_mask = 0;
  DevMask ring_late = 0;  // (a ring write given up late: 6c-2)
  while (st.ok()) {
    u32 members[dev::kMaxDevices];
    for (u32 k = 0; k < nrings; k++) members[k] = rings_[ring_idx[k]].member;
    DevMask this_late = 0;
    WriteRings(buf, bytes, flush && !unordered ? IoRequest::kFua : 0, members, offsets, nrings, per, &this_late);
    h = reinterpret_cast<EntryHeader*>(buf->data);  // (a late write keeps the bytes it reads: buf has a copy)
    ring_late |= this_late;
    Status ring_error;
    for (u32 k = 0; k < nrings && st.ok(); k++) {
      const DevMask bit = DevMask(1) << members[k];
      if ((this_late & bit) != 0) continue;  // (not taken; its member is well but slow: not marked)
      if (per[k].code() == Err::kMissing && (devs_->failed() & bit) != 0) {
        if (ring_error.ok()) ring_error = Err::kIo;  // (not written: marked after it was chosen)
      } else if (!per[k].ok()) {
        ring_errors++;
        if (ring_error.ok()) ring_error = per[k];
        devs_->MarkFailed(members[k], per[k]);
        if ((devs_->failed() & bit) == 0) st = per[k];
      } else if ((devs_->failed() & bit) != 0) {
        per[k] = Status(Err::kIo);  // (written, but to a member marked meanwhile: not counted)
      } else {
        took++;
        took_mask |= bit;
      }
    }
    if (!st.ok() || took > 0) break;
    // Every ring it went to failed, each marked: placed again on the rings
    // left (PlaceEntry: their reserve if need be, never a wait).
    mu_.Lock();
    u64 header_last = last_seq;
    unplaced_ = buf;  // (Admits counts it while placed again)
    st = PlaceEntry(buf, bytes, /*built=*/true, &header_last, ring_idx, &nrings, offsets);
    unplaced_ = nullptr;
    mu_.Unlock();
    if (!st.ok() && !ring_error.ok()) st = ring_error;
  }
  if (st.ok() && unordered) {
    // (This entry's only copy, if one ring took it, is needed too.)
    DevMask more = 0;
    st = PreFlush(preflush | took_mask, needed | (took == 1 ? took_mask : 0), &more, &late);
    given_up |= more;
    // Something given up: replay would check this entry's group (it is
    // unordered) and find the copies there missing, dropping an entry its
    // fsyncs were told is durable. Written again in place, ordered (FUA):
    // replay trusts it, and the reads of those copies fall back.
    if (st.ok() && more != 0) {
      h->flags.set(u16(kEntryFlush));
      h->csum.set(platform::Crc32cSkippingField(buf->data, bytes, __builtin_offsetof(EntryHeader, csum)));
      // To the rings that took it whose member is not failed (the one
      // given up is: it keeps the unordered copy, and replay prefers the
      // ordered one of a seq); as the first write, a ring that fails marks
      // its member, and one live ring taking it is enough.
      // (Nor to a member given up late, 6c-2: it is well but stalling, and
      // the rewrite would wait it out.)
      u32 members[dev::kMaxDevices];
      u32 n = 0;
      for (u32 k = 0; k < nrings; k++) {
        if (!per[k].ok() || ((more >> rings_[ring_idx[k]].member) & 1) != 0) continue;
        PrepareIo(&write_ios_[n].io, IoOp::kWrite, offsets[k], buf->data, bytes, IoRequest::kFua);
        members[n++] = rings_[ring_idx[k]].member;
      }
      Status again[dev::kMaxDevices];
      SubmitLatched(write_ios_, n, members, again, /*skip_failed=*/true);
      u32 ordered = 0;
      Status rewrite_error = Err::kIo;
      for (u32 j = 0; j < n; j++) {
        const DevMask bit = DevMask(1) << members[j];
        if (again[j].ok() && (devs_->failed() & bit) == 0) {
          ordered++;
          continue;
        }
        if (again[j].code() == Err::kMissing) continue;  // (skipped: failed)
        if (!again[j].ok()) {
          rewrite_error = again[j];
          devs_->MarkFailed(members[j], again[j]);
          if ((devs_->failed() & bit) == 0) st = again[j];  // (a live ring with the unordered copy only)
        }
      }
      if (st.ok() && ordered == 0) st = rewrite_error;
      unordered = false;
      stats_rewritten = true;
    }
  }

  mu_.Lock();
  if (!st.ok()) return st;
  for (u32 k = 0; k < nrings; k++) {
    if (!per[k].ok()) continue;
    Ring& r = rings_[ring_idx[k]];
    r.bucket_seq[r.cur] = buf->seq;
  }
  stats_.flushes_given_up += PopCount(given_up & ~late);
  stats_.flushes_late += PopCount(late);
  stats_.ring_writes_late += PopCount(ring_late);
  if (stats_rewritten) stats_.rewritten_ordered++;
  written_seq_ = buf->seq;
  stats_.entries++;
  stats_.ring_write_errors += ring_errors;
  if (took < wanted_replicas_) stats_.degraded_entries++;
  stats_.bytes += u64(bytes) * took;
  if (buf->ncommits > stats_.max_group) stats_.max_group = buf->ncommits;
  if (flush) {
    stats_.flush_entries++;
    // An unordered entry settles the group before it; its own group settles
    // with the next durable entry (replay then no longer checks its data).
    if (unordered) stats_.unordered_entries++;
    settled_seq_ = unordered ? durable_seq_ : buf->seq;
    pending_unchecked_ = false;
    pending_check_bytes_ = 0;
    durable_seq_ = buf->seq;
    durable_last_seq_ = last_seq;
    pending_deps_ = 0;
    pending_sole_ = 0;
    nonfua_written_ = 0;
    nonfua_sole_ = 0;
    oldest_nondurable_ns_ = 0;
  } else {
    pending_unchecked_ |= buf->unchecked;
    pending_check_bytes_ += buf->check_bytes;
    pending_deps_ |= buf->deps;
    pending_sole_ |= buf->sole;
    nonfua_written_ |= took_mask;
    if (took == 1) nonfua_sole_ |= took_mask;
    if (oldest_nondurable_ns_ == 0) oldest_nondurable_ns_ = platform::NowNs();
  }
  PublishRoom();
  return Status::Ok();
}

void Journal::PublishRoom() {
  u32 ring = 0, free = 0;
  LiveRoom(&ring, &free);
  room_.Store((u64(ring) << 32) | free, MemOrder::kRelease);
}

void Journal::Room(u32* free_buckets, u32* ring_buckets) const {
  const u64 v = room_.Load(MemOrder::kAcquire);
  *ring_buckets = u32(v >> 32);
  *free_buckets = u32(v);
}

}  // namespace tfs::journal
