/* SPDX-License-Identifier: Apache-2.0 */
/*
 * File I/O runners (fileio.c): many reads, writes and fsyncs in flight at
 * once, each run to completion: io_uring where built and allowed, else a
 * pool of threads. Short transfers are continued, EINTR is retried, and
 * the fault hook (blockfile.h) is called before every call. A descriptor
 * opened with O_DIRECT (op->direct) loses it before a call that is not
 * aligned to KVF_FILE_ALIGN.
 */
#ifndef KVF_STORE_FILEIO_H
#define KVF_STORE_FILEIO_H

#include "common.h"

#define KVF_FILE_ALIGN 4096u
#define KVF_FILE_QUEUE_DEPTH_DEFAULT 32u

typedef enum kvf__fio_kind { KVF_FIO_READ = 0, KVF_FIO_WRITE = 1, KVF_FIO_FSYNC = 2 } kvf__fio_kind;

typedef struct kvf__fio_op {
    kvf__fio_kind kind;
    int fd;
    uint8_t *buf;
    size_t len;  /* bytes to move */
    size_t need; /* a read is complete once this many arrived (<= len) */
    uint64_t off;
    const char *path; /* for the fault hook */
    bool direct;      /* fd has O_DIRECT */
    /* results, set by kvf__fileio_runner_run */
    size_t done; /* bytes moved */
    int err;     /* 0, or the errno of the failed call */
    bool eof;    /* a read reached the end of the file */
    bool synced;
    bool started;
    /* Optional: called once just before the op's first call, on the thread
     * that makes it, to fill in fd, buf, len...; false fails the op (err
     * set by it, else ECANCELED) without a call. */
    bool (*on_start)(struct kvf__fio_op *op);
    /* called once the op is finished, on whichever thread finished it,
     * while other ops may still be in flight; NULL: none */
    void (*on_done)(struct kvf__fio_op *op);
    /* Optional, reads and writes: makes each call itself instead of
     * pread/pwrite (cuFile on device memory): `len` bytes at buf + done,
     * file offset off + done; returns the bytes moved or -errno. An op
     * with it runs on the thread runner's threads (io_uring cannot). */
    long long (*xfer)(struct kvf__fio_op *op, size_t len);
    void *xfer_arg;
    /* the runner's */
    struct kvf__fio_op *next;
    size_t *left_p;
} kvf__fio_op;

typedef struct kvf__fileio_runner kvf__fileio_runner;

/* A runner of kind `want` (AUTO: io_uring, else threads, with one
 * warning), `depth` calls in flight (0: the default), `lanes` callers at
 * once without waiting for each other (one io_uring ring each). */
KVF_INTERNAL kvf_status kvf__fileio_runner_create(kvf_file_runner want, uint32_t depth,
                                                  uint32_t lanes, kvf__fileio_runner **io_p);
KVF_INTERNAL void kvf__fileio_runner_destroy(kvf__fileio_runner *io);
/* URING or THREADS: what runs the calls. */
KVF_INTERNAL kvf_file_runner kvf__fileio_runner_type(const kvf__fileio_runner *io);
KVF_INTERNAL uint32_t kvf__fileio_runner_depth(const kvf__fileio_runner *io);
/* Runs a list of ops (linked by `next`, NULL-terminated) to completion;
 * each gets its own result; `next` is the runner's until it returns, and
 * undefined after. Safe from several threads. io == NULL runs them one by
 * one on the calling thread. */
KVF_INTERNAL void kvf__fileio_runner_run(kvf__fileio_runner *io, kvf__fio_op *list);
/* Fault injection for tests: when set, the file layer calls it before each
 * open, read, write, fsync and rename system call, with op "open", "read",
 * "write", "fsync" or "rename" and the file's path. A non-zero return is
 * used as the errno of a failed call (EINTR is retried like a real one);
 * for "read" and "write", lowering *len_p makes the call that much shorter
 * (*len_p is 0 for the other ops). Not thread-safe to change while I/O runs. */
typedef int (*kvf__io_fault_fn)(const char *op, const char *path, size_t *len_p);
KVF_INTERNAL void kvf__set_io_fault(kvf__io_fault_fn fn);
/* The hook's verdict for one call (see kvf__set_io_fault). */
KVF_INTERNAL int kvf__io_fault(const char *op, const char *path, size_t *len_p);
/* Tests: make io_uring setup and O_DIRECT opens fail as a container or
 * tmpfs would (EPERM, EINVAL), to test the fallbacks anywhere. */
KVF_INTERNAL void kvf__fileio_test_refuse(bool uring, bool direct);
KVF_INTERNAL bool kvf__fileio_direct_refused(void);

#endif /* KVF_STORE_FILEIO_H */
