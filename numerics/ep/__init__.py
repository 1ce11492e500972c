"""Communication level: DeepEP dispatch / combine held bit for bit against an all-to-all reference.

Public names: ``EPBackend`` (the interface, semantics in ``numerics.ep.backend``), ``Dispatched``,
``Layout``, ``make_backend`` / ``BACKENDS`` (the one factory: ``reference``, ``deepep``, ``deepep-v2``),
``AllToAllReference`` (torch.distributed all-to-all, NCCL or gloo), ``DeepEPBackend`` (DeepEP's V1
``Buffer``) and ``DeepEPV2Backend`` (its V2 ``ElasticBuffer``), the subjects (deep_ep imported lazily),
``simulate`` (single-process oracle), ``PeerInputError``.
Modules: ``strategies`` (routings and payloads), ``launch`` (process groups), ``compare`` (bit diffs
with locations), ``known`` (known findings), ``check`` and ``bench`` (the ``python -m numerics.ep``
subcommands). Importing this package has no side effects and does not import deep_ep.
"""

from numerics.ep.backend import Dispatched, EPBackend, Layout, PeerInputError
from numerics.ep.backends import BACKENDS, make_backend
from numerics.ep.deepep import DeepEPBackend
from numerics.ep.deepep_v2 import DeepEPV2Backend
from numerics.ep.reference import AllToAllReference
from numerics.ep.simulate import simulate

__all__ = ["BACKENDS", "AllToAllReference", "DeepEPBackend", "DeepEPV2Backend", "Dispatched", "EPBackend", "Layout",
           "PeerInputError", "make_backend", "simulate"]
