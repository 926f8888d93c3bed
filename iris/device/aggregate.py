"""Triton aggregates that also run in the interpreter. The host driver runs kernels as Python in
Triton's interpreter, which has no aggregates: there the class becomes a plain one whose methods
call the same @triton.jit functions with self."""
import triton
from triton.language.core import _aggregate  # Triton >= 3.4: 3.6 and 3.9 both have it
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _probe():
    pass


INTERPRETED = isinstance(_probe, InterpretedFunction)  # TRITON_INTERPRET=1 when iris was imported


def aggregate(cls):
    """A Triton aggregate when kernels compile; a plain class under the interpreter."""
    if not INTERPRETED:
        return _aggregate(cls)
    body = {}
    for name, member in vars(cls).items():
        if not isinstance(member, staticmethod) and hasattr(member, "fn") and callable(member):
            fn = member.fn if name == "__init__" else member  # a constexpr_function's body runs as it is
            member = (lambda f: lambda self, *args, **kwargs: f(self, *args, **kwargs))(fn)
        body[name] = member
    return type(cls.__name__, (), body)
