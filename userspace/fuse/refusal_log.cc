// RefusalLog (refusal_log.h): sanitized, rate-limited refusal lines.
#include "userspace/fuse/refusal_log.h"

#include <chrono>
#include <cstring>

namespace tfs::fuse {

std::string RefusalLog::Shown(const char* bytes, size_t size) {
  if (bytes == nullptr) return "";
  std::string s(bytes, size < kShownMax ? size : kShownMax);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

int64_t RefusalLog::Now() const {
  if (now_ns_ != nullptr) return now_ns_();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<std::string> RefusalLog::Refused(const char* op, uint64_t ino, const char* name, const char* value,
                                             size_t size, const char* why) {
  std::vector<std::string> lines;
  const int64_t now = Now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!started_ || now - window_start_ >= kWindowNs) {
      started_ = true;
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ == kBurst) {
      suppressed_++;
      return lines;
    }
    in_window_++;
    if (suppressed_ > 0) {
      lines.push_back(std::to_string(suppressed_) + " refusal(s) of tierfs.* option changes suppressed (at most " +
                      std::to_string(kBurst) + " lines per " + std::to_string(kWindowNs / 1'000'000'000) + " s)");
      suppressed_ = 0;
    }
  }
  std::string line = std::string(op) + " " + Shown(name, name != nullptr ? strlen(name) : 0);
  if (value != nullptr) line += "=\"" + Shown(value, size) + "\"";
  line += " on inode " + std::to_string(ino) + " refused: " + (why != nullptr ? why : "?");
  lines.push_back(std::move(line));
  return lines;
}

}  // namespace tfs::fuse
