/* kvferry stats DIR: opens a cache on the blocks an engine left in
 * DIR/NAMESPACE (the restart path: the cache finds them, oldest first) and
 * prints its metrics in the Prometheus text format. A cache just opened has
 * counted nothing yet: live counters come from the library call
 * (kvf_cache_stats_prometheus) in a running engine, or from
 * `kvferry replay --prometheus`. */
#include "cli.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvf_cli_print_prometheus(kvf_cache *c)
{
    size_t cap = 16384, len = 0;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf) {
            fprintf(stderr, "kvferry: out of memory for the metrics\n");
            return -1;
        }
        if (kvf_cache_stats_prometheus(c, buf, cap, &len) != KVF_OK) {
            fprintf(stderr, "kvferry: metrics: %s\n", kvf_last_error());
            free(buf);
            return -1;
        }
        if (len < cap) {
            fputs(buf, stdout);
            free(buf);
            return 0;
        }
        free(buf);
        cap = len + 1;
    }
}

static void count_block(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    (*(uint64_t *)arg)++;
}

/* Blocks of the namespace whose headers check, of any layout (fingerprint
 * 0) or of one; -1 when the directory cannot be read. */
static int count_blocks(const char *dir, const char *ns, uint64_t fingerprint, uint64_t *n_p)
{
    kvf__blockfile_dir d;
    memset(&d, 0, sizeof d);
    d.dir_fd = -1;
    *n_p = 0;
    kvf_status st = kvf__blockfile_open_dir(dir, ns, fingerprint, KVF_FSYNC_NONE, &d);
    if (st == KVF_OK)
        st = kvf__blockfile_list(&d, count_block, n_p);
    kvf__blockfile_close_dir(&d);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry stats: %s\n", kvf_last_error());
        return -1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvferry stats DIR [--ns NAMESPACE] [--pools N] [geometry options]\n"
            "Opens a cache on the blocks stored in DIR/NAMESPACE (default namespace replay)\n"
            "and prints its metrics in the Prometheus text format. Give the geometry the\n"
            "blocks were written with: blocks of another layout are not the cache's.\n"
            "  --ns NAMESPACE  --pools N (default 1)\n"
            "%s"
            "Live counters (hits, bytes moved, evictions) come from the library call\n"
            "kvf_cache_stats_prometheus in a running engine, or kvferry replay --prometheus.\n",
            kvf_cli_geometry_usage);
}

int kvf_cli_stats(int argc, char **argv)
{
    const char *dir = NULL, *ns = "replay";
    uint32_t pools = 1;
    kvf_geometry g = {4, 2, 8, 16, 128, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    for (int i = 1; i < argc; i++) {
        int rc = kvf_cli_geometry_arg("stats", argc, argv, &i, &g);
        if (rc < 0)
            return 2;
        if (rc > 0)
            continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--ns") && i + 1 < argc) {
            ns = argv[++i];
        } else if (!strcmp(argv[i], "--pools") && i + 1 < argc) {
            if (kvf_cli_u32("stats", "pools", argv[++i], &pools))
                return 2;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!dir || !pools) {
        usage(stderr);
        return 2;
    }
    char sub[4096];
    struct stat sb;
    snprintf(sub, sizeof sub, "%s/%s", dir, ns);
    if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry stats: %s: no such block directory\n", sub);
        return 2;
    }
    if (kvf_geometry_check(&g) != KVF_OK) {
        fprintf(stderr, "kvferry stats: geometry: %s\n", kvf_last_error());
        return 2;
    }
    kvf_geometry *gs = calloc(pools, sizeof *gs);
    if (!gs)
        return 1;
    for (uint32_t p = 0; p < pools; p++)
        gs[p] = g;
    uint64_t all = 0, mine = 0;
    int rc = count_blocks(dir, ns, 0, &all) ||
             count_blocks(dir, ns, kvf__geometry_fingerprint(gs, pools), &mine);
    free(gs);
    if (rc)
        return 1;

    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file_dir = dir;
    cfg.file_namespace = ns;
    kvf_engine *e = NULL;
    kvf_cache *c = NULL;
    rc = 1;
    if (kvf_engine_create(&cfg, &e) != KVF_OK) {
        fprintf(stderr, "kvferry stats: engine: %s\n", kvf_last_error());
        goto out;
    }
    for (uint32_t p = 0; p < pools; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 1};
        if (kvf_engine_add_pool(e, &g, &prim, NULL, NULL) != KVF_OK) {
            fprintf(stderr, "kvferry stats: pool %u: %s\n", p, kvf_last_error());
            goto out;
        }
    }
    /* room for every block found, so that opening removes none */
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk_blocks = mine ? mine : 1;
    if (kvf_cache_create(e, &cc, &c) != KVF_OK) {
        fprintf(stderr, "kvferry stats: cache: %s\n", kvf_last_error());
        goto out;
    }
    printf("# kvferry stats %s: %llu stored blocks, %llu of this layout (%u pool(s) of %s "
           "%ux%ux%ux%ux%u)\n",
           sub, (unsigned long long)all, (unsigned long long)mine, pools, kvf_dtype_name(g.dtype),
           g.layers, g.kv_factor, g.kv_heads, g.tokens_per_block, g.head_size);
    if (all > mine)
        fprintf(stderr,
                "kvferry stats: %llu block(s) in %s have another layout: give the geometry "
                "options they were written with\n",
                (unsigned long long)(all - mine), sub);
    rc = kvf_cli_print_prometheus(c) ? 1 : 0;
out:
    kvf_cache_destroy(c);
    kvf_engine_destroy(e);
    return rc;
}
