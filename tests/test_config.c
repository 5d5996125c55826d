/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The configuration surface: sizes in bytes, settings from the
 * environment and from a YAML file, their precedence and recorded sources,
 * and the errors for bad values and unknown keys.
 */
#include "testutil.h"

static char dir[256];
static char yaml_path[300];

/* Every variable a test sets, so each test starts from a clean slate. */
static const char *const vars[] = {
    "KVF_BACKEND",          "KVF_FSYNC",
    "KVF_THREADS",          "KVF_FILE_RUNNER",
    "KVF_FILE_ENGINE",      "KVF_CACHE_DISK_ADMIT_USES",
    "KVF_CONFIG",           "KVF_FILE_NAMESPACE",
    "KVF_CACHE_HOST_BYTES", "KVF_CACHE_HOST_BLOCKS",
    "KVF_CACHE_REMOTE",     "KVF_CACHE_EVENT_QUEUE",
    "KVF_FILE_DIR",         "KVF_REMOTE_URL",
};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

static void write_file(const char *text)
{
    FILE *f = fopen(yaml_path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static const kvf_setting *find(const kvf_setting *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0)
            return &s[i];
    TEST_FAIL_AT(__FILE__, __LINE__, "no setting %s", name);
    return NULL;
}

#define CHECK_SETTING(list, count, name_, value_, source_)                                         \
    do {                                                                                           \
        const kvf_setting *set_ = find(list, count, name_);                                        \
        if (set_) {                                                                                \
            CHECK_STR_HAS(set_->value, value_);                                                    \
            CHECK_EQ_INT(strlen(set_->value), strlen(value_));                                     \
            CHECK_EQ_INT(set_->source, source_);                                                   \
        }                                                                                          \
    } while (0)

static int test_size_parse(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"4096", 4096},
        {"64GB", 64000000000ull},
        {"64gb", 64000000000ull},
        {"64GiB", 64ull << 30},
        {"64gib", 64ull << 30},
        {"512M", 512000000ull},
        {"512 MiB", 512ull << 20},
        {"1.5T", 1500000000000ull},
        {"1.5TiB", 3ull << 39},
        {"0.5k", 500},
        {" 7b ", 7},
        {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint64_t b = 1;
        CHECK_STATUS(kvf_size_parse(good[i].text, &b), KVF_OK);
        CHECK_EQ_U64(b, good[i].bytes);
    }
    static const char *const junk[] = {"",    "GB",   "-1",     "+5", "12 parsecs", "1.5",
                                       "1e9", "0x10", "4 GB x", ".",  "16EiB"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        uint64_t b = 42;
        CHECK_STATUS(kvf_size_parse(junk[i], &b), KVF_ERR_INVALID);
        CHECK_EQ_U64(b, 42);
        CHECK_STR_HAS(kvf_last_error(), junk[i]);
    }
    uint64_t b = 42;
    CHECK_STATUS(kvf_size_parse("18446744073709551616", &b), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_size_parse("19000PB", &b), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_size_parse("16384PiB", &b), KVF_ERR_RANGE);
    CHECK_EQ_U64(b, 42);
    CHECK_STATUS(kvf_size_parse(NULL, &b), KVF_ERR_INVALID);
    return 0;
}

static int test_env_case_insensitive(void)
{
    clear_env();
    setenv("KVF_BACKEND", "HOST", 1);
    setenv("KVF_FSYNC", "Block", 1);
    setenv("KVF_THREADS", "3", 1);
    setenv("KVF_FILE_RUNNER", "Threads", 1);
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(NULL, &e) == KVF_OK);
    CHECK_EQ_INT(kvf_engine_backend(e), KVF_BACKEND_HOST);
    const kvf_setting *s;
    size_t n;
    REQUIRE(kvf_engine_settings(e, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "backend", "host", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "fsync", "block", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "threads", "3", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "file_runner", "threads", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "file_namespace", "default", KVF_SOURCE_DEFAULT);
    CHECK_SETTING(s, n, "config_file", "", KVF_SOURCE_DEFAULT);
    CHECK_STR_HAS(find(s, n, "fsync")->env, "KVF_FSYNC");
    kvf_engine_destroy(e);
    clear_env();
    return 0;
}

static int test_env_bad_value(void)
{
    clear_env();
    kvf_engine *e = NULL;
    /* a bad value used to be logged and ignored: now create fails */
    setenv("KVF_FILE_RUNNER", "io_uring", 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_FILE_RUNNER=\"io_uring\"");
    CHECK_STR_HAS(kvf_last_error(), "auto, uring or threads");
    CHECK(e == NULL);
    clear_env();
    setenv("KVF_BACKEND", "gpu", 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_BACKEND");
    CHECK_STR_HAS(kvf_last_error(), "auto, host or cuda");
    clear_env();
    setenv("KVF_THREADS", "many", 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_THREADS");
    setenv("KVF_THREADS", "257", 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "0 to 256");
    clear_env();
    return 0;
}

/* A setting under its old name is refused with the new one, whatever its
 * value, so that nobody's setting is silently ignored. */
static int test_renamed(void)
{
    clear_env();
    kvf_engine *e = NULL;
    setenv("KVF_FILE_ENGINE", "threads", 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_FILE_ENGINE=\"threads\"");
    CHECK_STR_HAS(kvf_last_error(), "KVF_FILE_RUNNER");
    CHECK(e == NULL);
    kvf_setting *all = NULL;
    size_t n;
    CHECK_STATUS(kvf_config_settings(NULL, NULL, &all, &n), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_FILE_RUNNER");
    /* a caller's runner does not make the old variable acceptable */
    kvf_engine_config cfg = {.struct_size = sizeof cfg,
                             .file = {.runner = KVF_FILE_RUNNER_THREADS}};
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    clear_env();
#ifdef KVF_HAVE_YAML
    write_file("file_engine: uring\n");
    setenv("KVF_CONFIG", yaml_path, 1);
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "line 1: file_engine is now called file_runner");
    clear_env();
#endif
    return 0;
}

/* Every field of both structs, set by designated initialisers, lands on its
 * own setting as the caller's: the table's offsets into the nested structs
 * are the fields' own. */
static int test_nested_fields(void)
{
    clear_env();
    kvf_engine_config ec = {
        .struct_size = sizeof ec,
        .backend = KVF_BACKEND_HOST,
        .device = 3,
        .threads = 5,
        .file = {.dir = "/srv/kv",
                 .namespace_ = "rank7",
                 .io = KVF_FILE_IO_POSIX,
                 .fsync = KVF_FSYNC_BLOCK,
                 .runner = KVF_FILE_RUNNER_URING,
                 .queue_depth = 9,
                 .gds_compat = KVF_GDS_COMPAT_ON},
        .remote = {.url = "redis://h:1", .ttl_s = 11, .timeout_ms = 13},
        .cuda = {.copy = KVF_CUDA_COPY_DMA, .copy_sms = 17},
        .remote_mem_bytes = 43,
    };
    kvf_cache_config cc = {
        .struct_size = sizeof cc,
        .host = {.bytes = 19},
        .disk = {.blocks = 23, .admit_uses = 29},
        .gpu = {.blocks = 31},
        .remote = KVF_CACHE_REMOTE_READ,
        .events = {.queue = 37},
        .offload_min_priority = 41,
    };
    static const struct {
        const char *name, *value;
    } want[] = {
        {"backend", "host"},
        {"device", "3"},
        {"threads", "5"},
        {"file_dir", "/srv/kv"},
        {"file_namespace", "rank7"},
        {"file_io", "posix"},
        {"fsync", "block"},
        {"file_runner", "uring"},
        {"file_queue_depth", "9"},
        {"gds_compat", "on"},
        {"remote_url", "redis://h:1"},
        {"remote_ttl_s", "11"},
        {"remote_timeout_ms", "13"},
        {"cuda_copy", "dma"},
        {"cuda_copy_sms", "17"},
        {"remote_mem_bytes", "43"},
        {"cache_host_bytes", "19"},
        {"cache_disk_blocks", "23"},
        {"cache_disk_admit_uses", "29"},
        {"cache_gpu_blocks", "31"},
        {"cache_remote", "read"},
        {"cache_event_queue", "37"},
        {"cache_offload_min_priority", "41"},
    };
    kvf_setting *all = NULL;
    size_t n;
    REQUIRE(kvf_config_settings(&ec, &cc, &all, &n) == KVF_OK);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK_SETTING(all, n, want[i].name, want[i].value, KVF_SOURCE_CALLER);
    kvf_settings_free(all);

    /* left out, a field is unset: the environment's, or the default (fsync
     * BATCH is 0 like every other default, so a designated initialiser
     * that does not name it keeps it) */
    setenv("KVF_CACHE_DISK_ADMIT_USES", "2", 1);
    kvf_engine_config e2 = {.struct_size = sizeof e2, .file = {.dir = "/srv/kv"}};
    kvf_cache_config c2 = {.struct_size = sizeof c2, .disk = {.blocks = 4}};
    REQUIRE(kvf_config_settings(&e2, &c2, &all, &n) == KVF_OK);
    CHECK_SETTING(all, n, "fsync", "batch", KVF_SOURCE_DEFAULT);
    CHECK_SETTING(all, n, "file_runner", "auto", KVF_SOURCE_DEFAULT);
    CHECK_SETTING(all, n, "file_dir", "/srv/kv", KVF_SOURCE_CALLER);
    CHECK_SETTING(all, n, "cache_disk_blocks", "4", KVF_SOURCE_CALLER);
    CHECK_SETTING(all, n, "cache_disk_admit_uses", "2", KVF_SOURCE_ENV);
    kvf_settings_free(all);
    clear_env();
    return 0;
}

/* threads from the file, the environment and the caller, one over the other */
static int test_file_and_precedence(void)
{
    clear_env();
    write_file("# kvferry settings\n"
               "backend: HOST\n"
               "threads: 2\n"
               "file_namespace: \"from-file\"\n"
               "fsync: ~\n");
    setenv("KVF_CONFIG", yaml_path, 1);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    kvf_engine *e = NULL;
    const kvf_setting *s;
    size_t n;

    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    REQUIRE(kvf_engine_settings(e, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "backend", "host", KVF_SOURCE_FILE);
    CHECK_SETTING(s, n, "threads", "2", KVF_SOURCE_FILE);
    CHECK_SETTING(s, n, "file_namespace", "from-file", KVF_SOURCE_FILE);
    CHECK_SETTING(s, n, "fsync", "batch", KVF_SOURCE_DEFAULT); /* a null value is unset */
    CHECK_SETTING(s, n, "config_file", yaml_path, KVF_SOURCE_ENV);
    kvf_engine_destroy(e);

    setenv("KVF_THREADS", "3", 1);
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    REQUIRE(kvf_engine_settings(e, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "threads", "3", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "backend", "host", KVF_SOURCE_FILE);
    kvf_engine_destroy(e);

    cfg.threads = 4;
    cfg.file.namespace_ = "mine";
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    REQUIRE(kvf_engine_settings(e, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "threads", "4", KVF_SOURCE_CALLER);
    CHECK_SETTING(s, n, "file_namespace", "mine", KVF_SOURCE_CALLER);
    kvf_engine_destroy(e);

    /* the caller's config_file wins over KVF_CONFIG */
    unsetenv("KVF_THREADS");
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.config_file = "/nonexistent/kvferry.yaml";
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "/nonexistent/kvferry.yaml");
    clear_env();
    return 0;
}

static int test_file_errors(void)
{
    clear_env();
    setenv("KVF_CONFIG", yaml_path, 1);
    kvf_engine *e = NULL;
    write_file("backend: host\n"
               "\n"
               "treads: 2\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), yaml_path);
    CHECK_STR_HAS(kvf_last_error(), "line 3");
    CHECK_STR_HAS(kvf_last_error(), "unknown key \"treads\"");
    CHECK_STR_HAS(kvf_last_error(), "\"threads\"");

    write_file("backend: host\nfile_io: fast\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "line 2: file_io: \"fast\": expected auto, posix or gds");

    write_file("threads: 2\nthreads: 3\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "again");

    write_file("threads: [1, 2]\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "threads");

    write_file("- backend\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "line 1");

    write_file("backend: host\n  threads: : 2\n");
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), yaml_path);
    CHECK(e == NULL);
    clear_env();
    return 0;
}

/* An engine of two pools, 10 secondary slots each; one block is a slot of
 * both: 1024 + 2048 bytes. */
static kvf_engine *two_pool_engine(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    kvf_geometry g1 = {1, 2, 1, 16, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    kvf_geometry g2 = {1, 2, 2, 16, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    kvf_pool_desc p = {KVF_MEMORY_HOST, NULL, 0, 10};
    REQUIRE(kvf_engine_add_pool(e, &g1, &p, &p, NULL) == KVF_OK);
    REQUIRE(kvf_engine_add_pool(e, &g2, &p, &p, NULL) == KVF_OK);
    return e;
}

static uint64_t host_capacity(kvf_cache *c)
{
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    REQUIRE(kvf_cache_stats_get(c, &st) == KVF_OK);
    return st.capacity[KVF_TIER_HOST];
}

static int test_cache_bytes(void)
{
    clear_env();
    kvf_engine *e = two_pool_engine();
    kvf_cache *c = NULL;
    const kvf_setting *s;
    size_t n;
    kvf_cache_config cfg = KVF_CACHE_CONFIG_INIT;

    cfg.host.bytes = 3 * 3072 + 3071; /* rounded down to 3 blocks */
    REQUIRE(kvf_cache_create(e, &cfg, &c) == KVF_OK);
    CHECK_EQ_U64(host_capacity(c), 3);
    REQUIRE(kvf_cache_settings(c, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "cache_host_blocks", "3", KVF_SOURCE_CALLER);
    CHECK_SETTING(s, n, "cache_host_bytes", "12287", KVF_SOURCE_CALLER);
    kvf_cache_destroy(c);

    cfg.host.bytes = 3071;
    CHECK_STATUS(kvf_cache_create(e, &cfg, &c), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "host tier");
    CHECK_STR_HAS(kvf_last_error(), "3072 bytes");

    cfg.host.bytes = 4 * 3072;
    cfg.host.blocks = 2;
    CHECK_STATUS(kvf_cache_create(e, &cfg, &c), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "host tier");
    CHECK_STR_HAS(kvf_last_error(), "both");

    /* from the environment, as text; the caller's blocks win over it */
    cfg = (kvf_cache_config)KVF_CACHE_CONFIG_INIT;
    setenv("KVF_CACHE_HOST_BYTES", "6kib", 1);
    setenv("KVF_CACHE_REMOTE", "OFF", 1);
    REQUIRE(kvf_cache_create(e, &cfg, &c) == KVF_OK);
    CHECK_EQ_U64(host_capacity(c), 2);
    REQUIRE(kvf_cache_settings(c, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "cache_host_bytes", "6144", KVF_SOURCE_ENV);
    CHECK_SETTING(s, n, "cache_remote", "off", KVF_SOURCE_ENV);
    kvf_cache_destroy(c);
    cfg.host.blocks = 5;
    REQUIRE(kvf_cache_create(e, &cfg, &c) == KVF_OK);
    CHECK_EQ_U64(host_capacity(c), 5);
    REQUIRE(kvf_cache_settings(c, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "cache_host_blocks", "5", KVF_SOURCE_CALLER);
    CHECK_SETTING(s, n, "cache_host_bytes", "0", KVF_SOURCE_DEFAULT);
    kvf_cache_destroy(c);

    /* both from the environment contradict each other */
    cfg.host.blocks = 0;
    setenv("KVF_CACHE_HOST_BLOCKS", "2", 1);
    CHECK_STATUS(kvf_cache_create(e, &cfg, &c), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "environment");
    unsetenv("KVF_CACHE_HOST_BLOCKS");
    setenv("KVF_CACHE_HOST_BYTES", "lots", 1);
    CHECK_STATUS(kvf_cache_create(e, &cfg, &c), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "KVF_CACHE_HOST_BYTES=\"lots\"");
    kvf_engine_destroy(e);
    clear_env();
    return 0;
}

/* The cache reads its settings from the engine's file. */
static int test_cache_from_file(void)
{
    clear_env();
    write_file("backend: host\ncache_host_bytes: 9KiB\ncache_event_queue: 16\n");
    setenv("KVF_CONFIG", yaml_path, 1);
    kvf_engine *e = two_pool_engine();
    kvf_cache_config cfg = KVF_CACHE_CONFIG_INIT;
    kvf_cache *c = NULL;
    REQUIRE(kvf_cache_create(e, &cfg, &c) == KVF_OK);
    CHECK_EQ_U64(host_capacity(c), 3);
    const kvf_setting *s;
    size_t n;
    REQUIRE(kvf_cache_settings(c, &s, &n) == KVF_OK);
    CHECK_SETTING(s, n, "cache_host_bytes", "9216", KVF_SOURCE_FILE);
    CHECK_SETTING(s, n, "cache_host_blocks", "3", KVF_SOURCE_FILE);
    CHECK_SETTING(s, n, "cache_event_queue", "16", KVF_SOURCE_FILE);
    kvf_cache_destroy(c);
    kvf_engine_destroy(e);

    /* what `kvferry info --config` shows, with no engine */
    kvf_setting *all = NULL;
    REQUIRE(kvf_config_settings(NULL, NULL, &all, &n) == KVF_OK);
    CHECK_SETTING(all, n, "backend", "host", KVF_SOURCE_FILE);
    CHECK_SETTING(all, n, "cache_host_bytes", "9216", KVF_SOURCE_FILE);
    CHECK_SETTING(all, n, "cache_host_blocks", "0", KVF_SOURCE_DEFAULT);
    CHECK_SETTING(all, n, "config_file", yaml_path, KVF_SOURCE_ENV);
    kvf_settings_free(all);
    kvf_settings_free(NULL);
    clear_env();
    return 0;
}

/* Without libyaml a named file is refused, never ignored. */
/* An empty or blank name, path or URL is refused naming the setting,
 * whichever source gave it: it once meant the default namespace, no disk
 * tier, or a directory named by spaces. No engine means nothing written. */
static int expect_blank_refused(const kvf_engine_config *cfg, const char *names)
{
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(cfg, &e), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), names);
    CHECK_STR_HAS(kvf_last_error(), "blank");
    CHECK(e == NULL);
    kvf_setting *s = NULL;
    size_t n = 0;
    CHECK_STATUS(kvf_config_settings(cfg, NULL, &s, &n), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), names);
    CHECK(s == NULL);
    return 0;
}

static int test_blank_strings(void)
{
    clear_env();
    char cwd[4096];
    REQUIRE(getcwd(cwd, sizeof cwd) != NULL);
    REQUIRE(chdir(dir) == 0); /* where a relative "   " would be made */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;

    /* the caller's struct */
    static const char *const blanks[] = {"", "   ", "\t\n"};
    for (size_t i = 0; i < 3; i++) {
        kvf_engine_config c = cfg;
        c.file.dir = dir;
        c.file.namespace_ = blanks[i];
        CHECK(expect_blank_refused(&c, "file_namespace") == 0);
        c = cfg;
        c.file.dir = blanks[i];
        CHECK(expect_blank_refused(&c, "file_dir") == 0);
        c = cfg;
        c.remote.url = blanks[i];
        CHECK(expect_blank_refused(&c, "remote_url") == 0);
        c = cfg;
        c.config_file = blanks[i];
        CHECK(expect_blank_refused(&c, "config_file") == 0);
    }

    /* the environment: empty is unset (documented), blank is refused */
    setenv("KVF_FILE_DIR", "   ", 1);
    CHECK(expect_blank_refused(&cfg, "KVF_FILE_DIR") == 0);
    clear_env();
    setenv("KVF_FILE_DIR", dir, 1);
    setenv("KVF_FILE_NAMESPACE", " ", 1);
    CHECK(expect_blank_refused(&cfg, "KVF_FILE_NAMESPACE") == 0);
    clear_env();
    setenv("KVF_CONFIG", " ", 1);
    CHECK(expect_blank_refused(&cfg, "KVF_CONFIG") == 0);
    clear_env();

#ifdef KVF_HAVE_YAML
    /* the config file: a quoted blank is a value, not YAML's null */
    setenv("KVF_CONFIG", yaml_path, 1);
    write_file("file_dir: \"   \"\n");
    CHECK(expect_blank_refused(&cfg, "file_dir") == 0);
    CHECK_STR_HAS(kvf_last_error(), "line 1");
    write_file("file_namespace: \"\"\n");
    CHECK(expect_blank_refused(&cfg, "file_namespace") == 0);
    write_file("remote_url: ''\n");
    CHECK(expect_blank_refused(&cfg, "remote_url") == 0);
    /* YAML's null stays unset */
    write_file("file_dir:\nfile_namespace: ~\n");
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
    kvf_engine_destroy(e);
    clear_env();
#endif
    struct stat sb;
    CHECK(stat("   ", &sb) != 0 && errno == ENOENT);
    CHECK(stat("default", &sb) != 0 && errno == ENOENT);
    REQUIRE(chdir(cwd) == 0);
    return 0;
}

static int test_no_yaml(void)
{
#ifdef KVF_HAVE_YAML
    return TEST_SKIP;
#else
    clear_env();
    write_file("backend: host\n");
    setenv("KVF_CONFIG", yaml_path, 1);
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(NULL, &e), KVF_ERR_UNSUPPORTED);
    CHECK_STR_HAS(kvf_last_error(), "libyaml");
    clear_env();
    return 0;
#endif
}

/* the settings table as a binding reads it: every kvf_engine_config field
 * once, by its config-file key and offset, each a setting the engine lists */
static int test_engine_config_keys(void)
{
    clear_env();
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    kvf_setting *all = NULL;
    size_t n, off = 0, i;
    REQUIRE(kvf_config_settings(&ec, NULL, &all, &n) == KVF_OK);
    bool seen[sizeof(kvf_engine_config)] = {false};
    const char *key;
    for (i = 0; (key = kvf_engine_config_key(i, &off)) != NULL; i++) {
        CHECK(off >= sizeof(size_t) && off < sizeof(kvf_engine_config) && !seen[off]);
        if (off < sizeof seen)
            seen[off] = true;
        CHECK(find(all, n, key) != NULL);
        if (!strcmp(key, "backend"))
            CHECK_EQ_INT(off, offsetof(kvf_engine_config, backend));
        if (!strcmp(key, "file_namespace"))
            CHECK_EQ_INT(off, offsetof(kvf_engine_config, file.namespace_));
        if (!strcmp(key, "cuda_copy_sms"))
            CHECK_EQ_INT(off, offsetof(kvf_engine_config, cuda.copy_sms));
        if (!strcmp(key, "config_file"))
            CHECK_EQ_INT(off, offsetof(kvf_engine_config, config_file));
    }
    CHECK(i > 0 && kvf_engine_config_key(i, NULL) == NULL &&
          kvf_engine_config_key(0, NULL) != NULL);
    CHECK(kvf_engine_config_key((size_t)-1, &off) == NULL);
    kvf_settings_free(all);
    return 0;
}

int main(void)
{
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    snprintf(yaml_path, sizeof yaml_path, "%s/kvferry.yaml", dir);
    RUN(test_size_parse);
    RUN(test_env_case_insensitive);
    RUN(test_env_bad_value);
    RUN(test_renamed);
    RUN(test_nested_fields);
    RUN(test_engine_config_keys);
#ifdef KVF_HAVE_YAML
    RUN(test_file_and_precedence);
    RUN(test_file_errors);
    RUN(test_cache_from_file);
#endif
    RUN(test_cache_bytes);
    RUN(test_blank_strings);
    RUN(test_no_yaml);
    test_rmtree(dir);
    return TEST_RESULT();
}
