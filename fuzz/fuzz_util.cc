#include <cstring>

#include "fuzz/fuzz.h"
#include "platform/platform.h"

namespace tfs::fuzz {

void Quiet() {
  static const bool done = (platform::SetLogLevel(platform::LogLevel::kFatal), true);
  (void)done;
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
  m.alloc_table_buckets = 1;
  m.journal_first_bucket = 1;
  m.journal_nbuckets = kJournalRingBuckets;
  m.data_allowed = sb::kDataAll;
  return s;
}

}  // namespace tfs::fuzz
