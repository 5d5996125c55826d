/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bad input on every public function of the engine: refused with
 * KVF_ERR_INVALID (or the status naming the problem) and a message, the
 * outputs untouched, nothing aborted.
 */
#include "engine_fixture.h"

/* ---- bad input on every public function --------------------------------- */

static int test_bad_input(void)
{
    kvf_engine_destroy(NULL);
    CHECK_STATUS(kvf_engine_create(NULL, NULL), KVF_ERR_INVALID);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    kvf_engine *e = (kvf_engine *)0x1;
    cfg.struct_size = 3;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(e == (kvf_engine *)0x1); /* outputs are set only on success */
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.file.fsync = (kvf_fsync)9;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.file.gds_compat = (kvf_gds_compat)3;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(e == (kvf_engine *)0x1);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.file.dir = "/proc/kvferry-cannot-be-here";
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_IO);
    CHECK(strstr(kvf_last_error(), "/proc/kvferry-cannot-be-here") != NULL);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);

    kvf_move m = {0, 0, 0};
    kvf_ticket t = {0};
    /* no pools yet */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_STATE);
    kvf_geometry g = G_REF;
    kvf_pool_desc pd = {KVF_MEMORY_HOST, NULL, 0, 4}, sd = {KVF_MEMORY_HOST, NULL, 0, 2};
    CHECK_STATUS(kvf_engine_add_pool(NULL, &g, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, NULL, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, NULL, &sd, NULL), KVF_ERR_INVALID);
    kvf_pool_desc dev = {KVF_MEMORY_DEVICE, NULL, 0, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &dev, &sd, NULL), KVF_ERR_UNSUPPORTED);
    kvf_pool_desc zero = {KVF_MEMORY_HOST, NULL, 0, 0};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &zero, &sd, NULL), KVF_ERR_INVALID);
    kvf_pool_desc narrow = {KVF_MEMORY_HOST, NULL, 100, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &narrow, &sd, NULL), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "pool 0") != NULL);
    kvf_pool_desc huge = {KVF_MEMORY_HOST, NULL, SIZE_MAX / 2, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &huge, &sd, NULL), KVF_ERR_RANGE);
    kvf_geometry bad = g;
    bad.layers = 0;
    CHECK_STATUS(kvf_engine_add_pool(e, &bad, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_OK);
    kvf_geometry other = g;
    other.tokens_per_block = 8;
    CHECK_STATUS(kvf_engine_add_pool(e, &other, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tokens_per_block") != NULL);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, NULL, NULL), KVF_OK); /* no secondary */
    CHECK(kvf_engine_pool_count(e) == 2);

    void *p;
    CHECK_STATUS(kvf_engine_slot_ptr(e, 2, KVF_LEVEL_PRIMARY, 0, &p), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 4, &p), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 1, KVF_LEVEL_SECONDARY, 0, &p), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, (kvf_level)5, 0, &p), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, NULL), KVF_ERR_INVALID);

    /* pool 1 has no secondary slots: the host tier is refused, naming it */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "offload to host: pool 1 has no secondary slots");
    /* no file tier configured */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_DISK, &m, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "file tier") != NULL);
    CHECK_STATUS(kvf_offload(e, (kvf_tier)7, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_onboard(e, (kvf_tier)7, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload(NULL, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_copy(e, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_copy(e, &m, 0, &t), KVF_ERR_INVALID);
    kvf_move far = {0, 9, 0};
    CHECK_STATUS(kvf_copy(e, &far, 1, &t), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "primary slot 9") != NULL);
    kvf_move odd = {0, 1, 3};
    kvf_geometry g4 = G_I4;
    (void)g4;
    CHECK_STATUS(kvf_copy(e, &odd, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf_move dup[2] = {{0, 1, 0}, {2, 1, 0}};
    CHECK_STATUS(kvf_copy(e, dup, 2, &t), KVF_ERR_INVALID);
    /* pools are fixed once a transfer was queued */
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_ERR_STATE);

    CHECK_STATUS(kvf_poll(e, (kvf_ticket){12345}, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait(e, (kvf_ticket){0}, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait(NULL, (kvf_ticket){1}, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_sync_stream(NULL, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_info_get(NULL), KVF_ERR_INVALID);
    kvf_info info = KVF_INFO_INIT;
    CHECK_STATUS(kvf_info_get(&info), KVF_OK);
    CHECK(info.gds_state >= KVF_GDS_STATE_ABSENT && info.gds_state <= KVF_GDS_STATE_P2P);
    /* an older caller's shorter struct gets its fields and nothing past
     * them; a newer caller's longer one gets the library's and is told how
     * many bytes were filled */
    union {
        kvf_info info;
        unsigned char bytes[sizeof(kvf_info) + 64];
    } sized;
    size_t old_size = offsetof(kvf_info, remote_built);
    memset(&sized, 0xA5, sizeof sized);
    sized.info.struct_size = old_size;
    CHECK_STATUS(kvf_info_get(&sized.info), KVF_OK);
    CHECK(sized.info.struct_size == old_size && sized.info.cuda_built == info.cuda_built);
    CHECK(strcmp(sized.info.device_name, info.device_name) == 0);
    for (size_t i = old_size; i < sizeof sized; i++)
        CHECK(sized.bytes[i] == 0xA5);
    memset(&sized, 0xA5, sizeof sized);
    sized.info.struct_size = sizeof sized;
    CHECK_STATUS(kvf_info_get(&sized.info), KVF_OK);
    CHECK(sized.info.struct_size == sizeof(kvf_info) && sized.info.gds_state == info.gds_state);
    for (size_t i = sizeof(kvf_info); i < sizeof sized; i++)
        CHECK(sized.bytes[i] == 0xA5);
    sized.info.struct_size = old_size - 1;
    CHECK_STATUS(kvf_info_get(&sized.info), KVF_ERR_INVALID);
    CHECK(kvf_version() != NULL && strncmp(kvf_version(), KVF_VERSION_STRING, 5) == 0);
    CHECK(strcmp(kvf_backend_name(kvf_engine_backend(e)), "host") == 0);
    /* DISK pool group by pool group; whole batches between slots on the host backend */
    CHECK(kvf_engine_layerwise_tiers(e) == 1u << KVF_TIER_DISK);
    CHECK(kvf_engine_layerwise_tiers(NULL) == 0);
    /* steps: 0 for NULL, a tier out of range and a tier that arrives whole */
    CHECK(kvf_engine_arrival_groups(e, KVF_TIER_DISK) >= 1);
    CHECK(kvf_engine_arrival_groups(NULL, KVF_TIER_DISK) == 0);
    CHECK(kvf_engine_arrival_groups(e, (kvf_tier)KVF_TIER_COUNT) == 0);
    CHECK(kvf_engine_arrival_groups(e, (kvf_tier)-1) == 0);
    CHECK(kvf_engine_arrival_groups(e, KVF_TIER_HOST) == 0);
    CHECK(kvf_engine_arrival_groups(e, KVF_TIER_REMOTE) == 0);
    kvf_engine_destroy(e);

    /* a 4-bit partial copy that cannot be byte-aligned is refused whole */
    fixture f;
    if (fx_init(&f, false, 4))
        return 1;
    kvf_move m3 = {0, 1, 3}; /* 3 tokens x 6 int4 = 9 bytes: fine; G_I4 rows... */
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &m3, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    fx_done(&f);
    kvf_geometry odd4 = {1, 1, 1, 16, 3, KVF_DTYPE_FP4, KVF_ORDER_HEAD_MAJOR};
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
    kvf_pool_desc p4 = {KVF_MEMORY_HOST, NULL, 0, 2};
    CHECK_STATUS(kvf_engine_add_pool(e, &odd4, &p4, &p4, NULL), KVF_OK);
    kvf_move m5 = {0, 1, 5};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m5, 1, &t), KVF_ERR_UNSUPPORTED);
    CHECK(strstr(kvf_last_error(), "move 0: pool 0") != NULL);
    kvf_move m6 = {0, 1, 6};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m6, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);

    /* tiers this engine lacks, and an unknown one: refused, named */
    kvf_key key = KEY(0x42);
    kvf_move to_key = TO_KEY(0, key);
    t = (kvf_ticket){0};
    CHECK_STATUS(kvf_offload(e, (kvf_tier)7, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tier 7 unknown") != NULL);
    CHECK_STATUS(kvf_onboard(e, (kvf_tier)-1, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload(e, KVF_TIER_REMOTE, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no remote tier") != NULL);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_REMOTE, &key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_DISK, &key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no file tier") != NULL);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_DISK, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_DISK, &key, 0, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_demote(e, KVF_TIER_DISK, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_promote(NULL, KVF_TIER_DISK, &to_key, 1, &t), KVF_ERR_INVALID);
    /* a tier the call cannot take: refused, the tier named */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_GPU, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "kvf_offload: tier gpu") != NULL);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_GPU, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_HOST, &key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "kvf_remove: tier host") != NULL);
    CHECK_STATUS(kvf_remove(e, KVF_TIER_GPU, &key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_remove(e, (kvf_tier)9, &key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tier 9 unknown") != NULL);
    CHECK_STATUS(kvf_demote(e, KVF_TIER_HOST, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "kvf_demote: tier host") != NULL);
    CHECK_STATUS(kvf_promote(e, KVF_TIER_GPU, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_demote(e, KVF_TIER_REMOTE, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "demote to remote: the engine has no remote tier") != NULL);
    CHECK_STATUS(kvf_promote(e, KVF_TIER_REMOTE, &to_key, 1, &t), KVF_ERR_INVALID);
    /* each refusal names the call by its direction and tier */
    CHECK_STATUS(kvf_promote(e, KVF_TIER_DISK, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "promote from file: the engine has no file tier");
    CHECK_STATUS(kvf_remove(e, KVF_TIER_REMOTE, &key, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "remove remote: the engine has no remote tier");
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_DISK, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "onboard from file: the engine has no file tier");
    CHECK(t.id == 0); /* no ticket for a refused batch */
    CHECK(strcmp(kvf_tier_name(KVF_TIER_HOST), "host") == 0);
    CHECK(strcmp(kvf_tier_name(KVF_TIER_DISK), "disk") == 0);
    CHECK(strcmp(kvf_tier_name(KVF_TIER_REMOTE), "remote") == 0);
    CHECK(strcmp(kvf_tier_name(KVF_TIER_GPU), "gpu") == 0);
    CHECK(strcmp(kvf_tier_name(KVF_TIER_COUNT), "?") == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* kvf_offload_after on the host backend: a NULL stream is kvf_offload;
 * a stream is refused (there is none to order after) and queues nothing. */
static int test_offload_after(void)
{
    fixture f;
    fx_init(&f, true, 8);
    for (uint32_t p = 0; p < f.pools; p++)
        memset(slot(&f, p, KVF_LEVEL_SECONDARY, 0), POISON, f.bytes[p]);
    fill_block(&f, 1, 7);
    kvf_move m = {1, 0, 0};
    kvf_ticket t = {0};
    int fake_stream;
    CHECK_STATUS(kvf_offload_after(f.e, &fake_stream, KVF_TIER_HOST, &m, 1, &t),
                 KVF_ERR_UNSUPPORTED);
    CHECK(strstr(kvf_last_error(), "kvf_offload_after") != NULL);
    CHECK(t.id == 0);
    kvf_move k = TO_KEY(1, 0x51);
    CHECK_STATUS(kvf_offload_after(f.e, &fake_stream, KVF_TIER_DISK, &k, 1, &t),
                 KVF_ERR_UNSUPPORTED);
    CHECK(t.id == 0);
    /* nothing was queued: after every batch, the slot and the key are as
     * they were */
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t p = 0; p < f.pools; p++) {
        const uint8_t *sec = slot(&f, p, KVF_LEVEL_SECONDARY, 0);
        for (size_t i = 0; i < f.bytes[p]; i++)
            if (sec[i] != POISON) {
                CHECK(!"a refused kvf_offload_after wrote the secondary slot");
                break;
            }
    }
    poison_block(&f, 2);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0x51, 2, 0), KVF_ERR_NOT_FOUND);

    /* NULL stream: as kvf_offload, to the host tier and to disk */
    CHECK_STATUS(kvf_offload_after(f.e, NULL, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK(t.id != 0);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_offload_after(f.e, NULL, KVF_TIER_DISK, &k, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 2);
    poison_block(&f, 3);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 0, 2, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0x51, 3, 0), KVF_OK);
    CHECK(expect_block(&f, 2, 7, 0) == 0);
    CHECK(expect_block(&f, 3, 7, 0) == 0);
    /* and its checks, as kvf_offload's */
    CHECK_STATUS(kvf_offload_after(NULL, NULL, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload_after(f.e, NULL, KVF_TIER_GPU, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload_after(f.e, &fake_stream, KVF_TIER_HOST, &m, 0, &t),
                 KVF_ERR_UNSUPPORTED);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_bad_input);
    RUN(test_offload_after);
    return TEST_RESULT();
}
