// HugeArena (see huge_arena.h): 2 MiB slab chunks on transparent huge pages,
// a radix table from 2 MiB region to chunk, one mutex.
//
// Invariants (under g_mu):
//   - A slab chunk is in exactly one place: the partial list of its class and
//     layout (packed or colored; some slot free, some used), the empty cache
//     (kind kCached), or nowhere (every slot used). Its table entry exists from
//     install until unmap.
//   - Bytes [0, hand_out_mark) of a chunk may hold old data; beyond it the chunk
//     is as mmap returned it (zero). Because the lowest free slot is always handed
//     out first, the slots ever used since a chunk became a slab are a prefix.
//   - Counters in g_stats match the lists and mappings.
#include "userspace/platform/huge_arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "platform/platform.h"

namespace tfs::userspace {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr size_t kPage = 4096;
constexpr unsigned kChunkShift = 21;
static_assert(kHugeArenaChunk == size_t(1) << kChunkShift);
constexpr unsigned kMaxSlots = kHugeArenaChunk / kHugeArenaMinSize;  // 512
constexpr unsigned kBitmapWords = kMaxSlots / 64;

// Classes: 16 steps of 4 KiB up to 64 KiB, then 4 per power of two up to 1 MiB.
constexpr unsigned kLinearClasses = 16;
constexpr size_t kLinearMax = kLinearClasses * kPage;  // 64 KiB
constexpr unsigned kClasses = kLinearClasses + 4 * 4;  // 64K..128K..256K..512K..1M
static_assert(kLinearMax == size_t(1) << 16);
// Colored slabs (see huge_arena.h): slots kColorStep apart beyond their size, for
// requests aligned to at most kColorStep in the linear classes.
constexpr size_t kColorStep = 64;

constexpr size_t ClassSize(unsigned cls) {
  if (cls < kLinearClasses) return size_t(cls + 1) * kPage;
  unsigned g = (cls - kLinearClasses) / 4, j = (cls - kLinearClasses) % 4;
  size_t base = kLinearMax << g;
  return base + (j + 1) * (base / 4);
}
static_assert(ClassSize(kClasses - 1) == kHugeArenaMaxClass);

// The smallest class that holds `size` (kHugeArenaMinSize <= size <= kHugeArenaMaxClass).
unsigned ClassOf(size_t size) {
  if (size <= kLinearMax) return unsigned((size + kPage - 1) / kPage) - 1;
  unsigned k = 63 - unsigned(__builtin_clzll(size - 1));  // size in (2^k, 2^(k+1)]
  size_t step = (size_t(1) << k) / 4;
  unsigned j = unsigned((size - (size_t(1) << k) + step - 1) / step);  // 1..4
  return kLinearClasses + (k - 16) * 4 + (j - 1);
}

// Addresses are below 2^48 (x86-64 and arm64 user space without 5-level paging
// opt-in): 27 bits of region number, split 14 + 13.
constexpr unsigned kAddrBits = 48;
constexpr unsigned kLeafBits = 13;
constexpr unsigned kTopBits = kAddrBits - kChunkShift - kLeafBits;
constexpr size_t kLeafSize = size_t(1) << kLeafBits;

enum class Kind : uint8_t { kSlab, kCached, kLarge };

struct Chunk {
  uintptr_t base = 0;
  size_t length = 0;  // mapped bytes: kHugeArenaChunk, or a large mapping's length
  Kind kind = Kind::kSlab;
  bool in_partial = false;
  bool colored = false;
  unsigned cls = 0;
  unsigned slot_size = 0;  // the class size: what a block may use
  unsigned stride = 0;     // slot_size, plus kColorStep in a colored slab
  unsigned first = 0;      // offset of slot 0 from base (colored slabs: the chunk's color)
  unsigned nslots = 0;
  unsigned nused = 0;
  size_t hand_out_mark = 0;     // bytes from base that may be non-zero
  uint64_t free_bits[kBitmapWords] = {};  // 1 = slot free
  Chunk* prev = nullptr;  // partial list of its class, or the cache (next only)
  Chunk* next = nullptr;
};

struct Leaf {
  std::atomic<Chunk*> slot[kLeafSize];
};

constinit std::mutex g_mu;
constinit std::atomic<Leaf*> g_top[size_t(1) << kTopBits] = {};
constinit Chunk* g_partial[kClasses][2] = {};  // [class][colored]
constinit unsigned g_color_seq = 0;  // colored slabs made so far: picks the next one's color
constinit Chunk* g_cache = nullptr;
constinit HugeArenaStats g_stats = {};
// -1: not read yet; 0 off; 1 on.
constinit std::atomic<int> g_enabled{-1};

[[noreturn]] void Die(const char* what, const void* p) {
  char line[160];
  snprintf(line, sizeof(line), "huge arena: %s (pointer %p)", what, p);
  tfs_plat_log(4, line);
  abort();
}

bool RegionKey(uintptr_t addr, size_t* top, size_t* low) {
  if (addr >> kAddrBits != 0) return false;
  uintptr_t key = addr >> kChunkShift;
  *top = key >> kLeafBits;
  *low = key & (kLeafSize - 1);
  return true;
}

// Lock-free: the entry for addr's region, or null.
Chunk* Lookup(uintptr_t addr) {
  size_t top, low;
  if (!RegionKey(addr, &top, &low)) return nullptr;
  Leaf* leaf = g_top[top].load(std::memory_order_acquire);
  return leaf == nullptr ? nullptr : leaf->slot[low].load(std::memory_order_acquire);
}

// Under g_mu. False only when a leaf cannot be mapped.
bool SetEntry(uintptr_t base, Chunk* c) {
  size_t top, low;
  if (!RegionKey(base, &top, &low)) return false;
  Leaf* leaf = g_top[top].load(std::memory_order_relaxed);
  if (leaf == nullptr) {
    if (c == nullptr) return true;
    // mmap memory is zero, i.e. every entry null; the leaf is never unmapped.
    void* m = mmap(nullptr, sizeof(Leaf), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    leaf = static_cast<Leaf*>(m);
    g_top[top].store(leaf, std::memory_order_release);
  }
  leaf->slot[low].store(c, std::memory_order_release);
  return true;
}

// `len` bytes (a multiple of kPage) at a 2 MiB-aligned address below 2^kAddrBits,
// or 0. Maps 2 MiB - 4 KiB more than asked and unmaps both ends.
uintptr_t MapAligned(size_t len) {
  size_t span = len + kHugeArenaChunk - kPage;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 0;
  uintptr_t raw = uintptr_t(m);
  uintptr_t base = (raw + kHugeArenaChunk - 1) & ~uintptr_t(kHugeArenaChunk - 1);
  if (base > raw) munmap(m, base - raw);
  uintptr_t end = raw + span;
  if (end > base + len) munmap(reinterpret_cast<void*>(base + len), end - (base + len));
  if ((base + len - 1) >> kAddrBits != 0) {  // beyond what the table covers
    munmap(reinterpret_cast<void*>(base), len);
    return 0;
  }
  return base;
}

// madvise(MADV_HUGEPAGE) on [base, base + len); false when refused (no THP).
bool AdviseHuge(uintptr_t base, size_t len) {
  return madvise(reinterpret_cast<void*>(base), len, MADV_HUGEPAGE) == 0;
}

void PartialPush(Chunk* c) {
  c->in_partial = true;
  c->prev = nullptr;
  c->next = g_partial[c->cls][c->colored];
  if (c->next != nullptr) c->next->prev = c;
  g_partial[c->cls][c->colored] = c;
}

void PartialRemove(Chunk* c) {
  if (c->prev != nullptr) {
    c->prev->next = c->next;
  } else {
    g_partial[c->cls][c->colored] = c->next;
  }
  if (c->next != nullptr) c->next->prev = c->prev;
  c->prev = c->next = nullptr;
  c->in_partial = false;
}

// Under g_mu: turn an empty (new or cached) chunk into a slab of `cls` and put it
// on the class's partial list.
void MakeSlab(Chunk* c, unsigned cls, bool colored) {
  c->kind = Kind::kSlab;
  c->colored = colored;
  c->cls = cls;
  c->slot_size = unsigned(ClassSize(cls));
  c->stride = c->slot_size + unsigned(colored ? kColorStep : 0);
  c->nslots = unsigned(kHugeArenaChunk / c->stride);
  c->first = 0;
  if (colored) {
    // Shift the whole slab by a multiple of kColorStep within the room its
    // last slot leaves, so slot i of one chunk does not alias slot i of the next.
    const unsigned colors = unsigned((kHugeArenaChunk - size_t(c->nslots) * c->stride) / kColorStep) + 1;
    c->first = unsigned(((g_color_seq++ * 41u) % colors) * kColorStep);
  }
  c->nused = 0;
  memset(c->free_bits, 0, sizeof(c->free_bits));
  for (unsigned i = 0; i < c->nslots; i++) c->free_bits[i / 64] |= uint64_t(1) << (i % 64);
  PartialPush(c);
}

// A fresh chunk (mapped, advised, metadata allocated), not yet in the table; null
// when mmap or malloc fails. Called without g_mu.
Chunk* NewChunk(bool* advice_failed) {
  uintptr_t base = MapAligned(kHugeArenaChunk);
  if (base == 0) return nullptr;
  *advice_failed = !AdviseHuge(base, kHugeArenaChunk);
  auto* c = static_cast<Chunk*>(malloc(sizeof(Chunk)));
  if (c == nullptr) {
    munmap(reinterpret_cast<void*>(base), kHugeArenaChunk);
    return nullptr;
  }
  new (c) Chunk();
  c->base = base;
  c->length = kHugeArenaChunk;
  return c;
}

void ReleaseChunk(Chunk* c) {
  munmap(reinterpret_cast<void*>(c->base), c->length);
  free(c);
}

void* AllocLarge(size_t size) {
  if (size > (size_t(1) << kAddrBits)) return nullptr;  // no such mapping (and no overflow below)
  size_t len = (size + kPage - 1) & ~(kPage - 1);
  uintptr_t base = MapAligned(len);
  bool advice_failed = false;
  if (base != 0 && len >= kHugeArenaChunk)
    advice_failed = !AdviseHuge(base, len & ~(kHugeArenaChunk - 1));
  Chunk* c = nullptr;
  if (base != 0) {
    c = static_cast<Chunk*>(malloc(sizeof(Chunk)));
    if (c == nullptr) munmap(reinterpret_cast<void*>(base), len);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (advice_failed) g_stats.hugepage_advice_failures++;
  if (c == nullptr) {
    g_stats.map_failures++;
    return nullptr;
  }
  new (c) Chunk();
  c->base = base;
  c->length = len;
  c->kind = Kind::kLarge;
  if (!SetEntry(base, c)) {
    g_stats.map_failures++;
    ReleaseChunk(c);
    return nullptr;
  }
  g_stats.mapped_bytes += len;
  g_stats.in_use_bytes += len;
  g_stats.large_mappings++;
  return reinterpret_cast<void*>(base);
}

bool ReadEnvEnabled() {
  if (kSanitized) return false;
  const char* v = getenv("TIERFS_HUGE_ARENA");
  if (v == nullptr) return true;
  return !(strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "no") == 0 ||
           strcasecmp(v, "false") == 0);
}

}  // namespace

bool HugeArenaEnabled() {
  int e = g_enabled.load(std::memory_order_relaxed);
  if (TFS_UNLIKELY(e < 0)) {
    e = ReadEnvEnabled() ? 1 : 0;
    g_enabled.store(e, std::memory_order_relaxed);
  }
  return e == 1;
}

void HugeArenaReadEnv() { g_enabled.store(ReadEnvEnabled() ? 1 : 0, std::memory_order_relaxed); }

size_t HugeArenaBlockSize(size_t size) {
  if (size < kHugeArenaMinSize) return 0;
  if (size > kHugeArenaMaxClass) return (size + kPage - 1) & ~(kPage - 1);
  return ClassSize(ClassOf(size));
}

HugeArenaStats HugeArenaGetStats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void HugeArenaReleaseCache() {
  Chunk* list;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    list = g_cache;
    g_cache = nullptr;
    for (Chunk* c = list; c != nullptr; c = c->next) {
      SetEntry(c->base, nullptr);
      g_stats.chunks--;
      g_stats.cached_chunks--;
      g_stats.mapped_bytes -= c->length;
      g_stats.chunks_unmapped++;
    }
  }
  while (list != nullptr) {
    Chunk* next = list->next;
    ReleaseChunk(list);
    list = next;
  }
}

void* HugeArenaAlloc(size_t size, size_t align, bool zero) {
  if (align == 0 || (align & (align - 1)) != 0 || align > kPage) return nullptr;
  if (size < kHugeArenaMinSize) size = kHugeArenaMinSize;
  if (size > kHugeArenaMaxClass) return AllocLarge(size);  // fresh memory: already zero
  const unsigned cls = ClassOf(size);
  const bool colored = cls < kLinearClasses && align <= kColorStep;
  std::unique_lock<std::mutex> lock(g_mu);
  if (g_partial[cls][colored] == nullptr) {
    if (g_cache != nullptr) {
      Chunk* c = g_cache;
      g_cache = c->next;
      c->next = nullptr;
      g_stats.cached_chunks--;
      MakeSlab(c, cls, colored);
    } else {
      // Map without the lock; another thread may add a chunk for this class
      // meanwhile, and then both serve it.
      lock.unlock();
      bool advice_failed = false;
      Chunk* c = NewChunk(&advice_failed);
      lock.lock();
      if (advice_failed) g_stats.hugepage_advice_failures++;
      if (c == nullptr || !SetEntry(c->base, c)) {
        g_stats.map_failures++;
        if (c != nullptr) ReleaseChunk(c);
        return nullptr;
      }
      g_stats.chunks++;
      g_stats.mapped_bytes += kHugeArenaChunk;
      MakeSlab(c, cls, colored);
    }
  }
  Chunk* c = g_partial[cls][colored];
  unsigned w = 0;
  while (c->free_bits[w] == 0) w++;  // a partial chunk has a free slot
  unsigned bit = unsigned(__builtin_ctzll(c->free_bits[w]));
  c->free_bits[w] &= ~(uint64_t(1) << bit);
  const size_t start = c->first + size_t(w * 64 + bit) * c->stride;
  if (++c->nused == c->nslots) PartialRemove(c);
  // Bytes below the mark may hold an earlier block's data.
  const size_t dirty = start < c->hand_out_mark ? c->hand_out_mark - start : 0;
  if (start + c->slot_size > c->hand_out_mark) c->hand_out_mark = start + c->slot_size;
  g_stats.in_use_bytes += c->slot_size;
  void* p = reinterpret_cast<void*>(c->base + start);
  lock.unlock();
  if (zero && dirty > 0) memset(p, 0, dirty < size ? dirty : size);
  return p;
}

bool HugeArenaFree(void* p) {
  const uintptr_t addr = uintptr_t(p);
  if (Lookup(addr) == nullptr) return false;  // malloc's (or null): no lock taken
  Chunk* release = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    // The lock-free answer may be stale; only the one under the lock is trusted.
    Chunk* c = Lookup(addr);
    if (c == nullptr) return false;
    if (c->kind == Kind::kLarge) {
      // The region past a large mapping's end is not ours: only its start is.
      if (addr != c->base) return false;
      SetEntry(c->base, nullptr);
      g_stats.mapped_bytes -= c->length;
      g_stats.in_use_bytes -= c->length;
      g_stats.large_mappings--;
      release = c;
    } else {
      if (c->kind == Kind::kCached) Die("free of a block in an empty chunk (double free?)", p);
      const size_t off = addr - c->base - c->first;  // wraps when addr is below slot 0
      const size_t slot = off / c->stride;
      if (off % c->stride != 0 || slot >= c->nslots) Die("free of a pointer that is not a block start", p);
      uint64_t& word = c->free_bits[slot / 64];
      const uint64_t bit = uint64_t(1) << (slot % 64);
      if (word & bit) Die("double free", p);
      word |= bit;
      g_stats.in_use_bytes -= c->slot_size;
      const bool was_full = c->nused == c->nslots;
      c->nused--;
      if (c->nused == 0) {
        if (c->in_partial) PartialRemove(c);
        if (g_stats.cached_chunks < kHugeArenaCachedChunks) {
          c->kind = Kind::kCached;
          c->next = g_cache;
          g_cache = c;
          g_stats.cached_chunks++;
        } else {
          SetEntry(c->base, nullptr);
          g_stats.chunks--;
          g_stats.mapped_bytes -= c->length;
          g_stats.chunks_unmapped++;
          release = c;
        }
      } else if (was_full) {
        PartialPush(c);
      }
    }
  }
  if (release != nullptr) ReleaseChunk(release);
  return true;
}

}  // namespace tfs::userspace
