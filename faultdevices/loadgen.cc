// Closed-loop load generator (see loadgen.h). Each of the qd slots owns a request
// and a buffer; a completed slot immediately takes the next sequence number. A
// device may call back inside Submit() (errors, powered-off devices), so a
// callback never submits recursively on the same thread: it hands the slot to the
// submitting frame (a per-thread trampoline), keeping the stack flat.
#include "faultdevices/loadgen.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "faultdevices/device.h"  // WriteLatencyMs
#include "faultdevices/timer.h"

namespace faultdev {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Load;

struct Slot {
  Load* load = nullptr;
  tfs::IoRequest req;
  std::vector<uint8_t> buf;
  uint64_t start_ns = 0;
};

struct Load {
  tfs::BlockDevice* dev = nullptr;
  LoadOptions o;
  uint64_t blocks = 0;
  // mu guards next, writes_since_flush, done and result.
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next = 0;
  uint64_t writes_issued = 0;
  uint64_t writes_since_flush = 0;
  uint64_t done = 0;
  LoadResult result;

  // Fills the slot with request number `index`. Caller holds mu.
  void Prepare(Slot* s, uint64_t index) {
    uint64_t r = Mix(o.seed ^ Mix(index));
    tfs::IoOp op = tfs::IoOp::kRead;
    uint64_t block = r % blocks;
    switch (o.pattern) {
      case Pattern::kRandRead: break;
      case Pattern::kRandWrite: op = tfs::IoOp::kWrite; break;
      case Pattern::kSeqRead: block = index % blocks; break;
      case Pattern::kSeqWrite: op = tfs::IoOp::kWrite; block = index % blocks; break;
      case Pattern::kMixed:
        if (writes_since_flush >= 64) {
          op = tfs::IoOp::kFlush;
          writes_since_flush = 0;
        } else if ((r >> 40) % 10 < 3) {
          op = tfs::IoOp::kWrite;
          writes_since_flush++;
        }
        break;
    }
    s->req = tfs::IoRequest{};
    s->req.op = op;
    s->req.origin = o.origin;
    s->req.offset = block * o.block;
    s->req.length = o.block;
    s->req.buf = s->buf.data();
    s->req.caller_data = s;
    s->req.done = &Done;
    if (op == tfs::IoOp::kWrite) FillWriteData(o.seed, writes_issued++, s->buf.data(), o.block);
  }

  static void Done(tfs::IoRequest* req, tfs::Status st);
};

thread_local bool tl_submitting = false;
thread_local std::vector<Slot*>* tl_deferred = nullptr;

void SubmitFlat(Slot* s) {
  if (tl_submitting) {
    tl_deferred->push_back(s);
    return;
  }
  std::vector<Slot*> deferred;
  tl_deferred = &deferred;
  tl_submitting = true;
  s->start_ns = NowNs();
  s->load->dev->Submit(&s->req);
  while (!deferred.empty()) {
    Slot* next = deferred.back();
    deferred.pop_back();
    next->start_ns = NowNs();
    next->load->dev->Submit(&next->req);
  }
  tl_submitting = false;
  tl_deferred = nullptr;
}

void Load::Done(tfs::IoRequest* req, tfs::Status st) {
  uint64_t now = NowNs();
  auto* s = static_cast<Slot*>(req->caller_data);
  Load* l = s->load;
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(l->mu);
    l->result.latency_ns.Record(now - s->start_ns);
    l->result.completed++;
    if (!st.ok()) l->result.errors++;
    switch (req->op) {
      case tfs::IoOp::kRead: l->result.reads++; break;
      case tfs::IoOp::kWrite: l->result.writes++; break;
      case tfs::IoOp::kFlush: l->result.flushes++; break;
      case tfs::IoOp::kDiscard: break;
    }
    l->done++;
    if (l->next < l->o.ops) {
      l->Prepare(s, l->next++);
      again = true;
    } else if (l->done == l->o.ops) {
      l->cv.notify_all();
    }
  }
  if (again) SubmitFlat(s);
}

}  // namespace

std::optional<Pattern> ParsePattern(const std::string& name) {
  for (Pattern p : {Pattern::kRandRead, Pattern::kRandWrite, Pattern::kSeqRead, Pattern::kSeqWrite, Pattern::kMixed}) {
    if (name == PatternName(p)) return p;
  }
  return std::nullopt;
}

const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kRandRead: return "randread";
    case Pattern::kRandWrite: return "randwrite";
    case Pattern::kSeqRead: return "seqread";
    case Pattern::kSeqWrite: return "seqwrite";
    case Pattern::kMixed: return "mixed";
  }
  return "?";
}

void FillWriteData(uint64_t seed, uint64_t index, uint8_t* buf, uint64_t len) {
  uint64_t x = Mix(seed * 0x100000001b3ull ^ index);
  for (uint64_t i = 0; i < len; i += 8) {
    x = Mix(x);
    memcpy(buf + i, &x, std::min<uint64_t>(8, len - i));
  }
}

LoadResult RunLoad(tfs::BlockDevice& dev, const LoadOptions& options) {
  Load l;
  l.dev = &dev;
  l.o = options;
  uint64_t span = options.span != 0 ? std::min(options.span, dev.Size()) : dev.Size();
  l.blocks = std::max<uint64_t>(1, span / options.block);
  uint32_t qd = uint32_t(std::min<uint64_t>(std::max<uint32_t>(options.qd, 1), std::max<uint64_t>(options.ops, 1)));
  std::vector<Slot> slots(qd);
  uint64_t start = NowNs();
  std::vector<Slot*> first;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    for (Slot& s : slots) {
      if (l.next >= options.ops) break;
      s.load = &l;
      s.buf.assign(options.block, 0);
      l.Prepare(&s, l.next++);
      first.push_back(&s);
    }
  }
  for (Slot* s : first) SubmitFlat(s);
  std::unique_lock<std::mutex> lock(l.mu);
  l.cv.wait(lock, [&] { return l.done == options.ops; });
  l.result.seconds = double(NowNs() - start) / 1e9;
  return l.result;
}

void LoadResult::Write(tfs::userspace::JsonWriter& w) const {
  w.BeginObject();
  w.UintField("completed", completed);
  w.UintField("errors", errors);
  w.UintField("reads", reads);
  w.UintField("writes", writes);
  w.UintField("flushes", flushes);
  w.DoubleField("seconds", seconds);
  w.DoubleField("iops", seconds > 0 ? double(completed) / seconds : 0.0);
  WriteLatencyMs(w, "latency_ms", latency_ns);
  w.EndObject();
}

}  // namespace faultdev
