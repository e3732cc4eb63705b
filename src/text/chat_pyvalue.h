/* Python/Jinja semantics on JSON values, as the chat template sees them.
 *
 * transformers renders chat templates with jinja2 over Python dicts/lists
 * (json.loads of the request). To reproduce that text byte for byte the C
 * renderer needs the same truthiness, str(), str.strip(), str.upper(),
 * dictsort order and == as Python. A NULL `const cJSON *` stands for a
 * missing key (jinja's Undefined); a cJSON null is Python's None. */
#ifndef G4_TEXT_CHAT_PYVALUE_H
#define G4_TEXT_CHAT_PYVALUE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "text/chat_strbuf.h"

/* obj[key] as jinja's subscript: NULL when obj is not an object or lacks key.
 * With duplicate keys the last one wins, as in a Python dict. */
const cJSON *py_getitem(const cJSON *obj, const char *key);

/* Python truthiness: None, False, 0, "", [], {} and missing are false. */
int py_truthy(const cJSON *v);

/* Python str() of a scalar appended to b: None -> "None", True -> "True",
 * 1 -> "1", 0.5 -> "0.5", strings as they are; missing -> "" (jinja prints an
 * Undefined as nothing). Lists and dicts (Python repr) are not supported:
 * returns 0 so the caller can fail with a clear message. */
int py_str_append(chat_strbuf *b, const cJSON *v);

/* str(v).upper() for the scalars above (ASCII letters only: returns 0 for a
 * string with non-ASCII bytes, whose Unicode upper-casing is not replicated). */
int py_upper_append(chat_strbuf *b, const cJSON *v);

/* Python repr() of a float (shortest round-trip digits, "1e-05", "1e+16",
 * "100.0"). JSON numbers that are integers below 2^53 print as ints. */
void py_number_str(double d, char out[40]);

/* Bounds of s[0..n) without leading/trailing Unicode whitespace (Python's
 * str.strip() with no argument). */
void py_strip(const char *s, size_t n, size_t *start, size_t *len);

/* Append s stripped. */
void py_strip_append(chat_strbuf *b, const char *s, size_t n);

/* The children of an object in jinja's dictsort order: keys compared after
 * lower-casing (ASCII, Latin-1, Greek and Cyrillic letters), stable. Returns
 * a malloc'd array (NULL with *n = 0 for an empty object) or NULL on
 * allocation failure with *n = (size_t)-1. */
const cJSON **py_dictsort(const cJSON *obj, size_t *n);

/* Python ==, with NULL (missing, via dict.get) equal to None; True == 1. */
int py_equal(const cJSON *a, const cJSON *b);

#endif
