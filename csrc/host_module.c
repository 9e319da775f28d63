/* The Python module over csrc/host_kernels.c: nestbatch.kernels.host_library compiles this file
 * (which includes the kernels) into an extension module on first use.
 *
 * Why a module rather than ctypes: a ctypes call converts each argument through its argtypes
 * (about 1 us for eight), the C-API reads them with PyLong_AsLongLong (0.2 us in all); and
 * host_sizes checks a list of Python ints and sums it in one pass (512 sizes: 2 us, where
 * Python's type check, array conversion and reductions take 30 us).
 *
 * Every kernel function takes Python ints: the index width in bytes (8 or 4: the int64 or int32
 * variant), then the kernel's own arguments in order, pointers as addresses (0 or None: NULL).
 * It returns the kernel's code: 0, or -1 where the input is outside the kernel's contract. The
 * GIL is released while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "host_kernels.c"

/* The n Python int arguments as long longs (None: 0); -1 with a TypeError / OverflowError set
 * on a wrong count or a non-int. */
static int read_ints(PyObject *const *args, Py_ssize_t given, Py_ssize_t expected,
                     long long *out) {
  if (given != expected) {
    PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", expected, given);
    return -1;
  }
  for (Py_ssize_t i = 0; i < given; ++i) {
    if (args[i] == Py_None) {
      out[i] = 0;
      continue;
    }
    out[i] = PyLong_AsLongLong(args[i]);
    if (out[i] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

#define P(i) ((void *)(intptr_t)a[i])
#define RUN(call)                        \
  int code;                              \
  Py_BEGIN_ALLOW_THREADS code = (call);  \
  Py_END_ALLOW_THREADS return PyLong_FromLong(code)

/* index_bytes, values, total, offsets, batch, width, row_bytes, pattern, out */
static PyObject *packed_to_padded(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long long a[9];
  if (read_ints(args, n, 9, a)) return NULL;
  RUN(a[0] == 8 ? nb_packed_to_padded_i64(P(1), a[2], P(3), a[4], a[5], a[6], P(7), P(8))
                : nb_packed_to_padded_i32(P(1), a[2], P(3), a[4], a[5], a[6], P(7), P(8)));
}

/* index_bytes, data, batch, width, row_bytes, offsets, total, out */
static PyObject *padded_to_packed(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long long a[8];
  if (read_ints(args, n, 8, a)) return NULL;
  RUN(a[0] == 8 ? nb_padded_to_packed_i64(P(1), a[2], a[3], a[4], P(5), a[6], P(7))
                : nb_padded_to_packed_i32(P(1), a[2], a[3], a[4], P(5), a[6], P(7)));
}

/* index_bytes, data, batch, width, row_bytes, sizes, pattern, out */
static PyObject *fill_padding(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long long a[8];
  if (read_ints(args, n, 8, a)) return NULL;
  RUN(a[0] == 8 ? nb_fill_padding_i64(P(1), a[2], a[3], a[4], P(5), P(6), P(7))
                : nb_fill_padding_i32(P(1), a[2], a[3], a[4], P(5), P(6), P(7)));
}

/* index_bytes, data, batch, n, row_bytes, indices, width, sizes, pattern, out */
static PyObject *gather_rows(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long long a[10];
  if (read_ints(args, n, 10, a)) return NULL;
  RUN(a[0] == 8
          ? nb_gather_rows_i64(P(1), a[2], a[3], a[4], P(5), a[6], P(7), P(8), P(9))
          : nb_gather_rows_i32(P(1), a[2], a[3], a[4], P(5), a[6], P(7), P(8), P(9)));
}

/* index_bytes, source, source_n, sources, targets, target_n, sizes, batch, width, row_bytes,
 * out */
static PyObject *scatter_rows(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long long a[11];
  if (read_ints(args, n, 11, a)) return NULL;
  RUN(a[0] == 8 ? nb_scatter_rows_i64(P(1), a[2], P(3), P(4), a[5], P(6), a[7], a[8], a[9],
                                      P(10))
                : nb_scatter_rows_i32(P(1), a[2], P(3), P(4), a[5], P(6), a[7], a[8], a[9],
                                      P(10)));
}

/* host_sizes(sizes): for a list or tuple of exact Python ints (bools and other integer types
 * are not), (offsets, total, smallest, largest) with offsets the int64 running sums from 0 as a
 * bytearray of len(sizes) + 1 entries; None for anything else (another sequence, an int past
 * int64, a sum past int64), which the caller then reads in Python to raise the right error. */
static PyObject *host_sizes(PyObject *self, PyObject *sizes) {
  if (!PyList_CheckExact(sizes) && !PyTuple_CheckExact(sizes)) Py_RETURN_NONE;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(sizes);
  PyObject **items = PySequence_Fast_ITEMS(sizes);
  PyObject *buffer = PyByteArray_FromStringAndSize(NULL, (count + 1) * (Py_ssize_t)8);
  if (buffer == NULL) return NULL;
  int64_t *offsets = (int64_t *)PyByteArray_AS_STRING(buffer);
  long long total = 0, smallest = 0, largest = 0;
  offsets[0] = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    int overflow = 0;
    const long long size =
        PyLong_CheckExact(items[i]) ? PyLong_AsLongLongAndOverflow(items[i], &overflow) : 0;
    if (!PyLong_CheckExact(items[i]) || overflow || __builtin_add_overflow(total, size, &total)) {
      Py_DECREF(buffer);
      Py_RETURN_NONE;
    }
    if (i == 0 || size < smallest) smallest = size;
    if (i == 0 || size > largest) largest = size;
    offsets[i + 1] = total;
  }
  return Py_BuildValue("(NLLL)", buffer, total, smallest, largest);
}

#define FASTCALL(name) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, NULL}

static PyMethodDef methods[] = {
    FASTCALL(packed_to_padded), FASTCALL(padded_to_packed), FASTCALL(fill_padding),
    FASTCALL(gather_rows),      FASTCALL(scatter_rows),     {"host_sizes", host_sizes, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "nestbatch_host", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit_nestbatch_host(void) { return PyModule_Create(&module); }
