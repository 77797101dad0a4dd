// tierfs ctl MOUNTPOINT [pause|resume ENGINE... | fault MEMBER COMMAND...]:
// prints the live counters of a mounted tierfs as JSON (the kCtlStats ioctl
// on the mount's root), pauses or resumes its background engines
// (kCtlCommand: the core's control line, fs/mount/control.h), or sends a
// command to a member's fault device (kCtlFault; userspace/fuse/ctl.h).
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

namespace {

// Opens the mount's root for the ctl ioctls; -1 after printing why not.
int OpenRoot(const std::string& mountpoint) {
  int fd = open(mountpoint.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) PrintError("ctl", mountpoint + ": " + strerror(errno));
  return fd;
}

void PrintIoctlError(const std::string& mountpoint, int err) {
  if (err == ENOTTY || err == EINVAL || err == ENOSYS || err == EOPNOTSUPP)
    PrintError("ctl", mountpoint + ": not the root of a mounted tierfs filesystem");
  else
    PrintError("ctl", mountpoint + ": " + strerror(err));
}

}  // namespace

int CmdCtl(int argc, char** argv) {
  CLI::App app("Print the live counters of a mounted tierfs filesystem as JSON, pause or resume its "
               "background engines, or control the fault devices of a lab mount (tierfs mount --fault).",
               "tierfs ctl");
  std::string mountpoint;
  std::vector<std::string> command;
  app.add_option("mountpoint", mountpoint, "where the filesystem is mounted")->required();
  app.add_option("command", command,
                 "pause|resume ENGINE... (reconcile, promote, copygc, all) | "
                 "fault MEMBER stall DURATION | unstall | error read|write|both START+LEN | clear | "
                 "powercut [SEED] | poweron | stats");
  app.footer("Without a command: the counters as one JSON object (devices[].fault for faulted members,\n"
             "engines.* for the background engines).\n"
             "e.g. tierfs ctl /mnt/t pause all; tierfs ctl /mnt/t fault hdd.b stall 30s");
  app.allow_extras(false);
  if (int rc = ParseCommandLine(app, "ctl", argc, argv); rc >= 0) return rc;
  const bool fault = !command.empty() && command[0] == "fault";
  const bool control = !command.empty() && (command[0] == "pause" || command[0] == "resume");
  if (!command.empty() && !fault && !control) {
    PrintError("ctl", "unknown command '" + command[0] + "' (pause, resume, fault)");
    return 2;
  }
  if (command.size() == 1) {
    PrintError("ctl", fault ? "fault: usage: fault MEMBER COMMAND (see --help)"
                            : command[0] + ": usage: " + command[0] + " ENGINE... (reconcile, promote, copygc, all)");
    return 2;
  }
  int fd = OpenRoot(mountpoint);
  if (fd < 0) return 1;
  std::vector<char> buf(fuse::kCtlMax, 0);
  // (The fault device gets the line after "fault"; the core the whole line.)
  std::string line;
  for (size_t i = fault ? 1 : 0; i < command.size(); i++) line += (line.empty() ? "" : " ") + command[i];
  if (!command.empty() && line.size() + 1 > buf.size()) {
    close(fd);
    PrintError("ctl", command[0] + ": the command is too long");
    return 2;
  }
  if (!command.empty()) memcpy(buf.data(), line.c_str(), line.size() + 1);
  int n = ioctl(fd, command.empty() ? fuse::kCtlStats : fault ? fuse::kCtlFault : fuse::kCtlCommand, buf.data());
  const int err = errno;
  close(fd);
  if (n < 0) {
    if (fault && err == ENOTTY) {
      PrintError("ctl", mountpoint + ": not a tierfs mount with fault devices (or not a tierfs mount)");
      return 1;
    }
    PrintIoctlError(mountpoint, err);
    return 1;
  }
  if (command.empty()) {
    fwrite(buf.data(), 1, size_t(n), stdout);
    fputc('\n', stdout);
    return 0;
  }
  buf.back() = '\0';
  const std::string reply = buf.data();
  if (reply.rfind("error: ", 0) == 0) {
    PrintError("ctl", (fault ? "fault " + command[1] : command[0]) + ": " + reply.substr(7));
    // (The core's refusals are all of the line: "unknown engine" too.)
    const bool malformed = reply.rfind("error: usage:", 0) == 0 || reply.rfind("error: unknown command", 0) == 0 ||
                           (control && reply.rfind("error: unknown ", 0) == 0);
    return malformed ? 2 : 1;
  }
  printf("%s\n", reply.c_str());
  return 0;
}

}  // namespace tfs::tools
