"""Pictures of a run, as files: the gradient flow over layers and steps, the loss curve, the update ratio per layer.

One holistic view instead of a chart per layer: a heat map of each layer's gradient norm (log10; steps on x, layers
in forward order on y, the root cause's layer and onset marked), the same for the update ratio (``||dW|| / ||W||``),
and the loss when the run recorded it. Each is written as PNG and SVG, drawn from the run's history
(``dbg.history``: the series the engine recorded, see :mod:`neuraldbg.analysis.analyzer`).

matplotlib is an optional dependency (``pip install "pytest-neuraldbg[plots]"``): it is imported only when a picture
is drawn, through its object-oriented API and the Agg canvas (no pyplot, no global backend switched). The output is
reproducible: fixed size and dpi, no dates or software versions in the files, SVG ids salted with a fixed string.
Each file carries the data it shows, as JSON, in its description (PNG ``tEXt``, SVG ``<dc:description>``), so what a
picture shows can be checked against the trace it came from.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..text import cut, evenly, json_number
from .files import write_atomic
from .inert import inert

#: How to get pictures, for messages where they are missing.
INSTALL_HINT = 'pip install "pytest-neuraldbg[plots]"'
FORMATS = ("png", "svg")
#: The pictures of a run, by file-name part: what each shows.
PICTURES = {
    "gradient-flow": "Gradient norm per layer over training (log10)",
    "loss": "Loss over training",
    "update-ratio": "Update ratio ||dW|| / ||W|| per layer over training (log10)",
}
MAX_ROWS = 48  # layers drawn in a heat map (evenly chosen, the root's layer always among them)
MAX_COLUMNS = 200  # steps drawn in a heat map (evenly chosen, the first and last among them)
SIZE = (8.0, 4.8)  # inches
DPI = 100
SALT = "neuraldbg"


def available() -> bool:
    """Whether pictures can be drawn here (matplotlib is installed)."""
    return importlib.util.find_spec("matplotlib") is not None


@dataclass
class Marks:
    """What a picture marks: the root cause's layer and the step its failure began (None when healthy)."""

    layer: str | None = None
    step: int | None = None
    title: str = ""


@dataclass
class Grid:
    """A metric per layer and step: ``values[row][column]`` for ``layers[row]`` at ``steps[column]``, None where the
    run recorded nothing."""

    metric: str
    layers: list[str]
    steps: list[int]
    values: list[list[float | None]] = field(default_factory=list)
    feeds: str | None = None  # the drawn layer nearest before a root that has no row (a ReLU has no gradient norm)
    last_step: int | None = None  # the run's last step, when it is past the last recorded one

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "layers": self.layers,
            "steps": self.steps,
            "values": [[None if v is None else json_number(v) for v in row] for row in self.values],
        }


def marks_of(source: Any) -> Marks:
    """The root and onset of a run's first hypothesis (a debugger, a trace, anything with ``hypotheses()``)."""
    hypotheses = list(source.hypotheses())
    if not hypotheses:
        return Marks(title="healthy")
    root = hypotheses[0].root
    return Marks(root.layer or None, int(root.step_start), inert(hypotheses[0].summary()))


def grid(source: Any, metric: str, root: str | None = None) -> Grid | None:
    """The ``metric`` series of every layer that recorded it, in forward order, at the recorded steps (at most
    :data:`MAX_COLUMNS`, evenly chosen) and for at most :data:`MAX_ROWS` layers (evenly chosen, ``root`` kept)."""
    history = source.history
    recorded = [layer for layer in history.layers(metric) if layer]
    if not recorded:
        return None
    order = [layer for layer in source.layers if layer in recorded]
    order += [layer for layer in recorded if layer not in order]
    if len(order) > MAX_ROWS:
        kept = evenly(order, MAX_ROWS)
        if root in order and root not in kept:
            kept = sorted([*kept[1:-1], order[0], order[-1], root], key=order.index)[: MAX_ROWS + 1]
        order = list(dict.fromkeys(kept))
    series = {layer: dict(history.get(metric, layer).points()) for layer in order}
    steps = evenly(sorted({int(step) for points in series.values() for step in points}), MAX_COLUMNS)
    values = [[_float(series[layer].get(step)) for step in steps] for layer in order]
    last = int(getattr(source, "steps", 0) or 0) - 1
    return Grid(metric, order, steps, values, _feeding(root, list(source.layers), order), last)


def _feeding(root: str | None, forward: list[str], drawn: list[str]) -> str | None:
    """The drawn layer nearest before ``root`` in forward order (after it when none is before), for a root without a
    row of its own."""
    if not root or root in drawn or root not in forward:
        return None
    index = forward.index(root)
    before = [layer for layer in forward[:index] if layer in drawn]
    after = [layer for layer in forward[index + 1 :] if layer in drawn]
    return before[-1] if before else (after[0] if after else None)


def loss_points(source: Any) -> list[tuple[int, float]]:
    series = source.history.get("loss", "")
    return [(int(s), float(v)) for s, v in series.points()] if series is not None else []


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def draw(source: Any, folder: str | Path, stem: str, *, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Draw the run's pictures into ``folder`` as ``<stem>.<picture>.<format>``; returns the files written (none for a
    picture the run has no data for). Raises ImportError without matplotlib (see :func:`available`)."""
    marks = marks_of(source)
    written: list[Path] = []
    for name, data in pictures_data(source, marks).items():
        for fmt, payload in render_formats(name, data, marks, formats).items():
            written.append(write_atomic(Path(folder) / f"{stem}.{name}.{fmt}", payload))
    return written


def pictures_data(source: Any, marks: Marks) -> dict[str, Any]:
    """The data of each picture the run can have: a :class:`Grid` for the heat maps, points for the loss."""
    found: dict[str, Any] = {}
    gradients = grid(source, "grad_norm", marks.layer)
    if gradients is not None:
        found["gradient-flow"] = gradients
    loss = loss_points(source)
    if len(loss) >= 2:
        found["loss"] = loss
    ratios = grid(source, "update_ratio", marks.layer)
    if ratios is not None:
        found["update-ratio"] = ratios
    return found


def render(name: str, data: Any, marks: Marks, fmt: str) -> bytes:
    """One picture as PNG or SVG bytes, deterministic, with its data as JSON in the file's description."""
    return render_formats(name, data, marks, (fmt,))[fmt]


def render_formats(name: str, data: Any, marks: Marks, formats: Sequence[str]) -> dict[str, bytes]:
    """One picture in each of ``formats``, from one figure: it is built and laid out once (constrained layout
    measures every label in a draw of its own), then each format is printed by its canvas straight from that
    layout, one draw each (``savefig`` would lay the figure out again before every format)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    embedded = {"picture": name, **(data.as_json() if isinstance(data, Grid) else {"loss": _points_json(data)})}
    embedded.update({"root": marks.layer, "onset": marks.step})
    description = json.dumps(embedded, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    style = {"svg.hashsalt": SALT, "svg.fonttype": "path", "font.size": 9, "path.simplify": False}
    drawn: dict[str, bytes] = {}
    with matplotlib.rc_context(cast(Any, style)), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a glyph a layer name uses and no font has: drawn as a box, not a warning
        figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        if isinstance(data, Grid):
            _heat_map(figure, axes, name, data, marks)
        else:
            _loss_curve(axes, data, marks)
        figure.draw_without_rendering()  # the layout, once
        figure.set_layout_engine("none")
        for fmt in formats:
            out = io.BytesIO()
            if fmt == "png":
                png: Any = FigureCanvasAgg(figure)  # matplotlib's printers are untyped
                png.print_png(out, metadata={"Software": None, "Description": description})
            elif fmt == "svg":
                svg: Any = FigureCanvasSVG(figure)
                svg.print_svg(out, metadata={"Date": None, "Creator": None, "Description": description})
            else:
                raise ValueError(f"picture format {fmt!r}: expected one of {', '.join(FORMATS)}")
            drawn[fmt] = out.getvalue()
    return drawn


def _points_json(points: Sequence[tuple[int, float]]) -> list[list[Any]]:
    return [[int(s), json_number(v)] for s, v in points]


def _heat_map(figure: Any, axes: Any, name: str, data: Grid, marks: Marks) -> None:
    import numpy as np
    from matplotlib import colormaps

    logs = [math.log10(v) for row in data.values for v in row if v is not None and math.isfinite(v) and v > 0]
    low = math.floor(min(logs)) if logs else 0.0
    high = math.ceil(max(logs)) if logs else 1.0
    high = max(high, low + 1)
    table = np.full((len(data.layers), len(data.steps)), np.nan)
    for i, row in enumerate(data.values):
        for j, v in enumerate(row):
            if v is None:
                continue
            if not math.isfinite(v):
                table[i, j] = high + 1  # drawn in the "over" colour
            elif v <= 0:
                table[i, j] = low - 1  # drawn in the "under" colour
            else:
                table[i, j] = math.log10(v)
    cmap = colormaps["viridis"].copy()
    cmap.set_under("#000000")
    cmap.set_over("#d62728")
    cmap.set_bad("#ffffff")
    # each column spans half-way to its neighbours: a true step axis, however unevenly the steps were recorded
    steps = data.steps
    middles = [(a + b) / 2 for a, b in itertools.pairwise(steps)]
    x_edges = [steps[0] - 0.5, *middles, steps[-1] + 0.5]
    y_edges = [i - 0.5 for i in range(len(data.layers) + 1)]
    image = axes.pcolormesh(x_edges, y_edges, np.ma.masked_invalid(table), cmap=cmap, vmin=low, vmax=high)
    axes.set_ylim(len(data.layers) - 0.5, -0.5)  # the first layer on top
    if data.last_step is not None and data.last_step > steps[-1]:  # the whole run, also where nothing was recorded
        axes.set_xlim(steps[0] - 0.5, data.last_step + 0.5)
        middle = ((steps[-1] + data.last_step) / 2 + 0.5, (len(data.layers) - 1) / 2)
        axes.text(*middle, f"not recorded\nafter step {steps[-1]}", ha="center", va="center", fontsize=8, color="#555")
    bar = figure.colorbar(image, ax=axes, extend="both")
    what = "gradient norm" if data.metric == "grad_norm" else "update ratio"
    bar.set_label(f"log10 {what} (black: zero, red: non-finite)")
    axes.set_yticks(range(len(data.layers)))
    axes.set_yticklabels([cut(inert(layer), 24) for layer in data.layers], fontsize=7 if len(data.layers) > 20 else 8)
    axes.set_xlabel("step")
    axes.set_ylabel("layer (forward order)")
    axes.set_title(f"{PICTURES[name]}\n{cut(marks.title, 90)}", fontsize=9)
    shown = marks.layer if marks.layer in data.layers else data.feeds
    if shown is not None and shown in data.layers:
        at = data.layers.index(shown)
        tick = axes.get_yticklabels()[at]
        tick.set_color("#d62728")
        tick.set_fontweight("bold")
        note = "root" if shown == marks.layer else f"feeds root '{cut(inert(marks.layer or ''), 16)}'"
        axes.annotate(note, xy=(1.0, at), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                      va="center", color="#d62728", fontsize=8, annotation_clip=False)  # fmt: skip
    if marks.step is not None and data.steps[0] <= marks.step <= data.steps[-1]:
        axes.axvline(marks.step - 0.5, color="#d62728", linestyle="--", linewidth=1.2)
        axes.annotate(f"onset: step {marks.step}", xy=(marks.step - 0.5, len(data.layers) - 0.5), xytext=(3, 3),
                      textcoords="offset points", color="#d62728", fontsize=8, annotation_clip=False)  # fmt: skip


def _loss_curve(axes: Any, points: Sequence[tuple[int, float]], marks: Marks) -> None:
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    axes.plot([s for s, _ in finite], [v for _, v in finite], color="#1f77b4", linewidth=1.4, marker=".")
    bad = [s for s, v in points if not math.isfinite(v)]
    if bad:
        axes.scatter(bad, [max((v for _, v in finite), default=1.0)] * len(bad), color="#d62728", marker="x",
                     label="non-finite loss")  # fmt: skip
        axes.legend(loc="best", fontsize=8)
    if finite and all(v > 0 for _, v in finite) and max(v for _, v in finite) / min(v for _, v in finite) > 100:
        axes.set_yscale("log")
    if marks.step is not None:
        axes.axvline(marks.step, color="#d62728", linestyle="--", linewidth=1.2, label="onset")
        axes.annotate(f"onset: step {marks.step}", xy=(marks.step, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(3, -12), textcoords="offset points", color="#d62728", fontsize=8)  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(f"{PICTURES['loss']}\n{cut(marks.title, 90)}", fontsize=9)
    axes.grid(True, alpha=0.3)


def embedded(payload: bytes) -> dict[str, Any]:
    """The data a picture file carries (see :func:`render`): from a PNG's ``Description`` text chunk or an SVG's
    ``<dc:description>``."""
    if payload.startswith(b"\x89PNG\r\n\x1a\n"):
        at = 8
        while at < len(payload):
            length = int.from_bytes(payload[at : at + 4], "big")
            kind = payload[at + 4 : at + 8]
            body = payload[at + 8 : at + 8 + length]
            if kind == b"tEXt" and body.startswith(b"Description\x00"):
                found: dict[str, Any] = json.loads(body.split(b"\x00", 1)[1].decode("latin-1"))
                return found
            at += 12 + length
        raise ValueError("no Description text chunk in this PNG")
    import html
    import re

    # read as text, not parsed as XML: a picture may come from anywhere, and this needs one element's text
    match = re.search(rb"<dc:description>([^<]*)</dc:description>", payload)
    if match is None:
        raise ValueError("no dc:description in this SVG")
    result: dict[str, Any] = json.loads(html.unescape(match.group(1).decode("utf-8")))
    return result
