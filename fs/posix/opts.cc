// Per-inode options (opts.h; docs/design/copies.md "Inode options"): the
// codec between InodeFormat's option fields and the text of the
// "tierfs.<option>" xattrs, inheritance, fsck's check, and Filesystem's
// option calls -- SetXattr, GetXattr, ListXattr and RemoveXattr of a
// "tierfs." name land here (xattr.cc routes them), and Create inherits.
//
// An option is an inode field, never an xattr key: a set or remove rewrites
// the inode with its ctime in one transaction under the inode lock, like
// chattr (SetFlags), and is permitted by chattr's rule -- the inode's owner,
// or a caller with CAP_FOWNER (Filesystem::OptionCaller, or
// kFrontEndChecked from a front end that asked itself; the VFS only asks
// for write access to a name outside its namespaces). Get and list read
// the committed inode without a lock. No data I/O, no xattr keys touched;
// every commit asserts that no table mutex is held (DebugNoSharedLock).
#include "posix/opts.h"

#include "posix/fs.h"
#include "posix/internal.h"

namespace tfs::posix {

using btree::Transaction;

namespace {

constexpr const char* kOptNames[kInodeOpts] = {"foreground_target", "background_target", "promote_target",
                                               "replicas", "compression"};

Le16* TargetField(InodeFormat* f, InodeOpt o) {
  return o == kOptForegroundTarget ? &f->foreground_target
         : o == kOptBackgroundTarget ? &f->background_target
                                     : &f->promote_target;
}

bool TextIs(const char* text, u32 len, const char* word) {
  const usize n = StrLen(word);
  return len == n && MemCompare(text, word, n) == 0;
}

// A NUL-terminated copy of a target's text (kInvalidArgument if it cannot
// be a label: too long, or holding a NUL).
bool TargetText(const char* text, u32 len, char* out) {
  if (len >= kOptTextMax) return false;
  for (u32 i = 0; i < len; i++)
    if (text[i] == '\0') return false;
  MemCopy(out, text, len);
  out[len] = '\0';
  return true;
}

}  // namespace

const char* OptName(InodeOpt o) { return o < kInodeOpts ? kOptNames[o] : "?"; }

bool FindOpt(const char* name, u32 len, InodeOpt* out) {
  if (!IsOptXattr(name, len)) return false;
  for (u32 i = 0; i < kInodeOpts; i++) {
    if (TextIs(name + kOptXattrPrefixLen, len - kOptXattrPrefixLen, kOptNames[i])) {
      *out = InodeOpt(i);
      return true;
    }
  }
  return false;
}

u16 GetOpt(const InodeFormat& f, InodeOpt o) {
  switch (o) {
    case kOptForegroundTarget: return f.foreground_target.get();
    case kOptBackgroundTarget: return f.background_target.get();
    case kOptPromoteTarget: return f.promote_target.get();
    case kOptReplicas: return f.replicas;
    case kOptCompression: return f.compression;
    default: return 0;
  }
}

namespace {

// The value alone (SetOpt and InheritOpts keep the bits).
void StoreOpt(InodeFormat* f, InodeOpt o, u16 v) {
  if (IsTargetOpt(o)) {
    TargetField(f, o)->set(v);
  } else if (o == kOptReplicas) {
    f->replicas = u8(v);
  } else if (o == kOptCompression) {
    f->compression = u8(v);
    const u16 flags = u16(f->flags.get() & ~kInodeFlagCompress);
    f->flags.set(v == kOptCompressZstd ? u16(flags | kInodeFlagCompress) : flags);
  }
}

}  // namespace

void SetOpt(InodeFormat* f, InodeOpt o, u16 v) {
  if (o >= kInodeOpts) return;
  StoreOpt(f, o, v);
  f->opts_inherited = u8(f->opts_inherited & ~(1u << o));
}

bool OptValid(InodeOpt o, u16 v, u32 nr_members) {
  if (v == 0) return true;
  if (IsTargetOpt(o)) {
    if (v >= kOptTargetMember && v < kOptTargetMember + nr_members) return true;
    return v >= kOptTargetGroup && v < kOptTargetGroup + nr_members;
  }
  if (o == kOptReplicas) return v <= kOptReplicasMax;
  if (o == kOptCompression) return v == kOptCompressNone || v == kOptCompressZstd;
  return false;
}

Status ParseOpt(InodeOpt o, const char* text, u32 len, const dev::DeviceSet& devs, u16* out, const char** why) {
  *why = nullptr;
  if (len > 0 && text == nullptr) return Err::kInvalidArgument;
  if (len > 0 && text[len - 1] == '\0') len--;  // a C string's terminator (one; a NUL inside is refused)
  if (IsTargetOpt(o)) {
    char t[kOptTextMax];
    if (!TargetText(text, len, t)) {
      *why = "names no member or group of this filesystem";
      return Err::kInvalidArgument;
    }
    if (len == 0 || StrEqual(t, "none")) {
      *out = 0;  // unset: the filesystem's target
      return Status::Ok();
    }
    // ResolveTarget's order: a group name first, then a member label.
    for (u32 m = 0; m < devs.size(); m++) {
      if (StrEqual(devs.member(m)->group(), t)) {
        *out = u16(kOptTargetGroup | m);
        return Status::Ok();
      }
    }
    for (u32 m = 0; m < devs.size(); m++) {
      if (StrEqual(devs.member(m)->label(), t)) {
        *out = u16(kOptTargetMember + m);
        return Status::Ok();
      }
    }
    *why = "names no member or group of this filesystem";
    return Err::kInvalidArgument;
  }
  if (o == kOptReplicas) {
    if (len == 1 && text[0] >= '1' && text[0] <= '0' + kOptReplicasMax) {
      *out = u16(text[0] - '0');
      return Status::Ok();
    }
    *why = "replicas must be 1, 2, 3 or 4";
    return Err::kInvalidArgument;
  }
  if (o == kOptCompression) {
    if (TextIs(text, len, "none")) {
      *out = kOptCompressNone;
      return Status::Ok();
    }
    if (TextIs(text, len, "zstd")) {
      *out = kOptCompressZstd;
      return Status::Ok();
    }
    *why = "compression must be none or zstd";
    return Err::kInvalidArgument;
  }
  return Err::kInvalidArgument;
}

u32 FormatOpt(InodeOpt o, u16 v, const dev::DeviceSet& devs, char* buf) {
  const char* s = "";
  if (IsTargetOpt(o)) {
    const bool group = v >= kOptTargetGroup;
    const dev::Member* m = devs.member(group ? u32(v - kOptTargetGroup) : u32(v - kOptTargetMember));
    if (m != nullptr) s = group ? m->group() : m->label();
  } else if (o == kOptReplicas) {
    buf[0] = char('0' + (v % 10));
    return 1;
  } else if (o == kOptCompression) {
    s = v == kOptCompressZstd ? "zstd" : "none";
  }
  const u32 n = u32(Min<usize>(StrLen(s), kOptTextMax));
  MemCopy(buf, s, n);
  return n;
}

void InheritOpts(const InodeFormat& dir, InodeFormat* child, u32 nr_members) {
  for (u32 i = 0; i < kInodeOpts; i++) {
    const InodeOpt o = InodeOpt(i);
    const u16 v = GetOpt(dir, o);
    if (v == 0 || !OptValid(o, v, nr_members)) continue;  // (a damaged one is the directory's alone)
    StoreOpt(child, o, v);
    child->opts_inherited = u8(child->opts_inherited | (1u << i));
  }
}

namespace {

// The options with a value (bits as opts_inherited's): only they can be inherited.
u8 SetMask(const InodeFormat& f) {
  u8 m = 0;
  for (u32 i = 0; i < kInodeOpts; i++)
    if (GetOpt(f, InodeOpt(i)) != 0) m = u8(m | (1u << i));
  return m;
}

}  // namespace

OptsDamage CheckOpts(const InodeFormat& f, u32 nr_members) {
  OptsDamage d;
  for (u32 i = 0; i < kInodeOpts; i++)
    if (!OptValid(InodeOpt(i), GetOpt(f, InodeOpt(i)), nr_members)) d.bad_values = u8(d.bad_values | (1u << i));
  d.reserved = (f.opts_inherited & ~SetMask(f)) != 0 || f.reserved[0].get() != 0 || f.reserved[1].get() != 0;
  for (u8 b : f.reserved0) d.reserved |= b != 0;
  const bool flag = (f.flags.get() & kInodeFlagCompress) != 0;
  d.flag_mismatch = (d.bad_values & (1u << kOptCompression)) == 0 && flag != (f.compression == kOptCompressZstd);
  return d;
}

void RepairOpts(InodeFormat* f, u32 nr_members) {
  const bool flag = (f->flags.get() & kInodeFlagCompress) != 0;  // (before a bad compression goes with it)
  for (u32 i = 0; i < kInodeOpts; i++)
    if (!OptValid(InodeOpt(i), GetOpt(*f, InodeOpt(i)), nr_members)) SetOpt(f, InodeOpt(i), 0);
  MemSet(f->reserved0, 0, sizeof(f->reserved0));
  f->reserved[0].set(0);
  f->reserved[1].set(0);
  // The flag follows the option; a flag alone (or over a damaged value) is
  // damage -- every path that sets the flag sets zstd with it -- and zstd
  // is the one value it can mirror.
  if (flag && f->compression == 0) f->compression = kOptCompressZstd;
  StoreOpt(f, kOptCompression, f->compression);  // (sets the flag from the value)
  f->opts_inherited = u8(f->opts_inherited & SetMask(*f));
}

bool ForegroundTarget(const InodeFormat& f, u32 nr_members, data::Target* out) {
  const u16 v = f.foreground_target.get();
  if (v == 0 || !OptValid(kOptForegroundTarget, v, nr_members)) return false;  // (fsck's to clear)
  if (v >= kOptTargetGroup) {
    *out = data::Target{data::TargetKind::kGroup, u8(v - kOptTargetGroup)};
  } else {
    *out = data::Target{data::TargetKind::kMember, u8(v - kOptTargetMember)};
  }
  return true;
}

u8 Replicas(const InodeFormat& f, u32 nr_members) {
  return f.replicas != 0 && OptValid(kOptReplicas, f.replicas, nr_members) ? f.replicas : 0;  // (fsck's to clear)
}

bool CompressNewData(const InodeFormat& f, bool fs_default) {
  if (f.compression == kOptCompressZstd) return true;
  if (f.compression == kOptCompressNone) return false;
  return (f.flags.get() & kInodeFlagCompress) != 0 || fs_default;
}

// --- Filesystem's option calls --------------------------------------------------

namespace {

// Only its address is used (Filesystem::kFrontEndChecked): never read or written.
Filesystem::OptionCaller front_end_checked;

}  // namespace

Filesystem::OptionCaller* const Filesystem::kFrontEndChecked = &front_end_checked;

namespace {

Status Refuse(Filesystem::OptionCaller* who, Status st, const char* why) {
  if (who != nullptr && who != Filesystem::kFrontEndChecked) who->refused = why;
  return st;
}

constexpr const char kNotAnOption[] =
    "not an option (foreground_target, background_target, promote_target, replicas, compression)";
constexpr const char kReadOnly[] = "tierfs.inherited is read-only (the names of the inherited options)";
constexpr const char kNotTheOwner[] = "only the owner (or CAP_FOWNER) may set a file's options";

}  // namespace

Status Filesystem::ChangeOption(u64 ino, const char* name, u32 len, const void* value, u32 value_len, u32 flags,
                                bool remove, OptionCaller* who) {
  InodeOpt o;
  if (len == sizeof(kOptInheritedXattr) - 1 && MemCompare(name, kOptInheritedXattr, len) == 0)
    return Refuse(who, Err::kInvalidArgument, kReadOnly);
  if (!FindOpt(name, len, &o)) return Refuse(who, Err::kInvalidArgument, kNotAnOption);
  if ((flags & ~u32(kXattrCreate | kXattrReplace)) != 0 || flags == (kXattrCreate | kXattrReplace))
    return Err::kInvalidArgument;
  // chattr's rule (the VFS's inode_owner_or_capable): the owner, or
  // CAP_FOWNER -- before the value is looked at (a non-owner gets EPERM
  // whatever the value, as the kernel would answer), and before the lock (a
  // front end may make a syscall for CAP_FOWNER; asked only of a caller who
  // is not the owner). A null caller is refused, so forgetting it fails
  // closed; only kFrontEndChecked skips the check.
  if (who == nullptr) return Err::kPermission;
  const bool check = who != kFrontEndChecked;
  bool fowner = false;
  if (check) {
    InodeFormat seen;
    TFS_TRY(ReadInode(ino, &seen));
    if (seen.uid.get() != who->uid) {
      fowner = who->has_fowner != nullptr && who->has_fowner(who->ctx);
      if (!fowner) return Refuse(who, Err::kPermission, kNotTheOwner);
    }
  }
  u16 v = 0;
  if (!remove) {
    const char* why = nullptr;
    Status st = ParseOpt(o, static_cast<const char*>(value), value_len, store_->devs(), &v, &why);
    if (!st.ok()) return Refuse(who, st, why);
    TFS_TRY(MetadataRoom());  // (as SetXattr's; a remove always may)
  }
  const u64 lock[1] = {ino};
  Locked locked(this, lock, 1);
  TFS_TRY(locked.status());
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  // (A chown between the two reads: the owner now is the one that counts.)
  if (check && f.uid.get() != who->uid && !fowner) return Refuse(who, Err::kPermission, kNotTheOwner);
  const bool set = GetOpt(f, o) != 0;
  if (remove && !set) return Err::kNoData;
  if (set && (flags & kXattrCreate) != 0) return Err::kExists;
  if (!set && (flags & kXattrReplace) != 0) return Err::kNoData;
  SetOpt(&f, o, v);
  SetTime(&f.ctime_ns, Now());
  Transaction tx(trees_);
  TFS_TRY(tx.Set(InodePos(ino), &f, sizeof(f)));
  DebugNoSharedLock();
  return tx.Commit(journal::CommitMode::kNoFlush).status();
}

Result<u32> Filesystem::GetOption(u64 ino, const char* name, u32 len, void* buf, u32 cap) {
  InodeFormat f;
  TFS_TRY(ReadInode(ino, &f));
  char text[96];  // every option's name, comma-separated, fits (71 bytes)
  u32 n = 0;
  if (len == sizeof(kOptInheritedXattr) - 1 && MemCompare(name, kOptInheritedXattr, len) == 0) {
    for (u32 i = 0; i < kInodeOpts; i++) {
      if ((f.opts_inherited & (1u << i)) == 0 || GetOpt(f, InodeOpt(i)) == 0) continue;
      if (n > 0) text[n++] = ',';
      const u32 l = u32(StrLen(kOptNames[i]));
      MemCopy(text + n, kOptNames[i], l);
      n += l;
    }
  } else {
    InodeOpt o;
    if (!FindOpt(name, len, &o)) return Err::kInvalidArgument;
    const u16 v = GetOpt(f, o);
    if (v == 0) return Err::kNoData;
    if (!OptValid(o, v, store_->devs().size())) return Err::kCorrupt;  // (fsck clears it)
    n = FormatOpt(o, v, store_->devs(), text);
  }
  if (cap == 0) return n;
  if (cap < n) return Err::kRange;
  MemCopy(buf, text, n);
  return n;
}

Result<u32> Filesystem::ListOptions(const InodeFormat& f, char* buf, u32 cap, u32 at) {
  const u32 members = store_->devs().size();
  for (u32 i = 0; i < kInodeOpts; i++) {
    // A damaged value is left out: GetOption answers it kCorrupt, and a
    // listed name that cannot be read fails getfattr -d, cp -a and rsync -X
    // for the whole file (fsck clears it).
    const u16 v = GetOpt(f, InodeOpt(i));
    if (v == 0 || !OptValid(InodeOpt(i), v, members)) continue;
    const u32 l = u32(StrLen(kOptNames[i]));
    const u32 need = kOptXattrPrefixLen + l + 1;
    if (cap != 0) {
      if (at + need > cap) return Err::kRange;
      MemCopy(buf + at, kOptXattrPrefix, kOptXattrPrefixLen);
      MemCopy(buf + at + kOptXattrPrefixLen, kOptNames[i], l);
      buf[at + need - 1] = '\0';
    }
    at += need;
  }
  return at;
}

data::Policy Filesystem::ExtentPolicy(const InodeFormat& f) const {
  const u32 members = store_->devs().size();
  data::Policy p;
  // (CanonicalTarget is 0 for a code naming no member: OptValid's rule.)
  p.fg_target = data::CanonicalTarget(data_->members(), GetOpt(f, kOptForegroundTarget));
  p.bg_target = data::CanonicalTarget(data_->members(), GetOpt(f, kOptBackgroundTarget));
  p.replicas = Replicas(f, members);
  p.compression = OptValid(kOptCompression, f.compression, members) ? f.compression : 0;
  return p;
}

data::IoContext Filesystem::WriteContext(const InodeFormat& f) const {
  data::IoContext ctx = data::kForegroundWrite;
  data::Target t;
  if (ForegroundTarget(f, store_->devs().size(), &t)) ctx.target = t;
  ctx.replicas = Replicas(f, store_->devs().size());
  return ctx;
}

}  // namespace tfs::posix
