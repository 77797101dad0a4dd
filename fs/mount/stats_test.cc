// The ctl document: every row of every counter table is in it, it is one
// whole JSON object, and a buffer too small for it says so.
#include "mount/stats.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bg/engine.h"
#include "mount/testing.h"
#include "util/counters.h"

namespace tfs::mount {
namespace {

std::string Document(Instance& inst, const MemberExtras* extras = nullptr) {
  std::vector<char> buf(64 * 1024);
  JsonBuffer sink(buf.data(), u32(buf.size()));
  JsonOut w(&JsonBuffer::Sink, &sink);
  EXPECT_TRUE(WriteStats(inst, w, extras).ok());
  EXPECT_TRUE(w.complete());
  EXPECT_FALSE(sink.overflowed());
  return std::string(buf.data(), sink.size());
}

constexpr CounterInfo kJournal[] = {TFS_COUNTER_INFO(TFS_JOURNAL_COUNTERS)};
constexpr CounterInfo kBtree[] = {TFS_COUNTER_INFO(TFS_BTREE_COUNTERS)};
constexpr CounterInfo kAlloc[] = {TFS_COUNTER_INFO(TFS_ALLOC_COUNTERS)};
constexpr CounterInfo kAcct[] = {TFS_COUNTER_INFO(TFS_ACCT_COUNTERS)};
constexpr CounterInfo kData[] = {TFS_COUNTER_INFO(TFS_DATA_COUNTERS)};
constexpr CounterInfo kPosix[] = {TFS_COUNTER_INFO(TFS_POSIX_COUNTERS)};
constexpr CounterInfo kWbuf[] = {TFS_COUNTER_INFO(TFS_WBUF_COUNTERS)};
constexpr CounterInfo kQueue[] = {TFS_COUNTER_INFO(TFS_QUEUE_COUNTERS)};
constexpr CounterInfo kWork[] = {TFS_COUNTER_INFO(TFS_WORK_COUNTERS)};
constexpr CounterInfo kEngine[] = {TFS_COUNTER_INFO(TFS_ENGINE_COUNTERS)};
constexpr CounterInfo kBudget[] = {TFS_COUNTER_INFO(TFS_BUDGET_COUNTERS)};

// The text from the last `"group":{` to its closing brace: the top-level
// groups follow the devices, whose I/O by origin has keys of the same names
// (groups hold no strings with braces).
std::string Group(const std::string& doc, const std::string& group) {
  const size_t at = doc.rfind("\"" + group + "\":{");
  if (at == std::string::npos) return "";
  int depth = 0;
  for (size_t i = doc.find('{', at); i < doc.size(); i++) {
    if (doc[i] == '{') depth++;
    if (doc[i] == '}' && --depth == 0) return doc.substr(at, i + 1 - at);
  }
  return "";
}

template <size_t N>
void ExpectRows(const std::string& text, const CounterInfo (&rows)[N], const char* group) {
  ASSERT_FALSE(text.empty()) << group << " is missing";
  for (const CounterInfo& r : rows) {
    EXPECT_NE(text.find("\"" + std::string(r.name) + "\":"), std::string::npos) << group << "." << r.name;
  }
}

TEST(StatsTest, EveryCounterOfEveryTableIsInTheDocument) {
  auto dev = testing::FormattedMember();
  BlockDevice* b = dev.get();
  Diag diag;
  auto inst = std::make_unique<Instance>();
  ASSERT_TRUE(inst->Open(&b, 1, Options{}, &diag).ok()) << diag.text;
  ASSERT_TRUE(inst->fs().Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{}).ok());
  ASSERT_TRUE(inst->fs().FsyncDir(posix::kRootIno).ok());
  {
    auto f = inst->fs().Lookup(posix::kRootIno, "f", 1);
    ASSERT_TRUE(f.ok());
    const std::string block(4096, 'b');
    ASSERT_TRUE(inst->fs().Write(f.value().ino, 0, block.data(), 4096, posix::Filesystem::kWriteDirect).ok());
  }

  MemberExtras extras;
  extras.write = [](void* ctx, u32 member, JsonOut& w) {
    w.UintField("extra", member + *static_cast<u32*>(ctx));
  };
  u32 base = 40;
  extras.ctx = &base;
  const std::string doc = Document(*inst, &extras);
  ExpectRows(Group(doc, "journal"), kJournal, "journal");
  ExpectRows(Group(doc, "btree"), kBtree, "btree");
  ExpectRows(Group(doc, "alloc"), kAlloc, "alloc");
  ExpectRows(Group(doc, "accounting"), kAcct, "accounting");
  ExpectRows(Group(doc, "data"), kData, "data");
  ExpectRows(Group(doc, "posix"), kPosix, "posix");
  ExpectRows(Group(doc, "write_buffer"), kWbuf, "write_buffer");
  ExpectRows(Group(doc, "work"), kWork, "work");
  // (The engines come last: rfind finds theirs, not the devices' origins.)
  for (const char* e : {"reconcile", "promote", "copygc"}) {
    ExpectRows(Group(Group(doc, "engines"), e), kEngine, e);
    EXPECT_NE(Group(Group(doc, "engines"), e).find(R"("state":"off")"), std::string::npos) << e;
  }
  // One member: one budget, whole (8 I/Os), nothing out; the document's last group.
  const size_t budget = doc.rfind(R"("budget":[{)");
  ASSERT_NE(budget, std::string::npos) << doc;
  ExpectRows(doc.substr(budget), kBudget, "budget");
  EXPECT_EQ(doc.substr(budget + 10), R"({"admitted":0,"refused_busy":0,"refused_stalling":0,"lowered":0,"raised":0,)"
                                     R"("ios":0,"bytes":0,"limit":8}]})");
  // The queue's rows inside the member's own object (from its index to the
  // front end's field that closes it).
  const size_t member = doc.find(R"({"index":0,)");
  ASSERT_NE(member, std::string::npos) << doc;
  ExpectRows(doc.substr(member, doc.find(R"("extra":40})", member) - member), kQueue, "devices[0]");
  const std::string journal = Group(doc, "journal");
  const size_t pf = journal.find(R"("preflushes":[)");
  ASSERT_NE(pf, std::string::npos);
  const std::string entries = journal.substr(pf, journal.find(']', pf) - pf);
  EXPECT_EQ(entries.find(','), std::string::npos) << entries << ": one entry per member, one member";
  EXPECT_NE(doc.find(R"("label":"ssd.a","group":"ssd")"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"("stalled":false)"), std::string::npos) << "flags are booleans";
  EXPECT_NE(doc.find(R"("extra":40})"), std::string::npos) << "the front end's fields close the member";
  EXPECT_NE(doc.find(R"("tiers":{"ssd":{"buckets":)"), std::string::npos) << doc;
  EXPECT_NE(Group(doc, "posix").find(R"("creates":1)"), std::string::npos) << "live values, not zeros";
  // One block on ssd.a: 8 sectors of data with its one copy there; two
  // inodes (the root and the file).
  EXPECT_NE(Group(doc, "accounting")
                .find(R"("reserved_sectors":0,"inodes":2,"replicas":[{"members":["ssd.a"],"sectors":8}])"),
            std::string::npos)
      << Group(doc, "accounting");
  EXPECT_NE(Group(doc, "accounting")
                .find(R"("replicas_unlisted":0,"data_sectors":8,"copies_sectors":[8,0,0,0],)"
                      R"("degraded_sectors":0,"unavailable_sectors":0,)"),
            std::string::npos)
      << Group(doc, "accounting");
  EXPECT_NE(doc.find(R"("live_sectors":8,"cached_sectors":0,)"), std::string::npos) << doc;

  // Too small a buffer: marked, never a document.
  char small[256];
  JsonBuffer sink(small, sizeof(small));
  JsonOut w(&JsonBuffer::Sink, &sink);
  EXPECT_TRUE(WriteStats(*inst, w).ok());
  EXPECT_TRUE(sink.overflowed());
  ASSERT_TRUE(inst->Close().ok());
  JsonOut closed(&JsonBuffer::Sink, &sink);
  EXPECT_EQ(WriteStats(*inst, closed).code(), Err::kInvalidArgument);
}

// Each member's state: ok, or failed with the error that marked it (5c-3;
// a degraded mount's missing member says "missing": fuse_mount_test.py),
// and the data with a copy there counted degraded (replicas 2: every
// block has its other copy).
TEST(StatsTest, AFailedMemberSaysSoAndWhyAndItsDataIsDegraded) {
  auto a = testing::MemMember();
  auto b = testing::MemMember();
  std::vector<BlockDevice*> devs = {a.get(), b.get()};
  store::FormatOptions fo = testing::SmallFormat();
  fo.data_replicas = 2;
  ASSERT_TRUE(testing::FormatMembers(devs, fo).ok());
  Diag diag;
  auto inst = std::make_unique<Instance>();
  ASSERT_TRUE(inst->Open(devs.data(), 2, Options{}, &diag).ok()) << diag.text;
  ASSERT_TRUE(inst->fs().Mknod(posix::kRootIno, "f", 1, posix::kModeReg | 0644, 0, posix::Caller{}).ok());
  {
    auto f = inst->fs().Lookup(posix::kRootIno, "f", 1);
    ASSERT_TRUE(f.ok());
    const std::string blocks(2 * 4096, 'b');
    ASSERT_TRUE(inst->fs().Write(f.value().ino, 0, blocks.data(), blocks.size(), posix::Filesystem::kWriteDirect).ok());
  }
  std::string doc = Document(*inst);
  EXPECT_NE(doc.find(R"("label":"ssd.b","group":"ssd","state":"ok",)"), std::string::npos) << doc;
  EXPECT_NE(Group(doc, "accounting")
                .find(R"("data_sectors":16,"copies_sectors":[0,16,0,0],)"
                      R"("degraded_sectors":0,"unavailable_sectors":0,)"),
            std::string::npos)
      << Group(doc, "accounting");
  ASSERT_TRUE(inst->store().devs().MarkFailed(1, Status(Err::kIoTimeout)));
  doc = Document(*inst);
  EXPECT_NE(doc.find(R"("label":"ssd.a","group":"ssd","state":"ok",)"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"("label":"ssd.b","group":"ssd","state":"failed","error":"I/O timed out",)"),
            std::string::npos)
      << doc;
  EXPECT_NE(Group(doc, "accounting")
                .find(R"("data_sectors":16,"copies_sectors":[0,16,0,0],)"
                      R"("degraded_sectors":16,"unavailable_sectors":0,)"),
            std::string::npos)
      << Group(doc, "accounting");
  ASSERT_TRUE(inst->Close().ok());
}

}  // namespace
}  // namespace tfs::mount
