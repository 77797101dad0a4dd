// Micro-benchmark (not a test): lookups per second in one btree node.
//
// Builds a node of 64-bit positions with 8-byte values (the shape of the btree
// benchmark in issue 5) and times, on one thread:
//   - Set::LowerBound through the Eytzinger index, over the node's one set;
//   - the same answer by a plain binary search over the in-order keys (the
//     baseline the index replaces: each step reads a packed key via its offset);
//   - Node::Find with one set, and with 15 small newer sets appended on top
//     (the common state between compactions);
//   - forward iteration with NodeIter.
// Probes are random existing positions; each case runs 5 times and the median is
// printed. Numbers depend on the machine and its load: see docs/benchmarks.md.
//
// With a third argument, also builds that many nodes (one set each, three
// quarters full, like the leaves of a randomly filled tree) and times Node::Find
// at random across all of them: the memory-bound case of a tree much larger
// than the CPU caches (2048 nodes of 256 KiB is the 10M-key benchmark's shape).
//
//   build/bin/btree_node_bench [node_size_kib=256 (64..1024)] [probes=2000000] [nodes=0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "btree/node.h"

namespace tfs::btree {
namespace {

volatile u64 g_sink;

template <typename F>
double MedianRate(u64 ops, F&& run) {
  std::vector<double> rates;
  for (int i = 0; i < 5; i++) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(ops) / s);
  }
  std::sort(rates.begin(), rates.end());
  return rates[2];
}

int Main(int argc, char** argv) {
  const u32 node_size = (argc > 1 ? u32(atoi(argv[1])) : 256) * 1024;
  const u64 nprobes = argc > 2 ? u64(atoll(argv[2])) : 2000000;
  std::mt19937_64 rng(1);
  NodeInfo info;
  info.btree_id = kBtreeTest;
  info.seq = 1;
  info.min = Pos::Min(kBtreeTest);
  info.max = Pos::Max(kBtreeTest);
  Node node;
  // Below 64 KiB the 15 small sets would not leave room for the large one.
  if (node_size < 64 * 1024 || !node.Init(node_size, info).ok()) {
    fprintf(stderr, "node_size_kib must be a power of two from 64 to 1024\n");
    return 2;
  }
  // As many 8-byte-value keys as fit in one set, leaving room for 15 small sets.
  const u32 small_sets = 15, small_keys = 16;
  const u32 reserve = small_sets * (u32(sizeof(SetHeader)) + small_keys * KeySpace(8));
  const u32 nkeys = (node_size - u32(sizeof(NodeHeader) + sizeof(SetHeader)) - reserve) / KeySpace(8);
  std::vector<u64> offsets(nkeys);
  for (u32 i = 0; i < nkeys; i++) offsets[i] = rng();
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  std::vector<KeyInput> keys;
  for (u64& off : offsets) keys.push_back(KeyInput{Pos{kBtreeTest, 0, off}, kKeyValue, &off, 8});
  if (!node.AppendSet(keys.data(), keys.size(), 1).ok()) {
    fprintf(stderr, "building the node failed\n");
    return 1;
  }
  const Set& set = node.set(0);
  std::vector<Pos> probes(nprobes);
  for (auto& p : probes) p = keys[rng() % keys.size()].pos;

  auto eytzinger = [&] {
    u64 sum = 0;
    for (const Pos& p : probes) sum += set.LowerBound(p);
    g_sink = sum;
  };
  auto binary = [&] {
    u64 sum = 0;
    for (const Pos& p : probes) {
      u32 lo = 0, hi = set.size();
      while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (set.KeyPos(mid) < p) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      sum += lo;
    }
    g_sink = sum;
  };
  u64 missing = 0;
  auto find = [&] {
    u64 sum = 0;
    for (const Pos& p : probes) {
      KeyRef k = node.Find(p);
      if (!k.valid()) {
        missing++;
        continue;
      }
      sum += k.val_bytes();
    }
    g_sink = sum;
  };
  printf("node %u KiB, %zu keys of 32 bytes in one set, %llu random probes, median of 5\n", node_size / 1024,
         keys.size(), (unsigned long long)nprobes);
  printf("%-44s %8.2f M/s\n", "Set::LowerBound (Eytzinger)", MedianRate(nprobes, eytzinger) / 1e6);
  printf("%-44s %8.2f M/s\n", "binary search over in-order keys (baseline)", MedianRate(nprobes, binary) / 1e6);
  printf("%-44s %8.2f M/s\n", "Node::Find, 1 set", MedianRate(nprobes, find) / 1e6);
  for (u32 s = 0; s < small_sets; s++) {
    std::vector<KeyInput> more;
    std::vector<u64> picks;
    for (u32 i = 0; i < small_keys; i++) picks.push_back(offsets[rng() % offsets.size()]);
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (u64& off : picks) more.push_back(KeyInput{Pos{kBtreeTest, 0, off}, kKeyValue, &off, 8});
    if (!node.AppendSet(more.data(), more.size(), 2 + s).ok()) {
      fprintf(stderr, "appending set %u failed\n", s + 1);
      return 1;
    }
  }
  char label[64];
  snprintf(label, sizeof(label), "Node::Find, %u sets", node.nsets());
  printf("%-44s %8.2f M/s\n", label, MedianRate(nprobes, find) / 1e6);
  u64 seen = 0;
  double iter = MedianRate(u64(keys.size()) * 100, [&] {
    for (int r = 0; r < 100; r++) {
      NodeIter it(node);
      for (it.SeekToFirst(); it.Valid(); it.Next()) seen++;
    }
  });
  snprintf(label, sizeof(label), "NodeIter forward, %u sets", node.nsets());
  printf("%-44s %8.2f M keys/s\n", label, iter / 1e6);
  const u32 nnodes = argc > 3 ? u32(atoi(argv[3])) : 0;
  if (nnodes > 0) {
    std::vector<std::unique_ptr<Node>> nodes;
    std::vector<std::vector<u64>> node_keys(nnodes);
    const u32 per_node = nkeys * 3 / 4;
    for (u32 n = 0; n < nnodes; n++) {
      std::vector<u64>& ko = node_keys[n];
      ko.resize(per_node);
      for (u64& o : ko) o = rng();
      std::sort(ko.begin(), ko.end());
      ko.erase(std::unique(ko.begin(), ko.end()), ko.end());
      std::vector<KeyInput> in;
      for (u64& off : ko) in.push_back(KeyInput{Pos{kBtreeTest, n, off}, kKeyValue, &off, 8});
      nodes.push_back(std::make_unique<Node>());
      if (!nodes.back()->Init(node_size, info).ok() || !nodes.back()->AppendSet(in.data(), in.size(), 1).ok()) {
        fprintf(stderr, "building node %u failed\n", n);
        return 1;
      }
    }
    std::vector<std::pair<u32, Pos>> far(nprobes);
    for (auto& p : far) {
      const u32 n = u32(rng() % nnodes);
      p = {n, Pos{kBtreeTest, n, node_keys[n][rng() % node_keys[n].size()]}};
    }
    auto find_far = [&] {
      u64 sum = 0;
      for (const auto& p : far) {
        KeyRef k = nodes[p.first]->Find(p.second);
        if (!k.valid()) {
          missing++;
          continue;
        }
        sum += k.val_bytes();
      }
      g_sink = sum;
    };
    snprintf(label, sizeof(label), "Node::Find across %u nodes", nnodes);
    printf("%-44s %8.2f M/s\n", label, MedianRate(nprobes, find_far) / 1e6);
  }
  if (missing != 0 || seen != u64(keys.size()) * 500) {
    fprintf(stderr, "wrong results: %llu lookups missed, %llu keys iterated\n", (unsigned long long)missing,
            (unsigned long long)seen);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tfs::btree

int main(int argc, char** argv) { return tfs::btree::Main(argc, argv); }
