// Format, open (with replay) and close of the store (see store.h).
#include "store/store.h"

#include "alloc/format.h"
#include "platform/platform.h"
#include "util/bits.h"
#include "util/sort.h"

namespace tfs::store {
namespace {

constexpr u64 kMinDataBuckets = 8;
// How far a writable degraded mount's journal starts past the newest entry
// on the rings given, at least (Store::Open, DegradedSeqGap): a missing
// ring may be ahead by every entry written since the last flush the
// members given kept (entries that are not flushed are written without
// FUA: a cut may keep them on one member's cache and not the other's), up
// to all it holds. And how far its roots gen starts past the newest found
// (a checkpoint writes the roots block to one member after another: a cut
// may leave the missing one a gen ahead).
constexpr u64 kDegradedSeqGap = 1024;

// The journal's start gap for the missing members of `sb` in `missing`:
// more than the entries the largest missing ring can hold (each takes at
// least one block), and at least kDegradedSeqGap.
u64 DegradedSeqGap(const sb::Superblock& sb, u32 missing) {
  u64 gap = kDegradedSeqGap;
  for (u32 m = 0; m < sb.nr_members; m++) {
    if (((missing >> m) & 1) == 0) continue;
    gap = Max(gap, u64(sb.members[m].journal_nbuckets) * (sb.bucket_size / journal::kJournalBlock) + 1);
  }
  return gap;
}

// An array of superblocks on the heap (each is ~4.5 KiB: too big for a kernel stack).
struct SbArray {
  explicit SbArray(u32 n)
      : p(static_cast<sb::Superblock*>(platform::Alloc(sizeof(sb::Superblock) * (n ? n : 1), 16))) {}
  ~SbArray() { platform::Free(p); }
  SbArray(const SbArray&) = delete;
  SbArray& operator=(const SbArray&) = delete;
  sb::Superblock* p;
};

}  // namespace

Status Format(const FormatMember* members, u32 count, const FormatOptions& o, Diag* diag) {
  platform::NoFsScope nofs;  // mount-time work takes the btree's locks and allocates under them
  if (count == 0) return DiagError(diag, Err::kInvalidArgument, "format: no devices given");
  if (count > sb::kSbMaxMembers)
    return DiagError(diag, Err::kInvalidArgument, "format: at most %u devices", sb::kSbMaxMembers);
  if (!IsPowerOfTwo(o.bucket_size) || o.bucket_size < sb::kMinBucket || o.bucket_size > sb::kMaxBucket)
    return DiagError(diag, Err::kInvalidArgument,
                     "format: bucket size %u must be a power of two from 64 KiB to 64 MiB", o.bucket_size);
  if (!IsPowerOfTwo(o.btree_node_size) || o.btree_node_size < sb::kMinBtreeNode ||
      o.btree_node_size > sb::kMaxBtreeNode || o.btree_node_size > o.bucket_size)
    return DiagError(diag, Err::kInvalidArgument,
                     "format: btree node size %u must be a power of two from 4 KiB to 1 MiB and at most the bucket size",
                     o.btree_node_size);
  if (o.data_replicas < 1 || o.data_replicas > 4 || o.metadata_replicas < 1 || o.metadata_replicas > 4)
    return DiagError(diag, Err::kInvalidArgument, "format: replicas must be 1..4");
  // (More data replicas than members is allowed: writes are degraded --
  // fewer copies, counted -- until members are added.)

  // A device set in member order: validates labels and resolves targets.
  // It and the allocator are big: on the heap (the kernel's 2 KiB frames).
  auto devs_owned = platform::Owned<dev::DeviceSet>::Make();
  if (!devs_owned) return Err::kNoMemory;
  dev::DeviceSet& devs = *devs_owned;
  for (u32 i = 0; i < count; i++) {
    if (members[i].bdev == nullptr || members[i].label == nullptr)
      return DiagError(diag, Err::kInvalidArgument, "format: device %u has no label", i + 1);
    if (members[i].bdev->Info().read_only)
      return DiagError(diag, Err::kReadOnly, "format: %s is read-only", members[i].bdev->Name());
    Result<dev::Member*> m = devs.Add(members[i].bdev, members[i].label, dev::QueueConfig{});
    if (!m.ok())
      return DiagError(diag, m.status(), "format: %s: bad or duplicate label '%s' (use [a-z0-9_-], optionally group.name)",
                       members[i].bdev->Name(), members[i].label);
    if (members[i].durability > 4)
      return DiagError(diag, Err::kInvalidArgument, "format: %s: durability must be 0..4", members[i].label);
  }
  const char* targets[] = {o.foreground_target, o.background_target, o.promote_target, o.metadata_target};
  const char* names[] = {"foreground", "background", "promote", "metadata"};
  dev::DevMask masks[4] = {};
  for (int t = 0; t < 4; t++) {
    if (targets[t] != nullptr && StrLen(targets[t]) >= sb::kSbTargetLen)
      return DiagError(diag, Err::kNameTooLong, "format: %s target too long", names[t]);
    Result<dev::DevMask> r = devs.ResolveTarget(targets[t] == nullptr ? "" : targets[t]);
    if (!r.ok())
      return DiagError(diag, Err::kNotFound, "format: %s target '%s' names no device or group", names[t], targets[t]);
    masks[t] = *r;
  }
  dev::DevMask meta = masks[3] != 0 ? masks[3] : masks[0] != 0 ? masks[0] : devs.all();
  if (u32(PopCount(meta)) < o.metadata_replicas)
    return DiagError(diag, Err::kInvalidArgument, "format: %u metadata replicas need that many metadata devices",
                     unsigned(o.metadata_replicas));

  SbArray holder(1);
  if (holder.p == nullptr) return Err::kNoMemory;
  sb::Superblock& s = *holder.p;
  MemSet(&s, 0, sizeof(s));
  sb::NewUuid(s.fs_uuid);
  s.seq = 1;
  s.flags = sb::kSbClean;  // (the features: at the first read-write open that asks for them)
  s.bucket_size = o.bucket_size;
  s.btree_node_size = o.btree_node_size;
  s.block_size = 4096;
  s.journal_seq = 1;
  StrCopyPadded(s.options.foreground_target, o.foreground_target, sb::kSbTargetLen);
  StrCopyPadded(s.options.background_target, o.background_target, sb::kSbTargetLen);
  StrCopyPadded(s.options.promote_target, o.promote_target, sb::kSbTargetLen);
  StrCopyPadded(s.options.metadata_target, o.metadata_target, sb::kSbTargetLen);
  s.options.data_replicas = o.data_replicas;
  s.options.metadata_replicas = o.metadata_replicas;
  s.options.checksum = o.checksum;
  s.options.compression = o.compression;
  s.nr_members = count;

  for (u32 i = 0; i < count; i++) {
    sb::Member& m = s.members[i];
    BlockDevice* bdev = members[i].bdev;
    sb::NewUuid(m.uuid);
    StrCopyPadded(m.label, members[i].label, sb::kSbLabelLen);
    u64 size = bdev->Size();
    u64 nbuckets = size > sb::kBucketsOffset ? (size - sb::kBucketsOffset) / o.bucket_size : 0;
    bool is_meta = (meta >> i) & 1;
    u64 journal = 0;
    if (is_meta) {
      if (o.journal_buckets != 0 && o.journal_buckets < journal::kMinRingBuckets)
        return DiagError(diag, Err::kInvalidArgument, "format: a journal needs at least %u buckets, not %u",
                         journal::kMinRingBuckets, unsigned(o.journal_buckets));
      journal = o.journal_buckets != 0 ? o.journal_buckets : Min<u64>(Max<u64>(nbuckets / 64, 8), 256);
    }
    u64 need = journal + kMinDataBuckets;
    if (nbuckets < need) {
      u64 min_bytes = sb::kBucketsOffset + need * o.bucket_size;
      return DiagError(diag, Err::kNoSpace, "format: %s is too small: %llu bytes, need at least %llu with %u KiB buckets",
                       bdev->Name(), (unsigned long long)size, (unsigned long long)min_bytes,
                       unsigned(o.bucket_size >> 10));
    }
    m.size = sb::kBucketsOffset + nbuckets * o.bucket_size;
    m.nbuckets = nbuckets;
    m.journal_first_bucket = 0;  // (the ring is the layout's only bucket range)
    m.journal_nbuckets = u32(journal);
    m.durability = members[i].durability;
    m.data_allowed = is_meta ? sb::kDataAll : sb::kDataUser;
  }

  // The roots block first, superblocks last: the superblock makes it a
  // filesystem. No allocation record: every bucket is in the state an absent
  // record means (its journal ring's, or free).
  Status st = btree::FormatRoots(devs, s);
  if (!st.ok()) return DiagError(diag, st, "format: writing the btree roots: %s", st.Message());
  s.roots_gen = btree::kFormatRootsGen;
  for (u32 i = 0; i < count; i++) {
    st = sb::Write(*members[i].bdev, s, u16(i));
    if (!st.ok())
      return DiagError(diag, st, "format: writing the superblock of %s: %s", members[i].bdev->Name(), st.Message());
  }
  return Status::Ok();
}

Store::MissingDevices::~MissingDevices() {
  for (dev::MissingDevice*& p : d) {
    platform::Delete(p);
    p = nullptr;
  }
}

Status Store::CheckDegradedMetadata(Diag* diag) const {
  const dev::DevMask missing = devs_.missing();
  // The journal: an entry goes to metadata_replicas rings (Journal::Start
  // caps it at the rings there are); with fewer rings missing than that,
  // each entry is on a ring given. (A clean filesystem replays nothing.)
  u32 rings = 0, rings_missing = 0;
  for (u32 m = 0; m < sb_.nr_members; m++) {
    if (sb_.members[m].journal_nbuckets == 0) continue;
    rings++;
    if ((missing >> m) & 1) rings_missing++;
  }
  const u32 per_entry = Min<u32>(Max<u32>(sb_.options.metadata_replicas, 1), rings);
  if (!sb_.clean() && rings_missing >= per_entry)
    return DiagError(diag, Err::kNotFound,
                     "-o degraded: the filesystem was not cleanly unmounted and %u of its %u journal rings are "
                     "missing, but each entry is on %u: entries may have no copy on the members given",
                     rings_missing, rings, per_entry);
  // The btree: a node written whole has copies whose durabilities reach
  // metadata_replicas; the missing members that may hold nodes must not
  // reach it, or a node may have every copy among them.
  u32 missing_durability = 0;
  for (u32 m = 0; m < sb_.nr_members; m++)
    if (((missing >> m) & 1) && (sb_.members[m].data_allowed & sb::kDataBtree) != 0)
      missing_durability += sb_.members[m].durability;
  if (missing_durability >= Max<u32>(sb_.options.metadata_replicas, 1))
    return DiagError(diag, Err::kNotFound,
                     "-o degraded: the missing members hold btree nodes with durability %u, and a node's copies "
                     "need only reach %u: nodes may have no copy on the members given",
                     missing_durability, unsigned(Max<u32>(sb_.options.metadata_replicas, 1)));
  return Status::Ok();
}

Status Store::CheckDegradedData(Diag* diag) const {
  const dev::DevMask missing = devs_.missing();
  if (missing == 0) return Status::Ok();
  Vector<alloc::ReplicasEntry> sets;
  TFS_TRY(acct_.ReplicasInto(&sets));
  const alloc::CopiesSummary c = alloc::SummarizeCopies(sets.data(), sets.size(), missing);
  if (c.unavailable == 0) return Status::Ok();
  return DiagError(diag, Err::kNotFound,
                   "-o degraded: %llu KiB of file data has every copy on the missing members (%u set%s of "
                   "members); mount with them",
                   (unsigned long long)(c.unavailable / 2), c.unavailable_sets, c.unavailable_sets == 1 ? "" : "s");
}

Store::~Store() {
  Status st = Close();
  if (!st.ok()) platform::Log(platform::LogLevel::kError, "store: close failed: %s", st.Message());
}

Status Store::Open(BlockDevice* const* bdevs, u32 count, const OpenOptions& options, Diag* diag,
                    OpenReport* report) {
  platform::NoFsScope nofs;  // replay applies keys under the btree's locks
  if (open_) return Err::kBusy;
  if (count == 0 || count > sb::kSbMaxMembers)
    return DiagError(diag, Err::kInvalidArgument, "open: need 1..%u devices", sb::kSbMaxMembers);
  OpenReport local;
  OpenReport& rep = report != nullptr ? *report : local;
  SbArray sbs(count);
  if (sbs.p == nullptr) return Err::kNoMemory;
  for (u32 i = 0; i < count; i++) {
    Result<sb::ReadResult> r = sb::Read(*bdevs[i], &sbs.p[i], diag);
    if (!r.ok()) return r.status();
    if (r->used_backup) rep.used_backup_sb++;
  }
  u32 order[sb::kSbMaxMembers];
  u32 missing = 0;
  Diag md;
  if (Status cst = sb::CheckMembers(sbs.p, count, order, &md, &missing); !cst.ok()) {
    if (diag != nullptr) *diag = md;
    return cst;
  }
  if (missing != 0 && !options.degraded)
    return DiagError(diag, Err::kNotFound,
                     "%s (a degraded mount, tierfs mount -o degraded, goes on without them when every journal "
                     "entry, btree node and extent has a copy on the members given)",
                     md.text);
  // Two members each written by a degraded mount without the other hold
  // two histories: neither superblock can say which is the filesystem.
  for (u32 i = 0; i < count; i++) {
    for (u32 j = i + 1; j < count; j++) {
      const sb::Superblock& a = sbs.p[i];
      const sb::Superblock& b = sbs.p[j];
      if (((a.degraded_missing >> b.dev_idx) & 1) == 0 || ((b.degraded_missing >> a.dev_idx) & 1) == 0) continue;
      return DiagError(diag, Err::kInvalidArgument,
                       "members %s and %s were each mounted writable without the other (-o degraded): their "
                       "changes have diverged and cannot be merged; mount with -o degraded and only the members "
                       "whose changes to keep",
                       a.members[a.dev_idx].label, b.members[b.dev_idx].label);
    }
  }
  u32 newest = 0;
  for (u32 i = 1; i < count; i++) {
    if (sbs.p[i].seq > sbs.p[newest].seq) newest = i;
  }
  sb_ = sbs.p[newest];
  acct_flag_durable_ = (sb_.flags & sb::kSbAcctRepair) != 0;
  read_only_ = options.read_only;

  for (u32 m = 0; m < sb_.nr_members; m++) {
    BlockDevice* bdev = nullptr;
    if ((missing >> m) & 1) {
      char name[48];
      (void)platform::Format(name, sizeof(name), "missing(%s)", sb_.members[m].label);
      missing_devs_.d[m] = platform::New<dev::MissingDevice>(sb_.members[m].size, name);
      if (missing_devs_.d[m] == nullptr) return Err::kNoMemory;
      bdev = missing_devs_.d[m];
    } else {
      bdev = bdevs[order[m]];
    }
    Result<dev::Member*> r = devs_.Add(bdev, sb_.members[m].label, options.queue);
    if (!r.ok()) return DiagError(diag, r.status(), "open: member %s: %s", sb_.members[m].label, r.status().Message());
  }
  devs_.SetMissing(missing);
  if (missing != 0) {
    TFS_TRY(CheckDegradedMetadata(diag));
    platform::Log(platform::LogLevel::kWarn, "degraded: %s; every read of theirs fails over to another copy",
                  md.text);
  }
  // The allocator starts with every bucket in its absent-record state; it is
  // loaded from the alloc btree after replay. Its changes are records of the
  // trees (PersistAlloc): before the journal runs, in memory only, written
  // by the mount's checkpoint.
  TFS_TRY(alloc_.Init(sb_));
  alloc_.SetUnavailable(devs_.missing());  // (nothing is allocated on a missing member)
  alloc_.WatchFailed(devs_.failed_mask());  // (nor on one failed while mounted: step 5c-3)
  devs_.SetOnFailed(OnMemberFailed, this);  // (its superblocks: the health thread)
  {
    dev::DevMask rings = 0, btree = 0;
    for (u32 m = 0; m < sb_.nr_members; m++) {
      if (sb_.members[m].journal_nbuckets != 0) rings |= dev::DevMask(1) << m;
      if ((sb_.members[m].data_allowed & sb::kDataBtree) != 0) btree |= dev::DevMask(1) << m;
    }
    devs_.SetVitalGroups(rings, btree);  // (never the last ring's or btree member's mark)
  }
  TFS_TRY(acct_.Init(sb_));
  alloc_.SetPersist(PersistAlloc, this);
  rep.was_clean = sb_.clean();
  rep.lost_data_btrees = sb_.lost_data_btrees;
  rep.features = u16(sb_.flags & sb::kSbFeatureFlags);
  const bool degraded = devs_.missing() != 0;
  // A degraded mount is read-only, but not the leniency read-only opens get
  // for show and fsck -n: state known to be older or incomplete than what
  // was acknowledged (a cut-short repair, lost journal entries, roots older
  // than proved durable -- whose newer copy may be on the missing member)
  // refuses it, naming why.
  auto refuse_degraded = [&](const char* why) {
    return DiagError(diag, Err::kCorrupt, "-o degraded: %s; mount with every member", why);
  };
  if (degraded && rep.lost_data_btrees != 0) return refuse_degraded("a repair of damaged nodes was cut short");
  if (rep.lost_data_btrees != 0) {
    if (!read_only_ && !options.btree.drop_bad_nodes) {
      return DiagError(diag, Err::kCorrupt,
                       "btree: a repair of damaged nodes (trees 0x%x) was cut short before it finished; run "
                       "'tierfs fsck -y' to finish it",
                       unsigned(rep.lost_data_btrees));
    }
    platform::Log(platform::LogLevel::kWarn,
                  "btree: a repair of damaged nodes (trees 0x%x) was cut short before it finished",
                  unsigned(rep.lost_data_btrees));
  }
  if ((sb_.flags & sb::kSbAcctRepair) != 0) {
    // fsck -y's accounting pass was cut short: some buckets' counts may be
    // set and others not (sb/format.h). Only fsck's open goes on writable.
    if (!read_only_ && !options.btree.drop_bad_nodes)
      return DiagError(diag, Err::kCorrupt, "a repair of the space accounting was cut short; run 'tierfs fsck -y'");
    platform::Log(platform::LogLevel::kWarn, "a repair of the space accounting was cut short");
  }
  if (!rep.was_clean) {
    const bool past = options.replay_past_damage && options.rebuild_alloc != nullptr && !read_only_;
    TFS_TRY(journal::ReadForReplay(devs_, sb_, &rep.replay, diag, past));
    const journal::ReplayResult& rr = rep.replay;
    if (degraded && rr.durable_end != 0)
      return refuse_degraded("a journal entry is damaged and acknowledged entries after it would be lost");
    if (rr.durable_end != 0 && !read_only_ && !past) {
      return DiagError(diag, Err::kCorrupt,
                       "journal: entry %llu is damaged, but later entries up to %llu were durable: %llu "
                       "acknowledged entries are lost and the ones after them cannot be replayed alone; run "
                       "'tierfs fsck -y' to replay what survives and repair the rest",
                       (unsigned long long)rr.gap_at, (unsigned long long)rr.durable_end,
                       (unsigned long long)rr.lost_entries);
    }
    rep.replayed_past_damage = past && rr.durable_end != 0;
  }
  const bool can_rebuild_roots =
      options.rebuild_roots && options.rebuild_alloc != nullptr && options.btree.drop_bad_nodes && !read_only_;
  // (Off the stack: 8 node pointers of 72 bytes; the kernel's frames are 2 KiB.)
  platform::Owned<btree::Roots> roots_owned = platform::Owned<btree::Roots>::Make();
  if (!roots_owned) return Err::kNoMemory;
  btree::Roots& roots = *roots_owned;
  Diag rd;
  Status rst = btree::ReadRoots(devs_, sb_, &roots, &rd);
  if (!rst.ok() && !(can_rebuild_roots && rst.Is(ErrorClass::kCorrupt))) {
    if (diag != nullptr) *diag = rd;
    return rst;
  }
  for (u32 m = 0; rst.ok() && m < sb_.nr_members; m++) {
    if (roots.stale_since[m] == 0) continue;
    platform::Log(platform::LogLevel::kWarn,
                  "btree roots: member %s is stale: it missed roots gens %llu..%llu (the newest: gen %llu), so its "
                  "copies of nodes written then may be damaged; reads use the other copies, and fsck -y rewrites "
                  "them",
                  sb_.members[m].label, (unsigned long long)roots.stale_since[m],
                  (unsigned long long)roots.stale_until[m], (unsigned long long)roots.gen);
  }
  if (!rst.ok()) {  // no valid roots block at all: every tree from the scan
    rep.stale_roots = true;
    rep.stale_why = rd;
    roots = btree::Roots{};
    roots.gen = sb_.roots_gen;
    for (u32 t = 0; t < btree::kNrBtreeIds; t++) roots.roots[t] = btree::EmptyPtr(u8(t));
  }
  CheckCurrent(roots, rep);
  if (degraded && rep.stale_roots) return refuse_degraded("the roots block found is older than the filesystem");
  // A member given that is stale may lack copies the missing ones have.
  for (u32 m = 0; degraded && rst.ok() && m < sb_.nr_members; m++) {
    if (roots.stale_since[m] == 0 || ((devs_.missing() >> m) & 1) != 0) continue;
    return DiagError(diag, Err::kNotFound,
                     "-o degraded: member %s is stale (it missed roots gen %llu and maybe later ones), so nodes may have "
                     "no copy on the members given; mount with every member and run 'tierfs fsck -y'",
                     sb_.members[m].label, (unsigned long long)roots.stale_since[m]);
  }
  // A node written degraded (fewer copies than metadata_replicas: a member
  // without room, 5b-2) may have its only copy on a missing member; the
  // roots block counts them per member holding a copy.
  for (u32 m = 0; degraded && rst.ok() && m < sb_.nr_members; m++) {
    if (((devs_.missing() >> m) & 1) == 0 || roots.degraded_on[m] == 0) continue;
    return DiagError(diag, Err::kNotFound,
                     "-o degraded: %u btree node%s written with fewer copies than metadata_replicas ha%s a copy on "
                     "the missing member %s and maybe no other; mount with every member",
                     roots.degraded_on[m], roots.degraded_on[m] == 1 ? "" : "s",
                     roots.degraded_on[m] == 1 ? "s" : "ve", sb_.members[m].label);
  }
  if (rep.stale_roots && !read_only_ && !can_rebuild_roots) {
    if (diag != nullptr) *diag = rep.stale_why;
    return Err::kCorrupt;
  }
  if (rep.stale_roots) platform::Log(platform::LogLevel::kError, "%s", rep.stale_why.text);
  btree::Options bopt = options.btree;
  bopt.read_only = read_only_;
  if (rep.stale_roots && can_rebuild_roots) {
    // The next roots block must not be older than the one proved durable.
    roots.gen = Max(roots.gen, Max(sb_.roots_gen, rep.replay.roots_gen));
    // Every entry the ring still holds is replayed over the copies (which may
    // be older than the stale block): in order, replaying one twice is harmless.
    roots.journal_seq = 0;
    bopt.rebuild_from_scan = true;
    rep.roots_rebuilt = true;
    platform::Log(platform::LogLevel::kWarn, "btree roots: rebuilding every tree from a node scan");
  }
  // The node scan (drop_bad_nodes) reads the buckets the allocator calls
  // free or btree: it gets the state known before replay.
  loading_roots_ = &roots;
  loading_replay_ = &rep.replay;
  loading_rep_ = &rep;
  if (bopt.drop_bad_nodes) {
    bopt.before_scan = LoadAllocForScan;
    bopt.before_scan_ctx = this;
  }
  auto fail = [&](Status st) {
    btrees_.Abandon();  // (writes nothing: the allocator may not be loaded yet)
    loading_roots_ = nullptr;
    loading_replay_ = nullptr;
    loading_rep_ = nullptr;
    return st;
  };
  // A missing member may hold a roots block a gen ahead of the newest
  // found (a cut between the members' roots writes): a writable degraded
  // mount's blocks start well past it, so that when the member returns
  // its block never ties with one of this mount's (ReadRoots takes the
  // lower member index on a tie) and it is marked stale.
  if (degraded && !read_only_) roots.gen += kDegradedSeqGap;
  Status st = btrees_.Open(&devs_, &alloc_, sb_, roots, bopt, diag);
  if (!st.ok()) return fail(st);
  // Replay: every btree key, the allocation records among them.
  for (const journal::ReplayedEntry& e : rep.replay.entries) {
    st = journal::ForEachKey(e, ApplyBtreeKey, this);
    if (!st.ok()) return fail(DiagError(diag, st, "journal entry %llu: %s", (unsigned long long)e.seq, st.Message()));
    rep.replayed_keys += e.nkeys;
  }
  // The allocator: one walk of the alloc btree.
  Diag why;
  st = LoadAlloc(false, rep, &why);
  if (!st.ok()) {
    const char* what = why.empty() ? st.Message() : why.text;
    if (!st.Is(ErrorClass::kCorrupt))
      return fail(DiagError(diag, st, "alloc: loading the allocation records: %s", what));
    // A damaged node of the alloc tree (the mount reads no leaf before this
    // walk): one line naming it. fsck -y drops it and rebuilds the state.
    return fail(DiagError(diag, st, "alloc: %s; run 'tierfs fsck -y' to drop it and rebuild the allocation state",
                          what));
  }
  if (rep.bad_alloc_records != 0) {
    platform::Log(platform::LogLevel::kError, "%s (%llu bad allocation record%s)", rep.alloc_why.text,
                  (unsigned long long)rep.bad_alloc_records, rep.bad_alloc_records == 1 ? "" : "s");
    if (!read_only_ && options.rebuild_alloc == nullptr) {
      return fail(DiagError(diag, Err::kCorrupt, "%s; run 'tierfs fsck -y' to rebuild the allocation state",
                            rep.alloc_why.text));
    }
  }
  st = alloc_.Finish();
  if (!st.ok()) return fail(st);
  // (One line, the same in the log and in a refusal's Diag.)
#define TFS_ACCT_MISMATCH                                                                                  \
  "alloc: the space accounting disagrees with the bucket records (replicas totals: %llu sectors, buckets: " \
  "%llu); run 'tierfs fsck -y' to recount it from the extents",                                            \
      (unsigned long long)rep.acct_replicas_sectors, (unsigned long long)rep.acct_bucket_sectors
  bool acct_checked = false;
  if (options.data_counts) acct_checked = CheckAccounting(rep);
  if (rep.acct_mismatch) platform::Log(platform::LogLevel::kError, TFS_ACCT_MISMATCH);
  if (devs_.missing() != 0) {
    // The data's copies, from the accounting (exact per set of members):
    // only when it was checked against the buckets and agrees.
    if (!acct_checked || rep.acct_mismatch)
      return fail(DiagError(diag, Err::kNotFound,
                            "-o degraded: the space accounting %s, so which data has a copy on the members given "
                            "is not known; mount with every member",
                            acct_checked ? "disagrees with the bucket records" : "could not be checked"));
    st = CheckDegradedData(diag);
    if (!st.ok()) return fail(st);
  }
  if (!read_only_) {
    u64 next_seq = rep.was_clean ? sb_.journal_seq : Max(rep.replay.next_seq, sb_.journal_seq);
    // A missing member's ring may hold entries the rings given lack (those
    // written since the last flush the members given kept: DegradedSeqGap).
    // This mount's entries start past all it can hold, so that when the
    // member returns replay never meets two entries of one seq (the
    // superblock's floor, written below, is the new start).
    if (degraded) {
      next_seq += DegradedSeqGap(sb_, devs_.missing());
      // Said before anything else is written: a member given that carries
      // it and a missing one that was written without it are told apart
      // even after a cut right after this (the refusal above).
      sb_.degraded_missing = devs_.missing();
      sb_.seq++;
      st = WriteSuperblocks();
      if (!st.ok()) return fail(DiagError(diag, st, "open: recording the degraded mount: %s", st.Message()));
    }
    // Entries lost in the journal may have held allocation changes the
    // replayed ones depend on: the trees decide. So may the keys of damaged
    // nodes fsck dropped (btree::Options::drop_bad_nodes), and the buckets
    // of bad records.
    const bool dropped = !btrees_.lost_nodes().empty();
    if (rep.bad_alloc_records != 0 || rep.replayed_past_damage || dropped) {
      st = options.rebuild_alloc != nullptr
               ? options.rebuild_alloc(options.rebuild_ctx, *this)
               : Status(Err::kInvalidArgument);  // drop_bad_nodes read-write without a rebuild: a caller's bug
      if (st.ok()) st = DeleteBadAllocKeys();
      if (!st.ok()) return fail(DiagError(diag, st, "open: rebuilding the allocation state: %s", st.Message()));
      rep.alloc_rebuilt = true;
      // (The rebuild's totals and counts come from one walk; they differ
      // only where extents point into node buckets, which the data pass
      // drops. Nothing is refused or freed in fsck's open anyway.)
      if (options.data_counts) acct_checked = CheckAccounting(rep);
    }
    if (rep.acct_mismatch && options.rebuild_alloc == nullptr) {
      // Counts the mount would trust (it frees the buckets they call empty)
      // that the accounting contradicts: fsck recounts both from the extents.
      return fail(DiagError(diag, Err::kCorrupt, TFS_ACCT_MISMATCH));
    }
    // The buckets the newest replayed group's data checks read stay off the
    // free list until the superblock below moves the journal past it: a
    // cut before that makes the next mount check the group again, so the
    // checkpoint must not write nodes there (review of 3b-5b). After the
    // loads and the rebuild (Finish rebuilds the lists), before anything
    // allocates.
    const u64 taken_before = alloc_.HeldTaken();
    st = HoldCheckedBuckets(rep);
    if (!st.ok()) return fail(DiagError(diag, st, "open: holding the checked buckets: %s", st.Message()));
    // Node buckets against the trees: a btree bucket no tree reaches is
    // freed, one holding nodes is marked (whatever a cut left between a
    // checkpoint's allocations and their records), before anything allocates.
    st = btrees_.ReconcileBuckets();
    if (!st.ok()) return fail(DiagError(diag, st, "open: reconciling node buckets: %s", st.Message()));
    // Versions near the validity limit start again (alloc/format.h); the
    // checkpoint below must write them before the journal runs.
    Result<u64> rebased = alloc_.RebaseVersions();
    if (!rebased.ok())
      return fail(DiagError(diag, rebased.status(), "open: rebasing allocation versions: %s",
                            rebased.status().Message()));
    // (A degraded one's roots gen moved on, Btrees::Open above: the block
    // of that gen must be durable before the superblock below names it.)
    if (degraded) btrees_.NoteRootsChanged();
    if (!rep.was_clean || dropped || rep.alloc_rebuilt || rebased.value() != 0 || degraded) {
      // Persist what replay applied: the journal restarts at the ring starts.
      // (And the nodes that replaced dropped ones, and a rebuild's records.)
      if (dropped) {
        // Right before the first write of a tree without the dropped nodes
        // (until then the next fsck drops the same nodes again): a cut from
        // here until fsck's namespace pass has repaired what they held leaves
        // the next fsck the knowledge that the trees lost keys (which inodes
        // to recreate rather than delete the names and data of).
        for (const btree::LostNode& ln : btrees_.lost_nodes()) sb_.lost_data_btrees |= u32(1) << ln.btree_id;
        sb_.flags &= u16(~sb::kSbClean);
        sb_.seq++;
        st = WriteSuperblocks();
        if (!st.ok()) return fail(DiagError(diag, st, "open: recording the dropped nodes: %s", st.Message()));
      }
      st = btrees_.Checkpoint();
      if (!st.ok()) return fail(DiagError(diag, st, "open: persisting replayed state: %s", st.Message()));
    }
    sb_.journal_seq = next_seq;
    sb_.flags &= u16(~sb::kSbClean);
    // Every superblock this mount writes says which members it went on
    // without (0 with every member: a returned member is whole again).
    sb_.degraded_missing = devs_.missing();
    // The incompatible features the caller's writes may use: builds that do
    // not know them refuse the filesystem from this write on (sb/format.h).
    sb_.flags |= u16(options.features & sb::kSbFeatureFlags);
    sb_.seq++;
    sb_.roots_gen = btrees_.roots().gen;
    st = WriteSuperblocks();
    if (!st.ok()) return fail(st);
    if (rep.held_buckets != 0) {
      alloc_.ReleaseHeld();
      rep.held_taken = alloc_.HeldTaken() - taken_before;
      if (rep.held_taken != 0)
        platform::Log(platform::LogLevel::kWarn,
                      "alloc: the mount's checkpoint found no free bucket but the %llu held for the newest "
                      "journal group's data checks, and took them (a cut before its superblock could have lost "
                      "that group)",
                      (unsigned long long)rep.held_taken);
    }
    st = journal_.Start(&devs_, sb_, next_seq, options.journal);
    if (!st.ok()) return fail(st);
    journal_started_ = true;
    alloc_.SetJournal(&journal_);
    btrees_.AttachJournal(&journal_);
    journal_.SetReclaimHook(ReclaimHook, this);
    // User buckets whose records count nothing (emptied by a punch whose
    // free a cut or a failed commit lost): freed now that the journal runs,
    // so they wait on the pending list until their free is settled -- not
    // before (review of 3b-5b, finding 1: straight to the free list, the
    // mount's checkpoint could write nodes into one before the superblock,
    // over data a replayed group's data check still reads). Only on counts
    // checked against the accounting, and never in fsck's open (it has not
    // recounted yet: the next mount frees) nor over a repair cut short.
    if (options.data_counts && acct_checked && !rep.acct_mismatch && options.rebuild_alloc == nullptr &&
        (sb_.flags & sb::kSbAcctRepair) == 0) {
      Result<u64> freed = alloc_.FreeEmptyUserBuckets();
      if (freed.ok()) {
        rep.empty_freed = freed.value();
        if (rep.empty_freed != 0)
          platform::Log(platform::LogLevel::kInfo, "alloc: freed %llu user bucket%s whose records counted nothing",
                        (unsigned long long)rep.empty_freed, rep.empty_freed == 1 ? "" : "s");
      } else {
        platform::Log(platform::LogLevel::kWarn, "alloc: freeing the user buckets whose records count nothing "
                      "failed: %s; the next mount frees them", freed.status().Message());
      }
    }
  }
  loading_roots_ = nullptr;
  loading_replay_ = nullptr;
  loading_rep_ = nullptr;
  if (!read_only_) {
    {
      MutexLock l(health_mu_);
      health_stop_ = false;
      health_named_ = 0;
      health_status_ = Status::Ok();
      health_running_ = true;
    }
    const Status hst = health_.Start(HealthMain, this, "tierfs-health");
    if (!hst.ok()) {
      MutexLock l(health_mu_);
      health_running_ = false;
    }
    if (!hst.ok())
      platform::Log(platform::LogLevel::kWarn,
                    "store: no health thread (%s): a member that fails while mounted is named in the "
                    "superblocks at the unmount only",
                    hst.Message());
  }
  open_ = true;
  return Status::Ok();
#undef TFS_ACCT_MISMATCH
}

void Store::OnMemberFailed(void* self) {
  auto* e = static_cast<Store*>(self);
  MutexLock l(e->health_mu_);
  e->health_cv_.Broadcast();
}

// Writes the superblocks whenever a member was marked failed since the last
// write, naming it in degraded_missing (5c-3); on a stop, after the marks
// made before it are written.
void Store::HealthMain(void* self) {
  auto* e = static_cast<Store*>(self);
  MutexLock l(e->health_mu_);
  for (;;) {
    const dev::DevMask failed = e->devs_.failed();  // (marks only grow)
    if (failed == e->health_named_) {
      if (e->health_stop_) {
        e->health_running_ = false;
        e->health_cv_.Broadcast();
        return;
      }
      e->health_cv_.Wait(e->health_mu_);
      continue;
    }
    e->health_mu_.Unlock();
    Status st;
    {
      MutexLock s(e->sb_mu_);
      st = e->NameFailedMembersLocked();
    }
    if (!st.ok())
      platform::Log(platform::LogLevel::kError,
                    "store: writing the superblocks that name the failed members failed: %s (the unmount tries "
                    "again)",
                    st.Message());
    e->health_mu_.Lock();
    e->health_named_ = failed;
    e->health_status_ = st;
    e->health_cv_.Broadcast();
  }
}

void Store::StopHealth() {
  {
    MutexLock l(health_mu_);
    health_stop_ = true;
    health_cv_.Broadcast();
  }
  health_.Join();
}

Status Store::SyncFailedMembers() {
  MutexLock l(health_mu_);
  while (health_running_ && devs_.failed() != health_named_) health_cv_.Wait(health_mu_);
  return health_status_;
}

void Store::ReclaimHook(void* self, u64 seq) {
  auto* e = static_cast<Store*>(self);
  btree::Btrees::ReclaimHook(&e->btrees_, seq);
}

Status Store::ApplyBtreeKey(void* self, u64 seq, const journal::Key& key) {
  auto* e = static_cast<Store*>(self);
  switch (key.type) {
    case journal::kKeyBtree:
      return e->btrees_.ApplyReplayed(seq, key);
    case journal::kKeyDataCheck:
      return Status::Ok();  // for ReadForReplay only
    default:
      platform::Log(platform::LogLevel::kError, "journal: unknown key type %u", unsigned(key.type));
      return Err::kCorrupt;
  }
}

Status Store::LoadAlloc(bool journal_keys, OpenReport& rep, Diag* why) {
  alloc_.BeginLoad();
  acct_.BeginLoad();
  rep.alloc_records = 0;
  rep.bad_alloc_records = 0;
  rep.alloc_why = Diag{};
  bad_alloc_keys_.Clear();
  Status load_error;  // not a bad key: the load could not take a good one (no memory)
  auto take = [&](const btree::Pos& pos, const void* val, u32 len) {
    Diag d;
    // Accounting keys above the members' range (a bad one: the rebuild
    // rewrites them all, Store::RepairAcct), bucket records below.
    const bool acct = alloc::IsAcctKey(pos.inode);
    Status st = acct ? acct_.LoadKey(pos.inode, pos.offset, val, len, &d)
                     : alloc_.LoadRecord(pos.inode, pos.offset, val, len, &d);
    if (st.ok()) {
      rep.alloc_records++;
      return;
    }
    if (!st.Is(ErrorClass::kCorrupt)) {
      if (load_error.ok()) load_error = st;
      return;
    }
    rep.bad_alloc_records++;
    if (rep.alloc_why.empty()) rep.alloc_why = d;
    if (!acct && (pos.inode >= sb_.nr_members || pos.offset >= sb_.members[pos.inode].nbuckets))
      bad_alloc_keys_.PushBack(pos).IgnoreError();  // (without memory: left for the next fsck)
  };
  btree::Iterator it(&btrees_, btree::kBtreeAlloc, 1024);
  it.SetDiag(why);
  Status st;
  for (st = it.SeekToFirst(); st.ok() && it.Valid(); st = it.Next()) take(it.pos(), it.value(), it.val_bytes());
  if (!st.ok()) return st;
  TFS_TRY(load_error);
  if (!journal_keys || loading_replay_ == nullptr || loading_roots_ == nullptr) return Status::Ok();
  // The records replay will apply (newer versions win, as in the tree).
  struct Ctx {
    Store* e;
    decltype(take)* load;
    static Status Key(void* c, u64 seq, const journal::Key& key) {
      auto* x = static_cast<Ctx*>(c);
      if (key.type != journal::kKeyBtree || seq <= x->e->loading_roots_->journal_seq ||
          key.len < sizeof(btree::KeyHeader))
        return Status::Ok();
      const auto* h = static_cast<const btree::KeyHeader*>(key.val);
      const btree::Pos pos = btree::KeyRef(h).pos();
      if (pos.btree_id != btree::kBtreeAlloc || h->type != btree::kKeyValue ||
          btree::KeySpace(h->val_bytes.get()) > key.len)
        return Status::Ok();
      (*x->load)(pos, h + 1, h->val_bytes.get());
      return Status::Ok();
    }
  } ctx{this, &take};
  for (const journal::ReplayedEntry& e : loading_replay_->entries) TFS_TRY(journal::ForEachKey(e, Ctx::Key, &ctx));
  return load_error;
}

Status Store::LoadAllocForScan(void* self) {
  auto* e = static_cast<Store*>(self);
  if (e->loading_rep_ == nullptr) return Status::Ok();
  OpenReport scratch;  // (the counts that matter are the load's after replay)
  return e->LoadAlloc(true, scratch);
}

Status Store::RepairAcct(const alloc::AcctValue* want, u32 n, bool whole) {
  // Room first: once the keys are committed, memory must follow (a hook
  // staging from the old totals would undo the repair).
  TFS_TRY(acct_.MakeRoom(n));
  btree::Transaction tx(&btrees_);
  auto queue = [&](auto&& op) -> Status {  // one key; a full entry is committed first
    Status st = op();
    if (st.code() == Err::kTooBig && tx.size() > 0) {
      TFS_TRY(tx.Commit().status());
      st = op();
    }
    return st;
  };
  if (whole) {
    // Every accounting key the tree holds that want[] does not set: gone
    // (bad ones included -- the load skipped them).
    // (Listed first, deleted after: no commit under the walk.)
    Vector<btree::Pos> drop;
    btree::Iterator it(&btrees_, btree::kBtreeAlloc, 256);
    Status st;
    for (st = it.Seek(btree::Pos{btree::kBtreeAlloc, alloc::kAcctInodeBase, 0}); st.ok() && it.Valid();
         st = it.Next()) {
      const btree::Pos pos = it.pos();
      bool listed = false;
      for (u32 i = 0; i < n && !listed; i++)
        listed = want[i].sectors != 0 && pos.inode == alloc::AcctInode(want[i].kind) && pos.offset == want[i].offset;
      if (!listed) TFS_TRY(drop.PushBack(pos));
    }
    TFS_TRY(st);
    for (const btree::Pos& pos : drop) TFS_TRY(queue([&] { return tx.Delete(pos); }));
  }
  for (u32 i = 0; i < n; i++) {
    const btree::Pos pos{btree::kBtreeAlloc, alloc::AcctInode(want[i].kind), want[i].offset};
    alloc::AcctRecord r;
    alloc::EncodeAcct(want[i].kind, want[i].sectors, &r);
    if (want[i].sectors == 0) {
      TFS_TRY(queue([&] { return tx.Delete(pos); }));
    } else {
      TFS_TRY(queue([&] { return tx.Set(pos, &r, sizeof(r)); }));
    }
  }
  if (tx.size() > 0) TFS_TRY(tx.Commit().status());
  if (whole) acct_.BeginLoad();  // (keeps the room)
  acct_.Set(want, n);
  return Status::Ok();
}

Status Store::HoldCheckedBuckets(OpenReport& rep) {
  rep.held_buckets = 0;
  // Each member's buckets the ranges touch, sorted and once each (a bucket
  // holds many checked ranges: one a commit), for one pass over its free list.
  for (u32 m = 0; m < sb_.nr_members; m++) {
    Vector<u64> buckets;
    for (const journal::CheckedRange& r : rep.replay.checked) {
      if (r.member != m || r.bytes == 0) continue;
      const u64 first = sb_.BucketOf(r.offset), last = sb_.BucketOf(r.offset + r.bytes - 1);
      for (u64 b = first; b <= last && b < sb_.members[m].nbuckets; b++) TFS_TRY(buckets.PushBack(b));
    }
    if (buckets.empty()) continue;
    Sort(buckets.data(), buckets.size(), [](u64 a, u64 b) { return a < b; });
    usize n = 0;
    for (usize i = 0; i < buckets.size(); i++)
      if (n == 0 || buckets[n - 1] != buckets[i]) buckets[n++] = buckets[i];
    rep.held_buckets += alloc_.HoldFree(m, buckets.data(), n);
  }
  return Status::Ok();
}

Status AcctCommit::Queue(Store* store, btree::Transaction* tx, alloc::AcctKind kind, u64 offset, i64 change) {
  if (store == nullptr || !store->open() || store->read_only() || tx == nullptr) return Err::kInvalidArgument;
  store_ = store;
  change_ = alloc::AcctChange{kind, offset, change};
  slot_ = TFS_TRY(tx->SetLater(btree::Pos{btree::kBtreeAlloc, alloc::AcctInode(kind), offset},
                               u32(sizeof(alloc::AcctRecord))));
  hook_ = btree::CommitHook{Prepare, Finish, this};
  tx->SetCommitHook(&hook_);
  return Status::Ok();
}

Status StageAcctInto(Store* store, btree::Transaction* tx, u32 first_slot, const alloc::AcctChange* changes, u32 n,
                     alloc::AcctValue* staged) {
  if (n == 0) return Status::Ok();
  TFS_TRY(store->acct().Stage(changes, n, staged));
  for (u32 i = 0; i < n; i++) {
    alloc::AcctRecord r;
    alloc::EncodeAcct(staged[i].kind, staged[i].sectors, &r);
    MemCopy(tx->LaterValue(first_slot + i), &r, sizeof(r));
  }
  return Status::Ok();
}

Status AcctCommit::Prepare(void* ctx, btree::Transaction* tx) {
  auto* c = static_cast<AcctCommit*>(ctx);
  return StageAcctInto(c->store_, tx, c->slot_, &c->change_, 1, &c->staged_);
}

void AcctCommit::Finish(void* ctx, u64 /*seq*/, bool journaled) {
  auto* c = static_cast<AcctCommit*>(ctx);
  if (journaled) c->store_->acct().Publish(&c->staged_, 1);
}

bool Store::CheckAccounting(OpenReport& rep) const {
  // Every counted non-cached pointer adds its extent's sectors to its
  // bucket's live count and to its set's total once: the totals, each
  // times its set's members, sum to the live counts.
  Vector<alloc::ReplicasEntry> sets;
  rep.acct_mismatch = false;
  rep.acct_replicas_sectors = rep.acct_bucket_sectors = 0;
  if (!acct_.ReplicasInto(&sets).ok()) {
    platform::Log(platform::LogLevel::kWarn, "alloc: no memory to check the space accounting at mount");
    return false;
  }
  for (const alloc::ReplicasEntry& s : sets) rep.acct_replicas_sectors += s.sectors * PopCount(s.members);
  rep.acct_bucket_sectors = alloc_.UserLiveSectors();
  rep.acct_mismatch = rep.acct_replicas_sectors != rep.acct_bucket_sectors;
  return true;
}

Status Store::DeleteBadAllocKeys() {
  if (bad_alloc_keys_.empty()) return Status::Ok();
  btree::Transaction tx(&btrees_);
  for (const btree::Pos& pos : bad_alloc_keys_) {
    Status st = tx.Delete(pos);
    if (st.code() == Err::kTooBig) {
      TFS_TRY(tx.Commit().status());
      st = tx.Delete(pos);
    }
    TFS_TRY(st);
  }
  TFS_TRY(tx.Commit().status());
  platform::Log(platform::LogLevel::kWarn, "alloc: deleted %llu allocation keys outside every member's buckets",
                (unsigned long long)bad_alloc_keys_.size());
  bad_alloc_keys_.Clear();
  return Status::Ok();
}

Result<u64> Store::PersistAlloc(void* self, const alloc::RecordChange* changes, u32 n, alloc::BucketState owner,
                                alloc::PersistProgress* progress) {
  auto* e = static_cast<Store*>(self);
  // A checkpoint's changes of its own node buckets: a reclaim commit (never
  // waits for ring room or the commit mutex, docs/format/alloc.md).
  const bool reclaim = owner == alloc::BucketState::kBtree;
  btree::Transaction tx(&e->btrees_);
  *progress = alloc::PersistProgress{};
  u32 queued = 0;  // changes in tx, after the `progress->committed` committed ones
  for (u32 i = 0; i < n; i++) {
    alloc::AllocRecord r;
    alloc::EncodeRecord(changes[i].b, &r);
    const btree::Pos pos{btree::kBtreeAlloc, changes[i].dev, changes[i].bucket};
    // A replacing record (RebaseVersions: only at mount, before the journal
    // runs) deletes the key first. (Should only the whiteout fit, it is
    // committed alone and the pair follows: the mount's checkpoint writes
    // the end state.)
    auto queue = [&]() -> Status {
      if (changes[i].replace) TFS_TRY(tx.Delete(pos));
      return tx.Set(pos, &r, sizeof(r));
    };
    Status st = queue();
    if (st.code() == Err::kTooBig && tx.size() > 0) {  // one entry's worth at a time: each record stands alone
      if (reclaim) tx.SetReclaim();
      const u64 seq = TFS_TRY(tx.Commit());
      progress->committed += queued;
      progress->transactions++;
      progress->seq = Max(progress->seq, seq);
      queued = 0;
      st = queue();
    }
    TFS_TRY(st);
    queued++;
  }
  if (reclaim) tx.SetReclaim();
  const u64 seq = TFS_TRY(tx.Commit());
  progress->committed += queued;
  progress->transactions++;
  progress->seq = Max(progress->seq, seq);
  return progress->seq;
}

void Store::CheckCurrent(const btree::Roots& roots, OpenReport& rep) const {
  // Roots: the superblock (mount, unmount) and every journal entry record the
  // newest durable roots gen; the roots found may not be older.
  const u64 proved_gen = Max(sb_.roots_gen, rep.replay.roots_gen);
  if (roots.gen < proved_gen) {
    rep.stale_roots = true;
    DiagError(&rep.stale_why, Err::kCorrupt,
              "btree roots: newest valid block is gen %llu but gen %llu was durable (%s): the newer one is damaged "
              "and the changes since would be lost; run 'tierfs fsck -y' to rebuild the trees from a scan for their "
              "nodes",
              (unsigned long long)roots.gen, (unsigned long long)proved_gen,
              proved_gen == sb_.roots_gen ? "superblock" : "journal")
        .IgnoreError();
  }
}

Status Store::WriteSuperblocks() {
  // Every copy written while a member is marked failed names it (5c-3).
  sb_.degraded_missing |= devs_.failed();
  const Status st = WriteSuperblockCopies(sb_);
  sb_disk_ = sb_;
  return st;
}

Status Store::NameFailedMembersLocked() {
  sb_disk_.degraded_missing = devs_.unavailable();
  sb_disk_.seq = ++sb_.seq;  // (sb_'s seq stays the newest: Close writes after it)
  sb_.degraded_missing |= devs_.failed();
  return WriteSuperblockCopies(sb_disk_);
}

Status Store::WriteSuperblockCopies(const sb::Superblock& s) {
  Status first;
  for (u32 m = 0; m < s.nr_members; m++) {
    // A degraded mount's missing member keeps its older superblock: the
    // newest (a higher seq, on the members given) wins when it returns.
    // A member failed while mounted is not written either (step 5c-3):
    // the superblock says it is missing (Close), and it is refused as a
    // second history if it comes back having been mounted alone.
    if (((devs_.unavailable() >> m) & 1) != 0) continue;
    // Open, close, AddFeatures (at posix's mount), BeginAcctRepair and the
    // health thread only: the superblock's blocks are written by nothing
    // else, so this bypasses the queue. (On past a member that fails: the
    // others still take it.)
    const Status st = sb::Write(*devs_.member(m)->bdev(), s, u16(m));
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status Store::BeginAcctRepair() {
  if (!open_ || read_only_) return Err::kInvalidArgument;
  MutexLock l(sb_mu_);
  if ((sb_.flags & sb::kSbAcctRepair) != 0 && acct_flag_durable_) return Status::Ok();
  // (Set in memory even when the write fails: Close's superblock write
  // records it then. A later call writes it again.)
  sb_.flags |= sb::kSbAcctRepair;
  sb_.seq++;
  TFS_TRY(WriteSuperblocks());
  acct_flag_durable_ = true;
  return Status::Ok();
}

Status Store::AddFeatures(u16 features) {
  if (!open_ || read_only_ || (features & ~sb::kSbFeatureFlags) != 0) return Err::kInvalidArgument;
  MutexLock l(sb_mu_);
  if ((sb_.flags & features) == features) return Status::Ok();
  sb_.flags |= features;
  sb_.seq++;
  return WriteSuperblocks();
}

Status Store::Close() {
  platform::NoFsScope nofs;  // the last checkpoint writes under the btree's locks
  if (!open_) return Status::Ok();
  open_ = false;
  if (read_only_) return btrees_.Close();
  // Trees first: their checkpoints (the allocation state with them) commit
  // through the running journal.
  bool settled = false;
  Status bst = btrees_.Close(&settled);
  Status st = journal_.Stop();
  // The health thread last: a member marked by the final checkpoint or the
  // journal's last entry is named before it stops (also when they failed:
  // the returns below write nothing). Close's own writes name them too.
  StopHealth();
  btrees_.DetachJournal();  // (a pin the trees kept because they did not settle)
  journal_started_ = false;
  alloc_.SetJournal(nullptr);
  if (!st.ok()) return st;  // leave the superblock unclean: replay will sort it out
  if (!bst.ok()) return bst;
  // Members that failed while mounted missed this mount's end: the
  // superblock goes on without them and says so, as a degraded mount's
  // does (step 5c-3).
  sb_.degraded_missing = devs_.unavailable();
  if (!settled) {
    // The trees could not be left with nothing dirty (docs/format/alloc.md,
    // "Checkpoints and the recursion"): the journal, stopped durably, holds
    // what they lack, and the next mount replays it. The superblock is
    // written unclean with the journal's floor where it was, for the flags
    // this mount changed (a finished repair's kSbAcctRepair cleared: what
    // it repaired is in that journal).
    platform::Log(platform::LogLevel::kWarn, "store: unmounted with allocation records only in the journal; "
                                             "the next mount replays it");
    sb_.flags &= u16(~sb::kSbClean);
    sb_.seq++;
    return WriteSuperblocks();
  }
  sb_.journal_seq = journal_.next_seq();
  sb_.flags |= sb::kSbClean;
  sb_.seq++;
  sb_.roots_gen = btrees_.roots().gen;
  return WriteSuperblocks();
}

}  // namespace tfs::store
