/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading remote values pool group by pool group (store.h's
 * kvf__store_read_groups), the one rule every remote store follows, so
 * that a forward pass can compute layer l while later layers of every
 * block of the batch are still on the wire.
 *
 * A value is read as a growing prefix of ranged reads, each round one
 * read per block of the call (the store sends a round together: one
 * pipeline per Redis node, the S3 requests in flight at once): first the
 * header, the pool table and as much of the first group as the caller
 * expects; then, group after group, from where the last read ended to the
 * end of the group's pools by the table. Nothing is trusted before it is
 * checked: the first read's header names the block (layout, namespace,
 * key) and its table each pool's bytes and CRC-32C; every later group is
 * checked against that one table. A key written again (or removed)
 * between two reads therefore cannot hand over a mix of two values: the
 * new value's pools fail the old table's CRCs (or its value ends early,
 * or is gone), and the block fails. A block failed at any group stays
 * failed: its earlier groups may be in use already, so it is never read
 * again; its later groups are still reported (failed), so that the
 * caller's count of every group is whole.
 */
#include "blockhdr.h"
#include "store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic(kvf__store_group_gate_fn) group_gate;

void kvf__store_set_group_gate(kvf__store_group_gate_fn fn)
{
    atomic_store(&group_gate, fn);
}

/* One block's reading: the first read's bytes (header and table first),
 * the value's bytes in hand ([0, have): the prefix in first, the payload
 * in the block's buf) and its header. */
typedef struct reading {
    uint8_t *first;
    size_t have;
    kvf__block_header bh;
    bool probe; /* the read now asks a byte past the value's end */
} reading;

typedef struct call {
    kvf__store *s;
    kvf__store_block *blocks;
    reading *rd;
    size_t n;
    const kvf__store_hooks *h;
    uint64_t fingerprint, ns_hash, deadline_ns;
    kvf__store_ranges_fn ranges;
    kvf__store_range *r;
} call;

/* "remote block <key>: <URL>[: <the store's name for the value>]" */
static void what_of(const call *c, const kvf__store_block *b, const char *about, char *what,
                    size_t cap)
{
    snprintf(what, cap, "%s " KVF_KEY_FMT ": %s%s%s", c->s->noun, KVF_KEY_ARGS(b->key), c->s->where,
             about && about[0] ? ": " : "", about ? about : "");
}

/* The pools group g of a block of `pools` covers: [*first, *last). */
static void group_pools(const call *c, uint32_t pools, uint32_t g, uint32_t *first, uint32_t *last)
{
    const kvf__store_hooks *h = c->h;
    uint32_t f = g ? h->group_end[g - 1] : 0, l = g + 1 == h->n_groups ? pools : h->group_end[g];
    *first = f < pools ? f : pools;
    *last = l < pools ? l : pools;
}

/* The value's bytes up to the end of pools [0, last) of a checked prefix. */
static size_t value_end(const reading *rd, uint32_t last)
{
    size_t pre = kvf__block_prefix_bytes(rd->bh.pools);
    if (last == 0)
        return pre;
    if (last >= rd->bh.pools)
        return pre + rd->bh.payload_bytes;
    kvf__block_span sp = kvf__block_prefix_span(rd->first, last - 1);
    return pre + sp.off + sp.bytes;
}

/* Runs one round of ranged reads: blocks[i] (live) from rd[i].have up to
 * want[i] where it is past it (want[i] 0: none). Every block read now
 * holds [0, want[i]) after it, or has failed. A read to the value's end
 * asks one byte more where the buffer has room for it, so that a value
 * longer than its header says is refused, as a whole read refuses it. */
static void read_round(call *c, const size_t *want, uint32_t g)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        reading *rd = &c->rd[i];
        kvf__store_block *b = &c->blocks[i];
        if (b->status != KVF_OK || want[i] <= rd->have)
            continue;
        size_t pre = kvf__block_prefix_bytes(rd->bh.pools);
        rd->probe = want[i] == pre + rd->bh.payload_bytes && b->cap > rd->bh.payload_bytes;
        c->r[k++] = (kvf__store_range){.block = b,
                                       .off = rd->have,
                                       .len = want[i] - rd->have + rd->probe,
                                       .dst = (uint8_t *)b->buf + (rd->have - pre)};
    }
    kvf__store_group_gate_fn gate = atomic_load(&group_gate);
    if (gate && g > 0)
        gate(c->s, g);
    if (k)
        c->ranges(c->s, c->r, k, c->deadline_ns);
    for (size_t j = 0; j < k; j++) {
        kvf__store_range *r = &c->r[j];
        kvf__store_block *b = r->block;
        reading *rd = &c->rd[b - c->blocks];
        size_t len = r->len - rd->probe; /* the bytes the table says are there */
        if (b->status == KVF_OK && r->got >= len && !(rd->probe && r->got > len)) {
            rd->have = r->off + len; /* the group's bytes, all of them */
            continue;
        }
        if (b->status != KVF_OK && b->status != KVF_ERR_NOT_FOUND)
            continue; /* failed by the store, named there */
        char what[KVF_MOVE_ERROR_MESSAGE];
        what_of(c, b, r->about, what, sizeof what);
        if (b->status == KVF_OK && rd->probe && r->got > len)
            kvf__store_block_fail(b, KVF_ERR_CORRUPT,
                                  "%s: more than the %zu bytes its header says (written again "
                                  "while read, or damaged)",
                                  what, (size_t)(r->off + len));
        else if (b->status == KVF_ERR_NOT_FOUND)
            /* found at the first read: removed since */
            kvf__store_block_fail(b, KVF_ERR_NOT_FOUND,
                                  "%s: removed while read (after %zu of its bytes, at pool group "
                                  "%u): not served",
                                  what, (size_t)r->off, g);
        else if (b->status == KVF_OK && r->got == 0)
            kvf__store_block_fail(b, KVF_ERR_NOT_FOUND,
                                  "%s: gone or shorter while read (nothing at byte %zu, pool "
                                  "group %u): not served",
                                  what, (size_t)r->off, g);
        else
            kvf__store_block_fail(b, KVF_ERR_CORRUPT,
                                  "%s: the value ends at byte %zu, its pool table says %zu "
                                  "(truncated, or written again while read)",
                                  what, (size_t)(r->off + r->got), (size_t)(r->off + len));
    }
}

/* The first read of every block: header, table and what of group 0 the
 * caller expects, checked as far as it goes. */
static void read_first(call *c, size_t first_len)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        kvf__store_block *b = &c->blocks[i];
        if (b->status == KVF_OK)
            c->r[k++] = (kvf__store_range){.block = b, .len = first_len, .dst = c->rd[i].first};
    }
    if (k)
        c->ranges(c->s, c->r, k, c->deadline_ns);
    for (size_t j = 0; j < k; j++) {
        kvf__store_range *r = &c->r[j];
        kvf__store_block *b = r->block;
        reading *rd = &c->rd[b - c->blocks];
        if (b->status != KVF_OK)
            continue; /* a miss (or failure) before a byte is in hand */
        char what[KVF_MOVE_ERROR_MESSAGE];
        what_of(c, b, r->about, what, sizeof what);
        kvf_status st = KVF_OK;
        if (r->got == 0) {
            b->status = KVF_ERR_NOT_FOUND; /* an empty value reads as none */
            continue;
        }
        if (r->got < KVF_BLOCK_HEADER_BYTES)
            st = kvf__fail(KVF_ERR_CORRUPT, "%s: %zu bytes, less than a header", what, r->got);
        if (st == KVF_OK)
            st = kvf__block_header_parse(rd->first, what, &rd->bh);
        if (st == KVF_OK)
            st = kvf__block_header_expect(&rd->bh, what, c->fingerprint, c->ns_hash, b->key);
        size_t pre = st == KVF_OK ? kvf__block_prefix_bytes(rd->bh.pools) : 0;
        size_t all = pre + (size_t)rd->bh.payload_bytes;
        if (st == KVF_OK && pre > first_len)
            st = kvf__fail(KVF_ERR_MISMATCH,
                           "%s: stored with %u pools, whose table is past the first read of %zu "
                           "bytes (made for %u pools)",
                           what, rd->bh.pools, first_len, b->pools);
        if (st == KVF_OK && r->got < (all < first_len ? all : first_len))
            st = kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: %zu bytes, its header says %zu", what,
                           r->got, all);
        if (st == KVF_OK && r->got > all)
            st = kvf__fail(KVF_ERR_CORRUPT, "%s: %zu bytes or more, its header says %zu", what,
                           r->got, all);
        if (st == KVF_OK)
            st = kvf__block_table_check(&rd->bh, rd->first, what);
        if (st == KVF_OK && rd->bh.payload_bytes > b->cap)
            st = kvf__fail(KVF_ERR_RANGE, "%s: %llu payload bytes, buffer of %zu", what,
                           (unsigned long long)rd->bh.payload_bytes, b->cap);
        if (st != KVF_OK) {
            kvf__store_block_fail(b, st, "%s", kvf_last_error());
            continue;
        }
        memcpy(b->buf, rd->first + pre, r->got - pre);
        rd->have = r->got;
    }
}

/* Checks pools [first, last) of every live block of group g against the
 * table of its first read. */
static void check_group(call *c, uint32_t g)
{
    for (size_t i = 0; i < c->n; i++) {
        kvf__store_block *b = &c->blocks[i];
        reading *rd = &c->rd[i];
        if (b->status != KVF_OK)
            continue;
        uint32_t first, last;
        group_pools(c, rd->bh.pools, g, &first, &last);
        char what[KVF_MOVE_ERROR_MESSAGE];
        /* the block, its URL and the pool: the object's own name is no
         * news here, and the message has room for the checksums */
        what_of(c, b, NULL, what, sizeof what);
        for (uint32_t p = first; p < last; p++) {
            kvf__block_span sp = kvf__block_prefix_span(rd->first, p);
            if (kvf__block_pool_check(rd->first, p, what, (const uint8_t *)b->buf + sp.off) ==
                KVF_OK)
                continue;
            /* past the first read, a value written again reads so too */
            kvf__store_block_fail(b, KVF_ERR_CORRUPT, "%s%s", kvf_last_error(),
                                  rd->have > c->h->first_bytes ? " (or written again while read)"
                                                               : "");
            break;
        }
    }
}

/* Hands group g of every block over (part), then keeps the failures. */
static void hand_over(call *c, uint32_t g)
{
    for (size_t i = 0; i < c->n; i++) {
        kvf__store_block *b = &c->blocks[i];
        if (b->status != KVF_OK)
            continue;
        b->tokens = c->rd[i].bh.tokens;
        b->pools = c->rd[i].bh.pools;
        b->payload_bytes = c->rd[i].bh.payload_bytes;
        b->table = c->rd[i].first;
    }
    c->h->part(c->h->arg, c->blocks, c->n, g);
    for (size_t i = 0; i < c->n; i++)
        c->blocks[i].table = NULL;
}

void kvf__store_ranges_nomem(kvf__store *s, kvf__store_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(r[i].block, KVF_ERR_NOMEM, "%s " KVF_KEY_FMT ": %s: out of memory",
                              s->noun, KVF_KEY_ARGS(r[i].block->key), s->where);
}

static void read_all_groups(call *c, size_t first_len, uint8_t *firsts, size_t *want)
{
    const kvf__store_hooks *h = c->h;
    for (size_t i = 0; i < c->n; i++) {
        c->rd[i].first = firsts + i * first_len;
        c->blocks[i].status = KVF_OK;
        c->blocks[i].msg[0] = '\0';
    }
    read_first(c, first_len);
    for (uint32_t g = 0; g < h->n_groups; g++) {
        for (size_t i = 0; i < c->n; i++) {
            uint32_t first, last;
            group_pools(c, c->rd[i].bh.pools, g, &first, &last);
            want[i] = c->blocks[i].status == KVF_OK ? value_end(&c->rd[i], last) : 0;
        }
        read_round(c, want, g);
        check_group(c, g);
        hand_over(c, g);
    }
}

kvf_status kvf__store_read_groups(kvf__store *s, kvf__store_block *blocks, size_t n,
                                  uint64_t deadline_ns, const kvf__store_hooks *h,
                                  kvf__store_ranges_fn ranges, uint64_t fingerprint,
                                  uint64_t ns_hash)
{
    if (!h || !h->part || h->n_groups < 2) {
        kvf_status st = s->ops->read(s, blocks, n, deadline_ns);
        if (h && h->done)
            h->done(h->arg, blocks, n);
        return st;
    }
    /* the first read's length: at least a header, whatever the caller says */
    size_t first_len =
        h->first_bytes > KVF_BLOCK_HEADER_BYTES ? h->first_bytes : KVF_BLOCK_HEADER_BYTES;
    call c = {s,           blocks, calloc(n, sizeof(reading)),         n, h, fingerprint, ns_hash,
              deadline_ns, ranges, calloc(n, sizeof(kvf__store_range))};
    size_t *want = calloc(n, sizeof *want);
    uint8_t *firsts = first_len <= SIZE_MAX / n ? malloc(n * first_len) : NULL;
    if (c.rd && c.r && want && firsts) {
        read_all_groups(&c, first_len, firsts, want);
    } else {
        /* nothing read: every block fails, in every group */
        for (size_t i = 0; i < n; i++)
            kvf__store_block_fail(&blocks[i], KVF_ERR_NOMEM,
                                  "%s " KVF_KEY_FMT ": %s: out of memory", s->noun,
                                  KVF_KEY_ARGS(blocks[i].key), s->where);
        for (uint32_t g = 0; g < h->n_groups; g++)
            h->part(h->arg, blocks, n, g);
    }
    free(firsts);
    free(want);
    free(c.rd);
    free(c.r);
    if (h->done)
        h->done(h->arg, blocks, n);
    return kvf__store_first_failure(blocks, n, true);
}
