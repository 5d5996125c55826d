/*
 * Block files: one file per block key under <file_dir>/<namespace>/.
 *
 * File name: <16 lower-case hex digits of the key>.kvf. A writer first
 * writes .<key>.<pid>.<sequence>.tmp and renames it over the final name,
 * so a file under the final name is always complete; a leftover .tmp file
 * is a write that was interrupted (a crash) and is never read. An engine
 * opening the directory removes the leftovers of writers that are gone
 * (kvf__blockfile_remove_stale: their pid no longer exists); those of live
 * processes, e.g. another engine sharing the namespace, are theirs and
 * stay. fsck leaves them and reports them as torn.
 *
 * The format of a stored block (header, then payload) is blockhdr.c's,
 * shared with the remote tier. The file holds exactly one such block.
 *
 * Length rule. Files are written with O_DIRECT where the file system takes
 * it, which moves whole 4096-byte units: the writer pads the image with
 * zeros to round_up(64 + payload, 4096) when its buffer has room, and the
 * file keeps that length (no ftruncate: trimming a partial unit would read
 * it back and dirty it in the page cache, a buffered write per file). A
 * reader accepts a file of exactly 64 + payload bytes (a writer without
 * room to pad) or of the padded length, and nothing else: a file cut or
 * grown by even one byte is corrupt, the header's payload length says
 * where the data ends, and the checksum covers the payload, so padding is
 * never handed back as data.
 *
 * Durability (KVF_FSYNC_BATCH, the default method). A batch's files are
 * written with O_DIRECT (the data is on the device when the write
 * completes, possibly in its volatile cache), renamed into place, and then
 * one syncfs() of the file system flushes that cache and commits the
 * journal holding the renames, before any move of the batch is reported.
 * A crash before syncfs returns promised nothing; what it can leave is a
 * final name whose data did not reach the platter (ext4's data=ordered
 * orders newly allocated blocks before the commit that names them, but
 * not blocks written over in place, as spares are, nor page-cache data on
 * the buffered fallback). Such a file fails its checksums: KVF_ERR_CORRUPT,
 * never other bytes. syncfs also flushes other writers' dirty data on the
 * same file system, which can make one batch pay for another process's
 * writes; KVF_FSYNC_METHOD=fsync restores an fsync per file plus one of
 * the directory per batch.
 *
 * Batches. kvf__blockfile_write_many and _read_many take many blocks at
 * once and run their reads, writes and fsyncs through a file I/O engine
 * (fileio.c), so a batch is in flight at the engine's queue depth; the
 * single-block calls are the same code with one block.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile.h"
#include "blockhdr.h"
#include "checksum.h"
#include "fileio.h"
#include "log.h"
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define HDR KVF_BLOCKFILE_HEADER_BYTES
/* Room for "/.<16>.<pid>.<seq>.tmp" after the root in a path buffer. */
#define NAME_MAX_BYTES 80
/* Linux moves at most 0x7ffff000 bytes per call; stay below it. */
#define IO_CHUNK ((size_t)1 << 30)
/* The largest payload written or read: far above a KV block of any model
 * (megabytes), far below what a reader can allocate on the word of one
 * header it has not yet checked beyond its own checksum. */
#define BLOCK_PAYLOAD_MAX ((uint64_t)1 << 30)

static atomic_uint_fast64_t tmp_seq;
static atomic_bool direct_refusal_logged;

/* fsync (or syncfs: `sync`) with the hook before it, as "fsync"; EINTR,
 * real or injected, is retried. 0, or -1 with errno set. */
static int sync_with(int (*sync)(int), int fd, const char *path)
{
    for (;;) {
        int err = kvf__io_fault("fsync", path, NULL);
        if (err == 0 && sync(fd) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err != EINTR) {
            errno = err;
            return -1;
        }
    }
}

/* Spare files: the inodes of replaced blocks, kept under temporary names
 * to be written over by later writes. Replacing a file by rename frees
 * its blocks and a new file allocates others; on this project's disk
 * (ext4, online discard) freeing a 1 MiB file took 1.2-1.7 ms, more than
 * writing it (docs/PERFORMANCE.md). Swapping the new file in with
 * RENAME_EXCHANGE instead leaves the old inode under the temporary name,
 * renamed .<key>.<pid>.<sequence>.spare: never read, and not a torn
 * write. The next write opens a spare (no O_TRUNC), writes over its blocks
 * in place and swaps it in in turn, which leaves the file it replaces
 * under the same spare name. Spares of a writer that is gone (a crash)
 * are removed like its temporary files; an engine removes its own when
 * it closes the directory. Within an engine, a read of a key is ordered
 * before a write that replaces it, so no read is left on an inode that
 * became a spare; a reader in another process sharing the namespace can
 * be, and then sees the spare rewritten: it gets KVF_ERR_CORRUPT (the
 * checksums), never another block's bytes. */
#define MAX_SPARES 256

struct kvf__blockfile_spares {
    pthread_mutex_t mu;
    size_t n;
    char names[MAX_SPARES][NAME_MAX_BYTES];
};

static bool spare_take(kvf__blockfile_dir *dir, char *name)
{
    struct kvf__blockfile_spares *sp = dir->spares;
    bool got = false;
    pthread_mutex_lock(&sp->mu);
    if (sp->n) {
        memcpy(name, sp->names[--sp->n], NAME_MAX_BYTES);
        got = true;
    }
    pthread_mutex_unlock(&sp->mu);
    return got;
}

/* Keeps the file under `name` as a spare: one that held a write's data
 * (".tmp") is renamed ".spare" first, so that a spare is never taken for
 * a torn write; one already a spare stays as it is. */
static void spare_give(kvf__blockfile_dir *dir, const char *from)
{
    struct kvf__blockfile_spares *sp = dir->spares;
    char name[NAME_MAX_BYTES];
    snprintf(name, sizeof name, "%s", from);
    size_t n = strlen(name);
    if (n > 4 && strcmp(name + n - 4, ".tmp") == 0) {
        snprintf(name + n - 4, sizeof name - (n - 4), ".spare");
        if (renameat(dir->dir_fd, from, dir->dir_fd, name) != 0) {
            unlinkat(dir->dir_fd, from, 0);
            return;
        }
    }
    pthread_mutex_lock(&sp->mu);
    bool kept = sp->n < MAX_SPARES;
    if (kept)
        snprintf(sp->names[sp->n++], NAME_MAX_BYTES, "%s", name);
    pthread_mutex_unlock(&sp->mu);
    if (!kept)
        unlinkat(dir->dir_fd, name, 0);
}

/* Moves the temporary file `from` to the final name `to` atomically,
 * hooked as "rename" on the final path; a file it replaces becomes a
 * spare. 0, or -1 with errno set. */
static int rename_in(kvf__blockfile_dir *dir, const char *from, const char *to, const char *to_path)
{
    int dir_fd = dir->dir_fd;
    for (;;) {
        int err = kvf__io_fault("rename", to_path, NULL);
        if (err == 0 && atomic_load_explicit(&dir->exchange, memory_order_relaxed)) {
            if (renameat2(dir_fd, from, dir_fd, to, RENAME_EXCHANGE) == 0) {
                spare_give(dir, from);
                return 0;
            }
            /* ENOENT: nothing to replace; EINVAL: not on this file system */
            if (errno == EINVAL || errno == ENOSYS)
                atomic_store(&dir->exchange, false);
            else if (errno != ENOENT)
                err = errno;
        }
        if (err == 0 && renameat(dir_fd, from, dir_fd, to) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err != EINTR) {
            errno = err;
            return -1;
        }
    }
}

static const char *errstr(int err, char *buf, size_t cap)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(err, buf, cap);
#else
    if (strerror_r(err, buf, cap) != 0)
        snprintf(buf, cap, "errno %d", err);
    return buf;
#endif
}

/* A write that fails for a missing directory is an I/O failure of the
 * tier, not a missing block. */
static kvf_status write_errno_status(int err)
{
    kvf_status st = kvf__errno_status(err);
    return st == KVF_ERR_NOT_FOUND ? KVF_ERR_IO : st;
}

/* mkdir -p: a component that exists (as a directory) is fine. */
static kvf_status make_dirs(const char *path)
{
    char eb[128];
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    if (!p)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", path);
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        if (p[i - 1] == '/')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            /* e.g. EACCES on a parent that exists but is not ours */
            int err = errno;
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
                kvf_status s = kvf__fail(write_errno_status(err), "%s: mkdir: %s", p,
                                         errstr(err, eb, sizeof eb));
                free(p);
                return s;
            }
        }
        p[i] = saved;
    }
    free(p);
    return KVF_OK;
}

static bool parse_hex16(const char *s, uint64_t *key_p)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return false;
        v = v << 4 | d;
    }
    *key_p = v;
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parses ".<16 hex>.<pid>.<sequence>.tmp" (or ".spare"), the names
 * kvf__blockfile_write gives its temporary and spare files; false for any
 * other name. */
static bool parse_tmp_name(const char *n, pid_t *pid_p)
{
    uint64_t key;
    if (n[0] != '.' || !parse_hex16(n + 1, &key) || n[17] != '.')
        return false;
    const char *p = n + 18;
    long long pid = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (++digits > 10)
            return false;
        pid = pid * 10 + (*p - '0');
    }
    if (digits == 0 || *p != '.' || pid <= 0 || pid > INT_MAX)
        return false;
    p++;
    digits = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (++digits > 20)
            return false;
    if (digits == 0 || (strcmp(p, ".tmp") != 0 && strcmp(p, ".spare") != 0))
        return false;
    *pid_p = (pid_t)pid;
    return true;
}

/* Removes the temporary files of writers that no longer exist: writes a
 * crash (kill -9, power loss) interrupted, which nobody will rename. A
 * file whose pid is alive (this process, another engine on the same
 * directory) or whose liveness cannot be told (EPERM: alive, not ours)
 * stays. Best effort: a failure here is logged, never fatal. */
static void remove_stale_tmp(int dir_fd, const char *root)
{
    char eb[128];
    int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        KVF_LOG(KVF_LOG_WARN, "%s: cannot list for stale temporary files: %s", root,
                errstr(err, eb, sizeof eb));
        return;
    }
    unsigned long removed = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) {
                int err = errno;
                KVF_LOG(KVF_LOG_WARN, "%s: readdir: %s", root, errstr(err, eb, sizeof eb));
            }
            break;
        }
        pid_t pid;
        /* a FIFO or directory under such a name is not a writer's: left */
        if (!parse_tmp_name(e->d_name, &pid) || (e->d_type != DT_REG && e->d_type != DT_UNKNOWN))
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        if (unlinkat(dir_fd, e->d_name, 0) != 0) {
            int err = errno;
            if (err != ENOENT) /* another opener removed it first */
                KVF_LOG(KVF_LOG_WARN, "%s/%s: cannot remove stale temporary file: %s", root,
                        e->d_name, errstr(err, eb, sizeof eb));
            continue;
        }
        removed++;
        KVF_LOG(KVF_LOG_INFO,
                "%s/%s: removed the temporary file of an interrupted write (pid %ld gone)", root,
                e->d_name, (long)pid);
    }
    closedir(d);
    if (removed)
        KVF_LOG(KVF_LOG_WARN, "%s: removed %lu stale temporary file%s of interrupted writes", root,
                removed, removed == 1 ? "" : "s");
}

kvf_status kvf__blockfile_open_dir(const char *file_dir, const char *ns, uint64_t fingerprint,
                                   kvf_fsync fsync_mode, kvf__blockfile_dir *dir)
{
    char eb[128];
    if (!dir)
        return kvf__fail(KVF_ERR_INVALID, "block files: NULL directory");
    /* closed state first: close_dir after a failed open is harmless */
    dir->root = NULL;
    dir->spares = NULL;
    dir->fio = NULL;
    dir->dir_fd = -1;
    if (!file_dir || !*file_dir)
        return kvf__fail(KVF_ERR_INVALID, "file directory: NULL or empty");
    if (!ns)
        ns = "default";
    if (!kvf__ns_valid(ns))
        return kvf__fail(KVF_ERR_INVALID,
                         "namespace \"%.80s\": want 1 to 64 of [A-Za-z0-9._-], not . or ..", ns);
    if (fsync_mode != KVF_FSYNC_NONE && fsync_mode != KVF_FSYNC_BATCH &&
        fsync_mode != KVF_FSYNC_BLOCK)
        return kvf__fail(KVF_ERR_INVALID, "fsync mode %d unknown", (int)fsync_mode);

    size_t dlen = strlen(file_dir);
    while (dlen > 1 && file_dir[dlen - 1] == '/')
        dlen--;
    size_t rlen = dlen + 1 + strlen(ns);
    if (rlen + NAME_MAX_BYTES >= PATH_MAX)
        return kvf__fail(KVF_ERR_INVALID, "%.*s: path too long", (int)dlen, file_dir);
    char *root = malloc(rlen + 1);
    if (!root)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", file_dir);
    snprintf(root, rlen + 1, "%.*s%s%s", (int)dlen, file_dir, file_dir[dlen - 1] == '/' ? "" : "/",
             ns);

    kvf_status st = make_dirs(root);
    if (st != KVF_OK)
        goto free_root;

    int fd;
    int err = kvf__io_fault("open", root, NULL);
    if (err == 0) {
        fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        err = fd < 0 ? errno : 0;
    } else {
        fd = -1;
    }
    if (fd < 0) {
        st = kvf__fail(write_errno_status(err), "%s: open: %s", root, errstr(err, eb, sizeof eb));
        goto free_root;
    }

    dir->root = root;
    dir->ns_hash = kvf__ns_hash(ns);
    dir->fingerprint = fingerprint;
    dir->fsync = fsync_mode;
    dir->dir_fd = fd;
    dir->spares = calloc(1, sizeof *dir->spares);
    if (dir->spares)
        pthread_mutex_init(&dir->spares->mu, NULL);
    atomic_init(&dir->exchange, dir->spares != NULL);
    atomic_init(&dir->direct, kvf__env_knob("KVF_FILE_DIRECT") != 0);
    dir->use_syncfs = kvf__env_knob("KVF_FSYNC_METHOD") == 0; /* syncfs, fsync */
    KVF_LOG(KVF_LOG_DEBUG, "%s: block files open (namespace hash 0x%016llx)", root,
            (unsigned long long)dir->ns_hash);
    return KVF_OK;

free_root:
    free(root);
    return st;
}

void kvf__blockfile_close_dir(kvf__blockfile_dir *dir)
{
    if (!dir)
        return;
    /* root says whether the struct is open: a zeroed one has dir_fd 0,
     * which is not ours to close */
    if (dir->root) {
        if (dir->spares) {
            for (size_t i = 0; i < dir->spares->n; i++)
                unlinkat(dir->dir_fd, dir->spares->names[i], 0);
            pthread_mutex_destroy(&dir->spares->mu);
            free(dir->spares);
        }
        if (dir->dir_fd >= 0)
            close(dir->dir_fd);
        free(dir->root);
    }
    dir->spares = NULL;
    dir->root = NULL;
    dir->dir_fd = -1;
}

kvf_status kvf__blockfile_fsync_dir(kvf__blockfile_dir *dir)
{
    char eb[128];
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block files: directory not open");
    bool whole_fs = dir->fsync == KVF_FSYNC_BATCH && dir->use_syncfs;
    if (sync_with(whole_fs ? syncfs : fsync, dir->dir_fd, dir->root) != 0) {
        int err = errno;
        return kvf__fail(write_errno_status(err), "%s: fsync: %s", dir->root,
                         errstr(err, eb, sizeof eb));
    }
    return KVF_OK;
}

static int open_at(int dir_fd, const char *name, const char *path, int flags, mode_t mode)
{
    for (;;) {
        int err = kvf__io_fault("open", path, NULL);
        int fd;
        if (err) {
            errno = err;
            fd = -1;
        } else {
            fd = openat(dir_fd, name, flags, mode);
        }
        if (fd >= 0 || errno != EINTR)
            return fd;
    }
}

/* Reads n bytes at offset off into p. 0: all read; -1: a failed call,
 * errno set; 1: end of file after *got bytes. */
static int read_full(int fd, const char *path, uint8_t *p, size_t n, uint64_t off, size_t *got)
{
    size_t done = 0;
    while (done < n) {
        size_t len = n - done < IO_CHUNK ? n - done : IO_CHUNK;
        int err = kvf__io_fault("read", path, &len);
        ssize_t r;
        if (err) {
            errno = err;
            r = -1;
        } else {
            r = pread(fd, p + done, len, (off_t)(off + done));
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            *got = done;
            return -1;
        }
        if (r == 0) {
            *got = done;
            return 1;
        }
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

static size_t round_up_align(size_t n)
{
    return (n + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
}

static bool buf_aligned(const void *p)
{
    return ((uintptr_t)p & (KVF_FILE_ALIGN - 1)) == 0;
}

/* Records a failure of one block's I/O: its status, and its message, kept
 * with it (a batch has many) and as the thread's last error. */
static void __attribute__((format(printf, 3, 4)))
io_fail(kvf__blockfile_io *io, kvf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(io->msg, sizeof io->msg, fmt, ap);
    va_end(ap);
    io->status = st;
    kvf__fail(st, "%s", io->msg);
}

/* What a file that is not a regular file is, for messages. */
static const char *file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISLNK(mode))
        return "a symbolic link";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a regular file";
}

/* Whether `name` exists and is something other than a regular file (its
 * mode in *mode_p): a FIFO, directory, link... that kvferry never wrote. */
static bool is_foreign(int dir_fd, const char *name, mode_t *mode_p)
{
    struct stat sb;
    if (fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISREG(sb.st_mode))
        return false;
    *mode_p = sb.st_mode;
    return true;
}

/* Opens `name`, with O_DIRECT when *direct_p. A file system that refuses
 * O_DIRECT (EINVAL: tmpfs, some FUSE) gets buffered I/O from then on,
 * said once; a FIFO or directory under the name refuses it too (EINVAL),
 * which says nothing about the file system. */
static int open_file(kvf__blockfile_dir *dir, const char *name, const char *path, int flags,
                     bool *direct_p)
{
    if (*direct_p) {
        int fd;
        mode_t mode;
        if (kvf__fileio_direct_refused()) {
            errno = EINVAL;
            fd = -1;
        } else {
            fd = open_at(dir->dir_fd, name, path, flags | O_DIRECT, 0644);
        }
        if (fd >= 0 || errno != EINVAL)
            return fd;
        if (is_foreign(dir->dir_fd, name, &mode)) {
            errno = EINVAL;
            return -1;
        }
        char eb[128];
        const char *why = errstr(EINVAL, eb, sizeof eb);
        atomic_store(&dir->direct, false);
        if (!atomic_exchange(&direct_refusal_logged, true))
            KVF_LOG(KVF_LOG_WARN, "%s: O_DIRECT refused (%s): buffered file i/o", dir->root, why);
        *direct_p = false;
    }
    return open_at(dir->dir_fd, name, path, flags, 0644);
}

/* Opens an existing block file for reading without ever blocking: a FIFO
 * under a block's name would wait for a writer forever, a link would be
 * followed to whatever it names. *mode_p is 0, or the mode of a file that
 * is not a regular file (foreign: never read, never removed). -1 with
 * errno set on failure; else the descriptor, a regular file, blocking
 * again (io_uring answers EAGAIN on O_NONBLOCK files instead of waiting),
 * *sb its fstat. */
static int open_block(kvf__blockfile_dir *dir, const char *name, const char *path, bool *direct_p,
                      struct stat *sb, mode_t *mode_p)
{
    *mode_p = 0;
    int fd = open_file(dir, name, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, direct_p);
    if (fd < 0) {
        /* ELOOP (a link), ENXIO (a socket), EINVAL (O_DIRECT on a FIFO) */
        int err = errno;
        if (err != ENOENT && is_foreign(dir->dir_fd, name, mode_p))
            return -1;
        errno = err;
        return -1;
    }
    int err = 0;
    if (fstat(fd, sb) != 0)
        err = errno;
    else if (!S_ISREG(sb->st_mode))
        *mode_p = sb->st_mode;
    else if (fcntl(fd, F_SETFL, *direct_p ? O_DIRECT : 0) != 0)
        err = errno;
    if (err || *mode_p) {
        close(fd);
        errno = err ? err : EINVAL;
        return -1;
    }
    return fd;
}

/* unlinkat, hooked as "unlink" on `path`; 0 (removed, or nothing there)
 * or an errno. */
static int unlink_block(kvf__blockfile_dir *dir, const char *name, const char *path)
{
    for (;;) {
        int err = kvf__io_fault("unlink", path, NULL);
        if (err == 0 && unlinkat(dir->dir_fd, name, 0) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err == ENOENT)
            return 0;
        if (err != EINTR)
            return err;
    }
}

/* Cuts a block file that cannot be removed to 0 bytes, hooked as
 * "truncate": a directory that refuses unlink (read-only, sticky, not
 * ours) still lets the file's owner write the file itself, and an empty
 * file is never read as a block, by this process or any later one.
 * 0 or an errno; a name that is not a regular file is left alone (it is
 * never read as a block either). */
static int empty_block(kvf__blockfile_dir *dir, const char *name, const char *path)
{
    int err = kvf__io_fault("truncate", path, NULL);
    if (err)
        return err;
    int fd = openat(dir->dir_fd, name, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        mode_t mode;
        err = errno;
        return err == ENOENT || is_foreign(dir->dir_fd, name, &mode) ? 0 : err;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        err = errno;
    else if (S_ISREG(sb.st_mode) && ftruncate(fd, 0) != 0)
        err = errno;
    /* for a crash: without it the cut may not outlive one (best effort,
     * the cut itself is what every reader sees from now on) */
    if (err == 0)
        fsync(fd);
    close(fd);
    return err;
}

/* Makes sure no version of a block is left readable after a failed write:
 * removed; else, when the directory refuses (EACCES, EPERM, EROFS...),
 * emptied in place (*emptied_p). KVF_OK when the file is gone; else the
 * failure, its message saying whether the file remains empty or, where
 * emptying failed too, with its old bytes. */
static kvf_status discard_block(kvf__blockfile_dir *dir, uint64_t key, const char *name,
                                const char *path, bool *emptied_p)
{
    char eb[128], eb2[128];
    *emptied_p = false;
    int err = unlink_block(dir, name, path);
    if (err == 0)
        return KVF_OK;
    int err2 = empty_block(dir, name, path);
    if (err2 == 0) {
        *emptied_p = true;
        return kvf__fail(write_errno_status(err),
                         "block 0x%llx: %s: unlink: %s; emptied in place instead (the file "
                         "remains, 0 bytes, never read as the block)",
                         (unsigned long long)key, path, errstr(err, eb, sizeof eb));
    }
    return kvf__fail(write_errno_status(err),
                     "block 0x%llx: %s: unlink: %s; emptying it in place: %s: THE FILE REMAINS "
                     "with the block's previous bytes",
                     (unsigned long long)key, path, errstr(err, eb, sizeof eb),
                     errstr(err2, eb2, sizeof eb2));
}

kvf_status kvf__blockfile_discard(kvf__blockfile_dir *dir, uint64_t key, bool *emptied_p)
{
    bool emptied = false;
    if (emptied_p)
        *emptied_p = false;
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block file discard: directory not open");
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    snprintf(name, sizeof name, "%016llx.kvf", (unsigned long long)key);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);
    kvf_status st = discard_block(dir, key, name, path, &emptied);
    if (emptied_p)
        *emptied_p = emptied;
    return st;
}

/* Undoes a failed write: no temporary file, and no old version of the key
 * (the engine has already told its caller the old bytes are gone); where
 * the old file cannot be removed, the block's message says what became
 * of it. */
static void write_failed(kvf__blockfile_dir *dir, kvf__blockfile_io *io, const char *op, int err)
{
    char eb[128];
    if (io->fd >= 0)
        close(io->fd);
    io->fd = -1;
    unlinkat(dir->dir_fd, io->tmp, 0);
    bool emptied;
    char left[PATH_MAX + 160] = "";
    if (discard_block(dir, io->meta.key, io->name, io->path, &emptied) != KVF_OK)
        snprintf(left, sizeof left, "; %s", kvf_last_error());
    io_fail(io, write_errno_status(err), "block 0x%llx: %s: %s: %s%s",
            (unsigned long long)io->meta.key, io->path, op, errstr(err, eb, sizeof eb), left);
}

static kvf__blockfile_io *io_of(kvf__fio_op *op)
{
    return (kvf__blockfile_io *)((char *)op - offsetof(kvf__blockfile_io, io));
}

/* Reports one block's final result to the caller, once. */
static void io_finished(kvf__blockfile_io *io)
{
    if (io->reported)
        return;
    io->reported = true;
    if (io->on_done)
        io->on_done(io);
}

/* Links the fileio ops of the blocks still going, of `kind`, each calling
 * `on_done` when finished; NULL if none. */
static kvf__fio_op *live_ops(kvf__blockfile_io *ios, size_t n, kvf__fio_kind kind,
                             bool (*on_start)(kvf__fio_op *op), void (*on_done)(kvf__fio_op *op))
{
    kvf__fio_op *head = NULL, **tailp = &head;
    for (size_t i = 0; i < n; i++) {
        if (ios[i].status != KVF_OK)
            continue;
        ios[i].io.kind = kind;
        ios[i].io.on_start = on_start;
        ios[i].io.on_done = on_done;
        /* set before the run, not in on_start: kvf__fileio_run picks the
         * engine for the list by its xfer before any op starts */
        ios[i].io.xfer = ios[i].img ? ios[i].img->xfer : NULL;
        ios[i].io.xfer_arg = ios[i].img_arg;
        *tailp = &ios[i].io;
        tailp = &ios[i].io.next;
    }
    *tailp = NULL;
    return head;
}

/* A spare file to write over, cut to `len`, under io->tmp; -1 when there
 * is none (or it is gone or unusable: the caller creates a file). */
static int open_spare(kvf__blockfile_dir *dir, kvf__blockfile_io *io, size_t len, bool *direct_p)
{
    char name[NAME_MAX_BYTES];
    while (dir->spares && spare_take(dir, name)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir->root, name);
        /* not blocking: a rename exchange may have made anything that
         * stood under a block's name a spare, a FIFO too */
        int fd =
            open_file(dir, name, path, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, direct_p);
        struct stat sb;
        if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
            fcntl(fd, F_SETFL, *direct_p ? O_DIRECT : 0) == 0 &&
            ((uint64_t)sb.st_size == len || ftruncate(fd, (off_t)len) == 0)) {
            snprintf(io->tmp, sizeof io->tmp, "%s", name);
            snprintf(io->tmp_path, sizeof io->tmp_path, "%s", path);
            return fd;
        }
        if (fd >= 0)
            close(fd);
        unlinkat(dir->dir_fd, name, 0);
    }
    return -1;
}

/* Sets up one block's write: header, padding, names, the temporary file
 * opened. false when it failed (io->status says why). */
static bool write_begin(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    const kvf__blockfile_meta *meta = &io->meta;
    unsigned long long key = (unsigned long long)meta->key;
    snprintf(io->name, sizeof io->name, "%016llx.kvf", key);
    snprintf(io->path, sizeof io->path, "%s/%s", dir->root, io->name);
    if (meta->payload_bytes > BLOCK_PAYLOAD_MAX || HDR + meta->payload_bytes > io->cap) {
        /* a failed write leaves no old version behind, whatever the cause */
        bool emptied;
        discard_block(dir, meta->key, io->name, io->path, &emptied);
        io_fail(io, KVF_ERR_RANGE,
                "block 0x%llx: payload of %llu bytes too large (a block holds at most %llu, "
                "the buffer %zu with the header)",
                key, (unsigned long long)meta->payload_bytes, (unsigned long long)BLOCK_PAYLOAD_MAX,
                io->cap);
        return false;
    }
    size_t total = HDR + (size_t)meta->payload_bytes;
    /* pid and a process-wide sequence: concurrent writers of one key,
     * in this process or another, never share a temporary file */
    snprintf(io->tmp, sizeof io->tmp, ".%016llx.%ld.%llu.tmp", key, (long)getpid(),
             (unsigned long long)atomic_fetch_add(&tmp_seq, 1));
    snprintf(io->tmp_path, sizeof io->tmp_path, "%s/%s", dir->root, io->tmp);

    kvf__block_header h = {dir->fingerprint, dir->ns_hash,        meta->key, meta->tokens,
                           meta->pools,      meta->payload_bytes, 0};
    /* the aligned image when the buffer has room for it: see the top of
     * the file for the length rule */
    size_t len = round_up_align(total) <= io->cap ? round_up_align(total) : total;
    if (io->img) {
        /* an image in device memory: checksummed and completed there;
         * nothing is written yet, so the key's file stays as it was */
        uint8_t hb[HDR];
        kvf_status st =
            io->img->crc(io->img_arg, io->buf + HDR, (size_t)meta->payload_bytes, &h.payload_crc);
        if (st == KVF_OK) {
            kvf__block_header_pack(&h, hb);
            st = io->img->put(io->img_arg, io->buf, hb, HDR);
        }
        if (st == KVF_OK)
            st = io->img->put(io->img_arg, io->buf + total, NULL, len - total);
        if (st != KVF_OK) {
            io_fail(io, st, "block 0x%llx: %s", key, kvf_last_error());
            return false;
        }
    } else {
        h.payload_crc = kvf__crc32c(0, io->buf + HDR, (size_t)meta->payload_bytes);
        kvf__block_header_pack(&h, io->buf);
        memset(io->buf + total, 0, len - total);
    }
    bool direct = atomic_load_explicit(&dir->direct, memory_order_relaxed) &&
                  buf_aligned(io->buf) && len % KVF_FILE_ALIGN == 0;
    io->fd = open_spare(dir, io, len, &direct);
    if (io->fd < 0)
        io->fd = open_file(dir, io->tmp, io->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                           &direct);
    if (io->fd < 0) {
        write_failed(dir, io, "open", errno);
        return false;
    }
    /* field by field: the rest of the op is the I/O engine's while it runs */
    io->io.fd = io->fd;
    io->io.buf = io->buf;
    io->io.len = io->io.need = len;
    io->io.off = 0;
    io->io.path = io->tmp_path;
    io->io.direct = direct;
    io->io.xfer = io->img ? io->img->xfer : NULL;
    io->io.xfer_arg = io->img_arg;
    return true;
}

/* Closes and renames a written temporary file: the block is stored. */
static bool write_commit(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    int rc = close(io->fd);
    io->fd = -1; /* closed even when close() fails; never retried */
    if (rc != 0) {
        write_failed(dir, io, "close", errno);
        return false;
    }
    if (rename_in(dir, io->tmp, io->name, io->path) != 0) {
        write_failed(dir, io, "rename", errno);
        return false;
    }
    return true;
}

/* A write finished with no fsync of its own to wait for: committed at
 * once, while the batch's other writes are still in flight. */
/* Just before a block's write: its payload filled in by the caller (a
 * gather from slots, overlapping the writes in flight), then header and
 * temporary file. A failed fill leaves the key's file as it was: nothing
 * was written. */
static bool write_op_start(kvf__fio_op *op)
{
    kvf__blockfile_io *io = io_of(op);
    if (io->fill) {
        kvf_status st = io->fill(io);
        if (st != KVF_OK) {
            io_fail(io, st, "%s", kvf_last_error());
            return false;
        }
    }
    return write_begin(io->dir, io);
}

static void write_op_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = io_of(op);
    kvf__blockfile_dir *dir = io->dir;
    if (io->status != KVF_OK)
        ; /* failed before its write */
    else if (op->err)
        write_failed(dir, io, "write", op->err);
    else
        write_commit(dir, io);
    io_finished(io);
}

void kvf__blockfile_write_many(kvf__blockfile_dir *dir, kvf__fileio *fio, kvf__blockfile_io *ios,
                               size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ios[i].dir = dir;
        ios[i].fd = -1;
        ios[i].status = KVF_OK;
        ios[i].reported = false;
        ios[i].msg[0] = '\0';
    }
    /* under NONE, and BATCH with syncfs (the batch's one syncfs makes the
     * data durable with the renames), nothing waits between write and
     * rename; otherwise each file is fsynced first, and under BLOCK the
     * directory after the renames */
    bool fsync_files =
        dir->fsync == KVF_FSYNC_BLOCK || (dir->fsync == KVF_FSYNC_BATCH && !dir->use_syncfs);
    if (!fsync_files) {
        kvf__fileio_run(fio, live_ops(ios, n, KVF_FIO_WRITE, write_op_start, write_op_done));
        return;
    }
    kvf__fileio_run(fio, live_ops(ios, n, KVF_FIO_WRITE, write_op_start, NULL));
    for (size_t i = 0; i < n; i++)
        if (ios[i].status == KVF_OK && ios[i].io.err)
            write_failed(dir, &ios[i], "write", ios[i].io.err);
    kvf__fileio_run(fio, live_ops(ios, n, KVF_FIO_FSYNC, NULL, NULL));
    size_t renamed = 0;
    for (size_t i = 0; i < n; i++) {
        kvf__blockfile_io *io = &ios[i];
        if (io->status != KVF_OK)
            continue;
        if (io->io.err)
            write_failed(dir, io, "fsync", io->io.err);
        else if (write_commit(dir, io))
            renamed++;
    }
    if (renamed && dir->fsync == KVF_FSYNC_BLOCK && sync_with(fsync, dir->dir_fd, dir->root) != 0) {
        /* the renames are durable before any of them is reported */
        int err = errno;
        for (size_t i = 0; i < n; i++)
            if (ios[i].status == KVF_OK)
                write_failed(dir, &ios[i], "fsync", err);
    }
    for (size_t i = 0; i < n; i++)
        io_finished(&ios[i]);
}

kvf_status kvf__blockfile_write(kvf__blockfile_dir *dir, const kvf__blockfile_meta *meta,
                                uint8_t *buf)
{
    if (!dir || !dir->root || !meta || !buf)
        return kvf__fail(KVF_ERR_INVALID, "block file write: NULL argument or directory not open");
    kvf__blockfile_io *io = malloc(sizeof *io);
    if (!io)
        return kvf__fail(KVF_ERR_NOMEM, "block 0x%llx: out of memory",
                         (unsigned long long)meta->key);
    io->meta = *meta;
    io->fill = NULL;
    io->on_done = NULL;
    io->img = NULL;
    io->img_arg = NULL;
    io->buf = buf;
    io->cap = meta->payload_bytes > SIZE_MAX - HDR ? SIZE_MAX : HDR + (size_t)meta->payload_bytes;
    kvf__blockfile_write_many(dir, dir->fio, io, 1);
    kvf_status st = io->status;
    free(io);
    return st;
}
/* The length rule: a file holds the header and payload exactly, or padded
 * with zeros to the next multiple of KVF_FILE_ALIGN (the O_DIRECT image).
 * A claim over BLOCK_PAYLOAD_MAX is refused whatever the file's size: a
 * sparse file can match any claim, and a reader sizes its buffer by it. */
static kvf_status check_file_size(uint64_t size, uint64_t payload, const char *what)
{
    if (payload > BLOCK_PAYLOAD_MAX)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: header claims %llu payload bytes, more than any block holds "
                         "(%llu)",
                         what, (unsigned long long)payload, (unsigned long long)BLOCK_PAYLOAD_MAX);
    uint64_t exact = HDR + payload;
    uint64_t padded = (exact + KVF_FILE_ALIGN - 1) & ~(uint64_t)(KVF_FILE_ALIGN - 1);
    if (size == exact || size == padded)
        return KVF_OK;
    return kvf__fail(KVF_ERR_CORRUPT, "%s: file of %llu bytes, header says %u + %llu (%s)", what,
                     (unsigned long long)size, HDR, (unsigned long long)payload,
                     size < exact ? "truncated" : "extended, or its padding cut");
}

/* The padding after the payload is zeros: any byte of the file changed is
 * caught, not only those the checksums cover. */
static kvf_status check_padding(const uint8_t *pad, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (pad[i] != 0)
            return kvf__fail(KVF_ERR_CORRUPT, "%s: padding byte %zu is 0x%02x, not 0", what, i,
                             pad[i]);
    return KVF_OK;
}

/* Closes a descriptor, reporting a failure unless one is already being
 * returned: a read-only descriptor has nothing to flush, but a failing
 * close still says the file system is in trouble. */
static kvf_status close_read_fd(int fd, kvf_status st, unsigned long long key, const char *path)
{
    char eb[128];
    /* Linux releases the descriptor even when close fails (EINTR too):
     * never retried */
    if (close(fd) != 0 && st == KVF_OK && errno != EINTR) {
        int err = errno;
        st = kvf__fail(kvf__errno_status(err), "block 0x%llx: %s: close: %s", key, path,
                       errstr(err, eb, sizeof eb));
    }
    return st;
}

/* Reads and checks the block under key_in into *buf_p (*cap_p bytes). With
 * `grow`, a buffer too small is reallocated to fit, once the header has been
 * checked (so a damaged length never sizes an allocation); without it, the
 * block not fitting is KVF_ERR_RANGE. any_layout: for fsck, which checks
 * files without knowing their layout. */
static kvf_status read_block(kvf__blockfile_dir *dir, uint64_t key_in, uint8_t **buf_p,
                             size_t *cap_p, bool grow, kvf__blockfile_meta *meta, bool any_layout)
{
    char eb[128];
    unsigned long long key = (unsigned long long)key_in;
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    snprintf(name, sizeof name, "%016llx.kvf", key);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);

    struct stat sb;
    mode_t foreign;
    bool direct = false;
    int fd = open_block(dir, name, path, &direct, &sb, &foreign);
    if (fd < 0) {
        int err = errno;
        if (foreign)
            return kvf__fail(KVF_ERR_CORRUPT,
                             "block 0x%llx: %s: %s, not a block file (foreign: left alone)", key,
                             path, file_kind(foreign));
        if (err == ENOENT)
            return kvf__fail(KVF_ERR_NOT_FOUND, "block 0x%llx: %s: not stored", key, path);
        return kvf__fail(kvf__errno_status(err), "block 0x%llx: %s: open: %s", key, path,
                         errstr(err, eb, sizeof eb));
    }

    kvf_status st;
    uint64_t size = (uint64_t)sb.st_size;
    if (size < HDR) {
        st = kvf__fail(KVF_ERR_CORRUPT,
                       "block 0x%llx: %s: truncated: %llu bytes, less than the %u-byte header", key,
                       path, (unsigned long long)size, HDR);
        goto out;
    }

    /* the header goes to the stack first: the caller's buffer is sized
     * only once the header has been checked */
    uint8_t h[HDR];
    size_t got;
    int r = read_full(fd, path, h, HDR, 0, &got);
    if (r < 0) {
        int err = errno;
        st = kvf__fail(kvf__errno_status(err), "block 0x%llx: %s: read: %s", key, path,
                       errstr(err, eb, sizeof eb));
        goto out;
    }
    if (r > 0) {
        st = kvf__fail(KVF_ERR_CORRUPT, "block 0x%llx: %s: truncated: short read, %zu of %u bytes",
                       key, path, got, HDR);
        goto out;
    }

    char what[PATH_MAX + 32];
    snprintf(what, sizeof what, "block 0x%llx: %s", key, path);
    kvf__block_header bh;
    st = kvf__block_header_parse(h, what, &bh);
    if (st == KVF_OK)
        st = kvf__block_header_expect(&bh, what, any_layout ? 0 : dir->fingerprint, dir->ns_hash,
                                      key_in);
    if (st != KVF_OK)
        goto out;
    uint64_t payload = bh.payload_bytes;
    st = check_file_size(size, payload, what);
    if (st != KVF_OK)
        goto out;
    /* payload <= st_size - HDR: HDR + payload fits an off_t, hence a size_t
     * on the 64-bit systems this runs on */
    if (payload > SIZE_MAX - HDR) {
        st = kvf__fail(KVF_ERR_RANGE, "block 0x%llx: %s: %llu bytes do not fit in memory", key,
                       path, (unsigned long long)size);
        goto out;
    }
    size_t need = HDR + (size_t)payload;
    if (need > *cap_p) {
        if (!grow) {
            st = kvf__fail(KVF_ERR_RANGE,
                           "block 0x%llx: %s: block of %zu bytes does not fit a %zu-byte buffer",
                           key, path, need, *cap_p);
            goto out;
        }
        uint8_t *nb = realloc(*buf_p, need);
        if (!nb) {
            st = kvf__fail(KVF_ERR_NOMEM, "block 0x%llx: %s: out of memory for %zu bytes", key,
                           path, need);
            goto out;
        }
        *buf_p = nb;
        *cap_p = need;
    }
    uint8_t *buf = *buf_p;
    memcpy(buf, h, HDR);

    r = read_full(fd, path, buf + HDR, (size_t)payload, HDR, &got);
    if (r < 0) {
        int err = errno;
        st = kvf__fail(kvf__errno_status(err), "block 0x%llx: %s: read: %s", key, path,
                       errstr(err, eb, sizeof eb));
        goto out;
    }
    if (r > 0) {
        /* the file shrank after fstat: never hand back the bytes not read */
        st = kvf__fail(KVF_ERR_CORRUPT,
                       "block 0x%llx: %s: truncated: short read, %llu of %llu bytes", key, path,
                       (unsigned long long)(HDR + got), (unsigned long long)size);
        goto out;
    }
    st = kvf__block_payload_check(&bh, what, buf + HDR);
    if (st != KVF_OK)
        goto out;
    if (size > HDR + payload) {
        uint8_t pad[KVF_FILE_ALIGN];
        size_t npad = (size_t)(size - HDR - payload);
        r = read_full(fd, path, pad, npad, HDR + payload, &got);
        if (r != 0) {
            int err = errno;
            st = r < 0
                     ? kvf__fail(kvf__errno_status(err), "%s: read: %s", what,
                                 errstr(err, eb, sizeof eb))
                     : kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: short read in the padding", what);
            goto out;
        }
        st = check_padding(pad, npad, what);
        if (st != KVF_OK)
            goto out;
    }

    st = KVF_OK;
    if (meta) {
        meta->key = key_in;
        meta->tokens = bh.tokens;
        meta->pools = bh.pools;
        meta->payload_bytes = payload;
    }

out:
    return close_read_fd(fd, st, key, path);
}

/* Opens one block's file and sets up the read of all of it. false when
 * there is nothing to read: failed (io->status) or left to read_block
 * (io->slow). */
static bool read_begin(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    char eb[128];
    unsigned long long key = (unsigned long long)io->meta.key;
    io->fd = -1;
    io->status = KVF_OK;
    io->reported = false;
    io->slow = false;
    io->msg[0] = '\0';
    snprintf(io->name, sizeof io->name, "%016llx.kvf", key);
    snprintf(io->path, sizeof io->path, "%s/%s", dir->root, io->name);
    bool direct = atomic_load_explicit(&dir->direct, memory_order_relaxed) &&
                  buf_aligned(io->buf) && io->cap >= KVF_FILE_ALIGN;
    struct stat sb;
    mode_t foreign;
    io->fd = open_block(dir, io->name, io->path, &direct, &sb, &foreign);
    if (io->fd < 0) {
        int err = errno;
        if (foreign)
            io_fail(io, KVF_ERR_CORRUPT,
                    "block 0x%llx: %s: %s, not a block file (foreign: left alone)", key, io->path,
                    file_kind(foreign));
        else if (err == ENOENT)
            io_fail(io, KVF_ERR_NOT_FOUND, "block 0x%llx: %s: not stored", key, io->path);
        else
            io_fail(io, kvf__errno_status(err), "block 0x%llx: %s: open: %s", key, io->path,
                    errstr(err, eb, sizeof eb));
        return false;
    }
    if (sb.st_size < (off_t)HDR || (uint64_t)sb.st_size > io->cap) {
        /* the careful reader says what is wrong, header first */
        close(io->fd);
        io->fd = -1;
        io->slow = true;
        return false;
    }
    io->size = (size_t)sb.st_size;
    size_t len = round_up_align(io->size);
    if (!direct || len > io->cap)
        len = io->size; /* unaligned: the engine drops O_DIRECT for it */
    io->io.fd = io->fd;
    io->io.buf = io->buf;
    io->io.len = len;
    io->io.need = io->size;
    io->io.off = 0;
    io->io.path = io->path;
    io->io.direct = direct;
    io->io.xfer = io->img ? io->img->xfer : NULL;
    io->io.xfer_arg = io->img_arg;
    return true;
}

/* Checks what read_begin's read brought in. */
static void read_end(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    char eb[128];
    unsigned long long key = (unsigned long long)io->meta.key;
    char what[PATH_MAX + 32];
    snprintf(what, sizeof what, "block 0x%llx: %s", key, io->path);
    kvf__block_header bh;
    kvf_status st = KVF_OK;
    if (io->io.err) {
        int err = io->io.err;
        io_fail(io, kvf__errno_status(err), "%s: read: %s", what, errstr(err, eb, sizeof eb));
        return;
    }
    if (io->io.done < io->size) {
        /* the file shrank after fstat: never hand back the bytes not read */
        io_fail(io, KVF_ERR_CORRUPT, "%s: truncated: short read, %zu of %zu bytes", what,
                io->io.done, io->size);
        return;
    }
    /* an image in device memory: header and padding (under 4096 bytes)
     * come to the host, the payload is checksummed where it is */
    uint8_t hb[HDR], pad[KVF_FILE_ALIGN];
    const uint8_t *hdr = io->buf;
    if (io->img) {
        st = io->img->get(io->img_arg, io->buf, hb, HDR);
        hdr = hb;
    }
    if (st == KVF_OK)
        st = kvf__block_header_parse(hdr, what, &bh);
    if (st == KVF_OK)
        st = kvf__block_header_expect(&bh, what, dir->fingerprint, dir->ns_hash, io->meta.key);
    if (st == KVF_OK)
        st = check_file_size(io->size, bh.payload_bytes, what);
    size_t npad = st == KVF_OK ? io->size - HDR - (size_t)bh.payload_bytes : 0;
    if (st == KVF_OK && !io->img) {
        st = kvf__block_payload_check(&bh, what, io->buf + HDR);
        if (st == KVF_OK)
            st = check_padding(io->buf + HDR + bh.payload_bytes, npad, what);
    } else if (st == KVF_OK) {
        uint32_t crc = 0;
        st = io->img->crc(io->img_arg, io->buf + HDR, (size_t)bh.payload_bytes, &crc);
        if (st == KVF_OK)
            st = kvf__block_payload_crc_check(&bh, what, crc);
        if (st == KVF_OK && npad)
            st = io->img->get(io->img_arg, io->buf + HDR + bh.payload_bytes, pad, npad);
        if (st == KVF_OK)
            st = check_padding(pad, npad, what);
    }
    if (st != KVF_OK) {
        io_fail(io, st, "%s", kvf_last_error());
        return;
    }
    io->meta.tokens = bh.tokens;
    io->meta.pools = bh.pools;
    io->meta.payload_bytes = bh.payload_bytes;
}

/* A read finished: checked, closed and reported while the batch's other
 * reads are still in flight. */
static void read_op_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = io_of(op);
    read_end(io->dir, io);
    kvf_status st = close_read_fd(io->fd, io->status, (unsigned long long)io->meta.key, io->path);
    io->fd = -1;
    if (st != io->status)
        io_fail(io, st, "%s", kvf_last_error());
    io_finished(io);
}

void kvf__blockfile_read_many(kvf__blockfile_dir *dir, kvf__fileio *fio, kvf__blockfile_io *ios,
                              size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ios[i].dir = dir;
        if (read_begin(dir, &ios[i]))
            continue;
        if (ios[i].slow) {
            /* the careful reader, for files too short or too large */
            kvf__blockfile_io *io = &ios[i];
            /* an image in device memory is read on the host first */
            uint8_t *buf = io->img ? malloc(io->cap) : io->buf;
            size_t cap = io->cap;
            kvf__blockfile_meta m;
            kvf_status st = buf ? read_block(dir, io->meta.key, &buf, &cap, false, &m, false)
                                : kvf__fail(KVF_ERR_NOMEM, "block 0x%llx: out of memory",
                                            (unsigned long long)io->meta.key);
            if (st == KVF_OK && io->img)
                st = io->img->put(io->img_arg, io->buf, buf, HDR + (size_t)m.payload_bytes);
            if (io->img)
                free(buf);
            if (st == KVF_OK)
                io->meta = m;
            else
                io_fail(io, st, "%s", kvf_last_error());
        }
        io_finished(&ios[i]);
        /* out of the list below */
        if (ios[i].status == KVF_OK)
            ios[i].status = KVF_INPROGRESS;
    }
    kvf__fileio_run(fio, live_ops(ios, n, KVF_FIO_READ, NULL, read_op_done));
    for (size_t i = 0; i < n; i++)
        if (ios[i].status == KVF_INPROGRESS)
            ios[i].status = KVF_OK;
}

kvf_status kvf__blockfile_read(kvf__blockfile_dir *dir, uint64_t key, uint8_t *buf, size_t cap,
                               kvf__blockfile_meta *meta)
{
    if (!dir || !dir->root || !buf)
        return kvf__fail(KVF_ERR_INVALID, "block file read: NULL argument or directory not open");
    kvf__blockfile_io *io = malloc(sizeof *io);
    if (!io)
        return kvf__fail(KVF_ERR_NOMEM, "block 0x%llx: out of memory", (unsigned long long)key);
    io->meta.key = key;
    io->on_done = NULL;
    io->img = NULL;
    io->img_arg = NULL;
    io->buf = buf;
    io->cap = cap;
    kvf__blockfile_read_many(dir, dir->fio, io, 1);
    kvf_status st = io->status;
    /* set only on success */
    if (st == KVF_OK && meta)
        *meta = io->meta;
    free(io);
    return st;
}

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
                         errstr(err, eb, sizeof eb));
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
                         errstr(err, eb, sizeof eb));
    }
    return KVF_OK;
}

kvf_status kvf__blockfile_scan(kvf__blockfile_dir *dir,
                               void (*visit)(void *arg, uint64_t key, kvf_status st,
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
        uint64_t key;
        if (strlen(n) == 16 + 4 && ends_with(n, ".kvf") && parse_hex16(n, &key)) {
            kvf__blockfile_meta meta;
            kvf_status st = read_block(dir, key, &buf, &cap, true, &meta, dir->fingerprint == 0);
            if (st == KVF_ERR_NOT_FOUND)
                continue; /* removed since readdir: nothing to check */
            visit(arg, key, st, st == KVF_OK ? "ok" : kvf_last_error());
        } else if (n[0] == '.' && ends_with(n, ".tmp") && strlen(n) > 18 && n[17] == '.' &&
                   parse_hex16(n + 1, &key)) {
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

void kvf__blockfile_remove_stale(kvf__blockfile_dir *dir)
{
    if (dir && dir->root)
        remove_stale_tmp(dir->dir_fd, dir->root);
}

/* ---- for the cache: removal and a fast listing ---------------------------- */

kvf_status kvf__blockfile_remove(kvf__blockfile_dir *dir, uint64_t key)
{
    char eb[128];
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block file remove: directory not open");
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    snprintf(name, sizeof name, "%016llx.kvf", (unsigned long long)key);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);
    /* nothing stored (ENOENT) is what removal wants: 0 */
    int err = unlink_block(dir, name, path);
    if (err == 0)
        return KVF_OK;
    return kvf__fail(kvf__errno_status(err), "block 0x%llx: %s: unlink: %s",
                     (unsigned long long)key, path, errstr(err, eb, sizeof eb));
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
    unsigned long foreign = 0;
    while ((ret = walk_next(dir, d, &n)) == KVF_OK && n) {
        uint64_t key;
        if (!(strlen(n) == 16 + 4 && ends_with(n, ".kvf") && parse_hex16(n, &key)))
            continue;
        char path[PATH_MAX], what[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/%s", dir->root, n);
        snprintf(what, sizeof what, "block 0x%llx: %s", (unsigned long long)key, path);
        struct stat sb;
        mode_t mode;
        bool direct = false;
        int bfd = open_block(dir, n, path, &direct, &sb, &mode);
        if (bfd < 0 && mode) {
            foreign++;
            KVF_LOG(KVF_LOG_WARN, "%s: %s, not a block file: foreign, skipped and left alone", what,
                    file_kind(mode));
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
                            errstr(err, eb, sizeof eb));
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
            check_file_size((uint64_t)sb.st_size, bh.payload_bytes, what) != KVF_OK) {
            KVF_LOG(KVF_LOG_INFO, "%s: not a usable block (%s), skipped", what,
                    ok ? kvf_last_error() : "unreadable");
            continue;
        }
        kvf__blockfile_meta meta = {key, bh.tokens, bh.pools, bh.payload_bytes};
        visit(arg, &meta, (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec);
    }
    closedir(d);
    if (foreign)
        KVF_LOG(KVF_LOG_WARN,
                "%s: %lu foreign file%s under block names (not regular files), left alone",
                dir->root, foreign, foreign == 1 ? "" : "s");
    if (ret == KVF_OK)
        kvf__clear_error();
    return ret;
}
