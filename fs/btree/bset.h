// Sorted sets: building one set of packed keys, and searching it fast.
//
// A set (btree/format.h) is an immutable run of keys, strictly increasing by
// position, stored contiguously inside a node buffer. SetBuilder writes one from
// sorted input. Set is the in-memory index over a written, validated set:
//   - offsets_: the byte offset of every key in order, for O(1) random access and
//     backward iteration (keys have variable size, so the bytes alone only support
//     walking forward);
//   - a search index over *blocks* of kBlockKeys (4) consecutive keys, in
//     Eytzinger order: the implicit binary search tree laid out breadth-first,
//     1-based, so the first levels share cache lines, each step's children sit at
//     2k and 2k+1, and the search prefetches three levels ahead. Each 32-byte
//     block entry holds the block's last (inode, offset), the index and byte
//     offset of its first key, and a 16-bit fingerprint of each other key. A
//     lower_bound descends to the first block whose last key is >= pos (no pointer
//     chasing into the variable-sized keys), then walks at most three keys of that
//     block (contiguous bytes). An exact Find decides from the entry alone unless
//     pos is the block's last key or a fingerprint matches, so a set that does not
//     hold pos costs no key read, and one that does costs one. The index is 8
//     bytes a key (a quarter of one entry per key), which keeps more of it cached.
// The index is derived data: never on disk, rebuilt whenever a set is (re)written.
// A node's *open set* (btree/node.h), updated in place one key at a time, is
// indexed in order instead (IndexOpen): entries sorted, searched by binary
// search, so an insert costs a memmove of two small arrays (nothing for an
// append) rather than a rebuild; Index() seals it into the Eytzinger form.
//
// Thread safety: a Set is immutable after Index() and may be read from any number
// of threads; SetBuilder is single-threaded. Neither owns the node buffer: the node
// does, and must outlive (and not move) the sets that index it.
#ifndef TFS_BTREE_BSET_H_
#define TFS_BTREE_BSET_H_

#include "btree/format.h"
#include "btree/key.h"
#include "platform/types.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::btree {

// Writes one set into [dst, dst + cap): header first, keys as they are added.
class SetBuilder {
 public:
  // `dst` must be 8-byte aligned. Nothing is valid until Finish().
  SetBuilder(u8* dst, u32 cap, u8 btree_id, u64 node_seq, u64 journal_seq);

  // Appends the next key. kInvalidArgument: wrong btree, not strictly after the
  // previous key, bad type, a whiteout with a value, or a value over
  // kMaxValueBytes. kNoSpace: the key does not fit in `cap`. Nothing is written on
  // error.
  [[nodiscard]] Status Add(const KeyInput& key);
  [[nodiscard]] Status Add(KeyRef key);

  u32 nkeys() const { return nkeys_; }
  // Bytes the set occupies so far (header + keys), a multiple of 8.
  u32 bytes() const { return used_; }
  // Fills in the header and checksum; returns the set's size in bytes. A set with
  // no keys is not a valid set: callers do not keep it.
  u32 Finish();

 private:
  u8* dst_;
  u32 cap_;
  u8 btree_id_;
  u64 node_seq_;
  u64 journal_seq_;
  u32 used_;
  u32 nkeys_ = 0;
  Pos last_{};
};

// Packs `key` (already checked) at dst: KeySpace(key.val_bytes) bytes.
void PackKey(u8* dst, const KeyInput& key);

// Validates a key (type, value size, btree) as SetBuilder::Add does, without order.
Status CheckKeyInput(const KeyInput& key, u8 btree_id);

class Set {
 public:
  Set() = default;
  Set(Set&&) = default;
  Set& operator=(Set&&) = default;
  Set(const Set&) = delete;
  Set& operator=(const Set&) = delete;

  // Builds the index of a set that has been validated (or just built). kNoMemory
  // on allocation failure (the Set is then empty).
  [[nodiscard]] Status Index(const SetHeader* hdr, u8 btree_id);

  // Indexes a set in order (an open set: see above). kNoMemory as Index.
  [[nodiscard]] Status IndexOpen(const SetHeader* hdr, u8 btree_id);
  // Makes room for indexing `n` keys of an open set (Vector::Grow: geometric,
  // so appending key after key is amortized O(1)).
  [[nodiscard]] Status Reserve(u32 n);
  // An open set's key changed in place (the node moved the bytes; `hdr` counts
  // are already updated): key i, at byte offset `at` from the set header, now
  // has `space` bytes; `replace`: it replaced a key of `old_space` bytes at the
  // same position, else it was inserted before the old key i. Capacity must have
  // been reserved (Reserve(size() + 1)).
  void OpenUpdate(u32 i, const Pos& pos, u32 at, u32 space, u32 old_space, bool replace);
  bool open() const { return open_; }
  // Starts loading the first levels of the search into the cache (a hint): the
  // Eytzinger tree's top four levels, or the open form's first three probes.
  void PrefetchIndex() const {
    const uptr e = open_ ? uptr(sorted_.data()) : uptr(eytz_.data());
    for (uptr line = 0; line < 256; line += 64) __builtin_prefetch(reinterpret_cast<const void*>(e + line));
  }
  // Turns an open set's index into the Eytzinger form. Best effort: without
  // memory for it the set keeps its in-order index, which is just as correct.
  void Seal();
  // The reverse, for a sealed set that becomes a node's open set again.
  // kNoMemory leaves the set (and its index) as it was.
  [[nodiscard]] Status Unseal();

  const SetHeader* header() const { return hdr_; }
  u32 size() const { return nkeys_; }
  u64 journal_seq() const { return hdr_->journal_seq.get(); }
  // The i-th key in order, i < size().
  KeyRef Key(u32 i) const {
    return KeyRef(reinterpret_cast<const KeyHeader*>(reinterpret_cast<const u8*>(hdr_) + offsets_[i]));
  }
  Pos KeyPos(u32 i) const { return Key(i).pos(); }
  // Index of the first key >= pos, or size() if there is none.
  u32 LowerBound(const Pos& pos) const;
  // Index of the key at exactly pos, or size(). A miss reads only the index
  // (unless a 16-bit fingerprint collides: then one block of keys).
  u32 Find(const Pos& pos) const;
  // The key at exactly pos, or an invalid KeyRef; reads the index and, for a
  // hit, the keys of its block up to it.
  KeyRef FindKey(const Pos& pos) const;

 private:
  static constexpr u32 kBlockKeys = 4;  // keys per block of the sealed index
  struct Entry {  // open form: one per key, in order
    u64 inode;
    u64 offset;
  };
  struct Block {  // sealed form: one per kBlockKeys keys; 32 bytes, two per line
    u64 inode;    // the block's last key
    u64 offset;
    u32 first;      // in-order index of its first key
    u32 first_off;  // byte offset of its first key from the header
    u16 fp[kBlockKeys - 1];  // Fingerprint() of each key before the last
    u16 reserved;
  };
  static_assert(sizeof(Block) == 32, "two blocks per cache line");
  static u16 Fingerprint(u64 inode, u64 offset);
  // Sealed form: the slot of the first block whose last key is >= pos (0: none).
  u64 LowerBoundSlot(const Pos& pos) const;
  u32 FindInBlock(u64 k, const Pos& pos, KeyRef* out) const;
  // Open form: the in-order index of the first entry >= pos.
  u32 LowerBoundOpen(const Pos& pos) const;

  const SetHeader* hdr_ = nullptr;
  u8 btree_id_ = 0;
  bool open_ = false;    // in-order index (IndexOpen) rather than Eytzinger
  u32 nkeys_ = 0;
  u32 nblocks_ = 0;      // sealed form: blocks in eytz_
  // What a lookup reads first (above, and the index) shares the Set's first line.
  Vector<Block> eytz_;   // sealed form: [1, nblocks_] in Eytzinger order, [0] unused
  Vector<Entry> sorted_;  // open form: [0, nkeys_) in order
  Vector<u32> offsets_;  // in-order key offsets from hdr_
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_BSET_H_
