// The POSIX namespace over the btrees (see fs.h and docs/design/posix.md).
#include "posix/fs.h"

#include "journal/format.h"
#include "platform/platform.h"
#include "sb/format.h"
#include "util/bits.h"

namespace tfs::posix {

using btree::Iterator;
using btree::Pos;
using btree::Transaction;

namespace {

// The slow-member rule's check (fs.h): posix's shared mutexes -- the open and
// lock tables' -- count themselves held per thread in debug builds, and every
// commit and data write asserts that the count is zero.
#ifndef NDEBUG
void DebugNoSharedLock() { TFS_BUG_ON(*tfs_plat_thread_word() != 0); }
#else
void DebugNoSharedLock() {}
#endif

// A mutex held for the scope, or nothing (with a NoFsScope, as MutexLock).
class OptionalLock {
 public:
  OptionalLock(Mutex& m, bool take) : m_(take ? &m : nullptr) {
    if (m_ != nullptr) m_->Lock();
  }
  ~OptionalLock() {
    if (m_ != nullptr) m_->Unlock();
  }
  OptionalLock(const OptionalLock&) = delete;
  OptionalLock& operator=(const OptionalLock&) = delete;

 private:
  Mutex* m_;
  platform::NoFsScope nofs_;
};

class SharedLock {
 public:
  explicit SharedLock(Mutex& m) : m_(m) {
    m_.Lock();
#ifndef NDEBUG
    ++*tfs_plat_thread_word();
#endif
  }
  ~SharedLock() {
#ifndef NDEBUG
    --*tfs_plat_thread_word();
#endif
    m_.Unlock();
  }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  Mutex& m_;
  platform::NoFsScope nofs_;
};


constexpr u32 kLinkMax = 65000;  // links of one inode (EMLINK beyond)
constexpr u64 kMaxFileSize = u64(1) << 50;  // bytes (EFBIG beyond)
constexpr u32 kBlock = data::kBlockSize;
constexpr u32 kWriteChunkBlocks = 256;  // blocks per write transaction (1 MiB)
constexpr u32 kBatchExtents = 256;      // extent keys per transaction of a truncate, punch or free
constexpr u32 kBufferBlocks = data::kMaxExtentBlocks;  // a write buffer: one extent's worth
// A symlink's target is kept in keys (ino, 1), (ino, 2), ... of this many bytes.
constexpr u32 kLinkChunk = btree::kMaxValueBytes;
constexpr u32 kSymlinkTargetMax = kSymlinkMax;
constexpr u32 kLinkChunks = (kSymlinkTargetMax + kLinkChunk - 1) / kLinkChunk;
// Freeing an inode is one transaction (QueueFree): its inode and orphan keys,
// its symlink target and every xattr key, as whiteouts, fit the smallest
// journal entry (a 64 KiB bucket's).
static_assert(sizeof(journal::EntryHeader) + (2 + kLinkChunks + kMaxXattrs + kMaxXattrChunks) *
                                                 journal::KeySpace(sizeof(btree::KeyHeader)) <=
                  sb::kMinBucket,
              "freeing an inode fits one journal entry");

Pos InodePos(u64 ino) { return Pos{btree::kBtreeInodes, ino, 0}; }
Pos LinkPos(u64 ino, u32 chunk) { return Pos{btree::kBtreeInodes, ino, 1 + u64(chunk)}; }
Pos OrphanPos(u64 ino) { return Pos{btree::kBtreeInodes, 0, ino}; }
Pos DirentPos(u64 dir, u64 slot) { return Pos{btree::kBtreeDirents, dir, slot}; }

bool IsDir(const InodeFormat& f) { return (f.mode.get() & kModeTypeMask) == kModeDir; }

// Name rules shared by every operation: 1..kNameMax bytes, no '/' or NUL.
Status CheckName(const char* name, u32 len) {
  if (name == nullptr || len == 0) return Err::kInvalidArgument;
  if (len > kNameMax) return Err::kNameTooLong;
  for (u32 i = 0; i < len; i++)
    if (name[i] == '/' || name[i] == '\0') return Err::kInvalidArgument;
  return Status::Ok();
}

bool IsDot(const char* name, u32 len) { return len == 1 && name[0] == '.'; }
bool IsDotDot(const char* name, u32 len) { return len == 2 && name[0] == '.' && name[1] == '.'; }

void SetTime(Le64* f, i64 ns) { f->set(u64(ns)); }

}  // namespace

u8 DirentTypeOf(u32 mode) {
  switch (mode & kModeTypeMask) {
    case kModeReg: return kDtReg;
    case kModeDir: return kDtDir;
    case kModeLink: return kDtLink;
    case kModeChar: return kDtChar;
    case kModeBlock: return kDtBlock;
    case kModeFifo: return kDtFifo;
    case kModeSock: return kDtSock;
    default: return kDtUnknown;
  }
}

Status ParseInode(const u8* value, u32 len, InodeFormat* out) {
  if (len != sizeof(InodeFormat)) return Err::kCorrupt;
  MemCopy(out, value, sizeof(*out));
  if (out->version.get() != kInodeVersion || (out->flags.get() & ~kInodeFlagsKnown) != 0) return Err::kCorrupt;
  if (DirentTypeOf(out->mode.get()) == kDtUnknown || (out->mode.get() & ~(kModeTypeMask | kModePermMask)) != 0)
    return Err::kCorrupt;
  const bool dir = (out->mode.get() & kModeTypeMask) == kModeDir;
  if (dir ? (out->hash_bits < 1 || out->hash_bits > 62) : out->hash_bits != 0) return Err::kCorrupt;
  if (out->xattr_bits < 1 || out->xattr_bits > 62) return Err::kCorrupt;
  return Status::Ok();
}

Attr ToAttr(u64 ino, const InodeFormat& f) {
  Attr a;
  a.ino = ino;
  a.generation = f.generation.get();
  a.mode = f.mode.get();
  a.uid = f.uid.get();
  a.gid = f.gid.get();
  a.nlink = f.nlink.get();
  a.size = f.size.get();
  a.sectors = f.sectors.get();
  a.rdev = f.rdev.get();
  a.atime_ns = i64(f.atime_ns.get());
  a.mtime_ns = i64(f.mtime_ns.get());
  a.ctime_ns = i64(f.ctime_ns.get());
  a.btime_ns = i64(f.btime_ns.get());
  return a;
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
    if (out->ino.get() == 0 || out->type == kDtUnknown || out->value_len.get() != 0) return Err::kCorrupt;
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

// --- name tables: directories and xattrs ---------------------------------------

// What FindEntry learns of one name's probe chain.
struct Filesystem::Entry {
  bool found = false;
  u64 slot = 0;    // found: the entry's slot
  u64 ino = 0;     // found: the inode it names (directories)
  u8 type = 0;     // found: its DirentType (directories)
  u64 free = 0;    // not found: where the name would go (0: the chain reached kSlotEnd)
};

namespace {

Status ParseNamed(const NameTable& t, const u8* v, u32 len, DirentFormat* out, const char** name,
                  const u8** value = nullptr) {
  return ParseNamedEntry(t.btree_id, v, len, out, name, value);
}

// A named entry (header, name, value) in buf.
u32 BuildNamed(u8* buf, u64 ino, u8 type, const char* name, u32 len, const void* value = nullptr,
               u32 value_len = 0) {
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

constexpr u32 kDirentMax = u32(sizeof(DirentFormat)) + kNameMax;

}  // namespace

NameTable DirTable(u64 dir, const InodeFormat& d) {
  return NameTable{btree::kBtreeDirents, dir, d.hash_seed.get(), d.hash_bits};
}

NameTable XattrTable(u64 ino, const InodeFormat& f) {
  return NameTable{btree::kBtreeXattrs, ino, Mix64(ino * 0x9e3779b97f4a7c15ull ^ f.generation.get()), f.xattr_bits};
}

// Walks the probe chain of `name` from its home slot.
Status Filesystem::FindEntry(const NameTable& t, const char* name, u32 len, Entry* out, XattrChunksFormat* chunks) {
  *out = Entry{};
  if (chunks != nullptr) MemSet(chunks, 0, sizeof(*chunks));
  const u64 home = NameHash(t.seed, t.bits, name, len);
  Iterator it(trees_, t.btree_id);
  TFS_TRY(it.Seek(Pos{t.btree_id, t.owner, home}));
  for (u64 slot = home; slot < kSlotEnd; slot++) {
    if (!it.Valid() || it.pos().inode != t.owner || it.pos().offset != slot) {
      if (out->free == 0) out->free = slot;  // the gap that ends the chain
      return Status::Ok();
    }
    DirentFormat d;
    const char* n;
    const u8* value;
    TFS_TRY(ParseNamed(t, it.value(), it.val_bytes(), &d, &n, &value));
    if (d.type == kDtTombstone) {
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

Status Filesystem::QueueRemoveEntry(Transaction* tx, const NameTable& t, const Entry& e) {
  // Another chain may run on through the next slot: then keep this one occupied.
  // (No slot is at kSlotEnd: xattr chunk keys are.)
  Iterator it(trees_, t.btree_id);
  TFS_TRY(it.Seek(Pos{t.btree_id, t.owner, e.slot + 1}));
  if (it.Valid() && it.pos().inode == t.owner && it.pos().offset == e.slot + 1 && e.slot + 1 < kSlotEnd) {
    u8 buf[sizeof(DirentFormat)];
    DirentFormat d;
    MemSet(&d, 0, sizeof(d));
    d.type = kDtTombstone;
    MemCopy(buf, &d, sizeof(d));
    return tx->Set(Pos{t.btree_id, t.owner, e.slot}, buf, sizeof(buf));
  }
  // The chain ends here: drop the entry and the tombstones right before it.
  TFS_TRY(tx->Delete(Pos{t.btree_id, t.owner, e.slot}));
  TFS_TRY(it.SeekForPrev(Pos{t.btree_id, t.owner, e.slot - 1}));
  for (u64 slot = e.slot - 1; it.Valid() && it.pos().inode == t.owner && it.pos().offset == slot; slot--) {
    DirentFormat d;
    const char* n;
    TFS_TRY(ParseNamed(t, it.value(), it.val_bytes(), &d, &n));
    if (d.type != kDtTombstone) break;
    TFS_TRY(tx->Delete(Pos{t.btree_id, t.owner, slot}));
    TFS_TRY(it.Prev());
  }
  return Status::Ok();
}

// --- inodes --------------------------------------------------------------------

// Per-inode locks (fs.h, "Concurrency"). An entry lives in its stripe's table
// while any operation holds or waits for one of its locks (refs, under
// locks_mu_); the last user keeps it as a spare or frees it.
struct Filesystem::InodeLocks {
  u64 ino = 0;
  u32 refs = 0;
  Mutex inode;  // metadata changes of the inode
  RwLock data;  // a regular file's data and size (see "Locking")
};

Filesystem::~Filesystem() {
  // Without Unmount (a test's crash): buffered data is lost, as in a crash.
  StopFlusher();
  for (u32 i = 0; i < kStripes; i++) {
    for (const OpenCount& o : open_[i]) FreeBuffer(o.buf);
    open_[i].Resize(0).IgnoreError();
    TFS_BUG_ON(!locks_[i].empty());  // an operation still running
    for (InodeLocks* e : spare_locks_[i]) platform::Delete(e);
    spare_locks_[i].Resize(0).IgnoreError();
  }
}

i64 Filesystem::Now() const { return platform::RealTimeNs(); }

u64 Filesystem::AllocIno() { return next_ino_.FetchAdd(1, MemOrder::kRelaxed); }

u32 Filesystem::NextGeneration() { return next_gen_.FetchAdd(1, MemOrder::kRelaxed); }

Status Filesystem::ReadInode(u64 ino, InodeFormat* out, char* link, u32* link_len) {
  if (ino == 0) return Err::kNotFound;
  u8 buf[sizeof(InodeFormat) + 8];
  auto r = trees_->Get(InodePos(ino), buf, sizeof(buf));
  if (!r.ok()) return r.status();
  TFS_TRY(ParseInode(buf, Min(r.value(), u32(sizeof(buf))), out));
  if (link == nullptr) return Status::Ok();
  // A symlink's target, chunk by chunk; its length is the inode's size.
  const u64 size = out->size.get();
  if ((out->mode.get() & kModeTypeMask) != kModeLink || size == 0 || size > kSymlinkTargetMax) return Err::kCorrupt;
  u32 got = 0;
  for (u32 c = 0; got < size; c++) {
    auto rc = trees_->Get(LinkPos(ino, c), link + got, kSymlinkTargetMax - got);
    if (!rc.ok()) return rc.status().Is(ErrorClass::kNotFound) ? Status(Err::kCorrupt) : rc.status();
    const u32 want = Min(u32(size) - got, kLinkChunk);
    if (rc.value() != want) return Err::kCorrupt;
    got += want;
  }
  *link_len = got;
  return Status::Ok();
}

Status Filesystem::ReadDirInode(u64 dir, InodeFormat* out) {
  TFS_TRY(ReadInode(dir, out));
  if (!IsDir(*out)) return Err::kNotDir;
  if (out->nlink.get() == 0) return Err::kNotFound;  // removed, still open
  return Status::Ok();
}

bool Filesystem::IsOpen(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s])
    if (o.ino == ino) return true;
  return false;
}

Status Filesystem::QueueFree(Transaction* tx, u64 ino) {
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  if (st.ok() && (f.mode.get() & kModeTypeMask) == kModeLink)
    for (u32 c = 0; c < kLinkChunks; c++) TFS_TRY(tx->Delete(LinkPos(ino, c)));
  // Its xattrs: the table (at most kMaxXattrs keys, tombstones included) and
  // the chunks of its chunked values (at most kMaxXattrChunks), all in this
  // transaction (format.h: it fits the smallest journal entry).
  Iterator it(trees_, btree::kBtreeXattrs);
  TFS_TRY(it.Seek(Pos{btree::kBtreeXattrs, ino, 0}));
  for (; it.Valid() && it.pos().inode == ino; TFS_TRY(it.Next())) TFS_TRY(tx->Delete(it.pos()));
  // (Its file data went first: FinishFree.)
  TFS_TRY(tx->Delete(InodePos(ino)));
  return tx->Delete(OrphanPos(ino));
}

Status Filesystem::QueueUnlinked(Transaction* tx, u64 ino, InodeFormat* f, bool* freed) {
  *freed = false;
  if (f->nlink.get() > 0) return tx->Set(InodePos(ino), f, sizeof(*f));
  // Orphaned in this commit; freed after it (FinishFree) unless a handle is
  // open: its data may take several transactions, and a crash between them
  // leaves the orphan for the next mount to finish.
  *freed = !IsOpen(ino);
  TFS_TRY(tx->Set(InodePos(ino), f, sizeof(*f)));
  u8 v[8];
  Le64 le;
  le.set(ino);
  MemCopy(v, &le, 8);
  return tx->Set(OrphanPos(ino), v, sizeof(v));
}

Status Filesystem::FinishFree(u64 ino) {
  // Its data, a batch of extents per transaction. Each batch also sets the
  // inode's sector count to what is left: a crash between batches leaves an
  // orphan whose count matches its extents (fsck checks it; the next mount
  // finishes the free). Nothing else reaches the inode (no entry, no handle),
  // so no lock is taken.
  for (;;) {
    auto has = data_->HasData(ino);
    if (!has.ok()) return has.status();
    if (!has.value()) break;
    Transaction tx(trees_);
    data::Delta delta;
    TFS_TRY(data_->QueuePunch(&tx, ino, 0, ~u64(0), &delta, kBatchExtents));
    InodeFormat f;
    Status rd = ReadInode(ino, &f);
    if (rd.ok()) {
      f.sectors.set(u64(Max<i64>(0, i64(f.sectors.get()) + delta.sectors)));
      rd = tx.Set(InodePos(ino), &f, sizeof(f));
    }
    if (!rd.ok() && !rd.Is(ErrorClass::kNotFound)) {
      data_->Abort(delta);
      return rd;
    }
    DebugNoSharedLock();
    TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
  }
  Transaction tx(trees_);
  TFS_TRY(QueueFree(&tx, ino));
  DebugNoSharedLock();
  TFS_TRY(tx.Commit().status());
  NoteFreed(true);
  return Status::Ok();
}


Filesystem::InodeLocks* Filesystem::AcquireLocks(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(locks_mu_[s]);
  for (InodeLocks* e : locks_[s]) {
    if (e->ino == ino) {
      e->refs++;
      return e;
    }
  }
  if (locks_[s].size() == locks_[s].capacity() && !locks_[s].Reserve(locks_[s].size() * 2 + 4).ok()) return nullptr;
  InodeLocks* e = nullptr;
  if (!spare_locks_[s].empty()) {
    e = spare_locks_[s].back();
    spare_locks_[s].PopBack();
  } else {
    e = platform::New<InodeLocks>();
    if (e == nullptr) return nullptr;
  }
  e->ino = ino;
  e->refs = 1;
  locks_[s].PushBack(e).IgnoreError();  // capacity reserved above
  return e;
}

void Filesystem::ReleaseLocks(InodeLocks* e) {
  const u32 s = Stripe(e->ino);
  {
    SharedLock l(locks_mu_[s]);
    if (--e->refs != 0) return;
    Vector<InodeLocks*>& v = locks_[s];
    for (usize i = 0; i < v.size(); i++) {
      if (v[i] != e) continue;
      v[i] = v[v.size() - 1];
      v.PopBack();
      break;
    }
    if (spare_locks_[s].size() < 8 && spare_locks_[s].PushBack(e).ok()) return;
  }
  platform::Delete(e);
}

// The inode locks of up to four inodes, in ascending inode order. status() is
// kNoMemory if an entry could not be made (nothing is held then).
struct Filesystem::Locked {
  Locked(Filesystem* fs, const u64* inos, u32 n) : fs_(fs) {
    u64 want[4] = {};
    u32 m = 0;
    for (u32 i = 0; i < n; i++) {
      if (inos[i] == 0) continue;
      bool dup = false;
      for (u32 j = 0; j < m; j++) dup |= want[j] == inos[i];
      if (!dup) want[m++] = inos[i];
    }
    for (u32 i = 1; i < m; i++)  // insertion sort: at most four
      for (u32 j = i; j > 0 && want[j - 1] > want[j]; j--) Swap(want[j - 1], want[j]);
    for (u32 i = 0; i < m; i++) {
      InodeLocks* e = fs_->AcquireLocks(want[i]);
      if (e == nullptr) {
        Unlock();
        status_ = Err::kNoMemory;
        return;
      }
      held_[n_++] = e;
    }
    for (u32 i = 0; i < n_; i++) held_[i]->inode.Lock();
    locked_ = true;
  }
  ~Locked() { Unlock(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  Status status() const { return status_; }

 private:
  void Unlock() {
    for (u32 i = n_; i-- > 0;) {
      if (locked_) held_[i]->inode.Unlock();
      fs_->ReleaseLocks(held_[i]);
    }
    n_ = 0;
  }
  platform::NoFsScope nofs_;  // first: it covers taking the locks
  Filesystem* fs_;
  InodeLocks* held_[4] = {};
  u32 n_ = 0;
  bool locked_ = false;
  Status status_;
};

// One inode's data lock, shared or exclusive; ino 0 holds nothing. status() is
// kNoMemory if the lock entry could not be made (nothing is held then).
class Filesystem::DataGuard {
 public:
  DataGuard(Filesystem* fs, u64 ino, bool exclusive) : fs_(fs), exclusive_(exclusive) {
    if (ino == 0) return;
    e_ = fs_->AcquireLocks(ino);
    if (e_ == nullptr) {
      status_ = Err::kNoMemory;
      return;
    }
    if (exclusive_) {
      e_->data.WriteLock();
    } else {
      e_->data.ReadLock();
    }
  }
  ~DataGuard() {
    if (e_ == nullptr) return;
    if (exclusive_) {
      e_->data.WriteUnlock();
    } else {
      e_->data.ReadUnlock();
    }
    fs_->ReleaseLocks(e_);
  }
  DataGuard(const DataGuard&) = delete;
  DataGuard& operator=(const DataGuard&) = delete;
  Status status() const { return status_; }

 private:
  platform::NoFsScope nofs_;  // first: it covers taking the lock
  Filesystem* fs_;
  bool exclusive_;
  InodeLocks* e_ = nullptr;
  Status status_;
};

// --- mount ---------------------------------------------------------------------

Status Filesystem::Mount(store::Store* store, data::DataPath* data, const Options& options) {
  if (store_ != nullptr || store == nullptr || !store->open()) return Err::kInvalidArgument;
  if (data == nullptr || data->store() != store) return Err::kInvalidArgument;
  if (options.dir_hash_bits < 1 || options.dir_hash_bits > 62) return Err::kInvalidArgument;
  opt_ = options;
  store_ = store;
  data_ = data;
  trees_ = &store->btrees();
  compress_all_ = store->sb().options.compression == sb::CompressionType::kZstd;
  next_gen_.Store(u32(u64(Now()) / platform::kNsPerSec), MemOrder::kRelaxed);
  Status st = [&]() -> Status {
    // Orphans a crash left: inodes unlinked while open, or not yet freed whole.
    Iterator it(trees_, btree::kBtreeInodes);
    TFS_TRY(it.Seek(OrphanPos(1)));
    Vector<u64> orphans;
    for (; it.Valid() && it.pos().inode == 0; TFS_TRY(it.Next())) TFS_TRY(orphans.PushBack(it.pos().offset));
    for (u64 ino : orphans) {
      TFS_TRY(FinishFree(ino));
      ctr_.orphans_freed.FetchAdd(1, MemOrder::kRelaxed);
    }
    // The format's features, before anything of theirs is written.
    // kSbCapsFlagged only once every flag is durable (the superblock's own
    // write is FUA, the flags' commits are not), and only if every inode
    // could be flagged (a damaged one is fsck's: the next mount tries again).
    if (!store->read_only() && (store->sb().flags & kSbFeatures) != kSbFeatures) {
      TFS_TRY(store->AddFeatures(sb::kSbXattrChunks));
      bool complete = false;
      TFS_TRY(FlagCapsInodes(&complete));
      TFS_TRY(store->journal().Flush());
      if (complete) TFS_TRY(store->AddFeatures(sb::kSbCapsFlagged));
    }
    // Inodes in use, and the next number (numbers are not reused within a mount).
    u64 count = 0;
    u64 last = kRootIno;
    TFS_TRY(it.Seek(InodePos(1)));
    for (; it.Valid(); TFS_TRY(it.Next())) {
      if (it.pos().offset != 0) continue;  // a symlink's target
      count++;
      last = it.pos().inode;
    }
    next_ino_.Store(Max(last + 1, kFirstIno), MemOrder::kRelaxed);
    InodeFormat root;
    Status rs = ReadInode(kRootIno, &root);
    if (rs.ok()) {
      inodes_.Store(count, MemOrder::kRelaxed);
      return IsDir(root) ? Status::Ok() : Status(Err::kCorrupt);
    }
    if (!rs.Is(ErrorClass::kNotFound)) return rs;
    if (count != 0) return Err::kCorrupt;  // inodes but no root
    // A new filesystem: its root directory.
    MemSet(&root, 0, sizeof(root));
    root.version.set(kInodeVersion);
    root.mode.set(kModeDir | 0755);
    root.uid.set(opt_.root_owner.uid);
    root.gid.set(opt_.root_owner.gid);
    root.nlink.set(2);
    root.generation.set(NextGeneration());
    const i64 now = Now();
    SetTime(&root.atime_ns, now);
    SetTime(&root.mtime_ns, now);
    SetTime(&root.ctime_ns, now);
    SetTime(&root.btime_ns, now);
    root.parent.set(kRootIno);
    root.hash_seed.set(Mix64(u64(now) ^ 0x726f6f74));
    root.hash_bits = u8(opt_.dir_hash_bits);
    root.xattr_bits = u8(opt_.dir_hash_bits);
    Transaction tx(trees_);
    TFS_TRY(tx.Set(InodePos(kRootIno), &root, sizeof(root)));
    DebugNoSharedLock();
    TFS_TRY(tx.Commit().status());
    inodes_.Store(1, MemOrder::kRelaxed);
    return Status::Ok();
  }();
  if (st.ok() && opt_.write_buffers > 0) {
    flusher_stop_.Store(false, MemOrder::kRelaxed);
    st = flusher_.Start(&FlusherMain, this, "tfs-flush");
    // (A platform that cannot take the hook leaves the buffers to their bound.)
    Status sh = st.ok() ? shrinker_.Register(&BufferPages, &AskShrink, this, "write-buffer") : Status::Ok();
    if (!sh.ok())
      platform::Log(platform::LogLevel::kWarn, "posix: no memory-pressure hook for the write buffer: %s", sh.Message());
  }
  if (!st.ok()) {
    data_ = nullptr;
    store_ = nullptr;
    trees_ = nullptr;
  }
  return st;
}

Status Filesystem::FlagCapsInodes(bool* complete) {
  *complete = true;
  Vector<u64> inos;  // ascending: the xattrs btree's order
  Iterator it(trees_, btree::kBtreeXattrs);
  TFS_TRY(it.SeekToFirst());
  for (; it.Valid(); TFS_TRY(it.Next())) {
    const Pos p = it.pos();
    if (p.offset >= kXattrChunkBase) continue;  // (none without the feature; fsck's to judge)
    if (!inos.empty() && inos[inos.size() - 1] == p.inode) continue;
    DirentFormat e;
    const char* name;
    const u8* after;
    // A key that does not parse is fsck's to report: the flag follows the
    // names that do.
    if (!ParseNamedEntry(btree::kBtreeXattrs, it.value(), it.val_bytes(), &e, &name, &after).ok()) continue;
    if (e.type != kDtTombstone && IsCapsName(name, e.name_len)) TFS_TRY(inos.PushBack(p.inode));
  }
  constexpr u32 kBatch = 64;  // inodes a transaction
  for (u64 i = 0; i < inos.size(); i += kBatch) {
    Transaction tx(trees_);
    u32 n = 0;
    for (u64 j = i; j < inos.size() && j < i + kBatch; j++) {
      InodeFormat f;
      Status st = ReadInode(inos[j], &f);
      if (st.Is(ErrorClass::kNotFound)) continue;  // keys of no inode: fsck's
      if (st.Is(ErrorClass::kCorrupt)) {  // fsck's; the mount serves the rest
        platform::Log(platform::LogLevel::kError,
                      "posix: inode %llu has a security.capability xattr but cannot be read to flag it: %s "
                      "(run fsck; the next mount tries again)",
                      (unsigned long long)inos[j], st.Message());
        *complete = false;
        continue;
      }
      TFS_TRY(st);
      if ((f.flags.get() & kInodeFlagCaps) != 0) continue;  // an earlier, cut run
      f.flags.set(u16(f.flags.get() | kInodeFlagCaps));
      TFS_TRY(tx.Set(InodePos(inos[j]), &f, sizeof(f)));
      n++;
    }
    if (n == 0) continue;
    DebugNoSharedLock();
    TFS_TRY(tx.Commit().status());
    ctr_.caps_flagged.FetchAdd(n, MemOrder::kRelaxed);
  }
  return Status::Ok();
}

Status Filesystem::Unmount() {
  if (store_ == nullptr) return Status::Ok();
  Status first;
  StopFlusher();
  for (u32 s = 0; s < kStripes; s++) {
    // Buffered data first, while the entries still show it to readers.
    for (u32 i = 0;; i++) {
      u64 ino;
      {
        SharedLock l(open_mu_[s]);
        if (i >= open_[s].size()) break;
        ino = open_[s][i].ino;
      }
      DataGuard data(this, ino, true);
      Status st = data.status();
      InodeFormat f;
      if (st.ok()) st = ReadInode(ino, &f);
      if (st.ok() && f.nlink.get() != 0) st = FlushRun(ino, FindBuffer(ino, false), kFlushClose);
      if (st.Is(ErrorClass::kNotFound)) st = Status::Ok();
      if (first.ok() && !st.ok()) first = st;
    }
    Vector<OpenCount> open;
    {
      SharedLock l(open_mu_[s]);
      Swap(open, open_[s]);
    }
    for (const OpenCount& o : open) {
      FreeBuffer(o.buf);
      InodeFormat f;
      Status st = ReadInode(o.ino, &f);
      if (st.ok() && f.nlink.get() == 0) {
        st = FinishFree(o.ino);
      } else if (st.Is(ErrorClass::kNotFound)) {
        st = Status::Ok();
      }
      if (first.ok() && !st.ok()) first = st;
    }
  }
  ctr_.open_inodes.Store(0, MemOrder::kRelaxed);
  data_ = nullptr;  // (the mount's: it closes the data path after posix)
  store_ = nullptr;
  trees_ = nullptr;
  return first;
}

// --- lookups -------------------------------------------------------------------

Result<Attr> Filesystem::GetAttr(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  Attr a = ToAttr(ino, f);
  if ((f.mode.get() & kModeTypeMask) == kModeReg) OverlayBuffered(ino, &a);
  return a;
}

Result<Attr> Filesystem::Lookup(u64 dir, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  ctr_.lookups.FetchAdd(1, MemOrder::kRelaxed);
  TFS_TRY(CheckName(name, len));
  InodeFormat d;
  TFS_TRY(ReadDirInode(dir, &d));
  if (IsDot(name, len)) return ToAttr(dir, d);
  if (IsDotDot(name, len)) return GetAttr(d.parent.get());
  Entry e;
  TFS_TRY(FindEntry(DirTable(dir, d), name, len, &e));
  if (!e.found) return Err::kNotFound;
  InodeFormat f;
  Status st = ReadInode(e.ino, &f);
  if (st.Is(ErrorClass::kNotFound)) return Err::kCorrupt;  // an entry naming no inode
  TFS_TRY(st);
  if (DirentTypeOf(f.mode.get()) != e.type) return Err::kCorrupt;
  Attr a = ToAttr(e.ino, f);
  if (e.type == kDtReg) OverlayBuffered(e.ino, &a);
  return a;
}

Result<u32> Filesystem::ReadLink(u64 ino, char* buf, u32 cap) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if ((f.mode.get() & kModeTypeMask) != kModeLink) return Err::kInvalidArgument;
  char* target = static_cast<char*>(platform::Alloc(kSymlinkTargetMax, 8));
  if (target == nullptr) return Err::kNoMemory;
  u32 len = 0;
  Status st = ReadInode(ino, &f, target, &len);
  if (st.ok()) MemCopy(buf, target, Min(len, cap));
  platform::Free(target);
  TFS_TRY(st);
  return len;
}

Status Filesystem::ReadDir(u64 dir, u64 cookie, DirFiller fill, void* ctx) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  ctr_.readdirs.FetchAdd(1, MemOrder::kRelaxed);
  InodeFormat d;
  TFS_TRY(ReadInode(dir, &d));
  if (!IsDir(d)) return Err::kNotDir;
  if (d.nlink.get() == 0) return Status::Ok();  // removed, held open: nothing to list
  if (cookie == 0 && !fill(ctx, ".", 1, dir, kDtDir, 1)) return Status::Ok();
  if (cookie <= 1 && !fill(ctx, "..", 2, d.parent.get(), kDtDir, 2)) return Status::Ok();
  Iterator it(trees_, btree::kBtreeDirents);
  TFS_TRY(it.Seek(DirentPos(dir, Max(cookie, kFirstSlot))));
  for (; it.Valid() && it.pos().inode == dir; TFS_TRY(it.Next())) {
    DirentFormat e;
    const char* name;
    TFS_TRY(ParseNamed(DirTable(dir, d), it.value(), it.val_bytes(), &e, &name));
    if (e.type == kDtTombstone) continue;
    if (!fill(ctx, name, e.name_len, e.ino.get(), e.type, it.pos().offset + 1)) break;
  }
  return Status::Ok();
}

Status Filesystem::GetStatFs(StatFs* out) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  *out = StatFs{};
  const sb::Superblock& sb = store_->sb();
  out->block_size = 4096;
  const u64 per_bucket = sb.bucket_size / out->block_size;
  for (u32 m = 0; m < sb.nr_members; m++) {
    const alloc::DeviceUsage u = store_->alloc().Usage(m);
    const u64 free = u.by_state[u32(alloc::BucketState::kFree)];
    const u64 reserved = Min(free, u.reserves.foreground + u.reserves.copygc + u.reserves.btree);
    out->blocks += u.nbuckets * per_bucket;
    out->blocks_free += free * per_bucket;
    out->blocks_avail += (free - reserved) * per_bucket;
  }
  // Reserved (fallocated, unwritten) blocks are not free.
  const u64 reserved = data_->GetStats().blocks_reserved;
  out->blocks_free -= Min(out->blocks_free, reserved);
  out->blocks_avail -= Min(out->blocks_avail, reserved);
  // Inodes are btree records, not a preallocated table: one can be made
  // while there is space for its record, its entry and their keys. Count
  // kInodeCostBytes each (the 128-byte inode and a short entry with their
  // keys: the least one costs) of the space unprivileged writers have.
  // None while creates are refused for want of metadata room.
  constexpr u64 kInodeCostBytes = 256;
  out->files_free = store_->alloc().MetadataShort() ? 0 : out->blocks_avail * (out->block_size / kInodeCostBytes);
  out->files = inodes_.Load(MemOrder::kRelaxed) + out->files_free;
  return Status::Ok();
}

// --- creating ------------------------------------------------------------------

Status Filesystem::MetadataRoom() {
  return store_->alloc().MetadataRoom() ? Status::Ok() : Status(Err::kNoSpace);
}

Result<Attr> Filesystem::Create(u64 dir, const char* name, u32 len, u32 mode, u64 rdev, const char* target,
                                u32 target_len, const Caller& who, bool open_handle) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckName(name, len));
  TFS_TRY(MetadataRoom());
  if (IsDot(name, len) || IsDotDot(name, len)) return Err::kExists;
  const u8 type = DirentTypeOf(mode);
  if (type == kDtUnknown || (mode & ~(kModeTypeMask | kModePermMask)) != 0) return Err::kInvalidArgument;
  const bool is_dir = type == kDtDir;
  const u64 lock[1] = {dir};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat d;
  TFS_TRY(ReadDirInode(dir, &d));
  if (is_dir && d.nlink.get() >= kLinkMax) return Err::kTooManyLinks;
  Entry e;
  TFS_TRY(FindEntry(DirTable(dir, d), name, len, &e));
  if (e.found) return Err::kExists;
  if (e.free == 0) return Err::kNoSpace;  // the name's chain ran to the end of the slots
  const u64 ino = AllocIno();
  const i64 now = Now();
  InodeFormat f;
  MemSet(&f, 0, sizeof(f));
  f.version.set(kInodeVersion);
  u32 gid = who.gid;
  if ((d.mode.get() & kModeSetgid) != 0) {  // BSD group semantics for setgid directories
    gid = d.gid.get();
    if (is_dir) mode |= kModeSetgid;
  }
  f.mode.set(mode);
  f.uid.set(who.uid);
  f.gid.set(gid);
  f.nlink.set(is_dir ? 2 : 1);
  f.generation.set(NextGeneration());
  f.xattr_bits = u8(opt_.dir_hash_bits);
  f.size.set(target != nullptr ? target_len : 0);
  SetTime(&f.atime_ns, now);
  SetTime(&f.mtime_ns, now);
  SetTime(&f.ctime_ns, now);
  SetTime(&f.btime_ns, now);
  if (type == kDtChar || type == kDtBlock) f.rdev.set(rdev);
  if (is_dir) {
    f.parent.set(dir);
    f.hash_seed.set(Mix64(ino ^ u64(now) ^ 0x6469726563746f72ull));
    f.hash_bits = u8(opt_.dir_hash_bits);
  }
  Transaction tx(trees_);
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  for (u32 c = 0; target != nullptr && c * kLinkChunk < target_len; c++)
    TFS_TRY(tx.Set(LinkPos(ino, c), target + c * kLinkChunk, Min(target_len - c * kLinkChunk, kLinkChunk)));
  u8 dent[kDirentMax];
  TFS_TRY(tx.Set(DirentPos(dir, e.free), dent, BuildDirent(dent, ino, type, name, len)));
  if (is_dir) d.nlink.set(d.nlink.get() + 1);
  SetTime(&d.mtime_ns, now);
  SetTime(&d.ctime_ns, now);
  TFS_TRY(tx.Set(InodePos(dir), &d, sizeof(d)));
  // CreateOpen: the handle exists before the name does; the directory's lock
  // keeps every unlink of the name out until both are in place.
  if (open_handle) TFS_TRY(AddHandle(ino));
  DebugNoSharedLock();
  Status st = tx.Commit().status();
  if (!st.ok()) {
    if (open_handle) {  // the handle no operation has used: no buffer, never freeing
      bool last = false;
      Buffered* b = nullptr;
      (void)DropHandle(ino, &last, &b);
      TFS_BUG_ON(b != nullptr);
    }
    return st;
  }
  ctr_.creates.FetchAdd(1, MemOrder::kRelaxed);
  inodes_.FetchAdd(1, MemOrder::kRelaxed);
  return ToAttr(ino, f);
}

Result<Attr> Filesystem::Mknod(u64 dir, const char* name, u32 len, u32 mode, u64 rdev, const Caller& who) {
  const u32 type = mode & kModeTypeMask;
  if (type == kModeDir || type == kModeLink) return Err::kInvalidArgument;  // Mkdir, Symlink
  return Create(dir, name, len, type == 0 ? (mode | kModeReg) : mode, rdev, nullptr, 0, who);
}

Result<Attr> Filesystem::Mkdir(u64 dir, const char* name, u32 len, u32 mode, const Caller& who) {
  return Create(dir, name, len, kModeDir | (mode & kModePermMask), 0, nullptr, 0, who);
}

Result<Attr> Filesystem::Symlink(u64 dir, const char* name, u32 len, const char* target, u32 target_len,
                                 const Caller& who) {
  if (target == nullptr || target_len == 0) return Err::kInvalidArgument;
  if (target_len > kSymlinkTargetMax) return Err::kNameTooLong;
  return Create(dir, name, len, kModeLink | 0777, 0, target, target_len, who);
}

Result<Attr> Filesystem::Link(u64 ino, u64 dir, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckName(name, len));
  TFS_TRY(MetadataRoom());
  if (IsDot(name, len) || IsDotDot(name, len)) return Err::kExists;
  const u64 lock[2] = {dir, ino};
  Locked locked(this, lock, 2);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kPermission;  // no hard links to directories
  if (f.nlink.get() == 0) return Err::kNotFound;  // unlinked, only open
  if (f.nlink.get() >= kLinkMax) return Err::kTooManyLinks;
  InodeFormat d;
  TFS_TRY(ReadDirInode(dir, &d));
  Entry e;
  TFS_TRY(FindEntry(DirTable(dir, d), name, len, &e));
  if (e.found) return Err::kExists;
  if (e.free == 0) return Err::kNoSpace;
  const i64 now = Now();
  Transaction tx(trees_);
  u8 dent[kDirentMax];
  TFS_TRY(tx.Set(DirentPos(dir, e.free), dent, BuildDirent(dent, ino, DirentTypeOf(f.mode.get()), name, len)));
  f.nlink.set(f.nlink.get() + 1);
  SetTime(&f.ctime_ns, now);
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  SetTime(&d.mtime_ns, now);
  SetTime(&d.ctime_ns, now);
  TFS_TRY(tx.Set(InodePos(dir), &d, sizeof(d)));
  DebugNoSharedLock();
  TFS_TRY(tx.Commit().status());
  return ToAttr(ino, f);
}

// --- removing ------------------------------------------------------------------

namespace {

// Whether a directory has any entry (tombstones only exist before live entries:
// docs/format/inodes-extents.md, so any key means "not empty").
Status DirHasEntries(btree::Btrees* trees, u64 dir, bool* any) {
  Iterator it(trees, btree::kBtreeDirents);
  TFS_TRY(it.Seek(DirentPos(dir, 0)));
  *any = it.Valid() && it.pos().inode == dir;
  return Status::Ok();
}

}  // namespace

Status Filesystem::Unlink(u64 dir, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckName(name, len));
  if (IsDot(name, len) || IsDotDot(name, len)) return Err::kIsDir;
  return Remove(dir, name, len, false);
}

Status Filesystem::Rmdir(u64 dir, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckName(name, len));
  if (IsDot(name, len)) return Err::kInvalidArgument;
  if (IsDotDot(name, len)) return Err::kNotEmpty;
  return Remove(dir, name, len, true);
}

Status Filesystem::Remove(u64 dir, const char* name, u32 len, bool rmdir) {
  u64 to_free = 0;
  for (;;) {
    // Learn the target first, then lock directory and target together.
    InodeFormat d;
    TFS_TRY(ReadDirInode(dir, &d));
    Entry e;
    TFS_TRY(FindEntry(DirTable(dir, d), name, len, &e));
    if (!e.found) return Err::kNotFound;
    const u64 lock[2] = {dir, e.ino};
    Locked locked(this, lock, 2);
    TFS_TRY(locked.status());
    TFS_TRY(ReadDirInode(dir, &d));
    Entry again;
    TFS_TRY(FindEntry(DirTable(dir, d), name, len, &again));
    if (!again.found) return Err::kNotFound;
    if (again.ino != e.ino) continue;  // replaced meanwhile: lock the new target
    if (rmdir != (e.type == kDtDir)) return rmdir ? Err::kNotDir : Err::kIsDir;
    InodeFormat f;
    Status st = ReadInode(e.ino, &f);
    if (st.Is(ErrorClass::kNotFound)) return Err::kCorrupt;  // an entry naming no inode
    TFS_TRY(st);
    if (f.nlink.get() == 0) return Err::kCorrupt;
    if (rmdir) {
      bool any = false;
      TFS_TRY(DirHasEntries(trees_, e.ino, &any));
      if (any) return Err::kNotEmpty;
    }
    const i64 now = Now();
    Transaction tx(trees_);
    TFS_TRY(QueueRemoveEntry(&tx, DirTable(dir, d), again));
    f.nlink.set(rmdir ? 0 : f.nlink.get() - 1);
    SetTime(&f.ctime_ns, now);
    bool freed = false;
    TFS_TRY(QueueUnlinked(&tx, e.ino, &f, &freed));
    if (rmdir) d.nlink.set(d.nlink.get() - 1);  // its ".."
    SetTime(&d.mtime_ns, now);
    SetTime(&d.ctime_ns, now);
    TFS_TRY(tx.Set(InodePos(dir), &d, sizeof(d)));
    DebugNoSharedLock();
    TFS_TRY(tx.Commit().status());
    ctr_.unlinks.FetchAdd(1, MemOrder::kRelaxed);
    if (!freed) return Status::Ok();
    to_free = e.ino;
    break;  // (the directory's lock goes with the loop's scope)
  }
  return FreeUnlinked(to_free);
}

void Filesystem::NoteFreed(bool freed) {
  if (!freed) return;
  ctr_.inodes_freed.FetchAdd(1, MemOrder::kRelaxed);
  inodes_.FetchSub(1, MemOrder::kRelaxed);
}

// --- rename --------------------------------------------------------------------

namespace {

// The inodes one rename changes, each read once and written once.
struct InodeSet {
  struct Rec {
    u64 ino;
    InodeFormat f;
  };
  Rec recs[4];
  u32 n = 0;
  InodeFormat* Get(u64 ino) {
    for (u32 i = 0; i < n; i++)
      if (recs[i].ino == ino) return &recs[i].f;
    return nullptr;
  }
  InodeFormat* Add(u64 ino, const InodeFormat& f) {
    if (InodeFormat* have = Get(ino)) return have;
    recs[n].ino = ino;
    recs[n].f = f;
    return &recs[n++].f;
  }
};

}  // namespace

Status Filesystem::Rename(u64 old_dir, const char* old_name, u32 old_len, u64 new_dir, const char* new_name,
                          u32 new_len, u32 flags) {
  u64 to_free = 0;
  TFS_TRY(RenameEntries(old_dir, old_name, old_len, new_dir, new_name, new_len, flags, &to_free));
  return to_free != 0 ? FreeUnlinked(to_free) : Status::Ok();
}

Status Filesystem::FreeUnlinked(u64 ino) {
  // Unreachable now (no name, no handle): its data goes under its own lock
  // alone, after the directories' locks (and rename_mu_) are released -- a
  // large file's punch is many commits.
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  // A handle opened since the unlink decided (an open by number, an
  // opendir, which takes no lock): its last release frees it instead -- or
  // has already, under this lock before us.
  if (IsOpen(ino)) return Status::Ok();
  return FreeOrphan(ino);
}

Status Filesystem::FreeOrphan(u64 ino) {
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  if (st.Is(ErrorClass::kNotFound)) return Status::Ok();  // freed already: each inode once
  TFS_TRY(st);
  if (f.nlink.get() != 0) return Status::Ok();  // linked (or never unlinked): not an orphan
  return FinishFree(ino);
}

Status Filesystem::RenameEntries(u64 old_dir, const char* old_name, u32 old_len, u64 new_dir,
                                 const char* new_name, u32 new_len, u32 flags, u64* to_free) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckName(old_name, old_len));
  TFS_TRY(CheckName(new_name, new_len));
  if ((flags & ~u32(kRenameNoReplace | kRenameExchange)) != 0 ||
      (flags == (kRenameNoReplace | kRenameExchange)))
    return Err::kInvalidArgument;
  if (IsDot(old_name, old_len) || IsDotDot(old_name, old_len) || IsDot(new_name, new_len) ||
      IsDotDot(new_name, new_len))
    return Err::kInvalidArgument;
  // Parents do not change under the loop check: renames across directories
  // take rename_mu_ (held across their commit: the slow-member rule's one
  // exception, fs.h). One within a directory changes no parent and takes none,
  // as the VFS's lock_rename does.
  OptionalLock rename_lock(rename_mu_, old_dir != new_dir);
  InodeFormat od;
  InodeFormat nd;
  // Both directories and both names, as committed now.
  auto find = [&](Entry* s, Entry* d) -> Status {
    TFS_TRY(ReadDirInode(old_dir, &od));
    TFS_TRY(ReadDirInode(new_dir, &nd));
    TFS_TRY(FindEntry(DirTable(old_dir, od), old_name, old_len, s));
    if (!s->found) return Err::kNotFound;
    return FindEntry(DirTable(new_dir, nd), new_name, new_len, d);
  };
  for (;;) {
    Entry src;
    Entry dst;
    TFS_TRY(find(&src, &dst));
    const u64 lock[4] = {old_dir, new_dir, src.ino, dst.found ? dst.ino : 0};
    Locked locked(this, lock, 4);
    TFS_TRY(locked.status());
    // Again under the locks: retry if either name changed meanwhile.
    Entry s2;
    Entry d2;
    TFS_TRY(find(&s2, &d2));
    if (s2.ino != src.ino || d2.found != dst.found || (d2.found && d2.ino != dst.ino)) continue;
    src = s2;
    dst = d2;
    const bool same_dir = old_dir == new_dir;
    if (dst.found && dst.ino == src.ino) {  // the same inode (or even the same entry)
      if ((flags & kRenameNoReplace) != 0) return Err::kExists;
      return Status::Ok();
    }
    if ((flags & kRenameExchange) != 0 && !dst.found) return Err::kNotFound;
    if ((flags & kRenameNoReplace) != 0 && dst.found) return Err::kExists;
    const bool src_dir = src.type == kDtDir;
    const bool dst_dir = dst.found && dst.type == kDtDir;
    if (dst.found && (flags & kRenameExchange) == 0) {
      if (src_dir && !dst_dir) return Err::kNotDir;
      if (!src_dir && dst_dir) return Err::kIsDir;
      if (dst_dir) {
        bool any = false;
        TFS_TRY(DirHasEntries(trees_, dst.ino, &any));
        if (any) return Err::kNotEmpty;
      }
    }
    // No directory may move below itself: walk up from where each one goes.
    auto below = [&](u64 moved, u64 to, bool* is_below) -> Status {
      *is_below = false;
      for (u32 steps = 0; to != kRootIno; steps++) {
        if (to == moved) {
          *is_below = true;
          return Status::Ok();
        }
        if (steps > (1u << 20)) return Err::kCorrupt;  // a parent cycle
        InodeFormat p;
        TFS_TRY(ReadInode(to, &p));
        to = p.parent.get();
      }
      *is_below = moved == kRootIno;
      return Status::Ok();
    };
    bool loop = false;
    if (src_dir && !same_dir) TFS_TRY(below(src.ino, new_dir, &loop));
    if (!loop && dst_dir && (flags & kRenameExchange) != 0 && !same_dir) TFS_TRY(below(dst.ino, old_dir, &loop));
    if (loop) return Err::kInvalidArgument;

    const i64 now = Now();
    InodeSet set;
    InodeFormat* o = set.Add(old_dir, od);
    InodeFormat* n = set.Add(new_dir, nd);
    // The moved and the replaced inode, read into the set in place (copies
    // would take rename's frame past the kernel's 2 KiB).
    auto read = [&](u64 ino) -> Result<InodeFormat*> {
      if (InodeFormat* have = set.Get(ino)) return have;
      TFS_TRY(ReadInode(ino, &set.recs[set.n].f));
      set.recs[set.n].ino = ino;
      return &set.recs[set.n++].f;
    };
    Result<InodeFormat*> sr = read(src.ino);
    TFS_TRY(sr.status());
    InodeFormat* s = sr.value();
    InodeFormat* t = nullptr;
    if (dst.found) {
      Result<InodeFormat*> tr = read(dst.ino);
      if (tr.status().Is(ErrorClass::kNotFound)) return Err::kCorrupt;
      TFS_TRY(tr.status());
      t = tr.value();
    }
    Transaction tx(trees_);
    u8 dent[kDirentMax];
    bool freed = false;
    if ((flags & kRenameExchange) != 0) {
      // Both entries stay where they are and trade targets.
      TFS_TRY(tx.Set(DirentPos(old_dir, src.slot), dent, BuildDirent(dent, dst.ino, dst.type, old_name, old_len)));
      TFS_TRY(tx.Set(DirentPos(new_dir, dst.slot), dent, BuildDirent(dent, src.ino, src.type, new_name, new_len)));
      if (!same_dir && src_dir != dst_dir) {  // a directory changes parent, with its ".."
        InodeFormat* gains = src_dir ? n : o;
        InodeFormat* loses = src_dir ? o : n;
        gains->nlink.set(gains->nlink.get() + 1);
        loses->nlink.set(loses->nlink.get() - 1);
      }
      if (src_dir) s->parent.set(new_dir);
      if (dst_dir) t->parent.set(old_dir);
      SetTime(&t->ctime_ns, now);
    } else {
      // The new name: over the replaced entry, else in the first free slot of its
      // chain -- or the source's own slot when that lies in the chain (removing
      // the source there could cut the chain in front of the new entry).
      u64 slot = dst.found ? dst.slot : dst.free;
      if (!dst.found && same_dir) {
        const u64 home = NameHash(nd.hash_seed.get(), nd.hash_bits, new_name, new_len);
        if (src.slot >= home && (slot == 0 || src.slot < slot)) slot = src.slot;
      }
      if (slot == 0) return Err::kNoSpace;
      if (!(same_dir && slot == src.slot)) TFS_TRY(QueueRemoveEntry(&tx, DirTable(old_dir, od), src));
      TFS_TRY(tx.Set(DirentPos(new_dir, slot), dent, BuildDirent(dent, src.ino, src.type, new_name, new_len)));
      if (src_dir && !same_dir) {
        o->nlink.set(o->nlink.get() - 1);
        n->nlink.set(n->nlink.get() + 1);
        s->parent.set(new_dir);
      }
      if (t != nullptr) {  // the replaced inode loses this link
        t->nlink.set(dst_dir ? 0 : t->nlink.get() - 1);
        if (dst_dir) n->nlink.set(n->nlink.get() - 1);  // its ".." pointed at new_dir
        SetTime(&t->ctime_ns, now);
      }
    }
    SetTime(&s->ctime_ns, now);
    SetTime(&o->mtime_ns, now);
    SetTime(&o->ctime_ns, now);
    SetTime(&n->mtime_ns, now);
    SetTime(&n->ctime_ns, now);
    for (u32 i = 0; i < set.n; i++) {
      if (t != nullptr && &set.recs[i].f == t && (flags & kRenameExchange) == 0) {
        TFS_TRY(QueueUnlinked(&tx, dst.ino, t, &freed));
        continue;
      }
      TFS_TRY(tx.Set(InodePos(set.recs[i].ino), &set.recs[i].f, sizeof(InodeFormat)));
    }
    DebugNoSharedLock();
    TFS_TRY(tx.Commit().status());
    ctr_.renames.FetchAdd(1, MemOrder::kRelaxed);
    if (freed) *to_free = dst.ino;
    return Status::Ok();
  }
}

// --- attributes ----------------------------------------------------------------

Result<Attr> Filesystem::SetAttrs(u64 ino, const SetAttr& set) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const u32 type = f.mode.get() & kModeTypeMask;
  if ((set.valid & kSetSize) != 0) {
    if (type == kModeDir) return Err::kIsDir;
    if (type != kModeReg) return Err::kInvalidArgument;
    if (set.size > kMaxFileSize) return Err::kTooBig;
  }
  // A regular file's data changes (truncate), and its buffered writes go out
  // first so that sizes and times stay in order: under its data lock, with
  // the I/O (a new last block with zeros past the size) before the inode lock.
  const bool data = type == kModeReg && ((set.valid & kSetSize) != 0 || Buffering(ino));
  DataGuard data_lock(this, data ? ino : 0, true);
  TFS_TRY(data_lock.status());
  data::Prepared* tail = nullptr;
  data::Delta tail_delta;
  Status st = [&]() -> Status {
    if (!data) return Status::Ok();
    TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
    TFS_TRY(ReadInode(ino, &f));
    if ((set.valid & kSetSize) != 0 && set.size < f.size.get() && set.size % kBlock != 0)
      TFS_TRY(PrepareZero(ino, set.size / kBlock, u32(set.size % kBlock), kBlock, &tail, &tail_delta));
    return Status::Ok();
  }();
  if (st.ok()) {
    const u64 lock[1] = {ino};
    Locked locked(this, lock, 1);
    st = locked.status();
    if (st.ok()) st = ReadInode(ino, &f);
    const i64 now = Now();
    bool shrink = false;  // a size is set and does not grow: blocks past it go
    u64 punch_from = 0;   // ... from this block on
    if (st.ok()) {
      if ((set.valid & kSetMode) != 0) f.mode.set(type | (set.mode & kModePermMask));
      if ((set.valid & kSetUid) != 0) f.uid.set(set.uid);
      if ((set.valid & kSetGid) != 0) f.gid.set(set.gid);
      if ((set.valid & kSetSize) != 0) {
        // Not growing frees blocks past the size even if it stays (fallocated
        // with KEEP_SIZE), as ext4 does.
        if (set.size != f.size.get()) SetTime(&f.mtime_ns, now);
        shrink = set.size <= f.size.get();
        // From the partial last block if it is rewritten below, else the
        // first block past the size: PunchPast and the final punch agree.
        punch_from = tail != nullptr ? set.size / kBlock : (set.size + kBlock - 1) / kBlock;
        if (shrink) st = PunchPast(ino, &f, punch_from);
        f.size.set(set.size);
      }
    }
    if (st.ok()) {
      if ((set.valid & kSetAtime) != 0) SetTime(&f.atime_ns, set.atime_ns);
      if ((set.valid & kSetAtimeNow) != 0) SetTime(&f.atime_ns, now);
      if ((set.valid & kSetMtime) != 0) SetTime(&f.mtime_ns, set.mtime_ns);
      if ((set.valid & kSetMtimeNow) != 0) SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      Transaction tx(trees_);
      // One transaction: the last batch of the punch past the size (PunchPast
      // committed any before), from the partial last block on if there is
      // one, that block again with zeros past the size, and the inode. (Both
      // punches computed against the tree before it would overlap.)
      if (shrink) {
        st = data_->QueuePunch(&tx, ino, punch_from, ~u64(0), &tail_delta, kBatchExtents);
        if (st.ok() && tail != nullptr) st = data_->QueuePreparedOverPunch(&tx, *tail);
      } else if (tail != nullptr) {
        st = data_->QueuePrepared(&tx, *tail, &tail_delta);
      }
      if (st.ok()) {
        f.sectors.set(u64(i64(f.sectors.get()) + tail_delta.sectors));
        st = tx.Set(InodePos(ino), &f, sizeof(f));
      }
      if (st.ok()) {
        DebugNoSharedLock();
        st = data_->Commit(data::kForegroundWrite, &tx, tail_delta);
        tail_delta = data::Delta{};  // applied or aborted
      }
    }
  }
  data_->Abort(tail_delta);  // (nothing left if it was committed)
  platform::Delete(tail);
  TFS_TRY(st);
  ctr_.setattrs.FetchAdd(1, MemOrder::kRelaxed);
  return ToAttr(ino, f);
}

// --- file data -----------------------------------------------------------------
//
// Locking. A regular file's data and size are guarded by its data lock
// (DataGuard: the inode's own reader-writer lock, taken before its inode
// lock): exclusive for what reads, merges and rewrites blocks, shrinks the
// file or touches its write buffer; shared for whole-block writes with no
// buffered run (several may run at once, as O_DIRECT writes do on ext4).
// Device I/O happens under the data lock only: blobs are written by
// DataPath::Prepare, and the inode lock is taken just to commit them
// (CommitData). Both are the inode's own (fs.h, the slow-member rule): a
// write stuck in a stalled HDD holds up only its own file, never a directory
// or another file (until issue 17 both were stripes shared by hashing, and a
// stalled HDD write held up close() and open() of unrelated SSD files).

struct Filesystem::Buffered {
  u64 first = 0;       // first file block of the run
  u32 blocks = 0;      // dirty blocks [first, first + blocks); 0: empty
  u64 size = 0;        // the file's size with them
  i64 mtime_ns = 0;    // of the last write into the run
  u64 since_ns = 0;    // monotonic time of the run's first write
  u64 gen = 0;         // unique per buffer and run: a reader that saw another retries
  u8* data = nullptr;  // kBufferBlocks blocks
};

Filesystem::Buffered* Filesystem::FindBuffer(u64 ino, bool create) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (OpenCount& o : open_[s]) {
    if (o.ino != ino) continue;
    if (o.buf != nullptr || !create) return o.buf;
    if (buffers_.FetchAdd(1, MemOrder::kRelaxed) >= opt_.write_buffers) {
      buffers_.FetchSub(1, MemOrder::kRelaxed);
      return nullptr;  // all in use: write through
    }
    Buffered* b = platform::New<Buffered>();
    u8* data = static_cast<u8*>(platform::Alloc(u64(kBufferBlocks) * kBlock, kBlock));
    if (b == nullptr || data == nullptr) {
      platform::Delete(b);
      platform::Free(data);
      buffers_.FetchSub(1, MemOrder::kRelaxed);
      return nullptr;
    }
    b->data = data;
    b->gen = buf_gen_.FetchAdd(1, MemOrder::kRelaxed);
    o.buf = b;
    return b;
  }
  return nullptr;  // not open (a caller without a handle): write through
}

bool Filesystem::MayBuffer(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s])
    if (o.ino == ino) return o.buf != nullptr || buffers_.Load(MemOrder::kRelaxed) < opt_.write_buffers;
  return false;
}

void Filesystem::FreeBuffer(Buffered* b) {
  if (b == nullptr) return;
  if (b->blocks > 0) ctr_.buffers_dropped.FetchAdd(1, MemOrder::kRelaxed);
  platform::Free(b->data);
  platform::Delete(b);
  buffers_.FetchSub(1, MemOrder::kRelaxed);
}

bool Filesystem::Buffering(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s])
    if (o.ino == ino) return o.buf != nullptr && o.buf->blocks > 0;
  return false;
}

Status Filesystem::CommitData(u64 ino, const data::Prepared* p, data::Delta* delta, u64 min_size, i64 mtime,
                              journal::CommitMode mode) {
  // An HDD's flush before the inode lock: opens and stats of this file do not
  // wait for it.
  DebugNoSharedLock();
  Status fst = data_->FlushSlowMembers(data::kForegroundWrite, delta);
  if (!fst.ok()) {
    data_->Abort(*delta);
    return fst;
  }
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  Transaction tx(trees_);
  Status st = ReadInode(ino, &f);
  if (st.ok() && p != nullptr) st = data_->QueuePrepared(&tx, *p, delta);
  if (st.ok()) {
    f.size.set(Max(f.size.get(), min_size));
    f.sectors.set(u64(i64(f.sectors.get()) + delta->sectors));
    if (mtime != 0) {
      SetTime(&f.mtime_ns, mtime);
      SetTime(&f.ctime_ns, mtime);
    }
    st = tx.Set(InodePos(ino), &f, sizeof(f));
  }
  if (!st.ok()) {
    data_->Abort(*delta);  // failed before the commit
    return st;
  }
  DebugNoSharedLock();
  return data_->Commit(data::kForegroundWrite, &tx, *delta, mode);
}

Status Filesystem::PrepareZero(u64 ino, u64 block, u32 from, u32 to, data::Prepared** out, data::Delta* delta) {
  *out = nullptr;
  auto mapped = data_->HasBlockData(ino, block);
  TFS_TRY(mapped.status());
  if (!mapped.value()) return Status::Ok();  // a hole or unwritten block reads as zeros already
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  u8* buf = static_cast<u8*>(platform::Alloc(kBlock, kBlock));
  data::Prepared* p = platform::New<data::Prepared>();
  Status st = buf == nullptr || p == nullptr ? Status(Err::kNoMemory)
                                             : data_->ReadBlocks(data::kForegroundRead, ino, block, 1, buf);
  if (st.ok()) {
    MemSet(buf + from, 0, to - from);
    DebugNoSharedLock();
    st = data_->Prepare(data::kForegroundWrite, ino, block, buf, 1, Compress(f), p, delta);
  }
  platform::Free(buf);
  if (!st.ok()) {  // (the caller aborts the delta)
    platform::Delete(p);
    return st;
  }
  *out = p;
  return Status::Ok();
}

Status Filesystem::ZeroInBlock(u64 ino, u64 block, u32 from, u32 to, i64 mtime) {
  data::Prepared* p;
  data::Delta delta;
  Status st = PrepareZero(ino, block, from, to, &p, &delta);
  if (!st.ok()) {
    data_->Abort(delta);
    return st;
  }
  if (p == nullptr) return Status::Ok();
  st = CommitData(ino, p, &delta, 0, mtime);
  platform::Delete(p);
  return st;
}

Status Filesystem::FlushRun(u64 ino, Buffered* b, FlushCause cause) {
  if (b == nullptr || b->blocks == 0) return Status::Ok();
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  data::Prepared* p = platform::New<data::Prepared>();
  data::Delta delta;
  if (st.ok() && p == nullptr) st = Err::kNoMemory;
  DebugNoSharedLock();
  if (st.ok()) st = data_->Prepare(data::kForegroundWrite, ino, b->first, b->data, b->blocks, Compress(f), p, &delta);
  if (st.ok()) {
    // Fsync flushes the journal right after: the writer thread need not wake.
    st = CommitData(ino, p, &delta, b->size, b->mtime_ns,
                    cause == kFlushFsync ? journal::CommitMode::kFlushNext : journal::CommitMode::kNoFlush);
  } else {
    data_->Abort(delta);
  }
  platform::Delete(p);
  if (!st.ok()) {  // the run stays, for the next flush to try again
    ctr_.flush_errors.FetchAdd(1, MemOrder::kRelaxed);
    return st;
  }
  Bump(cause == kFlushFull    ? ctr_.flushes_full
       : cause == kFlushClose ? ctr_.flushes_close
       : cause == kFlushFsync ? ctr_.flushes_fsync
       : cause == kFlushAge   ? ctr_.flushes_age
       : cause == kFlushPressure ? ctr_.flushes_pressure
                              : ctr_.flushes_other);
  ctr_.bytes_flushed.FetchAdd(u64(b->blocks) * kBlock, MemOrder::kRelaxed);
  SharedLock l(open_mu_[Stripe(ino)]);
  b->blocks = 0;
  b->gen = buf_gen_.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

Status Filesystem::FlushBuffer(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  // Nothing buffered (the common close): no lock at all, so a close never
  // waits for another writer of the file -- one stuck in a stalled HDD's
  // write, say. A write that returned before this close began is in the run.
  {
    const u32 s = Stripe(ino);
    SharedLock l(open_mu_[s]);
    bool buffered = false;
    for (const OpenCount& o : open_[s]) buffered |= o.ino == ino && o.buf != nullptr && o.buf->blocks > 0;
    if (!buffered) {
      ctr_.closes_unbuffered.FetchAdd(1, MemOrder::kRelaxed);
      return Status::Ok();
    }
  }
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  return FlushRun(ino, FindBuffer(ino, false), kFlushClose);
}

Status Filesystem::Fsync(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  {
    DataGuard data(this, ino, true);
    TFS_TRY(data.status());
    TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushFsync));
  }
  return store_->journal().Flush();
}

void Filesystem::OverlayBuffered(u64 ino, Attr* a) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (const OpenCount& o : open_[s]) {
    if (o.ino != ino || o.buf == nullptr || o.buf->blocks == 0) continue;
    a->size = Max(a->size, o.buf->size);
    a->mtime_ns = a->ctime_ns = o.buf->mtime_ns;
    a->sectors += u64(o.buf->blocks) * (kBlock / 512);  // at most: some may replace blocks
  }
}

void Filesystem::FlusherMain(void* self) {
  Filesystem* fs = static_cast<Filesystem*>(self);
  const u64 period = Max<u64>(u64(fs->opt_.buffer_age_ms) * 1000000 / 4, 1000000);
  for (;;) {
    // The kick is read before the checks: a stop or a shrinker's ask after
    // them changes it, and the wait returns at once (no lost wake-up; the
    // shrinker may not take a lock to signal).
    const u32 kick = fs->flusher_kick_.Load(MemOrder::kAcquire);
    if (fs->flusher_stop_.Load(MemOrder::kAcquire)) break;
    if (fs->shrink_pages_.Load(MemOrder::kAcquire) == 0) (void)tfs_plat_wait(fs->flusher_kick_.Address(), kick, period);
    if (fs->flusher_stop_.Load(MemOrder::kAcquire)) break;
    const u64 shrink = fs->shrink_pages_.Exchange(0, MemOrder::kAcqRel);
    if (shrink > 0) (void)fs->ShrinkBuffers(shrink);
    fs->FlushAged();
  }
}

void Filesystem::KickFlusher() {
  flusher_kick_.FetchAdd(1, MemOrder::kAcqRel);
  tfs_plat_wake(flusher_kick_.Address(), 0);
}

void Filesystem::StopFlusher() {
  shrinker_.Unregister();  // (returns once no call of it runs: none asks the flusher after this)
  if (!flusher_.running()) return;
  flusher_stop_.Store(true, MemOrder::kRelease);
  KickFlusher();
  flusher_.Join();
}

u64 Filesystem::BufferPages(void* self) {
  const Filesystem* fs = static_cast<const Filesystem*>(self);
  return u64(fs->buffers_.Load(MemOrder::kRelaxed)) * (u64(kBufferBlocks) * kBlock / platform::kShrinkPage);
}

u64 Filesystem::AskShrink(void* self, u64 pages) {
  Filesystem* fs = static_cast<Filesystem*>(self);
  // The largest ask not yet served, not their sum: a look that finds the
  // buffers not yet freed asks again for the same pages.
  u64 cur = fs->shrink_pages_.Load(MemOrder::kAcquire);
  while (cur < pages && !fs->shrink_pages_.CompareExchange(cur, pages, MemOrder::kAcqRel)) {
  }
  fs->KickFlusher();
  return 0;  // (freed by the flusher, not here: the next count shows it)
}

u64 Filesystem::ShrinkBuffers(u64 pages) {
  constexpr u64 kPagesPerBuffer = u64(kBufferBlocks) * kBlock / platform::kShrinkPage;
  u64 freed = 0;
  for (u32 s = 0; s < kStripes && freed < pages; s++) {
    u64 inos[16];
    u32 n = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (n < 16 && o.buf != nullptr) inos[n++] = o.ino;
    }
    for (u32 i = 0; i < n && freed < pages; i++) {
      // Under the inode's data lock, exclusive: no write or read of it uses
      // the buffer meanwhile. A run that does not go out keeps its buffer.
      DataGuard data(this, inos[i], true);
      if (!data.status().ok()) continue;
      Buffered* b = FindBuffer(inos[i], false);
      if (b == nullptr) continue;
      if (b->blocks > 0) {
        Status st = FlushRun(inos[i], b, kFlushPressure);
        if (!st.ok()) {
          platform::Log(platform::LogLevel::kError, "posix: writing out buffered data of inode %llu: %s",
                        (unsigned long long)inos[i], st.Message());
          continue;
        }
      }
      {
        SharedLock l(open_mu_[s]);
        b = nullptr;
        for (OpenCount& o : open_[s])
          if (o.ino == inos[i] && o.buf != nullptr && o.buf->blocks == 0) {
            b = o.buf;
            o.buf = nullptr;
          }
      }
      if (b == nullptr) continue;
      FreeBuffer(b);
      ctr_.buffers_shrunk.FetchAdd(1, MemOrder::kRelaxed);
      freed += kPagesPerBuffer;
    }
  }
  return freed;
}

void Filesystem::FlushAged() {
  const u64 now = platform::NowNs();
  const u64 age = u64(opt_.buffer_age_ms) * 1000000;
  for (u32 s = 0; s < kStripes; s++) {
    u64 inos[16];
    u32 n = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (n < 16 && o.buf != nullptr && o.buf->blocks > 0 && now - o.buf->since_ns >= age) inos[n++] = o.ino;
    }
    for (u32 i = 0; i < n; i++) {
      DataGuard data(this, inos[i], true);
      if (!data.status().ok()) continue;  // out of memory: at the next round
      Buffered* b = FindBuffer(inos[i], false);  // (the last Release takes the data lock too)
      if (b == nullptr || b->blocks == 0 || now - b->since_ns < age) continue;
      Status st = FlushRun(inos[i], b, kFlushAge);
      if (!st.ok())
        platform::Log(platform::LogLevel::kError, "posix: writing out buffered data of inode %llu: %s",
                      (unsigned long long)inos[i], st.Message());
    }
  }
}

Result<u32> Filesystem::Write(u64 ino, u64 off, const void* buf, u32 len, u32 flags, Writer* writer) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return Err::kTooBig;
  if (len == 0) return u32(0);
  TFS_TRY(MetadataRoom());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
  // The VFS's file_remove_privs, before the data, for buffered and direct
  // writes alike. A write of a file with neither setid bits nor
  // security.capability pays two bit tests here: nothing is read, locked,
  // committed or asked of the front end.
  if ((flags & kWritePrivsRemoved) == 0 &&
      (SetidWriteDrops(f.mode.get()) != 0 || (f.flags.get() & kInodeFlagCaps) != 0))
    TFS_TRY(DropPrivs(ino, f, writer));
  const u8* in = static_cast<const u8*>(buf);
  const u64 nb = (off + len + kBlock - 1) / kBlock - off / kBlock;
  if ((flags & kWriteDirect) == 0 && nb <= kBufferBlocks / 2 && MayBuffer(ino)) {
    // The buffer is found under the data lock: the memory-pressure shrinker
    // (ShrinkBuffers) frees an open file's buffer under it. (MayBuffer keeps
    // writes that cannot be buffered off the exclusive lock.)
    DataGuard data(this, ino, true);
    TFS_TRY(data.status());
    Buffered* b = FindBuffer(ino, true);
    if (b != nullptr) {
      TFS_TRY(ReadInode(ino, &f));  // the size, now stable
      return WriteBuffered(ino, &f, b, off, in, len);
    }
  }
  // Whole blocks and nothing buffered: the shared data lock (the blocks are
  // replaced, not merged).
  if (off % kBlock == 0 && len % kBlock == 0) {
    DataGuard data(this, ino, false);
    TFS_TRY(data.status());
    if (!Buffering(ino)) {
      ctr_.writes_direct.FetchAdd(1, MemOrder::kRelaxed);
      return WriteThrough(ino, f, off, in, len);  // (f's size is not used for whole blocks)
    }
  }
  // Straight through, after whatever is buffered (so the order holds).
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  TFS_TRY(ReadInode(ino, &f));  // the size, now stable
  ctr_.writes_direct.FetchAdd(1, MemOrder::kRelaxed);
  return WriteThrough(ino, f, off, in, len);
}

u32 Filesystem::SetidWriteDrops(u32 mode) {
  u32 drop = mode & kModeSetuid;
  // Setgid without group execute marks mandatory locking, not a privilege
  // (Linux 6.1's should_remove_suid; 6.2 and later also drop it when the
  // writer is not in the file's group and lacks CAP_FSETID).
  if ((mode & kModeSetgid) != 0 && (mode & 0010) != 0) drop |= kModeSetgid;
  return drop;
}

Status Filesystem::DropPrivs(u64 ino, const InodeFormat& seen, Writer* writer) {
  // The capability question first, outside the lock (a front end answers it
  // with a syscall), and only when there are setid bits to take: the bits
  // the writer would lose as the inode was seen. A chmod racing the write
  // orders before or after it either way (the VFS holds the inode lock
  // across both; the outcome is one of the two orders here too).
  u32 drop = SetidWriteDrops(seen.mode.get());
  if (drop != 0 && writer != nullptr && writer->may_keep_setid != nullptr &&
      writer->may_keep_setid(writer->ctx))
    drop = 0;
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  drop &= f.mode.get();
  const bool caps = (f.flags.get() & kInodeFlagCaps) != 0;
  if (drop == 0 && !caps) return Status::Ok();  // gone meanwhile, or kept
  Transaction tx(trees_);
  if (caps) {
    const NameTable t = XattrTable(ino, f);
    Entry e;
    XattrChunksFormat chunks;
    TFS_TRY(FindEntry(t, kXattrCaps, kXattrCapsLen, &e, &chunks));
    if (e.found) TFS_TRY(QueueRemoveXattr(&tx, t, e, chunks));
    f.flags.set(u16(f.flags.get() & ~kInodeFlagCaps));
  }
  f.mode.set(f.mode.get() & ~drop);
  SetTime(&f.ctime_ns, Now());
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  TFS_TRY(tx.Commit(journal::CommitMode::kNoFlush).status());
  if (writer != nullptr) writer->dropped = true;
  return Status::Ok();
}

Result<u32> Filesystem::WriteBuffered(u64 ino, InodeFormat* f, Buffered* b, u64 off, const u8* buf, u32 len) {
  const u64 b0 = off / kBlock;
  const u64 b1 = (off + len + kBlock - 1) / kBlock;
  // The run takes writes that start inside it or right after it and end
  // within its capacity; anything else writes it out first.
  if (b->blocks > 0 && (b0 < b->first || b0 > b->first + b->blocks || b1 > b->first + kBufferBlocks)) {
    TFS_TRY(FlushRun(ino, b, kFlushFull));
    TFS_TRY(ReadInode(ino, f));  // its new size
  }
  const u64 first = b->blocks > 0 ? b->first : b0;
  const u64 have_end = first + b->blocks;
  // Blocks new to the run that the write covers in part keep their other
  // bytes: read them (zeros past the end of the file) before taking the lock.
  u64 edge_block[2] = {~u64(0), ~u64(0)};
  const u64 size_blocks = (f->size.get() + kBlock - 1) / kBlock;
  const u64 new_from = Max(b0, have_end);
  const u64 partial[2] = {off % kBlock != 0 ? b0 : ~u64(0), (off + len) % kBlock != 0 ? b1 - 1 : ~u64(0)};
  u8* edge = nullptr;  // two blocks
  for (u32 i = 0; i < 2; i++) {
    const u64 blk = partial[i];
    if (blk == ~u64(0) || blk < new_from || blk == edge_block[0]) continue;
    if (edge == nullptr && (edge = static_cast<u8*>(platform::Alloc(2 * kBlock, kBlock))) == nullptr)
      return Err::kNoMemory;
    Status st = blk < size_blocks ? data_->ReadBlocks(data::kForegroundRead, ino, blk, 1, edge + i * kBlock)
                                  : Status::Ok();
    if (!st.ok()) {
      platform::Free(edge);
      return st;
    }
    if (blk >= size_blocks) MemSet(edge + i * kBlock, 0, kBlock);
    edge_block[i] = blk;
  }
  const i64 now = Now();
  SharedLock l(open_mu_[Stripe(ino)]);
  if (b->blocks == 0) {
    b->first = b0;
    b->size = f->size.get();
    b->since_ns = platform::NowNs();
  }
  for (u64 blk = new_from; blk < b1; blk++) {
    u8* slot = b->data + (blk - b->first) * kBlock;
    if (blk == edge_block[0]) {
      MemCopy(slot, edge, kBlock);
    } else if (blk == edge_block[1]) {
      MemCopy(slot, edge + kBlock, kBlock);
    } else {
      MemSet(slot, 0, kBlock);  // the write covers it whole
    }
  }
  platform::Free(edge);
  MemCopy(b->data + (off - b->first * kBlock), buf, len);
  b->blocks = u32(Max<u64>(b->first + b->blocks, b1) - b->first);
  b->size = Max(b->size, off + len);
  b->mtime_ns = now;
  ctr_.writes_buffered.FetchAdd(1, MemOrder::kRelaxed);
  return len;
}

Result<u32> Filesystem::WriteThrough(u64 ino, InodeFormat f, u64 off, const u8* buf, u32 len) {
  // Block-aligned, so that the blobs go to the device without another copy.
  const u64 span = (off + len + kBlock - 1) / kBlock - off / kBlock;
  u8* blocks = static_cast<u8*>(platform::Alloc(Min<u64>(span, kWriteChunkBlocks + 1) * kBlock, kBlock));
  data::Prepared* p = platform::New<data::Prepared>();
  Status st = blocks == nullptr || p == nullptr ? Status(Err::kNoMemory) : Status::Ok();
  for (u32 done = 0; st.ok() && done < len;) {
    const u64 pos = off + done;
    const u64 b0 = pos / kBlock;
    const u32 skip = u32(pos % kBlock);
    const u32 n = u32(Min<u64>(len - done, u64(kWriteChunkBlocks) * kBlock - skip));
    const u64 b1 = (pos + n + kBlock - 1) / kBlock;
    const u32 nb = u32(b1 - b0);
    // Blocks the write covers only in part keep their other bytes (zeros past
    // the end of the file: the tail of its last block is always zero). Only
    // an exclusive data lock holder gets here with such blocks.
    const u64 size_blocks = (f.size.get() + kBlock - 1) / kBlock;
    auto complete = [&](u64 blk, u8* at) {
      if (blk < size_blocks) return data_->ReadBlocks(data::kForegroundRead, ino, blk, 1, at);
      MemSet(at, 0, kBlock);
      return Status::Ok();
    };
    if (skip != 0) st = complete(b0, blocks);
    if (st.ok() && (pos + n) % kBlock != 0 && !(nb == 1 && skip != 0))
      st = complete(b1 - 1, blocks + u64(nb - 1) * kBlock);
    if (!st.ok()) break;
    MemCopy(blocks + skip, buf + done, n);
    data::Delta delta;
    DebugNoSharedLock();
    st = data_->Prepare(data::kForegroundWrite, ino, b0, blocks, nb, Compress(f), p, &delta);
    if (!st.ok()) {
      data_->Abort(delta);
      break;
    }
    st = CommitData(ino, p, &delta, pos + n, Now());
    f.size.set(Max(f.size.get(), pos + n));
    done += n;
  }
  platform::Free(blocks);
  platform::Delete(p);
  TFS_TRY(st);
  return len;
}

Result<u64> Filesystem::Seek(u64 ino, i64 offset, bool data) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  // The data lock keeps new buffered writes out while the extents are read.
  DataGuard g(this, ino, true);
  TFS_TRY(g.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
  const u64 size = f.size.get();
  if (offset < 0 || u64(offset) >= size) return Err::kNoSuchOffset;  // (ext4's answers)
  const u64 off = u64(offset);
  const u64 block = TFS_TRY(data_->SeekBlock(ino, off / kBlock, data));
  if (data) {
    if (block == data::DataPath::kNoBlock || block * kBlock >= size) return Err::kNoSuchOffset;
    return Max(off, block * kBlock);
  }
  return Min(size, Max(off, block * kBlock));
}

Result<u32> Filesystem::Read(u64 ino, u64 off, void* buf, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  const u32 s = Stripe(ino);
  for (;;) {
    // A buffered run is newer than the extents: note it first, read the
    // extents, then lay the run over them -- unless it was written out in
    // between (the extents read may predate that commit): then again. The
    // inode (its size) is read after the note: a run written out before it
    // has committed its size (FlushRun empties the buffer after the commit),
    // so a note of an empty buffer never pairs with a size from before.
    u64 size = 0;
    const Buffered* b = nullptr;
    u64 gen = 0;
    {
      SharedLock l(open_mu_[s]);
      for (const OpenCount& o : open_[s])
        if (o.ino == ino && o.buf != nullptr && o.buf->blocks > 0) {
          b = o.buf;
          gen = b->gen;
          size = b->size;
        }
    }
    InodeFormat f;
    TFS_TRY(ReadInode(ino, &f));
    if (IsDir(f)) return Err::kIsDir;
    if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kInvalidArgument;
    size = Max(size, f.size.get());
    if (off >= size || len == 0) return u32(0);
    const u32 n = u32(Min<u64>(len, size - off));
    const u64 b0 = off / kBlock;
    const u64 b1 = (off + n + kBlock - 1) / kBlock;
    u8* blocks = static_cast<u8*>(platform::Alloc((b1 - b0) * kBlock, kBlock));  // (read into directly)
    if (blocks == nullptr) return Err::kNoMemory;
    Status st = data_->ReadBlocks(data::kForegroundRead, ino, b0, u32(b1 - b0), blocks);
    bool again = false;
    if (st.ok() && b != nullptr) {
      SharedLock l(open_mu_[s]);
      // The same buffer (generations are unique) holding the same run?
      again = true;
      for (const OpenCount& o : open_[s])
        if (o.ino == ino && o.buf == b && b->gen == gen) again = false;
      // (Only then is b still a buffer: the shrinker frees an open file's
      // buffer, under open_mu_.)
      const u64 lo = again ? 0 : Max(b0, b->first);
      const u64 hi = again ? 0 : Min(b1, b->first + b->blocks);
      if (lo < hi) MemCopy(blocks + (lo - b0) * kBlock, b->data + (lo - b->first) * kBlock, (hi - lo) * kBlock);
    }
    if (st.ok() && !again) MemCopy(buf, blocks + off % kBlock, n);
    platform::Free(blocks);
    TFS_TRY(st);
    if (!again) return n;
  }
}

Status Filesystem::PunchPast(u64 ino, InodeFormat* f, u64 keep) {
  // A batch of extents per transaction, all but the last: the caller queues
  // that one into the transaction that sets the size (QueuePunch from the
  // same block `keep`), so a truncate of up to kBatchExtents extents is one
  // transaction. A crash between the batches of a longer one leaves holes in
  // what was being truncated away. The caller commits *f.
  for (;;) {
    const u32 left = TFS_TRY(data_->CountExtentsFrom(ino, keep, kBatchExtents + 1));
    if (left <= kBatchExtents) return Status::Ok();
    Transaction tx(trees_);
    data::Delta delta;
    TFS_TRY(data_->QueuePunch(&tx, ino, keep, ~u64(0), &delta, kBatchExtents));
    if (delta.empty()) return Status::Ok();
    f->sectors.set(u64(i64(f->sectors.get()) + delta.sectors));
    TFS_TRY(tx.Set(InodePos(ino), f, sizeof(*f)));
    DebugNoSharedLock();
    TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
  }
}

Status Filesystem::Fallocate(u64 ino, u32 mode, u64 off, u64 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if ((mode & ~u32(kFallocKeepSize | kFallocPunchHole | kFallocZeroRange)) != 0) return Err::kNotSupported;
  const bool punch = (mode & kFallocPunchHole) != 0;
  const bool zero = (mode & kFallocZeroRange) != 0;
  const bool keep = (mode & kFallocKeepSize) != 0;
  if (!punch) TFS_TRY(MetadataRoom());
  // As vfs_fallocate: punching keeps the size and excludes zeroing.
  if ((punch && zero) || (punch && !keep)) return Err::kNotSupported;
  if (len == 0) return Err::kInvalidArgument;
  if (off >= kMaxFileSize || len > kMaxFileSize - off) return Err::kTooBig;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (IsDir(f)) return Err::kIsDir;
  if ((f.mode.get() & kModeTypeMask) != kModeReg) return Err::kNoDevice;
  DataGuard data(this, ino, true);
  TFS_TRY(data.status());
  TFS_TRY(FlushRun(ino, FindBuffer(ino, false), kFlushOther));
  TFS_TRY(ReadInode(ino, &f));
  const u64 end = off + len;
  const i64 now = Now();
  if (punch || zero) {
    // Bytes of the range in blocks it covers only in part become zeros (their
    // I/O first, under the data lock alone); the whole blocks inside it are
    // freed.
    const u64 size_blocks = (f.size.get() + kBlock - 1) / kBlock;
    const u64 first_whole = (off + kBlock - 1) / kBlock;
    const u64 end_whole = end / kBlock;
    if (off / kBlock == (end - 1) / kBlock && (off % kBlock != 0 || end % kBlock != 0)) {
      if (off / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, off / kBlock, u32(off % kBlock), u32((end - 1) % kBlock) + 1, now));
    } else {
      if (off % kBlock != 0 && off / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, off / kBlock, u32(off % kBlock), kBlock, now));
      if (end % kBlock != 0 && end / kBlock < size_blocks)
        TFS_TRY(ZeroInBlock(ino, end / kBlock, 0, u32(end % kBlock), now));
    }
    for (bool more = first_whole < end_whole; more;) {
      const u64 lock[1] = {ino};
      Locked locked(this, lock, 1);
      TFS_TRY(locked.status());
      TFS_TRY(ReadInode(ino, &f));
      Transaction tx(trees_);
      data::Delta delta;
      TFS_TRY(data_->QueuePunch(&tx, ino, first_whole, end_whole, &delta, kBatchExtents));
      more = !delta.empty();
      f.sectors.set(u64(i64(f.sectors.get()) + delta.sectors));
      SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
      DebugNoSharedLock();
      TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
    }
    if (punch) {
      const u64 lock[1] = {ino};
      Locked locked(this, lock, 1);
      TFS_TRY(locked.status());
      TFS_TRY(ReadInode(ino, &f));
      SetTime(&f.mtime_ns, now);
      SetTime(&f.ctime_ns, now);
      Transaction tx(trees_);
      TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
      DebugNoSharedLock();
      return tx.Commit(journal::CommitMode::kNoFlush).status();
    }
  }
  // Preallocation (and the rest of zeroing): unwritten extents over the holes
  // of every block the range touches (zeroing: its whole blocks are holes by
  // now, and its partial blocks either hold data, zeroed above, or are holes).
  const u64 first = off / kBlock;
  const u64 last = (end + kBlock - 1) / kBlock;
  u64 at = first;
  do {
    const u64 lock[1] = {ino};
    Locked locked(this, lock, 1);
    TFS_TRY(locked.status());
    TFS_TRY(ReadInode(ino, &f));
    Transaction tx(trees_);
    data::Delta delta;
    u64 next = at;
    Status st = at < last ? data_->QueueReserve(&tx, ino, at, last, &delta, kBatchExtents, &next) : Status::Ok();
    if (st.ok()) {
      SetTime(&f.ctime_ns, now);
      if (next == last && !keep && end > f.size.get()) {
        f.size.set(end);
        SetTime(&f.mtime_ns, now);
      }
      f.sectors.set(u64(i64(f.sectors.get()) + delta.sectors));
      st = tx.Set(InodePos(ino), &f, sizeof(f));
    }
    if (!st.ok()) {
      data_->Abort(delta);  // failed before the commit
      return st;
    }
    DebugNoSharedLock();
    TFS_TRY(data_->Commit(data::kForegroundWrite, &tx, delta));
    at = next;
  } while (at < last);
  return Status::Ok();
}

bool Filesystem::Compress(const InodeFormat& f) const {
  return compress_all_ || (f.flags.get() & kInodeFlagCompress) != 0;
}

Result<u32> Filesystem::GetFlags(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  return (f.flags.get() & kInodeFlagCompress) != 0 ? kFsComprFl : 0u;
}

Status Filesystem::SetFlags(u64 ino, u32 flags) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  if ((flags & ~kFsComprFl) != 0) return Err::kNotSupported;
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const u16 want = u16((f.flags.get() & ~kInodeFlagCompress) | ((flags & kFsComprFl) != 0 ? kInodeFlagCompress : 0));
  if (want == f.flags.get()) return Status::Ok();
  f.flags.set(want);
  SetTime(&f.ctime_ns, Now());
  Transaction tx(trees_);
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  return tx.Commit(journal::CommitMode::kNoFlush).status();
}

// --- xattrs -------------------------------------------------------------------

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

Status Filesystem::SetXattr(u64 ino, const char* name, u32 len, const void* value, u32 value_len, u32 flags) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
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
  TFS_TRY(FindEntry(t, name, len, &e, &old));
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
  TFS_TRY(CheckXattrName(name, len));
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  Entry e;
  XattrChunksFormat chunks;
  TFS_TRY(FindEntry(XattrTable(ino, f), name, len, &e, &chunks));
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
  TFS_TRY(FindEntry(t, name, len, &e, &chunks));
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
  return total;
}

Status Filesystem::QueueRemoveXattr(Transaction* tx, const NameTable& t, const Entry& e,
                                    const XattrChunksFormat& chunks) {
  TFS_TRY(QueueRemoveEntry(tx, t, e));
  for (u32 i = 0; i < XattrChunkCount(chunks.value_len.get()); i++)
    TFS_TRY(tx->Delete(XattrPos(t.owner, XattrChunkOffset(chunks.id.get(), i))));
  return Status::Ok();
}

Status Filesystem::RemoveXattr(u64 ino, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckXattrName(name, len));
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  const NameTable t = XattrTable(ino, f);
  Entry e;
  XattrChunksFormat chunks;
  TFS_TRY(FindEntry(t, name, len, &e, &chunks));
  if (!e.found) return Err::kNoData;
  Transaction tx(trees_);
  TFS_TRY(QueueRemoveXattr(&tx, t, e, chunks));
  if (IsCapsName(name, len)) f.flags.set(u16(f.flags.get() & ~kInodeFlagCaps));
  SetTime(&f.ctime_ns, Now());
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  return tx.Commit().status();
}

// --- open files ----------------------------------------------------------------

Status Filesystem::OpenInode(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);  // an unlink either sees this handle or leaves the free to it
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  return AddHandle(ino);
}

Status Filesystem::AddHandle(u64 ino) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  for (OpenCount& o : open_[s])
    if (o.ino == ino) {
      o.count++;
      return Status::Ok();
    }
  TFS_TRY(open_[s].PushBack(OpenCount{ino, 1, nullptr}));
  ctr_.open_inodes.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

bool Filesystem::DropHandle(u64 ino, bool* last, Buffered** buf) {
  const u32 s = Stripe(ino);
  SharedLock l(open_mu_[s]);
  Vector<OpenCount>& v = open_[s];
  for (u32 i = 0; i < v.size(); i++) {
    if (v[i].ino != ino) continue;
    *last = --v[i].count == 0;
    if (*last) {
      *buf = v[i].buf;
      v[i] = v[v.size() - 1];
      v.PopBack();
      ctr_.open_inodes.FetchSub(1, MemOrder::kRelaxed);
    }
    return true;
  }
  return false;
}

// --- the front ends' operations -------------------------------------------------

Status Filesystem::Open(u64 ino, u32 flags, Writer* writer) {
  if ((flags & ~u32(kOpenTruncate)) != 0) return Err::kInvalidArgument;
  TFS_TRY(OpenInode(ino));
  if ((flags & kOpenTruncate) == 0) return Status::Ok();
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  if (st.ok() && (f.mode.get() & kModeTypeMask) == kModeReg) {
    if (SetidWriteDrops(f.mode.get()) != 0 || (f.flags.get() & kInodeFlagCaps) != 0)
      st = DropPrivs(ino, f, writer);
  }
  if (st.ok() && (f.mode.get() & kModeTypeMask) == kModeReg) {
    SetAttr set;
    set.valid = kSetSize;
    set.size = 0;
    st = SetAttrs(ino, set).status();
  }
  if (st.ok()) return Status::Ok();
  Status rst = Release(ino);
  if (!rst.ok())
    platform::Log(platform::LogLevel::kError, "posix: releasing inode %llu after its truncation failed: %s",
                  (unsigned long long)ino, rst.Message());
  return st;
}

Result<Attr> Filesystem::CreateOpen(u64 dir, const char* name, u32 len, u32 mode, const Caller& who) {
  return Create(dir, name, len, kModeReg | (mode & kModePermMask), 0, nullptr, 0, who, true);
}

// No inode lock: an opendir (an `ls`, `tierfs ctl` on the root) must not
// wait behind a commit in that directory, which can wait for the journal.
// The handle goes first, then the check: an rmdir that decided before the
// handle existed leaves the free to it (FreeUnlinked checks again under the
// directory's lock), and one after it sees the handle and keeps the orphan.
// The root needs no handle: it is never removed.
Status Filesystem::OpenDir(u64 dir) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat d;
  if (dir == kRootIno) return ReadDirInode(dir, &d);
  TFS_TRY(AddHandle(dir));
  Status st = ReadDirInode(dir, &d);  // kNotDir; kNotFound once removed (open handles keep it)
  if (st.ok()) return Status::Ok();
  // Not opened after all: the handle goes as any does (freeing a removed
  // directory if it was the last).
  Status rst = Release(dir);
  if (!rst.ok() && !rst.Is(ErrorClass::kNotFound))
    platform::Log(platform::LogLevel::kError, "posix: releasing directory %llu after a failed open: %s",
                  (unsigned long long)dir, rst.Message());
  return st;
}

// A directory has no write buffer: Release only drops the handle and frees
// a removed directory with its last one.
Status Filesystem::ReleaseDir(u64 dir) { return dir == kRootIno ? Status::Ok() : Release(dir); }

namespace {

// ReadDirPlus's first pass: the listed entries, names packed in one buffer.
struct Listing {
  struct Item {
    u32 name_at, len;
    u64 ino, next;
    u8 type;
  };
  Vector<Item> items;
  Vector<char> names;
  u32 max;
  Status st;
};

bool ListOne(void* p, const char* name, u32 len, u64 ino, u8 type, u64 next) {
  auto* l = static_cast<Listing*>(p);
  if (l->items.size() >= l->max) return false;
  const u32 at = u32(l->names.size());
  l->st = l->names.Append(name, len);
  if (l->st.ok()) l->st = l->items.PushBack(Listing::Item{at, len, ino, next, type});
  return l->st.ok();
}

}  // namespace

Status Filesystem::ReadDirPlus(u64 dir, u64 cookie, u32 max_entries, DirPlusFiller fill, void* ctx) {
  if (max_entries == 0) return Err::kInvalidArgument;
  // A page the sink took nothing of must mean the end of the directory (a
  // front end reads an empty reply so): when every entry listed went before
  // its lookup, list on from the last of them.
  for (;;) {
    Listing l;
    l.max = max_entries;
    Status st = ReadDir(dir, cookie, ListOne, &l);
    if (l.items.size() == 0) return !st.ok() ? st : l.st;  // the end, or the error before the first
    u32 filled = 0;
    bool stopped = false;  // the sink is full, or a lookup failed after the first entry
    for (const Listing::Item& e : l.items) {
      const char* name = l.names.data() + e.name_at;
      if (IsDot(name, e.len) || IsDotDot(name, e.len)) {
        if (!fill(ctx, name, e.len, nullptr, e.ino, e.type, e.next)) {
          stopped = true;
          break;
        }
        filled++;
        continue;
      }
      Result<Attr> a = GetAttr(e.ino);
      if (!a.ok() && a.status().Is(ErrorClass::kNotFound)) continue;  // removed since it was listed
      if (!a.ok()) {
        if (filled == 0) return a.status();
        stopped = true;  // the next call resumes here, and says it
        break;
      }
      if (!fill(ctx, name, e.len, &a.value(), e.ino, e.type, e.next)) {
        stopped = true;
        break;
      }
      filled++;
    }
    if (filled > 0 || stopped) return Status::Ok();
    // Every entry listed went. Its listing's own end or error decides.
    if (!st.ok()) return st;
    if (!l.st.ok()) return l.st;
    if (l.items.size() < max_entries) return Status::Ok();  // the directory ended there
    cookie = l.items[l.items.size() - 1].next;
  }
}

Status Filesystem::FsyncDir(u64 dir) {
  if (store_ == nullptr) return Err::kInvalidArgument;
  (void)dir;  // every directory's operations are in the one journal
  return store_->journal().Flush();
}

Status Filesystem::GetFsxattr(u64 ino, Fsxattr* out) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  *out = Fsxattr{};
  return Status::Ok();
}

Status Filesystem::SetFsxattr(u64 ino, const Fsxattr& x) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  if (x.xflags != 0 || x.extsize != 0 || x.projid != 0 || x.cowextsize != 0) return Err::kNotSupported;
  return Status::Ok();
}

Status Filesystem::Release(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  DataGuard data(this, ino, true);  // no write of it runs while the last handle goes
  TFS_TRY(data.status());
  const u32 s = Stripe(ino);
  // The last handle's buffered run goes out first, while readers still see
  // it (a deleted file's is dropped).
  Buffered* b = nullptr;
  {
    SharedLock l(open_mu_[s]);
    for (const OpenCount& o : open_[s])
      if (o.ino == ino && o.count == 1) b = o.buf;
  }
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  if (st.ok() && f.nlink.get() != 0) st = FlushRun(ino, b, kFlushClose);
  if (!st.ok() && !st.Is(ErrorClass::kNotFound))
    platform::Log(platform::LogLevel::kError, "posix: writing out buffered data of inode %llu at its last close: %s",
                  (unsigned long long)ino, st.Message());
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);  // no unlink of it runs while we decide
  TFS_TRY(locked.status());
  bool last = false;
  if (!DropHandle(ino, &last, &b)) return Err::kInvalidArgument;  // not open
  if (!last) return st;  // (opened again meanwhile: the buffer stays with it)
  FreeBuffer(b);
  if (st.Is(ErrorClass::kNotFound)) return Status::Ok();
  TFS_TRY(st);
  // (An unlink may have run between; or its FreeUnlinked, under this lock
  // before us, freed it already.)
  return FreeOrphan(ino);
}

Stats Filesystem::GetStats() const {
  Stats s;
  TFS_COUNTER_LOAD(TFS_POSIX_COUNTERS, ctr_, s);
  TFS_COUNTER_LOAD(TFS_WBUF_COUNTERS, ctr_, s);
  s.buffers_now = buffers_.Load(MemOrder::kRelaxed);
  for (u32 i = 0; i < kStripes; i++) {
    SharedLock l(locks_mu_[i]);
    s.inode_locks_now += locks_[i].size();
  }
  return s;
}

}  // namespace tfs::posix
