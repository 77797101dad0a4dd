// Explicit instantiations of the header-only containers, so that the kernel-safe
// check compiles their code with kernel flags even before a core subsystem uses
// them (templates that are never instantiated are never really compiled).
#include "util/list.h"
#include "util/vector.h"

namespace tfs {

template class Vector<u64>;

struct InstantiatedListItem {
  ListNode link;
};
template class IntrusiveList<InstantiatedListItem, &InstantiatedListItem::link>;

}  // namespace tfs
