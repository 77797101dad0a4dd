// Name tables: the on-disk rules of a directory's entries and of an inode's
// xattrs (docs/design/posix.md "Directories", docs/format/inodes-extents.md),
// the part of posix that fsck shares. A table is a hash table over the keys
// (owner, kFirstSlot..kSlotEnd) of its btree: a name's home slot is
// NameHash(seed, bits, name), its entry sits in the first slot from there on
// that holds it with no gap before, and tombstones keep such chains whole.
//
// Functions of their arguments alone: no state, no lock, no I/O.
#ifndef TFS_POSIX_NAMES_H_
#define TFS_POSIX_NAMES_H_

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

}  // namespace tfs::posix

#endif  // TFS_POSIX_NAMES_H_
