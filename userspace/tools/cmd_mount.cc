// tierfs mount DEV... MOUNTPOINT [-o OPTIONS] [-f]: serves the filesystem through
// FUSE. Without -f it returns once the mount is live (or with the reason it is
// not), leaving a daemon that serves it; -f serves in the foreground. The
// devices are locked (flock) for the mount's life, so a second mount of them
// fails instead of corrupting them; the mount's source is the whole member list
// (A:B, as mount.fuse.tierfs takes it), and a set already mounted is refused
// with "already mounted on X". Unmounting (umount, fusermount3 -u) or
// SIGTERM / SIGINT ends the daemon, which then writes everything and marks the
// filesystem clean.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mount/instance.h"
#include "userspace/fuse/fuse_ops.h"
#include "userspace/platform/log.h"
#include "userspace/platform/pressure.h"
#include "userspace/tools/common.h"
#include "userspace/tools/members.h"
#include "userspace/tools/mount_table.h"

namespace tfs::tools {
namespace {

// Removes from the comma-separated option lists every option `take`
// accepts (it is given each one); the rest go to libfuse.
template <typename Take>
void TakeOptions(std::vector<std::string>* options, Take take) {
  std::vector<std::string> kept;
  for (const std::string& list : *options) {
    std::string rest;
    size_t at = 0;
    while (at <= list.size()) {
      size_t comma = list.find(',', at);
      if (comma == std::string::npos) comma = list.size();
      const std::string o = list.substr(at, comma - at);
      if (!o.empty() && !take(o)) rest += (rest.empty() ? "" : ",") + o;
      at = comma + 1;
    }
    if (!rest.empty()) kept.push_back(rest);
  }
  *options = kept;
}

// Removes tierfs's own `key=value`; returns the value ("" if absent).
std::string TakeOption(std::vector<std::string>* options, const std::string& key) {
  std::string value;
  TakeOptions(options, [&](const std::string& o) {
    if (o.compare(0, key.size() + 1, key + "=") != 0) return false;
    value = o.substr(key.size() + 1);
    return true;
  });
  return value;
}

// Removes the flag `key` (no value); whether it was there.
bool TakeFlag(std::vector<std::string>* options, const std::string& key) {
  bool found = false;
  TakeOptions(options, [&](const std::string& o) {
    if (o != key) return false;
    found = true;
    return true;
  });
  return found;
}

// The daemon is a filesystem's I/O path: memory it allocates under pressure
// must not wait for reclaim to write someone else's pages to swap or to
// another filesystem (the VM lab's mem-pressure profile found its btree writer
// in direct reclaim behind a stalled swap device, and every probe lane behind
// it; docs/lab/vmlab.md). PR_SET_IO_FLUSHER (Linux 5.6, CAP_SYS_RESOURCE)
// makes its allocations PF_MEMALLOC_NOIO; set before any thread starts, so
// every thread inherits it. Returns 0 or the errno: without it the mount
// still serves, with a warning once it is live (in the daemon's log: a mount
// that fails says one line, its reason).
int BecomeIoFlusher() {
#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif
  return prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0 ? 0 : errno;
}

// Everything after the (optional) fork: open, mount, tell the parent, serve.
// `ready_fd` (-1 in the foreground) gets "ok" once the mount is live. `log`:
// where the daemon's messages go ("" : nowhere).
int Serve(const std::vector<std::string>& devices, const std::vector<FaultSpec>& faults,
          const std::string& mountpoint, const std::vector<std::string>& options, const std::string& log,
          bool degraded, int ready_fd) {
  MemberLocks locks;  // refuses a mounted set, waits for a daemon that is finishing
  if (!locks.Take("mount", devices, MemberLocks::Mode::kExclusive)) return 1;
  const std::string source = MountSource(devices);  // before the daemon leaves the working directory
  int log_fd = -1;
  if (!log.empty()) {
    log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (log_fd < 0) {
      PrintError("mount", "log=" + log + ": " + strerror(errno));
      return 1;
    }
    // What the open logs (replay, journal damage) and why a mount fails
    // (PrintError) go to the log too.
    userspace::SetLogCopy(log_fd);
  }
  const int io_flusher_err = BecomeIoFlusher();  // (before the members' threads)
  Members members;
  if (!members.Open("mount", devices, /*read_only=*/false, faults)) return 1;
  MemberControls controls(&members);
  std::vector<BlockDevice*> raw = members.Raw();
  // The store, then posix (mount/instance.h); on the heap: it is large.
  auto inst = std::make_unique<mount::Instance>();
  mount::Options mo;
  // -o degraded: members left out are opened as placeholders when every
  // copy has another (docs/usage.md, "Degraded mounts"). -o ro opens the
  // store read-only too (and stays for libfuse: the kernel's mount is
  // read-only as well).
  mo.store.degraded = degraded;
  {
    std::vector<std::string> probe = options;
    mo.store.read_only = TakeFlag(&probe, "ro");
  }
  mo.posix.root_owner = posix::Caller{uint32_t(getuid()), uint32_t(getgid())};
  store::OpenReport rep;
  Diag diag;
  Status st = inst->Open(raw.data(), uint32_t(raw.size()), mo, &diag, &rep);
  if (!st.ok()) {
    PrintError("mount", diag.empty() ? st.Message() : diag.text);
    return 1;
  }
  fuse::Context ctx;
  ctx.instance = inst.get();
  ctx.fs = &inst->fs();
  ctx.members = &controls;
  std::vector<std::string> argv_s = {"tierfs", "-o", "default_permissions,subtype=tierfs,fsname=" + FsnameOption(source)};
  for (const std::string& o : options) {
    argv_s.push_back("-o");
    argv_s.push_back(o);
  }
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(int(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&args, fuse::Operations(), sizeof(fuse_lowlevel_ops), &ctx);
  ctx.se = se;  // (before any request: the session loop starts below)
  int rc = 1;
  if (se == nullptr) {
    PrintError("mount", "bad mount options (see the line above)");
  } else if (fuse_set_signal_handlers(se) != 0) {
    PrintError("mount", "cannot install signal handlers");
  } else if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    PrintError("mount", mountpoint + ": the FUSE mount failed (see the line above)");
    fuse_remove_signal_handlers(se);
  } else {
    if (ready_fd >= 0) {
      (void)!write(ready_fd, "ok", 2);
      close(ready_fd);
      ready_fd = -1;
      // A daemon: no terminal. Messages from here on (checksum mismatches,
      // write-out errors, unmount) go to the log=FILE option's file, or nowhere.
      int null = open("/dev/null", O_RDWR);
      if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(log_fd >= 0 ? log_fd : null, 2);
        userspace::SetLogCopy(-1);  // stderr is the log now
        if (null > 2) close(null);
      }
      (void)!chdir("/");
    }
    platform::Log(platform::LogLevel::kInfo, "%s mounted on %s", source.c_str(), mountpoint.c_str());
    if (io_flusher_err != 0)
      platform::Log(platform::LogLevel::kWarn,
                    "mount: prctl(PR_SET_IO_FLUSHER): %s: under memory pressure the daemon's allocations may wait "
                    "for swap or filesystem writes",
                    strerror(io_flusher_err));
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    // Reads and O_DIRECT writes are synchronous in a worker: the threads are
    // the I/O depth the kernel's requests get (fio's randrw keeps 128 queued).
    fuse_loop_cfg_set_max_threads(cfg, 64);
    rc = fuse_session_loop_mt(se, cfg) == 0 ? 0 : 1;
    fuse_loop_cfg_destroy(cfg);
    // The lab's stalls end with the mount: the write-out below is a real
    // unmount's, and ctl (the only way to unstall) is gone with the session.
    if (int n = members.UnstallAll(); n > 0)
      platform::Log(platform::LogLevel::kInfo, "unmount: ended the stall of %d fault device(s)", n);
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
  }
  if (se != nullptr) fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  // The members stay locked until Serve returns: an opener waits for that
  // (mount_table.h), so the log says where the time after the unmount went.
  mount::CloseTimes times;
  st = inst->Close(&times);
  if (!st.ok()) {
    PrintError("mount", std::string("unmount: ") + st.Message());
    rc = 1;
  } else {
    platform::Log(platform::LogLevel::kInfo, "%s unmounted, clean (write-out %llu ms, store close %llu ms)",
                  mountpoint.c_str(), (unsigned long long)(times.posix_ns / 1000000),
                  (unsigned long long)(times.store_ns / 1000000));
  }
  userspace::SetLogCopy(-1);
  if (log_fd >= 0) close(log_fd);
  return rc;
}

}  // namespace

int CmdMount(int argc, char** argv) {
  CLI::App app("Mount a tierfs filesystem through FUSE.", "tierfs mount");
  std::vector<std::string> args;
  std::vector<std::string> options;
  bool foreground = false;
  app.add_option("args", args, "every member device, then the mount point")->required()->expected(2, -1);
  app.add_option("-o", options,
                 "mount options, comma-separated (e.g. allow_other; log=FILE: the daemon's messages; "
                 "memory_limit=SIZE, memory_psi=PCT: when the caches give memory back; degraded: mount "
                 "without members missing from the devices given when every copy has another; ro)");
  app.add_flag("-f,--foreground", foreground, "serve in the foreground (no daemon)");
  FaultArgs fault_args;
  AddFaultOptions(&app, &fault_args);
  app.footer("Unmount with 'umount MOUNTPOINT' or 'fusermount3 -u MOUNTPOINT'.");
  if (int rc = ParseCommandLine(app, "mount", argc, argv); rc >= 0) return rc;
  // Profiles are checked before the fork, so a mistake is one line from the
  // command itself; the fault devices (threads) start in the daemon.
  std::vector<FaultSpec> faults;
  if (!ParseFaults("mount", fault_args, &faults)) return 2;
  std::string mountpoint = args.back();
  args.pop_back();
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    PrintError("mount", mountpoint + ": not a directory");
    return 1;
  }
  // Absolute: the daemon leaves the working directory, and unmounts by this path.
  char* abs = realpath(mountpoint.c_str(), nullptr);
  if (abs == nullptr) {
    PrintError("mount", mountpoint + ": " + strerror(errno));
    return 1;
  }
  mountpoint = abs;
  free(abs);
  // The caches' memory-pressure hooks (userspace/platform/pressure.h):
  // memory_limit=SIZE gives memory back above that resident size,
  // memory_psi=PCT at that much PSI "some avg10" (default 10; 0: off).
  userspace::PressureOptions pressure;
  if (const std::string v = TakeOption(&options, "memory_limit"); !v.empty()) {
    const auto bytes = ParseSize(v);
    if (!bytes || *bytes == 0) {
      PrintError("mount", "memory_limit=" + v + ": not a size (e.g. 512M)");
      return 2;
    }
    pressure.rss_limit = *bytes;
  }
  if (const std::string v = TakeOption(&options, "memory_psi"); !v.empty()) {
    char* end = nullptr;
    const unsigned long pct = strtoul(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || pct > 100) {
      PrintError("mount", "memory_psi=" + v + ": not a percentage (0-100)");
      return 2;
    }
    pressure.psi_some_pct = uint32_t(pct);
  }
  userspace::SetPressureOptions(pressure);
  std::string log = TakeOption(&options, "log");
  if (!log.empty() && log[0] != '/') {  // the daemon leaves the working directory
    char* cwd = getcwd(nullptr, 0);
    if (cwd != nullptr) log = std::string(cwd) + "/" + log;
    free(cwd);
  }
  const bool degraded = TakeFlag(&options, "degraded");
  if (foreground) return Serve(args, faults, mountpoint, options, log, degraded, -1);
  // Fork before anything starts a thread; the parent waits for "ok" (or for the
  // child to give up, having printed why).
  int pipefd[2];
  if (pipe(pipefd) != 0) {
    PrintError("mount", std::string("pipe: ") + strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    PrintError("mount", std::string("fork: ") + strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(pipefd[0]);
    setsid();
    _exit(Serve(args, faults, mountpoint, options, log, degraded, pipefd[1]));
  }
  close(pipefd[1]);
  char buf[2] = {};
  ssize_t n;
  do {
    n = read(pipefd[0], buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  close(pipefd[0]);
  if (n == 2 && memcmp(buf, "ok", 2) == 0) return 0;
  int status = 0;
  waitpid(pid, &status, 0);
  return 1;  // the child printed the reason
}

// mount.fuse.tierfs SPEC MOUNTPOINT [-o OPTIONS] [-n] [-s] [-f] [-v]: what
// mount(8) runs for `mount -t fuse.tierfs` and fstab entries. SPEC names the
// devices separated by ':'. Options only mount(8) and fstab use (defaults,
// auto, noauto, user, nouser, users, nofail, _netdev, x-*, comment=*) are
// dropped; the rest go to `tierfs mount`. -f (fake) does nothing; -n, -s, -v are
// accepted and ignored.
int CmdMountHelper(int argc, char** argv) {
  std::vector<std::string> positional;
  std::vector<std::string> kept;
  bool fake = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "-o") {
      if (i + 1 >= argc) {
        PrintError("mount", "-o needs options");
        return 1;
      }
      std::string list = argv[++i];
      size_t at = 0;
      while (at <= list.size()) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        const std::string o = list.substr(at, comma - at);
        at = comma + 1;
        static const char* const kDrop[] = {"", "defaults", "auto", "noauto", "user", "nouser", "users", "nofail",
                                            "_netdev"};
        bool drop = o.rfind("x-", 0) == 0 || o.rfind("comment=", 0) == 0;
        for (const char* d : kDrop) drop |= o == d;
        if (!drop) kept.push_back(o);
      }
    } else if (a == "-f") {
      fake = true;
    } else if (a == "-n" || a == "-s" || a == "-v") {
      // mount(8)'s: no mtab, sloppy, verbose
    } else if (!a.empty() && a[0] == '-') {
      PrintError("mount", "unknown option '" + a + "'");
      return 1;
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) {
    PrintError("mount", "usage: mount.fuse.tierfs DEV[:DEV...] MOUNTPOINT [-o OPTIONS]");
    return 1;
  }
  if (fake) return 0;
  std::vector<std::string> args = {"mount"};
  const std::string& spec = positional[0];
  size_t at = 0;
  while (at <= spec.size()) {
    size_t colon = spec.find(':', at);
    if (colon == std::string::npos) colon = spec.size();
    if (colon > at) args.push_back(spec.substr(at, colon - at));
    at = colon + 1;
  }
  args.push_back(positional[1]);
  if (!kept.empty()) {
    std::string joined;
    for (const std::string& o : kept) joined += (joined.empty() ? "" : ",") + o;
    args.push_back("-o");
    args.push_back(joined);
  }
  std::vector<char*> av;
  for (std::string& x : args) av.push_back(x.data());
  av.push_back(nullptr);
  return CmdMount(int(args.size()), av.data());
}

}  // namespace tfs::tools
