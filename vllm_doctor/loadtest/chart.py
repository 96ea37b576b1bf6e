"""The ladder chart: output throughput and p99 TTFT against concurrency, as inline SVG.

Drawn server-side (no script, nothing loaded from the network); every text taken from the
result (the model name, the URL) is escaped. ``html_page`` wraps the SVG and the level table in a
self-contained HTML page.
"""

from __future__ import annotations

from html import escape

W, H = 760, 380
L, R, T, B = 70, 80, 50, 60   # margins: left axis (throughput), right axis (TTFT)


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    import math
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def ladder_svg(result: dict) -> str:
    levels = [lv for lv in result.get("levels", []) if lv.get("completed")]
    xs = [lv["concurrency"] for lv in levels]
    tps = [float(lv.get("output_throughput") or 0.0) for lv in levels]
    ttfts = [lv.get("ttft_ms", {}).get("p99") for lv in levels]
    n = len(levels)
    pw, ph = W - L - R, H - T - B
    objective = (result.get("objectives") or {}).get("ttft_p99_ms") or (result.get("config") or {}).get("slo_ttft_ms")
    tp_max = _nice_max(max(tps, default=0.0) * 1.1)
    tt_max = _nice_max(max([t for t in ttfts if t is not None] + [objective or 0.0], default=0.0) * 1.1)

    def x_at(i: int) -> float:
        return L + (pw * (i + 0.5) / n if n else pw / 2)

    def y_tp(v: float) -> float:
        return T + ph - ph * v / tp_max

    def y_tt(v: float) -> float:
        return T + ph - ph * v / tt_max

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="ladder-chart" viewBox="0 0 {W} {H}" '
           f'width="{W}" height="{H}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="throughput and p99 TTFT against concurrency">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
           f'Concurrency ladder: {escape(str(result.get("model", "")))}</text>']
    for k in range(5):  # grid + both axes' ticks
        f = k / 4
        y = T + ph - ph * f
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#1f77b4">{tp_max * f:,.0f}</text>')
        out.append(f'<text x="{L + pw + 6}" y="{y + 4:.1f}" fill="#d62728">{tt_max * f:,.0f}</text>')
    out.append(f'<line x1="{L}" y1="{T + ph}" x2="{L + pw}" y2="{T + ph}" stroke="#333"/>')
    for i, c in enumerate(xs):
        out.append(f'<text x="{x_at(i):.1f}" y="{T + ph + 18}" text-anchor="middle">{int(c)}</text>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 18}" text-anchor="middle">concurrent requests</text>')
    out.append(f'<text transform="translate(18 {T + ph / 2}) rotate(-90)" text-anchor="middle" '
               f'fill="#1f77b4">output throughput (tokens/s)</text>')
    out.append(f'<text transform="translate({W - 16} {T + ph / 2}) rotate(90)" text-anchor="middle" '
               f'fill="#d62728">p99 TTFT (ms)</text>')
    knee = (result.get("knee") or {}).get("concurrency")
    if knee in xs and (result.get("knee") or {}).get("found"):
        kx = x_at(xs.index(knee))
        out.append(f'<line class="knee" x1="{kx:.1f}" y1="{T}" x2="{kx:.1f}" y2="{T + ph}" '
                   f'stroke="#2ca02c" stroke-dasharray="5,4" stroke-width="2"/>')
        out.append(f'<text x="{kx + 5:.1f}" y="{T + 12}" fill="#2ca02c">knee: {int(knee)}</text>')
    # where preemption begins: the first level whose /metrics delta of vllm:num_preemptions_total moved
    first_pre = next((lv["concurrency"] for lv in levels if lv.get("preemptions")), None)
    if first_pre in xs:
        px = x_at(xs.index(first_pre))
        out.append(f'<line class="preemption" x1="{px:.1f}" y1="{T}" x2="{px:.1f}" y2="{T + ph}" '
                   f'stroke="#9467bd" stroke-dasharray="2,3" stroke-width="2"/>')
        out.append(f'<text x="{px + 5:.1f}" y="{T + 26}" fill="#9467bd">preemption begins: {int(first_pre)}</text>')
    if objective:
        oy = y_tt(float(objective))
        out.append(f'<line class="objective" x1="{L}" y1="{oy:.1f}" x2="{L + pw}" y2="{oy:.1f}" '
                   f'stroke="#d62728" stroke-dasharray="8,4" stroke-width="1.5"/>')
        out.append(f'<text x="{L + pw - 4}" y="{oy - 5:.1f}" text-anchor="end" fill="#d62728">'
                   f'TTFT p99 objective {float(objective):,.0f} ms</text>')
    legend = [("#1f77b4", "none", "throughput (left)"), ("#d62728", "none", "p99 TTFT (right)"),
              ("#d62728", "8,4", "TTFT objective"), ("#2ca02c", "5,4", "knee"),
              ("#9467bd", "2,3", "preemption begins")]
    out.append('<g class="legend">')   # one legend for every series and marker
    for i, (color, dash, label) in enumerate(legend):
        lx = L + i * (pw + R - 10) / len(legend)
        out.append(f'<line x1="{lx:.1f}" y1="38" x2="{lx + 18:.1f}" y2="38" stroke="{color}" stroke-width="2" '
                   f'stroke-dasharray="{dash}"/><text x="{lx + 22:.1f}" y="42">{label}</text>')
    out.append('</g>')
    tp_pts = " ".join(f"{x_at(i):.1f},{y_tp(v):.1f}" for i, v in enumerate(tps))
    out.append(f'<polyline class="series-throughput" points="{tp_pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for i, v in enumerate(tps):
        out.append(f'<circle class="point-throughput" cx="{x_at(i):.1f}" cy="{y_tp(v):.1f}" r="4" fill="#1f77b4">'
                   f'<title>{int(xs[i])} concurrent: {v:,.1f} tokens/s</title></circle>')
    tt_idx = [i for i, v in enumerate(ttfts) if v is not None]
    tt_pts = " ".join(f"{x_at(i):.1f},{y_tt(ttfts[i]):.1f}" for i in tt_idx)
    out.append(f'<polyline class="series-ttft" points="{tt_pts}" fill="none" stroke="#d62728" stroke-width="2"/>')
    for i in tt_idx:
        out.append(f'<rect class="point-ttft" x="{x_at(i) - 4:.1f}" y="{y_tt(ttfts[i]) - 4:.1f}" width="8" height="8" '
                   f'fill="#d62728"><title>{int(xs[i])} concurrent: p99 TTFT {ttfts[i]:,.0f} ms</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(result: dict) -> str:
    rows = []
    for lv in result.get("levels", []):
        def f(v, fmt="{:,.1f}"):
            return "–" if v is None else fmt.format(v)
        rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in (
            lv["concurrency"], f"{lv['completed']}/{lv['requests']}", f(lv["output_throughput"]),
            f(lv["request_throughput"], "{:,.2f}"), f(lv["ttft_ms"]["p99"], "{:,.0f}"),
            f(lv["tpot_ms"]["mean"]), f(lv["e2el_ms"]["p99"], "{:,.0f}"),
            "unknown" if lv["preemptions"] is None else lv["preemptions"],
            f(lv["max_kv_cache_usage_ratio"] and lv["max_kv_cache_usage_ratio"] * 100, "{:.0f} %"),
            f(lv["max_running"], "{:.0f}"), f(lv["max_waiting"], "{:.0f}"))) + "</tr>")
    rec = result.get("recommendation") or {}
    rec_html = ""
    if rec.get("value") is not None:
        rec_html = (f"<h2>Do this</h2><p><code>{escape(rec['flag'])} {int(rec['value'])}</code>: "
                    f"{escape(rec['why'])}</p><ul>"
                    + "".join(f"<li>{escape(a)}</li>" for a in rec.get("arithmetic", [])) + "</ul>")
    head = ("<tr><th>concurrency</th><th>completed</th><th>output tokens/s</th><th>requests/s</th>"
            "<th>TTFT p99 ms</th><th>TPOT mean ms</th><th>E2E p99 ms</th><th>preemptions</th>"
            "<th>max KV usage</th><th>max running</th><th>max waiting</th></tr>")
    # the chart scales down to the screen (its width/height attributes are only its largest size), the
    # table scrolls in its own box: nothing is cut off nor widens the page on a phone (480 px)
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'><title>vllm-doctor bench ladder</title>"
            "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "svg.ladder-chart{max-width:100%;height:auto;display:block}.scroll{overflow-x:auto;max-width:100%}"
            "code{overflow-wrap:anywhere}@media (max-width:600px){body{margin:8px}}</style></head><body>"
            f"<h1>vllm-doctor bench ladder</h1><p>{escape(str(result.get('url', '')))} · model "
            f"{escape(str(result.get('model', '')))}</p>{rec_html}{ladder_svg(result)}"
            f"<div class='scroll'><table>{head}{''.join(rows)}</table></div></body></html>")
