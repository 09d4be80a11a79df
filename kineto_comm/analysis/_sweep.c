/* The replay's sweep over the exposed waits (kineto_comm.analysis.steptime._sweep): the same
 * loop as the Python one there, compiled, for jobs with many waits (a storm of small
 * collectives holds hundreds of thousands). Optional: where it cannot be built, the Python
 * loop gives the same numbers (tests/test_steptime.py checks both). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

static PyObject *sweep(PyObject *self, PyObject *args) {
    Py_buffer b[6];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*n", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &n))
        return NULL;
    PyObject *result = NULL;
    double *base = NULL, *seen = NULL, *out;
    Py_ssize_t m = b[0].len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *rank = b[0].buf, *late = b[1].buf;
    const double *wait = b[2].buf, *direct = b[3].buf, *own = b[4].buf, *theirs = b[5].buf;
    if (b[1].len != b[0].len || n < 0) goto bad;
    for (int k = 2; k < 6; k++)
        if (b[k].len / (Py_ssize_t)sizeof(double) != m) goto bad;
    for (Py_ssize_t i = 0; i < m; i++)
        if (rank[i] < 0 || rank[i] >= n || late[i] >= n) goto bad;
    result = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(double));
    base = calloc((size_t)n + 1, sizeof(double));
    seen = calloc((size_t)n + 1, sizeof(double));
    if (!result || !base || !seen) {
        Py_XDECREF(result);
        result = PyErr_NoMemory();
        goto done;
    }
    out = (double *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t y = rank[i], x = late[i];
        double before = base[y] + own[i] - seen[y];
        double now = x >= 0 ? base[x] + theirs[i] - seen[x] : 0.0;
        double mine = before + direct[i];
        double s = now > mine ? now : mine;
        double cap = before + wait[i];
        base[y] = out[i] = s < cap ? s : cap;
        seen[y] = own[i];
    }
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "sweep: arrays of unequal lengths or ranks out of range");
done:
    free(base);
    free(seen);
    for (int k = 0; k < 6; k++) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef METHODS[] = {
    {"sweep", sweep, METH_VARARGS,
     "sweep(rank, late, wait, direct, own, theirs, n) -> bytes\n\n"
     "rank, late: int64 buffers; wait, direct, own, theirs: float64 buffers of the same\n"
     "length; n: the number of ranks. The float64 shifts after each wait (steptime._sweep)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_sweep", "The replay's sweep over the waits, compiled.", -1, METHODS,
};

PyMODINIT_FUNC PyInit__sweep(void) { return PyModule_Create(&MODULE); }
