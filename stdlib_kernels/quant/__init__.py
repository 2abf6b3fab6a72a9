"""GGUF quantization formats: the format table and the numpy reference codecs."""
from . import reference
from .formats import FORMATS, QuantFormat, get_format

__all__ = ["FORMATS", "QuantFormat", "get_format", "reference"]
# quantized matmul on the device (gemv.py, gemm.py, matmul.py): decode GEMV, prefill GEMM
from .gemv import gemv, gemv_glu, gemv_residual  # noqa: E402
from .gemm import gemm  # noqa: E402
from .gemv_mma import gemv_mma  # noqa: E402
from .matmul import choose_matmul_path, matmul, matmul_into  # noqa: E402
__all__ += ["gemv", "gemv_glu", "gemv_residual", "gemm", "gemv_mma", "matmul", "matmul_into",
            "choose_matmul_path"]
# quantize / dequantize kernels on the current device (device.py)
from .device import dequantize, quantize  # noqa: E402
__all__ += ["quantize", "dequantize"]
