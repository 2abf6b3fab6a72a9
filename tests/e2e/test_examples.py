"""Every example runs (and checks itself against numpy) on the current device."""
import os
import runpy

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
NAMES = ["vector_add", "block_reduction", "tiled_matmul", "softmax", "generic_kernel",
         "debug_print", "autotune", "elementwise", "softmax_collectives", "ndarray_transpose",
         "grid_normalize", "half_precision", "persistent_queue"]


@pytest.mark.parametrize("name", NAMES)
def test_example_runs(name, device, capsys):
    runpy.run_path(os.path.join(EXAMPLES, f"{name}.py"), run_name="__main__")
    assert "OK" in capsys.readouterr().out
