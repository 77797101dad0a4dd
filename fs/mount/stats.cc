// The mount's counters as JSON (see stats.h).
#include "mount/stats.h"

#include "alloc/allocator.h"
#include "bg/engine.h"
#include "btree/tree.h"
#include "data/data.h"
#include "dev/device_set.h"
#include "dev/io_queue.h"
#include "journal/journal.h"
#include "platform/platform.h"
#include "platform/work.h"
#include "posix/fs.h"
#include "store/store.h"
#include "util/counters.h"

namespace tfs::mount {
namespace {

// One member's queue: its state and its I/O by origin (origins that did
// nothing are left out).
void WriteQueue(dev::Member* m, dev::OriginStats* stats, JsonOut& w) {
  const dev::QueueState q = m->queue().State();
  TFS_COUNTER_JSON(TFS_QUEUE_COUNTERS, w, q);
  w.Key("io");
  w.BeginObject();
  for (int o = 0; o < kIoOriginCount; o++) {
    m->queue().ReadStats(IoOrigin(o), stats);
    u64 any = stats->errors;
    for (int op = 0; op < kIoOpCount; op++) any += stats->ops[op];
    if (any == 0) continue;
    w.Key(IoOriginName(IoOrigin(o)));
    w.BeginObject();
    for (int op = 0; op < kIoOpCount; op++) {
      if (stats->ops[op] == 0) continue;
      w.Key(IoOpName(IoOp(op)));
      w.BeginObject();
      w.UintField("ops", stats->ops[op]);
      w.UintField("bytes", stats->bytes[op]);
      w.EndObject();
    }
    w.UintField("errors", stats->errors);
    w.UintField("service_p50_ns", stats->service_time.Quantile(50, 100));
    w.UintField("service_p99_ns", stats->service_time.Quantile(99, 100));
    w.UintField("queue_p99_ns", stats->queue_time.Quantile(99, 100));
    w.EndObject();
  }
  w.EndObject();
}

// Per member: bucket states and reserves (docs/design/space.md); then per
// tier (the members of one group) the buckets and the free ones (less those
// the generation guard holds back), summed from the same reading of each
// member.
void WriteAlloc(store::Store& store, JsonOut& w) {
  dev::DeviceSet& devs = store.devs();
  u32 tier_of[dev::kMaxDevices];  // the first member of each member's group
  u64 tier_buckets[dev::kMaxDevices] = {};
  u64 tier_free[dev::kMaxDevices] = {};
  w.Key("devices");
  w.BeginArray();
  for (u32 i = 0; i < devs.size(); i++) {
    const alloc::DeviceUsage u = store.alloc().Usage(i);
    w.BeginObject();
    w.StringField("label", devs.member(i)->label());
    w.UintField("buckets", u.nbuckets);
    for (int s = 0; s < alloc::kBucketStateCount; s++)
      w.UintField(alloc::BucketStateName(alloc::BucketState(s)), u.by_state[s]);
    w.UintField("pending_free", u.pending_free);
    w.UintField("gen_blocked", u.gen_blocked);  // (among the free: held back by the generation guard)
    w.UintField("live_sectors", u.live_sectors);
    w.UintField("cached_sectors", u.cached_sectors);
    // The btree reserve in force (its declared need plus growth room), the
    // need itself, and the free buckets user data leaves (copygc + btree
    // reserves).
    w.UintField("reserve_btree", u.reserves.btree);
    w.UintField("metadata_need", u.metadata_need);
    w.UintField("data_floor", u.reserves.copygc + u.reserves.btree);
    w.EndObject();
    tier_of[i] = i;
    for (u32 k = 0; k < i; k++) {
      if (StrEqual(devs.member(k)->group(), devs.member(i)->group())) {
        tier_of[i] = tier_of[k];
        break;
      }
    }
    tier_buckets[tier_of[i]] += u.nbuckets;
    tier_free[tier_of[i]] += u.by_state[int(alloc::BucketState::kFree)] - u.gen_blocked;
  }
  w.EndArray();
  w.Key("tiers");
  w.BeginObject();
  for (u32 i = 0; i < devs.size(); i++) {
    if (tier_of[i] != i) continue;  // written with the first of its group
    w.Key(devs.member(i)->group());
    w.BeginObject();
    w.UintField("buckets", tier_buckets[i]);
    w.UintField("free", tier_free[i]);
    w.EndObject();
  }
  w.EndObject();
  TFS_COUNTER_JSON(TFS_ALLOC_COUNTERS, w, store.alloc().Stats());
}

// The accounting totals (alloc/accounting.h): the reserved (unwritten)
// sectors, the inodes in use and, per set of members data has copies on, its sectors -- the
// members named by label; the first kCtlSets sets with data, then how many
// more there are (the document has a fixed buffer) -- what they say of the
// copies (SummarizeCopies: by number of copies, degraded and unavailable
// with the missing and failed members out), then the counters.
void WriteAccounting(store::Store& store, JsonOut& w) {
  const alloc::Accounting& acct = store.acct();
  w.UintField("reserved_sectors", acct.reserved_sectors());
  w.UintField("inodes", acct.inodes());
  Vector<alloc::ReplicasEntry> sets;
  // (A set added meanwhile is left for the next reading.)
  const u32 n = acct.ReplicasInto(&sets).ok() ? u32(sets.size()) : 0;
  constexpr u32 kCtlSets = 16;
  u32 listed_sets = 0, more = 0;
  w.Key("replicas");
  w.BeginArray();
  for (u32 i = 0; i < n; i++) {
    if (sets[i].sectors == 0) continue;
    if (listed_sets == kCtlSets) {
      more++;
      continue;
    }
    listed_sets++;
    w.BeginObject();
    w.Key("members");
    w.BeginArray();
    for (u32 m : dev::Bits(sets[i].members))
      if (m < store.devs().size()) w.String(store.devs().member(m)->label());
    w.EndArray();
    w.UintField("sectors", sets[i].sectors);
    w.EndObject();
  }
  w.EndArray();
  w.UintField("replicas_unlisted", more);
  const alloc::CopiesSummary c =
      alloc::SummarizeCopies(sets.data(), n, store.devs().missing() | store.devs().failed());
  w.UintField("data_sectors", c.sectors);
  w.Key("copies_sectors");  // [i]: sectors of data with i + 1 copies
  w.BeginArray();
  for (u32 k = 1; k <= alloc::kAcctMaxMembers; k++) w.Uint(c.by_copies[k]);
  w.EndArray();
  w.UintField("degraded_sectors", c.degraded);
  w.UintField("unavailable_sectors", c.unavailable);
  TFS_COUNTER_JSON(TFS_ACCT_COUNTERS, w, acct.Stats());
}

}  // namespace

Status WriteStats(Instance& inst, JsonOut& w, const MemberExtras* extras) {
  if (!inst.open()) return Err::kInvalidArgument;
  store::Store& store = inst.store();
  posix::Filesystem& fs = inst.fs();
  dev::OriginStats* origin = platform::New<dev::OriginStats>();
  if (origin == nullptr) return Err::kNoMemory;

  w.BeginObject();
  w.UintField("bucket_size", store.sb().bucket_size);
  w.Key("devices");
  w.BeginArray();
  for (u32 i = 0; i < store.devs().size(); i++) {
    dev::Member* m = store.devs().member(i);
    w.BeginObject();
    w.UintField("index", i);
    w.StringField("label", m->label());
    w.StringField("group", m->group());
    // "missing": a degraded mount opened without it; "failed": a write of
    // its metadata failed while mounted, and "error" says how (docs/usage.md).
    const bool missing = ((store.devs().missing() >> i) & 1) != 0;
    const bool failed = ((store.devs().failed() >> i) & 1) != 0;
    w.StringField("state", missing ? "missing" : failed ? "failed" : "ok");
    if (failed) w.StringField("error", store.devs().FailedError(i).Message());
    WriteQueue(m, origin, w);
    if (extras != nullptr && extras->write != nullptr) extras->write(extras->ctx, i, w);
    w.EndObject();
  }
  w.EndArray();
  platform::Delete(origin);

  // The members' deferred work (platform/work.h): I/O dispatches completions
  // left to it, background table writes' steps.
  w.Key("work");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_WORK_COUNTERS, w, store.devs().work().Stats());
  w.EndObject();

  w.Key("journal");
  w.BeginObject();
  // preflushes: per member, so as many as there are (the ctl reply is
  // bounded: docs/usage.md).
  TFS_COUNTER_JSON_N(TFS_JOURNAL_COUNTERS, w, store.journal().GetStats(), store.devs().size());
  w.EndObject();

  w.Key("btree");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_BTREE_COUNTERS, w, store.btrees().GetStats());
  w.EndObject();

  w.Key("alloc");
  w.BeginObject();
  WriteAlloc(store, w);
  w.EndObject();

  w.Key("accounting");
  w.BeginObject();
  WriteAccounting(store, w);
  w.EndObject();

  w.Key("data");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_DATA_COUNTERS, w, inst.data().GetStats());
  w.EndObject();

  const posix::Stats p = fs.GetStats();
  w.Key("posix");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_POSIX_COUNTERS, w, p);
  w.Key("write_buffer");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_WBUF_COUNTERS, w, p);
  w.EndObject();
  w.EndObject();

  // The background engines: each one's state and counters (bg/engine.h).
  w.Key("engines");
  w.BeginObject();
  for (u32 i = 0; i < bg::kEngineCount; i++) {
    const bg::Engine& e = inst.engines().get(bg::EngineId(i));
    w.Key(bg::EngineName(bg::EngineId(i)));
    w.BeginObject();
    w.StringField("state", bg::EngineStateName(e.State()));
    TFS_COUNTER_JSON(TFS_ENGINE_COUNTERS, w, e.GetStats());
    w.EndObject();
  }
  w.EndObject();
  // The members' background budgets the engines share (bg/budget.h), in
  // member order.
  w.Key("budget");
  w.BeginArray();
  for (u32 i = 0; i < store.devs().size(); i++) {
    w.BeginObject();
    TFS_COUNTER_JSON(TFS_BUDGET_COUNTERS, w, inst.engines().budget(i).GetStats());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return Status::Ok();
}

}  // namespace tfs::mount
