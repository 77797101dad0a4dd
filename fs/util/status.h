// Errors as values: Status, Result<T> and TFS_TRY.
//
// A Status is one int: 0 for success or an error code from the table below. Every
// code belongs to a class (NoSpace, Io, Corrupt, Again, ...) and callers branch on
// the class (`st.Is(ErrorClass::kCorrupt)`), so new specific codes can be added
// without touching callers. Corruption is always its own class, never mixed with
// "try again". Conversion to a negative errno happens only at the FUSE and VFS edges
// (ToErrno); conversion from an errno only where the platform seam reports one
// (FromErrno).
//
// Kernel-safe: no allocation, no exceptions; a Status is trivially copyable.
#ifndef TFS_UTIL_STATUS_H_
#define TFS_UTIL_STATUS_H_

#include "platform/types.h"

namespace tfs {

enum class ErrorClass : u8 {
  kOk = 0,
  kInvalid,       // the caller asked for something malformed or out of range
  kNoSpace,       // out of device space (or of a reserve)
  kNoMemory,      // an allocation failed
  kIo,            // a device failed or timed out
  kCorrupt,       // bytes read do not pass validation (checksum, magic, bounds)
  kAgain,         // transient: retry (lock restart, not admitted, would block)
  kNotFound,      // no such key, inode, entry or device
  kExists,        // already exists
  kPermission,    // read-only, not permitted, access denied
  kNotSupported,  // valid request the implementation or device cannot do
  kBusy,          // resource in use
  kInternal,      // a broken invariant in tierfs itself
};

// X(code, class, errno, message). Codes are numbered in this order starting at 1;
// the numbers are in-memory only and never stored on disk. Errno values are the
// Linux ones (the core has no errno.h).
#define TFS_ERROR_CODES(X)                                                              \
  X(kInvalidArgument, kInvalid, 22, "invalid argument")                                \
  X(kOutOfRange, kInvalid, 22, "offset or length beyond the end of the device")        \
  X(kMisaligned, kInvalid, 22, "offset or length not a multiple of the block size")    \
  X(kNameTooLong, kInvalid, 36, "name too long")                                       \
  X(kTooBig, kInvalid, 27, "value too large")                                          \
  X(kNoSpace, kNoSpace, 28, "no space left on device")                                 \
  X(kNoMemory, kNoMemory, 12, "out of memory")                                         \
  X(kIo, kIo, 5, "I/O error")                                                          \
  X(kIoTimeout, kIo, 5, "I/O timed out")                                               \
  X(kMissing, kIo, 5, "member device missing (a degraded mount)")                      \
  X(kCorrupt, kCorrupt, 117, "metadata corrupt")                                       \
  X(kBadChecksum, kCorrupt, 117, "checksum mismatch")                                  \
  X(kBadMagic, kCorrupt, 117, "bad magic number")                                      \
  X(kBadVersion, kCorrupt, 117, "unsupported on-disk version")                         \
  X(kDataCorrupt, kCorrupt, 5, "file data failed its checksum (I/O error)")           \
  X(kAgain, kAgain, 11, "resource temporarily unavailable")                            \
  X(kNotAdmitted, kAgain, 11, "request not admitted (device busy)")                    \
  X(kRestart, kAgain, 11, "transaction restart")                                       \
  X(kNotFound, kNotFound, 2, "not found")                                              \
  X(kNoData, kNotFound, 61, "no data available")                                       \
  X(kNoSuchOffset, kNotFound, 6, "no data or hole at or past that offset")             \
  X(kExists, kExists, 17, "already exists")                                            \
  X(kNotEmpty, kExists, 39, "directory not empty")                                     \
  X(kPermission, kPermission, 1, "operation not permitted")                            \
  X(kAccess, kPermission, 13, "permission denied")                                     \
  X(kReadOnly, kPermission, 30, "read-only device or filesystem")                      \
  X(kNotSupported, kNotSupported, 95, "operation not supported")                       \
  X(kBusy, kBusy, 16, "device or resource busy")                                       \
  X(kNotDir, kInvalid, 20, "not a directory")                                          \
  X(kIsDir, kInvalid, 21, "is a directory")                                            \
  X(kTooManyLinks, kInvalid, 31, "too many links")                                     \
  X(kRange, kInvalid, 34, "result does not fit the buffer")                            \
  X(kNoDevice, kNotSupported, 19, "not supported for this file type")                  \
  X(kInternal, kInternal, 5, "internal error (a tierfs bug)")

enum class Err : i32 {
  kOk = 0,
#define TFS_X(code, cls, errno_value, message) code,
  TFS_ERROR_CODES(TFS_X)
#undef TFS_X
      kCount,
};

class [[nodiscard]] Status {
 public:
  constexpr Status() : code_(0) {}
  constexpr Status(Err e) : code_(i32(e)) {}  // NOLINT: implicit, so `return Err::kIo;` works

  static constexpr Status Ok() { return Status(); }
  // From a Linux errno, positive or negative (0 is Ok). Unknown values map to kIo.
  static Status FromErrno(int err);

  constexpr bool ok() const { return code_ == 0; }
  constexpr Err code() const { return Err(code_); }
  ErrorClass error_class() const;
  bool Is(ErrorClass c) const { return error_class() == c; }
  // The negative Linux errno for the FUSE/VFS edge; 0 for Ok.
  int ToErrno() const;
  // Short identifier ("NoSpace") and human text ("no space left on device").
  const char* Name() const;
  const char* Message() const;

  // Explicitly drop a Status (for best-effort paths; say why at the call site).
  void IgnoreError() const {}

  constexpr bool operator==(const Status& o) const { return code_ == o.code_; }
  constexpr bool operator!=(const Status& o) const { return code_ != o.code_; }

 private:
  i32 code_;
};

static_assert(sizeof(Status) == sizeof(int), "Status is one int");

const char* ErrorClassName(ErrorClass c);

// Broken invariants: log and trap. Used only for bugs in tierfs, never for bad
// input or bad bytes on disk (those are Status values).
[[noreturn]] void Bug(const char* file, int line, const char* what);
#define TFS_BUG_ON(cond)                                           \
  do {                                                             \
    if (TFS_UNLIKELY(cond)) ::tfs::Bug(__FILE__, __LINE__, #cond); \
  } while (0)

// Result<T>: a value or an error Status. Kernel-safe (no exceptions): reading the
// value of an error Result is a bug and traps.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& v) : status_(), value_(v) {}        // NOLINT: implicit by design
  Result(T&& v) : status_(), value_(Move(v)) {}       // NOLINT
  Result(Status s) : status_(s.ok() ? Status(Err::kInternal) : s) {}  // NOLINT
  Result(Err e) : Result(Status(e)) {}                                // NOLINT
  Result(Result&& o) : status_(o.status_) {
    if (status_.ok()) new (&value_) T(Move(o.value_));
  }
  Result(const Result& o) : status_(o.status_) {
    if (status_.ok()) new (&value_) T(o.value_);
  }
  Result& operator=(Result&& o) {
    if (this != &o) {
      Reset();
      status_ = o.status_;
      if (status_.ok()) new (&value_) T(Move(o.value_));
    }
    return *this;
  }
  Result& operator=(const Result& o) {
    if (this != &o) {
      Reset();
      status_ = o.status_;
      if (status_.ok()) new (&value_) T(o.value_);
    }
    return *this;
  }
  ~Result() { Reset(); }

  bool ok() const { return status_.ok(); }
  Status status() const { return status_; }

  T& value() & {
    TFS_BUG_ON(!ok());
    return value_;
  }
  const T& value() const& {
    TFS_BUG_ON(!ok());
    return value_;
  }
  T&& value() && {
    TFS_BUG_ON(!ok());
    return Move(value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Reset() {
    if (status_.ok()) value_.~T();
    status_ = Err::kInternal;
  }

  Status status_;
  union {
    T value_;
  };
};

namespace internal {
inline Status StatusOf(const Status& s) { return s; }
template <typename T> Status StatusOf(const Result<T>& r) { return r.status(); }
inline void ValueOf(const Status&) {}
template <typename T> T ValueOf(Result<T>&& r) { return Move(r).value(); }
}  // namespace internal

}  // namespace tfs

// TFS_TRY(expr): evaluate a Status or Result<T>; on error return its Status from the
// enclosing function (whose return type is Status or any Result<U>); otherwise the
// expression's value is the Result's value (or void for a Status).
//   TFS_TRY(dev.Flush());
//   u64 n = TFS_TRY(ReadCount());
#define TFS_TRY(expr)                                                                 \
  ({                                                                                  \
    auto&& tfs_try_result_ = (expr);                                                  \
    if (TFS_UNLIKELY(!tfs_try_result_.ok()))                                          \
      return ::tfs::internal::StatusOf(tfs_try_result_);                              \
    ::tfs::internal::ValueOf(::tfs::Move(tfs_try_result_));                           \
  })
#ifndef TRY
#define TRY(expr) TFS_TRY(expr)
#endif

#endif  // TFS_UTIL_STATUS_H_
