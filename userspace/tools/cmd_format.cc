// tierfs format / mkfs.tierfs: create a filesystem.
//
// `--label L` names the device that follows it (as in `--label ssd.a /dev/nvme0n1
// --label hdd.b /dev/sda`); unlabeled devices get "dev0", "dev1"... A device that
// already holds a tierfs superblock is refused unless --force is given.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <set>

#include "sb/superblock.h"
#include "store/store.h"
#include "userspace/tools/common.h"
#include "userspace/tools/members.h"
#include "userspace/tools/mount_table.h"

namespace tfs::tools {
namespace {

// Options that take a value (so the label scan can skip their values).
const std::set<std::string> kValueOptions = {
    "--foreground-target", "--background-target", "--promote-target", "--metadata-target",
    "--bucket-size", "--btree-node-size", "--replicas", "--metadata-replicas", "--compression",
    "--journal-buckets", "--durability", "--fault", "--fault-set"};

// Pulls `--label X` / `--label=X` out of argv, remembering which positional
// argument (device) each one precedes.
std::vector<std::string> ExtractLabels(int argc, char** argv, std::map<size_t, std::string>* labels,
                                       std::string* error) {
  std::vector<std::string> rest;
  std::string pending;
  size_t positional = 0;
  bool have_pending = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--label" || a.rfind("--label=", 0) == 0) {
      if (have_pending) {
        *error = "--label " + pending + " is not followed by a device";
        return {};
      }
      if (a == "--label") {
        if (i + 1 >= argc) {
          *error = "--label needs a value";
          return {};
        }
        pending = argv[++i];
      } else {
        pending = a.substr(8);
      }
      have_pending = true;
      continue;
    }
    rest.push_back(a);
    if (a.rfind("-", 0) == 0) {
      if (kValueOptions.count(a) && i + 1 < argc) rest.push_back(argv[++i]);
      continue;
    }
    if (have_pending) (*labels)[positional] = pending;
    have_pending = false;
    positional++;
  }
  if (have_pending) *error = "--label " + pending + " is not followed by a device";
  return rest;
}

}  // namespace

int CmdFormat(int argc, char** argv) {
  std::map<size_t, std::string> labels;
  std::string label_error;
  std::vector<std::string> rest = ExtractLabels(argc, argv, &labels, &label_error);
  if (!label_error.empty()) {
    PrintError("format", label_error);
    return 2;
  }

  CLI::App app("Create a tierfs filesystem on DEV... (files or block devices).\n"
               "Put --label group.name before a device to name it, e.g.\n"
               "  tierfs format --label ssd.a a.img --label hdd.b b.img "
               "--foreground-target ssd --background-target hdd",
               "tierfs format");
  std::vector<std::string> devices;
  std::string fg, bg, promote, meta, bucket = "1M", node = "256K", compression = "none";
  unsigned replicas = 1, meta_replicas = 1, journal_buckets = 0, durability = 1;
  bool force = false;
  app.add_option("devices", devices, "devices or image files")->required();
  app.add_option("--foreground-target", fg, "where new writes go (group or member label)");
  app.add_option("--background-target", bg, "where the background mover moves data");
  app.add_option("--promote-target", promote, "where read-hot data is copied");
  app.add_option("--metadata-target", meta, "where journal and btree live (default: foreground target)");
  app.add_option("--bucket-size", bucket, "allocation bucket size (64K..64M, power of two)");
  app.add_option("--btree-node-size", node, "btree node size (4K..1M, power of two)");
  app.add_option("--replicas", replicas, "data replicas (1..4)");
  app.add_option("--metadata-replicas", meta_replicas, "metadata replicas (1..4)");
  app.add_option("--compression", compression, "none or zstd");
  app.add_option("--journal-buckets", journal_buckets, "journal buckets per metadata device (0: auto)");
  app.add_option("--durability", durability, "durability of every device (0..4)");
  app.add_flag("-f,--force", force, "overwrite devices that already hold a tierfs filesystem");
  FaultArgs fault_args;
  AddFaultOptions(&app, &fault_args);
  app.footer("--label L names the device that follows it (default: dev0, dev1, ...).");
  std::vector<std::string> args(rest.rbegin(), rest.rend());
  if (int rc = ParseCommandLine(app, "format", args); rc >= 0) return rc;

  auto size_or = [&](const std::string& what, const std::string& text) -> std::optional<uint64_t> {
    auto v = ParseSize(text);
    if (!v || *v > UINT32_MAX) PrintError("format", "bad " + what + " '" + text + "'");
    return v && *v <= UINT32_MAX ? v : std::nullopt;
  };
  auto bucket_size = size_or("bucket size", bucket);
  auto node_size = size_or("btree node size", node);
  if (!bucket_size || !node_size) return 2;
  if (compression != "none" && compression != "zstd") {
    PrintError("format", "--compression must be none or zstd");
    return 2;
  }
  if (replicas < 1 || replicas > 4 || meta_replicas < 1 || meta_replicas > 4 || durability > 4) {
    PrintError("format", "replicas must be 1..4 and durability 0..4");
    return 2;
  }

  std::vector<FaultSpec> faults;
  if (!ParseFaults("format", fault_args, &faults)) return 2;
  std::map<size_t, std::string> names_by_index;
  for (size_t i = 0; i < devices.size(); i++) names_by_index[i] = labels.count(i) ? labels[i] : "dev" + std::to_string(i);
  Members devs;
  if (!devs.Open("format", devices, false, faults, names_by_index)) return 1;
  // Never over a mounted set, nor under a daemon still writing after its
  // unmount (after Open: a missing device gets Open's plainer message).
  MemberLocks locks;
  if (!locks.Take("format", devices, MemberLocks::Mode::kExclusive)) return 1;
  if (!force) {
    for (BlockDevice* d : devs.Raw()) {
      sb::Superblock s;
      if (sb::Read(*d, &s).ok()) {
        PrintError("format", std::string(d->Name()) + " already holds a tierfs filesystem (uuid " +
                                 UuidString(s.fs_uuid) + ", member " + s.members[s.dev_idx].label +
                                 "); use --force to overwrite it");
        return 1;
      }
    }
  }
  std::vector<store::FormatMember> members(devs.size());
  for (size_t i = 0; i < devs.size(); i++) {
    members[i] = store::FormatMember{devs.dev(i), devs.label(i).c_str(), uint8_t(durability)};
  }
  store::FormatOptions o;
  o.foreground_target = fg.c_str();
  o.background_target = bg.c_str();
  o.promote_target = promote.c_str();
  o.metadata_target = meta.c_str();
  o.bucket_size = uint32_t(*bucket_size);
  o.btree_node_size = uint32_t(*node_size);
  o.data_replicas = uint8_t(replicas);
  o.metadata_replicas = uint8_t(meta_replicas);
  o.compression = compression == "zstd" ? sb::CompressionType::kZstd : sb::CompressionType::kNone;
  o.journal_buckets = journal_buckets;
  Diag diag;
  Status st = store::Format(members.data(), uint32_t(members.size()), o, &diag);
  if (!st.ok()) {
    std::string msg = diag.empty() ? st.Message() : diag.text;
    if (msg.rfind("format: ", 0) == 0) msg = msg.substr(8);
    PrintError("format", msg);
    return 1;
  }
  sb::Superblock s;
  if (!sb::Read(*devs.dev(0), &s).ok()) {
    PrintError("format", "the new superblock does not read back");
    return 1;
  }
  printf("formatted %zu device(s): uuid %s, bucket size %u KiB\n", devs.size(),
         UuidString(s.fs_uuid).c_str(), s.bucket_size >> 10);
  for (uint32_t i = 0; i < s.nr_members; i++) {
    const sb::Member& m = s.members[i];
    printf("  %-16s %-28s %8llu buckets%s\n", m.label, devices[i].c_str(), (unsigned long long)m.nbuckets,
           m.journal_nbuckets ? (", journal " + std::to_string(m.journal_nbuckets) + " buckets").c_str() : "");
  }
  return 0;
}

}  // namespace tfs::tools
