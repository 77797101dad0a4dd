// The error code table behind Status: class, errno and message per code, and the
// errno -> code mapping used where the platform seam reports an OS error.
#include "util/status.h"

#include "platform/platform.h"

namespace tfs {
namespace {

struct ErrorInfo {
  ErrorClass cls;
  i16 errno_value;
  const char* name;
  const char* message;
};

constexpr ErrorInfo kErrors[] = {
    {ErrorClass::kOk, 0, "Ok", "success"},
#define TFS_X(code, cls, errno_value, message) \
  {ErrorClass::cls, errno_value, &(#code)[1], message}, /* the name without its k */
    TFS_ERROR_CODES(TFS_X)
#undef TFS_X
};
static_assert(TFS_ARRAY_SIZE(kErrors) == usize(Err::kCount), "one entry per code");

const ErrorInfo& Info(i32 code) {
  if (code < 0 || code >= i32(Err::kCount)) return kErrors[i32(Err::kInternal)];
  return kErrors[code];
}

}  // namespace

ErrorClass Status::error_class() const { return Info(code_).cls; }
int Status::ToErrno() const { return -Info(code_).errno_value; }
const char* Status::Name() const { return Info(code_).name; }
const char* Status::Message() const { return Info(code_).message; }

Status Status::FromErrno(int err) {
  if (err < 0) err = -err;
  switch (err) {
    case 0: return Status();
    case 1: return Err::kPermission;     // EPERM
    case 2: return Err::kNotFound;       // ENOENT
    case 6: return Err::kNotFound;       // ENXIO
    case 11: return Err::kAgain;         // EAGAIN
    case 12: return Err::kNoMemory;      // ENOMEM
    case 13: return Err::kAccess;        // EACCES
    case 16: return Err::kBusy;          // EBUSY
    case 17: return Err::kExists;        // EEXIST
    case 22: return Err::kInvalidArgument;  // EINVAL
    case 27: return Err::kTooBig;        // EFBIG
    case 28: return Err::kNoSpace;       // ENOSPC
    case 30: return Err::kReadOnly;      // EROFS
    case 36: return Err::kNameTooLong;   // ENAMETOOLONG
    case 38: return Err::kNotSupported;  // ENOSYS
    case 39: return Err::kNotEmpty;      // ENOTEMPTY
    case 61: return Err::kNoData;        // ENODATA
    case 74: return Err::kCorrupt;       // EBADMSG
    case 95: return Err::kNotSupported;  // EOPNOTSUPP
    case 110: return Err::kIoTimeout;    // ETIMEDOUT
    case 117: return Err::kCorrupt;      // EUCLEAN
    case 122: return Err::kNoSpace;      // EDQUOT
    default: return Err::kIo;            // EIO and anything unmapped
  }
}

const char* ErrorClassName(ErrorClass c) {
  switch (c) {
    case ErrorClass::kOk: return "Ok";
    case ErrorClass::kInvalid: return "Invalid";
    case ErrorClass::kNoSpace: return "NoSpace";
    case ErrorClass::kNoMemory: return "NoMemory";
    case ErrorClass::kIo: return "Io";
    case ErrorClass::kCorrupt: return "Corrupt";
    case ErrorClass::kAgain: return "Again";
    case ErrorClass::kNotFound: return "NotFound";
    case ErrorClass::kExists: return "Exists";
    case ErrorClass::kPermission: return "Permission";
    case ErrorClass::kNotSupported: return "NotSupported";
    case ErrorClass::kBusy: return "Busy";
    case ErrorClass::kInternal: return "Internal";
  }
  return "Unknown";
}

void Bug(const char* file, int line, const char* what) {
  platform::Log(platform::LogLevel::kFatal, "BUG at %s:%d: %s", file, line, what);
  __builtin_trap();
}

}  // namespace tfs
