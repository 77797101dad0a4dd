#include "sb/superblock.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "userspace/platform/mem_device.h"

namespace tfs::sb {
namespace {

constexpr u64 kDevSize = 64ull << 20;

Superblock MakeSb(u32 members) {
  Superblock sb;
  memset(&sb, 0, sizeof(sb));
  NewUuid(sb.fs_uuid);
  sb.seq = 1;
  sb.bucket_size = 1 << 20;
  sb.btree_node_size = 256 << 10;
  sb.block_size = 4096;
  sb.journal_seq = 1;
  strcpy(sb.options.foreground_target, "ssd");
  strcpy(sb.options.metadata_target, "ssd");
  strcpy(sb.options.background_target, "hdd");
  sb.options.data_replicas = 1;
  sb.options.metadata_replicas = 1;
  sb.options.checksum = ChecksumType::kCrc32c;
  sb.nr_members = members;
  for (u32 i = 0; i < members; i++) {
    Member& m = sb.members[i];
    NewUuid(m.uuid);
    snprintf(m.label, sizeof(m.label), "%s.d%u", i == 0 ? "ssd" : "hdd", i);
    m.size = kDevSize;
    m.nbuckets = (kDevSize - kBucketsOffset) / sb.bucket_size;
    m.journal_first_bucket = i == 0 ? 1 : 0;
    m.journal_nbuckets = i == 0 ? 8 : 0;
    m.durability = 1;
    m.data_allowed = i == 0 ? kDataAll : kDataUser;
  }
  return sb;
}

std::unique_ptr<userspace::MemDevice> Dev(const char* name) {
  userspace::MemDeviceOptions o;
  o.name = name;
  o.size = kDevSize;
  o.threaded = false;
  return std::make_unique<userspace::MemDevice>(o);
}

TEST(SuperblockTest, EncodeDecodeRoundTrip) {
  Superblock sb = MakeSb(3);
  std::vector<u8> buf(kSbSize);
  Encode(sb, 2, buf.data());
  Superblock out;
  Diag d;
  ASSERT_TRUE(Decode(buf.data(), kDevSize, &out, &d).ok()) << d.text;
  EXPECT_EQ(out.dev_idx, 2);
  EXPECT_EQ(out.nr_members, 3u);
  EXPECT_EQ(memcmp(out.fs_uuid, sb.fs_uuid, 16), 0);
  EXPECT_STREQ(out.members[1].label, "hdd.d1");
  EXPECT_STREQ(out.options.background_target, "hdd");
  EXPECT_EQ(out.members[0].journal_nbuckets, 8u);
  EXPECT_EQ(out.options.checksum, ChecksumType::kCrc32c);
}

// An unfinished repair's record travels with a flag bit that builds which do
// not know the field reject (they would mount and zero it); the two agree.
TEST(SuperblockTest, LostDataRecordSetsItsFlag) {
  Superblock sb = MakeSb(2);
  sb.lost_data_btrees = 1;
  std::vector<u8> buf(kSbSize);
  Encode(sb, 0, buf.data());
  const auto* f = reinterpret_cast<const SuperblockFormat*>(buf.data());
  EXPECT_EQ(f->flags.get() & kSbLostData, kSbLostData);
  EXPECT_EQ(f->lost_data_btrees.get(), 1u);
  Superblock out;
  Diag d;
  ASSERT_TRUE(Decode(buf.data(), kDevSize, &out, &d).ok()) << d.text;
  EXPECT_EQ(out.lost_data_btrees, 1u);
  // An older build's check: no flag bit but the clean one is known.
  EXPECT_NE(f->flags.get() & ~kSbClean, 0) << "an older build would mount it";
  out.lost_data_btrees = 0;  // fsck finished: the flag goes with the record
  Encode(out, 0, buf.data());
  EXPECT_EQ(f->flags.get() & kSbLostData, 0);
  // Bytes where the two disagree are corrupt.
  auto* w = reinterpret_cast<SuperblockFormat*>(buf.data());
  w->lost_data_btrees.set(4);
  w->csum.set(0);
  w->csum.set(platform::Crc32c(buf.data(), kSbSize));
  EXPECT_TRUE(Decode(buf.data(), kDevSize, &out).Is(ErrorClass::kCorrupt));
}

// kSbXattrChunks (chunked xattr values may exist) and kSbCapsFlagged
// decode; a flag bit this build does not know makes the copy corrupt (an
// older build's view of those).
TEST(SuperblockTest, KnownFlagsDecodeAndUnknownOnesAreRefused) {
  Superblock sb = MakeSb(2);
  sb.flags = kSbClean | kSbXattrChunks | kSbCapsFlagged | kSbAcctRepair | kSbExtentPolicy;
  std::vector<u8> buf(kSbSize);
  Encode(sb, 0, buf.data());
  Superblock out;
  Diag d;
  ASSERT_TRUE(Decode(buf.data(), kDevSize, &out, &d).ok()) << d.text;
  EXPECT_EQ(out.flags, kSbClean | kSbXattrChunks | kSbCapsFlagged | kSbAcctRepair | kSbExtentPolicy);
  sb.flags = kSbClean | u16(1u << 6);  // the first bit no build knows
  Encode(sb, 0, buf.data());
  EXPECT_TRUE(Decode(buf.data(), kDevSize, &out, &d).Is(ErrorClass::kCorrupt));
  EXPECT_NE(std::string(d.text).find("flags"), std::string::npos) << d.text;
}

TEST(SuperblockTest, DecodeRejectsHostileBytes) {
  Superblock sb = MakeSb(2);
  std::vector<u8> good(kSbSize);
  Encode(sb, 0, good.data());
  Superblock out;
  auto decode = [&](std::vector<u8> b) { return Decode(b.data(), kDevSize, &out); };
  std::vector<u8> b = good;
  b[0] ^= 1;
  EXPECT_EQ(decode(b), Status(Err::kBadMagic));
  b = good;
  b[3000] ^= 0x40;  // any byte: checksum
  EXPECT_EQ(decode(b), Status(Err::kBadChecksum));

  // Valid checksums over invalid fields: every field is range-checked.
  auto mutate = [&](auto fn) {
    Superblock s = sb;
    fn(s);
    std::vector<u8> v(kSbSize);
    Encode(s, 0, v.data());
    Diag d;
    Status st = Decode(v.data(), kDevSize, &out, &d);
    EXPECT_FALSE(d.empty());
    return st;
  };
  EXPECT_TRUE(mutate([](Superblock& s) { s.nr_members = 0; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.bucket_size = 3 << 20; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.btree_node_size = 2 << 20; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.members[0].nbuckets = ~0ull / 2; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.members[0].journal_nbuckets = 1000; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.members[0].journal_first_bucket = s.members[0].nbuckets; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { strcpy(s.members[1].label, "BAD LABEL"); }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { strcpy(s.members[1].label, s.members[0].label); }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.members[0].size = kDevSize * 2; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.members[0].journal_nbuckets = 0; }).Is(ErrorClass::kCorrupt));
  EXPECT_TRUE(mutate([](Superblock& s) { s.options.data_replicas = 0; }).Is(ErrorClass::kCorrupt));

  // Unterminated strings: patch the bytes, then recompute the checksum by hand.
  b = good;
  auto* f = reinterpret_cast<SuperblockFormat*>(b.data());
  memset(f->foreground_target, 'x', kSbTargetLen);
  f->csum.set(0);
  f->csum.set(platform::Crc32c(b.data(), kSbSize));  // csum was zero while summing
  EXPECT_TRUE(decode(b).Is(ErrorClass::kCorrupt));
}

TEST(SuperblockTest, ReadFallsBackToBackupWhenPrimaryIsCorrupt) {
  auto dev = Dev("ssd0");
  Superblock sb = MakeSb(1);
  ASSERT_TRUE(Write(*dev, sb, 0).ok());
  Superblock out;
  Result<ReadResult> r = Read(*dev, &out);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->used_backup);

  u8 junk[64];
  memset(junk, 0xee, sizeof(junk));
  dev->WriteRaw(kSbPrimaryOffset + 100, junk, sizeof(junk));  // corrupt the primary
  Diag d;
  r = Read(*dev, &out, &d);
  ASSERT_TRUE(r.ok()) << d.text;
  EXPECT_TRUE(r->used_backup);
  EXPECT_EQ(r->primary_status, Status(Err::kBadChecksum));
  EXPECT_EQ(memcmp(out.fs_uuid, sb.fs_uuid, 16), 0);

  dev->WriteRaw(kSbBackupOffset + 100, junk, sizeof(junk));  // and the backup
  r = Read(*dev, &out, &d);
  EXPECT_TRUE(r.status().Is(ErrorClass::kCorrupt));
  EXPECT_NE(std::string(d.text).find("both superblock copies"), std::string::npos) << d.text;
}

// Format versions 1 (one pointer an extent), 2 (allocation tables on every
// member), 3 (the alloc btree without backpointers), 4 (no accounting keys)
// 5 (no inode count) and 6 (one copy of each btree node) were never
// released: a device with any of them is refused in one line that says to
// reformat; other versions get the plain line.
TEST(SuperblockTest, VersionsOneToSixAreRefusedWithOneLine) {
  ASSERT_EQ(kSbVersion, 7);
  auto dev = Dev("old");
  ASSERT_TRUE(Write(*dev, MakeSb(1), 0).ok());
  auto set_version = [&](u16 v) {
    for (u64 at : {kSbPrimaryOffset, kSbBackupOffset}) {
      std::vector<u8> b(kSbSize);
      dev->ReadRaw(at, b.data(), b.size());
      auto* f = reinterpret_cast<SuperblockFormat*>(b.data());
      f->version.set(v);
      f->csum.set(0);
      f->csum.set(platform::Crc32c(b.data(), kSbSize));
      dev->WriteRaw(at, b.data(), b.size());
    }
  };
  const char* const why[] = {nullptr, "predates extent pointer lists", "kept allocation tables on every member",
                             "kept no backpointers", "kept no accounting keys", "kept no inode count",
                             "kept one copy of each btree node"};
  Superblock out;
  Diag d;
  for (u16 v = 1; v <= 6; v++) {
    set_version(v);
    EXPECT_EQ(Read(*dev, &out, &d).status(), Status(Err::kBadVersion));
    EXPECT_EQ(std::string(d.text), "old: superblock format version " + std::to_string(v) + " " + why[v] +
                                       "; this build reads version 7: reformat; nothing released used it");
  }
  set_version(8);
  EXPECT_EQ(Read(*dev, &out, &d).status(), Status(Err::kBadVersion));
  EXPECT_EQ(std::string(d.text), "old: superblock version 8 not supported (this build reads 7)");
  set_version(0);
  EXPECT_EQ(Read(*dev, &out, &d).status(), Status(Err::kBadVersion));
  EXPECT_EQ(std::string(d.text), "old: superblock version 0 not supported (this build reads 7)");
}

TEST(SuperblockTest, BlankDeviceIsNotTierfs) {
  auto dev = Dev("blank");
  Superblock out;
  Diag d;
  EXPECT_EQ(Read(*dev, &out, &d).status(), Status(Err::kBadMagic));
  EXPECT_NE(std::string(d.text).find("not a tierfs device"), std::string::npos) << d.text;
}

TEST(SuperblockTest, CheckMembersRefusesMismatchedSets) {
  Superblock sb = MakeSb(3);
  Superblock copies[3];
  for (u16 i = 0; i < 3; i++) {
    copies[i] = sb;
    copies[i].dev_idx = i;
  }
  u32 order[kSbMaxMembers];
  // Any order works.
  Superblock shuffled[3] = {copies[2], copies[0], copies[1]};
  Diag d;
  ASSERT_TRUE(CheckMembers(shuffled, 3, order, &d).ok()) << d.text;
  EXPECT_EQ(order[0], 1u);
  EXPECT_EQ(order[2], 0u);
  // Missing member: named.
  EXPECT_EQ(CheckMembers(copies, 2, order, &d), Status(Err::kNotFound));
  EXPECT_NE(std::string(d.text).find("hdd.d2"), std::string::npos) << d.text;
  // Same member twice.
  Superblock twice[3] = {copies[0], copies[1], copies[1]};
  EXPECT_TRUE(CheckMembers(twice, 3, order, &d).Is(ErrorClass::kInvalid));
  EXPECT_NE(std::string(d.text).find("both member"), std::string::npos) << d.text;
  // A member of another filesystem.
  Superblock other = MakeSb(3);
  Superblock mixed[3] = {copies[0], copies[1], other};
  mixed[2].dev_idx = 2;
  EXPECT_TRUE(CheckMembers(mixed, 3, order, &d).Is(ErrorClass::kInvalid));
  EXPECT_NE(std::string(d.text).find("different filesystems"), std::string::npos) << d.text;
  // A device whose member uuid is not the table's (replaced member).
  Superblock stale[3] = {copies[0], copies[1], copies[2]};
  NewUuid(stale[2].members[2].uuid);
  stale[0].seq = stale[1].seq = 2;  // newer copies hold the reference table
  EXPECT_TRUE(CheckMembers(stale, 3, order, &d).Is(ErrorClass::kInvalid));
}

TEST(SuperblockTest, UuidFormatting) {
  u8 u[16];
  for (int i = 0; i < 16; i++) u[i] = u8(i * 17);
  char s[37];
  UuidToString(u, s);
  EXPECT_STREQ(s, "00112233-4455-6677-8899-aabbccddeeff");
  NewUuid(u);
  EXPECT_EQ(u[6] >> 4, 4);
  EXPECT_EQ(u[8] >> 6, 2);
}

}  // namespace
}  // namespace tfs::sb
