// Filesystem: the VFS-neutral POSIX namespace over the btrees (docs/design/posix.md).
//
// Both front ends (the FUSE shim, later the kernel module) call this API and only
// translate; no filesystem logic lives in them. Inodes are named by number (the
// root is kRootIno), entries by (directory, name bytes). Every operation that
// changes the namespace is one btree transaction: it commits whole or not at all,
// and a crash leaves either its before or its after state.
//
// Errors (Status codes; the front ends turn them into errnos): kNotFound (ENOENT),
// kExists (EEXIST), kNotEmpty (ENOTEMPTY), kNotDir (ENOTDIR), kIsDir (EISDIR),
// kNameTooLong, kInvalidArgument (EINVAL: e.g. renaming a directory into itself),
// kTooManyLinks (EMLINK), kRange (ERANGE), kPermission (EPERM), kNoSpace,
// kNoMemory, kIo and kCorrupt from below. A record that does not parse (inode,
// entry) is kCorrupt, never trusted.
//
// Permissions. The caller's identity (Caller) makes new inodes its own (group:
// the directory's if it is setgid, which new subdirectories inherit). Access
// checks against mode bits are the front end's (FUSE: default_permissions; the
// kernel: the VFS), as for every Linux filesystem; this layer enforces what the
// VFS cannot: a directory's type and emptiness, names, loops.
//
// Concurrency. Any number of threads. Operations lock the inodes they change
// with per-inode mutexes (an inode lock), always in ascending inode order,
// after the filesystem-wide rename mutex for renames across directories (lock
// order: data lock, rename_mu_, inode locks, the btrees' own locks). Like the
// VFS's inode locks, inode locks are held across btree reads and the commit.
// Lookups, GetAttr and ReadDir take none: each reads committed state key by
// key. A regular file's data also has a per-inode data lock (a reader-writer
// lock, taken before any inode lock; see "Locking" in file.cc): device I/O
// happens under it alone, and the inode lock is taken only to commit. Data
// operations on an inode need an open handle (OpenInode) or must not race its
// last unlink.
//
// The slow-member rule: no lock that an operation on another inode can
// contend on is held across a journal wait or device I/O -- a commit can wait
// for the journal, and a data write for a stalled HDD, and neither may hold up
// an operation that does not name the same inode. Inode and data locks are
// per inode (an entry in a table while in use, not a stripe shared by
// hashing), the tables' own mutexes are held only to find an entry, and close
// with nothing buffered takes no lock. A directory's inode lock is held across
// the commit of a change to that directory, as the VFS holds its i_rwsem: a
// create in the same directory names it and waits; an unlinked file's data is
// freed after the directory's lock is released (FreeUnlinked). The one lock
// shared beyond that is the VFS's: a rename across directories holds
// rename_mu_ across its commit (the loop check needs parents to stay put), so
// such renames wait for one another. Debug builds check the shared mutexes:
// posix's table mutexes count themselves held per thread, and every commit
// and data write asserts the count is zero (DebugNoSharedLock).
//
// Open files. An inode whose last name goes while it is open (OpenInode without
// its Release) stays, with nlink 0 and an orphan key, until its last Release; a
// crash leaves the orphan key, and the next Mount frees it.
//
// The write buffer. A small write (up to half a buffer) to an open regular
// file is copied into that inode's buffer: one run of contiguous dirty blocks,
// up to data::kMaxExtentBlocks (512 KiB). Writes that continue or overwrite the
// run join it; the run is written out as one extent when a write does not fit
// it, when it is full, on FlushBuffer (the front end calls it at close),
// Fsync, the last Release, any SetAttrs or Fallocate of the inode, Unmount,
// and by a background thread once its oldest write is Options::buffer_age_ms
// old. Reads and GetAttr/Lookup see buffered data and size. A buffered write
// is as durable as any write before fsync: a crash may lose it; fsync never
// does. kWriteDirect (O_DIRECT) writes flush the run and go straight through.
// A failed write-out keeps the run and fails the operation that asked for it
// (close, fsync), as Linux reports writeback errors there.
#ifndef TFS_POSIX_FS_H_
#define TFS_POSIX_FS_H_

#include "btree/tree.h"
#include "data/data.h"
#include "platform/atomic.h"
#include "platform/sync.h"
#include "posix/format.h"
#include "posix/names.h"
#include "sb/format.h"
#include "store/store.h"
#include "util/counters.h"
#include "util/status.h"
#include "util/vector.h"

namespace tfs::posix {

// The superblock's incompatible features posix writes (chunked xattr values,
// kInodeFlagCaps) and keeps (every capability flagged). A read-write Mount
// records kSbXattrChunks (store::AddFeatures) before it writes anything of
// either, brings a filesystem from before them up to them (FlagCapsInodes),
// then records kSbCapsFlagged; fsck -y passes kSbXattrChunks in
// store::OpenOptions::features and sets the rest when its check is done.
inline constexpr u16 kSbFeatures = sb::kSbXattrChunks | sb::kSbCapsFlagged;

// What stat(2) reports of an inode.
struct Attr {
  u64 ino = 0;
  u32 generation = 0;
  u32 mode = 0;
  u32 uid = 0;
  u32 gid = 0;
  u32 nlink = 0;
  u64 size = 0;
  u64 sectors = 0;  // 512-byte units (st_blocks)
  u64 rdev = 0;
  i64 atime_ns = 0;
  i64 mtime_ns = 0;
  i64 ctime_ns = 0;
  i64 btime_ns = 0;
};

// Who asks: new inodes belong to them.
struct Caller {
  u32 uid = 0;
  u32 gid = 0;
};

// SetAttrs: which fields to change (bits of `valid`).
enum SetAttrValid : u32 {
  kSetMode = 1u << 0,      // permission bits only; the file type never changes
  kSetUid = 1u << 1,
  kSetGid = 1u << 2,
  kSetSize = 1u << 3,      // regular files only (kIsDir / kInvalidArgument otherwise); frees data past it
  kSetAtime = 1u << 4,     // to atime_ns
  kSetMtime = 1u << 5,     // to mtime_ns
  kSetAtimeNow = 1u << 6,  // to the current time
  kSetMtimeNow = 1u << 7,
};
struct SetAttr {
  u32 valid = 0;
  u32 mode = 0;
  u32 uid = 0;
  u32 gid = 0;
  u64 size = 0;
  i64 atime_ns = 0;
  i64 mtime_ns = 0;
};

// SetXattr flags: the Linux XATTR_* values.
enum XattrFlags : u32 {
  kXattrCreate = 1,
  kXattrReplace = 2,
};

// Fallocate modes: the Linux FALLOC_FL_* values.
enum FallocFlags : u32 {
  kFallocKeepSize = 0x01,
  kFallocPunchHole = 0x02,
  kFallocZeroRange = 0x10,
};

// Rename flags: the Linux RENAME_* values.
enum RenameFlags : u32 {
  kRenameNoReplace = 1,
  kRenameExchange = 2,
};

// ReadDir's sink: one entry (name not NUL-terminated, `type` a DirentType,
// `next` the cookie to resume after it). Returns false when it has no room for
// this entry: ReadDir then stops, and the entry is the first of the next call.
using DirFiller = bool (*)(void* ctx, const char* name, u32 len, u64 ino, u8 type, u64 next);
// ReadDirPlus's sink: as DirFiller, with the entry's attributes (`attr` null
// for "." and "..", whose lookups a front end does not count).
using DirPlusFiller = bool (*)(void* ctx, const char* name, u32 len, const Attr* attr, u64 ino, u8 type,
                               u64 next);

// Open flags (the front end's translation of open(2)'s).
enum OpenFlags : u32 {
  kOpenTruncate = 1,  // O_TRUNC: a regular file's data goes (other types ignore it)
};

// FS_IOC_FSGETXATTR / FSSETXATTR (struct fsxattr's fields).
struct Fsxattr {
  u32 xflags = 0;
  u32 extsize = 0;
  u32 nextents = 0;
  u32 projid = 0;
  u32 cowextsize = 0;
};

struct StatFs {
  u64 block_size = 0;    // bytes of the units below
  u64 blocks = 0;        // total data space
  u64 blocks_free = 0;
  u64 blocks_avail = 0;  // free to unprivileged writers (above the reserves)
  u64 files = 0;         // inodes: in use + files_free (statfs's f_files)
  u64 files_free = 0;    // inodes that can still be made (not preallocated: see GetStatFs)
  u64 name_max = kNameMax;
};

// posix's counters (util/counters.h): the namespace, and the write buffer
// (writes taken into it, runs written out and their bytes by cause, runs
// dropped with their file, buffers in use now).
#define TFS_POSIX_COUNTERS(X, A)                                                   \
  X(lookups, counter, "names looked up")                                           \
  X(creates, counter, "inodes created (files, directories, nodes, links to new)") \
  X(unlinks, counter, "names unlinked or removed")                                 \
  X(renames, counter, "renames")                                                   \
  X(setattrs, counter, "attribute changes")                                        \
  X(readdirs, counter, "directory listings (pages)")                               \
  X(inodes_freed, counter, "last link gone and not open (or its last Release)")    \
  X(orphans_freed, counter, "at mount: left by a crash while open")                \
  X(caps_flagged, counter, "at mount: capability xattrs from before their flag")  \
  X(open_inodes, gauge, "inodes open now")                                         \
  X(inode_locks_now, level, "per-inode lock entries in use now")
#define TFS_WBUF_COUNTERS(X, A)                                                             \
  X(writes_buffered, counter, "writes taken into a buffer")                                 \
  X(writes_direct, counter, "writes that went straight to the data path")                   \
  X(flushes_full, counter, "runs written out: the buffer was full")                         \
  X(flushes_close, counter, "runs written out: the file was closed")                        \
  X(flushes_fsync, counter, "runs written out: fsync")                                      \
  X(flushes_age, counter, "runs written out: aged out")                                     \
  X(flushes_other, counter, "runs written out: another operation on the file needed it")    \
  X(bytes_flushed, counter, "bytes those runs wrote")                                       \
  X(flush_errors, counter, "runs that failed to write (they stay for the next flush)")      \
  X(buffers_dropped, counter, "runs dropped with their file")                               \
  X(closes_unbuffered, counter, "closes with nothing buffered: no lock taken")              \
  X(flushes_pressure, counter, "runs written out: memory pressure")                         \
  X(buffers_shrunk, counter, "buffers freed under memory pressure")                        \
  X(write_splits, counter, "write transactions the journal entry could not hold, done again in halves") \
  X(buffers_now, level, "buffers in use now")

struct Stats {
  TFS_COUNTER_FIELDS(TFS_POSIX_COUNTERS)
  TFS_COUNTER_FIELDS(TFS_WBUF_COUNTERS)
};

class Filesystem {
 public:
  Filesystem() = default;
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // Starts on an open store: frees the orphans a crash left, creates the root
  // directory of a new filesystem (owned by `root_owner`), and finds the next
  // free inode number. The store must stay open until Unmount.
  struct Options {
    Caller root_owner;       // of a new filesystem's root directory
    // The write buffer (see above): buffers in use at once (0: no buffering;
    // each is 512 KiB) and the age at which a run is written out.
    u32 write_buffers = 128;
    u32 buffer_age_ms = 5000;
    // New directories hash names into 2^dir_hash_bits home slots (1..62; stored
    // per directory). Tests shrink it to force hash collisions; keep 62.
    u32 dir_hash_bits = 62;
    // The repair worker (docs/design/copies.md, "Step 6b"): a thread that
    // rewrites the bad copies reads find (DataPath's repair queue), on a
    // writable mount. Tests that count exact read results turn it off and
    // call RepairQueued themselves.
    bool repair_copies = true;
  };
  // `data` is the mount's data path, open on `store` (mount::Instance owns
  // both and opens them first); posix borrows it until Unmount.
  Status Mount(store::Store* store, data::DataPath* data, const Options& options);
  Status Mount(store::Store* store, data::DataPath* data) { return Mount(store, data, Options{}); }
  // Frees inodes still open but unlinked (their handles die with the mount).
  // The caller then closes the store, which makes everything durable.
  Status Unmount();

  Result<Attr> Lookup(u64 dir, const char* name, u32 len);
  Result<Attr> GetAttr(u64 ino);

  // Creates a regular file, fifo, socket, char or block device (mode's type;
  // rdev for devices), or with Mkdir a directory, or a symlink.
  Result<Attr> Mknod(u64 dir, const char* name, u32 len, u32 mode, u64 rdev, const Caller& who);
  Result<Attr> Mkdir(u64 dir, const char* name, u32 len, u32 mode, const Caller& who);
  Result<Attr> Symlink(u64 dir, const char* name, u32 len, const char* target, u32 target_len,
                       const Caller& who);
  // A new name for an existing non-directory inode.
  Result<Attr> Link(u64 ino, u64 dir, const char* name, u32 len);
  Status Unlink(u64 dir, const char* name, u32 len);
  Status Rmdir(u64 dir, const char* name, u32 len);
  Status Rename(u64 old_dir, const char* old_name, u32 old_len, u64 new_dir, const char* new_name,
                u32 new_len, u32 flags);
  Result<Attr> SetAttrs(u64 ino, const SetAttr& set);
  // File data (regular files): Write returns len (bytes past 2^50 are kTooBig);
  // Read returns the bytes read, fewer at the end of the file, 0 past it. A
  // checksum mismatch is kDataCorrupt (EIO), never the bytes. Write flags:
  // kWriteDirect (O_DIRECT) bypasses the write buffer.
  //
  // Privileges (the VFS's file_remove_privs, Linux 6.1's rules): a write of
  // at least one byte first takes away S_ISUID, S_ISGID when group execute
  // is set (without it the bit marks mandatory locking; 6.2 and later also
  // take it when the writer is outside the file's group, which posix does
  // not), both unless the writer has CAP_FSETID, and the
  // "security.capability" xattr whoever writes -- one transaction before the
  // data, with ctime. kWritePrivsRemoved: the front end has done this itself
  // (FUSE's buffered writes, where the kernel did it before sending the
  // write; the kernel's VFS), posix leaves them.
  enum WriteFlags : u32 { kWriteDirect = 1, kWritePrivsRemoved = 2 };
  // The writer, as far as Write's privilege removal needs it (may be null:
  // a writer without CAP_FSETID).
  struct Writer {
    // Whether the writer has CAP_FSETID (the VFS asks capable(): in the
    // initial user namespace). Asked at most once, and only when the write
    // would take a setid bit away -- never for a file without them, so a
    // front end may make a syscall here; null: it has not.
    bool (*may_keep_setid)(void* ctx) = nullptr;
    void* ctx = nullptr;
    // Out: this write took setid bits or security.capability away -- a mode
    // or xattrs a front end caches are stale.
    bool dropped = false;
  };
  Result<u32> Write(u64 ino, u64 off, const void* buf, u32 len, u32 flags = 0, Writer* writer = nullptr);
  // Inode flags in Linux's FS_IOC_GETFLAGS/SETFLAGS values. Only kFsComprFl
  // (chattr +c: the file's new data is zstd-compressed, as all files' are on a
  // filesystem formatted with --compression zstd); setting others is
  // kNotSupported. Existing data stays as written. The flag is the
  // compression option's mirror (opts.h): +c sets tierfs.compression to
  // zstd, -c unsets a zstd one (the filesystem's applies), and the option
  // sets and clears the flag.
  static constexpr u32 kFsComprFl = 0x00000004;
  Result<u32> GetFlags(u64 ino);
  Status SetFlags(u64 ino, u32 flags);
  // Writes out the inode's buffered writes (close(2): the front end's flush).
  Status FlushBuffer(u64 ino);
  // FlushBuffer, then the journal's durable commit: everything so far,
  // including this inode's data, survives a crash.
  Status Fsync(u64 ino);
  Result<u32> Read(u64 ino, u64 off, void* buf, u32 len);
  // lseek's SEEK_DATA (`data`) and SEEK_HOLE: the first offset at or after
  // `off` in data (or in a hole; the end of the file counts as one). Buffered
  // writes are written out first (they are data). kNoSuchOffset (ENXIO) when
  // `off` is negative, at or past the end, or no data follows it.
  Result<u64> Seek(u64 ino, i64 off, bool data);
  // fallocate(2) on a regular file (kIsDir for a directory, kNoDevice for other
  // types): mode 0 or kFallocKeepSize reserve the holes of the range as
  // unwritten extents (zeros that hold their space; the size grows to the
  // range's end unless KEEP_SIZE); kFallocPunchHole|kFallocKeepSize makes the
  // range read as zeros and frees its whole blocks; kFallocZeroRange (with or
  // without KEEP_SIZE) punches and then reserves. Other modes, and PUNCH_HOLE
  // without KEEP_SIZE, are kNotSupported; len 0 is kInvalidArgument. kNoSpace
  // if free space minus the other reservations cannot hold the holes (what was
  // reserved before the failure stays).
  Status Fallocate(u64 ino, u32 mode, u64 off, u64 len);

  // Copies up to cap bytes of a symlink's target; returns its full length.
  Result<u32> ReadLink(u64 ino, char* buf, u32 cap);
  // Entries from `cookie` on (0: from the start, "." and ".." first); none
  // of a removed directory that a handle still holds.
  Status ReadDir(u64 dir, u64 cookie, DirFiller fill, void* ctx);
  Status GetStatFs(StatFs* out);

  // Repairs up to `max` of the bad copies reads queued (DataPath::TakeRepair),
  // in the caller's thread, as the repair worker does (RepairOne); returns
  // how many it took. Each one's outcome is the data path's counters
  // (repaired, repair_skipped, repair_failed, ...).
  u32 RepairQueued(u32 max);

  // Extended attributes: names "user.*", "trusted.*", "security.*",
  // "tierfs.*" (others: kNotSupported), up to kNameMax bytes; values up to kXattrSizeMax (64 KiB,
  // the VFS's XATTR_SIZE_MAX) bytes, those longer than XattrInlineMax(name) in
  // chunk keys (format.h). kNoSpace beyond, as when an inode already has
  // kMaxXattrs, when its chunked values would pass kMaxXattrChunks, or (64 KiB
  // buckets only) when the value's transaction does not fit a journal entry.
  // Set: flags kXattrCreate (kExists if present) or kXattrReplace (kNoData if
  // absent). Get and List copy up to cap bytes and return the full length;
  // cap 0 asks for the length only, a smaller nonzero cap is kRange. List:
  // names, each NUL-terminated. Remove: kNoData if absent. Set, replace,
  // remove and the inode's free change a value and its chunks in one
  // transaction; Get reads a chunked value under the inode lock. Setting
  // and removing "security.capability" sets and clears kInodeFlagCaps in
  // the same transaction (what a write tests).
  //
  // "tierfs.<option>" names are the inode's options (posix/opts.h), not
  // keys: foreground_target, background_target, promote_target, replicas,
  // compression, with text values (one trailing NUL is taken: C callers
  // pass strlen + 1). Set validates the value (kInvalidArgument for a target
  // naming no member or group, replicas outside 1..4, compression other than
  // none or zstd, or a name that is no option), is kNoSpace when metadata
  // may not grow (MetadataRoom), and changes the inode with its ctime in one
  // transaction; a target "none" unsets it. Get: the value (kNoData if
  // unset; kCorrupt if the stored one is not valid here); "tierfs.inherited"
  // (read-only, never listed): the names of the options copied from the
  // parent directory, comma-separated. List adds the set options' names
  // after the keys' -- but not one whose stored value Get calls corrupt, so
  // that getfattr -d, cp -a and rsync -X still copy the rest of the file
  // (fsck clears it). Remove: unset (kNoData if it was not).
  //
  // `who` (no default, so no caller forgets it): the caller of a set or
  // remove of an option, for chattr's rule -- the owner or CAP_FOWNER,
  // checked before the value (kPermission otherwise, as the kernel answers a
  // non-owner whatever the value). kFrontEndChecked: the front end applied
  // the rule itself (the kernel glue: inode_owner_or_capable; tools and
  // tests acting as the owner). Null is refused (kPermission): the check
  // fails closed. Names other than "tierfs." ones ignore it.
  struct OptionCaller {
    u32 uid = 0;
    // Whether the caller has CAP_FOWNER (the VFS asks capable_wrt_inode_uidgid);
    // asked at most once, and only of a caller who is not the owner; null: no.
    bool (*has_fowner)(void* ctx) = nullptr;
    void* ctx = nullptr;
    // Out: why a set or remove of an option was refused (one line, static
    // text), for the front end's log; null if it was not.
    const char* refused = nullptr;
  };
  // `who` for a caller whose front end has checked chattr's rule (above).
  // A tag: only its address means anything; nothing is written to it.
  static OptionCaller* const kFrontEndChecked;
  Status SetXattr(u64 ino, const char* name, u32 len, const void* value, u32 value_len, u32 flags,
                  OptionCaller* who);
  Result<u32> GetXattr(u64 ino, const char* name, u32 len, void* buf, u32 cap);
  // `trusted`: whether the caller may see trusted.* names (CAP_SYS_ADMIN; the
  // VFS checks get and set, but leaves listing to the filesystem).
  Result<u32> ListXattr(u64 ino, char* buf, u32 cap, bool trusted = true);
  Status RemoveXattr(u64 ino, const char* name, u32 len, OptionCaller* who);

  // A handle on the inode is open / closed (see "Open files" above).
  Status OpenInode(u64 ino);
  Status Release(u64 ino);

  // The front ends' operations (docs/design/core.md): each is the whole of
  // what open(2), creat(2), opendir(3), readdir with attributes, fsync(2) on
  // a directory and the fileattr ioctls ask of the filesystem, so the FUSE
  // shim and the kernel glue only translate.
  //
  // open(2): a handle on the inode (OpenInode), then with kOpenTruncate a
  // regular file's truncation to 0 (other types ignore it); if the truncation
  // fails the handle is released and the error returned -- part of the data
  // may be gone (truncation frees in batches), as on any filesystem. The
  // handle comes first, so no unlink can free the inode in between. The
  // truncation takes the privileges a write takes (the VFS's do_truncate:
  // setid bits unless `writer` may keep them, security.capability), before
  // the data, whether or not the file had any (Write's rules, Writer).
  Status Open(u64 ino, u32 flags, Writer* writer = nullptr);
  // creat(2) / open(O_CREAT) of a new name: a regular file (mode's
  // permission bits) with a handle open on it. The handle is counted (in
  // memory) before the create commits, under the directory's lock, so no
  // other operation sees the name before the handle exists.
  Result<Attr> CreateOpen(u64 dir, const char* name, u32 len, u32 mode, const Caller& who);
  // opendir(3): a handle on a directory (kNotDir unless one; kNotFound if it
  // was removed). Like a file's, the handle keeps the directory after an
  // rmdir or a rename over it, until ReleaseDir: fstat answers (nlink 0),
  // chmod works, and it lists nothing (ext4's behaviour). Takes no inode
  // lock (an `ls` must not wait behind a commit in the directory); the root,
  // never removed, takes no handle either.
  Status OpenDir(u64 dir);
  Status ReleaseDir(u64 dir);
  // readdir with attributes (FUSE's readdirplus, the kernel's lookups while
  // listing): entries from `cookie` on, each with its inode's attributes; an
  // entry whose inode went since it was listed is skipped; a failure after
  // the first entry ends the call early (the next call resumes there and
  // reports it). At most `max_entries` are listed at a time (the sink's room
  // at the smallest entry size); the listing is read first, then the
  // attributes, so no btree iterator is held across another read. A call
  // gives the sink nothing only at the end of the directory (or when the sink
  // takes nothing): if every entry listed went, it lists on.
  Status ReadDirPlus(u64 dir, u64 cookie, u32 max_entries, DirPlusFiller fill, void* ctx);
  // fsync(2) on a directory: every namespace operation so far and every
  // written-out write durable (the journal's durable commit).
  Status FsyncDir(u64 dir);
  // The xfs-style attributes (FS_IOC_FSGETXATTR/FSSETXATTR): tierfs has none
  // of them; Get reports zeros, Set accepts only zeros (kNotSupported else).
  Status GetFsxattr(u64 ino, Fsxattr* out);
  Status SetFsxattr(u64 ino, const Fsxattr& x);

  Stats GetStats() const;
  // Tests: `blocks` a write transaction carries (0: WriteBlocksFitting's),
  // to reach the halving of one the journal entry cannot hold.
  void SetWriteChunkForTest(u32 blocks) { write_chunk_for_test_.Store(blocks, MemOrder::kRelaxed); }
  // Blocks a write transaction of file `ino` carries now (WriteChunk).
  Result<u32> WriteChunkOf(u64 ino);

 private:
  struct Locked;      // inode locks held by one operation
  struct Buffered;    // one open inode's write buffer
  struct InodeLocks;  // one inode's inode lock and data lock, while in use
  class DataGuard;    // holds one inode's data lock

  // Stripes of the open-handle and lock tables (short-held mutexes).
  static constexpr u32 kStripes = 64;
  u32 Stripe(u64 ino) const { return u32((ino * 0x9e3779b97f4a7c15ull) >> 58) % kStripes; }

  Status ReadInode(u64 ino, InodeFormat* out, char* link = nullptr, u32* link_len = nullptr);
  Status ReadDirInode(u64 dir, InodeFormat* out);
  // open_handle: the new inode is counted open before the commit (CreateOpen).
  Result<Attr> Create(u64 dir, const char* name, u32 len, u32 mode, u64 rdev, const char* target,
                      u32 target_len, const Caller& who, bool open_handle = false);
  // Adds one handle on `ino` (open_[] under its stripe's mutex); DropHandle
  // takes one back: false if none is open, *last when it was the last (then
  // *buf is its write buffer, for the caller to free).
  Status AddHandle(u64 ino);
  bool DropHandle(u64 ino, bool* last, Buffered** buf);
  // Queues the inode's new state after losing a link: deleted (with whatever it
  // owns) when no link and no handle is left, else written, with an orphan key
  // when only handles are left.
  Status QueueUnlinked(btree::Transaction* tx, u64 ino, InodeFormat* inode, bool* freed);
  // Queues the deletion of every key the inode owns but its file data
  // (FinishFree's last transaction); *had_record: its inode record was there
  // (an orphan key with no record is damage: nothing to uncount).
  Status QueueFree(btree::Transaction* tx, u64 ino, bool* had_record);
  // Frees an orphaned inode no handle holds: its data in batches, then the inode.
  Status FinishFree(u64 ino);
  // A read-write mount of a filesystem without kSbCapsFlagged (written by a
  // build before the flag): sets kInodeFlagCaps on every inode with a
  // security.capability xattr (Mount has recorded kSbXattrChunks, and
  // records kSbCapsFlagged after, once the flags are durable). Idempotent: a
  // cut before that record redoes it at the next mount. `complete`: false if
  // an inode could not be read (damaged: logged, left to fsck).
  Status FlagCapsInodes(bool* complete);
  // FinishFree under the inode's own lock (after an unlink or rename let go of
  // the directories' locks).
  Status FreeUnlinked(u64 ino);
  // Under the inode's lock: FinishFree if it is still an orphan (not freed
  // already, not linked) -- the last Release's and FreeUnlinked's check.
  Status FreeOrphan(u64 ino);
  // Rename's work under its locks; *to_free: a replaced inode to free after.
  Status RenameEntries(u64 old_dir, const char* old_name, u32 old_len, u64 new_dir, const char* new_name,
                       u32 new_len, u32 flags, u64* to_free);
  // Punches the extents from block `keep` on in batches (committing *f's
  // sector count with each), all but the last: what is left fits one
  // QueuePunch batch that keeps `reserve` journal bytes for the rest of the
  // caller's transaction, which punches it. Under the inode's lock.
  Status PunchPast(u64 ino, InodeFormat* f, u64 keep, usize reserve);
  // The inode's lock entry, created if none is in use (null: out of memory),
  // and its release (the last user frees or keeps it as a spare).
  InodeLocks* AcquireLocks(u64 ino);
  void ReleaseLocks(InodeLocks* l);
  // The file data section (see "Locking" in file.cc). Callers hold the inode's
  // data lock (exclusive unless said otherwise) and no inode lock.
  // Under the inode lock: queues p (if any; punching its range), raises the size
  // to at least min_size, sets mtime and ctime (if mtime != 0), and commits
  // with the delta's dependencies -- or aborts the delta.
  Status CommitData(u64 ino, const data::Prepared* p, data::Delta* delta, u64 min_size, i64 mtime,
                    journal::CommitMode mode = journal::CommitMode::kNoFlush);
  // Writes nb whole blocks from `blocks` at file block `first` (the options
  // of f, the inode as the caller read it) and commits them with CommitData:
  // the size raised to `size` bytes, or to the end of the blocks committed
  // so far where that is less, mtime and ctime to `mtime`. `chunk` blocks
  // (WriteChunk's, which the caller has) a transaction at most; one the
  // journal entry still cannot hold (kTooBig:
  // the bound assumes no other writer shares the write point) is written
  // and committed again in halves (counted: write_splits); a single block
  // refused is kIo (logged), not the caller's EFBIG. A failure may leave
  // the blocks before it committed.
  // Blocks a write transaction of a file (f: its inode, for its options)
  // carries: DataPath::WriteBlocksFitting beside the inode (or the test's).
  u32 WriteChunk(const InodeFormat& f);
  Status CommitBlocks(u64 ino, const InodeFormat& f, u64 first, const u8* blocks, u32 nb, u32 chunk, u64 size,
                      i64 mtime, journal::CommitMode mode);
  // Bytes [from, to) of a block that holds data, zeroed and written as a new
  // blob (*out; null for a hole or unwritten block, which reads as zeros).
  Status PrepareZero(u64 ino, u64 block, u32 from, u32 to, data::Prepared** out, data::Delta* delta);
  Status ZeroInBlock(u64 ino, u64 block, u32 from, u32 to, i64 mtime);
  // kNoSpace when metadata may not grow (alloc.h, MetadataRoom): the check of
  // every operation that adds keys (creates, links, xattrs, writes, fallocate
  // but punch); deletes, truncates and renames skip it (docs/design/space.md).
  Status MetadataRoom();
  // Whether the inode has a buffered run now.
  bool Buffering(u64 ino);
  // Unlink (rmdir false) or Rmdir of a checked name.
  Status Remove(u64 dir, const char* name, u32 len, bool rmdir);
  // Counts an inode freed by a committed operation.
  void NoteFreed(bool freed);
  // The write buffer: changed under the inode's exclusive data lock.
  enum FlushCause : u32 { kFlushFull, kFlushClose, kFlushFsync, kFlushAge, kFlushPressure, kFlushOther };
  Buffered* FindBuffer(u64 ino, bool create);
  // Writes out b's run (if any; b may be null) as one extent.
  Status FlushRun(u64 ino, Buffered* b, FlushCause cause);
  Result<u32> WriteBuffered(u64 ino, InodeFormat* f, Buffered* b, u64 off, const u8* buf, u32 len);
  // The S_ISUID/S_ISGID bits a write by a writer without CAP_FSETID takes
  // from `mode`.
  static u32 SetidWriteDrops(u32 mode);
  // Write's privilege removal (see Write), for an inode `seen` (read by the
  // caller) with setid bits to take or kInodeFlagCaps: one transaction under
  // the inode lock (no data lock held); asks the writer about CAP_FSETID
  // before taking the lock.
  Status DropPrivs(u64 ino, const InodeFormat& seen, Writer* writer);
  // Queues the removal of xattr `e` (found by FindEntry, `chunks` its
  // descriptor) with its chunks.
  Status QueueRemoveXattr(btree::Transaction* tx, const NameTable& t, const Entry& e,
                          const XattrChunksFormat& chunks);
  // Shared data lock suffices for whole blocks.
  // f: the inode as read under the data lock (its size matters for partial
  // blocks, which only an exclusive holder writes).
  Result<u32> WriteThrough(u64 ino, InodeFormat f, u64 off, const u8* buf, u32 len);
  // Size, times and sectors of buffered writes, on top of the inode's.
  void OverlayBuffered(u64 ino, Attr* a);
  void FreeBuffer(Buffered* b);
  static void FlusherMain(void* self);
  void StopFlusher();
  // The repair worker (repair.cc) and one repair: the new copy prepared
  // with no lock held (DataPath::PrepareRepair, device I/O), a slow
  // member flushed, then under the inode lock the re-key
  // (DataPath::QueueReplacePtr: kAgain, skipped, if the extent changed)
  // and its commit; the outcome counted (DataPath::NoteRepair).
  static void RepairerMain(void* self);
  void StopRepairer();
  Status RepairOne(const data::CopyRepair& r);
  void FlushAged();
  // The write buffer's memory-pressure shrinker (platform.h's rules): count
  // is the buffers' pages; scan only asks the flusher (ShrinkBuffers), which
  // writes runs out and frees buffers in its own thread.
  static u64 BufferPages(void* self);
  static u64 AskShrink(void* self, u64 pages);
  // Whether a write of ino could be buffered: open, with a buffer or one to
  // spare (a hint, read without the data lock).
  bool MayBuffer(u64 ino);
  void KickFlusher();
  // Writes out and frees open files' buffers until `pages` are freed (or
  // none is left); returns the pages freed.
  u64 ShrinkBuffers(u64 pages);
  bool IsOpen(u64 ino);
  // Whether f's new data is compressed (its option, chattr +c, the filesystem's).
  bool Compress(const InodeFormat& f) const;
  // The context of f's data writes: kForegroundWrite at f's foreground_target
  // if it has one (opts.h), else at the filesystem's, wanting f's replicas if
  // set, else the filesystem's data_replicas.
  data::IoContext WriteContext(const InodeFormat& f) const;
  // The policy f's new extents record (data/policy.h): its options that are
  // set and valid, target codes canonical; 0 (the filesystem's) for the rest.
  // Taken from the inode read under the inode lock, where QueuePrepared runs.
  data::Policy ExtentPolicy(const InodeFormat& f) const;
  // The "tierfs." xattrs (opts.cc): a set (or with `remove` an unset) of an
  // option under the inode lock; a get from the committed inode; the set
  // options' names appended at buf + at (returns the new end; cap 0: sizes
  // only).
  Status ChangeOption(u64 ino, const char* name, u32 len, const void* value, u32 value_len, u32 flags, bool remove,
                      OptionCaller* who);
  Result<u32> GetOption(u64 ino, const char* name, u32 len, void* buf, u32 cap);
  Result<u32> ListOptions(const InodeFormat& f, char* buf, u32 cap, u32 at);
  // The next inode number; kNoSpace once the numbers are spent (2^64-2 is
  // the last one given).
  Result<u64> AllocIno();
  u32 NextGeneration();
  i64 Now() const;

  store::Store* store_ = nullptr;
  Options opt_;
  Atomic<u32> write_chunk_for_test_{0};
  bool compress_all_ = false;  // the filesystem's compression option
  data::DataPath* data_ = nullptr;  // the mount's (see Mount)
  btree::Btrees* trees_ = nullptr;
  Mutex rename_mu_;
  // Inode lock entries in use, per stripe, under locks_mu_ (held only to find,
  // add or drop an entry), and a few spare ones per stripe.
  mutable Mutex locks_mu_[kStripes];
  Vector<InodeLocks*> locks_[kStripes];
  Vector<InodeLocks*> spare_locks_[kStripes];
  // Open handles per inode: a small table per stripe, under that stripe's
  // open_mu_ (never held while taking another lock).
  struct OpenCount {
    u64 ino;
    u32 count;
    Buffered* buf;  // allocated at the first buffered write; freed with the entry
  };
  Mutex open_mu_[kStripes];
  Vector<OpenCount> open_[kStripes];
  Atomic<u64> next_ino_{kFirstIno};
  Atomic<u32> next_gen_{0};
  struct Live {
    TFS_COUNTER_ATOMICS(TFS_POSIX_COUNTERS)
    TFS_COUNTER_ATOMICS(TFS_WBUF_COUNTERS)
  } ctr_;
  Atomic<u32> buffers_{0};  // write buffers allocated
  Atomic<u64> shrink_pages_{0};  // pages the shrinker asked the flusher to free
  platform::Shrinker shrinker_;  // registered while the flusher runs
  Atomic<u64> buf_gen_{1};  // Buffered::gen values
  // The background flusher (ages buffers out).
  platform::Thread flusher_;
  Atomic<u32> flusher_kick_{0};  // bumped (and woken) to make the flusher look now
  Atomic<bool> flusher_stop_{false};
  // The repair worker (Options::repair_copies, a writable mount).
  platform::Thread repairer_;
  Atomic<bool> repairer_stop_{false};
};

// Parses an inode value (kCorrupt if it is not one of this version).
Status ParseInode(const u8* value, u32 len, InodeFormat* out);
// The inode records the trees hold (keys (ino >= 1, 0) of kBtreeInodes),
// by a walk: what the accounting's inode count must say (fsck's recount
// and rebuild; the mount reads the count instead).
Result<u64> CountInodeRecords(btree::Btrees* trees);
Attr ToAttr(u64 ino, const InodeFormat& inode);

}  // namespace tfs::posix

#endif  // TFS_POSIX_FS_H_
