/*
 * An in-memory block device written in C against tfs_block_device.h, for tests
 * of the C device path (tfs::CBlockDevice): what the kernel module's bio-backed
 * device does, with pthreads in place of bios.
 *
 * Completions come inline (inside submit), from one worker thread, or
 * alternately one and the other; with a volatile cache, writes stay lost on
 * tfs_c_mem_crash() until a flush or a FUA write made them durable. Requests
 * wait for the worker in a FIFO linked through their device_private[0], so
 * submit never allocates, as the contract asks of every C device.
 *
 * Thread safety: submit and every function here from any thread, except that
 * destroy and crash wait for queued requests and must not race with submit.
 * Compiled as strict C11 (the test target builds it with -std=c11 -pedantic).
 */
#ifndef TFS_USERSPACE_PLATFORM_C_MEM_DEVICE_H_
#define TFS_USERSPACE_PLATFORM_C_MEM_DEVICE_H_

#include "platform/tfs_block_device.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tfs_c_mem_completion {
  TFS_C_MEM_INLINE = 0,    /* complete inside submit */
  TFS_C_MEM_THREAD = 1,    /* complete on the device's worker thread */
  TFS_C_MEM_ALTERNATE = 2  /* odd requests inline, even ones on the worker */
};

struct tfs_c_mem_options {
  const char* name;
  tfs_u64 size;
  tfs_u32 logical_block_size;
  tfs_bool read_only;
  tfs_bool supports_fua;
  tfs_bool supports_discard;
  tfs_bool volatile_cache;
  int completion; /* enum tfs_c_mem_completion */
  /* Said in the info: false (a zeroed options) plays the kernel's bio device,
   * whose completions may not submit; the I/O queue defers what they free. */
  tfs_bool completions_may_submit;
};

/* Requests the device received (after the adapter's checks), by op and origin. */
struct tfs_c_mem_stats {
  tfs_u64 ops[TFS_BLOCK_DISCARD + 1];
  tfs_u64 by_origin[TFS_IO_OTHER + 1];
  tfs_u64 fua_writes;
  tfs_u64 bad_requests; /* ones the contract says never come: completed -EINVAL */
};

/* Returns the device, or null when out of memory or the options are unusable. */
struct tfs_block_device* tfs_c_mem_create(const struct tfs_c_mem_options* options);
void tfs_c_mem_destroy(struct tfs_block_device* dev);
/* The next request of `op` completes with `error` (a negative errno) and does
 * nothing. */
void tfs_c_mem_fail_next(struct tfs_block_device* dev, int op, int error);
/* Power cut: every write not yet made durable is lost. */
void tfs_c_mem_crash(struct tfs_block_device* dev);
void tfs_c_mem_get_stats(struct tfs_block_device* dev, struct tfs_c_mem_stats* out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TFS_USERSPACE_PLATFORM_C_MEM_DEVICE_H_ */
