// fsck: check (and optionally repair) a filesystem's devices offline.
//
// What is checked so far (the filesystem issues add more):
//  - each device's two superblock copies are valid and identical (repair: rewrite
//    both from the newest valid copy);
//  - the devices form exactly one complete filesystem (not repairable here);
//  - the journal: every entry in the rings validates; durable entries are not cut
//    off by a gap (bad headers after an unclean shutdown are reported, not errors);
//  - the allocation state, after replay, agrees with the layout: the table and
//    journal buckets are marked as such and no other bucket is; live sector counts
//    fit their buckets (repair: correct the states and write the tables);
//  - the btrees: the roots block is readable; every node the roots reach reads and
//    verifies (checksums, identity = the parent's pointer, interior structure) --
//    a bad node is named (tree, level, member, offset, what is wrong), left
//    uncorrected, and its siblings are still walked; keys are ordered and inside
//    their node's range, and each child covers (previous key + 1 .. its key); no
//    node slot is referenced twice; every slot is in a bucket marked btree and
//    every btree bucket holds a referenced node (repair: free such a bucket, or
//    mark one holding nodes as btree, and write the tables); a line of statistics
//    per tree (nodes, leaves, keys, depth). With -y the btree pass runs on a
//    read-only open before the writable one, since a writable mount reconciles
//    btree buckets itself. Every open drops a damaged node (in memory with -n)
//    and recovers its range from the copies a node scan finds, so the passes
//    after it run over the whole tree; -y writes the result, and rebuilds
//    every tree from the scan when the roots block is lost (docs/design/
//    fsck.md, "Damaged nodes and lost roots").
//  - the namespace (posix/; fsck/namespace.cc, docs/design/fsck.md): every
//    inode record parses; every directory entry parses, names an existing inode
//    of its type and is reachable from its home slot; no tombstone ends a probe
//    chain; link counts match the entries (directories: 2 + subdirectories);
//    no name is in a directory twice; every directory but the root has one
//    name, its parent pointer agrees, and it reaches the root; symlink targets
//    are whole; orphan keys name unlinked
//    inodes no entry names (an orphan is a note: the next mount frees it);
//    xattrs belong to inodes, and a chunked value has exactly its chunks (each
//    of its length, its crc right) and no chunk key is left without a value;
//    an inode has at most 128 xattr table keys, and kInodeFlagCaps exactly
//    when it has a security.capability xattr (without kSbCapsFlagged an
//    unflagged one is an older build's: a note); the superblock's
//    kSbXattrChunks is set if anything needs it (-y clears it when nothing
//    does). Inode numbers stay below 2^56 (btree::kInoLimit): keys past it
//    are deleted.
//    File data: extents parse, belong to regular files, record a policy
//    this filesystem can hold (else reset to unset; kSbExtentPolicy set
//    exactly when one records a policy, as kSbXattrChunks),
//    do not overlap, and every pointer (copy) points inside a user bucket of
//    its generation (a bad one is dropped if a good copy is left -- a good
//    cached one promoted if no other is -- else the extent is deleted; a
//    cached pointer of another generation is a stale cached copy: a note,
//    dropped by -y, not an error); each
//    inode's sector count is what its extents hold and its size covers them; a
//    user bucket holding no extent is a note (left by a crash; the next mount
//    frees it). Repair: one btree transaction per finding -- bad keys deleted,
//    entries removed, retyped or moved back into their chain, counts, parents
//    and sizes set, what no entry names reattached as /lost+found/#<ino>,
//    of overlapping extents the one ending later kept, a damaged chunked
//    xattr removed with its chunks and a stray chunk deleted, xattr table
//    keys past 128 deleted, the capability flag set or cleared. A summary line
//    counts inodes, directories, entries, xattrs and extents.
//  - the backpointers (fsck/backpointers.cc): the tree holds exactly the
//    backpointer every pointer of every extent implies (data/backpointer.h:
//    none for a cached copy);
//    -y sets the missing and wrong ones from the extents and deletes the ones
//    no extent implies. Blocks two pointers claim are a note.
//  - the space accounting (fsck/accounting.cc): each user bucket's live and
//    cached counts in its record are a recount of the extents' (the data
//    path's rule, data::CountExtents) and no other bucket's record counts
//    anything; -y sets them (sb::kSbAcctRepair set durably before the first
//    repair that changes what they count -- the data pass's extent edits
//    included -- cleared when this pass ends: a read-write mount refuses
//    while it is set).
//
// Results follow fsck(8): 0 clean, 1 errors corrected, 4 errors left uncorrected,
// 8 operational error (a device could not be read, is not a tierfs member (no
// superblock), a member is missing or foreign, out of memory); 16 (the command
// line tools): usage error.
#ifndef TFS_FSCK_FSCK_H_
#define TFS_FSCK_FSCK_H_

#include "platform/block_device.h"
#include "util/status.h"

namespace tfs::fsck {

inline constexpr int kExitClean = 0;
inline constexpr int kExitRepaired = 1;
inline constexpr int kExitUncorrected = 4;
inline constexpr int kExitOperational = 8;
inline constexpr int kExitUsage = 16;  // the command line (tools), as fsck(8)

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
