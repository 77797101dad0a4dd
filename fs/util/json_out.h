// JsonOut: the one streaming JSON writer -- the core's counters (the ctl
// reply, kernel and FUSE alike) and, through userspace::JsonWriter
// (userspace/util/json.h), the tools, the probe, the benchmarks and the fault
// devices.
//
// It inserts commas itself, so a caller cannot write a malformed document by
// forgetting one, and escapes strings per RFC 8259: valid UTF-8 is copied, a
// byte that is not part of a valid UTF-8 sequence is written as \u00XX (its
// Latin-1 reading), so the output is always valid UTF-8 JSON (labels and paths
// come from users and need not be UTF-8).
//
// Kernel-safe: no allocation, no floating point (userspace::JsonWriter adds
// doubles), no virtual functions. Bytes go to a sink function; JsonBuffer is
// the fixed-buffer sink an ioctl uses (it remembers that it overflowed, so a
// reply is never silently cut). Nesting is bounded (kMaxDepth); deeper
// containers, or an End without a Begin, mark the writer broken instead of
// writing past its state. Not thread-safe: one writer per document.
#ifndef TFS_UTIL_JSON_OUT_H_
#define TFS_UTIL_JSON_OUT_H_

#include "platform/types.h"

namespace tfs {

// A string and its length. Built from a C string, a pointer and a length, or
// anything with data() and size() (std::string_view in userspace).
struct JsonStr {
  const char* p;
  u32 n;
  JsonStr(const char* s) : p(s), n(u32(StrLen(s))) {}  // NOLINT: implicit by design
  JsonStr(const char* s, u32 len) : p(s), n(len) {}
  template <typename S, typename = decltype(static_cast<const S*>(nullptr)->data())>
  JsonStr(const S& s) : p(s.data()), n(u32(s.size())) {}  // NOLINT: implicit by design
};

class JsonOut {
 public:
  static constexpr u32 kMaxDepth = 32;
  using SinkFn = void (*)(void* ctx, const char* bytes, u32 n);

  JsonOut(SinkFn sink, void* ctx) : sink_(sink), ctx_(ctx) {}
  JsonOut(const JsonOut&) = delete;
  JsonOut& operator=(const JsonOut&) = delete;

  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  void Key(JsonStr key);
  void String(JsonStr s);
  void Uint(u64 v);
  void Int(i64 v);
  void Bool(bool v);
  void Null();
  // A value already serialized as JSON by someone else (another writer's
  // document), written as is.
  void Raw(JsonStr json);

  // Key and value in one call, for the flat fields of a document.
  void StringField(JsonStr key, JsonStr v) {
    Key(key);
    String(v);
  }
  void UintField(JsonStr key, u64 v) {
    Key(key);
    Uint(v);
  }
  void IntField(JsonStr key, i64 v) {
    Key(key);
    Int(v);
  }
  void BoolField(JsonStr key, bool v) {
    Key(key);
    Bool(v);
  }

  // False once the writer was misused (see above); what it wrote is then not
  // a document.
  bool ok() const { return !broken_; }
  // Every container closed and nothing broken: a whole document.
  bool complete() const { return !broken_ && depth_ == 0 && wrote_; }

 protected:
  // Before any value: the comma, or nothing after a key.
  void BeforeValue();
  void Put(const char* bytes, u32 n) { sink_(ctx_, bytes, n); }

 private:
  void Open(char c);
  void Close(char c);
  void Escape(JsonStr s);

  SinkFn sink_;
  void* ctx_;
  bool first_[kMaxDepth] = {};  // per open container: no element written yet
  u32 depth_ = 0;
  bool after_key_ = false;
  bool broken_ = false;
  bool wrote_ = false;
};

// The fixed-buffer sink: at most cap - 1 bytes and always NUL-terminated.
// overflowed(): bytes were dropped (the document is incomplete; callers
// report it, they never hand it out).
class JsonBuffer {
 public:
  JsonBuffer(char* buf, u32 cap) : buf_(buf), cap_(cap) {
    if (cap_ > 0) buf_[0] = '\0';
  }
  static void Sink(void* ctx, const char* bytes, u32 n);

  u32 size() const { return len_; }  // bytes written, without the NUL
  bool overflowed() const { return overflowed_; }

 private:
  char* buf_;
  u32 cap_;
  u32 len_ = 0;
  bool overflowed_ = false;
};

}  // namespace tfs

#endif  // TFS_UTIL_JSON_OUT_H_
