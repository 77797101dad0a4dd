// Structure changes (docs/design/btree.md, "Splits, merges, root growth and
// shrink"): a node with no room is split in two (its parent first if that
// has no room for another child; a root split grows the tree a level), an
// underfull node is merged with a cached sibling when the result is at most
// 3/4 full (and its parent likewise), a root with one child hands the tree
// to it, and an interior node is rebuilt with edits, its children array in
// step. All in memory: new nodes are dirty and have no slot until the next
// checkpoint writes them and releases the slots of those they replace (Kill).
//
// Only under the tree lock exclusive (readers walk interior nodes without
// node locks because of it) with no leaf lock held, or at Open before the
// trees are shared. No I/O: a sibling that is not cached is not read (a
// later update retries the merge).
#include "btree/internal.h"

namespace tfs::btree {

namespace {

constexpr u32 kPtrKeySpace = KeySpace(sizeof(NodePtrFormat));

}  // namespace

// Key index of child `c` in its parent (interior nodes hold one set).
u32 TreeOps::ChildIndex(const CachedNode* p, const CachedNode* c) {
  const Set& s = p->node.set(0);
  u32 i = s.LowerBound(c->node.info().max);
  TFS_BUG_ON(i >= s.size() || p->children[i] != c);
  return i;
}

// Rebuilds interior node p with `edits` (sorted by pos) applied, keeping its
// children array in step. kNoSpace if the result does not fit.
Status TreeOps::RebuildInterior(Impl* im, CachedNode* p, const Edit* edits, u32 nedits) {
  const Set* old = p->node.nsets() > 0 ? &p->node.set(0) : nullptr;  // a new root has none
  const u32 n_old = old != nullptr ? old->size() : 0;
  Vector<KeyInput> keys;
  Vector<CachedNode*> kids;
  TFS_TRY(keys.Reserve(n_old + nedits));
  TFS_TRY(kids.Reserve(n_old + nedits));
  u32 i = 0, e = 0;
  while (i < n_old || e < nedits) {
    KeyInput in;
    if (e < nedits && (i == n_old || edits[e].pos <= old->KeyPos(i))) {
      if (i < n_old && edits[e].pos == old->KeyPos(i)) i++;  // replaced or removed
      if (edits[e].ptr != nullptr) {
        in.pos = edits[e].pos;
        in.type = kKeyValue;
        in.value = edits[e].ptr;
        in.val_bytes = sizeof(NodePtrFormat);
        keys.PushBack(in).IgnoreError();
        kids.PushBack(edits[e].child).IgnoreError();
      }
      e++;
      continue;
    }
    KeyRef k = old->Key(i);
    in.pos = k.pos();
    in.type = k.type();
    in.value = k.value();
    in.val_bytes = k.val_bytes();
    keys.PushBack(in).IgnoreError();
    kids.PushBack(p->children[i]).IgnoreError();
    i++;
  }
  // On the heap: a Node holds its sets inline (~1.6 KiB), too much for a
  // kernel stack frame.
  Node* fresh = platform::New<Node>();
  if (fresh == nullptr) return Err::kNoMemory;
  Status st = fresh->Init(im->node_size, p->node.info());
  if (st.ok()) st = fresh->AppendSet(keys.data(), keys.size(), 0);
  if (st.ok()) p->node.Swap(*fresh);
  platform::Delete(fresh);
  TFS_TRY(st);
  p->children = Move(kids);
  for (usize j = 0; j < p->children.size(); j++)
    if (p->children[j] != nullptr) p->children[j]->parent = p;
  SetDirty(im, p);
  p->version.FetchAdd(1, MemOrder::kRelease);
  return Status::Ok();
}

void TreeOps::DiscardNode(Impl* im, CachedNode* n) {
  ClearDirty(im, n);
  im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);  // (MakeNode's)
  PublishNeed(im);
  platform::Delete(n);
}

Status TreeOps::MakeNode(Impl* im, u8 id, u8 level, const Pos& min, const Pos& max, const Node* const* srcs,
                         u32 nsrcs, CachedNode** out) {
  CachedNode* n = NewNode(im);
  if (n == nullptr) return Err::kNoMemory;
  NodeInfo info;
  info.btree_id = id;
  info.level = level;
  info.seq = NewSeq(im);
  info.min = min;
  info.max = max;
  Status st = nsrcs == 0 ? n->node.Init(im->node_size, info) : n->node.InitFrom(im->node_size, info, srcs, nsrcs);
  if (!st.ok()) {
    platform::Delete(n);
    return st;
  }
  n->ptr = EmptyPtr(id);
  n->ptr.level = level;
  n->ptr.seq.set(info.seq);
  n->ptr.min_inode.set(min.inode);
  n->ptr.min_offset.set(min.offset);
  n->dirty.Store(1, MemOrder::kRelaxed);
  im->dirty_nodes.FetchAdd(1, MemOrder::kRelaxed);
  im->unwritten_nodes.FetchAdd(1, MemOrder::kRelaxed);
  PublishNeed(im);
  *out = n;
  return Status::Ok();
}

// Gives `dst` the cached children of `src` whose keys fall in dst's range
// (split: part of src's; merge: all of each source's).
Status TreeOps::TakeChildren(CachedNode* dst, const CachedNode* src) {
  if (dst->node.info().level == 0) return Status::Ok();
  const Set& s = dst->node.set(0);
  const Set& from = src->node.set(0);
  if (dst->children.size() != s.size()) {
    TFS_TRY(dst->children.Resize(s.size()));
    for (usize i = 0; i < s.size(); i++) dst->children[i] = nullptr;
  }
  u32 j = from.LowerBound(dst->node.info().min);
  u32 i = j < from.size() ? s.LowerBound(from.KeyPos(j)) : s.size();
  for (; j < from.size() && from.KeyPos(j) <= dst->node.info().max; i++, j++) {
    TFS_BUG_ON(i >= s.size() || from.KeyPos(j) != s.KeyPos(i));
    dst->children[i] = src->children[j];
    if (dst->children[i] != nullptr) dst->children[i]->parent = dst;
  }
  return Status::Ok();
}

// Splits n in two (and its parent first if it has no room for another
// child). `append` favours a left node nearly full (sequential inserts).
Status TreeOps::Split(Impl* im, Tree& t, CachedNode* n, bool append, const Pos& at) {
  TFS_TRY(t.dead_slots.Reserve(t.dead_slots.size() + 2 * (kMaxLevel + 2)));
  if (n->parent != nullptr && n->parent->node.free_bytes() < kPtrKeySpace)
    TFS_TRY(Split(im, t, n->parent, false, at));
  const NodeInfo info = n->node.info();
  Pos mid;
  if (!n->node.SplitPoint(append ? 9 : 1, append ? 10 : 2, &mid)) {
    // One key (of the largest sizes): split the range around it so the new
    // key lands in the other half.
    NodeIter it(n->node);
    it.SeekToFirst();
    if (!it.Valid()) return Err::kNoSpace;
    const Pos k = it.pos();
    if (at > k) {
      mid = k;
    } else if (at < k && k != info.min) {
      mid = Pred(k);
    } else {
      return Err::kNoSpace;
    }
    if (mid == info.max) return Err::kNoSpace;
  }
  const Node* src[] = {&n->node};
  CachedNode* a = nullptr;
  CachedNode* b = nullptr;
  TFS_TRY(MakeNode(im, info.btree_id, info.level, info.min, mid, src, 1, &a));
  Status st = MakeNode(im, info.btree_id, info.level, Succ(mid), info.max, src, 1, &b);
  if (st.ok()) st = TakeChildren(a, n);
  if (st.ok()) st = TakeChildren(b, n);
  if (st.ok()) {
    Edit edits[2] = {{mid, &a->ptr, a}, {info.max, &b->ptr, b}};
    if (n->parent == nullptr) {
      CachedNode* r = nullptr;
      st = MakeNode(im, info.btree_id, u8(info.level + 1), Pos::Min(info.btree_id), Pos::Max(info.btree_id),
                    nullptr, 0, &r);
      if (st.ok()) {
        st = RebuildInterior(im, r, edits, 2);
        if (!st.ok()) {
          DiscardNode(im, r);
        } else {
          t.root = r;
          Charge(im, r);
          im->ctr.root_grows.FetchAdd(1, MemOrder::kRelaxed);
        }
      }
    } else {
      st = RebuildInterior(im, n->parent, edits, 2);
    }
  }
  if (!st.ok()) {
    // Nothing was linked: give the children back and drop the new nodes.
    CachedNode* made[2] = {a, b};
    for (CachedNode* x : made) {
      if (x == nullptr) continue;
      for (usize i = 0; i < x->children.size(); i++)
        if (x->children[i] != nullptr) x->children[i]->parent = n;
      DiscardNode(im, x);
    }
    return st;
  }
  Charge(im, a);
  Charge(im, b);
  Kill(im, t, n);
  im->ctr.splits.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

// Root shrink: an interior root with one (cached) child hands the tree to it
// (the child already covers the whole range).
void TreeOps::ShrinkRoot(Impl* im, Tree& t) {
  while (t.root != nullptr && t.root->node.info().level > 0 && t.root->node.set(0).size() == 1 &&
         t.root->children[0] != nullptr) {
    CachedNode* old = t.root;
    CachedNode* c = old->children[0];
    c->parent = nullptr;
    old->children[0] = nullptr;
    t.root = c;
    Kill(im, t, old);
    im->ctr.root_shrinks.FetchAdd(1, MemOrder::kRelaxed);
  }
}

// Merges underfull n with a cached sibling when the result is at most 3/4 full,
// then its parent likewise; finally shrinks the root while it has one child.
void TreeOps::TryMerge(Impl* im, Tree& t, CachedNode* n) {
  MergeUp(im, t, n);
  ShrinkRoot(im, t);
}

void TreeOps::MergeUp(Impl* im, Tree& t, CachedNode* n) {
  if (!t.dead_slots.Reserve(t.dead_slots.size() + 3 * (kMaxLevel + 2)).ok()) return;
  for (;;) {
    CachedNode* p = n->parent;
    if (p == nullptr) return;
    if (n->node.live_estimate() >= im->node_size / 4) return;
    const u32 i = ChildIndex(p, n);
    CachedNode* left = nullptr;
    CachedNode* right = nullptr;
    if (i + 1 < p->children.size() && p->children[i + 1] != nullptr) {
      left = n;
      right = p->children[i + 1];
    } else if (i > 0 && p->children[i - 1] != nullptr) {
      left = p->children[i - 1];
      right = n;
    } else {
      return;  // no cached sibling: a later update retries
    }
    // Live bytes are at most the estimates (which miss overwritten versions):
    // rule out merges that cannot fit before building anything, compacting a
    // node to learn its real size only when that could change the answer --
    // the sibling at most once per version of it, so that each update of a
    // nearly empty node next to a full one does not rebuild the full one.
    const u64 limit = im->node_size / 4 * 3 + sizeof(NodeHeader);
    CachedNode* sib = left == n ? right : left;
    u64 sib_live = sib->node.live_estimate();
    if (sib_live > limit && sib->node.nsets() > 1 && sib->compacted_version != sib->version.Load()) {
      if (!sib->node.Compact(0).ok()) return;
      sib->compacted_version = sib->version.Load();
      sib_live = sib->node.used_bytes();
    }
    if (sib_live > limit) return;
    if (n->node.live_estimate() + sib_live > limit || n->node.nsets() > 1) {
      if (n->node.nsets() > 1 && !n->node.Compact(0).ok()) return;
      if (n->node.used_bytes() + sib_live > limit) {
        if (sib->node.nsets() <= 1 || sib->compacted_version == sib->version.Load()) return;
        if (!sib->node.Compact(0).ok()) return;
        sib->compacted_version = sib->version.Load();
        if (n->node.used_bytes() + sib->node.used_bytes() > limit) return;
      }
    }
    if (n->node.used_bytes() >= im->node_size / 4) return;
    if (n->merge_failed_sib == sib && n->merge_failed_sib_seq == sib->node.info().seq &&
        n->merge_failed_sib_version == sib->version.Load() &&
        n->merge_failed_used + n->node.used_bytes() > im->node_size / 4 * 3 + n->merge_failed_n_used)
      return;  // (built and given up, and would be again: see CachedNode)
    const Node* src[] = {&left->node, &right->node};
    CachedNode* m = nullptr;
    const NodeInfo& li = left->node.info();
    const NodeInfo& ri = right->node.info();
    if (!MakeNode(im, li.btree_id, li.level, li.min, ri.max, src, 2, &m).ok()) return;
    // Gives up the merge: the children taken point back at left and right
    // (which still list them), and m goes.
    auto undo = [&] {
      for (usize k = 0; k < m->children.size(); k++) {
        CachedNode* c = m->children[k];
        if (c != nullptr) c->parent = k < left->children.size() ? left : right;
      }
      DiscardNode(im, m);
    };
    if (m->node.used_bytes() > im->node_size / 4 * 3) {
      // The estimates let it through, the merged node says no: remembered,
      // so that each update of n does not build it again (review helper-79).
      n->merge_failed_sib = sib;
      n->merge_failed_sib_seq = sib->node.info().seq;
      n->merge_failed_sib_version = sib->version.Load();
      n->merge_failed_used = m->node.used_bytes();
      n->merge_failed_n_used = n->node.used_bytes();
      im->ctr.merges_given_up.FetchAdd(1, MemOrder::kRelaxed);
      undo();
      return;
    }
    if (!TakeChildren(m, left).ok() || !TakeChildren(m, right).ok()) {
      im->ctr.merges_given_up.FetchAdd(1, MemOrder::kRelaxed);
      undo();
      return;
    }
    Edit edits[2] = {{li.max, nullptr, nullptr}, {ri.max, &m->ptr, m}};
    if (!RebuildInterior(im, p, edits, 2).ok()) {
      im->ctr.merges_given_up.FetchAdd(1, MemOrder::kRelaxed);
      undo();
      return;
    }
    Charge(im, m);
    left->children.Clear();
    right->children.Clear();
    Kill(im, t, left);
    Kill(im, t, right);
    im->ctr.merges.FetchAdd(1, MemOrder::kRelaxed);
    n = p;
  }
}

}  // namespace tfs::btree
