/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Golden values of the block keys and of CRC-32C. Stored blocks are
 * addressed by their keys and checked by their CRCs, so any change of
 * implementation (another XXH3 build, another CRC instruction set) must
 * give these exact numbers. The inputs come from a fixed generator; the
 * keys were computed by python's xxhash package (xxh3_128), the CRCs by
 * both CRC paths, and pinned here.
 */
#include "checksum.h"
#include "testutil.h"

/* For a test to check the table path on any CPU; not in internal.h. */
extern uint32_t kvf__crc32c_sw(uint32_t crc, const void *data, size_t n);
extern const char *kvf__crc32c_impl(void);

static uint32_t rng_state;

static uint32_t rng_next(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state ^ (rng_state >> 16);
}

static uint32_t tokens[4096];
static unsigned char bytes[100000];

static void fill_inputs(void)
{
    rng_state = 12345;
    for (size_t i = 0; i < 4096; i++)
        tokens[i] = rng_next();
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)rng_next();
}

static int test_key_golden(void)
{
    /* token counts across XXH3-128's input classes (the 24-byte head and
     * 4 bytes a token: up to 128, up to 240, longer; 257 tokens and more
     * take the streaming path), from python's xxhash.xxh3_128 */
    static const struct {
        size_t n;
        kvf_key key;
    } golden[] = {
        {0, {0x57498a78da5d3323ull, 0x00cc7b627f0bc28aull}},
        {1, {0x14c1da8f6087b81dull, 0xd6abc2e275276b0eull}},
        {3, {0x3da42e698df3432eull, 0xa795b218669efe16ull}},
        {4, {0xf894e51eb356db4aull, 0x3efd7b2f3a58f035ull}},
        {7, {0xb9ac30007240e587ull, 0x154fc88f93974949ull}},
        {8, {0x1d049f57e6c08dedull, 0x8df800315a5fa7e3ull}},
        {16, {0xc26a7c3e3a7c4417ull, 0x5ca732b9fbe3ad57ull}},
        {26, {0x3e518d83cd2f1f51ull, 0xf7054ef83ae1a87cull}},
        {27, {0x7bc7ebe920dab33cull, 0x4c717d6376835506ull}},
        {31, {0xba66ed5265e28b8cull, 0xebf05beddba20aa9ull}},
        {32, {0xa82c4d28e0f1f44cull, 0x58dd7dd920bcd21dull}},
        {33, {0x5c57da0d9b73f97aull, 0xba950fbd9f4067ffull}},
        {54, {0x5eb9c502ffc845dcull, 0xa83690a74b266e20ull}},
        {55, {0x987061d3409d7af6ull, 0x3baabde17b2dc06bull}},
        {64, {0xf37ac6b073d1e52bull, 0xe426d0a6440a46fcull}},
        {256, {0x494b03d681718a54ull, 0x14b5d991b51c0389ull}},
        {257, {0xa3340d72f1e38a87ull, 0x522262338e15e8d0ull}},
        {1000, {0xa4d360babcb69dbcull, 0x6555af56c0936f4aull}},
        {4096, {0xf92885a4de23783aull, 0x89469c150a7f6d9cull}},
    };
    const kvf_key parent = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    for (size_t i = 0; i < sizeof golden / sizeof *golden; i++) {
        kvf_key k = kvf_key_chain(parent, tokens, golden[i].n, 0x5a5a5a5a5a5a5a5aull);
        if (!kvf_key_eq(k, golden[i].key))
            TEST_FAIL_AT(__FILE__, __LINE__, "%zu tokens: " KVF_KEY_FMT ", want " KVF_KEY_FMT,
                         golden[i].n, KVF_KEY_ARGS(k), KVF_KEY_ARGS(golden[i].key));
    }
    kvf_key keys[64];
    CHECK_EQ_U64(kvf_key_chain_all(tokens, 4096, 64, 7, keys, 64), 64);
    CHECK(kvf_key_eq(keys[0], (kvf_key){0xab04e7b9e191e771ull, 0x15d976937b9667b2ull}));
    CHECK(kvf_key_eq(keys[63], (kvf_key){0xb4a5304b38531c8bull, 0x32805415a21eff63ull}));
    CHECK_EQ_U64(kvf_key_salt("meta-llama/Llama-3.1-8B"), 0x69a87fec428bc47bull);
    /* the published XXH64 vectors, seed 0 */
    CHECK_EQ_U64(kvf__xxh64("", 0), 0xef46db3751d8e999ull);
    CHECK_EQ_U64(kvf__xxh64("abc", 3), 0x44bc2cf5ad770999ull);
    return 0;
}

/* Lengths around the hardware paths' 8-byte words and their three-way
 * runs of 256 and 8192 bytes; data at an odd address. */
static const struct {
    size_t n;
    uint32_t crc;
} crc_golden[] = {
    {1, 0x99df1622u},    {7, 0xc95677f9u},     {8, 0x06838258u},     {9, 0xd9a7646au},
    {255, 0x45ae3ed1u},  {256, 0x0c2bc14bu},   {768, 0x55d9497au},   {769, 0x80fe87c5u},
    {8192, 0xc89d2c5cu}, {24576, 0x883797bbu}, {24577, 0x06c2e3b8u}, {99997, 0x868574cau},
};

static int test_crc_golden_dispatched(void)
{
    /* the path this CPU takes: SSE4.2, ARMv8 CRC, or the tables */
    printf("crc32c path: %s\n", kvf__crc32c_impl());
#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_FEATURE_CRC32))
    if (strcmp(kvf__crc32c_impl(), "slicing-by-8 tables") == 0)
        printf("note: this CPU has no CRC instructions; the hardware path is not tested\n");
#endif
    for (size_t i = 0; i < sizeof crc_golden / sizeof *crc_golden; i++)
        CHECK_EQ_U64(kvf__crc32c(0, bytes + 3, crc_golden[i].n), crc_golden[i].crc);
    /* chained in two parts, split off the 8-byte grid */
    uint32_t part = kvf__crc32c(0, bytes + 3, 1001);
    CHECK_EQ_U64(kvf__crc32c(part, bytes + 3 + 1001, 99997 - 1001), 0x868574cau);
    return 0;
}

static int test_crc_golden_portable(void)
{
    for (size_t i = 0; i < sizeof crc_golden / sizeof *crc_golden; i++)
        CHECK_EQ_U64(kvf__crc32c_sw(0, bytes + 3, crc_golden[i].n), crc_golden[i].crc);
    return 0;
}

int main(void)
{
    fill_inputs();
    RUN(test_key_golden);
    RUN(test_crc_golden_dispatched);
    RUN(test_crc_golden_portable);
    return TEST_RESULT();
}
