// Memory pressure for the userspace build: the platform seam's shrinkers
// (tfs_plat_shrinker_register, fs/platform/platform.h) driven by a thread.
//
// The kernel calls a filesystem's shrinkers from reclaim. A userspace daemon
// has no such call, so one thread per process (started with the first
// shrinker, stopped with the last) looks every `interval_ms` at
//  - the memory pressure of the process's cgroup (PSI: the cgroup v2
//    `memory.pressure` file, or the system's /proc/pressure/memory where the
//    cgroup has none): at `psi_some_pct` or more of "some avg10", every
//    cache gives back a quarter of what it could;
//  - the process's resident memory against `rss_limit` (0: none): over it,
//    the caches give back the excess and a tenth of the limit more;
// and asks the shrinkers for that many pages, shared in proportion to what
// each could give (count). What a shrinker cannot free at once (dirty data:
// the write buffer) it hands to its own thread, so the next look sees less.
// Once per pressure episode: freed cache memory does not lower the RSS one
// for one (the allocator keeps part of it mapped) and PSI's avg10 stays up
// for seconds after a spike, so asking again every look would empty the
// caches; after the first ask the caches are only held at the level it left
// (what they grew back is asked for), until the pressure is over.
//
// Thread safety: everything from any thread. A shrinker's calls run with
// the registry's mutex held, so unregistering waits for them.
#ifndef TFS_USERSPACE_PLATFORM_PRESSURE_H_
#define TFS_USERSPACE_PLATFORM_PRESSURE_H_

#include <string>

#include "platform/types.h"

namespace tfs::userspace {

struct PressureOptions {
  u64 rss_limit = 0;          // bytes; 0: no limit
  u32 psi_some_pct = 10;      // "some avg10" at or above this shrinks (0: PSI ignored)
  u32 interval_ms = 1000;     // how often the thread looks
};
// Takes effect at the thread's next look.
void SetPressureOptions(const PressureOptions& options);
PressureOptions GetPressureOptions();

struct PressureReading {
  bool psi_known = false;     // a PSI file was read
  double some_avg10 = 0;      // percent
  u64 rss = 0;                // bytes (0: unknown)
};
// The PSI file this process's pressure is read from ("" if none).
std::string PressureFile();
PressureReading ReadPressure();
// Pages to ask of shrinkers that could give `countable` pages, for a reading.
u64 PagesToShrink(const PressureOptions& options, const PressureReading& reading, u64 countable);
bool UnderPressure(const PressureOptions& options, const PressureReading& reading);
// One pressure episode (see above): what a look asks, given whether it found
// pressure, PagesToShrink's answer and what the caches hold now.
struct PressureEpisode {
  bool active = false;
  u64 floor = 0;  // what the caches held after the episode's first ask
  u64 Ask(bool pressure, u64 pages, u64 countable);
};
// Asks every registered shrinker for its share of `pages`; returns the pages
// they gave back. (The thread's step; tests and tools call it directly.)
u64 ShrinkAll(u64 pages);
// Pages every registered shrinker could give back now.
u64 CountAll();

struct PressureStats {
  u64 looks = 0;         // times the thread looked
  u64 pressured = 0;     // of which found pressure and asked the shrinkers
  u64 pages_asked = 0;
  u64 pages_freed = 0;   // what the shrinkers reported freeing at once
  u32 shrinkers = 0;     // registered now
};
PressureStats GetPressureStats();

}  // namespace tfs::userspace

#endif  // TFS_USERSPACE_PLATFORM_PRESSURE_H_
