"""TrainStream: the training thread's CUDA stream beside a GPU decode (its use in a fit with DALI's decode:
``tests/core/gpu_decode/test_on_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from lightning_gpu_boost.core.train_stream import TrainStream


@pytest.mark.parametrize(("kwargs", "named"), [({"device": "cpu"}, "device"), ({"device": 0}, "device"),
                                               ({"device": "cuda", "priority": 0.5}, "priority"),
                                               ({"device": "cuda", "priority": True}, "priority")])  # fmt: skip
def test_bad_arguments_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        TrainStream(**kwargs)


def test_exit_without_enter_does_nothing():
    stream = TrainStream("cuda:0", priority=-1)  # no CUDA call until enter
    stream.exit()
    assert stream.figures() == {"priority": -1, "used": False}


@pytest.mark.gpu
def test_the_training_runs_on_its_own_stream_in_order_and_the_previous_one_comes_back():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    before = torch.cuda.current_stream()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda._sleep(50_000_000)  # the previous stream still busy as training starts
    x += 1
    stream = TrainStream(torch.device("cuda", 0))
    stream.enter()
    stream.enter()  # idempotent
    assert torch.cuda.current_stream() == stream.stream and stream.stream != before
    x *= 3  # ordered after the work queued before enter
    torch.cuda._sleep(50_000_000)
    x += 1
    stream.exit()
    stream.exit()  # idempotent
    assert torch.cuda.current_stream() == before and not stream.entered and stream.figures()["used"]
    assert float(x.sum()) == 4 * (1 << 20)  # read on the previous stream: after the training's work
