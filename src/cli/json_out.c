/* The --json output of every command (json_out.h): one object, written with jansson. */
#include "json_out.h"
#include "bfshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *cli_json_begin(const char *command)
{
    json_t *o = json_object();
    if (o && (json_object_set_new(o, "schema", json_integer(CLI_JSON_SCHEMA)) != 0 ||
              json_object_set_new(o, "command", json_string(command)) != 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *cli_json_text(const char *s)
{
    json_t *j = json_string(s);
    if (j || !s)
        return j;
    /* not UTF-8 (a path or a name from a file can be any bytes): those bytes become '?' */
    char *c = strdup(s);
    if (!c)
        return NULL;
    for (char *p = c; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(c);
    free(c);
    return j;
}

void cli_json_str(json_t *o, const char *key, const char *s)
{
    json_object_set_new(o, key, s ? cli_json_text(s) : json_null());
}

int cli_json_end(json_t *o, int rc, const char *msg) { return cli_json_end_to(o, rc, msg, stdout); }

int cli_json_end_to(json_t *o, int rc, const char *msg, FILE *out)
{
    int ret = -1;
    char *text = NULL;
    if (!o)
        goto done;
    json_object_set_new(o, "ok", json_boolean(rc == 0));
    json_object_set_new(o, "exit_code", json_integer(rc < 0 ? -rc : 0));
    if (rc < 0) {
        const char *m = msg ? msg : bfs_last_error();
        json_object_set_new(o, "error", json_pack("{s:i, s:s, s:o}", "code", -rc, "name", bfs_err_name(rc), "message",
                                                  cli_json_text(m && *m ? m : bfs_strerror(rc))));
    }
    /* JSON_ENSURE_ASCII: names read from files (control bytes, odd UTF-8) come out as \u escapes;
     * DEL, which jansson writes raw, as \u007f below (docs/ROBUSTNESS.md: the escaping rule) */
    text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    if (text) {
        int w = 0;
        for (const char *p = text; *p && w >= 0; p++)
            w = *p == 0x7f ? fputs("\\u007f", out) : fputc(*p, out) == EOF ? -1 : 0;
        if (w >= 0 && fputc('\n', out) != EOF && fflush(out) == 0)
            ret = 0;
    }
done:
    if (ret < 0) /* the one fallback: a fixed text that needs no allocation */
        fprintf(out, "{\"schema\": %d, \"ok\": false, \"exit_code\": 5, \"error\": {\"code\": 5, \"name\": \"BFS_ENOMEM\", "
               "\"message\": \"out of memory writing the JSON summary\"}}\n", CLI_JSON_SCHEMA);
    free(text);
    json_decref(o);
    return ret;
}
