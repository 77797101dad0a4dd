// fsck: check (and optionally repair) a filesystem's devices offline.
//
// What is checked so far (the btree and filesystem issues add more):
//  - each device's two superblock copies are valid and identical (repair: rewrite
//    both from the newest valid copy);
//  - the devices form exactly one complete filesystem (not repairable here);
//  - the journal: every entry in the rings validates; durable entries are not cut
//    off by a gap (bad headers after an unclean shutdown are reported, not errors);
//  - the allocation state, after replay, agrees with the layout: the table and
//    journal buckets are marked as such and no other bucket is; live sector counts
//    fit their buckets (repair: correct the states and write the tables).
//
// Results follow fsck(8): 0 clean, 1 errors corrected, 4 errors left uncorrected,
// 8 operational error (a device could not be read, out of memory).
#ifndef TFS_FSCK_FSCK_H_
#define TFS_FSCK_FSCK_H_

#include "platform/block_device.h"
#include "util/status.h"

namespace tfs::fsck {

inline constexpr int kExitClean = 0;
inline constexpr int kExitRepaired = 1;
inline constexpr int kExitUncorrected = 4;
inline constexpr int kExitOperational = 8;

struct Options {
  bool repair = false;  // -y; otherwise -n: nothing is written
};

struct Report {
  u32 errors = 0;    // problems found
  u32 repaired = 0;  // of which fixed
  u32 notes = 0;     // informational findings (unclean shutdown, torn entries)
  int exit_code = kExitClean;
};

// One line per finding, to `emit` (ctx passed through). `bdevs` in any order.
using EmitFn = void (*)(void* ctx, const char* line);
Report Check(BlockDevice* const* bdevs, u32 count, const Options& options, EmitFn emit, void* ctx);

}  // namespace tfs::fsck

#endif  // TFS_FSCK_FSCK_H_
