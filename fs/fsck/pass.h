// fsck's passes and what they share: how findings are reported (Ctx) and the
// passes that live in their own files. Not part of fsck's API (fsck.h); used
// by fsck.cc, which runs the passes in order on one open store.
//
// Thread safety: none; fsck runs its passes one after another on one thread.
#ifndef TFS_FSCK_PASS_H_
#define TFS_FSCK_PASS_H_

#include "fsck/fsck.h"
#include "platform/platform.h"
#include "store/store.h"

namespace tfs::fsck {

// Where findings go: one line each to emit, counted in *report by the pass.
struct Ctx {
  EmitFn emit;
  void* ctx;
  Report* report;
  // The allocation state is known to be wrong (bad records, a dropped node
  // of the alloc tree; not rebuilt): the passes do not compare buckets with it.
  bool alloc_stale = false;
  // sb::kSbAcctRepair as the open found it (an earlier -y cut short), and
  // whether this -y has set it (BeginCountRepair).
  bool acct_cut_short = false;
  bool acct_begun = false;
  bool acct_flag_failed = false;  // a state repair found the flag unwritable (said once)

  void Line(const char* fmt, ...) TFS_PRINTF(2, 3) {
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    VLine(fmt, ap);
    __builtin_va_end(ap);
  }
  void VLine(const char* fmt, __builtin_va_list ap) {
    char buf[320];
    tfs_plat_vsnprintf(buf, sizeof(buf), fmt, ap);
    if (emit != nullptr) emit(ctx, buf);
  }
};

// The namespace and file data (namespace.cc), on a store opened writable
// exactly when opt.repair is set. False when it could not run to the end (a
// read or a repair's write failed).
// `had`: the superblock's features (posix::kSbFeatures bits) before the
// open. When it returns true, `use` says what of them the namespace uses.
struct FeatureUse {
  bool in_use = false;    // chunked xattr values or kInodeFlagCaps (as the repairs left them)
  bool upgraded = false;  // -y flagged capabilities of a filesystem without kSbCapsFlagged
  bool extent_policy = false;  // an extent records a nonzero policy (sb::kSbExtentPolicy; as the repairs left them)
};
bool CheckNamespace(store::Store& e, const Options& opt, Ctx& c, u16 had, FeatureUse* use);

// The backpointers tree against the extents (backpointers.cc), after the
// namespace pass; -y rewrites it from the extents. False when it could not
// run to the end.
bool CheckBackpointerTree(store::Store& e, const Options& opt, Ctx& c);

// The buckets' live and cached counts against a recount of the extents
// (accounting.cc), after the data pass, so it counts what that pass's
// repairs left; -y sets them (sb::kSbAcctRepair durably set before the
// first repair of this pass or the data pass, BeginCountRepair; cleared
// when this pass ends). False when it could not run
// to the end (the recount or a repair's write failed, out of memory).
bool CheckBucketCounts(store::Store& e, const Options& opt, Ctx& c);

// -y, before its first repair that changes the counts or totals or what
// they count -- a bucket's state set (CheckAllocator, RepairBtreeBuckets:
// its counts zeroed), any repair commit of the namespace and data pass
// (extents edited without the data path, inodes made or deleted without
// the inode count), a count or total set (the accounting pass): records
// sb::kSbAcctRepair durably, once (Store::BeginAcctRepair; a failed write
// is tried again by the next call). A cut from then until the accounting
// pass has ended leaves the flag, and no read-write mount runs on counts
// the repairs made wrong (the pass clears it). On failure nothing may be
// repaired.
Status BeginCountRepair(store::Store& e, Ctx& c);

}  // namespace tfs::fsck

#endif  // TFS_FSCK_PASS_H_
