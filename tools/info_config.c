/* `kvferry info --config [--json]`: the settings an engine and a cache
 * created now would get, and where each comes from (caller defaults, the
 * KVF_* environment, the config file named by $KVF_CONFIG). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_json(const kvf_setting *s, size_t n)
{
    printf("[");
    for (size_t i = 0; i < n; i++) {
        printf("%s\n  {\"name\": ", i ? "," : "");
        print_json_string(s[i].name);
        printf(", \"env\": ");
        print_json_string(s[i].env);
        printf(", \"value\": ");
        print_json_string(s[i].value);
        printf(", \"source\": \"%s\"}", kvf_setting_source_name(s[i].source));
    }
    printf("\n]\n");
}

static void print_table(const kvf_setting *s, size_t n)
{
    printf("%-28s %-24s %-12s %s\n", "setting", "value", "source", "environment variable");
    for (size_t i = 0; i < n; i++)
        printf("%-28s %-24s %-12s %s\n", s[i].name, *s[i].value ? s[i].value : "-",
               kvf_setting_source_name(s[i].source), s[i].env);
}

int kvf_cli_info_config(int argc, char **argv)
{
    int json = 0, config = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--config") == 0) {
            config = 1;
        } else {
            fprintf(stderr, "kvferry info: unknown option '%s' (--config [--json])\n", argv[i]);
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "kvferry info: --json goes with --config\n");
        return 2;
    }
    kvf_setting *s;
    size_t n;
    if (kvf_config_settings(NULL, NULL, &s, &n) != KVF_OK) {
        fprintf(stderr, "kvferry info: %s\n", kvf_last_error());
        return 1;
    }
    if (json)
        print_json(s, n);
    else
        print_table(s, n);
    kvf_settings_free(s);
    return 0;
}
