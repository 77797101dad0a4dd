// The mount's counters as one JSON document: what `tierfs ctl` reads through
// the ctl ioctl, from the FUSE daemon today and from the kernel module later
// -- both call WriteStats and hand out its bytes (docs/usage.md, "tierfs ctl").
//
// The document: "bucket_size"; "devices" (per member: label, group, its I/O
// queue's state, I/O by origin and operation with service-time quantiles,
// and what the front end adds: its path, its fault device); "work" (the
// members' deferred work: platform/work.h); "journal", "btree", "alloc" (per member bucket states and reserves, per tier totals,
// the allocator's counters), "data", "posix" (with "write_buffer"), "engines"
// (each background engine's state and counters: bg/engine.h), "budget" (the
// members' background budgets: bg/budget.h). Every
// group's fields come from its subsystem's counter table (util/counters.h), so
// a counter added there shows up here.
//
// Kernel-safe: it writes into a JsonOut (a fixed buffer in an ioctl) and
// allocates only the per-origin statistics it reads the queues into (about
// 40 KiB, from the heap, never the stack; kNoMemory if that fails).
#ifndef TFS_MOUNT_STATS_H_
#define TFS_MOUNT_STATS_H_

#include "mount/instance.h"
#include "util/json_out.h"
#include "util/status.h"

namespace tfs::mount {

// What a front end adds to each member's object (null: nothing): called
// inside the member's object, after the core's fields, to write its own.
struct MemberExtras {
  void (*write)(void* ctx, u32 member, JsonOut& w) = nullptr;
  void* ctx = nullptr;
};

// Writes the document for an open instance (kInvalidArgument if it is not).
Status WriteStats(Instance& inst, JsonOut& w, const MemberExtras* extras = nullptr);

}  // namespace tfs::mount

#endif  // TFS_MOUNT_STATS_H_
