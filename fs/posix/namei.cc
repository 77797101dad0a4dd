// The namespace operations (fs.h): Lookup; Create and what calls it (Mknod,
// Mkdir, Symlink, CreateOpen); Link; Unlink and Rmdir (Remove); Rename. Each
// change is one transaction -- the entry, the inode it names, both
// directories' times and link counts -- committed whole or not at all.
//
// Locks: an operation takes all its inode locks at once (Locked: ascending
// inode order, at most four); Remove and Rename find their targets without
// locks, then look again under them and start over if the name changed. A
// rename across directories takes rename_mu_ first and holds it across its
// commit (the slow-member rule's one exception, fs.h). Lookup takes no lock.
// No data I/O here: an inode that lost its last link is freed after the
// directories' locks are released (FreeUnlinked), and every commit asserts
// that no table mutex is held (DebugNoSharedLock).
#include "posix/fs.h"

#include "posix/internal.h"
#include "posix/opts.h"
#include "util/bits.h"

namespace tfs::posix {

using btree::Iterator;
using btree::Transaction;

namespace {

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

constexpr u32 kLinkMax = 65000;  // links of one inode (EMLINK beyond)

}  // namespace

// --- lookups -------------------------------------------------------------------

Result<Attr> Filesystem::Lookup(u64 dir, const char* name, u32 len) {
  if (trees_ == nullptr) return Err::kInvalidArgument;
  ctr_.lookups.FetchAdd(1, MemOrder::kRelaxed);
  TFS_TRY(CheckName(name, len));
  InodeFormat d;
  TFS_TRY(ReadDirInode(dir, &d));
  if (IsDot(name, len)) return ToAttr(dir, d);
  if (IsDotDot(name, len)) return GetAttr(d.parent.get());
  Entry e;
  TFS_TRY(FindEntry(trees_, DirTable(dir, d), name, len, &e));
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

// --- creating ------------------------------------------------------------------

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
  TFS_TRY(FindEntry(trees_, DirTable(dir, d), name, len, &e));
  if (e.found) return Err::kExists;
  if (e.free == 0) return Err::kNoSpace;  // the name's chain ran to the end of the slots
  const u64 ino = TFS_TRY(AllocIno());
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
  InheritOpts(d, &f, store_->devs().size());  // the directory's valid options, marked inherited (opts.h)
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
  store::AcctCommit count;  // the inode count, in the same transaction
  TFS_TRY(count.Queue(store_, &tx, alloc::AcctKind::kInodes, 0, 1));
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

Result<Attr> Filesystem::CreateOpen(u64 dir, const char* name, u32 len, u32 mode, const Caller& who) {
  return Create(dir, name, len, kModeReg | (mode & kModePermMask), 0, nullptr, 0, who, true);
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
  TFS_TRY(FindEntry(trees_, DirTable(dir, d), name, len, &e));
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
    TFS_TRY(FindEntry(trees_, DirTable(dir, d), name, len, &e));
    if (!e.found) return Err::kNotFound;
    const u64 lock[2] = {dir, e.ino};
    Locked locked(this, lock, 2);
    TFS_TRY(locked.status());
    TFS_TRY(ReadDirInode(dir, &d));
    Entry again;
    TFS_TRY(FindEntry(trees_, DirTable(dir, d), name, len, &again));
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
    TFS_TRY(QueueRemoveEntry(trees_, &tx, btree::kBtreeDirents, dir, again.slot));
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
    TFS_TRY(FindEntry(trees_, DirTable(old_dir, od), old_name, old_len, s));
    if (!s->found) return Err::kNotFound;
    return FindEntry(trees_, DirTable(new_dir, nd), new_name, new_len, d);
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
      if (!(same_dir && slot == src.slot))
        TFS_TRY(QueueRemoveEntry(trees_, &tx, btree::kBtreeDirents, old_dir, src.slot));
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

}  // namespace tfs::posix
