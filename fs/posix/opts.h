// Per-file and per-directory options (docs/design/copies.md "Inode options";
// format: docs/format/inodes-extents.md, InodeFormat bytes 98..106): where a
// file's new data goes (foreground_target), where the background moves it
// (background_target), where read-hot data is copied (promote_target), how
// many copies it wants (replicas: honoured by the data path's writes since
// issue 21 step 5a) and whether it is compressed
// (compression). 0 is "unset": the filesystem's option applies.
//
// Users see them as xattrs "tierfs.<option>" with text values (a member
// label or group name; "1".."4"; "none" or "zstd"), which posix turns into
// inode fields -- never xattr keys -- changed with ctime in one transaction
// (opts.cc); `tierfs setopt/getopt` are built on those xattrs. A new inode
// copies its directory's options and marks them inherited
// (InodeFormat::opts_inherited); later changes of the directory do not reach
// existing children.
//
// A target is stored as a member index, not a name: kOptTargetMember + m for
// member m, or kOptTargetGroup | m for "the group member m belongs to",
// resolved to every member of that group when data is placed (so a member
// added to the group later is included).
//
// The functions here are pure (no lock, no I/O): posix, fsck and the fuzz
// targets call them. A stored value is hostile like any record: OptValid
// says whether a value is one this filesystem can hold; posix's writes and
// inheritance treat an invalid one as unset, getxattr reports it as corrupt,
// listxattr leaves it out, fsck clears it.
#ifndef TFS_POSIX_OPTS_H_
#define TFS_POSIX_OPTS_H_

#include "data/io_context.h"
#include "data/policy.h"
#include "dev/device_set.h"
#include "posix/format.h"
#include "util/status.h"

namespace tfs::posix {

// The options, in InodeFormat's order; bit i of opts_inherited is option i.
enum InodeOpt : u8 {
  kOptForegroundTarget = 0,
  kOptBackgroundTarget,
  kOptPromoteTarget,
  kOptReplicas,
  kOptCompression,
  kInodeOpts,
};

// The xattr names: "tierfs." + OptName(o). "tierfs.inherited" is read-only
// and not listed: the inherited options' names, comma-separated ("" if
// none) -- what getopt shows as "(inherited)". Any other "tierfs." name is
// kInvalidArgument for every call (bcachefs's answer for its options).
inline constexpr char kOptXattrPrefix[] = "tierfs.";
inline constexpr u32 kOptXattrPrefixLen = sizeof(kOptXattrPrefix) - 1;
inline constexpr char kOptInheritedXattr[] = "tierfs.inherited";

// Stored values.
// (The values extents record in their policy are these: data/policy.h.)
inline constexpr u16 kOptTargetMember = data::kTargetMember;  // + m: member m (1..kMaxDevices)
inline constexpr u16 kOptTargetGroup = data::kTargetGroup;    // | m: the group of member m
inline constexpr u8 kOptReplicasMax = data::kPolicyReplicasMax;
inline constexpr u8 kOptCompressNone = data::kCompressNone;
inline constexpr u8 kOptCompressZstd = data::kCompressZstd;
// The longest value text: a label (dev::kLabelMax with its NUL).
inline constexpr u32 kOptTextMax = dev::kLabelMax;

const char* OptName(InodeOpt o);  // "foreground_target", ...
inline bool IsTargetOpt(InodeOpt o) { return o <= kOptPromoteTarget; }

// Whether an xattr name is in the "tierfs." namespace (posix's, not a key).
inline bool IsOptXattr(const char* name, u32 len) {
  return len >= kOptXattrPrefixLen && MemCompare(name, kOptXattrPrefix, kOptXattrPrefixLen) == 0;
}
// The option "tierfs.<option>" names; false for any other name.
bool FindOpt(const char* name, u32 len, InodeOpt* out);

// The stored value (0: unset).
u16 GetOpt(const InodeFormat& f, InodeOpt o);
// Sets a value the user chose (0: unset): its inherited bit is cleared, and
// for compression kInodeFlagCompress follows it (set iff zstd).
void SetOpt(InodeFormat* f, InodeOpt o, u16 v);
// Whether v is a value of o a filesystem of nr_members members can hold
// (0 is: unset).
bool OptValid(InodeOpt o, u16 v, u32 nr_members);

// A value's text (len bytes, no NUL needed; one trailing NUL is dropped, as
// C callers pass strlen + 1 and bcachefs accepts it) -> its stored value.
// Targets: a group name, else a member label (dev::DeviceSet::ResolveTarget's
// order), or "none" (or empty): unset. kInvalidArgument with a one-line
// reason (static text) in *why.
Status ParseOpt(InodeOpt o, const char* text, u32 len, const dev::DeviceSet& devs, u16* out, const char** why);
// A valid nonzero value's text into buf (up to kOptTextMax bytes, no NUL);
// returns its length.
u32 FormatOpt(InodeOpt o, u16 v, const dev::DeviceSet& devs, char* buf);

// A new inode's options: the directory's set ones that OptValid takes for a
// filesystem of nr_members members, marked inherited (and kInodeFlagCompress
// with an inherited zstd). A damaged value stays with the directory (fsck's
// to clear) instead of spreading to every new child.
void InheritOpts(const InodeFormat& dir, InodeFormat* child, u32 nr_members);

// What fsck finds wrong with the option fields: values this filesystem
// cannot hold (a bit per option), reserved bytes in use or inherited bits
// of options without a value (or past the five), kInodeFlagCompress not
// mirroring the compression option.
struct OptsDamage {
  u8 bad_values = 0;  // bit i: option i
  bool reserved = false;
  bool flag_mismatch = false;
  bool any() const { return bad_values != 0 || reserved || flag_mismatch; }
};
OptsDamage CheckOpts(const InodeFormat& f, u32 nr_members);
// Clears what CheckOpts finds: bad values unset, reserved bytes and stray
// bits zeroed; the flag follows the option -- but a flag with compression
// unset (damage: every path that sets the flag sets zstd with it, and no
// image from before the options mounts) makes it zstd, the one value the
// flag can mirror.
void RepairOpts(InodeFormat* f, u32 nr_members);

// Where a file's new data goes: its foreground_target if set and valid
// (*out; true), else false (the filesystem's).
bool ForegroundTarget(const InodeFormat& f, u32 nr_members, data::Target* out);
// How many copies a file's new data wants: its replicas option if set and
// valid, else 0 (the filesystem's data_replicas; data::IoContext::replicas).
u8 Replicas(const InodeFormat& f, u32 nr_members);
// Whether a file's new data is compressed: its compression option if set,
// else the filesystem's option (`fs_default`) -- or a flag without the
// option (damage, which fsck repairs to zstd) compresses, as the repair will.
bool CompressNewData(const InodeFormat& f, bool fs_default);

}  // namespace tfs::posix

#endif  // TFS_POSIX_OPTS_H_
