"""Transports: how bytes move between ranks (mpi4py, a torch.distributed group, or threads in one process)."""

from .base import Transport
from .threaded import ThreadedWorld, ThreadedTransport

__all__ = ["Transport", "ThreadedWorld", "ThreadedTransport"]
