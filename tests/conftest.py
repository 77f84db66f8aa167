"""Shared test settings: one torch thread per test process (the machine has 2 cores and tests are tiny)."""

import torch

torch.set_num_threads(1)
