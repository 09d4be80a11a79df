/*
 * _scan: read a piece of a Kineto `traceEvents` array straight into columns.
 *
 * The pure-Python path (load/columns.py) decodes events into msgspec Structs and then reads their
 * attributes column by column; most of its time goes into creating, reading and freeing
 * those millions of small objects. This scanner walks the JSON bytes once and appends the
 * fields the analyses use to typed columns, which Polars takes over through the Arrow C data
 * interface (no copy, no per-event Python object).
 *
 * It is an accelerator, not a second decoder with its own rules: it accepts exactly the
 * events the phase-tagged msgspec decoder accepts in the shapes it supports, and for
 * anything else (invalid JSON, a field of an unexpected type, a string pid on a kept event,
 * an unknown phase, ...) scan() returns None and load/pieces.py decodes the piece with msgspec
 * as before, errors and all. Fields it does not extract are still checked the way msgspec
 * checks them (the `Args` fields' types, UTF-8 and surrogates in strings), so a piece it
 * accepts is one msgspec accepts too.
 *
 * Rows are kept for device, runtime and CPU events (by category) and for metadata (M)
 * events; everything else is skipped. The collective fields of the events that have them
 * (record_param_comms, NCCL kernels) go to a second, small table. Metadata rows, and the
 * rare event whose collective fields are of a type that table does not hold, are decoded
 * again by msgspec from their byte span (span_start, span_end).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ Arrow C data interface */

#define ARROW_FLAG_NULLABLE 2

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static void release_schema(struct ArrowSchema *schema) { schema->release = NULL; }

static void release_array(struct ArrowArray *array) {
    if (array->buffers != NULL) {
        free((void *)array->buffers[0]);
        free((void *)array->buffers[1]);
        free(array->buffers);
    }
    array->release = NULL;
}

static void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (schema != NULL) {
        if (schema->release != NULL) schema->release(schema);
        free(schema);
    }
}

static void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array != NULL) {
        if (array->release != NULL) array->release(array);
        free(array);
    }
}

/* ------------------------------------------------------------------------- columns */

/* A column: its name, Arrow format (C uint8, I uint32, l int64, g float64) and width. */
typedef struct {
    const char *name, *format;
    int width;
} Col;

/* The events' table: a row per kept event. `_detail` is the event's row in the details
 * table (null: its args hold none of the collective fields); `launch_ts_us`,
 * `launch_tid` and `launch_dur_us`, a device event's launch: the time, thread and duration
 * of the first runtime call with its correlation, where scan() linked them (see
 * link_launches). */
enum {
    COL_CODE, COL_PH, COL_NAME, COL_PID, COL_TID, COL_TS, COL_DUR, COL_EXT, COL_EXT_OLD,
    COL_CORR, COL_STREAM, COL_DEVICE, COL_START, COL_END, COL_DETAIL, COL_LAUNCH_TS,
    COL_LAUNCH_TID, COL_LAUNCH_DUR, N_COLS
};
static const Col COLS[N_COLS] = {
    {"code", "C", 1},        {"ph", "C", 1},          {"name", "I", 4},
    {"pid", "l", 8},         {"tid", "l", 8},         {"ts_us", "g", 8},
    {"dur_us", "g", 8},      {"external_id", "l", 8}, {"external_id_old", "l", 8},
    {"correlation", "l", 8}, {"stream", "l", 8},      {"device", "l", 8},
    {"span_start", "l", 8},  {"span_end", "l", 8},    {"_detail", "I", 4},
    {"launch_ts_us", "g", 8}, {"launch_tid", "l", 8}, {"launch_dur_us", "g", 8},
};

/* The details table: a row per kept event whose args name a collective field, with the
 * decoder's `Args` fields that the collectives table reads (text as ids of `names`). `raw`
 * marks a row with a value of a type the columns do not hold (a list of ranks, a string
 * Seq, an integer group name, an integer beyond int64): load/scan.py decodes that event with
 * msgspec and takes its fields from there (only the collective name, text or null in
 * every event the scanner takes, is still read from this row). */
enum {
    D_COLL, D_IN, D_OUT, D_GSIZE, D_DTYPE, D_PGNAME, D_PGDESC, D_PGRANKS, D_SEQ, D_SRC, D_DST,
    D_WSTREAM, D_WCORR, D_RAW, N_DCOLS
};
static const Col DCOLS[N_DCOLS] = {
    {"collective", "I", 4}, {"in_nelems", "l", 8}, {"out_nelems", "l", 8},
    {"group_size", "l", 8}, {"dtype", "I", 4},     {"pg_name", "I", 4},
    {"pg_desc", "I", 4},    {"pg_ranks", "I", 4},  {"seq", "l", 8},
    {"src_rank", "l", 8},   {"dst_rank", "l", 8},  {"wait_on_stream", "l", 8},
    {"wait_on_corr", "l", 8}, {"raw", "C", 1},
};
#define MAX_COLS 18
_Static_assert(N_COLS <= MAX_COLS && N_DCOLS <= MAX_COLS, "a table has more columns than MAX_COLS");

typedef struct {
    const Col *cols;
    int n_cols;
    char *data[MAX_COLS];
    uint8_t *valid[MAX_COLS]; /* a byte per row (packed into a bitmap on export) */
    int64_t nulls[MAX_COLS];
    int64_t n, cap;
} Table;

static void table_free(Table *t) {
    for (int c = 0; c < t->n_cols; c++) {
        free(t->data[c]);
        free(t->valid[c]);
        t->data[c] = NULL;
        t->valid[c] = NULL;
    }
}

/* Room for `cap` rows (more than now): each column's buffer is moved, its rows copied. */
static int table_reserve(Table *t, int64_t cap) {
    for (int c = 0; c < t->n_cols; c++) {
        char *d = realloc(t->data[c], (size_t)cap * t->cols[c].width);
        if (d == NULL) return -1;
        t->data[c] = d;
        uint8_t *v = realloc(t->valid[c], (size_t)cap);
        if (v == NULL) return -1;
        t->valid[c] = v;
    }
    t->cap = cap;
    return 0;
}

static int table_grow(Table *t) { return table_reserve(t, t->cap ? t->cap * 2 : 4096); }

/* A trace event takes 100-450 bytes of JSON: room for one row per ROW_BYTES of the range
 * scanned holds every kept event of a real trace at once. Growing from a few thousand rows
 * by doubling copied every column three to five times, and those copies into new memory
 * were a sixth of a small job's page faults (bench/README.md, thirty-third session). Rows
 * reserved and never written cost address space only: their pages are never touched. */
#define ROW_BYTES 128

static inline void put(Table *t, int c, const void *value) {
    memcpy(t->data[c] + (size_t)t->n * t->cols[c].width, value, t->cols[c].width);
    t->valid[c][t->n] = 1;
}

static inline void put_null(Table *t, int c) {
    memset(t->data[c] + (size_t)t->n * t->cols[c].width, 0, t->cols[c].width);
    t->valid[c][t->n] = 0;
    t->nulls[c]++;
}

/* Hand column c over to a (schema, array) capsule pair; the table no longer owns it. */
static PyObject *export_column(Table *t, int c) {
    struct ArrowSchema *schema = calloc(1, sizeof *schema);
    struct ArrowArray *array = calloc(1, sizeof *array);
    const void **buffers = calloc(2, sizeof *buffers);
    uint8_t *bitmap = NULL;
    int64_t n = t->n;
    if (schema == NULL || array == NULL || buffers == NULL) goto nomem;
    if (t->nulls[c]) {
        bitmap = calloc((size_t)(n + 7) / 8 + 1, 1);
        if (bitmap == NULL) goto nomem;
        for (int64_t i = 0; i < n; i++)
            if (t->valid[c][i]) bitmap[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    if (t->data[c] == NULL) { /* no rows: Arrow still wants a data buffer */
        t->data[c] = malloc(8);
        if (t->data[c] == NULL) goto nomem;
    }
    schema->format = t->cols[c].format;
    schema->name = t->cols[c].name;
    schema->flags = ARROW_FLAG_NULLABLE;
    schema->release = release_schema;
    buffers[0] = bitmap;
    buffers[1] = t->data[c];
    array->length = n;
    array->null_count = t->nulls[c];
    array->n_buffers = 2;
    array->buffers = buffers;
    array->release = release_array;
    t->data[c] = NULL;
    PyObject *s = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (s == NULL) {
        release_array(array);
        free(array);
        free(schema);
        return NULL;
    }
    PyObject *a = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (a == NULL) {
        release_array(array);
        free(array);
        Py_DECREF(s);
        return NULL;
    }
    return Py_BuildValue("(sNN)", t->cols[c].name, s, a);
nomem:
    free(schema);
    free(array);
    free(buffers);
    free(bitmap);
    PyErr_NoMemory();
    return NULL;
}

/* ------------------------------------------------------------------- name interning */

typedef struct {
    const uint8_t *p;
    size_t n;
    uint64_t hash;
} Name;

typedef struct {
    Name *names; /* distinct names, in order of first appearance */
    uint32_t count, names_cap;
    uint32_t *slots; /* index + 1, 0 = empty */
    uint32_t mask;
} Interner;

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

static int interner_init(Interner *in) {
    in->mask = 1023;
    in->slots = calloc(in->mask + 1, sizeof *in->slots);
    in->names_cap = 256;
    in->names = malloc(in->names_cap * sizeof *in->names);
    in->count = 0;
    return (in->slots == NULL || in->names == NULL) ? -1 : 0;
}

static void interner_free(Interner *in) {
    free(in->slots);
    free(in->names);
}

static int interner_rehash(Interner *in) {
    uint32_t mask = in->mask * 2 + 1;
    uint32_t *slots = calloc(mask + 1, sizeof *slots);
    if (slots == NULL) return -1;
    for (uint32_t i = 0; i < in->count; i++) {
        uint32_t s = (uint32_t)in->names[i].hash & mask;
        while (slots[s]) s = (s + 1) & mask;
        slots[s] = i + 1;
    }
    free(in->slots);
    in->slots = slots;
    in->mask = mask;
    return 0;
}

/* The id of the name p[0:n] (its raw JSON bytes, escapes included); -1 when out of memory. */
static int64_t intern(Interner *in, const uint8_t *p, size_t n) {
    uint64_t h = hash_bytes(p, n);
    uint32_t s = (uint32_t)h & in->mask;
    while (in->slots[s]) {
        Name *x = &in->names[in->slots[s] - 1];
        if (x->hash == h && x->n == n && memcmp(x->p, p, n) == 0) return in->slots[s] - 1;
        s = (s + 1) & in->mask;
    }
    if (in->count == in->names_cap) {
        Name *names = realloc(in->names, 2 * (size_t)in->names_cap * sizeof *names);
        if (names == NULL) return -1;
        in->names = names;
        in->names_cap *= 2;
    }
    in->names[in->count] = (Name){p, n, h};
    in->slots[s] = ++in->count;
    if (in->count * 2 > in->mask && interner_rehash(in) < 0) return -1;
    return in->count - 1;
}

/* --------------------------------------------------------------------------- JSON */

/* What a value is, as msgspec's type checks see it. */
enum {
    V_ABSENT = 0,
    V_NULL = 1 << 0,
    V_BOOL = 1 << 1,
    V_INT = 1 << 2,    /* integer literal that fits int64 */
    V_BIGINT = 1 << 3, /* integer literal beyond int64 */
    V_FLOAT = 1 << 4,  /* fraction or exponent, finite as a double */
    V_HUGE = 1 << 5,   /* fraction or exponent, out of a double's range */
    V_STR = 1 << 6,
    V_OBJ = 1 << 7,
    V_INTS = 1 << 8,   /* array of integers (or empty) */
    V_ARR = 1 << 9,    /* any other array */
};
#define V_ANYINT (V_INT | V_BIGINT)

/* Flags of a string. */
enum { S_ESC = 1, S_HIGH = 2 };

typedef struct {
    const uint8_t *p, *end;
    int bad; /* not valid JSON, or a shape we leave to msgspec */
} Cur;

typedef struct {
    int kind;
    int64_t i;
    double d;
    const uint8_t *s; /* string contents (between the quotes) */
    size_t n;
    int flags;
} Value;

/* Eight bytes at a time where that is safe (little-endian loads; the lowest flagged byte of
 * the has-byte tricks below is always a true hit), else one at a time. */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#define FIRST_HIT(mask) (__builtin_ctzll(mask) >> 3)
#else
#define SWAR 0
#define FIRST_HIT(mask) 0
#endif

/* SSE2 (every x86-64 CPU has it): sixteen bytes at a time in the loops below. */
#if defined(__SSE2__)
#include <emmintrin.h>
#define SSE2 1
#else
#define SSE2 0
#endif

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
#define HAS_ZERO(w) (((w) - ONES) & ~(w) & HIGHS)
#define HAS_BYTE(w, b) HAS_ZERO((w) ^ (ONES * (b)))
#define HAS_LESS(w, b) (((w) - ONES * (b)) & ~(w) & HIGHS)

static inline void skip_ws(Cur *c) {
    const uint8_t *p = c->p, *end = c->end;
    /* Most calls meet a token at once, or after one space (`"key": value`, `item, item`):
     * every byte above ' ' is a token's, so those take no loop. */
    if (p < end && *p > ' ') return;
    if (end - p >= 2 && p[0] == ' ' && p[1] > ' ') {
        c->p = p + 1;
        return;
    }
#if SSE2
    /* Pretty-printed traces put a newline and a run of spaces between tokens. */
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i sp = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')),
                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('\n')));
        __m128i ws = _mm_or_si128(sp, _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')),
                                                   _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'))));
        unsigned other = ~(unsigned)_mm_movemask_epi8(ws) & 0xFFFFu;
        if (other) {
            c->p = p + __builtin_ctz(other);
            return;
        }
        p += 16;
    }
#endif
    for (;;) {
        /* Pretty-printed traces indent with runs of spaces. */
        while (SWAR && end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t other = w ^ (ONES * ' ');
            if (other) {
                p += FIRST_HIT(other);
                break;
            }
            p += 8;
        }
        if (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) {
            p++;
            continue;
        }
        break;
    }
    c->p = p;
}

static inline int hexval(uint8_t ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int read_u4(Cur *c, const uint8_t *at) {
    if (c->end - at < 4) return -1;
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(at[k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Is p[0:n] valid UTF-8 by Python's strict decoder (no surrogates, no overlongs)? */
static int utf8_ok(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = p[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) more = 1;
        else if (b == 0xE0) more = 2, lo = 0xA0;
        else if (b >= 0xE1 && b <= 0xEC) more = 2;
        else if (b == 0xED) more = 2, hi = 0x9F;
        else if (b >= 0xEE && b <= 0xEF) more = 2;
        else if (b == 0xF0) more = 3, lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3) more = 3;
        else if (b == 0xF4) more = 3, hi = 0x8F;
        else return 0;
        if (i + more >= n) return 0;
        if (p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
        i += more + 1;
    }
    return 1;
}

/* The plain string of n bytes at p (after its opening quote) into v; past its closing quote. */
static inline int plain_string(Cur *c, Value *v, const uint8_t *p, int n) {
    v->kind = V_STR;
    v->s = p;
    v->n = (size_t)n;
    v->flags = 0;
    c->p = p + n + 1;
    return 1;
}

/* A string of at most fifteen plain bytes (no escape, control or non-ASCII byte: keys such
 * as "ph" or "External id", values such as "X" or "kernel"), read from one sixteen-byte
 * block with SSE2, else at most seven from one eight-byte word; 0 when it is not one, and
 * parse_string reads it instead. The lowest flagged byte of each SWAR test is a true hit,
 * so a flag below the closing quote is a real bad byte. */
static inline int short_string(Cur *c, Value *v) {
    const uint8_t *p = c->p + 1;
#if SSE2
    if (c->end - p >= 16) {
        __m128i w16 = _mm_loadu_si128((const __m128i *)p);
        unsigned quote16 = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(w16, _mm_set1_epi8('"')));
        if (!quote16) return 0;
        int n16 = __builtin_ctz(quote16);
        /* Signed compare: bytes of 0x80 and up are negative, so below ' ' too. */
        unsigned bad16 = (unsigned)_mm_movemask_epi8(_mm_or_si128(
            _mm_cmpeq_epi8(w16, _mm_set1_epi8('\\')), _mm_cmplt_epi8(w16, _mm_set1_epi8(0x20))));
        if (bad16 & ((1u << n16) - 1)) return 0;
        return plain_string(c, v, p, n16);
    }
#endif
    if (!SWAR || c->end - p < 8) return 0;
    uint64_t w;
    memcpy(&w, p, 8);
    uint64_t quote = HAS_BYTE(w, '"');
    if (!quote) return 0;
    int n = FIRST_HIT(quote);
    uint64_t bad = HAS_BYTE(w, '\\') | HAS_LESS(w, 0x20) | (w & HIGHS);
    if (n > 0 && (bad & ((1ull << (8 * n)) - 1))) return 0;
    return plain_string(c, v, p, n);
}

/* A string at c->p (which is at its opening quote): checked as msgspec checks strings
 * (escapes, control characters, surrogate pairs), contents and flags into v. */
static void parse_string(Cur *c, Value *v) {
    const uint8_t *p = c->p + 1, *end = c->end;
    int flags = 0;
    v->kind = V_STR;
    v->s = p;
    for (;;) {
#if SSE2
        while (end - p >= 16) {
            __m128i w16 = _mm_loadu_si128((const __m128i *)p);
            __m128i hit16 = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(w16, _mm_set1_epi8('"')),
                             _mm_cmpeq_epi8(w16, _mm_set1_epi8('\\'))),
                _mm_cmplt_epi8(w16, _mm_set1_epi8(0x20))); /* signed: 0x80 and up too */
            unsigned m = (unsigned)_mm_movemask_epi8(hit16);
            if (m) {
                p += __builtin_ctz(m);
                goto found;
            }
            p += 16;
        }
#endif
        while (SWAR && end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t hit = HAS_BYTE(w, '"') | HAS_BYTE(w, '\\') | HAS_LESS(w, 0x20) | (w & HIGHS);
            if (hit) {
                p += FIRST_HIT(hit);
                break;
            }
            p += 8;
        }
#if SSE2
    found:
#endif
        if (p >= end) goto bad;
        uint8_t ch = *p;
        if (ch == '"') break;
        if (ch < 0x20) goto bad;
        if (ch >= 0x80) {
            flags |= S_HIGH;
            p++;
            continue;
        }
        if (ch != '\\') {
            p++;
            continue;
        }
        flags |= S_ESC;
        if (end - p < 2) goto bad;
        ch = p[1];
        if (ch == 'u') {
            int u = read_u4(c, p + 2);
            if (u < 0) goto bad;
            p += 6;
            if (u >= 0xDC00 && u <= 0xDFFF) goto bad;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') goto bad;
                int low = read_u4(c, p + 2);
                if (low < 0xDC00 || low > 0xDFFF) goto bad;
                p += 6;
            }
            continue;
        }
        if (!(ch == '"' || ch == '\\' || ch == '/' || ch == 'b' || ch == 'f' || ch == 'n' ||
              ch == 'r' || ch == 't'))
            goto bad;
        p += 2;
    }
    v->n = (size_t)(p - v->s);
    v->flags = flags;
    c->p = p + 1;
    return;
bad:
    c->bad = 1;
}

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number by the JSON grammar; integers fit for int64 become V_INT, others V_BIGINT,
 * anything with a fraction or exponent V_FLOAT (correctly rounded) or V_HUGE. */
static void parse_number(Cur *c, Value *v) {
    const uint8_t *start = c->p, *p = c->p, *end = c->end;
    int neg = 0, frac_digits = 0, is_float = 0;
    uint64_t m = 0;
    int digits = 0; /* into m, fraction included: 19 always fit, more may not */
    if (p < end && *p == '-') neg = 1, p++;
    if (p >= end) goto bad;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        const uint8_t *first = p;
        while (p < end && (unsigned)(*p - '0') <= 9) m = m * 10 + (unsigned)(*p++ - '0');
        digits = (int)(p - first);
    } else {
        goto bad;
    }
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') goto bad;
        const uint8_t *first = p;
        while (p < end && (unsigned)(*p - '0') <= 9) m = m * 10 + (unsigned)(*p++ - '0');
        frac_digits = (int)(p - first);
        digits += frac_digits;
    }
    /* Beyond 19 digits m may have wrapped: such a number is out of int64's range when it is
     * an integer, and goes to strtod when it is not. */
    int overflow = digits > 19;
    int exp10 = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = (*p == '-'), p++;
        if (p >= end || *p < '0' || *p > '9') goto bad;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp10 < 100000) exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp10 = -exp10;
    }
    c->p = p;
    if (!is_float) {
        if (overflow || m > (uint64_t)INT64_MAX + (uint64_t)neg) {
            v->kind = V_BIGINT;
            return;
        }
        v->kind = V_INT;
        v->i = neg ? (int64_t)(0 - m) : (int64_t)m;
        return;
    }
    v->kind = V_FLOAT;
    int e = exp10 - frac_digits;
    if (!overflow && m <= (1ull << 53) && e >= -22 && e <= 22) {
        /* Clinger's fast path: both operands exact, so one rounding. */
        double d = (double)m;
        d = e < 0 ? d / POW10[-e] : d * POW10[e];
        v->d = neg ? -d : d;
        return;
    }
    char local[64];
    size_t len = (size_t)(p - start);
    char *text = len < sizeof local ? local : malloc(len + 1);
    if (text == NULL) goto bad;
    memcpy(text, start, len);
    text[len] = 0;
    double d = strtod(text, NULL);
    if (text != local) free(text);
    if (isinf(d)) v->kind = V_HUGE;
    v->d = d;
    return;
bad:
    c->bad = 1;
}

static int skip_value(Cur *c, Value *v, int depth);

/* Opening a container at c->p ('{' or '['): whether it is empty (then consumed whole). */
static inline int opens_empty(Cur *c, uint8_t close) {
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    return 0;
}

/* After a member or item: 1 past a ',' (another follows), 0 past `close`, else c->bad. */
static inline int more(Cur *c, uint8_t close) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ',') {
        c->p++;
        skip_ws(c);
        return 1;
    }
    if (c->p < c->end && *c->p == close) c->p++;
    else c->bad = 1;
    return 0;
}

/* The members of the object at c->p (its '{'): each key is checked (and must be free of
 * escapes where `plain_keys`: the scanner compares keys as bytes), then `member` reads the
 * value after the colon, returning 0 (with c->bad set) when it cannot. */
static inline void walk_object(Cur *c, int plain_keys,
                               int (*member)(Cur *, const Value *key, void *ctx), void *ctx) {
    if (opens_empty(c, '}')) return;
    do {
        Value key;
        if (c->p >= c->end || *c->p != '"') goto bad;
        if (!short_string(c, &key)) parse_string(c, &key);
        if (c->bad) return;
        if (plain_keys && (key.flags & S_ESC)) goto bad;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') goto bad;
        c->p++;
        skip_ws(c);
        if (!member(c, &key, ctx)) return;
    } while (more(c, '}'));
    return;
bad:
    c->bad = 1;
}

static int skip_member(Cur *c, const Value *key, void *depth) {
    Value value;
    return skip_value(c, &value, *(int *)depth + 1);
}

static int expect_literal(Cur *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) {
        c->bad = 1;
        return 0;
    }
    c->p += n;
    return 1;
}

/* Any JSON value, checked and classified (object keys and members are checked, not kept). */
static int skip_value(Cur *c, Value *v, int depth) {
    if (c->p >= c->end || depth > 512) {
        c->bad = 1;
        return 0;
    }
    switch (*c->p) {
    case '"':
        if (!short_string(c, v)) parse_string(c, v);
        break;
    case '{':
        v->kind = V_OBJ;
        walk_object(c, 0, skip_member, &depth);
        break;
    case '[': {
        int all_ints = 1;
        if (!opens_empty(c, ']')) {
            do {
                Value item;
                if (!skip_value(c, &item, depth + 1)) return 0;
                if (!(item.kind & V_ANYINT)) all_ints = 0;
            } while (more(c, ']'));
        }
        v->kind = all_ints ? V_INTS : V_ARR;
        break;
    }
    case 't':
        v->kind = V_BOOL;
        expect_literal(c, "true", 4);
        break;
    case 'f':
        v->kind = V_BOOL;
        expect_literal(c, "false", 5);
        break;
    case 'n':
        v->kind = V_NULL;
        expect_literal(c, "null", 4);
        break;
    default:
        parse_number(c, v);
    }
    return !c->bad;
}

/* ----------------------------------------------------------------------- the events */

/* The `Args` fields of load/events.py (their JSON names) and the types msgspec accepts for each.
 * The first five are kept as columns. tests/test_scan.py checks this list against Args. */
#define STR_OK (V_STR | V_NULL)
#define INT_OK (V_ANYINT | V_NULL)
#define INT_STR_OK (V_ANYINT | V_STR | V_NULL)
enum {
    A_EXT, A_EXT_OLD, A_CORR, A_STREAM, A_DEVICE, N_KEPT_ARGS,
    A_COLL = N_KEPT_ARGS, A_IN, A_OUT, A_GSIZE, A_DTYPE, A_PGNAME, A_PGDESC, A_PGRANKS, A_PGID,
    A_SEQ, A_SRC, A_DST, A_WSTREAM, A_WCORR, A_LABEL
};
static const struct {
    const char *key;
    int ok;
} ARG_KEYS[] = {
    {"External id", INT_OK},
    {"external id", INT_OK},
    {"correlation", INT_OK},
    {"stream", INT_STR_OK},
    {"device", INT_STR_OK},
    {"Collective name", STR_OK},
    {"In msg nelems", INT_OK},
    {"Out msg nelems", INT_OK},
    {"Group size", INT_OK},
    {"dtype", STR_OK},
    {"Process Group Name", INT_STR_OK},
    {"Process Group Description", STR_OK},
    {"Process Group Ranks", V_STR | V_INTS | V_NULL},
    {"Process Group ID", INT_STR_OK},
    {"Seq", INT_STR_OK},
    {"Src Rank", INT_OK},
    {"Dst Rank", INT_OK},
    {"wait_on_stream", INT_OK},
    {"wait_on_cuda_event_record_corr_id", INT_OK},
    {"name", INT_STR_OK},
};
#define N_ARG_KEYS ((int)(sizeof ARG_KEYS / sizeof ARG_KEYS[0]))
static size_t ARG_LEN[N_ARG_KEYS]; /* strlen of each key, set when the module loads */

/* Args keys by a hash of length and end bytes (most keys in a trace match none). */
#define N_BUCKETS 64
#define BUCKET_SIZE 4
static int8_t ARG_BUCKETS[N_BUCKETS][BUCKET_SIZE];

static inline unsigned key_hash(const uint8_t *s, size_t n) {
    return n == 0 ? 0 : (unsigned)(n * 7 + s[0] * 3 + s[n - 1] * 5) % N_BUCKETS;
}

static int index_arg_keys(void) {
    memset(ARG_BUCKETS, -1, sizeof ARG_BUCKETS);
    for (int k = 0; k < N_ARG_KEYS; k++) {
        ARG_LEN[k] = strlen(ARG_KEYS[k].key);
        int8_t *bucket = ARG_BUCKETS[key_hash((const uint8_t *)ARG_KEYS[k].key, ARG_LEN[k])];
        int b = 0;
        while (b < BUCKET_SIZE && bucket[b] >= 0) b++;
        if (b == BUCKET_SIZE) return -1;
        bucket[b] = (int8_t)k;
    }
    return 0;
}

/* Event fields, in the order of the bits in Event.wrong. */
enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_ARGS, N_FIELDS };

typedef struct {
    Value f[N_FIELDS];
    Value arg[N_ARG_KEYS]; /* every Args field: the kept ones V_ABSENT when missing, */
    uint32_t has;          /* the others only valid where their bit is set here */
    int wrong; /* bit per field: a value msgspec would reject (sticky over duplicates) */
    int seen;  /* bit per field */
} Event;

/* A str field: msgspec makes a Python str of it, which must be valid UTF-8. */
static inline int str_ok(const Value *v) {
    return v->kind != V_STR || !(v->flags & S_HIGH) || utf8_ok(v->s, v->n);
}

static int arg_member(Cur *c, const Value *key, void *event) {
    Event *ev = event;
    int k = -1;
    const int8_t *bucket = ARG_BUCKETS[key_hash(key->s, key->n)];
    for (int b = 0; b < BUCKET_SIZE && bucket[b] >= 0; b++) {
        int x = bucket[b];
        if (ARG_LEN[x] == key->n && memcmp(ARG_KEYS[x].key, key->s, key->n) == 0) {
            k = x;
            break;
        }
    }
    /* An Args field's value is read into its place (not copied there after). */
    Value scratch, *value = k >= 0 ? &ev->arg[k] : &scratch;
    if (k >= 0) ev->has |= 1u << k;
    if (!skip_value(c, value, 1)) return 0;
    if (k >= 0 && (!(value->kind & ARG_KEYS[k].ok) || !str_ok(value))) ev->wrong |= 1 << F_ARGS;
    return 1;
}

static void parse_args(Cur *c, Event *ev) {
    for (int k = 0; k < N_KEPT_ARGS; k++) ev->arg[k].kind = V_ABSENT;
    ev->has = 0;
    walk_object(c, 1, arg_member, ev);
}

static int field_of(const Value *key) {
    const uint8_t *s = key->s;
    switch (key->n) {
    case 2:
        if (s[0] == 'p' && s[1] == 'h') return F_PH;
        if (s[0] == 't' && s[1] == 's') return F_TS;
        return -1;
    case 3:
        if (!memcmp(s, "cat", 3)) return F_CAT;
        if (!memcmp(s, "pid", 3)) return F_PID;
        if (!memcmp(s, "tid", 3)) return F_TID;
        if (!memcmp(s, "dur", 3)) return F_DUR;
        return -1;
    case 4:
        if (!memcmp(s, "name", 4)) return F_NAME;
        if (!memcmp(s, "args", 4)) return F_ARGS;
        return -1;
    }
    return -1;
}

/* Types msgspec accepts for each field of the Complete / Meta structs. */
static const int FIELD_OK[N_FIELDS] = {
    [F_PH] = V_STR,
    [F_CAT] = V_STR | V_NULL,
    [F_NAME] = V_STR | V_ANYINT | V_NULL,
    [F_PID] = V_STR | V_ANYINT | V_NULL,
    [F_TID] = V_STR | V_ANYINT | V_NULL,
    [F_TS] = V_ANYINT | V_FLOAT | V_NULL,
    [F_DUR] = V_ANYINT | V_FLOAT | V_NULL,
    [F_ARGS] = V_OBJ | V_NULL,
};

static int event_member(Cur *c, const Value *key, void *event) {
    Event *ev = event;
    int f = field_of(key);
    if (f == F_ARGS && c->p < c->end && *c->p == '{') {
        ev->f[F_ARGS].kind = V_OBJ;
        parse_args(c, ev);
    } else {
        /* A field's value is read into its place (a later duplicate replaces it). */
        Value scratch, *value = f >= 0 ? &ev->f[f] : &scratch;
        if (!skip_value(c, value, 1)) return 0;
        if (f >= 0) {
            if (f == F_PH && (ev->seen & (1 << F_PH))) { /* two tags: msgspec's call */
                c->bad = 1;
                return 0;
            }
            if (!(value->kind & FIELD_OK[f]) || !str_ok(value)) ev->wrong |= 1 << f;
            if (f == F_ARGS) { /* null args: no args */
                for (int k = 0; k < N_KEPT_ARGS; k++) ev->arg[k].kind = V_ABSENT;
                ev->has = 0;
            }
        }
    }
    if (f >= 0) ev->seen |= 1 << f;
    return !c->bad;
}

static void parse_event(Cur *c, Event *ev) {
    ev->wrong = 0;
    ev->seen = 0;
    for (int k = 0; k < N_FIELDS; k++) ev->f[k].kind = V_ABSENT;
    for (int k = 0; k < N_KEPT_ARGS; k++) ev->arg[k].kind = V_ABSENT;
    ev->has = 0;
    if (c->p >= c->end || *c->p != '{') {
        c->bad = 1;
        return;
    }
    walk_object(c, 1, event_member, ev);
}

typedef struct {
    const char *cat;
    size_t n;
    int code;
} Category;

/* The Args fields of each details column, and which of them are text. */
static const int DETAIL_ARG[D_RAW] = {A_COLL,  A_IN,      A_OUT, A_GSIZE, A_DTYPE,
                                      A_PGNAME, A_PGDESC, A_PGRANKS, A_SEQ, A_SRC,
                                      A_DST,   A_WSTREAM, A_WCORR};
static const int DETAIL_TEXT[D_RAW] = {1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0};
#define DETAIL_MASK                                                                          \
    ((1u << A_COLL) | (1u << A_IN) | (1u << A_OUT) | (1u << A_GSIZE) | (1u << A_DTYPE) |     \
     (1u << A_PGNAME) | (1u << A_PGDESC) | (1u << A_PGRANKS) | (1u << A_SEQ) | (1u << A_SRC) | \
     (1u << A_DST) | (1u << A_WSTREAM) | (1u << A_WCORR))

/* A details row for the event when its args give any of the fields a value: its row, -1
 * when they give none, -2 when out of memory. Text goes into `names` (load/scan.py reads ids
 * of both kinds from one list). */
static int64_t put_details(Table *d, const Event *ev, Interner *names) {
    static const Value absent = {.kind = V_ABSENT};
    const Value *values[D_RAW];
    int any = 0;
    if (!(ev->has & DETAIL_MASK)) return -1; /* most events */
    for (int k = 0; k < D_RAW; k++) {
        int a = DETAIL_ARG[k];
        values[k] = (ev->has >> a) & 1 ? &ev->arg[a] : &absent;
        any |= values[k]->kind > V_NULL;
    }
    if (!any) return -1;
    if (d->n == d->cap && table_grow(d) < 0) return -2;
    uint8_t raw = 0;
    for (int k = 0; k < D_RAW; k++) {
        const Value *v = values[k];
        if (DETAIL_TEXT[k] && v->kind == V_STR) {
            int64_t id = intern(names, v->s, v->n);
            if (id < 0) return -2;
            uint32_t id32 = (uint32_t)id;
            put(d, k, &id32);
        } else if (!DETAIL_TEXT[k] && v->kind == V_INT) {
            put(d, k, &v->i);
        } else {
            put_null(d, k);
            raw |= v->kind > V_NULL; /* a value of another type: msgspec's to read */
        }
    }
    put(d, D_RAW, &raw);
    return d->n++;
}

/* Each device row's launch: the time, thread and duration of the first runtime call, in
 * file order, with its correlation and a time (the join load/assemble.py would make: runtime calls without a
 * time are dropped, the first of the others kept); then the runtime rows are let go: they
 * serve no table but this link (a batch of rank files spent a third of its rows and
 * queries on them, bench/README.md, forty-first session). Roles are code / 16 (load/events.py's
 * _CODES): 0 device, 1 runtime. A hash table of the runtime calls, then a look-up per
 * device row: the same join in Polars cost a batch of rank files more than scanning its
 * runtime calls (bench/README.md, twenty-ninth session). Only for a whole file whose
 * runtime calls are all complete events: pairing B/E calls reorders them, and the join may
 * then find another call. -1 when out of memory. */
static int link_launches(Table *t) {
    const uint8_t *code = (const uint8_t *)t->data[COL_CODE];
    const int64_t *corr = (const int64_t *)t->data[COL_CORR];
    const uint8_t *has_corr = t->valid[COL_CORR], *has_ts = t->valid[COL_TS];
    int64_t calls = 0;
    for (int64_t i = 0; i < t->n; i++) calls += code[i] >> 4 == 1 && has_corr[i] && has_ts[i];
    if (calls > 0) {
        int bits = 4;
        while (((int64_t)1 << bits) < 2 * calls) bits++;
        size_t cap = (size_t)1 << bits, mask = cap - 1;
        int64_t *keys = malloc(cap * sizeof *keys);
        int64_t *rows = malloc(cap * sizeof *rows); /* the runtime call's row */
        uint8_t *used = calloc(cap, 1);
        if (keys == NULL || rows == NULL || used == NULL) {
            free(keys);
            free(rows);
            free(used);
            return -1;
        }
#define SLOT(key) ((size_t)(((uint64_t)(key)*0x9E3779B97F4A7C15ull) >> (64 - bits)))
        for (int64_t i = 0; i < t->n; i++) {
            if (code[i] >> 4 != 1 || !has_corr[i] || !has_ts[i]) continue;
            size_t h = SLOT(corr[i]);
            while (used[h] && keys[h] != corr[i]) h = (h + 1) & mask;
            if (used[h]) continue; /* a later call with the same correlation */
            used[h] = 1;
            keys[h] = corr[i];
            rows[h] = i;
        }
        const double *ts = (const double *)t->data[COL_TS];
        const double *dur = (const double *)t->data[COL_DUR];
        const int64_t *tid = (const int64_t *)t->data[COL_TID];
        double *launch_ts = (double *)t->data[COL_LAUNCH_TS];
        double *launch_dur = (double *)t->data[COL_LAUNCH_DUR];
        int64_t *launch_tid = (int64_t *)t->data[COL_LAUNCH_TID];
        for (int64_t i = 0; i < t->n; i++) {
            if (code[i] >> 4 != 0 || !has_corr[i]) continue;
            size_t h = SLOT(corr[i]);
            while (used[h] && keys[h] != corr[i]) h = (h + 1) & mask;
            if (!used[h]) continue;
            int64_t call = rows[h];
            launch_ts[i] = ts[call];
            t->valid[COL_LAUNCH_TS][i] = 1;
            t->nulls[COL_LAUNCH_TS]--;
            if (t->valid[COL_TID][call]) {
                launch_tid[i] = tid[call];
                t->valid[COL_LAUNCH_TID][i] = 1;
                t->nulls[COL_LAUNCH_TID]--;
            }
            if (t->valid[COL_DUR][call]) {
                launch_dur[i] = dur[call];
                t->valid[COL_LAUNCH_DUR][i] = 1;
                t->nulls[COL_LAUNCH_DUR]--;
            }
        }
#undef SLOT
        free(keys);
        free(rows);
        free(used);
    }
    /* The runtime rows out, the others moved up in place. */
    int64_t kept = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (code[i] >> 4 == 1) {
            for (int c = 0; c < t->n_cols; c++) t->nulls[c] -= !t->valid[c][i];
            continue;
        }
        if (kept != i)
            for (int c = 0; c < t->n_cols; c++) {
                int w = t->cols[c].width;
                memcpy(t->data[c] + (size_t)kept * w, t->data[c] + (size_t)i * w, w);
                t->valid[c][kept] = t->valid[c][i];
            }
        kept++;
    }
    t->n = kept;
    return 0;
}

/* ------------------------------------------------------------------------- scan() */

/* Whether a CPU op's name may make it an `ops` row: it starts with one of the prefixes, or
 * it has escapes (compared decoded, by load/scan.py). A missing or null name never does. */
static int op_named(const Value *name, const Category *prefixes, int n) {
    if (name->kind != V_STR) return 0;
    if (name->flags & S_ESC) return 1;
    for (int k = 0; k < n; k++)
        if (name->n >= prefixes[k].n && !memcmp(name->s, prefixes[k].cat, prefixes[k].n))
            return 1;
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, stop;
    PyObject *cats, *prefixes = Py_None, *wait_names = Py_None;
    const char *skipped; /* the phases whose events are skipped unread */
    int op_code = -1, link = 0; /* link: link_launches, for a whole file */
    int wait_code = -1;         /* the code of the runtime calls named in wait_names */
    if (!PyArg_ParseTuple(args, "y*nnO!s|OipOi", &view, &start, &stop, &PyDict_Type, &cats,
                          &skipped, &prefixes, &op_code, &link, &wait_names, &wait_code))
        return NULL;
    /* With a tuple of names: the runtime calls (role 1) of exactly those names get the code
     * `wait_code` (host waits, kept apart from the launches); one whose name has escapes
     * goes to msgspec, which decides. */
    Category waits[32];
    int n_waits = 0;
    if (wait_names != Py_None) {
        if (!PyTuple_Check(wait_names) || PyTuple_GET_SIZE(wait_names) > 32) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "scan: wait names are a tuple of bytes, at most 32");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(wait_names); k++) {
            PyObject *name = PyTuple_GET_ITEM(wait_names, k);
            if (!PyBytes_Check(name)) {
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_TypeError, "scan: wait names are a tuple of bytes");
                return NULL;
            }
            waits[n_waits++] = (Category){PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), 0};
        }
    }
    /* With a tuple of name prefixes: the CPU ops (role 2) kept are those of code `op_code`
     * and those whose name starts with one of them (or has escapes: load/scan.py decides).
     * The bytes objects live in the caller's arguments until the call returns. */
    Category ops[16];
    int n_ops = -1; /* -1: every CPU op kept */
    if (prefixes != Py_None) {
        if (!PyTuple_Check(prefixes) || PyTuple_GET_SIZE(prefixes) > 16) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "scan: prefixes are a tuple of bytes, at most 16");
            return NULL;
        }
        n_ops = 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(prefixes); k++) {
            PyObject *prefix = PyTuple_GET_ITEM(prefixes, k);
            if (!PyBytes_Check(prefix)) {
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_TypeError, "scan: prefixes are a tuple of bytes");
                return NULL;
            }
            ops[n_ops++] = (Category){PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix), 0};
        }
    }
    const uint8_t *base = view.buf;
    Py_ssize_t len = view.len;
    if (start < 0 || start >= len || stop >= len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: start/stop outside the buffer");
        return NULL;
    }
    /* Category codes from the dict {bytes: int}; a few entries, compared as bytes. */
    Category known[64];
    int n_known = 0, meta_code = -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(cats, &pos, &key, &value)) {
        if (n_known == 64 || !PyBytes_Check(key) || !PyLong_Check(value)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "scan: categories are {bytes: int}, at most 64");
            return NULL;
        }
        int code = (int)PyLong_AsLong(value);
        if (PyBytes_GET_SIZE(key) == 0) meta_code = code; /* b"": the metadata code */
        else known[n_known++] = (Category){PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), code};
    }

    Table t = {.cols = COLS, .n_cols = N_COLS}, d = {.cols = DCOLS, .n_cols = N_DCOLS};
    Interner names;
    Cur c = {base + start + 1, base + (stop >= 0 ? stop : len), 0};
    int unsupported = 0, nomem = 0, linked = 0;
    int64_t unpaired_calls = 0; /* runtime calls as B/E events */
    Py_ssize_t closed_at = -1;
    if (interner_init(&names) < 0) nomem = 1;
    if (!nomem && table_reserve(&t, (c.end - c.p) / ROW_BYTES + 4096) < 0) nomem = 1;

    Py_BEGIN_ALLOW_THREADS
    skip_ws(&c);
    int first = 1;
    while (!nomem && !unsupported) {
        if (c.p >= c.end) {
            if (stop >= 0) closed_at = stop; /* the cut stands for the array's end */
            else c.bad = 1;
            break;
        }
        if (*c.p == ']') {
            if (stop >= 0) c.bad = 1; /* the real end before the cut */
            else closed_at = c.p - base;
            break;
        }
        if (!first) {
            if (*c.p != ',') {
                c.bad = 1;
                break;
            }
            c.p++;
            skip_ws(&c);
        }
        first = 0;
        const uint8_t *at = c.p;
        Event ev;
        parse_event(&c, &ev);
        if (c.bad) break;
        const uint8_t *after = c.p;
        skip_ws(&c);
        if (ev.f[F_PH].kind != V_STR || ev.f[F_PH].n != 1 || (ev.f[F_PH].flags & S_ESC)) {
            unsupported = 1; /* no phase, or an odd one: the permissive decoder's job */
            break;
        }
        uint8_t ph = ev.f[F_PH].s[0];
        int code;
        if (ph == 'X' || ph == 'B' || ph == 'E') {
            int checked = (1 << F_CAT) | (1 << F_NAME) | (1 << F_PID) | (1 << F_TID) |
                          (1 << F_TS) | (1 << F_DUR) | (1 << F_ARGS);
            if (ev.wrong & checked) {
                unsupported = 1;
                break;
            }
            Value *cat = &ev.f[F_CAT];
            code = -1;
            if (cat->kind == V_STR) {
                if (cat->flags & S_ESC) {
                    unsupported = 1;
                    break;
                }
                for (int k = 0; k < n_known; k++)
                    if (known[k].n == cat->n && !memcmp(known[k].cat, cat->s, cat->n)) {
                        code = known[k].code;
                        break;
                    }
            }
            if (code < 0) continue; /* not a category the analyses read */
            /* Kept: only the shapes the columns hold (others go to msgspec). */
            if ((ev.f[F_NAME].kind & ~(V_STR | V_NULL)) ||
                (ev.f[F_PID].kind & ~(V_INT | V_NULL)) ||
                (ev.f[F_TID].kind & ~(V_INT | V_NULL)) ||
                (ev.f[F_TS].kind & ~(V_INT | V_FLOAT | V_NULL)) ||
                (ev.f[F_DUR].kind & ~(V_INT | V_FLOAT | V_NULL))) {
                unsupported = 1;
                break;
            }
            for (int k = 0; k < N_KEPT_ARGS; k++)
                if (ev.arg[k].kind & ~(V_INT | V_NULL)) unsupported = 1;
            if (unsupported) break;
            if (n_ops >= 0 && code >> 4 == 2 && code != op_code && !op_named(&ev.f[F_NAME], ops, n_ops))
                continue; /* a CPU op that no table keeps */
            if (n_waits && code >> 4 == 1 && ev.f[F_NAME].kind == V_STR) {
                if (ev.f[F_NAME].flags & S_ESC) {
                    unsupported = 1; /* an escaped runtime call name: msgspec reads it */
                    break;
                }
                for (int k = 0; k < n_waits; k++)
                    if (waits[k].n == ev.f[F_NAME].n &&
                        !memcmp(waits[k].cat, ev.f[F_NAME].s, waits[k].n)) {
                        code = wait_code;
                        break;
                    }
            }
        } else if (ph == 'M') {
            int checked = (1 << F_NAME) | (1 << F_PID) | (1 << F_TID) | (1 << F_ARGS);
            if (ev.wrong & checked) {
                unsupported = 1;
                break;
            }
            code = meta_code;
            if (code < 0) continue;
        } else if (ph != 0 && strchr(skipped, ph) != NULL) {
            continue;
        } else {
            unsupported = 1;
            break;
        }

        if (t.n == t.cap && table_grow(&t) < 0) {
            nomem = 1;
            break;
        }
        if (code >> 4 == 1 && ph != 'X') unpaired_calls++; /* see link_launches */
        uint8_t code8 = (uint8_t)code;
        put(&t, COL_CODE, &code8);
        put(&t, COL_PH, &ph);
        int64_t span0 = at - base, span1 = after - base;
        put(&t, COL_START, &span0);
        put(&t, COL_END, &span1);
        put_null(&t, COL_LAUNCH_TS); /* link_launches sets them */
        put_null(&t, COL_LAUNCH_TID);
        put_null(&t, COL_LAUNCH_DUR);
        if (ph == 'M') { /* load/scan.py reads metadata from the span */
            for (int k = COL_NAME; k < COL_START; k++) put_null(&t, k);
            put_null(&t, COL_DETAIL);
            t.n++;
            continue;
        }
        int64_t details = put_details(&d, &ev, &names);
        if (details < -1) {
            nomem = 1;
            break;
        }
        if (details >= 0) {
            uint32_t row = (uint32_t)details;
            put(&t, COL_DETAIL, &row);
        } else {
            put_null(&t, COL_DETAIL);
        }
        if (ev.f[F_NAME].kind == V_STR) {
            int64_t id = intern(&names, ev.f[F_NAME].s, ev.f[F_NAME].n);
            if (id < 0) {
                nomem = 1;
                break;
            }
            uint32_t id32 = (uint32_t)id;
            put(&t, COL_NAME, &id32);
        } else {
            put_null(&t, COL_NAME);
        }
        static const int INT_FIELDS[][2] = {{F_PID, COL_PID}, {F_TID, COL_TID}};
        for (int k = 0; k < 2; k++) {
            Value *v = &ev.f[INT_FIELDS[k][0]];
            if (v->kind == V_INT) put(&t, INT_FIELDS[k][1], &v->i);
            else put_null(&t, INT_FIELDS[k][1]);
        }
        static const int NUM_FIELDS[][2] = {{F_TS, COL_TS}, {F_DUR, COL_DUR}};
        for (int k = 0; k < 2; k++) {
            Value *v = &ev.f[NUM_FIELDS[k][0]];
            double d = v->kind == V_INT ? (double)v->i : v->d;
            if (v->kind & (V_INT | V_FLOAT)) put(&t, NUM_FIELDS[k][1], &d);
            else put_null(&t, NUM_FIELDS[k][1]);
        }
        static const int ARG_COLS[N_KEPT_ARGS] = {COL_EXT, COL_EXT_OLD, COL_CORR, COL_STREAM,
                                                  COL_DEVICE};
        for (int k = 0; k < N_KEPT_ARGS; k++) {
            if (ev.arg[k].kind == V_INT) put(&t, ARG_COLS[k], &ev.arg[k].i);
            else put_null(&t, ARG_COLS[k]);
        }
        t.n++;
    }
    linked = link && !unpaired_calls;
    if (linked && !nomem && !unsupported && !c.bad && link_launches(&t) < 0) nomem = 1;
    Py_END_ALLOW_THREADS

    PyObject *result = NULL;
    if (nomem) {
        PyErr_NoMemory();
    } else if (c.bad || unsupported) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *columns = PyList_New(N_COLS);
        PyObject *detail_columns = PyList_New(N_DCOLS);
        PyObject *texts = PyList_New(names.count);
        if (columns != NULL && detail_columns != NULL && texts != NULL) {
            int ok = 1;
            for (int k = 0; ok && k < N_COLS; k++) {
                PyObject *col = export_column(&t, k);
                if (col == NULL) ok = 0;
                else PyList_SET_ITEM(columns, k, col);
            }
            for (int k = 0; ok && k < N_DCOLS; k++) {
                PyObject *col = export_column(&d, k);
                if (col == NULL) ok = 0;
                else PyList_SET_ITEM(detail_columns, k, col);
            }
            for (uint32_t k = 0; ok && k < names.count; k++) {
                PyObject *text = PyBytes_FromStringAndSize((const char *)names.names[k].p,
                                                           (Py_ssize_t)names.names[k].n);
                if (text == NULL) ok = 0;
                else PyList_SET_ITEM(texts, k, text);
            }
            if (ok)
                result = Py_BuildValue("(nOOOn)", (Py_ssize_t)t.n, columns, detail_columns,
                                       texts, closed_at);
        }
        Py_XDECREF(columns);
        Py_XDECREF(detail_columns);
        Py_XDECREF(texts);
    }
    table_free(&t);
    table_free(&d);
    interner_free(&names);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *arg_keys(PyObject *self, PyObject *unused) {
    PyObject *keys = PyTuple_New(N_ARG_KEYS);
    if (keys == NULL) return NULL;
    for (int k = 0; k < N_ARG_KEYS; k++) {
        PyObject *key = PyUnicode_FromString(ARG_KEYS[k].key);
        if (key == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyTuple_SET_ITEM(keys, k, key);
    }
    return keys;
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, start, stop, categories, skipped[, prefixes, op_code, link, waits,\n"
     "     wait_code])\n"
     "    -> (rows, columns, detail_columns, names, end, linked) | None\n\n"
     "Read the events after buffer[start] (an array's '[' or the comma before an event) up\n"
     "to buffer[stop] (taken as the array's ']'; stop < 0: up to the array's real ']',\n"
     "whose index is `end`). `categories` maps category bytes to a code (b'' is the code of\n"
     "metadata events); events of the phases in `skipped` are checked, not kept. Other\n"
     "phases than those, X, B, E and M give None. `columns` is a list of (name,\n"
     "arrow_schema, arrow_array) capsules, `detail_columns` those of the details table;\n"
     "`names` the distinct event names and detail texts as raw JSON\n"
     "string contents, indexed by the `name` column; `linked`: whether the `_launch`\n"
     "column may be used (no runtime call is a B/E event). None: the piece needs the\n"
     "msgspec decoder (invalid, or a shape not handled)."},
    {"arg_keys", arg_keys, METH_NOARGS, "The JSON names of the Args fields the scanner checks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_scan", "Kineto traceEvents straight into columns.", -1, METHODS,
};

PyMODINIT_FUNC PyInit__scan(void) {
    if (index_arg_keys() < 0) {
        PyErr_SetString(PyExc_ImportError, "_scan: too many Args keys share a hash bucket");
        return NULL;
    }
    return PyModule_Create(&MODULE);
}
