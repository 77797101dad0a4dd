// tierfs ctl MOUNTPOINT: prints the live counters of a mounted tierfs as JSON,
// read through the kCtlStats ioctl on the mount's root (userspace/fuse/ctl.h).
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "userspace/fuse/ctl.h"
#include "userspace/tools/common.h"

namespace tfs::tools {

int CmdCtl(int argc, char** argv) {
  CLI::App app("Print the live counters of a mounted tierfs filesystem as JSON.", "tierfs ctl");
  std::string mountpoint;
  app.add_option("mountpoint", mountpoint, "where the filesystem is mounted")->required();
  CLI11_PARSE(app, argc, argv);
  int fd = open(mountpoint.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    PrintError("ctl", mountpoint + ": " + strerror(errno));
    return 1;
  }
  std::vector<char> buf(fuse::kCtlMax, 0);
  int n = ioctl(fd, fuse::kCtlStats, buf.data());
  const int err = errno;
  close(fd);
  if (n < 0) {
    if (err == ENOTTY || err == EINVAL || err == ENOSYS || err == EOPNOTSUPP)
      PrintError("ctl", mountpoint + ": not the root of a mounted tierfs filesystem");
    else
      PrintError("ctl", mountpoint + ": " + strerror(err));
    return 1;
  }
  fwrite(buf.data(), 1, size_t(n), stdout);
  fputc('\n', stdout);
  return 0;
}

}  // namespace tfs::tools
