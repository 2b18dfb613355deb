"""Every Python block in README.md and docs/ runs as written.

A newcomer copies a block into a file and runs it: so does this test, one fresh interpreter per
block, from an empty working directory. A block that needs a provider starts the local model or
the replay server itself, the way the page shows. Shell commands are in ``sh`` blocks, which
the CLI tests cover.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_RUN_BUDGET = re.compile(
    r"^```toml\n(# [^\n]*: the controls of ampmeter run\n.*?)^```$", re.S | re.M
)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text("utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def test_the_pages_have_blocks_to_run() -> None:
    assert len(_blocks()) >= 5


@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_block_runs_as_written(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code, "utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


def test_the_run_budget_file_example_reads_as_written(tmp_path: Path) -> None:
    from ampmeter.cli.run.sources import gather

    examples = [m.group(1) for page in PAGES for m in _RUN_BUDGET.finditer(page.read_text("utf-8"))]
    assert examples
    for example in examples:
        (tmp_path / "budget.toml").write_text(example, "utf-8")
        config = gather({}, {}, str(tmp_path / "budget.toml"))
        assert config.limits() and config.prices() and config.ladder() and config.warn_at
