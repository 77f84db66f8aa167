"""finecap.utils.rng's CUDA branch, run on the CPU with torch.cuda stood in for (no GPU here)."""

from __future__ import annotations

import torch

from finecap.utils import rng


def test_a_state_saved_where_more_gpus_were_visible_restores_the_devices_this_process_has(monkeypatch):
    """A checkpoint's ``rng`` holds every visible GPU's generator (``torch.cuda.get_rng_state_all``): a run saved on
    a machine with 2 GPUs visible and resumed where 1 is restored device 1's state too, and torch's
    ``default_generators[1]`` raised IndexError in the resume. Now the states of the devices there are restored, the
    rest left (their generators do not exist here); the CPU's and the others' states are restored as before."""
    set_on: list[int] = []

    def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "cuda") -> None:
        index = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        generators = (None,)  # torch.cuda.default_generators of one device
        _ = generators[index or 0]  # IndexError past the devices there, as in torch's own callback
        set_on.append(index)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8)] * 2)
    state = rng.rng_state()
    assert len(state["cuda"]) == 2
    expected = torch.rand(3)
    torch.manual_seed(123)
    rng.set_rng_state(state)
    assert set_on == [0]
    assert torch.equal(torch.rand(3), expected)  # the CPU generator restored too
