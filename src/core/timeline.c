/* SPDX-License-Identifier: Apache-2.0 */
/* The event timeline (KVF_TIMELINE=FILE): when each step of a batch happened,
 * on which thread, to see where time goes between a submit and the end
 * of its last copy (no profiler on the GPU machine tells that). Events go
 * into one fixed array, claimed with an atomic counter; an engine appends
 * what was recorded to FILE when it is destroyed. A debugging aid: off
 * unless the variable is set, and meant for one engine at a time. */
#include "timeline.h"
#include "log.h"
#include "namedfile.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TL_EVENTS (1u << 20)

typedef struct tl_record {
    uint64_t t_ns, id, n;
    uint32_t event, thread;
} tl_record;

bool kvf__timeline_on;
static const char *tl_path;
static tl_record *events;
static atomic_uint_fast64_t next_event;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;

static const char *const event_names[KVF_TL_COUNT] = {
    [KVF_TL_SUBMIT] = "submit",
    [KVF_TL_CHECKED] = "checked",
    [KVF_TL_PART] = "part",
    [KVF_TL_SUBMITTED] = "submitted",
    [KVF_TL_ISSUE] = "issue",
    [KVF_TL_ISSUED] = "issued",
    [KVF_TL_CALL] = "call",
    [KVF_TL_COPIED] = "copied",
    [KVF_TL_COMPLETE] = "complete",
    [KVF_TL_CHUNK] = "chunk",
    [KVF_TL_LOCKWAIT] = "lockwait",
    [KVF_TL_GPU_QUEUED] = "gpu_queued",
    [KVF_TL_GPU_ENDED] = "gpu_ended",
    [KVF_TL_GPU_PICKED] = "gpu_picked",
    [KVF_TL_GPU_UPLOADED] = "gpu_uploaded",
};

static void tl_init(void)
{
    const char *p = getenv("KVF_TIMELINE");
    if (!p || !*p)
        return;
    /* process-wide, so no engine's create fails for it: an error once,
     * here, rather than an empty file found after the run */
    const char *c = p;
    while (*c == ' ' || *c == '\t')
        c++;
    const char *why = "blank";
    FILE *f = *c ? kvf__named_file_open(p, true, &why) : NULL;
    if (!f) {
        KVF_LOG(KVF_LOG_ERROR,
                "KVF_TIMELINE=\"%s\": %s; no timeline (expected the path of a file to "
                "append it to)",
                p, why);
        return;
    }
    fclose(f);
    events = calloc(TL_EVENTS, sizeof *events);
    if (!events) {
        KVF_LOG(KVF_LOG_WARN, "KVF_TIMELINE=%s: no memory for the timeline; no timeline", p);
        return;
    }
    tl_path = p;
    kvf__timeline_on = true;
}

void kvf__timeline_setup(void)
{
    pthread_once(&tl_once, tl_init);
}

void kvf__timeline_record(kvf__tl_event ev, uint64_t id, uint64_t n)
{
    static _Thread_local uint32_t thread;
    uint64_t k = atomic_fetch_add_explicit(&next_event, 1, memory_order_relaxed);
    if (k >= TL_EVENTS)
        return; /* full: the first events are the ones kept */
    if (!thread)
        thread = (uint32_t)syscall(SYS_gettid);
    events[k] = (tl_record){kvf__now_ns(), id, n, (uint32_t)ev, thread};
}

void kvf__timeline_flush(void)
{
    if (!kvf__timeline_on)
        return;
    uint64_t n = atomic_exchange(&next_event, 0);
    if (n > TL_EVENTS)
        n = TL_EVENTS;
    const char *why;
    FILE *f = kvf__named_file_open(tl_path, true, &why);
    if (!f) {
        KVF_LOG(KVF_LOG_WARN, "KVF_TIMELINE=%s: %s; timeline dropped", tl_path, why);
        return;
    }
    fprintf(f, "# t_ns thread event id n\n");
    for (uint64_t k = 0; k < n; k++)
        fprintf(f, "%llu %u %s %llu %llu\n", (unsigned long long)events[k].t_ns, events[k].thread,
                event_names[events[k].event], (unsigned long long)events[k].id,
                (unsigned long long)events[k].n);
    fclose(f);
}
