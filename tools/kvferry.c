/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry: the command-line tool. `kvferry info` tells what this machine
 * offers; `kvferry bench` moves blocks and checks every byte; `kvferry
 * replay` runs a request trace through the cache. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static int usage(FILE *f)
{
    fprintf(f, "usage: kvferry <command> [options]   (kvferry <command> --help: its options)\n"
               "\n"
               "commands:\n"
               "  info               backends, devices and file I/O paths on this machine\n"
               "  info --config [FILE]  the effective settings and where each comes from\n"
               "  bench              offload + onboard round trips, every byte verified;\n"
               "                     --compare: the sweep against the ceiling and a\n"
               "                     per-block copy, --plot FILE.png draws it\n"
               "  fsck DIR           check every stored block's header and checksum under DIR\n"
               "                     (exits 1 on a corrupt, torn or foreign block)\n"
               "  replay [TRACE]     replay requests through the cache, every block got\n"
               "                     verified (traces, tiers, --gen)\n"
               "  stats DIR          metrics of the cache a restart finds in DIR/NAMESPACE\n"
               "  version            the library's version\n"
               "\n"
               "Every command takes --help, and --json FILE (- : standard output) for its\n"
               "results. Exit status: 0 done, 1 the work failed (a byte read back wrong, a\n"
               "corrupt block, an error), 2 bad usage, 3 a directory, namespace, file or tool\n"
               "it needs is not there.\n");
    return f == stderr ? KVF_CLI_USAGE : 0;
}

/* The remote tier's line: whether $KVF_REMOTE_URL is set, and whether
 * its store is built and answers. */
static const char *remote_tier(char *why, size_t cap)
{
    kvf_status st = kvf_remote_probe(NULL, 1000, why, cap);
    if (st == KVF_ERR_NOT_FOUND)
        return "not set";
    if (st == KVF_ERR_UNSUPPORTED)
        return "not built";
    return st == KVF_OK ? "reachable" : "unreachable";
}

static cJSON *info_json(const kvf_info *info, const char *remote, const char *remote_why)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", kvf_version());
    cJSON *cuda = cJSON_AddObjectToObject(j, "cuda");
    cJSON_AddBoolToObject(cuda, "built", info->cuda_built);
    cJSON_AddNumberToObject(cuda, "devices", info->cuda_devices);
    cJSON_AddNumberToObject(cuda, "runtime", info->cuda_runtime);
    cJSON_AddStringToObject(cuda, "device_name", info->device_name);
    cJSON_AddStringToObject(cuda, "error", info->cuda_error);
    cJSON_AddBoolToObject(j, "uring_built", info->uring_built);
    cJSON *gds = cJSON_AddObjectToObject(j, "gds");
    cJSON_AddNumberToObject(gds, "state", info->gds_state);
    cJSON_AddBoolToObject(gds, "cufile_present", info->cufile_present);
    cJSON_AddStringToObject(gds, "detail", info->gds_detail);
    cJSON_AddStringToObject(j, "default_backend", info->cuda_devices > 0 ? "cuda" : "host");
    cJSON *stores = cJSON_AddArrayToObject(j, "stores");
    kvf_store_info si = KVF_STORE_INFO_INIT;
    for (size_t i = 0; kvf_store_info_get(i, &si) == KVF_OK; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", si.name);
        cJSON_AddStringToObject(o, "schemes", si.schemes);
        cJSON_AddBoolToObject(o, "built", si.built);
        cJSON_AddBoolToObject(o, "remote", si.remote);
        cJSON_AddStringToObject(o, "detail", si.detail);
        cJSON_AddItemToArray(stores, o);
    }
    cJSON *rt = cJSON_AddObjectToObject(j, "remote");
    cJSON_AddStringToObject(rt, "state", remote);
    cJSON_AddStringToObject(rt, "detail", remote_why);
    return j;
}

static void print_info(const kvf_info *info, const char *remote, const char *remote_why)
{
    printf("kvferry %s\n", kvf_version());
    printf("backends:\n");
    printf("  host   available\n");
    if (!info->cuda_built)
        printf("  cuda   not built (no CUDA toolkit at build time)\n");
    else if (info->cuda_devices == 0)
        printf("  cuda   built (runtime %d.%d), no usable GPU: %s\n", info->cuda_runtime / 1000,
               (info->cuda_runtime % 1000) / 10, info->cuda_error);
    else
        printf("  cuda   available (runtime %d.%d): %d device(s), device 0: %s\n",
               info->cuda_runtime / 1000, (info->cuda_runtime % 1000) / 10, info->cuda_devices,
               info->device_name);
    printf("file I/O paths:\n");
    printf("  posix  available (O_DIRECT through aligned host staging where the file system "
           "takes it; %s)\n",
           info->uring_built ? "io_uring, or threads where it is refused" : "a pool of threads");
    static const char *const gds_states[] = {
        [KVF_GDS_STATE_ABSENT] = "not available (POSIX path)",
        [KVF_GDS_STATE_REFUSED] = "libcufile loaded, driver refused (POSIX path)",
        [KVF_GDS_STATE_COMPAT] = "cuFile in compatibility mode, no P2P (file_io AUTO: POSIX path; "
                                 "GDS: cuFile where it takes file_dir's files)",
        [KVF_GDS_STATE_P2P] = "cuFile with P2P (file_io AUTO and GDS: cuFile)"};
    kvf_gds_state gs =
        info->gds_state >= KVF_GDS_STATE_ABSENT && info->gds_state <= KVF_GDS_STATE_P2P
            ? info->gds_state
            : KVF_GDS_STATE_ABSENT;
    printf("  gds    %s\n         %s\n", gds_states[gs], info->gds_detail);
    printf("default backend: %s\n", info->cuda_devices > 0 ? "cuda" : "host");
    printf("stores:\n");
    kvf_store_info si = KVF_STORE_INFO_INIT;
    for (size_t i = 0; kvf_store_info_get(i, &si) == KVF_OK; i++)
        printf("  %-6s %s: %s\n", si.name, si.schemes, si.detail);
    if (!strcmp(remote, "not set"))
        printf("remote tier: none ($%s not set)\n", KVF_REMOTE_URL_ENV);
    else
        printf("remote tier ($%s): %s: %s\n", KVF_REMOTE_URL_ENV, remote, remote_why);
}

/* info's options: the shared ones, then its own (each a row here and a
 * case in cmd_info's loop). */
enum { INFO_OPT_CONFIG = 0x200 };
static const struct option info_options[] = {
    KVF_CLI_OPTS_COMMON, {"config", no_argument, NULL, INFO_OPT_CONFIG}, KVF_CLI_OPTS_END};

static int cmd_info(int argc, char **argv)
{
    const char *json = NULL;
    bool config = false;
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("info", argc, argv, info_options)) != -1) {
        switch (c) {
        case 'h':
            printf("usage: kvferry info [--config [FILE]] [--json FILE]\n"
                   "What this machine offers: backends, devices, file I/O paths, the remote\n"
                   "tier ($%s probed when set).\n"
                   "  --config [FILE]  instead: every engine and cache setting an engine\n"
                   "              created now would get, and its source (default, file,\n"
                   "              environment); FILE: read that config file, as $KVF_CONFIG\n"
                   "              would name it (not found: exit 3; a bad value: exit 2)\n%s",
                   KVF_REMOTE_URL_ENV, kvf_cli_common_usage);
            return 0;
        case KVF_OPT_JSON:
            json = optarg;
            break;
        case INFO_OPT_CONFIG:
            config = true;
            break;
        default:
            return kvf_cli_usage_error("info");
        }
    }
    const char *file = config && optind < argc ? argv[optind++] : NULL;
    if (optind < argc) {
        fprintf(stderr, "kvferry info: unexpected argument '%s'\n", argv[optind]);
        return kvf_cli_usage_error("info");
    }
    if (config)
        return kvf_cli_info_config(file, json);
    if (kvf_cli_json_open("info", json))
        return KVF_CLI_FAILED;
    kvf_info info = KVF_INFO_INIT;
    kvf_status st = kvf_info_get(&info);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry: info: %s\n", kvf_last_error());
        kvf_cli_json_close("info");
        return KVF_CLI_FAILED;
    }
    char why[512];
    const char *remote = remote_tier(why, sizeof why);
    print_info(&info, remote, why);
    fflush(stdout);
    int rc = json ? kvf_cli_json_emit("info", info_json(&info, remote, why)) : 0;
    return kvf_cli_json_close("info") || rc ? KVF_CLI_FAILED : 0;
}

static int cmd_version(int argc, char **argv)
{
    static const struct option options[] = {KVF_CLI_OPTS_COMMON, KVF_CLI_OPTS_END};
    const char *json = NULL;
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("version", argc, argv, options)) != -1) {
        if (c == 'h') {
            printf("usage: kvferry version [--json FILE]\n%s", kvf_cli_common_usage);
            return 0;
        }
        if (c != KVF_OPT_JSON)
            return kvf_cli_usage_error("version");
        json = optarg;
    }
    if (optind < argc) {
        fprintf(stderr, "kvferry version: unexpected argument '%s'\n", argv[optind]);
        return kvf_cli_usage_error("version");
    }
    if (kvf_cli_json_open("version", json))
        return KVF_CLI_FAILED;
    printf("kvferry %s\n", kvf_version());
    fflush(stdout);
    int rc = 0;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "version", kvf_version());
        rc = kvf_cli_json_emit("version", j);
    }
    return kvf_cli_json_close("version") || rc ? KVF_CLI_FAILED : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    const char *cmd = argv[1];
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } commands[] = {{"info", cmd_info},         {"bench", kvf_cli_bench}, {"fsck", kvf_cli_fsck},
                    {"replay", kvf_cli_replay}, {"stats", kvf_cli_stats}, {"version", cmd_version},
                    {"--version", cmd_version}};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) {
            kvf_cli_warn_unknown_env();
            return commands[i].run(argc - 1, argv + 1);
        }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return usage(stdout);
    fprintf(stderr, "kvferry: unknown command '%s'\n", cmd);
    return usage(stderr);
}
