"""The side-by-side comparison of ``python -m recipes.digits --criterion all``:
``compare.json`` (per criterion: test WER, greedy WER where the decoder has
one, wall and CPU seconds per epoch, peak resident memory) and
``compare.png`` (WER, time per epoch, WER per epoch, the LF-MMI objective
and the other criteria's log-likelihoods on separate axes)."""

from __future__ import annotations

import json
import os

from .config import objective_label
from .files import atomic_write, save_figure

__all__ = ["summarize", "format_table", "write_comparison"]


def summarize(results: dict[str, dict]) -> dict[str, dict]:
    """``{criterion: {"test_wer", "test_wer_greedy" (when the decoder has one), "seconds_per_epoch",
    "cpu_seconds_per_epoch", "peak_rss_mb", "epochs"}}`` from each run's ``results.json``."""
    out = {}
    for name, r in results.items():
        hist = r.get("history") or []
        epochs = max(len(hist), 1)
        row = dict(test_wer=r["test_wer"], seconds_per_epoch=r["train_seconds"] / epochs,
                   cpu_seconds_per_epoch=r.get("train_cpu_seconds", float("nan")) / epochs,
                   peak_rss_mb=r.get("peak_rss_mb"), epochs=len(hist))
        if hist and "test_wer_greedy" in hist[-1]:
            row["test_wer_greedy"] = hist[-1]["test_wer_greedy"]
        out[name] = row
    return out


def format_table(summary: dict[str, dict]) -> str:
    """The comparison as a text table (one row per criterion; ``-`` where a value does not apply)."""
    lines = ["wall s/epoch depends on the machine's load; CPU s/epoch is the process's CPU time (all its threads)",
             f"{'criterion':12s} {'WER %':>7s} {'greedy WER %':>13s} {'wall s/epoch':>13s} {'CPU s/epoch':>12s} "
             f"{'peak RSS MB':>12s}"]
    for name, s in summary.items():
        rss = f"{s['peak_rss_mb']:.0f}" if s.get("peak_rss_mb") is not None else "-"
        greedy = f"{s['test_wer_greedy']:.2f}" if s.get("test_wer_greedy") is not None else "-"
        lines.append(f"{name:12s} {s['test_wer']:7.2f} {greedy:>13s} {s['seconds_per_epoch']:13.1f} "
                     f"{s['cpu_seconds_per_epoch']:12.1f} {rss:>12s}")
    return "\n".join(lines)


def write_comparison(out_dir: str, results: dict[str, dict]) -> str:
    """Write ``compare.json`` and (with matplotlib) ``compare.png`` into ``out_dir``; returns the text table."""
    summary = summarize(results)
    with atomic_write(os.path.join(out_dir, "compare.json")) as f:
        json.dump(summary, f, indent=1)
    plot_comparison(results, summary, os.path.join(out_dir, "compare.png"))
    return format_table(summary)


def plot_comparison(results: dict[str, dict], summary: dict[str, dict], path: str) -> bool:
    """``compare.png``: test WER and wall/CPU seconds per epoch (bars), test WER per epoch, the LF-MMI objective
    per frame (chain) and the log-likelihood per frame of the other criteria on separate panels, integer epoch
    ticks.  False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(summary)
    chain = [n for n in names if n == "chain"]
    others = [n for n in names if n != "chain"]
    fig, ax = plt.subplots(1, 5, figsize=(21, 3.8))
    ax[0].bar(names, [summary[n]["test_wer"] for n in names], color="C3")
    ax[0].set_ylabel("test WER % (held-out voices)")
    pos = range(len(names))
    ax[1].bar([p - 0.2 for p in pos], [summary[n]["seconds_per_epoch"] for n in names], 0.4, label="wall")
    ax[1].bar([p + 0.2 for p in pos], [summary[n]["cpu_seconds_per_epoch"] for n in names], 0.4, label="CPU")
    ax[1].set_xticks(list(pos), names)
    ax[1].set_ylabel("seconds per epoch")
    ax[1].legend(fontsize=8)
    panels = [(ax[2], names, "test_wer", "test WER % per epoch")]
    if chain:
        panels.append((ax[3], chain, "train_objf_per_frame", f"{objective_label('chain')} / frame (train)"))
    else:
        ax[3].set_visible(False)
    if others:
        panels.append((ax[4], others, "train_objf_per_frame", "log-likelihood / frame (train)"))
    else:
        ax[4].set_visible(False)
    for a, which, key, label in panels:
        for n in which:
            hist = results[n].get("history") or []
            a.plot([h["epoch"] for h in hist], [h[key] for h in hist], "o-", label=n,
                   color=f"C{names.index(n)}")
        a.set_xlabel("epoch")
        a.set_ylabel(label)
        a.xaxis.get_major_locator().set_params(integer=True)
        a.legend(fontsize=8)
    for a in ax[:2]:
        a.tick_params(axis="x", rotation=20)
    for a in ax:
        a.grid(alpha=0.3)
    save_figure(fig, path)
    return True
