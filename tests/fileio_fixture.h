/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file I/O tests' fixture: a temporary directory, the runner under test
 * (each program runs its tests on inline, threads and io_uring where
 * offered), aligned buffers filled with poison, a fault hook for one op on
 * one path, and raw files for the runner's ops. Shared by the test_fileio_*
 * programs; one program per translation unit (the helpers keep static
 * state).
 */
#ifndef KVF_FILEIO_FIXTURE_H
#define KVF_FILEIO_FIXTURE_H

#include "blockfile.h"
#include "blockhdr.h"
#include "fileio.h"
#include "testutil.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where the payload starts in the stored form of the tests' blocks (1 to
 * 16 pools): kvf__block_prefix_bytes, a constant for arrays */
#define PRE 256u
#define ALIGN KVF_FILE_ALIGN
#define POISON 0xA5

static char base[512];
static const char *engine_name = "inline";
static kvf__fileio_runner *fio; /* the runner under test; NULL: inline */

static inline uint8_t *aligned_alloc_poisoned(size_t n)
{
    void *p = NULL;
    REQUIRE(posix_memalign(&p, ALIGN, n ? n : ALIGN) == 0);
    memset(p, POISON, n);
    return p;
}

static struct {
    const char *op;
    const char *path_has; /* only calls on a path containing this */
    int err;
    size_t short_len; /* > 0: every matching call at most this long */
    int times;        /* act on this many calls; -1: all */
    int hits;
} fault;

static inline int fault_hook(const char *op, const char *path, size_t *len_p)
{
    if (!fault.op || strcmp(op, fault.op) != 0)
        return 0;
    if (fault.path_has && !strstr(path, fault.path_has))
        return 0;
    /* hooks run on the runners' threads: take one of `times` atomically */
    int t = __atomic_load_n(&fault.times, __ATOMIC_RELAXED);
    while (t > 0 && !__atomic_compare_exchange_n(&fault.times, &t, t - 1, false, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED))
        ;
    if (t == 0)
        return 0;
    __atomic_add_fetch(&fault.hits, 1, __ATOMIC_RELAXED);
    if (fault.short_len && *len_p > fault.short_len)
        *len_p = fault.short_len;
    return fault.err;
}

static inline void fault_set(const char *op, const char *path_has, int err, size_t short_len)
{
    fault.op = op;
    fault.path_has = path_has;
    fault.err = err;
    fault.short_len = short_len;
    fault.times = -1;
    fault.hits = 0;
}

/* The program's temporary directory; returns the descriptors open before,
 * for fio_fini to compare. */
static inline int fio_init(void)
{
    int fds = test_count_fds();
    if (test_tmpdir(base, sizeof base) != 0)
        TEST_SKIP_ALL("no temporary directory");
    return fds;
}

/* Runs `tests` (RUNs) once on every file I/O runner this machine offers. */
static inline void fio_each_engine(void (*tests)(void))
{
    /* every test on every runner: inline (NULL), threads, io_uring */
    for (int k = 0; k < 3; k++) {
        fio = NULL;
        if (k > 0) {
            kvf_file_runner want = k == 1 ? KVF_FILE_RUNNER_THREADS : KVF_FILE_RUNNER_URING;
            REQUIRE(kvf__fileio_runner_create(want, 8, 2, &fio) == KVF_OK);
            if (k == 2 && kvf__fileio_runner_type(fio) != KVF_FILE_RUNNER_URING) {
                printf("skip io_uring: not built or refused here\n");
                kvf__fileio_runner_destroy(fio);
                continue;
            }
        }
        engine_name = k == 0 ? "inline" : k == 1 ? "threads" : "io_uring";
        printf("-- %s\n", engine_name);
        tests();
        kvf__fileio_runner_destroy(fio);
        fio = NULL;
    }
}

/* No descriptor is left open, nothing on disk. */
static inline void fio_fini(int fds)
{
    kvf__set_io_fault(NULL);
    if (fds >= 0)
        CHECK_EQ_INT(test_count_fds(), fds);
    test_rmtree(base);
}

#endif /* KVF_FILEIO_FIXTURE_H */
