/* A C extension that allocates as a stack-switching library does (greenlet, under gevent
 * and eventlet, copies slices of the C stack to the heap and back): while it allocates, the
 * words of the stack above its own frame (here, its caller's frame) are not its callers' any
 * more but stale data of another coroutine. Here they are overwritten with addresses an unwinder must not follow:
 * into a page that cannot be read, into the middle of code, small numbers. They are put back
 * before the function returns, so the program runs on as if nothing happened.
 *
 * stack_switch.allocate(size, times) allocates and frees `size` bytes `times` times that
 * way; returns the number of allocations. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static unsigned char saved[256];
static unsigned char *unreadable;

/* The stale words: cycling through addresses into the unreadable page, into code (this
 * function's own, offset into the middle of an instruction), and small numbers. */
static void fill(uintptr_t *words, size_t n, uintptr_t seed) {
    for (size_t i = 0; i < n; i++) {
        switch ((i + seed) % 4) {
        case 0: words[i] = (uintptr_t)unreadable + 64 * (i % 64); break;
        case 1: words[i] = (uintptr_t)&fill + 3 + i % 17; break;
        case 2: words[i] = (uintptr_t)unreadable + 4096 - 8; break;
        default: words[i] = i; break;
        }
    }
}

/* Allocates while the words from above its own frame up to and including the return address
 * of `upper`'s frame (the frame of its caller, `switching`) are stale. Only the extension's
 * own frames are overwritten: the interpreter's state on the stack (the eval loop's frame
 * data) is left alone, as greenlet keeps it. */
__attribute__((noinline)) static void *allocate_over_stale_stack(size_t size, uintptr_t seed,
                                                                 unsigned char *upper) {
    unsigned char *above = (unsigned char *)__builtin_frame_address(0) + 16;
    size_t n = (size_t)(upper + 16 - above);
    if (n > sizeof saved)
        abort();
    memcpy(saved, above, n);
    fill((uintptr_t *)above, n / sizeof(uintptr_t), seed);
    __asm__ volatile("" ::: "memory");
    void *p = malloc(size);
    __asm__ volatile("" ::: "memory");
    memcpy(above, saved, n);
    return p;
}

/* The frame whose locals, saved frame pointer and return address go stale. */
__attribute__((noinline)) static void *switching(size_t size, uintptr_t seed) {
    volatile uintptr_t locals[8] = {seed};
    void *p = allocate_over_stale_stack(size, seed, __builtin_frame_address(0));
    return locals[0] == seed ? p : NULL;
}

static PyObject *allocate(PyObject *self, PyObject *args) {
    Py_ssize_t size, times;
    if (!PyArg_ParseTuple(args, "nn", &size, &times))
        return NULL;
    for (Py_ssize_t i = 0; i < times; i++) {
        void *p = switching((size_t)size, (uintptr_t)i);
        if (p == NULL)
            return PyErr_NoMemory();
        memset(p, 1, (size_t)size);
        free(p);
    }
    return PyLong_FromSsize_t(times);
}

static PyMethodDef methods[] = {
    {"allocate", allocate, METH_VARARGS, "Allocates over a stale stack."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "stack_switch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_stack_switch(void) {
    unreadable = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (unreadable == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyModule_Create(&module);
}
