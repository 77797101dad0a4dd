// fsck's namespace and file data pass (see fsck.h; design: docs/design/fsck.md):
// inodes, directory entries, symlinks, orphans, extents and xattrs, read through
// the btree API, and with -y repaired. The name tables' rules -- probing, entry
// removal, the entry format -- are posix's own functions (posix/names.h).
//
// Four scans in key order -- inodes, directory entries, extents, xattrs -- build
// one record per inode (InodeRec: what the inode says, and what the entries and
// extents say about it); then connectivity, link counts, parents, reachability,
// sector counts and sizes are compared.
//
// Repairs. Each is one btree transaction through the normal API, committed before
// the next one is worked out from the committed state, so a crash leaves every
// repair whole or not done and a second run finishes the job. The records follow
// every repair, so later checks judge the repaired state. Two rules keep the link
// counts right whatever order the records are visited in:
//   - removing an entry changes no link count on disk: the entry is uncounted in
//     the records, and the link count checks set what remains;
//   - adding an entry (to lost+found) changes the count it adds to on disk and in
//     the records in the same step, so a check before or after it agrees.
// Directory table fixes are found by the entries scan and applied after it, each
// against the committed table: removals and type fixes first, then moves of
// unreachable entries (so a name is never judged taken by an entry about to go),
// then tombstones that end chains.
#include "data/backpointer.h"
#include "data/data.h"
#include "fsck/pass.h"
#include "posix/fs.h"
#include "posix/names.h"
#include "posix/opts.h"
#include "util/bits.h"
#include "util/sort.h"

namespace tfs::fsck {
namespace {

using btree::Pos;
using btree::Transaction;

constexpr u32 kDeleteBatch = 256;  // keys per transaction when deleting a whole range
constexpr u32 kSectorsPerBlock = data::kBlockSize / 512;
constexpr u32 kLinkChunks = (posix::kSymlinkMax + btree::kMaxValueBytes - 1) / btree::kMaxValueBytes;
constexpr u32 kNewDirHashBits = 62;  // what posix gives every directory outside tests

struct InodeRec {
  u64 ino;
  u32 mode;
  u32 nlink;
  u64 size;
  u64 parent;        // directories: what the inode says
  u64 entry_dir;     // directories: the directory whose entry names it (0: none)
  u64 entry_slot;    // directories: that entry's slot
  u32 refs;          // entries naming it
  u32 subdirs;       // directories: entries naming directories
  u64 link_bytes;    // symlinks: bytes of target found
  bool link_bad;     // symlinks: a target chunk of the wrong length for its place
  u64 sectors;       // what the inode says
  u64 data_sectors;  // regular files: what its extents hold
  u64 data_end;      // regular files: the end block of its last written (not unwritten) extent
  bool orphan;
  bool gone;         // deleted by a repair
  bool caps_flag;    // kInodeFlagCaps is set
  bool caps_xattr;   // a security.capability xattr was found
  posix::OptsDamage opts;  // what is wrong with its option fields (CheckOptions)
};

bool IsDirMode(u32 mode) { return (mode & posix::kModeTypeMask) == posix::kModeDir; }
bool IsRegMode(u32 mode) { return (mode & posix::kModeTypeMask) == posix::kModeReg; }
bool IsLinkMode(u32 mode) { return (mode & posix::kModeTypeMask) == posix::kModeLink; }

Pos InodePos(u64 ino) { return Pos{btree::kBtreeInodes, ino, 0}; }
Pos OrphanPos(u64 ino) { return Pos{btree::kBtreeInodes, 0, ino}; }
Pos DirentPos(u64 dir, u64 slot) { return Pos{btree::kBtreeDirents, dir, slot}; }

// A new empty directory owned by root, as posix would make it.
posix::InodeFormat NewDirInode(u64 ino, u64 parent, u32 perm) {
  posix::InodeFormat f;
  MemSet(&f, 0, sizeof(f));
  const i64 now = platform::RealTimeNs();
  f.version.set(posix::kInodeVersion);
  f.mode.set(posix::kModeDir | perm);
  f.nlink.set(2);
  f.generation.set(u32(u64(now) / platform::kNsPerSec));
  f.atime_ns.set(u64(now));
  f.mtime_ns.set(u64(now));
  f.ctime_ns.set(u64(now));
  f.btime_ns.set(u64(now));
  f.parent.set(parent);
  f.hash_seed.set(Mix64(u64(now) ^ (ino * 0x9e3779b97f4a7c15ull) ^ 0x66736b63));
  f.hash_bits = u8(kNewDirHashBits);
  f.xattr_bits = u8(kNewDirHashBits);
  return f;
}

// A regular file fsck recreates (RecreateLost): root's, 0600, no data yet
// (the data pass sets its size and sectors from its extents).
posix::InodeFormat NewFileInode(u64 ino) {
  posix::InodeFormat f = NewDirInode(ino, 0, 0600);
  f.mode.set(posix::kModeReg | 0600);
  f.nlink.set(1);
  f.hash_seed.set(0);
  f.hash_bits = 0;
  return f;
}

// A fix of one directory slot, found by the entries scan, applied after it.
enum FixKind : u8 {
  kFixRemove = 1,    // the entry goes (posix's rule: a tombstone, or deleted with the tombstones before it)
  kFixRetype = 2,    // the type byte becomes `type`
  kFixMove = 4,      // unreachable from its home slot: moved to the first free slot of its chain
  kFixTrailing = 8,  // slot is the last of a run that ends in tombstones: they go
};
struct SlotFix {
  u64 dir;
  u64 slot;
  u8 kind;      // FixKind bits; kFixRemove overrides the others
  u8 type;      // kFixRetype
  u8 problems;  // findings this fix resolves
};

class NamespaceCheck {
 public:
  NamespaceCheck(store::Store& e, const Options& opt, Ctx& c, u16 had)
      : e_(e), t_(e.btrees()), repair_(opt.repair), c_(c), had_(had) {}

  // use: the superblock features (posix::kSbFeatures bits) the namespace
  // needs, once it passed.
  bool Run(FeatureUse* use) {
    Status st = Passes();
    if (!st.ok()) {
      c_.Line("namespace: %s failed: %s", write_failed_ ? "writing a repair" : "reading the btrees", st.Message());
      c_.report->errors++;
    }
    if (st.ok()) {
      use->in_use = feature_keys_ != 0;
      use->upgraded = upgraded_;
      use->extent_policy = policy_extents_ != 0;
    }
    return st.ok();
  }

 private:
  // --- reporting ----------------------------------------------------------------

  // A finding: an error, one line.
  void Problem(const char* fmt, ...) TFS_PRINTF(2, 3) {
    c_.report->errors++;
    found_++;
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    c_.VLine(fmt, ap);
    __builtin_va_end(ap);
  }
  // A repair done: one line saying what, resolving `n` findings.
  void Repaired(u32 n, const char* fmt, ...) TFS_PRINTF(3, 4) {
    c_.report->repaired += n;
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    c_.VLine(fmt, ap);
    __builtin_va_end(ap);
  }

  // --- btree helpers --------------------------------------------------------------

  // Every repair commits here: the first records that the counts may no
  // longer match the extents (BeginCountRepair) -- one superblock write per
  // run that repairs anything, cleared by the accounting pass.
  Status Commit(Transaction& tx) {
    Status st = BeginCountRepair(e_, c_);
    if (st.ok()) {
      auto r = tx.Commit();
      if (r.ok()) return Status::Ok();
      st = r.status();
    }
    write_failed_ = true;
    return st;
  }

  Status DeleteKey(const Pos& pos) {
    Transaction tx(&t_);
    TFS_TRY(tx.Delete(pos));
    return Commit(tx);
  }

  // Deletes extent x at pos with its backpointers (data::QueueBackpointers).
  Status DeleteExtent(const Pos& pos, const data::Extent& x) {
    Transaction tx(&t_);
    TFS_TRY(tx.Delete(pos));
    TFS_TRY(data::QueueBackpointers(&tx, e_.sb(), &x, nullptr));
    return Commit(tx);
  }

  // Deletes every key of `owner` in a btree, kDeleteBatch per transaction.
  Status DeleteAll(u8 id, u64 owner, u64* deleted) {
    for (;;) {
      btree::Iterator it(&t_, id);
      TFS_TRY(it.Seek(Pos{id, owner, 0}));
      Transaction tx(&t_);
      u32 n = 0;
      for (; it.Valid() && it.pos().inode == owner && n < kDeleteBatch; TFS_TRY(it.Next()), n++)
        TFS_TRY(tx.Delete(it.pos()));
      if (n == 0) return Status::Ok();
      TFS_TRY(Commit(tx));
      *deleted += n;
    }
  }

  Status ReadInode(u64 ino, posix::InodeFormat* f) {
    auto r = t_.Get(InodePos(ino), buf_, sizeof(buf_));
    if (!r.ok()) return r.status();
    return posix::ParseInode(buf_, Min(r.value(), u32(sizeof(buf_))), f);
  }

  // Reads inode `ino`, lets fn change it, writes it back: one transaction.
  template <typename Fn>
  Status UpdateInode(u64 ino, Fn fn) {
    posix::InodeFormat f;
    TFS_TRY(ReadInode(ino, &f));
    fn(f);
    Transaction tx(&t_);
    TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
    return Commit(tx);
  }

  // The record of a live inode (not one a repair deleted), or null.
  InodeRec* Find(u64 ino) {
    InodeRec* r = FindAny(ino);
    return r != nullptr && !r->gone ? r : nullptr;
  }
  InodeRec* FindAny(u64 ino) {
    usize lo = 0, hi = inodes_.size();
    while (lo < hi) {
      const usize mid = (lo + hi) / 2;
      if (inodes_[mid].ino < ino) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo < inodes_.size() && inodes_[lo].ino == ino ? &inodes_[lo] : nullptr;
  }

  // --- name tables ----------------------------------------------------------------
  //
  // posix's own rules (posix/names.h), walking on past a key that does not
  // parse: it occupies its slot until fsck's fix removes it (posix::Damaged).

  // Walks the probe chain of `name` from its home slot, as posix's lookups do.
  Status ProbeName(const posix::NameTable& nt, const char* name, u32 len, posix::Entry* out) {
    return posix::FindEntry(&t_, nt, name, len, out, nullptr, posix::Damaged::kOccupied);
  }

  // Queues the removal of the entry at (owner, slot) as posix removes one: a
  // tombstone if the next slot is in use, else a deletion together with the
  // tombstones right before it.
  Status QueueRemoveEntry(Transaction& tx, u8 id, u64 owner, u64 slot) {
    return posix::QueueRemoveEntry(&t_, &tx, id, owner, slot, posix::Damaged::kOccupied);
  }

  // An entry stops counting towards its inode's links (it is being removed).
  void Uncount(u64 dir, u64 slot, u64 ino) {
    InodeRec* r = Find(ino);
    if (r == nullptr || r->refs == 0) return;
    r->refs--;
    if (IsDirMode(r->mode) && r->entry_dir == dir && r->entry_slot == slot) {
      r->entry_dir = 0;
      if (InodeRec* d = Find(dir); d != nullptr && d->subdirs > 0) d->subdirs--;
    }
  }

  // --- inodes ---------------------------------------------------------------------

  // Every inode record parses; symlink targets are whole; orphan keys name
  // unlinked inodes. Repairs: stray and corrupt keys are deleted (an inode whose
  // record does not parse is gone: its names, data and xattrs follow in the later
  // scans), as is a symlink with a partial target (e2fsck's rule).
  Status ScanInodes() {
    btree::Iterator it(&t_, btree::kBtreeInodes);
    Status st = it.SeekToFirst();
    for (; st.ok() && it.Valid(); st = it.Next()) {
      const Pos p = it.pos();
      if (p.inode == 0) {
        if (it.val_bytes() != 8 || p.offset < posix::kRootIno || p.offset >= btree::kInoLimit) {
          Problem("namespace: bad orphan key: orphan key %llu", (unsigned long long)p.offset);
          if (repair_) {
            TFS_TRY(DeleteKey(p));
            Repaired(1, "namespace: deleted orphan key %llu", (unsigned long long)p.offset);
          }
          continue;
        }
        TFS_TRY(orphans_.PushBack(p.offset));
        continue;
      }
      if (p.inode >= btree::kInoLimit) {
        // Inode numbers stay below 2^56 (btree::kInoLimit; the mount refuses
        // a key past it). An inode there goes like a corrupt one: its names,
        // data and xattrs follow in the later scans.
        Problem("namespace: key (%llu, %llu) of the inodes btree: inode numbers stay below 2^56 (the mount refuses it)",
                (unsigned long long)p.inode, (unsigned long long)p.offset);
        if (repair_) {
          TFS_TRY(DeleteKey(p));
          Repaired(1, "namespace: deleted key (%llu, %llu) of the inodes btree%s", (unsigned long long)p.inode,
                   (unsigned long long)p.offset,
                   p.offset == 0 ? " (an inode record: its names, data and xattrs follow)" : "");
        }
        continue;
      }
      if (p.offset != 0) {  // a symlink's target chunk
        InodeRec* r = inodes_.empty() ? nullptr : &inodes_[inodes_.size() - 1];
        if (r == nullptr || r->ino != p.inode || !IsLinkMode(r->mode) || p.offset > kLinkChunks) {
          Problem("namespace: stray key in the inodes btree: (%llu, %llu)", (unsigned long long)p.inode,
                  (unsigned long long)p.offset);
          if (repair_) {
            TFS_TRY(DeleteKey(p));
            Repaired(1, "namespace: deleted key (%llu, %llu) of the inodes btree", (unsigned long long)p.inode,
                     (unsigned long long)p.offset);
          }
          continue;
        }
        // Chunk k holds bytes [2048 (k - 1), 2048 k) of the target: exactly that many.
        const u64 before = u64(btree::kMaxValueBytes) * (p.offset - 1);
        const u64 want = r->size > before ? Min<u64>(r->size - before, btree::kMaxValueBytes) : 0;
        if (it.val_bytes() != want) r->link_bad = true;
        r->link_bytes += it.val_bytes();
        continue;
      }
      posix::InodeFormat f;
      if (!posix::ParseInode(it.value(), it.val_bytes(), &f).ok()) {
        Problem("namespace: corrupt record of inode %llu", (unsigned long long)p.inode);
        if (repair_) {
          TFS_TRY(DeleteKey(p));
          Repaired(1, "namespace: deleted the record of inode %llu (its names, data and xattrs follow)",
                   (unsigned long long)p.inode);
        }
        continue;
      }
      InodeRec r{};
      r.ino = p.inode;
      r.mode = f.mode.get();
      r.nlink = f.nlink.get();
      r.size = f.size.get();
      r.parent = f.parent.get();
      r.sectors = f.sectors.get();
      r.caps_flag = (f.flags.get() & posix::kInodeFlagCaps) != 0;
      r.opts = posix::CheckOpts(f, e_.sb().nr_members);
      TFS_TRY(inodes_.PushBack(r));
    }
    TFS_TRY(st);
    TFS_TRY(RecreateLost());
    // Room for a new root and lost+found: appending them never moves the records
    // (pointers into inodes_ stay valid through every later repair).
    TFS_TRY(inodes_.Reserve(inodes_.size() + 2));

    for (InodeRec& r : inodes_) {
      if (!IsLinkMode(r.mode)) continue;
      const bool size_ok = r.size >= 1 && r.size <= posix::kSymlinkMax;
      if (size_ok && !r.link_bad && r.link_bytes == r.size) continue;
      if (size_ok && !r.link_bad) {
        Problem("namespace: incomplete symlink target of inode %llu: %llu of %llu bytes", (unsigned long long)r.ino,
                (unsigned long long)r.link_bytes, (unsigned long long)r.size);
      } else {
        Problem("namespace: bad symlink target of inode %llu: size %llu, its keys hold %llu bytes",
                (unsigned long long)r.ino, (unsigned long long)r.size, (unsigned long long)r.link_bytes);
      }
      if (!repair_) continue;
      Transaction tx(&t_);
      TFS_TRY(tx.Delete(InodePos(r.ino)));
      for (u32 i = 1; i <= kLinkChunks; i++) TFS_TRY(tx.Delete(Pos{btree::kBtreeInodes, r.ino, i}));
      TFS_TRY(tx.Delete(OrphanPos(r.ino)));
      TFS_TRY(Commit(tx));
      r.gone = true;
      Repaired(1, "namespace: deleted symlink %llu (its names follow)", (unsigned long long)r.ino);
    }

    for (u64 o : orphans_) {
      InodeRec* r = FindAny(o);
      if (r != nullptr && r->gone) continue;  // deleted with its orphan key
      if (r == nullptr || r->nlink != 0) {
        Problem("namespace: orphan key for a linked or missing inode %llu", (unsigned long long)o);
        if (repair_) {
          TFS_TRY(DeleteKey(OrphanPos(o)));
          Repaired(1, "namespace: deleted orphan key %llu", (unsigned long long)o);
        }
      } else {
        r->orphan = true;
      }
    }
    return Status::Ok();
  }

  // When the open dropped a damaged node of the inodes btree (and so lost
  // records; docs/design/fsck.md, "Damaged nodes and lost roots") -- or an
  // earlier fsck -y did and a cut ended it before this pass finished (the
  // superblock's lost_data_btrees) -- an inode
  // with no record whose extents or directory entries survive is recreated
  // instead of its data and names deleted: a regular file (0600, root's)
  // from its extents, a directory (0700) from its entries. The checks below
  // then set its size, sectors, links and parent, and reattach it under
  // lost+found if no entry names it. (The root is CheckRoot's.) Its xattrs
  // hashed by the lost record's generation: no lookup finds them, so they go.
  Status RecreateLost() {
    bool lost = (e_.lost_data_btrees() & (u32(1) << btree::kBtreeInodes)) != 0;
    for (const btree::LostNode& ln : t_.lost_nodes()) lost = lost || ln.btree_id == btree::kBtreeInodes;
    if (!lost) return Status::Ok();
    const usize had = inodes_.size();
    const u8 ids[2] = {btree::kBtreeExtents, btree::kBtreeDirents};
    for (u8 id : ids) {
      const bool dir = id == btree::kBtreeDirents;
      btree::Iterator it(&t_, id);
      Status st = it.SeekToFirst();
      // (Keys past the limit are left to the later scans: no inode can own them.)
      while (st.ok() && it.Valid() && it.pos().inode < btree::kInoLimit) {
        const u64 ino = it.pos().inode;
        bool known = ino <= posix::kRootIno || FindAny(ino) != nullptr;
        for (usize i = had; i < inodes_.size() && !known; i++) known = inodes_[i].ino == ino;
        if (!known) {
          Problem("namespace: the record of inode %llu is lost, but its %s survive", (unsigned long long)ino,
                  dir ? "directory entries" : "extents");
          if (repair_) {
            const posix::InodeFormat f = dir ? NewDirInode(ino, posix::kRootIno, 0700) : NewFileInode(ino);
            Transaction tx(&t_);
            TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
            TFS_TRY(Commit(tx));
            u64 xattrs = 0;
            TFS_TRY(DeleteAll(btree::kBtreeXattrs, ino, &xattrs));
            InodeRec r{};
            r.ino = ino;
            r.mode = f.mode.get();
            r.nlink = f.nlink.get();
            r.parent = f.parent.get();
            TFS_TRY(inodes_.PushBack(r));
            Repaired(1, "namespace: recreated inode %llu as a %s (mode %o, root's) from its %s%s",
                     (unsigned long long)ino, dir ? "directory" : "regular file", unsigned(f.mode.get() & 07777),
                     dir ? "entries" : "extents", xattrs != 0 ? "; its unreachable xattrs deleted" : "");
          }
        }
        st = it.Seek(Pos{id, ino + 1, 0});
      }
      TFS_TRY(st);
    }
    if (inodes_.size() != had)
      Sort(inodes_.data(), inodes_.size(), [](const InodeRec& a, const InodeRec& b) { return a.ino < b.ino; });
    return Status::Ok();
  }

  // Whether the namespace's four trees hold no key at all (formatted, never mounted).
  Result<bool> Empty() {
    const u8 ids[4] = {btree::kBtreeInodes, btree::kBtreeDirents, btree::kBtreeExtents, btree::kBtreeXattrs};
    for (u8 id : ids) {
      btree::Iterator it(&t_, id);
      TFS_TRY(it.SeekToFirst());
      if (it.Valid()) return false;
    }
    return true;
  }

  // A number above every inode any key names (posix numbers new inodes the same
  // way) and every record (so that appending it keeps the records sorted).
  Result<u64> NextIno() {
    u64 last = inodes_.empty() ? posix::kRootIno : Max(posix::kRootIno, inodes_[inodes_.size() - 1].ino);
    const u8 ids[4] = {btree::kBtreeInodes, btree::kBtreeDirents, btree::kBtreeExtents, btree::kBtreeXattrs};
    for (u8 id : ids) {
      // Keys at 2^56 and past left aside: no inode can own them (the inodes
      // scan deleted those numbers' inode keys; the later scans delete their
      // entries, extents and xattrs as a missing inode's).
      btree::Iterator it(&t_, id);
      TFS_TRY(it.SeekForPrev(Pos{id, btree::kInoLimit - 1, ~u64(0)}));
      if (it.Valid()) last = Max(last, it.pos().inode);
    }
    if (last >= btree::kInoLimit - 1) return Err::kNoSpace;  // (2^56-1 in use: no number left)
    return Max(last + 1, posix::kFirstIno);
  }

  // The root is a directory. Repair: a new empty one (its entries, if any are
  // left, hash differently now: the entries scan moves them to their home slots).
  Status CheckRoot() {
    InodeRec* root = Find(posix::kRootIno);
    if (root != nullptr && IsDirMode(root->mode)) return Status::Ok();
    Problem("namespace: no root directory (inode 1)");
    if (!repair_) return Status::Ok();
    posix::InodeFormat f = NewDirInode(posix::kRootIno, posix::kRootIno, 0755);
    Transaction tx(&t_);
    TFS_TRY(tx.Set(InodePos(posix::kRootIno), &f, sizeof(f)));
    // What inode 1 may have been instead: a symlink's target, an orphan.
    for (u32 i = 1; i <= kLinkChunks; i++) TFS_TRY(tx.Delete(Pos{btree::kBtreeInodes, posix::kRootIno, i}));
    TFS_TRY(tx.Delete(OrphanPos(posix::kRootIno)));
    TFS_TRY(Commit(tx));
    // Xattrs left under inode 1 hash by the old generation: no lookup finds them.
    u64 xattrs = 0;
    TFS_TRY(DeleteAll(btree::kBtreeXattrs, posix::kRootIno, &xattrs));
    InodeRec r{};
    r.ino = posix::kRootIno;
    r.mode = f.mode.get();
    r.nlink = 2;
    r.parent = posix::kRootIno;
    if (root == nullptr) root = FindAny(posix::kRootIno);  // deleted by a repair: reuse its record
    if (root == nullptr) {
      TFS_TRY(inodes_.PushBack(r));  // no reallocation (reserved); then moved to the front
      for (usize i = inodes_.size() - 1; i > 0; i--) inodes_[i] = inodes_[i - 1];
      inodes_[0] = r;
    } else {
      *root = r;
    }
    Repaired(1, "namespace: made a new, empty root directory (inode 1)%s",
             xattrs != 0 ? "; its old xattrs deleted" : "");
    return Status::Ok();
  }

  // --- directory entries ------------------------------------------------------------

  Status AddFix(u64 dir, u64 slot, u8 kind, u8 type) {
    if (!repair_) return Status::Ok();
    return fixes_.PushBack(SlotFix{dir, slot, kind, type, 1});
  }
  // The entry at (dir, slot) must go; it may have a fix already.
  Status AddRemoval(u64 dir, u64 slot) {
    if (!repair_) return Status::Ok();
    for (SlotFix& f : fixes_)
      if (f.dir == dir && f.slot == slot) {
        f.kind |= kFixRemove;
        f.problems++;
        return Status::Ok();
      }
    return AddFix(dir, slot, kFixRemove, 0);
  }

  // Every entry parses, names a live inode of its type and is reachable from its
  // home slot; no tombstone ends a chain; a directory has one name. Counts the
  // links and subdirectories. Entries of a missing directory are deleted at once;
  // the other fixes are collected (ApplyFixes).
  Status ScanDirents() {
    btree::Iterator it(&t_, btree::kBtreeDirents);
    u64 dir = 0, run_start = 0, prev = 0;
    bool tombstone_open = false;  // the current run has a tombstone with no live entry after it yet
    bool first = true;
    InodeRec* d = nullptr;
    posix::InodeFormat dfmt;
    auto end_run = [&]() -> Status {
      if (!tombstone_open) return Status::Ok();
      tombstone_open = false;
      Problem("namespace: a tombstone ends a chain in directory %llu, at slot %llu", (unsigned long long)dir,
              (unsigned long long)prev);
      return AddFix(dir, prev, kFixTrailing, 0);
    };
    Status st = it.SeekToFirst();
    for (; st.ok() && it.Valid(); st = it.Next()) {
      const Pos p = it.pos();
      if (first || p.inode != dir) {
        TFS_TRY(end_run());
        first = false;
        dir = p.inode;
        run_start = p.offset;
        d = Find(dir);
        if (d == nullptr || !IsDirMode(d->mode)) {
          d = nullptr;
          Problem("namespace: entries of a missing or non-directory inode %llu", (unsigned long long)dir);
          if (repair_) {
            u64 n = 0;
            TFS_TRY(DeleteAll(btree::kBtreeDirents, dir, &n));
            Repaired(1, "namespace: deleted the %llu entry keys of %llu, which is no directory", (unsigned long long)n,
                     (unsigned long long)dir);
          }
        } else {
          TFS_TRY(ReadInode(dir, &dfmt));
        }
      } else if (p.offset != prev + 1) {
        TFS_TRY(end_run());
        run_start = p.offset;
      }
      prev = p.offset;
      if (d == nullptr) continue;
      posix::DirentFormat de;
      const char* name;
      if (!posix::ParseNamedEntry(btree::kBtreeDirents, it.value(), it.val_bytes(), &de, &name).ok()) {
        Problem("namespace: corrupt entry in directory %llu, slot %llu", (unsigned long long)dir,
                (unsigned long long)p.offset);
        tombstone_open = false;  // it occupies its slot; its removal takes the tombstones before it
        TFS_TRY(AddFix(dir, p.offset, kFixRemove, 0));
        continue;
      }
      if (de.type == posix::kDtTombstone) {
        tombstone_open = true;
        continue;
      }
      tombstone_open = false;
      entries_++;
      const int nlen = int(de.name_len);
      InodeRec* target = Find(de.ino.get());
      if (target == nullptr) {
        Problem("namespace: entry names a missing inode in directory %llu: '%.*s' -> %llu", (unsigned long long)dir,
                nlen, name, (unsigned long long)de.ino.get());
        TFS_TRY(AddFix(dir, p.offset, kFixRemove, 0));
        continue;
      }
      u8 kind = 0, problems = 0;
      const u64 home = posix::NameHash(dfmt.hash_seed.get(), dfmt.hash_bits, name, de.name_len);
      if (home < run_start || home > p.offset) {
        Problem("namespace: unreachable entry in directory %llu: '%.*s' at slot %llu, home %llu",
                (unsigned long long)dir, nlen, name, (unsigned long long)p.offset, (unsigned long long)home);
        kind |= kFixMove;
        problems++;
      }
      const u8 type = posix::DirentTypeOf(target->mode);
      if (type != de.type) {
        Problem("namespace: entry type differs from its inode's, in directory %llu: '%.*s'", (unsigned long long)dir,
                nlen, name);
        kind |= kFixRetype;
        problems++;
      }
      if ((kind & kFixMove) == 0) {
        // Reachable, so its chain's first entry of this name is what a lookup
        // finds; a later one is a duplicate, unless the first is going (it
        // names no inode).
        posix::Entry pr;
        TFS_TRY(ProbeName(posix::DirTable(dir, dfmt), name, de.name_len, &pr));
        if (pr.found && pr.slot != p.offset && TFS_TRY(NamesLiveInode(dir, pr.slot))) {
          Problem("namespace: duplicate name in directory %llu: '%.*s' at slot %llu (first at slot %llu)",
                  (unsigned long long)dir, nlen, name, (unsigned long long)p.offset, (unsigned long long)pr.slot);
          if (repair_) TFS_TRY(fixes_.PushBack(SlotFix{dir, p.offset, u8(kind | kFixRemove), 0, u8(problems + 1)}));
          continue;  // not counted
        }
      }
      if (IsDirMode(target->mode) && target->entry_dir != 0) {
        // A directory has one name: keep the one its parent pointer agrees with,
        // else the first one found; the other goes (uncounted from here on).
        Problem("namespace: directory with two names: %llu ('%.*s' in %llu)", (unsigned long long)target->ino, nlen,
                name, (unsigned long long)dir);
        if (dir == target->parent && target->entry_dir != target->parent) {
          const u64 old_dir = target->entry_dir, old_slot = target->entry_slot;
          Uncount(old_dir, old_slot, target->ino);
          TFS_TRY(AddRemoval(old_dir, old_slot));
        } else {
          if (repair_) TFS_TRY(fixes_.PushBack(SlotFix{dir, p.offset, u8(kind | kFixRemove), 0, u8(problems + 1)}));
          continue;
        }
      }
      if (kind != 0 && repair_) TFS_TRY(fixes_.PushBack(SlotFix{dir, p.offset, kind, type, problems}));
      target->refs++;
      if (IsDirMode(target->mode)) {
        d->subdirs++;
        target->entry_dir = dir;
        target->entry_slot = p.offset;
      }
    }
    TFS_TRY(st);
    return end_run();
  }

  // Whether the entry at (dir, slot) parses and names a live inode.
  Result<bool> NamesLiveInode(u64 dir, u64 slot) {
    posix::DirentFormat de;
    const char* name;
    const bool parsed = TFS_TRY(ReadEntry(dir, slot, &de, &name));
    return parsed && de.type != posix::kDtTombstone && Find(de.ino.get()) != nullptr;
  }

  // Reads the entry at (dir, slot) into buf_: its header and name (false if absent or corrupt).
  Result<bool> ReadEntry(u64 dir, u64 slot, posix::DirentFormat* de, const char** name) {
    auto r = t_.Get(DirentPos(dir, slot), buf_, sizeof(buf_));
    if (!r.ok()) return r.status().Is(ErrorClass::kNotFound) ? Result<bool>(false) : Result<bool>(r.status());
    return posix::ParseNamedEntry(btree::kBtreeDirents, buf_, Min(r.value(), u32(sizeof(buf_))), de, name).ok();
  }

  Status FixRemove(const SlotFix& f) {
    char shown[posix::kNameMax + 1] = "?";
    auto r = t_.Get(DirentPos(f.dir, f.slot), buf_, sizeof(buf_));
    if (r.ok()) {
      posix::DirentFormat de;
      const char* name;
      if (posix::ParseNamedEntry(btree::kBtreeDirents, buf_, Min(r.value(), u32(sizeof(buf_))), &de, &name).ok()) {
        MemCopy(shown, name, de.name_len);
        shown[de.name_len] = '\0';
      }
      Transaction tx(&t_);
      TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeDirents, f.dir, f.slot));
      TFS_TRY(Commit(tx));
    } else if (!r.status().Is(ErrorClass::kNotFound)) {
      return r.status();
    }
    Repaired(f.problems, "namespace: removed entry '%s' (slot %llu) from directory %llu", shown,
             (unsigned long long)f.slot, (unsigned long long)f.dir);
    return Status::Ok();
  }

  Status FixRetype(const SlotFix& f) {
    posix::DirentFormat de;
    const char* name;
    auto r = t_.Get(DirentPos(f.dir, f.slot), buf_, sizeof(buf_));
    if (!r.ok()) return r.status();
    const u32 len = r.value();
    TFS_TRY(posix::ParseNamedEntry(btree::kBtreeDirents, buf_, len, &de, &name));
    buf_[__builtin_offsetof(posix::DirentFormat, type)] = f.type;
    Transaction tx(&t_);
    TFS_TRY(tx.Set(DirentPos(f.dir, f.slot), buf_, len));
    TFS_TRY(Commit(tx));
    Repaired(f.problems, "namespace: set the type of entry '%.*s' in directory %llu to its inode's (%u)",
             int(de.name_len), name, (unsigned long long)f.dir, unsigned(f.type));
    return Status::Ok();
  }

  // An entry unreachable from its home slot goes to the first free slot of its
  // chain -- unless the chain reaches it by now, or holds its name already (then
  // it is a duplicate and goes).
  Status FixMove(const SlotFix& f) {
    posix::DirentFormat de;
    const char* n;
    auto r = t_.Get(DirentPos(f.dir, f.slot), buf_, sizeof(buf_));
    if (!r.ok()) return r.status();
    TFS_TRY(posix::ParseNamedEntry(btree::kBtreeDirents, buf_, r.value(), &de, &n));
    char name[posix::kNameMax + 1];
    const u32 len = de.name_len;
    MemCopy(name, n, len);
    name[len] = '\0';
    const u64 ino = de.ino.get();
    const u8 type = (f.kind & kFixRetype) != 0 ? f.type : de.type;
    posix::InodeFormat dfmt;
    TFS_TRY(ReadInode(f.dir, &dfmt));
    posix::Entry pr;
    TFS_TRY(ProbeName(posix::DirTable(f.dir, dfmt), name, len, &pr));
    Transaction tx(&t_);
    if (pr.found && pr.slot == f.slot) {  // an earlier fix closed the gap
      if (type != de.type) {
        u8 v[posix::kDirentMax];
        TFS_TRY(tx.Set(DirentPos(f.dir, f.slot), v, posix::BuildDirent(v, ino, type, name, len)));
        TFS_TRY(Commit(tx));
      }
      Repaired(f.problems, "namespace: entry '%s' in directory %llu is reachable from its home slot now%s", name,
               (unsigned long long)f.dir, type != de.type ? " (type set to its inode's)" : "");
      return Status::Ok();
    }
    if (pr.found) {
      TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeDirents, f.dir, f.slot));
      TFS_TRY(Commit(tx));
      Uncount(f.dir, f.slot, ino);
      Repaired(f.problems,
               "namespace: removed unreachable entry '%s' (slot %llu) from directory %llu: its chain has that name",
               name, (unsigned long long)f.slot, (unsigned long long)f.dir);
      return Status::Ok();
    }
    if (pr.free == 0) {
      c_.Line("namespace: no free slot for entry '%s' in directory %llu; left unreachable", name,
              (unsigned long long)f.dir);
      return Status::Ok();
    }
    // The walk from the home slot stops before the entry's own run, so the
    // removal and the insert touch different slots.
    TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeDirents, f.dir, f.slot));
    u8 v[posix::kDirentMax];
    TFS_TRY(tx.Set(DirentPos(f.dir, pr.free), v, posix::BuildDirent(v, ino, type, name, len)));
    TFS_TRY(Commit(tx));
    InodeRec* t = Find(ino);
    if (t != nullptr && IsDirMode(t->mode) && t->entry_dir == f.dir && t->entry_slot == f.slot) t->entry_slot = pr.free;
    Repaired(f.problems, "namespace: moved entry '%s' in directory %llu from slot %llu to slot %llu%s", name,
             (unsigned long long)f.dir, (unsigned long long)f.slot, (unsigned long long)pr.free,
             type != de.type ? " (type set to its inode's)" : "");
    return Status::Ok();
  }

  // Tombstones that end a run go, unless an earlier fix put an entry after them.
  Status FixTrailing(const SlotFix& f) {
    btree::Iterator it(&t_, btree::kBtreeDirents);
    TFS_TRY(it.Seek(DirentPos(f.dir, f.slot + 1)));
    if (!(it.Valid() && it.pos().inode == f.dir && it.pos().offset == f.slot + 1)) {
      Transaction tx(&t_);
      TFS_TRY(posix::QueueDeleteTombstonesBefore(&t_, &tx, btree::kBtreeDirents, f.dir, f.slot + 1,
                                                 posix::Damaged::kOccupied));
      TFS_TRY(Commit(tx));
    }
    Repaired(f.problems, "namespace: deleted the tombstones ending the chain at slot %llu of directory %llu",
             (unsigned long long)f.slot, (unsigned long long)f.dir);
    return Status::Ok();
  }

  Status ApplyFixes() {
    for (const SlotFix& f : fixes_) {
      if ((f.kind & kFixRemove) != 0) {
        TFS_TRY(FixRemove(f));
      } else if (f.kind == kFixRetype) {
        TFS_TRY(FixRetype(f));
      }
    }
    for (const SlotFix& f : fixes_)
      if ((f.kind & kFixRemove) == 0 && (f.kind & kFixMove) != 0) TFS_TRY(FixMove(f));
    for (const SlotFix& f : fixes_)
      if (f.kind == kFixTrailing) TFS_TRY(FixTrailing(f));
    fixes_.Clear();
    return Status::Ok();
  }

  // --- connectivity, links, parents, lost+found -------------------------------------

  // Every directory reaches the root through the entries naming it, or is the top
  // of a subtree with no name (reattached later). A loop of directories that
  // reaches neither is broken: the entry naming the directory where the walk met
  // itself again goes, and that directory becomes such a top.
  Status CheckLoops() {
    Vector<u8> state;  // per record: 0 not seen, 1 on the current walk, 2 reaches the root or a top
    Vector<usize> path;
    TFS_TRY(state.Resize(inodes_.size()));
    for (usize i = 0; i < inodes_.size(); i++) {
      if (inodes_[i].gone || !IsDirMode(inodes_[i].mode) || state[i] != 0) continue;
      path.Clear();
      for (usize cur = i;;) {
        InodeRec& r = inodes_[cur];
        if (state[cur] == 2) break;
        if (state[cur] == 1) {
          Problem("namespace: directory %llu is in a loop of directories that the root does not reach",
                  (unsigned long long)r.ino);
          if (repair_) {
            const u64 dir = r.entry_dir, slot = r.entry_slot;
            Transaction tx(&t_);
            TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeDirents, dir, slot));
            TFS_TRY(Commit(tx));
            Uncount(dir, slot, r.ino);
            Repaired(1, "namespace: removed the entry naming directory %llu from directory %llu (slot %llu)",
                     (unsigned long long)r.ino, (unsigned long long)dir, (unsigned long long)slot);
          }
          break;
        }
        state[cur] = 1;
        TFS_TRY(path.PushBack(cur));
        if (r.ino == posix::kRootIno || r.entry_dir == 0) break;
        InodeRec* up = Find(r.entry_dir);
        if (up == nullptr) break;
        cur = usize(up - inodes_.data());
      }
      for (usize k : path) state[k] = 2;
    }
    return Status::Ok();
  }

  // /lost+found, found in the root or made (mode 0700, root's, as e2fsck makes
  // it) the first time something is reattached. Null, after one line, if there is
  // no root or the name is taken by something that is not a directory.
  Status LostFound(InodeRec** out) {
    *out = lost_found_ != 0 ? Find(lost_found_) : nullptr;
    if (*out != nullptr || lost_found_failed_) return Status::Ok();
    static constexpr char kName[] = "lost+found";
    constexpr u32 kLen = sizeof(kName) - 1;
    InodeRec* root = Find(posix::kRootIno);
    posix::InodeFormat rf;
    if (root == nullptr || !IsDirMode(root->mode) || !ReadInode(posix::kRootIno, &rf).ok()) {
      lost_found_failed_ = true;
      c_.Line("namespace: no root directory: nothing can be reattached");
      return Status::Ok();
    }
    posix::Entry pr;
    TFS_TRY(ProbeName(posix::DirTable(posix::kRootIno, rf), kName, kLen, &pr));
    if (pr.found) {
      posix::DirentFormat de;
      const char* name;
      const bool parsed = TFS_TRY(ReadEntry(posix::kRootIno, pr.slot, &de, &name));
      InodeRec* r = parsed ? Find(de.ino.get()) : nullptr;
      if (r == nullptr || !IsDirMode(r->mode)) {
        lost_found_failed_ = true;
        c_.Line("namespace: /lost+found is not a directory: nothing can be reattached");
        return Status::Ok();
      }
      lost_found_ = r->ino;
      *out = r;
      return Status::Ok();
    }
    if (pr.free == 0) {
      lost_found_failed_ = true;
      c_.Line("namespace: no slot for /lost+found in the root: nothing can be reattached");
      return Status::Ok();
    }
    const u64 ino = TFS_TRY(NextIno());
    posix::InodeFormat f = NewDirInode(ino, posix::kRootIno, 0700);
    rf.nlink.set(rf.nlink.get() + 1);
    u8 v[sizeof(posix::DirentFormat) + kLen];
    Transaction tx(&t_);
    TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
    TFS_TRY(
        tx.Set(DirentPos(posix::kRootIno, pr.free), v, posix::BuildDirent(v, ino, posix::kDtDir, kName, kLen)));
    TFS_TRY(tx.Set(InodePos(posix::kRootIno), &rf, sizeof(rf)));
    TFS_TRY(Commit(tx));
    InodeRec r{};
    r.ino = ino;
    r.mode = f.mode.get();
    r.nlink = 2;
    r.parent = posix::kRootIno;
    r.entry_dir = posix::kRootIno;
    r.entry_slot = pr.free;
    r.refs = 1;
    TFS_TRY(inodes_.PushBack(r));  // the largest number: the records stay sorted; room was reserved
    root = Find(posix::kRootIno);
    root->subdirs++;
    root->nlink++;
    lost_found_ = ino;
    *out = &inodes_[inodes_.size() - 1];
    c_.Line("namespace: made /lost+found (inode %llu)", (unsigned long long)ino);
    return Status::Ok();
  }

  // Gives an inode no entry names the name lost+found/#<ino>: a file gets nlink 1,
  // a directory lost+found as its parent (and lost+found one more link).
  Status Reattach(InodeRec& r) {
    InodeRec* lf;
    TFS_TRY(LostFound(&lf));
    if (lf == nullptr) return Status::Ok();
    char name[32];
    const u32 len = u32(platform::Format(name, sizeof(name), "#%llu", (unsigned long long)r.ino));
    posix::InodeFormat lff, f;
    TFS_TRY(ReadInode(lf->ino, &lff));
    TFS_TRY(ReadInode(r.ino, &f));
    posix::Entry pr;
    TFS_TRY(ProbeName(posix::DirTable(lf->ino, lff), name, len, &pr));
    if (pr.found || pr.free == 0) {
      c_.Line("namespace: /lost+found/%s %s; inode %llu left unreachable", name,
              pr.found ? "exists already" : "has no slot", (unsigned long long)r.ino);
      return Status::Ok();
    }
    const bool dir = IsDirMode(r.mode);
    u8 v[sizeof(posix::DirentFormat) + 32];
    Transaction tx(&t_);
    TFS_TRY(tx.Set(DirentPos(lf->ino, pr.free), v,
                   posix::BuildDirent(v, r.ino, posix::DirentTypeOf(r.mode), name, len)));
    if (dir) {
      f.parent.set(lf->ino);
      lff.nlink.set(lff.nlink.get() + 1);
      TFS_TRY(tx.Set(InodePos(lf->ino), &lff, sizeof(lff)));
    } else {
      f.nlink.set(1);
    }
    TFS_TRY(tx.Set(InodePos(r.ino), &f, sizeof(f)));
    TFS_TRY(Commit(tx));
    r.refs++;
    if (dir) {
      r.entry_dir = lf->ino;
      r.entry_slot = pr.free;
      r.parent = lf->ino;
      lf->subdirs++;
      lf->nlink++;
    } else {
      r.nlink = 1;
    }
    Repaired(1, "namespace: reattached inode %llu as /lost+found/%s", (unsigned long long)r.ino, name);
    return Status::Ok();
  }

  // Link counts and parents against the entries; every inode reachable (or an
  // orphan: a note, the next mount frees it). Repairs set the counted values and
  // reattach what no entry names under /lost+found.
  Status CheckInodes() {
    // By index: lost+found may be appended meanwhile (into reserved room).
    for (usize i = 0; i < inodes_.size(); i++) {
      InodeRec& r = inodes_[i];
      const unsigned long long ino = r.ino;
      if (r.gone) continue;
      const bool dir = IsDirMode(r.mode);
      const bool named = dir ? r.entry_dir != 0 : r.refs != 0;
      if (r.orphan && named) {
        // Mount would free it under its names.
        Problem("namespace: inode %llu is an orphan (unlinked) but entries name it", ino);
        if (repair_) {
          const u32 links = dir ? 2 + r.subdirs : r.refs;
          Transaction tx(&t_);
          TFS_TRY(tx.Delete(OrphanPos(r.ino)));
          TFS_TRY(Commit(tx));
          TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.nlink.set(links); }));
          r.orphan = false;
          r.nlink = links;
          Repaired(1, "namespace: inode %llu is linked again: orphan key deleted, nlink %u", ino, links);
        }
      }
      if (dir) {
        dirs_++;
        if (r.ino == posix::kRootIno) {
          if (r.entry_dir != 0 || r.parent != posix::kRootIno) {
            Problem("namespace: the root directory has a name or another parent");
            if (repair_) {
              if (r.entry_dir != 0) {
                Transaction tx(&t_);
                TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeDirents, r.entry_dir, r.entry_slot));
                TFS_TRY(Commit(tx));
                Uncount(r.entry_dir, r.entry_slot, r.ino);
              }
              TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.parent.set(posix::kRootIno); }));
              r.parent = posix::kRootIno;
              Repaired(1, "namespace: the root directory has no name and is its own parent");
            }
          }
        } else if (r.entry_dir == 0 && !r.orphan) {
          Problem("namespace: unreachable directory %llu", ino);
          if (repair_) TFS_TRY(Reattach(r));
        } else if (r.entry_dir != 0 && r.parent != r.entry_dir) {
          Problem("namespace: wrong parent of directory %llu: parent %llu, named in %llu", ino,
                  (unsigned long long)r.parent, (unsigned long long)r.entry_dir);
          if (repair_) {
            const u64 parent = r.entry_dir;
            TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.parent.set(parent); }));
            r.parent = parent;
            Repaired(1, "namespace: set the parent of directory %llu to %llu", ino, (unsigned long long)parent);
          }
        }
        if (r.orphan && !named) {
          c_.report->notes++;
          c_.Line("namespace: directory %llu is an orphan (removed while open); the next mount frees it", ino);
        }
        const u32 want = 2 + r.subdirs;
        if (r.nlink != want && !(r.orphan && r.nlink == 0)) {
          Problem("namespace: wrong link count of directory %llu: nlink %u, expected %u", ino, r.nlink, want);
          if (repair_) {
            TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.nlink.set(want); }));
            r.nlink = want;
            Repaired(1, "namespace: set the link count of directory %llu to %u", ino, want);
          }
        }
        continue;
      }
      if (r.orphan) {
        if (!named) {
          c_.report->notes++;
          c_.Line("namespace: inode %llu is an orphan (unlinked while open); the next mount frees it", ino);
        }
      } else if (r.refs == 0) {
        Problem("namespace: unreachable inode %llu", ino);
        if (repair_) TFS_TRY(Reattach(r));
      } else if (r.refs != r.nlink) {
        Problem("namespace: wrong link count of inode %llu: nlink %u, %u entries", ino, r.nlink, r.refs);
        if (repair_) {
          const u32 want = r.refs;
          TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.nlink.set(want); }));
          r.nlink = want;
          Repaired(1, "namespace: set the link count of inode %llu to %u", ino, want);
        }
      }
    }
    return Status::Ok();
  }

  // --- file data ----------------------------------------------------------------------

  // Extent `x` overlaps extents before it in the same file. The rule (keys carry
  // no version, so fsck cannot tell which write came last): the extent whose key
  // comes later -- the one ending later -- is kept whole; each earlier one loses
  // the blocks it shares with it: one starting before x keeps the piece before
  // x.start (data::BuildPiece: what an overwrite leaves of an extent, of any
  // kind), one starting inside x is deleted. Returns the blocks dropped.
  // Batched by journal bytes (a transaction commits before the next extent's
  // worst case -- both its keys and two backpointer keys per pointer --
  // would not fit its entry): x may overlap thousands of small extents; a
  // cut between batches leaves x overlapping fewer, which the next fsck
  // trims.
  Status TrimEarlier(const data::Extent& x, u64* dropped) {
    *dropped = 0;
    btree::Iterator it(&t_, btree::kBtreeExtents);
    TFS_TRY(it.SeekForPrev(Pos{btree::kBtreeExtents, x.ino, x.end - 1}));
    Transaction tx(&t_);
    const usize bp_bytes = Transaction::KeyBytes(u32(sizeof(data::BackpointerFormat)));
    for (; it.Valid() && it.pos().inode == x.ino; TFS_TRY(it.Prev())) {
      data::Extent y;
      if (!data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &y).ok() || y.end <= x.start) break;
      if (tx.size() > 0 && 2 * Transaction::KeyBytes(it.val_bytes()) + y.nr_ptrs * 2 * bp_bytes > tx.Room())
        TFS_TRY(Commit(tx));  // (the iterator sees it: the keys it passed are gone)
      if (y.start < x.start) {
        const u32 keep = u32(x.start - y.start);
        const u32 len = TFS_TRY(data::BuildPiece(y, 0, keep, buf_));
        TFS_TRY(tx.Set(Pos{btree::kBtreeExtents, x.ino, x.start}, buf_, len));
        TFS_TRY(tx.Delete(it.pos()));
        data::Extent piece;
        TFS_TRY(data::ParseExtent(Pos{btree::kBtreeExtents, x.ino, x.start}, buf_, len, &piece));
        TFS_TRY(data::QueueBackpointers(&tx, e_.sb(), &y, &piece));  // (the piece keeps y's positions)
        *dropped += y.end - x.start;
        break;
      }
      TFS_TRY(tx.Delete(it.pos()));
      TFS_TRY(data::QueueBackpointers(&tx, e_.sb(), &y, nullptr));
      *dropped += y.end - y.start;
      // (Its copies counted in used_: with -y its bad and stale cached ones are gone.)
      for (u32 i = 0; i < y.nr_ptrs; i++) {
        const data::Extent::Ptr& ptr = y.ptrs[i];
        u64 b;
        if (data::PtrInBucket(e_.sb(), y, ptr, &b) && used_[ptr.dev][b] > 0) used_[ptr.dev][b]--;
      }
    }
    return Commit(tx);
  }

  // The generation pass's end (docs/format/alloc.md, "Generations"), after
  // the walk of every extent. With -y every stale pointer is gone now
  // (dropped, or gone with its extent): each bucket's oldest generation is
  // its gen, and the buckets the guard held back are free again -- one
  // allocator call, a note. Without -y: a note of the buckets the guard
  // holds back (their stale pointers are what -y drops). Not when the
  // allocation state is suspect (nothing was checked against it).
  Status GenerationPass() {
    if (c_.alloc_stale) return Status::Ok();
    alloc::Allocator& a = e_.alloc();
    u64 blocked = 0;
    for (u32 d = 0; d < a.members(); d++) blocked += a.Usage(d).gen_blocked;
    if (!repair_) {
      if (blocked > 0) {
        c_.report->notes++;
        c_.Line("alloc: %llu free bucket%s wait%s for a generation pass (stale cached pointers may name them: fsck -y "
                "drops those and frees them)", (unsigned long long)blocked, blocked == 1 ? "" : "s",
                blocked == 1 ? "s" : "");
      }
      return Status::Ok();
    }
    Vector<alloc::OldestRaise> raises;
    for (u32 d = 0; d < a.members(); d++)
      for (u64 b = 0; b < a.nbuckets(d); b++) {
        const alloc::Bucket k = a.Get(d, b);
        if (k.oldest_gen != k.gen) TFS_TRY(raises.PushBack(alloc::OldestRaise{d, b, k.gen}));
      }
    if (raises.empty()) return Status::Ok();
    u64 raised = 0;
    Status st = a.RaiseOldestGen(raises.data(), u32(raises.size()), &raised, true);
    if (!st.ok()) {
      write_failed_ = true;
      return st;
    }
    c_.report->notes++;
    c_.Line("alloc: generation pass: the oldest generation of %llu bucket%s raised to its current one%s",
            (unsigned long long)raised, raised == 1 ? "" : "s",
            blocked > 0 ? " (the buckets the generation guard held back are free again)" : "");
    return Status::Ok();
  }

  // Why extent x has no good copy left, copy by copy (`outside`,
  // `old_cache`: bits of its pointers outside the buckets and stale cached;
  // the other bad ones' buckets hold other data), into why.
  static void LostWhy(const data::Extent& x, u32 outside, u32 old_cache, char* why, usize size) {
    if (x.nr_ptrs == 1) {
      platform::Format(why, size, "%s", (outside & 1u) != 0 ? "it points outside the buckets"
                                                              : "its bucket holds other data now");
      return;
    }
    why[0] = '\0';
    for (u32 i = 0; i < x.nr_ptrs; i++) {
      const u32 bit = 1u << i;
      const char* what = (outside & bit) != 0     ? "points outside the buckets"
                         : (old_cache & bit) != 0 ? "is a stale cached copy"
                                                  : "is in a bucket that holds other data now";
      const usize at = StrLen(why);
      platform::Format(why + at, size - at, "%scopy %u %s", i == 0 ? "" : "; ", i + 1, what);
    }
  }

  // Extents parse, belong to regular files, have every pointer inside a user
  // bucket of its generation (unwritten ones have no pointer) and do not
  // overlap; each file's sector count is what its extents hold and its size
  // covers them; user buckets no extent points into are a note. A cached
  // pointer of another generation than its bucket's is a stale cached copy:
  // normal (the cache dropped the bucket), not damage -- counted, and
  // dropped by -y. Repairs drop the bad pointers of an extent that keeps a
  // good copy: if none of those is authoritative, a good cached copy is
  // promoted first (data::SetCached: its bytes are the extent's); an extent
  // with no good copy at all is deleted (the data it held is lost, and the
  // line says why, copy by copy). Bad extents are deleted, overlaps trimmed
  // (TrimEarlier), sector counts and sizes set.
  Status ScanExtents() {
    const sb::Superblock& sbk = e_.sb();
    alloc::Allocator& a = e_.alloc();
    for (u32 d = 0; d < a.members(); d++) TFS_TRY(used_[d].Resize(a.nbuckets(d)));
    data::BuildMemberTable(e_.devs(), sbk, &members_);
    btree::Iterator xt(&t_, btree::kBtreeExtents);
    u64 prev_ino = 0, prev_end = 0;
    Status st = xt.SeekToFirst();
    for (; st.ok() && xt.Valid(); st = xt.Next()) {
      const Pos p = xt.pos();
      const unsigned long long ino = p.inode;
      data::Extent x;
      if (!data::ParseExtent(p, xt.value(), xt.val_bytes(), &x).ok()) {
        Problem("data: corrupt extent (%llu, %llu)", ino, (unsigned long long)p.offset);
        if (repair_) {
          TFS_TRY(DeleteKey(p));
          Repaired(1, "data: deleted extent key (%llu, %llu)", ino, (unsigned long long)p.offset);
        }
        continue;
      }
      extents_++;
      const unsigned long long start = x.start, end = x.end;
      InodeRec* r = Find(p.inode);
      if (r == nullptr || !IsRegMode(r->mode)) {
        Problem("data: extent of a missing or non-regular inode %llu", ino);
        if (repair_) {
          TFS_TRY(DeleteExtent(p, x));
          Repaired(1, "data: deleted the extent of inode %llu at blocks [%llu, %llu)", ino, start, end);
        }
        continue;
      }
      // The policy it was written under (data/policy.h): bytes this
      // filesystem cannot hold read as unset; -y writes them unset.
      data::Policy policy;
      if (!data::PolicyOf(x, members_, &policy)) {
        Problem("data: the extent of inode %llu at blocks [%llu, %llu) records a policy this filesystem cannot "
                "hold (read as the filesystem's options)", ino, start, end);
        if (repair_) {
          x.policy = data::Policy{};
          const u32 len = TFS_TRY(data::BuildExtent(x, buf_));
          TFS_TRY(data::ParseExtent(p, buf_, len, &x));
          Transaction tx(&t_);
          TFS_TRY(tx.Set(p, buf_, len));
          TFS_TRY(Commit(tx));
          Repaired(1, "data: reset the policy of the extent of inode %llu at blocks [%llu, %llu)", ino, start, end);
        }
      }
      // Each copy: inside one bucket (else `outside`), and in a user bucket
      // of its generation (else `stale`) -- unless there is no table to check
      // that against; a cached copy of another generation is a stale cached
      // copy (`old_cache`: not damage). An unwritten extent (fallocate) is a
      // reservation: it has no pointer.
      u32 outside = 0, stale = 0, old_cache = 0;  // bit i: pointer i
      for (u32 i = 0; i < x.nr_ptrs; i++) {
        const data::Extent::Ptr& q = x.ptrs[i];
        u64 b;
        char which[40] = "";
        if (x.nr_ptrs > 1) platform::Format(which, sizeof(which), " (copy %u of %u)", i + 1, x.nr_ptrs);
        if (!data::PtrInBucket(sbk, x, q, &b)) {
          outside |= 1u << i;
          Problem("data: extent points outside the buckets, inode %llu at block %llu%s", ino, start, which);
          continue;
        }
        if (c_.alloc_stale) continue;
        const alloc::Bucket k = a.Get(q.dev, b);
        if (q.cached && k.gen != q.gen && alloc::GenGap(k.gen, q.gen) > alloc::GenGap(k.gen, k.oldest_gen)) {
          // Older than the oldest generation its bucket says may remain
          // (the guard was broken: reuses could make it look current), or
          // of a generation the bucket has not reached (hostile).
          const bool ahead = alloc::GenGap(k.gen, q.gen) > 127;
          stale |= 1u << i;
          Problem("data: %s, inode %llu at block %llu%s: member %u bucket %llu is at generation %u, oldest %u "
                  "(pointer: %u)",
                  ahead ? "cached pointer of a generation its bucket has not reached"
                        : "stale cached pointer older than its bucket's oldest generation",
                  ino, start, which, unsigned(q.dev), (unsigned long long)b, unsigned(k.gen),
                  unsigned(k.oldest_gen), unsigned(q.gen));
          continue;
        }
        if (q.cached && k.gen != q.gen) {
          old_cache |= 1u << i;
          continue;
        }
        if (k.state != alloc::BucketState::kUser || k.gen != q.gen) {
          stale |= 1u << i;
          Problem("data: stale extent pointer, inode %llu at block %llu%s: member %u bucket %llu is %s, generation "
                  "%u (extent: %u)",
                  ino, start, which, unsigned(q.dev), (unsigned long long)b, alloc::BucketStateName(k.state),
                  unsigned(k.gen), unsigned(q.gen));
        }
      }
      stale_cached_ += PopCount(old_cache);
      const u32 bad = outside | stale;
      if ((bad | old_cache) != 0 && repair_) {
        const u32 nbad = PopCount(bad);
        const u32 drop = bad | old_cache;
        // A good copy that is not cached keeps the data; else the first good
        // cached one is promoted to keep it.
        bool kept = false;
        u32 promote = x.nr_ptrs;
        for (u32 i = 0; i < x.nr_ptrs; i++) {
          if ((drop & (1u << i)) != 0) continue;
          kept |= !x.ptrs[i].cached;
          if (x.ptrs[i].cached && promote == x.nr_ptrs) promote = i;
        }
        if (!kept && promote == x.nr_ptrs) {
          char why[200];
          LostWhy(x, outside, old_cache, why, sizeof(why));
          TFS_TRY(DeleteExtent(p, x));
          Repaired(nbad, "data: deleted the extent of inode %llu at blocks [%llu, %llu): %s (data lost)", ino, start,
                   end, why);
          continue;
        }
        const u32 promoted_dev = promote < x.nr_ptrs ? x.ptrs[promote].dev : 0;
        u32 len = 0;
        // The extent as it was, for its backpointers: the promoted copy gets
        // one (a cached copy has none), the dropped copies' go.
        const data::Extent had = x;
        // Promote first (the bad authoritative copy still makes the extent
        // valid meanwhile), then drop the bad and stale cached copies (the
        // last first, so the indices hold), then go on with what is left.
        if (!kept) {
          len = TFS_TRY(data::SetCached(x, promote, false, buf_));
          TFS_TRY(data::ParseExtent(p, buf_, len, &x));
        }
        for (u32 i = x.nr_ptrs; i-- > 0;) {
          if ((drop & (1u << i)) == 0) continue;
          len = TFS_TRY(data::DropPtr(x, i, buf_));
          TFS_TRY(data::ParseExtent(p, buf_, len, &x));
        }
        Transaction tx(&t_);
        TFS_TRY(tx.Set(p, buf_, len));
        TFS_TRY(data::QueueBackpointers(&tx, e_.sb(), &had, &x));
        TFS_TRY(Commit(tx));
        if (!kept) {
          promoted_++;
          Repaired(nbad, "data: dropped %u bad pointer%s of the extent of inode %llu at blocks [%llu, %llu) and "
                   "promoted its cached copy on member %u", nbad, nbad == 1 ? "" : "s", ino, start, end,
                   promoted_dev);
        } else if (nbad > 0) {
          Repaired(nbad, "data: dropped %u bad pointer%s of the extent of inode %llu at blocks [%llu, %llu); its "
                   "other copies keep the data", nbad, nbad == 1 ? "" : "s", ino, start, end);
        }
        outside = old_cache = 0;
      }
      if (p.inode == prev_ino && x.start < prev_end) {
        Problem("data: overlapping extents in inode %llu at block %llu", ino, start);
        if (repair_) {
          u64 dropped = 0;
          TFS_TRY(TrimEarlier(x, &dropped));
          r->data_sectors -= Min(r->data_sectors, dropped * kSectorsPerBlock);
          Repaired(1, "data: inode %llu: kept blocks [%llu, %llu) of the extent ending last, dropped %llu "
                   "overlapped blocks of earlier extents (data lost)",
                   ino, start, end, (unsigned long long)dropped);
        }
      }
      if (!(x.policy == data::Policy{})) policy_extents_++;  // (kept: the repairs above did not delete it)
      prev_ino = p.inode;
      prev_end = x.end;
      r->data_sectors += (x.end - x.start) * kSectorsPerBlock;  // (reservations count too)
      if (x.unwritten) continue;  // may lie past the size (fallocate with KEEP_SIZE)
      // Every copy inside the buckets holds its bucket (cached ones too: the
      // data path frees a bucket only when no pointer counts in it), but a
      // stale cached one (it counts nowhere: DataPath::PtrCounts).
      for (u32 i = 0; i < x.nr_ptrs; i++) {
        u64 b;
        if (((outside | old_cache) & (1u << i)) == 0 && data::PtrBucket(sbk, x.ptrs[i], &b))
          used_[x.ptrs[i].dev][b]++;
      }
      r->data_end = Max(r->data_end, x.end);
    }
    TFS_TRY(st);
    if (stale_cached_ > 0) {
      // Normal, not damage (bcachefs's view too): one note for all of them.
      c_.report->notes++;
      if (repair_) {  // (each dropped, or gone with its extent)
        c_.Line("data: %llu stale cached pointer%s dropped (their cache buckets hold other data now: not damage)",
                (unsigned long long)stale_cached_, stale_cached_ == 1 ? "" : "s");
      } else {
        c_.Line("data: %llu stale cached pointer%s (their cache buckets hold other data now: not damage; fsck -y "
                "drops them)", (unsigned long long)stale_cached_, stale_cached_ == 1 ? "" : "s");
      }
    }
    if (promoted_ > 0)
      c_.Line("data: promoted %llu cached cop%s whose authoritative copy was bad", (unsigned long long)promoted_,
              promoted_ == 1 ? "y" : "ies");
    TFS_TRY(GenerationPass());
    for (u32 d = 0; d < a.members(); d++)
      for (u64 b = 0; b < a.nbuckets(d); b++)
        if (a.Get(d, b).state == alloc::BucketState::kUser && used_[d][b] == 0 && !c_.alloc_stale) {
          // Emptied, its free lost (a crash, a failed commit): mount frees it.
          c_.report->notes++;
          c_.Line("data: member %u bucket %llu is marked user but holds no extent; the next mount frees it", d,
                  (unsigned long long)b);
        }
    for (InodeRec& r : inodes_) {
      if (r.gone || !IsRegMode(r.mode)) continue;
      const unsigned long long ino = r.ino;
      if (r.sectors != r.data_sectors) {
        Problem("data: wrong sector count of inode %llu: %llu, extents hold %llu", ino,
                (unsigned long long)r.sectors, (unsigned long long)r.data_sectors);
        if (repair_) {
          const u64 want = r.data_sectors;
          TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.sectors.set(want); }));
          r.sectors = want;
          Repaired(1, "data: set the sector count of inode %llu to %llu", ino, (unsigned long long)want);
        }
      }
      // The size covers the data: e2fsck's choice (extend the size), which keeps
      // every byte; the bytes past the old size read as what the blocks hold.
      if (r.data_end > (r.size + data::kBlockSize - 1) / data::kBlockSize) {
        const u64 want = r.data_end * data::kBlockSize;
        Problem("data: inode %llu has data past its size: size %llu, data up to byte %llu", ino,
                (unsigned long long)r.size, (unsigned long long)want);
        if (repair_) {
          TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) { f.size.set(want); }));
          r.size = want;
          Repaired(1, "data: set the size of inode %llu to %llu, the end of its data", ino, (unsigned long long)want);
        }
      }
    }
    return Status::Ok();
  }

  // --- xattrs -------------------------------------------------------------------------

  // A chunked value of the inode being scanned (one of its first kMaxXattrs
  // table keys): its descriptor, and what the chunk keys of its id showed.
  struct ChunkedValue {
    u64 slot;
    u64 id;
    u32 len;
    u32 crc;               // the descriptor's
    u32 chunks;            // XattrChunkCount(len)
    u32 next = 0;          // chunks 0..next-1 were found in order, each of its length
    u32 seen = 0;          // crc32c of those chunks' bytes
    bool bad = false;      // chunk `next` is missing (a later one came) or of the wrong length
    bool bad_len = false;  // (which of the two)
    bool keeper = false;   // whole, and the first whole value of its id: the chunks are its
    bool gone = false;     // removed with its chunks by a repair
    bool caps = false;     // named security.capability
    bool Whole() const { return !bad && next == chunks && seen == crc; }
  };

  // One inode's xattr keys as they stream past: its table's slots first, then
  // its chunk keys, by id and then index (kXattrChunkBase + 32 id + i). Each
  // id is judged when the walk leaves it, so what is held is bounded: the
  // chunked values of the first kMaxXattrs table keys (the keys past them are
  // deleted) and a bitmap of one id's chunks.
  static constexpr u64 kNoId = ~u64(0);
  struct XattrInode {
    u64 ino = 0;
    InodeRec* rec = nullptr;   // null: no live inode (each key is deleted as it passes)
    u64 table_keys = 0;        // table keys seen, tombstones and bad ones included
    u64 excess_deleted = 0;    // of those past kMaxXattrs, deleted (-y)
    bool caps = false;         // a security.capability entry among the kept keys
    bool chunk_phase = false;  // chunk keys have begun: values_ is sorted by (id, slot)
    usize next = 0;            // values_[next..] are not judged yet
    usize group_end = 0;       // values_[next..group_end) claim group_id
    u64 group_id = kNoId;      // the id whose chunk keys are streaming
    u32 group_seen = 0;        // its chunk indices seen (bit i)
    u32 total = 0;             // chunks of the values judged whole
  };

  // Xattrs belong to inodes and parse; a chunked value has exactly its chunks
  // (each of its length, their bytes passing its crc) and no chunk key is left
  // without a value; an inode's table holds at most kMaxXattrs keys and its
  // chunks stay within kMaxXattrChunks (posix frees them all in one
  // transaction: more would make that fail, and with it the mount that frees
  // an orphan); kInodeFlagCaps is set exactly when the inode has a
  // security.capability xattr. Repairs: keys of no inode are deleted; a
  // corrupt key of a live inode is removed as posix removes an xattr; a
  // damaged chunked value is removed with its chunks (one transaction), a
  // chunk of no value deleted; table keys past the first kMaxXattrs are
  // deleted; the flag is set or cleared.
  Status ScanXattrs() {
    btree::Iterator it(&t_, btree::kBtreeXattrs);
    Status st = it.SeekToFirst();
    bool started = false;
    for (; st.ok() && it.Valid(); st = it.Next()) {
      const Pos p = it.pos();
      if (!started || p.inode != x_.ino) {
        if (started) TFS_TRY(FinishXattrInode());
        x_ = XattrInode{};
        x_.ino = p.inode;
        x_.rec = Find(p.inode);
        started = true;
      }
      const unsigned long long ino = p.inode, slot = p.offset;
      const bool has_owner = x_.rec != nullptr;
      if (has_owner && p.offset >= posix::kXattrChunkBase) {
        TFS_TRY(DeleteExcess());
        TFS_TRY(XattrChunk(p, it.value(), it.val_bytes()));
        continue;
      }
      if (has_owner && ++x_.table_keys > posix::kMaxXattrs) {
        // Reported with the count when the inode's keys end; a chunked
        // value's chunks are left to be deleted as strays.
        if (repair_) {
          TFS_TRY(excess_.PushBack(p));
          if (excess_.size() == kDeleteBatch) TFS_TRY(DeleteExcess());
        }
        continue;
      }
      posix::DirentFormat xe;
      const char* name;
      const u8* after;
      if (!has_owner ||
          !posix::ParseNamedEntry(btree::kBtreeXattrs, it.value(), it.val_bytes(), &xe, &name, &after).ok()) {
        Problem("namespace: bad or ownerless xattr key (%llu, %llu)", ino, slot);
        if (!repair_) continue;
        Transaction tx(&t_);
        if (has_owner) {
          TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeXattrs, p.inode, p.offset));
        } else {
          TFS_TRY(tx.Delete(p));
        }
        TFS_TRY(Commit(tx));
        Repaired(1, "namespace: removed xattr key (%llu, %llu)%s", ino, slot, has_owner ? "" : ": no such inode");
        continue;
      }
      if (xe.type == posix::kDtTombstone) continue;
      xattrs_++;
      const bool caps = posix::IsCapsName(name, xe.name_len);
      x_.caps = x_.caps || caps;
      if (xe.type != posix::kXattrChunked) continue;
      posix::XattrChunksFormat d;
      TFS_TRY(posix::ParseXattrChunks(xe, after, &d));  // (ParseNamedEntry checked it)
      ChunkedValue v{};
      v.slot = p.offset;
      v.id = d.id.get();
      v.len = d.value_len.get();
      v.crc = d.crc.get();
      v.chunks = posix::XattrChunkCount(v.len);
      v.caps = caps;
      TFS_TRY(values_.PushBack(v));  // at most kMaxXattrs of them
    }
    TFS_TRY(st);
    if (started) TFS_TRY(FinishXattrInode());
    return CheckCapsFlags();
  }

  // Deletes the table keys past kMaxXattrs queued so far (kDeleteBatch a
  // transaction).
  Status DeleteExcess() {
    if (excess_.empty()) return Status::Ok();
    Transaction tx(&t_);
    for (const Pos& p : excess_) TFS_TRY(tx.Delete(p));
    TFS_TRY(Commit(tx));
    x_.excess_deleted += excess_.size();
    excess_.Clear();
    return Status::Ok();
  }

  // Chunk key p (of a live inode; its value `v`, `len` bytes) as it streams past.
  Status XattrChunk(const Pos& p, const u8* v, u32 len) {
    if (!x_.chunk_phase) {
      // The table is done: its values by (id, slot), the order chunk keys come in.
      Sort(values_.data(), values_.size(),
           [](const ChunkedValue& a, const ChunkedValue& b) { return a.id != b.id ? a.id < b.id : a.slot < b.slot; });
      x_.chunk_phase = true;
    }
    const u64 id = (p.offset - posix::kXattrChunkBase) / posix::kXattrChunksPerValue;
    const u32 i = u32((p.offset - posix::kXattrChunkBase) % posix::kXattrChunksPerValue);
    if (id != x_.group_id) {
      TFS_TRY(FinishChunkGroup());
      // Ids before this one that no chunk key had: their values are judged now.
      while (x_.next < values_.size() && values_[x_.next].id < id) TFS_TRY(JudgeNextId());
      StartChunkGroup(id);
    }
    x_.group_seen |= u32(1) << i;
    if (x_.next == x_.group_end) {  // no value claims the id
      Problem("namespace: xattr chunk (%llu, %llu) belongs to no value of its inode", (unsigned long long)p.inode,
              (unsigned long long)p.offset);
      if (repair_) {
        TFS_TRY(DeleteKey(p));
        Repaired(1, "namespace: deleted xattr chunk (%llu, %llu)", (unsigned long long)p.inode,
                 (unsigned long long)p.offset);
      }
      return Status::Ok();
    }
    // Chunk i of every value that claims its id (one, unless damaged).
    for (usize k = x_.next; k < x_.group_end; k++) {
      ChunkedValue& c = values_[k];
      if (c.bad || i >= c.chunks) continue;  // (past its chunks: judged as a stray)
      if (i != c.next || len != posix::XattrChunkLen(c.len, i)) {
        c.bad = true;
        c.bad_len = i == c.next;
        continue;
      }
      c.seen = platform::Crc32cExtend(c.seen, v, len);
      c.next++;
    }
    return Status::Ok();
  }

  void StartChunkGroup(u64 id) {
    x_.group_id = id;
    x_.group_seen = 0;
    x_.group_end = x_.next;
    while (x_.group_end < values_.size() && values_[x_.group_end].id == id) x_.group_end++;
  }

  // The values of the next unjudged id, which had no chunk key.
  Status JudgeNextId() {
    StartChunkGroup(values_[x_.next].id);
    return FinishChunkGroup();
  }

  // The end of one id's chunk keys: judges the values that claim it and the
  // chunks past its keeper's. Of values sharing an id (damage) the chunks
  // decide -- the first whole one keeps them -- and the others lose their
  // entries alone; when none is whole, each goes with every chunk of the id.
  Status FinishChunkGroup() {
    if (x_.group_id == kNoId) return Status::Ok();
    const unsigned long long ino = x_.ino, id = x_.group_id;
    ChunkedValue* keeper = nullptr;
    for (usize k = x_.next; k < x_.group_end; k++) {
      if (keeper == nullptr && values_[k].Whole()) {
        keeper = &values_[k];
        keeper->keeper = true;
      }
    }
    for (usize k = x_.next; k < x_.group_end; k++) {
      ChunkedValue& v = values_[k];
      const unsigned long long slot = v.slot;
      if (v.keeper) {
        x_.total += v.chunks;
        continue;
      }
      if (keeper != nullptr) {
        Problem("namespace: chunked xattr (%llu, %llu) has the id %llu of another value of its inode", ino, slot, id);
        if (repair_) {
          Transaction tx(&t_);  // the entry alone: the chunks are the other's
          TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeXattrs, x_.ino, v.slot));
          TFS_TRY(Commit(tx));
          if (v.caps) x_.caps = false;  // (one name is in a table once)
          Repaired(1, "namespace: removed xattr key (%llu, %llu)", ino, slot);
        }
        continue;
      }
      if (v.bad || v.next != v.chunks) {
        Problem("namespace: chunked xattr (%llu, %llu) is damaged: chunk %u of %u is %s", ino, slot, v.next, v.chunks,
                v.bad_len ? "of the wrong length" : "missing");
      } else {
        Problem("namespace: chunked xattr (%llu, %llu) is damaged: its %u bytes fail their crc", ino, slot, v.len);
      }
      if (repair_) TFS_TRY(RemoveChunkedValue(x_.ino, &v, "damaged", 1));
    }
    // Chunks past the keeper's last (those of an id whose claimants are all
    // damaged go with them).
    if (keeper != nullptr) {
      for (u32 i = keeper->chunks; i < posix::kXattrChunksPerValue; i++) {
        if (((x_.group_seen >> i) & 1) == 0) continue;
        const unsigned long long at = posix::XattrChunkOffset(x_.group_id, i);
        Problem("namespace: xattr chunk (%llu, %llu) belongs to no value of its inode", ino, at);
        if (repair_) {
          TFS_TRY(DeleteKey(Pos{btree::kBtreeXattrs, x_.ino, at}));
          Repaired(1, "namespace: deleted xattr chunk (%llu, %llu)", ino, at);
        }
      }
    }
    x_.next = x_.group_end;
    x_.group_id = kNoId;
    return Status::Ok();
  }

  // The end of one inode's xattr keys: the ids no chunk key reached, the
  // bound on chunks, the keys past the table's bound; empties values_.
  Status FinishXattrInode() {
    const unsigned long long ino = x_.ino;
    TFS_TRY(DeleteExcess());
    if (x_.rec != nullptr) {
      if (!x_.chunk_phase) {
        Sort(values_.data(), values_.size(),
             [](const ChunkedValue& a, const ChunkedValue& b) { return a.id != b.id ? a.id < b.id : a.slot < b.slot; });
        x_.chunk_phase = true;
      }
      TFS_TRY(FinishChunkGroup());
      while (x_.next < values_.size()) TFS_TRY(JudgeNextId());
      // More chunks than posix allows: values go, last slot first, until the
      // rest fit.
      if (x_.total > posix::kMaxXattrChunks) {
        Problem("namespace: inode %llu has %u xattr chunks, more than %u", ino, x_.total, posix::kMaxXattrChunks);
        while (repair_ && x_.total > posix::kMaxXattrChunks) {
          ChunkedValue* last = nullptr;
          for (ChunkedValue& v : values_)
            if (v.keeper && !v.gone && (last == nullptr || v.slot > last->slot)) last = &v;
          if (last == nullptr) break;
          const u32 resolves = x_.total - last->chunks <= posix::kMaxXattrChunks ? 1 : 0;  // the last removal
          TFS_TRY(RemoveChunkedValue(x_.ino, last, "over the inode's bound", resolves));
          x_.total -= last->chunks;
        }
      }
      if (x_.table_keys > posix::kMaxXattrs) {
        Problem("namespace: inode %llu has %llu xattr table keys, more than %u", ino,
                (unsigned long long)x_.table_keys, posix::kMaxXattrs);
        if (repair_)
          Repaired(1, "namespace: deleted the %llu xattr table keys of inode %llu past its first %u (their names "
                   "are lost)", (unsigned long long)x_.excess_deleted, ino, posix::kMaxXattrs);
      }
      x_.rec->caps_xattr = x_.caps;
      // What needs the feature once the repairs are done: the chunked values
      // kept (their chunks go with them; stray chunks are deleted with -y
      // and reported without).
      for (const ChunkedValue& v : values_) feature_keys_ += v.gone ? 0 : 1;
    }
    values_.Clear();
    return Status::Ok();
  }

  // Removes a chunked value as posix does: its entry and every chunk key its
  // id may have, in one transaction. `resolves`: the findings this repairs.
  Status RemoveChunkedValue(u64 owner, ChunkedValue* v, const char* why, u32 resolves) {
    Transaction tx(&t_);
    TFS_TRY(QueueRemoveEntry(tx, btree::kBtreeXattrs, owner, v->slot));
    for (u32 i = 0; i < posix::kXattrChunksPerValue; i++)
      TFS_TRY(tx.Delete(Pos{btree::kBtreeXattrs, owner, posix::XattrChunkOffset(v->id, i)}));
    TFS_TRY(Commit(tx));
    v->gone = true;
    if (v->caps) x_.caps = false;  // (one name is in a table once)
    Repaired(resolves, "namespace: removed chunked xattr (%llu, %llu) and its chunks (%s)", (unsigned long long)owner,
             (unsigned long long)v->slot, why);
    return Status::Ok();
  }

  // kInodeFlagCaps agrees with the security.capability xattrs the scan found
  // (a write tests the flag instead of looking the name up). A flag missing
  // would let an O_DIRECT write keep the capability; one left over costs a
  // write a lookup. Repair: set or cleared. A filesystem without
  // kSbCapsFlagged is from a build before the flag (or its upgrade was cut
  // short): a capability without its flag is its format, a note -- the next
  // read-write mount flags it (posix::Filesystem::FlagCapsInodes), and so
  // does -y.
  Status CheckCapsFlags() {
    const bool old_format = (had_ & sb::kSbCapsFlagged) == 0;
    for (InodeRec& r : inodes_) {
      if (r.gone) continue;
      if (old_format && r.caps_xattr && !r.caps_flag) {
        c_.report->notes++;
        c_.Line("namespace: inode %llu has a security.capability xattr from before the capability flag: %s",
                (unsigned long long)r.ino, repair_ ? "flagged it" : "the next read-write mount flags it");
        if (repair_) {
          TFS_TRY(UpdateInode(r.ino, [](posix::InodeFormat& f) { f.flags.set(u16(f.flags.get() | posix::kInodeFlagCaps)); }));
          upgraded_ = true;
        }
        continue;
      }
      if (r.caps_flag != r.caps_xattr) {
        Problem("namespace: inode %llu %s", (unsigned long long)r.ino,
                r.caps_xattr ? "has a security.capability xattr but not its flag"
                             : "has the security.capability flag but no such xattr");
        if (repair_) {
          const bool want = r.caps_xattr;
          TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& f) {
            f.flags.set(u16(want ? f.flags.get() | posix::kInodeFlagCaps : f.flags.get() & ~posix::kInodeFlagCaps));
          }));
          r.caps_flag = want;
          Repaired(1, "namespace: %s the security.capability flag of inode %llu", want ? "set" : "cleared",
                   (unsigned long long)r.ino);
        }
      }
      if (r.caps_flag) feature_keys_++;  // (as repaired: a flag on disk keeps older builds off)
    }
    return Status::Ok();
  }

  // The inodes' options (posix/opts.h): each value one this filesystem can
  // hold (a target naming one of its members or a member's group, replicas
  // 1..4, compression none or zstd), the reserved bytes and inherited bits
  // past the options zero, kInodeFlagCompress mirroring the compression
  // option. Repair, one transaction per inode: a bad option is unset (the
  // filesystem's applies; its data stays where it is), the reserved bytes
  // zeroed, the flag made to follow the option (a flag with the option
  // unset -- damage, as no path sets one without the other -- makes the
  // option zstd, the one value the flag mirrors). Nothing else reads them:
  // posix places and compresses data as if a bad option were unset.
  Status CheckOptions() {
    const u32 members = e_.sb().nr_members;
    for (InodeRec& r : inodes_) {
      if (r.gone || !r.opts.any()) continue;
      posix::InodeFormat f;
      TFS_TRY(ReadInode(r.ino, &f));
      const unsigned long long ino = r.ino;
      const posix::OptsDamage d = r.opts;
      for (u32 i = 0; i < posix::kInodeOpts; i++) {
        if ((d.bad_values & (1u << i)) == 0) continue;
        const posix::InodeOpt o = posix::InodeOpt(i);
        Problem("namespace: inode %llu: bad option %s: stored value %u %s", ino, posix::OptName(o),
                unsigned(posix::GetOpt(f, o)),
                posix::IsTargetOpt(o)       ? "names no member or group of this filesystem"
                : o == posix::kOptReplicas ? "is outside 1..4"
                                           : "is neither none nor zstd");
      }
      if (d.reserved) Problem("namespace: inode %llu: reserved option bytes or bits are not zero", ino);
      const bool flag = (f.flags.get() & posix::kInodeFlagCompress) != 0;
      // (A flag without the option is damage too: every change that sets
      // the flag sets compression=zstd with it, and no image from before
      // the options mounts.)
      const bool flag_alone = flag && f.compression == 0;
      if (d.flag_mismatch && flag_alone)
        Problem("namespace: inode %llu: the compression flag (chattr +c) is set without its compression option "
                "(the flag mirrors compression=zstd)", ino);
      else if (d.flag_mismatch)
        Problem("namespace: inode %llu: the compression flag (chattr +c) is %s but its compression option is %s", ino,
                flag ? "set" : "clear", f.compression == 1 ? "none" : "zstd");
      if (!repair_) continue;
      TFS_TRY(UpdateInode(r.ino, [&](posix::InodeFormat& g) { posix::RepairOpts(&g, members); }));
      r.opts = posix::OptsDamage{};
      for (u32 i = 0; i < posix::kInodeOpts; i++)
        if ((d.bad_values & (1u << i)) != 0)
          Repaired(1, "namespace: inode %llu: unset option %s (the filesystem's applies)", ino,
                   posix::OptName(posix::InodeOpt(i)));
      if (d.reserved) Repaired(1, "namespace: inode %llu: zeroed its reserved option bytes", ino);
      if (d.flag_mismatch)
        Repaired(1, "namespace: inode %llu: %s", ino,
                 flag_alone ? "set its compression option to zstd, the one value its flag mirrors"
                            : "made its compression flag follow its compression option");
    }
    return Status::Ok();
  }

  Status Passes() {
    TFS_TRY(ScanInodes());
    if (TFS_TRY(Empty())) return Status::Ok();  // formatted, never mounted: no root yet
    TFS_TRY(CheckRoot());
    TFS_TRY(ScanDirents());
    if (repair_) TFS_TRY(ApplyFixes());
    TFS_TRY(CheckLoops());
    TFS_TRY(CheckInodes());
    TFS_TRY(CheckOptions());
    TFS_TRY(ScanExtents());
    TFS_TRY(ScanXattrs());
    u64 live = 0;
    for (const InodeRec& r : inodes_) live += r.gone ? 0 : 1;
    c_.Line("namespace: %llu inodes (%llu directories), %llu entries, %llu xattrs, %llu extents, %u problem(s)",
            (unsigned long long)live, (unsigned long long)dirs_, (unsigned long long)entries_,
            (unsigned long long)xattrs_, (unsigned long long)extents_, found_);
    return Status::Ok();
  }

  store::Store& e_;
  btree::Btrees& t_;
  const bool repair_;
  Ctx& c_;
  bool write_failed_ = false;
  Vector<InodeRec> inodes_;  // sorted by number
  Vector<u64> orphans_;
  Vector<SlotFix> fixes_;
  Vector<u32> used_[dev::kMaxDevices];  // extents per bucket
  u64 lost_found_ = 0;
  bool lost_found_failed_ = false;
  u64 entries_ = 0, dirs_ = 0, extents_ = 0, xattrs_ = 0;
  u64 stale_cached_ = 0;  // stale cached pointers found (not damage; -y drops them)
  u64 promoted_ = 0;      // cached copies -y made authoritative (their extent's was bad)
  u32 found_ = 0;
  // What needs posix::kSbFeatures: chunked values (with their chunk keys)
  // and inodes with kInodeFlagCaps (or a capability xattr, which gets it).
  u64 feature_keys_ = 0;
  u64 policy_extents_ = 0;  // extents with a nonzero policy (sb::kSbExtentPolicy) the repairs kept (an
                            // overlap trimmed away later may leave it one high: the flag stays a run longer)
  data::MemberTable members_;  // what the extents' policies are read against (ScanExtents)
  const u16 had_;          // the superblock's features before the open
  bool upgraded_ = false;  // -y flagged capabilities of a filesystem from before them
  XattrInode x_;                 // the inode whose xattr keys are streaming
  Vector<ChunkedValue> values_;  // its chunked values (ScanXattrs)
  Vector<Pos> excess_;           // its table keys past kMaxXattrs, to delete (-y)
  u8 buf_[btree::kMaxValueBytes + 64];  // one key's value
};

}  // namespace

bool CheckNamespace(store::Store& e, const Options& opt, Ctx& c, u16 had, FeatureUse* use) {
  // ~3 KiB of members: not on a kernel stack.
  NamespaceCheck* check = platform::New<NamespaceCheck>(e, opt, c, had);
  if (check == nullptr) {
    c.Line("namespace: out of memory");
    c.report->exit_code = kExitOperational;
    return false;
  }
  const bool done = check->Run(use);
  platform::Delete(check);
  return done;
}

}  // namespace tfs::fsck
