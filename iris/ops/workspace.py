"""FusedWorkspace: what an op's preamble builds (heap buffers, flags, the launch plan), as a dict.

Iris's programs keep the workspace an op returns and pass it back as workspace=, or pass a fresh
FusedWorkspace() for the first call to fill. Its entries are iris's own: read none of them.
"""


class FusedWorkspace(dict):
    """The buffers and flags of one op at one set of shapes; pass it back as workspace=."""
