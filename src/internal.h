/*
 * Declarations shared between kvferry's source files. Nothing here is part
 * of the API: internal names carry a double underscore (kvf__).
 */
#ifndef KVF_INTERNAL_H
#define KVF_INTERNAL_H

#include "kvferry.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define KVF_INTERNAL __attribute__((visibility("hidden")))

/* ---- status and log (status.c, log.c) ---------------------------------- */

/* Records a failure's detail for kvf_last_error() and returns `status`, so
 * error paths read `return kvf__fail(KVF_ERR_RANGE, "pool %u: ...", p);`. */
KVF_INTERNAL kvf_status kvf__fail(kvf_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
KVF_INTERNAL void kvf__clear_error(void);
/* Maps an errno value to a status: ENOSPC/EDQUOT -> NO_SPACE, ENOMEM ->
 * NOMEM, EMFILE/ENFILE/EAGAIN/ENOBUFS -> RESOURCE, ENOENT -> NOT_FOUND,
 * anything else -> IO. */
KVF_INTERNAL kvf_status kvf__errno_status(int err);
/* Whether a failed read of a stored block is evidence against the block
 * itself (its checksum, header or layout, or its file missing, or the write
 * it depends on failed): only then may the block be dropped or its file
 * removed. A resource, I/O or device failure leaves the block where it is. */
KVF_INTERNAL bool kvf__status_condemns_block(kvf_status status);

/* Where a log line comes from: a KVF_LOG call site, whose repeated
 * warnings are rate-limited together (kvf_log_set_rate_limit). */
typedef struct kvf__log_site {
    uint64_t last_ns;    /* when its last line was written */
    uint32_t written;    /* lines written in its current burst */
    uint64_t suppressed; /* lines dropped since the last one written */
} kvf__log_site;

/* Level from KVF_LOG (kvferry.h), read once, or kvf_log_set_level's. */
KVF_INTERNAL bool kvf__log_enabled(kvf_log_level level);
/* Writes a line from `site` (NULL: not rate-limited). */
KVF_INTERNAL void kvf__log(kvf__log_site *site, kvf_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define KVF_LOG(level, ...)                                                                        \
    do {                                                                                           \
        static kvf__log_site kvf__log_site_;                                                       \
        if (kvf__log_enabled(level))                                                               \
            kvf__log(&kvf__log_site_, level, __VA_ARGS__);                                         \
    } while (0)

/* The setting environment variable `var` names (any case): its index in
 * names[0..n), or -1 when unset, empty or "auto" (and, with a warning
 * naming what it expected, when it names none of them). Engine settings
 * are checked by kvf_engine_create first (config.c), where a bad value
 * is an error. */
KVF_INTERNAL int kvf__env_choice(const char *var, const char *const *names, int n);

/* The event timeline (timeline.c): KVF_TIMELINE=FILE records when each step of a
 * batch happened; an engine's destroy appends the events to FILE. */
typedef enum kvf__tl_event {
    KVF_TL_SUBMIT,     /* a submit began: n moves */
    KVF_TL_CHECKED,    /* its moves were checked (and sorted) */
    KVF_TL_PART,       /* batch or part `id` of n moves was registered */
    KVF_TL_SUBMITTED,  /* the submit returned */
    KVF_TL_ISSUE,      /* batch `id` began to be handed to the backend (or a worker) */
    KVF_TL_ISSUED,     /* ... and was, in n calls */
    KVF_TL_COPIED,     /* the backend said a call of batch `id` ended */
    KVF_TL_COMPLETE,   /* batch `id` completed */
    KVF_TL_CHUNK,      /* a worker finished a chunk of n moves of batch `id` */
    KVF_TL_LOCKWAIT,   /* a thread waited n ns for the engine lock, at line `id` of engine.c */
    KVF_TL_GPU_QUEUED, /* the CUDA backend queued record `id` (queue << 56 | position): n copies */
    KVF_TL_GPU_ENDED,  /* ... and its watcher saw it end */
    KVF_TL_COUNT
} kvf__tl_event;
KVF_INTERNAL extern bool kvf__timeline_on;
KVF_INTERNAL void kvf__timeline_setup(void);
KVF_INTERNAL void kvf__timeline_record(kvf__tl_event ev, uint64_t id, uint64_t n);
KVF_INTERNAL void kvf__timeline_flush(void);
#define KVF_TIMELINE(ev, id, n)                                                                    \
    do {                                                                                           \
        if (kvf__timeline_on)                                                                      \
            kvf__timeline_record(ev, id, n);                                                       \
    } while (0)

/* Overflow-checked arithmetic on sizes. */
static inline bool kvf__mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline bool kvf__add_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

/* Monotonic clock, nanoseconds. */
static inline uint64_t kvf__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Little-endian integers in byte buffers (the stored header, hashes). */
static inline void kvf__put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t kvf__get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint32_t kvf__get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- layout (layout.c) ------------------------------------------------- */

/* Bytes of the region for `tokens` tokens (rows * row_bytes). */
static inline size_t kvf__region_bytes(const kvf_region *r)
{
    return r->rows * r->row_bytes;
}

/* A 64-bit fingerprint of a list of geometries: blocks written under one
 * layout are refused when read back under another. */
KVF_INTERNAL uint64_t kvf__geometry_fingerprint(const kvf_geometry *g, size_t n);

/* ---- checksums and hashing (crc32c.c) ----------------------------------- */

KVF_INTERNAL uint32_t kvf__crc32c(uint32_t crc, const void *data, size_t n);
/* kvf__crc32c(crc, data, n) from the raw register of the same n bytes run
 * from state 0 without conditioning (what the GPU kernel computes): the
 * CRC is linear in its state, so the start state is advanced over n zero
 * bytes and added. */
KVF_INTERNAL uint32_t kvf__crc32c_from_raw(uint32_t crc, uint64_t n, uint32_t raw);
/* XXH64 with seed 0 (keys.c). */
KVF_INTERNAL uint64_t kvf__xxh64(const void *data, size_t n);

/* ---- memory backends ----------------------------------------------------
 *
 * A backend says where bytes live and how they are copied. The engine asks
 * it for memory, for copies of strided regions, and for ordering with a
 * caller's stream. Copies are described as 2-D copies: `rows` runs of
 * `width` bytes, `spitch`/`dpitch` apart; a contiguous copy has rows = 1.
 */

typedef struct kvf__copy {
    void *dst;
    const void *src;
    size_t width;
    size_t rows;
    size_t dpitch;
    size_t spitch;
} kvf__copy;

typedef enum kvf__queue {
    KVF_QUEUE_OFFLOAD = 0,
    KVF_QUEUE_ONBOARD = 1,
    KVF_QUEUE_COUNT = 2
} kvf__queue;

typedef struct kvf__backend kvf__backend;

/* Called once when an asynchronous copy batch has finished, on a thread of
 * the backend's (CUDA: its completion watcher), which it should not hold
 * up for long; it must not call back into the backend. */
typedef void (*kvf__copy_done_fn)(void *arg, kvf_status status);

typedef struct kvf__backend_ops {
    const char *name;
    void (*destroy)(kvf__backend *b);

    /* Memory of `kind`, `bytes` long, zero-filled. */
    kvf_status (*mem_alloc)(kvf__backend *b, kvf_memory kind, size_t bytes, void **ptr_p);
    void (*mem_free)(kvf__backend *b, kvf_memory kind, void *ptr);
    /* Checks that caller memory is of `kind` and makes it usable for copies
     * (e.g. cudaHostRegister). *registered_p says whether mem_unregister
     * must undo something. */
    kvf_status (*mem_register)(kvf__backend *b, kvf_memory kind, void *ptr, size_t bytes,
                               bool *registered_p);
    void (*mem_unregister)(kvf__backend *b, kvf_memory kind, void *ptr);

    /* Copies synchronously on the calling thread; `queue` picks the
     * stream where the backend has streams. Used by the file tier to
     * gather a block into a host staging buffer and scatter it back. */
    kvf_status (*copy_sync)(kvf__backend *b, kvf__queue queue, const kvf__copy *copies, size_t n);

    /* Optional: queues copies and returns at once; `done` is called when
     * they have finished. A backend without it has the engine run
     * copy_sync on its worker threads, split across them. */
    kvf_status (*copy_async)(kvf__backend *b, kvf__queue queue, const kvf__copy *copies, size_t n,
                             kvf__copy_done_fn done, void *arg);

    /* Optional: makes `stream` wait for everything queued so far with
     * copy_async on every queue, without blocking the host. */
    kvf_status (*sync_stream)(kvf__backend *b, void *stream);
} kvf__backend_ops;

struct kvf__backend {
    const kvf__backend_ops *ops;
};

/* The host backend: plain or pinned host memory, memcpy. */
KVF_INTERNAL kvf_status kvf__host_backend_create(kvf__backend **backend_p);
/* Fault injection for tests: called before each host-backend copy; a status
 * other than KVF_OK fails that copy. It may also sleep, to widen races. */
typedef kvf_status (*kvf__copy_hook_fn)(const kvf__copy *copy);
KVF_INTERNAL void kvf__set_copy_hook(kvf__copy_hook_fn fn);
/* For tests: called by a submitter between the slices of a batch it
 * registers, with the engine lock dropped (see register_batch). */
typedef void (*kvf__register_hook_fn)(void);
KVF_INTERNAL void kvf__set_register_hook(kvf__register_hook_fn fn);
/* The host backend's copy (memcpy, hook included): also used for copies
 * between host buffers on any backend, e.g. secondary slots to staging. */
KVF_INTERNAL kvf_status kvf__host_copy(const kvf__copy *copies, size_t n);

/* The CUDA backend on cfg->device, copying as cfg->cuda_copy says. KVF_ERR_NO_DEVICE when the build
 * has no CUDA, no driver is loaded or the device is absent (kvf_last_error says which). */
KVF_INTERNAL kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg,
                                                 kvf__backend **backend_p);
/* Fills the CUDA fields of kvf_info; harmless without CUDA. */
KVF_INTERNAL void kvf__cuda_info(kvf_info *info);

/* ---- the stored form of a block (blockhdr.c) -----------------------------
 *
 * A 64-byte header (magic, version, layout fingerprint, namespace hash, key,
 * tokens, pools, payload length and CRC-32C, header CRC-32C), then the
 * payload. Written by the file tier and the remote tier alike.
 */

#define KVF_BLOCKFILE_HEADER_BYTES 64u

typedef struct kvf__block_header {
    uint64_t fingerprint; /* layout: kvf__geometry_fingerprint of the pools */
    uint64_t ns_hash;     /* kvf__ns_hash of the namespace */
    uint64_t key;
    uint32_t tokens, pools;
    uint64_t payload_bytes;
    uint32_t payload_crc; /* CRC-32C of the payload */
} kvf__block_header;

/* FNV-1a 64 of a namespace string. */
KVF_INTERNAL uint64_t kvf__ns_hash(const char *ns);
/* [A-Za-z0-9._-]{1,64}, and not "." or "..". */
KVF_INTERNAL bool kvf__ns_valid(const char *ns);
/* Writes the 64 header bytes of `h` (the header CRC computed here). */
KVF_INTERNAL void kvf__block_header_pack(const kvf__block_header *h, uint8_t *out);
/* Checks magic, version, header size and header CRC of 64 bytes and fills
 * *h. Failures are KVF_ERR_CORRUPT, the message starting with `what` (the
 * object: "block 0x2a: /path/to/file"). */
KVF_INTERNAL kvf_status kvf__block_header_parse(const uint8_t *in, const char *what,
                                                kvf__block_header *h);
/* The header is the one asked for: layout (unless fingerprint is 0),
 * namespace (KVF_ERR_MISMATCH) and key (KVF_ERR_CORRUPT). */
KVF_INTERNAL kvf_status kvf__block_header_expect(const kvf__block_header *h, const char *what,
                                                 uint64_t fingerprint, uint64_t ns_hash,
                                                 uint64_t key);
/* The payload (h->payload_bytes of it) matches the header's CRC. */
KVF_INTERNAL kvf_status kvf__block_payload_check(const kvf__block_header *h, const char *what,
                                                 const uint8_t *payload);
/* The same, with the payload's CRC computed elsewhere (on the GPU). */
KVF_INTERNAL kvf_status kvf__block_payload_crc_check(const kvf__block_header *h, const char *what,
                                                     uint32_t crc_now);

/* ---- file I/O engines (fileio.c) -----------------------------------------
 *
 * Many reads, writes and fsyncs in flight at once, each run to completion:
 * io_uring where built and allowed, else a pool of threads. Short transfers
 * are continued, EINTR is retried, and the fault hook below is called
 * before every call. A descriptor opened with O_DIRECT (op->direct) loses
 * it before a call that is not aligned to KVF_FILE_ALIGN.
 */

#define KVF_FILE_ALIGN 4096u
#define KVF_FILE_QUEUE_DEPTH_DEFAULT 32u

typedef enum kvf__fio_kind { KVF_FIO_READ = 0, KVF_FIO_WRITE = 1, KVF_FIO_FSYNC = 2 } kvf__fio_kind;

typedef struct kvf__fio_op {
    kvf__fio_kind kind;
    int fd;
    uint8_t *buf;
    size_t len;  /* bytes to move */
    size_t need; /* a read is complete once this many arrived (<= len) */
    uint64_t off;
    const char *path; /* for the fault hook */
    bool direct;      /* fd has O_DIRECT */
    /* results, set by kvf__fileio_run */
    size_t done; /* bytes moved */
    int err;     /* 0, or the errno of the failed call */
    bool eof;    /* a read reached the end of the file */
    bool synced;
    bool started;
    /* Optional: called once just before the op's first call, on the thread
     * that makes it, to fill in fd, buf, len...; false fails the op (err
     * set by it, else ECANCELED) without a call. */
    bool (*on_start)(struct kvf__fio_op *op);
    /* called once the op is finished, on whichever thread finished it,
     * while other ops may still be in flight; NULL: none */
    void (*on_done)(struct kvf__fio_op *op);
    /* Optional, reads and writes: makes each call itself instead of
     * pread/pwrite (cuFile on device memory): `len` bytes at buf + done,
     * file offset off + done; returns the bytes moved or -errno. An op
     * with it runs on the thread engine's threads (io_uring cannot). */
    long long (*xfer)(struct kvf__fio_op *op, size_t len);
    void *xfer_arg;
    /* the engine's */
    struct kvf__fio_op *next;
    size_t *left_p;
} kvf__fio_op;

typedef struct kvf__fileio kvf__fileio;

/* An engine of kind `want` (AUTO: io_uring, else threads, with one
 * warning), `depth` calls in flight (0: the default), `lanes` callers at
 * once without waiting for each other (one io_uring ring each). */
KVF_INTERNAL kvf_status kvf__fileio_create(kvf_file_engine want, uint32_t depth, uint32_t lanes,
                                           kvf__fileio **io_p);
KVF_INTERNAL void kvf__fileio_destroy(kvf__fileio *io);
/* URING or THREADS: what runs the calls. */
KVF_INTERNAL kvf_file_engine kvf__fileio_engine(const kvf__fileio *io);
KVF_INTERNAL uint32_t kvf__fileio_depth(const kvf__fileio *io);
/* Runs a list of ops (linked by `next`, NULL-terminated) to completion;
 * each gets its own result; `next` is the engine's until it returns, and
 * undefined after. Safe from several threads. io == NULL runs them one by
 * one on the calling thread. */
KVF_INTERNAL void kvf__fileio_run(kvf__fileio *io, kvf__fio_op *list);
/* The hook's verdict for one call (see kvf__set_io_fault). */
KVF_INTERNAL int kvf__io_fault(const char *op, const char *path, size_t *len_p);
/* Tests: make io_uring setup and O_DIRECT opens fail as a container or
 * tmpfs would (EPERM, EINVAL), to test the fallbacks anywhere. */
KVF_INTERNAL void kvf__fileio_test_refuse(bool uring, bool direct);
KVF_INTERNAL bool kvf__fileio_direct_refused(void);

/* ---- block files (blockfile.c) ------------------------------------------
 *
 * One file per block key, holding the block's bytes for every pool of the
 * engine: a fixed header, then each pool's region (the first `tokens`
 * tokens, packed row after row). Written to a temporary name and renamed,
 * so a file under the final name is always complete.
 */

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
    kvf__fileio *fio;                     /* what runs kvf__blockfile_write / _read; NULL: inline */
} kvf__blockfile_dir;

/* The header's view of a stored block. */
typedef struct kvf__blockfile_meta {
    uint64_t key;
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

/* Writes payload[0..meta->payload_bytes) under meta->key; `payload` is
 * preceded by KVF_BLOCKFILE_HEADER_BYTES writable bytes that the function
 * fills with the header, so the file is written in one call. On failure
 * the key's file is removed: it holds no stale data. */
KVF_INTERNAL kvf_status kvf__blockfile_write(kvf__blockfile_dir *dir,
                                             const kvf__blockfile_meta *meta, uint8_t *buf);
/* Reads the block under `key` into buf (header + payload, `cap` bytes at
 * most), checks header, layout, namespace, length and checksum, and fills
 * *meta. */
KVF_INTERNAL kvf_status kvf__blockfile_read(kvf__blockfile_dir *dir, uint64_t key, uint8_t *buf,
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
 * write, cap >= round_up(64 + payload) (the padding is written too). */
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
     * the key's file (the engine then removes it, as for any failed
     * write: drop_failed_files). */
    kvf_status (*fill)(struct kvf__blockfile_io *io);
    void *arg;
    /* Optional: buf is not host memory; these reach it (img_arg their
     * argument). NULL: buf is host memory. */
    const kvf__image_ops *img;
    void *img_arg;
    /* the file layer's */
    kvf__blockfile_dir *dir;
    int fd;
    bool slow, reported;
    size_t size;
    char name[80], tmp[80];
    char path[PATH_MAX], tmp_path[PATH_MAX];
    kvf__fio_op io;
} kvf__blockfile_io;

/* Writes / reads many blocks, their system calls in flight together
 * through `fio` (NULL: one by one); as kvf__blockfile_write / _read for
 * each, with each block's own status and message. */
KVF_INTERNAL void kvf__blockfile_write_many(kvf__blockfile_dir *dir, kvf__fileio *fio,
                                            kvf__blockfile_io *ios, size_t n);
KVF_INTERNAL void kvf__blockfile_read_many(kvf__blockfile_dir *dir, kvf__fileio *fio,
                                           kvf__blockfile_io *ios, size_t n);
/* Makes the writes since the last call durable, renames included: under
 * BATCH one syncfs() of the file system (or, with KVF_FSYNC_METHOD=fsync,
 * an fsync of the directory, the files having been fsynced as written);
 * otherwise an fsync of the directory. */
KVF_INTERNAL kvf_status kvf__blockfile_fsync_dir(kvf__blockfile_dir *dir);
/* Visits every stored block of the namespace, fully checked (header and
 * checksum; the layout only when dir->fingerprint is not 0), and every
 * leftover temporary file of an interrupted write (reported as torn). */
KVF_INTERNAL kvf_status kvf__blockfile_scan(kvf__blockfile_dir *dir,
                                            void (*visit)(void *arg, uint64_t key, kvf_status st,
                                                          const char *detail),
                                            void *arg);

/* Fault injection for tests: when set, the file layer calls it before each
 * open, read, write, fsync and rename system call, with op "open", "read",
 * "write", "fsync" or "rename" and the file's path. A non-zero return is
 * used as the errno of a failed call (EINTR is retried like a real one);
 * for "read" and "write", lowering *len_p makes the call that much shorter
 * (*len_p is 0 for the other ops). Not thread-safe to change while I/O runs. */
typedef int (*kvf__io_fault_fn)(const char *op, const char *path, size_t *len_p);
KVF_INTERNAL void kvf__set_io_fault(kvf__io_fault_fn fn);

/* ---- GPUDirect Storage (gds.c; gds_none.c in builds without CUDA) ---------
 *
 * libcufile is loaded with dlopen at the first use ($KVF_CUFILE_LIB, else
 * libcufile.so.0, else libcufile.so) and its driver opened once per
 * process while any engine uses it.
 */

/* What probing cuFile found, worst to best. */
typedef enum kvf__gds_found {
    KVF_GDS_ABSENT = 0,  /* no libcufile (or a build without CUDA) */
    KVF_GDS_REFUSED = 1, /* loaded, but its driver would not open */
    KVF_GDS_COMPAT = 2,  /* open, no P2P path: cuFile's compatibility mode
                            (POSIX I/O through its own bounce buffers) */
    KVF_GDS_P2P = 3      /* open, nvidia-fs loaded or P2P DMA offered */
} kvf__gds_found;

typedef struct kvf__gds_probe {
    kvf__gds_found found;
    char detail[160]; /* what was found, or why not */
} kvf__gds_probe;

/* The compat mode asked for: `c`, or env KVF_GDS_COMPAT=on|off|auto over AUTO. */
KVF_INTERNAL kvf_gds_compat kvf__gds_compat_of(kvf_gds_compat c);
/* Whether an engine whose probe found `probe` takes the GDS path for
 * file_io `io` (see kvf_gds_compat). When it does not, *why says why, for
 * the one warning file_io GDS gets (gds_mode.c). */
KVF_INTERNAL bool kvf__gds_choose(kvf_file_io io, kvf_gds_compat compat,
                                  const kvf__gds_probe *probe, char *why, size_t cap);
/* Loads cuFile and opens its driver (once per process), telling it first
 * whether its compatibility mode is allowed (OFF: no; ON: yes; AUTO: as
 * its configuration says). KVF_OK with a reference held (found COMPAT or
 * P2P) or an error (found ABSENT or REFUSED, detail saying why). */
KVF_INTERNAL kvf_status kvf__gds_acquire(kvf_gds_compat compat, kvf__gds_probe *probe);
/* Drops a reference; the last closes the driver. */
KVF_INTERNAL void kvf__gds_release(void);
/* Whether cuFile takes a file of directory `root` (a scratch file is
 * created, registered and removed): some file systems it refuses outright,
 * where every file would go through host memory. *why says why not. A
 * reference must be held. */
KVF_INTERNAL bool kvf__gds_dir_usable(const char *root, char *why, size_t cap);

/* Device staging for cuFile: `slots` images of slot_bytes (a multiple of
 * KVF_FILE_ALIGN) on `device`, 4096-aligned and registered with
 * cuFileBufRegister (used unregistered, said once, where that fails). */
typedef struct kvf__gds_buf kvf__gds_buf;
KVF_INTERNAL kvf_status kvf__gds_buf_create(int device, size_t slot_bytes, size_t slots,
                                            kvf__gds_buf **buf_p);
KVF_INTERNAL void kvf__gds_buf_destroy(kvf__gds_buf *buf);
KVF_INTERNAL uint8_t *kvf__gds_buf_slot(kvf__gds_buf *buf, size_t i);
KVF_INTERNAL size_t kvf__gds_buf_slots(const kvf__gds_buf *buf);
/* The image ops for a buffer's slots (arg: the kvf__gds_buf); NULL in a
 * build without CUDA. */
KVF_INTERNAL const kvf__image_ops *kvf__gds_image_ops(void);

/* ---- what the cache needs of the engine and the files -------------------- */

/* Fixes the engine's pools (as its first transfer would) so that its slot
 * counts are known; KVF_ERR_STATE without pools. */
KVF_INTERNAL kvf_status kvf__engine_freeze(kvf_engine *e);
/* A batch that moves nothing and completes once every write queued before
 * it into primary slots[0..n) has landed; a move whose write failed
 * completes with KVF_ERR_LOST. Orders a caller after copies it did not
 * queue itself. */
KVF_INTERNAL kvf_status kvf__engine_fence(kvf_engine *e, const uint32_t *slots, size_t n,
                                          kvf_ticket *ticket_p);
/* kvf_offload to `to` (or kvf_copy when `copy`) whose reads of primary
 * slots heed a failed earlier write into them (KVF_ERR_LOST), as reads of
 * secondary slots and files always do: for slots the cache owns, which no
 * caller writes behind the engine's back. */
KVF_INTERNAL kvf_status kvf__engine_move_checked(kvf_engine *e, kvf_tier to, bool copy,
                                                 const kvf_move *moves, size_t n,
                                                 kvf_ticket *ticket_p);
/* One failed move's message (kvf_move_error), kept until its ticket
 * retires; a list of them is in index order once the batch completes. */
typedef struct kvf__move_error {
    struct kvf__move_error *next;
    size_t index;
    kvf_status status;
    char message[]; /* NUL-terminated, shorter than KVF_MOVE_ERROR_MESSAGE */
} kvf__move_error;
/* A record of `message` cut to KVF_MOVE_ERROR_MESSAGE - 1 bytes; NULL when
 * out of memory. */
KVF_INTERNAL kvf__move_error *kvf__move_error_new(size_t index, kvf_status status,
                                                  const char *message);
KVF_INTERNAL void kvf__move_errors_free(kvf__move_error *list);
/* A list as a completed batch's (or cache call's) n statuses give it: in
 * index order, one record per failed status (duplicates freed, and for a
 * failure without one, "<what> <index>: <status text>"), statuses as
 * status[] says. Consumes `list`; NULL when nothing failed (or out of
 * memory: the statuses still say what failed). */
KVF_INTERNAL kvf__move_error *kvf__move_errors_sorted(kvf__move_error *list,
                                                      const kvf_status *status, size_t n,
                                                      const char *what);
/* Hands a retired ticket's list to the caller of a *_errors call: its
 * first `cap` records into out[], how many it holds into *n_p (may be
 * NULL); frees the list. */
KVF_INTERNAL void kvf__move_errors_deliver(kvf__move_error *list, kvf_move_error *out, size_t cap,
                                           size_t *n_p);
/* As kvf_wait (block) or kvf_poll, handing over the failed moves' records
 * (a record for every failed move, in index order; the caller frees them):
 * for the cache, which renumbers them into its calls' blocks. */
KVF_INTERNAL kvf_status kvf__engine_ticket_errors(kvf_engine *e, kvf_ticket t, bool block,
                                                  kvf_status *per_move, kvf__move_error **errors_p);
/* Forgets failed writes into primary slots: the cache hands them to a
 * caller who writes them whole. */
KVF_INTERNAL void kvf__engine_clear_poison(kvf_engine *e, const uint32_t *slots, size_t n);
/* Slots valid in every pool at `level` (0 before freezing, or without
 * secondary slots in every pool). */
KVF_INTERNAL uint32_t kvf__engine_slots(const kvf_engine *e, kvf_level level);
/* Bytes of one block of every pool. */
KVF_INTERNAL size_t kvf__engine_block_bytes(const kvf_engine *e);
/* Whether moves between the engine's primary slots and files go through
 * cuFile (the GDS path). */
KVF_INTERNAL bool kvf__engine_gds(const kvf_engine *e);
/* The engine's block directory, or NULL without a file tier. */
KVF_INTERNAL kvf__blockfile_dir *kvf__engine_dir(kvf_engine *e);
/* Whether the engine has a remote tier configured, and its connection
 * (made on first use; an error while it cannot be made). */
struct kvf__remote;
KVF_INTERNAL bool kvf__engine_has_remote(const kvf_engine *e);
KVF_INTERNAL kvf_status kvf__engine_remote(kvf_engine *e, struct kvf__remote **remote_p);

/* Removes the block under `key`; a key with no file is KVF_OK. Hooked as
 * "unlink". */
KVF_INTERNAL kvf_status kvf__blockfile_remove(kvf__blockfile_dir *dir, uint64_t key);
/* After a failed write of `key`: removes its file; where the directory
 * refuses, cuts it to 0 bytes in place (*emptied_p true), so that no
 * reader, now or after a restart, takes it for the block. KVF_OK when the
 * file is gone (or was never there); else the unlink's failure, with a
 * message naming key and file and saying whether it remains empty or,
 * where emptying failed too, with its old bytes. */
KVF_INTERNAL kvf_status kvf__blockfile_discard(kvf__blockfile_dir *dir, uint64_t key,
                                               bool *emptied_p);
/* Visits every block of the namespace whose header checks (magic, CRC,
 * layout, namespace, key, length: not the payload) with its modification
 * time; others are skipped. */
KVF_INTERNAL kvf_status kvf__blockfile_list(
    kvf__blockfile_dir *dir,
    void (*visit)(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns), void *arg);

#endif /* KVF_INTERNAL_H */
