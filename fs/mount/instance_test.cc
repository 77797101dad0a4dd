// mount::Instance: the bring-up order, its failures and the take-down.
#include "mount/instance.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "mount/testing.h"

namespace tfs::mount {
namespace {

TEST(InstanceTest, OpenServesPosixAndCloseLeavesItClean) {
  auto dev = testing::FormattedMember();
  BlockDevice* b = dev.get();
  Diag diag;
  {
    auto inst = std::make_unique<Instance>();
    ASSERT_TRUE(inst->Open(&b, 1, Options{}, &diag).ok()) << diag.text;
    EXPECT_TRUE(inst->open() && inst->store().open());
    // A read-write mount records posix's incompatible features (format
    // does not): older builds refuse the filesystem from now on.
    EXPECT_EQ(inst->store().sb().flags & posix::kSbFeatures, posix::kSbFeatures);
    EXPECT_NE(inst->store().sb().flags & sb::kSbExtentPolicy, 0);
    EXPECT_EQ(inst->Open(&b, 1, Options{}, &diag).code(), Err::kBusy);
    auto f = inst->fs().Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{});
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(inst->fs().Open(f.value().ino, 0).ok());
    ASSERT_TRUE(inst->fs().Write(f.value().ino, 0, "hello", 5).ok());  // buffered, not yet written
    CloseTimes t;
    ASSERT_TRUE(inst->Close(&t).ok());
    EXPECT_FALSE(inst->open() || inst->store().open());
    EXPECT_GT(t.posix_ns + t.store_ns, 0u);
    EXPECT_TRUE(inst->Close().ok());  // idempotent
  }
  // The write buffer went out and the store was closed clean: reopen and read.
  auto inst = std::make_unique<Instance>();
  store::OpenReport rep;
  ASSERT_TRUE(inst->Open(&b, 1, Options{}, &diag, &rep).ok()) << diag.text;
  EXPECT_TRUE(rep.was_clean);
  EXPECT_EQ(rep.features, posix::kSbFeatures | sb::kSbExtentPolicy);  // as the first mount left it
  auto f = inst->fs().Lookup(posix::kRootIno, "f", 1);
  ASSERT_TRUE(f.ok());
  char buf[8] = {};
  auto r = inst->fs().Read(f.value().ino, 0, buf, sizeof(buf));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::string(buf, r.value()), "hello");
  // The destructor closes what is still open.
}

TEST(InstanceTest, AFailedStageSaysWhichAndLeavesNothingOpen) {
  auto dev = testing::FormattedMember();
  BlockDevice* b = dev.get();
  Diag diag;
  Instance inst;
  Options bad;
  bad.posix.dir_hash_bits = 0;  // posix refuses it
  Status st = inst.Open(&b, 1, bad, &diag);
  EXPECT_EQ(st.code(), Err::kInvalidArgument);
  EXPECT_EQ(std::string(diag.text), "the namespace does not mount: invalid argument");
  EXPECT_FALSE(inst.open() || inst.store().open());
  // An instance opens once; the store went down with it, so the members
  // mount again in a new one.
  EXPECT_EQ(inst.Open(&b, 1, Options{}, &diag).code(), Err::kBusy);
  EXPECT_EQ(std::string(diag.text), "an instance opens once");
  diag = Diag{};
  Instance again;
  ASSERT_TRUE(again.Open(&b, 1, Options{}, &diag).ok()) << diag.text;
  ASSERT_TRUE(again.Close().ok());
  EXPECT_EQ(again.Open(&b, 1, Options{}, &diag).code(), Err::kBusy);
  // A member that is no filesystem: the store's own line.
  auto blank = testing::MemMember();
  BlockDevice* bb = blank.get();
  diag = Diag{};
  Instance other;
  EXPECT_FALSE(other.Open(&bb, 1, Options{}, &diag).ok());
  EXPECT_FALSE(diag.empty());
  EXPECT_EQ(std::string(diag.text).find("the namespace"), std::string::npos) << diag.text;
  EXPECT_FALSE(other.open());
}

}  // namespace
}  // namespace tfs::mount
