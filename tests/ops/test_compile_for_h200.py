"""Kernels changed without a GPU at hand compile for the H200 (sm_90) here: Triton's compiler and its bundled
ptxas run on the CPU, down to a cubin. What the interpreter cannot say (a construct the GPU compiler
refuses) shows up in CI rather than on the device; so does a change that makes the engine's default tilings
of the recurrent, conv and router kernels spill registers (compiled as launched). The compiles run in a child
process without TRITON_INTERPRET (under it `@triton.jit` gives interpreted functions, which do not compile).
Skipped where triton or its NVIDIA backend is missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed")

NO_BACKEND = 3  # the child's exit code when this triton cannot compile for NVIDIA here (then skipped)
CHILD = r'''
import json, sys
import triton
import triton.language as tl
try:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvidia
    from triton.compiler import ASTSource
    nvidia.get_ptxas(90)
except Exception as e:  # checked before any compile: a failing compile is a failure, never a skip
    print(f"no NVIDIA compiler backend: {e!r}", file=sys.stderr)
    sys.exit(3)
from hybridcache.ops import rms_norm_triton
from hybridcache.ops.attention import triton_mla, triton_paged
from hybridcache.ops.conv1d import triton_shift
from hybridcache.ops import activation_triton, gemv_triton, ngram_triton, slot_rows_triton

def compile_asm(fn, sig, consts, num_warps=4):
    consts = {"PDL": False, **consts}  # every kernel's programmatic-dependent-launch switch, off unless named
    sig = {**sig, **{n: "constexpr" for n in consts}}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "launch_pdl": consts["PDL"]}).asm

def compile_(fn, sig, consts, num_warps=4):
    asm = compile_asm(fn, sig, consts, num_warps)
    return "cubin" in asm and bool(asm["ptx"])

results = {}
norm_sig = {**{n: "*bf16" for n in ("x_ptr", "z_ptr", "w_ptr", "out_ptr", "sum_ptr")}, "rows": "i32", "G": "i32",
            **{n: "i64" for n in ("stride_xm", "stride_xg", "stride_zm", "stride_zg")}, "eps": "fp32"}
for name, mode, add in (("plain", 0, False), ("plain-add", 0, True), ("group", 1, False), ("silu", 2, False),
                        ("sigmoid", 3, False)):
    results["rms_norm-" + name] = compile_(rms_norm_triton._rms_norm_kernel, norm_sig, {
        "D": 2048, "BLOCK_D": 2048, "ROWS": 1, "MODE": mode, "ZERO_CENTRED": False, "MID": tl.bfloat16, "ADD": add})
norm_consts = {"D": 2048, "BLOCK_D": 2048, "ROWS": 1, "MODE": 0, "ZERO_CENTRED": False, "MID": tl.bfloat16, "ADD": True}
gdc = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")  # PDL's entry, in PTX
pdl_ptx = compile_asm(rms_norm_triton._rms_norm_kernel, norm_sig, {**norm_consts, "PDL": True})["ptx"]
plain_ptx = compile_asm(rms_norm_triton._rms_norm_kernel, norm_sig, norm_consts)["ptx"]
results["pdl-entry"] = all(op in pdl_ptx for op in gdc) and not any(op in plain_ptx for op in gdc)
attn_sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "table_ptr": "*i32", "cached_ptr": "*i32", "cu_ptr": "*i32",
            "out_ptr": "*bf16", "part_ptr": "*fp32", "stat_ptr": "*fp32", "scale_log2": "fp32",
            **{n: "i32" for n in ("stride_qn", "stride_qh", "stride_kp", "stride_kkv", "stride_ks", "stride_kh",
                                  "stride_tb", "stride_on", "stride_oh", "num_rows", "table_width", "num_tokens")}}
for splits in (1, 4):
    results[f"paged_attention-splits{splits}"] = compile_(triton_paged._attend_kernel, attn_sig, {
        "PAGE_SIZE": 16, "GROUP": 8, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_T": 1, "BLOCK_M": 16, "BLOCK_N": 64,
        "BLOCK_B": 16, "NUM_SPLITS": splits, "PRECISION": "tf32", "UPCAST": False})
mla_sig = {"ql_ptr": "*bf16", "qr_ptr": "*bf16", "pages_ptr": "*bf16", "table_ptr": "*i32", "cached_ptr": "*i32",
           "cu_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*fp32", "stat_ptr": "*fp32", "scale_log2": "fp32",
           **{n: "i32" for n in ("stride_ln", "stride_lh", "stride_rn", "stride_rh", "stride_pp", "stride_ps",
                                 "stride_tb", "stride_on", "stride_oh", "num_rows", "table_width", "num_tokens")}}
results["mla_attention"] = compile_(triton_mla._mla_kernel, mla_sig, {
    "PAGE_SIZE": 16, "HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_R": 512, "BLOCK_DR": 64, "BLOCK_T": 1, "BLOCK_M": 16,
    "BLOCK_N": 16, "BLOCK_B": 16, "NUM_SPLITS": 2, "PRECISION": "tf32", "UPCAST": False})
results["mla_attention-verify-default"] = compile_(triton_mla._mla_kernel, mla_sig, {
    "PAGE_SIZE": 16, "HEADS": 16, "RANK": 512, "ROPE": 64, "BLOCK_R": 512, "BLOCK_DR": 64, "BLOCK_T": 2, "BLOCK_M": 32,
    "BLOCK_N": triton_mla.BLOCK_N, "BLOCK_B": 16, "NUM_SPLITS": 1, "PRECISION": "tf32", "UPCAST": False}, num_warps=8)
shift_sig = {"conv_ptr": "*bf16", "slot_ptr": "*i64", "valid_ptr": "*i32", "channels": "i32",
             **{n: "i64" for n in ("stride_l", "stride_s", "stride_c", "stride_j")}}
results["conv_shift"] = compile_(triton_shift._shift_kernel, shift_sig, {"W": 3, "W_POW2": 4, "BLOCK_C": 256})
rows_sig = {"src_ptr": "*fp32", "dst_ptr": "*fp32", "slot_ptr": "*i64", "initial_ptr": "*i1", "row_size": "i32"}
results["slot_rows-read"] = compile_(slot_rows_triton._read_kernel, rows_sig, {"HAS_INITIAL": True, "BLOCK": 4096})
write_sig = {"src_ptr": "*fp32", "dst_ptr": "*fp32", "slot_ptr": "*i64", "valid_ptr": "*i1", "row_size": "i32"}
results["slot_rows-write"] = compile_(slot_rows_triton._write_kernel, write_sig, {"BLOCK": 4096})
ngram_sig = {"hist_ptr": "*i64", "len_ptr": "*i64", "drafts_ptr": "*i64", "proposed_ptr": "*i64", "W": "i32",
             "stride_r": "i64"}
results["ngram"] = compile_(ngram_triton._ngram_kernel, ngram_sig, {"N": 3, "MIN_N": 1, "K": 3, "BLOCK_C": 256,
                                                                   "BLOCK_K": 4})
append_sig = {"hist_ptr": "*i64", "len_ptr": "*i64", "tok_ptr": "*i64", "count_ptr": "*i32", "last_ptr": "*i64",
              "W": "i32", "stride_r": "i64", "stride_t": "i64"}
results["ngram-append"] = compile_(ngram_triton._append_kernel, append_sig, {"T": 4, "BLOCK_T": 4})
from benchmarks import kernel_registers as engine_calls
from benchmarks.sm90_compile import captured_launches, compile_launch, ptxas_report, sass_counts

def compiles_launches(call):
    """Every launch of an op's wrapper, captured and compiled as the JIT would (the real specialisation)."""
    with captured_launches() as launches:
        call()
    asms = [compile_launch(launch).asm for launch in launches]
    return bool(asms) and all("cubin" in asm and bool(asm["ptx"]) for asm in asms)

for op in ("gdn", "kda", "mamba2"):  # a k = 3 verify and a one-token step, each at its default tiling
    results[f"{op}_verify"] = all(compiles_launches(lambda T=T: getattr(engine_calls, op)(T)) for T in (4, 1))
with captured_launches() as launches:  # past 64 KiB of code (4,096 instructions) every instruction still counts
    engine_calls.kda(4)
from tests.ops.gluon_double import double_launch  # a Gluon kernel (explicit layouts) compiles as launched
gluon_asm = compile_launch(double_launch(captured_launches)[0]).asm
results["gluon"] = "ld.global.v4" in gluon_asm["ptx"] and "cubin" in gluon_asm
results["sass-counts-past-64k"] = sass_counts(compile_launch(launches[0]))["instructions"] > 4096
results["mamba2_verify-stepwise"] = compiles_launches(lambda: engine_calls.mamba2(4, closed_form=False))
from hybridcache.ops.kda import triton_verify as kda_triton_verify
kda_triton_verify.CLOSED_FORM = True  # KDA's first launch in closed form (off by default)
with captured_launches() as launches:
    engine_calls.kda(4)
kda_triton_verify.CLOSED_FORM = False
results["kda_verify-closed"] = launches[0].kernel.__name__ == "_kda_verify_closed_kernel" \
    and "cubin" in compile_launch(launches[0]).asm
with captured_launches() as launches:  # the heads form (triton_verify_heads) and its fold spill nothing
    engine_calls.mamba2(4, heads=True)
results["mamba2_verify-heads"] = len(launches) == 2 and all(ptxas_report(compile_launch(la))[1] == 0 for la in launches)
for family in ("kimi_linear", "qwen3_next"):  # one token a program, as on CUDA
    results[f"router-{family}"] = compiles_launches(lambda: engine_calls.router(family, 1))
spills = {}
for label, call in engine_calls.cases():  # the tilings the engine launches: spill-store bytes a thread
    if "default" in label or label.startswith("router"):
        with captured_launches() as launches:
            call()
        spills[label] = ptxas_report(compile_launch(launches[0]))[1]
import torch
from hybridcache.ops.moe import SharedExpert, experts_sorted_triton

def sorted_moe(parts, logit):
    """The sorted experts' three launches with a shared expert of `parts` parts, at a CUDA tiling."""
    D, I, E, k, n = 256, 64, 8, 2, 16
    w = lambda *shape: torch.randn(*shape).to(torch.bfloat16)
    shared = SharedExpert(w(parts * I, D), w(D, parts * I), w(parts * I, D), w(D) if logit else None)
    P = n * (k + parts)
    order, ends = torch.zeros(P, dtype=torch.int32), torch.zeros(E + parts, dtype=torch.int32)
    with captured_launches() as launches:
        experts_sorted_triton.sorted_experts_triton(w(n, D), torch.zeros(n, k, dtype=torch.int64), torch.rand(n, k),
                                                    order, ends, w(E, I, D), w(E, D, I), w(E, I, D), "silu",
                                                    torch.bfloat16, tiles=(16, 64, 128), shared=shared)
    for launch in launches:  # the CUDA dots (the CPU tensors ask for the interpreter's upcast)
        if "UPCAST" in launch.kwargs:
            launch.kwargs["UPCAST"] = False
    return len(launches) == 3 and all("cubin" in compile_launch(l).asm for l in launches)

results["moe_sorted-shared4-logit"] = sorted_moe(4, True)
results["moe_sorted-shared1"] = sorted_moe(1, False)
from hybridcache.ops.moe import experts_triton

def pair_moe(parts):
    """The one-pair-a-program experts' two launches for one token with a shared expert of `parts` parts (with its
    gate logit), at the tiling they take on CUDA (kimi_linear's 1B sizes)."""
    D, I, E, k = 2048, 512, 8, 2
    w = lambda *shape: torch.randn(*shape).to(torch.bfloat16)
    shared = SharedExpert(w(parts * I, D), w(D, parts * I), w(parts * I, D), w(D))
    with captured_launches() as launches:
        experts_triton.fused_experts_triton(w(1, D), torch.tensor([[1, 5]]), torch.rand(1, k), w(E, I, D), w(E, D, I),
                                            w(E, I, D), "silu", torch.bfloat16, shared=shared,
                                            up_launch=(4, 1024, 4), down_launch=(4, 512, 4))
    kernels = [compile_launch(l) for l in launches]
    ahead[f"moe_pairs-shared{parts}-up"] = sass_counts(kernels[0])["LDG_AHEAD"]
    return len(launches) == 2 and all(ptxas_report(k)[1] == 0 for k in kernels)

ahead = {}
for parts in (1, 4):
    results[f"moe_pairs-shared{parts}"] = pair_moe(parts)
results["relu2"] = compile_(activation_triton._relu2_kernel, {"x_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32"},
                           {"BLOCK": 2048})
results["silu_mul"] = compile_(activation_triton._silu_mul_kernel, {"h_ptr": "*bf16", "y_ptr": "*bf16", "inner": "i32",
                                                                    "stride_h": "i64"}, {"BLOCK": 2048})
results["sigmoid_mul"] = compile_(activation_triton._sigmoid_mul_kernel, {
    "x_ptr": "*bf16", "g_ptr": "*bf16", "y_ptr": "*bf16", "width": "i32", "D": "i32", "stride_gn": "i64",
    "stride_gh": "i64"}, {"BLOCK": 2048})
results["sigmoid_gated_add"] = compile_(activation_triton._sigmoid_gated_add_kernel, {
    "base_ptr": "*bf16", "x_ptr": "*bf16", "g_ptr": "*bf16", "y_ptr": "*bf16", "width": "i32", "stride_g": "i64"},
    {"BLOCK": 2048})
gemv_sig = {**{n: "*bf16" for n in ("x_ptr", "w_ptr", "b_ptr", "y_ptr")}, **{n: "i32" for n in ("M", "N", "K")},
            **{n: "i64" for n in ("s_xm", "s_wn", "s_ym", "s_xb", "s_wb", "s_yb", "s_wk")}}
for rows, bias in ((1, False), (4, True)):
    results[f"gemv-rows{rows}"] = compile_(gemv_triton._gemv_kernel, gemv_sig, {
        "ROWS": rows, "BLOCK_N": gemv_triton.BLOCK_N, "BLOCK_K": gemv_triton.BLOCK_K, "HAS_BIAS": bias,
        "BATCHED": False}, num_warps=gemv_triton.NUM_WARPS)
results["gemv-rows1-float32-out"] = compile_(gemv_triton._gemv_kernel, {**gemv_sig, "y_ptr": "*fp32"}, {
    "ROWS": 1, "BLOCK_N": gemv_triton.BLOCK_N, "BLOCK_K": gemv_triton.BLOCK_K, "HAS_BIAS": False, "BATCHED": False},
    num_warps=gemv_triton.NUM_WARPS)  # the LM head's logits, widened in the launch
# MLA's absorbed products at one row (kimi_linear 1B: 16 heads, rank 512, 128 wide): the value weight's rows read
# whole, the key weight as a transposed view (its output columns the unit stride)
for label, unit, block_n, block_k in (("rows", "s_wk", gemv_triton.BLOCK_N, 512),
                                      ("columns", "s_wn", gemv_triton.BATCHED_TILE, gemv_triton.BATCHED_TILE)):
    results[f"gemv-batched-{label}"] = compile_(gemv_triton._gemv_kernel, {**gemv_sig, unit: "constexpr"}, {
        unit: 1, "ROWS": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "HAS_BIAS": False, "BATCHED": True},
        num_warps=gemv_triton.NUM_WARPS)
print(json.dumps({"compiled": results, "spills": spills, "ahead": ahead}))
'''
CASES = ["pdl-entry", "rms_norm-plain", "rms_norm-plain-add", "rms_norm-group", "rms_norm-silu", "rms_norm-sigmoid",
         "paged_attention-splits1", "paged_attention-splits4", "mla_attention", "mla_attention-verify-default",
         "conv_shift",
         "slot_rows-read", "slot_rows-write", "relu2", "silu_mul", "sigmoid_gated_add", "sigmoid_mul", "ngram",
         "ngram-append", "gdn_verify", "kda_verify", "kda_verify-closed", "gluon", "sass-counts-past-64k",
         "mamba2_verify", "mamba2_verify-stepwise", "mamba2_verify-heads",
         "router-kimi_linear", "router-qwen3_next", "moe_sorted-shared4-logit", "moe_sorted-shared1",
         "moe_pairs-shared1", "moe_pairs-shared4",
         "gemv-rows1", "gemv-rows4", "gemv-rows1-float32-out", "gemv-batched-rows", "gemv-batched-columns"]


# spill-store bytes a thread allowed at a default tiling (sm_90, as launched; benchmarks/kernel_registers.py
# prints them all): Mamba2's closed-form verify with its history loop in a 2-stage pipeline (12 bytes) and GDN's with
# its state products on bf16 operands (BF16_STATE: 268 bytes uncapped) spill and were the fastest measured; every
# other default (verify, decode, conv update, routers), none
SPILL_BUDGET = {"mamba2 T=4 default": 16, "gdn T=4 default": 268}


@pytest.fixture(scope="module")
def child() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode == NO_BACKEND:
        pytest.skip(run.stderr.strip().splitlines()[-1])
    if run.returncode:
        pytest.fail(f"compiling for sm_90 failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_compiles_to_a_cubin(child: dict, case: str) -> None:
    assert child["compiled"][case], f"{case}: no cubin"


def test_the_default_tilings_stay_within_their_spill_budget(child: dict) -> None:
    spills = child["spills"]
    assert len(spills) == 13, sorted(spills)  # verify at T = 4 and 1, decode (GDN, KDA, Mamba2); conv; routers
    over = {label: n for label, n in spills.items() if n > SPILL_BUDGET.get(label, 0)}
    assert not over, f"spill-store bytes a thread over budget: {over} (budget {SPILL_BUDGET}, else 0)"


def test_the_experts_up_kernel_keeps_its_weight_loads_in_flight(child: dict) -> None:
    """The MoE up kernel at batch 1 issues a weight step's loads together, before its first product (19 with a
    gated shared expert of one or four parts and its logit): a pointer chosen per pair compiled to 3 and slowed the
    batch-1 step (experts_triton.py, history 35250ef)."""
    assert set(child["ahead"]) == {"moe_pairs-shared1-up", "moe_pairs-shared4-up"}, sorted(child["ahead"])
    low = {label: n for label, n in child["ahead"].items() if n < 16}
    assert not low, f"global loads ahead of the first product: {low} (at least 16 a weight step)"
