// JsonWriter: the tools' JSON documents (results, `tierfs show --json`,
// benchmark reports, the probe's output, the fault devices' stats) -- the
// core's writer (util/json_out.h: commas, nesting, escaping; strings are
// bytes, so invalid UTF-8 is written as \u00XX and the output is always valid
// UTF-8 JSON) into a growing string, plus doubles, which the kernel-safe core
// does not write. Non-finite doubles are written as null (JSON has no NaN).
// Not thread-safe; one writer per document.
#ifndef TFS_USERSPACE_UTIL_JSON_H_
#define TFS_USERSPACE_UTIL_JSON_H_

#include <string>

#include "util/json_out.h"

namespace tfs::userspace {

class JsonWriter : public JsonOut {
 public:
  JsonWriter() : JsonOut(&Append, &out_) {}

  void Double(double v);
  void DoubleField(JsonStr key, double v) {
    Key(key);
    Double(v);
  }

  const std::string& str() const { return out_; }

 private:
  static void Append(void* ctx, const char* bytes, u32 n) { static_cast<std::string*>(ctx)->append(bytes, n); }

  std::string out_;
};

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_UTIL_JSON_H_
