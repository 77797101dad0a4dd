// IoContext: who a data read or write is for, carried by every call of the
// data path that does device I/O or takes space (docs/design/core.md, step 4).
//
// The data path (data::DataPath) is shared by posix and the background
// engines; what differs between them is not the code but four facts, and they
// travel together:
//  - origin: the IoOrigin every request it submits is tagged with (the lab's
//    edge inventory counts a slow member's I/O by origin: a background write
//    must never be tagged foreground, nor the reverse);
//  - io_class: the device queue class its requests wait in (dev/io_queue.h);
//  - watermark: how deep into the allocator's reserves its allocations may go
//    (alloc::Watermark: a background writer stops before the foreground does);
//  - target: where new data goes (a superblock target, one member, or the
//    group of one member -- a file's foreground_target option, posix/opts.h);
//  - target_only: whether the target's members are the only ones (no
//    fallback to any member: a repair rewrites a copy on its own member);
//  - replicas: how many copies a write wants (a file's replicas option; 0:
//    the filesystem's data_replicas for the foreground write path -- origin
//    kForegroundWrite -- and one copy for any other writer: promote,
//    copygc, reconcile set it when they must keep an extent's copies), each
//    on a distinct member of the target, counted by the members'
//    durability (docs/design/copies.md).
// New data is appended at a write point per (target, io_class): a background
// writer never shares a bucket with the foreground, so its allocations never
// hold up a foreground write, and each bucket holds data of one temperature.
//
// Plain values, no behaviour: a context is built once (the constants below,
// or an engine's own) and passed by const reference.
#ifndef TFS_DATA_IO_CONTEXT_H_
#define TFS_DATA_IO_CONTEXT_H_

#include "alloc/allocator.h"
#include "dev/io_queue.h"
#include "platform/block_device.h"

namespace tfs::data {

// Where new data goes: one of the superblock's targets (resolved when the data
// path opens; a target that names nothing means "no preference"), one
// member, or every member of one member's group. Any member may serve when
// the target's cannot (the allocator's fallback), as foreground writes
// always have.
enum class TargetKind : u8 {
  kForeground = 0,  // sb options.foreground_target
  kBackground,      // sb options.background_target
  kPromote,         // sb options.promote_target
  kMember,          // Target::member alone (a file's target naming a member; copygc's evacuation, tests)
  kGroup,           // every member whose group is Target::member's (a file's target naming a group)
};
inline constexpr u32 kTargetKinds = 5;
// The superblock's target kinds (kForeground..kPromote): one write point per
// class each; kMember and kGroup add at most one per member each.
inline constexpr u32 kSbTargetKinds = 3;

struct Target {
  TargetKind kind = TargetKind::kForeground;
  u8 member = 0;  // kMember, kGroup only
  bool operator==(const Target& o) const {
    const bool by_member = kind == TargetKind::kMember || kind == TargetKind::kGroup;
    return kind == o.kind && (!by_member || member == o.member);
  }
};

struct IoContext {
  IoOrigin origin = IoOrigin::kForegroundWrite;
  dev::IoClass io_class = dev::IoClass::kForegroundSync;
  alloc::Watermark watermark = alloc::Watermark::kForeground;
  Target target;
  u8 replicas = 0;  // copies wanted, 1..kMaxPtrs (more: kMaxPtrs); 0: data_replicas (foreground writes), else 1
  // Space on the target's members only: no fallback to any member when
  // they have none (kNoSpace instead). A repair's (the copy belongs on its
  // member), later an evacuation's.
  bool target_only = false;
};

// posix's writes (buffered write-out, O_DIRECT, fallocate's zeroing) and reads.
inline constexpr IoContext kForegroundWrite = {IoOrigin::kForegroundWrite, dev::IoClass::kForegroundSync,
                                               alloc::Watermark::kForeground, Target{}};
inline constexpr IoContext kForegroundRead = {IoOrigin::kForegroundRead, dev::IoClass::kForegroundSync,
                                              alloc::Watermark::kForeground, Target{}};

}  // namespace tfs::data

#endif  // TFS_DATA_IO_CONTEXT_H_
