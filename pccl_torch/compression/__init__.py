"""Compressed inter-node traffic (opt-in): wire formats (``formats``), the collectives that carry them
(``schedules``) and how a call's format is decided (``config``: ``compression=`` or ``PCCL_COMPRESSION``)."""

from pccl_torch.compression.formats import FORMATS, NAMES, WireFormat, get

__all__ = ["FORMATS", "NAMES", "WireFormat", "get"]
