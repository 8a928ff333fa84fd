"""Framework adapters, installed as ``pccl_torch.integrations``: each translates one framework's call
(torch.distributed backend, DeepSpeed comm, FSDP custom all-gather/reduce-scatter, DDP comm hook) into
one call of :mod:`pccl_torch.api`.
"""
