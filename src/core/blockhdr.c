/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stored form of one block, shared by the file tier (one block per
 * file) and the remote tier (one block per value).
 *
 * Format, version 3. A 128-byte header, all fields little-endian:
 *
 *   offset size field
 *        0    8 magic "KVFBLK\r\n" (a transfer that rewrites line ends breaks it)
 *        8    4 format version (3)
 *       12    4 header bytes (128)
 *       16    8 layout fingerprint (kvf__geometry_fingerprint of the pools)
 *       24    8 namespace hash (FNV-1a 64 of the namespace string)
 *       32    8 block key, high half
 *       40    8 block key, low half
 *       48    4 tokens stored
 *       52    4 pools (at most KVF_BLOCK_POOLS_MAX)
 *       56    8 payload bytes
 *       64    4 CRC-32C of the pool table (padding included)
 *       68   56 reserved: zero (a reader refuses other bytes, so a later
 *               version can give them a meaning older readers will not miss)
 *      124    4 CRC-32C of header bytes 0..123
 *
 * then the pool table, at 128: per pool its bytes (4) and the CRC-32C of
 * those bytes (4), zeros to a multiple of 128 bytes; then exactly
 * `payload bytes` of payload, pool 0's bytes first. The checks chain:
 * header CRC, then the table's CRC in the header, then each pool's CRC
 * in the table, so that one pool can be read and checked without the
 * others (a reader hands pools over as they arrive), while a whole-block
 * read checks every pool and so every byte, as one payload CRC did. 128
 * bytes of header: the 128-bit key does not fit beside the other fields
 * in 64; a prefix of a multiple of 128 bytes keeps the payload of an
 * O_DIRECT image (prefix and payload in one aligned buffer) at an offset
 * that divides the 4096-byte unit.
 *
 * A reader refuses a block whose header, table, length or checksums do
 * not hold (KVF_ERR_CORRUPT, naming the pool where one fails), one
 * written under another layout or namespace (KVF_ERR_MISMATCH), and one
 * of an older format (version 2: one checksum for the payload; version 1:
 * 64-byte header, 64-bit key): KVF_ERR_MISMATCH naming the format and
 * `kvferry fsck --upgrade`, where TensorRT-LLM serves whatever bytes it
 * finds.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "status.h"

#include <inttypes.h>
#include <string.h>

#define FORMAT_VERSION KVF_BLOCK_FORMAT_VERSION
#define HDR KVF_BLOCK_HEADER_BYTES
#define CRC_AT (HDR - 4)
#define RESERVED_AT 68u
#define NS_MAX 64
#define ENTRY KVF_BLOCK_POOL_ENTRY_BYTES

static const unsigned char magic[8] = {'K', 'V', 'F', 'B', 'L', 'K', '\r', '\n'};

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t kvf__ns_hash(const char *ns)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *ns; ns++) {
        h ^= (unsigned char)*ns;
        h *= 0x100000001b3ull;
    }
    return h;
}

bool kvf__ns_valid(const char *ns)
{
    size_t n = strlen(ns);
    if (n == 0 || n > NS_MAX || strcmp(ns, ".") == 0 || strcmp(ns, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = ns[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

size_t kvf__block_prefix_bytes(uint32_t pools)
{
    size_t n = HDR + (size_t)pools * ENTRY;
    return (n + KVF_BLOCK_PREFIX_ALIGN - 1) / KVF_BLOCK_PREFIX_ALIGN * KVF_BLOCK_PREFIX_ALIGN;
}

void kvf__block_header_pack(const kvf__block_header *h, uint8_t *out)
{
    memset(out, 0, HDR);
    memcpy(out, magic, 8);
    put_le32(out + 8, FORMAT_VERSION);
    put_le32(out + 12, HDR);
    kvf__put_le64(out + 16, h->fingerprint);
    kvf__put_le64(out + 24, h->ns_hash);
    kvf__put_le64(out + 32, h->key.hi);
    kvf__put_le64(out + 40, h->key.lo);
    put_le32(out + 48, h->tokens);
    put_le32(out + 52, h->pools);
    kvf__put_le64(out + 56, h->payload_bytes);
    put_le32(out + 64, h->table_crc);
    put_le32(out + CRC_AT, kvf__crc32c(0, out, CRC_AT));
}

kvf_status kvf__block_prefix_begin(const kvf__block_header *h, const uint32_t *pool_bytes,
                                   const char *what, uint8_t *out)
{
    if (h->pools > KVF_BLOCK_POOLS_MAX)
        return kvf__fail(KVF_ERR_RANGE, "%s: %u pools, a stored block holds at most %u", what,
                         h->pools, KVF_BLOCK_POOLS_MAX);
    if (h->pools == 0 && h->payload_bytes)
        return kvf__fail(KVF_ERR_INVALID, "%s: %" PRIu64 " payload bytes in no pool", what,
                         h->payload_bytes);
    size_t prefix = kvf__block_prefix_bytes(h->pools);
    memset(out, 0, prefix);
    uint64_t sum = 0;
    for (uint32_t p = 0; p < h->pools; p++) {
        uint64_t n = pool_bytes         ? pool_bytes[p]
                     : p + 1 < h->pools ? h->payload_bytes / h->pools
                                        : h->payload_bytes - h->payload_bytes / h->pools * p;
        if (n > UINT32_MAX)
            return kvf__fail(KVF_ERR_RANGE, "%s: pool %u of %" PRIu64 " bytes", what, p, n);
        put_le32(out + HDR + (size_t)p * ENTRY, (uint32_t)n);
        sum += n;
    }
    if (sum != h->payload_bytes)
        return kvf__fail(KVF_ERR_INVALID,
                         "%s: the pools' bytes add up to %" PRIu64 ", not %" PRIu64, what, sum,
                         h->payload_bytes);
    return KVF_OK;
}

kvf__block_span kvf__block_prefix_span(const uint8_t *prefix, uint32_t p)
{
    kvf__block_span s = {0, 0, 0};
    for (uint32_t q = 0; q < p; q++)
        s.off += kvf__get_le32(prefix + HDR + (size_t)q * ENTRY);
    s.bytes = kvf__get_le32(prefix + HDR + (size_t)p * ENTRY);
    s.crc = kvf__get_le32(prefix + HDR + (size_t)p * ENTRY + 4);
    return s;
}

void kvf__block_prefix_set_crc(uint8_t *prefix, uint32_t p, uint32_t crc)
{
    put_le32(prefix + HDR + (size_t)p * ENTRY + 4, crc);
}

void kvf__block_prefix_seal(kvf__block_header *h, uint8_t *prefix)
{
    h->table_crc = kvf__crc32c(0, prefix + HDR, kvf__block_prefix_bytes(h->pools) - HDR);
    kvf__block_header_pack(h, prefix);
}

kvf_status kvf__block_prefix_make(kvf__block_header *h, const uint32_t *pool_bytes,
                                  const uint8_t *payload, const char *what, uint8_t *out)
{
    kvf_status st = kvf__block_prefix_begin(h, pool_bytes, what, out);
    if (st != KVF_OK)
        return st;
    uint64_t off = 0;
    for (uint32_t p = 0; p < h->pools; p++) {
        uint32_t n = kvf__get_le32(out + HDR + (size_t)p * ENTRY);
        kvf__block_prefix_set_crc(out, p, kvf__crc32c(0, payload + off, n));
        off += n;
    }
    kvf__block_prefix_seal(h, out);
    return KVF_OK;
}

/* Magic, header length and header CRC of a header of `bytes` bytes whose
 * CRC is its last 4 (every version). */
static kvf_status check_frame(const uint8_t *in, const char *what, uint32_t bytes)
{
    uint32_t hdr_bytes = kvf__get_le32(in + 12);
    if (hdr_bytes != bytes)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: header of %u bytes, expected %u", what, hdr_bytes,
                         bytes);
    uint32_t crc = kvf__get_le32(in + bytes - 4), crc_now = kvf__crc32c(0, in, bytes - 4);
    if (crc != crc_now)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: header checksum mismatch (stored 0x%08x, computed 0x%08x)", what, crc,
                         crc_now);
    return KVF_OK;
}

/* A 128-byte header of `version` (2 or 3: the same fields). */
static kvf_status parse_128(const uint8_t *in, const char *what, uint32_t version,
                            kvf__block_header *h)
{
    kvf_status st = check_frame(in, what, HDR);
    if (st != KVF_OK)
        return st;
    for (uint32_t i = RESERVED_AT; i < CRC_AT; i++)
        if (in[i] != 0)
            return kvf__fail(KVF_ERR_CORRUPT, "%s: reserved header byte %u is 0x%02x, not 0", what,
                             i, in[i]);
    kvf__block_header b;
    b.fingerprint = kvf__get_le64(in + 16);
    b.ns_hash = kvf__get_le64(in + 24);
    b.key.hi = kvf__get_le64(in + 32);
    b.key.lo = kvf__get_le64(in + 40);
    b.tokens = kvf__get_le32(in + 48);
    b.pools = kvf__get_le32(in + 52);
    b.payload_bytes = kvf__get_le64(in + 56);
    b.table_crc = kvf__get_le32(in + 64);
    if (version == FORMAT_VERSION && b.pools > KVF_BLOCK_POOLS_MAX)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: %u pools, a stored block holds at most %u", what,
                         b.pools, KVF_BLOCK_POOLS_MAX);
    *h = b;
    return KVF_OK;
}

kvf_status kvf__block_header_parse(const uint8_t *in, const char *what, kvf__block_header *h)
{
    if (memcmp(in, magic, 8) != 0)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: not a stored block (bad magic)", what);
    uint32_t version = kvf__get_le32(in + 8);
    if (version == KVF_BLOCK_FORMAT_V1 || version == KVF_BLOCK_FORMAT_V2)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "%s: %s; this version reads format %u (a checksum per pool): rewrite "
                         "block files with `kvferry fsck --upgrade DIR`, store remote blocks again",
                         what,
                         version == KVF_BLOCK_FORMAT_V1 ? KVF_BLOCK_V1_WORDS : KVF_BLOCK_V2_WORDS,
                         FORMAT_VERSION);
    if (version != FORMAT_VERSION)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: format version %u, expected %u", what, version,
                         FORMAT_VERSION);
    return parse_128(in, what, version, h);
}

kvf_status kvf__block_header_parse_v2(const uint8_t *in, const char *what, kvf__block_header *h)
{
    if (memcmp(in, magic, 8) != 0)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: not a stored block (bad magic)", what);
    uint32_t version = kvf__get_le32(in + 8);
    if (version != KVF_BLOCK_FORMAT_V2)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: format version %u, expected %u", what, version,
                         KVF_BLOCK_FORMAT_V2);
    return parse_128(in, what, version, h);
}

/* Format version 1: the same fields in 64 bytes, the key 64 bits at 32,
 * tokens 40, pools 44, payload bytes 48, payload CRC 56, header CRC 60. */
kvf_status kvf__block_header_parse_v1(const uint8_t *in, const char *what, kvf__block_header *h)
{
    if (memcmp(in, magic, 8) != 0)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: not a stored block (bad magic)", what);
    uint32_t version = kvf__get_le32(in + 8);
    if (version != KVF_BLOCK_FORMAT_V1)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: format version %u, expected %u", what, version,
                         KVF_BLOCK_FORMAT_V1);
    kvf_status st = check_frame(in, what, KVF_BLOCK_V1_HEADER_BYTES);
    if (st != KVF_OK)
        return st;
    h->fingerprint = kvf__get_le64(in + 16);
    h->ns_hash = kvf__get_le64(in + 24);
    h->key = (kvf_key){0, kvf__get_le64(in + 32)};
    h->tokens = kvf__get_le32(in + 40);
    h->pools = kvf__get_le32(in + 44);
    h->payload_bytes = kvf__get_le64(in + 48);
    h->table_crc = kvf__get_le32(in + 56);
    return KVF_OK;
}

kvf_status kvf__block_header_expect(const kvf__block_header *h, const char *what,
                                    uint64_t fingerprint, uint64_t ns_hash, kvf_key key)
{
    if (fingerprint != 0 && h->fingerprint != fingerprint)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "%s: stored under another layout (fingerprint 0x%016llx, expected "
                         "0x%016llx)",
                         what, (unsigned long long)h->fingerprint, (unsigned long long)fingerprint);
    if (h->ns_hash != ns_hash)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "%s: stored under another namespace (hash 0x%016llx, expected 0x%016llx)",
                         what, (unsigned long long)h->ns_hash, (unsigned long long)ns_hash);
    if (!kvf_key_eq(h->key, key))
        return kvf__fail(KVF_ERR_CORRUPT, "%s: header names block " KVF_KEY_FMT, what,
                         KVF_KEY_ARGS(h->key));
    return KVF_OK;
}

kvf_status kvf__block_table_check(const kvf__block_header *h, const uint8_t *prefix,
                                  const char *what)
{
    size_t end = kvf__block_prefix_bytes(h->pools), used = HDR + (size_t)h->pools * ENTRY;
    uint32_t crc_now = kvf__crc32c(0, prefix + HDR, end - HDR);
    if (crc_now != h->table_crc)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: pool table checksum mismatch (stored 0x%08x, computed 0x%08x)", what,
                         h->table_crc, crc_now);
    for (size_t i = used; i < end; i++)
        if (prefix[i] != 0)
            return kvf__fail(KVF_ERR_CORRUPT, "%s: pool table padding byte %zu is 0x%02x, not 0",
                             what, i, prefix[i]);
    uint64_t sum = 0;
    for (uint32_t p = 0; p < h->pools; p++)
        sum += kvf__get_le32(prefix + HDR + (size_t)p * ENTRY);
    if (sum != h->payload_bytes)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: the pool table's %u pools hold %" PRIu64
                         " bytes, the header says %" PRIu64,
                         what, h->pools, sum, h->payload_bytes);
    return KVF_OK;
}

kvf_status kvf__block_pool_check(const uint8_t *prefix, uint32_t p, const char *what,
                                 const uint8_t *seg)
{
    kvf__block_span s = kvf__block_prefix_span(prefix, p);
    return kvf__block_pool_crc_check(prefix, p, what, kvf__crc32c(0, seg, (size_t)s.bytes));
}

kvf_status kvf__block_pool_crc_check(const uint8_t *prefix, uint32_t p, const char *what,
                                     uint32_t crc_now)
{
    uint32_t crc = kvf__get_le32(prefix + HDR + (size_t)p * ENTRY + 4);
    if (crc_now != crc)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: pool %u: checksum mismatch (stored 0x%08x, computed 0x%08x)", what, p,
                         crc, crc_now);
    return KVF_OK;
}

kvf_status kvf__block_pools_check(const kvf__block_header *h, const uint8_t *prefix,
                                  const char *what, const uint8_t *payload)
{
    uint64_t off = 0;
    for (uint32_t p = 0; p < h->pools; p++) {
        kvf_status st = kvf__block_pool_check(prefix, p, what, payload + off);
        if (st != KVF_OK)
            return st;
        off += kvf__get_le32(prefix + HDR + (size_t)p * ENTRY);
    }
    return KVF_OK;
}

kvf_status kvf__block_old_payload_check(const kvf__block_header *h, const char *what,
                                        const uint8_t *payload)
{
    uint32_t crc_now = kvf__crc32c(0, payload, (size_t)h->payload_bytes);
    if (crc_now != h->table_crc)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                         what, h->table_crc, crc_now);
    return KVF_OK;
}

kvf_status kvf__block_value_take(const uint8_t *value, size_t len, const char *what,
                                 uint64_t fingerprint, uint64_t ns_hash, kvf_key key, void *dst,
                                 size_t cap, kvf__block_header *h)
{
    if (len < HDR)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: value of %zu bytes, shorter than a block header",
                         what, len);
    kvf__block_header b;
    kvf_status st = kvf__block_header_parse(value, what, &b);
    if (st == KVF_OK)
        st = kvf__block_header_expect(&b, what, fingerprint, ns_hash, key);
    if (st != KVF_OK)
        return st;
    size_t prefix = kvf__block_prefix_bytes(b.pools);
    if (len < prefix)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: value of %zu bytes, shorter than the prefix of %u pools (%zu bytes)",
                         what, len, b.pools, prefix);
    if ((st = kvf__block_table_check(&b, value, what)) != KVF_OK)
        return st;
    /* a block that fits must be exactly its header's length (a store
     * reads KVF_BLOCK_PREFIX_MAX + cap bytes at most, more than any such
     * block); one that does not fit is RANGE whatever the store cut of it */
    if (b.payload_bytes > cap)
        return kvf__fail(KVF_ERR_RANGE, "%s: block of %" PRIu64 " bytes, buffer of %zu", what,
                         b.payload_bytes, cap);
    if (b.payload_bytes != len - prefix)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: value holds %zu payload bytes, its header %" PRIu64,
                         what, len - prefix, b.payload_bytes);
    if ((st = kvf__block_pools_check(&b, value, what, value + prefix)) != KVF_OK)
        return st;
    memcpy(dst, value + prefix, b.payload_bytes);
    *h = b;
    return KVF_OK;
}
