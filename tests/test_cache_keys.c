/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's block keys: XXH64 against the published vectors, the chain
 * over its documented bytes (parent, salt, tokens), salts, a request's keys
 * at once, and long blocks hashed in pieces.
 */
#include "cache_fixture.h"

/* ---- keys ------------------------------------------------------------------- */

static int test_keys(void)
{
    /* XXH64 itself, against the published test vectors */
    CHECK_EQ_U64(kvf__xxh64("", 0), 0xef46db3751d8e999ull);
    CHECK_EQ_U64(kvf__xxh64("abc", 3), 0x44bc2cf5ad770999ull);
    uint8_t seq[100];
    for (int i = 0; i < 100; i++)
        seq[i] = (uint8_t)i;
    CHECK_EQ_U64(kvf__xxh64(seq, 100), 0x6ac1e58032166597ull);
    /* the chain, as computed by the python xxhash package over the
     * documented bytes: parent, salt, tokens, little-endian */
    uint32_t toks[32];
    for (uint32_t i = 0; i < 32; i++)
        toks[i] = i;
    kvf_key k1 = kvf_key_chain(KVF_KEY_ROOT, toks, 16, 0);
    CHECK_EQ_U64(k1, 0x396e79d9bff76216ull);
    CHECK_EQ_U64(kvf_key_chain(k1, toks + 16, 16, 0), 0xa856aed7ab913c9eull);
    uint32_t abc[3] = {1, 2, 3};
    CHECK_EQ_U64(kvf_key_chain(KVF_KEY_ROOT, abc, 3, 0x1234), 0x4bb0223f218f8abcull);
    CHECK_EQ_U64(kvf_key_salt("llama-3-8b"), 0xe39251d9742ebb6dull);
    CHECK_EQ_U64(kvf_key_salt(NULL), 0);
    /* all blocks at once; the partial tail has no key */
    kvf_key keys[4] = {0};
    CHECK_EQ_INT(kvf_key_chain_all(toks, 31, 16, 0, keys, 4), 1);
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 16, 0, keys, 4), 2);
    CHECK_EQ_U64(keys[0], k1);
    CHECK_EQ_U64(keys[1], 0xa856aed7ab913c9eull);
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 8, 0, keys, 1), 4); /* counts past cap */
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 0, 0, keys, 4), 0);
    /* a salt separates equal tokens; a token changes the key */
    CHECK(kvf_key_chain(0, toks, 16, 1) != k1);
    toks[5] ^= 1;
    CHECK(kvf_key_chain(0, toks, 16, 0) != k1);
    /* long blocks go through the incremental path in pieces */
    uint32_t *many = malloc(1000 * sizeof *many);
    for (uint32_t i = 0; i < 1000; i++)
        many[i] = i * 2654435761u;
    kvf_key a = kvf_key_chain(7, many, 1000, 9);
    uint8_t *bytes = malloc(16 + 4000);
    for (int i = 0; i < 8; i++) {
        bytes[i] = (uint8_t)(7ull >> (8 * i));
        bytes[8 + i] = (uint8_t)(9ull >> (8 * i));
    }
    for (int i = 0; i < 1000; i++)
        for (int b = 0; b < 4; b++)
            bytes[16 + 4 * i + b] = (uint8_t)(many[i] >> (8 * b));
    CHECK_EQ_U64(a, kvf__xxh64(bytes, 16 + 4000));
    free(bytes);
    free(many);
    return 0;
}

int main(void)
{
    RUN(test_keys);
    return TEST_RESULT();
}
