/* kvferry fsck DIR: checks every stored block's header and checksum in
 * every namespace under DIR (or one, with --namespace), and leftovers of
 * interrupted writes. Exits 1 on any problem. */
#include "cli.h"
#include "internal.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct fsck_counts {
    unsigned long good, corrupt, torn, mismatch, foreign;
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

int kvf_cli_fsck(int argc, char **argv)
{
    const char *dir = NULL, *ns = NULL;
    fsck_counts c = {0, 0, 0, 0, 0, false, NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--namespace") && i + 1 < argc)
            ns = argv[++i];
        else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose"))
            c.verbose = true;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "usage: kvferry fsck DIR [--namespace NS] [-v]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: kvferry fsck DIR [--namespace NS] [-v]\n");
        return 2;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry fsck: %s: not a directory\n", dir);
        return 2;
    }
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
           "layout, %lu foreign\n",
           dir, namespaces, c.good, c.corrupt, c.torn, c.mismatch, c.foreign);
    return rc || c.corrupt || c.torn || c.mismatch || c.foreign ? 1 : 0;
}
