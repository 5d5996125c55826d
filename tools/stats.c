/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry stats DIR: opens a cache on the blocks an engine left in
 * DIR/NAMESPACE (the restart path: the cache finds them, oldest first) and
 * prints its metrics in the Prometheus text format. A cache just opened has
 * counted nothing yet: live counters come from the library call
 * (kvf_cache_stats_prometheus) in a running engine, or from
 * `kvferry replay --prometheus`. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The samples of `text` whose value is not 0, each family's HELP and TYPE
 * lines before its first one printed; the number left out. */
static uint64_t print_nonzero(char *text)
{
    char head[1024] = "";
    size_t head_len = 0;
    uint64_t hidden = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') {
            if (!strncmp(line, "# HELP ", 7))
                head_len = 0; /* a new family */
            head_len += (size_t)snprintf(head + head_len, sizeof head - head_len, "%s\n", line);
            if (head_len >= sizeof head)
                head_len = sizeof head - 1;
            continue;
        }
        const char *value = strrchr(line, ' ');
        if (value && strtod(value + 1, NULL) == 0) {
            hidden++;
            continue;
        }
        fputs(head, stdout);
        head[0] = '\0';
        head_len = 0;
        printf("%s\n", line);
    }
    return hidden;
}

int kvf_cli_print_prometheus(kvf_cache *c, bool all)
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
            if (all) {
                fputs(buf, stdout);
            } else {
                uint64_t hidden = print_nonzero(buf);
                if (hidden)
                    printf("# %llu metric(s) at 0 not shown (--all shows them)\n",
                           (unsigned long long)hidden);
            }
            free(buf);
            return 0;
        }
        free(buf);
        cap = len + 1;
    }
}

/* Blocks of the namespace whose headers check, of any layout (g NULL) or
 * of `pools` pools of g; -1 (printed) when the directory cannot be read. */
static int count_blocks(const char *dir, const char *ns, const kvf_geometry *g, uint32_t pools,
                        uint64_t *n_p)
{
    if (kvf_dir_list(dir, ns, g, g ? pools : 0, NULL, NULL, n_p) != KVF_OK) {
        fprintf(stderr, "kvferry stats: %s\n", kvf_last_error());
        return -1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvferry stats DIR [--namespace NS] [--pools N] [--all] [geometry options]\n"
            "Opens a cache on the blocks stored in DIR/NS (default namespace replay)\n"
            "and prints its metrics in the Prometheus text format, those that are not 0\n"
            "(--all: every one). Give the geometry the blocks were written with: blocks of\n"
            "another layout are not the cache's. NS not found exits 3.\n"
            "  --namespace NS          (--ns too)  --pools N (default 1)\n"
            "  --all                   every metric, those at 0 too\n"
            "%s"
            "%s"
            "Live counters (hits, bytes moved, evictions) come from the library call\n"
            "kvf_cache_stats_prometheus in a running engine, or kvferry replay --prometheus.\n",
            kvf_cli_geometry_usage, kvf_cli_common_usage);
}

enum { OPT_POOLS = KVF_OPT_OWN, OPT_ALL };

static const struct option stats_options[] = {KVF_CLI_OPTS_COMMON,
                                              KVF_CLI_OPTS_NAMESPACE,
                                              KVF_CLI_OPTS_GEOMETRY,
                                              {"pools", required_argument, NULL, OPT_POOLS},
                                              {"all", no_argument, NULL, OPT_ALL},
                                              KVF_CLI_OPTS_END};

typedef struct stats_opts {
    const char *dir, *ns, *json;
    uint32_t pools;
    kvf_geometry g;
    bool all;
} stats_opts;

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_args(int argc, char **argv, stats_opts *o)
{
    int c;
    uint64_t v;
    optind = 0;
    while ((c = kvf_cli_getopt("stats", argc, argv, stats_options)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c == '?')
            return -1;
        if (c == KVF_OPT_JSON)
            o->json = optarg;
        else if (c == KVF_OPT_NAMESPACE)
            o->ns = optarg;
        else if (c == OPT_ALL)
            o->all = true;
        else if (c == OPT_POOLS) {
            if (kvf_cli_number("stats", "pools", optarg, 1, 1024, &v))
                return -1;
            o->pools = (uint32_t)v;
        } else if (kvf_cli_geometry_opt("stats", c, optarg, &o->g) != 1)
            return -1;
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "kvferry stats: %s\n",
                optind < argc ? "one directory only" : "which directory? (kvferry stats DIR)");
        return -1;
    }
    o->dir = argv[optind];
    return 0;
}

int kvf_cli_stats(int argc, char **argv)
{
    stats_opts o = {.ns = "replay", .pools = 1, .g = KVF_CLI_GEOMETRY_DEFAULT};
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("stats");
    const char *dir = o.dir, *ns = o.ns;
    uint32_t pools = o.pools;
    kvf_geometry g = o.g;
    char sub[4096];
    struct stat sb;
    snprintf(sub, sizeof sub, "%s/%s", dir, ns);
    if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry stats: %s: no such namespace (no directory %s)\n", ns, sub);
        return KVF_CLI_MISSING;
    }
    if (kvf_geometry_check(&g) != KVF_OK) {
        fprintf(stderr, "kvferry stats: geometry: %s\n", kvf_last_error());
        return 2;
    }
    kvf_geometry *gs = calloc(pools, sizeof *gs);
    if (!gs)
        return 1;
    if (kvf_cli_json_open("stats", o.json)) {
        free(gs);
        return KVF_CLI_FAILED;
    }
    for (uint32_t p = 0; p < pools; p++)
        gs[p] = g;
    uint64_t all = 0, mine = 0;
    int rc = count_blocks(dir, ns, NULL, pools, &all) || count_blocks(dir, ns, gs, pools, &mine);
    free(gs);
    if (rc) {
        kvf_cli_json_close("stats");
        return 1;
    }

    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = dir;
    cfg.file.namespace_ = ns;
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
    cc.disk.blocks = mine ? mine : 1;
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
    rc = kvf_cli_print_prometheus(c, o.all) ? 1 : 0;
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    if (o.json && kvf_cache_stats_get(c, &st) != KVF_OK) {
        fprintf(stderr, "kvferry stats: %s\n", kvf_last_error());
        rc = 1;
    } else if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "dir", dir);
        cJSON_AddStringToObject(j, "namespace", ns);
        cJSON_AddNumberToObject(j, "stored_blocks", (double)all);
        cJSON_AddNumberToObject(j, "layout_blocks", (double)mine);
        cJSON_AddNumberToObject(j, "pools", pools);
        cJSON_AddItemToObject(j, "cache", kvf_cli_cache_stats_json(&st));
        if (kvf_cli_json_emit("stats", j))
            rc = 1;
    }
out:
    fflush(stdout);
    if (kvf_cli_json_close("stats"))
        rc = 1;
    kvf_cache_destroy(c);
    kvf_engine_destroy(e);
    return rc;
}
