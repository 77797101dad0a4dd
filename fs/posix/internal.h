// What posix's own files share (fs.cc, names.cc, namei.cc, file.cc, wbuf.cc,
// xattr.cc): the slow-member rule's check and the counted table lock, key
// positions and limits, and the definitions of Filesystem's private helper
// types (an inode's locks and their holders, a write buffer).
// Private to fs/posix/: nothing outside it includes this header (fs.h is the
// API; names.h holds the name-table rules fsck shares).
//
// SharedLock is for posix's table mutexes only (locks_mu_, open_mu_): held to
// find, add or drop an entry, never across I/O, a commit or another lock.
// Locked and DataGuard take an operation's inode and data locks in fs.h's
// order (data lock, rename_mu_, inode locks in ascending inode order).
#ifndef TFS_POSIX_INTERNAL_H_
#define TFS_POSIX_INTERNAL_H_

#include "btree/key.h"
#include "data/data.h"
#include "platform/platform.h"
#include "platform/sync.h"
#include "posix/format.h"
#include "posix/fs.h"
#include "posix/names.h"
#include "util/status.h"

namespace tfs::posix {

// The slow-member rule's check (fs.h): posix's shared mutexes -- the open and
// lock tables' -- count themselves held per thread in debug builds, and every
// commit and data write asserts that the count is zero.
#ifndef NDEBUG
inline void DebugNoSharedLock() { TFS_BUG_ON(*tfs_plat_thread_word() != 0); }
#else
inline void DebugNoSharedLock() {}
#endif

// A table mutex held for the scope, counted per thread in debug builds.
class SharedLock {
 public:
  explicit SharedLock(Mutex& m) : m_(m) {
    m_.Lock();
#ifndef NDEBUG
    ++*tfs_plat_thread_word();
#endif
  }
  ~SharedLock() {
#ifndef NDEBUG
    --*tfs_plat_thread_word();
#endif
    m_.Unlock();
  }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  Mutex& m_;
  platform::NoFsScope nofs_;
};

inline constexpr u32 kBlock = data::kBlockSize;
// Extent keys per transaction of a truncate, punch or free, at most: a batch
// ends sooner when its keys and records would pass the journal entry
// (DataPath::QueuePunch's reserve: 64 KiB entries with four copies per
// extent hold about 165 scattered extents).
inline constexpr u32 kBatchExtents = 256;
inline constexpr u32 kBufferBlocks = data::kMaxExtentBlocks;  // a write buffer: one extent's worth
// A symlink's target is kept in keys (ino, 1), (ino, 2), ... of this many bytes.
inline constexpr u32 kLinkChunk = btree::kMaxValueBytes;
inline constexpr u32 kSymlinkTargetMax = kSymlinkMax;
inline constexpr u32 kLinkChunks = (kSymlinkTargetMax + kLinkChunk - 1) / kLinkChunk;

inline btree::Pos InodePos(u64 ino) { return btree::Pos{btree::kBtreeInodes, ino, 0}; }
inline btree::Pos LinkPos(u64 ino, u32 chunk) { return btree::Pos{btree::kBtreeInodes, ino, 1 + u64(chunk)}; }
inline btree::Pos OrphanPos(u64 ino) { return btree::Pos{btree::kBtreeInodes, 0, ino}; }
inline btree::Pos DirentPos(u64 dir, u64 slot) { return btree::Pos{btree::kBtreeDirents, dir, slot}; }

inline bool IsDir(const InodeFormat& f) { return (f.mode.get() & kModeTypeMask) == kModeDir; }

inline bool IsDot(const char* name, u32 len) { return len == 1 && name[0] == '.'; }
inline bool IsDotDot(const char* name, u32 len) { return len == 2 && name[0] == '.' && name[1] == '.'; }

inline void SetTime(Le64* f, i64 ns) { f->set(u64(ns)); }

// Name rules shared by every operation: 1..kNameMax bytes, no '/' or NUL (names.cc).
Status CheckName(const char* name, u32 len);

// ParseNamedEntry for table t's btree.
inline Status ParseNamed(const NameTable& t, const u8* v, u32 len, DirentFormat* out, const char** name,
                         const u8** value = nullptr) {
  return ParseNamedEntry(t.btree_id, v, len, out, name, value);
}

// Per-inode locks (fs.h, "Concurrency"). An entry lives in its stripe's table
// while any operation holds or waits for one of its locks (refs, under
// locks_mu_); the last user keeps it as a spare or frees it.
struct Filesystem::InodeLocks {
  u64 ino = 0;
  u32 refs = 0;
  Mutex inode;  // metadata changes of the inode
  RwLock data;  // a regular file's data and size (see "Locking" in file.cc)
};

// The inode locks of up to four inodes, in ascending inode order. status() is
// kNoMemory if an entry could not be made (nothing is held then).
struct Filesystem::Locked {
  Locked(Filesystem* fs, const u64* inos, u32 n) : fs_(fs) {
    u64 want[4] = {};
    u32 m = 0;
    for (u32 i = 0; i < n; i++) {
      if (inos[i] == 0) continue;
      bool dup = false;
      for (u32 j = 0; j < m; j++) dup |= want[j] == inos[i];
      if (!dup) want[m++] = inos[i];
    }
    for (u32 i = 1; i < m; i++)  // insertion sort: at most four
      for (u32 j = i; j > 0 && want[j - 1] > want[j]; j--) Swap(want[j - 1], want[j]);
    for (u32 i = 0; i < m; i++) {
      InodeLocks* e = fs_->AcquireLocks(want[i]);
      if (e == nullptr) {
        Unlock();
        status_ = Err::kNoMemory;
        return;
      }
      held_[n_++] = e;
    }
    for (u32 i = 0; i < n_; i++) held_[i]->inode.Lock();
    locked_ = true;
  }
  ~Locked() { Unlock(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  Status status() const { return status_; }

 private:
  void Unlock() {
    for (u32 i = n_; i-- > 0;) {
      if (locked_) held_[i]->inode.Unlock();
      fs_->ReleaseLocks(held_[i]);
    }
    n_ = 0;
  }
  platform::NoFsScope nofs_;  // first: it covers taking the locks
  Filesystem* fs_;
  InodeLocks* held_[4] = {};
  u32 n_ = 0;
  bool locked_ = false;
  Status status_;
};

// One inode's data lock, shared or exclusive; ino 0 holds nothing. status() is
// kNoMemory if the lock entry could not be made (nothing is held then).
class Filesystem::DataGuard {
 public:
  DataGuard(Filesystem* fs, u64 ino, bool exclusive) : fs_(fs), exclusive_(exclusive) {
    if (ino == 0) return;
    e_ = fs_->AcquireLocks(ino);
    if (e_ == nullptr) {
      status_ = Err::kNoMemory;
      return;
    }
    if (exclusive_) {
      e_->data.WriteLock();
    } else {
      e_->data.ReadLock();
    }
  }
  ~DataGuard() {
    if (e_ == nullptr) return;
    if (exclusive_) {
      e_->data.WriteUnlock();
    } else {
      e_->data.ReadUnlock();
    }
    fs_->ReleaseLocks(e_);
  }
  DataGuard(const DataGuard&) = delete;
  DataGuard& operator=(const DataGuard&) = delete;
  Status status() const { return status_; }

 private:
  platform::NoFsScope nofs_;  // first: it covers taking the lock
  Filesystem* fs_;
  bool exclusive_;
  InodeLocks* e_ = nullptr;
  Status status_;
};

// A write buffer: one open inode's run of dirty blocks (wbuf.cc).
struct Filesystem::Buffered {
  u64 first = 0;       // first file block of the run
  u32 blocks = 0;      // dirty blocks [first, first + blocks); 0: empty
  u64 size = 0;        // the file's size with them
  i64 mtime_ns = 0;    // of the last write into the run
  u64 since_ns = 0;    // monotonic time of the run's first write
  u64 gen = 0;         // unique per buffer and run: a reader that saw another retries
  u8* data = nullptr;  // kBufferBlocks blocks
};

}  // namespace tfs::posix

#endif  // TFS_POSIX_INTERNAL_H_
