// Mount sources, /proc/self/mountinfo lookups and member locks for the tierfs
// command line (see mount_table.h for why an opener waits).
#include "userspace/tools/mount_table.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "userspace/tools/common.h"
#include "userspace/util/mountinfo.h"

namespace tfs::tools {
namespace {

// What makes two paths the same member: the device number of a block device,
// else the file's device and inode.
struct Identity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Identity& o) const { return dev == o.dev && ino == o.ino; }
  bool operator<(const Identity& o) const { return dev != o.dev ? dev < o.dev : ino < o.ino; }
};

std::optional<Identity> IdentityOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  if (S_ISBLK(st.st_mode)) return Identity{st.st_rdev, 0};
  return Identity{st.st_dev, st.st_ino};
}

// A mount source's members. A member path may itself hold ':' (every
// /dev/disk/by-path name does): pieces are joined back while the joined path
// does not exist and a longer one might.
std::vector<std::string> SplitMembers(const std::string& spec) {
  std::vector<std::string> pieces, out;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t colon = spec.find(':', at);
    if (colon == std::string::npos) colon = spec.size();
    pieces.push_back(spec.substr(at, colon - at));
    at = colon + 1;
  }
  for (size_t i = 0; i < pieces.size(); i++) {
    std::string cur = pieces[i];
    size_t j = i;
    struct stat st;
    while (stat(cur.c_str(), &st) != 0 && j + 1 < pieces.size()) {
      std::string longer = cur;
      size_t k = j;
      bool found = false;
      while (k + 1 < pieces.size()) {  // the shortest longer name that exists
        longer += ":" + pieces[++k];
        if (stat(longer.c_str(), &st) == 0) {
          found = true;
          break;
        }
      }
      if (!found) break;
      cur = longer;
      j = k;
    }
    if (!cur.empty()) out.push_back(cur);
    i = j;
  }
  return out;
}

std::string Joined(const std::vector<std::string>& paths) {
  std::string s;
  for (const std::string& p : paths) s += (s.empty() ? "" : " ") + p;
  return s;
}

}  // namespace

std::string MountSource(const std::vector<std::string>& devices) {
  std::string cwd;
  if (char* c = getcwd(nullptr, 0)) {
    cwd = c;
    free(c);
  }
  std::string source;
  for (const std::string& d : devices) {
    if (!source.empty()) source += ':';
    source += (d.empty() || d[0] == '/' || cwd.empty()) ? d : cwd + "/" + d;
  }
  return source;
}

std::string FsnameOption(const std::string& source) {
  std::string out;
  for (char c : source) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::optional<MountedSet> FindMount(const std::vector<std::string>& devices) {
  std::vector<Identity> ours;
  for (const std::string& d : devices) {
    if (auto id = IdentityOf(d)) ours.push_back(*id);
  }
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    userspace::MountinfoLine l;
    if (!userspace::ParseMountinfoLine(line, &l) || l.fstype != "fuse.tierfs") continue;
    MountedSet m{l.source, l.mount_point};
    for (const std::string& member : SplitMembers(m.source)) {
      auto id = IdentityOf(member);
      if (!id) continue;
      for (const Identity& o : ours) {
        if (*id == o) return m;
      }
    }
  }
  return std::nullopt;
}

MemberLocks::~MemberLocks() {
  for (int fd : fds_) close(fd);
}

bool MemberLocks::Take(const std::string& cmd, const std::vector<std::string>& devices, Mode mode) {
  auto mounted = [&]() {
    std::optional<MountedSet> m = FindMount(devices);
    if (m) PrintError(cmd, Joined(devices) + ": already mounted on " + m->mountpoint);
    return m.has_value();
  };
  if (mounted()) return false;
  // One device named twice would wait for its own lock.
  for (size_t i = 0; i < devices.size(); i++) {
    for (size_t j = 0; j < i; j++) {
      auto a = IdentityOf(devices[j]), b = IdentityOf(devices[i]);
      if (a && b && *a == *b) {
        PrintError(cmd, devices[j] + " and " + devices[i] + ": the same device, named twice");
        return false;
      }
    }
  }
  int wait_s = kLockWaitSeconds;
  if (const char* env = getenv("TIERFS_LOCK_WAIT")) {
    char* end = nullptr;
    long v = strtol(env, &end, 10);
    if (*env == '\0' || *end != '\0' || v < 0 || v > 86400) {
      PrintError(cmd, std::string("TIERFS_LOCK_WAIT=") + env + ": want a number of seconds (0..86400)");
      return false;
    }
    wait_s = int(v);
  }
  const int op = (mode == Mode::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  const auto start = std::chrono::steady_clock::now();
  bool said_waiting = false;
  // One order for every opener (by identity, not as named), so two openers of
  // one set named in different orders never hold one lock each while waiting
  // for the other's.
  std::vector<std::pair<Identity, std::string>> order;
  for (const std::string& p : devices) order.push_back({IdentityOf(p).value_or(Identity{}), p});
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& entry : order) {
    const std::string& p = entry.second;
    // O_NONBLOCK: opening a FIFO (or a tty) to lock it must not wait for a peer;
    // only files and block devices can be members.
    int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      PrintError(cmd, p + ": " + strerror(errno));
      return false;
    }
    fds_.push_back(fd);
    struct stat st;
    if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
      PrintError(cmd, p + ": not a regular file or block device");
      return false;
    }
    // Not mounted, yet locked: a daemon finishing after its unmount, an fsck,
    // or a mount still opening the set. Wait for it, looking for a mount.
    while (flock(fd, op) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        PrintError(cmd, p + ": flock: " + strerror(errno));
        return false;
      }
      if (mounted()) return false;
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= std::chrono::seconds(wait_s)) {
        PrintError(cmd, p + ": in use (another tierfs mount or fsck has held it for " + std::to_string(wait_s) +
                            " s)");
        return false;
      }
      if (!said_waiting && waited >= std::chrono::seconds(1)) {
        fprintf(stderr, "tierfs %s: %s: waiting for the tierfs process holding it (a daemon finishing "
                        "after its unmount, or an fsck) to let go\n", cmd.c_str(), p.c_str());
        said_waiting = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return true;
}

}  // namespace tfs::tools
