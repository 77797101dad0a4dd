// Which tierfs device sets are mounted, and the locks that keep two tierfs
// processes off one set.
//
// A mount's source (fsname) is its whole member list joined by ':', the form
// mount.fuse.tierfs and fstab take ("/dev/sda:/dev/sdb"), so `findmnt -S`,
// `umount SOURCE` and this file's FindMount see every member. A mount daemon
// holds an exclusive flock on every member for its life, fsck holds one for
// its run (shared for -n, exclusive for -y).
//
// The kernel does not wait for a FUSE daemon at unmount: umount(2) returns as
// soon as the connection is aborted, while the daemon still writes its state
// out and holds the locks. So an opener that finds a member locked tells two
// cases apart by /proc/self/mountinfo: a mount that names the member is live
// ("already mounted on X", at once); no such mount means the holder is a
// daemon whose mount is gone (or an fsck, or a mount still starting), and the
// opener waits for the lock, bounded by kLockWait, looking at mountinfo again
// as it waits.
//
// Not thread-safe; a MemberLocks is owned by one command for its run.
#ifndef TFS_USERSPACE_TOOLS_MOUNT_TABLE_H_
#define TFS_USERSPACE_TOOLS_MOUNT_TABLE_H_

#include <optional>
#include <string>
#include <vector>

namespace tfs::tools {

// How long an opener waits for a member locked by a process with no mount:
// a daemon writing out its state after the unmount returned, or an fsck.
// TIERFS_LOCK_WAIT=SECONDS in the environment overrides it (0: do not wait).
inline constexpr int kLockWaitSeconds = 60;

// The mount source for a member list: the paths joined by ':', each made
// absolute against the working directory (not resolved: an fstab line's
// /dev/disk/by-id/... names stay as written, so `umount SPEC` matches).
std::string MountSource(const std::vector<std::string>& devices);

// The same source escaped for libfuse's -o fsname= (',' and '\' escaped).
std::string FsnameOption(const std::string& source);

struct MountedSet {
  std::string source;      // as in mountinfo
  std::string mountpoint;  // as in mountinfo
};

// The fuse.tierfs mount in /proc/self/mountinfo whose source names a member
// that is the same file or block device as one of `devices` (compared by
// identity, not by spelling), if there is one.
std::optional<MountedSet> FindMount(const std::vector<std::string>& devices);

// flocks on a member set, released when destroyed.
class MemberLocks {
 public:
  enum class Mode { kShared, kExclusive };
  MemberLocks() = default;
  MemberLocks(const MemberLocks&) = delete;
  MemberLocks& operator=(const MemberLocks&) = delete;
  ~MemberLocks();

  // Refuses a set that is mounted ("already mounted on X"), else locks every
  // member, waiting up to kLockWaitSeconds (or TIERFS_LOCK_WAIT) for holders
  // without a mount (a line on stderr says so after a second). False after printing one line
  // "tierfs CMD: ..." naming why.
  [[nodiscard]] bool Take(const std::string& cmd, const std::vector<std::string>& devices, Mode mode);

 private:
  std::vector<int> fds_;
};

}  // namespace tfs::tools

#endif  // TFS_USERSPACE_TOOLS_MOUNT_TABLE_H_
