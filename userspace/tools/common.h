// Shared pieces of the tierfs command line: opening devices with clear errors,
// size parsing, and the one-line error convention (`tierfs CMD: what: why`, exit 1).
#ifndef TFS_USERSPACE_TOOLS_COMMON_H_
#define TFS_USERSPACE_TOOLS_COMMON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "platform/block_device.h"
#include "userspace/platform/uring_device.h"

namespace tfs::tools {

// Prints "tierfs <cmd>: <message>" to stderr.
void PrintError(const std::string& cmd, const std::string& message);

// "65536", "64K", "64KiB", "1M", "1MiB", "2G" -> bytes; nullopt if malformed.
std::optional<uint64_t> ParseSize(const std::string& text);

// Opens every path; on failure prints one line naming the path and returns empty.
std::vector<std::unique_ptr<userspace::UringDevice>> OpenDevices(const std::string& cmd,
                                                                 const std::vector<std::string>& paths,
                                                                 bool read_only);
std::vector<BlockDevice*> Raw(const std::vector<std::unique_ptr<userspace::UringDevice>>& devs);

// A uuid as text.
std::string UuidString(const uint8_t uuid[16]);

int CmdFormat(int argc, char** argv);
int CmdMount(int argc, char** argv);
int CmdMountHelper(int argc, char** argv);  // mount.fuse.tierfs
int CmdCtl(int argc, char** argv);
int CmdShow(int argc, char** argv);
int CmdFsck(int argc, char** argv);
int CmdBench(int argc, char** argv);
// The benchmarks behind `tierfs bench NAME` (argv[0] is NAME).
int BenchJournal(int argc, char** argv);
int BenchBtree(int argc, char** argv);

}  // namespace tfs::tools

#endif  // TFS_USERSPACE_TOOLS_COMMON_H_
