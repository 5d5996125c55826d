/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the replay trace parser (tools/trace.c), one line and a
 * whole trace. Properties: whatever parses is written back in a form that
 * parses to the same requests (write, read, write gives the same text), and
 * a request holds what its arrays say. */
#include "fuzz.h"
#include "trace.h"

#include <string.h>

static void check_req(const kvf_trace_req *q)
{
    FUZZ_CHECK(memchr(q->id, '\0', sizeof q->id));
    FUZZ_CHECK(memchr(q->salt_name, '\0', sizeof q->salt_name));
    FUZZ_CHECK(q->priority <= 100);
    FUZZ_CHECK(q->arrival >= 0);
    FUZZ_CHECK(q->has_keys ? q->n_tokens == 0 && (q->n_keys == 0 || q->keys)
                           : q->n_keys == 0 && (q->n_tokens == 0 || q->tokens));
    for (size_t i = 0; i < q->n_keys; i++)
        FUZZ_CHECK(!kvf_key_is_root(q->keys[i]));
}

/* The trace as kvf_trace_write writes it; NULL when out of memory. */
static char *written(const kvf_trace *t, size_t *len_p)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len_p);
    if (!f)
        return NULL;
    int rc = kvf_trace_write(t, f);
    fclose(f);
    FUZZ_CHECK(rc == 0);
    return text;
}

/* Parses what kvf_trace_write made of t, and writes that again: the same
 * text, or the writer and reader disagree on the format. */
static void check_round_trip(const kvf_trace *t)
{
    size_t len1, len2;
    char *text1 = written(t, &len1);
    if (!text1)
        return;
    FILE *f = fmemopen(text1, len1 ? len1 : 1, "r");
    if (!f) {
        free(text1);
        return;
    }
    kvf_trace again = {0};
    int rc = len1 ? kvf_trace_read(f, "written trace", &again) : 0;
    fclose(f);
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(again.n == t->n);
    char *text2 = written(&again, &len2);
    if (text2) {
        FUZZ_CHECK(len1 == len2 && memcmp(text1, text2, len1) == 0);
        free(text2);
    }
    kvf_trace_free(&again);
    free(text1);
}

static void one_line(const uint8_t *data, size_t size)
{
    kvf_trace_req q;
    char err[256];
    memset(err, 0, sizeof err);
    int got = kvf_trace_parse_line((const char *)data, size, &q, err, sizeof err);
    FUZZ_CHECK(got >= -1 && got <= 1);
    if (got < 0)
        FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err));
    if (got != 1)
        return;
    check_req(&q);
    /* as kvf_trace_read names a request without an id, so the text
     * written is the one read back */
    if (!q.id[0])
        snprintf(q.id, sizeof q.id, "line 1");
    kvf_trace t = {0};
    if (kvf_trace_append(&t, &q)) {
        kvf_trace_req_free(&q);
        return;
    }
    check_round_trip(&t);
    kvf_trace_free(&t);
}

static void whole_trace(const uint8_t *data, size_t size)
{
    if (size == 0)
        return;
    /* fmemopen's buffer is not written to in "r" mode */
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f)
        return;
    kvf_trace t = {0};
    int rc = kvf_trace_read(f, "fuzz input", &t);
    fclose(f);
    if (rc != 0) {
        FUZZ_CHECK(t.n == 0 && t.reqs == NULL);
        return;
    }
    for (size_t i = 0; i < t.n; i++) {
        check_req(&t.reqs[i]);
        FUZZ_CHECK(t.reqs[i].id[0] != '\0' && t.reqs[i].line >= 1);
    }
    kvf_trace_sort(&t);
    for (size_t i = 1; i < t.n; i++)
        FUZZ_CHECK(t.reqs[i - 1].arrival <= t.reqs[i].arrival);
    check_round_trip(&t);
    kvf_trace_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly `size` bytes: ASan then catches a read past the line */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    one_line(copy, size);
    whole_trace(copy, size);
    free(copy);
    return 0;
}
