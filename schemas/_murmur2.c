/* Kafka's murmur2 (the Java client's Utils.murmur2), the C half of
 * jobwheel.schemas.partitioning. Its Python there stays the reference and the fallback when this
 * module is not built (tests/unit/test_partitioning.py holds the two to each other and to the
 * Java client's own test values).
 *
 * Why C: the scheduler checks the partition of every command it reads (a command produced to
 * the wrong partition is refused), and the Python loop costs 1.7 us for a ten-byte job id and 4
 * for a UUID, a few per cent of a command's whole cost; here it is a tenth of that.
 *
 *     murmur2(data: bytes) -> int    unsigned 32-bit, as the Python returns it
 *
 * The module has no state. Only bytes are read: anything else is a TypeError.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *
murmur2(PyObject *module, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        return PyErr_Format(PyExc_TypeError, "murmur2() takes bytes, not %.100s",
                            Py_TYPE(arg)->tp_name);
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t length = PyBytes_GET_SIZE(arg);
    const uint32_t m = 0x5bd1e995u;
    /* Java hashes an int length: a key of 2 GiB or more cannot be a Kafka record key. */
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length - (length % 4);
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef murmur2_methods[] = {
    {"murmur2", murmur2, METH_O, "murmur2(data: bytes) -> int: Kafka's murmur2, unsigned."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef murmur2_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "jobwheel.schemas._murmur2",
    .m_doc = "Kafka's murmur2 in C (jobwheel.schemas.partitioning's Python is the reference).",
    .m_size = -1,
    .m_methods = murmur2_methods,
};

PyMODINIT_FUNC
PyInit__murmur2(void)
{
    return PyModule_Create(&murmur2_module);
}
