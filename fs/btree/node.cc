// Btree node parsing, validation, set append, compaction and the merge iterator
// (see node.h and docs/format/btree.md).
//
// Validation runs on the Node's own copy of the bytes, so nothing can change them
// between check and use, and it checks every length against what is left of the
// buffer before reading through it: a hostile node can make Parse fail, never read
// out of bounds. After Parse succeeds the rest of the code trusts the buffer
// (KeyRef, Set::Index do no checking). Invariants kept by every mutation: the
// header's used_bytes/nsets/csum describe exactly the sets in sets_, each set's
// csum is current, and every key is within [min, max] and in order within its set.
#include "btree/node.h"

#include "platform/platform.h"
#include "util/bits.h"

namespace tfs::btree {
namespace {

constexpr u32 kNodeAlign = 4096;

bool ValidBounds(const NodeInfo& info) {
  return info.btree_id < kNrBtreeIds && info.level <= kMaxLevel && info.min.btree_id == info.btree_id &&
         info.max.btree_id == info.btree_id && info.min <= info.max;
}

bool SameInfo(const NodeInfo& a, const NodeInfo& b) {
  return a.btree_id == b.btree_id && a.level == b.level && a.seq == b.seq && a.min == b.min && a.max == b.max;
}


}  // namespace

Node::~Node() { Reset(); }

void Node::Reset() {
  sets_.Clear();
  platform::Free(buf_);
  buf_ = nullptr;
  node_size_ = used_ = 0;
  info_ = NodeInfo{};
  open_ = false;
  dead_ = 0;
}

void Node::SealHeader() {
  auto* h = reinterpret_cast<NodeHeader*>(buf_);
  h->used_bytes.set(used_);
  h->nsets.set(u16(sets_.size()));
  h->csum.set(platform::Crc32cSkippingField(buf_, sizeof(NodeHeader), __builtin_offsetof(NodeHeader, csum)));
}

Status Node::IndexSets(u32 from) {
  // Sets [from, ...) start after the previous set; their count comes from the header.
  u32 nsets = reinterpret_cast<const NodeHeader*>(buf_)->nsets.get();
  u32 off = u32(sizeof(NodeHeader));
  for (u32 i = 0; i < from; i++) off += sets_[i].header()->bytes.get();
  while (sets_.size() > from) sets_.PopBack();
  for (u32 i = from; i < nsets; i++) {
    const auto* sh = reinterpret_cast<const SetHeader*>(buf_ + off);
    Set s;
    Status st = s.Index(sh, info_.btree_id);
    if (!st.ok()) return st;
    st = sets_.PushBack(Move(s));  // nsets <= kMaxSets was checked
    if (!st.ok()) return st;
    off += sh->bytes.get();
  }
  return Status::Ok();
}

Status Node::Init(u32 node_size, const NodeInfo& info) {
  Reset();
  if (!IsPowerOfTwo(node_size) || node_size < kMinNodeSize || node_size > kMaxNodeSize || !ValidBounds(info))
    return Err::kInvalidArgument;
  // Only [0, used_bytes) is ever read: zero the header, not the whole buffer.
  buf_ = static_cast<u8*>(platform::Alloc(node_size, kNodeAlign, false));
  if (buf_ == nullptr) return Err::kNoMemory;
  MemSet(buf_, 0, sizeof(NodeHeader));
  node_size_ = node_size;
  used_ = u32(sizeof(NodeHeader));
  info_ = info;
  auto* h = reinterpret_cast<NodeHeader*>(buf_);
  h->magic.set(kNodeMagic);
  h->version.set(kNodeVersion);
  h->btree_id = info.btree_id;
  h->level = info.level;
  h->seq.set(info.seq);
  h->node_size.set(node_size);
  h->min_inode.set(info.min.inode);
  h->min_offset.set(info.min.offset);
  h->max_inode.set(info.max.inode);
  h->max_offset.set(info.max.offset);
  SealHeader();
  return Status::Ok();
}

Status Node::Parse(const void* src, usize len, const NodeInfo* expect, Diag* diag) {
  Reset();
  if (len < kMinNodeSize || len > kMaxNodeSize || !IsPowerOfTwo(len))
    return DiagError(diag, Err::kInvalidArgument, "btree node: buffer of %llu bytes is not a node size",
                     (unsigned long long)len);
  buf_ = static_cast<u8*>(platform::Alloc(len, kNodeAlign, false));
  if (buf_ == nullptr) return Err::kNoMemory;
  MemCopy(buf_, src, len);
  node_size_ = u32(len);

  Status st = [&]() -> Status {
    const auto* h = reinterpret_cast<const NodeHeader*>(buf_);
    if (h->magic.get() != kNodeMagic) return DiagError(diag, Err::kBadMagic, "btree node: bad magic");
    if (h->csum.get() != platform::Crc32cSkippingField(buf_, sizeof(NodeHeader), __builtin_offsetof(NodeHeader, csum)))
      return DiagError(diag, Err::kBadChecksum, "btree node: header checksum mismatch");
    if (h->version.get() != kNodeVersion)
      return DiagError(diag, Err::kBadVersion, "btree node: version %u not supported (this build reads %u)",
                       unsigned(h->version.get()), unsigned(kNodeVersion));
    NodeInfo info;
    info.btree_id = h->btree_id;
    info.level = h->level;
    info.seq = h->seq.get();
    info.gen = h->gen.get();
    info.min = Pos{h->btree_id, h->min_inode.get(), h->min_offset.get()};
    info.max = Pos{h->btree_id, h->max_inode.get(), h->max_offset.get()};
    const unsigned long long seq = (unsigned long long)info.seq;
    auto bad = [&](const char* what) {
      return DiagError(diag, Err::kCorrupt, "btree node seq %llu: bad %s", seq, what);
    };
    if (h->node_size.get() != len) return bad("node_size (does not match the buffer)");
    const u32 used = h->used_bytes.get();
    if (used < sizeof(NodeHeader) || used > len || used % 8 != 0) return bad("used_bytes");
    const u32 nsets = h->nsets.get();
    if (nsets > kMaxSets) return bad("set count");
    if (h->flags.get() != 0 || h->reserved0.get() != 0)
      return bad("reserved fields (not zero)");
    if (!ValidBounds(info)) return bad("btree id, level or key range");
    if (expect != nullptr && !SameInfo(info, *expect))
      return DiagError(diag, Err::kCorrupt,
                       "btree node seq %llu: not the node the parent points to (expected seq %llu, btree %u, "
                       "level %u and its key range)",
                       seq, (unsigned long long)expect->seq, unsigned(expect->btree_id), unsigned(expect->level));

    u32 off = u32(sizeof(NodeHeader));
    for (u32 si = 0; si < nsets; si++) {
      auto bad_set = [&](Err e, const char* what) {
        return DiagError(diag, e, "btree node seq %llu: set %u at byte %u: %s", seq, si, off, what);
      };
      if (used - off < sizeof(SetHeader)) return bad_set(Err::kCorrupt, "set header beyond used_bytes");
      const auto* sh = reinterpret_cast<const SetHeader*>(buf_ + off);
      if (sh->magic.get() != (kSetMagic ^ info.seq)) return bad_set(Err::kCorrupt, "bad set magic");
      const u32 bytes = sh->bytes.get();
      if (bytes < sizeof(SetHeader) || bytes % 8 != 0 || bytes > used - off)
        return bad_set(Err::kCorrupt, "bad set size");
      if (sh->csum.get() != platform::Crc32cSkippingField(sh, bytes, __builtin_offsetof(SetHeader, csum)))
        return bad_set(Err::kBadChecksum, "set checksum mismatch");
      const u32 key_bytes = sh->key_bytes.get();
      const u32 nkeys = sh->nkeys.get();
      if (key_bytes > bytes - sizeof(SetHeader)) return bad_set(Err::kCorrupt, "keys extend past the set");
      if (nkeys == 0) return bad_set(Err::kCorrupt, "empty set");
      const u8* p = buf_ + off + sizeof(SetHeader);
      u32 left = key_bytes;
      Pos prev{};
      for (u32 ki = 0; ki < nkeys; ki++) {
        auto bad_key = [&](const char* what) {
          return DiagError(diag, Err::kCorrupt, "btree node seq %llu: set %u key %u: %s", seq, si, ki, what);
        };
        if (left < sizeof(KeyHeader)) return bad_key("key header past the end of the set's keys");
        const auto* k = reinterpret_cast<const KeyHeader*>(p);
        const u32 val = k->val_bytes.get();
        if (val > kMaxValueBytes) return bad_key("value larger than the maximum");
        if (KeySpace(val) > left) return bad_key("value past the end of the set's keys");
        if (k->btree_id != info.btree_id) return bad_key("key of another btree");
        if (k->type == kKeyInvalid || k->type >= kNrKeyTypes) return bad_key("unknown key type");
        if (k->type == kKeyWhiteout && val != 0) return bad_key("whiteout with a value");
        if (k->reserved.get() != 0) return bad_key("reserved field not zero");
        const Pos pos = KeyRef(k).pos();
        if (pos < info.min || pos > info.max) return bad_key("position outside the node's range");
        if (ki > 0 && !(prev < pos)) return bad_key("keys out of order");
        prev = pos;
        p += KeySpace(val);
        left -= KeySpace(val);
      }
      if (left != 0) return bad_set(Err::kCorrupt, "key bytes do not match the key count");
      off += bytes;
    }
    if (off != used) return bad("used_bytes (does not end at the last set)");
    info_ = info;
    used_ = used;
    return Status::Ok();
  }();
  if (st.ok()) st = IndexSets(0);
  if (!st.ok()) Reset();
  return st;
}

Status Node::AppendSet(const KeyInput* keys, usize n, u64 journal_seq) {
  if (n == 0) return Status::Ok();
  if (buf_ == nullptr) return Err::kInvalidArgument;
  // Check everything before writing, so a failure leaves the node as it was.
  usize need = sizeof(SetHeader);
  for (usize i = 0; i < n; i++) {
    Status st = CheckKeyInput(keys[i], info_.btree_id);
    if (!st.ok()) return st;
    if (keys[i].pos < info_.min || keys[i].pos > info_.max) return Err::kInvalidArgument;
    if (i > 0 && !(keys[i - 1].pos < keys[i].pos)) return Err::kInvalidArgument;
    need += KeySpace(keys[i].val_bytes);
  }
  if (sets_.size() >= kMaxSets || need > free_bytes()) return Err::kNoSpace;
  SetBuilder b(buf_ + used_, u32(need), info_.btree_id, info_.seq, journal_seq);
  for (usize i = 0; i < n; i++) {
    Status st = b.Add(keys[i]);
    TFS_BUG_ON(!st.ok());  // checked above
  }
  u32 bytes = b.Finish();
  Set s;
  Status st = s.Index(reinterpret_cast<const SetHeader*>(buf_ + used_), info_.btree_id);
  if (!st.ok()) return st;
  TFS_BUG_ON(!sets_.PushBack(Move(s)).ok());  // capacity reserved for kMaxSets
  used_ += bytes;
  open_ = false;
  SealHeader();
  return Status::Ok();
}

Status Node::Compact(u32 first) {
  const u32 nsets = u32(sets_.size());
  if (first >= nsets || (first + 1 == nsets && first != 0)) return Status::Ok();  // nothing to merge
  const u32 start = u32(reinterpret_cast<const u8*>(sets_[first].header()) - buf_);
  const u32 span = used_ - start;  // the merged set is never larger than its inputs
  u8* tmp = static_cast<u8*>(platform::Alloc(span, 16, false));
  if (tmp == nullptr) return Err::kNoMemory;
  u64 journal_seq = 0;
  for (u32 i = first; i < nsets; i++) journal_seq = Max(journal_seq, sets_[i].journal_seq());
  SetBuilder b(tmp, span, info_.btree_id, info_.seq, journal_seq);
  NodeIter it(*this, /*include_whiteouts=*/first != 0, first);
  for (it.SeekToFirst(); it.Valid(); it.Next()) {
    Status st = b.Add(it.key());
    TFS_BUG_ON(!st.ok());  // in order, within bounds, fits: the inputs were valid
  }
  // Build the new indexes before touching the buffer, so kNoMemory changes nothing.
  u32 bytes = b.nkeys() == 0 ? 0 : b.Finish();
  Set merged;
  if (bytes != 0) {
    Status st = merged.Index(reinterpret_cast<const SetHeader*>(tmp), info_.btree_id);
    if (!st.ok()) {
      platform::Free(tmp);
      return st;
    }
  }
  while (sets_.size() > first) sets_.PopBack();
  MemCopy(buf_ + start, tmp, bytes);
  MemSet(buf_ + start + bytes, 0, span - bytes);
  platform::Free(tmp);
  used_ = start + bytes;
  if (bytes != 0) {
    // Same bytes, new address: re-point the index (offsets and entries are relative).
    TFS_BUG_ON(!merged.Index(reinterpret_cast<const SetHeader*>(buf_ + start), info_.btree_id).ok() ||
               !sets_.PushBack(Move(merged)).ok());
  }
  open_ = false;
  compactions_++;
  if (first == 0) dead_ = 0;  // nothing dead is left
  SealHeader();
  return Status::Ok();
}

bool Node::OpenSetInsert(const KeyInput& key, u64 journal_seq, bool force) {
  Set& s = sets_.back();
  auto* h = const_cast<SetHeader*>(s.header());
  if (!s.Unseal().ok()) return false;  // a full node's one set becomes the open set
  const u32 n = s.size();
  const u32 i = s.LowerBound(key.pos);
  const bool replace = i < n && s.KeyPos(i) == key.pos;
  const u32 space = KeySpace(key.val_bytes);
  const u32 old_space = replace ? s.Key(i).space() : 0;
  const u32 key_bytes = h->key_bytes.get();
  if (space > old_space) {
    const u32 grow = space - old_space;
    // The size limit bounds the memmove of an insert; an append moves nothing,
    // so ascending keys (sequential inserts, deletes) keep filling one set.
    if ((!force && i < n && key_bytes + grow > kOpenSetBytes) || grow > free_bytes()) return false;
  }
  if (!replace && !s.Reserve(n + 1).ok()) return false;
  u8* base = reinterpret_cast<u8*>(h);
  const u32 at = i < n ? u32(reinterpret_cast<const u8*>(s.Key(i).raw()) - base) : h->bytes.get();
  u8* p = base + at;
  u8* end = buf_ + used_;  // the open set is the last thing in the node
  const usize tail = usize(end - (p + old_space));
  MemMove(p + space, p + old_space, tail);
  PackKey(p, key);
  const u32 new_used = used_ + space - old_space;
  if (new_used < used_) MemSet(buf_ + new_used, 0, used_ - new_used);
  used_ = new_used;
  h->bytes.set(h->bytes.get() + space - old_space);
  h->key_bytes.set(key_bytes + space - old_space);
  h->nkeys.set(replace ? n : n + 1);
  if (journal_seq > h->journal_seq.get()) h->journal_seq.set(journal_seq);
  s.OpenUpdate(i, key.pos, at, space, old_space, replace);
  reinterpret_cast<NodeHeader*>(buf_)->used_bytes.set(used_);
  return true;
}

bool Node::NewOpenSet(const KeyInput& key, u64 journal_seq) {
  const u32 need = u32(sizeof(SetHeader)) + KeySpace(key.val_bytes);
  if (sets_.size() >= kMaxLiveSets || need > free_bytes()) return false;
  SetBuilder b(buf_ + used_, need, info_.btree_id, info_.seq, journal_seq);
  if (!b.Add(key).ok()) return false;
  const u32 bytes = b.Finish();
  Set s;
  if (!s.Reserve(kOpenSetBytes / sizeof(KeyHeader) + 1).ok() ||
      !s.IndexOpen(reinterpret_cast<const SetHeader*>(buf_ + used_), info_.btree_id).ok())
    return false;
  // The old open set is final now: it gets the Eytzinger index.
  if (!sets_.empty()) sets_.back().Seal();
  TFS_BUG_ON(!sets_.PushBack(Move(s)).ok());  // capacity reserved for kMaxSets
  used_ += bytes;
  open_ = true;
  auto* h = reinterpret_cast<NodeHeader*>(buf_);
  h->used_bytes.set(used_);
  h->nsets.set(u16(sets_.size()));
  return true;
}

bool Node::CompactionFrees(u32 need) const {
  // Merging sets saves their headers; beyond that only shadowed versions and
  // whiteouts are dropped. Shadowing needs two sets whose ranges overlap.
  if (need <= free_bytes() + (nsets() - Min(nsets(), 1u)) * u32(sizeof(SetHeader))) return true;
  for (u32 i = 0; i < nsets(); i++) {
    const Set& a = sets_[i];
    for (u32 j = i + 1; j < nsets(); j++) {
      const Set& b = sets_[j];
      if (!(a.KeyPos(a.size() - 1) < b.KeyPos(0) || b.KeyPos(b.size() - 1) < a.KeyPos(0))) return true;
    }
  }
  // Disjoint sets: only whiteouts can go (a node that is full rarely gets here
  // twice before the tree splits it, so the scan is cheap).
  for (u32 i = 0; i < nsets(); i++)
    for (u32 k = 0; k < sets_[i].size(); k++)
      if (sets_[i].Key(k).is_whiteout()) return true;
  return false;
}

Status Node::Upsert(const KeyInput& key, u64 journal_seq) {
  if (buf_ == nullptr) return Err::kInvalidArgument;
  TFS_TRY(CheckKeyInput(key, info_.btree_id));
  if (key.pos < info_.min || key.pos > info_.max) return Err::kInvalidArgument;
  for (int attempt = 0;; attempt++) {
    if (open_ && OpenSetInsert(key, journal_seq, false)) return Status::Ok();
    if (NewOpenSet(key, journal_seq)) return Status::Ok();
    const u32 need = u32(sizeof(SetHeader)) + KeySpace(key.val_bytes);  // a new set of this key
    if (attempt == 2 || (need > free_bytes() && !CompactionFrees(need))) {
      // Compacted whole (or nothing to gain from it) and still full: a new
      // version of a key the node holds may still replace the old one in place
      // (the node's one set). Otherwise the tree splits the node.
      if (sets_.size() == 1 && sets_[0].Find(key.pos) < sets_[0].size() && OpenSetInsert(key, journal_seq, true)) {
        open_ = true;
        return Status::Ok();
      }
      return Err::kNoSpace;
    }
    // Out of sets or space. Merge the newest sets while they are small next to
    // set 0 (cheap: set 0 is not copied); otherwise rewrite the whole node, which
    // also drops shadowed versions and whiteouts.
    u32 rest = 0;
    for (u32 i = 1; i < sets_.size(); i++) rest += sets_[i].header()->bytes.get();
    const bool partial = attempt == 0 && sets_.size() >= kMaxLiveSets && sets_.size() > 1 &&
                         rest * 2 < sets_[0].header()->bytes.get();
    TFS_TRY(Compact(partial ? 1 : 0));
  }
}

Status Node::InitFrom(u32 node_size, const NodeInfo& info, const Node* const* srcs, u32 nsrcs) {
  TFS_TRY(Init(node_size, info));
  SetBuilder b(buf_ + used_, node_size_ - used_, info_.btree_id, info_.seq, 0);
  u64 journal_seq = 0;
  for (u32 i = 0; i < nsrcs; i++) {
    const Node& src = *srcs[i];
    for (u32 si = 0; si < src.nsets(); si++) journal_seq = Max(journal_seq, src.set(si).journal_seq());
    NodeIter it(src);
    for (it.Seek(info.min); it.Valid() && it.pos() <= info.max; it.Next()) {
      Status st = b.Add(it.key());
      if (!st.ok()) {
        Reset();
        return st;
      }
    }
  }
  if (b.nkeys() == 0) return Status::Ok();
  auto* sh = reinterpret_cast<SetHeader*>(buf_ + used_);
  const u32 bytes = b.Finish();
  sh->journal_seq.set(journal_seq);
  Set s;
  Status st = s.Index(sh, info_.btree_id);
  if (!st.ok()) {
    Reset();
    return st;
  }
  TFS_BUG_ON(!sets_.PushBack(Move(s)).ok());  // capacity reserved for kMaxSets
  used_ += bytes;
  SealHeader();
  return Status::Ok();
}

u32 Node::CountKeys() const {
  u32 n = 0;
  NodeIter it(*this);
  for (it.SeekToFirst(); it.Valid(); it.Next()) n++;
  return n;
}

bool Node::SplitPoint(u32 num, u32 den, Pos* left_max) const {
  u64 total = 0;
  u32 keys = 0;
  NodeIter it(*this);
  for (it.SeekToFirst(); it.Valid(); it.Next()) {
    total += it.key().space();
    keys++;
  }
  if (keys < 2) return false;
  const u64 want = total * num / den;
  u64 acc = 0;
  u32 i = 0;
  for (it.SeekToFirst(); it.Valid(); it.Next(), i++) {
    acc += it.key().space();
    // At least one key on each side.
    if ((acc >= want && i + 1 < keys) || i + 2 == keys) {
      *left_max = it.pos();
      return true;
    }
  }
  return false;
}

u32 Node::WriteImage(u8* dst, u64 new_seq, const u8* fs_uuid, u64 gen) const {
  const u32 bytes = (used_ + 4095u) & ~4095u;
  MemCopy(dst, buf_, used_);
  MemSet(dst + used_, 0, bytes - used_);
  auto* h = reinterpret_cast<NodeHeader*>(dst);
  h->seq.set(new_seq);
  h->gen.set(gen);
  h->used_bytes.set(used_);
  h->nsets.set(u16(sets_.size()));
  if (fs_uuid != nullptr) {
    MemCopy(h->fs_uuid, fs_uuid, sizeof(h->fs_uuid));
  } else {
    MemSet(h->fs_uuid, 0, sizeof(h->fs_uuid));
  }
  for (u32 i = 0; i < sets_.size(); i++) {
    const u32 off = u32(reinterpret_cast<const u8*>(sets_[i].header()) - buf_);
    auto* sh = reinterpret_cast<SetHeader*>(dst + off);
    sh->magic.set(kSetMagic ^ new_seq);
    sh->csum.set(platform::Crc32cSkippingField(sh, sh->bytes.get(), __builtin_offsetof(SetHeader, csum)));
  }
  h->csum.set(platform::Crc32cSkippingField(dst, sizeof(NodeHeader), __builtin_offsetof(NodeHeader, csum)));
  return bytes;
}

void Node::Swap(Node& o) {
  tfs::Swap(buf_, o.buf_);
  tfs::Swap(node_size_, o.node_size_);
  tfs::Swap(used_, o.used_);
  tfs::Swap(info_, o.info_);
  tfs::Swap(open_, o.open_);
  tfs::Swap(dead_, o.dead_);
  tfs::Swap(compactions_, o.compactions_);
  sets_.Swap(o.sets_);
}

void Node::SetSeq(u64 seq) {
  info_.seq = seq;
  reinterpret_cast<NodeHeader*>(buf_)->seq.set(seq);
  for (u32 i = 0; i < sets_.size(); i++)
    const_cast<SetHeader*>(sets_[i].header())->magic.set(kSetMagic ^ seq);
  // Checksums in memory are not maintained (WriteImage recomputes them).
}

void Node::OverwriteValue(KeyRef key, const void* value) {
  const u8* p = reinterpret_cast<const u8*>(key.raw());
  TFS_BUG_ON(p < buf_ + sizeof(NodeHeader) || p + key.space() > buf_ + used_);
  MemCopy(const_cast<u8*>(key.value()), value, key.val_bytes());
}

KeyRef Node::Find(const Pos& pos) const {
  // The sets are searched one after another, newest first: start loading the
  // top of every set's index now, so those misses overlap.
  for (u32 i = 0; i < sets_.size(); i++) sets_[i].PrefetchIndex();
  for (u32 i = u32(sets_.size()); i-- > 0;) {
    KeyRef k = sets_[i].FindKey(pos);
    if (!k.valid()) continue;
    return k.is_whiteout() ? KeyRef() : k;
  }
  return KeyRef();
}

NodeIter::NodeIter(const Node& node, bool include_whiteouts, u32 first_set)
    : node_(&node), whiteouts_(include_whiteouts), first_(first_set), nsets_(node.nsets()) {
  for (u32 s = 0; s < kMaxSets; s++) cur_[s] = 0;
}

void NodeIter::SettleForward() {
  for (;;) {
    bool found = false;
    u32 best = 0;
    Pos best_pos{};
    for (u32 s = first_; s < nsets_; s++) {
      const Set& set = node_->set(s);
      if (cur_[s] >= set.size()) continue;
      Pos p = set.KeyPos(cur_[s]);
      if (!found || p <= best_pos) {  // ties go to the newer set
        found = true;
        best = s;
        best_pos = p;
      }
    }
    if (!found) {
      state_ = State::kAfterEnd;
      return;
    }
    pos_ = best_pos;
    if (whiteouts_ || !node_->set(best).Key(cur_[best]).is_whiteout()) {
      state_ = State::kAt;
      at_ = best;
      return;
    }
    StepOverPos();  // deleted: look again after it
  }
}

void NodeIter::StepOverPos() {
  for (u32 s = first_; s < nsets_; s++) {
    const Set& set = node_->set(s);
    if (cur_[s] < set.size() && set.KeyPos(cur_[s]) == pos_) cur_[s]++;
  }
}

void NodeIter::StepBack() {
  for (;;) {
    bool found = false;
    u32 best = 0;
    Pos best_pos{};
    for (u32 s = first_; s < nsets_; s++) {
      if (cur_[s] == 0) continue;
      Pos p = node_->set(s).KeyPos(cur_[s] - 1);
      if (!found || p >= best_pos) {  // ties go to the newer set
        found = true;
        best = s;
        best_pos = p;
      }
    }
    if (!found) {
      state_ = State::kBeforeBegin;
      return;
    }
    pos_ = best_pos;
    // Every set's cursor moves to its lower bound of the new position.
    for (u32 s = first_; s < nsets_; s++) {
      if (cur_[s] > 0 && node_->set(s).KeyPos(cur_[s] - 1) == pos_) cur_[s]--;
    }
    if (whiteouts_ || !node_->set(best).Key(cur_[best]).is_whiteout()) {
      state_ = State::kAt;
      at_ = best;
      return;
    }
  }
}

void NodeIter::SeekToFirst() {
  for (u32 s = first_; s < nsets_; s++) cur_[s] = 0;
  SettleForward();
}

void NodeIter::SeekToLast() {
  for (u32 s = first_; s < nsets_; s++) cur_[s] = node_->set(s).size();
  StepBack();
}

void NodeIter::Seek(const Pos& pos) {
  for (u32 s = first_; s < nsets_; s++) cur_[s] = node_->set(s).LowerBound(pos);
  SettleForward();
}

void NodeIter::SeekForPrev(const Pos& pos) {
  Seek(pos);
  if (state_ == State::kAt && pos_ == pos) return;
  // Nothing visible in [pos, pos_): the answer is the last visible key before pos_
  // (or before the end when Seek ran off it; then every cursor is at its set's end).
  StepBack();
}

void NodeIter::Next() {
  switch (state_) {
    case State::kAfterEnd:
      return;
    case State::kBeforeBegin:
      SettleForward();  // cursors are all at 0
      return;
    case State::kAt:
      StepOverPos();
      SettleForward();
      return;
  }
}

void NodeIter::Prev() {
  if (state_ == State::kBeforeBegin) return;
  StepBack();
}

}  // namespace tfs::btree
