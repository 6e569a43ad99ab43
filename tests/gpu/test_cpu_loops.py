"""lavapipe (Mesa's llvmpipe) ends an invocation's loops after 65,535 iterations without an error: lowering
for a CPU adapter refuses a dispatch that would need more (``lowering.plan.check_cpu_loops``)."""

import numpy as np
import pytest

import eggfuse
from eggfuse.ir import DeviceLimitError, Graph
from eggfuse.lowering.plan import LLVMPIPE_LOOP_ITERATIONS, workgroup_size
from eggfuse.runtime.device import get_device


def test_workgroup_size_reads_literals_and_consts():
    src = ("const WG: u32 = 128u;\n@compute @workgroup_size(WG)\nfn main() {}\n"
           "@compute @workgroup_size(64, 2, 1)\nfn other() {}\n@compute @workgroup_size(N)\nfn third() {}")
    assert (workgroup_size(src, "main"), workgroup_size(src, "other"), workgroup_size(src, "third"),
            workgroup_size(src, "absent")) == (128, 128, None, None)


@pytest.mark.skipif(get_device().adapter.info.get("adapter_type") != "CPU", reason="lavapipe's loop limit only")
def test_a_softmax_row_past_lavapipes_loop_limit_is_refused_and_a_shorter_one_runs():
    # one workgroup of 256 invocations a row, three passes over it: wrong from about 5.6 million elements
    # (65,535 * 256 / 3) before the check
    for length, fits in ((1_000_000, True), (6_000_000, False)):
        g = Graph()
        g.set_outputs([g.softmax(g.input("x", [1, length]))])
        x = np.random.default_rng(0).standard_normal((1, length)).astype(np.float32)
        if fits:
            y = eggfuse.compile(g, {}, cache=False).run({"x": x})[0]
            want = np.exp(x.astype(np.float64) - x.max())
            np.testing.assert_allclose(y, want / want.sum(), rtol=1e-4, atol=1e-12)
        else:
            with pytest.raises(DeviceLimitError, match=rf"ends a shader invocation's loops after "
                                                       rf"{LLVMPIPE_LOOP_ITERATIONS} iterations .* node 1 Softmax"):
                eggfuse.compile(g, {}, cache=False)


@pytest.mark.skipif(get_device().adapter.info.get("adapter_type") != "CPU", reason="lavapipe's loop limit only")
def test_kernels_that_count_their_own_loops_are_refused_past_the_limit():
    # a direct convolution loops over its taps and channels, a pool over its window, TopK over its line, however
    # many invocations there are (Kernel.loop_iterations): 300 channels of 15x15 gave 65,061 of 67,500 terms
    from onnx_models import I64, F, model, node  # tests/onnx_models.py

    from eggfuse.onnx import Model

    def conv(c: int):
        return model([node("Conv", ["x", "w"], ["y"])], [("x", F, [1, c, 15, 15])], [("y", F, [1, 1, 1, 1])],
                     [("w", np.ones((1, c, 15, 15), np.float32))])

    x = np.ones((1, 280, 15, 15), np.float32)  # 63,241 iterations: runs
    assert Model(conv(280), cache=False).run({"x": x})[0].item() == 280 * 225
    with pytest.raises(DeviceLimitError, match=r"Conv\(f32\[1,300,15,15\].* runs 67741 an invocation"):
        Model(conv(300), cache=False).run({"x": np.ones((1, 300, 15, 15), np.float32)})
    pool = model([node("MaxPool", ["x"], ["y"], kernel_shape=[1, 70_000])], [("x", F, [1, 1, 1, 70_000])],
                 [("y", F, [1, 1, 1, 1])])
    with pytest.raises(DeviceLimitError, match=r"MaxPool.* runs 70002 an invocation"):
        Model(pool, cache=False).run({"x": np.ones((1, 1, 1, 70_000), np.float32)})
    top_k = model([node("TopK", ["x", "k"], ["v", "i"])], [("x", F, [1, 70_000])],
                  [("v", F, [1, 3]), ("i", I64, [1, 3])], [("k", np.array([3], np.int64))])
    with pytest.raises(DeviceLimitError, match=r"TopKValues.* runs 70000 an invocation"):
        Model(top_k, cache=False).run({"x": np.ones((1, 70_000), np.float32)})


@pytest.mark.skipif(get_device().adapter.info.get("adapter_type") != "CPU", reason="lavapipe's loop limit only")
def test_a_strided_conv_transpose_counts_the_taps_it_walks():
    # its tap loops step by the stride (conv_common.wgsl tap_step): 256 channels x 2 x 2 of its 16 x 16 taps, not
    # 256 x 256, which refused a model that runs correctly
    import onnxruntime as ort
    from onnx_models import F, model, node  # tests/onnx_models.py

    from eggfuse.onnx import Model

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 1, 16, 16)).astype(np.float32)
    m = model([node("ConvTranspose", ["x", "w"], ["y"], strides=[8, 8])], [("x", F, [1, 256, 2, 2])],
              [("y", F, None)], [("w", w)])
    x = rng.standard_normal((1, 256, 2, 2)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Model(m, cache=False).run({"x": x})[0], want, rtol=1e-4, atol=1e-4)
