#include "fingerprint/sha256.h"

#include <openssl/err.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <string.h>

/* A failed OpenSSL call: file, line and OpenSSL's reason. OpenSSL reports a
 * failed allocation as "malloc failure" somewhere on its error queue (the
 * first entry may be a consequence: "invalid argument", "internal error"), so
 * the whole queue is read, and any malloc failure makes it out of memory. An
 * empty queue is out of memory too: OpenSSL records every other failure, and
 * records nothing only when it cannot allocate the queue itself. */
static ls_status ssl_fail(const char *file, int line, const char *call, ls_error *err)
{
    unsigned long first = ERR_peek_error(), e;
    if (first == 0)
        return ls_fail(err, LS_E_NOMEM, "%s failed: out of memory inside OpenSSL (it could not record a "
                       "reason)", call);
    int nomem = 0;
    while ((e = ERR_get_error()) != 0)
        if (ERR_GET_REASON(e) == ERR_R_MALLOC_FAILURE) nomem = 1;
    char reason[256];
    ERR_error_string_n(first, reason, sizeof reason);
    if (nomem) return ls_fail(err, LS_E_NOMEM, "%s failed: out of memory inside OpenSSL (%s)", call, reason);
    return ls_fail(err, LS_E_CRYPTO, "%s:%d: %s failed: %s (hint: check the OpenSSL installation)", file,
                   line, call, reason);
}

/* One check for every OpenSSL call. */
#define LS_SSL_CHECK(call, err)                                                        \
    do {                                                                               \
        if ((call) != 1) return ssl_fail(__FILE__, __LINE__, #call, (err));            \
    } while (0)

/* SHA-256 fetched once and kept for the process. EVP_sha256() would fetch
 * it again inside every EVP_DigestInit_ex, and a fetch that runs out of
 * memory there fails as "passed invalid argument" or "internal error". A
 * failed fetch is retried by the next caller. */
static pthread_mutex_t g_md_lock = PTHREAD_MUTEX_INITIALIZER;
static EVP_MD *g_md;

static ls_status sha256_md(const EVP_MD **md, ls_error *err)
{
    /* OpenSSL 3 sets its default library context up on first use. When that
     * runs out of memory it records the failure, then hands out the context
     * half built, and the next fetch crashes on its missing lock. Asking for
     * the context first reports the failure instead. */
    if (!OSSL_LIB_CTX_get0_global_default())
        return ls_fail(err, LS_E_NOMEM, "OpenSSL: out of memory setting up its default library context");
    pthread_mutex_lock(&g_md_lock);
    if (!g_md) g_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    *md = g_md;
    pthread_mutex_unlock(&g_md_lock);
    if (!*md) return ssl_fail(__FILE__, __LINE__, "EVP_MD_fetch(NULL, \"SHA256\", NULL)", err);
    return LS_OK;
}

ls_status ls_sha256_prepare(ls_error *err)
{
    const EVP_MD *md;
    return sha256_md(&md, err);
}

ls_status ls_sha256_init(ls_sha256 *h, ls_error *err)
{
    h->evp = NULL;
    const EVP_MD *md;
    LS_TRY(sha256_md(&md, err));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    h->evp = ctx;
    if (!ctx) return ls_fail(err, LS_E_NOMEM, "EVP_MD_CTX_new: out of memory (a digest context)");
    if (EVP_DigestInit_ex(ctx, md, NULL) != 1) {
        /* With SHA-256 already fetched, the one thing init still does that
         * can fail is the provider allocating its context, which OpenSSL 3
         * reports as "initialization error" with no malloc failure queued. */
        unsigned long first = ERR_peek_error();
        if (ERR_GET_LIB(first) == ERR_LIB_EVP && ERR_GET_REASON(first) == EVP_R_INITIALIZATION_ERROR) {
            ERR_clear_error();
            return ls_fail(err, LS_E_NOMEM, "EVP_DigestInit_ex: out of memory inside OpenSSL (the SHA-256 "
                           "provider could not allocate its context)");
        }
        return ssl_fail(__FILE__, __LINE__, "EVP_DigestInit_ex(ctx, md, NULL)", err);
    }
    return LS_OK;
}

ls_status ls_sha256_update(ls_sha256 *h, const void *data, size_t len, ls_error *err)
{
    if (len == 0) return LS_OK;
    LS_SSL_CHECK(EVP_DigestUpdate((EVP_MD_CTX *)h->evp, data, len), err);
    return LS_OK;
}

static ls_status sha256_final_inner(ls_sha256 *h, ls_digest *out, ls_error *err)
{
    unsigned int n = 0;
    LS_SSL_CHECK(EVP_DigestFinal_ex((EVP_MD_CTX *)h->evp, out->bytes, &n), err);
    if (n != 32) return ls_fail(err, LS_E_CRYPTO, "SHA-256 returned %u bytes", n);
    return LS_OK;
}

ls_status ls_sha256_final(ls_sha256 *h, ls_digest *out, ls_error *err)
{
    ls_status st = sha256_final_inner(h, out, err);
    ls_sha256_discard(h);
    return st;
}

void ls_sha256_discard(ls_sha256 *h)
{
    EVP_MD_CTX_free((EVP_MD_CTX *)h->evp);
    h->evp = NULL;
}

ls_status ls_sha256_resume(ls_sha256 *h, int first, ls_error *err)
{
    if (first) {
        ls_sha256_discard(h);
        return ls_sha256_init(h, err);
    }
    if (!h->evp)
        return ls_fail(err, LS_E_INTERNAL, "SHA-256: a later part of a digest whose first part was not hashed");
    return LS_OK;
}

ls_status ls_sha256_part(ls_sha256 *h, int first, const void *data, size_t len, ls_digest *out,
                         ls_error *err)
{
    ls_status st = ls_sha256_resume(h, first, err);
    if (st == LS_OK) st = ls_sha256_update(h, data, len, err);
    if (st != LS_OK) {
        ls_sha256_discard(h);
        return st;
    }
    return out ? ls_sha256_final(h, out, err) : LS_OK;
}

ls_status ls_sha256_buf(const void *data, size_t len, ls_digest *out, ls_error *err)
{
    ls_sha256 h;
    ls_status st = ls_sha256_init(&h, err);
    if (st == LS_OK) st = ls_sha256_update(&h, data, len, err);
    if (st != LS_OK) {
        ls_sha256_discard(&h);
        return st;
    }
    return ls_sha256_final(&h, out, err);
}

void ls_digest_to_hex(const ls_digest *d, char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d->bytes[i] >> 4];
        hex[2 * i + 1] = digits[d->bytes[i] & 15];
    }
    hex[64] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

ls_status ls_digest_from_hex(const char *hex, ls_digest *out, ls_error *err)
{
    if (!hex || strlen(hex) != 64)
        return ls_fail(err, LS_E_INPUT, "digest must be 64 hex characters");
    for (int i = 0; i < 32; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return ls_fail(err, LS_E_INPUT, "digest has a non-hex character at index %d",
                           hi < 0 ? 2 * i : 2 * i + 1);
        out->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return LS_OK;
}

int ls_digest_equal(const ls_digest *a, const ls_digest *b)
{
    return memcmp(a->bytes, b->bytes, 32) == 0;
}
