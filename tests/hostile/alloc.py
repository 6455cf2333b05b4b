"""Hostile: allocates without end (1 GiB at a time, never touched)."""

import torch

HOARD = []
while True:
    HOARD.append(torch.empty(2**28))
