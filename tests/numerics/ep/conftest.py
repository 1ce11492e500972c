"""One CPU thread per test in this package, restored afterwards.

The communication tests run several ranks on CI's 2 cores; torch's intra-op threads on top of that
made each tensor operation several times slower (measured 169 ms vs 14 ms for the same integer ops).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
