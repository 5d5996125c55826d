/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stored form of a block (blockhdr.c): a 128-byte header (magic,
 * version, layout fingerprint, namespace hash, 128-bit key, tokens, pools,
 * payload length, the pool table's CRC-32C, reserved zeros, header
 * CRC-32C), then the pool table (each pool's bytes and CRC-32C, padded to
 * KVF_BLOCK_PREFIX_ALIGN), then the payload, pool after pool. Header and
 * table together are the block's prefix. Every store keeps blocks in this
 * form (a block file, a Redis value, an in-memory value) and reads them
 * back through kvf__block_value_take or, where it reads prefix and pools
 * apart (block files), the checks below: each pool can be checked on its
 * own, so a reader can hand over pools as they arrive.
 */
#ifndef KVF_CORE_BLOCKHDR_H
#define KVF_CORE_BLOCKHDR_H

#include "common.h"

/* Every store's stored form: the header's size and the format version
 * it carries. */
#define KVF_BLOCK_HEADER_BYTES 128u
#define KVF_BLOCK_FORMAT_VERSION 3u
/* One pool's entry in the table: its bytes and CRC-32C, 4 bytes each. */
#define KVF_BLOCK_POOL_ENTRY_BYTES 8u
/* The prefix (header and table) is padded to a multiple of this, so the
 * payload of an O_DIRECT image (prefix and payload in one aligned buffer)
 * starts at an offset that divides the 4096-byte unit. */
#define KVF_BLOCK_PREFIX_ALIGN 128u
/* The most pools a stored block has: far above the layers of any model,
 * and it bounds what a reader reads before it knows the prefix's size. */
#define KVF_BLOCK_POOLS_MAX 1024u
#define KVF_BLOCK_PREFIX_MAX                                                                       \
    (KVF_BLOCK_HEADER_BYTES + KVF_BLOCK_POOLS_MAX * KVF_BLOCK_POOL_ENTRY_BYTES)
/* The formats before: refused by readers, read only by kvf_dir_upgrade.
 * Version 2: the same header, one CRC-32C over the payload, no table. */
#define KVF_BLOCK_FORMAT_V2 2u
#define KVF_BLOCK_V2_WORDS "format version 2 (one checksum per block)"
/* Version 1: 64-bit keys, a 64-byte header. */
#define KVF_BLOCK_FORMAT_V1 1u
#define KVF_BLOCK_V1_HEADER_BYTES 64u
#define KVF_BLOCK_V1_WORDS "format version 1 (64-bit keys)"

typedef struct kvf__block_header {
    uint64_t fingerprint; /* layout: kvf__geometry_fingerprint of the pools */
    uint64_t ns_hash;     /* kvf__ns_hash of the namespace */
    kvf_key key;
    uint32_t tokens, pools;
    uint64_t payload_bytes;
    /* CRC-32C of the pool table (format 3); of the payload (formats 1, 2:
     * kvf_dir_upgrade's) */
    uint32_t table_crc;
} kvf__block_header;

/* Where pool p's bytes lie in the payload, and their CRC-32C. */
typedef struct kvf__block_span {
    uint64_t off, bytes;
    uint32_t crc;
} kvf__block_span;

/* FNV-1a 64 of a namespace string. */
KVF_INTERNAL uint64_t kvf__ns_hash(const char *ns);
/* [A-Za-z0-9._-]{1,64}, and not "." or "..". */
KVF_INTERNAL bool kvf__ns_valid(const char *ns);

/* Bytes of the prefix (header and pool table) of a block of `pools`
 * pools: where its payload starts. The one rule for it, the engine's
 * staging included. */
KVF_INTERNAL size_t kvf__block_prefix_bytes(uint32_t pools);

/* ---- writing --------------------------------------------------------------- */

/* Writes the KVF_BLOCK_HEADER_BYTES header bytes of `h` (reserved bytes
 * zero, h->table_crc as given, the header CRC computed here); the pool
 * table is the caller's (kvf__block_prefix_seal writes both). */
KVF_INTERNAL void kvf__block_header_pack(const kvf__block_header *h, uint8_t *out);
/* Writes the prefix of block *h into out (kvf__block_prefix_bytes(h->pools)
 * bytes) with pool p's bytes pool_bytes[p] (NULL: the payload split evenly,
 * the remainder in the last pool: for callers whose payload has no pools
 * of its own) and zero CRCs, for kvf__block_prefix_set_crc and
 * kvf__block_prefix_seal. KVF_ERR_INVALID when the pools' bytes do not add
 * up to h->payload_bytes (a block with bytes has pools), KVF_ERR_RANGE
 * above KVF_BLOCK_POOLS_MAX pools; messages start with `what`. */
KVF_INTERNAL kvf_status kvf__block_prefix_begin(const kvf__block_header *h,
                                                const uint32_t *pool_bytes, const char *what,
                                                uint8_t *out);
/* Pool p's bytes and offset in a prefix begun; sets its CRC-32C. */
KVF_INTERNAL kvf__block_span kvf__block_prefix_span(const uint8_t *prefix, uint32_t p);
KVF_INTERNAL void kvf__block_prefix_set_crc(uint8_t *prefix, uint32_t p, uint32_t crc);
/* Completes a prefix begun for *h once every pool's CRC is set: the table's
 * CRC into h->table_crc and the header. */
KVF_INTERNAL void kvf__block_prefix_seal(kvf__block_header *h, uint8_t *prefix);
/* The three for a payload in host memory: begin, each pool's CRC, seal. */
KVF_INTERNAL kvf_status kvf__block_prefix_make(kvf__block_header *h, const uint32_t *pool_bytes,
                                               const uint8_t *payload, const char *what,
                                               uint8_t *out);

/* ---- reading --------------------------------------------------------------- */

/* Checks magic, version, header size, reserved bytes, pool count and
 * header CRC of KVF_BLOCK_HEADER_BYTES bytes and fills *h. Failures are
 * KVF_ERR_CORRUPT, the message starting with `what` (the object: "block
 * <key>: /path/to/file"); a version-1 or version-2 header is
 * KVF_ERR_MISMATCH naming the format and how to migrate. */
KVF_INTERNAL kvf_status kvf__block_header_parse(const uint8_t *in, const char *what,
                                                kvf__block_header *h);
/* The older formats' headers, for kvf_dir_upgrade: version 1's
 * (KVF_BLOCK_V1_HEADER_BYTES bytes, its 64-bit key zero-extended into
 * h->key as {0, key}) and version 2's (h->table_crc the payload's CRC). */
KVF_INTERNAL kvf_status kvf__block_header_parse_v1(const uint8_t *in, const char *what,
                                                   kvf__block_header *h);
KVF_INTERNAL kvf_status kvf__block_header_parse_v2(const uint8_t *in, const char *what,
                                                   kvf__block_header *h);
/* The header is the one asked for: layout (unless fingerprint is 0),
 * namespace (KVF_ERR_MISMATCH) and key (KVF_ERR_CORRUPT). */
KVF_INTERNAL kvf_status kvf__block_header_expect(const kvf__block_header *h, const char *what,
                                                 uint64_t fingerprint, uint64_t ns_hash,
                                                 kvf_key key);
/* The pool table after a parsed header (prefix: the whole prefix, header
 * first): its CRC, zero padding, and pools' bytes adding up to the
 * payload. KVF_ERR_CORRUPT otherwise. After it, kvf__block_prefix_span
 * reads the table. */
KVF_INTERNAL kvf_status kvf__block_table_check(const kvf__block_header *h, const uint8_t *prefix,
                                               const char *what);
/* Pool p of a checked prefix: seg (its span's bytes) matches its CRC, or
 * with the CRC computed elsewhere (on the GPU). KVF_ERR_CORRUPT naming the
 * pool otherwise. */
KVF_INTERNAL kvf_status kvf__block_pool_check(const uint8_t *prefix, uint32_t p, const char *what,
                                              const uint8_t *seg);
KVF_INTERNAL kvf_status kvf__block_pool_crc_check(const uint8_t *prefix, uint32_t p,
                                                  const char *what, uint32_t crc_now);
/* Every pool of a payload in host memory (the whole-block check). */
KVF_INTERNAL kvf_status kvf__block_pools_check(const kvf__block_header *h, const uint8_t *prefix,
                                               const char *what, const uint8_t *payload);
/* Checks a whole payload against the one CRC of formats 1 and 2. */
KVF_INTERNAL kvf_status kvf__block_old_payload_check(const kvf__block_header *h, const char *what,
                                                     const uint8_t *payload);

/* One stored block as a store read it back, value[0..len): the whole
 * value, or its first KVF_BLOCK_PREFIX_MAX + cap bytes where the store
 * read no more (a longer value is then refused, never read on). Checks
 * header, namespace, layout, key, table, length and every pool's CRC-32C
 * before a byte reaches dst, then copies the payload there and fills *h.
 * KVF_ERR_CORRUPT (a value shorter than its prefix, damaged, or of
 * another length than its header says), KVF_ERR_MISMATCH (another layout
 * or namespace, an older format), KVF_ERR_RANGE (a sound block larger
 * than cap); messages start with `what`. dst's bytes are unspecified
 * after a failure. */
KVF_INTERNAL kvf_status kvf__block_value_take(const uint8_t *value, size_t len, const char *what,
                                              uint64_t fingerprint, uint64_t ns_hash, kvf_key key,
                                              void *dst, size_t cap, kvf__block_header *h);

#endif /* KVF_CORE_BLOCKHDR_H */
