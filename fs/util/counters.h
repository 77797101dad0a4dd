// Counters: each subsystem's counters written once, in one table.
//
// A subsystem lists its counters as an X-macro table with two row kinds,
//
//   #define TFS_JOURNAL_COUNTERS(X, A)  (each line but the last ends in "\")
//     X(commits, counter, "transactions committed")
//     A(preflushes, dev::kMaxDevices, counter, "flushes per member ...")
//     X(next_seq, level, "the next entry's sequence number")
//
// X a single u64, A an array of n. The kind says what the number means and
// who keeps it:
//   counter  monotonic; the subsystem adds to a live atomic (relaxed),
//   gauge    a level now; the subsystem adds to and subtracts from an atomic,
//   total    monotonic, computed when a snapshot is taken (no live atomic),
//   level    a level, computed when a snapshot is taken,
//   flag     0 or 1, computed when a snapshot is taken; JSON false or true.
// Readers of two snapshots (the benchmarks' phases) report the monotonic
// rows (counter, total) as their increase and the others as they are.
// Subsystems that fill their snapshot themselves -- the journal and the
// allocator under their locks, the I/O queue -- use no live atomics; there
// counter and gauge only say what the number means.
// From the one table come
//   TFS_COUNTER_FIELDS(T)         the snapshot's u64 fields (zeroed),
//   TFS_COUNTER_ATOMICS(T)        the live Atomic<u64> of counter and gauge rows,
//   TFS_COUNTER_LOAD(T, live, s)  statements: s.x = live.x (relaxed loads),
//   TFS_COUNTER_JSON(T, w, s)     statements: every row as "x": value (an
//                                 array row as a JSON array) into a JsonOut
//                                 (TFS_COUNTER_JSON_N: arrays cut to n),
//   TFS_COUNTER_INFO(T)           {name, kind, help} rows (docs, tests),
// so a counter is one line of a table, whatever reads it (GetStats, the ctl
// reply of FUSE and, later, of the kernel, the benchmarks). A subsystem that
// keeps its counters under its own lock (the journal's) uses the snapshot
// struct itself as its live state. Kernel-safe.
#ifndef TFS_UTIL_COUNTERS_H_
#define TFS_UTIL_COUNTERS_H_

#include "platform/atomic.h"
#include "platform/types.h"
#include "util/json_out.h"

namespace tfs {

enum class CounterKind : u8 { kCounter, kGauge, kTotal, kLevel, kFlag };

constexpr bool CounterMonotonic(CounterKind k) { return k == CounterKind::kCounter || k == CounterKind::kTotal; }

struct CounterInfo {
  const char* name;
  CounterKind kind;
  u32 count;  // 1, or an array row's length
  const char* help;
};

// Relaxed increments: counters only count, they publish nothing.
inline void Bump(Atomic<u64>& c, u64 n = 1) { c.FetchAdd(n, MemOrder::kRelaxed); }
inline void Drop(Atomic<u64>& c, u64 n = 1) { c.FetchSub(n, MemOrder::kRelaxed); }

inline void WriteCounterArray(JsonOut& w, const char* name, const u64* v, u32 n) {
  w.Key(name);
  w.BeginArray();
  for (u32 i = 0; i < n; i++) w.Uint(v[i]);
  w.EndArray();
}

}  // namespace tfs

// Row expanders (internal; the TFS_COUNTER_* macros below apply them).
#define TFS_CTR_FIELD_(name, kind, help) ::u64 name = 0;
#define TFS_CTR_AFIELD_(name, n, kind, help) ::u64 name[n] = {};

#define TFS_CTR_ATOMIC_counter(decl) decl
#define TFS_CTR_ATOMIC_gauge(decl) decl
#define TFS_CTR_ATOMIC_total(decl)
#define TFS_CTR_ATOMIC_level(decl)
#define TFS_CTR_ATOMIC_flag(decl)
#define TFS_CTR_ATOMIC_(name, kind, help) TFS_CTR_ATOMIC_##kind(::tfs::Atomic<::u64> name{0};)
#define TFS_CTR_AATOMIC_(name, n, kind, help) TFS_CTR_ATOMIC_##kind(::tfs::Atomic<::u64> name[n];)

// The CounterKind of a row's kind word.
#define TFS_COUNTER_KIND(kind) TFS_CTR_KIND_##kind
#define TFS_CTR_KIND_counter ::tfs::CounterKind::kCounter
#define TFS_CTR_KIND_gauge ::tfs::CounterKind::kGauge
#define TFS_CTR_KIND_total ::tfs::CounterKind::kTotal
#define TFS_CTR_KIND_level ::tfs::CounterKind::kLevel
#define TFS_CTR_KIND_flag ::tfs::CounterKind::kFlag
#define TFS_CTR_INFO_(name, kind, help) {#name, TFS_COUNTER_KIND(kind), 1, help},
#define TFS_CTR_AINFO_(name, n, kind, help) {#name, TFS_COUNTER_KIND(kind), n, help},

#define TFS_COUNTER_FIELDS(T) T(TFS_CTR_FIELD_, TFS_CTR_AFIELD_)
#define TFS_COUNTER_ATOMICS(T) T(TFS_CTR_ATOMIC_, TFS_CTR_AATOMIC_)
#define TFS_COUNTER_INFO(T) T(TFS_CTR_INFO_, TFS_CTR_AINFO_)

// Statements, each row of the table in turn (live, s and w are expressions).
#define TFS_COUNTER_LOAD(T, live, s)                                                       \
  do {                                                                                     \
    auto& tfs_live_ = (live);                                                              \
    auto& tfs_s_ = (s);                                                                    \
    T(TFS_CTR_LOAD_ONE_, TFS_CTR_LOAD_ARRAY_)                                              \
  } while (0)
#define TFS_CTR_LOAD_counter(stmt) stmt
#define TFS_CTR_LOAD_gauge(stmt) stmt
#define TFS_CTR_LOAD_total(stmt)
#define TFS_CTR_LOAD_level(stmt)
#define TFS_CTR_LOAD_flag(stmt)
#define TFS_CTR_LOAD_ONE_(name, kind, help) \
  TFS_CTR_LOAD_##kind(tfs_s_.name = tfs_live_.name.Load(::tfs::MemOrder::kRelaxed);)
#define TFS_CTR_LOAD_ARRAY_(name, n, kind, help)                                     \
  TFS_CTR_LOAD_##kind(for (::u32 tfs_i_ = 0; tfs_i_ < (n); tfs_i_++) tfs_s_.name[tfs_i_] = \
                          tfs_live_.name[tfs_i_].Load(::tfs::MemOrder::kRelaxed);)

#define TFS_COUNTER_JSON(T, w, s) TFS_COUNTER_JSON_N(T, w, s, ~0u)
// The same with every array row cut to its first `max_n` entries (the
// per-member arrays of a mount with fewer members than kMaxDevices).
#define TFS_COUNTER_JSON_N(T, w, s, max_n)         \
  do {                                             \
    ::tfs::JsonOut& tfs_w_ = (w);                  \
    const auto& tfs_s_ = (s);                      \
    [[maybe_unused]] const ::u32 tfs_max_ = (max_n); \
    T(TFS_CTR_JSON_ONE_, TFS_CTR_JSON_ARRAY_)      \
  } while (0)
#define TFS_CTR_JSON_ONE_(name, kind, help) TFS_CTR_JSON_##kind(name)
#define TFS_CTR_JSON_counter(name) tfs_w_.UintField(#name, tfs_s_.name);
#define TFS_CTR_JSON_gauge(name) tfs_w_.UintField(#name, tfs_s_.name);
#define TFS_CTR_JSON_total(name) tfs_w_.UintField(#name, tfs_s_.name);
#define TFS_CTR_JSON_level(name) tfs_w_.UintField(#name, tfs_s_.name);
#define TFS_CTR_JSON_flag(name) tfs_w_.BoolField(#name, tfs_s_.name != 0);
#define TFS_CTR_JSON_ARRAY_(name, n, kind, help) \
  ::tfs::WriteCounterArray(tfs_w_, #name, tfs_s_.name, (n) < tfs_max_ ? ::u32(n) : tfs_max_);

#endif  // TFS_UTIL_COUNTERS_H_
