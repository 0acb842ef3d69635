"""compare.png: accuracy vs speed, one panel per target (what `python -m pipeline compare` measured).

x: predicted decode tok/s on the target; y: perplexity change on the held-out text, with its 95% interval as an
error bar; a filled marker fits the target, a hollow one does not; the dashed line is the recipe's
max_perplexity_increase. Formats no stack of the target builds, or not measured, are left out of that panel.
"""

from __future__ import annotations

import io
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import write_atomic


def save_chart(result: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")           # no display on a build machine
        import matplotlib.pyplot as plt
    except ImportError:
        raise PipelineError("the compare chart needs matplotlib", "run ./bootstrap.sh (it installs the workstation "
                            "environment, matplotlib included)") from None

    targets = result["targets"]
    fig, axes = plt.subplots(1, len(targets), figsize=(6.4 * len(targets), 4.8), squeeze=False)
    limit = result["limits"]["max_perplexity_increase"] * 100
    for ax, t in zip(axes[0], targets, strict=True):
        near: dict[float, int] = {}     # labels of points at (almost) the same speed are stacked, not overprinted
        for r in t["rows"]:
            m = r["measured"]
            if m is None or r["decode_tok_s"] is None:
                continue
            x, y = r["decode_tok_s"], m["perplexity_change"] * 100
            lo, hi = m["interval"][0] * 100, m["interval"][1] * 100
            line = ax.errorbar([x], [y], yerr=[[max(y - lo, 0)], [max(hi - y, 0)]], fmt="o", markersize=8,
                               capsize=4, mfc=None if r["fits"] else "white")
            k = near[round(x, 0)] = near.get(round(x, 0), -1) + 1
            ax.annotate(f"{r['weights']}{'' if r['fits'] else ' (does not fit)'}, top-1 {m['top1_agreement']:.0%}",
                        (x, y), textcoords="offset points", xytext=(8, 6 - 12 * k), fontsize=8,
                        color=line[0].get_color(), bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})
        ax.axhline(limit, linestyle="--", color="grey", linewidth=1)
        ax.annotate(f"max_perplexity_increase {limit:+.0f}%", (0, limit), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", fontsize=7, color="grey")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xlabel(f"predicted decode tok/s on {t['target_name']}")
        ax.set_ylabel(f"perplexity change on {result['heldout']} (%)")
        ax.set_title(f"{result['recipe']}: accuracy vs speed", fontsize=10)
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.2)
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=110, metadata={"Software": None})
    finally:
        plt.close(fig)
    write_atomic(path, png.getvalue())
