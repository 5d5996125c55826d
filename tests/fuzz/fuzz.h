/* SPDX-License-Identifier: Apache-2.0 */
/* What every fuzz target shares: libFuzzer's entry point, which the
 * corpus replayer (replay_main.c) also calls in builds without libFuzzer,
 * and a check that stops the run where a property does not hold. */
#ifndef KVF_FUZZ_H
#define KVF_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* abort(), not a return: libFuzzer and the replayer both treat it as the
 * finding, and it keeps the input that caused it. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__, #cond);            \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
