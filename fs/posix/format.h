// On-disk format of the filesystem's namespace: inodes and directory entries as
// btree keys (documented in docs/format/inodes-extents.md).
//
//   inode       kBtreeInodes  (ino, 0)        InodeFormat
//   link target kBtreeInodes  (ino, 1 + i)    a symlink's target, bytes
//                                             [2048 i, 2048 (i + 1)) (size: the inode's)
//   orphan      kBtreeInodes  (0, ino)        Le64 ino: unlinked while open; freed
//                                             at its last close or at the next mount
//   dirent      kBtreeDirents (dir, slot)     DirentFormat, then the name
//   xattr       kBtreeXattrs  (ino, slot)     DirentFormat, the name, the value
//                                             (type kXattrValue), or an
//                                             XattrChunksFormat (kXattrChunked)
//   xattr chunk kBtreeXattrs  (ino, 2^63 + 32 id + i)
//                                             bytes [2048 i, 2048 (i + 1)) of
//                                             the chunked value whose descriptor
//                                             has id `id`
//
// A directory is a hash table laid over its key range: a name goes to slot
// NameHash(dir's hash_seed and hash_bits, name) in [kFirstSlot, kSlotEnd) (its home
// slot; hash_bits is 62 except in tests, which shrink it to force collisions), or, if that slot is
// taken, the next free one (linear probing). A run of consecutive slots is one
// probe chain; a lookup walks the chain from the name's home slot to the first
// empty slot. Removing an entry whose next slot is in use leaves a tombstone
// (a DirentFormat of type kDtTombstone, no name) so that the chains through it stay
// intact; trailing tombstones are removed with the entry that ends a chain. A
// slot number is the entry's readdir cookie: it never changes while the entry
// exists, so a readdir resumed at a cookie neither skips nor repeats entries that
// were not changed meanwhile.
//
// All integers little-endian. Values are parsed as hostile bytes: a wrong size,
// version or field is kCorrupt, never trusted.
#ifndef TFS_POSIX_FORMAT_H_
#define TFS_POSIX_FORMAT_H_

#include "btree/format.h"
#include "platform/types.h"
#include "util/endian.h"

namespace tfs::posix {

inline constexpr u16 kInodeVersion = 1;
inline constexpr u64 kRootIno = 1;    // the root directory (FUSE's root node id too)
inline constexpr u64 kFirstIno = 2;   // the first number a new inode gets
inline constexpr u32 kNameMax = 255;  // bytes of one name (NAME_MAX)

// Directory slots. 0..kFirstSlot-1 are readdir cookies for "." and ".." (and spare);
// slots stay below 2^63 so that a cookie is a valid (signed) off_t.
inline constexpr u64 kFirstSlot = 16;
inline constexpr u64 kSlotEnd = u64(1) << 63;

// File type and permission bits of a mode: the Linux values (the core has no
// sys/stat.h).
inline constexpr u32 kModeTypeMask = 0170000;
inline constexpr u32 kModeSock = 0140000;
inline constexpr u32 kModeLink = 0120000;
inline constexpr u32 kModeReg = 0100000;
inline constexpr u32 kModeBlock = 0060000;
inline constexpr u32 kModeDir = 0040000;
inline constexpr u32 kModeChar = 0020000;
inline constexpr u32 kModeFifo = 0010000;
inline constexpr u32 kModeSetuid = 04000;
inline constexpr u32 kModeSetgid = 02000;
inline constexpr u32 kModeSticky = 01000;
inline constexpr u32 kModePermMask = 07777;

// Directory entry types: the Linux DT_* values.
enum DirentType : u8 {
  kDtUnknown = 0,
  kDtFifo = 1,
  kDtChar = 2,
  kDtDir = 4,
  kDtBlock = 6,
  kDtReg = 8,
  kDtLink = 10,
  kDtSock = 12,
  kDtTombstone = 255,  // a removed entry that keeps a probe chain intact (no name)
};

// The DT_ type of a mode's file type (kDtUnknown for an invalid one).
u8 DirentTypeOf(u32 mode);

struct InodeFormat {
  Le16 version;      // kInodeVersion
  Le16 flags;        // kInodeFlag* bits; others must be 0
  Le32 mode;         // type and permission bits
  Le32 uid;
  Le32 gid;
  Le32 nlink;
  Le32 generation;   // with ino, names this inode across reuse of the number
  Le64 size;         // bytes; a symlink's target length; 0 for directories
  Le64 sectors;      // 512-byte sectors of data allocated (st_blocks)
  Le64 atime_ns;     // times: two's complement nanoseconds since the Unix epoch
  Le64 mtime_ns;
  Le64 ctime_ns;
  Le64 btime_ns;     // creation
  Le64 rdev;         // device number of a char or block device node
  Le64 parent;       // directories: the parent directory (the root: itself); else 0
  Le64 hash_seed;    // directories: keys the name hash of this directory's entries
  u8 hash_bits;      // directories: home slots are kFirstSlot + hash >> (64 - hash_bits) (1..62)
  u8 xattr_bits;     // the same for this inode's xattr table (1..62)
  // The inode's options (posix/opts.h; 0: unset, the filesystem's applies).
  // Targets: kOptTargetMember + m (member m), kOptTargetGroup | m (the group
  // member m belongs to, resolved at use). Changed with ctime in one
  // transaction; copied from the parent directory at creation.
  Le16 foreground_target;
  Le16 background_target;
  Le16 promote_target;
  u8 replicas;         // 1..kOptReplicasMax
  u8 compression;      // kOptCompressNone, kOptCompressZstd
  u8 opts_inherited;   // bit i: option i (InodeOpt) was copied from the parent
  u8 reserved0[5];     // 0
  Le64 reserved[2];    // 0
};
static_assert(sizeof(InodeFormat) == 128, "inode value size");
static_assert(__builtin_offsetof(InodeFormat, foreground_target) == 98, "options start at byte 98");
static_assert(__builtin_offsetof(InodeFormat, opts_inherited) == 106, "inode option layout");

// InodeFormat::flags.
// New data is zstd-compressed (chattr +c): mirrors the compression option
// (set iff it is kOptCompressZstd; posix/opts.h), which decides.
inline constexpr u16 kInodeFlagCompress = 1;
// The inode has a "security.capability" xattr (kXattrCaps): set and cleared
// with that xattr, in its transaction (set, remove, and the write that
// removes it), so that a write tests this bit instead of looking the name
// up. An incompatible bit (builds before it find the inode corrupt): covered
// by the superblock's kSbXattrChunks (sb/format.h).
inline constexpr u16 kInodeFlagCaps = 2;
inline constexpr u16 kInodeFlagsKnown = kInodeFlagCompress | kInodeFlagCaps;

// The xattr a write removes whoever writes (the VFS's security_inode_killpriv:
// file capabilities, which must not survive a change of the program).
inline constexpr char kXattrCaps[] = "security.capability";
inline constexpr u32 kXattrCapsLen = sizeof(kXattrCaps) - 1;
inline bool IsCapsName(const char* name, u32 len) {
  return len == kXattrCapsLen && MemCompare(name, kXattrCaps, len) == 0;
}

// The longest symlink target (PATH_MAX - 1), kept in keys (ino, 1), (ino, 2), ...
// of up to btree::kMaxValueBytes each.
inline constexpr u32 kSymlinkMax = 4095;

// A named entry of a hash table: a directory entry, or an xattr. The name
// follows the header, then (xattrs) the value.
struct DirentFormat {
  Le64 ino;        // dirents: the inode it names; 0 in xattrs and tombstones
  u8 type;         // dirents: DirentType; xattrs: kXattrValue or kXattrChunked; or kDtTombstone
  u8 name_len;     // 1..kNameMax (0 in a tombstone)
  Le16 value_len;  // xattrs: bytes after the name (the value, or the XattrChunksFormat); else 0
  u8 reserved[4];  // 0
};
static_assert(sizeof(DirentFormat) == 16, "dirent header size");

// xattrs: kBtreeXattrs (ino, slot), a table like a directory's, keyed by the
// inode's xattr_bits and a seed derived from (ino, generation). Names are the
// full "namespace.name" (user., trusted., security.).
//
// A value that fits in the entry's key beside its name (XattrInlineMax) is
// stored there (type kXattrValue). A longer one, up to kXattrSizeMax (the
// VFS's XATTR_SIZE_MAX), is chunked: the entry (type kXattrChunked) holds an
// XattrChunksFormat after the name, and the bytes are in chunk keys
// (ino, XattrChunkOffset(id, i)) of kXattrChunkBytes each (the last: the
// rest). Chunk keys lie at and above kSlotEnd, where no table slot is, so a
// walk of the table stops before them. An entry, its chunks and the inode
// change in one transaction (set, replace, remove, free).
inline constexpr u8 kXattrValue = 1;    // the value follows the name
inline constexpr u8 kXattrChunked = 2;  // an XattrChunksFormat follows the name
// Per inode: at most this many keys in the table (tombstones included).
inline constexpr u32 kMaxXattrs = 128;
// The longest value kept in the entry's own key beside a name of name_len bytes.
inline constexpr u32 XattrInlineMax(u32 name_len) { return btree::kMaxValueBytes - 16 - name_len; }
// The longest value (XATTR_SIZE_MAX; a front end's buffer for any value).
inline constexpr u32 kXattrSizeMax = 65536;
inline constexpr u32 kXattrChunkBytes = btree::kMaxValueBytes;
inline constexpr u32 kXattrChunksPerValue = kXattrSizeMax / kXattrChunkBytes;  // 32: id's stride
// Chunk keys of one inode at most (2 MiB of chunked values): freeing the
// inode deletes its kMaxXattrs table keys and these chunks in one
// transaction, which must fit the smallest journal entry (64 KiB, with 64 KiB
// buckets) -- (128 + 1024 + 4) whiteouts of 32 bytes and the header: 36 KiB.
inline constexpr u32 kMaxXattrChunks = 1024;
inline constexpr u64 kXattrChunkBase = kSlotEnd;
inline constexpr u64 kXattrIdLimit = (~u64(0) - kXattrChunkBase) / kXattrChunksPerValue + 1;  // 2^58 ids

struct XattrChunksFormat {
  Le32 value_len;  // XattrInlineMax(name_len) + 1 .. kXattrSizeMax
  Le32 crc;        // crc32c of the whole value
  Le64 id;         // < kXattrIdLimit, unique among the inode's chunked values
};
static_assert(sizeof(XattrChunksFormat) == 16, "xattr chunk descriptor size");

inline constexpr u64 XattrChunkOffset(u64 id, u32 i) { return kXattrChunkBase + id * kXattrChunksPerValue + i; }
inline constexpr u32 XattrChunkCount(u32 value_len) { return (value_len + kXattrChunkBytes - 1) / kXattrChunkBytes; }
// Bytes of chunk i of a value of value_len bytes.
inline constexpr u32 XattrChunkLen(u32 value_len, u32 i) {
  return value_len - i * kXattrChunkBytes < kXattrChunkBytes ? value_len - i * kXattrChunkBytes : kXattrChunkBytes;
}
static_assert(XattrChunkCount(kXattrSizeMax) == kXattrChunksPerValue, "a largest value fills its id's range");
static_assert(XattrChunkOffset(kXattrIdLimit - 1, kXattrChunksPerValue - 1) == ~u64(0), "ids fill the key range");

}  // namespace tfs::posix

#endif  // TFS_POSIX_FORMAT_H_
