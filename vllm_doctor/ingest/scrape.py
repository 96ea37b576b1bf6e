"""Scrape vLLM's own Prometheus ``/metrics`` into :class:`vllm_doctor.events.VllmMetricsSample`.

On V1 engines /metrics is the only source of preemptions (their logs print none). The text
is parsed with ``prometheus_client.parser.text_string_to_metric_families``; names and their
renames across versions (``/work/shared/reference/vllm-log-formats.md`` section 6, read from
vLLM's ``engine/metrics.py`` (V0) and ``v1/metrics/loggers.py`` (V1)):

================================  ===========================  ==============================
field                             exposed name(s), newest first  versions
================================  ===========================  ==============================
num_running                       ``vllm:num_requests_running``  V0 0.3.3–0.10.2, V1 0.7.3+
num_waiting                       ``vllm:num_requests_waiting``  V0 0.3.3–0.10.2, V1 0.7.3+
num_swapped                       ``vllm:num_requests_swapped``  V0 only (0.3.3–0.9.0)
kv_cache_usage_ratio              ``vllm:kv_cache_usage_perc``,  0.9.2+; the old name until
                                  ``vllm:gpu_cache_usage_perc``  0.11 (hidden), gone 0.12
num_preemptions_total             ``vllm:num_preemptions_total`` V0 0.4.3+, V1 0.8.0+
prompt/generation_tokens_total    ``vllm:prompt_tokens_total``,  all versions
                                  ``vllm:generation_tokens_total``
ttft_*                            ``vllm:time_to_first_token_seconds_{bucket,count,sum}``
cache_config                      ``vllm:cache_config_info`` labels (V0 0.6+, V1 0.8+)
prefix cache (hit ratio)          ``vllm:prefix_cache_{queries,hits}_total`` (0.9.2+),
                                  ``vllm:gpu_prefix_cache_{queries,hits}_total`` (V1 ≤0.11)
================================  ===========================  ==============================

Series are summed over their labels (``engine`` for data parallel, ``model_name``), except
the usage ratio, which is averaged. A value that cannot be true (negative or NaN anywhere,
a usage ratio above 1; vllm-ascend 0.20 printed ``kv_cache_usage_perc -0.39``) is counted
in ``rejected_values`` and left out, never exported.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from vllm_doctor import catalogue as cat
from vllm_doctor.catalogue import V
from vllm_doctor.events import EngineMetrics, Meta, VllmMetricsSample

log = logging.getLogger(__name__)

#: fields also kept per ``engine`` label (data parallel), see events.EngineMetrics.
ENGINE_FIELDS = ("num_running", "num_waiting", "kv_cache_usage_ratio", "prompt_tokens_total",
                 "generation_tokens_total")


def _renamed(fld: str, name: str, suffix: str = "") -> dict[str, tuple[str, int]]:
    """A field read from a series and its older names (vLLM's renames): the newest wins."""
    return {n + suffix: (fld, prio) for prio, n in enumerate(cat.names(name))}


#: exposed sample name -> (field, priority): a lower priority number wins when both appear.
#: Names and renames from the catalogue (vllm_doctor/catalogue.py).
SAMPLE_FIELDS: dict[str, tuple[str, int]] = {
    **_renamed("num_running", V.num_requests_running),
    **_renamed("num_waiting", V.num_requests_waiting),
    **_renamed("num_swapped", V.num_requests_swapped),
    **_renamed("kv_cache_usage_ratio", V.kv_cache_usage_perc),
    **_renamed("num_preemptions_total", V.num_preemptions_total),
    **_renamed("prompt_tokens_total", V.prompt_tokens_total),
    **_renamed("generation_tokens_total", V.generation_tokens_total),
    **_renamed("ttft_count", V.time_to_first_token_seconds, "_count"),
    **_renamed("ttft_sum", V.time_to_first_token_seconds, "_sum"),
    **_renamed("prefix_cache_queries_total", V.prefix_cache_queries_total),
    **_renamed("prefix_cache_hits_total", V.prefix_cache_hits_total),
    # issue 25 (v1/metrics/loggers.py 0.3x; kv_connector/v1/nixl/stats.py 0.1x+, mooncake/stats.py)
    **_renamed("admission_rejections_total", V.admission_rejections_total),
    **_renamed("kv_transfer_failures_total", V.nixl_num_failed_transfers_total),
    **_renamed("kv_transfer_failures_total", V.mooncake_num_failed_transfers_total),
}
#: vllm:num_requests_waiting_by_reason{reason} (0.3x) -> field, by the reason label
WAITING_BY_REASON = V.num_requests_waiting_by_reason
WAITING_REASONS = {"capacity": "num_waiting_capacity", "deferred": "num_waiting_deferred"}
RATIO_FIELDS = {"kv_cache_usage_ratio"}
TTFT_BUCKET = V.time_to_first_token_seconds + "_bucket"
CACHE_CONFIG = V.cache_config_info
_SAMPLE_KW = {"num_running", "num_waiting", "num_swapped", "kv_cache_usage_ratio",
              "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
              "ttft_count", "ttft_sum", "num_waiting_capacity", "num_waiting_deferred",
              "admission_rejections_total", "kv_transfer_failures_total", "prefix_cache_queries_total",
              "prefix_cache_hits_total"}


@dataclass
class ParsedMetrics:
    """What one /metrics text held: the event, plus values the event has no field for.

    prefix_cache_queries_total / prefix_cache_hits_total: counters (None when absent).
    bad_lines: lines the text parser could not read (skipped).
    """

    sample: VllmMetricsSample
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    bad_lines: int = 0


#: The largest value kept: a float counts exactly up to 2**53; a counter beyond it (1e308) is no
#: count vLLM made, and sums of such values overflow to +Inf.
MAX_VALUE = float(2**53)


#: Hostile cardinality is bounded: TTFT buckets (``le`` values; vLLM has about 20), engines (data
#: parallel ranks) and cache_config labels kept per scrape; the rest is counted in rejected_values.
MAX_BUCKETS = 64
MAX_ENGINES = 64


def _valid(fld: str, value: float) -> bool:
    if math.isnan(value) or value < 0 or value > MAX_VALUE:
        return False
    if fld in RATIO_FIELDS and value > 1.0 + 1e-9:
        return False
    return not math.isinf(value)


def _families(text: str) -> tuple[list, int]:
    """Parse the whole text; when a line is malformed (a paste, a proxy's banner, a torn
    response), parse line by line and skip the bad ones. Returns (samples, bad_lines)."""
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples], 0
    except (ValueError, TypeError, IndexError, KeyError):
        pass
    samples, bad = [], 0
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            for fam in text_string_to_metric_families(line + "\n"):
                samples.extend(fam.samples)
        except (ValueError, TypeError, IndexError, KeyError):
            # a fragment may still hold a sample after junk ("...0# HELP x" from a curl paste)
            bad += 1
    return samples, bad


def parse_metrics(text: str, now: float | None = None, source: str = "metrics") -> ParsedMetrics:
    """Parse one /metrics text into a :class:`ParsedMetrics`. Never raises on bad content.

    now: epoch seconds stamped on the event (time.time() by default).
    """
    samples, bad = _families(text)
    values: dict[str, tuple[int, list[float]]] = {}
    buckets: dict[float, float] = {}
    cache_config: dict[str, str] = {}
    rejected = 0
    per_engine: dict[str, dict[str, tuple[int, float]]] = {}  # engine label -> field -> (priority, value)
    for s in samples:
        name = s.name
        if name == TTFT_BUCKET:
            try:
                le = float(s.labels.get("le", "nan"))
            except ValueError:
                rejected += 1
                continue
            if math.isnan(le) or not _valid("bucket", s.value) or (le not in buckets and len(buckets) >= MAX_BUCKETS):
                rejected += 1
                continue
            buckets[le] = buckets.get(le, 0.0) + s.value
            continue
        if name == CACHE_CONFIG:
            for k, v in sorted(s.labels.items()):
                if k not in ("engine", "model_name") and (k in cache_config or len(cache_config) < MAX_BUCKETS):
                    cache_config.setdefault(k, v[:256])
            continue
        spec = SAMPLE_FIELDS.get(name)
        if name == WAITING_BY_REASON and s.labels.get("reason") in WAITING_REASONS:
            spec = (WAITING_REASONS[s.labels["reason"]], 0)
        if spec is None:
            continue
        fld, prio = spec
        if not _valid(fld, s.value):
            rejected += 1
            log.debug("dropping impossible value %s%s = %r", name, s.labels, s.value)
            continue
        if fld in ENGINE_FIELDS and "engine" in s.labels and (s.labels["engine"] in per_engine
                                                              or len(per_engine) < MAX_ENGINES):
            eng = per_engine.setdefault(s.labels["engine"], {})
            old = eng.get(fld)
            if old is None or prio < old[0]:
                eng[fld] = (prio, s.value)
            elif prio == old[0]:
                eng[fld] = (prio, old[1] + s.value)
        have = values.get(fld)
        if have is None or prio < have[0]:
            values[fld] = (prio, [s.value])
        elif prio == have[0]:
            have[1].append(s.value)
    agg: dict[str, float] = {}
    for fld, (_, vals) in values.items():
        v = sum(vals) / len(vals) if fld in RATIO_FIELDS else sum(vals)
        if v > MAX_VALUE:  # series that are each possible, their sum not
            rejected += 1
            continue
        agg[fld] = v
    for flds in per_engine.values():
        for fld in [f for f, (_, v) in flds.items() if v > MAX_VALUE]:
            del flds[fld]
    meta = Meta(source=source, ts=time.time() if now is None else now, text=_said(agg))
    engines = tuple(
        EngineMetrics(meta, int(label) if label.isdigit() else None, **{k: v for k, (_, v) in flds.items()})
        for label, flds in sorted(per_engine.items(), key=lambda kv: (len(kv[0]), kv[0])))
    sample = VllmMetricsSample(
        meta=meta, engines=engines if len(engines) > 1 else (),
        ttft_buckets=tuple(sorted(buckets.items())),
        cache_config=tuple(sorted(cache_config.items())),
        rejected_values=rejected,
        **{k: v for k, v in agg.items() if k in _SAMPLE_KW},
    )
    return ParsedMetrics(sample, agg.get("prefix_cache_queries_total"),
                         agg.get("prefix_cache_hits_total"), bad)


#: What a sample's evidence line says: the scheduler's gauges and counters, as vLLM names them.
_SAID = (("num_running", V.num_requests_running), ("num_waiting", V.num_requests_waiting),
         ("kv_cache_usage_ratio", V.kv_cache_usage_perc), ("num_preemptions_total", V.num_preemptions_total))


def _said(agg: dict[str, float]) -> str:
    """One line for a finding's evidence: the sample's scheduler values (numbers vLLM wrote, nothing
    a client controls), e.g. ``vllm:num_requests_running 182, ..., vllm:num_preemptions_total 0``."""
    return ", ".join(f"{name} {agg[fld]:g}" for fld, name in _SAID if fld in agg)


#: The bounds of one scrape (ServeConfig scrape_max_bytes, scrape_deadline): vLLM's /metrics is
#: tens of KB (a data-parallel deployment with LoRA a few MB).
MAX_SCRAPE_BYTES = 16 << 20
SCRAPE_DEADLINE_SECONDS = 10.0
#: What Prometheus' text format is served as (prometheus_client: text/plain; version=0.0.4,
#: OpenMetrics: application/openmetrics-text).
METRICS_CONTENT_TYPES = frozenset(("text/plain", "application/openmetrics-text"))


class ScrapeLimit(Exception):
    """A /metrics answer over a bound (size, time) or not in Prometheus' text format."""


def read_bounded(resp, max_bytes: int, t_end: float, size_setting: str, time_setting: str) -> bytes:
    """The body of a streamed httpx response, decompressed (gzip, deflate), at most ``max_bytes``
    (a compressed answer is cut as it inflates) and complete before ``t_end`` (time.monotonic());
    ScrapeLimit naming the setting otherwise."""
    enc = resp.headers.get("content-encoding", "identity").strip().lower()
    if enc not in ("identity", "", "gzip", "x-gzip", "deflate"):
        raise ScrapeLimit(f"content-encoding {enc!r} not supported")
    inflate = None if enc in ("identity", "") else zlib.decompressobj(zlib.MAX_WBITS | 32)
    body = bytearray()
    for chunk in resp.iter_raw():
        while chunk:
            if inflate is None:
                out, chunk = chunk, b""
            else:
                out = inflate.decompress(chunk, max_bytes + 1 - len(body))
                chunk = inflate.unconsumed_tail
            body += out
            if len(body) > max_bytes:
                raise ScrapeLimit(f"answer over {max_bytes} bytes ({size_setting})")
            if inflate is not None and not out:
                break
        if time.monotonic() > t_end:
            raise ScrapeLimit(f"answer not complete within the deadline ({time_setting})")
    return bytes(body)


@dataclass
class ScrapeStats:
    """Health of the scraper: ``up`` after a successful scrape, ``errors`` (HTTP, timeouts,
    refused), ``rejected_values`` (impossible values dropped), ``bad_lines``."""

    up: bool = False
    scrapes: int = 0
    errors: int = 0
    rejected_values: int = 0
    bad_lines: int = 0
    last_ok_at: float | None = None  # time.monotonic()
    last_error: str | None = None


class MetricsScraper:
    """Poll vLLM's /metrics every ``interval`` seconds in a background thread.

    url: e.g. ``http://127.0.0.1:8000/metrics``.
    on_sample(VllmMetricsSample): called with each good scrape (from the scraper thread).
    clock: epoch seconds stamped on each sample (time.time; the sidecar passes its log clock).
    The scraper only parses: the TTFT quantiles and the prefix cache hit ratio over a window are
    the state's (:mod:`vllm_doctor.state.signals`).
    """

    def __init__(self, url: str, on_sample: Callable[[VllmMetricsSample], None], *,
                 interval: float = 5.0, timeout: float = 2.0,
                 clock: Callable[[], float] = time.time, max_bytes: int = MAX_SCRAPE_BYTES,
                 deadline: float = SCRAPE_DEADLINE_SECONDS) -> None:
        self.url = url
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.clock = clock
        self.on_sample = on_sample
        self.interval = interval
        self.timeout = timeout
        self.stats = ScrapeStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = None

    def scrape_once(self) -> VllmMetricsSample | None:
        """Fetch and parse once; update stats and windows; call on_sample. Never raises."""
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, follow_redirects=True,
                                        headers={"Accept": "text/plain", "Accept-Encoding": "gzip"})
        self.stats.scrapes += 1
        try:
            text = self._fetch()
        except Exception as exc:  # noqa: BLE001 - any failure is a failed scrape
            self.stats.errors += 1
            err = f"{type(exc).__name__}: {exc}"[:300]
            if self.stats.up or self.stats.last_error is None or self.stats.last_error.split(":")[0] != err.split(":")[0]:
                # one line when the source goes down or the kind of failure changes, not every scrape
                log.warning("vLLM /metrics at %s unreachable: %s (retrying every %ss)", self.url, err,
                            getattr(self, "interval", "few "))
            else:
                log.debug("scrape %s failed: %s", self.url, exc)
            self.stats.up = False
            self.stats.last_error = err
            return None
        try:
            parsed = parse_metrics(text, now=self.clock())
        except Exception as exc:  # noqa: BLE001 - parse_metrics should not raise; be sure
            self.stats.errors += 1
            self.stats.last_error = f"parse: {exc}"[:300]
            return None
        self._account(parsed)
        try:
            self.on_sample(parsed.sample)
        except Exception:  # noqa: BLE001 - a sink failure must not stop scraping
            log.exception("on_sample failed")
        return parsed.sample

    def _fetch(self) -> str:
        """The body of one GET, bounded: ``deadline`` seconds in all (a server that drips its
        answer is cut), ``max_bytes`` of body, decompressed (a gzip bomb is cut as it inflates),
        and Prometheus' text format only (an HTML login page is no /metrics). Raises ScrapeLimit
        (or httpx's errors)."""
        t_end = time.monotonic() + self.deadline
        with self._client.stream("GET", self.url) as resp:
            resp.raise_for_status()
            ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and ctype not in METRICS_CONTENT_TYPES:
                raise ScrapeLimit(f"content-type {ctype!r} is not Prometheus' text format")
            body = read_bounded(resp, self.max_bytes, t_end, "scrape_max_bytes", "scrape_deadline")
        return body.decode("utf-8", "replace")

    def _account(self, parsed: ParsedMetrics) -> None:
        now = time.monotonic()
        s = parsed.sample
        self.stats.up = True
        self.stats.last_ok_at = now
        self.stats.rejected_values += s.rejected_values
        self.stats.bad_lines += parsed.bad_lines

    def start(self) -> None:
        """Start the background thread (first scrape immediately)."""
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-scrape", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the HTTP client."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval)
