// Journal replay: scan every ring, validate every entry as hostile bytes, and pick
// the run of entries that is safe to apply.
//
// The run starts at L = the newest last_seq recorded by a valid *flush* entry (never
// below the superblock's journal_seq floor, below which everything was checkpointed)
// and continues while sequence numbers are consecutive. It then ends at the newest
// flush entry inside it: entries written without FUA after that were never promised
// durable and their data dependencies were never flushed, so applying them could
// point metadata at data that did not survive. Everything after a gap (a torn,
// corrupt or missing entry) is discarded and counted.
#include "journal/journal.h"
#include "util/sort.h"

namespace tfs::journal {
namespace {

struct Found {
  u64 seq;
  u64 last_seq;
  bool flush;
  u32 nkeys;
  Vector<u8> payload;
};

// Checks that `payload` holds exactly `nkeys` well-formed keys.
bool KeysValid(const u8* payload, u32 bytes, u32 nkeys) {
  u32 pos = 0;
  for (u32 i = 0; i < nkeys; i++) {
    if (bytes - pos < sizeof(KeyHeader)) return false;
    const auto* kh = reinterpret_cast<const KeyHeader*>(payload + pos);
    u32 len = kh->len.get();
    if (kh->type.get() == kKeyInvalid || len > bytes - pos - sizeof(KeyHeader)) return false;
    u32 space = KeySpace(len);
    if (space > bytes - pos) return false;
    pos += space;
  }
  return pos == bytes;
}

// Parses one bucket image, appending valid entries at or above `floor`.
Status ScanBucket(const u8* data, u32 bucket_size, u64 magic, u64 floor, Vector<Found>* found,
                  ReplayResult* out) {
  for (u32 pos = 0; pos + sizeof(EntryHeader) <= bucket_size;) {
    const auto* h = reinterpret_cast<const EntryHeader*>(data + pos);
    if (h->magic.get() != magic) {
      pos += kJournalBlock;
      continue;
    }
    u32 bytes = h->bytes.get();
    u32 payload = h->payload_bytes.get();
    bool sane = h->version.get() == kJournalVersion && bytes >= kJournalBlock &&
                bytes % kJournalBlock == 0 && bytes <= bucket_size - pos &&
                payload <= bytes - sizeof(EntryHeader) && h->seq.get() != 0 &&
                h->last_seq.get() <= h->seq.get() && (h->flags.get() & ~kEntryFlush) == 0;
    if (sane) {
      u32 crc = platform::Crc32cSkippingField(data + pos, bytes, __builtin_offsetof(EntryHeader, csum));
      sane = crc == h->csum.get() &&
             KeysValid(data + pos + sizeof(EntryHeader), payload, h->nkeys.get());
    }
    if (!sane) {
      out->bad_headers++;
      pos += kJournalBlock;
      continue;
    }
    u64 seq = h->seq.get();
    if (seq >= floor) {
      TFS_TRY(found->EmplaceBack());
      Found& f = found->back();
      f.seq = seq;
      f.last_seq = h->last_seq.get();
      f.flush = (h->flags.get() & kEntryFlush) != 0;
      f.nkeys = h->nkeys.get();
      TFS_TRY(f.payload.Resize(payload));
      MemCopy(f.payload.data(), data + pos + sizeof(EntryHeader), payload);
    }
    if (seq + 1 > out->next_seq) out->next_seq = seq + 1;
    pos += bytes;
  }
  return Status::Ok();
}

}  // namespace

Status ReadForReplay(dev::DeviceSet& devs, const sb::Superblock& sb, ReplayResult* out, Diag* diag) {
  u64 uuid_word = 0;
  MemCopy(&uuid_word, sb.fs_uuid, 8);
  const u64 magic = kJournalMagic ^ uuid_word;
  const u64 floor = sb.journal_seq == 0 ? 1 : sb.journal_seq;
  out->entries.Clear();
  out->next_seq = floor;
  out->valid_entries = out->discarded_entries = out->bad_headers = out->gap_at = 0;

  u8* bucket = static_cast<u8*>(platform::Alloc(sb.bucket_size, 4096));
  if (bucket == nullptr) return Err::kNoMemory;
  Vector<Found> found;
  Status st;
  for (u32 m = 0; m < sb.nr_members && st.ok(); m++) {
    const sb::Member& mem = sb.members[m];
    if (mem.journal_nbuckets == 0) continue;
    dev::Member* dm = devs.member(m);
    if (dm == nullptr) {
      st = DiagError(diag, Err::kInvalidArgument, "journal: member %u not open", m);
      break;
    }
    for (u32 b = 0; b < mem.journal_nbuckets && st.ok(); b++) {
      u64 offset = sb.BucketOffset(mem.journal_first_bucket + b);
      st = dev::QueueSyncIo(dm->queue(), IoOp::kRead, offset, bucket, sb.bucket_size, 0,
                            IoOrigin::kJournal);
      if (!st.ok()) {
        st = DiagError(diag, st, "journal: reading %s bucket %u: %s", mem.label, b, st.Message());
        break;
      }
      st = ScanBucket(bucket, sb.bucket_size, magic, floor, &found, out);
    }
  }
  platform::Free(bucket);
  TFS_TRY(st);

  Sort(found.data(), found.size(), [](const Found& a, const Found& b) { return a.seq < b.seq; });
  // Replicas of one entry: keep the first copy.
  usize unique = 0;
  for (usize i = 0; i < found.size(); i++) {
    if (unique > 0 && found[unique - 1].seq == found[i].seq) continue;
    if (unique != i) found[unique] = Move(found[i]);
    unique++;
  }
  TFS_TRY(found.Resize(unique));
  out->valid_entries = unique;

  u64 start = floor;
  for (const Found& f : found) {
    if (f.flush && f.last_seq > start) start = f.last_seq;
  }
  usize i = 0;
  while (i < found.size() && found[i].seq < start) i++;
  // The consecutive run from `start`, cut back to its newest flush entry.
  usize run_end = i;  // one past the last entry of the run
  usize last_flush = i;
  u64 expect = start;
  while (run_end < found.size() && found[run_end].seq == expect) {
    if (found[run_end].flush) last_flush = run_end + 1;
    run_end++;
    expect++;
  }
  if (run_end < found.size()) out->gap_at = expect;
  for (usize k = i; k < last_flush; k++) {
    TFS_TRY(out->entries.EmplaceBack());
    ReplayedEntry& e = out->entries.back();
    e.seq = found[k].seq;
    e.last_seq = found[k].last_seq;
    e.nkeys = found[k].nkeys;
    e.payload = Move(found[k].payload);
  }
  out->discarded_entries = found.size() - last_flush;
  if (out->gap_at != 0) {
    platform::Log(platform::LogLevel::kWarn,
                  "journal: entry %llu is missing or damaged; %llu later entries not replayed",
                  (unsigned long long)out->gap_at, (unsigned long long)out->discarded_entries);
  }
  return Status::Ok();
}

Status ForEachKey(const ReplayedEntry& entry, Status (*fn)(void* ctx, u64 seq, const Key& key),
                  void* ctx) {
  const u8* p = entry.payload.data();
  u32 bytes = u32(entry.payload.size());
  if (!KeysValid(p, bytes, entry.nkeys)) return Err::kCorrupt;
  u32 pos = 0;
  for (u32 i = 0; i < entry.nkeys; i++) {
    const auto* kh = reinterpret_cast<const KeyHeader*>(p + pos);
    Key k{kh->type.get(), kh->len.get(), p + pos + sizeof(KeyHeader)};
    TFS_TRY(fn(ctx, entry.seq, k));
    pos += KeySpace(k.len);
  }
  return Status::Ok();
}

}  // namespace tfs::journal
