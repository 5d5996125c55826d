/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Geometry of a block's regions (layout.c).
 */
#ifndef KVF_CORE_LAYOUT_H
#define KVF_CORE_LAYOUT_H

#include "common.h"

/* Bytes of the region for `tokens` tokens (rows * row_bytes). */
static inline size_t kvf__region_bytes(const kvf_region *r)
{
    return r->rows * r->row_bytes;
}

/* A 64-bit fingerprint of a list of geometries: blocks written under one
 * layout are refused when read back under another. */
KVF_INTERNAL uint64_t kvf__geometry_fingerprint(const kvf_geometry *g, size_t n);

#endif /* KVF_CORE_LAYOUT_H */
