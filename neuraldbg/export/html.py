"""A self-contained HTML report of watched runs: readable in any browser, offline, as a CI artifact.

One file: the verdicts, each unhealthy run's explanations and causal chain, its pictures inline (as ``data:`` URIs),
and its causal graph twice: drawn here in HTML (boxes and arrows, no script, no network) and as Mermaid source to
paste where Mermaid renders. A Content-Security-Policy forbids scripts and every request, so a name in the report
can do nothing but be read; every text is escaped (and made inert, see :mod:`neuraldbg.export.inert`).

Built from plain data (:class:`RunPage`), so the pytest plugin (from its run records) and ``neuraldbg report`` (from
trace files) write the same page.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .inert import inert

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:980px;margin:2em auto;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #d0d7de;padding-bottom:.3em;margin-top:2em}
.verdict{font-weight:600}.unhealthy{color:#b42318}.healthy{color:#1a7f37}.error{color:#9a6700}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.85em}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}
.graph ul{list-style:none;padding-left:1.6em;margin:0;border-left:2px solid #d0d7de}
.graph>ul{border-left:none;padding-left:0}
.node{display:inline-block;border:1px solid #7f8c8d;border-radius:6px;padding:4px 8px;margin:4px 0;white-space:pre-line}
.root{background:#ffd6d6;border:3px solid #c0392b}.critical{background:#ffe0b3;border-color:#d35400}
.effect{background:#fff5cc;border-color:#b7950b}.evidence{background:#eeeeee}.healthy-node{background:#d5f5e3}
.relation{color:#57606a;font-size:.85em;margin-right:.4em}
"""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


@dataclass
class Hypothesis:
    """One failure hypothesis in words: its summary line, its explanation, its causal chain (one line per event)."""

    summary: str
    explanation: str
    chain: list[str] = field(default_factory=list)


@dataclass
class RunPage:
    """What the report says about one run. ``pictures``: ``(file name, bytes)`` of PNG or SVG files."""

    title: str
    verdict: str
    hypotheses: list[Hypothesis] = field(default_factory=list)
    mermaid: str = ""
    pictures: list[tuple[str, bytes]] = field(default_factory=list)
    numbers: str = ""
    note: str = ""


def text(value: object) -> str:
    """Escaped, inert text for HTML."""
    return html.escape(inert(str(value), lines=True))


def page(runs: Sequence[RunPage], *, title: str = "NeuralDBG training health", intro: str = "", note: str = "") -> str:
    """The whole HTML document: a table of every run's verdict, then a section per run (unhealthy runs first)."""
    ordered = sorted(runs, key=lambda r: {"unhealthy": 0, "error": 1}.get(r.verdict, 2))
    rows = "".join(
        f"<tr><td><a href='#run-{i}'>{text(r.title)}</a></td><td class='verdict {text(r.verdict)}'>{text(r.verdict)}"
        f"</td><td>{text(r.hypotheses[0].summary if r.hypotheses else r.numbers or r.note)}</td></tr>"
        for i, r in enumerate(ordered)
    )
    sections = "".join(_section(i, r) for i, r in enumerate(ordered))
    head = (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{text(title)}</title>"
        f"<style>{STYLE}</style></head><body>"
    )
    parts = [head, f"<h1>{text(title)}</h1>"]
    if intro:
        parts.append(f"<p>{text(intro)}</p>")
    parts.append(f"<table><tr><th>Run</th><th>Verdict</th><th>Root cause</th></tr>{rows}</table>")
    if note:
        parts.append(f"<p><em>{text(note)}</em></p>")
    parts += [sections, "</body></html>\n"]
    return "".join(parts)


def _section(index: int, run: RunPage) -> str:
    parts = [f"<h2 id='run-{index}'>{text(run.title)}</h2>"]
    parts.append(f"<p class='verdict {text(run.verdict)}'>{text(run.verdict)}</p>")
    if run.numbers:
        parts.append(f"<p>{text(run.numbers)}</p>")
    if run.note:
        parts.append(f"<p>{text(run.note)}</p>")
    for h in run.hypotheses:
        parts.append(f"<h3>{text(h.summary)}</h3><p>{text(h.explanation)}</p>")
        if h.chain:
            parts.append(f"<pre>{text(chr(10).join(h.chain))}</pre>")
    for name, payload in run.pictures:
        kind = "image/svg+xml" if name.endswith(".svg") else "image/png"
        data = base64.b64encode(payload).decode("ascii")
        parts.append(f"<figure><img alt='{text(name)}' src='data:{kind};base64,{data}'><figcaption>{text(name)}"
                     "</figcaption></figure>")  # fmt: skip
    if run.mermaid and run.verdict != "healthy":
        parts.append("<h3>Causal graph</h3>" + drawing(run.mermaid))
        parts.append(f"<details><summary>Mermaid source</summary><pre>{text(run.mermaid)}</pre></details>")
    return "".join(parts)


def run_page(source: object, title: str, pictures: bool = True) -> RunPage:
    """The page of a finished run (a debugger or a loaded trace): its hypotheses, graph and, with matplotlib and
    ``pictures``, its pictures drawn in memory (SVG)."""
    from . import pictures as drawings

    hypotheses = list(source.hypotheses())  # type: ignore[attr-defined]
    found = [
        Hypothesis(
            h.summary(),
            h.explanation,
            [("root " if i == 0 else "  -> ") + str(e) for i, e in enumerate(h.chain)],
        )
        for h in hypotheses
    ]
    steps = int(getattr(source, "steps", 0) or 0)
    result = RunPage(title, "unhealthy" if hypotheses else "healthy", found, source.export_mermaid_causal_graph())  # type: ignore[attr-defined]
    result.numbers = f"{steps} steps observed"
    if pictures and drawings.available():
        marks = drawings.marks_of(source)
        for name, data in drawings.pictures_data(source, marks).items():
            result.pictures.append((f"{name}.svg", drawings.render(name, data, marks, "svg")))
    elif pictures:
        result.note = f"Pictures need matplotlib: {drawings.INSTALL_HINT}"
    return result


_NODE = re.compile(r'^\s*(n\d+)\["(.*)"\]\s*$')
_EDGE = re.compile(r'^\s*(n\d+) -->(?:\|"(.*)"\|)? (n\d+)\s*$')
_CLASS = re.compile(r"^\s*class ([n\d,]+) (\w+)\s*$")
_ENTITIES = (("#quot;", '"'), ("#lt;", "<"), ("#gt;", ">"), ("#96;", "`"), ("#37;", "%"), ("#35;", "#"))


def _label(raw: str) -> str:
    """A label of NeuralDBG's Mermaid as plain text ('#' last: it begins every entity)."""
    for entity, char in _ENTITIES:
        raw = raw.replace(entity, char)
    return raw.replace("<br>", "\n")


def drawing(mermaid: str) -> str:
    """The causal graph of a NeuralDBG Mermaid flowchart drawn in HTML: each cause a box, its effects nested under
    it with the relation that links them. Reads only the lines NeuralDBG writes (ids ``n0…nN``, quoted labels)."""
    labels: dict[str, str] = {}
    css: dict[str, str] = {}
    children: dict[str, list[tuple[str, str]]] = {}
    has_parent: set[str] = set()
    for line in mermaid.splitlines():
        if found := _NODE.match(line):
            labels[found.group(1)] = _label(found.group(2))
        elif found := _EDGE.match(line):
            cause, relation, effect = found.group(1), _label(found.group(2) or ""), found.group(3)
            children.setdefault(cause, []).append((relation, effect))
            has_parent.add(effect)
        elif found := _CLASS.match(line):
            for node in found.group(1).split(","):
                css[node] = "healthy-node" if found.group(2) == "healthy" else found.group(2)
    seen: set[str] = set()

    def item(node: str, relation: str) -> str:
        if node in seen:
            return ""
        seen.add(node)
        rel = f"<span class='relation'>{text(relation)} →</span>" if relation else ""
        box = f"<span class='node {text(css.get(node, 'evidence'))}'>{text(labels.get(node, node))}</span>"
        nested = "".join(item(child, rel_) for rel_, child in children.get(node, []))
        return f"<li>{rel}{box}{f'<ul>{nested}</ul>' if nested else ''}</li>"

    tops = [node for node in labels if node not in has_parent]
    return f"<div class='graph'><ul>{''.join(item(node, '') for node in tops)}</ul></div>"
