// The superblock decoder (sb::Decode) on hostile bytes; a copy that decodes
// must survive Encode -> Decode unchanged in what it means.
#include <cstring>

#include "fuzz/fuzz.h"
#include "sb/format.h"

using namespace tfs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint8_t buf[sb::kSbSize];
  memset(buf, 0, sizeof(buf));
  memcpy(buf, data, size < sizeof(buf) ? size : sizeof(buf));
  for (u64 device_size : {u64(0), u64(64) << 20}) {
    sb::Superblock s;
    Diag diag;
    if (!sb::Decode(buf, device_size, &s, &diag).ok()) continue;
    static uint8_t again[sb::kSbSize];
    sb::Encode(s, 0, again);
    sb::Superblock t;
    Diag d2;
    if (!sb::Decode(again, device_size, &t, &d2).ok()) fuzz::Fail("a decoded superblock does not decode re-encoded");
    if (t.seq != s.seq || t.nr_members != s.nr_members || t.bucket_size != s.bucket_size ||
        t.journal_seq != s.journal_seq || memcmp(t.fs_uuid, s.fs_uuid, sizeof(s.fs_uuid)) != 0)
      fuzz::Fail("superblock round trip changed a field");
  }
  return 0;
}
