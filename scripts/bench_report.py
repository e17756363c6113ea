"""Runs the W1 and Python benchmarks and renders the charts of docs/benchmarks.md.

    .venv/bin/pip install matplotlib      # once, into the dev venv
    RELEASE=1 bash scripts/python-dev.sh --co -q   # optimised extension
    .venv/bin/python scripts/bench_report.py       # ~10 minutes on 2 cores

    .venv/bin/python scripts/bench_report.py --skip-rust --skip-python
        # re-render the charts from the last run's results

Writes ``docs/charts/w1_throughput.png``, ``docs/charts/p2_wall_time.png``
and ``docs/charts/results.md`` (the numbers behind the charts, with the
machine they came from). Every series of a chart comes from the same run on
the same machine, so the ratios between them are what to read: absolute
figures on a shared VM move by tens of percent from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "charts"
CRITERION = ROOT / "target" / "criterion" / "W1_throughput"
PY_RESULTS = OUT / "python_results.json"
W1_KEYS = 1_000_000
WORKERS = [1, 2, 4, 8]

#: criterion function name in benches/queue.rs -> chart label
RUST_SERIES = {
    "reconq_done_and_get": "reconq (Rust, done_and_get)",
    "reconq_get_done": "reconq (Rust, get + done)",
    "crossbeam_channel": "bare crossbeam channel (no dedup)",
}


def run(cmd: List[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def rust_w1() -> Dict[str, Dict[int, float]]:
    """Keys/s per series and worker count, from criterion's estimates."""
    rates: Dict[str, Dict[int, float]] = {}
    for function in RUST_SERIES:
        for workers in WORKERS:
            estimates = CRITERION / function / str(workers) / "new" / "estimates.json"
            mean_ns = json.loads(estimates.read_text())["mean"]["point_estimate"]
            rates.setdefault(function, {})[workers] = W1_KEYS / (mean_ns / 1e9)
    return rates


def python_results() -> Dict:
    raw = json.loads(PY_RESULTS.read_text())
    for series in ("p1_queue", "p1_controller"):
        raw[series] = {engine: {int(w): v for w, v in by_w.items()} for engine, by_w in raw[series].items()}
    return raw


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def chart_w1(rust: Dict[str, Dict[int, float]], py: Dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    for function, label in RUST_SERIES.items():
        ax.plot(WORKERS, [rust[function][w] for w in WORKERS], marker="o", label=label)
    n = py["n"]
    python_series = [
        ("p1_controller", "reconq", f"reconq Controller, Python no-op (N={n:,})"),
        ("p1_queue", "reconq", f"reconq WorkQueue, Python get/done loop (N={n:,})"),
        ("p1_controller", "pure", f"pure-Python controller (N={n:,})"),
        ("p1_queue", "pure", f"pure-Python queue, client-go port (N={n:,})"),
    ]
    for series, engine, label in python_series:
        by_w = py[series][engine]
        ax.plot(WORKERS, [by_w[w] for w in WORKERS], marker="s", linestyle="--", label=label)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xticks(WORKERS, [str(w) for w in WORKERS])
    ax.set_xlabel("workers")
    ax.set_ylabel("keys per second (log scale)")
    ax.set_title("W1 throughput: one producer, N keys, no-op reconcile")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.text(0.01, 0.01, machine(), fontsize=7, alpha=0.7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(OUT / "w1_throughput.png", dpi=110)
    plt.close(fig)


def chart_p2(py: Dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p2 = py["p2"]
    labels = ["ideal", "reconq", "pure Python"]
    values = [p2["ideal"], p2["reconq"], p2["pure"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(labels, values, color=["#999999", "#1f77b4", "#ff7f0e"])
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:.3f} s\n{value / p2['ideal']:.2f}x ideal", (bar.get_x() + bar.get_width() / 2, value),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("wall time (s)")
    ax.set_ylim(0, max(values) * 1.25)
    ax.set_title("P2: 2,000 keys x sleep(5 ms), 16 workers")
    fig.text(0.01, 0.01, machine(), fontsize=6, alpha=0.7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(OUT / "p2_wall_time.png", dpi=110)
    plt.close(fig)


def table(rust: Dict[str, Dict[int, float]], py: Dict) -> str:
    rows = ["| workers | reconq Rust done_and_get | crossbeam channel | ratio | reconq Controller (Python) "
            "| pure-Python controller | ratio |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for w in WORKERS:
        ours, channel = rust["reconq_done_and_get"][w], rust["crossbeam_channel"][w]
        py_ours, py_pure = py["p1_controller"]["reconq"][w], py["p1_controller"]["pure"][w]
        rows.append(f"| {w} | {ours / 1e6:.2f} M/s | {channel / 1e6:.2f} M/s | {ours / channel:.2f} "
                    f"| {py_ours / 1e3:.0f} k/s | {py_pure / 1e3:.0f} k/s | {py_ours / py_pure:.1f}x |")
    p2 = py["p2"]
    rows.append("")
    rows.append(f"P2: ideal {p2['ideal']:.3f} s, reconq {p2['reconq']:.3f} s ({p2['reconq'] / p2['ideal']:.2f}x ideal), "
                f"pure Python {p2['pure']:.3f} s ({p2['pure'] / p2['ideal']:.2f}x ideal).")
    rows.append("")
    rows.append(f"Machine: {machine()}.")
    return "\n".join(rows) + "\n"


def main(argv: List[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-rust", action="store_true", help="reuse criterion's last W1 results")
    ap.add_argument("--skip-python", action="store_true", help="reuse the last Python results")
    ap.add_argument("--repeat", type=int, default=3, help="Python runs per point (best is kept)")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.skip_rust:
        run(["cargo", "bench", "--bench", "queue", "--", "W1_throughput"])
    if not args.skip_python:
        run([sys.executable, "benches/python/bench.py", "p1", "p2", "--repeat", str(args.repeat),
             "--json", str(PY_RESULTS)])
    rust, py = rust_w1(), python_results()
    chart_w1(rust, py)
    chart_p2(py)
    (OUT / "results.md").write_text(table(rust, py))
    print((OUT / "results.md").read_text())
    print(f"charts written to {OUT.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
