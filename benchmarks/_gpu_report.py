"""What ``benchmarks/gpu_check.py`` reads from its steps' outputs (pytest's junit XML, compute-sanitizer's log) and the
Markdown it writes (``results.md``) from its ``results.json``."""

from __future__ import annotations

import math
import re

_ERRORS = re.compile(r"ERROR SUMMARY:\s*(\d+) errors?")
_HAZARDS = re.compile(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_SUMMARY = ("ERROR SUMMARY", "RACECHECK SUMMARY", "COMPUTE-SANITIZER")


def parse_junit(path) -> dict | None:
    """Counts and failed tests of a pytest junit XML file (None when it is missing or unreadable)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    out = dict(tests=0, failures=0, errors=0, skipped=0, time=0.0, failed=[])
    for suite in root.iter("testsuite"):
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(suite.get(k, 0))
        out["time"] += float(suite.get("time", 0.0))
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            bad = case.find(kind)
            if bad is not None:
                message = (bad.get("message") or bad.text or "").strip().splitlines()
                out["failed"].append(dict(test=f"{case.get('classname')}::{case.get('name')}", kind=kind,
                                          message=(message[0] if message else "")[:300]))
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    return out


def parse_sanitizer(log_path) -> dict:
    """compute-sanitizer's summary in a log: ``errors`` (the ERROR SUMMARY's count, or racecheck's errors where it
    prints only its RACECHECK SUMMARY; None when no summary was printed: the run did not finish), racecheck's
    ``hazards`` / ``warnings``, the first reported lines, and ``ok`` (a summary with 0 errors)."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    errors = [int(m.group(1)) for m in _ERRORS.finditer(text)]
    hazards = [tuple(map(int, m.groups())) for m in _HAZARDS.finditer(text)]
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith("=========") and ln.strip("= \n")
             and not any(s in ln for s in _SUMMARY)]
    if not errors and hazards:  # racecheck's own summary (it prints no ERROR SUMMARY): its errors
        errors = [h[1] for h in hazards]
    out = dict(errors=sum(errors) if errors else None, reports=lines[:30])
    if hazards:
        out.update(hazards=sum(h[0] for h in hazards), warnings=sum(h[2] for h in hazards))
    out["ok"] = out["errors"] == 0
    return out


# ------------------------------------------------------------------------------------------ results.md
def _num(x, fmt="{:.3g}"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, str):
        return x
    return fmt.format(x)


def _mib(b):
    return "-" if not b else f"{b / 2**20:.0f}"


def _table(head, rows) -> list:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return out + [""]


def _env(data) -> list:
    return _table(["fact", "value"], [(k, v) for k, v in data.items()])


def _warm(data) -> list:
    out = [f"{data['compiled']} Numba functions compiled in {data['seconds']:.0f} s (the later steps load them).", ""]
    if data.get("errors"):
        out += _table(["case", "error"], list(data["errors"].items()))
    return out


def _tests(data) -> list:
    out = [f"{data['passed']} passed, {data['failures']} failed, {data['errors']} errors, {data['skipped']} "
           f"skipped of {data['tests']} ({data['time']:.0f} s).", ""]
    if data["failed"]:
        out += _table(["test", "kind", "message"], [(f["test"], f["kind"], f["message"]) for f in data["failed"]])
    return out


def _sanitizer(data) -> list:
    d = data.get("driver")
    out = []
    if d:
        n = sum(d["launches"].values())
        out += [f"Driver ({d['mode']}): {len(d['cases'])} calls, {n} launches, "
                f"{len(d['kernels']) - len(d['missing'])} of {len(d['kernels'])} listed kernels reached"
                + (f"; **not reached: {', '.join(d['missing'])}**" if d["missing"] else "") + ".", ""]
        failed = [c for c in d["cases"] if not c["ok"]]
        if failed:
            out += _table(["call", "error"], [(c["name"], c["error"]) for c in failed])
        out += _table(["kernel", "launches"], list(d["launches"].items()))
    else:
        out += ["The driver wrote no results (see steps/driver.log).", ""]
    out += [f"Sanitizer: {data.get('sanitizer')}", ""]
    rows = []
    for tool, t in data.get("tools", {}).items():
        if "skipped" in t:
            rows.append((tool, "skipped: " + t["skipped"], "-", "-", "-"))
            continue
        status = "ok" if t["ok"] and not t["timed_out"] else ("timed out" if t["timed_out"] else "FAILED")
        rows.append((tool, status, _num(t["errors"], "{}"), _num(t.get("hazards"), "{}"),
                     "; ".join(t["reports"][:3]) or "-"))
    if rows:
        out += _table(["tool", "result", "errors", "racecheck hazards", "first reports"], rows)
    return out


def _compare(data) -> list:
    rows = [(r["case"], r["output"], _num(r.get("max_abs")), _num(r.get("rel")), _num(r.get("tol")),
             ("ok" if r["ok"] else "**FAIL**") + (f" ({r['nonfinite_mismatch']} inf/NaN differ)"
                                                   if r.get("nonfinite_mismatch") else "")
             + (f" ({r['note']})" if r.get("note") else ""))
            for r in data["rows"]]
    out = ["max abs: the largest |device - CPU| over elements finite on both sides; rel: that over the largest "
           "|CPU| element; pass within tol x max(1, largest |CPU|).", ""]
    return out + _table(["case", "output", "max abs", "rel", "tol", "result"], rows) + _footer(data, "case")


def _footer(data, key) -> list:
    """The items of a step that raised, were not started (time), or were running when it was stopped."""
    out = [f"- **{e[key]}** raised: {e['error']}" for e in data.get("errors", [])]
    if data.get("skipped"):
        out.append(f"- not run (time): {', '.join(data['skipped'])}")
    if data.get("current"):
        out.append(f"- stopped while running: {data['current']}")
    return out + [""]


def _side(s):
    if "error" in s:
        return "-", "-"
    return _num(s["ms"], "{:.3f}"), _mib(s.get("peak_bytes"))


def _bench(data, emulated) -> list:
    out = ["Emulated: the times below are host times of the CPU emulation, not GPU times.", ""] if emulated else []
    for b in data["benchmarks"]:
        out += [f"#### {b['name']}", ""]
        rows, kernels = [], []
        for c in b["cases"]:
            (ms, mib), (pms, pmib) = _side(c["chainfb"]), _side(c["peer"])
            note = c["chainfb"].get("error") or c["peer"].get("error") or ""
            note = "" if note == c["peer_name"] else note
            rows.append((c["case"], ms, c["peer_name"], pms, _num(c.get("time_ratio"), "{:.2f}x"), mib, pmib,
                         _num(c.get("memory_ratio"), "{:.2f}x"), note[:120]))
            kernels += [(c["case"], k["name"], k["launches"], f"{k['ms']:.3f}") for k in c.get("kernels", [])]
        out += _table(["case", "chainfb ms", "peer", "peer ms", "time ratio", "chainfb MiB", "peer MiB",
                       "memory ratio", "note"], rows)
        if kernels:
            out += ["Per kernel (one traced chainfb step):", ""]
            out += _table(["case", "kernel", "launches", "device ms"], kernels)
    return out + _footer(data, "benchmark")


def _sweep(data) -> list:
    """The sweep's times: a row per case, engine, block and cluster, a column per shared-memory mode and arc
    table."""
    cols = list(dict.fromkeys((r["mode"], r["table"]) for r in data["rows"]))
    rows = {}
    for r in data["rows"]:
        key = (r["case"], r["engine"], r["block"] or "default", r.get("cluster", 1), r.get("frames", 1))
        rows.setdefault(key, {})[r["mode"], r["table"]] = r["ms"]
    head = ["case", "engine", "block", "blocks a direction", "posterior frames a block"] + [
        f"mode {m}" + (" + arc table" if t else "") + " ms" for m, t in cols]
    body = [(*key, *(_num(got.get(c), "{:.3f}")[:80] for c in cols)) for key, got in rows.items()]
    best = {}  # per case and engine, its fastest launch
    for r in data["rows"]:
        if isinstance(r["ms"], float) and r["ms"] < best.get((r["case"], r["engine"]), (float("inf"),))[0]:
            best[r["case"], r["engine"]] = (r["ms"], r)
    fastest = [(case, engine, f"mode {r['mode']}" + (" + arc table" if r["table"] else ""), r["block"] or "default",
                r.get("cluster", 1), r.get("frames", 1), f"{ms:.3f}") for (case, engine), (ms, r) in best.items()]
    return (["The recursion and posterior kernels alone (benchmarks/gpu_block_sweep.py): the launch the engine's "
             "defaults should pick.", ""] + _table(head, body)
            + ["The fastest launch of each case and engine:", ""]
            + _table(["case", "engine", "mode", "block", "blocks a direction", "posterior frames a block", "ms"],
                     fastest) + _footer(data, "case"))


def _profile(data) -> list:
    """Per profiled step: its times, its heaviest kernels and the host's heaviest Python functions."""
    out = ["host: the time to issue the step (no synchronisation); near the synchronised time, the GPU waits for "
           "the host (benchmarks/gpu_profile.py; the whole profile in steps/profile/).", ""]
    for c in data["cases"]:
        if "error" in c:
            out += [f"- **{c['case']}** raised: {c['error']}", ""]
            continue
        out += [f"#### {c['case']}", "", f"device {c['device_ms']:.3f} ms, host {c['host_ms']:.3f} ms, synchronised "
                f"{c['synced_ms']:.3f} ms", ""]
        if c["kernels"]:
            out += _table(["kernel", "calls", "device ms"], [(n[:90], k, f"{ms:.4f}") for n, k, ms in c["kernels"][:6]])
        out += _table(["Python function", "calls (5 steps)", "own ms a step", "cumulative ms a step"],
                      [(n[:90], k, f"{tt:.4f}", f"{ct:.4f}") for n, k, tt, ct in c["python"][:8]])
    return out + _footer(data, "case")


SECTIONS = {"env": ("Environment", _env), "warm": ("CPU engine compiled", _warm), "tests": ("CUDA tests", _tests),
            "sanitizer": ("Sanitizers", _sanitizer), "compare": ("GPU vs CPU", _compare), "bench": ("Benchmarks", None),
            "sweep": ("Engine launches", _sweep), "profile": ("Where a step's time goes", _profile)}


def render(results) -> str:
    """``results.md`` of a run's ``results.json``."""
    emulated = results["mode"] == "emulated"
    out = [f"# chainfb GPU check ({results['mode']})", "",
           f"Started {results['started']}; {results.get('elapsed_s', 0):.0f} s of a {results['time_limit_s']:.0f} s "
           "time limit.", ""]
    if emulated:
        out += ["**Emulated run**: no GPU; the kernels ran on the CPU through the test suite's emulation on tiny "
                "shapes. It checks the script and the code paths; its times are not GPU times.", ""]
    rows = [(name, s["status"], _num(s.get("seconds"), "{:.0f}"), _num(s.get("limit_s"), "{:.0f}"),
             (s.get("reason") or "").splitlines()[0][:200] if s.get("reason") else "")
            for name, s in results["steps"].items()]
    out += ["## Steps", ""] + _table(["step", "status", "seconds", "limit s", "note"], rows)
    for name, (title, fn) in SECTIONS.items():
        s = results["steps"].get(name)
        if not s or not s.get("data"):
            continue
        out += [f"## {title}", ""]
        try:
            out += _bench(s["data"], emulated) if name == "bench" else fn(s["data"])
        except Exception as e:  # noqa: BLE001 -- the other sections and results.json are still written
            out += [f"(this section could not be written: {type(e).__name__}: {e}; see results.json)", ""]
    return "\n".join(out) + "\n"
