/* SPDX-License-Identifier: Apache-2.0 */
/* The trace reader of `kvferry replay` (tools/trace.c): valid lines, each
 * kind of malformed line refused with a reason and a column, a write/read
 * round trip of a generated trace, and a small fuzz pass (every prefix and
 * random byte mutations of valid lines, each parsed from a buffer of its
 * exact size, so ASan sees any read past the line). */
#include "testutil.h"
#include "trace.h"

#include <cJSON.h>
#include <time.h>

static int parse(const char *s, kvf_trace_req *q, char *err, size_t cap)
{
    /* an exact-size copy: a read past the end is a heap overflow */
    size_t n = strlen(s);
    char *b = malloc(n ? n : 1);
    memcpy(b, s, n);
    int rc = kvf_trace_parse_line(b, n, q, err, cap);
    free(b);
    return rc;
}

static int test_valid(void)
{
    kvf_trace_req q;
    char err[256];
    REQUIRE(parse("{\"id\": \"r1\", \"arrival\": 0.25, \"tokens\": [1, 2, 3]}\n", &q, err,
                  sizeof err) == 1);
    CHECK(!strcmp(q.id, "r1"));
    CHECK(q.arrival == 0.25 && q.has_arrival);
    CHECK_EQ_U64(q.n_tokens, 3);
    CHECK(q.tokens[0] == 1 && q.tokens[2] == 3);
    CHECK_EQ_U64(q.priority, KVF_TRACE_PRIORITY_DEFAULT);
    CHECK(!q.has_keys && q.salt == 0);
    kvf_trace_req_free(&q);

    REQUIRE(parse("{\"blocks\": [\"0x9f\", 42, \"ABCDEF0123456789\", 18446744073709551615, "
                  "\"0x1ABCDEF0123456789fffffffffffffff\"], "
                  "\"id\": 7, \"priority\": 90, \"salt\": \"lora-a\", \"extra\": {\"a\": [1, "
                  "{\"b\": null}, true, false, -1.5e-3, \"\\u00e9\\ud83d\\ude00\"]}}\r\n",
                  &q, err, sizeof err) == 1);
    CHECK(q.has_keys);
    CHECK_EQ_U64(q.n_keys, 5);
    CHECK(kvf_key_eq(q.keys[0], KEY(0x9f)));
    CHECK(kvf_key_eq(q.keys[1], KEY(42)));
    CHECK(kvf_key_eq(q.keys[2], KEY(0xABCDEF0123456789ull)));
    CHECK(kvf_key_eq(q.keys[3], KEY(UINT64_MAX)));
    /* 32 hex digits are the whole key, hi then lo */
    CHECK(kvf_key_eq(q.keys[4], ((kvf_key){0x1ABCDEF012345678ull, 0x9ffffffffffffffful})));
    CHECK(!strcmp(q.id, "7"));
    CHECK_EQ_U64(q.priority, 90);
    CHECK_EQ_U64(q.salt, kvf_key_salt("lora-a"));
    CHECK(!q.has_arrival);
    kvf_trace_req_free(&q);

    REQUIRE(parse("{\"tokens\": [], \"salt\": 5}", &q, err, sizeof err) == 1);
    CHECK_EQ_U64(q.n_tokens, 0);
    CHECK_EQ_U64(q.salt, 5);
    kvf_trace_req_free(&q);
    /* blank lines are skipped, not errors */
    CHECK_EQ_INT(parse("", &q, err, sizeof err), 0);
    CHECK_EQ_INT(parse("  \t\r\n", &q, err, sizeof err), 0);
    return 0;
}

static int test_malformed(void)
{
    static const struct {
        const char *line, *reason;
    } bad[] = {
        {"[1, 2]", "one JSON object per line"},
        {"{\"tokens\": [1, 2,]}", "expected a number"},
        {"{\"tokens\": [1 2]}", "expected ',' or ']'"},
        {"{\"tokens\": [1, 2]", "line ends"},
        {"{\"tokens\": [1, 2]} x", "trailing characters"},
        {"{\"tokens\": [1, 2]}{}", "trailing characters"},
        {"{\"tokens\": [01]}", "leading zero"},
        {"{\"tokens\": [-1]}", "token id is an integer"},
        {"{\"tokens\": [1.5]}", "token id is an integer"},
        {"{\"tokens\": [4294967296]}", "token id is an integer"},
        {"{\"tokens\": [1e3]}", "token id is an integer"},
        {"{\"tokens\": \"1 2\"}", "expected '[' (an array)"},
        {"{\"blocks\": [\"0xzz\"]}", "not a hex key"},
        {"{\"blocks\": [\"0x\"]}", "1-32 hex digits"},
        {"{\"blocks\": [\"0x123456789012345678901234567890123\"]}", "1-32 hex digits"},
        {"{\"blocks\": [0]}", "key 0 is not a block key"},
        {"{\"blocks\": [18446744073709551616]}", "a key is a hex string or an integer"},
        {"{\"tokens\": [1], \"blocks\": [1]}", "not both"},
        {"{\"id\": \"x\"}", "needs \"tokens\" or \"blocks\""},
        {"{\"tokens\": [1], \"tokens\": [2]}", "given twice"},
        {"{\"tokens\": [1], \"arrival\": -1}", "arrival is a number"},
        {"{\"tokens\": [1], \"priority\": 101}", "priority is an integer"},
        {"{\"tokens\": [1], \"salt\": -3}", "salt is a string"},
        {"{\"tokens\": [1], \"salt\": \"a\\u0000b\"}", "NUL"},
        {"{\"tokens\": [1], \"id\": \"a\\qb\"}", "bad escape"},
        {"{\"tokens\": [1], \"id\": \"\\ud800\"}", "surrogate"},
        {"{\"tokens\": [1], \"id\": \"\\u12\"}", "4 hex digits"},
        {"{\"tokens\": [1], \"id\": \"a\tb\"}", "control character"},
        {"{\"tokens\": [1], \"id\": \"unterminated}", "unterminated string"},
        {"{\"tokens\": [1], \"x\": tru}", "unexpected"},
        {"{\"tokens\": [1], \"x\": nul}", "unexpected"},
        {"{\"tokens\": [1], \"x\": "
         "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
         "nested deeper"},
        {"{\"tokens\": [1], \"x\": 1.}", "digits expected after '.'"},
        {"{\"tokens\": [1], \"x\": 1e}", "digits expected in an exponent"},
        {"{\"tokens\": [1], \"x\": -}", "expected a number"},
        {"{\"tokens\": [1], x: 1}", "expected a field name"},
        {"{\"tokens\": [1] \"x\": 1}", "expected ',' or '}'"},
        {"{\"tokens\" [1]}", "expected ':'"},
        {"{\"tokens\": [1], \"id\": \"0123456789012345678901234567890123456789012345678901234567"
         "890123456789\"}",
         "id longer than"},
        {"{\"tokens\": [1], \"x\": 1}\n{\"tokens\": [2]}", "trailing characters"},
        /* strict JSON is UTF-8: malformed sequences inside strings */
        {"{\"tokens\": [1], \"id\": \"a\xff\"}", "invalid UTF-8 (byte 0xff)"},
        {"{\"tokens\": [1], \"id\": \"\xc3\"}", "invalid UTF-8"},            /* truncated */
        {"{\"tokens\": [1], \"id\": \"\xc0\xaf\"}", "invalid UTF-8"},        /* overlong */
        {"{\"tokens\": [1], \"x\": \"\xed\xa0\x80\"}", "invalid UTF-8"},     /* surrogate */
        {"{\"tokens\": [1], \"x\": \"\xf4\x90\x80\x80\"}", "invalid UTF-8"}, /* > U+10FFFF */
        {"{\"tokens\": [1], \"\x80\": 1}", "invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvf_trace_req q;
        char err[256] = "";
        int rc = parse(bad[i].line, &q, err, sizeof err);
        if (rc != -1 || !strstr(err, bad[i].reason) || strncmp(err, "column ", 7)) {
            TEST_FAIL_AT(__FILE__, __LINE__, "line %zu '%s': rc %d, '%s' (wanted '%s')", i,
                         bad[i].line, rc, err, bad[i].reason);
            if (rc == 1)
                kvf_trace_req_free(&q);
        }
    }
    kvf_trace_req q;
    char err[256];
    /* well-formed UTF-8 of each length is kept as it is */
    REQUIRE(parse("{\"tokens\": [1], \"id\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", &q, err,
                  sizeof err) == 1);
    CHECK(!strcmp(q.id, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
    kvf_trace_req_free(&q);
    size_t bad_at = 0;
    CHECK_EQ_INT(kvf_trace_utf8_check("ab\xc3\xa9\xe0\x80\x80", 7, &bad_at), -1);
    CHECK_EQ_U64(bad_at, 4);
    CHECK_EQ_INT(kvf_trace_utf8_check("", 0, NULL), 0);
    /* an embedded NUL is just a bad character */
    CHECK_EQ_INT(kvf_trace_parse_line("{\"tokens\": [1]\0}", 16, &q, err, sizeof err), -1);
    /* a tiny error buffer is fine */
    CHECK_EQ_INT(kvf_trace_parse_line("{", 1, &q, err, 4), -1);
    CHECK_EQ_INT(kvf_trace_parse_line("{", 1, &q, NULL, 0), -1);
    return 0;
}

static int test_read_file(void)
{
    /* the error names the file and the line, blank lines count */
    char buf[] = "{\"id\": \"a\", \"tokens\": [1, 2]}\n\n{\"id\": \"b\", \"tokens\": [1,, 2]}\n";
    FILE *f = fmemopen(buf, sizeof buf - 1, "r");
    REQUIRE(f);
    kvf_trace t = {0};
    fflush(stderr);
    CHECK_EQ_INT(kvf_trace_read(f, "t.jsonl", &t), -1);
    CHECK_EQ_U64(t.n, 0);
    fclose(f);

    char ok[] = "{\"id\": \"late\", \"arrival\": 2, \"tokens\": [1]}\n"
                "{\"id\": \"inherits\", \"tokens\": [2]}\n"
                "{\"id\": \"early\", \"arrival\": 1, \"blocks\": [\"0x1\"]}\n";
    f = fmemopen(ok, sizeof ok - 1, "r");
    REQUIRE(f);
    CHECK_EQ_INT(kvf_trace_read(f, "ok.jsonl", &t), 0);
    fclose(f);
    REQUIRE(t.n == 3);
    CHECK(t.reqs[1].arrival == 2 && t.reqs[1].line == 2);
    kvf_trace_sort(&t);
    CHECK(!strcmp(t.reqs[0].id, "early") && !strcmp(t.reqs[1].id, "late") &&
          !strcmp(t.reqs[2].id, "inherits"));
    kvf_trace_free(&t);

    /* an empty or whitespace-only trace reads and sorts to no requests
     * (UBSan once caught the sort's memcpy into the NULL array) */
    static const char *const empty[] = {"", " \n\t\r\n\n"};
    for (int k = 0; k < 2; k++) {
        char e[16];
        size_t n = strlen(empty[k]);
        memcpy(e, empty[k], n + 1);
        f = fmemopen(e, n ? n : 1, "r");
        REQUIRE(f);
        if (!n)
            fgetc(f); /* fmemopen wants a size: one byte read away, at its end */
        CHECK_EQ_INT(kvf_trace_read(f, "empty.jsonl", &t), 0);
        fclose(f);
        CHECK_EQ_U64(t.n, 0);
        kvf_trace_sort(&t);
        CHECK_EQ_U64(t.n, 0);
        kvf_trace_free(&t);
    }
    return 0;
}

/* A generated trace written and read back is the same trace. */
static int test_round_trip(void)
{
    for (int kind = 0; kind < 4; kind++) {
        kvf_trace a = {0}, b = {0}, c = {0};
        REQUIRE(kvf_trace_generate((kvf_trace_gen)kind, 60, 9, &a) == 0);
        REQUIRE(kvf_trace_generate((kvf_trace_gen)kind, 60, 9, &c) == 0);
        REQUIRE(a.n == 60 && c.n == 60);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        REQUIRE(f);
        CHECK_EQ_INT(kvf_trace_write(&a, f), 0);
        fclose(f);
        f = fmemopen(text, len, "r");
        REQUIRE(f);
        CHECK_EQ_INT(kvf_trace_read(f, "mem", &b), 0);
        fclose(f);
        free(text);
        REQUIRE(b.n == a.n);
        size_t shared = 0;
        for (size_t i = 0; i < a.n; i++) {
            const kvf_trace_req *x = &a.reqs[i], *y = &b.reqs[i];
            CHECK(!strcmp(x->id, y->id));
            CHECK(x->arrival == y->arrival);
            CHECK(x->priority == y->priority && x->salt == y->salt);
            CHECK(x->n_tokens == y->n_tokens && x->n_tokens > 0);
            CHECK(!memcmp(x->tokens, y->tokens, x->n_tokens * sizeof *x->tokens));
            CHECK(x->n_tokens == c.reqs[i].n_tokens &&
                  !memcmp(x->tokens, c.reqs[i].tokens, x->n_tokens * 4)); /* same seed */
            if (i && x->arrival <= a.reqs[i - 1].arrival - 1e-9)
                TEST_FAIL_AT(__FILE__, __LINE__, "arrivals go backwards at %zu", i);
            /* prefixes are shared: the first block of some earlier request */
            for (size_t j = 0; j < i && x->n_tokens >= 16; j++)
                if (a.reqs[j].n_tokens >= 16 && !memcmp(a.reqs[j].tokens, x->tokens, 64)) {
                    shared++;
                    break;
                }
        }
        CHECK(shared > 10);
        kvf_trace_free(&a);
        kvf_trace_free(&b);
        kvf_trace_free(&c);
    }
    kvf_trace_gen g;
    CHECK(kvf_trace_gen_parse("few-shot", &g) == 0 && g == KVF_GEN_FEW_SHOT);
    CHECK(kvf_trace_gen_parse("nope", &g) == -1);
    return 0;
}

static uint64_t fuzz_rng = 88172645463325252ull;
static uint64_t fuzz_next(void)
{
    fuzz_rng ^= fuzz_rng << 13;
    fuzz_rng ^= fuzz_rng >> 7;
    fuzz_rng ^= fuzz_rng << 17;
    return fuzz_rng;
}

static int test_fuzz(void)
{
    static const char *const seeds[] = {
        "{\"id\": \"r1\", \"arrival\": 0.25, \"tokens\": [1, 2, 3, 4000000000]}",
        "{\"id\": 3, \"blocks\": [\"0x9f\", 17], \"salt\": \"s\\\"\\\\\\u00e9\", \"priority\": 9}",
        "{\"x\": {\"y\": [true, false, null, -0.5e+7, \"\\ud83d\\ude00\"]}, \"tokens\": []}",
    };
    static const char alphabet[] = "{}[]\",:0123456789-+.eE\\u tnfrx\t\n";
    size_t parsed = 0, refused = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = strlen(seeds[s]);
        char *b = malloc(n + 1);
        for (size_t cut = 0; cut <= n; cut++) { /* every prefix */
            kvf_trace_req q;
            char err[128];
            char *x = malloc(cut ? cut : 1);
            memcpy(x, seeds[s], cut);
            int rc = kvf_trace_parse_line(x, cut, &q, err, sizeof err);
            CHECK(rc == -1 || cut == n || (rc == 0 && cut == 0));
            if (rc == 1)
                kvf_trace_req_free(&q);
            free(x);
        }
        for (int it = 0; it < 20000; it++) {
            memcpy(b, seeds[s], n);
            for (int k = 1 + (int)(fuzz_next() % 4); k > 0; k--) {
                size_t at = fuzz_next() % n;
                uint64_t v = fuzz_next();
                b[at] = v & 1 ? alphabet[(v >> 1) % (sizeof alphabet - 1)] : (char)(v >> 8);
            }
            size_t len = n - (fuzz_next() % 3 == 0 ? fuzz_next() % n : 0);
            char *x = malloc(len ? len : 1);
            memcpy(x, b, len);
            kvf_trace_req q;
            char err[128];
            int rc = kvf_trace_parse_line(x, len, &q, err, sizeof err);
            if (rc == 1) {
                parsed++;
                CHECK(q.has_keys ? q.n_keys < 8 : q.n_tokens < 8);
                kvf_trace_req_free(&q);
            } else if (rc == -1) {
                refused++;
                CHECK(!strncmp(err, "column ", 7));
            }
            free(x);
        }
        free(b);
    }
    printf("fuzz: %zu mutated lines parsed, %zu refused\n", parsed, refused);
    CHECK(parsed > 0 && refused > 0);
    return 0;
}

/* ---- `test_replay_trace --bench [REQUESTS]`: the trace reader against
 * cJSON over one large generated trace, each line parsed into the same
 * request (cJSON's tree walked for the fields, its numbers checked the same
 * way, the UTF-8 check cJSON lacks included). tools/trace.c's header
 * comment states what this measured. */

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One line through cJSON into *q; -1 when it is not a valid request. */
static int cjson_parse_line(const char *line, size_t len, kvf_trace_req *q)
{
    memset(q, 0, sizeof *q);
    if (kvf_trace_utf8_check(line, len, NULL) != 0)
        return -1;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -1;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *arrival = cJSON_GetObjectItemCaseSensitive(o, "arrival");
    const cJSON *priority = cJSON_GetObjectItemCaseSensitive(o, "priority");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    if (cJSON_IsString(id))
        snprintf(q->id, sizeof q->id, "%s", id->valuestring);
    if (cJSON_IsNumber(arrival)) {
        q->arrival = arrival->valuedouble;
        q->has_arrival = true;
    }
    q->priority = cJSON_IsNumber(priority) ? (uint32_t)priority->valuedouble : 50;
    int n = cJSON_GetArraySize(tokens), k = 0, rc = cJSON_IsArray(tokens) ? 0 : -1;
    q->tokens = malloc((size_t)(n ? n : 1) * sizeof *q->tokens);
    const cJSON *t;
    cJSON_ArrayForEach(t, tokens)
    {
        double d = t->valuedouble;
        if (!cJSON_IsNumber(t) || d < 0 || d > 4294967295.0 || d != (double)(uint32_t)d)
            rc = -1;
        else
            q->tokens[k++] = (uint32_t)d;
    }
    q->n_tokens = (size_t)k;
    cJSON_Delete(o);
    if (rc)
        kvf_trace_req_free(q);
    return rc;
}

static int bench_parse(uint32_t requests)
{
    kvf_trace t = {0};
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    REQUIRE(f && kvf_trace_generate(KVF_GEN_MIXED, requests, 1, &t) == 0);
    REQUIRE(kvf_trace_write(&t, f) == 0 && fclose(f) == 0);
    kvf_trace_free(&t);
    double best[2] = {1e30, 1e30};
    uint64_t sum[2] = {0, 0};
    for (int rep = 0; rep < 5; rep++)
        for (int way = 0; way < 2; way++) {
            double t0 = bench_now();
            for (char *p = buf, *e; p < buf + size; p = e + 1) {
                e = memchr(p, '\n', (size_t)(buf + size - p));
                kvf_trace_req q;
                char err[128];
                int rc = way ? cjson_parse_line(p, (size_t)(e - p), &q)
                             : kvf_trace_parse_line(p, (size_t)(e - p), &q, err, sizeof err) - 1;
                REQUIRE(rc == 0);
                sum[way] += q.n_tokens;
                kvf_trace_req_free(&q);
            }
            double s = bench_now() - t0;
            best[way] = s < best[way] ? s : best[way];
        }
    CHECK(sum[0] == sum[1]);
    printf("trace parse, %u requests, %.1f MiB, best of 5: trace.c %.3f s (%.0f MiB/s), "
           "cJSON %.3f s (%.0f MiB/s): cJSON takes %.2fx the time\n",
           requests, size / 1048576.0, best[0], size / 1048576.0 / best[0], best[1],
           size / 1048576.0 / best[1], best[1] / best[0]);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--bench"))
        return bench_parse(argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 20000);
    RUN(test_valid);
    RUN(test_malformed);
    RUN(test_read_file);
    RUN(test_round_trip);
    RUN(test_fuzz);
    return TEST_RESULT();
}
