"""iris.device.near sits below rma, atomics, sync and indirect: no import cycle among the device modules
(imports inside functions count), and INDIRECT_PEERS is one object that every reader sees switched."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (import-linter's graph) is not installed")

ROOT = Path(__file__).resolve().parents[1]
READERS = ("rma", "atomics", "sync", "indirect")


def test_device_modules_form_no_cycle():
    graph = grimp.build_graph("iris")
    mods = sorted(m for m in graph.modules if m.startswith("iris.device.") or m == "iris.gluon")
    cycles = [(a, b) for a in mods for b in mods if a < b and graph.find_shortest_chain(importer=a, imported=b)
              and graph.find_shortest_chain(importer=b, imported=a)]
    assert not cycles, f"device modules importing each other: {cycles}"
    below = {m for m in graph.find_modules_directly_imported_by("iris.device.near") if m.startswith("iris.device")}
    assert below <= {"iris.device.nvshmem", "iris.device.faults", "iris.device.translate"}, \
        f"iris.device.near imports {below}: it must stay below rma and indirect"


SWITCH = r'''
import importlib
import iris
from iris.device import indirect
readers = [importlib.import_module("iris.device." + name) for name in %r]
print([bool(m.INDIRECT_PEERS) for m in readers])
indirect.use_indirect_peers()
print([bool(m.INDIRECT_PEERS) for m in readers])
'''


def test_use_indirect_peers_switches_every_reader():
    env = dict(os.environ, IRIS_INDIRECT_PEERS="", IRIS_PLATFORM="host",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", SWITCH % (READERS,)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = proc.stdout.splitlines()[-2:]
    assert before == str([False] * len(READERS)), f"before use_indirect_peers: {before} for {READERS}"
    assert after == str([True] * len(READERS)), f"after use_indirect_peers: {after} for {READERS}"
