// fsck's namespace and file data pass (see fsck.h): inodes, directory entries,
// symlinks, orphans, extents and xattrs, read through the btree API.
#include "data/data.h"
#include "fsck/pass.h"
#include "posix/fs.h"

namespace tfs::fsck {
namespace {

struct InodeRec {
  u64 ino;
  u32 mode;
  u32 nlink;
  u64 size;
  u64 parent;      // directories: what the inode says
  u64 entry_dir;   // directories: the directory whose entry names it (0: none yet)
  u32 refs;        // entries naming it
  u32 subdirs;     // directories: entries naming directories
  u64 link_bytes;  // symlinks: bytes of target found
  u64 sectors;     // what the inode says
  u64 data_sectors;  // regular files: what its extents hold
  bool orphan;
};

InodeRec* FindRec(Vector<InodeRec>& v, u64 ino) {
  usize lo = 0, hi = v.size();
  while (lo < hi) {
    const usize mid = (lo + hi) / 2;
    if (v[mid].ino < ino) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < v.size() && v[lo].ino == ino ? &v[lo] : nullptr;
}

bool IsDirMode(u32 mode) { return (mode & posix::kModeTypeMask) == posix::kModeDir; }

}  // namespace

// Every inode parses; every entry parses, names a live inode of its type and is
// reachable from its home slot; no tombstone ends a chain; link counts match the
// entries; directories have one name and their parent pointer agrees; symlinks
// have their whole target; orphans are inodes with no link; xattrs belong to
// inodes. Reports only (no repair yet).
void CheckNamespace(engine::Engine& e, const Options&, Ctx& c) {
  btree::Btrees& t = e.btrees();
  Vector<InodeRec> inodes;
  Vector<u64> orphans;
  u32 found = 0;
  auto error = [&](const char* what) {
    c.report->errors++;
    found++;
    return what;
  };
  auto fail = [&](Status st) {
    c.Line("namespace: reading the btrees failed: %s", st.Message());
    c.report->errors++;
  };
  btree::Iterator it(&t, btree::kBtreeInodes);
  Status st = it.SeekToFirst();
  for (; st.ok() && it.Valid(); st = it.Next()) {
    const btree::Pos p = it.pos();
    if (p.inode == 0) {
      if (it.val_bytes() != 8 || p.offset < posix::kRootIno) {
        c.Line("%s: orphan key %llu", error("namespace: bad orphan key"), (unsigned long long)p.offset);
        continue;
      }
      if (!orphans.PushBack(p.offset).ok()) return fail(Err::kNoMemory);
      continue;
    }
    if (p.offset != 0) {  // a symlink's target chunk
      InodeRec* r = inodes.empty() ? nullptr : &inodes[inodes.size() - 1];
      if (r == nullptr || r->ino != p.inode || (r->mode & posix::kModeTypeMask) != posix::kModeLink ||
          p.offset > 2) {
        c.Line("%s: (%llu, %llu)", error("namespace: stray key in the inodes btree"), (unsigned long long)p.inode,
               (unsigned long long)p.offset);
        continue;
      }
      r->link_bytes += it.val_bytes();
      continue;
    }
    posix::InodeFormat f;
    if (!posix::ParseInode(it.value(), it.val_bytes(), &f).ok()) {
      c.Line("%s %llu", error("namespace: corrupt record of inode"), (unsigned long long)p.inode);
      continue;
    }
    InodeRec r{p.inode, f.mode.get(), f.nlink.get(), f.size.get(), f.parent.get(), 0, 0, 0, 0, f.sectors.get(), 0,
               false};
    if (!inodes.PushBack(r).ok()) return fail(Err::kNoMemory);
  }
  if (!st.ok()) return fail(st);
  if (inodes.empty() && orphans.empty()) return;  // formatted, never mounted: no root yet
  InodeRec* root = FindRec(inodes, posix::kRootIno);
  if (root == nullptr || !IsDirMode(root->mode))
    c.Line("%s", error("namespace: no root directory (inode 1)"));
  for (u64 o : orphans) {
    InodeRec* r = FindRec(inodes, o);
    if (r == nullptr || r->nlink != 0) {
      c.Line("%s %llu", error("namespace: orphan key for a linked or missing inode"), (unsigned long long)o);
    } else {
      r->orphan = true;
    }
  }

  // Entries, directory by directory, slot by slot.
  btree::Iterator dit(&t, btree::kBtreeDirents);
  u64 dir = 0, run_start = 0, prev = 0, entries = 0;
  bool tombstone_open = false;  // the current run has a tombstone with no live entry after it yet
  bool first = true;
  InodeRec* d = nullptr;
  posix::InodeFormat dfmt;
  auto end_run = [&] {
    if (tombstone_open)
      c.Line("%s %llu, at slot %llu", error("namespace: a tombstone ends a chain in directory"),
             (unsigned long long)dir, (unsigned long long)prev);
    tombstone_open = false;
  };
  for (st = dit.SeekToFirst(); st.ok() && dit.Valid(); st = dit.Next()) {
    const btree::Pos p = dit.pos();
    if (first || p.inode != dir) {
      end_run();
      first = false;
      dir = p.inode;
      run_start = p.offset;
      d = FindRec(inodes, dir);
      if (d == nullptr || !IsDirMode(d->mode)) {
        c.Line("%s %llu", error("namespace: entries of a missing or non-directory inode"), (unsigned long long)dir);
        d = nullptr;
      } else {
        auto got = t.Get(btree::Pos{btree::kBtreeInodes, dir, 0}, &dfmt, sizeof(dfmt));
        if (!got.ok() || got.value() != sizeof(dfmt)) return fail(got.ok() ? Status(Err::kCorrupt) : got.status());
      }
    } else if (p.offset != prev + 1) {
      end_run();
      run_start = p.offset;
    }
    prev = p.offset;
    if (d == nullptr) continue;
    posix::DirentFormat de;
    const char* name;
    if (!posix::ParseNamedEntry(btree::kBtreeDirents, dit.value(), dit.val_bytes(), &de, &name).ok()) {
      c.Line("%s %llu, slot %llu", error("namespace: corrupt entry in directory"), (unsigned long long)dir,
             (unsigned long long)p.offset);
      continue;
    }
    if (de.type == posix::kDtTombstone) {
      tombstone_open = true;
      continue;
    }
    tombstone_open = false;
    entries++;
    const u64 home = posix::NameHash(dfmt.hash_seed.get(), dfmt.hash_bits, name, de.name_len);
    if (home < run_start || home > p.offset)
      c.Line("%s %llu: '%.*s' at slot %llu, home %llu", error("namespace: unreachable entry in directory"),
             (unsigned long long)dir, int(de.name_len), name, (unsigned long long)p.offset, (unsigned long long)home);
    InodeRec* target = FindRec(inodes, de.ino.get());
    if (target == nullptr) {
      c.Line("%s %llu: '%.*s' -> %llu", error("namespace: entry names a missing inode in directory"),
             (unsigned long long)dir, int(de.name_len), name, (unsigned long long)de.ino.get());
      continue;
    }
    if (posix::DirentTypeOf(target->mode) != de.type)
      c.Line("%s %llu: '%.*s'", error("namespace: entry type differs from its inode's, in directory"),
             (unsigned long long)dir, int(de.name_len), name);
    target->refs++;
    if (IsDirMode(target->mode)) {
      d->subdirs++;
      if (target->entry_dir != 0)
        c.Line("%s %llu", error("namespace: directory with two names:"), (unsigned long long)target->ino);
      target->entry_dir = dir;
    }
  }
  end_run();
  if (!st.ok()) return fail(st);

  u64 dirs = 0;
  for (InodeRec& r : inodes) {
    const unsigned long long ino = r.ino;
    if (IsDirMode(r.mode)) {
      dirs++;
      if (r.nlink != 2 + r.subdirs && !(r.orphan && r.nlink == 0))
        c.Line("%s %llu: nlink %u, expected %u", error("namespace: wrong link count of directory"), ino, r.nlink,
               2 + r.subdirs);
      if (r.ino == posix::kRootIno) {
        if (r.entry_dir != 0 || r.parent != posix::kRootIno)
          c.Line("%s", error("namespace: the root directory has a name or another parent"));
      } else if (r.entry_dir == 0 && !r.orphan) {
        c.Line("%s %llu", error("namespace: unreachable directory"), ino);
      } else if (r.entry_dir != 0 && r.parent != r.entry_dir) {
        c.Line("%s %llu: parent %llu, named in %llu", error("namespace: wrong parent of directory"), ino,
               (unsigned long long)r.parent, (unsigned long long)r.entry_dir);
      }
      continue;
    }
    if (r.orphan) {
      c.report->notes++;
      c.Line("namespace: inode %llu is an orphan (unlinked while open); the next mount frees it", ino);
    } else if (r.refs == 0) {
      c.Line("%s %llu", error("namespace: unreachable inode"), ino);
    } else if (r.refs != r.nlink) {
      c.Line("%s %llu: nlink %u, %u entries", error("namespace: wrong link count of inode"), ino, r.nlink, r.refs);
    }
    if ((r.mode & posix::kModeTypeMask) == posix::kModeLink && r.link_bytes != r.size)
      c.Line("%s %llu: %llu of %llu bytes", error("namespace: incomplete symlink target of inode"), ino,
             (unsigned long long)r.link_bytes, (unsigned long long)r.size);
  }

  // File data: extents of regular files, in order without overlap, each
  // written one pointing into a user bucket of its generation; every user bucket holds some
  // extent; the inode's sector count is what its extents hold.
  u64 extents = 0;
  {
    const sb::Superblock& sbk = e.sb();
    alloc::Allocator& a = e.alloc();
    Vector<u8> used[dev::kMaxDevices];
    for (u32 d = 0; d < a.members(); d++)
      if (!used[d].Resize(a.nbuckets(d)).ok()) return fail(Err::kNoMemory);
    btree::Iterator xt(&t, btree::kBtreeExtents);
    u64 prev_ino = 0, prev_end = 0;
    for (st = xt.SeekToFirst(); st.ok() && xt.Valid(); st = xt.Next()) {
      const btree::Pos p = xt.pos();
      data::Extent x;
      if (!data::ParseExtent(p, xt.value(), xt.val_bytes(), &x).ok()) {
        c.Line("%s (%llu, %llu)", error("data: corrupt extent"), (unsigned long long)p.inode,
               (unsigned long long)p.offset);
        continue;
      }
      extents++;
      InodeRec* r = FindRec(inodes, p.inode);
      if (r == nullptr || (r->mode & posix::kModeTypeMask) != posix::kModeReg) {
        c.Line("%s %llu", error("data: extent of a missing or non-regular inode"), (unsigned long long)p.inode);
        continue;
      }
      if (p.inode == prev_ino && x.start < prev_end)
        c.Line("%s %llu at block %llu", error("data: overlapping extents in inode"), (unsigned long long)p.inode,
               (unsigned long long)x.start);
      prev_ino = p.inode;
      prev_end = x.end;
      r->data_sectors += (x.end - x.start) * (data::kBlockSize / 512);
      if (x.unwritten) continue;  // a reservation: no pointer
      const u64 off = x.ptr.offset.get();
      const u64 b = sbk.BucketOf(off);
      const u64 last = off + x.DiskBlocks() * data::kBlockSize;
      if (x.ptr.dev >= a.members() || b >= a.nbuckets(x.ptr.dev) || last > sbk.BucketOffset(b) + sbk.bucket_size) {
        c.Line("%s %llu at block %llu", error("data: extent points outside the buckets, inode"),
               (unsigned long long)p.inode, (unsigned long long)x.start);
        continue;
      }
      const alloc::Bucket k = a.Get(x.ptr.dev, b);
      if (k.state != alloc::BucketState::kUser || k.gen != x.ptr.gen)
        c.Line("%s %llu at block %llu: member %u bucket %llu is %s, generation %u (extent: %u)",
               error("data: stale extent pointer, inode"), (unsigned long long)p.inode,
               (unsigned long long)x.start, unsigned(x.ptr.dev), (unsigned long long)b,
               alloc::BucketStateName(k.state), unsigned(k.gen), unsigned(x.ptr.gen));
      used[x.ptr.dev][b] = 1;
    }
    if (!st.ok()) return fail(st);
    for (u32 d = 0; d < a.members(); d++)
      for (u64 b = 0; b < a.nbuckets(d); b++)
        if (a.Get(d, b).state == alloc::BucketState::kUser && used[d][b] == 0) {
          // Left by a crash between allocating and committing: mount frees it.
          c.report->notes++;
          c.Line("data: member %u bucket %llu is marked user but holds no extent; the next mount frees it", d,
                 (unsigned long long)b);
        }
    for (const InodeRec& r : inodes)
      if ((r.mode & posix::kModeTypeMask) == posix::kModeReg && r.sectors != r.data_sectors)
        c.Line("%s %llu: %llu, extents hold %llu", error("data: wrong sector count of inode"),
               (unsigned long long)r.ino, (unsigned long long)r.sectors, (unsigned long long)r.data_sectors);
  }

  // Xattrs belong to inodes and parse.
  btree::Iterator xit(&t, btree::kBtreeXattrs);
  u64 xattrs = 0;
  for (st = xit.SeekToFirst(); st.ok() && xit.Valid(); st = xit.Next()) {
    posix::DirentFormat xe;
    const char* name;
    if (FindRec(inodes, xit.pos().inode) == nullptr ||
        !posix::ParseNamedEntry(btree::kBtreeXattrs, xit.value(), xit.val_bytes(), &xe, &name).ok()) {
      c.Line("%s (%llu, %llu)", error("namespace: bad or ownerless xattr key"), (unsigned long long)xit.pos().inode,
             (unsigned long long)xit.pos().offset);
      continue;
    }
    if (xe.type != posix::kDtTombstone) xattrs++;
  }
  if (!st.ok()) return fail(st);
  c.Line("namespace: %llu inodes (%llu directories), %llu entries, %llu xattrs, %llu extents, %u problem(s)",
         (unsigned long long)inodes.size(), (unsigned long long)dirs, (unsigned long long)entries,
         (unsigned long long)xattrs, (unsigned long long)extents, found);
}

}  // namespace tfs::fsck
