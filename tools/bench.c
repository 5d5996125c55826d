/*
 * kvferry bench: offload + onboard round trips over a chosen geometry, in
 * scattered slot order, timed next to the ceiling and the reference
 * algorithm measured in the same run, with every byte verified afterwards.
 */
#include "cli.h"
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef enum bench_mode { MODE_DRAM, MODE_POSIX, MODE_GDS } bench_mode;

typedef struct bench_opts {
    kvf_backend backend;
    bench_mode mode;
    kvf_geometry g;
    uint32_t pools, blocks, tokens, iters, threads;
    const char *dir;
    const char *json;
    kvf_fsync fsync;
    uint64_t seed;
} bench_opts;

typedef struct result {
    const char *what;
    double offload_gbs, onboard_gbs;
} result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill_random(uint8_t *p, size_t n, uint64_t *state)
{
    uint64_t x = *state;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x | 1);
    }
    *state = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- slot access: the CLI fills and checks slots like an engine would --- */

static bool on_gpu(kvf_engine *e)
{
    return kvf_engine_backend(e) == KVF_BACKEND_CUDA;
}

static int slot_io(kvf_engine *e, uint32_t pool, uint32_t slot, void *host, size_t n, bool write)
{
    void *p;
    if (kvf_engine_slot_ptr(e, pool, KVF_LEVEL_PRIMARY, slot, &p) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return -1;
    }
#ifdef KVF_HAVE_CUDA
    if (on_gpu(e)) {
        cudaError_t ce = write ? cudaMemcpy(p, host, n, cudaMemcpyHostToDevice)
                               : cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) {
            fprintf(stderr, "kvferry bench: cudaMemcpy: %s\n", cudaGetErrorString(ce));
            return -1;
        }
        return 0;
    }
#endif
    if (write)
        memcpy(p, host, n);
    else
        memcpy(host, p, n);
    return 0;
}

/* All primary slots of a pool at once: the bench's pools are allocated by
 * kvferry with no gap between slots, so they are one array. */
static int pool_io(kvf_engine *e, uint32_t pool, uint32_t blocks, void *host, size_t block_bytes,
                   bool write)
{
    return slot_io(e, pool, 0, host, block_bytes * blocks, write);
}

/* ---- baselines ------------------------------------------------------------ */

/* Copies with the reference's pattern (one call per block per pool) or one
 * large contiguous copy, between freshly allocated buffers of the same kind
 * as the engine's pools. Returns GB/s, or 0 where unavailable. */
typedef struct dram_base {
    double ceiling[2], reference[2]; /* [0] offload, [1] onboard */
} dram_base;

/* Leaves the caches as the kvferry runs find them: the source just
 * written, the destination just poisoned. */
static void touch(uint8_t *src, uint8_t *dst, size_t n)
{
    memset(src, 0x5A, n);
    memset(dst, 0xA5, n);
}

/* For a partial move (r.rows > 1) the ceiling copies the useful bytes in
 * one piece and the reference copies each block's rows, as the seed's
 * partial-copy kernel does, one block at a time. */
static void host_dram_baselines(size_t block_bytes, const kvf_region *r, uint32_t blocks,
                                const uint32_t *perm, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks, useful = kvf__region_bytes(r) * blocks;
    uint8_t *a = malloc(total), *b = malloc(total);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    uint64_t seed = 7;
    fill_random(a, total, &seed);
    memset(b, 0xA5, total);
    double *t = malloc(iters * sizeof *t);
    for (int dir = 0; dir < 2; dir++) {
        uint8_t *src = dir ? b : a, *dst = dir ? a : b;
        for (uint32_t it = 0; it < iters; it++) {
            touch(src, dst, total);
            double t0 = now_s();
            memcpy(dst, src, useful);
            t[it] = now_s() - t0;
        }
        out->ceiling[dir] = useful / median(t, iters) / 1e9;
        for (uint32_t it = 0; it < iters; it++) {
            touch(src, dst, total);
            double t0 = now_s();
            for (uint32_t i = 0; i < blocks; i++)
                for (size_t row = 0; row < r->rows; row++)
                    memcpy(dst + (size_t)perm[i] * block_bytes + row * r->pitch,
                           src + (size_t)i * block_bytes + row * r->pitch, r->row_bytes);
            t[it] = now_s() - t0;
        }
        out->reference[dir] = useful / median(t, iters) / 1e9;
    }
    free(t);
    free(a);
    free(b);
}

#ifdef KVF_HAVE_CUDA
static void cuda_dram_baselines(size_t block_bytes, const kvf_region *r, uint32_t blocks,
                                const uint32_t *perm, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks, useful = kvf__region_bytes(r) * blocks;
    void *d = NULL, *h = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaMalloc(&d, total) != cudaSuccess || cudaMallocHost(&h, total) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    memset(h, 0x5A, total);
    double *t = malloc(iters * sizeof *t);
    for (int dir = 0; dir < 2; dir++) {
        uint8_t *src = dir ? h : d, *dst = dir ? d : h;
        for (int ref = 0; ref < 2; ref++) {
            for (uint32_t it = 0; it <= iters; it++) {
                cudaEventRecord(e0, s);
                if (!ref)
                    cudaMemcpyAsync(dst, src, useful, cudaMemcpyDefault, s);
                else
                    for (uint32_t i = 0; i < blocks; i++)
                        cudaMemcpy2DAsync(dst + (size_t)perm[i] * block_bytes, r->pitch,
                                          src + (size_t)i * block_bytes, r->pitch, r->row_bytes,
                                          r->rows, cudaMemcpyDefault, s);
                cudaEventRecord(e1, s);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (it) /* the first run warms up */
                    t[it - 1] = ms / 1e3;
            }
            double gbs = useful / median(t, iters) / 1e9;
            if (ref)
                out->reference[dir] = gbs;
            else
                out->ceiling[dir] = gbs;
        }
    }
    free(t);
out:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    cudaFree(d);
    cudaFreeHost(h);
}
#endif

static int write_all(int fd, const uint8_t *p, size_t n, off_t off)
{
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int read_all(int fd, uint8_t *p, size_t n, off_t off)
{
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

/* The file ceiling: the same bytes as one sequential file in 4 MiB calls,
 * fsynced when the engine's policy fsyncs. And the reference's POSIX
 * algorithm: per block per pool a zero-filled pageable buffer, one
 * write() into block_<id>_pool_<p>.bin (or one read()), as the seed does. */
static void file_baselines(const char *dir, size_t block_bytes, uint32_t blocks, uint32_t pools,
                           bool fsync_on, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks * pools, chunk = 4u << 20;
    uint8_t *buf = malloc(total);
    char path[4096];
    if (!buf)
        return;
    uint64_t seed = 11;
    fill_random(buf, total, &seed);
    snprintf(path, sizeof path, "%s/ceiling.bin", dir);
    double *t = malloc(iters * sizeof *t);
    for (int d = 0; d < 2; d++) {
        for (uint32_t it = 0; it < iters; it++) {
            double t0 = now_s();
            int fd = open(path, d ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0)
                goto fail;
            for (size_t off = 0; off < total; off += chunk) {
                size_t n = total - off < chunk ? total - off : chunk;
                int rc = d ? read_all(fd, buf + off, n, (off_t)off)
                           : write_all(fd, buf + off, n, (off_t)off);
                if (rc) {
                    close(fd);
                    goto fail;
                }
            }
            if (!d && fsync_on)
                fsync(fd);
            close(fd);
            t[it] = now_s() - t0;
        }
        out->ceiling[d] = total / median(t, iters) / 1e9;
    }
    unlink(path);
    for (int d = 0; d < 2; d++) {
        for (uint32_t it = 0; it < iters; it++) {
            double t0 = now_s();
            for (uint32_t b = 0; b < blocks; b++)
                for (uint32_t p = 0; p < pools; p++) {
                    snprintf(path, sizeof path, "%s/block_%u_pool_%u.bin", dir, b, p);
                    uint8_t *host = calloc(1, block_bytes); /* the seed's std::vector */
                    uint8_t *slot = buf + ((size_t)b * pools + p) * block_bytes;
                    int fd = open(path, d ? O_RDONLY : O_CREAT | O_WRONLY, 0664);
                    if (fd >= 0 && host) {
                        if (d) {
                            if (read(fd, host, block_bytes) < 0)
                                perror("read");
                            memcpy(slot, host, block_bytes);
                        } else {
                            memcpy(host, slot, block_bytes);
                            if (write(fd, host, block_bytes) < 0)
                                perror("write");
                        }
                        close(fd);
                    }
                    free(host);
                }
            t[it] = now_s() - t0;
        }
        out->reference[d] = total / median(t, iters) / 1e9;
    }
    for (uint32_t b = 0; b < blocks; b++)
        for (uint32_t p = 0; p < pools; p++) {
            snprintf(path, sizeof path, "%s/block_%u_pool_%u.bin", dir, b, p);
            unlink(path);
        }
fail:
    free(t);
    free(buf);
}

/* ---- the run ------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvferry bench [options]\n"
           "  --backend auto|host|cuda     default auto\n"
           "  --mode dram|posix|gds        dram: GPU<->host slots; posix/gds: files\n"
           "  --layers N --kv N --heads N --tokens-per-block N --head-size N\n"
           "  --dtype fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8|int4|fp4\n"
           "  --order head|token           block-major [l][kv][h][t][d] or [l][kv][t][h][d]\n"
           "  --pools N                    pools (tensors) per block, default 1\n"
           "  --blocks N                   blocks per round trip, default 128\n"
           "  --tokens N                   move only the first N tokens (0: whole blocks)\n"
           "  --iters N                    timed round trips, default 5 (median reported)\n"
           "  --threads N                  engine worker threads (0: default)\n"
           "  --dir DIR                    file-tier directory (default: a fresh temp dir)\n"
           "  --fsync none|batch|block     file durability, default batch\n"
           "  --json FILE                  also write the results as JSON\n"
           "  --seed N                     random data seed\n"
           "Exits 1 if any byte read back differs from what was written.\n");
}

static int parse_u32(const char *s, uint32_t *out, const char *name)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 0);
    if (errno || *end || v > UINT32_MAX) {
        fprintf(stderr, "kvferry bench: --%s: '%s' is not a number\n", name, s);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"backend", 1, 0, 'b'},   {"mode", 1, 0, 'm'},
        {"layers", 1, 0, 'L'},    {"kv", 1, 0, 'K'},
        {"heads", 1, 0, 'H'},     {"tokens-per-block", 1, 0, 'T'},
        {"head-size", 1, 0, 'D'}, {"dtype", 1, 0, 'y'},
        {"order", 1, 0, 'o'},     {"pools", 1, 0, 'p'},
        {"blocks", 1, 0, 'n'},    {"tokens", 1, 0, 't'},
        {"iters", 1, 0, 'i'},     {"threads", 1, 0, 'j'},
        {"dir", 1, 0, 'd'},       {"fsync", 1, 0, 'f'},
        {"json", 1, 0, 'J'},      {"seed", 1, 0, 's'},
        {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'b':
            if (!strcmp(optarg, "auto"))
                o->backend = KVF_BACKEND_AUTO;
            else if (!strcmp(optarg, "host"))
                o->backend = KVF_BACKEND_HOST;
            else if (!strcmp(optarg, "cuda"))
                o->backend = KVF_BACKEND_CUDA;
            else
                rc = -1;
            break;
        case 'm':
            if (!strcmp(optarg, "dram"))
                o->mode = MODE_DRAM;
            else if (!strcmp(optarg, "posix"))
                o->mode = MODE_POSIX;
            else if (!strcmp(optarg, "gds"))
                o->mode = MODE_GDS;
            else
                rc = -1;
            break;
        case 'L':
            rc = parse_u32(optarg, &o->g.layers, "layers");
            break;
        case 'K':
            rc = parse_u32(optarg, &o->g.kv_factor, "kv");
            break;
        case 'H':
            rc = parse_u32(optarg, &o->g.kv_heads, "heads");
            break;
        case 'T':
            rc = parse_u32(optarg, &o->g.tokens_per_block, "tokens-per-block");
            break;
        case 'D':
            rc = parse_u32(optarg, &o->g.head_size, "head-size");
            break;
        case 'y':
            if (kvf_dtype_parse(optarg, &o->g.dtype) != KVF_OK)
                rc = -1;
            break;
        case 'o':
            if (!strcmp(optarg, "head"))
                o->g.order = KVF_ORDER_HEAD_MAJOR;
            else if (!strcmp(optarg, "token"))
                o->g.order = KVF_ORDER_TOKEN_MAJOR;
            else
                rc = -1;
            break;
        case 'p':
            rc = parse_u32(optarg, &o->pools, "pools");
            break;
        case 'n':
            rc = parse_u32(optarg, &o->blocks, "blocks");
            break;
        case 't':
            rc = parse_u32(optarg, &o->tokens, "tokens");
            break;
        case 'i':
            rc = parse_u32(optarg, &o->iters, "iters");
            break;
        case 'j':
            rc = parse_u32(optarg, &o->threads, "threads");
            break;
        case 'd':
            o->dir = optarg;
            break;
        case 'J':
            o->json = optarg;
            break;
        case 'f':
            if (!strcmp(optarg, "none"))
                o->fsync = KVF_FSYNC_NONE;
            else if (!strcmp(optarg, "batch"))
                o->fsync = KVF_FSYNC_BATCH;
            else if (!strcmp(optarg, "block"))
                o->fsync = KVF_FSYNC_BLOCK;
            else
                rc = -1;
            break;
        case 's':
            o->seed = strtoull(optarg, NULL, 0);
            break;
        case 'h':
            usage();
            exit(0);
        default:
            rc = -1;
        }
        if (rc) {
            if (c != '?')
                fprintf(stderr, "kvferry bench: bad value '%s' for an option\n", optarg);
            fprintf(stderr, "kvferry bench --help lists the options\n");
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvferry bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->pools || !o->blocks || !o->iters) {
        fprintf(stderr, "kvferry bench: --pools, --blocks and --iters must be at least 1\n");
        return -1;
    }
    return 0;
}

static const char *mode_name(bench_mode m)
{
    return m == MODE_DRAM ? "dram" : m == MODE_POSIX ? "posix" : "gds";
}

/* Checks every primary slot against the original data: the moved region
 * must match, every other byte must still hold the poison. */
static long verify(kvf_engine *e, const bench_opts *o, const uint8_t *orig, size_t block_bytes,
                   uint8_t *scratch, uint8_t poison)
{
    kvf_region r;
    kvf_geometry_region(&o->g, o->tokens, &r);
    long bad = 0;
    for (uint32_t p = 0; p < o->pools; p++)
        for (uint32_t b = 0; b < o->blocks; b++) {
            if (slot_io(e, p, b, scratch, block_bytes, false))
                return -1;
            const uint8_t *want = orig + ((size_t)p * o->blocks + b) * block_bytes;
            size_t row = 0;
            for (size_t off = 0; off < block_bytes; off++) {
                while (row < r.rows && off >= row * r.pitch + r.row_bytes)
                    row++;
                bool moved = row < r.rows && off >= row * r.pitch;
                uint8_t expect = moved ? want[off] : poison;
                if (scratch[off] != expect) {
                    if (bad < 5)
                        fprintf(stderr,
                                "kvferry bench: pool %u block %u byte %zu: 0x%02x, expected "
                                "0x%02x\n",
                                p, b, off, scratch[off], expect);
                    bad++;
                }
            }
        }
    return bad;
}

static int make_tmpdir(char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(out, cap, "%s/kvferry-bench-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(out) ? 0 : -1;
}

/* Removes the temporary directory the bench made: <dir>/<ns>/<files>. */
static void remove_bench_dir(const char *dir, const char *ns)
{
    char sub[4096], path[8192];
    snprintf(sub, sizeof sub, "%s/%s", dir, ns);
    DIR *d = opendir(sub);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", sub, de->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(sub);
    rmdir(dir);
}

int kvf_cli_bench(int argc, char **argv)
{
    bench_opts o = {
        .backend = KVF_BACKEND_AUTO,
        .mode = MODE_DRAM,
        .g = {8, 2, 8, 32, 128, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
        .pools = 1,
        .blocks = 128,
        .tokens = 0,
        .iters = 5,
        .fsync = KVF_FSYNC_BATCH,
        .seed = 0x9e3779b97f4a7c15ull,
    };
    if (parse_args(argc, argv, &o))
        return 2;
    size_t block_bytes;
    kvf_region region;
    if (kvf_geometry_block_bytes(&o.g, &block_bytes) != KVF_OK ||
        kvf_geometry_region(&o.g, o.tokens, &region) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return 2;
    }
    size_t useful = kvf__region_bytes(&region) * o.pools * o.blocks;

    char tmpdir[4096] = "";
    const char *dir = o.dir;
    if (o.mode != MODE_DRAM && !dir) {
        if (make_tmpdir(tmpdir, sizeof tmpdir)) {
            fprintf(stderr, "kvferry bench: cannot create a temporary directory: %s\n",
                    strerror(errno));
            return 1;
        }
        dir = tmpdir;
    }

    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = o.backend;
    cfg.threads = o.threads;
    cfg.file_dir = o.mode == MODE_DRAM ? NULL : dir;
    cfg.file_namespace = "bench";
    cfg.file_io = o.mode == MODE_GDS ? KVF_FILE_IO_GDS : KVF_FILE_IO_POSIX;
    cfg.fsync = o.fsync;
    kvf_engine *e;
    if (kvf_engine_create(&cfg, &e) != KVF_OK) {
        fprintf(stderr, "kvferry bench: engine: %s\n", kvf_last_error());
        return 1;
    }
    bool gpu = on_gpu(e);
    int rc = 1;
    uint8_t *orig = NULL, *scratch = NULL, *poison_buf = NULL, *poison_all = NULL;
    uint32_t *perm = NULL;
    kvf_move *off_moves = NULL, *on_moves = NULL;
    double *t_off = NULL, *t_on = NULL;

    for (uint32_t p = 0; p < o.pools; p++) {
        kvf_pool_desc prim = {gpu ? KVF_MEMORY_DEVICE : KVF_MEMORY_HOST, NULL, 0, o.blocks};
        kvf_pool_desc sec = {gpu ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST, NULL, 0, o.blocks};
        if (kvf_engine_add_pool(e, &o.g, &prim, o.mode == MODE_DRAM ? &sec : NULL, NULL) !=
            KVF_OK) {
            fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
            goto out;
        }
    }
    size_t total = block_bytes * o.pools * o.blocks;
    orig = malloc(total);
    scratch = malloc(block_bytes);
    poison_buf = malloc(block_bytes);
    poison_all = malloc(block_bytes * o.blocks);
    perm = malloc(o.blocks * sizeof *perm);
    off_moves = malloc(o.blocks * sizeof *off_moves);
    on_moves = malloc(o.blocks * sizeof *on_moves);
    t_off = malloc(o.iters * sizeof *t_off);
    t_on = malloc(o.iters * sizeof *t_on);
    if (!orig || !scratch || !poison_buf || !poison_all || !perm || !off_moves || !on_moves ||
        !t_off || !t_on) {
        fprintf(stderr, "kvferry bench: out of memory for %zu bytes of reference data\n", total);
        goto out;
    }
    uint64_t seed = o.seed ? o.seed : 1;
    fill_random(orig, total, &seed);
    const uint8_t poison = 0xA5;
    memset(poison_buf, poison, block_bytes);
    memset(poison_all, poison, block_bytes * o.blocks);
    /* scattered order: block i goes to slot (or key) perm[i] */
    for (uint32_t i = 0; i < o.blocks; i++)
        perm[i] = i;
    for (uint32_t i = o.blocks - 1; i > 0; i--) {
        uint32_t j = (uint32_t)((seed = seed * 6364136223846793005ull + 1) >> 33) % (i + 1);
        uint32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    uint64_t key_base = o.mode == MODE_DRAM ? 0 : 0x6b7666000000ull;
    for (uint32_t i = 0; i < o.blocks; i++) {
        off_moves[i] = (kvf_move){i, key_base + perm[i], o.tokens};
        on_moves[i] = (kvf_move){key_base + perm[i], i, o.tokens};
    }
    kvf_tier tier = o.mode == MODE_DRAM ? KVF_TIER_HOST : KVF_TIER_FILE;
    bool tty = isatty(2);
    for (uint32_t it = 0; it < o.iters; it++) {
        if (tty)
            fprintf(stderr, "\rkvferry bench: round trip %u/%u", it + 1, o.iters);
        for (uint32_t p = 0; p < o.pools; p++)
            if (pool_io(e, p, o.blocks, orig + (size_t)p * o.blocks * block_bytes, block_bytes,
                        true))
                goto out;
        kvf_ticket t;
        double t0 = now_s();
        kvf_status st = kvf_offload(e, tier, off_moves, o.blocks, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        t_off[it] = now_s() - t0;
        if (st != KVF_OK) {
            fprintf(stderr, "\nkvferry bench: offload failed: %s\n", kvf_last_error());
            goto out;
        }
        /* poison the primary slots so an onboard that moves nothing fails
         * verification instead of finding the old bytes in place */
        for (uint32_t p = 0; p < o.pools; p++)
            if (pool_io(e, p, o.blocks, poison_all, block_bytes, true))
                goto out;
        t0 = now_s();
        st = kvf_onboard(e, tier, on_moves, o.blocks, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        t_on[it] = now_s() - t0;
        if (st != KVF_OK) {
            fprintf(stderr, "\nkvferry bench: onboard failed: %s\n", kvf_last_error());
            goto out;
        }
    }
    if (tty)
        fprintf(stderr, "\r%40s\r", "");
    long bad = verify(e, &o, orig, block_bytes, scratch, poison);
    double off_gbs = useful / median(t_off, o.iters) / 1e9;
    double on_gbs = useful / median(t_on, o.iters) / 1e9;

    dram_base base = {{0, 0}, {0, 0}};
    const char *ceiling_name, *ref_name;
    if (o.mode == MODE_DRAM) {
        /* the baselines treat the pools of a block as one larger block */
        kvf_region all = region;
        if (all.rows == 1)
            all.row_bytes = all.pitch = block_bytes * o.pools;
        else
            all.rows *= o.pools;
#ifdef KVF_HAVE_CUDA
        if (gpu)
            cuda_dram_baselines(block_bytes * o.pools, &all, o.blocks, perm, o.iters, &base);
        else
#endif
            host_dram_baselines(block_bytes * o.pools, &all, o.blocks, perm, o.iters, &base);
        ceiling_name = gpu ? "one large pinned copy" : "one large memcpy";
        ref_name =
            gpu ? (o.tokens ? "one cudaMemcpy2DAsync per block" : "one cudaMemcpyAsync per block")
                : "one copy per block, 1 thread";
    } else {
        file_baselines(dir, block_bytes, o.blocks, o.pools, o.fsync != KVF_FSYNC_NONE, o.iters,
                       &base);
        ceiling_name = "one sequential file, 4 MiB calls";
        ref_name = "seed POSIX: buffer+write per block";
    }

    printf("kvferry bench: %s backend, mode %s, %u pool(s) x %u blocks of %zu bytes "
           "(%s, %ux%ux%ux%ux%u %s), %s, median of %u\n",
           kvf_backend_name(kvf_engine_backend(e)), mode_name(o.mode), o.pools, o.blocks,
           block_bytes, kvf_dtype_name(o.g.dtype), o.g.layers, o.g.kv_factor, o.g.kv_heads,
           o.g.tokens_per_block, o.g.head_size,
           o.g.order == KVF_ORDER_HEAD_MAJOR ? "head-major" : "token-major",
           o.tokens ? "partial" : "whole blocks", o.iters);
    if (o.tokens)
        printf("  first %u of %u tokens: %zu useful bytes per block per pool in %zu rows\n",
               o.tokens, o.g.tokens_per_block, kvf__region_bytes(&region), region.rows);
    printf("  %-36s %10s %10s\n", "", "offload", "onboard");
    printf("  %-36s %7.2f GB/s %5.2f GB/s\n", ceiling_name, base.ceiling[0], base.ceiling[1]);
    printf("  %-36s %7.2f GB/s %5.2f GB/s\n", ref_name, base.reference[0], base.reference[1]);
    printf("  %-36s %7.2f GB/s %5.2f GB/s\n", "kvferry", off_gbs, on_gbs);
    if (base.ceiling[0] > 0 && base.reference[0] > 0)
        printf("  %-36s %9.2fx %9.2fx\n  %-36s %9.2fx %9.2fx\n", "kvferry / ceiling",
               off_gbs / base.ceiling[0], on_gbs / base.ceiling[1], "kvferry / reference",
               off_gbs / base.reference[0], on_gbs / base.reference[1]);
    printf("  verified: %s (%zu bytes per direction per round trip)\n",
           bad == 0 ? "every byte" : "FAILED", useful);
    if (o.json) {
        FILE *f = fopen(o.json, "w");
        if (!f) {
            fprintf(stderr, "kvferry bench: %s: %s\n", o.json, strerror(errno));
        } else {
            fprintf(f,
                    "{\"backend\": \"%s\", \"mode\": \"%s\", \"pools\": %u, \"blocks\": %u, "
                    "\"block_bytes\": %zu, \"tokens\": %u, \"tokens_per_block\": %u, "
                    "\"dtype\": \"%s\", \"iters\": %u, \"useful_bytes\": %zu,\n"
                    " \"offload_gbs\": %.4f, \"onboard_gbs\": %.4f,\n"
                    " \"ceiling\": {\"what\": \"%s\", \"offload_gbs\": %.4f, \"onboard_gbs\": "
                    "%.4f},\n"
                    " \"reference\": {\"what\": \"%s\", \"offload_gbs\": %.4f, "
                    "\"onboard_gbs\": %.4f},\n"
                    " \"verified\": %s, \"bad_bytes\": %ld}\n",
                    kvf_backend_name(kvf_engine_backend(e)), mode_name(o.mode), o.pools, o.blocks,
                    block_bytes, o.tokens, o.g.tokens_per_block, kvf_dtype_name(o.g.dtype), o.iters,
                    useful, off_gbs, on_gbs, ceiling_name, base.ceiling[0], base.ceiling[1],
                    ref_name, base.reference[0], base.reference[1], bad == 0 ? "true" : "false",
                    bad);
            fclose(f);
        }
    }
    rc = bad == 0 ? 0 : 1;
out:
    kvf_engine_destroy(e);
    if (tmpdir[0])
        remove_bench_dir(tmpdir, "bench");
    free(orig);
    free(scratch);
    free(poison_buf);
    free(poison_all);
    free(perm);
    free(off_moves);
    free(on_moves);
    free(t_off);
    free(t_on);
    return rc;
}
