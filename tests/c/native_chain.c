/* A CPython extension with known native call chains, for the native-stack tests
 * (tests/native_stacks.rs). Each function that must keep its own frame is `noipa` (never
 * inlined, cloned or tail-called), and the marker comments (LINE name) tell the test the
 * source line a frame must show.
 *
 *   entry(n):         chain_entry → chain_level1 → [chain_inline →] chain_level2 → malloc(n)
 *   call_back(fn, n): callback_entry → callback_level1 → fn(n), a Python function
 *
 * chain_level2 is exported (it stays named in .dynsym when the library is stripped); the
 * others are static (a stripped build shows them as module+0x…). With -DWITH_INLINE the
 * static inline chain_inline sits between level1 and level2 and is inlined at -O2.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEPT 100000
static void *kept[MAX_KEPT];
static size_t nkept;

#define KEEP_FRAME() __asm__ volatile("" ::: "memory")

__attribute__((noipa)) void *chain_level2(size_t n) {
    void *p = malloc(n); /* LINE level2 */
    if (p)
        memset(p, 1, n);
    return p;
}

#ifdef WITH_INLINE
static inline void *chain_inline(size_t n) {
    void *p = chain_level2(n); /* LINE inline */
    KEEP_FRAME();
    return p;
}
#define NEXT chain_inline
#else
#define NEXT chain_level2
#endif

__attribute__((noipa)) static void *chain_level1(size_t n) {
    void *p = NEXT(n); /* LINE level1 */
    KEEP_FRAME();
    return p;
}

__attribute__((noipa)) static PyObject *chain_entry(PyObject *self, PyObject *arg) {
    size_t n = PyLong_AsSize_t(arg);
    if (n == (size_t)-1 && PyErr_Occurred())
        return NULL;
    void *p = chain_level1(n); /* LINE entry */
    KEEP_FRAME();
    if (p && nkept < MAX_KEPT)
        kept[nkept++] = p;
    Py_RETURN_NONE;
}

__attribute__((noipa)) static PyObject *callback_level1(PyObject *fn, PyObject *n) {
    PyObject *r = PyObject_CallFunctionObjArgs(fn, n, NULL); /* LINE callback_level1 */
    KEEP_FRAME();
    return r;
}

__attribute__((noipa)) static PyObject *callback_entry(PyObject *self, PyObject *args) {
    PyObject *fn, *n;
    if (!PyArg_ParseTuple(args, "OO", &fn, &n))
        return NULL;
    PyObject *r = callback_level1(fn, n); /* LINE callback_entry */
    KEEP_FRAME();
    return r;
}

static PyObject *release_all(PyObject *self, PyObject *unused) {
    for (size_t i = 0; i < nkept; i++)
        free(kept[i]);
    nkept = 0;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"entry", chain_entry, METH_O, "malloc(n) through entry, level1, level2"},
    {"call_back", callback_entry, METH_VARARGS, "fn(n) through two C frames"},
    {"release_all", release_all, METH_NOARGS, "free what entry kept"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_chain", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_chain(void) { return PyModule_Create(&module); }
