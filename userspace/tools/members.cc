// Members and their fault devices for the tierfs command line (members.h).
#include "userspace/tools/members.h"

#include <CLI/CLI.hpp>

#include <climits>
#include <cstdlib>

#include "faultdevices/control.h"
#include "sb/superblock.h"
#include "userspace/platform/thread_ring.h"
#include "userspace/tools/common.h"
#include "userspace/util/json.h"

namespace tfs::tools {
namespace {

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) != nullptr ? std::string(buf) : p;
}

}  // namespace

void AddFaultOptions(CLI::App* app, FaultArgs* args) {
  app->add_option("--fault", args->faults,
                  "run MEMBER (label or path) over a fault device: MEMBER=PROFILE, PROFILE a shipped "
                  "faultdev profile (hdd-7200, hdd-stall, ...) or a TOML file; repeatable")
      ->type_name("MEMBER=PROFILE")
      ->allow_extra_args(false);  // one value per --fault: never a device path after it
  app->add_option("--fault-set", args->sets,
                  "override a key of MEMBER's fault profile, as faultdev --set: MEMBER:KEY=VALUE "
                  "(e.g. hdd.b:delay.all_ms=8); repeatable")
      ->type_name("MEMBER:KEY=VALUE")
      ->allow_extra_args(false);
  app->add_flag("--fault-shared-power", args->shared_power,
                "the --fault members share one power supply: a power cut of one (its [cache] trigger or "
                "'tierfs ctl MNT fault MEMBER powercut') cuts them all");
}

bool ParseFaults(const std::string& cmd, const FaultArgs& args, std::vector<FaultSpec>* out) {
  struct Raw {
    std::string member, profile;
    std::vector<std::string> sets;
  };
  std::vector<Raw> raw;
  for (const std::string& f : args.faults) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == f.size()) {
      PrintError(cmd, "--fault " + f + ": want MEMBER=PROFILE (e.g. hdd.b=hdd-stall)");
      return false;
    }
    Raw r{f.substr(0, eq), f.substr(eq + 1), {}};
    for (const Raw& o : raw) {
      if (o.member == r.member) {
        PrintError(cmd, "--fault " + f + ": " + r.member + " has a fault profile already");
        return false;
      }
    }
    raw.push_back(r);
  }
  for (const std::string& s : args.sets) {
    const size_t colon = s.find(':');
    if (colon == std::string::npos || colon == 0 || s.find('=', colon) == std::string::npos) {
      PrintError(cmd, "--fault-set " + s + ": want MEMBER:KEY=VALUE (e.g. hdd.b:delay.all_ms=8)");
      return false;
    }
    const std::string member = s.substr(0, colon);
    Raw* target = nullptr;
    for (Raw& r : raw) {
      if (r.member == member) target = &r;
    }
    if (target == nullptr) {
      PrintError(cmd, "--fault-set " + s + ": no --fault for " + member);
      return false;
    }
    target->sets.push_back(s.substr(colon + 1));
  }
  for (const Raw& r : raw) {
    const std::string path = faultdev::FindProfile(r.profile);
    if (path.empty()) {
      PrintError(cmd, "--fault " + r.member + "=" + r.profile + ": no such profile (a file, or one of " +
                          faultdev::ProfileDir() + "/*.toml; faultdev profiles lists them)");
      return false;
    }
    std::string error;
    std::optional<faultdev::Profile> p = faultdev::LoadProfile(path, r.sets, &error);
    if (!p) {
      PrintError(cmd, "--fault " + r.member + "=" + r.profile + ": " + error);
      return false;
    }
    out->push_back(FaultSpec{r.member, std::move(*p), args.shared_power});
  }
  if (args.shared_power && raw.size() < 2) {
    PrintError(cmd, "--fault-shared-power: needs --fault for two or more members");
    return false;
  }
  return true;
}

bool Members::Open(const std::string& cmd, const std::vector<std::string>& paths, bool read_only,
                   const std::vector<FaultSpec>& specs, const std::map<size_t, std::string>& labels) {
  auto devs = OpenDevices(cmd, paths, read_only);
  if (devs.empty()) return false;
  paths_ = paths;
  labels_.assign(paths.size(), "");
  for (size_t i = 0; i < devs.size(); i++) {
    if (labels.count(i) != 0) {
      labels_[i] = labels.at(i);
      continue;
    }
    sb::Superblock s;
    // Without a readable superblock the member is matched by path only; the
    // command itself says what is wrong with the device.
    if (sb::Read(*devs[i], &s).ok() && s.dev_idx < s.nr_members) labels_[i] = s.members[s.dev_idx].label;
  }
  devs_.clear();
  faults_.assign(paths.size(), nullptr);
  shared_.assign(paths.size(), false);
  urings_.clear();
  for (auto& d : devs) {
    urings_.push_back(d.get());
    devs_.push_back(std::move(d));
  }
  for (const FaultSpec& spec : specs) {
    const int i = Find(spec.member);
    if (i < 0) {
      PrintError(cmd, "--fault " + spec.member + ": no member has that label or path (members: " + List() + ")");
      return false;
    }
    if (faults_[size_t(i)] != nullptr) {  // named twice, by label and by path
      PrintError(cmd, "--fault " + spec.member + ": " + labels_[size_t(i)] + " (" + paths_[size_t(i)] +
                          ") has a fault profile already");
      return false;
    }
    std::string error;
    std::unique_ptr<faultdev::FaultDevice> f = faultdev::FaultDevice::Open(spec.profile, std::move(devs_[i]), &error);
    if (f == nullptr) {
      PrintError(cmd, "--fault " + spec.member + ": " + error);
      return false;
    }
    faults_[i] = f.get();
    devs_[i] = std::move(f);
    shared_[size_t(i)] = spec.shared_power;
  }
  for (size_t i = 0; i < faults_.size(); i++) {
    if (shared_[i]) faults_[i]->SetCutHook([this, i] { CutShared(i); });
  }
  return true;
}

Members::~Members() {
  for (size_t i = 0; i < faults_.size(); i++) {
    if (faults_[i] != nullptr && shared_[i]) faults_[i]->SetCutHook(nullptr);
  }
  devs_.clear();  // while the rest is still here
}

void Members::CutShared(size_t i) {
  {
    std::lock_guard<std::mutex> lock(shared_mu_);
    if (shared_cut_) return;  // a cut of the supply under way or done: this member's is part of it
    shared_cut_ = true;
  }
  // Without the lock: each of these cuts calls its own hook, which returns above.
  for (size_t j = 0; j < faults_.size(); j++) {
    if (j != i && shared_[j]) faults_[j]->PowerCut();
  }
}

bool Members::PowerOnShared(size_t i) {
  if (i >= shared_.size() || !shared_[i]) return false;
  std::lock_guard<std::mutex> lock(shared_mu_);
  for (size_t j = 0; j < faults_.size(); j++) {
    if (shared_[j]) faults_[j]->PowerOn();
  }
  shared_cut_ = false;
  return true;
}

int Members::UnstallAll() const {
  int n = 0;
  for (faultdev::FaultDevice* f : faults_) {
    if (f == nullptr || f->Stats().stall_remaining_ns == 0) continue;
    f->Unstall();
    n++;
  }
  return n;
}

std::vector<BlockDevice*> Members::Raw() const {
  std::vector<BlockDevice*> v;
  for (const auto& d : devs_) v.push_back(d.get());
  return v;
}

int Members::Find(const std::string& name) const {
  for (size_t i = 0; i < paths_.size(); i++) {
    if (!labels_[i].empty() && labels_[i] == name) return int(i);
  }
  const std::string real = RealPath(name);
  for (size_t i = 0; i < paths_.size(); i++) {
    if (paths_[i] == name || RealPath(paths_[i]) == real) return int(i);
  }
  return -1;
}

std::string Members::List() const {
  std::string s;
  for (size_t i = 0; i < paths_.size(); i++) {
    s += (i ? ", " : "") + (labels_[i].empty() ? std::string("?") : labels_[i]) + " (" + paths_[i] + ")";
  }
  return s;
}

int Members::IndexOf(const BlockDevice* d) const {
  for (size_t i = 0; i < devs_.size(); i++)
    if (devs_[i].get() == d) return int(i);
  return -1;
}

std::string MemberControls::Path(const BlockDevice* dev) {
  const int i = members_->IndexOf(dev);
  return i >= 0 ? members_->path(size_t(i)) : "";
}

bool MemberControls::WriteUring(const BlockDevice* dev, userspace::JsonWriter& w) {
  const int i = members_->IndexOf(dev);
  if (i < 0) return false;
  const userspace::UringStats s = members_->uring(size_t(i))->Stats();
  const userspace::ThreadRingStats t = userspace::GetThreadRingStats();
  w.BeginObject();
  w.BoolField("direct", members_->uring(size_t(i))->direct());
  TFS_COUNTER_JSON(TFS_URING_COUNTERS, w, s);
  // The daemon's thread rings (all members together: a ring serves every
  // member its thread waits on; docs/design/copies.md, "Step 7b").
  w.Key("thread_rings");
  w.BeginObject();
  TFS_COUNTER_JSON(TFS_THREAD_RING_COUNTERS, w, t);
  w.EndObject();
  w.EndObject();
  return true;
}

bool MemberControls::WriteFault(const BlockDevice* dev, userspace::JsonWriter& w) {
  const int i = members_->IndexOf(dev);
  faultdev::FaultDevice* f = i >= 0 ? members_->fault(size_t(i)) : nullptr;
  if (f == nullptr) return false;
  const faultdev::DeviceStats s = f->Stats();
  w.BeginObject();
  w.StringField("profile", s.profile);
  w.UintField("seed", s.seed);
  w.BoolField("stalled", s.stall_remaining_ns != 0);
  w.UintField("stall_remaining_ms", (s.stall_remaining_ns + 999'999) / 1'000'000);
  w.DoubleField("stalled_s", double(s.stalled_ns) / 1e9);
  w.BoolField("powered", s.powered);
  w.UintField("error_ranges_active", s.error_ranges_active);
  w.UintField("in_flight", s.in_flight);
  w.UintField("completed", s.completed);
  w.UintField("errors", s.errors);
  w.Key("injected");
  w.BeginObject();
  w.UintField("eio", s.errors_injected);
  w.UintField("timeouts", s.timeouts_injected);
  w.UintField("link_resets", s.link_resets);
  w.UintField("power_cuts", s.power_cuts);
  // The cuts' cached writes by fate (docs/faultdevices.md, [cache]).
  w.UintField("cut_kept", s.cut_kept);
  w.UintField("cut_dropped", s.cut_dropped);
  w.UintField("cut_torn", s.cut_torn);
  w.EndObject();
  w.Key("io");  // by origin, as the device saw it; origins that did nothing are left out
  w.BeginObject();
  for (int o = 0; o < kIoOriginCount; o++) {
    uint64_t any = 0;
    for (int op = 0; op < kIoOpCount; op++) any += s.by_origin[o][op].ops;
    if (any == 0) continue;
    w.Key(IoOriginName(IoOrigin(o)));
    w.BeginObject();
    for (int op = 0; op < kIoOpCount; op++) {
      if (s.by_origin[o][op].ops == 0) continue;
      w.Key(IoOpName(IoOp(op)));
      w.BeginObject();
      w.UintField("ops", s.by_origin[o][op].ops);
      w.UintField("bytes", s.by_origin[o][op].bytes);
      w.EndObject();
    }
    w.EndObject();
  }
  w.EndObject();
  w.Key("latency_ms");  // submit to completion
  w.BeginObject();
  w.DoubleField("p50", double(s.total_ns.Quantile(50, 100)) / 1e6);
  w.DoubleField("p99", double(s.total_ns.Quantile(99, 100)) / 1e6);
  w.DoubleField("max", double(s.total_ns.max()) / 1e6);
  w.EndObject();
  w.EndObject();
  return true;
}

std::string MemberControls::FaultCommand(const std::string& line) {
  const size_t sp = line.find(' ');
  const std::string name = line.substr(0, sp);
  const std::string rest = sp == std::string::npos ? "" : line.substr(sp + 1);
  const int i = name.empty() ? -1 : members_->Find(name);
  if (i < 0) return "error: no member has that label or path (members: " + members_->List() + ")";
  faultdev::FaultDevice* f = members_->fault(size_t(i));
  if (f == nullptr) return "error: no fault device under this member (mount with --fault " + name + "=PROFILE)";
  if (rest.empty()) return "error: usage: fault MEMBER stall DURATION | unstall | error read|write|both START+LEN | "
                           "clear | powercut [SEED] | poweron | stats";
  if (rest == "poweron" && members_->PowerOnShared(size_t(i))) return "ok powered on (every member on the shared supply)";
  return faultdev::HandleControl(*f, rest);
}

}  // namespace tfs::tools
