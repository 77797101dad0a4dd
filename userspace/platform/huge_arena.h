// HugeArena: the userspace platform's allocator for large blocks, backed by
// transparent huge pages.
//
// Why: the btree keeps its node buffers (256 KiB each, ~1 GB in all) and its
// search indexes (4 KiB-100 KiB) in memory, and random lookups over them are bound
// by DRAM and TLB misses. With THP in `madvise` mode (the common distribution
// default) nothing malloc returns is backed by huge pages. tfs_plat_alloc sends
// every request of kHugeArenaMinSize bytes or more here, where memory comes from
// mmap'd regions marked MADV_HUGEPAGE; smaller requests stay with malloc.
//
// Threshold, 4 KiB: from one page up, page-granular classes waste under a page
// per block, and that is where the btree's hot memory is (nodes are >= 4 KiB,
// indexes of any real node too). Below it, malloc packs small objects densely and
// serving them here would need sub-page classes for little TLB gain.
//
// Design:
//   - Memory is mapped in chunks of 2 MiB (kHugeArenaChunk), 2 MiB aligned (map
//     2 MiB more than needed, unmap the ends), each madvise(MADV_HUGEPAGE)'d. When
//     the advice fails (no THP in this kernel) the chunk is used with base pages
//     and the failure is counted.
//   - Each chunk is a slab for one size class: equal slots, a bitmap of free
//     slots, the lowest free slot handed out first. Classes are every 4 KiB from
//     4 KiB to 64 KiB, then four per power of two up to 1 MiB (80, 96, 112, 128,
//     160, ... 896, 1024 KiB): 32 classes, all multiples of 4 KiB, so slots packed
//     from the chunk's start are 4 KiB aligned.
//   - Cache coloring. Page-aligned slots put the start of every block at the same
//     cache sets (all of them in L1 set 0, and a few L2 sets per class), and the
//     start of a search index is exactly what every lookup reads first. In an
//     experiment on btree_node_bench's 2048-node lookups, packed slots gave
//     about 1.9M lookups/s and staggered ones 2.3M/s (medians of 8 interleaved
//     runs; malloc 1.55M/s). So
//     requests with align <= 64 up to 64 KiB (the indexes are Vectors) get
//     *colored* slabs: slots 64 bytes further apart than their size, and the
//     whole slab shifted by a per-chunk multiple of 64 bytes within the room its
//     last slot leaves. Requests aligned to more than 64 bytes (node and I/O
//     buffers ask for 4096) and classes above 64 KiB get packed slabs. A chunk is
//     one or the other; each class has a partial list of each.
//   - Worst-case waste. Per allocation: under 4 KiB up to 64 KiB (so under half of
//     a 4 KiB+1 request, under 1/16 from 64 KiB up); above 64 KiB under a quarter
//     of the request (a class step is a quarter of the power of two below it).
//     Per chunk: the tail that no slot fills, 2 MiB mod the class size -- zero
//     for power-of-two classes, at most 512 KiB (the 768 KiB class, two slots);
//     coloring costs a colored chunk at most 1/32 of its slots (the 64 KiB class:
//     31, not 32; the 4 KiB class: 504, not 512).
//   - A chunk whose last slot is freed is unmapped, except that up to
//     kHugeArenaCachedChunks empty chunks are kept (for any class) so that a class
//     hovering at a chunk boundary does not map and unmap on every call.
//   - Requests above 1 MiB get a mapping of their own (page-rounded, 2 MiB
//     aligned; the 2 MiB-aligned part advised MADV_HUGEPAGE when it is at least
//     2 MiB), unmapped on free.
//   - tfs_plat_free must tell arena pointers from malloc's. A two-level radix
//     table keyed by address >> 21 maps each 2 MiB region that starts a chunk or a
//     large mapping to its metadata. A slab chunk owns its whole region, so any
//     pointer in it is ours; a large mapping's region may end in someone else's
//     memory, so only its exact start counts. A pointer whose region has no entry
//     goes to free(). Lookups read the table without the lock (entries are set
//     before a pointer into them is handed out, and a pointer malloc owns can
//     never lie in a region the arena owns) and confirm under the lock before
//     touching metadata.
//   - Reused slots are not zero, fresh memory is: each chunk remembers how far
//     from its start it was ever handed out, and TFS_ALLOC_ZERO clears only below
//     that mark, so zeroed allocations of fresh memory touch no page. (A cached
//     chunk keeps its mark when it becomes a slab of another class or layout.)
//   - One mutex guards all metadata. mmap and munmap run outside it.
//   - Freeing a slab pointer that is not the start of a slot in use (a double
//     free, or a pointer into the middle of a block) aborts with a message.
//
// Off switches: the environment variable TIERFS_HUGE_ARENA=0 (or off/no/false),
// read at the first allocation, sends every request to malloc (for A/B
// measurements, and as an escape hatch). Builds with AddressSanitizer never route
// to the arena, so ASan keeps its redzones and leak checks; the arena itself still
// works when called directly (its tests do). Pointers the arena handed out are
// recognized by tfs_plat_free whatever the switch says.
//
// No static constructors: every global is constant-initialized and the table's
// second level is mapped on first use.
#ifndef TFS_USERSPACE_PLATFORM_HUGE_ARENA_H_
#define TFS_USERSPACE_PLATFORM_HUGE_ARENA_H_

#include <cstddef>
#include <cstdint>

namespace tfs::userspace {

inline constexpr size_t kHugeArenaMinSize = 4096;              // smaller: malloc
inline constexpr size_t kHugeArenaMaxClass = size_t(1) << 20;  // larger: own mapping
inline constexpr size_t kHugeArenaChunk = size_t(2) << 20;
inline constexpr unsigned kHugeArenaCachedChunks = 4;

// Counters, a consistent snapshot (taken under the arena's lock).
struct HugeArenaStats {
  uint64_t mapped_bytes = 0;    // mapped now: slab chunks (cached ones too) + large mappings
  uint64_t in_use_bytes = 0;    // handed out now, as slot sizes and large mapping lengths
  uint64_t chunks = 0;          // slab chunks mapped now, cached ones included
  uint64_t cached_chunks = 0;   // of those, empty ones kept for reuse
  uint64_t large_mappings = 0;  // live allocations above kHugeArenaMaxClass
  uint64_t chunks_unmapped = 0; // since start: empty chunks returned to the OS
  uint64_t hugepage_advice_failures = 0;  // since start: madvise(MADV_HUGEPAGE) failed
  uint64_t map_failures = 0;    // since start: mmap failed (the caller fell back to malloc)
};
HugeArenaStats HugeArenaGetStats();

// Unmaps the empty chunks kept for reuse (tests; a caller that wants memory back).
void HugeArenaReleaseCache();

// True when tfs_plat_alloc routes requests of kHugeArenaMinSize bytes or more
// here: not an ASan build and TIERFS_HUGE_ARENA not set to 0.
bool HugeArenaEnabled();
// Re-reads TIERFS_HUGE_ARENA (tests; otherwise it is read once).
void HugeArenaReadEnv();

// The bytes the arena reserves for a request of `size` (its class size, or the
// page-rounded length above kHugeArenaMaxClass); 0 below kHugeArenaMinSize.
size_t HugeArenaBlockSize(size_t size);

// A block of at least `size` (>= kHugeArenaMinSize) bytes aligned to `align` (a
// power of two <= 4096; 4 KiB aligned when align > 64 or size > 64 KiB, 64-byte
// aligned and colored otherwise), zeroed when `zero`; null when mmap fails or
// `align` is invalid.
void* HugeArenaAlloc(size_t size, size_t align, bool zero);
// Frees `p` and returns true if the arena handed it out; returns false, touching
// nothing, for any other pointer (null included).
bool HugeArenaFree(void* p);

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_HUGE_ARENA_H_
