"""The PNGs of docs/benchmarks.md (matplotlib, imported only here): tokens/s against batch size, swap-in
against re-prefill, replay against per-token states, kernel GB/s against the copy roofline; and the checks
both the plots and the tables make of a result file (`on_gpu`)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PEERS = {"fla_gather_us": "fla + gather/scatter", "fla_kernel_us": "fla kernel alone", "fla_indexed_us": "fla, slot indices",
         "mamba_ssm_us": "mamba_ssm, slot indices"}


def plot_all(groups: dict[str, list[dict]], img_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if groups:
        img_dir.mkdir(parents=True, exist_ok=True)
    if groups.get("engine_throughput"):
        files = groups["engine_throughput"]
        fig, axes = plt.subplots(1, len(files), figsize=(4.5 * len(files), 3.8), squeeze=False)
        for ax, data in zip(axes[0], files):
            series = defaultdict(list)
            for r in data["rows"]:
                series[r["engine"]].append((r["batch"], r["tok_per_s"]))
            for engine, pts in sorted(series.items()):
                pts.sort()
                style = dict(color="black", linestyle="--") if engine == "transformers" else {}
                ax.plot(*zip(*pts), marker="o", label=engine, **style)
            p = data["params"]
            ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="generated tokens/s",
                   title=f"{p['family']} {p['size']} {p['dtype']}" + machine_note(data))
            log_axes(ax, sorted({r["batch"] for r in data["rows"]}))
        save(fig, img_dir / "engine_throughput.png")
    if groups.get("swap_vs_reprefill"):
        files = groups["swap_vs_reprefill"]
        fig, axes = plt.subplots(1, len(files), figsize=(6 * len(files), 4.2), squeeze=False)
        for ax, data in zip(axes[0], files):
            rows = sorted(data["rows"], key=lambda r: r["context"])
            ctx = [r["context"] for r in rows]
            for key, label, style in (("reprefill_ms", "re-prefill, to next token", dict(color="C3")),
                                      ("prefill_ms", "prefill alone", dict(color="C3", linestyle=":")),
                                      ("swap_ms", "swap-in, to next token", dict(color="C0")),
                                      ("copy_ms", "copy alone", dict(color="C0", linestyle=":")),
                                      ("decode_ms", "one decode step", dict(color="gray", linestyle="--"))):
                ax.plot(ctx, [r[key] for r in rows], marker="o", label=label, **style)
            p = data["params"]
            ax.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="ms",
                   title=f"resume one request: {p['family']} {p['size']} {p['dtype']}" + machine_note(data))
            log_axes(ax, ctx)
        save(fig, img_dir / "swap_vs_reprefill.png")
    ops = groups.get("ops_mamba2", []) + groups.get("ops_gdn", []) + groups.get("ops_kda", [])
    if ops:
        fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.2), squeeze=False)
        for ax, data in zip(axes[0], ops):
            by_k = defaultdict(list)
            for r in data["rows"]:
                by_k[r["k"]].append(r)
            for i, (k, rows) in enumerate(sorted(by_k.items())):
                rows.sort(key=lambda r: r["batch"])
                b = [r["batch"] for r in rows]
                ax.plot(b, [r["replay_ms"] for r in rows], marker="o", color=f"C{i}", label=f"replay, k={k}")
                ax.plot(b, [r["inter_ms"] for r in rows], marker="s", color=f"C{i}", linestyle="--",
                        label=f"per-token states, k={k}")
            first = sorted(by_k.get(min(by_k), []), key=lambda r: r["batch"]) if by_k else []
            if first:
                ax.plot([r["batch"] for r in first], [r["decode_ms"] for r in first], color="gray", linestyle=":",
                        label="plain decode")
            p = data["params"]
            ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="ms per verify step (one layer)",
                   title=f"{p['op']} verify, {p['dtype'].replace('torch.', '')}" + machine_note(data))
            log_axes(ax, sorted({r["batch"] for r in data["rows"]}))
        save(fig, img_dir / "spec_verify.png")
    decode_files = [d for d in groups.get("ops_kernels", []) if any(r["kind"] == "decode" for r in d["rows"])]
    if decode_files:
        data = decode_files[-1]
        rows = [r for r in data["rows"] if r["kind"] == "decode" and r["op"] != "conv1d"]
        ops_here = sorted({r["op"] for r in rows})
        fig, axes = plt.subplots(1, len(ops_here), figsize=(4.8 * len(ops_here), 4.0), squeeze=False)
        for ax, op in zip(axes[0], ops_here):
            mine = sorted((r for r in rows if r["op"] == op), key=lambda r: r["batch"])
            b = [r["batch"] for r in mine]
            ax.plot(b, [r["ours_gbs"] for r in mine], marker="o", label="ours")
            for i, (key, label) in enumerate(PEERS.items()):
                if key in mine[0]:
                    ax.plot(b, [r["state_bytes"] / r[key] / 1e3 for r in mine], marker="s", linestyle="--",
                            color=f"C{i + 1}", label=label)
            ax.axhline(data["extra"]["copy_gbs"], color="gray", linestyle=":", label="device copy")
            ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="state GB/s (read + write)",
                   title=f"{op} decode, bf16 inputs, fp32 state")
            log_axes(ax, b)
        save(fig, img_dir / "kernels_decode.png")


def log_axes(ax, xticks: list[int]) -> None:
    """Log-log axes labelled with plain numbers: the measured x values, the y decades and their halves."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(xticks, [f"{x:,}" for x in xticks])
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def on_gpu(data: dict) -> bool:
    """Whether the figures come from a GPU: the params name a CUDA device, or (files without a device
    param) the machine record names a GPU."""
    device = data.get("params", {}).get("device")
    if device is not None:
        return "cuda" in str(device)
    return not str(data.get("machine", {}).get("device", "cpu")).startswith("cpu")


def machine_note(data: dict) -> str:
    """The plot title's last line: the GPU it ran on (figures from two GPUs sit side by side), or a CPU mark."""
    return f"\n({data.get('machine', {}).get('device', 'GPU')})" if on_gpu(data) else "\n(CPU smoke run)"


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"wrote {path}")
