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
//   - packed blocks, when they fit: if every key of the set maps to one 64-bit
//     number, (inode - base inode) << obits | (offset - base offset), which keeps
//     their order (bcachefs packs keys per node by the same idea, bkey_format),
//     a block entry holds that number: 16 bytes, four per line, 4 bytes a key
//     (half the wide form's memory, so more of it stays cached), and prefetching
//     three levels ahead costs two lines rather than four. Sets whose keys share an inode (a file's extents, the
//     benchmark's keys) or whose inodes and offsets are both narrow pack; others
//     keep the wide 32-byte entries. A probe outside the set's packed range is
//     answered without touching the index.
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

  // Which sealed form Index builds: the packed one when the keys fit (kAuto), or
  // always the wide one (kWide: for tests of that form on any keys).
  enum class Form : u8 { kAuto, kWide };
  // Builds the index of a set that has been validated (or just built). kNoMemory
  // on allocation failure (the Set is then empty).
  [[nodiscard]] Status Index(const SetHeader* hdr, u8 btree_id, Form form = Form::kAuto);

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
  // Sealed with packed blocks (see above).
  bool packed() const { return packed_; }
  // Starts loading the first levels of the search into the cache (a hint): the
  // Eytzinger tree's top three (wide) or four (packed) levels, or the open
  // form's first three probes.
  void PrefetchIndex() const {
    const uptr e = uptr(index_.data());
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
    u16 stride;  // every key of the block is this many bytes (0: they differ)
  };
  static_assert(sizeof(Block) == 32, "two blocks per cache line");
  struct PackedBlock {  // packed sealed form; 16 bytes, four per line
    u64 key;   // the block's last key, packed (Pack)
    u32 loc;   // its first key's byte offset / 8, and the block's in-order index << kLocBits
    u8 fp[kBlockKeys - 1];  // low byte of Fingerprint() of each key before the last
    u8 stride8;  // every key of the block is this many bytes / 8 (0: they differ, or over 2040)
  };
  static_assert(sizeof(PackedBlock) == 16, "four packed blocks per cache line");
  static constexpr u32 kLocBits = 17;  // byte offsets / 8 within the largest node
  static_assert(kMaxNodeSize / 8 <= (1u << kLocBits), "a key offset / 8 fits kLocBits");
  static_assert(kMaxNodeSize / (KeySpace(0) * kBlockKeys) < (1u << (32 - kLocBits)),
                "a block index fits above kLocBits");
  static u16 Fingerprint(u64 inode, u64 offset);
  // Packed form: pos as the set's 64-bit number; false if no key of the set
  // can be at pos (outside its inode or offset range).
  bool Pack(const Pos& pos, u64* out) const;
  // Packed form: the number whose lower bound among the keys is pos's, or false
  // when every key is < pos. Only for pos of this btree at or after the first key's
  // inode.
  bool PackLowerBound(const Pos& pos, u64* out) const;
  // Sealed forms: the slot of the first block whose last key is >= pos (0: none).
  u64 LowerBoundSlot(const Pos& pos) const;
  u64 LowerBoundSlotPacked(u64 key) const;
  // The in-order index and byte offset of the first key of the block at slot k.
  void BlockStart(u64 k, u32* first, u32* first_off) const;
  u32 FindInBlock(u64 k, const Pos& pos, KeyRef* out) const;
  u32 FindInPackedBlock(u64 k, u64 key, const Pos& pos, KeyRef* out) const;
  // The key at exactly pos from the keys of one block, the one at index `want`
  // (in the block) or later. With `stride` (bytes, the keys' common size) key
  // `want` is found at once, without walking the keys before it (a line each).
  u32 FindFromKey(u32 first, u32 first_off, u32 last, u32 want, u32 stride, const Pos& pos, KeyRef* out) const;
  // The stride of the block of `count` keys from key `first` (0: sizes differ).
  u32 BlockStride(u32 first, u32 count) const;
  // Open form: the in-order index of the first entry >= pos.
  u32 LowerBoundOpen(const Pos& pos) const;

  // The index of whichever form the set is in, one allocation: Entry[nkeys_]
  // (open), Block[nblocks_ + 1] or PackedBlock[nblocks_ + 1] (sealed, [0]
  // unused, [1..] in Eytzinger order). One vector rather than one per form keeps
  // the Set small: a node's sets sit inline in the CachedNode, and the first
  // ones (with their index pointers) in the lines a descent prefetches.
  template <typename T>
  T* As() const {
    return reinterpret_cast<T*>(const_cast<u8*>(index_.data()));
  }
  template <typename T>
  [[nodiscard]] Status ResizeIndex(usize n) {
    return n > usize(-1) / sizeof(T) ? Status(Err::kNoMemory) : index_.Resize(n * sizeof(T));
  }

  // What a lookup reads first comes first.
  const SetHeader* hdr_ = nullptr;
  u8 btree_id_ = 0;
  bool open_ = false;    // in-order index (IndexOpen) rather than Eytzinger
  bool packed_ = false;  // sealed, with packed blocks
  u8 obits_ = 0;         // packed form: bits of the offset field (0..64)
  u32 nkeys_ = 0;
  u32 nblocks_ = 0;      // sealed form: blocks in the index
  Vector<u8> index_;
  u64 base_inode_ = 0;   // packed form: the first key's inode
  u64 base_offset_ = 0;  // packed form: the smallest offset of any key
  Vector<u32> offsets_;  // in-order key offsets from hdr_
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_BSET_H_
