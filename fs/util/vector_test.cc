#include "util/vector.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "util/list.h"

namespace tfs {
namespace {

TEST(VectorTest, GrowsAndKeepsElements) {
  Vector<int> v;
  for (int i = 0; i < 1000; i++) ASSERT_TRUE(v.PushBack(i).ok());
  ASSERT_EQ(v.size(), 1000u);
  for (int i = 0; i < 1000; i++) EXPECT_EQ(v[i], i);
  v.Erase(0);
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v.size(), 999u);
  v.PopBack();
  EXPECT_EQ(v.back(), 998);
  ASSERT_TRUE(v.Resize(10).ok());
  EXPECT_EQ(v.size(), 10u);
  ASSERT_TRUE(v.Resize(20).ok());
  EXPECT_EQ(v[19], 0);
}

TEST(VectorTest, MovesNonTrivialTypesWithoutLeaks) {
  Vector<std::string> v;
  for (int i = 0; i < 100; i++) ASSERT_TRUE(v.EmplaceBack(std::string(50, char('a' + i % 26))).ok());
  Vector<std::string> w = std::move(v);
  EXPECT_TRUE(v.empty());
  ASSERT_EQ(w.size(), 100u);
  EXPECT_EQ(w[27], std::string(50, 'b'));
  Vector<std::string> copy;
  ASSERT_TRUE(copy.CopyFrom(w).ok());
  EXPECT_EQ(copy[99], w[99]);
  int n = 0;
  for (const std::string& s : copy) n += int(s.size());
  EXPECT_EQ(n, 5000);
}

TEST(VectorTest, AppendCopiesBlocksOfTrivialAndOtherTypes) {
  Vector<u8> b;
  const u8 chunk[5] = {1, 2, 3, 4, 5};
  for (int i = 0; i < 300; i++) ASSERT_TRUE(b.Append(chunk, 1 + i % 5).ok());
  usize at = 0;
  for (int i = 0; i < 300; i++)
    for (int j = 0; j < 1 + i % 5; j++) ASSERT_EQ(b[at++], chunk[j]);
  EXPECT_EQ(b.size(), at);
  ASSERT_TRUE(b.Append(nullptr, 0).ok());
  EXPECT_EQ(b.size(), at);
  Vector<std::string> s;
  const std::string words[2] = {"alpha", "beta"};
  ASSERT_TRUE(s.Append(words, 2).ok());
  ASSERT_TRUE(s.Append(words, 1).ok());
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1], "beta");
  EXPECT_EQ(s[2], "alpha");
}

TEST(VectorTest, GrowAtLeastDoubles) {
  Vector<u32> v;
  ASSERT_TRUE(v.Grow(1).ok());
  EXPECT_GE(v.capacity(), 8u);
  const usize cap = v.capacity();
  ASSERT_TRUE(v.Grow(cap).ok());
  EXPECT_EQ(v.capacity(), cap);  // enough room already: nothing allocated
  ASSERT_TRUE(v.Grow(cap + 1).ok());
  EXPECT_GE(v.capacity(), 2 * cap);
  ASSERT_TRUE(v.Grow(10 * cap).ok());
  EXPECT_GE(v.capacity(), 10 * cap);
  EXPECT_TRUE(v.empty());
}

TEST(VectorTest, ReserveFailsCleanlyOnAbsurdSize) {
  Vector<u64> v;
  Status st = v.Reserve(usize(-1) / 4);
  EXPECT_TRUE(st.Is(ErrorClass::kNoMemory));
  EXPECT_TRUE(v.empty());
}

struct Item {
  int value;
  ListNode link;
  explicit Item(int v) : value(v) {}
};

TEST(ListTest, PushPopRemoveInOrder) {
  IntrusiveList<Item, &Item::link> list;
  std::unique_ptr<Item> items[5];
  for (int i = 0; i < 5; i++) {
    items[i] = std::make_unique<Item>(i);
    list.PushBack(items[i].get());
  }
  EXPECT_EQ(list.size(), 5u);
  list.Remove(items[2].get());
  EXPECT_FALSE(items[2]->link.linked());
  list.PushFront(items[2].get());
  int expect[] = {2, 0, 1, 3, 4};
  int i = 0;
  for (Item* it = list.front(); it != nullptr; it = list.Next(it)) EXPECT_EQ(it->value, expect[i++]);
  EXPECT_EQ(i, 5);
  EXPECT_EQ(list.back()->value, 4);
  while (Item* it = list.PopFront()) EXPECT_FALSE(it->link.linked());
  EXPECT_TRUE(list.empty());
}

}  // namespace
}  // namespace tfs
