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
