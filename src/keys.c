/*
 * Content keys of blocks: XXH64 over (parent key, salt, token ids), all
 * little-endian, computed incrementally so no buffer is allocated for a
 * block of any size. XXH64 is written here from its published
 * specification; the test vectors in tests/test_cache.c pin it.
 */
#include "internal.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static uint64_t round64(uint64_t acc, uint64_t input)
{
    acc += input * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static uint64_t merge64(uint64_t h, uint64_t v)
{
    h ^= round64(0, v);
    return h * P1 + P4;
}

typedef struct xxh64 {
    uint64_t v[4];
    uint64_t total;
    uint8_t mem[32];
    size_t memsize;
} xxh64;

static void xxh64_init(xxh64 *s)
{
    s->v[0] = P1 + P2;
    s->v[1] = P2;
    s->v[2] = 0;
    s->v[3] = 0 - P1;
    s->total = 0;
    s->memsize = 0;
}

static void stripe(xxh64 *s, const uint8_t *p)
{
    for (int i = 0; i < 4; i++)
        s->v[i] = round64(s->v[i], kvf__get_le64(p + 8 * i));
}

static void xxh64_update(xxh64 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->total += n;
    if (s->memsize + n < 32) {
        memcpy(s->mem + s->memsize, p, n);
        s->memsize += n;
        return;
    }
    if (s->memsize) {
        size_t fill = 32 - s->memsize;
        memcpy(s->mem + s->memsize, p, fill);
        stripe(s, s->mem);
        p += fill;
        n -= fill;
        s->memsize = 0;
    }
    for (; n >= 32; p += 32, n -= 32)
        stripe(s, p);
    memcpy(s->mem, p, n);
    s->memsize = n;
}

static uint64_t xxh64_digest(const xxh64 *s)
{
    uint64_t h;
    if (s->total >= 32) {
        h = rotl(s->v[0], 1) + rotl(s->v[1], 7) + rotl(s->v[2], 12) + rotl(s->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge64(h, s->v[i]);
    } else {
        h = P5; /* seed 0 */
    }
    h += s->total;
    const uint8_t *p = s->mem;
    size_t n = s->memsize;
    for (; n >= 8; p += 8, n -= 8) {
        h ^= round64(0, kvf__get_le64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (n >= 4) {
        h ^= (uint64_t)kvf__get_le32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) {
        h ^= *p * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t kvf__xxh64(const void *data, size_t n)
{
    xxh64 s;
    xxh64_init(&s);
    xxh64_update(&s, data, n);
    return xxh64_digest(&s);
}

kvf_key kvf_key_chain(kvf_key parent, const uint32_t *tokens, size_t n, uint64_t salt)
{
    /* a key is the only result: a hash of tokens that are not there would
     * be a plausible key naming nothing, so the refusal is the one value
     * no block has */
    if (!tokens && n) {
        kvf__fail(KVF_ERR_INVALID, "kvf_key_chain: tokens is NULL with n = %zu", n);
        return 0;
    }
    xxh64 s;
    xxh64_init(&s);
    uint8_t head[16];
    kvf__put_le64(head, parent);
    kvf__put_le64(head + 8, salt);
    xxh64_update(&s, head, sizeof head);
    uint8_t buf[256];
    size_t fill = 0;
    for (size_t i = 0; i < n && tokens; i++) {
        for (int b = 0; b < 4; b++)
            buf[fill++] = (uint8_t)(tokens[i] >> (8 * b));
        if (fill == sizeof buf) {
            xxh64_update(&s, buf, fill);
            fill = 0;
        }
    }
    xxh64_update(&s, buf, fill);
    kvf_key k = xxh64_digest(&s);
    return k ? k : 1; /* 0 is KVF_KEY_ROOT, never a block */
}

size_t kvf_key_chain_all(const uint32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                         uint64_t salt, kvf_key *keys, size_t cap)
{
    kvf__clear_error();
    if (tokens_per_block == 0) {
        kvf__fail(KVF_ERR_INVALID, "kvf_key_chain_all: tokens_per_block is 0");
        return 0;
    }
    size_t blocks = n_tokens / tokens_per_block;
    if ((!tokens && blocks) || (!keys && cap)) {
        kvf__fail(KVF_ERR_INVALID, "kvf_key_chain_all: %s is NULL with %s = %zu",
                  tokens ? "keys" : "tokens", tokens ? "cap" : "n_tokens", tokens ? cap : n_tokens);
        return 0;
    }
    kvf_key parent = KVF_KEY_ROOT;
    for (size_t b = 0; b < blocks && b < cap; b++) {
        parent = kvf_key_chain(parent, tokens + b * tokens_per_block, tokens_per_block, salt);
        keys[b] = parent;
    }
    return blocks;
}

uint64_t kvf_key_salt(const char *name)
{
    return name ? kvf__xxh64(name, strlen(name)) : 0;
}
