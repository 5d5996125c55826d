/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A directory's block files scanned (as fsck does): good blocks, damaged
 * ones, torn temporary files and files that are no blocks each reported
 * as such; and the temporary files of writers that are gone removed when
 * a directory is opened, those of live writers kept.
 */
#include "blockfile_fixture.h"

/* Opens a namespace as an engine does: stale temporary files removed. */
static int open_clean(const char *ns, kvf__blockfile_dir *d)
{
    if (open_ns(ns, FP, KVF_FSYNC_NONE, d))
        return 1;
    kvf__blockfile_remove_stale(d);
    return 0;
}

/* ---- scan ---------------------------------------------------------------- */

typedef struct scan_seen {
    int ok, corrupt, torn, mismatch, other;
    uint64_t torn_key;
} scan_seen;

static void visit(void *arg, kvf_key key, kvf_status st, const char *detail)
{
    scan_seen *s = arg;
    if (st == KVF_OK)
        s->ok++;
    else if (st == KVF_ERR_CORRUPT && strcmp(detail, "torn write (temporary file)") == 0) {
        s->torn++;
        s->torn_key = key.hi ? 0 : key.lo;
    } else if (st == KVF_ERR_CORRUPT)
        s->corrupt++;
    else if (st == KVF_ERR_MISMATCH)
        s->mismatch++;
    else
        s->other++;
}

static int test_scan(void)
{
    kvf__blockfile_dir d;
    if (open_ns("scan", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    CHECK_STATUS(put(&d, 0xc0, 1, 2000000), KVF_OK); /* larger than any before */
    CHECK_STATUS(put(&d, 0xc1, 2, 100), KVF_OK);
    char p[1024];
    block_path(&d, 0xc1, p, sizeof p);
    flip_byte(p, PRE + 5);
    /* a write interrupted by a crash, and files that are not blocks */
    snprintf(p, sizeof p, "%s/.0000000000000000%016llx.1234.0.tmp", d.root, 0xdeadull);
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "partial", 7) == 7);
    close(fd);
    snprintf(p, sizeof p, "%s/README", d.root);
    copy_file("/dev/null", p);
    snprintf(p, sizeof p, "%s/00000000000000zz.kvf", d.root);
    copy_file("/dev/null", p);
    /* a huge file with a zeroed header: refused on its header, without
     * sizing a buffer from its length (sparse; skipped where unsupported) */
    int huge = 0;
    snprintf(p, sizeof p, "%s/0000000000000000%016llx.kvf", d.root, 0xc2ull);
    copy_file("/dev/null", p);
    if (truncate(p, (off_t)64 << 30) == 0)
        huge = 1;
    else
        unlink(p);

    scan_seen s = {0};
    CHECK_STATUS(kvf__blockfile_scan(&d, visit, &s), KVF_OK);
    CHECK_EQ_INT(s.ok, NBYSTANDERS + 1);
    CHECK_EQ_INT(s.corrupt, 1 + huge);
    CHECK_EQ_INT(s.torn, 1);
    CHECK_EQ_U64(s.torn_key, 0xdead);
    CHECK_EQ_INT(s.mismatch + s.other, 0);

    /* fsck's view: fingerprint 0 checks every layout; a known one flags
     * the others */
    kvf__blockfile_dir any, other;
    if (!open_ns("scan", 0, KVF_FSYNC_NONE, &any)) {
        memset(&s, 0, sizeof s);
        CHECK_STATUS(kvf__blockfile_scan(&any, visit, &s), KVF_OK);
        CHECK_EQ_INT(s.ok, NBYSTANDERS + 1);
        kvf__blockfile_close_dir(&any);
    }
    if (!open_ns("scan", FP + 1, KVF_FSYNC_NONE, &other)) {
        memset(&s, 0, sizeof s);
        CHECK_STATUS(kvf__blockfile_scan(&other, visit, &s), KVF_OK);
        CHECK_EQ_INT(s.mismatch, NBYSTANDERS + 2); /* the damaged one too */
        kvf__blockfile_close_dir(&other);
    }
    if (huge) {
        snprintf(p, sizeof p, "%s/0000000000000000%016llx.kvf", d.root, 0xc2ull);
        unlink(p);
    }
    CHECK_STATUS(kvf__blockfile_scan(&d, NULL, &s), KVF_ERR_INVALID);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- stale temporary files ----------------------------------------------- */

static void touch(const char *root, const char *name)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", root, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "partial", 7) == 7);
    close(fd);
}

static bool name_exists(const char *root, const char *name)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", root, name);
    return access(p, F_OK) == 0;
}

/* The pid of a child that has exited and been reaped: no process has it
 * (until the kernel hands it out again, which takes a wrap of pid_max). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0)
        _exit(0);
    int ws;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    return pid;
}

/* an engine's open removes the temporary files of writers that are gone, and
 * only those: a live writer's, and names it did not write, stay. */
static int test_stale_tmp(void)
{
    kvf__blockfile_dir d;
    if (open_clean("stale", &d))
        return 1;
    put_bystanders(&d);
    char *root = strdup(d.root);
    REQUIRE(root);
    kvf__blockfile_close_dir(&d);

    long dead = (long)dead_pid(), dead2 = (long)dead_pid(), me = (long)getpid();
    char gone[3][96], keep[12][96];
    snprintf(gone[0], 96, ".0000000000000000%016llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(gone[1], 96, ".0000000000000000%016llx.%ld.18446744073709551615.tmp",
             0xffffffffffffffffull, dead);
    snprintf(gone[2], 96, ".0000000000000000%016llx.%ld.7.tmp", 0x1ull,
             dead2); /* a bystander's key */
    /* this process's own: a write in flight */
    snprintf(keep[0], 96, ".0000000000000000%016llx.%ld.3.tmp", 0xabcull, me);
    /* the parent (the test runner): alive, maybe not ours to signal */
    snprintf(keep[1], 96, ".0000000000000000%016llx.%ld.0.tmp", 0xabdull, (long)getppid());
    /* not names a writer gives, whatever the pid */
    snprintf(keep[2], 96, ".0000000000000000%016llx.%ld.tmp", 0xabcull, dead);
    snprintf(keep[3], 96, ".0000000000000000%016llx.%ld.x.tmp", 0xabcull, dead);
    snprintf(keep[4], 96, ".%015llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(keep[5], 96, ".0000000000000000%016llx.%ld.0.tmp.bak", 0xabcull, dead);
    snprintf(keep[6], 96, ".0000000000000000%016llx.0.0.tmp", 0xabcull);  /* kill(0) is the group */
    snprintf(keep[7], 96, ".0000000000000000%016llx.-1.0.tmp", 0xabcull); /* kill(-1) is everyone */
    snprintf(keep[8], 96, ".0000000000000000%016llx.4294967297.0.tmp", 0xabcull);
    snprintf(keep[9], 96, ".0000000000000000%016llx.%ld.0.TMP", 0xabcull, dead);
    snprintf(keep[10], 96, "%016llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(keep[11], 96, ".%016llX.%ld.0.tmp", 0xabcull, dead);
    for (int i = 0; i < 3; i++)
        touch(root, gone[i]);
    for (int i = 0; i < 12; i++)
        touch(root, keep[i]);

    if (open_clean("stale", &d)) {
        free(root);
        return 1;
    }
    for (int i = 0; i < 3; i++)
        if (name_exists(root, gone[i]))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: not removed", gone[i]);
    for (int i = 0; i < 12; i++)
        if (!name_exists(root, keep[i]))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: removed", keep[i]);
    for (int i = 0; i < NBYSTANDERS; i++)
        CHECK_EQ_INT(expect(&d, bystander_key[i], 500 + i, bystander_len[i]), 0);

    /* scan still reports what is left (fsck's view): the live writer's
     * files and the other well-formed-looking leftovers, as torn */
    scan_seen s = {0};
    CHECK_STATUS(kvf__blockfile_scan(&d, visit, &s), KVF_OK);
    CHECK_EQ_INT(s.ok, NBYSTANDERS);
    CHECK_EQ_INT(s.torn, 7); /* keep[0..3] and keep[6..8] */
    CHECK_EQ_INT(s.corrupt + s.mismatch + s.other, 0);
    kvf__blockfile_close_dir(&d);

    /* reopening again changes nothing more */
    if (!open_clean("stale", &d)) {
        for (int i = 0; i < 12; i++)
            CHECK(name_exists(root, keep[i]));
        kvf__blockfile_close_dir(&d);
    }
    free(root);
    return 0;
}

int main(void)
{
    int fds = bf_init();
    RUN(test_scan);
    RUN(test_stale_tmp);
    bf_fini(fds);
    return TEST_RESULT();
}
