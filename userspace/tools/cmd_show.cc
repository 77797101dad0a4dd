// tierfs show: superblock, members and per-device usage, as text or JSON. Opens the
// filesystem read-only (an unclean journal is replayed in memory, not written).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "alloc/accounting.h"
#include "store/store.h"
#include "userspace/tools/common.h"
#include "userspace/tools/members.h"
#include "userspace/util/json.h"

namespace tfs::tools {
namespace {

// 512-byte sectors in MiB, one decimal ("12.5"; the unit is the caller's).
std::string MiB(uint64_t sectors) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f", double(sectors) / 2048.0);
  return buf;
}

}  // namespace

int CmdShow(int argc, char** argv) {
  CLI::App app("Show a tierfs filesystem: superblock, members, usage by bucket state.", "tierfs show");
  std::vector<std::string> devices;
  bool json = false;
  app.add_option("devices", devices, "every member device of the filesystem")->required();
  app.add_flag("--json", json, "print JSON");
  FaultArgs fault_args;
  AddFaultOptions(&app, &fault_args);
  if (int rc = ParseCommandLine(app, "show", argc, argv); rc >= 0) return rc;

  std::vector<FaultSpec> faults;
  if (!ParseFaults("show", fault_args, &faults)) return 2;
  Members members;
  if (!members.Open("show", devices, /*read_only=*/true, faults)) return 1;
  std::vector<BlockDevice*> raw = members.Raw();
  store::Store e;
  store::OpenOptions oo;
  oo.read_only = true;
  store::OpenReport rep;
  Diag diag;
  Status st = e.Open(raw.data(), uint32_t(raw.size()), oo, &diag, &rep);
  if (!st.ok()) {
    PrintError("show", diag.empty() ? st.Message() : diag.text);
    return 1;
  }
  const sb::Superblock& s = e.sb();
  const char* state_names[alloc::kBucketStateCount];
  for (int i = 0; i < alloc::kBucketStateCount; i++) state_names[i] = alloc::BucketStateName(alloc::BucketState(i));

  // What the accounting says of the data's copies (every member is open:
  // none is out).
  Vector<alloc::ReplicasEntry> sets;
  if (!e.acct().ReplicasInto(&sets).ok()) {
    PrintError("show", "out of memory reading the accounting");
    return 1;
  }
  const alloc::CopiesSummary copies = alloc::SummarizeCopies(sets.data(), sets.size(), 0);

  if (json) {
    userspace::JsonWriter w;
    w.BeginObject();
    w.StringField("uuid", UuidString(s.fs_uuid));
    w.UintField("seq", s.seq);
    w.BoolField("clean", rep.was_clean);
    w.UintField("lost_data_btrees", rep.lost_data_btrees);
    w.BoolField("accounting_repair_unfinished", (s.flags & sb::kSbAcctRepair) != 0);
    w.UintField("bucket_size", s.bucket_size);
    w.UintField("btree_node_size", s.btree_node_size);
    w.UintField("journal_seq", s.journal_seq);
    w.Key("options");
    w.BeginObject();
    w.StringField("foreground_target", s.options.foreground_target);
    w.StringField("background_target", s.options.background_target);
    w.StringField("promote_target", s.options.promote_target);
    w.StringField("metadata_target", s.options.metadata_target);
    w.UintField("data_replicas", s.options.data_replicas);
    w.UintField("metadata_replicas", s.options.metadata_replicas);
    w.StringField("checksum", s.options.checksum == sb::ChecksumType::kCrc32c ? "crc32c" : "none");
    w.StringField("compression", s.options.compression == sb::CompressionType::kZstd ? "zstd" : "none");
    w.EndObject();
    w.Key("members");
    w.BeginArray();
    for (uint32_t i = 0; i < s.nr_members; i++) {
      const sb::Member& m = s.members[i];
      alloc::DeviceUsage u = e.alloc().Usage(i);
      w.BeginObject();
      w.UintField("index", i);
      w.StringField("label", m.label);
      w.StringField("group", e.devs().member(i)->group());
      w.StringField("device", e.devs().member(i)->bdev()->Name());
      w.StringField("uuid", UuidString(m.uuid));
      w.UintField("size", m.size);
      w.UintField("nbuckets", m.nbuckets);
      w.UintField("durability", m.durability);
      w.Key("data_allowed");
      w.BeginArray();
      if (m.data_allowed & sb::kDataJournal) w.String("journal");
      if (m.data_allowed & sb::kDataBtree) w.String("btree");
      if (m.data_allowed & sb::kDataUser) w.String("user");
      w.EndArray();
      w.UintField("journal_buckets", m.journal_nbuckets);
      w.Key("buckets");
      w.BeginObject();
      for (int k = 0; k < alloc::kBucketStateCount; k++) w.UintField(state_names[k], u.by_state[k]);
      w.EndObject();
      w.UintField("gen_blocked", u.gen_blocked);  // free buckets the generation guard holds back
      w.UintField("live_sectors", u.live_sectors);
      w.UintField("cached_sectors", u.cached_sectors);
      w.Key("reserves");
      w.BeginObject();
      w.UintField("foreground", u.reserves.foreground);
      w.UintField("copygc", u.reserves.copygc);
      w.UintField("btree", u.reserves.btree);  // in force: metadata_need + max(fixed share, metadata_need)
      w.UintField("metadata_need", u.metadata_need);
      w.EndObject();
      w.EndObject();
    }
    w.EndArray();
    w.Key("data");
    w.BeginObject();
    w.UintField("sectors", copies.sectors);
    w.Key("copies_sectors");  // [i]: sectors of data with i + 1 copies
    w.BeginArray();
    for (uint32_t k = 1; k <= alloc::kAcctMaxMembers; k++) w.Uint(copies.by_copies[k]);
    w.EndArray();
    w.UintField("reserved_sectors", e.acct().reserved_sectors());
    w.UintField("inodes", e.acct().inodes());
    w.EndObject();
    w.EndObject();
    printf("%s\n", w.str().c_str());
    return 0;
  }

  printf("uuid:            %s\n", UuidString(s.fs_uuid).c_str());
  printf("state:           %s\n", rep.was_clean ? "clean" : "not cleanly unmounted (journal replayed in memory)");
  if (rep.lost_data_btrees != 0) {
    printf("repair:          unfinished: an 'fsck -y' that dropped damaged nodes (trees 0x%x) was cut short; "
           "run 'tierfs fsck -y'\n",
           unsigned(rep.lost_data_btrees));
  }
  if ((s.flags & sb::kSbAcctRepair) != 0)
    printf("repair:          unfinished: an 'fsck -y' repair of the space accounting was cut short; "
           "run 'tierfs fsck -y'\n");
  printf("bucket size:     %u KiB\n", s.bucket_size >> 10);
  printf("btree node size: %u KiB\n", s.btree_node_size >> 10);
  printf("targets:         foreground=%s background=%s promote=%s metadata=%s\n",
         *s.options.foreground_target ? s.options.foreground_target : "-",
         *s.options.background_target ? s.options.background_target : "-",
         *s.options.promote_target ? s.options.promote_target : "-",
         *s.options.metadata_target ? s.options.metadata_target : "-");
  printf("replicas:        data %u, metadata %u\n", s.options.data_replicas, s.options.metadata_replicas);
  printf("data:            %s MiB", MiB(copies.sectors).c_str());
  const char* sep = " (";
  for (uint32_t k = 1; k <= alloc::kAcctMaxMembers; k++) {
    if (copies.by_copies[k] == 0) continue;
    printf("%s%s MiB with %u cop%s", sep, MiB(copies.by_copies[k]).c_str(), k, k == 1 ? "y" : "ies");
    sep = ", ";
  }
  printf("%s", *sep == ',' ? ")" : "");
  const uint64_t reserved = e.acct().reserved_sectors();
  if (reserved != 0) printf("; %s MiB reserved (fallocated, unwritten)", MiB(reserved).c_str());
  printf("\n");
  printf("\n%-3s %-14s %-24s %9s %7s %7s %7s %7s %7s %7s %10s %10s\n", "#", "label", "device", "buckets", "free",
         "meta", "journal", "btree", "user", "cached", "data MiB", "cache MiB");
  for (uint32_t i = 0; i < s.nr_members; i++) {
    alloc::DeviceUsage u = e.alloc().Usage(i);
    printf("%-3u %-14s %-24s %9llu", i, s.members[i].label, e.devs().member(i)->bdev()->Name(),
           (unsigned long long)u.nbuckets);
    for (int k = 0; k < alloc::kBucketStateCount; k++) printf(" %7llu", (unsigned long long)u.by_state[k]);
    printf(" %10s %10s\n", MiB(u.live_sectors).c_str(), MiB(u.cached_sectors).c_str());
  }
  printf("(buckets by state; data MiB, cache MiB: the file data the member holds copies of, and cached copies of)\n");
  for (uint32_t i = 0; i < s.nr_members; i++) {
    const u64 blocked = e.alloc().Usage(i).gen_blocked;
    if (blocked != 0)
      printf("%s: %llu of its free buckets wait for a generation pass ('tierfs fsck -y' runs one)\n",
             s.members[i].label, (unsigned long long)blocked);
  }
  return 0;
}

}  // namespace tfs::tools
