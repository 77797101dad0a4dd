// The filesystem's core (fs.h; docs/design/posix.md): Mount and Unmount (the
// orphans a crash left, a new filesystem's root, the capability flags of an
// older build's filesystem), inode I/O (ReadInode with symlink targets,
// QueueFree, QueueUnlinked, FinishFree, the orphans' last free), the inode
// lock table, attributes (GetAttr, GetFlags/SetFlags, the fsxattr pair),
// statfs, directories' open and readdir, and open handles (Open, Release).
// The rest: names.cc (name tables), namei.cc (namespace operations),
// file.cc (file data), wbuf.cc (the write buffer), xattr.cc; what they share
// is in internal.h.
//
// The lock and open tables' mutexes (SharedLock) are held only to find, add
// or drop an entry, never across I/O, a commit or another lock; every commit
// asserts it (DebugNoSharedLock, fs.h's slow-member rule). GetAttr, ReadDir
// and OpenDir take no inode lock.
#include "posix/fs.h"

#include "journal/format.h"
#include "platform/platform.h"
#include "posix/internal.h"
#include "posix/opts.h"
#include "sb/format.h"
#include "util/bits.h"

namespace tfs::posix {

using btree::Iterator;
using btree::Pos;
using btree::Transaction;

// Freeing an inode is one transaction (QueueFree): its inode and orphan keys,
// its symlink target and every xattr key, as whiteouts, and the inode
// count's key fit the smallest journal entry (a 64 KiB bucket's).
static_assert(sizeof(journal::EntryHeader) + (2 + kLinkChunks + kMaxXattrs + kMaxXattrChunks) *
                                                     journal::KeySpace(sizeof(btree::KeyHeader)) +
                      journal::KeySpace(sizeof(btree::KeyHeader) + sizeof(alloc::AcctRecord)) <=
                  sb::kMinBucket,
              "freeing an inode fits one journal entry");

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

Result<u64> CountInodeRecords(btree::Btrees* trees) {
  Iterator it(trees, btree::kBtreeInodes, 1024);
  u64 n = 0;
  Status st;
  // (Not a symlink target's chunk, nor a key at 2^56 or past it: no inode
  // is there -- the mount refuses such a key, fsck deletes it.)
  for (st = it.Seek(InodePos(1)); st.ok() && it.Valid() && it.pos().inode < btree::kInoLimit; st = it.Next())
    n += it.pos().offset == 0;
  TFS_TRY(st);
  return n;
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

// --- inodes --------------------------------------------------------------------

Filesystem::~Filesystem() {
  // Without Unmount (a test's crash): buffered data is lost, as in a crash.
  StopRepairer();
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

Result<u64> Filesystem::AllocIno() {
  // Never 2^56 or past it (btree::kInoLimit: the mount refuses a key there),
  // nor wrapped onto the root and the inodes in use.
  const u64 ino = next_ino_.FetchAdd(1, MemOrder::kRelaxed);
  if (ino >= btree::kInoLimit || ino < kFirstIno) {
    next_ino_.Store(~u64(0), MemOrder::kRelaxed);  // (stays spent: a wrapped counter must not come back)
    return Err::kNoSpace;
  }
  return ino;
}

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

Status Filesystem::QueueFree(Transaction* tx, u64 ino, bool* had_record) {
  InodeFormat f;
  Status st = ReadInode(ino, &f);
  // (A record that reads as corrupt, or not at all, is still one: its key
  // is deleted below and uncounted. Only a missing one is not.)
  *had_record = !st.Is(ErrorClass::kNotFound);
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
    InodeFormat f;
    // (A batch keeps room for the inode: QueuePunch stops short of the
    // journal entry's end, so an orphan of any shape is freed.)
    TFS_TRY(data_->QueuePunch(&tx, ino, 0, ~u64(0), &delta, kBatchExtents, Transaction::KeyBytes(u32(sizeof(f)))));
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
  bool had_record = false;
  TFS_TRY(QueueFree(&tx, ino, &had_record));
  store::AcctCommit count;  // the inode count, in the same transaction
  if (had_record) TFS_TRY(count.Queue(store_, &tx, alloc::AcctKind::kInodes, 0, -1));
  DebugNoSharedLock();
  TFS_TRY(tx.Commit().status());
  NoteFreed(true);
  return Status::Ok();
}

Status Filesystem::MetadataRoom() {
  return store_->alloc().MetadataRoom() ? Status::Ok() : Status(Err::kNoSpace);
}

void Filesystem::NoteFreed(bool freed) {
  if (!freed) return;
  ctr_.inodes_freed.FetchAdd(1, MemOrder::kRelaxed);
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

// --- inode locks ---------------------------------------------------------------

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
    // Inode numbers stay below 2^56: the last inode key (orphan keys sort
    // first) says whether one is past it -- before anything is written.
    Iterator it(trees_, btree::kBtreeInodes);
    TFS_TRY(it.SeekToLast());
    if (it.Valid() && it.pos().inode >= btree::kInoLimit) {
      // (Only a hostile key gets there.)
      platform::Log(platform::LogLevel::kError,
                    "posix: an inode key at number %llu, past the limit of 2^56; run 'tierfs fsck'",
                    (unsigned long long)it.pos().inode);
      return Status(Err::kCorrupt);
    }
    // Orphans a crash left: inodes unlinked while open, or not yet freed whole.
    TFS_TRY(it.Seek(OrphanPos(1)));
    Vector<u64> orphans;
    for (; it.Valid() && it.pos().inode == 0; TFS_TRY(it.Next())) {
      if (it.pos().offset >= btree::kInoLimit) {
        platform::Log(platform::LogLevel::kError,
                      "posix: an orphan key names inode %llu, past the limit of 2^56; run 'tierfs fsck'",
                      (unsigned long long)it.pos().offset);
        return Status(Err::kCorrupt);
      }
      TFS_TRY(orphans.PushBack(it.pos().offset));
    }
    if (store->read_only() && !orphans.empty()) {
      // (No name reaches them: a writable mount frees them.)
      platform::Log(platform::LogLevel::kInfo, "posix: %llu orphan inode%s left for a writable mount to free",
                    (unsigned long long)orphans.size(), orphans.size() == 1 ? "" : "s");
      orphans.Clear();
    }
    for (u64 ino : orphans) {
      TFS_TRY(FinishFree(ino));
      ctr_.orphans_freed.FetchAdd(1, MemOrder::kRelaxed);
    }
    // The format's features, before anything of theirs is written.
    // kSbCapsFlagged only once every flag is durable (the superblock's own
    // write is FUA, the flags' commits are not), and only if every inode
    // could be flagged (a damaged one is fsck's: the next mount tries again).
    if (!store->read_only() && (store->sb().flags & sb::kSbExtentPolicy) == 0)
      TFS_TRY(store->AddFeatures(sb::kSbExtentPolicy));  // (before a write stamps a policy: ExtentPolicy)
    if (!store->read_only() && (store->sb().flags & kSbFeatures) != kSbFeatures) {
      TFS_TRY(store->AddFeatures(sb::kSbXattrChunks));
      bool complete = false;
      TFS_TRY(FlagCapsInodes(&complete));
      TFS_TRY(store->journal().Flush());
      if (complete) TFS_TRY(store->AddFeatures(sb::kSbCapsFlagged));
    }
    // The next number: past the last inode's (its record or a symlink
    // target's chunk) -- one seek, not a walk; the inodes in use are the
    // accounting's count (statfs). Numbers are not reused within a mount.
    TFS_TRY(it.SeekToLast());
    const u64 last = it.Valid() ? it.pos().inode : 0;
    next_ino_.Store(Max(last + 1, kFirstIno), MemOrder::kRelaxed);
    InodeFormat root;
    Status rs = ReadInode(kRootIno, &root);
    if (rs.ok()) return IsDir(root) ? Status::Ok() : Status(Err::kCorrupt);
    if (!rs.Is(ErrorClass::kNotFound)) return rs;
    if (last != 0) return Err::kCorrupt;  // inodes but no root
    if (store->read_only()) return Status(Err::kReadOnly);  // (never mounted writable: no root to show)
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
    store::AcctCommit count;
    TFS_TRY(count.Queue(store, &tx, alloc::AcctKind::kInodes, 0, 1));
    DebugNoSharedLock();
    TFS_TRY(tx.Commit().status());
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
  if (st.ok() && opt_.repair_copies && !store->read_only()) {
    repairer_stop_.Store(false, MemOrder::kRelaxed);
    st = repairer_.Start(&RepairerMain, this, "tfs-repair");
    if (!st.ok()) StopFlusher();
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
  StopRepairer();  // (its repair in progress, if any, commits or aborts first)
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

// --- attributes, symlinks, directories, statfs ----------------------------------

Result<Attr> Filesystem::GetAttr(u64 ino) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  Attr a = ToAttr(ino, f);
  if ((f.mode.get() & kModeTypeMask) == kModeReg) OverlayBuffered(ino, &a);
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
  const dev::DevMask unavailable = store_->alloc().unavailable();
  for (u32 m = 0; m < sb.nr_members; m++) {
    const alloc::DeviceUsage u = store_->alloc().Usage(m);
    // (Free buckets the generation guard holds back are not free space
    // until a generation pass: docs/format/alloc.md, "Generations". Nor are
    // a degraded mount's missing member's: nothing is written there.)
    const u64 all_free = ((unavailable >> m) & 1) != 0 ? 0 : u.by_state[u32(alloc::BucketState::kFree)];
    const u64 free = all_free - Min(u.gen_blocked, all_free);
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
  out->files = store_->acct().inodes() + out->files_free;
  return Status::Ok();
}

// --- inode flags (chattr) -----------------------------------------------------

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
  // The flag mirrors the compression option (opts.h): +c makes it zstd, -c
  // unsets a zstd one (a "none" stays: it is not compressing either).
  const InodeFormat before = f;
  const bool zstd = f.compression == kOptCompressZstd;
  const bool flag = (f.flags.get() & kInodeFlagCompress) != 0;
  if ((flags & kFsComprFl) != 0 && !(zstd && flag)) {
    SetOpt(&f, kOptCompression, kOptCompressZstd);
  } else if ((flags & kFsComprFl) == 0 && (zstd || flag)) {
    SetOpt(&f, kOptCompression, zstd ? 0 : f.compression);
  }
  if (MemCompare(&before, &f, sizeof(f)) == 0) return Status::Ok();
  SetTime(&f.ctime_ns, Now());
  Transaction tx(trees_);
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  return tx.Commit(journal::CommitMode::kNoFlush).status();
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
