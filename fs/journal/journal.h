// Journal: the ordered, checksummed log every metadata change commits through.
//
// Commit modes (docs/format/journal.md, docs/design/io-queues.md):
//  - kNoFlush: the keys join the open entry and Commit() returns at once with the
//    entry's sequence number; the entry is written soon after (write_delay), in
//    order, but not made durable. Ordering only.
//  - kFlush: Commit() returns when the entry holding the keys, and every entry
//    before it, is durable. The writer first flushes -- in parallel -- only the
//    devices that owe durability for what the entries depend on: the `deps`
//    devices of their commits that hold durability debt, plus journal devices that
//    received non-FUA entries since the last durable point. Then it writes the entry
//    with FUA. A commit that depends only on SSD data never flushes an HDD.
//    Unordered flush entries: if every commit since the last durable entry either
//    has no deps or carries kKeyDataCheck keys for all of its data (crc32cs of the
//    device ranges its keys point at), the entry is written first and then the
//    same devices and the journal's are flushed together -- one device round trip
//    less. Replay checks that group's data while the entry is the newest on disk
//    (ReadForReplay), so space such entries free is reused only once settled.
//  - kFlushNext: kNoFlush from a caller that calls Flush() right after (fsync's
//    data commit): the writer thread is not woken for it, since the caller will
//    write the entry itself (each needless wake-up cost a futex call and a CPU).
//
// Group commit: commits accumulate in the open buffer while the previous entry is
// being written; one write carries them all. Entries are written one at a time, by
// whoever holds the writer's role (`writing_`), so they reach disk in sequence
// order. The writer thread writes timed entries and everything that needs reclaim;
// a thread that waits for durability (kFlush commit, Flush) and finds the role
// free and ring room at hand writes the entry itself, its I/O inline in its own
// thread: an fsync then costs no thread hand-off at all (docs/design/io-queues.md).
//
// Reclaim through pins: Commit() can pin the entry (JournalPin). An entry's ring
// space is reused only once no pin at or before its sequence remains and a durable
// entry has recorded that (its last_seq). When space runs low the writer calls the
// reclaim hook, asking owners to persist their state and drop pins.
//
// Room and watermarks (docs/format/journal.md): a kNormal commit joins the open entry only if
// the entries not yet placed on the rings -- the one being written and the open
// one with this commit -- fit while a reserve of `reserve_buckets` and one bucket
// of slack stay free; otherwise it waits, and the writer calls the reclaim hook.
// So an entry holding commits never waits for ring space, and reclaim -- which
// must flush those entries (write-ahead) before it can drop pins -- cannot wait on
// itself. The reserve is for the entries reclaim needs: empty flush entries,
// entries that advance last_seq, and entries with kReclaim commits (changes made
// by reclaim itself, e.g. the allocation of the buckets a checkpoint writes),
// which never wait. A bucket opened from the reserve is used only by such entries.
//
// An idle journal writes nothing: entries are written only when there are keys or a
// flush was requested, and a timed flush happens only after non-durable entries.
//
// Thread safety: Commit/Flush/PinDrop from any thread; Start/Stop from one. `mu_`
// guards all state; it is never held across device I/O or the reclaim hook.
#ifndef TFS_JOURNAL_JOURNAL_H_
#define TFS_JOURNAL_JOURNAL_H_

#include "dev/device_set.h"
#include "journal/format.h"
#include "platform/atomic.h"
#include "platform/platform.h"
#include "platform/sync.h"
#include "sb/superblock.h"
#include "util/counters.h"
#include "util/diag.h"
#include "util/histogram.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::journal {

struct Key {
  u16 type;
  u32 len;
  const void* val;
};

enum class CommitMode : u8 { kNoFlush, kFlush, kFlushNext };

// Who commits: kNormal commits wait for ring room (see above); kReclaim commits
// (made while reclaiming ring space) never do and may use the reserve.
enum class Watermark : u8 { kNormal, kReclaim };

// Holds an entry's ring space until dropped. Owned by the caller; must be dropped
// (PinDrop) before it is destroyed or reused.
struct Pin {
  u64 seq = 0;
  bool active = false;
};

// The smallest ring the default Config runs on: the bucket being filled, the
// reserve, the slack commits leave (Admits) and one more.
inline constexpr u32 kMinRingBuckets = 4;

struct Config {
  u32 max_entry_bytes = 256 * 1024;            // also the open buffer size
  u64 write_delay_ns = 2 * 1000 * 1000;        // no-flush entries wait this long for company
  u64 flush_delay_ns = 1000ull * 1000 * 1000;  // non-durable entries become durable within this
  u32 reserve_buckets = 1;                     // ring space kept for last_seq-advancing entries
  // Unordered flush entries only while the data checks since the last durable
  // entry cover at most this much (what a replay may have to read); 0: never.
  u64 max_unordered_check_bytes = 4ull << 20;
};

// The journal's counters (util/counters.h). It keeps them under its own lock,
// in a Stats; GetStats fills the level rows.
#define TFS_JOURNAL_COUNTERS(X, A)                                                             \
  X(commits, counter, "transactions committed")                                                \
  X(flush_commits, counter, "of which asked to be durable (fsync)")                            \
  X(entries, counter, "entries written")                                                       \
  X(degraded_entries, counter, "of which on fewer rings than metadata_replicas (missing or failed members' rings)") \
  X(ring_write_errors, counter, "ring writes failed whose entry another ring took (the member marked failed)") \
  X(flushes_given_up, counter, "pre-flushes of failed members skipped or failed while the entry went on (their data had copies elsewhere)") \
  X(rewritten_ordered, counter, "unordered entries written again ordered after their flush gave a member up") \
  X(flushes_late, counter, "pre-flushes of a stalling member given up past its late bound, or at once while its last one was still out (its data in the entry had copies elsewhere: 6c-2)") \
  X(flushes_out, gauge, "pre-flushes given up late and not yet completed")                   \
  X(ring_writes_late, counter, "ring writes of a stalling member given up past its late bound once another ring took the entry (6c-2)") \
  X(rings_held, gauge, "rings holding a ring write given up late: no entry goes there until it completes") \
  X(rings_passed_stalling, counter, "entries placed on other rings than a stalling member's (6c-2)") \
  X(flush_entries, counter, "of which durable (FUA after a pre-flush, or unordered)")          \
  X(unordered_entries, counter, "of which written first and flushed after (see Commit)")      \
  X(bytes, counter, "entry bytes written (per replica)")                                       \
  X(keys, counter, "keys committed")                                                           \
  A(preflushes, ::tfs::dev::kMaxDevices, counter, "flushes issued per member before entries")         \
  X(space_waits, counter, "times the writer waited for ring space (room ran out anyway)")      \
  X(room_waits, counter, "normal commits that waited for ring room")                           \
  X(reserve_entries, counter, "entries placed in the reserve")                                 \
  X(reclaim_calls, counter, "reclaim hooks called (a change of last_seq, or every 50 ms)")                              \
  X(max_group, level, "most commits carried by one entry")                                     \
  X(caller_entries, counter, "entries written by a waiting committer, not the writer thread") \
  X(next_seq, level, "the open entry's sequence number (0: none)")                          \
  X(durable_seq, level, "newest durable entry")                                              \
  X(last_seq, level, "oldest entry replay still needs")                                      \
  X(ring_buckets, level, "buckets of the smallest ring")                                     \
  X(free_buckets, level, "reusable buckets of the fullest ring (as of the last durable entry)")

struct Stats {
  TFS_COUNTER_FIELDS(TFS_JOURNAL_COUNTERS)
};

// What replay found on the rings; input to Start().
struct ReplayedEntry {
  u64 seq;
  u64 last_seq;
  u32 nkeys;
  Vector<u8> payload;  // the keys, validated
};

// A device range a replayed group's data check read (member, byte offset,
// bytes rounded up to 4 KiB).
struct CheckedRange {
  u32 member;
  u64 offset;
  u64 bytes;
};

struct ReplayResult {
  Vector<ReplayedEntry> entries;  // consecutive sequence numbers, oldest first
  u64 next_seq = 1;               // first sequence number not seen on disk
  u64 valid_entries = 0;          // valid entries found (all rings, replicas counted once)
  u64 discarded_entries = 0;      // valid but after a gap (torn or missing entry)
  u64 bad_headers = 0;            // blocks with our magic that failed validation
  u64 gap_at = 0;                 // first missing sequence in the replay range, 0 if none
  u64 unverified_seq = 0;  // an unordered flush entry whose data checks failed: not replayed
  u64 checked_bytes = 0;   // data read to verify the newest unordered flush entry's group
  // The ranges that group's data checks read, when it passed and is
  // replayed: until the superblock moves the journal past it, the next
  // mount checks them again, so nothing may be written there (Store::Open
  // holds their free buckets; allocator.h, HoldFree).
  Vector<CheckedRange> checked;
  u64 roots_gen = 0;       // the newest roots gen any valid entry records as durable (EntryHeader)
  // Damage, not a torn tail: a valid entry after the gap proves the missing
  // ones were durable (docs/format/journal.md, "Damage in the middle"). The
  // newest such entry (0: none), and the sequence numbers up to it that no
  // valid copy carries.
  u64 durable_end = 0;
  u64 lost_entries = 0;
  // Where replay starts (the newest last_seq of a valid flush entry, never
  // below the floor): the journal holds every durable change from here on,
  // whether or not any entry is replayed.
  u64 start_seq = 0;
};

// Reads every journal ring of the filesystem (members in member order, already
// checked) and returns the entries replay must apply: from the newest last_seq
// (never below sb.journal_seq) up to the first missing, torn or corrupt entry,
// cut back to the newest flush entry -- whose data is read and checked first if
// it is unordered and the newest entry on disk (see kEntryUnordered). With
// `past_gaps`, when the gap is damage (durable_end != 0) the entries go on past
// it, every valid one up to durable_end (fsck -y: what survives of acknowledged
// changes; the allocation state must then be rebuilt from the trees).
Status ReadForReplay(dev::DeviceSet& devs, const sb::Superblock& sb, ReplayResult* out,
                     Diag* diag = nullptr, bool past_gaps = false);
// Calls fn(ctx, seq, key) for each key of `entry`, in order.
Status ForEachKey(const ReplayedEntry& entry, Status (*fn)(void* ctx, u64 seq, const Key& key),
                  void* ctx);

class Journal {
 public:
  Journal() = default;
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Starts writing at sequence `next_seq` at the beginning of every ring (all older
  // ring contents are reclaimable: the caller has persisted what replay applied).
  Status Start(dev::DeviceSet* devs, const sb::Superblock& sb, u64 next_seq, const Config& config);
  // Makes everything committed durable and stops the writer. Idempotent.
  Status Stop();

  // Copies `keys` into the journal. kNoFlush returns once they are in an entry;
  // kFlush once that entry is durable. `deps` names the members whose completed
  // writes these keys describe. With `pin`, the entry stays in the ring until
  // PinDrop(pin). Errors: kTooBig (keys larger than an entry), kIo (the journal
  // failed: the filesystem must go read-only), kInvalidArgument after Stop.
  // A kNormal commit may first wait for ring room (never hold anything reclaim
  // needs while committing); kReclaim is for reclaim's own changes.
  // kKeyDataCheck keys (DataCheckFormat) describe data the commit depends on:
  // a commit that carries any carries one for every range its deps stand for,
  // and each names a member in deps (else kInvalidArgument). Commits with deps
  // and no checks make the flush entry that covers them ordered.
  // `lossable`: the members of deps whose data these keys describe all has
  // a copy on another member, verified by its checksums at every read: if
  // such a member's pre-flush fails (5c-3), the entry goes on without it
  // (those copies may be lost, never served); 0: none may be lost.
  Result<u64> Commit(const Key* keys, u32 nkeys, dev::DevMask deps, CommitMode mode,
                     Pin* pin = nullptr, Watermark wm = Watermark::kNormal, dev::DevMask lossable = 0);
  // Makes every commit so far durable; returns at once (no I/O) if it already is.
  Status Flush();
  // Makes every commit so far settled (see settled_seq): Flush, then, if the
  // newest durable entry was unordered, one ordered entry more.
  Status Settle();
  // Writes a durable entry if the pins allow a newer last_seq than the journal has
  // recorded, so that ring space freed by dropped pins becomes reusable now rather
  // than at the next flush; returns at once otherwise.
  Status AdvanceLastSeq();
  void PinDrop(Pin* pin);
  // Pins `pin` at `seq` (or the oldest still pinnable sequence if `seq` is older).
  // To move a pin, take the new one before dropping the old: in between, an
  // entry written would record a last_seq past the entries the old pin held,
  // and replay would start after them.
  Status PinAt(Pin* pin, u64 seq);

  // Called by the writer (never with mu_ held) when ring space runs low: persist
  // state for entries up to `seq` and drop their pins.
  void SetReclaimHook(void (*fn)(void* ctx, u64 seq), void* ctx);

  Stats GetStats() const;
  // Ring room as of the last entry written, without taking the journal's lock
  // (see Stats::free_buckets / ring_buckets); both 0 before the first entry.
  void Room(u32* free_buckets, u32* ring_buckets) const;
  u32 max_entry_bytes() const { return config_.max_entry_bytes; }
  // The sequence number the next entry will get.
  u64 next_seq() const;
  // The btree's roots block of `gen` is durable: every entry written from now
  // on records it (EntryHeader::roots_gen), so replay can tell a lost newer
  // roots block from the one it finds. Only grows.
  void NoteRootsGen(u64 gen);
  // Every entry up to this sequence number is durable.
  u64 durable_seq() const;
  // Every entry up to this sequence number is durable and no replay will check
  // its data again: what those entries free may be overwritten. An unordered
  // entry's group (the entries after the previous durable one, up to it)
  // settles once a later entry is durable; replay checks its data only while
  // it is the newest entry on disk, and reused space would fail that check.
  u64 settled_seq() const;
  // Latency histograms of Commit() by mode, in ns. kFlush commits are all
  // timed; kNoFlush commits are sampled, one in kNoFlushSample (reading the
  // clock twice per commit was 9% of a sequential btree load).
  static constexpr u32 kNoFlushSample = 16;
  void ReadLatency(CommitMode mode, Histogram* out) const;

 private:
  struct Buf;
  struct IoSlot;
  struct Ring {
    u32 member;          // device index
    u64 first_bucket;    // on the device
    u32 nbuckets;
    u32 cur = 0;         // ring bucket being filled
    u32 offset = 0;      // bytes used in it
    bool cur_reserve = false;  // cur was opened from the reserve: only reserve entries use it
    Vector<u64> bucket_seq;  // newest seq in each ring bucket (0: none)
  };

  static void WriterMain(void* arg);
  void WriterLoop();
  // True if the open buffer should be written now; sets *wait_ns otherwise.
  bool ReadyToWrite(u64 now, u64* wait_ns) const;
  Status WriteEntry(Buf* buf);
  // Takes the open buffer and writes it as the holder of the writer's role.
  // Requires mu_ and !writing_; drops and retakes it.
  void WriteOpen();
  // Waits until entry `target` is durable (settled), writing the open entry (as
  // a flush entry; ordered to settle) in this thread whenever the writer's role
  // is free and CanPlaceOpen(). Requires mu_.
  Status WaitDurable(u64 target, bool settle);
  // Whether the open buffer, written now, finds ring room without reclaim (Place
  // would succeed at once). Requires mu_.
  bool CanPlaceOpen() const;
  // Place's choice of rings, without claiming the space: those with the
  // most free space, a stalling member's (dev::Stalling) only if the others
  // cannot take the entry (*passed: one was passed over). Requires mu_.
  bool Choose(u32 bytes, bool allow_reserve, u32* ring_idx, u32* nrings, bool* passed = nullptr) const;
  // The pre-flush of `want` (members owing durability to the entry) for an
  // entry whose data or earlier entries have their only copy on `needed`
  // (5c-3). A failed member that is not needed is not flushed (nothing is
  // written to it any more; its flush may take a timeout to fail); one
  // whose flush fails is marked failed and, if not needed, given up too.
  // 6c-2: with every copy verified by its checksum (verified_) and nothing
  // else given up, one member that is not needed is given up *late* -- its
  // flush not done within its late bound while it is stalling
  // (dev::Stalling), or its flush given up before still out -- and its
  // flush left to complete (flushes_out_; a failure then marks it failed).
  // A needed member whose earlier flush is still out waits for it, then is
  // flushed again. Fails the entry when a needed member's flush fails,
  // when a flush fails without marking its member, or when two members are
  // given up at once (an extent may have had its copies on both).
  // *given_up: the members gone on without (*late among them). The writer
  // role held, without mu_.
  Status PreFlush(dev::DevMask want, dev::DevMask needed, dev::DevMask* given_up, dev::DevMask* late);
  // Submits a flush of `member` in its slot (busy until it completes);
  // `waiting`: the writer waits for it next, it may run in this thread.
  void SubmitFlush(u32 member, bool waiting);
  // Writes the entry in buf (`bytes`, with `flags`) to the n rings'
  // members at `offsets`, each in its member's write slot, and fills per[]
  // (a failed member gets nothing: kMissing). 6c-2: with two rings or more,
  // once one took the entry, one whose member is stalling past its late
  // bound is given up (*late; per kIoTimeout): its write stays out, owning
  // the buffer it reads (buf gets a fresh one), and its ring is held
  // (RingHeld) until it completes. With two rings or more no write is
  // submitted inline (one stalling would hold the writer inside Submit).
  // The writer role held, without mu_.
  void WriteRings(Buf* buf, u32 bytes, u8 flags, const u32* members, const u64* offsets, u32 n, Status* per,
                  dev::DevMask* late);
  // The I/Os given up late that completed since: their buffers freed, and
  // a failed one marks its member failed (the entries that went on without
  // it said nothing of its durability, so nothing else changes). The
  // writer's (or Stop's).
  void NoteLateIos();
  // Members whose slot (flush_slots_ or write_slots_) has an I/O still
  // out; with late_only, only those given up late.
  dev::DevMask SlotsOut(const IoSlot* slots, bool late_only = false) const;
  // When every live ring is held (6c-2), or with `any` when some is: waits
  // (mu_ dropped) up to 50 ms for a late ring write to end, notes the
  // ended ones, returns true (the caller tries again; also when one ended
  // while it looked); false when no live ring is held (or, without `any`,
  // some live ring is free). Requires mu_ and the writer's role.
  bool WaitHeldRing(bool any);
  static void SlotDone(dev::Io* io, Status st);
  // Chooses rings (Choose) and claims positions on them for an entry of `bytes`;
  // false if no space.
  bool Place(u32 bytes, bool allow_reserve, u32* ring_idx, u32* nrings, u64* offsets);
  // Place, waiting for reclaim as needed (see the .cc); kIo when no ring
  // is left. Requires mu_ (drops it around the reclaim hook).
  Status PlaceEntry(Buf* buf, u32 bytes, bool built, u64* last_seq, u32* ring_idx, u32* nrings, u64* offsets);
  // Whether a kNormal commit may grow the open entry to `open_bytes`: the entries
  // not yet placed fit the rings by Place's rules, leaving the reserve and one
  // bucket of slack (for kReclaim keys joining admitted entries). Requires mu_.
  bool Admits(u32 open_bytes) const;
  // Called by the writer while commits wait for room: asks for an entry that
  // advances last_seq, or calls the reclaim hook (once per reclaim round, else
  // every 50 ms). Requires mu_ (dropped around the hook).
  void MakeRoom();
  u32 FreeBuckets(const Ring& r) const;
  u64 MinPinnedSeq() const;
  // Publishes the ring room for Room(). Requires mu_.
  void PublishRoom();
  // Whether ring r's member was marked failed (dev::DeviceSet::MarkFailed,
  // step 5c-3): nothing is written to it from then on. The rings not out;
  // the smallest ring and the fewest free buckets among them (0s if none).
  bool RingOut(const Ring& r) const;
  // Whether ring r's member has a ring write given up late still out
  // (6c-2): no entry goes there until it completes (its write slot is in
  // use; and the member is stalling).
  bool RingHeld(const Ring& r) const;
  u32 LiveRings() const;
  void LiveRoom(u32* ring_buckets, u32* free_buckets) const;
  // Submits ios[i] to member members[i] (i < n, each prepared by
  // PrepareIo), waits for them all and fills per[i] with each one's
  // result. Without mu_ (the writer's role held).
  // With skip_failed, a member marked failed gets no I/O (per: kMissing).
  void SubmitLatched(dev::LatchedIo* ios, u32 n, const u32* members, Status* per, bool skip_failed);
  Status PinAdd(u64 seq);
  void PinRelease(u64 seq);

  dev::DeviceSet* devs_ = nullptr;
  Config config_;
  u64 magic_ = 0;
  u32 bucket_size_ = 0;
  u32 replicas_ = 1;          // rings per entry: metadata_replicas, capped at the rings there are
  u32 wanted_replicas_ = 1;   // metadata_replicas (degraded_entries: fewer)
  Vector<Ring> rings_;

  mutable Mutex mu_;
  CondVar cv_;        // writer wake-ups
  CondVar done_cv_;   // entry written / durable / pins dropped
  Buf* bufs_[2] = {nullptr, nullptr};
  u32 open_ = 0;               // index of the open buffer
  bool writing_ = false;       // someone holds the writer's role (see Group commit)
  bool writer_parked_ = false;  // the writer thread waits for a committer's write to end
  u64 writer_wakes_ns_ = 0;     // when the waiting writer thread wakes by itself (0: awake)
  const Buf* unplaced_ = nullptr;  // the entry being written, until Place() found it room
  u32 room_waiters_ = 0;           // kNormal commits waiting for room
  u64 last_hook_ns_ = 0;           // when MakeRoom() last called the reclaim hook,
  u64 hook_last_seq_ = 0;          // and durable_last_seq_ then
  bool stop_ = false;
  bool started_ = false;
  Status failed_;              // sticky journal error
  u64 written_seq_ = 0;        // newest entry written
  u64 durable_seq_ = 0;        // newest entry known durable
  u64 settled_seq_ = 0;        // newest entry durable and never to be checked again
  bool pending_unchecked_ = false;  // entries since durable hold an unchecked commit
  u64 pending_check_bytes_ = 0;     // bytes the data checks since durable cover
  u64 durable_last_seq_ = 0;   // last_seq recorded by the newest durable entry
  u64 oldest_nondurable_ns_ = 0;  // write time of the oldest written-not-durable entry
  dev::DevMask pending_deps_ = 0;      // deps of entries not yet durable
  dev::DevMask nonfua_written_ = 0;    // journal members with non-FUA entries since durable
  dev::DevMask pending_sole_ = 0;      // Buf::sole of entries not yet durable
  dev::DevMask nonfua_sole_ = 0;       // members holding a non-durable entry's only copy
  dev::DevMask ring_members_ = 0;      // members holding a ring (set by Start)
  // Pin counts per sequence number, starting at pin_base_.
  u64 pin_base_ = 0;
  Vector<u32> pin_counts_;
  void (*reclaim_fn_)(void*, u64) = nullptr;
  void* reclaim_ctx_ = nullptr;
  Stats stats_{};
  Atomic<u64> roots_gen_{0};  // NoteRootsGen
  Atomic<u64> room_{0};  // ring buckets << 32 | free buckets (PublishRoom)
  Atomic<u32> nofl_commits_{0};  // picks the kNoFlush commits whose latency is sampled
  Histogram* latency_[2] = {nullptr, nullptr};
  platform::Thread writer_;
  // Requests the writer issues (one entry at a time), kept here rather than on the
  // stack: they are large and the kernel stack is small.
  dev::LatchedIo write_ios_[dev::kMaxDevices];
  // The pre-flushes and the ring writes, one slot per member (PreFlush,
  // WriteRings): an I/O given up late keeps its slot busy until it
  // completes.
  struct IoSlot {
    dev::Io io;
    Journal* journal = nullptr;
    Atomic<i32> err{0};
    Atomic<u32> busy{0};    // submitted and not completed
    Atomic<u32> late{0};    // given up while out: its result is NoteLateIos' (set and cleared by the writer)
    u8* owned = nullptr;    // a late ring write's buffer (freed by NoteLateIos)
  };
  IoSlot flush_slots_[dev::kMaxDevices];
  IoSlot write_slots_[dev::kMaxDevices];
  Atomic<u32> slot_events_{0};  // slot completions (the writer sleeps on it)
  Atomic<u32> slots_busy_{0};   // slots busy: Stop waits for 0 (a completion's last touch)
  bool verified_ = false;        // every data copy carries a checksum a read verifies (6c-2)
};

}  // namespace tfs::journal

#endif  // TFS_JOURNAL_JOURNAL_H_
