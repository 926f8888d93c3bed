"""Triton's interpreter, patched once per launch: the host driver's kernels spend most of their time here.

The interpreter swaps triton.language's builtins for interpreted ones when a grid starts, and again at
every call of one @triton.jit function from another (`inspect.getmembers` over tl, tl.tensor and
tl.math each time), though the launch's patches are still in place and the repeat changes nothing.
iris's device functions are small jit functions that call each other, so that repeat was over a third
of a host rank's time. Here a nested call patches only the language modules the launch has not
patched yet, into the launch's own scope so that they are undone with it.

Installed on import where the interpreter has the shape this relies on (Triton 3.9's `_patch_lang`
returning a `_LangPatchScope`); elsewhere Triton's own behaviour is kept.
"""
import triton.language as tl
from triton.runtime import interpreter as _interp

_LANGS = (tl, tl.core)
_active = []  # (scope, ids of the language modules it patched) of the launch running, if any


_langs_of = {}  # function -> ids of the language modules its globals name


def _langs(fn) -> set:
    langs = _langs_of.get(fn)
    if langs is None:
        langs = _langs_of[fn] = {id(v) for v in fn.__globals__.values() if any(v is lang for lang in _LANGS)}
    return langs


def _patch_lang(fn, _original=_interp._patch_lang):
    """The interpreter's _patch_lang, skipped for the modules the running launch has patched already."""
    langs = _langs(fn)
    if _active:  # a device function called from a kernel: the launch's scope is still in place
        scope, done = _active[-1]
        if langs <= done:
            return scope
        more = _original(fn)
        scope._changes.extend(more._changes)  # undone with the launch's scope
        done |= langs
        return scope
    scope = _original(fn)
    entry = (scope, set(langs))
    restore = scope.restore

    def _restore():  # the launch ends (GridExecutor restores in a finally)
        _active[:] = [e for e in _active if e is not entry]
        restore()

    scope.restore = _restore
    _active.append(entry)
    return scope


def install() -> bool:
    """Route the interpreter's patching through _patch_lang; False where its shape is not the one known."""
    scope_cls = getattr(_interp, "_LangPatchScope", None)
    if scope_cls is None or not hasattr(scope_cls(), "_changes") or not callable(getattr(_interp, "_patch_lang", None)):
        return False
    if _interp._patch_lang is not _patch_lang:
        _interp._patch_lang = _patch_lang
    return True
