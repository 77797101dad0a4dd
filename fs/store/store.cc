// Format, open (with replay) and close of the store (see store.h).
#include "store/store.h"

#include "alloc/format.h"
#include "platform/platform.h"
#include "util/bits.h"

namespace tfs::store {
namespace {

constexpr u64 kMinDataBuckets = 8;

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
    u64 table = alloc::TableBuckets(nbuckets, o.bucket_size);
    bool is_meta = (meta >> i) & 1;
    u64 journal = 0;
    if (is_meta) {
      if (o.journal_buckets != 0 && o.journal_buckets < journal::kMinRingBuckets)
        return DiagError(diag, Err::kInvalidArgument, "format: a journal needs at least %u buckets, not %u",
                         journal::kMinRingBuckets, unsigned(o.journal_buckets));
      journal = o.journal_buckets != 0 ? o.journal_buckets : Min<u64>(Max<u64>(nbuckets / 64, 8), 256);
    }
    u64 need = table + journal + kMinDataBuckets;
    if (nbuckets < need) {
      u64 min_bytes = sb::kBucketsOffset + need * o.bucket_size;
      return DiagError(diag, Err::kNoSpace, "format: %s is too small: %llu bytes, need at least %llu with %u KiB buckets",
                       bdev->Name(), (unsigned long long)size, (unsigned long long)min_bytes,
                       unsigned(o.bucket_size >> 10));
    }
    m.size = sb::kBucketsOffset + nbuckets * o.bucket_size;
    m.nbuckets = nbuckets;
    m.alloc_table_buckets = u32(table);
    m.journal_first_bucket = is_meta ? table : 0;
    m.journal_nbuckets = u32(journal);
    m.durability = members[i].durability;
    m.data_allowed = is_meta ? sb::kDataAll : sb::kDataUser;
  }

  // Allocation tables first, superblocks last: the superblock makes it a filesystem.
  auto a_owned = platform::Owned<alloc::Allocator>::Make();
  if (!a_owned) return Err::kNoMemory;
  alloc::Allocator& a = *a_owned;
  TFS_TRY(a.Init(&devs, s, nullptr));
  a.InitFresh();
  Status st = a.Checkpoint();
  if (!st.ok()) return DiagError(diag, st, "format: writing allocation tables: %s", st.Message());
  st = btree::FormatRoots(devs, s);
  if (!st.ok()) return DiagError(diag, st, "format: writing the btree roots: %s", st.Message());
  s.roots_gen = btree::kFormatRootsGen;
  for (u32 i = 0; i < count; i++) s.members[i].alloc_checkpoint = a.DurableCheckpoint(i);
  for (u32 i = 0; i < count; i++) {
    st = sb::Write(*members[i].bdev, s, u16(i));
    if (!st.ok())
      return DiagError(diag, st, "format: writing the superblock of %s: %s", members[i].bdev->Name(), st.Message());
  }
  return Status::Ok();
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
  TFS_TRY(sb::CheckMembers(sbs.p, count, order, diag));
  u32 newest = 0;
  for (u32 i = 1; i < count; i++) {
    if (sbs.p[i].seq > sbs.p[newest].seq) newest = i;
  }
  sb_ = sbs.p[newest];
  read_only_ = options.read_only;

  for (u32 m = 0; m < sb_.nr_members; m++) {
    Result<dev::Member*> r = devs_.Add(bdevs[order[m]], sb_.members[m].label, options.queue);
    if (!r.ok()) return DiagError(diag, r.status(), "open: member %s: %s", sb_.members[m].label, r.status().Message());
  }
  // The journal is attached once it runs: replay and the mount checkpoint change
  // the allocator only in memory and in its tables.
  TFS_TRY(alloc_.Init(&devs_, sb_, nullptr));
  TFS_TRY(alloc_.Load(diag));
  rep.was_clean = sb_.clean();
  rep.lost_data_btrees = sb_.lost_data_btrees;
  rep.features = u16(sb_.flags & sb::kSbFeatureFlags);
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
  if (!rep.was_clean) {
    const bool past = options.replay_past_damage && options.rebuild_alloc != nullptr && !read_only_;
    TFS_TRY(journal::ReadForReplay(devs_, sb_, &rep.replay, diag, past));
    const journal::ReplayResult& rr = rep.replay;
    if (rr.durable_end != 0 && !read_only_ && !past) {
      return DiagError(diag, Err::kCorrupt,
                       "journal: entry %llu is damaged, but later entries up to %llu were durable: %llu "
                       "acknowledged entries are lost and the ones after them cannot be replayed alone; run "
                       "'tierfs fsck -y' to replay what survives and repair the rest",
                       (unsigned long long)rr.gap_at, (unsigned long long)rr.durable_end,
                       (unsigned long long)rr.lost_entries);
    }
    rep.replayed_past_damage = past && rr.durable_end != 0;
    for (const journal::ReplayedEntry& e : rep.replay.entries) {
      Status st = journal::ForEachKey(e, ApplyAllocKey, this);
      if (!st.ok())
        return DiagError(diag, st, "journal entry %llu: %s", (unsigned long long)e.seq, st.Message());
      rep.replayed_keys += e.nkeys;
    }
  }
  TFS_TRY(alloc_.Finish());
  const bool can_rebuild_roots =
      options.rebuild_roots && options.rebuild_alloc != nullptr && options.btree.drop_bad_nodes && !read_only_;
  btree::Roots roots;
  Diag rd;
  Status rst = btree::ReadRoots(devs_, sb_, &roots, &rd);
  if (!rst.ok() && !(can_rebuild_roots && rst.Is(ErrorClass::kCorrupt))) {
    if (diag != nullptr) *diag = rd;
    return rst;
  }
  if (!rst.ok()) {  // no valid roots block at all: every tree from the scan
    rep.stale_roots = true;
    rep.stale_why = rd;
    roots = btree::Roots{};
    roots.gen = sb_.roots_gen;
    for (u32 t = 0; t < btree::kNrBtreeIds; t++) {
      roots.roots[t] = btree::NodePtrFormat{};
      roots.roots[t].member = btree::kNoMember;
      roots.roots[t].btree_id = u8(t);
    }
  }
  CheckCurrent(roots, rep);  // (the tables too, whatever the roots)
  const bool stale = rep.stale_roots || rep.stale_alloc != 0;
  if (stale && !read_only_ &&
      (rep.stale_roots ? !can_rebuild_roots : options.rebuild_alloc == nullptr)) {
    if (diag != nullptr) *diag = rep.stale_why;
    return Err::kCorrupt;
  }
  if (stale) platform::Log(platform::LogLevel::kError, "%s", rep.stale_why.text);
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
  Status st = btrees_.Open(&devs_, &alloc_, sb_, roots, bopt, diag);
  if (!st.ok()) {
    btrees_.Close().IgnoreError();
    return st;
  }
  for (const journal::ReplayedEntry& e : rep.replay.entries) {
    st = journal::ForEachKey(e, ApplyBtreeKey, this);
    if (!st.ok()) {
      btrees_.Close().IgnoreError();
      return DiagError(diag, st, "journal entry %llu: btree: %s", (unsigned long long)e.seq, st.Message());
    }
  }
  if (!read_only_) {
    u64 next_seq = rep.was_clean ? sb_.journal_seq : Max(rep.replay.next_seq, sb_.journal_seq);
    // Tables written before the journal starts: changes from next_seq on are not in them.
    alloc_.SetJournalSeqFloor(next_seq);
    // Entries lost in the journal may have held allocation changes the
    // replayed ones depend on: the trees decide.
    // So may the keys of damaged nodes fsck dropped (btree::Options::drop_bad_nodes).
    const bool dropped = !btrees_.lost_nodes().empty();
    if (rep.stale_alloc != 0 || rep.replayed_past_damage || dropped) {
      st = options.rebuild_alloc != nullptr
               ? options.rebuild_alloc(options.rebuild_ctx, *this)
               : Status(Err::kInvalidArgument);  // drop_bad_nodes read-write without a rebuild: a caller's bug
      if (st.ok()) st = alloc_.Checkpoint();
      if (!st.ok()) {
        btrees_.Close().IgnoreError();
        return DiagError(diag, st, "open: rebuilding the allocation state: %s", st.Message());
      }
      rep.alloc_rebuilt = true;
    }
    if (!rep.was_clean || dropped) {
      // Persist what replay applied: the journal restarts at the ring starts.
      // (And the nodes that replaced dropped ones.)
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
        if (!st.ok()) {
          btrees_.Close().IgnoreError();
          return DiagError(diag, st, "open: recording the dropped nodes: %s", st.Message());
        }
      }
      st = btrees_.Checkpoint();
      if (st.ok()) st = alloc_.Checkpoint();
      if (!st.ok()) {
        btrees_.Close().IgnoreError();
        return DiagError(diag, st, "open: persisting replayed state: %s", st.Message());
      }
    }
    sb_.journal_seq = next_seq;
    sb_.flags &= u16(~sb::kSbClean);
    // The incompatible features the caller's writes may use: builds that do
    // not know them refuse the filesystem from this write on (sb/format.h).
    sb_.flags |= u16(options.features & sb::kSbFeatureFlags);
    sb_.seq++;
    RecordCheckpoints();
    st = WriteSuperblocks();
    if (st.ok()) st = journal_.Start(&devs_, sb_, next_seq, options.journal);
    if (!st.ok()) {
      btrees_.Close().IgnoreError();
      return st;
    }
    journal_started_ = true;
    alloc_.SetJournal(&journal_);
    btrees_.AttachJournal(&journal_);
    journal_.SetReclaimHook(ReclaimHook, this);
  }
  open_ = true;
  return Status::Ok();
}

void Store::ReclaimHook(void* self, u64 seq) {
  auto* e = static_cast<Store*>(self);
  btree::Btrees::ReclaimHook(&e->btrees_, seq);
  alloc::Allocator::ReclaimHook(&e->alloc_, seq);
}

Status Store::ApplyAllocKey(void* self, u64, const journal::Key& key) {
  auto* e = static_cast<Store*>(self);
  switch (key.type) {
    case journal::kKeyAlloc:
      return e->alloc_.Apply(key);
    case journal::kKeyBtree:
      return Status::Ok();  // the second pass
    case journal::kKeyDataCheck:
      return Status::Ok();  // for ReadForReplay only
    default:
      platform::Log(platform::LogLevel::kError, "journal: unknown key type %u", unsigned(key.type));
      return Err::kCorrupt;
  }
}

Status Store::ApplyBtreeKey(void* self, u64 seq, const journal::Key& key) {
  auto* e = static_cast<Store*>(self);
  return key.type == journal::kKeyBtree ? e->btrees_.ApplyReplayed(seq, key) : Status::Ok();
}

void Store::CheckCurrent(const btree::Roots& roots, OpenReport& rep) const {
  // Where the journal's proof starts: on a clean filesystem nothing is
  // replayed and the superblock's journal_seq is the next entry; otherwise
  // replay's start (its first entry, if any): durable changes from there on
  // are in the journal, older ones only in the tables.
  u64 first = sb_.journal_seq;
  if (!rep.was_clean) first = Max(rep.replay.start_seq, sb_.journal_seq);
  Diag why;  // each finding's line; the first one is kept
  auto keep = [&] {
    if (rep.stale_why.empty()) rep.stale_why = why;
  };
  // Roots: the superblock (mount, unmount) and every journal entry record the
  // newest durable roots gen; the roots found may not be older.
  const u64 proved_gen = Max(sb_.roots_gen, rep.replay.roots_gen);
  if (roots.gen < proved_gen) {
    rep.stale_roots = true;
    DiagError(&why, Err::kCorrupt,
              "btree roots: newest valid block is gen %llu but gen %llu was durable (%s): the newer one is damaged "
              "and the changes since would be lost; run 'tierfs fsck -y' to rebuild the trees from a scan for their "
              "nodes",
              (unsigned long long)roots.gen, (unsigned long long)proved_gen,
              proved_gen == sb_.roots_gen ? "superblock" : "journal")
        .IgnoreError();
    keep();
  }
  for (u32 m = 0; m < sb_.nr_members; m++) {
    const alloc::LoadedTable& t = alloc_.loaded(m);
    const char* label = sb_.members[m].label;
    const char* other = t.rejected < 0 ? "is older too" : t.rejected_io ? "could not be read" : "is damaged";
    if (t.checkpoint < sb_.members[m].alloc_checkpoint) {
      rep.stale_alloc |= dev::DevMask(1) << m;
      DiagError(&why, Err::kCorrupt,
                "member %s: allocation table is checkpoint %llu but %llu was durable (superblock; the other slot "
                "%s); run 'tierfs fsck -y' to rebuild it",
                label, (unsigned long long)t.checkpoint, (unsigned long long)sb_.members[m].alloc_checkpoint, other)
          .IgnoreError();
      keep();
    } else if (t.rejected >= 0 && !(t.rejected_checkpoint != 0 && t.rejected_checkpoint < t.checkpoint) &&
               !rep.was_clean && t.journal_seq != 0 && t.journal_seq < first) {
      // (A rejected slot whose header still shows an older checkpoint was
      // being rewritten when the crash came -- tables are written header last
      // -- or is an older copy gone bad: this slot is the newest durable one,
      // and the journal still holds its changes since, but frees it left out
      // unsettled: those the ring passed come back unreferenced, and the mount
      // frees them again; format/alloc.md.)
      // (journal_seq 0: a table header of an older build, which did not
      // record it at mount; nothing is known.)
      // The other slot may have been the newer one; the journal holds only
      // the changes from `first` on, not those since this slot was written.
      rep.stale_alloc |= dev::DevMask(1) << m;
      DiagError(&why, Err::kCorrupt,
                "member %s: allocation table slot %d %s and slot %d lacks changes from journal entry %llu on, "
                "which the journal no longer holds (from %llu); run 'tierfs fsck -y' to rebuild it",
                label, t.rejected, other, t.slot, (unsigned long long)t.journal_seq, (unsigned long long)first)
          .IgnoreError();
      keep();
    }
  }
}

void Store::RecordCheckpoints() {
  sb_.roots_gen = btrees_.roots().gen;
  for (u32 m = 0; m < sb_.nr_members; m++) sb_.members[m].alloc_checkpoint = alloc_.DurableCheckpoint(m);
}

Status Store::WriteSuperblocks() {
  for (u32 m = 0; m < sb_.nr_members; m++) {
    // Open, close and AddFeatures (at posix's mount) only: the superblock's
    // blocks are written by nothing else, so this bypasses the queue.
    TFS_TRY(sb::Write(*devs_.member(m)->bdev(), sb_, u16(m)));
  }
  return Status::Ok();
}

Status Store::AddFeatures(u16 features) {
  if (!open_ || read_only_ || (features & ~sb::kSbFeatureFlags) != 0) return Err::kInvalidArgument;
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
  // Trees first: their checkpoint commits through the running journal.
  Status bst = btrees_.Close();
  Status st = journal_.Stop();
  journal_started_ = false;
  // Slow members' background table writes drop journal pins when they
  // complete: none may outlive this (on every path: the store may go next).
  alloc_.WaitForBackgroundWrites();
  if (!st.ok()) return st;  // leave the superblock unclean: replay will sort it out
  if (!bst.ok()) return bst;
  alloc_.SetJournalSeqFloor(journal_.next_seq());
  alloc_.JournalStopped();  // a clean image is not replayed: its tables hold every free
  TFS_TRY(alloc_.Checkpoint());
  sb_.journal_seq = journal_.next_seq();
  sb_.flags |= sb::kSbClean;
  sb_.seq++;
  RecordCheckpoints();
  return WriteSuperblocks();
}

}  // namespace tfs::store
