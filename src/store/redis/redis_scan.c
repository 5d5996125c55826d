/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Listing a namespace's blocks (redis.h: kvf__redis_list): SCAN with a
 * cursor on the server, or on every cluster node that serves slots, never
 * KEYS, which blocks a server for as long as it walks every key it holds
 * (a shared Redis may hold millions of other namespaces' blocks). Each
 * page's keys have their header read (GETRANGE of its header) and their
 * length (STRLEN), pipelined; a block whose header does not check, or
 * whose length is not the header's, is skipped, as a read would refuse it.
 * SCAN may return a key twice (and a key that moves between nodes meanwhile
 * may show on both): the entries are sorted and each key visited once.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "log.h"
#include "redis.h"
#include "redis_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define PAGE "1000" /* keys SCAN looks at per call: a hint to the server */

typedef struct entries {
    kvf__store_entry *v;
    size_t n, cap;
    size_t old_format; /* kvf:<ns>:<16 hex>: blocks of format version 1 */
} entries;

/* The key of "kvf:<ns>:<32 hex>", or false for another name. */
static bool key_of_name(const kvf__redis *r, const char *name, size_t len, kvf_key *key)
{
    size_t ns_len = strlen(r->ns);
    return len == 4 + ns_len + 1 + 32 && memcmp(name, "kvf:", 4) == 0 &&
           memcmp(name + 4, r->ns, ns_len) == 0 && name[4 + ns_len] == ':' &&
           kvf__key_from_name(name + len - 32, key);
}

static kvf_status push(entries *e, const kvf__store_entry *ent)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        kvf__store_entry *v = realloc(e->v, cap * sizeof *v);
        if (!v)
            return kvf__fail(KVF_ERR_NOMEM, "redis list: out of memory for %zu entries", cap);
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = *ent;
    return KVF_OK;
}

/* The header and length of each of a page's keys, pipelined on c; the
 * blocks that check go to e. */
static kvf_status take_page(kvf__redis *r, kvf__redis_node *node, redisContext *c,
                            const redisReply *keys, entries *e)
{
    size_t sent = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING)
            continue;
        uint64_t old;
        size_t ns_len = strlen(r->ns);
        if (k->len == 4 + ns_len + 1 + 16 && kvf__hex_u64(k->str + k->len - 16, 16, false, &old))
            e->old_format++;
        char last[16];
        snprintf(last, sizeof last, "%u", HDR - 1);
        const char *get[] = {"GETRANGE", k->str, "0", last};
        size_t get_len[] = {8, k->len, 1, strlen(last)};
        const char *len[] = {"STRLEN", k->str};
        size_t len_len[] = {6, k->len};
        if (redisAppendCommandArgv(c, 4, get, get_len) != REDIS_OK ||
            redisAppendCommandArgv(c, 2, len, len_len) != REDIS_OK)
            return kvf__fail(KVF_ERR_NOMEM, "redis %s: list: no memory for a pipeline", node->name);
        sent++;
    }
    kvf_status st = KVF_OK;
    size_t k = 0;
    for (size_t i = 0; i < sent; i++, k++) {
        while (keys->element[k]->type != REDIS_REPLY_STRING)
            k++;
        redisReply *hdr = NULL, *strlen_reply = NULL;
        kvf_status got = kvf__redis_node_reply(node, c, &hdr);
        if (got == KVF_OK)
            got = kvf__redis_node_reply(node, c, &strlen_reply);
        if (got != KVF_OK) {
            if (hdr)
                freeReplyObject(hdr);
            return got;
        }
        kvf_key key;
        kvf__block_header h;
        char what[320];
        snprintf(what, sizeof what, "redis %s: list", node->name);
        if (st == KVF_OK && hdr->type == REDIS_REPLY_STRING && hdr->len == HDR &&
            strlen_reply->type == REDIS_REPLY_INTEGER &&
            key_of_name(r, keys->element[k]->str, keys->element[k]->len, &key) &&
            kvf__block_header_parse((const uint8_t *)hdr->str, what, &h) == KVF_OK &&
            kvf__block_header_expect(&h, what, r->fingerprint, r->ns_hash, key) == KVF_OK &&
            strlen_reply->integer >= 0 &&
            (uint64_t)strlen_reply->integer == kvf__block_prefix_bytes(h.pools) + h.payload_bytes)
            st = push(e, &(kvf__store_entry){key, h.tokens, h.pools, h.payload_bytes, 0});
        freeReplyObject(hdr);
        freeReplyObject(strlen_reply);
    }
    kvf__clear_error();
    return st;
}

/* Every page of SCAN on one node. */
static kvf_status scan_node(kvf__redis *r, kvf__redis_node *node, entries *e)
{
    redisContext *c;
    kvf_status st = kvf__redis_node_acquire(node, 0, &c);
    if (st != KVF_OK)
        return st;
    char match[96], cursor[32] = "0";
    snprintf(match, sizeof match, "kvf:%s:*", r->ns);
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", PAGE};
        size_t lens[] = {4, strlen(cursor), 5, strlen(match), 5, strlen(PAGE)};
        redisReply *reply = NULL;
        st = kvf__redis_node_command(node, c, 6, argv, lens, &reply);
        if (st != KVF_OK)
            break;
        if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
            reply->element[0]->type != REDIS_REPLY_STRING ||
            reply->element[0]->len >= sizeof cursor ||
            reply->element[1]->type != REDIS_REPLY_ARRAY) {
            st = kvf__fail(KVF_ERR_REMOTE, "redis %s: list: SCAN answered %s", node->name,
                           reply->type == REDIS_REPLY_ERROR ? reply->str : "something else");
        } else {
            memcpy(cursor, reply->element[0]->str, reply->element[0]->len);
            cursor[reply->element[0]->len] = '\0';
            st = take_page(r, node, c, reply->element[1], e);
        }
        freeReplyObject(reply);
    } while (st == KVF_OK && strcmp(cursor, "0") != 0);
    kvf__redis_node_release(node, c, st != KVF_OK);
    return st;
}

static int by_key(const void *a, const void *b)
{
    return kvf_key_cmp(((const kvf__store_entry *)a)->key, ((const kvf__store_entry *)b)->key);
}

kvf_status kvf__redis_list(kvf__redis *r, kvf__store_visit_fn visit, void *arg)
{
    entries e = {0};
    kvf_status st = KVF_OK;
    for (size_t i = 0; st == KVF_OK; i++) {
        pthread_mutex_lock(&r->topo.lock);
        kvf__redis_node *node = i < r->topo.node_count ? r->topo.nodes[i] : NULL;
        pthread_mutex_unlock(&r->topo.lock);
        if (!node)
            break;
        if (kvf__redis_topology_serves(&r->topo, i))
            st = scan_node(r, node, &e);
    }
    if (st == KVF_OK && e.n > 1)
        qsort(e.v, e.n, sizeof *e.v, by_key);
    for (size_t i = 0; st == KVF_OK && i < e.n; i++)
        if (i == 0 || !kvf_key_eq(e.v[i].key, e.v[i - 1].key))
            visit(arg, &e.v[i]);
    free(e.v);
    if (e.old_format)
        KVF_LOG(KVF_LOG_WARN,
                "redis: namespace %s: %zu block%s of " KVF_BLOCK_V1_WORDS
                " (kvf:%s:<16 hex digits>) not served: they are stored again on their next "
                "offload",
                r->ns, e.old_format, e.old_format == 1 ? "" : "s", r->ns);
    if (st == KVF_OK)
        kvf__clear_error();
    return st;
}
