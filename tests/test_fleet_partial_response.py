"""``diagnose --prometheus`` against Thanos / Mimir: a partial response (``warnings`` with
``status: success``) and the store's external labels (tests/fake_prometheus_api.py)."""

from __future__ import annotations

import pytest

from fake_prometheus_api import FakeQueryAPI
from vllm_doctor.errors import InputError
from vllm_doctor.fleet import diagnose_prometheus

END = 1_767_225_600.0  # 2026-01-01T00:00:00Z
WARNING = "receive store eu-2 (10.0.3.7:10901): rpc error: code = Unavailable desc = connection refused"


def _series(pod: str, running: float, waiting: float, kv: float) -> list:
    labels = {"job": "vllm", "namespace": "llm", "pod": pod, "instance": f"{pod}:8000", "engine": "0",
              "model_name": "m"}
    times = [END - 3600 + 15 * i for i in range(241)]
    return [({"__name__": name, **labels}, {t: value for t in times})
            for name, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", waiting),
                                ("vllm:kv_cache_usage_perc", kv))]


def test_a_partial_response_is_diagnosed_and_reported_as_partial():
    with FakeQueryAPI(_series("a", 8, 0, 0.4) + _series("b", 2, 0, 0.1), [WARNING],
                      {"cluster": "eu-1", "prometheus_replica": "prometheus-0"}) as api:
        res = diagnose_prometheus(api.url, since=str(END - 3600), until=str(END), step="15s", now=END)
    src = res.report.to_dict()["sources"][0]
    assert src["warnings"] == [WARNING]
    assert "partial response, 1 warning(s): receive store eu-2" in src["name"]
    # the external labels split no replica: one row per pod, its values as sent
    rows = {r["replica"]: r for r in res.report.replicas if r["engine"] is None}
    assert sorted(rows) == ["llm/a", "llm/b"]
    assert rows["llm/a"]["running_peak"] == 8 and rows["llm/a"]["kv_cache_usage_peak_ratio"] == 0.4
    assert rows["llm/a"]["steps"] == 241


def test_an_empty_partial_response_says_what_the_api_warned():
    with FakeQueryAPI([], [WARNING], {"cluster": "eu-1"}) as api:
        with pytest.raises(InputError, match="the query API warned: receive store eu-2"):
            diagnose_prometheus(api.url, since=str(END - 3600), until=str(END), step="15s", now=END)


def test_a_complete_response_carries_no_warning():
    with FakeQueryAPI(_series("a", 8, 0, 0.4), [], {}) as api:
        res = diagnose_prometheus(api.url, since=str(END - 3600), until=str(END), step="15s", now=END)
    src = res.report.to_dict()["sources"][0]
    assert "warnings" not in src and "partial" not in src["name"]
