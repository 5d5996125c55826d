/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * block files.
 *
 * Two implementations that must agree bit for bit:
 *  - x86-64 with SSE4.2 (checked at run time): the crc32 instruction; and
 *    ARMv8 where the compiler targets its CRC extension (-march=armv8-a+crc
 *    or later, __ARM_FEATURE_CRC32): crc32cx / crc32cb. Both have a latency
 *    of a few cycles and a throughput of one per cycle, so large buffers
 *    are cut into three adjacent streams computed in one loop and combined
 *    afterwards, which runs about three times faster than one stream.
 *  - everywhere else: slicing-by-8 tables.
 * The choice is made once, at the first call.
 *
 * Internally the functions work on the raw register ("state"): the public
 * entry point applies the standard ~0 pre- and post-conditioning, so that
 * kvf__crc32c(kvf__crc32c(0, a, na), b, nb) == kvf__crc32c(0, a || b).
 */
#include "checksum.h"
#include "log.h"

#include <string.h>

#define POLY 0x82F63B78u

/* Stream lengths of the three-way loop. LONG amortises the combine step
 * over large blocks; SHORT keeps the three-way speed for buffers of a few
 * kilobytes. Both are multiples of 8. */
#define LONG_BYTES 8192u
#define SHORT_BYTES 256u

/* For a test to check the table path on any CPU, and to name the path
 * taken; not in internal.h. */
KVF_INTERNAL uint32_t kvf__crc32c_sw(uint32_t crc, const void *data, size_t n);
KVF_INTERNAL const char *kvf__crc32c_impl(void);

static uint32_t table[8][256];
/* shift_long[j][b]: the state (b << 8j) advanced over LONG_BYTES zero bytes;
 * the XOR of four lookups advances any state, since the step is linear. */
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
static uint32_t (*impl)(uint32_t state, const unsigned char *p, size_t n);
static const char *impl_name = "slicing-by-8 tables";
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* a * b modulo the polynomial, both in the reflected form where bit 31 is
 * x^0. */
static uint32_t mulmod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            p ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8n) modulo the polynomial: the operator "advance over n zero bytes". */
static uint32_t x_pow_8n(uint64_t n)
{
    uint32_t result = 1u << 31; /* x^0 */
    uint32_t base = 1u << 23;   /* x^8 */
    while (n) {
        if (n & 1)
            result = mulmod(result, base);
        base = mulmod(base, base);
        n >>= 1;
    }
    return result;
}

static void build_shift(uint32_t shift[4][256], uint32_t op)
{
    for (unsigned j = 0; j < 4; j++)
        for (unsigned b = 0; b < 256; b++)
            shift[j][b] = mulmod(op, (uint32_t)b << (8 * j));
}

static inline uint32_t shift_state(uint32_t shift[4][256], uint32_t s)
{
    return shift[0][s & 0xff] ^ shift[1][(s >> 8) & 0xff] ^ shift[2][(s >> 16) & 0xff] ^
           shift[3][s >> 24];
}

static inline uint64_t load_le64(const unsigned char *p)
{
    /* byte-wise so that the table path is right on big-endian CPUs too;
     * compilers turn this into one load where they can */
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint32_t crc_sw(uint32_t s, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        s = (s >> 8) ^ table[0][(s ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w = load_le64(p) ^ s;
        s = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
            table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        s = (s >> 8) ^ table[0][(s ^ *p++) & 0xff];
    return s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW 1
#define HW_NAME "sse4.2"
#define HW_TARGET __attribute__((target("sse4.2")))
#define HW_U64(c, w) __builtin_ia32_crc32di(c, w)
#define HW_U8(s, b) __builtin_ia32_crc32qi(s, b)
#define HW_USABLE() __builtin_cpu_supports("sse4.2")
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define HAVE_HW 1
#define HW_NAME "armv8 crc"
#define HW_TARGET
#define HW_U64(c, w) __crc32cd((uint32_t)(c), w)
#define HW_U8(s, b) __crc32cb(s, b)
#define HW_USABLE() 1
#else
#define HAVE_HW 0
#endif

#if HAVE_HW
HW_TARGET static inline void crc_hw_run3(uint64_t *s0, uint64_t *s1, uint64_t *s2,
                                         const unsigned char *p, size_t len)
{
    uint64_t c0 = *s0, c1 = *s1, c2 = *s2;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p + i, 8);
        memcpy(&w1, p + len + i, 8);
        memcpy(&w2, p + 2 * len + i, 8);
        c0 = HW_U64(c0, w0);
        c1 = HW_U64(c1, w1);
        c2 = HW_U64(c2, w2);
    }
    *s0 = c0;
    *s1 = c1;
    *s2 = c2;
}

HW_TARGET static uint32_t crc_hw(uint32_t state, const unsigned char *p, size_t n)
{
    uint32_t s = state;
    while (n && ((uintptr_t)p & 7)) {
        s = HW_U8(s, *p++);
        n--;
    }
    /* crc(s, A|B|C) = shift(shift(crc(s, A), |B|) ^ crc(0, B), |C|) ^ crc(0, C)
     * for raw states: the CRC is linear, and a zero start adds nothing. */
    while (n >= 3 * LONG_BYTES) {
        uint64_t c0 = s, c1 = 0, c2 = 0;
        crc_hw_run3(&c0, &c1, &c2, p, LONG_BYTES);
        s = shift_state(shift_long, (uint32_t)c0) ^ (uint32_t)c1;
        s = shift_state(shift_long, s) ^ (uint32_t)c2;
        p += 3 * LONG_BYTES;
        n -= 3 * LONG_BYTES;
    }
    while (n >= 3 * SHORT_BYTES) {
        uint64_t c0 = s, c1 = 0, c2 = 0;
        crc_hw_run3(&c0, &c1, &c2, p, SHORT_BYTES);
        s = shift_state(shift_short, (uint32_t)c0) ^ (uint32_t)c1;
        s = shift_state(shift_short, s) ^ (uint32_t)c2;
        p += 3 * SHORT_BYTES;
        n -= 3 * SHORT_BYTES;
    }
    uint64_t c = s;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = HW_U64(c, w);
        p += 8;
        n -= 8;
    }
    s = (uint32_t)c;
    while (n--)
        s = HW_U8(s, *p++);
    return s;
}
#endif

static void crc_init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t s = b;
        for (int k = 0; k < 8; k++)
            s = (s & 1) ? (s >> 1) ^ POLY : s >> 1;
        table[0][b] = s;
    }
    for (unsigned b = 0; b < 256; b++)
        for (unsigned k = 1; k < 8; k++)
            table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
    impl = crc_sw;
#if HAVE_HW
    if (HW_USABLE()) {
        build_shift(shift_long, x_pow_8n(LONG_BYTES));
        build_shift(shift_short, x_pow_8n(SHORT_BYTES));
        impl = crc_hw;
        impl_name = HW_NAME;
    }
#endif
    KVF_LOG(KVF_LOG_DEBUG, "crc32c: %s", impl_name);
}

const char *kvf__crc32c_impl(void)
{
    pthread_once(&init_once, crc_init);
    return impl_name;
}

uint32_t kvf__crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&init_once, crc_init);
    if (n == 0)
        return crc;
    return ~impl(~crc, data, n);
}

uint32_t kvf__crc32c_from_raw(uint32_t crc, uint64_t n, uint32_t raw)
{
    if (n == 0)
        return crc;
    return ~(mulmod(~crc, x_pow_8n(n)) ^ raw);
}

uint32_t kvf__crc32c_sw(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&init_once, crc_init);
    if (n == 0)
        return crc;
    return ~crc_sw(~crc, data, n);
}
