/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process-wide knobs that have no config field (KVF_FILE_DIRECT,
 * KVF_FSYNC_METHOD, KVF_HOST_ASYNC, KVF_CUFILE_LIB, KVF_TIMELINE): a bad
 * value fails create naming the variable and the valid values (the
 * timeline's is logged once instead), a good one in any case takes effect,
 * and each is listed with its source.
 */
#include "testutil.h"

#include "backend.h"
#include "blockfile.h"

#include <stdatomic.h>
#include <sys/wait.h>

static char dir[256];

static const char *const knobs[] = {"KVF_FILE_DIRECT", "KVF_FSYNC_METHOD", "KVF_HOST_ASYNC",
                                    "KVF_CUFILE_LIB",  "KVF_TIMELINE",     "KVF_CONFIG"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++)
        unsetenv(knobs[i]);
}

static kvf_status create_with_files(kvf_engine **e)
{
    kvf_engine_config c = KVF_ENGINE_CONFIG_INIT;
    c.backend = KVF_BACKEND_HOST;
    c.file.dir = dir;
    return kvf_engine_create(&c, e);
}

static int test_bad_values_refused(void)
{
    static const struct {
        const char *var, *value, *valid;
    } bad[] = {
        {"KVF_FILE_DIRECT", "maybe", "0, 1, off, on, false, true, no or yes (any case)"},
        {"KVF_FILE_DIRECT", "2", "0, 1, off, on"},
        {"KVF_FSYNC_METHOD", "fdatasync", "syncfs or fsync (any case)"},
        {"KVF_HOST_ASYNC", "async", "0, 1, off, on, false, true, no or yes"},
        {"KVF_CUFILE_LIB", "  ", "expected a non-blank value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clear_env();
        setenv(bad[i].var, bad[i].value, 1);
        kvf_engine *e = NULL;
        CHECK_STATUS(create_with_files(&e), KVF_ERR_INVALID);
        CHECK(e == NULL);
        CHECK_STR_HAS(kvf_last_error(), bad[i].var);
        CHECK_STR_HAS(kvf_last_error(), bad[i].value);
        CHECK_STR_HAS(kvf_last_error(), bad[i].valid);
        /* and `kvferry info --config` says the same */
        kvf_setting *s = NULL;
        size_t n = 0;
        CHECK_STATUS(kvf_config_settings(NULL, NULL, &s, &n), KVF_ERR_INVALID);
        CHECK_STR_HAS(kvf_last_error(), bad[i].var);
    }
    clear_env();
    return 0;
}

static const kvf_setting *find(const kvf_setting *s, size_t n, const char *env)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].env, env) == 0)
            return &s[i];
    TEST_FAIL_AT(__FILE__, __LINE__, "no setting for %s", env);
    return NULL;
}

static void check_listed(const kvf_setting *s, size_t n, const char *env, const char *value,
                         kvf_setting_source source)
{
    const kvf_setting *k = find(s, n, env);
    if (!k)
        return;
    if (strcmp(k->value, value) != 0)
        TEST_FAIL_AT(__FILE__, __LINE__, "%s: value \"%s\", expected \"%s\"", env, k->value, value);
    CHECK_EQ_INT(k->source, source);
}

/* What the file tier and the host backend make of the knobs now. */
static void observe(bool *direct, bool *syncfs, bool *host_async)
{
    kvf__blockfile_dir d;
    REQUIRE(kvf__blockfile_open_dir(dir, "knobs", 0, KVF_FSYNC_BATCH, &d) == KVF_OK);
    *direct = atomic_load(&d.direct);
    *syncfs = d.use_syncfs;
    kvf__blockfile_close_dir(&d);
    kvf__backend *b = NULL;
    REQUIRE(kvf__host_backend_create(&b) == KVF_OK);
    *host_async = b->ops->copy_async != NULL;
    b->ops->destroy(b);
}

static int test_good_values_any_case(void)
{
    clear_env();
    bool direct, syncfs, host_async;
    observe(&direct, &syncfs, &host_async);
    CHECK(direct && syncfs && !host_async); /* the defaults */

    setenv("KVF_FILE_DIRECT", "Off", 1);
    setenv("KVF_FSYNC_METHOD", "FSYNC", 1);
    setenv("KVF_HOST_ASYNC", "Yes", 1);
    setenv("KVF_CUFILE_LIB", "/nonexistent/libcufile.so.0", 1);
    kvf_engine *e = NULL;
    CHECK_STATUS(create_with_files(&e), KVF_OK);
    const kvf_setting *s;
    size_t n;
    REQUIRE(e && kvf_engine_settings(e, &s, &n) == KVF_OK);
    check_listed(s, n, "KVF_FILE_DIRECT", "0", KVF_SOURCE_ENV);
    check_listed(s, n, "KVF_FSYNC_METHOD", "fsync", KVF_SOURCE_ENV);
    check_listed(s, n, "KVF_HOST_ASYNC", "1", KVF_SOURCE_ENV);
    check_listed(s, n, "KVF_CUFILE_LIB", "/nonexistent/libcufile.so.0", KVF_SOURCE_ENV);
    check_listed(s, n, "KVF_TIMELINE", "", KVF_SOURCE_DEFAULT);
    kvf_engine_destroy(e);
    observe(&direct, &syncfs, &host_async);
    CHECK(!direct && !syncfs && host_async);

    setenv("KVF_FILE_DIRECT", "TRUE", 1);
    setenv("KVF_FSYNC_METHOD", "SyncFS", 1);
    setenv("KVF_HOST_ASYNC", "0", 1);
    observe(&direct, &syncfs, &host_async);
    CHECK(direct && syncfs && !host_async);

    clear_env();
    kvf_setting *all = NULL;
    REQUIRE(kvf_config_settings(NULL, NULL, &all, &n) == KVF_OK);
    check_listed(all, n, "KVF_FILE_DIRECT", "1", KVF_SOURCE_DEFAULT);
    check_listed(all, n, "KVF_FSYNC_METHOD", "syncfs", KVF_SOURCE_DEFAULT);
    check_listed(all, n, "KVF_HOST_ASYNC", "0", KVF_SOURCE_DEFAULT);
    check_listed(all, n, "KVF_CUFILE_LIB", "libcufile.so.0", KVF_SOURCE_DEFAULT);
    kvf_settings_free(all);
    return 0;
}

/* Log lines captured by a handler. */
static char captured[4096];
static int errors;

static void capture(void *user, kvf_log_level level, const char *line)
{
    (void)user;
    if (level != KVF_LOG_ERROR)
        return;
    errors++;
    size_t len = strlen(captured);
    snprintf(captured + len, sizeof captured - len, "%s\n", line);
}

/* Callers without an engine (fsck, stats) get the default and an error. */
static int test_bad_value_without_engine(void)
{
    clear_env();
    captured[0] = '\0';
    errors = 0;
    kvf_log_set_handler(capture, NULL);
    setenv("KVF_FILE_DIRECT", "sometimes", 1);
    setenv("KVF_FSYNC_METHOD", "never", 1);
    bool direct, syncfs, host_async;
    observe(&direct, &syncfs, &host_async);
    kvf_log_set_handler(NULL, NULL);
    CHECK(direct && syncfs);
    CHECK_EQ_INT(errors, 2);
    CHECK_STR_HAS(captured, "KVF_FILE_DIRECT=\"sometimes\": expected 0, 1, off, on");
    CHECK_STR_HAS(captured, "using 1");
    CHECK_STR_HAS(captured, "KVF_FSYNC_METHOD=\"never\": expected syncfs or fsync");
    clear_env();
    return 0;
}

/* A knob of the environment named in the config file says where it goes. */
static int test_file_key_refused(void)
{
#ifdef KVF_HAVE_YAML
    clear_env();
    char path[320];
    snprintf(path, sizeof path, "%s/kvferry.yaml", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("backend: host\nfile_direct: 0\n", f);
    fclose(f);
    setenv("KVF_CONFIG", path, 1);
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "line 2: file_direct is not read from a config file "
                                    "(set KVF_FILE_DIRECT)");
    clear_env();
    return 0;
#else
    return TEST_SKIP;
#endif
}

/* The timeline starts once per process: each case runs in a child. The
 * child creates two engines with KVF_TIMELINE=value and exits with the
 * number of error lines naming KVF_TIMELINE (100 + it when create failed). */
static int timeline_child(const char *value)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("KVF_TIMELINE", value, 1);
        kvf_log_set_handler(capture, NULL);
        for (int i = 0; i < 2; i++) {
            kvf_engine *e = NULL;
            if (create_with_files(&e) != KVF_OK)
                _exit(100);
            kvf_engine_destroy(e);
        }
        _exit(errors && strstr(captured, "KVF_TIMELINE=") ? errors : 0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    return WEXITSTATUS(status);
}

static int test_timeline(void)
{
    clear_env();
    char missing[320], good[320];
    snprintf(missing, sizeof missing, "%s/no/such/dir/timeline.txt", dir);
    snprintf(good, sizeof good, "%s/timeline.txt", dir);
    CHECK_EQ_INT(timeline_child(missing), 1); /* logged once, engines still made */
    CHECK_EQ_INT(timeline_child(" "), 1);
    CHECK_EQ_INT(timeline_child(good), 0);
    FILE *f = fopen(good, "r");
    CHECK(f != NULL);
    if (f) {
        char line[64] = "";
        CHECK(fgets(line, sizeof line, f) != NULL);
        CHECK_STR_HAS(line, "# t_ns thread event id n");
        fclose(f);
    }
    return 0;
}

int main(void)
{
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    RUN(test_timeline); /* first: its children must not inherit a started timeline */
    RUN(test_bad_values_refused);
    RUN(test_good_values_any_case);
    RUN(test_bad_value_without_engine);
    RUN(test_file_key_refused);
    test_rmtree(dir);
    return TEST_RESULT();
}
