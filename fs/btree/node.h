// An in-memory btree node: one node buffer, its validated sets and their indexes.
//
// Parse() takes bytes read from a device as hostile: it copies them, then checks
// every header field, each set's bounds, magic and checksum, every key's size,
// btree, type and order, and that every key lies inside the node's [min, max];
// anything wrong is a kCorrupt-class Status (kBadMagic, kBadChecksum, kBadVersion
// or kCorrupt) with a Diag naming the set and key, never a crash or a read outside
// the buffer. Updates append a new sorted set (AppendSet), so one batch of updates
// costs a copy of those keys only, not a memmove of the node; Compact() merges sets
// into one when the node runs out of sets or space. Lookups and iteration see the
// newest version of each position: a newer set shadows older ones, and a whiteout
// hides every older version.
//
// Ownership: a Node owns its buffer (platform::Alloc, node_size bytes, 4 KiB
// aligned). Thread safety: none inside; readers may share a Node while nobody
// modifies it (the btree's node locks, planned, provide that). KeyRefs and
// NodeIters are invalidated by AppendSet, Compact and destruction.
#ifndef TFS_BTREE_NODE_H_
#define TFS_BTREE_NODE_H_

#include "btree/bset.h"
#include "btree/format.h"
#include "btree/key.h"
#include "platform/types.h"
#include "util/diag.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::btree {

inline constexpr u8 kMaxLevel = 7;  // leaf = 0; eight levels of 256 KiB nodes is ample
// Key bytes the open set may hold and still take an insert in its middle (see
// Node::Upsert; appends may grow it further).
inline constexpr u32 kOpenSetBytes = 2048;
// Sets a node keeps in memory before Upsert merges them (the format allows
// kMaxSets): every lookup searches each set, so fewer sets make reads cheaper
// and updates dearer (more merging).
inline constexpr u32 kMaxLiveSets = 4;

// Identity and key range of a node (the bounds are inclusive and share the btree).
struct NodeInfo {
  u8 btree_id = 0;
  u8 level = 0;
  u64 seq = 0;
  u64 gen = 0;  // NodeHeader::gen as parsed (not part of the identity: SameInfo ignores it)
  Pos min{};
  Pos max{};
};

class Node {
 public:
  Node() = default;
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // A node with no keys. kInvalidArgument: node_size not a power of two in
  // [kMinNodeSize, kMaxNodeSize], a bad btree id or level, min > max or bounds
  // of another btree. kNoMemory.
  [[nodiscard]] Status Init(u32 node_size, const NodeInfo& info);

  // Copies and validates a node read from disk; `len` is the node size. When
  // `expect` is not null the node must have exactly that identity and range (what
  // the parent's pointer recorded). On error the Node is left empty.
  [[nodiscard]] Status Parse(const void* buf, usize len, const NodeInfo* expect, Diag* diag);

  // Appends a set of `n` keys strictly increasing by position, all inside
  // [min, max]. kInvalidArgument / kTooBig for bad input; kNoSpace when the keys do
  // not fit or the node already has kMaxSets sets (compact first); kNoMemory.
  // Nothing changes on error. n == 0 is a no-op.
  [[nodiscard]] Status AppendSet(const KeyInput* keys, usize n, u64 journal_seq);

  // Merges sets [first, nsets()) into one set holding the newest version of each
  // position. With first == 0 the whole node is rewritten and whiteouts are dropped
  // (nothing older remains for them to hide); otherwise whiteouts are kept. kNoMemory
  // leaves the node unchanged.
  [[nodiscard]] Status Compact(u32 first = 0);

  // Sets one key (a value, or a whiteout to delete) in the node's *open set*: the
  // newest set, updated in place with an in-order index (bset.h), so a single
  // update costs a memmove of at most kOpenSetBytes of keys and of its index
  // entries, never a new set; an append (a key above all of the open set's) moves
  // nothing and may grow it past that. When the open set is full a new one is
  // started (the old one sealed); when the node has kMaxLiveSets sets the newest
  // are merged (Compact(1), or Compact(0) once they reach half of set 0); when it
  // runs out of space it is compacted whole if that can free room
  // (CompactionFrees).
  // kNoSpace: the key does not fit even then (the caller splits the node); the
  // node's contents are unchanged (though it may have been compacted).
  // kInvalidArgument / kTooBig for bad input. Checksums in memory go stale:
  // WriteImage() computes them.
  [[nodiscard]] Status Upsert(const KeyInput& key, u64 journal_seq);

  // A new node with info `info` holding the newest visible version of every key
  // of `srcs` (in order of their ranges) inside [info.min, info.max], whiteouts
  // dropped: how splits and merges build nodes. kNoSpace if they do not fit.
  [[nodiscard]] Status InitFrom(u32 node_size, const NodeInfo& info, const Node* const* srcs, u32 nsrcs);

  // The position of the last key of the first part when this node's visible keys
  // are split so that the first part holds about num/den of the bytes (at least
  // one key on each side); false if the node has fewer than two keys.
  bool SplitPoint(u32 num, u32 den, Pos* left_max) const;
  // Visible keys (counts every set; O(keys)).
  u32 CountKeys() const;

  // Writes the node as it goes to disk into dst (at least used_bytes(), 4 KiB
  // aligned, zero-padded to a 4 KiB multiple) under a new seq: every set magic and
  // checksum and the header are recomputed in the copy, and the header names
  // filesystem `fs_uuid` (16 bytes; null: zeros). Returns the bytes to write.
  u32 WriteImage(u8* dst, u64 new_seq, const u8* fs_uuid = nullptr, u64 gen = 0) const;
  // Exchanges the contents of two nodes (a rebuilt node replaces a cached one).
  void Swap(Node& other);
  // Renames the in-memory node to `seq` (after its image was written under it).
  void SetSeq(u64 seq);
  // Overwrites the value of a key of this node in place; the new value must have
  // the key's current length (interior nodes: a child pointer moved).
  void OverwriteValue(KeyRef key, const void* value);

  // The newest visible key at exactly pos; an invalid KeyRef if there is none or
  // it was deleted.
  KeyRef Find(const Pos& pos) const;

  // Bytes known to be dead (deleted versions and their whiteouts) since the last
  // full compaction: the tree notes them to find underfull nodes cheaply.
  void NoteDead(u32 bytes) { dead_ += bytes; }
  // Compactions this node has done (a counter for statistics).
  u64 compactions() const { return compactions_; }
  u32 live_estimate() const { return used_ - Min(dead_, used_); }

  const NodeInfo& info() const { return info_; }
  const u8* data() const { return buf_; }
  u32 node_size() const { return node_size_; }
  u32 used_bytes() const { return used_; }
  u32 free_bytes() const { return node_size_ - used_; }
  u32 nsets() const { return u32(sets_.size()); }
  const Set& set(u32 i) const { return sets_[i]; }

 private:
  void Reset();
  void SealHeader();
  Status IndexSets(u32 from);
  // Inserts or replaces `key` in the newest set; false if it has no room for it
  // (`force`: ignore the open set's size limit, only the node's space counts).
  bool OpenSetInsert(const KeyInput& key, u64 journal_seq, bool force);
  // Starts a new open set holding `key`; false if there is no set or space left.
  bool NewOpenSet(const KeyInput& key, u64 journal_seq);
  // Whether Compact(0) could leave `need` bytes free: false when the sets are
  // disjoint and hold no whiteouts (then it would only copy the node).
  bool CompactionFrees(u32 need) const;

  // The sets, oldest first, held inline: a lookup reaches a set's index through
  // the node itself, one dependent cache miss fewer than through an array of
  // its own (the tree's leaves are mostly not in the CPU caches). This makes a
  // Node about 1.5 KiB: allocate it, do not put it on a (kernel) stack.
  class SetArray {
   public:
    u32 size() const { return n_; }
    bool empty() const { return n_ == 0; }
    Set& operator[](u32 i) { return sets_[i]; }
    const Set& operator[](u32 i) const { return sets_[i]; }
    Set& back() { return sets_[n_ - 1]; }
    [[nodiscard]] Status PushBack(Set&& s) {
      if (n_ >= kMaxSets) return Err::kNoSpace;
      sets_[n_++] = Move(s);
      return Status::Ok();
    }
    void PopBack() { sets_[--n_] = Set(); }  // frees its index
    void Clear() {
      while (n_ > 0) PopBack();
    }
    void Swap(SetArray& o) {
      for (u32 i = 0; i < Max(n_, o.n_); i++) {
        Set tmp(Move(sets_[i]));
        sets_[i] = Move(o.sets_[i]);
        o.sets_[i] = Move(tmp);
      }
      tfs::Swap(n_, o.n_);
    }

   private:
    u32 n_ = 0;
    Set sets_[kMaxSets];
  };

  u8* buf_ = nullptr;
  u32 used_ = 0;
  u32 node_size_ = 0;
  SetArray sets_;
  bool open_ = false;  // the newest set is the open set (its checksum is stale)
  u32 dead_ = 0;       // see NoteDead
  u64 compactions_ = 0;
  NodeInfo info_{};
};

// Merge iterator over sets [first_set, nsets) of one node: yields each position
// once, the version from the newest set holding it, skipping positions whose
// newest version is a whiteout unless `include_whiteouts`. Moves both ways; after
// running off either end, Next/Prev from there resume at the nearest key. Holds
// per-set cursors: small, no allocation, safe on a kernel stack.
class NodeIter {
 public:
  explicit NodeIter(const Node& node, bool include_whiteouts = false, u32 first_set = 0);

  void SeekToFirst();
  void SeekToLast();
  // First key >= pos.
  void Seek(const Pos& pos);
  // Last key <= pos.
  void SeekForPrev(const Pos& pos);
  void Next();
  void Prev();

  bool Valid() const { return state_ == State::kAt; }
  // The current key and its position; only while Valid().
  KeyRef key() const { return node_->set(at_).Key(cur_[at_]); }
  Pos pos() const { return pos_; }
  // The set the current key comes from.
  u32 set_index() const { return at_; }

 private:
  enum class State : u8 { kAt, kBeforeBegin, kAfterEnd };
  // Moves to the first visible key at or after the cursors.
  void SettleForward();
  // Moves every cursor that is at pos_ past it.
  void StepOverPos();
  // Moves to the last visible key before the cursors.
  void StepBack();

  const Node* node_;
  bool whiteouts_;
  u32 first_;
  u32 nsets_;
  State state_ = State::kAfterEnd;
  u32 at_ = 0;
  Pos pos_{};
  u32 cur_[kMaxSets];  // per set: index of its first key >= pos_ (lower bound)
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_NODE_H_
