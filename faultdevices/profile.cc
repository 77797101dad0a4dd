// Profile loading with toml++ (Debian's libtomlplusplus). The schema is strict: an
// unknown section or key is an error, not silently ignored, because a misspelt
// "duraton_s" that quietly falls back to 30 s wastes an afternoon. Every check names
// the node's own source (file or override) and line, so the message points at the
// exact place to fix. Units are part of key names (_ms, _us, _s, _mb_s); sizes are
// integers (bytes) or strings with a unit ("64MiB", "20GB").
//
// toml++ reports syntax errors by exception; they are caught here and turned into
// the same one-line form. Nothing else in faultdevices uses exceptions.
#include "faultdevices/profile.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#ifndef FAULTDEV_PROFILE_DIR
#error FAULTDEV_PROFILE_DIR must be defined by the build
#endif

namespace faultdev {
namespace {

using Origins = std::map<const toml::node*, std::string>;

class Parser {
 public:
  Parser(std::string* error, const Origins* origins) : error_(error), origins_(origins) {}
  bool failed() const { return failed_; }

  bool Fail(const toml::node& node, const std::string& key, const std::string& what) {
    if (failed_) return false;
    failed_ = true;
    const toml::source_region& src = node.source();
    std::string where = src.path ? *src.path : std::string("<profile>");
    // (append, not ":" + to_string(): GCC 12's -O2 -Wrestrict misreads that form)
    if (src.begin.line != 0) where.append(":").append(std::to_string(src.begin.line));
    if (auto it = origins_->find(&node); it != origins_->end()) where = it->second;
    *error_ = where + ": " + key + ": " + what;
    return false;
  }

  // Rejects keys of `table` not in `known`.
  bool OnlyKeys(const toml::table& table, const std::string& section, const std::set<std::string>& known) {
    for (const auto& [k, v] : table) {
      std::string key(k.str());
      if (!known.count(key)) {
        return Fail(v, Qualify(section, key),
                    "unknown key" + std::string(section.empty() ? " or section" : ""));
      }
    }
    return true;
  }

  static std::string Qualify(const std::string& section, const std::string& key) {
    return section.empty() ? key : section + "." + key;
  }

  bool Number(const toml::table& t, const std::string& section, const char* key, double* out,
              double min, double max) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::optional<double> v = n->value<double>();  // accepts integers too
    if (!v || !std::isfinite(*v)) return Fail(*n, Qualify(section, key), "must be a number");
    if (*v < min || *v > max) {
      std::ostringstream os;
      os << "must be between " << min << " and " << max << ", got " << *v;
      return Fail(*n, Qualify(section, key), os.str());
    }
    *out = *v;
    return true;
  }

  // A duration in the unit `scale` ns (1e6 for _ms keys ...), >= 0.
  bool Duration(const toml::table& t, const std::string& section, const char* key, double scale,
                uint64_t* out) {
    double v = double(*out) / scale;
    const double kMaxNs = 1e15;  // ~11 days
    if (!Number(t, section, key, &v, 0, kMaxNs / scale)) return false;
    *out = uint64_t(std::llround(v * scale));
    return true;
  }
  bool OptDuration(const toml::table& t, const std::string& section, const char* key, double scale,
                   std::optional<uint64_t>* out) {
    if (t.get(key) == nullptr) return true;
    uint64_t v = 0;
    if (!Duration(t, section, key, scale, &v)) return false;
    *out = v;
    return true;
  }

  bool Integer(const toml::table& t, const std::string& section, const char* key, uint64_t* out,
               uint64_t min, uint64_t max) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::optional<int64_t> v = n->value_exact<int64_t>();
    if (!v) return Fail(*n, Qualify(section, key), "must be an integer");
    if (*v < 0 || uint64_t(*v) < min || uint64_t(*v) > max) {
      return Fail(*n, Qualify(section, key),
                  "must be between " + std::to_string(min) + " and " + std::to_string(max) +
                      ", got " + std::to_string(*v));
    }
    *out = uint64_t(*v);
    return true;
  }

  bool Bool(const toml::table& t, const std::string& section, const char* key, bool* out) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::optional<bool> v = n->value_exact<bool>();
    if (!v) return Fail(*n, Qualify(section, key), "must be true or false");
    *out = *v;
    return true;
  }

  bool String(const toml::table& t, const std::string& section, const char* key, std::string* out) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::optional<std::string> v = n->value_exact<std::string>();
    if (!v) return Fail(*n, Qualify(section, key), "must be a string");
    *out = *v;
    return true;
  }

  bool Choice(const toml::table& t, const std::string& section, const char* key,
              const std::vector<std::string>& choices, int* out) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::optional<std::string> v = n->value_exact<std::string>();
    std::string list;
    for (size_t i = 0; i < choices.size(); i++) {
      if (v && *v == choices[i]) {
        *out = int(i);
        return true;
      }
      list += (i ? ", " : "") + choices[i];
    }
    return Fail(*n, Qualify(section, key), "must be one of " + list);
  }

  // Integer bytes or a string "<number><unit>" (K/KiB/M/MiB/G/GiB/T/TiB, KB/MB/GB/TB).
  bool Size(const toml::table& t, const std::string& section, const char* key, uint64_t* out,
            uint64_t min = 0) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return true;
    std::string name = Qualify(section, key);
    uint64_t bytes = 0;
    if (std::optional<int64_t> iv = n->value_exact<int64_t>()) {
      if (*iv < 0) return Fail(*n, name, "must not be negative");
      bytes = uint64_t(*iv);
    } else if (std::optional<std::string> sv = n->value_exact<std::string>()) {
      std::optional<uint64_t> v = ParseSize(*sv);
      if (!v) return Fail(*n, name, "must be bytes or a size like \"64MiB\", got \"" + *sv + "\"");
      bytes = *v;
    } else {
      return Fail(*n, name, "must be bytes or a size like \"64MiB\"");
    }
    if (bytes < min) return Fail(*n, name, "must be at least " + std::to_string(min) + " bytes");
    *out = bytes;
    return true;
  }

  const toml::table* Section(const toml::table& root, const char* name) {
    const toml::node* n = root.get(name);
    if (n == nullptr) return nullptr;
    if (!n->is_table()) {
      Fail(*n, name, "must be a table ([" + std::string(name) + "])");
      return nullptr;
    }
    return n->as_table();
  }

 private:
  std::string* error_;
  const Origins* origins_;
  bool failed_ = false;
};

// The key's node if present (for its line number), else the table.
const toml::node& NodeOr(const toml::table& t, const char* key) {
  const toml::node* n = t.get(key);
  return n != nullptr ? *n : t;
}

const char* kOpKeys[4] = {"read", "write", "flush", "discard"};

bool ParseDelay(Parser& p, const toml::table& t, DelayModel* d) {
  std::set<std::string> known = {"all_ms", "jitter", "jitter_ms"};
  for (const char* op : kOpKeys) {
    known.insert(std::string(op) + "_ms");
    known.insert(std::string(op) + "_jitter_ms");
  }
  if (!p.OnlyKeys(t, "delay", known)) return false;
  uint64_t all = 0, all_jitter = 0;
  if (!p.Duration(t, "delay", "all_ms", 1e6, &all)) return false;
  if (!p.Duration(t, "delay", "jitter_ms", 1e6, &all_jitter)) return false;
  for (int i = 0; i < 4; i++) {
    d->base_ns[i] = all;
    d->jitter_ns[i] = all_jitter;
    std::string k = std::string(kOpKeys[i]) + "_ms";
    std::string kj = std::string(kOpKeys[i]) + "_jitter_ms";
    if (!p.Duration(t, "delay", k.c_str(), 1e6, &d->base_ns[i])) return false;
    if (!p.Duration(t, "delay", kj.c_str(), 1e6, &d->jitter_ns[i])) return false;
  }
  int j = 0;
  if (!p.Choice(t, "delay", "jitter", {"none", "uniform", "exponential"}, &j)) return false;
  d->jitter = Jitter(j);
  return true;
}

bool ParseHdd(Parser& p, const toml::table& t, HddModel* h) {
  if (!p.OnlyKeys(t, "hdd",
                  {"rpm", "track_to_track_ms", "average_seek_ms", "full_stroke_ms", "outer_mb_s",
                   "inner_mb_s", "command_overhead_us", "ncq_depth", "max_queue_wait_ms",
                   "write_cache", "interface_mb_s"}))
    return false;
  uint64_t ncq = h->ncq_depth;
  bool ok = p.Number(t, "hdd", "rpm", &h->rpm, 1000, 20000) &&
            p.Duration(t, "hdd", "track_to_track_ms", 1e6, &h->track_to_track_ns) &&
            p.Duration(t, "hdd", "average_seek_ms", 1e6, &h->average_seek_ns) &&
            p.Duration(t, "hdd", "full_stroke_ms", 1e6, &h->full_stroke_seek_ns) &&
            p.Number(t, "hdd", "outer_mb_s", &h->outer_mb_s, 1, 10000) &&
            p.Number(t, "hdd", "inner_mb_s", &h->inner_mb_s, 1, 10000) &&
            p.Duration(t, "hdd", "command_overhead_us", 1e3, &h->command_overhead_ns) &&
            p.Integer(t, "hdd", "ncq_depth", &ncq, 1, 256) &&
            p.Duration(t, "hdd", "max_queue_wait_ms", 1e6, &h->max_queue_wait_ns) &&
            p.Size(t, "hdd", "write_cache", &h->write_cache_bytes) &&
            p.Number(t, "hdd", "interface_mb_s", &h->interface_mb_s, 1, 100000);
  if (!ok) return false;
  h->ncq_depth = uint32_t(ncq);
  // The seek curve t2t + a*sqrt(f) + b*f must rise: t2t <= average <= full stroke,
  // and the fitted curve's slope at full stroke positive (see drive.cc).
  if (!(h->track_to_track_ns <= h->average_seek_ns && h->average_seek_ns <= h->full_stroke_seek_ns)) {
    return p.Fail(NodeOr(t, "average_seek_ms"), "hdd.average_seek_ms",
                  "need track_to_track_ms <= average_seek_ms <= full_stroke_ms");
  }
  return true;
}

bool ParseSmr(Parser& p, const toml::table& t, SmrModel* s) {
  if (!p.OnlyKeys(t, "smr", {"media_cache", "media_cache_percent", "band", "high_water", "idle_clean_after_ms", "clean_overhead_ms"}))
    return false;
  bool ok = p.Size(t, "smr", "media_cache", &s->media_cache_bytes, 1 << 20) &&
            p.Number(t, "smr", "media_cache_percent", &s->media_cache_percent, 0.01, 50) &&
            p.Size(t, "smr", "band", &s->band_bytes, 64 << 10) &&
            p.Number(t, "smr", "high_water", &s->high_water, 0.05, 1.0) &&
            p.Duration(t, "smr", "idle_clean_after_ms", 1e6, &s->idle_clean_after_ns) &&
            p.Duration(t, "smr", "clean_overhead_ms", 1e6, &s->clean_overhead_ns);
  if (!ok) return false;
  if ((t.get("media_cache") == nullptr) == (t.get("media_cache_percent") == nullptr))
    return p.Fail(t, "smr.media_cache", "give exactly one of media_cache and media_cache_percent");
  return true;
}

bool ParseStall(Parser& p, const toml::table& t, StallModel* s) {
  if (!p.OnlyKeys(t, "stall", {"period_s", "duration_s", "offset_s", "scripted"})) return false;
  bool ok = p.Duration(t, "stall", "period_s", 1e9, &s->period_ns) &&
            p.Duration(t, "stall", "duration_s", 1e9, &s->duration_ns) &&
            p.Duration(t, "stall", "offset_s", 1e9, &s->offset_ns);
  if (!ok) return false;
  if (s->period_ns != 0 && s->duration_ns >= s->period_ns) {
    return p.Fail(NodeOr(t, "duration_s"), "stall.duration_s",
                  "must be shorter than stall.period_s");
  }
  if (const toml::node* n = t.get("scripted")) {
    const toml::array* arr = n->as_array();
    if (arr == nullptr) return p.Fail(*n, "stall.scripted", "must be an array of [at_s, duration_s] pairs");
    for (const toml::node& e : *arr) {
      const toml::array* pair = e.as_array();
      std::optional<double> at, dur;
      if (pair != nullptr && pair->size() == 2) {
        at = (*pair)[0].value<double>();
        dur = (*pair)[1].value<double>();
      }
      if (!at || !dur || *at < 0 || *dur < 0 || *at > 1e6 || *dur > 1e6)
        return p.Fail(e, "stall.scripted", "each entry must be [at_s, duration_s], non-negative seconds");
      s->scripted.push_back({uint64_t(*at * 1e9), uint64_t(*dur * 1e9)});
    }
  }
  return true;
}

bool ParseTimeout(Parser& p, const toml::table& t, TimeoutModel* m) {
  if (!p.OnlyKeys(t, "timeout", {"after_requests", "offset", "at_s", "duration_s", "link_reset", "count"}))
    return false;
  uint64_t count = m->count;
  uint64_t offset = 0;
  bool ok = p.Integer(t, "timeout", "after_requests", &m->after_requests, 1, UINT64_MAX >> 1) &&
            p.Size(t, "timeout", "offset", &offset) &&
            p.OptDuration(t, "timeout", "at_s", 1e9, &m->at_ns) &&
            p.Duration(t, "timeout", "duration_s", 1e9, &m->duration_ns) &&
            p.Bool(t, "timeout", "link_reset", &m->link_reset) &&
            p.Integer(t, "timeout", "count", &count, 1, 1 << 30);
  if (!ok) return false;
  if (t.get("offset") != nullptr) m->offset = offset;
  m->count = uint32_t(count);
  int triggers = (m->after_requests != 0) + m->offset.has_value() + m->at_ns.has_value();
  if (triggers != 1) {
    return p.Fail(t, "timeout", "needs exactly one of after_requests, offset, at_s");
  }
  m->enabled = true;
  return true;
}

bool ParseErrors(Parser& p, const toml::node& n, std::vector<ErrorRange>* out) {
  const toml::array* arr = n.as_array();
  if (arr == nullptr || !arr->is_array_of_tables())
    return p.Fail(n, "errors", "must be an array of tables ([[errors]])");
  for (const toml::node& e : *arr) {
    const toml::table& t = *e.as_table();
    if (!p.OnlyKeys(t, "errors", {"offset", "length", "ops", "mode", "rate"})) return false;
    ErrorRange r;
    int ops = 0, mode = 0;
    bool ok = p.Size(t, "errors", "offset", &r.offset) && p.Size(t, "errors", "length", &r.length, 1) &&
              p.Choice(t, "errors", "ops", {"read", "write", "both"}, &ops) &&
              p.Choice(t, "errors", "mode", {"persistent", "once", "rate"}, &mode) &&
              p.Number(t, "errors", "rate", &r.rate, 0, 1);
    if (!ok) return false;
    if (t.get("length") == nullptr) return p.Fail(t, "errors.length", "is required");
    r.reads = ops != 1;
    r.writes = ops != 0;
    r.mode = ErrorMode(mode);
    if (r.mode == ErrorMode::kRate && t.get("rate") == nullptr)
      return p.Fail(t, "errors.rate", "is required with mode = \"rate\"");
    out->push_back(r);
  }
  return true;
}

bool ParseCache(Parser& p, const toml::table& t, CacheModel* c) {
  if (!p.OnlyKeys(t, "cache",
                  {"size", "keep", "drop", "tear", "powercut_at_s", "powercut_after_writes", "powercut_at_flush",
                   "powercut_origin", "ignore_flushes"}))
    return false;
  std::string origin;
  bool ok = p.Size(t, "cache", "size", &c->size_bytes, 4096) && p.Number(t, "cache", "keep", &c->keep, 0, 1) &&
            p.Number(t, "cache", "drop", &c->drop, 0, 1) && p.Number(t, "cache", "tear", &c->tear, 0, 1) &&
            p.OptDuration(t, "cache", "powercut_at_s", 1e9, &c->powercut_at_ns) &&
            p.Integer(t, "cache", "powercut_after_writes", &c->powercut_after_writes, 0, UINT64_MAX >> 1) &&
            p.Integer(t, "cache", "powercut_at_flush", &c->powercut_at_flush, 0, UINT64_MAX >> 1) &&
            p.String(t, "cache", "powercut_origin", &origin) &&
            p.Bool(t, "cache", "ignore_flushes", &c->ignore_flushes);
  if (!ok) return false;
  if (const toml::node* n = t.get("powercut_origin")) {
    tfs::Result<tfs::IoOrigin> o = tfs::IoOriginFromName(origin.c_str());
    if (!o.ok()) {
      std::string names;
      for (int i = 0; i < tfs::kIoOriginCount; i++)
        names += (i ? ", " : "") + std::string(tfs::IoOriginName(tfs::IoOrigin(i)));
      return p.Fail(*n, "cache.powercut_origin", "must be one of " + names);
    }
    c->powercut_origin = *o;
  }
  double sum = c->keep + c->drop + c->tear;
  if (sum < 1e-9) return p.Fail(t, "cache.keep", "keep + drop + tear must be positive");
  c->keep /= sum;
  c->drop /= sum;
  c->tear /= sum;
  c->enabled = true;
  return true;
}

// Where override values came from: toml++ does not keep a node's source when the
// node is copied into another table, so merged-in nodes are labelled here.

void Label(const toml::node& n, const std::string& origin, Origins* origins) {
  (*origins)[&n] = origin;
  if (const toml::table* t = n.as_table()) {
    for (const auto& [k, v] : *t) Label(v, origin, origins);
  } else if (const toml::array* a = n.as_array()) {
    for (const toml::node& e : *a) Label(e, origin, origins);
  }
}

// Copies every value of `src` over `dst`, descending into tables. With `origins`,
// the copied nodes are labelled with `origin`.
void Merge(toml::table& dst, const toml::table& src, const std::string& origin = "", Origins* origins = nullptr) {
  for (const auto& [k, v] : src) {
    toml::node* existing = dst.get(k);
    if (v.is_table() && existing != nullptr && existing->is_table()) {
      Merge(*existing->as_table(), *v.as_table(), origin, origins);
    } else {
      auto it = dst.insert_or_assign(k, v).first;
      if (origins != nullptr) Label(it->second, origin, origins);
    }
  }
}

std::optional<Profile> FromTable(Parser& p, const toml::table& root, const std::string& name) {
  Profile prof;
  prof.name = name;
  if (!p.OnlyKeys(root, "", {"name", "description", "seed", "delay", "hdd", "smr", "bandwidth", "queue",
                             "stall", "timeout", "errors", "cache"}))
    return std::nullopt;
  p.String(root, "", "name", &prof.name);
  p.String(root, "", "description", &prof.description);
  p.Integer(root, "", "seed", &prof.seed, 0, UINT64_MAX >> 1);
  if (const toml::table* t = p.Section(root, "delay")) {
    prof.delay.emplace();
    ParseDelay(p, *t, &*prof.delay);
  }
  if (const toml::table* t = p.Section(root, "hdd")) {
    prof.hdd.emplace();
    ParseHdd(p, *t, &*prof.hdd);
  }
  if (const toml::table* t = p.Section(root, "smr")) {
    prof.smr.emplace();
    if (ParseSmr(p, *t, &*prof.smr) && !prof.hdd) p.Fail(*root.get("smr"), "smr", "needs an [hdd] section");
  }
  if (const toml::table* t = p.Section(root, "bandwidth")) {
    if (p.OnlyKeys(*t, "bandwidth", {"mb_s"}) && p.Number(*t, "bandwidth", "mb_s", &prof.bandwidth.mb_s, 0, 1e6) &&
        prof.bandwidth.mb_s > 0 && prof.bandwidth.mb_s < 0.001) {
      // A transfer time of length / mb_s must fit in 64-bit nanoseconds.
      p.Fail(*t->get("mb_s"), "bandwidth.mb_s", "must be 0 (unlimited) or at least 0.001");
    }
  }
  if (const toml::table* t = p.Section(root, "queue")) {
    uint64_t slots = 0;
    if (p.OnlyKeys(*t, "queue", {"max_in_flight"}) &&
        p.Integer(*t, "queue", "max_in_flight", &slots, 0, 1 << 20))
      prof.queue.max_in_flight = uint32_t(slots);
  }
  if (const toml::table* t = p.Section(root, "stall")) ParseStall(p, *t, &prof.stall);
  if (const toml::table* t = p.Section(root, "timeout")) ParseTimeout(p, *t, &prof.timeout);
  if (const toml::node* n = root.get("errors")) ParseErrors(p, *n, &prof.errors);
  if (const toml::table* t = p.Section(root, "cache")) ParseCache(p, *t, &prof.cache);
  if (p.failed()) return std::nullopt;
  return prof;
}

std::optional<toml::table> ParseText(const std::string& text, const std::string& origin, std::string* error) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const toml::source_region& src = e.source();
    std::string where = origin;
    if (src.begin.line != 0) where += ":" + std::to_string(src.begin.line);
    std::string what(e.description());
    *error = where + ": syntax: " + what;
    return std::nullopt;
  }
}

// Copies the values of `src` that `dst` lacks, descending into tables.
void MergeMissing(toml::table& dst, const toml::table& src, const std::string& origin, Origins* origins) {
  for (const auto& [k, v] : src) {
    toml::node* existing = dst.get(k);
    if (existing == nullptr) {
      auto it = dst.insert(k, v).first;
      Label(it->second, origin, origins);
    } else if (v.is_table() && existing->is_table()) {
      MergeMissing(*existing->as_table(), *v.as_table(), origin, origins);
    }
  }
}

std::string StemOf(const std::string& path) { return std::filesystem::path(path).stem().string(); }

// Resolves `base = "NAME"`: NAME.toml beside the file, else in the profile
// directory. The base's values come first; the file's own override them.
std::optional<toml::table> WithBases(toml::table root, const std::string& origin, int depth, std::string* error,
                                     Origins* origins) {
  const toml::node* n = root.get("base");
  if (n == nullptr) return root;
  std::optional<std::string> name = n->value_exact<std::string>();
  std::string where = origin + ":" + std::to_string(n->source().begin.line);
  if (!name || name->empty()) {
    *error = where + ": base: must be a profile name";
    return std::nullopt;
  }
  if (depth > 8) {
    *error = where + ": base: profiles inherit more than 8 levels deep (a cycle?)";
    return std::nullopt;
  }
  std::string beside = (std::filesystem::path(origin).parent_path() / (*name + ".toml")).string();
  std::error_code ec;
  std::string path = std::filesystem::is_regular_file(beside, ec) ? beside : FindProfile(*name);
  if (path.empty()) {
    *error = where + ": base: no profile named '" + *name + "'";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::optional<toml::table> base = ParseText(ss.str(), path, error);
  if (!base) return std::nullopt;
  base = WithBases(std::move(*base), path, depth + 1, error, origins);
  if (!base) return std::nullopt;
  root.erase("base");
  base->erase("name");
  base->erase("description");
  // The file's own nodes stay where they are (keeping their lines); what only the
  // base has is copied in and labelled with the base's path.
  MergeMissing(root, *base, path, origins);
  return root;
}

}  // namespace

std::optional<Profile> ParseProfile(const std::string& text, const std::string& origin,
                                    const std::vector<std::string>& overrides, std::string* error) {
  std::optional<toml::table> root = ParseText(text, origin, error);
  if (!root) return std::nullopt;
  Origins origins;
  root = WithBases(std::move(*root), origin, 0, error, &origins);
  if (!root) return std::nullopt;
  for (const std::string& o : overrides) {
    std::string src = "--set '" + o + "'";
    if (o.find('=') == std::string::npos) {
      *error = src + ": expected section.key=value";
      return std::nullopt;
    }
    std::optional<toml::table> t = ParseText(o, src, error);
    if (!t) {
      // A bare word that is not TOML (band=8MiB) is meant as a string.
      size_t eq = o.find('=');
      std::string value = o.substr(eq + 1);
      if (value.find_first_of("\"'\\") == std::string::npos) {
        std::string ignored;
        t = ParseText(o.substr(0, eq) + "=\"" + value + "\"", src, &ignored);
      }
      if (!t) return std::nullopt;
    }
    Merge(*root, *t, src + ":1", &origins);
  }
  Parser p(error, &origins);
  return FromTable(p, *root, StemOf(origin));
}

std::optional<Profile> LoadProfile(const std::string& path, const std::vector<std::string>& overrides,
                                   std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open profile";
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseProfile(ss.str(), path, overrides, error);
}

std::string ProfileDir() { return FAULTDEV_PROFILE_DIR; }

std::optional<uint64_t> ParseSize(const std::string& text) {
  char* end = nullptr;
  double num = std::strtod(text.c_str(), &end);
  std::string unit(end);
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},           {"B", 1},           {"K", 1024.0},      {"KiB", 1024.0},           {"M", 1 << 20},
      {"MiB", 1 << 20},  {"G", 1 << 30},     {"GiB", 1 << 30},   {"T", 1099511627776.0},    {"TiB", 1099511627776.0},
      {"KB", 1e3},       {"MB", 1e6},        {"GB", 1e9},        {"TB", 1e12}};
  for (const auto& [u, scale] : kUnits) {
    if (unit != u) continue;
    if (end == text.c_str() || !std::isfinite(num) || num < 0 || num * scale > 1.8e19) return std::nullopt;
    return uint64_t(num * scale);
  }
  return std::nullopt;
}

std::string FindProfile(const std::string& name_or_path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return name_or_path;
  if (name_or_path.find('/') == std::string::npos) {
    std::string p = ProfileDir() + "/" + name_or_path + ".toml";
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return "";
}

}  // namespace faultdev
