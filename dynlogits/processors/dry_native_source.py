"""The C source of ``dry``'s native host steps (``dry_native`` compiles it): constants of this
module, so nothing a request carries reaches the compiler.

- ``STEPS``: ``dry_steps``, the V1 runner's common step over every row's kept window;
- ``WINDOW``: ``dry_window``, Model Runner V2's step over the token matrix in host memory;
- ``LOWER``: ``dry_lower``, float32 host logits lowered at the hits;
- ``READ``: ``dry_read``, the V1 rows' live lists checked and their new tokens read through
  CPython's C API (a library of its own, loaded holding the GIL)."""

from __future__ import annotations

__all__ = ["LOWER", "READ", "SOURCE", "STEPS", "WINDOW"]

STEPS = r"""#include <float.h>
#include <stdint.h>

/* One step of n rows (see dynlogits/processors/dry_native.py). Row r: tok[r] (int32) and len[r]
   (uint16) hold *end[r] tokens and, at each earlier position of the last token, the repeat ending
   there; the new token goes at *end[r] (the buffers hold at least *end[r] + 1), *end[r] grows by one.
   Emits (bases[r] + id, amount) for each id the row penalizes, at most one per id; seen[] (width
   entries) is -1 on entry and on return. Returns the number emitted. */
int64_t dry_steps(int64_t n, const int64_t *tok_ptrs, const int64_t *len_ptrs, const int64_t *end_ptrs,
                  const int32_t *new_tokens, const int64_t *lookback, const int64_t *cap,
                  const int64_t *allowed, const int64_t *cap_exp, const int64_t *table_ptrs,
                  const int64_t *mask_ptrs, const int64_t *mask_lens, const int64_t *bases, int64_t width,
                  int32_t *seen, int64_t *out_flat, double *out_amount) {
    int64_t count = 0;
    /* the rows' buffers are apart and cold (the engine just wrote the logits): their loads are
       issued together first, so their misses overlap instead of coming one after the other */
    for (int64_t r = 0; r < n; r++)
        __builtin_prefetch((const void *)(intptr_t)end_ptrs[r]);
    for (int64_t r = 0; r < n; r++) {
        const char *t0 = (const char *)(intptr_t)tok_ptrs[r], *l0 = (const char *)(intptr_t)len_ptrs[r];
        int64_t e = *(const int64_t *)(intptr_t)end_ptrs[r];
        int64_t s = e + 1 > lookback[r] ? e + 1 - lookback[r] : 0;
        for (int64_t b = 4 * s; b <= 4 * e; b += 64)
            __builtin_prefetch(t0 + b);
        for (int64_t b = 2 * s; b <= 2 * e; b += 64)
            __builtin_prefetch(l0 + b);
        __builtin_prefetch((const void *)(intptr_t)table_ptrs[r]);
    }
    for (int64_t r = 0; r < n; r++) {
        int32_t *T = (int32_t *)(intptr_t)tok_ptrs[r];
        uint16_t *L = (uint16_t *)(intptr_t)len_ptrs[r];
        const double *table = (const double *)(intptr_t)table_ptrs[r];
        const uint8_t *mask = (const uint8_t *)(intptr_t)mask_ptrs[r];
        int64_t mlen = mask_lens[r];
        int64_t *E = (int64_t *)(intptr_t)end_ptrs[r];
        int64_t e = *E;
        int32_t t = new_tokens[r];
        int32_t prev = e > 0 ? T[e - 1] : -1;
        T[e] = t;
        L[e] = 0;
        *E = e + 1;
        int64_t start = e + 1 > lookback[r] ? e + 1 - lookback[r] : 0;
        int64_t limit = e + 1 - start;
        if (mlen > 0) {
            for (int64_t q = e; q >= start; q--) {
                int32_t x = T[q];
                if (x >= 0 && x < mlen && mask[x]) {
                    limit = e - q;
                    break;
                }
            }
        }
        int64_t c = cap[r], a = allowed[r], ce = cap_exp[r], base = bases[r];
        int64_t first = count, last = -2;
        uint16_t kept = 0;
        for (int64_t p = start; p < e; p++) {
            if (T[p] != t)
                continue;
            int64_t q = p - 1, length;
            if (q >= start && T[q] == prev) {
                length = (int64_t)(q == last ? kept : L[q]) + 1;
                if (length > c)
                    length = c;
            } else {
                length = 1;
            }
            if (length > p - start + 1)
                length = p - start + 1;
            last = p;
            kept = L[p];
            L[p] = (uint16_t)length;
            if (length > limit)
                length = limit;
            if (length < a)
                continue;
            int32_t f = T[p + 1];
            if (f < 0 || f >= width || (f < mlen && mask[f]))
                continue;
            int32_t k = seen[f];
            if (k < 0) {
                seen[f] = (int32_t)count;
                out_flat[count] = base + f;
                out_amount[count] = (double)length;
                count++;
            } else if (out_amount[k] < (double)length) {
                out_amount[k] = (double)length;
            }
        }
        for (int64_t k = first; k < count; k++) {
            seen[out_flat[k] - base] = -1;
            int64_t exponent = (int64_t)out_amount[k] - a;
            if (ce > 0 && exponent > ce)
                exponent = ce;
            out_amount[k] = table[exponent];
        }
    }
    return count;
}
"""

WINDOW = r"""static int dry_is_breaker(const int64_t *s, int64_t m, int64_t x) {
    int64_t lo = 0, hi = m;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (s[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m && s[lo] == x;
}

/* Model Runner V2's window step on host memory (dry_device.lower_window_'s contract), for n member
   rows. rows[i*8 ..]: the row's logits and pos index, its row of the token matrix, its slot (tables),
   look-back, whether the prompt lies outside its window, its cap (at most w), allowed length, and
   its sorted single-token breakers' count (0: none; else singles_cols). Per row: its window's
   repeat ending at each earlier position of its last token is measured as the Z-function of the
   reversed window (a placeholder equal to nothing), capped; each follower at least allowed long
   (not a breaker, not a placeholder) lowers the row's float32 logit once, by the largest amount of
   the slot's table row (float32-rounded amounts), as lower_window_ lowers it. floor may be 0 (none).
   seen[] (width entries) is -1 on entry and on return; z, hit_id, hit_pen hold w entries. Returns
   the number of logits lowered. pos: int64 where pos64, else int32. */
int64_t dry_window(int64_t n, const int64_t *rows, int64_t w, int64_t cap, const int32_t *tok, int64_t tok_cols,
                   const void *pos, int64_t pos64, const int32_t *prompt_len, const int64_t *floor, const double *table,
                   int64_t table_cols, const int64_t *singles, int64_t singles_cols, float *logits, int64_t stride,
                   int64_t width, int32_t *seen, int32_t *z, int32_t *hit_id, double *hit_pen) {
    int64_t lowered = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t *row = rows + 8 * i;
        int64_t k = row[0], slot = row[2], allowed = row[6], nsing = row[7];
        int64_t end = pos64 ? ((const int64_t *)pos)[k] : ((const int32_t *)pos)[k];
        if (end < 0 || end >= tok_cols)
            continue;
        const int32_t *T = tok + row[1] * tok_cols;
        int64_t start = end - w + 1;
        if (end + 1 - row[3] > start)
            start = end + 1 - row[3];
        if (row[4] && prompt_len[row[1]] > start)
            start = prompt_len[row[1]];
        if (floor && floor[k] > start)
            start = floor[k];
        if (start < 0)
            start = 0;
        int32_t t = T[end];
        if (start >= end || t < 0)
            continue;
        const int64_t *S = singles + slot * singles_cols;
        int64_t c = row[5] < cap ? row[5] : cap;
        if (nsing)
            for (int64_t q = end; q >= start && end - q < c; q--)
                if (T[q] >= 0 && dry_is_breaker(S, nsing, T[q])) {
                    c = end - q;
                    break;
                }
        if (c < allowed)
            continue;
        /* r[j] = T[end - j]: the Z-function of the window reversed, each value capped at c */
        int64_t span = end - start + 1, l = 0, r = 0, hits = 0;
        const int32_t *back = T + end;
        for (int64_t j = 1; j < span; j++) {
            int64_t m = 0;
            if (j < r) {
                m = r - j;
                if (z[j - l] < m)
                    m = z[j - l];
            }
            while (m < c && j + m < span && back[-m] >= 0 && back[-m] == back[-(j + m)])
                m++;
            if (j + m > r) {
                l = j;
                r = j + m;
            }
            z[j] = (int32_t)m;
            if (m < allowed)
                continue;
            int32_t f = back[-j + 1];
            if (f < 0 || f >= width || (nsing && dry_is_breaker(S, nsing, f)))
                continue;
            int64_t e = m - allowed;
            if (e > table_cols - 1)
                e = table_cols - 1;
            double amount = table[slot * table_cols + e];
            int32_t h = seen[f];
            if (h < 0) {
                seen[f] = (int32_t)hits;
                hit_id[hits] = f;
                hit_pen[hits] = amount;
                hits++;
            } else if (hit_pen[h] < amount) {
                hit_pen[h] = amount;
            }
        }
        float *out = logits + k * stride;
        for (int64_t h = 0; h < hits; h++) {
            int32_t f = hit_id[h];
            seen[f] = -1;
            float kept = out[f];
            if (kept != kept)
                continue; /* NaN stays NaN */
            double low = (double)kept - hit_pen[h];
            double least = kept < -FLT_MAX ? (double)kept : (double)-FLT_MAX;
            out[f] = (float)(low > least ? low : least);
        }
        lowered += hits;
    }
    return lowered;
}"""

LOWER = r"""/* float32 logits (flat) lowered at n distinct indices, each by its amount rounded to float32 (at most
   float32's largest), as dry_lowering._lower_host_f32 lowers them: the difference in double,
   floored at float32's lowest (-inf kept), rounded on the store; NaN kept. Every logit is read
   (prefetched) before the first is written, so the misses overlap. */
void dry_lower(int64_t n, const int64_t *flat, const double *amount, float *logits) {
    for (int64_t i = 0; i < n; i++)
        __builtin_prefetch(logits + flat[i], 1);
    for (int64_t i = 0; i < n; i++) {
        float kept = logits[flat[i]];
        if (kept != kept)
            continue;
        double a = amount[i] < (double)FLT_MAX ? amount[i] : (double)FLT_MAX;
        double low = (double)kept - (double)(float)a;
        double least = kept < -FLT_MAX ? (double)kept : (double)-FLT_MAX;
        logits[flat[i]] = (float)(low > least ? low : least);
    }
}
"""

#: the library of ``STEPS``, ``WINDOW`` and ``LOWER``
SOURCE = STEPS + WINDOW + LOWER

READ = r"""#include <stdint.h>

/* CPython's C API, declared here (no Python.h needed): functions of the running interpreter, which
   exports them to the libraries it loads, as to its extension modules. */
typedef struct _object PyObject;
extern PyObject *PyList_GetItem(PyObject *list, intptr_t index);
extern intptr_t PyList_Size(PyObject *list);
extern long PyLong_AsLongAndOverflow(PyObject *value, int *overflow);
extern void PyErr_Clear(void);

/* Called holding the GIL. Row r's history is histories[rows[r]] (a list): it must be the object
   at sources[r], lens[r] items long, its items lens[r] - 1 - k (k = 1 .. min(tail, lens[r] - 1))
   the values tok_ptrs[r][end - k] (end: *end_ptrs[r]) and its last item an int in [0, 2^31).
   Where every row holds, writes each row's last item to new_tokens[r], adds one to every lens[r]
   and returns -1; else returns the first row that does not hold and changes nothing. Only borrowed
   references are read; no error is left set. Loads are issued a stage at a time for every row
   (lists, their items' tails, the items), so the rows' cache misses overlap. */
int64_t dry_read(int64_t n, PyObject *histories, const int64_t *rows, const int64_t *sources, int64_t *lens,
                 const int64_t *tok_ptrs, const int64_t *end_ptrs, int64_t tail, int32_t *new_tokens) {
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = PyList_GetItem(histories, (intptr_t)rows[r]);
        if (h == 0) {
            PyErr_Clear();
            return r;
        }
        if ((int64_t)(intptr_t)h != sources[r])
            return r;
        __builtin_prefetch(h);
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = (PyObject *)(intptr_t)sources[r];
        intptr_t len = PyList_Size(h);
        if (len != lens[r]) {
            PyErr_Clear();
            return r;
        }
        /* the items' array: CPython's list keeps it after its size (a prefetch of a wrong
           address, where a build lays lists out otherwise, costs nothing: it never faults) */
        PyObject *const *items = ((PyObject *const *const *)h)[3];
        for (int64_t k = 0; k <= tail + 8 && k < len; k += 8)
            __builtin_prefetch(items + len - 1 - k);
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = (PyObject *)(intptr_t)sources[r];
        intptr_t len = (intptr_t)lens[r];
        for (int64_t k = 0; k <= tail && k < len; k++)
            __builtin_prefetch(PyList_GetItem(h, len - 1 - k));
        __builtin_prefetch((const void *)(intptr_t)end_ptrs[r]);
    }
    for (int64_t r = 0; r < n; r++) {
        PyObject *h = (PyObject *)(intptr_t)sources[r];
        intptr_t len = (intptr_t)lens[r];
        int overflow = 0;
        long t = PyLong_AsLongAndOverflow(PyList_GetItem(h, len - 1), &overflow);
        if (overflow || t < 0 || t >= 2147483647L + 1) {
            PyErr_Clear();
            return r;
        }
        const int32_t *T = (const int32_t *)(intptr_t)tok_ptrs[r];
        int64_t end = *(const int64_t *)(intptr_t)end_ptrs[r], known = len - 1;
        int64_t last = known < tail ? known : tail;
        for (int64_t k = 1; k <= last; k++) {
            long v = PyLong_AsLongAndOverflow(PyList_GetItem(h, known - k), &overflow);
            if (overflow || v != (long)T[end - k]) {
                PyErr_Clear();
                return r;
            }
        }
        new_tokens[r] = (int32_t)t;
    }
    for (int64_t r = 0; r < n; r++)
        lens[r] += 1;
    return -1;
}
"""
