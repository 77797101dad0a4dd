// The btree node parser (Node::Parse) on hostile bytes. A node that parses
// must iterate the same keys both ways, find each one, survive compaction, and
// parse again from its own image with the same keys.
#include <cstring>

#include "btree/node.h"
#include "fuzz/fuzz.h"
#include "platform/platform.h"

using namespace tfs;
using namespace tfs::btree;

namespace {

struct Buf {
  explicit Buf(u32 n) : p(static_cast<u8*>(platform::Alloc(n, 4096))) {}
  ~Buf() { platform::Free(p); }
  u8* p;
};

u32 Walk(const Node& n) {
  u32 fwd = 0, back = 0;
  NodeIter it(n);
  for (it.SeekToFirst(); it.Valid(); it.Next()) {
    fwd++;
    if (!n.Find(it.pos()).valid()) fuzz::Fail("an iterated key is not found");
  }
  for (it.SeekToLast(); it.Valid(); it.Prev()) back++;
  if (fwd != back) fuzz::Fail("forward and backward iteration differ");
  if (fwd != n.CountKeys()) fuzz::Fail("CountKeys differs from iteration");
  return fwd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  u32 node_size = kMinNodeSize;
  while (node_size < size) node_size *= 2;
  Buf in(node_size);
  if (in.p == nullptr) return 0;
  memset(in.p, 0, node_size);
  memcpy(in.p, data, size);
  Node n;
  Diag diag;
  if (!n.Parse(in.p, node_size, nullptr, &diag).ok()) return 0;
  const u32 keys = Walk(n);
  Buf out(node_size);
  if (out.p == nullptr) return 0;
  memset(out.p, 0, node_size);
  n.WriteImage(out.p, n.info().seq + 1);
  Node again;
  if (!again.Parse(out.p, node_size, nullptr, &diag).ok()) fuzz::Fail("a parsed node's own image does not parse");
  if (Walk(again) != keys) fuzz::Fail("a node's image holds other keys");
  if (n.Compact(0).ok() && Walk(n) != keys) fuzz::Fail("compaction changed the visible keys");
  return 0;
}
