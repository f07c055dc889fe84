/* lockstep — build-time generator of the code-digest table (src/code/code.h).
 *
 *   gen_code_digests OUT.c [--cpu OBJ...] [--cuda OBJ...] [--helpers SRC...]
 *
 * Reads the compiled objects of the build (ELF64 relocatable files) and writes
 * a C table: for every CPU function, the SHA-256 of its machine code; for
 * every CUDA __global__ kernel, the SHA-256 of its sm_XX machine code (SASS,
 * from the cubin inside the object's fatbinary) and of its PTX .entry;
 * for every __device__ helper the kernel sources define, a row saying its
 * code lies in its callers (always inlined). manifest/README.md says what
 * the digests cover.
 *
 * Machine code is read as bytes, never as disassembly text, so the digests
 * do not depend on a disassembler's version or formatting. A function's
 * digest covers its section's bytes, its relocations (offset, type, addend,
 * target by name) and, transitively, every executable or read-only data
 * section it refers to (static callees, constant pools), so a change in a
 * static helper changes the digest of every function that calls it. Debug
 * sections, string sections (file names, messages) and object file paths
 * never enter a digest: two builds of the same source with the same compiler
 * and flags give the same table wherever they are built.
 *
 * Uses only the project's own dependencies: OpenSSL (SHA-256) and libzstd
 * (the PTX in a fatbinary is zstd-compressed). Exit status 0, or 2 with a
 * message naming the file and what was wrong. */
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

/* ---- small helpers --------------------------------------------------------------- */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gen_code_digests: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static char *xstrdup(const char *s)
{
    char *d = xmalloc(strlen(s) + 1);
    memcpy(d, s, strlen(s) + 1);
    return d;
}

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) die("%s: cannot seek", path);
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) die("%s: cannot seek", path);
    unsigned char *b = xmalloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) die("%s: short read", path);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* Streaming SHA-256 (OpenSSL EVP). */
typedef struct sha { EVP_MD_CTX *c; } sha;
static void sha_init(sha *h)
{
    h->c = EVP_MD_CTX_new();
    if (!h->c || EVP_DigestInit_ex(h->c, EVP_sha256(), NULL) != 1) die("SHA-256 init failed");
}
static void sha_put(sha *h, const void *p, size_t n)
{
    if (n && EVP_DigestUpdate(h->c, p, n) != 1) die("SHA-256 update failed");
}
static void sha_str(sha *h, const char *s) { sha_put(h, s, strlen(s) + 1); } /* with its NUL */
static void sha_u64(sha *h, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    sha_put(h, b, 8);
}
static void sha_hex(sha *h, char hex[65])
{
    unsigned char d[32];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(h->c, d, &n) != 1 || n != 32) die("SHA-256 final failed");
    EVP_MD_CTX_free(h->c);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

/* ---- ELF64 relocatable objects ------------------------------------------------------ */

enum { SHT_SYMTAB = 2, SHT_RELA = 4, SHT_NOBITS = 8, SHT_REL = 9 };
enum { SHF_WRITE = 1, SHF_ALLOC = 2, SHF_EXECINSTR = 4, SHF_STRINGS = 0x20 };
enum { STT_FUNC = 2, STT_SECTION = 3, STB_LOCAL = 0, SHN_UNDEF = 0, SHN_LORESERVE = 0xff00 };

typedef struct sec {
    const char *name;
    uint32_t type;
    uint64_t flags, size;
    const unsigned char *data;           /* NULL for NOBITS */
    uint32_t link, info;
    uint64_t entsize;
} sec;

typedef struct sym {
    const char *name;
    unsigned char bind, type, other;
    uint16_t shndx;
    uint64_t value, size;
} sym;

typedef struct elf {
    const char *label;                   /* file name without directories (messages) */
    const unsigned char *b;
    size_t len;
    sec *s;
    size_t ns;
    sym *y;
    size_t ny;
    int *done;                           /* [ns] closure marks of the current walk */
} elf;

static const char *basename_of(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void elf_open(elf *e, const char *label, const unsigned char *b, size_t len)
{
    memset(e, 0, sizeof *e);
    e->label = label;
    e->b = b;
    e->len = len;
    if (len < 64 || memcmp(b, "\177ELF", 4) != 0 || b[4] != 2 || b[5] != 1)
        die("%s: not a little-endian ELF64 object", label);
    uint64_t shoff = rd64(b + 40);
    uint16_t shentsize = rd16(b + 58), shnum = rd16(b + 60), shstrndx = rd16(b + 62);
    if (shentsize != 64 || shoff > len || (uint64_t)shnum * 64 > len - shoff || shstrndx >= shnum)
        die("%s: bad section header table", label);
    e->ns = shnum;
    e->s = xmalloc(sizeof(sec) * shnum);
    e->done = xmalloc(sizeof(int) * shnum);
    const unsigned char *strtab_h = b + shoff + 64 * (uint64_t)shstrndx;
    uint64_t str_off = rd64(strtab_h + 24), str_size = rd64(strtab_h + 32);
    if (str_off > len || str_size > len - str_off) die("%s: bad section name table", label);
    for (uint16_t i = 0; i < shnum; i++) {
        const unsigned char *h = b + shoff + 64 * (uint64_t)i;
        sec *s = &e->s[i];
        uint32_t nm = rd32(h);
        if (nm >= str_size) die("%s: section %u: bad name offset", label, i);
        s->name = (const char *)b + str_off + nm;
        s->type = rd32(h + 4);
        s->flags = rd64(h + 8);
        uint64_t off = rd64(h + 24);
        s->size = rd64(h + 32);
        s->link = rd32(h + 40);
        s->info = rd32(h + 44);
        s->entsize = rd64(h + 56);
        if (s->type != SHT_NOBITS && i != 0) {
            if (off > len || s->size > len - off) die("%s: section %s: out of the file", label, s->name);
            s->data = b + off;
        }
    }
    for (size_t i = 0; i < e->ns; i++) {
        if (e->s[i].type != SHT_SYMTAB) continue;
        const sec *st = &e->s[i];
        if (st->link >= e->ns || st->entsize != 24) die("%s: bad symbol table", label);
        const sec *str = &e->s[st->link];
        e->ny = st->size / 24;
        e->y = xmalloc(sizeof(sym) * (e->ny ? e->ny : 1));
        for (size_t k = 0; k < e->ny; k++) {
            const unsigned char *p = st->data + 24 * k;
            uint32_t nm = rd32(p);
            if (nm >= str->size) die("%s: symbol %zu: bad name offset", label, k);
            sym *y = &e->y[k];
            y->name = (const char *)str->data + nm;
            y->bind = p[4] >> 4;
            y->type = p[4] & 15;
            y->other = p[5];
            y->shndx = rd16(p + 6);
            y->value = rd64(p + 8);
            y->size = rd64(p + 16);
        }
        break;
    }
}

/* A section whose bytes are code or constants a function computes with:
 * executable, or allocated read-only data that is not a string table. */
static int sec_is_code_or_const(const sec *s)
{
    if (!(s->flags & SHF_ALLOC) || s->type == SHT_NOBITS) return 0;
    if (s->flags & SHF_EXECINSTR) return 1;
    return !(s->flags & (SHF_WRITE | SHF_STRINGS));
}

/* The objects of one walk (a function's code may call into another object
 * of the same set through a global symbol). */
typedef struct objset {
    elf *o;
    size_t n;
} objset;

/* Finds the definition of global `name` in the set: object and section. */
static int find_global(const objset *set, const char *name, size_t *obj, size_t *shndx)
{
    for (size_t i = 0; i < set->n; i++) {
        const elf *e = &set->o[i];
        for (size_t k = 0; k < e->ny; k++) {
            const sym *y = &e->y[k];
            if (y->bind != STB_LOCAL && y->shndx != SHN_UNDEF && y->shndx < SHN_LORESERVE &&
                y->name[0] && strcmp(y->name, name) == 0) {
                *obj = i;
                *shndx = y->shndx;
                return 1;
            }
        }
    }
    return 0;
}

/* Hashes section `si` of object `oi` into h, then every section it refers
 * to, depth first, each once per walk. Relocation targets are named (symbol
 * name, or section name for a section symbol): addresses are unresolved in
 * an object file, so the bytes alone would not say what is called. A target
 * in a string section is named without its addend, whose value depends on
 * where the strings (file names among them) happen to lie. */
static void walk(const objset *set, size_t oi, size_t si, sha *h)
{
    elf *e = &set->o[oi];
    if (e->done[si]) return;
    e->done[si] = 1;
    const sec *s = &e->s[si];
    sha_str(h, "section");
    sha_str(h, s->name);
    sha_u64(h, s->size);
    sha_put(h, s->data, s->size);
    for (size_t r = 0; r < e->ns; r++) {
        const sec *rs = &e->s[r];
        if ((rs->type != SHT_RELA && rs->type != SHT_REL) || rs->info != si) continue;
        size_t ent = rs->type == SHT_RELA ? 24 : 16;
        if (rs->entsize != ent) die("%s: %s: unexpected relocation entry size", e->label, rs->name);
        for (uint64_t k = 0; k < rs->size / ent; k++) {
            const unsigned char *p = rs->data + ent * k;
            uint64_t off = rd64(p), info = rd64(p + 8);
            int64_t add = rs->type == SHT_RELA ? (int64_t)rd64(p + 16) : 0;
            uint32_t type = (uint32_t)info, yi = (uint32_t)(info >> 32);
            if (yi >= e->ny) die("%s: %s: relocation %llu: bad symbol", e->label, rs->name,
                                 (unsigned long long)k);
            const sym *y = &e->y[yi];
            const char *target = y->name;
            size_t to_obj = oi, to_sec = (size_t)-1;
            if (y->shndx != SHN_UNDEF && y->shndx < SHN_LORESERVE && y->shndx < e->ns) {
                to_sec = y->shndx;
                if (y->type == STT_SECTION || !target[0]) target = e->s[y->shndx].name;
            } else if (y->shndx == SHN_UNDEF && target[0]) {
                size_t gs;
                if (find_global(set, target, &to_obj, &gs)) to_sec = gs;
            }
            int strings = to_sec != (size_t)-1 && (set->o[to_obj].s[to_sec].flags & SHF_STRINGS);
            sha_str(h, "reloc");
            sha_u64(h, off);
            sha_u64(h, type);
            sha_u64(h, strings ? 0 : (uint64_t)add);
            sha_str(h, target);
            if (to_sec != (size_t)-1 && sec_is_code_or_const(&set->o[to_obj].s[to_sec]))
                walk(set, to_obj, to_sec, h);
        }
    }
}

static void walk_reset(const objset *set)
{
    for (size_t i = 0; i < set->n; i++) memset(set->o[i].done, 0, sizeof(int) * set->o[i].ns);
}

/* ---- the table being built ------------------------------------------------------------ */

typedef struct entry {
    const char *backend;
    char *name;
    char sha[65];                        /* "" for an inline helper */
    char ptx[65];                        /* cuda: digest of the PTX entries; "" otherwise */
    int instances;                       /* cuda: template instances combined */
} entry;

static entry *tab;
static size_t ntab, captab;

static entry *tab_add(const char *backend, const char *name)
{
    if (ntab == captab) {
        captab = captab ? 2 * captab : 256;
        entry *t = realloc(tab, captab * sizeof *t);
        if (!t) die("out of memory");
        tab = t;
    }
    entry *x = &tab[ntab++];
    memset(x, 0, sizeof *x);
    x->backend = backend;
    x->name = xstrdup(name);
    return x;
}

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    int c = strcmp(x->backend, y->backend);
    return c ? c : strcmp(x->name, y->name);
}

/* ---- CPU: one row per function ------------------------------------------------------------ */

/* Counts FUNC definitions named `name` over the set (a static name defined in
 * two files names no single function). */
static int count_defs(const objset *set, const char *name)
{
    int n = 0;
    for (size_t i = 0; i < set->n; i++)
        for (size_t k = 0; k < set->o[i].ny; k++) {
            const sym *y = &set->o[i].y[k];
            if (y->type == STT_FUNC && y->shndx != SHN_UNDEF && y->shndx < SHN_LORESERVE &&
                strcmp(y->name, name) == 0)
                n++;
        }
    return n;
}

static void cpu_functions(const objset *set)
{
    for (size_t i = 0; i < set->n; i++) {
        const elf *e = &set->o[i];
        for (size_t k = 0; k < e->ny; k++) {
            const sym *y = &e->y[k];
            if (y->type != STT_FUNC || y->shndx == SHN_UNDEF || y->shndx >= SHN_LORESERVE ||
                !y->name[0] || count_defs(set, y->name) != 1)
                continue;
            /* gcc's split-off parts (foo.cold, foo.part.0) are reached from foo */
            if (strchr(y->name, '.')) continue;
            const sec *s = &e->s[y->shndx];
            if (!(s->flags & SHF_EXECINSTR)) continue;
            /* Without one section per function (-ffunction-sections) a section
             * holds several functions and the digest covers all of them. */
            sha h;
            sha_init(&h);
            walk_reset(set);
            walk(set, i, y->shndx, &h);
            entry *x = tab_add("cpu", y->name);
            sha_hex(&h, x->sha);
        }
    }
}

/* ---- CUDA: fatbinary, cubin, PTX --------------------------------------------------------- */

/* The kernel's name as source code writes it: "_Z16ls_linear_kernelILi1EEvPKf"
 * -> "ls_linear_kernel" (a plain, non-nested Itanium name); other names stay. */
static char *demangle_base(const char *m)
{
    const char *p = m;
    if (strncmp(p, "_Z", 2) != 0) return xstrdup(m);
    p += 2;
    if (*p == 'L') p++;
    if (*p < '1' || *p > '9') return xstrdup(m);
    size_t n = 0;
    while (*p >= '0' && *p <= '9') n = 10 * n + (size_t)(*p++ - '0');
    if (strlen(p) < n) return xstrdup(m);
    char *s = xmalloc(n + 1);
    memcpy(s, p, n);
    return s;
}

typedef struct kinst {                   /* one kernel instance (mangled) */
    char *mangled, *base;
    char sass[65], ptx[65];
} kinst;

static kinst *kin;
static size_t nkin, capkin;

static kinst *kin_get(const char *mangled)
{
    for (size_t i = 0; i < nkin; i++)
        if (strcmp(kin[i].mangled, mangled) == 0) return &kin[i];
    if (nkin == capkin) {
        capkin = capkin ? 2 * capkin : 64;
        kinst *t = realloc(kin, capkin * sizeof *t);
        if (!t) die("out of memory");
        kin = t;
    }
    kinst *k = &kin[nkin++];
    memset(k, 0, sizeof *k);
    k->mangled = xstrdup(mangled);
    k->base = demangle_base(mangled);
    return k;
}

/* st_other bit of a cubin symbol that is a kernel entry (__global__). */
#define STO_CUDA_ENTRY 0x10

/* Kernels of one cubin: every entry FUNC in a ".text.<name>" section (device
 * functions it calls lie in the same section or are reached through its
 * relocations). The
 * digest covers that section (with its closure) and the kernel's own
 * constant banks (".nv.constant<N>.<name>": parameter bank, literal pool). */
static void cubin_kernels(const char *label, const unsigned char *b, size_t len)
{
    elf e;
    elf_open(&e, label, b, len);
    objset set = {&e, 1};
    for (size_t k = 0; k < e.ny; k++) {
        const sym *y = &e.y[k];
        if (y->type != STT_FUNC || !(y->other & STO_CUDA_ENTRY) || y->shndx == SHN_UNDEF ||
            y->shndx >= e.ns || strncmp(e.s[y->shndx].name, ".text.", 6) != 0)
            continue;
        kinst *ki = kin_get(y->name);
        if (ki->sass[0]) die("%s: kernel %s defined twice", label, y->name);
        sha h;
        sha_init(&h);
        walk_reset(&set);
        walk(&set, 0, y->shndx, &h);
        for (size_t s = 0; s < e.ns; s++) {
            const char *nm = e.s[s].name;
            size_t ln = strlen(nm), ly = strlen(y->name);
            if (strncmp(nm, ".nv.constant", 12) == 0 && ln > ly + 1 &&
                strcmp(nm + ln - ly, y->name) == 0 && nm[ln - ly - 1] == '.')
                walk(&set, 0, s, &h);
        }
        sha_hex(&h, ki->sass);
    }
    free(e.s);
    free(e.y);
    free(e.done);
}

/* PTX: each ".entry NAME(" up to the closing "}" line is one kernel; comment
 * lines and debug directives (.loc, .file) are left out. */
static void ptx_entries(const char *label, const char *t, size_t len)
{
    const char *end = t + len, *line = t;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *le = nl ? nl : end;
        const char *en = NULL;
        for (const char *p = line; p + 7 <= le; p++)
            if (memcmp(p, ".entry ", 7) == 0) { en = p + 7; break; }
        if (!en) { line = nl ? nl + 1 : end; continue; }
        const char *ne = en;
        while (ne < le && *ne != '(' && *ne != ' ' && *ne != '\r') ne++;
        char *name = xmalloc((size_t)(ne - en) + 1);
        memcpy(name, en, (size_t)(ne - en));
        kinst *ki = kin_get(name);
        if (ki->ptx[0]) die("%s: PTX entry %s defined twice", label, name);
        free(name);
        sha h;
        sha_init(&h);
        const char *l = line;
        int closed = 0;
        while (l < end && !closed) {
            const char *n2 = memchr(l, '\n', (size_t)(end - l));
            const char *e2 = n2 ? n2 : end;
            const char *q = l;
            while (q < e2 && (*q == ' ' || *q == '\t')) q++;
            int skip = (e2 - q >= 2 && q[0] == '/' && q[1] == '/') ||
                       (e2 - q >= 4 && memcmp(q, ".loc", 4) == 0) ||
                       (e2 - q >= 5 && memcmp(q, ".file", 5) == 0);
            if (!skip) {
                sha_put(&h, l, (size_t)(e2 - l));
                sha_put(&h, "\n", 1);
            }
            if (e2 - l == 1 && l[0] == '}') closed = 1;
            l = n2 ? n2 + 1 : end;
        }
        if (!closed) die("%s: PTX entry %s: no closing brace", label, ki->mangled);
        sha_hex(&h, ki->ptx);
        line = l;
    }
}

/* Fatbinary container (".nv_fatbin" of a host object): a 16-byte header
 * (magic 0xBA55ED50, version, header size, payload size), then entries, each
 * with its own header: kind (1 PTX, 2 ELF cubin), header size, payload size,
 * compressed size, target sm, flags, uncompressed size. */
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_FLAG_ZSTD 0x8000u
#define FATBIN_FLAG_LZ4 0x2000u

static void fatbin(const char *label, const unsigned char *b, size_t len)
{
    size_t off = 0;
    while (off + 16 <= len) {
        if (rd32(b + off) != FATBIN_MAGIC) {
            off += 8; /* containers are 8-aligned; padding between them */
            continue;
        }
        uint16_t hs = rd16(b + off + 6);
        uint64_t fs = rd64(b + off + 8);
        if (hs < 16 || fs > len - off - hs) die("%s: fatbinary at %zu: bad header", label, off);
        size_t p = off + hs, end = off + hs + (size_t)fs;
        while (p + 64 <= end) {
            const unsigned char *h = b + p;
            uint16_t kind = rd16(h);
            uint32_t ehs = rd32(h + 4);
            uint64_t psize = rd64(h + 8);
            uint32_t csize = rd32(h + 16);
            uint32_t sm = rd32(h + 28);
            uint64_t flags = rd64(h + 40);
            uint64_t usize = ehs >= 64 ? rd64(h + 56) : 0;
            if (ehs < 64 || psize > end - p - ehs)
                die("%s: fatbinary entry at %zu: bad header", label, p);
            const unsigned char *pl = h + ehs;
            char what[64];
            snprintf(what, sizeof what, "%s (sm_%u %s)", label, sm, kind == 1 ? "PTX" : "ELF");
            unsigned char *raw = NULL;
            size_t rlen = (size_t)psize;
            if (flags & FATBIN_FLAG_LZ4)
                die("%s: LZ4-compressed fatbinary entry (build with zstd or no compression)", what);
            if (flags & FATBIN_FLAG_ZSTD) {
                if (csize == 0 || csize > psize || usize == 0 || usize > (1u << 30))
                    die("%s: compressed entry with bad sizes", what);
                raw = xmalloc((size_t)usize + 1);
                size_t got = ZSTD_decompress(raw, (size_t)usize, pl, csize);
                if (ZSTD_isError(got)) die("%s: zstd: %s", what, ZSTD_getErrorName(got));
                rlen = got;
                pl = raw;
            }
            if (kind == 2) {
                cubin_kernels(what, pl, rlen);
            } else if (kind == 1) {
                size_t n = 0;
                while (n < rlen && pl[n]) n++; /* the text ends at its NUL */
                ptx_entries(what, (const char *)pl, n);
            }
            free(raw);
            p += ehs + (size_t)psize;
        }
        off = end;
    }
}

static void cuda_object(const char *path, const unsigned char *b, size_t len)
{
    elf e;
    elf_open(&e, basename_of(path), b, len);
    int found = 0;
    for (size_t i = 0; i < e.ns; i++)
        if (strcmp(e.s[i].name, ".nv_fatbin") == 0 && e.s[i].data) {
            fatbin(e.label, e.s[i].data, e.s[i].size);
            found = 1;
        }
    if (!found) die("%s: no .nv_fatbin section (not a CUDA object compiled by nvcc)", e.label);
    free(e.s);
    free(e.y);
    free(e.done);
}

static int cmp_kinst(const void *a, const void *b)
{
    const kinst *x = a, *y = b;
    int c = strcmp(x->base, y->base);
    return c ? c : strcmp(x->mangled, y->mangled);
}

/* One row per kernel name: template instances combined in mangled order. */
static void cuda_rows(void)
{
    qsort(kin, nkin, sizeof *kin, cmp_kinst);
    for (size_t i = 0; i < nkin;) {
        size_t j = i;
        while (j < nkin && strcmp(kin[j].base, kin[i].base) == 0) j++;
        sha hs, hp;
        sha_init(&hs);
        sha_init(&hp);
        for (size_t k = i; k < j; k++) {
            if (!kin[k].sass[0]) die("kernel %s: PTX entry but no machine code", kin[k].mangled);
            if (!kin[k].ptx[0]) die("kernel %s: machine code but no PTX entry", kin[k].mangled);
            sha_str(&hs, kin[k].mangled);
            sha_str(&hs, kin[k].sass);
            sha_str(&hp, kin[k].mangled);
            sha_str(&hp, kin[k].ptx);
        }
        entry *x = tab_add("cuda", kin[i].base);
        sha_hex(&hs, x->sha);
        sha_hex(&hp, x->ptx);
        x->instances = (int)(j - i);
        i = j;
    }
}

/* __device__ helpers of the kernel sources (ls_ names on a line that holds
 * __device__ or LS_HD and an opening parenthesis right after the name): their
 * code is inlined into the kernels that call them. */
static void helpers(const char *path)
{
    size_t len;
    char *t = (char *)read_file(path, &len);
    t[len] = '\0';
    for (char *line = t; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        const char *q = line;
        while (*q == ' ') q++;
        if (*q != '#' && *q != '*' && strncmp(q, "/*", 2) != 0 &&
            (strstr(line, "__device__") || strstr(line, "LS_HD "))) {
            for (const char *p = strstr(line, "ls_"); p; p = strstr(p + 1, "ls_")) {
                if (p > line && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                 (p[-1] >= '0' && p[-1] <= '9')))
                    continue;
                const char *e = p;
                while (*e == '_' || (*e >= 'a' && *e <= 'z') || (*e >= '0' && *e <= '9')) e++;
                if (*e != '(') continue;
                char name[128];
                if ((size_t)(e - p) >= sizeof name) continue;
                memcpy(name, p, (size_t)(e - p));
                name[e - p] = '\0';
                int have = 0;
                for (size_t i = 0; i < ntab && !have; i++)
                    have = !strcmp(tab[i].backend, "cuda") && !strcmp(tab[i].name, name);
                if (!have) tab_add("cuda", name);
                break;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(t);
}

/* ---- output ----------------------------------------------------------------------------- */

static void write_table(const char *out)
{
    qsort(tab, ntab, sizeof *tab, cmp_entry);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) die("%s: cannot write", tmp);
    fprintf(f, "/* Generated at build time by cmake/gen_code_digests.c from the compiled\n"
               " * objects: do not edit. src/code/code.h documents the table. */\n"
               "#include \"code/code.h\"\n\n"
               "const ls_code_entry ls_code_entries[] = {\n");
    for (size_t i = 0; i < ntab; i++) {
        const entry *x = &tab[i];
        fprintf(f, "    {\"%s\", \"%s\", ", x->backend, x->name);
        if (x->sha[0]) fprintf(f, "\"%s\", ", x->sha); else fprintf(f, "NULL, ");
        if (x->ptx[0]) fprintf(f, "\"%s\", ", x->ptx); else fprintf(f, "NULL, ");
        fprintf(f, "%d},\n", x->instances);
    }
    if (ntab == 0) fprintf(f, "    {NULL, NULL, NULL, NULL, 0},\n");
    fprintf(f, "};\nconst size_t ls_code_n_entries = %zu;\n", ntab);
    if (fclose(f) != 0) die("%s: write failed", tmp);
    if (rename(tmp, out) != 0) die("%s: cannot rename to %s", tmp, out);
}

int main(int argc, char **argv)
{
    if (argc < 2) die("usage: gen_code_digests OUT.c [--cpu OBJ...] [--cuda OBJ...] [--helpers SRC...]");
    const char *out = argv[1];
    enum { NONE, CPU, CUDA, HELPERS } mode = NONE;
    elf *cpu = xmalloc(sizeof(elf) * (size_t)argc);
    size_t ncpu = 0;
    const char **help = xmalloc(sizeof(char *) * (size_t)argc);
    size_t nhelp = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu")) { mode = CPU; continue; }
        if (!strcmp(argv[i], "--cuda")) { mode = CUDA; continue; }
        if (!strcmp(argv[i], "--helpers")) { mode = HELPERS; continue; }
        if (mode == NONE) die("%s: expected --cpu, --cuda or --helpers first", argv[i]);
        if (mode == HELPERS) { help[nhelp++] = argv[i]; continue; }
        size_t len;
        unsigned char *b = read_file(argv[i], &len);
        if (mode == CPU) elf_open(&cpu[ncpu++], basename_of(argv[i]), b, len);
        else cuda_object(argv[i], b, len); /* the buffer stays: names point into it */
    }
    objset set = {cpu, ncpu};
    cpu_functions(&set);
    cuda_rows();
    for (size_t i = 0; i < nhelp; i++) helpers(help[i]);
    write_table(out);
    return 0;
}
