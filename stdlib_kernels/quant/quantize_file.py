"""Re-quantize a GGUF file (the work behind `pykernel quantize`; rules in cli.py).

Input: source path, destination path, target type (plain ggml type or an _M mix), backend.
Output: the destination GGUF (metadata copied, general.file_type set) and a summary line on
stderr; a tqdm bar shows the elements quantized per second while it runs.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from tqdm import tqdm

from . import reference
from .cli import choose_type, fit_to_row, is_quantizable

_SKIPPED_FIELDS = ("general.architecture", "general.file_type", "general.alignment")
_FLOAT_SOURCES = {GGMLQuantizationType.F32: None, GGMLQuantizationType.F16: None,
                  GGMLQuantizationType.BF16: np.uint16}


@dataclass
class Codec:
    """quantize(rows, type) / dequantize(raw, type, n) on the device or in numpy."""
    name: str
    quantize: object
    dequantize: object


def pick_codec(backend: str) -> Codec:
    import pykernel as pk
    if backend == "numpy" or (backend == "auto" and not pk.gpu_available()):
        return Codec("numpy reference (CPU)", _numpy_quantize, reference.dequantize)
    from .device import dequantize, quantize
    if backend == "auto":
        pk.set_device("cuda")
    return Codec(f"device kernels ({pk.current_device()!r})", quantize, dequantize)


def _numpy_quantize(rows: np.ndarray, type_name: str) -> np.ndarray:
    if rows.dtype == np.uint16:  # bfloat16 bits
        rows = (rows.astype(np.uint32) << 16).view(np.float32)
    return reference.quantize(rows.astype(np.float32, copy=False), type_name)


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter, src: str) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in _SKIPPED_FIELDS:
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
            raise ValueError(f"{src}: key {field.name}: nested arrays are not supported")
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type)
    if "general.alignment" in reader.fields:
        writer.add_custom_alignment(int(reader.fields["general.alignment"].contents()))


def _file_type(target: str) -> int:
    return int(LlamaFileType.ALL_F32 if target == "F32" else LlamaFileType["MOSTLY_" + target])


def _source_rows(tensor, codec: Codec) -> np.ndarray:
    """The tensor as (rows, n) floats (f32, f16, or bf16 bits as uint16)."""
    n = int(tensor.shape[0])
    kind = GGMLQuantizationType(tensor.tensor_type)
    if kind in _FLOAT_SOURCES:
        data = np.asarray(tensor.data)
        if _FLOAT_SOURCES[kind] is not None:
            data = data.view(_FLOAT_SOURCES[kind])
        return data.reshape(-1, n)
    return np.asarray(codec.dequantize(np.asarray(tensor.data).reshape(-1), kind.name, n))


def _plan(reader: GGUFReader, target: str) -> dict[str, str | None]:
    """tensor name -> new type name, or None to copy it unchanged."""
    names = {t.name for t in reader.tensors}
    n_layers = 1 + max((int(n.split(".")[1]) for n in names if n.startswith("blk.")),
                       default=0)
    plan = {}
    for t in reader.tensors:
        if not is_quantizable(t.name, len(t.shape)):
            plan[t.name] = None
            continue
        chosen = fit_to_row(choose_type(t.name, target, n_layers, "output.weight" in names),
                            int(t.shape[0]))
        plan[t.name] = None if chosen == GGMLQuantizationType(t.tensor_type).name else chosen
    return plan


def quantize_file(src: str, dst: str, target: str, backend: str = "auto") -> None:
    reader = GGUFReader(src)
    if "general.architecture" not in reader.fields:
        raise ValueError(f"{src}: no general.architecture key; not a model GGUF")
    codec = pick_codec(backend)
    plan = _plan(reader, target)
    writer = GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    _copy_metadata(reader, writer, src)
    writer.add_file_type(_file_type(target))
    total = sum(int(t.n_elements) for t in reader.tensors if plan[t.name])
    start = time.perf_counter()
    with tqdm(total=total, unit="elem", unit_scale=True, desc=f"quantize {target}",
              file=sys.stderr) as bar:
        for t in reader.tensors:
            new_type = plan[t.name]
            if new_type is None:
                writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape,
                                  raw_dtype=GGMLQuantizationType(t.tensor_type))
                continue
            raw = np.asarray(codec.quantize(_source_rows(t, codec), new_type))
            shape = tuple(int(d) for d in reversed(t.shape[1:])) + (raw.shape[1],)
            writer.add_tensor(t.name, raw.reshape(shape),
                              raw_dtype=GGMLQuantizationType[new_type])
            bar.update(int(t.n_elements))
    seconds = time.perf_counter() - start
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    changed = sum(1 for v in plan.values() if v)
    print(f"{dst}: {changed} of {len(plan)} tensors re-quantized to {target} with "
          f"{codec.name}: {total:,} elements in {seconds:.2f} s "
          f"({total / max(seconds, 1e-9) / 1e6:.1f} M elements/s)", file=sys.stderr)
