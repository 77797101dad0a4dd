// The extent's policy against the member table (policy.h).
#include "data/policy.h"

#include "platform/types.h"

namespace tfs::data {

void BuildMemberTable(const dev::DeviceSet& devs, const sb::Superblock& sb, MemberTable* out) {
  *out = MemberTable{};
  out->count = Min<u32>(devs.size(), dev::kMaxDevices);
  for (u32 m = 0; m < out->count; m++) {
    out->durability[m] = m < sb.nr_members ? sb.members[m].durability : 0;
    if (out->durability[m] > 0) out->durable |= dev::DevMask(1) << m;
    for (u32 i = 0; i < out->count; i++)
      if (StrEqual(devs.member(i)->group(), devs.member(m)->group())) out->group[m] |= dev::DevMask(1) << i;
  }
  // A target that names nothing is no preference (the fallback: every member).
  const char* names[3] = {sb.options.foreground_target, sb.options.background_target, sb.options.promote_target};
  dev::DevMask* masks[3] = {&out->fg_target, &out->bg_target, &out->promote_target};
  for (u32 k = 0; k < 3; k++) {
    auto r = devs.ResolveTarget(names[k]);
    *masks[k] = r.ok() ? r.value() : 0;
  }
  out->data_replicas = Min<u32>(Max<u32>(sb.options.data_replicas, 1), kMaxPtrs);
  out->compress = sb.options.compression == sb::CompressionType::kZstd;
}

u16 CanonicalTarget(const MemberTable& t, u16 code) {
  const u32 count = Min<u32>(t.count, dev::kMaxDevices);
  if (code >= kTargetMember && code < kTargetMember + count) return code;
  if ((code & ~u16(0xff)) == kTargetGroup && (code & 0xff) < count) {
    const dev::DevMask g = t.group[code & 0xff];
    if (g != 0) return u16(kTargetGroup | __builtin_ctz(g));
  }
  return 0;
}

dev::DevMask TargetMembers(const MemberTable& t, u16 code) {
  const u16 c = CanonicalTarget(t, code);
  if (c == 0) return 0;
  if (c < kTargetGroup) return dev::DevMask(1) << (c - kTargetMember);
  return t.group[c & 0xff];
}

bool PolicyOf(const Extent& e, const MemberTable& t, Policy* out) {
  const Policy& p = e.policy;
  Policy q = p;
  q.fg_target = CanonicalTarget(t, p.fg_target);
  q.bg_target = CanonicalTarget(t, p.bg_target);
  if ((p.fg_target != 0 && q.fg_target == 0) || (p.bg_target != 0 && q.bg_target == 0) ||
      p.replicas > kPolicyReplicasMax || p.compression > kCompressZstd || (p.flags & ~kPolicyIncompressible) != 0 ||
      p.reserved != 0) {
    *out = Policy{};
    return false;
  }
  *out = q;
  return true;
}

u8 DestOf(const MemberTable& t, dev::DevMask members) {
  if (members == 0) return kDestAny;
  const u32 low = u32(__builtin_ctz(members));
  if (low >= Min<u32>(t.count, dev::kMaxDevices)) return kDestAny;
  if ((members & (members - 1)) == 0) return u8(kDestMember + low);
  return t.group[low] == members ? u8(kDestGroup + low) : kDestAny;
}

Work ReconcileOf(const MemberTable& t, const Extent& e) {
  Work w;
  Policy p;
  w.policy_bad = !PolicyOf(e, t, &p);
  if (e.unwritten || e.nr_ptrs == 0) return w;
  const u32 count = Min<u32>(t.count, dev::kMaxDevices);
  const dev::DevMask all = count == 32 ? ~dev::DevMask(0) : (dev::DevMask(1) << count) - 1;
  const u32 want = Min<u32>(p.replicas != 0 ? p.replicas : t.data_replicas, kMaxPtrs);
  const dev::DevMask bg = (p.bg_target != 0 ? TargetMembers(t, p.bg_target) : t.bg_target) & all;
  dev::DevMask fg = (p.fg_target != 0 ? TargetMembers(t, p.fg_target) : t.fg_target) & all;
  if (fg == 0) fg = all;
  const dev::DevMask on_t = bg & t.durable;
  const dev::DevMask on_f = fg & t.durable;
  // e's durable copies (a pointer past the members is damage, fsck's: it
  // counts nothing).
  u32 d = 0, d_t = 0, cap_t = 0;
  dev::DevMask has = 0;
  dev::DevMask plain = 0;  // members of durable plain copies
  for (u32 i = 0; i < e.nr_ptrs && i < kMaxPtrs; i++) {
    const Extent::Ptr& q = e.ptrs[i];
    if (q.cached || q.dev >= count) continue;
    const dev::DevMask bit = dev::DevMask(1) << q.dev;
    const u32 dur = t.durability[q.dev];
    has |= bit;
    d += dur;
    if ((on_t & bit) != 0) d_t += dur;
    if (dur > 0 && !q.compressed) plain |= bit;
  }
  for (u32 m = 0; m < count; m++)
    if ((on_t & (dev::DevMask(1) << m)) != 0) cap_t += t.durability[m];
  const bool place = bg != 0 && d_t < Min(want, cap_t);
  const bool durab = d < want;
  const bool zstd = p.compression == kCompressZstd || (p.compression == 0 && t.compress);
  const bool compress = zstd && plain != 0 && (p.flags & kPolicyIncompressible) == 0;
  bool surplus = false;
  for (u32 i = 0; i < e.nr_ptrs && i < kMaxPtrs && !durab; i++) {
    const Extent::Ptr& q = e.ptrs[i];
    if (q.cached || q.dev >= count) continue;
    const u32 dur = t.durability[q.dev];
    // Counting nothing once W is met; or outside T once T holds its share
    // and the rest still make W.
    if (dur == 0 || (bg != 0 && !place && (on_t & (dev::DevMask(1) << q.dev)) == 0 && d - dur >= want))
      surplus = true;
  }
  const u8 extra = u8((compress ? kWorkCompress : 0) | (surplus ? kWorkCacheOnly : 0));
  w.background = on_t;
  if (place) {  // (always placeable: some member of T lacks a copy, or D_T would be cap_T)
    w.reasons = u8(kWorkPlacement | (durab ? kWorkDurability : 0) | extra);
    w.dest = DestOf(t, bg);
    w.members = on_t;
  } else if (durab && (on_f & ~has) != 0) {
    w.reasons = u8(kWorkDurability | extra);
    w.dest = DestOf(t, fg);
    w.members = on_f;
  } else if (surplus) {
    // Alone, before any compression: a surplus copy is not rewritten to be
    // dropped next, and the change that frees its member never waits for
    // room there (never parked).
    w.reasons = kWorkCacheOnly;
    w.dest = kDestNoIo;
  } else if (compress) {  // (durability work, if any, is stuck: it waits for the member table)
    // Each plain copy rewritten compressed on its own member.
    w.reasons = kWorkCompress;
    w.dest = DestOf(t, plain);
    w.members = plain;
  } else if (durab) {
    w.reasons = kWorkDurability;
    w.dest = u8(DestOf(t, fg) | kDestStuck);
    w.members = on_f;
  }
  return w;
}

}  // namespace tfs::data
