/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Failed moves' messages, kept for a ticket's holder (kvf_wait_errors).
 */
#include "engine_private.h"

/* ---- failed moves' messages ----------------------------------------------- */

kvf__move_error *kvf__move_error_new(size_t index, kvf_status status, const char *message)
{
    size_t len = strnlen(message, KVF_MOVE_ERROR_MESSAGE - 1);
    kvf__move_error *r = malloc(sizeof *r + len + 1);
    if (!r)
        return NULL;
    r->next = NULL;
    r->index = index;
    r->status = status;
    r->about_dest = false;
    memcpy(r->message, message, len);
    r->message[len] = '\0';
    return r;
}

void kvf__move_errors_free(kvf__move_error *list)
{
    while (list) {
        kvf__move_error *next = list->next;
        free(list);
        list = next;
    }
}

void kvf__move_errors_deliver(kvf__move_error *list, kvf_move_error *out, size_t cap, size_t *n_p)
{
    size_t n = 0;
    for (const kvf__move_error *r = list; r; r = r->next, n++) {
        if (n >= cap)
            continue;
        out[n].index = r->index;
        out[n].status = r->status;
        memcpy(out[n].message, r->message, strlen(r->message) + 1);
    }
    if (n_p)
        *n_p = n;
    kvf__move_errors_free(list);
}

/* Whether anyone will read a failed move's message: a ticket's holder. */
static bool keeps_errors(const batch *b)
{
    return b->ticketed || (b->group && b->group->ticketed);
}

void kvf__push_error(batch *b, kvf__move_error *r)
{
    r->next = atomic_load(&b->errors);
    while (!atomic_compare_exchange_weak(&b->errors, &r->next, r))
        ;
}

static void move_failed_v(batch *b, size_t i, kvf_status st, bool about_dest, const char *fmt,
                          va_list ap)
{
    b->status[i] = st;
    if (!keeps_errors(b))
        return;
    char msg[KVF_MOVE_ERROR_MESSAGE];
    vsnprintf(msg, sizeof msg, fmt, ap);
    kvf__move_error *r = kvf__move_error_new(i, st, msg);
    if (r) {
        r->about_dest = about_dest;
        kvf__push_error(b, r);
    }
}

/* Fails move i with `st` and, for a ticket's holder, keeps why (the
 * specific detail: kvf_wait_errors). Called by whoever owns the move's
 * status; a message that finds no memory is replaced by the status's
 * text when the ticket retires. */
void kvf__move_failed(batch *b, size_t i, kvf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    move_failed_v(b, i, st, false, fmt, ap);
    va_end(ap);
}

void kvf__move_failed_dest(batch *b, size_t i, kvf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    move_failed_v(b, i, st, true, fmt, ap);
    va_end(ap);
}

static int cmp_error_index(const void *a, const void *b)
{
    const kvf__move_error *x = *(kvf__move_error *const *)a, *y = *(kvf__move_error *const *)b;
    return x->index < y->index ? -1 : x->index > y->index;
}

kvf__move_error *kvf__move_errors_sorted(kvf__move_error *list, const kvf_status *status, size_t n,
                                         const char *what)
{
    size_t nrec = 0;
    for (const kvf__move_error *r = list; r; r = r->next)
        nrec++;
    kvf__move_error **v = malloc((nrec ? nrec : 1) * sizeof *v);
    if (!v) {
        kvf__move_errors_free(list);
        return NULL;
    }
    nrec = 0;
    for (kvf__move_error *r = list; r; r = r->next)
        v[nrec++] = r;
    qsort(v, nrec, sizeof *v, cmp_error_index);
    kvf__move_error *head = NULL, **tail = &head;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        kvf__move_error *r = NULL;
        for (; k < nrec && v[k]->index <= i; k++) {
            if (v[k]->index == i && !r && status[i] != KVF_OK)
                r = v[k];
            else
                free(v[k]);
        }
        if (status[i] == KVF_OK)
            continue;
        if (!r) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s %zu: %s", what, i, kvf_status_str(status[i]));
            r = kvf__move_error_new(i, status[i], msg);
            if (!r)
                continue;
        }
        r->status = status[i];
        *tail = r;
        tail = &r->next;
    }
    *tail = NULL;
    for (; k < nrec; k++)
        free(v[k]);
    free(v);
    return head;
}

/* A completed batch's messages (kvf__move_errors_sorted); NULL when
 * nothing failed. */
kvf__move_error *kvf__collect_errors(batch *b, size_t failed)
{
    kvf__move_error *list = atomic_exchange(&b->errors, NULL);
    if (failed == 0) {
        kvf__move_errors_free(list);
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof what, "%s: move", op_name(b->kind));
    return kvf__move_errors_sorted(list, b->status, b->n, what);
}
