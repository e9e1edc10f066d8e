"""The quick-start notebook runs top to bottom (nbclient, a real kernel) and its results render as HTML."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from af1.tasks.spec import TaskSpec

from conftest import fitted_tiny_model

NOTEBOOK = Path(__file__).parent.parent / "examples" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs_and_its_results_render_as_html(tmp_path, tokenizer, monkeypatch):
    spec = TaskSpec(operation="a+b", style="calculate", shots=3, n=30)
    model = fitted_tiny_model("llama", [spec], tokenizer, n_layers=3)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    monkeypatch.setenv("AF1_NOTEBOOK_MODEL", str(tmp_path / "tiny"))
    monkeypatch.setenv("AF1_NOTEBOOK_N", "30")
    monkeypatch.setenv("AF1_NO_PROGRESS", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=dict(os.environ))
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    results = [o for o in outputs if o.get("output_type") == "execute_result"]  # rich's progress lines aside
    shown = [o["data"]["text/html"] for o in results if "text/html" in o.get("data", {})]
    assert len(shown) == 4  # eval, run, sweep and search show themselves
    for html, name in zip(shown, ["eval", "run", "sweep", "search"], strict=True):
        assert html.startswith(f"<iframe title='af1 {name}'"), html[:80]
        assert "constant guess" in html  # its numbers come with their baseline
    grid = shown[2]
    assert "af1-plot" in grid and "plotly" in grid  # the interactive grid, its library inside the frame
    assert "&lt;script src=" not in grid and "&lt;link" not in grid  # plotly.js inline: no file fetched at view time
    last = notebook.cells[-1]["outputs"][0]["data"]["text/plain"]
    verdict = last.strip("'\"")  # the claim's outcome first, in its own words
    assert verdict.startswith(("confirmed", "not confirmed", "rejected", "no cell is eligible")), last
