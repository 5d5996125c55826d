/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public calls that look into a block directory (kvf_dir_check,
 * kvf_dir_list, kvf_dir_namespaces) and at a remote URL (kvf_remote_probe).
 * A namespace of blocks of random data is damaged behind the engine's
 * back: one payload byte flipped, one file cut short, a torn temporary
 * file, a FIFO and a directory under blocks' names, a stranger's file;
 * each is reported with its own kind, nothing is changed, and nothing
 * hangs (alarm: a FIFO opened for reading would wait forever). A sparse
 * file whose sound header claims a gigabyte is refused from the header,
 * in little time and memory.
 */
#include "testutil.h"

#include "blockhdr.h"
#include "file_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEADLINE_S 30
#define GOOD_A 0x10ull
#define FLIPPED 0x11ull
#define CUT 0x12ull
#define GOOD_B 0x13ull
#define GOOD_C 0x14ull
#define TORN 0x99ull
#define FIFO_KEY 0x20ull
#define DIR_KEY 0x21ull
#define N_SEEN 8

typedef struct seen {
    uint64_t key[N_SEEN];
    kvf_dir_entry_kind kind[N_SEEN];
    kvf_status status[N_SEEN];
    bool names_file[N_SEEN]; /* the message names the file */
    size_t n;
    const char *ns_dir;
} seen;

static void record(void *arg, const kvf_dir_entry *e)
{
    seen *s = arg;
    REQUIRE(s->n < N_SEEN);
    s->key[s->n] = e->key.lo;
    CHECK_EQ_U64(e->key.hi, 0);
    s->kind[s->n] = e->kind;
    s->status[s->n] = e->status;
    s->names_file[s->n] = e->kind == KVF_DIR_ENTRY_GOOD ? e->payload_bytes > 0 && e->pools == 1
                                                        : strstr(e->message, s->ns_dir) != NULL;
    s->n++;
}

/* The one entry of `key` has `kind`. */
static void check_kind(const seen *s, uint64_t key, kvf_dir_entry_kind kind)
{
    int found = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->key[i] != key)
            continue;
        found++;
        if (s->kind[i] != kind || !s->names_file[i])
            fprintf(stderr, "key " KVF_KEY_FMT ": %s, wanted %s (%s)\n", KVF_KEY_ARGS(TKEY(key)),
                    kvf_dir_entry_kind_name(s->kind[i]), kvf_dir_entry_kind_name(kind),
                    kvf_status_str(s->status[i]));
        CHECK(s->kind[i] == kind);
        CHECK(s->names_file[i]);
        CHECK((s->status[i] == KVF_OK) == (kind == KVF_DIR_ENTRY_GOOD));
    }
    CHECK_EQ_INT(found, 1);
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, bytes, n) == (ssize_t)n);
    close(fd);
}

/* Five blocks of random data, then the damage. */
static void build(file_fixture *f)
{
    const uint64_t keys[] = {GOOD_A, FLIPPED, CUT, GOOD_B, GOOD_C};
    for (uint32_t i = 0; i < 5; i++) {
        test_fill_random(ff_slot(f, KVF_LEVEL_PRIMARY, i), f->bytes, 100 + i);
        CHECK_STATUS(ff_move1(f, true, i, keys[i]), KVF_OK);
    }
    char p[400];
    ff_key_path(f, FLIPPED, p, sizeof p);
    int fd = open(p, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t b;
    REQUIRE(pread(fd, &b, 1, KVF_BLOCK_HEADER_BYTES + 100) == 1);
    b ^= 0x40;
    REQUIRE(pwrite(fd, &b, 1, 64 + 100) == 1);
    close(fd);
    ff_key_path(f, CUT, p, sizeof p);
    REQUIRE(truncate(p, 100) == 0);
    snprintf(p, sizeof p, "%s/.0000000000000000%016llx.4242.7.tmp", f->ns_dir,
             (unsigned long long)TORN);
    write_file(p, "half a block", 12);
    ff_key_path(f, FIFO_KEY, p, sizeof p);
    REQUIRE(mkfifo(p, 0644) == 0);
    ff_key_path(f, DIR_KEY, p, sizeof p);
    REQUIRE(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/notes.txt", f->ns_dir);
    write_file(p, "not a block", 11);
}

static void test_check(const file_fixture *f)
{
    seen s = {.ns_dir = f->ns_dir};
    kvf_dir_counts c = KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(f->dir, "ns", NULL, 0, record, &s, &c), KVF_OK);
    CHECK_EQ_U64(c.good, 3);
    CHECK_EQ_U64(c.corrupt, 2);
    CHECK_EQ_U64(c.torn, 1);
    CHECK_EQ_U64(c.foreign, 2);
    CHECK_EQ_U64(c.mismatch, 0);
    CHECK_EQ_U64(c.unreadable, 0);
    CHECK_EQ_INT((int)s.n, 8);
    check_kind(&s, GOOD_A, KVF_DIR_ENTRY_GOOD);
    check_kind(&s, GOOD_B, KVF_DIR_ENTRY_GOOD);
    check_kind(&s, GOOD_C, KVF_DIR_ENTRY_GOOD);
    check_kind(&s, FLIPPED, KVF_DIR_ENTRY_CORRUPT);
    check_kind(&s, CUT, KVF_DIR_ENTRY_CORRUPT);
    check_kind(&s, TORN, KVF_DIR_ENTRY_TORN);
    check_kind(&s, FIFO_KEY, KVF_DIR_ENTRY_FOREIGN);
    check_kind(&s, DIR_KEY, KVF_DIR_ENTRY_FOREIGN);

    /* the engine's layout: the same verdicts; counts add up across calls */
    CHECK_STATUS(kvf_dir_check(f->dir, "ns", &FF_GEOMETRY, 1, NULL, NULL, &c), KVF_OK);
    CHECK_EQ_U64(c.good, 6);
    CHECK_EQ_U64(c.foreign, 4);
    /* another layout: no block is good, the sound ones are mismatches */
    kvf_geometry other = FF_GEOMETRY;
    other.head_size = 64;
    kvf_dir_counts o = KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(f->dir, "ns", &other, 1, NULL, NULL, &o), KVF_OK);
    CHECK_EQ_U64(o.good, 0);
    CHECK(o.mismatch >= 3);
    CHECK_EQ_U64(o.torn, 1);
    CHECK_EQ_U64(o.foreign, 2);
}

/* A sound block copied into another namespace belongs to neither. */
static void test_other_namespace(const file_fixture *f)
{
    char p[400], q[400];
    snprintf(q, sizeof q, "%s/other", f->dir);
    REQUIRE(mkdir(q, 0755) == 0);
    ff_key_path(f, GOOD_A, p, sizeof p);
    snprintf(q, sizeof q, "%s/other/0000000000000000%016llx.kvf", f->dir,
             (unsigned long long)GOOD_A);
    REQUIRE(link(p, q) == 0);
    kvf_dir_counts c = KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(f->dir, "other", NULL, 0, NULL, NULL, &c), KVF_OK);
    CHECK_EQ_U64(c.mismatch, 1);
    CHECK_EQ_U64(c.good, 0);
}

static void test_list(const file_fixture *f)
{
    uint64_t n = 99;
    /* headers only: the flipped payload is not seen, the cut file is */
    CHECK_STATUS(kvf_dir_list(f->dir, "ns", NULL, 0, NULL, NULL, &n), KVF_OK);
    CHECK_EQ_U64(n, 4);
    CHECK_STATUS(kvf_dir_list(f->dir, "ns", &FF_GEOMETRY, 1, NULL, NULL, &n), KVF_OK);
    CHECK_EQ_U64(n, 4);
    kvf_geometry other = FF_GEOMETRY;
    other.dtype = KVF_DTYPE_FP32;
    CHECK_STATUS(kvf_dir_list(f->dir, "ns", &other, 1, NULL, NULL, &n), KVF_OK);
    CHECK_EQ_U64(n, 0);
}

static void add_name(void *arg, const char *ns)
{
    char *out = arg;
    strcat(out, ns);
    strcat(out, ";");
}

static void test_namespaces(const file_fixture *f)
{
    char p[400], names[256] = "";
    snprintf(p, sizeof p, "%s/bad name", f->dir);
    REQUIRE(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/plainfile", f->dir);
    write_file(p, "x", 1);
    size_t n = 0;
    CHECK_STATUS(kvf_dir_namespaces(f->dir, add_name, names, &n), KVF_OK);
    CHECK_EQ_INT((int)n, 2);
    CHECK(strcmp(names, "ns;other;") == 0);
    CHECK_STATUS(kvf_dir_namespaces(p, add_name, names, &n), KVF_ERR_NOT_FOUND);
}

/* Bad arguments fail, and a missing namespace is not created. */
static void test_errors(const file_fixture *f)
{
    char p[400];
    struct stat sb;
    CHECK_STATUS(kvf_dir_check(f->dir, "absent", NULL, 0, NULL, NULL, NULL), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "absent");
    CHECK_STATUS(kvf_dir_list(f->dir, "absent", NULL, 0, NULL, NULL, NULL), KVF_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "%s/absent", f->dir);
    CHECK(stat(p, &sb) != 0);
    CHECK_STATUS(kvf_dir_check(f->dir, "../ns", NULL, 0, NULL, NULL, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_dir_check(NULL, "ns", NULL, 0, NULL, NULL, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_dir_list(f->dir, "ns", NULL, 1, NULL, NULL, NULL), KVF_ERR_INVALID);
    kvf_geometry bad = FF_GEOMETRY;
    bad.layers = 0;
    CHECK_STATUS(kvf_dir_check(f->dir, "ns", &bad, 1, NULL, NULL, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_dir_namespaces(NULL, NULL, NULL, NULL), KVF_ERR_INVALID);
    CHECK(strcmp(kvf_dir_entry_kind_name((kvf_dir_entry_kind)42), "?") == 0);
}

/* Nothing was removed or changed: the FIFO, the torn file, the damage. */
static void test_left_alone(const file_fixture *f)
{
    char p[400];
    struct stat sb;
    ff_key_path(f, FIFO_KEY, p, sizeof p);
    CHECK(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
    snprintf(p, sizeof p, "%s/.0000000000000000%016llx.4242.7.tmp", f->ns_dir,
             (unsigned long long)TORN);
    CHECK(lstat(p, &sb) == 0 && sb.st_size == 12);
    ff_key_path(f, CUT, p, sizeof p);
    CHECK(lstat(p, &sb) == 0 && sb.st_size == 100);
}

static void test_remote_probe(void)
{
    char why[256];
    unsetenv(KVF_REMOTE_URL_ENV);
    CHECK_STATUS(kvf_remote_probe(NULL, 100, why, sizeof why), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(why, KVF_REMOTE_URL_ENV);
    kvf_info info = KVF_INFO_INIT;
    REQUIRE(kvf_info_get(&info) == KVF_OK);
    /* no store serves http://: the message lists those that this build has */
    CHECK_STATUS(kvf_remote_probe("http://user:secret@host", 100, why, sizeof why),
                 KVF_ERR_INVALID);
    CHECK(strstr(why, "secret") == NULL);
    CHECK_STR_HAS(why, "mem://");
    /* port 1 of this machine: refused at once */
    setenv(KVF_REMOTE_URL_ENV, "redis://127.0.0.1:1", 1);
    kvf_status st = kvf_remote_probe(NULL, 200, why, sizeof why);
    /* whether the Redis store is built, not every remote store
     * (remote_built): a build with Redis but without S3 still probes */
    CHECK(test_store_built("redis") ? st == KVF_ERR_REMOTE || st == KVF_ERR_TIMEOUT
                                    : st == KVF_ERR_UNSUPPORTED);
    CHECK(why[0] != '\0');
    /* a detail buffer of one byte is cut to fit */
    CHECK(kvf_remote_probe(NULL, 200, why, 1) != KVF_OK && why[0] == '\0');
    unsetenv(KVF_REMOTE_URL_ENV);
}

#define SPARSE_CLAIM (1ull << 30)

/* The peak resident memory of this process so far, bytes. */
static uint64_t peak_rss(void)
{
    struct rusage ru;
    REQUIRE(getrusage(RUSAGE_SELF, &ru) == 0);
    return (uint64_t)ru.ru_maxrss * 1024;
}

/* The one entry of namespace "sparse" with and without the layout, in a
 * child (whose peak memory is its own): refused from the header alone. */
static int sparse_child(const file_fixture *f)
{
    uint64_t rss0 = peak_rss(), t0 = kvf__now_ns();
    seen s = {.ns_dir = f->dir};
    kvf_dir_counts c = KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(f->dir, "sparse", NULL, 0, record, &s, &c), KVF_OK);
    CHECK_STATUS(kvf_dir_check(f->dir, "sparse", &FF_GEOMETRY, 1, record, &s, &c), KVF_OK);
    double s_taken = (double)(kvf__now_ns() - t0) / 1e9;
    uint64_t grown = peak_rss() - rss0;
    printf("sparse claim of %llu bytes: refused in %.3f s, peak memory +%llu KiB\n",
           (unsigned long long)SPARSE_CLAIM, s_taken, (unsigned long long)grown >> 10);
    CHECK_EQ_INT((int)s.n, 2);
    /* no layout: left unchecked, not called corrupt; the layout: a lie */
    CHECK(s.kind[0] == KVF_DIR_ENTRY_UNREADABLE && s.status[0] == KVF_ERR_RANGE);
    CHECK(s.kind[1] == KVF_DIR_ENTRY_CORRUPT && s.status[1] == KVF_ERR_CORRUPT);
    CHECK(s.names_file[0] && s.names_file[1]);
    /* reading the claim takes a gigabyte and seconds; the header alone,
     * neither (generous for sanitizers) */
    CHECK(grown < SPARSE_CLAIM / 16);
    CHECK(s_taken < 2.0);
    fflush(NULL); /* the child leaves by _exit */
    return test_failures ? 1 : 0;
}

static void test_sparse_claim(const file_fixture *f)
{
    char p[400], q[400];
    uint8_t h[KVF_BLOCK_PREFIX_MAX];
    ff_key_path(f, GOOD_A, p, sizeof p);
    int fd = open(p, O_RDONLY);
    REQUIRE(fd >= 0 && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
    close(fd);
    kvf__block_header bh;
    REQUIRE(kvf__block_header_parse(h, p, &bh) == KVF_OK);
    bh.ns_hash = kvf__ns_hash("sparse");
    bh.payload_bytes = SPARSE_CLAIM; /* a sound header: its own checksum holds */
    kvf__block_prefix_seal(&bh, h);
    snprintf(q, sizeof q, "%s/sparse", f->dir);
    REQUIRE(mkdir(q, 0755) == 0);
    snprintf(q, sizeof q, "%s/sparse/0000000000000000%016llx.kvf", f->dir,
             (unsigned long long)GOOD_A);
    size_t pre = kvf__block_prefix_bytes(bh.pools);
    write_file(q, h, pre);
    REQUIRE(truncate(q, (off_t)(pre + SPARSE_CLAIM)) == 0);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0)
        _exit(sparse_child(f));
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    REQUIRE(unlink(q) == 0);
}

/* The registry as a user sees it: every store with its schemes, built or
 * not; a probe of each scheme asks that store (a store not built says what
 * it needs, in the words kvf_store_info_get gives); kvf_info's remote_built
 * is whether every remote store is built. */
static void test_store_registry(void)
{
    kvf_info info = KVF_INFO_INIT;
    REQUIRE(kvf_info_get(&info) == KVF_OK);
    int all_remote_built = 1;
    size_t n = 0;
    bool seen_mem = false, seen_file = false;
    kvf_store_info si = KVF_STORE_INFO_INIT;
    for (; kvf_store_info_get(n, &si) == KVF_OK; n++) {
        CHECK(si.name[0] && si.schemes[0] && si.detail[0]);
        seen_mem |= !strcmp(si.name, "mem");
        seen_file |= !strcmp(si.name, "file");
        if (si.remote && !si.built)
            all_remote_built = 0;
        /* each of its schemes is served by it: a probe never says "no store" */
        char schemes[sizeof si.schemes], *save = NULL;
        snprintf(schemes, sizeof schemes, "%s", si.schemes);
        for (char *sch = strtok_r(schemes, " ", &save); sch; sch = strtok_r(NULL, " ", &save)) {
            char url[160], why[512];
            snprintf(url, sizeof url, "%s127.0.0.1:1", sch);
            kvf_status st = kvf_remote_probe(url, 100, why, sizeof why);
            CHECK(strstr(why, "no store serves") == NULL);
            if (!si.built) {
                CHECK_STATUS(st, KVF_ERR_UNSUPPORTED);
                CHECK_STR_HAS(why, si.detail + strlen("not built: needs "));
            }
            if (!si.remote)
                CHECK(st != KVF_OK);
        }
    }
    CHECK(n >= 3 && seen_mem && seen_file);
    CHECK_STATUS(kvf_store_info_get(n, &si), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf_store_info_get(0, NULL), KVF_ERR_INVALID);
    kvf_store_info short_info = {.struct_size = 8};
    CHECK_STATUS(kvf_store_info_get(0, &short_info), KVF_ERR_INVALID);
    CHECK(info.remote_built == all_remote_built);
    char why[256];
    CHECK_STATUS(kvf_remote_probe("mem://probe-me", 100, why, sizeof why), KVF_OK);
    CHECK_STR_HAS(why, "mem://probe-me");
}

int main(void)
{
    alarm(DEADLINE_S);
    file_fixture f;
    ff_init(&f);
    build(&f);
    kvf_engine_destroy(f.e);
    f.e = NULL;
    test_check(&f);
    test_other_namespace(&f);
    test_list(&f);
    test_namespaces(&f);
    test_errors(&f);
    test_left_alone(&f);
    test_remote_probe();
    test_sparse_claim(&f);
    test_store_registry();
    ff_done(&f);
    return test_result();
}
