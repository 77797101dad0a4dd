// Parsers for tierprobe's specs (see spec.h). Each accepts exactly its grammar and
// rejects trailing junk, negative or non-finite numbers, and unknown names, naming
// the offending piece in the error so a typo in a long command line is easy to find.
#include "workloads/probe/spec.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <initializer_list>

namespace tfs::probe {
namespace {

constexpr std::array<std::string_view, kOpTypes> kOpNames = {
    "read", "write", "fsync", "fdatasync", "stat", "readdir", "openread", "create",
    "createsync"};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A finite, non-negative decimal number, the whole of `s`.
bool ParseNumber(std::string_view s, double* out) {
  s = Trim(s);
  if (s.empty()) return false;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  if (!std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

// Splits "123.5ms" into number and unit suffix.
bool SplitUnit(std::string_view s, double* number, std::string_view* unit) {
  s = Trim(s);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) i++;
  if (i == 0) return false;
  *unit = s.substr(i);
  return ParseNumber(s.substr(0, i), number);
}

}  // namespace

std::string_view OpName(OpType op) { return kOpNames[static_cast<int>(op)]; }

std::optional<OpType> OpFromName(std::string_view name) {
  for (int i = 0; i < kOpTypes; i++) {
    if (kOpNames[i] == name) return static_cast<OpType>(i);
  }
  return std::nullopt;
}

Mix DefaultMix() {
  Mix m{};
  m[int(OpType::kRead)] = 40;
  m[int(OpType::kWrite)] = 20;
  m[int(OpType::kFsync)] = 5;
  m[int(OpType::kFdatasync)] = 5;
  m[int(OpType::kStat)] = 10;
  m[int(OpType::kReaddir)] = 5;
  m[int(OpType::kOpenRead)] = 10;
  m[int(OpType::kCreate)] = 5;
  return m;
}

std::string MixToString(const Mix& mix) {
  std::string out;
  for (int i = 0; i < kOpTypes; i++) {
    if (mix[i] <= 0) continue;
    char num[32];
    std::snprintf(num, sizeof(num), "%g", mix[i]);
    if (!out.empty()) out += ',';
    out += std::string(kOpNames[i]) + "=" + num;
  }
  return out;
}

bool ParseMix(std::string_view text, Mix* mix, std::string* error) {
  Mix m{};
  bool any = false;
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = Trim(rest.substr(0, comma));
    size_t eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos) {
      *error = "bad mix item '" + std::string(item) + "' (want NAME=WEIGHT, e.g. read=50)";
      return false;
    }
    std::string_view name = Trim(item.substr(0, eq));
    auto op = OpFromName(name);
    if (!op) {
      std::string known;
      for (auto n : kOpNames) known += (known.empty() ? "" : " ") + std::string(n);
      *error = "unknown op '" + std::string(name) + "' in mix (known: " + known + ")";
      return false;
    }
    double w = 0;
    if (!ParseNumber(item.substr(eq + 1), &w)) {
      *error = "bad weight in mix item '" + std::string(item) + "'";
      return false;
    }
    m[int(*op)] = w;
    any = any || w > 0;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (!any) {
    *error = "mix '" + std::string(text) + "' has no op with a positive weight";
    return false;
  }
  *mix = m;
  return true;
}

namespace {

struct Unit {
  std::string_view name;
  double scale;
};

// "<number><unit>" with the unit from `units` (the first entry is also the bare
// number's unit); `what` names the quantity in errors, `example` shows the syntax.
bool ParseScaled(std::string_view text, std::initializer_list<Unit> units, const char* what,
                 const char* example, uint64_t* out, std::string* error) {
  double v = 0;
  std::string_view unit;
  if (!SplitUnit(text, &v, &unit)) {
    *error = std::string("bad ") + what + " '" + std::string(text) + "' (e.g. " + example + ")";
    return false;
  }
  double scale = unit.empty() ? units.begin()->scale : 0;
  for (const Unit& u : units) {
    if (u.name == unit) scale = u.scale;
  }
  if (scale == 0) {
    *error = std::string("bad ") + what + " unit in '" + std::string(text) + "' (e.g. " +
             example + ")";
    return false;
  }
  double r = v * scale;
  if (r > 1e18) {
    *error = std::string(what) + " '" + std::string(text) + "' is too large";
    return false;
  }
  *out = static_cast<uint64_t>(std::llround(r));
  return true;
}

// Splits "LEFT:RIGHT" for the option `option`, whose syntax is `want`.
bool SplitColon(std::string_view text, const char* option, const char* want,
                std::string_view* left, std::string_view* right, std::string* error) {
  size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    *error = std::string("bad ") + option + " '" + std::string(text) + "' (want " + want + ")";
    return false;
  }
  *left = text.substr(0, colon);
  *right = text.substr(colon + 1);
  return true;
}

}  // namespace

bool ParseDuration(std::string_view text, uint64_t* ns, std::string* error) {
  return ParseScaled(text, {{"s", 1e9}, {"ms", 1e6}, {"us", 1e3}, {"ns", 1}, {"min", 60e9}},
                     "duration", "10s, 250ms, 40us, 2min", ns, error);
}

bool ParseSize(std::string_view text, uint64_t* bytes, std::string* error) {
  return ParseScaled(text,
                     {{"B", 1}, {"K", 1024.0}, {"k", 1024.0}, {"KiB", 1024.0},
                      {"M", 1024.0 * 1024}, {"MiB", 1024.0 * 1024},
                      {"G", 1024.0 * 1024 * 1024}, {"GiB", 1024.0 * 1024 * 1024}},
                     "size", "4096, 64K, 64M, 1G", bytes, error);
}

bool ParseInjectDelay(std::string_view text, InjectDelay* out, std::string* error) {
  std::string_view delay, fraction;
  InjectDelay d;
  // An optional third field names the one op to delay.
  const size_t last = text.rfind(':');
  if (last != std::string_view::npos && text.find(':') != last) {
    std::string_view name = text.substr(last + 1);
    d.op = OpFromName(name);
    if (!d.op) {
      *error = "unknown op '" + std::string(name) + "' in --inject-delay '" + std::string(text) + "'";
      return false;
    }
    text = text.substr(0, last);
  }
  if (!SplitColon(text, "--inject-delay", "DELAY:FRACTION[:OP], e.g. 2ms:0.01", &delay, &fraction,
                  error)) {
    return false;
  }
  if (!ParseDuration(delay, &d.delay_ns, error)) return false;
  if (!ParseNumber(fraction, &d.fraction) || d.fraction > 1) {
    *error = "bad fraction in --inject-delay '" + std::string(text) + "' (want 0..1)";
    return false;
  }
  *out = d;
  return true;
}

bool ParseInjectStall(std::string_view text, InjectStall* out, std::string* error) {
  std::string_view at, length;
  if (!SplitColon(text, "--inject-stall", "AT:LENGTH, e.g. 5s:1s", &at, &length, error)) {
    return false;
  }
  InjectStall s;
  if (!ParseDuration(at, &s.at_ns, error) || !ParseDuration(length, &s.length_ns, error)) {
    return false;
  }
  *out = s;
  return true;
}

bool ParseArrivals(std::string_view text, Arrivals* out, std::string* error) {
  if (text == "constant") *out = Arrivals::kConstant;
  else if (text == "poisson") *out = Arrivals::kPoisson;
  else {
    *error = "bad schedule '" + std::string(text) + "' (constant or poisson)";
    return false;
  }
  return true;
}

bool Validate(const ProbeSpec& spec, std::string* error) {
  if (!(spec.rate > 0) || !std::isfinite(spec.rate) || spec.rate > 10e6) {
    *error = "--rate must be between 0 and 10,000,000 ops/s";
    return false;
  }
  if (spec.duration_ns < 1'000'000) {
    *error = "--duration must be at least 1ms";
    return false;
  }
  if (spec.threads < 1 || spec.threads > 256) {
    *error = "--threads must be between 1 and 256";
    return false;
  }
  if (spec.working_set < 4096) {
    *error = "--working-set must be at least 4K";
    return false;
  }
  if (spec.small_files < 1 || spec.dir_entries < 1) {
    *error = "--files and --dir-entries must be at least 1";
    return false;
  }
  if (spec.inject_delay && spec.inject_delay->op && !(spec.mix[size_t(*spec.inject_delay->op)] > 0)) {
    *error = "--inject-delay names op '" + std::string(OpName(*spec.inject_delay->op)) + "', which --mix does not run";
    return false;
  }
  return true;
}

}  // namespace tfs::probe
