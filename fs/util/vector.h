// Vector<T>: a growable array for the core whose growth can fail.
//
// Like std::vector without exceptions: every operation that may allocate returns a
// Status (kNoMemory), so callers handle allocation failure as a value, as kernel
// code must. Memory comes from the platform seam. Not copyable (copies allocate;
// use CopyFrom); movable. Not thread-safe.
#ifndef TFS_UTIL_VECTOR_H_
#define TFS_UTIL_VECTOR_H_

#include "platform/platform.h"
#include "platform/types.h"
#include "util/status.h"

namespace tfs {

template <typename T>
class Vector {
 public:
  Vector() = default;
  ~Vector() { Reset(); }
  Vector(const Vector&) = delete;
  Vector& operator=(const Vector&) = delete;
  Vector(Vector&& o) : data_(o.data_), size_(o.size_), capacity_(o.capacity_) {
    o.data_ = nullptr;
    o.size_ = o.capacity_ = 0;
  }
  Vector& operator=(Vector&& o) {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      size_ = o.size_;
      capacity_ = o.capacity_;
      o.data_ = nullptr;
      o.size_ = o.capacity_ = 0;
    }
    return *this;
  }

  [[nodiscard]] Status Reserve(usize n) {
    if (n <= capacity_) return Status::Ok();
    if (n > usize(-1) / sizeof(T)) return Err::kNoMemory;
    T* fresh = static_cast<T*>(platform::Alloc(n * sizeof(T), alignof(T) < 16 ? 16 : alignof(T)));
    if (fresh == nullptr) return Err::kNoMemory;
    for (usize i = 0; i < size_; i++) {
      new (&fresh[i]) T(Move(data_[i]));
      data_[i].~T();
    }
    platform::Free(data_);
    data_ = fresh;
    capacity_ = n;
    return Status::Ok();
  }

  // Room for n elements, growing geometrically (at least doubling), so that
  // adding elements one after another is amortized O(1).
  [[nodiscard]] Status Grow(usize n) {
    if (n <= capacity_) return Status::Ok();
    return Reserve(Max(n, capacity_ < 8 ? usize(8) : capacity_ * 2));
  }

  template <typename... Args>
  [[nodiscard]] Status EmplaceBack(Args&&... args) {
    Status st = Grow(size_ + 1);
    if (!st.ok()) return st;
    new (&data_[size_]) T(Forward<Args>(args)...);
    size_++;
    return Status::Ok();
  }
  [[nodiscard]] Status PushBack(const T& v) { return EmplaceBack(v); }
  [[nodiscard]] Status PushBack(T&& v) { return EmplaceBack(Move(v)); }
  // Appends copies of src[0, n) (src must not point into this vector), growing
  // geometrically; trivially copyable elements are copied as one block.
  [[nodiscard]] Status Append(const T* src, usize n) {
    Status st = Grow(size_ + n);
    if (!st.ok()) return st;
    if constexpr (__is_trivially_copyable(T)) {
      MemCopy(data_ + size_, src, n * sizeof(T));
    } else {
      for (usize i = 0; i < n; i++) new (&data_[size_ + i]) T(src[i]);
    }
    size_ += n;
    return Status::Ok();
  }

  // Grows with value-initialized elements or shrinks.
  [[nodiscard]] Status Resize(usize n) {
    if (n < size_) {
      for (usize i = n; i < size_; i++) data_[i].~T();
      size_ = n;
      return Status::Ok();
    }
    Status st = Reserve(n);
    if (!st.ok()) return st;
    if constexpr (__is_trivial(T)) {
      MemSet(data_ + size_, 0, (n - size_) * sizeof(T));  // value-initialized = zero
    } else {
      for (usize i = size_; i < n; i++) new (&data_[i]) T();
    }
    size_ = n;
    return Status::Ok();
  }

  [[nodiscard]] Status CopyFrom(const Vector& o) {
    Clear();
    Status st = Reserve(o.size_);
    if (!st.ok()) return st;
    for (usize i = 0; i < o.size_; i++) new (&data_[i]) T(o.data_[i]);
    size_ = o.size_;
    return Status::Ok();
  }

  void PopBack() {
    TFS_BUG_ON(size_ == 0);
    data_[--size_].~T();
  }
  // Removes element i, keeping order.
  void Erase(usize i) {
    TFS_BUG_ON(i >= size_);
    for (usize j = i; j + 1 < size_; j++) data_[j] = Move(data_[j + 1]);
    PopBack();
  }
  void Clear() {
    for (usize i = 0; i < size_; i++) data_[i].~T();
    size_ = 0;
  }

  T& operator[](usize i) { return data_[i]; }
  const T& operator[](usize i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  usize size() const { return size_; }
  usize capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void Reset() {
    Clear();
    platform::Free(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  T* data_ = nullptr;
  usize size_ = 0;
  usize capacity_ = 0;
};

}  // namespace tfs

#endif  // TFS_UTIL_VECTOR_H_
