/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stored form of a block (blockhdr.c): a 128-byte header (magic,
 * version, layout fingerprint, namespace hash, 128-bit key, tokens, pools,
 * payload length and CRC-32C, reserved zeros, header CRC-32C), then the
 * payload. Every store
 * keeps blocks in this form (a block file, a Redis value, an in-memory
 * value) and reads them back through kvf__block_value_take or, where it
 * reads the header and payload apart (block files), the checks below.
 */
#ifndef KVF_CORE_BLOCKHDR_H
#define KVF_CORE_BLOCKHDR_H

#include "common.h"

/* Every store's stored form: the header's size and the format version
 * it carries. */
#define KVF_BLOCK_HEADER_BYTES 128u
#define KVF_BLOCK_FORMAT_VERSION 2u
/* The format before, with 64-bit keys: refused by readers, read only by
 * kvf_dir_upgrade. */
#define KVF_BLOCK_FORMAT_V1 1u
#define KVF_BLOCK_V1_HEADER_BYTES 64u
#define KVF_BLOCK_V1_WORDS "format version 1 (64-bit keys)"

typedef struct kvf__block_header {
    uint64_t fingerprint; /* layout: kvf__geometry_fingerprint of the pools */
    uint64_t ns_hash;     /* kvf__ns_hash of the namespace */
    kvf_key key;
    uint32_t tokens, pools;
    uint64_t payload_bytes;
    uint32_t payload_crc; /* CRC-32C of the payload */
} kvf__block_header;

/* FNV-1a 64 of a namespace string. */
KVF_INTERNAL uint64_t kvf__ns_hash(const char *ns);
/* [A-Za-z0-9._-]{1,64}, and not "." or "..". */
KVF_INTERNAL bool kvf__ns_valid(const char *ns);
/* Writes the KVF_BLOCK_HEADER_BYTES header bytes of `h` (reserved bytes
 * zero, the header CRC computed here). */
KVF_INTERNAL void kvf__block_header_pack(const kvf__block_header *h, uint8_t *out);
/* Checks magic, version, header size, reserved bytes and header CRC of
 * KVF_BLOCK_HEADER_BYTES bytes and fills *h. Failures are KVF_ERR_CORRUPT,
 * the message starting with `what` (the object: "block <key>: /path/to/
 * file"); a version-1 header is KVF_ERR_MISMATCH naming the format and
 * how to migrate. */
KVF_INTERNAL kvf_status kvf__block_header_parse(const uint8_t *in, const char *what,
                                                kvf__block_header *h);
/* The same for a version-1 header (KVF_BLOCK_V1_HEADER_BYTES bytes), its
 * 64-bit key zero-extended into h->key ({0, key}): for kvf_dir_upgrade. */
KVF_INTERNAL kvf_status kvf__block_header_parse_v1(const uint8_t *in, const char *what,
                                                   kvf__block_header *h);
/* The header is the one asked for: layout (unless fingerprint is 0),
 * namespace (KVF_ERR_MISMATCH) and key (KVF_ERR_CORRUPT). */
KVF_INTERNAL kvf_status kvf__block_header_expect(const kvf__block_header *h, const char *what,
                                                 uint64_t fingerprint, uint64_t ns_hash,
                                                 kvf_key key);
/* The payload (h->payload_bytes of it) matches the header's CRC. */
KVF_INTERNAL kvf_status kvf__block_payload_check(const kvf__block_header *h, const char *what,
                                                 const uint8_t *payload);
/* The same, with the payload's CRC computed elsewhere (on the GPU). */
KVF_INTERNAL kvf_status kvf__block_payload_crc_check(const kvf__block_header *h, const char *what,
                                                     uint32_t crc_now);

/* One stored block as a store read it back, value[0..len): the whole
 * value, or its first KVF_BLOCK_HEADER_BYTES + cap bytes where the store
 * read no more (a longer value is then refused, never read on). Checks
 * header, namespace, layout, key, length and CRC-32C before a byte reaches
 * dst, then copies the payload there and fills *h. KVF_ERR_CORRUPT (a
 * value shorter than a header, damaged, or of another length than its
 * header says), KVF_ERR_MISMATCH (another layout or namespace),
 * KVF_ERR_RANGE (a sound block larger than cap); messages start with
 * `what`. dst's bytes are unspecified after a failure. */
KVF_INTERNAL kvf_status kvf__block_value_take(const uint8_t *value, size_t len, const char *what,
                                              uint64_t fingerprint, uint64_t ns_hash, kvf_key key,
                                              void *dst, size_t cap, kvf__block_header *h);

#endif /* KVF_CORE_BLOCKHDR_H */
