// Device opening, size parsing and error printing for the tierfs command line.
#include "userspace/tools/common.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdio>

#include <unistd.h>

#include "sb/superblock.h"
#include "userspace/platform/log.h"

namespace tfs::tools {

void PrintError(const std::string& cmd, const std::string& message) {
  fprintf(stderr, "tierfs %s: %s\n", cmd.c_str(), message.c_str());
  // A mount's log=FILE gets it too (while the daemon still has the terminal).
  const int copy = userspace::LogCopy();
  if (copy >= 0 && copy != STDERR_FILENO) dprintf(copy, "tierfs %s: %s\n", cmd.c_str(), message.c_str());
}

namespace {

template <typename Parse>
int ParseWith(CLI::App& app, const std::string& cmd, int usage_code, Parse parse) {
  try {
    parse();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    for (char& ch : what) {
      if (ch == '\n') ch = ' ';
    }
    PrintError(cmd, what + " (see 'tierfs " + cmd + " --help')");
    return usage_code;
  }
  return -1;
}

}  // namespace

int ParseCommandLine(CLI::App& app, const std::string& cmd, int argc, char** argv, int usage_code) {
  return ParseWith(app, cmd, usage_code, [&] { app.parse(argc, argv); });
}

int ParseCommandLine(CLI::App& app, const std::string& cmd, std::vector<std::string>& args_reversed,
                     int usage_code) {
  return ParseWith(app, cmd, usage_code, [&] { app.parse(args_reversed); });
}

std::optional<uint64_t> ParseSize(const std::string& text) {
  size_t i = 0;
  uint64_t v = 0;
  if (text.empty() || !isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  while (i < text.size() && isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t d = uint64_t(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
    i++;
  }
  std::string unit = text.substr(i);
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KiB" || unit == "k") {
    shift = 10;
  } else if (unit == "M" || unit == "MiB") {
    shift = 20;
  } else if (unit == "G" || unit == "GiB") {
    shift = 30;
  } else {
    return std::nullopt;
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

std::vector<std::unique_ptr<userspace::UringDevice>> OpenDevices(const std::string& cmd,
                                                                 const std::vector<std::string>& paths,
                                                                 bool read_only) {
  std::vector<std::unique_ptr<userspace::UringDevice>> out;
  for (const std::string& p : paths) {
    userspace::UringOptions o;
    o.read_only = read_only;
    auto r = userspace::UringDevice::Open(p, o);
    if (!r.ok()) {
      std::string why = r.status().Is(ErrorClass::kNotFound) ? "no such file or device"
                        : r.status().Is(ErrorClass::kInvalid)
                            ? "not a regular file or block device, or empty"
                            : r.status().Message();
      PrintError(cmd, p + ": " + why);
      return {};
    }
    out.push_back(std::move(r).value());
  }
  return out;
}

std::vector<BlockDevice*> Raw(const std::vector<std::unique_ptr<userspace::UringDevice>>& devs) {
  std::vector<BlockDevice*> v;
  for (const auto& d : devs) v.push_back(d.get());
  return v;
}

std::string UuidString(const uint8_t uuid[16]) {
  char s[37];
  sb::UuidToString(uuid, s);
  return s;
}

}  // namespace tfs::tools
