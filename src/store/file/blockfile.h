/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block files (blockfile*.c): one file per block key, holding the block's
 * bytes for every pool of the engine: a fixed header, then each pool's
 * region (the first `tokens` tokens, packed row after row). Written to a
 * temporary name and renamed, so a file under the final name is always
 * complete.
 */
#ifndef KVF_STORE_BLOCKFILE_H
#define KVF_STORE_BLOCKFILE_H

#include "blockhdr.h"
#include "fileio.h"

typedef struct kvf__blockfile_dir {
    char *root; /* <file_dir>/<namespace> */
    uint64_t ns_hash;
    uint64_t fingerprint;
    kvf_fsync fsync;
    int dir_fd;
    _Atomic bool direct;                  /* O_DIRECT; cleared once the file system refuses it */
    _Atomic bool exchange;                /* RENAME_EXCHANGE works here */
    bool use_syncfs;                      /* BATCH: one syncfs per batch, not an fsync per file */
    struct kvf__blockfile_spares *spares; /* replaced files, to write over */
    kvf__fileio_runner *fio;              /* what runs kvf__blockfile_write / _read; NULL: inline */
} kvf__blockfile_dir;

/* The header's view of a stored block. */
typedef struct kvf__blockfile_meta {
    kvf_key key;
    uint32_t tokens; /* tokens stored, 1..tokens_per_block */
    uint32_t pools;
    uint64_t payload_bytes; /* bytes after the header */
} kvf__blockfile_meta;

KVF_INTERNAL kvf_status kvf__blockfile_open_dir(const char *file_dir, const char *ns,
                                                uint64_t fingerprint, kvf_fsync fsync,
                                                kvf__blockfile_dir *dir);
KVF_INTERNAL void kvf__blockfile_close_dir(kvf__blockfile_dir *dir);
/* Removes the temporary files of writers whose process is gone (a crash
 * mid-write); a live process's files stay. fsck does not call it: it
 * reports them as torn instead. */
KVF_INTERNAL void kvf__blockfile_remove_stale(kvf__blockfile_dir *dir);

/* Writes the payload at buf + kvf__block_prefix_bytes(meta->pools) under
 * meta->key, split evenly among its pools; buf's first bytes are the
 * prefix's room, which the function fills (header and pool table), so the
 * file is written in one call. On failure
 * the key's file is removed: it holds no stale data. */
KVF_INTERNAL kvf_status kvf__blockfile_write(kvf__blockfile_dir *dir,
                                             const kvf__blockfile_meta *meta, uint8_t *buf);
/* Reads the block under `key` into buf (prefix + payload, `cap` bytes at
 * most), checks header, layout, namespace, length and checksum, and fills
 * *meta. */
KVF_INTERNAL kvf_status kvf__blockfile_read(kvf__blockfile_dir *dir, kvf_key key, uint8_t *buf,
                                            size_t cap, kvf__blockfile_meta *meta);

/* How the file layer reaches a block image that is not host memory
 * (device staging for GPUDirect Storage): it never dereferences buf then. */
typedef struct kvf__image_ops {
    /* the fileio op's xfer (arg: xfer_arg) */
    long long (*xfer)(kvf__fio_op *op, size_t len);
    /* n bytes at img to host dst */
    kvf_status (*get)(void *arg, const uint8_t *img, void *dst, size_t n);
    /* n host bytes from src to img; src NULL: n zeros */
    kvf_status (*put)(void *arg, uint8_t *img, const void *src, size_t n);
    /* kvf__crc32c(0, img, n) */
    kvf_status (*crc)(void *arg, const uint8_t *img, size_t n, uint32_t *crc_p);
} kvf__image_ops;

/* One block of a batch. The caller sets meta (for a read, meta.key only),
 * buf and cap; O_DIRECT needs buf aligned to KVF_FILE_ALIGN and, for a
 * write, cap >= round_up(prefix + payload) (the padding is written too):
 * the payload starts at buf + kvf__block_prefix_bytes(meta.pools). */
typedef struct kvf__blockfile_io {
    kvf__blockfile_meta meta;
    uint8_t *buf;
    size_t cap;
    kvf_status status;        /* the result */
    char msg[PATH_MAX + 160]; /* its detail when it failed */
    /* Optional: called once with the block's final result, on whichever
     * thread finished it, possibly while other blocks of the batch are
     * still in flight (so a read's bytes can be used at once). */
    void (*on_done)(struct kvf__blockfile_io *io);
    /* Optional, writes: fills buf's payload and meta just before the
     * block's write starts (so it overlaps the writes in flight), on the
     * thread that starts it; a failure fails the block without touching
     * the key's file (its caller then discards it, as for any failed
     * write: the file store's discard). */
    kvf_status (*fill)(struct kvf__blockfile_io *io);
    void *arg;
    /* Optional: buf is not host memory; these reach it (img_arg their
     * argument). NULL: buf is host memory. */
    const kvf__image_ops *img;
    void *img_arg;
    /* Optional, writes: each pool's bytes (meta.pools of them). NULL: the
     * payload split evenly (kvf__block_prefix_begin). */
    const uint32_t *pool_bytes;
    /* the file layer's */
    kvf__blockfile_dir *dir;
    int fd;
    bool slow, reported;
    size_t size;
    /* a read by groups (kvf__blockfile_read_groups): bytes read so far, the
     * whole read's length, the header, and the prefix on the host */
    size_t have, total, want;
    kvf__block_header bh;
    uint8_t *table;
    const struct kvf__blockfile_groups *groups;
    uint32_t next_group; /* the next group to hand over */
    char name[96], tmp[96];
    char path[PATH_MAX], tmp_path[PATH_MAX];
    kvf__fio_op io;
} kvf__blockfile_io;

/* Writes / reads many blocks, their system calls in flight together
 * through `fio` (NULL: one by one); as kvf__blockfile_write / _read for
 * each, with each block's own status and message. */
KVF_INTERNAL void kvf__blockfile_write_many(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                                            kvf__blockfile_io *ios, size_t n);
KVF_INTERNAL void kvf__blockfile_read_many(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                                           kvf__blockfile_io *ios, size_t n);
/* Reading pool group by pool group (blockfile_groups.c): groups of
 * consecutive pools, group g ending before pool end[g] (end[n - 1]: the
 * last pool, whatever the file's count), the first read taking
 * first_bytes of the file (prefix and group 0's pools as the caller
 * expects them). on_block is called once for every block and group, on
 * whichever thread read it, as soon as it is read and checked, possibly
 * beside calls for other blocks: a block whose status is KVF_OK has its
 * pools [end[g - 1], end[g]) in buf, checked; one that failed (now or in
 * an earlier group) is done. */
typedef struct kvf__blockfile_groups {
    uint32_t n;
    const uint32_t *end;
    size_t first_bytes;
    void (*on_block)(void *arg, kvf__blockfile_io *io, uint32_t g);
    void *arg;
} kvf__blockfile_groups;
/* Reads many blocks as kvf__blockfile_read_many does, but pool group by
 * pool group: every block's group g read, checked and reported (on_block)
 * before any block's group g + 1 is read. A block failed in one group is
 * failed for good. on_done comes for each block once every group is done. */
KVF_INTERNAL void kvf__blockfile_read_groups(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                                             kvf__blockfile_io *ios, size_t n,
                                             const kvf__blockfile_groups *gr);
/* Makes the writes since the last call durable, renames included: under
 * BATCH one syncfs() of the file system (or, with KVF_FSYNC_METHOD=fsync,
 * an fsync of the directory, the files having been fsynced as written);
 * otherwise an fsync of the directory. */
KVF_INTERNAL kvf_status kvf__blockfile_fsync_dir(kvf__blockfile_dir *dir);
/* Visits every stored block of the namespace, fully checked (header and
 * checksum; the layout only when dir->fingerprint is not 0), and every
 * leftover temporary file of an interrupted write (reported as torn). */
KVF_INTERNAL kvf_status kvf__blockfile_scan(kvf__blockfile_dir *dir,
                                            void (*visit)(void *arg, kvf_key key, kvf_status st,
                                                          const char *detail),
                                            void *arg);

/* Removes the block under `key`; a key with no file is KVF_OK. Hooked as
 * "unlink". */
KVF_INTERNAL kvf_status kvf__blockfile_remove(kvf__blockfile_dir *dir, kvf_key key);
/* After a failed write of `key`: removes its file; where the directory
 * refuses, cuts it to 0 bytes in place (*emptied_p true), so that no
 * reader, now or after a restart, takes it for the block. KVF_OK when the
 * file is gone (or was never there); else the unlink's failure, with a
 * message naming key and file and saying whether it remains empty or,
 * where emptying failed too, with its old bytes. */
KVF_INTERNAL kvf_status kvf__blockfile_discard(kvf__blockfile_dir *dir, kvf_key key,
                                               bool *emptied_p);
/* Visits every block of the namespace whose header checks (magic, CRC,
 * layout, namespace, key, length: not the payload) with its modification
 * time; others are skipped. */
KVF_INTERNAL kvf_status kvf__blockfile_list(
    kvf__blockfile_dir *dir,
    void (*visit)(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns), void *arg);

#endif /* KVF_STORE_BLOCKFILE_H */
