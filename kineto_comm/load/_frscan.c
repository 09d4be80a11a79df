/*
 * _frscan: read a Flight Recorder pickle dump straight into columns.
 *
 * The pure-Python path (flight.py) unpickles a dump with SafeUnpickler (a dict per entry,
 * a dozen objects inside each) and then reads those dicts a field at a time; on 2,000-entry
 * dumps most of its time goes into creating, reading and freeing those objects. This
 * scanner walks the pickle opcodes once into a light tree of C nodes, turns the top level
 * (version, pg_config, pg_status, ...) into the same plain Python objects, and writes each
 * entry's fields straight into columns: int64 buffers, and string codes into per-column
 * lists of distinct texts (what Polars gathers from in one go).
 *
 * It is an accelerator, not a second reader with its own rules. It knows only the opcodes
 * of plain data (PROTO, FRAME, the empty containers, MARK, SETITEM(S), APPEND(S), TUPLE*,
 * the unicode strings, the binary ints, BINFLOAT, NONE, the booleans, the memo and STOP):
 * it never imports or calls anything. For anything else (a class name, REDUCE, BUILD,
 * damage, a stream ending early, a field of a type it does not hold) scan() returns None
 * and flight.py reads the dump with SafeUnpickler as before, errors and all, so the refusal
 * text and every other error is the Python reader's, by construction.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------ nodes */

enum { K_NONE, K_TRUE, K_FALSE, K_INT, K_FLOAT, K_STR, K_LIST, K_TUPLE, K_DICT };

typedef struct Node {
    uint8_t kind;
    uint8_t ascii;   /* K_STR: only bytes < 0x80 */
    int16_t field;   /* K_STR as an entry key: the field index, -1 none, -2 not yet looked up */
    Py_ssize_t len;  /* K_STR: bytes */
    union {
        int64_t i;
        double f;
        const char *s;
    } v;
    struct Node **items; /* K_LIST / K_TUPLE: values; K_DICT: key, value, key, value ... */
    Py_ssize_t n, cap;
} Node;

static Node NODE_NONE = {K_NONE, 0, -1, 0, {0}, NULL, 0, 0};
static Node NODE_TRUE = {K_TRUE, 0, -1, 0, {0}, NULL, 0, 0};
static Node NODE_FALSE = {K_FALSE, 0, -1, 0, {0}, NULL, 0, 0};

#define BLOCK 1024
typedef struct Block {
    struct Block *next;
    Py_ssize_t used;
    Node nodes[BLOCK];
} Block;

/* Nesting deeper than this (or a container holding itself) is left to the Python reader. */
#define MAX_DEPTH 64
/* A memo index above this is left to the Python reader. */
#define MAX_MEMO (1 << 24)

/* Container items come from big chunks (freed together): a container that grows takes a
 * bigger run and leaves the old one unused, which is cheaper than a malloc per container. */
#define CHUNK 8192
typedef struct Chunk {
    struct Chunk *next;
    Py_ssize_t used, cap;
    Node *items[];
} Chunk;

typedef struct {
    const unsigned char *p, *end;
    Node **stack;
    Py_ssize_t sn, scap;
    Py_ssize_t *marks;
    Py_ssize_t mn, mcap;
    Node **memo;
    Py_ssize_t memo_cap, memo_len;
    Block *blocks;
    Chunk *chunks;
} Parser;

/* Every failure below is "not for this scanner" (return 0/NULL with no exception set), or
 * out of memory (a Python exception set). */

/* Blocks, chunks and the memo of one scan are kept for the next (the GIL is held throughout
 * a scan, so no two use them at once): fresh memory for each dump cost ~600 page faults and
 * about a third of the scan's time. At most ~18 MB is kept. */
#define KEEP_BLOCKS 256
#define KEEP_CHUNKS 64
static Block *spare_blocks;
static Py_ssize_t n_spare_blocks;
static struct Chunk *spare_chunks;
static Py_ssize_t n_spare_chunks;
static Node **spare_memo;
static Py_ssize_t spare_memo_cap;

static Node *new_node(Parser *ps, uint8_t kind) {
    if (!ps->blocks || ps->blocks->used == BLOCK) {
        Block *b = spare_blocks;
        if (b) {
            spare_blocks = b->next;
            n_spare_blocks--;
        } else {
            b = malloc(sizeof(Block));
        }
        if (!b) {
            PyErr_NoMemory();
            return NULL;
        }
        b->next = ps->blocks;
        b->used = 0;
        ps->blocks = b;
    }
    Node *n = &ps->blocks->nodes[ps->blocks->used++];
    n->kind = kind;
    n->ascii = 0;
    n->field = -2;
    n->len = 0;
    n->v.i = 0;
    n->items = NULL;
    n->n = n->cap = 0;
    return n;
}

static void free_parser(Parser *ps) {
    Block *b = ps->blocks;
    while (b) {
        Block *next = b->next;
        if (n_spare_blocks < KEEP_BLOCKS) {
            b->next = spare_blocks;
            spare_blocks = b;
            n_spare_blocks++;
        } else {
            free(b);
        }
        b = next;
    }
    Chunk *c = ps->chunks;
    while (c) {
        Chunk *next = c->next;
        if (c->cap == CHUNK && n_spare_chunks < KEEP_CHUNKS) {
            c->next = spare_chunks;
            spare_chunks = c;
            n_spare_chunks++;
        } else {
            free(c);
        }
        c = next;
    }
    free(ps->stack);
    free(ps->marks);
    if (ps->memo_cap > spare_memo_cap) {
        free(spare_memo);
        spare_memo = ps->memo;
        spare_memo_cap = ps->memo_cap;
    } else {
        free(ps->memo);
    }
}

static int grow(void **arr, Py_ssize_t *cap, Py_ssize_t need, size_t size) {
    if (need <= *cap)
        return 1;
    Py_ssize_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *a = realloc(*arr, (size_t)c * size);
    if (!a) {
        PyErr_NoMemory();
        return 0;
    }
    *arr = a;
    *cap = c;
    return 1;
}

static int push(Parser *ps, Node *n) {
    if (!n || !grow((void **)&ps->stack, &ps->scap, ps->sn + 1, sizeof(Node *)))
        return 0;
    ps->stack[ps->sn++] = n;
    return 1;
}

static int add_items(Parser *ps, Node *c, Node **items, Py_ssize_t k) {
    if (c->n + k > c->cap) {
        Py_ssize_t cap = c->cap ? c->cap : 4;
        while (cap < c->n + k)
            cap *= 2;
        Chunk *ch = ps->chunks;
        if (!ch || ch->cap - ch->used < cap) {
            Py_ssize_t size = cap > CHUNK ? cap : CHUNK;
            if (size == CHUNK && spare_chunks) {
                ch = spare_chunks;
                spare_chunks = ch->next;
                n_spare_chunks--;
            } else {
                ch = malloc(sizeof(Chunk) + (size_t)size * sizeof(Node *));
            }
            if (!ch) {
                PyErr_NoMemory();
                return 0;
            }
            ch->cap = size;
            ch->used = 0;
            /* a chunk of one big container goes behind the current one, which has room */
            if (size > CHUNK && ps->chunks) {
                ch->next = ps->chunks->next;
                ps->chunks->next = ch;
            } else {
                ch->next = ps->chunks;
                ps->chunks = ch;
            }
        }
        Node **to = ch->items + ch->used;
        ch->used += cap;
        if (c->n)
            memcpy(to, c->items, (size_t)c->n * sizeof(Node *));
        c->items = to;
        c->cap = cap;
    }
    memcpy(c->items + c->n, items, (size_t)k * sizeof(Node *));
    c->n += k;
    return 1;
}

static Py_ssize_t fence(Parser *ps) { return ps->mn ? ps->marks[ps->mn - 1] : 0; }

/* The stack index of the last MARK, popped; -1 if there is none. */
static Py_ssize_t pop_mark(Parser *ps) { return ps->mn ? ps->marks[--ps->mn] : -1; }

static int hashable(Node *n, int depth) {
    if (depth > MAX_DEPTH)
        return 0;
    switch (n->kind) {
    case K_LIST:
    case K_DICT:
        return 0;
    case K_TUPLE:
        for (Py_ssize_t i = 0; i < n->n; i++)
            if (!hashable(n->items[i], depth + 1))
                return 0;
        return 1;
    default:
        return 1;
    }
}

static int need(Parser *ps, Py_ssize_t k) { return ps->end - ps->p >= k; }

static uint64_t le_uint(const unsigned char *s, int k) {
    uint64_t x = 0;
    for (int i = k - 1; i >= 0; i--)
        x = (x << 8) | s[i];
    return x;
}

static int memo_put(Parser *ps, Py_ssize_t idx) {
    if (ps->sn <= fence(ps) || idx < 0 || idx > MAX_MEMO)
        return 0;
    if (idx >= ps->memo_cap) {
        Py_ssize_t old = ps->memo_cap;
        if (!grow((void **)&ps->memo, &ps->memo_cap, idx + 1, sizeof(Node *)))
            return 0;
        memset(ps->memo + old, 0, (size_t)(ps->memo_cap - old) * sizeof(Node *));
    }
    if (!ps->memo[idx])
        ps->memo_len++;
    ps->memo[idx] = ps->stack[ps->sn - 1];
    return 1;
}

static int string_op(Parser *ps, int width) {
    if (!need(ps, width))
        return 0;
    uint64_t len = le_uint(ps->p, width);
    ps->p += width;
    if ((uint64_t)(ps->end - ps->p) < len)
        return 0;
    Node *n = new_node(ps, K_STR);
    if (!n)
        return 0;
    n->v.s = (const char *)ps->p;
    n->len = (Py_ssize_t)len;
    n->ascii = 1;
    for (uint64_t i = 0; i < len; i++)
        if (ps->p[i] & 0x80) {
            n->ascii = 0;
            break;
        }
    if (!n->ascii) { /* as pickle decodes it: UTF-8, surrogates allowed */
        PyObject *u = PyUnicode_DecodeUTF8(n->v.s, n->len, "surrogatepass");
        if (!u) {
            PyErr_Clear();
            return 0;
        }
        Py_DECREF(u);
    }
    ps->p += len;
    return push(ps, n);
}

static int int_node(Parser *ps, int64_t x) {
    Node *n = new_node(ps, K_INT);
    if (!n)
        return 0;
    n->v.i = x;
    return push(ps, n);
}

/* Run the opcodes to STOP; the object STOP returns, or NULL (no exception: not for us). */
static Node *parse(Parser *ps) {
    while (ps->p < ps->end) {
        unsigned char op = *ps->p++;
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(ps, 1) || *ps->p > 5)
                return NULL;
            ps->p++;
            break;
        case 0x95: /* FRAME */
            if (!need(ps, 8) || le_uint(ps->p, 8) > (uint64_t)(ps->end - ps->p - 8))
                return NULL;
            ps->p += 8;
            break;
        case '}':
            if (!push(ps, new_node(ps, K_DICT)))
                return NULL;
            break;
        case ']':
            if (!push(ps, new_node(ps, K_LIST)))
                return NULL;
            break;
        case ')':
            if (!push(ps, new_node(ps, K_TUPLE)))
                return NULL;
            break;
        case '(':
            if (!grow((void **)&ps->marks, &ps->mcap, ps->mn + 1, sizeof(Py_ssize_t)))
                return NULL;
            ps->marks[ps->mn++] = ps->sn;
            break;
        case 's': /* SETITEM */
        case 'u': /* SETITEMS */ {
            Py_ssize_t x = op == 's' ? ps->sn - 2 : pop_mark(ps);
            if (x < 0 || x > ps->sn || x <= fence(ps) || (ps->sn - x) % 2)
                return NULL;
            Node *d = ps->stack[x - 1];
            if (d->kind != K_DICT)
                return NULL;
            for (Py_ssize_t i = x; i < ps->sn; i += 2)
                if (!hashable(ps->stack[i], 0))
                    return NULL;
            if (!add_items(ps, d, ps->stack + x, ps->sn - x))
                return NULL;
            ps->sn = x;
            break;
        }
        case 'a': /* APPEND */
        case 'e': /* APPENDS */ {
            Py_ssize_t x = op == 'a' ? ps->sn - 1 : pop_mark(ps);
            if (x < 0 || x > ps->sn || x <= fence(ps))
                return NULL;
            Node *l = ps->stack[x - 1];
            if (l->kind != K_LIST || !add_items(ps, l, ps->stack + x, ps->sn - x))
                return NULL;
            ps->sn = x;
            break;
        }
        case 't': /* TUPLE */
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */ {
            Py_ssize_t x = op == 't' ? pop_mark(ps) : ps->sn - (op - 0x84);
            if (x < 0 || x > ps->sn || x < fence(ps))
                return NULL;
            Node *t = new_node(ps, K_TUPLE);
            if (!t || !add_items(ps, t, ps->stack + x, ps->sn - x))
                return NULL;
            ps->sn = x;
            if (!push(ps, t))
                return NULL;
            break;
        }
        case 'X': /* BINUNICODE */
            if (!string_op(ps, 4))
                return NULL;
            break;
        case 0x8c: /* SHORT_BINUNICODE */
            if (!string_op(ps, 1))
                return NULL;
            break;
        case 0x8d: /* BINUNICODE8 */
            if (!string_op(ps, 8))
                return NULL;
            break;
        case 'J': /* BININT */
            if (!need(ps, 4) || !int_node(ps, (int32_t)(uint32_t)le_uint(ps->p, 4)))
                return NULL;
            ps->p += 4;
            break;
        case 'K': /* BININT1 */
            if (!need(ps, 1) || !int_node(ps, ps->p[0]))
                return NULL;
            ps->p += 1;
            break;
        case 'M': /* BININT2 */
            if (!need(ps, 2) || !int_node(ps, (int64_t)le_uint(ps->p, 2)))
                return NULL;
            ps->p += 2;
            break;
        case 0x8a: { /* LONG1: up to 8 bytes here (an int64); longer is left to Python */
            if (!need(ps, 1))
                return NULL;
            int k = ps->p[0];
            if (k > 8 || !need(ps, 1 + k))
                return NULL;
            uint64_t x = le_uint(ps->p + 1, k);
            if (k && k < 8 && (ps->p[k] & 0x80))
                x |= ~(uint64_t)0 << (8 * k);
            if (!int_node(ps, (int64_t)x))
                return NULL;
            ps->p += 1 + k;
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE double */
            if (!need(ps, 8))
                return NULL;
            Node *n = new_node(ps, K_FLOAT);
            if (!n)
                return NULL;
            n->v.f = PyFloat_Unpack8((const char *)ps->p, 0);
            if (n->v.f == -1.0 && PyErr_Occurred())
                return NULL;
            ps->p += 8;
            if (!push(ps, n))
                return NULL;
            break;
        }
        case 'N':
            if (!push(ps, &NODE_NONE))
                return NULL;
            break;
        case 0x88:
            if (!push(ps, &NODE_TRUE))
                return NULL;
            break;
        case 0x89:
            if (!push(ps, &NODE_FALSE))
                return NULL;
            break;
        case 0x94: /* MEMOIZE */
            if (!memo_put(ps, ps->memo_len))
                return NULL;
            break;
        case 'q': /* BINPUT */
            if (!need(ps, 1) || !memo_put(ps, ps->p[0]))
                return NULL;
            ps->p += 1;
            break;
        case 'r': /* LONG_BINPUT */
            if (!need(ps, 4) || !memo_put(ps, (Py_ssize_t)le_uint(ps->p, 4)))
                return NULL;
            ps->p += 4;
            break;
        case 'h': /* BINGET */
        case 'j': /* LONG_BINGET */ {
            int k = op == 'h' ? 1 : 4;
            if (!need(ps, k))
                return NULL;
            uint64_t idx = le_uint(ps->p, k);
            ps->p += k;
            if (idx >= (uint64_t)ps->memo_cap || !ps->memo[idx] || !push(ps, ps->memo[idx]))
                return NULL;
            break;
        }
        case '.': /* STOP */
            return ps->sn > fence(ps) ? ps->stack[ps->sn - 1] : NULL;
        default: /* a class, a call, another protocol's opcode: the Python reader's to judge */
            return NULL;
        }
    }
    return NULL; /* ran out before STOP */
}

/* ------------------------------------------------------------------ top level objects */

static PyObject *to_py(Node *n, int depth) {
    if (depth > MAX_DEPTH)
        return NULL;
    switch (n->kind) {
    case K_NONE:
        Py_RETURN_NONE;
    case K_TRUE:
        Py_RETURN_TRUE;
    case K_FALSE:
        Py_RETURN_FALSE;
    case K_INT:
        return PyLong_FromLongLong(n->v.i);
    case K_FLOAT:
        return PyFloat_FromDouble(n->v.f);
    case K_STR:
        return PyUnicode_DecodeUTF8(n->v.s, n->len, "surrogatepass");
    case K_LIST:
    case K_TUPLE: {
        PyObject *out = n->kind == K_LIST ? PyList_New(n->n) : PyTuple_New(n->n);
        if (!out)
            return NULL;
        for (Py_ssize_t i = 0; i < n->n; i++) {
            PyObject *x = to_py(n->items[i], depth + 1);
            if (!x) {
                Py_DECREF(out);
                return NULL;
            }
            if (n->kind == K_LIST)
                PyList_SET_ITEM(out, i, x);
            else
                PyTuple_SET_ITEM(out, i, x);
        }
        return out;
    }
    case K_DICT: {
        PyObject *out = PyDict_New();
        if (!out)
            return NULL;
        for (Py_ssize_t i = 0; i + 1 < n->n; i += 2) {
            PyObject *k = to_py(n->items[i], depth + 1);
            PyObject *v = k ? to_py(n->items[i + 1], depth + 1) : NULL;
            int bad = !v || PyDict_SetItem(out, k, v) < 0;
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (bad) {
                Py_DECREF(out);
                return NULL;
            }
        }
        return out;
    }
    }
    return NULL;
}

static int str_is(Node *n, const char *s) {
    size_t k = strlen(s);
    return n->kind == K_STR && (size_t)n->len == k && memcmp(n->v.s, s, k) == 0;
}

/* ---------------------------------------------------------------------- entry columns */

/* The entry fields read (flight.py's entries_frame reads the same ones). */
static const char *FIELDS[] = {
    /* int64 columns */
    "record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms",
    /* the rest */
    "pg_id", "process_group", "profiling_name", "input_sizes", "output_sizes", "input_dtypes",
    "output_dtypes", "state", "is_p2p", "retired", "thread_id", "thread_name", "frames",
};
enum {
    N_INTS = 8,
    F_PG_ID = 8, F_GROUP, F_NAME, F_IN_SIZES, F_OUT_SIZES, F_IN_DTYPES, F_OUT_DTYPES, F_STATE,
    F_IS_P2P, F_RETIRED, F_THREAD_ID, F_THREAD_NAME, F_FRAMES, N_FIELDS
};
/* String columns, each as codes into its distinct texts (code 0: null). */
enum {
    S_PG_ID, S_GROUP, S_DESC, S_NAME, S_IN_SIZES, S_OUT_SIZES, S_IN_DTYPES, S_OUT_DTYPES,
    S_STATE, S_THREAD_ID, S_THREAD_NAME, N_STRS
};
static const char *STR_COLUMNS[] = {
    "pg_id", "process_group", "group_desc", "profiling_name", "input_sizes", "output_sizes",
    "input_dtypes", "output_dtypes", "state", "thread_id", "thread_name",
};

static int field_of(Node *key) {
    if (key->kind != K_STR)
        return -1;
    if (key->field == -2) {
        key->field = -1;
        for (int f = 0; f < N_FIELDS; f++)
            if (str_is(key, FIELDS[f])) {
                key->field = (int16_t)f;
                break;
            }
    }
    return key->field;
}

/* Distinct texts of a column: an open-addressing table over a byte pool. */
typedef struct {
    char *pool;
    Py_ssize_t pool_n, pool_cap;
    Py_ssize_t *off, *len; /* by code - 1 */
    Py_ssize_t count, list_cap;
    int32_t *slots; /* code, 0 = empty */
    Py_ssize_t nslots;
    int32_t recent[2]; /* the last two codes given: rows repeat or alternate their values */
} Interner;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int32_t intern_new(Interner *t, const char *s, Py_ssize_t n);

static int same_text(Interner *t, int32_t c, const char *s, Py_ssize_t n) {
    return c && t->len[c - 1] == n && memcmp(t->pool + t->off[c - 1], s, (size_t)n) == 0;
}

static int32_t intern(Interner *t, const char *s, Py_ssize_t n) {
    if (same_text(t, t->recent[0], s, n))
        return t->recent[0];
    if (same_text(t, t->recent[1], s, n)) {
        int32_t c = t->recent[1];
        t->recent[1] = t->recent[0];
        t->recent[0] = c;
        return c;
    }
    int32_t c = intern_new(t, s, n);
    if (c > 0) {
        t->recent[1] = t->recent[0];
        t->recent[0] = c;
    }
    return c;
}

static int32_t intern_new(Interner *t, const char *s, Py_ssize_t n) {
    if ((t->count + 1) * 2 > t->nslots) {
        Py_ssize_t ns = t->nslots ? t->nslots * 2 : 64;
        int32_t *slots = calloc((size_t)ns, sizeof(int32_t));
        if (!slots) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t c = 1; c <= t->count; c++) {
            uint64_t h = hash_bytes(t->pool + t->off[c - 1], t->len[c - 1]);
            Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(ns - 1));
            while (slots[j])
                j = (j + 1) & (ns - 1);
            slots[j] = (int32_t)c;
        }
        free(t->slots);
        t->slots = slots;
        t->nslots = ns;
    }
    uint64_t h = hash_bytes(s, n);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->nslots - 1));
    while (t->slots[j]) {
        int32_t c = t->slots[j];
        if (t->len[c - 1] == n && memcmp(t->pool + t->off[c - 1], s, (size_t)n) == 0)
            return c;
        j = (j + 1) & (t->nslots - 1);
    }
    if (!grow((void **)&t->pool, &t->pool_cap, t->pool_n + n + 1, 1))
        return -1;
    Py_ssize_t cap = t->list_cap;
    if (!grow((void **)&t->off, &cap, t->count + 1, sizeof(Py_ssize_t)))
        return -1;
    cap = t->list_cap;
    if (!grow((void **)&t->len, &cap, t->count + 1, sizeof(Py_ssize_t)))
        return -1;
    t->list_cap = cap;
    memcpy(t->pool + t->pool_n, s, (size_t)n);
    t->off[t->count] = t->pool_n;
    t->len[t->count] = n;
    t->pool_n += n;
    t->count++;
    t->slots[j] = (int32_t)t->count;
    return (int32_t)t->count;
}

/* [None, text 1, text 2, ...]: the column's distinct texts by code. */
static PyObject *texts_of(Interner *t) {
    PyObject *out = PyList_New(t->count + 1);
    if (!out)
        return NULL;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(out, 0, Py_None);
    for (Py_ssize_t c = 0; c < t->count; c++) {
        PyObject *s = PyUnicode_DecodeUTF8(t->pool + t->off[c], t->len[c], "surrogatepass");
        if (!s) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, c + 1, s);
    }
    return out;
}

static void free_interner(Interner *t) {
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->slots);
}

/* A growable text being written. */
typedef struct {
    char *s;
    Py_ssize_t n, cap;
} Text;

static int put(Text *b, const char *s, Py_ssize_t n) {
    if (!grow((void **)&b->s, &b->cap, b->n + n, 1))
        return 0;
    memcpy(b->s + b->n, s, (size_t)n);
    b->n += n;
    return 1;
}

static int put_int(Text *b, int64_t x) {
    char tmp[24];
    int k = sizeof tmp;
    uint64_t u = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
    do {
        tmp[--k] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (x < 0)
        tmp[--k] = '-';
    return put(b, tmp + k, (Py_ssize_t)sizeof tmp - k);
}

/* Python's str() of a node, for the kinds whose str() this writes exactly; 0 otherwise. */
static int put_str(Text *b, Node *n) {
    switch (n->kind) {
    case K_STR:
        return put(b, n->v.s, n->len);
    case K_INT:
        return put_int(b, n->v.i);
    case K_NONE:
        return put(b, "None", 4);
    case K_TRUE:
        return put(b, "True", 4);
    case K_FALSE:
        return put(b, "False", 5);
    default:
        return 0;
    }
}

/* Python's repr() of ints, None, booleans and lists and tuples of them; 0 otherwise. */
static int put_repr(Text *b, Node *n, int depth) {
    if (depth > MAX_DEPTH)
        return 0;
    if (n->kind != K_LIST && n->kind != K_TUPLE)
        return n->kind != K_STR && put_str(b, n);
    if (!put(b, n->kind == K_LIST ? "[" : "(", 1))
        return 0;
    for (Py_ssize_t i = 0; i < n->n; i++)
        if ((i && !put(b, ", ", 2)) || !put_repr(b, n->items[i], depth + 1))
            return 0;
    if (n->kind == K_TUPLE && n->n == 1 && !put(b, ",", 1))
        return 0;
    return put(b, n->kind == K_LIST ? "]" : ")", 1);
}

/* bool() of a node for the kinds this knows; -1 otherwise. */
static int truth(Node *n) {
    switch (n->kind) {
    case K_NONE:
    case K_FALSE:
        return 0;
    case K_TRUE:
        return 1;
    case K_INT:
        return n->v.i != 0;
    default:
        return -1;
    }
}

typedef struct {
    Py_ssize_t n;
    PyObject *ints[N_INTS], *valid[N_INTS]; /* bytes: int64 values, uint8 0/1 */
    PyObject *codes[N_STRS];                /* bytes: int32 */
    Interner strs[N_STRS];
    PyObject *is_p2p, *retired; /* bytes: uint8; is_p2p 2 = not recorded */
    PyObject *frames_at, *frames; /* the entries not completed: index, frames object */
} Columns;

static void free_columns(Columns *c) {
    for (int i = 0; i < N_INTS; i++) {
        Py_XDECREF(c->ints[i]);
        Py_XDECREF(c->valid[i]);
    }
    for (int i = 0; i < N_STRS; i++) {
        Py_XDECREF(c->codes[i]);
        free_interner(&c->strs[i]);
    }
    Py_XDECREF(c->is_p2p);
    Py_XDECREF(c->retired);
    Py_XDECREF(c->frames_at);
    Py_XDECREF(c->frames);
}

#define BUF(obj) PyBytes_AS_STRING(obj)

/* Intern the text written so far as column s's value at row i; 0 on failure. */
static int code(Columns *c, Text *b, int s, Py_ssize_t i) {
    int32_t k = intern(&c->strs[s], b->s ? b->s : "", b->n);
    if (k < 0)
        return 0;
    ((int32_t *)BUF(c->codes[s]))[i] = k;
    b->n = 0;
    return 1;
}

/* One entry's fields into row i; 0 when a field is of a type this does not write
 * (the Python reader then reads the whole dump). */
static int entry_row(Columns *c, Node *e, Py_ssize_t i, Text *b) {
    Node *f[N_FIELDS] = {NULL};
    for (Py_ssize_t j = 0; j + 1 < e->n; j += 2) {
        int k = field_of(e->items[j]);
        if (k >= 0)
            f[k] = e->items[j + 1]; /* a repeated key: the last value, as in a dict */
    }
    if (!f[F_NAME] || !f[F_GROUP])
        return 0; /* not an FR entry: the Python reader says so */
    for (int k = 0; k < N_INTS; k++) {
        Node *v = f[k];
        int ok = v && v->kind == K_INT;
        if (v && !ok && v->kind != K_NONE)
            return 0;
        ((int64_t *)BUF(c->ints[k]))[i] = ok ? v->v.i : 0;
        ((uint8_t *)BUF(c->valid[k]))[i] = (uint8_t)ok;
    }
    /* pg_id: str(e.get("pg_id")) */
    if (!put_str(b, f[F_PG_ID] ? f[F_PG_ID] : &NODE_NONE) || !code(c, b, S_PG_ID, i))
        return 0;
    /* process_group: (name, desc), or ("?", "") when missing or empty */
    Node *g = f[F_GROUP];
    if (g->kind == K_NONE || ((g->kind == K_LIST || g->kind == K_TUPLE) && g->n == 0)) {
        if (!put(b, "?", 1) || !code(c, b, S_GROUP, i) || !code(c, b, S_DESC, i))
            return 0;
    } else if (g->kind == K_LIST || g->kind == K_TUPLE) {
        if (!put_str(b, g->items[0]) || !code(c, b, S_GROUP, i))
            return 0;
        if ((g->n > 1 && !put_str(b, g->items[1])) || !code(c, b, S_DESC, i))
            return 0;
    } else {
        return 0;
    }
    if (!put_str(b, f[F_NAME]) || !code(c, b, S_NAME, i))
        return 0;
    /* sizes: repr(), parsed once per distinct text by flight.py */
    for (int k = 0; k < 2; k++) {
        Node *v = f[F_IN_SIZES + k];
        if (!put_repr(b, v ? v : &NODE_NONE, 0) || !code(c, b, S_IN_SIZES + k, i))
            return 0;
    }
    /* dtypes: ",".join(v) if v else "" */
    for (int k = 0; k < 2; k++) {
        Node *v = f[F_IN_DTYPES + k];
        if (v && (v->kind == K_LIST || v->kind == K_TUPLE)) {
            for (Py_ssize_t j = 0; j < v->n; j++)
                if (v->items[j]->kind != K_STR || (j && !put(b, ",", 1)) ||
                    !put(b, v->items[j]->v.s, v->items[j]->len))
                    return 0;
        } else if (v && truth(v) != 0) {
            return 0;
        }
        if (!code(c, b, S_IN_DTYPES + k, i))
            return 0;
    }
    /* state: str(e.get("state", "")) */
    if ((f[F_STATE] && !put_str(b, f[F_STATE])))
        return 0;
    int completed = b->n == 9 && memcmp(b->s, "completed", 9) == 0;
    if (!code(c, b, S_STATE, i))
        return 0;
    /* is_p2p: bool() where recorded; retired: bool(e.get("retired", False)) */
    int p2p = f[F_IS_P2P] ? truth(f[F_IS_P2P]) : 2;
    int retired = f[F_RETIRED] ? truth(f[F_RETIRED]) : 0;
    if (p2p < 0 || retired < 0)
        return 0;
    ((uint8_t *)BUF(c->is_p2p))[i] = (uint8_t)p2p;
    ((uint8_t *)BUF(c->retired))[i] = (uint8_t)retired;
    /* thread_id: None, else str(); thread_name: a string or None */
    Node *t = f[F_THREAD_ID];
    if (t && t->kind != K_NONE) {
        if (!put_str(b, t) || !code(c, b, S_THREAD_ID, i))
            return 0;
    } else {
        ((int32_t *)BUF(c->codes[S_THREAD_ID]))[i] = 0;
    }
    t = f[F_THREAD_NAME];
    if (t && t->kind == K_STR) {
        if (!put(b, t->v.s, t->len) || !code(c, b, S_THREAD_NAME, i))
            return 0;
    } else if (t && t->kind != K_NONE) {
        return 0;
    } else {
        ((int32_t *)BUF(c->codes[S_THREAD_NAME]))[i] = 0;
    }
    /* frames: only of entries not completed (flight.py prints them) */
    if (!completed) {
        PyObject *at = PyLong_FromSsize_t(i);
        PyObject *fr = f[F_FRAMES] ? to_py(f[F_FRAMES], 0) : (Py_INCREF(Py_None), Py_None);
        int bad = !at || !fr || PyList_Append(c->frames_at, at) < 0 ||
                  PyList_Append(c->frames, fr) < 0;
        Py_XDECREF(at);
        Py_XDECREF(fr);
        if (bad)
            return 0;
    }
    return 1;
}

static PyObject *columns_dict(Columns *c) {
    PyObject *out = PyDict_New();
    if (!out)
        return NULL;
    PyObject *ints = PyDict_New(), *strs = PyDict_New();
    int bad = !ints || !strs;
    for (int k = 0; !bad && k < N_INTS; k++) {
        PyObject *pair = PyTuple_Pack(2, c->ints[k], c->valid[k]);
        bad = !pair || PyDict_SetItemString(ints, FIELDS[k], pair) < 0;
        Py_XDECREF(pair);
    }
    for (int k = 0; !bad && k < N_STRS; k++) {
        PyObject *texts = texts_of(&c->strs[k]);
        PyObject *pair = texts ? PyTuple_Pack(2, c->codes[k], texts) : NULL;
        bad = !pair || PyDict_SetItemString(strs, STR_COLUMNS[k], pair) < 0;
        Py_XDECREF(texts);
        Py_XDECREF(pair);
    }
    PyObject *n = bad ? NULL : PyLong_FromSsize_t(c->n);
    bad = bad || !n || PyDict_SetItemString(out, "n", n) < 0 ||
          PyDict_SetItemString(out, "ints", ints) < 0 ||
          PyDict_SetItemString(out, "strings", strs) < 0 ||
          PyDict_SetItemString(out, "is_p2p", c->is_p2p) < 0 ||
          PyDict_SetItemString(out, "retired", c->retired) < 0 ||
          PyDict_SetItemString(out, "frames_at", c->frames_at) < 0 ||
          PyDict_SetItemString(out, "frames", c->frames) < 0;
    Py_XDECREF(n);
    Py_XDECREF(ints);
    Py_XDECREF(strs);
    if (bad) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *entries_columns(Node *list) {
    Columns c;
    memset(&c, 0, sizeof c);
    Text b = {NULL, 0, 0};
    PyObject *out = NULL;
    Py_ssize_t n = c.n = list->n;
    int ok = 1;
    for (int k = 0; ok && k < N_INTS; k++) {
        c.ints[k] = PyBytes_FromStringAndSize(NULL, n * 8);
        c.valid[k] = PyBytes_FromStringAndSize(NULL, n);
        ok = c.ints[k] && c.valid[k];
    }
    for (int k = 0; ok && k < N_STRS; k++)
        ok = (c.codes[k] = PyBytes_FromStringAndSize(NULL, n * 4)) != NULL;
    ok = ok && (c.is_p2p = PyBytes_FromStringAndSize(NULL, n)) &&
         (c.retired = PyBytes_FromStringAndSize(NULL, n)) && (c.frames_at = PyList_New(0)) &&
         (c.frames = PyList_New(0));
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = list->items[i]->kind == K_DICT && entry_row(&c, list->items[i], i, &b);
    if (ok)
        out = columns_dict(&c);
    free(b.s);
    free_columns(&c);
    return out;
}

/* ------------------------------------------------------------------------------ scan */

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    Parser ps;
    memset(&ps, 0, sizeof ps);
    if (spare_memo) { /* the last scan's memo, cleared */
        ps.memo = spare_memo;
        ps.memo_cap = spare_memo_cap;
        memset(ps.memo, 0, (size_t)ps.memo_cap * sizeof(Node *));
        spare_memo = NULL;
        spare_memo_cap = 0;
    }
    ps.p = view.buf;
    ps.end = ps.p + view.len;
    PyObject *result = NULL, *top = NULL, *cols = NULL;
    Node *root = parse(&ps);
    if (!root || root->kind != K_DICT)
        goto done;
    Node *entries = NULL;
    for (Py_ssize_t i = 0; i + 1 < root->n; i += 2)
        if (str_is(root->items[i], "entries"))
            entries = root->items[i + 1];
    if (!entries || entries->kind != K_LIST)
        goto done;
    /* The top level as plain objects, its entries an empty list (they are the columns). */
    if (!(top = PyDict_New()))
        goto done;
    for (Py_ssize_t i = 0; i + 1 < root->n; i += 2) {
        PyObject *k = to_py(root->items[i], 1);
        PyObject *v = !k                                  ? NULL
                      : str_is(root->items[i], "entries") ? PyList_New(0)
                                                          : to_py(root->items[i + 1], 1);
        int bad = !v || PyDict_SetItem(top, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad)
            goto done;
    }
    if (!(cols = entries_columns(entries)))
        goto done;
    result = PyTuple_Pack(2, top, cols);
done:
    Py_XDECREF(top);
    Py_XDECREF(cols);
    free_parser(&ps);
    PyBuffer_Release(&view);
    if (!result) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
            PyErr_Clear(); /* a value Python cannot build either: the Python reader tells */
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return result;
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data) -> (top, columns) | None\n\n"
     "A Flight Recorder pickle dump read without running any pickle code: `top`, the dump's\n"
     "dict with `entries` emptied, and `columns`: n, ints {field: (int64 bytes, valid uint8\n"
     "bytes)}, strings {column: (int32 code bytes, [None, text, ...])}, is_p2p (uint8 bytes,\n"
     "2 = not recorded), retired (uint8 bytes), frames_at and frames (the entries not\n"
     "completed). None when the bytes hold anything else (an opcode of objects or calls,\n"
     "damage, a value of a type not written here): read them with SafeUnpickler."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_frscan", "Flight Recorder pickle dumps straight into columns.", -1,
    METHODS,
};

PyMODINIT_FUNC PyInit__frscan(void) { return PyModule_Create(&MODULE); }
