// On-disk allocation state (documented in docs/format/alloc.md).
//
// Interim structure until the alloc btree exists: each member keeps a table of
// per-bucket records in its first buckets, in two slots (A at the table's start, B
// right after it) written alternately, so a torn checkpoint leaves the other slot
// intact; the valid slot with the higher checkpoint number wins. Changes between
// checkpoints are journaled as AllocKeys; each carries the bucket's change version,
// so replay applies a key only if it is newer than the table's record, in any order.
#ifndef TFS_ALLOC_FORMAT_H_
#define TFS_ALLOC_FORMAT_H_

#include "platform/types.h"
#include "util/endian.h"

namespace tfs::alloc {

inline constexpr u64 kAllocMagic = 0x434f4c4c41534654ull;  // "TFSALLOC" as LE bytes
inline constexpr u16 kAllocVersion = 1;
inline constexpr u32 kAllocBlock = 4096;

enum class BucketState : u8 {
  kFree = 0,
  kMeta = 1,     // allocation table
  kJournal = 2,  // journal ring
  kBtree = 3,
  kUser = 4,
  kCached = 5,   // a clean copy of data whose authoritative copy is elsewhere
};
inline constexpr int kBucketStateCount = 6;
const char* BucketStateName(BucketState s);

struct BucketFormat {  // 16 bytes
  u8 gen;              // bumped when the bucket is freed: stale pointers are detectable
  u8 state;            // BucketState
  Le16 reserved0;
  Le32 live_sectors;   // 512-byte sectors of live data
  Le32 version;        // bumped on every change; orders journal keys
  Le32 reserved1;
};
static_assert(sizeof(BucketFormat) == 16, "bucket record");

struct TableHeader {  // one 4 KiB block, then nbuckets BucketFormat records
  Le64 magic;
  Le32 csum;          // CRC-32C of header (csum as zero) and all records
  Le16 version;
  Le16 dev_idx;
  u8 fs_uuid[16];
  Le64 checkpoint;    // checkpoint number: the valid slot with the higher one wins
  Le64 journal_seq;   // journal sequence at the checkpoint (informational)
  Le64 nbuckets;
  // CRC-32C of the 56 bytes above with csum as zero (0 in tables of older
  // builds): the header's own check, so that a slot whose records a crash cut
  // short (the header is written last, in its own block) still says which
  // checkpoint it held.
  Le32 head_csum;
  u8 reserved[kAllocBlock - 60];
};
static_assert(sizeof(TableHeader) == kAllocBlock, "table header");

// The journal key for one bucket change (journal::kKeyAlloc).
struct AllocKey {  // 24 bytes
  Le16 dev;
  u8 gen;
  u8 state;
  Le32 live_sectors;
  Le64 bucket;
  Le32 version;
  Le32 reserved;
};
static_assert(sizeof(AllocKey) == 24, "alloc key");

// Bytes of one table slot for a member with `nbuckets` buckets (block-aligned).
inline constexpr u64 TableSlotBytes(u64 nbuckets) {
  return (sizeof(TableHeader) + nbuckets * sizeof(BucketFormat) + kAllocBlock - 1) / kAllocBlock *
         kAllocBlock;
}
// Buckets the two slots need.
inline constexpr u64 TableBuckets(u64 nbuckets, u64 bucket_size) {
  return (2 * TableSlotBytes(nbuckets) + bucket_size - 1) / bucket_size;
}

}  // namespace tfs::alloc

#endif  // TFS_ALLOC_FORMAT_H_
