/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Built-in shared-prefix workloads for `kvferry replay --gen`: the request
 * shapes that make a prefix cache pay off in serving, with lengths in
 * tokens as chat and RAG front ends see them. The same seed gives the same
 * trace on every machine (own PRNG, no libc rand, no floating point in the
 * token streams).
 *
 *  system-prompt  8 system prompts (256-1536 tokens), picked with a Zipf-like
 *                 skew, each followed by a user message (16-256 tokens);
 *                 one request in ten runs under a LoRA adapter (a salt).
 *  multi-turn     up to 16 live chats; each request is a chat's whole history
 *                 plus a new user message (16-128), and the reply (32-256)
 *                 joins the history for the next turn; chats end after 2-10
 *                 turns.
 *  few-shot       6 templates: an instruction (64-160) and 3-8 examples
 *                 (48-160 each), then a question (8-64).
 *  mixed          40% system-prompt, 35% multi-turn, 25% few-shot.
 *
 * Arrivals are a Poisson process of 20 requests a second.
 */
#include "trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 32000u
#define N_SYS 8
#define N_CHATS 16
#define N_TEMPLATES 6
#define RATE 20.0 /* requests per second */
#define MAX_HISTORY 8192

typedef struct tokbuf {
    uint32_t *t;
    size_t n, cap;
} tokbuf;

typedef struct chat {
    tokbuf history;
    uint32_t id, turn, turns;
} chat;

typedef struct gen_state {
    uint64_t rng;
    tokbuf sys[N_SYS];
    tokbuf tpl[N_TEMPLATES];
    chat chats[N_CHATS];
    uint32_t next_chat;
    uint32_t count[3]; /* requests made per workload, for ids */
} gen_state;

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint32_t uniform(gen_state *g, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(next_u64(&g->rng) % ((uint64_t)hi - lo + 1));
}

static int tb_reserve(tokbuf *b, size_t n)
{
    return kvf_trace_grow((void **)&b->t, &b->cap, n, sizeof *b->t, 256);
}

static int tb_add_random(gen_state *g, tokbuf *b, size_t n)
{
    if (tb_reserve(b, b->n + n))
        return -1;
    for (size_t i = 0; i < n; i++)
        b->t[b->n++] = (uint32_t)(next_u64(&g->rng) % VOCAB);
    return 0;
}

/* A request's tokens: `prefix` then `tail` fresh random tokens. */
static int make_req(gen_state *g, const tokbuf *prefix, uint32_t tail, kvf_trace_req *q)
{
    if (prefix->n > (SIZE_MAX / sizeof *q->tokens) - 1 - tail)
        return -1;
    q->n_tokens = prefix->n + tail;
    q->tokens = malloc((q->n_tokens ? q->n_tokens : 1) * sizeof *q->tokens);
    if (!q->tokens)
        return -1;
    if (prefix->n)
        memcpy(q->tokens, prefix->t, prefix->n * sizeof *q->tokens);
    for (size_t i = prefix->n; i < q->n_tokens; i++)
        q->tokens[i] = (uint32_t)(next_u64(&g->rng) % VOCAB);
    return 0;
}

static int gen_system(gen_state *g, kvf_trace_req *q)
{
    /* Zipf-like: prompt i with weight 1/(i+1), in integer arithmetic */
    static const uint32_t cum[N_SYS] = {840, 1260, 1540, 1750, 1918, 2058, 2178, 2283};
    uint32_t x = uniform(g, 0, cum[N_SYS - 1] - 1), i = 0;
    while (x >= cum[i])
        i++;
    snprintf(q->id, sizeof q->id, "sys%u-%u", i, g->count[0]++);
    if (uniform(g, 0, 9) == 0)
        snprintf(q->salt_name, sizeof q->salt_name, "lora-sql");
    q->salt = q->salt_name[0] ? kvf_key_salt(q->salt_name) : 0;
    q->priority = 60;
    return make_req(g, &g->sys[i], uniform(g, 16, 256), q);
}

static int gen_chat(gen_state *g, kvf_trace_req *q)
{
    chat *c = &g->chats[uniform(g, 0, N_CHATS - 1)];
    if (c->turn >= c->turns || c->history.n > MAX_HISTORY) { /* a new chat here */
        c->history.n = 0;
        c->id = g->next_chat++;
        c->turn = 0;
        c->turns = uniform(g, 2, 10);
        if (tb_add_random(g, &c->history, uniform(g, 64, 256)))
            return -1;
    }
    snprintf(q->id, sizeof q->id, "chat%u-t%u", c->id, c->turn);
    q->priority = 50;
    g->count[1]++;
    uint32_t user = uniform(g, 16, 128);
    if (make_req(g, &c->history, user, q))
        return -1;
    /* the next turn's history: this request, then the model's reply */
    if (tb_reserve(&c->history, q->n_tokens))
        return -1;
    memcpy(c->history.t, q->tokens, q->n_tokens * sizeof *q->tokens);
    c->history.n = q->n_tokens;
    c->turn++;
    return tb_add_random(g, &c->history, uniform(g, 32, 256));
}

static int gen_few_shot(gen_state *g, kvf_trace_req *q)
{
    uint32_t i = uniform(g, 0, N_TEMPLATES - 1);
    snprintf(q->id, sizeof q->id, "fs%u-%u", i, g->count[2]++);
    q->priority = 40;
    return make_req(g, &g->tpl[i], uniform(g, 8, 64), q);
}

static int gen_setup(gen_state *g)
{
    for (int i = 0; i < N_SYS; i++)
        if (tb_add_random(g, &g->sys[i], uniform(g, 256, 1536)))
            return -1;
    for (int i = 0; i < N_TEMPLATES; i++) {
        if (tb_add_random(g, &g->tpl[i], uniform(g, 64, 160)))
            return -1;
        for (uint32_t k = uniform(g, 3, 8); k > 0; k--)
            if (tb_add_random(g, &g->tpl[i], uniform(g, 48, 160)))
                return -1;
    }
    return 0;
}

static void gen_free(gen_state *g)
{
    for (int i = 0; i < N_SYS; i++)
        free(g->sys[i].t);
    for (int i = 0; i < N_TEMPLATES; i++)
        free(g->tpl[i].t);
    for (int i = 0; i < N_CHATS; i++)
        free(g->chats[i].history.t);
}

static const char *const gen_names[] = {"system-prompt", "multi-turn", "few-shot", "mixed"};

int kvf_trace_gen_parse(const char *name, kvf_trace_gen *gen_p)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, gen_names[i])) {
            *gen_p = (kvf_trace_gen)i;
            return 0;
        }
    return -1;
}

const char *kvf_trace_gen_name(kvf_trace_gen gen)
{
    return (unsigned)gen < 4 ? gen_names[gen] : "?";
}

int kvf_trace_generate(kvf_trace_gen kind, uint32_t requests, uint64_t seed, kvf_trace *trace)
{
    gen_state g;
    memset(&g, 0, sizeof g);
    g.rng = seed;
    int rc = gen_setup(&g);
    double arrival = 0;
    for (uint32_t r = 0; rc == 0 && r < requests; r++) {
        kvf_trace_req q;
        memset(&q, 0, sizeof q);
        kvf_trace_gen k = kind;
        if (k == KVF_GEN_MIXED) {
            uint32_t x = uniform(&g, 0, 99);
            k = x < 40 ? KVF_GEN_SYSTEM_PROMPT : x < 75 ? KVF_GEN_MULTI_TURN : KVF_GEN_FEW_SHOT;
        }
        rc = k == KVF_GEN_SYSTEM_PROMPT ? gen_system(&g, &q)
             : k == KVF_GEN_MULTI_TURN  ? gen_chat(&g, &q)
                                        : gen_few_shot(&g, &q);
        /* exponential gaps from 53 random bits, rounded to the microsecond
         * the trace file keeps */
        double u = ((next_u64(&g.rng) >> 11) + 1) * (1.0 / 9007199254740993.0);
        arrival = round((arrival - log(u) / RATE) * 1e6) / 1e6;
        q.arrival = arrival;
        q.has_arrival = true;
        if (rc == 0)
            rc = kvf_trace_append(trace, &q);
        if (rc)
            kvf_trace_req_free(&q);
    }
    gen_free(&g);
    if (rc)
        kvf_trace_free(trace);
    return rc;
}
