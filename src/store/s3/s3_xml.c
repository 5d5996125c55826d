/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 answers the store reads (s3_http.h), parsed with expat: an error
 * body's Code and Message, a ListObjectsV2 page.
 */
#include "s3_http.h"

#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The text of the element being read, and where the parse is. */
typedef struct xml_state {
    char text[1100];
    size_t len;
    int depth;
    bool in_contents;
    /* error */
    char code[64], message[256];
    /* listing */
    bool is_list;
    char name[1100];
    uint64_t size;
    int64_t mtime_ns;
    char *token;
    size_t token_cap;
    kvf__s3_list_fn fn;
    void *arg;
} xml_state;

static void on_start(void *arg, const XML_Char *el, const XML_Char **attr)
{
    (void)attr;
    xml_state *x = arg;
    x->len = 0;
    x->text[0] = '\0';
    x->depth++;
    if (x->depth == 1 && !strcmp(el, "ListBucketResult"))
        x->is_list = true;
    if (x->depth == 2 && !strcmp(el, "Contents")) {
        x->in_contents = true;
        x->name[0] = '\0';
        x->size = 0;
        x->mtime_ns = 0;
    }
}

static void on_text(void *arg, const XML_Char *s, int len)
{
    xml_state *x = arg;
    size_t k = sizeof x->text - 1 - x->len;
    k = (size_t)len < k ? (size_t)len : k;
    memcpy(x->text + x->len, s, k);
    x->len += k;
    x->text[x->len] = '\0';
}

/* "YYYY-MM-DDThh:mm:ssZ", or with ".000Z" before the Z: ns since the epoch (0: unread) */
static int64_t iso_time(const char *s)
{
    struct tm tm = {0};
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec) != 6)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t < 0 ? 0 : (int64_t)t * 1000000000;
}

static void on_end(void *arg, const XML_Char *el)
{
    xml_state *x = arg;
    if (x->depth == 2 && !strcmp(el, "Code"))
        snprintf(x->code, sizeof x->code, "%.63s", x->text);
    else if (x->depth == 2 && !strcmp(el, "Message"))
        snprintf(x->message, sizeof x->message, "%.255s", x->text);
    else if (x->depth == 2 && !strcmp(el, "NextContinuationToken") && x->token)
        snprintf(x->token, x->token_cap, "%s", x->text);
    else if (x->depth == 3 && x->in_contents && !strcmp(el, "Key"))
        snprintf(x->name, sizeof x->name, "%s", x->text);
    else if (x->depth == 3 && x->in_contents && !strcmp(el, "Size"))
        x->size = strtoull(x->text, NULL, 10);
    else if (x->depth == 3 && x->in_contents && !strcmp(el, "LastModified"))
        x->mtime_ns = iso_time(x->text);
    else if (x->depth == 2 && x->in_contents && !strcmp(el, "Contents")) {
        x->in_contents = false;
        if (x->fn && x->name[0])
            x->fn(x->arg, x->name, x->size, x->mtime_ns);
    }
    x->depth--;
    x->len = 0;
}

static bool parse(const char *body, size_t len, xml_state *x)
{
    XML_Parser p = XML_ParserCreate(NULL);
    if (!p)
        return false;
    XML_SetUserData(p, x);
    XML_SetElementHandler(p, on_start, on_end);
    XML_SetCharacterDataHandler(p, on_text);
    bool ok = XML_Parse(p, body, (int)len, 1) == XML_STATUS_OK;
    XML_ParserFree(p);
    return ok;
}

void kvf__s3_xml_error(const char *body, size_t len, char *out, size_t cap)
{
    xml_state *x = calloc(1, sizeof *x);
    out[0] = '\0';
    if (x && len && parse(body, len, x) && x->code[0])
        snprintf(out, cap, "%s%s%s", x->code, x->message[0] ? ": " : "", x->message);
    free(x);
}

kvf_status kvf__s3_xml_list(const char *body, size_t len, kvf__s3_list_fn fn, void *arg,
                            char *next_token, size_t cap)
{
    xml_state *x = calloc(1, sizeof *x);
    if (!x)
        return kvf__fail(KVF_ERR_NOMEM, "s3: out of memory");
    next_token[0] = '\0';
    x->fn = fn;
    x->arg = arg;
    x->token = next_token;
    x->token_cap = cap;
    bool ok = len <= (size_t)INT32_MAX && parse(body, len, x) && x->is_list;
    free(x);
    if (!ok) {
        next_token[0] = '\0';
        return kvf__fail(KVF_ERR_REMOTE, "the listing is no ListBucketResult");
    }
    return KVF_OK;
}
