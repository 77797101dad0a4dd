// The counts in the records (docs/design/copies.md, "As built: step 3b-2"):
// every bucket's live and cached sectors are the allocator's, changed only
// inside the extent transactions that change them -- computed by the data
// path's commit hook under commit_mu, journaled with the extents, published
// once journaled. Three views must agree for every bucket after every step:
// (1) the allocator in memory, (2) the records read back from the alloc
// btree, (3) a recount of the extents by the one rule (data::PtrBucket,
// PtrCountsIn, PtrSectors); and right after every mount a walk of the
// extents finds nothing the trusted records and accounting keys
// contradict (DataPath::VerifyAgainstExtents) --
// across writes, overwrites, punches, truncates, fallocates, unlinks,
// replicas, compression and cached copies, remounts and power cuts (durable
// and torn), two files committing into one bucket in either order, and a
// journal that refuses a commit. Damage: records or accounting totals made
// wrong make the mount refuse in one line until fsck -y recounts them (the
// cross-check), but for what no total restates (cached counts, the
// reserved total), which the mount goes on with and fsck finds; a punch
// over a count made too low stops at 0; an apply that fails after the
// journal took the entry has published the counts. The allocator's kept
// per-member sums equal a walk of its buckets at every check.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "btree/format.h"
#include "data/data.h"
#include "data/testing.h"
#include "fsck/fsck.h"
#include "mount/testing.h"
#include "platform/platform.h"
#include "posix/fs.h"
#include "userspace/platform/log.h"
#include "userspace/platform/mem_device.h"
#include "userspace/platform/pressure.h"

namespace tfs {
namespace {

using posix::Filesystem;
using userspace::MemDevice;

const posix::Caller kRoot{0, 0};

// A device over a MemDevice that fails journal writes while told to (what
// a member whose journal ring stops taking writes does to the journal), and
// reads of alloc btree leaves while told to (a leaf read error: the node's
// header, as the device holds it, names the tree).
class JournalFailDevice final : public BlockDevice {
 public:
  explicit JournalFailDevice(MemDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    if (req->op == IoOp::kWrite && req->origin == IoOrigin::kJournal && failing_.load()) {
      failed_++;
      req->done(req, Status(Err::kIo));
      return;
    }
    if (req->op == IoOp::kRead && req->origin == IoOrigin::kBtree && failing_alloc_reads_.load() &&
        req->length >= sizeof(btree::NodeHeader)) {
      btree::NodeHeader h;
      inner_->ReadRaw(req->offset, &h, sizeof(h));
      if (h.magic.get() == btree::kNodeMagic && h.btree_id == btree::kBtreeAlloc && h.level == 0) {
        failed_reads_++;
        req->done(req, Status(Err::kIo));
        return;
      }
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }
  void Fail(bool on) { failing_.store(on); }
  u64 failed() const { return failed_.load(); }
  void FailAllocLeafReads(bool on) { failing_alloc_reads_.store(on); }
  u64 failed_reads() const { return failed_reads_.load(); }

 private:
  MemDevice* inner_;
  std::atomic<bool> failing_{false};
  std::atomic<u64> failed_{0};
  std::atomic<bool> failing_alloc_reads_{false};
  std::atomic<u64> failed_reads_{0};
};

std::unique_ptr<MemDevice> Member(u64 size = testing::kMemberBytes, std::vector<u8> image = {}) {
  userspace::MemDeviceOptions o;
  o.name = "ssd0";
  o.size = size;
  o.volatile_cache = true;
  o.initial_image = std::move(image);
  return std::make_unique<MemDevice>(o);
}

// n bytes from `seed`: random, or (compressible) runs of a few letters.
std::string Bytes(u64 n, u32 seed, bool compressible = false) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  if (!compressible) {
    for (char& c : s) c = char(rng());
    return s;
  }
  const u32 letters = 2 + rng() % 5;
  for (u64 i = 0; i < n; i++) s[i] = char('a' + (i / 97 + seed) % letters);
  return s;
}

// A context writing on member `dev` alone (the engines' class).
data::IoContext On(u32 dev) {
  return {IoOrigin::kReconcile, dev::IoClass::kBackground, alloc::Watermark::kBackground,
          data::Target{data::TargetKind::kMember, u8(dev)}};
}

btree::Pos At(u64 ino, u64 end) { return btree::Pos{btree::kBtreeExtents, ino, end}; }

// Members "ssd.a", "ssd.b", ... (each seen through a JournalFailDevice),
// and posix mounted on them.
struct Accounts {
  std::vector<std::unique_ptr<MemDevice>> mems;
  std::vector<std::unique_ptr<JournalFailDevice>> fails;
  store::OpenOptions so;
  std::unique_ptr<testing::MountedFs> m;
  // What the check after each mount must find (-1: whatever it finds):
  // bucket counts and accounting totals the extents contradict.
  i64 want_mismatches = 0;
  i64 want_acct = 0;

  Accounts(u32 members, const store::FormatOptions& fo, const store::OpenOptions& o = {}) : so(o) {
    for (u32 i = 0; i < members; i++) mems.push_back(Member());
    MakeDevs();
    EXPECT_TRUE(testing::FormatMembers(Devs(), fo).ok());
    Mount();
  }
  // From images (what a power cut left).
  Accounts(const std::vector<std::vector<u8>>& images, const store::OpenOptions& o = {}, i64 mismatches = 0,
           bool mount = true)
      : so(o), want_mismatches(mismatches) {
    for (auto& img : images) mems.push_back(Member(img.size(), img));
    MakeDevs();
    if (mount) Mount();
  }
  ~Accounts() { m.reset(); }
  void MakeDevs() {
    for (auto& mem : mems) fails.push_back(std::make_unique<JournalFailDevice>(mem.get()));
  }
  std::vector<BlockDevice*> Devs() {
    std::vector<BlockDevice*> d;
    for (auto& f : fails) d.push_back(f.get());
    return d;
  }
  // Every mount trusts the records and the accounting keys (no walk of
  // the extents): right after it, a walk finds nothing they contradict
  // (or what the test made wrong: want_mismatches, want_acct).
  void Mount() {
    m = std::make_unique<testing::MountedFs>(Devs(), so);
    ASSERT_TRUE(m->open());
    u64 counts = 0, totals = 0;
    ASSERT_TRUE(m->data.VerifyAgainstExtents(&counts, &totals).ok());
    if (want_mismatches >= 0) {
      EXPECT_EQ(counts, u64(want_mismatches)) << "the records' counts differed from the extents'";
    }
    if (want_acct >= 0) {
      EXPECT_EQ(totals, u64(want_acct)) << "the accounting totals differed from the extents'";
    }
  }
  // A read-write open of the store refuses in one line (the cross-check of
  // the accounting against the records, docs/format/alloc.md "Mount");
  // fsck -n reports the damage, fsck -y recounts it from the extents, and
  // the mount after that goes on (and finds nothing).
  void ExpectRefusedUntilFsck() {
    m.reset();
    {
      store::Store s;
      Diag d;
      auto devs = Devs();
      Status st = s.Open(devs.data(), u32(devs.size()), so, &d);
      EXPECT_TRUE(st.Is(ErrorClass::kCorrupt)) << "a read-write open went on";
      EXPECT_NE(std::string(d.text).find("alloc: the space accounting disagrees with the bucket records"),
                std::string::npos)
          << d.text;
      EXPECT_EQ(std::string(d.text).find('\n'), std::string::npos);
    }
    std::string out;
    fsck::Report r = FsckUnmounted(&out);
    EXPECT_EQ(r.exit_code, fsck::kExitUncorrected) << out;
    out.clear();
    r = FsckUnmounted(&out, true);
    EXPECT_EQ(r.exit_code, fsck::kExitRepaired) << out;
    want_mismatches = want_acct = 0;
    Mount();
  }
  void Remount() {
    m.reset();
    Mount();
  }
  Filesystem& fs() { return m->fs; }
  data::DataPath& data() { return m->data; }
  alloc::Allocator& alloc() { return m->store->alloc(); }

  u64 Create(const std::string& name, const char* replicas = nullptr) {
    auto a = fs().Mknod(posix::kRootIno, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, kRoot);
    EXPECT_TRUE(a.ok());
    if (!a.ok()) return 0;
    if (replicas != nullptr) {
      EXPECT_TRUE(fs().SetXattr(a.value().ino, "tierfs.replicas", 15, replicas, u32(strlen(replicas)), 0,
                                Filesystem::kFrontEndChecked)
                      .ok());
    }
    return a.value().ino;
  }
  std::string Read(u64 ino, u64 size) {
    std::string got(size, '\0');
    auto r = fs().Read(ino, 0, got.data(), u32(size));
    EXPECT_TRUE(r.ok()) << r.status().Message();
    if (r.ok()) got.resize(r.value());
    return got;
  }
  // Writes `n` blocks of `seed`'s bytes at block `first` of `ino` (O_DIRECT:
  // one commit, in this call), and with `sync` fsyncs them.
  Status DirectWrite(u64 ino, u64 first, u32 n, u32 seed, bool sync = false) {
    const std::string b = Bytes(u64(n) * data::kBlockSize, seed);
    auto r = fs().Write(ino, first * data::kBlockSize, b.data(), u32(b.size()), Filesystem::kWriteDirect);
    if (!r.ok()) return r.status();
    return sync ? fs().Fsync(ino) : Status::Ok();
  }
  // The extents of `ino`, parsed (their values kept in *vals).
  std::vector<data::Extent> Extents(u64 ino, std::vector<std::vector<u8>>* vals) {
    std::vector<data::Extent> out;
    vals->clear();
    vals->reserve(4096);
    btree::Iterator it(&m->store->btrees(), btree::kBtreeExtents);
    EXPECT_TRUE(it.Seek(At(ino, 0)).ok());
    for (; it.Valid() && it.pos().inode == ino; it.Next().IgnoreError()) {
      vals->emplace_back(it.value(), it.value() + it.val_bytes());
      data::Extent e;
      EXPECT_TRUE(data::ParseExtent(it.pos(), vals->back().data(), u32(vals->back().size()), &e).ok());
      out.push_back(e);
    }
    return out;
  }

  // The three views of every bucket agree: the allocator's state (1) is the
  // record the alloc btree holds (2) -- byte for byte, or no key for a
  // bucket never recorded -- and its counts are the extents' recount (3);
  // no counted pointer lies in a bucket that is not user. The accounting
  // totals too (alloc/accounting.h): memory's is the tree's key (byte for
  // byte; a set's key of 0 may stay after its data went) and the extents'
  // recount -- the unwritten sectors, and the sectors per set of members
  // each extent's counted plain pointers are on. Returns the user buckets
  // seen.
  u64 CheckViews() {
    store::Store& s = *m->store;
    std::map<std::pair<u64, u64>, std::vector<u8>> tree;
    {
      btree::Iterator it(&s.btrees(), btree::kBtreeAlloc);
      EXPECT_TRUE(it.SeekToFirst().ok());
      for (; it.Valid(); it.Next().IgnoreError())
        tree[{it.pos().inode, it.pos().offset}].assign(it.value(), it.value() + it.val_bytes());
    }
    std::map<std::pair<u64, u64>, std::pair<u64, u64>> want;  // (live, cached) sectors
    std::map<u64, u64> want_sets;  // member mask -> sectors
    u64 want_reserved = 0;
    {
      btree::Iterator it(&s.btrees(), btree::kBtreeExtents);
      EXPECT_TRUE(it.SeekToFirst().ok());
      for (; it.Valid(); it.Next().IgnoreError()) {
        std::vector<u8> v(it.value(), it.value() + it.val_bytes());
        data::Extent e;
        EXPECT_TRUE(data::ParseExtent(it.pos(), v.data(), u32(v.size()), &e).ok());
        if (e.unwritten) want_reserved += u64(e.blocks()) * (data::kBlockSize / 512);
        u64 mask = 0;
        for (u32 c = 0; c < e.nr_ptrs; c++) mask |= e.ptrs[c].cached ? 0 : u64(1) << e.ptrs[c].dev;
        if (mask != 0) want_sets[mask] += data::PtrSectors(e);
        for (u32 c = 0; c < e.nr_ptrs; c++) {
          const data::Extent::Ptr& p = e.ptrs[c];
          u64 b;
          EXPECT_TRUE(data::PtrBucket(s.sb(), p, &b));
          const alloc::Bucket k = s.alloc().Get(p.dev, b);
          if (!data::PtrCountsIn(p, k.state == alloc::BucketState::kUser, k.gen)) continue;
          auto& w = want[{p.dev, b}];
          (p.cached ? w.second : w.first) += data::PtrSectors(e);
        }
      }
    }
    u64 users = 0;
    for (u32 d = 0; d < mems.size(); d++) {
      // The allocator's kept sums (Usage) are its buckets summed.
      alloc::BucketSums scan;
      EXPECT_TRUE(s.alloc().SumsMatchScan(d, &scan)) << "member " << d << ": the kept sums are not the buckets'";
      EXPECT_EQ(s.alloc().Usage(d).live_sectors, scan.live_sectors);
      for (u64 b = 0; b < s.alloc().nbuckets(d); b++) {
        const alloc::Bucket k = s.alloc().Get(d, b);
        auto w = want.find({d, b});
        const std::pair<u64, u64> counts = w == want.end() ? std::pair<u64, u64>{0, 0} : w->second;
        if (k.state == alloc::BucketState::kUser) {
          users++;
          EXPECT_EQ(k.live_sectors, counts.first) << "member " << d << " bucket " << b << ": live, memory vs extents";
          EXPECT_EQ(k.cached_sectors, counts.second)
              << "member " << d << " bucket " << b << ": cached, memory vs extents";
        } else {
          EXPECT_EQ(counts, (std::pair<u64, u64>{0, 0}))
              << "member " << d << " bucket " << b << ": counted pointers in a " << alloc::BucketStateName(k.state)
              << " bucket";
        }
        auto t = tree.find({d, b});
        if (k.unrecorded) {
          // Allocated, no transaction counted in it yet: the tree still
          // holds its free record (or none), and memory counts nothing.
          EXPECT_EQ(k.state, alloc::BucketState::kUser) << "member " << d << " bucket " << b;
          EXPECT_EQ(counts, (std::pair<u64, u64>{0, 0})) << "member " << d << " bucket " << b;
          alloc::Bucket was = k;
          was.state = alloc::BucketState::kFree;
          alloc::AllocRecord r;
          alloc::EncodeRecord(was, &r);
          EXPECT_TRUE(t == tree.end() ? !k.recorded
                                      : t->second.size() == sizeof(r) && memcmp(t->second.data(), &r, sizeof(r)) == 0)
              << "member " << d << " bucket " << b << ": an unrecorded bucket's record is not its free one";
          continue;
        }
        if (!k.recorded) {
          EXPECT_TRUE(t == tree.end()) << "member " << d << " bucket " << b << ": a record of a bucket never recorded";
          continue;
        }
        if (t == tree.end()) {
          ADD_FAILURE() << "member " << d << " bucket " << b << ": no record in the tree";
          continue;
        }
        alloc::AllocRecord r;
        alloc::EncodeRecord(k, &r);
        alloc::Bucket got;
        Diag diag;
        EXPECT_TRUE(alloc::ParseRecord(s.sb(), d, b, t->second.data(), u32(t->second.size()), &got, &diag).ok())
            << diag.text;
        EXPECT_TRUE(t->second.size() == sizeof(r) && memcmp(t->second.data(), &r, sizeof(r)) == 0)
            << "member " << d << " bucket " << b << ": the tree's record (live " << got.live_sectors << ", cached "
            << got.cached_sectors << ", v" << got.version << ") is not memory's (live " << k.live_sectors
            << ", cached " << k.cached_sectors << ", v" << k.version << ")";
      }
    }
    CheckAcctViews(tree, want_sets, want_reserved);
    return users;
  }
  void CheckAcctViews(const std::map<std::pair<u64, u64>, std::vector<u8>>& tree,
                      const std::map<u64, u64>& want_sets, u64 want_reserved) {
    store::Store& s = *m->store;
    const u64 reserved_key = alloc::AcctInode(alloc::AcctKind::kReserved);
    const u64 replicas_key = alloc::AcctInode(alloc::AcctKind::kReplicas);
    const u64 inodes_key = alloc::AcctInode(alloc::AcctKind::kInodes);
    EXPECT_EQ(s.acct().reserved_sectors(), want_reserved) << "reserved: memory vs extents";
    // The inode count: memory = the inode records (posix made at least its root).
    auto records = posix::CountInodeRecords(&s.btrees());
    ASSERT_TRUE(records.ok());
    EXPECT_EQ(s.acct().inodes(), records.value()) << "inodes: memory vs records";
    EXPECT_GE(records.value(), 1u);
    std::vector<alloc::ReplicasEntry> mem(s.acct().Replicas(nullptr, 0));
    s.acct().Replicas(mem.data(), u32(mem.size()));
    std::map<u64, u64> have;
    for (const alloc::ReplicasEntry& r : mem) have[r.members] = r.sectors;
    for (const auto& [mask, sectors] : want_sets)
      EXPECT_EQ(have.count(mask) ? have[mask] : ~u64(0), sectors) << "replicas 0x" << std::hex << mask
                                                                  << ": memory vs extents";
    for (const auto& [mask, sectors] : have) {
      if (!want_sets.count(mask)) {
        EXPECT_EQ(sectors, 0u) << "replicas 0x" << std::hex << mask << ": no extent";
      }
    }
    // Every key of the tree's accounting range is memory's total.
    for (const auto& [pos, val] : tree) {
      if (!alloc::IsAcctKey(pos.first)) continue;
      u64 sectors = ~u64(0);
      Diag diag;
      EXPECT_TRUE(alloc::ParseAcct(s.sb(), pos.first, pos.second, val.data(), u32(val.size()), &sectors, &diag).ok())
          << diag.text;
      if (pos.first == reserved_key) {
        EXPECT_EQ(sectors, s.acct().reserved_sectors()) << "reserved: tree vs memory";
      } else if (pos.first == inodes_key) {
        EXPECT_EQ(pos.second, 0u);
        EXPECT_EQ(sectors, s.acct().inodes()) << "inodes: tree vs memory";
      } else {
        EXPECT_EQ(pos.first, replicas_key);
        EXPECT_TRUE(have.count(pos.second) && have[pos.second] == sectors)
            << "replicas 0x" << std::hex << pos.second << ": tree vs memory";
      }
    }
    // ... and every nonzero total of memory's has its key.
    for (const auto& [mask, sectors] : have)
      EXPECT_TRUE(sectors == 0 || tree.count({replicas_key, mask})) << "replicas 0x" << std::hex << mask
                                                                    << ": no key in the tree";
    EXPECT_TRUE(s.acct().reserved_sectors() == 0 || tree.count({reserved_key, 0})) << "reserved: no key in the tree";
    EXPECT_TRUE(tree.count({inodes_key, 0})) << "inodes: no key in the tree";
  }

  // A cached copy of the first written extent of `ino` that has a member
  // free for one (and fits a bucket's room whole), on that member, holding
  // `content`'s bytes of its blocks: written by the data path on that
  // member, added with data::AddPtr and committed through the data path
  // (cached blocks). False if no extent could take one.
  bool AddCachedCopy(u64 ino, const std::string& content) {
    std::vector<std::vector<u8>> vals;
    for (const data::Extent& e : Extents(ino, &vals)) {
      if (e.unwritten || e.nr_ptrs >= data::kMaxPtrs) continue;
      u32 used = 0;
      for (u32 c = 0; c < e.nr_ptrs; c++) used |= 1u << e.ptrs[c].dev;
      u32 dev = 0;
      while (dev < mems.size() && (used & (1u << dev)) != 0) dev++;
      if (dev == mems.size()) continue;
      std::string blocks(u64(e.blocks()) * data::kBlockSize, '\0');
      const u64 at = e.start * data::kBlockSize;
      if (at < content.size()) {
        const u64 n = std::min<u64>(blocks.size(), content.size() - at);
        blocks.replace(0, n, content, at, n);
      }
      data::Prepared p;
      data::Delta delta;
      Status st = data().Prepare(On(dev), ino, e.start, reinterpret_cast<const u8*>(blocks.data()), e.blocks(), false,
                                 &p, &delta);
      if (!st.ok() || p.items.size() != 1) {
        data().Abort(delta);
        continue;
      }
      data::Extent copy;
      EXPECT_TRUE(data::ParseExtent(At(ino, p.items[0].end), p.items[0].value, p.items[0].len, &copy).ok());
      data::Extent::Ptr q = copy.ptrs[0];
      q.cached = true;
      for (data::Delta::Change& c : delta.changes) {  // what the write reserved counts as cached
        c.cached = c.blocks;
        c.blocks = 0;
      }
      delta.sets.Clear();  // (the prepared extent is not inserted; a cached copy changes no set)
      u8 buf[data::kExtentValueMax];
      auto len = data::AddPtr(e, q, copy.crcs, buf);
      EXPECT_TRUE(len.ok()) << len.status().Message();
      if (!len.ok()) {
        data().Abort(delta);
        return false;
      }
      btree::Transaction tx(&m->store->btrees());
      EXPECT_TRUE(tx.Set(At(ino, e.end), buf, len.value()).ok());
      delta.ino = ino;
      delta.sectors = 0;  // the file holds the same blocks
      st = data().Commit(On(dev), &tx, delta);
      EXPECT_TRUE(st.ok()) << st.Message();
      return st.ok();
    }
    return false;
  }

  // fsck -n of the members (unmounted): clean.
  void ExpectFsckClean() {
    m.reset();
    std::string out;
    fsck::Report r = FsckUnmounted(&out);
    EXPECT_EQ(r.exit_code, fsck::kExitClean) << out;
    EXPECT_EQ(r.errors, 0u) << out;
    Mount();
  }
  // fsck -n of the members; unmounts first (and leaves them unmounted).
  fsck::Report FsckUnmounted(std::string* out, bool repair = false) {
    m.reset();
    fsck::Options o;
    o.repair = repair;
    auto devs = Devs();
    return fsck::Check(devs.data(), u32(devs.size()), o, [](void* ctx, const char* line) {
      *static_cast<std::string*>(ctx) += std::string(line) + "\n";
    }, out);
  }
  // What a power cut leaves now (every member's volatile cache lost at
  // once; `torn`: each unflushed block kept or not by a seeded coin).
  std::vector<std::vector<u8>> Cut(bool torn, u64 seed) {
    std::vector<const MemDevice*> d;
    for (auto& mem : mems) d.push_back(mem.get());
    auto images = torn ? MemDevice::SnapshotTorn(d, seed) : MemDevice::SnapshotDurable(d);
    m->Crash();
    m.reset();
    return images;
  }
};

// The one member's durable bytes (what a power cut now would leave) of a
// filesystem whose trees may be failed, which is then closed as far as it
// goes and dropped.
std::vector<std::vector<u8>> CloseFailed(std::unique_ptr<Accounts>* t) {
  std::vector<const MemDevice*> d{(*t)->mems[0].get()};
  auto images = MemDevice::SnapshotDurable(d);
  (void)(*t)->fs().Unmount();
  (*t)->data().Close();
  (void)(*t)->m->store->Close();
  t->reset();
  return images;
}

struct ModelParams {
  u32 replicas;      // the filesystem's data_replicas
  bool compression;  // zstd on
};

void PrintTo(const ModelParams& p, std::ostream* os) {
  *os << "replicas " << p.replicas << (p.compression ? ", zstd" : ", plain");
}

class AccountModelTest : public ::testing::TestWithParam<ModelParams> {};

// Random writes (buffered and O_DIRECT, plain and compressible), overwrites,
// punches, truncates, fallocates, unlinks and cached copies of a few files
// -- some with two copies by the replicas option -- checked against a model
// of their bytes and, after every round, the three views of every bucket;
// then a clean remount or a power cut (after every file's fsync and some
// unsynced writes; durable contents or torn), after which the mount's check
// finds every record as the extents say, the views agree again and fsck is
// clean. In the end deleting everything leaves no user bucket.
TEST_P(AccountModelTest, MemoryRecordsAndRecountAgreeAcrossRemountsAndPowerCuts) {
  const ModelParams prm = GetParam();
  store::FormatOptions fo = testing::SmallFormat();
  fo.data_replicas = u8(prm.replicas);
  if (prm.compression) fo.compression = sb::CompressionType::kZstd;
  auto t = std::make_unique<Accounts>(3, fo);
  std::mt19937_64 rng(31 + prm.replicas * 7 + (prm.compression ? 1 : 0));
  constexpr int kFiles = 4;
  struct File {
    std::string name;
    u64 ino = 0;
    std::string model;
  };
  std::vector<File> files(kFiles);
  u32 generation = 0;
  auto create = [&](File& f) {
    f.name = "f" + std::to_string(generation++);
    f.ino = t->Create(f.name, rng() % 3 == 0 ? "2" : nullptr);
    f.model.clear();
  };
  for (File& f : files) create(f);
  u64 scratch = t->Create("scratch");
  u64 cached_copies = 0;
  for (int round = 0; round < 6; round++) {
    SCOPED_TRACE("round " + std::to_string(round));
    for (int op = 0; op < 40; op++) {
      File& f = files[rng() % kFiles];
      const int kind = int(rng() % 20);
      if (kind < 9) {  // write
        const u64 off = rng() % (1536 << 10);
        const std::string s = Bytes(1 + rng() % (160 << 10), u32(rng()), rng() % 2 == 0);
        const u32 flags = rng() % 3 == 0 ? u32(Filesystem::kWriteDirect) : 0u;
        auto r = t->fs().Write(f.ino, off, s.data(), u32(s.size()), flags);
        ASSERT_TRUE(r.ok()) << r.status().Message();
        if (f.model.size() < off + s.size()) f.model.resize(off + s.size(), '\0');
        f.model.replace(off, s.size(), s);
      } else if (kind < 12) {  // punch
        const u64 off = rng() % (1536 << 10);
        const u64 len = 1 + rng() % (300 << 10);
        ASSERT_TRUE(t->fs().Fallocate(f.ino, posix::kFallocPunchHole | posix::kFallocKeepSize, off, len).ok());
        if (off < f.model.size()) {
          const u64 n = std::min<u64>(off + len, f.model.size()) - off;
          f.model.replace(off, n, n, '\0');
        }
      } else if (kind < 14) {  // truncate
        posix::SetAttr a;
        a.valid = posix::kSetSize;
        a.size = rng() % (1536 << 10);
        ASSERT_TRUE(t->fs().SetAttrs(f.ino, a).ok());
        f.model.resize(a.size, '\0');
      } else if (kind < 15) {  // fallocate (reserved blocks, the size kept)
        const u64 off = rng() % (1536 << 10);
        const u64 len = 1 + rng() % (128 << 10);
        ASSERT_TRUE(t->fs().Fallocate(f.ino, posix::kFallocKeepSize, off, len).ok());
      } else if (kind < 16) {  // unlink, and a new file in its place
        ASSERT_TRUE(t->fs().Unlink(posix::kRootIno, f.name.data(), u32(f.name.size())).ok());
        create(f);
      } else if (kind < 18) {  // a cached copy of one of its extents
        ASSERT_TRUE(t->fs().Fsync(f.ino).ok());
        cached_copies += t->AddCachedCopy(f.ino, f.model);
      } else {
        ASSERT_TRUE(t->Read(f.ino, f.model.size()) == f.model) << f.name;
      }
    }
    for (File& f : files) ASSERT_TRUE(t->fs().Fsync(f.ino).ok());
    ASSERT_TRUE(t->m->store->journal().Flush().ok());
    EXPECT_GT(t->CheckViews(), 0u);
    EXPECT_GT(t->alloc().Stats().count_records, 0u);  // (since this round's mount)
    if (round % 2 == 0) {
      t->Remount();
    } else {
      // Unsynced writes, then the power goes.
      for (int k = 0; k < 4; k++) {
        const std::string s = Bytes(1 + rng() % (150 << 10), u32(rng()));
        ASSERT_TRUE(t->fs().Write(scratch, rng() % (1 << 20), s.data(), u32(s.size()), Filesystem::kWriteDirect).ok());
      }
      auto images = t->Cut(round % 4 == 3, rng());
      t = std::make_unique<Accounts>(images);
      ASSERT_TRUE(t->m->open());
    }
    t->CheckViews();
    for (File& f : files) ASSERT_TRUE(t->Read(f.ino, f.model.size() + 1) == f.model) << f.name;
    t->ExpectFsckClean();
    t->CheckViews();
  }
  EXPECT_GT(cached_copies, 0u);
  for (File& f : files) ASSERT_TRUE(t->fs().Unlink(posix::kRootIno, f.name.data(), u32(f.name.size())).ok());
  ASSERT_TRUE(t->fs().Unlink(posix::kRootIno, "scratch", 7).ok());
  t->CheckViews();
  t->Remount();
  EXPECT_EQ(t->CheckViews(), 0u);  // every user bucket freed
  t->ExpectFsckClean();
}

INSTANTIATE_TEST_SUITE_P(Configs, AccountModelTest,
                         ::testing::Values(ModelParams{1, false}, ModelParams{2, false}, ModelParams{1, true}),
                         [](const ::testing::TestParamInfo<ModelParams>& i) {
                           return "replicas" + std::to_string(i.param.replicas) +
                                  (i.param.compression ? "_zstd" : "_plain");
                         });

// Holds one thread's commit at a btree test point until released; notes
// when another thread passes "commit.waiting" (its commit found commit_mu
// held and is about to wait for it).
struct Hold {
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id held;     // the thread to hold (set by itself)
  std::string point;        // where
  bool reached = false, released = false;
  std::thread::id watched;  // the thread whose passing of commit.waiting is noted
  bool watched_passed = false;

  static void Point(void* ctx, const char* point) {
    auto* h = static_cast<Hold*>(ctx);
    std::unique_lock<std::mutex> l(h->mu);
    const std::thread::id me = std::this_thread::get_id();
    if (me == h->watched && strcmp(point, "commit.waiting") == 0) {
      h->watched_passed = true;
      h->cv.notify_all();
    }
    if (me != h->held || h->point != point || h->reached) return;
    h->reached = true;
    h->cv.notify_all();
    h->cv.wait(l, [&] { return h->released; });
  }
  void HoldMe(const char* at) {
    std::lock_guard<std::mutex> l(mu);
    held = std::this_thread::get_id();
    point = at;
  }
  void WatchMe() {
    std::lock_guard<std::mutex> l(mu);
    watched = std::this_thread::get_id();
  }
  void WaitReached() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return reached; });
  }
  // (A watchdog, not a timing assertion: the watched commit gets there in
  // far less; without it a commit that never waits would hang the test.)
  bool WaitWatchedPassed() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::minutes(2), [&] { return watched_passed; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
};

// Two files' writes into one write point's bucket, committed in the order
// opposite to the one they reserved space in (the first held after the
// throttle, before commit_mu, while the second commits whole), or with the
// second waiting for commit_mu while the first is held between its journal
// commit and its apply (the first is released only once the second's commit
// has found commit_mu held: the "commit.waiting" test point, which the btree
// passes only then -- so the second's records are staged after the first's
// publish, whatever the timing): each record is computed from the state every
// earlier journaled commit left, so the bucket's records come out with
// consecutive versions in journal order and the counts of both -- and a cut
// between them (the first journaled durable, the other not) leaves exactly
// the first's count, which the next mount finds right (fsck clean).
TEST(AccountTest, TwoFilesCommittingIntoOneBucketInEitherOrder) {
  for (const char* where : {"commit.throttled", "commit.journaled"}) {
    SCOPED_TRACE(where);
    Hold hold;
    store::OpenOptions so;
    so.btree.test_point = Hold::Point;
    so.btree.test_point_ctx = &hold;
    auto t = std::make_unique<Accounts>(1, testing::SmallFormat(), so);
    const u64 f = t->Create("f"), g = t->Create("g");
    // f opens the write point's bucket.
    ASSERT_TRUE(t->DirectWrite(f, 0, 4, 1, true).ok());
    alloc::BucketRef b;
    ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
    const alloc::Bucket before = t->alloc().Get(b.dev, b.bucket);
    ASSERT_EQ(before.live_sectors, 4u * 8);
    // g reserves its blocks in the bucket first and is held.
    Status gst;
    std::thread held([&] {
      hold.HoldMe(where);
      gst = t->DirectWrite(g, 0, 2, 2);
    });
    hold.WaitReached();
    std::vector<std::vector<u8>> cut;
    if (strcmp(where, "commit.throttled") == 0) {
      // f commits whole meanwhile: journaled first, version + 1, its count.
      ASSERT_TRUE(t->DirectWrite(f, 4, 3, 3, true).ok());
      const alloc::Bucket mid = t->alloc().Get(b.dev, b.bucket);
      EXPECT_EQ(mid.version, before.version + 1);
      EXPECT_EQ(mid.live_sectors, (4u + 3) * 8);
      std::vector<const MemDevice*> d{t->mems[0].get()};
      cut = MemDevice::SnapshotDurable(d);  // f's entry durable, g's not journaled
      hold.Release();
      held.join();
    } else {
      // f waits for commit_mu while g holds it, journaled and not applied.
      const u64 waits = t->m->store->btrees().GetStats().commit_waits;
      Status fst;
      std::thread waiting([&] {
        hold.WatchMe();
        fst = t->DirectWrite(f, 4, 3, 3, true);
      });
      // (f's extent commit: f's blocks fit the bucket, f allocates nothing.)
      EXPECT_TRUE(hold.WaitWatchedPassed()) << "f's commit never found commit_mu held";
      EXPECT_GT(t->m->store->btrees().GetStats().commit_waits, waits);
      hold.Release();
      held.join();
      waiting.join();
      ASSERT_TRUE(fst.ok()) << fst.Message();
    }
    ASSERT_TRUE(gst.ok()) << gst.Message();
    const alloc::Bucket after = t->alloc().Get(b.dev, b.bucket);
    EXPECT_EQ(after.version, before.version + 2);  // one record each, consecutive
    EXPECT_EQ(after.live_sectors, (4u + 3 + 2) * 8);  // both counted
    t->CheckViews();
    t->ExpectFsckClean();
    t->CheckViews();
    if (cut.empty()) continue;
    // The cut between them: f's count only, as its record said.
    t.reset();
    auto c = std::make_unique<Accounts>(cut);
    const alloc::Bucket k = c->alloc().Get(b.dev, b.bucket);
    EXPECT_EQ(k.live_sectors, (4u + 3) * 8);
    EXPECT_EQ(k.version, before.version + 1);
    c->CheckViews();
    c->ExpectFsckClean();
  }
}

// A commit the journal refuses publishes nothing: the journal's writes fail
// (its flush then fails, and the journal with it); a commit after that runs
// its hook's prepare and is refused by the journal -- the bucket's counts
// and version stay what the last journaled commit made them. After the cut
// the next mount finds the records the extents' (the journal kept neither
// the refused commit nor the one whose flush failed).
TEST(AccountTest, ACommitTheJournalRefusesPublishesNothing) {
  auto t = std::make_unique<Accounts>(1, testing::SmallFormat());
  const u64 f = t->Create("f");
  ASSERT_TRUE(t->DirectWrite(f, 0, 4, 1, true).ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  const alloc::Bucket before = t->alloc().Get(b.dev, b.bucket);
  t->fails[0]->Fail(true);
  // Taken by the journal (published: memory says what the journal holds),
  // but its flush fails.
  EXPECT_TRUE(t->DirectWrite(f, 4, 2, 2).ok());
  EXPECT_FALSE(t->fs().Fsync(f).ok());
  EXPECT_GT(t->fails[0]->failed(), 0u);
  const alloc::Bucket mid = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(mid.version, before.version + 1);
  EXPECT_EQ(mid.live_sectors, (4u + 2) * 8);
  const u64 records = t->alloc().Stats().count_records;
  // Refused by the failed journal after its prepare: nothing published.
  Status st = t->DirectWrite(f, 6, 3, 3);
  EXPECT_EQ(st.code(), Err::kIo) << st.Message();
  const alloc::Bucket now = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(now.version, mid.version);
  EXPECT_EQ(now.live_sectors, mid.live_sectors);
  EXPECT_EQ(t->alloc().Stats().count_records, records);
  // The power goes; the trees were failed (nothing commits any more).
  auto images = CloseFailed(&t);
  auto c = std::make_unique<Accounts>(images);
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).live_sectors, 4u * 8);
  c->CheckViews();
  c->ExpectFsckClean();
}


// A punch over a count made too low whose commit the journal then refuses
// counts no underflow (the count never went anywhere: nothing was
// published), as a retry of it would count none again; the next mount
// refuses the lowered record (its set's total says more) until fsck -y
// sets it from the extents.
TEST(AccountTest, AnUnderflowIsCountedOnlyWhenItsCommitIsJournaled) {
  auto t = std::make_unique<Accounts>(1, testing::SmallFormat());
  const u64 f = t->Create("f");
  ASSERT_TRUE(t->DirectWrite(f, 0, 8, 1, true).ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  alloc::CountFix low{b.dev, b.bucket, 2 * 8, 0};
  ASSERT_TRUE(t->alloc().RepairCounts(&low, 1).ok());
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  // The journal fails (a write taken, its flush failed), then refuses.
  t->fails[0]->Fail(true);
  EXPECT_TRUE(t->DirectWrite(f, 8, 1, 2).ok());
  EXPECT_FALSE(t->fs().Fsync(f).ok());
  const alloc::Bucket mid = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(mid.live_sectors, (2u + 1) * 8);
  for (int i = 0; i < 2; i++) {  // (and its retry)
    EXPECT_FALSE(
        t->fs().Fallocate(f, posix::kFallocPunchHole | posix::kFallocKeepSize, 0, 4 * data::kBlockSize).ok());
  }
  EXPECT_EQ(t->alloc().Stats().count_underflows, 0u);
  EXPECT_EQ(t->alloc().Get(b.dev, b.bucket).version, mid.version);
  auto images = CloseFailed(&t);
  auto c = std::make_unique<Accounts>(images, store::OpenOptions{}, 0, false);
  c->ExpectRefusedUntilFsck();  // (the lowered record: its set's total says more)
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).live_sectors, 8u * 8);
  c->CheckViews();
  c->ExpectFsckClean();
}

// The mount walks no extent (step 3b-5b): with a file of many extents on
// the image, the data path's open reads no node at all (the store's open
// read the alloc tree; the extents' leaves are never asked for), and the
// file reads back after it.
TEST(AccountTest, TheDataPathsOpenReadsNoNode) {
  auto t = std::make_unique<Accounts>(1, testing::SmallFormat(4096));  // (4 KiB nodes: the extents span leaves)
  const u64 f = t->Create("f");
  for (u32 i = 0; i < 300; i++) ASSERT_TRUE(t->DirectWrite(f, 2 * i, 1, i).ok());  // 300 extents
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  t->m.reset();
  store::Store s;
  auto devs = t->Devs();
  ASSERT_TRUE(testing::OpenStore(&s, devs, t->so).ok());
  const u64 before = s.btrees().GetStats().node_reads;
  {
    data::DataPath d;
    ASSERT_TRUE(d.Open(&s).ok());
    EXPECT_EQ(s.btrees().GetStats().node_reads, before) << "the data path's open read nodes";
    u64 counts = 0, totals = 0;
    ASSERT_TRUE(d.VerifyAgainstExtents(&counts, &totals).ok());  // (this walk reads them)
    EXPECT_GT(s.btrees().GetStats().node_reads, before);
    EXPECT_EQ(counts, 0u);
    EXPECT_EQ(totals, 0u);
    d.Close();
  }
  ASSERT_TRUE(s.Close().ok());
  t->Mount();
  for (u32 i = 0; i < 300; i += 37) {
    std::string got(data::kBlockSize, '\0');
    auto r = t->fs().Read(f, u64(2 * i) * data::kBlockSize, got.data(), u32(got.size()));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(got == Bytes(data::kBlockSize, i)) << i;
  }
}

// Accounting totals made wrong behind the data path's back -- the set the
// data is on raised, a set no extent has (both members: every file here
// has one copy), the reserved total where nothing is unwritten -- by a
// transaction of keys, then an unmount: the mount refuses in one line (the
// replicas totals no longer sum to the buckets' live counts), fsck -n
// reports each total, fsck -y sets them (the set with no extent deleted),
// and the next mount goes on. The reserved total alone made wrong is what
// the mount cannot see (nothing restates it): it mounts, and fsck finds
// and sets it.
TEST(AccountTest, AccountingTotalsThatDifferFromTheExtentsRefuseTheMountUntilFsck) {
  auto t = std::make_unique<Accounts>(2, testing::SmallFormat());
  const u64 f = t->Create("f");
  const std::string fb = Bytes(50 * data::kBlockSize, 3);
  ASSERT_TRUE(t->fs().Write(f, 0, fb.data(), u32(fb.size()), Filesystem::kWriteDirect).ok());
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  t->CheckViews();
  std::vector<alloc::ReplicasEntry> sets(t->m->store->acct().Replicas(nullptr, 0));
  t->m->store->acct().Replicas(sets.data(), u32(sets.size()));
  ASSERT_FALSE(sets.empty());
  ASSERT_EQ(t->m->store->acct().Get(alloc::AcctKind::kReplicas, 0x3), 0u) << "a file of one copy on both members";
  const alloc::ReplicasEntry data_set = sets[0];
  auto put = [&](btree::Transaction& tx, alloc::AcctKind kind, u64 offset, u64 sectors) {
    alloc::AcctRecord r;
    alloc::EncodeAcct(kind, sectors, &r);
    ASSERT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, alloc::AcctInode(kind), offset}, &r, sizeof(r)).ok());
  };
  {
    btree::Transaction tx(&t->m->store->btrees());
    put(tx, alloc::AcctKind::kReplicas, data_set.members, data_set.sectors + 80);
    put(tx, alloc::AcctKind::kReplicas, 0x3, 160);
    put(tx, alloc::AcctKind::kReserved, 0, 40);
    ASSERT_TRUE(tx.Commit().ok());
  }
  std::string out;
  fsck::Report r = t->FsckUnmounted(&out);
  EXPECT_EQ(r.exit_code, fsck::kExitUncorrected) << out;
  EXPECT_EQ(r.errors, 3u) << out;
  EXPECT_NE(out.find("alloc: the total of data on members 0x3 is 160 sectors, its extents hold 0"), std::string::npos)
      << out;
  EXPECT_NE(out.find("alloc: the reserved total is 40 sectors, the unwritten extents hold 0"), std::string::npos)
      << out;
  t->ExpectRefusedUntilFsck();
  EXPECT_EQ(t->m->store->acct().Get(alloc::AcctKind::kReplicas, data_set.members), data_set.sectors);
  EXPECT_EQ(t->m->store->acct().Get(alloc::AcctKind::kReplicas, 0x3), 0u);
  EXPECT_EQ(t->m->store->acct().reserved_sectors(), 0u);
  t->CheckViews();
  EXPECT_TRUE(t->Read(f, fb.size() + 1) == fb);
  // The reserved total alone: the mount goes on (and reserves 5 blocks
  // that nothing holds -- space, never data); fsck sets it.
  {
    btree::Transaction tx(&t->m->store->btrees());
    put(tx, alloc::AcctKind::kReserved, 0, 40);
    ASSERT_TRUE(tx.Commit().ok());
  }
  t->want_acct = 1;
  t->Remount();
  EXPECT_EQ(t->data().GetStats().blocks_reserved, 5u);
  out.clear();
  r = t->FsckUnmounted(&out, true);
  EXPECT_EQ(r.exit_code, fsck::kExitRepaired) << out;
  EXPECT_NE(out.find("alloc: the reserved total is 40 sectors, the unwritten extents hold 0"), std::string::npos)
      << out;
  t->want_acct = 0;
  t->Mount();
  EXPECT_EQ(t->data().GetStats().blocks_reserved, 0u);
  t->CheckViews();
  t->ExpectFsckClean();
}

// Every user bucket's record made wrong behind the allocator's back -- one
// in three zeroed, the others lowered or raised, live and cached -- by a
// transaction of records one version newer than memory's, then an unmount:
// the mount refuses in one line (the live counts no longer sum to the
// replicas totals), fsck -y sets every record from the extents, the mount
// after that goes on, frees none of them, and the three views agree. A
// cached count alone made wrong is what the mount cannot see (cached
// counts are in no total): it mounts, and fsck finds and sets it.
TEST(AccountTest, RecordsThatCountOtherwiseThanTheExtentsRefuseTheMountUntilFsck) {
  auto t = std::make_unique<Accounts>(2, testing::SmallFormat());
  const u64 f = t->Create("f"), g = t->Create("g", "2");
  const std::string fb = Bytes(150 * data::kBlockSize, 7), gb = Bytes(40 * data::kBlockSize, 8);
  ASSERT_TRUE(t->fs().Write(f, 0, fb.data(), u32(fb.size()), Filesystem::kWriteDirect).ok());
  ASSERT_TRUE(t->fs().Write(g, 0, gb.data(), u32(gb.size()), Filesystem::kWriteDirect).ok());
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  ASSERT_TRUE(t->fs().Fsync(g).ok());
  ASSERT_TRUE(t->AddCachedCopy(f, fb));
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  t->CheckViews();
  // The wrong records.
  auto edit = [&](const std::function<bool(alloc::Bucket&, u64)>& change) {
    btree::Transaction tx(&t->m->store->btrees());
    u64 n = 0;
    for (u32 d = 0; d < 2; d++) {
      for (u64 b = 0; b < t->alloc().nbuckets(d); b++) {
        alloc::Bucket k = t->alloc().Get(d, b);
        if (k.state != alloc::BucketState::kUser || !change(k, n)) continue;
        k.version++;
        alloc::AllocRecord r;
        alloc::EncodeRecord(k, &r);
        EXPECT_TRUE(tx.Set(btree::Pos{btree::kBtreeAlloc, d, b}, &r, sizeof(r)).ok());
        n++;
      }
    }
    EXPECT_TRUE(tx.Commit().ok());
    return n;
  };
  u64 cached = 0;
  const u64 wrong = edit([&](alloc::Bucket& k, u64 n) {
    cached += k.cached_sectors != 0;
    switch (n % 3) {
      case 0: k.live_sectors = 0, k.cached_sectors = 0; break;
      case 1: k.live_sectors /= 2, k.cached_sectors = k.cached_sectors == 0 ? 8 : k.cached_sectors / 2; break;
      default: k.live_sectors += 8 * 5; break;
    }
    return true;
  });
  ASSERT_GE(wrong, 5u);
  ASSERT_GT(cached, 0u);
  t->ExpectRefusedUntilFsck();
  EXPECT_EQ(t->alloc().Stats().empty_freed_at_mount, 0u);  // (the mount after fsck: every user bucket holds data)
  t->CheckViews();
  EXPECT_TRUE(t->Read(f, fb.size() + 1) == fb);
  EXPECT_TRUE(t->Read(g, gb.size() + 1) == gb);
  // A cached count alone.
  const u64 one = edit([&](alloc::Bucket& k, u64 n) {
    if (n > 0 || k.cached_sectors == 0) return false;
    k.cached_sectors += 8;
    return true;
  });
  ASSERT_EQ(one, 1u);
  t->want_mismatches = 1;
  t->Remount();
  std::string out;
  const fsck::Report r = t->FsckUnmounted(&out, true);
  EXPECT_EQ(r.exit_code, fsck::kExitRepaired) << out;
  EXPECT_NE(out.find(" cached sectors, its extents "), std::string::npos) << out;
  t->want_mismatches = 0;
  t->Mount();
  t->CheckViews();
  t->ExpectFsckClean();
}

// A record lowered below what its extents count (damage, or a bug), then a
// punch of more than it says, before any remount: the count stops at 0
// (alloc.count_underflows 1, counted once the commit is journaled; one log
// line, written after the commit), nothing crashes, the bucket -- held by
// the write point -- is not freed, and the rest of the file reads back; a
// second punch leaves the record as it is (not counted as an older record
// the merge rule kept); after a power cut the next mount refuses (the
// record counts 0 where its set's total counts what is left) until fsck -y
// sets the count to what the extents left.
TEST(AccountTest, APunchOverACountMadeTooLowStopsAtZeroAndTheNextMountRefusesUntilFsck) {
  auto t = std::make_unique<Accounts>(1, testing::SmallFormat());
  const u64 f = t->Create("f");
  ASSERT_TRUE(t->DirectWrite(f, 0, 8, 1, true).ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  ASSERT_EQ(t->alloc().Get(b.dev, b.bucket).live_sectors, 8u * 8);
  // Lowered to 2 blocks, in memory and in its record (version + 1).
  alloc::CountFix low{b.dev, b.bucket, 2 * 8, 0};
  ASSERT_TRUE(t->alloc().RepairCounts(&low, 1).ok());
  char logname[] = "/tmp/tierfs-account-log-XXXXXX";
  const int logfd = mkstemp(logname);
  ASSERT_GE(logfd, 0);
  unlink(logname);
  userspace::SetLogCopy(logfd);
  // A punch of 4 blocks: 2 - 4 stops at 0.
  ASSERT_TRUE(t->fs().Fallocate(f, posix::kFallocPunchHole | posix::kFallocKeepSize, 0, 4 * data::kBlockSize).ok());
  userspace::SetLogCopy(-1);
  std::string log(4096, '\0');
  log.resize(size_t(std::max<ssize_t>(0, pread(logfd, log.data(), log.size(), 0))));
  close(logfd);
  EXPECT_NE(log.find("live count would go below 0"), std::string::npos) << log;
  const alloc::Bucket k = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(k.state, alloc::BucketState::kUser);
  EXPECT_EQ(k.gen, b.gen);
  EXPECT_EQ(k.live_sectors, 0u);
  EXPECT_EQ(t->alloc().Stats().count_underflows, 1u);
  // A punch of 2 more: the count stays 0 -- the record goes as it is (its
  // own version: the merge rule keeps the leaf's, and it is no older
  // record, btree.alloc_older_kept unchanged).
  const u64 kept = t->m->store->btrees().GetStats().alloc_older_kept;
  const u64 version = k.version;
  ASSERT_TRUE(t->fs().Fallocate(f, posix::kFallocPunchHole | posix::kFallocKeepSize, 4 * data::kBlockSize,
                                2 * data::kBlockSize).ok());
  EXPECT_EQ(t->alloc().Stats().count_underflows, 2u);
  EXPECT_EQ(t->alloc().Get(b.dev, b.bucket).version, version);
  EXPECT_EQ(t->m->store->btrees().GetStats().alloc_older_kept, kept);
  std::string want = std::string(6 * data::kBlockSize, '\0') + Bytes(8 * data::kBlockSize, 1).substr(6 * data::kBlockSize);
  EXPECT_TRUE(t->Read(f, want.size() + 1) == want);
  ASSERT_TRUE(t->fs().Fsync(f).ok());
  // (A clean unmount would free the bucket: the write point's hold is the
  // last thing holding it once its count says 0. A cut keeps it for the
  // mount's check.)
  auto images = t->Cut(false, 0);
  auto c = std::make_unique<Accounts>(images, store::OpenOptions{}, 0, false);
  c->ExpectRefusedUntilFsck();  // (the record counts 0, its set's total 2 blocks)
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).live_sectors, 2u * 8);
  c->CheckViews();
  EXPECT_TRUE(c->Read(f, want.size() + 1) == want);
  c->ExpectFsckClean();
}

// A filesystem whose next armed commit's apply fails after the journal took
// its entry: at `commit.journaled` the alloc leaves are evicted (the
// shrinker; every leaf clean first) and their reads fail, so the apply,
// which reads the leaf of a record it applies, fails. 64 KiB buckets and a
// 24 MiB file: an alloc tree of several 4 KiB leaves (~400 records).
struct ApplyFailsAfterJournal {
  struct Evict {
    std::atomic<bool> armed{false};
    JournalFailDevice* dev = nullptr;
    static void Point(void* ctx, const char* point) {
      auto* e = static_cast<Evict*>(ctx);
      if (strcmp(point, "commit.journaled") != 0 || !e->armed.exchange(false)) return;
      // (The clock gives a node read since the last pass a second chance.)
      for (int i = 0; i < 3; i++) userspace::ShrinkAll(userspace::CountAll() + 1);
      e->dev->FailAllocLeafReads(true);
    }
  } evict;
  std::unique_ptr<Accounts> t;

  ApplyFailsAfterJournal() {
    store::OpenOptions so;
    so.btree.test_point = Evict::Point;
    so.btree.test_point_ctx = &evict;
    so.btree.writer_thread = false;  // (no checkpoint takes a tree's lock while the shrinker runs)
    store::FormatOptions fo = testing::SmallFormat(4096);
    fo.bucket_size = 64 * 1024;
    t = std::make_unique<Accounts>(1, fo, so);
    evict.dev = t->fails[0].get();
    const u64 big = t->Create("big");
    const std::string bb = Bytes(24 << 20, 3);
    for (u64 off = 0; off < bb.size() && setup.ok(); off += 1 << 20)
      setup = t->fs().Write(big, off, bb.data() + off, 1 << 20, Filesystem::kWriteDirect).status();
  }
  Status setup;  // the 24 MiB's writes (the test asserts it)
  // Every leaf clean (evictable: the checkpoints' own records dirty alloc
  // leaves again, a few rounds), and the next commit's apply armed to fail.
  void Arm() {
    for (int i = 0; i < 4 && t->m->store->btrees().GetStats().dirty_nodes != 0; i++)
      ASSERT_TRUE(t->m->store->btrees().Checkpoint().ok());
    ASSERT_EQ(t->m->store->btrees().GetStats().dirty_nodes, 0u) << "a dirty leaf would not be evicted";
    evict.armed = true;
  }
  // Checks the apply failed, stops failing reads, and shows that the trees
  // are failed (nothing commits any more). `f`: a file to try a write on.
  void ExpectFailed(const Status& st, u64 f) {
    EXPECT_EQ(st.code(), Err::kIo) << st.Message();
    EXPECT_FALSE(evict.armed.load());
    EXPECT_GT(t->fails[0]->failed_reads(), 0u);
    t->fails[0]->FailAllocLeafReads(false);
    EXPECT_FALSE(t->DirectWrite(f, 60, 1, 4).ok());
  }
  // The durable images, the filesystem closed, and a new one mounted on
  // them (the entry replayed).
  std::unique_ptr<Accounts> Remount() {
    EXPECT_TRUE(t->m->store->journal().Flush().ok());
    return std::make_unique<Accounts>(CloseFailed(&t));
  }
};

// An apply that fails after the journal took the entry (an alloc leaf's
// read fails under commit_mu: the leaf was evicted between the prefetch and
// the apply) has published the counts -- memory says what the journal
// holds -- and fails the trees: nothing commits any more. The next mount
// replays the entry and finds every record right.
TEST(AccountTest, AnApplyThatFailsAfterTheJournalTookTheEntryHasPublishedTheCounts) {
  ApplyFailsAfterJournal a;
  ASSERT_TRUE(a.setup.ok()) << a.setup.Message();
  Accounts* t = a.t.get();
  const u64 f = t->Create("f");
  ASSERT_TRUE(t->DirectWrite(f, 0, 4, 1, true).ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  const alloc::Bucket before = t->alloc().Get(b.dev, b.bucket);
  const u64 records = t->alloc().Stats().count_records;
  ASSERT_NO_FATAL_FAILURE(a.Arm());
  a.ExpectFailed(t->DirectWrite(f, 4, 2, 2), f);
  // Published: the journal holds the record.
  const alloc::Bucket mid = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(mid.version, before.version + 1);
  EXPECT_EQ(mid.live_sectors, (4u + 2) * 8);
  EXPECT_EQ(t->alloc().Stats().count_records, records + 1);
  auto c = a.Remount();  // (nothing the extents contradict)
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).live_sectors, (4u + 2) * 8);
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).version, mid.version);
  c->CheckViews();
  const std::string want = Bytes(4 * data::kBlockSize, 1) + Bytes(2 * data::kBlockSize, 2);
  EXPECT_TRUE(c->Read(f, want.size() + 1) == want);
  c->ExpectFsckClean();
}

// Review 3b N2 (the F7 path): a punch that empties a bucket, whose apply
// fails after the journal took the entry, has published the bucket's count
// (0) but frees nothing -- the trees are failed and the free's record could
// not commit; the next mount, replaying the punch, frees the empty bucket.
// (Aborting would leave memory counting the punched blocks; applying with
// the frees would free a bucket while the trees are failed.)
TEST(AccountTest, APunchWhoseApplyFailsAfterTheJournalTookTheEntryFreesNothing) {
  ApplyFailsAfterJournal a;
  ASSERT_TRUE(a.setup.ok()) << a.setup.Message();
  Accounts* t = a.t.get();
  // f fills one bucket of its own (16 blocks of 64 KiB), and g moves the
  // write point on: no write point holds f's bucket.
  const u64 f = t->Create("f"), g = t->Create("g");
  ASSERT_TRUE(t->DirectWrite(f, 0, 16, 1, true).ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  ASSERT_TRUE(t->DirectWrite(g, 0, 1, 2, true).ok());
  alloc::BucketRef next;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &next));
  ASSERT_FALSE(next.dev == b.dev && next.bucket == b.bucket) << "the write point moved on";
  ASSERT_EQ(t->alloc().Get(b.dev, b.bucket).live_sectors, 16u * 8);
  ASSERT_NO_FATAL_FAILURE(a.Arm());
  a.ExpectFailed(t->fs().Fallocate(f, posix::kFallocPunchHole | posix::kFallocKeepSize, 0, 16 * data::kBlockSize),
                 g);
  const alloc::Bucket mid = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(mid.live_sectors, 0u) << "the count is published";
  EXPECT_EQ(mid.state, alloc::BucketState::kUser) << "nothing freed while the trees are failed";
  auto c = a.Remount();
  EXPECT_EQ(c->alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kFree) << "freed by the next mount";
  c->CheckViews();
  EXPECT_TRUE(c->Read(f, 16 * data::kBlockSize) == std::string(16 * data::kBlockSize, '\0'));
  c->ExpectFsckClean();
}

// Step 3b-3: the write point allocates without a record commit. Forty
// fresh 64 KiB buckets of writes make no record commit at all -- each
// bucket is recorded by the first extent transaction counting in it (its
// record in the extent's entry) -- and every view agrees, also after a
// remount.
TEST(AccountTest, TheWritePointOpensBucketsWithoutARecordCommit) {
  testing::SinkTap tap;  // (outlives the store; counts user buckets' record commits, not the checkpoints')
  store::FormatOptions fo = testing::SmallFormat(4096);
  fo.bucket_size = 64 * 1024;
  Accounts t(1, fo);
  tap.Attach(&t.alloc());
  const u64 f = t.Create("f");
  const alloc::AllocStats before = t.alloc().Stats();
  for (u32 i = 0; i < 40; i++) ASSERT_TRUE(t.DirectWrite(f, u64(i) * 16, 16, i + 1).ok());
  const alloc::AllocStats after = t.alloc().Stats();
  EXPECT_GE(after.unrecorded_allocs, before.unrecorded_allocs + 40);
  EXPECT_EQ(tap.user_commits.load(), 0u) << "an allocation committed a record";
  EXPECT_GE(after.count_records, before.count_records + 40);
  t.CheckViews();
  t.Remount();
  t.CheckViews();
  EXPECT_TRUE(t.Read(f, 40 * 16 * data::kBlockSize) == [] {
    std::string want;
    for (u32 i = 0; i < 40; i++) want += Bytes(16 * data::kBlockSize, i + 1);
    return want;
  }());
}

// A bucket opened and written but never committed in: a cut leaves it free
// in the tree (no record says user), and a write whose commit failed, then
// the write point's close, frees it with no commit at all -- reusable at
// once (unrecorded_frees).
TEST(AccountTest, ABucketNoTransactionRecordedIsFreeInTheTreeAndFreedWithoutACommit) {
  store::FormatOptions fo = testing::SmallFormat(4096);
  fo.bucket_size = 64 * 1024;
  auto t = std::make_unique<Accounts>(1, fo);
  const u64 f = t->Create("f");
  ASSERT_TRUE(t->DirectWrite(f, 0, 16, 1, true).ok());  // fills a bucket: the next write opens one
  const std::string blocks = Bytes(4 * data::kBlockSize, 2);
  data::Prepared p;
  data::Delta delta;
  ASSERT_TRUE(t->data().Prepare(data::kForegroundWrite, f, 16, reinterpret_cast<const u8*>(blocks.data()), 4, false,
                                &p, &delta)
                  .ok());
  alloc::BucketRef b;
  ASSERT_TRUE(t->data().WritePointBucket(data::kForegroundWrite, &b));
  EXPECT_TRUE(t->alloc().Get(b.dev, b.bucket).unrecorded);
  t->CheckViews();
  // The cut: the data is on the disk, no extent and no record.
  ASSERT_TRUE(t->m->store->journal().Flush().ok());
  std::vector<const MemDevice*> d{t->mems[0].get()};
  {
    Accounts c(MemDevice::SnapshotDurable(d));
    // Free in the tree (the mount may have taken it for btree nodes since):
    // no record said user.
    EXPECT_NE(c.alloc().Get(b.dev, b.bucket).state, alloc::BucketState::kUser);
    // (A user record would have had the mount free it, bumping the gen.)
    EXPECT_EQ(c.alloc().Get(b.dev, b.bucket).gen, b.gen);
    c.CheckViews();
    c.ExpectFsckClean();
  }
  // The write gives up; the write point's close frees the bucket it opened
  // with no commit, free at once.
  t->data().Abort(delta);
  (void)t->fs().Unmount();
  // (Read after the unmount's own commits and checkpoint: an idle store's
  // btree writer allocates or frees no btree bucket before the close.)
  const u64 frees = t->alloc().Stats().unrecorded_frees;
  const u64 free_before = t->alloc().Usage(b.dev).by_state[u8(alloc::BucketState::kFree)];
  const u64 pending_before = t->alloc().Usage(b.dev).pending_free;
  t->data().Close();  // (retires the write point's buckets)
  EXPECT_EQ(t->alloc().Stats().unrecorded_frees, frees + 1);
  const alloc::Bucket now = t->alloc().Get(b.dev, b.bucket);
  EXPECT_EQ(now.state, alloc::BucketState::kFree);
  EXPECT_FALSE(now.unrecorded);
  EXPECT_EQ(now.gen, b.gen) << "no pointer named it: the generation stays";
  EXPECT_EQ(t->alloc().Usage(b.dev).by_state[u8(alloc::BucketState::kFree)], free_before + 1);
  EXPECT_EQ(t->alloc().Usage(b.dev).pending_free, pending_before) << "on the free list at once, not pending";
  (void)t->m->store->Close();
}

}  // namespace
}  // namespace tfs
