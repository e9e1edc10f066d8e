"""The documentation: the generated reference matches the code, the site builds strictly, the README's links
resolve and it stays short."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REGENERATE = "python docs/gen_reference.py"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_cli_reference_is_what_the_generator_writes_now() -> None:
    made = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--stdout"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert made.stdout == committed, f"docs/cli.md is out of date with the registry: run `{REGENERATE}`"


def test_the_layout_lists_every_module_as_the_tree_holds_it() -> None:
    """docs/layout.md's module list (each folder against its budget, each module's lines and docstring) is what
    docs/gen_layout.py makes of the tree now: a new module is listed by regenerating, never by hand."""
    made = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_layout.py"), "--stdout"], cwd=ROOT, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    committed = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert made.stdout == committed, "docs/layout.md's module list is out of date: run `python docs/gen_layout.py`"
    assert "`methods/heads/patching.py`" in committed and "`study/leases.py`" in committed


def test_the_findings_claims_are_what_the_demos_results_decided() -> None:
    """Each generated part of docs/findings.md is the render of its committed data (the demo's, the full demo's),
    and that data holds the results' own claims: every verdict of the search among them, each with a rule and one of
    the three outcomes."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gen_findings", ROOT / "docs" / "gen_findings.py")
    assert spec is not None and spec.loader is not None
    gen_findings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_findings)

    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    kinds: set[str] = set()
    for source, (data_file, _) in gen_findings.SOURCES.items():
        data = json.loads(data_file.read_text())
        assert gen_findings.block_of(text, source) == gen_findings.render(data, source), (
            "docs/findings.md is out of date: run python docs/gen_findings.py"
        )
        assert "af1_subgraph" in {row["claim"]["kind"] for row in data["claims"]}
        assert {row["claim"]["outcome"] for row in data["claims"]} <= {"confirmed", "not confirmed", "rejected"}
        assert len(data["verdicts"]) == 2 and all(row["claim"]["rule"] for row in data["claims"])
        kinds |= {row["claim"]["kind"] for row in data["claims"]}
    # the full demo decides the claims of every analysis it adds
    assert {"component_alone", "style_keeps", "alternative", "necessary_window"} <= kinds
    finetune = json.loads(gen_findings.FINETUNE.read_text())  # the fine-tuning run's own result, rendered whole
    assert gen_findings.block_of(text, "finetune") == gen_findings.render_finetune(finetune), (
        "docs/findings.md is out of date: run python docs/gen_findings.py"
    )
    assert {c["kind"] for c in finetune["claims"]} == {"precise_vs_random", "precise_vs_full"}


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    found = subprocess.run([sys.executable, "-m", "mkdocs", "--version"], capture_output=True, text=True)
    assert found.returncode == 0, "mkdocs is not installed: pip install 'mkdocs>=1.6' (it is in the dev extra)"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr}"


def test_every_relative_link_in_the_readme_points_to_a_file() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert targets, "no relative links found: the pattern no longer matches the README"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 220, f"README.md has {lines} lines; keep it at most 220 (details belong in docs/)"
