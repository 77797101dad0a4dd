// A member's background budget (budget.h).
#include "bg/budget.h"

namespace tfs::bg {

void Budget::Init(const BudgetConfig& config, void (*wake)(void*), void* ctx) {
  SpinGuard l(mu_);
  config_ = config;
  if (config_.max_ios == 0) config_.max_ios = 1;
  wake_ = wake;
  wake_ctx_ = ctx;
  limit_ = config_.max_ios;
  window_ = 0;
  since_cut_ = 1;
}

Budget::Verdict Budget::Admit(u64 bytes, const dev::ReadState& rs) {
  SpinGuard l(mu_);
  if (dev::Stalling(rs)) {
    if (limit_ != 0) ctr_.lowered++;
    limit_ = 0;
    window_ = 0;
    ctr_.refused_stalling++;
    refused_ = true;
    return Verdict::kStalling;
  }
  if (limit_ == 0) {  // (back from a stall: start over at one)
    limit_ = 1;
    window_ = 0;
    ctr_.raised++;
  }
  const bool slow = rs.oldest_ns > dev::LateBoundNs(rs) / 2;
  if (slow) {
    if (since_cut_ > 0 && limit_ > 1) {
      limit_ /= 2;
      window_ = 0;
      since_cut_ = 0;
      ctr_.lowered++;
    }
  } else if (window_ >= limit_ && limit_ < config_.max_ios) {
    limit_++;
    window_ = 0;
    ctr_.raised++;
  }
  if (ios_ >= limit_ || (ios_ > 0 && bytes_ + bytes > config_.max_bytes)) {
    ctr_.refused_busy++;
    refused_ = true;
    return Verdict::kBusy;
  }
  ios_++;
  bytes_ += bytes;
  ctr_.admitted++;
  return Verdict::kAdmitted;
}

void Budget::Release(u64 bytes) { GiveBack(bytes, /*completed=*/true); }

void Budget::Cancel(u64 bytes) { GiveBack(bytes, /*completed=*/false); }

void Budget::GiveBack(u64 bytes, bool completed) {
  bool wake;
  {
    SpinGuard l(mu_);
    TFS_BUG_ON(ios_ == 0 || bytes_ < bytes);
    ios_--;
    bytes_ -= bytes;
    if (completed && window_ < ~u32(0)) window_++;
    if (completed && since_cut_ < ~u32(0)) since_cut_++;
    wake = refused_;
    refused_ = false;
  }
  if (wake && wake_ != nullptr) wake_(wake_ctx_);  // (after the lock: the callback may take its own)
}

BudgetStats Budget::GetStats() const {
  SpinGuard l(mu_);
  BudgetStats s = ctr_;
  s.ios = ios_;
  s.bytes = bytes_;
  s.limit = limit_;
  return s;
}

}  // namespace tfs::bg
