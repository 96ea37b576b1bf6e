"""The /metrics source against real vLLM 0.32 captures (and a vllm-ascend one), served by a
small HTTP server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import math
import pytest

from serve_helpers import Pages, timeline_pages

from vllm_doctor.ingest.scrape import MetricsScraper, parse_metrics
from vllm_doctor.state.signals import HistogramWindow, Signals, histogram_quantile

METRICS = Path(__file__).parent / "fixtures" / "metrics"
BASIC = (METRICS / "vllm-0.32-cpu-basic.txt").read_text()
PREEMPT = (METRICS / "vllm-0.32-cpu-preemption.txt").read_text()
ASCEND = (METRICS / "ascend-0.20-kv-cache-usage-negative.txt").read_text()


def test_parse_real_vllm_032_preemption_capture():
    p = parse_metrics(PREEMPT, now=1000.0)
    s = p.sample
    assert (s.num_running, s.num_waiting, s.kv_cache_usage_ratio) == (0.0, 0.0, 0.0)
    assert s.num_preemptions_total == 105.0
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (7610.0, 48000.0)
    assert (s.ttft_count, round(s.ttft_sum, 3)) == (32.0, 240.663)
    assert s.ttft_buckets[-1] == (float("inf"), 32.0) and len(s.ttft_buckets) == 23
    cc = dict(s.cache_config)
    assert cc["num_gpu_blocks"] == "32" and cc["kv_cache_size_tokens"] == "4096"
    assert cc["block_size"] == "128" and cc["gpu_memory_utilization"] == "0.92"
    assert "engine" not in cc and s.rejected_values == 0 and p.bad_lines == 0
    assert s.num_swapped is None and s.meta.source == "metrics" and s.meta.ts == 1000.0
    # 32 TTFTs: 1 <= 0.06 s, 15 <= 0.25 s, 32 <= 20 s
    assert histogram_quantile(0.5, s.ttft_buckets) == pytest.approx(10.0 + 10.0 * (16 - 15) / 17)
    assert histogram_quantile(0.99, s.ttft_buckets) == pytest.approx(10.0 + 10.0 * (31.68 - 15) / 17)
    assert (p.prefix_cache_queries_total, p.prefix_cache_hits_total) == (7610.0, 0.0)


def test_parse_real_vllm_032_basic_capture():
    s = parse_metrics(BASIC).sample
    assert s.ttft_count == 485.0 and s.num_preemptions_total == 0.0
    assert dict(s.cache_config)["num_gpu_blocks"] == "8192"


def test_renamed_kv_usage_before_092_and_newest_name_wins():
    old = PREEMPT.replace("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.0",
                          "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.25")
    old = old.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert "vllm:kv_cache_usage_perc" not in old
    assert parse_metrics(old).sample.kv_cache_usage_ratio == 0.25
    both = PREEMPT + 'vllm:gpu_cache_usage_perc{engine="0",model_name="tiny"} 0.75\n'
    assert parse_metrics(both).sample.kv_cache_usage_ratio == 0.0


def test_data_parallel_engines_sum_counts_and_average_ratio():
    text = "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 3',
        'vllm:num_requests_running{engine="1",model_name="m"} 5',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 1.0', ""])
    s = parse_metrics(text).sample
    assert s.num_running == 8.0 and s.kv_cache_usage_ratio == 0.75


def test_negative_usage_from_vllm_ascend_is_counted_and_dropped():
    p = parse_metrics(ASCEND)
    assert p.sample.kv_cache_usage_ratio is None
    assert p.sample.rejected_values == 1
    assert p.bad_lines == 4  # the curl progress lines pasted with it


def test_impossible_values_dropped_per_series():
    text = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 4\n'
            'vllm:num_requests_running{engine="1"} -2\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0"} 1.7\n'
            'vllm:kv_cache_usage_perc{engine="1"} NaN\n')
    s = parse_metrics(text).sample
    assert s.num_running == 4.0 and s.kv_cache_usage_ratio is None and s.rejected_values == 3


def test_histogram_window_over_time_and_reset():
    w = HistogramWindow(window_seconds=60)
    w.add(0, ((0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)))
    w.add(30, ((0.1, 10.0), (1.0, 20.0), (float("inf"), 20.0)))
    w.add(70, ((0.1, 10.0), (1.0, 30.0), (float("inf"), 30.0)))
    # window base is the snapshot at t=0 (the newest one at least 60 s old): 20 new, all in (0.1, 1]
    assert w.delta() == ((0.1, 0.0), (1.0, 20.0), (float("inf"), 20.0))
    assert w.quantile(0.5) == pytest.approx(0.1 + 0.9 * 0.5)
    w.add(100, ((0.1, 10.0), (1.0, 40.0), (float("inf"), 40.0)))  # base moves to t=30
    assert w.delta() == ((0.1, 0.0), (1.0, 20.0), (float("inf"), 20.0))
    w.add(131, ((0.1, 10.0), (1.0, 41.0), (float("inf"), 41.0)))  # base moves to t=70
    assert w.delta() == ((0.1, 0.0), (1.0, 11.0), (float("inf"), 11.0))
    w.add(110, ((0.1, 1.0), (1.0, 1.0), (float("inf"), 1.0)))  # vLLM restarted
    assert w.quantile(0.99) == pytest.approx(0.099)
    assert HistogramWindow().quantile(0.5) is None


def test_scraper_against_local_server_over_real_timeline():
    pages = timeline_pages()
    got = []
    with Pages(pages) as srv:
        sc = MetricsScraper(srv.url, got.append, timeout=2)
        try:
            for _ in pages:
                assert sc.scrape_once() is not None
        finally:
            sc.stop()
    assert sc.stats.up and sc.stats.errors == 0 and sc.stats.scrapes == len(pages) == 15
    assert [g.num_preemptions_total for g in got][:6] == [0.0, 0.0, 0.0, 3.0, 6.0, 9.0]
    assert got[-1].num_preemptions_total == 59.0 and got[-1].num_running == 6.0
    assert got[1].kv_cache_usage_ratio == pytest.approx(0.967741935483871)


def test_scraper_survives_errors_and_serves_ttft_window():
    with Pages([PREEMPT]) as srv:
        got = []
        sc = MetricsScraper(srv.url, got.append, timeout=2)
        try:
            sc.scrape_once()
            assert not hasattr(sc, "ttft_quantiles")  # the scraper only parses: the signals are the state's
            signals = Signals()
            signals.add(got[-1])
            assert signals.ttft_quantiles["0.99"] == pytest.approx(10.0 + 10.0 * (31.68 - 15) / 17)
            assert signals.prefix_cache_hit_ratio == 0.0
            srv.status = 500
            assert sc.scrape_once() is None
            assert not sc.stats.up and sc.stats.errors == 1
        finally:
            sc.stop()
    dead = MetricsScraper(srv.url, got.append, timeout=0.5)  # nothing listens there any more
    assert dead.scrape_once() is None and dead.stats.errors == 1 and "Connect" in dead.stats.last_error
    dead.stop()
    assert len(got) == 1


def test_the_state_computes_the_signals_once_on_the_samples_clock():
    from vllm_doctor.diagnosis.loader import load_rules
    from vllm_doctor.pipeline import Pipeline

    p = Pipeline(load_rules(), follow=True)
    first = parse_metrics(PREEMPT, now=1_000.0).sample
    p.observe(first)
    sig = p.state.signals
    assert sig.ttft_quantiles["0.99"] == pytest.approx(10.0 + 10.0 * (31.68 - 15) / 17)
    assert sig.prefix_cache_hit_ratio == 0.0
    # the same counters 10 min later (on the samples' clock): nothing observed in the window
    p.observe(parse_metrics(PREEMPT, now=1_600.0).sample)
    p.observe(parse_metrics(PREEMPT, now=1_601.0).sample)
    assert sig.ttft_quantiles == {} and sig.prefix_cache_hit_ratio is None


def test_the_rules_window_and_the_sidecar_window_use_the_same_signal_arithmetic():
    """quantile_between / hit_ratio_between are what Signals, the rules' ttft_p99() and the
    prefix-cache collapse series compute with (issue 26 item 3: one signals layer)."""
    from vllm_doctor.state.signals import hit_ratio_between, quantile_between

    old = ((0.5, 10.0), (1.0, 20.0), (math.inf, 20.0))
    new = ((0.5, 10.0), (1.0, 120.0), (math.inf, 120.0))  # 100 observations, all in (0.5, 1]
    assert quantile_between(0.99, old, new) == pytest.approx(0.5 + 0.5 * 99 / 100)
    assert quantile_between(0.99, new, new) is None  # nothing observed in between
    w = HistogramWindow(300.0)
    w.add(0.0, old)
    w.add(60.0, new)
    assert w.quantile(0.99) == quantile_between(0.99, old, new)
    assert hit_ratio_between(100.0, 40.0, 300.0, 90.0) == pytest.approx(50 / 200)
    assert hit_ratio_between(300.0, 90.0, 300.0, 90.0) is None  # no query in between
    assert hit_ratio_between(300.0, 90.0, 100.0, 10.0) is None  # a reset: the counters fell
    assert hit_ratio_between(100.0, 40.0, 110.0, 60.0) is None  # more hits than queries: not vLLM's counters
