/* lockstep — SHA-256 through OpenSSL EVP.
 * Every digest lockstep records (tensors, config, manifests, trace frames,
 * per-layer state digests) is SHA-256; this is the one place that calls
 * OpenSSL for it. */
#ifndef LS_FINGERPRINT_SHA256_H
#define LS_FINGERPRINT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ls_digest {
    uint8_t bytes[32];   /* SHA-256 output, big-endian as the standard writes it */
} ls_digest;

typedef struct ls_sha256 {
    void *evp;           /* EVP_MD_CTX*, owned */
} ls_sha256;

/* Sets OpenSSL's SHA-256 up for the process (otherwise done by the first
 * digest). A program calls it at start, while memory is plentiful: OpenSSL
 * reports an allocation that fails inside that set-up as an "internal error"
 * that cannot be told from a broken installation. */
ls_status ls_sha256_prepare(ls_error *err);
ls_status ls_sha256_init(ls_sha256 *h, ls_error *err);
ls_status ls_sha256_update(ls_sha256 *h, const void *data, size_t len, ls_error *err);
/* Writes the digest and frees the context (also on failure). */
ls_status ls_sha256_final(ls_sha256 *h, ls_digest *out, ls_error *err);
/* Frees a context without producing a digest (error paths). */
void ls_sha256_discard(ls_sha256 *h);

/* A digest fed in parts over several calls (backend.h: a logits row hashed
 * column chunk by column chunk). ls_sha256_resume starts *h when `first`
 * (freeing a context an abandoned hash left in it) and otherwise requires
 * that it was started; ls_sha256_part is resume, the bytes, and, when out
 * is given, the final digest. *h holds no context after a failure or a
 * final part. A zeroed ls_sha256 holds none. */
ls_status ls_sha256_resume(ls_sha256 *h, int first, ls_error *err);
ls_status ls_sha256_part(ls_sha256 *h, int first, const void *data, size_t len, ls_digest *out,
                         ls_error *err);

/* One-shot digest of a buffer. */
ls_status ls_sha256_buf(const void *data, size_t len, ls_digest *out, ls_error *err);

/* Lower-case hex, 64 characters plus NUL. */
void ls_digest_to_hex(const ls_digest *d, char hex[65]);
/* Parses 64 hex characters (either case); returns LS_E_INPUT otherwise. */
ls_status ls_digest_from_hex(const char *hex, ls_digest *out, ls_error *err);
int ls_digest_equal(const ls_digest *a, const ls_digest *b);

#endif
