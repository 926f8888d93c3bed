"""Every example runs as its docstring says, `python -m iris.run -n 2 examples/NAME.py`: on the host
driver here, and with both ranks on one GPU where there is one. An example checks its own results
and exits non-zero when they are wrong; its output must come as whole lines, no empty ones."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9]*.py"))
# The first example's whole output: one line per rank, in either order.
HEAP_BASICS = re.compile(r"rank (\d)/2: heap of \d+ bytes at 0x[0-9a-f]+; a \(peer_view\) and b \(kernel put\) "
                         r"hold rank (\d)'s 1000 values: ok")


def test_examples_are_found():
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_runs_on_two_ranks(example, tmp_path):
    """Run from an empty folder, which must stay empty: an example writes only where it says."""
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_ALLOCATOR", "IRIS_CHECK_SYMMETRY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "iris.run", "-n", "2", str(example)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [], f"the example left {left} in its working directory"
    lines = proc.stdout.split("\n")
    assert lines[-1] == "" and len(lines) > 1 and "" not in lines[:-1], repr(proc.stdout)
    if example.stem == "00_heap_basics":
        matches = [HEAP_BASICS.fullmatch(line) for line in lines[:-1]]
        assert len(matches) == 2 and all(matches), repr(proc.stdout)
        assert sorted((int(m[1]), int(m[2])) for m in matches) == [(0, 1), (1, 0)], repr(proc.stdout)
