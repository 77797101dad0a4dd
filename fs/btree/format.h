// On-disk btree node format (documented in docs/format/btree.md).
//
// A btree node is one buffer of node_size bytes (a power of two, 4 KiB..1 MiB):
//
//   [0, 96)            NodeHeader: identity (btree id, level, seq), key bounds,
//                      how many sets and bytes are in use, and a CRC-32C of itself
//   [96, used_bytes)   nsets sorted sets, oldest first, each 8-byte aligned: a
//                      32-byte SetHeader with its own CRC-32C, then keys, then zero
//                      padding up to SetHeader.bytes
//   [used_bytes, end)  not part of the node (never read, never checksummed)
//
// A key is a 24-byte KeyHeader (btree id, type, value length, inode, offset)
// followed by val_bytes of value padded to 8. Keys within a set are strictly
// increasing by position; a newer set's key shadows an older set's key at the same
// position, and a whiteout (kKeyWhiteout) hides it. Sets carry their own checksum so
// that a later set can be appended (and written) without touching earlier ones; the
// set magic is derived from the node's seq so that a stale set left in the buffer by
// an earlier node never validates. All integers little-endian; sizes checked below.
#ifndef TFS_BTREE_FORMAT_H_
#define TFS_BTREE_FORMAT_H_

#include "platform/types.h"
#include "util/endian.h"

namespace tfs::btree {

inline constexpr u64 kNodeMagic = 0x4245455254534654ull;  // "TFSTREEB" as LE bytes
inline constexpr u64 kSetMagic = 0x5445534e53465454ull;                    // "TTFSNSET" as LE bytes
inline constexpr u16 kNodeVersion = 1;

inline constexpr u32 kMinNodeSize = 4096;
inline constexpr u32 kMaxNodeSize = 1024 * 1024;
inline constexpr u32 kDefaultNodeSize = 256 * 1024;
// Sets per node: a bound on merge work per lookup. The in-memory node compacts
// before it would exceed it.
inline constexpr u32 kMaxSets = 16;
// Largest value of one key, in bytes. A 4 KiB node holds exactly one key of this
// size (96 + 32 + 24 + 2048 = 2200 bytes; two would need 4272).
inline constexpr u32 kMaxValueBytes = 2048;

// Btree ids. A node holds keys of one btree only. Numbers are on disk: never reuse.
enum BtreeId : u8 {
  kBtreeInodes = 0,
  kBtreeDirents = 1,
  kBtreeExtents = 2,
  kBtreeXattrs = 3,
  kBtreeAlloc = 4,
  kBtreeBackpointers = 5,
  kBtreeReconcile = 6,
  kBtreeTest = 7,  // tests and benchmarks only
  kNrBtreeIds = 8,
};

// Inode numbers -- the first word of a key in the inodes, dirents, extents
// and xattrs btrees, a directory entry's target, a backpointer's owner --
// stay below 2^56: the reconcile index keeps its destination in a key's top
// byte (docs/design/tiering.md, step 22-3). A format rule: the parsers refuse
// a number past it, the mount refuses an inode key past it, the inode
// allocator gives ENOSPC at it, fsck deletes what is past it.
inline constexpr u64 kInoLimit = u64(1) << 56;

// Key types. 0 is never valid. Numbers are on disk: never reuse.
enum KeyType : u8 {
  kKeyInvalid = 0,
  kKeyWhiteout = 1,  // deleted: hides older versions at this position; no value
  kKeyValue = 2,     // opaque value bytes (generic; owners add typed keys later)
  kNrKeyTypes = 3,
};

struct NodeHeader {  // 96 bytes
  Le64 magic;        // kNodeMagic
  Le32 csum;         // CRC-32C of these 96 bytes with this field zero
  Le16 version;      // kNodeVersion
  u8 btree_id;       // BtreeId
  u8 level;          // 0 = leaf
  Le64 seq;          // identity of this node's contents; set magic = kSetMagic ^ seq
  Le32 node_size;    // bytes of the whole buffer, power of two, kMinNodeSize..kMaxNodeSize
  Le32 used_bytes;   // header + sets, multiple of 8, <= node_size
  Le16 nsets;        // 1..kMaxSets
  Le16 flags;        // 0 (reserved)
  Le32 reserved0;    // 0
  Le64 min_inode;    // smallest position a key may have (inclusive)
  Le64 min_offset;
  Le64 max_inode;    // largest position a key may have (inclusive)
  Le64 max_offset;
  // The filesystem's uuid (the superblock's fs_uuid): identity is checked
  // through the parent's pointer (seq), so reads ignore it; fsck's node scan
  // takes only nodes of this filesystem from slots no pointer names.
  u8 fs_uuid[16];
  // The roots gen of the checkpoint that wrote this image (its roots block's,
  // had it reached every member; 0: not recorded). Only says when a copy was
  // written -- fsck's test of a damaged copy on a stale member (RootsFormat::
  // stale_since) -- never which copy is current (the parent's seq does).
  Le64 gen;
};
static_assert(sizeof(NodeHeader) == 96, "node header size");
static_assert(__builtin_offsetof(NodeHeader, csum) == 8, "node csum offset");
static_assert(__builtin_offsetof(NodeHeader, min_inode) == 40, "node bounds offset");
static_assert(__builtin_offsetof(NodeHeader, fs_uuid) == 72, "node uuid offset");

struct SetHeader {   // 32 bytes, 8-byte aligned within the node
  Le64 magic;        // kSetMagic ^ node seq
  Le32 csum;         // CRC-32C of the whole set (`bytes`) with this field zero
  Le32 bytes;        // header + keys + zero padding, multiple of 8
  Le32 key_bytes;    // bytes of keys after the header
  Le32 nkeys;        // keys in this set (>= 1)
  Le64 journal_seq;  // newest journal entry whose updates this set holds (0 = none)
};
static_assert(sizeof(SetHeader) == 32, "set header size");
static_assert(__builtin_offsetof(SetHeader, csum) == 8, "set csum offset");

struct KeyHeader {   // 24 bytes, then val_bytes of value padded to 8
  u8 btree_id;       // equals the node's
  u8 type;           // KeyType
  Le16 val_bytes;    // 0..kMaxValueBytes; 0 for whiteouts
  Le32 reserved;     // 0
  Le64 inode;
  Le64 offset;
};
static_assert(sizeof(KeyHeader) == 24, "key header size");

// Bytes one key occupies in a set.
inline constexpr u32 KeySpace(u32 val_bytes) { return u32(sizeof(KeyHeader)) + ((val_bytes + 7) & ~7u); }
inline constexpr u32 kMaxKeySpace = KeySpace(kMaxValueBytes);
static_assert(sizeof(NodeHeader) + sizeof(SetHeader) + kMaxKeySpace <= kMinNodeSize,
              "the smallest node holds one key of the largest size");

// ---------------------------------------------------------------------------
// Tree structure (docs/format/btree.md, "Pointers and roots").

// Where a node lives: the value of every key in an interior node (the key's
// position is the child's max), and of each root. 72 bytes (pointer format 2,
// filesystem format version 7). A node has `nr` copies, each the same bytes
// (one image, one seq) at offset[i] of member[i]; the members are distinct,
// entries past `nr` are unused (member kNoMember, offset 0). nr is 1..4, 0
// only in a roots block, for an empty tree. Parse rules: NodePtrProblem
// (tree.h).
inline constexpr u8 kNoMember = 0xff;  // an unused copy entry
inline constexpr u32 kMaxNodeCopies = 4;
struct NodePtrFormat {
  u8 member[kMaxNodeCopies];  // each copy's device index; unused: kNoMember
  u8 level;                   // the child's level (parent level - 1)
  u8 btree_id;                // the child's btree
  u8 nr;                      // copies: 1..kMaxNodeCopies (0: an empty tree's root)
  u8 reserved0;               // 0
  Le64 offset[kMaxNodeCopies];  // byte offset of each copy on its member (node_size aligned; unused: 0)
  Le64 seq;          // the child's NodeHeader.seq: a unique id of this node version
  Le64 min_inode;    // the child's min position (its max is the key's position)
  Le64 min_offset;
  Le64 reserved1;    // 0
};
static_assert(sizeof(NodePtrFormat) == 72, "node pointer size");
static_assert(__builtin_offsetof(NodePtrFormat, offset) == 8, "node pointer offsets");
static_assert(__builtin_offsetof(NodePtrFormat, seq) == 40, "node pointer seq");

// The roots block: two 4 KiB slots on every member that may hold btree nodes,
// written alternately (FUA) at the end of each btree checkpoint. Mount uses the
// valid slot with the highest `gen` across all members.
inline constexpr u64 kRootsMagic = 0x53544f4f52534654ull;  // "TFSROOTS" as LE bytes
inline constexpr u64 kRootsOffset = 64 * 1024;             // slot 0; slot 1 follows
inline constexpr u32 kRootsSlotSize = 4096;
// The roots block's own version (node headers keep kNodeVersion): 2 since
// node pointers hold copies (format version 7).
inline constexpr u16 kRootsVersion = 2;

struct RootsFormat {  // kRootsSlotSize bytes
  Le64 magic;         // kRootsMagic
  Le32 csum;          // CRC-32C of the whole slot with this field zero
  Le16 version;       // kRootsVersion
  Le16 nroots;        // kNrBtreeIds
  u8 fs_uuid[16];     // the filesystem's uuid: a stale block of another fs never matches
  Le64 gen;           // bumped by every checkpoint; the newest valid slot wins
  Le64 journal_seq;   // every journal entry up to this one is contained in the trees
  Le64 node_seq_hi;   // node seqs below this may exist on disk; new ones start above
  // The node pointers this block reaches (roots and every interior node's
  // children) whose copies' durability falls short of metadata_replicas:
  // images written degraded (docs/format/btree.md "Degraded nodes").
  Le64 degraded_nodes;
  NodePtrFormat roots[kNrBtreeIds];
  // Per member: 0, or the first roots gen the member missed (its newest valid
  // roots block was older than the newest of the filesystem) while no fsck -y
  // has verified its copies since -- node copies on it written at that gen or
  // later (NodeHeader::gen) may never have been written. Nothing reads an
  // entry as damage, only as where damage is expected (fsck's notes,
  // docs/format/btree.md "Stale members").
  Le64 stale_since[32];
  // Per member: the last gen of that window (the newest gen when the member
  // was found behind); copies of nodes written after it were written to it.
  Le64 stale_until[32];
  // Per member: how many of those degraded pointers name a copy on it. A
  // degraded mount without member m is safe for the btree only when
  // degraded_on[m] is 0 (one of them may have no other copy).
  Le32 degraded_on[32];
  u8 reserved[kRootsSlotSize - 64 - kNrBtreeIds * sizeof(NodePtrFormat) - 2 * 32 * 8 - 32 * 4];
};
static_assert(sizeof(RootsFormat) == kRootsSlotSize, "roots slot size");
static_assert(__builtin_offsetof(RootsFormat, roots) == 64, "roots layout");
static_assert(__builtin_offsetof(RootsFormat, degraded_nodes) == 56, "roots layout");
static_assert(__builtin_offsetof(RootsFormat, degraded_on) == 1152, "roots layout");

// The journal key of a btree update (journal key type kKeyBtree): one KeyHeader
// exactly as in a node (btree id, type, value length, position), then the value.

}  // namespace tfs::btree

#endif  // TFS_BTREE_FORMAT_H_
