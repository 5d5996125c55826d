/* Command-line options shared by `kvferry replay` and `kvferry stats`:
 * numbers and the block geometry, checked, with messages naming the option. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char kvf_cli_geometry_usage[] =
    "  --layers N --kv N --heads N --tokens-per-block N --head-size N\n"
    "                          block geometry of each pool (default 4 2 8 16 128)\n"
    "  --dtype fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8|int4|fp4   default fp16\n"
    "  --order head|token      [l][kv][h][t][d] (default) or [l][kv][t][h][d]\n";

int kvf_cli_u64(const char *cmd, const char *name, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "kvferry %s: --%s: '%s' is not a non-negative number\n", cmd, name, s);
        return -1;
    }
    *out = v;
    return 0;
}

int kvf_cli_u32(const char *cmd, const char *name, const char *s, uint32_t *out)
{
    uint64_t v;
    if (kvf_cli_u64(cmd, name, s, &v))
        return -1;
    if (v > UINT32_MAX) {
        fprintf(stderr, "kvferry %s: --%s: %s does not fit in 32 bits\n", cmd, name, s);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int kvf_cli_choice(const char *cmd, const char *name, const char *v, const char *const *names,
                   int *index_p)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(v, names[i])) {
            *index_p = i;
            return 0;
        }
    fprintf(stderr, "kvferry %s: --%s: '%s' is not one of", cmd, name, v);
    for (int i = 0; names[i]; i++)
        fprintf(stderr, " %s", names[i]);
    fputc('\n', stderr);
    return -1;
}

int kvf_cli_geometry_arg(const char *cmd, int argc, char **argv, int *i, kvf_geometry *g)
{
    static const struct {
        const char *name;
        size_t field;
    } counts[] = {{"layers", offsetof(kvf_geometry, layers)},
                  {"kv", offsetof(kvf_geometry, kv_factor)},
                  {"heads", offsetof(kvf_geometry, kv_heads)},
                  {"tokens-per-block", offsetof(kvf_geometry, tokens_per_block)},
                  {"head-size", offsetof(kvf_geometry, head_size)}};
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0)
        return 0;
    a += 2;
    int which = -1;
    for (int k = 0; k < 5; k++)
        if (!strcmp(a, counts[k].name))
            which = k;
    if (which < 0 && strcmp(a, "dtype") && strcmp(a, "order"))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvferry %s: --%s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (which >= 0)
        return kvf_cli_u32(cmd, a, v, (uint32_t *)((char *)g + counts[which].field)) ? -1 : 1;
    if (!strcmp(a, "dtype")) {
        if (kvf_dtype_parse(v, &g->dtype) == KVF_OK)
            return 1;
        fprintf(stderr, "kvferry %s: --dtype: unknown type '%s'\n", cmd, v);
        return -1;
    }
    static const char *const orders[] = {"head", "token", NULL}; /* kvf_token_order's values */
    int order;
    if (kvf_cli_choice(cmd, a, v, orders, &order))
        return -1;
    g->order = (kvf_token_order)order;
    return 1;
}
