// A minimal streaming JSON writer for the tools' JSON output (results documents,
// `tierfs show --json`, benchmark reports).
//
// It emits exactly what the results schema needs (objects, arrays, strings,
// integers, finite doubles, booleans, null) with correct string escaping, and
// inserts commas itself so callers cannot produce a malformed document by
// forgetting one. Non-finite doubles are written as null (JSON has no NaN).
// Strings are bytes: valid UTF-8 is copied, and every byte that is not part of a
// valid UTF-8 sequence is written as \u00XX (its Latin-1 reading), so the output
// is always valid UTF-8 JSON (such a string does not round-trip to its bytes).
// Not thread-safe; one writer per document.
#ifndef TFS_USERSPACE_UTIL_JSON_H_
#define TFS_USERSPACE_UTIL_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tfs::userspace {

class JsonWriter {
 public:
  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  void Key(std::string_view key);
  void String(std::string_view s);
  void Uint(uint64_t v);
  void Int(int64_t v);
  void Double(double v);
  void Bool(bool v);
  void Null();
  // Key and value in one call, for the common flat fields of a document.
  void StringField(std::string_view key, std::string_view v) {
    Key(key);
    String(v);
  }
  void UintField(std::string_view key, uint64_t v) {
    Key(key);
    Uint(v);
  }
  void IntField(std::string_view key, int64_t v) {
    Key(key);
    Int(v);
  }
  void DoubleField(std::string_view key, double v) {
    Key(key);
    Double(v);
  }
  void BoolField(std::string_view key, bool v) {
    Key(key);
    Bool(v);
  }

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();
  void Escape(std::string_view s);  // appends s as a quoted JSON string

  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_UTIL_JSON_H_
