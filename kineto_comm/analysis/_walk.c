/* The critical-path walk's run along one rank (kineto_comm.analysis.depgraph._run): the same
 * loop as the Python one there, compiled, for paths of many kernels (a single-rank trace's
 * path holds tens of thousands). Optional: where it cannot be built, the Python loop gives
 * the same paths (tests/test_depgraph.py checks both). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define START 5 /* depgraph.VIA: stream, launch, stream_wait, collective, p2p, start */
#define WIDTH 6 /* a row of `out`: idx, start, end, via, path start, path end */

static PyObject *run(PyObject *self, PyObject *args) {
    Py_buffer b[8];
    Py_ssize_t pos, i;
    long long cursor, bound;
    int skip;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*w*w*nnLLp", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &b[7], &pos, &i, &cursor, &bound, &skip))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = b[0].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t cap = b[7].len / (Py_ssize_t)(WIDTH * sizeof(int64_t));
    const int64_t *start = b[0].buf, *end = b[1].buf, *pred = b[3].buf;
    const int64_t *late_rank = b[4].buf, *late_start = b[5].buf;
    const int8_t *via = b[2].buf;
    uint8_t *seen = b[6].buf;
    int64_t *out = b[7].buf;
    int state;
    if (b[1].len != b[0].len || b[3].len != b[0].len || b[4].len != b[0].len ||
        b[5].len != b[0].len || b[2].len != n || b[6].len != n || i < 0 || i >= n || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "run: arrays of unequal lengths or a bad position");
        goto done;
    }
    for (;;) {
        if (pos >= cap) {
            state = 2; /* out is full: resume at i */
            break;
        }
        seen[i] = 1;
        int64_t s = start[i];
        if (!skip && late_rank[i] >= 0 && s < late_start[i] && late_start[i] < cursor) {
            state = 1; /* it may cross to its late rank: the caller decides */
            break;
        }
        skip = 0;
        int8_t v = via[i];
        int64_t j = -1, t = 0;
        int next = 0;
        if (v != START) {
            j = pred[i];
            if (j >= 0 && j < n && !seen[j]) {
                int64_t m = s < cursor ? s : cursor;
                if (m < bound) m = bound;
                t = end[j] < m ? end[j] : m;
                next = t > bound;
            }
        }
        int64_t at = next ? t : bound;
        if (at > cursor) at = cursor;
        int64_t *row = out + pos * WIDTH;
        row[0] = i;
        row[1] = s;
        row[2] = end[i];
        row[3] = next ? v : START;
        row[4] = at;
        row[5] = cursor;
        pos++;
        if (!next) {
            state = 0; /* the path ends here */
            break;
        }
        i = (Py_ssize_t)j;
        cursor = t;
    }
    result = Py_BuildValue("nnnL", pos, (Py_ssize_t)state, i, cursor);
done:
    for (int k = 0; k < 8; k++) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef METHODS[] = {
    {"run", run, METH_VARARGS,
     "run(start, end, via, pred, late_rank, late_start, seen, out, pos, i, cursor, bound,\n"
     "    skip) -> (pos, state, i, cursor)\n\n"
     "One rank's arrays (int64; via int8), `seen` (uint8, written) and `out` (int64 rows of\n"
     "6, written from row `pos`): the walk from kernel i (depgraph._run)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_walk", "The critical-path walk along one rank, compiled.", -1,
    METHODS,
};

PyMODINIT_FUNC PyInit__walk(void) { return PyModule_Create(&MODULE); }
