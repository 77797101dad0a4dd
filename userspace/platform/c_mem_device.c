/*
 * The in-memory C device (c_mem_device.h). Writes land in `current`; with a
 * volatile cache they also mark their blocks dirty until a flush (or, for its
 * own blocks, a FUA write) copies them to `durable`, and a crash copies the
 * durable blocks back. One mutex guards the images, the FIFO and the counters;
 * it is never held while a completion runs (a completion may submit again).
 * A device whose info says its completions may not submit plays the kernel's:
 * a submit to it from inside any C memory device's completion aborts.
 */
#define _POSIX_C_SOURCE 200809L

#include "userspace/platform/c_mem_device.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device whose completion this thread is inside (NULL: none). */
static _Thread_local const void* completing;

struct c_mem {
  struct tfs_block_device dev; /* dev.priv points back here */
  struct tfs_c_mem_options options;
  unsigned char* current;
  unsigned char* durable;  /* volatile cache only */
  unsigned char* dirty;    /* per block, volatile cache only */
  pthread_mutex_t mu;
  pthread_cond_t work;     /* the FIFO has requests, or stop */
  pthread_cond_t idle;     /* the FIFO is empty and the worker runs nothing */
  struct tfs_block_request* head;
  struct tfs_block_request* tail;
  int executing;
  int stop;
  pthread_t worker;
  tfs_u64 submitted;
  int fail_next[TFS_BLOCK_DISCARD + 1];
  struct tfs_c_mem_stats stats;
};

static struct c_mem* of(struct tfs_block_device* dev) { return dev->priv; }

static void make_durable(struct c_mem* m, tfs_u64 first, tfs_u64 count) {
  tfs_u64 lbs = m->options.logical_block_size;
  tfs_u64 b;
  for (b = first; b < first + count; b++) {
    if (!m->dirty[b]) continue;
    memcpy(m->durable + b * lbs, m->current + b * lbs, lbs);
    m->dirty[b] = 0;
  }
}

static int valid(const struct c_mem* m, const struct tfs_block_request* r) {
  tfs_u64 lbs = m->options.logical_block_size;
  if (r->op > TFS_BLOCK_DISCARD || r->origin > TFS_IO_OTHER) return 0;
  if ((r->flags & ~TFS_BLOCK_FUA) != 0 || ((r->flags & TFS_BLOCK_FUA) && r->op != TFS_BLOCK_WRITE)) return 0;
  if (r->op == TFS_BLOCK_FLUSH) return r->length == 0 && r->buf == NULL;
  if (r->op != TFS_BLOCK_READ && m->options.read_only) return 0;
  if (r->op == TFS_BLOCK_DISCARD && (!m->options.supports_discard || r->buf != NULL)) return 0;
  if (r->op != TFS_BLOCK_DISCARD && r->buf == NULL) return 0;
  if (r->length == 0 || r->offset % lbs != 0 || r->length % lbs != 0) return 0;
  return r->offset <= m->options.size && r->length <= m->options.size - r->offset;
}

/* Performs one request and completes it (mu not held). */
static void execute(struct c_mem* m, struct tfs_block_request* r) {
  int error = 0;
  pthread_mutex_lock(&m->mu);
  if (!valid(m, r)) {
    m->stats.bad_requests++;
    error = -EINVAL;
  } else {
    tfs_u64 lbs = m->options.logical_block_size;
    m->stats.ops[r->op]++;
    m->stats.by_origin[r->origin]++;
    if (m->fail_next[r->op] != 0) {
      error = m->fail_next[r->op];
      m->fail_next[r->op] = 0;
    } else if (r->op == TFS_BLOCK_READ) {
      memcpy(r->buf, m->current + r->offset, r->length);
    } else if (r->op == TFS_BLOCK_FLUSH) {
      if (m->options.volatile_cache) make_durable(m, 0, m->options.size / lbs);
    } else {
      if (r->op == TFS_BLOCK_WRITE) {
        memcpy(m->current + r->offset, r->buf, r->length);
      } else {
        memset(m->current + r->offset, 0, r->length);
      }
      if (m->options.volatile_cache) {
        memset(m->dirty + r->offset / lbs, 1, r->length / lbs);
        if (r->flags & TFS_BLOCK_FUA) make_durable(m, r->offset / lbs, r->length / lbs);
      }
      if (r->flags & TFS_BLOCK_FUA) m->stats.fua_writes++;
    }
  }
  pthread_mutex_unlock(&m->mu);
  /* The last touch of r: its owner may reuse it as soon as this is called. */
  {
    const void* outer = completing;
    completing = m;
    r->complete(r, error);
    completing = outer;
  }
}

static void* worker_main(void* arg) {
  struct c_mem* m = arg;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    struct tfs_block_request* r;
    while (m->head == NULL && !m->stop) pthread_cond_wait(&m->work, &m->mu);
    if (m->head == NULL) break; /* stop, and drained */
    r = m->head;
    m->head = r->device_private[0];
    if (m->head == NULL) m->tail = NULL;
    m->executing++;
    pthread_mutex_unlock(&m->mu);
    execute(m, r);
    pthread_mutex_lock(&m->mu);
    m->executing--;
    if (m->head == NULL && m->executing == 0) pthread_cond_broadcast(&m->idle);
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

static void submit(struct tfs_block_device* dev, struct tfs_block_request* r) {
  struct c_mem* m = of(dev);
  int on_worker;
  if (completing != NULL && !m->options.completions_may_submit) {
    fprintf(stderr, "c_mem_device %s: submit from inside a completion, and its completions may not submit\n",
            m->dev.name);
    abort();
  }
  pthread_mutex_lock(&m->mu);
  m->submitted++;
  on_worker = m->options.completion == TFS_C_MEM_THREAD ||
              (m->options.completion == TFS_C_MEM_ALTERNATE && m->submitted % 2 == 0);
  if (on_worker) {
    r->device_private[0] = NULL;
    if (m->tail != NULL) {
      m->tail->device_private[0] = r;
    } else {
      m->head = r;
    }
    m->tail = r;
    pthread_cond_signal(&m->work);
  }
  pthread_mutex_unlock(&m->mu);
  if (!on_worker) execute(m, r);
}

static const struct tfs_block_device_ops c_mem_ops = {submit};

/* Frees a device whose worker is not running (never started, or joined). */
static void release(struct c_mem* m) {
  pthread_cond_destroy(&m->idle);
  pthread_cond_destroy(&m->work);
  pthread_mutex_destroy(&m->mu);
  free(m->current);
  free(m->durable);
  free(m->dirty);
  free(m);
}

struct tfs_block_device* tfs_c_mem_create(const struct tfs_c_mem_options* o) {
  struct c_mem* m;
  tfs_u64 lbs = o->logical_block_size;
  if (lbs == 0 || (lbs & (lbs - 1)) != 0 || o->size == 0 || o->size % lbs != 0) return NULL;
  if (o->completion < TFS_C_MEM_INLINE || o->completion > TFS_C_MEM_ALTERNATE) return NULL;
  m = calloc(1, sizeof(*m));
  if (m == NULL) return NULL;
  m->options = *o;
  m->current = calloc(1, o->size);
  if (o->volatile_cache) {
    m->durable = calloc(1, o->size);
    m->dirty = calloc(1, o->size / lbs);
  }
  if (m->current == NULL || (o->volatile_cache && (m->durable == NULL || m->dirty == NULL))) {
    free(m->current);
    free(m->durable);
    free(m->dirty);
    free(m);
    return NULL;
  }
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->work, NULL);
  pthread_cond_init(&m->idle, NULL);
  if (pthread_create(&m->worker, NULL, worker_main, m) != 0) {
    release(m);
    return NULL;
  }
  m->dev.ops = &c_mem_ops;
  m->dev.priv = m;
  m->dev.info.size = o->size;
  m->dev.info.logical_block_size = o->logical_block_size;
  m->dev.info.read_only = o->read_only;
  m->dev.info.supports_fua = o->supports_fua;
  m->dev.info.supports_discard = o->supports_discard;
  m->dev.info.completions_may_submit = o->completions_may_submit;
  m->dev.name = o->name != NULL ? o->name : "c-mem";
  return &m->dev;
}

void tfs_c_mem_destroy(struct tfs_block_device* dev) {
  struct c_mem* m;
  if (dev == NULL) return;
  m = of(dev);
  pthread_mutex_lock(&m->mu);
  m->stop = 1;
  pthread_cond_signal(&m->work);
  pthread_mutex_unlock(&m->mu);
  pthread_join(m->worker, NULL);
  release(m);
}

void tfs_c_mem_fail_next(struct tfs_block_device* dev, int op, int error) {
  struct c_mem* m = of(dev);
  if (op < TFS_BLOCK_READ || op > TFS_BLOCK_DISCARD) return;
  pthread_mutex_lock(&m->mu);
  m->fail_next[op] = error;
  pthread_mutex_unlock(&m->mu);
}

void tfs_c_mem_crash(struct tfs_block_device* dev) {
  struct c_mem* m = of(dev);
  tfs_u64 lbs = m->options.logical_block_size;
  tfs_u64 b;
  pthread_mutex_lock(&m->mu);
  while (m->head != NULL || m->executing != 0) pthread_cond_wait(&m->idle, &m->mu);
  if (m->options.volatile_cache) {
    for (b = 0; b < m->options.size / lbs; b++) {
      if (!m->dirty[b]) continue;
      memcpy(m->current + b * lbs, m->durable + b * lbs, lbs);
      m->dirty[b] = 0;
    }
  }
  pthread_mutex_unlock(&m->mu);
}

void tfs_c_mem_get_stats(struct tfs_block_device* dev, struct tfs_c_mem_stats* out) {
  struct c_mem* m = of(dev);
  pthread_mutex_lock(&m->mu);
  *out = m->stats;
  pthread_mutex_unlock(&m->mu);
}
