// Backpointers (docs/format/backpointers.md; design: docs/design/copies.md,
// "Backpointers"): for every pointer of every extent that is not a cached
// copy, a key of kBtreeBackpointers from the member blocks it points into
// back to the extent, so that copygc finds what lives in a bucket by reading
// one key range instead of walking every extent, and fsck can cross-check
// both ways. A cached copy has none (as in bcachefs): its bucket may be
// dropped -- its generation bumped, the extents left alone -- and reused,
// and a stale cached pointer then points at blocks another extent's pointer
// owns; with a key of its own it would claim them too.
//
//   key    (dev, (member block of the blob's start << 8) | piece)
//          member block = the pointer's blob byte offset / 4096; piece = its
//          blob_offset (a split extent's pieces share a blob: < 128 plain,
//          < 16 compressed, so 8 bits hold it)
//   value  BackpointerFormat (24 bytes): the extent (ino, end = its key's
//          offset, blocks); flags reserved (0)
//
// The extents are the truth; a backpointer is derived from a pointer by one
// rule (BackpointerOf: a cached pointer or one outside the buckets has none)
// and changes in
// the transaction that changes the extent (QueueBackpointers, the one
// function every site that sets or deletes an extent key calls), so a crash
// keeps both or neither.
//
// ParseBackpointer, BuildBackpointer, BackpointerOf and QueueBackpointers are
// pure (no lock, no I/O; QueueBackpointers only queues into the caller's
// transaction). ForEachInBucket and CheckBackpointers read the btrees through
// iterators (no lock held between keys, as every btree reader); thread safety
// is the iterator's: from any thread, seeing every commit applied before each
// step.
#ifndef TFS_DATA_BACKPOINTER_H_
#define TFS_DATA_BACKPOINTER_H_

#include "btree/key.h"
#include "btree/tree.h"
#include "data/extent.h"
#include "platform/types.h"
#include "sb/superblock.h"
#include "util/endian.h"
#include "util/status.h"

namespace tfs::data {

inline constexpr u32 kBpPieceBits = 8;
inline constexpr u32 kBpMaxPiece = (1u << kBpPieceBits) - 1;  // 255

struct BackpointerFormat {  // 24 bytes
  Le64 ino;        // the extent's inode
  Le64 end;        // the extent's key offset: its end block
  Le32 blocks;     // the extent's blocks (1..kMaxExtentBlocks)
  u8 flags;        // 0 (reserved)
  u8 reserved[3];  // 0
};
static_assert(sizeof(BackpointerFormat) == 24, "backpointer value size");

// A parsed backpointer: where (the key) and whose (the value).
struct Backpointer {
  u32 dev = 0;
  u64 block = 0;  // member block (4 KiB) of the blob's start
  u32 piece = 0;  // the pointer's blob_offset (0..kBpMaxPiece)
  u64 ino = 0;
  u64 end = 0;
  u32 blocks = 0;

  btree::Pos pos() const { return btree::Pos{btree::kBtreeBackpointers, dev, (block << kBpPieceBits) | piece}; }
  bool SameValue(const Backpointer& o) const { return ino == o.ino && end == o.end && blocks == o.blocks; }
};

// kCorrupt unless `value` is exactly a backpointer value at `pos`: a key of
// kBtreeBackpointers with a member index below 256 (and a block that fits
// the key), 24 bytes, blocks 1..kMaxExtentBlocks, end >= blocks, an owner
// below btree::kInoLimit, flags and reserved bytes zero.
Status ParseBackpointer(const btree::Pos& pos, const u8* value, u32 len, Backpointer* out);
// bp's value (what ParseBackpointer accepts for bp.pos()).
BackpointerFormat BuildBackpointer(const Backpointer& bp);

// The one rule: the backpointer pointer p of extent e has -- false if it has
// none: a cached copy (see the top), a member the filesystem does not have,
// an offset before the first bucket or past its member's last, or a
// blob_offset too large for the key (a damaged pointer; fsck drops those
// outside the buckets). Otherwise the rule looks at the geometry only, not
// the bucket's state or generation: a stale pointer that is not cached
// (damage) keeps its backpointer until its extent changes.
bool BackpointerOf(const sb::Superblock& sb, const Extent& e, const Extent::Ptr& p, Backpointer* out);

// Queues into tx what replacing extent `old` by `now` (either null: created
// or deleted) does to the backpointers: the deletes of old's that now does
// not have and the sets of now's that old did not have (an identical one is
// left alone; one whose key stays but whose value changes is set). A copy
// turned cached loses its backpointer, one promoted from cached gets one.
// Unwritten extents have none. Where an extent is split, pair it with the
// piece that keeps its positions (the one before the range: its pointers'
// blob offsets are the extent's) and call it again with (null, the other
// piece); pairing otherwise is correct too, a key deleted and set again in
// one transaction ends as the later says (keys apply in order), at the cost
// of a whiteout. kTooBig as btree::Transaction::Set.
Status QueueBackpointers(btree::Transaction* tx, const sb::Superblock& sb, const Extent* old, const Extent* now);

// The keys of bucket `bucket` of member `dev`: [*first, *last] (inclusive).
void BucketBackpointerRange(const sb::Superblock& sb, u32 dev, u64 bucket, btree::Pos* first, btree::Pos* last);

// copygc's query: calls fn for every backpointer of the bucket, in key order
// (by member block, then piece). kInvalidArgument for a bucket the member
// does not have; kCorrupt at a value that does not parse (nothing in that
// bucket can be trusted to be complete); fn returns non-Ok to stop (returned).
using BackpointerFn = Status (*)(void* ctx, const Backpointer& bp);
Status ForEachInBucket(btree::Btrees* trees, const sb::Superblock& sb, u32 dev, u64 bucket, BackpointerFn fn,
                       void* ctx);

// The cross-check of the backpointers tree against what the extents imply,
// shared by fsck (docs/design/fsck.md, "Backpointers") and the tests.
struct BackpointerMismatch {
  enum Kind : u8 {
    kMissing,  // the extents imply `want`; no key at its position
    kWrong,    // a key at want's position with another value (or one that does not parse: !have_ok)
    kStray,    // a key no extent implies (`have` if have_ok)
    kShared,   // `claims` (> 1) pointers of extents imply this position: blocks claimed twice (damage
               // the extents carry; `want` is the first claimant by extent key, the one the key should name)
  };
  Kind kind;
  btree::Pos pos;
  Backpointer want;  // kMissing, kWrong, kShared
  Backpointer have;  // kWrong, kStray, when have_ok
  bool have_ok = false;
  u32 claims = 0;  // kShared
};
struct BackpointerCheckStats {
  u64 extents = 0;   // extents that parsed (each pass counts them once: the first pass's)
  u64 expected = 0;  // backpointers the extents imply (distinct positions)
  u64 keys = 0;      // keys of the backpointers tree
  u64 no_key = 0;    // pointers outside the buckets (BackpointerOf false for a pointer not cached)
  u64 cached = 0;    // cached pointers (none has a backpointer)
  u32 passes = 0;    // walks of the extents (one per window of max_entries / 2 positions after the first)
};
// Walks the extents (those that do not parse are skipped: they imply
// nothing) and the backpointers tree in key order and calls fn for every
// difference, in key order. Memory is bounded by `max_entries` expected
// backpointers (about 40 bytes each): the key space is covered in windows,
// each collected by one walk of the extents, sorted and merged with that
// range of the tree; a window that fills is cut to its lowest half, so a
// filesystem with P pointers takes about max(1, 2P / max_entries) walks.
// fn may commit a change at the position it is told of (fsck's repair): the
// walk goes on after it. fn returns non-Ok to stop (returned).
using MismatchFn = Status (*)(void* ctx, const BackpointerMismatch& m);
inline constexpr u64 kBpCheckEntries = u64(1) << 20;
Status CheckBackpointers(btree::Btrees* trees, const sb::Superblock& sb, MismatchFn fn, void* ctx,
                         BackpointerCheckStats* stats = nullptr, u64 max_entries = kBpCheckEntries);

}  // namespace tfs::data

#endif  // TFS_DATA_BACKPOINTER_H_
