#include <cstring>

#include "fuzz/fuzz.h"
#include "platform/platform.h"
#include "store/store.h"

namespace tfs::fuzz {

void Quiet() {
  static const bool done = (platform::SetLogLevel(platform::LogLevel::kFatal), true);
  (void)done;
}

std::unique_ptr<userspace::MemDevice> Formatted(uint64_t size, uint32_t bucket_size, uint32_t node_size) {
  userspace::MemDeviceOptions o;
  o.name = "ssd0";
  o.size = size;
  auto dev = std::make_unique<userspace::MemDevice>(o);
  store::FormatMember m = {dev.get(), "ssd.a", 1};
  store::FormatOptions fo;
  if (bucket_size != 0) fo.bucket_size = bucket_size;
  if (node_size != 0) fo.btree_node_size = node_size;
  Diag diag;
  if (!store::Format(&m, 1, fo, &diag).ok()) Fail(diag.text);
  return dev;
}

sb::Superblock JournalSuperblock() {
  sb::Superblock s;
  memset(&s, 0, sizeof(s));
  for (int i = 0; i < 16; i++) s.fs_uuid[i] = uint8_t(0x10 + i);
  s.seq = 1;
  s.bucket_size = kJournalBucket;
  s.btree_node_size = 4096;
  s.block_size = 4096;
  s.journal_seq = 1;
  s.options.data_replicas = s.options.metadata_replicas = 1;
  s.nr_members = 1;
  sb::Member& m = s.members[0];
  for (int i = 0; i < 16; i++) m.uuid[i] = uint8_t(0x40 + i);
  strcpy(m.label, "ssd.a");
  m.size = kJournalDevSize;
  m.nbuckets = (kJournalDevSize - sb::kBucketsOffset) / kJournalBucket;
  m.journal_first_bucket = 1;
  m.journal_nbuckets = kJournalRingBuckets;
  m.data_allowed = sb::kDataAll;
  return s;
}

sb::Superblock ValuesSuperblock() {
  auto dev = Formatted(kValuesDevSize, kValuesBucket, kValuesNode);
  sb::Superblock s;
  Diag diag;
  if (!sb::Read(*dev, &s, &diag).status().ok()) Fail(diag.text);
  return s;
}

}  // namespace tfs::fuzz
