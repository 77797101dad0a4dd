// tierfs bench mount: how long a mount takes as the data grows
// (docs/design/copies.md, "Mount"; docs/benchmarks.md, "Mount time").
//
// For each --sizes value it formats an image file in --dir (io_uring,
// O_DIRECT when the file system allows it), fills it with files of the
// --file-sizes (the same number of bytes of each size), unmounts cleanly,
// and then times --mounts mounts of the clean image and --mounts of an
// image a cut left dirty (a burst of small overwrites and a directory
// fsync, then every later I/O failed: what a power cut leaves, so the
// mount replays the journal). Each mount is timed by stage -- the store's
// open (superblocks, replay, the alloc btree's load), the data path's open
// (until step 3b-5b: the walk of every extent) and posix's mount -- with
// the nodes each stage read (btree.node_reads), then closed. Medians per
// stage go to stdout and, with --json, every mount to a file.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "data/data.h"
#include "posix/fs.h"
#include "store/store.h"
#include "userspace/tools/common.h"
#include "userspace/util/json.h"

namespace tfs::tools {
namespace {

constexpr const char* kCmd = "bench mount";

// A device that forwards to `inner` until Cut(), and fails every request
// after it: the image keeps what reached it before, the mount on it next
// finds it dirty.
class CutDevice final : public BlockDevice {
 public:
  explicit CutDevice(BlockDevice* inner) : inner_(inner) {}
  void Submit(IoRequest* req) override {
    if (cut_.load(std::memory_order_acquire)) {
      req->done(req, Status(Err::kIo));
      return;
    }
    inner_->Submit(req);
  }
  const BlockDeviceInfo& Info() const override { return inner_->Info(); }
  const char* Name() const override { return inner_->Name(); }
  void Cut() { cut_.store(true, std::memory_order_release); }

 private:
  BlockDevice* const inner_;
  std::atomic<bool> cut_{false};
};

struct Stages {
  bool dirty = false;
  double store_ms = 0, data_ms = 0, posix_ms = 0;
  uint64_t store_nodes = 0, data_nodes = 0, posix_nodes = 0;
  uint64_t replayed_keys = 0;
  double total_ms() const { return store_ms + data_ms + posix_ms; }
};

struct Mounted {
  store::Store store;
  data::DataPath data;
  posix::Filesystem fs;
};

double Ms(uint64_t ns) { return double(ns) / 1e6; }

// Opens the stages one by one on `dev`, timing each.
Status TimedMount(BlockDevice* dev, Mounted* m, Stages* s, Diag* diag) {
  store::OpenReport rep;
  uint64_t t0 = platform::NowNs();
  TFS_TRY(m->store.Open(&dev, 1, store::OpenOptions{}, diag, &rep));
  uint64_t t1 = platform::NowNs();
  const uint64_t n1 = m->store.btrees().GetStats().node_reads;
  TFS_TRY(m->data.Open(&m->store));
  uint64_t t2 = platform::NowNs();
  const uint64_t n2 = m->store.btrees().GetStats().node_reads;
  TFS_TRY(m->fs.Mount(&m->store, &m->data));
  uint64_t t3 = platform::NowNs();
  const uint64_t n3 = m->store.btrees().GetStats().node_reads;
  s->dirty = !rep.was_clean;
  s->replayed_keys = rep.replayed_keys;
  s->store_ms = Ms(t1 - t0);
  s->data_ms = Ms(t2 - t1);
  s->posix_ms = Ms(t3 - t2);
  s->store_nodes = n1;
  s->data_nodes = n2 - n1;
  s->posix_nodes = n3 - n2;
  return Status::Ok();
}

Status Unmount(Mounted* m) {
  Status a = m->fs.Unmount();
  m->data.Close();
  Status b = m->store.Close();
  return a.ok() ? b : a;
}

// Files of each size, `bytes` of each, in directories of 1000.
Status Fill(Mounted* m, uint64_t bytes, const std::vector<uint64_t>& sizes, uint64_t* files) {
  const posix::Caller root{0, 0};
  std::vector<char> buf;
  uint64_t n = 0;
  u64 dir = 0;
  for (uint64_t size : sizes) {
    buf.assign(size, 0);
    for (uint64_t done = 0; done < bytes; done += size, n++) {
      if (n % 1000 == 0) {
        const std::string name = "d" + std::to_string(n / 1000);
        auto d = m->fs.Mkdir(posix::kRootIno, name.data(), u32(name.size()), 0755, root);
        if (!d.ok()) return d.status();
        dir = d.value().ino;
      }
      const std::string name = "f" + std::to_string(n);
      auto f = m->fs.Mknod(dir, name.data(), u32(name.size()), posix::kModeReg | 0644, 0, root);
      if (!f.ok()) return f.status();
      for (uint64_t at = 0; at < size; at += 1 << 20) {
        // Distinct bytes per file and block (no two extents alike).
        const uint64_t len = std::min<uint64_t>(size - at, 1 << 20);
        for (uint64_t b = 0; b < len; b += 4096) memcpy(&buf[at + b], &n, sizeof(n));
        auto w = m->fs.Write(f.value().ino, at, buf.data() + at, u32(len));
        if (!w.ok()) return w.status();
      }
    }
  }
  *files = n;
  return Status::Ok();  // (the unmount writes the buffers out)
}

// A burst of small overwrites and fsyncs (journal entries to replay), then
// the cut.
Status BurstAndCut(Mounted* m, CutDevice* cut, uint64_t files) {
  char block[4096];
  memset(block, 0x5a, sizeof(block));
  for (uint64_t i = 0; i < 200 && i < files; i++) {
    const uint64_t n = (i * 7919) % files;
    const std::string dname = "d" + std::to_string(n / 1000), fname = "f" + std::to_string(n);
    auto d = m->fs.Lookup(posix::kRootIno, dname.data(), u32(dname.size()));
    if (!d.ok()) return d.status();
    auto f = m->fs.Lookup(d.value().ino, fname.data(), u32(fname.size()));
    if (!f.ok()) return f.status();
    auto w = m->fs.Write(f.value().ino, 0, block, sizeof(block));
    if (!w.ok()) return w.status();
    TFS_TRY(m->fs.Fsync(f.value().ino));
  }
  cut->Cut();
  Unmount(m).IgnoreError();  // (fails: the device is gone)
  return Status::Ok();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Result1 {
  uint64_t size = 0, files = 0, extents = 0;
  double fill_s = 0;
  std::vector<Stages> mounts;
};

int RunOne(const std::string& dir, uint64_t size, const std::vector<uint64_t>& file_sizes, unsigned mounts,
           Result1* out) {
  // Room for the data and its metadata, and the journal.
  const uint64_t image = size + size / 4 + (256ull << 20);
  std::string path = dir + "/tierfs-bench-mount-" + std::to_string(getpid()) + ".img";
  int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    PrintError(kCmd, path + ": " + strerror(errno));
    return 1;
  }
  const int rc = ftruncate(fd, off_t(image));
  close(fd);
  struct Cleanup {
    std::string p;
    ~Cleanup() { unlink(p.c_str()); }
  } cleanup{path};
  if (rc != 0) {
    PrintError(kCmd, path + ": " + strerror(errno));
    return 1;
  }
  auto devs = OpenDevices(kCmd, {path}, false);
  if (devs.empty()) return 1;
  store::FormatMember fm{devs[0].get(), "ssd", 1};
  Diag diag;
  Status st = store::Format(&fm, 1, store::FormatOptions{}, &diag);
  auto fail = [&](const char* what, const Status& s) {
    PrintError(kCmd, std::string(what) + ": " + (diag.empty() ? s.Message() : diag.text));
    return 1;
  };
  if (!st.ok()) return fail("format", st);
  out->size = size;
  {
    auto m = std::make_unique<Mounted>();
    Stages ignored;
    st = TimedMount(devs[0].get(), m.get(), &ignored, &diag);
    if (!st.ok()) return fail("mount", st);
    const uint64_t t0 = platform::NowNs();
    uint64_t per = size / file_sizes.size();
    st = Fill(m.get(), per, file_sizes, &out->files);
    out->fill_s = double(platform::NowNs() - t0) / 1e9;
    if (!st.ok()) return fail("fill", st);
    out->extents = m->data.GetStats().extents_written;
    st = Unmount(m.get());
    if (!st.ok()) return fail("unmount", st);
  }
  for (int dirty = 0; dirty < 2; dirty++) {
    for (unsigned i = 0; i < mounts; i++) {
      if (dirty) {  // a dirty image for this mount
        CutDevice cut(devs[0].get());
        auto m = std::make_unique<Mounted>();
        Stages ignored;
        st = TimedMount(&cut, m.get(), &ignored, &diag);
        if (st.ok()) st = BurstAndCut(m.get(), &cut, out->files);
        if (!st.ok()) return fail("burst before the cut", st);
      }
      auto m = std::make_unique<Mounted>();
      Stages s;
      st = TimedMount(devs[0].get(), m.get(), &s, &diag);
      if (!st.ok()) return fail("timed mount", st);
      st = Unmount(m.get());
      if (!st.ok()) return fail("unmount", st);
      out->mounts.push_back(s);
    }
  }
  return 0;
}

}  // namespace

int BenchMount(int argc, char** argv) {
  CLI::App app("Mount time by stage as the data grows, clean and after a cut.", "tierfs bench mount");
  std::vector<std::string> sizes = {"1G"}, file_sizes = {"4K", "64K", "1M"};
  unsigned mounts = 5;
  std::string dir = "/var/tmp", json_path;
  app.add_option("--sizes", sizes, "data per image, one image each (e.g. 1G,8G)")->delimiter(',');
  app.add_option("--file-sizes", file_sizes, "file sizes, the same bytes of each")->delimiter(',');
  app.add_option("--mounts", mounts, "timed mounts per image, clean and dirty each")->check(CLI::Range(1u, 100u));
  app.add_option("--dir", dir, "directory for the image files (on the disk to measure)");
  app.add_option("--json", json_path, "write every mount as JSON to this file");
  if (int rc = ParseCommandLine(app, kCmd, argc, argv); rc >= 0) return rc;
  std::vector<uint64_t> data, files;
  for (const std::string& s : sizes) {
    auto b = ParseSize(s);
    if (!b || *b < (4u << 20) || *b > (1ull << 40)) {
      PrintError(kCmd, "--sizes: '" + s + "' is not a size from 4M to 1T");
      return 2;
    }
    data.push_back(*b);
  }
  for (const std::string& s : file_sizes) {
    auto b = ParseSize(s);
    if (!b || *b == 0 || *b % 4096 != 0 || *b > (1u << 30)) {
      PrintError(kCmd, "--file-sizes: '" + s + "' is not a multiple of 4K up to 1G");
      return 2;
    }
    files.push_back(*b);
  }
  std::vector<Result1> results;
  for (uint64_t size : data) {
    Result1 r;
    if (int rc = RunOne(dir, size, files, mounts, &r); rc != 0) return rc;
    results.push_back(std::move(r));
  }
  printf("mount benchmark: %u mounts per image and state; medians in ms (nodes read)\n", mounts);
  printf("%10s %9s %9s %6s %18s %18s %18s %10s\n", "data", "files", "extents", "state", "store", "data path",
         "posix", "total");
  userspace::JsonWriter w;
  w.BeginObject();
  w.StringField("benchmark", "mount");
  w.StringField("dir", dir);
  w.UintField("mounts", mounts);
  w.Key("images");
  w.BeginArray();
  for (const Result1& r : results) {
    w.BeginObject();
    w.UintField("data_bytes", r.size);
    w.UintField("files", r.files);
    w.UintField("extents", r.extents);
    w.DoubleField("fill_seconds", r.fill_s);
    for (int dirty = 0; dirty < 2; dirty++) {
      std::vector<double> st, dp, px, tot;
      std::vector<double> sn, dn, pn;
      for (const Stages& s : r.mounts) {
        if (s.dirty != bool(dirty)) continue;
        st.push_back(s.store_ms), dp.push_back(s.data_ms), px.push_back(s.posix_ms), tot.push_back(s.total_ms());
        sn.push_back(double(s.store_nodes)), dn.push_back(double(s.data_nodes)), pn.push_back(double(s.posix_nodes));
      }
      printf("%9.2fG %9llu %9llu %6s %10.1f (%5.0f) %10.1f (%5.0f) %10.1f (%5.0f) %10.1f\n", double(r.size) / (1 << 30),
             (unsigned long long)r.files, (unsigned long long)r.extents, dirty ? "dirty" : "clean", Median(st),
             Median(sn), Median(dp), Median(dn), Median(px), Median(pn), Median(tot));
      w.Key(dirty ? "dirty" : "clean");
      w.BeginObject();
      w.UintField("mounts", st.size());
      w.DoubleField("store_ms_median", Median(st));
      w.DoubleField("data_ms_median", Median(dp));
      w.DoubleField("posix_ms_median", Median(px));
      w.DoubleField("total_ms_median", Median(tot));
      w.DoubleField("store_nodes_median", Median(sn));
      w.DoubleField("data_nodes_median", Median(dn));
      w.DoubleField("posix_nodes_median", Median(pn));
      w.Key("each");
      w.BeginArray();
      for (const Stages& s : r.mounts) {
        if (s.dirty != bool(dirty)) continue;
        w.BeginObject();
        w.DoubleField("store_ms", s.store_ms);
        w.DoubleField("data_ms", s.data_ms);
        w.DoubleField("posix_ms", s.posix_ms);
        w.UintField("store_nodes", s.store_nodes);
        w.UintField("data_nodes", s.data_nodes);
        w.UintField("posix_nodes", s.posix_nodes);
        w.UintField("replayed_keys", s.replayed_keys);
        w.EndObject();
      }
      w.EndArray();
      w.EndObject();
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << w.str() << "\n";
    if (!f) {
      PrintError(kCmd, json_path + ": cannot write");
      return 1;
    }
  }
  return 0;
}

}  // namespace tfs::tools
