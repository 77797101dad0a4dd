// The value parsers of the namespace and file data: extents (data::ParseExtent
// and the extent API's builders), inodes (posix::ParseInode, and their
// options' check and repair), directory entries and xattrs
// (posix::ParseNamedEntry, and a chunked value's descriptor), backpointers
// (data::ParseBackpointer) and alloc records (alloc::ParseRecord, against
// the seeds' geometry: fuzz::ValuesSuperblock). The first byte picks the
// parser; for extents, backpointers and alloc records the next 16 are the
// key's inode and offset. Whatever a parser accepts is read whole (the
// sanitizers catch a parser that vouches for bytes it does not have); an
// accepted extent rebuilds to the same bytes, its pieces and pointer edits
// build values that parse, and so do its pointers' backpointers; an accepted
// backpointer rebuilds to the same bytes and key; an accepted alloc record
// rebuilds to the same bytes, and the btree's merge rule calls it plausible
// with the same version; so does an accepted accounting key (alloc keys at
// inode 2^32 and above: alloc::ParseAcct), within its bound. Selector 6 is
// a btree node pointer (an interior key's value or a roots block's entry:
// btree::NodePtrProblem, for 1..32 members of the seeds' geometry picked by
// the first byte): an accepted one has every copy in its member's bucket
// area and rebuilds to the same bytes from its copies.
#include <cstring>

#include "alloc/accounting.h"
#include "alloc/allocator.h"
#include "btree/tree.h"
#include "data/backpointer.h"
#include "data/data.h"
#include "fuzz/fuzz.h"
#include "posix/fs.h"
#include "posix/format.h"
#include "posix/opts.h"

using namespace tfs;

namespace {

volatile u32 g_sink;

void Touch(const void* p, usize n) {
  const u8* b = static_cast<const u8*>(p);
  u32 x = 0;
  for (usize i = 0; i < n; i++) x += b[i];
  g_sink = x;
}

// A key of tree `btree_id` from the input's first 16 bytes (its inode, then
// its offset: for an alloc key the member and the bucket) and the value after
// them, in a buffer of its own size so a read past it is caught. False: the
// input is shorter than a key.
bool KeyAndValue(const u8* in, u32 len, u8 btree_id, btree::Pos* pos, std::vector<u8>* val) {
  if (len < 16) return false;
  *pos = btree::Pos{btree_id, 0, 0};
  memcpy(&pos->inode, in, 8);
  memcpy(&pos->offset, in + 8, 8);
  *val = std::vector<u8>(in + 16, in + len);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 70000) return 0;
  const u8 which = data[0] % 7;
  // The value in a buffer of its own size, so a read past it is caught.
  const u8* v = data + 1;
  u32 len = u32(size - 1);
  btree::Pos pos;
  std::vector<u8> val;
  if (which == 5) {
    if (!KeyAndValue(v, len, btree::kBtreeAlloc, &pos, &val)) return 0;
    static const sb::Superblock geometry = fuzz::ValuesSuperblock();
    Diag diag;
    if (alloc::IsAcctKey(pos.inode)) {  // an accounting key (alloc/accounting.h)
      u64 sectors = 0;
      if (!alloc::ParseAcct(geometry, pos.inode, pos.offset, val.data(), u32(val.size()), &sectors, &diag).ok())
        return 0;
      alloc::AcctRecord r;
      alloc::EncodeAcct(alloc::AcctKind(pos.inode - alloc::kAcctInodeBase), sectors, &r);
      if (val.size() != sizeof(r) || memcmp(&r, val.data(), sizeof(r)) != 0)
        fuzz::Fail("a parsed accounting key that does not rebuild to its bytes");
      if (sectors > alloc::AcctMax(geometry, alloc::AcctKind(pos.inode - alloc::kAcctInodeBase)))
        fuzz::Fail("an accounting total past the bound parsed");
      return 0;
    }
    alloc::Bucket b;
    if (!alloc::ParseRecord(geometry, pos.inode, pos.offset, val.data(), u32(val.size()), &b, &diag).ok()) return 0;
    alloc::AllocRecord r;
    alloc::EncodeRecord(b, &r);
    if (val.size() != sizeof(r) || memcmp(&r, val.data(), sizeof(r)) != 0)
      fuzz::Fail("a parsed alloc record that does not rebuild to its bytes");
    u64 version = 0;
    if (!alloc::RecordPlausible(val.data(), u32(val.size()), &version) || version != b.version)
      fuzz::Fail("a valid alloc record the merge rule calls implausible");
    return 0;
  }
  if (which == 6) {
    btree::NodePtrFormat p;
    if (len != sizeof(p)) return 0;
    memcpy(&p, v, sizeof(p));
    static const sb::Superblock one = fuzz::ValuesSuperblock();
    sb::Superblock geometry = one;
    geometry.nr_members = 1 + data[0] / 7 % dev::kMaxDevices;
    for (u32 m = 1; m < geometry.nr_members; m++) geometry.members[m] = one.members[0];
    const u32 members = geometry.nr_members;
    if (btree::NodePtrProblem(p, geometry, geometry.btree_node_size, /*may_be_empty=*/true) != nullptr) return 0;
    btree::NodePtrFormat q = btree::EmptyPtr(p.btree_id);
    q.level = p.level;
    q.seq = p.seq;
    q.min_inode = p.min_inode;
    q.min_offset = p.min_offset;
    for (u32 i = 0; i < btree::PtrCopies(p); i++) {
      const btree::NodeCopy c = btree::PtrCopy(p, i);
      if (c.member >= members || !btree::NodeSlotInArea(geometry, geometry.btree_node_size, c.member, c.offset))
        fuzz::Fail("an accepted node pointer with a copy on no member or outside its bucket area");
      btree::AddPtrCopy(&q, c.member, c.offset);
    }
    if (memcmp(&p, &q, sizeof(p)) != 0 || !btree::SamePtrCopies(p, q))
      fuzz::Fail("an accepted node pointer that does not rebuild from its copies");
    return 0;
  }
  if (which == 4) {
    if (!KeyAndValue(v, len, btree::kBtreeBackpointers, &pos, &val)) return 0;
    data::Backpointer bp;
    if (!data::ParseBackpointer(pos, val.data(), u32(val.size()), &bp).ok()) return 0;
    const data::BackpointerFormat f = data::BuildBackpointer(bp);
    if (val.size() != sizeof(f) || memcmp(&f, val.data(), sizeof(f)) != 0 || bp.pos() != pos)
      fuzz::Fail("a parsed backpointer that does not rebuild to its key and value");
    if (bp.blocks == 0 || bp.end < bp.blocks) fuzz::Fail("a backpointer to an extent before block 0");
    return 0;
  }
  if (which == 0) {
    if (!KeyAndValue(v, len, btree::kBtreeExtents, &pos, &val)) return 0;
    data::Extent x;
    if (!data::ParseExtent(pos, val.data(), u32(val.size()), &x).ok()) return 0;
    if (x.end != pos.offset || x.start >= x.end) fuzz::Fail("an extent that does not end at its key");
    if (x.unwritten != (x.nr_ptrs == 0) || x.nr_ptrs > data::kMaxPtrs) fuzz::Fail("a bad pointer count");
    if (x.HasPlain() != (x.crcs != nullptr)) fuzz::Fail("crcs without a plain copy, or the reverse");
    if (x.crcs != nullptr) Touch(x.crcs, 4 * u64(x.blocks()));
    // The value is canonical: it rebuilds to the same bytes.
    u8 buf[data::kExtentValueMax];
    auto len = data::BuildExtent(x, buf);
    if (!len.ok() || len.value() != val.size() || memcmp(buf, val.data(), val.size()) != 0)
      fuzz::Fail("a parsed extent that does not rebuild to its value");
    // What the edits build parses again (or they refuse).
    auto reparse = [&](const Result<u32>& r, u64 end) {
      data::Extent y;
      if (r.ok() && !data::ParseExtent(btree::Pos{btree::kBtreeExtents, pos.inode, end}, buf, r.value(), &y).ok())
        fuzz::Fail("an extent edit built a value that does not parse");
    };
    const u32 blocks = x.blocks();
    const u64 skip = blocks > 1 ? pos.offset % blocks : 0;
    reparse(data::BuildPiece(x, skip, blocks - u32(skip), buf), pos.offset);
    reparse(data::BuildPiece(x, 0, Max<u32>(1, blocks / 2), buf), x.start + Max<u32>(1, blocks / 2));
    for (u32 i = 0; i < x.nr_ptrs; i++) {
      reparse(data::DropPtr(x, i, buf), pos.offset);
      reparse(data::SetCached(x, i, !x.ptrs[i].cached, buf), pos.offset);
    }
    if (!x.unwritten) {
      data::Extent::Ptr p = x.ptrs[0];
      p.dev = u8(p.dev + 1);
      reparse(data::AddPtr(x, p, x.crcs, buf), pos.offset);
    }
    // Every backpointer the pointers get parses back to itself (geometry:
    // every member, 1 MiB buckets up to 2^40 bytes).
    static sb::Superblock geometry = [] {
      sb::Superblock s{};
      s.bucket_size = 1u << 20;
      s.nr_members = sb::kSbMaxMembers;
      for (u32 m = 0; m < sb::kSbMaxMembers; m++) s.members[m].nbuckets = u64(1) << 20;
      return s;
    }();
    for (u32 i = 0; i < x.nr_ptrs; i++) {
      data::Backpointer bp, back;
      if (!data::BackpointerOf(geometry, x, x.ptrs[i], &bp)) continue;
      const data::BackpointerFormat f = data::BuildBackpointer(bp);
      if (!data::ParseBackpointer(bp.pos(), reinterpret_cast<const u8*>(&f), sizeof(f), &back).ok() ||
          !back.SameValue(bp) || back.pos() != bp.pos())
        fuzz::Fail("a pointer's backpointer that does not parse back");
    }
    return 0;
  }
  val = std::vector<u8>(v, v + len);
  if (which == 1) {
    posix::InodeFormat ino;
    if (!posix::ParseInode(val.data(), u32(val.size()), &ino).ok()) return 0;
    // Its options, as fsck judges and repairs them (for 1..32 members):
    // whatever the bytes, a repaired inode checks clean.
    const u32 members = 1 + data[0] / 8 % dev::kMaxDevices;
    posix::RepairOpts(&ino, members);
    if (posix::CheckOpts(ino, members).any()) fuzz::Fail("inode options still damaged after RepairOpts");
    return 0;
  }
  posix::DirentFormat d;
  const char* name = nullptr;
  const u8* value = nullptr;
  const u8 btree_id = which == 2 ? btree::kBtreeDirents : btree::kBtreeXattrs;
  if (!posix::ParseNamedEntry(btree_id, val.data(), u32(val.size()), &d, &name, &value).ok()) return 0;
  Touch(name, d.name_len);
  Touch(value, d.value_len.get());
  if (btree_id == btree::kBtreeXattrs && d.type == posix::kXattrChunked) {
    // An accepted descriptor: ParseXattrChunks agrees, and its value does
    // not fit inline, is at most 64 KiB and its chunk keys lie in range.
    posix::XattrChunksFormat c;
    if (!posix::ParseXattrChunks(d, value, &c).ok()) fuzz::Fail("ParseNamedEntry accepted a bad chunk descriptor");
    const u32 n = c.value_len.get();
    if (n <= posix::XattrInlineMax(d.name_len) || n > posix::kXattrSizeMax ||
        posix::XattrChunkOffset(c.id.get(), posix::XattrChunkCount(n) - 1) < posix::kXattrChunkBase)
      fuzz::Fail("a chunk descriptor out of range");
  }
  return 0;
}
