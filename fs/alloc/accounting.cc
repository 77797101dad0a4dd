// Accounting keys and their totals (see accounting.h).
#include "alloc/accounting.h"

#include "platform/platform.h"
#include "util/bits.h"
#include "util/sort.h"

namespace tfs::alloc {

u64 AcctMax(const sb::Superblock& sb, AcctKind kind) {
  u64 buckets = 0;
  for (u32 m = 0; m < sb.nr_members && m < sb::kSbMaxMembers; m++) buckets += sb.members[m].nbuckets;
  // (No overflow: below 2^64 / kCountFactor members' worth of sectors.)
  if (kind == AcctKind::kInodes) return buckets * (sb.bucket_size / kInodeMinBytes);
  return buckets * (sb.bucket_size / 512) * kCountFactor;
}

void EncodeAcct(AcctKind kind, u64 sectors, AcctRecord* out) {
  MemSet(out, 0, sizeof(*out));
  out->sectors.set(sectors);
  out->kind = u8(kind);
}

Status ParseAcct(const sb::Superblock& sb, u64 inode, u64 offset, const void* val, u32 len, u64* sectors,
                 Diag* diag) {
  if (inode < kAcctInodeBase || inode - kAcctInodeBase >= kAcctKinds)
    return DiagError(diag, Err::kCorrupt, "alloc: accounting key (%llu, %llu): no such kind",
                     (unsigned long long)inode, (unsigned long long)offset);
  const u32 kind = u32(inode - kAcctInodeBase);
  if (len != sizeof(AcctRecord))
    return DiagError(diag, Err::kCorrupt, "alloc: accounting key (kind %u, %llu): value of %u bytes, not %u", kind,
                     (unsigned long long)offset, len, unsigned(sizeof(AcctRecord)));
  AcctRecord r;
  MemCopy(&r, val, sizeof(r));
  bool zero = true;
  for (u8 b : r.reserved) zero &= b == 0;
  if (r.kind != kind || !zero)
    return DiagError(diag, Err::kCorrupt, "alloc: accounting key (kind %u, %llu): its value says kind %u%s", kind,
                     (unsigned long long)offset, unsigned(r.kind), zero ? "" : " and has reserved bytes set");
  switch (AcctKind(kind)) {
    case AcctKind::kReserved:
    case AcctKind::kInodes:
      if (offset != 0)
        return DiagError(diag, Err::kCorrupt, "alloc: %s key at offset %llu, not 0",
                         AcctKind(kind) == AcctKind::kReserved ? "reserved-sectors" : "inode-count",
                         (unsigned long long)offset);
      break;
    case AcctKind::kReplicas: {
      const u64 all = sb.nr_members >= 64 ? ~u64(0) : (u64(1) << sb.nr_members) - 1;
      if (offset == 0 || PopCount(offset) > kAcctMaxMembers || (offset & ~all) != 0)
        return DiagError(diag, Err::kCorrupt,
                         "alloc: replicas key for members 0x%llx: not 1 to %u of the filesystem's %u members",
                         (unsigned long long)offset, kAcctMaxMembers, unsigned(sb.nr_members));
      break;
    }
  }
  const u64 s = r.sectors.get();
  const u64 most = AcctMax(sb, AcctKind(kind));
  if (s > most)
    return DiagError(diag, Err::kCorrupt, "alloc: accounting key (kind %u, %llu): %llu %s, more than the "
                     "members can hold (%llu)", kind, (unsigned long long)offset, (unsigned long long)s,
                     AcctKind(kind) == AcctKind::kInodes ? "inodes" : "sectors", (unsigned long long)most);
  *sectors = s;
  return Status::Ok();
}

Status Accounting::Init(const sb::Superblock& sb) {
  MutexLock l(mu_);
  sb_ = sb;
  for (u32 k = 0; k < kAcctKinds; k++) max_[k] = AcctMax(sb, AcctKind(k));
  reserved_ = 0;
  inodes_ = 0;
  replicas_.Clear();
  keys_loaded_ = 0;
  return Status::Ok();
}

void Accounting::BeginLoad() {
  MutexLock l(mu_);
  reserved_ = 0;
  inodes_ = 0;
  replicas_.Clear();
  keys_loaded_ = 0;
}

usize Accounting::FindLocked(dev::DevMask mask, bool* found) const {
  const usize lo = LowerBound(replicas_.data(), replicas_.size(),
                              [mask](const ReplicasEntry& e) { return e.members < mask; });
  *found = lo < replicas_.size() && replicas_[lo].members == mask;
  return lo;
}

u64* Accounting::ScalarLocked(AcctKind kind) {
  switch (kind) {
    case AcctKind::kReserved: return &reserved_;
    case AcctKind::kInodes: return &inodes_;
    case AcctKind::kReplicas: break;
  }
  return nullptr;
}

void Accounting::PutLocked(AcctKind kind, u64 offset, u64 sectors) {
  if (u64* one = ScalarLocked(kind)) {
    *one = sectors;
    return;
  }
  bool found;
  const usize at = FindLocked(dev::DevMask(offset), &found);
  if (found) {
    replicas_[at].sectors = sectors;
    return;
  }
  // A new set, in order (the caller made room: the push cannot fail).
  TFS_BUG_ON(replicas_.size() == replicas_.capacity());
  replicas_.PushBack(ReplicasEntry{}).IgnoreError();
  for (usize i = replicas_.size() - 1; i > at; i--) replicas_[i] = replicas_[i - 1];
  replicas_[at] = ReplicasEntry{dev::DevMask(offset), sectors};
}

Status Accounting::LoadKey(u64 inode, u64 offset, const void* val, u32 len, Diag* diag) {
  u64 sectors;
  TFS_TRY(ParseAcct(sb_, inode, offset, val, len, &sectors, diag));
  MutexLock l(mu_);
  TFS_TRY(replicas_.Grow(replicas_.size() + 1));
  PutLocked(AcctKind(inode - kAcctInodeBase), offset, sectors);
  keys_loaded_++;
  return Status::Ok();
}

Status Accounting::Stage(const AcctChange* changes, u32 n, AcctValue* out) {
  MutexLock l(mu_);
  u32 fresh = 0;
  for (u32 i = 0; i < n; i++) {
    const AcctChange& c = changes[i];
    AcctValue& v = out[i];
    v = AcctValue{};
    v.kind = c.kind;
    v.offset = c.offset;
    u64 have = 0;
    if (const u64* one = ScalarLocked(c.kind)) {
      have = *one;
    } else {
      bool found;
      const usize at = FindLocked(dev::DevMask(c.offset), &found);
      if (found) {
        have = replicas_[at].sectors;
      } else {
        fresh++;
      }
    }
    if (c.sectors < 0 && u64(-c.sectors) > have) {
      v.sectors = 0;
      v.underflow = true;
    } else if (const u64 most = max_[u32(c.kind) < kAcctKinds ? u32(c.kind) : 0];
               c.sectors > 0 && u64(c.sectors) > most - Min(have, most)) {
      v.sectors = most;
      v.overflow = true;
    } else {
      v.sectors = u64(i64(have) + c.sectors);
    }
  }
  // Room for the new sets now (Publish cannot fail).
  if (fresh > 0) TFS_TRY(replicas_.Grow(replicas_.size() + fresh));
  return Status::Ok();
}

void Accounting::Publish(const AcctValue* staged, u32 n) {
  u64 under = 0, over = 0;
  {
    MutexLock l(mu_);
    for (u32 i = 0; i < n; i++) {
      PutLocked(staged[i].kind, staged[i].offset, staged[i].sectors);
      under += staged[i].underflow;
      over += staged[i].overflow;
    }
  }
  ctr_.acct_records.FetchAdd(n, MemOrder::kRelaxed);
  if (under != 0) ctr_.acct_underflows.FetchAdd(under, MemOrder::kRelaxed);
  if (over != 0) ctr_.acct_overflows.FetchAdd(over, MemOrder::kRelaxed);
}

Status Accounting::MakeRoom(u32 n) {
  MutexLock l(mu_);
  return replicas_.Grow(replicas_.size() + n);
}

void Accounting::Set(const AcctValue* values, u32 n) {
  MutexLock l(mu_);
  for (u32 i = 0; i < n; i++) {
    const AcctValue& v = values[i];
    if (v.kind == AcctKind::kReplicas && v.sectors == 0) {
      bool found;
      const usize at = FindLocked(dev::DevMask(v.offset), &found);
      if (found) replicas_.Erase(at);
      continue;
    }
    PutLocked(v.kind, v.offset, v.sectors);
  }
  ctr_.acct_repairs.FetchAdd(n, MemOrder::kRelaxed);
}

u64 Accounting::reserved_sectors() const {
  MutexLock l(mu_);
  return reserved_;
}

u64 Accounting::inodes() const {
  MutexLock l(mu_);
  return inodes_;
}

u64 Accounting::Get(AcctKind kind, u64 offset) const {
  MutexLock l(mu_);
  if (kind == AcctKind::kReserved) return offset == 0 ? reserved_ : 0;
  if (kind == AcctKind::kInodes) return offset == 0 ? inodes_ : 0;
  bool found;
  const usize at = FindLocked(dev::DevMask(offset), &found);
  return found && offset == u64(dev::DevMask(offset)) ? replicas_[at].sectors : 0;
}

u32 Accounting::Replicas(ReplicasEntry* out, u32 cap) const {
  MutexLock l(mu_);
  for (u32 i = 0; i < cap && i < replicas_.size(); i++) out[i] = replicas_[i];
  return u32(replicas_.size());
}

Status Accounting::ReplicasInto(Vector<ReplicasEntry>* out) const {
  TFS_TRY(out->Resize(Replicas(nullptr, 0)));  // (not under mu_: no allocation under it)
  const u32 n = Replicas(out->data(), u32(out->size()));
  return n < out->size() ? out->Resize(n) : Status::Ok();
}

CopiesSummary SummarizeCopies(const ReplicasEntry* sets, usize n, dev::DevMask out) {
  CopiesSummary c;
  for (usize i = 0; i < n; i++) {
    const ReplicasEntry& s = sets[i];
    if (s.sectors == 0) continue;
    c.sectors += s.sectors;
    // (A loaded mask has 1..kAcctMaxMembers bits: ParseAcct.)
    c.by_copies[Min<u32>(PopCount(s.members), kAcctMaxMembers)] += s.sectors;
    if ((s.members & out) == 0) continue;
    if ((s.members & ~out) != 0) {
      c.degraded += s.sectors;
    } else {
      c.unavailable += s.sectors;
      c.unavailable_sets++;
    }
  }
  return c;
}

AcctStats Accounting::Stats() const {
  AcctStats s;
  TFS_COUNTER_LOAD(TFS_ACCT_COUNTERS, ctr_, s);
  MutexLock l(mu_);
  s.keys_loaded = keys_loaded_;
  s.replicas_entries = replicas_.size();
  return s;
}

}  // namespace tfs::alloc
