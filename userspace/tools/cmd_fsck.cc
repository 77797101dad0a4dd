// tierfs fsck / fsck.tierfs: check (-n, the default) or repair (-y). Exit codes
// follow fsck(8): 0 clean, 1 errors corrected, 4 errors left, 8 operational error.
// A mounted set is refused (8); members still locked by a daemon finishing after
// its unmount are waited for (mount_table.h).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "fsck/fsck.h"
#include "userspace/tools/common.h"
#include "userspace/tools/members.h"
#include "userspace/tools/mount_table.h"

namespace tfs::tools {

int CmdFsck(int argc, char** argv) {
  CLI::App app("Check a tierfs filesystem; -y repairs what it can.", "tierfs fsck");
  std::vector<std::string> devices;
  bool no = false, yes = false;
  app.add_option("devices", devices, "every member device of the filesystem")->required();
  app.add_flag("-n", no, "check only, change nothing (default)");
  app.add_flag("-y", yes, "repair");
  FaultArgs fault_args;
  AddFaultOptions(&app, &fault_args);
  app.footer("exit codes: 0 clean, 1 errors corrected, 4 errors left uncorrected, 8 operational error, "
             "16 usage error");
  if (int rc = ParseCommandLine(app, "fsck", argc, argv, fsck::kExitUsage); rc >= 0) return rc;
  if (no && yes) {
    PrintError("fsck", "-n and -y exclude each other (see 'tierfs fsck --help')");
    return fsck::kExitUsage;
  }
  std::vector<FaultSpec> faults;
  if (!ParseFaults("fsck", fault_args, &faults)) return fsck::kExitUsage;
  // Not while mounted; after an unmount, wait for the daemon to finish writing.
  MemberLocks locks;
  if (!locks.Take("fsck", devices, yes ? MemberLocks::Mode::kExclusive : MemberLocks::Mode::kShared)) {
    return fsck::kExitOperational;
  }
  Members members;
  if (!members.Open("fsck", devices, /*read_only=*/!yes, faults)) return fsck::kExitOperational;
  std::vector<BlockDevice*> raw = members.Raw();
  fsck::Options o;
  o.repair = yes;
  fsck::Report r = fsck::Check(raw.data(), uint32_t(raw.size()), o,
                               [](void*, const char* line) { printf("%s\n", line); }, nullptr);
  printf("fsck: %u error(s), %u repaired, %u note(s): %s\n", r.errors, r.repaired, r.notes,
         r.exit_code == fsck::kExitClean       ? "clean"
         : r.exit_code == fsck::kExitRepaired  ? "repaired"
         : r.exit_code == fsck::kExitUncorrected ? "errors left uncorrected"
                                                 : "could not complete");
  return r.exit_code;
}

}  // namespace tfs::tools
