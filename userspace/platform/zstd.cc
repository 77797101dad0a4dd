// zstd for the seam, on libzstd's one-shot API. Errors become negative errnos:
// -ENOSPC when the output does not fit, -EBADMSG for corrupt input, -ENOMEM when
// libzstd cannot allocate its context.
#include <errno.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "platform/platform.h"

extern "C" {

usize tfs_plat_zstd_bound(usize src_len) { return ZSTD_compressBound(src_len); }

isize tfs_plat_zstd_compress(void* dst, usize dst_cap, const void* src, usize src_len,
                             int level) {
  size_t n = ZSTD_compress(dst, dst_cap, src, src_len, level);
  if (!ZSTD_isError(n)) return isize(n);
  switch (ZSTD_getErrorCode(n)) {
    case ZSTD_error_dstSize_tooSmall: return -ENOSPC;
    case ZSTD_error_memory_allocation: return -ENOMEM;
    default: return -EINVAL;
  }
}

isize tfs_plat_zstd_decompress(void* dst, usize dst_cap, const void* src, usize src_len) {
  size_t n = ZSTD_decompress(dst, dst_cap, src, src_len);
  if (!ZSTD_isError(n)) return isize(n);
  switch (ZSTD_getErrorCode(n)) {
    case ZSTD_error_dstSize_tooSmall: return -ENOSPC;
    case ZSTD_error_memory_allocation: return -ENOMEM;
    default: return -EBADMSG;
  }
}

}  // extern "C"
