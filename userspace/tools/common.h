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

namespace CLI {
class App;
}

#include "userspace/platform/uring_device.h"

namespace tfs::tools {

// Prints "tierfs <cmd>: <message>" to stderr.
void PrintError(const std::string& cmd, const std::string& message);

// Parses a command line with CLI11. Returns -1 when the command should go on;
// otherwise the exit code: 0 after printing --help to stdout, or `usage_code`
// after one line "tierfs <cmd>: <what is wrong> (see 'tierfs <cmd> --help')"
// (CLI11's own report is two lines with its private exit codes 104-114).
int ParseCommandLine(CLI::App& app, const std::string& cmd, int argc, char** argv, int usage_code = 2);
int ParseCommandLine(CLI::App& app, const std::string& cmd, std::vector<std::string>& args_reversed,
                     int usage_code = 2);

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
int CmdSetopt(int argc, char** argv);
int CmdGetopt(int argc, char** argv);
int CmdShow(int argc, char** argv);
int CmdFsck(int argc, char** argv);
int CmdBench(int argc, char** argv);
// The benchmarks behind `tierfs bench NAME` (argv[0] is NAME).
int BenchJournal(int argc, char** argv);
int BenchBtree(int argc, char** argv);
int BenchMount(int argc, char** argv);

}  // namespace tfs::tools

#endif  // TFS_USERSPACE_TOOLS_COMMON_H_
