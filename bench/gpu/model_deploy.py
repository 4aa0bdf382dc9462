"""The model role on the GPU machine (the GPU proof), through pyinfra @local.

    pyinfra -y @local bench/gpu/model_deploy.py --data llamarack_root=... --data model_repo=... ...

The role as deploy.py runs it: fetch from the hub (the lab's hub server on
localhost serves the generated checkpoint), convert with the llama.cpp
role's checkout of ``convert_hf_to_gguf.py``, quantize with the current
build's ``llama-quantize``, seal, move into place. Only the converter's
Python differs: that machine has no network for the converter env's
pip install, and its own python3 holds torch, numpy, sentencepiece and
transformers (``--data bench_convert_python=python3``).
"""

from pyinfra import host

from roles.model.deploy import model
from roles.settings import settings_for

settings = settings_for(host)
tool_paths = {"convert_python": host.data.get("bench_convert_python")}
if host.data.get("bench_quantize"):
    tool_paths["quantize"] = host.data.get("bench_quantize")
model(settings, tool_paths={k: v for k, v in tool_paths.items() if v})
