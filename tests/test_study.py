"""Study plans: validation, expansion, the resumable store, local and Ray runs, kills and failures."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from af1.errors import Af1Error
from af1.report.markup import folded_warnings
from af1.study import expand, load_plan, run_study
from af1.study.plan import StudyPlan
from af1.study.report import collect
from af1.study.store import Store
from af1.tasks.spec import TaskSpec

from cli_helpers import run_cli
from conftest import fitted_tiny_model

pytestmark = pytest.mark.slow  # whole studies on fitted tiny models, on Ray and with two runners: minutes

TASKS = [TaskSpec(operation="a+b", shots=1, n=30), TaskSpec(operation="a-b", shots=1, n=30)]
EXPERIMENTS = """
experiments:
  eval: {}
  search: {threshold: 0.5}
  necessity: {windows: [1, 2]}
  styles: {styles: [original, verbal]}
  heads: {k: 2, draws: 2}
  positional: {window: 32, n_windows: 2}
  transfer: {}
"""


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """Two tiny models of different families and depths that solve both tasks, saved as model directories."""
    root = tmp_path_factory.mktemp("study-models")
    dirs = {}
    for family, layers in (("llama", 3), ("qwen2", 4)):
        model = fitted_tiny_model(family, TASKS, tokenizer, n_layers=layers)
        dirs[family] = root / family
        model.save_pretrained(dirs[family])
        tokenizer.save_pretrained(dirs[family])
    return dirs


def write_plan(path: Path, dirs: dict[str, Path], extra_models: str = "", experiments: str = EXPERIMENTS) -> Path:
    path.write_text(
        "name: tiny\nmodels:\n"
        + "".join(f"  - {{spec: {d}, name: tiny-{family}}}\n" for family, d in dirs.items())
        + extra_models
        + "tasks:\n"
        + "".join(f"  - {{operation: '{t.operation}', shots: {t.shots}, n: {t.n}}}\n" for t in TASKS)
        + experiments
    )
    return path


def results(out: Path) -> dict[str, Any]:
    return Store(out).results()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Every study here on one thread, as each Ray actor (its `cpus`) and each runner started here (AF1_THREADS) runs:
    a matrix product's last bits depend on the thread count, and the runs are compared with each other bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AF1_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def local_run(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("study-local")
    plan = write_plan(root / "plan.yaml", tiny_dirs)
    summary = run_study(load_plan(plan), root / "out")
    return plan, root / "out", summary


def test_plan_files_validate_and_expand(tmp_path, tiny_dirs, monkeypatch):
    yaml_plan = load_plan(write_plan(tmp_path / "p.yaml", tiny_dirs))
    toml = tmp_path / "p.toml"
    toml.write_text(
        'name = "tiny"\n'
        + "".join(f'[[models]]\nspec = "{d}"\nname = "tiny-{f}"\n' for f, d in tiny_dirs.items())
        + "".join(f'[[tasks]]\noperation = "{t.operation}"\nshots = {t.shots}\nn = {t.n}\n' for t in TASKS)
        + "[experiments.eval]\n[experiments.search]\nthreshold = 0.5\n[experiments.necessity]\nwindows = [1, 2]\n"
        + '[experiments.styles]\nstyles = ["original", "verbal"]\n[experiments.heads]\nk = 2\ndraws = 2\n'
        + "[experiments.positional]\nwindow = 32\nn_windows = 2\n[experiments.transfer]\n"
    )
    assert load_plan(toml) == yaml_plan

    units = expand(yaml_plan)
    ids = [u.id for u in units]
    assert len(ids) == len(set(ids)) == 2 * (2 * 5 + 1) + 2 * 2  # the search needs no grid; transfer per task
    by_id = {u.id: u for u in units}
    for unit in units:  # every unit comes after what it reads
        assert all(ids.index(d) < ids.index(unit.id) for d in unit.deps)
    search = by_id["tiny-llama/a+b.original.1d.1shot.n30/search"]
    assert not any(d.endswith("/sweep") for d in search.deps)
    transfer = by_id["tiny-qwen2/a+b.original.1d.1shot.n30/transfer"]
    assert set(transfer.deps) == {f"tiny-{m}/a+b.original.1d.1shot.n30/search" for m in ("llama", "qwen2")}

    # a changed option changes that unit's key and the keys of the units that read it, nothing else
    changed = yaml_plan.model_copy(deep=True)
    changed.experiments.search = changed.experiments.search.model_copy(update={"threshold": 0.6})
    new = {u.id: u.key for u in expand(changed)}
    moved = {i for i in ids if new[i] != by_id[i].key}
    # (heads reads the search to place its top heads among the AF1 stages)
    assert moved == {i for i in ids if i.endswith(("/search", "/necessity", "/styles", "/heads", "/transfer"))}
    # a result schema that changes makes its units (and those that read them) stale: never read as the new one
    from af1.experiments import REGISTRY
    from af1.study import plan as plans

    plans.result_schema.cache_clear()
    monkeypatch.setattr(REGISTRY["search"].Result, "model_json_schema", classmethod(lambda cls: {"older": 1}))
    stale = {u.id: u.key for u in expand(yaml_plan)}
    plans.result_schema.cache_clear()
    monkeypatch.undo()
    assert {i for i in ids if stale[i] != by_id[i].key} == moved
    assert {u.id: u.key for u in expand(yaml_plan)} == {i: by_id[i].key for i in ids}
    # resources do not change results, so they do not change keys
    more = yaml_plan.model_copy(deep=True)
    more.models[0].gpus = 1
    assert {u.id: u.key for u in expand(more)} == {i: by_id[i].key for i in ids}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [{spec: x}]\nexperiments: {nope: {}}", "experiments.nope: unknown key"),
        ("models: [{spec: a/x}, {spec: b/x}]\nexperiments: {eval: {}}", "model names must differ"),
        ("models: [{spec: x}]\nstyles: [shouting]\nexperiments: {eval: {}}", "unknown styles"),
        ("models: [{spec: x}]\nexperiments: {}", "name at least one of"),
        ("models: [{spec: x}]\ntasks: [{operation: 'a/b'}]\nexperiments: {eval: {}}", "unknown task 'a/b'"),
        ("models: [{spec: x}]\nexperiments: {styles: {wait: 3}}", "give both wait and transfer"),
        ("models: [{spec: x, name: 'a b'}]\nexperiments: {eval: {}}", "letters, digits"),
        ("- just a list", "expected a mapping"),
        ("models: [", "not valid YAML"),
    ],
)
def test_bad_plans_are_one_line_errors(tmp_path, capsys, text, message):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(Af1Error, match="plan .*" + message.split(":")[0]):
        load_plan(path)
    code, _, err = run_cli(capsys, "study", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(Af1Error, match=r"expected a \.yaml"):
        load_plan(path.rename(tmp_path / "plan.json"))


def test_local_study_writes_every_unit_and_the_cross_model_report(local_run):
    plan, out, summary = local_run
    assert summary.failed == [] and summary.skipped == [] and len(summary.ran) == len(summary.units) == 26
    report = json.loads((out / "report.json").read_text())
    assert report["n_done"] == 26 and report["n_failed"] == 0
    assert {(r["model"], r["task"]) for r in report["faithfulness"]} == {
        (f"tiny-{m}", f"{t}.original.1d.1shot.n30") for m in ("llama", "qwen2") for t in ("a+b", "a-b")
    }
    for rows in report["transfer"].values():  # each model's config on every model, by both mappings
        assert {(r["source"], r["target"]) for r in rows} == {
            (s, t) for s in ("tiny-llama", "tiny-qwen2") for t in ("tiny-llama", "tiny-qwen2")
        }
        for r in rows:
            if r["source"] == r["target"]:
                assert r["absolute"] == r["relative"]  # the diagonal is the model's own config
    faith = {(r["model"], r["task"]): r["faithfulness"]["value"] for r in report["faithfulness"]}
    for task, rows in report["transfer"].items():
        for r in rows:
            if r["source"] == r["target"]:
                assert r["absolute"]["faithfulness"]["value"] == faith[r["source"], task]
    record = json.loads((out / "units/tiny-llama/a+b.original.1d.1shot.n30/search/unit.json").read_text())
    assert record["state"] == "done" and len(record["key"]) == 64
    assert record["provenance"]["model"]["source"] == "directory" and record["provenance"]["task"]["n"] == 30
    overlap = {(r["model"], r["task_a"], r["task_b"]): r for r in report["heads_overlap"]}
    assert set(overlap) == {
        (f"tiny-{m}", "a+b.original.1d.1shot.n30", "a-b.original.1d.1shot.n30") for m in ("llama", "qwen2")
    }
    assert all(r["k"] == 2 and 0 <= r["top_k_overlap"] <= 1 for r in overlap.values())
    html = (out / "report.html").read_text()
    assert "Transfer on" in html and "tiny-qwen2" in html and 'class="af1-plot"' in html
    assert "cannot show" not in html and html.count("<h3>Base accuracy") == 4  # every unit's section, eval's too
    assert "No figure" not in html  # every figure read its typed result
    assert html.count('class="af1-plot"') >= 5  # positional's figure among them
    assert '<table class="sortable">' in html  # the cross-model tables sort by a header click
    assert "peak RSS" in html and all(r["peak_rss_mb"] > 0 for r in report["units"])  # each unit's process
    estimate = json.loads((out / "estimate.json").read_text())  # the cost said before the run, beside the actual
    assert [e["unit"] for e in estimate["units"]] == [u.id for u in summary.units]
    assert all(r["estimated_seconds"] is not None for r in report["units"]) and "estimated before the run" in html
    assert {e["basis"] for e in estimate["units"]} == {"measured", "assumed"}  # before any eval: solved assumed
    styles = results(out)["tiny-llama/a+b.original.1d.1shot.n30/styles"]
    verbal = [r for r in styles["rows"] if r["style"] == "verbal"]  # fitted on the original style only
    measured = [r for r in styles["rows"] if "faithfulness" in r]  # each measured row makes its claim, one family,
    judged = [r for r in measured if r["measured_on"] != "the search's confirmation split"]  # but the search's own
    assert len(judged) == len(measured) - 1
    assert [c["subject"] for c in styles["claims"]] == [f"{r['style']} {r['operation']}" for r in judged]
    assert all(c["kind"] == "style_keeps" and c["family"].startswith("styles at L_wait") for c in styles["claims"])
    # with the end of the answer checked it may solve none of them: that row is a one-line error, not a number
    assert verbal and all(
        r["base_accuracy"]["value"] < 0.5 if "base_accuracy" in r else "solves none" in r["error"] for r in verbal
    ), verbal

    every = results(out)  # a result carries the warnings of the results it was built from, once each, shown
    search_warnings = every["tiny-llama/a+b.original.1d.1shot.n30/search"]["warnings"]
    necessity_warnings = every["tiny-llama/a+b.original.1d.1shot.n30/necessity"]["warnings"]
    assert search_warnings and set(search_warnings) <= set(necessity_warnings)
    assert len(necessity_warnings) == len(set(necessity_warnings)) and 'class="warnings"' in html

    again = run_study(load_plan(plan), out)
    assert again.ran == [] and len(again.skipped) == 26
    assert json.loads((out / "estimate.json").read_text()) == estimate  # each unit's estimate from before it ran

    # a changed plan reads the old records as stale, never as its own results
    changed = load_plan(plan)
    changed.experiments.search = changed.experiments.search.model_copy(update={"threshold": 0.6})
    tables, _ = collect(Store(out), expand(changed))
    states = {r["id"]: r["state"] for r in tables["units"]}
    assert states["tiny-llama/a+b.original.1d.1shot.n30/search"] == "stale"
    assert states["tiny-llama/a+b.original.1d.1shot.n30/eval"] == "done"
    assert tables["faithfulness"] == [] and tables["transfer"] == {} and tables["n_done"] == 4 + 2  # eval, positional


def test_a_result_this_af1_cannot_read_is_shown_stale_with_why_never_dropped(local_run, tmp_path):
    plan, out, _ = local_run
    shutil.copytree(out, tmp_path / "out")
    unit_id = "tiny-llama/a+b.original.1d.1shot.n30/eval"
    records = (tmp_path / "out" / "units").rglob("unit.json")
    path = next(p for p in records if json.loads(p.read_text())["id"] == unit_id)
    record = json.loads(path.read_text())
    del record["result"]["base_accuracy"]  # as written by an af1 whose eval result had other fields
    path.write_text(json.dumps(record))
    tables, _ = collect(Store(tmp_path / "out"), expand(load_plan(plan)))
    row = next(r for r in tables["units"] if r["id"] == unit_id)
    assert row["state"] == "stale" and "does not fit" in row["error"]


def test_ray_gives_the_same_results_as_local(local_run, tmp_path):
    plan, local_out, _ = local_run
    summary = run_study(load_plan(plan), tmp_path / "ray", ray=True, ray_init={"num_cpus": 2})
    assert summary.failed == [] and len(summary.ran) == 26
    assert results(tmp_path / "ray") == results(local_out)
    workers: dict[str, set[tuple[int, int]]] = {}
    for record in (tmp_path / "ray" / "units").rglob("unit.json"):
        data = json.loads(record.read_text())
        workers.setdefault(data["model"], set()).add((data["worker"]["pid"], data["worker"]["model_loads"]))
    assert workers.keys() == {"tiny-llama", "tiny-qwen2"}
    pids = {model: {pid for pid, _ in seen} for model, seen in workers.items()}
    assert all(len(p) == 1 for p in pids.values()) and pids["tiny-llama"] != pids["tiny-qwen2"]  # one actor each
    assert all(loads <= 1 for seen in workers.values() for _, loads in seen)  # the model loaded once
    assert os.getpid() not in pids["tiny-llama"]


def test_a_study_outlives_the_ray_node_its_units_run_on(local_run, tmp_path):
    """Two Ray nodes on this machine (Ray's own test cluster): the node holding both models' actors is removed once
    its first unit has finished; the actors start again on the other node, the study ends with the local run's
    results, and every record is whole."""
    from ray.cluster_utils import Cluster

    plan, local_out, _ = local_run
    out = tmp_path / "ray"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's node runs no unit
    first = cluster.add_node(num_cpus=2)
    ran: dict[str, Any] = {}
    study = threading.Thread(
        target=lambda: ran.update(summary=run_study(load_plan(plan), out, ray=True, ray_address=cluster.address))
    )
    study.start()
    try:
        deadline = time.monotonic() + 300
        while study.is_alive() and time.monotonic() < deadline and not _finished_units(out):
            time.sleep(0.1)
        finished_before = _finished_units(out)
        cluster.add_node(num_cpus=2)
        cluster.remove_node(first)
        study.join(timeout=600)
    finally:
        cluster.shutdown()
    assert 0 < finished_before < 26  # the node went away while units were still to run
    summary = ran["summary"]
    assert summary.failed == [] and len(summary.ran) == 26
    assert results(out) == results(local_out)
    records = [json.loads(p.read_text()) for p in (out / "units").rglob("unit.json")]
    assert len(records) == 26 and all(r["state"] in ("done", "not_applicable") for r in records)
    assert not list(out.rglob(".*.json.*"))  # no temp file of an interrupted write left behind
    pids: dict[str, set[int]] = {}
    for r in records:
        pids.setdefault(r["model"], set()).add(r["worker"]["pid"])
    assert any(len(p) == 2 for p in pids.values())  # an actor was started again, in a new process


def _finished_units(out: Path) -> int:
    """Units whose record says they ended (done, not applicable or failed), as the runner wrote them so far."""
    count = 0
    for path in (out / "units").rglob("unit.json"):
        try:
            count += json.loads(path.read_text()).get("state") in ("done", "not_applicable", "failed")
        except (OSError, ValueError):  # written atomically, but a rename may land between glob and read
            continue
    return count


PART = """
experiments:
  eval: {}
  search: {threshold: 0.5}
  necessity: {windows: [1, 2]}
  heads: {k: 2, draws: 2}
"""  # a part of the local run's plan (one model): 8 units, each with the same result as there


def test_a_killed_study_reruns_only_the_missing_units(local_run, tiny_dirs, tmp_path):
    _, local_out, _ = local_run
    plan = write_plan(tmp_path / "plan.yaml", {"llama": tiny_dirs["llama"]}, experiments=PART)
    out = tmp_path / "out"
    env = {**os.environ, "AF1_NO_PROGRESS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "af1.cli", "study", str(plan), "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    done: dict[str, int] = {}
    leased: list[Path] = []
    while not (done and leased) and time.monotonic() < deadline and proc.poll() is None:
        for record in (out / "units").rglob("unit.json") if (out / "units").is_dir() else []:
            data = json.loads(record.read_text())
            if data["state"] == "done":
                done[data["id"]] = record.stat().st_mtime_ns
        if done:  # frozen while looking, so that the lease seen is the one it holds when killed
            proc.send_signal(signal.SIGSTOP)
            leased = list((out / "units").rglob("lease.json"))
            if not leased:
                proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert done and len(done) < len(expand(load_plan(plan))), "the kill came after the first unit and before the last"
    held = {p.parent.relative_to(out / "units").as_posix() for p in (out / "units").rglob("lease.json")}
    assert len(held) == 1, "the killed runner held the unit it was running"
    done = {}
    for record in (out / "units").rglob("unit.json"):
        data = json.loads(record.read_text())
        if data["state"] == "done":
            done[data["id"]] = record.stat().st_mtime_ns

    summary = run_study(load_plan(plan), out)
    assert set(summary.skipped) == set(done) and set(summary.ran) == {u.id for u in summary.units} - set(done)
    for unit_id, mtime in done.items():
        assert (out / "units" / unit_id / "unit.json").stat().st_mtime_ns == mtime
    local = results(local_out)
    assert len(results(out)) == len(summary.units) and results(out) == {unit: local[unit] for unit in results(out)}
    (taken,) = held  # the next runner took the dead runner's lease over, said so in the record, and left none
    record = json.loads((out / "units" / taken / "unit.json").read_text())
    assert f"its process {proc.pid} on this host has ended" in record["took_over"]
    assert not list((out / "units").rglob("lease.json"))


def test_two_runners_on_one_store_compute_each_unit_once(local_run, tiny_dirs, tmp_path):
    """Two `af1 study` of one plan on one store at once: they split the units (each computed by one of them, the
    runners' own counts add up), wait for each other's inputs, and end with the results of one run."""
    _, local_out, _ = local_run
    plan = write_plan(tmp_path / "plan.yaml", {"llama": tiny_dirs["llama"]}, experiments=PART)
    units = len(expand(load_plan(plan)))
    out = tmp_path / "out"
    env = {**os.environ, "AF1_NO_PROGRESS": "1"}
    command = [sys.executable, "-m", "af1.cli", "study", str(plan), "--out", str(out)]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    said = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    counts = []
    for stdout, _ in said:
        words = " ".join(stdout.split())
        ran = int(words.split(" units ran")[0].rsplit(" ", 1)[-1])
        others = words.split("were already done, ")[1]
        by_others = int(others.split(" ")[0]) if "by another runner" in others else 0
        counts.append((ran, by_others))
    assert units == 8 and sum(ran for ran, _ in counts) == units, counts  # every unit once, by one or the other
    assert all(ran + by_others == units for ran, by_others in counts), counts  # and the other says it saw it done
    assert all(ran > 0 for ran, _ in counts), counts  # both did work
    pids = {json.loads(p.read_text())["worker"]["pid"] for p in (out / "units").rglob("unit.json")}
    assert pids == {p.pid for p in procs}
    local = results(local_out)
    assert len(results(out)) == units and results(out) == {unit: local[unit] for unit in results(out)}
    assert not list((out / "units").rglob("lease.json"))


def test_a_stale_lease_from_another_host_is_taken_over_after_its_timeout(local_run, tmp_path):
    """A unit leased by a runner on another host that stopped beating is waited for until the lease's timeout, then
    taken over and said so; a live lease is left alone (`Leases` in one process: two runners)."""
    from af1.study.leases import Leases

    plan, local_out, _ = local_run
    out = tmp_path / "out"
    shutil.copytree(local_out, out)
    unit_dir = out / "units" / "tiny-qwen2" / "a-b.original.1d.1shot.n30" / "heads"
    (unit_dir / "unit.json").unlink()
    beat = time.time()
    lease = {"host": "another-host", "pid": 1, "runner": "elsewhere", "started": "then", "beat": beat}
    (unit_dir / "lease.json").write_text(json.dumps(lease))
    import datetime as dt

    os.utime(unit_dir / "lease.json", (beat, beat))  # its last heartbeat: now
    summary = run_study(load_plan(plan), out, lease_timeout_s=3)
    assert summary.ran == ["tiny-qwen2/a-b.original.1d.1shot.n30/heads"]
    record = json.loads((unit_dir / "unit.json").read_text())
    started = dt.datetime.fromisoformat(record["started"]).timestamp()
    assert started >= int(beat) + 3  # started only once the lease had gone 3 s without a heartbeat
    assert "runner elsewhere (pid 1 on another-host)" in record["took_over"] and "no heartbeat" in record["took_over"]
    assert results(out) == results(local_out) and not (unit_dir / "lease.json").exists()

    with Leases(timeout_s=1, heartbeat_s=0.1) as first, Leases(timeout_s=1) as second:
        assert first.take(unit_dir) == (True, None)
        time.sleep(1.5)  # longer than the timeout: the heartbeat keeps it
        taken, why = second.take(unit_dir)
        assert not taken and f"runner {first.me['runner']}" in str(why)
        first.release(unit_dir)
        assert second.take(unit_dir) == (True, None)
    assert not (unit_dir / "lease.json").exists()  # given back on leaving


def test_a_stored_result_this_af1_would_not_write_is_run_again(local_run, tmp_path):
    """A unit whose stored result does not fit its experiment's Result (a field an older af1 wrote) is not taken
    as done: it runs again, and only it."""
    plan, local_out, _ = local_run
    out = tmp_path / "out"
    shutil.copytree(local_out, out)
    record_path = next(p for p in sorted((out / "units").rglob("unit.json")) if "/eval/" not in str(p))
    record = json.loads(record_path.read_text())
    assert record["state"] == "done"
    record["result"]["field_of_an_older_af1"] = 1
    record_path.write_text(json.dumps(record))
    summary = run_study(load_plan(plan), out)
    assert summary.ran == [record["id"]]
    assert results(out) == results(local_out)


def test_a_unit_that_needs_no_model_describes_it_as_its_dependency_did(local_run, tiny_dirs, tmp_path):
    """A gated analysis whose search chose no cell is not applicable without loading the model, and records the model
    as the search that loaded it did (source, path, type, layers): its provenance does not depend on what ran before
    it in the same process."""
    _, local_out, _ = local_run
    out = tmp_path / "out"
    shutil.copytree(local_out, out)
    gated = "experiments:\n  search: {threshold: 0.5}\n  necessity: {windows: [1, 2], require_found: true}\n"
    plan = write_plan(tmp_path / "plan.yaml", {"llama": tiny_dirs["llama"]}, experiments=gated)
    searches = sorted((out / "units" / "tiny-llama").glob("*/search/unit.json"))
    for path in searches:  # as a search whose every cell missed on its selection split writes it
        search = json.loads(path.read_text())
        path.write_text(json.dumps({**search, "result": {**search["result"], "chosen": False}}))
    summary = run_study(load_plan(plan), out)
    assert len(searches) == 2 and sorted(summary.ran) == sorted(u.id for u in summary.units if "/necessity" in u.id)
    for path in searches:
        record = json.loads((path.parent.parent / "necessity" / "unit.json").read_text())
        search = json.loads(path.read_text())
        assert record["state"] == "not_applicable" and record["worker"]["model_loads"] == 0
        assert record["provenance"]["model"] == search["provenance"]["model"]
        assert search["provenance"]["model"]["source"] == "directory" and search["provenance"]["model"]["n_layers"] == 3


def test_a_failing_unit_is_recorded_and_the_rest_complete(tiny_dirs, tmp_path, capsys):
    broken = "  - {spec: /nonexistent/model-dir, name: broken}\n"
    experiments = "experiments:\n  eval: {}\n  search: {threshold: 0.5}\n  transfer: {}\n"
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs, broken, experiments)
    code, out, err = run_cli(capsys, "study", str(plan), "--out", str(tmp_path / "out"))
    assert code == 1 and err.strip().splitlines() == [
        f"af1: 6 of 18 units failed: see {tmp_path / 'out' / 'report.html'}"
    ]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    states = {r["id"]: (r["state"], r["error"]) for r in report["units"]}
    for unit_id, (state, error) in states.items():
        if unit_id.startswith("broken/"):
            assert state == "failed"
            assert "unknown model path: /nonexistent/model-dir" in error or "which did not finish" in error
        else:
            assert state == "done", (unit_id, error)
    transfer = results(tmp_path / "out")["tiny-llama/a+b.original.1d.1shot.n30/transfer"]
    assert transfer["missing_sources"] == ["broken/a+b.original.1d.1shot.n30/search"]
    assert len(transfer["rows"]) == 2
    # a rerun redoes the failed units only
    code, out, _ = run_cli(capsys, "study", str(plan), "--out", str(tmp_path / "out"))
    assert code == 1 and "6 units ran, 12 were already done, 6 failed" in " ".join(out.split())


def test_the_search_command_prints_its_warnings_folded(tiny_dirs, capsys):
    args = ["--model", str(tiny_dirs["llama"]), "--task", "a+b", "--shots", "1", "--n", "30"]
    code, out, err = run_cli(capsys, "search", *args, "--threshold", "0.5", "--json")
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert any("CAMA means over fewer than 5 other problems" in w for w in warnings)
    shown = folded_warnings(warnings)  # a warning repeated for each answer step is said once, naming the steps
    assert all(f"warning: {w}\n" in err for w in shown), err
    assert all(w in shown or any(w.split(": ", 1)[1][:40] in v for v in shown) for w in warnings)


def test_warnings_that_differ_only_in_their_step_are_folded_for_the_reader():
    warnings = [
        "9 problems left out",
        "step 0: CAMA means over fewer than 5 other problems at positions [78, 81] for 9 of 9 solved problems",
        "step 0: at 4 pairs no other problem has the token",
        "step 1: CAMA means over fewer than 5 other problems at positions [78, 81, 93] for 7 of 9 solved problems",
        "step 2: a warning only this step has",
    ]
    assert folded_warnings(warnings) == [
        "9 problems left out",
        "steps 0, 1: CAMA means over fewer than 5 other problems at positions [78, 81] for 9 of 9 solved problems "
        "(at step 0; the others alike)",
        "step 0: at 4 pairs no other problem has the token",
        "step 2: a warning only this step has",
    ]


def test_the_search_command_that_cannot_confirm_prints_its_numbers_and_what_it_measured(tiny_dirs, capsys):
    """A threshold no exact test can confirm (1.0): the verdict is not confirmed, with the judged cell's rate, interval,
    n and constant guess, why no n decides it, and how little of the grid the search measured."""
    args = ["--model", str(tiny_dirs["llama"]), "--task", "a+b", "--shots", "1", "--n", "30"]
    code, out, _ = run_cli(capsys, "search", *args, "--threshold", "1.0", "--with", "search.ablation=zero")
    assert code == 0
    line = " ".join(out.split())
    assert line.startswith("not confirmed: an AF1 subgraph at faithfulness >= 1.0 (L_wait "), line
    assert re.search(r"\(\d\.\d{3} \[\d\.\d{2}, \d\.\d{2}\], n \d+; baseline \d\.\d{3}; p [\d.e-]+\)", line), line
    assert "no n decides it at this estimate" in line
    measured = re.search(r"Measured (\d+) cells on the selection split.*: (\d+) \(problem, cell\) pairs", line)
    assert measured and 0 < int(measured[1]) < 10 and "of the whole grid's 300" in line, line


def test_a_resumed_sweep_returns_the_cells_asked_for_and_says_how_many_it_reused(
    tiny_dirs, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("AF1_NO_PROGRESS")  # the count is said on the progress lines
    args = ["--model", str(tiny_dirs["llama"]), "--task", "a+b", "--shots", "1", "--n", "30", "--out", str(tmp_path)]
    code, out, _ = run_cli(capsys, "sweep", *args, "--json")
    full = json.loads(out)
    assert code == 0 and full["n_cells"] == 10
    code, out, err = run_cli(capsys, "sweep", *args, "--max-transfer", "1", "--json")
    capped = json.loads(out)
    assert code == 0 and capped["n_cells"] == 7 and "sweep: resumed 7 of its 7 cells" in err
    for w, row in enumerate(capped["faithfulness_wait_transfer"]):
        for k, value in enumerate(row):
            assert value == (full["faithfulness_wait_transfer"][w][k] if k <= 1 else None)


@pytest.mark.parametrize("command", [["eval"], ["run", "--wait", "1", "--transfer", "1"], ["search"]])
def test_each_stage_of_a_command_reports_its_progress_once_with_the_time_left(tiny_dirs, capsys, monkeypatch, command):
    import af1.progress

    monkeypatch.delenv("AF1_NO_PROGRESS")
    monkeypatch.setattr(af1.progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(af1.progress, "LOG_EVERY_SECONDS", 0.0)
    args = ["--model", str(tiny_dirs["llama"]), "--task", "a+b", "--shots", "1", "--n", "30"]
    code, _, err = run_cli(capsys, *command, *args, "--json")
    assert code == 0
    lines = [line.removeprefix("af1: ") for line in err.splitlines() if line.startswith("af1: ")]
    ended = [line.split(": ")[0] for line in lines if re.search(r": \d+/\d+ done in [\d.]+ s$", line)]
    assert "evaluate" in ended and len(ended) == len(set(ended)), lines  # every stage ends once
    for line in lines:
        if m := re.fullmatch(r"(.+): (\d+)/(\d+) after \d+ s(.*)", line):
            assert m[1] in ended and m[4].startswith(", about ") and m[4].endswith(" s left"), line


def test_the_report_is_rewritten_while_the_study_runs_and_marked_partial(tiny_dirs, tmp_path, monkeypatch):
    import af1.study.runner as runner

    monkeypatch.setattr(runner, "REPORT_EVERY_S", 0.0)
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs, experiments="experiments:\n  eval: {}\n")
    seen: list[tuple[bool, int]] = []

    def look(unit, outcome) -> None:
        if (tmp_path / "out" / "report.json").is_file():
            report = json.loads((tmp_path / "out" / "report.json").read_text())
            seen.append((report["partial"], report["n_done"]))
            assert "Partial: the study is still running" in (tmp_path / "out" / "report.html").read_text()

    summary = run_study(load_plan(plan), tmp_path / "out", on_end=look)
    assert len(summary.ran) == 4 and [partial for partial, _ in seen] == [True] * 3
    assert [n for _, n in seen] == [1, 2, 3]  # each unit's report holds the units ended so far
    assert json.loads((tmp_path / "out" / "report.json").read_text())["partial"] is False


def test_a_lease_is_renewed_only_by_its_runner_and_an_empty_one_ages(tmp_path):
    """An empty lease (a runner killed while creating it) is as old as its file; a runner whose lease was taken over
    during a stall never renews the taker's lease (it touches only its own file, now gone)."""
    from af1.study.leases import LEASE, Leases

    unit = tmp_path / "unit"
    unit.mkdir()
    (unit / LEASE).write_text("")
    os.utime(unit / LEASE, (time.time() - 10, time.time() - 10))
    with Leases(timeout_s=5) as taker:
        taken, why = taker.take(unit)
        assert taken and "no heartbeat for 10 s" in str(why)
    with Leases(timeout_s=0.5, heartbeat_s=0.05) as stalled, Leases(timeout_s=0.5) as other:
        assert stalled.take(unit) == (True, None)
        stalled.held.clear()  # a stall: no renewal
        time.sleep(0.7)
        taken, why = other.take(unit)
        assert taken and "no heartbeat" in str(why)
        stalled.held.add(unit)  # it wakes up and beats again
        time.sleep(0.2)
        assert other.holds(unit) and not stalled.holds(unit)


def test_studyplan_default_names_come_from_the_spec():
    plan = StudyPlan.model_validate({"models": [{"spec": "meta-llama/Meta-Llama-3-8B"}], "experiments": {"eval": {}}})
    assert plan.models[0].name == "Meta-Llama-3-8B"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], (False, None)),
        (["--ray"], (True, None)),
        (["--ray", "auto"], (True, "auto")),
        (["--ray", "--out", "o"], (True, None)),
    ],
)
def test_cli_ray_takes_an_optional_address(monkeypatch, tmp_path, capsys, tiny_dirs, args, expected):
    import af1.study
    from af1.study.runner import StudySummary

    calls = []

    def fake(plan, out_dir, ray, ray_address):
        calls.append((ray, ray_address))
        return StudySummary([], [], [], [], Path(out_dir) / "report.html")

    monkeypatch.setattr(af1.study, "run_study", fake)
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs)
    code, out, _ = run_cli(capsys, "study", str(plan), *args)
    assert code == 0 and calls == [expected] and "0 units ran" in out


def test_tasks_that_differ_anywhere_get_their_own_units(tmp_path):
    changes = {
        "n": 5,
        "n_max": 5,
        "seed": 1,
        "answer_digits": "any",
        "allow_negative": True,
        "largest_layout": True,
        "scoring": "first",
        "check_end": False,
    }
    fields = {"operation", "style", "digits", "shots", "file", "file_sha256", *changes}
    assert set(TaskSpec.model_fields) == fields  # the label names all (a file by its name and content hash)
    base = TaskSpec(operation="a-b")
    variants = [base.model_copy(update={name: value}) for name, value in changes.items()]
    plan = StudyPlan.model_validate(
        {"models": [{"spec": "x"}], "tasks": [base, *variants], "experiments": {"eval": {}}}
    )
    assert len({u.id for u in expand(plan)}) == 1 + len(changes)
    files = []
    for place, answer in (("one", "1"), ("two", "2")):  # one name, two contents: two tasks
        path = tmp_path / place / "same.yaml"
        path.parent.mkdir()
        path.write_text(f'template: "{{a}} is"\nslots: {{a: {{values: ["1"]}}}}\nanswer: {{expr: "a + {answer}"}}\n')
        files.append(TaskSpec(file=str(path)))
    plan = StudyPlan.model_validate({"models": [{"spec": "x"}], "tasks": files, "experiments": {"eval": {}}})
    assert len({u.id for u in expand(plan)}) == 2 and files[0].name == files[1].name == "same"
    moved = tmp_path / "three" / "same.yaml"  # the first file's content elsewhere: the same unit (a study moves)
    moved.parent.mkdir()
    moved.write_text((tmp_path / "one" / "same.yaml").read_text())
    keys = [
        {u.key for u in expand(StudyPlan.model_validate({**plan.model_dump(), "tasks": [spec]}))}
        for spec in (files[0], TaskSpec(file=str(moved)))
    ]
    assert keys[0] == keys[1] and TaskSpec(file=str(moved)).file == str(moved.resolve())


def test_ray_missing_is_a_one_line_error(monkeypatch, tmp_path, capsys, tiny_dirs):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs)
    code, out, err = run_cli(capsys, "study", str(plan), "--out", str(tmp_path / "out"), "--ray")
    assert code == 2 and err == "af1: error: af1 study --ray needs Ray: pip install 'af1[ray]'\n" and out == ""
    assert not (tmp_path / "out").exists()


def test_an_unreachable_ray_cluster_is_a_one_line_error(tmp_path, capsys, tiny_dirs):
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs)
    code, out, err = run_cli(capsys, "study", str(plan), "--out", str(tmp_path / "out"), "--ray", "127.0.0.1:1")
    assert code == 2 and err.startswith("af1: error: cannot reach the Ray cluster at 127.0.0.1:1") and out == ""
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_demo_is_a_builtin_plan_that_sets_two_models_side_by_side(tiny_dirs, tmp_path, capsys):
    """The main job's shape on two tiny models: both searches (no grid: that is `--full`'s), each config on the other
    (on the target's confirmation split, beside its own), the analyses only where a search chose a cell, heads placed
    against its stages, paired base accuracy, one report with every section and the wall times; a rerun resumes."""
    from af1.study import demo

    out = tmp_path / "demo"
    said: list[str] = []
    plan = demo.demo_plan([str(tiny_dirs["llama"]), str(tiny_dirs["qwen2"])], TASKS[0], 0.5)
    summary = demo.run_demo(plan, out, said.append)
    assert summary.failed == []
    report = json.loads((out / "report.json").read_text())
    assert said[0] == demo.FOCUSED and report["partial"] is False
    early = [line for line in said if " s: " in line and line.split(" after ")[0] in ("llama", "qwen2")]
    assert len(early) == 2 and all(said.index(e) < said.index(report["verdicts"][0]) for e in early)  # first
    assert len(report["verdicts"]) == 2 and said[3:5] == report["verdicts"] and said[-1].startswith("demo time")
    assert {u.experiment for u in summary.units} == {"eval", "search", "necessity", "heads", "transfer"}
    assert all(
        v.split(": ", 2)[2].startswith(("confirmed", "not confirmed", "rejected", "no AF1 subgraph to judge"))
        and "[" in v
        for v in report["verdicts"]
    )
    rows = report["transfer"]["a+b.original.1d.1shot.n30"]
    with_config = {r["model"] for r in report["faithfulness"] if r["wait"] is not None}
    assert {(r["source"], r["target"]) for r in rows if r["absolute"]} == {
        (s, t) for s in with_config for t in ("llama", "qwen2")
    }
    found = {r["model"]: r["chosen"] for r in report["faithfulness"]}
    states = {r["id"]: r["state"] for r in report["units"]}
    for model, has in found.items():  # the analyses run where a cell was chosen, whatever its confirmation says
        for name in ("necessity", "heads"):
            assert states[f"{model}/a+b.original.1d.1shot.n30/{name}"] == ("done" if has else "not_applicable")
    assert any(found.values()), "a tiny model fitted to the task has a subgraph at threshold 0.5"
    results = Store(out).results()
    for row in rows:
        if row["target"] in with_config and row["absolute"]:  # on the target's confirmation split, beside its own
            assert row["own"]["faithfulness"]["n"] == row["absolute"]["faithfulness"]["n"] == row["n"]
            for by in ("absolute", "relative"):  # each mapping that is not the target's own, tested against it
                own = (row[by]["wait"], row[by]["transfer"]) == (row["own"]["wait"], row["own"]["transfer"])
                claim = row[by].get("vs_own")
                assert (claim is None) == own
                if claim is not None:  # adjusted over the table
                    assert 0 <= claim["p_value"] <= claim["p_adjusted"] <= 1 and claim["family"].startswith("transfer")
    (pair,) = report["base_accuracy_paired"]  # same tokenizer, same problems
    assert pair["models"] == ["llama", "qwen2"] and pair["n"] == 30 and 0 <= pair["p_value"] <= 1
    analysed = next(m for m, has in found.items() if has)
    heads = results[f"{analysed}/a+b.original.1d.1shot.n30/heads"]
    assert heads["placement"] and {p["stage"] for p in heads["placement"]} <= {"wait", "transfer", "compute"}
    from af1.experiments.heads import Options as HeadsOptions

    assert heads["path"] == "wang" and len(heads["knockout"]["accuracy_random_k"]) == HeadsOptions().draws
    assert heads["counterfactual_kind"] != "operator" and heads["second_counterfactual"] is None  # the operand alone
    search = results[f"{analysed}/a+b.original.1d.1shot.n30/search"]
    # heads chosen on the search's selection half, knocked out on its confirmation half
    assert heads["split"]["from"] == "the search's split"
    assert heads["split"]["n_selection"] == search["n_selection"]
    assert heads["knockout"]["n"] == heads["split"]["n_confirmation"] == search["n_confirmation"]
    if search["judged"]["transfer"] > 0:  # the key heads against AF1, on the search's confirmation split
        rows = {r["variant"]: r for r in heads["af1_consistency"]["rows"]}
        assert rows["all heads peek"]["faithfulness"]["value"] == search["judged"]["confirmation"]["value"]
        assert (
            rows["no head peeks"]["peeking"] == 0
            and rows["all heads peek"]["faithfulness"]["n"] == search["n_confirmation"]
        )
        consistency = heads["af1_consistency"]
        chosen = {tuple(h) for h in heads["top_heads"] + heads["key_heads"]}
        for row in (r for r in consistency["rows"] if "random_heads" in r):  # matched: never a chosen head
            top_layers = sorted(layer for layer, _ in consistency["top_heads_in_transfer_layers"])
            assert sum(row["random_matched"].values()) == len(top_layers) * len(row["random_heads"])
            for drawn in row["random_heads"]:
                assert {layer for layer, _ in drawn} <= set(consistency["transfer_layers"])
                assert not chosen & {tuple(h) for h in drawn}
                if row["random_matched"]["nearest layer"] == 0:
                    assert sorted(layer for layer, _ in drawn) == top_layers
    html = (out / "report.html").read_text()
    for heading in ("The AF1 claim per model", "Necessity", "How to read this report", demo.FOCUSED[:40]):
        assert heading in html
    assert "Heads by path patching" in html and "wall time" in html and html.count('class="af1-plot"') >= 4
    again = demo.run_demo(plan, out, said.append)
    assert again.ran == [] and len(again.skipped) == len(summary.units)
    code, text, _ = run_cli(capsys, "demo", "--model", str(tiny_dirs["llama"]), "--show-plan")
    assert code == 0 and "require_found: true" in text and "transfer: {}" in text and "counterfactual: a" in text
    shown = yaml.safe_load(text)
    assert TaskSpec.model_validate(shown["tasks"][0]) == demo.DEMO_TASK  # the command's defaults are the demo's task
    assert "sweep" not in shown["experiments"] and shown["experiments"]["search"] == demo.DEMO_SEARCH
    full = demo.demo_plan(["smollm2"], TASKS[0], full=True)
    names = ("sweep", "components", "alternatives", "prune", "styles", "positional", "groups")
    assert all(getattr(full.experiments, n) is not None for n in names)
    assert full.experiments.groups.by == ["carry", "found"]  # sums with a carry against those without, found groups
    assert full.experiments.heads.rank_both and full.about == demo.FULL  # the operator ranked beside the operand


def test_a_study_evaluates_each_model_and_task_once(tiny_dirs, tmp_path, monkeypatch):
    """eval, the search's setup, the heads study and the cross-model transfer read one evaluation of each model and
    task (issue 15, item 2)."""
    import af1.tasks.evaluation as evaluation

    calls: list[str] = []
    real = evaluation.evaluate

    def counting(model, task, *args, **kwargs):
        calls.append(task.spec.model_dump_json())
        return real(model, task, *args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", counting)  # every evaluation goes through this one
    experiments = "experiments:\n  eval: {}\n  search: {threshold: 0.5}\n  heads: {k: 2, draws: 1}\n  transfer: {}\n"
    plan = write_plan(tmp_path / "plan.yaml", tiny_dirs, experiments=experiments)
    summary = run_study(load_plan(plan), tmp_path / "out")
    assert not summary.failed
    # transfer comes back to each model at the end, the first one reloaded: its evaluations are read back
    assert sum(u.endswith("/transfer") for u in summary.ran) == 2 * len(TASKS)
    assert sorted(calls) == sorted(t.model_dump_json() for t in TASKS for _ in tiny_dirs)  # once per model and task


def test_a_search_with_no_eligible_cell_is_a_finding_not_a_failure(tiny_dirs, tmp_path):
    """necessity still measures the unmodified model; transfer lists the source without a config; an analysis at
    the search's cell (alternatives) does not apply, rather than failing."""
    from af1.study.units import NO_CELL, Worker, run_unit

    one = {"llama": tiny_dirs["llama"]}
    plan = load_plan(
        write_plan(
            tmp_path / "plan.yaml",
            one,
            experiments="experiments:\n  necessity: {windows: [1]}\n  alternatives: {}\n  transfer: {}\n",
        )
    )
    units = {u.experiment: u for u in expand(plan) if u.task == plan.task_specs()[0]}
    worker = Worker(units["necessity"].model)
    searched = run_unit(worker, units["search"], {}, None)  # a real search, read as one whose every cell missed:
    nothing = {**searched, "chosen": False, "found": False, "frontier": []}  # none reached the threshold,
    nothing["judged"] = {**searched["judged"], "eligible": False}  # nor cleared the constant guess
    nec = run_unit(worker, units["necessity"], {units["necessity"].deps[0]: nothing}, None)
    assert nec["no_config"].endswith(NO_CELL) and len(nec["windows"]["1"]) == 3
    transfer = run_unit(worker, units["transfer"], {units["transfer"].deps[0]: nothing}, None)
    assert transfer["rows"] == [] and transfer["sources_without_config"] == {"tiny-llama": NO_CELL}
    search_id = units["alternatives"].deps[0]
    alternatives = worker.run(units["alternatives"], {"id": search_id, "state": "done", "result": nothing})
    assert alternatives["state"] == "not_applicable" and NO_CELL in alternatives["reason"]


def test_an_optional_input_that_failed_is_left_out_a_required_one_fails_the_unit(tiny_dirs, tmp_path):
    """heads reads the search only to place its heads: a failed search leaves heads unplaced, not failed;
    alternatives needs the search's config: it fails, naming the search."""
    from af1.study.units import Worker

    plan = load_plan(
        write_plan(
            tmp_path / "plan.yaml",
            {"llama": tiny_dirs["llama"]},
            experiments="experiments:\n  search: {}\n  heads: {k: 2, draws: 2}\n  alternatives: {}\n",
        )
    )
    units = {u.experiment: u for u in expand(plan) if u.task == plan.task_specs()[0]}
    failed = {"id": units["search"].id, "state": "failed", "error": "boom"}
    worker = Worker(units["heads"].model)
    heads = worker.run(units["heads"], failed)
    assert heads["state"] == "done" and heads["result"]["placement"] is None
    alternatives = worker.run(units["alternatives"], failed)
    assert alternatives["state"] == "failed" and alternatives["error"].startswith(f"needs {units['search'].id}")


GOLDEN = Path(__file__).parent / "golden" / "study_keys.json"  # AF1_GOLDEN=write rewrites it (a schema change)
FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")  # a field name; any other key (a layer, a cell, a model) is data


def key_paths(value: Any, at: str = "") -> set[str]:
    """Every key path of a JSON value: a field by its name, a data key as *, a list's items as []."""
    if isinstance(value, dict):
        out = {at} if not value else set()
        for k, v in value.items():
            out |= key_paths(v, f"{at}.{k if FIELD.match(k) else '*'}")
        return out
    if isinstance(value, list):
        return set().union(*(key_paths(v, f"{at}[]") for v in value)) if value else {f"{at}[]"}
    return {at}


def test_the_results_keep_their_keys_as_the_golden_study_holds_them(local_run):
    """Every result a study writes (one unit of each experiment, and the study's report.json) has exactly the key
    paths of the committed golden file: a field that moves, appears or goes is a schema change, made on purpose by
    rewriting the file (AF1_GOLDEN=write) and said in the change; never by accident."""
    _, out, summary = local_run
    made: dict[str, list[str]] = {}
    for unit in summary.units:
        record = json.loads((out / "units" / unit.id / "unit.json").read_text())
        paths = key_paths(record["result"])
        made[unit.experiment] = sorted(set(made.get(unit.experiment, [])) | paths)
    made["report.json"] = sorted(key_paths(json.loads((out / "report.json").read_text())))
    if os.environ.get("AF1_GOLDEN") == "write":
        GOLDEN.write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    for name in sorted(set(golden) | set(made)):
        gone, new = (
            set(golden.get(name, [])) - set(made.get(name, [])),
            set(made.get(name, [])) - set(golden.get(name, [])),
        )
        assert not gone and not new, (name, sorted(gone), sorted(new))
