// Damaged nodes (Options::drop_bad_nodes, fsck only; docs/design/fsck.md,
// "Damaged nodes and lost roots"): what takes a dropped node's place (an
// empty subtree over its range, MakeEmptySubtree), the record of it
// (NoteLost: Btrees::lost_nodes), and the recovery of its keys from the node
// scan -- node slots no pointer names, in free and btree buckets, holding a
// valid leaf of this filesystem over a lost range -- newest copy first,
// applied as replay applies keys (RecoverLost); a copy used is kept until
// the next roots block (KeepCopy).
//
// Only inside Btrees::Open, before anyone else can reach the trees: it keeps
// no lock of its own (ApplyKey takes the tree and leaf locks as it always
// does) and reads with none held. It writes no device: the replacements are
// dirty nodes the next checkpoint writes (with read_only, none does: they
// live in memory only).
#include "btree/internal.h"

#include "dev/io_queue.h"
#include "util/sort.h"

namespace tfs::btree {

// Kills an unlinked chain of new nodes (each the only child of the one above).
void TreeOps::KillChain(Impl* im, Tree& t, CachedNode* n) {
  while (n != nullptr) {
    CachedNode* next = n->children.size() > 0 ? n->children[0] : nullptr;
    Kill(im, t, n);
    n = next;
  }
}

// What takes a dropped node's place: an empty leaf covering [min, max] and,
// for a node of `level` > 0, one empty interior node per level above it, each
// with the one below as its only child. Charged and dirty; *out is the top.
Status TreeOps::MakeEmptySubtree(Impl* im, Tree& t, u8 level, const Pos& min, const Pos& max, CachedNode** out) {
  CachedNode* n = nullptr;
  TFS_TRY(MakeNode(im, t.id, 0, min, max, nullptr, 0, &n));
  Charge(im, n);
  for (u32 l = 1; l <= level; l++) {
    CachedNode* p = nullptr;
    Status st = MakeNode(im, t.id, u8(l), min, max, nullptr, 0, &p);
    if (st.ok()) {
      const Edit e{max, &n->ptr, n};
      st = RebuildInterior(im, p, &e, 1);
      if (!st.ok()) {
        DiscardNode(im, p);
      }
    }
    if (!st.ok()) {
      KillChain(im, t, n);
      return st;
    }
    Charge(im, p);
    n = p;
  }
  *out = n;
  return Status::Ok();
}

// Records a node dropped at open (and says so in the log).
Status TreeOps::NoteLost(Impl* im, const Tree& t, const NodePtrFormat& p, const Pos& min, const Pos& max,
                         const Diag& why, const Status& st) {
  LostNode ln;
  ln.btree_id = t.id;
  ln.level = p.level;
  ln.min = min;
  ln.max = max;
  ln.ptr = p;
  if (why.empty()) {
    (void)DiagError(&ln.why, st, "%s", st.Message());
  } else {
    ln.why = why;
  }
  if (PtrEmpty(p)) {
    platform::Log(platform::LogLevel::kWarn, "btree %u: rebuilding the tree from a node scan: %s", unsigned(t.id),
                  ln.why.text);
  } else {
    platform::Log(platform::LogLevel::kWarn,
                  "btree %u: dropping the damaged level-%u node at member %u offset %llu: %s", unsigned(t.id),
                  unsigned(p.level), PtrCopy(p, 0).member, (unsigned long long)PtrCopy(p, 0).offset, ln.why.text);
  }
  TFS_TRY(im->lost.PushBack(ln));
  if (!PtrEmpty(p)) TFS_TRY(im->dropped_ptrs.PushBack(p));
  im->s_dropped++;
  return Status::Ok();
}

// A part of a lost range no copy has covered yet.
struct TreeOps::Gap {
  u8 id;
  u32 lost;  // index in im->lost
  Pos lo, hi;
};
// A valid leaf of this filesystem in a slot no pointer names.
struct TreeOps::Copy {
  u8 member;
  u8 id;
  u64 offset;
  u64 journal_seq;  // the newest entry its sets hold: copies newer first
  Pos min, max;
};

bool TreeOps::Overlaps(const Pos& a_lo, const Pos& a_hi, const Pos& b_lo, const Pos& b_hi) {
  return !(a_hi < b_lo || b_hi < a_lo);
}

// Whether [lo, hi] of tree id overlaps a part of a lost range still uncovered.
bool TreeOps::Wanted(const Vector<Gap>& gaps, u8 id, const Pos& lo, const Pos& hi) {
  for (const Gap& g : gaps)
    if (g.id == id && Overlaps(g.lo, g.hi, lo, hi)) return true;
  return false;
}

// The node scan: every node slot of a member that may hold btree nodes, in
// buckets the allocator calls free or btree, that no pointer of the trees
// names (`used`, per member, sorted) and holds a valid leaf of this
// filesystem overlapping a lost range is a candidate copy.
Status TreeOps::ScanCopies(Impl* im, const Vector<u64>* used, const Vector<Gap>& gaps, Vector<Copy>* copies) {
  const u32 ns = im->node_size;
  const u32 bs = im->sb.bucket_size;
  u8* buf = static_cast<u8*>(platform::Alloc(bs, 4096, false));
  Node* node = platform::New<Node>();
  if (buf == nullptr || node == nullptr) {
    platform::Free(buf);
    platform::Delete(node);
    return Err::kNoMemory;
  }
  Status st;
  for (u32 m = 0; m < im->sb.nr_members && st.ok(); m++) {
    if ((im->capable & (dev::DevMask(1) << m)) == 0) continue;
    const Vector<u64>& u = used[m];
    usize ui = 0;  // first used offset >= this bucket's
    for (u64 b = 0; b < im->sb.members[m].nbuckets && st.ok(); b++) {
      const alloc::BucketState state = im->alloc->Get(m, b).state;
      if (state != alloc::BucketState::kFree && state != alloc::BucketState::kBtree) continue;
      const u64 base = sb::kBucketsOffset + b * bs;
      Status rd = ReadRaw(im, m, base, bs, buf);
      if (!rd.ok()) {
        // It may hold the copy that matters: no repair from a partial scan.
        platform::Log(platform::LogLevel::kError, "btree: node scan: member %u bucket %llu unreadable: %s", m,
                      (unsigned long long)b, rd.Message());
        st = rd;
        break;
      }
      for (u32 s = 0; s < im->slots_per_bucket; s++) {
        const u64 off = base + u64(s) * ns;
        while (ui < u.size() && u[ui] < off) ui++;
        if (ui < u.size() && u[ui] == off) continue;  // the trees' own node
        const u8* p = buf + usize(s) * ns;
        const auto* h = reinterpret_cast<const NodeHeader*>(p);
        if (h->magic.get() != kNodeMagic) continue;
        im->s_scanned++;
        if (MemCompare(h->fs_uuid, im->sb.fs_uuid, sizeof(h->fs_uuid)) != 0 || h->level != 0 ||
            h->btree_id >= kNrBtreeIds)
          continue;
        const u8 id = h->btree_id;
        const Pos lo{id, h->min_inode.get(), h->min_offset.get()};
        const Pos hi{id, h->max_inode.get(), h->max_offset.get()};
        if (!Wanted(gaps, id, lo, hi)) continue;
        Diag d;
        if (!node->Parse(p, ns, nullptr, &d).ok()) continue;  // checksums: damaged or torn
        u64 js = 0;
        for (u32 i = 0; i < node->nsets(); i++) js = Max(js, node->set(i).journal_seq());
        st = copies->PushBack(Copy{u8(m), id, off, js, node->info().min, node->info().max});
        if (!st.ok()) break;
      }
    }
  }
  platform::Delete(node);
  platform::Free(buf);
  return st;
}

// A copy keys were taken from stays as it is until the roots block that no
// longer needs it is durable (a cut during the repair leaves the old roots,
// and the next fsck needs the same copies): its slot counts as live and as
// used (no hole, its bucket not freed, and the allocation rebuild marks it
// through the tree's kept slots, Btrees::ForEachSlot), and is released by
// the checkpoint's end like the slot of any node it replaced.
Status TreeOps::KeepCopy(Impl* im, const Copy& c, Vector<u64>* used) {
  NodePtrFormat p = EmptyPtr(c.id);
  AddPtrCopy(&p, c.member, c.offset);
  Tree& t = im->trees[c.id];
  TFS_TRY(t.kept_slots.PushBack(p));
  TFS_TRY(used[c.member].PushBack(c.offset));
  im->live[c.member][im->sb.BucketOf(c.offset)]++;
  return Status::Ok();
}

// Fills the ranges of the dropped nodes from the newest copies the node scan
// finds: each position of a lost range takes its keys from the newest copy
// (by the journal entries its sets hold) whose range covers it. Applied as
// replay applies keys, before the journal's own replay (newer still).
Status TreeOps::RecoverLost(Impl* im, Vector<u64>* used) {
  Vector<Gap> gaps;
  for (u32 i = 0; i < im->lost.size(); i++)
    TFS_TRY(gaps.PushBack(Gap{im->lost[i].btree_id, i, im->lost[i].min, im->lost[i].max}));
  for (u32 m = 0; m < im->sb.nr_members; m++)
    Sort(used[m].data(), used[m].size(), [](u64 a, u64 b) { return a < b; });
  Vector<Copy> copies;
  TFS_TRY(ScanCopies(im, used, gaps, &copies));
  im->s_copies = copies.size();
  Sort(copies.data(), copies.size(), [](const Copy& a, const Copy& b) {
    return a.journal_seq != b.journal_seq ? a.journal_seq > b.journal_seq : a.offset < b.offset;
  });
  u8* buf = static_cast<u8*>(platform::Alloc(im->node_size, 4096, false));
  Node* node = platform::New<Node>();
  Status st = buf != nullptr && node != nullptr ? Status::Ok() : Status(Err::kNoMemory);
  for (usize ci = 0; ci < copies.size() && st.ok() && !gaps.empty(); ci++) {
    const Copy& c = copies[ci];
    if (!Wanted(gaps, c.id, c.min, c.max)) continue;
    Diag d;
    if (!ReadRaw(im, c.member, c.offset, im->node_size, buf).ok() ||
        !node->Parse(buf, im->node_size, nullptr, &d).ok())
      continue;
    Vector<Gap> left;
    bool used_copy = false;
    for (usize gi = 0; gi < gaps.size() && st.ok(); gi++) {
      const Gap g = gaps[gi];
      if (g.id != c.id || !Overlaps(g.lo, g.hi, c.min, c.max)) {
        st = left.PushBack(g);
        continue;
      }
      const Pos a = g.lo < c.min ? c.min : g.lo;
      const Pos b = c.max < g.hi ? c.max : g.hi;
      LostNode& ln = im->lost[g.lost];
      NodeIter it(*node);
      for (it.Seek(a); it.Valid() && it.pos() <= b && st.ok(); it.Next()) {
        const KeyRef k = it.key();
        KeyInput in;
        in.pos = it.pos();
        in.type = kKeyValue;
        in.value = k.value();
        in.val_bytes = k.val_bytes();
        st = ApplyKey(im, in, c.journal_seq);
        if (!st.ok()) break;
        ln.recovered_keys++;
        im->s_recovered++;
      }
      if (st.ok() && !used_copy) {
        st = KeepCopy(im, c, used);
        used_copy = true;
      }
      ln.copies++;
      ln.newest_copy_seq = Max(ln.newest_copy_seq, c.journal_seq);
      if (st.ok() && g.lo < a) st = left.PushBack(Gap{g.id, g.lost, g.lo, Pred(a)});
      if (st.ok() && b < g.hi) st = left.PushBack(Gap{g.id, g.lost, Succ(b), g.hi});
    }
    if (st.ok()) gaps = Move(left);
  }
  platform::Delete(node);
  platform::Free(buf);
  TFS_TRY(st);
  for (u32 i = 0; i < im->lost.size(); i++) {
    bool covered = true;
    for (const Gap& g : gaps) covered = covered && g.lost != i;
    im->lost[i].fully_covered = covered;
  }
  return Status::Ok();
}

}  // namespace tfs::btree
