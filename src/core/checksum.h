/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC-32C of stored blocks (crc32c.c), XXH64 of salts and the stored
 * names' form of block keys (keys.c).
 */
#ifndef KVF_CORE_CHECKSUM_H
#define KVF_CORE_CHECKSUM_H

#include "common.h"

KVF_INTERNAL uint32_t kvf__crc32c(uint32_t crc, const void *data, size_t n);
/* kvf__crc32c(crc, data, n) from the raw register of the same n bytes run
 * from state 0 without conditioning (what the GPU kernel computes): the
 * CRC is linear in its state, so the start state is advanced over n zero
 * bytes and added. */
KVF_INTERNAL uint32_t kvf__crc32c_from_raw(uint32_t crc, uint64_t n, uint32_t raw);
/* XXH64 with seed 0 (keys.c). */
KVF_INTERNAL uint64_t kvf__xxh64(const void *data, size_t n);
/* `digits` (at most 16) hex digits at s into *v_p: lower case, and upper
 * case too where any_case. false, *v_p unchanged, at any other byte. */
KVF_INTERNAL bool kvf__hex_u64(const char *s, unsigned digits, bool any_case, uint64_t *v_p);
/* The key spelled by the 32 lower-case hex digits at s (what follows is not
 * looked at): the one form stored names (files, Redis keys, S3 objects)
 * give a key, KVF_KEY_FMT's. false, *key_p unchanged, for anything else. */
KVF_INTERNAL bool kvf__key_from_name(const char *s, kvf_key *key_p);

#endif /* KVF_CORE_CHECKSUM_H */
