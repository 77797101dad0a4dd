// The deferred-work queue (see work.h).
//
// Invariants: an item is on list_ exactly when its `queued` is set; running_
// is the item the worker is running (or null), set and cleared under lock_;
// the worker never touches an item after its fn returns (fn may free it).
// Wake-ups follow sync.cc's protocol: the sleeper announces itself
// (worker_asleep_, cancel_waiters_) and re-checks its word, the waker changes
// the word first and then looks for a sleeper, both sequentially consistent.
#include "platform/work.h"

namespace tfs {

Status WorkQueue::Start(const char* name) {
  {
    SpinGuard g(lock_);
    TFS_BUG_ON(state_ != State::kIdle);
    state_ = State::kRunning;
  }
  Status st = thread_.Start(Main, this, name);
  if (!st.ok()) {
    SpinGuard g(lock_);
    state_ = State::kIdle;
  }
  return st;
}

// The wake is under the lock too: once the item is on the list the worker may
// run it, its owner see it done and the queue be stopped and freed -- nothing
// after the unlock may touch the queue (Stop cannot pass the lock while we
// hold it, and a wake never sleeps).
bool WorkQueue::Queue(Work* w) {
  SpinGuard g(lock_);
  TFS_BUG_ON(state_ == State::kIdle || state_ == State::kExited);
  if (w->queued) {
    stats_.requeued++;
    return false;
  }
  w->queued = true;
  list_.PushBack(w);
  stats_.queued++;
  seq_.FetchAdd(1);
  if (worker_asleep_.Load() != 0) tfs_plat_wake(seq_.Address(), 1);
  return true;
}

void WorkQueue::Cancel(Work* w) {
  TFS_MAY_SLEEP("WorkQueue::Cancel");
  for (;;) {
    const u32 done = done_seq_.Load();
    {
      SpinGuard g(lock_);
      if (w->queued) {
        list_.Remove(w);
        w->queued = false;
      }
      if (running_ != w) return;
    }
    cancel_waiters_.FetchAdd(1);
    if (done_seq_.Load() == done) tfs_plat_wait(done_seq_.Address(), done, platform::kForever);
    cancel_waiters_.FetchSub(1);
  }
}

void WorkQueue::Stop() {
  {
    SpinGuard g(lock_);
    if (state_ != State::kRunning) {
      TFS_BUG_ON(state_ == State::kStopping);  // (one stopper)
      return;
    }
    state_ = State::kStopping;
  }
  seq_.FetchAdd(1);
  tfs_plat_wake(seq_.Address(), 0);
  thread_.Join();
}

WorkStats WorkQueue::Stats() const {
  SpinGuard g(lock_);
  return stats_;
}

void WorkQueue::Main(void* self) { static_cast<WorkQueue*>(self)->Run(); }

void WorkQueue::Run() {
  for (;;) {
    const u32 seq = seq_.Load();  // before looking: a Queue after the look changes it
    Work* w;
    {
      SpinGuard g(lock_);
      w = list_.PopFront();
      if (w == nullptr && state_ == State::kStopping) {
        state_ = State::kExited;  // drained: nothing may be queued from now on
        return;
      }
      if (w != nullptr) {
        w->queued = false;
        running_ = w;
      }
    }
    if (w == nullptr) {
      worker_asleep_.Store(1);
      if (seq_.Load() == seq) tfs_plat_wait(seq_.Address(), seq, platform::kForever);
      worker_asleep_.Store(0);
      continue;
    }
    w->fn(w->arg);  // may free w
    {
      SpinGuard g(lock_);
      running_ = nullptr;
      stats_.ran++;
    }
    done_seq_.FetchAdd(1);
    if (cancel_waiters_.Load() != 0) tfs_plat_wake(done_seq_.Address(), 0);
  }
}

}  // namespace tfs
