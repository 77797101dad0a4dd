// Host and mount facts for the manifest (see host.h).
#include "workloads/probe/host.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "userspace/util/mountinfo.h"

namespace tfs::probe {
namespace {

bool IsPrefixPath(const std::string& mount, const std::string& path) {
  if (mount == "/") return true;
  if (path.compare(0, mount.size(), mount) != 0) return false;
  return path.size() == mount.size() || path[mount.size()] == '/';
}

}  // namespace

bool FindMount(const std::string& mountinfo, const std::string& abs_path, MountInfo* out) {
  std::istringstream lines(mountinfo);
  std::string line;
  bool found = false;
  size_t best = 0;
  while (std::getline(lines, line)) {
    userspace::MountinfoLine l;
    if (!userspace::ParseMountinfoLine(line, &l) || !IsPrefixPath(l.mount_point, abs_path)) continue;
    // Later lines win ties: a mount stacked over the same point hides earlier ones.
    if (!found || l.mount_point.size() >= best) {
      found = true;
      best = l.mount_point.size();
      out->mount_point = l.mount_point;
      out->options = l.options;
      out->fstype = l.fstype;
      out->source = l.source;
      out->super_options = l.super_options;
    }
  }
  return found;
}

MountInfo MountOf(const std::string& dir) {
  MountInfo m;
  char resolved[PATH_MAX];
  if (realpath(dir.c_str(), resolved) == nullptr) return m;
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  FindMount(text.str(), resolved, &m);
  return m;
}

HostInfo GetHostInfo() {
  HostInfo h;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) h.hostname = name;
  struct utsname u;
  if (uname(&u) == 0) {
    h.kernel_release = u.release;
    h.kernel_version = u.version;
    h.machine = u.machine;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  h.cpus = cpus > 0 ? uint64_t(cpus) : 0;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) h.memory_bytes = uint64_t(pages) * uint64_t(page);
  return h;
}

std::string IsoTime(uint64_t unix_ns) {
  time_t secs = time_t(unix_ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, sizeof(buf) - n, ".%03uZ", unsigned(unix_ns / 1'000'000 % 1000));
  return buf;
}

}  // namespace tfs::probe
