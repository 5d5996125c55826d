/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Golden values of the block keys and of CRC-32C. Stored blocks are
 * addressed by their keys and checked by their CRCs, so any change of
 * implementation (a library XXH64, another CRC instruction set) must give
 * these exact numbers. The inputs come from a fixed generator, so the
 * values were computed once by the hand-written XXH64 and by both CRC
 * paths and pinned here.
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
    /* token counts across XXH64's 32-byte stripes and 8/4/1-byte tails */
    static const struct {
        size_t n;
        uint64_t key;
    } golden[] = {
        {0, 0xf48a802fac9a41b1ull},    {1, 0x19d6f3abb8290c45ull},    {3, 0x52913e7ae994723aull},
        {4, 0xac0cb1daef3b749eull},    {7, 0x7a960780cfa4b225ull},    {8, 0xf2111a2a9cd7ff4cull},
        {16, 0x8d98cf360467ab80ull},   {31, 0xe500cc8272413f0bull},   {32, 0xd9f8f616c074e8fbull},
        {33, 0x9d67b6ac3465e086ull},   {64, 0xc6c8224ff6504bfeull},   {256, 0x7db7f5be5e55181cull},
        {1000, 0x4bd6e1671a1c0c93ull}, {4096, 0xfc16d880f139ee4cull},
    };
    for (size_t i = 0; i < sizeof golden / sizeof *golden; i++)
        CHECK_EQ_U64(
            kvf_key_chain(0x0123456789abcdefull, tokens, golden[i].n, 0x5a5a5a5a5a5a5a5aull),
            golden[i].key);
    kvf_key keys[64];
    CHECK_EQ_U64(kvf_key_chain_all(tokens, 4096, 64, 7, keys, 64), 64);
    CHECK_EQ_U64(keys[0], 0x3c960e7f69a47247ull);
    CHECK_EQ_U64(keys[63], 0xe0eb95c16709b17eull);
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
