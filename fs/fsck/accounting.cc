// fsck's accounting pass (docs/design/copies.md, "Step 3b", "### fsck";
// "As built: step 3b-4"): every bucket's live and cached counts in its
// allocation record against a recount of the extents, which are the truth.
// It runs after the data pass, so it counts what that pass's repairs left.
//
// The recount is the data path's own walk (data::CountExtents: PtrBucket,
// PtrCountsIn against the allocator's states and generations, PtrSectors),
// 8 bytes a bucket, never per extent. A user bucket whose record counts
// otherwise is an error; -y sets the extents' counts (Allocator::RepairCounts,
// one batch). A bucket that is not user with counts in its record is an error
// too; -y zeroes them (RepairState to its own state). A user bucket no
// pointer counts in is the data pass's note already ("marked user but holds
// no extent"): the next mount frees it, and -y leaves it to the mount.
//
// The accounting keys (alloc/accounting.h: the reserved total, a total per
// set of members) against the same walk's (data::AcctTotals): a total that
// differs, or a set with sectors no extent has, is an error; -y sets the
// extents' (Store::RepairAcct; an extra set's key deleted). A set's key of
// 0 sectors is normal (its data was deleted) and left. The inode count
// against a walk of the inode records (posix::CountInodeRecords) the same
// way.
//
// Invariant kept for a cut: -y sets sb::kSbAcctRepair durably before its
// first repair -- or an earlier pass's first repair that changes the counts
// or what they count: a bucket state set, the data pass's extent edits
// (BeginCountRepair, pass.h) -- and clears
// it when this pass has ended (Close() writes the clear after checkpointing
// the repaired records), so a read-write mount never runs on counts a cut
// left half-repaired or out of step with the edited extents.
#include "alloc/allocator.h"
#include "data/data.h"
#include "fsck/pass.h"
#include "posix/fs.h"
#include "sb/format.h"

namespace tfs::fsck {
namespace {

constexpr u32 kMaxLines = 10;  // per member and kind of finding; the rest are counted

// A bucket that is not user, with counts in its record: its state, to keep.
struct ForeignFix {
  u32 dev;
  u64 bucket;
  alloc::BucketState state;
};

}  // namespace

Status BeginCountRepair(store::Store& e, Ctx& c) {
  if (c.acct_begun) return Status::Ok();
  TFS_TRY(e.BeginAcctRepair());
  c.acct_begun = true;
  return Status::Ok();
}

bool CheckBucketCounts(store::Store& e, const Options& opt, Ctx& c) {
  const bool cut_short = c.acct_cut_short;  // (not this run's own flag: the data pass may have set it)
  if (cut_short) {
    c.report->errors++;
    c.Line("alloc: an earlier 'fsck -y' was cut short in its repair of the space accounting; %s",
           opt.repair ? "the accounting pass finishes it" : "'tierfs fsck -y' finishes it");
  }
  // Allocation state known to be wrong (bad records, -n): the data pass did
  // not check against it, nor does this one (the line above it said why).
  if (c.alloc_stale) return true;
  const sb::Superblock& s = e.sb();
  alloc::Allocator& a = e.alloc();
  auto counts = platform::Owned<data::ExtentCounts>::Make();  // (kMaxDevices Vectors: off the stack)
  if (!counts) {
    c.Line("alloc: cannot recount the buckets: out of memory");
    c.report->errors++;
    return false;
  }
  Status st = data::CountExtents(&e.btrees(), s, a, counts.get());
  if (!st.ok()) {
    c.Line("alloc: the recount of the buckets from the extents failed: %s", st.Message());
    c.report->errors++;
    return false;
  }
  Vector<alloc::CountFix> fixes;
  Vector<ForeignFix> foreign;
  for (u32 m = 0; m < s.nr_members && m < a.members(); m++) {
    const char* label = s.members[m].label;
    u64 wrong = 0, stray = 0;
    for (u64 b = 0; b < a.nbuckets(m); b++) {
      const alloc::Bucket k = a.Get(m, b);
      if (k.state != alloc::BucketState::kUser) {
        // (ParseRecord refuses counts in a free or journal bucket's record;
        // a btree or cached one may carry up to its own sectors.)
        if (k.live_sectors == 0 && k.cached_sectors == 0) continue;
        c.report->errors++;
        if (++stray <= kMaxLines)
          c.Line("alloc: member %s bucket %llu is %s, yet its record counts %u live / %u cached sectors", label,
                 (unsigned long long)b, alloc::BucketStateName(k.state), k.live_sectors, k.cached_sectors);
        if (opt.repair && !foreign.PushBack(ForeignFix{m, b, k.state}).ok()) {
          c.Line("alloc: cannot repair the counts: out of memory");
          return false;
        }
        continue;
      }
      // As the data path sets them: clamped to what a record can hold.
      const u64 most = alloc::MaxCountSectors(s, k.state);
      const u32 live = u32(Min<u64>(counts->live(m, b), most));
      const u32 cached = u32(Min<u64>(counts->cached(m, b), most));
      if (k.live_sectors == live && k.cached_sectors == cached) continue;
      c.report->errors++;
      if (++wrong <= kMaxLines)
        c.Line("alloc: member %s bucket %llu counts %u live / %u cached sectors, its extents %u / %u", label,
               (unsigned long long)b, k.live_sectors, k.cached_sectors, live, cached);
      if (opt.repair && !fixes.PushBack(alloc::CountFix{m, b, live, cached}).ok()) {
        c.Line("alloc: cannot repair the counts: out of memory");
        return false;
      }
    }
    if (wrong > kMaxLines)
      c.Line("alloc: member %s: %llu more buckets whose counts are not their extents'", label,
             (unsigned long long)(wrong - kMaxLines));
    if (stray > kMaxLines)
      c.Line("alloc: member %s: %llu more buckets that are not user with counts in their records", label,
             (unsigned long long)(stray - kMaxLines));
  }
  // The accounting totals against the recount.
  Vector<alloc::AcctValue> want, acct_fixes;
  Vector<alloc::ReplicasEntry> have;
  st = data::AcctTotals(*counts, &want);
  if (st.ok()) st = e.acct().ReplicasInto(&have);
  if (!st.ok()) {
    c.Line("alloc: cannot check the accounting totals: %s", st.Message());
    c.report->errors++;
    return false;
  }
  u64 acct_wrong = 0;
  auto acct = [&](const alloc::AcctValue& w, u64 h) -> bool {
    if (h == w.sectors) return true;
    c.report->errors++;
    if (++acct_wrong <= kMaxLines) {
      if (w.kind == alloc::AcctKind::kReserved)
        c.Line("alloc: the reserved total is %llu sectors, the unwritten extents hold %llu", (unsigned long long)h,
               (unsigned long long)w.sectors);
      else
        c.Line("alloc: the total of data on members 0x%llx is %llu sectors, its extents hold %llu",
               (unsigned long long)w.offset, (unsigned long long)h, (unsigned long long)w.sectors);
    }
    if (opt.repair && !acct_fixes.PushBack(w).ok()) {
      c.Line("alloc: cannot repair the accounting totals: out of memory");
      return false;
    }
    return true;
  };
  for (const alloc::AcctValue& w : want)
    if (!acct(w, e.acct().Get(w.kind, w.offset))) return false;
  for (const alloc::ReplicasEntry& h : have) {
    bool listed = false;
    for (const alloc::AcctValue& w : want) listed |= w.kind == alloc::AcctKind::kReplicas && w.offset == h.members;
    alloc::AcctValue gone;
    gone.kind = alloc::AcctKind::kReplicas;
    gone.offset = h.members;
    if (!listed && !acct(gone, h.sectors)) return false;  // (0 sectors: a key of 0 is normal)
  }
  if (acct_wrong > kMaxLines)
    c.Line("alloc: %llu more accounting totals that are not their extents'", (unsigned long long)(acct_wrong - kMaxLines));
  // The inode count against the inode records (after the namespace pass's
  // repairs: what they left).
  Result<u64> records = posix::CountInodeRecords(&e.btrees());
  if (!records.ok()) {
    c.Line("alloc: the count of the inode records failed: %s", records.status().Message());
    c.report->errors++;
    return false;
  }
  if (const u64 have_inodes = e.acct().inodes(); have_inodes != records.value()) {
    c.report->errors++;
    c.Line("alloc: the inode count is %llu, the inode records number %llu", (unsigned long long)have_inodes,
           (unsigned long long)records.value());
    alloc::AcctValue w;
    w.kind = alloc::AcctKind::kInodes;
    w.sectors = records.value();
    if (opt.repair && !acct_fixes.PushBack(w).ok()) {
      c.Line("alloc: cannot repair the accounting totals: out of memory");
      return false;
    }
  }
  if (!opt.repair) return true;
  if (!fixes.empty() || !foreign.empty() || !acct_fixes.empty()) {
    // Durably before the first repair: a cut from here on leaves some
    // records repaired and others not, and the mount must not trust them.
    st = BeginCountRepair(e, c);
    if (!st.ok()) {
      c.Line("alloc: recording the repair of the counts in the superblock failed: %s", st.Message());
      return false;
    }
  }
  if (!fixes.empty()) {
    st = a.RepairCounts(fixes.data(), u32(fixes.size()));
    if (!st.ok()) {
      c.Line("alloc: setting the counts of %llu buckets failed: %s", (unsigned long long)fixes.size(),
             st.Message());
      return false;
    }
    c.report->repaired += u32(fixes.size());
    c.Line("alloc: set the counts of %llu bucket%s to their extents'", (unsigned long long)fixes.size(),
           fixes.size() == 1 ? "" : "s");
  }
  u64 zeroed = 0;
  for (const ForeignFix& f : foreign) {
    // Its own state again: the counts 0, version + 1 (the data pass has
    // dropped every pointer into it).
    st = a.RepairState(f.dev, f.bucket, f.state);
    if (!st.ok()) {
      c.Line("alloc: zeroing the counts of member %s bucket %llu failed: %s", s.members[f.dev].label,
             (unsigned long long)f.bucket, st.Message());
      return false;
    }
    zeroed++;
    c.report->repaired++;
  }
  if (zeroed != 0)
    c.Line("alloc: zeroed the counts of %llu bucket%s that %s not user", (unsigned long long)zeroed,
           zeroed == 1 ? "" : "s", zeroed == 1 ? "is" : "are");
  if (!acct_fixes.empty()) {
    st = e.RepairAcct(acct_fixes.data(), u32(acct_fixes.size()), false);
    if (!st.ok()) {
      c.Line("alloc: setting %llu accounting totals failed: %s", (unsigned long long)acct_fixes.size(), st.Message());
      return false;
    }
    c.report->repaired += u32(acct_fixes.size());
    c.Line("alloc: set %llu accounting total%s to what the trees hold", (unsigned long long)acct_fixes.size(),
           acct_fixes.size() == 1 ? "" : "s");
  }
  e.EndAcctRepair();
  if (cut_short) {
    c.report->repaired++;
    c.Line("alloc: finished the repair of the space accounting the earlier 'fsck -y' left unfinished");
  }
  return true;
}

}  // namespace tfs::fsck
