// The node cache (tree.h, "Node cache"; docs/design/btree.md, "The node
// cache and eviction"): a CachedNode's life -- made (NewNode), charged and put
// on the LRU (Charge), taken out of its tree (Kill), freed by its last
// reference (Unref) -- reading a node in (ReadNode checks it against the
// pointer that led to it; FetchMiss links it only if the parent still points
// there), and eviction: clean, unreferenced nodes without cached children,
// one clock pass, to 90% of the bound (EvictIfNeeded) or to what the
// memory-pressure shrinker asks (ShrinkScan).
//
// Reads run with no tree or node lock held; linking and evicting take the
// tree lock exclusive, then cache_mu, the innermost lock (nothing is taken
// under it; victims are freed after it is dropped). Eviction reads no node's contents
// outside the tree whose lock it holds, and never drops a dirty node. The
// shrinker may not wait for a lock, do I/O or allocate: it skips a tree
// whose lock is taken.
#include "btree/internal.h"

#include "dev/io_queue.h"

namespace tfs::btree {

namespace {

u64 SplitMix(u64* state) {
  u64 z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

u64 DefaultCacheBytes() {
  const u64 mem = platform::MemoryBytes();
  if (mem == 0) return 256ull << 20;
  return Max<u64>(mem / 8, 64ull << 20);
}

// Nodes of 64 KiB and more get a whole page for their CachedNode (~1.9 KiB):
// a lookup's first miss in a leaf is its CachedNode, and a page-sized
// allocation is one the userspace platform serves from huge pages (its arena
// starts at 4 KiB), which spares that miss a TLB walk; next to the node's
// buffer the extra 2 KiB is under 1%. Freed by platform::Delete as usual.
CachedNode* TreeOps::NewNode(Impl* im) {
  static_assert(alignof(CachedNode) <= 64, "allocated 64-byte aligned");
  const usize bytes = im->node_size >= 64 * 1024 ? Max<usize>(sizeof(CachedNode), 4096) : sizeof(CachedNode);
  void* mem = platform::Alloc(bytes, 64);
  return mem == nullptr ? nullptr : new (mem) CachedNode();
}

void TreeOps::Charge(Impl* im, CachedNode* n) {
  n->charged = n->node.node_size();
  // Eviction walks the LRU of every tree holding one tree's lock: it must not
  // read the node's contents, which another tree's writer may be rebuilding.
  n->tree_id = n->node.info().btree_id;
  n->tree_level = n->node.info().level;
  im->cached_bytes.FetchAdd(n->charged, MemOrder::kRelaxed);
  im->cached_nodes.FetchAdd(1, MemOrder::kRelaxed);
  if (n->tree_level > 0) {
    im->interior_nodes.FetchAdd(1, MemOrder::kRelaxed);
    PublishNeed(im);
  }
  MutexLock l(im->cache_mu);
  im->lru.PushBack(n);
}

// Takes a node out of its tree (tree lock exclusive): its slot is released by
// the next checkpoint, its memory when the last reference goes.
void TreeOps::Kill(Impl* im, Tree& t, CachedNode* n) {
  if (!PtrEmpty(n->ptr)) t.dead_slots.PushBack(n->ptr).IgnoreError();  // see Reserve in callers
  ClearDirty(im, n);
  n->dead.Store(1, MemOrder::kRelease);
  n->version.FetchAdd(1, MemOrder::kRelease);
  {
    MutexLock l(im->cache_mu);
    if (n->lru.linked()) im->lru.Remove(n);
  }
  im->cached_bytes.FetchSub(n->charged, MemOrder::kRelaxed);
  im->cached_nodes.FetchSub(1, MemOrder::kRelaxed);
  if (PtrEmpty(n->ptr)) im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);
  if (n->tree_level > 0 && n->charged != 0) im->interior_nodes.FetchSub(1, MemOrder::kRelaxed);
  PublishNeed(im);
  n->charged = 0;
  Unref(n);
}

u64 TreeOps::NewSeq(Impl* im) {
  MutexLock l(im->seq_mu);
  u64 s;
  do {
    s = SplitMix(&im->rng);
  } while (s == 0);
  return s;
}

// ---------------------------------------------------------------------------
// Reading nodes in.

// Checks an interior node read from disk: child pointers of the right btree and
// level, covering [min, max] exactly.
Status TreeOps::CheckInterior(const Impl* im, const Node& node, Diag* diag) {
  const NodeInfo& info = node.info();
  if (node.nsets() != 1)
    return DiagError(diag, Err::kCorrupt, "btree node seq %llu: interior node with %u sets",
                     (unsigned long long)info.seq, node.nsets());
  const Set& s = node.set(0);
  Pos expect_min = info.min;
  for (u32 i = 0; i < s.size(); i++) {
    KeyRef k = s.Key(i);
    if (k.type() != kKeyValue || k.val_bytes() != sizeof(NodePtrFormat))
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: key %u is not a child pointer",
                       (unsigned long long)info.seq, i);
    NodePtrFormat p = ReadPtr(k);
    const char* why = NodePtrProblem(p, im->sb, im->node_size, false);
    if (why == nullptr && (p.btree_id != info.btree_id || p.level + 1 != info.level || PtrMin(p) != expect_min))
      why = "btree, level or min";
    if (why != nullptr)
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: child %u has a bad pointer (%s)",
                       (unsigned long long)info.seq, i, why);
    if (IsMax(k.pos()) ? i + 1 != s.size() : false)
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: keys after the max",
                       (unsigned long long)info.seq);
    expect_min = Succ(k.pos());
  }
  if (s.size() == 0 || s.Key(s.size() - 1).pos() != info.max)
    return DiagError(diag, Err::kCorrupt, "btree node seq %llu: children do not cover the node's range",
                     (unsigned long long)info.seq);
  return Status::Ok();
}

// Reads and verifies copy i of the node `ptr` points to into a new
// CachedNode (no lock held).
Status TreeOps::ReadCopy(Impl* im, const NodePtrFormat& ptr, u32 i, const Pos& max, CachedNode** out, Diag* diag) {
  const u32 ns = im->node_size;
  const NodeCopy c = PtrCopy(ptr, i);
  if (!NodeSlotInArea(im->sb, ns, c.member, c.offset))
    return DiagError(diag, Err::kCorrupt, "btree: pointer to member %u offset %llu is outside the btree area",
                     c.member, (unsigned long long)c.offset);
  u8* buf = static_cast<u8*>(platform::Alloc(ns, 4096, false));
  if (buf == nullptr) return Err::kNoMemory;
  Status st = ReadRaw(im, c.member, c.offset, ns, buf);
  im->ctr.node_reads.FetchAdd(1, MemOrder::kRelaxed);
  im->ctr.node_read_bytes.FetchAdd(ns, MemOrder::kRelaxed);
  if (!st.ok()) {
    platform::Free(buf);
    return DiagError(diag, st, "btree: reading node at member %u offset %llu: %s", c.member,
                     (unsigned long long)c.offset, st.Message());
  }
  CachedNode* n = NewNode(im);
  if (n == nullptr) {
    platform::Free(buf);
    return Err::kNoMemory;
  }
  NodeInfo expect;
  expect.btree_id = ptr.btree_id;
  expect.level = ptr.level;
  expect.seq = ptr.seq.get();
  expect.min = PtrMin(ptr);
  expect.max = max;
  st = n->node.Parse(buf, ns, &expect, diag);
  platform::Free(buf);
  if (st.ok() && ptr.level > 0) {
    st = CheckInterior(im, n->node, diag);
    if (st.ok()) st = n->children.Resize(n->node.set(0).size());
    if (st.ok())
      for (usize k = 0; k < n->children.size(); k++) n->children[k] = nullptr;
    im->partial.Store(1, MemOrder::kRelaxed);
  }
  if (!st.ok()) {
    platform::Delete(n);
    return st;
  }
  n->ptr = ptr;
  *out = n;
  return Status::Ok();
}

// Reads and verifies the node `ptr` points to, with no lock held: its
// copies in order, the first that reads and verifies (docs/design/
// copies.md, step 5b-3). A later copy serving is counted
// (node_copy_retries, one per copy that failed before it) and noted in
// the node (repair_from, repair_why) for whoever links it (NoteRepair).
// Every copy failing: copy 0's error and diag. Counts a corrupt read in
// corrupt_reads if count_corrupt (FetchMiss counts its own: only when the
// pointer did not move meanwhile).
Status TreeOps::ReadNode(Impl* im, const NodePtrFormat& ptr, const Pos& max, CachedNode** out, Diag* diag,
                         bool count_corrupt) {
  if (PtrEmpty(ptr))
    return DiagError(diag, Err::kCorrupt, "btree: a pointer with no copy (btree %u, level %u)",
                     unsigned(ptr.btree_id), unsigned(ptr.level));
  Status first;
  for (u32 i = 0; i < PtrCopies(ptr); i++) {
    Status st = ReadCopy(im, ptr, i, max, out, i == 0 ? diag : nullptr);  // (copy 0's diag is the caller's)
    if (st.ok()) {
      if (i > 0) {
        if (diag != nullptr) *diag = Diag{};  // (copy 0's failure is the node's note now)
        im->ctr.node_copy_retries.FetchAdd(i, MemOrder::kRelaxed);
        (*out)->repair_from = u8(i);
        (*out)->repair_why = first;
      }
      return Status::Ok();
    }
    if (st.code() == Err::kNoMemory) return st;  // (not the copy's fault)
    if (i == 0) first = st;
  }
  if (count_corrupt && StatusIsCorrupt(first)) im->ctr.corrupt_reads.FetchAdd(1, MemOrder::kRelaxed);
  return first;
}

// A node linked into its tree (tree lock exclusive, or the open) that an
// earlier copy failed to serve (ReadNode): dirtied, so that the next
// checkpoint writes all its copies anew and frees the bad one's slot
// (node_repairs) -- not on a read-only open, which only reads. Logged (at
// most a line per 10 s, the rest counted in the next).
void TreeOps::NoteRepair(Impl* im, CachedNode* n) {
  if (n->repair_from == 0) return;
  const NodeCopy bad = PtrCopy(n->ptr, 0);
  const NodeCopy good = PtrCopy(n->ptr, n->repair_from);
  const bool rewrite = !im->opt.read_only;
  char more[64];
  if (im->repair_log.Admit(10 * platform::kNsPerSec, more, sizeof(more)))
    platform::Log(platform::LogLevel::kWarn,
                  "btree: node seq %llu (btree %u, level %u): copy 1 on member %u at %llu failed (%s)%s; copy %u on "
                  "member %u serves%s%s",
                  (unsigned long long)n->ptr.seq.get(), unsigned(n->ptr.btree_id), unsigned(n->ptr.level), bad.member,
                  (unsigned long long)bad.offset, n->repair_why.Message(),
                  n->repair_from > 1 ? ", and the copies after it before" : "", unsigned(n->repair_from) + 1,
                  good.member, rewrite ? "; the next checkpoint rewrites the node" : " (read-only: not rewritten)",
                  more);
  n->repair_from = 0;
  if (!rewrite) return;
  im->ctr.node_repairs.FetchAdd(1, MemOrder::kRelaxed);
  SetDirty(im, n);
}

// Reads the missing node and links it under its parent, if the parent still
// points to that very node. Called with no lock held.
Status TreeOps::FetchMiss(Impl* im, Tree& t, const Miss& miss, Diag* diag) {
  im->ctr.cache_misses.FetchAdd(1, MemOrder::kRelaxed);
  im->ctr.restarts.FetchAdd(1, MemOrder::kRelaxed);
  CachedNode* n = nullptr;
  Status st = ReadNode(im, miss.ptr, miss.max, &n, diag, false);
  if (!st.ok()) {
    // A pointer that changed while we read is not corruption: retry the
    // descent (its slot may hold another node by now: a hole reused).
    if (StatusIsCorrupt(st)) {
      if (!StillPointsTo(im, t, miss)) return Status::Ok();
      im->ctr.corrupt_reads.FetchAdd(1, MemOrder::kRelaxed);
    }
    return st;
  }
  bool linked = false;
  {
    WriteGuard g(t.lock);
    if (t.root != nullptr) {
      Miss m2;
      CachedNode* p = Descend(im, t, miss.max, u8(miss.ptr.level + 1), &m2);
      if (p != nullptr && p->node.info().level == miss.ptr.level + 1) {
        const Set& s = p->node.set(0);
        u32 i = s.LowerBound(miss.max);
        if (i < s.size() && p->children[i] == nullptr && ReadPtr(s.Key(i)).seq.get() == miss.ptr.seq.get()) {
          n->accessed.Store(1, MemOrder::kRelaxed);
          p->children[i] = n;
          n->parent = p;
          NoteRepair(im, n);
          // Charged before the tree lock goes: once it does, a writer can
          // split or merge the node and Kill it, which uncharges and frees
          // it; charging it after that put freed memory on the LRU.
          Charge(im, n);
          linked = true;
        }
      }
    }
  }
  if (!linked) {
    platform::Delete(n);
    return Status::Ok();
  }
  if (im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "fetch.linked");
  // No eviction here: the caller restarts to use this node. Operations evict
  // when they finish (MaybeEvict), and the clock bit spares it one pass.
  return Status::Ok();
}

bool TreeOps::StillPointsTo(Impl* im, Tree& t, const Miss& miss) {
  ReadGuard g(t.lock);
  if (t.root == nullptr) return false;
  Miss m2;
  CachedNode* p = Descend(im, t, miss.max, u8(miss.ptr.level + 1), &m2);
  if (p == nullptr || p->node.info().level != miss.ptr.level + 1) return false;
  const Set& s = p->node.set(0);
  u32 i = s.LowerBound(miss.max);
  return i < s.size() && ReadPtr(s.Key(i)).seq.get() == miss.ptr.seq.get();
}

// Reads `len` bytes at `off` of member m into buf (no lock held): a node,
// or a whole bucket for the node scan.
Status TreeOps::ReadRaw(Impl* im, u32 m, u64 off, u32 len, u8* buf) {
  dev::Io io;
  io.req.op = IoOp::kRead;
  io.req.origin = IoOrigin::kBtree;
  io.req.offset = off;
  io.req.length = len;
  io.req.buf = buf;
  io.cls = dev::IoClass::kForegroundSync;
  return dev::SubmitAndWait(im->devs->member(m)->queue(), &io);
}

// ---------------------------------------------------------------------------
// Eviction.

// The memory-pressure shrinker (platform.h's rules: no waiting for a lock,
// no I/O, no allocation). count: the clean nodes' bytes, in pages; scan:
// evicts clean nodes down to what was asked, from the trees whose lock is
// free right now.
u64 TreeOps::ShrinkCount(void* ctx) {
  Impl* im = static_cast<Impl*>(ctx);
  const u64 cached = im->cached_bytes.Load(MemOrder::kRelaxed);
  const u64 dirty = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size;
  return cached > dirty ? (cached - dirty) / platform::kShrinkPage : 0;
}
u64 TreeOps::ShrinkScan(void* ctx, u64 pages) {
  Impl* im = static_cast<Impl*>(ctx);
  im->ctr.shrinks.FetchAdd(1, MemOrder::kRelaxed);
  const u64 cached = im->cached_bytes.Load(MemOrder::kRelaxed);
  const u64 want = Min(pages, cached / platform::kShrinkPage) * platform::kShrinkPage;
  const u64 freed = EvictTo(im, cached - want, /*wait=*/false);
  im->ctr.shrunk_bytes.FetchAdd(freed, MemOrder::kRelaxed);
  return freed / platform::kShrinkPage;
}

bool TreeOps::Evictable(const CachedNode* n) {
  if (n->dirty.Load(MemOrder::kRelaxed) != 0 || n->parent == nullptr || PtrEmpty(n->ptr)) return false;
  if (n->refs.Load(MemOrder::kAcquire) != 1) return false;
  for (usize i = 0; i < n->children.size(); i++)
    if (n->children[i] != nullptr) return false;
  return true;
}

// Evicts clean nodes, least recently used first (clock), until the cache is
// within 90% of its bound. Takes each tree's lock exclusively in turn.
void TreeOps::EvictIfNeeded(Impl* im) {
  const u64 limit = im->opt.cache_bytes;
  if (im->cached_bytes.Load(MemOrder::kRelaxed) <= limit) return;
  (void)EvictTo(im, limit - limit / 10, /*wait=*/true);
}

// Evicts clean nodes until the cache holds at most `goal` bytes, one pass of
// the clock; each tree under its lock, exclusive: waited for if `wait`,
// else a tree whose lock is taken is skipped. Returns the bytes evicted.
u64 TreeOps::EvictTo(Impl* im, u64 goal, bool wait) {
  const u64 before = im->cached_bytes.Load(MemOrder::kRelaxed);
  for (u32 id = 0; id < kNrBtreeIds && im->cached_bytes.Load(MemOrder::kRelaxed) > goal; id++) {
    Tree& t = im->trees[id];
    if (wait) {
      t.lock.WriteLock();
    } else if (!t.lock.TryWriteLock()) {
      continue;
    }
    CachedNode* victims = nullptr;
    if (wait) {
      im->cache_mu.Lock();
    } else if (!im->cache_mu.TryLock()) {
      t.lock.WriteUnlock();
      continue;
    }
    {
      usize budget = im->lru.size();  // one pass: a node used since the last one survives
      CachedNode* n = im->lru.front();
      while (n != nullptr && budget-- > 0 && im->cached_bytes.Load(MemOrder::kRelaxed) > goal) {
        CachedNode* next = im->lru.Next(n);
        if (n->tree_id == id && Evictable(n)) {
          if (n->accessed.Load(MemOrder::kRelaxed) != 0) {
            n->accessed.Store(0, MemOrder::kRelaxed);
            im->lru.Remove(n);
            im->lru.PushBack(n);
          } else {
            im->lru.Remove(n);
            CachedNode* p = n->parent;
            p->children[ChildIndex(p, n)] = nullptr;
            im->partial.Store(1, MemOrder::kRelaxed);
            im->cached_bytes.FetchSub(n->charged, MemOrder::kRelaxed);
            im->cached_nodes.FetchSub(1, MemOrder::kRelaxed);
            if (n->tree_level > 0) im->interior_nodes.FetchSub(1, MemOrder::kRelaxed);
            n->parent = victims;  // chain for freeing outside cache_mu
            victims = n;
            im->ctr.evictions.FetchAdd(1, MemOrder::kRelaxed);
          }
        }
        n = next;
      }
    }
    im->cache_mu.Unlock();
    while (victims != nullptr) {
      CachedNode* next = victims->parent;
      Unref(victims);
      victims = next;
    }
    t.lock.WriteUnlock();
  }
  const u64 after = im->cached_bytes.Load(MemOrder::kRelaxed);
  return before > after ? before - after : 0;
}

}  // namespace tfs::btree
