// WorkQueue: items run once each, in queue order, on the worker; an item
// queued twice before it runs runs once; Stop runs everything queued (and
// what that queues) before it returns; Cancel leaves an item neither queued
// nor running.
#include "platform/work.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tfs {
namespace {

struct Recorder {
  std::mutex mu;
  std::vector<int> order;
  std::thread::id worker;
};

struct Item {
  Work work;
  Recorder* rec = nullptr;
  int tag = 0;
  std::atomic<int> runs{0};
  WorkQueue* requeue_into = nullptr;  // queue `follow` from inside fn
  Item* follow = nullptr;

  Item(Recorder* r, int t) : rec(r), tag(t) {
    work.fn = [](void* arg) {
      auto* it = static_cast<Item*>(arg);
      {
        std::lock_guard<std::mutex> l(it->rec->mu);
        it->rec->order.push_back(it->tag);
        it->rec->worker = std::this_thread::get_id();
      }
      it->runs.fetch_add(1);
      if (it->requeue_into != nullptr) it->requeue_into->Queue(&it->follow->work);
    };
    work.arg = this;
  }
};

// Waits (up to 10 s) until `pred` holds.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 10000; i++) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

TEST(WorkQueueTest, RunsItemsOnceInQueueOrderOnItsWorker) {
  Recorder rec;
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("work-test").ok());
  std::vector<std::unique_ptr<Item>> items;
  for (int i = 0; i < 100; i++) items.push_back(std::make_unique<Item>(&rec, i));
  for (auto& it : items) EXPECT_TRUE(wq.Queue(&it->work));
  ASSERT_TRUE(Eventually([&] { return wq.Stats().ran == 100; }));
  std::vector<int> want;
  for (int i = 0; i < 100; i++) want.push_back(i);
  {
    std::lock_guard<std::mutex> l(rec.mu);
    EXPECT_EQ(rec.order, want);
    EXPECT_NE(rec.worker, std::this_thread::get_id());
  }
  for (auto& it : items) EXPECT_EQ(it->runs.load(), 1);
  wq.Stop();
  const WorkStats s = wq.Stats();
  EXPECT_EQ(s.queued, 100u);
  EXPECT_EQ(s.ran, 100u);
  EXPECT_EQ(s.requeued, 0u);
}

TEST(WorkQueueTest, AnItemQueuedTwiceBeforeItRunsRunsOnce) {
  Recorder rec;
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("work-test").ok());
  // A first item holds the worker until the second has been queued twice.
  std::atomic<bool> go{false};
  Work gate;
  gate.fn = [](void* arg) {
    while (!static_cast<std::atomic<bool>*>(arg)->load()) std::this_thread::yield();
  };
  gate.arg = &go;
  Item twice(&rec, 7);
  ASSERT_TRUE(wq.Queue(&gate));
  EXPECT_TRUE(wq.Queue(&twice.work));
  EXPECT_FALSE(wq.Queue(&twice.work));
  go = true;
  ASSERT_TRUE(Eventually([&] { return wq.Stats().ran == 2; }));
  EXPECT_EQ(twice.runs.load(), 1);
  EXPECT_EQ(wq.Stats().requeued, 1u);
  // Queued again once it ran: it runs again.
  EXPECT_TRUE(wq.Queue(&twice.work));
  ASSERT_TRUE(Eventually([&] { return twice.runs.load() == 2; }));
  wq.Stop();
}

TEST(WorkQueueTest, StopRunsEverythingQueuedAndWhatThatQueues) {
  Recorder rec;
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("work-test").ok());
  std::atomic<bool> go{false};
  Work gate;
  gate.fn = [](void* arg) {
    while (!static_cast<std::atomic<bool>*>(arg)->load()) std::this_thread::yield();
  };
  gate.arg = &go;
  Item a(&rec, 1), b(&rec, 2), c(&rec, 3);
  a.requeue_into = &wq;  // a queues c while the queue is stopping
  a.follow = &c;
  ASSERT_TRUE(wq.Queue(&gate));
  ASSERT_TRUE(wq.Queue(&a.work));
  ASSERT_TRUE(wq.Queue(&b.work));
  std::thread stopper([&] { wq.Stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Stop waits on the gate
  go = true;
  stopper.join();
  EXPECT_EQ(a.runs.load(), 1);
  EXPECT_EQ(b.runs.load(), 1);
  EXPECT_EQ(c.runs.load(), 1);
  std::lock_guard<std::mutex> l(rec.mu);
  EXPECT_EQ(rec.order, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(wq.started());
}

TEST(WorkQueueTest, CancelTakesAWaitingItemOffAndWaitsForARunningOne) {
  Recorder rec;
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("work-test").ok());
  std::atomic<int> state{0};  // 1: the slow item runs; 2: let it finish
  Work slow;
  slow.fn = [](void* arg) {
    auto* s = static_cast<std::atomic<int>*>(arg);
    s->store(1);
    while (s->load() != 2) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s->store(3);
  };
  slow.arg = &state;
  Item waiting(&rec, 5);
  ASSERT_TRUE(wq.Queue(&slow));
  ASSERT_TRUE(wq.Queue(&waiting.work));
  ASSERT_TRUE(Eventually([&] { return state.load() == 1; }));
  wq.Cancel(&waiting.work);  // queued behind the slow one: taken off
  EXPECT_FALSE(waiting.work.queued);
  state = 2;
  wq.Cancel(&slow);  // running: returns once it has finished
  EXPECT_EQ(state.load(), 3);
  wq.Stop();
  EXPECT_EQ(waiting.runs.load(), 0);
  EXPECT_EQ(wq.Stats().ran, 1u);
}

// Many producers racing the worker's sleep: no wake-up is lost (each round
// would otherwise wait out Eventually's limit).
TEST(WorkQueueTest, QueueRacingTheWorkersSleepNeverLosesAWakeUp) {
  Recorder rec;
  WorkQueue wq;
  ASSERT_TRUE(wq.Start("work-test").ok());
  std::vector<std::unique_ptr<Item>> items;
  for (int i = 0; i < 4; i++) items.push_back(std::make_unique<Item>(&rec, i));
  for (int round = 0; round < 2000; round++) {
    std::vector<std::thread> producers;
    for (int i = 0; i < 4; i++) producers.emplace_back([&, i] { wq.Queue(&items[i]->work); });
    for (auto& t : producers) t.join();
    ASSERT_TRUE(Eventually([&] {
      const WorkStats s = wq.Stats();
      return s.ran == s.queued;
    })) << "round " << round;
  }
  wq.Stop();
  for (auto& it : items) EXPECT_GE(it->runs.load(), 1);
}

}  // namespace
}  // namespace tfs
