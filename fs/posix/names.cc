// Name tables (names.h; docs/design/posix.md "Directories"): a directory's
// entries and an inode's xattrs are hash tables laid over a key range of the
// dirents or xattrs btree -- linear probing from a name's home slot
// (NameHash), tombstones where a removed entry's slot still carries a chain.
// This file holds their on-disk rules, for posix and fsck alike: the name
// rule (CheckName), the entry format (ParseNamedEntry, ParseXattrChunks,
// BuildNamed), the probe (FindEntry) and the removal that keeps every chain
// whole (QueueRemoveEntry, QueueDeleteTombstonesBefore).
//
// No lock is taken here and nothing here commits: FindEntry reads committed
// keys through the btree API, and a caller that will change the table holds
// what keeps it still (posix: the owner's inode lock across the find and its
// commit; fsck: it runs alone); the Queue* functions only queue into the
// caller's transaction. Nothing here may use a Filesystem (handles, locks,
// buffers): fsck calls it on a store with no posix mounted.
#include "posix/names.h"

#include "posix/internal.h"
#include "util/bits.h"

namespace tfs::posix {

using btree::Iterator;
using btree::Pos;
using btree::Transaction;

// Name rules shared by every operation: 1..kNameMax bytes, no '/' or NUL.
Status CheckName(const char* name, u32 len) {
  if (name == nullptr || len == 0) return Err::kInvalidArgument;
  if (len > kNameMax) return Err::kNameTooLong;
  for (u32 i = 0; i < len; i++)
    if (name[i] == '/' || name[i] == '\0') return Err::kInvalidArgument;
  return Status::Ok();
}

u64 NameHash(u64 seed, u32 bits, const char* name, u32 len) {
  // On disk (it places entries): words are read little-endian on every host.
  u64 h = Mix64(seed ^ (u64(len) * 0x9e3779b97f4a7c15ull));
  for (u32 i = 0; i < len; i += 8) {
    u64 w = 0;
    for (u32 j = 0; j < 8 && i + j < len; j++) w |= u64(u8(name[i + j])) << (8 * j);
    h = Mix64(h ^ w);
  }
  h = Mix64(h ^ 0x5bd1e995);
  return kFirstSlot + (h >> (64 - Max(1u, Min(bits, 62u))));
}

Status ParseNamedEntry(u8 btree_id, const u8* v, u32 len, DirentFormat* out, const char** name, const u8** value) {
  if (len < sizeof(DirentFormat)) return Err::kCorrupt;
  MemCopy(out, v, sizeof(*out));
  *name = reinterpret_cast<const char*>(v + sizeof(DirentFormat));
  if (value != nullptr) *value = v + sizeof(DirentFormat) + out->name_len;
  if (out->reserved[0] != 0 || out->reserved[1] != 0 || out->reserved[2] != 0 || out->reserved[3] != 0)
    return Err::kCorrupt;
  if (out->type == kDtTombstone) {
    if (out->name_len != 0 || out->ino.get() != 0 || out->value_len.get() != 0 || len != sizeof(DirentFormat))
      return Err::kCorrupt;
    return Status::Ok();
  }
  if (out->name_len == 0 || len != sizeof(DirentFormat) + out->name_len + out->value_len.get()) return Err::kCorrupt;
  if (btree_id == btree::kBtreeDirents) {
    if (out->ino.get() == 0 || out->ino.get() >= btree::kInoLimit || out->type == kDtUnknown ||
        out->value_len.get() != 0)
      return Err::kCorrupt;
    return Status::Ok();
  }
  if (out->ino.get() != 0) return Err::kCorrupt;
  if (out->type == kXattrValue)
    return out->value_len.get() <= XattrInlineMax(out->name_len) ? Status::Ok() : Status(Err::kCorrupt);
  XattrChunksFormat c;
  return ParseXattrChunks(*out, v + sizeof(DirentFormat) + out->name_len, &c);
}

Status ParseXattrChunks(const DirentFormat& d, const u8* after_name, XattrChunksFormat* out) {
  if (d.type != kXattrChunked || d.value_len.get() != sizeof(XattrChunksFormat)) return Err::kCorrupt;
  MemCopy(out, after_name, sizeof(*out));
  // Chunked only when it does not fit inline: one form per value.
  const u32 len = out->value_len.get();
  if (len <= XattrInlineMax(d.name_len) || len > kXattrSizeMax || out->id.get() >= kXattrIdLimit) return Err::kCorrupt;
  return Status::Ok();
}

// A named entry (header, name, value) in buf.
u32 BuildNamed(u8* buf, u64 ino, u8 type, const char* name, u32 len, const void* value, u32 value_len) {
  DirentFormat d;
  MemSet(&d, 0, sizeof(d));
  d.ino.set(ino);
  d.type = type;
  d.name_len = u8(len);
  d.value_len.set(u16(value_len));
  MemCopy(buf, &d, sizeof(d));
  MemCopy(buf + sizeof(d), name, len);
  MemCopy(buf + sizeof(d) + len, value, value_len);
  return u32(sizeof(d)) + len + value_len;
}

u32 BuildDirent(u8* buf, u64 ino, u8 type, const char* name, u32 len) { return BuildNamed(buf, ino, type, name, len); }

NameTable DirTable(u64 dir, const InodeFormat& d) {
  return NameTable{btree::kBtreeDirents, dir, d.hash_seed.get(), d.hash_bits};
}

NameTable XattrTable(u64 ino, const InodeFormat& f) {
  return NameTable{btree::kBtreeXattrs, ino, Mix64(ino * 0x9e3779b97f4a7c15ull ^ f.generation.get()), f.xattr_bits};
}

Status FindEntry(btree::Btrees* trees, const NameTable& t, const char* name, u32 len, Entry* out,
                 XattrChunksFormat* chunks, Damaged damaged) {
  *out = Entry{};
  if (chunks != nullptr) MemSet(chunks, 0, sizeof(*chunks));
  const u64 home = NameHash(t.seed, t.bits, name, len);
  Iterator it(trees, t.btree_id);
  TFS_TRY(it.Seek(Pos{t.btree_id, t.owner, home}));
  for (u64 slot = home; slot < kSlotEnd; slot++) {
    if (!it.Valid() || it.pos().inode != t.owner || it.pos().offset != slot) {
      if (out->free == 0) out->free = slot;  // the gap that ends the chain
      return Status::Ok();
    }
    DirentFormat d;
    const char* n;
    const u8* value;
    Status parsed = ParseNamed(t, it.value(), it.val_bytes(), &d, &n, &value);
    if (!parsed.ok()) {
      if (damaged == Damaged::kFail) return parsed;
      // kOccupied: neither a tombstone nor the name; the chain runs on.
    } else if (d.type == kDtTombstone) {
      if (out->free == 0) out->free = slot;
    } else if (d.name_len == len && MemCompare(n, name, len) == 0) {
      out->found = true;
      out->slot = slot;
      out->ino = d.ino.get();
      out->type = d.type;
      if (chunks != nullptr && t.btree_id == btree::kBtreeXattrs && d.type == kXattrChunked)
        TFS_TRY(ParseXattrChunks(d, value, chunks));
      return Status::Ok();
    }
    TFS_TRY(it.Next());
  }
  return Status::Ok();  // ran into kSlotEnd: free stays as found (maybe 0)
}

namespace {

// QueueDeleteTombstonesBefore's walk, on an iterator of the table's btree.
Status DeleteTombstonesBefore(Iterator& it, Transaction* tx, u8 btree_id, u64 owner, u64 slot, Damaged damaged) {
  if (slot == 0) return Status::Ok();
  TFS_TRY(it.SeekForPrev(Pos{btree_id, owner, slot - 1}));
  for (u64 s = slot - 1; it.Valid() && it.pos().inode == owner && it.pos().offset == s; s--) {
    DirentFormat d;
    const char* n;
    Status parsed = ParseNamedEntry(btree_id, it.value(), it.val_bytes(), &d, &n);
    if (!parsed.ok() && damaged == Damaged::kFail) return parsed;
    if (!parsed.ok() || d.type != kDtTombstone) break;  // (kOccupied: a damaged key is in use)
    TFS_TRY(tx->Delete(Pos{btree_id, owner, s}));
    if (s == 0) break;
    TFS_TRY(it.Prev());
  }
  return Status::Ok();
}

}  // namespace

Status QueueRemoveEntry(btree::Btrees* trees, Transaction* tx, u8 btree_id, u64 owner, u64 slot,
                        Damaged damaged) {
  // Another chain may run on through the next slot: then keep this one occupied.
  // (No slot is at kSlotEnd: xattr chunk keys are.)
  Iterator it(trees, btree_id);
  TFS_TRY(it.Seek(Pos{btree_id, owner, slot + 1}));
  if (it.Valid() && it.pos().inode == owner && it.pos().offset == slot + 1 && slot + 1 < kSlotEnd) {
    u8 buf[sizeof(DirentFormat)];
    DirentFormat d;
    MemSet(&d, 0, sizeof(d));
    d.type = kDtTombstone;
    MemCopy(buf, &d, sizeof(d));
    return tx->Set(Pos{btree_id, owner, slot}, buf, sizeof(buf));
  }
  // The chain ends here: drop the entry and the tombstones right before it.
  TFS_TRY(tx->Delete(Pos{btree_id, owner, slot}));
  return DeleteTombstonesBefore(it, tx, btree_id, owner, slot, damaged);
}

Status QueueDeleteTombstonesBefore(btree::Btrees* trees, Transaction* tx, u8 btree_id, u64 owner, u64 slot,
                                   Damaged damaged) {
  Iterator it(trees, btree_id);
  return DeleteTombstonesBefore(it, tx, btree_id, owner, slot, damaged);
}

}  // namespace tfs::posix
