/* lockstep — starting threads with a stack size lockstep chooses.
 *
 * glibc gives a new thread a stack of RLIMIT_STACK bytes (`ulimit -s`), and
 * carves the thread's static TLS out of that: whether a worker overflows
 * would depend on the user's shell. Every thread lockstep starts (the CPU
 * pool's workers, the fingerprint hashers, the run's hashing thread) gets
 * LS_THREAD_STACK_BYTES instead, and keeps its large buffers on the heap
 * (per-worker scratch), never in stack arrays or _Thread_local storage. */
#ifndef LS_CORE_THREAD_H
#define LS_CORE_THREAD_H

#include <pthread.h>

/* Ample for the deepest worker path (OpenSSL's SHA-256, jansson, a few
 * 32-float lane arrays), whatever `ulimit -s` says. */
#define LS_THREAD_STACK_BYTES ((size_t)1 << 20)

/* pthread_create(t, attributes with stack size LS_THREAD_STACK_BYTES, fn,
 * arg). Returns 0 or pthread's error number. */
int ls_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
