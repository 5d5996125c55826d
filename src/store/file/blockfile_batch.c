/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the blocks of a batch share: each block (kvf__blockfile_io) keeps
 * its own status and message, and its fileio op, linked with those of the
 * other blocks still going, runs through the file I/O runner.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "status.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Records a failure of one block's I/O: its status, and its message, kept
 * with it (a batch has many) and as the thread's last error. */
void __attribute__((format(printf, 3, 4)))
kvf__bf_io_fail(kvf__blockfile_io *io, kvf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io->msg, sizeof io->msg, fmt, ap);
    va_end(ap);
    io->status = st;
    kvf__fail(st, "%s", io->msg);
}

kvf__blockfile_io *kvf__bf_io_of(kvf__fio_op *op)
{
    return (kvf__blockfile_io *)((char *)op - offsetof(kvf__blockfile_io, io));
}

/* Reports one block's final result to the caller, once. */
void kvf__bf_io_finished(kvf__blockfile_io *io)
{
    if (io->reported)
        return;
    io->reported = true;
    if (io->on_done)
        io->on_done(io);
}

/* Links the fileio ops of the blocks still going, of `kind`, each calling
 * `on_done` when finished; NULL if none. */
kvf__fio_op *kvf__bf_live_ops(kvf__blockfile_io *ios, size_t n, kvf__fio_kind kind,
                              bool (*on_start)(kvf__fio_op *op), void (*on_done)(kvf__fio_op *op))
{
    kvf__fio_op *head = NULL, **tailp = &head;
    for (size_t i = 0; i < n; i++) {
        if (ios[i].status != KVF_OK)
            continue;
        ios[i].io.kind = kind;
        ios[i].io.on_start = on_start;
        ios[i].io.on_done = on_done;
        /* set before the run, not in on_start: kvf__fileio_runner_run picks the
         * runner for the list by its xfer before any op starts */
        ios[i].io.xfer = ios[i].img ? ios[i].img->xfer : NULL;
        ios[i].io.xfer_arg = ios[i].img_arg;
        *tailp = &ios[i].io;
        tailp = &ios[i].io.next;
    }
    *tailp = NULL;
    return head;
}
