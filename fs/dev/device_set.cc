// Device set: member labels, groups and target resolution (see device_set.h).
#include "dev/device_set.h"

#include "platform/platform.h"

namespace tfs::dev {
Status ValidateLabel(const char* label) {
  usize n = 0;
  int dots = 0;
  for (; label[n] != '\0'; n++) {
    char c = label[n];
    if (n + 1 >= kLabelMax) return Err::kInvalidArgument;
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) return Err::kInvalidArgument;
    if (c == '.') dots++;
  }
  if (n == 0 || dots > 1 || label[0] == '.' || label[n - 1] == '.') return Err::kInvalidArgument;
  if (StrEqual(label, "none")) return Err::kInvalidArgument;
  return Status::Ok();
}

DeviceSet::~DeviceSet() {
  // First: no deferred work may run once a queue is gone. The set's work
  // (table writes) may still submit to members, whose completions may queue
  // their dispatch: the set's queue stops first.
  work_.Stop();
  for (u32 i = 0; i < count_; i++) members_[i]->dispatch_.Stop();
  for (u32 i = 0; i < count_; i++) platform::Delete(members_[i]);
}

Result<Member*> DeviceSet::Add(BlockDevice* bdev, const char* label, const QueueConfig& qc) {
  TFS_TRY(ValidateLabel(label));
  if (count_ >= kMaxDevices) return Err::kNoSpace;
  for (u32 i = 0; i < count_; i++) {
    if (StrEqual(members_[i]->label_, label)) return Err::kInvalidArgument;
  }
  if (!work_.started()) TFS_TRY(work_.Start("tfs-work"));
  Member* m = platform::New<Member>();
  if (m == nullptr) return Err::kNoMemory;
  Status st = Status::Ok();
  if (bdev != nullptr && !bdev->Info().completions_may_submit) st = m->dispatch_.Start("tfs-dispatch");
  if (st.ok()) st = m->queue_.Init(bdev, qc, m->dispatch_.started() ? &m->dispatch_ : nullptr);
  if (!st.ok()) {
    platform::Delete(m);
    return st;
  }
  m->index_ = count_;
  m->bdev_ = bdev;
  usize n = StrLen(label);
  MemCopy(m->label_, label, n + 1);
  usize g = 0;
  while (g < n && label[g] != '.') g++;
  MemCopy(m->group_, label, g);
  m->group_[g] = '\0';
  members_[count_++] = m;
  return m;
}

Result<DevMask> DeviceSet::ResolveTarget(const char* target) const {
  if (target == nullptr || target[0] == '\0' || StrEqual(target, "none")) return DevMask(0);
  DevMask mask = 0;
  for (u32 i = 0; i < count_; i++) {
    if (StrEqual(members_[i]->group_, target)) mask |= DevMask(1) << i;
  }
  if (mask != 0) return mask;
  for (u32 i = 0; i < count_; i++) {
    if (StrEqual(members_[i]->label_, target)) return DevMask(1) << i;
  }
  return Err::kNotFound;
}

bool DeviceSet::MarkFailed(u32 index, Status why) {
  if (index >= count_ || !IsDeviceFailure(why)) return false;
  const DevMask bit = DevMask(1) << index;
  // The error first (kept if it was the first seen): a reader that sees the
  // bit sees it (FailedError reads it only for a member marked).
  i32 none = 0;
  failed_error_[index].CompareExchange(none, i32(why.code()), MemOrder::kAcqRel);
  DevMask cur = failed_.Load(MemOrder::kAcquire);
  for (;;) {
    if ((cur & bit) != 0) return false;
    // The last member left, or the last of a vital group (the journal's
    // rings, the btree's members), is not marked: the mark is for going on
    // without a member, and with none left for that role the error fails
    // the write as it always did (a one-SSD filesystem keeps its EIO; the
    // allocator would turn it into ENOSPC and pass its SSD by). (A loop:
    // two members failing at once leave one.)
    const DevMask gone = missing_ | cur | bit;
    if (gone == all()) return false;
    if ((vital_[0] != 0 && (vital_[0] & ~gone) == 0) || (vital_[1] != 0 && (vital_[1] & ~gone) == 0)) return false;
    if (failed_.CompareExchange(cur, cur | bit, MemOrder::kAcqRel)) break;
  }
  platform::Log(platform::LogLevel::kError,
                "dev: member %s failed a write or a flush (%s): nothing is written to it for the rest of this mount (its copies "
                "are read still); the next mount with it finds it stale and 'tierfs fsck -y' checks it",
                members_[index]->label_, FailedError(index).Message());
  if (on_failed_ != nullptr) on_failed_(on_failed_ctx_);
  return true;
}

DevMask DeviceSet::DebtMask() const {
  DevMask mask = 0;
  for (u32 i = 0; i < count_; i++) {
    if (members_[i]->queue_.HasDurabilityDebt()) mask |= DevMask(1) << i;
  }
  return mask;
}

}  // namespace tfs::dev
