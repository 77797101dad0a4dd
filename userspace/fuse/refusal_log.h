// The mount log's lines for refused sets and removes of tierfs.* options
// (posix::Filesystem::OptionCaller::refused). Any user of an allow_other
// mount can cause them, so they are log input from an untrusted caller:
//  - what the caller chose (the xattr's name and value) is shown with
//    control bytes as '?' and cut at kShownMax bytes, so a name or value
//    holding "\n" cannot forge a line, nor a long one flood it;
//  - at most kBurst lines per kWindowNs; the refusals past that are counted,
//    and the first line logged after the window ends is preceded by one
//    "N refusals suppressed" line.
// Thread-safe (the FUSE loop is multi-threaded): one mutex, held only to
// update the window.
#ifndef TFS_USERSPACE_FUSE_REFUSAL_LOG_H_
#define TFS_USERSPACE_FUSE_REFUSAL_LOG_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tfs::fuse {

class RefusalLog {
 public:
  static constexpr size_t kShownMax = 64;
  static constexpr uint64_t kBurst = 10;
  static constexpr int64_t kWindowNs = 10'000'000'000;

  // now_ns: a monotonic clock in nanoseconds (tests inject one); null: the
  // process's steady clock.
  explicit RefusalLog(int64_t (*now_ns)() = nullptr) : now_ns_(now_ns) {}
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // The lines to log for one refusal (`value` null for a remove): none
  // while suppressed, else its line -- after the "suppressed" line when
  // refusals were dropped since the last one logged.
  std::vector<std::string> Refused(const char* op, uint64_t ino, const char* name, const char* value, size_t size,
                                   const char* why);
  // Caller-chosen bytes as one line's piece: control bytes (and DEL) as '?',
  // at most kShownMax bytes.
  static std::string Shown(const char* bytes, size_t size);

 private:
  int64_t Now() const;

  int64_t (*now_ns_)();
  std::mutex mu_;
  bool started_ = false;       // under mu_: a window has begun
  int64_t window_start_ = 0;   // under mu_
  uint64_t in_window_ = 0;     // under mu_: lines logged in this window
  uint64_t suppressed_ = 0;    // under mu_: refusals dropped since the last line
};

}  // namespace tfs::fuse

#endif  // TFS_USERSPACE_FUSE_REFUSAL_LOG_H_
