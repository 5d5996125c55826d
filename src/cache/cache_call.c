/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The caller's tickets: a put, get, acquire or alloc is a call made of the
 * ops it queued, with a status and a message per block (kvf_cache_wait
 * and kvf_cache_poll, cache_wait.c, retire it).
 */
#include "cache_private.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Keeps why block i of a call failed; a record that finds no memory
 * becomes the status's text (kvf__move_errors_sorted). */
void kvf__cache_call_note(call *k, size_t i, kvf_status st, const char *fmt, ...)
{
    char msg[KVF_MOVE_ERROR_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvf__move_error *r = kvf__move_error_new(i, st, msg);
    if (r) {
        r->next = k->errors;
        k->errors = r;
    }
}

call *kvf__cache_call_new(kvf_cache *c, size_t n)
{
    call *k = calloc(1, sizeof *k);
    kvf_status *st = n ? malloc(n * sizeof *st) : NULL;
    if (!k || (n && !st)) {
        free(k);
        free(st);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        st[i] = KVF_INPROGRESS;
    k->n = n;
    k->status = st;
    k->t0_ns = kvf__now_ns();
    k->id = ++c->next_call;
    return k;
}

void kvf__cache_call_free(call *k)
{
    for (op *o = k->ops, *next; o; o = next) {
        next = o->next;
        kvf__cache_op_free(o);
    }
    free(k->status);
    free(k->pools);
    kvf__move_errors_free(k->errors);
    free(k);
}

call **kvf__cache_call_slot(kvf_cache *c, kvf_cache_ticket t)
{
    call **pp = &c->calls;
    while (*pp && (*pp)->id != t.id)
        pp = &(*pp)->next;
    return pp;
}
