// The JSON writer: commas and escapes are the parts that are easy to get subtly
// wrong.
#include "userspace/util/json.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tfs::userspace {
namespace {

TEST(JsonWriterTest, NestsAndEscapes) {
  JsonWriter w;
  w.BeginObject();
  w.Key("a");
  w.BeginArray();
  w.Uint(1);
  w.Int(-2);
  w.Double(0.5);
  w.Double(NAN);
  w.EndArray();
  w.Key("s\"");
  w.String("x\\y\n\t\x01");
  w.Key("o");
  w.BeginObject();
  w.EndObject();
  w.Key("b");
  w.Bool(true);
  w.Key("n");
  w.Null();
  w.EndObject();
  EXPECT_EQ(w.str(),
            "{\"a\":[1,-2,0.5,null],\"s\\\"\":\"x\\\\y\\n\\t\\u0001\",\"o\":{},\"b\":true,"
            "\"n\":null}");
}

// Output must be valid UTF-8 whatever the bytes (a --dir named in Latin-1 ended up
// raw in results documents, which JSON readers then refuse).
TEST(JsonWriterTest, ValidUtf8PassesAndOtherBytesAreEscaped) {
  JsonWriter w;
  w.BeginArray();
  w.String("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // é, €, U+1F600: as is
  w.String("caf\xe9");                                      // Latin-1 é: not UTF-8
  w.String("\xc3");                                         // truncated sequence
  w.String("\xc0\xaf");                                     // overlong '/'
  w.String("\xed\xa0\x80");                                 // surrogate U+D800
  w.String("\xf4\x90\x80\x80");                             // above U+10FFFF
  w.String("\x80\xff\xc3\xa9x");                             // stray bytes, then é
  w.EndArray();
  EXPECT_EQ(w.str(),
            "[\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\",\"caf\\u00e9\",\"\\u00c3\","
            "\"\\u00c0\\u00af\",\"\\u00ed\\u00a0\\u0080\",\"\\u00f4\\u0090\\u0080\\u0080\","
            "\"\\u0080\\u00ff\xc3\xa9x\"]");
}

TEST(JsonWriterTest, EveryByteStringGivesValidUtf8) {
  // All 1- and 2-byte strings and a sample of 3- and 4-byte ones: no byte >= 0x80
  // in the output may start an invalid sequence.
  auto valid_utf8 = [](const std::string& s) {
    for (size_t i = 0; i < s.size();) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
      if (n == 0 || i + n > s.size()) return false;
      for (size_t k = 1; k < n; k++) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      }
      i += n;
    }
    return true;
  };
  for (unsigned a = 0; a < 256; a++) {
    for (unsigned b = 0; b < 256; b++) {
      JsonWriter w;
      w.String(std::string{char(a), char(b), char(0xa9), char(0x80)});
      ASSERT_TRUE(valid_utf8(w.str())) << a << " " << b;
    }
  }
}

}  // namespace
}  // namespace tfs::userspace
