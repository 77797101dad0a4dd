// Name tables: the on-disk rules of a directory's entries and of an inode's
// xattrs (docs/design/posix.md "Directories", docs/format/inodes-extents.md),
// the part of posix that fsck shares. A table is a hash table over the keys
// (owner, kFirstSlot..kSlotEnd) of its btree: a name's home slot is
// NameHash(seed, bits, name), its entry sits in the first slot from there on
// that holds it with no gap before, and tombstones keep such chains whole.
//
// posix and fsck call the same functions, so the rules have one
// implementation. They keep no state and take no lock: the probe reads
// committed keys through the btree API, the Queue* functions only queue into
// the caller's transaction, and the caller keeps the table still (posix: the
// owner's inode lock across the find and the commit; fsck runs alone).
#ifndef TFS_POSIX_NAMES_H_
#define TFS_POSIX_NAMES_H_

#include "btree/tree.h"
#include "posix/format.h"
#include "util/status.h"

namespace tfs::posix {

// One hash table of named entries: a directory's entries or an inode's xattrs.
struct NameTable {
  u8 btree_id;  // kBtreeDirents or kBtreeXattrs
  u64 owner;    // the directory or inode: the keys' inode field
  u64 seed;
  u32 bits;     // home slots: 2^bits from kFirstSlot
};

NameTable DirTable(u64 dir, const InodeFormat& d);
NameTable XattrTable(u64 ino, const InodeFormat& f);

// Parses a named entry of the dirents or xattrs btree (dirents: a live inode and
// type, no value; xattrs: inode 0, type kXattrValue with a value after the
// name, or kXattrChunked with a valid descriptor); a tombstone has no name.
// `value` (if not null) gets where the bytes after the name start.
Status ParseNamedEntry(u8 btree_id, const u8* v, u32 len, DirentFormat* out, const char** name,
                       const u8** value = nullptr);
// The descriptor of a chunked xattr value (d: its parsed entry, after_name:
// the bytes after its name): kCorrupt unless d is kXattrChunked with a
// descriptor of the right size, a length that does not fit inline and at most
// kXattrSizeMax, and an id below kXattrIdLimit.
Status ParseXattrChunks(const DirentFormat& d, const u8* after_name, XattrChunksFormat* out);
// The home slot of `name` in a directory whose hash_seed is `seed` and hash_bits
// `bits` (1..62).
u64 NameHash(u64 seed, u32 bits, const char* name, u32 len);

// A named entry (header, name, value) in buf; returns its length. A
// directory's entry has no value: BuildDirent, at most kDirentMax bytes.
u32 BuildNamed(u8* buf, u64 ino, u8 type, const char* name, u32 len, const void* value = nullptr,
               u32 value_len = 0);
u32 BuildDirent(u8* buf, u64 ino, u8 type, const char* name, u32 len);
inline constexpr u32 kDirentMax = u32(sizeof(DirentFormat)) + kNameMax;

// What FindEntry learns of one name's probe chain.
struct Entry {
  bool found = false;
  u64 slot = 0;    // found: the entry's slot
  u64 ino = 0;     // found: the inode it names (directories)
  u8 type = 0;     // found: its DirentType (directories)
  u64 free = 0;    // not found: where the name would go (0: the chain reached kSlotEnd)
};

// What a walk of a table makes of a key that does not parse. posix never
// trusts one: kFail, the walk fails with its kCorrupt. fsck, which reports
// and removes such keys, walks on: kOccupied, a slot in use that is neither
// a tombstone nor the name looked for (and stops a tombstone walk).
enum class Damaged : u8 { kFail, kOccupied };

// Walks the probe chain of `name` in t from its home slot: the first entry of
// that name before a gap, else where the name would go (the chain's first
// tombstone, else the gap that ends it). chunks (xattr tables; may be null):
// a found chunked value's descriptor, else zeros (value_len 0: inline, or not
// found).
Status FindEntry(btree::Btrees* trees, const NameTable& t, const char* name, u32 len, Entry* out,
                 XattrChunksFormat* chunks = nullptr, Damaged damaged = Damaged::kFail);
// Queues into tx the removal of the entry at `slot` of the table of `owner` in
// btree `btree_id`: a tombstone if the next slot is in use (a chain may run on
// through it), else its deletion with the tombstones right before it
// (QueueDeleteTombstonesBefore), so no chain ends in a tombstone.
Status QueueRemoveEntry(btree::Btrees* trees, btree::Transaction* tx, u8 btree_id, u64 owner, u64 slot,
                        Damaged damaged = Damaged::kFail);
// Queues into tx the deletion of the tombstones right before `slot`, down to
// the first slot that is empty or holds anything else.
Status QueueDeleteTombstonesBefore(btree::Btrees* trees, btree::Transaction* tx, u8 btree_id, u64 owner,
                                   u64 slot, Damaged damaged = Damaged::kFail);

}  // namespace tfs::posix

#endif  // TFS_POSIX_NAMES_H_
