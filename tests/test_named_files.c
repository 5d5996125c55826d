/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Files named by a setting (KVF_CONFIG, KVF_LOG_FILE, KVF_TIMELINE) that
 * are FIFOs: each is refused with a message naming it, and nothing waits
 * for the FIFO's other end. Logging and the timeline start once per
 * process, so each case runs in a child with an alarm: a regression is a
 * child killed by SIGALRM, a failure here, never a hung test.
 */
#include "testutil.h"

#include <signal.h>
#include <sys/wait.h>

#define CHILD_SECONDS 20

static char dir[256], fifo[320], errlog[320];

/* What the child wrote to stderr. */
static void read_errlog(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(errlog, "r");
    REQUIRE(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* Runs body in a child whose stderr goes to errlog; 0 when it exited 0
 * within CHILD_SECONDS. */
static int in_child(int (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        alarm(CHILD_SECONDS);
        test_failures = 0; /* the child's own checks only */
        FILE *err = freopen(errlog, "w", stderr);
        _exit(err ? body() : 99);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        TEST_FAIL_AT(__FILE__, __LINE__, "child killed by signal %d%s", WTERMSIG(status),
                     WTERMSIG(status) == SIGALRM ? " (hung on the FIFO)" : "");
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rc) {
        char text[8192];
        read_errlog(text, sizeof text);
        printf("child's stderr:\n%s\n", text);
    }
    return rc;
}

static kvf_status create_host(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    kvf_engine *e = NULL;
    kvf_status st = kvf_engine_create(&cfg, &e);
    kvf_engine_destroy(e);
    return st;
}

static int config_body(void)
{
    setenv("KVF_CONFIG", fifo, 1);
    kvf_setting *s = NULL;
    size_t n = 0;
    CHECK_STATUS(kvf_config_settings(NULL, NULL, &s, &n), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), fifo);
    CHECK_STR_HAS(kvf_last_error(), "not a regular file (a FIFO)");
    CHECK_STATUS(create_host(), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), fifo);
    unsetenv("KVF_CONFIG");
    /* and the caller's config_file alike */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.config_file = fifo;
    CHECK_STATUS(kvf_config_settings(&cfg, NULL, &s, &n), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "not a regular file (a FIFO)");
    return TEST_RESULT();
}

static int test_config_file(void)
{
#ifdef KVF_HAVE_YAML
    CHECK_EQ_INT(in_child(config_body), 0);
    return 0;
#else
    return TEST_SKIP; /* no YAML: a config file is refused before it is opened */
#endif
}

static int log_body(void)
{
    setenv("KVF_LOG_FILE", fifo, 1);
    setenv("KVF_BACKEND", "gpu", 1); /* an error that is logged */
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    return TEST_RESULT();
}

/* Runs body in a child, then checks that its stderr holds each of the
 * NULL-ended phrases. */
static int child_says(int (*body)(void), ...)
{
    CHECK_EQ_INT(in_child(body), 0);
    char text[8192];
    read_errlog(text, sizeof text);
    va_list ap;
    va_start(ap, body);
    for (const char *phrase; (phrase = va_arg(ap, const char *)) != NULL;)
        CHECK_STR_HAS(text, phrase);
    va_end(ap);
    return 0;
}

static int test_log_file(void)
{
    /* the error line itself goes to stderr */
    return child_says(log_body, "KVF_LOG_FILE=", fifo,
                      "(not a regular file (a FIFO)); logging to stderr", "KVF_BACKEND=\"gpu\"",
                      NULL);
}

static int timeline_body(void)
{
    setenv("KVF_TIMELINE", fifo, 1);
    CHECK_STATUS(create_host(), KVF_OK); /* process-wide: logged, no failed create */
    return TEST_RESULT();
}

/* A regular file when the timeline starts, a FIFO by the time the engine
 * appends to it. */
static char swapped[320];
static int timeline_swap_body(void)
{
    setenv("KVF_TIMELINE", swapped, 1);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    REQUIRE(unlink(swapped) == 0 && mkfifo(swapped, 0644) == 0);
    kvf_engine_destroy(e);
    return TEST_RESULT();
}

static int test_timeline(void)
{
    child_says(timeline_body, "KVF_TIMELINE=", fifo, "not a regular file (a FIFO)", NULL);
    snprintf(swapped, sizeof swapped, "%s/timeline.txt", dir);
    return child_says(timeline_swap_body, swapped, "not a regular file (a FIFO); timeline dropped",
                      NULL);
}

int main(void)
{
    unsetenv("KVF_CONFIG");
    unsetenv("KVF_LOG_FILE");
    unsetenv("KVF_TIMELINE");
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(errlog, sizeof errlog, "%s/stderr.txt", dir);
    REQUIRE(mkfifo(fifo, 0644) == 0);
    RUN(test_config_file);
    RUN(test_log_file);
    RUN(test_timeline);
    test_rmtree(dir);
    return TEST_RESULT();
}
