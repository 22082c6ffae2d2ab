"""benchmarks/kernel_bandwidth.py's reading of Nsight Compute's CSV (the profile itself runs on the GPU machine)."""
from __future__ import annotations

import pytest

from benchmarks.kernel_bandwidth import kernel_rows, summary

NCU_CSV = """==PROF== Connected to process 1234
"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"
"","","","byte","byte","nsecond"
"0","1234","_gemv_kernel","8,000,000","4,096","4,000"
"1","1234","_rms_norm_kernel","8,192","4,096","2,000"
"2","1234","_gemv_kernel","4,000,000","4,096","3,000"
==PROF== Disconnected from process 1234
"""


def test_reads_the_launches_and_skips_the_units_row_and_ncu_messages():
    launches = kernel_rows(NCU_CSV.splitlines())
    assert [k["name"] for k in launches] == ["_gemv_kernel", "_rms_norm_kernel", "_gemv_kernel"]
    assert launches[0] == dict(name="_gemv_kernel", ns=4000.0, bytes=8_004_096.0)


def test_sums_each_kernel_and_ranks_by_time_over_the_bandwidth():
    rows = summary(kernel_rows(NCU_CSV.splitlines()), copy_gbs=4000.0)
    gemv, norm = rows
    assert (gemv["kernel"], gemv["launches"]) == ("_gemv_kernel", 2)
    assert gemv["us"] == pytest.approx(7.0) and gemv["mb"] == pytest.approx(12.008192)
    assert gemv["gbs"] == pytest.approx(12_008_192 / 7000)  # bytes / ns
    assert gemv["over_us"] == pytest.approx(7.0 - 12_008_192 / 4000 / 1e3)  # 4 TB/s = 4,000 bytes a ns
    assert norm["over_us"] == pytest.approx(2.0 - 12_288 / 4000 / 1e3)
    assert gemv["over_us"] > norm["over_us"]


def test_no_kernel_rows_gives_nothing():
    assert kernel_rows(["==PROF== No kernels were profiled."]) == []


def test_a_csv_without_the_metrics_says_what_it_has():
    with pytest.raises(ValueError, match="dram__bytes_write.sum"):
        kernel_rows(['"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"', '"0","k","1","2"'])
