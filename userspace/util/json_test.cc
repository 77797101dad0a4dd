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

}  // namespace
}  // namespace tfs::userspace
