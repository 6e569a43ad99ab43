/* The host hot path of Session.run in C: the recording loop (one pipeline / bind group /
 * dispatch triple per plan dispatch, recorded into an open wgpu-native compute pass) and the
 * staging of the graph inputs into the host copy of the session's input buffer.
 *
 * Python calls wgpu-native through cffi's ABI mode at about 0.3-0.8 us per call, and a
 * dispatch needs two or three calls; this loop makes the same calls through the function
 * pointers of the loaded wgpu-native library. It releases the GIL while it records, so the
 * thread that submitted the previous run (input writes, read-back) is not held up while
 * Session records the next run on its background thread.
 *
 * record(pass, commands, set_pipeline, set_bind_group, dispatch) -> None
 *   pass            WGPUComputePassEncoder handle (int)
 *   commands        C-contiguous buffer of 64-bit unsigned integers (numpy uint64), [n, 5]:
 *                   pipeline handle, bind-group handle, workgroups x, y, z
 *   set_pipeline,   addresses (int) of wgpuComputePassEncoderSetPipeline,
 *   set_bind_group, wgpuComputePassEncoderSetBindGroup and
 *   dispatch        wgpuComputePassEncoderDispatchWorkgroups (webgpu.h signatures)
 * Raises ValueError when the buffer is not C-contiguous 64-bit unsigned integers in whole
 * 5-word rows, or a handle is 0. Validation errors of the recorded commands surface, as with
 * wgpu-py's own calls, when the command encoder is finished.
 *
 * stage(staging, inputs, slots) -> list of int
 *   Session.run's input staging: copies each graph input that is already a C-contiguous
 *   array of its slot's element type and shape into the host copy of the session's input
 *   buffer, checking it on the way (f32: every value finite; u32 with a row count: every
 *   index below it).
 *   staging   writable C-contiguous buffer (the host copy, bytes)
 *   inputs    mapping of input name -> value (KeyError for a missing name)
 *   slots     tuple of (name, offset in bytes, shape tuple, kind, rows) tuples; kind 0 is
 *             f32 ("f"), 1 is u32 ("I", or "L" of 4 bytes), 2 is i32 ("i" or "l", every
 *             value valid), -1 is left to Python; rows < 0 means no bound
 *   Returns the indices of the slots it did not stage, or staged but found a bad value in:
 *   the caller converts and checks those itself (and names the input in its error).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t group, void *bind_group, size_t n_offsets,
                                  const uint32_t *offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);

static PyObject *record(PyObject *self, PyObject *args) {
    unsigned long long pass, sp, sb, dp;
    PyObject *table;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "KOKKK", &pass, &table, &sp, &sb, &dp)) return NULL;
    if (PyObject_GetBuffer(table, &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "commands must be a C-contiguous uint64 buffer of [n, 5] rows");
        return NULL;
    }
    /* one-letter struct codes of an unsigned 64-bit integer, optionally with a byte-order prefix */
    const char *f = buf.format ? buf.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    const int u64 = buf.itemsize == 8 && (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
    const Py_ssize_t row = 5 * (Py_ssize_t)sizeof(uint64_t);
    if (!u64 || buf.len % row != 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "commands must be a C-contiguous uint64 buffer of [n, 5] rows");
        return NULL;
    }
    if (!pass || !sp || !sb || !dp) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "a null compute pass or function address");
        return NULL;
    }
    const uint64_t *c = (const uint64_t *)buf.buf;
    const Py_ssize_t n = buf.len / row;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!c[5 * i] || !c[5 * i + 1]) {
            PyBuffer_Release(&buf);
            PyErr_Format(PyExc_ValueError, "command %zd has a null pipeline or bind group", i);
            return NULL;
        }
    }
    void *p = (void *)(uintptr_t)pass;
    set_pipeline_fn set_pipeline = (set_pipeline_fn)(uintptr_t)sp;
    set_bind_group_fn set_bind_group = (set_bind_group_fn)(uintptr_t)sb;
    dispatch_fn dispatch = (dispatch_fn)(uintptr_t)dp;
    Py_BEGIN_ALLOW_THREADS
    void *last = NULL;
    for (Py_ssize_t i = 0; i < n; i++, c += 5) {
        void *pipeline = (void *)(uintptr_t)c[0];
        if (pipeline != last) {
            set_pipeline(p, pipeline);
            last = pipeline;
        }
        set_bind_group(p, 0, (void *)(uintptr_t)c[1], 0, NULL);
        dispatch(p, (uint32_t)c[2], (uint32_t)c[3], (uint32_t)c[4]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

/* 1 when buffer format ``f`` (of items of ``itemsize`` bytes) is kind 0 (f32), 1 (u32) or
 * 2 (i32); any other kind is left to Python. */
static int format_is(const char *f, Py_ssize_t itemsize, long kind) {
    if (!f || itemsize != 4) return 0;
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (f[0] == '\0' || f[1] != '\0') return 0;
    if (kind == 0) return f[0] == 'f';
    if (kind == 1) return f[0] == 'I' || f[0] == 'L';
    if (kind == 2) return f[0] == 'i' || f[0] == 'l';
    return 0;
}

/* 1 when the value in ``b`` has the slot's shape and b->len bytes of 4-byte items of it; -1
 * (an exception set) for a shape entry that is not an integer. */
static int shape_is(const Py_buffer *b, PyObject *shape) {
    const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (b->ndim != ndim || !b->shape) return 0;
    Py_ssize_t items = 1;
    for (Py_ssize_t d = 0; d < ndim; d++) {
        const Py_ssize_t want = PyNumber_AsSsize_t(PyTuple_GET_ITEM(shape, d), PyExc_OverflowError);
        if (want == -1 && PyErr_Occurred()) return -1;
        if (b->shape[d] != want) return 0;
        items *= want;
    }
    return b->len == items * 4;
}

static PyObject *stage(PyObject *self, PyObject *args) {
    PyObject *staging_obj, *inputs, *slots;
    if (!PyArg_ParseTuple(args, "OOO!", &staging_obj, &inputs, &PyTuple_Type, &slots)) return NULL;
    Py_buffer dest;
    if (PyObject_GetBuffer(staging_obj, &dest, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    PyObject *rest = PyList_New(0);
    if (!rest) goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        PyObject *name, *shape;
        Py_ssize_t offset;
        long kind, rows;
        if (!PyArg_ParseTuple(slot, "OnO!ll", &name, &offset, &PyTuple_Type, &shape, &kind, &rows)) goto fail;
        PyObject *value = PyObject_GetItem(inputs, name);
        if (!value) goto fail;
        Py_buffer b;
        int good = 0;  /* staged and checked */
        if (PyObject_GetBuffer(value, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
        } else {
            const int fits = offset >= 0 && b.len <= dest.len && offset <= dest.len - b.len;
            const int shaped = format_is(b.format, b.itemsize, kind) ? shape_is(&b, shape) : 0;
            if (shaped == 1 && fits) {
                memmove((char *)dest.buf + offset, b.buf, (size_t)b.len);
                /* the checks read the staged copy: what is written to the device is what passed */
                const uint32_t *w = (const uint32_t *)((const char *)dest.buf + offset);
                const Py_ssize_t n = b.len / 4;
                /* branch-free loops, which compilers vectorise (setup.py builds this file at -O3) */
                if (kind == 0) {
                    /* an exponent of all ones (infinity, NaN) carries into bit 31 when one more
                     * exponent step is added; no finite value does */
                    uint32_t carry = 0;
                    for (Py_ssize_t k = 0; k < n; k++) carry |= (w[k] & 0x7f800000u) + 0x00800000u;
                    good = !(carry & 0x80000000u);
                } else if (rows >= 0) {
                    uint32_t top = 0;
                    for (Py_ssize_t k = 0; k < n; k++) top = w[k] > top ? w[k] : top;
                    good = (uint64_t)top < (uint64_t)rows;
                } else {
                    good = 1;
                }
            }
            PyBuffer_Release(&b);
        }
        Py_DECREF(value);
        if (PyErr_Occurred()) goto fail;  /* a shape entry that is not an integer */
        if (!good) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (!index || PyList_Append(rest, index) < 0) {
                Py_XDECREF(index);
                goto fail;
            }
            Py_DECREF(index);
        }
    }
    PyBuffer_Release(&dest);
    return rest;
fail:
    Py_XDECREF(rest);
    PyBuffer_Release(&dest);
    return NULL;
}

static PyMethodDef methods[] = {
    {"record", record, METH_VARARGS, "record(pass, commands, set_pipeline, set_bind_group, dispatch) -> None"},
    {"stage", stage, METH_VARARGS, "stage(staging, inputs, slots) -> list of the slot indices left to the caller"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record",
                                    "Session's dispatch-recording loop and input staging in C (see _record.c).", -1, methods};

PyMODINIT_FUNC PyInit__record(void) { return PyModule_Create(&module); }
