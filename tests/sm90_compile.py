"""Runs a script that compiles kernels for sm_90 on the host (Triton ships ptxas; no GPU needed) in a
fresh interpreter: Triton's compiler rather than its interpreter, the host platform, every peer direct.
The tests that read the PTX share it."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compiled_output(script: Path, source: str, timeout: int = 600) -> str:
    """Writes source to script, runs it, and returns its stdout; fails the test on a non-zero exit."""
    script.write_text(source)
    env = dict(os.environ, TRITON_INTERPRET="0", IRIS_PLATFORM="host", IRIS_INDIRECT_PEERS="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
