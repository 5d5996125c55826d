/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Content keys of blocks: XXH3-128 over (parent key, salt, token ids), all
 * little-endian, computed incrementally so no buffer is allocated for a
 * block of any size, and their one text form (32 hex digits). XXH3 comes
 * from libxxhash's header, inlined (XXH_INLINE_ALL): no run-time
 * dependency (bench/keys.c, docs/performance.md). tests/test_hash.c pins
 * the keys: stored blocks are addressed by them.
 */
#include "checksum.h"
#include "status.h"

#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if XXH_VERSION_NUMBER < 800
#error "libxxhash 0.8 or later is needed (XXH3-128)"
#endif

/* parent key (hi, lo) and salt, before the token ids */
#define HEAD 24

uint64_t kvf__xxh64(const void *data, size_t n)
{
    return XXH64(data, n, 0);
}

/* XXH3-128's halves as a key; {0, 1} for the all-zero one, which is
 * KVF_KEY_ROOT and never a block. */
static kvf_key key_of(XXH128_hash_t h)
{
    kvf_key k = {h.high64, h.low64};
    return kvf_key_is_root(k) ? (kvf_key){0, 1} : k;
}

kvf_key kvf_key_chain(kvf_key parent, const uint32_t *tokens, size_t n, uint64_t salt)
{
    /* a key is the only result: a hash of tokens that are not there would
     * be a plausible key naming nothing, so the refusal is the one value
     * no block has */
    if (!tokens && n) {
        kvf__fail(KVF_ERR_INVALID, "kvf_key_chain: tokens is NULL with n = %zu", n);
        return KVF_KEY_ROOT;
    }
    uint8_t head[HEAD];
    kvf__put_le64(head, parent.hi);
    kvf__put_le64(head + 8, parent.lo);
    kvf__put_le64(head + 16, salt);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* one-shot over one buffer: the streaming state's copies cost as much
     * as the hash itself for blocks of tens of tokens */
    uint8_t buf[HEAD + 4 * 256];
    if (n <= 256) {
        memcpy(buf, head, HEAD);
        if (n)
            memcpy(buf + HEAD, tokens, n * sizeof *tokens);
        return key_of(XXH3_128bits(buf, HEAD + n * sizeof *tokens));
    }
#endif
    XXH3_state_t s;
    XXH3_128bits_reset(&s);
    XXH3_128bits_update(&s, head, sizeof head);
    if (tokens && n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* the ids are already in the hashed byte order */
        XXH3_128bits_update(&s, tokens, n * sizeof *tokens);
#else
        uint8_t bytes[256];
        size_t fill = 0;
        for (size_t i = 0; i < n; i++) {
            for (int b = 0; b < 4; b++)
                bytes[fill++] = (uint8_t)(tokens[i] >> (8 * b));
            if (fill == sizeof bytes) {
                XXH3_128bits_update(&s, bytes, fill);
                fill = 0;
            }
        }
        XXH3_128bits_update(&s, bytes, fill);
#endif
    }
    return key_of(XXH3_128bits_digest(&s));
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

char *kvf_key_format(kvf_key key, char *buf)
{
    if (buf)
        snprintf(buf, KVF_KEY_STR_BYTES, KVF_KEY_FMT, KVF_KEY_ARGS(key));
    return buf;
}

bool kvf__hex_u64(const char *s, unsigned digits, bool any_case, uint64_t *v_p)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < digits; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (any_case && c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return false;
        v = v << 4 | d;
    }
    *v_p = v;
    return true;
}

/* 32 hex digits at s into *key_p; upper-case digits only when `any_case`. */
static bool from_hex(const char *s, bool any_case, kvf_key *key_p)
{
    kvf_key k;
    if (!kvf__hex_u64(s, 16, any_case, &k.hi) || !kvf__hex_u64(s + 16, 16, any_case, &k.lo))
        return false;
    *key_p = k;
    return true;
}

bool kvf__key_from_name(const char *s, kvf_key *key_p)
{
    return from_hex(s, false, key_p);
}

kvf_status kvf_key_parse(const char *text, kvf_key *key_p)
{
    if (!text || !key_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_key_parse: %s is NULL", text ? "key_p" : "text");
    if (!from_hex(text, true, key_p) || text[32] != '\0')
        return kvf__fail(KVF_ERR_INVALID, "key \"%.40s\": want 32 hex digits and nothing else",
                         text);
    return KVF_OK;
}
