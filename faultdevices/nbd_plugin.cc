// nbdkit-faultdev-plugin: a fault device exported over NBD by nbdkit.
//
// The plugin is a thin C-ABI shell around the same FaultDevice the in-process
// wrapper uses: nbdkit's worker threads (thread model PARALLEL) each submit one
// request and wait for its completion, so the device sees as many requests in
// flight as the clients send (nbdkit's --threads bounds it). Errors reach the
// client as the errno of the injected Status (EIO for EIO and timeouts).
//
//   nbdkit --unix SOCK nbdkit-faultdev-plugin.so profile=FILE image=IMG
//          [seed=N] [control=CTLSOCK] [stats=FILE] [set=section.key=value ...]
//
// The device and its control socket are created in after_fork (threads do not
// survive nbdkit's daemonising fork). On cleanup the device drains, unflushed
// cached writes are saved beside the image (IMG.faultdev-cache, for `faultdev
// powercut`) and the stats are written. Requests not aligned to the 512-byte
// block size are served by read-modify-write.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "faultdevices/cache.h"
#include "faultdevices/control.h"
#include "faultdevices/device.h"
#include "faultdevices/profile.h"
#include "platform/block_device.h"  // SyncIo

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

namespace faultdev {
namespace {

struct PluginState {
  std::string profile_path, image, control, stats;
  std::vector<std::string> sets;
  std::optional<uint64_t> seed;
  Profile profile;
  std::unique_ptr<FaultDevice> dev;
  ControlServer control_server;
};

PluginState* g = nullptr;  // created in load, destroyed in unload

void Load() { g = new PluginState; }
void Unload() {
  delete g;
  g = nullptr;
}

int Config(const char* key, const char* value) {
  std::string k(key);
  if (k == "profile") {
    g->profile_path = value;
  } else if (k == "image") {
    g->image = value;
  } else if (k == "control") {
    g->control = value;
  } else if (k == "stats") {
    g->stats = value;
  } else if (k == "set") {
    g->sets.push_back(value);
  } else if (k == "seed") {
    uint64_t s;
    if (nbdkit_parse_uint64_t("seed", value, &s) == -1) return -1;
    g->seed = s;
  } else {
    nbdkit_error("faultdev: unknown parameter '%s' (profile, image, seed, control, stats, set)", key);
    return -1;
  }
  return 0;
}

int ConfigComplete() {
  if (g->profile_path.empty() || g->image.empty()) {
    nbdkit_error("faultdev: profile=FILE and image=IMG are required");
    return -1;
  }
  std::string path = FindProfile(g->profile_path);
  if (path.empty()) {
    nbdkit_error("faultdev: profile '%s' not found", g->profile_path.c_str());
    return -1;
  }
  std::string error;
  std::optional<Profile> p = LoadProfile(path, g->sets, &error);
  if (!p) {
    nbdkit_error("faultdev: %s", error.c_str());
    return -1;
  }
  if (g->seed) p->seed = *g->seed;
  g->profile = *p;
  return 0;
}

int AfterFork() {
  std::string error;
  g->dev = OpenFile(g->profile, g->image, /*direct=*/false, &error);
  if (!g->dev) {
    nbdkit_error("faultdev: %s", error.c_str());
    return -1;
  }
  if (!g->control.empty() && !g->control_server.Start(g->dev.get(), g->control, &error)) {
    nbdkit_error("faultdev: %s", error.c_str());
    return -1;
  }
  nbdkit_debug("faultdev: profile %s seed %llu", g->profile.name.c_str(), (unsigned long long)g->profile.seed);
  return 0;
}

void Cleanup() {
  if (!g->dev) return;
  g->control_server.Stop();
  g->dev->Drain();
  std::string error;
  if (!g->dev->SaveCacheRecords(RecordPath(g->image), &error)) nbdkit_error("faultdev: %s", error.c_str());
  if (!g->stats.empty()) {
    std::ofstream out(g->stats);
    out << g->dev->Stats().ToJson() << "\n";
  }
  g->dev.reset();
}

void* Open(int) { return g; }

int64_t GetSize(void*) { return int64_t(g->dev->Size()); }
int CanWrite(void*) { return 1; }
int CanFlush(void*) { return 1; }
int CanFua(void*) { return NBDKIT_FUA_NATIVE; }
int CanTrim(void*) { return g->dev->Info().supports_discard ? 1 : 0; }
int CanMultiConn(void*) { return 1; }  // one device behind every connection
int IsRotational(void*) { return g->profile.hdd ? 1 : 0; }
int BlockSize(void*, uint32_t* minimum, uint32_t* preferred, uint32_t* maximum) {
  *minimum = g->dev->LogicalBlockSize();
  *preferred = 4096;
  *maximum = 32 << 20;
  return 0;
}

// One synchronous request; -1 with nbdkit's error set on failure. NBD carries no
// origin tag, so requests count as "other".
int DoIo(tfs::IoOp op, void* buf, uint64_t len, uint64_t off, uint8_t flags) {
  tfs::Status st = tfs::SyncIo(*g->dev, op, off, buf, len, flags);
  if (st.ok()) return 0;
  nbdkit_set_error(-st.ToErrno());
  return -1;
}

// Aligned span covering [off, off + len).
void Span(uint64_t off, uint64_t len, uint64_t* a_off, uint64_t* a_len) {
  uint64_t lbs = g->dev->LogicalBlockSize();
  *a_off = off / lbs * lbs;
  *a_len = (off + len + lbs - 1) / lbs * lbs - *a_off;
}

int PRead(void*, void* buf, uint32_t count, uint64_t offset, uint32_t) {
  uint64_t a_off, a_len;
  Span(offset, count, &a_off, &a_len);
  if (a_off == offset && a_len == count) return DoIo(tfs::IoOp::kRead, buf, count, offset, 0);
  std::vector<uint8_t> tmp(a_len);
  if (DoIo(tfs::IoOp::kRead, tmp.data(), a_len, a_off, 0) != 0) return -1;
  memcpy(buf, tmp.data() + (offset - a_off), count);
  return 0;
}

int PWrite(void*, const void* buf, uint32_t count, uint64_t offset, uint32_t flags) {
  uint8_t f = (flags & NBDKIT_FLAG_FUA) ? tfs::IoRequest::kFua : 0;
  uint64_t a_off, a_len;
  Span(offset, count, &a_off, &a_len);
  if (a_off == offset && a_len == count) return DoIo(tfs::IoOp::kWrite, const_cast<void*>(buf), count, offset, f);
  std::vector<uint8_t> tmp(a_len);
  if (DoIo(tfs::IoOp::kRead, tmp.data(), a_len, a_off, 0) != 0) return -1;
  memcpy(tmp.data() + (offset - a_off), buf, count);
  return DoIo(tfs::IoOp::kWrite, tmp.data(), a_len, a_off, f);
}

int Flush(void*, uint32_t) { return DoIo(tfs::IoOp::kFlush, nullptr, 0, 0, 0); }

int Trim(void*, uint32_t count, uint64_t offset, uint32_t) {
  uint64_t lbs = g->dev->LogicalBlockSize();
  uint64_t start = (offset + lbs - 1) / lbs * lbs, end = (offset + count) / lbs * lbs;
  if (end <= start) return 0;  // trim is advisory: an unaligned sliver is a no-op
  return DoIo(tfs::IoOp::kDiscard, nullptr, end - start, start, 0);
}

nbdkit_plugin MakePlugin() {
  nbdkit_plugin p{};
  p.name = "faultdev";
  p.longname = "tierfs fault device";
  p.version = "1";
  p.description = "fault-injecting device models over a backing image";
  p.load = Load;
  p.unload = Unload;
  p.config = Config;
  p.config_complete = ConfigComplete;
  p.config_help =
      "profile=FILE      (required) profile TOML file\n"
      "image=IMG         (required) backing image\n"
      "seed=N            seed (overrides the profile's)\n"
      "control=PATH      control socket (stall, powercut, poweron, clear-errors, stats)\n"
      "stats=FILE        write stats JSON on exit\n"
      "set=SECTION.KEY=V override a profile key (repeatable)";
  p.after_fork = AfterFork;
  p.cleanup = Cleanup;
  p.open = Open;
  p.get_size = GetSize;
  p.can_write = CanWrite;
  p.can_flush = CanFlush;
  p.can_fua = CanFua;
  p.can_trim = CanTrim;
  p.can_multi_conn = CanMultiConn;
  p.is_rotational = IsRotational;
  p.block_size = BlockSize;
  p.pread = PRead;
  p.pwrite = PWrite;
  p.flush = Flush;
  p.trim = Trim;
  p.errno_is_preserved = 0;
  return p;
}

}  // namespace
}  // namespace faultdev

static nbdkit_plugin plugin = faultdev::MakePlugin();
NBDKIT_REGISTER_PLUGIN(plugin)
