/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Crash consistency of the file tier. A child process offloads blocks to
 * files (KVF_FSYNC_BATCH) in a loop and reports each key on a pipe once its
 * batch's kvf_wait returned KVF_OK; the parent kills it with SIGKILL at a
 * random moment, then opens a new engine on the same directory and
 * namespace and checks that
 *  - every committed block onboards byte for byte,
 *  - every block file present (committed or not yet reported) onboards
 *    byte for byte: renames are atomic, so no file is ever half-written,
 *  - opening removed the dead child's temporary files,
 *  - kvf__blockfile_scan finds nothing corrupt.
 * Several rounds, each with its own layout and timing. KVF_CRASH_SEED and
 * KVF_CRASH_ROUNDS reproduce or extend a run.
 */
#include "blockfile.h"
#include "layout.h"
#include "testutil.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define POISON 0xA5
#define SLOTS 6      /* primary slots: up to 4 new keys and 2 overwrites a batch */
#define MAX_KEYS 256 /* new keys a round writes at most; then only overwrites */
#define DISK_BUDGET ((size_t)48 << 20)
#define MAX_POOLS 2

typedef struct layout {
    uint32_t npools;
    kvf_geometry g[MAX_POOLS];
} layout;

/* fp16, 16 tokens a block: 4 KiB, 8 KiB, 64 KiB, 256 KiB, 1 MiB */
#define G(layers, heads, head)                                                                     \
    {                                                                                              \
        layers, 2, heads, 16, head, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR                           \
    }
static const layout layouts[] = {
    {1, {G(1, 2, 32)}}, {2, {G(2, 2, 32), G(2, 8, 64)}}, {2, {G(1, 2, 32), G(32, 8, 64)}},
    {1, {G(8, 8, 64)}}, {2, {G(2, 2, 32), G(8, 8, 64)}},
};
#define NLAYOUTS (sizeof layouts / sizeof *layouts)

static char base[512]; /* file_dir of every round */

static uint64_t round_key(int round, uint32_t idx)
{
    return (uint64_t)(round + 1) << 32 | idx;
}

static uint64_t pool_seed(uint64_t key, uint32_t pool)
{
    return key ^ (uint64_t)pool << 56;
}

static size_t block_bytes(const layout *l, uint32_t pool)
{
    size_t b = 0;
    kvf_geometry_block_bytes(&l->g[pool], &b);
    return b;
}

static uint32_t max_keys_of(const layout *l)
{
    size_t total = 0;
    for (uint32_t p = 0; p < l->npools; p++)
        total += block_bytes(l, p);
    size_t n = DISK_BUDGET / total;
    return n > MAX_KEYS ? MAX_KEYS : n < 8 ? 8 : (uint32_t)n;
}

static kvf_status open_engine(const layout *l, const char *ns, kvf_engine **e_p)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file.dir = base;
    cfg.file.namespace_ = ns;
    cfg.file.fsync = KVF_FSYNC_BATCH;
    kvf_engine *e;
    kvf_status st = kvf_engine_create(&cfg, &e);
    if (st != KVF_OK)
        return st;
    for (uint32_t p = 0; p < l->npools; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
        st = kvf_engine_add_pool(e, &l->g[p], &prim, NULL, NULL);
        if (st != KVF_OK) {
            kvf_engine_destroy(e);
            return st;
        }
    }
    *e_p = e;
    return KVF_OK;
}

/* ---- the child: offloads until killed ------------------------------------ */

static void child_die(int code, const char *what)
{
    fprintf(stderr, "crash child %ld: %s: %s\n", (long)getpid(), what, kvf_last_error());
    _exit(code);
}

static void child_main(int round, const layout *l, const char *ns, int wfd, uint64_t seed)
{
    kvf_engine *e;
    if (open_engine(l, ns, &e) != KVF_OK)
        child_die(2, "engine");
    uint32_t max_keys = max_keys_of(l);
    /* keys 0..committed-1 are on disk; next-1 is the last queued */
    uint32_t committed = 0, next = 0;
    uint64_t rng = seed | 1;
    for (;;) {
        uint64_t keys[SLOTS];
        uint32_t n = 0, nnew = 0;
        uint32_t want_new = 1 + (uint32_t)(test_xorshift64(&rng) % 4);
        while (nnew < want_new && next < max_keys) {
            keys[n++] = round_key(round, next++);
            nnew++;
        }
        /* overwrites of committed keys, with the same bytes: two at most,
         * or a whole batch once every new key is written */
        uint32_t want_old = next < max_keys ? (uint32_t)(test_xorshift64(&rng) % 3) : SLOTS;
        for (uint32_t j = 0; j < want_old && committed > 0 && n < SLOTS; j++) {
            uint64_t k = round_key(round, (uint32_t)(test_xorshift64(&rng) % committed));
            bool dup = false;
            for (uint32_t i = 0; i < n; i++)
                dup |= keys[i] == k;
            if (!dup)
                keys[n++] = k;
        }
        if (n == 0)
            child_die(3, "nothing to write");
        kvf_move mv[SLOTS];
        for (uint32_t i = 0; i < n; i++) {
            for (uint32_t p = 0; p < l->npools; p++) {
                void *slot;
                if (kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, i, &slot) != KVF_OK)
                    child_die(3, "slot_ptr");
                test_fill_random(slot, block_bytes(l, p), pool_seed(keys[i], p));
            }
            mv[i] = TO_KEY(i, keys[i]);
        }
        kvf_ticket t;
        if (kvf_offload(e, KVF_TIER_DISK, mv, n, &t) != KVF_OK)
            child_die(4, "offload");
        kvf_status per[SLOTS];
        kvf_status st = kvf_wait(e, t, per);
        if (st != KVF_OK) {
            fprintf(stderr, "crash child: batch failed: %s\n", kvf_status_str(st));
            _exit(5);
        }
        /* one write of at most 48 bytes: atomic on a pipe */
        if (write(wfd, keys, n * sizeof *keys) != (ssize_t)(n * sizeof *keys))
            _exit(6);
        committed = next;
    }
}

/* ---- the parent: kills, reopens, checks ---------------------------------- */

typedef struct reader {
    int fd;
    uint8_t buf[8 * 64];
    size_t have;
    bool eof;
} reader;

/* Reads what is there (waiting up to timeout_ms for something) and marks
 * every whole key record. Returns the records read, or -1 on an error. */
static int read_keys(reader *r, int round, uint32_t max_keys, bool *committed, int timeout_ms)
{
    struct pollfd pfd = {r->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr < 0)
        return errno == EINTR ? 0 : -1;
    if (pr == 0)
        return 0;
    ssize_t got = read(r->fd, r->buf + r->have, sizeof r->buf - r->have);
    if (got < 0)
        return errno == EINTR ? 0 : -1;
    if (got == 0) {
        r->eof = true;
        return 0;
    }
    r->have += (size_t)got;
    int records = 0;
    size_t off = 0;
    for (; off + 8 <= r->have; off += 8) {
        uint64_t k;
        memcpy(&k, r->buf + off, 8);
        uint32_t idx = (uint32_t)k;
        if (k >> 32 != (uint64_t)(round + 1) || idx >= max_keys) {
            TEST_FAIL_AT(__FILE__, __LINE__, "child reported key 0x%llx", (unsigned long long)k);
            continue;
        }
        committed[idx] = true;
        records++;
    }
    memmove(r->buf, r->buf + off, r->have - off);
    r->have -= off;
    return records;
}

/* Onboards keys[0..n) into poisoned slots and compares every pool's bytes.
 * Returns the keys that failed. */
static int verify_keys(kvf_engine *e, const layout *l, const uint64_t *keys, size_t n,
                       const char *what)
{
    size_t maxb = 0;
    for (uint32_t p = 0; p < l->npools; p++)
        if (block_bytes(l, p) > maxb)
            maxb = block_bytes(l, p);
    uint8_t *want = malloc(maxb);
    REQUIRE(want);
    int bad = 0;
    for (size_t first = 0; first < n; first += SLOTS) {
        size_t m = n - first < SLOTS ? n - first : SLOTS;
        kvf_move mv[SLOTS];
        for (size_t i = 0; i < m; i++) {
            for (uint32_t p = 0; p < l->npools; p++) {
                void *slot;
                REQUIRE(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, (uint32_t)i, &slot) == KVF_OK);
                memset(slot, POISON, block_bytes(l, p));
            }
            mv[i] = FROM_KEY(keys[first + i], i);
        }
        kvf_ticket t;
        CHECK_STATUS(kvf_onboard(e, KVF_TIER_DISK, mv, m, &t), KVF_OK);
        kvf_status per[SLOTS];
        kvf_wait(e, t, per);
        for (size_t i = 0; i < m; i++) {
            unsigned long long k = (unsigned long long)keys[first + i];
            if (per[i] != KVF_OK) {
                /* a clear error rather than wrong bytes, but with atomic
                 * renames every file present must be whole */
                TEST_FAIL_AT(__FILE__, __LINE__, "%s block 0x%llx: onboard: %s", what, k,
                             kvf_status_str(per[i]));
                bad++;
                continue;
            }
            for (uint32_t p = 0; p < l->npools; p++) {
                void *slot;
                REQUIRE(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, (uint32_t)i, &slot) == KVF_OK);
                test_fill_random(want, block_bytes(l, p), pool_seed(keys[first + i], p));
                size_t off = test_mem_diff(slot, want, block_bytes(l, p));
                if (off != (size_t)-1) {
                    TEST_FAIL_AT(__FILE__, __LINE__,
                                 "%s block 0x%llx pool %u: WRONG BYTES from byte %zu of %zu", what,
                                 k, p, off, block_bytes(l, p));
                    bad++;
                    break;
                }
            }
        }
    }
    free(want);
    return bad;
}

typedef struct dir_list {
    uint64_t *keys; /* <32 hex>.kvf files: the low halves, the high ones 0 */
    size_t nkeys;
    int tmp_all, tmp_child; /* temporary files, and those of the child's pid */
} dir_list;

static void list_dir(const char *root, pid_t child, dir_list *dl)
{
    memset(dl, 0, sizeof *dl);
    DIR *d = opendir(root);
    REQUIRE(d);
    size_t cap = 0;
    char mark[32];
    snprintf(mark, sizeof mark, ".%ld.", (long)child);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (n[0] == '.' && len > 34 && strcmp(n + len - 4, ".tmp") == 0) {
            dl->tmp_all++;
            if (strstr(n + 33, mark) == n + 33)
                dl->tmp_child++;
            continue;
        }
        if (len != 36 || strcmp(n + 32, ".kvf") != 0)
            continue;
        char *end;
        unsigned long long k = strtoull(n + 16, &end, 16);
        if (end != n + 32 || strncmp(n, "0000000000000000", 16) != 0) {
            TEST_FAIL_AT(__FILE__, __LINE__, "%s/%s: not a block file name", root, n);
            continue;
        }
        if (dl->nkeys == cap) {
            cap = cap ? 2 * cap : 64;
            dl->keys = realloc(dl->keys, cap * sizeof *dl->keys);
            REQUIRE(dl->keys);
        }
        dl->keys[dl->nkeys++] = k;
    }
    closedir(d);
}

typedef struct scan_counts {
    int ok, torn, bad;
} scan_counts;

static void scan_visit(void *arg, kvf_key key, kvf_status st, const char *detail)
{
    scan_counts *c = arg;
    if (st == KVF_OK) {
        c->ok++;
    } else if (detail && strstr(detail, "torn")) {
        c->torn++;
    } else {
        c->bad++;
        fprintf(stderr, "scan: block " KVF_KEY_FMT ": %s: %s\n", KVF_KEY_ARGS(TKEY(key)),
                kvf_status_str(st), detail ? detail : "");
    }
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int crash_round(int round, uint64_t *rng)
{
    const layout *l = &layouts[(size_t)round % NLAYOUTS];
    uint32_t max_keys = max_keys_of(l);
    char ns[32], root[600];
    snprintf(ns, sizeof ns, "crash%d", round);
    snprintf(root, sizeof root, "%s/%s", base, ns);
    bool committed[MAX_KEYS] = {false};

    /* kill once this many records came, after up to 80 ms more */
    uint32_t limit = max_keys / 2 < 24 ? max_keys / 2 : 24;
    int want = 1 + (int)(test_xorshift64(rng) % limit);
    unsigned delay_us = (unsigned)(test_xorshift64(rng) % 80000);
    uint64_t child_seed = test_xorshift64(rng);

    int p[2];
    REQUIRE(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_main(round, l, ns, p[1], child_seed);
        _exit(7);
    }
    close(p[1]);

    reader r = {p[0], {0}, 0, false};
    int records = 0;
    uint64_t t0 = now_us();
    while (records < want && !r.eof && now_us() - t0 < 30000000u) {
        int got = read_keys(&r, round, max_keys, committed, 1000);
        if (got < 0)
            break;
        records += got;
    }
    bool early = records < want;
    if (!early && delay_us)
        usleep(delay_us);
    kill(pid, SIGKILL);
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    if (early || !WIFSIGNALED(ws) || WTERMSIG(ws) != SIGKILL) {
        TEST_FAIL_AT(__FILE__, __LINE__,
                     "round %d: child ended on its own (%s %d) after %d of %d records", round,
                     WIFEXITED(ws) ? "exit" : "signal",
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws), records, want);
        close(p[0]);
        return 1;
    }
    /* whatever the child reported before it died counts as committed */
    while (!r.eof) {
        int got = read_keys(&r, round, max_keys, committed, 5000);
        if (got < 0)
            break;
        records += got;
    }
    CHECK_EQ_INT(r.have, 0); /* no torn record */
    close(p[0]);

    dir_list before;
    list_dir(root, pid, &before);
    free(before.keys);

    kvf_engine *e;
    kvf_status st = open_engine(l, ns, &e);
    CHECK_STATUS(st, KVF_OK);
    if (st != KVF_OK)
        return 1;

    /* opening removed the dead writer's leftovers */
    dir_list after;
    list_dir(root, pid, &after);
    CHECK_EQ_INT(after.tmp_child, 0);
    CHECK_EQ_INT(after.tmp_all, 0);

    uint64_t keys[MAX_KEYS];
    size_t ncommitted = 0;
    for (uint32_t i = 0; i < max_keys; i++)
        if (committed[i])
            keys[ncommitted++] = round_key(round, i);
    int bad = verify_keys(e, l, keys, ncommitted, "committed");

    /* every file present: committed, or written and not yet reported */
    size_t extra = 0;
    for (size_t i = 0; i < after.nkeys; i++) {
        uint64_t k = after.keys[i];
        if (k >> 32 != (uint64_t)(round + 1) || (uint32_t)k >= max_keys)
            TEST_FAIL_AT(__FILE__, __LINE__, "round %d: unexpected block file 0x%016llx", round,
                         (unsigned long long)k);
        else if (!committed[(uint32_t)k])
            extra++;
    }
    bad += verify_keys(e, l, after.keys, after.nkeys, "present");
    CHECK(after.nkeys >= ncommitted);
    kvf_engine_destroy(e);

    /* fsck's view: nothing corrupt, nothing torn */
    kvf_geometry gs[MAX_POOLS];
    memcpy(gs, l->g, sizeof gs);
    kvf__blockfile_dir d;
    memset(&d, 0, sizeof d);
    CHECK_STATUS(kvf__blockfile_open_dir(base, ns, kvf__geometry_fingerprint(gs, l->npools),
                                         KVF_FSYNC_NONE, &d),
                 KVF_OK);
    if (d.root) {
        scan_counts c = {0, 0, 0};
        CHECK_STATUS(kvf__blockfile_scan(&d, scan_visit, &c), KVF_OK);
        CHECK_EQ_INT(c.bad, 0);
        CHECK_EQ_INT(c.torn, 0);
        CHECK_EQ_INT(c.ok, (long long)after.nkeys);
        kvf__blockfile_close_dir(&d);
    }

    size_t total = 0;
    for (uint32_t q = 0; q < l->npools; q++)
        total += block_bytes(l, q);
    fprintf(stderr,
            "round %d: %u pool(s), %zu KiB a block; killed %u us after %d records: %zu committed, "
            "%zu more present, %d stale temporary file(s) removed%s\n",
            round, l->npools, total >> 10, delay_us, want, ncommitted, extra, before.tmp_child,
            bad ? " -- FAILED" : "");
    free(after.keys);
    test_rmtree(root);
    return bad != 0;
}

static int test_crash(void)
{
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    const char *env = getenv("KVF_CRASH_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 0);
    int rounds = 5;
    env = getenv("KVF_CRASH_ROUNDS");
    if (env && atoi(env) > 0)
        rounds = atoi(env);
    fprintf(stderr, "KVF_CRASH_SEED=%llu\n", (unsigned long long)seed);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    if (rng == 0)
        rng = 1;
    int failed = 0;
    for (int r = 0; r < rounds; r++)
        failed += crash_round(r, &rng);
    return failed != 0;
}

int main(void)
{
    /* a hung child or parent fails the test instead of stalling it */
    alarm(120);
    if (test_tmpdir(base, sizeof base) != 0)
        TEST_SKIP_ALL("no temporary directory");
    RUN(test_crash);
    test_rmtree(base);
    return TEST_RESULT();
}
