"""bench/vulkan_sass.py's steps that need no GPU and no disassembler: reading the instructions out of an NVIDIA
shader cache file (a real one, from an H100 with driver 580: ``tests/data/sass/fma_plain_h100.bin``, the cache
of bench/fma_peak.py's ``plain`` kernel, whose ``nvdisasm -b SM90`` listing is ``fma_plain_h100.sass``), and the
counts made of a listing (register bank conflicts on hand-written lines whose answers are worked out here)."""

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
])
def test_bank_conflicts_count_two_reads_from_one_bank(lines, conflicts):
    assert vulkan_sass.bank_conflicts(vulkan_sass.instructions(_listing(*lines))) == conflicts


def test_summary_of_a_listing():
    sass = _listing("S2R R0, SR_TID.X", "FFMA R4, R1.reuse, R6, R9", "FFMA R5, R1, R7, R10", "LDS.128 R8, [R2]",
                    "BRA 0x10", "EXIT")
    s = vulkan_sass.summarise(sass)
    assert s["instructions"] == 6 and s["registers_max"] == 11
    assert s["counts"]["LDS.128"] == 1 and s["counts"]["FFMA"] == 2
    # the loop 0x10 .. 0x40: 4 instructions, 2 FFMAs, the first's three reads a conflict: 2 / (4 + 1)
    assert (s["loop_instructions"], s["loop_ffma"], s["loop_conflicts"], s["loop_ffma_bound"]) == (4, 2, 1, 0.4)
