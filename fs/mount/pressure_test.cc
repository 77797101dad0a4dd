// Memory pressure on a mounted instance: the btree node cache and the write
// buffer give memory back when the platform's shrinkers are called
// (platform::Shrinker; userspace/platform/pressure.h drives them), and the
// data stays whole.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mount/instance.h"
#include "mount/testing.h"
#include "userspace/platform/pressure.h"

namespace tfs::mount {
namespace {

const posix::Caller kRoot{0, 0};

struct Mounted {
  std::unique_ptr<userspace::MemDevice> dev = testing::FormattedMember();
  std::unique_ptr<Instance> inst = std::make_unique<Instance>();
  Mounted() {
    BlockDevice* b = dev.get();
    Diag diag;
    EXPECT_TRUE(inst->Open(&b, 1, Options{}, &diag).ok()) << diag.text;
  }
  posix::Filesystem& fs() { return inst->fs(); }
  u64 Create(const std::string& name) {
    auto a = fs().Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
    EXPECT_TRUE(a.ok()) << name;
    return a.ok() ? a.value().ino : 0;
  }
  std::string ReadAll(u64 ino, u32 len) {
    std::string out(len, '\0');
    auto r = fs().Read(ino, 0, out.data(), len);
    EXPECT_TRUE(r.ok());
    out.resize(r.ok() ? r.value() : 0);
    return out;
  }
};

// Waits (as long as it takes: no timing is asserted) until pred holds.
template <typename P>
void WaitFor(P pred) {
  while (!pred()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

TEST(PressureTest, TheNodeCacheGivesCleanNodesBack) {
  Mounted m;
  for (int i = 0; i < 3000; i++) m.Create("file-with-a-longish-name-" + std::to_string(i));
  // Checkpointed: the nodes are clean, so they can go.
  ASSERT_TRUE(m.inst->store().btrees().Checkpoint().ok());
  const btree::Stats before = m.inst->store().btrees().GetStats();
  ASSERT_GT(before.cached_bytes, 4 * 64 * 1024u);
  ASSERT_GT(userspace::CountAll(), 0u);
  const u64 freed = userspace::ShrinkAll(userspace::CountAll());
  const btree::Stats after = m.inst->store().btrees().GetStats();
  EXPECT_GT(freed, 0u);
  EXPECT_GE(after.shrinks, before.shrinks + 1);
  EXPECT_GT(after.shrunk_bytes, before.shrunk_bytes);
  EXPECT_LT(after.cached_bytes, before.cached_bytes);
  EXPECT_GT(after.evictions, before.evictions);
  // Every name is still there (read back from the members).
  for (int i = 0; i < 3000; i += 7) {
    const std::string n = "file-with-a-longish-name-" + std::to_string(i);
    EXPECT_TRUE(m.fs().Lookup(posix::kRootIno, n.data(), u32(n.size())).ok()) << n;
  }
  EXPECT_GT(m.inst->store().btrees().GetStats().cache_misses, before.cache_misses);
}

TEST(PressureTest, TheWriteBufferIsWrittenOutAndFreed) {
  Mounted m;
  const u64 f = m.Create("f");
  ASSERT_TRUE(m.fs().Open(f, 0).ok());
  ASSERT_TRUE(m.fs().Write(f, 0, "buffered", 8).ok());
  ASSERT_EQ(m.fs().GetStats().buffers_now, 1u);
  // The shrinker only asks; the flusher writes the run out and frees the buffer.
  (void)userspace::ShrinkAll(userspace::CountAll());
  WaitFor([&] { return m.fs().GetStats().buffers_now == 0; });
  const posix::Stats s = m.fs().GetStats();
  EXPECT_EQ(s.buffers_shrunk, 1u);
  EXPECT_EQ(s.flushes_pressure, 1u);
  EXPECT_EQ(s.buffers_dropped, 0u);  // written, not lost
  EXPECT_EQ(m.ReadAll(f, 64), "buffered");
  // The file is still open and buffers again.
  ASSERT_TRUE(m.fs().Write(f, 8, "-again", 6).ok());
  EXPECT_EQ(m.fs().GetStats().buffers_now, 1u);
  EXPECT_EQ(m.ReadAll(f, 64), "buffered-again");
  ASSERT_TRUE(m.fs().Release(f).ok());
  ASSERT_TRUE(m.inst->Close().ok());
  m.inst = std::make_unique<Instance>();  // (an instance opens once)
  BlockDevice* b = m.dev.get();
  Diag diag;
  ASSERT_TRUE(m.inst->Open(&b, 1, Options{}, &diag).ok()) << diag.text;
  auto l = m.fs().Lookup(posix::kRootIno, "f", 1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(m.ReadAll(l.value().ino, 64), "buffered-again");
}

// Writers and readers of open files while the shrinkers run over and over:
// buffers freed under them never lose or tear data.
TEST(PressureTest, ShrinkingUnderWritersAndReadersKeepsEveryByte) {
  Mounted m;
  constexpr int kFiles = 4;
  constexpr u32 kChunk = 1000;  // not block-aligned: buffered, merged runs
  constexpr int kChunks = 300;
  std::vector<u64> inos;
  for (int i = 0; i < kFiles; i++) {
    inos.push_back(m.Create("w" + std::to_string(i)));
    ASSERT_TRUE(m.fs().Open(inos.back(), 0).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<u64> shrinks{0};
  std::thread shrinker([&] {
    while (!stop.load()) {
      (void)userspace::ShrinkAll(userspace::CountAll());
      shrinks++;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kFiles; i++) {
    threads.emplace_back([&, i] {
      std::string chunk(kChunk, char('a' + i));
      for (int c = 0; c < kChunks; c++) {
        // Half-way, each writer waits until buffers have been freed under
        // the writers (the shrinker keeps asking): the rest runs over them.
        if (c == kChunks / 2)
          while (m.fs().GetStats().buffers_shrunk == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        chunk[0] = char('0' + c % 10);
        if (!m.fs().Write(inos[i], u64(c) * kChunk, chunk.data(), kChunk).ok()) failures++;
        // Read back what this writer wrote last: it is there whatever the shrinker did.
        std::string back(kChunk, '\0');
        auto r = m.fs().Read(inos[i], u64(c) * kChunk, back.data(), kChunk);
        if (!r.ok() || back != chunk) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  stop = true;
  shrinker.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(shrinks.load(), 0u);
  EXPECT_GT(m.fs().GetStats().buffers_shrunk, 0u);
  EXPECT_EQ(m.fs().GetStats().buffers_dropped, 0u);
  for (int i = 0; i < kFiles; i++) {
    const std::string all = m.ReadAll(inos[i], kChunk * kChunks + 10);
    ASSERT_EQ(all.size(), size_t(kChunk) * kChunks);
    for (int c = 0; c < kChunks; c++) {
      EXPECT_EQ(all[size_t(c) * kChunk], char('0' + c % 10)) << i << " " << c;
      EXPECT_EQ(all[size_t(c) * kChunk + kChunk - 1], char('a' + i)) << i << " " << c;
    }
    ASSERT_TRUE(m.fs().Release(inos[i]).ok());
  }
}

}  // namespace
}  // namespace tfs::mount
