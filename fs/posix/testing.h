// Test helpers shared by posix's tests (fs_test, opts_test): what a caller of
// listxattr sees. Tests only; each test binary includes it once.
#ifndef TFS_POSIX_TESTING_H_
#define TFS_POSIX_TESTING_H_

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "posix/fs.h"

namespace tfs::posix::fixture {

// The xattr names of `ino`, in the order ListXattr gives them: its size
// probe (a null buffer), then the list into a buffer of that size, split at
// the NULs (each name ends with one). A failure is a test failure.
inline std::vector<std::string> XattrNames(Filesystem& fs, u64 ino) {
  auto len = fs.ListXattr(ino, nullptr, 0);
  EXPECT_TRUE(len.ok());
  if (!len.ok()) return {};
  std::string buf(len.value(), '\0');
  auto r = fs.ListXattr(ino, buf.data(), u32(buf.size()));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.ok() ? r.value() : 0, buf.size());
  std::vector<std::string> names;
  for (size_t at = 0; at < buf.size();) {
    const size_t end = buf.find('\0', at);
    EXPECT_NE(end, std::string::npos) << "a name without its NUL";
    if (end == std::string::npos) break;
    names.push_back(buf.substr(at, end - at));
    at = end + 1;
  }
  return names;
}

}  // namespace tfs::posix::fixture

#endif  // TFS_POSIX_TESTING_H_
