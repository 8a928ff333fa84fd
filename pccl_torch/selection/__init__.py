"""Algorithm selection: everything that decides what a call runs, behind one entry point.

The API attaches a :class:`Choice` to each communicator (:func:`attach`, collective: the profile, the links and the
tuned choices are agreed across ranks) and asks it for the plan of each new call shape (``Choice.bind_plan``;
``Choice.plan`` for a question such as ``choose_algorithm``). Nothing else in pccl_torch chooses an algorithm.

- :mod:`~pccl_torch.selection.choice`: the per-call order of the rules and the plans already resolved;
- :mod:`~pccl_torch.selection.heuristic`: the default rules (one machine: the native library; MPICH's rules) and
  the measured rule for nodes joined by a network;
- :mod:`~pccl_torch.selection.learned`: the learned model (features, training, the persisted profile, its run-time
  choice; ``pccl-tune``);
- :mod:`~pccl_torch.selection.tuning`: online tuning of repeated call shapes (``PCCL_TUNE=online``);
- :mod:`~pccl_torch.selection.links`: the measured latency and bandwidth inside and between nodes.
"""

from pccl_torch.selection.choice import Choice, attach, choice_of

__all__ = ["Choice", "attach", "choice_of"]
