// The control commands of a mounted filesystem: `tierfs ctl MNT pause|resume
// ENGINE...` (docs/usage.md, "tierfs ctl"; docs/design/tiering.md, step
// 22-1). One line in, one line out -- the FUSE daemon's ctl ioctl hands
// both through (userspace/fuse/ctl.h), the kernel module's will too.
//
//   pause ENGINE...    no engine named starts another step until resumed;
//                      a step already running ends on its own
//   resume ENGINE...   undoes it
// ENGINE: reconcile, promote, copygc, or all. Either is idempotent. The
// whole line is checked before anything changes.
//
// Replies: "ok paused: reconcile promote copygc" (the engines the command
// named, in EngineId order), or "error: usage: ...", "error: unknown command
// 'x' ...", "error: unknown engine 'x' ..." -- the front end exits 2 for
// those, as for a fault device's.
//
// Kernel-safe: no allocation; the reply is cut to `cap` bytes (NUL
// included; 200 always fit). Thread-safe: any thread, concurrently.
#ifndef TFS_MOUNT_CONTROL_H_
#define TFS_MOUNT_CONTROL_H_

#include "mount/instance.h"
#include "platform/types.h"
#include "util/status.h"

namespace tfs::mount {

// Runs `line` (`len` bytes, NUL not needed) on an open instance and writes
// the reply into `reply`. kInvalidArgument for a line it refused (the reply
// says why), and for an instance that is not open.
Status RunControl(Instance& inst, const char* line, usize len, char* reply, usize cap);

}  // namespace tfs::mount

#endif  // TFS_MOUNT_CONTROL_H_
