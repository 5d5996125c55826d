/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A real S3 server for the S3 store's tests, header-only: SeaweedFS's
 * `weed server` (master, volume server, filer and S3 gateway in one
 * process) on 127.0.0.1 ports that were free a moment before, its data in
 * a temp dir, its gateway checking SigV4 against one identity (S3_ACCESS,
 * S3_SECRET). It dies with the test (PR_SET_PDEATHSIG); s3_server_stop
 * kills it earlier (SIGKILL: it ignores SIGTERM for seconds).
 *
 * `weed` comes from $KVF_WEED, else scripts/install-seaweedfs.sh's cache
 * (~/.cache/kvferry/seaweedfs/weed, or $KVF_SEAWEEDFS_DIR): the tests skip,
 * saying so, only where it is not installed.
 */
#ifndef KVF_TEST_S3_SERVER_H
#define KVF_TEST_S3_SERVER_H

#include "store.h"
#include "testutil.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#define S3_ACCESS "kvfaccess"
#define S3_SECRET "kvf/secret+key"
#define S3_SECRET_ESCAPED "kvf%2Fsecret%2Bkey"

typedef struct s3_server {
    int port; /* the S3 gateway's */
    pid_t pid;
    char dir[160];
    char weed[512];
} s3_server;

/* The `weed` binary, or false (why said on stderr). */
static inline bool s3_weed_found(char *out, size_t cap)
{
    const char *env = getenv("KVF_WEED");
    if (env && *env)
        snprintf(out, cap, "%s", env);
    else if (getenv("KVF_SEAWEEDFS_DIR"))
        snprintf(out, cap, "%s/weed", getenv("KVF_SEAWEEDFS_DIR"));
    else
        snprintf(out, cap, "%s/.cache/kvferry/seaweedfs/weed",
                 getenv("HOME") ? getenv("HOME") : "/tmp");
    if (access(out, X_OK) == 0)
        return true;
    fprintf(stderr,
            "s3: skipped: SeaweedFS not installed at %s (sh scripts/install-seaweedfs.sh)\n", out);
    return false;
}

/* A base b with b..b+n-1 free: e.g. the HTTP and gRPC ports of the S3
 * gateway, master, volume server and filer. */
static inline int s3_pick_ports(int n)
{
    static uint64_t seed;
    if (!seed)
        seed = (uint64_t)getpid() * 7919u + (uint64_t)time(NULL);
    for (int tries = 0; tries < 1000; tries++) {
        int p = 20000 + (int)(test_xorshift64(&seed) % 25000);
        bool ok = true;
        for (int i = 0; ok && i < n; i++)
            ok = test_port_free(p + i);
        if (ok)
            return p;
    }
    return -1;
}

static size_t s3_sink_(char *p, size_t s, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return s * n;
}

typedef struct s3_buf_ {
    uint8_t *p;
    size_t len, cap, off;
} s3_buf_;

static size_t s3_keep_(char *p, size_t s, size_t n, void *arg)
{
    s3_buf_ *b = arg;
    if (b->len + s * n > b->cap)
        return 0;
    memcpy(b->p + b->len, p, s * n);
    b->len += s * n;
    return s * n;
}

static size_t s3_give_(char *p, size_t s, size_t n, void *arg)
{
    s3_buf_ *b = arg;
    size_t k = b->len - b->off < s * n ? b->len - b->off : s * n;
    memcpy(p, b->p + b->off, k);
    b->off += k;
    return k;
}

/* One signed request to the server, outside the store under test:
 * method on /path (the bucket and object), body in `send` (PUT) or
 * answer into `keep` (GET). The HTTP status, or -1. */
static inline long s3_request(const s3_server *s, const char *method, const char *path,
                              s3_buf_ *send, s3_buf_ *keep)
{
    CURL *e = curl_easy_init();
    if (!e)
        return -1;
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/%s", s->port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(e, CURLOPT_USERNAME, S3_ACCESS);
    curl_easy_setopt(e, CURLOPT_PASSWORD, S3_SECRET);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    struct curl_slist *h = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep ? s3_keep_ : s3_sink_);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, keep);
    if (!strcmp(method, "PUT")) {
        static s3_buf_ none;
        s3_buf_ *b = send ? send : &none;
        b->off = 0;
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, s3_give_);
        curl_easy_setopt(e, CURLOPT_READDATA, b);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)b->len);
    } else if (strcmp(method, "GET"))
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    long code = -1;
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return code;
}

/* Makes bucket `name`: 0 or -1. */
static inline int s3_bucket(const s3_server *s, const char *name)
{
    long code = s3_request(s, "PUT", name, NULL, NULL);
    return code == 200 || code == 409 ? 0 : -1;
}

/* XORs mask into byte `offset` of object bucket/object: 0 or -1. */
static inline int s3_poke(const s3_server *s, const char *path, size_t offset, uint8_t mask)
{
    s3_buf_ b = {malloc(64u << 20), 0, 64u << 20, 0};
    int rc = b.p && s3_request(s, "GET", path, NULL, &b) == 200 && offset < b.len ? 0 : -1;
    if (rc == 0) {
        b.p[offset] ^= mask;
        rc = s3_request(s, "PUT", path, &b, NULL) == 200 ? 0 : -1;
    }
    free(b.p);
    return rc;
}

/* Shortens object bucket/object to its first `len` bytes: 0 or -1. */
static inline int s3_truncate(const s3_server *s, const char *path, size_t len)
{
    s3_buf_ b = {malloc(64u << 20), 0, 64u << 20, 0};
    int rc = b.p && s3_request(s, "GET", path, NULL, &b) == 200 && len < b.len ? 0 : -1;
    if (rc == 0) {
        b.len = len;
        rc = s3_request(s, "PUT", path, &b, NULL) == 200 ? 0 : -1;
    }
    free(b.p);
    return rc;
}

static inline void s3_server_stop(s3_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

/* The S3 gateway's identities, dir/s3.json (its path in cfg): 0 or -1. */
static inline int s3_write_config(const char *dir, char *cfg, size_t cap)
{
    snprintf(cfg, cap, "%s/s3.json", dir);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return -1;
    fprintf(f,
            "{\"identities\":[{\"name\":\"kvf\",\"credentials\":[{\"accessKey\":\"%s\","
            "\"secretKey\":\"%s\"}],\"actions\":[\"Admin\",\"Read\",\"Write\",\"List\"]}]}\n",
            S3_ACCESS, S3_SECRET);
    return fclose(f) == 0 ? 0 : -1;
}

/* Starts `weed ARGS...` in the background, its output appended to `log`;
 * it dies with the test. The pid, or -1. */
static inline pid_t s3_spawn(const char *weed, const char *log, char *const *args)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(weed, args);
        _exit(127);
    }
    return pid;
}

/* Starts `s` (weed found by s3_weed_found first), or restarts it on its
 * ports and dir, and makes bucket "kvf": waits up to 60 s for a put into
 * it to succeed. 0 or -1. */
static inline int s3_server_start(s3_server *s)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!s->dir[0] && test_tmpdir(s->dir, sizeof s->dir))
        return -1;
    char cfg[320];
    if (s3_write_config(s->dir, cfg, sizeof cfg))
        return -1;
    for (int attempt = 0; attempt < 3; attempt++) {
        /* a restart keeps its ports and data: clients know it by them */
        int base = s->port ? s->port : s3_pick_ports(8);
        if (base < 0)
            return -1;
        char a[10][400];
        snprintf(a[0], sizeof a[0], "-dir=%s", s->dir);
        snprintf(a[1], sizeof a[1], "-s3.port=%d", base);
        snprintf(a[2], sizeof a[2], "-master.port=%d", base + 1);
        snprintf(a[3], sizeof a[3], "-volume.port=%d", base + 2);
        snprintf(a[4], sizeof a[4], "-filer.port=%d", base + 3);
        snprintf(a[5], sizeof a[5], "-s3.config=%s", cfg);
        snprintf(a[6], sizeof a[6], "-s3.port.grpc=%d", base + 4);
        snprintf(a[7], sizeof a[7], "-master.port.grpc=%d", base + 5);
        snprintf(a[8], sizeof a[8], "-volume.port.grpc=%d", base + 6);
        snprintf(a[9], sizeof a[9], "-filer.port.grpc=%d", base + 7);
        char log[320];
        snprintf(log, sizeof log, "%s/weed.log", s->dir);
        char *args[] = {"weed",
                        "server",
                        a[0],
                        "-s3",
                        a[1],
                        a[2],
                        a[3],
                        a[4],
                        a[5],
                        a[6],
                        a[7],
                        a[8],
                        a[9],
                        "-s3.port.iceberg=0",
                        "-s3.port.lance=0",
                        "-ip=127.0.0.1",
                        "-ip.bind=127.0.0.1",
                        "-volume.max=100",
                        "-master.volumeSizeLimitMB=1024",
                        NULL};
        pid_t pid = s3_spawn(s->weed, log, args);
        if (pid < 0)
            return -1;
        s->pid = pid;
        s->port = base;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                s->pid = 0;
                fprintf(stderr, "s3: weed server exited (log: %s); again\n", log);
                break; /* a port taken meanwhile: again */
            }
            s3_buf_ probe = {(uint8_t *)"ready", 5, 5, 0};
            if (s3_bucket(s, "kvf") == 0 && s3_request(s, "PUT", "kvf/ready", &probe, NULL) == 200)
                return 0;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 60) {
                fprintf(stderr, "s3: weed server did not come up in 60 s (log: %s)\n", log);
                s3_server_stop(s);
                return -1;
            }
            usleep(200000);
        }
    }
    return -1;
}

/* The URL of bucket "kvf" under `prefix`, with the test's keys. */
static inline void s3_url(char *out, size_t cap, const s3_server *s, const char *prefix)
{
    snprintf(out, cap, "s3://%s:%s@kvf/%s?endpoint=http://127.0.0.1:%d&region=us-east-1", S3_ACCESS,
             S3_SECRET_ESCAPED, prefix, s->port);
}

/* Blocks base..base+n of `bytes` each over buf: for a write filled with
 * bytes that follow from their key, for a read poisoned. */
static inline void s3_blocks(kvf__store_block *b, uint8_t *buf, uint64_t base, size_t n,
                             size_t bytes, bool write)
{
    for (size_t i = 0; i < n; i++) {
        if (write)
            test_fill_random(buf + i * bytes, bytes, base + i);
        else
            memset(buf + i * bytes, 0xc3, bytes);
        b[i] = (kvf__store_block){.key = KEY(base + i),
                                  .tokens = 3,
                                  .pools = 1,
                                  .buf = buf + i * bytes,
                                  .cap = bytes,
                                  .payload_bytes = bytes};
    }
}

/* Whether read block b holds the bytes s3_blocks writes under its key. */
static inline bool s3_block_exact(const kvf__store_block *b, size_t bytes)
{
    uint8_t *want = malloc(bytes);
    test_fill_random(want, bytes, KEY_SEED(b->key));
    bool ok = b->status == KVF_OK && b->payload_bytes == bytes && !memcmp(want, b->buf, bytes);
    free(want);
    return ok;
}

#endif /* KVF_TEST_S3_SERVER_H */
