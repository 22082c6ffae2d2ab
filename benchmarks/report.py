"""Turn a folder of benchmark JSON (what each script writes with `--json`) into docs/benchmarks.md, every
figure beside the command that produced it, and matplotlib plots under docs/img/ (report_plots.py):

  engine_throughput.png   tokens/s against batch size, hybridcache vs transformers, one panel per family
  swap_vs_reprefill.png   resume by swap vs by re-prefill against context length
  spec_verify.png         speculative verify, replay vs per-token states, against batch size (Mamba2, GDN, KDA)
  kernels_decode.png      recurrent decode kernels' GB/s against batch size, ours vs fla / mamba_ssm vs the roofline

    .venv/bin/pip install -e '.[bench]'                                   # matplotlib, once
    PYTHONPATH=. .venv/bin/python benchmarks/report.py docs/bench-data    # tables + plots

Which files the page shows (the newest per subject; step profiles merged by row): report_data.py.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from benchmarks.report_data import load
from benchmarks.report_format import eager, provenance, table
from benchmarks.report_plots import PEERS, on_gpu, plot_all
from benchmarks.report_steps import gpu_pair_section, kernel_bandwidth_section, launch_floor_section, step_section

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "docs" / "bench-data"


# ------------------------------------------------------------------------------------------ markdown
def engine_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Engine throughput", "",
           "Generated tokens per second of a whole `generate` call (prefill included), greedy, equal-length "
           "prompts; the median of the runs after a warm-up run of the same batch. Every request of a batch is "
           "resident (the suspension, re-prefill and rebalance counts say so). *decode tok/s*: the tokens after "
           "the first over the time the call takes beyond the same call with one new token (prefill and first "
           "token taken out, alike for both engines). Random-weight checkpoints of each family "
           "(`benchmarks/families.py`); transformers runs its torch paths.", ""]
    if img:
        out += [f"![tokens/s against batch size]({img}/engine_throughput.png)", ""]
    for data in files:
        p = data["params"]
        out += [f"### {p['family']} {p['size']} ({p['dtype']}, prompt {p['prompt_len']}, {p['max_tokens']} new "
                f"tokens, median of {p['repeats']}{eager(p)})", ""]
        out += provenance(data) + [""]
        hf = {r["batch"]: r["tok_per_s"] for r in data["rows"] if r["engine"] == "transformers"}
        hf_decode = {r["batch"]: r.get("decode_tok_per_s") for r in data["rows"] if r["engine"] == "transformers"}
        rows = []
        for r in sorted(data["rows"], key=lambda r: (r["batch"], r["engine"] != "transformers", r["engine"])):
            ratio = f"{r['tok_per_s'] / hf[r['batch']]:.2f}x" if r["batch"] in hf else "—"
            resident = "—" if r["engine"] == "transformers" else (
                f"{r['num_slots']} / {r['num_pages']} / {r['suspensions']} / {r['reprefills']} / {r['rebalances']}")
            accept = f"{r['accepted_per_draft']:.2f}" if "accepted_per_draft" in r else "—"
            dec, ref = r.get("decode_tok_per_s"), hf_decode.get(r["batch"])
            dec_ratio = f"{dec / ref:.2f}x" if dec and ref else "—"
            rows.append([str(r["batch"]), r["engine"], f"{r['tok_per_s']:.1f}", f"{r['median_s']:.3f}", ratio,
                         f"{dec:.1f}" if dec else "—", dec_ratio, accept, resident])
        out += table(["batch", "engine", "tok/s", "median s", "vs transformers", "decode tok/s",
                      "decode vs transformers", "accepted / draft",
                      "slots / pages / suspensions / re-prefills / rebalances"], rows) + [""]
        spec = data.get("extra", {}).get("spec_state_bytes")
        if spec:
            out += ["Speculative state per request (all recurrent layers): "
                    + "; ".join(f"k={s['k']}: replay {s['replay_bytes'] / 1e6:.2f} MB, per-token states "
                                f"{s['per_token_bytes'] / 1e6:.2f} MB ({s['per_token_bytes'] / s['replay_bytes']:.1f}x)"
                                for s in spec) + ".", ""]
    return out


def swap_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Resume: swap-in vs re-prefill", "",
           "One request, preempted and resumed, timed to its next token. *copy*: the host-to-device copy of its "
           "pages and slot; *swap*: copy + one decode step; *prefill*: recomputing the context (in *steps* "
           "scheduler steps: 1 = the whole context in one step); *re-prefill*: prefill + one decode step; "
           "*decode*: a plain decode step. Ratio = re-prefill / swap. Medians of the rounds after a warm-up round.",
           ""]
    if img:
        out += [f"![swap-in vs re-prefill against context length]({img}/swap_vs_reprefill.png)", ""]
    for data in files:
        p = data["params"]
        out += [f"### {p['family']} {p['size']} ({p['dtype']}, prefill budget {p['max_num_batched_tokens']} "
                f"tokens a step, median of {p['repeats']}{eager(p)})", ""]
        out += provenance(data) + [""]
        rows = [[f"{r['context']:,}", f"{r['state_bytes'] / 1e6:.1f}", f"{r['copy_ms']:.2f}", f"{r['swap_ms']:.2f}",
                 f"{r['prefill_ms']:.2f}", str(r["prefill_steps"]), f"{r['reprefill_ms']:.2f}", f"{r['decode_ms']:.2f}",
                 f"{r['ratio']:.1f}x"] for r in sorted(data["rows"], key=lambda r: r["context"])]
        out += table(["context", "state MB", "copy ms", "swap ms", "prefill ms", "steps", "re-prefill ms",
                      "decode ms", "re-prefill / swap"], rows) + [""]
    return out


def ops_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Speculative verify: replay vs per-token states", "",
           "One layer's verify step (verify + accept) of k drafts: replay (checkpoint + history, what hybridcache "
           "keeps; KDA: checkpoint + pending drafts) against per-token intermediate states (k + 1 states written, "
           "the accepted one copied back), and "
           "a plain decode step. ms per call, the median of runs of many calls (CUDA graph replays on CUDA); GB/s = "
           "the least bytes each approach must touch / time.", ""]
    if img:
        out += [f"![replay vs per-token states against batch size]({img}/spec_verify.png)", ""]
    for data in files:
        p = data["params"]
        if p["op"] == "mamba2":
            shape = f"{p['heads']} heads x {p['head_dim']} x {p['state']} state, {p['groups']} groups"
        elif p["op"] == "kda":
            shape = f"H={p['heads']}, K=V={p['head_dim']}"
        else:
            shape = f"H={p['heads']}, HV={p['value_heads']}, K=V={p['head_dim']}"
        replayed = "pending drafts" if p["op"] == "kda" else f"HIST {p['hist']}"
        device = data.get("machine", {}).get("device", "?")
        out += [f"### {p['op']} on {device} ({shape}, {p['dtype']}, {replayed}, median of {p['repeats']} runs of "
                f"{p['iters']} calls)", ""]
        out += provenance(data) + [""]
        if "copy_gbs" in data.get("extra", {}):
            out += [f"Device copy bandwidth (read + write): {data['extra']['copy_gbs']:.0f} GB/s.", ""]
        rows = [[str(r["batch"]), str(r["k"]), f"{r['replay_ms']:.3f}", f"{r['inter_ms']:.3f}", f"{r['ratio']:.2f}x",
                 f"{r['replay_gbs']:.0f}", f"{r['inter_gbs']:.0f}", f"{r['decode_ms']:.3f}",
                 f"{r['replay_state_bytes'] / 2**10:,.0f}", f"{r['inter_state_bytes'] / 2**10:,.0f}"]
                for r in sorted(data["rows"], key=lambda r: (r["k"], r["batch"]))]
        out += table(["batch", "k", "replay ms", "per-token ms", "per-token / replay", "replay GB/s",
                      "per-token GB/s", "decode ms", "replay KiB/req", "per-token KiB/req"], rows) + [""]
    return out


PREFILL_PEERS = {"fla_ms": "fla", "mamba_ssm_ms": "mamba_ssm", "torch_ms": "our torch path"}


def moe_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## MoE experts and routers", "",
           "`benchmarks/ops_moe.py`: one MoE layer's experts (up/gate, activation, down, the weighted sum of the k "
           "choices) for N tokens, each path a CUDA-graph replay: *pairs* one program a (token, choice) pair, "
           "*sorted* the pairs sorted by expert on the device and taken in blocks of one expert, *grouped* torch's "
           "sort and grouped GEMMs. The engine takes pairs up to `max_pairs`, sorted up to `max_sorted_pairs`, "
           "grouped above. The roofline reads the chosen experts' weights once at the copy bandwidth; *sort* is "
           "the sorted path's sort kernel alone. Routers: the Triton selection against the torch ops. Shared expert "
           "(files from 2026-12-06 on): the whole MoE layer (router, experts, shared expert) with the shared expert "
           "*folded* into the experts' kernels (wherever `GatedExperts.takes_shared`) against run on its own "
           "(*separate*). The layers fold by `GatedExperts.folds_shared`: a shared expert of one part always, one of "
           "several parts (qwen3_next) in the one-pair kernels and from 64 tokens.", ""]
    for data in files:
        p = data["params"]
        out += provenance(data) + [""]
        out += [f"Copy bandwidth {data.get('extra', {}).get('copy_gbs', float('nan')):.0f} GB/s; pairs up to "
                f"{p['max_pairs']}, sorted up to {p['max_sorted_pairs']}.", ""]
        experts = [r for r in data["rows"] if r["kind"] == "experts"]
        rows = [[r["family"], str(r["batch"]), str(r["pairs"]), str(r["distinct_experts"]), f"{r['roofline_us']:.1f}",
                 f"{r['pairs_us']:.1f}", f"{r['sorted_us']:.1f}", f"{r['grouped_us']:.1f}", f"{r['sort_us']:.1f}"]
                for r in experts]
        out += table(["family", "tokens", "pairs", "experts hit", "roofline us", "pairs us", "sorted us",
                      "grouped us", "sort us"], rows) + [""]
        routers = [r for r in data["rows"] if r["kind"] == "router"]
        rows = [[r["family"], str(r["batch"]), r["router"], f"{r['fused_us']:.1f}", f"{r['torch_us']:.1f}"]
                for r in routers]
        out += table(["family", "tokens", "router", "Triton selection us", "torch us"], rows) + [""]
        shared = [r for r in data["rows"] if r["kind"] == "shared"]
        if shared:
            rows = [[r["family"], str(r["batch"]), str(r["shared_inner"]), f"{r['folded_us']:.1f}",
                     f"{r['separate_us']:.1f}", f"{r['separate_us'] / r['folded_us']:.2f}x"] for r in shared]
            out += table(["family", "tokens", "shared inner", "folded us", "separate us", "separate / folded"],
                         rows) + [""]
    return out


def kernels_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Recurrent kernels: ours vs the field's", "",
           "Decode: one token per row from a pool of slots (ours index the slots inside the kernel), every call a "
           "CUDA-graph replay; GB/s counts the fp32 state read and written, against the measured device copy "
           "bandwidth. Prefill: 8,192 tokens from slot states, final states written back (eager).", ""]
    if img:
        out += [f"![decode kernels: GB/s against batch size]({img}/kernels_decode.png)", ""]
    for data in files:
        out += provenance(data) + [""]
        if "copy_gbs" in data.get("extra", {}):
            out += [f"Device copy bandwidth (read + write): {data['extra']['copy_gbs']:.0f} GB/s.", ""]
        decode = [r for r in data["rows"] if r["kind"] == "decode"]
        if decode:
            rows = []
            for r in decode:
                peers = "; ".join(f"{PEERS[k]} {r[k]:.1f} ({r[k] / r['ours_us']:.2f}x)" for k in PEERS if k in r)
                rows.append([r["op"], str(r["batch"]), f"{r['ours_us']:.1f}", f"{r['ours_gbs']:,.0f}",
                             f"{r['roofline_share']:.0%}", peers or "-"])
            out += table(["op", "batch", "ours us", "ours GB/s", "of copy bandwidth", "peer us (peer / ours)"],
                         rows) + [""]
        prefill = [r for r in data["rows"] if r["kind"] == "prefill"]
        if prefill:
            rows = [[r["op"], f"{r['rows']} x {r['tokens'] // r['rows']:,}", f"{r['ours_ms']:.2f}",
                     "; ".join(f"{PREFILL_PEERS[k]} {r[k]:.2f} ({r['ours_ms'] / r[k]:.2f}x)" for k in PREFILL_PEERS
                               if k in r)] for r in prefill]
            out += table(["op", "tokens", "ours ms", "other ms (ours / other)"], rows) + [""]
    return out


def spec_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Speculative decoding: cost at zero acceptance, gain at full acceptance", "",
           "`benchmarks/spec_decode.py`: tokens/s with n-gram speculation whose drafts are never the greedy choice "
           "(*zero-accept*), and with an oracle that proposes the greedy reference continuation (*full-accept*), each "
           "against plain decode in the same run. In 16-bit a verify step rounds differently from a decode step, so "
           "on random weights (near-tied logits) the speculative greedy tokens drift from plain decode's (*outputs "
           "equal to plain*); files with an *oracle fully accepted* column took the speculative engine's own "
           "continuation as the reference, found in the rounds given (`spec_decode.self_consistent`). Where the file has them, the rates are decode tok/s and the whole "
           "call's ratio follows in brackets (older files hold the whole call's rates only): files marked *decode "
           "span* time the steps after the last request's first token and count the tokens they deliver "
           "(`timing.time_decode_phase`); the others take the tokens after the first over the call's time less a "
           "max_tokens=1 call's, which at bs64 leaves the decode inside the prefill's noise (*n/a* where that "
           "difference came out negative). Files from 2026-12-04 on ran the three engines "
           "interleaved, and their ratios are the medians of each round's ratios.", ""]
    for data in files:
        p = data["params"]
        backoff = f", back-off up to {p['backoff']} steps" if p.get("backoff") else ""
        out += [f"### {p['family']} {p['size']} ({p['dtype']}, k={p['k']}{backoff}, prompt {p['prompt_len']}, "
                f"{p['max_tokens']} new tokens, median of {p['repeats']})", ""]
        out += provenance(data) + [""]
        if data.get("extra", {}).get("decode_timing") == "span":
            out += ["Decode span.", ""]

        def ratio(r: dict, kind: str) -> str:
            if kind + "_ratio" in r:  # paired: the median of each round's ratio
                decode = "n/a" if math.isnan(r[kind + "_ratio"]) else f"{r[kind + '_ratio']:.2f}x"
                return f"{decode} ({r[kind + '_call_ratio']:.2f}x)"
            text = f"{r[kind + '_tok_s'] / r['plain_tok_s']:.2f}x"
            if "plain_call_tok_s" in r:
                text += f" ({r[kind + '_call_tok_s'] / r['plain_call_tok_s']:.2f}x)"
            return text

        rows = [[str(r["batch"]), f"{r['plain_tok_s']:,.1f}", f"{r['zero_accept_tok_s']:,.1f}", ratio(r, "zero_accept"),
                 "n/a" if math.isnan(r["full_accept_tok_s"]) else f"{r['full_accept_tok_s']:,.1f}", ratio(r, "full_accept"), f"{r['outputs_equal']} / {r['batch']}"]
                + ([f"{r['oracle_fully_accepted']} / {r['batch']} ({r['oracle_rounds']} rounds)"]
                   if "oracle_rounds" in r else [])
                for r in data["rows"]]
        oracle = ["oracle fully accepted"] if any("oracle_rounds" in r for r in data["rows"]) else []
        out += table(["batch", "plain tok/s", "zero-accept tok/s", "zero / plain", "full-accept tok/s",
                      "full / plain", "outputs equal to plain"] + oracle, rows) + [""]
    return out


def prefix_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Prefix caching: hits, prefill saved, time to first token", "",
           "`benchmarks/prefix_cache.py`: each workload with caching off, then on, in one run. `shared`: groups of "
           "requests with a common prefix and unique suffixes, all sent at once (ceiling: every request's shared "
           "tokens rounded down to the snapshot interval; a group's first request cannot hit). `multiturn`: "
           "conversations whose next turn is the last turn's prompt, output and new tokens (ceiling: every token "
           "the last turn committed). Prefill tokens are the prompt tokens minus the hits. Each engine first runs "
           "a smaller workload of other tokens untimed, then resets its cache (runs from 2026-12-01T23:00 on). "
           "*outputs equal*: in bf16 a prefix restored from a snapshot and one computed through round differently, "
           "and the greedy tokens of random weights flip; in fp32 the tokens are equal (the CPU run here, and "
           "`tests/engine/test_cuda_prefix_caching.py` on the GPU).", ""]
    for data in files:
        out += provenance(data) + [""]
        rows = [[r["workload"], f"{r['cache_scale']:g}", f"{r['hits']:,}", f"{r['ceiling']:,}",
                 f"{r['hit_ratio_of_ceiling']:.3f}", f"{r['prefill_tokens_off']:,}", f"{r['prefill_tokens_on']:,}",
                 f"{r['prefill_reduction_x']:.1f}x", f"{r['ttft_mean_s_off'] / max(r['ttft_mean_s_on'], 1e-9):.2f}x",
                 f"{r['total_s_off'] / max(r['total_s_on'], 1e-9):.2f}x", f"{r['snapshot_share_of_cache_peak']:.0%}",
                 str(r["evictions"]), "yes" if r["outputs_equal"] else "NO"] for r in data["rows"]]
        out += table(["workload", "device cache (x default)", "hit tokens", "ceiling", "of ceiling", "prefill off",
                      "prefill on", "prefill saved", "TTFT off/on", "total off/on", "snapshots' share of cache",
                      "evictions", "outputs equal"], rows) + [""]
        if not on_gpu(data):
            out += ["CPU run (tiny model): token counts hold anywhere; the time ratios are of a shared 2-core box.", ""]
    return out


def markdown(groups: dict[str, list[dict]], data_dir: str, img: str | None, plots_made: bool) -> str:
    out = ["# Benchmarks", "",
           "Generated by `benchmarks/report.py`; do not edit by hand. To regenerate every table and plot here "
           f"from the JSON in `{data_dir}/`:", "", "```bash",
           ".venv/bin/pip install -e '.[bench]'   # matplotlib, once",
           f"PYTHONPATH=. .venv/bin/python benchmarks/report.py {data_dir}", "```", "",
           "The JSON comes from `benchmarks/run_gpu.sh` on one H200 (it writes into `$OUT`, else `./bench-out`; "
           f"copy those files to `{data_dir}/`). Each script also runs alone and writes its JSON with `--json PATH`; "
           "the command under each table is the one that produced it. Every timing is the median of timed runs "
           "(5 unless a heading says otherwise) after warm-up runs at the same shapes, timed with CUDA events on "
           "CUDA.", ""]
    if not plots_made:
        out += ["(Plots not generated: run without `--no-plots`, with matplotlib installed.)", ""]
    if not groups:
        out += [f"No results in `{data_dir}/` yet: run `benchmarks/run_gpu.sh` on the GPU machine and copy its "
                "JSON there.", ""]
    sections = {"engine_throughput": engine_section, "swap_vs_reprefill": swap_section}
    for bench, files in groups.items():
        if bench in sections:
            out += sections[bench](files, img if plots_made else None)
    ops = groups.get("ops_mamba2", []) + groups.get("ops_gdn", []) + groups.get("ops_kda", [])
    if ops:
        out += ops_section(ops, img if plots_made else None)
    if groups.get("step_profile"):
        out += step_section(groups["step_profile"], img if plots_made else None)
        out += gpu_pair_section(groups["step_profile"])
    if groups.get("kernel_bandwidth"):
        out += kernel_bandwidth_section(groups["kernel_bandwidth"])
    if groups.get("launch_floor"):
        out += launch_floor_section(groups["launch_floor"])
    if groups.get("spec_decode"):
        out += spec_section(groups["spec_decode"], img if plots_made else None)
    if groups.get("ops_kernels"):
        out += kernels_section(groups["ops_kernels"], img if plots_made else None)
    if groups.get("ops_moe"):
        out += moe_section(groups["ops_moe"], img if plots_made else None)
    if groups.get("prefix_cache"):
        out += prefix_section(groups["prefix_cache"], img if plots_made else None)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help="folder of benchmark JSON (default docs/bench-data)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="markdown to write")
    ap.add_argument("--img-dir", default=None, help="folder for the PNGs (default: img/ beside --out)")
    ap.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    args = ap.parse_args()
    data_dir, out = Path(args.data), Path(args.out)
    img_dir = Path(args.img_dir) if args.img_dir else out.parent / "img"
    if not data_dir.is_dir():
        raise SystemExit(f"no folder {data_dir}")
    groups = load(data_dir)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit("matplotlib is missing: `.venv/bin/pip install -e '.[bench]'`, or pass --no-plots")
        plot_all(groups, img_dir)
    shown = os.path.relpath(data_dir.resolve(), ROOT) if data_dir.resolve().is_relative_to(ROOT) else str(data_dir)
    img_link = os.path.relpath(img_dir.resolve(), out.resolve().parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(groups, shown, img_link, not args.no_plots))
    print(f"wrote {out} from {sum(len(v) for v in groups.values())} files in {data_dir}")


if __name__ == "__main__":
    main()
