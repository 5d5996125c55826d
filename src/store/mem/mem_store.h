/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-memory store (mem_store.c): URL mem://NAME. Blocks live in a
 * process-wide map per NAME, so two engines, or a cache restarted in the
 * same process, see the same blocks; nothing survives the process. Values
 * are the stored form (header and CRC-32C), checked on read as Redis's
 * are. A put expires after the store's ttl_s (0: never), and a NAME holds
 * at most its capacity (remote_mem_bytes) of stored forms: a put beyond it
 * evicts the oldest puts, logged. For tests of
 * the remote tier without a server, and a sketch of what a new store
 * needs.
 */
#ifndef KVF_STORE_MEM_STORE_H
#define KVF_STORE_MEM_STORE_H

#include "store.h"

/* For tests: XORs `mask` into byte `offset` of the value stored under
 * (namespace, key) in mem://`name` (offset 0 is the header's first byte).
 * KVF_ERR_NOT_FOUND when there is no such value or byte. */
KVF_INTERNAL kvf_status kvf__mem_store_poke(const char *name, const char *ns, kvf_key key,
                                            size_t offset, uint8_t mask);
/* For tests: copies bytes [offset, offset + len) of that value to out.
 * KVF_ERR_NOT_FOUND when there is no such value or it is shorter. */
KVF_INTERNAL kvf_status kvf__mem_store_peek(const char *name, const char *ns, kvf_key key,
                                            size_t offset, void *out, size_t len);
/* For tests: forgets every block of mem://`name`. */
KVF_INTERNAL void kvf__mem_store_clear(const char *name);

#endif /* KVF_STORE_MEM_STORE_H */
