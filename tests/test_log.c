/* SPDX-License-Identifier: Apache-2.0 */
/* Logging: levels set by call and by KVF_LOG (any case; an unknown value
 * warned about), the KVF_LOG_FILE sink with %h and %p, the caller's
 * handler, and the rate limit of a warning flood from several threads
 * (every dropped line counted on a later one). KVF_LOG is read once per
 * process, so the environment cases run in child processes. */
#include "common.h"
#include "log.h"
#include "testutil.h"

#include <sys/wait.h>
#include <unistd.h>

#define MAX_LINES 512

typedef struct capture {
    pthread_mutex_t mu; /* the handler's calls are serialized; the test reads meanwhile */
    size_t n, calls;
    kvf_log_level level[MAX_LINES];
    char line[MAX_LINES][256];
} capture;

static capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};
static const char *self_path;

static void capture_line(void *user, kvf_log_level level, const char *line)
{
    capture *c = user;
    pthread_mutex_lock(&c->mu);
    c->calls++;
    if (c->n < MAX_LINES) {
        c->level[c->n] = level;
        snprintf(c->line[c->n], sizeof c->line[0], "%s", line);
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
}

static void capture_reset(void)
{
    pthread_mutex_lock(&cap.mu);
    cap.n = cap.calls = 0;
    pthread_mutex_unlock(&cap.mu);
}

static void log_each_level(const char *tag)
{
    KVF_LOG(KVF_LOG_ERROR, "%s error", tag);
    KVF_LOG(KVF_LOG_WARN, "%s warn", tag);
    KVF_LOG(KVF_LOG_INFO, "%s info", tag);
    KVF_LOG(KVF_LOG_DEBUG, "%s debug", tag);
    KVF_LOG(KVF_LOG_TRACE, "%s trace", tag);
}

static int test_levels(void)
{
    kvf_log_set_handler(capture_line, &cap);
    kvf_log_set_rate_limit(0, 0);
    const kvf_log_level levels[] = {KVF_LOG_OFF,  KVF_LOG_ERROR, KVF_LOG_WARN,
                                    KVF_LOG_INFO, KVF_LOG_DEBUG, KVF_LOG_TRACE};
    for (size_t i = 0; i < 6; i++) {
        capture_reset();
        CHECK_STATUS(kvf_log_set_level(levels[i]), KVF_OK);
        CHECK_EQ_INT(kvf_log_get_level(), levels[i]);
        log_each_level("lvl");
        CHECK_EQ_INT(cap.n, i); /* error .. the level itself */
        for (size_t k = 0; k < cap.n; k++)
            CHECK_EQ_INT(cap.level[k], (int)k + 1);
    }
    CHECK_STR_HAS(cap.line[0], "lvl error");
    CHECK_STR_HAS(cap.line[4], "lvl trace");
    /* the handler gets the message alone */
    CHECK(strncmp(cap.line[1], "lvl warn", 9) == 0);
    CHECK_STATUS(kvf_log_set_level((kvf_log_level)6), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_log_set_level((kvf_log_level)-1), KVF_ERR_INVALID);
    CHECK_EQ_INT(kvf_log_get_level(), KVF_LOG_TRACE);
    kvf_log_set_level(KVF_LOG_WARN);
    kvf_log_set_rate_limit(5, 10000);
    return 0;
}

/* Child mode: logs one line per level, and the flood of a few warnings. */
static int child_main(void)
{
    log_each_level("child");
    return 0;
}

/* Runs this program as a child with KVF_LOG=`level` and KVF_LOG_FILE=`file`
 * (NULL: unset), its stderr to `err_path`. */
static int run_child(const char *level, const char *file, const char *err_path, pid_t *pid_p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        FILE *err = freopen(err_path, "w", stderr);
        (void)err;
        setenv("KVF_LOG", level, 1);
        if (file)
            setenv("KVF_LOG_FILE", file, 1);
        else
            unsetenv("KVF_LOG_FILE");
        execl(self_path, self_path, "--child", (char *)NULL);
        _exit(127);
    }
    int ws;
    if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        return -1;
    *pid_p = pid;
    return 0;
}

static void read_all(const char *path, char *out, size_t cap_bytes)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(out, 1, cap_bytes - 1, f);
    out[n] = '\0';
    fclose(f);
}

static int test_environment(void)
{
    char dir[256], err[300], file[300], path[600], text[4096];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    pid_t pid;

    /* any case; a file named by the process id */
    snprintf(file, sizeof file, "%s/log-%%p.txt", dir);
    REQUIRE(run_child("DeBuG", file, err, &pid) == 0);
    snprintf(path, sizeof path, "%s/log-%ld.txt", dir, (long)pid);
    read_all(path, text, sizeof text);
    CHECK_STR_HAS(text, "kvferry error: child error\n");
    CHECK_STR_HAS(text, "kvferry debug: child debug\n");
    CHECK(!strstr(text, "child trace"));
    read_all(err, text, sizeof text);
    CHECK(!strstr(text, "child")); /* nothing on stderr */

    /* %h: the host name */
    char host[256];
    REQUIRE(gethostname(host, sizeof host) == 0);
    snprintf(file, sizeof file, "%s/%%h.log", dir);
    REQUIRE(run_child("trace", file, err, &pid) == 0);
    snprintf(path, sizeof path, "%s/%s.log", dir, host);
    read_all(path, text, sizeof text);
    CHECK_STR_HAS(text, "kvferry trace: child trace\n");

    /* an unknown level: one warning naming the valid ones, then warn */
    REQUIRE(run_child("loud", NULL, err, &pid) == 0);
    read_all(err, text, sizeof text);
    CHECK_STR_HAS(text, "KVF_LOG=loud: expected off, error, warn, info, debug or trace");
    CHECK_STR_HAS(text, "kvferry warn: child warn\n");
    CHECK(!strstr(text, "child info"));
    REQUIRE(run_child("OFF", NULL, err, &pid) == 0);
    read_all(err, text, sizeof text);
    CHECK_EQ_INT(strlen(text), 0);

    /* a file that cannot be opened: stderr, saying so */
    snprintf(file, sizeof file, "%s/no/such/dir/x.log", dir);
    REQUIRE(run_child("info", file, err, &pid) == 0);
    read_all(err, text, sizeof text);
    CHECK_STR_HAS(text, "cannot open");
    CHECK_STR_HAS(text, "no/such/dir/x.log");
    CHECK_STR_HAS(text, "kvferry info: child info\n");
    test_rmtree(dir);
    return 0;
}

enum { FLOOD_THREADS = 4, FLOOD_LINES = 2000 };

static void flood_line(int i)
{
    KVF_LOG(KVF_LOG_WARN, "redis 127.0.0.1:1: connect: refused (%d)", i);
}

static void *flood_main(void *arg)
{
    for (int i = 0; i < FLOOD_LINES; i++) {
        flood_line(i);
        /* the level and the handler change under the flood */
        if (arg && i % 100 == 0) {
            kvf_log_set_handler(capture_line, &cap);
            kvf_log_set_level(KVF_LOG_WARN);
        }
    }
    return NULL;
}

/* The lines written plus the counts they report dropped: every call. */
static unsigned long long accounted(void)
{
    unsigned long long total = 0;
    for (size_t k = 0; k < cap.n; k++) {
        total++;
        const char *s = strrchr(cap.line[k], '(');
        unsigned long long dropped;
        if (s && strstr(s, "similar suppressed") && sscanf(s, "(%llu", &dropped) == 1)
            total += dropped;
    }
    return total;
}

static int test_flood(void)
{
    kvf_log_set_handler(capture_line, &cap);
    kvf_log_set_level(KVF_LOG_WARN);
    kvf_log_set_rate_limit(5, 200);
    capture_reset();
    pthread_t th[FLOOD_THREADS];
    double t0 = (double)kvf__now_ns() * 1e-9;
    for (int i = 0; i < FLOOD_THREADS; i++)
        REQUIRE(pthread_create(&th[i], NULL, flood_main, i == 0 ? &cap : NULL) == 0);
    for (int i = 0; i < FLOOD_THREADS; i++)
        pthread_join(th[i], NULL);
    double took = (double)kvf__now_ns() * 1e-9 - t0;
    /* the first five, then one per 200 ms at most */
    CHECK(cap.n >= 5);
    CHECK(cap.n <= 5 + (size_t)(took / 0.2) + 1);
    usleep(250 * 1000);
    flood_line(-1);
    CHECK_STR_HAS(cap.line[cap.n - 1], "similar suppressed)");
    CHECK_EQ_U64(accounted(), FLOOD_THREADS * FLOOD_LINES + 1);

    /* quiet for an interval: a new incident gets its first lines again */
    usleep(250 * 1000);
    capture_reset();
    for (int i = 0; i < 3; i++)
        flood_line(i);
    CHECK_EQ_INT(cap.n, 3);
    CHECK(!strstr(cap.line[0], "suppressed"));

    /* info lines and an unlimited setting pass every line */
    capture_reset();
    for (int i = 0; i < 50; i++)
        KVF_LOG(KVF_LOG_INFO, "info %d", i);
    CHECK_EQ_INT(cap.n, 0); /* below the level */
    kvf_log_set_level(KVF_LOG_INFO);
    for (int i = 0; i < 50; i++)
        KVF_LOG(KVF_LOG_INFO, "info %d", i);
    CHECK_EQ_INT(cap.n, 50);
    kvf_log_set_rate_limit(0, 0);
    capture_reset();
    for (int i = 0; i < 50; i++)
        flood_line(i);
    CHECK_EQ_INT(cap.n, 50);
    kvf_log_set_rate_limit(5, 10000);
    kvf_log_set_level(KVF_LOG_WARN);
    return 0;
}

/* A handler that logs: the call reaches it again, no deadlock. */
static int depth;
static void reentrant_line(void *user, kvf_log_level level, const char *line)
{
    capture_line(user, level, line);
    if (depth++ == 0)
        KVF_LOG(KVF_LOG_ERROR, "from the handler");
    depth--;
}

static int test_handler_swap(void)
{
    capture_reset();
    kvf_log_set_handler(reentrant_line, &cap);
    KVF_LOG(KVF_LOG_ERROR, "outer");
    CHECK_EQ_INT(cap.n, 2);
    CHECK_STR_HAS(cap.line[1], "from the handler");
    /* after NULL the handler is not called (lines go to stderr) */
    kvf_log_set_handler(NULL, NULL);
    kvf_log_set_level(KVF_LOG_OFF);
    KVF_LOG(KVF_LOG_ERROR, "not captured");
    CHECK_EQ_INT(cap.n, 2);
    kvf_log_set_level(KVF_LOG_WARN);
    return 0;
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc == 2 && strcmp(argv[1], "--child") == 0)
        return child_main();
    RUN(test_levels);
    RUN(test_environment);
    RUN(test_flood);
    RUN(test_handler_swap);
    return TEST_RESULT();
}
