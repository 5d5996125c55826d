/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stored form of one block, shared by the file tier (one block per
 * file) and the remote tier (one block per value).
 *
 * Format, version 2. A 128-byte header, all fields little-endian:
 *
 *   offset size field
 *        0    8 magic "KVFBLK\r\n" (a transfer that rewrites line ends breaks it)
 *        8    4 format version (2)
 *       12    4 header bytes (128)
 *       16    8 layout fingerprint (kvf__geometry_fingerprint of the pools)
 *       24    8 namespace hash (FNV-1a 64 of the namespace string)
 *       32    8 block key, high half
 *       40    8 block key, low half
 *       48    4 tokens stored
 *       52    4 pools
 *       56    8 payload bytes
 *       64    4 CRC-32C of the payload
 *       68   56 reserved: zero (a reader refuses other bytes, so a later
 *               version can give them a meaning older readers will not miss)
 *      124    4 CRC-32C of header bytes 0..123
 *
 * then exactly `payload bytes` of payload. 128 bytes, not 64: the 128-bit
 * key does not fit beside the other fields in 64, and a power of two keeps
 * the payload of an O_DIRECT image (header and payload in one aligned
 * buffer) at an offset that divides the 4096-byte unit.
 *
 * A reader refuses a block whose header, length or checksum does not hold
 * (KVF_ERR_CORRUPT), one written under another layout or namespace
 * (KVF_ERR_MISMATCH), and one of format version 1 (64-byte header, 64-bit
 * key: KVF_ERR_MISMATCH naming the format and `kvferry fsck --upgrade`),
 * where TensorRT-LLM serves whatever bytes it finds.
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
    put_le32(out + 64, h->payload_crc);
    put_le32(out + CRC_AT, kvf__crc32c(0, out, CRC_AT));
}

/* Magic, header length and header CRC of a header of `bytes` bytes whose
 * CRC is its last 4 (both versions). */
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

kvf_status kvf__block_header_parse(const uint8_t *in, const char *what, kvf__block_header *h)
{
    if (memcmp(in, magic, 8) != 0)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: not a stored block (bad magic)", what);
    uint32_t version = kvf__get_le32(in + 8);
    if (version == KVF_BLOCK_FORMAT_V1)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "%s: " KVF_BLOCK_V1_WORDS "; this version reads format %u (128-bit keys): "
                         "rewrite block files with `kvferry fsck --upgrade DIR`, store remote "
                         "blocks again",
                         what, FORMAT_VERSION);
    if (version != FORMAT_VERSION)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: format version %u, expected %u", what, version,
                         FORMAT_VERSION);
    kvf_status st = check_frame(in, what, HDR);
    if (st != KVF_OK)
        return st;
    for (uint32_t i = RESERVED_AT; i < CRC_AT; i++)
        if (in[i] != 0)
            return kvf__fail(KVF_ERR_CORRUPT, "%s: reserved header byte %u is 0x%02x, not 0", what,
                             i, in[i]);
    h->fingerprint = kvf__get_le64(in + 16);
    h->ns_hash = kvf__get_le64(in + 24);
    h->key.hi = kvf__get_le64(in + 32);
    h->key.lo = kvf__get_le64(in + 40);
    h->tokens = kvf__get_le32(in + 48);
    h->pools = kvf__get_le32(in + 52);
    h->payload_bytes = kvf__get_le64(in + 56);
    h->payload_crc = kvf__get_le32(in + 64);
    return KVF_OK;
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
    h->payload_crc = kvf__get_le32(in + 56);
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

kvf_status kvf__block_payload_check(const kvf__block_header *h, const char *what,
                                    const uint8_t *payload)
{
    return kvf__block_payload_crc_check(h, what, kvf__crc32c(0, payload, (size_t)h->payload_bytes));
}

kvf_status kvf__block_payload_crc_check(const kvf__block_header *h, const char *what,
                                        uint32_t crc_now)
{
    if (crc_now != h->payload_crc)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                         what, h->payload_crc, crc_now);
    return KVF_OK;
}

kvf_status kvf__block_value_take(const uint8_t *value, size_t len, const char *what,
                                 uint64_t fingerprint, uint64_t ns_hash, kvf_key key, void *dst,
                                 size_t cap, kvf__block_header *h)
{
    if (len < HDR)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: value of %zu bytes, shorter than a block header",
                         what, len);
    kvf_status st = kvf__block_header_parse(value, what, h);
    if (st == KVF_OK)
        st = kvf__block_header_expect(h, what, fingerprint, ns_hash, key);
    if (st != KVF_OK)
        return st;
    /* a block that fits must be exactly its header's length; one that does
     * not fit is RANGE whatever the store cut of it */
    if (h->payload_bytes <= cap && len - HDR > cap)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: value of more than %zu bytes, its header says %" PRIu64
                         " payload bytes (not read further)",
                         what, HDR + cap, h->payload_bytes);
    if (h->payload_bytes <= cap && h->payload_bytes != len - HDR)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: value holds %zu payload bytes, its header %" PRIu64,
                         what, len - HDR, h->payload_bytes);
    if (h->payload_bytes > cap)
        return kvf__fail(KVF_ERR_RANGE, "%s: block of %" PRIu64 " bytes, buffer of %zu", what,
                         h->payload_bytes, cap);
    if ((st = kvf__block_payload_check(h, what, value + HDR)) != KVF_OK)
        return st;
    memcpy(dst, value + HDR, h->payload_bytes);
    return KVF_OK;
}
