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
    /* the chain, as computed by the python xxhash package (xxh3_128) over
     * the documented bytes: parent (hi, lo), salt, tokens, little-endian */
    uint32_t toks[32];
    for (uint32_t i = 0; i < 32; i++)
        toks[i] = i;
    const kvf_key want1 = {0x1db4bea677de1573ull, 0xbb42d974f8d0c7f6ull};
    const kvf_key want2 = {0xdf4881ef35008b70ull, 0x17f8b6afa7a4ce75ull};
    kvf_key k1 = kvf_key_chain(KVF_KEY_ROOT, toks, 16, 0);
    CHECK(kvf_key_eq(k1, want1));
    CHECK(kvf_key_eq(kvf_key_chain(k1, toks + 16, 16, 0), want2));
    uint32_t abc[3] = {1, 2, 3};
    CHECK(kvf_key_eq(kvf_key_chain(KVF_KEY_ROOT, abc, 3, 0x1234),
                     (kvf_key){0x47353a0ef4715f19ull, 0x6113f684f8807bd1ull}));
    CHECK_EQ_U64(kvf_key_salt("llama-3-8b"), 0xe39251d9742ebb6dull);
    CHECK_EQ_U64(kvf_key_salt(NULL), 0);
    /* all blocks at once; the partial tail has no key */
    kvf_key keys[4] = {KEY(0)};
    CHECK_EQ_INT(kvf_key_chain_all(toks, 31, 16, 0, keys, 4), 1);
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 16, 0, keys, 4), 2);
    CHECK(kvf_key_eq(keys[0], k1));
    CHECK(kvf_key_eq(keys[1], want2));
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 8, 0, keys, 1), 4); /* counts past cap */
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 0, 0, keys, 4), 0);
    /* a salt separates equal tokens; a token changes the key; so does
     * either half of the parent */
    CHECK(!kvf_key_eq(kvf_key_chain(KVF_KEY_ROOT, toks, 16, 1), k1));
    CHECK(!kvf_key_eq(kvf_key_chain((kvf_key){1, 0}, toks, 16, 0), k1));
    CHECK(!kvf_key_eq(kvf_key_chain((kvf_key){0, 1}, toks, 16, 0), k1));
    CHECK(!kvf_key_eq(kvf_key_chain((kvf_key){1, 0}, toks, 16, 0),
                      kvf_key_chain((kvf_key){0, 1}, toks, 16, 0)));
    toks[5] ^= 1;
    CHECK(!kvf_key_eq(kvf_key_chain(KVF_KEY_ROOT, toks, 16, 0), k1));
    /* long blocks go through the incremental path in pieces: the value
     * python's xxh3_128 gives the whole message */
    uint32_t *many = malloc(1000 * sizeof *many);
    for (uint32_t i = 0; i < 1000; i++)
        many[i] = i * 2654435761u;
    kvf_key a = kvf_key_chain((kvf_key){0, 7}, many, 1000, 9);
    CHECK(kvf_key_eq(a, (kvf_key){0x60ef7c64fc1612f7ull, 0xa95554365d53f7bdull}));
    /* the text form: 32 hex digits, hi then lo, and back */
    char text[KVF_KEY_STR_BYTES];
    CHECK(strcmp(kvf_key_format(want1, text), "1db4bea677de1573bb42d974f8d0c7f6") == 0);
    kvf_key back = KVF_KEY_ROOT;
    CHECK_STATUS(kvf_key_parse("1DB4BEA677DE1573bb42d974f8d0c7f6", &back), KVF_OK);
    CHECK(kvf_key_eq(back, want1));
    CHECK_STATUS(kvf_key_parse("1db4bea677de1573bb42d974f8d0c7f", &back), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_key_parse("1db4bea677de1573bb42d974f8d0c7f60", &back), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_key_parse("0x1db4bea677de1573bb42d974f8d0c7", &back), KVF_ERR_INVALID);
    CHECK(kvf_key_eq(back, want1)); /* unchanged by a refusal */
    CHECK(kvf_key_cmp((kvf_key){1, 0}, (kvf_key){0, UINT64_MAX}) > 0);
    CHECK(kvf_key_cmp((kvf_key){1, 2}, (kvf_key){1, 3}) < 0);
    CHECK(kvf_key_cmp(want1, want1) == 0);
    free(many);
    return 0;
}

int main(void)
{
    RUN(test_keys);
    return TEST_RESULT();
}
