"""benchmarks/kernel_bandwidth.py's reading of Nsight Compute's CSV (the profile itself runs on the GPU machine)."""
from __future__ import annotations

import pytest

from benchmarks.kernel_bandwidth import kernel_rows, launch_floor_us, summary

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


def test_the_launch_floor_is_the_median_of_the_launches_that_move_almost_nothing():
    launches = [dict(name="big", ns=9000.0, bytes=8e6)] + [dict(name=n, ns=ns, bytes=4096.0)
                                                         for n, ns in (("a", 3000.0), ("b", 4000.0), ("c", 3500.0))]
    assert launch_floor_us(launches) == pytest.approx(3.5)
    assert launch_floor_us(launches[:1]) is None
    assert launch_floor_us(launches + [dict(name="d", ns=5000.0, bytes=0.0)]) == pytest.approx(3.75)


def test_beyond_takes_out_a_floor_a_launch_as_well_as_the_bytes():
    launches = kernel_rows(NCU_CSV.splitlines())
    gemv, norm = summary(launches, copy_gbs=4000.0, floor_us=1.5)
    assert gemv["beyond_us"] == pytest.approx(gemv["over_us"] - 2 * 1.5)
    assert norm["beyond_us"] == pytest.approx(norm["over_us"] - 1.5)
    assert "beyond_us" not in summary(launches, copy_gbs=4000.0)[0]
