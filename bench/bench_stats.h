/* SPDX-License-Identifier: Apache-2.0 */
/* What the benchmark programs share: the median of their timed runs. */
#ifndef KVF_BENCH_STATS_H
#define KVF_BENCH_STATS_H

#include <stdlib.h>

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorted in place). */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

#endif /* KVF_BENCH_STATS_H */
