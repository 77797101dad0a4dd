// JSON writer (see json.h). Strings are escaped per RFC 8259: quote, backslash and
// control characters. Valid UTF-8 passes through; any other byte (paths and
// labels come from the user and need not be UTF-8) is written as \u00XX, so the
// document is always valid UTF-8, which JSON requires and readers enforce.
#include "userspace/util/json.h"

#include <cmath>
#include <cstdio>

namespace tfs::userspace {
namespace {

// Length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF) that starts at s[i], whose first byte is
// >= 0x80; 0 when there is none.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  auto cont = [&](size_t k) { return (byte(k) & 0xC0) == 0x80; };
  unsigned b0 = byte(i);
  unsigned b1 = byte(i + 1);
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    bool second_ok = b0 == 0xE0 ? (b1 >= 0xA0 && b1 <= 0xBF)
                     : b0 == 0xED ? (b1 >= 0x80 && b1 <= 0x9F)  // not a surrogate
                                  : cont(i + 1);
    return second_ok && cont(i + 2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    bool second_ok = b0 == 0xF0 ? (b1 >= 0x90 && b1 <= 0xBF)
                     : b0 == 0xF4 ? (b1 >= 0x80 && b1 <= 0x8F)  // at most U+10FFFF
                                  : cont(i + 1);
    return second_ok && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

void JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  first_.push_back(true);
}

void JsonWriter::EndObject() {
  first_.pop_back();
  out_ += '}';
}

void JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  first_.push_back(true);
}

void JsonWriter::EndArray() {
  first_.pop_back();
  out_ += ']';
}

void JsonWriter::Key(std::string_view key) {
  BeforeValue();
  Escape(key);
  out_ += ':';
  after_key_ = true;
}

void JsonWriter::String(std::string_view s) {
  BeforeValue();
  Escape(s);
}

void JsonWriter::Escape(std::string_view s) {
  out_ += '"';
  for (size_t i = 0; i < s.size(); i++) {
    char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      size_t n = Utf8SequenceLength(s, i);
      if (n > 0) {
        out_.append(s.substr(i, n));
        i += n - 1;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(static_cast<unsigned char>(c)));
        out_ += buf;
      }
      continue;
    }
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\r': out_ += "\\r"; break;
      case '\t': out_ += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out_ += buf;
        } else {
          out_ += c;
        }
    }
  }
  out_ += '"';
}

void JsonWriter::Uint(uint64_t v) {
  BeforeValue();
  out_ += std::to_string(v);
}

void JsonWriter::Int(int64_t v) {
  BeforeValue();
  out_ += std::to_string(v);
}

void JsonWriter::Double(double v) {
  if (!std::isfinite(v)) {
    Null();
    return;
  }
  BeforeValue();
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  out_ += buf;
}

void JsonWriter::Bool(bool v) {
  BeforeValue();
  out_ += v ? "true" : "false";
}

void JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
}

}  // namespace tfs::userspace
