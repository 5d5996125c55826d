/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Real redis-server processes for the remote tier's tests, header-only.
 *
 * Servers listen on loopback ports that were free a moment before, keep
 * nothing on disk (--save "" --appendonly no) and live in a temp dir.
 * Each dies with the test (PR_SET_PDEATHSIG), so a crashed or failed test
 * leaves none behind; redis_server_stop ends one earlier. Tests skip (77)
 * where redis-server or redis-cli is not installed.
 */
#ifndef KVF_TEST_REDIS_SERVER_H
#define KVF_TEST_REDIS_SERVER_H

#include "redis.h"
#include "testutil.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

typedef struct redis_server {
    int port;
    pid_t pid;
    char dir[256];
    char extra[16][256]; /* more arguments, e.g. "--requirepass" "pw" */
    int extras;
    bool cluster;
} redis_server;

static inline double redis_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline bool redis_tool_found(const char *name)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

static inline void redis_skip_unless_installed(void)
{
    if (!kvf__redis_built())
        TEST_SKIP_ALL("built without hiredis");
    if (!redis_tool_found("redis-server") || !redis_tool_found("redis-cli"))
        TEST_SKIP_ALL("redis-server / redis-cli not installed");
}

/* A port p with p and p + 10000 (a cluster's bus) free. */
static inline int redis_pick_port(void)
{
    static uint64_t seed;
    if (!seed)
        seed = (uint64_t)getpid() * 7919u + (uint64_t)time(NULL);
    for (int tries = 0; tries < 1000; tries++) {
        int p = 20000 + (int)(test_xorshift64(&seed) % 30000);
        if (test_port_free(p) && test_port_free(p + 10000))
            return p;
    }
    return -1;
}

/* A connection, or NULL when the server does not answer PING (LOADING and
 * such count as not ready). */
static inline redisContext *redis_connect(int port, const char *pass)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (pass) {
        redisReply *r = redisCommand(c, "AUTH %s", pass);
        if (r)
            freeReplyObject(r);
    }
    redisReply *r = redisCommand(c, "PING");
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Starts `s` on a free port, or restarts it on its port and dir; waits up
 * to 20 s for it to answer (tries another port, or again, when the server
 * exits: a port taken meanwhile). 0 or -1. */
static inline int redis_server_start(redis_server *s, const char *pass)
{
    if (!s->dir[0] && test_tmpdir(s->dir, sizeof s->dir))
        return -1;
    /* a restart keeps its port: clients (and a cluster) know it by that */
    bool restart = s->port != 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        if (!restart)
            s->port = redis_pick_port();
        else if (attempt > 0)
            usleep(500000);
        char port[16];
        snprintf(port, sizeof port, "%d", s->port);
        const char *argv[48];
        int a = 0;
        argv[a++] = "redis-server";
        argv[a++] = "--port";
        argv[a++] = port;
        argv[a++] = "--bind";
        argv[a++] = "127.0.0.1";
        argv[a++] = "--dir";
        argv[a++] = s->dir;
        argv[a++] = "--save";
        argv[a++] = "";
        argv[a++] = "--appendonly";
        argv[a++] = "no";
        argv[a++] = "--daemonize";
        argv[a++] = "no";
        argv[a++] = "--loglevel";
        argv[a++] = "warning";
        argv[a++] = "--logfile";
        argv[a++] = "redis.log";
        if (s->cluster) {
            argv[a++] = "--cluster-enabled";
            argv[a++] = "yes";
            argv[a++] = "--cluster-config-file";
            argv[a++] = "nodes.conf";
            argv[a++] = "--cluster-require-full-coverage";
            argv[a++] = "no";
            argv[a++] = "--cluster-node-timeout";
            argv[a++] = "3000";
        }
        for (int i = 0; i < s->extras; i++)
            argv[a++] = s->extra[i];
        argv[a] = NULL;
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int devnull = open("/dev/null", O_RDWR);
            if (devnull >= 0) {
                dup2(devnull, 1);
                dup2(devnull, 2);
            }
            execvp("redis-server", (char **)argv);
            _exit(127);
        }
        s->pid = pid;
        double deadline = redis_now_s() + 20;
        while (redis_now_s() < deadline) {
            redisContext *c = redis_connect(s->port, pass);
            if (c) {
                redisFree(c);
                return 0;
            }
            int wstatus;
            if (waitpid(pid, &wstatus, WNOHANG) == pid) {
                s->pid = 0;
                break; /* exited: the port was taken meanwhile, try another */
            }
            usleep(20000);
        }
        if (s->pid) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
        }
    }
    fprintf(stderr, "redis-server on port %d did not start (see %s/redis.log)\n", s->port, s->dir);
    return -1;
}

/* Ends the process (SIGKILL: no chance to save) and waits for it. */
static inline void redis_server_kill(redis_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

static inline void redis_server_stop(redis_server *s)
{
    redis_server_kill(s);
    if (s->dir[0]) {
        test_rmtree(s->dir);
        s->dir[0] = '\0';
    }
}

/* "redis://127.0.0.1:<port><suffix>" */
static inline void redis_url(char *out, size_t cap, const redis_server *s, const char *suffix)
{
    snprintf(out, cap, "redis://127.0.0.1:%d%s", s->port, suffix ? suffix : "");
}

/* A command on a fresh connection, its reply checked for type; 0 or -1. */
static inline int redis_run(int port, const char *pass, int want_type, const char *fmt, ...)
{
    redisContext *c = redis_connect(port, pass);
    if (!c)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    int rc = r && (want_type == 0 || r->type == want_type) ? 0 : -1;
    if (rc)
        fprintf(stderr, "redis %d: %s: %s\n", port, fmt, r && r->str ? r->str : c->errstr);
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return rc;
}

#endif /* KVF_TEST_REDIS_SERVER_H */
