/* Native threads that load and unload libraries while they allocate, holding no GIL: a plugin
 * loader's threads, or a library that loads its back ends on demand. Loaded with ctypes by
 * tests/py/dlopen_storm.py.
 *
 *   int  storm_start(int threads)  starts them; the number started
 *   long storm_stop(void)          stops and joins them; the loads they made (-1: one failed)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char *const LIBS[] = {
    "libbz2.so.1", "libexpat.so.1", "libgdbm.so.6", "libjpeg.so.62", "libzstd.so.1",
    "libxml2.so.2", "libsqlite3.so.0", "libcurl.so.4", "libuuid.so.1", "liblzma.so.5",
};
#define NLIBS (sizeof LIBS / sizeof LIBS[0])
#define MAX_THREADS 16

static atomic_int running;
static atomic_long loads;
static atomic_int failed;
static pthread_t threads[MAX_THREADS];
static int started;

static void *storm(void *arg) {
    unsigned n = (unsigned)(long)arg;
    while (atomic_load(&running)) {
        const char *name = LIBS[n++ % NLIBS];
        void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        char *p = malloc(64 + n % 4096);
        if (p == NULL) {
            atomic_store(&failed, 1);
            break;
        }
        memset(p, (int)n, 64);
        free(p);
        if (h != NULL) {
            atomic_fetch_add(&loads, 1);
            dlclose(h);
        }
    }
    return NULL;
}

int storm_start(int n) {
    atomic_store(&running, 1);
    for (started = 0; started < n && started < MAX_THREADS; started++)
        if (pthread_create(&threads[started], NULL, storm, (void *)(long)(started * 3)) != 0)
            break;
    return started;
}

long storm_stop(void) {
    atomic_store(&running, 0);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    return atomic_load(&failed) ? -1 : atomic_load(&loads);
}
