/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The slow tiers behind one ops table, as the memory backends are behind
 * kvf__backend_ops: block files (store/file), Redis (store/redis) and a
 * process-wide in-memory store for tests (store/mem). The engine runs a
 * chunk of moves against "a store"; the cache asks stores what they hold.
 *
 * Every store keeps blocks in the stored form of blockhdr.h (header and
 * CRC-32C) and checks a block read back before a byte of it reaches the
 * caller: a corrupt block is KVF_ERR_CORRUPT and a foreign one (another
 * namespace or layout) KVF_ERR_MISMATCH, for that block only.
 *
 * Adding a store: a folder under src/store defining its kvf__store_kind
 * (below), and its name in stores.c's KVF_STORES line.
 */
#ifndef KVF_STORE_H
#define KVF_STORE_H

#include "common.h"
#include "redact.h"
#include "status.h"

typedef struct kvf__store kvf__store;
struct kvf__image_ops;

/* One block of a batch call. The caller sets key and, for write, tokens,
 * pools, buf, payload_bytes and pool_bytes; for read, buf and cap. status and msg are
 * the call's answer for this block; a read fills tokens, pools and
 * payload_bytes when its status is KVF_OK. */
typedef struct kvf__store_block {
    kvf_key key;
    uint32_t tokens, pools;
    void *buf; /* write: the payload; read: where it goes */
    size_t cap;
    size_t payload_bytes;
    /* write: each pool's bytes of the payload (pools of them, pool 0's
     * first), for the stored pool table. NULL: the payload split evenly
     * (kvf__block_prefix_begin), for payloads of no pools of their own. */
    const uint32_t *pool_bytes;
    /* Optional: buf lies in staging the caller laid out as the block's
     * whole stored image, so that a store writing images (the file store)
     * fills in the prefix where it is and copies nothing: the
     * kvf__block_prefix_bytes(pools) bytes before buf are the prefix's
     * room (header and pool table; a read sets pools to the count its
     * room is for), that image starts on KVF_FILE_ALIGN, and cap runs to
     * an aligned end. Stores that send the payload alone ignore it. */
    bool staged;
    /* Optional, with staged (stores whose device_staging says so): buf is
     * device memory, reached only through these (GPUDirect Storage).
     * NULL: host memory. */
    const struct kvf__image_ops *img;
    void *img_arg;
    /* A read group by group (kvf__store_hooks.part): the block's stored
     * prefix (header and pool table, host memory, kvf__block_prefix_span)
     * while part runs, so the caller can hold each pool's stored bytes
     * against its own layout; NULL otherwise. */
    const uint8_t *table;
    kvf_status status;
    /* when status fails: what went wrong, naming the key and the object
     * (file, URL) */
    char msg[KVF_MOVE_ERROR_MESSAGE];
} kvf__store_block;

/* One stored block, as list (restore after a restart) sees it. */
typedef struct kvf__store_entry {
    kvf_key key;
    uint32_t tokens, pools;
    uint64_t payload_bytes;
    int64_t mtime_ns; /* when it was stored (0: the store does not know) */
} kvf__store_entry;

typedef void (*kvf__store_visit_fn)(void *arg, const kvf__store_entry *entry);

/* A caller's copies into and out of the blocks' buffers (the engine's,
 * between slots and its staging), called as a batch call reaches blocks,
 * so that they overlap the store's I/O: a store moving blocks one by one
 * (the file store) calls them a block at a time, on whichever thread
 * moves it; the others for all the blocks, before or after their round
 * trip (kvf__store_write, kvf__store_read). */
typedef struct kvf__store_hooks {
    /* write: fills in blocks[0..n)'s payload, tokens, pools and
     * payload_bytes, just before the store writes them. A failure fails
     * them all (kvf_last_error() their message), and the store writes
     * none of them: the caller discards what they leave. */
    kvf_status (*fill)(void *arg, kvf__store_block *blocks, size_t n);
    /* read: blocks[0..n) have their final status (and, when KVF_OK, their
     * payload); called once for each block. It may fail a block that read
     * well (status and msg). */
    void (*done)(void *arg, kvf__store_block *blocks, size_t n);
    void *arg;
    /* Optional, reads: the caller takes each block's pools in groups of
     * consecutive pools (n_groups > 1; group g ends before pool
     * group_end[g]; first_bytes: the prefix and group 0's pools of a whole
     * block, the first read's length). A store that reads a block's pools
     * apart (the file store, for staged images) calls part(arg, blocks, n,
     * g) exactly once for every block of the call and every group, on
     * whichever thread read it (several at once for different blocks),
     * and calls it for group g of every block before it reads any group
     * g + 1: a block whose status is KVF_OK then holds that group's pools,
     * checked (and tokens, pools and payload_bytes are set); one that
     * failed (now or before) is failed for good. done follows for each
     * block at the end, as always. The remote stores read their values so
     * in ranges (kvf__store_read_groups), every block of the call at once.
     * Stores reading whole blocks never call part. */
    void (*part)(void *arg, kvf__store_block *blocks, size_t n, uint32_t g);
    const uint32_t *group_end;
    uint32_t n_groups;
    size_t first_bytes;
} kvf__store_hooks;

/*
 * Batch calls take n >= 1 blocks and a deadline (kvf__now_ns() time; 0:
 * the store's own timeout from the call); a block not done by then is
 * KVF_ERR_TIMEOUT. They return KVF_OK when every block succeeded, a block
 * absent (KVF_ERR_NOT_FOUND) counting as success for read and exists; else
 * the first failed block's status, kvf_last_error() saying why.
 *
 * write:  KVF_OK stored. On any failure the store holds no stale data
 *         under the key where it can help it (see discard).
 * read:   KVF_OK, payload copied and checked; KVF_ERR_NOT_FOUND;
 *         KVF_ERR_CORRUPT / KVF_ERR_MISMATCH; KVF_ERR_RANGE when cap is too
 *         small. buf's bytes are unspecified after a failure.
 * remove: KVF_OK whether or not the block was there.
 * exists: KVF_OK present, KVF_ERR_NOT_FOUND absent (a read may still find
 *         it corrupt).
 */
typedef struct kvf__store_ops {
    kvf_status (*write)(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns);
    kvf_status (*read)(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns);
    kvf_status (*remove)(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns);
    kvf_status (*exists)(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns);
    /* Visits every block of the namespace whose header checks; others are
     * skipped (a read would refuse them). */
    kvf_status (*list)(kvf__store *s, kvf__store_visit_fn visit, void *arg);
    /* After a batch of writes: makes them durable as far as the store's
     * own policy asks (the file store's fsync setting: under BATCH, one
     * sync for all of them). NULL: a write is as durable as the store
     * makes it when it returns. */
    kvf_status (*commit)(kvf__store *s);
    /* After a write of `key` that failed, in the store or before it
     * reached the store (its source lost, its fill failed, the commit
     * after it failed): removes what it left. KVF_OK when nothing of it
     * is left; *emptied_p true where the block could only be emptied in
     * place (no reader takes it for the block). A store that cannot remove
     * it refuses reads of the key (KVF_ERR_LOST) until it is written or
     * removed again. NULL: a failed write leaves the store as it was. */
    kvf_status (*discard)(kvf__store *s, kvf_key key, bool *emptied_p);
    /* Whether blocks' buf may be device memory reached through img (the
     * file store on the GPUDirect Storage path). NULL: never. */
    bool (*device_staging)(const kvf__store *s);
    /* write and read calling the caller's hooks block by block as the
     * store's I/O reaches each (see kvf__store_hooks). NULL: the hooks
     * run for the whole call, before write and after read. */
    kvf_status (*write_hooked)(kvf__store *s, kvf__store_block *blocks, size_t n,
                               uint64_t deadline_ns, const kvf__store_hooks *h);
    kvf_status (*read_hooked)(kvf__store *s, kvf__store_block *blocks, size_t n,
                              uint64_t deadline_ns, const kvf__store_hooks *h);
    /* Frees the store; its blocks stay stored. */
    void (*close)(kvf__store *s);
} kvf__store_ops;

struct kvf__store {
    const kvf__store_ops *ops;
    const char *kind; /* the registry's name: "file", "redis", "mem" */
    const char *noun; /* what messages call a block: "remote block", "block" */
    char *where;      /* the object messages name: directory or URL */
};

/* What a store is opened with. */
typedef struct kvf__store_config {
    const char *url; /* a remote store's URL */
    const char *ns;  /* namespace, kvf__ns_valid() */
    uint64_t fingerprint;
    uint32_t ttl_s;      /* expiry of stored blocks where the store has one; 0: none */
    uint32_t timeout_ms; /* connect and call timeout; 0: the store's default */
    uint64_t mem_bytes;  /* the in-memory store's capacity; 0: its default */
} kvf__store_config;

/* One store of the registry (stores.c), defined in the store's folder as
 * kvf__<name>_store_kind. Everything kvferry says about a kind of store
 * (the URL schemes it serves, whether this build has it and with what,
 * what it lacks, what answers at a URL) comes from here, so the engine,
 * kvf_info, `kvferry info` and the Python binding name no store. */
typedef struct kvf__store_kind {
    const char *name;           /* "redis": `kvferry info`'s and messages' name */
    const char *const *schemes; /* the URL schemes it serves ("redis" serves redis://...),
                                 * NULL-ended */
    bool remote;                /* serves an engine's remote tier (remote.url) */
    /* Whether this build can open it (NULL: always). */
    bool (*built)(void);
    /* What a build without it lacks, and how to get it: "the Redis client
     * hiredis (libhiredis-dev, or scripts/install-deps.sh) at build time". */
    const char *missing;
    /* One line for `kvferry info`: what this build serves it with ("hiredis
     * 1.2.0, TLS (rediss://) on"). Called only when built. */
    void (*describe)(char *line, size_t cap);
    /* Checks a URL of this scheme without connecting (KVF_ERR_INVALID
     * naming what is wrong, never a password). */
    kvf_status (*check_url)(const char *url);
    kvf_status (*open)(const kvf__store_config *cfg, kvf__store **store_p);
    /* kvf_remote_probe for this store: reaches url within about timeout_ms
     * per node and says what answered in detail. NULL: opening is enough
     * (the store holds no connection). */
    kvf_status (*probe)(const char *url, uint32_t timeout_ms, char *detail, size_t cap);
    /* Whether an engine probes the store at create, so that what only the
     * server can say about the URL (no such bucket, keys refused) fails
     * create rather than the first move: a probe's KVF_ERR_INVALID fails
     * create, an unreachable server is a warning (it may come back). For
     * stores whose URL names something that must exist (an S3 bucket). */
    bool probe_at_create;
    /* Its read_hooked takes pool groups (kvf__store_hooks.part:
     * kvf__store_read_groups), so that an engine's onboard from it arrives
     * layer by layer, in groups of at least this many bytes of a block
     * unless KVF_REMOTE_GROUP_BYTES says otherwise: each group is a round
     * of ranged reads, so the store's own cost of a request sets it. 0:
     * it reads whole blocks. */
    size_t group_bytes;
} kvf__store_kind;

/* The registry's store for `url`'s scheme, or NULL. */
KVF_INTERNAL const kvf__store_kind *kvf__store_kind_of(const char *url);
/* The i-th store of the registry, or NULL past the last. */
KVF_INTERNAL const kvf__store_kind *kvf__store_kind_at(size_t i);
/* "redis://, redis-cluster://, mem://": the schemes of the remote stores
 * this build has, for messages. */
KVF_INTERNAL void kvf__store_remote_schemes(char *out, size_t cap);
/* Whether every remote store of the registry is built (kvf_info's
 * remote_built). */
KVF_INTERNAL bool kvf__store_remote_built(void);
/* $KVF_REMOTE_URL, or NULL when unset or empty. */
KVF_INTERNAL const char *kvf__store_url_from_env(void);
/* Whether the store for `url` is built and the URL well formed: KVF_OK,
 * KVF_ERR_UNSUPPORTED (the scheme's store is not built: the message says
 * what the build lacks), KVF_ERR_INVALID (no store serves the scheme, or
 * the URL is malformed). A store that is not `remote` opens, but is no
 * remote tier (the engine's kvf__engine_create refuses it). */
KVF_INTERNAL kvf_status kvf__store_check_url(const char *url);
/* Opens the store cfg->url names. */
KVF_INTERNAL kvf_status kvf__store_open(const kvf__store_config *cfg, kvf__store **store_p);
/* Closes a store; accepts NULL. */
KVF_INTERNAL void kvf__store_close(kvf__store *s);

/* A batch write or read with the caller's hooks (NULL: none), through
 * the store's hooked call where it has one (see kvf__store_hooks). */
KVF_INTERNAL kvf_status kvf__store_write(kvf__store *s, kvf__store_block *blocks, size_t n,
                                         uint64_t deadline_ns, const kvf__store_hooks *h);
KVF_INTERNAL kvf_status kvf__store_read(kvf__store *s, kvf__store_block *blocks, size_t n,
                                        uint64_t deadline_ns, const kvf__store_hooks *h);

/* The calls a caller asking what a store holds makes (the cache), on
 * arrays of keys: status[i] as the batch call's block i (see above). */
KVF_INTERNAL kvf_status kvf__store_exists(kvf__store *s, const kvf_key *keys, size_t n,
                                          uint64_t deadline_ns, kvf_status *status);
KVF_INTERNAL kvf_status kvf__store_remove(kvf__store *s, const kvf_key *keys, size_t n,
                                          uint64_t deadline_ns, kvf_status *status);
KVF_INTERNAL kvf_status kvf__store_list(kvf__store *s, kvf__store_visit_fn visit, void *arg);

/* ---- reading a remote value pool group by pool group (store_groups.c) ---- */

/* One ranged read of a block's stored value: bytes [off, off + len) into
 * dst. The store sets got (the bytes the value had there: fewer when it
 * ends before off + len, 0 past its end or when it is gone) and, when the
 * read failed, the block's status and msg (kvf__store_block_fail; an
 * absent value KVF_ERR_NOT_FOUND, msg optional). */
typedef struct kvf__store_range {
    kvf__store_block *block;
    uint64_t off;
    size_t len;
    uint8_t *dst;
    size_t got;
    /* set by a store whose messages name more than its URL: the value's
     * own name ("object NS/<key>.kvf"); "" none */
    char about[240];
} kvf__store_range;

/* A store's ranged reads of several blocks at once (one round trip where
 * it can), by deadline_ns. */
typedef void (*kvf__store_ranges_fn)(kvf__store *s, kvf__store_range *r, size_t n,
                                     uint64_t deadline_ns);

/* A remote store's read_hooked: where h takes pool groups (h->part,
 * n_groups > 1), the blocks are read with `ranges` as the part contract
 * says (kvf__store_hooks): a first read of h->first_bytes brings the
 * header and pool table, checked against fingerprint (0: any layout),
 * ns_hash and the block's key, and the first group; then each group g of
 * every block, its pools checked against that table before part(g) hands
 * them over. A value written again or removed between the reads fails its
 * block (a pool whose bytes do not match the table: KVF_ERR_CORRUPT; a
 * value shorter than its table: KVF_ERR_CORRUPT; gone: KVF_ERR_NOT_FOUND),
 * never mixing two values' bytes. Otherwise the store's whole read, then
 * h->done. */
KVF_INTERNAL kvf_status kvf__store_read_groups(kvf__store *s, kvf__store_block *blocks, size_t n,
                                               uint64_t deadline_ns, const kvf__store_hooks *h,
                                               kvf__store_ranges_fn ranges, uint64_t fingerprint,
                                               uint64_t ns_hash);
/* Fails every block of ranges r[0..n) for want of memory (a store that
 * could not set its reads up). */
KVF_INTERNAL void kvf__store_ranges_nomem(kvf__store *s, kvf__store_range *r, size_t n);
/* For tests: called before each ranged read round of group g >= 1 of a
 * kvf__store_read_groups call on store s (after part(g - 1) for every
 * block), on the reading thread; it may hold the round back, or write the
 * store's keys. NULL: none. */
typedef void (*kvf__store_group_gate_fn)(kvf__store *s, uint32_t g);
KVF_INTERNAL void kvf__store_set_group_gate(kvf__store_group_gate_fn fn);

/* Fills in every failed block's msg that its store left empty:
 * "<noun> 0x<key>: <status>; the round trip's first failure: <why>".
 * For stores that learn only one message per call. */
KVF_INTERNAL void kvf__store_name_failures(const kvf__store *s, kvf__store_block *blocks, size_t n,
                                           const char *why);
/* What a batch call returns once every block has its status and msg:
 * KVF_OK, or the first failed block's status, kvf_last_error() its msg
 * (miss_ok: KVF_ERR_NOT_FOUND is no failure). */
KVF_INTERNAL kvf_status kvf__store_first_failure(const kvf__store_block *blocks, size_t n,
                                                 bool miss_ok);
/* Records block b's failure: status and a message naming its key. */
KVF_INTERNAL void kvf__store_block_fail(kvf__store_block *b, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An engine's disk tier (store/file/file_store.c): the file store over
 * <dir>/<ns>, its leftovers of crashed writers removed, its I/O through a
 * runner of its own (io_uring or threads, `lanes` callers at once), and
 * the GPUDirect Storage path taken where `io` and `gds_compat` allow it,
 * the machine has it and `device_slots` (blocks come from device memory).
 * Never fails for GDS: where it was asked for and is not to be had, the
 * POSIX path serves, with one warning a process naming why. */
typedef struct kvf__file_tier_config {
    const char *dir, *ns;
    kvf_fsync fsync;
    kvf_file_io io;
    kvf_gds_compat gds_compat;
    kvf_file_runner runner;
    uint32_t queue_depth, lanes;
    bool device_slots;
} kvf__file_tier_config;
KVF_INTERNAL kvf_status kvf__file_store_open_tier(const kvf__file_tier_config *cfg,
                                                  kvf__store **store_p);
/* A disk tier's directory, for tests that look at the files under the
 * store's interface, and its layout fingerprint's place (set when the
 * engine's pools are fixed); NULL for another store. */
struct kvf__blockfile_dir;
KVF_INTERNAL struct kvf__blockfile_dir *kvf__file_store_dir(kvf__store *s);
/* Calls its runner keeps in flight; "io_uring" or "threads". */
KVF_INTERNAL uint32_t kvf__file_store_depth(const kvf__store *s);
KVF_INTERNAL const char *kvf__file_store_runner_name(const kvf__store *s);

#endif /* KVF_STORE_H */
