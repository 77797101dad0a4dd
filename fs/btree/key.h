// Keys in memory: positions, and read-only views of packed keys in a node buffer.
//
// A position is (btree id, inode, offset), ordered lexicographically; every btree
// operation orders, searches and bounds keys by position only. KeyRef is a view of
// one packed key (btree/format.h) inside a node buffer that the node has already
// validated; it does not own the bytes and is valid while the node's buffer is
// unchanged. KeyInput is what callers hand to the set builder: a position, a type
// and a borrowed value. All types here are trivially copyable and thread-compatible.
#ifndef TFS_BTREE_KEY_H_
#define TFS_BTREE_KEY_H_

#include "btree/format.h"
#include "platform/types.h"
#include "util/endian.h"

namespace tfs::btree {

struct Pos {
  u8 btree_id = 0;
  u64 inode = 0;
  u64 offset = 0;

  static constexpr Pos Min(u8 btree_id) { return Pos{btree_id, 0, 0}; }
  static constexpr Pos Max(u8 btree_id) { return Pos{btree_id, ~u64(0), ~u64(0)}; }
};

// <0, 0 or >0, like memcmp.
constexpr int Compare(const Pos& a, const Pos& b) {
  if (a.btree_id != b.btree_id) return a.btree_id < b.btree_id ? -1 : 1;
  if (a.inode != b.inode) return a.inode < b.inode ? -1 : 1;
  if (a.offset != b.offset) return a.offset < b.offset ? -1 : 1;
  return 0;
}
constexpr bool operator==(const Pos& a, const Pos& b) { return Compare(a, b) == 0; }
constexpr bool operator!=(const Pos& a, const Pos& b) { return Compare(a, b) != 0; }
constexpr bool operator<(const Pos& a, const Pos& b) { return Compare(a, b) < 0; }
constexpr bool operator<=(const Pos& a, const Pos& b) { return Compare(a, b) <= 0; }
constexpr bool operator>(const Pos& a, const Pos& b) { return Compare(a, b) > 0; }
constexpr bool operator>=(const Pos& a, const Pos& b) { return Compare(a, b) >= 0; }

// A key to be written: position, type and a borrowed value (val_bytes <= kMaxValueBytes).
struct KeyInput {
  Pos pos;
  u8 type = kKeyValue;
  const void* value = nullptr;
  u32 val_bytes = 0;
};

// A validated packed key in a node buffer.
class KeyRef {
 public:
  KeyRef() = default;
  explicit KeyRef(const KeyHeader* k) : k_(k) {}

  bool valid() const { return k_ != nullptr; }
  Pos pos() const { return Pos{k_->btree_id, k_->inode.get(), k_->offset.get()}; }
  u8 type() const { return k_->type; }
  bool is_whiteout() const { return k_->type == kKeyWhiteout; }
  u32 val_bytes() const { return k_->val_bytes.get(); }
  const u8* value() const { return reinterpret_cast<const u8*>(k_ + 1); }
  u32 space() const { return KeySpace(val_bytes()); }
  const KeyHeader* raw() const { return k_; }

 private:
  const KeyHeader* k_ = nullptr;
};

}  // namespace tfs::btree

#endif  // TFS_BTREE_KEY_H_
