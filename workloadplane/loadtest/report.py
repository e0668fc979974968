"""What a load test saw, summarised: percentiles, errors by code, a per-second series, and
the same as a self-contained HTML page with SVG charts. Pure: outcomes in, text out.

Latency figures are over the normal requests that succeeded (an abnormal request's quick
400 would flatter them). TTFT is the first content chunk of a streamed answer, over the
streamed requests (a plain answer's "first token" is its whole answer: only when nothing
streamed is TTFT over plain answers, and then equal to end-to-end). Output tokens are the answers' ``usage.completion_tokens`` (a
stream without usage: its content chunks). A run *passes* when every normal request
succeeded and every abnormal one got a 4xx (a client that went away: anything but a 5xx
before it left).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Outcome:
    start: float
    """Seconds from the start of the run when it was sent."""
    kind: str
    """``normal``, an abnormal kind (``profiles.ABNORMAL``), or ``not_sent`` (the load
    generator's own in-flight bound was reached: counted, never hidden)."""
    stream: bool
    status: int
    """HTTP status; 0: no answer (refused, reset, timed out)."""
    ok: bool
    ttft: float
    """Seconds to the first token (``inf``: none came)."""
    e2e: float
    tokens: int = 0
    error: str = ""
    """Why it failed: ``connection refused``, ``timed out``, ``error event``, ``stream cut``…"""

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["ttft"] = None if math.isinf(self.ttft) else round(self.ttft, 6)
        out["e2e"] = round(self.e2e, 6)
        out["start"] = round(self.start, 6)
        return out


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``nan`` when there is nothing)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def code_of(o: Outcome) -> str:
    """How an outcome is counted in "by code": the status, with what went wrong."""
    if o.kind == "not_sent":
        return "not sent (in-flight bound)"
    if o.status == 0:
        return o.error or "no answer"
    return f"{o.status} {o.error}".strip()


@dataclass(frozen=True)
class Summary:
    sent: int
    duration_s: float
    ok: int
    normal: int
    normal_failed: int
    abnormal: int
    abnormal_wrong: int
    """Abnormal requests answered with a 5xx or not at all (a server that broke on them)."""
    by_code: dict[str, int]
    ttft_ms: dict[str, float]
    e2e_ms: dict[str, float]
    tokens: int
    tokens_per_s: float
    achieved_rate: float

    @property
    def passed(self) -> bool:
        return self.normal_failed == 0 and self.abnormal_wrong == 0


PERCENTILES = (50, 90, 99)


def summarise(outcomes: Sequence[Outcome], duration_s: float) -> Summary:
    normal = [o for o in outcomes if o.kind == "normal"]
    good = [o for o in normal if o.ok]
    abnormal = [o for o in outcomes if o.kind not in ("normal", "not_sent")]
    wrong = [
        o for o in abnormal if o.status >= 500 or (o.status == 0 and o.kind != "client_goes_away")
    ]
    by_code: dict[str, int] = {}
    for o in outcomes:
        key = code_of(o)
        by_code[key] = by_code.get(key, 0) + 1
    streamed = [o for o in good if o.stream] or good  # TTFT means something for streams
    ttfts = [o.ttft for o in streamed if not math.isinf(o.ttft)]
    tokens = sum(o.tokens for o in good)
    end = max((o.start + o.e2e for o in outcomes), default=duration_s)
    span = max(end, duration_s, 1e-9)
    return Summary(
        sent=sum(1 for o in outcomes if o.kind != "not_sent"),
        duration_s=duration_s,
        ok=len(good),
        normal=len(normal),
        normal_failed=len(normal) - len(good),
        abnormal=len(abnormal),
        abnormal_wrong=len(wrong),
        by_code=dict(sorted(by_code.items(), key=lambda kv: (-kv[1], kv[0]))),
        ttft_ms={f"p{p}": percentile(ttfts, p) * 1e3 for p in PERCENTILES},
        e2e_ms={f"p{p}": percentile([o.e2e for o in good], p) * 1e3 for p in PERCENTILES},
        tokens=tokens,
        tokens_per_s=tokens / span,
        achieved_rate=sum(1 for o in outcomes if o.kind != "not_sent") / duration_s,
    )


@dataclass(frozen=True)
class Second:
    """One second of the run, by when requests were sent."""

    t: int
    sent: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float


def per_second(outcomes: Sequence[Outcome], duration_s: float) -> list[Second]:
    seconds = max(1, math.ceil(duration_s))
    buckets: list[list[Outcome]] = [[] for _ in range(seconds)]
    for o in outcomes:
        buckets[min(seconds - 1, max(0, int(o.start)))].append(o)
    out = []
    for t, bucket in enumerate(buckets):
        good = [o for o in bucket if o.ok and o.kind == "normal" and not math.isinf(o.ttft)]
        ttfts = [o.ttft for o in [o for o in good if o.stream] or good]
        failed = sum(1 for o in bucket if o.kind == "normal" and not o.ok)
        out.append(
            Second(t, len(bucket), failed, percentile(ttfts, 50) * 1e3, percentile(ttfts, 99) * 1e3)
        )
    return out


def _ms(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:,.1f}"


def render_text(s: Summary, title: str) -> str:
    lines = [
        title,
        f"sent {s.sent:,} in {s.duration_s:g} s ({s.achieved_rate:,.1f}/s): "
        f"{s.ok:,} of {s.normal:,} normal requests succeeded"
        + (
            f", {s.abnormal:,} abnormal ({s.abnormal_wrong} answered 5xx or not at all)"
            if s.abnormal
            else ""
        ),
        f"{'':<10}{'p50':>10}{'p90':>10}{'p99':>10}",
        f"{'TTFT ms':<10}" + "".join(f"{_ms(s.ttft_ms[f'p{p}']):>10}" for p in PERCENTILES),
        f"{'e2e ms':<10}" + "".join(f"{_ms(s.e2e_ms[f'p{p}']):>10}" for p in PERCENTILES),
        f"output tokens {s.tokens:,} ({s.tokens_per_s:,.1f}/s)",
        "by code: " + ", ".join(f"{n:,} × {code}" for code, n in s.by_code.items()),
        "PASS" if s.passed else "FAIL: " + _why(s),
    ]
    return "\n".join(lines)


def _why(s: Summary) -> str:
    parts = []
    if s.normal_failed:
        parts.append(f"{s.normal_failed} normal request(s) failed")
    if s.abnormal_wrong:
        parts.append(f"{s.abnormal_wrong} abnormal request(s) got a 5xx or no answer")
    return "; ".join(parts)


def _polyline(
    values: Sequence[float], x0: float, width: float, y0: float, height: float, top: float
) -> str:
    """SVG points of a series (nan values skipped) scaled into the box."""
    n = max(1, len(values) - 1)
    points = [
        f"{x0 + width * i / n:.1f},{y0 + height - height * v / top:.1f}"
        for i, v in enumerate(values)
        if not math.isnan(v)
    ]
    return " ".join(points)


def _chart(
    title: str,
    series: dict[str, Sequence[float]],
    unit: str,
    colours: tuple[str, str] = ("#1f6feb", "#9a6700"),
) -> str:
    width, height, pad = 640, 180, 44
    top = max([v for vs in series.values() for v in vs if not math.isnan(v)] + [1e-9]) * 1.1
    lines = [
        f'<polyline fill="none" stroke="{colours[i % 2]}" stroke-width="2" '
        f'points="{_polyline(vs, pad, width - pad - 8, 10, height - 30, top)}"/>'
        for i, vs in enumerate(series.values())
    ]
    legend = " ".join(
        f'<tspan fill="{colours[i % 2]}">■ {html.escape(name)}</tspan>'
        for i, name in enumerate(series)
    )
    return (
        f"<figure><figcaption>{html.escape(title)}</figcaption>"
        f'<svg role="img" aria-label="{html.escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
        f'<line x1="{pad}" y1="{height - 20}" x2="{width - 8}" y2="{height - 20}" stroke="#888"/>'
        f'<line x1="{pad}" y1="10" x2="{pad}" y2="{height - 20}" stroke="#888"/>'
        f'<text x="2" y="16" font-size="11">{top:,.0f} {html.escape(unit)}</text>'
        f'<text x="{pad}" y="{height - 4}" font-size="11">0 s</text>'
        f'<text x="{width - 60}" y="{height - 4}" font-size="11">{len(next(iter(series.values()), []))} s</text>'
        + "".join(lines)
        + f'<text x="{pad + 8}" y="24" font-size="12">{legend}</text></svg></figure>'
    )


def render_html(s: Summary, seconds: Sequence[Second], title: str) -> str:
    """One self-contained page (no script, no external asset): the summary and two charts
    over time (requests sent and failed per second, TTFT p50 and p99 per second)."""
    rows = "".join(
        f"<tr><th>{name}</th>"
        + "".join(f"<td>{_ms(d[f'p{p}'])}</td>" for p in PERCENTILES)
        + "</tr>"
        for name, d in (("TTFT ms", s.ttft_ms), ("end-to-end ms", s.e2e_ms))
    )
    codes = "".join(
        f"<tr><td>{html.escape(c)}</td><td>{n:,}</td></tr>" for c, n in s.by_code.items()
    )
    verdict = "PASS" if s.passed else "FAIL: " + _why(s)
    return (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:720px}"
        "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;"
        "border-bottom:1px solid #ddd}figure{margin:1.5em 0}</style>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p>Sent {s.sent:,} in {s.duration_s:g} s ({s.achieved_rate:,.1f}/s); {s.ok:,} of "
        f"{s.normal:,} normal requests succeeded; output {s.tokens:,} tokens "
        f"({s.tokens_per_s:,.1f}/s). <strong>{html.escape(verdict)}</strong></p>"
        f"<table><tr><th></th><th>p50</th><th>p90</th><th>p99</th></tr>{rows}</table>"
        f"<h2>By code</h2><table>{codes}</table>"
        + _chart(
            "Requests per second",
            {"sent": [x.sent for x in seconds], "failed": [x.failed for x in seconds]},
            "req/s",
            ("#1f6feb", "#cf222e"),
        )
        + _chart(
            "TTFT per second",
            {"p50": [x.ttft_p50_ms for x in seconds], "p99": [x.ttft_p99_ms for x in seconds]},
            "ms",
        )
        + "</html>\n"
    )
