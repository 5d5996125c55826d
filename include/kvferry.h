/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry: moves the blocks of a paged LLM KV cache between GPU memory, host
 * memory and files.
 *
 * The model, in one paragraph. An engine owns one or more pools. A pool
 * describes one tensor of the inference engine's KV cache: its block
 * geometry (kvf_geometry), a primary array of block slots (GPU memory with
 * the CUDA backend, host memory with the host backend) and optionally a
 * secondary array in host memory. A *block* is slot i of every pool, so one
 * move carries the same slot of every pool at once. Offload copies blocks
 * down (primary slot -> secondary slot or file), onboard copies them back up.
 * Moves are submitted in batches; each batch gets a ticket, completes
 * asynchronously and reports a status for every move. kvferry orders moves
 * that touch the same slot or file (read after write, write after read,
 * write after write), so callers never see half-moved data. A write into a
 * slot that an earlier batch still reads waits for that batch's copy of
 * the slot only, not for the rest of the batch: an onboard into a GPU slot
 * being evicted starts once the slot's bytes have left.
 *
 * Conventions used throughout:
 *  - Every function returns kvf_status; KVF_OK is 0, errors are negative.
 *    kvf_last_error() gives the detail of the last failure on the calling
 *    thread (which pool, slot, block or file, which system call).
 *  - Output pointers come last and are written only on success.
 *  - Config structs carry their size in their first field; always start
 *    from the matching *_INIT macro so a newer library can grow them.
 *  - destroy functions accept NULL.
 *  - Thread safety: all kvf_engine functions may be called from several
 *    threads at once, except kvf_engine_destroy, which must be the last call.
 */
#ifndef KVFERRY_H
#define KVFERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVF_BUILDING_LIBRARY) && defined(__GNUC__)
#define KVF_API __attribute__((visibility("default")))
#else
#define KVF_API
#endif

#define KVF_VERSION_MAJOR 0
#define KVF_VERSION_MINOR 1
#define KVF_VERSION_PATCH 0
#define KVF_VERSION_STRING "0.1.0"

/** The library's version string, e.g. "0.1.0 (cuda)". */
KVF_API const char *kvf_version(void);

/* ------------------------------------------------------------------------ */
/* Status                                                                   */
/* ------------------------------------------------------------------------ */

/**
 * One status type for every call and every move. Errors are grouped by
 * where they come from; the value ranges are stable.
 */
typedef enum kvf_status {
    KVF_OK = 0,
    KVF_INPROGRESS = 1, /* kvf_poll: the batch has not completed yet */

    /* the caller's arguments or the order of calls */
    KVF_ERR_INVALID = -1,     /* a NULL, a zero or a contradictory field */
    KVF_ERR_RANGE = -2,       /* slot, pool, token count or size out of range */
    KVF_ERR_UNSUPPORTED = -3, /* valid, but this build or backend cannot do it */
    KVF_ERR_STATE = -4,       /* not now: e.g. a pool added after transfers */
    /* a ticket never issued, or already retired: waited or polled to
     * completion, by this thread or by another one racing it. Never a
     * move's status, so a waiter told it knows the result went elsewhere */
    KVF_ERR_UNKNOWN_TICKET = -5,

    /* memory and the process's other resources */
    KVF_ERR_NOMEM = -10,
    /* The process is out of a resource (file descriptors: EMFILE, ENFILE;
     * threads or buffers: EAGAIN, ENOBUFS). Says nothing about the block:
     * a stored block whose read failed so stays stored and cached, and a
     * later read, once the resource is free again, can succeed. The file
     * workers retry such a move once, after a short wait, then report it:
     * recompute the block now (the stored copy stays for later). */
    KVF_ERR_RESOURCE = -11,

    /* devices */
    KVF_ERR_NO_DEVICE = -20, /* no GPU, no driver, or a build without CUDA */
    KVF_ERR_DEVICE = -21,    /* a CUDA call failed */

    /* files */
    KVF_ERR_IO = -30,        /* a system call on a file failed (EIO, ...) */
    KVF_ERR_NOT_FOUND = -31, /* no stored block under that key or slot */
    KVF_ERR_NO_SPACE = -32,  /* ENOSPC or EDQUOT */

    /* remote stores */
    KVF_ERR_REMOTE = -40,  /* a remote store refused, failed or cannot be reached */
    KVF_ERR_TIMEOUT = -41, /* a remote store did not answer in time */

    /* data integrity: kvferry refuses to hand back these bytes */
    /* a stored block fails its header or checksum; a file is read again
     * (up to three times) before this is given, as another process
     * rewriting the namespace can leave a read half of a rewrite */
    KVF_ERR_CORRUPT = -50,
    KVF_ERR_MISMATCH = -51, /* a stored block has another layout or namespace */
    KVF_ERR_LOST = -52      /* the move this one depends on failed, or the
                               file key's last write (see kvf_offload) */
} kvf_status;

/** A short, constant English description of a status; never NULL. */
KVF_API const char *kvf_status_str(kvf_status status);

/**
 * Detail of the most recent failure on the calling thread, such as
 * "pool 1: slot 70 out of range (64 slots)" or
 * "block 0x2a: /data/kv/ns/000000000000002a.kvf: short read, 10 of 4160 bytes".
 * Never NULL; "" when nothing failed yet. Valid until the next kvferry call
 * on this thread. Per-move failures of a batch are reported by their status
 * and logged; kvf_wait_errors gives each one's text, and a failed kvf_wait
 * leaves the first one's here.
 */
KVF_API const char *kvf_last_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

/**
 * How much kvferry logs: a line of level L is written when L is not above
 * the current level (KVF_LOG_OFF: nothing). The default comes from
 * KVF_LOG=off|error|warn|info|debug|trace (any case; unset: warn; another
 * value: warn, and one warning naming the valid ones).
 */
typedef enum kvf_log_level {
    KVF_LOG_OFF = 0,
    KVF_LOG_ERROR = 1,
    KVF_LOG_WARN = 2,
    KVF_LOG_INFO = 3,
    KVF_LOG_DEBUG = 4,
    KVF_LOG_TRACE = 5 /* every round trip; very verbose */
} kvf_log_level;

/**
 * Receives each log line instead of stderr (or KVF_LOG_FILE).
 * @param level the line's level, never KVF_LOG_OFF.
 * @param line the message, without a level prefix or newline, e.g.
 *        "redis 10.0.0.1:6379: reply: not complete in time"; valid only
 *        during the call.
 * Calls come from whichever thread logs, kvferry's worker threads
 * included, but never two at once (they are serialized), so a handler
 * needs no lock of its own. It should return quickly: the thread that
 * logs waits for it. It may call kvferry (a line logged meanwhile on the
 * same thread reaches it re-entrantly).
 */
typedef void (*kvf_log_fn)(void *user, kvf_log_level level, const char *line);

/**
 * Sends the log to `fn(user, ...)`; NULL restores the default sink
 * (KVF_LOG_FILE=PATH, where %h in PATH becomes the host name and %p the
 * process id, appended to; stderr when unset or when the file cannot be
 * opened, with a warning). Thread-safe: once it returns, the previous
 * handler is not called again.
 */
KVF_API void kvf_log_set_handler(kvf_log_fn fn, void *user);

/** Sets the level for the whole process, overriding KVF_LOG. Thread-safe.
 *  @return KVF_OK, or KVF_ERR_INVALID (level unchanged) for a value that is
 *  not a kvf_log_level. */
KVF_API kvf_status kvf_log_set_level(kvf_log_level level);

/** The current level. Thread-safe. */
KVF_API kvf_log_level kvf_log_get_level(void);

/**
 * Limits repeated errors and warnings: from each place in kvferry that
 * logs them, the first `burst` lines are written, then at most one per
 * `interval_ms`, carrying "(N similar suppressed)" for the lines dropped
 * since the last one written. A place quiet for a whole interval gets a
 * new burst. Defaults: 5 lines, then one per 10000 ms. burst == 0 turns
 * the limit off (every line is written). Info, debug and trace lines are
 * never limited. Thread-safe.
 */
KVF_API void kvf_log_set_rate_limit(uint32_t burst, uint32_t interval_ms);

/* ------------------------------------------------------------------------ */
/* Block geometry                                                           */
/* ------------------------------------------------------------------------ */

/** Element types of a KV cache. 4-bit types pack two elements per byte. */
typedef enum kvf_dtype {
    KVF_DTYPE_FP32 = 0,
    KVF_DTYPE_FP16,
    KVF_DTYPE_BF16,
    KVF_DTYPE_FP8_E4M3,
    KVF_DTYPE_FP8_E5M2,
    KVF_DTYPE_INT8,
    KVF_DTYPE_INT4,
    KVF_DTYPE_FP4, /* e2m1 */
    KVF_DTYPE_COUNT
} kvf_dtype;

/** Bits of one element; 0 for an unknown type. */
KVF_API unsigned kvf_dtype_bits(kvf_dtype dtype);
/** The type's name ("fp16", "int4", ...); "?" for an unknown type. */
KVF_API const char *kvf_dtype_name(kvf_dtype dtype);
/** Parses a name given by kvf_dtype_name(). */
KVF_API kvf_status kvf_dtype_parse(const char *name, kvf_dtype *dtype_p);

/**
 * Order of the dimensions inside one block.
 *
 * HEAD_MAJOR  [layers][kv_factor][kv_heads][tokens][head_size]:
 *             TensorRT-LLM's block-major pools.
 * TOKEN_MAJOR [layers][kv_factor][tokens][kv_heads][head_size]: what engines
 *             with one tensor per layer and K/V use ([blocks][tokens][heads]
 *             [head_size]); register each such tensor as one pool with
 *             layers = 1 and kv_factor = 1.
 */
typedef enum kvf_token_order {
    KVF_ORDER_HEAD_MAJOR = 0,
    KVF_ORDER_TOKEN_MAJOR = 1
} kvf_token_order;

/** The shape of one block of one pool. */
typedef struct kvf_geometry {
    uint32_t layers;
    uint32_t kv_factor; /* 2: K and V; 1: K only (or one of them) */
    uint32_t kv_heads;
    uint32_t tokens_per_block;
    uint32_t head_size; /* elements */
    kvf_dtype dtype;
    kvf_token_order order;
} kvf_geometry;

/**
 * Where the first N tokens of a block lie: `rows` runs of `row_bytes` bytes,
 * the first at byte 0 of the block, each `pitch` bytes after the previous.
 * A whole block is one row of block_bytes.
 */
typedef struct kvf_region {
    size_t rows;
    size_t row_bytes;
    size_t pitch;
} kvf_region;

/**
 * Checks a geometry: every count non-zero, kv_factor 1 or 2, a known type,
 * a block of whole bytes, no overflow.
 * @return KVF_OK, or KVF_ERR_INVALID / KVF_ERR_RANGE with kvf_last_error().
 */
KVF_API kvf_status kvf_geometry_check(const kvf_geometry *g);

/** Bytes of one block. */
KVF_API kvf_status kvf_geometry_block_bytes(const kvf_geometry *g, size_t *bytes_p);

/**
 * The strided region that holds a block's first `tokens` tokens.
 * tokens == 0 or tokens >= tokens_per_block gives the whole block as one row.
 * A 4-bit type needs each row to start and end on a byte: KVF_ERR_UNSUPPORTED
 * when `tokens` tokens of one row are an odd number of elements (or, in
 * TOKEN_MAJOR order, the tokens of one row are).
 */
KVF_API kvf_status kvf_geometry_region(const kvf_geometry *g, uint32_t tokens,
                                       kvf_region *region_p);

/* ------------------------------------------------------------------------ */
/* Engine                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct kvf_engine kvf_engine;

/** Where block bytes are moved by. */
typedef enum kvf_backend {
    KVF_BACKEND_AUTO = 0, /* CUDA when a GPU is usable, host otherwise */
    KVF_BACKEND_HOST = 1, /* host memory only, copies on worker threads */
    KVF_BACKEND_CUDA = 2  /* device primary pools, pinned host secondary */
} kvf_backend;

/** Name of a backend ("auto", "host", "cuda"). */
KVF_API const char *kvf_backend_name(kvf_backend backend);

/** How the file tier reads and writes. */
typedef enum kvf_file_io {
    KVF_FILE_IO_AUTO = 0,  /* GDS where cuFile has a P2P path (or file.gds_compat
                              ON), POSIX otherwise, silently */
    KVF_FILE_IO_POSIX = 1, /* pread/pwrite through a host staging buffer:
                              TensorRT-LLM's forced-POSIX mode */
    KVF_FILE_IO_GDS = 2    /* cuFile (CUDA backend, device slots); where it
                              cannot be loaded, its driver does not open or
                              gds_compat OFF finds no P2P path, POSIX with one
                              warning a process saying why */
} kvf_file_io;

/**
 * When file writes are made durable. Under BATCH and BLOCK a move reported
 * KVF_OK survives a crash or power cut: its file was written to a temporary
 * name, made durable, and renamed, and the rename made durable, before the
 * move completed. A crash earlier leaves the key's old file or none (or, on
 * a file system that reorders a rename before the data it names, a file
 * whose checksum fails: KVF_ERR_CORRUPT, never wrong bytes).
 */
typedef enum kvf_fsync {
    /* The default is 0, as every other setting's, so that a config written
     * with designated initialisers gets it without naming it. */
    KVF_FSYNC_BATCH = 0, /* the files of a batch and their renames are made
                            durable together before the batch completes: by
                            one syncfs() of the file system after the renames
                            (default; see docs/performance.md), or an fsync of
                            every file plus one of the directory with env
                            KVF_FSYNC_METHOD=fsync */
    KVF_FSYNC_NONE = 1,  /* leave it to the kernel: fastest, lost on a crash */
    KVF_FSYNC_BLOCK = 2  /* fsync each file, then its directory after the
                            rename, before the move completes */
} kvf_fsync;

/**
 * Whether the GDS path may use cuFile's compatibility mode, in which cuFile
 * moves file data through host bounce buffers itself (no nvidia-fs, or a
 * file system without P2P support). Compat mode is correct but no faster
 * than kvferry's POSIX path.
 */
typedef enum kvf_gds_compat {
    KVF_GDS_COMPAT_AUTO = 0, /* file.io GDS: cuFile as its configuration says
                                (compat allowed by default) where it takes
                                files of file.dir (probed at create; a file
                                system it refuses gets the POSIX path, with
                                the one warning); file.io AUTO: cuFile only
                                with a P2P path */
    KVF_GDS_COMPAT_OFF = 1,  /* P2P only: cuFile is told not to fall back to
                                compat mode, and is not used without P2P */
    KVF_GDS_COMPAT_ON = 2    /* cuFile also in compat mode, file.io AUTO too;
                                a file cuFile refuses goes through a host
                                buffer (slow: for tests and odd setups) */
} kvf_gds_compat;

/** What runs the file tier's reads and writes (POSIX path). */
typedef enum kvf_file_runner {
    KVF_FILE_RUNNER_AUTO = 0,   /* io_uring where built and allowed, else threads */
    KVF_FILE_RUNNER_URING = 1,  /* io_uring; falls back to threads with one warning
                                   where the kernel refuses it (containers) */
    KVF_FILE_RUNNER_THREADS = 2 /* a pool of threads doing pread/pwrite */
} kvf_file_runner;

/** How the CUDA backend moves a batch of scattered blocks. */
typedef enum kvf_cuda_copy {
    KVF_CUDA_COPY_AUTO = 0,   /* per batch, the path that moves it fastest
                                 (the rule's measurements are in
                                 docs/performance.md): copy engines for whole
                                 blocks of 256 KiB and up, partial rows of
                                 128 KiB and up, and pageable memory, which
                                 the kernel cannot reach; smaller whole
                                 blocks whose host slots are dense (a large
                                 batch's parts) gathered or scattered in GPU
                                 memory around one DMA per 16 MiB; the rest,
                                 and device to device, by the kernel below */
    KVF_CUDA_COPY_KERNEL = 1, /* a gather/scatter kernel over mapped pinned
                                 memory: fastest for small blocks, takes SMs */
    KVF_CUDA_COPY_DMA = 2     /* copy engines only (batched memcpy): leaves
                                 every SM to the model */
} kvf_cuda_copy;

/**
 * The engine's file tier (kvf_engine_config.file). Blocks are stored as
 * <dir>/<namespace_>/<key as 32 hex digits>.kvf; engines with different
 * namespaces (ranks, models) can share one directory, and an engine
 * reopened with the same namespace finds the blocks stored before. The
 * directories are created when missing.
 */
typedef struct kvf_engine_file_config {
    const char *dir;        /* NULL disables the tier; "" or blank is refused */
    const char *namespace_; /* default "default"; [A-Za-z0-9._-]{1,64} (the
                               underscore keeps the header C++-clean) */
    kvf_file_io io;
    kvf_fsync fsync;
    /* POSIX path. Files are written and read with O_DIRECT where the file
     * system takes it (buffered, with one log line, where it does not,
     * e.g. tmpfs; env KVF_FILE_DIRECT=0 turns it off). */
    kvf_file_runner runner; /* env KVF_FILE_RUNNER=uring|threads overrides AUTO */
    uint32_t queue_depth;   /* file reads/writes in flight per engine; 0: 32.
                               Each worker stages up to 64 MiB of the moves
                               it has in hand (pinned with CUDA) */
    /* GDS path (io AUTO or GDS, CUDA backend): moves between primary
     * (device) slots and files go through cuFile, the block gathered into
     * a registered device staging buffer and its checksum computed on the
     * GPU; the file format is the POSIX path's. cuFile is loaded at run
     * time; where it is missing or its driver does not open, io GDS falls
     * back to the POSIX path with one warning saying why. Moves of
     * secondary (host) slots always take the POSIX path. */
    kvf_gds_compat gds_compat; /* env KVF_GDS_COMPAT=on|off|auto overrides AUTO */
} kvf_engine_file_config;

/**
 * The engine's remote tier (Redis, or memory; kvf_engine_config.remote).
 * url NULL: $KVF_REMOTE_URL, or none when unset.
 *   redis://[user[:pass]@]host[:port][/db]      one server
 *   redis-cluster://[user[:pass]@]h1:p1,h2:p2    seed nodes of a cluster
 *   rediss://..., rediss-cluster://...[?tls_ca=FILE&...]  the same over
 *                TLS (tls_ca, tls_ca_dir, tls_cert, tls_key, tls_sni,
 *                tls_verify=yes|no: docs/tiers.md); a build with hiredis
 *                >= 1.0 and hiredis_ssl (kvf_store_info_get says)
 *   mem://NAME   blocks in this process's memory, shared by its engines
 *                that name NAME ([A-Za-z0-9._-]{1,64}), gone with the
 *                process, at most remote_mem_bytes of them, each gone
 *                after ttl_s: for tests, and needs no hiredis
 * Blocks are stored under kvf:<file.namespace_>:<key>, in the file tier's
 * format (header and checksum), so engines on other machines with the same
 * namespace and layout share them. The server is reached on the tier's
 * first use (a remote move, or a cache's remote lookup); when it cannot
 * be, remote moves fail with KVF_ERR_REMOTE / KVF_ERR_TIMEOUT and a new
 * connection is tried at most once a second. redis:// and
 * redis-cluster:// need a build with hiredis. The password is never
 * shown: messages, logs and kvf_engine_settings write it as ***.
 */
typedef struct kvf_engine_remote_config {
    const char *url;
    uint32_t ttl_s; /* expiry of stored blocks; 0: none */
    /* Connect timeout, and the time a remote batch (kvf_offload / kvf_onboard
     * on KVF_TIER_REMOTE, kvf_remove) has: it completes within this plus
     * its bytes at 256 MiB/s (a floor far below a Redis node's pace) from
     * when it starts to run, however many blocks it has and however slowly
     * a node sends or takes bytes; moves not done by then fail with
     * KVF_ERR_TIMEOUT (logged with their key and node), those not yet sent
     * without contacting the node. 0: 1000 ms to connect, 2000 ms per batch. */
    uint32_t timeout_ms;
} kvf_engine_remote_config;

/** The CUDA backend's copies (kvf_engine_config.cuda). */
typedef struct kvf_engine_cuda_config {
    kvf_cuda_copy copy; /* env KVF_CUDA_COPY=auto|kernel|dma overrides AUTO */
    uint32_t copy_sms;  /* thread blocks of the copy kernel; 0: 32 */
} kvf_engine_cuda_config;

/**
 * Engine configuration, grouped by tier. Start from KVF_ENGINE_CONFIG_INIT
 * and set what differs, or write it with designated initialisers:
 *
 *   kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
 *   cfg.file.dir = "/mnt/nvme/kv";
 *
 *   kvf_engine_config cfg = {
 *       .struct_size = sizeof(kvf_engine_config),
 *       .file = {.dir = "/mnt/nvme/kv", .namespace_ = "rank0"},
 *       .remote = {.url = "redis://cache:6379", .ttl_s = 3600},
 *   };
 *
 * Every default is zero (AUTO, BATCH, 0, NULL), so the two are the same
 * but for struct_size, which the second must set. A field that differs from
 * its *_INIT value counts as the caller's and is not read from the
 * environment or config file (kvf_setting_source).
 *
 * Every struct that starts with struct_size works across versions: one
 * from an older, shorter header is read with the fields it lacks at their
 * *_INIT values (at zero in kvf_prefill_cost and kvf_plan_input), and one
 * a call fills (kvf_info, kvf_cache_stats, kvf_costs, kvf_plan,
 * kvf_store_info) gets only the fields it has, its struct_size then saying
 * how many bytes were filled.
 */
typedef struct kvf_engine_config {
    size_t struct_size;  /* sizeof(kvf_engine_config), set by the macro */
    kvf_backend backend; /* default AUTO; env KVF_BACKEND overrides AUTO */
    int device;          /* CUDA device ordinal, default 0 */
    uint32_t threads;    /* worker threads; 0: min(4, cores) */
    kvf_engine_file_config file;
    kvf_engine_remote_config remote;
    kvf_engine_cuda_config cuda; /* CUDA backend only */
    /* A YAML file of settings (docs/configuration.md); NULL: $KVF_CONFIG,
     * or none. Needs a build with libyaml: otherwise naming a file fails
     * create with KVF_ERR_UNSUPPORTED. A cache of this engine reads its
     * cache_* settings from the same file. */
    const char *config_file;
    /* The in-memory remote tier (remote.url mem://NAME): the most bytes of
     * stored blocks (64-byte headers included) a NAME holds; a put that
     * would pass it evicts the oldest puts first (one warning when a NAME
     * first fills, an info line per block evicted), and a block larger
     * than all of it is KVF_ERR_NO_SPACE. The NAME's engines share it: it
     * holds the largest any of them asked for. 0: 1 GiB. (Last in the
     * struct, where a field can be added without moving the others.) */
    uint64_t remote_mem_bytes;
} kvf_engine_config;

/* Every other field 0: AUTO, KVF_FSYNC_BATCH, NULL. */
#define KVF_ENGINE_CONFIG_INIT                                                                     \
    {                                                                                              \
        .struct_size = sizeof(kvf_engine_config)                                                   \
    }

/**
 * Where settings come from. Every setting of kvf_engine_config and
 * kvf_cache_config (all but the cache's event callback) also has a key of
 * the config file, its group and field joined by '_' (backend, file_dir,
 * remote_ttl_s; cache_host_bytes for the cache's host.bytes), and an
 * environment variable, KVF_ + the key in capitals (KVF_FILE_DIR,
 * KVF_CACHE_HOST_BYTES); the few that read otherwise (fsync, gds_compat,
 * file_namespace, cache_event_queue, KVF_CONFIG) and the defaults are
 * listed in docs/configuration.md. A field the caller left at its *_INIT
 * value is taken from the environment, else the file, else the default; a
 * field set to anything else is the caller's and wins. Enum values are
 * case-insensitive; a value that is not one of them fails create with
 * KVF_ERR_INVALID naming the variable (or file, line and key) and the
 * valid values, as does an unknown key in the file.
 */
typedef enum kvf_setting_source {
    KVF_SOURCE_DEFAULT = 0,
    KVF_SOURCE_FILE = 1,
    KVF_SOURCE_ENV = 2,
    KVF_SOURCE_CALLER = 3
} kvf_setting_source;

/** "default", "file", "environment", "caller"; "?" for another value. */
KVF_API const char *kvf_setting_source_name(kvf_setting_source source);

/** One effective setting. The strings belong to whoever handed it out. */
typedef struct kvf_setting {
    const char *name;  /* the config file's key: "backend", "cache_host_bytes" */
    const char *env;   /* its environment variable: "KVF_BACKEND" */
    const char *value; /* as text: "cuda", "4", "68719476736"; "" for none */
    kvf_setting_source source;
} kvf_setting;

/**
 * Parses a size in bytes: a decimal number (a fraction is allowed with a
 * unit: "1.5T") and an optional unit, case-insensitive, spaces allowed
 * before it. Units as storage and LLM serving tools read them: K, M, G, T,
 * P, KB, MB, GB, TB, PB are powers of 1000; KiB, MiB, GiB, TiB, PiB are
 * powers of 1024; B or none is bytes. So "64GB" is 64e9 bytes, "64GiB"
 * 64 * 2^30, "512M" 512e6, "4096" 4096. A fraction rounds down to a byte.
 * @return KVF_OK; KVF_ERR_INVALID for NULL, an empty string, a sign, junk
 *         or an unknown unit; KVF_ERR_RANGE above 2^64 - 1; both with
 *         kvf_last_error() quoting the text. *bytes_p is set only on success.
 */
KVF_API kvf_status kvf_size_parse(const char *text, uint64_t *bytes_p);

/**
 * Creates an engine and its worker threads. With the CUDA backend it also
 * starts a completion thread: while copies are in flight it checks their
 * end events every few microseconds (a fraction of one core, for a
 * completion seen about ten microseconds after the GPU finished); with
 * none in flight it sleeps.
 * @param cfg  configuration; NULL means all defaults. Strings are copied.
 *        Fields left at their KVF_ENGINE_CONFIG_INIT values are taken from
 *        the environment or the config file (see kvf_setting_source).
 * @param engine_p  receives the engine on success.
 * @return KVF_OK; KVF_ERR_NO_DEVICE when CUDA was asked for and is not
 *         usable (AUTO then picks the host backend instead); KVF_ERR_IO
 *         when file.dir cannot be created; KVF_ERR_INVALID for a bad
 *         value in the environment or the config file, or an unknown key
 *         in the file; KVF_ERR_NOT_FOUND when the config file is missing;
 *         KVF_ERR_UNSUPPORTED when a config file is named and the build
 *         has no libyaml.
 */
KVF_API kvf_status kvf_engine_create(const kvf_engine_config *cfg, kvf_engine **engine_p);

/**
 * Waits for every batch in flight, then frees the engine, the memory it
 * allocated and its registrations of caller memory. NULL is fine. Tickets
 * not yet waited for are dropped. Must not race any other call on it.
 */
KVF_API void kvf_engine_destroy(kvf_engine *engine);

/** The backend the engine runs on (never AUTO). */
KVF_API kvf_backend kvf_engine_backend(const kvf_engine *engine);

/**
 * The engine's effective settings, each with where it came from (caller,
 * environment, config file or default), as resolved at create. The array
 * is the engine's, valid until it is destroyed; safe from any thread.
 */
KVF_API kvf_status kvf_engine_settings(const kvf_engine *engine, const kvf_setting **settings_p,
                                       size_t *n_p);

/** Where a pool's slots live. */
typedef enum kvf_memory {
    KVF_MEMORY_HOST = 0,        /* plain host memory */
    KVF_MEMORY_HOST_PINNED = 1, /* page-locked host memory (CUDA backend) */
    KVF_MEMORY_DEVICE = 2       /* GPU memory on the engine's device */
} kvf_memory;

/**
 * One array of block slots. With base == NULL kvferry allocates
 * `slots * slot_stride` bytes (zeroed) and frees them with the engine.
 * With a caller's base the memory stays the caller's, must outlive the
 * engine, and must be of the stated kind: the CUDA backend registers a
 * caller's pinned-host array with the driver when it is not already.
 */
typedef struct kvf_pool_desc {
    kvf_memory memory;
    void *base;
    size_t slot_stride; /* bytes from one slot to the next; 0: the block's bytes */
    uint32_t slots;
} kvf_pool_desc;

/** Which array of a pool. */
typedef enum kvf_level { KVF_LEVEL_PRIMARY = 0, KVF_LEVEL_SECONDARY = 1 } kvf_level;

/**
 * Adds a pool. All pools of an engine share tokens_per_block (a block's
 * first N tokens mean the same in every pool). Pools are added before the
 * first transfer; afterwards this returns KVF_ERR_STATE.
 *
 * The host backend takes HOST or HOST_PINNED for both arrays; the CUDA
 * backend takes DEVICE primaries and HOST_PINNED secondaries (HOST is
 * accepted for secondaries, and slow: pageable copies run at a fraction of
 * PCIe speed).
 * @param g          the block geometry; copied.
 * @param primary    the primary slots; required.
 * @param secondary  the secondary slots, or NULL for a pool offloaded only
 *                   to files.
 * @param pool_p     receives the pool's index (0, 1, ...); may be NULL.
 */
KVF_API kvf_status kvf_engine_add_pool(kvf_engine *engine, const kvf_geometry *g,
                                       const kvf_pool_desc *primary, const kvf_pool_desc *secondary,
                                       uint32_t *pool_p);

/** Number of pools added so far. */
KVF_API uint32_t kvf_engine_pool_count(const kvf_engine *engine);

/**
 * Address of one slot of one pool, to fill or read a block: host memory on
 * the host backend, device memory for CUDA primary slots. The address stays
 * valid for the engine's life. Write a primary slot only when no transfer
 * touching it is in flight (wait for its ticket, or order the caller's
 * stream with kvf_sync_stream); secondary slots are kvferry's to write.
 */
KVF_API kvf_status kvf_engine_slot_ptr(kvf_engine *engine, uint32_t pool, kvf_level level,
                                       uint32_t slot, void **ptr_p);

/* ------------------------------------------------------------------------ */
/* Moves                                                                    */
/* ------------------------------------------------------------------------ */

/**
 * A block's content key: 128 bits naming a block by what it holds (its
 * tokens and everything before them), never all zero. A struct, so that a
 * key cannot be passed where a slot number is expected or the other way
 * round.
 *
 * Collision policy: kvferry trusts keys. Two blocks with one key are taken
 * to hold the same KV data; tokens are not compared. With 128-bit keys the
 * chance that any two of n distinct blocks share a key is about n^2 / 2^129
 * (1.5e-21 for 10^9 blocks in a shared remote tier). The hash is not
 * cryptographic: where requests come from users who must not share KV
 * data, give each of them a salt of its own (and keep the salts secret
 * from them).
 *
 * Stored blocks name their key in full: a file <32 hex digits>.kvf (hi
 * then lo, lower case), a remote value kvf:<namespace>:<32 hex digits>,
 * and the block header, checked on every read.
 */
typedef struct kvf_key {
    uint64_t hi, lo;
} kvf_key;

/** The parent of a request's first block; no block has it. */
#define KVF_KEY_ROOT ((kvf_key){0, 0})

/** A key's text: 32 lower-case hex digits, hi then lo, and the NUL. */
#define KVF_KEY_STR_BYTES 33

/** printf's format and arguments of a key's 32 hex digits:
 *  printf("block " KVF_KEY_FMT "\n", KVF_KEY_ARGS(key)). */
#define KVF_KEY_FMT "%016llx%016llx"
#define KVF_KEY_ARGS(k) (unsigned long long)(k).hi, (unsigned long long)(k).lo

/** Whether two keys are the same key. */
static inline int kvf_key_eq(kvf_key a, kvf_key b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

/** Keys in order, hi then lo (the order of their text): <0, 0 or >0. */
static inline int kvf_key_cmp(kvf_key a, kvf_key b)
{
    if (a.hi != b.hi)
        return a.hi < b.hi ? -1 : 1;
    return (a.lo > b.lo) - (a.lo < b.lo);
}

/** Whether a key is KVF_KEY_ROOT (names no block). */
static inline int kvf_key_is_root(kvf_key k)
{
    return (k.hi | k.lo) == 0;
}

/**
 * Writes a key's 32 hex digits and a NUL into buf (KVF_KEY_STR_BYTES
 * bytes) and returns buf.
 */
KVF_API char *kvf_key_format(kvf_key key, char *buf);

/**
 * Reads exactly 32 hex digits (either case, nothing before or after) into
 * *key_p. @return KVF_OK; KVF_ERR_INVALID for anything else (*key_p
 * unchanged).
 */
KVF_API kvf_status kvf_key_parse(const char *text, kvf_key *key_p);

/**
 * Where a block is kept. An engine batch moves blocks between the primary
 * slots and HOST, DISK or REMOTE; a cache keeps blocks in all four, falling
 * through them GPU (when it owns GPU blocks), host, disk, remote. An engine
 * call given a tier it cannot take fails with KVF_ERR_INVALID naming it.
 */
typedef enum kvf_tier {
    KVF_TIER_HOST = 0,   /* the secondary slots: TensorRT-LLM's DRAM mode */
    KVF_TIER_DISK = 1,   /* block files: TensorRT-LLM's GDS and POSIX modes,
                            chosen by kvf_engine_config.file.io */
    KVF_TIER_REMOTE = 2, /* a Redis server or cluster, or mem:// (remote.url),
                            shared between engines; a move names the
                            block by its key, as for files */
    KVF_TIER_GPU = 3,    /* the primary slots themselves: the end of every
                            engine move, so no engine call takes it as its
                            tier; a cache's GPU tier (gpu.blocks) */
    KVF_TIER_COUNT = 4
} kvf_tier;

/** Name of a tier ("host", "disk", "remote", "gpu"); "?" for another value. */
KVF_API const char *kvf_tier_name(kvf_tier tier);

/**
 * One block to move: the same slot of every pool.
 *   offload to HOST:   src = primary slot, dst = secondary slot
 *   offload to DISK:   src = primary slot, key = block key, dst = 0 (REMOTE alike)
 *   onboard from HOST: src = secondary slot, dst = primary slot
 *   onboard from DISK: key = block key, src = 0, dst = primary slot (REMOTE alike)
 *   kvf_copy:          src = primary slot, dst = primary slot
 * A block key has a member of its own, never a slot's: a move whose
 * stored side (DISK or REMOTE) has a non-zero src / dst, or whose key is
 * not KVF_KEY_ROOT where both sides are slots, refuses the batch with
 * KVF_ERR_INVALID naming the move, so a slot and a key cannot be mixed up
 * silently. A keyed move's key is never KVF_KEY_ROOT.
 * tokens: 0 for the whole block, else the first `tokens` tokens, at most
 * tokens_per_block (more refuses the batch with KVF_ERR_RANGE). A partial
 * offload stores only those tokens; onboarding more tokens than were stored
 * fails with KVF_ERR_RANGE rather than return bytes that were never stored.
 */
typedef struct kvf_move {
    uint64_t src;
    uint64_t dst;
    uint32_t tokens;
    kvf_key key; /* DISK and REMOTE moves: the stored block; else KVF_KEY_ROOT */
} kvf_move;

/**
 * Names a submitted engine batch. A struct, not a number, so that a cache's
 * ticket (kvf_cache_ticket) cannot be passed where an engine's is expected,
 * or the other way round: the compiler refuses it. id 0 is never a valid
 * ticket.
 */
typedef struct kvf_ticket {
    uint64_t id;
} kvf_ticket;

/**
 * Queues a batch of offloads. `moves` is copied: the array may be reused on
 * return. The batch waits for earlier batches that write its source slots
 * or its destinations, or still read its destinations (for a batch reading
 * a destination slot, only until its copy of that slot has ended).
 *
 * A batch is accepted or refused whole: on an error return nothing was
 * queued (bad slot, key collision inside the batch, no secondary array,
 * no file tier, ...) and kvf_last_error() names the move and pool. Every
 * move of an accepted batch completes with its own status; a failed move
 * leaves its destination lost (a failed file write removes the file), never
 * half-valid.
 *
 * @param ticket_p receives the batch's ticket, to pass to kvf_poll or
 *        kvf_wait exactly once to completion. NULL: fire and forget;
 *        failures are then logged. Either way, a move queued to read what
 *        a failed move wrote fails with KVF_ERR_LOST, a later read of that
 *        secondary slot fails with KVF_ERR_LOST until the slot is written
 *        again, and a later read of that file key finds no block
 *        (KVF_ERR_NOT_FOUND). Where the file directory refuses to remove
 *        the key's old file (read-only, not this process's), the file is
 *        cut to 0 bytes in place, so that no engine, after a restart
 *        either, reads it as the block (KVF_ERR_CORRUPT there), and this
 *        engine refuses the key with KVF_ERR_LOST, naming key and file,
 *        until it is written again or removed (kvf_remove); where
 *        even that cut fails, the refusal lasts as long as this engine
 *        and an error in the log says the old file remains (an engine
 *        opened later would read it). A failed write to the remote tier removes
 *        nothing there (the store is shared between engines): the key
 *        keeps its previous value, or the new one where only the reply
 *        was lost, each whole and checksummed.
 */
KVF_API kvf_status kvf_offload(kvf_engine *engine, kvf_tier to, const kvf_move *moves, size_t n,
                               kvf_ticket *ticket_p);

/**
 * Queues a batch of offloads ordered after a caller's CUDA stream: as
 * kvf_offload, but no byte of the batch is read from its source slots
 * before the work queued on `stream` before this call has finished (a
 * kernel still writing the blocks, e.g. a layer's forward pass). The
 * calling thread does not wait for it: copies to the HOST tier wait on
 * the GPU (an event recorded on `stream` now, waited for by kvferry's
 * offload stream, so offloads queued after this one wait too); for DISK
 * and REMOTE a worker thread waits for the event before it reads the
 * slots. The event is released when the batch completes. If that wait
 * fails, the batch's moves fail with the device's status (KVF_ERR_DEVICE)
 * and read nothing.
 * @param stream a cudaStream_t of the engine's device, or NULL: then
 *        exactly kvf_offload. The host backend has no stream to order
 *        after: a non-NULL stream is KVF_ERR_UNSUPPORTED, nothing queued.
 */
KVF_API kvf_status kvf_offload_after(kvf_engine *engine, void *stream, kvf_tier to,
                                     const kvf_move *moves, size_t n, kvf_ticket *ticket_p);

/** Queues a batch of onboards; as kvf_offload. Onboards run before queued
 *  offloads when both are ready (they are on a request's critical path). */
KVF_API kvf_status kvf_onboard(kvf_engine *engine, kvf_tier from, const kvf_move *moves, size_t n,
                               kvf_ticket *ticket_p);

/**
 * Layer-wise transfers. An engine whose pools are its layers (a pool per
 * layer, or per layer and K/V) can move some pools only, and learn of each
 * pool's arrival on its own, so that layer l computes while layer l+1
 * still loads, or layer l offloads right after its kernels.
 *
 * kvf_onboard_pools: as kvf_onboard, moving only pools[0..n_pools) of
 * each move, in that order: on the CUDA backend the batch is issued pool
 * by pool, so pools[0] of every move arrives first. An onboard from DISK
 * reads each block's file in groups of consecutive pools (at least 256
 * KiB of a block each, at most 32 groups: kvf_engine_arrival_groups), on
 * every backend: group g of every block of the batch is read, checked
 * against its stored CRC-32C and written to the slots, and its pools'
 * waits return, before any block's group g + 1 is read. A block whose
 * pool fails its checksum fails its move (KVF_ERR_CORRUPT naming the
 * pool and the file); the pools of it already handed over were checked,
 * its later pools are not written, and waits on them return the failure.
 * Onboards from REMOTE read and check whole stored blocks. Both write the
 * listed pools only.
 *
 * kvf_offload_pools: as kvf_offload_after (stream may be NULL), moving
 * only the listed pools. A list of some of the pools goes to the HOST tier
 * only (a stored block holds every pool: KVF_ERR_UNSUPPORTED otherwise):
 * offload a layer at a time to host, then the whole block on.
 *
 * @param pools, n_pools  distinct pool indices (KVF_ERR_RANGE for an
 *        index past the engine's pools, KVF_ERR_INVALID for one listed
 *        twice or n_pools 0); NULL with n_pools 0: every pool, in order.
 *        The count is checked first: of a list longer than the pool
 *        count only the first pool count + 1 entries are read (one of
 *        them then repeats, KVF_ERR_INVALID, or is out of range), and
 *        nothing is allocated for it, whatever n_pools says.
 *
 * Hazards stay per slot: batches over different pools of one slot still
 * run one after the other where one writes what the other reads or
 * writes. A batch that writes some pools of a slot whose last write failed
 * fails with KVF_ERR_LOST (the other pools hold lost data); a secondary
 * slot written in part holds the fewer of the tokens of its writes.
 *
 * A secondary slot knows which of its pools have been written. A move that
 * reads a pool of it never written (a whole kvf_onboard, kvf_demote or a
 * cache's get of a slot offloaded a layer at a time, not yet every layer;
 * kvf_onboard_pools of such a pool) fails with KVF_ERR_NOT_FOUND, naming
 * the slot and the pool, and writes nothing: no block is ever served,
 * demoted or stored in part. Once every pool has been written, by any
 * mix of batches, the slot holds a whole block. A pool written by a move
 * that failed leaves the slot KVF_ERR_LOST until it is written whole.
 */
KVF_API kvf_status kvf_onboard_pools(kvf_engine *engine, kvf_tier from, const uint32_t *pools,
                                     size_t n_pools, const kvf_move *moves, size_t n,
                                     kvf_ticket *ticket_p);
KVF_API kvf_status kvf_offload_pools(kvf_engine *engine, void *stream, kvf_tier to,
                                     const uint32_t *pools, size_t n_pools, const kvf_move *moves,
                                     size_t n, kvf_ticket *ticket_p);

/**
 * Waits until pool `pool` of every move of a batch has arrived, without
 * retiring the ticket (kvf_wait or kvf_poll still must). Works on any
 * batch: a kvf_onboard_pools from DISK or REMOTE marks each pool group's
 * arrival (a pool arrives with its group); where a pool's arrival is not
 * marked on its own (the host backend between slots, a batch of more than
 * 4096 moves between slots, a batch not naming its pools) the pool
 * arrives with the whole batch.
 * @return KVF_OK: the pool's bytes of every move are in place; the
 *         status of a move of the batch that already failed (its other
 *         moves may have arrived: kvf_wait tells which); KVF_ERR_RANGE
 *         for a pool the batch does not move; KVF_ERR_UNKNOWN_TICKET for
 *         a ticket retired before this call. Safe from several threads,
 *         beside a kvf_wait or kvf_poll of the same ticket: a call that
 *         found the ticket answers for that batch even when another
 *         thread retires it meanwhile.
 */
KVF_API kvf_status kvf_wait_pool(kvf_engine *engine, kvf_ticket ticket, uint32_t pool);

/**
 * As kvf_wait_pool, but work queued on `stream` (a cudaStream_t) after
 * this call waits for the pool on the GPU: the host returns as soon as
 * the batch is on the device (it waits on the host for a batch still
 * held back by the batches it depends on, or run by worker threads). On
 * the host backend, or with stream NULL, exactly kvf_wait_pool.
 */
KVF_API kvf_status kvf_stream_wait_pool(kvf_engine *engine, kvf_ticket ticket, uint32_t pool,
                                        void *stream);

/** Queues primary-to-primary copies (a request reusing part of a block);
 *  as kvf_offload, on the onboard queue. */
KVF_API kvf_status kvf_copy(kvf_engine *engine, const kvf_move *moves, size_t n,
                            kvf_ticket *ticket_p);

/**
 * Moves blocks between the host tier and a tier below it, leaving the
 * primary slots alone: kvf_demote writes secondary slots to `to` (src =
 * secondary slot, key = block key, dst = 0), kvf_promote reads blocks of
 * `from` into secondary slots (key = block key, src = 0, dst = secondary
 * slot). A cache uses
 * them to push a host-tier victim down to disk and to warm the host tier.
 * Needs secondary slots in every pool and the tier; otherwise as
 * kvf_offload. Demotes run on the offload queue, promotes on the onboard
 * queue.
 * @param to, from  KVF_TIER_DISK or KVF_TIER_REMOTE (a block demoted there
 *        onboards as one offloaded, and the other way round); HOST and GPU
 *        are KVF_ERR_INVALID.
 */
KVF_API kvf_status kvf_demote(kvf_engine *engine, kvf_tier to, const kvf_move *moves, size_t n,
                              kvf_ticket *ticket_p);
KVF_API kvf_status kvf_promote(kvf_engine *engine, kvf_tier from, const kvf_move *moves, size_t n,
                               kvf_ticket *ticket_p);

/**
 * Removes stored blocks from a tier, in order with the moves queued before
 * on the same keys (a removal queued after a write removes what was
 * written). A key with no block there is not an error. Removed keys read
 * as KVF_ERR_NOT_FOUND. Runs on the offload queue; otherwise as
 * kvf_offload.
 * @param tier  KVF_TIER_DISK (block files) or KVF_TIER_REMOTE (other
 *        engines sharing the namespace lose the blocks too); HOST and GPU
 *        hold slots, not keys: KVF_ERR_INVALID.
 */
KVF_API kvf_status kvf_remove(kvf_engine *engine, kvf_tier tier, const kvf_key *keys, size_t n,
                              kvf_ticket *ticket_p);

/**
 * Asks whether a batch has completed, without blocking.
 * @param per_move NULL, or an array of the batch's move count, filled with
 *        each move's status once the batch has completed.
 * @return KVF_INPROGRESS; or, once complete, KVF_OK if every move succeeded,
 *         else the status of the first failed move. A completed ticket is
 *         retired: asking again gives KVF_ERR_UNKNOWN_TICKET.
 */
KVF_API kvf_status kvf_poll(kvf_engine *engine, kvf_ticket ticket, kvf_status *per_move);

/** Blocks until a batch has completed; then as kvf_poll. A failed batch
 *  leaves kvf_last_error() naming its first failed move and that move's
 *  message (as kvf_move_error gives it). Several threads may wait for or
 *  poll one ticket at once: exactly one of them retires it and gets its
 *  result; each of the others gets KVF_ERR_UNKNOWN_TICKET ("already
 *  retired"), never another batch's status. */
KVF_API kvf_status kvf_wait(kvf_engine *engine, kvf_ticket ticket, kvf_status *per_move);

/** Bytes of kvf_move_error.message, its NUL included. */
#define KVF_MOVE_ERROR_MESSAGE 256

/**
 * Why one move of a batch failed: the detail that kvf_last_error() would
 * give for a single call, captured where the move failed (on whichever
 * thread ran it), e.g. "onboard from file: block 0x2a:
 * /data/kv/ns/000000000000002a.kvf: checksum mismatch (...)".
 */
typedef struct kvf_move_error {
    size_t index;      /* the move's position in the batch as submitted */
    kvf_status status; /* equal to per_move[index] */
    /* NUL-terminated, cut to fit: the operation and what it touched
     * (block key and file path, slot, node), and the system's reason
     * (errno text, checksum values, a store's reply) */
    char message[KVF_MOVE_ERROR_MESSAGE];
} kvf_move_error;

/**
 * As kvf_wait, and hands over each failed move's message.
 *
 * Cost and lifetime: a batch whose moves all succeed keeps nothing; each
 * failed move of a batch with a ticket keeps one message of at most
 * KVF_MOVE_ERROR_MESSAGE bytes, from its failure until the ticket retires
 * (this call, or kvf_wait / kvf_poll, which drop them). A batch submitted
 * without a ticket keeps none (its failures are logged).
 *
 * @param per_move  as kvf_wait: NULL, or the batch's move count.
 * @param errors    receives the first min(cap, failures) failed moves in
 *                  index order; may be NULL when cap is 0.
 * @param n_errors_p  NULL, or receives how many moves failed (may be more
 *                  than cap: the others' messages are dropped).
 * Outputs are written when the batch has completed, whatever its result.
 * @return as kvf_wait; KVF_ERR_INVALID (the ticket untouched) for errors
 *         NULL with cap > 0.
 */
KVF_API kvf_status kvf_wait_errors(kvf_engine *engine, kvf_ticket ticket, kvf_status *per_move,
                                   kvf_move_error *errors, size_t cap, size_t *n_errors_p);

/** As kvf_wait_errors without blocking: KVF_INPROGRESS, nothing written,
 *  while the batch runs (its ticket stays valid). */
KVF_API kvf_status kvf_poll_errors(kvf_engine *engine, kvf_ticket ticket, kvf_status *per_move,
                                   kvf_move_error *errors, size_t cap, size_t *n_errors_p);

/**
 * TensorRT-LLM's syncTransfers: work the caller queues on `stream` (a
 * cudaStream_t) after this call runs after every batch queued before it, and
 * so never reads a slot still being written or writes one still being read.
 * Does not block the host when every such batch is already on the GPU.
 * With stream == NULL, or on the host backend, blocks the calling thread
 * until those batches complete. Tickets stay valid either way.
 */
KVF_API kvf_status kvf_sync_stream(kvf_engine *engine, void *stream);

/* Every call taking a `void *stream` reads NULL as "no stream" (a wait on
 * the host, or no ordering). CUDA's default stream is named explicitly by
 * cudaStreamLegacy (or cudaStreamPerThread), as the Python binding does for
 * a torch stream whose handle is 0. */

/* ------------------------------------------------------------------------ */
/* Block keys                                                               */
/* ------------------------------------------------------------------------ */

/**
 * The key of one block: XXH3-128 (seed 0, libxxhash's XXH3_128bits) over
 * the parent's key (hi then lo), the salt and the block's token ids, all
 * little-endian (16 + 8 + 4 * n bytes); {0, 1} where that gives all zero.
 * Stable across processes, machines and versions.
 * @param parent  the key of the block before it, or KVF_KEY_ROOT.
 * @param tokens  the block's token ids (n of them; NULL only when n is 0).
 * @param salt    0, or what separates equal tokens that must not share KV
 *                data: a LoRA adapter, a model (kvf_key_salt of its name).
 * @return the key; KVF_KEY_ROOT (which no block has) when tokens is NULL
 *         with n > 0, with kvf_last_error() saying so (KVF_ERR_INVALID).
 *         A valid call never returns KVF_KEY_ROOT and leaves
 *         kvf_last_error() alone.
 */
KVF_API kvf_key kvf_key_chain(kvf_key parent, const uint32_t *tokens, size_t n, uint64_t salt);

/**
 * The keys of every whole block of a token sequence, chained from
 * KVF_KEY_ROOT: n_tokens / tokens_per_block keys (a partial last block has
 * no key: only whole blocks are cached). Writes at most `cap` keys and
 * returns how many there are (which may be more than `cap`; keys may be
 * NULL with cap 0, to count).
 * @return 0, nothing written, with kvf_last_error() saying why
 *         (KVF_ERR_INVALID), when tokens_per_block is 0, tokens is NULL
 *         with a whole block in n_tokens, or keys is NULL with cap > 0.
 *         A valid call returning 0 (fewer tokens than a block) clears
 *         kvf_last_error().
 */
KVF_API size_t kvf_key_chain_all(const uint32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                                 uint64_t salt, kvf_key *keys, size_t cap);

/** A salt from a name (an adapter or a model): XXH64 of its bytes. */
KVF_API uint64_t kvf_key_salt(const char *name);

/* ------------------------------------------------------------------------ */
/* Cache                                                                    */
/* ------------------------------------------------------------------------ */

/**
 * A content-addressed cache of whole blocks below an engine's primary
 * slots, for prefix reuse. The serving engine keeps owning its GPU (or
 * primary) blocks, as vLLM and SGLang do: it hands a block to the cache by
 * slot when it would otherwise free it (kvf_cache_put), asks which leading
 * blocks of a new request are cached (kvf_cache_lookup), and has them copied
 * into slots of its choice (kvf_cache_get).
 *
 * Tiers, top to bottom: HOST (the engine's secondary slots) and DISK (the
 * engine's file tier). A put lands in the highest tier with capacity. When
 * a tier is full its victim moves down one tier instead of being dropped;
 * only the last tier drops. Victims are chosen by priority (0-100, lowest
 * first), then least recently used; a victim below offload_min_priority is
 * dropped instead of moved down; a pinned block (kvf_cache_pin, or one
 * being read by a get) is never a victim.
 *
 * Every function may be called from several threads at once, except
 * kvf_cache_destroy. The cache uses its engine's transfers: the engine may
 * still be used directly for slots and keys the cache does not use, but
 * its secondary slots [0, host.blocks) and the file keys of cached blocks
 * are the cache's.
 */
typedef struct kvf_cache kvf_cache;

/**
 * Names a cache call with a ticket (put, get, acquire, alloc), for
 * kvf_cache_wait and its kin: a type of its own, so that an engine's
 * kvf_ticket cannot be passed for it. id 0 is never a valid ticket.
 */
typedef struct kvf_cache_ticket {
    uint64_t id;
} kvf_cache_ticket;

typedef enum kvf_cache_event_kind {
    KVF_EVENT_STORED = 0,  /* a block entered the cache (tier: where) */
    KVF_EVENT_UPDATED = 1, /* a block moved between tiers (from -> tier) */
    KVF_EVENT_REMOVED = 2  /* a block left the cache (tier: the one it left) */
} kvf_cache_event_kind;

/** One change of the cache's content, in the order the changes were made. */
typedef struct kvf_cache_event {
    uint64_t seq; /* 1, 2, 3, ... over all events, dropped ones included */
    kvf_cache_event_kind kind;
    kvf_key key;
    kvf_tier tier;
    kvf_tier from; /* UPDATED only; else equal to tier */
    uint32_t priority;
} kvf_cache_event;

/** Called for each event, in order, with the cache's lock held: it must
 *  not call into the cache, and should return quickly. */
typedef void (*kvf_cache_event_fn)(void *arg, const kvf_cache_event *event);

/** How a cache uses its engine's remote tier (kvf_engine_config.remote.url). */
typedef enum kvf_cache_remote {
    KVF_CACHE_REMOTE_OFF = 0,
    /* every block this cache stores (put, or committed to its GPU tier)
     * is also stored remotely, in the same call; not a duplicate put, nor
     * a block it had no room for. Lookups and gets fall back to the
     * remote tier for blocks not cached here; kvf_cache_remove removes
     * there too */
    KVF_CACHE_REMOTE_WRITE_THROUGH = 1,
    /* lookups and gets fall back to the remote tier; puts leave it alone
     * (other instances fill it) */
    KVF_CACHE_REMOTE_READ = 2
} kvf_cache_remote;

/**
 * The size of a cache's host tier (the engine's secondary slots 0 ..
 * blocks-1) in blocks or in bytes, not both (KVF_ERR_INVALID). Bytes
 * (kvf_size_parse reads "64GB"-style text) are rounded down to whole blocks
 * of the engine's layout: one block is a slot of every pool (the sum of the
 * pools' block bytes; a block file's 64-byte header is not counted); a size
 * below one block is KVF_ERR_RANGE naming the tier. Both 0: no host tier.
 * blocks <= the engine's secondary slots.
 */
typedef struct kvf_cache_host_config {
    uint64_t blocks;
    uint64_t bytes;
} kvf_cache_host_config;

/** The disk tier (the engine's file tier), sized as the host tier. */
typedef struct kvf_cache_disk_config {
    uint64_t blocks;
    uint64_t bytes;
    /* A block enters the disk tier only once it has been got this many
     * times (sparing SSD writes for blocks never reused); default 0. */
    uint32_t admit_uses;
} kvf_cache_disk_config;

/**
 * The GPU tier, for an engine that lets kvferry allocate its GPU blocks
 * (as TensorRT-LLM's block manager does): primary slots
 * 0 .. blocks-1 are the cache's, handed out by kvf_cache_alloc and
 * kvf_cache_acquire. 0: the engine owns its primary slots (put / get).
 */
typedef struct kvf_cache_gpu_config {
    uint64_t blocks;
} kvf_cache_gpu_config;

/** Where the cache's events go: a queue drained by kvf_cache_events, a
 *  callback, both or neither. */
typedef struct kvf_cache_events_config {
    /* Events kept for kvf_cache_events until drained; further events are
     * dropped and counted. 0: no queue. */
    uint32_t queue;
    kvf_cache_event_fn fn; /* NULL: none */
    void *arg;             /* fn's first argument */
} kvf_cache_events_config;

/**
 * Cache configuration, grouped by tier. Start from KVF_CACHE_CONFIG_INIT,
 * or write it with designated initialisers (every default is zero but
 * struct_size's):
 *
 *   kvf_cache_config cfg = {
 *       .struct_size = sizeof(kvf_cache_config),
 *       .host = {.bytes = 64000000000},
 *       .disk = {.blocks = 1 << 20, .admit_uses = 2},
 *   };
 *
 * At least one tier must be on; disk needs the engine's file tier.
 */
typedef struct kvf_cache_config {
    size_t struct_size; /* sizeof(kvf_cache_config), set by the macro */
    kvf_cache_host_config host;
    kvf_cache_disk_config disk;
    kvf_cache_gpu_config gpu;
    kvf_cache_events_config events;
    /* The remote tier below disk, shared with every cache whose engine uses
     * the same remote store, namespace and layout. Its content is the
     * store's: this cache neither counts nor evicts it (give the server a
     * maxmemory policy, or the engine a remote.ttl_s), and its blocks raise
     * no events. A block read from it is checked like a file (header,
     * layout, namespace, checksum): a damaged or foreign value is a failed
     * block plus a count in remote_errors, never data. */
    kvf_cache_remote remote;
    /* Victims with a priority below this are dropped, not moved down a
     * tier (TensorRT-LLM's rule); default 0: every victim moves. */
    uint32_t offload_min_priority;
} kvf_cache_config;

/* Every other field 0, remote KVF_CACHE_REMOTE_OFF. */
#define KVF_CACHE_CONFIG_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(kvf_cache_config)                                                    \
    }

/**
 * Creates a cache over `engine`, whose pools must all be added and must all
 * have secondary slots when host.blocks > 0. With a disk tier the cache
 * finds the blocks stored before in the engine's file directory and
 * namespace (checking each header, not each payload: a damaged payload is
 * found when read), oldest first; beyond disk.blocks the oldest are
 * removed. The engine must outlive the cache. Fields left at their
 * KVF_CACHE_CONFIG_INIT values are taken from the environment (KVF_CACHE_*)
 * or the engine's config file, as kvf_setting_source says.
 * @return KVF_OK; KVF_ERR_INVALID when every tier is off, a tier lacks
 *         what it needs, a field is out of range, a tier is given both in
 *         blocks and in bytes, or a setting of the environment or file is
 *         bad; KVF_ERR_RANGE when host.blocks exceeds the secondary slots
 *         or a tier's bytes are less than one block; KVF_ERR_RESOURCE (or
 *         another file status) when the stored blocks cannot all be
 *         listed, out of file descriptors say: nothing is removed, and a
 *         create once the descriptors are free finds them all.
 */
KVF_API kvf_status kvf_cache_create(kvf_engine *engine, const kvf_cache_config *cfg,
                                    kvf_cache **cache_p);

/**
 * The cache's effective settings (cache_* names), with their sources, as
 * kvf_engine_settings; the tiers' blocks are those after rounding bytes.
 * Valid until the cache is destroyed.
 */
KVF_API kvf_status kvf_cache_settings(const kvf_cache *cache, const kvf_setting **settings_p,
                                      size_t *n_p);

/**
 * The settings of the engine and cache that `ecfg` and `ccfg` (either may be
 * NULL: all *_INIT values) would get now from the environment and config
 * file, without creating either: what `kvferry info --config` prints. The
 * cache tiers' bytes are not rounded to blocks here (no layout yet).
 * @param settings_p  receives an array of *n_p settings, one allocation:
 *        free it with kvf_settings_free.
 * @return KVF_OK, or the error create would give for a bad value or file.
 */
KVF_API kvf_status kvf_config_settings(const kvf_engine_config *ecfg, const kvf_cache_config *ccfg,
                                       kvf_setting **settings_p, size_t *n_p);

/**
 * The index-th field of kvf_engine_config as a setting, for a binding that
 * takes the settings by name: its config-file key ("backend", "file_dir",
 * ..., "config_file"; docs/configuration.md) and, where offset_p is not
 * NULL, the field's byte offset in kvf_engine_config. Every field's
 * default is its KVF_ENGINE_CONFIG_INIT value. NULL past the last.
 */
KVF_API const char *kvf_engine_config_key(size_t index, size_t *offset_p);

/** Frees what kvf_config_settings returned; NULL is fine. */
KVF_API void kvf_settings_free(kvf_setting *settings);

/** Waits for the cache's transfers in flight, then frees it. Blocks stay
 *  on disk for the next cache. Tickets not yet waited for are dropped. */
KVF_API void kvf_cache_destroy(kvf_cache *cache);

/**
 * The longest cached prefix of a request: how many of keys[0..n) are
 * cached, counting from keys[0] and stopping at the first miss. With a
 * remote tier, the keys after the local prefix are looked up there in one
 * round trip (an unreachable store counts as a miss). Counts hits
 * per tier and one miss (when *hits_p < n) in the stats; changes nothing
 * else (no recency, no pin: a block found here can be evicted before a
 * get unless pinned).
 * @param tiers  NULL, or n entries: the tier of each hit (first *hits_p).
 */
KVF_API kvf_status kvf_cache_lookup(kvf_cache *cache, const kvf_key *keys, size_t n, size_t *hits_p,
                                    kvf_tier *tiers);

/**
 * Stores whole blocks the engine has filled: keys[i] from primary slot
 * slots[i], at `priority` (0-100). Each block goes to the highest tier on,
 * evicting as needed. A key already cached is not copied again: its
 * priority and recency are refreshed. The blocks are visible to lookup and
 * get at once (a get queued after a put reads what the put wrote).
 * A put of a key held on disk copies it back into the host tier (the
 * engine hands its bytes back: hot blocks do not stay on disk). A key the
 * cache is removing while a caller still pins it (a failed get not yet
 * unpinned) is not stored again: KVF_ERR_STATE for it; unpin first.
 * @param ticket_p  receives a ticket for kvf_cache_wait / kvf_cache_poll,
 *        after which the primary slots may be written again; NULL: the
 *        cache follows the copies itself, and the caller must order later
 *        writes of those slots by kvf_sync_stream or an engine barrier.
 *        A block that fails to store (an I/O error, every victim pinned:
 *        KVF_ERR_NO_SPACE) is removed and reported by its status.
 * @return KVF_OK; KVF_ERR_INVALID, nothing stored, for a key 0 or a key
 *         given twice (kvf_last_error() names it and both indexes, as
 *         kvf_cache_commit refuses it); KVF_ERR_RANGE for a slot out of
 *         range.
 */
KVF_API kvf_status kvf_cache_put(kvf_cache *cache, const kvf_key *keys, const uint32_t *slots,
                                 size_t n, uint32_t priority, kvf_cache_ticket *ticket_p);

/**
 * Copies cached blocks into primary slots: keys[i] into slots[i], in one
 * engine batch per tier they are in. Every key must be cached: otherwise
 * KVF_ERR_NOT_FOUND naming the first missing key, and nothing is queued.
 * With a remote tier, keys not cached here are fetched from it instead
 * (not pinned: the store owns them), and one found missing there fails its
 * block with KVF_ERR_NOT_FOUND.
 * The blocks are pinned until the ticket is waited for or polled to
 * completion (wait for every get), and count as used (for LRU and disk
 * admission). A GPU-tier slot is a destination only while handed out. A block that fails its
 * status leaves its slot with no data to use: recompute it. Only evidence against the stored
 * block itself (KVF_ERR_CORRUPT, KVF_ERR_MISMATCH, KVF_ERR_NOT_FOUND, KVF_ERR_LOST) removes it
 * from the cache; one that failed for want of a resource (KVF_ERR_RESOURCE: out of file
 * descriptors, say), of memory, or for an I/O error stays cached and stored, and a later get
 * may read it.
 * @param ticket_p  required: the primary slots are valid once it completes.
 */
KVF_API kvf_status kvf_cache_get(kvf_cache *cache, const kvf_key *keys, const uint32_t *slots,
                                 size_t n, kvf_cache_ticket *ticket_p);

/**
 * Layer-wise kvf_cache_get: as kvf_cache_get, moving only the listed pools
 * (pools as for kvf_onboard_pools, in the order they should arrive; the
 * list is checked before anything is queued). kvf_cache_wait_pool blocks
 * until pool `pool` of every block has arrived; kvf_cache_stream_wait_pool
 * makes `stream` (a cudaStream_t) wait for it on the GPU instead (the
 * host waits only for batches not yet on the device). Neither retires the
 * ticket: kvf_cache_wait still must, and tells which blocks failed. They
 * return a block's failure already known, KVF_ERR_RANGE for a pool the
 * get does not move, and work on a plain kvf_cache_get's ticket too.
 */
KVF_API kvf_status kvf_cache_get_pools(kvf_cache *cache, const kvf_key *keys, const uint32_t *slots,
                                       size_t n, const uint32_t *pools, size_t n_pools,
                                       kvf_cache_ticket *ticket_p);
KVF_API kvf_status kvf_cache_wait_pool(kvf_cache *cache, kvf_cache_ticket ticket, uint32_t pool);
KVF_API kvf_status kvf_cache_stream_wait_pool(kvf_cache *cache, kvf_cache_ticket ticket,
                                              uint32_t pool, void *stream);
/**
 * A wait for a late load that can be given up: as kvf_cache_stream_wait_pool
 * (stream may be NULL: the host waits), but once `within_s` seconds have
 * passed since the get was submitted with the pool neither arrived nor
 * queued on the device, KVF_ERR_TIMEOUT and the ticket untouched. The get
 * runs on: its blocks stay cached and stored, its slots are written when
 * its reads end, and it still must be waited for or polled to completion
 * (before the slots are reused by anything but the engine's own moves,
 * which are ordered after it). A caller that gives up recomputes what the
 * get was to bring and reads none of its slots: a pool not arrived is
 * never handed over as valid. A pool already queued on the device (CUDA
 * copies from the host tier) is waited for, as it is no longer late.
 * kvf_plan.hedge_s is the limit that keeps a plan within its margin of
 * recomputing (docs/planner.md).
 * @return as kvf_cache_stream_wait_pool; KVF_ERR_TIMEOUT past the limit;
 *         KVF_ERR_INVALID for within_s negative or not finite.
 */
KVF_API kvf_status kvf_cache_wait_pool_by(kvf_cache *cache, kvf_cache_ticket ticket, uint32_t pool,
                                          void *stream, double within_s);

/**
 * Blocks until a put or get completes; then as kvf_wait: per_block (NULL or
 * the call's block count) gets each block's status, the return is KVF_OK
 * or the first failure, and the ticket is retired. One thread waits for a
 * ticket: while it does, another thread's wait, poll or wait_pool of the
 * same ticket returns KVF_ERR_STATE at once, and once the ticket is
 * retired KVF_ERR_UNKNOWN_TICKET; neither is ever a block's status.
 */
KVF_API kvf_status kvf_cache_wait(kvf_cache *cache, kvf_cache_ticket ticket, kvf_status *per_block);
/** As kvf_cache_wait without blocking: KVF_INPROGRESS while it runs. */
KVF_API kvf_status kvf_cache_poll(kvf_cache *cache, kvf_cache_ticket ticket, kvf_status *per_block);

/**
 * As kvf_cache_wait, and hands over each failed block's message, as
 * kvf_wait_errors does for an engine batch: index is the block's position
 * in the put, get, acquire or alloc call; the message names the block's
 * key and tier and quotes the engine's message for its move (file path,
 * slot, node and reason), or says why the cache itself failed it (e.g.
 * every victim pinned). Same cost and lifetime: nothing kept for blocks
 * that succeed, one bounded message per failed block until the ticket
 * retires. A failed kvf_cache_wait leaves the first one in
 * kvf_last_error().
 */
KVF_API kvf_status kvf_cache_wait_errors(kvf_cache *cache, kvf_cache_ticket ticket,
                                         kvf_status *per_block, kvf_move_error *errors, size_t cap,
                                         size_t *n_errors_p);
/** As kvf_cache_wait_errors without blocking: KVF_INPROGRESS, nothing
 *  written, while it runs. */
KVF_API kvf_status kvf_cache_poll_errors(kvf_cache *cache, kvf_cache_ticket ticket,
                                         kvf_status *per_block, kvf_move_error *errors, size_t cap,
                                         size_t *n_errors_p);

/**
 * Pins cached blocks for a running request: a pinned block is never
 * evicted. Pins nest; each pin needs one unpin. Keys not cached are
 * skipped: *pinned_p (may be NULL) says how many were pinned.
 */
KVF_API kvf_status kvf_cache_pin(kvf_cache *cache, const kvf_key *keys, size_t n, size_t *pinned_p);
/** Undoes one pin of each key; KVF_ERR_STATE names a key not pinned. */
KVF_API kvf_status kvf_cache_unpin(kvf_cache *cache, const kvf_key *keys, size_t n);

/**
 * Removes blocks from every tier (their files too), e.g. when a model's
 * weights change. Pinned blocks are removed once unpinned. Keys not cached
 * are skipped; *removed_p (may be NULL) counts the others.
 */
KVF_API kvf_status kvf_cache_remove(kvf_cache *cache, const kvf_key *keys, size_t n,
                                    size_t *removed_p);

/*
 * The GPU tier (gpu.blocks > 0). A request's life with it:
 *   kvf_cache_acquire(keys)      its cached prefix, in GPU slots, pinned
 *   kvf_cache_alloc(n)           GPU slots for the blocks it computes
 *   ... prefill into them ...
 *   kvf_cache_commit(keys, slots) those blocks cached in the GPU tier, pinned
 *   kvf_cache_unpin(keys)        the request ends: its blocks may be evicted
 * An unpinned GPU block is evicted when slots are needed: it moves down to
 * the host tier (or disk, or is dropped) like any victim.
 */

/**
 * Hands out `n` GPU slots, into slots[0..n), for the caller to fill, evicting unpinned GPU
 * blocks down the tiers when none are free. The slots are the caller's
 * until kvf_cache_commit or kvf_cache_free.
 * @param ticket_p  receives a ticket for kvf_cache_wait: the slots may be
 *        written once it completes (an evicted block is still being
 *        copied out of its slot until then).
 * @return KVF_ERR_NO_SPACE, nothing allocated, when fewer than n slots can
 *         be found (every other GPU block pinned or handed out).
 */
KVF_API kvf_status kvf_cache_alloc(kvf_cache *cache, uint32_t *slots, size_t n,
                                   kvf_cache_ticket *ticket_p);

/**
 * The caller has filled allocated slots: block keys[i] in slots[i] enters
 * the GPU tier, pinned once for the caller's request. A copy of the key in
 * a lower tier, or an unpinned one in the GPU tier, is replaced (a block
 * lives in one tier, in one slot). Where the key's copy is in use by
 * another request (pinned, or being read), the new block is not committed:
 * per_block[i] is KVF_ERR_STATE and slots[i] stays handed out to the
 * caller, to use privately and give back with kvf_cache_free.
 * @param per_block  NULL, or n statuses.
 * @return KVF_OK when every block was committed, else the first block's
 *         failure; KVF_ERR_INVALID, nothing committed, for a slot not
 *         handed out or given twice, or a key given twice.
 */
KVF_API kvf_status kvf_cache_commit(kvf_cache *cache, const kvf_key *keys, const uint32_t *slots,
                                    size_t n, uint32_t priority, kvf_status *per_block);

/** Gives back allocated slots that were not committed. */
KVF_API kvf_status kvf_cache_free(kvf_cache *cache, const uint32_t *slots, size_t n);

/**
 * The longest cached prefix of keys[0..n) in GPU slots, for a request:
 * blocks in the GPU tier are pinned where they are; blocks in the host or
 * disk tier are copied into GPU slots (allocated as kvf_cache_alloc does)
 * and move to the GPU tier, pinned. slots[i] receives block i's slot for
 * i < *hits_p; keys[] names each block once (KVF_ERR_INVALID otherwise).
 * Each acquired block needs one kvf_cache_unpin. The remote
 * tier is not consulted here (use kvf_cache_get into allocated slots).
 * @param ticket_p  receives a ticket; the slots hold the blocks once it
 *        completes. A block that could not be read back fails its status
 *        there: recompute it. One read from disk that failed for want of
 *        a resource, of memory, or for an I/O error (not a damaged or
 *        missing file) goes back to the disk tier, its file kept; others
 *        are removed when unpinned. A block's file is removed once the
 *        acquire that brought it up is waited for.
 */
KVF_API kvf_status kvf_cache_acquire(kvf_cache *cache, const kvf_key *keys, size_t n,
                                     uint32_t *slots, size_t *hits_p, kvf_cache_ticket *ticket_p);

/**
 * Drains up to `cap` queued events, oldest first, into out[].
 * @return the number written; 0 when none are queued (or no queue).
 */
KVF_API size_t kvf_cache_events(kvf_cache *cache, kvf_cache_event *out, size_t cap);

/** Transfer latencies are counted in buckets of these upper bounds, in
 *  microseconds: 16, 32, 64, ..., 2^(4+i); the last bucket is unbounded. */
#define KVF_CACHE_LATENCY_BUCKETS 20

/** Per-tier counters are arrays of this many, indexed by kvf_tier, so
 *  that a tier added later does not move the fields after them (entries
 *  from KVF_TIER_COUNT on are 0). */
#define KVF_CACHE_TIER_SLOTS 8

/** Counters since the cache was created, and its content now. */
typedef struct kvf_cache_stats {
    size_t struct_size;
    uint64_t blocks[KVF_CACHE_TIER_SLOTS];    /* blocks in each tier now */
    uint64_t capacity[KVF_CACHE_TIER_SLOTS];  /* configured capacity, blocks */
    uint64_t lookups;                         /* kvf_cache_lookup calls */
    uint64_t hits[KVF_CACHE_TIER_SLOTS];      /* blocks found by lookups, per tier */
    uint64_t misses;                          /* lookups that stopped at a miss */
    uint64_t lookup_blocks;                   /* keys asked for by lookups */
    uint64_t puts, put_duplicates;            /* blocks handed to put; of those already cached */
    uint64_t gets;                            /* blocks asked for by get */
    uint64_t bytes_in[KVF_CACHE_TIER_SLOTS];  /* bytes written into each tier */
    uint64_t bytes_out[KVF_CACHE_TIER_SLOTS]; /* bytes read from each tier into primary slots */
    uint64_t
        evictions[KVF_CACHE_TIER_SLOTS]; /* victims leaving each tier (moved down or dropped) */
    uint64_t dropped;                    /* blocks that left the cache by eviction */
    uint64_t failures;                   /* blocks removed because a transfer failed */
    uint64_t events_dropped;             /* events lost to a full queue */
    /* get and put transfers, from submit to completion as the cache saw it */
    uint64_t latency_us[KVF_CACHE_LATENCY_BUCKETS];
    uint64_t latency_count;
    uint64_t latency_sum_us;
    /* remote operations that failed: unreachable, timed out, or a value
     * that failed its checks (a miss, never data) */
    uint64_t remote_errors;
} kvf_cache_stats;

#define KVF_CACHE_STATS_INIT                                                                       \
    {                                                                                              \
        .struct_size = sizeof(kvf_cache_stats)                                                     \
    }

/** Fills `stats` (its struct_size set by KVF_CACHE_STATS_INIT). */
KVF_API kvf_status kvf_cache_stats_get(kvf_cache *cache, kvf_cache_stats *stats);

/**
 * The stats in the Prometheus text exposition format (metrics named
 * kvferry_cache_*), NUL-terminated, into buf[0..cap).
 * @param len_p  receives the length without the NUL; when it is >= cap the
 *        text was cut: call again with a buffer of *len_p + 1 bytes.
 */
KVF_API kvf_status kvf_cache_stats_prometheus(kvf_cache *cache, char *buf, size_t cap,
                                              size_t *len_p);

/* ------------------------------------------------------------------------ */
/* Costs and the load-or-recompute planner                                  */
/* ------------------------------------------------------------------------ */

/*
 * A cache hit is worth loading only when loading it is faster than
 * computing it again. The engine keeps, per tier, what a batch read into
 * primary slots costs (kvf_tier_cost: a latency per batch plus bytes over
 * a throughput), learnt from its own completed onboards; the caller says
 * what its model's prefill costs (kvf_prefill_cost); kvf_cache_plan (or the
 * pure kvf_plan_compute) then chooses how many leading hits to load and
 * from which token to recompute, to minimise the predicted time to the
 * first token. docs/planner.md gives the model.
 */

/** One tier's read cost into primary slots: a batch of B bytes takes
 *  latency_s + B / bytes_per_s seconds. */
typedef struct kvf_tier_cost {
    double latency_s;   /* per batch, >= 0 */
    double bytes_per_s; /* > 0 */
    uint64_t observed; /* completed batches learnt from (0: the starting estimate or a set value) */
    int held;          /* 1: set with hold, observations do not change it */
} kvf_tier_cost;

/** Every tier's cost, indexed by kvf_tier (entries from KVF_TIER_COUNT on are 0). */
typedef struct kvf_costs {
    size_t struct_size;
    kvf_tier_cost tier[KVF_CACHE_TIER_SLOTS];
} kvf_costs;

#define KVF_COSTS_INIT                                                                             \
    {                                                                                              \
        .struct_size = sizeof(kvf_costs)                                                           \
    }

/**
 * The engine's current read costs. Each tier starts from a seed (listed in
 * docs/planner.md) and learns from every onboard batch from it that
 * completes with all moves OK: the batch's bytes and its time from submit
 * to completion (queueing behind other batches included: a busy link
 * reads as a slow one). The figures are a fit to the tier's latest 24
 * reads by medians: the throughput from pairs of reads of different
 * sizes, the latency from the smaller reads (while all are of one size,
 * the latency stays and the throughput fits them), so one outlier or a
 * cold first read cannot swing a plan, while a tier that stays slower is
 * followed within a dozen batches (docs/planner.md). KVF_TIER_GPU is learnt from copies between
 * primary slots. A learnt cost whose newest read is a minute old is
 * forgotten (observed 0 again): the tier returns to where it started (its
 * seed, the last value set, or the last kvf_engine_calibrate's fit), so a
 * tier that turned slow, and that plans therefore stopped reading, is read
 * and learnt again once it may have recovered. Held costs are never
 * forgotten. Safe from any thread.
 */
KVF_API kvf_status kvf_engine_costs(kvf_engine *engine, kvf_costs *costs);

/**
 * The tiers (bit 1 << tier) whose blocks the layer-wise calls
 * (kvf_cache_get_pools, kvf_wait_pool) deliver pool by pool on this
 * engine: DISK on every backend (pool group by pool group:
 * kvf_engine_arrival_groups), REMOTE on every backend where the engine
 * has a remote tier (its values in ranged reads, pool group by pool
 * group), HOST and GPU on the CUDA backend, whose copies the GPU orders.
 * What kvf_plan_input.layerwise_tiers takes. 0 for NULL.
 */
KVF_API uint32_t kvf_engine_layerwise_tiers(const kvf_engine *engine);

/**
 * In how many steps a layer-wise load from `tier` arrives on this engine:
 * the pool groups of a read from DISK (consecutive pools of at least 256
 * KiB of a block, at most 32; $KVF_DISK_GROUP_BYTES sets the minimum) or
 * from REMOTE (Redis 256 KiB, S3 32 MiB; $KVF_REMOTE_GROUP_BYTES), the
 * pool count for HOST and GPU on the CUDA backend, 0 for a tier that
 * arrives whole (kvf_engine_layerwise_tiers) and for NULL. What
 * kvf_plan_input.arrival_steps takes.
 */
KVF_API uint32_t kvf_engine_arrival_groups(const kvf_engine *engine, kvf_tier tier);

/**
 * Sets a tier's cost, e.g. from a calibration or a measurement of the
 * caller's own. hold = 0: a new starting point that observations keep
 * updating; hold = 1: fixed until set again.
 * @return KVF_ERR_INVALID (nothing changed, kvf_last_error() names the
 *         field) for a tier outside HOST..GPU, a latency that is negative
 *         or not finite, or a throughput that is not positive and finite.
 */
KVF_API kvf_status kvf_engine_set_tier_cost(kvf_engine *engine, kvf_tier tier, double latency_s,
                                            double bytes_per_s, int hold);

/**
 * Feeds one observed read of `bytes` from `tier` that took `seconds`, as
 * the engine does for its own batches (e.g. a transfer the caller timed
 * itself). Ignored while the tier's cost is held. KVF_ERR_INVALID for
 * bytes = 0 or seconds not positive and finite.
 */
KVF_API kvf_status kvf_engine_observe_tier_cost(kvf_engine *engine, kvf_tier tier, uint64_t bytes,
                                                double seconds);

/**
 * Times reads of `n` blocks from each tier the engine has (HOST when its
 * pools have secondary slots, DISK with a file directory, REMOTE with a
 * store), writing scratch blocks first: batches of 1 and of n blocks,
 * `rounds` times each, fed to the costs as observations, so that a tier
 * with no history gets real figures before the first request.
 * The primary slots slots[0..n) and secondary slots host_slots[0..n)
 * (NULL: HOST is not timed) are the caller's scratch: their contents are
 * overwritten. Scratch keys are {key_base.hi, key_base.lo + 0..n-1} (then
 * removed); they must not name stored blocks. Not while the same slots are
 * in use.
 */
KVF_API kvf_status kvf_engine_calibrate(kvf_engine *engine, const uint32_t *slots,
                                        const uint32_t *host_slots, size_t n, kvf_key key_base,
                                        uint32_t rounds);

/** A caller's prefill cost: *seconds_p for `new_tokens` tokens computed
 *  after `prefix_tokens` already in the KV cache. Return KVF_OK, or an
 *  error status that fails the plan (with the function's message). */
typedef kvf_status (*kvf_prefill_fn)(void *user, uint64_t new_tokens, uint64_t prefix_tokens,
                                     double *seconds_p);

/**
 * What the engine's forward pass costs, from a table or a function.
 *
 * Table: seconds[p * n_new + j] is the time to compute new_tokens[j]
 * tokens after prefix_tokens[p] cached ones. Both axes strictly
 * increasing; every entry finite and >= 0, and non-decreasing along both
 * axes (more tokens, or a longer prefix, never cost less). Between points
 * it is interpolated bilinearly; beyond the last point extrapolated from
 * the last two (linear), below the first prefix row it takes that row,
 * and 0 new tokens cost 0 s. With n_prefix = 0 (prefix_tokens NULL) the
 * table is one row of full prefills from an empty cache, T(tokens), and
 * new tokens after a prefix cost T(prefix + new) - T(prefix).
 * Function: fn(user, ...) instead (table fields 0); its results are
 * checked as the table's are (finite, >= 0) when a plan calls it, and
 * more new tokens after prefix 0 must not cost less than fewer (the
 * front shape's search relies on it).
 *
 * layers: the model's layers; overlap = 1: the engine loads layer by
 * layer (kvf_cache_get_pools and its pool waits) and computes layer l as
 * soon as layer l's blocks arrived, so loading and computing overlap.
 *
 * min_gain: a split (some hits loaded, others recomputed) is chosen only
 * where it predicts at least this fraction less than the better of the
 * pure policies (recompute all, load all); in [0, 1). A prediction is an
 * estimate: a split whose predicted gain is within its error can measure
 * slower than the pure policy it was meant to beat. KVF_PREFILL_COST_INIT
 * sets KVF_PLAN_MIN_GAIN; 0 takes any split that predicts less.
 *
 * leading_only = 1: the engine computes a request's tokens only after its
 * loaded blocks, which must be the leading ones (vLLM's connector: the
 * tokens it reports matched are loaded, the rest computed after them), so
 * the plan never computes a front while loading the back.
 */
typedef struct kvf_prefill_cost {
    size_t struct_size;
    const uint64_t *new_tokens;
    size_t n_new;
    const uint64_t *prefix_tokens;
    size_t n_prefix;
    const double *seconds;
    kvf_prefill_fn fn;
    void *user;
    uint32_t layers;
    int overlap;
    double min_gain;
    int leading_only;
} kvf_prefill_cost;

/** The default min_gain: a split must predict 10 % less than the better
 *  pure policy. Splits from a disk that loads beside the computation have
 *  measured up to 15 % above their prediction, and (1 - 0.10) * 1.15 keeps
 *  such a split within 1.05x of the pure policy it was chosen over. */
#define KVF_PLAN_MIN_GAIN 0.10

/* The earliest a plan's hedge gives its loads up (kvf_plan.hedge_s), in
 * seconds after the get: before it, a late pool cannot be told from a
 * worker thread that has not run yet. A thread woken on a busy core runs
 * within one scheduling period of up to 8 runnable threads: 24 ms on Linux
 * with 8 or more cores (CFS's sched_latency, 6 ms x (1 + log2 8); EEVDF's
 * 3 ms slice x 8). Measured on a 2-core host at load 8, a 40-block get
 * from the host tier took 0.08 ms at the median, 7.5 ms at the 99th
 * percentile. */
#define KVF_PLAN_HEDGE_MIN_S 0.024

#define KVF_PREFILL_COST_INIT                                                                      \
    {                                                                                              \
        .struct_size = sizeof(kvf_prefill_cost), .min_gain = KVF_PLAN_MIN_GAIN                     \
    }

/**
 * Checks a prefill cost as a plan would use it.
 * @return KVF_OK, or KVF_ERR_INVALID with kvf_last_error() naming the
 *         entry: an empty table, a NULL array, both a table and a
 *         function, an axis not strictly increasing, a negative, NaN or
 *         infinite time, a time lower than the one before it on an axis,
 *         a min_gain outside [0, 1).
 */
KVF_API kvf_status kvf_prefill_cost_check(const kvf_prefill_cost *cost);

/** The inputs of one plan (kvf_plan_compute). */
typedef struct kvf_plan_input {
    size_t struct_size;
    const kvf_tier *tiers; /* the tier of each cached leading block, hits entries */
    size_t hits;
    uint64_t block_bytes;      /* one block of every pool */
    uint32_t tokens_per_block; /* > 0 */
    uint64_t request_tokens;   /* the request's prompt, > 0 */
    kvf_costs costs;
    const kvf_prefill_cost *prefill;
    /* tiers (bit 1 << tier) whose blocks arrive layer by layer when loaded
     * with the layer-wise calls (kvf_engine_layerwise_tiers says which);
     * the others arrive whole (REMOTE, and HOST and GPU on the host
     * backend) */
    uint32_t layerwise_tiers;
    /* per layer-wise tier (indexed by kvf_tier; entries from
     * KVF_TIER_COUNT on are 0), in how many steps its loads arrive
     * (kvf_engine_arrival_groups: DISK's pool groups); 0: a step per layer
     * of the prefill cost. Added after layerwise_tiers: a caller built
     * against an older header (a smaller struct_size) gets 0s */
    uint32_t arrival_steps[KVF_CACHE_TIER_SLOTS];
    /* what requests served by earlier plans took against their
     * predictions (kvf_cache_observe_plan; kvf_cache_plan fills them in):
     * every shape that loads predicts its model's time x load_ratio,
     * recomputing everything its model's time x recompute_ratio. Finite
     * and > 0; 0 (an older caller's struct): 1, the model as it is */
    double load_ratio;
    double recompute_ratio;
} kvf_plan_input;

#define KVF_PLAN_INPUT_INIT                                                                        \
    {                                                                                              \
        .struct_size = sizeof(kvf_plan_input), .costs = KVF_COSTS_INIT                             \
    }

/** What to load and what to recompute, and what each choice would take.
 *  Loads are keys[load_first .. load_blocks). compute_s is every forward
 *  pass of the plan (the front's, when load_first > 0, and the rest's). */
typedef struct kvf_plan {
    size_t struct_size;
    size_t hits;                                   /* cached leading blocks */
    size_t load_blocks;                            /* load keys[0 .. load_blocks) */
    uint64_t load[KVF_CACHE_TIER_SLOTS];           /* of those, per tier */
    uint64_t recompute_hits[KVF_CACHE_TIER_SLOTS]; /* hits the plan recomputes, per tier */
    uint64_t recompute_from;                       /* first token to compute: load_blocks * tpb */
    uint64_t compute_tokens;                       /* request_tokens - recompute_from */
    double ttft_s;                                 /* predicted time to the first token */
    double load_s;                                 /* of which: the loads alone */
    double compute_s;                              /* and the forward pass alone */
    double ttft_recompute_s;                       /* predicted with every hit recomputed */
    double ttft_load_all_s;                        /* predicted with every usable hit loaded */
    int overlap;                                   /* the prediction overlapped loads and layers */
    /* first hit loaded: 0, or F > 0 for the front shape, where tokens
     * 0 .. F * tpb are computed from scratch while keys[F .. load_blocks)
     * load, then recompute_from .. N over the full cache */
    size_t load_first;
    /* the best split's prediction, chosen or not (min_gain); 0: no split
     * possible (fewer than 2 usable hits) */
    double ttft_split_s;
    /* the hedge: seconds after the get is submitted by which its blocks
     * must have arrived; past it, stop waiting (kvf_cache_wait_pool_by)
     * and recompute what the get was to bring: tokens load_first * tpb ..
     * N after the front (0 .. N for the leading shape), which then ends
     * within (1 + min_gain) x ttft_recompute_s; never before the loads
     * are due plus min_gain of them, nor before KVF_PLAN_HEDGE_MIN_S (a
     * model whose recompute takes less waits that long: giving up earlier
     * would fire on a thread's wake-up, not a late tier) (docs/planner.md).
     * 0: nothing loaded */
    double hedge_s;
    /* the forward pass that follows a hedge: tokens load_first * tpb .. N
     * after the front's load_first * tpb */
    double fallback_s;
    /* the ratios applied (kvf_plan_input's; 1 where none): ttft_s,
     * ttft_load_all_s and ttft_split_s of shapes that load are their
     * model's times x load_ratio, ttft_recompute_s x recompute_ratio, and
     * the hedge is reckoned from them; load_s, compute_s and fallback_s
     * are the model's own */
    double load_ratio;
    double recompute_ratio;
    /* when the loads' first layers are predicted in, seconds after the
     * get (a tier arriving in S steps: its latency and a step's bytes;
     * one arriving whole: load_s); 0: nothing loaded. A caller that
     * watches its loads layer by layer compares them with the line from
     * here to load_s (docs/planner.md, the hedge) */
    double first_s;
} kvf_plan;

#define KVF_PLAN_INIT                                                                              \
    {                                                                                              \
        .struct_size = sizeof(kvf_plan)                                                            \
    }

/**
 * Chooses the plan with the least predicted time to the first token among
 * - recompute all (nothing loaded);
 * - load the leading hits keys[0 .. K), then compute tokens K * tpb .. N
 *   (overlapped layer by layer where the prefill cost says overlap and the
 *   tier delivers pool by pool);
 * - compute the front, load the back: tokens 0 .. F * tpb computed from
 *   scratch while keys[F .. K) load (any tier, whole batches), then tokens
 *   K * tpb .. N over the full cache (load_first = F > 0, overlap = 0).
 * A split (0 < K < all usable hits, or the front shape) is taken only
 * where it predicts at least the prefill cost's min_gain less than the
 * better pure policy; a tie between the two pure policies goes to
 * recompute. At least one token is always computed after the loads (the
 * first token's logits need a forward pass), so K * tpb < N. Among
 * splits, ties go to less traffic (fewer blocks loaded). Pure: no
 * engine, no cache.
 * @return KVF_OK; KVF_ERR_INVALID (plan untouched, kvf_last_error() names
 *         the input) for a NULL, a zero block size or token count, a
 *         tier outside HOST..GPU, a tier cost that is negative, zero,
 *         subnormal (a throughput) or not finite, or a prefill cost
 *         kvf_prefill_cost_check refuses, or a prefill function that
 *         charges more tokens after prefix 0 less than fewer;
 *         KVF_ERR_RANGE (plan untouched) when finite costs or table
 *         entries still give a time that is not (a table near DBL_MAX
 *         extended, a throughput of 1e-305 B/s): every time a plan
 *         reports is finite; the prefill function's own status when it
 *         fails; KVF_ERR_NOMEM.
 */
KVF_API kvf_status kvf_plan_compute(const kvf_plan_input *in, kvf_plan *plan);

/**
 * Sets the cache's prefill cost, used by kvf_cache_plan. The table's
 * arrays are copied; a function and its user pointer must stay valid
 * until replaced or the cache is destroyed. NULL clears it.
 * @return KVF_ERR_INVALID, nothing changed, where kvf_prefill_cost_check
 *         refuses it.
 */
KVF_API kvf_status kvf_cache_set_prefill_cost(kvf_cache *cache, const kvf_prefill_cost *cost);

/**
 * Looks up keys[0..n) as kvf_cache_lookup does (counted as a lookup in the
 * stats) and plans the request of `request_tokens` tokens over the hits,
 * with the engine's current costs (kvf_engine_costs) and the cache's
 * prefill cost. Layer-wise arrival is assumed for the engine's
 * kvf_engine_layerwise_tiers, when the prefill cost says overlap.
 * @param tiers  NULL, or n entries: the tier of each hit, as lookup's.
 * @return KVF_ERR_STATE when no prefill cost was set; as kvf_plan_compute
 *         otherwise.
 */
KVF_API kvf_status kvf_cache_plan(kvf_cache *cache, const kvf_key *keys, size_t n,
                                  uint64_t request_tokens, kvf_tier *tiers, kvf_plan *plan);

/** What the cache learnt from the requests its plans served
 *  (kvf_cache_observe_plan): measured over predicted time to the first
 *  token, the median of the latest KVF_PLAN_LEARN_WINDOW requests of each
 *  kind (plans that load, plans that recompute everything), 1 while fewer
 *  than KVF_PLAN_LEARN_MIN of that kind are in the window. */
typedef struct kvf_plan_learnt {
    size_t struct_size;
    double load_ratio;
    double recompute_ratio;
    uint32_t load_observed;      /* plans that loaded, in the window */
    uint32_t recompute_observed; /* plans that recomputed everything, in the window */
} kvf_plan_learnt;

#define KVF_PLAN_LEARNT_INIT                                                                       \
    {                                                                                              \
        .struct_size = sizeof(kvf_plan_learnt)                                                     \
    }

/** The requests a cache learns its plans' error from: the latest this
 *  many, of both kinds together (a kind not served for this many requests
 *  is forgotten, and its plans trusted again). */
#define KVF_PLAN_LEARN_WINDOW 16
/** A kind's ratio departs from 1 once this many of its requests are in
 *  the window: one slow request is not yet a slow tier. */
#define KVF_PLAN_LEARN_MIN 3
/** A plan predicting less than this (seconds) teaches nothing: a
 *  request's time that short is its caller's own steps, whose ratio to a
 *  prediction of ~0 says nothing of its costs. */
#define KVF_PLAN_LEARN_MIN_S 0.001

/**
 * Teaches the cache what a request that followed `plan` (from
 * kvf_cache_plan, with its ratios) took: `ttft_s`, from the plan to its
 * first token, measured by the caller, all of it (its own work between
 * the calls, a hedge's recompute). Later plans scale their predictions by
 * the learnt ratios (kvf_plan_input.load_ratio): a load that runs slower
 * than its model, for whatever reason the model leaves out, makes loading
 * predict slower until recomputing wins where it should. The tiers' costs
 * are not touched (a held cost stays held). A plan predicting less than
 * KVF_PLAN_LEARN_MIN_S teaches nothing; kvf_cache_set_prefill_cost
 * forgets what was learnt.
 * @return KVF_OK; KVF_ERR_INVALID, nothing learnt, for a NULL, a plan
 *         whose struct_size or predictions are not a plan's, or a ttft_s
 *         negative, NaN or infinite (kvf_last_error() names it).
 */
KVF_API kvf_status kvf_cache_observe_plan(kvf_cache *cache, const kvf_plan *plan, double ttft_s);
/** What kvf_cache_observe_plan has taught the cache's plans so far. */
KVF_API kvf_status kvf_cache_plan_learnt(kvf_cache *cache, kvf_plan_learnt *out);

/* ------------------------------------------------------------------------ */
/* Machine information                                                      */
/* ------------------------------------------------------------------------ */

/** What probing cuFile found, worst to best. */
typedef enum kvf_gds_state {
    KVF_GDS_STATE_ABSENT = 0,  /* no libcufile (or a build without CUDA) */
    KVF_GDS_STATE_REFUSED = 1, /* loaded, but its driver would not open,
                                * or no CUDA device to open it for */
    KVF_GDS_STATE_COMPAT = 2,  /* open, no P2P path: cuFile's compatibility
                                  mode (POSIX I/O through its own bounce
                                  buffers) */
    KVF_GDS_STATE_P2P = 3      /* open, nvidia-fs loaded or P2P DMA offered */
} kvf_gds_state;

/** What this machine offers kvferry. */
typedef struct kvf_info {
    size_t struct_size;
    int cuda_built;     /* the library was built with CUDA */
    int cuda_devices;   /* usable GPUs; 0 without a driver or device */
    int cuda_runtime;   /* CUDART_VERSION, e.g. 13000; 0 without CUDA */
    int cufile_present; /* libcufile can be loaded */
    int uring_built;    /* built with liburing */
    char device_name[128];
    char cuda_error[128];    /* why no device is usable, when none is */
    int remote_built;        /* every remote store of this build's registry can be
                                opened (today: the Redis client, hiredis, was
                                found at build time); kvf_store_info_get says
                                which store has what */
    kvf_gds_state gds_state; /* what probing cuFile found */
    char gds_detail[160];    /* what the probe found, or why not */
} kvf_info;

#define KVF_INFO_INIT                                                                              \
    {                                                                                              \
        sizeof(kvf_info), 0, 0, 0, 0, 0, {0}, {0}, 0, KVF_GDS_STATE_ABSENT,                        \
        {                                                                                          \
            0                                                                                      \
        }                                                                                          \
    }

/** Fills `info` (its struct_size set by KVF_INFO_INIT). */
KVF_API kvf_status kvf_info_get(kvf_info *info);

/** One store this library knows: a place blocks are kept (block files,
 *  Redis, this process's memory), the URL schemes it serves, and whether
 *  this build has it. */
typedef struct kvf_store_info {
    size_t struct_size;
    char name[32];     /* "file", "redis", "mem" */
    char schemes[128]; /* the URL schemes it serves, space-separated: "redis:// redis-cluster://" */
    int built;         /* this build can open it */
    int remote;        /* it can be an engine's remote tier (kvf_engine_config.remote.url) */
    char detail[256];  /* built: what it is built with ("hiredis 1.2.0, TLS (rediss://)");
                          else what the build lacks and how to get it */
} kvf_store_info;

#define KVF_STORE_INFO_INIT                                                                        \
    {                                                                                              \
        sizeof(kvf_store_info), {0}, {0}, 0, 0,                                                    \
        {                                                                                          \
            0                                                                                      \
        }                                                                                          \
    }

/**
 * The index-th store of this library (0, 1, ... in `kvferry info`'s order).
 * @param info  from KVF_STORE_INFO_INIT; filled on KVF_OK.
 * @return KVF_OK; KVF_ERR_NOT_FOUND past the last store (every index
 *         before it is valid); KVF_ERR_INVALID for a NULL or short info.
 */
KVF_API kvf_status kvf_store_info_get(size_t index, kvf_store_info *info);

/* ------------------------------------------------------------------------ */
/* Inspecting stored blocks: block directories and remote stores            */
/* ------------------------------------------------------------------------ */

/*
 * These calls look at what engines stored, without an engine: a block
 * directory (kvf_engine_config.file.dir: one folder per namespace, a file
 * <key as 32 hex digits>.kvf per block) and a remote store's URL. They
 * read only: nothing is created, removed or repaired, and no file is ever
 * opened in a way that could block (a FIFO under a block's name is
 * reported, never waited on). They may run while engines write to the
 * same directory: a block removed meanwhile is skipped, one being written
 * shows as its temporary file (KVF_DIR_ENTRY_TORN). Every call is safe
 * from several threads at once; callbacks run on the calling thread,
 * before the call returns, and may call any kvferry function.
 */

/** The URL's environment variable: the remote store an engine uses when
 *  kvf_engine_config.remote.url is NULL, and kvf_remote_probe's default. */
#define KVF_REMOTE_URL_ENV "KVF_REMOTE_URL"

/** What kvf_dir_check found under one name of a namespace. */
typedef enum kvf_dir_entry_kind {
    KVF_DIR_ENTRY_GOOD = 0,       /* header, layout, namespace, length, pool table and
                                     each pool's checksum check */
    KVF_DIR_ENTRY_CORRUPT = 1,    /* a block file whose bytes fail a check (KVF_ERR_CORRUPT) */
    KVF_DIR_ENTRY_TORN = 2,       /* the temporary file of a write that did not finish */
    KVF_DIR_ENTRY_MISMATCH = 3,   /* a sound block of another layout or namespace
                                     (KVF_ERR_MISMATCH) */
    KVF_DIR_ENTRY_FOREIGN = 4,    /* not a regular file under a block's name: a FIFO,
                                     directory, link... kvferry never wrote it */
    KVF_DIR_ENTRY_UNREADABLE = 5, /* the read failed for a reason that says nothing
                                     about the file (out of descriptors or memory,
                                     an I/O error): not checked */
    KVF_DIR_ENTRY_OLD_FORMAT = 6  /* a block of format version 1 (64-bit keys,
                                     <16 hex digits>.kvf) or 2 (one checksum per block,
                                     no pool table): never served; kvf_dir_upgrade
                                     (kvferry fsck --upgrade) rewrites it */
} kvf_dir_entry_kind;

/** Name of a kind ("good", "corrupt", "torn", "mismatch", "foreign",
 *  "unreadable", "old-format"); "?" for another value. */
KVF_API const char *kvf_dir_entry_kind_name(kvf_dir_entry_kind kind);

/** One name of a namespace, as kvf_dir_check reports it. */
typedef struct kvf_dir_entry {
    kvf_key key;             /* the block's key (a torn file's: the block it was for;
                                an old-format file's: {0, its 64-bit key}) */
    kvf_dir_entry_kind kind; /* the verdict; decide on this, never on `message` */
    kvf_status status;       /* KVF_OK when GOOD; else the read's status */
    /* "ok", or what is wrong, naming the key and file. Valid only during
     * the callback. */
    const char *message;
    uint32_t tokens, pools; /* GOOD only: tokens stored, pools in the block */
    uint64_t payload_bytes; /* GOOD only: bytes after the header */
} kvf_dir_entry;

/** Entries of each kind, summed over one or more kvf_dir_check calls. */
typedef struct kvf_dir_counts {
    uint64_t good, corrupt, torn, mismatch, foreign, unreadable;
    uint64_t old_format; /* version-1 blocks (kvf_dir_upgrade) */
    uint64_t upgraded;   /* kvf_dir_upgrade: version-1 blocks rewritten */
} kvf_dir_counts;

#define KVF_DIR_COUNTS_INIT                                                                        \
    {                                                                                              \
        0, 0, 0, 0, 0, 0, 0, 0                                                                     \
    }

typedef void (*kvf_dir_check_fn)(void *arg, const kvf_dir_entry *entry);

/**
 * Checks every block of <dir>/<ns> as a read would (header, namespace,
 * key, length, pool table, each pool's checksum: a message names the pool
 * that fails), and reports every block
 * file and every temporary file of an interrupted write, in directory
 * order. Other names are ignored. Reads each block in full: about as long
 * as reading the namespace's bytes. A header claiming more payload than a
 * block of `geometries` holds (a slot of every pool) is CORRUPT, and
 * without geometries more than 256 MiB is UNREADABLE (KVF_ERR_RANGE), both
 * from the header alone: a sparse file's claim is never read.
 * @param geometries  the layout the blocks must have (the engine's pools, in
 *        order), n_pools of them; NULL and 0: any layout is good.
 * @param visit  called once per entry (NULL: counts only).
 * @param counts_p  NULL, or counts to add this namespace's entries to
 *        (start from KVF_DIR_COUNTS_INIT).
 * @return KVF_OK when every name was looked at, whatever was found (the
 *         verdicts are in the entries); KVF_ERR_INVALID for a NULL dir, an
 *         invalid namespace or geometry; KVF_ERR_NOT_FOUND when <dir>/<ns>
 *         is not a directory; a file status when it cannot be read (entries
 *         reported before stay counted).
 */
KVF_API kvf_status kvf_dir_check(const char *dir, const char *ns, const kvf_geometry *geometries,
                                 size_t n_pools, kvf_dir_check_fn visit, void *arg,
                                 kvf_dir_counts *counts_p);

/** A usable block, as kvf_dir_list reports it. */
typedef struct kvf_dir_block {
    kvf_key key;
    uint32_t tokens, pools;
    uint64_t payload_bytes; /* bytes after the header */
    int64_t mtime_ns;       /* when it was written: CLOCK_REALTIME, nanoseconds */
} kvf_dir_block;

typedef void (*kvf_dir_list_fn)(void *arg, const kvf_dir_block *block);

/**
 * Lists the blocks of <dir>/<ns> whose headers check (namespace, key,
 * length, and the layout of `geometries` when given): what a cache opened
 * on the directory would find. Only headers are read, so a damaged payload
 * is not noticed here (kvf_dir_check finds it); anything else is skipped.
 * @param geometries, n_pools  as for kvf_dir_check.
 * @param visit  called once per block (NULL: count only).
 * @param n_p  NULL, or receives the number of blocks listed.
 * @return as kvf_dir_check.
 */
KVF_API kvf_status kvf_dir_list(const char *dir, const char *ns, const kvf_geometry *geometries,
                                size_t n_pools, kvf_dir_list_fn visit, void *arg, uint64_t *n_p);

/**
 * Rewrites the format-version-1 blocks of <dir>/<ns> (64-bit keys, files
 * <16 hex digits>.kvf, which engines of this version refuse) in the
 * current format: the key zero-extended to {0, old key}, the file renamed
 * to its 32-digit name. Format-version-2 blocks (one checksum per block)
 * are rewritten under their own name, the new file renamed over the old
 * one only while the name still holds the file read. Neither old format
 * records each pool's bytes: the payload is split evenly among the pools
 * (an engine whose pools have one shape); a block of pools of other shapes
 * then reads as another layout (refused, never served). Per file, atomically: the new file is
 * written beside it, synced, renamed into place, the directory synced, and only then the old file
 * removed; a crash leaves the old file, the new one, or both (run it again). Each old file is
 * checked whole first (header, namespace, key against its name, length, checksum): one that fails
 * is reported (CORRUPT or MISMATCH) and left as it is. The rename never replaces a file: where a
 * file of the new name exists (an engine stored the block meanwhile), the old file is removed only
 * when it names the same block, else left and reported. Engines may use the namespace meanwhile
 * (block directories have no lock): they neither read nor write 16-digit names.
 * @param visit  called once per old file with its verdict: OLD_FORMAT
 *        with status KVF_OK once rewritten, else the reason it was not
 *        (NULL: counts only).
 * @param counts_p  NULL, or counts to add to (upgraded, and the kinds of
 *        the old files left).
 * @return KVF_OK when every old file was looked at (verdicts in the
 *         entries); KVF_ERR_INVALID / NOT_FOUND as
 *         kvf_dir_check; a file status when the directory cannot be read.
 */
KVF_API kvf_status kvf_dir_upgrade(const char *dir, const char *ns, kvf_dir_check_fn visit,
                                   void *arg, kvf_dir_counts *counts_p);

/**
 * Visits the namespaces of a block directory: its subdirectories whose
 * names are valid namespaces ([A-Za-z0-9._-]{1,64}), in byte order. The
 * name passed to visit is valid only during the callback.
 * @param n_p  NULL, or receives the number of namespaces.
 * @return KVF_OK; KVF_ERR_INVALID for a NULL argument; KVF_ERR_NOT_FOUND
 *         when `dir` is not a directory; KVF_ERR_NOMEM; a file status when
 *         it cannot be read (nothing visited then).
 */
KVF_API kvf_status kvf_dir_namespaces(const char *dir, void (*visit)(void *arg, const char *ns),
                                      void *arg, size_t *n_p);

/**
 * Reaches a remote store and says what answers there: connects (one
 * attempt per seed node, no retries), authenticates, pings the server or
 * every cluster node serving slots, and disconnects. Takes about
 * timeout_ms per unreachable node at most.
 * @param url  as kvf_engine_config.remote.url; NULL: $KVF_REMOTE_URL.
 * @param timeout_ms  connect and command timeout; 0: 1000.
 * @param detail  cap bytes (0 and NULL are fine) that receive, NUL-ended
 *        and cut to fit, what answered ("redis 10.0.0.1:6379 db 0",
 *        "redis cluster, 3 master(s) serving slots") or why nothing did;
 *        never the password.
 * @return KVF_OK when every node answered; KVF_ERR_NOT_FOUND when url is
 *         NULL and $KVF_REMOTE_URL is unset or empty; KVF_ERR_UNSUPPORTED
 *         when this build lacks the scheme's store (the message says what
 *         it needs); KVF_ERR_INVALID for a bad URL, or one no remote store
 *         serves; KVF_ERR_REMOTE or KVF_ERR_TIMEOUT when a node cannot be
 *         reached or refuses (kvf_last_error names it).
 */
KVF_API kvf_status kvf_remote_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVFERRY_H */
