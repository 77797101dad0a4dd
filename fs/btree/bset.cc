// Sorted sets: the builder, and the Eytzinger index and search (see bset.h).
//
// The index is built by one in-order walk of the implicit tree (no recursion, so
// no stack depth that grows with the set), and searched with the branch-light
// Eytzinger lower_bound: descend k -> 2k + (entry[k] < key); the answer is the last
// node where the walk went left, recovered from k by dropping its trailing one
// bits and one more. The sets' keys themselves are touched only to return the
// answer, never during the descent.
#include "btree/bset.h"

#include "platform/platform.h"

namespace tfs::btree {

Status CheckKeyInput(const KeyInput& key, u8 btree_id) {
  if (key.pos.btree_id != btree_id) return Err::kInvalidArgument;
  if (key.type == kKeyInvalid || key.type >= kNrKeyTypes) return Err::kInvalidArgument;
  if (key.type == kKeyWhiteout && key.val_bytes != 0) return Err::kInvalidArgument;
  if (key.val_bytes > kMaxValueBytes) return Err::kTooBig;
  if (key.val_bytes != 0 && key.value == nullptr) return Err::kInvalidArgument;
  return Status::Ok();
}

void PackKey(u8* dst, const KeyInput& key) {
  auto* k = reinterpret_cast<KeyHeader*>(dst);
  k->btree_id = key.pos.btree_id;
  k->type = key.type;
  k->val_bytes.set(u16(key.val_bytes));
  k->reserved.set(0);
  k->inode.set(key.pos.inode);
  k->offset.set(key.pos.offset);
  u8* val = reinterpret_cast<u8*>(k + 1);
  MemCopy(val, key.value, key.val_bytes);
  MemSet(val + key.val_bytes, 0, KeySpace(key.val_bytes) - sizeof(KeyHeader) - key.val_bytes);
}

SetBuilder::SetBuilder(u8* dst, u32 cap, u8 btree_id, u64 node_seq, u64 journal_seq)
    : dst_(dst), cap_(cap), btree_id_(btree_id), node_seq_(node_seq), journal_seq_(journal_seq),
      used_(u32(sizeof(SetHeader))) {}

Status SetBuilder::Add(const KeyInput& key) {
  Status st = CheckKeyInput(key, btree_id_);
  if (!st.ok()) return st;
  if (nkeys_ > 0 && !(last_ < key.pos)) return Err::kInvalidArgument;
  u32 space = KeySpace(key.val_bytes);
  if (used_ > cap_ || cap_ - used_ < space) return Err::kNoSpace;
  PackKey(dst_ + used_, key);
  used_ += space;
  nkeys_++;
  last_ = key.pos;
  return Status::Ok();
}

Status SetBuilder::Add(KeyRef key) {
  KeyInput in;
  in.pos = key.pos();
  in.type = key.type();
  in.value = key.value();
  in.val_bytes = key.val_bytes();
  return Add(in);
}

u32 SetBuilder::Finish() {
  auto* h = reinterpret_cast<SetHeader*>(dst_);
  h->magic.set(kSetMagic ^ node_seq_);
  h->csum.set(0);
  h->bytes.set(used_);
  h->key_bytes.set(used_ - u32(sizeof(SetHeader)));
  h->nkeys.set(nkeys_);
  h->journal_seq.set(journal_seq_);
  h->csum.set(platform::Crc32cSkippingField(dst_, used_, __builtin_offsetof(SetHeader, csum)));
  return used_;
}

Status Set::Index(const SetHeader* hdr, u8 btree_id) {
  hdr_ = hdr;
  btree_id_ = btree_id;
  open_ = false;
  nkeys_ = 0;
  u32 n = hdr->nkeys.get();
  Status st = offsets_.Resize(n);
  if (st.ok()) st = eytz_.Resize(usize(n) + 1);
  if (!st.ok()) {
    offsets_.Resize(0).IgnoreError();  // shrinking never fails
    eytz_.Resize(0).IgnoreError();
    return st;
  }
  const u8* base = reinterpret_cast<const u8*>(hdr);
  u32 off = u32(sizeof(SetHeader));
  // k walks the implicit tree in order: start at the leftmost node.
  u32 k = 1;
  while (2 * k <= n) k *= 2;
  for (u32 i = 0; i < n; i++) {
    const auto* key = reinterpret_cast<const KeyHeader*>(base + off);
    eytz_[k] = Entry{key->inode.get(), key->offset.get(), off, i};
    offsets_[i] = off;
    off += KeySpace(key->val_bytes.get());
    if (2 * k + 1 <= n) {  // successor: leftmost node of the right subtree
      k = 2 * k + 1;
      while (2 * k <= n) k *= 2;
    } else {  // or the first ancestor whose left subtree we are in
      while (k & 1) k >>= 1;
      k >>= 1;
    }
  }
  nkeys_ = n;
  return Status::Ok();
}

Status Set::IndexOpen(const SetHeader* hdr, u8 btree_id) {
  hdr_ = hdr;
  btree_id_ = btree_id;
  open_ = true;
  nkeys_ = 0;
  const u32 n = hdr->nkeys.get();
  Status st = offsets_.Resize(n);
  if (st.ok()) st = eytz_.Resize(n);
  if (!st.ok()) {
    offsets_.Resize(0).IgnoreError();
    eytz_.Resize(0).IgnoreError();
    return st;
  }
  const u8* base = reinterpret_cast<const u8*>(hdr);
  u32 off = u32(sizeof(SetHeader));
  for (u32 i = 0; i < n; i++) {
    const auto* key = reinterpret_cast<const KeyHeader*>(base + off);
    offsets_[i] = off;
    eytz_[i] = Entry{key->inode.get(), key->offset.get(), 0, 0};  // open form: offsets_ and i
    off += KeySpace(key->val_bytes.get());
  }
  nkeys_ = n;
  return Status::Ok();
}

Status Set::Reserve(u32 n) {
  const usize want = Max<usize>(n, Max<usize>(2 * offsets_.capacity(), 16));
  if (n > offsets_.capacity()) TFS_TRY(offsets_.Reserve(want));
  if (n > eytz_.capacity()) TFS_TRY(eytz_.Reserve(want));
  return Status::Ok();
}

void Set::Seal() {
  if (!open_) return;
  Set sealed;
  if (sealed.Index(hdr_, btree_id_).ok()) *this = Move(sealed);
}

Status Set::Unseal() {
  if (open_) return Status::Ok();
  Set unsealed;
  TFS_TRY(unsealed.IndexOpen(hdr_, btree_id_));
  *this = Move(unsealed);
  return Status::Ok();
}

void Set::OpenUpdate(u32 i, const Pos& pos, u32 at, u32 space, u32 old_space, bool replace) {
  TFS_BUG_ON(!open_ || i > nkeys_ || (replace && i == nkeys_));
  if (!replace) {
    TFS_BUG_ON(!offsets_.Resize(usize(nkeys_) + 1).ok() || !eytz_.Resize(usize(nkeys_) + 1).ok());  // reserved
    MemMove(&offsets_[i + 1], &offsets_[i], (nkeys_ - i) * sizeof(u32));
    MemMove(&eytz_[i + 1], &eytz_[i], (nkeys_ - i) * sizeof(Entry));
    nkeys_++;
    offsets_[i] = at;
    eytz_[i] = Entry{pos.inode, pos.offset, 0, 0};
  }
  const u32 delta = space - old_space;  // mod 2^32: adds a negative change too
  if (delta != 0)
    for (u32 j = i + 1; j < nkeys_; j++) offsets_[j] += delta;
}

namespace {
inline bool EntryLess(u64 inode, u64 offset, const Pos& pos) {
  return inode < pos.inode || (inode == pos.inode && offset < pos.offset);
}
}  // namespace

u32 Set::LowerBoundOpen(const Pos& pos) const {
  const Entry* e = eytz_.data();
  u32 lo = 0;
  u32 len = nkeys_;
  while (len > 0) {
    const u32 half = len / 2;
    if (EntryLess(e[lo + half].inode, e[lo + half].offset, pos)) {
      lo += half + 1;
      len -= half + 1;
    } else {
      len = half;
    }
  }
  return lo;
}

u32 Set::LowerBound(const Pos& pos) const {
  if (pos.btree_id != btree_id_) return pos.btree_id < btree_id_ ? 0 : nkeys_;
  if (open_) return LowerBoundOpen(pos);
  const u64 k = LowerBoundSlot(pos);
  return k == 0 ? nkeys_ : eytz_[k].rank;
}

u64 Set::LowerBoundSlot(const Pos& pos) const {
  const Entry* e = eytz_.data();
  const u64 n = nkeys_;
  u64 k = 1;
  while (k <= n) {
    // Sixteen slots below k are k's descendants four levels down, contiguous in one
    // 384-byte block: all six of its cache lines are fetched, since the descent
    // will use one entry of any of them. Prefetching past the array is harmless
    // (never faults), but computed on integers so that no out-of-bounds pointer
    // is ever formed.
    const uptr block = uptr(e) + 16 * k * sizeof(Entry);
    for (uptr line = 0; line < 16 * sizeof(Entry); line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(block + line));
    const Entry& x = e[k];
    const u64 less = u64(x.inode < pos.inode) | (u64(x.inode == pos.inode) & u64(x.offset < pos.offset));
    k = 2 * k + less;
  }
  return k >> (__builtin_ctzll(~k) + 1);
}

u32 Set::Find(const Pos& pos) const {
  if (pos.btree_id != btree_id_) return nkeys_;
  if (open_) {
    const u32 i = LowerBoundOpen(pos);
    return i < nkeys_ && eytz_[i].inode == pos.inode && eytz_[i].offset == pos.offset ? i : nkeys_;
  }
  const u64 k = LowerBoundSlot(pos);
  return k != 0 && eytz_[k].inode == pos.inode && eytz_[k].offset == pos.offset ? eytz_[k].rank : nkeys_;
}

KeyRef Set::FindKey(const Pos& pos) const {
  if (open_) {
    const u32 i = Find(pos);
    return i < nkeys_ ? Key(i) : KeyRef();
  }
  if (pos.btree_id != btree_id_) return KeyRef();
  const u64 k = LowerBoundSlot(pos);
  if (k == 0 || eytz_[k].inode != pos.inode || eytz_[k].offset != pos.offset) return KeyRef();
  return KeyRef(reinterpret_cast<const KeyHeader*>(reinterpret_cast<const u8*>(hdr_) + eytz_[k].key_off));
}

}  // namespace tfs::btree
