// Intrusive doubly linked list: the element embeds a ListNode, so linking and
// unlinking never allocate and cannot fail (queues of I/O requests, LRU lists).
//
//   struct Req { ListNode link; ... };
//   IntrusiveList<Req, &Req::link> queue;
//
// Not thread-safe: the owner's lock guards the list and every node on it. A node is
// on at most one list at a time; Unlink() leaves it self-linked (linked() false).
#ifndef TFS_UTIL_LIST_H_
#define TFS_UTIL_LIST_H_

#include "platform/types.h"

namespace tfs {

struct ListNode {
  ListNode* prev = this;
  ListNode* next = this;

  ListNode() = default;
  ListNode(const ListNode&) = delete;
  ListNode& operator=(const ListNode&) = delete;

  bool linked() const { return next != this; }
  void Unlink() {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }
};

template <typename T, ListNode T::*Member>
class IntrusiveList {
 public:
  IntrusiveList() = default;
  IntrusiveList(const IntrusiveList&) = delete;
  IntrusiveList& operator=(const IntrusiveList&) = delete;

  bool empty() const { return !head_.linked(); }
  usize size() const { return size_; }

  void PushBack(T* item) { InsertBefore(&head_, item); }
  void PushFront(T* item) { InsertBefore(head_.next, item); }
  T* front() const { return empty() ? nullptr : FromNode(head_.next); }
  T* back() const { return empty() ? nullptr : FromNode(head_.prev); }
  T* PopFront() {
    T* item = front();
    if (item != nullptr) Remove(item);
    return item;
  }
  void Remove(T* item) {
    (item->*Member).Unlink();
    size_--;
  }
  // Next element after `item`, or null at the end.
  T* Next(T* item) const {
    ListNode* n = (item->*Member).next;
    return n == &head_ ? nullptr : FromNode(n);
  }

 private:
  void InsertBefore(ListNode* pos, T* item) {
    ListNode* node = &(item->*Member);
    node->prev = pos->prev;
    node->next = pos;
    pos->prev->next = node;
    pos->prev = node;
    size_++;
  }
  static T* FromNode(const ListNode* node) {
    // Offset of the member, computed on a dummy address (no object is touched).
    const uptr offset = reinterpret_cast<uptr>(&(reinterpret_cast<T*>(uptr(4096))->*Member)) - 4096;
    return reinterpret_cast<T*>(reinterpret_cast<uptr>(node) - offset);
  }

  ListNode head_;
  usize size_ = 0;
};

}  // namespace tfs

#endif  // TFS_UTIL_LIST_H_
