// One line of /proc/self/mountinfo (proc(5)), parsed: the fields the tools use,
// with mountinfo's octal escapes (\040 for a space, \011, \012, \134) decoded in
// the mount point and the source. Shared by `tierfs mount`'s "already mounted"
// check (userspace/tools/mount_table.cc) and tierprobe's manifest
// (workloads/probe/host.cc).
#ifndef TFS_USERSPACE_UTIL_MOUNTINFO_H_
#define TFS_USERSPACE_UTIL_MOUNTINFO_H_

#include <string>

namespace tfs::userspace {

struct MountinfoLine {
  std::string mount_point;    // decoded
  std::string options;        // per-mount options (rw,noatime,...)
  std::string fstype;         // e.g. fuse.tierfs
  std::string source;         // decoded
  std::string super_options;  // filesystem options ("" if the line has none)
};

// False (and *out untouched) if `line` is not a mountinfo line:
// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE [SUPER].
bool ParseMountinfoLine(const std::string& line, MountinfoLine* out);

// Decodes mountinfo's \OOO escapes; anything else is copied as it is.
std::string UnescapeMountinfo(const std::string& s);

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_UTIL_MOUNTINFO_H_
