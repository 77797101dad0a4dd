// tierfs ctl's channel to a mounted filesystem: an ioctl on the mount's root
// directory (the kernel module will answer the same ioctl). Documented in
// docs/usage.md ("tierfs ctl").
//
//   kCtlStats: the mount's live counters as one NUL-terminated JSON object of at
//   most kCtlMax bytes: "devices" (per member: label, group, queue state, I/O
//   by origin and operation with service-time quantiles), "journal", "btree",
//   "alloc" (per member bucket states, per tier totals), "data", "posix".
#ifndef TFS_USERSPACE_FUSE_CTL_H_
#define TFS_USERSPACE_FUSE_CTL_H_

#include <sys/ioctl.h>

#include <string>

#include "engine/engine.h"
#include "posix/fs.h"

namespace tfs::fuse {

// _IOC_SIZE holds 14 bits: the largest reply a FUSE ioctl copies out by itself.
inline constexpr unsigned kCtlMax = 16000;
inline constexpr unsigned kCtlStats = _IOR('T', 0x01, char[kCtlMax]);

// The kCtlStats JSON of an open engine and its mounted filesystem.
std::string StatsJson(engine::Engine& engine, posix::Filesystem& fs);

}  // namespace tfs::fuse

#endif  // TFS_USERSPACE_FUSE_CTL_H_
