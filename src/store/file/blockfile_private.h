/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the block-file sources (blockfile*.c) share and the layers above do
 * not see: the limits of the format, the hooked system calls, the names,
 * the spare files and the plumbing of a batch. blockfile.h is the
 * interface; this header is for src/store/file/ only.
 */
#ifndef KVF_STORE_BLOCKFILE_PRIVATE_H
#define KVF_STORE_BLOCKFILE_PRIVATE_H

#include "blockfile.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define HDR KVF_BLOCK_HEADER_BYTES
/* Room for "/.<32>.<pid>.<seq>.tmp" after the root in a path buffer. */
#define NAME_MAX_BYTES 96
/* hex digits of a key in a block file's name; format version 1's */
#define KEY_DIGITS 32
#define OLD_KEY_DIGITS 16
/* The largest payload written or read: far above a KV block of any model
 * (megabytes), far below what a reader can allocate on the word of one
 * header it has not yet checked beyond its own checksum. */
#define BLOCK_PAYLOAD_MAX ((uint64_t)1 << 30)

static inline size_t round_up_align(size_t n)
{
    return (n + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
}

static inline bool buf_aligned(const void *p)
{
    return ((uintptr_t)p & (KVF_FILE_ALIGN - 1)) == 0;
}

/* ---- system calls (blockfile_sys.c) ----------------------------------------- */

/* strerror_r, whichever the C library has. */
KVF_INTERNAL const char *kvf__bf_errstr(int err, char *buf, size_t cap);
/* A write that fails for a missing directory is an I/O failure of the
 * tier, not a missing block. */
KVF_INTERNAL kvf_status kvf__bf_write_errno_status(int err);
/* fsync (or syncfs: `sync`) with the hook before it, as "fsync"; EINTR,
 * real or injected, is retried. 0, or -1 with errno set. */
KVF_INTERNAL int kvf__bf_sync_with(int (*sync)(int), int fd, const char *path);
/* What a file that is not a regular file is, for messages. */
KVF_INTERNAL const char *kvf__bf_file_kind(mode_t mode);
/* Whether `name` exists and is something other than a regular file (its
 * mode in *mode_p): a FIFO, directory, link... that kvferry never wrote. */
KVF_INTERNAL bool kvf__bf_is_foreign(int dir_fd, const char *name, mode_t *mode_p);
/* Opens `name`, with O_DIRECT when *direct_p (cleared where the file
 * system refuses it). */
KVF_INTERNAL int kvf__bf_open_file(kvf__blockfile_dir *dir, const char *name, const char *path,
                                   int flags, bool *direct_p);
/* Opens an existing block file for reading without ever blocking; *mode_p
 * is the mode of a foreign file, else 0. */
KVF_INTERNAL int kvf__bf_open_block(kvf__blockfile_dir *dir, const char *name, const char *path,
                                    bool *direct_p, struct stat *sb, mode_t *mode_p);

/* ---- names and lengths (blockfile_names.c) --------------------------------- */

/* <key>.kvf, the name of the block file of `key`, into buf. */
KVF_INTERNAL void kvf__bf_block_file_name(kvf_key key, char *buf, size_t cap);
/* Whether n is a block file's name, <32 hex>.kvf; its key. */
KVF_INTERNAL bool kvf__bf_block_name(const char *n, kvf_key *key_p);
/* Whether n is a format-version-1 block file's name, <16 hex>.kvf; its key. */
KVF_INTERNAL bool kvf__bf_old_block_name(const char *n, uint64_t *key_p);
/* Whether n is a write's temporary file, .<32 hex>.<pid>.<sequence>.tmp;
 * the key it was for. */
KVF_INTERNAL bool kvf__bf_torn_name(const char *n, kvf_key *key_p);
KVF_INTERNAL bool kvf__bf_ends_with(const char *s, const char *suffix);
/* ".<32 hex>.<pid>.<sequence>.tmp" (or ".spare"; or 16 hex, version 1's): its pid. */
KVF_INTERNAL bool kvf__bf_parse_tmp_name(const char *n, pid_t *pid_p);
/* The length rule: KVF_OK when a file of `size` bytes can hold a block
 * whose header (of `hdr` bytes: HDR, or version 1's) claims `payload`
 * bytes. */
KVF_INTERNAL kvf_status kvf__bf_check_file_size(uint64_t size, uint32_t hdr, uint64_t payload,
                                                const char *what);
/* The padding after a payload, n bytes, is zeros. */
KVF_INTERNAL kvf_status kvf__bf_check_padding(const uint8_t *pad, size_t n, const char *what);

/* ---- spare files (blockfile_spare.c) ----------------------------------------- */

/* The spare list of an opened directory (dir->spares, NULL when out of
 * memory: no spares then), and its end: the spares' files removed. */
KVF_INTERNAL void kvf__bf_spares_create(kvf__blockfile_dir *dir);
KVF_INTERNAL void kvf__bf_spares_destroy(kvf__blockfile_dir *dir);
/* Moves the temporary file `from` to the final name `to` atomically; a
 * file it replaces becomes a spare. 0, or -1 with errno set. */
KVF_INTERNAL int kvf__bf_rename_in(kvf__blockfile_dir *dir, const char *from, const char *to,
                                   const char *to_path);
/* A spare file to write over, cut to `len`, under io->tmp; -1 if none. */
KVF_INTERNAL int kvf__bf_open_spare(kvf__blockfile_dir *dir, kvf__blockfile_io *io, size_t len,
                                    bool *direct_p);

/* ---- removal (blockfile_remove.c) -------------------------------------------- */

/* Makes sure no version of a block is left readable after a failed write
 * (removed, else emptied in place: *emptied_p). */
KVF_INTERNAL kvf_status kvf__bf_discard_block(kvf__blockfile_dir *dir, kvf_key key,
                                              const char *name, const char *path, bool *emptied_p);

/* ---- batches (blockfile_batch.c) --------------------------------------------- */

/* Records a failure of one block's I/O, in the block and as the thread's
 * last error. */
KVF_INTERNAL void __attribute__((format(printf, 3, 4)))
kvf__bf_io_fail(kvf__blockfile_io *io, kvf_status st, const char *fmt, ...);
KVF_INTERNAL kvf__blockfile_io *kvf__bf_io_of(kvf__fio_op *op);
/* Reports one block's final result to the caller, once. */
KVF_INTERNAL void kvf__bf_io_finished(kvf__blockfile_io *io);
/* Links the fileio ops of the blocks still going, of `kind`; NULL if none. */
KVF_INTERNAL kvf__fio_op *kvf__bf_live_ops(kvf__blockfile_io *ios, size_t n, kvf__fio_kind kind,
                                           bool (*on_start)(kvf__fio_op *op),
                                           void (*on_done)(kvf__fio_op *op));

/* ---- reading (blockfile_read.c) ---------------------------------------------- */

/* Reads and checks the block under key_in into *buf_p (*cap_p bytes),
 * growing the buffer when `grow`; any_layout: the layout is not checked. */
/* Checks a read image of io (its prefix at io->buf, io->size bytes of
 * file, header *bh parsed and expected): the pool table when first is 0,
 * pools [first, last), and the padding when last is the last pool. Pools
 * in device memory (io->img) are checksummed there. table: the prefix on
 * the host, or NULL (at io->buf, or fetched from a device image). */
KVF_INTERNAL kvf_status kvf__bf_image_check(const kvf__blockfile_io *io,
                                            const kvf__block_header *bh, const uint8_t *table,
                                            uint32_t first, uint32_t last, const char *what);
/* Opens one block's file and sets up the read of all of it (io->io, for
 * a runner). false when there is nothing to read: failed (io->status) or
 * left to the careful reader (io->slow: kvf__bf_read_slow). */
KVF_INTERNAL bool kvf__bf_read_begin(kvf__blockfile_dir *dir, kvf__blockfile_io *io);
/* Reads io's block whole with the careful reader (a file too short or
 * too large for the fast one): io->status and io->meta. */
KVF_INTERNAL void kvf__bf_read_slow(kvf__blockfile_dir *dir, kvf__blockfile_io *io);
/* Closes a read's descriptor; a failing close fails a read that had not
 * failed (st), naming key and path. */
KVF_INTERNAL kvf_status kvf__bf_close_read_fd(int fd, kvf_status st, const char *key,
                                              const char *path);
KVF_INTERNAL kvf_status kvf__bf_read_block(kvf__blockfile_dir *dir, kvf_key key, uint8_t **buf_p,
                                           size_t *cap_p, bool grow, kvf__blockfile_meta *meta,
                                           bool any_layout);

#endif /* KVF_STORE_BLOCKFILE_PRIVATE_H */
