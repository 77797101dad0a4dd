// An extent's policy and the members it is read against (docs/design/
// tiering.md, steps 22-3b and 22-3c).
//
// Every extent records the options it was written under (Extent::policy:
// its foreground and background targets, its replicas, its compression, and
// whether zstd was tried on its blocks and saved nothing). That makes the
// reconcile index a function of the extent and the member table alone: the
// data path's edit sites (a repair, a punch, fsck) cannot read posix's
// inodes, and need not.
//
// PolicyOf is the one reader of those bytes: they are hostile like the
// rest of the value, but a bad policy never makes an extent unparseable
// (fsck deletes extents that do not parse: data lost). It is read as unset
// -- the filesystem's options -- and reported (fsck resets it).
//
// MemberTable is what the policy is read against: the members, their groups
// and durability, the superblock's targets and defaults. Plain values, built
// once per open (the data path's, fsck's); pure functions. Kernel-safe.
#ifndef TFS_DATA_POLICY_H_
#define TFS_DATA_POLICY_H_

#include "data/extent.h"
#include "dev/device_set.h"
#include "platform/types.h"
#include "sb/superblock.h"

namespace tfs::data {

// Target codes, in Policy::fg_target and bg_target (and posix's inode
// options, which use the same values): 0 unset (the filesystem's target),
// kTargetMember + m member m, kTargetGroup | m the group of member m.
inline constexpr u16 kTargetMember = 1;
inline constexpr u16 kTargetGroup = 0x100;
// Policy::compression: 0 the filesystem's, else one of these.
inline constexpr u8 kCompressNone = 1;
inline constexpr u8 kCompressZstd = 2;
inline constexpr u8 kPolicyReplicasMax = kMaxPtrs;
// Policy::flags: zstd was tried on these blocks and did not save a block
// (the write path's or the reconcile engine's attempt): compression work
// on them is done.
inline constexpr u8 kPolicyIncompressible = 1;

struct MemberTable {
  u32 count = 0;                               // members (sb nr_members, the device set's size)
  dev::DevMask group[dev::kMaxDevices] = {};   // per member: every member of its group (itself included)
  u8 durability[dev::kMaxDevices] = {};        // per member: the copies it counts as (0: cache only)
  dev::DevMask durable = 0;                    // members of nonzero durability
  dev::DevMask fg_target = 0;                  // the superblock's targets, resolved (0: names nothing)
  dev::DevMask bg_target = 0;
  dev::DevMask promote_target = 0;
  u32 data_replicas = 1;                       // the superblock's data_replicas (1..kMaxPtrs)
  bool compress = false;                       // the superblock's compression_type is zstd
};

// The table of a filesystem: devs (labels, hence groups) and sb (the rest).
void BuildMemberTable(const dev::DeviceSet& devs, const sb::Superblock& sb, MemberTable* out);

// A target code's canonical form: a group as kTargetGroup | its lowest
// member, so that one group has one code. 0 for 0 and for a code that
// names no member of t (what PolicyOf refuses).
u16 CanonicalTarget(const MemberTable& t, u16 code);
// The members a nonzero valid code names (0 for anything else).
dev::DevMask TargetMembers(const MemberTable& t, u16 code);

// e's policy with its target codes canonical: true. False -- *out the
// unset policy (all 0) -- when a byte is one this filesystem cannot hold:
// a target code naming no member, replicas past kPolicyReplicasMax,
// compression past kCompressZstd, an unknown flag, the reserved byte set.
bool PolicyOf(const Extent& e, const MemberTable& t, Policy* out);

// --- What an extent needs (step 22-3c) --------------------------------------
//
// ReconcileOf(t, e) is the one function the reconcile index (22-3d), fsck's
// check of it and the engine's choice of work (22-4) all call: the work
// extent e needs under its policy, a function of e and the member table
// alone (persistent state: a member missing or stalling now is the engine's
// business -- it parks -- never the index's). In durability units (a copy
// counts its member's durability; cached copies count nothing):
//   W   copies wanted: the policy's replicas, else the filesystem's;
//   B   the background target's members: the policy's, else the
//       filesystem's (none: no placement work); T = B's durable members;
//   F   the foreground target's members (the policy's, else the
//       filesystem's, else every member), durable ones only;
//   D   e's durable copies; D_T those on T; cap_T T's total durability.
// Reasons (at most one key per extent, so one destination):
//   kWorkPlacement  B set and D_T < min(W, cap_T): copies to T;
//   kWorkDurability D < W: copies to T while placement is due, else to F;
//   kWorkCompress   compression wanted (the policy's, else the
//                   filesystem's), a durable plain copy, and the policy's
//                   kPolicyIncompressible clear: the copies a placement
//                   writes are compressed; without one, each durable plain
//                   copy is rewritten compressed on its own member;
//   kWorkCacheOnly  a durable copy that is surplus: outside T once T holds
//                   its share and the others still make W, or on a member
//                   of durability 0 once W is met -- it becomes cached,
//                   with no I/O.
// The destination (Work::dest, the index key's top byte): B's code when
// placement is due (the move also does compression and cache-only work
// that is due), else F's for durability work (likewise); else cache-only
// work goes alone, kDestNoIo, before any compression (a surplus copy is not
// rewritten to be dropped next); else the plain copies' members for
// compression. Durability work F cannot take (every durable
// member of F already holds a copy: replicas above what the members can
// hold) is *stuck* -- the key's kDestStuck bit, read by no engine until the
// member table changes -- unless other work is due, which then goes alone.
// Unwritten extents need nothing. After the work is done ReconcileOf says
// none (policy_test's model engine: it never loops).
inline constexpr u8 kWorkDurability = 1;
inline constexpr u8 kWorkPlacement = 2;
inline constexpr u8 kWorkCompress = 4;
inline constexpr u8 kWorkCacheOnly = 8;

// Destination codes (bits 0-6 of the index key's top byte).
inline constexpr u8 kDestCookie = 0;       // not a destination: the index's cookies (22-3e)
inline constexpr u8 kDestMember = 1;       // + m: member m alone (a target of one member)
inline constexpr u8 kDestGroup = 33;       // + m: the members of m's group, m its lowest (two or more)
inline constexpr u8 kDestAny = 65;         // every member (no target, or one the codes cannot name)
inline constexpr u8 kDestNoIo = 66;        // cache-only work: no destination, never parked
inline constexpr u8 kDestStuck = 0x80;     // bit 7: work the member table cannot place

struct Work {
  u8 reasons = 0;             // kWork* bits; 0: e needs nothing
  u8 dest = 0;                // a kDest* code, | kDestStuck
  dev::DevMask members = 0;   // the destination's durable members (0 for kDestNoIo)
  dev::DevMask background = 0;  // T: a full extent gives up a copy there last (22-4)
  bool policy_bad = false;    // e's policy was unreadable: read as unset (callers count it)
};
Work ReconcileOf(const MemberTable& t, const Extent& e);

// The destination code of a set of members (kDestAny for 0 or a set that
// is neither one member nor one whole group).
u8 DestOf(const MemberTable& t, dev::DevMask members);

}  // namespace tfs::data

#endif  // TFS_DATA_POLICY_H_
