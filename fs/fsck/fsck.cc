// Offline check and repair of superblocks, member set, journal, allocation state
// and btrees (see fsck.h). Reads through the same code mount uses, so every on-disk
// structure is validated exactly as strictly.
#include "fsck/fsck.h"

#include "data/data.h"
#include "fsck/pass.h"
#include "platform/platform.h"
#include "posix/fs.h"
#include "store/store.h"

namespace tfs::fsck {
namespace {

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
    // A superblock write the crash cut short (found by tierlab crash: a cut
    // while a mount wrote them): the newer valid copy is the one every open
    // uses, and the next mount writes both.
    // Either valid copy unclean: also a cut between the two writes of a clean
    // unmount (the primary, written first, clean; the backup not yet).
    const bool cut_short = (p.ok() && (s[0].flags & sb::kSbClean) == 0) || (b.ok() && (s[1].flags & sb::kSbClean) == 0);
    if (cut_short) {
      c.report->notes++;
    } else {
      c.report->errors++;
    }
    c.Line("%s: superblock copies disagree (%s%s%s)%s", dev.Name(), p.ok() ? "" : "primary: ",
           p.ok() ? (b.ok() ? "different contents" : "backup: ") : d0.text, b.ok() ? "" : d1.text,
           cut_short ? " (not cleanly unmounted: the next mount writes both)" : "");
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

// Whether the allocation state an open loaded is known to be wrong: bad
// records skipped, or a node of the alloc tree dropped (its range recovered
// from older copies, or lost) -- until a rebuild.
bool AllocSuspect(store::Store& e, const store::OpenReport& rep) {
  if (rep.bad_alloc_records != 0) return true;
  for (const btree::LostNode& ln : e.btrees().lost_nodes())
    if (ln.btree_id == btree::kBtreeAlloc) return true;
  return false;
}

// BeginCountRepair before a bucket state repair (its counts zeroed): false
// when the flag could not be recorded -- the repair is not made, and the
// first such failure is one line.
bool FlagForStateRepair(store::Store& e, Ctx& c) {
  Status st = BeginCountRepair(e, c);
  if (st.ok()) return true;
  if (!c.acct_flag_failed) {
    c.acct_flag_failed = true;
    c.Line("alloc: recording the repair in the superblock failed: %s; bucket states are left as they are",
           st.Message());
  }
  return false;
}

void CheckAllocator(store::Store& e, const Options& opt, Ctx& c) {
  const sb::Superblock& s = e.sb();
  alloc::Allocator& a = e.alloc();
  for (u32 m = 0; m < s.nr_members; m++) {
    const sb::Member& mem = s.members[m];
    u64 bad = 0;
    for (u64 b = 0; b < mem.nbuckets; b++) {
      alloc::Bucket bk = a.Get(m, b);
      alloc::BucketState want = alloc::LayoutState(mem, b);
      if (want == alloc::BucketState::kFree) {
        // Not reserved by the layout: any state but the layout's is fine.
        bool reserved = bk.state == alloc::BucketState::kSb || bk.state == alloc::BucketState::kJournal;
        want = reserved ? alloc::BucketState::kFree : bk.state;
      }
      const u64 most = alloc::MaxCountSectors(s, bk.state);
      bool live_bad = bk.live_sectors > most || bk.cached_sectors > most;
      if (bk.state == want && !live_bad) continue;
      bad++;
      c.report->errors++;
      if (bad <= 10) {
        c.Line("%s: bucket %llu is %s%s, expected %s", mem.label, (unsigned long long)b,
               alloc::BucketStateName(bk.state), live_bad ? " with more live or cached sectors than it can count" : "",
               alloc::BucketStateName(want));
      }
      // (A state set zeroes the bucket's counts: under the flag, as every
      // repair that changes what the counts say.)
      if (opt.repair && FlagForStateRepair(e, c) && a.RepairState(m, b, want).ok()) c.report->repaired++;
    }
    if (bad > 10) c.Line("%s: %llu more bucket errors", mem.label, (unsigned long long)(bad - 10));
  }
}

// ---------------------------------------------------------------------------
// The btree pass. Every node the roots block reaches is read from disk and
// verified as mount verifies it (checksums, identity against the parent's pointer,
// interior structure); a node that fails does not end the walk: its subtree is
// skipped and its siblings are still checked. Then the shape is checked again here
// from what the walk saw (key order, bounds, each child's range = previous key + 1
// .. its key), every node slot against the allocator, and statistics are printed.

const char* const kBtreeNames[btree::kNrBtreeIds] = {"inodes", "dirents",      "extents",   "xattrs",
                                                     "alloc",  "backpointers", "reconcile", "test"};
constexpr u32 kMaxLines = 10;  // per kind of finding; the rest are counted

// A bucket whose state the btrees contradict, and the state it should have.
struct BucketFix {
  u32 member;
  u64 bucket;
  alloc::BucketState want;
};

// A node with a damaged copy while another served: fsck -y rewrites it
// (Btrees::RewriteNode), its range and level naming it.
struct NodeRewrite {
  u8 btree_id, level;
  u32 damaged;  // copies that were errors of the check (counted repaired; those
                // on a stale member, notes, are rewritten without counting)
  btree::Pos max;
  u64 seq;
};

struct BtreeFindings {
  Vector<BucketFix> fixes;
  Vector<NodeRewrite> rewrites;
  // The roots block's stale members (btree::Roots::stale_since: the first
  // gen each missed), and whether the walk verified every copy of every
  // node the trees reach (no node unread): then -y's rewrites leave no
  // member stale.
  Vector<u64> stale_since, stale_until;  // per member (on the heap: fsck::Check's frame)
  bool every_copy_checked = false;
  // When the roots block's degraded node counts (btree::Roots::degraded_on)
  // disagree with the walk's, which reached every pointer: [0] what the
  // block said, [1] the recount (-y's fix). Empty otherwise.
  Vector<btree::Btrees::DegradedCounts> degraded;
  u64 StaleMask() const {
    u64 mask = 0;
    for (usize m = 0; m < stale_since.size(); m++)
      if (stale_since[m] != 0) mask |= u64(1) << m;
    return mask;
  }
};

btree::Pos PtrMin(const btree::NodePtrFormat& p) {
  return btree::Pos{p.btree_id, p.min_inode.get(), p.min_offset.get()};
}

btree::Pos Succ(btree::Pos p) {
  if (++p.offset == 0) p.inode++;
  return p;
}

struct BtreeCheck {
  // What the parent said about one child: where its copies are and which
  // range it covers.
  struct Expect {
    btree::NodePtrFormat ptr;
    btree::Pos min, max;
  };
  struct TreeStats {
    u64 nodes = 0, leaves = 0, keys = 0, bad = 0;  // bad: failed to read or verify
    u32 depth = 0;
  };

  Ctx* c = nullptr;
  const sb::Superblock* sb = nullptr;
  btree::Btrees* trees = nullptr;
  BtreeFindings* found = nullptr;
  u32 node_size = 0;
  Vector<u64> slots[dev::kMaxDevices];  // bitmap: node slots referenced so far
  Vector<u32> refs[dev::kMaxDevices];   // referenced node slots per bucket
  // Children of the last interior node visited at level l + 1: the walk is
  // depth-first with children in key order, so the next node at level l is child
  // next[l] of it.
  Vector<Expect> expect[btree::kMaxLevel + 1];
  u32 next[btree::kMaxLevel + 1] = {};
  bool root_seen[btree::kNrBtreeIds] = {};
  TreeStats stats[btree::kNrBtreeIds];
  u32 node_errors = 0, lines = 0;
  u32 lost_subtrees = 0;  // interior nodes that could not be read: slots unknown
  Status stop;            // an operational failure (out of memory)
  btree::Btrees::DegradedCounts degraded;  // the pointers reached that btree::PtrDegraded calls degraded

  void CountDegraded(const btree::NodePtrFormat& p) {
    if (!btree::PtrDegraded(p, *sb)) return;
    degraded.total++;
    for (u32 i = 0; i < btree::PtrCopies(p); i++)
      if (btree::PtrCopy(p, i).member < dev::kMaxDevices) degraded.on[btree::PtrCopy(p, i).member]++;
  }

  void Error(const char* fmt, ...) TFS_PRINTF(2, 3) {
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    Finding(true, fmt, ap);
    __builtin_va_end(ap);
  }
  // A finding: an error, or a note (damage where it is expected); one line
  // each, up to kMaxLines.
  void Finding(bool error, const char* fmt, __builtin_va_list ap) {
    if (error) {
      c->report->errors++;
      node_errors++;
    } else {
      c->report->notes++;
    }
    if (++lines > kMaxLines) return;
    char buf[300];
    tfs_plat_vsnprintf(buf, sizeof(buf), fmt, ap);
    c->Line("btree: %s", buf);
  }
  void Finding(bool error, const char* fmt, ...) TFS_PRINTF(3, 4) {
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    Finding(error, fmt, ap);
    __builtin_va_end(ap);
  }

  Status Init() {
    for (u32 m = 0; m < sb->nr_members; m++) {
      const u64 nslots = sb->members[m].nbuckets * (sb->bucket_size / node_size);
      TFS_TRY(slots[m].Resize((nslots + 63) / 64));
      for (usize i = 0; i < slots[m].size(); i++) slots[m][i] = 0;
      TFS_TRY(refs[m].Resize(sb->members[m].nbuckets));
      for (usize i = 0; i < refs[m].size(); i++) refs[m][i] = 0;
    }
    return Status::Ok();
  }

  // Marks the slot of each copy a pointer names as referenced; a second
  // reference is an error. (A copy outside the bucket area fails the parse
  // rules of the read that yielded the pointer: reported there.)
  void Reference(const btree::NodePtrFormat& p, const char* name) {
    for (u32 i = 0; i < btree::PtrCopies(p); i++) {
      const btree::NodeCopy c = btree::PtrCopy(p, i);
      if (!btree::NodeSlotInArea(*sb, node_size, c.member, c.offset)) continue;
      const u64 slot = (c.offset - sb::kBucketsOffset) / node_size;
      u64& word = slots[c.member][slot / 64];
      if (word & (u64(1) << (slot % 64))) {
        Error("%s: node at member %s offset %llu is referenced twice", name, sb->members[c.member].label,
              (unsigned long long)c.offset);
        continue;
      }
      word |= u64(1) << (slot % 64);
      refs[c.member][sb->BucketOf(c.offset)]++;
    }
  }

  // The copy a walk's read took first (for the messages of a node that
  // failed: every copy did).
  btree::NodeCopy ReadCopy(const btree::NodePtrFormat& p) const {
    return btree::PtrEmpty(p) ? btree::NodeCopy{btree::kNoMember, 0} : btree::PtrCopy(p, 0);
  }

  // Every copy of a node that one copy (`served`) verified: each other one
  // is read and verified on its own; a damaged one is an error, and the
  // node goes on the rewrites fsck -y makes.
  void CheckCopies(const btree::Node& node, const btree::NodePtrFormat& p, u32 served) {
    const btree::NodeInfo& info = node.info();
    u32 damaged = 0, noted = 0;
    for (u32 i = 0; i < btree::PtrCopies(p); i++) {
      if (i == served) continue;
      Diag d;
      const Status st = trees->CheckCopy(p, i, info.max, &d);
      if (st.Is(ErrorClass::kNoMemory)) {
        stop = st;
        return;
      }
      if (st.ok()) continue;
      const btree::NodeCopy at = btree::PtrCopy(p, i);
      // On a member that missed a roots block, the copies of the nodes
      // written since (their image's gen, from the copy that served) may
      // never have been written: the damage is where the filesystem knows
      // to expect it -- a note, and -y rewrites it all the same. Older
      // nodes' copies there were written before: their damage is an error.
      const u64 since = at.member < found->stale_since.size() ? found->stale_since[at.member] : 0;
      const bool expected =
          since != 0 && info.gen >= since && info.gen <= found->stale_until[at.member];
      Finding(!expected,
              "%s: level-%u node seq %llu: copy %u on member %s offset %llu is damaged (%s); copy %u serves%s%s%s",
              kBtreeNames[info.btree_id], unsigned(info.level), (unsigned long long)info.seq, i + 1,
              Label(at.member), (unsigned long long)at.offset, d.empty() ? st.Message() : d.text, served + 1,
              expected ? " (" : "", expected ? Label(at.member) : "",
              expected ? " missed a checkpoint's end: expected; fsck -y rewrites it)" : "");
      (expected ? noted : damaged)++;
    }
    if (damaged + noted != 0 &&
        !found->rewrites.PushBack(NodeRewrite{info.btree_id, info.level, damaged, info.max, info.seq}).ok())
      stop = Err::kNoMemory;
  }
  const char* Label(u32 m) const { return m < sb->nr_members ? sb->members[m].label : "?"; }

  // Where the node this pointer names must be and which range it must cover; false
  // (after reporting) when the walk is not where its parent said it would be.
  bool Expected(const btree::NodePtrFormat& p, Expect* out) {
    const u8 id = p.btree_id;
    if (!root_seen[id]) {
      root_seen[id] = true;
      for (u32 l = 0; l <= btree::kMaxLevel; l++) {
        expect[l].Clear();
        next[l] = 0;
      }
      stats[id].depth = p.level + 1u;
      *out = Expect{p, btree::Pos::Min(id), btree::Pos::Max(id)};
      return true;
    }
    const u8 l = p.level;
    if (next[l] >= expect[l].size()) {
      Error("%s: walk reached a level-%u node no parent names", kBtreeNames[id], unsigned(l));
      return false;
    }
    *out = expect[l][next[l]++];
    return true;
  }

  static Status OnNode(void* ctx, const btree::Btrees::NodeVisit& v) {
    auto* self = static_cast<BtreeCheck*>(ctx);
    self->Visit(*v.node, *v.ptr, v.served);
    if (self->stop.ok()) self->CheckCopies(*v.node, *v.ptr, v.served);
    return self->stop;
  }

  static Status OnError(void* ctx, const btree::Btrees::NodeError& e) {
    auto* self = static_cast<BtreeCheck*>(ctx);
    if (e.status.Is(ErrorClass::kNoMemory)) return e.status;
    const btree::NodePtrFormat& p = *e.ptr;
    if (p.btree_id >= btree::kNrBtreeIds || p.level > btree::kMaxLevel) {  // checked by the parent's read
      self->Error("bad node pointer: %s", e.text);
      return Status::Ok();
    }
    Expect ex;
    (void)self->Expected(p, &ex);  // keeps the walk's place among its siblings
    self->Reference(p, kBtreeNames[p.btree_id]);
    self->CountDegraded(p);
    if (p.level > 0) self->lost_subtrees++;
    self->stats[p.btree_id].bad++;
    const btree::NodeCopy at = self->ReadCopy(p);
    self->Error("%s: level-%u node at member %s offset %llu (seq %llu): %s", kBtreeNames[p.btree_id],
                unsigned(p.level), self->Label(at.member), (unsigned long long)at.offset,
                (unsigned long long)p.seq.get(), e.text);
    return Status::Ok();
  }

  void Visit(const btree::Node& node, const btree::NodePtrFormat& p, u32 served) {
    const btree::NodeInfo& info = node.info();
    const char* name = kBtreeNames[info.btree_id];
    const btree::NodeCopy at = btree::PtrCopy(p, served);
    const char* label = Label(at.member);
    const unsigned long long off = at.offset;
    Expect ex;
    if (!Expected(p, &ex)) return;
    Reference(p, name);
    CountDegraded(p);
    TreeStats& ts = stats[info.btree_id];
    ts.nodes++;
    // The node is the one its parent names, and covers the range the parent gave it.
    if (!btree::SamePtrCopies(ex.ptr, p) || ex.ptr.seq.get() != info.seq || info.min != ex.min ||
        info.max != ex.max) {
      Error("%s: node at member %s offset %llu is not the node or range its parent names", name, label, off);
    }
    if (info.level == 0) {
      ts.leaves++;
      // Visible keys in order, inside [min, max].
      btree::NodeIter it(node);
      bool first = true;
      btree::Pos prev{};
      for (it.SeekToFirst(); it.Valid(); it.Next()) {
        const btree::Pos pos = it.pos();
        if (pos < info.min || pos > info.max || (!first && pos <= prev)) {
          Error("%s: leaf at member %s offset %llu: key out of order or outside the node's range", name, label,
                off);
          break;
        }
        prev = pos;
        first = false;
        ts.keys++;
      }
      return;
    }
    // Interior: child i covers (key i-1) + 1 .. key i; the first starts at the
    // node's min, the last ends at its max.
    const u8 cl = u8(info.level - 1);
    expect[cl].Clear();
    next[cl] = 0;
    const btree::Set& s = node.set(0);
    btree::Pos want_min = info.min;
    for (u32 i = 0; i < s.size(); i++) {
      btree::KeyRef k = s.Key(i);
      btree::NodePtrFormat cp;
      MemCopy(&cp, k.value(), sizeof(cp));
      const btree::Pos key = k.pos();
      // key >= want_min: after the previous key, so the range is not empty.
      const bool wraps = key == btree::Pos::Max(info.btree_id) && i + 1 < s.size();
      if (key < want_min || key > info.max || wraps || PtrMin(cp) != want_min || cp.level != cl ||
          cp.btree_id != info.btree_id) {
        Error("%s: interior node at member %s offset %llu: child %u does not cover (previous key + 1 .. its key)",
              name, label, off, i);
      }
      Status st = expect[cl].PushBack(Expect{cp, PtrMin(cp), key});
      if (!st.ok()) {
        stop = st;
        return;
      }
      want_min = Succ(key);
    }
    if (s.size() == 0 || s.Key(s.size() - 1).pos() != info.max)
      Error("%s: interior node at member %s offset %llu: children end before the node's max", name, label, off);
  }
};

// Whether `recorded` is below `found` anywhere (in all or on a member): a
// degraded mount could go on without a node's only copy.
bool DegradedCountsLow(const btree::Btrees::DegradedCounts& recorded, const btree::Btrees::DegradedCounts& found) {
  bool low = recorded.total < found.total;
  for (u32 m = 0; m < dev::kMaxDevices; m++) low = low || recorded.on[m] < found.on[m];
  return low;
}

// The roots block's degraded node counts (btree::Roots::degraded_nodes,
// degraded_on) against the walk's recount: the walk started from the
// roots block the trees were opened with (Btrees::roots) and reached every
// pointer. A degraded mount decides from the counts: one lower than found
// is an error, higher (the safe side) a note; -y moves the counts by the
// difference either way (RepairDegradedCounts).
void CheckDegradedCounts(store::Store& e, const BtreeCheck& bc, Ctx& c, BtreeFindings* found) {
  const btree::Roots& r = e.btrees().roots();
  btree::Btrees::DegradedCounts was;
  was.total = r.degraded_nodes;
  bool same = was.total == bc.degraded.total;
  for (u32 m = 0; m < dev::kMaxDevices; m++) {
    was.on[m] = r.degraded_on[m];
    same = same && was.on[m] == bc.degraded.on[m];
  }
  if (same) return;
  if (!found->degraded.PushBack(was).ok() || !found->degraded.PushBack(bc.degraded).ok()) {
    found->degraded.Clear();
    c.Line("btree: out of memory");
    c.report->exit_code = kExitOperational;
    return;
  }
  // Per member: "label recorded/recounted" for each that differs.
  char per[110];
  usize n = 0;
  per[0] = '\0';
  for (u32 m = 0; m < dev::kMaxDevices && n < sizeof(per); m++) {
    if (was.on[m] == bc.degraded.on[m]) continue;
    const char* label = m < e.sb().nr_members ? e.sb().members[m].label : "?";
    const int w = platform::Format(per + n, sizeof(per) - n, "%s%s %llu/%llu", n == 0 ? "" : ", ", label,
                                   (unsigned long long)was.on[m], (unsigned long long)bc.degraded.on[m]);
    if (w < 0 || usize(w) >= sizeof(per) - n) {  // (the rest cut: the line's length)
      per[n] = '\0';
      break;
    }
    n += usize(w);
  }
  // Counted higher than found on every member is the safe side (a degraded
  // mount refused that might have gone on): what a dropped subtree or
  // rebuilt roots leave (docs/format/btree.md, "Degraded nodes"). A note;
  // lower on any member is an error (a degraded mount could go on without
  // a node's only copy).
  const bool low = DegradedCountsLow(was, bc.degraded);
  (low ? c.report->errors : c.report->notes)++;
  c.Line("btree: the roots block counts %llu degraded node pointers (fewer copies than metadata_replicas), the "
         "walk found %llu (member counted/found: %s)%s; fsck -y writes the recount",
         (unsigned long long)was.total, (unsigned long long)bc.degraded.total, per[0] != '\0' ? per : "equal",
         low ? "" : " (too high: the safe side)");
}

// Walks the trees of an open store and checks their slots against the allocator.
// Problems with the allocator's btree buckets go to `found` (repaired by the caller).
// After an unclean shutdown a btree bucket without nodes is expected (the bucket a
// checkpoint was filling, or one an interrupted checkpoint wrote): a note, since
// the next mount frees it.
void CheckBtrees(store::Store& e, bool was_clean, Ctx& c, BtreeFindings* found) {
  // 1. The roots block.
  platform::Owned<btree::Roots> roots_owned = platform::Owned<btree::Roots>::Make();  // (a kernel frame's limit)
  if (!roots_owned) {
    c.Line("btree: out of memory");
    c.report->exit_code = kExitOperational;
    return;
  }
  btree::Roots& roots = *roots_owned;
  Diag d;
  Status st = btree::ReadRoots(e.devs(), e.sb(), &roots, &d);
  if (!st.ok()) {
    c.report->errors++;
    c.Line("btree: %s", d.empty() ? st.Message() : d.text);
    return;
  }
  if (!found->stale_since.Resize(dev::kMaxDevices).ok() || !found->stale_until.Resize(dev::kMaxDevices).ok()) {
    c.Line("btree: out of memory");
    c.report->exit_code = kExitOperational;
    return;
  }
  for (u32 m = 0; m < dev::kMaxDevices; m++) found->stale_since[m] = found->stale_until[m] = 0;
  for (u32 m = 0; m < e.sb().nr_members && m < dev::kMaxDevices; m++) {
    found->stale_since[m] = roots.stale_since[m];
    found->stale_until[m] = roots.stale_until[m];
    if (roots.stale_since[m] == 0) continue;
    c.report->notes++;
    c.Line("btree: member %s is stale: it missed roots gens %llu..%llu (the newest: gen %llu), so its copies of "
           "nodes written then may be damaged; every copy is checked below, and fsck -y rewrites the damaged ones",
           e.sb().members[m].label, (unsigned long long)roots.stale_since[m],
           (unsigned long long)roots.stale_until[m], (unsigned long long)roots.gen);
  }
  BtreeCheck* bc = platform::New<BtreeCheck>();  // ~1.5 KiB of arrays: not on a kernel stack
  if (bc != nullptr) {
    bc->c = &c;
    bc->sb = &e.sb();
    bc->trees = &e.btrees();
    bc->found = found;
    bc->node_size = e.btrees().node_size();
    st = bc->Init();
  }
  if (bc == nullptr || !st.ok()) {
    c.Line("btree: out of memory");
    c.report->exit_code = kExitOperational;
    platform::Delete(bc);
    return;
  }
  // 2, 3. Every node, and the shape.
  st = e.btrees().ForEachNodeContinuing(BtreeCheck::OnNode, BtreeCheck::OnError, bc);
  found->every_copy_checked = st.ok() && bc->lost_subtrees == 0;
  for (u32 id = 0; id < btree::kNrBtreeIds; id++)
    if (bc->stats[id].bad != 0) found->every_copy_checked = false;
  if (!st.ok()) {
    c.Line("btree: walking the trees failed: %s", st.Message());
    c.report->exit_code = kExitOperational;
    platform::Delete(bc);
    return;
  }
  if (bc->lines > kMaxLines) c.Line("btree: %u more node errors", bc->lines - kMaxLines);
  if (bc->lost_subtrees == 0) CheckDegradedCounts(e, *bc, c, found);
  // 4. Slots against buckets, both ways. Unless a subtree was lost: its nodes'
  // buckets would look unused, and freeing them would destroy what is left of
  // it; nor against allocation state known to be wrong (bad records, a lost
  // alloc node: its rebuild marks them).
  const sb::Superblock& s = e.sb();
  u32 bad = 0;
  for (u32 m = 0; m < s.nr_members && bc->lost_subtrees == 0 && !c.alloc_stale; m++) {
    for (u64 b = 0; b < s.members[m].nbuckets; b++) {
      const alloc::BucketState state = e.alloc().Get(m, b).state;
      const u32 used = bc->refs[m][b];
      const bool is_btree = state == alloc::BucketState::kBtree;
      if ((used != 0) == is_btree) continue;
      if (used == 0) {
        // After a crash: a checkpoint's bucket the cut left without nodes; on
        // a clean image: one the unmount's final checkpoint emptied
        // (docs/format/alloc.md). Harmless either way: the next mount frees
        // it before it allocates anything (Btrees::ReconcileBuckets).
        c.report->notes++;
        c.Line("btree: %s: bucket %llu holds no node (%s: the next mount frees it)", s.members[m].label,
               (unsigned long long)b, was_clean ? "left by the unmount's last checkpoint" : "not cleanly unmounted");
        continue;
      }
      if (used != 0 && state == alloc::BucketState::kFree && !was_clean) {
        // A cut after the mount's checkpoint (whose allocation records are
        // not journaled: the journal does not run yet) wrote its roots: the
        // trees are the truth, and the next mount marks the bucket before it
        // allocates anything (Btrees::ReconcileBuckets).
        c.report->notes++;
        c.Line("btree: %s: bucket %llu holds %u nodes but is free (not cleanly unmounted: the next mount marks it)",
               s.members[m].label, (unsigned long long)b, used);
        continue;
      }
      c.report->errors++;
      if (++bad <= kMaxLines) {
        if (used != 0)
          c.Line("btree: %s: bucket %llu holds %u nodes but is %s", s.members[m].label, (unsigned long long)b, used,
                 alloc::BucketStateName(state));
        else
          c.Line("btree: %s: bucket %llu is %s but holds no node of any tree", s.members[m].label,
                 (unsigned long long)b, alloc::BucketStateName(state));
      }
      if (!found->fixes
               .PushBack(BucketFix{m, b, used != 0 ? alloc::BucketState::kBtree : alloc::BucketState::kFree})
               .ok())
        c.report->exit_code = kExitOperational;
    }
  }
  if (bad > kMaxLines) c.Line("btree: %u more bucket errors", bad - kMaxLines);
  if (bc->lost_subtrees != 0)
    c.Line("btree: %u interior nodes unreadable: node slots not checked against the allocator", bc->lost_subtrees);
  // 5. Statistics.
  for (u32 id = 0; id < btree::kNrBtreeIds; id++) {
    const BtreeCheck::TreeStats& ts = bc->stats[id];
    if (ts.depth == 0) continue;
    char bad[40] = "";
    if (ts.bad != 0) platform::Format(bad, sizeof(bad), ", %llu bad", (unsigned long long)ts.bad);
    c.Line("btree %s: %llu nodes (%llu leaves), %llu keys, depth %u%s", kBtreeNames[id],
           (unsigned long long)ts.nodes, (unsigned long long)ts.leaves, (unsigned long long)ts.keys, ts.depth, bad);
  }
  platform::Delete(bc);
}

// Applies the bucket fixes the btree pass found (on a read-only open before this
// writable one). Mounting writable already reconciles btree buckets (Btrees::Open
// frees the ones no tree reaches and marks the ones that hold nodes), so a fix may
// be done already; after an unclean mount its checkpoint may have reused a freed
// bucket, so one still marked btree is then left alone.
void RepairBtreeBuckets(store::Store& e, const BtreeFindings& found, bool was_clean, Ctx& c) {
  for (const BucketFix& f : found.fixes) {
    const alloc::BucketState now = e.alloc().Get(f.member, f.bucket).state;
    const char* label = e.sb().members[f.member].label;
    bool done = now == f.want;
    if (!done && f.want == alloc::BucketState::kFree && now == alloc::BucketState::kBtree && !was_clean) {
      c.Line("btree: %s: bucket %llu left as btree (replay may have reused it); run fsck again", label,
             (unsigned long long)f.bucket);
      continue;
    }
    if (!done) done = FlagForStateRepair(e, c) && e.alloc().RepairState(f.member, f.bucket, f.want).ok();
    if (!done) continue;
    c.report->repaired++;
    c.Line("btree: %s: bucket %llu is now %s", label, (unsigned long long)f.bucket, alloc::BucketStateName(f.want));
  }
}

// Rewrites the nodes the btree pass found a damaged copy of (on a
// read-only open before this writable one): each dirtied, and the
// unmount's checkpoint writes every copy anew.
void RepairNodeCopies(store::Store& e, const BtreeFindings& found, Ctx& c) {
  bool all = true;
  for (const NodeRewrite& r : found.rewrites) {
    const Status st = e.btrees().RewriteNode(r.btree_id, r.level, r.max);
    if (st.code() == Err::kNotFound) {
      // The journal's replay took the tree below that level (or emptied
      // it): the node went with it, and its slots are released.
      c.report->repaired += r.damaged;
      c.Line("btree: %s: level-%u node seq %llu: gone since (the journal's replay changed the tree); nothing to "
             "rewrite",
             kBtreeNames[r.btree_id], unsigned(r.level), (unsigned long long)r.seq);
      continue;
    }
    if (!st.ok()) {
      all = false;
      c.Line("btree: %s: level-%u node seq %llu not rewritten: %s", kBtreeNames[r.btree_id], unsigned(r.level),
             (unsigned long long)r.seq, st.Message());
      continue;
    }
    c.report->repaired += r.damaged;
    c.Line("btree: %s: level-%u node seq %llu: every copy is written anew", kBtreeNames[r.btree_id],
           unsigned(r.level), (unsigned long long)r.seq);
  }
  // Every copy on the stale members verified, or rewritten (and none of this
  // open's writes failed so far): the next roots block -- this run's last
  // checkpoint -- no longer marks them. (A copy whose write fails in that
  // last checkpoint is not known here: its node is dirtied again, and the
  // next fsck finds the copy -- an error then, as it should be.)
  const u64 stale = found.StaleMask();
  if (stale == 0) return;
  if (!all || !found.every_copy_checked || e.btrees().GetStats().node_copy_write_errors != 0) {
    c.Line("btree: the stale members stay stale (not every copy could be checked or rewritten)");
    return;
  }
  e.btrees().ClearStaleMembers(stale);  // (no error was found: nothing counted repaired)
  c.Line("btree: every copy on the stale members is whole: they are stale no longer");
}

// The recount CheckDegradedCounts found different, into the roots block
// this repair writes last.
void RepairDegradedCounts(store::Store& e, const BtreeFindings& found, Ctx& c) {
  if (found.degraded.size() != 2) return;
  const Status st = e.btrees().AdjustDegradedCounts(found.degraded[0], found.degraded[1]);
  if (!st.ok()) {
    c.Line("btree: the degraded node counts are not corrected (%s); run 'tierfs fsck -y' again",
           st.code() == Err::kBusy ? "a count would leave its range" : st.Message());
    return;
  }
  if (DegradedCountsLow(found.degraded[0], found.degraded[1])) c.report->repaired++;  // (an error: repaired)
  c.Line("btree: the roots block's degraded node counts are the recount now");
}

// fsck -y's rebuild of allocation state that may be wrong -- nodes dropped
// (the alloc tree's among them), bad records, a journal replayed past damage
// (Store::Open calls it; docs/format/alloc.md, "fsck"): every bucket
// back to its layout state, then the buckets of every node the trees reach
// marked btree and those every pointer of every extent points into marked
// user, with the pointer's generation; then, in a second walk, each counted
// pointer's sectors added to its bucket's live or cached count by the data
// path's rule (data::PtrCountsIn, data::PtrSectors: docs/design/copies.md,
// "As built: step 3b-1").
struct AllocRebuild {
  store::Store* e = nullptr;
  u64 nodes = 0, extents = 0, bad_extents = 0;
};

Status MarkNodeBucket(void* ctx, const btree::NodeCopy& c) {
  auto* r = static_cast<AllocRebuild*>(ctx);
  const sb::Superblock& s = r->e->sb();
  // (A node outside the btree's buckets is the btree pass's finding. Node
  // slots are not counted in records: a btree bucket's live_sectors stay 0.)
  (void)r->e->alloc().RebuildMark(c.member, s.BucketOf(c.offset), alloc::BucketState::kBtree, 0);
  r->nodes++;
  return Status::Ok();
}

Status RebuildAlloc(void* ctx, store::Store& e) {
  auto* r = static_cast<AllocRebuild*>(ctx);
  r->e = &e;
  alloc::Allocator& a = e.alloc();
  a.BeginRebuild();
  Status st = e.btrees().ForEachSlot(MarkNodeBucket, r);
  if (!st.ok()) return st;  // a tree that cannot be walked: nothing is written
  // Two walks of the extents: the states and generations first, then the
  // counts against them -- the data path's rule, by the data path's own
  // walk (data::CountExtents), so the records say what the data path counts.
  btree::Iterator it(&e.btrees(), btree::kBtreeExtents);
  for (st = it.SeekToFirst(); st.ok() && it.Valid(); st = it.Next()) {
    data::Extent x;
    if (!data::ParseExtent(it.pos(), it.value(), it.val_bytes(), &x).ok()) {
      r->bad_extents++;  // the data pass deletes it
      continue;
    }
    if (x.unwritten) continue;  // a reservation: no bucket
    // Every copy's bucket, cached ones too (they hold data a pointer names).
    // A bad pointer is left to the data pass, which drops it (or the extent).
    bool bad = false;
    for (u32 i = 0; i < x.nr_ptrs; i++) {
      const data::Extent::Ptr& p = x.ptrs[i];
      u64 b;
      if (!data::PtrInBucket(e.sb(), x, p, &b) || !a.RebuildMark(p.dev, b, alloc::BucketState::kUser, p.gen))
        bad = true;  // outside, or into a node or layout bucket
    }
    if (bad) {
      r->bad_extents++;
      continue;
    }
    r->extents++;
  }
  if (!st.ok()) return st;
  // Every counted pointer counts in a user bucket (one the first walk did
  // not mark -- it points outside, or into a node or layout bucket -- is
  // the data pass's, which drops it).
  auto counts = platform::Owned<data::ExtentCounts>::Make();  // (kMaxDevices Vectors: off the stack)
  if (!counts) return Err::kNoMemory;
  TFS_TRY(data::CountExtents(&e.btrees(), e.sb(), a, counts.get()));
  for (u32 d = 0; d < a.members(); d++)
    for (u64 b = 0; b < a.nbuckets(d); b++) {
      if (counts->live(d, b) != 0) (void)a.RebuildCount(d, b, false, counts->live(d, b));
      if (counts->cached(d, b) != 0) (void)a.RebuildCount(d, b, true, counts->cached(d, b));
    }
  TFS_TRY(a.EndRebuild());
  // The accounting keys from the same walk, rewritten whole: every old
  // one (bad ones too: the load skipped them) deleted, the recounted ones
  // written.
  Vector<alloc::AcctValue> totals;
  TFS_TRY(data::AcctTotals(*counts, &totals));
  // And the inode count, from a walk of the inode records (the namespace
  // pass may delete or recreate some: the accounting pass recounts).
  alloc::AcctValue inodes;
  inodes.kind = alloc::AcctKind::kInodes;
  inodes.sectors = TFS_TRY(posix::CountInodeRecords(&e.btrees()));
  TFS_TRY(totals.PushBack(inodes));
  return e.RepairAcct(totals.data(), u32(totals.size()), true);
}

// The account of every damaged node the open dropped and what the node scan
// recovered of its range. The btree pass counts each bad node as an error (on
// the read-only open with -y); with -y dropping it is its repair.
void ReportDroppedNodes(store::Store& e, const Options& opt, bool roots_rebuilt, Ctx& c) {
  const Vector<btree::LostNode>& lost = e.btrees().lost_nodes();
  if (lost.empty()) return;
  const btree::Stats st = e.btrees().GetStats();
  c.Line("btree: node scan: %llu node headers outside the trees, %llu valid copies of the damaged ranges",
         (unsigned long long)st.scanned_slots, (unsigned long long)st.scan_copies);
  char none[160] = "";
  for (const btree::LostNode& ln : lost) {
    // A rebuild of lost roots lists every tree. One of them with no copy
    // anywhere: empty before, or its keys are lost -- said once for all such
    // trees, unless the old roots named a root for it.
    if (roots_rebuilt && ln.copies == 0 && btree::PtrEmpty(ln.ptr)) {
      const usize at = StrLen(none);
      platform::Format(none + at, sizeof(none) - at, "%s%s", at == 0 ? "" : ", ",
                       ln.btree_id < btree::kNrBtreeIds ? kBtreeNames[ln.btree_id] : "?");
      continue;
    }
    const char* name = ln.btree_id < btree::kNrBtreeIds ? kBtreeNames[ln.btree_id] : "?";
    const btree::NodeCopy at =
        btree::PtrEmpty(ln.ptr) ? btree::NodeCopy{btree::kNoMember, 0} : btree::PtrCopy(ln.ptr, 0);
    const char* label = at.member < e.sb().nr_members ? e.sb().members[at.member].label : "?";
    char got[160];
    if (ln.copies == 0) {
      platform::Format(got, sizeof(got), "no copy of its range was found: its keys are lost");
    } else {
      platform::Format(got, sizeof(got),
                       "%llu keys recovered from %u copies the scan found (newest: journal entry %llu)%s",
                       (unsigned long long)ln.recovered_keys, ln.copies, (unsigned long long)ln.newest_copy_seq,
                       ln.fully_covered ? ", covering its whole range"
                                        : "; part of its range has no copy: its keys there are lost");
    }
    if (roots_rebuilt) {
      c.Line("btree %s: rebuilt: %s", name, got);
      continue;
    }
    c.Line("btree %s: %s the damaged level-%u node at member %s offset %llu (keys %llu:%llu..%llu:%llu): %s", name,
           opt.repair ? "dropped" : "would drop", unsigned(ln.level), label, (unsigned long long)at.offset,
           (unsigned long long)ln.min.inode, (unsigned long long)ln.min.offset, (unsigned long long)ln.max.inode,
           (unsigned long long)ln.max.offset, got);
    if (opt.repair && !roots_rebuilt) c.report->repaired++;  // (else one repair: the roots)
  }
  if (none[0] != '\0') c.Line("btree: no copy of any node of: %s (empty trees, or their keys are lost)", none);
  c.Line("btree: the checks below %s what depended on the lost keys", opt.repair ? "repair" : "report");
}

// The superblock's incompatible feature flags against what the namespace
// uses (`had`: the flags before the open; `use`: what the namespace pass
// found, and whether its -y upgrade flagged capabilities). A chunked value
// or a flagged inode without kSbXattrChunks lets an older build mount the
// filesystem and misread it: an error (posix records the flag before it
// writes either, so no cut leaves one; -y: the open set it). A flag nothing
// needs keeps older builds off for nothing; every read-write mount sets it,
// so that is the normal state, not a finding -- -y clears it and says so
// (the downgrade path). -y leaves kSbCapsFlagged set exactly when the flags
// are in use: the check has flagged every capability. kSbExtentPolicy goes
// the same way with the extents that record a policy.
void FeatureFlags(store::Store& e, const Options& opt, u16 had, const FeatureUse& use, Ctx& c) {
  const u16 needed = use.in_use || use.upgraded ? posix::kSbFeatures : u16(0);
  if (use.in_use && (had & sb::kSbXattrChunks) == 0) {
    c.report->errors++;
    c.Line("superblock: the chunked-xattrs flag is missing, but chunked xattrs or capability flags are in use "
           "(a build before them would misread them)%s",
           opt.repair ? "" : "; 'tierfs fsck -y' sets it");
    if (opt.repair) {
      c.report->repaired++;
      c.Line("superblock: set the chunked-xattrs flag");
    }
  } else if (opt.repair && use.upgraded) {
    c.Line("superblock: recorded that every security.capability is flagged (the upgrade above)");
  } else if (opt.repair && (had & ~needed & posix::kSbFeatures) != 0) {
    c.report->notes++;
    c.Line("superblock: cleared the chunked-xattrs flag, which nothing uses (no chunked xattr, no inode flagged "
           "for security.capability): builds before it can mount the filesystem until the next read-write mount");
  }
  // The extents' policies (sb::kSbExtentPolicy), the same way.
  if (use.extent_policy && (had & sb::kSbExtentPolicy) == 0) {
    c.report->errors++;
    c.Line("superblock: the extent-policy flag is missing, but extents record policies (a build before them would "
           "call those extents corrupt)%s", opt.repair ? "" : "; 'tierfs fsck -y' sets it");
    if (opt.repair) {
      c.report->repaired++;
      c.Line("superblock: set the extent-policy flag");
    }
  } else if (opt.repair && !use.extent_policy && (had & sb::kSbExtentPolicy) != 0) {
    c.report->notes++;
    c.Line("superblock: cleared the extent-policy flag, which nothing uses (no extent records a policy): builds "
           "before it can mount the filesystem until the next read-write mount");
  }
  if (opt.repair) e.SetFeatures(u16(needed | (use.extent_policy ? sb::kSbExtentPolicy : 0)));
}

}  // namespace

Report Check(BlockDevice* const* bdevs, u32 count, const Options& opt, EmitFn emit, void* ctx) {
  Report report;
  Ctx c{emit, ctx, &report};
  auto no_memory = [&] {  // the check could not run: fsck(8)'s operational error
    c.Line("cannot check: out of memory");
    report.exit_code = kExitOperational;
    return report;
  };
  bool copies_ok = true;
  for (u32 i = 0; i < count; i++) copies_ok = CheckCopies(*bdevs[i], opt, c) && copies_ok;
  if (!copies_ok) {  // not a member (or no copy left to repair from): nothing can be checked
    report.exit_code = kExitOperational;
    return report;
  }

  // With -y the btree pass runs on a read-only open first: a writable mount
  // reconciles the btree buckets itself, which would hide what was wrong.
  BtreeFindings btree_found;
  if (opt.repair) {
    auto ro_owned = platform::Owned<store::Store>::Make();  // big: off the stack
    if (!ro_owned) return no_memory();
    store::Store& ro = *ro_owned;
    store::OpenOptions roo;
    roo.read_only = true;
    roo.btree.drop_bad_nodes = true;
    Diag rd;
    store::OpenReport rrep;
    if (ro.Open(bdevs, count, roo, &rd, &rrep).ok()) {
      // Trees older than the filesystem are not checked (their "unreferenced"
      // nodes and buckets are the newer trees'): the writable open rebuilds
      // every tree from a node scan, and says so.
      if (!rrep.stale_roots) {
        c.alloc_stale = AllocSuspect(ro, rrep);
        CheckBtrees(ro, rrep.was_clean, c, &btree_found);
        c.alloc_stale = false;
      }
      ro.Close().IgnoreError();
    }  // else the writable open below reports why
  }

  auto e_owned = platform::Owned<store::Store>::Make();
  if (!e_owned) return no_memory();
  store::Store& e = *e_owned;
  store::OpenOptions oo;
  oo.read_only = !opt.repair;
  // A damaged node does not stop the check: it is dropped (in memory only
  // with -n) and its range recovered from the copies a node scan finds; the
  // passes below check (and repair) what the trees hold then.
  oo.btree.drop_bad_nodes = true;
  AllocRebuild rebuild;
  if (opt.repair) {
    oo.rebuild_alloc = RebuildAlloc;
    oo.rebuild_ctx = &rebuild;
    oo.replay_past_damage = true;
    oo.rebuild_roots = true;
    // As every read-write open for posix: its repairs use posix's formats.
    // The end of the check clears what nothing needs (FeatureFlags).
    oo.features = sb::kSbXattrChunks | sb::kSbExtentPolicy;  // (kSbCapsFlagged: once the check has flagged every capability)
  }
  auto rep_owned = platform::Owned<store::OpenReport>::Make();  // (the kernel's frame limit: off the stack)
  if (!rep_owned) return no_memory();
  store::OpenReport& rep = *rep_owned;
  Diag d;
  Status st = e.Open(bdevs, count, oo, &d, &rep);
  if (!st.ok()) {
    c.Line("cannot open the filesystem: %s", d.empty() ? st.Message() : d.text);
    // Damaged structures are errors left uncorrected; a device set that is not one
    // whole filesystem (a member missing, a foreign device) or a failing device
    // means the check could not run (fsck(8)'s operational error).
    report.errors++;
    report.exit_code = st.Is(ErrorClass::kCorrupt) ? kExitUncorrected : kExitOperational;
    return report;
  }
  c.acct_cut_short = (e.sb().flags & sb::kSbAcctRepair) != 0;
  if (!rep.was_clean) {
    report.notes++;
    c.Line("not cleanly unmounted: %llu journal entries (%llu keys) %s", (unsigned long long)rep.replay.entries.size(),
           (unsigned long long)rep.replayed_keys, opt.repair ? "replayed" : "would be replayed");
  }
  if (rep.replay.bad_headers > 0) {
    report.notes++;
    c.Line("journal: %llu damaged or torn entries ignored", (unsigned long long)rep.replay.bad_headers);
  }
  const journal::ReplayResult& rr = rep.replay;
  if (rr.durable_end != 0) {
    // Damage, not a torn write: acknowledged changes are gone (ReplayResult).
    report.errors++;
    c.Line("journal: entry %llu is damaged, but later entries up to %llu were durable: %llu entries are lost",
           (unsigned long long)rr.gap_at, (unsigned long long)rr.durable_end, (unsigned long long)rr.lost_entries);
    if (rep.replayed_past_damage) {
      report.repaired++;
      c.Line("journal: replayed every surviving entry up to %llu; the checks below repair what the lost ones "
             "changed",
             (unsigned long long)rr.durable_end);
    } else {
      c.Line("journal: the trees are checked without the %llu entries after the damage; 'tierfs fsck -y' replays "
             "them",
             (unsigned long long)rr.discarded_entries);
    }
  } else if (rr.gap_at != 0 && rr.discarded_entries > 0) {
    c.Line("journal: entry %llu missing (a torn write); %llu later entries were never acknowledged and are not "
           "replayed",
           (unsigned long long)rr.gap_at, (unsigned long long)rr.discarded_entries);
    report.notes++;
  }
  if (rep.lost_data_btrees != 0) {
    // A cut ended an fsck -y between writing the trees without the nodes it
    // dropped and finishing the namespace repair: the passes below must treat
    // those trees as having lost keys (recreate inodes rather than delete the
    // names and data that survive them).
    report.errors++;
    c.Line("btree: an earlier 'fsck -y' dropped damaged nodes (trees 0x%x) and was cut short before its repair "
           "finished; %s",
           unsigned(rep.lost_data_btrees), opt.repair ? "the passes below finish it" : "'tierfs fsck -y' finishes it");
  }
  if (rep.stale_roots) {
    c.Line("%s", rep.stale_why.text);
    report.errors++;
    if (!rep.roots_rebuilt) {  // -n
      c.Line("btree roots: the trees are not checked against an older roots block; 'tierfs fsck -y' rebuilds "
             "them from a scan for their nodes");
      e.Close().IgnoreError();
      report.exit_code = kExitUncorrected;
      return report;
    }
    report.repaired++;
    c.Line("btree roots: rebuilt every tree from the newest copies of its leaves a scan for nodes found (%llu keys)",
           (unsigned long long)e.btrees().GetStats().recovered_keys);
  }
  if (rep.bad_alloc_records != 0) {
    // Each a bucket whose state is unknown (docs/format/alloc.md, "Validity").
    report.errors += rep.bad_alloc_records;
    c.Line("%s", rep.alloc_why.text);
    if (rep.bad_alloc_records > 1)
      c.Line("alloc: %llu more bad allocation records", (unsigned long long)(rep.bad_alloc_records - 1));
    if (rep.alloc_rebuilt) {
      report.repaired += rep.bad_alloc_records;
    } else {
      c.Line("alloc: data is not checked against allocation state with bad records; 'tierfs fsck -y' rebuilds it");
    }
  }
  if (rep.alloc_rebuilt) {
    c.Line("alloc: rebuilt every member's allocation state from %llu btree node copies and %llu extents (%llu bad "
           "extents left to the data pass) and wrote its records",
           (unsigned long long)rebuild.nodes, (unsigned long long)rebuild.extents,
           (unsigned long long)rebuild.bad_extents);
  }
  ReportDroppedNodes(e, opt, rep.roots_rebuilt, c);
  c.alloc_stale = AllocSuspect(e, rep) && !rep.alloc_rebuilt;
  CheckAllocator(e, opt, c);
  if (opt.repair) {
    RepairNodeCopies(e, btree_found, c);
    RepairDegradedCounts(e, btree_found, c);
    // A rebuilt state already has every bucket holding a node marked btree
    // and no other; the read-only pass's fixes were against the old one.
    if (!rep.alloc_rebuilt) {
      RepairBtreeBuckets(e, btree_found, rep.was_clean, c);
    } else if (!btree_found.fixes.empty()) {
      // The rebuild settled them (a bucket holding a copy the node scan
      // took keys from stays btree until this repair's checkpoint releases
      // it: a cut -y leaves such a bucket for the next run to find).
      report.repaired += u32(btree_found.fixes.size());
      c.Line("btree: the rebuilt allocation state settles the %u bucket finding(s) above",
             unsigned(btree_found.fixes.size()));
    }
  } else {
    CheckBtrees(e, rep.was_clean, c, &btree_found);
  }
  FeatureUse features;
  const bool namespace_done = CheckNamespace(e, opt, c, rep.features, &features);
  CheckBackpointerTree(e, opt, c);
  // (A pass that could not run to the end said why in its line: fsck(8)'s
  // operational error. The flag it set, if any, stays for the next -y.)
  if (!CheckBucketCounts(e, opt, c)) report.exit_code = kExitOperational;
  if (namespace_done) FeatureFlags(e, opt, rep.features, features, c);
  if (opt.repair && namespace_done && e.lost_data_btrees() != 0) {
    // What depended on the dropped nodes is repaired; the unmount below
    // records it, after the repairs are durable.
    e.ClearLostData();
    if (rep.lost_data_btrees != 0) {
      report.repaired++;
      c.Line("btree: finished the repair the earlier 'fsck -y' left unfinished");
    }
  }
  // (Repairs are records and keys committed through the journal: the
  // unmount's checkpoints write them.)
  st = e.Close();
  if (!st.ok()) {
    c.Line("closing the filesystem failed: %s", st.Message());
    report.exit_code = kExitOperational;
    return report;
  }
  if (report.exit_code == kExitOperational) {
    // keep it
  } else if (report.errors == 0) {
    report.exit_code = kExitClean;
  } else if (report.repaired >= report.errors) {
    report.exit_code = kExitRepaired;
  } else {
    report.exit_code = kExitUncorrected;
  }
  return report;
}

}  // namespace tfs::fsck
