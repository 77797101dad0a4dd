// Extended attributes (fs.h; docs/design/posix.md "Xattrs"): an inode's
// xattrs are a name table (names.cc) in the xattrs btree. "tierfs." names
// are not keys but the inode's options: routed to opts.cc. A value up to
// XattrInlineMax(name) bytes sits in its entry; a longer one, up to 64 KiB,
// in 2048-byte chunk keys above every slot, found through the descriptor in
// its entry (format.h). Set, replace and remove change an entry and its
// chunks in one transaction under the inode lock, with the inode's ctime and,
// for security.capability, kInodeFlagCaps.
//
// Get of an inline value and List read committed keys without a lock; a
// chunked value is read under the inode lock, which every change of its keys
// holds across the commit, so its chunks always match their descriptor (a
// mismatch is kCorrupt, never a race). No data I/O; every commit asserts that
// no table mutex is held (DebugNoSharedLock).
#include "posix/fs.h"

#include "posix/internal.h"
#include "posix/opts.h"

namespace tfs::posix {

using btree::Iterator;
using btree::Pos;
using btree::Transaction;

namespace {

Status CheckXattrName(const char* name, u32 len) {
  if (name == nullptr || len == 0) return Err::kInvalidArgument;
  if (len > kNameMax) return Err::kNameTooLong;
  for (u32 i = 0; i < len; i++)
    if (name[i] == '\0') return Err::kInvalidArgument;
  auto prefixed = [&](const char* p, u32 n) { return len > n && MemCompare(name, p, n) == 0; };
  if (!prefixed("user.", 5) && !prefixed("trusted.", 8) && !prefixed("security.", 9)) return Err::kNotSupported;
  return Status::Ok();
}

}  // namespace

namespace {

Pos XattrPos(u64 ino, u64 offset) { return Pos{btree::kBtreeXattrs, ino, offset}; }

// What SetXattr needs to know of an inode's xattr table besides its name's entry.
struct XattrTableInfo {
  u32 keys = 0;         // table keys, tombstones included
  u32 chunks = 0;       // chunk keys of the chunked values (but the skipped slot's)
  u64 low_ids[4] = {};  // a bitmap of the ids below 256 those values use
};

Status ScanXattrTable(btree::Btrees* trees, const NameTable& t, u64 skip_slot, XattrTableInfo* out) {
  Iterator it(trees, btree::kBtreeXattrs);
  TFS_TRY(it.Seek(XattrPos(t.owner, 0)));
  for (; it.Valid() && it.pos().inode == t.owner && it.pos().offset < kSlotEnd; TFS_TRY(it.Next())) {
    out->keys++;
    if (it.pos().offset == skip_slot) continue;
    DirentFormat d;
    const char* n;
    const u8* value;
    TFS_TRY(ParseNamed(t, it.value(), it.val_bytes(), &d, &n, &value));
    if (d.type != kXattrChunked) continue;
    XattrChunksFormat c;
    TFS_TRY(ParseXattrChunks(d, value, &c));
    out->chunks += XattrChunkCount(c.value_len.get());
    const u64 id = c.id.get();
    if (id < 256) out->low_ids[id / 64] |= u64(1) << (id % 64);
  }
  return Status::Ok();
}

// The lowest id that no chunked value of the inode uses and no chunk key
// occupies (a stale one would read as an extra chunk of the new value). At
// most kMaxXattrs ids are in use, so one of the first 256 is free unless
// stale chunks hold the rest (then fsck removes them).
Status PickChunkId(btree::Btrees* trees, u64 ino, const XattrTableInfo& info, u64* id) {
  Iterator it(trees, btree::kBtreeXattrs, 1);
  for (u64 cand = 0; cand < 256; cand++) {
    if (((info.low_ids[cand / 64] >> (cand % 64)) & 1) != 0) continue;
    TFS_TRY(it.Seek(XattrPos(ino, XattrChunkOffset(cand, 0))));
    if (!it.Valid() || it.pos().inode != ino || it.pos().offset > XattrChunkOffset(cand, kXattrChunksPerValue - 1)) {
      *id = cand;
      return Status::Ok();
    }
  }
  return Err::kCorrupt;
}

// A chunked value into out (desc.value_len bytes), in one pass of an
// iterator over its chunk keys (they are consecutive): kCorrupt if a chunk is
// missing or of the wrong length, or the bytes fail the descriptor's crc. The
// caller holds the inode lock, so no commit changes them meanwhile.
Status ReadXattrChunks(btree::Btrees* trees, u64 ino, const XattrChunksFormat& desc, u8* out) {
  const u32 n = desc.value_len.get();
  const u32 count = XattrChunkCount(n);
  Iterator it(trees, btree::kBtreeXattrs, count);  // one batch holds them all
  TFS_TRY(it.Seek(XattrPos(ino, XattrChunkOffset(desc.id.get(), 0))));
  u32 at = 0;
  for (u32 i = 0; i < count; i++) {
    if (i > 0) TFS_TRY(it.Next());
    const u32 want = XattrChunkLen(n, i);
    if (!it.Valid() || it.pos().inode != ino || it.pos().offset != XattrChunkOffset(desc.id.get(), i) ||
        it.val_bytes() != want)
      return Err::kCorrupt;
    MemCopy(out + at, it.value(), want);
    at += want;
  }
  return platform::Crc32c(out, n) == desc.crc.get() ? Status::Ok() : Status(Err::kCorrupt);
}

// The inline value of `name` at `slot` (up to cap bytes; its length). kNoData
// when the slot holds another name or none (removed meanwhile); *chunked (and
// kNoData) when it holds `name` as a chunked value (replaced meanwhile).
Result<u32> ReadInlineXattr(btree::Btrees* trees, const NameTable& t, u64 slot, const char* name, u32 len,
                            void* buf, u32 cap, bool* chunked) {
  *chunked = false;
  u8* v = static_cast<u8*>(platform::Alloc(btree::kMaxValueBytes, 8));
  if (v == nullptr) return Err::kNoMemory;
  auto r = trees->Get(XattrPos(t.owner, slot), v, btree::kMaxValueBytes);
  Status st = r.status();
  u32 n = 0;
  if (st.Is(ErrorClass::kNotFound)) st = Err::kNoData;
  if (st.ok()) {
    DirentFormat d;
    const char* nm;
    const u8* value;
    st = ParseNamed(t, v, Min(r.value(), btree::kMaxValueBytes), &d, &nm, &value);
    if (st.ok() && (d.type == kDtTombstone || d.name_len != len || MemCompare(nm, name, len) != 0)) {
      st = Err::kNoData;
    } else if (st.ok() && d.type == kXattrChunked) {
      *chunked = true;
      st = Err::kNoData;
    }
    n = st.ok() ? d.value_len.get() : 0;
    if (st.ok() && cap != 0 && cap < n) st = Err::kRange;
    if (st.ok() && cap != 0) MemCopy(buf, value, n);
  }
  platform::Free(v);
  TFS_TRY(st);
  return n;
}

}  // namespace

Status Filesystem::SetXattr(u64 ino, const char* name, u32 len, const void* value, u32 value_len, u32 flags,
                            OptionCaller* who) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if (name != nullptr && IsOptXattr(name, len))
    return ChangeOption(ino, name, len, value, value_len, flags, false, who);
  TFS_TRY(CheckXattrName(name, len));
  if ((flags & ~u32(kXattrCreate | kXattrReplace)) != 0 || flags == (kXattrCreate | kXattrReplace))
    return Err::kInvalidArgument;
  if (value_len > kXattrSizeMax) return Err::kNoSpace;
  if (value_len > 0 && value == nullptr) return Err::kInvalidArgument;
  TFS_TRY(MetadataRoom());
  const bool chunked = value_len > XattrInlineMax(len);
  const u32 nchunks = chunked ? XattrChunkCount(value_len) : 0;
  XattrChunksFormat desc;
  MemSet(&desc, 0, sizeof(desc));
  // The crc of up to 64 KiB before the lock: no other writer of the inode
  // waits for it.
  if (chunked) {
    desc.value_len.set(value_len);
    desc.crc.set(platform::Crc32c(value, value_len));
  }
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const NameTable t = XattrTable(ino, f);
  Entry e;
  XattrChunksFormat old;  // the value being replaced, if chunked
  TFS_TRY(FindEntry(trees_, t, name, len, &e, &old));
  const u32 old_chunks = XattrChunkCount(old.value_len.get());
  if (e.found && (flags & kXattrCreate) != 0) return Err::kExists;
  if (!e.found && (flags & kXattrReplace) != 0) return Err::kNoData;
  if (!e.found && e.free == 0) return Err::kNoSpace;
  if (!e.found || chunked) {
    XattrTableInfo info;
    TFS_TRY(ScanXattrTable(trees_, t, e.found ? e.slot : kSlotEnd, &info));
    if (!e.found && info.keys >= kMaxXattrs) return Err::kNoSpace;  // (tombstones count: a bound, not a quota)
    if (chunked) {
      if (info.chunks + nchunks > kMaxXattrChunks) return Err::kNoSpace;
      // A chunked value being replaced keeps its id: its chunks are overwritten.
      u64 id = old.id.get();
      if (old_chunks == 0) TFS_TRY(PickChunkId(trees_, ino, info, &id));
      desc.id.set(id);
    }
  }
  u8* buf = static_cast<u8*>(platform::Alloc(btree::kMaxValueBytes, 8));
  if (buf == nullptr) return Err::kNoMemory;
  Transaction tx(trees_);
  const u64 slot = e.found ? e.slot : e.free;
  const u8* in = static_cast<const u8*>(value);
  Status st;
  if (chunked) {
    for (u32 i = 0; st.ok() && i < nchunks; i++)
      st = tx.Set(XattrPos(ino, XattrChunkOffset(desc.id.get(), i)), in + u64(i) * kXattrChunkBytes,
                  XattrChunkLen(value_len, i));
    if (st.ok())
      st = tx.Set(XattrPos(ino, slot), buf, BuildNamed(buf, 0, kXattrChunked, name, len, &desc, sizeof(desc)));
  } else {
    st = tx.Set(XattrPos(ino, slot), buf, BuildNamed(buf, 0, kXattrValue, name, len, value, value_len));
  }
  platform::Free(buf);
  // The old value's chunks that the new one does not overwrite.
  for (u32 i = nchunks; st.ok() && i < old_chunks; i++)
    st = tx.Delete(XattrPos(ino, XattrChunkOffset(old.id.get(), i)));
  if (IsCapsName(name, len)) f.flags.set(u16(f.flags.get() | kInodeFlagCaps));
  SetTime(&f.ctime_ns, Now());
  if (st.ok()) st = tx.Set(InodePos(ino), &f, sizeof(f));
  // Only where journal entries are smaller than a 64 KiB value's transaction
  // (64 KiB buckets: 64 KiB entries) does it not fit one: values stop short of
  // 64 KiB there, refused as any value too large to store.
  if (st.code() == Err::kTooBig) st = Err::kNoSpace;
  TFS_TRY(st);
  DebugNoSharedLock();
  return tx.Commit().status();
}

// An inline value is one key, read without a lock. A chunked value is many:
// read under the inode lock, which every change of them holds across its
// commit, so the chunks always match their descriptor (a mismatch is
// corruption, never a race). A size query (cap 0) reads the descriptor alone.
Result<u32> Filesystem::GetXattr(u64 ino, const char* name, u32 len, void* buf, u32 cap) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if (name != nullptr && IsOptXattr(name, len)) return GetOption(ino, name, len, buf, cap);
  TFS_TRY(CheckXattrName(name, len));
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  Entry e;
  XattrChunksFormat chunks;
  TFS_TRY(FindEntry(trees_, XattrTable(ino, f), name, len, &e, &chunks));
  if (!e.found) return Err::kNoData;
  if (chunks.value_len.get() == 0) {
    bool chunked = false;
    auto r = ReadInlineXattr(trees_, XattrTable(ino, f), e.slot, name, len, buf, cap, &chunked);
    if (!chunked) return r;
  } else if (cap == 0) {
    return chunks.value_len.get();
  }
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  TFS_TRY(ReadInode(ino, &f));
  const NameTable t = XattrTable(ino, f);
  TFS_TRY(FindEntry(trees_, t, name, len, &e, &chunks));
  if (!e.found) return Err::kNoData;
  if (chunks.value_len.get() == 0) {
    bool chunked = false;
    return ReadInlineXattr(trees_, t, e.slot, name, len, buf, cap, &chunked);
  }
  const u32 n = chunks.value_len.get();
  if (cap == 0) return n;
  if (cap < n) return Err::kRange;
  TFS_TRY(ReadXattrChunks(trees_, ino, chunks, static_cast<u8*>(buf)));
  return n;
}

Result<u32> Filesystem::ListXattr(u64 ino, char* buf, u32 cap, bool trusted) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const NameTable t = XattrTable(ino, f);
  Iterator it(trees_, btree::kBtreeXattrs);
  TFS_TRY(it.Seek(XattrPos(ino, 0)));
  u32 total = 0;
  // The table's slots only (chunk keys follow them, from kSlotEnd on).
  for (; it.Valid() && it.pos().inode == ino && it.pos().offset < kSlotEnd; TFS_TRY(it.Next())) {
    DirentFormat d;
    const char* nm;
    TFS_TRY(ParseNamed(t, it.value(), it.val_bytes(), &d, &nm));
    if (d.type == kDtTombstone) continue;
    if (!trusted && d.name_len >= 8 && MemCompare(nm, "trusted.", 8) == 0) continue;
    if (cap != 0) {
      if (total + d.name_len + 1 > cap) return Err::kRange;
      MemCopy(buf + total, nm, d.name_len);
      buf[total + d.name_len] = '\0';
    }
    total += d.name_len + 1;
  }
  return ListOptions(f, buf, cap, total);  // the options' names last
}

Status Filesystem::QueueRemoveXattr(Transaction* tx, const NameTable& t, const Entry& e,
                                    const XattrChunksFormat& chunks) {
  TFS_TRY(QueueRemoveEntry(trees_, tx, t.btree_id, t.owner, e.slot));
  for (u32 i = 0; i < XattrChunkCount(chunks.value_len.get()); i++)
    TFS_TRY(tx->Delete(XattrPos(t.owner, XattrChunkOffset(chunks.id.get(), i))));
  return Status::Ok();
}

Status Filesystem::RemoveXattr(u64 ino, const char* name, u32 len, OptionCaller* who) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if (name != nullptr && IsOptXattr(name, len)) return ChangeOption(ino, name, len, nullptr, 0, 0, true, who);
  TFS_TRY(CheckXattrName(name, len));
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const NameTable t = XattrTable(ino, f);
  Entry e;
  XattrChunksFormat chunks;
  TFS_TRY(FindEntry(trees_, t, name, len, &e, &chunks));
  if (!e.found) return Err::kNoData;
  Transaction tx(trees_);
  TFS_TRY(QueueRemoveXattr(&tx, t, e, chunks));
  if (IsCapsName(name, len)) f.flags.set(u16(f.flags.get() & ~kInodeFlagCaps));
  SetTime(&f.ctime_ns, Now());
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  return tx.Commit().status();
}

}  // namespace tfs::posix
