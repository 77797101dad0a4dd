// Little-endian integer fields for on-disk structures.
//
// Every multi-byte integer in a *_format.h struct is an Le16/Le32/Le64: the
// structs are then byte-exact on any host, and reading a field is an explicit
// get(), so code cannot silently use host byte order.
#ifndef TFS_UTIL_ENDIAN_H_
#define TFS_UTIL_ENDIAN_H_

#include "platform/types.h"

namespace tfs {

template <typename T>
struct Le {
  u8 bytes[sizeof(T)];

  // On little-endian hosts one (unaligned) load or store: GCC does not turn the
  // byte loop below into one, and positions are decoded on every btree step.
  T get() const {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    T v;
    __builtin_memcpy(&v, bytes, sizeof(T));
    return v;
#else
    T v = 0;
    for (usize i = 0; i < sizeof(T); i++) v |= T(bytes[i]) << (8 * i);
    return v;
#endif
  }
  void set(T v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    __builtin_memcpy(bytes, &v, sizeof(T));
#else
    for (usize i = 0; i < sizeof(T); i++) bytes[i] = u8(v >> (8 * i));
#endif
  }
};

using Le16 = Le<u16>;
using Le32 = Le<u32>;
using Le64 = Le<u64>;
static_assert(sizeof(Le16) == 2 && sizeof(Le32) == 4 && sizeof(Le64) == 8, "packed");
static_assert(alignof(Le64) == 1, "on-disk fields have no alignment");

}  // namespace tfs

#endif  // TFS_UTIL_ENDIAN_H_
