// mount::Instance: the bring-up and take-down order of one mount (instance.h).
//
// Up: the store, the data path on it, posix, then the background engines
// (none has work to start yet: bg/engine.h).
// Down: the engines (each ends the step it is in), posix, the data path,
// then the store. A stage that
// fails on the way up closes what came before it, so a failed Open leaves the
// members as a read-only open would (the store's close marks them clean only
// if its open had written them). Every stage of a Close runs even after an
// earlier one failed: posix's unmount can fail to write out a buffer, and the
// store must still be flushed, its tables written and its journal stopped.
#include "mount/instance.h"

#include "platform/platform.h"

namespace tfs::mount {

Instance::~Instance() {
  if (!open_) return;
  Status st = Close();
  if (!st.ok())
    platform::Log(platform::LogLevel::kError, "mount: closing at destruction: %s", st.Message());
}

Status Instance::Open(BlockDevice* const* bdevs, u32 count, const Options& options, Diag* diag,
                      store::OpenReport* report) {
  if (used_) return DiagError(diag, Err::kBusy, open_ ? "already open" : "an instance opens once");
  used_ = true;
  // (posix's mount records its incompatible features in the superblock:
  // kSbXattrChunks before it writes anything of them, kSbCapsFlagged once it
  // has flagged an older filesystem's capabilities, kSbExtentPolicy before a
  // write stamps an extent's policy.)
  TFS_TRY(store_.Open(bdevs, count, options.store, diag, report));
  // The data path checks the buckets' counts against the extents (and frees
  // the buckets a crash left unreferenced) before anything reads or writes
  // data.
  Status st = data_.Open(&store_);
  const char* stage = "the data path does not open";
  if (st.ok()) {
    st = fs_.Mount(&store_, &data_, options.posix);
    stage = "the namespace does not mount";
  }
  if (!st.ok()) {
    data_.Close();  // (what it opened of itself, if anything)
    Status cst = store_.Close();
    if (!cst.ok())
      platform::Log(platform::LogLevel::kError, "mount: closing the store after a failed open: %s", cst.Message());
    if (st.code() == Err::kReadOnly)  // (posix: a new filesystem's root is made by its first writable mount)
      return DiagError(diag, st, "%s: it has no root directory yet, and a read-only mount makes none: mount it "
                       "writable once", stage);
    return DiagError(diag, st, "%s: %s", stage, st.Message());
  }
  open_ = true;
  return Status::Ok();
}

Status Instance::Close(CloseTimes* times) {
  if (!open_) return Status::Ok();
  open_ = false;
  const u64 t0 = platform::NowNs();
  engines_.StopAll();
  const Status posix_st = fs_.Unmount();
  const u64 t1 = platform::NowNs();
  data_.Close();
  const Status store_st = store_.Close();
  const u64 t2 = platform::NowNs();
  if (times != nullptr) *times = CloseTimes{t1 - t0, t2 - t1};
  return !posix_st.ok() ? posix_st : store_st;
}

}  // namespace tfs::mount
