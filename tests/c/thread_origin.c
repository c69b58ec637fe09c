/* A native thread started from C: `start_and_join(n, size)` starts a thread with
 * pthread_create that mallocs `n` blocks of `size` bytes (kept: returned to the caller, who
 * never frees them), and joins it. Used by tests/thread_origins.rs. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct job {
    size_t n, size;
    void **blocks;
};

static void *run(void *arg) {
    struct job *job = arg;
    for (size_t i = 0; i < job->n; i++) {
        job->blocks[i] = malloc(job->size);
        memset(job->blocks[i], 1, job->size);
    }
    return NULL;
}

int start_and_join(size_t n, size_t size) {
    static void *blocks[64];
    struct job job = {n < 64 ? n : 64, size, blocks};
    pthread_t thread;
    if (pthread_create(&thread, NULL, run, &job) != 0)
        return -1;
    return pthread_join(thread, NULL);
}
