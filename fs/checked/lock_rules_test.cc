// Two lock rules, checked (docs/design/core.md, "Lock rules stated and
// asserted" and "Allocation scope"); built with TFS_LOCK_CHECKS on
// (fs/checked/CMakeLists.txt).
// - The flush set: a commit's flush set is its own durability debt, and a
//   slow member -- one without a journal ring, an HDD -- never joins one: the
//   journal traps a commit whose deps name a member without a ring. The data
//   path's commits on an HDD-backed file run under the check (the committer
//   flushes the HDD itself and leaves it out), and a commit naming the HDD is
//   caught.
// - The allocation scope: an allocation under a Mutex or RwLock is made in a
//   NoFsScope (the lock guards open one); one outside is caught, and so is a
//   lock released by a thread that does not hold it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "journal/format.h"
#include "mount/instance.h"
#include "mount/testing.h"
#include "platform/sync.h"
#include "userspace/platform/mem_device.h"

static_assert(TFS_LOCK_CHECKS, "fs/checked builds everything with the lock checks on");

namespace tfs {
namespace {

using userspace::MemDevice;
using userspace::MemDeviceOptions;

std::unique_ptr<MemDevice> Mem(const char* name, u64 size) {
  MemDeviceOptions o;
  o.name = name;
  o.size = size;
  o.threaded = true;
  o.volatile_cache = true;
  return std::make_unique<MemDevice>(o);
}

// Member 0 the SSD (metadata, the journal), member 1 the HDD (no ring).
struct TwoMembers {
  std::unique_ptr<MemDevice> ssd = Mem("ssd0", 128ull << 20);
  std::unique_ptr<MemDevice> hdd = Mem("hdd0", 256ull << 20);
  BlockDevice* b[2] = {ssd.get(), hdd.get()};

  explicit TwoMembers(const char* foreground_target) {
    store::FormatMember m[2] = {{ssd.get(), "ssd.a", 1}, {hdd.get(), "hdd.b", 1}};
    store::FormatOptions fo = testing::SmallFormat();
    fo.foreground_target = foreground_target;
    fo.metadata_target = "ssd";
    fo.background_target = "hdd";
    Diag diag;
    TFS_BUG_ON(!store::Format(m, 2, fo, &diag).ok());
  }
};

// fsyncs of a file whose data goes to the HDD: every commit's data is on a
// member without a ring, so the data path flushes it before the commit and
// the journal's pre-flushes never include it -- with the check on, a commit
// that named it would have trapped.
TEST(LockRulesTest, DataOnASlowMemberNeverJoinsAFlushSet) {
  TwoMembers d("hdd");
  auto inst = std::make_unique<mount::Instance>();
  Diag diag;
  ASSERT_TRUE(inst->Open(d.b, 2, mount::Options{}, &diag).ok()) << diag.text;
  posix::Filesystem& fs = inst->fs();
  auto f = fs.Mknod(posix::kRootIno, "h", 1, posix::kModeReg | 0644, 0, posix::Caller{});
  ASSERT_TRUE(f.ok());
  const std::string data(256 << 10, 'h');
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE(fs.Write(f.value().ino, u64(i) * data.size(), data.data(), u32(data.size()),
                         posix::Filesystem::kWriteDirect).ok());
    ASSERT_TRUE(fs.Fsync(f.value().ino).ok());
  }
  EXPECT_GE(inst->data().GetStats().slow_member_flushes, 4u);
  const journal::Stats js = inst->store().journal().GetStats();
  EXPECT_GE(js.flush_entries, 4u);
  EXPECT_EQ(js.preflushes[1], 0u);  // the HDD: flushed by its committer, never by an entry
  ASSERT_TRUE(inst->Close().ok());
}

class LockRulesDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// What a committer that forgot to flush the HDD would do: name it in deps.
void CommitNamingTheHdd() {
  TwoMembers d("ssd");
  mount::Instance inst;
  Diag diag;
  TFS_BUG_ON(!inst.Open(d.b, 2, mount::Options{}, &diag).ok());
  const u64 v = 1;
  const journal::Key k{journal::kKeyTest, sizeof(v), &v};
  (void)inst.store().journal().Commit(&k, 1, dev::DevMask(1) << 1, journal::CommitMode::kFlush);
}

// It is caught before it enters an entry.
TEST_F(LockRulesDeathTest, ACommitNamingAMemberWithoutARingIsCaught) {
  EXPECT_DEATH(CommitNamingTheHdd(), "lock rule: a commit depends on member\\(s\\) 0x2 without a journal ring");
}

// Naming the SSD (a ring member) is what every data commit does: no trap.
TEST(LockRulesTest, ACommitNamingARingMemberPasses) {
  TwoMembers d("ssd");
  mount::Instance inst;
  Diag diag;
  ASSERT_TRUE(inst.Open(d.b, 2, mount::Options{}, &diag).ok()) << diag.text;
  const u64 v = 1;
  const journal::Key k{journal::kKeyTest, sizeof(v), &v};
  ASSERT_TRUE(inst.store().journal().Commit(&k, 1, dev::DevMask(1) << 0, journal::CommitMode::kFlush).ok());
  ASSERT_TRUE(inst.Close().ok());
}

// The scope nests and restores what it found; the guards hold one while
// they hold their lock, and the core's threads run in one. (The checks turn
// the scopes on even where the build compiles them out, platform.h.)
static_assert(TFS_NOFS_SCOPES == 1, "the lock checks need the allocation scopes");
TEST(AllocScopeTest, ScopesNestAndGuardsAndThreadsOpenThem) {
  EXPECT_FALSE(platform::InNoFs());
  {
    platform::NoFsScope outer;
    EXPECT_TRUE(platform::InNoFs());
    {
      platform::NoFsScope inner;
      EXPECT_TRUE(platform::InNoFs());
    }
    EXPECT_TRUE(platform::InNoFs());  // the inner one put back what it found
  }
  EXPECT_FALSE(platform::InNoFs());
  Mutex m;
  RwLock rw;
  {
    MutexLock l(m);
    EXPECT_TRUE(platform::InNoFs());
    EXPECT_EQ(platform::LocksHeld(), 1u);
    platform::Free(platform::Alloc(64));  // allowed: inside the guard's scope
  }
  {
    ReadGuard r(rw);
    EXPECT_TRUE(platform::InNoFs());
  }
  {
    WriteGuard w(rw);
    EXPECT_TRUE(platform::InNoFs());
  }
  EXPECT_FALSE(platform::InNoFs());
  EXPECT_EQ(platform::LocksHeld(), 0u);
  // A raw lock with its own scope.
  {
    platform::NoFsScope nofs;
    m.Lock();
    platform::Free(platform::Alloc(64));
    m.Unlock();
  }
  // Outside any lock, no scope is needed.
  platform::Free(platform::Alloc(64));
  bool in_thread = false;
  platform::Thread t;
  ASSERT_TRUE(t.Start([](void* p) { *static_cast<bool*>(p) = platform::InNoFs(); }, &in_thread, "nofs-test").ok());
  t.Join();
  EXPECT_TRUE(in_thread);
}

Mutex g_mutex;

TEST_F(LockRulesDeathTest, AnAllocationUnderALockOutsideAScopeIsCaught) {
  EXPECT_DEATH(
      {
        g_mutex.Lock();
        platform::Free(platform::Alloc(64));
      },
      "lock rule: platform::Alloc under 1 lock\\(s\\) outside a NoFsScope");
}

TEST_F(LockRulesDeathTest, ANewUnderAReadLockOutsideAScopeIsCaught) {
  EXPECT_DEATH(
      {
        static RwLock rw;
        rw.ReadLock();
        platform::Delete(platform::New<u64>(1));
      },
      "lock rule: platform::New under 1 lock\\(s\\) outside a NoFsScope");
}

TEST_F(LockRulesDeathTest, AnUnlockByAThreadThatHoldsNoLockIsCaught) {
  EXPECT_DEATH(
      {
        static Mutex m;
        std::thread([] { m.Lock(); }).join();
        m.Unlock();
      },
      "lock rule: a lock released by a thread that holds none");
}

}  // namespace
}  // namespace tfs
