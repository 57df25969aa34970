"""The chart of the results (``chart.png`` beside ``results.md``): throughput by
configuration and fsync policy, and recovery time against log length.

matplotlib is imported when the chart is drawn: it is in the bench extra, and the figures
are written without it (``bench.report.write``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(res: dict[str, Any], path: Path) -> None:
    """The throughput bars and the recovery curve, side by side, as a PNG at ``path``
    (nothing when the results have neither). Needs matplotlib (the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp, rc = res.get("throughput"), res.get("recovery")
    n = int(bool(tp)) + int(bool(rc))
    if not n:
        return
    fig, axes = plt.subplots(1, n, figsize=(7 * n, 5))
    axes = [axes] if n == 1 else list(axes)
    i = 0
    if tp:
        ax = axes[i]
        i += 1
        fs = list(tp["by_fsync"])
        cfgs = [c for c in tp["by_fsync"][fs[0]] if c != "ratios"]
        width = 0.8 / len(fs)
        for k, f in enumerate(fs):
            vals = [tp["by_fsync"][f][c]["steps_per_s"] for c in cfgs]
            xs = [x + k * width for x in range(len(cfgs))]
            bars = ax.bar(xs, vals, width, label=f"appendfsync {f}")
            for b, v in zip(bars, vals, strict=True):
                ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7, rotation=90)
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 8)
        ax.set_xticks([x + width * (len(fs) - 1) / 2 for x in range(len(cfgs))])
        ax.set_xticklabels(cfgs, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("steps/s (log scale; plain RQ: jobs/s)")
        ax.set_title("Throughput, four-step no-op runs")
        ax.legend(fontsize=8)
    if rc:
        ax = axes[i]
        xs = [rc["rows"][s]["events"] for s in rc["sizes"]]
        ax.plot(xs, [rc["rows"][s]["load_ms"] for s in rc["sizes"]], "o-",
                label="EventLog.load (from last checkpoint)")
        ax.plot(xs, [rc["rows"][s]["refold_ms"] for s in rc["sizes"]], "s--",
                label="full refold (read + fold)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events in the run's log")
        ax.set_ylabel("ms (median)")
        ax.set_title("Recovery time against log length")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
