/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The block file tests' fixture: a temporary directory, the I/O runner of
 * $KVF_FILE_RUNNER (ctest runs each program once per runner), a fault hook
 * failing or shortening the calls of one op, blocks of random data written
 * and checked byte for byte into poisoned buffers, and bystander blocks that
 * no fault may touch. Shared by the test_blockfile_* programs; one program
 * per translation unit (the helpers keep static state).
 */
#ifndef KVF_BLOCKFILE_FIXTURE_H
#define KVF_BLOCKFILE_FIXTURE_H

#include "blockfile.h"
#include "blockhdr.h"
#include "checksum.h"
#include "fileio.h"
#include "testutil.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FP 0x1234567890abcdefull
/* Where the payload starts in the stored form of the tests' blocks (1 to
 * 16 pools): kvf__block_prefix_bytes, a constant for arrays */
#define PRE 256u
#define POISON 0xA5
/* Blocks that no fault aimed at may touch. */
#define NBYSTANDERS 3

static char base[512];          /* the test's temporary directory */
static kvf__fileio_runner *fio; /* the I/O runner of env KVF_FILE_RUNNER, for every directory */
static char files[600];         /* file_dir: base/a/b, created by open_dir */

static struct {
    const char *op; /* the op to act on; NULL: none */
    int err;        /* errno to fail with; 0: succeed (maybe short) */
    size_t short_len;
    int skip;  /* let this many matching calls through first */
    int times; /* act on this many calls; -1: all */
    int hits;
    off_t truncate_to; /* >= 0: truncate the file before the call */
    int calls[8];      /* per op, every call seen */
} fault;

static const char *const ops[] = {"open", "write", "read", "fsync", "rename"};

static inline int fault_hook(const char *op, const char *path, size_t *len_p)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(op, ops[i]) == 0)
            fault.calls[i]++;
    if (!fault.op || strcmp(op, fault.op) != 0)
        return 0;
    if (fault.times == 0)
        return 0;
    /* every matching call is shortened, so that a large one becomes
     * several and `skip` can reach the middle of a file */
    if (fault.short_len && *len_p > fault.short_len)
        *len_p = fault.short_len;
    if (fault.skip > 0) {
        fault.skip--;
        return 0;
    }
    if (fault.times > 0)
        fault.times--;
    fault.hits++;
    if (fault.truncate_to >= 0)
        CHECK(truncate(path, fault.truncate_to) == 0);
    return fault.err;
}

static inline void fault_set(const char *op, int err, size_t short_len, int skip, int times)
{
    memset(&fault, 0, sizeof fault);
    fault.op = op;
    fault.err = err;
    fault.short_len = short_len;
    fault.skip = skip;
    fault.times = times;
    fault.truncate_to = -1;
}

static inline void fault_clear(void)
{
    fault_set(NULL, 0, 0, 0, 0);
}

static inline uint8_t *make_block(uint64_t key, uint64_t tag, size_t payload,
                                  kvf__blockfile_meta *m)
{
    uint8_t *buf = malloc(PRE + payload + 1);
    REQUIRE(buf);
    memset(buf, 0, PRE);
    test_fill_random(buf + PRE, payload, tag);
    *m = (kvf__blockfile_meta){KEY(key), 16, 3, payload};
    return buf;
}

static inline kvf_status put(kvf__blockfile_dir *d, uint64_t key, uint64_t tag, size_t payload)
{
    kvf__blockfile_meta m;
    uint8_t *buf = make_block(key, tag, payload, &m);
    kvf_status st = kvf__blockfile_write(d, &m, buf);
    free(buf);
    return st;
}

/* Reads `key` into a poisoned buffer and compares with the bytes `tag`
 * made. 0 when byte-exact. */
static inline int expect(kvf__blockfile_dir *d, uint64_t key, uint64_t tag, size_t payload)
{
    size_t cap = PRE + payload + 100;
    uint8_t *got = malloc(cap), *want = malloc(payload + 1);
    REQUIRE(got && want);
    memset(got, POISON, cap);
    test_fill_random(want, payload, tag);
    kvf__blockfile_meta m;
    memset(&m, 0xEE, sizeof m);
    kvf_status st = kvf__blockfile_read(d, KEY(key), got, cap, &m);
    int bad = 0;
    if (st != KVF_OK) {
        fprintf(stderr, "block " KVF_KEY_FMT ": %s: %s\n", KVF_KEY_ARGS(TKEY(key)),
                kvf_status_str(st), kvf_last_error());
        bad = 1;
    } else {
        bad |= test_mem_diff(got + PRE, want, payload) != (size_t)-1;
        bad |= !kvf_key_eq(m.key, KEY(key)) || m.tokens != 16 || m.pools != 3 ||
               m.payload_bytes != payload;
        /* nothing written past the block */
        for (size_t i = PRE + payload; i < cap; i++)
            bad |= got[i] != POISON;
        if (bad)
            fprintf(stderr, "block " KVF_KEY_FMT ": wrong bytes or meta\n",
                    KVF_KEY_ARGS(TKEY(key)));
    }
    free(got);
    free(want);
    return bad;
}

static inline void block_path(const kvf__blockfile_dir *d, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/" KVF_KEY_FMT ".kvf", d->root, KVF_KEY_ARGS(KEY(key)));
}

static inline bool exists(const kvf__blockfile_dir *d, uint64_t key)
{
    char p[1024];
    block_path(d, key, p, sizeof p);
    return access(p, F_OK) == 0;
}

/* Leftover temporary files in the namespace directory. */
static inline int count_tmp(const kvf__blockfile_dir *d)
{
    DIR *dd = opendir(d->root);
    REQUIRE(dd);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] == '.' && strstr(e->d_name, ".tmp"))
            n++;
    closedir(dd);
    return n;
}

static inline void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    unsigned char c;
    REQUIRE(pread(fd, &c, 1, off) == 1);
    c ^= 0x40;
    REQUIRE(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

static inline void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(in >= 0 && out >= 0);
    char b[65536];
    ssize_t n;
    while ((n = read(in, b, sizeof b)) > 0)
        REQUIRE(write(out, b, (size_t)n) == n);
    close(in);
    close(out);
}

static const uint64_t bystander_key[NBYSTANDERS] = {0x1, 0xfeedface, 0xffffffffffffffffull};
static const size_t bystander_len[NBYSTANDERS] = {1, 4096, 300000};

static inline void put_bystanders(kvf__blockfile_dir *d)
{
    for (int i = 0; i < NBYSTANDERS; i++)
        CHECK_STATUS(put(d, bystander_key[i], 500 + i, bystander_len[i]), KVF_OK);
}

static inline int open_ns(const char *ns, uint64_t fp, kvf_fsync mode, kvf__blockfile_dir *d)
{
    memset(d, 0, sizeof *d);
    kvf_status st = kvf__blockfile_open_dir(files, ns, fp, mode, d);
    CHECK_STATUS(st, KVF_OK);
    d->fio = fio;
    return st != KVF_OK;
}

/* The program's temporary directory and the I/O runner of
 * $KVF_FILE_RUNNER (none: inline); returns the descriptors open before,
 * for bf_fini to compare. */
static inline int bf_init(void)
{
    int fds = test_count_fds();
    if (test_tmpdir(base, sizeof base) != 0)
        TEST_SKIP_ALL("no temporary directory");
    snprintf(files, sizeof files, "%s/a/b", base);
    /* the same tests on each I/O runner: ctest runs this once per runner */
    const char *engine = getenv("KVF_FILE_RUNNER");
    if (engine && *engine) {
        kvf_file_runner want =
            strcmp(engine, "uring") == 0 ? KVF_FILE_RUNNER_URING : KVF_FILE_RUNNER_THREADS;
        REQUIRE(kvf__fileio_runner_create(want, 8, 2, &fio) == KVF_OK);
        printf("file i/o runner: %s\n",
               kvf__fileio_runner_type(fio) == KVF_FILE_RUNNER_URING ? "io_uring" : "threads");
    }
    return fds;
}

/* Closes the runner; no descriptor is left open, nothing on disk. */
static inline void bf_fini(int fds)
{
    kvf__set_io_fault(NULL);
    kvf__fileio_runner_destroy(fio);
    if (fds >= 0)
        CHECK_EQ_INT(test_count_fds(), fds);
    test_rmtree(base);
}

#endif /* KVF_BLOCKFILE_FIXTURE_H */
