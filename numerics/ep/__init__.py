"""Communication level: DeepEP dispatch / combine held bit for bit against an all-to-all reference.

Public names: ``EPBackend`` (the interface, semantics in ``numerics.ep.backend``), ``Dispatched``,
``Layout``, ``AllToAllReference`` (torch.distributed all-to-all, NCCL or gloo), ``DeepEPBackend``
(the subject; deep_ep imported lazily), ``simulate`` (single-process oracle), ``PeerInputError``.
Modules: ``strategies`` (routings and payloads), ``launch`` (process groups), ``compare`` (bit diffs
with locations), ``check`` and ``bench`` (the ``python -m numerics.ep`` subcommands).
Importing this package has no side effects and does not import deep_ep.
"""

from numerics.ep.backend import Dispatched, EPBackend, Layout, PeerInputError
from numerics.ep.deepep import DeepEPBackend
from numerics.ep.reference import AllToAllReference
from numerics.ep.simulate import simulate

__all__ = ["AllToAllReference", "DeepEPBackend", "Dispatched", "EPBackend", "Layout", "PeerInputError",
           "simulate"]
