/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the kvferry command-line tool's source files: one way to parse
 * options (getopt_long), the same names for the same things in every
 * subcommand, one way to write --json, numbers and choices checked with
 * messages naming the option. */
#ifndef KVF_CLI_H
#define KVF_CLI_H

#include "kvferry.h"

#include <cJSON.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

/* Exit codes of every subcommand, one per kind of failure (docs/cli.md and
 * `kvferry --help` list them): 0 done; 1 the work failed (a byte read back
 * wrong, a corrupt block, an error while working, a report not written); 2
 * bad usage (an unknown option, a bad value, a missing argument); 3 what the
 * command was pointed at, or needs, is not there (a directory, namespace or
 * trace file not found, no matplotlib for --plot). */
enum { KVF_CLI_FAILED = 1, KVF_CLI_USAGE = 2, KVF_CLI_MISSING = 3 };

int kvf_cli_bench(int argc, char **argv);
/* `kvferry bench --mode remote` (bench_remote.c) */
int kvf_cli_bench_remote(int argc, char **argv);
int kvf_cli_fsck(int argc, char **argv);
int kvf_cli_replay(int argc, char **argv);
int kvf_cli_stats(int argc, char **argv);
/* `kvferry info --config [FILE] [--json FILE]` (info_config.c): the
 * effective settings and where each comes from, with FILE (when given) as
 * the config file; json as for kvf_cli_json_open. */
int kvf_cli_info_config(const char *file, const char *json);
/* A warning on standard error for each KVF_* environment variable that no
 * setting reads (a misspelt one changes nothing, silently otherwise). */
void kvf_cli_warn_unknown_env(void);

/* getopt_long codes of the options every subcommand spells the same way;
 * a subcommand's own options take codes from KVF_OPT_OWN up. */
enum {
    KVF_OPT_JSON = 0x100,
    KVF_OPT_NAMESPACE,
    KVF_OPT_REMOTE_URL,
    KVF_OPT_BACKEND,
    KVF_OPT_LAYERS,
    KVF_OPT_KV,
    KVF_OPT_HEADS,
    KVF_OPT_TOKENS_PER_BLOCK,
    KVF_OPT_HEAD_SIZE,
    KVF_OPT_DTYPE,
    KVF_OPT_ORDER,
    KVF_OPT_OWN = 0x200
};

/* Entries of a getopt_long table. --ns and --remote are the older
 * spellings of --namespace and --remote-url, kept as aliases. */
#define KVF_CLI_OPTS_COMMON                                                                        \
    {"help", no_argument, NULL, 'h'},                                                              \
    {                                                                                              \
        "json", required_argument, NULL, KVF_OPT_JSON                                              \
    }
#define KVF_CLI_OPTS_NAMESPACE                                                                     \
    {"namespace", required_argument, NULL, KVF_OPT_NAMESPACE},                                     \
    {                                                                                              \
        "ns", required_argument, NULL, KVF_OPT_NAMESPACE                                           \
    }
#define KVF_CLI_OPTS_REMOTE_URL                                                                    \
    {"remote-url", required_argument, NULL, KVF_OPT_REMOTE_URL},                                   \
    {                                                                                              \
        "remote", required_argument, NULL, KVF_OPT_REMOTE_URL                                      \
    }
#define KVF_CLI_OPTS_BACKEND                                                                       \
    {                                                                                              \
        "backend", required_argument, NULL, KVF_OPT_BACKEND                                        \
    }
#define KVF_CLI_OPTS_GEOMETRY                                                                      \
    {"layers", required_argument, NULL, KVF_OPT_LAYERS},                                           \
        {"kv", required_argument, NULL, KVF_OPT_KV},                                               \
        {"heads", required_argument, NULL, KVF_OPT_HEADS},                                         \
        {"tokens-per-block", required_argument, NULL, KVF_OPT_TOKENS_PER_BLOCK},                   \
        {"head-size", required_argument, NULL, KVF_OPT_HEAD_SIZE},                                 \
        {"dtype", required_argument, NULL, KVF_OPT_DTYPE},                                         \
    {                                                                                              \
        "order", required_argument, NULL, KVF_OPT_ORDER                                            \
    }
#define KVF_CLI_OPTS_END                                                                           \
    {                                                                                              \
        NULL, 0, NULL, 0                                                                           \
    }

/* The usage lines of the shared options (the common ones end with the
 * exit codes). */
extern const char kvf_cli_geometry_usage[];
extern const char kvf_cli_common_usage[];
/* --backend's default, the same in every subcommand: the engine's own. */
#define KVF_CLI_BACKEND_DEFAULT KVF_BACKEND_AUTO
/* The geometry options' defaults, the same in bench, replay and stats:
 * 4 layers x K,V x 8 heads x 16 tokens x 128, fp16: 256 KiB blocks. */
#define KVF_CLI_GEOMETRY_DEFAULT                                                                   \
    {                                                                                              \
        4, 2, 8, 16, 128, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR                                     \
    }
/* --fsync's default in every subcommand: the library's (KVF_FSYNC_BATCH,
 * the value $KVF_FSYNC or a config file may change). */
#define KVF_CLI_FSYNC_DEFAULT KVF_FSYNC_BATCH

/* getopt_long over argv[1..] with `opts`: the option's code, -1 at the
 * end, '?' after printing "kvferry CMD: unknown option" or "needs a value"
 * (exit KVF_CLI_USAGE then). Positional arguments are left from optind. */
int kvf_cli_getopt(const char *cmd, int argc, char **argv, const struct option *opts);
/* The exit code for an engine (or cache) the command could not create:
 * KVF_CLI_MISSING for no usable GPU (--backend cuda) or a config file not
 * found, KVF_CLI_USAGE for a bad KVF_* value or config key, else
 * KVF_CLI_FAILED. */
int kvf_cli_create_exit(kvf_status st);
/* The hint after a usage error; returns KVF_CLI_USAGE. */
int kvf_cli_usage_error(const char *cmd);

/* Numbers: s as an integer in [min, max] (decimal, or 0x hex). Prints
 * "kvferry CMD: --NAME: 'S' is not a number" or "... S is out of range
 * (MIN..MAX)" and returns -1 on a bad value. */
int kvf_cli_number(const char *cmd, const char *name, const char *s, uint64_t min, uint64_t max,
                   uint64_t *out);
int kvf_cli_u64(const char *cmd, const char *name, const char *s, uint64_t *out);
int kvf_cli_u32(const char *cmd, const char *name, const char *s, uint32_t *out);
/* v as an index into names[] (NULL-terminated); on a bad value prints
 * "kvferry CMD: --NAME: 'V' is not one of: a, b, c" and returns -1. */
int kvf_cli_choice(const char *cmd, const char *name, const char *v, const char *const *names,
                   int *index_p);
/* --fsync's values, in kvf_fsync's order */
extern const char *const kvf_cli_fsync_names[];
/* --backend auto|host|cuda */
int kvf_cli_backend(const char *cmd, const char *v, kvf_backend *backend_p);
/* A geometry option's code and value into *g: 1 done, 0 not a geometry
 * option, -1 a bad value (printed). */
int kvf_cli_geometry_opt(const char *cmd, int code, const char *v, kvf_geometry *g);

/* Bytes in human units: "512 B", "256 KiB", "1.5 MiB", "2 GiB". */
const char *kvf_cli_bytes(uint64_t bytes, char buf[32]);

/* --json PATH for a subcommand, after its options were parsed and before it
 * prints anything: opens PATH (so that an unwritable one fails before the
 * work), "-" meaning standard output, which then carries the JSON alone
 * (what the command prints otherwise goes to standard error). NULL: no
 * JSON. -1 (printed) when PATH cannot be opened. */
int kvf_cli_json_open(const char *cmd, const char *path);
/* Writes doc (then frees it) as one JSON document and a newline; -1
 * (printed) on a failed write. Nothing done without kvf_cli_json_open. */
int kvf_cli_json_emit(const char *cmd, cJSON *doc);
/* Flushes and closes the JSON output; -1 (printed) when a write failed. */
int kvf_cli_json_close(const char *cmd);
/* The cache's statistics as a JSON object (replay and stats write it). */
cJSON *kvf_cli_cache_stats_json(const kvf_cache_stats *s);

/* A progress bar on standard error for `done` of `total` items, redrawn at
 * most ten times a second, and only when standard error is a terminal;
 * any thread may call it. kvf_cli_progress_end clears it. */
void kvf_cli_progress(const char *what, uint64_t done, uint64_t total);
void kvf_cli_progress_end(void);

/* Prints kvf_cache_stats_prometheus to stdout (stats.c), every metric or
 * (all false) those not 0; -1 on an error. */
int kvf_cli_print_prometheus(kvf_cache *cache, bool all);

#endif
