#include "fsck/fsck.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "userspace/platform/mem_device.h"

namespace tfs::fsck {
namespace {

struct Fs {
  std::unique_ptr<userspace::MemDevice> ssd, hdd;
  std::vector<std::string> lines;

  Fs() {
    userspace::MemDeviceOptions o;
    o.size = 32 << 20;
    o.name = "ssd0";
    ssd = std::make_unique<userspace::MemDevice>(o);
    o.name = "hdd0";
    hdd = std::make_unique<userspace::MemDevice>(o);
    engine::FormatOptions f;
    f.foreground_target = f.metadata_target = "ssd";
    f.background_target = "hdd";
    f.bucket_size = 256 << 10;
    f.btree_node_size = 64 << 10;
    engine::FormatMember m[2] = {{ssd.get(), "ssd.a", 1}, {hdd.get(), "hdd.b", 1}};
    Diag d;
    EXPECT_TRUE(engine::Format(m, 2, f, &d).ok()) << d.text;
  }
  Report Run(bool repair) {
    lines.clear();
    BlockDevice* devs[2] = {hdd.get(), ssd.get()};
    Options o;
    o.repair = repair;
    return Check(devs, 2, o, [](void* ctx, const char* line) {
      static_cast<std::vector<std::string>*>(ctx)->push_back(line);
    }, &lines);
  }
  std::string Text() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

TEST(FsckTest, FreshFilesystemIsClean) {
  Fs fs;
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_EQ(r.errors, 0u);
}

TEST(FsckTest, CorruptPrimarySuperblockIsReportedAndRepaired) {
  Fs fs;
  u8 junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  fs.hdd->WriteRaw(sb::kSbPrimaryOffset + 300, junk, sizeof(junk));
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_NE(fs.Text().find("superblock copies disagree"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

TEST(FsckTest, AllocationStateThatContradictsTheLayoutIsRepaired) {
  Fs fs;
  {
    engine::Engine e;
    BlockDevice* devs[2] = {fs.ssd.get(), fs.hdd.get()};
    Diag d;
    ASSERT_TRUE(e.Open(devs, 2, engine::OpenOptions{}, &d).ok()) << d.text;
    u64 jb = e.sb().members[0].journal_first_bucket;
    ASSERT_TRUE(e.alloc().RepairState(0, jb, alloc::BucketState::kUser).ok());      // journal bucket lost
    ASSERT_TRUE(e.alloc().RepairState(1, 20, alloc::BucketState::kJournal).ok());   // stray journal bucket
    ASSERT_TRUE(e.Close().ok());
  }
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitUncorrected) << fs.Text();
  EXPECT_EQ(r.errors, 2u) << fs.Text();
  EXPECT_NE(fs.Text().find("expected journal"), std::string::npos) << fs.Text();
  r = fs.Run(true);
  EXPECT_EQ(r.exit_code, kExitRepaired) << fs.Text();
  r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
}

TEST(FsckTest, UncleanShutdownIsANoteNotAnError) {
  Fs fs;
  engine::Engine e;
  BlockDevice* devs[2] = {fs.ssd.get(), fs.hdd.get()};
  Diag d;
  ASSERT_TRUE(e.Open(devs, 2, engine::OpenOptions{}, &d).ok()) << d.text;
  ASSERT_TRUE(e.alloc().Allocate(0b10, 0, alloc::BucketState::kUser, alloc::Watermark::kForeground).ok());
  ASSERT_TRUE(e.journal().Flush().ok());
  // fsck while "crashed" (the engine never closed); read-only, so it changes nothing.
  Report r = fs.Run(false);
  EXPECT_EQ(r.exit_code, kExitClean) << fs.Text();
  EXPECT_NE(fs.Text().find("not cleanly unmounted"), std::string::npos) << fs.Text();
}

TEST(FsckTest, MissingMemberIsUncorrectable) {
  Fs fs;
  BlockDevice* devs[1] = {fs.ssd.get()};
  Report r = Check(devs, 1, Options{}, nullptr, nullptr);
  EXPECT_EQ(r.exit_code, kExitUncorrected);
}

}  // namespace
}  // namespace tfs::fsck
