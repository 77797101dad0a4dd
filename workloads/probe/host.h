// Facts about the machine and the target directory for a run's manifest: host
// name, CPUs, memory, kernel, and the mount the directory lives on (filesystem
// type, source device, options) from /proc/self/mountinfo.
//
// FindMount() takes the mountinfo text as a parameter so tests can feed it fixed
// input; it picks the longest mount point that is a path prefix of the directory
// (after resolving symlinks), which is the mount the kernel would use. Mount points
// with spaces are decoded from mountinfo's octal escapes (\040).
#ifndef TFS_WORKLOADS_PROBE_HOST_H_
#define TFS_WORKLOADS_PROBE_HOST_H_

#include <cstdint>
#include <string>

namespace tfs::probe {

struct MountInfo {
  std::string mount_point;
  std::string fstype;
  std::string source;
  std::string options;        // per-mount options (rw,noatime,...)
  std::string super_options;  // filesystem options
};

struct HostInfo {
  std::string hostname;
  std::string kernel_release;
  std::string kernel_version;
  std::string machine;
  uint64_t cpus = 0;
  uint64_t memory_bytes = 0;
};

// False when no mount in `mountinfo` contains `abs_path`.
bool FindMount(const std::string& mountinfo, const std::string& abs_path, MountInfo* out);
// Reads /proc/self/mountinfo for `dir`; fields stay empty when it cannot.
MountInfo MountOf(const std::string& dir);
HostInfo GetHostInfo();
// "2026-01-31T12:00:00.123Z" for a CLOCK_REALTIME value.
std::string IsoTime(uint64_t unix_ns);

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_HOST_H_
