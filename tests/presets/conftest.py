"""One torch thread for these tiny-model tests: faster than two on a shared 2-core machine (restored after)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
