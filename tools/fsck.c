/* kvferry fsck DIR: checks every stored block's header and checksum in
 * every namespace under DIR (or one, with --namespace), and leftovers of
 * interrupted writes. Exits 1 on any problem. */
#include "blockfile.h"
#include "cli.h"
#include "status.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct fsck_counts {
    /* unreadable: a read that failed for a reason that says nothing about
     * the file (out of descriptors or memory, an I/O error): not checked */
    unsigned long good, corrupt, torn, mismatch, foreign, unreadable;
    bool verbose;
    const char *ns;
} fsck_counts;

static void visit(void *arg, uint64_t key, kvf_status st, const char *detail)
{
    fsck_counts *c = arg;
    if (st == KVF_OK) {
        c->good++;
        if (c->verbose)
            printf("  %s/%016llx: ok\n", c->ns, (unsigned long long)key);
        return;
    }
    if (st == KVF_ERR_MISMATCH)
        c->mismatch++;
    else if (detail && strstr(detail, "torn"))
        c->torn++;
    else if (detail && strstr(detail, "foreign"))
        c->foreign++; /* a FIFO, directory, link... under a block's name */
    else if (!kvf__status_condemns_block(st))
        c->unreadable++;
    else
        c->corrupt++;
    printf("  %s/%016llx: %s: %s\n", c->ns, (unsigned long long)key, kvf_status_str(st),
           detail ? detail : "");
}

static int scan_namespace(const char *dir, const char *ns, fsck_counts *c)
{
    kvf__blockfile_dir d;
    memset(&d, 0, sizeof d);
    d.dir_fd = -1;
    kvf_status st = kvf__blockfile_open_dir(dir, ns, 0, KVF_FSYNC_NONE, &d);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry fsck: %s\n", kvf_last_error());
        return -1;
    }
    c->ns = ns;
    st = kvf__blockfile_scan(&d, visit, c);
    kvf__blockfile_close_dir(&d);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry fsck: %s: %s\n", ns, kvf_last_error());
        return -1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvferry fsck DIR [--namespace NS] [-v]\n"
            "Checks every stored block's header and checksum in every namespace under DIR\n"
            "(or in NS alone), and leftovers of interrupted writes.\n"
            "  --namespace NS          one namespace only (--ns too)\n"
            "  -v, --verbose           a line for every good block too\n"
            "%s"
            "Exits 1 on a corrupt, torn or foreign block, 2 on bad usage.\n",
            kvf_cli_common_usage);
}

enum { OPT_VERBOSE = 'v' };

static const struct option fsck_options[] = {KVF_CLI_OPTS_COMMON,
                                             KVF_CLI_OPTS_NAMESPACE,
                                             {"verbose", no_argument, NULL, OPT_VERBOSE},
                                             KVF_CLI_OPTS_END};

typedef struct fsck_opts {
    const char *dir, *ns, *json;
    bool verbose;
} fsck_opts;

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_args(int argc, char **argv, fsck_opts *o)
{
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("fsck", argc, argv, fsck_options)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c == KVF_OPT_JSON)
            o->json = optarg;
        else if (c == KVF_OPT_NAMESPACE)
            o->ns = optarg;
        else if (c == OPT_VERBOSE)
            o->verbose = true;
        else
            return -1;
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "kvferry fsck: %s\n",
                optind < argc ? "one directory only" : "which directory? (kvferry fsck DIR)");
        return -1;
    }
    o->dir = argv[optind];
    return 0;
}

/* The counts as JSON, on --json. */
static int emit_json(const fsck_opts *o, unsigned namespaces, const fsck_counts *c, int rc)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "dir", o->dir);
    if (o->ns)
        cJSON_AddStringToObject(j, "namespace", o->ns);
    cJSON_AddNumberToObject(j, "namespaces", namespaces);
    cJSON_AddNumberToObject(j, "good", (double)c->good);
    cJSON_AddNumberToObject(j, "corrupt", (double)c->corrupt);
    cJSON_AddNumberToObject(j, "torn", (double)c->torn);
    cJSON_AddNumberToObject(j, "other_layout", (double)c->mismatch);
    cJSON_AddNumberToObject(j, "foreign", (double)c->foreign);
    cJSON_AddNumberToObject(j, "unreadable", (double)c->unreadable);
    cJSON_AddBoolToObject(j, "clean",
                          !rc && !c->corrupt && !c->torn && !c->mismatch && !c->foreign &&
                              !c->unreadable);
    return kvf_cli_json_emit("fsck", j);
}

int kvf_cli_fsck(int argc, char **argv)
{
    fsck_opts o = {NULL, NULL, NULL, false};
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("fsck");
    const char *dir = o.dir, *ns = o.ns;
    fsck_counts c = {0, 0, 0, 0, 0, 0, o.verbose, NULL};
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry fsck: %s: not a directory\n", dir);
        return 2;
    }
    if (kvf_cli_json_open("fsck", o.json))
        return KVF_CLI_FAILED;
    int rc = 0;
    unsigned namespaces = 0;
    if (ns) {
        rc = scan_namespace(dir, ns, &c);
        namespaces = 1;
    } else {
        DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
            if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
                continue;
            if (scan_namespace(dir, de->d_name, &c))
                rc = -1;
            namespaces++;
        }
        if (d)
            closedir(d);
    }
    printf("kvferry fsck %s: %u namespace(s), %lu good, %lu corrupt, %lu torn, %lu other "
           "layout, %lu foreign, %lu unreadable\n",
           dir, namespaces, c.good, c.corrupt, c.torn, c.mismatch, c.foreign, c.unreadable);
    fflush(stdout);
    if ((o.json && emit_json(&o, namespaces, &c, rc)) | kvf_cli_json_close("fsck"))
        rc = -1;
    return rc || c.corrupt || c.torn || c.mismatch || c.foreign || c.unreadable ? 1 : 0;
}
