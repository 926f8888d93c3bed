"""Every ```python block in README.md and docs/*.md runs, on the host driver, as the docs say it does.

A block whose first line is `# ranks: N` is a script for `python -m iris.run -n N`; any other
block runs alone in a fresh interpreter. A block with the line `# prints: the text block above`
must print that ```text block (compared with whitespace collapsed), so shown output cannot drift
from what iris prints. Blocks are the documentation's promises, so each one
asserts what it shows; a block that only illustrates belongs in a ```text fence instead.
"""
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
RANKS = re.compile(r"\A#\s*ranks:\s*(\d+)\s*$", re.M)
TEXT = re.compile(r"^```text[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
PRINTS = "# prints: the text block above"


def blocks():
    """(id, code, ranks, expected output) for every python block of every page, in page order."""
    out = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        for i, m in enumerate(FENCE.finditer(text)):
            code = m.group(1)
            line = text[:m.start()].count("\n") + 1
            found = RANKS.match(code)
            shown = [t.group(1) for t in TEXT.finditer(text, 0, m.start())]
            expect = shown[-1] if PRINTS in code and shown else None
            assert PRINTS not in code or expect, f"{page.name}:{line} promises a text block above and has none"
            out.append(pytest.param(code, int(found.group(1)) if found else 0, expect, id=f"{page.name}:{line}"))
    return out


def test_docs_exist_and_have_code():
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"programming-model.md", "allocators.md", "porting-from-iris.md", "troubleshooting.md"} <= pages
    assert len(blocks()) >= 10


_PROBE = """
import torch, triton, triton.language as tl
@triton.jit
def k(out, per):
    n = 0
    for s in range(tl.program_id(0) * per, per + 1):
        n += 1
    tl.store(out, n)
k[(1,)](torch.zeros(1, dtype=torch.int32), 1)
"""


@functools.lru_cache(maxsize=None)
def interpreter_loops_from_program_id() -> bool:
    """Whether this Triton's interpreter runs a loop bounded by program_id. Triton 3.6's does not under
    NumPy 2 (it converts a one-element array with int()); the collectives' kernels need it."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=120).returncode == 0


@pytest.mark.parametrize("code,ranks,expect", blocks())
def test_block_runs(code, ranks, expect, tmp_path):
    if "ctx.ccl." in code and not interpreter_loops_from_program_id():
        pytest.skip("this Triton's interpreter cannot run a loop bounded by program_id (Triton 3.6 under NumPy 2); "
                    "the collectives' host blocks need a newer Triton, as CI installs")
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_ALLOCATOR", "IRIS_CHECK_SYMMETRY")}
    env.update(IRIS_PLATFORM="host", TRITON_INTERPRET="1", IRIS_TIMEOUT=os.environ.get("IRIS_TIMEOUT", "60"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "iris.run", "-n", str(ranks), str(script)] if ranks else [sys.executable, str(script)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- code ---\n{code}\n--- output ---\n{proc.stdout}{proc.stderr}"
    if expect is not None:
        assert " ".join(expect.split()) in " ".join(proc.stdout.split()), \
            f"the page shows\n{expect}\nbut the block printed\n{proc.stdout}"
