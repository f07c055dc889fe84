/* lockstep — starting threads with a stack size lockstep chooses; see thread.h. */
#include "core/thread.h"

int ls_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    pthread_attr_t a;
    int rc = pthread_attr_init(&a);
    if (rc != 0) return rc;
    rc = pthread_attr_setstacksize(&a, LS_THREAD_STACK_BYTES);
    if (rc == 0) rc = pthread_create(t, &a, fn, arg);
    pthread_attr_destroy(&a);
    return rc;
}
