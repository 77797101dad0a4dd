// On-disk journal entry format (documented in docs/format/journal.md).
//
// The journal is a ring of buckets on each member that carries one. An entry is a
// 64-byte header followed by keys, padded to a multiple of 4096 bytes; entries
// start on 4 KiB boundaries and never cross a bucket boundary. Each key is an
// 8-byte header (type, length) and `len` value bytes padded to 8. The journal does
// not interpret keys: their owners do, at replay.
//
// `magic` is kJournalMagic xor the first 8 bytes of the filesystem uuid, so entries
// left by another filesystem (or an earlier format) on the same disk never match.
// `csum` covers the whole entry (header with csum zero, keys and padding).
#ifndef TFS_JOURNAL_FORMAT_H_
#define TFS_JOURNAL_FORMAT_H_

#include "platform/types.h"
#include "util/endian.h"

namespace tfs::journal {

inline constexpr u64 kJournalMagic = 0x4c4e524a53465454ull;  // "TTFSJRNL" as LE bytes
inline constexpr u16 kJournalVersion = 1;
inline constexpr u32 kJournalBlock = 4096;

// Entry flags.
inline constexpr u16 kEntryFlush = 1 << 0;  // a durability point (see kEntryUnordered)
// With kEntryFlush: written first and flushed after (together with the data it
// depends on), not pre-flushed and written with FUA. Valid on disk, it proves
// its data durable only if a later entry exists or every kKeyDataCheck of its
// group verifies (docs/format/journal.md, "Unordered flush entries").
inline constexpr u16 kEntryUnordered = 1 << 1;
inline constexpr u16 kEntryFlagsKnown = kEntryFlush | kEntryUnordered;

struct EntryHeader {  // 64 bytes
  Le64 magic;
  Le32 csum;
  Le16 version;
  Le16 flags;
  Le64 seq;            // sequence number, consecutive across the filesystem
  Le64 last_seq;       // oldest entry replay needs; older ones are persisted elsewhere
  Le32 bytes;          // whole entry including padding: multiple of kJournalBlock
  Le32 payload_bytes;  // key bytes after the header
  Le32 nkeys;
  Le32 reserved0;
  // The btree roots block gen known durable when the entry was written (0 in
  // entries of older builds): a mount that finds only older roots knows it
  // lost a checkpoint (docs/format/journal.md).
  Le64 roots_gen;
  u8 reserved[8];
};
static_assert(sizeof(EntryHeader) == 64, "journal entry header");

struct KeyHeader {  // 8 bytes, then `len` bytes of value, padded to 8
  Le16 type;
  Le16 reserved;
  Le32 len;
};
static_assert(sizeof(KeyHeader) == 8, "journal key header");

inline constexpr u32 KeySpace(u32 len) { return u32(sizeof(KeyHeader)) + ((len + 7) & ~7u); }

// Key types. 0 is never valid. Owners register their types here so numbers never
// collide; the journal itself accepts any nonzero type.
enum KeyType : u16 {
  kKeyInvalid = 0,
  // 1: format version 2's allocation change (never reused; unknown now: corrupt).
  kKeyBtree = 2,          // btree/format.h: one btree key (KeyHeader + value)
  kKeyDataCheck = 3,      // DataCheckFormat: data a commit points at, for replay to verify
  kKeyTest = 0xff00,      // tests only
};

// kKeyDataCheck: a device range a commit's keys point at (written and completed
// before the commit) and its crc32c per `unit` bytes -- ceil(length / unit) Le32
// crcs follow, the last over what remains. Either unit is a multiple of 4096 or
// there is one crc (unit >= length). A commit with `deps` that carries data checks
// carries one for every range its deps stand for (Journal::Commit).
struct DataCheckFormat {  // 24 bytes, then the crcs
  Le16 member;
  Le16 reserved;
  Le32 unit;
  Le64 offset;  // bytes from the member's start; a multiple of 4096
  Le32 length;  // bytes, 1..kMaxDataCheckBytes
  Le32 reserved2;
};
static_assert(sizeof(DataCheckFormat) == 24, "data check header");
inline constexpr u32 kMaxDataCheckBytes = 16u << 20;
inline constexpr u32 kMaxDataCheckUnit = 1u << 20;

// The crcs a check of `length` bytes in `unit`s carries; 0 if the pair is invalid.
inline constexpr u32 DataCheckCrcs(u32 length, u32 unit) {
  if (length == 0 || length > kMaxDataCheckBytes || unit == 0 || unit > kMaxDataCheckUnit) return 0;
  const u32 n = (length + unit - 1) / unit;
  return n == 1 || unit % 4096 == 0 ? n : 0;
}
inline constexpr u32 DataCheckBytes(u32 ncrcs) { return u32(sizeof(DataCheckFormat)) + 4 * ncrcs; }
// The crcs a check value of `len` bytes carries if it is well formed (its
// length and unit valid, its size theirs, its offset 4 KiB aligned); else 0.
// The member and the range are for the reader to check against its devices.
inline u32 DataCheckWellFormed(const void* val, u32 len) {
  if (len < sizeof(DataCheckFormat)) return 0;
  const auto* dc = static_cast<const DataCheckFormat*>(val);
  const u32 n = DataCheckCrcs(dc->length.get(), dc->unit.get());
  return n != 0 && len == DataCheckBytes(n) && dc->offset.get() % 4096 == 0 ? n : 0;
}

}  // namespace tfs::journal

#endif  // TFS_JOURNAL_FORMAT_H_
