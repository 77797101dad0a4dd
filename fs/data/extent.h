// Extent values (format v2, docs/format/inodes-extents.md "Extents";
// docs/design/copies.md "Extent v2"): the one API through which every user --
// the write path, truncate and punch, the read path, accounting, fsck, the
// fuzz targets -- reads and builds the value of a kBtreeExtents key (ino,
// end block). No other file knows the byte layout: it parses a value into an
// Extent, edits the Extent or calls an edit below, and builds the new value.
//
// An extent is up to kMaxPtrs copies of the same blocks, one pointer each, on
// distinct members. A pointer is plain (the blocks as they are, verified by
// the per-block crcs all plain copies share) or compressed (a zstd blob with
// its own crc); cached (a clean copy whose authoritative copy is elsewhere)
// or not. At least one pointer is not cached: an extent whose every copy is
// cached has lost its data. An unwritten extent (fallocate) has no pointer.
//
// Where a copy lives is decided here too (PtrBucket, PtrInBucket), once for
// the data path, the read and fsck; and whether and how much it counts in
// its bucket (PtrCountsIn, PtrSectors), once for the data path, the mount
// and fsck's recount.
//
// Pure functions of their arguments: no lock, no I/O, no allocation, no
// state. Kernel-safe (an Extent is ~170 bytes: fine on a stack, not in big
// arrays there).
#ifndef TFS_DATA_EXTENT_H_
#define TFS_DATA_EXTENT_H_

#include "btree/key.h"
#include "platform/types.h"
#include "sb/superblock.h"
#include "util/endian.h"
#include "util/status.h"

namespace tfs::data {

inline constexpr u32 kBlockSize = 4096;
inline constexpr u32 kMaxExtentBlocks = 128;          // 512 KiB of data, 512 bytes of crcs
inline constexpr u32 kMaxUnwrittenBlocks = 1u << 18;  // 1 GiB of reservation a key
inline constexpr u32 kMaxCompressedBlocks = 16;       // 64 KiB of input a blob
inline constexpr u32 kMaxPtrs = 4;                    // copies of an extent
inline constexpr u8 kExtentVersion = 2;
inline constexpr u8 kExtentUnwritten = 1;  // ExtentFormat::flags: no pointer, reads as zeros
inline constexpr u8 kPtrCached = 1;        // ExtentPtr::flags: a clean copy; another is authoritative
inline constexpr u8 kPtrCompressed = 2;    // ExtentPtr::flags: a zstd blob with one crc

// On disk: ExtentFormat, then nr_ptrs ExtentPtr, then Le32 crc[blocks] iff
// some pointer is not compressed (one crc32c per 4 KiB block, shared by every
// plain copy: they hold the same bytes).
struct PolicyFormat {  // 8 bytes: the options the extent was written under (data/policy.h)
  Le16 fg_target;      // a target code (policy.h); 0: the filesystem's
  Le16 bg_target;
  u8 replicas;         // 0: the filesystem's data_replicas
  u8 compression;      // 0: the filesystem's; kCompressNone, kCompressZstd
  u8 flags;            // kPolicyIncompressible
  u8 reserved;
};
static_assert(sizeof(PolicyFormat) == 8, "extent policy size");

struct ExtentFormat {  // 16 bytes
  u8 version;      // kExtentVersion
  u8 flags;        // 0 or kExtentUnwritten
  u8 nr_ptrs;      // 1..kMaxPtrs; 0 if unwritten
  u8 reserved;
  Le32 blocks;     // 1..kMaxExtentBlocks (unwritten: ..kMaxUnwrittenBlocks; compressed: see ExtentPtr)
  PolicyFormat policy;  // any bytes parse: PolicyOf (data/policy.h) reads them (sb kSbExtentPolicy)
};
static_assert(sizeof(ExtentFormat) == 16, "extent header size");

// PolicyFormat in host order, as stored (nothing checked: PolicyOf's job).
struct Policy {
  u16 fg_target = 0;
  u16 bg_target = 0;
  u8 replicas = 0;
  u8 compression = 0;
  u8 flags = 0;
  u8 reserved = 0;
  bool operator==(const Policy& o) const {
    return fg_target == o.fg_target && bg_target == o.bg_target && replicas == o.replicas &&
           compression == o.compression && flags == o.flags && reserved == o.reserved;
  }
};

struct ExtentPtr {  // 32 bytes
  u8 dev;
  u8 gen;            // the bucket's generation when written
  u8 flags;          // kPtrCached | kPtrCompressed
  u8 stored_blocks;  // compressed: the blob's blocks before compression (1..16); plain: 0
  Le32 blob_offset;  // blocks from the blob's start to the extent's first block
  Le64 offset;       // byte offset of the blob on the member
  Le32 disk_bytes;   // compressed: the blob's bytes on disk; plain: 0
  Le32 crc;          // compressed: crc32c of those bytes; plain: 0
  u8 reserved[8];
};
static_assert(sizeof(ExtentPtr) == 32, "extent pointer size");

inline constexpr u32 kExtentValueMax = u32(sizeof(ExtentFormat) + kMaxPtrs * sizeof(ExtentPtr)) + 4 * kMaxExtentBlocks;

// A parsed extent, host order. `crcs` points into the value it was parsed
// from (or a buffer of the caller's): it lives as long as that.
struct Extent {
  struct Ptr {
    u64 offset = 0;        // byte offset of the blob's first block on the member
    u32 blob_offset = 0;   // blocks from the blob's start to the extent's first block (plain: + blocks <= 128)
    u32 disk_bytes = 0;    // compressed: bytes of the blob on disk
    u32 crc = 0;           // compressed: crc32c of them
    u8 dev = 0;
    u8 gen = 0;
    u8 stored_blocks = 0;  // compressed: blocks of the blob before compression
    bool cached = false;
    bool compressed = false;
  };
  u64 ino = 0;
  u64 start = 0;  // first file block
  u64 end = 0;    // one past the last
  Policy policy;  // kept by every build and edit below (BuildUnwritten: 0)
  bool unwritten = false;  // then nr_ptrs is 0 and crcs null
  u32 nr_ptrs = 0;
  Ptr ptrs[kMaxPtrs] = {};
  const u8* crcs = nullptr;  // blocks() Le32 values iff some pointer is plain, else null

  u32 blocks() const { return u32(end - start); }
  // Whether some pointer is plain (then the value carries the per-block crcs).
  bool HasPlain() const {
    for (u32 i = 0; i < nr_ptrs; i++)
      if (!ptrs[i].compressed) return true;
    return false;
  }
  // The crc32c of the extent's block `i` (0-based; plain copies only).
  u32 BlockCrc(u64 i) const {
    Le32 c;
    MemCopy(&c, crcs + 4 * i, 4);
    return c.get();
  }
  // Blocks of the member pointer p's blob takes from p.offset up to this
  // extent's end (a compressed blob: all of it).
  u64 DiskBlocks(const Ptr& p) const {
    return p.compressed ? (u64(p.disk_bytes) + kBlockSize - 1) / kBlockSize : u64(p.blob_offset) + blocks();
  }
};

// kCorrupt unless `value` is exactly a valid extent ending at pos.offset, of
// an inode number below btree::kInoLimit:
// version 2; flags 0 or unwritten (nr_ptrs 0, blocks <= kMaxUnwrittenBlocks,
// the header alone); else 1..kMaxPtrs pointers on distinct members, at least
// one not cached, no unknown flag (the policy bytes are not checked here:
// any parse, and PolicyOf reads them); a compressed pointer with stored_blocks
// 1..16, blob_offset + blocks <= stored_blocks and 0 < disk_bytes <
// stored_blocks * 4096; a plain one with blob_offset + blocks <= 128 (a plain
// blob is at most kMaxExtentBlocks) and stored_blocks, disk_bytes and crc
// zero; every reserved field zero; the crcs present iff some pointer is
// plain; no byte more or less.
Status ParseExtent(const btree::Pos& pos, const u8* value, u32 len, Extent* out);

// The same rules on an Extent built or edited in memory (ok or kInvalidArgument).
Status CheckExtent(const Extent& e);

// e's value into buf (kExtentValueMax bytes); its length. kInvalidArgument
// if e breaks a rule of ParseExtent (nothing invalid is ever built). buf may
// be the buffer e was parsed from (e.crcs is then stale afterwards).
Result<u32> BuildExtent(const Extent& e, u8* buf);

// The value of piece [start + skip, start + skip + blocks) of e -- what an
// overwrite or punch leaves of it (fsck trims overlaps with it): every
// pointer's blob_offset advances by skip, the crcs are the piece's slice; a
// compressed copy keeps its whole blob and crc. kInvalidArgument for a
// piece outside e.
Result<u32> BuildPiece(const Extent& e, u64 skip, u32 blocks, u8* buf);

// The pointer edits (the engines' and fsck's), each the new value into buf.
// AddPtr: e with pointer p appended; `crcs` (blocks() values) are needed when
// p is plain and e has no plain copy yet, and must equal e's when it has
// (a plain copy holds the same bytes). DropPtr: e without pointer i.
// SetCached: pointer i marked cached or not. kInvalidArgument if e itself
// breaks a rule or i is not one of its pointers (checked before anything is
// read: e may come from anywhere), or if the result would break a rule (a
// fifth pointer, a member twice, no pointer left that is not cached:
// dropping an extent's last copy is deleting the extent).
Result<u32> AddPtr(const Extent& e, const Extent::Ptr& p, const u8* crcs, u8* buf);
Result<u32> DropPtr(const Extent& e, u32 i, u8* buf);
// ReplacePtr: e with pointer i replaced by p in its place (the copies'
// order, a read's preference, kept): a copy rewritten elsewhere, on its own
// member or another (the repair of a bad copy, a move). `crcs` as AddPtr's:
// needed when p is plain and e has no crcs (no plain copy), and equal to
// e's when given and e has them. The rules as AddPtr's (a member twice, no
// copy left that is not cached: kInvalidArgument).
Result<u32> ReplacePtr(const Extent& e, u32 i, const Extent::Ptr& p, const u8* crcs, u8* buf);
Result<u32> SetCached(const Extent& e, u32 i, bool cached, u8* buf);

// An unwritten extent of `blocks` blocks (a reservation): its value into buf
// (the header alone: kUnwrittenValueBytes).
inline constexpr u32 kUnwrittenValueBytes = u32(sizeof(ExtentFormat));
u32 BuildUnwritten(u32 blocks, u8* buf);

// Where a copy lives. PtrBucket: the bucket p's blob starts in (*bucket);
// false if p's member is not one of sb's or the blob starts outside its
// buckets. Every piece of an extent has the same answer (pieces share their
// blobs' offsets), which is why the data path's accounting counts by it: what
// mount counts, a punch of any piece uncounts. PtrInBucket: PtrBucket, and
// the blocks p holds for e (a plain copy: its blob up to e's end; a
// compressed one: the whole blob) end inside that bucket -- the copy lies
// whole in one bucket, as a write leaves it. fsck and the read ask this one.
bool PtrBucket(const sb::Superblock& sb, const Extent::Ptr& p, u64* bucket);
bool PtrInBucket(const sb::Superblock& sb, const Extent& e, const Extent::Ptr& p, u64* bucket);

// The one rule of the space accounting (docs/design/copies.md, "Step 3b:
// counts in the records"), shared by the data path (its counts), the mount,
// fsck's rebuild and the tests, after PtrBucket has said which bucket p
// lies in (a pointer outside the buckets counts nowhere: fsck's business).
// PtrCountsIn: whether p counts there, given what the caller's allocation
// state says of that bucket (the data path: the allocator; fsck: the state
// it loaded or rebuilt). A pointer that is not cached always counts; a
// cached one only while current -- its bucket a user bucket of its
// generation (a stale cached pointer is normal, not damage: it counts
// nowhere). Counted cached pointers count apart from live ones.
inline bool PtrCountsIn(const Extent::Ptr& p, bool bucket_user, u8 bucket_gen) {
  return !p.cached || (bucket_user && bucket_gen == p.gen);
}
// What a counted pointer of e adds to its bucket's count: e's file blocks in
// 512-byte sectors, cached or not, compressed or not -- logical, not
// physical: the pieces of one compressed blob each count their own blocks,
// so a bucket of compressed blobs counts more than it holds (at most
// kMaxCompressedBlocks times its sectors: a blob of up to 16 blocks takes at
// least one disk block), and a punch's arithmetic stays additive.
inline u32 PtrSectors(const Extent& e) { return e.blocks() * (kBlockSize / 512); }
// The members of e's pointers that count live (not cached, PtrBucket): the
// set of its kReplicas total (alloc/accounting.h), a bit per member; 0 for
// an extent with none (unwritten, or every pointer cached or bad).
u32 CountedMembers(const sb::Superblock& sb, const Extent& e);

}  // namespace tfs::data

#endif  // TFS_DATA_EXTENT_H_
