#include "userspace/platform/uring_device.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "platform/sync.h"
#include "userspace/platform/io_testing.h"

namespace tfs::userspace {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::unique_ptr<UringDevice> OpenOrDie(const std::string& path, UringOptions o = {}) {
  auto r = UringDevice::Open(path, o);
  EXPECT_TRUE(r.ok()) << path << ": " << r.status().Message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

// Aligned storage so the "aligned" cases really are aligned.
struct AlignedBuf {
  explicit AlignedBuf(size_t n) : p(static_cast<uint8_t*>(aligned_alloc(4096, n))), size(n) {}
  ~AlignedBuf() { free(p); }
  uint8_t* p;
  size_t size;
};

TEST(UringDeviceTest, OpenErrorsAreClear) {
  EXPECT_TRUE(UringDevice::Open("/nonexistent/tierfs/dev").status().Is(ErrorClass::kNotFound));
  EXPECT_TRUE(UringDevice::Open("/tmp").status().Is(ErrorClass::kInvalid));
  ScratchFile empty(0);
  EXPECT_TRUE(UringDevice::Open(empty.path()).status().Is(ErrorClass::kInvalid));
  ScratchFile f(kMiB);
  UringOptions bad;
  bad.queue_depth = 0;
  EXPECT_TRUE(UringDevice::Open(f.path(), bad).status().Is(ErrorClass::kInvalid));
}

TEST(UringDeviceTest, InfoDescribesTheFile) {
  ScratchFile f(4 * kMiB + 100);  // size is rounded down to the block size
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  uint32_t lbs = dev->LogicalBlockSize();
  EXPECT_TRUE(lbs == 512 || lbs == 4096) << lbs;
  EXPECT_EQ(dev->Size() % lbs, 0u);
  EXPECT_GE(dev->Size(), 4 * kMiB);
  EXPECT_LE(dev->Size(), 4 * kMiB + 100);
  EXPECT_EQ(std::string(dev->Name()), f.path());
  EXPECT_FALSE(dev->Info().read_only);
}

TEST(UringDeviceTest, RoundTripAlignedAndUnalignedBuffers) {
  ScratchFile f(4 * kMiB);
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  const uint64_t len = 64 * 1024;
  std::vector<uint8_t> data = Pattern(len, 1);

  AlignedBuf a(len);
  memcpy(a.p, data.data(), len);
  ASSERT_TRUE(SyncIo(*dev, IoOp::kWrite, 0, a.p, len).ok());

  // Unaligned source and destination buffers (one byte past an aligned address).
  std::vector<uint8_t> raw(len + 1);
  std::vector<uint8_t> data2 = Pattern(len, 2);
  memcpy(raw.data() + 1, data2.data(), len);
  ASSERT_TRUE(SyncIo(*dev, IoOp::kWrite, len, raw.data() + 1, len, IoRequest::kFua).ok());
  ASSERT_TRUE(SyncIo(*dev, IoOp::kFlush, 0, nullptr, 0).ok());

  AlignedBuf back(len);
  ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, 0, back.p, len).ok());
  EXPECT_EQ(memcmp(back.p, data.data(), len), 0);
  std::vector<uint8_t> raw_back(len + 1);
  ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, len, raw_back.data() + 1, len).ok());
  EXPECT_EQ(memcmp(raw_back.data() + 1, data2.data(), len), 0);
  if (dev->direct()) {
    EXPECT_GE(dev->Stats().bounced, 2u);
  }

  // The bytes really reached the file.
  dev.reset();
  FILE* fp = fopen(f.path().c_str(), "rb");
  ASSERT_NE(fp, nullptr);
  std::vector<uint8_t> file(2 * len);
  ASSERT_EQ(fread(file.data(), 1, file.size(), fp), file.size());
  fclose(fp);
  EXPECT_EQ(memcmp(file.data(), data.data(), len), 0);
  EXPECT_EQ(memcmp(file.data() + len, data2.data(), len), 0);
}

TEST(UringDeviceTest, InvalidRequestsFailThroughTheCallback) {
  ScratchFile f(kMiB);
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  AlignedBuf buf(8192);
  uint32_t lbs = dev->LogicalBlockSize();
  EXPECT_EQ(SyncIo(*dev, IoOp::kRead, dev->Size(), buf.p, lbs), Status(Err::kOutOfRange));
  EXPECT_EQ(SyncIo(*dev, IoOp::kRead, dev->Size() - lbs, buf.p, 2 * lbs), Status(Err::kOutOfRange));
  EXPECT_EQ(SyncIo(*dev, IoOp::kRead, 1, buf.p, lbs), Status(Err::kMisaligned));
  EXPECT_EQ(SyncIo(*dev, IoOp::kWrite, 0, buf.p, lbs + 1), Status(Err::kMisaligned));
  EXPECT_EQ(SyncIo(*dev, IoOp::kRead, 0, nullptr, lbs), Status(Err::kInvalidArgument));
  EXPECT_EQ(SyncIo(*dev, IoOp::kRead, 0, buf.p, 0), Status(Err::kInvalidArgument));
  UringStats s = dev->Stats();
  EXPECT_EQ(s.errors, 6u);
  EXPECT_EQ(s.completed, s.submitted);
}

TEST(UringDeviceTest, ReadOnlyDeviceRefusesWrites) {
  ScratchFile f(kMiB);
  UringOptions ro;
  ro.read_only = true;
  auto dev = OpenOrDie(f.path(), ro);
  ASSERT_TRUE(dev);
  EXPECT_TRUE(dev->Info().read_only);
  AlignedBuf buf(4096);
  EXPECT_EQ(SyncIo(*dev, IoOp::kWrite, 0, buf.p, 4096), Status(Err::kReadOnly));
  EXPECT_EQ(SyncIo(*dev, IoOp::kDiscard, 0, nullptr, 4096), Status(Err::kReadOnly));
  EXPECT_TRUE(SyncIo(*dev, IoOp::kRead, 0, buf.p, 4096).ok());
}

TEST(UringDeviceTest, OsErrorsPropagate) {
  // The backing file shrinks under the device: a read inside the device's size
  // now hits end of file, which must come back as an I/O error, not as zeros.
  ScratchFile f(kMiB);
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  ASSERT_EQ(truncate(f.path().c_str(), 0), 0);
  AlignedBuf buf(4096);
  Status st = SyncIo(*dev, IoOp::kRead, kMiB - 4096, buf.p, 4096);
  EXPECT_TRUE(st.Is(ErrorClass::kIo)) << st.Name();
}

TEST(UringDeviceTest, DiscardZeroesFileRange) {
  ScratchFile f(kMiB);
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  AlignedBuf buf(65536);
  memset(buf.p, 0xab, buf.size);
  ASSERT_TRUE(SyncIo(*dev, IoOp::kWrite, 0, buf.p, buf.size).ok());
  ASSERT_TRUE(SyncIo(*dev, IoOp::kDiscard, 0, nullptr, buf.size).ok());
  ASSERT_TRUE(SyncIo(*dev, IoOp::kRead, 0, buf.p, buf.size).ok());
  EXPECT_TRUE(std::all_of(buf.p, buf.p + buf.size, [](uint8_t b) { return b == 0; }));
}

struct Batch {
  Latch latch;
  std::mutex mu;
  std::vector<int> order;  // completion order, by request index
  std::vector<Status> status;
  explicit Batch(int n) : latch(uint32_t(n)), status(size_t(n)) {}
};

void BatchDone(IoRequest* req, Status st) {
  auto* b = static_cast<Batch*>(req->caller_data);
  {
    std::lock_guard<std::mutex> lock(b->mu);
    b->order.push_back(int(req->offset / req->length));  // (request i at offset i x its length)
    b->status[req->offset / req->length] = st;
  }
  b->latch.CountDown();
}

TEST(UringDeviceTest, SixtyFourConcurrentRequestsThroughAShallowRing) {
  ScratchFile f(8 * kMiB);
  UringOptions o;
  o.queue_depth = 8;  // 64 requests: most of them wait in the device's FIFO
  auto dev = OpenOrDie(f.path(), o);
  ASSERT_TRUE(dev);
  constexpr int kN = 64;
  constexpr uint64_t kLen = 65536;
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < kN; i++) data.push_back(Pattern(kLen, 100 + i));

  std::vector<IoRequest> reqs(kN);
  {
    Batch batch(kN);
    for (int i = 0; i < kN; i++) {
      IoRequest& r = reqs[i];
      r.op = IoOp::kWrite;
      r.origin = IoOrigin::kForegroundWrite;
      r.offset = uint64_t(i) * kLen;
      r.length = kLen;
      r.buf = data[i].data();  // std::vector memory: often unaligned for O_DIRECT
      r.done = BatchDone;
      r.caller_data = &batch;
    }
    // Submit from two threads at once.
    std::thread t1([&] { for (int i = 0; i < kN; i += 2) dev->Submit(&reqs[i]); });
    std::thread t2([&] { for (int i = 1; i < kN; i += 2) dev->Submit(&reqs[i]); });
    t1.join();
    t2.join();
    ASSERT_TRUE(batch.latch.WaitFor(60 * platform::kNsPerSec));
    for (const Status& st : batch.status) EXPECT_TRUE(st.ok()) << st.Name();
    std::set<int> seen(batch.order.begin(), batch.order.end());
    EXPECT_EQ(seen.size(), size_t(kN));  // each request completed exactly once
    EXPECT_EQ(batch.order.size(), size_t(kN));
  }
  EXPECT_GE(dev->Stats().queued_max, 1u);

  // Read everything back concurrently, into fresh buffers, in reverse order.
  std::vector<std::vector<uint8_t>> back(kN, std::vector<uint8_t>(kLen));
  Batch batch(kN);
  for (int i = kN - 1; i >= 0; i--) {
    IoRequest& r = reqs[i];
    r.op = IoOp::kRead;
    r.buf = back[i].data();
    r.caller_data = &batch;
    dev->Submit(&r);
  }
  ASSERT_TRUE(batch.latch.WaitFor(60 * platform::kNsPerSec));
  for (int i = 0; i < kN; i++) {
    EXPECT_TRUE(batch.status[i].ok());
    EXPECT_EQ(back[i], data[i]) << "request " << i;
  }
  UringStats s = dev->Stats();
  EXPECT_EQ(s.completed, s.submitted);
  EXPECT_EQ(s.errors, 0u);
}

// Eight threads submit at once through a shallow ring while completions
// refill it: every request completes exactly once with its own data.
// Direct and buffered, with one and four slots. The threads exit before
// their requests complete: a request io_uring handed to its worker pool
// and had not started then comes back ECANCELED, and must be sent again,
// not failed (with a draft of a two-lock submission path that made this
// common, about half the runs failed so; with this path it was not seen
// in 20 runs without the fix, so this test does not always catch that).
TEST(UringDeviceTest, ManySubmittersAtOnceLoseNoRequest) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 400;
  constexpr int kN = kThreads * kPerThread;
  constexpr uint64_t kLen = 4096;
  auto fill = [](int i) { return uint8_t(i % 255 + 1); };  // (never the zeros a read starts from)
  struct Config {
    bool direct;
    unsigned depth;
  };
  for (Config cfg : {Config{true, 4}, Config{false, 1}, Config{false, 4}}) {
    SCOPED_TRACE(testing::Message() << "direct " << cfg.direct << " depth " << cfg.depth);
    ScratchFile f(uint64_t(kN) * kLen);
    UringOptions o;
    o.queue_depth = cfg.depth;
    o.try_direct = cfg.direct;
    auto dev = OpenOrDie(f.path(), o);
    ASSERT_TRUE(dev);
    AlignedBuf all(size_t(kN) * kLen);
    auto buf = [&](int i) { return all.p + size_t(i) * kLen; };
    for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
      for (int i = 0; i < kN; i++) memset(buf(i), op == IoOp::kWrite ? fill(i) : 0, kLen);
      std::vector<IoRequest> reqs(kN);
      Batch batch(kN);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
          for (int k = 0; k < kPerThread; k++) {
            const int i = k * kThreads + t;
            IoRequest& r = reqs[i];
            r.op = op;
            r.origin = IoOrigin::kForegroundWrite;
            r.offset = uint64_t(i) * kLen;
            r.length = kLen;
            r.buf = buf(i);
            r.done = BatchDone;
            r.caller_data = &batch;
            dev->Submit(&r);
          }
        });
      for (std::thread& t : threads) t.join();
      if (!batch.latch.WaitFor(120 * platform::kNsPerSec)) {
        // (Leaving would free the requests under the device: stop here.)
        fprintf(stderr, "a request never completed\n");
        std::abort();
      }
      EXPECT_EQ(batch.order.size(), size_t(kN));
      std::set<int> seen(batch.order.begin(), batch.order.end());
      EXPECT_EQ(seen.size(), size_t(kN));  // each exactly once
      for (int i = 0; i < kN; i++) {
        ASSERT_TRUE(batch.status[i].ok()) << "request " << i << " op " << int(op) << ": " << batch.status[i].Name();
        if (op == IoOp::kRead) {
          const uint8_t want = fill(i);
          ASSERT_TRUE(std::all_of(buf(i), buf(i) + kLen, [&](uint8_t b) { return b == want; })) << "request " << i;
        }
      }
    }
    UringStats s = dev->Stats();
    EXPECT_EQ(s.completed, s.submitted);
    EXPECT_EQ(s.errors, 0u);
  }
}

struct Chain {
  BlockDevice* dev = nullptr;
  int remaining = 0;
  Latch done{1};
  Status status;
};

void ChainDone(IoRequest* req, Status st) {
  auto* c = static_cast<Chain*>(req->caller_data);
  if (!st.ok() || --c->remaining == 0) {
    c->status = st;
    c->done.CountDown();
    return;
  }
  req->offset += req->length;
  c->dev->Submit(req);  // resubmitting from the completion thread must work
}

TEST(UringDeviceTest, CallbacksMaySubmit) {
  ScratchFile f(kMiB);
  UringOptions o;
  o.queue_depth = 1;
  auto dev = OpenOrDie(f.path(), o);
  ASSERT_TRUE(dev);
  AlignedBuf buf(4096);
  memset(buf.p, 7, 4096);
  Chain c;
  c.dev = dev.get();
  c.remaining = 100;
  IoRequest req;
  req.op = IoOp::kWrite;
  req.offset = 0;
  req.length = 4096;
  req.buf = buf.p;
  req.done = ChainDone;
  req.caller_data = &c;
  dev->Submit(&req);
  ASSERT_TRUE(c.done.WaitFor(60 * platform::kNsPerSec));
  EXPECT_TRUE(c.status.ok());
  EXPECT_EQ(c.remaining, 0);
}

// kInline reads, writes (aligned, unaligned, FUA) and flushes are done inside Submit():
// the callback has run when it returns, and the bytes are right.
TEST(UringDeviceTest, InlineRequestsCompleteInsideSubmit) {
  ScratchFile f(4 * kMiB);
  auto dev = OpenOrDie(f.path());
  ASSERT_TRUE(dev);
  const uint64_t len = 16 * 1024;
  std::vector<uint8_t> data = Pattern(len, 7);
  std::vector<uint8_t> raw(len + 1);
  memcpy(raw.data() + 1, data.data(), len);
  AlignedBuf a(len);
  memcpy(a.p, data.data(), len);
  struct Done {
    bool called = false;
    Status st;
  };
  auto run = [&](IoOp op, uint64_t off, void* buf, uint8_t flags) {
    Done d;
    IoRequest req;
    req.op = op;
    req.flags = uint8_t(flags | IoRequest::kInline);
    req.offset = off;
    req.length = len;
    req.buf = buf;
    req.caller_data = &d;
    req.done = [](IoRequest* r, Status st) {
      auto* d = static_cast<Done*>(r->caller_data);
      d->st = st;
      d->called = true;
    };
    dev->Submit(&req);
    EXPECT_TRUE(d.called);  // before Submit returned
    return d.st;
  };
  ASSERT_TRUE(run(IoOp::kWrite, 0, a.p, 0).ok());
  ASSERT_TRUE(run(IoOp::kWrite, len, raw.data() + 1, IoRequest::kFua).ok());
  AlignedBuf back(len);
  ASSERT_TRUE(run(IoOp::kRead, len, back.p, 0).ok());
  EXPECT_EQ(memcmp(back.p, data.data(), len), 0);
  std::vector<uint8_t> raw_back(len + 1);
  ASSERT_TRUE(run(IoOp::kRead, 0, raw_back.data() + 1, 0).ok());
  EXPECT_EQ(memcmp(raw_back.data() + 1, data.data(), len), 0);
  ASSERT_TRUE(run(IoOp::kFlush, 0, nullptr, 0).ok());  // an fdatasync in this thread
  EXPECT_EQ(dev->Stats().inline_ios, 5u);
  EXPECT_EQ(dev->Stats().completed, dev->Stats().submitted);
  // Past the end: an error through the callback, still inline.
  EXPECT_FALSE(run(IoOp::kRead, 4 * kMiB, back.p, 0).ok());
}

}  // namespace
}  // namespace tfs::userspace
