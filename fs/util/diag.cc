// Error explanations (see diag.h).
#include "util/diag.h"

namespace tfs {

Status DiagError(Diag* diag, Status st, const char* fmt, ...) {
  if (diag != nullptr) {
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    tfs_plat_vsnprintf(diag->text, sizeof(diag->text), fmt, ap);
    __builtin_va_end(ap);
  }
  return st;
}

}  // namespace tfs
