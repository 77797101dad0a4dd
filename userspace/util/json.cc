// The tools' JSON writer (see json.h): what the core's writer leaves out.
#include "userspace/util/json.h"

#include <cmath>
#include <cstdio>

namespace tfs::userspace {

void JsonWriter::Double(double v) {
  if (!std::isfinite(v)) {
    Null();
    return;
  }
  BeforeValue();
  char buf[40];
  const int n = std::snprintf(buf, sizeof(buf), "%.17g", v);
  Put(buf, u32(n));
}

}  // namespace tfs::userspace
