/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The JSONL trace format of `kvferry replay`, read with a small, strict
 * JSON reader for the one shape a line may have: an object whose known
 * fields are typed (id, arrival, priority, salt, tokens, blocks) and whose
 * unknown fields may hold any JSON value. Every read is bounded by the
 * line's end, so a truncated or hostile line is an error, never a read
 * past it. Strings must be well-formed UTF-8, as strict JSON requires.
 *
 * Why not cJSON (which the CLI's JSON writers use): measured with
 * `tests/test_replay_trace --bench 20000` (a generated mixed trace of
 * 127 MiB, each line parsed into a request, best of 5, RelWithDebInfo),
 * this reader took 1.14-1.42 s and cJSON 3.05-3.55 s, 2.5-2.7x the time,
 * with the UTF-8 check cJSON lacks added to it. Traces of many requests are
 * read before a replay starts, so the reader is kept.
 */
#include "trace.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32 /* nesting of unknown fields' values */

typedef struct reader {
    const char *start, *p, *end;
    char *err;
    size_t errcap;
} reader;

static int fail(reader *r, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(r->err, r->errcap, "column %zu: ", (size_t)(r->p - r->start) + 1);
    if (n >= 0 && (size_t)n < r->errcap) {
        va_start(ap, fmt);
        vsnprintf(r->err + n, r->errcap - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\r' || *r->p == '\n'))
        r->p++;
}

static int peek(reader *r)
{
    skip_ws(r);
    return r->p < r->end ? (unsigned char)*r->p : -1;
}

/* A character of the input for a message: itself, or its code. */
static const char *shown(int c, char buf[8])
{
    if (c > 0x20 && c < 0x7f)
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02x", (unsigned)c & 0xff);
    return buf;
}

static int expect(reader *r, char c, const char *what)
{
    char b[8];
    if (peek(r) != (unsigned char)c) {
        if (r->p >= r->end)
            return fail(r, "line ends where %s was expected", what);
        return fail(r, "expected %s, found %s", what, shown((unsigned char)*r->p, b));
    }
    r->p++;
    return 0;
}

static int hex_digit(int c)
{
    static const char digits[] = "0123456789abcdef";
    const char *d = c > 0 && c < 0x80 ? strchr(digits, tolower(c)) : NULL;
    return d ? (int)(d - digits) : -1;
}

static int read_u16_escape(reader *r, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = r->p < r->end ? hex_digit((unsigned char)*r->p) : -1;
        if (d < 0)
            return fail(r, "bad \\u escape: 4 hex digits expected");
        v = v << 4 | (unsigned)d;
        r->p++;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: shortest
 * form, no surrogates, at most U+10FFFF), 0 when there is none. */
static size_t utf8_sequence(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

int kvf_trace_utf8_check(const char *s, size_t len, size_t *bad_p)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        size_t k = utf8_sequence(p, end);
        if (!k) {
            if (bad_p)
                *bad_p = (size_t)(p - (const unsigned char *)s);
            return -1;
        }
        p += k;
    }
    return 0;
}

/* A string, decoded into out[0..cap) and NUL-terminated (out NULL: checked
 * and skipped). *len_p gets the decoded length; a NUL inside is kept and
 * counted, so callers that need C strings can refuse it. */
static int read_string(reader *r, char *out, size_t cap, size_t *len_p, const char *what)
{
    if (expect(r, '"', what))
        return -1;
    size_t n = 0;
    for (;;) {
        if (r->p >= r->end)
            return fail(r, "unterminated string");
        unsigned char c = (unsigned char)*r->p;
        char buf[8];
        size_t k = 1;
        if (c == '"') {
            r->p++;
            break;
        }
        if (c < 0x20)
            return fail(r, "control character 0x%02x in a string", c);
        if (c == '\\') {
            r->p++;
            if (r->p >= r->end)
                return fail(r, "unterminated string");
            char e = *r->p++;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                buf[0] = e;
                break;
            case 'b':
                buf[0] = '\b';
                break;
            case 'f':
                buf[0] = '\f';
                break;
            case 'n':
                buf[0] = '\n';
                break;
            case 'r':
                buf[0] = '\r';
                break;
            case 't':
                buf[0] = '\t';
                break;
            case 'u': {
                unsigned cp, lo;
                if (read_u16_escape(r, &cp))
                    return -1;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return fail(r, "lone low surrogate in a \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u')
                        return fail(r, "high surrogate without its low half");
                    r->p += 2;
                    if (read_u16_escape(r, &lo))
                        return -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return fail(r, "high surrogate without its low half");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                k = put_utf8(buf, cp);
                break;
            }
            default:
                r->p--;
                return fail(r, "bad escape after '\\': %s", shown((unsigned char)e, buf));
            }
        } else if (c < 0x80) {
            buf[0] = (char)c;
            r->p++;
        } else { /* strict JSON is UTF-8: a malformed sequence is refused */
            k = utf8_sequence((const unsigned char *)r->p, (const unsigned char *)r->end);
            if (!k)
                return fail(r, "invalid UTF-8 (byte 0x%02x) in a string", c);
            memcpy(buf, r->p, k);
            r->p += k;
        }
        if (out) {
            if (n + k >= cap)
                return fail(r, "%s longer than %zu bytes", what, cap - 1);
            memcpy(out + n, buf, k);
        }
        n += k;
    }
    if (out)
        out[n] = '\0';
    if (len_p)
        *len_p = n;
    return 0;
}

typedef struct number {
    bool integer; /* no fraction, no exponent, no sign, fits in 64 bits */
    uint64_t u;
    double d;
} number;

/* A number of JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int read_number(reader *r, number *num)
{
    skip_ws(r);
    const char *s = r->p;
    const char *q = s;
    bool neg = false, frac = false, overflow = false;
    uint64_t u = 0;
    if (q < r->end && *q == '-') {
        neg = true;
        q++;
    }
    if (q >= r->end || *q < '0' || *q > '9')
        return fail(r, "expected a number");
    if (*q == '0' && q + 1 < r->end && q[1] >= '0' && q[1] <= '9')
        return fail(r, "number with a leading zero");
    for (; q < r->end && *q >= '0' && *q <= '9'; q++) {
        unsigned dg = (unsigned)(*q - '0');
        if (u > (UINT64_MAX - dg) / 10)
            overflow = true;
        u = u * 10 + dg;
    }
    if (q < r->end && *q == '.') {
        frac = true;
        q++;
        if (q >= r->end || *q < '0' || *q > '9') {
            r->p = q;
            return fail(r, "digits expected after '.'");
        }
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        frac = true;
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || *q < '0' || *q > '9') {
            r->p = q;
            return fail(r, "digits expected in an exponent");
        }
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t n = (size_t)(q - s);
    if (n >= sizeof buf)
        return fail(r, "number longer than %zu characters", sizeof buf - 1);
    memcpy(buf, s, n);
    buf[n] = '\0';
    num->integer = !neg && !frac && !overflow;
    num->u = u;
    num->d = strtod(buf, NULL);
    r->p = q;
    return 0;
}

static int read_literal(reader *r, const char *word)
{
    size_t n = strlen(word);
    char b[8];
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return fail(r, "unexpected %s", shown((unsigned char)*r->p, b));
    r->p += n;
    return 0;
}

/* Any JSON value, checked and skipped. */
static int skip_value(reader *r, int depth)
{
    int c = peek(r);
    if (depth > MAX_DEPTH)
        return fail(r, "values nested deeper than %d", MAX_DEPTH);
    if (c == '"')
        return read_string(r, NULL, 0, NULL, "a string");
    if (c == '-' || (c >= '0' && c <= '9')) {
        number num;
        return read_number(r, &num);
    }
    if (c == 't')
        return read_literal(r, "true");
    if (c == 'f')
        return read_literal(r, "false");
    if (c == 'n')
        return read_literal(r, "null");
    if (c == '[' || c == '{') {
        char close = c == '[' ? ']' : '}';
        r->p++;
        if (peek(r) == close) {
            r->p++;
            return 0;
        }
        for (;;) {
            if (close == '}' &&
                (read_string(r, NULL, 0, NULL, "a field name") || expect(r, ':', "':'")))
                return -1;
            if (skip_value(r, depth + 1))
                return -1;
            c = peek(r);
            if (c == ',') {
                r->p++;
                continue;
            }
            if (c == close) {
                r->p++;
                return 0;
            }
            return close == ']' ? expect(r, ']', "',' or ']'") : expect(r, '}', "',' or '}'");
        }
    }
    if (c < 0)
        return fail(r, "line ends where a value was expected");
    char b[8];
    return fail(r, "unexpected %s", shown(c, b));
}

/* A JSON array of items read by `item`, into a growing array of `size`-byte
 * elements. */
static int read_array(reader *r, const char *what, size_t size, void **items_p, size_t *n_p,
                      int (*item)(reader *r, void *out, size_t index))
{
    if (expect(r, '[', "'[' (an array)"))
        return -1;
    char *items = NULL;
    size_t n = 0, cap = 0;
    if (peek(r) == ']') {
        r->p++;
        *items_p = NULL;
        *n_p = 0;
        return 0;
    }
    for (;;) {
        if (kvf_trace_grow((void **)&items, &cap, n + 1, size, 64)) {
            free(items);
            return fail(r, "out of memory for %zu %s", n + 1, what);
        }
        if (item(r, items + n * size, n)) {
            free(items);
            return -1;
        }
        n++;
        int c = peek(r);
        if (c == ',') {
            r->p++;
            continue;
        }
        if (c == ']') {
            r->p++;
            break;
        }
        free(items);
        return expect(r, ']', "',' or ']'");
    }
    *items_p = items;
    *n_p = n;
    return 0;
}

static int token_item(reader *r, void *out, size_t index)
{
    number num;
    const char *at = r->p;
    if (read_number(r, &num))
        return -1;
    if (!num.integer || num.u > UINT32_MAX) {
        r->p = at;
        skip_ws(r);
        return fail(r, "tokens[%zu]: a token id is an integer in 0..4294967295", index);
    }
    uint32_t t = (uint32_t)num.u;
    memcpy(out, &t, sizeof t);
    return 0;
}

/* A block key: an integer (a 64-bit key, {0, n}), or a string of 1-32 hex
 * digits with an optional 0x (the 128-bit key, hi then lo, as kvferry
 * prints it); never 0. */
static int key_item(reader *r, void *out, size_t index)
{
    kvf_key key = KVF_KEY_ROOT;
    skip_ws(r);
    const char *at = r->p;
    if (peek(r) == '"') {
        char s[40];
        size_t n;
        if (read_string(r, s, sizeof s, &n, "a block key")) {
            r->p = at;
            return fail(r, "blocks[%zu]: a key string holds 1-32 hex digits", index);
        }
        const char *h = s;
        if (n >= 2 && h[0] == '0' && (h[1] == 'x' || h[1] == 'X')) {
            h += 2;
            n -= 2;
        }
        if (n == 0 || n > 32) {
            r->p = at;
            return fail(r, "blocks[%zu]: a key string holds 1-32 hex digits", index);
        }
        for (size_t i = 0; i < n; i++) {
            int d = hex_digit((unsigned char)h[i]);
            if (d < 0) {
                r->p = at;
                return fail(r, "blocks[%zu]: '%s' is not a hex key", index, s);
            }
            key.hi = key.hi << 4 | key.lo >> 60;
            key.lo = key.lo << 4 | (unsigned)d;
        }
    } else {
        number num;
        if (read_number(r, &num))
            return -1;
        if (!num.integer) {
            r->p = at;
            return fail(r, "blocks[%zu]: a key is a hex string or an integer in 1..2^64-1", index);
        }
        key.lo = num.u;
    }
    if (kvf_key_is_root(key)) {
        r->p = at;
        return fail(r, "blocks[%zu]: key 0 is not a block key", index);
    }
    memcpy(out, &key, sizeof key);
    return 0;
}

enum { F_ID = 1, F_ARRIVAL = 2, F_PRIORITY = 4, F_SALT = 8, F_TOKENS = 16, F_BLOCKS = 32 };

static int read_field(reader *r, const char *name, unsigned *seen, kvf_trace_req *q)
{
    static const struct {
        const char *name;
        unsigned bit;
    } known[] = {{"id", F_ID},     {"arrival", F_ARRIVAL}, {"priority", F_PRIORITY},
                 {"salt", F_SALT}, {"tokens", F_TOKENS},   {"blocks", F_BLOCKS}};
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i].name))
            bit = known[i].bit;
    if (!bit)
        return skip_value(r, 1);
    if (*seen & bit)
        return fail(r, "field \"%s\" given twice", name);
    *seen |= bit;
    number num;
    size_t n;
    const char *at = (skip_ws(r), r->p);
    switch (bit) {
    case F_ID:
        if (peek(r) == '"') {
            if (read_string(r, q->id, sizeof q->id, &n, "id"))
                return -1;
            if (strlen(q->id) != n)
                return fail(r, "id holds a NUL character");
            return 0;
        }
        if (read_number(r, &num))
            return -1;
        if (!num.integer)
            return r->p = at, fail(r, "id is a string or a non-negative integer");
        snprintf(q->id, sizeof q->id, "%llu", (unsigned long long)num.u);
        return 0;
    case F_ARRIVAL:
        if (read_number(r, &num))
            return -1;
        if (!isfinite(num.d) || num.d < 0)
            return r->p = at, fail(r, "arrival is a number of seconds >= 0");
        q->arrival = num.d;
        q->has_arrival = true;
        return 0;
    case F_PRIORITY:
        if (read_number(r, &num))
            return -1;
        if (!num.integer || num.u > 100)
            return r->p = at, fail(r, "priority is an integer in 0..100");
        q->priority = (uint32_t)num.u;
        return 0;
    case F_SALT:
        if (peek(r) == '"') {
            if (read_string(r, q->salt_name, sizeof q->salt_name, &n, "salt"))
                return -1;
            if (strlen(q->salt_name) != n)
                return fail(r, "salt holds a NUL character");
            q->salt = kvf_key_salt(q->salt_name);
            return 0;
        }
        if (read_number(r, &num))
            return -1;
        if (!num.integer)
            return r->p = at, fail(r, "salt is a string or a non-negative integer");
        q->salt = num.u;
        return 0;
    case F_TOKENS:
        return read_array(r, "tokens", sizeof(uint32_t), (void **)&q->tokens, &q->n_tokens,
                          token_item);
    default:
        q->has_keys = true;
        return read_array(r, "keys", sizeof(kvf_key), (void **)&q->keys, &q->n_keys, key_item);
    }
}

int kvf_trace_parse_line(const char *line, size_t len, kvf_trace_req *req, char *err, size_t errcap)
{
    char dummy[1];
    reader r = {line, line, line + len, errcap ? err : dummy, errcap ? errcap : sizeof dummy};
    kvf_trace_req q;
    memset(&q, 0, sizeof q);
    q.priority = KVF_TRACE_PRIORITY_DEFAULT;
    if (peek(&r) < 0)
        return 0;
    unsigned seen = 0;
    if (expect(&r, '{', "'{' (one JSON object per line)"))
        goto fail;
    if (peek(&r) == '}') {
        r.p++;
    } else {
        for (;;) {
            char name[64];
            const char *at = (skip_ws(&r), r.p);
            if (read_string(&r, name, sizeof name, NULL, "a field name")) {
                /* a long unknown name is still a valid field: skip it */
                r.p = at;
                if (read_string(&r, NULL, 0, NULL, "a field name"))
                    goto fail;
                name[0] = '\0';
            }
            if (expect(&r, ':', "':'"))
                goto fail;
            if (name[0] ? read_field(&r, name, &seen, &q) : skip_value(&r, 1))
                goto fail;
            int c = peek(&r);
            if (c == ',') {
                r.p++;
                continue;
            }
            if (c == '}') {
                r.p++;
                break;
            }
            expect(&r, '}', "',' or '}'");
            goto fail;
        }
    }
    if (peek(&r) >= 0) {
        fail(&r, "trailing characters after the object");
        goto fail;
    }
    if ((seen & (F_TOKENS | F_BLOCKS)) == (F_TOKENS | F_BLOCKS)) {
        fail(&r, "a request has \"tokens\" or \"blocks\", not both");
        goto fail;
    }
    if (!(seen & (F_TOKENS | F_BLOCKS))) {
        fail(&r, "a request needs \"tokens\" or \"blocks\"");
        goto fail;
    }
    *req = q;
    return 1;
fail:
    kvf_trace_req_free(&q);
    return -1;
}

void kvf_trace_req_free(kvf_trace_req *req)
{
    free(req->tokens);
    free(req->keys);
    req->tokens = NULL;
    req->keys = NULL;
    req->n_tokens = req->n_keys = 0;
}

int kvf_trace_grow(void **items_p, size_t *cap_p, size_t need, size_t size, size_t first)
{
    if (need <= *cap_p)
        return 0;
    size_t cap = *cap_p ? *cap_p : first;
    while (cap < need)
        cap *= 2;
    if (cap > SIZE_MAX / size)
        return -1;
    void *m = realloc(*items_p, cap * size);
    if (!m)
        return -1;
    *items_p = m;
    *cap_p = cap;
    return 0;
}

int kvf_trace_append(kvf_trace *t, kvf_trace_req *req)
{
    if (kvf_trace_grow((void **)&t->reqs, &t->cap, t->n + 1, sizeof *t->reqs, 256))
        return -1;
    t->reqs[t->n++] = *req;
    return 0;
}

void kvf_trace_free(kvf_trace *t)
{
    for (size_t i = 0; i < t->n; i++)
        kvf_trace_req_free(&t->reqs[i]);
    free(t->reqs);
    memset(t, 0, sizeof *t);
}

int kvf_trace_read(FILE *f, const char *name, kvf_trace *t)
{
    char *line = NULL, err[256];
    size_t cap = 0, lineno = 0;
    ssize_t n;
    double arrival = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        kvf_trace_req q;
        lineno++;
        int got = kvf_trace_parse_line(line, (size_t)n, &q, err, sizeof err);
        if (got < 0) {
            fprintf(stderr, "kvferry replay: %s:%zu: %s\n", name, lineno, err);
            rc = -1;
            break;
        }
        if (got == 0)
            continue;
        q.line = lineno;
        if (!q.id[0])
            snprintf(q.id, sizeof q.id, "line %zu", lineno);
        if (q.has_arrival)
            arrival = q.arrival;
        else
            q.arrival = arrival;
        if (kvf_trace_append(t, &q)) {
            kvf_trace_req_free(&q);
            fprintf(stderr, "kvferry replay: %s:%zu: out of memory\n", name, lineno);
            rc = -1;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "kvferry replay: %s: read error after line %zu: %s\n", name, lineno,
                strerror(errno));
        rc = -1;
    }
    free(line);
    if (rc)
        kvf_trace_free(t);
    return rc;
}

void kvf_trace_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int kvf_trace_write(const kvf_trace *t, FILE *f)
{
    for (size_t i = 0; i < t->n; i++) {
        const kvf_trace_req *q = &t->reqs[i];
        fputs("{\"id\": ", f);
        kvf_trace_json_string(f, q->id);
        /* microseconds as fixed point; a huge arrival (which the reader
         * takes) in exponent form, which it reads back as the same double,
         * where %.6f would outgrow the reader's longest number */
        fprintf(f, q->arrival < 1e12 ? ", \"arrival\": %.6f" : ", \"arrival\": %.17g", q->arrival);
        fprintf(f, ", \"priority\": %u", q->priority);
        if (q->salt_name[0]) {
            fputs(", \"salt\": ", f);
            kvf_trace_json_string(f, q->salt_name);
        } else if (q->salt) {
            fprintf(f, ", \"salt\": %llu", (unsigned long long)q->salt);
        }
        if (q->has_keys) {
            fputs(", \"blocks\": [", f);
            for (size_t k = 0; k < q->n_keys; k++)
                fprintf(f, "%s\"" KVF_KEY_FMT "\"", k ? ", " : "", KVF_KEY_ARGS(q->keys[k]));
        } else {
            fputs(", \"tokens\": [", f);
            for (size_t k = 0; k < q->n_tokens; k++)
                fprintf(f, "%s%u", k ? ", " : "", q->tokens[k]);
        }
        fputs("]}\n", f);
    }
    fflush(f);
    return ferror(f) ? -1 : 0;
}

typedef struct order {
    double arrival;
    size_t index;
} order;

static int cmp_order(const void *a, const void *b)
{
    const order *x = a, *y = b;
    if (x->arrival != y->arrival)
        return x->arrival < y->arrival ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

void kvf_trace_sort(kvf_trace *t)
{
    if (t->n < 2) /* also keeps memcpy off an empty trace's NULL array */
        return;
    order *o = malloc(t->n * sizeof *o);
    kvf_trace_req *sorted = malloc(t->n * sizeof *sorted);
    if (!o || !sorted) { /* leave the file order: still a valid replay */
        free(o);
        free(sorted);
        return;
    }
    for (size_t i = 0; i < t->n; i++)
        o[i] = (order){t->reqs[i].arrival, i};
    qsort(o, t->n, sizeof *o, cmp_order);
    for (size_t i = 0; i < t->n; i++)
        sorted[i] = t->reqs[o[i].index];
    memcpy(t->reqs, sorted, t->n * sizeof *sorted);
    free(sorted);
    free(o);
}
