/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The load-or-recompute planner (kvf_plan_compute) and the caller's
 * prefill cost it uses (docs/planner.md).
 *
 * For K leading hits loaded, the request computes its tokens from K * tpb
 * on. The engine submits one batch per tier and the tiers run side by
 * side (kvf_cache_get), so tier t's blocks have all arrived at
 * lat_t + X_t, X_t = bytes_t / throughput_t. Without overlap the forward
 * pass, C seconds, starts once the last tier is in:
 *     T = max_t (lat_t + X_t) + C.
 * With layer-wise overlap over L layers, layer l is computed (C / L) once
 * it arrived and layer l - 1 is done. A tier whose pools arrive layer by
 * layer delivers layer l at lat_t + (l + 1) X_t / L; another delivers all
 * at lat_t + X_t. Unrolling done_l = max(arrive_l, done_{l-1}) + C / L gives
 * T = max over l, t of arrive_t,l + (L - l) C / L, and as arrive_t,l is
 * linear in l the maximum is at l = 0 or l = L - 1:
 *     layer by layer: lat_t + max(X_t / L + C, X_t + C / L)
 *     whole:          lat_t + X_t + C
 * (and C alone when nothing is loaded). A tier whose loads arrive in S < L
 * steps (DISK: pool groups of several layers, kvf_engine_arrival_groups)
 * delivers step s at lat_t + (s + 1) X_t / S and C / S is computed per
 * step, so L becomes S there: lat_t + max(X_t / S + C, X_t + C / S).
 * The second shape overlaps any tier: hits [F, K) load while tokens
 * [0, F tpb) are computed from scratch, which needs none of them; then
 * tokens [K tpb, N) are computed over the full cache, C being theirs:
 *     T = max(A_F, max_t (lat_t + X_t)) + C,  A_F the front's compute,
 * and with overlap, where a tier arrives layer by layer the tail's layer l
 * waits only for that layer (and the front): unrolled as above from
 * done_-1 = A_F, T = max(A_F + C, max_t D_t), D_t the leading shape's
 * per-tier term with the tail as C.
 * What requests served by earlier plans took over their predictions
 * (kvf_plan_input.load_ratio, recompute_ratio) scales every shape that
 * loads, and recomputing, before they are compared.
 */
#include "cache_private.h"
#include "sized.h"

#include <math.h> /* isfinite, NAN: macros, nothing to link */
#include <stdlib.h>
#include <string.h>

/* ---- the prefill cost ---------------------------------------------------- */

/* A caller's struct that starts with its size, into this library's
 * (zeroed beyond what the caller's has): `what` and `init` name it. */
static kvf_status take_sized(const void *in, void *out, size_t out_size, const char *what,
                             const char *init)
{
    if (!in)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL", what);
    if (!kvf__sized_ok(in, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID, "%s: struct_size %zu (start from %s)", what,
                         kvf__sized_size(in), init);
    memset(out, 0, out_size);
    kvf__sized_copy_in(out, out_size, in);
    return KVF_OK;
}

static kvf_status take_prefill(const kvf_prefill_cost *in, kvf_prefill_cost *out)
{
    return take_sized(in, out, sizeof *out, "prefill cost", "KVF_PREFILL_COST_INIT");
}

static kvf_status check_axis(const char *name, const uint64_t *axis, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (axis[i] <= axis[i - 1])
            return kvf__fail(KVF_ERR_INVALID,
                             "prefill cost: %s[%zu] = %llu after %llu (must increase strictly)",
                             name, i, (unsigned long long)axis[i], (unsigned long long)axis[i - 1]);
    return KVF_OK;
}

static kvf_status check_table(const kvf_prefill_cost *p)
{
    size_t rows = p->n_prefix ? p->n_prefix : 1;
    if (!p->new_tokens || !p->seconds)
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: %s is NULL with n_new = %zu",
                         !p->new_tokens ? "new_tokens" : "seconds", p->n_new);
    if (p->n_prefix && !p->prefix_tokens)
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: prefix_tokens is NULL with n_prefix = %zu",
                         p->n_prefix);
    if (p->n_new == 1 && p->new_tokens[0] == 0)
        return kvf__fail(KVF_ERR_INVALID,
                         "prefill cost: new_tokens holds only 0 (need a point with tokens > 0)");
    kvf_status st = check_axis("new_tokens", p->new_tokens, p->n_new);
    if (st == KVF_OK && p->n_prefix)
        st = check_axis("prefix_tokens", p->prefix_tokens, p->n_prefix);
    if (st != KVF_OK)
        return st;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < p->n_new; j++) {
            size_t i = r * p->n_new + j;
            double s = p->seconds[i];
            if (!isfinite(s) || s < 0)
                return kvf__fail(KVF_ERR_INVALID,
                                 "prefill cost: seconds[%zu] (new_tokens %llu, prefix %llu) is %g "
                                 "(must be finite and >= 0)",
                                 i, (unsigned long long)p->new_tokens[j],
                                 (unsigned long long)(p->n_prefix ? p->prefix_tokens[r] : 0), s);
            if (j > 0 && s < p->seconds[i - 1])
                return kvf__fail(KVF_ERR_INVALID,
                                 "prefill cost: seconds[%zu] = %g for %llu new tokens is less than "
                                 "%g for %llu (more tokens never cost less)",
                                 i, s, (unsigned long long)p->new_tokens[j], p->seconds[i - 1],
                                 (unsigned long long)p->new_tokens[j - 1]);
            if (r > 0 && s < p->seconds[i - p->n_new])
                return kvf__fail(KVF_ERR_INVALID,
                                 "prefill cost: seconds[%zu] = %g after a prefix of %llu is less "
                                 "than %g after %llu (a longer prefix never costs less)",
                                 i, s, (unsigned long long)p->prefix_tokens[r],
                                 p->seconds[i - p->n_new],
                                 (unsigned long long)p->prefix_tokens[r - 1]);
        }
    return KVF_OK;
}

kvf_status kvf__prefill_check(const kvf_prefill_cost *in, kvf_prefill_cost *out)
{
    kvf_status st = take_prefill(in, out);
    if (st != KVF_OK)
        return st;
    bool table =
        out->n_new || out->new_tokens || out->seconds || out->n_prefix || out->prefix_tokens;
    if (table && out->fn)
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: both a table and a function (give one)");
    if (!table && !out->fn)
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: empty (no table entries, no function)");
    if (table && out->n_new == 0)
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: empty table (n_new = 0)");
    if (!(out->min_gain >= 0 && out->min_gain < 1))
        return kvf__fail(KVF_ERR_INVALID, "prefill cost: min_gain %g (must be >= 0 and < 1)",
                         out->min_gain);
    return table ? check_table(out) : KVF_OK;
}

kvf_status kvf_prefill_cost_check(const kvf_prefill_cost *cost)
{
    kvf__clear_error();
    kvf_prefill_cost p;
    return kvf__prefill_check(cost, &p);
}

/* Row `r` of the table at x new tokens: piecewise linear through (0, 0)
 * and the row's points, the last segment extended. */
static double row_at(const kvf_prefill_cost *p, size_t r, double x)
{
    const uint64_t *xs = p->new_tokens;
    const double *ys = p->seconds + r * p->n_new;
    size_t n = p->n_new;
    if (x <= 0)
        return 0;
    /* the segment [x0, x1] holding x, or the last one */
    double x0 = 0, y0 = 0, x1 = (double)xs[0], y1 = ys[0];
    size_t j = 0;
    if (xs[0] == 0) {
        x1 = (double)xs[1];
        y1 = ys[1];
        y0 = ys[0];
        j = 1;
    }
    while (x > x1 && j + 1 < n) {
        x0 = x1;
        y0 = y1;
        j++;
        x1 = (double)xs[j];
        y1 = ys[j];
    }
    double y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    return y < 0 ? 0 : y; /* NaN stays NaN, for the caller to refuse */
}

/* The table at (new, prefix): rows interpolated, the last two extended
 * beyond the last prefix, the first below the first. */
static double table_at(const kvf_prefill_cost *p, double x, double prefix)
{
    if (p->n_prefix <= 1)
        return row_at(p, 0, x);
    const uint64_t *ps = p->prefix_tokens;
    if (prefix <= (double)ps[0])
        return row_at(p, 0, x);
    size_t r = 0;
    while (r + 2 < p->n_prefix && prefix > (double)ps[r + 1])
        r++;
    double a = row_at(p, r, x), b = row_at(p, r + 1, x);
    double y = a + (b - a) * (prefix - (double)ps[r]) / (double)(ps[r + 1] - ps[r]);
    return y < 0 ? 0 : y;
}

kvf_status kvf__prefill_seconds(const kvf_prefill_cost *p, uint64_t new_tokens, uint64_t prefix,
                                double *seconds_p)
{
    if (new_tokens == 0) {
        *seconds_p = 0;
        return KVF_OK;
    }
    if (p->fn) {
        double s = NAN;
        kvf_status st = p->fn(p->user, new_tokens, prefix, &s);
        if (st != KVF_OK)
            return kvf__fail(st, "prefill cost: the function failed for %llu new tokens after %llu",
                             (unsigned long long)new_tokens, (unsigned long long)prefix);
        if (!isfinite(s) || s < 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "prefill cost: the function gave %g s for %llu new tokens after %llu "
                             "(must be finite and >= 0)",
                             s, (unsigned long long)new_tokens, (unsigned long long)prefix);
        *seconds_p = s;
        return KVF_OK;
    }
    double s;
    if (p->n_prefix == 0) {
        double d = row_at(p, 0, (double)prefix + (double)new_tokens) - row_at(p, 0, (double)prefix);
        s = d < 0 ? 0 : d;
    } else {
        s = table_at(p, (double)new_tokens, (double)prefix);
    }
    /* entries near DBL_MAX overflow when interpolated or extended, and
     * inf - inf is NaN: neither is a time */
    if (!isfinite(s))
        return kvf__fail(KVF_ERR_RANGE,
                         "prefill cost: the table gives %g s for %llu new tokens after %llu (its "
                         "seconds are too large to interpolate)",
                         s, (unsigned long long)new_tokens, (unsigned long long)prefix);
    *seconds_p = s;
    return KVF_OK;
}

/* ---- the plan -------------------------------------------------------------- */

static kvf_status check_costs(const kvf_plan_input *in, const bool used[KVF_TIER_COUNT])
{
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        const kvf_tier_cost *k = &in->costs.tier[t];
        if (!used[t])
            continue;
        if (!isfinite(k->latency_s) || k->latency_s < 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "kvf_plan_compute: %s tier: latency %g s (must be finite, >= 0)",
                             kvf_tier_name((kvf_tier)t), k->latency_s);
        /* a subnormal throughput (5e-324) is > 0, but a block's bytes
         * over it are no number of seconds */
        if (!isnormal(k->bytes_per_s) || k->bytes_per_s < 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "kvf_plan_compute: %s tier: throughput %g B/s (must be finite, > 0 "
                             "and not subnormal)",
                             kvf_tier_name((kvf_tier)t), k->bytes_per_s);
    }
    return KVF_OK;
}

/* In how many steps tier t's layer-wise loads arrive: its pool groups,
 * never finer than a layer's compute. */
static uint32_t tier_steps(const kvf_plan_input *in, int t, uint32_t layers)
{
    return in->arrival_steps[t] && in->arrival_steps[t] < layers ? in->arrival_steps[t] : layers;
}

/* When a forward of `compute` seconds that starts its layer l once tier
 * t's layer l has arrived (and layer l - 1 is done) ends, counted from the
 * loads' start, for n blocks of tier t alone; *arrived_p: when they have
 * all arrived. A tier whose pools arrive layer by layer delivers in
 * `steps` steps (DISK: its pool groups; never finer than a layer's
 * compute), lat + max(X / S + C, X + C / S); another whole, lat + X + C. */
static double tier_done(const kvf_plan_input *in, int t, uint64_t n, double compute,
                        uint32_t layers, bool overlap, double *arrived_p)
{
    const kvf_tier_cost *k = &in->costs.tier[t];
    double x = (double)n * (double)in->block_bytes / k->bytes_per_s;
    *arrived_p = k->latency_s + x;
    if (!overlap || !(in->layerwise_tiers >> t & 1u))
        return *arrived_p + compute;
    uint32_t steps = tier_steps(in, t, layers);
    double a = x / steps + compute, b = x + compute / steps;
    return k->latency_s + (a > b ? a : b);
}

/* The predicted time to the first token with cnt[t] blocks from each tier
 * and a forward pass of `compute` seconds (the model above). */
static double ttft(const kvf_plan_input *in, const uint64_t cnt[KVF_TIER_COUNT], double compute,
                   uint32_t layers, bool overlap, double *load_p)
{
    double t_max = compute, load = 0;
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        if (!cnt[t])
            continue;
        double arrived, done = tier_done(in, t, cnt[t], compute, layers, overlap, &arrived);
        if (arrived > load)
            load = arrived;
        if (done > t_max)
            t_max = done;
    }
    *load_p = load;
    /* without overlap the pass starts once every tier is in */
    return overlap ? t_max : load + compute;
}

static kvf_status take_input(const kvf_plan_input *in, kvf_plan_input *out)
{
    kvf_status st =
        take_sized(in, out, sizeof *out, "kvf_plan_compute: input", "KVF_PLAN_INPUT_INIT");
    if (st != KVF_OK)
        return st;
    if (out->hits && !out->tiers)
        return kvf__fail(KVF_ERR_INVALID, "kvf_plan_compute: tiers is NULL with %zu hits",
                         out->hits);
    if (out->tokens_per_block == 0 || out->block_bytes == 0 || out->request_tokens == 0)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_plan_compute: tokens_per_block %u, block_bytes %llu, "
                         "request_tokens %llu (each must be > 0)",
                         out->tokens_per_block, (unsigned long long)out->block_bytes,
                         (unsigned long long)out->request_tokens);
    /* the learnt ratios: 0 (an older caller's struct, or none set) is 1 */
    double *ratios[2] = {&out->load_ratio, &out->recompute_ratio};
    static const char *const names[2] = {"load_ratio", "recompute_ratio"};
    for (int i = 0; i < 2; i++) {
        if (*ratios[i] == 0)
            *ratios[i] = 1;
        else if (!isnormal(*ratios[i]) || *ratios[i] < 0)
            return kvf__fail(KVF_ERR_INVALID, "kvf_plan_compute: %s %g (must be finite and > 0)",
                             names[i], *ratios[i]);
    }
    return KVF_OK;
}

/* The front shape's scratch: per candidate k, the tail's compute C[k]
 * (tokens k tpb .. N after k tpb cached), the front's A[k] (tokens
 * 0 .. k tpb from scratch) and per tier the hits before k. */
typedef struct front_scratch {
    double *tail, *front;
    uint64_t *before; /* before[k * KVF_TIER_COUNT + t] */
} front_scratch;

/* The load of hits [f, l), every tier's batch side by side, as the tail
 * (tail seconds of compute after it) sees it: the tail ends at
 * max(front, this) + tail. Whole batches: when the last tier is in. With
 * overlap, a tier arriving layer by layer lets the tail start on its first
 * layers before its last ones are in (tier_done less the tail).
 * *arrived_p: when every block is in, whatever the shape; *layered_p:
 * whether a tier that arrives layer by layer is loaded. */
static double load_range(const kvf_plan_input *in, const front_scratch *fs, size_t f, size_t l,
                         double tail, uint32_t layers, bool overlap, double *arrived_p,
                         bool *layered_p)
{
    double load = 0, arrived = 0;
    bool layered = false;
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        uint64_t n = fs->before[l * KVF_TIER_COUNT + t] - fs->before[f * KVF_TIER_COUNT + t];
        if (!n)
            continue;
        double at, done = tier_done(in, t, n, tail, layers, overlap, &at) - tail;
        layered = layered || (overlap && (in->layerwise_tiers >> t & 1u));
        if (at > arrived)
            arrived = at;
        if (done > load)
            load = done;
    }
    if (arrived_p)
        *arrived_p = arrived;
    if (layered_p)
        *layered_p = layered;
    return load;
}

/* Ties go to less traffic: fewer blocks loaded. */
static bool better(double t, size_t loads, const kvf_plan *best)
{
    size_t best_loads = best->load_blocks - best->load_first;
    return t < best->ttft_s || (t == best->ttft_s && loads < best_loads);
}

/* The compute-front, load-back shape: hits [f, l) load (any tier) while
 * tokens [0, f tpb) are computed from scratch, then tokens [l tpb, N) over
 * the full cache: T = max(A[f], load(f, l)) + C[l], the load as the tail
 * sees it (load_range: with overlap, a tier arriving layer by layer lets
 * the tail start before its last layers are in). For a given l, A grows
 * with f and the load shrinks, so the best f is where they cross: a
 * binary search, O(max_k log max_k) in all. */
static void front_search(const kvf_plan_input *in, const front_scratch *fs, size_t max_k,
                         uint32_t layers, bool overlap, kvf_plan *best)
{
    for (size_t l = 2; l <= max_k; l++) {
        double tail = fs->tail[l];
        /* the least f in [1, l) with A[f] >= load(f, l), or l when none */
        size_t lo = 1, hi = l;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (fs->front[mid] >= load_range(in, fs, mid, l, tail, layers, overlap, NULL, NULL))
                hi = mid;
            else
                lo = mid + 1;
        }
        size_t cand[2] = {lo - 1, lo};
        if (lo < l) {
            /* where A stays flat beyond the crossing, T stays A[lo]: take
             * the largest such f (the fewest loads) */
            size_t a = lo, b = l - 1;
            while (a < b) {
                size_t mid = a + (b - a + 1) / 2;
                if (fs->front[mid] <= fs->front[lo])
                    a = mid;
                else
                    b = mid - 1;
            }
            cand[1] = a;
        }
        for (int i = 0; i < 2; i++) {
            size_t f = cand[i];
            if (f < 1 || f >= l)
                continue;
            double arrived;
            bool layered;
            double load = load_range(in, fs, f, l, tail, layers, overlap, &arrived, &layered);
            double t = (fs->front[f] > load ? fs->front[f] : load) + tail;
            if (!better(t, l - f, best))
                continue;
            best->ttft_s = t;
            best->load_first = f;
            best->load_blocks = l;
            best->load_s = arrived;
            best->compute_s = fs->front[f] + tail;
            best->overlap = layered;
            for (int k = 0; k < KVF_TIER_COUNT; k++)
                best->load[k] =
                    fs->before[l * KVF_TIER_COUNT + k] - fs->before[f * KVF_TIER_COUNT + k];
        }
    }
}

/* A[f] for f = 0 .. max_k - 1; more tokens from scratch never cost less
 * (a table is so by its checks; a function is held to it here, since the
 * search relies on it). */
static kvf_status front_costs(const kvf_prefill_cost *pc, uint64_t tpb, size_t max_k, double *front)
{
    front[0] = 0;
    for (size_t f = 1; f < max_k; f++) {
        kvf_status st = kvf__prefill_seconds(pc, f * tpb, 0, &front[f]);
        if (st != KVF_OK)
            return st;
        if (front[f] < front[f - 1])
            return kvf__fail(KVF_ERR_INVALID,
                             "prefill cost: the function gave %g s for %llu new tokens after 0, "
                             "less than %g s for %llu (more tokens never cost less)",
                             front[f], (unsigned long long)(f * tpb), front[f - 1],
                             (unsigned long long)((f - 1) * tpb));
    }
    return KVF_OK;
}

/* Every prediction the plan reports is a finite time: finite, positive
 * costs can still overflow (a throughput of 1e-300 B/s, a latency near
 * DBL_MAX added to a load), and a plan whose times are infinite compares
 * nothing. */
static kvf_status check_predictions(const kvf_plan *rec, const kvf_plan *all, const kvf_plan *split,
                                    const kvf_plan_input *in)
{
    const kvf_plan *shapes[] = {rec, all, split};
    static const char *const names[] = {"recompute all", "load all", "split"};
    for (int i = 0; i < 3; i++) {
        const kvf_plan *p = shapes[i];
        if (i == 2 && p->ttft_s == INFINITY && p->load_blocks == 0)
            continue; /* no split was possible: not a prediction */
        if (isfinite(p->ttft_s) && isfinite(p->load_s) && isfinite(p->compute_s))
            continue;
        double worst = 0;
        int tier = -1;
        for (int t = 0; t < KVF_TIER_COUNT; t++)
            if (p->load[t] && (tier < 0 || in->costs.tier[t].bytes_per_s < worst)) {
                tier = t;
                worst = in->costs.tier[t].bytes_per_s;
            }
        return kvf__fail(KVF_ERR_RANGE,
                         "kvf_plan_compute: the %s plan predicts %g s (load %g s, compute %g s): "
                         "the costs are beyond what a time can be%s%s%s",
                         names[i], p->ttft_s, p->load_s, p->compute_s,
                         tier >= 0 ? " (slowest tier loaded: " : "",
                         tier >= 0 ? kvf_tier_name((kvf_tier)tier) : "", tier >= 0 ? ")" : "");
    }
    return KVF_OK;
}

/* When the first layers of cnt[t] blocks from each tier are predicted in:
 * a tier arriving in steps delivers its first after its latency and a
 * step's bytes, another all at once. */
static double first_arrival(const kvf_plan_input *in, const uint64_t cnt[KVF_TIER_COUNT],
                            uint32_t layers, bool overlap)
{
    double first = 0;
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        if (!cnt[t])
            continue;
        const kvf_tier_cost *k = &in->costs.tier[t];
        double x = (double)cnt[t] * (double)in->block_bytes / k->bytes_per_s;
        if (overlap && (in->layerwise_tiers >> t & 1u))
            x /= tier_steps(in, t, layers);
        if (k->latency_s + x > first)
            first = k->latency_s + x;
    }
    return first;
}

/* p becomes the leading shape with k hits loaded (cnt[t] from tier t). */
static void set_leading(kvf_plan *p, double t, size_t k, double load, double compute, bool overlap,
                        const uint64_t cnt[KVF_TIER_COUNT])
{
    p->ttft_s = t;
    p->load_first = 0;
    p->load_blocks = k;
    p->load_s = load;
    p->compute_s = compute;
    p->overlap = overlap;
    memcpy(p->load, cnt, KVF_TIER_COUNT * sizeof *cnt);
}

kvf_status kvf_plan_compute(const kvf_plan_input *input, kvf_plan *plan)
{
    kvf__clear_error();
    kvf_plan_input in;
    kvf_status st = take_input(input, &in);
    if (st != KVF_OK)
        return st;
    if (!plan || !kvf__sized_ok(plan, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_plan_compute: plan is NULL or its struct_size is wrong (start from "
                         "KVF_PLAN_INIT)");
    kvf_prefill_cost pc;
    if (!in.prefill)
        return kvf__fail(KVF_ERR_INVALID, "kvf_plan_compute: no prefill cost");
    if ((st = kvf__prefill_check(in.prefill, &pc)) != KVF_OK)
        return st;
    bool used[KVF_TIER_COUNT] = {false};
    for (size_t i = 0; i < in.hits; i++) {
        if ((unsigned)in.tiers[i] >= KVF_TIER_COUNT)
            return kvf__fail(KVF_ERR_INVALID,
                             "kvf_plan_compute: tiers[%zu] = %d is not one of host, disk, remote, "
                             "gpu",
                             i, (int)in.tiers[i]);
        used[in.tiers[i]] = true;
    }
    if ((st = check_costs(&in, used)) != KVF_OK)
        return st;

    uint64_t tpb = in.tokens_per_block, n_tok = in.request_tokens;
    /* at least one token is computed: K * tpb <= N - 1 */
    size_t max_k = (size_t)((n_tok - 1) / tpb);
    if (max_k > in.hits)
        max_k = in.hits;
    uint32_t layers = pc.layers ? pc.layers : 1;
    bool overlap = pc.overlap && layers > 1;

    size_t n = max_k + 1;
    front_scratch fs;
    void *mem = malloc(n * (2 * sizeof(double) + KVF_TIER_COUNT * sizeof(uint64_t)));
    if (!mem)
        return kvf__fail(KVF_ERR_NOMEM, "kvf_plan_compute: out of memory for %zu hits", max_k);
    fs.tail = mem;
    fs.front = fs.tail + n;
    fs.before = (uint64_t *)(fs.front + n);

    /* the leading shape: K hits loaded (layer by layer where they can);
     * K = 0 and K = max_k are the pure policies, the rest splits */
    kvf_plan rec = KVF_PLAN_INIT, all = KVF_PLAN_INIT, split = KVF_PLAN_INIT;
    split.ttft_s = INFINITY;
    uint64_t cnt[KVF_TIER_COUNT] = {0};
    for (size_t k = 0; k <= max_k; k++) {
        if (k > 0)
            cnt[in.tiers[k - 1]]++;
        memcpy(&fs.before[k * KVF_TIER_COUNT], cnt, sizeof cnt);
        double compute, load;
        st = kvf__prefill_seconds(&pc, n_tok - k * tpb, k * tpb, &compute);
        if (st != KVF_OK)
            goto out;
        fs.tail[k] = compute;
        double t = ttft(&in, cnt, compute, layers, overlap, &load);
        if (k == 0)
            set_leading(&rec, t, k, load, compute, overlap, cnt);
        if (k == max_k)
            set_leading(&all, t, k, load, compute, overlap, cnt);
        if (k > 0 && k < max_k && t < split.ttft_s)
            set_leading(&split, t, k, load, compute, overlap, cnt);
    }
    /* the front shape: front computed while the back loads */
    if (max_k >= 2 && !pc.leading_only) {
        if ((st = front_costs(&pc, tpb, max_k, fs.front)) != KVF_OK)
            goto out;
        front_search(&in, &fs, max_k, layers, overlap, &split);
    }
    /* what the requests served so far took against their predictions
     * (kvf_cache_observe_plan): every shape that loads by one ratio,
     * recomputing by its own, so the choice between the shapes that
     * load stays the model's */
    double lr = in.load_ratio, rr = in.recompute_ratio;
    rec.ttft_s *= rr;
    all.ttft_s *= all.load_blocks ? lr : rr;
    if (isfinite(split.ttft_s))
        split.ttft_s *= lr;
    /* the better pure policy (a tie to less traffic: recompute), unless a
     * split predicts at least min_gain less: a prediction is an estimate,
     * and a split whose gain is within its error may well lose */
    kvf_plan best = all.ttft_s < rec.ttft_s ? all : rec;
    if ((st = check_predictions(&rec, &all, &split, &in)) != KVF_OK)
        goto out;
    bool has_split = isfinite(split.ttft_s);
    if (has_split && split.ttft_s < (1 - pc.min_gain) * best.ttft_s)
        best = split;
    if (best.load_blocks > best.load_first) {
        /* giving up the loads at time h leaves the tokens they were to
         * bring to compute after the front (all of them in the leading
         * shape, whose forward needs every layer's prefix): the request
         * ends at h + fallback, within the margin while
         * h <= (1 + margin) R - fallback. A plan whose loads are due
         * later than that cannot be hedged within it: it waits until
         * they run a margin late. Neither comes before
         * KVF_PLAN_HEDGE_MIN_S: a pool that late may be a thread not yet
         * run, and a model that recomputes in less (a small one on a fast
         * GPU predicts ~0 for both) would give up loads that are on time. */
        double m = pc.min_gain > 0 ? pc.min_gain : 0;
        best.fallback_s = fs.tail[best.load_first];
        /* reckoned from the learnt predictions: a fallback is a forward
         * pass, as recomputing is; the loads run as the shapes that load */
        double h = (1 + m) * rec.ttft_s - rr * best.fallback_s, due = (1 + m) * lr * best.load_s;
        best.hedge_s = h > due ? h : due;
        if (best.hedge_s < KVF_PLAN_HEDGE_MIN_S)
            best.hedge_s = KVF_PLAN_HEDGE_MIN_S;
        best.first_s = first_arrival(&in, best.load, layers, overlap);
    }
    best.load_ratio = lr;
    best.recompute_ratio = rr;
    best.ttft_split_s = has_split ? split.ttft_s : 0;
    best.ttft_recompute_s = rec.ttft_s;
    best.ttft_load_all_s = all.ttft_s;
    best.hits = in.hits;
    best.recompute_from = best.load_blocks * tpb;
    best.compute_tokens = n_tok - best.recompute_from;
    for (size_t i = 0; i < in.hits; i++)
        if (i < best.load_first || i >= best.load_blocks)
            best.recompute_hits[in.tiers[i]]++;
    kvf__sized_copy_out(plan, &best, sizeof best);
out:
    free(mem);
    return st;
}
