/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the benchmarks of the internal bench library (bench.c,
 * bench_remote.c, bench_contend.c): the clock, the random data, block
 * sizes on the command line and slot access as an engine would do it. */
#ifndef KVF_BENCH_H
#define KVF_BENCH_H

#include "kvferry.h"

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in seconds. */
double kvf_bench_now_s(void);
/* n bytes of xorshift data from *state (advanced): never a run of zeros. */
void kvf_bench_fill_random(uint8_t *p, size_t n, uint64_t *state);
/* A size of 1 byte to 256 MiB, with an optional K or M, ending at NUL or
 * ','; 0, or -1 with "kvferry bench: --NAME: ..." printed. */
int kvf_bench_parse_size(const char *name, const char *s, size_t *out);
/* --sizes LIST: comma-separated sizes as above into sizes[0..*n), at most
 * max; 0, or -1 printed. */
int kvf_bench_parse_sizes(const char *list, size_t *sizes, size_t max, size_t *n);
/* The q-quantile (0..1) of n samples (0 when none), nearest rank; sorts v
 * in place. */
double kvf_bench_quantile(double *v, size_t n, double q);
/* Rounds a benchmark needs before its spread means anything, and the
 * spread (the rounds' interquartile range over their median) past which
 * its figures and ratios are not to be trusted: medians of rounds that far
 * apart give ratios that move by as much from one run to the next. */
#define KVF_BENCH_MIN_ROUNDS 3
#define KVF_BENCH_WIDE_SPREAD 0.20
/* Prints the spread line (the widest spread of the rounds behind the
 * figures, and the load average), and a warning when it is too wide or too
 * few rounds were timed; adds rounds, spread (-1: unknown) and
 * load_average to json when given. Whether the spread is too wide. */
bool kvf_bench_report_spread(double spread, uint32_t rounds, cJSON *json);
/* "load average L on N CPU(s)" into where; load_average added to json
 * when given. Whether more work is runnable than there are CPUs. */
bool kvf_bench_busy(char *where, size_t cap, cJSON *json);
/* Whether the engine's primary slots are device memory. */
bool kvf_bench_on_gpu(kvf_engine *e);
/* n bytes from (write) or into host at pool's primary slot `slot` and the
 * slots after it (the bench's pools have no gap between slots): cudaMemcpy
 * on the GPU, memcpy on the host; 0, or -1 printed. */
int kvf_bench_slot_io(kvf_engine *e, uint32_t pool, uint32_t slot, void *host, size_t n,
                      bool write);
/* `kvferry bench --mode contention` (bench_contend.c) */
int kvf_cli_bench_contend(int argc, char **argv);

#endif
