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

namespace {

inline bool EntryLess(u64 inode, u64 offset, const Pos& pos) {
  return inode < pos.inode || (inode == pos.inode && offset < pos.offset);
}

// Bits needed to hold x (0 for 0).
inline u32 BitsFor(u64 x) { return x == 0 ? 0 : 64 - u32(__builtin_clzll(x)); }
// x << s for s up to 64 (a shift by 64 is 0, not undefined).
inline u64 Shl(u64 x, u32 s) { return s >= 64 ? 0 : x << s; }

}  // namespace

u16 Set::Fingerprint(u64 inode, u64 offset) {
  u64 h = (inode * 0x9e3779b97f4a7c15ull) ^ offset;
  h ^= h >> 31;
  h *= 0xff51afd7ed558ccdull;
  return u16(h >> 48);
}

Status Set::Index(const SetHeader* hdr, u8 btree_id, Form form) {
  hdr_ = hdr;
  btree_id_ = btree_id;
  open_ = false;
  packed_ = false;
  nkeys_ = 0;
  nblocks_ = 0;
  const u32 n = hdr->nkeys.get();
  const u32 m = (n + kBlockKeys - 1) / kBlockKeys;
  auto fail = [&](Status st) {
    offsets_.Resize(0).IgnoreError();  // shrinking never fails
    index_.Resize(0).IgnoreError();
    return st;
  };
  Status st = offsets_.Resize(n);
  if (!st.ok()) return fail(st);
  const u8* base = reinterpret_cast<const u8*>(hdr);
  auto key_at = [&](u32 i) { return reinterpret_cast<const KeyHeader*>(base + offsets_[i]); };
  u32 off = u32(sizeof(SetHeader));
  u64 min_off = ~u64(0);
  u64 max_off = 0;
  for (u32 i = 0; i < n; i++) {
    const auto* key = reinterpret_cast<const KeyHeader*>(base + off);
    offsets_[i] = off;
    min_off = Min(min_off, key->offset.get());
    max_off = Max(max_off, key->offset.get());
    off += KeySpace(key->val_bytes.get());
  }
  // Keys are sorted, so the inodes run from the first key's to the last's.
  const bool pack = form == Form::kAuto && n > 0 &&
                    BitsFor(key_at(n - 1)->inode.get() - key_at(0)->inode.get()) + BitsFor(max_off - min_off) <= 64;
  if (pack) {
    base_inode_ = key_at(0)->inode.get();
    base_offset_ = min_off;
    obits_ = u8(BitsFor(max_off - min_off));
    st = ResizeIndex<PackedBlock>(usize(m) + 1);
  } else {
    base_inode_ = base_offset_ = 0;
    obits_ = 0;
    st = ResizeIndex<Block>(usize(m) + 1);
  }
  if (!st.ok()) return fail(st);
  packed_ = pack;
  // k walks the implicit tree of the m blocks in order: start at the leftmost node.
  u32 k = 1;
  while (2 * k <= m) k *= 2;
  for (u32 b = 0; b < m; b++) {
    const u32 first = b * kBlockKeys;
    const u32 count = Min(kBlockKeys, n - first);
    const KeyHeader* last = key_at(first + count - 1);
    if (pack) {
      PackedBlock& e = As<PackedBlock>()[k];
      MemSet(&e, 0, sizeof(e));
      TFS_BUG_ON(!Pack(Pos{btree_id, last->inode.get(), last->offset.get()}, &e.key));
      e.loc = offsets_[first] / 8 | (b << kLocBits);
      const u32 stride = BlockStride(first, count);
      e.stride8 = stride / 8 <= 0xff ? u8(stride / 8) : 0;
      for (u32 j = 0; j + 1 < count; j++)
        e.fp[j] = u8(Fingerprint(key_at(first + j)->inode.get(), key_at(first + j)->offset.get()));
    } else {
      Block& e = As<Block>()[k];
      MemSet(&e, 0, sizeof(e));
      e.first = first;
      e.first_off = offsets_[first];
      e.inode = last->inode.get();
      e.offset = last->offset.get();
      e.stride = u16(BlockStride(first, count));
      for (u32 j = 0; j + 1 < count; j++)
        e.fp[j] = Fingerprint(key_at(first + j)->inode.get(), key_at(first + j)->offset.get());
    }
    if (2 * k + 1 <= m) {  // successor: leftmost node of the right subtree
      k = 2 * k + 1;
      while (2 * k <= m) k *= 2;
    } else {  // or the first ancestor whose left subtree we are in
      while (k & 1) k >>= 1;
      k >>= 1;
    }
  }
  nkeys_ = n;
  nblocks_ = m;
  return Status::Ok();
}

u32 Set::BlockStride(u32 first, u32 count) const {
  const u32 stride = Key(first).space();
  for (u32 j = 1; j < count; j++)
    if (Key(first + j).space() != stride) return 0;
  return stride;
}

bool Set::Pack(const Pos& pos, u64* out) const {
  if (pos.inode < base_inode_ || pos.offset < base_offset_) return false;
  const u64 ri = pos.inode - base_inode_;
  const u64 ro = pos.offset - base_offset_;
  const u64 imax = obits_ >= 64 ? 0 : ~u64(0) >> obits_;
  if (ri > imax || (obits_ < 64 && (ro >> obits_) != 0)) return false;
  *out = Shl(ri, obits_) | ro;
  return true;
}

bool Set::PackLowerBound(const Pos& pos, u64* out) const {
  const u64 ri = pos.inode - base_inode_;
  const u64 imax = obits_ >= 64 ? 0 : ~u64(0) >> obits_;
  if (ri > imax) return false;  // after every key's inode
  if (pos.offset < base_offset_) {  // no key of inode pos.inode is before it
    *out = Shl(ri, obits_);
    return true;
  }
  const u64 ro = pos.offset - base_offset_;
  if (obits_ >= 64 || (ro >> obits_) == 0) {
    *out = Shl(ri, obits_) | ro;
    return true;
  }
  // After every key of inode pos.inode: the bound is the next inode's first.
  if (ri == imax) return false;
  *out = Shl(ri + 1, obits_);
  return true;
}

Status Set::IndexOpen(const SetHeader* hdr, u8 btree_id) {
  hdr_ = hdr;
  btree_id_ = btree_id;
  open_ = true;
  nkeys_ = 0;
  nblocks_ = 0;
  const u32 n = hdr->nkeys.get();
  packed_ = false;
  Status st = offsets_.Resize(n);
  if (st.ok()) st = ResizeIndex<Entry>(n);
  if (!st.ok()) {
    offsets_.Resize(0).IgnoreError();
    index_.Resize(0).IgnoreError();
    return st;
  }
  const u8* base = reinterpret_cast<const u8*>(hdr);
  u32 off = u32(sizeof(SetHeader));
  for (u32 i = 0; i < n; i++) {
    const auto* key = reinterpret_cast<const KeyHeader*>(base + off);
    offsets_[i] = off;
    As<Entry>()[i] = Entry{key->inode.get(), key->offset.get()};
    off += KeySpace(key->val_bytes.get());
  }
  nkeys_ = n;
  return Status::Ok();
}

Status Set::Reserve(u32 n) {
  TFS_TRY(offsets_.Grow(n));
  return index_.Grow(usize(n) * sizeof(Entry));
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
    TFS_BUG_ON(!offsets_.Resize(usize(nkeys_) + 1).ok() || !ResizeIndex<Entry>(usize(nkeys_) + 1).ok());  // reserved
    Entry* sorted = As<Entry>();
    MemMove(&offsets_[i + 1], &offsets_[i], (nkeys_ - i) * sizeof(u32));
    MemMove(&sorted[i + 1], &sorted[i], (nkeys_ - i) * sizeof(Entry));
    nkeys_++;
    offsets_[i] = at;
    sorted[i] = Entry{pos.inode, pos.offset};
  }
  const u32 delta = space - old_space;  // mod 2^32: adds a negative change too
  if (delta != 0)
    for (u32 j = i + 1; j < nkeys_; j++) offsets_[j] += delta;
}

u32 Set::LowerBoundOpen(const Pos& pos) const {
  const Entry* e = As<Entry>();
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

u64 Set::LowerBoundSlot(const Pos& pos) const {
  const Block* e = As<Block>();
  const u64 m = nblocks_;
  u64 k = 1;
  while (k <= m) {
    // The eight slots three levels below k are k's descendants, contiguous in one
    // 256-byte block: all four of its cache lines are fetched, since the descent
    // will use one entry of any of them. Prefetching past the array is harmless
    // (never faults), but computed on integers so that no out-of-bounds pointer
    // is ever formed.
    const uptr block = uptr(e) + 8 * k * sizeof(Block);
    for (uptr line = 0; line < 8 * sizeof(Block); line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(block + line));
    const Block& x = e[k];
    const u64 less = u64(x.inode < pos.inode) | (u64(x.inode == pos.inode) & u64(x.offset < pos.offset));
    k = 2 * k + less;
  }
  return k >> (__builtin_ctzll(~k) + 1);
}

u64 Set::LowerBoundSlotPacked(u64 key) const {
  const PackedBlock* e = As<PackedBlock>();
  const u64 m = nblocks_;
  u64 k = 1;
  while (k <= m) {
    // As LowerBoundSlot: k's eight descendants three levels below are two lines
    // here. (Four levels ahead, four lines, measured slower: btree_node_bench
    // across 2048 nodes, 2.75M/s against 2.98M/s.)
    const uptr block = uptr(e) + 8 * k * sizeof(PackedBlock);
    for (uptr line = 0; line < 8 * sizeof(PackedBlock); line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(block + line));
    k = 2 * k + u64(e[k].key < key);
  }
  return k >> (__builtin_ctzll(~k) + 1);
}

void Set::BlockStart(u64 k, u32* first, u32* first_off) const {
  if (packed_) {
    const u32 loc = As<PackedBlock>()[k].loc;
    *first = (loc >> kLocBits) * kBlockKeys;
    *first_off = (loc & ((1u << kLocBits) - 1)) * 8;
  } else {
    *first = As<Block>()[k].first;
    *first_off = As<Block>()[k].first_off;
  }
}

u32 Set::LowerBound(const Pos& pos) const {
  if (pos.btree_id != btree_id_) return pos.btree_id < btree_id_ ? 0 : nkeys_;
  if (open_) return LowerBoundOpen(pos);
  u64 k;
  if (packed_) {
    if (pos.inode < base_inode_) return 0;
    u64 key;
    if (!PackLowerBound(pos, &key)) return nkeys_;
    k = LowerBoundSlotPacked(key);
  } else {
    k = LowerBoundSlot(pos);
  }
  if (k == 0) return nkeys_;
  // The block's last key is >= pos: the answer is one of its keys, which lie
  // one after another from its first.
  u32 first;
  u32 first_off;
  BlockStart(k, &first, &first_off);
  const u32 last = Min(kBlockKeys, nkeys_ - first) - 1;
  const u8* p = reinterpret_cast<const u8*>(hdr_) + first_off;
  for (u32 j = 0; j < last; j++) {
    KeyRef key(reinterpret_cast<const KeyHeader*>(p));
    if (key.pos() >= pos) return first + j;
    p += key.space();
  }
  return first + last;
}

u32 Set::FindFromKey(u32 first, u32 first_off, u32 last, u32 want, u32 stride, const Pos& pos, KeyRef* out) const {
  const u8* p = reinterpret_cast<const u8*>(hdr_) + first_off;
  u32 j = 0;
  if (stride != 0) {
    p += want * stride;
    j = want;
  }
  for (; j <= last; j++) {
    KeyRef key(reinterpret_cast<const KeyHeader*>(p));
    if (j >= want) {
      const Pos kp = key.pos();
      if (kp == pos) {
        if (out != nullptr) *out = key;
        return first + j;
      }
      if (kp > pos) return nkeys_;  // a fingerprint collision
    }
    p += key.space();
  }
  return nkeys_;
}

// In the block at slot k (whose last key is >= pos): the index of the key at
// exactly pos, or size(). The last key is compared in the index; an earlier key
// is read only when its fingerprint matches.
u32 Set::FindInBlock(u64 k, const Pos& pos, KeyRef* out) const {
  const Block& b = As<Block>()[k];
  const u32 last = Min(kBlockKeys, nkeys_ - b.first) - 1;
  u32 want = last;
  if (b.inode != pos.inode || b.offset != pos.offset) {
    const u16 fp = Fingerprint(pos.inode, pos.offset);
    for (want = 0; want < last && b.fp[want] != fp; want++) {
    }
    if (want == last) return nkeys_;
  }
  return FindFromKey(b.first, b.first_off, last, want, b.stride, pos, out);
}

// The same for a packed block, `key` being pos packed.
u32 Set::FindInPackedBlock(u64 k, u64 key, const Pos& pos, KeyRef* out) const {
  const PackedBlock& b = As<PackedBlock>()[k];
  u32 first;
  u32 first_off;
  BlockStart(k, &first, &first_off);
  const u32 last = Min(kBlockKeys, nkeys_ - first) - 1;
  u32 want = last;
  if (b.key != key) {
    const u8 fp = u8(Fingerprint(pos.inode, pos.offset));
    for (want = 0; want < last && b.fp[want] != fp; want++) {
    }
    if (want == last) return nkeys_;
  }
  return FindFromKey(first, first_off, last, want, u32(b.stride8) * 8, pos, out);
}

u32 Set::Find(const Pos& pos) const {
  if (pos.btree_id != btree_id_) return nkeys_;
  if (open_) {
    const u32 i = LowerBoundOpen(pos);
    const Entry* e = As<Entry>();
    return i < nkeys_ && e[i].inode == pos.inode && e[i].offset == pos.offset ? i : nkeys_;
  }
  if (packed_) {
    u64 key;
    if (!Pack(pos, &key)) return nkeys_;
    const u64 k = LowerBoundSlotPacked(key);
    return k == 0 ? nkeys_ : FindInPackedBlock(k, key, pos, nullptr);
  }
  const u64 k = LowerBoundSlot(pos);
  return k == 0 ? nkeys_ : FindInBlock(k, pos, nullptr);
}

KeyRef Set::FindKey(const Pos& pos) const {
  if (open_ || pos.btree_id != btree_id_) {
    const u32 i = Find(pos);
    return i < nkeys_ ? Key(i) : KeyRef();
  }
  KeyRef key;
  if (packed_) {
    u64 packed;
    if (!Pack(pos, &packed)) return key;
    const u64 k = LowerBoundSlotPacked(packed);
    if (k != 0) FindInPackedBlock(k, packed, pos, &key);
    return key;
  }
  const u64 k = LowerBoundSlot(pos);
  if (k != 0) FindInBlock(k, pos, &key);
  return key;
}

}  // namespace tfs::btree
