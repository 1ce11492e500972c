"""The one place a backend name becomes an ``EPBackend``: ``make_backend`` and ``BACKENDS``.

One spelling everywhere (``python -m numerics.ep check | bench``, training, ``mxval validate``):

  ``reference``      ``AllToAllReference``: ``all_to_all_single`` on NCCL or gloo, the path users leave
  ``deepep``         DeepEP's V1 ``deep_ep.Buffer`` (intranode, normal mode): v1.2.x, or main's legacy API
  ``deepep-v2``      DeepEP main's V2 ``deep_ep.ElasticBuffer`` (NCCL Gin), intranode
  ``pkg.mod:Class``  your own ``EPBackend``, constructed as ``Class(device=, timeout=)``

``require(name)`` raises ``BackendUnavailable`` (a ``BadInput``: the CLIs print it as one line, exit 2)
when a name is unknown or its subject cannot run here, before any process group exists.
deep_ep is imported only when a DeepEP backend is asked for.
"""

from __future__ import annotations

import datetime
import importlib

import torch

from numerics.ep.backend import COMBINE_START, DEFAULT_TIMEOUT, MAX_TOKENS, EPBackend
from numerics.errors import BadInput

BACKENDS: dict[str, str] = {
    "reference": "all_to_all_single on NCCL or gloo (numerics.ep.reference.AllToAllReference)",
    "deepep": "DeepEP V1 deep_ep.Buffer, intranode normal mode: v1.2.x or main's legacy Buffer",
    "deepep-v2": "DeepEP main's V2 deep_ep.ElasticBuffer (NCCL Gin), intranode",
}
DEEPEP = ("deepep", "deepep-v2")
DEFAULT_MAX_HIDDEN = 7168  # DeepSeek-V3's hidden size, the widest row the check sends


class BackendUnavailable(BadInput):
    """The named backend is unknown, or its subject (deep_ep, GPUs) is not available here."""


def is_custom(name: str) -> bool:
    return ":" in name


def load_custom(name: str) -> type:
    """``pkg.mod:Class`` -> the class (spawned ranks import it by the same name)."""
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(f"backend {name!r}: cannot import {attr} from {module} ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, EPBackend)):
        raise BackendUnavailable(f"backend {name!r} is not an EPBackend subclass")
    return cls


def require(name: str, *, world: int | None = None) -> None:
    """Raise ``BackendUnavailable`` unless ``name`` can be built here (with ``world`` GPUs for DeepEP)."""
    if is_custom(name):
        load_custom(name)
        return
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)} or pkg.module:Class")
    if name in DEEPEP:
        from numerics.ep.deepep import import_deep_ep
        try:
            import_deep_ep("ElasticBuffer" if name == "deepep-v2" else "Buffer")
        except ImportError as exc:
            raise BackendUnavailable(str(exc)) from None
        if world is not None and torch.cuda.device_count() < world:
            raise BackendUnavailable(f"--backend {name} needs {world} CUDA GPUs, found {torch.cuda.device_count()}")


def make_backend(name: str, *, device: torch.device | str | None = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT, num_sms: int | None = None,
                 max_hidden: int = DEFAULT_MAX_HIDDEN, max_tokens: int = MAX_TOKENS,
                 combine_start: str = COMBINE_START, validate: bool = True, group=None,
                 deterministic: bool = True) -> EPBackend:
    """Build backend ``name`` on the current process group (or ``group``).

    ``num_sms`` (DeepEP), ``max_hidden`` / ``max_tokens`` (what DeepEP's buffers are sized for),
    ``combine_start`` (the reference's combine convention, ``numerics.ep.backend``), ``validate=False``
    (benchmarks only: skip the collective input checks), ``deterministic`` (V2's receive order; the
    contract's order needs True)."""
    if is_custom(name):
        return load_custom(name)(device=device, timeout=timeout)
    if name == "reference":
        from numerics.ep.reference import AllToAllReference
        return AllToAllReference(group, device=device, timeout=timeout, combine_start=combine_start,
                                 validate=validate)
    if name == "deepep":
        from numerics.ep.deepep import DeepEPBackend
        return DeepEPBackend(group, num_sms=num_sms, max_hidden=max_hidden, timeout=timeout, validate=validate,
                             device=device)
    if name == "deepep-v2":
        from numerics.ep.deepep_v2 import DeepEPV2Backend
        return DeepEPV2Backend(group, num_sms=num_sms, max_hidden=max_hidden, max_tokens=max_tokens,
                               deterministic=deterministic, timeout=timeout, validate=validate, device=device)
    raise BackendUnavailable(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)} or pkg.module:Class")
