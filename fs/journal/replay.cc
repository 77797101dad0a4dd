// Journal replay: scan every ring, validate every entry as hostile bytes, and pick
// the run of entries that is safe to apply.
//
// The run starts at L = the newest last_seq recorded by a valid *flush* entry (never
// below the superblock's journal_seq floor, below which everything was checkpointed)
// and continues while sequence numbers are consecutive. It then ends at the newest
// flush entry inside it: entries written without FUA after that were never promised
// durable and their data dependencies were never flushed, so applying them could
// point metadata at data that did not survive. Everything after a gap (a torn,
// corrupt or missing entry) is discarded and counted -- unless a flush entry
// after the gap proves the missing entries were durable (ProveDurableAfterGap):
// then the gap is damage, acknowledged changes are lost, and the result says so
// (durable_end); the store refuses a read-write mount and fsck -y replays past
// it (past_gaps).
//
// An unordered flush entry was written before the flush that made it and its
// data durable. Any later entry on disk proves that flush done (entries are
// written one after another, flushes included). If it is the newest entry found,
// the data checks of its group -- the entries after the previous flush entry, up
// to it -- are read and verified; should one fail, the power cut came before the
// flush, its commits were never acknowledged, and it counts as a plain entry
// (the run ends at the previous flush entry).
#include "journal/journal.h"
#include "util/sort.h"

namespace tfs::journal {
namespace {

struct Found {
  u64 seq;
  u64 last_seq;
  bool flush;
  bool unordered;
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
                h->last_seq.get() <= h->seq.get() && (h->flags.get() & ~kEntryFlagsKnown) == 0 &&
                ((h->flags.get() & kEntryUnordered) == 0 || (h->flags.get() & kEntryFlush) != 0);
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
    // Any valid entry, replayed or not, proves its roots gen was durable.
    if (h->roots_gen.get() > out->roots_gen) out->roots_gen = h->roots_gen.get();
    if (seq >= floor) {
      TFS_TRY(found->EmplaceBack());
      Found& f = found->back();
      f.seq = seq;
      f.last_seq = h->last_seq.get();
      f.flush = (h->flags.get() & kEntryFlush) != 0;
      f.unordered = (h->flags.get() & kEntryUnordered) != 0;
      f.nkeys = h->nkeys.get();
      TFS_TRY(f.payload.Resize(payload));
      MemCopy(f.payload.data(), data + pos + sizeof(EntryHeader), payload);
    }
    if (seq + 1 > out->next_seq) out->next_seq = seq + 1;
    pos += bytes;
  }
  return Status::Ok();
}

// Reads the range of one data check and compares its crcs. *ok = false on a
// mismatch; kCorrupt for a check that cannot be valid (the entry's crc matched:
// the journal wrote it so), kIo if the member cannot be read.
Status VerifyCheck(dev::DeviceSet& devs, const sb::Superblock& sb, const Key& k, u8* buf, u32 buf_bytes,
                   bool* ok, u64* read_bytes, Diag* diag) {
  if (k.len < sizeof(DataCheckFormat)) return DiagError(diag, Err::kCorrupt, "journal: short data check");
  const auto* dc = static_cast<const DataCheckFormat*>(k.val);
  const u32 member = dc->member.get();
  const u32 length = dc->length.get();
  const u32 unit = dc->unit.get();
  const u64 offset = dc->offset.get();
  const u32 ncrcs = DataCheckWellFormed(k.val, k.len);
  dev::Member* dm = member < sb.nr_members ? devs.member(member) : nullptr;
  const u64 span = (u64(length) + 4095) / 4096 * 4096;
  if (ncrcs == 0 || dm == nullptr ||
      offset > dm->bdev()->Info().size || span > dm->bdev()->Info().size - offset)
    return DiagError(diag, Err::kCorrupt, "journal: invalid data check (member %u, offset %llu, %u bytes)",
                     member, (unsigned long long)offset, length);
  // A degraded open's missing member: its copy can be neither read nor
  // verified (VerifyGroup: another copy of the group must verify).
  if (((devs.missing() >> member) & 1) != 0) return Err::kMissing;
  const u8* crcs = static_cast<const u8*>(k.val) + sizeof(DataCheckFormat);
  // Whole units per read (one unit when it is the only one, at most buf_bytes).
  const u32 step = ncrcs == 1 ? u32(span) : buf_bytes / unit * unit;
  for (u32 pos = 0, c = 0; pos < length; pos += step) {
    const u32 n = Min(step, length - pos);
    const u32 io_len = (n + 4095) / 4096 * 4096;
    Status st = dev::QueueSyncIo(dm->queue(), IoOp::kRead, offset + pos, buf, io_len, 0, IoOrigin::kJournal);
    if (!st.ok())
      return DiagError(diag, st, "journal: reading data to check on %s: %s", sb.members[member].label, st.Message());
    *read_bytes += io_len;
    for (u32 at = 0; at < n; at += unit, c++) {
      Le32 want;
      MemCopy(&want, crcs + 4 * c, 4);
      if (platform::Crc32c(buf + at, Min(unit, n - at)) != want.get()) {
        *ok = false;
        return Status::Ok();
      }
    }
  }
  return Status::Ok();
}

// Verifies every data check in found[from, to); `ranges` gets the range of
// each (cleared first; left empty unless all pass).
Status VerifyGroup(dev::DeviceSet& devs, const sb::Superblock& sb, const Vector<Found>& found, usize from,
                   usize to, bool* ok, u64* read_bytes, Vector<CheckedRange>* ranges, Diag* diag) {
  *ok = true;
  ranges->Clear();
  constexpr u32 kBuf = kMaxDataCheckUnit;
  u8* buf = nullptr;
  Status st;
  u32 verified = 0, skipped = 0;
  for (usize i = from; i < to && st.ok() && *ok; i++) {
    const Found& f = found[i];
    const u8* p = f.payload.data();
    for (u32 n = 0, pos = 0; n < f.nkeys && st.ok() && *ok; n++) {
      const auto* kh = reinterpret_cast<const KeyHeader*>(p + pos);
      const Key k{kh->type.get(), kh->len.get(), p + pos + sizeof(KeyHeader)};
      pos += KeySpace(k.len);
      if (k.type != kKeyDataCheck) continue;
      if (buf == nullptr) buf = static_cast<u8*>(platform::Alloc(kBuf, 4096));
      st = buf == nullptr ? Status(Err::kNoMemory) : VerifyCheck(devs, sb, k, buf, kBuf, ok, read_bytes, diag);
      if (st.code() == Err::kMissing) {  // (a missing member's copy: neither proof nor disproof)
        st = Status::Ok();
        skipped++;
        continue;
      }
      if (st.ok() && *ok) {  // (VerifyCheck validated the header)
        verified++;
        const auto* dc = static_cast<const DataCheckFormat*>(k.val);
        st = ranges->PushBack(CheckedRange{dc->member.get(), dc->offset.get(),
                                           (u64(dc->length.get()) + 4095) / 4096 * 4096});
      }
    }
  }
  platform::Free(buf);
  // Only copies on missing members: nothing proves or disproves the group's
  // data durable, and treating it as a torn tail could drop acknowledged
  // fsyncs without a word: the degraded open is refused instead.
  if (st.ok() && *ok && verified == 0 && skipped != 0)
    st = DiagError(diag, Err::kMissing,
                   "-o degraded: the data of the newest journal entries is only on missing members, so whether they "
                   "were durable is not known; mount with every member");
  if (!st.ok() || !*ok) ranges->Clear();
  return st;
}

// After a gap (found[gap] is the first entry past the missing sequence
// numbers): finds the newest entry that proves the missing ones were durable,
// a flush entry after them that was made durable together with everything
// written before it -- an ordered one (pre-flush, then FUA), or an unordered
// one with any entry after it (the next entry is written only once its flush
// ended). Entries are written one at a time, each after the previous write
// ended, so the missing ones were written before it, and that flush made them
// durable: they were damaged afterwards, and fsyncs acknowledged up to it
// would be lost. Sets out->durable_end and out->lost_entries; 0 if nothing
// proves it: a torn tail of a power cut. An unordered newest entry proves
// nothing here: a cache that kept some of its blocks at the power cut can
// leave it, and its data, without an earlier entry whose flush never came.
void ProveDurableAfterGap(const Vector<Found>& found, usize gap, ReplayResult* out) {
  for (usize k = found.size(); k-- > gap;) {
    const Found& f = found[k];
    if (!f.flush || (f.unordered && k + 1 == found.size())) continue;
    out->durable_end = f.seq;
    // Sequence numbers in [gap_at, durable_end] that no valid entry carries.
    out->lost_entries = out->durable_end - out->gap_at + 1 - (k - gap + 1);
    return;
  }
}

}  // namespace

Status ReadForReplay(dev::DeviceSet& devs, const sb::Superblock& sb, ReplayResult* out, Diag* diag,
                     bool past_gaps) {
  u64 uuid_word = 0;
  MemCopy(&uuid_word, sb.fs_uuid, 8);
  const u64 magic = kJournalMagic ^ uuid_word;
  const u64 floor = sb.journal_seq == 0 ? 1 : sb.journal_seq;
  out->entries.Clear();
  out->next_seq = floor;
  out->valid_entries = out->discarded_entries = out->bad_headers = out->gap_at = 0;
  out->unverified_seq = out->checked_bytes = 0;
  out->durable_end = out->lost_entries = out->start_seq = 0;
  out->checked.Clear();

  u8* bucket = static_cast<u8*>(platform::Alloc(sb.bucket_size, 4096));
  if (bucket == nullptr) return Err::kNoMemory;
  Vector<Found> found;
  Status st;
  for (u32 m = 0; m < sb.nr_members && st.ok(); m++) {
    const sb::Member& mem = sb.members[m];
    if (mem.journal_nbuckets == 0) continue;
    // A degraded open's missing member: its ring is not read (Store::Open
    // made sure every entry has a copy on a ring that is).
    if (((devs.missing() >> m) & 1) != 0) continue;
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
  // Replicas of one entry: keep one -- an ordered copy over an unordered one
  // (the writer writes an unordered entry again, ordered, when its flush
  // gave a member up; the ring not written again keeps the unordered copy,
  // which would make replay check the group's data: journal.cc, 5c-3).
  usize unique = 0;
  for (usize i = 0; i < found.size(); i++) {
    if (unique > 0 && found[unique - 1].seq == found[i].seq) {
      Found& kept = found[unique - 1];
      if (kept.flush && kept.unordered && found[i].flush && !found[i].unordered) kept = Move(found[i]);
      continue;
    }
    if (unique != i) found[unique] = Move(found[i]);
    unique++;
  }
  TFS_TRY(found.Resize(unique));
  out->valid_entries = unique;

  usize i, run_end, last_flush;
  u64 expect;
  for (;;) {
    u64 start = floor;
    for (const Found& f : found) {
      if (f.flush && f.last_seq > start) start = f.last_seq;
    }
    out->start_seq = start;
    i = 0;
    while (i < found.size() && found[i].seq < start) i++;
    // The consecutive run from `start`, cut back to its newest flush entry.
    run_end = i;  // one past the last entry of the run
    last_flush = i;
    expect = start;
    usize prev_flush = i;  // one past the flush entry before the newest one
    while (run_end < found.size() && found[run_end].seq == expect) {
      if (found[run_end].flush) {
        prev_flush = last_flush;
        last_flush = run_end + 1;
      }
      run_end++;
      expect++;
    }
    // Only an unordered flush entry that is the newest entry found can be
    // unproven; its group's data decides.
    if (last_flush == i || last_flush != found.size() || !found[last_flush - 1].unordered) break;
    bool ok;
    TFS_TRY(VerifyGroup(devs, sb, found, prev_flush, last_flush, &ok, &out->checked_bytes, &out->checked, diag));
    if (ok) break;
    Found& f = found[last_flush - 1];
    out->unverified_seq = f.seq;
    f.flush = false;
    platform::Log(platform::LogLevel::kWarn,
                  "journal: entry %llu was cut off before its data was durable; it is not replayed",
                  (unsigned long long)f.seq);
  }
  usize end = last_flush;  // one past the last entry replayed
  if (run_end < found.size()) {
    out->gap_at = expect;
    ProveDurableAfterGap(found, run_end, out);
    if (past_gaps && out->durable_end != 0) {
      while (end < found.size() && found[end].seq <= out->durable_end) end++;
      // The newest entry, if an unordered flush entry right after that proof
      // with nothing missing in between, is replayed on step 3's terms: its
      // group's data decides. (Past another gap nothing is proven.)
      const Found& newest = found.back();
      const bool consecutive = end < found.size() && newest.seq - found[end - 1].seq == found.size() - end;
      if (consecutive && found[end - 1].seq == out->durable_end && newest.flush && newest.unordered) {
        bool ok;
        TFS_TRY(VerifyGroup(devs, sb, found, end, found.size(), &ok, &out->checked_bytes, &out->checked, diag));
        if (ok) {
          end = found.size();
        } else {
          out->unverified_seq = newest.seq;
          platform::Log(platform::LogLevel::kWarn,
                        "journal: entry %llu was cut off before its data was durable; it is not replayed",
                        (unsigned long long)newest.seq);
        }
      }
    }
  }
  for (usize k = i; k < end; k++) {
    TFS_TRY(out->entries.EmplaceBack());
    ReplayedEntry& e = out->entries.back();
    e.seq = found[k].seq;
    e.last_seq = found[k].last_seq;
    e.nkeys = found[k].nkeys;
    e.payload = Move(found[k].payload);
  }
  out->discarded_entries = found.size() - end;
  if (out->durable_end != 0) {
    platform::Log(platform::LogLevel::kError,
                  "journal: entry %llu is damaged, but later entries up to %llu were durable (acknowledged); %llu "
                  "entries in between are lost, %s",
                  (unsigned long long)out->gap_at, (unsigned long long)out->durable_end,
                  (unsigned long long)out->lost_entries,
                  past_gaps ? "the rest is replayed" : "nothing after the damage is replayed");
  } else if (out->gap_at != 0) {
    platform::Log(platform::LogLevel::kWarn,
                  "journal: entry %llu is missing or torn; %llu later entries, not proven durable, are not replayed",
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
