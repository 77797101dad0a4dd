// The probe's working set and the operations it times.
//
// A Workspace is a private directory inside the target (DIR/tierprobe.<pid>.<n>/)
// holding: `data`, one file of the working-set size, fully written at setup (a hole
// would be read without touching a device); `small/`, small 4 KiB files for stat and
// open-read-close; `dir/`, a small directory for readdir; `new/`, where create+unlink
// (and createsync's create+fsync of file and directory+unlink) happens. Everything it created is removed by the destructor unless kept.
//
// Run() performs exactly one operation and nothing else, so the caller's clock
// brackets only the filesystem work. Thread-safe: threads share the Workspace (the
// data file is used with pread/pwrite only) and each passes its own OpContext.
#ifndef TFS_WORKLOADS_PROBE_OPS_H_
#define TFS_WORKLOADS_PROBE_OPS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "workloads/probe/spec.h"

namespace tfs::probe {

inline constexpr uint64_t kIoSize = 4096;

// Per-thread state for Run(): random generator, an aligned I/O buffer, a counter
// that makes create+unlink names unique.
class OpContext {
 public:
  OpContext(int thread_index, uint64_t seed);
  ~OpContext();
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;

  std::mt19937_64& rng() { return rng_; }

 private:
  friend class Workspace;
  int thread_index_;
  std::mt19937_64 rng_;
  char* buf_;  // kIoSize bytes, 4 KiB aligned (O_DIRECT-safe)
  uint64_t created_ = 0;
};

class Workspace {
 public:
  // Builds the working set under spec.dir. On failure returns nullptr and a one-line
  // error (missing directory, no space, O_DIRECT unsupported...).
  static std::unique_ptr<Workspace> Create(const ProbeSpec& spec, std::string* error);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Performs one operation. Returns 0, or an errno with `what` naming the call.
  int Run(OpType op, OpContext& ctx, std::string* what);

  void set_keep(bool keep) { keep_ = keep; }
  const std::string& path() const { return root_; }

 private:
  Workspace() = default;
  int WriteBlock(OpContext& ctx, std::string* what);

  std::string root_;
  int data_fd_ = -1;
  int new_dir_fd_ = -1;  // new/, fsynced by createsync
  uint64_t blocks_ = 0;
  int small_files_ = 0;
  bool keep_ = false;
};

}  // namespace tfs::probe

#endif  // TFS_WORKLOADS_PROBE_OPS_H_
