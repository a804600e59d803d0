"""What every page of `lerobot.reports` shares: escaping, inline JSON, the page shell with its style sheet and
the plotting script, number formatting and small table/bar helpers.

Pages are self-contained: no network, no CDN; the style and the scripts are inline (`lerobot.reports.plots_js`
draws the SVG charts), data travels as inline JSON (`json_script`), and files beside the page (videos, other
pages) are linked by relative paths, so a page opens from disk and from a copied folder alike.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lerobot.reports.plots_js import PLOTS_JS
from lerobot.runtime.files import atomic_write

STYLE = """
:root { --fg: #1d2330; --muted: #667085; --line: #d9dee7; --bg: #ffffff; --panel: #f6f8fb;
  --ok: #1a7f37; --fail: #c0392b; --accent: #2f6fde; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  background: var(--bg); margin: 0; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
a { color: var(--accent); text-decoration: none; } a:hover { text-decoration: underline; }
.muted { color: var(--muted); } .ok { color: var(--ok); } .fail { color: var(--fail); }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px;
  overflow: auto; max-height: 480px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left;
  vertical-align: middle; white-space: nowrap; }
th { font-weight: 600; position: sticky; top: 0; background: var(--bg); }
th.sortable { cursor: pointer; } th.sortable:hover { color: var(--accent); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 10px 0; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
  min-width: 170px; }
.card .label { color: var(--muted); font-size: 12px; } .card .value { font-size: 22px; font-weight: 600; }
.card .ci { color: var(--muted); font-size: 12px; }
.bar { position: relative; width: 220px; height: 14px; background: var(--panel);
  border: 1px solid var(--line); border-radius: 3px; }
.bar .fill { position: absolute; left: 0; top: 0; bottom: 0; background: #8fb3f0; }
.bar .whisker { position: absolute; top: 6px; height: 2px; background: var(--fg); }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
.chart { background: var(--bg); border: 1px solid var(--line); border-radius: 8px; padding: 6px 8px; }
.chart .title { font-weight: 600; font-size: 13px; }
.chart svg { width: 100%; height: auto; display: block; }
.chart .legend { font-size: 12px; display: flex; flex-wrap: wrap; gap: 2px 10px; }
.chart .legend span { cursor: pointer; user-select: none; } .chart .legend span.off { opacity: 0.35; }
.chart .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
.chart .readout { font-size: 11.5px; color: var(--muted); min-height: 16px; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
svg text { font: 11px system-ui, sans-serif; fill: var(--muted); }
svg .grid { stroke: #eef1f5; } svg .axis { stroke: #b8c0cc; }
svg .series { fill: none; stroke-width: 1.6; } svg .band { stroke: none; opacity: 0.15; }
svg .cursor { stroke: #e8590c; stroke-width: 1.2; }
.videos { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; } figure video { display: block; background: #000; image-rendering: pixelated; }
figcaption { font-size: 12px; margin-top: 3px; }
figure.ok figcaption::before { content: "\\2714  "; color: var(--ok); }
figure.fail figcaption::before { content: "\\2718  "; color: var(--fail); }
details summary { cursor: pointer; color: var(--accent); }
"""


def esc(value: Any) -> str:
    """`value` as text safe inside HTML elements and double-quoted attributes."""
    return html.escape(str(value), quote=True)


def _plain(value: Any) -> Any:
    """JSON-ready: non-finite floats become None (JSON has no NaN), numpy scalars plain numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _plain(value.item())
    return value


def to_json(data: Any) -> str:
    """Compact JSON of `data` for a `<script>` element: NaN/inf as null, and `</` and `<!--` escaped so that
    no string in the data can close the element."""
    text = json.dumps(_plain(data), separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def json_script(element_id: str, data: Any) -> str:
    """A `<script type="application/json">` element holding `data`; read it with `LR.data(id)`."""
    return f'<script type="application/json" id="{esc(element_id)}">{to_json(data)}</script>'


def page(title: str, body: str, script: str = "", head: str = "") -> str:
    """A whole HTML document: the shared style and plotting script, `body`, then the page's own `script`."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style>{head}</head>\n<body>\n{body}\n"
        f"<script>{PLOTS_JS}</script>\n<script>{script}</script>\n</body></html>\n"
    )


def write_page(path: Path, text: str) -> Path:
    """Write a page atomically (a reader never sees half of it); return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path


def rel(target: Path, start: Path) -> str:
    """`target` as a relative URL from the directory `start` (forward slashes, each part escaped)."""
    relative = os.path.relpath(Path(target).resolve(), Path(start).resolve())
    return "/".join(esc(part) for part in Path(relative).parts)


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table: `digits` decimals for floats, none for integers, `-` for missing or NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return esc(value)


def interval(low: Any, high: Any, digits: int = 3) -> str:
    """`[low, high]` for a 95% interval, empty when either bound is missing."""
    if low is None or high is None or any(isinstance(v, float) and not math.isfinite(v) for v in (low, high)):
        return ""
    return f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def card(label: str, value: str, note: str = "") -> str:
    """One figure as a card: a label, the value, an optional note (e.g. its interval)."""
    note_html = f'<div class="ci">{note}</div>' if note else ""
    return f'<div class="card"><div class="label">{esc(label)}</div><div class="value">{value}</div>{note_html}</div>'


def percent_bar(value: float, low: float | None = None, high: float | None = None) -> str:
    """A horizontal bar of `value` percent (0-100) with the interval [low, high] as a whisker."""

    def clip(v: float) -> float:
        return min(max(float(v), 0.0), 100.0)

    whisker = ""
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        whisker = (
            f'<div class="whisker" style="left:{clip(low):.2f}%;width:{clip(high) - clip(low):.2f}%"></div>'
        )
    return f'<div class="bar"><div class="fill" style="width:{clip(value):.2f}%"></div>{whisker}</div>'


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool] = (), table_id: str = ""
) -> str:
    """An HTML table; cells are HTML already (escape text with `esc`). `numeric[i]` right-aligns column i.
    A table with an id sorts by a click on a column header (`LR.sortable`)."""
    num = list(numeric) + [False] * (len(headers) - len(numeric))
    heads = "".join(
        f'<th class="{"num " if n else ""}{"sortable" if table_id else ""}">{esc(h)}</th>'
        for h, n in zip(headers, num)
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if n else f"<td>{c}</td>" for c, n in zip(row, num))
        + "</tr>"
        for row in rows
    )
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>"


def chart_div(chart_id: str, title: str) -> str:
    """The container a chart is drawn into (`LR.chart(document.getElementById(chart_id), ...)`)."""
    return f'<div class="chart" id="{esc(chart_id)}"><div class="title">{esc(title)}</div></div>'
