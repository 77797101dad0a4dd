/*
 * tfs_block_device: the block device interface in plain C.
 *
 * What it is for: the kernel module's glue implements its bio-backed device
 * in C against kernel headers; the core sees that device as an ordinary
 * tfs::BlockDevice through the adapter tfs::CBlockDevice
 * (platform/c_block_device.h). This header is the whole contract between
 * the two; it compiles as C11 and as C++, includes nothing, and uses no libc.
 *
 * The C side fills a struct tfs_block_device (ops, priv, info, name) and keeps
 * it alive and unchanged for as long as the core uses it; the core reads
 * `info` once, when the adapter is made. The core calls ops->submit(dev, req)
 * for each request. Rules for the C side:
 *  - submit never waits for I/O. It may sleep for memory (GFP_NOIO), never
 *    for another request's completion.
 *  - Every request the core submits is valid: op known, offset and length
 *    multiples of info.logical_block_size and inside info.size, no write or
 *    discard to a read-only device, no discard unless supports_discard (the
 *    adapter checks first and fails bad requests itself).
 *  - req->complete(req, error) is called exactly once per request, with 0 or a
 *    negative Linux errno (-EIO, -ETIMEDOUT, -ENOSPC...), from any context: in
 *    submit itself, another thread, or interrupt context (a bio's end_io).
 *    info.completions_may_submit says whether the core may call submit from
 *    inside complete: false for a device whose completions may run in
 *    interrupt context (the core then submits from its own worker thread),
 *    true where they always run on an ordinary thread.
 *    From that call on the C side never touches req again: the request and
 *    its buffer may be reused, even submitted again, or freed before complete
 *    returns. An error is final: a transient one (-EAGAIN) the device retries.
 *  - No ordering: requests complete in any order, and nothing submitted earlier
 *    is durable, or even done, before a later one unless the core waited for it.
 *    A flush makes durable every write that completed before the flush was
 *    submitted; a write with TFS_BLOCK_FUA is durable when it completes, on
 *    every device (emulate it with write + flush if the hardware cannot).
 *  - buf (length bytes; none for flush and discard) belongs to the device from
 *    submit until complete: the core neither reads nor writes it meanwhile,
 *    and it may have any alignment (a device that needs more bounces it).
 *  - origin says who asked (enum tfs_io_origin); count by it, never change it.
 *
 * The values of every enum below equal tfs::IoOp, IoRequest::kFua and
 * tfs::IoOrigin; c_block_device.cc asserts it.
 */
#ifndef TFS_PLATFORM_TFS_BLOCK_DEVICE_H_
#define TFS_PLATFORM_TFS_BLOCK_DEVICE_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Fixed-width types from the compiler, so no libc or kernel header is needed
 * (and none is clashed with: the kernel's u64 is another type). */
typedef __UINT8_TYPE__ tfs_u8;
typedef __UINT32_TYPE__ tfs_u32;
typedef __UINT64_TYPE__ tfs_u64;
#ifdef __cplusplus
typedef bool tfs_bool;
#else
typedef _Bool tfs_bool;
#endif

enum tfs_block_op {
  TFS_BLOCK_READ = 0,
  TFS_BLOCK_WRITE = 1,
  TFS_BLOCK_FLUSH = 2,   /* offset, length and buf are 0 */
  TFS_BLOCK_DISCARD = 3  /* the range reads back unspecified; buf is null */
};

/* tfs_block_request.flags */
#define TFS_BLOCK_FUA 1u /* writes only: durable when it completes */

enum tfs_io_origin {
  TFS_IO_FOREGROUND_READ = 0,
  TFS_IO_FOREGROUND_WRITE = 1,
  TFS_IO_JOURNAL = 2,
  TFS_IO_BTREE = 3,
  TFS_IO_RECONCILE = 4,
  TFS_IO_PROMOTE = 5,
  TFS_IO_COPYGC = 6,
  TFS_IO_READAHEAD = 7,
  TFS_IO_SUPERBLOCK = 8,
  TFS_IO_FSCK = 9,
  TFS_IO_ALLOC = 10,
  TFS_IO_OTHER = 11
};

/* One request. The core owns the memory (it lives inside the core's own
 * request, so submitting allocates nothing); the device owns the contents
 * from submit until it calls complete. */
struct tfs_block_request {
  tfs_u8 op;     /* enum tfs_block_op */
  tfs_u8 flags;  /* TFS_BLOCK_FUA */
  tfs_u8 origin; /* enum tfs_io_origin */
  tfs_u64 offset; /* bytes */
  tfs_u64 length; /* bytes */
  void* buf;
  /* Called by the device exactly once; error is 0 or a negative errno. */
  void (*complete)(struct tfs_block_request* req, int error);
  /* Scratch for the device between submit and complete (a queue link, a count
   * of bios outstanding...); the core clears it before submit. */
  void* device_private[2];
};

/* Static facts about a device, field for field tfs::BlockDeviceInfo
 * (platform/block_device.h). A field added there is one line here. */
#define TFS_BLOCK_DEVICE_INFO_FIELDS(X)                                           \
  X(tfs_u64, size)               /* bytes, a multiple of logical_block_size */    \
  X(tfs_u32, logical_block_size) /* a power of two: the unit of offset, length */ \
  X(tfs_bool, read_only)         /* writes and discards are refused */            \
  X(tfs_bool, supports_fua)      /* false: FUA costs a flush (see the rules) */   \
  X(tfs_bool, supports_discard)                                                   \
  X(tfs_bool, completions_may_submit) /* see the rules above */

#define TFS_BLOCK_DEVICE_INFO_MEMBER(type, name) type name;
struct tfs_block_device_info {
  TFS_BLOCK_DEVICE_INFO_FIELDS(TFS_BLOCK_DEVICE_INFO_MEMBER)
};
#undef TFS_BLOCK_DEVICE_INFO_MEMBER

struct tfs_block_device;

struct tfs_block_device_ops {
  /* Starts req (see the rules above). Safe from any number of threads at once. */
  void (*submit)(struct tfs_block_device* dev, struct tfs_block_request* req);
};

struct tfs_block_device {
  const struct tfs_block_device_ops* ops;
  void* priv; /* the C side's own state; the core never touches it */
  struct tfs_block_device_info info;
  const char* name; /* for logs and stats: "/dev/sdb", "nvme0n1p2" */
};

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TFS_PLATFORM_TFS_BLOCK_DEVICE_H_ */
