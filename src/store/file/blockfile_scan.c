/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Walks over a namespace's directory: kvf__blockfile_scan checks every
 * block fully (fsck), kvf__blockfile_list reads only the headers (the
 * cache's restore after a restart).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "blockhdr.h"
#include "log.h"
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens the namespace directory for a walk, on a description of its own:
 * readdir moves the offset, and dir_fd is shared with every other user of
 * the directory. */
static kvf_status walk_open(kvf__blockfile_dir *dir, DIR **d_p)
{
    char eb[128];
    int fd = openat(dir->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return kvf__fail(kvf__errno_status(err), "%s: opendir: %s", dir->root,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    *d_p = d;
    return KVF_OK;
}

/* The next name of a walk; *name_p is NULL at the end. */
static kvf_status walk_next(const kvf__blockfile_dir *dir, DIR *d, const char **name_p)
{
    char eb[128];
    errno = 0;
    struct dirent *e = readdir(d);
    *name_p = e ? e->d_name : NULL;
    if (!e && errno) {
        int err = errno;
        return kvf__fail(kvf__errno_status(err), "%s: readdir: %s", dir->root,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    return KVF_OK;
}

kvf_status kvf__blockfile_scan(kvf__blockfile_dir *dir,
                               void (*visit)(void *arg, kvf_key key, kvf_status st,
                                             const char *detail),
                               void *arg)
{
    if (!dir || !dir->root || !visit)
        return kvf__fail(KVF_ERR_INVALID, "block file scan: NULL argument or directory not open");
    DIR *d;
    kvf_status ret = walk_open(dir, &d);
    if (ret != KVF_OK)
        return ret;
    uint8_t *buf = NULL;
    size_t cap = 0;
    const char *n;
    while ((ret = walk_next(dir, d, &n)) == KVF_OK && n) {
        kvf_key key;
        if (kvf__bf_block_name(n, &key)) {
            kvf__blockfile_meta meta;
            kvf_status st =
                kvf__bf_read_block(dir, key, &buf, &cap, true, &meta, dir->fingerprint == 0);
            if (st == KVF_ERR_NOT_FOUND)
                continue; /* removed since readdir: nothing to check */
            visit(arg, key, st, st == KVF_OK ? "ok" : kvf_last_error());
        } else if (kvf__bf_torn_name(n, &key)) {
            visit(arg, key, KVF_ERR_CORRUPT, "torn write (temporary file)");
        } else if (strcmp(n, ".") != 0 && strcmp(n, "..") != 0) {
            KVF_LOG(KVF_LOG_DEBUG, "%s/%s: not a block file, ignored", dir->root, n);
        }
    }
    free(buf);
    closedir(d);
    if (ret == KVF_OK)
        kvf__clear_error();
    return ret;
}

kvf_status kvf__blockfile_list(kvf__blockfile_dir *dir,
                               void (*visit)(void *arg, const kvf__blockfile_meta *meta,
                                             int64_t mtime_ns),
                               void *arg)
{
    if (!dir || !dir->root || !visit)
        return kvf__fail(KVF_ERR_INVALID, "block file list: NULL argument or directory not open");
    DIR *d;
    kvf_status ret = walk_open(dir, &d);
    if (ret != KVF_OK)
        return ret;
    const char *n;
    unsigned long foreign = 0, old_format = 0, old_v2 = 0;
    while ((ret = walk_next(dir, d, &n)) == KVF_OK && n) {
        kvf_key key;
        uint64_t old_key;
        if (kvf__bf_old_block_name(n, &old_key))
            old_format++;
        if (!kvf__bf_block_name(n, &key))
            continue;
        char path[PATH_MAX], what[PATH_MAX + 48];
        snprintf(path, sizeof path, "%s/%s", dir->root, n);
        snprintf(what, sizeof what, "block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(key), path);
        struct stat sb;
        mode_t mode;
        bool direct = false;
        int bfd = kvf__bf_open_block(dir, n, path, &direct, &sb, &mode);
        if (bfd < 0 && mode) {
            foreign++;
            KVF_LOG(KVF_LOG_WARN, "%s: %s, not a block file: foreign, skipped and left alone", what,
                    kvf__bf_file_kind(mode));
            continue;
        }
        if (bfd < 0 && errno == ENOENT)
            continue; /* removed since readdir */
        if (bfd < 0) {
            /* out of descriptors, say: skipping the block would drop it
             * from the listing (a cache would not know it) for nothing */
            int err = errno;
            char eb[128];
            ret = kvf__fail(kvf__errno_status(err), "%s/%s: open: %s", dir->root, n,
                            kvf__bf_errstr(err, eb, sizeof eb));
            break;
        }
        uint8_t h[HDR];
        bool ok = pread(bfd, h, HDR, 0) == HDR;
        close(bfd);
        kvf__block_header bh;
        /* a file that fails here is skipped, and so never served: reading
         * it would fail the same checks */
        if (!ok || kvf__block_header_parse(h, what, &bh) != KVF_OK ||
            kvf__block_header_expect(&bh, what, dir->fingerprint, dir->ns_hash, key) != KVF_OK ||
            kvf__bf_check_file_size((uint64_t)sb.st_size,
                                    (uint32_t)kvf__block_prefix_bytes(bh.pools), bh.payload_bytes,
                                    what) != KVF_OK) {
            if (ok && kvf__get_le32(h + 8) == KVF_BLOCK_FORMAT_V2)
                old_v2++;
            KVF_LOG(KVF_LOG_INFO, "%s: not a usable block (%s), skipped", what,
                    ok ? kvf_last_error() : "unreadable");
            continue;
        }
        kvf__blockfile_meta meta = {key, bh.tokens, bh.pools, bh.payload_bytes};
        visit(arg, &meta, (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec);
    }
    closedir(d);
    if (old_v2)
        KVF_LOG(KVF_LOG_WARN,
                "%s: %lu block file%s of " KVF_BLOCK_V2_WORDS " not served: rewrite them with "
                "`kvferry fsck --upgrade` on the block directory",
                dir->root, old_v2, old_v2 == 1 ? "" : "s");
    if (old_format)
        KVF_LOG(KVF_LOG_WARN,
                "%s: %lu block file%s of " KVF_BLOCK_V1_WORDS " not served: rewrite them with "
                "`kvferry fsck --upgrade` on the block directory",
                dir->root, old_format, old_format == 1 ? "" : "s");
    if (foreign)
        KVF_LOG(KVF_LOG_WARN,
                "%s: %lu foreign file%s under block names (not regular files), left alone",
                dir->root, foreign, foreign == 1 ? "" : "s");
    if (ret == KVF_OK)
        kvf__clear_error();
    return ret;
}
