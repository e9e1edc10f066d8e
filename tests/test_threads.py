"""Torch's threads: the cores this process may use (affinity, cgroup quota), or --threads / AF1_THREADS."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from af1 import threads

from cli_helpers import run_cli
from conftest import tiny_model


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    threads.CHOSEN.clear()


def test_a_cgroup_quota_caps_the_cores(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_quota(tmp_path) == 1.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_quota(tmp_path) is None
    monkeypatch.setattr(threads, "cgroup_quota", lambda: 0.5)
    cores = len(os.sched_getaffinity(0))
    assert threads.usable_cores() == (1, f"a cgroup CPU quota of 0.5 cores ({cores} in the affinity)")


def test_threads_from_the_flag_the_environment_or_the_cores(tmp_path, tokenizer, capsys, monkeypatch):
    model_dir = tmp_path / "m"
    tiny_model("llama").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    base = ["eval", "--model", str(model_dir), "--n", "8", "--json"]
    code, out, _ = run_cli(capsys, "--threads", "1", *base)
    assert code == 0 and json.loads(out)["provenance"]["threads"] == {"threads": 1, "from": "--threads"}
    assert torch.get_num_threads() == 1
    monkeypatch.setenv("AF1_THREADS", "1")
    code, out, _ = run_cli(capsys, *base)
    assert code == 0 and json.loads(out)["provenance"]["threads"] == {"threads": 1, "from": "AF1_THREADS"}
    monkeypatch.delenv("AF1_THREADS")
    code, out, _ = run_cli(capsys, *base)
    cores, why = threads.usable_cores()
    assert code == 0 and json.loads(out)["provenance"]["threads"] == {"threads": cores, "from": why}
    monkeypatch.setenv("AF1_THREADS", "two")
    code, out, err = run_cli(capsys, *base)
    assert code == 2 and err.strip() == "af1: error: AF1_THREADS must be a positive number of threads, not 'two'"


def test_a_busy_machine_suggests_fewer_threads(monkeypatch):
    """Another process running in every sample: the hint; an idle machine (only the reader runs): none."""
    import subprocess
    import sys

    torch.set_num_threads(2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert "--threads 1" in str(threads.busy_hint())
    finally:
        busy.kill()
        busy.wait()
    from pathlib import Path as RealPath

    class Idle:
        def __init__(self, *args) -> None:
            pass

        def read_text(self) -> str:
            return "0.30 0.50 0.60 1/79 8833"

    monkeypatch.setattr(threads, "Path", Idle)
    assert threads.busy_hint(every_s=0) is None
    assert RealPath is not Idle
