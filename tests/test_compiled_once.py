"""Compiled tables are built once per process (issue 26 item 7): the rules, the keyword scanner's
Hyperscan database, the parsers' keyword database and the rules' line expressions. A second
pipeline reuses them; an edited rule file is read again; scanners sharing one database scan at
once from several threads (each its own scratch space) and find the same lines."""

from __future__ import annotations

import shutil
import threading

import pytest

from conftest import log
from vllm_doctor.diagnosis import load_rules
from vllm_doctor.diagnosis.expr import compile_line
from vllm_doctor.diagnosis.loader import builtin_rules_dir
from vllm_doctor.parsers.records import keyword_scanner
from vllm_doctor.parsers.records import RecordParser
from vllm_doctor.pipeline import Pipeline


def test_the_builtin_rules_are_loaded_once_and_shared():
    assert load_rules() is load_rules()
    assert load_rules([]) is load_rules(())


def test_an_edited_rule_file_is_read_again(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    src = builtin_rules_dir() / "VD009-max-model-len-exceeds-model.yaml"
    text = src.read_text()
    (d / "X001-mine.yaml").write_text(text.replace("id: VD009", "id: XY001").replace(
        "name: max-model-len-exceeds-model", "name: my-rule"))
    first = load_rules([d], builtin=False)
    assert [r.name for r in first.rules] == ["my-rule"]
    assert load_rules([d], builtin=False) is first
    (d / "X001-mine.yaml").write_text(text.replace("id: VD009", "id: XY001").replace(
        "name: max-model-len-exceeds-model", "name: my-rule-renamed"))
    assert [r.name for r in load_rules([d], builtin=False).rules] == ["my-rule-renamed"]
    shutil.copy(d / "X001-mine.yaml", d / "X002-other.yaml")  # a second file: a duplicate id, refused
    from vllm_doctor.errors import RuleLoadError

    with pytest.raises(RuleLoadError, match="duplicate rule id XY001"):
        load_rules([d], builtin=False)


def test_pipelines_share_the_scanner_database_not_its_scratch():
    a, b = Pipeline(load_rules()), Pipeline(load_rules())
    if a._scanner.backend != "hyperscan":
        pytest.skip("hyperscan is not installed here: the re backend compiles nothing costly")
    assert a._scanner._db is b._scanner._db
    assert a._scanner._scratch is not b._scanner._scratch
    p, q = RecordParser("x"), RecordParser("y")
    assert p._hits._db is q._hits._db and p._hits._scratch is not q._hits._scratch


def test_scanners_sharing_one_database_scan_at_once_from_threads():
    data = log("014-").read_bytes() * 200
    first = keyword_scanner()
    want = first.line_ends(data)
    assert len(want[0]) > 500
    got: list = []

    def scan() -> None:
        s = keyword_scanner()
        assert s._db is first._db  # one database (None with the re backend)
        got.extend(s.line_ends(data) for _ in range(5))

    threads = [threading.Thread(target=scan) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(got) == 20 and all(g == want for g in got)


def test_a_line_expression_is_compiled_once_and_bound_per_call():
    calls: list[str] = []
    f1 = compile_line("num_running > t.x and kv_cache_tokens", {"num_running"}, {"x": 1}, None,
                      lambda n: calls.append(n) or 5)
    f2 = compile_line("num_running > t.x and kv_cache_tokens", {"num_running"}, {"x": 10}, None, lambda n: 7)

    class Line:
        num_running = 4

    assert (f1(Line()), f2(Line())) == (5, False)
    assert calls == ["kv_cache_tokens"]
    assert f1.__code__ is f2.__code__


def test_the_scanner_database_is_compiled_once_per_user_not_per_process(tmp_path, monkeypatch):
    """The keyword scanner's Hyperscan compile (about 0.25 s of CPU) is paid by the first process
    only: the next one loads the compiled form from the user's cache; a damaged cache file is
    compiled again and replaced, a cache that cannot be written is done without."""
    hyperscan = pytest.importorskip("hyperscan")
    from vllm_doctor.ingest import envelope
    from vllm_doctor.parsers.records import NEAR_KEYWORDS, prefilter_keywords

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    exprs = [envelope.re.escape(b"Avg prompt throughput") + rb"[^\n]*$", rb"OutOfMemory[^\n]*$"]
    flags = [hyperscan.HS_FLAG_MULTILINE] * 2
    data = b"x\nAvg prompt throughput: 3\ny\ntorch.OutOfMemoryError\n"

    def ends(db) -> list[tuple[int, int]]:
        got: list = []
        db.scan(data, match_event_handler=lambda i, _f, to, _fl, _c: got.append((i, to)), scratch=hyperscan.Scratch(db))
        return got

    want = ends(envelope._hyperscan_db(exprs, flags))
    assert want == [(0, 26), (1, 51)]
    (cached,) = (tmp_path / "vllm-doctor").glob("scan-*.hsdb")
    compiled = []
    real = hyperscan.Database
    monkeypatch.setattr(hyperscan, "Database", lambda **kw: compiled.append(kw) or real(**kw))
    assert ends(envelope._hyperscan_db(exprs, flags)) == want and compiled == []  # loaded, not compiled
    cached.write_bytes(cached.read_bytes()[:1000])  # damaged (a full disk, a crash mid-write)
    assert ends(envelope._hyperscan_db(exprs, flags)) == want and len(compiled) == 1
    assert ends(envelope._hyperscan_db(exprs, flags)) == want and len(compiled) == 1  # replaced whole
    assert [p.name for p in (tmp_path / "vllm-doctor").iterdir()] == [cached.name]  # no temporary left
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # cannot be a folder: no cache, same database
    assert ends(envelope._hyperscan_db(exprs, flags)) == want and len(compiled) == 2
    # the scanner's own expressions go the same way (a second process loads them)
    envelope._compiled_scan.cache_clear()
    try:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        envelope._compiled_scan(tuple(prefilter_keywords()), tuple(a.encode() for a, _n, _k in NEAR_KEYWORDS))
        assert len(list((tmp_path / "vllm-doctor").glob("scan-*.hsdb"))) == 2
    finally:
        envelope._compiled_scan.cache_clear()


def test_the_flags_table_matchers_and_metric_catalogue_are_read_once(monkeypatch):
    """The other tables the pipeline reads at every line or rule: the flags table (data/vllm_flags.json,
    each fix's flag checked against the detected version), the parsers' keyword dispatch (one regex
    over the matcher table) and the metric catalogue (data/vllm_metrics.json) are read once."""
    from importlib import resources

    from vllm_doctor import catalogue, versions

    reads: list[str] = []
    real = resources.files

    def files(pkg):
        reads.append(str(pkg))
        return real(pkg)

    versions.flag_exists("--max-num-seqs", "0.10.1")  # (loaded once already, or now)
    catalogue.data()
    RecordParser("a")
    rules = load_rules()  # (the rule files are read again at each call, to see an edit: test above)
    monkeypatch.setattr(resources, "files", files)
    for v in ("0.6.3", "0.10.1", "0.32.0", None):
        assert versions.flag_exists("--max-num-seqs", v) is True
        assert versions.flag_exists("--no-such-flag", v) is False
    assert catalogue.data() is catalogue.data()
    assert RecordParser("b")._DISPATCH is RecordParser("c")._DISPATCH is not None
    Pipeline(rules).feed("x.log", log("014-").read_bytes())
    assert reads == []
