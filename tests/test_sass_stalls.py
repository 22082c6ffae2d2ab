"""benchmarks/sass_stalls.py on a source page in Nsight Compute's CSV form (a kernel-name row, then the header)."""
from pathlib import Path

from benchmarks.sass_stalls import opcode, read_rows, summarize

PAGE = '''"Kernel Name","_k",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb","stall_wait",\
"stall_long_sb (Not Issued)"
"0x10","LDG.E.128 R4, desc[UR4][R2.64]","10","1,000","0","10","0"
"0x20","FFMA R1, R4, R5, R1","60","3,000","55","5","55"
"0x30","@!P4 FSEL R2, R2, RZ, !P4","30","1,000","30","0","30"
'''


def test_opcode_drops_predicates_and_modifiers():
    assert opcode("@!P4  LDG.E.U16 R68, desc[UR4][R64.64]") == "LDG"
    assert opcode("WARPGROUP.DEPBAR.LE gsb0, 0x0") == "WARPGROUP"


def test_summary_shares_and_top_instructions(tmp_path: Path):
    path = tmp_path / "k-sass.csv"
    path.write_text(PAGE)
    rows = read_rows(path)
    assert [r["Address"] for r in rows] == ["0x10", "0x20", "0x30"]
    lines = summarize(rows, top=2).splitlines()
    assert lines[0] == "3 instructions, 100 stall samples, 5,000 warp instructions executed"
    assert lines[1] == "samples by reason: long_sb 85.0%, wait 15.0%"  # the Not Issued columns are not reasons
    assert lines[2] == "samples by opcode: FFMA 60.0%, FSEL 30.0%, LDG 10.0%"
    assert lines[3] == "executed by opcode: FFMA 60.0%, LDG 20.0%, FSEL 20.0%"
    assert "60.0%" in lines[4] and "FFMA" in lines[4] and lines[4].endswith("long_sb 55, wait 5")
    assert "FSEL" in lines[5] and lines[5].endswith("long_sb 30") and len(lines) == 6
