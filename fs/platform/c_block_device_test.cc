// CBlockDevice over a device written in C (userspace/platform/c_mem_device.c,
// compiled as C11 into this test): every op, FUA and flush against a volatile
// cache, the errors the adapter answers itself and those the C side reports,
// completions inline and from another thread; then a whole filesystem --
// format, mount, write, fsync, read, unmount, remount -- on C members.
#include "platform/c_block_device.h"

#include <errno.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mount/instance.h"
#include "mount/testing.h"
#include "platform/platform.h"
#include "userspace/platform/c_mem_device.h"

namespace tfs {
namespace {

constexpr u32 kBlock = 512;

tfs_c_mem_options Options(int completion, u64 size = 1 << 20) {
  tfs_c_mem_options o = {};
  o.name = "cmem0";
  o.size = size;
  o.logical_block_size = kBlock;
  o.supports_fua = true;
  o.supports_discard = true;
  o.completion = completion;
  return o;
}

// One C device and its adapter.
struct CDev {
  explicit CDev(const tfs_c_mem_options& o) : c(tfs_c_mem_create(&o)) {
    EXPECT_NE(c, nullptr);
    dev = std::make_unique<CBlockDevice>(c);
  }
  ~CDev() {
    dev.reset();
    tfs_c_mem_destroy(c);
  }
  tfs_c_mem_stats Stats() const {
    tfs_c_mem_stats s;
    tfs_c_mem_get_stats(c, &s);
    return s;
  }
  u64 Received() const {
    tfs_c_mem_stats s = Stats();
    return s.ops[0] + s.ops[1] + s.ops[2] + s.ops[3] + s.bad_requests;
  }

  tfs_block_device* c;
  std::unique_ptr<CBlockDevice> dev;
};

std::vector<u8> Pattern(u64 len, u8 seed) {
  std::vector<u8> v(len);
  for (u64 i = 0; i < len; i++) v[i] = u8(seed + i * 7 + i / 251);
  return v;
}

class CBlockDeviceOpsTest : public ::testing::TestWithParam<int> {};

TEST_P(CBlockDeviceOpsTest, EveryOpGoesThroughTheCDevice) {
  CDev d(Options(GetParam()));
  BlockDevice& dev = *d.dev;
  std::vector<u8> w = Pattern(8 * kBlock, 3), r(8 * kBlock, 0xee);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 4 * kBlock, w.data(), w.size(), 0, IoOrigin::kJournal).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 4 * kBlock, r.data(), r.size(), 0, IoOrigin::kFsck).ok());
  EXPECT_EQ(r, w);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0, w.data(), kBlock, IoRequest::kFua, IoOrigin::kSuperblock).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kBtree).ok());
  // A discarded range reads back as the device likes: this one, zeros.
  ASSERT_TRUE(SyncIo(dev, IoOp::kDiscard, 6 * kBlock, nullptr, 2 * kBlock, 0, IoOrigin::kCopygc).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 4 * kBlock, r.data(), r.size()).ok());
  EXPECT_EQ(0, memcmp(r.data(), w.data(), 2 * kBlock));
  EXPECT_EQ(std::vector<u8>(r.begin() + 2 * kBlock, r.begin() + 4 * kBlock), std::vector<u8>(2 * kBlock, 0));
  EXPECT_EQ(0, memcmp(r.data() + 4 * kBlock, w.data() + 4 * kBlock, 4 * kBlock));

  tfs_c_mem_stats s = d.Stats();
  EXPECT_EQ(s.ops[TFS_BLOCK_READ], 2u);
  EXPECT_EQ(s.ops[TFS_BLOCK_WRITE], 2u);
  EXPECT_EQ(s.ops[TFS_BLOCK_FLUSH], 1u);
  EXPECT_EQ(s.ops[TFS_BLOCK_DISCARD], 1u);
  EXPECT_EQ(s.fua_writes, 1u);
  // The origin tag arrives as it was given.
  EXPECT_EQ(s.by_origin[TFS_IO_JOURNAL], 1u);
  EXPECT_EQ(s.by_origin[TFS_IO_FSCK], 1u);
  EXPECT_EQ(s.by_origin[TFS_IO_SUPERBLOCK], 1u);
  EXPECT_EQ(s.by_origin[TFS_IO_BTREE], 1u);
  EXPECT_EQ(s.by_origin[TFS_IO_COPYGC], 1u);
  EXPECT_EQ(s.by_origin[TFS_IO_OTHER], 1u);
  EXPECT_EQ(s.bad_requests, 0u);  // the C side saw only what the contract promises
}

// Many requests in flight at once from several threads: each completes once,
// with its own data.
TEST_P(CBlockDeviceOpsTest, ConcurrentRequestsCompleteOnceEach) {
  CDev d(Options(GetParam()));
  constexpr int kThreads = 4, kPerThread = 64;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::vector<IoRequest> reqs(kPerThread);
      std::vector<std::vector<u8>> bufs(kPerThread);
      std::atomic<int> done{0};
      for (int i = 0; i < kPerThread; i++) {
        bufs[i] = Pattern(kBlock, u8(t * kPerThread + i));
        IoRequest& q = reqs[i];
        q.op = IoOp::kWrite;
        q.offset = u64(t * kPerThread + i) * kBlock;
        q.length = kBlock;
        q.buf = bufs[i].data();
        q.caller_data = &done;
        q.done = [](IoRequest* r, Status st) {
          EXPECT_TRUE(st.ok()) << st.Name();
          static_cast<std::atomic<int>*>(r->caller_data)->fetch_add(1);
        };
        d.dev->Submit(&q);
      }
      while (done.load() < kPerThread) std::this_thread::yield();
      for (int i = 0; i < kPerThread; i++) {
        std::vector<u8> r(kBlock);
        if (!SyncIo(*d.dev, IoOp::kRead, reqs[i].offset, r.data(), kBlock).ok() || r != bufs[i]) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(d.Stats().ops[TFS_BLOCK_WRITE], u64(kThreads * kPerThread));
}

INSTANTIATE_TEST_SUITE_P(Completions, CBlockDeviceOpsTest,
                         ::testing::Values(TFS_C_MEM_INLINE, TFS_C_MEM_THREAD, TFS_C_MEM_ALTERNATE),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param == TFS_C_MEM_INLINE   ? "Inline"
                                              : p.param == TFS_C_MEM_THREAD ? "Thread"
                                                                            : "Alternate");
                         });

// Where `done` runs: inside Submit on the submitter's thread, or on the C
// device's worker thread -- both are allowed, and the adapter passes either on.
TEST(CBlockDeviceTest, CompletionsInlineAndFromAnotherThread) {
  for (int mode : {TFS_C_MEM_INLINE, TFS_C_MEM_THREAD}) {
    CDev d(Options(mode));
    struct Seen {
      std::promise<std::thread::id> thread;
      std::atomic<bool> called{false};
    } seen;
    std::vector<u8> buf(kBlock);
    IoRequest req;
    req.op = IoOp::kRead;
    req.length = kBlock;
    req.buf = buf.data();
    req.caller_data = &seen;
    req.done = [](IoRequest* r, Status st) {
      EXPECT_TRUE(st.ok());
      auto* s = static_cast<Seen*>(r->caller_data);
      s->called = true;
      s->thread.set_value(std::this_thread::get_id());
    };
    auto fut = seen.thread.get_future();
    d.dev->Submit(&req);
    if (mode == TFS_C_MEM_INLINE) {
      EXPECT_TRUE(seen.called.load());  // before Submit returned
    }
    std::thread::id where = fut.get();
    EXPECT_EQ(where == std::this_thread::get_id(), mode == TFS_C_MEM_INLINE);
  }
}

// FUA and flush mean durable: a power cut keeps exactly the writes one of them
// covered.
TEST(CBlockDeviceTest, FuaAndFlushMakeWritesDurable) {
  tfs_c_mem_options o = Options(TFS_C_MEM_THREAD);
  o.volatile_cache = true;
  CDev d(o);
  BlockDevice& dev = *d.dev;
  std::vector<u8> a = Pattern(kBlock, 1), b = Pattern(kBlock, 2), c = Pattern(kBlock, 3),
                  e = Pattern(kBlock, 4);
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0 * kBlock, a.data(), kBlock).ok());  // covered by the flush
  ASSERT_TRUE(SyncIo(dev, IoOp::kFlush, 0, nullptr, 0).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 1 * kBlock, b.data(), kBlock, IoRequest::kFua).ok());
  ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 2 * kBlock, c.data(), kBlock).ok());  // never covered
  // The FUA flag is a write's only: on a read it is not passed on.
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 3 * kBlock, e.data(), kBlock, IoRequest::kFua).ok());
  tfs_c_mem_crash(d.c);
  std::vector<u8> r(4 * kBlock);
  ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 0, r.data(), r.size()).ok());
  EXPECT_EQ(0, memcmp(r.data(), a.data(), kBlock));
  EXPECT_EQ(0, memcmp(r.data() + kBlock, b.data(), kBlock));
  EXPECT_EQ(std::vector<u8>(r.begin() + 2 * kBlock, r.begin() + 3 * kBlock), std::vector<u8>(kBlock, 0));
  EXPECT_EQ(d.Stats().fua_writes, 1u);
  EXPECT_EQ(d.Stats().bad_requests, 0u);  // (a read with FUA would be one)
}

// Requests the contract forbids are failed by the adapter, through `done`, and
// never reach the C side.
TEST(CBlockDeviceTest, InvalidRequestsFailThroughDoneBeforeTheCDevice) {
  CDev d(Options(TFS_C_MEM_THREAD));
  BlockDevice& dev = *d.dev;
  std::vector<u8> buf(4 * kBlock);
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, 100, buf.data(), kBlock).code(), Err::kMisaligned);
  EXPECT_EQ(SyncIo(dev, IoOp::kWrite, 0, buf.data(), 100).code(), Err::kMisaligned);
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, (1 << 20) - kBlock, buf.data(), 2 * kBlock).code(), Err::kOutOfRange);
  EXPECT_EQ(SyncIo(dev, IoOp::kWrite, 1 << 20, buf.data(), kBlock).code(), Err::kOutOfRange);
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, 0, nullptr, kBlock).code(), Err::kInvalidArgument);
  EXPECT_EQ(SyncIo(dev, IoOp::kRead, 0, buf.data(), 0).code(), Err::kInvalidArgument);
  EXPECT_EQ(SyncIo(dev, IoOp(7), 0, buf.data(), kBlock).code(), Err::kInvalidArgument);
  EXPECT_EQ(d.Received(), 0u);

  tfs_c_mem_options ro = Options(TFS_C_MEM_INLINE);
  ro.read_only = true;
  ro.supports_discard = false;
  CDev r(ro);
  EXPECT_TRUE(r.dev->Info().read_only);
  EXPECT_EQ(SyncIo(*r.dev, IoOp::kWrite, 0, buf.data(), kBlock).code(), Err::kReadOnly);
  EXPECT_EQ(SyncIo(*r.dev, IoOp::kDiscard, 0, nullptr, kBlock).code(), Err::kReadOnly);
  EXPECT_EQ(r.Received(), 0u);
  EXPECT_TRUE(SyncIo(*r.dev, IoOp::kRead, 0, buf.data(), kBlock).ok());
  EXPECT_TRUE(SyncIo(*r.dev, IoOp::kFlush, 0, nullptr, 0).ok());

  tfs_c_mem_options nd = Options(TFS_C_MEM_INLINE);
  nd.supports_discard = false;
  CDev n(nd);
  EXPECT_EQ(SyncIo(*n.dev, IoOp::kDiscard, 0, nullptr, kBlock).code(), Err::kNotSupported);
  EXPECT_EQ(n.Received(), 0u);
}

// What the C side reports comes back as the Status the one errno mapping gives
// (Status::FromErrno, as for io_uring's errors), and the device goes on.
TEST(CBlockDeviceTest, CErrorsBecomeTheirStatus) {
  for (int mode : {TFS_C_MEM_INLINE, TFS_C_MEM_THREAD}) {
    CDev d(Options(mode));
    BlockDevice& dev = *d.dev;
    std::vector<u8> buf = Pattern(kBlock, 9), r(kBlock);
    tfs_c_mem_fail_next(d.c, TFS_BLOCK_WRITE, -EIO);
    Status st = SyncIo(dev, IoOp::kWrite, 0, buf.data(), kBlock);
    EXPECT_EQ(st.code(), Err::kIo);
    EXPECT_EQ(st, Status::FromErrno(-EIO));
    tfs_c_mem_fail_next(d.c, TFS_BLOCK_READ, -ETIMEDOUT);
    st = SyncIo(dev, IoOp::kRead, 0, r.data(), kBlock);
    EXPECT_EQ(st.code(), Err::kIoTimeout);
    EXPECT_TRUE(st.Is(ErrorClass::kIo));
    tfs_c_mem_fail_next(d.c, TFS_BLOCK_FLUSH, -ENOSPC);
    EXPECT_EQ(SyncIo(dev, IoOp::kFlush, 0, nullptr, 0).code(), Err::kNoSpace);
    tfs_c_mem_fail_next(d.c, TFS_BLOCK_DISCARD, -EOPNOTSUPP);
    EXPECT_EQ(SyncIo(dev, IoOp::kDiscard, 0, nullptr, kBlock).code(), Err::kNotSupported);
    // One failure each: the next requests succeed, and the failed write wrote nothing.
    ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 0, r.data(), kBlock).ok());
    EXPECT_EQ(r, std::vector<u8>(kBlock, 0));
    ASSERT_TRUE(SyncIo(dev, IoOp::kWrite, 0, buf.data(), kBlock).ok());
    ASSERT_TRUE(SyncIo(dev, IoOp::kRead, 0, r.data(), kBlock).ok());
    EXPECT_EQ(r, buf);
  }
}

TEST(CBlockDeviceTest, InfoAndNameAreTheCDevices) {
  tfs_c_mem_options o = Options(TFS_C_MEM_INLINE, 8 << 20);
  o.logical_block_size = 4096;
  o.supports_fua = false;
  o.supports_discard = false;
  CDev d(o);
  const BlockDeviceInfo& info = d.dev->Info();
  EXPECT_EQ(info.size, 8u << 20);
  EXPECT_EQ(info.logical_block_size, 4096u);
  EXPECT_FALSE(info.read_only);
  EXPECT_FALSE(info.supports_fua);
  EXPECT_FALSE(info.supports_discard);
  EXPECT_FALSE(info.completions_may_submit);  // a zeroed C info: the kernel's answer
  EXPECT_STREQ(d.dev->Name(), "cmem0");
  EXPECT_EQ(d.dev->c_device(), d.c);
  // 4096-byte blocks: 512 is misaligned now.
  std::vector<u8> buf(4096);
  EXPECT_EQ(SyncIo(*d.dev, IoOp::kRead, 512, buf.data(), 4096).code(), Err::kMisaligned);
  o.completions_may_submit = true;
  CDev e(o);
  EXPECT_TRUE(e.dev->Info().completions_may_submit);
}

// The adapter is made and deleted with the core's allocator, whichever way:
// platform::New/Delete (the kernel) or new/delete through a BlockDevice*.
TEST(CBlockDeviceTest, MadeAndDeletedEitherWay) {
  tfs_c_mem_options o = Options(TFS_C_MEM_INLINE);
  tfs_block_device* c = tfs_c_mem_create(&o);
  ASSERT_NE(c, nullptr);
  {
    platform::Owned<CBlockDevice> a = platform::Owned<CBlockDevice>::Make(c);
    ASSERT_TRUE(a);
    std::unique_ptr<BlockDevice> b(new CBlockDevice(c));
    std::vector<u8> buf = Pattern(kBlock, 5), r(kBlock);
    ASSERT_TRUE(SyncIo(*a, IoOp::kWrite, 0, buf.data(), kBlock).ok());
    ASSERT_TRUE(SyncIo(*b, IoOp::kRead, 0, r.data(), kBlock).ok());
    EXPECT_EQ(r, buf);
  }
  tfs_c_mem_destroy(c);
}

// The whole filesystem on C members: format, mount, write, fsync, read,
// unmount, mount again and read. The SSD completes alternately inline and on
// its thread and plays the kernel's device (its completions may not submit:
// the I/O queue's deferred dispatch, with one slot so that completions often
// find I/O waiting -- how often is the scheduler's, so it is recorded, not
// asserted), the HDD completes on its thread and may submit.
TEST(CBlockDeviceMountTest, FilesystemRoundTripOnCMembers) {
  tfs_c_mem_options so = Options(TFS_C_MEM_ALTERNATE, testing::kMemberBytes);
  so.name = "c-ssd";  // the kernel's case: deferred dispatch
  tfs_c_mem_options ho = Options(TFS_C_MEM_THREAD, testing::kMemberBytes);
  ho.name = "c-hdd";
  ho.completions_may_submit = true;  // the I/O queue dispatches from completions
  mount::Options mo;
  mo.store.queue.max_in_flight = 1;  // any second I/O waits for a completion
  mo.store.queue.reserved = 0;
  CDev ssd(so), hdd(ho);
  {
    store::FormatOptions f = testing::SmallFormat();
    f.foreground_target = f.metadata_target = "ssd";
    f.background_target = "hdd";
    store::FormatMember m[2] = {{ssd.dev.get(), "ssd.a", 1}, {hdd.dev.get(), "hdd.b", 1}};
    Diag diag;
    ASSERT_TRUE(store::Format(m, 2, f, &diag).ok()) << diag.text;
  }
  BlockDevice* members[2] = {hdd.dev.get(), ssd.dev.get()};
  const std::vector<u8> data = Pattern(3 << 20, 17);  // 3 MiB: several extents
  u64 ino = 0;
  {
    mount::Instance inst;
    Diag diag;
    ASSERT_TRUE(inst.Open(members, 2, mo, &diag).ok()) << diag.text;
    auto f = inst.fs().Mknod(posix::kRootIno, "file", 4, posix::kModeReg | 0644, 0, posix::Caller{});
    ASSERT_TRUE(f.ok()) << f.status().Name();
    ino = f.value().ino;
    ASSERT_TRUE(inst.fs().Open(ino, 0).ok());
    for (u64 off = 0; off < data.size(); off += 128 << 10) {
      auto w = inst.fs().Write(ino, off, data.data() + off, 128 << 10);
      ASSERT_TRUE(w.ok()) << w.status().Name();
      ASSERT_EQ(w.value(), 128u << 10);
    }
    ASSERT_TRUE(inst.fs().Fsync(ino).ok());
    std::vector<u8> back(data.size());
    auto r = inst.fs().Read(ino, 0, back.data(), u32(back.size()));
    ASSERT_TRUE(r.ok()) << r.status().Name();
    ASSERT_EQ(r.value(), data.size());
    EXPECT_EQ(back, data);
    ASSERT_TRUE(inst.fs().Release(ino).ok());
    dev::DeviceSet& devs = inst.store().devs();
    for (u32 i = 0; i < devs.size(); i++) {
      const u64 deferred = devs.member(i)->queue().State().deferred_dispatches;
      if (std::string(devs.member(i)->label()) == "ssd.a") {
        RecordProperty("ssd_deferred_dispatches", std::to_string(deferred));
      } else {
        EXPECT_EQ(deferred, 0u);  // it may submit: nothing deferred
      }
    }
    ASSERT_TRUE(inst.Close().ok());
  }
  // Everything went through the C devices, and only valid requests did.
  tfs_c_mem_stats s = ssd.Stats();
  EXPECT_GT(s.ops[TFS_BLOCK_WRITE], 0u);
  EXPECT_GT(s.ops[TFS_BLOCK_FLUSH] + s.fua_writes, 0u);
  EXPECT_GT(s.by_origin[TFS_IO_JOURNAL], 0u);
  EXPECT_GT(s.by_origin[TFS_IO_FOREGROUND_WRITE], 0u);
  EXPECT_EQ(s.bad_requests, 0u);
  EXPECT_GT(hdd.Stats().ops[TFS_BLOCK_WRITE], 0u);  // its superblock and tables at least
  EXPECT_EQ(hdd.Stats().bad_requests, 0u);

  mount::Instance inst;
  Diag diag;
  store::OpenReport rep;
  ASSERT_TRUE(inst.Open(members, 2, mo, &diag, &rep).ok()) << diag.text;
  EXPECT_TRUE(rep.was_clean);
  auto f = inst.fs().Lookup(posix::kRootIno, "file", 4);
  ASSERT_TRUE(f.ok()) << f.status().Name();
  EXPECT_EQ(f.value().ino, ino);
  EXPECT_EQ(f.value().size, data.size());
  std::vector<u8> back(data.size());
  auto r = inst.fs().Read(ino, 0, back.data(), u32(back.size()));
  ASSERT_TRUE(r.ok()) << r.status().Name();
  ASSERT_EQ(r.value(), data.size());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(inst.Close().ok());
}

}  // namespace
}  // namespace tfs
