// Fixed-width types and the few language helpers the core needs, with no system
// or compiler header.
//
// The core (fs/) is compiled twice: as an ordinary userspace library and, by the
// kernel-safe check and the kernel module, with -ffreestanding -nostdinc. In the
// second build no header exists but our own, so integer types come from the
// compiler's predefined macros, memory primitives from __builtin_*, and move/forward
// are spelled with static_cast. Nothing here allocates or has a constructor that
// runs at load time.
#ifndef TFS_PLATFORM_TYPES_H_
#define TFS_PLATFORM_TYPES_H_

using u8 = __UINT8_TYPE__;
using u16 = __UINT16_TYPE__;
using u32 = __UINT32_TYPE__;
using u64 = __UINT64_TYPE__;
using i8 = __INT8_TYPE__;
using i16 = __INT16_TYPE__;
using i32 = __INT32_TYPE__;
using i64 = __INT64_TYPE__;
using usize = __SIZE_TYPE__;
using isize = __PTRDIFF_TYPE__;
using uptr = __UINTPTR_TYPE__;

static_assert(sizeof(u64) == 8 && sizeof(u32) == 4 && sizeof(u16) == 2, "type sizes");
static_assert(sizeof(void*) == 8, "tierfs supports 64-bit targets only");

// Placement new: from <new> in a hosted build, declared here in a freestanding one
// (the two must not both exist in one translation unit).
#if __STDC_HOSTED__
#include <new>
#else
inline void* operator new(usize, void* where) noexcept { return where; }
inline void* operator new[](usize, void* where) noexcept { return where; }
#endif

#define TFS_LIKELY(x) __builtin_expect(!!(x), 1)
#define TFS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TFS_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#define TFS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

// Lock annotations. Clang checks them (-Wthread-safety); GCC ignores the macros.
#if defined(__clang__)
#define TFS_GUARDED_BY(x) __attribute__((guarded_by(x)))
#define TFS_CAPABILITY(x) __attribute__((capability(x)))
#define TFS_SCOPED_CAPABILITY __attribute__((scoped_lockable))
#define TFS_ACQUIRE(...) __attribute__((acquire_capability(__VA_ARGS__)))
#define TFS_RELEASE(...) __attribute__((release_capability(__VA_ARGS__)))
#define TFS_ACQUIRE_SHARED(...) __attribute__((acquire_shared_capability(__VA_ARGS__)))
#define TFS_RELEASE_SHARED(...) __attribute__((release_shared_capability(__VA_ARGS__)))
#define TFS_TRY_ACQUIRE(...) __attribute__((try_acquire_capability(__VA_ARGS__)))
#define TFS_REQUIRES(...) __attribute__((requires_capability(__VA_ARGS__)))
#else
#define TFS_GUARDED_BY(x)
#define TFS_CAPABILITY(x)
#define TFS_SCOPED_CAPABILITY
#define TFS_ACQUIRE(...)
#define TFS_RELEASE(...)
#define TFS_ACQUIRE_SHARED(...)
#define TFS_RELEASE_SHARED(...)
#define TFS_TRY_ACQUIRE(...)
#define TFS_REQUIRES(...)
#endif

namespace tfs {

template <typename T> struct RemoveReference { using Type = T; };
template <typename T> struct RemoveReference<T&> { using Type = T; };
template <typename T> struct RemoveReference<T&&> { using Type = T; };

template <typename T>
constexpr typename RemoveReference<T>::Type&& Move(T&& v) noexcept {
  return static_cast<typename RemoveReference<T>::Type&&>(v);
}
template <typename T>
constexpr T&& Forward(typename RemoveReference<T>::Type& v) noexcept {
  return static_cast<T&&>(v);
}
template <typename T>
constexpr T&& Forward(typename RemoveReference<T>::Type&& v) noexcept {
  return static_cast<T&&>(v);
}
template <typename T>
constexpr void Swap(T& a, T& b) noexcept {
  T tmp = Move(a);
  a = Move(b);
  b = Move(tmp);
}
template <typename T> constexpr const T& Min(const T& a, const T& b) { return b < a ? b : a; }
template <typename T> constexpr const T& Max(const T& a, const T& b) { return a < b ? b : a; }

// The compiler lowers these to inline code or to memcpy/memset/memmove/memcmp, the
// only C library symbols the core may reference.
// Zero lengths are allowed with null pointers (an empty Vector's data()), which the
// C functions do not promise.
inline void MemCopy(void* dst, const void* src, usize n) {
  if (n != 0) __builtin_memcpy(dst, src, n);
}
inline void MemMove(void* dst, const void* src, usize n) {
  if (n != 0) __builtin_memmove(dst, src, n);
}
inline void MemSet(void* dst, int byte, usize n) {
  if (n != 0) __builtin_memset(dst, byte, n);
}
inline int MemCompare(const void* a, const void* b, usize n) { return n == 0 ? 0 : __builtin_memcmp(a, b, n); }
inline usize StrLen(const char* s) {
  usize n = 0;
  while (s[n] != '\0') n++;
  return n;
}
// Copies `src` (null counts as "") into a fixed field of `n` bytes: truncated to
// n - 1 bytes, always NUL-terminated, the rest zero (on-disk strings).
inline void StrCopyPadded(char* dst, const char* src, usize n) {
  usize i = 0;
  for (; src != nullptr && i + 1 < n && src[i] != '\0'; i++) dst[i] = src[i];
  for (; i < n; i++) dst[i] = '\0';
}
inline bool StrEqual(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    a++;
    b++;
  }
  return *a == *b;
}

}  // namespace tfs

#endif  // TFS_PLATFORM_TYPES_H_
