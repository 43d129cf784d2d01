"""Every code block the docs mark ``<!-- runnable -->`` runs as written, in a fresh process."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.scripts import run_python

REPO = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- runnable -->\n```python\n(.*?)\n```", re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for i, code in enumerate(_BLOCK.findall(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(REPO)}#{i}", code))
    return found


BLOCKS = _blocks()


def test_the_docs_have_runnable_blocks() -> None:
    assert {name.split("#")[0] for name, _ in BLOCKS} >= {"docs/index.md", "docs/accelerator.md"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_runnable_block(name: str, code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = run_python([sys.executable, "-c", code], cwd=tmp_path, env=env, timeout=170)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
