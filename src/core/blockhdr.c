/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stored form of one block, shared by the file tier (one block per
 * file) and the remote tier (one block per value).
 *
 * Format, version 1. A 64-byte header, all fields little-endian:
 *
 *   offset size field
 *        0    8 magic "KVFBLK\r\n" (a transfer that rewrites line ends breaks it)
 *        8    4 format version (1)
 *       12    4 header bytes (64)
 *       16    8 layout fingerprint (kvf__geometry_fingerprint of the pools)
 *       24    8 namespace hash (FNV-1a 64 of the namespace string)
 *       32    8 block key
 *       40    4 tokens stored
 *       44    4 pools
 *       48    8 payload bytes
 *       56    4 CRC-32C of the payload
 *       60    4 CRC-32C of header bytes 0..59
 *
 * then exactly `payload bytes` of payload. A reader refuses a block whose
 * header, length or checksum does not hold (KVF_ERR_CORRUPT) and one
 * written under another layout or namespace (KVF_ERR_MISMATCH), where
 * TensorRT-LLM serves whatever bytes it finds.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "status.h"

#include <inttypes.h>
#include <string.h>

#define FORMAT_VERSION KVF_BLOCK_FORMAT_VERSION
#define HDR KVF_BLOCK_HEADER_BYTES
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
    memcpy(out, magic, 8);
    put_le32(out + 8, FORMAT_VERSION);
    put_le32(out + 12, HDR);
    kvf__put_le64(out + 16, h->fingerprint);
    kvf__put_le64(out + 24, h->ns_hash);
    kvf__put_le64(out + 32, h->key);
    put_le32(out + 40, h->tokens);
    put_le32(out + 44, h->pools);
    kvf__put_le64(out + 48, h->payload_bytes);
    put_le32(out + 56, h->payload_crc);
    put_le32(out + 60, kvf__crc32c(0, out, 60));
}

kvf_status kvf__block_header_parse(const uint8_t *in, const char *what, kvf__block_header *h)
{
    if (memcmp(in, magic, 8) != 0)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: not a stored block (bad magic)", what);
    uint32_t version = kvf__get_le32(in + 8);
    if (version != FORMAT_VERSION)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: format version %u, expected %u", what, version,
                         FORMAT_VERSION);
    uint32_t hdr_bytes = kvf__get_le32(in + 12);
    if (hdr_bytes != HDR)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: header of %u bytes, expected %u", what, hdr_bytes,
                         HDR);
    uint32_t crc = kvf__get_le32(in + 60), crc_now = kvf__crc32c(0, in, 60);
    if (crc != crc_now)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "%s: header checksum mismatch (stored 0x%08x, computed 0x%08x)", what, crc,
                         crc_now);
    h->fingerprint = kvf__get_le64(in + 16);
    h->ns_hash = kvf__get_le64(in + 24);
    h->key = kvf__get_le64(in + 32);
    h->tokens = kvf__get_le32(in + 40);
    h->pools = kvf__get_le32(in + 44);
    h->payload_bytes = kvf__get_le64(in + 48);
    h->payload_crc = kvf__get_le32(in + 56);
    return KVF_OK;
}

kvf_status kvf__block_header_expect(const kvf__block_header *h, const char *what,
                                    uint64_t fingerprint, uint64_t ns_hash, uint64_t key)
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
    if (h->key != key)
        return kvf__fail(KVF_ERR_CORRUPT, "%s: header names block 0x%llx", what,
                         (unsigned long long)h->key);
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
                                 uint64_t fingerprint, uint64_t ns_hash, uint64_t key, void *dst,
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
