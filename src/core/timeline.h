/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The event timeline: KVF_TIMELINE=FILE records when each step of a batch
 * happened; an engine's destroy appends the events to FILE (timeline.c).
 */
#ifndef KVF_CORE_TIMELINE_H
#define KVF_CORE_TIMELINE_H

#include "common.h"

typedef enum kvf__tl_event {
    KVF_TL_SUBMIT,     /* a submit began: n moves */
    KVF_TL_CHECKED,    /* its moves were checked (and sorted) */
    KVF_TL_PART,       /* batch or part `id` of n moves was registered */
    KVF_TL_SUBMITTED,  /* the submit returned */
    KVF_TL_ISSUE,      /* batch `id` began to be handed to the backend (or a worker) */
    KVF_TL_ISSUED,     /* ... and was, in n calls */
    KVF_TL_CALL,       /* batch `id` handed a call of n copies to the backend */
    KVF_TL_COPIED,     /* the backend said a call of batch `id` ended */
    KVF_TL_COMPLETE,   /* batch `id` completed */
    KVF_TL_CHUNK,      /* a worker finished a chunk of n moves of batch `id` */
    KVF_TL_LOCKWAIT,   /* a thread waited n ns for the engine lock, at line `id` of src/engine/ */
    KVF_TL_GPU_QUEUED, /* the CUDA backend queued record `id` (queue << 56 | position): n copies */
    KVF_TL_GPU_ENDED,  /* ... and its watcher saw it end */
    KVF_TL_GPU_PICKED, /* the CUDA backend picked path n for a call of queue `id` */
    KVF_TL_GPU_UPLOADED, /* its kernel path queued the upload of n descriptors (queue `id`) */
    KVF_TL_COUNT
} kvf__tl_event;
KVF_INTERNAL extern bool kvf__timeline_on;
KVF_INTERNAL void kvf__timeline_setup(void);
KVF_INTERNAL void kvf__timeline_record(kvf__tl_event ev, uint64_t id, uint64_t n);
KVF_INTERNAL void kvf__timeline_flush(void);
#define KVF_TIMELINE(ev, id, n)                                                                    \
    do {                                                                                           \
        if (kvf__timeline_on)                                                                      \
            kvf__timeline_record(ev, id, n);                                                       \
    } while (0)

#endif /* KVF_CORE_TIMELINE_H */
