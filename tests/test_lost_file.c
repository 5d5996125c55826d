/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A failed write of a key whose old file cannot be removed (a directory
 * that refuses unlink: read-only, or not ours). kvf_offload promises that
 * a failed write leaves the key absent; the old block must never be served
 * as the key: the engine refuses the key (KVF_ERR_LOST) until it is
 * written again, and the file is emptied in place so that an engine opened
 * later does not serve it either. Faults come from the file layer's hook:
 * the write fails with EIO, unlink with EACCES, and in one case emptying
 * the file in place fails too.
 */
#include "testutil.h"

#include "blockfile.h"
#include "blockhdr.h"
#include "engine.h"
#include "file_fixture.h"
#include "fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define POISON 0xA5
#define BLOCK_N 0x51ull
#define OTHER_KEY 0x52ull

/* ---- the faults ------------------------------------------------------------ */

/* the key's hex digits: its file, and its temporary files, name it */
static const char *fail_write, *fail_unlink, *fail_truncate;

static bool on(const char *key_hex, const char *path)
{
    return key_hex && path && strstr(path, key_hex);
}

static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    (void)len_p;
    /* a write goes to a temporary file named after the key */
    if (strcmp(op, "write") == 0 && on(fail_write, path))
        return EIO;
    if (strcmp(op, "unlink") == 0 && on(fail_unlink, path))
        return EACCES;
    if (strcmp(op, "truncate") == 0 && on(fail_truncate, path))
        return EACCES;
    return 0;
}

static void faults(const char *w, const char *u, const char *t)
{
    fail_write = w;
    fail_unlink = u;
    fail_truncate = t;
    kvf__set_io_fault(w || u || t ? fault_hook : NULL);
}

/* Stores version `tag` of BLOCK_N from slot 0, then fails the write of
 * version tag + 1 with the removal refused (and emptying too, when
 * `keep_bytes`). Slot 1 is left poisoned. */
static void store_then_fail(file_fixture *f, uint64_t tag, bool keep_bytes)
{
    char name[KVF_KEY_STR_BYTES];
    snprintf(name, sizeof name, KVF_KEY_FMT, KVF_KEY_ARGS(KEY(BLOCK_N)));
    test_fill_random(ff_slot(f, KVF_LEVEL_PRIMARY, 0), f->bytes, tag);
    CHECK_STATUS(ff_move1(f, true, 0, BLOCK_N), KVF_OK);
    test_fill_random(ff_slot(f, KVF_LEVEL_PRIMARY, 0), f->bytes, tag + 1);
    faults(name, name, keep_bytes ? name : NULL);
    CHECK_STATUS(ff_move1(f, true, 0, BLOCK_N), KVF_ERR_IO);
    faults(NULL, NULL, NULL);
    memset(ff_slot(f, KVF_LEVEL_PRIMARY, 1), POISON, f->bytes);
}

/* A successful write of BLOCK_N (version `tag`) is served again. */
static void rewrite_serves(file_fixture *f, uint64_t tag)
{
    test_fill_random(ff_slot(f, KVF_LEVEL_PRIMARY, 0), f->bytes, tag);
    CHECK_STATUS(ff_move1(f, true, 0, BLOCK_N), KVF_OK);
    memset(ff_slot(f, KVF_LEVEL_PRIMARY, 1), POISON, f->bytes);
    CHECK_STATUS(ff_move1(f, false, BLOCK_N, 1), KVF_OK);
    CHECK_MEM_EQ(ff_slot(f, KVF_LEVEL_PRIMARY, 1), ff_slot(f, KVF_LEVEL_PRIMARY, 0), f->bytes);
}

static int test_unlink_refused_file_emptied(void)
{
    file_fixture f;
    ff_init(&f);
    test_fill_random(ff_slot(&f, KVF_LEVEL_PRIMARY, 2), f.bytes, 99);
    CHECK_STATUS(ff_move1(&f, true, 2, OTHER_KEY), KVF_OK);
    store_then_fail(&f, 10, false);
    char path[400];
    ff_key_path(&f, BLOCK_N, path, sizeof path);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == 0);
    /* refused, naming key and file, and nothing lands in the slot */
    kvf_move m = FROM_KEY(BLOCK_N, 1);
    kvf_ticket t;
    kvf_status per = KVF_OK;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, &per), KVF_ERR_LOST);
    CHECK_STATUS(per, KVF_ERR_LOST);
    CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON &&
          ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[f.bytes - 1] == POISON);
    /* the message is the worker's; the direct read says why the file is no block */
    uint8_t buf[16384];
    kvf__store_block b = {.key = TKEY(BLOCK_N), .buf = buf, .cap = sizeof buf};
    kvf__store *disk = kvf__engine_store(f.e, KVF_TIER_DISK);
    CHECK(disk && disk->ops->read(disk, &b, 1, 0) != KVF_OK && b.status != KVF_OK);
    /* another key is untouched */
    CHECK_STATUS(ff_move1(&f, false, OTHER_KEY, 3), KVF_OK);
    CHECK_MEM_EQ(ff_slot(&f, KVF_LEVEL_PRIMARY, 3), ff_slot(&f, KVF_LEVEL_PRIMARY, 2), f.bytes);

    /* a restart: the emptied file is never served as the block */
    kvf_engine_destroy(f.e);
    ff_open(&f);
    memset(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), POISON, f.bytes);
    CHECK(ff_move1(&f, false, BLOCK_N, 1) != KVF_OK);
    CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON &&
          ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[f.bytes - 1] == POISON);

    /* a new write of the key clears it */
    rewrite_serves(&f, 20);
    ff_done(&f);
    return 0;
}

static int test_unlink_and_emptying_refused(void)
{
    file_fixture f;
    ff_init(&f);
    store_then_fail(&f, 30, true);
    char path[400];
    ff_key_path(&f, BLOCK_N, path, sizeof path);
    struct stat sb;
    /* the old file is still there, whole: only the engine's memory refuses it */
    CHECK(stat(path, &sb) == 0 && sb.st_size > 0);
    CHECK_STATUS(ff_move1(&f, false, BLOCK_N, 1), KVF_ERR_LOST);
    CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON &&
          ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[f.bytes - 1] == POISON);
    /* still refused on a second try, and after a failed rewrite */
    CHECK_STATUS(ff_move1(&f, false, BLOCK_N, 1), KVF_ERR_LOST);
    /* removed once the directory allows it: absent, as promised */
    kvf_ticket t;
    kvf_key key = KEY(BLOCK_N);
    CHECK_STATUS(kvf_remove(f.e, KVF_TIER_DISK, &key, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK_STATUS(ff_move1(&f, false, BLOCK_N, 1), KVF_ERR_NOT_FOUND);
    /* and a rewrite serves the new bytes */
    store_then_fail(&f, 40, true);
    CHECK_STATUS(ff_move1(&f, false, BLOCK_N, 1), KVF_ERR_LOST);
    rewrite_serves(&f, 50);
    ff_done(&f);
    return 0;
}

/* The file layer alone (no engine): the failed write's message says what
 * became of the old file. */
static int test_blockfile_message(void)
{
    char base[256];
    REQUIRE(test_tmpdir(base, sizeof base) == 0);
    kvf__blockfile_dir d;
    REQUIRE(kvf__blockfile_open_dir(base, "ns", 0x1234, KVF_FSYNC_NONE, &d) == KVF_OK);
    /* the block's stored image: its prefix (header and one pool's table
     * entry), then 256 payload bytes */
    uint8_t buf[KVF_BLOCK_PREFIX_MAX + 256];
    REQUIRE(kvf__block_prefix_bytes(1) <= KVF_BLOCK_PREFIX_MAX);
    test_fill_random(buf, sizeof buf, 5);
    kvf__blockfile_meta m = {KEY(BLOCK_N), 16, 1, 256};
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_OK);
    char name[KVF_KEY_STR_BYTES];
    snprintf(name, sizeof name, KVF_KEY_FMT, KVF_KEY_ARGS(KEY(BLOCK_N)));
    faults(name, name, NULL);
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_ERR_IO);
    CHECK_STR_HAS(kvf_last_error(), "emptied in place");
    faults(name, name, name);
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_ERR_IO);
    CHECK_STR_HAS(kvf_last_error(), "REMAINS");
    faults(NULL, NULL, NULL);
    bool emptied = true;
    CHECK_STATUS(kvf__blockfile_discard(&d, TKEY(BLOCK_N), &emptied), KVF_OK);
    CHECK(!emptied);
    kvf__blockfile_close_dir(&d);
    test_rmtree(base);
    return 0;
}

/* The directory itself refuses, no hook: a read-only namespace directory
 * as an unprivileged user (root ignores the mode: the test drops to
 * nobody in a child). The offload fails (the temporary file cannot be
 * created), unlink fails with EACCES, and the file, the user's own, is
 * emptied in place. */
static int readonly_directory_child(void)
{
    file_fixture f;
    memset(&f, 0, sizeof f);
    REQUIRE(test_tmpdir(f.dir, sizeof f.dir) == 0);
    snprintf(f.ns_dir, sizeof f.ns_dir, "%s/ns", f.dir);
    ff_open(&f);
    test_fill_random(ff_slot(&f, KVF_LEVEL_PRIMARY, 0), f.bytes, 60);
    CHECK_STATUS(ff_move1(&f, true, 0, BLOCK_N), KVF_OK);
    REQUIRE(chmod(f.ns_dir, 0555) == 0);
    test_fill_random(ff_slot(&f, KVF_LEVEL_PRIMARY, 0), f.bytes, 61);
    CHECK(ff_move1(&f, true, 0, BLOCK_N) != KVF_OK);
    memset(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), POISON, f.bytes);
    CHECK_STATUS(ff_move1(&f, false, BLOCK_N, 1), KVF_ERR_LOST);
    CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    /* a restart: the emptied file is never served as the block */
    kvf_engine_destroy(f.e);
    ff_open(&f);
    memset(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), POISON, f.bytes);
    CHECK(ff_move1(&f, false, BLOCK_N, 1) != KVF_OK);
    CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    REQUIRE(chmod(f.ns_dir, 0755) == 0);
    rewrite_serves(&f, 62);
    ff_done(&f);
    return test_failures ? 1 : 0;
}

static int test_readonly_directory(void)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(TEST_SKIP);
        /* nobody's own temporary directory, where TMPDIR is not writable */
        if (access(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", W_OK) != 0)
            _exit(TEST_SKIP);
        _exit(readonly_directory_child());
    }
    int status;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP)
        return TEST_SKIP;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

int main(void)
{
    RUN(test_unlink_refused_file_emptied);
    RUN(test_unlink_and_emptying_refused);
    RUN(test_blockfile_message);
    RUN(test_readonly_directory);
    return TEST_RESULT();
}
