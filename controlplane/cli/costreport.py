"""`gpufleet cost`'s output from `GET /costs`'s answer: tables for the terminal, and one
self-contained HTML page (no script, no external asset) with inline SVG charts. Pure: the
report in, text out.

The page follows the load-test report's manner (`workloadplane/loadtest/report.py`: one
page, a short stylesheet, `<figure>` + `<svg role="img">` charts); its line chart cannot be
imported here (the control plane never imports the workload plane), and cost per day by
group is a stacked bar chart, which it has not.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

COLOURS = ("#1f6feb", "#9a6700", "#1a7f37", "#cf222e", "#8250df", "#bf3989", "#0a3069", "#57606a")


def dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _table(*headers: str) -> Table:
    out = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for h in headers:
        out.add_column(
            h, justify="left" if h in ("NAME", "POOL", "DEPLOYMENT", "LINE") else "right"
        )
    return out


def groups_table(report: Mapping[str, Any]) -> Table:
    by = str(report["group_by"]).upper().replace("_", " ")
    out = _table(by, "COST", "SHARE", "GPU-H HELD", "GPU-H USED", "GPU-H IDLE")
    out.columns[0].justify = "left"
    for g in [*report["groups"], report["total"]]:
        out.add_row(*group_row(g))
    return out


def group_row(g: Mapping[str, Any]) -> list[str]:
    """A group's cost, share and GPU-hours held, used and idle."""
    return [
        g["name"],
        dollars(g["cost"]),
        f"{g['share']:.0%}",
        hours(g["held_gpu_hours"]),
        hours(g["used_gpu_hours"]),
        hours(g["idle_gpu_hours"]),
    ]


def reservations_table(report: Mapping[str, Any]) -> Table:
    out = _table(
        "POOL", "GPUS", "TERM END", "WARN", "BURNED/TERM GPU-H", "PAID", "USED", "IDLE", "IDLE $"
    )
    for r in report["reservations"]:
        warn = r["expiry_warning_days"]
        out.add_row(
            r["pool"],
            str(r["committed_gpus"]),
            (r["term_end"] or "-")[:10],
            "-" if warn is None else ("ended" if warn == 0 else f"<{warn}d"),
            f"{hours(r['burned_gpu_hours'])}/{hours(r['term_gpu_hours'])}",
            hours(r["paid_gpu_hours"]),
            hours(r["used_gpu_hours"]),
            "-" if r["idle_fraction"] is None else f"{r['idle_fraction']:.0%}",
            dollars(r["idle_cost"]),
        )
    return out


REBALANCE_HEADERS = (
    "NOW $/H",
    "AFRESH $/H",
    "SAVING $/H",
    "IDLE RESERVED GPUS",
    "MOVED",
    "UNPLACED",
)


def rebalance_row(report: Mapping[str, Any]) -> list[str]:
    """The placement now against one made afresh: on-demand and spot $/hour (reserved GPUs
    are paid used or not), idle reserved GPUs, replicas moved, replicas left unplaced."""
    r = report["rebalance"]
    return [
        dollars(r["on_demand_and_spot_per_hour_now"]),
        dollars(r["on_demand_and_spot_per_hour_fresh"]),
        dollars(r["saving_per_hour"]),
        f"{r['reserved_idle_gpus_now']} -> {r['reserved_idle_gpus_fresh']}",
        str(r["moved_replicas"]),
        f"{r['unplaced_replicas_now']} -> {r['unplaced_replicas_fresh']}",
    ]


def rebalance_table(report: Mapping[str, Any]) -> Table:
    out = _table(*REBALANCE_HEADERS)
    out.add_row(*rebalance_row(report))
    return out


def tokens_table(report: Mapping[str, Any]) -> Table:
    out = _table(
        "DEPLOYMENT",
        "TOKENS IN",
        "TOKENS OUT",
        "COST",
        "$/MTOK",
        "API PRICE",
        "API COST",
        "BREAK-EVEN TOKENS",
    )
    for t in report["tokens"]:
        mtok = "-" if t["dollars_per_mtok"] is None else f"${t['dollars_per_mtok']:,.4f}"
        first = [
            t["deployment"],
            f"{t['input_tokens']:,}",
            f"{t['output_tokens']:,}",
            dollars(t["cost"]),
            mtok,
        ]
        if not t["api_prices"]:
            out.add_row(*first, "-", "-", "-")
        for i, p in enumerate(t["api_prices"]):
            even = p["break_even_tokens"]
            out.add_row(
                *(first if i == 0 else [""] * len(first)),
                p["name"],
                dollars(p["api_cost"]),
                "-" if even is None else f"{even:,}",
            )
    return out


def tco_table(report: Mapping[str, Any]) -> Table:
    out = _table("LINE", "COST", "NOTE")
    out.columns[2].justify = "left"
    tco = report["tco"]
    for kind, cost in tco["gpu"].items():
        out.add_row(f"gpu {kind}", dollars(cost), "from the cost ledger")
    for line in tco["lines"]:
        out.add_row(line["name"].replace("_", " "), dollars(line["cost"]), line["note"])
    out.add_row("total", dollars(tco["total"]), "")
    return out


def tables(report: Mapping[str, Any]) -> list[tuple[str, Table]]:
    """(title, table) for each part of the report that has rows."""
    out = [(f"Cost by {report['group_by'].replace('_', ' ')}", groups_table(report))]
    if report["reservations"]:
        out.append(("Reservations", reservations_table(report)))
        out.append(("Moving work onto idle reservations (placed afresh)", rebalance_table(report)))
    if report["tokens"]:
        out.append(("$/Mtok and public API prices", tokens_table(report)))
    out.append(("TCO", tco_table(report)))
    return out


# --- HTML -----------------------------------------------------------------------------------


def bar_chart(title: str, days: Sequence[Mapping[str, Any]], unit: str = "$") -> str:
    """Cost per day, stacked by group, as one inline SVG figure."""
    width, height, pad = 640, 200, 56
    names = sorted({n for d in days for n in d["costs"]})
    top = max([sum(d["costs"].values()) for d in days] + [1e-9]) * 1.1
    span = (width - pad - 8) / max(1, len(days))
    bar = max(1.0, span * 0.7)
    plot = height - 40
    rects = []
    for i, d in enumerate(days):
        y = 10 + plot
        for j, name in enumerate(names):
            value = d["costs"].get(name, 0.0)
            h = plot * value / top
            y -= h
            rects.append(
                f'<rect x="{pad + i * span:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[j % len(COLOURS)]}"><title>{html.escape(d["day"])} '
                f"{html.escape(name)}: {unit}{value:,.2f}</title></rect>"
            )
    legend = " ".join(
        f'<tspan fill="{COLOURS[j % len(COLOURS)]}">■ {html.escape(n)}</tspan>'
        for j, n in enumerate(names)
    )
    first, last = (days[0]["day"], days[-1]["day"]) if days else ("", "")
    return (
        f"<figure><figcaption>{html.escape(title)}</figcaption>"
        f'<svg role="img" aria-label="{html.escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
        f'<line x1="{pad}" y1="{10 + plot}" x2="{width - 8}" y2="{10 + plot}" stroke="#888"/>'
        f'<line x1="{pad}" y1="10" x2="{pad}" y2="{10 + plot}" stroke="#888"/>'
        f'<text x="2" y="16" font-size="11">{unit}{top:,.0f}</text>'
        f'<text x="{pad}" y="{height - 14}" font-size="11">{html.escape(first)}</text>'
        f'<text x="{width - 80}" y="{height - 14}" font-size="11">{html.escape(last)}</text>'
        + "".join(rects)
        + f'<text x="{pad + 8}" y="{height - 2}" font-size="12">{legend}</text></svg></figure>'
    )


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: Mapping[str, Any], title: str) -> str:
    """One self-contained page: the groups, a stacked chart of cost per day, reservations,
    $/Mtok against API prices, and the TCO lines."""
    parts = [
        "<!doctype html><html lang=en><meta charset=utf-8>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:900px}"
        "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;"
        "border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}"
        "figure{margin:1.5em 0}</style>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(report['from'])} – {html.escape(report['to'])}: "
        f"<strong>{dollars(report['total']['cost'])}</strong> for "
        f"{hours(report['total']['held_gpu_hours'])} GPU-hours held, "
        f"{hours(report['total']['used_gpu_hours'])} used.</p>",
        bar_chart(f"Cost per day by {report['group_by'].replace('_', ' ')}", report["daily"]),
        _html_table(
            [report["group_by"], "cost", "share", "GPU-h held", "GPU-h used", "GPU-h idle"],
            [group_row(g) for g in [*report["groups"], report["total"]]],
        ),
    ]
    if report["reservations"]:
        parts.append("<h2>Reservations</h2>")
        parts.append(
            _html_table(
                ["pool", "GPUs", "term end", "burned / term GPU-h", "idle", "idle $"],
                [
                    [
                        r["pool"],
                        str(r["committed_gpus"]),
                        (r["term_end"] or "-")[:10],
                        f"{hours(r['burned_gpu_hours'])} / {hours(r['term_gpu_hours'])}",
                        "-" if r["idle_fraction"] is None else f"{r['idle_fraction']:.0%}",
                        dollars(r["idle_cost"]),
                    ]
                    for r in report["reservations"]
                ],
            )
        )
        parts.append("<h2>Moving work onto idle reservations (placed afresh)</h2>")
        parts.append(_html_table([h.lower() for h in REBALANCE_HEADERS], [rebalance_row(report)]))
    if report["tokens"]:
        parts.append("<h2>$/Mtok and public API prices</h2>")
        rows = []
        for t in report["tokens"]:
            mtok = "-" if t["dollars_per_mtok"] is None else f"${t['dollars_per_mtok']:,.4f}"
            for p in t["api_prices"] or [None]:
                rows.append(
                    [
                        t["deployment"],
                        f"{t['input_tokens'] + t['output_tokens']:,}",
                        mtok,
                        p["name"] if p else "-",
                        dollars(p["api_cost"]) if p else "-",
                        f"{p['break_even_tokens']:,}" if p and p["break_even_tokens"] else "-",
                    ]
                )
        parts.append(
            _html_table(
                ["deployment", "tokens", "$/Mtok", "API price", "API cost", "break-even tokens"],
                rows,
            )
        )
    tco = report["tco"]
    lines = [[f"gpu {k}", dollars(v), "cost ledger"] for k, v in tco["gpu"].items()]
    lines += [[x["name"].replace("_", " "), dollars(x["cost"]), x["note"]] for x in tco["lines"]]
    lines.append(["total", dollars(tco["total"]), ""])
    parts.append("<h2>TCO</h2>" + _html_table(["line", "cost", "note"], lines))
    return "".join(parts) + "</html>\n"
