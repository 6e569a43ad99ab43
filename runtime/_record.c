/* The recording loop of Session.run in C: one pipeline / bind group / dispatch triple per
 * plan dispatch, recorded into an open wgpu-native compute pass.
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

static PyMethodDef methods[] = {
    {"record", record, METH_VARARGS, "record(pass, commands, set_pipeline, set_bind_group, dispatch) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record",
                                    "Session's dispatch-recording loop in C (see _record.c).", -1, methods};

PyMODINIT_FUNC PyInit__record(void) { return PyModule_Create(&module); }
