// The control line (mount/control.h): pause and resume the engines of a
// mounted instance, the replies, and lines refused whole.
#include "mount/control.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mount/stats.h"
#include "mount/testing.h"

namespace tfs::mount {
namespace {

struct Reply {
  Status st;
  std::string text;
};

Reply Send(Instance& inst, const std::string& line, usize cap = 256) {
  std::vector<char> buf(cap + 1, '#');
  Reply r{RunControl(inst, line.data(), line.size(), buf.data(), cap), ""};
  EXPECT_EQ(buf[cap], '#') << "wrote past cap";
  r.text = std::string(buf.data(), strnlen(buf.data(), cap));
  EXPECT_LT(r.text.size(), cap) << "the reply is NUL-terminated within cap";
  return r;
}

u32 PausedMask(Instance& inst) {
  u32 m = 0;
  for (u32 i = 0; i < bg::kEngineCount; i++)
    if (inst.engines().get(bg::EngineId(i)).paused()) m |= 1u << i;
  return m;
}

std::string Document(Instance& inst) {
  std::vector<char> buf(64 * 1024);
  JsonBuffer sink(buf.data(), u32(buf.size()));
  JsonOut w(&JsonBuffer::Sink, &sink);
  EXPECT_TRUE(WriteStats(inst, w).ok());
  return std::string(buf.data(), sink.size());
}

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = testing::FormattedMember();
    BlockDevice* b = dev_.get();
    Diag diag;
    inst_ = std::make_unique<Instance>();
    ASSERT_TRUE(inst_->Open(&b, 1, Options{}, &diag).ok()) << diag.text;
  }
  void TearDown() override { EXPECT_TRUE(inst_->Close().ok()); }

  std::unique_ptr<userspace::MemDevice> dev_;
  std::unique_ptr<Instance> inst_;
};

TEST_F(ControlTest, PauseAndResumeEnginesByNameOrAll) {
  Reply r = Send(*inst_, "pause all");
  ASSERT_TRUE(r.st.ok()) << r.text;
  EXPECT_EQ(r.text, "ok paused: reconcile promote copygc");
  EXPECT_EQ(PausedMask(*inst_), bg::kAllEngines);
  const std::string doc = Document(*inst_);
  // (No engine has work yet, so none has a thread: "off", with its switch
  // paused -- engine_test.cc has the states of a running engine.)
  EXPECT_NE(doc.find(R"("engines":{"reconcile":{"state":"off","steps":0,)"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"("pauses":1,"resumes":0,"paused":true,"running":false},"promote":)"), std::string::npos)
      << doc;
  EXPECT_NE(doc.find(R"("resumes":0,"paused":true,"running":false}},"budget":[)"), std::string::npos) << doc;

  r = Send(*inst_, "  resume\tcopygc   reconcile ");
  ASSERT_TRUE(r.st.ok()) << r.text;
  EXPECT_EQ(r.text, "ok resumed: reconcile copygc") << "named in engine order";
  EXPECT_EQ(PausedMask(*inst_), 1u << u32(bg::EngineId::kPromote));
  r = Send(*inst_, "pause promote promote");
  EXPECT_TRUE(r.st.ok()) << "idempotent, a name twice is fine: " << r.text;
  EXPECT_EQ(r.text, "ok paused: promote");
  r = Send(*inst_, "resume all");
  EXPECT_TRUE(r.st.ok());
  EXPECT_EQ(PausedMask(*inst_), 0u);
  EXPECT_EQ(Document(*inst_).find(R"("paused":true)"), std::string::npos);
  EXPECT_EQ(inst_->engines().get(bg::EngineId::kReconcile).GetStats().pauses, 1u);
}

TEST_F(ControlTest, ABadLineIsRefusedWholeAndChangesNothing) {
  const struct {
    const char* line;
    const char* reply;
  } cases[] = {
      {"", "error: usage: pause|resume ENGINE... (ENGINE: reconcile, promote, copygc, all)"},
      {"   ", "error: usage: pause|resume ENGINE... (ENGINE: reconcile, promote, copygc, all)"},
      {"frob all", "error: unknown command 'frob' (pause, resume)"},
      {"Pause all", "error: unknown command 'Pause' (pause, resume)"},
      {"pause", "error: usage: pause ENGINE... (ENGINE: reconcile, promote, copygc, all)"},
      {"resume ", "error: usage: resume ENGINE... (ENGINE: reconcile, promote, copygc, all)"},
      {"pause reconcile frob", "error: unknown engine 'frob' (reconcile, promote, copygc, all)"},
      {"pause all x", "error: unknown engine 'x' (reconcile, promote, copygc, all)"},
  };
  for (const auto& c : cases) {
    const Reply r = Send(*inst_, c.line);
    EXPECT_EQ(r.st.code(), Err::kInvalidArgument) << c.line;
    EXPECT_EQ(r.text, c.reply) << c.line;
    EXPECT_EQ(PausedMask(*inst_), 0u) << c.line << ": changed something";
  }
  // A long word is quoted cut; anything not printable is '?', and every
  // byte up to a space separates words: a reply is one line.
  Reply r = Send(*inst_, "pause " + std::string(300, 'z'));
  EXPECT_EQ(r.text, "error: unknown engine '" + std::string(32, 'z') + "' (reconcile, promote, copygc, all)");
  r = Send(*inst_, "pause x\ny\rz");
  EXPECT_EQ(r.text, "error: unknown engine 'x' (reconcile, promote, copygc, all)");
  r = Send(*inst_, "pause all \x7f\xc3\xa9t\x1b");
  EXPECT_EQ(r.text, "error: unknown engine '???t' (reconcile, promote, copygc, all)");
  EXPECT_EQ(PausedMask(*inst_), 0u);
  // As many words as anyone sends, repeated names included.
  std::string many = "pause";
  for (int i = 0; i < 200; i++) many += i % 2 ? " reconcile" : " copygc";
  r = Send(*inst_, many, 4096);
  EXPECT_TRUE(r.st.ok()) << r.text;
  EXPECT_EQ(r.text, "ok paused: reconcile copygc");
  ASSERT_TRUE(Send(*inst_, "resume all").st.ok());
  // The line ends at its first NUL within len; nothing past len is read.
  const char nul[] = "pause all\0frob";
  std::vector<char> buf(128);
  EXPECT_EQ(RunControl(*inst_, nul, sizeof(nul) - 1, buf.data(), buf.size()).code(), Err::kOk);
  EXPECT_STREQ(buf.data(), "ok paused: reconcile promote copygc");
  ASSERT_TRUE(Send(*inst_, "resume all").st.ok());
  EXPECT_EQ(RunControl(*inst_, nul, 5, buf.data(), buf.size()).code(), Err::kInvalidArgument);
  EXPECT_STREQ(buf.data(), "error: usage: pause ENGINE... (ENGINE: reconcile, promote, copygc, all)");
  EXPECT_EQ(PausedMask(*inst_), 0u);
}

TEST_F(ControlTest, RepliesAreCutToTheirBuffer) {
  Reply r = Send(*inst_, "pause all", 12);
  EXPECT_TRUE(r.st.ok());
  EXPECT_EQ(r.text, "ok paused: ");
  EXPECT_EQ(PausedMask(*inst_), bg::kAllEngines) << "a cut reply does not undo the command";
  r = Send(*inst_, "frob", 8);
  EXPECT_EQ(r.text, "error: ");
  r = Send(*inst_, "resume all", 1);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(PausedMask(*inst_), 0u);
  char none = 'x';
  EXPECT_EQ(RunControl(*inst_, "pause all", 9, &none, 0).code(), Err::kInvalidArgument);
  EXPECT_EQ(none, 'x');
}

TEST(ControlClosedTest, AnInstanceNotOpenRefuses) {
  Instance inst;
  std::vector<char> buf(128);
  EXPECT_EQ(RunControl(inst, "pause all", 9, buf.data(), buf.size()).code(), Err::kInvalidArgument);
  EXPECT_STREQ(buf.data(), "error: the filesystem is not mounted");
}

}  // namespace
}  // namespace tfs::mount
