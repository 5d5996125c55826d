/* SPDX-License-Identifier: Apache-2.0 */
/* The smallest complete use of kvferry: one pool on the host backend,
 * a block offloaded to a secondary slot and to a file, and brought back.
 * Build against an installed kvferry:
 *   cc offload_host.c $(pkg-config --cflags --libs kvferry) -o offload_host */
#include <kvferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                  \
    do {                                                                                           \
        kvf_status st_ = (call);                                                                   \
        if (st_ != KVF_OK) {                                                                       \
            fprintf(stderr, "%s: %s (%s)\n", #call, kvf_status_str(st_), kvf_last_error());        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp/kvferry-example";
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "example";
    kvf_engine *e;
    TRY(kvf_engine_create(&cfg, &e));

    kvf_geometry g = {.layers = 4,
                      .kv_factor = 2,
                      .kv_heads = 8,
                      .tokens_per_block = 16,
                      .head_size = 64,
                      .dtype = KVF_DTYPE_BF16,
                      .order = KVF_ORDER_HEAD_MAJOR};
    kvf_pool_desc primary = {KVF_MEMORY_HOST, NULL, 0, 8};
    kvf_pool_desc secondary = {KVF_MEMORY_HOST, NULL, 0, 32};
    TRY(kvf_engine_add_pool(e, &g, &primary, &secondary, NULL));

    size_t bytes;
    TRY(kvf_geometry_block_bytes(&g, &bytes));
    void *slot0, *slot1;
    TRY(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, &slot0));
    TRY(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 1, &slot1));
    for (size_t i = 0; i < bytes; i++)
        ((unsigned char *)slot0)[i] = (unsigned char)(i * 7 + 3);

    /* primary slot 0 -> secondary slot 5 and -> block key {0, 0x42} on disk,
     * in two batches; a key has a member of its own, never src or dst */
    const kvf_key key = {0, 0x42};
    kvf_move to_host = {.src = 0, .dst = 5}, to_file = {.src = 0, .key = key};
    kvf_ticket t1, t2;
    TRY(kvf_offload(e, KVF_TIER_HOST, &to_host, 1, &t1));
    TRY(kvf_offload(e, KVF_TIER_DISK, &to_file, 1, &t2));
    TRY(kvf_wait(e, t1, NULL));
    TRY(kvf_wait(e, t2, NULL));

    /* back into primary slot 1: the first 8 tokens from the file */
    memset(slot1, 0, bytes);
    kvf_move from_file = {.dst = 1, .tokens = 8, .key = key};
    kvf_status per_move[1];
    TRY(kvf_onboard(e, KVF_TIER_DISK, &from_file, 1, &t1));
    TRY(kvf_wait(e, t1, per_move));

    kvf_region r;
    TRY(kvf_geometry_region(&g, 8, &r));
    for (size_t row = 0; row < r.rows; row++)
        if (memcmp((char *)slot0 + row * r.pitch, (char *)slot1 + row * r.pitch, r.row_bytes)) {
            fprintf(stderr, "row %zu differs\n", row);
            return 1;
        }
    printf("kvferry %s: block round trip through host and file, %zu bytes, first 8 tokens "
           "checked\n",
           kvf_version(), bytes);
    kvf_engine_destroy(e);
    return 0;
}
