/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's large batches: batches of more than one part (4096 moves),
 * with hazards between them and each move's status at its own index; moves
 * failing their checks inside one; a dependency completing while a batch
 * is still being registered in slices; one batch's chunks taken by two
 * workers at once; a batch of more than 512 moves copying while its later
 * parts are registered.
 */
#include "engine_fixture.h"

/* KVF_HOST_ASYNC=1: the host backend takes copy_async, the path of a GPU */
static bool host_async(void)
{
    const char *v = getenv("KVF_HOST_ASYNC");
    return v && strcmp(v, "1") == 0;
}

/* An engine on the host backend with one pool of n primary and n
 * secondary slots of 64 bytes; their bases in *prim, *sec. */
static kvf_engine *slots64_engine(uint32_t n, uint32_t threads, uint8_t **prim, uint8_t **sec)
{
    kvf_geometry g = {1, 1, 1, 4, 4, KVF_DTYPE_FP32, KVF_ORDER_HEAD_MAJOR}; /* 64 bytes */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = threads;
    kvf_engine *e;
    if (kvf_engine_create(&cfg, &e) != KVF_OK)
        return NULL;
    kvf_pool_desc d = {KVF_MEMORY_HOST, NULL, 0, n};
    if (kvf_engine_add_pool(e, &g, &d, &d, NULL) != KVF_OK ||
        kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, (void **)prim) != KVF_OK ||
        kvf_engine_slot_ptr(e, 0, KVF_LEVEL_SECONDARY, 0, (void **)sec) != KVF_OK) {
        fprintf(stderr, "64-byte slots engine: %s\n", kvf_last_error());
        kvf_engine_destroy(e);
        return NULL;
    }
    return e;
}

/* Batches larger than one part (4096 moves) are queued in parts: hazards
 * between two such batches, and each move's status at its own index. */
static int test_large_batches(void)
{
    enum { N = 10000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 3, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64);
    test_fill_random(orig, (size_t)N * 64, 2024);
    memcpy(prim, orig, (size_t)N * 64);
    uint32_t *perm = malloc(N * sizeof *perm);
    test_permutation(perm, N, 5);
    kvf_move *off = malloc(N * sizeof *off), *on = malloc(N * sizeof *on);
    for (uint32_t i = 0; i < N; i++) {
        off[i] = (kvf_move){i, perm[i], 0};
        on[i] = (kvf_move){perm[i], (i + 1) % N, 0}; /* overwrites slots still being read */
    }
    kvf_ticket t1, t2;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, off, N, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, &t2), KVF_OK);
    kvf_status *per = malloc(N * sizeof *per);
    CHECK_STATUS(kvf_wait(e, t2, per), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t1, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        CHECK(memcmp(prim + (size_t)((i + 1) % N) * 64, orig + (size_t)i * 64, 64) == 0);
    }
    /* one failing move reports at its own index */
    fail_dst = sec + (size_t)perm[9000] * 64;
    kvf__set_copy_hook(fail_copy);
    for (uint32_t i = 0; i < N; i++)
        off[i] = (kvf_move){(i + 1) % N, perm[i], 0};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, off, N, &t1), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t1, per), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    if (!host_async()) {
        for (uint32_t i = 0; i < N; i++)
            CHECK_STATUS(per[i], i == 9000 ? KVF_ERR_IO : KVF_OK);
    } else {
        /* an async backend fails the chunk the copy was in (a GPU's copies
         * of a chunk end together): that chunk only, at most one part */
        uint32_t failed = 0;
        for (uint32_t i = 0; i < N; i++)
            if (per[i] != KVF_OK) {
                CHECK_STATUS(per[i], KVF_ERR_IO);
                failed++;
            }
        CHECK_STATUS(per[9000], KVF_ERR_IO);
        CHECK(failed >= 1 && failed <= 4096);
    }
    /* fire and forget of a large batch, then a sync */
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, NULL), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(e, NULL), KVF_OK);
    kvf_engine_destroy(e);
    free(orig);
    free(perm);
    free(off);
    free(on);
    free(per);
    return 0;
}

/* A batch is registered in slices, the engine lock dropped between them.
 * A batch it depends on (registered in the first slice) completes in the
 * gap: that must not start the batch before its last slice is registered.
 * The offload it depends on is held in its copy until the gap, then
 * awaited there. */
static const uint8_t *hold_src;
static atomic_bool hold_released;
static kvf_engine *gap_engine;
static kvf_ticket gap_ticket;
static atomic_int gap_calls;
static kvf_status hold_copy(const kvf__copy *c)
{
    for (int ms = 0; c->src == hold_src && !atomic_load(&hold_released) && ms < 5000; ms++)
        usleep(1000);
    return KVF_OK;
}
static void gap_hook(void)
{
    if (atomic_fetch_add(&gap_calls, 1) != 0)
        return;
    atomic_store(&hold_released, true);
    while (kvf_poll(gap_engine, gap_ticket, NULL) == KVF_INPROGRESS)
        usleep(100);
}

static int test_dependency_done_while_registering(void)
{
    /* worker mode: one batch of three slices; host-async: parts of 512,
     * 1024 and 1464 moves (submit.c), the last of two slices */
    enum { N = 3000 };
    const uint32_t dep_at = host_async() ? 512 + 1024 : 0; /* first move of a sliced batch */
    const int gaps = host_async() ? 1 : 2;
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 3, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64), *fresh = malloc(64);
    test_fill_random(orig, (size_t)N * 64, 31);
    test_fill_random(fresh, 64, 32);
    memcpy(prim, orig, (size_t)N * 64);
    kvf_move *on = malloc(N * sizeof *on);
    for (uint32_t i = 0; i < N; i++)
        on[i] = (kvf_move){i, i, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, on, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    memcpy(prim, fresh, 64);
    /* the offload of primary slot 0 (fresh data) to secondary slot 0, held */
    hold_src = prim;
    atomic_store(&hold_released, false);
    atomic_store(&gap_calls, 0);
    kvf__set_copy_hook(hold_copy);
    kvf_move a = {0, 0, 0};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &a, 1, &gap_ticket), KVF_OK);
    /* an onboard whose move dep_at reads what the offload writes */
    for (uint32_t i = 0; i < N; i++)
        on[i] = (kvf_move){i, (i + 1) % N, 0};
    on[0] = on[dep_at];
    on[dep_at] = (kvf_move){0, 1, 0};
    gap_engine = e;
    kvf__set_register_hook(gap_hook);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, &t), KVF_OK);
    kvf__set_register_hook(NULL);
    kvf__set_copy_hook(NULL);
    CHECK(atomic_load(&gap_calls) == gaps);
    kvf_status *per = malloc(N * sizeof *per);
    CHECK_STATUS(kvf_wait(e, t, per), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        /* slot 0's fresh data went down first, then came back up into slot 1 */
        const uint8_t *want = on[i].src == 0 ? fresh : orig + (size_t)on[i].src * 64;
        CHECK(memcmp(prim + (size_t)on[i].dst * 64, want, 64) == 0);
    }
    CHECK_STATUS(kvf_sync_stream(e, NULL), KVF_OK);
    kvf_engine_destroy(e);
    free(orig);
    free(fresh);
    free(on);
    free(per);
    return 0;
}

/* A batch is shared by the workers: while one is held up in its chunk,
 * another takes the next (a worker claiming a chunk wakes the next idle
 * one; only a batch becoming ready used to). The copy of the first move
 * waits, up to 2 s, for a copy on another thread: with one worker left to
 * do the whole batch it waits in vain. */
static const uint8_t *stall_src;
static pthread_mutex_t copy_threads_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t copy_threads[2];
static atomic_int copy_nthreads;
static atomic_bool stall_timed_out;
static kvf_status stall_copy(const kvf__copy *c)
{
    pthread_t self = pthread_self();
    pthread_mutex_lock(&copy_threads_mu);
    int n = atomic_load(&copy_nthreads);
    bool known = false;
    for (int k = 0; k < n; k++)
        known |= pthread_equal(copy_threads[k], self);
    if (!known && n < 2) {
        copy_threads[n] = self;
        atomic_store(&copy_nthreads, n + 1);
    }
    pthread_mutex_unlock(&copy_threads_mu);
    if (c->src == stall_src) {
        int waited_ms = 0;
        while (atomic_load(&copy_nthreads) < 2 && waited_ms < 2000) {
            usleep(1000);
            waited_ms++;
        }
        if (atomic_load(&copy_nthreads) < 2)
            atomic_store(&stall_timed_out, true);
    }
    return KVF_OK;
}

static int test_batch_shared_by_workers(void)
{
    if (host_async())
        return 0; /* copies run on the backend's thread, not the workers */
    enum { N = 2000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 2, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    test_fill_random(prim, (size_t)N * 64, 91);
    kvf_move *mv = malloc(N * sizeof *mv);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){i, i, 0};
    /* both workers asleep first (a worker not yet waiting would find the
     * batch on its own) */
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    usleep(50 * 1000);
    stall_src = prim;
    atomic_store(&copy_nthreads, 0);
    atomic_store(&stall_timed_out, false);
    kvf__set_copy_hook(stall_copy);
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    CHECK(atomic_load(&copy_nthreads) == 2);
    CHECK(!atomic_load(&stall_timed_out));
    CHECK(memcmp(prim, sec, (size_t)N * 64) == 0);
    kvf_engine_destroy(e);
    free(mv);
    return 0;
}

/* Large batches (in parts, sorted by secondary slot): one that writes a
 * slot twice is refused whole, naming the move; an onboard where some
 * moves fail their checks (their secondary slots hold nothing) reports
 * each at its own index, leaves their destinations alone, and the others
 * land. */
static int test_large_batch_short_reads(void)
{
    enum { N = 12000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 2, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64);
    test_fill_random(orig, (size_t)N * 64, 77);
    memcpy(prim, orig, (size_t)N * 64);
    uint32_t *perm = malloc(N * sizeof *perm);
    test_permutation(perm, N, 78);
    /* every 500th secondary slot is left empty */
    kvf_move *mv = malloc(N * sizeof *mv);
    uint32_t n = 0;
    for (uint32_t i = 0; i < N; i++)
        if (perm[i] % 500 != 0)
            mv[n++] = (kvf_move){i, perm[i], 0};
    /* a large batch writing one slot twice is refused whole, naming the
     * second move (sorted offloads find it by their counts) */
    kvf_ticket t;
    kvf_move keep = mv[n - 1];
    mv[n - 1].dst = mv[17].dst;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, n, &t), KVF_ERR_INVALID);
    char want[96];
    snprintf(want, sizeof want, "move %u writes secondary slot %llu", n - 1,
             (unsigned long long)mv[17].dst);
    CHECK_STR_HAS(kvf_last_error(), want);
    mv[n - 1] = keep;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, n, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    memset(prim, 0xA5, (size_t)N * 64);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){perm[i], (i + 7) % N, 0};
    kvf_status *per = malloc(N * sizeof *per);
    mv[N - 1].dst = mv[3].dst;
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, mv, N, &t), KVF_ERR_INVALID);
    snprintf(want, sizeof want, "move %u writes primary slot %llu", N - 1,
             (unsigned long long)mv[3].dst);
    CHECK_STR_HAS(kvf_last_error(), want);
    mv[N - 1].dst = (N - 1 + 7) % N;
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, mv, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, per), KVF_ERR_NOT_FOUND);
    for (uint32_t i = 0; i < N; i++) {
        const uint8_t *got = prim + (size_t)((i + 7) % N) * 64;
        if (perm[i] % 500 == 0) {
            CHECK_STATUS(per[i], KVF_ERR_NOT_FOUND);
            CHECK(got[0] == 0xA5 && memcmp(got, got + 1, 63) == 0);
        } else {
            CHECK_STATUS(per[i], KVF_OK);
            CHECK(memcmp(got, orig + (size_t)i * 64, 64) == 0);
        }
    }
    kvf_engine_destroy(e);
    free(orig);
    free(perm);
    free(mv);
    free(per);
    return 0;
}

/* A batch of more than 512 moves that the backend copies asynchronously
 * goes in parts (512, 1024, ...), each handed to the backend once it is
 * registered: its first copies run while its last part is still being
 * registered (they used to wait for the registration of all 4096 moves a
 * part could hold). The register hook runs between slices of the third
 * part, with the engine lock dropped: it waits there for a copy. */
static atomic_int copies_seen;
static atomic_int copies_at_gap; /* -1 until the hook ran */
static kvf_status count_copy(const kvf__copy *c)
{
    (void)c;
    atomic_fetch_add(&copies_seen, 1);
    return KVF_OK;
}
static void copy_before_last_part(void)
{
    if (atomic_load(&copies_at_gap) >= 0)
        return;
    for (int ms = 0; atomic_load(&copies_seen) == 0 && ms < 2000; ms++)
        usleep(1000);
    atomic_store(&copies_at_gap, atomic_load(&copies_seen));
}

static int test_first_part_copies_while_registering(void)
{
    enum { N = 3000 }; /* parts of 512, 1024 and 1464 moves */
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 2, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    test_fill_random(prim, (size_t)N * 64, 41);
    memset(sec, 0xA5, (size_t)N * 64);
    kvf_move *mv = malloc(N * sizeof *mv);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){i, N - 1 - i, 0};
    atomic_store(&copies_seen, 0);
    atomic_store(&copies_at_gap, -1);
    kvf__set_copy_hook(count_copy);
    /* the worker mode copies no batch before it is whole: nothing to wait for */
    if (host_async())
        kvf__set_register_hook(copy_before_last_part);
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, N, &t), KVF_OK);
    kvf__set_register_hook(NULL);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    if (host_async())
        CHECK(atomic_load(&copies_at_gap) > 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK(memcmp(sec + (size_t)(N - 1 - i) * 64, prim + (size_t)i * 64, 64) == 0);
    kvf_engine_destroy(e);
    free(mv);
    return 0;
}

int main(void)
{
    RUN(test_large_batches);
    RUN(test_large_batch_short_reads);
    RUN(test_dependency_done_while_registering);
    RUN(test_batch_shared_by_workers);
    RUN(test_first_part_copies_while_registering);
    return TEST_RESULT();
}
