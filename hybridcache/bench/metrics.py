"""Per-request timings of a streamed request and their summary (names and units as `vllm bench serve`).

  TTFT  time to first token: request sent -> first content chunk
  TPOT  time per output token after the first, per request: (e2el - ttft) / (output_tokens - 1)
  ITL   inter-token latency: gaps between consecutive content chunks, over all requests
  E2EL  end-to-end latency: request sent -> stream ended
"""
from __future__ import annotations

from dataclasses import dataclass, field

METRICS = (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
           ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency"))


@dataclass
class RequestResult:
    """One request. Times in seconds; `output_tokens` from the usage chunk (else the content chunks)."""
    success: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def summarize(results: list[RequestResult], duration: float) -> dict:
    """Throughputs, and mean / median / p99 of each metric in ms (`mean_ttft_ms`, `p99_itl_ms`, ...)."""
    import numpy as np

    ok = [r for r in results if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    summary: dict = dict(
        completed=len(ok), failed=len(results) - len(ok), duration_s=duration,
        total_input_tokens=in_tokens, total_output_tokens=out_tokens,
        request_throughput=len(ok) / duration, output_throughput=out_tokens / duration,
        total_token_throughput=(in_tokens + out_tokens) / duration,
        errors=sorted({r.error for r in results if not r.success})[:10],
    )
    samples = dict(ttft=[r.ttft for r in ok], tpot=[r.tpot for r in ok if r.tpot is not None],
                   itl=[gap for r in ok for gap in r.itl], e2el=[r.e2el for r in ok])
    for name, values in samples.items():
        ms = np.asarray(values, dtype=np.float64) * 1000.0
        summary[f"mean_{name}_ms"] = float(ms.mean()) if ms.size else 0.0
        summary[f"median_{name}_ms"] = float(np.median(ms)) if ms.size else 0.0
        summary[f"p99_{name}_ms"] = float(np.percentile(ms, 99)) if ms.size else 0.0
    return summary


def format_table(summary: dict) -> str:
    """The summary as the fixed-width table `vllm bench serve` prints."""
    rows = [("Successful requests:", summary["completed"]), ("Failed requests:", summary["failed"]),
            ("Benchmark duration (s):", f"{summary['duration_s']:.2f}"),
            ("Total input tokens:", summary["total_input_tokens"]),
            ("Total generated tokens:", summary["total_output_tokens"]),
            ("Request throughput (req/s):", f"{summary['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{summary['output_throughput']:.2f}"),
            ("Total token throughput (tok/s):", f"{summary['total_token_throughput']:.2f}")]
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]
    lines += [f"{k:<40}{v:<10}" for k, v in rows]
    for name, title in METRICS:
        lines.append("{s:{c}^50}".format(s=f" {title} ", c="-"))
        for stat in ("mean", "median", "p99"):
            label = f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms):"
            lines.append(f"{label:<40}{summary[f'{stat}_{name}_ms']:<10.2f}")
    lines.append("=" * 50)
    return "\n".join(lines)
