// The fault device engine (see device.h for the request path).
//
// Every request becomes an Op owned by the device. An Op is freed when its
// reference count drops to zero; references are held by the caller's pending
// callback, the backing I/O in flight, the drive model, and each timer event that
// names the Op. So a timer that fires after a forced completion still finds its Op
// alive, and the destructor can wait for every Op to be gone before stopping the
// timer (no leak, no use after free, even after a link reset or power cut).
//
// Work found under mu_ that must not run under it -- caller callbacks and
// submissions to the backing device (which may complete inline and re-enter) --
// is collected in an Actions list and run by Run() after mu_ is released.
//
// Volatile cache write-back is serialised (one at a time) and always retires a
// prefix of the cache (see cache.h): a flush waits for a write-back that covers
// every write cached before it, then a backing flush.
#include "faultdevices/device.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "platform/block_device.h"  // SyncIo
#include "userspace/platform/uring_device.h"

namespace faultdev {

using tfs::IoOp;
using tfs::IoRequest;
using tfs::Status;
using tfs::Err;

struct FaultDevice::Op {
  FaultDevice* dev = nullptr;
  IoRequest* req = nullptr;
  IoRequest below;  // our own request to the backing device
  uint64_t submit_ns = 0;
  uint64_t admit_ns = 0;
  uint64_t start_ns = 0;
  Status status;
  int refs = 1;  // the caller's pending callback
  bool need_backing = false;
  bool backing_done = false;
  bool model_done = false;
  bool forced = false;
  bool completed = false;
  bool stall_wait = false;     // held at the completion gate by a stall; stall_event will retry
  uint64_t stall_event = 0;
  bool timeout_armed = false;  // its timeout event is scheduled and has not started
  uint64_t timeout_event = 0;  // that event's Timer id
  bool queued = false;  // waited in slot_queue_: admitted later, in another thread
  std::vector<SectorRun> patches;  // cached read: newest cached data at admission
  Op* prev = nullptr;  // in-flight list
  Op* next = nullptr;
};

namespace {

// A list that stays inline up to N entries: Actions are built on every request,
// and two heap allocations per request were a measurable share of the engine's
// overhead at 400k IOPS.
template <typename T, size_t N>
class SmallList {
 public:
  void push_back(const T& v) {
    if (n_ < N) {
      inline_[n_++] = v;
    } else {
      more_.push_back(v);
    }
  }
  template <typename Fn>
  void ForEach(Fn fn) {
    for (size_t i = 0; i < n_; i++) fn(inline_[i]);
    for (T& v : more_) fn(v);
  }

 private:
  T inline_[N];
  size_t n_ = 0;
  std::vector<T> more_;
};

}  // namespace

struct FaultDevice::Actions {
  SmallList<std::pair<IoRequest*, Status>, 4> callbacks;
  SmallList<IoRequest*, 4> backing;
};

namespace {

double Unit(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

DriveModel::Kind DriveKind(IoOp op) {
  switch (op) {
    case IoOp::kRead: return DriveModel::Kind::kRead;
    case IoOp::kWrite: return DriveModel::Kind::kWrite;
    case IoOp::kFlush: return DriveModel::Kind::kFlush;
    case IoOp::kDiscard: return DriveModel::Kind::kDiscard;
  }
  return DriveModel::Kind::kRead;
}

}  // namespace

FaultDevice::FaultDevice(const Profile& profile, std::unique_ptr<tfs::BlockDevice> backing)
    : profile_(profile), backing_(std::move(backing)), open_ns_(NowNs()), rng_(profile.seed) {}

std::unique_ptr<FaultDevice> FaultDevice::Open(const Profile& profile, std::unique_ptr<tfs::BlockDevice> backing,
                                               std::string* error) {
  const tfs::BlockDeviceInfo& bi = backing->Info();
  for (const ErrorRange& e : profile.errors) {
    if (e.offset >= bi.size || e.length > bi.size - e.offset) {
      *error = "profile " + profile.name + ": errors range [" + std::to_string(e.offset) + ", +" +
               std::to_string(e.length) + ") is beyond the device end (" + std::to_string(bi.size) + " bytes)";
      return nullptr;
    }
  }
  if (profile.smr && profile.smr->band_bytes > bi.size) {
    // Bands beyond the device make no sense, and (band + 1) * band_bytes could overflow.
    *error = "profile " + profile.name + ": smr.band (" + std::to_string(profile.smr->band_bytes) +
             " bytes) is larger than the device (" + std::to_string(bi.size) + " bytes)";
    return nullptr;
  }
  if (profile.timeout.offset && *profile.timeout.offset >= bi.size) {
    *error = "profile " + profile.name + ": timeout.offset is beyond the device end (" + std::to_string(bi.size) +
             " bytes)";
    return nullptr;
  }
  std::unique_ptr<FaultDevice> d(new FaultDevice(profile, std::move(backing)));
  d->info_ = bi;
  d->name_ = profile.name + "(" + d->backing_->Name() + ")";
  d->victims_left_ = profile.timeout.enabled ? profile.timeout.count : 0;
  d->error_active_.assign(profile.errors.size(), true);
  if (profile.hdd) {
    d->drive_ = std::make_unique<DriveModel>(*profile.hdd, profile.smr, bi.size, profile.seed ^ 0x6864645f6d6f64ull);
  }
  if (profile.cache.enabled) d->cache_ = std::make_unique<WriteCache>(bi.logical_block_size);
  d->stats_.name = d->name_;
  d->stats_.profile = profile.name;
  d->stats_.seed = profile.seed;
  d->timer_ = std::make_unique<Timer>();
  if (profile.cache.powercut_at_ns) {
    FaultDevice* dev = d.get();
    d->timer_->At(d->open_ns_ + *profile.cache.powercut_at_ns, [dev] { dev->PowerCut(); });
  }
  return d;
}

std::unique_ptr<FaultDevice> OpenFile(const Profile& profile, const std::string& image, bool direct,
                                      std::string* error) {
  tfs::userspace::UringOptions opts;
  opts.try_direct = direct;
  auto backing = tfs::userspace::UringDevice::Open(image, opts);
  if (!backing.ok()) {
    *error = image + ": cannot open: " + backing.status().Message();
    return nullptr;
  }
  return FaultDevice::Open(profile, std::move(backing.value()), error);
}

FaultDevice::~FaultDevice() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return live_ops_ == 0 && !wb_active_ && !cut_requested_; });
    // A timer event running now (a stall's or idle cleaning's kick) must not
    // schedule another while the timer is torn down.
    stopping_ = true;
  }
  timer_.reset();  // drops idle-cleaning and power-cut events; no Op is left
  for (Op* op : free_ops_) delete op;
}

void FaultDevice::Run(Actions& act) {
  act.backing.ForEach([this](IoRequest* r) { backing_->Submit(r); });
  act.callbacks.ForEach([](std::pair<IoRequest*, Status>& c) { c.first->done(c.first, c.second); });
}

void FaultDevice::Submit(IoRequest* req) {
  Status st = CheckRequest(*req);
  uint64_t now = NowNs();
  if (!st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.completed++;
      stats_.errors++;
    }
    req->done(req, st);
    return;
  }
  Actions act;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Op* op;
    if (!free_ops_.empty()) {
      op = free_ops_.back();
      free_ops_.pop_back();
      *op = Op{};
    } else {
      op = new Op;
    }
    op->dev = this;
    op->req = req;
    op->submit_ns = now;
    live_ops_++;
    uint64_t bytes = req->op == IoOp::kFlush ? 0 : req->length;
    stats_.by_op[int(req->op)].ops++;
    stats_.by_op[int(req->op)].bytes += bytes;
    stats_.by_origin[int(req->origin)][int(req->op)].ops++;
    stats_.by_origin[int(req->origin)][int(req->op)].bytes += bytes;
    uint32_t slots = profile_.queue.max_in_flight;
    if (slots != 0 && (in_flight_ >= slots || !slot_queue_.empty())) {
      op->queued = true;
      slot_queue_.push_back(op);
      stats_.slot_waits++;
      return;
    }
    Admit(op, now, act);
  }
  Run(act);
}

void FaultDevice::Admit(Op* op, uint64_t now, Actions& act) {
  in_flight_++;
  stats_.max_in_flight = std::max(stats_.max_in_flight, in_flight_);
  op->next = inflight_head_;
  if (inflight_head_ != nullptr) inflight_head_->prev = op;
  inflight_head_ = op;
  op->admit_ns = now;
  op->start_ns = now;
  admitted_++;
  const IoRequest& r = *op->req;

  if (!powered_) {
    stats_.powered_off_failures++;
    Force(op, Err::kIo, now, act);
    return;
  }
  if (TimeoutVictim(r, now)) {
    stats_.timeouts_injected++;
    op->status = Err::kIoTimeout;
    op->timeout_event = ScheduleOp(
        now + profile_.timeout.duration_ns, op,
        [](FaultDevice* d, Op* o, uint64_t when, Actions& a) { d->OnTimeoutExpired(o, when, a); },
        /*cancellable=*/true);
    op->timeout_armed = true;
    return;
  }
  if (InjectError(r)) {
    stats_.errors_injected++;
    op->status = Err::kIo;  // no data moves; the timing models still apply
  } else if (cache_ && r.op == IoOp::kWrite) {
    CacheWrite(op, act);
  } else if (cache_ && r.op == IoOp::kFlush && profile_.cache.ignore_flushes) {
    op->need_backing = true;  // the lie: "durable" at once
    op->backing_done = true;
  } else if (cache_ && r.op == IoOp::kFlush) {
    op->need_backing = true;  // done when a write-back covering it has finished
    flush_waiters_.push_back({op, cache_->last_seq()});
    const CacheModel& c = profile_.cache;
    if (c.powercut_at_flush != 0 && (!c.powercut_origin || r.origin == *c.powercut_origin) &&
        ++trigger_flushes_ == c.powercut_at_flush) {
      TriggerCut();
    }
    MaybeStartWriteback(act);
  } else {
    op->need_backing = true;
    if (cache_ && r.op == IoOp::kRead) op->patches = cache_->Patches(r.offset, r.length);
    op->below = IoRequest{};
    op->below.op = r.op;
    op->below.flags = r.flags;
    // An op that waited for a slot is admitted in whatever thread finished
    // the op before it, not in its submitter's: the hints that promise the
    // submitter waits in this thread (a blocking syscall right in Submit,
    // the thread's own ring) must not reach the backing device.
    if (op->queued) op->below.flags &= uint8_t(~(IoRequest::kInline | IoRequest::kWaited));
    op->below.origin = r.origin;
    op->below.offset = r.offset;
    op->below.length = r.length;
    op->below.buf = r.buf;
    op->below.done = &FaultDevice::OnBackingDone;
    op->below.caller_data = op;
    op->refs++;
    act.backing.push_back(&op->below);
  }
  StartTiming(op, now, now, act);
}

void FaultDevice::StartTiming(Op* op, uint64_t t, uint64_t now, Actions& act) {
  const IoRequest& r = *op->req;
  if (profile_.delay) {
    int i = int(r.op);
    uint64_t d = profile_.delay->base_ns[i];
    uint64_t j = profile_.delay->jitter_ns[i];
    if (j != 0) {
      if (profile_.delay->jitter == Jitter::kUniform) d += rng_() % (j + 1);
      if (profile_.delay->jitter == Jitter::kExponential) d += uint64_t(-std::log(1.0 - Unit(rng_)) * double(j));
    }
    t += d;
  }
  if (profile_.bandwidth.mb_s > 0 && (r.op == IoOp::kRead || r.op == IoOp::kWrite)) {
    bw_free_ = std::max(bw_free_, t) + uint64_t(double(r.length) * 1e3 / profile_.bandwidth.mb_s);
    t = bw_free_;
  }
  if (drive_) {
    if (t > now) {
      ScheduleOp(t, op, [](FaultDevice* d, Op* o, uint64_t when, Actions& a) {
        if (!o->forced && !o->completed) d->EnterDrive(o, when, a);
      });
    } else {
      EnterDrive(op, t, act);
    }
    return;
  }
  ModelDoneAt(op, t, now, act);
}

uint64_t FaultDevice::ScheduleOp(uint64_t when, Op* op, EventFn fn, bool cancellable) {
  op->refs++;
  auto event = [this, op, when, fn] {
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn(this, op, when, act);
      Unref(op);
    }
    Run(act);
  };
  if (cancellable) return timer_->AtCancellable(when, std::move(event));
  timer_->At(when, std::move(event));
  return 0;
}

void FaultDevice::ModelDoneAt(Op* op, uint64_t t, uint64_t now, Actions& act) {
  if (t <= now) {
    op->model_done = true;
    TryComplete(op, now, act);
    return;
  }
  ScheduleOp(t, op, [](FaultDevice* d, Op* o, uint64_t, Actions& a) {
    o->model_done = true;
    d->TryComplete(o, NowNs(), a);
  });
}

void FaultDevice::EnterDrive(Op* op, uint64_t t, Actions& act) {
  const IoRequest& r = *op->req;
  DriveModel::HostIo io;
  io.tag = op;
  io.kind = DriveKind(r.op);
  io.offset = r.offset;
  io.length = r.op == IoOp::kFlush ? 0 : r.length;
  io.fua = (r.flags & IoRequest::kFua) != 0;
  op->refs++;  // held by the drive until it reports the request done
  std::vector<DriveModel::Done> dones;
  drive_->Submit(io, t, &dones);
  uint64_t now = NowNs();
  for (const DriveModel::Done& d : dones) {
    Op* o = static_cast<Op*>(d.tag);
    ModelDoneAt(o, d.end, now, act);
    Unref(o);
  }
  KickDrive(t);
}

void FaultDevice::KickDrive(uint64_t t) {
  if (stopping_ || drive_->busy()) return;
  // The head starts nothing while stalled: come back when the stall ends (or
  // at once, from Unstall()). A kick that finds the head busy or idle with
  // nothing to do is harmless, so stale kicks need no cancelling.
  if (uint64_t end = StallEnd(t); end != t) {
    if (stall_kick_at_ != end) {
      stall_kick_at_ = end;
      timer_->At(end, [this, end] {
        Actions a;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stall_kick_at_ == end) stall_kick_at_ = 0;
          // At `end`, not at the stall's end now: a stall extended meanwhile makes
          // KickDrive schedule the next kick, never start a job in the future
          // (which Unstall could not take back).
          KickDrive(end);
        }
        Run(a);
      });
    }
    return;
  }
  if (std::optional<uint64_t> end = drive_->StartNext(t)) {
    uint64_t e = *end;
    timer_->At(e, [this, e] {
      Actions a;
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::vector<DriveModel::Done> dones;
        drive_->FinishJob(&dones);
        uint64_t now = NowNs();
        for (const DriveModel::Done& d : dones) {
          Op* o = static_cast<Op*>(d.tag);
          if (d.start != 0) o->start_ns = std::max(o->admit_ns, d.start);
          ModelDoneAt(o, d.end, now, a);
          Unref(o);
        }
        KickDrive(e);
      }
      Run(a);
    });
    return;
  }
  if (std::optional<uint64_t> at = drive_->IdleCleanAt()) {
    if (idle_timer_at_ == 0 || *at < idle_timer_at_) {
      uint64_t when = *at;
      idle_timer_at_ = when;
      timer_->At(when, [this, when] {
        Actions a;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (idle_timer_at_ == when) idle_timer_at_ = 0;
          KickDrive(when);
        }
        Run(a);
      });
    }
  }
}

void FaultDevice::TryComplete(Op* op, uint64_t now, Actions& act) {
  if (op->completed) return;
  if (op->need_backing && !op->backing_done) return;
  if (!op->model_done && !op->forced) return;
  if (powered_) {
    uint64_t end = StallEnd(now);
    if (end != now) {
      if (!op->stall_wait) {
        op->stall_wait = true;
        op->stall_event = ScheduleOp(
            end, op,
            [](FaultDevice* d, Op* o, uint64_t, Actions& a) {
              o->stall_wait = false;
              d->TryComplete(o, NowNs(), a);
            },
            /*cancellable=*/true);
      }
      return;
    }
  }
  op->completed = true;
  if (op->prev != nullptr) op->prev->next = op->next;
  if (op->next != nullptr) op->next->prev = op->prev;
  if (inflight_head_ == op) inflight_head_ = op->next;
  in_flight_--;
  stats_.completed++;
  if (!op->status.ok()) stats_.errors++;
  uint64_t start = std::min(std::max(op->start_ns, op->submit_ns), now);
  stats_.queue_ns.Record(start - op->submit_ns);
  stats_.service_ns.Record(now - start);
  stats_.total_ns.Record(now - op->submit_ns);
  act.callbacks.push_back({op->req, op->status});
  if (op->timeout_armed) {
    // Failed before its timeout (power cut): drop the event and its reference, so
    // Drain() and the destructor need not wait out the timeout.
    op->timeout_armed = false;
    if (timer_->Cancel(op->timeout_event)) Unref(op);
  }
  if (op->stall_wait) {
    // Released before the stall's old end (Unstall, power cut): the same.
    op->stall_wait = false;
    if (timer_->Cancel(op->stall_event)) Unref(op);
  }
  Unref(op);
  AdmitFromSlotQueue(now, act);
}

void FaultDevice::AdmitFromSlotQueue(uint64_t now, Actions& act) {
  // A request admitted here may complete at once (powered off, no delay) and call
  // back into TryComplete: only the outermost call drains the queue, so the stack
  // stays flat however long the queue is.
  if (admitting_) return;
  admitting_ = true;
  uint32_t slots = profile_.queue.max_in_flight;
  while (!slot_queue_.empty() && (slots == 0 || in_flight_ < slots)) {
    Op* next = slot_queue_.front();
    slot_queue_.pop_front();
    Admit(next, now, act);
  }
  admitting_ = false;
}

void FaultDevice::Force(Op* op, Status st, uint64_t now, Actions& act) {
  if (op->completed) return;
  if (op->status.ok() || st == Err::kIo) op->status = st;
  op->forced = true;
  TryComplete(op, now, act);
}

void FaultDevice::Unref(Op* op) {
  if (--op->refs > 0) return;
  if (free_ops_.size() < kMaxFreeOps) {
    op->patches.clear();
    free_ops_.push_back(op);
  } else {
    delete op;
  }
  if (--live_ops_ == 0) idle_cv_.notify_all();
}

void FaultDevice::OnBackingDone(IoRequest* below, Status st) {
  Op* op = static_cast<Op*>(below->caller_data);
  FaultDevice* d = op->dev;
  Actions act;
  {
    std::lock_guard<std::mutex> lock(d->mu_);
    op->backing_done = true;
    if (!st.ok() && op->status.ok()) op->status = st;
    if (st.ok()) {
      auto* buf = static_cast<uint8_t*>(op->req->buf);
      for (const SectorRun& p : op->patches) memcpy(buf + (p.offset - op->req->offset), p.data.data(), p.data.size());
    }
    op->patches.clear();
    d->TryComplete(op, NowNs(), act);
    d->Unref(op);
  }
  d->Run(act);
}

// --- faults ---

bool FaultDevice::TimeoutVictim(const IoRequest& r, uint64_t now) {
  const TimeoutModel& t = profile_.timeout;
  if (!t.enabled || victims_left_ == 0) return false;
  bool match = false;
  if (t.after_requests != 0) {
    match = admitted_ >= t.after_requests;
  } else if (t.offset) {
    match = (r.op == IoOp::kRead || r.op == IoOp::kWrite) && r.offset <= *t.offset && *t.offset < r.offset + r.length;
  } else if (t.at_ns) {
    match = now >= open_ns_ + *t.at_ns;
  }
  if (match) victims_left_--;
  return match;
}

void FaultDevice::OnTimeoutExpired(Op* op, uint64_t, Actions& act) {
  // Already failed (by a power cut): the timeout has nothing left to time out, and
  // a link reset now would fail requests submitted after the cut.
  op->timeout_armed = false;
  if (op->completed) return;
  uint64_t now = NowNs();
  if (profile_.timeout.link_reset) {
    stats_.link_resets++;
    // Empty the drive's queue before failing anything: each failure frees a [queue]
    // slot and admits a waiting request, which may enter the drive and must not be
    // thrown away with the requests the reset kills (as in PowerOffLocked).
    if (drive_) {
      for (void* tag : drive_->Abort()) Unref(static_cast<Op*>(tag));
    }
    std::vector<Op*> victims;
    for (Op* o = inflight_head_; o != nullptr; o = o->next) {
      if (o != op) victims.push_back(o);
    }
    for (Op* o : victims) {
      stats_.reset_failures++;
      Force(o, Err::kIoTimeout, now, act);
    }
  }
  op->model_done = true;
  Force(op, Err::kIoTimeout, now, act);
}

bool FaultDevice::InjectError(const IoRequest& r) {
  bool read = r.op == IoOp::kRead, write = r.op == IoOp::kWrite;
  if (!read && !write) return false;
  for (size_t i = 0; i < profile_.errors.size(); i++) {
    const ErrorRange& e = profile_.errors[i];
    if (!error_active_[i] || (read && !e.reads) || (write && !e.writes)) continue;
    if (r.offset >= e.offset + e.length || e.offset >= r.offset + r.length) continue;
    switch (e.mode) {
      case ErrorMode::kPersistent:
        return true;
      case ErrorMode::kOnce:
        error_active_[i] = false;
        return true;
      case ErrorMode::kRate:
        if (Unit(rng_) < e.rate) return true;
        break;
    }
  }
  return false;
}

uint64_t FaultDevice::ClipStall(uint64_t at, uint64_t end) const {
  for (uint64_t u : unstalls_) {
    if (u >= at && u < end) end = u;
  }
  return end;
}

uint64_t FaultDevice::StallEnd(uint64_t t) const {
  const StallModel& s = profile_.stall;
  auto in_window = [&](uint64_t a, uint64_t b) {
    b = ClipStall(a, b);
    if (t < a || t >= b) return false;
    t = b;
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (const StallWindow& w : manual_stalls_) changed |= in_window(w.at_ns, w.at_ns + w.duration_ns);
    for (const StallWindow& w : s.scripted) {
      changed |= in_window(open_ns_ + w.at_ns, open_ns_ + w.at_ns + w.duration_ns);
    }
    if (s.period_ns != 0 && s.duration_ns != 0 && t >= open_ns_ + s.offset_ns) {
      uint64_t rel = t - open_ns_ - s.offset_ns;
      uint64_t a = t - rel % s.period_ns;
      changed |= in_window(a, a + s.duration_ns);
    }
  }
  return t;
}

uint64_t FaultDevice::StalledNs(uint64_t now) const {
  const StallModel& s = profile_.stall;
  auto overlap = [&](uint64_t a, uint64_t b) {
    b = ClipStall(a, b);
    return a >= now ? 0 : std::min(b, now) - a;
  };
  uint64_t total = 0;
  for (const StallWindow& w : manual_stalls_) total += overlap(w.at_ns, w.at_ns + w.duration_ns);
  for (const StallWindow& w : s.scripted) total += overlap(open_ns_ + w.at_ns, open_ns_ + w.at_ns + w.duration_ns);
  if (s.period_ns != 0 && s.duration_ns != 0 && now > open_ns_ + s.offset_ns) {
    // Whole periods before the current one, then the current one; only windows
    // an Unstall() cut short need a walk, and there are at most as many as cuts.
    uint64_t rel = now - open_ns_ - s.offset_ns;
    uint64_t periods = rel / s.period_ns;
    total += periods * s.duration_ns;
    uint64_t last_k = UINT64_MAX;
    for (uint64_t u : unstalls_) {  // in time order
      if (u < open_ns_ + s.offset_ns) continue;
      uint64_t k = (u - open_ns_ - s.offset_ns) / s.period_ns;
      uint64_t a = open_ns_ + s.offset_ns + k * s.period_ns;
      if (k >= periods || k == last_k || u >= a + s.duration_ns) continue;
      last_k = k;
      total -= a + s.duration_ns - ClipStall(a, a + s.duration_ns);
    }
    uint64_t a = open_ns_ + s.offset_ns + periods * s.period_ns;
    total += overlap(a, a + s.duration_ns);
  }
  return total;
}

// --- volatile cache ---

void FaultDevice::CacheWrite(Op* op, Actions& act) {
  const IoRequest& r = *op->req;
  op->need_backing = true;  // "in the cache" (and, for FUA, "written back") plays the backing I/O
  if (!cache_->empty() && cache_->bytes() + r.length > profile_.cache.size_bytes) {
    parked_writes_.push_back(op);
    MaybeStartWriteback(act);
    return;
  }
  uint64_t seq = cache_->Add(r.offset, r.buf, r.length);
  cache_writes_++;
  const CacheModel& c = profile_.cache;
  const bool fua = (r.flags & IoRequest::kFua) && !c.ignore_flushes;
  const bool counted = !c.powercut_origin || r.origin == *c.powercut_origin;
  if (counted) trigger_writes_++;
  if (fua) {
    flush_waiters_.push_back({op, seq});
  } else {
    op->backing_done = true;
  }
  if (cache_->bytes() > profile_.cache.size_bytes || fua) MaybeStartWriteback(act);
  if (counted && c.powercut_after_writes != 0 && trigger_writes_ == c.powercut_after_writes) TriggerCut();
}

void FaultDevice::TriggerCut() {
  // Nothing more is written back between the trigger and the cut, so that the
  // cut meets the cache as the trigger saw it (and a flush that triggered it is
  // not served first).
  cut_requested_ = true;
  timer_->Post([this] { PowerCut(); });
}

void FaultDevice::MaybeStartWriteback(Actions& act) {
  if (wb_active_ || !powered_ || cut_requested_) return;
  uint64_t upto = 0;
  bool flush = false;
  if (!flush_waiters_.empty()) {
    for (const FlushWait& w : flush_waiters_) upto = std::max(upto, w.upto);
    flush = true;
  } else if (cache_->bytes() > profile_.cache.size_bytes || !parked_writes_.empty()) {
    uint64_t size = profile_.cache.size_bytes;
    uint64_t target = size / 2;
    if (!parked_writes_.empty()) {
      // Make room for the oldest parked write, not just down to half: with the cache
      // already at most half full, "half" would retire nothing and the parked write
      // would never fit. A write larger than the whole cache waits for an empty
      // cache and then goes in alone (and straight back out).
      uint64_t want = parked_writes_.front()->req->length;
      target = std::min(target, want >= size ? 0 : size - want);
    }
    upto = cache_->SeqToShrinkTo(target);
    // Nothing to retire: starting an empty write-back would finish at once and call
    // us again, forever.
    if (cache_->empty() || upto < cache_->records().front().seq) return;
  } else {
    return;
  }
  wb_active_ = true;
  wb_upto_ = upto;
  wb_flush_backing_ = flush;
  wb_status_ = Status::Ok();
  wb_runs_ = cache_->Plan(upto);
  wb_reqs_.assign(wb_runs_.size(), IoRequest{});
  for (size_t i = 0; i < wb_runs_.size(); i++) {
    IoRequest& q = wb_reqs_[i];
    q.op = IoOp::kWrite;
    q.origin = tfs::IoOrigin::kOther;
    q.offset = wb_runs_[i].offset;
    q.length = wb_runs_[i].data.size();
    q.buf = wb_runs_[i].data.data();
    q.done = &FaultDevice::OnWritebackIoDone;
    q.caller_data = this;
    act.backing.push_back(&q);
  }
  wb_outstanding_ = wb_runs_.size();
  if (wb_outstanding_ == 0) {
    if (wb_flush_backing_) {
      wb_flush_backing_ = false;
      wb_flush_req_ = IoRequest{};
      wb_flush_req_.op = IoOp::kFlush;
      wb_flush_req_.done = &FaultDevice::OnWritebackIoDone;
      wb_flush_req_.caller_data = this;
      wb_outstanding_ = 1;
      act.backing.push_back(&wb_flush_req_);
    } else {
      WritebackDone(act);
    }
  }
}

void FaultDevice::OnWritebackIoDone(IoRequest* below, Status st) {
  auto* d = static_cast<FaultDevice*>(below->caller_data);
  Actions act;
  {
    std::lock_guard<std::mutex> lock(d->mu_);
    if (!st.ok()) d->wb_status_ = st;
    if (--d->wb_outstanding_ == 0) {
      if (d->wb_flush_backing_) {
        d->wb_flush_backing_ = false;
        d->wb_flush_req_ = IoRequest{};
        d->wb_flush_req_.op = IoOp::kFlush;
        d->wb_flush_req_.done = &FaultDevice::OnWritebackIoDone;
        d->wb_flush_req_.caller_data = d;
        d->wb_outstanding_ = 1;
        act.backing.push_back(&d->wb_flush_req_);
      } else {
        d->WritebackDone(act);
      }
    }
  }
  d->Run(act);
}

void FaultDevice::WritebackDone(Actions& act) {
  cache_->Retire(wb_upto_);
  stats_.writebacks++;
  wb_active_ = false;
  wb_runs_.clear();
  wb_reqs_.clear();
  uint64_t now = NowNs();
  std::deque<FlushWait> still;
  for (const FlushWait& w : flush_waiters_) {
    if (w.upto <= wb_upto_) {
      w.op->backing_done = true;
      if (!wb_status_.ok() && w.op->status.ok()) w.op->status = wb_status_;
      TryComplete(w.op, now, act);
    } else {
      still.push_back(w);
    }
  }
  flush_waiters_.swap(still);
  while (!parked_writes_.empty() && powered_ &&
         (cache_->empty() || cache_->bytes() + parked_writes_.front()->req->length <= profile_.cache.size_bytes)) {
    Op* op = parked_writes_.front();
    parked_writes_.pop_front();
    CacheWrite(op, act);
    TryComplete(op, now, act);
  }
  if (cut_requested_) {
    idle_cv_.notify_all();
  } else {
    MaybeStartWriteback(act);
  }
  if (!wb_active_) idle_cv_.notify_all();
}

// --- control ---

void FaultDevice::PowerOffLocked(uint64_t now, Actions& act) {
  powered_ = false;
  for (const FlushWait& w : flush_waiters_) w.op->backing_done = true;
  for (Op* op : parked_writes_) op->backing_done = true;
  flush_waiters_.clear();
  parked_writes_.clear();
  if (drive_) {
    for (void* tag : drive_->Abort()) Unref(static_cast<Op*>(tag));
  }
  std::vector<Op*> victims;
  for (Op* o = inflight_head_; o != nullptr; o = o->next) victims.push_back(o);
  for (Op* o : victims) {
    stats_.powered_off_failures++;
    Force(o, Err::kIo, now, act);
  }
}

CutOutcome FaultDevice::PowerCut(std::optional<uint64_t> seed) {
  CutOutcome out = CutOnce(seed);
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(hook_mu_);
    if (!cut_hook_) return out;
    hook = cut_hook_;
    hooks_running_++;
  }
  hook();  // no lock held: the hook cuts other devices, whose hooks may run too
  std::lock_guard<std::mutex> lock(hook_mu_);
  if (--hooks_running_ == 0) hook_cv_.notify_all();
  return out;
}

void FaultDevice::SetCutHook(std::function<void()> hook) {
  std::unique_lock<std::mutex> lock(hook_mu_);
  hook_cv_.wait(lock, [this] { return hooks_running_ == 0; });
  cut_hook_ = std::move(hook);
}

CutOutcome FaultDevice::CutOnce(std::optional<uint64_t> seed) {
  std::lock_guard<std::mutex> one_at_a_time(cut_mu_);
  std::deque<CacheRecord> records;
  uint64_t cut_seed;
  Actions act;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cut_requested_ = true;
    idle_cv_.wait(lock, [this] { return !wb_active_; });
    PowerOffLocked(NowNs(), act);
    stats_.power_cuts++;
    cut_seed = seed ? *seed : profile_.seed + cuts_;
    cuts_++;
    if (cache_) {
      records = cache_->TakeRecords();
    }
  }
  Run(act);
  CutOutcome out;
  if (!records.empty()) {
    const CacheModel& c = profile_.cache;
    out = PlanPowerCut(records, info_.logical_block_size, cut_seed, CutPolicy{c.keep, c.drop, c.tear});
    for (SectorRun& run : out.runs) {
      tfs::SyncIo(*backing_, IoOp::kWrite, run.offset, run.data.data(), run.data.size()).IgnoreError();
    }
    // Best effort: the backing image is what the cut left; its own durability is
    // the host's business.
    tfs::SyncIo(*backing_, IoOp::kFlush, 0, nullptr, 0).IgnoreError();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cut_requested_ = false;
    stats_.cut_kept += out.kept;
    stats_.cut_dropped += out.dropped;
    stats_.cut_torn += out.torn;
    idle_cv_.notify_all();
  }
  return out;
}

void FaultDevice::PowerOn() {
  std::lock_guard<std::mutex> lock(mu_);
  powered_ = true;
}

bool FaultDevice::powered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return powered_;
}

void FaultDevice::StallFor(uint64_t duration_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t now = NowNs();
  manual_stalls_.push_back({now, duration_ns});
  stats_.stalls++;
}

void FaultDevice::Unstall() {
  Actions act;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t now = NowNs();
    if (StallEnd(now) == now) return;
    unstalls_.push_back(now);
    stats_.unstalls++;
    // Requests held at the completion gate complete now; their timer events at
    // the old end find them completed. Then the head may start again.
    std::vector<Op*> held;
    for (Op* op = inflight_head_; op != nullptr; op = op->next) {
      if (op->stall_wait) held.push_back(op);
    }
    for (Op* op : held) TryComplete(op, now, act);
    if (drive_) KickDrive(now);
  }
  Run(act);
}

void FaultDevice::ClearErrors() {
  std::lock_guard<std::mutex> lock(mu_);
  error_active_.assign(error_active_.size(), false);
}

void FaultDevice::AddErrors(const ErrorRange& range) {
  std::lock_guard<std::mutex> lock(mu_);
  profile_.errors.push_back(range);
  error_active_.push_back(true);
}

void FaultDevice::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return live_ops_ == 0 && !wb_active_ && !cut_requested_; });
}

bool FaultDevice::SaveCacheRecords(const std::string& path, std::string* error) {
  std::deque<CacheRecord> records;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_) records = cache_->records();
  }
  if (records.empty()) {
    std::remove(path.c_str());
    return true;
  }
  return SaveRecords(path, info_.logical_block_size, records, error);
}

DeviceStats FaultDevice::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t now = NowNs();
  DeviceStats s = stats_;
  s.elapsed_s = double(now - open_ns_) / 1e9;
  s.in_flight = in_flight_ + slot_queue_.size();
  s.stalled_ns = StalledNs(now);
  s.stall_remaining_ns = powered_ ? StallEnd(now) - now : 0;
  s.powered = powered_;
  for (bool active : error_active_) s.error_ranges_active += active ? 1 : 0;
  if (cache_) {
    s.cache_bytes = cache_->bytes();
    s.cache_records = cache_->records().size();
  }
  if (drive_) {
    s.has_drive = true;
    s.drive = drive_->stats();
    s.has_smr = profile_.smr.has_value();
    s.media_cache_capacity = drive_->media_cache_capacity();
  }
  return s;
}

// --- JSON ---

void WriteLatencyMs(tfs::userspace::JsonWriter& w, const char* key, const tfs::Histogram& h) {
  auto ms = [](uint64_t ns) { return double(ns) / 1e6; };
  w.Key(key);
  w.BeginObject();
  w.UintField("count", h.count());
  w.DoubleField("mean", ms(h.Mean()));
  w.DoubleField("p50", ms(h.Quantile(50, 100)));
  w.DoubleField("p99", ms(h.Quantile(99, 100)));
  w.DoubleField("p999", ms(h.Quantile(999, 1000)));
  w.DoubleField("max", ms(h.max()));
  w.EndObject();
}

namespace {

void WriteOps(tfs::userspace::JsonWriter& w, const char* key, const IoCount* by_op) {
  w.Key(key);
  w.BeginObject();
  for (int i = 0; i < tfs::kIoOpCount; i++) {
    w.Key(tfs::IoOpName(IoOp(i)));
    w.BeginObject();
    w.UintField("ops", by_op[i].ops);
    w.UintField("bytes", by_op[i].bytes);
    w.EndObject();
  }
  w.EndObject();
}

}  // namespace

void DeviceStats::Write(tfs::userspace::JsonWriter& w) const {
  w.BeginObject();
  w.StringField("device", name);
  w.StringField("profile", profile);
  w.UintField("seed", seed);
  w.DoubleField("elapsed_s", elapsed_s);
  WriteOps(w, "ops", by_op);
  w.Key("origins");  // origins that did nothing are left out
  w.BeginObject();
  for (int o = 0; o < tfs::kIoOriginCount; o++) {
    uint64_t total = 0;
    for (int i = 0; i < tfs::kIoOpCount; i++) total += by_origin[o][i].ops;
    if (total != 0) WriteOps(w, tfs::IoOriginName(tfs::IoOrigin(o)), by_origin[o]);
  }
  w.EndObject();
  w.UintField("completed", completed);
  w.UintField("errors", errors);
  w.UintField("in_flight", in_flight);
  w.UintField("max_in_flight", max_in_flight);
  w.UintField("slot_waits", slot_waits);
  w.Key("injected");
  w.BeginObject();
  w.UintField("eio", errors_injected);
  w.UintField("timeouts", timeouts_injected);
  w.UintField("link_resets", link_resets);
  w.UintField("reset_failures", reset_failures);
  w.UintField("power_cuts", power_cuts);
  w.UintField("powered_off_failures", powered_off_failures);
  w.EndObject();
  w.Key("stall");
  w.BeginObject();
  w.DoubleField("stalled_s", double(stalled_ns) / 1e9);
  w.UintField("commanded", stalls);
  w.UintField("unstalls", unstalls);
  w.DoubleField("remaining_s", double(stall_remaining_ns) / 1e9);
  w.EndObject();
  w.BoolField("powered", powered);
  w.UintField("error_ranges_active", error_ranges_active);
  w.Key("latency_ms");
  w.BeginObject();
  WriteLatencyMs(w, "queue", queue_ns);
  WriteLatencyMs(w, "service", service_ns);
  WriteLatencyMs(w, "total", total_ns);
  w.EndObject();
  w.Key("cache");
  w.BeginObject();
  w.UintField("bytes", cache_bytes);
  w.UintField("records", cache_records);
  w.UintField("writebacks", writebacks);
  w.UintField("cut_kept", cut_kept);
  w.UintField("cut_dropped", cut_dropped);
  w.UintField("cut_torn", cut_torn);
  w.EndObject();
  if (has_drive) {
    w.Key("drive");
    w.BeginObject();
    w.DoubleField("head_busy_s", double(drive.head_busy_ns) / 1e9);
    w.UintField("seeks", drive.seeks);
    w.UintField("sequential", drive.sequential);
    w.UintField("destaged", drive.destaged);
    w.UintField("write_cache_bytes", drive.write_cache_bytes);
    w.EndObject();
  }
  if (has_smr) {
    w.Key("smr");
    w.BeginObject();
    w.UintField("media_cache_bytes", drive.media_cache_bytes);
    w.UintField("media_cache_capacity", media_cache_capacity);
    w.UintField("media_cache_peak", drive.media_cache_peak);
    w.UintField("media_cache_writes", drive.media_cache_writes);
    w.UintField("bands_cleaned", drive.bands_cleaned);
    w.UintField("idle_cleans", drive.idle_cleans);
    w.DoubleField("cleaning_s", double(drive.cleaning_ns) / 1e9);
    w.EndObject();
  }
  w.EndObject();
}

std::string DeviceStats::ToJson() const {
  tfs::userspace::JsonWriter w;
  Write(w);
  return w.str();
}

}  // namespace faultdev
