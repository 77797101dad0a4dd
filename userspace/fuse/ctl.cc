// The counters tierfs ctl reads (see ctl.h).
#include "userspace/fuse/ctl.h"

#include <memory>

#include "userspace/util/json.h"

namespace tfs::fuse {

std::string StatsJson(store::Store& store, posix::Filesystem& fs, MemberControl* members) {
  userspace::JsonWriter w;
  w.BeginObject();
  const sb::Superblock& sb = store.sb();
  w.UintField("bucket_size", sb.bucket_size);

  w.Key("devices");
  w.BeginArray();
  auto stats = std::make_unique<dev::OriginStats>();
  for (u32 i = 0; i < store.devs().size(); i++) {
    dev::Member* m = store.devs().member(i);
    w.BeginObject();
    w.UintField("index", i);
    w.StringField("label", m->label());
    w.StringField("group", m->group());
    if (members != nullptr) w.StringField("path", members->Path(i));
    const dev::QueueState q = m->queue().State();
    w.UintField("in_flight", q.in_flight);
    w.UintField("queued", q.queued);
    w.UintField("latency_ewma_ns", q.latency_ewma_ns);
    w.BoolField("stalled", q.stalled);
    w.BoolField("durability_debt", q.durability_debt);
    w.UintField("readahead_declined", q.readahead_declined);
    w.UintField("stall_events", q.stall_events);
    w.Key("io");  // by origin; origins that did nothing are left out
    w.BeginObject();
    for (int o = 0; o < kIoOriginCount; o++) {
      m->queue().ReadStats(IoOrigin(o), stats.get());
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
    if (members != nullptr) {
      w.Key("fault");
      if (!members->WriteFault(i, w)) w.Null();
    }
    w.EndObject();
  }
  w.EndArray();

  const journal::Stats j = store.journal().GetStats();
  w.Key("journal");
  w.BeginObject();
  w.UintField("commits", j.commits);
  w.UintField("flush_commits", j.flush_commits);
  w.UintField("entries", j.entries);
  w.UintField("flush_entries", j.flush_entries);
  w.UintField("unordered_entries", j.unordered_entries);
  w.UintField("bytes", j.bytes);
  w.UintField("keys", j.keys);
  w.UintField("space_waits", j.space_waits);
  w.UintField("room_waits", j.room_waits);
  w.UintField("reclaim_calls", j.reclaim_calls);
  w.UintField("max_group", j.max_group);
  w.UintField("caller_entries", j.caller_entries);
  w.UintField("next_seq", j.next_seq);
  w.UintField("durable_seq", j.durable_seq);
  w.UintField("ring_buckets", j.ring_buckets);
  w.UintField("free_buckets", j.free_buckets);
  w.EndObject();

  const btree::Stats b = store.btrees().GetStats();
  w.Key("btree");
  w.BeginObject();
  w.UintField("lookups", b.lookups);
  w.UintField("inserts", b.inserts);
  w.UintField("deletes", b.deletes);
  w.UintField("commits", b.commits);
  w.UintField("cache_hits", b.cache_hits);
  w.UintField("cache_misses", b.cache_misses);
  w.UintField("evictions", b.evictions);
  w.UintField("node_reads", b.node_reads);
  w.UintField("node_writes", b.node_writes);
  w.UintField("node_write_bytes", b.node_write_bytes);
  w.UintField("checkpoints", b.checkpoints);
  w.UintField("reserved_buckets", b.reserved_buckets);
  w.UintField("returned_buckets", b.returned_buckets);
  w.UintField("hole_slots", b.hole_slots);
  w.UintField("corrupt_reads", b.corrupt_reads);
  w.UintField("cached_nodes", b.cached_nodes);
  w.UintField("cached_bytes", b.cached_bytes);
  w.UintField("dirty_bytes", b.dirty_bytes);
  w.EndObject();

  w.Key("alloc");
  w.BeginObject();
  w.Key("devices");
  w.BeginArray();
  struct Tier {
    std::string group;
    u64 buckets = 0, free = 0;
  };
  std::vector<Tier> tiers;
  for (u32 i = 0; i < store.devs().size(); i++) {
    const alloc::DeviceUsage u = store.alloc().Usage(i);
    w.BeginObject();
    w.StringField("label", store.devs().member(i)->label());
    w.UintField("buckets", u.nbuckets);
    for (int s = 0; s < alloc::kBucketStateCount; s++)
      w.UintField(alloc::BucketStateName(alloc::BucketState(s)), u.by_state[s]);
    w.UintField("pending_free", u.pending_free);
    w.UintField("live_sectors", u.live_sectors);
    // The btree reserve in force (its declared need plus growth room), the
    // need itself, and the free buckets user data leaves (copygc + btree
    // reserves): docs/design/space.md.
    w.UintField("reserve_btree", u.reserves.btree);
    w.UintField("metadata_need", u.metadata_need);
    w.UintField("data_floor", u.reserves.copygc + u.reserves.btree);
    w.EndObject();
    const std::string g = store.devs().member(i)->group();
    Tier* t = nullptr;
    for (Tier& x : tiers)
      if (x.group == g) t = &x;
    if (t == nullptr) {
      tiers.push_back(Tier{g});
      t = &tiers.back();
    }
    t->buckets += u.nbuckets;
    t->free += u.by_state[int(alloc::BucketState::kFree)];
  }
  w.EndArray();
  w.Key("tiers");
  w.BeginObject();
  for (const Tier& t : tiers) {
    w.Key(t.group);
    w.BeginObject();
    w.UintField("buckets", t.buckets);
    w.UintField("free", t.free);
    w.EndObject();
  }
  w.EndObject();
  const alloc::AllocStats a = store.alloc().Stats();
  w.UintField("frees", a.frees);
  w.UintField("fallbacks", a.fallbacks);
  w.UintField("checkpoints", a.checkpoints);
  w.UintField("table_writes", a.table_writes);
  w.UintField("tables_unchanged", a.tables_unchanged);
  w.UintField("background_table_writes", a.background_table_writes);
  w.UintField("background_table_errors", a.background_table_errors);
  w.UintField("relogs", a.relogs);
  w.UintField("relogged_buckets", a.relogged_buckets);
  w.UintField("relogs_too_big", a.relogs_too_big);
  w.UintField("metadata_refused", a.metadata_refused);
  w.EndObject();

  const data::Stats d = fs.GetDataStats();
  w.Key("data");
  w.BeginObject();
  w.UintField("bytes_written", d.bytes_written);
  w.UintField("extents_written", d.extents_written);
  w.UintField("bytes_read", d.bytes_read);
  w.UintField("blocks_read", d.blocks_read);
  w.UintField("blocks_released", d.blocks_released);
  w.UintField("csum_errors", d.csum_errors);
  w.UintField("buckets_opened", d.buckets_opened);
  w.UintField("buckets_freed", d.buckets_freed);
  w.UintField("blocks_reserved", d.blocks_reserved);
  w.UintField("reserve_refused", d.reserve_refused);
  w.UintField("compressed_in", d.compressed_in);
  w.UintField("compressed_out", d.compressed_out);
  w.UintField("incompressible", d.incompressible);
  w.UintField("compressed_reads", d.compressed_reads);
  w.UintField("stale_lookups", d.stale_lookups);
  w.UintField("read_retries", d.read_retries);
  w.UintField("slow_member_flushes", d.slow_member_flushes);
  w.EndObject();

  const posix::Stats p = fs.GetStats();
  w.Key("posix");
  w.BeginObject();
  w.UintField("lookups", p.lookups);
  w.UintField("creates", p.creates);
  w.UintField("unlinks", p.unlinks);
  w.UintField("renames", p.renames);
  w.UintField("setattrs", p.setattrs);
  w.UintField("readdirs", p.readdirs);
  w.UintField("inodes_freed", p.inodes_freed);
  w.UintField("orphans_freed", p.orphans_freed);
  w.UintField("open_inodes", p.open_inodes);
  w.UintField("inode_locks_now", p.inode_locks_now);
  w.Key("write_buffer");
  w.BeginObject();
  w.UintField("writes_buffered", p.writes_buffered);
  w.UintField("writes_direct", p.writes_direct);
  w.UintField("flushes_full", p.flushes_full);
  w.UintField("flushes_close", p.flushes_close);
  w.UintField("flushes_fsync", p.flushes_fsync);
  w.UintField("flushes_age", p.flushes_age);
  w.UintField("flushes_other", p.flushes_other);
  w.UintField("bytes_flushed", p.bytes_flushed);
  w.UintField("flush_errors", p.flush_errors);
  w.UintField("buffers_dropped", p.buffers_dropped);
  w.UintField("closes_unbuffered", p.closes_unbuffered);
  w.UintField("buffers_now", p.buffers_now);
  w.EndObject();
  w.EndObject();
  w.EndObject();
  return w.str();
}

}  // namespace tfs::fuse
