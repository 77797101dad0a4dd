// tierfs setopt PATH... --KEY VALUE... and tierfs getopt PATH...: a file's or
// directory's options (docs/usage.md "Per-file options"; fs/posix/opts.h)
// through the "tierfs.<option>" xattrs of a mounted path -- so they work on
// any tierfs mount without a control protocol of their own, and do exactly
// what setfattr/getfattr do. The filesystem validates (a target must name a
// member or group of it); the syntax of replicas and compression is checked
// here first, so that a typo is a usage error before anything is changed.
// Each option is one setxattr or removexattr (one transaction of its own),
// so a path's options are changed one by one: their old values are read
// first, and when one change fails the ones made before it on that path are
// put back -- a path gets all its changes or none (paths before it keep
// theirs: the command stops there), with one line naming the path, the
// option and why.
#include <CLI/CLI.hpp>

#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "userspace/tools/common.h"

namespace tfs::tools {

namespace {

// The options, as posix names them (fs/posix/opts.h) and as flags.
struct OptKey {
  const char* name;  // foreground_target
  const char* flag;  // --foreground-target
};
constexpr OptKey kKeys[] = {
    {"foreground_target", "--foreground-target"},
    {"background_target", "--background-target"},
    {"promote_target", "--promote-target"},
    {"replicas", "--replicas"},
    {"compression", "--compression"},
};
constexpr size_t kNumKeys = sizeof(kKeys) / sizeof(kKeys[0]);

std::string XattrName(const OptKey& k) { return std::string("tierfs.") + k.name; }

// "foreground_target", "foreground-target" or "--foreground-target" -> its index.
std::optional<size_t> FindKey(std::string text) {
  if (text.rfind("--", 0) == 0) text = text.substr(2);
  for (char& c : text)
    if (c == '-') c = '_';
  for (size_t i = 0; i < kNumKeys; i++)
    if (text == kKeys[i].name) return i;
  return std::nullopt;
}

// An option's value before setopt changed it: set (its text) or not -- a
// damaged one (EUCLEAN) counts as not set: putting it back unsets it, which
// is how writes treat it anyway.
struct OldValue {
  bool set = false;
  std::string text;
};

// An errno of a call on `path` as one line's tail.
std::string Why(int err) {
  if (err == EOPNOTSUPP) return "not on a tierfs filesystem (options are tierfs.* xattrs of a tierfs mount)";
  if (err == EPERM) return "only the owner (or CAP_FOWNER) may set a file's options";
  if (err == EUCLEAN) return "the stored option is damaged (run tierfs fsck)";
  return strerror(err);
}

// One path's changes, all or none: the old values first (so that nothing
// is changed when one cannot be read), then each set and unset; when one
// fails, those before it are put back. 0, or the exit code after one line.
int SetPath(const std::string& path, const std::optional<std::string> (&values)[kNumKeys],
            const std::vector<size_t>& unset_keys) {
  OldValue old[kNumKeys];
  bool touched[kNumKeys] = {};
  for (size_t k = 0; k < kNumKeys; k++) touched[k] = values[k].has_value();
  for (size_t k : unset_keys) touched[k] = true;
  for (size_t k = 0; k < kNumKeys; k++) {
    if (!touched[k]) continue;
    char buf[256];
    const ssize_t n = getxattr(path.c_str(), XattrName(kKeys[k]).c_str(), buf, sizeof(buf));
    if (n >= 0) {
      old[k].set = true;
      old[k].text.assign(buf, size_t(n));
    } else if (errno != ENODATA && errno != EUCLEAN) {  // (a damaged one is replaced, or put back unset)
      PrintError("setopt", path + ": " + Why(errno));
      return 1;
    }
  }
  // Puts back the options changed so far (changed[k]), after a failure.
  bool changed[kNumKeys] = {};
  auto restore = [&]() -> std::string {
    std::string failed;
    int err = 0;
    for (size_t k = 0; k < kNumKeys; k++) {
      if (!changed[k]) continue;
      const std::string name = XattrName(kKeys[k]);
      const int r = old[k].set ? setxattr(path.c_str(), name.c_str(), old[k].text.data(), old[k].text.size(), 0)
                               : removexattr(path.c_str(), name.c_str());
      if (r == 0 || (errno == ENODATA && !old[k].set)) continue;
      err = errno;
      failed += (failed.empty() ? "" : ", ") + std::string(kKeys[k].name);
    }
    if (failed.empty()) return "; nothing changed";
    return "; could not put back " + failed + " (" + strerror(err) + "): they keep the new values";
  };
  for (size_t k = 0; k < kNumKeys; k++) {
    if (!values[k]) continue;
    const std::string& v = *values[k];
    if (setxattr(path.c_str(), XattrName(kKeys[k]).c_str(), v.data(), v.size(), 0) == 0) {
      changed[k] = true;
      continue;
    }
    const int err = errno;
    std::string why;
    if (err == EINVAL && k < 3) {
      why = std::string(kKeys[k].flag) + " '" + v + "': names no member or group of this filesystem";
    } else if (err == EINVAL) {  // (its syntax was checked above: the filesystem disagrees)
      why = std::string(kKeys[k].flag) + " '" + v + "': refused by the filesystem (the mount's log says why)";
    } else {
      why = std::string(kKeys[k].flag) + ": " + Why(err);
    }
    PrintError("setopt", path + ": " + why + restore());
    return 1;
  }
  for (size_t k : unset_keys) {
    if (removexattr(path.c_str(), XattrName(kKeys[k]).c_str()) == 0 || errno == ENODATA) {
      changed[k] = true;
      continue;
    }
    const int err = errno;
    PrintError("setopt", path + ": --unset " + kKeys[k].name + ": " + Why(err) + restore());
    return 1;
  }
  return 0;
}

}  // namespace

int CmdSetopt(int argc, char** argv) {
  CLI::App app("Set per-file or per-directory options of paths on a mounted tierfs filesystem. A directory's "
               "options are copied to what is created in it later (existing children keep theirs).",
               "tierfs setopt");
  std::vector<std::string> paths;
  std::optional<std::string> values[kNumKeys];
  std::vector<std::string> unset;
  app.add_option("paths", paths, "files or directories on a tierfs mount")->required();
  app.add_option("--foreground-target", values[0],
                 "where new data of the file is written: a member label or group name (none: the filesystem's)");
  app.add_option("--background-target", values[1],
                 "where background work moves its data (stored now; used by reconcile, a later step)");
  app.add_option("--promote-target", values[2],
                 "where read-hot data is copied (stored now; used by promote, a later step)");
  app.add_option("--replicas", values[3], "copies of its data, 1..4 (stored now; used by a later step)");
  app.add_option("--compression", values[4], "none or zstd: how its new data is stored");
  app.add_option("--unset", unset, "KEY: unset an option (the filesystem's applies); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.footer("Options are the xattrs tierfs.foreground_target, tierfs.background_target, tierfs.promote_target,\n"
             "tierfs.replicas and tierfs.compression: setfattr/getfattr work the same.\n"
             "Each path gets all of its changes or none: when one is refused, those made before it are put\n"
             "back, and the paths after it are not touched (those before it keep theirs).\n"
             "e.g. tierfs setopt /mnt/t/db --foreground-target ssd --compression none");
  app.allow_extras(false);
  if (int rc = ParseCommandLine(app, "setopt", argc, argv); rc >= 0) return rc;

  std::vector<size_t> unset_keys;
  for (const std::string& u : unset) {
    auto k = FindKey(u);
    if (!k && (u == "inherited" || u == "tierfs.inherited")) {
      PrintError("setopt", "--unset: '" + u + "' is read-only: the names of the inherited options (getopt shows them)");
      return 2;
    }
    if (!k) {
      PrintError("setopt", "--unset: '" + u +
                               "' is not an option (foreground_target, background_target, promote_target, replicas, "
                               "compression)");
      return 2;
    }
    if (values[*k]) {
      PrintError("setopt", std::string(kKeys[*k].name) + " is both set and unset");
      return 2;
    }
    unset_keys.push_back(*k);
  }
  bool any = !unset_keys.empty();
  for (size_t k = 0; k < kNumKeys; k++) any |= values[k].has_value();
  if (!any) {
    PrintError("setopt", "nothing to set: give an option (see 'tierfs setopt --help')");
    return 2;
  }
  // The syntax the filesystem would refuse anyway, before anything changes.
  if (values[3] && (values[3]->size() != 1 || (*values[3])[0] < '1' || (*values[3])[0] > '4')) {
    PrintError("setopt", "--replicas '" + *values[3] + "': must be 1, 2, 3 or 4");
    return 2;
  }
  if (values[4] && *values[4] != "none" && *values[4] != "zstd") {
    PrintError("setopt", "--compression '" + *values[4] + "': must be none or zstd");
    return 2;
  }
  for (const std::string& path : paths) {
    if (int rc = SetPath(path, values, unset_keys); rc != 0) return rc;
  }
  return 0;
}

int CmdGetopt(int argc, char** argv) {
  CLI::App app("Print the per-file or per-directory options of paths on a mounted tierfs filesystem: each "
               "option's value or 'unset' (the filesystem's applies), '(inherited)' when it was copied from the "
               "parent directory at creation.",
               "tierfs getopt");
  std::vector<std::string> paths;
  app.add_option("paths", paths, "files or directories on a tierfs mount")->required();
  app.allow_extras(false);
  if (int rc = ParseCommandLine(app, "getopt", argc, argv); rc >= 0) return rc;

  int rc = 0;
  for (const std::string& path : paths) {
    // The inherited ones' names: also the test that this is tierfs (it always
    // answers there, "" when none).
    char buf[256];
    ssize_t n = getxattr(path.c_str(), "tierfs.inherited", buf, sizeof(buf) - 1);
    if (n < 0) {
      PrintError("getopt", path + ": " + Why(errno));
      rc = 1;
      continue;
    }
    const std::string inherited = "," + std::string(buf, size_t(n)) + ",";
    if (paths.size() > 1) printf("%s:\n", path.c_str());
    for (const OptKey& k : kKeys) {
      std::string value;
      n = getxattr(path.c_str(), XattrName(k).c_str(), buf, sizeof(buf) - 1);
      if (n >= 0) {
        value = std::string(buf, size_t(n));
        if (inherited.find("," + std::string(k.name) + ",") != std::string::npos) value += " (inherited)";
      } else if (errno == ENODATA) {
        value = "unset";
      } else {
        const int err = errno;
        fflush(stdout);
        PrintError("getopt", path + ": " + k.name + ": " + Why(err));
        rc = 1;
        continue;
      }
      printf("%s%s: %s\n", paths.size() > 1 ? "  " : "", k.name, value.c_str());
    }
  }
  return rc;
}

}  // namespace tfs::tools
