// mount::Instance: one mounted tierfs -- what a front end holds (the FUSE
// session's userdata, later the kernel's super_block->s_fs_info).
//
// It owns everything a mount runs, and is the one place that knows the order
// they come up and go down in: the persistent store (devices, superblock,
// allocator, journal, btrees: store/store.h), then the data path (extents,
// space accounting, write points: data/data.h), then posix (the namespace,
// which borrows the data path) and the background engines (bg/engine.h),
// which borrow it too. Close() takes them down in reverse and
// leaves the filesystem clean. cmd_mount, the tests and the kernel glue call this instead
// of writing the order out themselves (docs/design/core.md, step 2).
//
// Errors: Open() fills a Diag with one line saying which stage refused (the
// store's own line, or "the namespace does not mount: ..."), and on any
// failure leaves nothing open. Close() runs every stage even when one fails and
// returns the first failure.
//
// An instance opens once, as its store does: after a Close, or an Open that
// failed, the next mount is a new instance (Open on a used one is kBusy).
// Open and Close from one thread; between them the store and posix are
// thread-safe themselves. The instance is large (it holds the store): the
// front ends keep it on the heap.
#ifndef TFS_MOUNT_INSTANCE_H_
#define TFS_MOUNT_INSTANCE_H_

#include "bg/engine.h"
#include "data/data.h"
#include "platform/block_device.h"
#include "posix/fs.h"
#include "store/store.h"
#include "util/diag.h"
#include "util/status.h"

namespace tfs::mount {

struct Options {
  store::OpenOptions store;  // (posix's mount records its features: posix::kSbFeatures)
  posix::Filesystem::Options posix;
};

// How long each stage of Close() took (the daemon logs it at unmount).
struct CloseTimes {
  u64 posix_ns = 0;  // posix's unmount: the write buffers written out, open orphans freed
  u64 store_ns = 0;  // the data path's close (its write points' empty buckets freed) and
                     // the store's: journal flushed, tables written, marked clean
};

class Instance {
 public:
  Instance() = default;
  ~Instance();  // closes what is still open (errors logged)
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  // Brings the filesystem on `bdevs` (any order) up. `report` (optional): what
  // the store's open found (replay, backups used, staleness).
  Status Open(BlockDevice* const* bdevs, u32 count, const Options& options, Diag* diag,
              store::OpenReport* report = nullptr);
  // Takes it down in reverse; idempotent. `times` (optional): per stage.
  Status Close(CloseTimes* times = nullptr);

  bool open() const { return open_; }
  store::Store& store() { return store_; }
  data::DataPath& data() { return data_; }
  posix::Filesystem& fs() { return fs_; }
  // The background engines (their switches: mount/control.h). An engine
  // whose work is not built yet has no thread ("off"); its switch works.
  bg::Engines& engines() { return engines_; }

 private:
  // Members in bring-up order (destroyed in reverse).
  store::Store store_;
  data::DataPath data_;
  posix::Filesystem fs_;
  bg::Engines engines_;
  bool open_ = false;
  bool used_ = false;  // Open was called (see above)
};

}  // namespace tfs::mount

#endif  // TFS_MOUNT_INSTANCE_H_
