"""GGUF quantization formats: the format table and the numpy reference codecs."""
from . import reference
from .formats import FORMATS, QuantFormat, get_format

__all__ = ["FORMATS", "QuantFormat", "get_format", "reference"]
