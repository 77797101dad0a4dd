// tierfs ctl's channel to a mounted filesystem: an ioctl on the mount's root
// directory (the kernel module will answer the same ioctl). Documented in
// docs/usage.md ("tierfs ctl").
//
//   kCtlStats: the mount's live counters as one NUL-terminated JSON object of at
//   most kCtlMax bytes, written by the core (fs/mount/stats.h: the same bytes
//   the kernel module will return); the front end adds each member's "path"
//   and, for a member the command line ran over a fault device, "fault" (its
//   state and I/O by origin as the fault device saw it). A document that does
//   not fit is ENOSPC, never a cut one.
//
//   kCtlFault: in, "MEMBER COMMAND ARGS" (NUL-terminated); out, the one-line
//   reply of the member's fault device ("ok ...", "error: ...", or for `stats`
//   its JSON). The ioctl itself fails only when the mount has no such channel.
//
//   kCtlCommand: in, a control line ("pause all"); out, the core's one-line
//   reply ("ok ..." or "error: ...": fs/mount/control.h). The ioctl itself
//   does not fail.
#ifndef TFS_USERSPACE_FUSE_CTL_H_
#define TFS_USERSPACE_FUSE_CTL_H_

#include <sys/ioctl.h>

#include <string>

#include "mount/instance.h"
#include "userspace/util/json.h"

namespace tfs::fuse {

// _IOC_SIZE holds 14 bits: the largest reply a FUSE ioctl copies out by itself.
inline constexpr unsigned kCtlMax = 16000;
inline constexpr unsigned kCtlStats = _IOR('T', 0x01, char[kCtlMax]);
inline constexpr unsigned kCtlFault = _IOWR('T', 0x02, char[kCtlMax]);
inline constexpr unsigned kCtlCommand = _IOWR('T', 0x03, char[kCtlMax]);

// What the front end knows of the members beyond the store: where they are
// and, in the lab, the fault devices under them (userspace/tools/members.h).
// Called from FUSE worker threads, concurrently.
class MemberControl {
 public:
  virtual ~MemberControl() = default;
  // The path the member whose device is `dev` (the store's member's
  // bdev(): the store orders members by their superblocks, not as given)
  // was opened by ("" if unknown: a degraded mount's missing member).
  virtual std::string Path(const BlockDevice* dev) = 0;
  // Writes that member's fault state as one JSON value; false (nothing
  // written) if it has no fault device.
  virtual bool WriteFault(const BlockDevice* dev, userspace::JsonWriter& w) = 0;
  // Writes that member's device I/O counters (the io_uring device's, and the
  // daemon's thread rings) as one JSON object; false (nothing written) if
  // unknown.
  virtual bool WriteUring(const BlockDevice* dev, userspace::JsonWriter& w) = 0;
  // Runs "MEMBER COMMAND ARGS"; returns the one-line reply.
  virtual std::string FaultCommand(const std::string& line) = 0;
};

// The kCtlStats reply of an open instance into *out; `members` may be null.
// kNoSpace when it would be longer than kCtlMax - 1 bytes.
Status CtlStats(mount::Instance& inst, MemberControl* members, std::string* out);

// The kCtlCommand reply to `line` (the core's: mount::RunControl).
std::string CtlCommand(mount::Instance& inst, const std::string& line);

}  // namespace tfs::fuse

#endif  // TFS_USERSPACE_FUSE_CTL_H_
