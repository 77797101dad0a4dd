// The mechanical drive model (see drive.h). Real-drive figures behind the defaults
// and the profiles are in docs/faultdevices.md.
//
// Seek curve: seek(f) = t2t + a*sqrt(f) + b*f for a stroke fraction f in (0, 1].
// For random requests the stroke fraction has density 2(1-f), so E[sqrt f] = 8/15
// and E[f] = 1/3; requiring seek(1) = full stroke and E[seek] = average seek fixes
// a and b. If the given figures would make the curve fall, it degrades to a plain
// square-root curve through t2t and full stroke.
//
// SMR bookkeeping is per band: the bytes of the band that live in the media cache
// and the band's write pointer. Cleaning picks the band with the most media-cache
// bytes (the most space freed per band rewrite); a cleaned band is rewritten whole,
// so its write pointer moves to the band end.
#include "faultdevices/drive.h"

#include <algorithm>
#include <cmath>

namespace faultdev {

DriveModel::DriveModel(const HddModel& hdd, const std::optional<SmrModel>& smr, uint64_t capacity,
                       uint64_t seed)
    : hdd_(hdd), smr_(smr), capacity_(std::max<uint64_t>(capacity, 1)), rng_(seed) {
  rev_ns_ = uint64_t(60e9 / hdd_.rpm);
  if (smr_ && smr_->media_cache_percent > 0) {
    smr_->media_cache_bytes = uint64_t(double(capacity_) * smr_->media_cache_percent / 100);
  }
  double t2t = double(hdd_.track_to_track_ns);
  double avg = double(hdd_.average_seek_ns);
  double full = double(hdd_.full_stroke_seek_ns);
  seek_a_ = (avg - t2t - (full - t2t) / 3) * 5;
  seek_b_ = (full - t2t) - seek_a_;
  if (seek_a_ < 0 || seek_a_ / 2 + seek_b_ < 0) {
    seek_a_ = full - t2t;
    seek_b_ = 0;
  }
}

uint64_t DriveModel::SeekNs(uint64_t distance) const {
  if (distance == 0) return 0;
  double f = std::min(1.0, double(distance) / double(capacity_));
  return uint64_t(double(hdd_.track_to_track_ns) + seek_a_ * std::sqrt(f) + seek_b_ * f);
}

uint64_t DriveModel::TransferNs(uint64_t offset, uint64_t length) const {
  double f = std::min(1.0, double(offset) / double(capacity_));
  double mb_s = hdd_.outer_mb_s - (hdd_.outer_mb_s - hdd_.inner_mb_s) * f;
  return uint64_t(double(length) * 1e3 / mb_s);  // bytes / (MB/s) = us ... *1e3 -> ns
}

void DriveModel::Submit(const HostIo& io, uint64_t t, std::vector<Done>* done) {
  last_host_ = std::max(last_host_, t);
  switch (io.kind) {
    case Kind::kFlush:
      if (backlog_.empty() && !(job_ && job_->type == JobType::kDestage)) {
        done->push_back({io.tag, 0, t + hdd_.command_overhead_ns});
      } else {
        flushes_.push_back({io, t, false});
      }
      return;
    case Kind::kDiscard:
      done->push_back({io.tag, 0, t + hdd_.command_overhead_ns});
      return;
    case Kind::kWrite:
      if (!io.fua && hdd_.write_cache_bytes != 0 && stats_.write_cache_bytes + io.length <= hdd_.write_cache_bytes) {
        uint64_t link = uint64_t(double(io.length) * 1e3 / hdd_.interface_mb_s);
        done->push_back({io.tag, 0, t + hdd_.command_overhead_ns + link});
        HostIo owed = io;
        owed.tag = nullptr;
        backlog_.push_back({owed, t, true});
        stats_.write_cache_bytes += io.length;
        return;
      }
      break;
    case Kind::kRead:
      break;
  }
  outside_.push_back({io, t, false});
  Admit();
}

void DriveModel::Admit() {
  while (ncq_.size() < hdd_.ncq_depth && !outside_.empty()) {
    ncq_.push_back(outside_.front());
    outside_.pop_front();
  }
}

bool DriveModel::SmrToMediaCache(const HostIo& io) const {
  uint64_t band = io.offset / smr_->band_bytes;
  if (band_mc_.count(band) != 0) return true;
  auto it = band_wp_.find(band);
  uint64_t wp = it != band_wp_.end() ? it->second : band * smr_->band_bytes;
  return io.offset != wp;
}

bool DriveModel::MediaCacheFull(uint64_t extra) const {
  return smr_ && stats_.media_cache_bytes + extra > smr_->media_cache_bytes;
}

uint64_t DriveModel::PositionNs(uint64_t offset, bool to_media_cache) {
  uint64_t distance;
  if (to_media_cache) {
    if (head_in_mc_) return 0;  // appending to the media cache: streaming
    distance = head_pos_;       // the media cache sits at the outer edge (offset 0)
  } else if (!head_in_mc_ && offset == head_pos_) {
    stats_.sequential++;
    return 0;
  } else {
    uint64_t from = head_in_mc_ ? 0 : head_pos_;
    distance = offset > from ? offset - from : from - offset;
  }
  stats_.seeks++;
  return SeekNs(distance) + rng_() % rev_ns_;
}

uint64_t DriveModel::DataJobNs(const HostIo& io, bool* to_mc) {
  *to_mc = io.kind == Kind::kWrite && smr_ && SmrToMediaCache(io);
  uint64_t ns = hdd_.command_overhead_ns + PositionNs(io.offset, *to_mc);
  if (*to_mc) {
    ns += TransferNs(0, io.length);
    head_in_mc_ = true;
    uint64_t band = io.offset / smr_->band_bytes;
    band_mc_[band] += io.length;
    stats_.media_cache_bytes += io.length;
    stats_.media_cache_peak = std::max(stats_.media_cache_peak, stats_.media_cache_bytes);
    stats_.media_cache_writes++;
  } else {
    ns += TransferNs(io.offset, io.length);
    head_in_mc_ = false;
    head_pos_ = io.offset + io.length;
    if (io.kind == Kind::kWrite && smr_) band_wp_[io.offset / smr_->band_bytes] = io.offset + io.length;
  }
  return ns;
}

std::optional<uint64_t> DriveModel::PickBand() const {
  std::optional<uint64_t> best;
  uint64_t best_bytes = 0;
  for (const auto& [band, bytes] : band_mc_) {
    if (bytes > best_bytes || (bytes == best_bytes && best && band < *best)) {
      best = band;
      best_bytes = bytes;
    }
  }
  return best;
}

void DriveModel::StartClean(uint64_t start, uint64_t band, bool idle) {
  uint64_t band_start = band * smr_->band_bytes;
  uint64_t from = head_in_mc_ ? 0 : head_pos_;
  uint64_t distance = band_start > from ? band_start - from : from - band_start;
  // Read the band, read its media-cache pieces, rewrite the band.
  uint64_t ns = smr_->clean_overhead_ns + SeekNs(distance) + 2 * TransferNs(band_start, smr_->band_bytes) +
                TransferNs(0, band_mc_[band]);
  Job job{JobType::kClean, Pending{}, start, start + ns, band};
  job.p.destage = idle;  // reused as "idle clean" marker
  job_ = job;
  stats_.head_busy_ns += ns;
  stats_.cleaning_ns += ns;
}

std::optional<uint64_t> DriveModel::StartNext(uint64_t t) {
  if (job_) return std::nullopt;
  uint64_t start = std::max(t, head_free_);
  if (smr_ && double(stats_.media_cache_bytes) >= smr_->high_water * double(smr_->media_cache_bytes)) {
    if (std::optional<uint64_t> band = PickBand()) {
      StartClean(start, *band, false);
      return job_->end;
    }
  }
  // Candidates: the NCQ queue and the oldest destage work.
  constexpr size_t kBacklogWindow = 64;
  size_t n_backlog = std::min(backlog_.size(), kBacklogWindow);
  size_t n = ncq_.size() + n_backlog;
  if (n == 0) {
    std::optional<uint64_t> idle_at = IdleCleanAt();
    if (idle_at && start >= *idle_at) {
      StartClean(start, *PickBand(), true);
      return job_->end;
    }
    return std::nullopt;
  }
  auto at = [&](size_t i) -> Pending& { return i < ncq_.size() ? ncq_[i] : backlog_[i - ncq_.size()]; };
  size_t pick = 0;
  uint64_t oldest = UINT64_MAX, best = UINT64_MAX;
  size_t oldest_i = 0;
  uint64_t from = head_in_mc_ ? 0 : head_pos_;
  for (size_t i = 0; i < n; i++) {
    const Pending& p = at(i);
    if (p.arrival < oldest) {
      oldest = p.arrival;
      oldest_i = i;
    }
    uint64_t d = p.io.offset > from ? p.io.offset - from : from - p.io.offset;
    if (p.io.kind == Kind::kWrite && smr_ && SmrToMediaCache(p.io)) d = head_in_mc_ ? 0 : from;
    if (d < best) {
      best = d;
      pick = i;
    }
  }
  if (start > oldest && start - oldest > hdd_.max_queue_wait_ns) pick = oldest_i;
  Pending chosen = at(pick);
  if (chosen.io.kind == Kind::kWrite && smr_ && SmrToMediaCache(chosen.io) && MediaCacheFull(chosen.io.length)) {
    if (std::optional<uint64_t> band = PickBand()) {
      StartClean(start, *band, false);
      return job_->end;
    }
  }
  if (pick < ncq_.size()) {
    ncq_.erase(ncq_.begin() + ptrdiff_t(pick));
  } else {
    backlog_.erase(backlog_.begin() + ptrdiff_t(pick - ncq_.size()));
  }
  bool to_mc = false;
  uint64_t ns = DataJobNs(chosen.io, &to_mc);
  job_ = Job{chosen.destage ? JobType::kDestage : JobType::kHost, chosen, start, start + ns, 0};
  stats_.head_busy_ns += ns;
  return job_->end;
}

void DriveModel::CompleteFlushes(uint64_t t, std::vector<Done>* done) {
  if (!backlog_.empty()) return;
  for (const Pending& f : flushes_) done->push_back({f.io.tag, t, t + hdd_.command_overhead_ns});
  flushes_.clear();
}

void DriveModel::FinishJob(std::vector<Done>* done) {
  if (!job_) return;
  Job job = *job_;
  job_.reset();
  head_free_ = job.end;
  switch (job.type) {
    case JobType::kHost:
      done->push_back({job.p.io.tag, job.start, job.end});
      last_host_ = std::max(last_host_, job.end);
      Admit();
      break;
    case JobType::kDestage:
      stats_.write_cache_bytes -= job.p.io.length;
      stats_.destaged++;
      CompleteFlushes(job.end, done);
      break;
    case JobType::kClean: {
      auto it = band_mc_.find(job.band);
      if (it != band_mc_.end()) {
        stats_.media_cache_bytes -= it->second;
        band_mc_.erase(it);
      }
      band_wp_[job.band] = (job.band + 1) * smr_->band_bytes;
      head_in_mc_ = false;
      head_pos_ = (job.band + 1) * smr_->band_bytes;
      stats_.bands_cleaned++;
      if (job.p.destage) stats_.idle_cleans++;
      break;
    }
  }
}

std::optional<uint64_t> DriveModel::IdleCleanAt() const {
  if (job_ || !smr_ || stats_.media_cache_bytes == 0 || !ncq_.empty() || !outside_.empty() ||
      !backlog_.empty())
    return std::nullopt;
  return std::max(head_free_, last_host_ + smr_->idle_clean_after_ns);
}

std::vector<void*> DriveModel::Abort() {
  std::vector<void*> tags;
  for (const Pending& p : ncq_) tags.push_back(p.io.tag);
  for (const Pending& p : outside_) tags.push_back(p.io.tag);
  for (const Pending& p : flushes_) tags.push_back(p.io.tag);
  ncq_.clear();
  outside_.clear();
  flushes_.clear();
  return tags;
}

}  // namespace faultdev
