"""The ladder chart: output throughput and p99 TTFT against concurrency, as inline SVG.

Drawn server-side (no script, nothing loaded from the network); every text taken from the
result (the model name, the URL) is escaped. ``html_page`` wraps the SVG and the level table in a
self-contained HTML page.
"""

from __future__ import annotations

from html import escape

from vllm_doctor.loadtest.objectives import METRICS

W = 760               # the wide chart; the narrow one (phones, 480 px) is NARROW_W wide, drawn at its own size
NARROW_W = 440
PANEL_H = 150         # one panel per series: throughput, then each latency with an objective
COLORS = {"throughput": "#1f77b4", "ttft_p99_ms": "#d62728", "itl_p99_ms": "#ff7f0e", "tpot_p99_ms": "#8c564b",
          "e2e_p99_ms": "#e377c2"}
LIMITS = {"kv-cache": "KV cache", "queue": "queue", "compute": "compute"}
MARKERS = (("knee", "#2ca02c", "5,4"), ("preemption", "#9467bd", "2,3"), ("objective-lost", "#000000", "6,2,2,2"))


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    import math
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _place(lv: dict):
    rate = lv.get("request_rate")
    return rate if rate is not None else lv["concurrency"]


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def markers(result: dict, levels: list[dict]) -> list[tuple[str, object, str]]:
    """The vertical markers: (kind, level place, label). The knee; where preemption begins (the first
    level whose vllm:num_preemptions_total delta moved); where the objective is lost (the first
    level that FAILed an objective)."""
    places = [_place(lv) for lv in levels]
    out = []
    knee = result.get("knee") or {}
    if knee.get("found") and knee.get("concurrency") in places:
        out.append(("knee", knee["concurrency"], f"knee {_label(knee['concurrency'])}"))
    first_pre = next((_place(lv) for lv in levels if lv.get("preemptions")), None)
    if first_pre is not None:
        out.append(("preemption", first_pre, f"preemption from {_label(first_pre)}"))
    lost = next((_place(lv) for lv in levels if lv.get("meets_objectives") == "FAIL"), None)
    if lost is not None:
        out.append(("objective-lost", lost, f"objective lost at {_label(lost)}"))
    return out


def ladder_svg(result: dict, width: int = W) -> str:
    """The chart: output throughput, then one panel per latency objective (p99 with its 95 % interval
    and the objective as a dashed line); vertical markers for the knee, where preemption begins and
    where the objective is lost; one legend. ``width``: W (wide) or NARROW_W (a phone's screen)."""
    levels = [lv for lv in result.get("levels", []) if lv.get("completed")]
    xs = [_place(lv) for lv in levels]
    n = len(levels)
    narrow = width < 600
    L, R = (48, 14) if narrow else (70, 30)
    pw = width - L - R
    objectives = {k: v for k, v in (result.get("objectives") or {}).items() if v and k in METRICS}
    if not objectives and (result.get("config") or {}).get("slo_ttft_ms"):
        objectives = {"ttft_p99_ms": result["config"]["slo_ttft_ms"]}
    panels = [("throughput", "output tokens/s", None)] + [(k, f"{METRICS[k][2]} (ms)", v) for k, v in objectives.items()]
    legend = [(COLORS["throughput"], "none", "output throughput")]
    for k, _, v in panels[1:]:
        legend.append((COLORS[k], "none", f"{METRICS[k][2]}, 95 % interval"))
        legend.append((COLORS[k], "8,4", f"{METRICS[k][2]} objective {v:,.0f} ms"))
    marks = markers(result, levels)
    legend += [(c, d, text) for kind, c, d in MARKERS for k2, _, text in marks if k2 == kind]
    # the legend wraps into rows (about 6.5 px a character at 12 px)
    rows: list[list[tuple[str, str, str, float]]] = [[]]
    x: float = 0.0
    for color, dash, text in legend:
        w = 26 + 6.5 * len(text) + 14
        if x + w > width - 16 and rows[-1]:
            rows.append([])
            x = 0.0
        rows[-1].append((color, dash, text, x))
        x += w
    title_h = 30
    legend_h = 18 * len(rows) + 6
    T = title_h + legend_h + 24
    gap = 40
    H = T + len(panels) * (PANEL_H + gap) + 30

    def x_at(i: int) -> float:
        return L + (pw * (i + 0.5) / n if n else pw / 2)

    mode = "requests/s" if any(lv.get("request_rate") is not None for lv in levels) else "concurrent requests"
    title = f"{'Rate' if mode == 'requests/s' else 'Concurrency'} ladder: {result.get('model', '')}"
    if result.get("simulated"):
        title = "SIMULATED " + title
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="ladder-chart{" narrow" if narrow else ""}" '
           f'viewBox="0 0 {width} {H}" width="{width}" height="{H}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="throughput and p99 latencies against {mode}">',
           f'<rect x="0" y="0" width="{width}" height="{H}" fill="#ffffff"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="{14 if narrow else 15}" font-weight="bold">'
           f'{escape(title)}</text>']
    out.append('<g class="legend">')   # one legend for every series and marker
    for r, row in enumerate(rows):
        y = title_h + 10 + 18 * r
        for color, dash, text, lx in row:
            lx += 8
            out.append(f'<line x1="{lx:.1f}" y1="{y}" x2="{lx + 20:.1f}" y2="{y}" stroke="{color}" stroke-width="2.5" '
                       f'stroke-dasharray="{dash}"/><text x="{lx + 25:.1f}" y="{y + 4}">{escape(text)}</text>')
    out.append('</g>')
    for p, (key, axis, objective) in enumerate(panels):
        top = T + p * (PANEL_H + gap)
        bottom = top + PANEL_H
        color = COLORS[key]
        vals: list[float | None]
        lows: list[float | None]
        highs: list[float | None]
        if key == "throughput":
            vals = [float(lv.get("output_throughput") or 0.0) for lv in levels]
            lows = highs = [None] * n
        else:
            mk, pk, _ = METRICS[key]
            st = [lv.get(mk) or {} for lv in levels]
            vals = [s.get(pk) for s in st]
            lows = [s.get(pk + "_ci_low") for s in st]
            highs = [s.get(pk + "_ci_high") for s in st]
        vmax = _nice_max(max([float(v) for v in vals + highs if v is not None] + [float(objective or 0.0)]) * 1.1)

        def y_at(v: float, top=top, vmax=vmax) -> float:
            return top + PANEL_H - PANEL_H * v / vmax

        out.append(f'<text x="{L}" y="{top - 8}" font-weight="bold" fill="{color}">{escape(axis)}</text>')
        for k in range(3):
            f = k / 2
            gy = bottom - PANEL_H * f
            out.append(f'<line x1="{L}" y1="{gy:.1f}" x2="{L + pw}" y2="{gy:.1f}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{L - 5}" y="{gy + 4:.1f}" text-anchor="end">{vmax * f:,.0f}</text>')
        out.append(f'<line x1="{L}" y1="{bottom}" x2="{L + pw}" y2="{bottom}" stroke="#333"/>')
        for i, c in enumerate(xs):
            out.append(f'<text x="{x_at(i):.1f}" y="{bottom + 15}" text-anchor="middle">{_label(c)}</text>')
        for kind, place, _ in marks:
            if place in xs:
                mc, md = next((c, d) for k2, c, d in MARKERS if k2 == kind)
                mx = x_at(xs.index(place)) + {"knee": -3, "preemption": 0, "objective-lost": 3}[kind]
                out.append(f'<line class="{"preemption" if kind == "preemption" else kind}" x1="{mx:.1f}" y1="{top}" '
                           f'x2="{mx:.1f}" y2="{bottom}" stroke="{mc}" stroke-dasharray="{md}" stroke-width="2"/>')
        if objective:
            oy = y_at(float(objective))
            out.append(f'<line class="objective" x1="{L}" y1="{oy:.1f}" x2="{L + pw}" y2="{oy:.1f}" '
                       f'stroke="{color}" stroke-dasharray="8,4" stroke-width="1.5"/>')
        idx = [i for i, v in enumerate(vals) if v is not None]
        pts = " ".join(f"{x_at(i):.1f},{y_at(vals[i] or 0.0):.1f}" for i in idx)
        cls = "throughput" if key == "throughput" else ("ttft" if key == "ttft_p99_ms" else key.split("_")[0])
        out.append(f'<polyline class="series-{cls}" points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for i in idx:
            lo, hi, v = lows[i], highs[i], vals[i] or 0.0
            if lo is not None and hi is not None:
                out.append(f'<line class="interval" x1="{x_at(i):.1f}" y1="{y_at(lo):.1f}" x2="{x_at(i):.1f}" '
                           f'y2="{y_at(hi):.1f}" stroke="{color}" stroke-width="1.5"/>')
            unit = "tokens/s" if key == "throughput" else "ms"
            tip = f"{_label(xs[i])}: {v:,.1f} {unit}" + ("" if lo is None or hi is None else f" [{lo:,.0f}-{hi:,.0f}]")
            shape = (f'<circle class="point-{cls}" cx="{x_at(i):.1f}" cy="{y_at(v):.1f}" r="4" fill="{color}">'
                     if key == "throughput" else
                     f'<rect class="point-{cls}" x="{x_at(i) - 4:.1f}" y="{y_at(v) - 4:.1f}" width="8" height="8" '
                     f'fill="{color}">')
            out.append(shape + f'<title>{escape(tip)}</title>' + ("</circle>" if key == "throughput" else "</rect>"))
    out.append(f'<text x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">{mode}</text>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(result: dict) -> str:
    rows = []
    for lv in result.get("levels", []):
        def f(v, fmt="{:,.1f}"):
            return "–" if v is None else fmt.format(v)
        rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in (
            _place(lv), f"{lv['completed']}/{lv['requests']}", f(lv["output_throughput"]),
            f(lv["request_throughput"], "{:,.2f}"), f(lv["ttft_ms"]["p99"], "{:,.0f}"),
            f(lv["tpot_ms"]["mean"]), f(lv["e2el_ms"]["p99"], "{:,.0f}"),
            "unknown" if lv["preemptions"] is None else lv["preemptions"],
            f(lv["max_kv_cache_usage_ratio"] and lv["max_kv_cache_usage_ratio"] * 100, "{:.0f} %"),
            f(lv["max_running"], "{:.0f}"), f(lv["max_waiting"], "{:.0f}"),
            LIMITS.get(lv.get("limited_by") or "", "–"))) + "</tr>")
    rec = result.get("recommendation") or {}
    rec_html = ""
    banner = ""
    if result.get("simulated"):
        from vllm_doctor.loadtest.simulated import SIMULATION_NOTE
        banner = f"<p class='sim'><strong>{escape(SIMULATION_NOTE)}</strong></p>"
    if rec.get("value") is not None:
        rec_html = (f"<h2>{'Do this' if rec.get('flag') else 'Capacity'}</h2><p><code>{escape(rec['flag'] or 'requests/s')} "
                    f"{rec['value']:g}</code>: "
                    f"{escape(rec['why'])}</p><ul>"
                    + "".join(f"<li>{escape(a)}</li>" for a in rec.get("arithmetic", [])) + "</ul>")
    mode = "request rate" if any(lv.get("request_rate") is not None for lv in result.get("levels", [])) else "concurrency"
    head = (f"<tr><th>{mode}</th><th>completed</th><th>output tokens/s</th><th>requests/s</th>"
            "<th>TTFT p99 ms</th><th>TPOT mean ms</th><th>E2E p99 ms</th><th>preemptions</th>"
            "<th>max KV usage</th><th>max running</th><th>max waiting</th><th>limited by</th></tr>")
    # the chart scales down to the screen (its width/height attributes are only its largest size), the
    # table scrolls in its own box: nothing is cut off nor widens the page on a phone (480 px)
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'><title>vllm-doctor bench ladder</title>"
            "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "svg.ladder-chart{max-width:100%;height:auto;display:block}.scroll{overflow-x:auto;max-width:100%}"
            "code{overflow-wrap:anywhere}.narrow{display:none}.sim{background:#fff3cd;border:1px solid #e0b84f;padding:6px 10px}"
            "@media (max-width:600px){body{margin:8px}.wide{display:none}.narrow{display:block}}</style></head><body>"
            f"<h1>vllm-doctor bench ladder</h1><p>{escape(str(result.get('url', '')))} · model "
            f"{escape(str(result.get('model', '')))}</p>{banner}{rec_html}"
            f"<div class='wide'>{ladder_svg(result)}</div><div class='narrow'>{ladder_svg(result, NARROW_W)}</div>"
            f"<div class='scroll'><table>{head}{''.join(rows)}</table></div></body></html>")
