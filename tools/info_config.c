/* SPDX-License-Identifier: Apache-2.0 */
/* `kvferry info --config`: the settings an engine and a cache created now
 * would get, and where each comes from (caller defaults, the KVF_*
 * environment, the config file named by $KVF_CONFIG). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* KVF_* variables read outside the settings table: the log's, and the
 * CLI's own. */
static const char *const other_env[] = {"KVF_LOG", "KVF_LOG_FILE", "KVF_PLOT_SCRIPT"};

static bool known_env(const char *name, size_t len, const kvf_setting *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(s[i].env) == len && !strncmp(s[i].env, name, len))
            return true;
    for (size_t i = 0; i < sizeof other_env / sizeof other_env[0]; i++)
        if (strlen(other_env[i]) == len && !strncmp(other_env[i], name, len))
            return true;
    return false;
}

void kvf_cli_warn_unknown_env(void)
{
    kvf_setting *s;
    size_t n;
    if (kvf_config_settings(NULL, NULL, &s, &n) != KVF_OK)
        return; /* a bad value or file: the command says so itself */
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "KVF_", 4) != 0 || !eq || known_env(*e, (size_t)(eq - *e), s, n))
            continue;
        fprintf(stderr,
                "kvferry: warning: %.*s is not a kvferry setting and changes nothing "
                "(kvferry info --config lists them)\n",
                (int)(eq - *e), *e);
    }
    kvf_settings_free(s);
}

static void print_table(const kvf_setting *s, size_t n)
{
    printf("%-28s %-24s %-12s %s\n", "setting", "value", "source", "environment variable");
    for (size_t i = 0; i < n; i++)
        printf("%-28s %-24s %-12s %s\n", s[i].name, *s[i].value ? s[i].value : "-",
               kvf_setting_source_name(s[i].source), s[i].env);
}

static cJSON *settings_json(const kvf_setting *s, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", s[i].name);
        cJSON_AddStringToObject(o, "env", s[i].env);
        cJSON_AddStringToObject(o, "value", s[i].value);
        cJSON_AddStringToObject(o, "source", kvf_setting_source_name(s[i].source));
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

int kvf_cli_info_config(const char *file, const char *json)
{
    /* the library reads $KVF_CONFIG, as for any engine this process makes */
    if (file && setenv("KVF_CONFIG", file, 1) != 0) {
        fprintf(stderr, "kvferry info: --config %s: cannot set KVF_CONFIG\n", file);
        return KVF_CLI_FAILED;
    }
    if (kvf_cli_json_open("info", json))
        return KVF_CLI_FAILED;
    kvf_setting *s;
    size_t n;
    kvf_status st = kvf_config_settings(NULL, NULL, &s, &n);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry info: %s\n", kvf_last_error());
        kvf_cli_json_close("info");
        return st == KVF_ERR_NOT_FOUND ? KVF_CLI_MISSING
               : st == KVF_ERR_INVALID ? KVF_CLI_USAGE
                                       : KVF_CLI_FAILED;
    }
    print_table(s, n);
    fflush(stdout);
    int rc = json ? kvf_cli_json_emit("info", settings_json(s, n)) : 0;
    kvf_settings_free(s);
    return kvf_cli_json_close("info") || rc ? KVF_CLI_FAILED : 0;
}
