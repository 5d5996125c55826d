/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's failures and their propagation: short I/O, missing and
 * damaged files (TensorRT-LLM's defects 2 and 6), failed copies failing
 * their own moves and those that depend on them, a failed file write
 * leaving nothing behind, and a rewrite after a failure.
 */
#include "engine_fixture.h"

static int fault_errno, fault_short;
static const char *fault_op;
static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    if (!fault_op || strcmp(op, fault_op) != 0)
        return 0;
    if (fault_short && len_p && *len_p > 1) {
        *len_p /= 2;
        return 0;
    }
    return fault_errno;
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int block_file(fixture *f, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/test/" KVF_KEY_FMT ".kvf", f->dir, KVF_KEY_ARGS(TKEY(key)));
    return 0;
}

/* 2 and 6. Short I/O, missing and damaged files: each fails its own move
 * with a status and a message naming block and file, never hands back the
 * bytes, never aborts, and loses no other block. */
static int test_defect2_6_io_faults(void)
{
    fixture f;
    int fds = count_fds();
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 1);
    fill_block(&f, 1, 2);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 0, 0xa, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 1, 0xb, 0), KVF_OK);

    /* short reads and writes are continued, not taken for the data */
    kvf__set_io_fault(fault_hook);
    fault_short = 1;
    fault_op = "write";
    fill_block(&f, 2, 3);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 2, 0xc, 0), KVF_OK);
    fault_op = "read";
    poison_block(&f, 3);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xc, 3, 0), KVF_OK);
    if (expect_block(&f, 3, 3, 0))
        return 1;
    fault_short = 0;

    /* EIO on write: that block is reported lost, and its old file is gone */
    fault_op = "write";
    fault_errno = EIO;
    fill_block(&f, 2, 4);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 2, 0xa, 0), KVF_ERR_IO);
    CHECK(strstr(kvf_last_error(), "ticket") != NULL);
    fault_errno = ENOSPC;
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 2, 0xd, 0), KVF_ERR_NO_SPACE);
    fault_op = "read";
    fault_errno = EIO;
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xb, 4, 0), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    poison_block(&f, 4);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xa, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xd, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 4)[0] == POISON);
    /* block 0xb was not touched by the failed read */
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xb, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 2, 0))
        return 1;

    /* a file truncated or changed behind kvferry's back */
    char path[1024];
    block_file(&f, 0xb, path, sizeof path);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - 10) == 0);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xb, 4, 0), KVF_ERR_CORRUPT);
    block_file(&f, 0xc, path, sizeof path);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, 200) == 1);
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, 200) == 1);
    close(fd);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xc, 4, 0), KVF_ERR_CORRUPT);
    /* a block never stored: not found, with its key and file in the log */
    kvf_move m = FROM_KEY(0x5eed, 4);
    kvf_ticket t;
    kvf_status per;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, &per), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per, KVF_ERR_NOT_FOUND);
    fx_done(&f);
    CHECK(count_fds() == fds);
    return 0;
}

static int test_failure_propagates(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 1);
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 3);
    kvf__set_copy_hook(fail_copy);
    kvf_move off = {0, 3, 0}, on = {3, 1, 0};
    kvf_ticket t1, t2;
    poison_block(&f, 1);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_ERR_LOST);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 1, 0), KVF_ERR_LOST);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 0, 3, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 1, 0), KVF_OK);
    if (expect_block(&f, 1, 1, 0))
        return 1;
    /* a secondary slot never written holds nothing to onboard */
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 6, 1, 0), KVF_ERR_NOT_FOUND);
    fx_done(&f);
    return 0;
}

/* A failed write, a read queued behind it, then a good rewrite queued
 * before that read ran, then a read of the rewrite: the first read is
 * lost, the rewrite and the second read are not. */
static atomic_int fail_once_left;
static kvf_status fail_once(const kvf__copy *c)
{
    if (c->dst == fail_dst && atomic_fetch_sub(&fail_once_left, 1) > 0) {
        usleep(20 * 1000); /* the others are queued behind it meanwhile */
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static int test_failure_then_rewrite(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 80);
    fill_block(&f, 2, 81);
    poison_block(&f, 1);
    poison_block(&f, 4);
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 3);
    atomic_store(&fail_once_left, 1);
    kvf__set_copy_hook(fail_once);
    kvf_move w1 = {0, 3, 0}, r0 = {3, 1, 0}, w2 = {2, 3, 0}, r3 = {3, 4, 0};
    kvf_ticket t[4];
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &w1, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &r0, 1, &t[1]), KVF_OK);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &w2, 1, &t[2]), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &r3, 1, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[2], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[1], NULL), KVF_ERR_LOST);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    if (expect_block(&f, 4, 81, 0))
        return 1;
    /* the slot is good again for later reads */
    poison_block(&f, 5);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 5, 0), KVF_OK);
    if (expect_block(&f, 5, 81, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* Every failed write to a file removes its key's file, however it failed:
 * in the gather from the slots into staging, from a lost source before
 * any I/O, or in the batch's closing fsync (after the file was renamed
 * into place). A later read finds no block, never the old version nor an
 * unsynced new one; other keys are untouched. */
static const uint8_t *fail_src;
static kvf_status fail_copy_from(const kvf__copy *c)
{
    return c->src == fail_src ? KVF_ERR_IO : KVF_OK;
}

static int test_failed_file_write_removes(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 41);
    fill_block(&f, 1, 42);
    fill_block(&f, 2, 43);
    for (uint64_t k = 0; k < 3; k++)
        CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, k, 0xf0 + k, 0), KVF_OK);
    /* the gather into staging fails: nothing of the new version was written */
    fill_block(&f, 0, 51);
    fail_src = slot(&f, 0, KVF_LEVEL_PRIMARY, 0);
    kvf__set_copy_hook(fail_copy_from);
    kvf_move om = TO_KEY(0, 0xf0);
    kvf_ticket ot;
    kvf_move_error oerr;
    size_t noerr = 0;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, &om, 1, &ot), KVF_OK);
    CHECK_STATUS(kvf_wait_errors(f.e, ot, NULL, &oerr, 1, &noerr), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK(noerr == 1);
    CHECK_STR_HAS(oerr.message,
                  "offload to file: block 000000000000000000000000000000f0: gathering slot 0");
    poison_block(&f, 4);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xf0, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 4)[0] == POISON);
    /* a demote of a secondary slot whose write failed: lost before any I/O */
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 5);
    kvf__set_copy_hook(fail_copy);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 1, 5, 0), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    kvf_move dm = TO_KEY(5, 0xf1);
    kvf_ticket t;
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &dm, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_LOST);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xf1, 4, 0), KVF_ERR_NOT_FOUND);
    /* the batch's fsync fails after its file was renamed into place */
    kvf__set_io_fault(fault_hook);
    fault_op = "fsync";
    fault_errno = EIO;
    fill_block(&f, 2, 53);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 2, 0xf2, 0), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xf2, 4, 0), KVF_ERR_NOT_FOUND);
    /* a key no failure touched */
    fill_block(&f, 3, 44);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 3, 0xf3, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xf3, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 44, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* A read from a file whose copy from staging into its slots fails: that
 * move alone fails (on an asynchronous backend, in the backend's
 * callback), the other moves of the batch land, the file stays. */
static int test_onboard_copy_failure(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 61);
    fill_block(&f, 1, 62);
    kvf_move off[2] = {TO_KEY(0, 0xc0), TO_KEY(1, 0xc1)};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, off, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 4);
    poison_block(&f, 5);
    fail_dst = slot(&f, 0, KVF_LEVEL_PRIMARY, 4);
    kvf__set_copy_hook(fail_copy);
    kvf_move on[2] = {FROM_KEY(0xc0, 4), FROM_KEY(0xc1, 5)};
    kvf_status per[2];
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, on, 2, &t), KVF_OK);
    kvf_move_error err[2];
    size_t nerr = 0;
    CHECK_STATUS(kvf_wait_errors(f.e, t, per, err, 2, &nerr), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(per[0], KVF_ERR_IO);
    CHECK_STATUS(per[1], KVF_OK);
    /* the move's message names the block and the slot it did not reach */
    CHECK(nerr == 1 && err[0].index == 0);
    CHECK_STR_HAS(
        err[0].message,
        "onboard from file: block 000000000000000000000000000000c0: scattering into slot 4");
    if (expect_block(&f, 5, 62, 0))
        return 1;
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0xc0, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 61, 0))
        return 1;
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_defect2_6_io_faults);
    RUN(test_failure_propagates);
    RUN(test_failure_then_rewrite);
    RUN(test_failed_file_write_removes);
    RUN(test_onboard_copy_failure);
    return TEST_RESULT();
}
