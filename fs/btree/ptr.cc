// Node pointers: the copies of a node and the parse rules of a pointer read
// from disk (format.h NodePtrFormat; docs/format/btree.md, "Pointers and
// roots").
#include "btree/tree.h"

namespace tfs::btree {

void ClearPtrCopies(NodePtrFormat* p) {
  p->nr = 0;
  for (u32 i = 0; i < kMaxNodeCopies; i++) {
    p->member[i] = kNoMember;
    p->offset[i].set(0);
  }
}

NodePtrFormat EmptyPtr(u8 id) {
  NodePtrFormat p;
  MemSet(&p, 0, sizeof(p));
  ClearPtrCopies(&p);
  p.btree_id = id;
  return p;
}

void AddPtrCopy(NodePtrFormat* p, u32 member, u64 offset) {
  const u32 i = p->nr;
  p->member[i] = u8(member);
  p->offset[i].set(offset);
  p->nr = u8(i + 1);
}

void SetPtrCopies(NodePtrFormat* dst, const NodePtrFormat& src) {
  const NodePtrFormat from = src;
  ClearPtrCopies(dst);
  for (u32 i = 0; i < PtrCopies(from); i++) AddPtrCopy(dst, from.member[i], from.offset[i].get());
}

bool SamePtrCopies(const NodePtrFormat& a, const NodePtrFormat& b) {
  if (a.nr != b.nr) return false;
  for (u32 i = 0; i < PtrCopies(a); i++)
    if (a.member[i] != b.member[i] || a.offset[i].get() != b.offset[i].get()) return false;
  return true;
}

const char* NodePtrProblem(const NodePtrFormat& p, const sb::Superblock& sb, u32 node_size, bool may_be_empty) {
  const char* why = nullptr;
  if (p.nr > kMaxNodeCopies || (p.nr == 0 && !may_be_empty)) why = "a copy count out of range";
  if (p.reserved0 != 0 || p.reserved1.get() != 0) why = "reserved bytes not zero";
  for (u32 i = 0; why == nullptr && i < kMaxNodeCopies; i++) {
    if (i >= p.nr) {
      if (p.member[i] != kNoMember || p.offset[i].get() != 0) why = "an unused copy entry not cleared";
      continue;
    }
    if (p.member[i] >= sb.nr_members) {
      why = "a copy on no member";
      continue;
    }
    if ((sb.members[p.member[i]].data_allowed & sb::kDataBtree) == 0)
      why = "a copy on a member that holds no btree nodes";
    if (!NodeSlotInArea(sb, node_size, p.member[i], p.offset[i].get())) why = "a copy outside the btree area";
    for (u32 j = 0; j < i; j++)
      if (p.member[j] == p.member[i]) why = "two copies on one member";
  }
  return why;
}

bool PtrDegraded(const NodePtrFormat& p, const sb::Superblock& sb) {
  u32 durability = 0;
  for (u32 k = 0; k < PtrCopies(p); k++) {
    const u32 m = PtrCopy(p, k).member;
    if (m < sb.nr_members) durability += sb.members[m].durability;
  }
  return !PtrEmpty(p) && durability < Max<u32>(sb.options.metadata_replicas, 1);
}

bool NodeSlotInArea(const sb::Superblock& sb, u32 node_size, u32 m, u64 offset) {
  return m < sb.nr_members && offset % node_size == 0 && offset >= sb::kBucketsOffset &&
         (offset - sb::kBucketsOffset) / sb.bucket_size < sb.members[m].nbuckets;
}

}  // namespace tfs::btree
