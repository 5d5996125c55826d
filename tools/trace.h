/* SPDX-License-Identifier: Apache-2.0 */
/* Request traces for `kvferry replay`: the JSONL format (trace.c) and the
 * built-in workload generator (tracegen.c). docs/replay.md describes both. */
#ifndef KVF_TRACE_H
#define KVF_TRACE_H

#include "kvferry.h"

#include <stdbool.h>
#include <stdio.h>

#define KVF_TRACE_ID_MAX 64    /* bytes of a request id, NUL included */
#define KVF_TRACE_SALT_MAX 128 /* bytes of a salt name, NUL included */
#define KVF_TRACE_PRIORITY_DEFAULT 50

/* One request of a trace. Either tokens (keys chained from them with the
 * salt) or keys given directly ("blocks"). */
typedef struct kvf_trace_req {
    char id[KVF_TRACE_ID_MAX];
    double arrival;                     /* seconds; requests are replayed in arrival order */
    bool has_arrival;                   /* false: inherits the previous request's arrival */
    uint32_t priority;                  /* 0-100 */
    uint64_t salt;                      /* 0: none */
    char salt_name[KVF_TRACE_SALT_MAX]; /* "" when the salt was a number or absent */
    uint32_t *tokens;
    size_t n_tokens;
    kvf_key *keys; /* with has_keys: the block keys */
    size_t n_keys;
    bool has_keys;
    size_t line; /* 1-based line of the trace file; 0 when generated */
} kvf_trace_req;

typedef struct kvf_trace {
    kvf_trace_req *reqs;
    size_t n, cap;
} kvf_trace;

/*
 * Parses one line (len bytes, not NUL-terminated; a trailing '\n' or "\r\n"
 * is allowed) into *req. Never reads outside [line, line + len).
 * @return 1 a request, 0 a blank line (nothing written), -1 an error with
 *         the reason ("column 12: expected ',' or '}'") in err[0..errcap).
 * On 1 the caller owns req->tokens / req->keys (kvf_trace_req_free).
 */
int kvf_trace_parse_line(const char *line, size_t len, kvf_trace_req *req, char *err,
                         size_t errcap);
void kvf_trace_req_free(kvf_trace_req *req);
/* 0 when s[0..len) is well-formed UTF-8 (RFC 3629), else -1 with the offset
 * of the first byte of the first bad sequence in *bad_p (when not NULL). */
int kvf_trace_utf8_check(const char *s, size_t len, size_t *bad_p);

/* Reads a whole JSONL trace; on an error prints "NAME:LINE: reason" to
 * stderr and returns -1 (the trace is left empty). */
int kvf_trace_read(FILE *f, const char *name, kvf_trace *trace);
/* Writes one JSON line per request, in the format kvf_trace_read takes. */
int kvf_trace_write(const kvf_trace *trace, FILE *f);
/* Grows *items_p (of `size`-byte elements, *cap_p of them) to hold at
 * least `need`, doubling from `first`; -1 when out of memory (the array is
 * kept as it was). */
int kvf_trace_grow(void **items_p, size_t *cap_p, size_t need, size_t size, size_t first);
/* Writes s as a JSON string, quotes included. */
void kvf_trace_json_string(FILE *f, const char *s);
/* Appends a request (taking over its arrays); -1 when out of memory. */
int kvf_trace_append(kvf_trace *trace, kvf_trace_req *req);
/* Orders the requests by arrival, keeping the file order of equal ones. */
void kvf_trace_sort(kvf_trace *trace);
void kvf_trace_free(kvf_trace *trace);

/* The built-in workloads. */
typedef enum kvf_trace_gen {
    KVF_GEN_SYSTEM_PROMPT, /* a few system prompts shared by many requests */
    KVF_GEN_MULTI_TURN,    /* chats whose every turn extends the previous one */
    KVF_GEN_FEW_SHOT,      /* few-shot templates with varying tails */
    KVF_GEN_MIXED          /* all three, interleaved */
} kvf_trace_gen;

/* Parses "system-prompt", "multi-turn", "few-shot" or "mixed". */
int kvf_trace_gen_parse(const char *name, kvf_trace_gen *gen_p);
const char *kvf_trace_gen_name(kvf_trace_gen gen);
/* Generates `requests` requests, the same ones for the same seed. */
int kvf_trace_generate(kvf_trace_gen gen, uint32_t requests, uint64_t seed, kvf_trace *trace);

#endif
