// Sort: an in-place heapsort for the core (no <algorithm>): O(n log n) worst case,
// no allocation, no recursion -- suitable for kernel stacks. Not stable.
// LowerBound: a binary search over a sorted range.
#ifndef TFS_UTIL_SORT_H_
#define TFS_UTIL_SORT_H_

#include "platform/types.h"

namespace tfs {

// Sorts [first, first + n) so that !less(a[i+1], a[i]) for all i.
template <typename T, typename Less>
void Sort(T* first, usize n, Less less) {
  auto sift_down = [&](usize root, usize end) {
    for (;;) {
      usize child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && less(first[child], first[child + 1])) child++;
      if (!less(first[root], first[child])) return;
      Swap(first[root], first[child]);
      root = child;
    }
  };
  if (n < 2) return;
  for (usize i = n / 2; i-- > 0;) sift_down(i, n);
  for (usize end = n - 1; end > 0; end--) {
    Swap(first[0], first[end]);
    sift_down(0, end);
  }
}

// The first i in [0, n) with !before(first[i]), or n: `before` holds for a
// prefix of the range and not after it (a range sorted by what it tests).
template <typename T, typename Before>
usize LowerBound(const T* first, usize n, Before before) {
  usize lo = 0, hi = n;
  while (lo < hi) {
    const usize mid = lo + (hi - lo) / 2;
    if (before(first[mid])) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace tfs

#endif  // TFS_UTIL_SORT_H_
