/* federation.daemon._mqtt_runs: the per-message byte work of the wrapper's MQTT data path, in C.
 *
 * Theory of operation: at full rate a wrapper's Python spends about a microsecond per message walking
 * the bytes of each PUBLISH it reads from its broker (the sending side) and as much again building each
 * PUBLISH it writes into its broker (the receiving side); at the bridge chain's rate every microsecond
 * of a wrapper is taken from the brokers on a 2-CPU machine (docs/benchmarks.md). These two loops do
 * that walk over a whole run of packets and hand Python lists, so what is left per message in Python
 * is list work at C speed. federation/daemon/mqtt_runs.py holds the same two functions in Python (the
 * reference the tests compare this with, used where this module was not built) and documents them.
 * Nothing here keeps state, allocates beyond the objects it returns, or touches a socket.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_REMAINING_LENGTH 268435455L /* MQTT's largest remaining length (four length bytes) */

/* Append a new reference to `list` and drop it (NULL: the error its maker set); 0, or -1 on an error. */
static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    const int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* parse_plain_run(data, pos, limit) -> (end, qos, topics, payloads, mids): see mqtt_runs.py */
static PyObject *parse_plain_run(PyObject *module, PyObject *args) {
    Py_buffer buffer;
    Py_ssize_t pos, limit;
    if (!PyArg_ParseTuple(args, "y*nn", &buffer, &pos, &limit))
        return NULL;
    const unsigned char *data = (const unsigned char *)buffer.buf;
    const Py_ssize_t end = buffer.len;
    PyObject *topics = PyList_New(0), *payloads = PyList_New(0), *mids = PyList_New(0);
    PyObject *result = NULL;
    int run_qos = -1;
    Py_ssize_t count = 0;
    if (topics == NULL || payloads == NULL || mids == NULL)
        goto done;
    if (pos < 0)
        pos = 0;
    while (count < limit && end - pos >= 2) {
        const unsigned char command = data[pos];
        if (command != 0x30 && command != 0x32)
            break; /* not a plain QoS 0/1 PUBLISH (DUP, retain, QoS 2, another packet) */
        const int qos = (command >> 1) & 1;
        if (run_qos >= 0 && qos != run_qos)
            break;
        Py_ssize_t start = pos + 1, length = 0;
        int shift = 0, complete = 0;
        for (int i = 0; i < 4 && start < end; i++) {
            const unsigned char byte = data[start++];
            length |= (Py_ssize_t)(byte & 0x7F) << shift;
            if (!(byte & 0x80)) {
                complete = 1;
                break;
            }
            shift += 7;
        }
        if (!complete || length > MAX_REMAINING_LENGTH)
            break; /* not all here yet, or malformed: the caller's own reader decides */
        const Py_ssize_t stop = start + length;
        if (stop > end || length < 4 + 2 * qos)
            break;
        const Py_ssize_t topic_length = ((Py_ssize_t)data[start] << 8) | data[start + 1];
        const Py_ssize_t topic_end = start + 2 + topic_length;
        const Py_ssize_t properties = topic_end + 2 * qos;
        if (topic_length == 0 || properties >= stop || data[properties] != 0 || data[start + 2] == '$')
            break; /* an alias, properties (the caller decodes them), a $ topic (the broker's own), malformed */
        PyObject *topic = PyUnicode_DecodeUTF8((const char *)data + start + 2, topic_length, NULL);
        if (topic == NULL) {
            PyErr_Clear(); /* not UTF-8: the caller's own reader acknowledges and drops it */
            break;
        }
        if (append_new(topics, topic) ||
            append_new(payloads, PyBytes_FromStringAndSize((const char *)data + properties + 1,
                                                           stop - properties - 1)) ||
            (qos && append_new(mids, PyLong_FromLong(((long)data[topic_end] << 8) | data[topic_end + 1]))))
            goto done;
        run_qos = qos;
        pos = stop;
        count++;
    }
    result = Py_BuildValue("niOOO", pos, run_qos < 0 ? 0 : run_qos, topics, payloads, mids);
done:
    Py_XDECREF(topics);
    Py_XDECREF(payloads);
    Py_XDECREF(mids);
    PyBuffer_Release(&buffer);
    return result;
}

/* Append the remaining length of an MQTT packet to `out` (at most four bytes); returns the bytes written. */
static int put_length(unsigned char *out, Py_ssize_t length) {
    int written = 0;
    do {
        unsigned char byte = length & 0x7F;
        length >>= 7;
        out[written++] = length ? (byte | 0x80) : byte;
    } while (length);
    return written;
}

/* append_qos0_run(out, topics, payloads, retain) -> count: see mqtt_runs.py */
static PyObject *append_qos0_run(PyObject *module, PyObject *args) {
    PyObject *out, *topics, *payloads;
    int retain;
    if (!PyArg_ParseTuple(args, "O!O!O!p", &PyByteArray_Type, &out, &PyList_Type, &topics, &PyList_Type, &payloads,
                          &retain))
        return NULL;
    const Py_ssize_t items = PyList_GET_SIZE(topics) < PyList_GET_SIZE(payloads) ? PyList_GET_SIZE(topics)
                                                                                  : PyList_GET_SIZE(payloads);
    /* First pass: how many may go (a topic that may be published, a packet within MQTT's limits) and their bytes. */
    Py_ssize_t count = 0, total = 0;
    for (; count < items; count++) {
        PyObject *topic = PyList_GET_ITEM(topics, count), *payload = PyList_GET_ITEM(payloads, count);
        if (!PyUnicode_Check(topic) || !PyBytes_Check(payload))
            break;
        Py_ssize_t topic_length;
        const char *topic_bytes = PyUnicode_AsUTF8AndSize(topic, &topic_length);
        if (topic_bytes == NULL) {
            PyErr_Clear(); /* a lone surrogate: the caller's own path refuses it */
            break;
        }
        if (topic_length == 0 || topic_length > 0xFFFF || memchr(topic_bytes, '+', topic_length) != NULL ||
            memchr(topic_bytes, '#', topic_length) != NULL)
            break;
        const Py_ssize_t length = 2 + topic_length + 1 + PyBytes_GET_SIZE(payload);
        if (length + 2 > MAX_REMAINING_LENGTH)
            break; /* paho's own limit, which leaves room for a packet id */
        total += 1 + (length < 128 ? 1 : length < 16384 ? 2 : length < 2097152 ? 3 : 4) + length;
    }
    if (count == 0)
        return PyLong_FromLong(0);
    const Py_ssize_t before = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, before + total) < 0)
        return NULL;
    unsigned char *cursor = (unsigned char *)PyByteArray_AS_STRING(out) + before;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *payload = PyList_GET_ITEM(payloads, i);
        Py_ssize_t topic_length;
        const char *topic_bytes = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(topics, i), &topic_length);
        const Py_ssize_t payload_length = PyBytes_GET_SIZE(payload);
        *cursor++ = retain ? 0x31 : 0x30;
        cursor += put_length(cursor, 2 + topic_length + 1 + payload_length);
        *cursor++ = (unsigned char)(topic_length >> 8);
        *cursor++ = (unsigned char)(topic_length & 0xFF);
        memcpy(cursor, topic_bytes, topic_length);
        cursor += topic_length;
        *cursor++ = 0; /* no properties */
        memcpy(cursor, PyBytes_AS_STRING(payload), payload_length);
        cursor += payload_length;
    }
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"parse_plain_run", parse_plain_run, METH_VARARGS, "A run of plain QoS 0/1 PUBLISH packets (mqtt_runs.py)."},
    {"append_qos0_run", append_qos0_run, METH_VARARGS, "Build a run of QoS 0 PUBLISH packets (mqtt_runs.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "federation.daemon._mqtt_runs", "The wrapper's MQTT data path loops in C (mqtt_runs.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__mqtt_runs(void) { return PyModule_Create(&module); }
