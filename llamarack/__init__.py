"""llamarack: serve quantized LLMs with llama.cpp on racks of old NVIDIA GPUs."""

__version__ = "0.1.0"
