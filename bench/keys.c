/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The key chain of a long prompt: how long kvf_key_chain_all takes for
 * 128k tokens in blocks of 16 (8192 keys), the work a scheduler does on
 * every request it looks up. Prints the median of `reps` runs.
 *   build/bench/keys [reps]
 */
#define _POSIX_C_SOURCE 200809L
#include "kvferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define TOKENS (128u * 1024u)
#define TOKENS_PER_BLOCK 16u

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    if (reps < 1)
        reps = 1;
    uint32_t *tokens = malloc(TOKENS * sizeof *tokens);
    kvf_key *keys = malloc(TOKENS / TOKENS_PER_BLOCK * sizeof *keys);
    double *ms = malloc((size_t)reps * sizeof *ms);
    if (!tokens || !keys || !ms)
        return 1;
    uint32_t x = 1;
    for (uint32_t i = 0; i < TOKENS; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = x >> 15; /* ids below 2^17, as a vocabulary's */
    }
    kvf_key sink = KVF_KEY_ROOT;
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        size_t n =
            kvf_key_chain_all(tokens, TOKENS, TOKENS_PER_BLOCK, 0, keys, TOKENS / TOKENS_PER_BLOCK);
        ms[r] = now_ms() - t0;
        sink = keys[n - 1];
    }
    qsort(ms, (size_t)reps, sizeof *ms, by_value);
    printf("key chain of %u tokens, %u a block: median %.3f ms, min %.3f ms (%d runs; " KVF_KEY_FMT
           ")\n",
           TOKENS, TOKENS_PER_BLOCK, ms[reps / 2], ms[0], reps, KVF_KEY_ARGS(sink));
    free(ms);
    free(keys);
    free(tokens);
    return 0;
}
