// Superblock encode/decode/validation, two-copy read with fallback, and the
// member-set check (see superblock.h and docs/format/superblock.md).
#include "sb/superblock.h"

#include "dev/device_set.h"
#include "platform/platform.h"
#include "util/bits.h"

namespace tfs::sb {
namespace {

// True if `s` has a NUL within `n` bytes.
bool Terminated(const char* s, usize n) {
  for (usize i = 0; i < n; i++) {
    if (s[i] == '\0') return true;
  }
  return false;
}

u32 SbCsum(const void* buf) {
  return platform::Crc32cSkippingField(buf, kSbSize, __builtin_offsetof(SuperblockFormat, csum));
}

// A buffer for one superblock copy, aligned for any device.
struct SbBuffer {
  SbBuffer() : p(static_cast<u8*>(platform::Alloc(kSbSize, 4096, true))) {}
  ~SbBuffer() { platform::Free(p); }
  SbBuffer(const SbBuffer&) = delete;
  SbBuffer& operator=(const SbBuffer&) = delete;
  u8* p;
};

}  // namespace

void NewUuid(u8 out[16]) {
  platform::RandomBytes(out, 16);
  out[6] = u8((out[6] & 0x0f) | 0x40);
  out[8] = u8((out[8] & 0x3f) | 0x80);
}

void UuidToString(const u8 uuid[16], char out[37]) {
  static const char kHex[] = "0123456789abcdef";
  int j = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[j++] = '-';
    out[j++] = kHex[uuid[i] >> 4];
    out[j++] = kHex[uuid[i] & 15];
  }
  out[j] = '\0';
}

void Encode(const Superblock& sb, u16 dev_idx, void* out) {
  MemSet(out, 0, kSbSize);
  auto* f = static_cast<SuperblockFormat*>(out);
  f->magic.set(kSbMagic);
  f->version.set(kSbVersion);
  f->nr_members.set(u16(sb.nr_members));
  MemCopy(f->fs_uuid, sb.fs_uuid, 16);
  f->seq.set(sb.seq);
  f->dev_idx.set(dev_idx);
  f->flags.set(u16((sb.flags & ~kSbLostData) | (sb.lost_data_btrees != 0 ? kSbLostData : 0)));
  f->bucket_size.set(sb.bucket_size);
  f->btree_node_size.set(sb.btree_node_size);
  f->block_size.set(sb.block_size);
  f->journal_seq.set(sb.journal_seq);
  f->roots_gen.set(sb.roots_gen);
  f->lost_data_btrees.set(sb.lost_data_btrees);
  f->degraded_missing.set(sb.degraded_missing);
  StrCopyPadded(f->foreground_target, sb.options.foreground_target, kSbTargetLen);
  StrCopyPadded(f->background_target, sb.options.background_target, kSbTargetLen);
  StrCopyPadded(f->promote_target, sb.options.promote_target, kSbTargetLen);
  StrCopyPadded(f->metadata_target, sb.options.metadata_target, kSbTargetLen);
  f->data_replicas = sb.options.data_replicas;
  f->metadata_replicas = sb.options.metadata_replicas;
  f->checksum_type = u8(sb.options.checksum);
  f->compression_type = u8(sb.options.compression);
  for (u32 i = 0; i < sb.nr_members && i < kSbMaxMembers; i++) {
    const Member& m = sb.members[i];
    MemberFormat& mf = f->members[i];
    MemCopy(mf.uuid, m.uuid, 16);
    StrCopyPadded(mf.label, m.label, kSbLabelLen);
    mf.size.set(m.size);
    mf.nbuckets.set(m.nbuckets);
    mf.journal_first_bucket.set(m.journal_first_bucket);
    mf.journal_nbuckets.set(m.journal_nbuckets);
    mf.durability = m.durability;
    mf.data_allowed = m.data_allowed;
    mf.state = m.state;
  }
  f->csum.set(SbCsum(out));
}

Status Decode(const void* buf, u64 device_size, Superblock* out, Diag* diag) {
  const auto* f = static_cast<const SuperblockFormat*>(buf);
  if (f->magic.get() != kSbMagic) return DiagError(diag, Err::kBadMagic, "no tierfs superblock (bad magic)");
  if (f->csum.get() != SbCsum(buf)) return DiagError(diag, Err::kBadChecksum, "superblock checksum mismatch");
  // Versions never released, each refused in one line that says why.
  static const char* const kOlder[] = {
      nullptr,
      "predates extent pointer lists",             // 1
      "kept allocation tables on every member",    // 2
      "kept no backpointers",                      // 3
      "kept no accounting keys",                   // 4
      "kept no inode count",                       // 5
      "kept one copy of each btree node",          // 6
  };
  static_assert(sizeof(kOlder) / sizeof(kOlder[0]) == kSbVersion, "a line for every older version");
  if (f->version.get() >= 1 && f->version.get() < kSbVersion)
    return DiagError(diag, Err::kBadVersion,
                     "superblock format version %u %s; this build reads version %u: reformat; nothing released "
                     "used it",
                     unsigned(f->version.get()), kOlder[f->version.get()], unsigned(kSbVersion));
  if (f->version.get() != kSbVersion)
    return DiagError(diag, Err::kBadVersion, "superblock version %u not supported (this build reads %u)",
                     unsigned(f->version.get()), unsigned(kSbVersion));
  Superblock& sb = *out;
  MemSet(&sb, 0, sizeof(sb));
  MemCopy(sb.fs_uuid, f->fs_uuid, 16);
  sb.seq = f->seq.get();
  sb.dev_idx = f->dev_idx.get();
  sb.flags = f->flags.get();
  sb.bucket_size = f->bucket_size.get();
  sb.btree_node_size = f->btree_node_size.get();
  sb.block_size = f->block_size.get();
  sb.journal_seq = f->journal_seq.get();
  sb.roots_gen = f->roots_gen.get();
  sb.lost_data_btrees = f->lost_data_btrees.get();
  sb.degraded_missing = f->degraded_missing.get();
  sb.nr_members = f->nr_members.get();

  auto corrupt = [&](const char* what) { return DiagError(diag, Err::kCorrupt, "superblock: bad %s", what); };
  if (sb.nr_members == 0 || sb.nr_members > kSbMaxMembers) return corrupt("member count");
  if (sb.dev_idx >= sb.nr_members) return corrupt("dev_idx");
  if ((sb.degraded_missing >> sb.dev_idx) & 1) return corrupt("degraded_missing (names this member)");
  if (sb.nr_members < 32 && (sb.degraded_missing >> sb.nr_members) != 0) return corrupt("degraded_missing");
  if ((sb.flags & ~kSbFlagsKnown) != 0) return corrupt("flags");
  if (((sb.flags & kSbLostData) != 0) != (sb.lost_data_btrees != 0)) return corrupt("lost-data flag");
  if (!IsPowerOfTwo(sb.bucket_size) || sb.bucket_size < kMinBucket || sb.bucket_size > kMaxBucket)
    return corrupt("bucket_size");
  if (!IsPowerOfTwo(sb.btree_node_size) || sb.btree_node_size < kMinBtreeNode ||
      sb.btree_node_size > kMaxBtreeNode || sb.btree_node_size > sb.bucket_size)
    return corrupt("btree_node_size");
  if (sb.block_size != 4096) return corrupt("block_size");

  const char* targets[] = {f->foreground_target, f->background_target, f->promote_target,
                           f->metadata_target};
  char* dst[] = {sb.options.foreground_target, sb.options.background_target,
                 sb.options.promote_target, sb.options.metadata_target};
  for (int i = 0; i < 4; i++) {
    if (!Terminated(targets[i], kSbTargetLen)) return corrupt("target string");
    StrCopyPadded(dst[i], targets[i], kSbTargetLen);
  }
  sb.options.data_replicas = f->data_replicas;
  sb.options.metadata_replicas = f->metadata_replicas;
  if (sb.options.data_replicas < 1 || sb.options.data_replicas > 4 ||
      sb.options.metadata_replicas < 1 || sb.options.metadata_replicas > 4)
    return corrupt("replica count");
  if (f->checksum_type > u8(ChecksumType::kCrc32c)) return corrupt("checksum type");
  if (f->compression_type > u8(CompressionType::kZstd)) return corrupt("compression type");
  sb.options.checksum = ChecksumType(f->checksum_type);
  sb.options.compression = CompressionType(f->compression_type);

  bool any_journal = false;
  for (u32 i = 0; i < sb.nr_members; i++) {
    const MemberFormat& mf = f->members[i];
    Member& m = sb.members[i];
    if (!Terminated(mf.label, kSbLabelLen) || !dev::ValidateLabel(mf.label).ok())
      return DiagError(diag, Err::kCorrupt, "superblock: member %u: bad label", i);
    MemCopy(m.uuid, mf.uuid, 16);
    StrCopyPadded(m.label, mf.label, kSbLabelLen);
    m.size = mf.size.get();
    m.nbuckets = mf.nbuckets.get();
    m.journal_first_bucket = mf.journal_first_bucket.get();
    m.journal_nbuckets = mf.journal_nbuckets.get();
    m.durability = mf.durability;
    m.data_allowed = mf.data_allowed;
    m.state = mf.state;
    auto bad = [&](const char* what) {
      return DiagError(diag, Err::kCorrupt, "superblock: member %u (%s): bad %s", i, m.label, what);
    };
    // Layout must fit: no multiplication that can overflow on hostile values.
    if (m.nbuckets == 0 || m.nbuckets > (~u64(0) - kBucketsOffset) / sb.bucket_size) return bad("nbuckets");
    if (m.size < kBucketsOffset + m.nbuckets * sb.bucket_size) return bad("size");
    if (device_size != 0 && i == sb.dev_idx && m.size > device_size)
      return DiagError(diag, Err::kCorrupt,
                       "member %s claims %llu bytes but the device has %llu (truncated image?)",
                       m.label, (unsigned long long)m.size, (unsigned long long)device_size);
    if (mf.reserved_table.get() != 0 || mf.reserved_checkpoint.get() != 0) return bad("reserved field");
    if (m.journal_nbuckets > 0) {
      if (!(m.data_allowed & kDataJournal)) return bad("journal on a member without journal data");
      if (m.journal_first_bucket > m.nbuckets ||
          m.journal_nbuckets > m.nbuckets - m.journal_first_bucket)
        return bad("journal range");
      any_journal = true;
    }
    if (m.durability > 4) return bad("durability");
    if ((m.data_allowed & ~kDataAll) != 0) return bad("data_allowed");
    if (m.state != 0) return bad("state");
    for (u32 j = 0; j < i; j++) {
      if (StrEqual(sb.members[j].label, m.label)) return bad("label (duplicate)");
      if (MemCompare(sb.members[j].uuid, m.uuid, 16) == 0) return bad("uuid (duplicate)");
    }
  }
  if (!any_journal) return corrupt("member table (no member holds a journal)");
  return Status::Ok();
}

Status ReadCopy(BlockDevice& dev, u64 offset, Superblock* out, Diag* diag) {
  SbBuffer buf;
  if (buf.p == nullptr) return Err::kNoMemory;
  Status st = SyncIo(dev, IoOp::kRead, offset, buf.p, kSbSize, 0, IoOrigin::kSuperblock);
  if (!st.ok()) return DiagError(diag, st, "%s: reading superblock at %llu: %s", dev.Name(),
                                 (unsigned long long)offset, st.Message());
  return Decode(buf.p, dev.Size(), out, diag);
}

Result<ReadResult> Read(BlockDevice& dev, Superblock* out, Diag* diag) {
  if (dev.Size() < kBucketsOffset || dev.LogicalBlockSize() > 4096)
    return DiagError(diag, Err::kBadMagic, "%s: too small to be a tierfs device", dev.Name());
  ReadResult r;
  Diag primary_diag;
  r.primary_status = ReadCopy(dev, kSbPrimaryOffset, out, &primary_diag);
  if (r.primary_status.ok()) return r;
  Diag backup_diag;
  Status backup = ReadCopy(dev, kSbBackupOffset, out, &backup_diag);
  if (backup.ok()) {
    r.used_backup = true;
    platform::Log(platform::LogLevel::kWarn, "%s: primary superblock unusable (%s); using the backup copy",
                  dev.Name(), primary_diag.text);
    return r;
  }
  if (r.primary_status.code() == Err::kBadMagic && backup.code() == Err::kBadMagic)
    return DiagError(diag, Err::kBadMagic, "%s: not a tierfs device (no superblock)", dev.Name());
  // A filesystem of another format version: said once, not once a copy.
  if (r.primary_status.code() == Err::kBadVersion && backup.code() == Err::kBadVersion &&
      StrEqual(primary_diag.text, backup_diag.text))
    return DiagError(diag, Err::kBadVersion, "%s: %s", dev.Name(), primary_diag.text);
  return DiagError(diag, r.primary_status.Is(ErrorClass::kIo) ? r.primary_status : Status(Err::kCorrupt),
                   "%s: both superblock copies are unusable: primary: %s; backup: %s", dev.Name(),
                   primary_diag.text, backup_diag.text);
}

Status Write(BlockDevice& dev, const Superblock& sb, u16 dev_idx) {
  SbBuffer buf;
  if (buf.p == nullptr) return Err::kNoMemory;
  Encode(sb, dev_idx, buf.p);
  // Primary first, durable, then the backup: a crash leaves at least one good copy.
  TFS_TRY(SyncIo(dev, IoOp::kWrite, kSbPrimaryOffset, buf.p, kSbSize, IoRequest::kFua, IoOrigin::kSuperblock));
  TFS_TRY(SyncIo(dev, IoOp::kWrite, kSbBackupOffset, buf.p, kSbSize, IoRequest::kFua, IoOrigin::kSuperblock));
  return Status::Ok();
}

Status CheckMembers(const Superblock* sbs, u32 count, u32* order, Diag* diag, u32* missing_out) {
  if (count == 0) return DiagError(diag, Err::kInvalidArgument, "no devices given");
  // The newest copy's member table is the reference.
  u32 ref = 0;
  for (u32 i = 1; i < count; i++) {
    if (sbs[i].seq > sbs[ref].seq) ref = i;
  }
  const Superblock& r = sbs[ref];
  char uuid_a[37], uuid_b[37];
  for (u32 m = 0; m < kSbMaxMembers; m++) order[m] = ~u32(0);
  for (u32 i = 0; i < count; i++) {
    const Superblock& s = sbs[i];
    if (MemCompare(s.fs_uuid, r.fs_uuid, 16) != 0) {
      UuidToString(s.fs_uuid, uuid_a);
      UuidToString(r.fs_uuid, uuid_b);
      return DiagError(diag, Err::kInvalidArgument,
                       "device %u belongs to filesystem %s, not %s: devices from different filesystems",
                       i + 1, uuid_a, uuid_b);
    }
    u32 idx = s.dev_idx;
    if (idx >= r.nr_members || MemCompare(s.members[idx].uuid, r.members[idx].uuid, 16) != 0)
      return DiagError(diag, Err::kInvalidArgument,
                       "device %u (member %s) is not in the current member table of this filesystem",
                       i + 1, s.members[idx < s.nr_members ? idx : 0].label);
    if (order[idx] != ~u32(0))
      return DiagError(diag, Err::kInvalidArgument, "devices %u and %u are both member %s",
                       order[idx] + 1, i + 1, r.members[idx].label);
    order[idx] = i;
  }
  char missing[160];
  usize n = 0;
  missing[0] = '\0';
  u32 nmissing = 0;
  if (missing_out != nullptr) *missing_out = 0;
  for (u32 m = 0; m < r.nr_members; m++) {
    if (order[m] != ~u32(0)) continue;
    nmissing++;
    if (missing_out != nullptr) *missing_out |= u32(1) << m;
    int w = platform::Format(missing + n, sizeof(missing) - n, "%s%s", n ? ", " : "", r.members[m].label);
    if (w > 0) n = Min<usize>(n + usize(w), sizeof(missing) - 1);
  }
  if (nmissing == 0) return Status::Ok();
  const Status st = DiagError(diag, Err::kNotFound, "filesystem has %u members; missing: %s", r.nr_members, missing);
  // With missing_out the caller decides (the Diag says which), unless none is left.
  return missing_out != nullptr && nmissing < r.nr_members ? Status::Ok() : st;
}

}  // namespace tfs::sb
