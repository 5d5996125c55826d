/* SPDX-License-Identifier: Apache-2.0 */
/* `kvferry info --config`: the settings an engine and a cache created now
 * would get, and where each comes from (caller defaults, the KVF_*
 * environment, the config file named by $KVF_CONFIG). */
#include "cli.h"

#include <stdio.h>

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

int kvf_cli_info_config(const char *json)
{
    if (kvf_cli_json_open("info", json))
        return KVF_CLI_FAILED;
    kvf_setting *s;
    size_t n;
    if (kvf_config_settings(NULL, NULL, &s, &n) != KVF_OK) {
        fprintf(stderr, "kvferry info: %s\n", kvf_last_error());
        kvf_cli_json_close("info");
        return KVF_CLI_FAILED;
    }
    print_table(s, n);
    fflush(stdout);
    int rc = json ? kvf_cli_json_emit("info", settings_json(s, n)) : 0;
    kvf_settings_free(s);
    return kvf_cli_json_close("info") || rc ? KVF_CLI_FAILED : 0;
}
