// Shared pieces of the fuzz targets (docs/development.md, "Fuzzing").
//
// Each target is one file defining LLVMFuzzerTestOneInput. Built with clang and
// -DTIERFS_FUZZ=ON (scripts/fuzz) it links libFuzzer; in every other build it
// links replay_main.cc instead, and ctest replays the committed corpus
// (fuzz/corpus/<target>/) through it, so a finding once fixed stays fixed.
// A target calls Fail() for a broken invariant (libFuzzer and the replay both
// report it as a crash with the message).
#ifndef TFS_FUZZ_FUZZ_H_
#define TFS_FUZZ_FUZZ_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "sb/superblock.h"
#include "userspace/platform/mem_device.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tfs::fuzz {

[[noreturn]] inline void Fail(const char* what) {
  fprintf(stderr, "fuzz invariant broken: %s\n", what);
  abort();
}

// A fresh in-memory device of `size` bytes ("ssd0") formatted as a one-member
// filesystem (member "ssd.a"); Fail()s if the format does. 0: the default
// bucket or node size.
std::unique_ptr<userspace::MemDevice> Formatted(uint64_t size, uint32_t bucket_size = 0, uint32_t node_size = 0);

// Keeps the store's warnings about the damage it is fed off stderr.
void Quiet();

// The journal target's filesystem: one 2 MiB member of 16 KiB buckets whose
// ring is buckets 1 to 4 (the fewest a ring may have), a fixed uuid (so
// corpus entries carry the right magic), journal_seq floor 1.
inline constexpr uint32_t kJournalBucket = 16 * 1024;
inline constexpr uint32_t kJournalRingBuckets = 4;
inline constexpr uint64_t kJournalDevSize = 2ull << 20;
sb::Superblock JournalSuperblock();

// The values target's filesystem, whose geometry judges alloc records: one
// 64 MiB member of 256 KiB buckets and 64 KiB nodes, as fuzz_make_seeds
// formats it for the values seeds (ValuesSuperblock formats one and reads
// its superblock back).
inline constexpr uint64_t kValuesDevSize = 64ull << 20;
inline constexpr uint32_t kValuesBucket = 256 * 1024;
inline constexpr uint32_t kValuesNode = 64 * 1024;
sb::Superblock ValuesSuperblock();

}  // namespace tfs::fuzz

#endif  // TFS_FUZZ_FUZZ_H_
