/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The median of a handful of figures: what the engine's tier costs and
 * the cache's learnt plan ratios are fitted by, because a read's or a
 * request's time has a tail that a mean follows.
 */
#ifndef KVF_CORE_MEDIAN_H
#define KVF_CORE_MEDIAN_H

#include "common.h"

#include <stddef.h>

/* The median of v[0..n) (n > 0), the mean of the middle two for an even
 * n; sorts v in place. */
KVF_INTERNAL double kvf__median(double *v, size_t n);

#endif /* KVF_CORE_MEDIAN_H */
