// On-disk superblock and device layout (documented in docs/format/superblock.md).
//
// Every member device starts with the same layout:
//
//   [0, 4 KiB)                 untouched (partition tables, boot code)
//   [4 KiB, 12 KiB)            superblock, primary copy
//   [512 KiB, 520 KiB)         superblock, backup copy
//   [1 MiB, ...)               buckets of bucket_size bytes, bucket 0 first:
//                              the journal ring on members that carry one
//                              (journal_first_bucket, journal_nbuckets), and
//                              everything else. Allocation state is not on the
//                              members: it is the alloc btree's (alloc/format.h).
//
// The two copies are identical; dev_idx records which member a copy lives on. All
// integers little-endian; every struct has a fixed size checked by static_assert. The checksum is CRC-32C of the whole kSbSize
// bytes with the csum field zeroed.
#ifndef TFS_SB_FORMAT_H_
#define TFS_SB_FORMAT_H_

#include "platform/types.h"
#include "util/endian.h"

namespace tfs::sb {

inline constexpr u64 kSbMagic = 0x3130734672656954ull;  // "TierFs01" read as LE bytes
// 7: btree node pointers with copies (btree/format.h NodePtrFormat, 72
// bytes; the roots block's version 2). 6: the inode count as an accounting
// key (alloc/format.h, kInodes). 5:
// the accounting keys (reserved, replicas). 4: backpointers
// (docs/format/backpointers.md) beside the alloc btree. 3: allocation state
// in the alloc btree instead of a table on every member
// (docs/format/alloc.md), no backpointers. 2: extents with pointer lists
// (data/extent.h, docs/design/copies.md). Versions 1 to 6 were never
// released: refused in one line (superblock.cc), never migrated.
inline constexpr u16 kSbVersion = 7;
inline constexpr u32 kSbSize = 8192;
inline constexpr u64 kSbPrimaryOffset = 4096;
inline constexpr u64 kSbBackupOffset = 512 * 1024;
inline constexpr u64 kBucketsOffset = 1024 * 1024;  // where bucket 0 begins
inline constexpr u32 kSbMaxMembers = 32;
inline constexpr u32 kSbLabelLen = 32;   // including NUL
inline constexpr u32 kSbTargetLen = 32;  // including NUL

// Member flags: which kinds of data a member accepts.
inline constexpr u8 kDataJournal = 1 << 0;
inline constexpr u8 kDataBtree = 1 << 1;
inline constexpr u8 kDataUser = 1 << 2;
inline constexpr u8 kDataAll = kDataJournal | kDataBtree | kDataUser;

// Superblock flags.
inline constexpr u16 kSbClean = 1 << 0;  // unmounted cleanly: no journal replay needed
// Set exactly when lost_data_btrees is nonzero (Encode does it): builds that
// do not know the field reject an unknown flag and so refuse the filesystem
// rather than mount it and zero the field (losing what fsck must recreate).
inline constexpr u16 kSbLostData = 1 << 1;
// An incompatible feature: the xattrs btree may hold xattr values kept in
// chunk keys, and inodes the kInodeFlagCaps bit (posix/format.h,
// docs/format/inodes-extents.md). posix's read-write mount records it
// (store::AddFeatures; fsck -y through store::OpenOptions::features) before
// anything of either is written; builds before it reject the unknown bit and
// refuse the filesystem (rather than report those keys and inodes as corrupt
// and have an older fsck delete them). fsck -y clears it again when nothing
// needs it (the downgrade path).
inline constexpr u16 kSbXattrChunks = 1 << 2;
// Every inode with a security.capability xattr has kInodeFlagCaps: set after
// the mount that brought an older build's filesystem up to the flag has
// flagged them all (posix::Filesystem::FlagCapsInodes; kSbXattrChunks came
// first). Until then a mount redoes that (a cut in between leaves some
// flagged, some not: not corruption).
inline constexpr u16 kSbCapsFlagged = 1 << 3;
// An incompatible feature: extents may record a nonzero policy in their
// header's bytes 8..15 (data/extent.h, data/policy.h), which builds before
// it refuse as corrupt (and their fsck would delete: data lost). posix's
// read-write mount records it before it writes an extent; fsck -y's open
// too, and fsck -y clears it when no extent has a policy (the downgrade
// path).
inline constexpr u16 kSbExtentPolicy = 1 << 5;
// The incompatible feature bits (what OpenOptions::features may name).
inline constexpr u16 kSbFeatureFlags = kSbXattrChunks | kSbCapsFlagged | kSbExtentPolicy;
// A repair of the space accounting (fsck -y's accounting pass: the buckets'
// counts set from the extents) is under way: set durably before its first
// repair, cleared by the unmount of the fsck run whose pass finished (after
// the repaired records are checkpointed). A read-write mount refuses while it
// is set (the counts may be half repaired: some buckets' records set, others
// not); fsck -y finishes the repair. Builds before it reject the unknown bit.
inline constexpr u16 kSbAcctRepair = 1 << 4;
inline constexpr u16 kSbFlagsKnown = kSbClean | kSbLostData | kSbFeatureFlags | kSbAcctRepair;

enum class ChecksumType : u8 { kNone = 0, kCrc32c = 1 };
enum class CompressionType : u8 { kNone = 0, kZstd = 1 };

struct MemberFormat {         // 128 bytes
  u8 uuid[16];
  char label[kSbLabelLen];    // NUL-terminated, dev::ValidateLabel rules
  Le64 size;                  // bytes usable on the device
  Le64 nbuckets;              // buckets starting at kBucketsOffset
  Le64 journal_first_bucket;  // journal ring: [first, first + nbuckets)
  Le32 journal_nbuckets;      // 0 on members without a journal
  Le32 reserved_table;        // 0 (version 2: the allocation table's buckets)
  u8 durability;              // copies this member counts as (0 = cache only)
  u8 data_allowed;            // kData* bits
  u8 state;                   // 0 = read-write (others reserved)
  u8 reserved0[5];
  Le64 reserved_checkpoint;   // 0 (version 2: the newest durable table checkpoint)
  u8 reserved1[32];
};
static_assert(sizeof(MemberFormat) == 128, "member entry size");

struct SuperblockFormat {  // kSbSize bytes
  Le64 magic;
  Le32 csum;
  Le16 version;
  Le16 nr_members;
  u8 fs_uuid[16];
  Le64 seq;               // bumped on every superblock write; newest wins
  Le16 dev_idx;           // the member this copy is on
  Le16 flags;             // kSb* flags
  Le32 bucket_size;       // bytes, power of two, kMinBucket..kMaxBucket
  Le32 btree_node_size;   // bytes, power of two, 4 KiB..1 MiB
  Le32 block_size;        // filesystem block size (4096)
  Le64 journal_seq;       // at clean unmount: the next journal sequence number
  char foreground_target[kSbTargetLen];
  char background_target[kSbTargetLen];
  char promote_target[kSbTargetLen];
  char metadata_target[kSbTargetLen];
  u8 data_replicas;
  u8 metadata_replicas;
  u8 checksum_type;       // ChecksumType
  u8 compression_type;    // CompressionType
  // The btree roots block's newest durable gen when this copy was written
  // (format, mount, unmount; 0: unknown): the roots mount uses may not be older.
  Le64 roots_gen;
  // Bits (1 << btree id) of the trees whose damaged nodes an fsck -y dropped
  // and whose repair has not finished (0: none). Set durably before any tree
  // without those nodes is written; cleared by the unmount of the fsck run that
  // finished the namespace repair. Read-write mounts refuse while it is set.
  Le32 lost_data_btrees;
  // The members missing from the writable degraded mount (-o degraded) that
  // wrote this copy (bit m: member m; 0: a mount with every member). Two
  // members each written without the other have diverged: refused
  // together (docs/format/superblock.md).
  Le32 degraded_missing;
  u8 reserved[1024 - 212];
  MemberFormat members[kSbMaxMembers];
  u8 tail[kSbSize - 1024 - kSbMaxMembers * sizeof(MemberFormat)];
};
static_assert(sizeof(SuperblockFormat) == kSbSize, "superblock size");
static_assert(__builtin_offsetof(SuperblockFormat, roots_gen) == 196, "header layout");
static_assert(__builtin_offsetof(SuperblockFormat, lost_data_btrees) == 204, "header layout");
static_assert(__builtin_offsetof(SuperblockFormat, degraded_missing) == 208, "header layout");
static_assert(__builtin_offsetof(SuperblockFormat, reserved) == 212, "header layout");
static_assert(__builtin_offsetof(SuperblockFormat, members) == 1024, "member table offset");

inline constexpr u32 kMinBucket = 64 * 1024;
inline constexpr u32 kMaxBucket = 64 * 1024 * 1024;
inline constexpr u32 kMinBtreeNode = 4096;
inline constexpr u32 kMaxBtreeNode = 1024 * 1024;

}  // namespace tfs::sb

#endif  // TFS_SB_FORMAT_H_
