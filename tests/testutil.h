/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers shared by kvferry's test programs; header-only, one test program
 * per translation unit.
 *
 * A test is a program: exit 0 passes, 1 fails, 77 skips (CTest's
 * SKIP_RETURN_CODE). CHECK* macros report file:line and carry on, so one
 * run shows every failure. A test function returns 0 (pass), TEST_SKIP or
 * anything else (fail); main runs each with RUN(fn) and ends with
 * `return TEST_RESULT();`. A program that returns 0 after a failed CHECK
 * still exits 1.
 */
#ifndef KVF_TESTUTIL_H
#define KVF_TESTUTIL_H

/* tests reach the internal hooks (fault injection) as well as the API */
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define TEST_SKIP 77

/* Block keys in tests: KEY(n) is {0, n}, so that a test's numbers read as
 * before; tests of the key's width build {hi, lo} themselves. KEY_SEED
 * folds both halves into a test_fill_random seed (hi 0: the low half). */
#define KEY(n) ((kvf_key){0, (uint64_t)(n)})
#define KEY_SEED(k) ((k).lo ^ (k).hi * 0x9E3779B97F4A7C15ull)
static inline kvf_key test_key_u64(uint64_t n)
{
    return KEY(n);
}
static inline kvf_key test_key_same(kvf_key k)
{
    return k;
}
/* A key from a number or a key: for fixtures whose callers name blocks
 * either way. */
#define TKEY(x) _Generic((x), kvf_key : test_key_same, default : test_key_u64)(x)
/* A DISK or REMOTE move: an offload of a slot to a key, an onboard of a
 * key to a slot (src / dst 0 on the stored side). */
/* A move to (into_tier) or from `tier` in the numbering of tests written
 * for 64-bit keys: where the tier is DISK or REMOTE, the number on its side
 * is the block KEY(n). */
static inline kvf_move test_move(kvf_tier tier, bool into_tier, uint64_t src, uint64_t dst,
                                 uint32_t tokens)
{
    if (tier != KVF_TIER_DISK && tier != KVF_TIER_REMOTE)
        return (kvf_move){.src = src, .dst = dst, .tokens = tokens};
    return into_tier ? (kvf_move){.src = src, .tokens = tokens, .key = KEY(dst)}
                     : (kvf_move){.dst = dst, .tokens = tokens, .key = KEY(src)};
}
#define TO_KEY(slot, k) ((kvf_move){.src = (slot), .key = TKEY((k))})
#define FROM_KEY(k, slot) ((kvf_move){.dst = (slot), .key = TKEY((k))})

static int test_failures;
static int test_runs;
static int test_skips;

static inline void test_exit_check_(void)
{
    if (test_failures) {
        fflush(NULL);
        _exit(1);
    }
}

static inline void test_note_failure_(void)
{
    if (test_failures++ == 0)
        atexit(test_exit_check_);
}

/* 1 after any failure; 77 when every RUN test skipped; else 0. */
static inline int test_result(void)
{
    if (test_failures) {
        fprintf(stderr, "FAILED: %d check(s)\n", test_failures);
        return 1;
    }
    if (test_runs > 0 && test_skips == test_runs)
        return TEST_SKIP;
    return 0;
}
#define TEST_RESULT() test_result()

/* Skips the whole program at once, e.g. without a GPU. */
#define TEST_SKIP_ALL(...)                                                                         \
    do {                                                                                           \
        fprintf(stderr, "skipped: ");                                                              \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(TEST_SKIP);                                                                           \
    } while (0)

#define TEST_FAIL_AT(file, line, ...)                                                              \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", file, line);                                                    \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        test_note_failure_();                                                                      \
    } while (0)

/* Runs `int fn(void)`: 0 passes, TEST_SKIP skips, anything else fails. */
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        int test_before_ = test_failures;                                                          \
        int test_rc_ = fn();                                                                       \
        test_runs++;                                                                               \
        if (test_rc_ == TEST_SKIP) {                                                               \
            test_skips++;                                                                          \
            fprintf(stderr, "skip %s\n", #fn);                                                     \
        } else if (test_rc_ != 0 || test_failures != test_before_) {                               \
            if (test_failures == test_before_)                                                     \
                test_note_failure_();                                                              \
            fprintf(stderr, "FAIL %s\n", #fn);                                                     \
        } else {                                                                                   \
            fprintf(stderr, "ok   %s\n", #fn);                                                     \
        }                                                                                          \
    } while (0)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            TEST_FAIL_AT(__FILE__, __LINE__, "check failed: %s (last error: %s)", #cond,           \
                         kvf_last_error());                                                        \
    } while (0)

/* Stops the test: for a failure that later checks cannot survive. */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            TEST_FAIL_AT(__FILE__, __LINE__, "requirement failed: %s (last error: %s)", #cond,     \
                         kvf_last_error());                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long test_a_ = (long long)(a), test_b_ = (long long)(b);                              \
        if (test_a_ != test_b_)                                                                    \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, test_a_, test_b_);  \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                         \
    do {                                                                                           \
        unsigned long long test_a_ = (unsigned long long)(a);                                      \
        unsigned long long test_b_ = (unsigned long long)(b);                                      \
        if (test_a_ != test_b_)                                                                    \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s == %s: 0x%llx != 0x%llx", #a, #b, test_a_,        \
                         test_b_);                                                                 \
    } while (0)

#define CHECK_STATUS(expr, expected)                                                               \
    do {                                                                                           \
        kvf_status test_got_ = (expr), test_want_ = (expected);                                    \
        if (test_got_ != test_want_)                                                               \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: got %d (%s), expected %d (%s); last error: %s",  \
                         #expr, (int)test_got_, kvf_status_str(test_got_), (int)test_want_,        \
                         kvf_status_str(test_want_), kvf_last_error());                            \
    } while (0)

#define CHECK_MEM_EQ(a, b, n)                                                                      \
    do {                                                                                           \
        size_t test_off_ = test_mem_diff((a), (b), (n));                                           \
        if (test_off_ != (size_t)-1)                                                               \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s and %s differ at byte %zu of %zu", #a, #b,        \
                         test_off_, (size_t)(n));                                                  \
    } while (0)

/* Contains `needle`, e.g. an error message naming a file. */
#define CHECK_STR_HAS(haystack, needle)                                                            \
    do {                                                                                           \
        const char *test_h_ = (haystack), *test_n_ = (needle);                                     \
        if (!test_h_ || !strstr(test_h_, test_n_))                                                 \
            TEST_FAIL_AT(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",                     \
                         test_h_ ? test_h_ : "(null)", test_n_);                                   \
    } while (0)

/* Offset of the first differing byte, or (size_t)-1 when equal. */
static inline size_t test_mem_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *p = a, *q = b;
    for (size_t i = 0; i < n; i++)
        if (p[i] != q[i])
            return i;
    return (size_t)-1;
}

static inline uint64_t test_xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Deterministic, never all-zero bytes: a copy that moved nothing (or
 * zeros) cannot pass for one that moved the data. */
static inline void test_fill_random(void *buf, size_t n, uint64_t seed)
{
    unsigned char *p = buf;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (s == 0)
        s = 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = test_xorshift64(&s);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = test_xorshift64(&s);
        memcpy(p + i, &v, n - i);
    }
}

/* Fisher-Yates shuffle of a[0..n), deterministic in seed. */
static inline void test_shuffle_u32(uint32_t *a, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(test_xorshift64(&s) % i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* a[0..n) = a random permutation of 0..n-1, deterministic in seed. */
static inline void test_permutation(uint32_t *a, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (uint32_t)i;
    test_shuffle_u32(a, n, seed);
}

/* A fresh directory under $TMPDIR (or /tmp); its path in out. 0 or -1. */
static inline int test_tmpdir(char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    int n = snprintf(out, cap, "%s/kvferry-test-XXXXXX", base);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    if (!mkdtemp(out)) {
        fprintf(stderr, "mkdtemp %s: %s\n", out, strerror(errno));
        return -1;
    }
    return 0;
}

static inline int test_rmtree_one_(const char *path, const struct stat *sb, int flag,
                                   struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "remove %s: %s\n", path, strerror(errno));
    return 0;
}

/* rm -rf; does not follow symbolic links. */
static inline void test_rmtree(const char *path)
{
    nftw(path, test_rmtree_one_, 16, FTW_DEPTH | FTW_PHYS);
}

/* Open descriptors of this process, or -1 without /proc. */
static inline int test_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory stream's own */
}

/* Whether this build has the store `name` ("redis", "s3"): kvf_info's
 * remote_built says whether every remote store is built, which a build
 * with Redis and without S3 is not. */
static inline bool test_store_built(const char *name)
{
    kvf_store_info si = KVF_STORE_INFO_INIT;
    for (size_t i = 0; kvf_store_info_get(i, &si) == KVF_OK; i++)
        if (!strcmp(si.name, name))
            return si.built != 0;
    return false;
}

/* Whether a TCP port of the loopback address is free to listen on now. */
static inline bool test_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

#endif /* KVF_TESTUTIL_H */
