// faultdev: the command line of the fault devices.
//
//   faultdev run      drive a synthetic load through a profile and print stats (JSON)
//   faultdev powercut apply a power cut, from a seed, to a run's recorded unflushed writes
//   faultdev serve    export a profile over NBD (execs nbdkit with the faultdev plugin)
//   faultdev ctl      send a control command (stall, powercut, ...) to a served device
//   faultdev profiles list the shipped profiles
//
// Every failure is one line on stderr and a nonzero exit: 2 for bad usage or bad
// input (profile, arguments), 1 for I/O trouble. The seed of every run is printed
// in its stats so the run can be replayed with --seed.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "faultdevices/cache.h"
#include "faultdevices/control.h"
#include "faultdevices/device.h"
#include "faultdevices/loadgen.h"
#include "faultdevices/profile.h"
#include "platform/block_device.h"  // SyncIo
#include "userspace/platform/uring_device.h"

namespace faultdev {
namespace {

[[noreturn]] void Die(int code, const std::string& msg) {
  std::cerr << "faultdev: " << msg << "\n";
  std::exit(code);
}

Profile LoadOrDie(const std::string& name, const std::vector<std::string>& sets, std::optional<uint64_t> seed) {
  std::string path = FindProfile(name);
  if (path.empty()) Die(2, "profile '" + name + "' not found (a file, or a name in " + ProfileDir() + ")");
  std::string error;
  std::optional<Profile> p = LoadProfile(path, sets, &error);
  if (!p) Die(2, error);
  if (seed) p->seed = *seed;
  return *p;
}

void CreateImageIfMissing(const std::string& image, uint64_t size) {
  struct stat st;
  if (stat(image.c_str(), &st) == 0) return;
  if (size == 0) Die(2, image + ": no such image (give --size to create it)");
  int fd = open(image.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) Die(1, image + ": cannot create: " + strerror(errno));
  close(fd);
}

void WriteJson(const std::string& path, const std::string& json) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << json;
  if (!out) Die(1, path + ": cannot write stats");
}

// Load buffers are allocated up front (one --block per request in flight): bound
// them so a typo fails with a message instead of the OOM killer.
constexpr uint64_t kMaxBlock = 64ull << 20;
constexpr uint64_t kMaxLoadBuffers = 1ull << 30;

struct RunArgs {
  std::string profile, image, pattern = "randread", json;
  std::vector<std::string> sets;
  std::optional<uint64_t> seed;
  uint64_t ops = 1000;
  std::string span = "0", size = "0";
  uint32_t qd = 1, block = 4096;
  bool no_direct = false, raw = false, flush_at_end = false;
};

// One-line error unless --block suits the image.
void CheckBlock(const RunArgs& a, uint64_t image_size, uint32_t logical_block) {
  if (a.block % logical_block != 0) Die(2, "--block must be a multiple of the image's block size");
  if (a.block > image_size) {
    Die(2, "--block " + std::to_string(a.block) + " is larger than the image (" + std::to_string(image_size) +
               " bytes)");
  }
}

int Run(const RunArgs& a) {
  std::optional<Pattern> pattern = ParsePattern(a.pattern);
  if (!pattern) Die(2, "unknown pattern '" + a.pattern + "' (randread, randwrite, seqread, seqwrite, mixed)");
  if (a.block == 0 || a.block % 512 != 0) Die(2, "--block must be a positive multiple of 512");
  if (a.block > kMaxBlock) Die(2, "--block must be at most 64 MiB");
  if (uint64_t(a.block) * std::min<uint64_t>(a.qd, a.ops) > kMaxLoadBuffers) {
    Die(2, "--block x --qd must be at most 1 GiB (the load's buffers)");
  }
  std::optional<uint64_t> size = ParseSize(a.size), span = ParseSize(a.span);
  if (!size) Die(2, "--size: not a size: '" + a.size + "' (bytes, or like 64MiB, 1G)");
  if (!span) Die(2, "--span: not a size: '" + a.span + "' (bytes, or like 64MiB, 1G)");
  CreateImageIfMissing(a.image, *size);
  LoadOptions lo;
  lo.pattern = *pattern;
  lo.ops = a.ops;
  lo.qd = a.qd;
  lo.block = a.block;
  lo.span = *span;
  std::string error;
  tfs::userspace::JsonWriter w;
  if (a.raw) {
    // The benchmark baseline: the same load on the backing file, no models.
    lo.seed = a.seed.value_or(1);
    tfs::userspace::UringOptions uo;
    uo.try_direct = !a.no_direct;
    auto dev = tfs::userspace::UringDevice::Open(a.image, uo);
    if (!dev.ok()) Die(1, a.image + ": cannot open: " + dev.status().Message());
    CheckBlock(a, (*dev)->Size(), (*dev)->LogicalBlockSize());
    LoadResult r = RunLoad(**dev, lo);
    w.BeginObject();
    w.BoolField("raw", true);
    w.StringField("image", a.image);
    w.StringField("pattern", a.pattern);
    w.UintField("qd", a.qd);
    w.UintField("seed", lo.seed);
    w.Key("load");
    r.Write(w);
    w.EndObject();
  } else {
    if (a.profile.empty()) Die(2, "--profile is required (or --raw)");
    Profile p = LoadOrDie(a.profile, a.sets, a.seed);
    lo.seed = p.seed;
    std::unique_ptr<FaultDevice> dev = OpenFile(p, a.image, !a.no_direct, &error);
    if (!dev) Die(1, error);
    CheckBlock(a, dev->Size(), dev->LogicalBlockSize());
    std::cerr << "faultdev: run profile " << p.name << " seed " << p.seed << " pattern " << a.pattern << " ops "
              << a.ops << " qd " << a.qd << "\n";
    LoadResult r = RunLoad(*dev, lo);
    if (a.flush_at_end && dev->powered()) {
      tfs::Status st = tfs::SyncIo(*dev, tfs::IoOp::kFlush, 0, nullptr, 0);
      if (!st.ok()) Die(1, std::string("final flush failed: ") + st.Message());
    }
    dev->Drain();
    std::string record = RecordPath(a.image);
    if (!dev->SaveCacheRecords(record, &error)) Die(1, error);
    DeviceStats s = dev->Stats();
    if (s.cache_records != 0) {
      std::cerr << "faultdev: " << s.cache_records << " unflushed writes recorded in " << record
                << "; apply a cut with: faultdev powercut --profile " << a.profile << " --image " << a.image
                << " --seed S\n";
    }
    w.BeginObject();
    w.StringField("pattern", a.pattern);
    w.UintField("qd", a.qd);
    w.UintField("block", a.block);
    w.UintField("seed", p.seed);
    w.Key("load");
    r.Write(w);
    w.Key("device");
    s.Write(w);
    w.EndObject();
  }
  const std::string json = w.str() + "\n";
  std::cout << json;
  WriteJson(a.json, json);
  return 0;
}

int PowerCutCmd(const std::string& profile, const std::string& image, uint64_t seed,
                const std::vector<std::string>& sets) {
  Profile p = LoadOrDie(profile, sets, seed);
  if (!p.cache.enabled) Die(2, "profile " + p.name + " has no [cache] section: nothing is volatile");
  std::string record = RecordPath(image);
  std::string error;
  uint32_t sector = 0;
  std::deque<CacheRecord> records;
  if (access(record.c_str(), F_OK) != 0) Die(2, record + ": no recorded unflushed writes for this image");
  if (!LoadRecords(record, &sector, &records, &error)) Die(2, error);
  CutOutcome out = PlanPowerCut(records, sector, seed, CutPolicy{p.cache.keep, p.cache.drop, p.cache.tear});
  int fd = open(image.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) Die(1, image + ": cannot open: " + strerror(errno));
  // Nothing is written unless every record lies inside the image: a stale or foreign
  // record file must not grow the image or scribble past its end.
  struct stat st;
  if (fstat(fd, &st) != 0) Die(1, image + ": cannot stat: " + strerror(errno));
  uint64_t image_size = uint64_t(st.st_size);
  if (S_ISBLK(st.st_mode)) {
    off_t end = lseek(fd, 0, SEEK_END);
    image_size = end > 0 ? uint64_t(end) : 0;
  }
  for (const CacheRecord& r : records) {
    if (r.offset > image_size || r.data.size() > image_size - r.offset) {
      Die(2, record + ": record at offset " + std::to_string(r.offset) + " (+" + std::to_string(r.data.size()) +
                 ") is beyond the end of " + image + " (" + std::to_string(image_size) + " bytes)");
    }
  }
  for (const SectorRun& run : out.runs) {
    if (pwrite(fd, run.data.data(), run.data.size(), off_t(run.offset)) != ssize_t(run.data.size()))
      Die(1, image + ": write failed: " + strerror(errno));
  }
  if (fsync(fd) != 0) Die(1, image + ": fsync failed: " + strerror(errno));
  close(fd);
  unlink(record.c_str());
  tfs::userspace::JsonWriter w;  // the image's path need not be JSON-safe
  w.BeginObject();
  w.StringField("image", image);
  w.StringField("profile", p.name);
  w.UintField("seed", seed);
  w.UintField("records", records.size());
  w.UintField("kept", out.kept);
  w.UintField("dropped", out.dropped);
  w.UintField("torn", out.torn);
  w.EndObject();
  std::cout << w.str() << "\n";
  return 0;
}

// The plugin sits in ../lib relative to the faultdev binary (the build layout).
std::string DefaultPlugin() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "lib" / "nbdkit-faultdev-plugin.so").string();
}

#if defined(__SANITIZE_ADDRESS__)
// An ASan-built plugin needs the ASan runtime loaded first in nbdkit.
std::string AsanRuntime() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && strstr(info->dlpi_name, "libasan") != nullptr)
          *static_cast<std::string*>(data) = info->dlpi_name;
        return 0;
      },
      &found);
  return found;
}
#endif

// `threads` is nbdkit's --threads: worker threads, and so requests in flight, per
// connection (unset: nbdkit's default, 16). 1 makes nbdkit serve each connection
// with one thread that reads a request, runs it and sends its reply, which nbdkit
// 1.32 needs to survive a client hanging up with replies still to send
// (docs/faultdevices.md, "A client that hangs up").
int Serve(const std::string& profile, const std::string& image, const std::string& socket,
          const std::string& control, std::optional<uint64_t> seed, const std::vector<std::string>& sets,
          const std::string& plugin_arg, const std::string& stats, std::optional<unsigned> threads) {
  // Validate here so that mistakes fail with faultdev's one-line errors, not nbdkit's.
  Profile p = LoadOrDie(profile, sets, seed);
  std::string path = FindProfile(profile);
  struct stat st;
  if (stat(image.c_str(), &st) != 0) Die(2, image + ": no such image");
  std::string plugin = plugin_arg.empty() ? DefaultPlugin() : plugin_arg;
  if (access(plugin.c_str(), R_OK) != 0) Die(2, plugin + ": nbdkit plugin not found (give --plugin)");
  std::vector<std::string> args = {"nbdkit", "--foreground", "--unix", socket};
  if (threads) args.insert(args.end(), {"--threads", std::to_string(*threads)});
  args.insert(args.end(), {plugin, "profile=" + path, "image=" + image, "seed=" + std::to_string(p.seed),
                           "control=" + (control.empty() ? socket + ".ctl" : control)});
  if (!stats.empty()) args.push_back("stats=" + stats);
  for (const std::string& s : sets) args.push_back("set=" + s);
#if defined(__SANITIZE_ADDRESS__)
  std::string asan = AsanRuntime();
  if (!asan.empty()) {
    setenv("LD_PRELOAD", asan.c_str(), 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);  // nbdkit's own allocations are not ours
  }
#endif
  std::cerr << "faultdev: serving profile " << p.name << " seed " << p.seed << " on " << socket << "\n";
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp("nbdkit", argv.data());
  Die(1, std::string("cannot run nbdkit: ") + strerror(errno));
}

}  // namespace
}  // namespace faultdev

int main(int argc, char** argv) {
  using namespace faultdev;
  CLI::App app{"faultdev: fault-injecting device models (see docs/faultdevices.md)"};
  app.require_subcommand(1);

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "drive a synthetic load through a profile and print stats as JSON");
  run->add_option("--profile", ra.profile, "profile name or file");
  run->add_option("--image", ra.image, "backing image file or block device")->required();
  run->add_option("--pattern", ra.pattern, "randread|randwrite|seqread|seqwrite|mixed")->capture_default_str();
  run->add_option("--ops", ra.ops, "requests to complete")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  run->add_option("--qd", ra.qd, "requests kept in flight")->capture_default_str()->check(CLI::Range(1, 4096));
  run->add_option("--seed", ra.seed, "seed (overrides the profile's)");
  run->add_option("--json", ra.json, "also write the stats to this file");
  run->add_option("--set", ra.sets, "override a profile key, e.g. timeout.duration_s=1 (repeatable)");
  run->add_option("--block", ra.block, "request size in bytes (at most 64 MiB and the image size)")
      ->capture_default_str();
  run->add_option("--span", ra.span, "bytes of the image to touch, e.g. 1GiB (0 = all)")->capture_default_str();
  run->add_option("--size", ra.size, "create the image with this size (e.g. 1G) if it does not exist");
  run->add_flag("--no-direct", ra.no_direct, "do not use O_DIRECT on the image");
  run->add_flag("--raw", ra.raw, "run the load on the image itself, without any model (benchmark baseline)");
  run->add_flag("--flush-at-end", ra.flush_at_end, "flush after the load (otherwise unflushed writes are recorded)");

  std::string pc_profile, pc_image;
  uint64_t pc_seed = 0;
  std::vector<std::string> pc_sets;
  CLI::App* pc = app.add_subcommand("powercut", "apply a power cut to the unflushed writes a run recorded");
  pc->add_option("--profile", pc_profile, "profile (its [cache] keep/drop/tear)")->required();
  pc->add_option("--image", pc_image, "image whose IMAGE.faultdev-cache to apply")->required();
  pc->add_option("--seed", pc_seed, "seed of the cut (same seed, same image)")->required();
  pc->add_option("--set", pc_sets, "override a profile key (repeatable)");

  std::string sv_profile, sv_image, sv_socket, sv_control, sv_plugin, sv_stats;
  std::optional<uint64_t> sv_seed;
  std::optional<unsigned> sv_threads;
  std::vector<std::string> sv_sets;
  CLI::App* sv = app.add_subcommand("serve", "export a profile over NBD on a unix socket (runs nbdkit)");
  sv->add_option("--profile", sv_profile, "profile name or file")->required();
  sv->add_option("--image", sv_image, "backing image")->required();
  sv->add_option("--socket", sv_socket, "NBD unix socket path")->required();
  sv->add_option("--control", sv_control, "control socket (default SOCKET.ctl)");
  sv->add_option("--seed", sv_seed, "seed (overrides the profile's)");
  sv->add_option("--set", sv_sets, "override a profile key (repeatable)");
  sv->add_option("--plugin", sv_plugin, "path of nbdkit-faultdev-plugin.so");
  sv->add_option("--stats", sv_stats, "write the device stats (JSON) here when nbdkit exits");
  sv->add_option("--threads", sv_threads,
                 "requests in flight per connection (nbdkit --threads, default 16); 1 for clients that may "
                 "hang up with requests in flight (nbdkit 1.32 aborts otherwise; see docs)")
      ->check(CLI::Range(1u, 1024u));

  std::string ctl_socket;
  std::vector<std::string> ctl_words;
  CLI::App* ctl = app.add_subcommand("ctl", "send a control command to a served device");
  ctl->add_option("--control", ctl_socket, "control socket")->required();
  ctl->add_option("command", ctl_words, "stall DURATION | unstall | error read|write|both START+LEN | clear | powercut [SEED] | poweron | clear-errors | stats")
      ->required();

  CLI::App* list = app.add_subcommand("profiles", "list the shipped profiles");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "faultdev: " << e.what() << " (see faultdev --help)\n";
    return 2;
  }

  if (*run) return Run(ra);
  if (*pc) return PowerCutCmd(pc_profile, pc_image, pc_seed, pc_sets);
  if (*sv) return Serve(sv_profile, sv_image, sv_socket, sv_control, sv_seed, sv_sets, sv_plugin, sv_stats,
                        sv_threads);
  if (*ctl) {
    std::string cmd, reply, error;
    for (const std::string& w : ctl_words) cmd += (cmd.empty() ? "" : " ") + w;
    if (!SendControl(ctl_socket, cmd, &reply, &error)) Die(1, error);
    std::cout << reply << "\n";
    return reply.rfind("error:", 0) == 0 ? 1 : 0;
  }
  if (*list) {
    std::vector<std::string> names;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(ProfileDir(), ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".toml") names.push_back(it->path().stem().string());
    }
    if (ec) Die(1, ProfileDir() + ": cannot list profiles: " + ec.message());
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
      std::string error;
      std::optional<Profile> p = LoadProfile(ProfileDir() + "/" + n + ".toml", {}, &error);
      std::cout << n << "\t" << (p ? p->description : "BROKEN: " + error) << "\n";
    }
    return 0;
  }
  return 2;
}
