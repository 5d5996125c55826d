/* Shared by the kvferry command-line tool's source files. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include "kvferry.h"

int kvf_cli_bench(int argc, char **argv);
/* `kvferry bench --mode remote` (bench_remote.c) */
int kvf_cli_bench_remote(int argc, char **argv);
int kvf_cli_fsck(int argc, char **argv);
int kvf_cli_replay(int argc, char **argv);
int kvf_cli_stats(int argc, char **argv);
/* `kvferry info --config [--json]` (info_config.c): argv[0] is "info". */
int kvf_cli_info_config(int argc, char **argv);

/* Options shared by replay and stats (cliopt.c). Each parser prints
 * "kvferry CMD: --NAME: why" and returns -1 on a bad value. */
int kvf_cli_u64(const char *cmd, const char *name, const char *s, uint64_t *out);
int kvf_cli_u32(const char *cmd, const char *name, const char *s, uint32_t *out);
/* v as an index into names[] (NULL-terminated). */
int kvf_cli_choice(const char *cmd, const char *name, const char *v, const char *const *names,
                   int *index_p);
/* The block geometry options --layers --kv --heads --tokens-per-block
 * --head-size --dtype --order: 1 when argv[*i] is one of them (its value
 * consumed, *i advanced), 0 when it is not, -1 on a bad or missing value. */
int kvf_cli_geometry_arg(const char *cmd, int argc, char **argv, int *i, kvf_geometry *g);
/* The usage lines of those options. */
extern const char kvf_cli_geometry_usage[];
/* Prints kvf_cache_stats_prometheus to stdout (stats.c); -1 on an error. */
int kvf_cli_print_prometheus(kvf_cache *cache);

#endif
