// Per-device I/O queue with priority classes, slot reservation, readahead
// admission, origin accounting, stall detection and durability-debt tracking
// (see io_queue.h and docs/design/io-queues.md).
//
// Invariants: in_flight_ <= max_in_flight (deferred_ I/Os count: their slot is
// taken); I/Os of classes below kForegroundAsync never push in_flight_ past
// max_in_flight - reserved; a queued I/O never waits while a slot its class may
// use is free (every completion and every submission re-runs TakeRunnable).
// mu_ is dropped before calling the device or a callback. A completion takes
// no sleeping lock, allocates nothing, and on a device whose completions may
// not submit (defer_) sends nothing to it: deferred_ and dispatch_work_ do.
#include "dev/io_queue.h"

#include "platform/platform.h"

namespace tfs::dev {

const char* IoClassName(IoClass c) {
  switch (c) {
    case IoClass::kForegroundSync: return "foreground_sync";
    case IoClass::kJournal: return "journal";
    case IoClass::kForegroundAsync: return "foreground_async";
    case IoClass::kBtree: return "btree";
    case IoClass::kBackground: return "background";
    case IoClass::kReadahead: return "readahead";
  }
  return "unknown";
}

IoClass DefaultClass(IoOrigin origin) {
  switch (origin) {
    case IoOrigin::kForegroundRead:
    case IoOrigin::kForegroundWrite:
    case IoOrigin::kFsck:
      return IoClass::kForegroundSync;
    case IoOrigin::kJournal:
      return IoClass::kJournal;
    case IoOrigin::kBtree:
    case IoOrigin::kSuperblock:
    case IoOrigin::kAlloc:  // (unused since the alloc btree: as btree nodes, if ever)
      return IoClass::kBtree;
    case IoOrigin::kReconcile:
    case IoOrigin::kPromote:
    case IoOrigin::kCopygc:
      return IoClass::kBackground;
    case IoOrigin::kReadahead:
      return IoClass::kReadahead;
    case IoOrigin::kOther:
      return IoClass::kForegroundAsync;
  }
  return IoClass::kForegroundAsync;
}

IoQueue::~IoQueue() {
  // (The last completion may have queued the dispatch work for nothing.)
  if (defer_) work_->Cancel(&dispatch_work_);
  if (stats_ != nullptr) {
    SpinGuard lock(mu_);
    TFS_BUG_ON(in_flight_ != 0 || queued_ != 0 || !deferred_.empty());
  }
  for (int i = 0; stats_ != nullptr && i < kIoOriginCount; i++) stats_[i].~OriginStats();
  platform::Free(stats_);
}

Status IoQueue::Init(BlockDevice* bdev, const QueueConfig& config, WorkQueue* work) {
  if (bdev == nullptr || config.max_in_flight == 0 || config.reserved >= config.max_in_flight ||
      config.readahead_max_in_flight == 0)
    return Err::kInvalidArgument;
  const bool defer = !bdev->Info().completions_may_submit;
  if (defer && work == nullptr) return Err::kInvalidArgument;
  bdev_ = bdev;
  config_ = config;
  defer_ = defer;
  work_ = work;
  dispatch_work_.fn = DispatchDeferred;
  dispatch_work_.arg = this;
  stats_ = static_cast<OriginStats*>(
      platform::Alloc(sizeof(OriginStats) * kIoOriginCount, alignof(OriginStats)));
  if (stats_ == nullptr) return Err::kNoMemory;
  for (int i = 0; i < kIoOriginCount; i++) {
    new (&stats_[i]) OriginStats();
    MemSet(stats_[i].ops, 0, sizeof(stats_[i].ops));
    MemSet(stats_[i].bytes, 0, sizeof(stats_[i].bytes));
    stats_[i].errors = 0;
  }
  return Status::Ok();
}

bool IoQueue::SlotAvailable(IoClass c) const {
  u32 limit = config_.max_in_flight;
  if (c > IoClass::kForegroundAsync) limit -= config_.reserved;
  return in_flight_ < limit;
}

void IoQueue::MarkDispatched(Io* io, u64 now) {
  if (in_flight_ == 0) busy_since_ns_ = now;
  in_flight_++;
  dispatched_.PushBack(io);
  io->dispatch_ns = now;
  if (io->req.op == IoOp::kFlush) io->flush_gen = write_gen_.Load(MemOrder::kAcquire);
  OriginStats& s = stats_[u8(io->req.origin) % kIoOriginCount];
  s.queue_time.Record(now - io->enqueue_ns);
}

void IoQueue::TakeRunnable(IntrusiveList<Io, &Io::link>* out) {
  u64 now = 0;
  for (int c = 0; c < kIoClassCount; c++) {
    while (!queues_[c].empty() && SlotAvailable(IoClass(c))) {
      if (now == 0) now = platform::NowNs();
      Io* io = queues_[c].PopFront();
      queued_--;
      MarkDispatched(io, now);
      out->PushBack(io);
    }
  }
}

void IoQueue::Dispatch(IntrusiveList<Io, &Io::link>* ready) {
  while (Io* io = ready->PopFront()) bdev_->Submit(&io->req);
}

void IoQueue::Submit(Io* io, bool waiting) { SubmitAs(io, waiting ? IoRequest::kInline : 0); }

void IoQueue::SubmitFlight(Io* io) { SubmitAs(io, IoRequest::kWaited); }

void IoQueue::SubmitAs(Io* io, u8 own_flag) {
  TFS_MAY_SLEEP("IoQueue::Submit");  // (a completion hands its next I/O to work)
  io->queue = this;
  io->req.done = OnComplete;
  io->req.caller_data = io;
  io->fua_phase = 0;
  io->req.flags &= u8(~(IoRequest::kInline | IoRequest::kWaited));
  if (io->req.op == IoOp::kWrite && (io->req.flags & IoRequest::kFua) &&
      !bdev_->Info().supports_fua) {
    io->req.flags &= u8(~IoRequest::kFua);
    io->fua_phase = 1;
  }
  IntrusiveList<Io, &Io::link> ready;
  {
    SpinGuard lock(mu_);
    io->enqueue_ns = platform::NowNs();
    queues_[u8(io->cls) % kIoClassCount].PushBack(io);
    queued_++;
    TakeRunnable(&ready);
  }
  // A waiting submitter's own request, dispatched here in its own thread (not
  // queued for a completion to dispatch later), may run inline in the device
  // (kInline) or go to the thread's own completion context (kWaited). It
  // goes last, so the others in `ready` are not held up behind it.
  if (own_flag != 0) {
    bool mine = false;
    IntrusiveList<Io, &Io::link> others;
    while (Io* r = ready.PopFront()) {
      if (r == io) {
        mine = true;
      } else {
        others.PushBack(r);
      }
    }
    Dispatch(&others);
    if (mine) {
      io->req.flags |= own_flag;
      bdev_->Submit(&io->req);
    }
    return;
  }
  Dispatch(&ready);
}

Status IoQueue::SubmitReadahead(Io* io) {
  TFS_MAY_SLEEP("IoQueue::SubmitReadahead");
  io->cls = IoClass::kReadahead;
  io->queue = this;
  io->req.done = OnComplete;
  io->req.caller_data = io;
  io->fua_phase = 0;
  {
    SpinGuard lock(mu_);
    u64 now = platform::NowNs();
    if (queued_ > 0 || in_flight_ >= config_.readahead_max_in_flight ||
        !SlotAvailable(IoClass::kReadahead) || StalledLocked(now)) {
      readahead_declined_++;
      return Err::kNotAdmitted;
    }
    io->enqueue_ns = now;
    MarkDispatched(io, now);
  }
  bdev_->Submit(&io->req);
  return Status::Ok();
}

void IoQueue::OnComplete(IoRequest* req, Status st) {
  Io* io = static_cast<Io*>(req->caller_data);
#if TFS_LOCK_CHECKS
  // The whole completion, done callback included, must not sleep: the
  // kernel may run it in interrupt context.
  platform::NoSleepEnter();
  io->queue->Complete(io, st);
  platform::NoSleepLeave();
#else
  io->queue->Complete(io, st);
#endif
}

void IoQueue::Complete(Io* io, Status st) {
  u64 now = platform::NowNs();
  const IoOp op = io->req.op;
  if (op == IoOp::kWrite) io->flush_gen = 0;  // (FUA or failed: nothing for a flush to cover)
  if (st.ok()) {
    if (op == IoOp::kWrite && !(io->req.flags & IoRequest::kFua)) {
      io->flush_gen = write_gen_.FetchAdd(1, MemOrder::kAcqRel) + 1;
    } else if (op == IoOp::kFlush) {
      // Covers every write that had completed when the flush was dispatched.
      u64 covered = io->flush_gen;
      u64 cur = flushed_gen_.Load(MemOrder::kAcquire);
      while (cur < covered && !flushed_gen_.CompareExchange(cur, covered, MemOrder::kAcqRel)) {
      }
    }
  }
  io->req.flags &= u8(~(IoRequest::kInline | IoRequest::kWaited));  // (a flush continuing it runs from here)
  bool continue_as_flush = st.ok() && io->fua_phase == 1;
  IntrusiveList<Io, &Io::link> ready;
  bool kick = false;  // deferred_ has I/Os for dispatch_work_
  {
    SpinGuard lock(mu_);
    u64 service = now - io->dispatch_ns;
    OriginStats& s = stats_[u8(io->req.origin) % kIoOriginCount];
    s.ops[u8(op) % kIoOpCount]++;
    if (op != IoOp::kFlush) s.bytes[u8(op) % kIoOpCount] += io->req.length;
    if (!st.ok()) s.errors++;
    s.service_time.Record(service);
    if (op == IoOp::kRead) read_window_.Record(service);
    latency_ewma_ns_ = latency_ewma_ns_ == 0
                           ? service
                           : u64(i64(latency_ewma_ns_) + (i64(service) - i64(latency_ewma_ns_)) / 8);
    last_completion_ns_ = now;
    const usize deferred_before = deferred_.size();
    if (continue_as_flush) {
      // Keep the slot: the same Io now flushes what it wrote.
      io->fua_phase = 2;
      io->req.op = IoOp::kFlush;
      io->flush_gen = write_gen_.Load(MemOrder::kAcquire);
      io->dispatch_ns = now;
      dispatched_.Remove(io);  // (a request at the device from now: dispatched_ stays in dispatch order)
      dispatched_.PushBack(io);
      if (defer_) deferred_.PushBack(io);
    } else {
      in_flight_--;
      dispatched_.Remove(io);
      TakeRunnable(defer_ ? &deferred_ : &ready);
    }
    const usize added = deferred_.size() - deferred_before;
    deferred_dispatches_ += added;
    kick = added != 0;
  }
  // (Queued after the unlock: a worker already sending deferred_ may take
  // these too, and then runs once more for nothing.)
  if (kick) work_->Queue(&dispatch_work_);
  if (continue_as_flush) {
    if (!defer_) bdev_->Submit(&io->req);
    return;
  }
  if (io->fua_phase != 0) {  // (done, or its write part failed: back as the caller submitted it)
    io->req.op = IoOp::kWrite;
    io->req.flags |= IoRequest::kFua;
    io->fua_phase = 0;
    io->flush_gen = 0;  // (a FUA write's)
  }
  Dispatch(&ready);
  io->done(io, st);
}

void IoQueue::DispatchDeferred(void* self) {
  auto* q = static_cast<IoQueue*>(self);
  IntrusiveList<Io, &Io::link> ready;
  {
    SpinGuard lock(q->mu_);
    while (Io* io = q->deferred_.PopFront()) ready.PushBack(io);
  }
  q->Dispatch(&ready);
}

bool IoQueue::StalledLocked(u64 now) const {
  if (in_flight_ == 0) {
    stall_seen_ = false;
    return false;
  }
  u64 since = last_completion_ns_ > busy_since_ns_ ? last_completion_ns_ : busy_since_ns_;
  bool stalled = now > since && now - since > config_.stall_threshold_ns;
  if (stalled && !stall_seen_) stall_events_++;
  stall_seen_ = stalled;
  return stalled;
}

bool IoQueue::Stalled() const {
  SpinGuard lock(mu_);
  return StalledLocked(platform::NowNs());
}

ReadState IoQueue::GetReadState(bool p99) const {
  SpinGuard lock(mu_);
  const u64 now = platform::NowNs();
  ReadState r;
  if (p99) r.p99_ns = read_window_.Quantile(99, 100);
  r.samples = read_window_.samples();
  r.ewma_ns = latency_ewma_ns_;
  // (A flush is left out: a healthy device's flush can take long -- a
  // file's fsync under load -- while its reads and writes go on.)
  const Io* oldest = dispatched_.front();
  while (oldest != nullptr && oldest->req.op == IoOp::kFlush) oldest = dispatched_.Next(const_cast<Io*>(oldest));
  if (oldest != nullptr && now > oldest->dispatch_ns) r.oldest_ns = now - oldest->dispatch_ns;
  r.in_flight = in_flight_;
  r.queued = queued_;
  r.stalled = StalledLocked(now);
  return r;
}

u64 LatencyWindow::Quantile(u32 num, u32 den) const {
  if (n_ == 0 || den == 0) return 0;
  // The rank from the top: the k-th largest, k = n - ceil(n * num / den) + 1.
  const u64 need = Min<u64>((u64(n_) * num + den - 1) / den, n_);  // (num > den: the max)
  const u64 k = u64(n_) + 1 - (need == 0 ? 1 : need);
  constexpr u32 kTop = 4;
  const u64 rank = Min<u64>(k, kTop);  // (a lower quantile: the 4th largest, an overestimate)
  u64 top[kTop] = {};                  // the largest values, descending
  u32 have = 0;
  for (u32 i = 0; i < n_; i++) {
    const u64 v = v_[i];
    if (have == kTop && v <= top[kTop - 1]) continue;
    u32 j = have < kTop ? have++ : kTop - 1;
    for (; j > 0 && top[j - 1] < v; j--) top[j] = top[j - 1];
    top[j] = v;
  }
  return top[rank - 1];
}

QueueState IoQueue::State() const {
  SpinGuard lock(mu_);
  QueueState s;
  s.in_flight = in_flight_;
  s.queued = queued_;
  s.latency_ewma_ns = latency_ewma_ns_;
  s.stalled = StalledLocked(platform::NowNs());
  s.durability_debt = HasDurabilityDebt();
  s.readahead_declined = readahead_declined_;
  s.stall_events = stall_events_;
  s.deferred_dispatches = deferred_dispatches_;
  return s;
}

void IoQueue::ReadStats(IoOrigin origin, OriginStats* out) const {
  SpinGuard lock(mu_);  // (two histograms' copies: bounded)
  const OriginStats& s = stats_[u8(origin) % kIoOriginCount];
  MemCopy(out->ops, s.ops, sizeof(s.ops));
  MemCopy(out->bytes, s.bytes, sizeof(s.bytes));
  out->errors = s.errors;
  out->queue_time.Reset();
  out->queue_time.Merge(s.queue_time);
  out->service_time.Reset();
  out->service_time.Merge(s.service_time);
}

void IoBatch::Done(Io* io, Status st) {
  auto* b = static_cast<IoBatch*>(io->caller_data);
  if (!st.ok()) {
    i32 zero = 0;
    b->first_error.CompareExchange(zero, i32(st.code()));
  }
  b->latch.CountDown();
}

Status IoBatch::Wait() {
  latch.Wait();
  return Status(Err(first_error.Load()));
}

void LatchedIo::Done(Io* io, Status st) {
  auto* l = static_cast<LatchedIo*>(io->caller_data);
  Latch* latch = l->latch;
  l->err.Store(i32(st.code()), MemOrder::kRelease);
  latch->CountDown();
}

Status SubmitAndWait(IoQueue& queue, Io* io) {
  IoBatch batch(1);
  io->caller_data = &batch;
  io->done = IoBatch::Done;
  queue.Submit(io, /*waiting=*/true);
  return batch.Wait();
}

Status QueueSyncIo(IoQueue& queue, IoOp op, u64 offset, void* buf, u64 length, u8 flags,
                   IoOrigin origin) {
  Io io;
  io.req.op = op;
  io.req.flags = flags;
  io.req.origin = origin;
  io.req.offset = offset;
  io.req.length = length;
  io.req.buf = buf;
  io.cls = DefaultClass(origin);
  return SubmitAndWait(queue, &io);
}

}  // namespace tfs::dev
