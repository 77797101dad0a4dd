// Iterators (docs/design/btree.md, "Iterators"): a cursor over one btree
// that copies a batch of keys from one leaf under the locks -- first_batch
// at a seek, twice as many at each refill up to kIterBatchMax -- together
// with the leaf's version, and holds a reference on that leaf. Next and Prev
// inside the batch cost one atomic load while the version is unchanged; any
// change to the leaf, or its replacement by a split or merge (Kill bumps the
// dead node's version), sends the iterator back to the tree from where it
// stands, so each call sees every commit applied before it started.
//
// No lock is held between calls. Fill takes the tree lock shared, then one
// leaf lock shared; a leaf not cached is read by FetchMiss with every lock
// dropped. It never changes a tree, and evicts (MaybeEvict) only after it
// has dropped its locks.
#include "btree/internal.h"

namespace tfs::btree {

namespace {

constexpr u32 kIterBatchMin = 32;
constexpr u32 kIterBatchMax = 1024;

}  // namespace

Iterator::Iterator(Btrees* trees, u8 btree_id, u32 first_batch)
    : trees_(trees), id_(btree_id), first_batch_(first_batch == 0 ? kIterBatchMin : Min(first_batch, kIterBatchMax)) {}

Iterator::~Iterator() {
  if (leaf_ != nullptr) TreeOps::Unref(leaf_);
}

Status Iterator::Seek(const Pos& pos) { return Move(Dir::kSeek, pos); }
Status Iterator::SeekForPrev(const Pos& pos) { return Move(Dir::kSeekForPrev, pos); }
Status Iterator::SeekToFirst() { return Move(Dir::kSeek, Pos::Min(id_)); }
Status Iterator::SeekToLast() { return Move(Dir::kSeekForPrev, Pos::Max(id_)); }

Status Iterator::Next() { return Step(true); }
Status Iterator::Prev() { return Step(false); }

Status Iterator::Step(bool forward) {
  if (!valid_) return Err::kInvalidArgument;
  // Inside the batch, while the leaf is unchanged: no lock, no search.
  const bool more = forward ? idx_ + 1 < offsets_.size() : idx_ > 0;
  if (leaf_ != nullptr && more && leaf_->version.Load(MemOrder::kAcquire) == leaf_version_) {
    SetCurrent(forward ? idx_ + 1 : idx_ - 1);
    return Status::Ok();
  }
  if (forward ? IsMax(pos_) : IsMin(pos_)) {
    valid_ = false;
    return Status::Ok();
  }
  batch_limit_ = Min<u32>(batch_limit_ * 2, kIterBatchMax);
  return Fill(forward, forward ? Succ(pos_) : Pred(pos_));
}

Status Iterator::Move(Dir dir, const Pos& pos) {
  valid_ = false;
  if (pos.btree_id != id_ || trees_->impl_ == nullptr) return Err::kInvalidArgument;
  batch_limit_ = first_batch_;
  return Fill(dir == Dir::kSeek, pos);
}

void Iterator::SetCurrent(u32 i) {
  idx_ = i;
  KeyRef k(reinterpret_cast<const KeyHeader*>(batch_.data() + offsets_[i]));
  pos_ = k.pos();
  value_ptr_ = k.value();
  value_len_ = k.val_bytes();
  valid_ = true;
}

// Copies up to batch_limit_ keys from the leaf holding `from`: the first keys >= from
// (forward) or the last keys <= from (backward), crossing to the next leaf while
// one has none.
Status Iterator::Fill(bool forward, Pos from) {
  // The batch grows under the leaf's lock. (The scope is the call's, not the
  // iterator's: an iterator may be kept between calls, even by another thread.)
  platform::NoFsScope nofs;
  Btrees::Impl* im = trees_->impl_;
  Btrees::Tree& t = im->trees[id_];
  valid_ = false;
  for (;;) {
    TreeOps::Miss miss;
    t.lock.ReadLock();
    if (t.root == nullptr) {
      t.lock.ReadUnlock();
      return Status::Ok();
    }
    CachedNode* leaf = TreeOps::Descend(im, t, from, 0, &miss);
    if (leaf != nullptr) im->c_hits.FetchAdd(1, MemOrder::kRelaxed);
    if (leaf == nullptr) {
      t.lock.ReadUnlock();
      Diag why;
      Status st = TreeOps::FetchMiss(im, t, miss, diag_ != nullptr ? &why : nullptr);
      if (!st.ok()) {
        if (diag_ != nullptr)
          DiagError(diag_, st, "btree %u: level-%u node at member %u offset %llu: %s", unsigned(id_),
                    unsigned(miss.ptr.level), PtrCopy(miss.ptr, 0).member,
                    (unsigned long long)PtrCopy(miss.ptr, 0).offset, why.empty() ? st.Message() : why.text)
              .IgnoreError();
        return st;
      }
      continue;
    }
    if (leaf != leaf_) {
      TreeOps::Ref(leaf);
      if (leaf_ != nullptr) TreeOps::Unref(leaf_);
      leaf_ = leaf;
    }
    leaf->lock.ReadLock();
    leaf_version_ = leaf->version.Load(MemOrder::kAcquire);
    const NodeInfo info = leaf->node.info();
    batch_.Clear();
    offsets_.Clear();
    Status st;
    NodeIter it(leaf->node);
    u32 n = 0;
    if (forward) {
      it.Seek(from);
    } else {
      it.SeekForPrev(from);
    }
    for (; it.Valid() && n < batch_limit_ && st.ok(); n++) {
      KeyRef k = it.key();
      const usize at = batch_.size();
      st = offsets_.PushBack(u32(at));
      if (st.ok()) st = batch_.Append(reinterpret_cast<const u8*>(k.raw()), k.space());
      if (forward) {
        it.Next();
      } else {
        it.Prev();
      }
    }
    leaf->lock.ReadUnlock();
    t.lock.ReadUnlock();
    TFS_TRY(st);
    TreeOps::MaybeEvict(im);
    if (n > 0) {
      if (!forward) {  // keep the batch in ascending order
        for (u32 i = 0, j = n - 1; i < j; i++, j--) Swap(offsets_[i], offsets_[j]);
      }
      SetCurrent(forward ? 0 : n - 1);
      return Status::Ok();
    }
    // Nothing in this leaf on that side: move to the neighbour.
    if (forward) {
      if (IsMax(info.max)) return Status::Ok();
      from = Succ(info.max);
    } else {
      if (IsMin(info.min)) return Status::Ok();
      from = Pred(info.min);
    }
  }
}

}  // namespace tfs::btree
