"""Run the `af1` command in-process and return (exit code, stdout, stderr)."""

from __future__ import annotations

import sys


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    from af1.cli import main

    old = sys.argv
    sys.argv = ["af1", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err
