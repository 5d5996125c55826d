/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block keys are 128 bits everywhere: keys equal in one half and different
 * in the other name different blocks in every tier (files, mem://, Redis
 * started here when redis-server is installed) and through every call
 * (engine moves, removals, the cache's put, get and lookup). A move names
 * its block by kvf_move.key: a slot where the key belongs, a key beside
 * two slots, or no key where one is needed is refused, naming the move.
 */
#include "engine.h"
#include "engine_fixture.h"
#include "store.h"
#ifdef KVF_HAVE_HIREDIS
#include "redis_server.h"
#endif

/* Keys in pairs: equal low halves, equal high halves, and each pair's
 * other members, so that any 64 bits of a key kept alone (a name, a map,
 * a header field) would give one block's bytes for another's. */
static const kvf_key KEYS[6] = {
    {0, 0x5a5a},                     /* a 64-bit key, zero-extended */
    {0x1, 0x5a5a},                   /* same low half */
    {0x8000000000000000ull, 0x5a5a}, /* same low half, top bit */
    {0x1, 0x5a5b},                   /* same high half as [1] */
    {0xfedcba9876543210ull, 0x5a5a}, /* same low half */
    {0x5a5a, 0},                     /* the halves swapped */
};
#define NK (sizeof KEYS / sizeof *KEYS)

/* Stores block i (bytes of tag 100 + i) from slot i under KEYS[i] in
 * `tier`, all in one batch, then reads each back into a poisoned slot and
 * compares every byte; then removes KEYS[0] and finds the others still
 * there. */
static int round_trip(fixture *f, kvf_tier tier)
{
    kvf_move off[NK], on[NK];
    for (uint32_t i = 0; i < NK; i++) {
        fill_block(f, i, 100 + i);
        off[i] = TO_KEY(i, KEYS[i]);
        on[i] = FROM_KEY(KEYS[i], 8 + i);
        poison_block(f, 8 + i);
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f->e, tier, off, NK, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_onboard(f->e, tier, on, NK, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    for (uint32_t i = 0; i < NK; i++)
        if (expect_block(f, 8 + i, 100 + i, 16) != 0)
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: block " KVF_KEY_FMT " came back wrong",
                         kvf_tier_name(tier), KVF_KEY_ARGS(KEYS[i]));
    /* one removed: only that one */
    CHECK_STATUS(kvf_remove(f->e, tier, &KEYS[0], 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    kvf_status per[NK];
    for (uint32_t i = 0; i < NK; i++)
        poison_block(f, 8 + i);
    CHECK_STATUS(kvf_onboard(f->e, tier, on, NK, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, per), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per[0], KVF_ERR_NOT_FOUND);
    for (uint32_t i = 1; i < NK; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        CHECK(expect_block(f, 8 + i, 100 + i, 16) == 0);
    }
    return 0;
}

static int test_disk(void)
{
    fixture f;
    fx_init(&f, true, 16);
    round_trip(&f, KVF_TIER_DISK);
    /* the files are named by all 32 digits */
    char path[700];
    snprintf(path, sizeof path, "%s/test/" KVF_KEY_FMT ".kvf", f.dir, KVF_KEY_ARGS(KEYS[4]));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size > (off_t)KVF_BLOCK_HEADER_BYTES);
    fx_done(&f);
    return 0;
}

static int test_mem(void)
{
    fixture f;
    fx_remote = "mem://keywidth";
    fx_init(&f, false, 16);
    fx_remote = NULL;
    round_trip(&f, KVF_TIER_REMOTE);
    fx_done(&f);
    return 0;
}

#ifdef KVF_HAVE_HIREDIS
static char logged[1024];
static void keep_warning(void *arg, kvf_log_level level, const char *msg)
{
    (void)arg;
    if (level == KVF_LOG_WARN && strstr(msg, "format version 1"))
        snprintf(logged, sizeof logged, "%s", msg);
}
#endif

static void count_entry(void *arg, const kvf__store_entry *e)
{
    (void)e;
    ++*(size_t *)arg;
}

static int test_redis(void)
{
#ifndef KVF_HAVE_HIREDIS
    return TEST_SKIP; /* a build without hiredis has no redis:// */
#else
    if (!test_store_built("redis") || !redis_tool_found("redis-server"))
        return TEST_SKIP;
    static redis_server server;
    REQUIRE(redis_server_start(&server, NULL) == 0);
    char url[128];
    redis_url(url, sizeof url, &server, "");
    fixture f;
    fx_remote = url;
    fx_init(&f, false, 16);
    fx_remote = NULL;
    round_trip(&f, KVF_TIER_REMOTE);
    /* the server holds each under its full name */
    char name[128];
    snprintf(name, sizeof name, "kvf:test:" KVF_KEY_FMT, KVF_KEY_ARGS(KEYS[2]));
    redisContext *rc = redis_connect(server.port, NULL);
    REQUIRE(rc);
    redisReply *r = redisCommand(rc, "EXISTS %s", name);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);
    /* a value under a version-1 name (16 hex digits) is not listed as a
     * block, and the listing says so */
    r = redisCommand(rc, "SET kvf:test:0000000000005a5a %s", "old");
    if (r)
        freeReplyObject(r);
    redisFree(rc);
    kvf__store *remote = kvf__engine_store(f.e, KVF_TIER_REMOTE);
    REQUIRE(remote);
    size_t listed = 0;
    kvf_log_set_handler(keep_warning, NULL);
    CHECK_STATUS(kvf__store_list(remote, count_entry, &listed), KVF_OK);
    kvf_log_set_handler(NULL, NULL);
    CHECK_EQ_INT(listed, NK - 1); /* round_trip removed KEYS[0] */
    CHECK_STR_HAS(logged, "1 block of format version 1 (64-bit keys)");
    fx_done(&f);
    redis_server_stop(&server);
    return 0;
#endif
}

/* A key in a slot's place, a slot in a key's, or no key: refused whole,
 * naming the move, before anything moves. */
static int test_key_and_slot_apart(void)
{
    fixture f;
    fx_init(&f, true, 16);
    kvf_ticket t;
    kvf_move mv[2] = {TO_KEY(0, KEYS[1]), TO_KEY(1, KEYS[2])};
    mv[1].dst = 0x5a5a; /* a key's low half in the slot member */
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, mv, 2, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "move 1");
    CHECK_STR_HAS(kvf_last_error(), "dst must be 0");
    mv[1] = FROM_KEY(KEYS[2], 3);
    mv[1].src = 7;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &mv[1], 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "src must be 0");
    /* the old spelling, {slot, key, tokens}: no key at all */
    mv[0] = (kvf_move){.src = 0, .dst = 0x5a5a};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, mv, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "move 0");
    /* a key given to a move between slots */
    mv[0] = (kvf_move){.src = 0, .dst = 1, .key = KEYS[1]};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, mv, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "00000000000000010000000000005a5a");
    CHECK_STATUS(kvf_copy(f.e, mv, 1, &t), KVF_ERR_INVALID);
    /* two moves writing keys equal in one half are two blocks, not a collision */
    kvf_move two[2] = {TO_KEY(0, KEYS[0]), TO_KEY(1, KEYS[1])};
    fill_block(&f, 0, 1);
    fill_block(&f, 1, 2);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, two, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    two[1] = TO_KEY(1, KEYS[0]);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, two, 2, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "two moves write block 00000000000000000000000000005a5a");
    fx_done(&f);
    return 0;
}

/* The cache: keys equal in one half are separate blocks in the host and
 * disk tiers, in lookups, gets, pins and removals. */
static int test_cache(void)
{
    fixture f;
    fx_init(&f, true, 16);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 2; /* the rest go to disk */
    cc.disk.blocks = 16;
    kvf_cache *c;
    REQUIRE(kvf_cache_create(f.e, &cc, &c) == KVF_OK);
    uint32_t slots[NK], into[NK];
    for (uint32_t i = 0; i < NK; i++) {
        slots[i] = i;
        into[i] = 8 + i;
        fill_block(&f, i, 200 + i);
    }
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_put(c, KEYS, slots, NK, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(c, t, NULL), KVF_OK);
    size_t hits = 0;
    kvf_tier tiers[NK];
    CHECK_STATUS(kvf_cache_lookup(c, KEYS, NK, &hits, tiers), KVF_OK);
    CHECK_EQ_INT(hits, NK);
    int on_disk = 0;
    for (uint32_t i = 0; i < NK; i++)
        on_disk += tiers[i] == KVF_TIER_DISK;
    CHECK(on_disk >= (int)NK - 2);
    for (uint32_t i = 0; i < NK; i++)
        poison_block(&f, 8 + i);
    CHECK_STATUS(kvf_cache_get(c, KEYS, into, NK, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(c, t, NULL), KVF_OK);
    for (uint32_t i = 0; i < NK; i++)
        CHECK(expect_block(&f, 8 + i, 200 + i, 16) == 0);
    /* a key equal to a cached one in one half only is not cached */
    const kvf_key near[2] = {{0x2, 0x5a5a}, {0x1, 0x5a5c}};
    CHECK_STATUS(kvf_cache_lookup(c, near, 2, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, 0);
    size_t pinned = 9;
    CHECK_STATUS(kvf_cache_pin(c, near, 1, &pinned), KVF_OK);
    CHECK_EQ_INT(pinned, 0);
    /* removing one leaves its half-twins */
    size_t removed = 0;
    CHECK_STATUS(kvf_cache_remove(c, &KEYS[1], 1, &removed), KVF_OK);
    CHECK_EQ_INT(removed, 1);
    CHECK_STATUS(kvf_cache_lookup(c, KEYS, NK, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, 1); /* KEYS[0], then the removed KEYS[1] ends the prefix */
    CHECK_STATUS(kvf_cache_lookup(c, &KEYS[2], NK - 2, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, NK - 2);
    kvf_cache_destroy(c);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_disk);
    RUN(test_mem);
    RUN(test_redis);
    RUN(test_key_and_slot_apart);
    RUN(test_cache);
    return TEST_RESULT();
}
