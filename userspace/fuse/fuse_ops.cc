// libfuse3 low-level operations -> posix::Filesystem (see fuse_ops.h).
#include "userspace/fuse/fuse_ops.h"

#include "platform/platform.h"
#include "userspace/fuse/ctl.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace tfs::fuse {
namespace {

Context* Ctx(fuse_req_t req) { return static_cast<Context*>(fuse_req_userdata(req)); }

constexpr uint64_t kFhDirect = 1;  // fuse_file_info::fh of an O_DIRECT handle

posix::Caller Who(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return posix::Caller{uint32_t(c->uid), uint32_t(c->gid)};
}

void Reply(fuse_req_t req, Status st) { fuse_reply_err(req, st.ok() ? 0 : -st.ToErrno()); }

struct stat ToStat(const posix::Attr& a) {
  struct stat st;
  memset(&st, 0, sizeof(st));
  st.st_ino = a.ino;
  st.st_mode = a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_rdev = a.rdev;
  st.st_size = off_t(a.size);
  st.st_blksize = 4096;
  st.st_blocks = blkcnt_t(a.sectors);
  auto ts = [](int64_t ns) {
    struct timespec t;
    t.tv_sec = ns / 1000000000;
    t.tv_nsec = ns % 1000000000;
    if (t.tv_nsec < 0) {  // floor division for times before the epoch
      t.tv_nsec += 1000000000;
      t.tv_sec -= 1;
    }
    return t;
  };
  st.st_atim = ts(a.atime_ns);
  st.st_mtim = ts(a.mtime_ns);
  st.st_ctim = ts(a.ctime_ns);
  return st;
}

int64_t ToNs(const struct timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

void ReplyEntry(fuse_req_t req, const Result<posix::Attr>& r) {
  if (!r.ok()) return Reply(req, r.status());
  fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  e.ino = r.value().ino;
  e.generation = r.value().generation;
  e.attr = ToStat(r.value());
  e.attr_timeout = Ctx(req)->attr_timeout;
  e.entry_timeout = Ctx(req)->attr_timeout;
  fuse_reply_entry(req, &e);
}

uint32_t Len(const char* name) { return uint32_t(strnlen(name, posix::kNameMax + 1)); }

void Init(void*, fuse_conn_info* conn) {
  conn->time_gran = 1;  // nanosecond timestamps
  if (conn->capable & FUSE_CAP_IOCTL_DIR) conn->want |= FUSE_CAP_IOCTL_DIR;  // tierfs ctl on the root
  // Big writes: up to 1 MiB a request (libfuse asks the kernel for the pages),
  // so a large write(2) is one request and one transaction, not eight.
  conn->max_write = 1u << 20;
  // No invalidation at an mtime change (see MarkDirect): every write comes
  // through this mount, so a new mtime never means another writer's data.
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
  // The kernel removes a buffered write's privileges itself (Write): a
  // SETATTR of the mode needs the filesystem not to claim the job
  // (HANDLE_KILLPRIV), and the write to go through the kernel's write path
  // (no writeback cache, which libfuse leaves off too).
  conn->want &= ~(FUSE_CAP_HANDLE_KILLPRIV | FUSE_CAP_WRITEBACK_CACHE);
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  ReplyEntry(req, Ctx(req)->fs->Lookup(parent, name, Len(name)));
}

// The kernel drops the inode, and its page cache with it.
void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t) {
  {
    std::lock_guard<std::mutex> l(Ctx(req)->stale_mu);
    Ctx(req)->stale.erase(uint64_t(ino));
  }
  fuse_reply_none(req);
}

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  auto r = Ctx(req)->fs->GetAttr(ino);
  if (!r.ok()) return Reply(req, r.status());
  struct stat st = ToStat(r.value());
  fuse_reply_attr(req, &st, Ctx(req)->attr_timeout);
}

void SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  posix::SetAttr s;
  if (to_set & FUSE_SET_ATTR_MODE) {
    s.valid |= posix::kSetMode;
    s.mode = attr->st_mode;
  }
  if (to_set & FUSE_SET_ATTR_UID) {
    s.valid |= posix::kSetUid;
    s.uid = attr->st_uid;
  }
  if (to_set & FUSE_SET_ATTR_GID) {
    s.valid |= posix::kSetGid;
    s.gid = attr->st_gid;
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    s.valid |= posix::kSetSize;
    s.size = uint64_t(attr->st_size);
  }
  if (to_set & FUSE_SET_ATTR_ATIME) {
    s.valid |= posix::kSetAtime;
    s.atime_ns = ToNs(attr->st_atim);
  }
  if (to_set & FUSE_SET_ATTR_MTIME) {
    s.valid |= posix::kSetMtime;
    s.mtime_ns = ToNs(attr->st_mtim);
  }
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) s.valid |= posix::kSetAtimeNow;
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) s.valid |= posix::kSetMtimeNow;
  if (attr->st_size < 0 && (to_set & FUSE_SET_ATTR_SIZE)) return (void)fuse_reply_err(req, EINVAL);
  auto r = Ctx(req)->fs->SetAttrs(ino, s);
  if (!r.ok()) return Reply(req, r.status());
  struct stat st = ToStat(r.value());
  fuse_reply_attr(req, &st, Ctx(req)->attr_timeout);
}

void ReadLink(fuse_req_t req, fuse_ino_t ino) {
  char buf[posix::kSymlinkMax + 1];
  auto r = Ctx(req)->fs->ReadLink(ino, buf, posix::kSymlinkMax);
  if (!r.ok()) return Reply(req, r.status());
  buf[r.value()] = '\0';
  fuse_reply_readlink(req, buf);
}

void Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  ReplyEntry(req, Ctx(req)->fs->Mknod(parent, name, Len(name), mode, rdev, Who(req)));
}

void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  ReplyEntry(req, Ctx(req)->fs->Mkdir(parent, name, Len(name), mode, Who(req)));
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Reply(req, Ctx(req)->fs->Unlink(parent, name, Len(name)));
}

void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Reply(req, Ctx(req)->fs->Rmdir(parent, name, Len(name)));
}

void Symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  const size_t n = strnlen(link, posix::kSymlinkMax + 1);
  ReplyEntry(req, Ctx(req)->fs->Symlink(parent, name, Len(name), link, uint32_t(n), Who(req)));
}

void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
            unsigned int flags) {
  Reply(req, Ctx(req)->fs->Rename(parent, name, Len(name), newparent, newname, Len(newname), flags));
}

void Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  ReplyEntry(req, Ctx(req)->fs->Link(ino, newparent, newname, Len(newname)));
}

// An O_DIRECT open: the kernel bypasses its page cache (direct_io), and its
// writes bypass the write buffer. Opens keep the page cache (keep_cache), and
// INIT clears auto_inval_data: the kernel's write-through leaves a written
// page uptodate and unlocked while its FUSE_WRITE is in flight, and an
// invalidation then (at an open, or at a read that sees the new mtime) drops
// it; a read refills it from before the write and keeps that stale page after
// the write returned. Every change to a file's data comes through this mount,
// and the kernel drops what truncation and fallocate change itself. Three
// cases can still leave the cache holding what tierfs does not, and mark the
// file stale so that its next open drops the cache (keep_cache off):
// - an O_DIRECT write: the kernel drops the range before sending it, and a
//   buffered read in between can bring the old data back;
// - a buffered write-out that failed at close or release: the pages hold data
//   tierfs never stored;
// - an O_TRUNC open that truncated and then failed.
// A buffered descriptor held open across an O_DIRECT write of the same range
// by another can keep such a page until it is reopened (or reclaimed).
void MarkStale(Context* c, fuse_ino_t ino) {
  std::lock_guard<std::mutex> l(c->stale_mu);
  c->stale.insert(uint64_t(ino));
}

void MarkDirect(Context* c, fuse_ino_t ino, fuse_file_info* fi) {
  fi->fh = 0;
  {
    std::lock_guard<std::mutex> l(c->stale_mu);
    fi->keep_cache = c->stale.erase(uint64_t(ino)) == 0 ? 1 : 0;
  }
  if ((fi->flags & O_DIRECT) != 0) {
    fi->fh |= kFhDirect;
    fi->direct_io = 1;
  }
}

// Whether the process of a request has a capability: CAP_FSETID for posix's
// question on an O_DIRECT write or an O_TRUNC open of a file with setid bits
// (posix::Filesystem::Writer; ctx: the request's pid), CAP_FOWNER for a
// change of a file's tierfs.* options by another than its owner
// (posix::Filesystem::OptionCaller). The kernel takes the
// privileges itself on neither (its direct_io write path does not call
// file_remove_privs; an open's truncation sends no mode), and would send its
// own capable() answer (FUSE_WRITE_KILL_SUIDGID) only with handle_killpriv_v2,
// which tierfs does not negotiate. A translation of the request's
// credentials, not a filesystem decision: fuse_ctx carries uid, gid and pid
// but no capabilities, so they come from /proc/<pid>/status: CapEff, bit 4. pid is the writing thread's id, and
// capabilities are per thread. The kernel's capable() asks the initial user
// namespace: a capability counts here only if the writer is in it (root in a
// container's user namespace has no CAP_FSETID for the kernel either, and
// its buffered writes lose the bits). Races: the writer may
// have exited and its pid been reused, or changed its capabilities, between
// the write and this read -- the answer is then another process's or a
// later one's. A pid of 0 (a writer in a pid namespace the daemon cannot
// see) or any failure to read (a non-root daemon may not read another
// user's namespace link) answers no: the bits go, the safe side. The kernel
// module will ask capable() itself.
bool HasCapability(pid_t pid, int cap) {
  if (pid <= 0) return false;
  char path[64];
  char theirs[128];
  snprintf(path, sizeof(path), "/proc/%d/ns/user", int(pid));
  const ssize_t a = readlink(path, theirs, sizeof(theirs));
  // The initial user namespace's link (PROC_USER_INIT_INO, 0xEFFFFFFD).
  static constexpr char kInitialUserNs[] = "user:[4026531837]";
  if (a != ssize_t(sizeof(kInitialUserNs) - 1) || memcmp(theirs, kInitialUserNs, size_t(a)) != 0) return false;
  snprintf(path, sizeof(path), "/proc/%d/status", int(pid));
  FILE* f = fopen(path, "re");
  if (f == nullptr) return false;
  char line[256];
  unsigned long long eff = 0;
  bool found = false;
  while (!found && fgets(line, sizeof(line), f) != nullptr) found = sscanf(line, "CapEff: %llx", &eff) == 1;
  fclose(f);
  return found && ((eff >> cap) & 1) != 0;
}

constexpr int kCapFowner = 3;  // linux/capability.h
constexpr int kCapFsetid = 4;

bool WriterHasFsetid(void* ctx) { return HasCapability(*static_cast<const pid_t*>(ctx), kCapFsetid); }

// A request's writer, for posix's privilege removal (Writer: asks
// WriterHasFsetid of the request's pid).
class RequestWriter {
 public:
  explicit RequestWriter(fuse_req_t req) : pid_(fuse_req_ctx(req)->pid) {
    writer_.may_keep_setid = WriterHasFsetid;
    writer_.ctx = &pid_;
  }
  RequestWriter(const RequestWriter&) = delete;
  RequestWriter& operator=(const RequestWriter&) = delete;
  posix::Filesystem::Writer* get() { return &writer_; }
  // The kernel's cached mode still has the bits posix took (for
  // attr_timeout): drop its attributes before the request is answered.
  void InvalidateIfDropped(Context* c, fuse_ino_t ino) const {
    if (writer_.dropped && c->se != nullptr) (void)fuse_lowlevel_notify_inval_inode(c->se, ino, -1, 0);
  }

 private:
  pid_t pid_;
  posix::Filesystem::Writer writer_;
};

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Context* c = Ctx(req);
  // With atomic O_TRUNC (libfuse's default) the kernel sends the truncation
  // inside the open, not as a separate SETATTR.
  // Nor does it take the setid bits away first (fuse_do_setattr skips the
  // mode for an open's truncation): posix does, as for a direct write.
  const bool trunc = (fi->flags & O_TRUNC) != 0;
  RequestWriter writer(req);
  Status st = c->fs->Open(ino, trunc ? uint32_t(posix::kOpenTruncate) : 0u, writer.get());
  writer.InvalidateIfDropped(c, ino);
  if (!st.ok()) {
    // The kernel truncates its cache only if the open succeeds, and posix may
    // have freed part of the data: the next open drops the cache (needlessly
    // when the open failed before truncating -- a cost, not a wrong read).
    if (trunc) MarkStale(c, ino);
    return Reply(req, st);
  }
  MarkDirect(c, ino, fi);
  if (fuse_reply_open(req, fi) != 0) {  // the open was interrupted: the kernel never truncates its cache
    if (trunc) MarkStale(c, ino);
    (void)c->fs->Release(ino);
  }
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Context* c = Ctx(req);
  auto r = c->fs->CreateOpen(parent, name, Len(name), uint32_t(mode), Who(req));
  if (!r.ok()) return Reply(req, r.status());
  fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  e.ino = r.value().ino;
  e.generation = r.value().generation;
  e.attr = ToStat(r.value());
  e.attr_timeout = c->attr_timeout;
  e.entry_timeout = c->attr_timeout;
  MarkDirect(c, e.ino, fi);
  if (fuse_reply_create(req, &e, fi) != 0) (void)c->fs->Release(e.ino);  // the open was interrupted
}

void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Status st = Ctx(req)->fs->Release(ino);
  if (!st.ok()) MarkStale(Ctx(req), ino);  // a write-out failed: the pages hold what tierfs lost
  Reply(req, st);
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (off < 0) return (void)fuse_reply_err(req, EINVAL);
  std::vector<char> buf(std::min<size_t>(size, 16u << 20));
  auto r = Ctx(req)->fs->Read(ino, uint64_t(off), buf.data(), uint32_t(buf.size()));
  if (!r.ok()) return Reply(req, r.status());
  fuse_reply_buf(req, buf.data(), r.value());
}

void Write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off, fuse_file_info* fi) {
  if (off < 0 || size > UINT32_MAX) return (void)fuse_reply_err(req, EINVAL);
  Context* c = Ctx(req);
  // Writes of an O_DIRECT handle (fh bit, set at open; the kernel's
  // direct_io path) skip the write buffer. The kernel removed a buffered
  // write's privileges before sending it (file_remove_privs: a SETATTR of
  // the mode, per its own CAP_FSETID check, and a REMOVEXATTR of
  // security.capability), but not a direct_io write's: posix does those,
  // asking WriterHasFsetid only for a file with setid bits.
  const bool direct = (fi->fh & kFhDirect) != 0;
  RequestWriter writer(req);
  const uint32_t flags = direct ? uint32_t(posix::Filesystem::kWriteDirect)
                                : uint32_t(posix::Filesystem::kWritePrivsRemoved);
  auto r = c->fs->Write(ino, uint64_t(off), data, uint32_t(size), flags, writer.get());
  if (direct) MarkStale(c, ino);
  writer.InvalidateIfDropped(c, ino);
  if (!r.ok()) return Reply(req, r.status());
  fuse_reply_write(req, r.value());
}

// SEEK_DATA / SEEK_HOLE (the kernel answers SEEK_SET/CUR/END itself; a
// negative offset is posix's to answer).
void Lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*) {
  if (whence != SEEK_DATA && whence != SEEK_HOLE) return (void)fuse_reply_err(req, EINVAL);
  auto r = Ctx(req)->fs->Seek(ino, int64_t(off), whence == SEEK_DATA);
  if (!r.ok()) return Reply(req, r.status());
  fuse_reply_lseek(req, off_t(r.value()));
}

void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info*) {
  if (off < 0 || len <= 0) return (void)fuse_reply_err(req, EINVAL);
  Reply(req, Ctx(req)->fs->Fallocate(ino, uint32_t(mode), uint64_t(off), uint64_t(len)));
}

// close(2) of a handle: buffered writes go out, and their error is close's.
void Flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Status st = Ctx(req)->fs->FlushBuffer(ino);
  if (!st.ok()) MarkStale(Ctx(req), ino);
  Reply(req, st);
}

// The file's buffered writes, then the journal's durable commit: every
// operation so far survives a crash.
void Fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) { Reply(req, Ctx(req)->fs->Fsync(ino)); }

void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Context* c = Ctx(req);  // (a reply frees req, sent or not)
  Status st = c->fs->OpenDir(ino);
  if (!st.ok()) return Reply(req, st);
  fi->fh = 0;
  if (fuse_reply_open(req, fi) != 0) (void)c->fs->ReleaseDir(ino);  // the opendir was interrupted
}

void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  struct Fill {
    fuse_req_t req;
    std::vector<char> buf;
    size_t used = 0;
  } f{req, std::vector<char>(size), 0};
  Status st = Ctx(req)->fs->ReadDir(
      ino, uint64_t(off),
      [](void* p, const char* name, uint32_t len, uint64_t ino, uint8_t type, uint64_t next) {
        auto* x = static_cast<Fill*>(p);
        char z[posix::kNameMax + 1];
        memcpy(z, name, len);
        z[len] = '\0';
        struct stat st;
        memset(&st, 0, sizeof(st));
        st.st_ino = ino;
        st.st_mode = mode_t(type) << 12;  // DT_* to S_IF*
        const size_t need = fuse_add_direntry(x->req, x->buf.data() + x->used, x->buf.size() - x->used, z, &st,
                                              off_t(next));
        if (need > x->buf.size() - x->used) return false;
        x->used += need;
        return true;
      },
      &f);
  if (!st.ok() && f.used == 0) return Reply(req, st);
  fuse_reply_buf(req, f.buf.data(), f.used);
}

// readdir with each entry's attributes (what `ls -l` wants): one request per
// page of entries instead of one lookup per entry (posix's ReadDirPlus), the
// page ending where the reply buffer does.
void ReadDirPlus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  struct Fill {
    fuse_req_t req;
    Context* c;
    std::vector<char> buf;
    size_t used = 0;
  } f{req, Ctx(req), std::vector<char>(size), 0};
  // No more entries than the buffer holds at the smallest entry size.
  const size_t least = fuse_add_direntry_plus(req, nullptr, 0, "", nullptr, 0);
  const uint32_t max_entries = uint32_t(std::min<size_t>(size / least + 1, 1u << 16));
  Status st = f.c->fs->ReadDirPlus(
      ino, uint64_t(off), max_entries,
      [](void* p, const char* name, uint32_t len, const posix::Attr* a, uint64_t ino, uint8_t type,
         uint64_t next) {
        auto* x = static_cast<Fill*>(p);
        char z[posix::kNameMax + 1];
        memcpy(z, name, len);
        z[len] = '\0';
        fuse_entry_param e;
        memset(&e, 0, sizeof(e));
        if (a == nullptr) {  // "." and "..": attributes only, no lookup count
          e.attr.st_ino = ino;
          e.attr.st_mode = mode_t(type) << 12;  // DT_* to S_IF*
        } else {
          e.ino = ino;
          e.generation = a->generation;
          e.attr = ToStat(*a);
          e.attr_timeout = x->c->attr_timeout;
          e.entry_timeout = x->c->attr_timeout;
        }
        const size_t need = fuse_add_direntry_plus(x->req, x->buf.data() + x->used, x->buf.size() - x->used, z,
                                                   &e, off_t(next));
        if (need > x->buf.size() - x->used) return false;
        x->used += need;
        return true;
      },
      &f);
  if (!st.ok()) return Reply(req, st);
  fuse_reply_buf(req, f.buf.data(), f.used);
}

void ReleaseDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) { Reply(req, Ctx(req)->fs->ReleaseDir(ino)); }

void FsyncDir(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) { Reply(req, Ctx(req)->fs->FsyncDir(ino)); }

void StatFs(fuse_req_t req, fuse_ino_t) {
  posix::StatFs s;
  Status st = Ctx(req)->fs->GetStatFs(&s);
  if (!st.ok()) return Reply(req, st);
  struct statvfs v;
  memset(&v, 0, sizeof(v));
  v.f_bsize = s.block_size;
  v.f_frsize = s.block_size;
  v.f_blocks = s.blocks;
  v.f_bfree = s.blocks_free;
  v.f_bavail = s.blocks_avail;
  v.f_files = s.files;
  v.f_ffree = s.files_free;
  v.f_favail = s.files_free;
  v.f_namemax = s.name_max;
  fuse_reply_statfs(req, &v);
}

// The caller of a set or remove of a tierfs.* option, for posix's owner
// check (chattr's rule: the kernel asks only for write access to names
// outside its namespaces); a refusal's reason goes to the log, one line.
class RequestOptionCaller {
 public:
  explicit RequestOptionCaller(fuse_req_t req) : pid_(fuse_req_ctx(req)->pid) {
    who_.uid = uint32_t(fuse_req_ctx(req)->uid);
    who_.has_fowner = [](void* ctx) { return HasCapability(*static_cast<const pid_t*>(ctx), kCapFowner); };
    who_.ctx = &pid_;
  }
  RequestOptionCaller(const RequestOptionCaller&) = delete;
  RequestOptionCaller& operator=(const RequestOptionCaller&) = delete;
  posix::Filesystem::OptionCaller* get() { return &who_; }
  // One line for the log if posix refused with a reason (RefusalLog: the
  // name and value sanitized, at most 10 lines per 10 s).
  void LogRefusal(fuse_req_t req, const char* op, fuse_ino_t ino, const char* name, const char* value,
                  size_t size) const {
    if (who_.refused == nullptr) return;
    for (const std::string& line : Ctx(req)->refusals.Refused(op, ino, name, value, size, who_.refused))
      platform::Log(platform::LogLevel::kInfo, "%s", line.c_str());
  }

 private:
  pid_t pid_;
  posix::Filesystem::OptionCaller who_;
};

void SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  if (size > UINT32_MAX) return (void)fuse_reply_err(req, ENOSPC);
  RequestOptionCaller who(req);
  Status st = Ctx(req)->fs->SetXattr(ino, name, uint32_t(strlen(name)), value, uint32_t(size), uint32_t(flags),
                                     who.get());
  who.LogRefusal(req, "setxattr", ino, name, value, size);
  Reply(req, st);
}

void GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  // A size query (size 0) needs no buffer; otherwise the caller's size, at
  // most the largest value, not zeroed (posix fills what it returns).
  const size_t cap = std::min<size_t>(size, posix::kXattrSizeMax);
  std::unique_ptr<char[]> buf = cap == 0 ? nullptr : std::make_unique_for_overwrite<char[]>(cap);
  auto r = Ctx(req)->fs->GetXattr(ino, name, uint32_t(strlen(name)), buf.get(), uint32_t(cap));
  if (!r.ok()) return Reply(req, r.status());
  if (size == 0) return (void)fuse_reply_xattr(req, r.value());
  fuse_reply_buf(req, buf.get(), r.value());
}

void ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  std::vector<char> buf(std::min<size_t>(size, 1u << 20));
  // trusted.* names only for root (the kernel's stand-in for CAP_SYS_ADMIN here).
  auto r = Ctx(req)->fs->ListXattr(ino, buf.data(), uint32_t(buf.size()), fuse_req_ctx(req)->uid == 0);
  if (!r.ok()) return Reply(req, r.status());
  if (size == 0) return (void)fuse_reply_xattr(req, r.value());
  fuse_reply_buf(req, buf.data(), r.value());
}

void RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  RequestOptionCaller who(req);
  Status st = Ctx(req)->fs->RemoveXattr(ino, name, uint32_t(strlen(name)), who.get());
  who.LogRefusal(req, "removexattr", ino, name, nullptr, 0);
  Reply(req, st);
}

// A ctl command's one-line reply (kCtlFault, kCtlCommand), NUL included.
void ReplyLine(fuse_req_t req, std::string reply, size_t out_bufsz) {
  if (reply.size() + 1 > out_bufsz) reply = "error: the reply does not fit the ioctl's buffer";
  fuse_reply_ioctl(req, 0, reply.c_str(), reply.size() + 1);
}

// tierfs ctl (ctl.h): only on the root directory.
void Ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*, unsigned flags,
           const void* in_buf, size_t in_bufsz, size_t out_bufsz) {
  if ((flags & FUSE_IOCTL_COMPAT) != 0) return (void)fuse_reply_err(req, ENOTTY);
  // chattr/lsattr: the kernel's fileattr calls send these with an int.
  if (cmd == FS_IOC_GETFLAGS) {
    if (out_bufsz < sizeof(int)) return (void)fuse_reply_err(req, EINVAL);
    auto r = Ctx(req)->fs->GetFlags(ino);
    if (!r.ok()) return Reply(req, r.status());
    const int v = int(r.value());
    return (void)fuse_reply_ioctl(req, 0, &v, sizeof(v));
  }
  if (cmd == FS_IOC_SETFLAGS) {
    if (in_bufsz < sizeof(int)) return (void)fuse_reply_err(req, EINVAL);
    int v;
    memcpy(&v, in_buf, sizeof(v));
    Status st = Ctx(req)->fs->SetFlags(ino, uint32_t(v));
    if (!st.ok()) return Reply(req, st);
    return (void)fuse_reply_ioctl(req, 0, nullptr, 0);
  }
  // The kernel reads (and on a set, first reads) the xfs-style attributes
  // too; tierfs has none of them: all zero, and only zero can be set.
  if (cmd == FS_IOC_FSGETXATTR) {
    if (out_bufsz < sizeof(fsxattr)) return (void)fuse_reply_err(req, EINVAL);
    posix::Fsxattr a;
    Status st = Ctx(req)->fs->GetFsxattr(ino, &a);
    if (!st.ok()) return Reply(req, st);
    fsxattr x;
    memset(&x, 0, sizeof(x));
    x.fsx_xflags = a.xflags;
    x.fsx_extsize = a.extsize;
    x.fsx_nextents = a.nextents;
    x.fsx_projid = a.projid;
    x.fsx_cowextsize = a.cowextsize;
    return (void)fuse_reply_ioctl(req, 0, &x, sizeof(x));
  }
  if (cmd == FS_IOC_FSSETXATTR) {
    if (in_bufsz < sizeof(fsxattr)) return (void)fuse_reply_err(req, EINVAL);
    fsxattr x;
    memcpy(&x, in_buf, sizeof(x));
    posix::Fsxattr a;
    a.xflags = x.fsx_xflags;
    a.extsize = x.fsx_extsize;
    a.nextents = x.fsx_nextents;
    a.projid = x.fsx_projid;
    a.cowextsize = x.fsx_cowextsize;
    Status st = Ctx(req)->fs->SetFsxattr(ino, a);
    if (!st.ok()) return Reply(req, st);
    return (void)fuse_reply_ioctl(req, 0, nullptr, 0);
  }
  if ((cmd != kCtlStats && cmd != kCtlFault && cmd != kCtlCommand) || ino != FUSE_ROOT_ID)
    return (void)fuse_reply_err(req, ENOTTY);
  Context* c = Ctx(req);
  if (cmd == kCtlCommand) {
    const char* in = static_cast<const char*>(in_buf);
    return ReplyLine(req, CtlCommand(*c->instance, std::string(in, strnlen(in, in_bufsz))), out_bufsz);
  }
  if (cmd == kCtlFault) {
    if (c->members == nullptr) return (void)fuse_reply_err(req, ENOTTY);
    const char* in = static_cast<const char*>(in_buf);
    const std::string line(in, strnlen(in, in_bufsz));
    return ReplyLine(req, c->members->FaultCommand(line), out_bufsz);
  }
  std::string json;
  const Status st = CtlStats(*c->instance, c->members, &json);
  if (!st.ok()) return Reply(req, st);
  if (json.size() + 1 > out_bufsz) return (void)fuse_reply_err(req, ENOSPC);
  fuse_reply_ioctl(req, int(json.size()), json.c_str(), json.size() + 1);
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops o;
  memset(&o, 0, sizeof(o));
  o.init = Init;
  o.lookup = Lookup;
  o.forget = Forget;
  o.getattr = GetAttr;
  o.setattr = SetAttr;
  o.readlink = ReadLink;
  o.mknod = Mknod;
  o.mkdir = Mkdir;
  o.unlink = Unlink;
  o.rmdir = Rmdir;
  o.symlink = Symlink;
  o.rename = Rename;
  o.link = Link;
  o.open = Open;
  o.read = Read;
  o.write = Write;
  o.fallocate = Fallocate;
  o.flush = Flush;
  o.release = Release;
  o.fsync = Fsync;
  o.lseek = Lseek;
  o.opendir = OpenDir;
  o.readdir = ReadDir;
  o.readdirplus = ReadDirPlus;
  o.releasedir = ReleaseDir;
  o.fsyncdir = FsyncDir;
  o.statfs = StatFs;
  o.create = Create;
  o.setxattr = SetXattr;
  o.getxattr = GetXattr;
  o.listxattr = ListXattr;
  o.removexattr = RemoveXattr;
  o.ioctl = Ioctl;
  return o;
}

}  // namespace

const fuse_lowlevel_ops* Operations() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return &ops;
}

}  // namespace tfs::fuse
