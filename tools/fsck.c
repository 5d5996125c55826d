/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry fsck DIR: checks every stored block's header and checksum in
 * every namespace under DIR (or one, with --namespace), and leftovers of
 * interrupted writes. Exits 1 on any problem. With --upgrade, first
 * rewrites the blocks of format version 1 (64-bit keys) in the current
 * format (kvf_dir_upgrade). */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct fsck_walk {
    kvf_dir_counts counts;
    bool verbose, upgrade;
    const char *dir, *ns;
    int rc; /* -1 once a namespace could not be walked */
} fsck_walk;

static void visit(void *arg, const kvf_dir_entry *e)
{
    fsck_walk *w = arg;
    if (e->kind == KVF_DIR_ENTRY_GOOD) {
        if (w->verbose)
            printf("  %s/" KVF_KEY_FMT ": ok\n", w->ns, KVF_KEY_ARGS(e->key));
        return;
    }
    printf("  %s/" KVF_KEY_FMT ": %s (%s): %s\n", w->ns, KVF_KEY_ARGS(e->key),
           kvf_dir_entry_kind_name(e->kind), kvf_status_str(e->status), e->message);
}

/* kvf_dir_upgrade's verdict on one old file. */
static void upgraded(void *arg, const kvf_dir_entry *e)
{
    fsck_walk *w = arg;
    if (e->status == KVF_OK)
        printf("  %s/" KVF_KEY_FMT ": upgraded: %s\n", w->ns, KVF_KEY_ARGS(e->key), e->message);
    else
        printf("  %s/" KVF_KEY_FMT ": not upgraded, %s (%s): %s\n", w->ns, KVF_KEY_ARGS(e->key),
               kvf_dir_entry_kind_name(e->kind), kvf_status_str(e->status), e->message);
}

static void scan_namespace(void *arg, const char *ns)
{
    fsck_walk *w = arg;
    w->ns = ns;
    /* what the upgrade leaves is counted by the check below */
    kvf_dir_counts up = KVF_DIR_COUNTS_INIT;
    if (w->upgrade && kvf_dir_upgrade(w->dir, ns, upgraded, w, &up) != KVF_OK) {
        fprintf(stderr, "kvferry fsck: %s\n", kvf_last_error());
        w->rc = -1;
        return;
    }
    w->counts.upgraded += up.upgraded;
    if (kvf_dir_check(w->dir, ns, NULL, 0, visit, w, &w->counts) != KVF_OK) {
        fprintf(stderr, "kvferry fsck: %s\n", kvf_last_error());
        w->rc = -1;
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvferry fsck DIR [--namespace NS] [--upgrade] [-v]\n"
            "Checks every stored block's header, pool table and each pool's checksum in\n"
            "every namespace under DIR (or in NS alone), and leftovers of interrupted\n"
            "writes; a damaged pool is named.\n"
            "  --namespace NS          one namespace only (--ns too)\n"
            "  --upgrade               first rewrite blocks of format version 1 (64-bit keys,\n"
            "                          16-digit names) and 2 (one checksum per block) in the\n"
            "                          current format, file by file (a damaged one is\n"
            "                          reported and left)\n"
            "  -v, --verbose           a line for every good block too\n"
            "A corrupt, torn, foreign or old-format block exits 1; DIR or NS not found\n"
            "exits 3.\n"
            "%s",
            kvf_cli_common_usage);
}

enum { OPT_VERBOSE = 'v', OPT_UPGRADE = KVF_OPT_OWN };

static const struct option fsck_options[] = {KVF_CLI_OPTS_COMMON,
                                             KVF_CLI_OPTS_NAMESPACE,
                                             {"verbose", no_argument, NULL, OPT_VERBOSE},
                                             {"upgrade", no_argument, NULL, OPT_UPGRADE},
                                             KVF_CLI_OPTS_END};

typedef struct fsck_opts {
    const char *dir, *ns, *json;
    bool verbose, upgrade;
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
        else if (c == OPT_UPGRADE)
            o->upgrade = true;
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
static int emit_json(const fsck_opts *o, size_t namespaces, const fsck_walk *w)
{
    const kvf_dir_counts *c = &w->counts;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "dir", o->dir);
    if (o->ns)
        cJSON_AddStringToObject(j, "namespace", o->ns);
    cJSON_AddNumberToObject(j, "namespaces", (double)namespaces);
    cJSON_AddNumberToObject(j, "good", (double)c->good);
    cJSON_AddNumberToObject(j, "corrupt", (double)c->corrupt);
    cJSON_AddNumberToObject(j, "torn", (double)c->torn);
    cJSON_AddNumberToObject(j, "other_layout", (double)c->mismatch);
    cJSON_AddNumberToObject(j, "foreign", (double)c->foreign);
    cJSON_AddNumberToObject(j, "unreadable", (double)c->unreadable);
    cJSON_AddNumberToObject(j, "old_format", (double)c->old_format);
    cJSON_AddNumberToObject(j, "upgraded", (double)c->upgraded);
    cJSON_AddBoolToObject(j, "clean",
                          !w->rc && !c->corrupt && !c->torn && !c->mismatch && !c->foreign &&
                              !c->unreadable && !c->old_format);
    return kvf_cli_json_emit("fsck", j);
}

int kvf_cli_fsck(int argc, char **argv)
{
    fsck_opts o = {NULL, NULL, NULL, false, false};
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("fsck");
    fsck_walk w = {KVF_DIR_COUNTS_INIT, o.verbose, o.upgrade, o.dir, NULL, 0};
    struct stat sb;
    if (stat(o.dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry fsck: %s: not a directory\n", o.dir);
        return KVF_CLI_MISSING;
    }
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", o.dir, o.ns ? o.ns : "");
    if (o.ns && (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "kvferry fsck: %s: no such namespace (no directory %s)\n", o.ns, sub);
        return KVF_CLI_MISSING;
    }
    if (kvf_cli_json_open("fsck", o.json))
        return KVF_CLI_FAILED;
    size_t namespaces = 0;
    if (o.ns) {
        scan_namespace(&w, o.ns);
        namespaces = 1;
    } else if (kvf_dir_namespaces(o.dir, scan_namespace, &w, &namespaces) != KVF_OK) {
        fprintf(stderr, "kvferry fsck: %s\n", kvf_last_error());
        w.rc = -1;
    }
    const kvf_dir_counts *c = &w.counts;
    printf("kvferry fsck %s: %zu namespace(s), %llu good, %llu corrupt, %llu torn, %llu other "
           "layout, %llu foreign, %llu unreadable, %llu old format",
           o.dir, namespaces, (unsigned long long)c->good, (unsigned long long)c->corrupt,
           (unsigned long long)c->torn, (unsigned long long)c->mismatch,
           (unsigned long long)c->foreign, (unsigned long long)c->unreadable,
           (unsigned long long)c->old_format);
    if (o.upgrade)
        printf(", %llu upgraded", (unsigned long long)c->upgraded);
    printf("\n");
    if (c->old_format)
        printf("kvferry fsck: blocks of format version 1 (64-bit keys) or 2 (one checksum per "
               "block) are not served: rewrite them with `kvferry fsck --upgrade %s`\n",
               o.dir);
    fflush(stdout);
    int rc = w.rc;
    if ((o.json && emit_json(&o, namespaces, &w)) | kvf_cli_json_close("fsck"))
        rc = -1;
    return rc || c->corrupt || c->torn || c->mismatch || c->foreign || c->unreadable ||
                   c->old_format
               ? 1
               : 0;
}
