// tierfs: the command line for the tiered filesystem. One binary, subcommands;
// installed names mkfs.tierfs (= tierfs format), fsck.tierfs (= tierfs fsck) and
// mount.fuse.tierfs (mount(8)'s helper for `mount -t fuse.tierfs`)
// dispatch on argv[0].
#include <cstdio>
#include <cstring>
#include <string>

#include "userspace/tools/common.h"

namespace {

const char kUsage[] =
    "usage: tierfs COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  format   create a filesystem on one or more devices (also: mkfs.tierfs)\n"
    "  mount    mount a filesystem through FUSE (also: mount.fuse.tierfs, for mount -t)\n"
    "  ctl      live counters of a mounted filesystem (JSON)\n"
    "  setopt   set per-file or per-directory options (targets, replicas, compression)\n"
    "  getopt   print a file's or directory's options\n"
    "  show     print the superblock, members and per-device usage\n"
    "  fsck     check (-n) or repair (-y) a filesystem (also: fsck.tierfs)\n"
    "  bench    micro-benchmarks (bench journal, bench btree, bench mount)\n"
    "\n"
    "'tierfs COMMAND --help' describes each command.\n";

std::string BaseName(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = BaseName(argv[0]);
  if (self == "mkfs.tierfs") return tfs::tools::CmdFormat(argc, argv);
  if (self == "fsck.tierfs") return tfs::tools::CmdFsck(argc, argv);
  if (self == "mount.fuse.tierfs") return tfs::tools::CmdMountHelper(argc, argv);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "format" || cmd == "mkfs") return tfs::tools::CmdFormat(argc - 1, argv + 1);
  if (cmd == "mount") return tfs::tools::CmdMount(argc - 1, argv + 1);
  if (cmd == "ctl") return tfs::tools::CmdCtl(argc - 1, argv + 1);
  if (cmd == "setopt") return tfs::tools::CmdSetopt(argc - 1, argv + 1);
  if (cmd == "getopt") return tfs::tools::CmdGetopt(argc - 1, argv + 1);
  if (cmd == "show") return tfs::tools::CmdShow(argc - 1, argv + 1);
  if (cmd == "fsck") return tfs::tools::CmdFsck(argc - 1, argv + 1);
  if (cmd == "bench") return tfs::tools::CmdBench(argc - 1, argv + 1);
  fprintf(stderr, "tierfs: unknown command '%s' (try 'tierfs --help')\n", cmd.c_str());
  return 2;
}
