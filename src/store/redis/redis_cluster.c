/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Redis Cluster routing: hash slots (CRC16 of the key or its {hashtag},
 * 16384 slots), the slot map read with CLUSTER SLOTS, the node table.
 * A standalone server is a topology of one node that owns every slot.
 */
#include "redis_internal.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CRC16-CCITT (XMODEM), as the Redis Cluster specification defines it. */
static uint16_t crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t kvf__redis_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        const char *start = open + 1;
        const char *close = memchr(start, '}', len - (size_t)(start - key));
        if (close && close > start)
            return crc16(start, (size_t)(close - start)) & (KVF_REDIS_SLOTS - 1);
    }
    return crc16(key, len) & (KVF_REDIS_SLOTS - 1);
}

/* Index of host:port in the table, adding it; called with the lock held. */
static size_t node_index_locked(kvf__redis_topology *t, const char *host, int port)
{
    for (size_t i = 0; i < t->node_count; i++)
        if (t->nodes[i]->port == port && strcmp(t->nodes[i]->host, host) == 0)
            return i;
    if (t->node_count == KVF_REDIS_MAX_NODES)
        return KVF_REDIS_NO_NODE;
    kvf__redis_node *node;
    if (kvf__redis_node_create(host, port, &t->opts, &node) != KVF_OK)
        return KVF_REDIS_NO_NODE;
    t->nodes[t->node_count] = node;
    return t->node_count++;
}

kvf__redis_node *kvf__redis_topology_node(kvf__redis_topology *t, const char *host, int port)
{
    pthread_mutex_lock(&t->lock);
    size_t i = node_index_locked(t, host, port);
    kvf__redis_node *node = i == KVF_REDIS_NO_NODE ? NULL : t->nodes[i];
    pthread_mutex_unlock(&t->lock);
    return node;
}

kvf__redis_node *kvf__redis_topology_route(kvf__redis_topology *t, uint16_t slot)
{
    pthread_mutex_lock(&t->lock);
    uint16_t i = t->cluster ? t->slot_node[slot] : 0;
    kvf__redis_node *node = t->nodes[i == KVF_REDIS_NO_NODE ? t->fallback : i];
    pthread_mutex_unlock(&t->lock);
    return node;
}

void kvf__redis_topology_moved(kvf__redis_topology *t, uint16_t slot, kvf__redis_node *node)
{
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->node_count; i++)
        if (t->nodes[i] == node)
            t->slot_node[slot] = (uint16_t)i;
    pthread_mutex_unlock(&t->lock);
}

/* Fills `map` from a CLUSTER SLOTS reply given by `asked`. */
static kvf_status parse_slots(kvf__redis_topology *t, kvf__redis_node *asked,
                              const redisReply *reply, uint16_t *map)
{
    if (reply->type != REDIS_REPLY_ARRAY)
        return kvf__fail(KVF_ERR_REMOTE, "redis %s: CLUSTER SLOTS: %s", asked->name,
                         reply->type == REDIS_REPLY_ERROR ? reply->str : "not an array");
    for (size_t s = 0; s < KVF_REDIS_SLOTS; s++)
        map[s] = KVF_REDIS_NO_NODE;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *range = reply->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER ||
            range->element[1]->type != REDIS_REPLY_INTEGER ||
            range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
            range->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            range->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return kvf__fail(KVF_ERR_REMOTE, "redis %s: CLUSTER SLOTS: malformed entry %zu",
                             asked->name, i);
        long long lo = range->element[0]->integer, hi = range->element[1]->integer;
        const redisReply *master = range->element[2];
        /* an empty host means "the node you asked" */
        const char *host = master->element[0]->len ? master->element[0]->str : asked->host;
        int port = (int)master->element[1]->integer;
        if (lo < 0 || hi >= KVF_REDIS_SLOTS || lo > hi)
            return kvf__fail(KVF_ERR_REMOTE, "redis %s: CLUSTER SLOTS: bad range %lld-%lld",
                             asked->name, lo, hi);
        pthread_mutex_lock(&t->lock);
        size_t idx = node_index_locked(t, host, port);
        pthread_mutex_unlock(&t->lock);
        if (idx == KVF_REDIS_NO_NODE)
            return kvf__fail(KVF_ERR_NOMEM, "redis cluster: cannot add node %s:%d", host, port);
        for (long long s = lo; s <= hi; s++)
            map[s] = (uint16_t)idx;
    }
    return KVF_OK;
}

static kvf_status refresh_from(kvf__redis_topology *t, kvf__redis_node *node, uint16_t *map)
{
    redisContext *c;
    kvf_status st = kvf__redis_node_acquire(node, 0, &c);
    if (st != KVF_OK)
        return st;
    const char *argv[] = {"CLUSTER", "SLOTS"};
    const size_t lens[] = {7, 5};
    redisReply *reply;
    st = kvf__redis_node_command(node, c, 2, argv, lens, &reply);
    if (st == KVF_OK) {
        st = parse_slots(t, node, reply, map);
        freeReplyObject(reply);
    }
    kvf__redis_node_release(node, c, st != KVF_OK);
    return st;
}

kvf_status kvf__redis_topology_refresh(kvf__redis_topology *t, kvf__redis_node *first)
{
    uint16_t *map = malloc(KVF_REDIS_SLOTS * sizeof *map);
    if (!map)
        return kvf__fail(KVF_ERR_NOMEM, "redis cluster: no memory for the slot map");
    kvf_status st = first ? refresh_from(t, first, map) : KVF_ERR_NOT_FOUND;
    /* then every known node: a list that may grow while we go */
    for (size_t i = 0; st != KVF_OK; i++) {
        pthread_mutex_lock(&t->lock);
        kvf__redis_node *node = i < t->node_count ? t->nodes[i] : NULL;
        pthread_mutex_unlock(&t->lock);
        if (!node)
            break;
        if (node != first)
            st = refresh_from(t, node, map);
    }
    if (st == KVF_OK) {
        pthread_mutex_lock(&t->lock);
        memcpy(t->slot_node, map, KVF_REDIS_SLOTS * sizeof *map);
        for (size_t s = 0; s < KVF_REDIS_SLOTS; s++)
            if (map[s] != KVF_REDIS_NO_NODE) {
                t->fallback = map[s];
                break;
            }
        pthread_mutex_unlock(&t->lock);
    } else {
        char why[256];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        st = kvf__fail(st, "redis cluster: no node gave the slot map (last: %s)", why);
    }
    free(map);
    return st;
}

kvf_status kvf__redis_topology_init(kvf__redis_topology *t, const kvf__redis_url *u,
                                    const kvf__redis_opts *opts)
{
    memset(t, 0, sizeof *t);
    t->opts = *opts;
    t->cluster = u->cluster;
    pthread_mutex_init(&t->lock, NULL);
    for (size_t s = 0; s < KVF_REDIS_SLOTS; s++)
        t->slot_node[s] = t->cluster ? KVF_REDIS_NO_NODE : 0;
    kvf_status st = KVF_OK;
    for (size_t i = 0; i < u->seeds; i++)
        if (!kvf__redis_topology_node(t, u->seed[i].host, u->seed[i].port)) {
            st = kvf__fail(KVF_ERR_NOMEM, "redis %s:%d: no memory", u->seed[i].host,
                           u->seed[i].port);
            goto fini;
        }
    if (t->cluster) {
        st = kvf__redis_topology_refresh(t, NULL);
    } else {
        redisContext *c;
        st = kvf__redis_node_acquire(t->nodes[0], 0, &c);
        if (st == KVF_OK)
            kvf__redis_node_release(t->nodes[0], c, false);
    }
    if (st == KVF_OK)
        return KVF_OK;
fini:
    kvf__redis_topology_fini(t);
    return st;
}

void kvf__redis_topology_fini(kvf__redis_topology *t)
{
    for (size_t i = 0; i < t->node_count; i++)
        kvf__redis_node_destroy(t->nodes[i]);
    t->node_count = 0;
#ifdef KVF_HAVE_REDIS_TLS
    kvf__redis_tls_free(t->opts.tls);
    t->opts.tls = NULL;
#endif
    pthread_mutex_destroy(&t->lock);
}

bool kvf__redis_topology_serves(kvf__redis_topology *t, size_t index)
{
    if (!t->cluster)
        return index == 0;
    bool serves = false;
    pthread_mutex_lock(&t->lock);
    for (size_t s = 0; s < KVF_REDIS_SLOTS && !serves; s++)
        serves = t->slot_node[s] == index;
    pthread_mutex_unlock(&t->lock);
    return serves;
}
