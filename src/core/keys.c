/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Content keys of blocks: XXH64 over (parent key, salt, token ids), all
 * little-endian, computed incrementally so no buffer is allocated for a
 * block of any size. XXH64 comes from libxxhash's header, inlined
 * (XXH_INLINE_ALL): no run-time dependency, and the key chain of a long
 * prompt in about half the time of the hand-written version it replaced
 * (bench/keys.c, docs/performance.md). tests/test_hash.c pins
 * the keys: stored blocks are addressed by them.
 */
#include "checksum.h"
#include "status.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvf__xxh64(const void *data, size_t n)
{
    return XXH64(data, n, 0);
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
    kvf_key k;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* one-shot over one buffer: the streaming state's copies cost as much
     * as the hash itself for blocks of tens of tokens */
    uint8_t buf[16 + 4 * 256];
    if (n <= 256) {
        kvf__put_le64(buf, parent);
        kvf__put_le64(buf + 8, salt);
        if (n)
            memcpy(buf + 16, tokens, n * sizeof *tokens);
        k = XXH64(buf, 16 + n * sizeof *tokens, 0);
        return k ? k : 1;
    }
#endif
    XXH64_state_t s;
    XXH64_reset(&s, 0);
    uint8_t head[16];
    kvf__put_le64(head, parent);
    kvf__put_le64(head + 8, salt);
    XXH64_update(&s, head, sizeof head);
    if (tokens && n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* the ids are already in the hashed byte order */
        XXH64_update(&s, tokens, n * sizeof *tokens);
#else
        uint8_t bytes[256];
        size_t fill = 0;
        for (size_t i = 0; i < n; i++) {
            for (int b = 0; b < 4; b++)
                bytes[fill++] = (uint8_t)(tokens[i] >> (8 * b));
            if (fill == sizeof bytes) {
                XXH64_update(&s, bytes, fill);
                fill = 0;
            }
        }
        XXH64_update(&s, bytes, fill);
#endif
    }
    k = XXH64_digest(&s);
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
