/* SPDX-License-Identifier: Apache-2.0 */
/* Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/)
 * with the project's own writers, so every seed is an input the code
 * really produces: block files from kvf__blockfile_write, traces from
 * kvf_trace_generate and kvf_trace_write. The URLs are the forms the
 * documentation gives. Run: fuzz_gen_corpus tests/fuzz/corpus */
#include "blockfile.h"
#include "blockhdr.h"
#include "fileio.h"
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HDR KVF_BLOCK_HEADER_BYTES

static void die(const char *what)
{
    fprintf(stderr, "fuzz_gen_corpus: %s: %s\n", what, errno ? strerror(errno) : kvf_last_error());
    exit(1);
}

static void put_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0)
        die(path);
}

/* Reads a whole file into a malloc'd buffer, with room for `pad` zeros after it. */
static uint8_t *slurp(const char *path, size_t *n_p, size_t pad)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *b = calloc(1, (size_t)n + pad + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n)
        die(path);
    fclose(f);
    *n_p = (size_t)n;
    return b;
}

/* Blocks of a few sizes written by the file tier under namespace "fuzz"
 * (fuzz_blockhdr.c reads under it), and one padded to the O_DIRECT image's
 * length as a direct write leaves it. */
static void gen_blocks(const char *out)
{
    char tmp[] = "/tmp/kvf-gen-XXXXXX";
    if (!mkdtemp(tmp))
        die("mkdtemp");
    kvf__blockfile_dir d;
    if (kvf__blockfile_open_dir(tmp, "fuzz", 0x1234abcd5678ef01ull, KVF_FSYNC_NONE, &d) != KVF_OK)
        die(tmp);
    size_t pre = kvf__block_prefix_bytes(2);
    const size_t sizes[] = {1, 96, 1000, 4096 - pre, 5000};
    uint64_t rnd = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *buf = malloc(pre + sizes[i]);
        if (!buf)
            die("malloc");
        for (size_t k = 0; k < sizes[i]; k++) {
            rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
            buf[pre + k] = (uint8_t)rnd;
        }
        /* keys with both halves set, one with a zero high half */
        kvf_key key = {i ? 0xa11ce0000000000ull + i : 0, 0x1000 + i};
        kvf__blockfile_meta m = {key, (uint32_t)(i + 1), 2, sizes[i]};
        if (kvf__blockfile_write(&d, &m, buf) != KVF_OK)
            die("kvf__blockfile_write");
        free(buf);
        char path[4096], name[32];
        snprintf(path, sizeof path, "%s/fuzz/" KVF_KEY_FMT ".kvf", tmp, KVF_KEY_ARGS(m.key));
        size_t n;
        uint8_t *file = slurp(path, &n, KVF_FILE_ALIGN);
        snprintf(name, sizeof name, "block-%zu", sizes[i]);
        put_file(out, name, file, n);
        if (i == 2) {
            size_t padded = (n + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
            put_file(out, "block-1000-padded", file, padded);
        }
        free(file);
        unlink(path);
    }
    kvf__blockfile_close_dir(&d);
    char ns[4096];
    snprintf(ns, sizeof ns, "%s/fuzz", tmp);
    rmdir(ns);
    rmdir(tmp);
}

static void write_trace(const kvf_trace *t, const char *out, const char *name)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f || kvf_trace_write(t, f) != 0 || fclose(f) != 0)
        die("kvf_trace_write");
    put_file(out, name, text, n);
    free(text);
}

/* Generated workloads, whole and line by line, and a request given by
 * keys with a named salt (the generator makes token requests only). */
static void gen_traces(const char *out)
{
    kvf_trace t = {0};
    if (kvf_trace_generate(KVF_GEN_MIXED, 8, 7, &t) != 0)
        die("kvf_trace_generate");
    write_trace(&t, out, "trace-mixed");
    for (size_t i = 0; i < 3 && i < t.n; i++) {
        kvf_trace one = {&t.reqs[i], 1, 1};
        char name[32];
        snprintf(name, sizeof name, "line-%zu", i);
        write_trace(&one, out, name);
    }
    kvf_trace_free(&t);

    kvf_key keys[3] = {{0, 0x2a}, {0x0123456789abcdefull, 0xfedcba9876543210ull}, {0, 1}};
    kvf_trace_req q;
    memset(&q, 0, sizeof q);
    snprintf(q.id, sizeof q.id, "chat \"7\"\tturn 2");
    q.arrival = 1.5;
    q.priority = 90;
    snprintf(q.salt_name, sizeof q.salt_name, "lora-7");
    q.salt = kvf_key_salt(q.salt_name);
    q.keys = keys;
    q.n_keys = 3;
    q.has_keys = true;
    kvf_trace one = {&q, 1, 1};
    write_trace(&one, out, "line-blocks");
}

static void gen_urls(const char *out)
{
    static const char *urls[] = {
        "redis://127.0.0.1",
        "redis://localhost:6380/2",
        "redis://:s3cret@127.0.0.1:6379",
        "redis://al%40ice:p%3Ass@10.0.0.1:7000/5",
        "redis://[::1]:6380",
        "redis-cluster://h1:7000,h2:7001,[::1]:7002",
    };
    for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "url-%zu", i);
        put_file(out, name, urls[i], strlen(urls[i]));
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_gen_corpus CORPUS_DIR (tests/fuzz/corpus)\n");
        return 2;
    }
    char sub[4096];
    static const struct {
        const char *name;
        void (*gen)(const char *);
    } targets[] = {{"blockhdr", gen_blocks}, {"trace", gen_traces}, {"remote_url", gen_urls}};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        snprintf(sub, sizeof sub, "%s/%s", argv[1], targets[i].name);
        if (mkdir(sub, 0755) != 0 && errno != EEXIST)
            die(sub);
        errno = 0;
        targets[i].gen(sub);
    }
    return 0;
}
