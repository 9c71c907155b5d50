/* The C reader and writer of jobwheel.schemas.flat: the same records, kinds and checks as the
 * Python that flat.py generates, which stays the reference (tests/unit/test_flat_codec.py holds
 * this module to it, input for input) and the fallback when this module is not built.
 *
 * Why C: the scheduler, the workers and the status sink spend a large share of their
 * per-record CPU in these few functions; the generated Python pays an interpreted bytecode per
 * byte-level step (one varint byte, one range check), this code does not.
 *
 * One type, Record, built by FlatRecord with what it computes for its own generated code:
 *
 *     Record(names, kinds, symbols, index, error)
 *
 * names: the field names (the attributes the writer reads); kinds: flat.py's field kinds
 * (_STRING ... _UNION, | _NULLABLE); symbols: per field, the enum's symbols (a tuple of str),
 * a nested record's Record, a union's ((full name, Record), ...), else None; index: None (a
 * reader only) or per field the dict symbol -> varint bytes of an enum field, else None;
 * error: FlatError, raised for every input it refuses.
 *
 *     record.decode(data, pos=0) -> list     the Avro body at data[pos:], all of it
 *     record.write(o, head) -> bytes         head + the body of o's attributes
 *     record(data, pos, size) -> (list, pos) a nested body (bytes up to size), as flat.py's
 *
 * A Record is immutable once built; the module has no state. Only bytes are read: anything
 * else is a TypeError (the codec passes exact bytes).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* flat.py's field kinds; a union with null adds K_NULLABLE to the value's own kind. */
enum { K_STRING = 0, K_LONG, K_INT, K_ENUM, K_BOOL, K_NULL, K_RECORD, K_UNION };
#define K_NULLABLE 8
#define K_MASK 7
/* Records nested in records: the reader recurses once per level (about a hundred bytes of C
 * stack each). flat.py's own recursion over a schema (three Python calls per level) stops
 * before this; the bound keeps a chain of Records built by hand from exhausting the stack. */
#define MAX_DEPTH 1000
/* Union of records: flat.py gives one to unions of fewer than 64 branches (a one-byte index). */
#define MAX_BRANCHES 63

typedef struct {
    int kind;
    PyObject *name;    /* interned str: the attribute the writer reads, and error messages */
    PyObject *symbols; /* enum: tuple of str; record: Record; union: tuple of (str, Record) */
    PyObject *index;   /* enum of a writer: a private copy of symbol -> varint bytes */
    Py_ssize_t count;  /* enum: symbols; union: branches */
} Field;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nfields;
    Field *fields;
    PyObject *error;   /* FlatError */
    int writes;        /* flat fields and an index: write() is allowed */
    int depth;         /* 1 + the deepest nested record */
} RecordObject;

static PyTypeObject Record_Type;

/* --- errors ---------------------------------------------------------------------------- */

static PyObject *
refuse(RecordObject *r, const Field *f, const char *what)
{
    PyErr_Format(r->error, "%U: %s", f->name, what);
    return NULL;
}

/* --- reader ---------------------------------------------------------------------------- */

/* A zigzag varint at p[*pos]: 0 and the value in *out, or -1 with FlatError set when the bytes
 * end first, it is longer than 10 bytes, or its value does not fit 64 bits. Python's
 * _read_varint refuses the same: an 11th byte, and every 10-byte value beyond 64 bits, which is
 * out of range for an int or a long and a negative or impossible length for a string. */
static inline int
read_zigzag(RecordObject *r, const Field *f, const unsigned char *p, Py_ssize_t size,
            Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t at = *pos;
    if (at >= size) {
        refuse(r, f, "truncated");
        return -1;
    }
    unsigned int b = p[at++];
    uint64_t n = b & 0x7F;
    if (b >= 0x80) {
        for (int shift = 7;; shift += 7) {
            if (at >= size) {
                refuse(r, f, "truncated");
                return -1;
            }
            b = p[at++];
            if (shift == 63) { /* the 10th byte: one bit left, and no 11th */
                if (b >= 0x80) {
                    refuse(r, f, "varint longer than 10 bytes");
                    return -1;
                }
                if (b > 1) {
                    refuse(r, f, "integer out of range");
                    return -1;
                }
                n |= (uint64_t)b << 63;
                break;
            }
            n |= (uint64_t)(b & 0x7F) << shift;
            if (b < 0x80) {
                break;
            }
        }
    }
    *out = (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
    *pos = at;
    return 0;
}

static PyObject *read_body(RecordObject *r, const unsigned char *p, Py_ssize_t size,
                           Py_ssize_t *pos);

/* The value of one field at p[*pos], moving *pos past it; NULL with an error set. */
static PyObject *
read_field(RecordObject *r, const Field *f, const unsigned char *p, Py_ssize_t size,
           Py_ssize_t *pos)
{
    int kind = f->kind;
    int64_t n;
    unsigned int b;
    if (kind & K_NULLABLE) {
        if (*pos >= size) {
            return refuse(r, f, "truncated");
        }
        b = p[(*pos)++];
        if (b == 0) {
            Py_RETURN_NONE;
        }
        if (b != 2) { /* zigzag 1: the second branch */
            return refuse(r, f, "union branch byte not 0 or 2");
        }
        kind &= K_MASK;
    }
    switch (kind) {
    case K_STRING: {
        if (read_zigzag(r, f, p, size, pos, &n) < 0) {
            return NULL;
        }
        if (n < 0) {
            return refuse(r, f, "negative string length");
        }
        if ((uint64_t)n > (uint64_t)(size - *pos)) {
            return refuse(r, f, "string past the end");
        }
        PyObject *s = PyUnicode_DecodeUTF8((const char *)p + *pos, (Py_ssize_t)n, NULL);
        if (s == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return refuse(r, f, "string is not UTF-8");
            }
            return NULL;
        }
        *pos += (Py_ssize_t)n;
        return s;
    }
    case K_LONG:
        if (read_zigzag(r, f, p, size, pos, &n) < 0) {
            return NULL;
        }
        return PyLong_FromLongLong(n);
    case K_INT:
        if (read_zigzag(r, f, p, size, pos, &n) < 0) {
            return NULL;
        }
        if (n < INT32_MIN || n > INT32_MAX) {
            return refuse(r, f, "integer out of range");
        }
        return PyLong_FromLong((long)n);
    case K_ENUM:
        if (read_zigzag(r, f, p, size, pos, &n) < 0) {
            return NULL;
        }
        if (n < 0 || n >= f->count) {
            return refuse(r, f, "enum index out of range");
        }
        return Py_NewRef(PyTuple_GET_ITEM(f->symbols, (Py_ssize_t)n));
    case K_BOOL:
        if (*pos >= size) {
            return refuse(r, f, "truncated");
        }
        b = p[(*pos)++];
        if (b > 1) {
            return refuse(r, f, "boolean byte not 0 or 1");
        }
        return Py_NewRef(b ? Py_True : Py_False);
    case K_NULL:
        Py_RETURN_NONE;
    case K_RECORD:
        return read_body((RecordObject *)f->symbols, p, size, pos);
    case K_UNION: {
        if (*pos >= size) {
            return refuse(r, f, "truncated");
        }
        b = p[(*pos)++];
        if ((b & 1) || b >= (unsigned int)f->count * 2) {
            return refuse(r, f, "union index out of range");
        }
        PyObject *branch = PyTuple_GET_ITEM(f->symbols, b >> 1);
        PyObject *values =
            read_body((RecordObject *)PyTuple_GET_ITEM(branch, 1), p, size, pos);
        if (values == NULL) {
            return NULL;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(pair, 0, Py_NewRef(PyTuple_GET_ITEM(branch, 0)));
        PyTuple_SET_ITEM(pair, 1, values);
        return pair;
    }
    }
    PyErr_SetString(PyExc_SystemError, "flat record: unknown field kind");
    return NULL;
}

/* The values of r's fields from p[*pos], moving *pos past them; NULL with an error set. */
static PyObject *
read_body(RecordObject *r, const unsigned char *p, Py_ssize_t size, Py_ssize_t *pos)
{
    PyObject *values = PyList_New(r->nfields);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < r->nfields; i++) {
        PyObject *value = read_field(r, &r->fields[i], p, size, pos);
        if (value == NULL) {
            Py_DECREF(values); /* the items not set yet are NULL */
            return NULL;
        }
        PyList_SET_ITEM(values, i, value);
    }
    return values;
}

/* --- arguments ------------------------------------------------------------------------- */

/* Positional and keyword arguments of a METH_FASTCALL | METH_KEYWORDS call into out[], as a
 * Python function def f(names[0], names[1]=...) would take them; out[i] NULL when not given. */
static int
take_args(const char *function, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
          const char *const *names, Py_ssize_t total, Py_ssize_t required, PyObject **out)
{
    if (nargs > total) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd positional arguments (%zd given)",
                     function, total, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < total; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t j = 0;
        while (j < total && PyUnicode_CompareWithASCIIString(key, names[j]) != 0) {
            j++;
        }
        if (j == total) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                         function, key);
            return -1;
        }
        if (out[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                         function, names[j]);
            return -1;
        }
        out[j] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", function,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

static const char *const decode_names[] = {"data", "pos"};

static PyObject *
Record_decode(RecordObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[2];
    if (take_args("decode", args, nargs, kwnames, decode_names, 2, 1, given) < 0) {
        return NULL;
    }
    PyObject *data = given[0];
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "decode() reads bytes, not %.100s",
                     Py_TYPE(data)->tp_name);
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    Py_ssize_t pos = 0;
    if (given[1] != NULL) {
        pos = PyNumber_AsSsize_t(given[1], NULL); /* clamped: out of range either way */
        if (pos == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (pos < 0 || pos > size) {
            PyErr_Format(self->error, "position %zd outside the %zd bytes", pos, size);
            return NULL;
        }
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    PyObject *values = read_body(self, p, size, &pos);
    if (values != NULL && pos != size) {
        Py_DECREF(values);
        PyErr_Format(self->error, "%zd trailing bytes", size - pos);
        return NULL;
    }
    return values;
}

/* record(data, pos, size): a nested body, as flat.py's body readers; bytes from size on are
 * treated as absent. Parents in this module call read_body directly. */
static PyObject *
Record_call(RecordObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *data;
    Py_ssize_t pos, size;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "a body reader takes (data, pos, size) by position");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!nn:body", &PyBytes_Type, &data, &pos, &size)) {
        return NULL;
    }
    if (size > PyBytes_GET_SIZE(data)) {
        size = PyBytes_GET_SIZE(data);
    }
    if (pos < 0 || pos > size) {
        PyErr_Format(self->error, "position %zd outside the %zd bytes", pos, size);
        return NULL;
    }
    PyObject *values =
        read_body(self, (const unsigned char *)PyBytes_AS_STRING(data), size, &pos);
    if (values == NULL) {
        return NULL;
    }
    PyObject *end = PyLong_FromSsize_t(pos);
    if (end == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(values);
        Py_DECREF(end);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, values);
    PyTuple_SET_ITEM(pair, 1, end);
    return pair;
}

/* --- writer ---------------------------------------------------------------------------- */

/* The bytes written so far: on the stack up to its size, then on the heap. */
typedef struct {
    unsigned char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
    unsigned char stack[1024];
} Buffer;

static int
buffer_grow(Buffer *b, Py_ssize_t more)
{
    if (more > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = b->cap * 2;
    if (cap < b->len + more) {
        cap = b->len + more;
    }
    unsigned char *p;
    if (b->p == b->stack) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, b->p, (size_t)b->len);
        }
    }
    else {
        p = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
buffer_reserve(Buffer *b, Py_ssize_t more)
{
    return b->cap - b->len >= more ? 0 : buffer_grow(b, more);
}

static inline void
buffer_free(Buffer *b)
{
    if (b->p != b->stack) {
        PyMem_Free(b->p);
    }
}

/* The varint of n after a reserve of at least 10 bytes. */
static inline void
put_varint(Buffer *b, uint64_t n)
{
    unsigned char *out = b->p + b->len;
    while (n >= 0x80) {
        *out++ = (unsigned char)(n | 0x80);
        n >>= 7;
    }
    *out++ = (unsigned char)n;
    b->len = out - b->p;
}

static inline int
put_bytes(Buffer *b, const char *s, Py_ssize_t n)
{
    if (buffer_reserve(b, n + 10) < 0) {
        return -1;
    }
    put_varint(b, (uint64_t)n << 1);
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

/* Field f's value x into b: 0, or -1 with an error set. The checks are the generated Python's
 * (flat._encoder_source), in its order. */
static int
write_field(RecordObject *r, const Field *f, PyObject *x, Buffer *b)
{
    int kind = f->kind;
    if (buffer_reserve(b, 11) < 0) {
        return -1;
    }
    if (kind & K_NULLABLE) {
        if (x == Py_None) {
            b->p[b->len++] = 0;
            return 0;
        }
        b->p[b->len++] = 2;
        kind &= K_MASK;
    }
    switch (kind) {
    case K_STRING:
        if (!PyUnicode_CheckExact(x)) {
            refuse(r, f, "not a str");
            return -1;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(x) < 0) {
            return -1;
        }
#endif
        if (PyUnicode_IS_ASCII(x)) { /* its characters are its UTF-8 */
            return put_bytes(b, (const char *)PyUnicode_DATA(x), PyUnicode_GET_LENGTH(x));
        }
        else {
            /* A new bytes, as str.encode: a lone surrogate raises UnicodeEncodeError. */
            PyObject *s = PyUnicode_AsUTF8String(x);
            if (s == NULL) {
                return -1;
            }
            int rc = put_bytes(b, PyBytes_AS_STRING(s), PyBytes_GET_SIZE(s));
            Py_DECREF(s);
            return rc;
        }
    case K_LONG:
    case K_INT: {
        if (!PyLong_CheckExact(x)) { /* type(x) is not int: a bool is refused */
            refuse(r, f, "not an int in range");
            return -1;
        }
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || (kind == K_INT && (v < INT32_MIN || v > INT32_MAX))) {
            refuse(r, f, "not an int in range");
            return -1;
        }
        put_varint(b, ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0));
        return 0;
    }
    case K_ENUM: {
        /* A str or a StrEnum member, looked up as the Python does (INDEX[i].get(x)). */
        PyObject *varint = PyUnicode_Check(x) ? PyDict_GetItemWithError(f->index, x) : NULL;
        if (varint == NULL) {
            if (!PyErr_Occurred()) {
                refuse(r, f, "not a symbol");
            }
            return -1;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(varint); /* bytes: checked when the copy was made */
        if (buffer_reserve(b, n) < 0) {
            return -1;
        }
        memcpy(b->p + b->len, PyBytes_AS_STRING(varint), (size_t)n);
        b->len += n;
        return 0;
    }
    case K_BOOL:
        if (!PyBool_Check(x)) {
            refuse(r, f, "not a bool");
            return -1;
        }
        b->p[b->len++] = x == Py_True;
        return 0;
    case K_NULL:
        if (x != Py_None) {
            refuse(r, f, "not None");
            return -1;
        }
        return 0;
    }
    PyErr_SetString(PyExc_SystemError, "flat record: a nested field has no writer");
    return -1;
}

static const char *const write_names[] = {"o", "head"};

static PyObject *
Record_write(RecordObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[2];
    if (take_args("write", args, nargs, kwnames, write_names, 2, 2, given) < 0) {
        return NULL;
    }
    if (!self->writes) {
        PyErr_SetString(self->error, "a reader of nested records does not write");
        return NULL;
    }
    PyObject *o = given[0], *head = given[1];
    Buffer b;
    b.p = b.stack;
    b.len = 0;
    b.cap = (Py_ssize_t)sizeof(b.stack);
    /* bytes head first; any other is joined at the end, as b''.join would (after the fields'
     * own errors, which come first in the Python too) */
    int head_first = PyBytes_Check(head);
    if (head_first) {
        Py_ssize_t n = PyBytes_GET_SIZE(head);
        if (buffer_reserve(&b, n) < 0) {
            return NULL;
        }
        memcpy(b.p, PyBytes_AS_STRING(head), (size_t)n);
        b.len = n;
    }
    for (Py_ssize_t i = 0; i < self->nfields; i++) {
        const Field *f = &self->fields[i];
        PyObject *x = PyObject_GetAttr(o, f->name);
        if (x == NULL) {
            buffer_free(&b);
            return NULL;
        }
        int rc = write_field(self, f, x, &b);
        Py_DECREF(x);
        if (rc < 0) {
            buffer_free(&b);
            return NULL;
        }
    }
    PyObject *out;
    if (head_first) {
        out = PyBytes_FromStringAndSize((const char *)b.p, b.len);
    }
    else {
        Py_buffer view;
        if (PyObject_GetBuffer(head, &view, PyBUF_SIMPLE) < 0) {
            buffer_free(&b);
            return NULL;
        }
        out = PyBytes_FromStringAndSize(NULL, view.len + b.len);
        if (out != NULL) {
            memcpy(PyBytes_AS_STRING(out), view.buf, (size_t)view.len);
            memcpy(PyBytes_AS_STRING(out) + view.len, b.p, (size_t)b.len);
        }
        PyBuffer_Release(&view);
    }
    buffer_free(&b);
    return out;
}

/* --- construction ---------------------------------------------------------------------- */

static int
Record_traverse(RecordObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->error);
    for (Py_ssize_t i = 0; i < self->nfields; i++) {
        Py_VISIT(self->fields[i].name);
        Py_VISIT(self->fields[i].symbols);
        Py_VISIT(self->fields[i].index);
    }
    return 0;
}

static int
Record_clear(RecordObject *self)
{
    Field *fields = self->fields;
    Py_ssize_t n = self->nfields;
    self->fields = NULL;
    self->nfields = 0; /* a cleared record reads and writes no fields, never freed memory */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_CLEAR(fields[i].name);
        Py_CLEAR(fields[i].symbols);
        Py_CLEAR(fields[i].index);
    }
    PyMem_Free(fields);
    Py_CLEAR(self->error);
    return 0;
}

static void
Record_dealloc(RecordObject *self)
{
    PyObject_GC_UnTrack(self);
    Record_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The depth of a nested Record, or -1 with TypeError set when obj is not one. */
static int
nested_depth(PyObject *obj)
{
    if (!Py_IS_TYPE(obj, &Record_Type)) {
        PyErr_Format(PyExc_TypeError, "a nested reader must be a Record, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return ((RecordObject *)obj)->depth;
}

/* Field i of the constructor's arguments into f; 0, or -1 with an error set. */
static int
build_field(RecordObject *self, Field *f, PyObject *name, PyObject *kind_obj,
            PyObject *symbols, PyObject *index)
{
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "field names must be str");
        return -1;
    }
    f->name = Py_NewRef(name);
    PyUnicode_InternInPlace(&f->name);
    long kind = PyLong_Check(kind_obj) ? PyLong_AsLong(kind_obj) : -1;
    if (kind == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* flat.py's kinds: a flat one, or a union of null and a flat one other than null */
    int flat = (kind >= K_STRING && kind <= K_NULL) ||
               (kind >= K_NULLABLE && kind <= (K_NULLABLE | K_BOOL));
    if (!flat && kind != K_RECORD && kind != K_UNION) {
        PyErr_Format(PyExc_ValueError, "field %R: unknown kind %ld", name, kind);
        return -1;
    }
    f->kind = (int)kind;
    int depth = 0;
    switch (kind & K_MASK) {
    case K_ENUM:
        if (!PyTuple_Check(symbols)) {
            PyErr_Format(PyExc_TypeError, "enum field %R: symbols must be a tuple", name);
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(symbols); j++) {
            if (!PyUnicode_Check(PyTuple_GET_ITEM(symbols, j))) {
                PyErr_Format(PyExc_TypeError, "enum field %R: symbols must be str", name);
                return -1;
            }
        }
        f->count = PyTuple_GET_SIZE(symbols);
        f->symbols = Py_NewRef(symbols);
        if (index != Py_None) {
            if (!PyDict_Check(index)) {
                PyErr_Format(PyExc_TypeError, "enum field %R: index must be a dict", name);
                return -1;
            }
            f->index = PyDict_Copy(index); /* private: nobody changes it after the checks */
            if (f->index == NULL) {
                return -1;
            }
            Py_ssize_t at = 0;
            PyObject *key, *value;
            while (PyDict_Next(f->index, &at, &key, &value)) {
                if (!PyBytes_Check(value)) {
                    PyErr_Format(PyExc_TypeError, "enum field %R: index values must be bytes",
                                 name);
                    return -1;
                }
            }
        }
        else if (self->writes) {
            PyErr_Format(PyExc_TypeError, "enum field %R of a writer has no index", name);
            return -1;
        }
        break;
    case K_RECORD:
        depth = nested_depth(symbols);
        if (depth < 0) {
            return -1;
        }
        f->symbols = Py_NewRef(symbols);
        break;
    case K_UNION:
        if (!PyTuple_Check(symbols) || PyTuple_GET_SIZE(symbols) == 0 ||
            PyTuple_GET_SIZE(symbols) > MAX_BRANCHES) {
            PyErr_Format(PyExc_TypeError,
                         "union field %R: branches must be a tuple of 1 to %d", name,
                         MAX_BRANCHES);
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(symbols); j++) {
            PyObject *branch = PyTuple_GET_ITEM(symbols, j);
            if (!PyTuple_Check(branch) || PyTuple_GET_SIZE(branch) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(branch, 0))) {
                PyErr_Format(PyExc_TypeError,
                             "union field %R: a branch is (full name, reader)", name);
                return -1;
            }
            int d = nested_depth(PyTuple_GET_ITEM(branch, 1));
            if (d < 0) {
                return -1;
            }
            depth = d > depth ? d : depth;
        }
        f->count = PyTuple_GET_SIZE(symbols);
        f->symbols = Py_NewRef(symbols);
        break;
    }
    if (depth + 1 > self->depth) {
        self->depth = depth + 1;
    }
    return 0;
}

static PyObject *
Record_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"names", "kinds", "symbols", "index", "error", NULL};
    PyObject *names, *kinds, *symbols, *index, *error;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!OO:Record", keywords, &PyTuple_Type,
                                     &names, &PyTuple_Type, &kinds, &PyTuple_Type, &symbols,
                                     &index, &error)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(kinds) != n || PyTuple_GET_SIZE(symbols) != n ||
        (index != Py_None && (!PyTuple_Check(index) || PyTuple_GET_SIZE(index) != n))) {
        PyErr_SetString(PyExc_ValueError,
                        "names, kinds, symbols and index (a tuple or None) differ in length");
        return NULL;
    }
    if (!PyType_Check(error) ||
        !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "error must be an exception class");
        return NULL;
    }
    RecordObject *self = PyObject_GC_New(RecordObject, type);
    if (self == NULL) {
        return NULL;
    }
    self->nfields = 0;
    self->error = Py_NewRef(error);
    self->writes = index != Py_None;
    self->depth = 1;
    self->fields = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Field));
    if (self->fields == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        self->nfields = i + 1; /* what Record_clear frees if this field fails half-built */
        PyObject *field_index = index == Py_None ? Py_None : PyTuple_GET_ITEM(index, i);
        if (build_field(self, &self->fields[i], PyTuple_GET_ITEM(names, i),
                        PyTuple_GET_ITEM(kinds, i), PyTuple_GET_ITEM(symbols, i),
                        field_index) < 0) {
            goto fail;
        }
        if (self->fields[i].kind == K_RECORD || self->fields[i].kind == K_UNION) {
            self->writes = 0;
        }
    }
    if (self->depth > MAX_DEPTH) {
        PyErr_Format(PyExc_ValueError, "records nested more than %d deep", MAX_DEPTH);
        goto fail;
    }
    PyObject_GC_Track(self);
    return (PyObject *)self;
fail:
    Py_DECREF(self); /* not tracked yet: dealloc untracks nothing and frees what is built */
    return NULL;
}

static PyObject *
Record_repr(RecordObject *self)
{
    return PyUnicode_FromFormat("<flat record of %zd fields>", self->nfields);
}

static PyMethodDef Record_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))Record_decode, METH_FASTCALL | METH_KEYWORDS,
     "decode(data, pos=0) -> list: the field values of the Avro body data[pos:], which must\n"
     "end with the last field; raises the record's error (FlatError) for any other bytes."},
    {"write", (PyCFunction)(void (*)(void))Record_write, METH_FASTCALL | METH_KEYWORDS,
     "write(o, head) -> bytes: head + the Avro body of o's attributes; raises FlatError for\n"
     "a value that is not exactly of its field's type."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Record_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jobwheel.schemas._flat.Record",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Record(names, kinds, symbols, index, error): the reader and writer of one flat\n"
              "record schema (see jobwheel.schemas.flat.FlatRecord, which builds it).",
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_traverse = (traverseproc)Record_traverse,
    .tp_clear = (inquiry)Record_clear,
    .tp_call = (ternaryfunc)Record_call,
    .tp_repr = (reprfunc)Record_repr,
    .tp_methods = Record_methods,
};

static struct PyModuleDef flat_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "jobwheel.schemas._flat",
    .m_doc = "The C reader and writer of jobwheel.schemas.flat (its Python is the reference).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__flat(void)
{
    if (PyType_Ready(&Record_Type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&flat_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Record", (PyObject *)&Record_Type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
