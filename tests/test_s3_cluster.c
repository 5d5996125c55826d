/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store on SeaweedFS as separate processes (a master, two volume
 * servers, a filer and the S3 gateway), one volume server killed (-9) and
 * restarted under it: while it is down a read fails exactly the blocks
 * whose volume it held, each named, by the deadline, and never with wrong
 * bytes; writes go on to the other; once it is back every block stored,
 * before and during, reads back byte for byte. Skips (77) without libcurl
 * or SeaweedFS.
 */
#include "testutil.h"

#ifndef KVF_HAVE_S3
int main(void)
{
    TEST_SKIP_ALL("built without libcurl / expat");
}
#else

#include "s3_server.h"
#include "store.h"

#define NS "cluster"
#define BYTES (64u << 10)
#define NBLK 24

/* base+0/1 master, +2/3 and +4/5 the volume servers, +6/7 filer, +8/9 S3
 * (HTTP, gRPC) */
typedef struct cluster {
    s3_server gw; /* the gateway, as the other tests' helpers see a server */
    int base;
    pid_t master, volume[2], filer, s3;
    char log[320], cfg[320];
} cluster;

static cluster cl;

static pid_t start_volume(int i)
{
    char port[32], grpc[32], dir[300], master[64];
    snprintf(port, sizeof port, "-port=%d", cl.base + 2 + 2 * i);
    snprintf(grpc, sizeof grpc, "-port.grpc=%d", cl.base + 3 + 2 * i);
    snprintf(dir, sizeof dir, "%s/v%d", cl.gw.dir, i);
    mkdir(dir, 0755);
    char dirarg[320];
    snprintf(dirarg, sizeof dirarg, "-dir=%s", dir);
    snprintf(master, sizeof master, "-mserver=127.0.0.1:%d.%d", cl.base, cl.base + 1);
    char *args[] = {
        "weed",    "volume", port, grpc, dirarg, master, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-max=50", NULL};
    return s3_spawn(cl.gw.weed, cl.log, args);
}

static int cluster_start(void)
{
    if (test_tmpdir(cl.gw.dir, sizeof cl.gw.dir) ||
        s3_write_config(cl.gw.dir, cl.cfg, sizeof cl.cfg))
        return -1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(cl.log, sizeof cl.log, "%s/weed.log", cl.gw.dir);
    if ((cl.base = s3_pick_ports(10)) < 0)
        return -1;
    char a[12][400];
    snprintf(a[0], sizeof a[0], "-port=%d", cl.base);
    snprintf(a[1], sizeof a[1], "-port.grpc=%d", cl.base + 1);
    snprintf(a[2], sizeof a[2], "-mdir=%s", cl.gw.dir);
    char *master[] = {"weed",
                      "master",
                      a[0],
                      a[1],
                      a[2],
                      "-ip=127.0.0.1",
                      "-ip.bind=127.0.0.1",
                      "-volumeSizeLimitMB=1024",
                      NULL};
    cl.master = s3_spawn(cl.gw.weed, cl.log, master);
    cl.volume[0] = start_volume(0);
    cl.volume[1] = start_volume(1);
    snprintf(a[3], sizeof a[3], "-port=%d", cl.base + 6);
    snprintf(a[4], sizeof a[4], "-port.grpc=%d", cl.base + 7);
    snprintf(a[5], sizeof a[5], "-master=127.0.0.1:%d.%d", cl.base, cl.base + 1);
    snprintf(a[6], sizeof a[6], "-defaultStoreDir=%s", cl.gw.dir);
    char *filer[] = {"weed", "filer", a[3], a[4], a[5], a[6], "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                     NULL};
    cl.filer = s3_spawn(cl.gw.weed, cl.log, filer);
    snprintf(a[7], sizeof a[7], "-port=%d", cl.base + 8);
    snprintf(a[8], sizeof a[8], "-port.grpc=%d", cl.base + 9);
    snprintf(a[9], sizeof a[9], "-filer=127.0.0.1:%d.%d", cl.base + 6, cl.base + 7);
    snprintf(a[10], sizeof a[10], "-config=%s", cl.cfg);
    char *s3[] = {
        "weed",          "s3", a[7], a[8], a[9], a[10], "-ip.bind=127.0.0.1", "-port.iceberg=0",
        "-port.lance=0", NULL};
    cl.s3 = s3_spawn(cl.gw.weed, cl.log, s3);
    cl.gw.port = cl.base + 8;
    for (int i = 0; i < 300; i++) { /* 60 s */
        s3_buf_ probe = {(uint8_t *)"ready", 5, 5, 0};
        if (s3_bucket(&cl.gw, "kvf") == 0 &&
            s3_request(&cl.gw, "PUT", "kvf/ready", &probe, NULL) == 200)
            return 0;
        usleep(200000);
    }
    fprintf(stderr, "s3 cluster: not up in 60 s (log: %s)\n", cl.log);
    return -1;
}

static void stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}

static void cluster_stop(void)
{
    stop(&cl.s3);
    stop(&cl.filer);
    stop(&cl.volume[0]);
    stop(&cl.volume[1]);
    stop(&cl.master);
    test_rmtree(cl.gw.dir);
}

static void make(kvf__store_block *b, uint8_t *buf, uint64_t base, size_t n, bool write)
{
    s3_blocks(b, buf, base, n, BYTES, write);
}

static bool exact(const kvf__store_block *b)
{
    return s3_block_exact(b, BYTES);
}

static int test_volume_server_killed(void)
{
    char url[512];
    s3_url(url, sizeof url, &cl.gw, "vol");
    kvf__store_config cfg = {.url = url, .ns = NS, .fingerprint = 1, .timeout_ms = 2000};
    kvf__store *s = NULL;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    kvf__store_block b[NBLK], w[8];
    uint8_t *buf = malloc(NBLK * BYTES), *wbuf = malloc(8 * BYTES);
    make(b, buf, 0x100, NBLK, true);
    REQUIRE(s->ops->write(s, b, NBLK, 0) == KVF_OK);

    stop(&cl.volume[0]);
    make(b, buf, 0x100, NBLK, false);
    uint64_t t0 = kvf__now_ns();
    s->ops->read(s, b, NBLK, 0);
    double took = (double)(kvf__now_ns() - t0) / 1e9;
    size_t failed = 0;
    for (size_t i = 0; i < NBLK; i++) {
        if (exact(&b[i]))
            continue;
        failed++;
        CHECK(b[i].status == KVF_ERR_REMOTE || b[i].status == KVF_ERR_TIMEOUT);
        char name[64];
        snprintf(name, sizeof name, "remote block " KVF_KEY_FMT, KVF_KEY_ARGS(TKEY(b[i].key)));
        CHECK(strstr(b[i].msg, name) != NULL);
    }
    fprintf(stderr, "volume server down: %zu of %d blocks failed in %.2f s%s%s\n", failed, NBLK,
            took, failed ? ", e.g. " : "", failed ? b[0].msg : "");
    CHECK(took < 2.0 + 2.0); /* the timeout plus its bytes at the floor rate, and slack */
    /* writes while it is down: stored on the other, or failed by name */
    make(w, wbuf, 0x300, 8, true);
    s->ops->write(s, w, 8, 0);
    bool wrote[8];
    for (size_t i = 0; i < 8; i++) {
        wrote[i] = w[i].status == KVF_OK;
        CHECK(wrote[i] || strstr(w[i].msg, "remote block 0000000000000000000000000000030") != NULL);
    }

    REQUIRE((cl.volume[0] = start_volume(0)) > 0);
    bool all = false;
    for (int tries = 0; tries < 60 && !all; tries++) { /* it registers again with the master */
        make(b, buf, 0x100, NBLK, false);
        s->ops->read(s, b, NBLK, 0);
        all = true;
        for (size_t i = 0; i < NBLK; i++)
            all = all && exact(&b[i]);
        if (!all)
            usleep(500000);
    }
    CHECK(all);
    make(w, wbuf, 0x300, 8, false);
    s->ops->read(s, w, 8, 0);
    for (size_t i = 0; i < 8; i++)
        CHECK(!wrote[i] || exact(&w[i]));
    free(buf);
    free(wbuf);
    kvf__store_close(s);
    return 0;
}

int main(void)
{
    if (!s3_weed_found(cl.gw.weed, sizeof cl.gw.weed))
        TEST_SKIP_ALL("SeaweedFS not installed (sh scripts/install-seaweedfs.sh)");
    if (cluster_start()) {
        cluster_stop();
        REQUIRE(!"the SeaweedFS processes started");
    }
    RUN(test_volume_server_killed);
    cluster_stop();
    return TEST_RESULT();
}
#endif
