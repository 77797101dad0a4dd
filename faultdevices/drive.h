// DriveModel: a mechanical hard drive (and optionally a drive-managed SMR drive),
// in virtual time. Pure model: no threads, no clock, no I/O -- the caller passes
// times in and gets times out, so unit tests run hours of drive time in
// milliseconds and the fault device drives the same code with a real timer.
//
// The head does one job at a time. Host requests enter an NCQ queue of ncq_depth
// slots (more wait outside in FIFO order); the drive picks the job with the
// shortest seek (with aging: a request waiting longer than max_queue_wait goes
// first). Service = command overhead + seek (a curve fitted through
// track-to-track, average and full-stroke times) + rotational latency (uniform over
// one revolution, from the seed) + transfer (zone rate, outer to inner). A request
// that starts where the previous one ended is sequential: no seek, no rotation.
//
// With a write cache, writes are acknowledged at interface speed while the cache
// has room and are destaged by the head later; a flush completes when nothing is
// left to destage. With SMR, a destaged write goes to its band only when it
// appends at the band's write pointer; otherwise it is appended to the media
// cache. Above the high-water mark, or after idle time, the head cleans bands
// (read band + merge + rewrite); a write that finds the media cache full waits for
// cleaning. That produces the observed collapse: fast while the media cache
// absorbs random writes, then throughput bounded by band cleaning.
//
// Not thread-safe: the owner serialises calls.
#ifndef TFS_FAULTDEVICES_DRIVE_H_
#define TFS_FAULTDEVICES_DRIVE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "faultdevices/profile.h"

namespace faultdev {

class DriveModel {
 public:
  enum class Kind { kRead, kWrite, kFlush, kDiscard };
  struct HostIo {
    void* tag = nullptr;
    Kind kind = Kind::kRead;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool fua = false;  // a FUA write bypasses the write cache
  };
  // A host request the drive has finished: service started at `start` (0 for
  // requests that never needed the head) and completed at `end`.
  struct Done {
    void* tag;
    uint64_t start;
    uint64_t end;
  };
  struct Stats {
    uint64_t head_busy_ns = 0;
    uint64_t seeks = 0;
    uint64_t sequential = 0;
    uint64_t destaged = 0;
    uint64_t media_cache_bytes = 0;     // current fill
    uint64_t media_cache_peak = 0;
    uint64_t media_cache_writes = 0;
    uint64_t bands_cleaned = 0;
    uint64_t idle_cleans = 0;
    uint64_t cleaning_ns = 0;
    uint64_t write_cache_bytes = 0;     // current DRAM cache fill
  };

  DriveModel(const HddModel& hdd, const std::optional<SmrModel>& smr, uint64_t capacity, uint64_t seed);

  // A host request arrives at time t. Requests the drive finishes without the head
  // (write-cache hits, a flush with nothing to destage) are appended to `done`.
  void Submit(const HostIo& io, uint64_t t, std::vector<Done>* done);
  // If the head is idle, starts the next job at time >= t and returns its end time.
  std::optional<uint64_t> StartNext(uint64_t t);
  // Ends the running job (at the time StartNext returned); appends finished requests.
  void FinishJob(std::vector<Done>* done);
  // When the head would next start idle cleaning (nullopt: nothing to clean, or busy).
  std::optional<uint64_t> IdleCleanAt() const;
  // Link reset: forgets every queued host request (not the one the head is
  // serving, which still comes back from FinishJob) and returns their tags.
  std::vector<void*> Abort();

  bool busy() const { return job_.has_value(); }
  const Stats& stats() const { return stats_; }
  uint64_t queued() const { return ncq_.size() + outside_.size(); }
  uint64_t media_cache_capacity() const { return smr_ ? smr_->media_cache_bytes : 0; }

  // Model pieces, exposed for tests and docs.
  uint64_t SeekNs(uint64_t distance) const;
  uint64_t TransferNs(uint64_t offset, uint64_t length) const;
  uint64_t RevolutionNs() const { return rev_ns_; }

 private:
  struct Pending {
    HostIo io;
    uint64_t arrival;
    bool destage;  // a cached write the drive owes the media (no host tag waiting)
  };
  enum class JobType { kHost, kDestage, kClean };
  struct Job {
    JobType type;
    Pending p;
    uint64_t start;
    uint64_t end;
    uint64_t band;
  };

  bool SmrToMediaCache(const HostIo& io) const;
  uint64_t PositionNs(uint64_t offset, bool to_media_cache);
  uint64_t DataJobNs(const HostIo& io, bool* to_mc);
  std::optional<uint64_t> PickBand() const;
  void StartClean(uint64_t start, uint64_t band, bool idle);
  void Admit();  // moves requests from outside into free NCQ slots
  void CompleteFlushes(uint64_t t, std::vector<Done>* done);
  bool MediaCacheFull(uint64_t extra) const;

  HddModel hdd_;
  std::optional<SmrModel> smr_;
  uint64_t capacity_;
  std::mt19937_64 rng_;
  uint64_t rev_ns_;
  double seek_a_ = 0, seek_b_ = 0;  // seek = t2t + a*sqrt(f) + b*f

  std::deque<Pending> outside_;   // waiting for an NCQ slot
  std::vector<Pending> ncq_;      // in the drive
  std::deque<Pending> backlog_;   // write-cache destage work
  std::vector<Pending> flushes_;  // waiting for the backlog to drain
  std::optional<Job> job_;
  uint64_t head_free_ = 0;        // virtual time the head finished its last job
  uint64_t head_pos_ = 0;
  bool head_in_mc_ = false;
  uint64_t last_host_ = 0;        // last host arrival or completion (for idle cleaning)

  // SMR state: media-cache bytes per band, band write pointers (absent = band start).
  std::unordered_map<uint64_t, uint64_t> band_mc_;
  std::unordered_map<uint64_t, uint64_t> band_wp_;

  Stats stats_;
};

}  // namespace faultdev

#endif  // TFS_FAULTDEVICES_DRIVE_H_
