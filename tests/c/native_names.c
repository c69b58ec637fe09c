/* A CPython extension whose allocating functions carry the names compilers give to clones, for
 * the native-name test (tests/native_symbols.rs): built without -g (names from .symtab), then
 * stripped (.dynsym only).
 *
 *   clone(n):   malloc(n) in `_Z11clone_allocm.isra.0`, a GCC clone's name (an asm label)
 *   refused(n): malloc(n) in a clone of a pyarrow function whose mangled name the demangler
 *               refuses whole
 *   hidden(n):  malloc(n) in the static hidden_alloc, just after the exported names_exported:
 *               a stripped build names it `names_exported+0x…` (built with
 *               -fno-toplevel-reorder: the functions stay in the source's order)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEPT 10000
static void *kept[MAX_KEPT];
static size_t nkept;

static void *keep(void *p) {
    if (p) {
        memset(p, 1, 4096);
        if (nkept < MAX_KEPT)
            kept[nkept++] = p;
    }
    return p;
}

void *clone_alloc(size_t n) __asm__("_Z11clone_allocm.isra.0");
__attribute__((noipa)) void *clone_alloc(size_t n) { return keep(malloc(n)); }

void *refused_alloc(size_t n) __asm__(
    "_ZN5arrow2py12_GLOBAL__N_119ObjectWriterVisitor5VisitINS_8ListTypeEEENSt9enable_ifIXoosrSt7"
    "is_sameIS5_T_E5valuesrS6_INS_13LargeListTypeES7_E5valueENS_6StatusEE4typeERKS7_.isra.0");
__attribute__((noipa)) void *refused_alloc(size_t n) { return keep(malloc(n)); }

__attribute__((noipa)) void *names_exported(size_t n) { return keep(calloc(1, n)); }

__attribute__((noipa)) static void *hidden_alloc(size_t n) { return keep(malloc(n)); }

static PyObject *call(void *(*f)(size_t), PyObject *arg) {
    size_t n = PyLong_AsSize_t(arg);
    if (n == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (n < 4096)
        n = 4096;
    f(n);
    Py_RETURN_NONE;
}

static PyObject *do_clone(PyObject *self, PyObject *arg) { return call(clone_alloc, arg); }
static PyObject *do_refused(PyObject *self, PyObject *arg) { return call(refused_alloc, arg); }
static PyObject *do_hidden(PyObject *self, PyObject *arg) { return call(hidden_alloc, arg); }

static PyMethodDef methods[] = {
    {"clone", do_clone, METH_O, "malloc(n) in a function named like a GCC clone"},
    {"refused", do_refused, METH_O, "malloc(n) in a function the demangler refuses"},
    {"hidden", do_hidden, METH_O, "malloc(n) in a static function"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_names", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_names(void) { return PyModule_Create(&module); }
