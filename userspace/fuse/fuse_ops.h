// The FUSE front end: libfuse3's low-level operations, each translated to one
// posix::Filesystem call (fs/posix/fs.h). Nothing filesystem-specific lives
// here: node ids are inode numbers (the root is FUSE_ROOT_ID = kRootIno), errors
// are Status::ToErrno(), the caller's uid and gid come from the request.
//
// Access checks are the kernel's: mounts always use `default_permissions`.
// (posix adds chattr's owner-or-CAP_FOWNER rule for tierfs.* options, which
// the kernel leaves to write access: the request's uid and capability are
// handed to it, RequestOptionCaller in fuse_ops.cc.)
#ifndef TFS_USERSPACE_FUSE_FUSE_OPS_H_
#define TFS_USERSPACE_FUSE_FUSE_OPS_H_

#define FUSE_USE_VERSION 314
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <fuse_lowlevel.h>

#include "mount/instance.h"
#include "posix/fs.h"
#include "userspace/fuse/ctl.h"
#include "userspace/fuse/refusal_log.h"

namespace tfs::fuse {

// What the operations reach through fuse_req_userdata().
struct Context {
  mount::Instance* instance = nullptr;  // only passed whole to ctl (its counters)
  posix::Filesystem* fs = nullptr;      // the instance's: every operation's one call
  MemberControl* members = nullptr;  // for tierfs ctl; may be null
  double attr_timeout = 1.0;   // seconds the kernel may cache attributes and entries
  // For invalidations of what the kernel caches (a write that took setid
  // bits away); may be null (then none are sent).
  fuse_session* se = nullptr;

  // Files whose kernel page cache may hold data tierfs does not have (see
  // MarkDirect in fuse_ops.cc): their next open drops it.
  std::mutex stale_mu;
  std::unordered_set<uint64_t> stale;

  // The log lines of refused option changes: sanitized and rate-limited
  // (any user of an allow_other mount can cause them).
  RefusalLog refusals;
};

// The operation table (static; valid for the life of the process).
const fuse_lowlevel_ops* Operations();

}  // namespace tfs::fuse

#endif  // TFS_USERSPACE_FUSE_FUSE_OPS_H_
