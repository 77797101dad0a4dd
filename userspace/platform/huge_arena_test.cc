#include "userspace/platform/huge_arena.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "platform/platform.h"

namespace tfs::userspace {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

void Fill(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; i++) b[i] = uint8_t((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}

bool Check(const void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != uint8_t((seed * 131 + i * 7 + (i >> 8)) & 0xff)) return false;
  return true;
}

bool AllZero(const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != 0) return false;
  return true;
}

TEST(HugeArenaTest, BlockSizesAreTightClassesWithBoundedWaste) {
  EXPECT_EQ(HugeArenaBlockSize(4095), 0u);
  EXPECT_EQ(HugeArenaBlockSize(4096), 4096u);
  EXPECT_EQ(HugeArenaBlockSize(4097), 8192u);
  EXPECT_EQ(HugeArenaBlockSize(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(HugeArenaBlockSize(64 * kKiB + 1), 80 * kKiB);
  EXPECT_EQ(HugeArenaBlockSize(96 * kKiB), 96 * kKiB);
  EXPECT_EQ(HugeArenaBlockSize(256 * kKiB), 256 * kKiB);
  EXPECT_EQ(HugeArenaBlockSize(768 * kKiB + 1), 896 * kKiB);
  EXPECT_EQ(HugeArenaBlockSize(kMiB), kMiB);
  EXPECT_EQ(HugeArenaBlockSize(kMiB + 1), kMiB + 4096);
  // Every size: the smallest class that fits, 4 KiB multiples, waste as the header
  // states. Classes are the distinct block sizes seen.
  std::vector<size_t> classes;
  for (size_t s = kHugeArenaMinSize; s <= kHugeArenaMaxClass; s++) {
    size_t b = HugeArenaBlockSize(s);
    ASSERT_GE(b, s);
    ASSERT_EQ(b % 4096, 0u) << s;
    if (s <= 64 * kKiB) {
      ASSERT_LT(b - s, 4096u) << s;
    } else {
      ASSERT_LT(4 * (b - s), s) << s;
    }
    if (classes.empty() || classes.back() != b) classes.push_back(b);
  }
  EXPECT_EQ(classes.size(), 32u);
  for (size_t i = 1; i < classes.size(); i++) {
    // A request one byte over a class lands in the next one.
    EXPECT_EQ(HugeArenaBlockSize(classes[i - 1] + 1), classes[i]);
  }
}

TEST(HugeArenaTest, ManySizesAreAlignedDistinctAndKeepTheirData) {
  std::vector<size_t> sizes;
  for (size_t s : {size_t(4096), size_t(4097), size_t(8191), size_t(8192), 60 * kKiB, 64 * kKiB,
                   64 * kKiB + 1, 80 * kKiB, 100 * kKiB, 128 * kKiB + 1, 256 * kKiB, 300 * kKiB,
                   512 * kKiB, 700 * kKiB, 768 * kKiB, kMiB - 1, kMiB, kMiB + 1, 2 * kMiB - 4096,
                   2 * kMiB, 2 * kMiB + 12345, 5 * kMiB})
    sizes.push_back(s);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; i++) sizes.push_back(4096 + rng() % (kMiB + kMiB / 2));
  const HugeArenaStats before = HugeArenaGetStats();
  struct Block {
    uint8_t* p;
    size_t n;
    uint64_t seed;
  };
  std::vector<Block> blocks;
  size_t expect_in_use = 0;
  const size_t aligns[] = {16, 64, 128, 4096};
  for (size_t i = 0; i < sizes.size(); i++) {
    const size_t align = aligns[i % 4];
    auto* p = static_cast<uint8_t*>(HugeArenaAlloc(sizes[i], align, false));
    ASSERT_NE(p, nullptr) << sizes[i];
    const bool packed = align > 64 || sizes[i] > 64 * kKiB;
    EXPECT_EQ(uintptr_t(p) % (packed ? 4096 : 64), 0u) << sizes[i] << " align " << align;
    if (sizes[i] > kHugeArenaMaxClass) {
      EXPECT_EQ(uintptr_t(p) % (2 * kMiB), 0u) << sizes[i];
    }
    Fill(p, sizes[i], i);
    blocks.push_back({p, sizes[i], i});
    expect_in_use += HugeArenaBlockSize(sizes[i]);
  }
  HugeArenaStats mid = HugeArenaGetStats();
  EXPECT_EQ(mid.in_use_bytes - before.in_use_bytes, expect_in_use);
  EXPECT_GE(mid.mapped_bytes - before.mapped_bytes, expect_in_use);
  EXPECT_EQ(mid.large_mappings - before.large_mappings,
            uint64_t(std::count_if(sizes.begin(), sizes.end(), [](size_t s) { return s > kHugeArenaMaxClass; })));
  // No two blocks overlap.
  std::vector<Block> sorted = blocks;
  std::sort(sorted.begin(), sorted.end(), [](const Block& a, const Block& b) { return a.p < b.p; });
  for (size_t i = 1; i < sorted.size(); i++) ASSERT_LE(sorted[i - 1].p + sorted[i - 1].n, sorted[i].p);
  // Free half in random order, allocate again, and check every survivor.
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (size_t i = 0; i < blocks.size() / 2; i++) {
    ASSERT_TRUE(Check(blocks[i].p, blocks[i].n, blocks[i].seed));
    ASSERT_TRUE(HugeArenaFree(blocks[i].p));
  }
  blocks.erase(blocks.begin(), blocks.begin() + blocks.size() / 2);
  for (int i = 0; i < 100; i++) {
    size_t n = 4096 + rng() % (kMiB + kMiB / 2);
    auto* p = static_cast<uint8_t*>(HugeArenaAlloc(n, i % 2 ? 16 : 4096, false));
    ASSERT_NE(p, nullptr);
    Fill(p, n, 1000 + i);
    blocks.push_back({p, n, uint64_t(1000 + i)});
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const Block& b : blocks) {
    ASSERT_TRUE(Check(b.p, b.n, b.seed)) << b.n;
    ASSERT_TRUE(HugeArenaFree(b.p));
  }
  HugeArenaStats after = HugeArenaGetStats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.large_mappings, before.large_mappings);
  EXPECT_LE(after.cached_chunks, kHugeArenaCachedChunks);
}

TEST(HugeArenaTest, SmallAlignmentBlocksAreSpreadOverCacheSets) {
  // 300 index-like blocks of 48 KiB (about 7 chunks' worth): colored, their
  // starts must fall on many different line offsets within a page and within
  // 128 KiB (an L2 way); page-aligned requests of the same size must not be
  // colored.
  std::vector<void*> colored, packed;
  std::vector<uintptr_t> page_offsets, l2_offsets;
  for (int i = 0; i < 300; i++) {
    void* p = HugeArenaAlloc(48 * kKiB - 200, 16, false);
    ASSERT_NE(p, nullptr);
    colored.push_back(p);
    page_offsets.push_back(uintptr_t(p) % 4096);
    l2_offsets.push_back(uintptr_t(p) % (128 * kKiB));
    void* q = HugeArenaAlloc(48 * kKiB - 200, 4096, false);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(uintptr_t(q) % 4096, 0u);
    packed.push_back(q);
  }
  for (std::vector<uintptr_t>* v : {&page_offsets, &l2_offsets}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  EXPECT_GE(page_offsets.size(), 40u);  // of 64 line offsets in a page
  EXPECT_GE(l2_offsets.size(), 250u);   // nearly every block on its own sets
  for (void* p : colored) ASSERT_TRUE(HugeArenaFree(p));
  for (void* p : packed) ASSERT_TRUE(HugeArenaFree(p));
}

TEST(HugeArenaTest, ZeroFlagClearsReusedSlots) {
  // Fill three chunks' worth of 12 KiB slots with garbage, keep one block per
  // chunk so no chunk empties, free the rest and allocate them again zeroed: every
  // block must come from a reused slot, and read as zero.
  const size_t n = 12 * kKiB;
  const size_t per_chunk = kHugeArenaChunk / n;
  std::vector<void*> ps;
  for (size_t i = 0; i < 3 * per_chunk; i++) {
    void* p = HugeArenaAlloc(n, 16, false);
    ASSERT_NE(p, nullptr);
    memset(p, 0xA5, n);
    ps.push_back(p);
  }
  std::vector<void*> pins, freed;
  std::vector<uintptr_t> pinned_regions;
  for (void* p : ps) {
    uintptr_t region = uintptr_t(p) >> 21;
    if (std::find(pinned_regions.begin(), pinned_regions.end(), region) == pinned_regions.end()) {
      pinned_regions.push_back(region);
      pins.push_back(p);
    } else {
      freed.push_back(p);
    }
  }
  for (size_t round = 0; round < 2; round++) {
    for (void* p : freed) ASSERT_TRUE(HugeArenaFree(p));
    std::sort(freed.begin(), freed.end());
    std::vector<void*> got;
    for (size_t i = 0; i < freed.size(); i++) {
      // Round 1 asks for less than the class size: the zeroed range is the request.
      size_t want = round == 0 ? n : n - 100;
      void* p = HugeArenaAlloc(want, 16, true);
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(std::binary_search(freed.begin(), freed.end(), p)) << "block " << i << " not a reused slot";
      ASSERT_TRUE(AllZero(p, want)) << "block " << i;
      memset(p, 0x5A, n);
      got.push_back(p);
    }
    freed = got;
  }
  for (void* p : freed) ASSERT_TRUE(HugeArenaFree(p));
  for (void* p : pins) ASSERT_TRUE(HugeArenaFree(p));
}

TEST(HugeArenaTest, ZeroFlagOnCachedChunkReusedForAnotherClass) {
  // Dirty a chunk as one class (packed), empty it (it goes to the cache), then
  // take it for another class, colored, whose slots straddle the old ones.
  HugeArenaReleaseCache();
  const size_t a = 24 * kKiB, b = 40 * kKiB;
  std::vector<void*> ps;
  for (size_t i = 0; i < kHugeArenaChunk / a; i++) {
    void* p = HugeArenaAlloc(a, 4096, false);
    ASSERT_NE(p, nullptr);
    memset(p, 0xFF, a);
    ps.push_back(p);
  }
  ASSERT_EQ(uintptr_t(ps.front()) >> 21, uintptr_t(ps.back()) >> 21);  // one chunk
  for (void* p : ps) ASSERT_TRUE(HugeArenaFree(p));
  const HugeArenaStats emptied = HugeArenaGetStats();
  ASSERT_EQ(emptied.cached_chunks, 1u);
  ps.clear();
  for (size_t i = 0; i < kHugeArenaChunk / b; i++) {
    void* p = HugeArenaAlloc(b, 8, true);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(AllZero(p, b)) << i;
    ps.push_back(p);
  }
  const HugeArenaStats reused = HugeArenaGetStats();
  EXPECT_EQ(reused.cached_chunks, 0u);
  EXPECT_EQ(reused.chunks, emptied.chunks);  // the cached chunk, not a new one
  for (void* p : ps) ASSERT_TRUE(HugeArenaFree(p));
}

TEST(HugeArenaTest, EmptyChunksBeyondTheCacheAreUnmapped) {
  // 256 KiB: 8 slots per chunk. Fill 4 + cache-size chunks, free everything.
  HugeArenaReleaseCache();
  const size_t n = 256 * kKiB;
  const size_t chunks = kHugeArenaCachedChunks + 4;
  const HugeArenaStats before = HugeArenaGetStats();
  ASSERT_EQ(before.cached_chunks, 0u);
  std::vector<void*> ps;
  for (size_t i = 0; i < chunks * (kHugeArenaChunk / n); i++) {
    void* p = HugeArenaAlloc(n, 4096, false);
    ASSERT_NE(p, nullptr);
    memset(p, 1, n);
    ps.push_back(p);
  }
  const HugeArenaStats full = HugeArenaGetStats();
  EXPECT_EQ(full.chunks, before.chunks + chunks);
  EXPECT_EQ(full.mapped_bytes, before.mapped_bytes + chunks * kHugeArenaChunk);
  EXPECT_EQ(full.in_use_bytes, before.in_use_bytes + chunks * kHugeArenaChunk);
  std::shuffle(ps.begin(), ps.end(), std::mt19937_64(3));
  for (void* p : ps) ASSERT_TRUE(HugeArenaFree(p));
  const HugeArenaStats after = HugeArenaGetStats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.cached_chunks, uint64_t(kHugeArenaCachedChunks));
  EXPECT_EQ(after.chunks, before.chunks + kHugeArenaCachedChunks);
  EXPECT_EQ(after.chunks_unmapped - before.chunks_unmapped, chunks - kHugeArenaCachedChunks);
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes + kHugeArenaCachedChunks * kHugeArenaChunk);
  // The unmapped chunks are really gone (mincore fails with ENOMEM on unmapped
  // memory), the cached ones are still there.
  size_t gone = 0;
  for (void* p : ps) {
    unsigned char vec;
    if (mincore(p, 4096, &vec) != 0 && errno == ENOMEM) gone++;
  }
  EXPECT_EQ(gone, (chunks - kHugeArenaCachedChunks) * (kHugeArenaChunk / n));
  HugeArenaReleaseCache();
  const HugeArenaStats released = HugeArenaGetStats();
  EXPECT_EQ(released.cached_chunks, 0u);
  EXPECT_EQ(released.mapped_bytes, before.mapped_bytes);
  gone = 0;
  for (void* p : ps) {
    unsigned char vec;
    if (mincore(p, 4096, &vec) != 0 && errno == ENOMEM) gone++;
  }
  EXPECT_EQ(gone, ps.size());
}

TEST(HugeArenaTest, LargeMappingsAreReturnedOnFree) {
  const HugeArenaStats before = HugeArenaGetStats();
  void* p = HugeArenaAlloc(3 * kMiB + 5, 16, true);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(AllZero(p, 3 * kMiB + 5));
  memset(p, 7, 3 * kMiB + 5);
  HugeArenaStats mid = HugeArenaGetStats();
  EXPECT_EQ(mid.large_mappings, before.large_mappings + 1);
  EXPECT_EQ(mid.mapped_bytes - before.mapped_bytes, 3 * kMiB + 4096);
  ASSERT_TRUE(HugeArenaFree(p));
  HugeArenaStats after = HugeArenaGetStats();
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(after.large_mappings, before.large_mappings);
  unsigned char vec;
  EXPECT_NE(mincore(p, 4096, &vec), 0);
}

TEST(HugeArenaTest, ImpossibleRequestsFail) {
  const HugeArenaStats before = HugeArenaGetStats();
  EXPECT_EQ(HugeArenaAlloc(SIZE_MAX - 100, 16, false), nullptr);  // would wrap when rounded
  EXPECT_EQ(HugeArenaAlloc(size_t(1) << 50, 16, false), nullptr);
  EXPECT_EQ(HugeArenaAlloc(8192, 3, false), nullptr);
  EXPECT_EQ(HugeArenaAlloc(8192, 8192, false), nullptr);
#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on such a malloc instead of failing it
  EXPECT_EQ(tfs_plat_alloc(SIZE_MAX - 100, 16, 0), nullptr);  // the arena's no, then malloc's
#endif
  EXPECT_EQ(HugeArenaGetStats().mapped_bytes, before.mapped_bytes);
}

TEST(HugeArenaTest, ForeignPointersAreNotClaimed) {
  const HugeArenaStats before = HugeArenaGetStats();
  EXPECT_FALSE(HugeArenaFree(nullptr));
  // malloc's blocks, small and mmap-sized, and a stack address.
  for (size_t n : {size_t(16), size_t(4096), size_t(200000), size_t(4 * kMiB)}) {
    void* p = malloc(n);
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(HugeArenaFree(p)) << n;
    free(p);
  }
  int local = 0;
  EXPECT_FALSE(HugeArenaFree(&local));
  // Someone else's mapping in the 2 MiB region a large block starts but does not
  // fill: the region has a table entry, the pointer is still not ours.
  const size_t len = kMiB + 64 * kKiB;
  auto* big = static_cast<uint8_t*>(HugeArenaAlloc(len, 16, false));
  ASSERT_NE(big, nullptr);
  void* want = big + len;
  void* other = mmap(want, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(other, want);
  EXPECT_FALSE(HugeArenaFree(other));
  munmap(other, 4096);
  EXPECT_TRUE(HugeArenaFree(big));
  EXPECT_EQ(HugeArenaGetStats().in_use_bytes, before.in_use_bytes);
}

TEST(HugeArenaDeathTest, DoubleFreeAndInteriorPointersAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (size_t align : {size_t(16), size_t(4096)}) {  // colored and packed slabs
    auto* p = static_cast<uint8_t*>(HugeArenaAlloc(32 * kKiB, align, false));
    ASSERT_NE(p, nullptr);
    // The next slot, which keeps the chunk from emptying.
    auto* q = static_cast<uint8_t*>(HugeArenaAlloc(32 * kKiB, align, false));
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(uintptr_t(q) >> 21, uintptr_t(p) >> 21);
    EXPECT_DEATH(HugeArenaFree(p + 4096), "not a block start");
    EXPECT_DEATH(HugeArenaFree(p + 64), "not a block start");
    EXPECT_DEATH(HugeArenaFree(q - 64), "not a block start");  // colored: the gap between slots
    ASSERT_TRUE(HugeArenaFree(p));
    EXPECT_DEATH(HugeArenaFree(p), "double free");
    ASSERT_TRUE(HugeArenaFree(q));
  }
}

TEST(HugeArenaTest, ThreadsAllocateAndFreeConcurrently) {
  const HugeArenaStats before = HugeArenaGetStats();
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  // Blocks are handed between threads too: each thread frees half of what its
  // neighbour allocated, through a per-thread mailbox under a mutex.
  std::mutex mu;
  std::vector<std::vector<std::pair<uint8_t*, size_t>>> mailbox(kThreads);
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::pair<uint8_t*, size_t>> live;
      for (int i = 0; i < 30000; i++) {
        // Mostly a few small classes, so threads share chunks and contend; now
        // and then anything up to a large mapping.
        size_t n = (rng() % 32 == 0) ? 4096 + rng() % (kMiB + kMiB / 2) : 4096 * (1 + rng() % 4);
        auto* p = static_cast<uint8_t*>(HugeArenaAlloc(n, rng() % 2 ? 16 : 4096, rng() % 2 == 0));
        if (p == nullptr) {
          failures[t]++;
          continue;
        }
        // Stamp both ends and the middle: cheap, and catches overlapping blocks.
        uint8_t tag = uint8_t(t * 64 + (i & 63));
        p[0] = p[n / 2] = p[n - 1] = tag;
        live.push_back({p, n});
        if (live.size() > 64 || rng() % 3 == 0) {
          size_t k = rng() % live.size();
          auto [q, m] = live[k];
          live[k] = live.back();
          live.pop_back();
          if (q[0] != q[m / 2] || q[0] != q[m - 1]) failures[t]++;
          if (rng() % 2 == 0) {
            std::lock_guard<std::mutex> lock(mu);
            mailbox[(t + 1) % kThreads].push_back({q, m});
          } else if (!HugeArenaFree(q)) {
            failures[t]++;
          }
        }
        if (i % 16 == 0) {
          std::vector<std::pair<uint8_t*, size_t>> mine;
          {
            std::lock_guard<std::mutex> lock(mu);
            mine.swap(mailbox[t]);
          }
          for (auto [q, m] : mine) {
            if (q[0] != q[m / 2] || q[0] != q[m - 1]) failures[t]++;
            if (!HugeArenaFree(q)) failures[t]++;
          }
        }
      }
      for (auto [q, m] : live) {
        if (q[0] != q[m / 2] || q[0] != q[m - 1]) failures[t]++;
        if (!HugeArenaFree(q)) failures[t]++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& box : mailbox)
    for (auto [q, m] : box) EXPECT_TRUE(HugeArenaFree(q));
  for (int t = 0; t < kThreads; t++) EXPECT_EQ(failures[t], 0) << "thread " << t;
  const HugeArenaStats after = HugeArenaGetStats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.large_mappings, before.large_mappings);
  EXPECT_LE(after.cached_chunks, kHugeArenaCachedChunks);
  // Large mappings all returned: what is mapped is slab chunks, as before.
  EXPECT_EQ(after.mapped_bytes - after.chunks * kHugeArenaChunk, before.mapped_bytes - before.chunks * kHugeArenaChunk);
}

// --- through the platform seam -------------------------------------------------

TEST(HugeArenaPlatformTest, PlatformAllocRoutesBySizeAndFreesEither) {
  HugeArenaReadEnv();
  const bool on = HugeArenaEnabled();
  const HugeArenaStats before = HugeArenaGetStats();
  void* small = tfs_plat_alloc(4095, 16, 0);
  void* node = tfs_plat_alloc(256 * kKiB, 4096, TFS_ALLOC_ZERO);
  void* huge = tfs_plat_alloc(3 * kMiB, 4096, 0);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(node, nullptr);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(uintptr_t(node) % 4096, 0u);
  EXPECT_TRUE(AllZero(node, 256 * kKiB));
  memset(small, 1, 4095);
  memset(node, 2, 256 * kKiB);
  memset(huge, 3, 3 * kMiB);
  const HugeArenaStats mid = HugeArenaGetStats();
  EXPECT_EQ(mid.in_use_bytes - before.in_use_bytes, on ? 256 * kKiB + 3 * kMiB : 0);
  tfs_plat_free(small);
  tfs_plat_free(node);
  tfs_plat_free(huge);
  tfs_plat_free(nullptr);
  EXPECT_EQ(HugeArenaGetStats().in_use_bytes, before.in_use_bytes);
  // A reused arena slot is zeroed on request through the seam as well.
  for (int i = 0; i < 3; i++) {
    auto* p = static_cast<uint8_t*>(tfs_plat_alloc(48 * kKiB, 4096, TFS_ALLOC_ZERO));
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(AllZero(p, 48 * kKiB));
    memset(p, 0xEE, 48 * kKiB);
    tfs_plat_free(p);
  }
  // Alignments up to 4096 at sizes around the threshold.
  for (size_t n : {size_t(4000), size_t(4096), size_t(5000), size_t(70000)}) {
    for (size_t align : {size_t(8), size_t(64), size_t(4096)}) {
      void* p = tfs_plat_alloc(n, align, 0);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(uintptr_t(p) % align, 0u) << n << " " << align;
      memset(p, 9, n);
      tfs_plat_free(p);
    }
  }
}

TEST(HugeArenaPlatformTest, EnvironmentSwitchesTheArenaOff) {
  ASSERT_EQ(setenv("TIERFS_HUGE_ARENA", "0", 1), 0);
  HugeArenaReadEnv();
  EXPECT_FALSE(HugeArenaEnabled());
  const HugeArenaStats before = HugeArenaGetStats();
  void* p = tfs_plat_alloc(256 * kKiB, 4096, 0);
  ASSERT_NE(p, nullptr);
  memset(p, 1, 256 * kKiB);
  EXPECT_EQ(HugeArenaGetStats().in_use_bytes, before.in_use_bytes);
  // An arena block handed out while it was on is still freed by the arena.
  void* q = HugeArenaAlloc(256 * kKiB, 4096, false);
  ASSERT_NE(q, nullptr);
  tfs_plat_free(p);
  tfs_plat_free(q);
  EXPECT_EQ(HugeArenaGetStats().in_use_bytes, before.in_use_bytes);
  ASSERT_EQ(unsetenv("TIERFS_HUGE_ARENA"), 0);
  HugeArenaReadEnv();
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_FALSE(HugeArenaEnabled());  // ASan builds never route to the arena
#else
  EXPECT_TRUE(HugeArenaEnabled());
#endif
}

}  // namespace
}  // namespace tfs::userspace
