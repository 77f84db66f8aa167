"""benchmarks/load_memory.py measures a load, not an import: what finecap's load path imports on its first use (peft,
with ``lora.lm=true``) is imported before the peak resident set is reset, in the plain load and in a sharded one's
process, so docs/memory.md's "Loading" tables keep measuring the weights (peft's import inside the measured span added
~0.09 GiB to the SmolVLM-256M row once it left finecap's models' imports)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a fresh process for each measurement (the test session has imported peft long before; a first measurement would
# import it for the next): whether peft was imported when the measurement reset the peak.
PROBE = """
import json, sys
import peak_rss
import load_memory
from finecap.models.presets import save_tiny_vlm

folder = save_tiny_vlm(sys.argv[1], "idefics3")
resets = []
real = peak_rss.reset_peak

def reset():
    resets.append("peft" in sys.modules)
    return real()

peak_rss.reset_peak = reset
assert "peft" not in sys.modules, "imported before any measurement: the probe cannot tell"
if sys.argv[2] == "measure":
    load_memory.measure("finecap", str(folder))
else:
    load_memory.measure_fsdp("fsdp_rank0", str(folder))
print(json.dumps(resets))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("measurement", ["measure", "measure_fsdp"])
def test_the_load_peak_is_reset_after_what_the_load_path_imports_first(tmp_path, measurement):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT / "src")]),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TQDM_DISABLE": "1"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "vlm"), measurement], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True]  # one reset, peft imported before it
