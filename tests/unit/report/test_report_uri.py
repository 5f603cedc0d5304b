"""The report reads campaigns stored at a URI through pyarrow.fs, in place (no local copy of the data)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

from orchestrator import cli
from orchestrator.report import ReportOptions, build_report
from orchestrator.report import load as report_load
from tests.unit.report.test_report_build import write_campaign


@pytest.fixture
def memory_fs(monkeypatch):
    """`mem://<path>` URIs served by an in-memory pyarrow filesystem (the stand-in for s3:// or gs://)."""
    fsspec = pytest.importorskip("fsspec")
    import pyarrow.fs as pafs

    mem = fsspec.filesystem("memory")
    mem.store.clear()
    mem.pseudo_dirs.clear()
    mem.pseudo_dirs.append("")
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(mem))
    real = report_load._filesystem_from_uri

    def from_uri(uri: str):
        if uri.startswith("mem://"):
            return fs, "/" + uri.removeprefix("mem://").strip("/")
        return real(uri)

    monkeypatch.setattr(report_load, "_filesystem_from_uri", from_uri)
    yield fs
    mem.store.clear()


def _upload(fs, local, remote: str) -> None:
    for p in sorted(local.rglob("*")):
        target = f"{remote}/{p.relative_to(local).as_posix()}"
        if p.is_dir():
            fs.create_dir(target, recursive=True)
        else:
            with fs.open_output_stream(target) as f:
                f.write(p.read_bytes())


def test_report_from_a_uri_equals_the_local_report(tmp_path, memory_fs):
    local = write_campaign(tmp_path / "camp", effects={"C1": 0.0, "C4": 0.02}, seeds=range(4), sepa=("C4",),
                           npz=True, rows={"C1_s3": 9})
    want = build_report(local, ReportOptions(out_dir=tmp_path / "local_out", figures=False))
    memory_fs.create_dir("/bucket/camp", recursive=True)
    _upload(memory_fs, local, "/bucket/camp")
    shutil.rmtree(local)  # nothing local is left to read: the report can only read the URI
    got = build_report("mem://bucket/camp", ReportOptions(out_dir=tmp_path / "uri_out", figures=False))
    assert got.missing == want.missing and got.groups == want.groups and got.step == want.step
    for name, table in want.tables.items():
        pd.testing.assert_frame_equal(got.tables[name], table, check_exact=False, rtol=1e-12)
    assert len(got.tables["mechanistic"][got.tables["mechanistic"].source.str.startswith("tokens")]) == 2
    assert (tmp_path / "uri_out" / "report.md").is_file()
    with pytest.raises(ValueError, match="is a URI: give out_dir"):
        build_report("mem://bucket/camp")


def test_report_cli_reads_uri_storage_and_writes_the_report_next_to_it(tmp_path, capsys):
    store_dir = tmp_path / "store"
    write_campaign(store_dir / "syn", effects={"C1": 0.0, "C2": 0.03}, seeds=range(3))
    f = tmp_path / "syn.yaml"
    f.write_text(yaml.safe_dump({"name": "syn", "seeds": [0, 1, 2], "conditions": {"C1": {}, "C2": {}},
                                 "storage": f"file://{store_dir}"}))
    assert cli.main(["report", str(f)]) == 0
    out = capsys.readouterr().out
    assert f"report: file://{store_dir}/syn/report/report.md" in out
    assert (store_dir / "syn" / "report" / "report.md").is_file()
    assert (store_dir / "syn" / "report" / "deltas.csv").is_file()
    assert (store_dir / "syn" / "report" / "learning_curves.png").is_file()
    # a URI campaign that has not run: one line, exit 2
    f2 = tmp_path / "new.yaml"
    f2.write_text(yaml.safe_dump({"name": "new", "seeds": [0], "conditions": {"C1": {}},
                                  "storage": f"file://{store_dir}"}))
    assert cli.main(["report", str(f2)]) == 2
    assert "has not run yet" in capsys.readouterr().err
