// Opening a filesystem's members for a command, with the lab's fault devices in
// between where `--fault MEMBER=PROFILE` asks for them (tierfs format, mount,
// fsck, show). A faulted member's io_uring device is wrapped in a
// faultdev::FaultDevice running the profile in this process, so a mounted
// tierfs can be run over a slow, stalling or failing member without NBD or a
// device mapper (docs/faultdevices.md, "Under tierfs").
//
// MEMBER is a member label (`hdd.b`: from the superblock, or for format from
// its --label) or the device path as given (or any path naming the same file).
// PROFILE is a shipped faultdev profile name or a TOML file; `--fault-set
// MEMBER:KEY=VALUE` overrides a key of that member's profile, as faultdev's
// --set does. Every mistake is one line naming the option.
//
// Thread safety: Members is owned by one command; the devices it hands out are
// BlockDevices (thread-safe) and outlive every user only if the Members object
// does -- destroy the store first.
#ifndef TFS_USERSPACE_TOOLS_MEMBERS_H_
#define TFS_USERSPACE_TOOLS_MEMBERS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "faultdevices/device.h"
#include "faultdevices/profile.h"
#include "platform/block_device.h"
#include "userspace/fuse/ctl.h"
#include "userspace/platform/uring_device.h"

namespace CLI {
class App;
}

namespace tfs::tools {

// The raw option values.
struct FaultArgs {
  std::vector<std::string> faults;  // MEMBER=PROFILE
  std::vector<std::string> sets;    // MEMBER:KEY=VALUE
  bool shared_power = false;        // --fault-shared-power
};

// Adds --fault and --fault-set to a command.
void AddFaultOptions(CLI::App* app, FaultArgs* args);

// One --fault with its overrides, the profile loaded.
struct FaultSpec {
  std::string member;
  faultdev::Profile profile;
  // One power supply for every member so marked: a power cut of one (its
  // cache's trigger, `tierfs ctl MNT fault M powercut`) cuts them all, and
  // `poweron` of one powers them all on -- a machine's power cut, not a disk's.
  bool shared_power = false;
};

// Loads every --fault's profile with its --fault-set overrides. Members are not
// matched yet (that needs the devices). False after printing one line.
bool ParseFaults(const std::string& cmd, const FaultArgs& args, std::vector<FaultSpec>* out);

class Members {
 public:
  // Opens every path (read-only if asked) and wraps the members the specs name.
  // `labels`: for format, the label each device index will get; empty to read
  // each member's label from its superblock. False after printing one line.
  Members() = default;
  Members(const Members&) = delete;
  Members& operator=(const Members&) = delete;
  // Unhooks the shared power supply before anything goes (a cut in progress
  // ends first), then closes the devices.
  ~Members();

  bool Open(const std::string& cmd, const std::vector<std::string>& paths, bool read_only,
            const std::vector<FaultSpec>& specs, const std::map<size_t, std::string>& labels = {});

  size_t size() const { return devs_.size(); }
  BlockDevice* dev(size_t i) const { return devs_[i].get(); }
  std::vector<BlockDevice*> Raw() const;
  // Null for a member without --fault.
  faultdev::FaultDevice* fault(size_t i) const { return faults_[i]; }
  // The io_uring device at the bottom of member `i` (under its fault device, if any).
  userspace::UringDevice* uring(size_t i) const { return urings_[i]; }
  const std::string& path(size_t i) const { return paths_[i]; }
  const std::string& label(size_t i) const { return labels_[i]; }
  // The member `name` names (label or path), or -1.
  int Find(const std::string& name) const;
  // The member whose device (dev(i)) is `d`, or -1.
  int IndexOf(const BlockDevice* d) const;
  // "ssd.a (/tmp/a.img), hdd.b (/tmp/b.img)", for messages.
  std::string List() const;
  // Ends every fault device's stalls (the daemon's unmount: a stall must not
  // keep the final write-out, and the members' locks, waiting). Returns how
  // many were stalled.
  int UnstallAll() const;
  // `poweron` of a member on the shared supply: every such member (true), or
  // false when `i` is not on it.
  bool PowerOnShared(size_t i);

 private:
  // A cut of shared member `i`: cuts the others once (their own hooks find the
  // cut under way). Members must not move once Open() has set the hooks.
  void CutShared(size_t i);

  std::vector<std::unique_ptr<BlockDevice>> devs_;
  std::vector<faultdev::FaultDevice*> faults_;
  std::vector<userspace::UringDevice*> urings_;
  std::vector<std::string> paths_, labels_;
  std::vector<bool> shared_;       // on the shared power supply
  std::mutex shared_mu_;           // one shared cut (or power-on) at a time
  bool shared_cut_ = false;        // the shared supply is off
};

// The mount's members and fault devices as tierfs ctl sees them (kCtlStats,
// kCtlFault).
class MemberControls final : public fuse::MemberControl {
 public:
  explicit MemberControls(Members* members) : members_(members) {}
  std::string Path(const BlockDevice* dev) override;
  bool WriteFault(const BlockDevice* dev, userspace::JsonWriter& w) override;
  bool WriteUring(const BlockDevice* dev, userspace::JsonWriter& w) override;
  std::string FaultCommand(const std::string& line) override;

 private:
  Members* members_;
};

}  // namespace tfs::tools

#endif  // TFS_USERSPACE_TOOLS_MEMBERS_H_
