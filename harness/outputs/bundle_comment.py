"""The Markdown a results repository's CI posts on a pull request: a bundle's verdict and its cells next to
the board's. Every string from a bundle is escaped (no markup, no raw HTML, no @-mention)."""
from __future__ import annotations

from .formatting import MISSING, num
from .report import md_escape


def md_text(text) -> str:
    """Bundle-written text as literal GitHub Markdown: escaped, one line, at most 200 characters, no mention."""
    return md_escape(str(text)[:200]).replace("@", "&#64;")


def cell_means(records) -> dict:
    """{(dataset, scenario, regime, method): (mean final ACC of the ok records, their count)}."""
    sums: dict = {}
    for r in records:
        if not r.ok or "acc" not in r.metrics:
            continue
        key = (r.dataset, str(r.spec.scenario), r.spec.regime, r.method)
        total, n = sums.get(key, (0.0, 0))
        sums[key] = (total + float(r.metrics["acc"]), n + 1)
    return {k: (total / n, n) for k, (total, n) in sums.items()}


def comment(verdict, records, board: dict, board_note: str = "") -> str:
    """The pull-request comment: verdict, checks, reruns, then per cell the bundle's ACC beside the board's."""
    lines = [f"### cl-bench verify: **{md_text(verdict.status)}**", "",
             f"{md_text(verdict.reason)}", "",
             f"Bundle `{md_text(verdict.bundle)}` · sha256 `{verdict.bundle_sha256[:16]}` · contributor "
             f"{md_text(verdict.contributor)} · protocol {md_text(verdict.protocol)} v{md_text(verdict.version)} · "
             f"{verdict.records} records · hardware {md_text(verdict.hardware)}", ""]
    lines += [f"- {md_text(c)}" for c in verdict.checks]
    lines += [f"- rerun `{md_text(r.run_id)}`: {md_text(r.verdict)} (largest difference {r.max_delta:.3g})"
              for r in verdict.reruns]
    lines += ["", "Reruns execute the bundle's method files; checks alone (`--sample 0`) run none." if
              verdict.ran_bundled_code else "No bundled code ran.", ""]
    mine = cell_means(records)
    lines += ["| data set | scenario | regime | method | runs | ACC (this bundle) | ACC (board) | board runs |",
              "|---|---|---|---|---:|---:|---:|---:|"]
    for key in sorted(mine):
        acc, n = mine[key]
        theirs = board.get(key)
        lines.append("| " + " | ".join([*(md_text(k) for k in key), str(n), num(100 * acc, 2),
                                         num(100 * theirs[0], 2) if theirs else MISSING,
                                         str(theirs[1]) if theirs else "0"]) + " |")
    if board_note:
        lines += ["", md_text(board_note)]
    return "\n".join(lines) + "\n"
