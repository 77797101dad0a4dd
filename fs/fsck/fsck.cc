// Offline check and repair of superblocks, member set, journal and allocation
// state (see fsck.h). Reads through the same code mount uses, so every on-disk
// structure is validated exactly as strictly.
#include "fsck/fsck.h"

#include "engine/engine.h"
#include "platform/platform.h"

namespace tfs::fsck {
namespace {

struct Ctx {
  EmitFn emit;
  void* ctx;
  Report* report;

  void Line(const char* fmt, ...) TFS_PRINTF(2, 3) {
    char buf[320];
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    tfs_plat_vsnprintf(buf, sizeof(buf), fmt, ap);
    __builtin_va_end(ap);
    if (emit != nullptr) emit(ctx, buf);
  }
};

bool SameSuperblock(const sb::Superblock& a, const sb::Superblock& b) {
  // Encoded copies for the same member must be byte-identical.
  u8* x = static_cast<u8*>(platform::Alloc(2 * sb::kSbSize, 16));
  if (x == nullptr) return true;  // cannot compare; the other checks still run
  sb::Encode(a, a.dev_idx, x);
  sb::Encode(b, b.dev_idx, x + sb::kSbSize);
  bool same = MemCompare(x, x + sb::kSbSize, sb::kSbSize) == 0;
  platform::Free(x);
  return same;
}

// Superblock copies of one device. Returns false on an uncorrectable problem.
bool CheckCopies(BlockDevice& dev, const Options& opt, Ctx& c) {
  sb::Superblock* s = static_cast<sb::Superblock*>(platform::Alloc(2 * sizeof(sb::Superblock), 16));
  if (s == nullptr) return false;
  Diag d0, d1;
  Status p = sb::ReadCopy(dev, sb::kSbPrimaryOffset, &s[0], &d0);
  Status b = sb::ReadCopy(dev, sb::kSbBackupOffset, &s[1], &d1);
  bool ok = true;
  if (!p.ok() && !b.ok()) {
    c.Line("%s: no valid superblock: primary: %s; backup: %s", dev.Name(), d0.text, d1.text);
    c.report->errors++;
    ok = false;
  } else if (!p.ok() || !b.ok() || !SameSuperblock(s[0], s[1])) {
    const sb::Superblock& good = !p.ok() ? s[1] : !b.ok() ? s[0] : (s[0].seq >= s[1].seq ? s[0] : s[1]);
    c.report->errors++;
    c.Line("%s: superblock copies disagree (%s%s%s)", dev.Name(), p.ok() ? "" : "primary: ",
           p.ok() ? (b.ok() ? "different contents" : "backup: ") : d0.text, b.ok() ? "" : d1.text);
    if (opt.repair) {
      Status w = sb::Write(dev, good, good.dev_idx);
      if (w.ok()) {
        c.report->repaired++;
        c.Line("%s: rewrote both superblock copies", dev.Name());
      } else {
        c.Line("%s: rewriting superblocks failed: %s", dev.Name(), w.Message());
      }
    }
  }
  platform::Free(s);
  return ok;
}

void CheckAllocator(engine::Engine& e, const Options& opt, Ctx& c) {
  const sb::Superblock& s = e.sb();
  alloc::Allocator& a = e.alloc();
  for (u32 m = 0; m < s.nr_members; m++) {
    const sb::Member& mem = s.members[m];
    u64 bad = 0;
    for (u64 b = 0; b < mem.nbuckets; b++) {
      alloc::Bucket bk = a.Get(m, b);
      alloc::BucketState want = alloc::LayoutState(mem, b);
      if (want == alloc::BucketState::kFree) {
        // Not reserved by the layout: any state but the reserved ones is fine.
        bool reserved = bk.state == alloc::BucketState::kMeta || bk.state == alloc::BucketState::kJournal;
        want = reserved ? alloc::BucketState::kFree : bk.state;
      }
      bool live_bad = u64(bk.live_sectors) * 512 > s.bucket_size;
      if (bk.state == want && !live_bad) continue;
      bad++;
      c.report->errors++;
      if (bad <= 10) {
        c.Line("%s: bucket %llu is %s%s, expected %s", mem.label, (unsigned long long)b,
               alloc::BucketStateName(bk.state), live_bad ? " with too many live sectors" : "",
               alloc::BucketStateName(want));
      }
      if (opt.repair && a.RepairState(m, b, want).ok()) c.report->repaired++;
    }
    if (bad > 10) c.Line("%s: %llu more bucket errors", mem.label, (unsigned long long)(bad - 10));
  }
}

}  // namespace

Report Check(BlockDevice* const* bdevs, u32 count, const Options& opt, EmitFn emit, void* ctx) {
  Report report;
  Ctx c{emit, ctx, &report};
  bool copies_ok = true;
  for (u32 i = 0; i < count; i++) copies_ok = CheckCopies(*bdevs[i], opt, c) && copies_ok;
  if (!copies_ok) {
    report.exit_code = kExitUncorrected;
    return report;
  }

  engine::Engine e;
  engine::OpenOptions oo;
  oo.read_only = !opt.repair;
  engine::OpenReport rep;
  Diag d;
  Status st = e.Open(bdevs, count, oo, &d, &rep);
  if (!st.ok()) {
    c.Line("cannot open the filesystem: %s", d.empty() ? st.Message() : d.text);
    bool structural = st.Is(ErrorClass::kCorrupt) || st.Is(ErrorClass::kInvalid) || st.Is(ErrorClass::kNotFound);
    report.errors++;
    report.exit_code = structural ? kExitUncorrected : kExitOperational;
    return report;
  }
  if (!rep.was_clean) {
    report.notes++;
    c.Line("not cleanly unmounted: %llu journal entries (%llu keys) %s", (unsigned long long)rep.replay.entries.size(),
           (unsigned long long)rep.replayed_keys, opt.repair ? "replayed" : "would be replayed");
  }
  if (rep.replay.bad_headers > 0) {
    report.notes++;
    c.Line("journal: %llu damaged or torn entries ignored", (unsigned long long)rep.replay.bad_headers);
  }
  if (rep.replay.gap_at != 0 && rep.replay.discarded_entries > 0) {
    c.Line("journal: entry %llu missing; %llu later entries cannot be replayed",
           (unsigned long long)rep.replay.gap_at, (unsigned long long)rep.replay.discarded_entries);
    report.notes++;
  }
  CheckAllocator(e, opt, c);
  if (opt.repair && report.repaired > 0) {
    Status cp = e.alloc().Checkpoint();
    if (!cp.ok()) {
      c.Line("writing repaired allocation tables failed: %s", cp.Message());
      report.repaired = 0;
    }
  }
  st = e.Close();
  if (!st.ok()) {
    c.Line("closing the filesystem failed: %s", st.Message());
    report.exit_code = kExitOperational;
    return report;
  }
  if (report.errors == 0) {
    report.exit_code = kExitClean;
  } else if (report.repaired >= report.errors) {
    report.exit_code = kExitRepaired;
  } else {
    report.exit_code = kExitUncorrected;
  }
  return report;
}

}  // namespace tfs::fsck
