"""The side-by-side comparison of ``train_digits.py --criterion all``:
``compare.json`` (per criterion: test WER, seconds per epoch, peak resident
memory) and ``compare.png`` (WER, time per epoch, objective curves)."""

from __future__ import annotations

import json
import os
from typing import Dict

from .files import atomic_write, save_figure

__all__ = ["summarize", "write_comparison"]


def summarize(results: Dict[str, dict]) -> Dict[str, dict]:
    """``{criterion: {"test_wer", "test_wer_greedy" (when the decoder has one), "seconds_per_epoch",
    "peak_rss_mb", "epochs"}}`` from each run's ``results.json``."""
    out = {}
    for name, r in results.items():
        hist = r.get("history") or []
        epochs = max(len(hist), 1)
        row = dict(test_wer=r["test_wer"], seconds_per_epoch=r["train_seconds"] / epochs,
                   peak_rss_mb=r.get("peak_rss_mb"), epochs=len(hist))
        if hist and "test_wer_greedy" in hist[-1]:
            row["test_wer_greedy"] = hist[-1]["test_wer_greedy"]
        out[name] = row
    return out


def write_comparison(out_dir: str, results: Dict[str, dict]) -> str:
    """Write ``compare.json`` and (with matplotlib) ``compare.png`` into ``out_dir``; returns a text table."""
    summary = summarize(results)
    with atomic_write(os.path.join(out_dir, "compare.json")) as f:
        json.dump(summary, f, indent=1)
    _plot(results, summary, os.path.join(out_dir, "compare.png"))
    lines = [f"{'criterion':12s} {'WER %':>7s} {'s/epoch':>8s} {'peak RSS MB':>12s}"]
    for name, s in summary.items():
        rss = f"{s['peak_rss_mb']:.0f}" if s["peak_rss_mb"] is not None else "-"
        lines.append(f"{name:12s} {s['test_wer']:7.2f} {s['seconds_per_epoch']:8.1f} {rss:>12s}")
    return "\n".join(lines)


def _plot(results, summary, path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(summary)
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    ax[0].bar(names, [summary[n]["test_wer"] for n in names], color="C3")
    ax[0].set_ylabel("test WER % (held-out voices)")
    ax[1].bar(names, [summary[n]["seconds_per_epoch"] for n in names], color="C0")
    ax[1].set_ylabel("seconds per epoch")
    for a, key, label in ((ax[2], "test_wer", "test WER % per epoch"),
                          (ax[3], "train_objf_per_frame", "training objective / frame")):
        for n in names:
            hist = results[n].get("history") or []
            a.plot([h["epoch"] for h in hist], [h[key] for h in hist], "o-", label=n)
        a.set_xlabel("epoch")
        a.set_ylabel(label)
        a.legend(fontsize=8)
    for a in ax[:2]:
        a.tick_params(axis="x", rotation=20)
    for a in ax:
        a.grid(alpha=0.3)
    save_figure(fig, path)
    return True
