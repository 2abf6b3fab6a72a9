"""llm: a GGUF LLM runner (llama, qwen2, qwen3, gemma3, gpt2) with a numpy CPU backend.

    import llm
    model = llm.load("smollm2")                 # a GGUF path or a model name; device="cpu"
    for piece in model.generate("The capital of France is", max_tokens=32):
        print(piece, end="")
    reply = model.chat([{"role": "user", "content": "Hi"}])
"""
from llm.backends import BackendUnavailable
from llm.chat import ChatTemplateError
from llm.config import ModelConfig
from llm.generate import ContextError, GenerationStats
from llm.gguf_file import GGUFError, GGUFFile
from llm.host_memory import HostMemoryError
from llm.model import Model, load
from llm.model_files import ModelFileError, resolve_model
from llm.options import RunnerOptions
from llm.sampling import NonFiniteLogitsError, Sampler, SamplingParams
from llm.tokenizer import Tokenizer

__all__ = [
    "BackendUnavailable", "ChatTemplateError", "ContextError", "GGUFError", "GGUFFile",
    "GenerationStats", "HostMemoryError", "Model", "ModelConfig", "ModelFileError",
    "NonFiniteLogitsError", "RunnerOptions", "Sampler", "SamplingParams", "Tokenizer", "load",
    "resolve_model",
]
