/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every way a block file's write or read can go wrong (short calls, EINTR,
 * EIO, ENOSPC, files damaged behind the library's back): the block fails
 * with a status naming it, is never served, and no other block is lost.
 */
#include "blockfile_fixture.h"

static int bystanders_intact(kvf__blockfile_dir *d)
{
    int bad = 0;
    for (int i = 0; i < NBYSTANDERS; i++)
        bad |= expect(d, bystander_key[i], 500 + i, bystander_len[i]);
    bad |= count_tmp(d) != 0;
    return bad;
}

/* Files damaged behind the library's back are refused, never served. */
static int test_corruption(void)
{
    kvf__blockfile_dir d;
    if (open_ns("corrupt", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    enum { LEN = 10000 };
    size_t cap = PRE + LEN + 64;
    uint8_t *buf = malloc(cap);
    REQUIRE(buf);
    char p[1024];
    block_path(&d, 0x99, p, sizeof p);
    kvf__blockfile_meta m;

    struct {
        const char *what;
        off_t truncate_to; /* -1: no */
        off_t flip;        /* -1: no */
        size_t append;
        const char *detail;
    } cases[] = {
        {"truncated by one", PRE + LEN - 1, -1, 0, "truncated"},
        {"truncated to the header", PRE, -1, 0, "truncated"},
        {"truncated inside the header", 10, -1, 0, "truncated"},
        {"empty", 0, -1, 0, "truncated"},
        {"extended", -1, -1, 1, "extended"},
        {"payload byte flipped", -1, PRE + 1234, 0, "checksum mismatch"},
        {"last payload byte flipped", -1, PRE + LEN - 1, 0, "checksum mismatch"},
        {"magic flipped", -1, 0, 0, "magic"},
        {"version flipped", -1, 8, 0, "version"},
        {"tokens flipped", -1, 40, 0, "header checksum"},
        {"payload length flipped", -1, 49, 0, "header checksum"},
        {"payload crc flipped", -1, 57, 0, "checksum"},
        {"header crc flipped", -1, 62, 0, "header checksum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK_STATUS(put(&d, 0x99, 77, LEN), KVF_OK);
        if (cases[i].truncate_to >= 0)
            CHECK(truncate(p, cases[i].truncate_to) == 0);
        if (cases[i].flip >= 0)
            flip_byte(p, cases[i].flip);
        if (cases[i].append) {
            int fd = open(p, O_WRONLY | O_APPEND);
            REQUIRE(fd >= 0);
            CHECK(write(fd, "x", 1) == 1);
            close(fd);
        }
        memset(buf, POISON, cap);
        kvf_status st = kvf__blockfile_read(&d, TKEY(0x99), buf, cap, &m);
        if (st != KVF_ERR_CORRUPT || !strstr(kvf_last_error(), cases[i].detail))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: %s: %s", cases[i].what, kvf_status_str(st),
                         kvf_last_error());
        CHECK_STR_HAS(kvf_last_error(), "block 00000000000000000000000000000099: ");
        CHECK_STR_HAS(kvf_last_error(), p);
    }
    CHECK_EQ_INT(bystanders_intact(&d), 0);
    free(buf);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- faults -------------------------------------------------------------- */

/* A write fails with `err` on the `skip`-th call of `op`: the status is
 * `want`, and the key's file, old or new, is gone. */
static void write_fault(kvf__blockfile_dir *d, const char *op, int err, int skip, size_t short_len,
                        kvf_status want, const char *text)
{
    static uint64_t next = 0x5000;
    uint64_t key = next++;
    CHECK_STATUS(put(d, key, 1, 20000), KVF_OK); /* the old version */
    fault_set(op, err, short_len, skip, 1);
    kvf_status st = put(d, key, 2, 20000);
    if (st != want)
        TEST_FAIL_AT(__FILE__, __LINE__, "%s errno %d: %s, want %s (%s)", op, err,
                     kvf_status_str(st), kvf_status_str(want), kvf_last_error());
    CHECK_EQ_INT(fault.hits, 1);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvf_last_error());
    fault_clear();
    char hex[64];
    snprintf(hex, sizeof hex, "block " KVF_KEY_FMT ": ", KVF_KEY_ARGS(TKEY(key)));
    CHECK_STR_HAS(msg, hex);
    CHECK_STR_HAS(msg, text);
    CHECK(!exists(d, key));
    uint8_t b[PRE];
    CHECK_STATUS(kvf__blockfile_read(d, TKEY(key), b, sizeof b, NULL), KVF_ERR_NOT_FOUND);
    CHECK_EQ_INT(bystanders_intact(d), 0);
}

static int test_write_faults(void)
{
    kvf__blockfile_dir d;
    if (open_ns("wfault", FP, KVF_FSYNC_BLOCK, &d))
        return 1;
    put_bystanders(&d);
    kvf__set_io_fault(fault_hook);

    /* short writes, all the way: still byte-exact */
    fault_set("write", 0, 7, 0, -1);
    CHECK_STATUS(put(&d, 0x10, 3, 5000), KVF_OK);
    CHECK(fault.hits > 700);
    fault_set("write", 0, 4093, 0, -1);
    CHECK_STATUS(put(&d, 0x11, 4, 300001), KVF_OK);
    fault_clear();
    CHECK_EQ_INT(expect(&d, 0x10, 3, 5000), 0);
    CHECK_EQ_INT(expect(&d, 0x11, 4, 300001), 0);
    /* EINTR, several times, on open and write */
    fault_set("write", EINTR, 1000, 1, 5);
    CHECK_STATUS(put(&d, 0x12, 5, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 5);
    fault_set("open", EINTR, 0, 0, 2);
    CHECK_STATUS(put(&d, 0x13, 6, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 2);
    /* and on each fsync (file, directory) and the rename */
    for (int skip = 0; skip < 2; skip++) {
        fault_set("fsync", EINTR, 0, skip, 1);
        CHECK_STATUS(put(&d, 0x14 + (uint64_t)skip, 7, 7000), KVF_OK);
        CHECK_EQ_INT(fault.hits, 1);
        CHECK_EQ_INT(fault.calls[3], 3);
    }
    fault_set("rename", EINTR, 0, 0, 1);
    CHECK_STATUS(put(&d, 0x16, 8, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 1);
    fault_clear();
    CHECK_EQ_INT(expect(&d, 0x14, 7, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x15, 7, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x16, 8, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x12, 5, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x13, 6, 7000), 0);

    char enospc[64];
    snprintf(enospc, sizeof enospc, "write: %s", strerror(ENOSPC));
    write_fault(&d, "write", EIO, 0, 0, KVF_ERR_IO, "write: ");
    write_fault(&d, "write", EIO, 3, 1000, KVF_ERR_IO, ".kvf: write: ");
    write_fault(&d, "write", ENOSPC, 0, 0, KVF_ERR_NO_SPACE, enospc);
    write_fault(&d, "write", ENOSPC, 2, 512, KVF_ERR_NO_SPACE, enospc);
    write_fault(&d, "write", EDQUOT, 0, 0, KVF_ERR_NO_SPACE, "write: ");
    write_fault(&d, "open", EIO, 0, 0, KVF_ERR_IO, "open: ");
    write_fault(&d, "open", ENOSPC, 0, 0, KVF_ERR_NO_SPACE, "open: ");
    write_fault(&d, "open", ENOENT, 0, 0, KVF_ERR_IO, "open: ");
    write_fault(&d, "fsync", EIO, 0, 0, KVF_ERR_IO, "fsync: ");
    write_fault(&d, "fsync", EIO, 1, 0, KVF_ERR_IO, "fsync: "); /* the directory's */
    write_fault(&d, "rename", EIO, 0, 0, KVF_ERR_IO, "rename: ");

    /* a new key failing leaves nothing either */
    fault_set("write", EIO, 0, 0, 1);
    CHECK_STATUS(put(&d, 0x6000, 1, 100), KVF_ERR_IO);
    fault_clear();
    CHECK(!exists(&d, 0x6000));
    CHECK_EQ_INT(bystanders_intact(&d), 0);

    fault_set("fsync", EIO, 0, 0, 1);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&d), KVF_ERR_IO);
    fault_clear();
    kvf__set_io_fault(NULL);
    kvf__blockfile_close_dir(&d);
    return 0;
}

static int test_read_faults(void)
{
    kvf__blockfile_dir d;
    if (open_ns("rfault", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    enum { LEN = 100003 };
    CHECK_STATUS(put(&d, 0x20, 8, LEN), KVF_OK);
    kvf__set_io_fault(fault_hook);

    /* short reads: byte-exact, header and payload in pieces */
    static const size_t shorts[] = {1, 5, 63, 4096};
    for (size_t i = 0; i < 4; i++) {
        fault_set("read", 0, shorts[i], 0, shorts[i] < 5 ? 200 : -1);
        CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
        CHECK(fault.hits > 1);
    }
    /* EINTR */
    fault_set("read", EINTR, 0, 0, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    fault_set("read", EINTR, 0, 1, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    fault_set("open", EINTR, 0, 0, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);

    uint8_t *buf = malloc(PRE + LEN);
    REQUIRE(buf);
    kvf__blockfile_meta m;
    /* EIO on the first call and on a later one (the file read in 4 KiB pieces) */
    for (int skip = 0; skip < 2; skip++) {
        fault_set("read", EIO, 4096, skip, 1);
        CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x20), buf, PRE + LEN, &m), KVF_ERR_IO);
        CHECK_STR_HAS(kvf_last_error(), "block 00000000000000000000000000000020: ");
        CHECK_STR_HAS(kvf_last_error(), "read: ");
        CHECK_EQ_INT(fault.hits, 1);
    }
    fault_set("open", EACCES, 0, 0, 1);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x20), buf, PRE + LEN, &m), KVF_ERR_IO);
    /* the file shrinks between fstat and the payload's read: the read
     * sees end of file and must call it corrupt, not pad with zeros */
    fault_set("read", 0, 4096, 1, 1);
    fault.truncate_to = PRE + 100;
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x20), buf, PRE + LEN, &m), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "short read");
    fault_clear();
    kvf__set_io_fault(NULL);
    CHECK_STATUS(put(&d, 0x20, 8, LEN), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    CHECK_EQ_INT(bystanders_intact(&d), 0);
    free(buf);
    kvf__blockfile_close_dir(&d);
    return 0;
}

int main(void)
{
    int fds = bf_init();
    RUN(test_corruption);
    RUN(test_write_faults);
    RUN(test_read_faults);
    bf_fini(fds);
    return TEST_RESULT();
}
