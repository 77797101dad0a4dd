// Diag: a fixed-size buffer for the one-line explanation that goes with an error.
//
// A Status says what class of thing went wrong; operations that users run directly
// (format, mount, fsck) also need to say *which* device, key or field, and why.
// They take an optional Diag* and fill it with Set(); front ends print it. Kernel
// safe: no allocation, bounded formatting.
#ifndef TFS_UTIL_DIAG_H_
#define TFS_UTIL_DIAG_H_

#include "platform/platform.h"
#include "util/status.h"

namespace tfs {

struct Diag {
  char text[256] = {};

  bool empty() const { return text[0] == '\0'; }
};

// Fills `diag` (when not null) and returns `st`, so call sites read
//   return DiagError(diag, Err::kCorrupt, "%s: bad superblock checksum", name);
Status DiagError(Diag* diag, Status st, const char* fmt, ...) TFS_PRINTF(3, 4);

}  // namespace tfs

#endif  // TFS_UTIL_DIAG_H_
