// Bit operations that compile to plain instructions in both builds. (GCC lowers
// __builtin_popcount to a libgcc call without -mpopcnt, which a kernel module
// cannot link; the kernel-safe check catches that.)
#ifndef TFS_UTIL_BITS_H_
#define TFS_UTIL_BITS_H_

#include "platform/types.h"

namespace tfs {

constexpr u32 PopCount(u64 v) {
  v = v - ((v >> 1) & 0x5555555555555555ull);
  v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
  v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return u32((v * 0x0101010101010101ull) >> 56);
}
static_assert(PopCount(0) == 0 && PopCount(0xff) == 8 && PopCount(~0ull) == 64, "PopCount");

constexpr bool IsPowerOfTwo(u64 v) { return v != 0 && (v & (v - 1)) == 0; }

// MurmurHash3's 64-bit finalizer: a bijection that spreads every input bit
// over the output (hash seeds, table slots).
constexpr u64 Mix64(u64 h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace tfs

#endif  // TFS_UTIL_BITS_H_
