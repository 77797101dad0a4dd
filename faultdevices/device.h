// FaultDevice: a tfs::BlockDevice that runs a Profile's models over a backing
// BlockDevice -- the one model engine behind both the in-process wrapper and the
// nbdkit plugin.
//
// A request goes: host slots ([queue], FIFO beyond max_in_flight) -> fault
// decisions (power off, timeout victim, EIO range) -> data path (straight to the
// backing device with its own IoRequest, or through the volatile write cache) and,
// in parallel, the timing path ([delay] -> [bandwidth] -> [hdd]/[smr]). It
// completes when both paths are done, except that nothing completes while the
// device is stalled. Forced failures (timeout expiry with link reset, power cut)
// complete as soon as the request's backing I/O, if any, has finished: a caller's
// buffer is never written after its callback ran.
//
// All timing goes through one Timer (one timerfd thread). Completions run on the
// timer thread or the backing device's completion thread, never under a device
// lock, and may Submit() again.
//
// Thread safety: Submit(), the control methods and Stats() from any thread. The
// destructor waits for every request to complete (a 30 s timeout victim keeps it
// waiting 30 s); no Submit() may race with it. PowerCut() must not be called from a
// completion callback.
#ifndef TFS_FAULTDEVICES_DEVICE_H_
#define TFS_FAULTDEVICES_DEVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "faultdevices/cache.h"
#include "faultdevices/drive.h"
#include "faultdevices/profile.h"
#include "faultdevices/timer.h"
#include "platform/block_device.h"
#include "userspace/util/json.h"
#include "util/histogram.h"

namespace faultdev {

struct IoCount {
  uint64_t ops = 0;
  uint64_t bytes = 0;
};

struct DeviceStats {
  std::string name;
  std::string profile;
  uint64_t seed = 0;
  double elapsed_s = 0;
  IoCount by_op[tfs::kIoOpCount];
  IoCount by_origin[tfs::kIoOriginCount][tfs::kIoOpCount];
  uint64_t completed = 0;
  uint64_t errors = 0;           // completed with any error
  uint64_t errors_injected = 0;  // EIO from [[errors]]
  uint64_t timeouts_injected = 0;
  uint64_t link_resets = 0;
  uint64_t reset_failures = 0;   // requests failed by a link reset
  uint64_t power_cuts = 0;
  uint64_t powered_off_failures = 0;
  uint64_t in_flight = 0;
  uint64_t max_in_flight = 0;
  uint64_t slot_waits = 0;       // requests that waited for a [queue] slot
  uint64_t stalls = 0;           // stall windows entered by control commands
  uint64_t unstalls = 0;         // Unstall() calls that ended a stall
  uint64_t stalled_ns = 0;
  uint64_t stall_remaining_ns = 0;  // 0: not stalled now
  bool powered = true;
  uint32_t error_ranges_active = 0;
  // Volatile cache.
  uint64_t cache_bytes = 0;
  uint64_t cache_records = 0;
  uint64_t writebacks = 0;
  uint64_t cut_kept = 0, cut_dropped = 0, cut_torn = 0;
  // Drive model.
  bool has_drive = false;
  bool has_smr = false;
  DriveModel::Stats drive;
  uint64_t media_cache_capacity = 0;
  // Latency: queue = submit to service start, service = service start to
  // completion, total = submit to completion (ns).
  tfs::Histogram queue_ns, service_ns, total_ns;

  void Write(tfs::userspace::JsonWriter& w) const;  // one JSON object
  std::string ToJson() const;                       // the same, as a string
};

// A latency histogram (ns) as {"count", "mean", "p50", "p99", "p999", "max"}
// in milliseconds: the devices' and the load generator's latencies.
void WriteLatencyMs(tfs::userspace::JsonWriter& w, const char* key, const tfs::Histogram& h);

class FaultDevice final : public tfs::BlockDevice {
 public:
  // Wraps `backing` (owned). Fails (nullptr, *error set) if the profile does not
  // fit the device (e.g. an error range beyond its end).
  static std::unique_ptr<FaultDevice> Open(const Profile& profile, std::unique_ptr<tfs::BlockDevice> backing,
                                           std::string* error);
  ~FaultDevice() override;

  void Submit(tfs::IoRequest* req) override;
  const tfs::BlockDeviceInfo& Info() const override { return info_; }
  const char* Name() const override { return name_.c_str(); }

  // --- control (from any thread) ---
  // Stall for `duration_ns` starting now (extends a running stall).
  void StallFor(uint64_t duration_ns);
  // Power cut now: in-flight requests fail, unflushed cached writes are kept,
  // dropped or torn per the profile from `seed` (default: the profile seed + the
  // number of earlier cuts), applied to the backing device, and every request fails
  // until PowerOn(). Blocks until the image is written. Returns the outcome.
  CutOutcome PowerCut(std::optional<uint64_t> seed = std::nullopt);
  // Called after every PowerCut() of this device (trigger, command or call), on
  // the thread that made it, with no lock of the device held: members that share
  // one power supply cut each other (tools::Members). Any time; setting it
  // (to nullptr before its owner goes) waits for a call in progress to end.
  void SetCutHook(std::function<void()> hook);
  void PowerOn();
  bool powered() const;
  // Ends every stall in effect now -- commanded, scripted or periodic: what it
  // held completes at once. Windows that start later still stall.
  void Unstall();
  // Disables every [[errors]] range, those added by AddErrors() included.
  void ClearErrors();
  // Adds an error range at run time (active from now; checked against the
  // device size by the caller). It joins profile_.errors: profile() must not
  // be read concurrently with AddErrors().
  void AddErrors(const ErrorRange& range);
  DeviceStats Stats() const;
  uint64_t seed() const { return profile_.seed; }
  const Profile& profile() const { return profile_; }
  // Saves the unflushed cached writes beside an image, for `faultdev powercut`.
  // Returns false with *error set on failure; true (and writes nothing) when the
  // cache is empty or disabled -- the file is then removed.
  bool SaveCacheRecords(const std::string& path, std::string* error);
  // Blocks until no request is in flight and no write-back is running.
  void Drain();
  tfs::BlockDevice& backing() { return *backing_; }

 private:
  struct Op;
  struct Actions;
  struct FlushWait {
    Op* op;
    uint64_t upto;
  };

  FaultDevice(const Profile& profile, std::unique_ptr<tfs::BlockDevice> backing);

  // All of these run with mu_ held and collect work for Run() into `act`.
  void Admit(Op* op, uint64_t now, Actions& act);
  void StartTiming(Op* op, uint64_t t, uint64_t now, Actions& act);
  void ModelDoneAt(Op* op, uint64_t t, uint64_t now, Actions& act);
  void EnterDrive(Op* op, uint64_t t, Actions& act);
  void KickDrive(uint64_t t);
  void TryComplete(Op* op, uint64_t now, Actions& act);
  void AdmitFromSlotQueue(uint64_t now, Actions& act);
  void Force(Op* op, tfs::Status st, uint64_t now, Actions& act);
  void Unref(Op* op);
  void OnTimeoutExpired(Op* op, uint64_t now, Actions& act);
  void CacheWrite(Op* op, Actions& act);
  // A cache trigger fired (mu_ held): the cut runs on the timer thread.
  void TriggerCut();
  CutOutcome CutOnce(std::optional<uint64_t> seed);
  void MaybeStartWriteback(Actions& act);
  void WritebackDone(Actions& act);
  bool TimeoutVictim(const tfs::IoRequest& req, uint64_t now);
  bool InjectError(const tfs::IoRequest& req);
  uint64_t StallEnd(uint64_t t) const;
  // The end of a stall window [at, end) after Unstall() cuts.
  uint64_t ClipStall(uint64_t at, uint64_t end) const;
  uint64_t StalledNs(uint64_t now) const;
  void PowerOffLocked(uint64_t now, Actions& act);
  // Runs fn(this, op, when, act) at `when` under mu_, holding a reference on op.
  // With `cancellable`, returns the Timer id for Timer::Cancel (else 0).
  using EventFn = void (*)(FaultDevice*, Op*, uint64_t, Actions&);
  uint64_t ScheduleOp(uint64_t when, Op* op, EventFn fn, bool cancellable = false);

  // Runs collected work with mu_ released.
  void Run(Actions& act);
  static void OnBackingDone(tfs::IoRequest* below, tfs::Status st);
  static void OnWritebackIoDone(tfs::IoRequest* below, tfs::Status st);

  Profile profile_;
  std::unique_ptr<tfs::BlockDevice> backing_;
  tfs::BlockDeviceInfo info_;
  std::string name_;
  uint64_t open_ns_;

  // mu_ guards everything below, the drive model, the cache and the stats. It is
  // never held while a caller's callback runs or while a request is submitted to
  // the backing device.
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;  // live_ops_ == 0 and no write-back; cut done
  std::mt19937_64 rng_;
  uint64_t live_ops_ = 0;            // Op objects in use
  static constexpr size_t kMaxFreeOps = 1024;
  std::vector<Op*> free_ops_;        // recycled Op objects
  uint64_t in_flight_ = 0;           // admitted, caller not yet called back
  Op* inflight_head_ = nullptr;      // admitted and not completed (for resets, power cut)
  std::deque<Op*> slot_queue_;       // waiting for a [queue] slot
  bool admitting_ = false;           // AdmitFromSlotQueue() is draining slot_queue_
  uint64_t admitted_ = 0;
  uint32_t victims_left_ = 0;
  std::vector<bool> error_active_;
  uint64_t bw_free_ = 0;             // [bandwidth]: when the link is next free
  std::unique_ptr<DriveModel> drive_;
  uint64_t idle_timer_at_ = 0;
  std::vector<StallWindow> manual_stalls_;  // absolute times
  std::vector<uint64_t> unstalls_;          // Unstall() times, ascending: they cut windows short
  uint64_t stall_kick_at_ = 0;              // a KickDrive() is due at the stall's end
  bool stopping_ = false;                   // the destructor runs: schedule nothing more
  bool powered_ = true;
  uint64_t cuts_ = 0;
  // Volatile cache.
  std::unique_ptr<WriteCache> cache_;
  std::deque<FlushWait> flush_waiters_;
  std::deque<Op*> parked_writes_;     // waiting for cache space
  uint64_t cache_writes_ = 0;
  uint64_t trigger_writes_ = 0, trigger_flushes_ = 0;  // what the cache's cut triggers count
  std::mutex cut_mu_;                                 // one PowerCut() at a time (cuts may race)
  std::mutex hook_mu_;                                // guards the two below
  std::condition_variable hook_cv_;
  std::function<void()> cut_hook_;
  int hooks_running_ = 0;
  bool wb_active_ = false;
  uint64_t wb_upto_ = 0;
  bool wb_flush_backing_ = false;
  uint64_t wb_outstanding_ = 0;
  tfs::Status wb_status_;
  std::vector<SectorRun> wb_runs_;
  std::vector<tfs::IoRequest> wb_reqs_;
  tfs::IoRequest wb_flush_req_;
  bool cut_requested_ = false;
  DeviceStats stats_;

  // Declared last, destroyed first: pending events refer to everything above.
  std::unique_ptr<Timer> timer_;
};

// faultdev::Open(profile, backing): the device is its own control handle
// (StallFor, PowerCut, PowerOn, ClearErrors, Stats).
inline std::unique_ptr<FaultDevice> Open(const Profile& profile, std::unique_ptr<tfs::BlockDevice> backing,
                                         std::string* error) {
  return FaultDevice::Open(profile, std::move(backing), error);
}

// Opens `image` (a file or block device) with io_uring and wraps it.
std::unique_ptr<FaultDevice> OpenFile(const Profile& profile, const std::string& image, bool direct,
                                      std::string* error);

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_DEVICE_H_
