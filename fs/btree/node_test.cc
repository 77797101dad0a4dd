// Btree nodes against a std::map model: lookups, iteration both ways, seeks,
// shadowing and whiteouts across sets, partial and full compaction, parse round
// trips, node sizes 4 KiB..1 MiB with maximum-size values and one-key sets; and
// corruption: every bit flip inside a node's used bytes fails Parse with a
// Corrupt-class error, fields made invalid under valid checksums are each named,
// and random garbage under valid checksums never crashes (run under ASan too).
#include "btree/node.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "platform/platform.h"

namespace tfs::btree {
namespace {

using Model = std::map<std::pair<u64, u64>, std::vector<u8>>;

Pos P(u64 inode, u64 offset) { return Pos{kBtreeTest, inode, offset}; }

NodeInfo Info(u64 seq = 1234, Pos min = Pos::Min(kBtreeTest), Pos max = Pos::Max(kBtreeTest)) {
  NodeInfo i;
  i.btree_id = kBtreeTest;
  i.level = 0;
  i.seq = seq;
  i.min = min;
  i.max = max;
  return i;
}

std::vector<u8> Value(const KeyRef& k) { return std::vector<u8>(k.value(), k.value() + k.val_bytes()); }

// Visible contents by forward and by backward iteration must both equal the model.
void ExpectEqualsModel(const Node& node, const Model& model) {
  NodeIter it(node);
  auto m = model.begin();
  for (it.SeekToFirst(); it.Valid(); it.Next(), ++m) {
    ASSERT_NE(m, model.end());
    ASSERT_EQ(it.pos(), P(m->first.first, m->first.second));
    ASSERT_EQ(it.key().pos(), it.pos());
    ASSERT_EQ(Value(it.key()), m->second);
  }
  ASSERT_EQ(m, model.end());
  auto r = model.rbegin();
  for (it.SeekToLast(); it.Valid(); it.Prev(), ++r) {
    ASSERT_NE(r, model.rend());
    ASSERT_EQ(it.pos(), P(r->first.first, r->first.second));
  }
  ASSERT_EQ(r, model.rend());
  for (const auto& [k, v] : model) {
    KeyRef f = node.Find(P(k.first, k.second));
    ASSERT_TRUE(f.valid());
    ASSERT_EQ(Value(f), v);
  }
}

// Random seeks and mixed Next/Prev walks against the model.
void ExpectSeeksMatchModel(const Node& node, const Model& model, std::mt19937_64& rng, u64 inodes, u64 offsets) {
  NodeIter it(node);
  for (int i = 0; i < 200; i++) {
    std::pair<u64, u64> q{rng() % (inodes + 1), rng() % (offsets + 1)};
    bool found = model.count(q) != 0;
    ASSERT_EQ(node.Find(P(q.first, q.second)).valid(), found);
    auto lb = model.lower_bound(q);
    it.Seek(P(q.first, q.second));
    if (lb == model.end()) {
      ASSERT_FALSE(it.Valid());
    } else {
      ASSERT_TRUE(it.Valid());
      ASSERT_EQ(it.pos(), P(lb->first.first, lb->first.second));
    }
    auto ub = model.upper_bound(q);
    it.SeekForPrev(P(q.first, q.second));
    if (ub == model.begin()) {
      ASSERT_FALSE(it.Valid());
    } else {
      auto want = std::prev(ub);
      ASSERT_TRUE(it.Valid());
      ASSERT_EQ(it.pos(), P(want->first.first, want->first.second));
    }
    // A walk from the seek position; model index -1 = before begin, size = after end.
    long idx = lb == model.end() ? long(model.size()) : long(std::distance(model.begin(), lb));
    it.Seek(P(q.first, q.second));
    std::vector<std::pair<u64, u64>> keys;
    for (const auto& kv : model) keys.push_back(kv.first);
    for (int step = 0; step < 30; step++) {
      if (rng() % 2) {
        it.Next();
        if (idx < long(keys.size())) idx++;
      } else {
        it.Prev();
        if (idx >= 0) idx--;
      }
      if (idx < 0 || idx >= long(keys.size())) {
        ASSERT_FALSE(it.Valid());
        // Off an end: the next step back in resumes at the nearest key.
        if (idx < 0) {
          it.Next();
          idx = 0;
        } else {
          it.Prev();
          idx = long(keys.size()) - 1;
        }
        if (keys.empty()) {
          ASSERT_FALSE(it.Valid());
          break;
        }
      }
      ASSERT_TRUE(it.Valid());
      ASSERT_EQ(it.pos(), P(keys[idx].first, keys[idx].second));
    }
  }
}

struct RoundConfig {
  u32 node_size;
  u64 inodes;
  u64 offsets;
  u32 max_batch;
  u32 big_value_pct;  // chance of a kMaxValueBytes value
};

void RunModelRounds(const RoundConfig& cfg, u64 seed) {
  std::mt19937_64 rng(seed);
  Node node;
  ASSERT_TRUE(node.Init(cfg.node_size, Info()).ok());
  Model model;
  u64 journal_seq = 0;
  int appended = 0, compactions = 0, partial = 0;
  for (int round = 0; round < 300; round++) {
    // A batch of updates at unique sorted positions: values or whiteouts.
    std::map<std::pair<u64, u64>, std::pair<u8, std::vector<u8>>> batch;
    // At most one maximum-size value per batch, so every batch fits an empty node.
    bool big = false;
    u32 n = u32(rng() % cfg.max_batch) + 1;
    for (u32 i = 0; i < n; i++) {
      std::pair<u64, u64> pos{rng() % cfg.inodes, rng() % cfg.offsets};
      if (rng() % 4 == 0) {
        batch[pos] = {kKeyWhiteout, {}};
      } else {
        u32 len = !big && rng() % 100 < cfg.big_value_pct ? kMaxValueBytes : u32(rng() % 40);
        big = big || len == kMaxValueBytes;
        std::vector<u8> v(len);
        for (auto& b : v) b = u8(rng());
        batch[pos] = {kKeyValue, v};
      }
    }
    std::vector<KeyInput> keys;
    for (const auto& [p, tv] : batch)
      keys.push_back(KeyInput{P(p.first, p.second), tv.first, tv.second.data(), u32(tv.second.size())});
    Status st = node.AppendSet(keys.data(), keys.size(), ++journal_seq);
    if (st.code() == Err::kNoSpace) {
      ASSERT_TRUE(node.Compact().ok());
      compactions++;
      ASSERT_LE(node.nsets(), 1u);
      ExpectEqualsModel(node, model);
      st = node.AppendSet(keys.data(), keys.size(), journal_seq);
      if (st.code() == Err::kNoSpace) {
        // Even compacted the node is full: what a split would handle. Start over.
        ASSERT_TRUE(node.Init(cfg.node_size, Info()).ok());
        model.clear();
        st = node.AppendSet(keys.data(), keys.size(), journal_seq);
      }
    }
    ASSERT_TRUE(st.ok()) << st.Name();
    appended++;
    for (const auto& [p, tv] : batch) {
      if (tv.first == kKeyWhiteout) {
        model.erase(p);
      } else {
        model[p] = tv.second;
      }
    }
    if (node.nsets() > 2 && rng() % 8 == 0) {
      u32 first = u32(rng() % node.nsets());
      ASSERT_TRUE(node.Compact(first).ok());
      partial++;
    }
    ExpectEqualsModel(node, model);
    if (round % 10 == 0) {
      ExpectSeeksMatchModel(node, model, rng, cfg.inodes, cfg.offsets);
      // What is written is what is read back.
      Node copy;
      Diag diag;
      NodeInfo expect = node.info();
      ASSERT_TRUE(copy.Parse(node.data(), node.node_size(), &expect, &diag).ok()) << diag.text;
      ASSERT_EQ(copy.nsets(), node.nsets());
      ExpectEqualsModel(copy, model);
    }
  }
  EXPECT_GT(appended, 0);
  // The rounds must have exercised both kinds of compaction, or they test too little.
  EXPECT_GT(compactions, 0);
  EXPECT_GT(partial, 0);
}

TEST(NodeModelTest, Small4KiBNodeWithMaxValues) { RunModelRounds({4096, 2, 20, 4, 10}, 1); }
TEST(NodeModelTest, Node64KiB) { RunModelRounds({64 * 1024, 4, 200, 40, 1}, 2); }
TEST(NodeModelTest, Node256KiBDenseShadowing) { RunModelRounds({256 * 1024, 1, 100, 60, 0}, 3); }
TEST(NodeModelTest, Node1MiB) { RunModelRounds({1024 * 1024, 8, 5000, 300, 1}, 4); }

TEST(NodeTest, ShadowingAndWhiteoutsAcrossSets) {
  Node node;
  ASSERT_TRUE(node.Init(16384, Info()).ok());
  u8 a = 'a', b = 'b', c = 'c';
  KeyInput s0[] = {{P(1, 1), kKeyValue, &a, 1}, {P(1, 2), kKeyValue, &a, 1}, {P(1, 3), kKeyValue, &a, 1}};
  KeyInput s1[] = {{P(1, 2), kKeyWhiteout, nullptr, 0}, {P(1, 3), kKeyValue, &b, 1}};
  KeyInput s2[] = {{P(1, 2), kKeyValue, &c, 1}, {P(1, 3), kKeyWhiteout, nullptr, 0}};
  ASSERT_TRUE(node.AppendSet(s0, 3, 1).ok());
  ASSERT_TRUE(node.AppendSet(s1, 2, 2).ok());
  EXPECT_FALSE(node.Find(P(1, 2)).valid());
  EXPECT_EQ(node.Find(P(1, 3)).value()[0], 'b');
  ASSERT_TRUE(node.AppendSet(s2, 2, 3).ok());
  EXPECT_EQ(node.Find(P(1, 2)).value()[0], 'c');
  EXPECT_FALSE(node.Find(P(1, 3)).valid());
  // Partial compaction of the two newest sets keeps the whiteout: it still hides 1:3
  // in set 0.
  ASSERT_TRUE(node.Compact(1).ok());
  ASSERT_EQ(node.nsets(), 2u);
  EXPECT_EQ(node.set(1).size(), 2u);
  EXPECT_EQ(node.set(1).journal_seq(), 3u);
  EXPECT_FALSE(node.Find(P(1, 3)).valid());
  NodeIter with_whiteouts(node, true);
  with_whiteouts.Seek(P(1, 3));
  ASSERT_TRUE(with_whiteouts.Valid());
  EXPECT_TRUE(with_whiteouts.key().is_whiteout());
  // Full compaction drops it and everything it hid.
  ASSERT_TRUE(node.Compact().ok());
  ASSERT_EQ(node.nsets(), 1u);
  EXPECT_EQ(node.set(0).size(), 2u);
  Model model{{{1, 1}, {'a'}}, {{1, 2}, {'c'}}};
  ExpectEqualsModel(node, model);
  // Deleting everything leaves a node with no sets.
  KeyInput del[] = {{P(1, 1), kKeyWhiteout, nullptr, 0}, {P(1, 2), kKeyWhiteout, nullptr, 0}};
  ASSERT_TRUE(node.AppendSet(del, 2, 4).ok());
  ASSERT_TRUE(node.Compact().ok());
  EXPECT_EQ(node.nsets(), 0u);
  EXPECT_EQ(node.used_bytes(), sizeof(NodeHeader));
  ExpectEqualsModel(node, {});
  Node copy;
  ASSERT_TRUE(copy.Parse(node.data(), node.node_size(), nullptr, nullptr).ok());
  EXPECT_EQ(copy.nsets(), 0u);
}

TEST(NodeTest, OneKeyAndMaxSizeKeyInEveryNodeSize) {
  for (u32 size = kMinNodeSize; size <= kMaxNodeSize; size *= 2) {
    Node node;
    ASSERT_TRUE(node.Init(size, Info()).ok());
    std::vector<u8> v(kMaxValueBytes);
    for (u32 i = 0; i < v.size(); i++) v[i] = u8(i * 7);
    KeyInput k{Pos::Max(kBtreeTest), kKeyValue, v.data(), kMaxValueBytes};
    ASSERT_TRUE(node.AppendSet(&k, 1, 1).ok());
    Node copy;
    Diag diag;
    ASSERT_TRUE(copy.Parse(node.data(), size, nullptr, &diag).ok()) << diag.text;
    KeyRef f = copy.Find(Pos::Max(kBtreeTest));
    ASSERT_TRUE(f.valid());
    EXPECT_EQ(Value(f), v);
    NodeIter it(copy);
    it.SeekForPrev(Pos::Max(kBtreeTest));
    ASSERT_TRUE(it.Valid());
    it.Prev();
    EXPECT_FALSE(it.Valid());
    // Fill with maximum-size keys until kNoSpace; the count is what the space allows.
    u32 added = 1;
    for (u64 i = 0;; i++) {
      KeyInput more{P(0, i), kKeyValue, v.data(), kMaxValueBytes};
      Status st = node.AppendSet(&more, 1, 2 + i);
      if (st.code() == Err::kNoSpace) {
        if (node.nsets() == kMaxSets) {
          ASSERT_TRUE(node.Compact().ok());
          continue;
        }
        break;
      }
      ASSERT_TRUE(st.ok());
      added++;
    }
    u32 per_key = KeySpace(kMaxValueBytes);
    u32 room = size - u32(sizeof(NodeHeader));
    // Between one set of all keys (bound) and the last compaction's layout.
    EXPECT_LE(added, (room - sizeof(SetHeader)) / per_key);
    EXPECT_GE(added, (room - kMaxSets * sizeof(SetHeader)) / per_key) << size;
    if (size == kMinNodeSize) {
      EXPECT_EQ(added, 1u);
    }
  }
}

TEST(NodeTest, RejectsBadInputWithoutChange) {
  Node node;
  EXPECT_EQ(node.Init(3000, Info()).code(), Err::kInvalidArgument);
  EXPECT_EQ(node.Init(2 * kMaxNodeSize, Info()).code(), Err::kInvalidArgument);
  EXPECT_EQ(node.Init(4096, Info(1, P(5, 0), P(4, 0))).code(), Err::kInvalidArgument);
  ASSERT_TRUE(node.Init(4096, Info(1, P(10, 0), P(20, 0))).ok());
  u8 v = 1;
  KeyInput below{P(9, 5), kKeyValue, &v, 1};
  KeyInput above{P(20, 1), kKeyValue, &v, 1};
  KeyInput ok{P(10, 0), kKeyValue, &v, 1};
  EXPECT_EQ(node.AppendSet(&below, 1, 1).code(), Err::kInvalidArgument);
  EXPECT_EQ(node.AppendSet(&above, 1, 1).code(), Err::kInvalidArgument);
  KeyInput unsorted[] = {{P(12, 0), kKeyValue, &v, 1}, {P(11, 0), kKeyValue, &v, 1}};
  EXPECT_EQ(node.AppendSet(unsorted, 2, 1).code(), Err::kInvalidArgument);
  EXPECT_EQ(node.nsets(), 0u);
  for (u32 i = 0; i < kMaxSets; i++) ASSERT_TRUE(node.AppendSet(&ok, 1, i).ok());
  EXPECT_EQ(node.AppendSet(&ok, 1, 99).code(), Err::kNoSpace);
  EXPECT_EQ(node.nsets(), kMaxSets);
  ASSERT_TRUE(node.Compact().ok());
  EXPECT_EQ(node.nsets(), 1u);
  EXPECT_EQ(node.set(0).journal_seq(), kMaxSets - 1);
}

// --- corruption -------------------------------------------------------------------

// A node with several sets, whiteouts and a spread of value sizes.
std::vector<u8> SampleNode(u32 size, u64 seed) {
  std::mt19937_64 rng(seed);
  Node node;
  EXPECT_TRUE(node.Init(size, Info(77, P(0, 0), P(100, ~u64(0)))).ok());
  for (int s = 0; s < 4; s++) {
    std::map<std::pair<u64, u64>, u32> batch;
    for (int i = 0; i < 12; i++) batch[{rng() % 100, rng() % 1000}] = u32(rng() % 60);
    std::vector<u8> val(64, u8(s));
    std::vector<KeyInput> keys;
    for (const auto& [p, len] : batch)
      keys.push_back(KeyInput{P(p.first, p.second), len < 8 ? u8(kKeyWhiteout) : u8(kKeyValue), val.data(),
                              len < 8 ? 0 : len});
    Status st = node.AppendSet(keys.data(), keys.size(), s + 1);
    EXPECT_TRUE(st.ok()) << st.Name();
  }
  return std::vector<u8>(node.data(), node.data() + node.node_size());
}

u32 UsedBytes(const std::vector<u8>& buf) {
  return reinterpret_cast<const NodeHeader*>(buf.data())->used_bytes.get();
}

TEST(NodeCorruptionTest, EveryBitFlipInUsedBytesIsDetected) {
  for (u32 size : {4096u, 16384u}) {
    std::vector<u8> good = SampleNode(size, size);
    const u32 used = UsedBytes(good);
    ASSERT_GT(used, 1000u);
    Node node;
    ASSERT_TRUE(node.Parse(good.data(), good.size(), nullptr, nullptr).ok());
    for (u32 off = 0; off < used; off++) {
      for (int bit : {0, 5}) {
        std::vector<u8> bad = good;
        bad[off] ^= u8(1 << bit);
        Diag diag;
        Status st = node.Parse(bad.data(), bad.size(), nullptr, &diag);
        ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << "byte " << off << " bit " << bit << ": " << st.Name();
        ASSERT_FALSE(diag.empty());
        ASSERT_EQ(node.nsets(), 0u);  // left empty
      }
    }
    // Bytes past used_bytes are not part of the node.
    std::vector<u8> tail = good;
    for (u32 off = used; off < tail.size(); off++) tail[off] = 0xa5;
    ASSERT_TRUE(node.Parse(tail.data(), tail.size(), nullptr, nullptr).ok());
  }
}

TEST(NodeCorruptionTest, RandomFlipsInLargeNodes) {
  std::mt19937_64 rng(9);
  for (u32 size : {256u * 1024, 1024u * 1024}) {
    std::vector<u8> good = SampleNode(size, size);
    const u32 used = UsedBytes(good);
    Node node;
    for (int i = 0; i < 300; i++) {
      std::vector<u8> bad = good;
      bad[rng() % used] ^= u8(1 + rng() % 255);
      ASSERT_TRUE(node.Parse(bad.data(), bad.size(), nullptr, nullptr).Is(ErrorClass::kCorrupt));
    }
  }
}

// Re-seals every checksum, walking the sets as far as their headers allow, so a test
// can plant a bad field that only validation (not the checksum) can catch.
void Reseal(std::vector<u8>& buf) {
  auto* h = reinterpret_cast<NodeHeader*>(buf.data());
  u32 used = std::min<u32>(h->used_bytes.get(), u32(buf.size()));
  u32 off = sizeof(NodeHeader);
  for (u32 i = 0; i < h->nsets.get() && off + sizeof(SetHeader) <= used; i++) {
    auto* sh = reinterpret_cast<SetHeader*>(buf.data() + off);
    u32 bytes = sh->bytes.get();
    if (bytes < sizeof(SetHeader) || bytes > used - off) break;
    sh->csum.set(platform::Crc32cSkippingField(sh, bytes, __builtin_offsetof(SetHeader, csum)));
    off += bytes;
  }
  h->csum.set(platform::Crc32cSkippingField(h, sizeof(NodeHeader), __builtin_offsetof(NodeHeader, csum)));
}

SetHeader* FirstSet(std::vector<u8>& buf) { return reinterpret_cast<SetHeader*>(buf.data() + sizeof(NodeHeader)); }
KeyHeader* Key(std::vector<u8>& buf, u32 n) {
  u8* p = buf.data() + sizeof(NodeHeader) + sizeof(SetHeader);
  for (u32 i = 0; i < n; i++) p += KeySpace(reinterpret_cast<KeyHeader*>(p)->val_bytes.get());
  return reinterpret_cast<KeyHeader*>(p);
}

struct FieldCase {
  const char* name;
  Err err;
  const char* diag_has;
  void (*edit)(std::vector<u8>&);
};

TEST(NodeCorruptionTest, InvalidFieldsUnderValidChecksums) {
  const FieldCase cases[] = {
      {"version", Err::kBadVersion, "version", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->version.set(2); }},
      {"node_size", Err::kCorrupt, "node_size",
       [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->node_size.set(16384); }},
      {"used_bytes big", Err::kCorrupt, "used_bytes",
       [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->used_bytes.set(u32(b.size()) + 8); }},
      {"used_bytes short", Err::kCorrupt, "", [](auto& b) {
         auto* h = reinterpret_cast<NodeHeader*>(b.data());
         h->used_bytes.set(h->used_bytes.get() - 8);
       }},
      {"nsets", Err::kCorrupt, "set count", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->nsets.set(kMaxSets + 1); }},
      {"fewer sets", Err::kCorrupt, "used_bytes", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->nsets.set(1); }},
      {"flags", Err::kCorrupt, "reserved", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->flags.set(1); }},
      {"btree id", Err::kCorrupt, "btree id", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->btree_id = kNrBtreeIds; }},
      {"level", Err::kCorrupt, "level", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->level = kMaxLevel + 1; }},
      {"min > max", Err::kCorrupt, "range", [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->min_inode.set(101); }},
      {"key below min", Err::kCorrupt, "outside the node's range",
       [](auto& b) { reinterpret_cast<NodeHeader*>(b.data())->min_inode.set(99); }},
      {"set magic", Err::kCorrupt, "set magic", [](auto& b) { FirstSet(b)->magic.set(kSetMagic); }},
      {"set bytes", Err::kCorrupt, "set size", [](auto& b) { FirstSet(b)->bytes.set(1u << 30); }},
      {"set bytes unaligned", Err::kCorrupt, "set size", [](auto& b) { FirstSet(b)->bytes.set(FirstSet(b)->bytes.get() - 4); }},
      {"key_bytes", Err::kCorrupt, "past the set", [](auto& b) { FirstSet(b)->key_bytes.set(FirstSet(b)->bytes.get()); }},
      {"nkeys zero", Err::kCorrupt, "empty set", [](auto& b) { FirstSet(b)->nkeys.set(0); }},
      {"nkeys small", Err::kCorrupt, "key count", [](auto& b) { FirstSet(b)->nkeys.set(FirstSet(b)->nkeys.get() - 1); }},
      {"nkeys big", Err::kCorrupt, "past the end", [](auto& b) { FirstSet(b)->nkeys.set(FirstSet(b)->nkeys.get() + 1); }},
      {"val_bytes huge", Err::kCorrupt, "maximum", [](auto& b) { Key(b, 2)->val_bytes.set(0xffff); }},
      {"val_bytes past", Err::kCorrupt, "past the end", [](auto& b) { Key(b, 2)->val_bytes.set(kMaxValueBytes); }},
      {"key btree", Err::kCorrupt, "another btree", [](auto& b) { Key(b, 1)->btree_id = kBtreeInodes; }},
      {"key type", Err::kCorrupt, "key type", [](auto& b) { Key(b, 1)->type = 0; }},
      {"key type unknown", Err::kCorrupt, "key type", [](auto& b) { Key(b, 1)->type = kNrKeyTypes; }},
      {"key reserved", Err::kCorrupt, "reserved", [](auto& b) { Key(b, 1)->reserved.set(1); }},
      {"key order", Err::kCorrupt, "out of order", [](auto& b) {
         Key(b, 1)->inode.set(Key(b, 0)->inode.get());
         Key(b, 1)->offset.set(Key(b, 0)->offset.get());
       }},
      {"key outside", Err::kCorrupt, "outside", [](auto& b) { Key(b, 0)->inode.set(~u64(0)); }},
  };
  const std::vector<u8> good = SampleNode(8192, 3);
  for (const FieldCase& c : cases) {
    std::vector<u8> bad = good;
    c.edit(bad);
    Reseal(bad);
    Node node;
    Diag diag;
    Status st = node.Parse(bad.data(), bad.size(), nullptr, &diag);
    EXPECT_EQ(st.code(), c.err) << c.name << ": " << st.Name() << " " << diag.text;
    EXPECT_NE(std::string(diag.text).find(c.diag_has), std::string::npos) << c.name << ": " << diag.text;
  }
  // A whiteout with a value: turn the first key that has a value into a whiteout.
  std::vector<u8> bad = good;
  u32 i = 0;
  while (Key(bad, i)->val_bytes.get() == 0) i++;
  ASSERT_LT(i, FirstSet(bad)->nkeys.get());
  Key(bad, i)->type = kKeyWhiteout;
  Reseal(bad);
  Node node;
  Diag diag;
  EXPECT_EQ(node.Parse(bad.data(), bad.size(), nullptr, &diag).code(), Err::kCorrupt);
  EXPECT_NE(std::string(diag.text).find("whiteout with a value"), std::string::npos) << diag.text;
}

TEST(NodeCorruptionTest, ExpectedIdentityAndBufferSize) {
  std::vector<u8> good = SampleNode(8192, 4);
  Node node;
  NodeInfo expect = Info(77, P(0, 0), P(100, ~u64(0)));
  ASSERT_TRUE(node.Parse(good.data(), good.size(), &expect, nullptr).ok());
  expect.seq = 78;
  Diag diag;
  EXPECT_EQ(node.Parse(good.data(), good.size(), &expect, &diag).code(), Err::kCorrupt);
  EXPECT_NE(std::string(diag.text).find("parent"), std::string::npos);
  EXPECT_EQ(node.Parse(good.data(), 4096, nullptr, nullptr).code(), Err::kCorrupt);  // node_size mismatch
  EXPECT_EQ(node.Parse(good.data(), 100, nullptr, nullptr).code(), Err::kInvalidArgument);
  std::vector<u8> zero(8192, 0);
  EXPECT_EQ(node.Parse(zero.data(), zero.size(), nullptr, nullptr).code(), Err::kBadMagic);
}

TEST(NodeCorruptionTest, RandomGarbageUnderValidChecksumsNeverCrashes) {
  std::mt19937_64 rng(11);
  const std::vector<u8> good = SampleNode(4096, 5);
  const u32 used = UsedBytes(good);
  int accepted = 0;
  for (int i = 0; i < 20000; i++) {
    std::vector<u8> bad = good;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; e++) bad[rng() % used] = u8(rng());
    Reseal(bad);
    Node node;
    Status st = node.Parse(bad.data(), bad.size(), nullptr, nullptr);
    if (st.ok()) {
      // Whatever passed validation must be fully usable.
      accepted++;
      NodeIter it(node);
      for (it.SeekToFirst(); it.Valid(); it.Next()) ASSERT_TRUE(node.Find(it.pos()).valid());
      for (it.SeekToLast(); it.Valid(); it.Prev()) {
      }
      ASSERT_TRUE(node.Compact().ok());
    } else {
      ASSERT_TRUE(st.Is(ErrorClass::kCorrupt)) << st.Name();
    }
  }
  ::testing::Test::RecordProperty("accepted", accepted);
}

}  // namespace
}  // namespace tfs::btree

namespace tfs::btree {
namespace {

// Single-key updates through the open set: thousands of random sets and deletes
// (forcing new open sets, partial and full compactions) against the model, then
// split points, building nodes from ranges, and a write image that parses under
// its new seq with the same contents.
TEST(NodeUpsertTest, RandomUpsertsMatchModelAndImageRoundTrips) {
  for (u32 node_size : {4096u, 65536u, 262144u}) {
    SCOPED_TRACE(node_size);
    std::mt19937_64 rng(node_size);
    Node node;
    ASSERT_TRUE(node.Init(node_size, Info(77)).ok());
    Model model;
    const u64 keyspace = node_size / 64;
    u32 refused = 0;
    for (int i = 0; i < 20000; i++) {
      std::pair<u64, u64> k{rng() % 4, rng() % keyspace};
      KeyInput in;
      in.pos = P(k.first, k.second);
      std::vector<u8> v;
      if (rng() % 4 == 0) {
        in.type = kKeyWhiteout;
      } else {
        v.resize(rng() % 3 == 0 ? rng() % 200 : 8);
        for (auto& b : v) b = u8(rng());
        in.value = v.data();
        in.val_bytes = u32(v.size());
      }
      Status st = node.Upsert(in, u64(i + 1));
      if (st.code() == Err::kNoSpace) {
        refused++;
        // Nothing changed (a full node refuses even a whiteout: the tree splits it).
        if (i % 50 == 0) ExpectEqualsModel(node, model);
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.Message();
      if (in.type == kKeyWhiteout) {
        model.erase(k);
      } else {
        model[k] = v;
      }
      ASSERT_LE(node.nsets(), kMaxSets);
      if (i % 997 == 0) ExpectEqualsModel(node, model);
    }
    ExpectEqualsModel(node, model);
    ASSERT_EQ(node.CountKeys(), model.size());
    if (node_size == 4096) {
      EXPECT_GT(refused, 0u);
    }

    // The write image parses under the new seq with the same contents.
    std::vector<u8> img(node_size + 4096);
    u8* dst = reinterpret_cast<u8*>((uptr(img.data()) + 4095) & ~uptr(4095));
    u32 bytes = node.WriteImage(dst, 991);
    ASSERT_EQ(bytes % 4096, 0u);
    ASSERT_GE(bytes, node.used_bytes());
    Node parsed;
    Diag diag;
    NodeInfo expect = Info(991);
    ASSERT_TRUE(parsed.Parse(dst, node_size, &expect, &diag).ok()) << diag.text;
    ExpectEqualsModel(parsed, model);
    // The old seq no longer describes those bytes.
    NodeInfo old = Info(77);
    ASSERT_FALSE(parsed.Parse(dst, node_size, &old, nullptr).ok());
    node.SetSeq(991);
    ASSERT_EQ(node.info().seq, 991u);
    ExpectEqualsModel(node, model);

    // Split and rebuild: the two halves hold exactly the model, split by key.
    if (model.size() >= 2) {
      Pos mid;
      ASSERT_TRUE(node.SplitPoint(1, 2, &mid));
      NodeInfo l = Info(5, Pos::Min(kBtreeTest), mid);
      NodeInfo r = Info(6, Pos{kBtreeTest, mid.inode, mid.offset + 1}, Pos::Max(kBtreeTest));
      if (mid.offset == ~u64(0)) r.min = Pos{kBtreeTest, mid.inode + 1, 0};
      const Node* src[] = {&node};
      Node left, right;
      ASSERT_TRUE(left.InitFrom(node_size, l, src, 1).ok());
      ASSERT_TRUE(right.InitFrom(node_size, r, src, 1).ok());
      ASSERT_GT(left.CountKeys(), 0u);
      ASSERT_GT(right.CountKeys(), 0u);
      ASSERT_EQ(left.CountKeys() + right.CountKeys(), model.size());
      const Node* both[] = {&left, &right};
      Node merged;
      Status st = merged.InitFrom(node_size, Info(8), both, 2);
      ASSERT_TRUE(st.ok()) << st.Message();
      ExpectEqualsModel(merged, model);
    }
  }
}

}  // namespace
}  // namespace tfs::btree

namespace tfs::btree {
namespace {

// A 4 KiB node holds one key of the largest size: replacing it with a new
// version of the same size must succeed in place; a second such key must not fit.
TEST(NodeUpsertTest, FullNodeReplacesItsOnlyLargestKey) {
  Node node;
  ASSERT_TRUE(node.Init(4096, Info(3)).ok());
  std::vector<u8> v(kMaxValueBytes, 0xab);
  KeyInput in;
  in.pos = P(1, 1);
  in.value = v.data();
  in.val_bytes = kMaxValueBytes;
  ASSERT_TRUE(node.Upsert(in, 1).ok());
  for (int i = 0; i < 5; i++) {
    v.assign(kMaxValueBytes, u8(i));
    ASSERT_TRUE(node.Upsert(in, 2 + i).ok()) << i;
    KeyRef k = node.Find(P(1, 1));
    ASSERT_TRUE(k.valid());
    ASSERT_EQ(k.value()[kMaxValueBytes - 1], u8(i));
  }
  in.pos = P(1, 2);
  ASSERT_EQ(node.Upsert(in, 9).code(), Err::kNoSpace);
  ASSERT_EQ(node.CountKeys(), 1u);
}

// Ascending keys are appends to the open set: it grows past kOpenSetBytes (an
// append moves nothing), so a node fills without starting sets or compacting;
// then an insert in the middle starts a new set and the big one is sealed
// (Eytzinger-indexed) with every key still found.
TEST(NodeUpsertTest, AscendingUpsertsFillOneOpenSet) {
  Node node;
  ASSERT_TRUE(node.Init(65536, Info(5)).ok());
  u64 n = 0;
  for (;; n++) {
    u64 v = n * 3;
    KeyInput in;
    in.pos = P(1, 2 * n);
    in.value = &v;
    in.val_bytes = sizeof(v);
    Status st = node.Upsert(in, n + 1);
    if (st.code() == Err::kNoSpace) break;
    ASSERT_TRUE(st.ok()) << st.Message();
  }
  EXPECT_GT(n * KeySpace(8), 20 * kOpenSetBytes);
  EXPECT_EQ(node.nsets(), 1u);
  EXPECT_EQ(node.compactions(), 0u) << "a node filled by appends has nothing to merge";
  EXPECT_TRUE(node.set(0).open());
  Model model;
  for (u64 i = 0; i < n; i++) {
    std::vector<u8> v(8);
    u64 x = i * 3;
    memcpy(v.data(), &x, 8);
    model[{1, 2 * i}] = v;
  }
  ExpectEqualsModel(node, model);
  // Deleting the last keys makes room; a key in the middle then goes to a new
  // set (after a compaction drops the whiteouts), the old one sealed.
  for (u64 i = n - 4; i < n; i++) {
    KeyInput del;
    del.pos = P(1, 2 * i);
    del.type = kKeyWhiteout;
    ASSERT_TRUE(node.Upsert(del, n + 1).ok());  // replaces the key in place
    model.erase({1, 2 * i});
  }
  u64 v = 7;
  KeyInput mid;
  mid.pos = P(1, 1);
  mid.value = &v;
  mid.val_bytes = sizeof(v);
  Status st = node.Upsert(mid, n + 2);
  ASSERT_TRUE(st.ok()) << st.Message();
  model[{1, 1}] = std::vector<u8>(reinterpret_cast<u8*>(&v), reinterpret_cast<u8*>(&v) + 8);
  EXPECT_EQ(node.nsets(), 2u);
  EXPECT_FALSE(node.set(0).open());
  ExpectEqualsModel(node, model);
}

}  // namespace
}  // namespace tfs::btree
