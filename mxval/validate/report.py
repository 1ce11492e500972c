"""report.md and a self-contained report.html from ``summary.json`` (figures embedded as base64 PNG).

Public: ``write(summary, out)``, ``markdown(summary) -> str``, ``html(summary, out) -> str``. Both
views are rendered from the summary alone, so a report can be rebuilt from ``summary.json`` and the
PNGs under ``figures/``.
"""

from __future__ import annotations

import base64
import html as _html
import json
import re
from pathlib import Path

from numerics.files import atomic_write

MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skipped": "SKIPPED"}
COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700", "skipped": "#6e7781"}
MAX_ROWS = 40  # longer tables: first rows here, all of them in the level's own files
HIDDEN = ("versions", "runs")  # numbers kept in summary.json but shown as tables or the environment instead

# How to read each level's result: what it compares, and where to look when it fails.
READING = {
    "tensor": "Every 32-element block torchao's `to_mx` produces is compared bit for bit with the independent "
              "NumPy oracle `numerics.tensor.mx` (scale byte and element bytes). A block that differs and matches no "
              "known finding (FINDINGS.md) fails the level; known findings are counted, not hidden. SQNR is the "
              "round trip against the input, held to the floors in `numerics/tolerances.py`.",
    "layer": "Each layer runs FP32, BF16 and MXFP8 on identical inputs and upstream gradients. A failure names "
             "layer/case/recipe/tensor, the measured SQNR against BF16 and the floor with its source. Low against "
             "BF16 but fine against FP32 points at the BF16 run; low against both at torchao or its inputs. "
             "Golden: a drop of more than 1 dB against the committed statistics for this hardware.",
    "communication": "Every rank's received tokens, routing metadata and combined sums are compared bit for bit "
                     "(integer views) with the single-process simulation, or DeepEP with the NCCL all-to-all. A "
                     "mismatch names rank, row, column and source token; replay its case with "
                     "`python -m numerics.ep check --spec '<case>'`.",
    "training": "BF16 and MXFP8 train from identical initial weights on identical batches. BF16 also trains "
                "replicates, each differing from it by one benign change that the table's init / data / rows column "
                "names (by default the order each batch's rows are summed in, at the same seed and data: rounding "
                "alone); their spread is the run-to-run noise the verdicts are held against; held-out BF16 runs are "
                "the negative control (and, made twice the margin worse, the planted positive control). On a CPU the "
                "null control trains too: mxfp8-null, the MXFP8 seam with its casts replaced by the identity, which "
                "must end bit-identical to its BF16 twin. A run fails if its loss is non-finite or does not fall. "
                "Probes give each layer's MXFP8-vs-BF16 SQNR on the run's own activations: the layer whose "
                "figure falls first is where a diverging run went wrong.",
    "curves": "DeepSeek-V3's criterion: relative validation-loss difference within 0.25 %, decided by the declared "
              "test (equivalence: TOST at alpha 0.05, the 90 % interval inside the margin) on one endpoint (the "
              "final 20 % of the evaluations; the whole range is reported, never deciding), with the BF16 "
              "replicates' spread as the noise. Each row gives the estimate, its interval, the p-value against no "
              "difference and the test's, and what the runs resolve. The controls: the planted one must be "
              "detected, the held-out BF16 runs' interval must cover 0, the null control must be identical; a "
              "control that misses makes the verdict untrusted (inconclusive). Inconclusive means the interval "
              "straddles the margin: the run is too short or too noisy to decide, not that MXFP8 failed. "
              "Not-equivalent or diverged fails the level.",
}


def _fmt_number(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt_number(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_number(x) for x in v) + "]"
    return str(v)


def _env_rows(summary: dict) -> list[tuple[str, str]]:
    env, hw = summary["environment"], summary["hardware"]
    keys = ("torch", "torchao", "deep_ep", "cuda", "nccl", "driver", "numpy", "ml_dtypes", "hypothesis", "python",
            "mxval_commit", "platform")
    rows = [(k, str(env.get(k))) for k in keys]
    rows += [("hardware", f"{hw['tag']} ({hw['device']}); GPUs: {', '.join(hw['gpus']) or 'none'}; "
                          f"{hw['cpu_count']} CPU cores; {hw['memory_gib']} GiB memory")]
    return rows


def _md_table(rows) -> list[str]:
    if not rows:
        return []
    head, body = rows[0], rows[1:]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in body[:MAX_ROWS]]
    if len(body) > MAX_ROWS:
        lines.append(f"\n({len(body) - MAX_ROWS} more rows in the level's files)")
    return lines


def markdown(summary: dict) -> str:
    lv = summary["levels"]
    title = MARK[summary["status"]] + (" (INTERRUPTED)" if summary.get("interrupted") else "")
    out = [f"# mxval validate: {title}", "", f"**{counts(summary)}**", ""]
    if summary.get("interrupted"):
        out += [f"Interrupted (Ctrl-C) during the {summary['interrupted']} level: the levels before it are "
                "complete, the rest did not run.", ""]
    out += [
            f"{summary['started']}, {summary['seconds']:.0f} s on {summary['hardware']['device']}; "
            f"exit code {summary['exit_code']}.", "",
            "| level | status | time | result |", "|---|---|---|---|"]
    out += [f"| {name} | **{MARK[r['status']]}** | {r['seconds']:.0f} s | {r['summary']} |" for name, r in lv.items()]
    out += ["", "## Environment", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in _env_rows(summary)]
    for i, (name, r) in enumerate(lv.items(), 1):
        out += ["", f"## {i}. {name}: {r['title']}", "", f"**{MARK[r['status']]}** {r['summary']}", ""]
        out += [f"- {MARK[c['status']]} {c['name']}: {c['detail']}" for c in r["checks"]]
        if r["enable"]:
            out += ["", f"*How to enable / what next:* {r['enable']}"]
        if r["numbers"]:
            out += ["", "Key numbers:", ""]
            out += [f"- {k}: {_fmt_number(v)}" for k, v in r["numbers"].items() if k not in HIDDEN]
        out += [""] + [f"![{name}]({f})" for f in r["figures"]]
        if r["table"]:
            out += [""] + _md_table(r["table"])
        out += ["", f"*Reading it:* {READING[name]}"]
        if r["artifacts"]:
            out += ["", "Files: " + ", ".join(f"`{a}`" for a in r["artifacts"]) + f", log `logs/{name}.log`"]
    return "\n".join(out) + "\n"


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;
color:#1f2328;line-height:1.45}
h1{font-size:26px;margin-bottom:4px}
h2{font-size:19px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
.badge{display:inline-block;padding:2px 9px;border-radius:12px;color:#fff;font-weight:600;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
th{background:#f6f8fa}.muted{color:#656d76;font-size:13px}img{max-width:100%;border:1px solid #d0d7de;margin:8px 0}
ul.checks{padding-left:18px}ul.checks li{margin:2px 0}code{background:#f6f8fa;padding:1px 4px;border-radius:4px}
.note{background:#fff8c5;border:1px solid #d4a72c66;padding:6px 10px;border-radius:6px;font-size:14px}
details summary{cursor:pointer;color:#0969da;font-size:14px}
"""


def counts(summary: dict) -> str:
    """'3 passed, 1 inconclusive, 1 skipped, 0 failed' over the levels."""
    st = [r["status"] for r in summary["levels"].values()]
    words = (("pass", "passed"), ("inconclusive", "inconclusive"), ("skipped", "skipped"), ("fail", "failed"))
    return ", ".join(f"{st.count(k)} {w}" for k, w in words)


def _code(text: str) -> str:
    """Escaped text with `backticks` as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _h(text))


def _badge(status: str) -> str:
    return f'<span class="badge" style="background:{COLOR[status]}">{MARK[status]}</span>'


def _h(x) -> str:
    return _html.escape(str(x))


def _html_table(rows, limit: int | None = None) -> str:
    if not rows:
        return ""
    body = rows[1:] if limit is None else rows[1:limit + 1]
    return ("<table><tr>" + "".join(f"<th>{_h(c)}</th>" for c in rows[0]) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_h(c)}</td>" for c in r) + "</tr>" for r in body) + "</table>")


def _img(out: Path, rel: str) -> str:
    path = out / rel
    if not path.exists():
        return f'<p class="muted">figure {_h(rel)} is missing</p>'
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{_h(rel)}" src="data:image/png;base64,{data}">'


def html(summary: dict, out: Path) -> str:
    lv = summary["levels"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mxval validate: {MARK[summary['status']]}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>mxval validate {_badge(summary['status'])}</h1>",
             f"<p><b>{counts(summary)}</b></p>",
             f"<p class='muted'>{_h(summary['started'])} &middot; {summary['seconds']:.0f} s on "
             f"{_h(summary['hardware']['device'])} &middot; exit code {summary['exit_code']}</p>",
             "<table><tr><th>level</th><th>status</th><th>time</th><th>result</th></tr>"]
    parts += [f"<tr><td><a href='#{n}'>{_h(n)}</a></td><td>{_badge(r['status'])}</td><td>{r['seconds']:.0f} s</td>"
              f"<td>{_h(r['summary'])}</td></tr>" for n, r in lv.items()]
    parts += ["</table>", "<details><summary>Environment (versions, hardware)</summary>",
              _html_table([("", "")] + _env_rows(summary)), "</details>"]
    for i, (name, r) in enumerate(lv.items(), 1):
        parts += [f"<h2 id='{name}'>{i}. {_h(name)}: {_h(r['title'])} {_badge(r['status'])}</h2>",
                  f"<p>{_h(r['summary'])}</p><ul class='checks'>"]
        parts += [f"<li>{_badge(c['status'])} <b>{_h(c['name'])}</b>: {_h(c['detail'])}</li>" for c in r["checks"]]
        parts.append("</ul>")
        if r["enable"]:
            parts.append(f"<p class='note'><b>How to enable / what next:</b> {_code(r['enable'])}</p>")
        parts += [_img(out, f) for f in r["figures"]]
        if r["numbers"]:
            nums = [("key number", "value")] + [(k, _fmt_number(v)) for k, v in r["numbers"].items() if k not in HIDDEN]
            parts.append(_html_table(nums))
        if r["table"]:
            rows = r["table"]
            if len(rows) - 1 > 12:
                parts.append(f"<details><summary>Table ({len(rows) - 1} rows)</summary>{_html_table(rows)}</details>")
            else:
                parts.append(_html_table(rows))
        parts.append(f"<p class='muted'><b>Reading it:</b> {_code(READING[name])}</p>")
        if r["artifacts"]:
            parts.append("<p class='muted'>Files: " + ", ".join(f"<code>{_h(a)}</code>" for a in r["artifacts"])
                         + f", log <code>logs/{name}.log</code></p>")
    parts.append("<p class='muted'>summary.json holds every number above.</p></body></html>")
    return "\n".join(parts)


def write(summary: dict, out: Path) -> None:
    out = Path(out)
    atomic_write(out / "report.md", markdown(summary), force=True)
    atomic_write(out / "report.html", html(summary, out), force=True)


def main(argv=None) -> int:
    """python -m mxval.validate.report RESULTS_DIR: rebuild the two reports from summary.json."""
    import sys

    from numerics.cli import CLIError

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not (Path(args[0]) / "summary.json").exists():
        raise CLIError("usage: python -m mxval.validate.report RESULTS_DIR (a folder with summary.json)")
    out = Path(args[0])
    write(json.loads((out / "summary.json").read_text()), out)
    return 0


if __name__ == "__main__":
    import sys

    from numerics.cli import run_main

    sys.exit(run_main(main))
