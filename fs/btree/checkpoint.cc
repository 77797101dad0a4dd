// Write-out (docs/design/btree.md, "Write-out: copy-on-write checkpoints"):
// the roots block; node slots in btree buckets (holes, then the open bucket,
// then buckets reserved ahead; a bucket is freed with its last slot) and the
// need for them published to the allocator (PublishNeed, space.md);
// RunCheckpoint (images of dirty leaves; per tree, exclusive, new pointers
// installed and new or changed interior nodes imaged; then journal flush,
// node writes, device flushes, the roots block with FUA, and only then old
// slots freed and the journal pin moved); the writer thread that runs it.
//
// ckpt_mu (one checkpoint at a time) is held throughout, I/O included: no
// lookup or commit takes it, and a checkpoint never takes commit_mu (a
// committer may wait inside it for the room a checkpoint makes). Under a
// tree or leaf lock: no I/O and no allocator change (an allocation may
// settle the journal, and every change commits an allocation record);
// slot_mu may be taken there, and the allocator's Get under slot_mu. The
// allocator changes a checkpoint makes -- a node bucket reserved (Allocate),
// emptied buckets freed after the roots block (FreeBuckets, one batch) --
// are made with no tree, leaf or slot lock held; their records are reclaim
// commits (Transaction::SetReclaim: no commit_mu, never waiting for ring
// room), journaled before the write-ahead flush when they precede the roots
// block (docs/format/alloc.md, "Checkpoints and the recursion").
#include "btree/internal.h"

#include "dev/io_queue.h"
#include "util/bits.h"
#include "util/sort.h"

namespace tfs::btree {

// ---------------------------------------------------------------------------
// Roots blocks.

namespace {

// A roots block's entry t: the parse rules (an empty tree's root has no
// copy) and its tree's root, starting at the tree's min.
bool RootPtrValid(const NodePtrFormat& p, u8 id, const sb::Superblock& sb) {
  return p.btree_id == id && p.level <= kMaxLevel && NodePtrProblem(p, sb, sb.btree_node_size, true) == nullptr &&
         (PtrEmpty(p) ? p.level == 0 && p.seq.get() == 0 && p.min_inode.get() == 0 && p.min_offset.get() == 0
                      : IsMin(PtrMin(p)));
}

}  // namespace

Status ReadRoots(dev::DeviceSet& devs, const sb::Superblock& sb, Roots* out, Diag* diag) {
  u8* buf = static_cast<u8*>(platform::Alloc(2 * kRootsSlotSize, 4096, false));
  if (buf == nullptr) return Err::kNoMemory;
  bool found = false;
  u32 bad = 0;
  Status io;  // the first read that failed
  u64 member_gen[dev::kMaxDevices] = {};  // each member's newest valid gen (0: none)
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (!HoldsBtree(sb, m) || ((devs.missing() >> m) & 1) != 0) continue;  // (a degraded open's: not read)
    Status st = dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kRead, kRootsOffset, buf, 2 * kRootsSlotSize, 0,
                                 IoOrigin::kBtree);
    if (!st.ok()) {
      bad++;
      if (io.ok()) io = st;
      continue;
    }
    for (u32 slot = 0; slot < 2; slot++) {
      const auto* r = reinterpret_cast<const RootsFormat*>(buf + slot * kRootsSlotSize);
      if (r->magic.get() != kRootsMagic || r->version.get() != kRootsVersion || r->nroots.get() != kNrBtreeIds ||
          MemCompare(r->fs_uuid, sb.fs_uuid, 16) != 0 ||
          r->csum.get() != platform::Crc32cSkippingField(r, kRootsSlotSize, __builtin_offsetof(RootsFormat, csum))) {
        bad++;
        continue;
      }
      bool shape_ok = true;
      for (u32 t = 0; t < kNrBtreeIds; t++)
        if (!RootPtrValid(r->roots[t], u8(t), sb)) shape_ok = false;
      if (!shape_ok) {
        bad++;
        continue;
      }
      member_gen[m] = Max(member_gen[m], r->gen.get());
      if (found && r->gen.get() <= out->gen) continue;
      found = true;
      out->gen = r->gen.get();
      out->journal_seq = r->journal_seq.get();
      out->node_seq_hi = r->node_seq_hi.get();
      for (u32 i = 0; i < dev::kMaxDevices; i++) {
        out->stale_since[i] = r->stale_since[i].get();
        out->stale_until[i] = r->stale_until[i].get();
        out->degraded_on[i] = r->degraded_on[i].get();
      }
      out->degraded_nodes = r->degraded_nodes.get();
      MemCopy(out->roots, r->roots, sizeof(out->roots));
    }
  }
  platform::Free(buf);
  // A member behind the newest roots block missed a checkpoint's end (a cut
  // that reached the members at different moments, a member that failed):
  // the nodes written since may lack their copy there. Recorded, so that
  // every roots block from now on says so until fsck -y has verified them
  // (the open says so once: Store::Open). Only a member with a valid roots
  // block that is older: one with none (rot, read errors) is no evidence of
  // a missed checkpoint, and damage on it stays an error; one whose newest
  // slot rotted is marked from the gen after its older one, which excuses
  // only the copies of that one checkpoint. (A degraded open's missing
  // member is not read: member_gen 0, never marked.) The window is the gens
  // it missed, up to the newest: every later checkpoint writes every member
  // not marked failed, or fails -- or leaves out a held one (6c-3), whose
  // copies none of its pointers name, or marks it stale itself -- so copies
  // of nodes written after it were written (an earlier window is widened
  // to cover both); one marked failed
  // (5c-3) is written nothing more, and every later roots block carries its
  // window up to its own gen.
  for (u32 m = 0; found && m < sb.nr_members; m++) {
    if (!HoldsBtree(sb, m) || member_gen[m] == 0 || member_gen[m] >= out->gen) continue;
    if (out->stale_since[m] == 0 || out->stale_since[m] > member_gen[m] + 1) out->stale_since[m] = member_gen[m] + 1;
    out->stale_until[m] = Max(out->stale_until[m], out->gen);
  }
  // Not read is not damaged: fsck must not rebuild trees it could not read.
  if (!found && !io.ok())
    return DiagError(diag, io, "btree roots: reading the roots block failed: %s", io.Message());
  if (!found)
    return DiagError(diag, Err::kCorrupt, "btree roots: no valid roots block on any member (%u copies rejected)",
                     bad);
  out->rejected = bad;
  if (bad > 0)
    platform::Log(platform::LogLevel::kWarn, "btree roots: %u roots block cop%s rejected; using gen %llu", bad,
                  bad == 1 ? "y" : "ies", (unsigned long long)out->gen);
  return Status::Ok();
}

namespace {

// The roots block's bytes for `roots` (a kRootsSlotSize buffer, zeroed).
void FillRootsBlock(RootsFormat* r, const sb::Superblock& sb, const Roots& roots) {
  r->magic.set(kRootsMagic);
  r->version.set(kRootsVersion);
  r->nroots.set(kNrBtreeIds);
  MemCopy(r->fs_uuid, sb.fs_uuid, 16);
  r->gen.set(roots.gen);
  r->journal_seq.set(roots.journal_seq);
  r->node_seq_hi.set(roots.node_seq_hi);
  for (u32 i = 0; i < dev::kMaxDevices; i++) {
    r->stale_since[i].set(roots.stale_since[i]);
    r->stale_until[i].set(roots.stale_until[i]);
    r->degraded_on[i].set(roots.degraded_on[i]);
  }
  r->degraded_nodes.set(roots.degraded_nodes);
  MemCopy(r->roots, roots.roots, sizeof(r->roots));
  r->csum.set(platform::Crc32cSkippingField(r, kRootsSlotSize, __builtin_offsetof(RootsFormat, csum)));
}

u64 RootsSlotOffset(u64 gen) { return kRootsOffset + (gen & 1) * kRootsSlotSize; }

// At format: writes the roots block to every member holding btree nodes,
// one after another; every one must take it. (A checkpoint's goes out in
// parallel and may go on without a member: TreeOps::WriteRoots.)
Status WriteRootsBlock(dev::DeviceSet& devs, const sb::Superblock& sb, const Roots& roots) {
  auto* r = static_cast<RootsFormat*>(platform::Alloc(kRootsSlotSize, 4096, true));
  if (r == nullptr) return Err::kNoMemory;
  FillRootsBlock(r, sb, roots);
  Status st;
  for (u32 m = 0; m < sb.nr_members && st.ok(); m++) {
    if (!HoldsBtree(sb, m) || ((devs.unavailable() >> m) & 1) != 0) continue;
    st = dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kWrite, RootsSlotOffset(roots.gen), r, kRootsSlotSize,
                          IoRequest::kFua, IoOrigin::kBtree);
  }
  platform::Free(r);
  return st;
}

}  // namespace

Status FormatRoots(dev::DeviceSet& devs, const sb::Superblock& sb) {
  Roots roots;
  roots.gen = 1;
  for (u32 t = 0; t < kNrBtreeIds; t++) roots.roots[t] = EmptyPtr(u8(t));
  // Both slots, so that no stale block from an earlier filesystem survives.
  TFS_TRY(WriteRootsBlock(devs, sb, roots));
  roots.gen = kFormatRootsGen;
  return WriteRootsBlock(devs, sb, roots);
}

// ---------------------------------------------------------------------------
// The slots a checkpoint will need, and the node slots in btree buckets.

// The node slots a checkpoint would take now (docs/design/space.md), per
// member of its copy set (each gets one copy of every node). Phase 1 takes
// one per dirty node it images; phase 2 a spare per node of the exclusive
// set -- cached interior nodes and nodes never written (phase 1 may have
// taken one for them already) -- plus 1 + 2 * kMaxLevel for structure that
// changes before it locks.
u64 TreeOps::CheckpointSlots(Impl* im) {
  return im->dirty_nodes.Load(MemOrder::kRelaxed) + im->interior_nodes.Load(MemOrder::kRelaxed) +
         im->unwritten_nodes.Load(MemOrder::kRelaxed) + 1 + 2 * kMaxLevel;
}
// Tells the allocator how many free buckets the next checkpoint may take on
// each member of the metadata target (alloc.h, SetMetadataNeed): any of
// them may be in its copy set, and then holds a copy of every node it
// writes. CheckpointSlots, or, if larger, what is left of the bound a
// running checkpoint started from (it clears dirty flags before it has
// taken its slots: the bound less the nodes it took slots for), less the
// member's slots at hand (holes, the open bucket's rest, the buckets it
// reserved, which the allocator also gets as `held`: they are back when
// it ends, and the growth room counts them), in whole buckets, plus two:
// the tree growing while the checkpoint runs (it then reserves more) and
// a spare. Called whenever a count changes; user data leaves that much
// free.
void TreeOps::PublishNeed(Impl* im) {
  if (im->alloc == nullptr || im->slots_per_bucket == 0) return;
  MutexLock l(im->need_mu);
  const u64 hold = im->ckpt_hold.Load(MemOrder::kRelaxed);
  const u64 taken = im->ckpt_taken.Load(MemOrder::kRelaxed);
  const u64 left = hold > taken ? hold - taken : 0;  // the running checkpoint's
  const u64 bound = Max<u64>(CheckpointSlots(im), left);
  for (u32 m : dev::Bits(im->target)) {
    const Impl::SlotPool& p = im->pool[m];
    const u64 avail = p.avail_slots.Load(MemOrder::kRelaxed);
    const u64 slots = bound > avail ? bound - avail : 0;
    const u64 need = (slots + im->slots_per_bucket - 1) / im->slots_per_bucket + 2;
    const u64 held = p.reserved_slots.Load(MemOrder::kRelaxed) / im->slots_per_bucket;
    im->alloc->SetMetadataNeed(m, need, held);
  }
}

// Member m's avail_slots from its holes, open bucket and reserved ones.
// slot_mu held.
void TreeOps::NoteAvailLocked(Impl* im, u32 m) {
  Impl::SlotPool& p = im->pool[m];
  const u64 open = p.open_valid ? im->slots_per_bucket - p.open_next : 0;
  const u64 reserved = u64(p.reserved.size()) * im->slots_per_bucket;
  p.avail_slots.Store(u64(p.holes.size()) + open + reserved, MemOrder::kRelaxed);
  p.reserved_slots.Store(reserved, MemOrder::kRelaxed);
}

bool TreeOps::IsOpenLocked(Impl* im, u32 m, u64 b) {
  return im->pool[m].open_valid && im->pool[m].open_bucket.bucket == b;
}

// Whether member m's hole h can still be taken: its bucket is still the
// btree's (the same incarnation) and has room, and is not freed (no live
// node and not being filled). slot_mu held.
bool TreeOps::HoleValidLocked(Impl* im, u32 m, const Impl::Hole& h) {
  const u64 b = im->sb.BucketOf(h.offset);
  if (b >= im->live[m].size()) return false;
  const u16 live = im->live[m][b];
  if (live >= im->slots_per_bucket || (live == 0 && !IsOpenLocked(im, m, b))) return false;
  const alloc::Bucket bk = im->alloc->Get(m, b);
  return bk.state == alloc::BucketState::kBtree && bk.gen == h.gen;
}

// Drops the holes that can no longer be taken -- those of freed buckets
// (after a checkpoint's frees, before anything is allocated again, so a
// freed bucket is recognised by live 0) -- so that avail_slots counts only
// what AllocSlot can take. One pass when a bucket was freed since the
// last; slot_mu held.
void TreeOps::PurgeHolesLocked(Impl* im) {
  if (!im->holes_stale) return;
  im->holes_stale = false;
  for (u32 m = 0; m < im->sb.nr_members; m++) {
    Vector<Impl::Hole>& holes = im->pool[m].holes;
    usize k = 0;
    for (usize i = 0; i < holes.size(); i++) {
      const Impl::Hole h = holes[i];
      if (HoleValidLocked(im, m, h)) holes[k++] = h;
    }
    while (holes.size() > k) holes.PopBack();
    NoteAvailLocked(im, m);
  }
}

// Takes a slot on member m without the allocator: a hole, else the open
// bucket's next, else a reserved bucket's first (it becomes the open
// one). False when none is left. slot_mu held.
bool TreeOps::TakeSlotLocked(Impl* im, u32 m, NodeCopy* dst) {
  Impl::SlotPool& p = im->pool[m];
  while (!p.holes.empty()) {
    const Impl::Hole h = p.holes.back();
    p.holes.PopBack();
    if (!HoleValidLocked(im, m, h)) continue;  // (not reached: purged after every free)
    *dst = NodeCopy{m, h.offset};
    im->live[m][im->sb.BucketOf(h.offset)]++;
    im->ctr.hole_slots.FetchAdd(1, MemOrder::kRelaxed);
    return true;
  }
  if (!p.open_valid || p.open_next >= im->slots_per_bucket) {
    if (p.reserved.empty()) return false;
    p.open_bucket = p.reserved.back();
    p.reserved.PopBack();
    p.open_valid = true;
    p.open_next = 0;
  }
  const u64 b = p.open_bucket.bucket;
  *dst = NodeCopy{m, im->sb.BucketOffset(b) + u64(p.open_next) * im->node_size};
  p.open_next++;
  im->live[m][b]++;
  return true;
}

// The member of the metadata target, not in `skip`, that a copy set takes
// first: one with nonzero durability (only those if `durable_only`), then
// the most slots at hand plus free buckets, then the lowest index.
// kNoMember if none is left.
u32 TreeOps::BestMember(Impl* im, dev::DevMask skip, bool durable_only) {
  u32 best = kNoMember;
  bool best_durable = false;
  u64 best_room = 0;
  for (u32 m : dev::Bits(im->target & ~skip & ~im->devs->unavailable() & ~im->copy_set_avoid)) {
    if (m >= im->sb.nr_members) continue;
    const bool durable = im->sb.members[m].durability > 0;
    if (durable_only && !durable) continue;
    const u64 room = im->pool[m].avail_slots.Load(MemOrder::kRelaxed) +
                     im->alloc->FreeCount(m) * im->slots_per_bucket;
    if (best == kNoMember || (durable && !best_durable) || (durable == best_durable && room > best_room)) {
      best = m;
      best_durable = durable;
      best_room = room;
    }
  }
  return best;
}

dev::DevMask TreeOps::CopySetMask(const Impl* im) {
  dev::DevMask mask = 0;
  for (u32 i = 0; i < im->copy_set_n; i++) mask |= dev::DevMask(1) << im->copy_set[i];
  return mask;
}

// The running checkpoint's copy set, chosen at its start (ckpt_mu held:
// only the checkpoint reads or changes it): the first member BestMember
// gives, then members with nonzero durability, until their durability
// reaches metadata_replicas (at most kMaxNodeCopies). Fewer when the
// target has fewer: each node is then degraded (AllocSlot counts it).
// Held members (a late I/O out: 6c-3) only when no other is left, or no
// other with nonzero durability where one of them has it.
void TreeOps::ChooseCopySet(Impl* im) {
  im->copy_set_n = 0;
  im->copy_set_refused = 0;
  im->copy_set_avoid = 0;
  const bool durable_any = BestMember(im, 0, true) != kNoMember;
  im->copy_set_avoid = im->held_members;
  if (BestMember(im, 0, false) == kNoMember || (durable_any && BestMember(im, 0, true) == kNoMember))
    im->copy_set_avoid = 0;
  u32 durability = 0;
  u32 m = BestMember(im, 0, false);
  while (m != kNoMember && im->copy_set_n < kMaxNodeCopies) {
    im->copy_set[im->copy_set_n++] = u8(m);
    durability += im->sb.members[m].durability;
    if (durability >= im->wanted_durability) break;
    m = BestMember(im, CopySetMask(im), true);
  }
}

// Member i leaves the copy set (ckpt_mu held): the allocator had no bucket
// for it. The nodes imaged after have one copy fewer.
void TreeOps::LeaveCopySetLocked(Impl* im, u32 i) {
  for (u32 k = i; k + 1 < im->copy_set_n; k++) im->copy_set[k] = im->copy_set[k + 1];
  im->copy_set_n--;
  im->ctr.copy_set_leaves.FetchAdd(1, MemOrder::kRelaxed);
}

// Node slots for a checkpoint's image, one on each member of the copy set
// in its order: dst's copies. With may_allocate, a member with none at
// hand gets a new bucket (ReserveBucket; it may leave the set instead,
// and the node has a copy fewer); without (the exclusive phase, which
// holds a tree lock and must not wait for the allocator) the caller has
// checked AvailSlots. A node whose copies' durability falls short of
// metadata_replicas is counted degraded.
Status TreeOps::AllocSlot(Impl* im, NodePtrFormat* dst, bool may_allocate) {
  ClearPtrCopies(dst);
  Status st;
  for (u32 i = 0; i < im->copy_set_n && st.ok();) {
    const u32 m = im->copy_set[i];
    NodeCopy c;
    bool taken;
    {
      MutexLock l(im->slot_mu);
      taken = TakeSlotLocked(im, m, &c);
      NoteAvailLocked(im, m);
    }
    if (taken) {
      AddPtrCopy(dst, c.member, c.offset);
      i++;
    } else if (may_allocate) {
      st = ReserveBucket(im, i);  // (copy_set[i] may now name another member, or the next)
    } else {
      st = Err::kNoSpace;  // (not reached: see above)
    }
  }
  if (st.ok() && PtrCopies(*dst) == 0) st = Err::kNoSpace;  // (not reached: the last member spills)
  if (!st.ok()) {
    // The copies taken go back as holes (the checkpoint fails).
    for (u32 k = 0; k < PtrCopies(*dst); k++) FreeCopySlot(im, PtrCopy(*dst, k), nullptr);
    ClearPtrCopies(dst);
    return st;
  }
  if (PtrDegraded(*dst, im->sb)) im->ctr.degraded_nodes.FetchAdd(1, MemOrder::kRelaxed);
  im->ckpt_taken.FetchAdd(1, MemOrder::kRelaxed);
  PublishNeed(im);
  return Status::Ok();
}

// A checkpoint's new pointers are added, the ones it stops reaching
// (replaced, freed) dropped: the roots block it writes then counts what it
// reaches (ckpt_mu held). A drop the count does not hold (a count from
// before the counts existed, or damaged) stays at 0 and is counted; fsck
// recounts.
void TreeOps::CountDegraded(Impl* im, Roots* roots, const NodePtrFormat& p, bool add) {
  if (!PtrDegraded(p, im->sb)) return;
  bool short_count = false;
  auto step = [&](auto* v) {
    using T = decltype(+*v);
    if (add) {
      if (*v != T(~T(0))) (*v)++;  // (saturates: a count at its top stays there -- too high is safe)
    } else if (*v > 0) {
      (*v)--;
    } else {
      short_count = true;
    }
  };
  step(&roots->degraded_nodes);
  for (u32 k = 0; k < PtrCopies(p); k++) {
    const u32 m = PtrCopy(p, k).member;
    if (m < dev::kMaxDevices) step(&roots->degraded_on[m]);
  }
  if (short_count) im->ctr.degraded_count_short.FetchAdd(1, MemOrder::kRelaxed);
}

// One more empty bucket among the reserved of the copy set's member i.
// Allocate runs without slot_mu (it may settle the journal, and commits
// the bucket's record). A member the allocator has no bucket on is
// replaced by the best member of the target not in the set and not
// refused yet in this checkpoint (copy_set_swaps: the caller takes its
// slots), else leaves the set (copy_set_leaves) -- but the last one left,
// which takes a bucket on any capable member (a full target's nodes
// spill rather than fail the checkpoint; copy_set[i] then names the
// member that gave it, and, outside the target, asks the target first
// for every bucket after).
Status TreeOps::ReserveBucket(Impl* im, u32 i) {
  const u32 m = im->copy_set[i];
  const bool in_target = (im->target & (dev::DevMask(1) << m)) != 0;
  auto r = in_target
               ? im->alloc->Allocate(dev::DevMask(1) << m, 0, alloc::BucketState::kBtree, alloc::Watermark::kBtree)
               : im->alloc->Allocate(im->target, im->capable, alloc::BucketState::kBtree, alloc::Watermark::kBtree);
  if (!r.ok() && r.status().code() == Err::kNoSpace && in_target) {
    im->copy_set_refused |= dev::DevMask(1) << m;
    const bool alone = im->copy_set_n == 1;
    const u32 other = BestMember(im, CopySetMask(im) | im->copy_set_refused, !alone);
    if (other != kNoMember) {
      im->copy_set[i] = u8(other);
      im->ctr.copy_set_swaps.FetchAdd(1, MemOrder::kRelaxed);
      return Status::Ok();
    }
    if (!alone) {
      LeaveCopySetLocked(im, i);
      return Status::Ok();
    }
    r = im->alloc->Allocate(im->target, im->capable, alloc::BucketState::kBtree, alloc::Watermark::kBtree);
  }
  if (!r.ok()) return r.status();
  const u32 got = r.value().dev;
  Status st;
  {
    MutexLock l(im->slot_mu);
    st = im->pool[got].reserved.PushBack(r.value());
    if (st.ok()) {
      im->ctr.reserved_buckets.FetchAdd(1, MemOrder::kRelaxed);
      NoteAvailLocked(im, got);
    }
  }
  if (!st.ok()) {
    im->alloc->FreeBuckets(&r.value(), 1).IgnoreError();  // (a reclaim commit: Free never is)
    return st;
  }
  im->copy_set[i] = u8(got);  // (the same member, but after a spill: the set has one)
  return Status::Ok();
}

// The slots AllocSlot can take for whole pointers without the allocator,
// exactly: the fewest at hand on a member of the copy set.
u64 TreeOps::AvailSlots(Impl* im) {
  MutexLock l(im->slot_mu);
  PurgeHolesLocked(im);
  u64 least = 0;
  for (u32 i = 0; i < im->copy_set_n; i++) {
    const u64 a = im->pool[im->copy_set[i]].avail_slots.Load(MemOrder::kRelaxed);
    if (i == 0 || a < least) least = a;
  }
  return least;
}

// Takes empty buckets ahead until `slots` node slots can be taken on every
// member of the copy set without the allocator (one that has none leaves
// it). Only the checkpoint (ckpt_mu) takes slots, so what it counted
// stays.
Status TreeOps::ReserveSlots(Impl* im, u64 slots) {
  for (u32 i = 0; i < im->copy_set_n;) {
    u64 avail;
    {
      MutexLock l(im->slot_mu);
      PurgeHolesLocked(im);
      avail = im->pool[im->copy_set[i]].avail_slots.Load(MemOrder::kRelaxed);
    }
    if (avail >= slots) {
      i++;
    } else {
      TFS_TRY(ReserveBucket(im, i));  // (copy_set[i] may now name another member, or the next)
    }
  }
  PublishNeed(im);
  return Status::Ok();
}

// The checkpoint's end (every path): the reserved buckets it did not use
// go back to the allocator, empty (pending until the journal settles, as
// every free) -- in one record commit, after slot_mu. Not `free_them` (an
// unmount's final checkpoint): they keep their btree records, hold no node,
// and the next mount frees them.
void TreeOps::ReturnReserved(Impl* im, bool free_them) {
  Vector<alloc::BucketRef> frees;
  {
    MutexLock l(im->slot_mu);
    for (u32 m = 0; m < im->sb.nr_members; m++) {
      Impl::SlotPool& p = im->pool[m];
      if (free_them) {
        for (const alloc::BucketRef& b : p.reserved) {
          if (!frees.PushBack(b).ok()) break;  // (without memory: the next mount frees them)
          im->ctr.returned_buckets.FetchAdd(1, MemOrder::kRelaxed);
        }
      }
      p.reserved.Clear();
      NoteAvailLocked(im, m);
    }
  }
  FreeBuckets(im, frees);
  PublishNeed(im);
}

// Member m's open bucket is no longer being filled; onto `frees` if it
// holds no live node. slot_mu held; the caller purges the holes.
void TreeOps::CloseOpenLocked(Impl* im, u32 m, Vector<alloc::BucketRef>* frees) {
  Impl::SlotPool& p = im->pool[m];
  if (!p.open_valid) return;
  p.open_valid = false;
  const u64 b = p.open_bucket.bucket;
  if (im->live[m][b] == 0) {
    if (!HeldLocked(im, m, b)) FreeEmptyLocked(im, m, b, frees);  // (held: when its late writes end)
    im->holes_stale = true;
  }
  NoteAvailLocked(im, m);  // (the open bucket's rest is gone)
}

// Frees emptied node buckets with one record commit (no tree, leaf or slot
// lock held). A failure leaves them allocated: the next mount frees them.
void TreeOps::FreeBuckets(Impl* im, const Vector<alloc::BucketRef>& frees) {
  if (frees.empty()) return;
  Status st = im->alloc->FreeBuckets(frees.data(), u32(frees.size()));
  if (!st.ok()) platform::Log(platform::LogLevel::kWarn, "btree: freeing %llu emptied node buckets: %s",
                              (unsigned long long)frees.size(), st.Message());
}

// At mount: the holes of the btree buckets the trees use in part, from the
// offsets of their nodes' copies (each member's list sorted here). Only
// an optimisation: without memory a member just has no holes.
void TreeOps::FindHoles(Impl* im, Vector<u64>* used) {
  MutexLock l(im->slot_mu);
  for (u32 m = 0; m < im->sb.nr_members; m++) {
    if ((im->target & (dev::DevMask(1) << m)) == 0) continue;  // (as FreeSlot)
    Vector<u64>& u = used[m];
    Vector<Impl::Hole>& holes = im->pool[m].holes;
    Sort(u.data(), u.size(), [](u64 a, u64 b) { return a < b; });
    bool ok = true;
    for (usize i = 0; i < u.size() && ok;) {
      const u64 b = im->sb.BucketOf(u[i]);
      usize j = i;
      bool shared = false;
      while (j < u.size() && im->sb.BucketOf(u[j]) == b) {
        if (j > i && u[j] == u[j - 1]) {  // (one of them fails its read check)
          platform::Log(platform::LogLevel::kWarn, "btree: two node pointers share the slot at %llu of member %u",
                        (unsigned long long)u[j], m);
          // Its live count is off: no holes in it now (a later free of
          // one of the two may still make one, of a slot whose other
          // pointer already fails its read check).
          shared = true;
        }
        j++;
      }
      const alloc::Bucket bk = im->alloc->Get(m, b);
      if (!shared && bk.state == alloc::BucketState::kBtree && im->live[m][b] < im->slots_per_bucket) {
        usize k = i;
        for (u32 slot = 0; slot < im->slots_per_bucket && ok; slot++) {
          const u64 off = im->sb.BucketOffset(b) + u64(slot) * im->node_size;
          while (k < j && u[k] < off) k++;
          if (k < j && u[k] == off) continue;
          ok = holes.PushBack(Impl::Hole{bk.gen, off}).ok();
        }
      }
      i = j;
    }
    if (!ok) holes.Clear();
    NoteAvailLocked(im, m);  // (every hole found is valid: no purge)
  }
}

// Releases a node slot after the roots block that stopped pointing at it
// is durable. Its bucket goes on `frees` (the caller frees them after
// slot_mu, FreeBuckets) once it holds no node and is not being filled
// (without `frees`: stays allocated, for the next mount to free);
// otherwise the slot becomes a hole of its member. The caller purges the
// holes of freed buckets after its frees (PurgeHoles).
void TreeOps::FreeSlot(Impl* im, const NodePtrFormat& p, Vector<alloc::BucketRef>* frees) {
  for (u32 i = 0; i < PtrCopies(p); i++) FreeCopySlot(im, PtrCopy(p, i), frees);
}
void TreeOps::FreeCopySlot(Impl* im, const NodeCopy& c, Vector<alloc::BucketRef>* frees) {
  MutexLock l(im->slot_mu);
  const u32 m = c.member;
  const u64 b = im->sb.BucketOf(c.offset);
  if (m >= im->sb.nr_members || b >= im->live[m].size() || im->live[m][b] == 0) return;
  Impl::SlotPool& p = im->pool[m];
  const alloc::Bucket bk = im->alloc->Get(m, b);
  // (Without memory for the hole the slot stays unused until the bucket goes.)
  // Holes only on the metadata target: nodes that spilled elsewhere drain
  // back as they are rewritten, and a bucket they spilled to goes with its
  // last node, even open (its free slots are no holes).
  const bool in_target = (im->target & (dev::DevMask(1) << m)) != 0;
  // A slot a copy failed to write to is no hole: it stays unused.
  bool bad = false;
  for (usize i = 0; i < p.bad.size() && !bad; i++) {
    if (p.bad[i] != c.offset) continue;
    p.bad[i] = p.bad.back();
    p.bad.PopBack();
    bad = true;
  }
  if (!DropLiveLocked(im, m, b, frees) && bk.state == alloc::BucketState::kBtree && in_target && !bad)
    p.holes.PushBack(Impl::Hole{bk.gen, c.offset}).IgnoreError();
  NoteAvailLocked(im, m);
}
// One live slot of member m's bucket b fewer. True when that emptied the
// bucket: no longer open, it goes on `frees` (without: stays allocated,
// for the next mount to free) -- or, while a late node write holds it
// (6c-3), when the last of those ends (ReleaseHoldLocked); false while it
// holds a node or is being filled. slot_mu held; the caller purges the
// holes.
bool TreeOps::DropLiveLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees) {
  Impl::SlotPool& p = im->pool[m];
  const bool open = IsOpenLocked(im, m, b);
  const bool in_target = (im->target & (dev::DevMask(1) << m)) != 0;
  if (--im->live[m][b] != 0 || (open && in_target && p.open_next < im->slots_per_bucket)) return false;
  if (open) p.open_valid = false;
  im->holes_stale = true;
  NoteAvailLocked(im, m);
  if (!HeldLocked(im, m, b)) FreeEmptyLocked(im, m, b, frees);
  return true;
}
// Member m's bucket b, empty and not open, goes on `frees` if it is still
// the btree's. slot_mu held.
void TreeOps::FreeEmptyLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees) {
  const alloc::Bucket bk = im->alloc->Get(m, b);
  if (bk.state == alloc::BucketState::kBtree && frees != nullptr)
    frees->PushBack(alloc::BucketRef{m, b, bk.gen}).IgnoreError();  // (without memory: the next mount frees it)
}
// Whether a late node write (6c-3) holds member m's bucket b: it may
// still land there, so the bucket is not freed. slot_mu held.
bool TreeOps::HeldLocked(Impl* im, u32 m, u64 b) {
  const Vector<u64>& held = im->pool[m].held;
  for (usize i = 0; i < held.size(); i++)
    if (held[i] == b) return true;
  return false;
}
// A late node write on member m's bucket b ended: its hold goes, and the
// bucket with it if nothing else holds it and it emptied meanwhile (no
// live node, not open). slot_mu held; the caller purges the holes.
void TreeOps::ReleaseHoldLocked(Impl* im, u32 m, u64 b, Vector<alloc::BucketRef>* frees) {
  Vector<u64>& held = im->pool[m].held;
  for (usize i = 0; i < held.size(); i++) {
    if (held[i] != b) continue;
    held[i] = held.back();
    held.PopBack();
    break;
  }
  if (HeldLocked(im, m, b) || b >= im->live[m].size() || im->live[m][b] != 0 || IsOpenLocked(im, m, b)) return;
  im->holes_stale = true;
  FreeEmptyLocked(im, m, b, frees);
}
void TreeOps::PurgeHoles(Impl* im) {
  MutexLock l(im->slot_mu);
  PurgeHolesLocked(im);
}

// At unmount: the buckets slots were being taken from are no longer
// "being filled"; each freed if it holds no live node (a checkpoint's
// unused reserve), so that a clean filesystem has no btree bucket without
// nodes but those the unmount's final checkpoint leaves
// (docs/format/alloc.md).
void TreeOps::ReleaseOpenBucket(Impl* im) {
  Vector<alloc::BucketRef> frees;
  {
    MutexLock l(im->slot_mu);
    for (u32 m = 0; m < im->sb.nr_members; m++) CloseOpenLocked(im, m, &frees);
    PurgeHolesLocked(im);
  }
  FreeBuckets(im, frees);
}

struct TreeOps::Job {
  CachedNode* node;
  Tree* tree;
  u8* img;
  u32 bytes;
  u64 seq;
  NodePtrFormat dst;
  bool installed;
  bool rewrite;  // a copy failed to write: dirtied after the roots block
};

// ---------------------------------------------------------------------------
// Phase 3's I/Os (docs/design/copies.md, "Step 6c-3"): a checkpoint's node
// writes, flushes and roots writes, all in one batch, submitted never
// inline and waited for with deadlines, so that one on a stalling member
// can be given up past its late bound. What a given-up I/O reads (the
// images, the roots block) stays with its batch until it completes.

enum : u8 { kPhaseWrite = 0, kPhaseFlush = 1, kPhaseRoots = 2 };

struct PhaseIo {
  dev::Io io;
  void* im = nullptr;     // the Btrees::Impl (PhaseDone's wake)
  Atomic<i32> err{0};
  Atomic<u32> busy{0};    // submitted and not completed (the completion's)
  u32 member = 0;
  u32 job = 0;            // a write's job (its copies are adjacent in the batch)
  u8 kind = kPhaseWrite;
  u8 seen = 0;            // its completion taken into account (the checkpoint's)
  u8 late = 0;            // given up while out (the checkpoint's; ReapLate's)
  u8 noted = 0;           // a late one's end noted (ReapLate)
  u8 holds = 0;           // a late write holds its bucket (SlotPool::held) until it ends
  u8 owns_buf = 0;        // frees io.req.buf with the batch (a job's first copy: its image)
};

struct PhaseBatch {
  PhaseIo* ios = nullptr;  // n of cap constructed
  u32 n = 0;
  u32 cap = 0;
  u8* roots_buf = nullptr;
  PhaseBatch* next = nullptr;  // on Impl::late_batches
};

// Completion context: stores the result and wakes; phase_out's decrement
// is the last touch (Close waits for it), after which the batch may be
// freed.
void TreeOps::PhaseDone(dev::Io* io, Status st) {
  auto* p = static_cast<PhaseIo*>(io->caller_data);
  auto* im = static_cast<Impl*>(p->im);
  p->err.Store(i32(st.code()), MemOrder::kRelaxed);
  p->busy.Store(0, MemOrder::kRelease);
  im->phase_events.FetchAdd(1, MemOrder::kAcqRel);
  tfs_plat_wake(im->phase_events.Address(), 0);
  im->phase_out.FetchSub(1, MemOrder::kAcqRel);
}

PhaseBatch* TreeOps::NewBatch(Impl*, u32 cap) {
  auto* b = static_cast<PhaseBatch*>(platform::Alloc(sizeof(PhaseBatch), alignof(PhaseBatch), false));
  if (b == nullptr) return nullptr;
  new (b) PhaseBatch();
  b->ios = static_cast<PhaseIo*>(platform::Alloc(sizeof(PhaseIo) * (cap > 0 ? cap : 1), alignof(PhaseIo), false));
  if (b->ios == nullptr) {
    b->~PhaseBatch();
    platform::Free(b);
    return nullptr;
  }
  b->cap = cap;
  return b;
}

PhaseIo* TreeOps::AddIo(Impl* im, PhaseBatch* b, u8 kind, u32 member, IoOp op, u64 offset, void* buf, u32 bytes,
                        u8 flags) {
  TFS_BUG_ON(b->n >= b->cap);
  PhaseIo* p = new (&b->ios[b->n++]) PhaseIo();
  p->im = im;
  p->kind = kind;
  p->member = member;
  dev::Io& io = p->io;
  io.req.op = op;
  io.req.origin = IoOrigin::kBtree;
  io.req.flags = flags;
  io.req.offset = offset;
  io.req.length = bytes;
  io.req.buf = buf;
  io.cls = dev::IoClass::kBtree;
  io.done = PhaseDone;
  io.caller_data = p;
  return p;
}

// Never inline: a stalling member would hold the checkpoint inside Submit.
void TreeOps::SubmitPhaseIo(Impl* im, PhaseIo* p) {
  p->busy.Store(1, MemOrder::kRelease);
  im->phase_out.FetchAdd(1, MemOrder::kAcqRel);
  im->devs->member(p->member)->queue().Submit(&p->io);
}

// Every I/O of b has completed.
void TreeOps::FreeBatch(Impl*, PhaseBatch* b) {
  for (u32 i = 0; i < b->n; i++) {
    if (b->ios[i].owns_buf) platform::Free(b->ios[i].io.req.buf);
    b->ios[i].~PhaseIo();
  }
  platform::Free(b->ios);
  platform::Free(b->roots_buf);
  b->~PhaseBatch();
  platform::Free(b);
}

// The late I/Os that ended: a late write's bucket hold dropped (its bucket
// freed if that emptied it), an error marking its member failed (5c-3); a
// batch whose I/Os all ended freed. held_members and the gauges from those
// still out. ckpt_mu held, reclaim commits allowed (the frees).
void TreeOps::ReapLate(Impl* im) {
  Vector<alloc::BucketRef> frees;
  dev::DevMask held = 0;
  u64 out = 0;
  PhaseBatch** link = &im->late_batches;
  while (*link != nullptr) {
    PhaseBatch* b = *link;
    bool busy = false;
    for (u32 i = 0; i < b->n; i++) {
      PhaseIo& p = b->ios[i];
      if (p.busy.Load(MemOrder::kAcquire) != 0) {
        busy = true;
        if (p.late) {
          held |= dev::DevMask(1) << p.member;
          out++;
        }
        continue;
      }
      if (!p.late || p.noted) continue;
      p.noted = 1;
      if (p.holds) {
        MutexLock l(im->slot_mu);
        ReleaseHoldLocked(im, p.member, im->sb.BucketOf(p.io.req.offset), &frees);
      }
      const Status st = Status(Err(p.err.Load(MemOrder::kRelaxed)));
      char more[64];
      if (!st.ok() && !im->devs->MarkFailed(p.member, st) && ((im->devs->failed() >> p.member) & 1) == 0 &&
          im->late_log.Admit(10 * platform::kNsPerSec, more, sizeof(more)))
        platform::Log(platform::LogLevel::kWarn,
                      "btree: a late %s on member %u failed (%s) and did not mark it failed (the last member for its "
                      "role, or not a device error); what it wrote was given up already%s",
                      p.kind == kPhaseFlush ? "flush" : p.kind == kPhaseRoots ? "roots block write" : "node write",
                      p.member, st.Message(), more);
    }
    if (busy) {
      link = &b->next;
    } else {
      *link = b->next;
      FreeBatch(im, b);
    }
  }
  FreeBuckets(im, frees);
  if (!frees.empty()) PurgeHoles(im);
  im->held_members = held;
  im->ctr.late_node_ios.Store(out, MemOrder::kRelaxed);
  im->ctr.held_members.Store(PopCount(held), MemOrder::kRelaxed);
}

// Until every late I/O has ended (an unmount's checkpoints: Close).
void TreeOps::WaitLate(Impl* im) {
  for (;;) {
    const u32 ev = im->phase_events.Load(MemOrder::kAcquire);  // (before looking: an end meanwhile wakes)
    ReapLate(im);
    if (im->late_batches == nullptr) return;
    tfs_plat_wait(im->phase_events.Address(), ev, 100 * platform::kNsPerMs);
  }
}

// Whether member m's copies may be given up now: every node with a copy
// there has another copy, on a member not given up and not unavailable
// (failed: it gets no roots block) -- and of nonzero durability if m's is
// -- written and flushed.
// The writes are b's first nwrites I/Os, each job's copies adjacent.
bool TreeOps::CanGiveUp(Impl* im, const PhaseBatch* b, u32 nwrites, u32 m, dev::DevMask gave_up,
                        dev::DevMask flushed_ok) {
  const u32 durable_m = im->sb.members[m].durability;
  for (u32 i = 0; i < nwrites;) {
    const u32 job = b->ios[i].job;
    bool there = false, safe = false;
    for (; i < nwrites && b->ios[i].job == job; i++) {
      const PhaseIo& p = b->ios[i];
      const dev::DevMask bit = dev::DevMask(1) << p.member;
      if (p.member == m) {
        there = true;
      } else if ((gave_up & bit) == 0 && (flushed_ok & bit) != 0 && (im->devs->unavailable() & bit) == 0 &&
                 (durable_m == 0 || im->sb.members[p.member].durability > 0) && p.seen &&
                 p.err.Load(MemOrder::kRelaxed) == 0) {
        safe = true;
      }
    }
    if (there && !safe) return false;
  }
  return true;
}

// One write per copy of each image, all in flight at once, then a flush of
// each member once its writes have ended. A copy counts once its write and
// its member's flush succeeded; a node with at least one keeps its failed
// copies' names (a read of one fails its checks and falls back) and is
// rewritten by the next checkpoint (Job::rewrite); a node with none fails
// the checkpoint. With may_give_up, a member that is stalling (dev::
// Stalling) with a write or its flush out past its late bound is given up
// (*gave_up) once every node with a copy there has one written and flushed
// elsewhere: its copies count as failed but mark nothing, their slots are
// never holes (Impl::SlotPool::bad), and a write still out holds its
// bucket. The images become the batch's.
Status TreeOps::WriteNodeCopies(Impl* im, Vector<Job>& jobs, PhaseBatch* b, bool may_give_up,
                                dev::DevMask* gave_up_out) {
  dev::DevMask written = 0;
  u32 left[dev::kMaxDevices] = {};  // writes not ended, per member
  for (usize ji = 0; ji < jobs.size(); ji++) {
    Job& j = jobs[ji];
    const u32 n = PtrCopies(j.dst);
    for (u32 c = 0; c < n; c++) {
      const NodeCopy at = PtrCopy(j.dst, c);
      PhaseIo* p = AddIo(im, b, kPhaseWrite, at.member, IoOp::kWrite, at.offset, j.img, j.bytes, 0);
      p->job = u32(ji);
      p->owns_buf = c == 0;
      written |= dev::DevMask(1) << at.member;
      left[at.member]++;
      im->ctr.node_writes.FetchAdd(1, MemOrder::kRelaxed);
      im->ctr.node_write_bytes.FetchAdd(j.bytes, MemOrder::kRelaxed);
    }
    if (n > 0) j.img = nullptr;  // (the batch's: FreeBatch)
  }
  const u32 nwrites = b->n;
  dev::LateWatch<dev::kMaxDevices> watch;  // per member: its writes, then its flush
  const u64 start = platform::NowNs();
  for (u32 m : dev::Bits(written)) watch.Start(m, im->devs->member(m)->queue(), start);
  // (A member marked failed after the copy set was chosen still gets this
  // checkpoint's copies and flush: a node whose only copy is there would
  // otherwise fail the checkpoint -- review helper-72. Its later
  // checkpoints leave it out.)
  for (u32 i = 0; i < nwrites; i++) SubmitPhaseIo(im, &b->ios[i]);
  PhaseIo* flush[dev::kMaxDevices] = {};
  Status flush_error[dev::kMaxDevices];
  dev::DevMask flushed_ok = 0, flush_failed = 0, gave_up = 0, ended = 0, blocked = 0;
  u32 first_open = 0;  // writes before it are all seen or late
  for (;;) {
    const u32 ev = im->phase_events.Load(MemOrder::kAcquire);  // (before looking)
    bool all_before = true;
    for (u32 i = first_open; i < nwrites; i++) {
      PhaseIo& p = b->ios[i];
      if (!p.seen && !p.late && p.busy.Load(MemOrder::kAcquire) == 0) {
        p.seen = 1;
        left[p.member]--;
      }
      if (!p.seen && !p.late) all_before = false;
      if (all_before) first_open = i + 1;
    }
    for (u32 m : dev::Bits(written & ~gave_up & ~ended)) {
      if (flush[m] == nullptr) {
        if (left[m] != 0) continue;
        flush[m] = AddIo(im, b, kPhaseFlush, m, IoOp::kFlush, 0, nullptr, 0, 0);
        watch.Restart(m, platform::NowNs());  // (the flush's bound from its submission)
        SubmitPhaseIo(im, flush[m]);
        continue;
      }
      if (flush[m]->busy.Load(MemOrder::kAcquire) != 0) continue;
      flush[m]->seen = 1;
      ended |= dev::DevMask(1) << m;
      const Status fst = Status(Err(flush[m]->err.Load(MemOrder::kRelaxed)));
      if (fst.ok()) {
        flushed_ok |= dev::DevMask(1) << m;
      } else {
        flush_failed |= dev::DevMask(1) << m;
        flush_error[m] = fst;
      }
    }
    const dev::DevMask pending = written & ~gave_up & ~ended;
    if (pending == 0) break;
    const u64 deadline = may_give_up ? watch.Deadline(pending & ~blocked) : platform::kForever;
    const u64 now = platform::NowNs();
    if (now < deadline) {
      tfs_plat_wait(im->phase_events.Address(), ev,
                    deadline == platform::kForever ? platform::kForever : deadline - now);
      blocked = 0;  // (what a member waited for may have ended: looked at again)
      continue;
    }
    for (u32 m : dev::Bits(watch.Late(pending & ~blocked, now))) {
      // A node whose other copies are not durable yet waits for them.
      if (!CanGiveUp(im, b, nwrites, m, gave_up, flushed_ok)) {
        blocked |= dev::DevMask(1) << m;
        continue;
      }
      // Each write still out holds its bucket until it ends (ReapLate):
      // else the rewrite frees the slot, the bucket goes to data, and the
      // late write lands on it. (Without memory for the holds: waited for.)
      u32 out = 0, there = 0;
      for (u32 i = 0; i < nwrites; i++) {
        out += b->ios[i].member == m && !b->ios[i].seen ? 1 : 0;
        there += b->ios[i].member == m ? 1 : 0;
      }
      {
        MutexLock l(im->slot_mu);
        Vector<u64>& held = im->pool[m].held;
        Vector<u64>& bad = im->pool[m].bad;  // (every copy there: never a hole, below)
        if (!held.Reserve(held.size() + out).ok() || !bad.Reserve(bad.size() + there).ok()) {
          blocked |= dev::DevMask(1) << m;
          continue;
        }
        for (u32 i = 0; i < nwrites; i++) {
          PhaseIo& p = b->ios[i];
          if (p.member != m || p.seen) continue;
          p.late = 1;
          p.holds = 1;
          held.PushBack(im->sb.BucketOf(p.io.req.offset)).IgnoreError();  // (reserved above)
        }
      }
      gave_up |= dev::DevMask(1) << m;
      if (flush[m] != nullptr && !flush[m]->seen) {
        flush[m]->late = 1;
        im->ctr.node_flushes_late.FetchAdd(1, MemOrder::kRelaxed);
      }
    }
  }
  *gave_up_out = gave_up;
  Status st;
  u32 copy_errors = 0, late_copies = 0;
  NodeCopy first_bad{};
  Status first_bad_st;
  u32 first_late_member = 0;
  for (u32 k = 0; k < nwrites;) {
    Job& j = jobs[b->ios[k].job];
    u32 good = 0;
    bool on_failed = false;  // a good copy on a member marked failed by now
    Status job_error;
    for (u32 c = 0; c < PtrCopies(j.dst); c++, k++) {
      const NodeCopy at = PtrCopy(j.dst, c);
      const dev::DevMask bit = dev::DevMask(1) << at.member;
      const PhaseIo& p = b->ios[k];
      if ((gave_up & bit) != 0 && (p.late || p.err.Load(MemOrder::kRelaxed) == 0)) {
        // Given up (not a failure of the member: nothing marked). One that
        // had ended with an error is counted as every failed write, below.
        if (late_copies++ == 0) first_late_member = at.member;
        j.rewrite = true;
        MutexLock l(im->slot_mu);  // (never a hole: FreeCopySlot)
        im->pool[at.member].bad.PushBack(at.offset).IgnoreError();  // (reserved at the give-up)
        continue;
      }
      Status cst = Status(Err(p.err.Load(MemOrder::kRelaxed)));
      if (cst.ok() && (flush_failed & bit) != 0) cst = flush_error[at.member];
      if (cst.ok()) {
        good++;
        if (((im->devs->failed() >> at.member) & 1) != 0) on_failed = true;
        continue;
      }
      if (job_error.ok()) job_error = cst;
      im->devs->MarkFailed(at.member, cst);  // (its write or its flush; the rewrite skips it: 5c-3)
      if (copy_errors++ == 0) {
        first_bad = at;
        first_bad_st = cst;
      }
      {
        MutexLock l(im->slot_mu);  // (never a hole again: FreeCopySlot)
        im->pool[at.member].bad.PushBack(at.offset).IgnoreError();  // (without memory: it may be)
      }
    }
    if (good == 0 && st.ok()) st = job_error;  // (no copy of this node is durable)
    // (A copy on a member marked meanwhile is durable but out of every
    // roots block from now on: the node is rewritten on the members left
    // too -- review helper-73.)
    if (good < PtrCopies(j.dst) || on_failed) j.rewrite = true;
  }
  if (st.ok() && copy_errors > 0) {
    im->ctr.node_copy_write_errors.FetchAdd(copy_errors, MemOrder::kRelaxed);
    platform::Log(platform::LogLevel::kError,
                  "btree: %u node cop%s failed to write (the first on member %u at %llu: %s); those nodes keep their "
                  "other copies, and the next checkpoint rewrites them",
                  copy_errors, copy_errors == 1 ? "y" : "ies", first_bad.member,
                  (unsigned long long)first_bad.offset, first_bad_st.Message());
  }
  if (late_copies > 0) {
    im->ctr.node_copies_late.FetchAdd(late_copies, MemOrder::kRelaxed);
    char more[64];
    if (im->late_log.Admit(10 * platform::kNsPerSec, more, sizeof(more)))
      platform::Log(platform::LogLevel::kWarn,
                    "btree: member %u is stalling: %u node cop%s given up past its late bound (the nodes keep their "
                    "other copies; the next checkpoint rewrites them, without it while its writes are out)%s",
                    first_late_member, late_copies, late_copies == 1 ? "y" : "ies", more);
  }
  return st;
}

// The members of `mask` with nonzero durability.
dev::DevMask TreeOps::DurableMask(const Impl* im, dev::DevMask mask) {
  dev::DevMask out = 0;
  for (u32 m : dev::Bits(mask))
    if (m < im->sb.nr_members && im->sb.members[m].durability > 0) out |= dev::DevMask(1) << m;
  return out;
}

// Whether member m has an I/O out in b or in a late batch.
bool TreeOps::MemberBusy(Impl* im, const PhaseBatch* b, u32 m) {
  for (u32 i = 0; i < b->n; i++)
    if (b->ios[i].member == m && b->ios[i].busy.Load(MemOrder::kAcquire) != 0) return true;
  for (const PhaseBatch* l = im->late_batches; l != nullptr; l = l->next)
    for (u32 i = 0; i < l->n; i++)
      if (l->ios[i].member == m && l->ios[i].busy.Load(MemOrder::kAcquire) != 0) return true;
  return false;
}

// Member m, given up in this checkpoint or held, is needed after all (no
// other member took the roots block) and has no I/O out any more (an older
// roots write to it among them: the same slot): if every node write and
// flush of it in b succeeded, flushes it and writes the roots block there,
// each waited for (no deadline). Its copies of this gen then durable, the
// stale mark they gave it (`unmark`) goes from the block it takes. True if
// it took the block (*roots is then that block's); an error marks it
// failed. (No roots write of b is out: one is given up only once another
// member took the block, so the buffer may be filled again.)
bool TreeOps::TakeBack(Impl* im, PhaseBatch* b, u32 m, Roots* roots, dev::DevMask unmark) {
  for (u32 i = 0; i < b->n; i++) {
    const PhaseIo& p = b->ios[i];
    if (p.member == m && p.kind != kPhaseRoots && p.err.Load(MemOrder::kRelaxed) != 0) return false;  // (ReapLate marks it)
  }
  Roots next = *roots;
  if (((unmark >> m) & 1) != 0) next.stale_since[m] = next.stale_until[m] = 0;
  FillRootsBlock(reinterpret_cast<RootsFormat*>(b->roots_buf), im->sb, next);
  dev::IoQueue& q = im->devs->member(m)->queue();
  Status st = dev::QueueSyncIo(q, IoOp::kFlush, 0, nullptr, 0, 0, IoOrigin::kBtree);
  if (st.ok())
    st = dev::QueueSyncIo(q, IoOp::kWrite, RootsSlotOffset(next.gen), b->roots_buf, kRootsSlotSize,
                          IoRequest::kFua, IoOrigin::kBtree);
  if (!st.ok()) {
    im->devs->MarkFailed(m, st);
    FillRootsBlock(reinterpret_cast<RootsFormat*>(b->roots_buf), im->sb, *roots);
    return false;
  }
  *roots = next;
  im->ctr.late_taken_back.FetchAdd(1, MemOrder::kRelaxed);
  return true;
}

// The roots block to every member holding btree nodes that is not
// unavailable, held (a late I/O out) or in `gave_up` (copies given up in
// this checkpoint): those keep their older block, all at once,
// with FUA. A write that fails with a device error marks its member failed
// (5c-3: the next roots blocks say it is stale) and the block goes on
// without it as long as one member took it. With may_give_up, once one
// member took the block, a write on a stalling member past its late bound
// is given up (the member held until it ends).
Status TreeOps::WriteRoots(Impl* im, Roots* roots, PhaseBatch* b, bool may_give_up, dev::DevMask gave_up,
                           dev::DevMask unmark, dev::DevMask* taken_back) {
  *taken_back = 0;
  b->roots_buf = static_cast<u8*>(platform::Alloc(kRootsSlotSize, 4096, true));
  if (b->roots_buf == nullptr) return Err::kNoMemory;
  FillRootsBlock(reinterpret_cast<RootsFormat*>(b->roots_buf), im->sb, *roots);
  auto able = [im] {
    dev::DevMask mask = 0;
    for (u32 m = 0; m < im->sb.nr_members; m++)
      if (HoldsBtree(im->sb, m) && ((im->devs->unavailable() >> m) & 1) == 0) mask |= dev::DevMask(1) << m;
    return mask;
  };
  const dev::DevMask durable_mask = DurableMask(im, able());
  dev::DevMask targets = able();
  // Every member able to take the block held (or every durable one, where
  // a held one is): their late I/Os are waited for first.
  const dev::DevMask held = targets & im->held_members;
  const dev::DevMask free_targets = targets & ~gave_up & ~im->held_members;
  if (held != 0 && (free_targets == 0 || ((held & durable_mask) != 0 && (free_targets & durable_mask) == 0))) {
    WaitLate(im);
    targets = able();  // (a late I/O's error may have marked one failed)
  }
  targets &= ~gave_up & ~im->held_members;
  // The block counts as taken once a member of nonzero durability took it
  // (any member, when none has durability).
  const dev::DevMask counted = durable_mask != 0 ? durable_mask : ~dev::DevMask(0);
  PhaseIo* w[dev::kMaxDevices] = {};
  dev::LateWatch<dev::kMaxDevices> watch;
  const u64 start = platform::NowNs();
  for (u32 m : dev::Bits(targets)) {
    w[m] = AddIo(im, b, kPhaseRoots, m, IoOp::kWrite, RootsSlotOffset(roots->gen), b->roots_buf, kRootsSlotSize,
                 IoRequest::kFua);
    watch.Start(m, im->devs->member(m)->queue(), start);
  }
  for (u32 m : dev::Bits(targets)) SubmitPhaseIo(im, w[m]);
  dev::DevMask pending = targets, took = 0, late = 0;
  while (pending != 0) {
    const u32 ev = im->phase_events.Load(MemOrder::kAcquire);
    for (u32 m : dev::Bits(pending)) {
      if (w[m]->busy.Load(MemOrder::kAcquire) != 0) continue;
      w[m]->seen = 1;
      pending &= ~(dev::DevMask(1) << m);
      if (w[m]->err.Load(MemOrder::kRelaxed) == 0 && ((im->devs->failed() >> m) & 1) == 0 && ((counted >> m) & 1) != 0)
        took |= dev::DevMask(1) << m;
    }
    if (pending == 0) break;
    const u64 deadline = may_give_up && took != 0 ? watch.Deadline(pending) : platform::kForever;
    const u64 now = platform::NowNs();
    if (now < deadline) {
      tfs_plat_wait(im->phase_events.Address(), ev,
                    deadline == platform::kForever ? platform::kForever : deadline - now);
      continue;
    }
    for (u32 m : dev::Bits(watch.Late(pending, now))) {
      w[m]->late = 1;
      late |= dev::DevMask(1) << m;
      pending &= ~(dev::DevMask(1) << m);
      im->ctr.roots_writes_late.FetchAdd(1, MemOrder::kRelaxed);
    }
  }
  Status first;
  u32 taken = 0, unmarked = 0;
  for (u32 m : dev::Bits(targets & ~late)) {
    const Status st = Status(Err(w[m]->err.Load(MemOrder::kRelaxed)));
    if (st.ok()) {
      taken++;
      continue;
    }
    if (first.ok()) first = st;
    im->devs->MarkFailed(m, st);
    if (((im->devs->failed() >> m) & 1) != 0) continue;  // (marked: the block goes on without it)
    unmarked++;  // (an error that marks nothing, or the last member: as before)
  }
  // No member took the block (each failed it, or failed since its copies
  // were flushed): a member given up in this checkpoint, or held, is taken
  // back -- the first whose I/Os end, waited for whatever the stall, as
  // before 6c-3.
  dev::DevMask left = (gave_up | held) & ~targets;
  while (taken == 0 && (left &= ~im->devs->unavailable()) != 0) {
    const u32 ev = im->phase_events.Load(MemOrder::kAcquire);
    u32 ready = kNoMember;
    for (u32 m : dev::Bits(left))
      if (ready == kNoMember && !MemberBusy(im, b, m)) ready = m;
    if (ready == kNoMember) {
      tfs_plat_wait(im->phase_events.Address(), ev, 100 * platform::kNsPerMs);
      continue;
    }
    left &= ~(dev::DevMask(1) << ready);
    ReapLate(im);  // (an error among its late I/Os marks it failed)
    if (((im->devs->unavailable() >> ready) & 1) != 0 || !TakeBack(im, b, ready, roots, unmark)) continue;
    taken++;
    *taken_back |= dev::DevMask(1) << ready;
  }
  if (taken > 0 && unmarked == 0) return Status::Ok();
  return first.ok() && taken == 0 ? Status(Err::kIo) : first;
}

// ---------------------------------------------------------------------------
// Checkpoints.

// Takes the image of n (which must not change meanwhile) into a new job.
Status TreeOps::TakeImage(Impl* im, Tree& t, CachedNode* n, Vector<Job>* jobs) {
  Job j;
  j.node = n;
  j.tree = &t;
  j.img = static_cast<u8*>(platform::Alloc(im->node_size, 4096, false));
  if (j.img == nullptr) return Err::kNoMemory;
  j.seq = NewSeq(im);
  j.bytes = n->node.WriteImage(j.img, j.seq, im->sb.fs_uuid, im->image_gen);
  j.dst = n->ptr;
  j.installed = false;
  j.rewrite = false;
  Status st = jobs->PushBack(j);
  if (!st.ok()) {
    platform::Free(j.img);
    return st;
  }
  Ref(n);
  ClearDirty(im, n);
  return Status::Ok();
}

// Gives job j its slot and points the node (and its parent's key) at it.
// Tree lock exclusive.
void TreeOps::Install(Impl* im, Job& j, const NodePtrFormat& slot, Vector<NodePtrFormat>* to_free) {
  CachedNode* n = j.node;
  SetPtrCopies(&j.dst, slot);  // (slot may be j.dst itself)
  j.dst.seq.set(j.seq);
  j.installed = true;
  if (n->dead.Load(MemOrder::kAcquire) != 0) {
    to_free->PushBack(j.dst).IgnoreError();  // nobody points there
    return;
  }
  if (!PtrEmpty(n->ptr)) {
    to_free->PushBack(n->ptr).IgnoreError();
  } else {
    im->unwritten_nodes.FetchSub(1, MemOrder::kRelaxed);  // the checkpoint's hold covers it
  }
  n->ptr = j.dst;
  n->node.SetSeq(j.seq);
  n->version.FetchAdd(1, MemOrder::kRelease);
  if (n->parent != nullptr) {
    CachedNode* p = n->parent;
    p->node.OverwriteValue(p->node.set(0).Key(ChildIndex(p, n)), &n->ptr);
    SetDirty(im, p);
  }
}

// Post-order: collects the nodes the exclusive phase must image -- nodes never
// written, interior nodes that changed, and every ancestor of those (installing
// a child's new location changes its parent). True if n was collected.
Result<bool> TreeOps::CollectExclusive(CachedNode* n, Vector<CachedNode*>* out) {
  bool below = false;
  for (usize i = 0; i < n->children.size(); i++) {
    if (n->children[i] == nullptr) continue;
    bool c = TFS_TRY(CollectExclusive(n->children[i], out));
    below = below || c;
  }
  const bool changed_interior = n->dirty.Load(MemOrder::kRelaxed) != 0 && n->node.info().level > 0;
  const bool need = below || PtrEmpty(n->ptr) || changed_interior;
  if (need) TFS_TRY(out->PushBack(n));
  return need;
}

void TreeOps::CollectDirtyLeaves(CachedNode* n, Vector<CachedNode*>* out) {
  if (n->node.info().level == 0) {
    if (n->dirty.Load(MemOrder::kRelaxed) != 0) out->PushBack(n).IgnoreError();
    return;
  }
  for (usize i = 0; i < n->children.size(); i++)
    if (n->children[i] != nullptr) CollectDirtyLeaves(n->children[i], out);
}

// An unmount's final checkpoint takes the buckets it will need before it
// images anything, so that their records are in its own images: as many
// slots as the next checkpoint may take (CheckpointSlots), counted again
// after each round (the records themselves may dirty an alloc leaf).
Status TreeOps::ReserveAhead(Impl* im) {
  for (int round = 0; round < 16; round++) {
    const u64 want = CheckpointSlots(im);
    if (AvailSlots(im) >= want) return Status::Ok();
    TFS_TRY(ReserveSlots(im, want));
  }
  return Status::Ok();  // (counted short: a later allocation is journaled, Close says so)
}

Status TreeOps::RunCheckpoint(Impl* im, Roots* roots_out, bool final) {
  MutexLock ck(im->ckpt_mu);
  im->image_gen = roots_out->gen + 1;
  struct ReclaimOk {  // (destroyed after Reserved below: its frees are reclaim commits)
    Impl* im;
    explicit ReclaimOk(Impl* i) : im(i) { im->reclaim_ok.FetchAdd(1, MemOrder::kRelaxed); }
    ~ReclaimOk() { im->reclaim_ok.FetchSub(1, MemOrder::kRelaxed); }
  } reclaim_ok(im);
  // The need stays at least what this checkpoint may take until it is done
  // (it clears dirty flags before it has taken its slots).
  struct Hold {
    Impl* im;
    explicit Hold(Impl* i) : im(i) {
      im->ckpt_taken.Store(0, MemOrder::kRelaxed);
      im->ckpt_hold.Store(CheckpointSlots(im), MemOrder::kRelaxed);
      PublishNeed(im);
    }
    ~Hold() {
      im->ckpt_hold.Store(0, MemOrder::kRelaxed);
      im->ckpt_taken.Store(0, MemOrder::kRelaxed);
      PublishNeed(im);
    }
  } hold(im);
  struct Reserved {  // reserved buckets go back on every path (not after a final one)
    Impl* im;
    bool final;
    ~Reserved() { ReturnReserved(im, !final); }
  } reserved{im, final};
  // Earlier checkpoints' late I/Os that ended are let go (6c-3); an
  // unmount's checkpoints wait for every one, and give nothing up.
  const bool may_give_up = !final && !im->closing;
  if (may_give_up) {
    ReapLate(im);
  } else {
    WaitLate(im);
  }
  ChooseCopySet(im);
  if (final) TFS_TRY(ReserveAhead(im));
  u64 covered;
  if (im->journal != nullptr) {
    // Close the open journal entry if it holds applied commits, so that it can
    // be covered (below) rather than replayed at the next mount.
    u64 applied;
    {
      MutexLock c(im->state_mu);
      applied = Max(im->applied_seq, im->reclaim_applied);
    }
    if (im->journal->next_seq() <= applied) TFS_TRY(im->journal->Flush());
  }
  {
    // Not commit_mu: a committer may be waiting for journal room while holding
    // it, and this checkpoint is what makes room.
    MutexLock c(im->state_mu);
    // After a failed apply the trees hold part of a transaction: never persist
    // that (replay of the journal applies the whole of it instead).
    if (!im->failed.ok()) return im->failed;
    // The roots block will claim every journal entry up to `covered`: each must
    // be fully applied before the images below are taken, and no later commit
    // may join it. Normal commits are serialized and their seqs never
    // decrease, so entries before applied_seq are complete, and every entry
    // up to the newest applied one is if no commit is in flight (a later
    // one lands in the open entry or after it); reclaim commits are this
    // checkpoint's own (or made while nothing commits), none in flight now.
    // Never the open entry: a commit could still land in it after this
    // snapshot and be skipped by replay. Claiming one entry less is always
    // safe: replay applies it again, and applying an entry's updates again in
    // order is idempotent (alloc records: newest version wins).
    covered = im->committing ? (im->applied_seq > 0 ? im->applied_seq - 1 : 0)
                             : Max(im->applied_seq, im->reclaim_applied);
    if (im->journal != nullptr) {
      const u64 next = im->journal->next_seq();
      if (next <= covered) covered = next > 0 ? next - 1 : 0;
    }
  }
  Vector<Job> jobs;
  Vector<NodePtrFormat> to_free;
  Vector<NodePtrFormat> kept;  // the kept slots: freed as to_free, not counted
  Status st;
  Roots roots = *roots_out;
  // Phase 1: dirty leaves, each under its own lock, the tree lock shared.
  for (u32 id = 0; id < kNrBtreeIds && st.ok(); id++) {
    Tree& t = im->trees[id];
    Vector<CachedNode*> leaves;
    {
      ReadGuard g(t.lock);
      if (t.root != nullptr) CollectDirtyLeaves(t.root, &leaves);
      for (CachedNode* n : leaves) Ref(n);
    }
    for (CachedNode* n : leaves) {
      if (st.ok()) {
        ReadGuard g(t.lock);
        if (n->dead.Load() == 0) {
          n->lock.ReadLock();
          if (n->dirty.Load(MemOrder::kRelaxed) != 0) {
            st = TakeImage(im, t, n, &jobs);
          }
          n->lock.ReadUnlock();
        }
      }
      Unref(n);
    }
  }
  // Slots for the images taken, and a reserve for the exclusive phase.
  for (usize i = 0; i < jobs.size() && st.ok(); i++) {
    NodePtrFormat s = EmptyPtr(jobs[i].dst.btree_id);
    st = AllocSlot(im, &s);
    if (st.ok()) SetPtrCopies(&jobs[i].dst, s);
  }
  // Phase 2: per tree, exclusive: install, then image interior and new nodes.
  for (u32 id = 0; id < kNrBtreeIds && st.ok(); id++) {
    Tree& t = im->trees[id];
    // Buckets are reserved only when the slots at hand (holes, the open
    // bucket's rest, reserved buckets) do not cover the exclusive set, and
    // then with room for structure that changes before we lock.
    bool reserve = false;
    for (;;) {
      u64 need = 0;
      {
        ReadGuard g(t.lock);
        if (t.root != nullptr) {
          Vector<CachedNode*> v;
          st = CollectExclusive(t.root, &v).status();
          need = v.size() + (reserve ? 1 + 2 * kMaxLevel : 0);
        }
      }
      if (st.ok() && need > 0 && AvailSlots(im) < need) {
        if (!reserve) need += 1 + 2 * kMaxLevel;
        reserve = true;
        st = ReserveSlots(im, need);
      }
      if (!st.ok()) break;
      WriteGuard g(t.lock);
      for (Job& j : jobs)
        if (j.tree == &t && !j.installed) Install(im, j, j.dst, &to_free);
      Vector<CachedNode*> v;
      if (t.root != nullptr) st = CollectExclusive(t.root, &v).status();
      if (!st.ok()) break;
      if (v.size() > AvailSlots(im)) {  // grew meanwhile: reserve more
        reserve = true;
        continue;
      }
      for (CachedNode* n : v) {
        // The slot first: taking the image clears the node's dirty flag.
        NodePtrFormat s = EmptyPtr(u8(id));
        st = AllocSlot(im, &s, false);
        if (!st.ok()) break;
        st = TakeImage(im, t, n, &jobs);
        if (!st.ok()) break;  // (the filesystem fails: the slot stays unused)
        Install(im, jobs.back(), s, &to_free);
      }
      for (const NodePtrFormat& d : t.dead_slots) to_free.PushBack(d).IgnoreError();
      t.dead_slots.Clear();
      for (const NodePtrFormat& d : t.kept_slots) kept.PushBack(d).IgnoreError();
      t.kept_slots.Clear();
      roots.roots[id] = t.root != nullptr ? t.root->ptr : EmptyPtr(u8(id));
      break;
    }
  }
  // A stale mark this mount made for copies given up (late_stale) ends
  // with the next roots block the member takes: every node with such a
  // copy was rewritten by the checkpoint after the one that gave it up
  // (Job::rewrite), so no pointer this one reaches names it.
  dev::DevMask clear = im->late_stale & ~im->held_members & ~im->devs->unavailable();
  dev::DevMask new_late_stale = 0;
  // Nothing new since the last roots block: write nothing.
  if (st.ok() && jobs.empty() && to_free.empty() && kept.empty() && covered <= roots_out->journal_seq &&
      !im->roots_changed && clear == 0) {
    return Status::Ok();
  }
  // Phase 3, no locks: write-ahead (the journal holds everything the images
  // contain), node writes, flushes, the roots block -- each I/O in the
  // batch (WriteNodeCopies, WriteRoots).
  if (st.ok() && im->journal != nullptr) st = im->journal->Flush();
  usize nwrites = 0;
  for (const Job& j : jobs) nwrites += PtrCopies(j.dst);
  PhaseBatch* batch = nullptr;
  if (st.ok()) {
    batch = NewBatch(im, u32(nwrites) + 2 * im->sb.nr_members);
    if (batch == nullptr) st = Err::kNoMemory;
  }
  dev::DevMask gave_up = 0, taken_back = 0;
  if (st.ok()) st = WriteNodeCopies(im, jobs, batch, may_give_up, &gave_up);
  if (st.ok()) {
    // Every job is installed (its pointer reached by the trees, or on
    // to_free when its node died meanwhile); to_free holds every pointer
    // the last roots block reached that this one does not.
    for (const Job& j : jobs) CountDegraded(im, &roots, j.dst, true);
    for (const NodePtrFormat& s : to_free) CountDegraded(im, &roots, s, false);
    // (A dropped interior node's subtree is not known: its degraded
    // pointers stay counted -- a count too high refuses a degraded mount
    // that might have worked, never the other way; fsck recounts.)
    for (const NodePtrFormat& s : im->dropped_ptrs) CountDegraded(im, &roots, s, false);

    roots.gen = roots_out->gen + 1;
    roots.journal_seq = Max(covered, roots_out->journal_seq);
    // A member failed while mounted misses this roots block and the node
    // copies since: the block says so (its window from the first gen it
    // missed), so that the window stands even if the member's own roots
    // slots are lost too.
    for (u32 m : dev::Bits(im->devs->failed())) {
      if (m >= im->sb.nr_members || !HoldsBtree(im->sb, m)) continue;
      if (roots.stale_since[m] == 0) roots.stale_since[m] = roots.gen;
      roots.stale_until[m] = roots.gen;
    }
    // A member with copies given up in this checkpoint may lack some of
    // this gen's (marked as a failed one is: a mount that reads this block
    // knows it); a mark this mount made so (late_stale) ends with a block
    // that reaches none of them and goes to the member (clear, above).
    clear &= ~gave_up & ~im->devs->unavailable();
    for (u32 m : dev::Bits(clear)) roots.stale_since[m] = roots.stale_until[m] = 0;
    for (u32 m : dev::Bits(gave_up)) {
      if (roots.stale_since[m] == 0) {
        roots.stale_since[m] = roots.gen;
        new_late_stale |= dev::DevMask(1) << m;
      }
      roots.stale_until[m] = roots.gen;
    }
    st = WriteRoots(im, &roots, batch, may_give_up, gave_up, new_late_stale | (im->late_stale & gave_up),
                    &taken_back);
    new_late_stale &= ~taken_back;
    // A member marked failed meanwhile (its roots write) holds copies out
    // of every roots block from now on: their nodes are rewritten too.
    for (Job& j : jobs)
      for (u32 c = 0; c < PtrCopies(j.dst); c++)
        if (((im->devs->failed() >> PtrCopy(j.dst, c).member) & 1) != 0) j.rewrite = true;
  }
  if (batch != nullptr) {
    // What is still out was given up: the batch stays until it ends
    // (ReapLate: at each checkpoint's start and end, WaitLateIos, Close).
    batch->next = im->late_batches;
    im->late_batches = batch;
    ReapLate(im);
  }
  for (Job& j : jobs) {
    platform::Free(j.img);
    j.img = nullptr;
    if (!j.rewrite || !st.ok()) Unref(j.node);  // (else after the rewrite's SetDirty, below)
  }
  if (!st.ok()) {
    // The images are not durable; the previous roots block still stands. The
    // nodes were marked clean: the filesystem must not go on as if they were.
    MutexLock c(im->state_mu);
    if (im->failed.ok()) im->failed = st;
    return st;
  }
  *roots_out = roots;
  im->roots_changed = false;
  im->late_stale = (im->late_stale & ~clear & ~taken_back) | new_late_stale;
  im->dropped_ptrs.Clear();
  im->degraded_reachable.Store(roots.degraded_nodes, MemOrder::kRelaxed);
  im->stale_members.Store(StaleMask(roots), MemOrder::kRelaxed);  // (a failed member's: 5c-3)
  // Entries written from now on record this roots block as durable: a mount
  // that finds an older one (this one damaged) knows it (Store::Open).
  if (im->journal != nullptr) im->journal->NoteRootsGen(roots.gen);
  // Old slots released; emptied buckets freed in one record commit (a
  // final checkpoint frees none: the next mount does, ReconcileBuckets).
  Vector<alloc::BucketRef> frees;
  for (const NodePtrFormat& s : to_free) FreeSlot(im, s, final ? nullptr : &frees);
  for (const NodePtrFormat& s : kept) FreeSlot(im, s, final ? nullptr : &frees);
  FreeBuckets(im, frees);
  PurgeHoles(im);  // those of the buckets just freed
  // Nodes with a copy that failed to write: dirtied, so that the next
  // checkpoint writes them whole (new slots; the failed copies' freed).
  for (Job& j : jobs) {
    if (!j.rewrite) continue;
    {
      WriteGuard g(j.tree->lock);
      if (j.node->dead.Load(MemOrder::kAcquire) == 0) SetDirty(im, j.node);
    }
    Unref(j.node);
  }
  // The journal up to `covered` is no longer needed.
  if (im->journal != nullptr) {
    MutexLock c(im->state_mu);
    if (im->pin.active && im->pin.seq <= covered) {
      // Entries after `covered` still matter: applied ones, and the entry of a
      // commit in flight (which relied on this pin when it started). The new
      // pin is taken before the old one is dropped: in between, an entry the
      // journal writes would record a last_seq past them, and replay would
      // start after them (CheckpointsRacingCommitsLoseNothing).
      journal::Pin next;
      const bool needed = im->applied_seq > covered || im->committing || im->reclaim_applied > covered;
      const Status pst = needed ? im->journal->PinAt(&next, covered + 1) : Status::Ok();
      if (pst.ok()) {
        im->journal->PinDrop(&im->pin);
        im->pin = next;  // inactive if nothing after `covered` needs it
      } else {
        // Keep the old pin: it holds those entries too (and older ones).
        platform::Log(platform::LogLevel::kWarn, "btree: journal pin not moved: %s", pst.Message());
      }
    }
  }
  im->ctr.checkpoints.FetchAdd(1, MemOrder::kRelaxed);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// The writer thread.

// Journal ring room (lock-free hint): the writer checkpoints once half of the
// ring is held, commits wait once three quarters are -- and, on small rings,
// while fewer free buckets remain than a checkpoint's write-ahead flush entry
// could need beside the reserve -- so the journal never fills with commits
// that flush would need room for.
bool TreeOps::JournalBelow(Impl* im, u32 num, u32 den, u32 min_free) {
  if (im->journal == nullptr) return false;
  u32 free, ring;
  im->journal->Room(&free, &ring);
  if (ring == 0) return false;
  return u64(free) * den < u64(ring) * num || free < min_free;
}

// Whether the journal needs room that the trees hold (their pin is set).
bool TreeOps::JournalNeedsRoom(Impl* im) {
  bool pinned;
  {
    MutexLock c(im->state_mu);
    pinned = im->pin.active;
  }
  return pinned && JournalBelow(im, 1, 2, 4);
}

void TreeOps::WriterMain(void* arg) {
  auto* self = static_cast<Btrees*>(arg);
  Impl* im = self->impl_;
  // The transactions committed when the last checkpoint started: dirt made
  // since by the checkpoints' own allocation records alone (reclaim commits,
  // not counted) must not re-arm `space` -- on a nearly full filesystem
  // whose every rewrite takes a new bucket, each checkpoint would dirty the
  // alloc leaf for the next, forever.
  u64 commits_at_ckpt = ~u64(0);
  MutexLock l(im->wmu);
  while (!im->stop) {
    const bool memory = im->dirty_nodes.Load(MemOrder::kRelaxed) * im->node_size > im->opt.cache_bytes / 2;
    const bool room = JournalNeedsRoom(im);
    // Space: the metadata member is down to the btree's growth room (user data
    // at its floor): write the dirty nodes so that the need drops
    // (docs/design/space.md).
    const u64 commits = im->ctr.commits.Load(MemOrder::kRelaxed);
    const bool space = im->dirty_nodes.Load(MemOrder::kRelaxed) > 0 && commits != commits_at_ckpt &&
                       im->alloc->MetadataTight();
    if (!im->wake && !memory && !room && !space) {
      if (!im->merge_queue.empty()) {
        im->wmu.Unlock();
        MergeQueued(im);
        im->wmu.Lock();
        continue;
      }
      (void)im->wcv.WaitFor(im->wmu, 100 * platform::kNsPerMs);
      continue;
    }
    im->wake = false;
    commits_at_ckpt = commits;
    im->wmu.Unlock();
    Status st = self->Checkpoint();
    // Make the ring space the checkpoints released reusable at once.
    if (st.ok() && im->journal != nullptr) st = im->journal->AdvanceLastSeq();
    if (!st.ok()) platform::Log(platform::LogLevel::kError, "btree: checkpoint failed: %s", st.Message());
    EvictIfNeeded(im);
    im->wmu.Lock();
    im->ckpt_done++;
    im->done_cv.Broadcast();
    // Do not spin when a checkpoint cannot help (or failed).
    if (!st.ok() || (room && !memory && JournalBelow(im, 1, 2, 4)) || (space && !room && !memory))
      (void)im->wcv.WaitFor(im->wmu, (st.ok() ? 100 : 1000) * platform::kNsPerMs);
  }
}

void Btrees::ReclaimHook(void* self, u64) {
  auto* b = static_cast<Btrees*>(self);
  Impl* im = b->impl_;
  if (im == nullptr) return;
  MutexLock l(im->wmu);
  im->wake = true;
  im->wcv.Signal();
}

Status Btrees::Checkpoint() {
  if (impl_ == nullptr) return Err::kInvalidArgument;
  return TreeOps::RunCheckpoint(impl_, &roots_);
}

void Btrees::WaitLateIos() {
  if (impl_ == nullptr) return;
  MutexLock ck(impl_->ckpt_mu);
  impl_->reclaim_ok.FetchAdd(1, MemOrder::kRelaxed);  // (the frees of buckets the late writes held)
  TreeOps::WaitLate(impl_);
  impl_->reclaim_ok.FetchSub(1, MemOrder::kRelaxed);
}

void Btrees::ClearStaleMembers(u64 mask) {
  if (impl_ == nullptr) return;
  MutexLock ck(impl_->ckpt_mu);  // (roots_ is the checkpoint's)
  if ((StaleMask(roots_) & mask) == 0) return;
  for (u32 m = 0; m < dev::kMaxDevices; m++)
    if ((mask >> m) & 1) roots_.stale_since[m] = roots_.stale_until[m] = 0;
  impl_->roots_changed = true;
  impl_->stale_members.Store(StaleMask(roots_), MemOrder::kRelaxed);
}

void Btrees::NoteRootsChanged() {
  if (impl_ == nullptr) return;
  MutexLock ck(impl_->ckpt_mu);
  impl_->roots_changed = true;
}

Status Btrees::AdjustDegradedCounts(const DegradedCounts& recorded, const DegradedCounts& recount) {
  if (impl_ == nullptr || impl_->opt.read_only) return Err::kInvalidArgument;
  MutexLock ck(impl_->ckpt_mu);
  // (A drop in between that the count did not hold -- degraded_count_short
  // -- left it higher than the additive model: the result is then too
  // high, never too low, which is the safe side.)
  // cur - was + now, each u64, staying within [0, limit].
  auto moved = [](u64 cur, u64 was, u64 now, u64 limit, u64* out) {
    if (cur >= was) {
      const u64 up = cur - was;
      if (now > limit || up > limit - now) return false;
      *out = now + up;
      return true;
    }
    const u64 down = was - cur;
    if (down > now || now - down > limit) return false;
    *out = now - down;
    return true;
  };
  DegradedCounts next;
  bool ok = moved(roots_.degraded_nodes, recorded.total, recount.total, ~u64(0), &next.total);
  for (u32 m = 0; m < dev::kMaxDevices && ok; m++)
    ok = moved(roots_.degraded_on[m], recorded.on[m], recount.on[m], 0xffffffffu, &next.on[m]);
  if (!ok) return Err::kBusy;
  roots_.degraded_nodes = next.total;
  for (u32 m = 0; m < dev::kMaxDevices; m++) roots_.degraded_on[m] = u32(next.on[m]);
  impl_->roots_changed = true;
  impl_->degraded_reachable.Store(roots_.degraded_nodes, MemOrder::kRelaxed);
  return Status::Ok();
}

}  // namespace tfs::btree
