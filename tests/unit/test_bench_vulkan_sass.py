"""bench/vulkan_sass.py's steps that need no GPU and no disassembler: reading the instructions out of an NVIDIA
shader cache file (a real one, from an H100 with driver 580: ``tests/data/sass/fma_plain_h100.bin``, the cache
of bench/fma_peak.py's ``plain`` kernel, whose ``nvdisasm -b SM90`` listing is ``fma_plain_h100.sass``), and the
counts made of a listing (register bank conflicts on hand-written lines whose answers are worked out here)."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import vulkan_sass  # noqa: E402

DATA = ROOT / "tests" / "data" / "sass"

# the first instruction of the plain kernel, S2R R19, SR_TID.X, as nvdisasm's listing has it at /*0000*/ (its
# bytes read off a hex dump of the decompressed cache entry)
S2R_R19_TID_X = bytes.fromhex("1979130000000000002100000022 0e00".replace(" ", ""))


def test_the_cache_file_holds_the_kernel_whose_listing_nvdisasm_made():
    blobs = vulkan_sass._zstd_frames((DATA / "fma_plain_h100.bin").read_bytes())
    codes = [c for b in blobs if (c := vulkan_sass.nvuc_code(b))]
    assert len(codes) == 3  # the kernel and two small pipelines of wgpu's own
    kernel = max(codes, key=len)
    assert kernel[:16] == S2R_R19_TID_X
    listed = [line for line in (DATA / "fma_plain_h100.sass").read_text().splitlines() if "/*" in line]
    assert len(kernel) == 16 * len(listed)  # one 16-byte instruction a listed line


def test_other_blobs_are_not_taken_for_code():
    assert vulkan_sass.nvuc_code(b"\x7fELF" + bytes(200)) is None
    assert vulkan_sass.nvuc_code(vulkan_sass.NVUC_MAGIC + bytes(8)) is None  # too short for its entry
    entry_past_the_end = bytearray(vulkan_sass.NVUC_MAGIC + bytes(0x60))
    entry_past_the_end[0x48:0x54] = (1).to_bytes(4, "little") + (4096).to_bytes(4, "little") + bytes(4)
    assert vulkan_sass.nvuc_code(bytes(entry_past_the_end)) is None


def test_the_hottest_loop_of_the_plain_kernel_is_its_k_loop():
    ins = vulkan_sass.instructions((DATA / "fma_plain_h100.sass").read_text())
    loop = vulkan_sass.hottest_loop(ins)
    # the listing's /*1530*/ BRA 0x460 closes the loop of 8 rounds of 32 FFMAs
    assert (loop[0][0], loop[-1][0]) == (0x460, 0x1530)
    assert sum(op == "FFMA" for _, op, _, _ in loop) == 256
    assert len(loop) == (0x1530 - 0x460) // 16 + 1


def _listing(*lines):
    return "\n".join(f"        /*{16 * i:04x}*/                   {line} ;" for i, line in enumerate(lines))


@pytest.mark.parametrize("lines, conflicts", [
    (["FFMA R4, R1, R6, R9"], 1),                # three reads in two banks always meet
    (["FFMA R4, R1.reuse, R6, R9", "FFMA R5, R1, R7, R10"], 1),   # the second reads R7 (odd), R10 (even)
    (["FFMA R4, R1.reuse, R6, R9", "FFMA R5, R1, R6, R10"], 2),   # R6 and R10: both even
    (["FFMA R4, R1.reuse, R6, R9", "IADD3 R2, R2, 0x1, RZ", "FFMA R5, R1, R7, R10"], 2),  # reuse lost
    (["FFMA R4, R1.reuse, R6, R9", "FFMA R5, R2, R1, R10"], 2),  # R1 cached for slot 0, read in slot 1
    (["FFMA R4, R1, RZ, R6"], 0),                # RZ reads nothing
    (["FFMA R4, -R1, |R6|, R9"], 1),             # modifiers kept apart from the register
    (["FFMA R4, -|R1|.reuse, R6, R9", "FFMA R5, |R1|, R7, R10"], 1),  # the second's R1 comes from the cache
    (["@P0 FFMA R4, R1.reuse, R6, R9", "@!P0 FFMA R5, R1, R7, R10"], 1),  # predicated: the same
    (["FFMA R4, R1, c[0x0][0x30], R9"], 1),      # a constant reads no register: R1 and R9, both odd
    (["FFMA R4, R1, cx[UR8][0x4], R8"], 0),      # R1 odd, R8 even
    # a reuse set by another instruction is not followed: R1 read again, with R7 in its bank (followed: 0)
    (["FMUL R9, R1.reuse, R3", "FFMA R5, R1, R7, R10"], 1),
])
def test_bank_conflicts_count_two_reads_from_one_bank(lines, conflicts):
    assert vulkan_sass.bank_conflicts(vulkan_sass.instructions(_listing(*lines))) == conflicts


def test_summary_of_a_listing():
    sass = _listing("S2R R0, SR_TID.X", "FFMA R4, R1.reuse, R6, R9", "FFMA R5, R1, R7, R10", "LDS.128 R8, [R2]",
                    "BRA 0x10", "EXIT")
    s = vulkan_sass.summarise(sass)
    assert s["instructions"] == 6 and s["highest_register_named"] == 10
    assert s["counts"]["LDS.128"] == 1 and s["counts"]["FFMA"] == 2
    assert s["loop_counts"] == {"FFMA": 2, "LDS": 1, "BRA": 1}
    # the loop 0x10 .. 0x40: 4 instructions, 2 FFMAs, the first's three reads a conflict: 2 / (4 + 1)
    assert (s["loop_instructions"], s["loop_ffma"], s["loop_conflicts"], s["loop_ffma_bound"]) == (4, 2, 1, 0.4)


def test_the_hottest_loop_is_innermost():
    # an outer loop 0x00 .. 0x70 around an inner one 0x10 .. 0x40 of 3 FFMAs, one more FFMA in the outer's body
    sass = _listing("FFMA R4, R1, R6, R9", "FFMA R5, R1, R6, R9", "FFMA R6, R1, R6, R9", "FFMA R7, R1, R6, R9",
                    "BRA 0x10", "FFMA R8, R1, R6, R9", "IADD3 R2, R2, 0x1, RZ", "BRA 0x0", "EXIT")
    loop = vulkan_sass.hottest_loop(vulkan_sass.instructions(sass))
    assert (loop[0][0], loop[-1][0]) == (0x10, 0x40)
    assert vulkan_sass.hottest_loop(vulkan_sass.instructions(_listing("FFMA R4, R1, R6, R9", "EXIT"))) == []


def test_the_plain_kernels_summary_is_the_readmes():
    # pins the figures README.md quotes for bench/fma_peak.py's plain kernel (the loop's size is the listing's)
    s = vulkan_sass.summarise((DATA / "fma_plain_h100.sass").read_text())
    assert (s["loop_instructions"], s["loop_ffma"], s["loop_conflicts"], s["loop_ffma_bound"]) == (270, 256, 129, 0.642)


def test_the_fixture_is_fma_peaks_plain_kernel():
    import fma_peak

    assert (DATA / "fma_plain_h100.wgsl").read_text() == fma_peak.shader("plain", 256)


def test_the_kernel_is_the_blob_the_baseline_lacks(tmp_path):
    cache = tmp_path / "k.cache"
    cache.mkdir()
    shutil.copy(DATA / "fma_plain_h100.bin", cache / "x.bin")
    codes = vulkan_sass.cache_codes(cache)
    small = sorted(codes, key=len)[:2]  # wgpu's own pipelines, which the device alone makes too
    assert vulkan_sass.kernel_code(codes, small)[:16] == S2R_R19_TID_X
    assert vulkan_sass.kernel_code(codes, None) == max(codes, key=len)
    assert "2 blobs" in vulkan_sass.kernel_code(codes, small[:1])
    assert "no NVDANVVMNVuc blob" in vulkan_sass.kernel_code([], None)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="no zstd command here")
def test_the_zstd_command_decodes_what_the_module_does(monkeypatch):
    blob = (DATA / "fma_plain_h100.bin").read_bytes()
    with_module = vulkan_sass._zstd_frames(blob)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    assert vulkan_sass._zstd_frames(blob) == with_module


@pytest.mark.parametrize("item", ["1024,384", "a,b,c", "64,64,64@/x", "0,64,64", "64,64,64@64x64x16/0"])
def test_a_bad_matmul_item_is_named(item):
    with pytest.raises(SystemExit, match="--matmul item"):
        vulkan_sass.matmul_specs(item)


def test_unknown_choices_are_named(tmp_path):
    with pytest.raises(SystemExit, match="wdie16"):
        vulkan_sass.fma_specs(["wdie16"], 256)
    with pytest.raises(SystemExit, match="not a tile"):
        vulkan_sass.matmul_specs("64,64,64@65x64x16")
    with pytest.raises(SystemExit, match="no NAME.cache"):
        vulkan_sass.read(tmp_path, "nvdisasm", "SM90")


def test_each_distinct_source_of_a_plan_is_compiled_once():
    from types import SimpleNamespace

    def dispatch(kernel, source):
        return SimpleNamespace(kernel=kernel, source=source, entry_point="main", bindings=(0, 1), params=b"",
                               writable=(), prefetch=(), runtime_checks=False)

    plan = SimpleNamespace(dispatches=[dispatch("k+bias", "A"), dispatch("k+bias", "A"), dispatch("k+bias", "B"),
                                       dispatch("other", "C")])
    specs = vulkan_sass.plan_specs(plan)
    assert sorted(s["source"] for s in specs.values()) == ["A", "B", "C"]
    assert "k_bias" in specs and specs["k_bias"]["source"] == "A"
    assert set(vulkan_sass.plan_specs(plan, only="other")) == {"other"}
