/* A CPython extension that allocates known sizes with every function of the C allocator
 * family and with anonymous mmap/mremap, for the native-allocation tests. Each entry point
 * makes `n` blocks of `size` bytes, keeps the first `keep` and releases the rest; the kept
 * ones are released by release_all(). Sizes are multiples of the page size, so that valloc,
 * pvalloc and mmap allocate exactly what is asked. map_file() maps a file (not heap: the
 * profile must leave it out); kept_bytes() says how many heap and anonymous bytes are kept. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_KEPT 100000
/* mapped: 0 from the malloc family, 1 an anonymous mapping, 2 a file mapping (see release). */
static struct { void *p; size_t size; int mapped; } kept[MAX_KEPT];
static size_t nkept;

enum fn { MALLOC, CALLOC, REALLOC, REALLOCARRAY, POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN,
          VALLOC, PVALLOC, MMAP, MREMAP, POINTER, CONST_POINTER };

/* Function pointers in data, as libxml2 (xmlMalloc), glib and libcurl keep them: the loader
 * fills them from the symbols (a data relocation, not a GOT entry), and the library calls
 * through them. One pair is writable data, the other read-only after relocation (RELRO).
 * Volatile: every call loads the pointer, as a library whose pointers can be changed does. */
static void *(*volatile pointer_malloc)(size_t) = malloc;
static void (*volatile pointer_free)(void *) = free;
__attribute__((used)) static void *(*const const_pointer_malloc)(size_t) = malloc;
__attribute__((used)) static void (*const const_pointer_free)(void *) = free;
#define THROUGH(f) (*(__typeof__(f) const volatile *)&(f))

static void *make(enum fn f, size_t size) {
    void *p = NULL;
    switch (f) {
    case MALLOC: p = malloc(size); break;
    case POINTER: p = pointer_malloc(size); break;
    case CONST_POINTER: p = THROUGH(const_pointer_malloc)(size); break;
    case CALLOC: p = calloc(size / 8, 8); break;
    case REALLOC: p = realloc(malloc(size / 2), size); break;
    case REALLOCARRAY: p = reallocarray(malloc(size / 2), size / 8, 8); break;
    case POSIX_MEMALIGN: if (posix_memalign(&p, 64, size) != 0) p = NULL; break;
    case ALIGNED_ALLOC: p = aligned_alloc(4096, size); break;
    case MEMALIGN: p = memalign(256, size); break;
    case VALLOC: p = valloc(size); break;
    case PVALLOC: p = pvalloc(size); break;
    case MMAP:
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) p = NULL;
        break;
    case MREMAP: {
        void *q = mmap(NULL, size / 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = q == MAP_FAILED ? NULL : mremap(q, size / 2, size, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) p = NULL;
        break;
    }
    }
    if (p) memset(p, 1, size);
    return p;
}

/* mapped: as in `kept`; 3 and 4, from the malloc family through the pointers (freed through
 * theirs). */
static void release(void *p, size_t size, int mapped) {
    switch (mapped) {
    case 0: free(p); break;
    case 3: pointer_free(p); break;
    case 4: THROUGH(const_pointer_free)(p); break;
    default: munmap(p, size); break;
    }
}

static PyObject *allocate(PyObject *self, PyObject *args) {
    int f;
    Py_ssize_t size, n, keep;
    if (!PyArg_ParseTuple(args, "innn", &f, &size, &n, &keep)) return NULL;
    int mapped = f == MMAP || f == MREMAP ? 1 : f == POINTER ? 3 : f == CONST_POINTER ? 4 : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        void *p = make((enum fn)f, (size_t)size);
        if (!p) return PyErr_NoMemory();
        if (i < keep && nkept < MAX_KEPT) {
            kept[nkept].p = p; kept[nkept].size = size; kept[nkept].mapped = mapped; nkept++;
        } else {
            release(p, size, mapped);
        }
    }
    Py_RETURN_NONE;
}

/* n private read-only mappings of the first `size` bytes of the file at `path`, each read
 * through; the first `keep` are kept. */
static PyObject *map_file(PyObject *self, PyObject *args) {
    const char *path;
    Py_ssize_t size, n, keep;
    if (!PyArg_ParseTuple(args, "snnn", &path, &size, &n, &keep)) return NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    unsigned long sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) { close(fd); return PyErr_SetFromErrno(PyExc_OSError); }
        for (Py_ssize_t b = 0; b < size; b += 4096) sum += p[b];
        if (i < keep && nkept < MAX_KEPT) {
            kept[nkept].p = p; kept[nkept].size = size; kept[nkept].mapped = 2; nkept++;
        } else {
            munmap(p, size);
        }
    }
    close(fd);
    return PyLong_FromUnsignedLong(sum);
}

/* The bytes kept from the malloc family and anonymous mappings (file mappings left out). */
static PyObject *kept_bytes(PyObject *self, PyObject *args) {
    size_t total = 0;
    for (size_t i = 0; i < nkept; i++) if (kept[i].mapped != 2) total += kept[i].size;
    return PyLong_FromSize_t(total);
}

static PyObject *release_all(PyObject *self, PyObject *args) {
    for (size_t i = 0; i < nkept; i++) release(kept[i].p, kept[i].size, kept[i].mapped);
    nkept = 0;
    Py_RETURN_NONE;
}

/* Many threads, without the GIL, allocating and freeing with malloc (the storm test). Returns
 * a checksum of what they wrote. */
#include <pthread.h>
struct storm { size_t rounds; unsigned long sum; };
static void *storm_thread(void *arg) {
    struct storm *s = arg;
    void *live[64] = {0};
    for (size_t i = 0; i < s->rounds; i++) {
        size_t slot = i % 64, size = 16 + (i * 2654435761u) % 20000;
        free(live[slot]);
        unsigned char *p = malloc(size);
        p[0] = (unsigned char)i; p[size - 1] = (unsigned char)(i >> 8);
        s->sum += p[0] + p[size - 1];
        live[slot] = p;
    }
    for (int k = 0; k < 64; k++) free(live[k]);
    return NULL;
}

static PyObject *storm(PyObject *self, PyObject *args) {
    Py_ssize_t threads, rounds;
    if (!PyArg_ParseTuple(args, "nn", &threads, &rounds) || threads > 64) return NULL;
    pthread_t t[64];
    struct storm s[64];
    unsigned long sum = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < threads; i++) {
        s[i].rounds = rounds; s[i].sum = 0;
        pthread_create(&t[i], NULL, storm_thread, &s[i]);
    }
    for (Py_ssize_t i = 0; i < threads; i++) { pthread_join(t[i], NULL); sum += s[i].sum; }
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLong(sum);
}

/* What the writable function pointers hold now: (malloc's, free's), as integers. */
static PyObject *pointers(PyObject *self, PyObject *args) {
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)pointer_malloc,
                         (unsigned long long)(uintptr_t)pointer_free);
}

static PyMethodDef methods[] = {
    {"pointers", pointers, METH_NOARGS, "the writable pointers' values"},
    {"allocate", allocate, METH_VARARGS, "allocate(fn, size, n, keep)"},
    {"map_file", map_file, METH_VARARGS, "map_file(path, size, n, keep) -> checksum"},
    {"kept_bytes", kept_bytes, METH_NOARGS, "heap and anonymous bytes kept"},
    {"release_all", release_all, METH_NOARGS, "release the kept blocks"},
    {"storm", storm, METH_VARARGS, "storm(threads, rounds) -> checksum"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_allocs", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_allocs(void) { return PyModule_Create(&module); }
