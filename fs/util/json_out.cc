// The JSON writer (see json_out.h): commas, nesting and RFC 8259 escaping.
#include "util/json_out.h"

#include "platform/platform.h"

namespace tfs {
namespace {

// Length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF) that starts at s[i], whose first byte is
// >= 0x80; 0 when there is none.
u32 Utf8SequenceLength(const char* s, u32 n, u32 i) {
  auto byte = [&](u32 k) { return k < n ? u32(static_cast<unsigned char>(s[k])) : 0u; };
  auto cont = [&](u32 k) { return (byte(k) & 0xC0) == 0x80; };
  const u32 b0 = byte(i);
  const u32 b1 = byte(i + 1);
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const bool second_ok = b0 == 0xE0   ? (b1 >= 0xA0 && b1 <= 0xBF)
                           : b0 == 0xED ? (b1 >= 0x80 && b1 <= 0x9F)  // not a surrogate
                                        : cont(i + 1);
    return second_ok && cont(i + 2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const bool second_ok = b0 == 0xF0   ? (b1 >= 0x90 && b1 <= 0xBF)
                           : b0 == 0xF4 ? (b1 >= 0x80 && b1 <= 0x8F)  // at most U+10FFFF
                                        : cont(i + 1);
    return second_ok && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

constexpr char kHex[] = "0123456789abcdef";

}  // namespace

void JsonOut::BeforeValue() {
  wrote_ = true;
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (depth_ > 0) {
    if (!first_[depth_ - 1]) Put(",", 1);
    first_[depth_ - 1] = false;
  }
}

void JsonOut::Open(char c) {
  BeforeValue();
  if (depth_ == kMaxDepth) {
    broken_ = true;
    return;
  }
  Put(&c, 1);
  first_[depth_++] = true;
}

void JsonOut::Close(char c) {
  if (depth_ == 0 || after_key_) {
    broken_ = true;
    return;
  }
  depth_--;
  Put(&c, 1);
}

void JsonOut::BeginObject() { Open('{'); }
void JsonOut::EndObject() { Close('}'); }
void JsonOut::BeginArray() { Open('['); }
void JsonOut::EndArray() { Close(']'); }

void JsonOut::Key(JsonStr key) {
  if (after_key_) broken_ = true;
  BeforeValue();
  Escape(key);
  Put(":", 1);
  after_key_ = true;
}

void JsonOut::String(JsonStr s) {
  BeforeValue();
  Escape(s);
}

void JsonOut::Escape(JsonStr s) {
  Put("\"", 1);
  u32 run = 0;  // start of the bytes copied as they are
  for (u32 i = 0; i < s.n; i++) {
    const u32 c = static_cast<unsigned char>(s.p[i]);
    if (c >= 0x80) {
      const u32 len = Utf8SequenceLength(s.p, s.n, i);
      if (len > 0) {
        i += len - 1;  // valid UTF-8: part of the run
        continue;
      }
    } else if (c >= 0x20 && c != '"' && c != '\\') {
      continue;
    }
    Put(s.p + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': Put("\\\"", 2); break;
      case '\\': Put("\\\\", 2); break;
      case '\n': Put("\\n", 2); break;
      case '\r': Put("\\r", 2); break;
      case '\t': Put("\\t", 2); break;
      default: {
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        Put(esc, 6);
      }
    }
  }
  Put(s.p + run, s.n - run);
  Put("\"", 1);
}

void JsonOut::Uint(u64 v) {
  BeforeValue();
  char buf[24];
  Put(buf, u32(platform::Format(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(v))));
}

void JsonOut::Int(i64 v) {
  BeforeValue();
  char buf[24];
  Put(buf, u32(platform::Format(buf, sizeof(buf), "%lld", static_cast<long long>(v))));
}

void JsonOut::Bool(bool v) {
  BeforeValue();
  if (v) {
    Put("true", 4);
  } else {
    Put("false", 5);
  }
}

void JsonOut::Null() {
  BeforeValue();
  Put("null", 4);
}

void JsonOut::Raw(JsonStr json) {
  BeforeValue();
  Put(json.p, json.n);
}

void JsonBuffer::Sink(void* ctx, const char* bytes, u32 n) {
  JsonBuffer* b = static_cast<JsonBuffer*>(ctx);
  if (b->cap_ == 0) {
    b->overflowed_ = b->overflowed_ || n > 0;
    return;
  }
  const u32 room = b->cap_ - 1 - b->len_;
  const u32 take = n < room ? n : room;
  MemCopy(b->buf_ + b->len_, bytes, take);
  b->len_ += take;
  b->buf_[b->len_] = '\0';
  if (take < n) b->overflowed_ = true;
}

}  // namespace tfs
