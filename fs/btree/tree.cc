// The btrees' front (tree.h): mount and unmount (Open reads the roots and
// every interior node and counts the slots in use; ReconcileBuckets, once
// the allocator is loaded, reconciles its node buckets with them; Close stops
// the writer, checkpoints until nothing is dirty and frees the cache),
// lookups (Get),
// the walks fsck uses (ForEachNode*, ForEachSlot), transactions (Commit:
// throttle, leaves prefetched, under commit_mu the commit hook's prepare --
// the values only journal order can compute --, one journal commit, each key
// applied, the hook's finish),
// replay (ApplyReplayed), applying one key to its leaf (ApplyKey: the merge
// rule of alloc keys -- the newer version wins --, a split on kNoSpace, a
// merge after a delete that leaves it underfull), reclaim commits (alloc
// records of a checkpoint's node buckets, without commit_mu), and merging
// the sets of leaves that are read many times and not updated.
//
// Lock order (tree.h): commit_mu -> tree lock -> leaf lock (one at a time)
// -> cache_mu; commit_mu -> state_mu. A descent holds the tree lock shared
// and no node lock above the leaf; a miss drops its tree and node locks,
// reads the node (FetchMiss) and restarts. Only commit_mu is held across I/O here: the
// journal commit, and the read of a leaf evicted since the prefetch.
// Structure changes take the tree lock exclusive once the leaf lock is gone.
#include "btree/internal.h"
#include "util/bits.h"

namespace tfs::btree {

namespace {

// Lookups of a leaf with several sets, without an update in between, after which
// the leaf is merged into one set (TreeOps::ReadMostly).
constexpr u32 kReadsBeforeMerge = 64;

// Adds n to a counter that only one thread at a time writes (see Impl).
void BumpSerial(Atomic<u64>& c, u64 n = 1) { c.Store(c.Load(MemOrder::kRelaxed) + n, MemOrder::kRelaxed); }

// The key a transaction's packed key stands for (its header, then its value).
KeyInput KeyInputOf(const KeyHeader* h) {
  KeyInput in;
  in.pos = KeyRef(h).pos();
  in.type = h->type;
  in.val_bytes = h->val_bytes.get();
  in.value = h + 1;
  return in;
}

}  // namespace

// ---------------------------------------------------------------------------
// Applying one update; leaves read much more than updated.

// The merge rule of alloc keys (docs/format/alloc.md, "Newest version
// wins"): whether the leaf's current value `cur` at key's position is to be
// kept, because key is an alloc record no newer than it. An implausible
// current value (a hostile record) never blocks its replacement; a whiteout
// always applies.
bool TreeOps::KeepsNewer(const KeyRef& cur, const KeyInput& key) {
  if (key.pos.btree_id != kBtreeAlloc || key.type != kKeyValue || !cur.valid()) return false;
  // Accounting keys hold totals written in journal order under commit_mu:
  // the last one written wins, whatever its bytes (alloc/format.h).
  if (alloc::IsAcctKey(key.pos.inode)) return false;
  u64 have, want;
  if (!alloc::RecordPlausible(cur.value(), cur.val_bytes(), &have)) return false;
  if (!alloc::RecordPlausible(key.value, key.val_bytes, &want)) return false;  // (the journal's word: applied)
  return have >= want;
}

// Applies one key to its leaf (commit_mu held, replay, or a reclaim commit:
// alloc keys only, whose order does not matter). May read nodes.
Status TreeOps::ApplyKey(Impl* im, const KeyInput& key, u64 seq) {
  Tree& t = im->trees[key.pos.btree_id];
  const bool del = key.type == kKeyWhiteout;
  for (;;) {
    Miss miss;
    t.lock.ReadLock();
    if (t.root == nullptr) {
      t.lock.ReadUnlock();
      if (del) return Status::Ok();
      WriteGuard g(t.lock);
      if (t.root == nullptr) {
        CachedNode* r = nullptr;
        TFS_TRY(MakeNode(im, key.pos.btree_id, 0, Pos::Min(key.pos.btree_id), Pos::Max(key.pos.btree_id), nullptr,
                         0, &r));
        t.root = r;
        Charge(im, r);
      }
      continue;
    }
    CachedNode* leaf = Descend(im, t, key.pos, 0, &miss);
    if (leaf == nullptr) {
      t.lock.ReadUnlock();
      TFS_TRY(FetchMiss(im, t, miss));
      continue;
    }
    BumpSerial(im->c_apply_hits);
    leaf->lock.WriteLock();
    Status st;
    bool merge = false;
    bool append = false;
    const bool alloc_key = key.pos.btree_id == kBtreeAlloc && !del;
    KeyRef old = del || alloc_key ? leaf->node.Find(key.pos) : KeyRef();
    if (del && !old.valid()) {
      st = Status::Ok();  // nothing to delete
    } else if (alloc_key && KeepsNewer(old, key)) {
      st = Status::Ok();  // an older record arriving second: the newer one stays
      // (Not the same record again: a commit hook's record of a bucket it
      // left as it is. Reclaim commits apply without commit_mu: atomic.)
      if (old.val_bytes() != key.val_bytes || MemCompare(old.value(), key.value, key.val_bytes) != 0)
        im->ctr.alloc_older_kept.FetchAdd(1, MemOrder::kRelaxed);
    } else {
      const u32 old_space = del ? old.space() : 0;
      const u64 compactions = leaf->node.compactions();
      st = leaf->node.Upsert(key, seq);
      if (leaf->node.compactions() != compactions) BumpSerial(im->ctr.compactions, leaf->node.compactions() - compactions);
      if (st.ok()) {
        SetDirty(im, leaf);
        leaf->version.FetchAdd(1, MemOrder::kRelease);
        if (leaf->reads.Load(MemOrder::kRelaxed) != 0) leaf->reads.Store(0, MemOrder::kRelaxed);
        if (del) leaf->node.NoteDead(old_space + KeySpace(0));
        merge = del && leaf->parent != nullptr && leaf->node.live_estimate() < im->node_size / 4;
      } else if (st.code() == Err::kNoSpace) {
        NodeIter it(leaf->node);
        it.SeekToLast();
        append = !it.Valid() || it.pos() < key.pos;
      }
    }
    leaf->lock.WriteUnlock();
    t.lock.ReadUnlock();
    if (st.ok()) {
      if (merge) {
        WriteGuard g(t.lock);
        Miss m2;
        CachedNode* l2 = t.root != nullptr ? Descend(im, t, key.pos, 0, &m2) : nullptr;
        if (l2 != nullptr) TryMerge(im, t, l2);
      }
      return st;
    }
    if (st.code() != Err::kNoSpace) return st;
    {
      WriteGuard g(t.lock);
      Miss m2;
      CachedNode* l2 = Descend(im, t, key.pos, 0, &m2);
      if (l2 == nullptr) continue;  // evicted meanwhile: re-read, retry
      TFS_TRY(Split(im, t, l2, append, key.pos));
    }
    im->ctr.restarts.FetchAdd(1, MemOrder::kRelaxed);
  }
}

// A lookup in `leaf`, which had several sets, just ended (tree lock shared,
// leaf lock not held). Every lookup searches each set of the leaf, newest
// first; a leaf read many times without being updated is merged into one set,
// so later lookups search one. Only the layout changes, not the keys, so the
// node stays clean. The count is approximate (racing readers may lose an
// increment); an update resets it.
void TreeOps::ReadMostly(Impl* im, CachedNode* leaf) {
  const u32 r = leaf->reads.Load(MemOrder::kRelaxed) + 1;
  leaf->reads.Store(r, MemOrder::kRelaxed);
  if (r < kReadsBeforeMerge) return;
  // The writer thread merges it, off the lookup's path (a merge rewrites the
  // whole node: ~0.2 ms for 256 KiB). Without one, the reader does.
  if (im->writer_running) {
    if (leaf->merge_queued.Load(MemOrder::kRelaxed) != 0 || leaf->merge_queued.Exchange(1) != 0) return;
    Ref(leaf);
    bool queued;
    {
      MutexLock l(im->wmu);
      queued = !im->stop && im->merge_queue.PushBack(leaf).ok();
      if (queued) im->wcv.Signal();
    }
    if (!queued) {
      leaf->merge_queued.Store(0, MemOrder::kRelaxed);
      Unref(leaf);
    }
    return;
  }
  if (!leaf->lock.TryWriteLock()) return;
  MergeForReads(im, leaf);
  leaf->lock.WriteUnlock();
}

// Merges a leaf's sets into one (leaf write-locked). Its contents do not
// change, so it stays clean.
void TreeOps::MergeForReads(Impl* im, CachedNode* leaf) {
  platform::NoFsScope nofs;  // a lookup's merge: Compact allocates under the leaf lock
  if (leaf->node.nsets() >= 2 && leaf->node.Compact(0).ok()) {
    leaf->version.FetchAdd(1, MemOrder::kRelease);
    im->ctr.read_merges.FetchAdd(1, MemOrder::kRelaxed);
  }
  leaf->reads.Store(0, MemOrder::kRelaxed);
}

// The writer thread: merges the queued leaves that are still in the tree and
// have seen no update since they were queued.
void TreeOps::MergeQueued(Impl* im) {
  Vector<CachedNode*> batch;
  {
    MutexLock l(im->wmu);
    batch = Move(im->merge_queue);
  }
  for (CachedNode* n : batch) {
    Tree& t = im->trees[n->tree_id];  // (not its contents: no lock held yet)
    {
      ReadGuard g(t.lock);
      if (n->dead.Load(MemOrder::kAcquire) == 0 && n->reads.Load(MemOrder::kRelaxed) >= kReadsBeforeMerge) {
        n->lock.WriteLock();
        MergeForReads(im, n);
        n->lock.WriteUnlock();
      }
    }
    n->merge_queued.Store(0, MemOrder::kRelaxed);
    Unref(n);
  }
}

// At unmount, after the writer stopped: drops what it had not merged.
void TreeOps::DropMergeQueue(Impl* im) {
  for (CachedNode* n : im->merge_queue) {
    n->merge_queued.Store(0, MemOrder::kRelaxed);
    Unref(n);
  }
  im->merge_queue.Clear();
}

// Makes sure the leaf for pos is cached (no lock held on return).
Status TreeOps::Prefetch(Impl* im, const Pos& pos) {
  Tree& t = im->trees[pos.btree_id];
  for (;;) {
    Miss miss;
    {
      ReadGuard g(t.lock);
      if (t.root == nullptr || Descend(im, t, pos, 0, &miss) != nullptr) return Status::Ok();
    }
    TFS_TRY(FetchMiss(im, t, miss));
  }
}

// ---------------------------------------------------------------------------
// Btrees.

Btrees::Btrees() = default;

Btrees::~Btrees() {
  Close().IgnoreError();
  DetachJournal();
}

static void FreeSubtree(CachedNode* n) {
  for (usize i = 0; i < n->children.size(); i++)
    if (n->children[i] != nullptr) FreeSubtree(n->children[i]);
  TreeOps::Unref(n);
}

Status Btrees::Open(dev::DeviceSet* devs, alloc::Allocator* alloc, const sb::Superblock& sb, const Roots& roots,
                    const Options& options, Diag* diag) {
  if (impl_ != nullptr) return Err::kInvalidArgument;
  const u32 ns = sb.btree_node_size;
  if (options.node_size != 0 && options.node_size != ns)
    return DiagError(diag, Err::kInvalidArgument, "btree: node size %u does not match the filesystem's %u",
                     options.node_size, ns);
  if (ns < kMinNodeSize || ns > kMaxNodeSize || sb.bucket_size < ns)
    return DiagError(diag, Err::kInvalidArgument, "btree: node size %u does not fit buckets of %u", ns,
                     sb.bucket_size);
  Impl* im = platform::New<Impl>();
  if (im == nullptr) return Err::kNoMemory;
  impl_ = im;
  im->devs = devs;
  im->alloc = alloc;
  im->sb = sb;
  im->opt = options;
  if (im->opt.cache_bytes == 0) im->opt.cache_bytes = DefaultCacheBytes();
  im->node_size = ns;
  node_size_ = ns;
  im->slots_per_bucket = sb.bucket_size / ns;
  platform::RandomBytes(&im->rng, sizeof(im->rng));
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (HoldsBtree(sb, m)) im->capable |= dev::DevMask(1) << m;
    Status st = im->live[m].Resize(sb.members[m].nbuckets);
    if (!st.ok()) return st;
    for (usize b = 0; b < im->live[m].size(); b++) im->live[m][b] = 0;
  }
  im->target = im->capable;
  if (sb.options.metadata_target[0] != '\0') {
    auto r = devs->ResolveTarget(sb.options.metadata_target);
    if (r.ok() && (r.value() & im->capable) != 0) im->target = r.value() & im->capable;
  }
  im->wanted_durability = Max<u32>(sb.options.metadata_replicas, 1);
  roots_ = roots;
  im->stale_members.Store(StaleMask(roots), MemOrder::kRelaxed);
  im->degraded_reachable.Store(roots.degraded_nodes, MemOrder::kRelaxed);
  bool root_read[kNrBtreeIds] = {};
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    t.id = u8(id);
    const NodePtrFormat& rp = roots.roots[id];
    if (options.rebuild_from_scan) {
      Diag why;
      (void)DiagError(&why, Err::kCorrupt, "the roots block naming its root is lost");
      TFS_TRY(TreeOps::NoteLost(im, t, rp, Pos::Min(u8(id)), Pos::Max(u8(id)), why, Err::kCorrupt));
      TFS_TRY(TreeOps::MakeEmptySubtree(im, t, 0, Pos::Min(u8(id)), Pos::Max(u8(id)), &t.root));
      continue;
    }
    if (PtrEmpty(rp)) continue;
    CachedNode* r = nullptr;
    Diag why;
    Status st = TreeOps::ReadNode(im, rp, Pos::Max(u8(id)), &r, &why);
    if (!st.ok() && options.drop_bad_nodes && Droppable(st)) {
      TFS_TRY(TreeOps::NoteLost(im, t, rp, Pos::Min(u8(id)), Pos::Max(u8(id)), why, st));
      // A leaf root: the recovered keys grow the tree again.
      TFS_TRY(TreeOps::MakeEmptySubtree(im, t, 0, Pos::Min(u8(id)), Pos::Max(u8(id)), &t.root));
      continue;
    }
    if (!st.ok()) {
      return DiagError(diag, st, "btree %u root (member %u, offset %llu): %s", id, PtrCopy(rp, 0).member,
                       (unsigned long long)PtrCopy(rp, 0).offset, why.empty() ? st.Message() : why.text);
    }
    t.root = r;
    root_read[id] = true;
    TreeOps::Charge(im, r);
    TreeOps::NoteRepair(im, r);
  }
  // Every slot the trees use, reading interior nodes (they stay cached).
  // Their offsets, per member, for FindHoles (read-write mounts): all of
  // them or none (without memory, no holes; a partial list would make holes
  // of used slots).
  struct Used {
    Vector<u64> v[dev::kMaxDevices];
    bool ok = true;
    void Add(u32 m, u64 off) {
      if (ok && !v[m].PushBack(off).ok()) ok = false;
    }
  } used;
  struct Walk {
    // Counts the slot of each copy of p as live (and used): a pointer of
    // the roots block or of an interior node read, whose parse rules put
    // every copy in its member's bucket area (NodePtrProblem).
    static Status Count(Impl* im, const NodePtrFormat& p, Used* used, Diag* diag) {
      for (u32 i = 0; i < PtrCopies(p); i++) {
        const NodeCopy c = PtrCopy(p, i);
        const u64 b = im->sb.BucketOf(c.offset);
        if (++im->live[c.member][b] > im->slots_per_bucket)
          return DiagError(diag, Err::kCorrupt, "btree: more nodes than fit in bucket %llu of member %u",
                           (unsigned long long)b, c.member);
        if (used != nullptr) used->Add(c.member, c.offset);
      }
      return Status::Ok();
    }
    // `drop` (Options::drop_bad_nodes): leaves are read and verified too, and
    // a child that fails is replaced by an empty subtree.
    static Status Visit(Impl* im, Tree& t, CachedNode* n, Used* used, bool drop, Diag* diag) {
      TFS_TRY(Count(im, n->ptr, used, diag));
      if (n->node.info().level == 0) return Status::Ok();
      Vector<u32> bad;  // children dropped
      const Set& s = n->node.set(0);
      for (u32 i = 0; i < s.size(); i++) {
        NodePtrFormat cp = ReadPtr(s.Key(i));
        const Pos cmax = s.Key(i).pos();
        if (cp.level == 0 && !drop) {  // (n's read checked every copy's slot: CheckInterior)
          TFS_TRY(Count(im, cp, used, diag));
          continue;
        }
        CachedNode* c = nullptr;
        Diag why;
        Status st = TreeOps::ReadNode(im, cp, cmax, &c, &why);
        if (!st.ok() && drop && Droppable(st)) {
          TFS_TRY(TreeOps::NoteLost(im, t, cp, PtrMin(cp), cmax, why, st));
          TFS_TRY(bad.PushBack(i));
          continue;
        }
        if (!st.ok()) {
          if (diag != nullptr) *diag = why;
          return st;
        }
        if (cp.level == 0) {  // verified; read again when used
          platform::Delete(c);
          TFS_TRY(Count(im, cp, used, diag));
          continue;
        }
        c->parent = n;
        n->children[i] = c;
        TreeOps::Charge(im, c);
        TreeOps::NoteRepair(im, c);
        TFS_TRY(Visit(im, t, c, used, drop, diag));
      }
      if (bad.empty()) return Status::Ok();
      // The replacements, linked in one rebuild of n (which moves its keys).
      Vector<TreeOps::Edit> edits;
      TFS_TRY(edits.Reserve(bad.size()));
      Status st;
      for (u32 i : bad) {
        const NodePtrFormat cp = ReadPtr(s.Key(i));
        CachedNode* sub = nullptr;
        st = TreeOps::MakeEmptySubtree(im, t, cp.level, PtrMin(cp), s.Key(i).pos(), &sub);
        if (!st.ok()) break;
        edits.PushBack(TreeOps::Edit{s.Key(i).pos(), &sub->ptr, sub}).IgnoreError();  // reserved
      }
      if (st.ok()) st = TreeOps::RebuildInterior(im, n, edits.data(), u32(edits.size()));
      if (!st.ok()) {
        for (const TreeOps::Edit& e : edits) TreeOps::KillChain(im, t, e.child);
      }
      return st;
    }
  };
  const bool collect = !options.read_only || options.drop_bad_nodes;
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    if (root_read[id])
      TFS_TRY(Walk::Visit(im, im->trees[id], im->trees[id].root, collect ? &used : nullptr, options.drop_bad_nodes,
                          diag));
  }
  if (!im->lost.empty()) {
    if (!used.ok) return Err::kNoMemory;
    // The scan reads the buckets the allocator calls free or btree: it
    // learns what is known of them first (the allocator is loaded from the
    // alloc tree only after replay).
    if (options.before_scan != nullptr) TFS_TRY(options.before_scan(options.before_scan_ctx));
    TFS_TRY(TreeOps::RecoverLost(im, used.v));
  }
  if (collect && used.ok) {
    for (u32 m = 0; m < sb.nr_members; m++) im->used[m] = Move(used.v[m]);
    im->used_ok = true;
  }
  TreeOps::PublishNeed(im);
  {
    MutexLock c(im->state_mu);
    im->applied_seq = roots.journal_seq;
  }
  lost_ = Move(im->lost);
  im->opened = true;
  // (A platform that cannot take the hook leaves the cache at its bound.)
  Status sh = im->shrinker.Register(&TreeOps::ShrinkCount, &TreeOps::ShrinkScan, im, "btree-cache");
  if (!sh.ok())
    platform::Log(platform::LogLevel::kWarn, "btree: no memory-pressure hook for the node cache: %s", sh.Message());
  return Status::Ok();
}

Status Btrees::ReconcileBuckets() {
  Impl* im = impl_;
  if (im == nullptr || im->opt.read_only) return Err::kInvalidArgument;
  alloc::Allocator* alloc = im->alloc;
  // Buckets a crash left allocated to an unfinished checkpoint (or an
  // unmount's final checkpoint emptied) are freed; a bucket the trees use is
  // marked as btree (a cut between a checkpoint's allocation and its record
  // being in a written leaf; replay already did, normally). The trees are the
  // truth for node buckets. (Nothing else commits yet: the frees' records
  // are reclaim commits, docs/format/alloc.md.)
  Vector<alloc::BucketRef> frees;
  for (u32 m = 0; m < im->sb.nr_members; m++) {
    for (u64 b = 0; b < im->live[m].size(); b++) {
      alloc::Bucket bk = alloc->Get(m, b);
      if (im->live[m][b] != 0 && bk.state != alloc::BucketState::kBtree) {
        platform::Log(platform::LogLevel::kWarn, "btree: member %u bucket %llu holds nodes but was %s", m,
                      (unsigned long long)b, alloc::BucketStateName(bk.state));
        TFS_TRY(alloc->RepairState(m, b, alloc::BucketState::kBtree));
        im->ctr.reconcile_marks.FetchAdd(1, MemOrder::kRelaxed);
      } else if (im->live[m][b] == 0 && bk.state == alloc::BucketState::kBtree) {
        TFS_TRY(frees.PushBack(alloc::BucketRef{m, b, bk.gen}));
      }
    }
  }
  if (!frees.empty()) {
    TFS_TRY(alloc->FreeBuckets(frees.data(), u32(frees.size())));
    im->ctr.reconcile_frees.FetchAdd(frees.size(), MemOrder::kRelaxed);
    platform::Log(platform::LogLevel::kInfo, "btree: freed %llu btree buckets no tree reaches",
                  (unsigned long long)frees.size());
  }
  if (im->used_ok) TreeOps::FindHoles(im, im->used);
  for (u32 m = 0; m < im->sb.nr_members; m++) im->used[m].Clear();
  im->used_ok = false;
  TreeOps::PublishNeed(im);
  return Status::Ok();
}

void Btrees::AttachJournal(journal::Journal* journal) {
  Impl* im = impl_;
  if (im == nullptr) return;
  im->journal = journal;
  if (im->opt.writer_thread && journal != nullptr && !im->writer_running) {
    im->stop = false;
    if (im->writer.Start(TreeOps::WriterMain, this, "tfs-btree-writer").ok()) im->writer_running = true;
  }
}

Status Btrees::Close(bool* settled) {
  if (settled != nullptr) *settled = false;
  Impl* im = impl_;
  if (im == nullptr) return Status::Ok();
  im->shrinker.Unregister();  // returns once no scan runs
  if (im->writer_running) {
    {
      MutexLock l(im->wmu);
      im->stop = true;
      im->wcv.Signal();
    }
    im->writer.Join();
    im->writer_running = false;
  }
  TreeOps::DropMergeQueue(im);
  im->reclaim_ok.FetchAdd(1, MemOrder::kRelaxed);  // nothing else commits now (never taken back)
  {
    // Checkpoints' late I/Os (6c-3): waited for (an unmount waits out a
    // stall, as the journal's Stop does); the unmount's give nothing up.
    MutexLock ck(im->ckpt_mu);
    im->closing = true;
    TreeOps::WaitLate(im);
  }
  Status st;
  // Nothing commits any more, so these checkpoints cover every journal entry
  // (a clean filesystem is mounted without replay). Each checkpoint's own
  // allocation records (a bucket freed after its roots block, one reserved)
  // dirty an alloc leaf, which the next one writes; a rewrite that takes a
  // hole or the open bucket's next slot changes no allocation state, so a
  // few rounds leave nothing dirty. If not (one slot per bucket: every
  // rewrite takes a new bucket), a final checkpoint reserves before it
  // images and frees nothing (docs/format/alloc.md, "Checkpoints and the
  // recursion").
  bool clean = im->opt.read_only || !im->opened;
  if (!im->opt.read_only && im->opened) {
    constexpr int kRounds = 3;
    for (int round = 0; round < kRounds && st.ok() && !clean; round++) {
      st = Checkpoint();
      clean = im->dirty_nodes.Load(MemOrder::kRelaxed) == 0;
    }
    // Once, after the rounds: released in every round, the next round's
    // rewrite would take a hole or a new bucket instead of the open bucket's
    // next slot (a record: the alloc leaf dirty again). Its free (no node in
    // it) dirties the alloc leaf: the final checkpoint writes that.
    if (st.ok()) {
      TreeOps::ReleaseOpenBucket(im);
      clean = im->dirty_nodes.Load(MemOrder::kRelaxed) == 0;
    }
    if (st.ok() && !clean) {
      st = TreeOps::RunCheckpoint(im, &roots_, /*final=*/true);
      clean = st.ok() && im->dirty_nodes.Load(MemOrder::kRelaxed) == 0;
      if (st.ok() && !clean)
        platform::Log(platform::LogLevel::kWarn, "btree: %llu nodes still dirty after the unmount's checkpoints",
                      (unsigned long long)im->dirty_nodes.Load(MemOrder::kRelaxed));
    }
  }
  if (settled != nullptr) *settled = st.ok() && clean;
  if (im->journal != nullptr && im->pin.active) {
    if (st.ok() && clean) {
      im->journal->PinDrop(&im->pin);
    } else {
      // The journal still holds what the trees on disk lack: its final entry
      // must not record a last_seq past it (DetachJournal, after Stop).
      TFS_BUG_ON(kept_pin_.active);
      kept_journal_ = im->journal;
      kept_pin_ = im->pin;
      im->pin.active = false;
    }
  }
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    if (t.root != nullptr) FreeSubtree(t.root);
    t.root = nullptr;
  }
  // (No late I/O is left: the wait above, and the checkpoints since gave
  // nothing up.) A completion's last touch of im (PhaseDone) is
  // phase_out's decrement.
  TFS_BUG_ON(im->late_batches != nullptr);
  while (im->phase_out.Load(MemOrder::kAcquire) != 0) platform::SleepNs(platform::kNsPerMs);
  platform::Delete(im);
  impl_ = nullptr;
  return st;
}

void Btrees::DetachJournal() {
  if (kept_journal_ != nullptr && kept_pin_.active) kept_journal_->PinDrop(&kept_pin_);
  kept_journal_ = nullptr;
}

void Btrees::Abandon() {
  if (impl_ != nullptr) impl_->opened = false;  // (Close checkpoints only an opened store)
  Close().IgnoreError();
}

Status Btrees::ApplyReplayed(u64 seq, const journal::Key& key) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  if (seq <= roots_.journal_seq) return Status::Ok();  // the trees already hold it
  if (key.len < sizeof(KeyHeader)) return Err::kCorrupt;
  const auto* h = static_cast<const KeyHeader*>(key.val);
  KeyInput in;
  in.pos = KeyRef(h).pos();
  in.type = h->type;
  in.val_bytes = h->val_bytes.get();
  in.value = h + 1;
  if (in.pos.btree_id >= kNrBtreeIds || (in.type != kKeyValue && in.type != kKeyWhiteout) ||
      in.val_bytes > kMaxValueBytes || KeySpace(in.val_bytes) > key.len ||
      (in.type == kKeyWhiteout && in.val_bytes != 0))
    return Err::kCorrupt;
  TFS_TRY(TreeOps::ApplyKey(im, in, seq));
  TreeOps::MaybeEvict(im);
  MutexLock c(im->state_mu);
  if (seq > im->applied_seq) im->applied_seq = seq;
  return Status::Ok();
}

Status Btrees::Get(const Pos& pos, Vector<u8>* value) {
  for (;;) {
    u8 small[64];
    auto r = Get(pos, small, sizeof(small));
    if (!r.ok()) return r.status();
    TFS_TRY(value->Resize(r.value()));
    if (r.value() <= sizeof(small)) {
      MemCopy(value->data(), small, r.value());
      return Status::Ok();
    }
    auto r2 = Get(pos, value->data(), u32(value->size()));
    if (!r2.ok()) return r2.status();
    if (r2.value() == value->size()) return Status::Ok();
    // Changed size in between: again.
  }
}

Result<u32> Btrees::Get(const Pos& pos, void* buf, u32 cap) {
  Impl* im = impl_;
  if (im == nullptr || pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  Tree& t = im->trees[pos.btree_id];
  im->ctr.lookups.FetchAdd(1, MemOrder::kRelaxed);
  for (;;) {
    TreeOps::Miss miss;
    t.lock.ReadLock();
    if (t.root == nullptr) {
      t.lock.ReadUnlock();
      return Err::kNotFound;
    }
    CachedNode* leaf = TreeOps::Descend(im, t, pos, 0, &miss);
    if (leaf != nullptr) im->c_hits.FetchAdd(1, MemOrder::kRelaxed);
    if (leaf == nullptr) {
      t.lock.ReadUnlock();
      TFS_TRY(TreeOps::FetchMiss(im, t, miss));
      continue;
    }
    leaf->lock.ReadLock();
    KeyRef k = leaf->node.Find(pos);
    u32 len = 0;
    if (k.valid()) {
      len = k.val_bytes();
      MemCopy(buf, k.value(), Min(len, cap));
    }
    const bool several_sets = leaf->node.nsets() >= 2;
    leaf->lock.ReadUnlock();
    if (several_sets) TreeOps::ReadMostly(im, leaf);
    t.lock.ReadUnlock();
    TreeOps::MaybeEvict(im);
    if (!k.valid()) return Err::kNotFound;
    return len;
  }
}

Status Btrees::CheckCopy(const NodePtrFormat& p, u32 i, const Pos& max, Diag* diag) {
  Impl* im = impl_;
  if (im == nullptr || i >= PtrCopies(p)) return Err::kInvalidArgument;
  CachedNode* n = nullptr;
  TFS_TRY(TreeOps::ReadCopy(im, p, i, max, &n, diag));
  platform::Delete(n);
  return Status::Ok();
}

Status Btrees::RewriteNode(u8 id, u8 level, const Pos& pos) {
  Impl* im = impl_;
  if (im == nullptr || id >= kNrBtreeIds || pos.btree_id != id || im->opt.read_only) return Err::kInvalidArgument;
  Tree& t = im->trees[id];
  for (;;) {
    TreeOps::Miss miss;
    {
      WriteGuard g(t.lock);
      if (t.root == nullptr || t.root->node.info().level < level) return Err::kNotFound;
      CachedNode* n = TreeOps::Descend(im, t, pos, level, &miss);
      if (n != nullptr) {
        if (n->node.info().level != level) return Err::kNotFound;  // (not reached: Descend stops at level)
        n->repair_from = 0;  // (a fallback read's note: this is the repair)
        if (n->dirty.Load(MemOrder::kRelaxed) == 0) {  // (else rewritten anyway, or counted by its read)
          im->ctr.node_repairs.FetchAdd(1, MemOrder::kRelaxed);
          TreeOps::SetDirty(im, n);
        }
        return Status::Ok();
      }
    }
    TFS_TRY(TreeOps::FetchMiss(im, t, miss));
  }
}

Status Btrees::ForEachSlot(SlotFn fn, void* ctx) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  struct Walk {
    static Status Each(const NodePtrFormat& p, SlotFn fn, void* ctx) {
      for (u32 i = 0; i < PtrCopies(p); i++) TFS_TRY(fn(ctx, PtrCopy(p, i)));
      return Status::Ok();
    }
    static Status Visit(Impl* im, const CachedNode* n, SlotFn fn, void* ctx) {
      TFS_TRY(Each(n->ptr, fn, ctx));
      if (n->node.info().level == 0) return Status::Ok();
      const Set& s = n->node.set(0);
      for (u32 i = 0; i < s.size(); i++) {
        if (i < n->children.size() && n->children[i] != nullptr) {
          TFS_TRY(Visit(im, n->children[i], fn, ctx));
          continue;
        }
        const NodePtrFormat cp = ReadPtr(s.Key(i));
        if (cp.level == 0) {
          TFS_TRY(Each(cp, fn, ctx));
          continue;
        }
        CachedNode* c = nullptr;  // evicted: read, walked, dropped
        TFS_TRY(TreeOps::ReadNode(im, cp, s.Key(i).pos(), &c, nullptr));
        Status st = Visit(im, c, fn, ctx);
        platform::Delete(c);
        TFS_TRY(st);
      }
      return Status::Ok();
    }
  };
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    if (t.root != nullptr) TFS_TRY(Walk::Visit(im, t.root, fn, ctx));
    // Slots of nodes replaced since the last roots block (and copies fsck
    // recovered from): that block still names them until the next one.
    for (const NodePtrFormat& p : t.dead_slots) TFS_TRY(Walk::Each(p, fn, ctx));
    for (const NodePtrFormat& p : t.kept_slots) TFS_TRY(Walk::Each(p, fn, ctx));
  }
  return Status::Ok();
}


Stats Btrees::GetStats() const {
  Stats s;
  MemSet(&s, 0, sizeof(s));
  Impl* im = impl_;
  if (im == nullptr) return s;
  auto L = [](const Atomic<u64>& a) { return a.Load(MemOrder::kRelaxed); };
  TFS_COUNTER_LOAD(TFS_BTREE_COUNTERS, im->ctr, s);
  s.cache_hits = L(im->c_hits) + L(im->c_apply_hits);
  s.dropped_nodes = im->s_dropped;
  s.scanned_slots = im->s_scanned;
  s.scan_copies = im->s_copies;
  s.recovered_keys = im->s_recovered;
  s.cached_nodes = L(im->cached_nodes);
  s.cached_bytes = L(im->cached_bytes);
  s.dirty_nodes = L(im->dirty_nodes);
  s.dirty_bytes = s.dirty_nodes * im->node_size;
  s.unwritten_nodes = L(im->unwritten_nodes);
  s.stale_members = PopCount(L(im->stale_members));
  s.degraded_reachable = L(im->degraded_reachable);
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    Tree& t = im->trees[id];
    ReadGuard g(t.lock);
    s.depth[id] = t.root != nullptr ? t.root->node.info().level + 1u : 0;
  }
  return s;
}

Status Btrees::ForEachNode(Status (*fn)(void* ctx, const NodeVisit& v), void* ctx, Diag* diag) {
  // The continuing walk, stopped by the first bad node.
  struct Stop {
    Status (*fn)(void*, const NodeVisit&);
    void* ctx;
    Diag* diag;
    static Status Visit(void* c, const NodeVisit& v) {
      auto* s = static_cast<Stop*>(c);
      return s->fn(s->ctx, v);
    }
    static Status Bad(void* c, const NodeError& e) {
      return DiagError(static_cast<Stop*>(c)->diag, e.status, "%s", e.text);
    }
  };
  Stop stop{fn, ctx, diag};
  return ForEachNodeContinuing(Stop::Visit, Stop::Bad, &stop);
}

Status Btrees::ForEachNodeContinuing(Status (*fn)(void* ctx, const NodeVisit& v),
                                     Status (*bad)(void* ctx, const NodeError& e), void* ctx) {
  Impl* im = impl_;
  if (im == nullptr) return Err::kInvalidArgument;
  struct Walk {
    static Status Visit(Impl* im, const NodePtrFormat& p, const Pos& max, Status (*fn)(void*, const NodeVisit&),
                        Status (*bad)(void*, const NodeError&), void* ctx) {
      CachedNode* n = nullptr;
      Diag d;
      Status st = TreeOps::ReadNode(im, p, max, &n, &d);
      if (!st.ok()) return bad(ctx, NodeError{&p, max, st, d.empty() ? st.Message() : d.text});
      NodeVisit v{&n->node, &p, n->repair_from};
      st = fn(ctx, v);
      if (st.ok() && n->node.info().level > 0) {
        const Set& s = n->node.set(0);
        for (u32 i = 0; i < s.size() && st.ok(); i++) {
          NodePtrFormat cp = ReadPtr(s.Key(i));
          st = Visit(im, cp, s.Key(i).pos(), fn, bad, ctx);
        }
      }
      platform::Delete(n);
      return st;
    }
  };
  for (u32 id = 0; id < kNrBtreeIds; id++) {
    const NodePtrFormat& rp = roots_.roots[id];
    if (PtrEmpty(rp)) continue;
    TFS_TRY(Walk::Visit(im, rp, Pos::Max(u8(id)), fn, bad, ctx));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Transactions.

Transaction::~Transaction() = default;

void Transaction::Reset() {
  keys_.Clear();
  checks_.Clear();
  later_.Clear();
  n_ = 0;
  nchecks_ = 0;
  apply_seq_ = nullptr;
  reclaim_ = false;
  hook_ = nullptr;
}

Status Transaction::AddDataCheck(const void* check, u32 len) {
  if (len < sizeof(journal::DataCheckFormat) || len > journal::DataCheckBytes(journal::kMaxDataCheckBytes / 4096))
    return Err::kInvalidArgument;
  const usize space = journal::KeySpace(len);  // header + padded value, as in the entry
  if (JournalBytes() + space > JournalLimit()) return Err::kTooBig;
  const usize at = checks_.size();
  TFS_TRY(checks_.Grow(at + space));
  TFS_TRY(checks_.Resize(at + space));
  auto* kh = reinterpret_cast<journal::KeyHeader*>(checks_.data() + at);
  kh->type.set(journal::kKeyDataCheck);
  kh->reserved.set(0);
  kh->len.set(len);
  MemCopy(checks_.data() + at + sizeof(journal::KeyHeader), check, len);
  MemSet(checks_.data() + at + sizeof(journal::KeyHeader) + len, 0, space - sizeof(journal::KeyHeader) - len);
  nchecks_++;
  return Status::Ok();
}

usize Transaction::JournalBytes() const {
  return keys_.size() + usize(n_) * sizeof(journal::KeyHeader) + checks_.size() + sizeof(journal::EntryHeader);
}

usize Transaction::JournalLimit() const {
  const journal::Journal* j = trees_->impl_ != nullptr ? trees_->impl_->journal : nullptr;
  return j != nullptr ? j->max_entry_bytes() : journal::Config{}.max_entry_bytes;
}

usize Transaction::Room() const {
  const usize used = JournalBytes(), limit = JournalLimit();
  return used < limit ? limit - used : 0;
}

Status Transaction::Set(const Pos& pos, const void* value, u32 len) {
  KeyInput in;
  in.pos = pos;
  in.type = kKeyValue;
  in.value = value;
  in.val_bytes = len;
  if (pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  TFS_TRY(CheckKeyInput(in, pos.btree_id));
  return Append(in);
}

Status Transaction::Append(const KeyInput& in) {
  // One journal commit carries the whole transaction: it must fit in an entry
  // (entry header, then an 8-byte journal key header per key).
  const usize space = KeySpace(in.val_bytes);
  if (JournalBytes() + space + sizeof(journal::KeyHeader) > JournalLimit()) return Err::kTooBig;
  const usize at = keys_.size();
  TFS_TRY(keys_.Grow(at + space));
  TFS_TRY(keys_.Resize(at + space));
  PackKey(keys_.data() + at, in);
  n_++;
  return Status::Ok();
}

Status Transaction::Delete(const Pos& pos) {
  if (pos.btree_id >= kNrBtreeIds) return Err::kInvalidArgument;
  KeyInput in;
  in.pos = pos;
  in.type = kKeyWhiteout;
  return Append(in);
}

Result<u32> Transaction::SetLater(const Pos& pos, u32 len) {
  static constexpr u8 kZeros[kMaxLaterBytes] = {};
  if (pos.btree_id != kBtreeAlloc || len == 0 || len > kMaxLaterBytes) return Err::kInvalidArgument;
  KeyInput in;
  in.pos = pos;
  in.type = kKeyValue;
  in.value = kZeros;
  in.val_bytes = len;
  const usize at = keys_.size();
  TFS_TRY(later_.Reserve(later_.size() + 1));  // (before the key: nothing to undo)
  TFS_TRY(Append(in));
  later_.PushBack(u32(at)).IgnoreError();  // reserved
  return u32(later_.size() - 1);
}

Result<u64> Transaction::Commit(journal::CommitMode mode, dev::DevMask deps, dev::DevMask lossable) {
  Btrees::Impl* im = trees_->impl_;
  if (im == nullptr) {
    Reset();
    return Err::kInvalidArgument;
  }
  if (n_ == 0) {
    Reset();
    return u64(0);
  }
  if (hook_ != nullptr && reclaim_) {  // (a reclaim commit skips commit_mu: no journal order to compute in)
    Reset();
    return Err::kInvalidArgument;
  }
  if (!later_.empty() && hook_ == nullptr) {  // nothing would fill the slots: they would journal zeros
    Reset();
    return Err::kInvalidArgument;
  }
  // Only a checkpoint's own changes (or, with no journal, the mount's; or
  // the unmount's) may skip commit_mu and the ring's room: anything else
  // marked so (a btree bucket allocated or freed outside a checkpoint) is
  // committed as an ordinary transaction, which is always safe there. (A
  // cheap check, not of the calling thread: while a checkpoint runs, such
  // a change would still go as a reclaim commit; Allocator::Free and
  // SetLiveSectors never ask for one.)
  if (reclaim_ && im->journal != nullptr && im->reclaim_ok.Load(MemOrder::kRelaxed) == 0) {
    bool alloc_only = nchecks_ == 0;  // (what a reclaim commit may carry, as CommitReclaim checks)
    for (usize off = 0; alloc_only && off < keys_.size();) {
      const auto* h = reinterpret_cast<const KeyHeader*>(keys_.data() + off);
      alloc_only = h->btree_id == kBtreeAlloc && !alloc::IsAcctKey(h->inode.get());
      off += KeySpace(h->val_bytes.get());
    }
    if (!alloc_only) {
      Reset();
      return Err::kInvalidArgument;
    }
    reclaim_ = false;
  }
  if (reclaim_) {
    Result<u64> r = CommitReclaim();
    Reset();
    return r;
  }
  // Throttle: while dirty nodes fill the cache, or the journal ring is three
  // quarters held, wait for the writer's checkpoint (no lock held).
  if (im->writer_running) {
    for (int round = 0; round < 50; round++) {
      const bool memory = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size > im->opt.cache_bytes;
      if (!memory && !TreeOps::JournalBelow(im, 1, 4, 3)) break;
      MutexLock l(im->wmu);
      if (im->stop) break;
      const u64 seen = im->ckpt_done;
      im->wake = true;
      im->wcv.Signal();
      im->ctr.throttles.FetchAdd(1, MemOrder::kRelaxed);
      while (im->ckpt_done == seen && !im->stop) (void)im->done_cv.WaitFor(im->wmu, 100 * platform::kNsPerMs);
    }
  }
  if (im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "commit.throttled");
  // The leaves to update are read now, before the journal commit, with no lock
  // held -- unless every node is cached (then ApplyKey cannot miss; were one
  // evicted meanwhile, ApplyKey would read it itself: slower, still correct).
  // The journal's view of the keys (kept between commits: no allocation per commit).
  Vector<journal::Key>& jkeys = jkeys_;
  const bool prefetch = im->partial.Load(MemOrder::kRelaxed) != 0;
  jkeys.Clear();
  Status st = jkeys.Reserve(n_ + nchecks_);
  for (usize off = 0; st.ok() && off < keys_.size();) {
    const auto* h = reinterpret_cast<const KeyHeader*>(keys_.data() + off);
    const u32 space = KeySpace(h->val_bytes.get());
    jkeys.PushBack(journal::Key{journal::kKeyBtree, space, h}).IgnoreError();
    if (prefetch) st = TreeOps::Prefetch(im, KeyRef(h).pos());
    off += space;
  }
  for (usize off = 0; st.ok() && off < checks_.size();) {
    const auto* kh = reinterpret_cast<const journal::KeyHeader*>(checks_.data() + off);
    jkeys.PushBack(journal::Key{journal::kKeyDataCheck, kh->len.get(), kh + 1}).IgnoreError();
    off += journal::KeySpace(kh->len.get());
  }
  if (!st.ok()) {
    Reset();
    return st;
  }
  u64 seq = 0;
  const CommitHook* const hook = hook_;
  {
    if (im->commit_mu.held()) {  // (a glance, for the counter and the tests: it may be free by the Lock)
      im->ctr.commit_waits.FetchAdd(1, MemOrder::kRelaxed);
      if (im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "commit.waiting");
    }
    MutexLock c(im->commit_mu);
    bool need_pin;
    {
      MutexLock sl(im->state_mu);
      st = im->failed;
      // Without a journal (the mount, before it starts): part of the newest
      // entry replayed -- never a sequence the journal will give a later
      // entry, which a checkpoint's `covered` would then claim.
      seq = im->applied_seq;
      im->committing = true;      // see RunCheckpoint's `covered` and pin
      // The trees hold one pin, on the oldest entry not yet in a checkpoint; it
      // keeps every newer entry in the ring too. Only without one does this
      // commit pin its entry (a checkpoint that drops the pin while a commit is
      // in flight re-pins past what it covered, see RunCheckpoint).
      need_pin = !im->pin.active;
    }
    // The hook fills the SetLater values now: every earlier commit is
    // journaled (and published) or failed, so what it computes follows them
    // in journal order.
    const bool prepared = st.ok() && hook != nullptr;
    if (prepared) st = hook->prepare(hook->ctx, this);
    bool tried = false;  // the journal was asked to take the entry
    if (st.ok() && im->journal != nullptr) {
      tried = true;
      journal::Pin local;
      auto r = im->journal->Commit(jkeys.data(), u32(jkeys.size()), deps,
                                   mode == journal::CommitMode::kFlushNext ? mode : journal::CommitMode::kNoFlush,
                                   need_pin ? &local : nullptr, journal::Watermark::kNormal, lossable);
      if (!r.ok()) {
        st = r.status();
      } else {
        seq = r.value();
        if (need_pin) {
          journal::Pin extra;
          {
            MutexLock sl(im->state_mu);
            // Set meanwhile only by a reclaim commit (of a later entry, or
            // this one): the older pin holds both.
            extra = local;
            if (!im->pin.active || local.seq < im->pin.seq) Swap(im->pin, extra);
          }
          if (extra.active) im->journal->PinDrop(&extra);
        }
      }
    }
    const bool journaled = st.ok();  // (without a journal: applied below, as the mount's keys are)
    if (st.ok() && im->opt.test_point != nullptr) im->opt.test_point(im->opt.test_point_ctx, "commit.journaled");
    Atomic<u64>* const apply_seq = apply_seq_;
    if (apply_seq != nullptr) apply_seq->FetchAdd(1, MemOrder::kSeqCst);  // odd: applying
    for (usize i = 0; st.ok() && i < n_; i++) {  // the btree keys (data checks follow)
      const KeyInput in = KeyInputOf(static_cast<const KeyHeader*>(jkeys[i].val));
      st = TreeOps::ApplyKey(im, in, seq);
      BumpSerial(in.type == kKeyWhiteout ? im->ctr.deletes : im->ctr.inserts);
    }
    // Published with the keys, before a reader of the apply window may look.
    if (prepared) hook->finish(hook->ctx, journaled ? seq : 0, journaled);
    if (apply_seq != nullptr) apply_seq->FetchAdd(1, MemOrder::kSeqCst);  // even: applied (or failed)
    if (st.ok()) BumpSerial(im->ctr.commits);
    MutexLock sl(im->state_mu);
    im->committing = false;
    if (st.ok()) {
      im->applied_seq = Max(im->applied_seq, seq);
    } else if (tried && seq != 0 && im->failed.ok() && st.code() != Err::kTooBig) {
      // Journaled (or possibly journaled) but not fully applied: stop here.
      im->failed = st;
    }
  }
  Reset();
  TreeOps::MaybeEvict(im);
  if (!st.ok()) return st;
  if (mode == journal::CommitMode::kFlush && im->journal != nullptr) TFS_TRY(im->journal->Flush());
  return seq;
}

Result<u64> Transaction::CommitReclaim() {
  Btrees::Impl* im = trees_->impl_;
  Vector<journal::Key>& jkeys = jkeys_;
  jkeys.Clear();
  TFS_TRY(jkeys.Reserve(n_));
  for (usize off = 0; off < keys_.size();) {
    const auto* h = reinterpret_cast<const KeyHeader*>(keys_.data() + off);
    const u32 space = KeySpace(h->val_bytes.get());
    // Order matters for every other key -- the accounting keys' too.
    if (h->btree_id != kBtreeAlloc || alloc::IsAcctKey(h->inode.get())) return Err::kInvalidArgument;
    jkeys.PushBack(journal::Key{journal::kKeyBtree, space, h}).IgnoreError();
    off += space;
  }
  if (nchecks_ != 0) return Err::kInvalidArgument;
  u64 seq;
  bool need_pin;
  {
    MutexLock sl(im->state_mu);
    TFS_TRY(im->failed);
    seq = im->applied_seq;  // (without a journal: see Commit)
    need_pin = !im->pin.active;
  }
  bool journaled = false;
  if (im->journal != nullptr) {
    journal::Pin local;
    auto r = im->journal->Commit(jkeys.data(), u32(jkeys.size()), 0, journal::CommitMode::kNoFlush,
                                 need_pin ? &local : nullptr, journal::Watermark::kReclaim);
    if (!r.ok()) {
      MutexLock sl(im->state_mu);
      if (im->failed.ok()) im->failed = r.status();  // (maybe journaled: memory must not go on without it)
      return r.status();
    }
    seq = r.value();
    journaled = true;
    if (need_pin) {
      // Without a pin (none since the last checkpoint moved it) this entry
      // must stay in the ring until a roots block covers it; a normal commit
      // may have pinned an older entry meanwhile: the older pin holds both.
      journal::Pin extra = local;
      {
        MutexLock sl(im->state_mu);
        if (!im->pin.active || local.seq < im->pin.seq) Swap(im->pin, extra);
      }
      if (extra.active) im->journal->PinDrop(&extra);
    }
  }
  Status st;
  for (usize i = 0; st.ok() && i < n_; i++)
    st = TreeOps::ApplyKey(im, KeyInputOf(static_cast<const KeyHeader*>(jkeys[i].val)), seq);
  {
    MutexLock sl(im->state_mu);
    if (st.ok()) {
      im->reclaim_applied = Max(im->reclaim_applied, seq);
    } else if (journaled && im->failed.ok()) {
      im->failed = st;  // journaled but not fully applied: stop here
    }
  }
  // (Not counted in commits or inserts, the transactions' counters: a
  // checkpoint's bookkeeping, counted by the allocator as record commits.)
  if (st.ok()) im->ctr.reclaim_commits.FetchAdd(1, MemOrder::kRelaxed);
  TreeOps::MaybeEvict(im);
  TFS_TRY(st);
  return seq;
}

}  // namespace tfs::btree
