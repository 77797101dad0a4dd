// The working set and the timed operations (see ops.h). Setup writes every byte of
// the data file with incompressible data and syncs it, so a measured read is never a
// read of a hole and a measured fsync does not pay for the setup's dirty pages.
#include "workloads/probe/ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace tfs::probe {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Writes all of `len` bytes; returns 0 or errno.
int WriteAll(int fd, const char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = ::write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    buf += n;
    len -= size_t(n);
  }
  return 0;
}

void FillRandom(std::mt19937_64& rng, char* buf, size_t len) {
  for (size_t i = 0; i + 8 <= len; i += 8) {
    uint64_t v = rng();
    std::memcpy(buf + i, &v, 8);
  }
}

// Creates `path` with `len` bytes of `content`; returns 0 or errno.
int MakeFile(const std::string& path, const char* content, size_t len) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int err = WriteAll(fd, content, len);
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}

std::atomic<int> workspace_counter{0};

}  // namespace

OpContext::OpContext(int thread_index, uint64_t seed)
    : thread_index_(thread_index),
      rng_(seed * 0xD1B54A32D192ED03ull + uint64_t(thread_index) * 7919 + 17),
      buf_(static_cast<char*>(std::aligned_alloc(kIoSize, kIoSize))) {
  if (buf_ == nullptr) std::abort();
  FillRandom(rng_, buf_, kIoSize);
}

OpContext::~OpContext() { std::free(buf_); }

std::unique_ptr<Workspace> Workspace::Create(const ProbeSpec& spec, std::string* error) {
  struct stat st;
  if (::stat(spec.dir.c_str(), &st) != 0) {
    *error = "--dir " + spec.dir + ": " + ErrnoText(errno);
    return nullptr;
  }
  if (!S_ISDIR(st.st_mode)) {
    *error = "--dir " + spec.dir + ": not a directory";
    return nullptr;
  }
  std::unique_ptr<Workspace> ws(new Workspace());
  ws->root_ = spec.dir + "/tierprobe." + std::to_string(::getpid()) + "." +
              std::to_string(workspace_counter++);
  if (::mkdir(ws->root_.c_str(), 0755) != 0) {
    *error = "cannot create " + ws->root_ + ": " + ErrnoText(errno);
    ws->root_.clear();  // nothing of ours to remove
    return nullptr;
  }
  auto fail = [&](const std::string& what, int err) {
    if (err == ENOSPC) {
      *error = "no space left on device in " + spec.dir + " while " + what;
    } else {
      *error = what + ": " + ErrnoText(err);
    }
    return nullptr;
  };
  for (const char* sub : {"small", "dir", "new"}) {
    if (::mkdir((ws->root_ + "/" + sub).c_str(), 0755) != 0) {
      return fail(std::string("creating ") + ws->root_ + "/" + sub, errno);
    }
  }

  // The data file: every byte written, then synced.
  std::mt19937_64 rng(spec.seed);
  const size_t chunk = 1 << 20;
  std::vector<char> buf(chunk);
  ws->blocks_ = spec.working_set / kIoSize;
  uint64_t size = ws->blocks_ * kIoSize;
  std::string data = ws->root_ + "/data";
  int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("creating " + data, errno);
  for (uint64_t off = 0; off < size; off += chunk) {
    size_t n = size_t(std::min<uint64_t>(chunk, size - off));
    FillRandom(rng, buf.data(), n);
    int err = WriteAll(fd, buf.data(), n);
    if (err != 0) {
      ::close(fd);
      return fail("writing the " + std::to_string(size >> 20) + " MiB working set " + data, err);
    }
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return fail("syncing " + data, err);
  }
  ::close(fd);

  ws->small_files_ = spec.small_files;
  FillRandom(rng, buf.data(), kIoSize);
  for (int i = 0; i < spec.small_files; i++) {
    char name[32];
    std::snprintf(name, sizeof(name), "/small/f%06d", i);
    int err = MakeFile(ws->root_ + name, buf.data(), kIoSize);
    if (err != 0) return fail(std::string("creating small file ") + ws->root_ + name, err);
  }
  for (int i = 0; i < spec.dir_entries; i++) {
    char name[32];
    std::snprintf(name, sizeof(name), "/dir/e%06d", i);
    int err = MakeFile(ws->root_ + name, buf.data(), 0);
    if (err != 0) return fail(std::string("creating ") + ws->root_ + name, err);
  }

  ws->new_dir_fd_ = ::open((ws->root_ + "/new").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (ws->new_dir_fd_ < 0) return fail("opening " + ws->root_ + "/new", errno);

  int flags = O_RDWR | O_CLOEXEC | (spec.direct ? O_DIRECT : 0);
  ws->data_fd_ = ::open(data.c_str(), flags);
  if (ws->data_fd_ < 0) {
    if (spec.direct && errno == EINVAL) {
      *error = "--direct: the filesystem at " + spec.dir + " does not support O_DIRECT";
      return nullptr;
    }
    return fail("opening " + data, errno);
  }
  return ws;
}

Workspace::~Workspace() {
  if (data_fd_ >= 0) ::close(data_fd_);
  if (new_dir_fd_ >= 0) ::close(new_dir_fd_);
  if (!keep_ && !root_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
}

int Workspace::WriteBlock(OpContext& ctx, std::string* what) {
  uint64_t off = (ctx.rng_() % blocks_) * kIoSize;
  // Change the payload a little each time so no layer can dedupe or skip it.
  uint64_t stamp = ctx.rng_();
  std::memcpy(ctx.buf_, &stamp, sizeof(stamp));
  ssize_t n = ::pwrite(data_fd_, ctx.buf_, kIoSize, off_t(off));
  if (n < 0) {
    *what = "pwrite";
    return errno;
  }
  if (uint64_t(n) != kIoSize) {
    *what = "pwrite (short)";
    return EIO;
  }
  return 0;
}

int Workspace::Run(OpType op, OpContext& ctx, std::string* what) {
  switch (op) {
    case OpType::kRead: {
      uint64_t off = (ctx.rng_() % blocks_) * kIoSize;
      ssize_t n = ::pread(data_fd_, ctx.buf_, kIoSize, off_t(off));
      if (n < 0) {
        *what = "pread";
        return errno;
      }
      return 0;
    }
    case OpType::kWrite:
      return WriteBlock(ctx, what);
    case OpType::kFsync:
    case OpType::kFdatasync: {
      int err = WriteBlock(ctx, what);
      if (err != 0) return err;
      int rc = op == OpType::kFsync ? ::fsync(data_fd_) : ::fdatasync(data_fd_);
      if (rc != 0) {
        *what = op == OpType::kFsync ? "fsync" : "fdatasync";
        return errno;
      }
      return 0;
    }
    case OpType::kStat: {
      char name[32];
      std::snprintf(name, sizeof(name), "/small/f%06d", int(ctx.rng_() % uint64_t(small_files_)));
      struct stat st;
      if (::stat((root_ + name).c_str(), &st) != 0) {
        *what = "stat";
        return errno;
      }
      return 0;
    }
    case OpType::kReaddir: {
      DIR* d = ::opendir((root_ + "/dir").c_str());
      if (d == nullptr) {
        *what = "opendir";
        return errno;
      }
      errno = 0;
      while (::readdir(d) != nullptr) {
      }
      int err = errno;
      ::closedir(d);
      if (err != 0) *what = "readdir";
      return err;
    }
    case OpType::kOpenRead: {
      char name[32];
      std::snprintf(name, sizeof(name), "/small/f%06d", int(ctx.rng_() % uint64_t(small_files_)));
      int fd = ::open((root_ + name).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        *what = "open";
        return errno;
      }
      ssize_t n = ::read(fd, ctx.buf_, kIoSize);
      int err = n < 0 ? errno : 0;
      ::close(fd);
      if (err != 0) *what = "read";
      return err;
    }
    case OpType::kCreate:
    case OpType::kCreateSync: {
      std::string path = root_ + "/new/t" + std::to_string(ctx.thread_index_) + "." +
                         std::to_string(ctx.created_++);
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) {
        *what = "create";
        return errno;
      }
      if (op == OpType::kCreateSync) {
        // The durable create of a lock file or a mail drop: the file, then the
        // entry naming it.
        if (::fsync(fd) != 0) {
          int err = errno;
          ::close(fd);
          *what = "fsync (new file)";
          return err;
        }
        if (::fsync(new_dir_fd_) != 0) {
          int err = errno;
          ::close(fd);
          *what = "fsync (its directory)";
          return err;
        }
      }
      ::close(fd);
      if (::unlink(path.c_str()) != 0) {
        *what = "unlink";
        return errno;
      }
      return 0;
    }
  }
  *what = "unknown op";
  return EINVAL;
}

}  // namespace tfs::probe
