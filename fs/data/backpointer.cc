// Backpointers (backpointer.h; format: docs/format/backpointers.md): the
// parser of hostile values and the builder, the one rule that derives a
// pointer's backpointer (BackpointerOf), the one function every extent change
// queues them with (QueueBackpointers), copygc's bucket query and the
// cross-check fsck and the tests share (CheckBackpointers).
//
// Invariant kept with the extents: for every pointer BackpointerOf gives a
// backpointer, the tree holds exactly it, and nothing else -- changed in the
// transaction that changes the extent, so a crash keeps both or neither.
// Cached pointers have none: a stale one is normal and may point at blocks
// its bucket now holds for another extent. Two pointers that imply one
// position (blocks claimed twice: damage the extents carry) cannot both be
// named; the first by extent key is.
//
// CheckBackpointers sorts the expected backpointers in windows of bounded
// memory (see the header) and merges each with its range of the tree: one
// walk of the extents per window, one ordered walk of the tree overall.
#include "data/backpointer.h"

#include "platform/platform.h"
#include "util/sort.h"
#include "util/vector.h"

namespace tfs::data {

Status ParseBackpointer(const btree::Pos& pos, const u8* value, u32 len, Backpointer* out) {
  if (pos.btree_id != btree::kBtreeBackpointers || pos.inode >= 256 || len != sizeof(BackpointerFormat))
    return Err::kCorrupt;
  BackpointerFormat f;
  MemCopy(&f, value, sizeof(f));
  const u32 blocks = f.blocks.get();
  const u64 end = f.end.get();
  if (f.flags != 0 || f.reserved[0] != 0 || f.reserved[1] != 0 || f.reserved[2] != 0 || blocks == 0 ||
      blocks > kMaxExtentBlocks || end < blocks || f.ino.get() >= btree::kInoLimit)
    return Err::kCorrupt;
  Backpointer bp;
  bp.dev = u32(pos.inode);
  bp.block = pos.offset >> kBpPieceBits;
  bp.piece = u32(pos.offset & kBpMaxPiece);
  bp.ino = f.ino.get();
  bp.end = end;
  bp.blocks = blocks;
  *out = bp;
  return Status::Ok();
}

BackpointerFormat BuildBackpointer(const Backpointer& bp) {
  BackpointerFormat f;
  MemSet(&f, 0, sizeof(f));
  f.ino.set(bp.ino);
  f.end.set(bp.end);
  f.blocks.set(bp.blocks);
  return f;
}

bool BackpointerOf(const sb::Superblock& sb, const Extent& e, const Extent::Ptr& p, Backpointer* out) {
  if (p.cached) return false;
  if (p.dev >= sb.nr_members || p.dev >= sb::kSbMaxMembers || p.offset < sb::kBucketsOffset || sb.bucket_size == 0)
    return false;
  if (sb.BucketOf(p.offset) >= sb.members[p.dev].nbuckets || p.blob_offset > kBpMaxPiece) return false;
  out->dev = p.dev;
  out->block = p.offset / kBlockSize;
  out->piece = p.blob_offset;
  out->ino = e.ino;
  out->end = e.end;
  out->blocks = e.blocks();
  return true;
}

Status QueueBackpointers(btree::Transaction* tx, const sb::Superblock& sb, const Extent* old, const Extent* now) {
  Backpointer o[kMaxPtrs], n[kMaxPtrs];
  u32 no = 0, nn = 0;
  if (old != nullptr)
    for (u32 i = 0; i < old->nr_ptrs && i < kMaxPtrs; i++) no += BackpointerOf(sb, *old, old->ptrs[i], &o[no]);
  if (now != nullptr)
    for (u32 i = 0; i < now->nr_ptrs && i < kMaxPtrs; i++) nn += BackpointerOf(sb, *now, now->ptrs[i], &n[nn]);
  // (Pointers of one extent are on distinct members: their positions differ.)
  for (u32 i = 0; i < no; i++) {
    bool kept = false;  // now sets this position (or keeps it as it is)
    for (u32 j = 0; j < nn && !kept; j++) kept = n[j].pos() == o[i].pos();
    if (!kept) TFS_TRY(tx->Delete(o[i].pos()));
  }
  for (u32 j = 0; j < nn; j++) {
    bool same = false;
    for (u32 i = 0; i < no && !same; i++) same = o[i].pos() == n[j].pos() && o[i].SameValue(n[j]);
    if (same) continue;
    const BackpointerFormat f = BuildBackpointer(n[j]);
    TFS_TRY(tx->Set(n[j].pos(), &f, sizeof(f)));
  }
  return Status::Ok();
}

void BucketBackpointerRange(const sb::Superblock& sb, u32 dev, u64 bucket, btree::Pos* first, btree::Pos* last) {
  const u64 b0 = sb.BucketOffset(bucket) / kBlockSize;
  const u64 b1 = b0 + sb.bucket_size / kBlockSize;
  *first = btree::Pos{btree::kBtreeBackpointers, dev, b0 << kBpPieceBits};
  *last = btree::Pos{btree::kBtreeBackpointers, dev, (b1 << kBpPieceBits) - 1};
}

Status ForEachInBucket(btree::Btrees* trees, const sb::Superblock& sb, u32 dev, u64 bucket, BackpointerFn fn,
                       void* ctx) {
  if (dev >= sb.nr_members || dev >= sb::kSbMaxMembers || bucket >= sb.members[dev].nbuckets)
    return Err::kInvalidArgument;
  btree::Pos first, last;
  BucketBackpointerRange(sb, dev, bucket, &first, &last);
  btree::Iterator it(trees, btree::kBtreeBackpointers);
  for (TFS_TRY(it.Seek(first)); it.Valid() && it.pos() <= last; TFS_TRY(it.Next())) {
    Backpointer bp;
    TFS_TRY(ParseBackpointer(it.pos(), it.value(), it.val_bytes(), &bp));
    TFS_TRY(fn(ctx, bp));
  }
  return Status::Ok();
}

// --- CheckBackpointers -----------------------------------------------------------

namespace {

// One backpointer the extents imply, with how many pointers imply its
// position (after Compact; 1 as collected). 40 bytes.
struct Expected {
  u64 off;  // the key's offset
  u64 ino;
  u64 end;
  u32 blocks;
  u32 claims;
  u8 dev;

  btree::Pos pos() const { return btree::Pos{btree::kBtreeBackpointers, dev, off}; }
  Backpointer bp() const {
    Backpointer b;
    b.dev = dev;
    b.block = off >> kBpPieceBits;
    b.piece = u32(off & kBpMaxPiece);
    b.ino = ino;
    b.end = end;
    b.blocks = blocks;
    return b;
  }
};

class Checker {
 public:
  Checker(btree::Btrees* trees, const sb::Superblock& sb, MismatchFn fn, void* ctx, BackpointerCheckStats* stats,
          u64 max_entries)
      : trees_(trees), sb_(sb), fn_(fn), ctx_(ctx), stats_(stats), max_(Max<u64>(max_entries, 4)) {}

  Status Run() {
    btree::Pos lo = btree::Pos::Min(btree::kBtreeBackpointers);
    for (;;) {
      bool bounded = false;  // the window is [lo, hi); else [lo, the end)
      btree::Pos hi{};
      TFS_TRY(Collect(lo, &bounded, &hi));
      passes_++;
      stats_->passes++;
      TFS_TRY(Merge(lo, bounded, hi));
      if (!bounded) return Status::Ok();
      lo = hi;
    }
  }

 private:
  static bool KeyLess(const Expected& a, const Expected& b) { return a.dev != b.dev ? a.dev < b.dev : a.off < b.off; }
  static bool SameKey(const Expected& a, const Expected& b) { return a.dev == b.dev && a.off == b.off; }

  // Sorts the window's entries, folds the claims of one position into its
  // first claimant (by extent key), and -- when `cut` and more than half the
  // room is used -- keeps the lowest half of the positions and lowers the
  // window's bound to the first one dropped.
  void Compact(bool cut, bool* bounded, btree::Pos* hi) {
    Expected* a = buf_.data();
    const usize n = buf_.size();
    Sort(a, n, [](const Expected& x, const Expected& y) {
      if (!SameKey(x, y)) return KeyLess(x, y);
      return x.ino != y.ino ? x.ino < y.ino : x.end < y.end;
    });
    usize w = 0;
    for (usize r = 0; r < n; r++) {
      if (w > 0 && SameKey(a[w - 1], a[r])) {
        a[w - 1].claims += a[r].claims;
        continue;
      }
      a[w++] = a[r];
    }
    buf_.Resize(w).IgnoreError();  // (shrinking: cannot fail)
    if (cut && w > max_ / 2) {
      *bounded = true;
      *hi = a[max_ / 2].pos();
      buf_.Resize(max_ / 2).IgnoreError();
    }
  }

  // The expected backpointers in [lo, hi) (hi lowered as the window fills),
  // sorted, one per position.
  Status Collect(const btree::Pos& lo, bool* bounded, btree::Pos* hi) {
    buf_.Clear();
    const bool first = passes_ == 0;
    btree::Iterator it(trees_, btree::kBtreeExtents);
    Status st = it.SeekToFirst();
    for (; st.ok() && it.Valid(); st = it.Next()) {
      Extent e;
      if (!ParseExtent(it.pos(), it.value(), it.val_bytes(), &e).ok()) continue;  // implies nothing
      if (first) stats_->extents++;
      for (u32 i = 0; i < e.nr_ptrs; i++) {
        Backpointer bp;
        if (!BackpointerOf(sb_, e, e.ptrs[i], &bp)) {
          if (first) (e.ptrs[i].cached ? stats_->cached : stats_->no_key)++;
          continue;
        }
        const btree::Pos p = bp.pos();
        if (p < lo || (*bounded && p >= *hi)) continue;
        TFS_TRY(buf_.PushBack(Expected{p.offset, bp.ino, bp.end, bp.blocks, 1, u8(bp.dev)}));
        if (buf_.size() >= max_) Compact(true, bounded, hi);
      }
    }
    TFS_TRY(st);
    Compact(false, bounded, hi);
    return Status::Ok();
  }

  Status Report(BackpointerMismatch& m) { return fn_ != nullptr ? fn_(ctx_, m) : Status::Ok(); }

  // Merges the window's expected backpointers with the tree's keys in [lo, hi).
  Status Merge(const btree::Pos& lo, bool bounded, const btree::Pos& hi) {
    btree::Iterator it(trees_, btree::kBtreeBackpointers);
    TFS_TRY(it.Seek(lo));
    const Expected* a = buf_.data();
    const usize n = buf_.size();
    stats_->expected += n;
    usize i = 0;
    for (;;) {
      const bool in_tree = it.Valid() && (!bounded || it.pos() < hi);
      if (!in_tree && i == n) return Status::Ok();
      const int c = !in_tree ? 1 : i == n ? -1 : btree::Compare(it.pos(), a[i].pos());
      BackpointerMismatch m{};
      if (c <= 0) {
        stats_->keys++;
        m.have_ok = ParseBackpointer(it.pos(), it.value(), it.val_bytes(), &m.have).ok();
      }
      if (c < 0) {
        m.kind = BackpointerMismatch::kStray;
        m.pos = it.pos();
        TFS_TRY(Report(m));
        TFS_TRY(it.Next());
        continue;
      }
      const Expected& x = a[i];
      m.pos = x.pos();
      m.want = x.bp();
      if (c > 0 || !m.have_ok || !m.have.SameValue(m.want)) {
        m.kind = c > 0 ? BackpointerMismatch::kMissing : BackpointerMismatch::kWrong;
        TFS_TRY(Report(m));
      }
      if (x.claims > 1) {
        m.kind = BackpointerMismatch::kShared;
        m.claims = x.claims;
        TFS_TRY(Report(m));
      }
      i++;
      if (c == 0) TFS_TRY(it.Next());
    }
  }

  btree::Btrees* trees_;
  const sb::Superblock& sb_;
  MismatchFn fn_;
  void* ctx_;
  BackpointerCheckStats* stats_;
  const u64 max_;
  u32 passes_ = 0;
  Vector<Expected> buf_;
};

}  // namespace

Status CheckBackpointers(btree::Btrees* trees, const sb::Superblock& sb, MismatchFn fn, void* ctx,
                         BackpointerCheckStats* stats, u64 max_entries) {
  BackpointerCheckStats local;
  Checker* c = platform::New<Checker>(trees, sb, fn, ctx, stats != nullptr ? stats : &local, max_entries);
  if (c == nullptr) return Err::kNoMemory;
  Status st = c->Run();
  platform::Delete(c);
  return st;
}

}  // namespace tfs::data
