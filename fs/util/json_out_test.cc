// The core's JSON writer: the fixed buffer an ioctl replies from, and the
// writer's refusal to produce a malformed document (escaping is covered with
// userspace's JsonWriter, which is this writer: userspace/util/json_test.cc).
#include "util/json_out.h"

#include <gtest/gtest.h>

#include <string>

namespace tfs {
namespace {

TEST(JsonOutTest, WritesIntoAFixedBufferAndSaysWhenItOverflowed) {
  char buf[64];
  JsonBuffer sink(buf, sizeof(buf));
  JsonOut w(&JsonBuffer::Sink, &sink);
  w.BeginObject();
  w.UintField("max", ~u64(0));
  w.IntField("min", i64(-9223372036854775807LL - 1));
  w.IntField("zero", 0);
  w.Key("raw");
  w.Raw("[1,{}]");
  w.EndObject();
  EXPECT_TRUE(w.complete()) << "the writer's part; the sink's is overflowed()";
  const std::string want = R"({"max":18446744073709551615,"min":-9223372036854775808,"zero":0,"raw":[1,{}]})";
  EXPECT_EQ(std::string(buf), want.substr(0, sizeof(buf) - 1)) << "cut at the buffer, NUL-terminated";
  ASSERT_GT(want.size(), sizeof(buf) - 1);
  EXPECT_TRUE(sink.overflowed());
  EXPECT_EQ(sink.size(), sizeof(buf) - 1);

  // What fits exactly (with its NUL) did not overflow.
  char exact[8];
  JsonBuffer s2(exact, sizeof(exact));
  JsonOut w2(&JsonBuffer::Sink, &s2);
  w2.String("abcde");  // 7 bytes with its quotes
  EXPECT_FALSE(s2.overflowed());
  EXPECT_EQ(std::string(exact), "\"abcde\"");
  w2.Null();
  EXPECT_TRUE(s2.overflowed());
}

TEST(JsonOutTest, MisuseBreaksTheWriterInsteadOfItsState) {
  std::string out;
  auto sink = [](void* ctx, const char* p, u32 n) { static_cast<std::string*>(ctx)->append(p, n); };
  {
    JsonOut w(sink, &out);
    w.EndObject();  // nothing open
    EXPECT_FALSE(w.ok());
  }
  {
    JsonOut w(sink, &out);
    w.BeginObject();
    w.Key("a");
    w.EndObject();  // a key without its value
    EXPECT_FALSE(w.ok());
  }
  {
    JsonOut w(sink, &out);
    for (u32 i = 0; i <= JsonOut::kMaxDepth; i++) w.BeginArray();
    EXPECT_FALSE(w.ok());
  }
  {
    out.clear();
    JsonOut w(sink, &out);
    for (u32 i = 0; i < JsonOut::kMaxDepth; i++) w.BeginArray();
    for (u32 i = 0; i < JsonOut::kMaxDepth; i++) w.EndArray();
    EXPECT_TRUE(w.complete());
    EXPECT_EQ(out, std::string(JsonOut::kMaxDepth, '[') + std::string(JsonOut::kMaxDepth, ']'));
    JsonOut empty(sink, &out);
    EXPECT_FALSE(empty.complete()) << "nothing written is not a document";
  }
}

}  // namespace
}  // namespace tfs
