/* kvferry: the command-line tool. `kvferry info` tells what this machine
 * offers; `kvferry bench` moves blocks and checks every byte; `kvferry
 * replay` runs a request trace through the cache. */
#include "cli.h"
#include "internal.h"
#include "remote.h"

#include <stdio.h>
#include <string.h>

static int usage(FILE *f)
{
    fprintf(f, "usage: kvferry <command> [options]\n"
               "\n"
               "commands:\n"
               "  info               backends, devices and file I/O paths on this machine\n"
               "  info --config [--json]  the effective settings and where each comes from\n"
               "  bench [options]    offload + onboard round trips, every byte verified\n"
               "                     (kvferry bench --help for its options)\n"
               "  fsck DIR [-v]      check every stored block's header and checksum under DIR\n"
               "                     (exits 1 on a corrupt, torn or foreign block)\n"
               "  replay [TRACE]     replay requests through the cache, every block got\n"
               "                     verified (kvferry replay --help: traces, tiers, --gen)\n"
               "  stats DIR          metrics of the cache a restart finds in DIR/NAMESPACE\n"
               "  version            the library's version\n");
    return f == stderr ? 2 : 0;
}

/* The remote tier's line: built or not, and whether $KVF_REMOTE_URL answers. */
static void print_remote_tier(int built)
{
    const char *url = kvf__remote_url_from_env();
    char why[512];
    if (!built)
        printf("remote tier: not built (no hiredis at build time)\n");
    else if (!url)
        printf("remote tier: redis built; %s not set\n", KVF_REMOTE_URL_ENV);
    else if (kvf__remote_probe(url, 1000, why, sizeof why) == KVF_OK)
        printf("remote tier: reachable: %s\n", why);
    else
        printf("remote tier: unreachable: %s\n", why);
}

static int cmd_info(void)
{
    kvf_info info = KVF_INFO_INIT;
    kvf_status st = kvf_info_get(&info);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry: info: %s\n", kvf_last_error());
        return 1;
    }
    printf("kvferry %s\n", kvf_version());
    printf("backends:\n");
    printf("  host   available\n");
    if (!info.cuda_built)
        printf("  cuda   not built (no CUDA toolkit at build time)\n");
    else if (info.cuda_devices == 0)
        printf("  cuda   built (runtime %d.%d), no usable GPU: %s\n", info.cuda_runtime / 1000,
               (info.cuda_runtime % 1000) / 10, info.cuda_error);
    else
        printf("  cuda   available (runtime %d.%d): %d device(s), device 0: %s\n",
               info.cuda_runtime / 1000, (info.cuda_runtime % 1000) / 10, info.cuda_devices,
               info.device_name);
    printf("file I/O paths:\n");
    printf("  posix  available (O_DIRECT through aligned host staging where the file system "
           "takes it; %s)\n",
           info.uring_built ? "io_uring, or threads where it is refused" : "a pool of threads");
    static const char *const gds_states[] = {
        "not available (POSIX path)", "libcufile loaded, driver refused (POSIX path)",
        "cuFile in compatibility mode, no P2P (file_io AUTO: POSIX path; GDS: cuFile where "
        "it takes file_dir's files)",
        "cuFile with P2P (file_io AUTO and GDS: cuFile)"};
    int gs = info.gds_state >= 0 && info.gds_state <= 3 ? info.gds_state : 0;
    printf("  gds    %s\n         %s\n", gds_states[gs], info.gds_detail);
    printf("default backend: %s\n", info.cuda_devices > 0 ? "cuda" : "host");
    print_remote_tier(info.remote_built);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return argc > 2 ? kvf_cli_info_config(argc - 1, argv + 1) : cmd_info();
    if (strcmp(cmd, "bench") == 0)
        return kvf_cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "fsck") == 0)
        return kvf_cli_fsck(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0)
        return kvf_cli_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "stats") == 0)
        return kvf_cli_stats(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvferry %s\n", kvf_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return usage(stdout);
    fprintf(stderr, "kvferry: unknown command '%s'\n", cmd);
    return usage(stderr);
}
