// tierfs bench: dispatches to one micro-benchmark. Each benchmark parses its own
// options (`tierfs bench NAME --help`) and lives in bench_NAME.cc.
#include <cstdio>
#include <cstring>
#include <string>

#include "userspace/tools/common.h"

namespace tfs::tools {

namespace {

const char kBenchUsage[] =
    "usage: tierfs bench BENCHMARK [options]\n"
    "\n"
    "benchmarks:\n"
    "  journal  journal commits/s and commit latency, no-flush and flush\n"
    "  btree    btree inserts, lookups, deletes and a mixed load on a fresh filesystem\n"
    "  mount    mount time by stage as the data grows, clean and after a cut\n"
    "\n"
    "'tierfs bench BENCHMARK --help' describes each one.\n";

}  // namespace

int CmdBench(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(kBenchUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  if (name == "journal") return BenchJournal(argc - 1, argv + 1);
  if (name == "btree") return BenchBtree(argc - 1, argv + 1);
  if (name == "mount") return BenchMount(argc - 1, argv + 1);
  PrintError("bench", "unknown benchmark '" + name + "' (known: journal, btree, mount)");
  return 2;
}

}  // namespace tfs::tools
