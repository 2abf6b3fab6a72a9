"""Test helper: which kernels a piece of host code launches."""
import pykernel as pk


def launched_by(run) -> list[str]:
    """Names of the kernels `run()` launches on the current device, in order."""
    launches = []
    original = pk.current_device().launch

    def counting(compiled, *args, **kwargs):
        launches.append(compiled.name)
        return original(compiled, *args, **kwargs)

    pk.current_device().launch = counting
    try:
        run()
    finally:
        del pk.current_device().launch
    return launches
