// /proc/self/mountinfo lines (see mountinfo.h).
#include "userspace/util/mountinfo.h"

#include <sstream>
#include <vector>

namespace tfs::userspace {
namespace {

bool IsOctal(char c) { return c >= '0' && c <= '7'; }

}  // namespace

std::string UnescapeMountinfo(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 3 < s.size() && IsOctal(s[i + 1]) && IsOctal(s[i + 2]) && IsOctal(s[i + 3])) {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool ParseMountinfoLine(const std::string& line, MountinfoLine* out) {
  std::istringstream fields(line);
  std::vector<std::string> f;
  std::string w;
  while (fields >> w) f.push_back(w);
  size_t dash = 6;  // the optional fields end at the first "-" after OPTIONS
  while (dash < f.size() && f[dash] != "-") dash++;
  if (dash + 2 >= f.size()) return false;
  out->mount_point = UnescapeMountinfo(f[4]);
  out->options = f[5];
  out->fstype = f[dash + 1];
  out->source = UnescapeMountinfo(f[dash + 2]);
  out->super_options = dash + 3 < f.size() ? f[dash + 3] : "";
  return true;
}

}  // namespace tfs::userspace
