// On-disk allocation state (documented in docs/format/alloc.md).
//
// Every bucket's state is one key of the alloc btree (btree::kBtreeAlloc),
// which lives on the metadata target like every btree: key (member index,
// bucket), value AllocRecord. An absent key means the state the layout fixes
// (the journal ring's buckets: journal; any other: free), gen 0, version 0.
// Each change bumps the bucket's version; the btree keeps, for alloc keys, the
// value with the higher version (the merge rule, btree/tree.cc ApplyKey), so
// two changes of a bucket may reach the journal in either order.
#ifndef TFS_ALLOC_FORMAT_H_
#define TFS_ALLOC_FORMAT_H_

#include "platform/types.h"
#include "util/endian.h"

namespace tfs::alloc {

enum class BucketState : u8 {
  kFree = 0,
  kSb = 1,       // a superblock copy (none in this layout: they lie before bucket 0)
  kJournal = 2,  // journal ring
  kBtree = 3,
  kUser = 4,
  kCached = 5,   // a clean copy of data whose authoritative copy is elsewhere
};
inline constexpr int kBucketStateCount = 6;
const char* BucketStateName(BucketState s);

struct AllocRecord {  // 24 bytes, the value of a kBtreeAlloc key
  u8 gen;             // bumped when the bucket is freed: stale pointers are detectable
  u8 oldest_gen;      // oldest gen a pointer into it may carry: gen - oldest_gen <= kGenGuard (mod 256)
  u8 state;           // BucketState
  u8 reserved0;       // 0
  Le32 live_sectors;  // user: logical 512-byte sectors of the extents' pointers not cached (kCountFactor)
  Le32 cached_sectors;  // user: logical 512-byte sectors of their current cached pointers
  Le32 reserved1;     // 0
  Le64 version;       // bumped on every change of the bucket; < kRecordVersionLimit
};
static_assert(sizeof(AllocRecord) == 24, "alloc record");
static_assert(__builtin_offsetof(AllocRecord, version) == 16, "alloc record layout");

// The generation guard (docs/format/alloc.md, "Generations"): a pointer is
// current iff its gen is its bucket's, and a stale cached pointer stays in
// its extent until something rewrites it -- so after 256 frees of its
// bucket it would look current again. A record's oldest_gen is the oldest
// generation a pointer into the bucket may still carry; a free bucket whose
// gen is kGenGuard generations past it (mod 256) is not handed out again
// until a generation pass (fsck -y today) has dropped the stale pointers
// and raised oldest_gen (bcachefs's BUCKET_GC_GEN_MAX). A record further
// apart is corrupt.
inline constexpr u8 kGenGuard = 96;
// How many generations gen is past oldest (mod 256).
inline u8 GenGap(u8 gen, u8 oldest) { return u8(gen - oldest); }

// How far a user (or cached) bucket's counts may exceed its own sectors:
// they count logical sectors (data::PtrSectors: the file blocks of every
// counted pointer, compressed or not), and a compressed blob holds at most
// data::kMaxCompressedBlocks (16) file blocks in at least one disk block.
// Every other state counts at most its own sectors (btree buckets: 0 in
// practice, docs/format/alloc.md).
inline constexpr u32 kCountFactor = 16;

// Versions a valid record may carry: below 2^48 (no count of changes gets
// there; a hostile huge version must not make every later change look
// older). Far below what the merge rule still calls plausible (2^63): a
// change of a valid record, or fsck's rebuild past a plausible bad one, is
// never implausible. A read-write mount starts every bucket at or above
// kRecordVersionRebase again (a whiteout, then a record of version 1), so
// that no run of changes from a valid record reaches the limit.
inline constexpr u64 kRecordVersionLimit = u64(1) << 48;
inline constexpr u64 kRecordVersionRebase = u64(1) << 47;
inline constexpr u64 kRecordVersionPlausible = u64(1) << 63;

// Whether `len` bytes at `val` could be a record, as far as can be told
// without the member's geometry (size, state, reserved bytes, version below
// kRecordVersionPlausible), and its version. The btree's merge rule uses it:
// an implausible value never blocks its replacement.
inline bool RecordPlausible(const void* val, u32 len, u64* version) {
  if (len != sizeof(AllocRecord)) return false;
  AllocRecord r;
  __builtin_memcpy(&r, val, sizeof(r));
  if (r.state >= kBucketStateCount || r.reserved0 != 0 || r.reserved1.get() != 0) return false;
  const u64 v = r.version.get();
  if (v >= kRecordVersionPlausible) return false;
  *version = v;
  return true;
}

// Accounting keys (docs/format/alloc.md, "Accounting keys"): what the
// bucket records cannot give, kept as keys of the alloc btree above every
// member's range -- (kBtreeAlloc, kAcctInodeBase + kind, offset), value
// AcctRecord. Each holds a total itself (not a delta): the data path's
// commit hook computes it under the btree's commit_mu, in journal order, so
// the last value replayed is the total and applying one twice is harmless.
// The btree's merge rule (newest version wins) is for bucket records only:
// these keys take the last value written.
inline constexpr u64 kAcctInodeBase = u64(1) << 32;
inline bool IsAcctKey(u64 inode) { return inode >= kAcctInodeBase; }

enum class AcctKind : u32 {
  // offset 0: the filesystem's unwritten (fallocate) blocks, in 512-byte
  // sectors.
  kReserved = 0,
  // offset: a member mask (bit m: member m), 1..kAcctMaxMembers bits: the
  // logical sectors of extents whose counted non-cached pointers are on
  // exactly those members (bcachefs's replicas entries).
  kReplicas = 1,
  // offset 0: the inodes in use -- posix's inode records (kBtreeInodes keys
  // (ino >= 1, 0)), changed by the transactions that create and free
  // them; the value is a count, not sectors (format version 6).
  kInodes = 2,
};
inline constexpr u32 kAcctKinds = 3;
inline constexpr u32 kAcctMaxMembers = 4;  // bits of a kReplicas mask: an extent's pointers (data::kMaxPtrs)

struct AcctRecord {  // 16 bytes, the value of an accounting key
  Le64 sectors;      // the total (kInodes: a count)
  u8 kind;           // AcctKind, the key's own: a value at another kind's key is corrupt
  u8 reserved[7];    // 0
};
static_assert(sizeof(AcctRecord) == 16, "accounting record");

}  // namespace tfs::alloc

#endif  // TFS_ALLOC_FORMAT_H_
