"""Bootstrap: who the ranks are and how they reach each other inside one job."""
from .bootstrap import connect
from .group import Group
from .launch import launch, spawn

__all__ = ["Group", "connect", "launch", "spawn"]
