/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC-32C of stored blocks (crc32c.c) and XXH64 of block keys (keys.c).
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

#endif /* KVF_CORE_CHECKSUM_H */
