/* graphmem._native: compiled versions of the hot loops of a few analyses.
 *
 * Each function here does exactly what a pure-Python function in graphmem does (named in
 * its comment), on the same inputs and with the same result: the Python one is the
 * reference, runs when this module was not built (no C compiler at install time, or
 * GRAPHMEM_PURE_PYTHON=1; see graphmem/native.py), and tests/test_native.py checks the
 * two agree. Only plain loops over lists and bytes live here; the analyses
 * around them stay in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A dictionary sized for n entries up front (no resizing while it fills), where the
 * interpreter offers it. */
static PyObject *presized_dict(Py_ssize_t n) {
#if PY_VERSION_HEX < 0x030D0000
    return _PyDict_NewPresized(n);
#else
    (void)n;
    return PyDict_New();
#endif
}

/* ------------------------------------------------------------------------------------ */
/* Growable arrays                                                                      */
/* ------------------------------------------------------------------------------------ */

static int grow(void **items, Py_ssize_t *cap, Py_ssize_t need, size_t item_size) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 16;
    while (cap2 < need) cap2 *= 2;
    void *p = PyMem_Realloc(*items, (size_t)cap2 * item_size);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *items = p;
    *cap = cap2;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* The BFC allocator (graphmem/analysis/bfc.py, BFCAllocator and replay_step)           */
/* ------------------------------------------------------------------------------------ */

#define MIN_ALLOCATION 256
#define NUM_BINS 21
#define MAX_INTERNAL_FRAGMENTATION (128LL << 20)
#define INITIAL_REGION (2LL << 20)
#define REGION_GAP (1LL << 12)
/* Regions stop growing here (4 PiB; bfc.py's MAX_REGION): every address, size and sum of
 * them stays far inside 64 bits, and a replay past it fails instead of doubling forever. */
#define MAX_REGION (1LL << 52)
static const char TOO_BIG[] = "the step needs more than 4 PiB on one device";

typedef struct {
    int64_t size, addr;
    int32_t prev, next; /* the chunks just below and above in the region; -1: none */
    int32_t free;       /* 1 while free (and in a bin) */
} Chunk;

typedef struct {
    int32_t *items; /* chunk ids, sorted by (size, address) */
    Py_ssize_t len, cap;
} Bin;

typedef struct {
    Chunk *chunks;
    Py_ssize_t nchunks, cap;
    int32_t *spare; /* ids of chunks merged away, to reuse */
    Py_ssize_t nspare, spare_cap;
    Bin bins[NUM_BINS];
    uint32_t nonempty; /* bit b: bin b holds a chunk */
    int64_t region_bytes, next_base, in_use, peak;
} BFC;

static void bfc_init(BFC *a) {
    memset(a, 0, sizeof(*a));
    a->region_bytes = INITIAL_REGION;
}

static void bfc_clear(BFC *a) {
    PyMem_Free(a->chunks);
    PyMem_Free(a->spare);
    for (int b = 0; b < NUM_BINS; b++) PyMem_Free(a->bins[b].items);
    memset(a, 0, sizeof(*a));
}

static int bin_of(int64_t size) {
    uint64_t x = (uint64_t)size >> 8;
    int b = x ? 63 - __builtin_clzll(x) : -1;
    return b < NUM_BINS ? b : NUM_BINS - 1;
}

/* whether chunk x sorts before (size, addr) */
static inline int before_key(const Chunk *x, int64_t size, int64_t addr) {
    return x->size < size || (x->size == size && x->addr < addr);
}

static Py_ssize_t bin_lower_bound(const BFC *a, const Bin *bin, int64_t size, int64_t addr) {
    Py_ssize_t lo = 0, hi = bin->len;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (before_key(&a->chunks[bin->items[mid]], size, addr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int bin_insert(BFC *a, int32_t id) {
    Chunk *c = &a->chunks[id];
    int b = bin_of(c->size);
    Bin *bin = &a->bins[b];
    if (grow((void **)&bin->items, &bin->cap, bin->len + 1, sizeof(int32_t)) < 0) return -1;
    Py_ssize_t k = bin_lower_bound(a, bin, c->size, c->addr);
    memmove(bin->items + k + 1, bin->items + k, (size_t)(bin->len - k) * sizeof(int32_t));
    bin->items[k] = id;
    bin->len++;
    a->nonempty |= 1u << b;
    c->free = 1;
    return 0;
}

static void bin_remove(BFC *a, int32_t id) {
    Chunk *c = &a->chunks[id];
    int b = bin_of(c->size);
    Bin *bin = &a->bins[b];
    Py_ssize_t k = bin_lower_bound(a, bin, c->size, c->addr);
    memmove(bin->items + k, bin->items + k + 1, (size_t)(bin->len - k - 1) * sizeof(int32_t));
    bin->len--;
    if (!bin->len) a->nonempty &= ~(1u << b);
    c->free = 0;
}

static int32_t new_chunk(BFC *a, int64_t addr, int64_t size) {
    int32_t id;
    if (a->nspare) {
        id = a->spare[--a->nspare];
    } else {
        if (a->nchunks >= INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "too many allocator chunks");
            return -1;
        }
        if (grow((void **)&a->chunks, &a->cap, a->nchunks + 1, sizeof(Chunk)) < 0) return -1;
        id = (int32_t)a->nchunks++;
    }
    Chunk *c = &a->chunks[id];
    c->size = size;
    c->addr = addr;
    c->prev = c->next = -1;
    c->free = 0;
    return id;
}

static int drop_chunk(BFC *a, int32_t id) {
    if (grow((void **)&a->spare, &a->spare_cap, a->nspare + 1, sizeof(int32_t)) < 0) return -1;
    a->spare[a->nspare++] = id;
    return 0;
}

static int bfc_extend(BFC *a, int64_t need) {
    int grew = 0;
    while (need > a->region_bytes && a->region_bytes <= MAX_REGION) {
        a->region_bytes *= 2;
        grew = 1;
    }
    if (a->region_bytes > MAX_REGION) { /* bfc.py's _extend raises the same */
        PyErr_SetString(PyExc_OverflowError, TOO_BIG);
        return -1;
    }
    int32_t id = new_chunk(a, a->next_base, a->region_bytes);
    if (id < 0) return -1;
    a->next_base += a->region_bytes + REGION_GAP;
    if (bin_insert(a, id) < 0) return -1;
    if (!grew) a->region_bytes *= 2;
    return 0;
}

/* BFCAllocator.allocate: the chunk id handed out, -1 on error */
static int32_t bfc_allocate(BFC *a, int64_t nbytes) {
    if (nbytes > MAX_REGION) { /* no region holds it (and rounding up could overflow) */
        PyErr_SetString(PyExc_OverflowError, TOO_BIG);
        return -1;
    }
    int64_t need = (nbytes + MIN_ALLOCATION - 1) & -(int64_t)MIN_ALLOCATION;
    if (need < MIN_ALLOCATION) need = MIN_ALLOCATION;
    int first = bin_of(need);
    for (;;) {
        for (int b = first; b < NUM_BINS; b++) {
            if (!(a->nonempty & (1u << b))) continue;
            Bin *bin = &a->bins[b];
            Py_ssize_t k = bin_lower_bound(a, bin, need, 0);
            if (k >= bin->len) continue;
            int32_t id = bin->items[k];
            bin_remove(a, id);
            Chunk *c = &a->chunks[id];
            if (c->size >= 2 * need || c->size - need >= MAX_INTERNAL_FRAGMENTATION) {
                int64_t rest_addr = c->addr + need, rest_size = c->size - need;
                int32_t rest = new_chunk(a, rest_addr, rest_size);
                if (rest < 0) return -1;
                c = &a->chunks[id]; /* the array may have moved */
                Chunk *r = &a->chunks[rest];
                r->prev = id;
                r->next = c->next;
                if (c->next >= 0) a->chunks[c->next].prev = rest;
                c->next = rest;
                c->size = need;
                if (bin_insert(a, rest) < 0) return -1;
                c = &a->chunks[id];
            }
            a->in_use += c->size;
            if (a->in_use > a->peak) a->peak = a->in_use;
            return id;
        }
        if (bfc_extend(a, need) < 0) return -1;
    }
}

/* chunk `upper`, just above `lower` in its region, joins it */
static int merge_chunks(BFC *a, int32_t lower, int32_t upper) {
    Chunk *l = &a->chunks[lower], *u = &a->chunks[upper];
    l->size += u->size;
    l->next = u->next;
    if (u->next >= 0) a->chunks[u->next].prev = lower;
    return drop_chunk(a, upper);
}

/* BFCAllocator.free: merges with free neighbours in the region */
static int bfc_free(BFC *a, int32_t id) {
    a->in_use -= a->chunks[id].size;
    int32_t above = a->chunks[id].next;
    if (above >= 0 && a->chunks[above].free) {
        bin_remove(a, above);
        if (merge_chunks(a, id, above) < 0) return -1;
    }
    int32_t below = a->chunks[id].prev;
    if (below >= 0 && a->chunks[below].free) {
        bin_remove(a, below);
        if (merge_chunks(a, below, id) < 0) return -1;
        id = below;
    }
    return bin_insert(a, id);
}

/* The allocators of a step, one per device, in the order the devices first appear. */
typedef struct {
    PyObject *index; /* device -> its allocator's position */
    BFC *items;
    Py_ssize_t len, cap;
} Allocators;

static Py_ssize_t allocator_of(Allocators *all, PyObject *device, int create) {
    PyObject *found = PyDict_GetItemWithError(all->index, device);
    if (found) return PyLong_AsSsize_t(found);
    if (PyErr_Occurred() || !create) return -1;
    if (grow((void **)&all->items, &all->cap, all->len + 1, sizeof(BFC)) < 0) return -1;
    bfc_init(&all->items[all->len]);
    PyObject *pos = PyLong_FromSsize_t(all->len);
    if (!pos || PyDict_SetItem(all->index, device, pos) < 0) {
        Py_XDECREF(pos);
        return -1;
    }
    Py_DECREF(pos);
    return all->len++;
}

/* an event's allocator and chunk, as the value of a handle */
static PyObject *handle(Py_ssize_t allocator, int32_t chunk) {
    return PyLong_FromLongLong(((long long)allocator << 32) | (uint32_t)chunk);
}

static int free_handle(Allocators *all, PyObject *value) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    return bfc_free(&all->items[v >> 32], (int32_t)(v & 0xffffffffLL));
}

/* PyDict_Pop (Python 3.13) for older Pythons: *found is a new reference or NULL */
static int dict_pop(PyObject *dict, PyObject *key, PyObject **found) {
    *found = PyDict_GetItemWithError(dict, key);
    if (!*found) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(*found);
    if (PyDict_DelItem(dict, key) < 0) {
        Py_CLEAR(*found);
        return -1;
    }
    return 0;
}

static int event_fields(PyObject *ev, Py_ssize_t *size) {
    if (!PyTuple_Check(ev)) {
        PyErr_SetString(PyExc_TypeError, "replay_step: events are tuples");
        return -1;
    }
    *size = PyTuple_GET_SIZE(ev);
    return 0;
}

/* The allocators of a step's devices, the persistent buffers allocated first (their chunks'
 * handles in `owned`, when given), and which one is `host`'s (-1: none). */
static int step_allocators(Allocators *all, PyObject *events, PyObject *persistent,
                           PyObject *host, long long *owned, Py_ssize_t *hosted) {
    all->index = PyDict_New();
    if (!all->index) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(persistent); i++) {
        PyObject *dev, *nbytes;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(persistent, i), "OO", &dev, &nbytes)) return -1;
        Py_ssize_t a = allocator_of(all, dev, 1);
        if (a < 0) return -1;
        long long b = PyLong_AsLongLong(nbytes);
        if (b == -1 && PyErr_Occurred()) return -1;
        int32_t chunk = bfc_allocate(&all->items[a], b);
        if (chunk < 0) return -1;
        if (owned) owned[i] = ((long long)a << 32) | (uint32_t)chunk;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        Py_ssize_t len;
        if (event_fields(ev, &len) < 0) return -1;
        if (len < 1) {
            PyErr_SetString(PyExc_ValueError, "replay_step: an empty event");
            return -1;
        }
        if (len >= 4 && allocator_of(all, PyTuple_GET_ITEM(ev, 1), 1) < 0) return -1;
    }
    *hosted = -1;
    if (host != Py_None) {
        PyObject *found = PyDict_GetItemWithError(all->index, host);
        if (found) *hosted = PyLong_AsSsize_t(found);
        else if (PyErr_Occurred()) return -1;
    }
    return 0;
}

static void clear_allocators(Allocators *all) {
    Py_XDECREF(all->index);
    for (Py_ssize_t a = 0; a < all->len; a++) bfc_clear(&all->items[a]);
    PyMem_Free(all->items);
}

/* An event's request (its device and bytes, fields 1 and 2) handed to its device's
 * allocator: the allocator's index, the chunk, and the bytes in use before. */
static int allocate_event(Allocators *all, PyObject *ev, Py_ssize_t *a, int32_t *chunk,
                          int64_t *before) {
    *a = allocator_of(all, PyTuple_GET_ITEM(ev, 1), 0);
    if (*a < 0) return -1;
    long long b = PyLong_AsLongLong(PyTuple_GET_ITEM(ev, 2));
    if (b == -1 && PyErr_Occurred()) return -1;
    *before = all->items[*a].in_use;
    *chunk = bfc_allocate(&all->items[*a], b);
    return *chunk < 0 ? -1 : 0;
}

/* bfc._run_step: one step through the allocators from their state; its peak above what
 * was in use when it began (and the position of the event that reached it), the bytes in
 * use at each mark appended to `timeline` (when given). An adopt event (buffer, k, ADOPT)
 * hands the buffer to variable k of `owned` and frees the variable's old chunk (without
 * `owned`, np = 0, such events are not expected). A five-field event (buffer, device,
 * bytes, position, k) is a copy of variable k made by the `first` step only: the variable
 * takes the new chunk, its old one stays in use (bfc.py). What the step leaves allocated
 * is freed at its end. */
static int run_step(Allocators *all, PyObject *events, Py_ssize_t hosted, long long *owned,
                    Py_ssize_t np, PyObject *timeline, int64_t *peak, int64_t *peak_pos,
                    int first) {
    int rc = -1;
    PyObject *handles = PyDict_New();
    if (!handles) return -1;
    int64_t step = 0;
    for (Py_ssize_t a = 0; a < all->len; a++)
        if (a != hosted) step += all->items[a].in_use;
    int64_t start = step;
    *peak = *peak_pos = 0;
    Py_ssize_t n = PyList_GET_SIZE(events);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        Py_ssize_t len = PyTuple_GET_SIZE(ev);
        if (len == 4) {
            Py_ssize_t a;
            int32_t chunk;
            int64_t before;
            if (allocate_event(all, ev, &a, &chunk, &before) < 0) goto done;
            BFC *alloc = &all->items[a];
            PyObject *h = handle(a, chunk);
            if (!h || PyDict_SetItem(handles, PyTuple_GET_ITEM(ev, 0), h) < 0) {
                Py_XDECREF(h);
                goto done;
            }
            Py_DECREF(h);
            if (a != hosted) {
                step += alloc->in_use - before;
                if (step - start > *peak) {
                    *peak = step - start;
                    *peak_pos = PyLong_AsLongLong(PyTuple_GET_ITEM(ev, 3));
                    if (*peak_pos == -1 && PyErr_Occurred()) goto done;
                }
            }
        } else if (len == 5) {
            if (!first || !owned) continue;
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(ev, 4));
            if (k == -1 && PyErr_Occurred()) goto done;
            if (k < 0 || k >= np) {
                PyErr_SetString(PyExc_IndexError, "replay_step: no such variable");
                goto done;
            }
            Py_ssize_t a;
            int32_t chunk;
            int64_t before;
            if (allocate_event(all, ev, &a, &chunk, &before) < 0) goto done;
            owned[k] = ((long long)a << 32) | (uint32_t)chunk; /* the old chunk stays */
            if (a != hosted) step += all->items[a].in_use - before;
        } else if (len == 1) {
            if (timeline) {
                PyObject *v = PyLong_FromLongLong(step - start);
                if (!v || PyList_Append(timeline, v) < 0) {
                    Py_XDECREF(v);
                    goto done;
                }
                Py_DECREF(v);
            }
        } else {
            PyObject *found = NULL;
            if (dict_pop(handles, PyTuple_GET_ITEM(ev, 0), &found) < 0) goto done;
            if (!found) continue;
            long long v = PyLong_AsLongLong(found);
            Py_DECREF(found);
            if (v == -1 && PyErr_Occurred()) goto done;
            if (len == 3) { /* the variable takes the buffer; its old chunk is freed */
                Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(ev, 1));
                if (k == -1 && PyErr_Occurred()) goto done;
                if (k < 0 || k >= np) {
                    PyErr_SetString(PyExc_IndexError, "replay_step: no such variable");
                    goto done;
                }
                long long old = owned[k];
                owned[k] = v;
                v = old;
            }
            Py_ssize_t a = (Py_ssize_t)(v >> 32);
            BFC *alloc = &all->items[a];
            int64_t before = alloc->in_use;
            if (bfc_free(alloc, (int32_t)(v & 0xffffffffLL)) < 0) goto done;
            if (a != hosted) step += alloc->in_use - before;
        }
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(handles, &pos, &key, &value)) {
        if (free_handle(all, value) < 0) goto done;
    }
    rc = 0;
done:
    Py_DECREF(handles);
    return rc;
}

/* bfc.replay_step: the first step (grows the regions), then the measured one */
static PyObject *replay_step(PyObject *self, PyObject *args) {
    PyObject *events, *persistent, *host;
    int keep_timeline;
    if (!PyArg_ParseTuple(args, "O!O!Op", &PyList_Type, &events, &PyList_Type, &persistent,
                          &host, &keep_timeline))
        return NULL;
    Allocators all = {NULL, NULL, 0, 0};
    PyObject *timeline = NULL, *peak_dev = NULL, *result = NULL;
    int64_t *base = NULL, peak, peak_pos;
    Py_ssize_t hosted;
    if (step_allocators(&all, events, persistent, host, NULL, &hosted) < 0) goto done;
    if (run_step(&all, events, hosted, NULL, 0, NULL, &peak, &peak_pos, 0) < 0) goto done;
    base = PyMem_Calloc((size_t)all.len + 1, sizeof(int64_t));
    if (!base) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t a = 0; a < all.len; a++) base[a] = all.items[a].peak = all.items[a].in_use;
    if (keep_timeline && !(timeline = PyList_New(0))) goto done;
    if (run_step(&all, events, hosted, NULL, 0, timeline, &peak, &peak_pos, 0) < 0) goto done;
    peak_dev = PyDict_New();
    if (!peak_dev) goto done;
    PyObject *dev, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(all.index, &pos, &dev, &value)) {
        Py_ssize_t a = PyLong_AsSsize_t(value);
        if (all.items[a].peak > base[a]) {
            PyObject *v = PyLong_FromLongLong(all.items[a].peak - base[a]);
            if (!v || PyDict_SetItem(peak_dev, dev, v) < 0) {
                Py_XDECREF(v);
                goto done;
            }
            Py_DECREF(v);
        }
    }
    int64_t host_peak = hosted >= 0 ? all.items[hosted].peak - base[hosted] : 0;
    result = Py_BuildValue("LLOLO", (long long)peak, (long long)peak_pos, peak_dev,
                           (long long)host_peak, timeline ? timeline : Py_None);
done:
    Py_XDECREF(timeline);
    Py_XDECREF(peak_dev);
    clear_allocators(&all);
    PyMem_Free(base);
    return result;
}

/* bfc._highest_moving_step: the first step (making the variables' copies), then `steps`
 * measured ones, variables taking over buffers as the adopt events say; returns the
 * highest measured step's peak */
static PyObject *replay_moving(PyObject *self, PyObject *args) {
    PyObject *events, *persistent, *host;
    Py_ssize_t steps;
    if (!PyArg_ParseTuple(args, "O!O!On", &PyList_Type, &events, &PyList_Type, &persistent,
                          &host, &steps))
        return NULL;
    Allocators all = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t np = PyList_GET_SIZE(persistent), hosted;
    long long *owned = PyMem_Calloc((size_t)np + 1, sizeof(long long));
    if (!owned) return PyErr_NoMemory();
    if (step_allocators(&all, events, persistent, host, owned, &hosted) < 0) goto done;
    int64_t highest = 0, peak, peak_pos;
    for (Py_ssize_t s = 0; s <= steps; s++) {
        if (run_step(&all, events, hosted, owned, np, NULL, &peak, &peak_pos, s == 0) < 0)
            goto done;
        if (s > 0 && peak > highest) highest = peak;
    }
    result = PyLong_FromLongLong(highest);
done:
    clear_allocators(&all);
    PyMem_Free(owned);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Kahn's topological sort (graphmem/graph/index.py, GraphIndex._kahn)                  */
/* ------------------------------------------------------------------------------------ */

static int node_id(PyObject *item, Py_ssize_t n, Py_ssize_t *out) {
    Py_ssize_t v = PyLong_AsSsize_t(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= n) {
        PyErr_SetString(PyExc_IndexError, "kahn: an edge names a node out of range");
        return -1;
    }
    *out = v;
    return 0;
}

/* The source of data input t, a (node id, output index) tuple. */
static int tensor_source(PyObject *t, Py_ssize_t n, Py_ssize_t *out) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
        PyErr_SetString(PyExc_TypeError, "kahn: data inputs are (node, output) tuples");
        return -1;
    }
    return node_id(PyTuple_GET_ITEM(t, 0), n, out);
}

static PyObject *int_list(const Py_ssize_t *values, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(values[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* kahn(data_inputs, control_inputs) -> (order, indeg): the ready ops first in, first out;
 * each op's successors in the order of the ops reading it (data inputs, then control) */
static PyObject *kahn(PyObject *self, PyObject *args) {
    PyObject *data, *ctrl;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &data, &PyList_Type, &ctrl)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(data);
    if (PyList_GET_SIZE(ctrl) != n) {
        PyErr_SetString(PyExc_ValueError, "kahn: one control list per node");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t *start = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    Py_ssize_t *indeg = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    Py_ssize_t *order = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    Py_ssize_t *succ = NULL, *fill = NULL;
    if (!start || !indeg || !order) {
        PyErr_NoMemory();
        goto done;
    }
    /* successor counts, then their lists in node order */
    Py_ssize_t edges = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(data, i), *c = PyList_GET_ITEM(ctrl, i);
        if (!PyList_Check(d) || !PyList_Check(c)) {
            PyErr_SetString(PyExc_TypeError, "kahn: inputs are lists");
            goto done;
        }
        Py_ssize_t s;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(d); k++) {
            if (tensor_source(PyList_GET_ITEM(d, k), n, &s) < 0) goto done;
            start[s + 1]++;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(c); k++) {
            if (node_id(PyList_GET_ITEM(c, k), n, &s) < 0) goto done;
            start[s + 1]++;
        }
        indeg[i] = PyList_GET_SIZE(d) + PyList_GET_SIZE(c);
        edges += indeg[i];
    }
    for (Py_ssize_t i = 0; i < n; i++) start[i + 1] += start[i];
    succ = PyMem_Malloc(((size_t)edges + 1) * sizeof(Py_ssize_t));
    fill = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    if (!succ || !fill) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(fill, start, (size_t)n * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(data, i), *c = PyList_GET_ITEM(ctrl, i);
        Py_ssize_t s;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(d); k++) {
            tensor_source(PyList_GET_ITEM(d, k), n, &s);
            succ[fill[s]++] = i;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(c); k++) {
            node_id(PyList_GET_ITEM(c, k), n, &s);
            succ[fill[s]++] = i;
        }
    }
    Py_ssize_t head = 0, tail = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!indeg[i]) order[tail++] = i;
    while (head < tail) {
        Py_ssize_t i = order[head++];
        for (Py_ssize_t e = start[i]; e < start[i + 1]; e++) {
            Py_ssize_t j = succ[e];
            if (!--indeg[j]) order[tail++] = j;
        }
    }
    PyObject *order_list = int_list(order, tail), *indeg_list = int_list(indeg, n);
    if (order_list && indeg_list) result = PyTuple_Pack(2, order_list, indeg_list);
    Py_XDECREF(order_list);
    Py_XDECREF(indeg_list);
done:
    PyMem_Free(start);
    PyMem_Free(indeg);
    PyMem_Free(order);
    PyMem_Free(succ);
    PyMem_Free(fill);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Nodes and edges of a serialized GraphDef (graphmem/graph/index.py, GraphIndex.build)  */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    const char *p;
    Py_ssize_t n;
} Slice;

typedef struct {
    long long k;
    PyObject *tuple, *readers; /* (node, k) and its consumers' list */
    Py_ssize_t next;           /* the node's next tensor read so far; -1: none */
} TensorEntry;

typedef struct {
    Slice node, name, op, device; /* the NodeDef's bytes, and fields of it */
    Py_ssize_t first_input, inputs; /* into the array of input slices */
} NodeSlices;

static int read_varint(const unsigned char **p, const unsigned char *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end) return -1;
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* One field: its number, wire type, and for a length-delimited field its bytes; other
 * fields are skipped. -1 on malformed data. */
static int read_field(const unsigned char **p, const unsigned char *end, uint64_t *number,
                      Slice *bytes) {
    uint64_t key, len;
    if (read_varint(p, end, &key) < 0) return -1;
    *number = key >> 3;
    bytes->p = NULL;
    bytes->n = 0;
    switch (key & 7) {
    case 0:
        return read_varint(p, end, &len);
    case 1:
        if (end - *p < 8) return -1;
        *p += 8;
        return 0;
    case 2:
        if (read_varint(p, end, &len) < 0 || len > (uint64_t)(end - *p)) return -1;
        bytes->p = (const char *)*p;
        bytes->n = (Py_ssize_t)len;
        *p += len;
        return 2;
    case 5:
        if (end - *p < 4) return -1;
        *p += 4;
        return 0;
    default: /* groups: not in a GraphDef */
        return -1;
    }
}

/* The next length-delimited field of a message (strings, sub-messages): 1 with its number
 * and bytes, 0 at the message's end, -1 on malformed data. */
static int next_bytes_field(const unsigned char **p, const unsigned char *end, uint64_t *number,
                            Slice *bytes) {
    while (*p < end) {
        int wire = read_field(p, end, number, bytes);
        if (wire < 0) return -1;
        if (wire == 2) return 1;
    }
    return 0;
}

/* The next NodeDef of a serialized GraphDef (its field 1): 1, 0 at the end, -1 malformed. */
static int next_node(const unsigned char **p, const unsigned char *end, Slice *node) {
    uint64_t number;
    int r;
    while ((r = next_bytes_field(p, end, &number, node)) > 0)
        if (number == 1) return 1;
    return r;
}

static uint64_t slice_hash(Slice s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < s.n; i++) h = (h ^ (unsigned char)s.p[i]) * 1099511628211ULL;
    h ^= h >> 33; /* the low bits, which pick the slot, from all of them (murmur3's mix) */
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* A set of distinct values, each named by the first node that has it (its representative):
 * open addressing, linear probing, grown at half full. A slot holds the value's distinct
 * id + 1 (0: empty) in its low 32 bits and the top half of its hash in the high ones, so
 * that a probe that cannot match reads no value: on a 1M-node graph each such read is a
 * cache miss. Node names (read_graph), op signatures and `_output_shapes` values
 * (read_attrs) are kept in one each. */
typedef struct {
    uint64_t *slots, mask;
    uint64_t *hashes;    /* per distinct value */
    Py_ssize_t *reps;    /* per distinct value: its first node */
    Py_ssize_t count, hashes_cap, reps_cap;
} Distinct;

/* whether the value of node `rep` is `key` (what `key` points to is the caller's) */
typedef int (*SameValue)(const void *ctx, Py_ssize_t rep, const void *key);

static void distinct_clear(Distinct *d) {
    PyMem_Free(d->slots);
    PyMem_Free(d->hashes);
    PyMem_Free(d->reps);
}

static int distinct_resize(Distinct *d, uint64_t size) {
    uint64_t *slots = PyMem_Calloc(size, sizeof(uint64_t));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < d->count; k++) {
        uint64_t at = d->hashes[k] & (size - 1);
        while (slots[at]) at = (at + 1) & (size - 1);
        slots[at] = (d->hashes[k] >> 32) << 32 | (uint64_t)(k + 1);
    }
    PyMem_Free(d->slots);
    d->slots = slots;
    d->mask = size - 1;
    return 0;
}

/* room for n values without growing */
static int distinct_reserve(Distinct *d, Py_ssize_t n) {
    uint64_t size = 64;
    while (size < 2 * (uint64_t)n + 2) size *= 2;
    return size > d->mask + 1 || !d->slots ? distinct_resize(d, size) : 0;
}

/* the distinct id of `key` (hash h), or -1; *empty: the slot it would take */
static Py_ssize_t distinct_find(const Distinct *d, uint64_t h, SameValue same,
                                const void *ctx, const void *key, uint64_t *empty) {
    uint64_t tag = h >> 32, at = h & d->mask;
    for (;; at = (at + 1) & d->mask) {
        uint64_t v = d->slots[at];
        if (!v) break;
        Py_ssize_t k = (Py_ssize_t)(v & 0xffffffffu) - 1;
        if (v >> 32 == tag && d->hashes[k] == h && same(ctx, d->reps[k], key)) return k;
    }
    if (empty) *empty = at;
    return -1;
}

/* the distinct id of node i's value `key` (hash h): a new one when no earlier node had it */
static Py_ssize_t distinct_id(Distinct *d, uint64_t h, Py_ssize_t i, SameValue same,
                              const void *ctx, const void *key) {
    if (!d->slots && distinct_resize(d, 64) < 0) return -1;
    uint64_t at;
    Py_ssize_t k = distinct_find(d, h, same, ctx, key, &at);
    if (k >= 0) return k;
    if (grow((void **)&d->hashes, &d->hashes_cap, d->count + 1, sizeof(uint64_t)) < 0 ||
        grow((void **)&d->reps, &d->reps_cap, d->count + 1, sizeof(Py_ssize_t)) < 0)
        return -1;
    k = d->count++;
    d->hashes[k] = h;
    d->reps[k] = i;
    d->slots[at] = (h >> 32) << 32 | (uint64_t)(k + 1);
    if ((uint64_t)d->count * 2 > d->mask + 1 && distinct_resize(d, 2 * (d->mask + 1)) < 0)
        return -1;
    return k;
}

/* node rep's value is the slice `key` (ctx: the values by node id: names, shapes) */
static int same_slice(const void *ctx, Py_ssize_t rep, const void *key) {
    Slice a = ((const Slice *)ctx)[rep], b = *(const Slice *)key;
    return a.n == b.n && !memcmp(a.p, b.p, (size_t)a.n);
}

static PyObject *decode(Slice s) { return PyUnicode_DecodeUTF8(s.p, s.n, "strict"); }

/* Strings many nodes share (op types, devices): a few dozen distinct values, each decoded
 * once and handed out again to every node whose bytes match. */
typedef struct {
    Slice *bytes;
    PyObject **strings;
    Py_ssize_t len, cap, strings_cap;
} SharedStrings;

static PyObject *shared_string(SharedStrings *seen, Slice s) {
    for (Py_ssize_t k = seen->len - 1; k >= 0; k--) { /* the latest first */
        Slice b = seen->bytes[k];
        if (b.n == s.n && !memcmp(b.p, s.p, (size_t)s.n)) {
            Py_INCREF(seen->strings[k]);
            return seen->strings[k];
        }
    }
    PyObject *str = decode(s);
    if (!str) return NULL;
    if (seen->len >= 64) return str; /* many distinct values: each node its own */
    if (grow((void **)&seen->bytes, &seen->cap, seen->len + 1, sizeof(Slice)) < 0 ||
        grow((void **)&seen->strings, &seen->strings_cap, seen->len + 1, sizeof(PyObject *)) < 0) {
        Py_DECREF(str);
        return NULL;
    }
    seen->bytes[seen->len] = s;
    seen->strings[seen->len++] = str;
    Py_INCREF(str);
    return str;
}

static void shared_strings_clear(SharedStrings *seen) {
    for (Py_ssize_t k = 0; k < seen->len; k++) Py_DECREF(seen->strings[k]);
    PyMem_Free(seen->bytes);
    PyMem_Free(seen->strings);
}

/* The source of an input string: its node and output index, -1 for a control input. */
static Py_ssize_t node_named(const Distinct *names, const Slice *name_of, Slice name) {
    Py_ssize_t k = distinct_find(names, slice_hash(name), same_slice, name_of, &name, NULL);
    return k < 0 ? -1 : names->reps[k];
}

#define INDEX_LIMIT 1000000000000000000LL

static Py_ssize_t resolve_input(const Distinct *t, const Slice *name_of, Slice in,
                                long long *k) {
    Py_ssize_t src = node_named(t, name_of, in); /* the common case: output 0, written bare */
    *k = 0;
    if (src >= 0) return src;
    if (in.n && in.p[0] == '^') {
        *k = -1;
        Slice name = {in.p + 1, in.n - 1};
        return node_named(t, name_of, name);
    }
    Py_ssize_t colon = in.n - 1;
    while (colon >= 0 && in.p[colon] != ':') colon--;
    if (colon < 0 || colon == in.n - 1) return -1;
    /* ASCII digits, leading zeros allowed, saturated at INDEX_LIMIT (graph/names.py's
     * output_index: both readers give every input string the same index) */
    long long v = 0;
    Py_ssize_t significant = 0;
    for (Py_ssize_t i = colon + 1; i < in.n; i++) {
        if (in.p[i] < '0' || in.p[i] > '9') return -1;
        if (v || in.p[i] != '0') significant++;
        if (significant <= 18) v = v * 10 + (in.p[i] - '0');
    }
    *k = significant > 18 ? INDEX_LIMIT : v;
    Slice name = {in.p, colon};
    return node_named(t, name_of, name);
}

static const char *MALFORMED = "not a serialized GraphDef";

/* The nodes of a serialized GraphDef, and with `inputs` their input strings, into growing
 * arrays; -1 with an exception set on malformed bytes or no memory. */
static int scan_nodes(const unsigned char *p, const unsigned char *end, NodeSlices **nodes,
                      Py_ssize_t *n, Slice **inputs, Py_ssize_t *n_inputs) {
    Py_ssize_t nodes_cap = 0, inputs_cap = 0;
    Slice node;
    int more;
    while ((more = next_node(&p, end, &node)) > 0) {
        if (grow((void **)nodes, &nodes_cap, *n + 1, sizeof(NodeSlices)) < 0) return -1;
        NodeSlices *ns = &(*nodes)[(*n)++];
        memset(ns, 0, sizeof(*ns));
        ns->node = node;
        ns->first_input = inputs ? *n_inputs : 0;
        const unsigned char *q = (const unsigned char *)node.p, *qend = q + node.n;
        uint64_t number;
        Slice value;
        int field;
        while ((field = next_bytes_field(&q, qend, &number, &value)) > 0) {
            if (number == 1) ns->name = value;
            else if (number == 2) ns->op = value;
            else if (number == 4) ns->device = value;
            else if (number == 3 && inputs) {
                if (grow((void **)inputs, &inputs_cap, *n_inputs + 1, sizeof(Slice)) < 0)
                    return -1;
                (*inputs)[(*n_inputs)++] = value;
                ns->inputs++;
            }
        }
        if (field < 0) more = -1;
        if (more < 0) break;
    }
    if (more < 0) {
        PyErr_SetString(PyExc_ValueError, MALFORMED);
        return -1;
    }
    return 0;
}

/* read_graph(serialized GraphDef, start=0) -> (names, ops, devices, id_of of the nodes from
 * start on, and of every node data_inputs, control_inputs, consumers, control_consumers,
 * max_out), or ("duplicate", name) or ("missing", node id,
 * input) for a graph GraphIndex.build rejects; ValueError for bytes that are no GraphDef. */
static PyObject *read_graph(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start = 0;
    if (!PyArg_ParseTuple(args, "y*|n", &buf, &start)) return NULL;
    const unsigned char *p = buf.buf, *end = p + buf.len;
    NodeSlices *nodes = NULL;
    Slice *inputs = NULL;
    Py_ssize_t n = 0, n_inputs = 0;
    Distinct table;
    memset(&table, 0, sizeof(table));
    Slice *name_slices = NULL;
    Py_ssize_t *tensor_head = NULL, n_tensors = 0, tensors_cap = 0;
    TensorEntry *tensors = NULL;
    PyObject **ids = NULL;
    Py_ssize_t *max_out = NULL;
    PyObject *names = NULL, *ops = NULL, *devices = NULL, *id_of = NULL, *data_inputs = NULL,
             *control_inputs = NULL, *consumers = NULL, *control_consumers = NULL,
             *result = NULL;
    SharedStrings seen = {NULL, NULL, 0, 0, 0};
    if (scan_nodes(p, end, &nodes, &n, &inputs, &n_inputs) < 0) goto done;
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "read_graph: too many nodes");
        goto done;
    }
    if (distinct_reserve(&table, n) < 0) goto done;
    name_slices = PyMem_Malloc(((size_t)n + 1) * sizeof(Slice));
    if (name_slices)
        for (Py_ssize_t i = 0; i < n; i++) name_slices[i] = nodes[i].name;
    ids = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    max_out = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    tensor_head = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    if (tensor_head)
        for (Py_ssize_t i = 0; i < n; i++) tensor_head[i] = -1;
    if (!name_slices || !ids || !max_out || !tensor_head) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t before = table.count;
        if (distinct_id(&table, slice_hash(name_slices[i]), i, same_slice, name_slices,
                        &name_slices[i]) < 0)
            goto done;
        if (table.count == before) { /* an earlier node has this name */
            PyObject *name = decode(nodes[i].name);
            if (name) result = Py_BuildValue("(sN)", "duplicate", name);
            goto done;
        }
        if (!(ids[i] = PyLong_FromSsize_t(i))) goto done;
    }
    if (start < 0 || start > n) start = n;
    names = PyList_New(n - start);
    ops = PyList_New(n - start);
    devices = PyList_New(n - start);
    id_of = presized_dict(n - start);
    data_inputs = PyList_New(n);
    control_inputs = PyList_New(n);
    control_consumers = PyList_New(n);
    consumers = presized_dict(n_inputs);
    if (!names || !ops || !devices || !id_of || !data_inputs || !control_inputs ||
        !control_consumers || !consumers)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v, *c;
        if (!(c = PyList_New(0))) goto done;
        PyList_SET_ITEM(control_consumers, i, c);
        if (i < start) continue; /* the caller has these */
        if (!(v = decode(nodes[i].name))) goto done;
        PyList_SET_ITEM(names, i - start, v);
        if (PyDict_SetItem(id_of, v, ids[i]) < 0) goto done;
        if (!(v = shared_string(&seen, nodes[i].op))) goto done;
        PyList_SET_ITEM(ops, i - start, v);
        if (!(v = shared_string(&seen, nodes[i].device))) goto done;
        PyList_SET_ITEM(devices, i - start, v);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *data = PyList_New(0), *ctrl = PyList_New(0);
        if (!data || !ctrl) {
            Py_XDECREF(data);
            Py_XDECREF(ctrl);
            goto done;
        }
        PyList_SET_ITEM(data_inputs, i, data);
        PyList_SET_ITEM(control_inputs, i, ctrl);
        for (Py_ssize_t e = 0; e < nodes[i].inputs; e++) {
            Slice in = inputs[nodes[i].first_input + e];
            long long k;
            Py_ssize_t src = resolve_input(&table, name_slices, in, &k);
            if (src < 0) {
                PyObject *text = decode(in);
                if (text) result = Py_BuildValue("(snN)", "missing", i, text);
                goto done;
            }
            if (k < 0) {
                if (PyList_Append(ctrl, ids[src]) < 0 ||
                    PyList_Append(PyList_GET_ITEM(control_consumers, src), ids[i]) < 0)
                    goto done;
                continue;
            }
            /* the tensor's tuple and reader list, made at its first reader (when the
             * dictionary gets it, as in Python); later readers find them by their node */
            Py_ssize_t e = tensor_head[src];
            while (e >= 0 && tensors[e].k != k) e = tensors[e].next;
            if (e < 0) {
                if (grow((void **)&tensors, &tensors_cap, n_tensors + 1, sizeof(TensorEntry)) < 0)
                    goto done;
                PyObject *kk = PyLong_FromLongLong(k);
                PyObject *t = kk ? PyTuple_Pack(2, ids[src], kk) : NULL;
                Py_XDECREF(kk);
                PyObject *readers = t ? PyList_New(0) : NULL;
                if (!readers || PyDict_SetItem(consumers, t, readers) < 0) {
                    Py_XDECREF(t);
                    Py_XDECREF(readers);
                    goto done;
                }
                Py_DECREF(readers); /* the dictionary holds it */
                e = n_tensors++;
                tensors[e].k = k;
                tensors[e].tuple = t; /* released at the end */
                tensors[e].readers = readers;
                tensors[e].next = tensor_head[src];
                tensor_head[src] = e;
            }
            if (PyList_Append(data, tensors[e].tuple) < 0 ||
                PyList_Append(tensors[e].readers, ids[i]) < 0)
                goto done;
            if (k >= max_out[src]) max_out[src] = (Py_ssize_t)k + 1;
        }
    }
    PyObject *max_list = int_list(max_out, n);
    if (!max_list) goto done;
    result = Py_BuildValue("(OOOOOOOON)", names, ops, devices, id_of, data_inputs,
                           control_inputs, consumers, control_consumers, max_list);
done:
    if (ids)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(ids[i]);
    PyMem_Free(ids);
    PyMem_Free(max_out);
    distinct_clear(&table);
    PyMem_Free(name_slices);
    for (Py_ssize_t e = 0; e < n_tensors; e++) Py_DECREF(tensors[e].tuple);
    PyMem_Free(tensors);
    PyMem_Free(tensor_head);
    PyMem_Free(nodes);
    PyMem_Free(inputs);
    Py_XDECREF(names);
    Py_XDECREF(ops);
    Py_XDECREF(devices);
    Py_XDECREF(id_of);
    Py_XDECREF(data_inputs);
    Py_XDECREF(control_inputs);
    Py_XDECREF(consumers);
    Py_XDECREF(control_consumers);
    shared_strings_clear(&seen);
    PyBuffer_Release(&buf);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* What the attrs of nodes say (graphmem/graph/index.py, _attr_facts)                    */
/* ------------------------------------------------------------------------------------ */

static const char OUTPUT_SHAPES[] = "_output_shapes";

/* The next attr entry of a NodeDef other than `_output_shapes` (-1 malformed, 0 none). */
static int next_attr(const unsigned char **p, const unsigned char *end, Slice *entry,
                     Slice *shapes, int *has_shapes) {
    uint64_t number;
    int r;
    while ((r = next_bytes_field(p, end, &number, entry)) > 0) {
        if (number != 5) continue;
        /* the entry's key and value */
        const unsigned char *q = (const unsigned char *)entry->p, *qend = q + entry->n;
        Slice key = {NULL, 0}, value = {NULL, 0}, field;
        int f;
        while ((f = next_bytes_field(&q, qend, &number, &field)) > 0) {
            if (number == 1) key = field;
            else if (number == 2) value = field;
        }
        if (f < 0) return -1;
        if (key.n == (Py_ssize_t)sizeof(OUTPUT_SHAPES) - 1 &&
            !memcmp(key.p, OUTPUT_SHAPES, sizeof(OUTPUT_SHAPES) - 1)) {
            if (shapes) {
                *shapes = value;
                *has_shapes = 1;
            }
            continue;
        }
        return 1;
    }
    return r;
}

/* nodes a and *key: the same op and the same attrs, `_output_shapes` aside, in order */
static int same_signature(const void *ctx, Py_ssize_t a, const void *key) {
    const NodeSlices *nodes = ctx;
    Py_ssize_t b = *(const Py_ssize_t *)key;
    Slice oa = nodes[a].op, ob = nodes[b].op;
    if (oa.n != ob.n || memcmp(oa.p, ob.p, (size_t)oa.n)) return 0;
    const unsigned char *p = (const unsigned char *)nodes[a].node.p, *pend = p + nodes[a].node.n;
    const unsigned char *q = (const unsigned char *)nodes[b].node.p, *qend = q + nodes[b].node.n;
    for (;;) {
        Slice ea, eb;
        int ra = next_attr(&p, pend, &ea, NULL, NULL), rb = next_attr(&q, qend, &eb, NULL, NULL);
        if (ra != rb || ra < 0) return 0;
        if (!ra) return 1;
        if (ea.n != eb.n || memcmp(ea.p, eb.p, (size_t)ea.n)) return 0;
    }
}

/* An attr entry's key and value, and the value as the OpDef check reads it: a shape's or a
 * tensor's contents are not read (only that it is one), anything else is. */
static int check_view(Slice entry, Slice *key, uint64_t *kind, Slice *kept) {
    const unsigned char *q = (const unsigned char *)entry.p, *qend = q + entry.n;
    Slice value = {NULL, 0}, field;
    uint64_t number;
    int f;
    key->p = NULL;
    key->n = 0;
    while ((f = next_bytes_field(&q, qend, &number, &field)) > 0) {
        if (number == 1) *key = field;
        else if (number == 2) value = field;
    }
    if (f < 0) return -1;
    *kind = 0;
    *kept = value;
    const unsigned char *v = (const unsigned char *)value.p, *vend = v + value.n;
    uint64_t tag;
    if (value.n && read_varint(&v, vend, &tag) == 0 && ((tag >> 3) == 7 || (tag >> 3) == 8)) {
        *kind = tag >> 3; /* AttrValue.shape, AttrValue.tensor */
        kept->n = 0;
    }
    return 0;
}

/* The next attr the check reads (not `_output_shapes` nor any other internal `_` attr),
 * as check_view sees it (-1 malformed, 0 none). */
static int next_checked_attr(const unsigned char **p, const unsigned char *end, Slice *key,
                             uint64_t *kind, Slice *kept) {
    Slice entry;
    int r;
    while ((r = next_attr(p, end, &entry, NULL, NULL)) > 0) {
        if (check_view(entry, key, kind, kept) < 0) return -1;
        if (!(key->n && key->p[0] == '_')) return 1;
    }
    return r;
}

/* nodes a and *key: the same op and the same attrs as check_view sees them, in order */
static int same_check_signature(const void *ctx, Py_ssize_t a, const void *key) {
    const NodeSlices *nodes = ctx;
    Py_ssize_t b = *(const Py_ssize_t *)key;
    Slice oa = nodes[a].op, ob = nodes[b].op;
    if (oa.n != ob.n || memcmp(oa.p, ob.p, (size_t)oa.n)) return 0;
    const unsigned char *p = (const unsigned char *)nodes[a].node.p, *pend = p + nodes[a].node.n;
    const unsigned char *q = (const unsigned char *)nodes[b].node.p, *qend = q + nodes[b].node.n;
    for (;;) {
        Slice ka, kb, va, vb;
        uint64_t ta, tb;
        int ra = next_checked_attr(&p, pend, &ka, &ta, &va);
        int rb = next_checked_attr(&q, qend, &kb, &tb, &vb);
        if (ra != rb || ra < 0) return 0;
        if (!ra) return 1;
        if (ta != tb || ka.n != kb.n || va.n != vb.n || memcmp(ka.p, kb.p, (size_t)ka.n) ||
            memcmp(va.p, vb.p, (size_t)va.n))
            return 0;
    }
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

/* read_attrs(serialized GraphDef, start) -> (signature of each node from start on,
 * representative node of each signature, `_output_shapes` value of each node (-1: none),
 * the distinct values as bytes, the check signature of each node from start on, the
 * representative node of each). A signature is the op and every attr but
 * `_output_shapes`: what a node's output dtypes and statefulness can depend on. A check
 * signature leaves out the contents of shape and tensor attrs too: what the OpDef check
 * (graph/opdef_check.py) reads, grouping a graph's constants by dtype. */
static PyObject *read_attrs(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start)) return NULL;
    const unsigned char *p = buf.buf, *end = p + buf.len;
    NodeSlices *nodes = NULL;
    Slice *shapes_of = NULL; /* per node: its `_output_shapes` value */
    Py_ssize_t n = 0, *sig_of = NULL, *shape_of = NULL, *check_of = NULL;
    Distinct sigs, shapes, checks;
    memset(&sigs, 0, sizeof(sigs));
    memset(&shapes, 0, sizeof(shapes));
    memset(&checks, 0, sizeof(checks));
    PyObject *result = NULL, *values = NULL;
    if (scan_nodes(p, end, &nodes, &n, NULL, NULL) < 0) goto done;
    if (start < 0 || start > n) start = n;
    sig_of = PyMem_Malloc(((size_t)(n - start) + 1) * sizeof(Py_ssize_t));
    shape_of = PyMem_Malloc(((size_t)(n - start) + 1) * sizeof(Py_ssize_t));
    shapes_of = PyMem_Calloc((size_t)n + 1, sizeof(Slice));
    check_of = PyMem_Malloc(((size_t)(n - start) + 1) * sizeof(Py_ssize_t));
    if (!sig_of || !shape_of || !shapes_of || !check_of) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = start; i < n; i++) {
        uint64_t h = slice_hash(nodes[i].op), hc = h;
        const unsigned char *q = (const unsigned char *)nodes[i].node.p;
        const unsigned char *qend = q + nodes[i].node.n;
        Slice entry, key, kept;
        uint64_t kind;
        int r, has_shapes = 0;
        while ((r = next_attr(&q, qend, &entry, &shapes_of[i], &has_shapes)) > 0) {
            h = mix(h, slice_hash(entry));
            if (check_view(entry, &key, &kind, &kept) < 0) {
                r = -1;
                break;
            }
            if (key.n && key.p[0] == '_') continue; /* internal attrs: the check skips them */
            hc = mix(mix(mix(hc, slice_hash(key)), kind), slice_hash(kept));
        }
        if (r < 0) {
            PyErr_SetString(PyExc_ValueError, MALFORMED);
            goto done;
        }
        if ((sig_of[i - start] = distinct_id(&sigs, h, i, same_signature, nodes, &i)) < 0)
            goto done;
        if ((check_of[i - start] = distinct_id(&checks, hc, i, same_check_signature, nodes,
                                               &i)) < 0)
            goto done;
        shape_of[i - start] = -1;
        if (has_shapes &&
            (shape_of[i - start] = distinct_id(&shapes, slice_hash(shapes_of[i]), i, same_slice,
                                               shapes_of, &shapes_of[i])) < 0)
            goto done;
    }
    if (!(values = PyList_New(shapes.count))) goto done;
    for (Py_ssize_t k = 0; k < shapes.count; k++) {
        Slice v = shapes_of[shapes.reps[k]];
        PyObject *b = PyBytes_FromStringAndSize(v.p, v.n);
        if (!b) goto done;
        PyList_SET_ITEM(values, k, b);
    }
    result = Py_BuildValue("(NNNONN)", int_list(sig_of, n - start), int_list(sigs.reps, sigs.count),
                           int_list(shape_of, n - start), values,
                           int_list(check_of, n - start), int_list(checks.reps, checks.count));
done:
    PyMem_Free(nodes);
    PyMem_Free(shapes_of);
    PyMem_Free(sig_of);
    PyMem_Free(shape_of);
    PyMem_Free(check_of);
    distinct_clear(&sigs);
    distinct_clear(&shapes);
    distinct_clear(&checks);
    Py_XDECREF(values);
    PyBuffer_Release(&buf);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* The executor's order (graphmem/analysis/schedule.py, _StepGraph.walk without loops)   */
/* ------------------------------------------------------------------------------------ */

/* A double-ended queue of node ids; every op enters the walk's queues once. */
typedef struct {
    Py_ssize_t *items, cap, head, len;
} Deque;

static inline void dq_push(Deque *q, Py_ssize_t v) { q->items[(q->head + q->len++) % q->cap] = v; }
static inline Py_ssize_t dq_popleft(Deque *q) {
    Py_ssize_t v = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->len--;
    return v;
}
static inline Py_ssize_t dq_pop(Deque *q) { return q->items[(q->head + --q->len) % q->cap]; }

static int cmp_ids(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* ready ops held as id + n when readied through a control edge: data ones first, in id
 * order, then the control ones in descending id order (executor_walk's `reverse`); n set
 * by the walk */
static Py_ssize_t walk_n;
static int cmp_ids_reversed(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    int cx = x >= walk_n, cy = y >= walk_n;
    if (cx != cy) return cx - cy;
    if (!cx) return (x > y) - (x < y);
    return (x < y) - (x > y);
}

/* executor_walk(succ, indeg, cheap, transparent, sources, function_body, fifo, forwards,
 * reverse=False) -> order */
static PyObject *executor_walk(PyObject *self, PyObject *args) {
    PyObject *succ_lists, *indeg_list, *sources, *forwards_list;
    Py_buffer cheap, transparent;
    int function_body, fifo, reverse = 0;
    if (!PyArg_ParseTuple(args, "O!O!y*y*O!ppO!|p", &PyList_Type, &succ_lists, &PyList_Type,
                          &indeg_list, &cheap, &transparent, &PyList_Type, &sources,
                          &function_body, &fifo, &PyList_Type, &forwards_list, &reverse))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(succ_lists);
    PyObject *result = NULL;
    Py_ssize_t *start = NULL, *succ = NULL, *indeg = NULL, *order = NULL, *ready = NULL,
               *removed = NULL, *forwards = NULL;
    Deque inline_q = {NULL, 0, 0, 0}, tasks = {NULL, 0, 0, 0};
    const char *c = cheap.buf, *t = transparent.buf;
    if (PyList_GET_SIZE(indeg_list) != n || cheap.len < n || transparent.len < n ||
        PyList_GET_SIZE(forwards_list) != n) {
        PyErr_SetString(PyExc_ValueError, "executor_walk: one entry per node");
        goto done;
    }
    start = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    indeg = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    order = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    ready = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    removed = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    forwards = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    inline_q.items = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    tasks.items = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    if (!start || !indeg || !order || !ready || !removed || !forwards || !inline_q.items ||
        !tasks.items) {
        PyErr_NoMemory();
        goto done;
    }
    inline_q.cap = tasks.cap = n + 1;
    Py_ssize_t edges = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = PyList_GET_ITEM(succ_lists, i);
        if (!PyList_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "executor_walk: successors are lists");
            goto done;
        }
        edges += PyList_GET_SIZE(l);
        start[i + 1] = edges;
        indeg[i] = PyLong_AsSsize_t(PyList_GET_ITEM(indeg_list, i));
        if (indeg[i] == -1 && PyErr_Occurred()) goto done;
        forwards[i] = PyLong_AsSsize_t(PyList_GET_ITEM(forwards_list, i));
        if (forwards[i] == -1 && PyErr_Occurred()) goto done;
    }
    succ = PyMem_Malloc(((size_t)edges + 1) * sizeof(Py_ssize_t));
    if (!succ) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = PyList_GET_ITEM(succ_lists, i);
        /* a control edge's successor is its id + n */
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(l); k++)
            if (node_id(PyList_GET_ITEM(l, k), 2 * n, &succ[start[i] + k]) < 0) goto done;
    }
    Py_ssize_t n_sources = PyList_GET_SIZE(sources);
    if (n_sources > n) {
        PyErr_SetString(PyExc_ValueError, "executor_walk: more sources than nodes");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_sources; k++) {
        Py_ssize_t v;
        /* a function body's sources all run inline first, in topological order (the list
         * holds them reversed); a TF1 graph's are dispatched as tasks */
        Py_ssize_t item = function_body ? n_sources - 1 - k : k;
        if (node_id(PyList_GET_ITEM(sources, item), n, &v) < 0) goto done;
        dq_push(function_body ? &inline_q : &tasks, v);
    }
    Py_ssize_t len = 0;
    while (tasks.len || inline_q.len) {
        if (!inline_q.len) dq_push(&inline_q, fifo ? dq_popleft(&tasks) : dq_pop(&tasks));
        Py_ssize_t i = dq_popleft(&inline_q);
        if (len >= n) break; /* an op twice: malformed input, stop */
        order[len++] = i;
        /* the ops i made ready, through ops Grappler removes (they complete at once); one
         * readied through a control edge is held as j + n: data out-edges come first */
        Py_ssize_t n_ready = 0, n_removed = 0, x = i, via = 0;
        for (;;) {
            for (Py_ssize_t e = start[x]; e < start[x + 1]; e++) {
                Py_ssize_t j = succ[e], kind = via;
                if (j >= n) {
                    j -= n;
                    kind = n;
                }
                if (--indeg[j]) continue;
                if (t[j]) {
                    if (len >= n) goto overflow;
                    order[len++] = j;
                    /* a removed Identity of i's output: its readers read i's data */
                    removed[n_removed++] = forwards[j] == i ? j : j + kind;
                } else {
                    ready[n_ready++] = j + kind;
                }
            }
            if (!n_removed) break;
            x = removed[--n_removed];
            via = x >= n ? n : 0;
            if (x >= n) x -= n;
        }
        if (n_ready > 1) {
            walk_n = n;
            qsort(ready, (size_t)n_ready, sizeof(Py_ssize_t),
                  reverse ? cmp_ids_reversed : cmp_ids);
        }
        Py_ssize_t expensive = -1;
        for (Py_ssize_t k = 0; k < n_ready; k++) {
            Py_ssize_t j = ready[k] >= n ? ready[k] - n : ready[k];
            if (c[j]) {
                dq_push(&inline_q, j);
            } else {
                if (expensive >= 0) dq_push(&tasks, expensive);
                expensive = j;
            }
        }
        if (expensive >= 0) {
            if (inline_q.len) dq_push(&tasks, expensive);
            else dq_push(&inline_q, expensive); /* nothing inexpensive first: it runs next */
        }
        if (inline_q.len + tasks.len > n) goto overflow;
    }
    result = int_list(order, len);
    goto done;
overflow:
    PyErr_SetString(PyExc_ValueError, "executor_walk: an op became ready twice");
done:
    PyBuffer_Release(&cheap);
    PyBuffer_Release(&transparent);
    PyMem_Free(start);
    PyMem_Free(succ);
    PyMem_Free(indeg);
    PyMem_Free(order);
    PyMem_Free(ready);
    PyMem_Free(removed);
    PyMem_Free(forwards);
    PyMem_Free(inline_q.items);
    PyMem_Free(tasks.items);
    return result;
}

/* ------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"replay_step", replay_step, METH_VARARGS,
     "replay_step(events, persistent, host, keep_timeline) -> (peak, peak_pos, peak_dev, "
     "host_peak, timeline): bfc.replay_step, compiled."},
    {"replay_moving", replay_moving, METH_VARARGS,
     "replay_moving(events, persistent, host, steps) -> highest peak: "
     "bfc._highest_moving_step, compiled."},
    {"kahn", kahn, METH_VARARGS,
     "kahn(data_inputs, control_inputs) -> (order, indeg): GraphIndex._kahn, compiled."},
    {"read_graph", read_graph, METH_VARARGS,
     "read_graph(serialized GraphDef, start=0) -> (names, ops, devices, id_of (nodes from "
     "start on), data_inputs, control_inputs, consumers, control_consumers, max_out): "
     "GraphIndex.build's reading of nodes, compiled."},
    {"executor_walk", executor_walk, METH_VARARGS,
     "executor_walk(succ, indeg, cheap, transparent, sources, function_body, fifo, forwards) "
     "-> order: "
     "schedule._StepGraph.walk of a graph without v1 loops, compiled."},
    {"read_attrs", read_attrs, METH_VARARGS,
     "read_attrs(serialized GraphDef, start) -> (signature ids, their representative nodes, "
     "`_output_shapes` ids, their values): what _attr_facts reads, grouped, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "graphmem._native",
                                    "Compiled hot loops of graphmem (see graphmem/native.py).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
