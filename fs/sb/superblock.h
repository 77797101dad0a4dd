// Superblock: decoding, validation and writing of the per-device superblock, and
// the member-set check that mount and fsck run.
//
// The bytes on disk are hostile until proven otherwise: Decode() checks magic,
// version, checksum and then every field's range (member count, sizes, labels,
// layout of the journal inside the device) and returns kBadMagic,
// kBadVersion, kBadChecksum or kCorrupt with a Diag naming the field. Read() tries
// the primary copy and falls back to the backup. CheckMembers() refuses device sets
// that do not form exactly one complete filesystem.
//
// These functions do their own synchronous I/O with origin kSuperblock. They are
// for format, mount, unmount and fsck -- never for a foreground path.
#ifndef TFS_SB_SUPERBLOCK_H_
#define TFS_SB_SUPERBLOCK_H_

#include "platform/block_device.h"
#include "sb/format.h"
#include "util/diag.h"
#include "util/status.h"

namespace tfs::sb {

struct Member {
  u8 uuid[16];
  char label[kSbLabelLen];
  u64 size;
  u64 nbuckets;
  u64 journal_first_bucket;
  u32 journal_nbuckets;
  u8 durability;
  u8 data_allowed;
  u8 state;
};

struct Options {
  char foreground_target[kSbTargetLen];
  char background_target[kSbTargetLen];
  char promote_target[kSbTargetLen];
  char metadata_target[kSbTargetLen];
  u8 data_replicas;
  u8 metadata_replicas;
  ChecksumType checksum;
  CompressionType compression;
};

// The decoded superblock. Identical on every member except dev_idx.
struct Superblock {
  u8 fs_uuid[16];
  u64 seq;
  u16 dev_idx;
  u16 flags;
  u32 bucket_size;
  u32 btree_node_size;
  u32 block_size;
  u64 journal_seq;
  u64 roots_gen;  // newest durable btree roots gen at the last write (0: unknown)
  u32 lost_data_btrees;  // trees an unfinished fsck -y dropped damaged nodes of (format.h)
  u32 degraded_missing;  // members missing from the writable degraded mount that wrote this copy (format.h)
  Options options;
  u32 nr_members;
  Member members[kSbMaxMembers];

  bool clean() const { return (flags & kSbClean) != 0; }
  // Byte offset of bucket `b` on any member.
  u64 BucketOffset(u64 b) const { return kBucketsOffset + b * bucket_size; }
  // The bucket holding byte `offset` (~0 before the first bucket; callers check
  // the result against the member's bucket count).
  u64 BucketOf(u64 offset) const { return offset < kBucketsOffset ? ~u64(0) : (offset - kBucketsOffset) / bucket_size; }
};

// Encodes `sb` as the copy for member `dev_idx` into `out` (kSbSize bytes).
void Encode(const Superblock& sb, u16 dev_idx, void* out);
// Decodes and validates kSbSize bytes. `device_size`, when nonzero, is the real
// size of the device the copy was read from (the member entry may not exceed it).
Status Decode(const void* buf, u64 device_size, Superblock* out, Diag* diag = nullptr);

struct ReadResult {
  bool used_backup = false;  // the primary copy was unreadable or invalid
  Status primary_status;     // why the primary was rejected (Ok if it was used)
};

// Reads the superblock of one device: the primary copy, or the backup when the
// primary is missing, torn or corrupt. Fails if neither copy is valid; a device
// with no tierfs magic in either copy gets kBadMagic ("not a tierfs device").
Result<ReadResult> Read(BlockDevice& dev, Superblock* out, Diag* diag = nullptr);

// Reads and decodes one copy (kSbPrimaryOffset or kSbBackupOffset) without
// fallback, for fsck, which checks both.
Status ReadCopy(BlockDevice& dev, u64 offset, Superblock* out, Diag* diag = nullptr);

// Writes both copies to one device (primary, then backup, each with FUA), as the
// copy for member `dev_idx`.
Status Write(BlockDevice& dev, const Superblock& sb, u16 dev_idx);

// Mount-time check of a set of devices given by the user, in any order. `sbs[i]`
// was read from the i-th device. On success `order[m]` is the index into `sbs` of
// member m. Refuses: devices of different filesystems, a device that is not the
// member its copy says, the same member twice, members missing (naming them).
// With `missing_out`, members missing are not refused (unless all are):
// *missing_out gets a bit per missing member (their order[] entries ~0u) and
// `diag` names them ("filesystem has 3 members; missing: ssd.c").
Status CheckMembers(const Superblock* sbs, u32 count, u32* order, Diag* diag = nullptr, u32* missing_out = nullptr);

// 16 random bytes with the RFC 4122 version-4 bits set.
void NewUuid(u8 out[16]);
// Formats a uuid as 36 characters plus NUL into `out` (37 bytes).
void UuidToString(const u8 uuid[16], char out[37]);

}  // namespace tfs::sb

#endif  // TFS_SB_SUPERBLOCK_H_
