// Atomics for the core, from the compiler's __atomic builtins (no <atomic>: the
// kernel build has no standard headers). Integral and pointer types only.
//
// Memory orders are explicit at every call that is not sequentially consistent, so
// a reader can see which accesses publish data and which only count.
#ifndef TFS_PLATFORM_ATOMIC_H_
#define TFS_PLATFORM_ATOMIC_H_

#include "platform/types.h"

namespace tfs {

enum class MemOrder : int {
  kRelaxed = __ATOMIC_RELAXED,
  kAcquire = __ATOMIC_ACQUIRE,
  kRelease = __ATOMIC_RELEASE,
  kAcqRel = __ATOMIC_ACQ_REL,
  kSeqCst = __ATOMIC_SEQ_CST,
};

template <typename T>
class Atomic {
 public:
  constexpr Atomic() : value_() {}
  constexpr explicit Atomic(T v) : value_(v) {}
  Atomic(const Atomic&) = delete;
  Atomic& operator=(const Atomic&) = delete;

  T Load(MemOrder mo = MemOrder::kSeqCst) const { return __atomic_load_n(&value_, int(mo)); }
  void Store(T v, MemOrder mo = MemOrder::kSeqCst) { __atomic_store_n(&value_, v, int(mo)); }
  T Exchange(T v, MemOrder mo = MemOrder::kSeqCst) {
    return __atomic_exchange_n(&value_, v, int(mo));
  }
  // On failure `expected` receives the current value.
  bool CompareExchange(T& expected, T desired, MemOrder mo = MemOrder::kSeqCst) {
    return __atomic_compare_exchange_n(&value_, &expected, desired, false, int(mo),
                                       FailureOrder(mo));
  }
  T FetchAdd(T v, MemOrder mo = MemOrder::kSeqCst) { return __atomic_fetch_add(&value_, v, int(mo)); }
  T FetchSub(T v, MemOrder mo = MemOrder::kSeqCst) { return __atomic_fetch_sub(&value_, v, int(mo)); }
  T FetchOr(T v, MemOrder mo = MemOrder::kSeqCst) { return __atomic_fetch_or(&value_, v, int(mo)); }
  T FetchAnd(T v, MemOrder mo = MemOrder::kSeqCst) { return __atomic_fetch_and(&value_, v, int(mo)); }

  // For the wait/wake seam, which sleeps on the address of a 32-bit word.
  const T* Address() const { return &value_; }

 private:
  static constexpr int FailureOrder(MemOrder mo) {
    return mo == MemOrder::kAcqRel   ? __ATOMIC_ACQUIRE
           : mo == MemOrder::kRelease ? __ATOMIC_RELAXED
                                      : int(mo);
  }
  T value_;
};

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace tfs

#endif  // TFS_PLATFORM_ATOMIC_H_
