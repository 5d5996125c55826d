/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Events: each change of a block's tier goes to the events.fn callback and
 * into a ring of cfg.events.queue that kvf_cache_events drains.
 */
#include "cache_private.h"

void kvf__cache_emit(kvf_cache *c, kvf_cache_event_kind kind, const entry *e, kvf_tier from)
{
    kvf_cache_event ev = {++c->ev_seq,
                          kind,
                          e->key,
                          (kvf_tier)e->tier,
                          kind == KVF_EVENT_UPDATED ? from : (kvf_tier)e->tier,
                          e->priority};
    if (c->cfg.events.fn)
        c->cfg.events.fn(c->cfg.events.arg, &ev);
    if (!c->events)
        return;
    if (c->ev_count == c->cfg.events.queue) {
        c->stats.events_dropped++;
        return;
    }
    c->events[(c->ev_head + c->ev_count) % c->cfg.events.queue] = ev;
    c->ev_count++;
}

size_t kvf_cache_events(kvf_cache *c, kvf_cache_event *out, size_t cap)
{
    if (!c || !out)
        return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->ev_count < cap ? c->ev_count : cap;
    for (size_t i = 0; i < n; i++)
        out[i] = c->events[(c->ev_head + i) % c->cfg.events.queue];
    if (n) {
        c->ev_head = (c->ev_head + n) % c->cfg.events.queue;
        c->ev_count -= n;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}
