"""One rank of `python -m iris.run`: runs the script as `python script.py args...` would, but an
uncaught exception goes to a file in the job's directory instead of stderr, so the launcher can
show each distinct error once, naming the ranks it happened on.

    python rank_script.py JOB_DIR/rankN script.py args...

Run as a file, not imported: it uses only the standard library, so a rank needs nothing of iris
that the script itself does not import. A chain of Triton interpreter errors (one per device
function call, each repeating the one below) is reduced to one line: the error at the bottom, the
kernel and the device function it happened in, and the line that launched the kernel.
"""
import faulthandler
import json
import os
import runpy
import sys
import time
import traceback

_OWN = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))
_IRIS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _frames(tb):
    return [f for f in traceback.extract_tb(tb)
            if os.path.abspath(f.filename) not in _OWN and not f.filename.startswith("<frozen runpy")]


def _library(filename: str) -> bool:
    return "site-packages" in filename or "dist-packages" in filename or filename.startswith("<")


def _where(frame) -> str:
    return f"{frame.name} ({frame.filename}:{frame.lineno})"


def interpreter_summary(e: BaseException):
    """One line for a Triton interpreter error chain, or None when e is not one."""
    chain = [e]
    while type(chain[-1]).__name__ == "InterpreterError" and chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    if len(chain) < 2:
        return None
    root = chain[-1]
    # each level's traceback holds the device function running at that level, below Triton's frames
    calls = [next((f for f in reversed(_frames(x.__traceback__)) if not _library(f.filename)), None)
             for x in chain[1:]]
    calls = [f for f in calls if f is not None]
    launch = [f for f in _frames(e.__traceback__) if not _library(f.filename)]
    text = f"{type(root).__name__}: {root}" if type(root).__name__ != "DeviceCheckError" else str(root)
    iris_fn = next((f for f in calls if f"{os.sep}iris{os.sep}" in f.filename and not f.name.startswith("_")), None)
    if iris_fn is not None:
        text += f"; in iris's {iris_fn.name}"
    if calls:
        text += f", called by kernel {_where(calls[0])}"
    if launch:
        text += f", launched at {launch[-1].filename}:{launch[-1].lineno}"
    return text


def report(e: BaseException, path: str) -> None:
    """The launcher's record of this rank's uncaught exception."""
    summary = interpreter_summary(e)
    if summary is None:
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        summary = text.splitlines()[-1] if "\n" not in text else text
        tb = "Traceback (most recent call last):\n" + "".join(traceback.format_list(_frames(e.__traceback__)))
        tb += "".join(traceback.format_exception_only(type(e), e))
        if e.__cause__ is not None and not e.__suppress_context__:
            tb = "".join(traceback.format_exception(type(e.__cause__), e.__cause__, e.__cause__.__traceback__)) + \
                 "\nThe above exception was the direct cause of the following exception:\n\n" + tb
    else:
        tb = ""
    if type(e).__name__ == "BootstrapError":  # another rank left or failed: where this one was is enough
        mine = [f for f in _frames(e.__traceback__) if not _library(f.filename) and not f.filename.startswith(_IRIS)]
        summary, tb = summary + (f" (at {mine[-1].filename}:{mine[-1].lineno})" if mine else ""), ""
    record = {"time": time.time(), "type": type(e).__name__, "summary": summary, "traceback": tb,
              "missing": list(getattr(e, "missing", ()) or ())}
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def main() -> int:
    where, script = sys.argv[1], sys.argv[2]  # where: the launcher's path prefix for this rank's reports
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` sets it
    # a rank killed by a signal leaves its Python stack where the launcher reads it
    crash = open(where + ".crash", "w")
    faulthandler.enable(file=crash)
    try:
        runpy.run_path(script, run_name="__main__")
    except KeyboardInterrupt:
        return 130  # Ctrl-C reached the whole job: the launcher says so once
    except SystemExit:
        raise
    except BaseException as e:  # every error the script did not handle, reported once by the launcher
        try:
            report(e, where + ".error.json")
        except Exception:  # the report itself failed: the plain traceback, as Python would print it
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
