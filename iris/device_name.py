"""DeviceName: ctx.device as Iris has it, the string "cuda:0" (or "cpu" on the host).

Iris programs call string methods on ctx.device and compare it with str(tensor.device); torch takes
it wherever it takes a device; and, like a torch.device, it has .type and .index and compares equal
to the torch.device it names. ctx.get_device() returns the torch.device itself.
"""
from __future__ import annotations

import torch


class DeviceName(str):
    __slots__ = ("type", "index")

    def __new__(cls, device):
        device = torch.device(device)  # a str too: copy and pickle rebuild it from its text
        self = super().__new__(cls, str(device))
        self.type, self.index = device.type, device.index
        return self

    def __eq__(self, other):
        if isinstance(other, torch.device):
            return self.type == other.type and self.index == other.index
        return str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__
