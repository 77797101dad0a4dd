#include "journal/journal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "data/testing.h"
#include "userspace/platform/mem_device.h"

namespace tfs::journal {
namespace {

using userspace::MemDevice;
using userspace::MemDeviceOptions;

constexpr u32 kBucket = 64 * 1024;
constexpr u64 kDevSize = 8ull << 20;  // 1 MiB reserved + 112 buckets

// Two members: "ssd.a" (journal, volatile cache) and "hdd.b" (data only).
struct Fixture {
  explicit Fixture(u32 journal_buckets = 8, std::vector<std::vector<uint8_t>> images = {}) {
    Init(journal_buckets, std::move(images));
  }
  // hdd.b behind a GateDevice holding back its requests of (op, origin)
  // while closed (`gate`).
  Fixture(IoOp op, IoOrigin origin) : gate_op(op), gate_origin(origin), gated(true) { Init(8, {}); }
  void Init(u32 journal_buckets, std::vector<std::vector<uint8_t>> images) {
    memset(&sb, 0, sizeof(sb));
    sb::NewUuid(sb.fs_uuid);
    sb.seq = 1;
    sb.bucket_size = kBucket;
    sb.btree_node_size = 4096;
    sb.block_size = 4096;
    sb.journal_seq = 1;
    sb.options.data_replicas = sb.options.metadata_replicas = 1;
    sb.nr_members = 2;
    for (u32 i = 0; i < 2; i++) {
      sb::Member& m = sb.members[i];
      sb::NewUuid(m.uuid);
      strcpy(m.label, i == 0 ? "ssd.a" : "hdd.b");
      m.size = kDevSize;
      m.nbuckets = (kDevSize - sb::kBucketsOffset) / kBucket;
      m.journal_first_bucket = 1;
      m.journal_nbuckets = i == 0 ? journal_buckets : 0;
      m.data_allowed = i == 0 ? sb::kDataAll : sb::kDataUser;
    }
    Open(std::move(images));
  }
  void Open(std::vector<std::vector<uint8_t>> images) {
    for (u32 i = 0; i < 2; i++) {
      MemDeviceOptions o;
      o.name = sb.members[i].label;
      o.size = kDevSize;
      o.volatile_cache = true;
      if (!images.empty()) o.initial_image = std::move(images[i]);
      mem[i] = std::make_unique<MemDevice>(o);
      BlockDevice* d = mem[i].get();
      if (i == 1 && gated) {
        gate = std::make_unique<testing::GateDevice>(d, gate_op, gate_origin);
        d = gate.get();
      }
      EXPECT_TRUE(devs.Add(d, sb.members[i].label, dev::QueueConfig{}).ok());
    }
  }
  // A fresh fixture over what a power cut now would leave on both devices.
  std::unique_ptr<Fixture> AfterPowerCut() const {
    auto images = MemDevice::SnapshotDurable({mem[0].get(), mem[1].get()});  // one instant for both
    return std::make_unique<Fixture>(*this, std::move(images[0]), std::move(images[1]));
  }
  Fixture(const Fixture& o, std::vector<uint8_t> a, std::vector<uint8_t> b) : sb(o.sb) {
    std::vector<std::vector<uint8_t>> imgs;
    imgs.push_back(std::move(a));
    imgs.push_back(std::move(b));
    Open(std::move(imgs));
  }

  // hdd.b carries a journal ring of `buckets` too (and takes metadata), for
  // a journal Started after this.
  void GiveHddARing(u32 buckets) {
    sb.members[1].journal_nbuckets = buckets;
    sb.members[1].data_allowed = sb::kDataAll;
  }

  // A 4 KiB foreground data write to member m, waited for: the member owes
  // a flush (durability debt) until one covers it.
  Status WriteData(u32 m) {
    std::vector<u8> data(4096, 0x22);
    return dev::QueueSyncIo(devs.member(m)->queue(), IoOp::kWrite, 4 << 20, data.data(), 4096, 0,
                            IoOrigin::kForegroundWrite);
  }

  IoOp gate_op = IoOp::kRead;
  IoOrigin gate_origin = IoOrigin::kOther;
  bool gated = false;
  sb::Superblock sb;
  std::unique_ptr<MemDevice> mem[2];
  std::unique_ptr<testing::GateDevice> gate;  // (before devs: the set's queues go first)
  dev::DeviceSet devs;
};

Config FastConfig() {
  Config c;
  c.write_delay_ns = 1 * platform::kNsPerMs;
  c.flush_delay_ns = 50 * platform::kNsPerMs;
  return c;
}

// Keys stay needed for replay only while pinned (an unpinned entry is reclaimable
// as soon as a later durable entry records that). Tests that expect replay keep
// every pin until the end, like an owner that never persisted anything.
struct Pins {
  std::mutex mu;
  std::deque<Pin> pins;
  Pin* New() {
    std::lock_guard<std::mutex> lock(mu);
    pins.emplace_back();
    return &pins.back();
  }
};
Result<u64> CommitValue(Journal& j, u64 v, CommitMode mode, dev::DevMask deps = 0,
                        Pin* pin = nullptr, Pins* pins = nullptr) {
  Key k{kKeyTest, sizeof(v), &v};
  if (pin == nullptr && pins != nullptr) pin = pins->New();
  return j.Commit(&k, 1, deps, mode, pin);
}

// All kKeyTest values replay would apply, in order.
std::vector<u64> Replayed(Fixture& f, ReplayResult* rr = nullptr) {
  ReplayResult local;
  ReplayResult& r = rr ? *rr : local;
  Diag d;
  Status st = ReadForReplay(f.devs, f.sb, &r, &d);
  EXPECT_TRUE(st.ok()) << d.text;
  std::vector<u64> values;
  for (const ReplayedEntry& e : r.entries) {
    Status s = ForEachKey(e, [](void* ctx, u64, const Key& k) -> Status {
      if (k.type == kKeyDataCheck) return Status::Ok();
      EXPECT_EQ(k.type, kKeyTest);
      EXPECT_EQ(k.len, 8u);
      u64 v;
      memcpy(&v, k.val, 8);
      static_cast<std::vector<u64>*>(ctx)->push_back(v);
      return Status::Ok();
    }, &values);
    EXPECT_TRUE(s.ok());
  }
  return values;
}

TEST(JournalTest, CommitStopReplayRoundTrip) {
  Fixture f;
  Pins pins;
  {
    Journal j;
    ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
    for (u64 i = 0; i < 500; i++) {
      ASSERT_TRUE(CommitValue(j, i, i % 50 == 49 ? CommitMode::kFlush : CommitMode::kNoFlush, 0,
                              nullptr, &pins).ok());
    }
    ASSERT_TRUE(j.Stop().ok());
    Stats s = j.GetStats();
    EXPECT_EQ(s.commits, 500u);
    EXPECT_EQ(s.keys, 500u);
    EXPECT_GE(s.flush_entries, 10u);
    EXPECT_EQ(s.durable_seq + 1, s.next_seq);
  }
  // Stop made everything durable: a power cut now loses nothing.
  auto after = f.AfterPowerCut();
  ReplayResult rr;
  std::vector<u64> values = Replayed(*after, &rr);
  ASSERT_EQ(values.size(), 500u);
  for (u64 i = 0; i < 500; i++) EXPECT_EQ(values[i], i);
  EXPECT_EQ(rr.gap_at, 0u);
  EXPECT_EQ(rr.discarded_entries, 0u);
}

TEST(JournalTest, ScopedPreFlushSkipsDevicesTheEntryDoesNotDependOn) {
  Fixture f;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  dev::Member* ssd = f.devs.member(0);
  dev::Member* hdd = f.devs.member(1);
  std::vector<u8> data(4096, 0x11);
  // Background work leaves the HDD with unflushed writes (durability debt).
  ASSERT_TRUE(dev::QueueSyncIo(hdd->queue(), IoOp::kWrite, 4 << 20, data.data(), 4096, 0,
                               IoOrigin::kReconcile).ok());
  ASSERT_EQ(f.devs.DebtMask(), 0b10u);
  // A foreground write to the SSD, then a durable commit that depends on it.
  ASSERT_TRUE(dev::QueueSyncIo(ssd->queue(), IoOp::kWrite, 4 << 20, data.data(), 4096, 0,
                               IoOrigin::kForegroundWrite).ok());
  f.mem[0]->ResetCounters();
  f.mem[1]->ResetCounters();
  ASSERT_TRUE(CommitValue(j, 1, CommitMode::kFlush, /*deps=*/0b01).ok());
  EXPECT_EQ(f.mem[1]->ops(IoOp::kFlush), 0u) << "an SSD-only commit flushed the HDD";
  EXPECT_EQ(f.mem[0]->ops(IoOp::kFlush), 1u);  // the SSD owed the data write
  EXPECT_TRUE(f.devs.DebtMask() & 0b10u);       // the HDD still owes its write

  // A commit with no SSD debt and no deps: FUA alone, no flush anywhere.
  ASSERT_TRUE(CommitValue(j, 2, CommitMode::kFlush, 0).ok());
  EXPECT_EQ(f.mem[0]->ops(IoOp::kFlush), 1u);
  EXPECT_EQ(f.mem[1]->ops(IoOp::kFlush), 0u);

  // A commit that depends on the HDD data flushes the HDD, once.
  ASSERT_TRUE(CommitValue(j, 3, CommitMode::kFlush, 0b10).ok());
  EXPECT_EQ(f.mem[1]->ops(IoOp::kFlush), 1u);
  EXPECT_EQ(f.devs.DebtMask(), 0u);
  Stats s = j.GetStats();
  EXPECT_EQ(s.preflushes[1], 1u);
  ASSERT_TRUE(j.Stop().ok());
}

TEST(JournalTest, NoFlushEntriesBeforeAFlushAreMadeDurableByIt) {
  Fixture f;
  Config c = FastConfig();
  c.flush_delay_ns = 60 * platform::kNsPerSec;  // no timed flush during the test
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  for (u64 i = 0; i < 20; i++) {
    ASSERT_TRUE(CommitValue(j, i, CommitMode::kNoFlush, 0, nullptr, &pins).ok());
    platform::SleepNs(2 * platform::kNsPerMs);  // let several no-flush entries be written
  }
  EXPECT_GE(j.GetStats().entries, 2u);
  // Not durable yet: a power cut now replays nothing (non-flush entries are not
  // applied).
  EXPECT_TRUE(Replayed(*f.AfterPowerCut()).empty());
  ASSERT_TRUE(j.Flush().ok());
  // The flush pre-flushed the journal device, which held the non-FUA entries.
  EXPECT_GE(j.GetStats().preflushes[0], 1u);
  std::vector<u64> v = Replayed(*f.AfterPowerCut());
  ASSERT_EQ(v.size(), 20u);
  // Flush() with nothing new issues no I/O.
  u64 writes = f.mem[0]->ops(IoOp::kWrite);
  ASSERT_TRUE(j.Flush().ok());
  EXPECT_EQ(f.mem[0]->ops(IoOp::kWrite), writes);
  ASSERT_TRUE(j.Stop().ok());
}

TEST(JournalTest, IdleJournalWritesNothing) {
  Fixture f;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  ASSERT_TRUE(CommitValue(j, 7, CommitMode::kNoFlush).ok());
  // The entry is written after write_delay and made durable by the timed flush
  // after flush_delay (50 ms); allow a loaded machine much longer.
  for (int i = 0; i < 500 && j.GetStats().durable_seq < 1; i++) platform::SleepNs(10 * platform::kNsPerMs);
  ASSERT_GE(j.GetStats().durable_seq, 1u);
  u64 w = f.mem[0]->ops(IoOp::kWrite), fl = f.mem[0]->ops(IoOp::kFlush);
  EXPECT_GE(w, 1u);
  // Idle now: nothing more is written, however long we wait.
  platform::SleepNs(200 * platform::kNsPerMs);
  EXPECT_EQ(f.mem[0]->ops(IoOp::kWrite), w);
  EXPECT_EQ(f.mem[0]->ops(IoOp::kFlush), fl);
  ASSERT_TRUE(j.Stop().ok());
  EXPECT_EQ(f.mem[0]->ops(IoOp::kWrite), w);  // stopping an idle journal writes nothing
}

TEST(JournalTest, GroupCommitPacksManyCommitsIntoOneEntry) {
  Fixture f;
  Config c = FastConfig();
  c.write_delay_ns = 200 * platform::kNsPerMs;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  for (u64 i = 0; i < 100; i++) ASSERT_TRUE(CommitValue(j, i, CommitMode::kNoFlush).ok());
  ASSERT_TRUE(CommitValue(j, 100, CommitMode::kFlush).ok());
  Stats s = j.GetStats();
  // 101 commits in far fewer entries (exactly 1-2 unless the machine stalls the
  // committing thread for longer than the 200 ms write delay).
  EXPECT_LE(s.entries, 5u);
  EXPECT_GE(s.max_group, 20u);
  ASSERT_TRUE(j.Stop().ok());
}

// A kFlush commit, or Flush(), that finds the writer's role free writes the
// entry in its own thread: no hand-off to the writer thread and back. With a
// long write delay the writer thread would not have written anything yet.
TEST(JournalTest, FlushingCommitterWritesTheEntryItself) {
  Fixture f;
  Config c = FastConfig();
  c.write_delay_ns = 10 * platform::kNsPerSec;
  Journal j;
  Pins pins;  // keep every entry in the ring for replay
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  ASSERT_TRUE(CommitValue(j, 1, CommitMode::kNoFlush, 0, nullptr, &pins).ok());
  ASSERT_TRUE(CommitValue(j, 2, CommitMode::kFlush, 0, nullptr, &pins).ok());
  ASSERT_TRUE(CommitValue(j, 3, CommitMode::kNoFlush, 0, nullptr, &pins).ok());
  ASSERT_TRUE(j.Flush().ok());
  Stats s = j.GetStats();
  EXPECT_EQ(s.caller_entries, 2u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.flush_entries, 2u);
  EXPECT_EQ(j.durable_seq(), s.next_seq - 1);
  ASSERT_TRUE(j.Stop().ok());
  std::vector<u64> v = Replayed(*f.AfterPowerCut());
  EXPECT_EQ(v, (std::vector<u64>{1, 2, 3}));
}

// Unordered flush entries (docs/format/journal.md): data is written to member 1
// (the HDD of the fixture) block by block; each commit carries a data check for
// its block, with deps on member 1.
struct DataWriter {
  explicit DataWriter(Fixture& fixture) : f(fixture) {}
  Fixture& f;
  u64 next = 600 * 4096;  // past the journal ring
  std::vector<uint8_t> check;  // the last check built
  u64 last_offset = 0;
  // Writes one block of `fill` (completed, not flushed) and commits `v` with its
  // data check.
  Result<u64> Commit(Journal& j, u64 v, CommitMode mode, Pins* pins, u8 fill) {
    std::vector<uint8_t> block(4096, fill);
    last_offset = next;
    next += 4096;
    Status st = dev::QueueSyncIo(f.devs.member(1)->queue(), IoOp::kWrite, last_offset, block.data(), 4096, 0,
                                 IoOrigin::kForegroundWrite);
    if (!st.ok()) return st;
    check.assign(DataCheckBytes(1), 0);
    auto* dc = reinterpret_cast<DataCheckFormat*>(check.data());
    dc->member.set(1);
    dc->unit.set(4096);
    dc->offset.set(last_offset);
    dc->length.set(4096);
    Le32 crc;
    crc.set(platform::Crc32c(block.data(), 4096));
    memcpy(check.data() + sizeof(DataCheckFormat), &crc, 4);
    Key k[2] = {{kKeyTest, sizeof(v), &v}, {kKeyDataCheck, u32(check.size()), check.data()}};
    return j.Commit(k, 2, /*deps=*/0b10, mode, pins->New());
  }
};

Config NoTimedFlush() {
  Config c = FastConfig();
  c.flush_delay_ns = 60 * platform::kNsPerSec;  // durability only when asked
  return c;
}

TEST(JournalTest, CheckedCommitsGetAnUnorderedFlushEntry) {
  Fixture f;
  const Config c = NoTimedFlush();
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  DataWriter w(f);
  ASSERT_TRUE(w.Commit(j, 1, CommitMode::kNoFlush, &pins, 0x11).ok());
  f.mem[0]->ResetCounters();
  f.mem[1]->ResetCounters();
  ASSERT_TRUE(w.Commit(j, 2, CommitMode::kFlush, &pins, 0x22).ok());
  Stats s = j.GetStats();
  EXPECT_EQ(s.unordered_entries, 1u);
  EXPECT_EQ(s.flush_entries, 1u);
  // One flush per device after the entry: none before it, and no FUA.
  EXPECT_EQ(f.mem[1]->ops(IoOp::kFlush), 1u);
  EXPECT_EQ(f.mem[0]->ops(IoOp::kFlush), 1u);
  EXPECT_EQ(f.devs.DebtMask(), 0u);
  // Durable, not settled: replay would still read its data.
  EXPECT_EQ(j.durable_seq(), s.next_seq - 1);
  EXPECT_LT(j.settled_seq(), j.durable_seq());
  EXPECT_EQ((std::vector<u64>{1, 2}), Replayed(*f.AfterPowerCut()));
  ReplayResult rr;
  Replayed(*f.AfterPowerCut(), &rr);
  EXPECT_EQ(rr.checked_bytes, 2 * 4096u);  // both entries of the group
  EXPECT_EQ(rr.unverified_seq, 0u);
  // Settle writes one ordered entry more.
  const u64 durable = j.durable_seq();
  ASSERT_TRUE(j.Settle().ok());
  EXPECT_GE(j.settled_seq(), durable);
  EXPECT_EQ(j.GetStats().unordered_entries, 1u);
  EXPECT_EQ(j.GetStats().flush_entries, 2u);
  ASSERT_TRUE(j.Settle().ok());  // nothing new: no entry
  EXPECT_EQ(j.GetStats().flush_entries, 2u);

  // A commit with deps and no data check makes the next flush entry ordered.
  ASSERT_TRUE(CommitValue(j, 3, CommitMode::kNoFlush, 0b10, nullptr, &pins).ok());
  ASSERT_TRUE(w.Commit(j, 4, CommitMode::kFlush, &pins, 0x44).ok());
  EXPECT_EQ(j.GetStats().unordered_entries, 1u);
  EXPECT_EQ(j.settled_seq(), j.durable_seq());
  // And so does a group whose checks exceed max_unordered_check_bytes.
  ASSERT_TRUE(j.Stop().ok());
  Config small = c;
  small.max_unordered_check_bytes = 4096;
  Fixture g;
  Journal k;
  ASSERT_TRUE(k.Start(&g.devs, g.sb, 1, small).ok());
  DataWriter wg(g);
  ASSERT_TRUE(wg.Commit(k, 1, CommitMode::kNoFlush, &pins, 1).ok());
  ASSERT_TRUE(wg.Commit(k, 2, CommitMode::kFlush, &pins, 2).ok());
  EXPECT_EQ(k.GetStats().unordered_entries, 0u);
  ASSERT_TRUE(wg.Commit(k, 3, CommitMode::kFlush, &pins, 3).ok());
  EXPECT_EQ(k.GetStats().unordered_entries, 1u);
  ASSERT_TRUE(k.Stop().ok());
}

// A power cut between the unordered entry's write and its flush may leave the
// entry on disk without its data: replay reads the group's data, and an entry
// whose data does not match is not replayed -- unless a later entry exists,
// which proves that flush done.
TEST(JournalTest, ReplayChecksTheNewestUnorderedEntrysData) {
  Fixture f;
  const Config c = NoTimedFlush();
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  DataWriter w(f);
  ASSERT_TRUE(CommitValue(j, 1, CommitMode::kFlush, 0, nullptr, &pins).ok());  // ordered
  ASSERT_TRUE(w.Commit(j, 2, CommitMode::kNoFlush, &pins, 0x22).ok());
  const u64 first_data = w.last_offset;
  ASSERT_TRUE(w.Commit(j, 3, CommitMode::kFlush, &pins, 0x33).ok());
  const u64 unordered_seq = j.durable_seq();
  ASSERT_EQ(j.GetStats().unordered_entries, 1u);
  auto images = MemDevice::SnapshotDurable({f.mem[0].get(), f.mem[1].get()});
  // Data intact: everything replays.
  {
    Fixture g(f, images[0], images[1]);
    EXPECT_EQ((std::vector<u64>{1, 2, 3}), Replayed(g));
  }
  // Either block of the group lost (the device kept the entry, not the data):
  // the group is not replayed, the ordered entry before it is.
  for (u64 lost : {first_data, w.last_offset}) {
    std::vector<uint8_t> b = images[1];
    memset(b.data() + lost, 0, 4096);
    Fixture g(f, images[0], std::move(b));
    ReplayResult rr;
    EXPECT_EQ((std::vector<u64>{1}), Replayed(g, &rr));
    EXPECT_EQ(rr.unverified_seq, unordered_seq);
  }
  // One entry more on disk (not even a flush entry): the unordered one is
  // proven durable and replayed without reading its data. (Wait for one entry
  // more than were written: 2 and 3 shared an entry or not, as the writer
  // thread's timing had it -- under load 2 often has its own.)
  const u64 entries_before = j.GetStats().entries;
  ASSERT_TRUE(CommitValue(j, 4, CommitMode::kNoFlush, 0, nullptr, &pins).ok());
  while (j.GetStats().entries < entries_before + 1) platform::SleepNs(platform::kNsPerMs);
  std::vector<uint8_t> b = images[1];
  memset(b.data() + w.last_offset, 0, 4096);
  // The non-flush entry reached the journal device's cache only: persist it by
  // hand, as a device may persist any write it acknowledged.
  std::vector<uint8_t> a(kDevSize);
  f.mem[0]->ReadRaw(0, a.data(), kDevSize);
  Fixture g(f, std::move(a), std::move(b));
  ReplayResult rr;
  EXPECT_EQ((std::vector<u64>{1, 2, 3}), Replayed(g, &rr));  // 4: after the last flush entry
  EXPECT_EQ(rr.checked_bytes, 0u);
  EXPECT_EQ(rr.unverified_seq, 0u);
  ASSERT_TRUE(j.Stop().ok());
}

// Data checks are hostile bytes at replay: a check that passed the entry's crc
// but names a range off the device fails replay with a message, never a read
// past the end or a crash.
TEST(JournalTest, ReplayRejectsAnImpossibleDataCheck) {
  Fixture f;
  const Config c = NoTimedFlush();
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  DataWriter w(f);
  ASSERT_TRUE(w.Commit(j, 1, CommitMode::kFlush, &pins, 0x11).ok());
  ASSERT_EQ(j.GetStats().unordered_entries, 1u);
  // Malformed checks never get in.
  std::vector<uint8_t> bad(DataCheckBytes(1), 0);
  auto* dc = reinterpret_cast<DataCheckFormat*>(bad.data());
  dc->member.set(1);
  dc->unit.set(4096);
  dc->length.set(8192);  // two crcs needed, one given
  u64 v = 9;
  Key k[2] = {{kKeyTest, sizeof(v), &v}, {kKeyDataCheck, u32(bad.size()), bad.data()}};
  EXPECT_EQ(j.Commit(k, 2, 0b10, CommitMode::kNoFlush).status().code(), Err::kInvalidArgument);
  dc->length.set(4096);
  EXPECT_EQ(j.Commit(k, 2, 0b01, CommitMode::kNoFlush).status().code(), Err::kInvalidArgument)
      << "a check on a member outside deps";
  auto images = MemDevice::SnapshotDurable({f.mem[0].get(), f.mem[1].get()});
  // Move the check of the entry on disk past the end of the device and fix the
  // entry's crc, as a hostile or buggy writer could have.
  const u64 ring = sb::kBucketsOffset + f.sb.members[0].journal_first_bucket * kBucket;
  bool patched = false;
  for (u64 pos = ring; pos < ring + 8 * kBucket && !patched; pos += 4096) {
    auto* h = reinterpret_cast<EntryHeader*>(images[0].data() + pos);
    if (h->magic.get() == 0 || !(h->flags.get() & kEntryUnordered)) continue;
    u8* p = images[0].data() + pos + sizeof(EntryHeader);
    for (u32 n = 0; n < h->nkeys.get(); n++) {
      auto* kh = reinterpret_cast<KeyHeader*>(p);
      if (kh->type.get() == kKeyDataCheck) {
        reinterpret_cast<DataCheckFormat*>(p + sizeof(KeyHeader))->offset.set(kDevSize);
        patched = true;
      }
      p += KeySpace(kh->len.get());
    }
    h->csum.set(platform::Crc32cSkippingField(images[0].data() + pos, h->bytes.get(),
                                              __builtin_offsetof(EntryHeader, csum)));
  }
  ASSERT_TRUE(patched);
  Fixture g(f, std::move(images[0]), std::move(images[1]));
  ReplayResult rr;
  Diag d;
  Status st = ReadForReplay(g.devs, g.sb, &rr, &d);
  EXPECT_EQ(st.code(), Err::kCorrupt);
  EXPECT_NE(std::string(d.text).find("invalid data check"), std::string::npos) << d.text;
  ASSERT_TRUE(j.Stop().ok());
}

// kFlushNext (the caller flushes next) does not wake the writer thread: on an
// idle journal the entry waits for that Flush, long past write_delay.
TEST(JournalTest, FlushNextCommitsLeaveTheWriterAsleep) {
  Fixture f;
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());  // write_delay 1 ms
  platform::SleepNs(20 * platform::kNsPerMs);  // the writer goes to sleep (an awake one looks anyway)
  ASSERT_TRUE(CommitValue(j, 1, CommitMode::kFlushNext, 0, nullptr, &pins).ok());
  platform::SleepNs(50 * platform::kNsPerMs);
  EXPECT_EQ(j.GetStats().entries, 0u);
  ASSERT_TRUE(j.Flush().ok());
  EXPECT_EQ(j.GetStats().caller_entries, 1u);
  // A kNoFlush commit wakes it: written within write_delay, by the writer thread.
  ASSERT_TRUE(CommitValue(j, 2, CommitMode::kNoFlush, 0, nullptr, &pins).ok());
  for (int i = 0; i < 5000 && j.GetStats().entries < 2; i++) platform::SleepNs(platform::kNsPerMs);
  EXPECT_EQ(j.GetStats().entries, 2u);
  EXPECT_EQ(j.GetStats().caller_entries, 1u);
  ASSERT_TRUE(j.Stop().ok());
  EXPECT_EQ((std::vector<u64>{1, 2}), Replayed(*f.AfterPowerCut()));
}

// Power cuts at random instants, with a cache that persisted a random half of
// what it held (SnapshotTorn: an entry without its data, a later entry without
// an earlier one), while one thread commits checked data blocks: every replay
// succeeds, is a prefix of the commits, holds every acknowledged one -- and
// never applies a commit whose block did not survive.
TEST(JournalTest, TornCachePowerCutsNeverReplayACommitWithoutItsData) {
  Fixture f(100);  // room for every commit in its own entry: pins are never dropped
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  struct Snap {
    u64 acked;
    std::vector<std::vector<uint8_t>> images;
  };
  std::mutex mu;
  std::vector<Snap> snaps;
  std::atomic<u64> acked{0};  // values [0, acked) were flush-acknowledged
  std::atomic<bool> done{false};
  std::thread cutter([&] {
    std::mt19937 rng(11);
    for (u64 n = 0; !done.load() && n < 40; n++) {
      platform::SleepNs((1 + rng() % 5) * platform::kNsPerMs);
      Snap s{acked.load(), MemDevice::SnapshotTorn({f.mem[0].get(), f.mem[1].get()}, rng())};
      std::lock_guard<std::mutex> l(mu);
      snaps.push_back(std::move(s));
    }
  });
  DataWriter w(f);
  std::vector<u64> offsets;
  std::mt19937 rng(5);
  const u64 kN = 1000;
  auto fill = [](u64 v) { return u8(v * 7 + 1); };
  for (u64 i = 0; i < kN; i++) {
    const CommitMode mode = rng() % 5 == 0 ? CommitMode::kFlush : CommitMode::kNoFlush;
    ASSERT_TRUE(w.Commit(j, i, mode, &pins, fill(i)).ok());
    offsets.push_back(w.last_offset);
    if (mode == CommitMode::kFlush) {
      acked.store(i + 1);
      if (i % 50 < 5) {  // now and then a cut right after an acknowledged fsync
        Snap s{i + 1, MemDevice::SnapshotTorn({f.mem[0].get(), f.mem[1].get()}, i)};
        std::lock_guard<std::mutex> l(mu);
        snaps.push_back(std::move(s));
      }
    }
  }
  done = true;
  cutter.join();
  EXPECT_GT(j.GetStats().unordered_entries, kN / 10);
  ASSERT_TRUE(j.Stop().ok());
  u64 checked = 0, dropped = 0, gaps = 0;
  for (Snap& s : snaps) {
    Fixture g(f, s.images[0], s.images[1]);
    ReplayResult rr;
    std::vector<u64> v = Replayed(g, &rr);
    ASSERT_GE(v.size(), s.acked) << "an acknowledged commit was lost";
    for (u64 i = 0; i < v.size(); i++) {
      ASSERT_EQ(v[i], i) << "replay is not a prefix";
      ASSERT_EQ(s.images[1][offsets[i]], fill(i)) << "commit " << i << " replayed without its data";
    }
    checked += rr.checked_bytes > 0;
    dropped += rr.unverified_seq != 0;
    // A torn cache leaves later entries without earlier ones: a torn tail,
    // never damage (docs/format/journal.md, "Damage in the middle").
    gaps += rr.gap_at != 0;
    ASSERT_EQ(rr.durable_end, 0u) << "a power cut called damage: gap at " << rr.gap_at;
  }
  EXPECT_GE(checked, 1u);
  printf("%zu cuts: %llu checked the newest entry's data, %llu dropped it, %llu with a gap\n", snaps.size(),
         (unsigned long long)checked, (unsigned long long)dropped, (unsigned long long)gaps);
}

TEST(JournalTest, ConcurrentFlushCommitsAllReplayed) {
  Fixture f(100);  // room for every commit in its own entry: pins are never dropped
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  std::vector<std::thread> threads;
  for (u64 t = 0; t < 2; t++) {
    threads.emplace_back([&, t] {
      for (u64 i = 0; i < 300; i++) {
        Result<u64> r = CommitValue(j, t * 1000 + i, CommitMode::kFlush, 0, nullptr, &pins);
        EXPECT_TRUE(r.ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  Stats s = j.GetStats();
  EXPECT_LE(s.entries, s.commits);
  ASSERT_TRUE(j.Stop().ok());
  std::vector<u64> v = Replayed(*f.AfterPowerCut());
  ASSERT_EQ(v.size(), 600u);
  // Each thread's values appear in its own commit order.
  u64 last[2] = {0, 0};
  bool first[2] = {true, true};
  for (u64 x : v) {
    u64 t = x / 1000;
    if (!first[t]) {
      EXPECT_GT(x, last[t]);
    }
    first[t] = false;
    last[t] = x;
  }
}

TEST(JournalTest, PowerCutsReplayExactlyACommittedPrefix) {
  Fixture f(100);  // room for every commit in its own entry: pins are never dropped
  Journal j;
  Pins pins;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  std::atomic<u64> acked_flush{0};  // values [0, acked_flush) were flush-acknowledged
  std::atomic<bool> done{false};
  struct Snap {
    u64 acked;
    std::vector<uint8_t> a;  // the journal device; the other one holds no journal
  };
  std::vector<Snap> snaps;
  std::thread cutter([&] {
    std::mt19937 rng(42);
    while ((!done.load() || snaps.size() < 3) && snaps.size() < 25) {
      platform::SleepNs((1 + rng() % 8) * platform::kNsPerMs);
      Snap s;
      s.acked = acked_flush.load();
      s.a = f.mem[0]->SnapshotDurable();
      snaps.push_back(std::move(s));
    }
  });
  std::mt19937 rng(7);
  const u64 kN = 1500;
  for (u64 i = 0; i < kN; i++) {
    CommitMode mode = rng() % 20 == 0 ? CommitMode::kFlush : CommitMode::kNoFlush;
    ASSERT_TRUE(CommitValue(j, i, mode, 0, nullptr, &pins).ok());
    if (mode == CommitMode::kFlush) acked_flush.store(i + 1);
    if (i % 100 == 0) platform::SleepNs(platform::kNsPerMs);
  }
  done = true;
  cutter.join();
  ASSERT_TRUE(j.Stop().ok());
  ASSERT_GE(snaps.size(), 3u);
  u64 nonempty = 0;
  for (Snap& s : snaps) {
    Fixture g(f, std::move(s.a), std::vector<uint8_t>(kDevSize));
    std::vector<u64> v = Replayed(g);
    ASSERT_GE(v.size(), s.acked) << "a flush-acknowledged commit was lost";
    for (u64 i = 0; i < v.size(); i++) ASSERT_EQ(v[i], i) << "replay is not a prefix";
    if (!v.empty()) nonempty++;
  }
  EXPECT_GE(nonempty, 1u);
}

TEST(JournalTest, TornOrCorruptEntryEndsReplayCleanly) {
  Fixture f;
  Pins pins;
  {
    Journal j;
    ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
    for (u64 i = 0; i < 30; i++) {
      ASSERT_TRUE(CommitValue(j, i, CommitMode::kFlush, 0, nullptr, &pins).ok());
    }
    ASSERT_TRUE(j.Stop().ok());
  }
  // Entries are 4 KiB each, consecutive from the ring's first bucket: corrupt the
  // 11th (seq 11) by flipping a byte of its payload on the durable image.
  auto img = f.mem[0]->SnapshotDurable();
  u64 ring = sb::kBucketsOffset + f.sb.members[0].journal_first_bucket * kBucket;
  img[ring + 10 * 4096 + 70] ^= 0xff;
  Fixture g(f, std::move(img), f.mem[1]->SnapshotDurable());
  ReplayResult rr;
  std::vector<u64> v = Replayed(g, &rr);
  ASSERT_EQ(v.size(), 10u);
  for (u64 i = 0; i < 10; i++) EXPECT_EQ(v[i], i);
  EXPECT_EQ(rr.gap_at, 11u);
  EXPECT_EQ(rr.bad_headers, 1u);
  EXPECT_EQ(rr.discarded_entries, 19u);  // seqs 12..30
  EXPECT_EQ(rr.next_seq, 31u);
  // Entries 12..30 are flush entries written after 11 ended and pre-flushed
  // it: it was durable, this is damage and not a torn write.
  EXPECT_EQ(rr.durable_end, 30u);
  EXPECT_EQ(rr.lost_entries, 1u);
  // Past the gap (fsck -y): every surviving entry.
  ReplayResult past;
  Diag d;
  ASSERT_TRUE(ReadForReplay(g.devs, g.sb, &past, &d, /*past_gaps=*/true).ok()) << d.text;
  std::vector<u64> values;
  for (const ReplayedEntry& e : past.entries) {
    ASSERT_TRUE(ForEachKey(e, [](void* ctx, u64, const Key& k) -> Status {
      u64 v;
      memcpy(&v, k.val, 8);
      static_cast<std::vector<u64>*>(ctx)->push_back(v);
      return Status::Ok();
    }, &values).ok());
  }
  ASSERT_EQ(values.size(), 29u);
  for (u64 i = 0; i < 29; i++) EXPECT_EQ(values[i], i < 10 ? i : i + 1);
  EXPECT_EQ(past.discarded_entries, 0u);
  EXPECT_EQ(past.durable_end, 30u);
}

// A power cut with a cache that kept some blocks leaves later entries without
// an earlier one; that is a torn tail, never damage: nothing after the gap was
// acknowledged. Entries without a flush pile up in the cache between flushes,
// so cuts there leave gaps (the test above, with its data checks, rarely does).
TEST(JournalTest, ATornTailIsNeverCalledDamage) {
  Fixture f(100);  // room for every commit in its own entry: pins are never dropped
  Pins pins;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  std::mt19937_64 rng(7);
  u64 gaps = 0, cuts = 0;
  for (u64 i = 0; i < 120; i++) {
    const CommitMode mode = i % 10 == 9 ? CommitMode::kFlush : CommitMode::kNoFlush;
    ASSERT_TRUE(CommitValue(j, i, mode, 0, nullptr, &pins).ok());
    if (i % 2 != 0) continue;
    auto imgs = MemDevice::SnapshotTorn({f.mem[0].get(), f.mem[1].get()}, rng());
    Fixture g(f, std::move(imgs[0]), std::move(imgs[1]));
    ReplayResult rr;
    std::vector<u64> v = Replayed(g, &rr);
    for (u64 k = 0; k < v.size(); k++) ASSERT_EQ(v[k], k) << "replay is not a prefix";
    cuts++;
    gaps += rr.gap_at != 0;
    ASSERT_EQ(rr.durable_end, 0u) << "a power cut called damage: gap at " << rr.gap_at;
  }
  ASSERT_TRUE(j.Stop().ok());
  printf("%llu cuts, %llu with a gap\n", (unsigned long long)cuts, (unsigned long long)gaps);
}

TEST(JournalTest, TornLastEntryIsIgnored) {
  Fixture f;
  Pins pins;
  {
    Journal j;
    ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
    for (u64 i = 0; i < 5; i++) {
      ASSERT_TRUE(CommitValue(j, i, CommitMode::kFlush, 0, nullptr, &pins).ok());
    }
    // A last entry of several blocks (one big key) ...
    std::vector<u8> big(10000, 0x42);
    Key k{kKeyTest, u32(big.size()), big.data()};
    ASSERT_TRUE(j.Commit(&k, 1, 0, CommitMode::kFlush, pins.New()).ok());
    ASSERT_TRUE(j.Stop().ok());
  }
  // ... of which only the first block reached the platter before the power cut.
  auto img = f.mem[0]->SnapshotDurable();
  u64 ring = sb::kBucketsOffset + f.sb.members[0].journal_first_bucket * kBucket;
  memset(&img[ring + 5 * 4096 + 4096], 0, 2 * 4096);
  Fixture g(f, std::move(img), f.mem[1]->SnapshotDurable());
  ReplayResult rr;
  std::vector<u64> v = Replayed(g, &rr);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v.back(), 4u);
  EXPECT_EQ(rr.bad_headers, 1u);
  EXPECT_EQ(rr.gap_at, 0u);  // nothing after the torn entry
  EXPECT_EQ(rr.next_seq, 6u);
}

TEST(JournalTest, ReplicatedEntriesSurviveTheLossOfOneRing) {
  Fixture f;
  // Both members carry a ring; every entry goes to both.
  f.GiveHddARing(8);
  f.sb.options.metadata_replicas = 2;
  Pins pins;
  {
    Journal j;
    ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
    for (u64 i = 0; i < 40; i++) {
      ASSERT_TRUE(CommitValue(j, i, i % 8 == 7 ? CommitMode::kFlush : CommitMode::kNoFlush, 0,
                              nullptr, &pins).ok());
    }
    ASSERT_TRUE(j.Stop().ok());
    EXPECT_EQ(j.GetStats().bytes, 2 * j.GetStats().entries * 4096);
  }
  EXPECT_EQ(f.mem[0]->bytes(IoOp::kWrite), f.mem[1]->bytes(IoOp::kWrite));
  ReplayResult rr;
  std::vector<u64> v = Replayed(*f.AfterPowerCut(), &rr);
  ASSERT_EQ(v.size(), 40u);  // replicas are counted once
  // Wipe the first member's ring: the second still has everything.
  auto img = f.mem[0]->SnapshotDurable();
  u64 ring = sb::kBucketsOffset + f.sb.members[0].journal_first_bucket * kBucket;
  memset(&img[ring], 0, 8 * kBucket);
  Fixture g(f, std::move(img), f.mem[1]->SnapshotDurable());
  v = Replayed(g, &rr);
  ASSERT_EQ(v.size(), 40u);
  for (u64 i = 0; i < 40; i++) EXPECT_EQ(v[i], i);
}

// Opens a closed gate when the test ends, however it ends: the journal's
// Stop (and the device set) wait for the requests it holds.
struct OpenAtExit {
  testing::GateDevice* g;
  ~OpenAtExit() { g->Open(); }
};

// 6c-2: a durable entry whose data on hdd.b all has copies elsewhere
// (lossable) does not wait out hdd.b's stuck flush: once hdd.b is
// stalling (its flush quiet past the queue's stall threshold) the flush is
// given up late and left out; the next such entry gives it up at once
// (no second flush issued), and an entry whose data has its only copy
// there waits for the one out, then flushes again. Everything replays.
TEST(JournalTest, AStallingMembersFlushIsGivenUpLateWhenItsDataHasCopiesElsewhere) {
  Fixture f(IoOp::kFlush, IoOrigin::kJournal);
  f.sb.options.checksum = sb::ChecksumType::kCrc32c;  // (reads verify every copy)
  Pins pins;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  ASSERT_TRUE(f.WriteData(1).ok());  // (hdd.b owes a flush)
  f.gate->Close();
  OpenAtExit open_at_exit{f.gate.get()};  // (whatever fails, Stop waits for what it holds)
  auto commit = [&](u64 v, dev::DevMask lossable) {
    Key k{kKeyTest, sizeof(v), &v};
    return j.Commit(&k, 1, /*deps=*/0b10, CommitMode::kFlush, pins.New(), Watermark::kNormal, lossable);
  };
  ASSERT_TRUE(commit(1, 0b10).ok());
  Stats s = j.GetStats();
  EXPECT_EQ(s.flushes_late, 1u);
  EXPECT_EQ(s.flushes_out, 1u);
  EXPECT_EQ(s.flushes_given_up, 0u);
  EXPECT_EQ(f.gate->parked(), 1u);
  ASSERT_TRUE(commit(2, 0b10).ok());
  s = j.GetStats();
  EXPECT_EQ(s.flushes_late, 2u) << "given up again at once";
  EXPECT_EQ(f.gate->parked(), 1u) << "no second flush while the first is out";
  // hdd.b holds this one's only copy: it waits for the flush out, then
  // for its own.
  std::atomic<bool> done{false};
  Result<u64> third = Err::kIo;
  std::thread t([&] {
    third = commit(3, 0);
    done = true;
  });
  // (Its entry is being written once its pre-flush is counted: hdd.b is
  // among its members to flush, and its flush is still held.)
  for (int i = 0; i < 60000 && j.GetStats().preflushes[1] < 3; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(j.GetStats().preflushes[1], 3u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(done) << "an entry whose data's only copy is on hdd.b went on without its flush";
  f.gate->Open();
  t.join();
  ASSERT_TRUE(third.ok());
  s = j.GetStats();
  EXPECT_EQ(s.flushes_late, 2u);
  EXPECT_EQ(s.flushes_out, 0u);
  EXPECT_EQ(f.mem[1]->ops(IoOp::kFlush), 2u) << "the late flush, then the third entry's";
  EXPECT_EQ(f.devs.failed(), 0u);
  ASSERT_TRUE(j.Stop().ok());
  EXPECT_EQ(Replayed(f), (std::vector<u64>{1, 2, 3}));
}

// Without checksums a lost copy could be served: no flush is given up late
// (the entry waits for it, as before 6c-2).
TEST(JournalTest, NoFlushIsGivenUpLateWithoutChecksums) {
  Fixture f(IoOp::kFlush, IoOrigin::kJournal);
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  ASSERT_TRUE(f.WriteData(1).ok());  // (hdd.b owes a flush)
  f.gate->Close();
  OpenAtExit open_at_exit{f.gate.get()};  // (whatever fails, Stop waits for what it holds)
  std::atomic<bool> done{false};
  Result<u64> r = Err::kIo;
  std::thread t([&] {
    u64 v = 1;
    Key k{kKeyTest, sizeof(v), &v};
    r = j.Commit(&k, 1, 0b10, CommitMode::kFlush, nullptr, Watermark::kNormal, /*lossable=*/0b10);
    done = true;
  });
  // Past the stall threshold (1 s) and the late bound: still waiting.
  const dev::IoQueue& q = f.devs.member(1)->queue();
  for (int i = 0; i < 60000 && !q.Stalled(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(q.Stalled());
  // Past the longest late bound as well (a give-up would have come by then).
  std::this_thread::sleep_for(std::chrono::nanoseconds(dev::kLateMaxNs + 500 * platform::kNsPerMs));
  EXPECT_FALSE(done);
  EXPECT_EQ(j.GetStats().flushes_late, 0u);
  f.gate->Open();
  t.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(j.GetStats().flushes_late, 0u);
  ASSERT_TRUE(j.Stop().ok());
}

// 6c-2: with more rings than an entry takes, a stalling member's ring is
// passed over (its write would wait out the stall); once the member is
// well, entries go to its ring again (the one with the most room).
TEST(JournalTest, EntriesPassAStallingMembersRingOver) {
  Fixture f(IoOp::kWrite, IoOrigin::kForegroundWrite);
  f.GiveHddARing(16);  // (the roomier ring: chosen first when well)
  Pins pins;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  f.gate->Close();
  OpenAtExit open_at_exit{f.gate.get()};  // (whatever fails, Stop waits for what it holds)
  // A data write stuck at hdd.b: past its late bound it is stalling.
  std::vector<u8> data(4096, 0x33);
  dev::IoBatch batch(1);
  dev::Io io;
  io.req.op = IoOp::kWrite;
  io.req.origin = IoOrigin::kForegroundWrite;
  io.req.offset = 4 << 20;
  io.req.length = 4096;
  io.req.buf = data.data();
  io.cls = dev::DefaultClass(IoOrigin::kForegroundWrite);
  io.done = dev::IoBatch::Done;
  io.caller_data = &batch;
  dev::IoQueue& q = f.devs.member(1)->queue();
  q.Submit(&io);
  for (int i = 0; i < 60000 && !dev::Stalling(q.GetReadState(false)); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(dev::Stalling(q.GetReadState(false)));
  for (u64 v = 1; v <= 5; v++) ASSERT_TRUE(CommitValue(j, v, CommitMode::kFlush, 0, nullptr, &pins).ok());
  EXPECT_EQ(f.mem[1]->ops(IoOp::kWrite), 0u) << "an entry went to the stalling member's ring";
  EXPECT_GE(j.GetStats().rings_passed_stalling, 5u);
  f.gate->Open();
  ASSERT_TRUE(batch.Wait().ok());
  const u64 before = f.mem[1]->ops(IoOp::kWrite);
  for (u64 v = 6; v <= 10; v++) ASSERT_TRUE(CommitValue(j, v, CommitMode::kFlush, 0, nullptr, &pins).ok());
  EXPECT_GT(f.mem[1]->ops(IoOp::kWrite), before) << "the member's ring is used again";
  ASSERT_TRUE(j.Stop().ok());
  std::vector<u64> want;
  for (u64 v = 1; v <= 10; v++) want.push_back(v);
  EXPECT_EQ(Replayed(f), want);
}

// 6c-2: with entries on two rings, a ring write stuck at a stalling member
// is given up once the other ring took the entry: the commit returns, the
// ring is held (nothing more goes there while the write is out: its write
// slot is in use) and the entries go on, one
// ring each (degraded); a power cut meanwhile replays everything from the
// other ring. Once the write completes the ring takes entries again.
TEST(JournalTest, AStuckRingWriteIsGivenUpLateAndItsRingHeld) {
  Fixture f(IoOp::kWrite, IoOrigin::kJournal);
  f.GiveHddARing(8);
  f.sb.options.metadata_replicas = 2;
  Pins pins;
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  f.gate->Close();
  OpenAtExit open_at_exit{f.gate.get()};  // (whatever fails, Stop waits for what it holds)
  ASSERT_TRUE(CommitValue(j, 1, CommitMode::kFlush, 0, nullptr, &pins).ok());
  Stats s = j.GetStats();
  EXPECT_EQ(s.ring_writes_late, 1u);
  EXPECT_EQ(s.rings_held, 1u);
  EXPECT_EQ(f.gate->parked(), 1u);
  EXPECT_EQ(f.devs.failed(), 0u) << "a slow member is not a failed one";
  for (u64 v = 2; v <= 5; v++) ASSERT_TRUE(CommitValue(j, v, CommitMode::kFlush, 0, nullptr, &pins).ok());
  s = j.GetStats();
  EXPECT_EQ(f.gate->parked(), 1u) << "an entry went to the held ring";
  EXPECT_EQ(s.ring_writes_late, 1u);
  EXPECT_GE(s.degraded_entries, 5u);
  EXPECT_EQ(Replayed(*f.AfterPowerCut()), (std::vector<u64>{1, 2, 3, 4, 5}));
  f.gate->Open();
  for (int i = 0; i < 60000 && j.GetStats().rings_held != 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(j.GetStats().rings_held, 0u);
  const u64 before = f.mem[1]->ops(IoOp::kWrite);
  ASSERT_TRUE(CommitValue(j, 6, CommitMode::kFlush, 0, nullptr, &pins).ok());
  EXPECT_EQ(f.mem[1]->ops(IoOp::kWrite), before + 1) << "the ring takes entries again";
  EXPECT_EQ(f.devs.failed(), 0u);
  ASSERT_TRUE(j.Stop().ok());
  EXPECT_EQ(Replayed(f), (std::vector<u64>{1, 2, 3, 4, 5, 6}));
}

TEST(JournalTest, EntriesOfAnotherFilesystemAreIgnored) {
  Fixture f;
  Pins pins;
  {
    Journal j;
    ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
    ASSERT_TRUE(CommitValue(j, 5, CommitMode::kFlush, 0, nullptr, &pins).ok());
    ASSERT_TRUE(j.Stop().ok());
  }
  Fixture g(f, f.mem[0]->SnapshotDurable(), f.mem[1]->SnapshotDurable());
  sb::NewUuid(g.sb.fs_uuid);  // "reformatted": same bytes, new filesystem
  ReplayResult rr;
  EXPECT_TRUE(Replayed(g, &rr).empty());
  EXPECT_EQ(rr.valid_entries, 0u);
}

TEST(JournalTest, PinsHoldRingSpaceUntilReclaimDropsThem) {
  Fixture f(4);  // 4 buckets x 64 KiB: fills after ~60 entries
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  struct Owner {
    Journal* j = nullptr;
    std::mutex mu;
    std::vector<std::unique_ptr<Pin>> pins;
    std::atomic<int> calls{0};
  } owner;
  owner.j = &j;
  j.SetReclaimHook([](void* ctx, u64) {
    auto* o = static_cast<Owner*>(ctx);
    o->calls++;
    std::lock_guard<std::mutex> lock(o->mu);
    for (auto& p : o->pins) o->j->PinDrop(p.get());  // "state persisted"
    o->pins.clear();
  }, &owner);
  for (u64 i = 0; i < 400; i++) {
    auto pin = std::make_unique<Pin>();
    ASSERT_TRUE(CommitValue(j, i, CommitMode::kFlush, 0, pin.get()).ok());
    std::lock_guard<std::mutex> lock(owner.mu);
    owner.pins.push_back(std::move(pin));
  }
  EXPECT_GE(owner.calls.load(), 1);
  EXPECT_GE(j.GetStats().reclaim_calls, 1u);
  {
    std::lock_guard<std::mutex> lock(owner.mu);
    for (auto& p : owner.pins) j.PinDrop(p.get());
  }
  ASSERT_TRUE(j.Stop().ok());
  // Replay returns the tail the ring still holds, ending at the last commit.
  std::vector<u64> v = Replayed(*f.AfterPowerCut());
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.back(), 399u);
  for (u64 i = 1; i < v.size(); i++) EXPECT_EQ(v[i], v[i - 1] + 1);
}

// The btree's checkpoint protocol: one owner pin on the oldest entry not yet
// persisted; reclaim (a separate thread, woken by the hook) first flushes the
// journal -- write-ahead: its images hold every applied commit -- then commits
// its own change (an allocation), and only then moves the pin. Were a commit's
// entry ever stuck waiting for ring room, that flush would wait on it forever:
// commits must wait for room before they join an entry instead.
TEST(JournalTest, ReclaimThatFlushesFirstNeverWaitsOnCommittedEntries) {
  Fixture f(4);  // 4 buckets x 64 KiB
  Config c = FastConfig();
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  struct Owner {
    Journal* j = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    bool wake = false, stop = false;
    Pin pin;
    u64 applied = 0;  // newest entry holding a commit
    int checkpoints = 0;
    Status error;
  } o;
  o.j = &j;
  j.SetReclaimHook([](void* ctx, u64) {
    auto* ow = static_cast<Owner*>(ctx);
    std::lock_guard<std::mutex> lock(ow->mu);
    ow->wake = true;
    ow->cv.notify_one();
  }, &o);
  std::thread reclaimer([&] {
    std::unique_lock<std::mutex> lock(o.mu);
    for (;;) {
      o.cv.wait(lock, [&] { return o.wake || o.stop; });
      if (o.stop) return;
      o.wake = false;
      const u64 covered = o.applied;
      lock.unlock();
      Status st = j.Flush();  // write-ahead
      u64 alloc = 7;
      Key k{kKeyTest, sizeof(alloc), &alloc};
      if (st.ok()) st = j.Commit(&k, 1, 0, CommitMode::kNoFlush, nullptr, Watermark::kReclaim).status();
      lock.lock();
      if (st.ok() && o.pin.active && o.pin.seq <= covered) {
        Pin next;
        if (o.applied > covered) st = j.PinAt(&next, covered + 1);
        if (st.ok()) {
          j.PinDrop(&o.pin);
          o.pin = next;
        }
      }
      o.checkpoints++;
      lock.unlock();
      if (st.ok()) st = j.AdvanceLastSeq();
      lock.lock();
      if (!st.ok()) o.error = st;
    }
  });
  std::vector<u8> value(6000, 0x5a);  // ~10 commits per entry
  const u64 n = 3000;                 // ~18 MB: the ring is reclaimed ~70 times
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done.load(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done.load()) {
      Stats s = j.GetStats();
      fprintf(stderr, "hung: next_seq %llu durable %llu last_seq %llu free %llu room_waits %llu\n",
              (unsigned long long)s.next_seq, (unsigned long long)s.durable_seq,
              (unsigned long long)s.last_seq, (unsigned long long)s.free_buckets, (unsigned long long)s.room_waits);
      abort();
    }
  });
  for (u64 i = 0; i < n; i++) {
    Key k{kKeyTest, u32(value.size()), value.data()};
    bool need_pin;
    {
      std::lock_guard<std::mutex> lock(o.mu);
      need_pin = !o.pin.active;
    }
    Pin local;
    Result<u64> r = j.Commit(&k, 1, 0, CommitMode::kNoFlush, need_pin ? &local : nullptr);
    ASSERT_TRUE(r.ok()) << r.status().Message();
    std::lock_guard<std::mutex> lock(o.mu);
    if (need_pin) o.pin = local;
    o.applied = *r;
  }
  ASSERT_TRUE(j.Flush().ok());
  done = true;
  watchdog.join();
  {
    std::lock_guard<std::mutex> lock(o.mu);
    o.stop = true;
    o.cv.notify_one();
  }
  reclaimer.join();
  EXPECT_TRUE(o.error.ok()) << o.error.Message();
  Stats s = j.GetStats();
  EXPECT_GE(o.checkpoints, 10);
  EXPECT_GE(s.room_waits, 1u);
  EXPECT_EQ(s.space_waits, 0u);  // no entry holding commits ever waited for room
  j.PinDrop(&o.pin);
  ASSERT_TRUE(j.Stop().ok());
}

TEST(JournalTest, PinsCanBeDroppedAndRetakenOnTheOpenEntry) {
  Fixture f;
  Config c = FastConfig();
  c.write_delay_ns = 60 * platform::kNsPerSec;  // keep the entry open
  Journal j;
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, c).ok());
  // Pin, drop, pin again, all on the same open entry (the allocator does this when
  // it already holds an older pin and a checkpoint just released it).
  for (int round = 0; round < 5; round++) {
    Pin a, b;
    Result<u64> s1 = CommitValue(j, 1, CommitMode::kNoFlush, 0, &a);
    ASSERT_TRUE(s1.ok());
    j.PinDrop(&a);
    Result<u64> s2 = CommitValue(j, 2, CommitMode::kNoFlush, 0, &b);
    ASSERT_TRUE(s2.ok());
    EXPECT_EQ(*s1, *s2);
    j.PinDrop(&b);
    ASSERT_TRUE(j.Flush().ok());  // seal it; the next round uses a new entry
  }
  ASSERT_TRUE(j.Stop().ok());
}

TEST(JournalTest, BadRequests) {
  Fixture f;
  Journal j;
  EXPECT_FALSE(CommitValue(j, 1, CommitMode::kNoFlush).ok());  // not started
  ASSERT_TRUE(j.Start(&f.devs, f.sb, 1, FastConfig()).ok());
  std::vector<u8> huge(300 * 1024);
  Key big{kKeyTest, u32(huge.size()), huge.data()};
  EXPECT_EQ(j.Commit(&big, 1, 0, CommitMode::kNoFlush).status(), Status(Err::kTooBig));
  Key zero{kKeyInvalid, 0, nullptr};
  EXPECT_EQ(j.Commit(&zero, 1, 0, CommitMode::kNoFlush).status(), Status(Err::kInvalidArgument));
  ASSERT_TRUE(j.Stop().ok());
  EXPECT_EQ(CommitValue(j, 1, CommitMode::kNoFlush).status(), Status(Err::kInvalidArgument));
}

}  // namespace
}  // namespace tfs::journal
