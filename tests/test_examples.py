"""Every example runs as its docstring says, `python -m iris.run -n 2 examples/NAME.py`: on the host
driver here, and with both ranks on one GPU where there is one. An example checks its own results
and exits non-zero when they are wrong; its output must come as whole lines, no empty ones.

The examples run one after another under one launcher (tests/script_batch.py): each rank forks every
example from a process that has imported torch only, so each starts as a fresh interpreter would
(its own globals, folder and output, the interpreter's full exit) without paying torch's import
again; the ranks meet between examples. An example that names its parent process (os.getppid(),
which a job's ranks share under a launcher and forked ones do not) runs under a launcher of its own,
and so does every example where there is a GPU."""
import os
import re
from pathlib import Path

import pytest
import torch

import script_batch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9]*.py"))
# The first example's whole output: one line per rank, in either order.
HEAP_BASICS = re.compile(r"rank (\d)/2: heap of \d+ bytes at 0x[0-9a-f]+; a \(peer_view\) and b \(kernel put\) "
                         r"hold rank (\d)'s 1000 values: ok")
# the examples run in one batch made by a module fixture: on one worker, once
pytestmark = pytest.mark.xdist_group("test_examples")


TIMEOUT = 420  # seconds an example may run


def _forkable(example: Path) -> bool:
    """On the host, all but an example that names its parent process; with a GPU, none (each example
    runs alone, as it always has there)."""
    return not torch.cuda.is_available() and "os.getppid()" not in example.read_text()


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """example -> (its script_batch.Ran, the folder it ran in), each from an empty folder of its own; the
    forkable ones in one batch on first use."""
    root, done = tmp_path_factory.mktemp("examples"), {}
    env = {k: v for k, v in os.environ.items() if k not in ("IRIS_ALLOCATOR", "IRIS_CHECK_SYMMETRY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

    def folder(example):
        path = root / example.stem
        path.mkdir()
        return path

    def get(example):
        if not _forkable(example):
            cwd = folder(example)
            done[example] = script_batch.run_alone(str(example), 2, env, str(cwd), TIMEOUT), cwd
        if example not in done:
            batch = [e for e in EXAMPLES if _forkable(e)]
            cwds = [folder(e) for e in batch]
            results = script_batch.run(str(root / "batch"), [(str(e), str(c)) for e, c in zip(batch, cwds)], 2, env,
                                       str(root), TIMEOUT)
            done.update({e: (r, c) for e, r, c in zip(batch, results, cwds)})
        return done[example]
    return get


def test_examples_are_found():
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_runs_on_two_ranks(example, ran):
    """Run from an empty folder, which must stay empty: an example writes only where it says."""
    proc, cwd = ran(example)
    assert proc.code == 0, f"exit {proc.code}\n{proc.out}\n{proc.err[-4000:]}"
    left = sorted(p.name for p in cwd.iterdir())
    assert left == [], f"the example left {left} in its working directory"
    lines = proc.out.split("\n")
    assert lines[-1] == "" and len(lines) > 1 and "" not in lines[:-1], repr(proc.out)
    if example.stem == "00_heap_basics":
        matches = [HEAP_BASICS.fullmatch(line) for line in lines[:-1]]
        assert len(matches) == 2 and all(matches), repr(proc.out)
        assert sorted((int(m[1]), int(m[2])) for m in matches) == [(0, 1), (1, 0)], repr(proc.out)
