"""Every llamarack setting: its default, its type, what it means.

This module is the one place that lists settings. A setting is a field of one
role's frozen dataclass; the host-data key is ``<role prefix>_<field name>``
(``llamacpp_commit``, ``server_port``...). ``load_settings`` turns one host's
data into a ``Settings`` object and rejects bad data (unknown key, wrong type,
impossible value) before any host is touched, naming the host, the key, what
was given and what is allowed.

Roles receive their own frozen settings object and never read ``host.data``.
``inventory/group_data/all.py`` and the README's table are generated from
these classes (``llamarack settings``) and a test keeps them in step.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import re
import typing
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion
from packaging.version import Version as PkgVersion

from .errors import SettingsError
from .layout import Layout

# Value kinds that need more than a Python type to check.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# ggml's x86 CPU extensions (its GGML_<NAME> cmake options), for llamacpp_cpu_features.
X86_FEATURES = (
    "sse42", "avx", "avx2", "avx_vnni", "bmi2", "fma", "f16c",
    "avx512", "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip
QUANT_TYPES = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "F16", "BF16",
)  # fmt: skip


def _dotted_version(value: str) -> Optional[str]:
    if not re.fullmatch(r"\d+(\.\d+)*", value):
        return "a dotted numeric version such as 520.61.05"
    return None


def _pep440_version(value: str) -> Optional[str]:
    try:
        PkgVersion(value)
    except InvalidVersion:
        return "a PEP 440 version such as 2.1.2"
    return None


def _requirement(value: str) -> Optional[str]:
    allowed = "a pip requirement by name and version, such as 'numpy<2' (no URL, no path)"
    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return allowed
    if requirement.url or set(value) & set("`$|&\\"):  # packages come from the index settings
        return allowed
    return None


def _git_revision(value: str) -> Optional[str]:
    if not re.fullmatch(r"[0-9a-f]{7,40}", value):
        return "a commit sha (7 to 40 lowercase hex digits); branches move, so they are not pins"
    return None


def _sha256(value: str) -> Optional[str]:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        return "a sha256 hex digest (64 lowercase hex digits)"
    return None


# Real CUDA architectures (compute capabilities) nvcc builds for, Maxwell on.
CUDA_ARCHS = ("50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90",
              "100", "101", "103", "110", "120", "121")  # fmt: skip


def _cuda_arch(value: str) -> Optional[str]:
    m = re.fullmatch(r"(\d{2,3})([af]?)(-real)?", value)
    if not m or m.group(1) not in CUDA_ARCHS:
        return ("a CUDA architecture (" + ", ".join(CUDA_ARCHS) + "), such as 70 (V100), 75 (T4), "
                "60 (P100), 61 (P40), 90 (H100/H200); NN-real leaves out the PTX that newer cards "
                "could compile at load time")
    return None


# The roles deploy.py runs after preflight, in order (llamarack_roles picks some).
ROLE_NAMES = ("driver", "toolchain", "python_env", "llamacpp", "converter_env", "model", "server")


def _role_name(value: str) -> Optional[str]:
    if value not in ROLE_NAMES:
        return "role names: " + ", ".join(ROLE_NAMES)
    return None


def _x86_feature(value: str) -> Optional[str]:
    if value not in X86_FEATURES:
        return "x86 extensions of ggml: " + ", ".join(X86_FEATURES)
    return None


# Shapes of the values that reach a host: every one is quoted where it is used
# (``llamarack.remote.argv``), and refused here when it is no such thing, so a
# typo or a pasted command never gets as far as a quoting rule.

# One component of a host path: letters, digits, and . _ + - (no leading -; . and .. are
# refused where it is used).
_PATH_PART = r"[A-Za-z0-9_+.][A-Za-z0-9._+-]*"


def _host_path(value: str) -> Optional[str]:
    """An absolute, normalized path on a host, spelled in characters that need
    no quoting in a shell, a unit file or a systemd specifier."""
    parts = value.split("/")
    if (not value.startswith("/") or value == "/" or value.endswith("/")
            or not all(re.fullmatch(_PATH_PART, part) for part in parts[1:])
            or any(part in (".", "..") for part in parts)):  # fmt: skip
        return ("an absolute path other than /, of names made of letters, digits, . _ + - "
                "(no spaces, no .., no trailing /), e.g. /opt/llamarack")
    return None


def _root(value: str) -> Optional[str]:
    problem = _host_path(value)
    if problem:
        return problem
    if value in ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc",
                 "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib"):
        return f"a directory llamarack owns alone, e.g. /opt/llamarack (not the system's {value})"
    return None


def _control_file(value: str) -> Optional[str]:
    # A file on the control machine: opened there, never put in a command.
    if not value.strip() or value != value.strip():
        return "a file name on the control machine (not empty, no leading or trailing space)"
    return None


# Characters a shell, a unit file or a URL parser treat specially, never part of an
# address llamarack fetches from (percent-escapes such as %20 are allowed).
_URL_FORBIDDEN = set(" \t'\"`$;|&<>(){}\\!*^")


def _remote_url(value: str) -> Optional[str]:
    """An http(s) URL of a server the hosts download from."""
    allowed = "an http:// or https:// URL of a server, without spaces or shell characters (' \" ` $ ; | & < > ( ) { } \\ ! * ^)"
    if not re.fullmatch(r"https?://[^/?#]+(?:[/?#]\S*)?", value) or set(value) & _URL_FORBIDDEN:
        return allowed
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return allowed
    if not parts.hostname or not re.fullmatch(r"[A-Za-z0-9.-]+|[0-9a-fA-F:.]+", parts.hostname) \
            or parts.hostname.startswith(("-", ".")):  # fmt: skip
        return allowed
    if "%" in value and not re.fullmatch(r"(%[0-9A-Fa-f]{2}|[^%])*", value):
        return allowed + "; % only as an escape such as %20"
    return None


def _git_url(value: str) -> Optional[str]:
    """What ``git clone`` may fetch from: a URL, user@host:path, or an absolute path
    or file:// URL (a local mirror, as bench/ uses); never an option (-...) or a
    transport helper (ext::, fd::)."""
    allowed = ("a git repository URL (https://, http://, ssh://, git://, file:///path), user@host:path, "
               "or an absolute path; not an option (-...) nor a remote helper (ext::, fd::...)")
    if value.startswith("-") or "::" in value or set(value) & _URL_FORBIDDEN:
        return allowed
    if re.fullmatch(r"https?://\S+", value):
        return _remote_url(value) and allowed
    if re.fullmatch(r"(ssh|git)://[A-Za-z0-9._@-]+(:\d+)?/\S+", value):
        return None
    if re.fullmatch(r"[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._/~+-]+", value):
        return None
    local = value[len("file://"):] if value.startswith("file://") else value
    if local.startswith("/") and not _host_path(local.rstrip("/")):
        return None
    return allowed


def _address(value: str) -> Optional[str]:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "an IP address to listen on: 127.0.0.1 (this host only), 0.0.0.0 (every IPv4 interface), :: or one interface's address"
    return None


def _hub_repo(value: str) -> Optional[str]:
    part = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    if not re.fullmatch(f"{part}(/{part})?", value) or ".." in value:
        return "a hub repository id: owner/name of letters, digits, . _ - (no .., no leading /), e.g. Qwen/Qwen2.5-7B-Instruct"
    return None


def _repo_file(value: str) -> Optional[str]:
    parts = value.split("/")
    if not all(re.fullmatch(_PATH_PART, part) and part not in (".", "..") for part in parts):
        return "a file path inside the repository, of names made of letters, digits, . _ + - (no .., no leading /)"
    return None


def _repo_pattern(value: str) -> Optional[str]:
    parts = value.split("/")
    if not all(re.fullmatch(r"[A-Za-z0-9_.+*?\[\]-]+", part) and part not in (".", "..") for part in parts):
        return ("a shell pattern on the repository's file paths, of letters, digits, . _ + - and * ? [ ] "
                "(no spaces, no .., no leading /), e.g. *.safetensors")
    return None


def _conda_channel(value: str) -> Optional[str]:
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*", value) and ".." not in value:
        return None
    if value.startswith(("http://", "https://")) and not _remote_url(value):
        return None
    return "a conda channel name (conda-forge, nvidia/label/cuda-11.8.0) or an http(s) URL of one"


def _positive(value: int) -> Optional[str]:
    if value <= 0:
        return "a positive integer"
    return None


def _non_negative(value: int) -> Optional[str]:
    if value < 0:
        return "0 or a positive integer"
    return None


def _scale(value: float) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        return "a number >= 1 such as 2.0"
    return None


def _port(value: int) -> Optional[str]:
    if not 1 <= value <= 65535:
        return "a TCP port (1-65535)"
    return None


def _service_user(value: str) -> Optional[str]:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
        return "a system user name (lowercase letters, digits, - and _)"
    if value in ("root", "nobody", "daemon", "bin", "sys", "sync", "games", "man", "mail", "www-data"):
        return f"a user of llama-server's own, e.g. llamarack (not {value}, which the system uses)"
    return None


def setting(default: Any, doc: str, check: Optional[Callable[[Any], Optional[str]]] = None):
    """A settings field: its default, a one-line meaning and an optional value check.

    ``check`` returns None when the value is fine, else a phrase saying what is
    allowed ("a positive integer"). It is applied to every element of a tuple.
    """
    return field(default=default, metadata={"doc": doc, "check": check})


@dataclass(frozen=True)
class GeneralSettings:
    """Where llamarack keeps its state on a host."""

    prefix = "llamarack"

    root: str = setting(
        "/opt/llamarack",
        "everything llamarack owns on a host lives under this directory",
        _root,
    )
    service_user: str = setting("llamarack", "system user that runs llama-server (not root)", _service_user)
    roles: Optional[tuple[str, ...]] = setting(
        None,
        "run only these roles, e.g. server,model (preflight always runs): "
        + ", ".join(ROLE_NAMES) + "; None runs them all",
        _role_name,
    )

    def runs(self, role: str) -> bool:
        """Whether ``deploy.py`` runs ``role`` (one of ROLE_NAMES) on this host."""
        return self.roles is None or role in self.roles

    @property
    def layout(self) -> Layout:
        """Every path under ``root`` (``llamarack.layout``)."""
        return Layout(self.root)


@dataclass(frozen=True)
class DriverSettings:
    """Checks on the NVIDIA driver; llamarack never installs one unless asked."""

    prefix = "driver"

    min_version: str = setting(
        "520.61.05",
        "lowest driver accepted (the toolkit's own floor applies as well)",
        _dotted_version,
    )
    hold_packages: bool = setting(
        True,
        "apt-mark hold the installed driver packages so upgrades cannot move them; "
        "False unholds them (for a planned driver upgrade)",
    )
    reboot_on_mismatch: bool = setting(
        False, "reboot a host whose driver library and loaded module differ, then check again"
    )


@dataclass(frozen=True)
class ToolchainSettings:
    """The CUDA toolkit and host compiler llama.cpp is built with."""

    prefix = "toolchain"

    cuda_version: str = setting(
        "11.8", "CUDA toolkit version to build with (13+ cannot build for Volta/Pascal)",
        _dotted_version,
    )
    cuda_source: Literal["system", "conda", "debian"] = setting(
        "system",
        "where the toolkit comes from: system (/usr/local/cuda-X), conda env, or Debian non-free",
    )
    cuda_home: Optional[str] = setting(
        None, "toolkit directory; None searches /usr/local/cuda-<version> and /usr", _host_path
    )
    install_gcc: bool = setting(
        True, "install gcc-N/g++-N when the default gcc is newer than the toolkit accepts"
    )
    conda_channel: str = setting(
        "nvidia/label/cuda-11.8.0",
        "conda channel the toolkit (cuda-nvcc, cudart, cublas) comes from with source conda",
        _conda_channel,
    )
    apt_cache_time: int = setting(
        86400,
        "seconds apt's package lists count as fresh; apt-get update runs only when a package "
        "is missing and the lists are older",
        _positive,
    )


@dataclass(frozen=True)
class PythonEnvSettings:
    """The Python environment for AWQ quantization, with the reference pins."""

    prefix = "python_env"

    backend: Literal["conda", "venv"] = setting(
        "conda", "conda (Miniforge under the root) or venv (system python3)"
    )
    python_version: str = setting("3.10", "Python version of the env", _dotted_version)
    conda_installer_url: str = setting(
        "https://github.com/conda-forge/miniforge/releases/download/24.11.3-0/"
        "Miniforge3-24.11.3-0-Linux-x86_64.sh",
        "Miniforge installer (point at a mirror for air-gapped racks)",
        _remote_url,
    )
    conda_installer_sha256: Optional[str] = setting(
        None, "sha256 of the installer; required with the conda backend", _sha256
    )
    conda_channels: tuple[str, ...] = setting(("conda-forge",), "conda channels, in order", _conda_channel)
    index_url: str = setting("https://pypi.org/simple", "pip index for everything but torch", _remote_url)
    torch_index_url: str = setting(
        "https://download.pytorch.org/whl/cu118", "pip index torch is installed from", _remote_url
    )
    torch_version: str = setting("2.1.2", "torch pin", _pep440_version)
    transformers_version: str = setting("4.44.2", "transformers pin", _pep440_version)
    accelerate_version: str = setting("0.33.0", "accelerate pin", _pep440_version)
    autoawq_version: str = setting("0.2.7", "autoawq pin", _pep440_version)
    numpy_requirement: str = setting(
        "numpy<2", "numpy constraint (torch < 2.3 fails with numpy 2)", _requirement
    )
    autoawq_requirements: tuple[str, ...] = setting(
        ("datasets==3.0.1", "pyarrow==17.0.0", "zstandard==0.23.0"),
        "what autoawq really imports, installed beside it (autoawq itself goes in with --no-deps; "
        "pyarrow 18+ needs numpy 2)",
        _requirement,
    )
    converter_torch_index_url: str = setting(
        "https://download.pytorch.org/whl/cpu",
        "pip index torch comes from in the llama.cpp converter's env (conversion runs on the CPU)",
        _remote_url,
    )
    converter_overrides: tuple[str, ...] = setting(
        (),
        "requirements that replace the converter file's line of the same package, e.g. torch==2.13.0",
        _requirement,
    )


@dataclass(frozen=True)
class LlamacppSettings:
    """The llama.cpp source and build."""

    prefix = "llamacpp"

    git_url: str = setting(
        "https://github.com/ggml-org/llama.cpp.git", "llama.cpp git repository (or a mirror)", _git_url
    )
    commit: str = setting(
        "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "pinned llama.cpp commit", _git_revision
    )
    backend: Literal["cuda", "cpu"] = setting(
        "cuda", "cuda for GPU hosts; cpu builds without CUDA (hosts with no GPU, like the lab)"
    )
    cuda_archs: Optional[tuple[str, ...]] = setting(
        None, "CUDA architectures to build for; None means those of the host's GPUs", _cuda_arch
    )
    ccache_dir: Optional[str] = setting(
        None, "ccache directory, e.g. one shared by the rack over NFS", _host_path
    )
    build_jobs: Optional[int] = setting(None, "parallel compile jobs; None means nproc", _positive)
    force_rebuild: bool = setting(False, "rebuild even when the build inputs are unchanged")
    keep_builds: int = setting(2, "builds kept for rollback, the current one included", _positive)
    cpu_features: Optional[tuple[str, ...]] = setting(
        None,
        "x86 extensions ggml's CPU code is built with, each named (they build on each other: "
        "avx512 needs sse42, avx, avx2, bmi2, fma, f16c too); None builds for the host's own CPU "
        "(-march=native)",
        _x86_feature,
    )
    cpu_fallback: bool = setting(
        True,
        "when the build as asked fails its smoke run, try it without weight repacking "
        "(--no-repack), then rebuilt for x86-64-v3, then x86-64-v2, and keep the first that "
        "computes; False refuses the build",
    )


@dataclass(frozen=True)
class ModelSettings:
    """Which model is served and how it is quantized."""

    prefix = "model"

    source: Literal["hf", "gguf", "url"] = setting(
        "hf", "hf (convert a checkpoint), gguf (a prequantized file from a hub) or url"
    )
    repo: Optional[str] = setting(None, "hub repository id, e.g. Qwen/Qwen2.5-7B-Instruct", _hub_repo)
    revision: Optional[str] = setting(
        None, "hub commit sha the repository is pinned to; given in full (40 hex digits), a llama.cpp "
        "bump asks the hub nothing", _git_revision
    )
    file: Optional[str] = setting(None, "file name in the repository (source gguf)", _repo_file)
    url: Optional[str] = setting(None, "download URL (source url)", _remote_url)
    sha256: Optional[str] = setting(None, "sha256 of the file at url (source url)", _sha256)
    hf_endpoint: str = setting("https://huggingface.co", "Hugging Face endpoint or mirror", _remote_url)
    hf_token_file: Optional[str] = setting(
        None,
        "file on the control machine holding the hub token (never printed; mode 600 or 400)",
        _control_file,
    )
    quant: str = setting("Q4_K_M", "llama-quantize type")
    hf_include: tuple[str, ...] = setting(
        ("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt"),
        "repository files fetched for source hf (shell patterns on their paths)",
        _repo_pattern,
    )
    convert_outtype: Literal["f16", "bf16", "f32"] = setting(
        "f16", "GGUF type convert_hf_to_gguf.py writes before llama-quantize"
    )
    keep_intermediates: bool = setting(
        False, "keep the downloaded checkpoint and the unquantized GGUF after quantizing"
    )
    fetch_retries: int = setting(
        5, "times a dropped download is resumed (HTTP Range) before the run fails", _positive
    )
    # -- the draft model (speculative decoding): fetched, converted and quantized as the model is --
    draft_repo: Optional[str] = setting(
        None,
        "hub repository of a draft model for speculative decoding (it must share the model's "
        "vocabulary, e.g. a 0.5B of the same family); None: no draft",
        _hub_repo,
    )
    draft_revision: Optional[str] = setting(None, "hub commit sha the draft repository is pinned to", _git_revision)
    draft_source: Literal["hf", "gguf"] = setting(
        "hf", "hf (convert the draft's checkpoint) or gguf (a prequantized file of draft_repo)"
    )
    draft_file: Optional[str] = setting(None, "file name in the draft repository (draft source gguf)", _repo_file)
    draft_quant: str = setting("Q8_0", "llama-quantize type of the draft (draft source hf)")


# Card memory the ledger's items do not count: the CUDA context and pools (601-611 MiB
# beyond llama.cpp's own model, KV and compute buffers in all 14 runs on the lent H200,
# CUDA 13, driver 580: bench/results/gpu-proof.json), and what the compute estimate
# misses where it is under llama.cpp's figure (layers on the CPU, a sliding window, a
# 32K context: up to 52 MiB). cuBLAS's own memory is not here: it is counted with a
# V100's or P100's prefill pool (planner.prefill_pool_bytes). The process less the
# planned weights, KV and compute reached 654.5 MiB at most in those runs
# (tests/unit/test_server_plan.py::test_ledger_matches_llama_cpp_on_cuda); +17.5 MiB.
DEFAULT_RESERVE_MIB = 672


@dataclass(frozen=True)
class ServerSettings:
    """How llama-server runs."""

    prefix = "server"

    listen: str = setting(
        "127.0.0.1",
        "address llama-server listens on; any other than loopback needs server_api_key_file "
        "or server_allow_unauthenticated",
        _address,
    )
    port: int = setting(8080, "port llama-server listens on", _port)
    # -- the memory plan (llamarack/planner.py) --
    ctx_size: Optional[int] = setting(
        None, "context per slot; None means the largest that fits the card", _positive
    )
    cache_type_k: str = setting(
        "auto", "K cache type; auto: the most precise of f16, q8_0, q4_0 that gives the context"
    )
    cache_type_v: str = setting("auto", "V cache type, as K (quantized V needs flash attention)")
    gpu_layers: Optional[int] = setting(
        None, "--n-gpu-layers (n_layer + 1 = all, 0 = CPU only); None: all that fit", _non_negative
    )
    min_ctx_size: int = setting(
        4096, "context per slot below which fewer layers go on the card", _positive
    )
    rope_scaling: Literal["none", "yarn", "linear"] = setting(
        "none", "RoPE scaling past the trained context (yarn: up to original x scale)"
    )
    rope_scale: float = setting(1.0, "RoPE scale factor (--rope-scale)", _scale)
    rope_orig_ctx: Optional[int] = setting(
        None, "YaRN's original context; None: the GGUF's (--yarn-orig-ctx)", _positive
    )
    # -- end of the memory plan --
    flash_attn: bool = setting(True, "flash attention")
    backend_sampling: bool = setting(
        False,
        "--backend-sampling: sample on the GPU (llama.cpp marks it experimental; measured on an H200, "
        "8B Q4_K_M: 0.94 of llama-bench's tg128 with it, 0.88-0.92 without)",
    )
    mmap: bool = setting(False, "mmap the model file (off: copy weights to the GPU once)")
    repack: bool = setting(
        True,
        "CPU weight repacking (AMX and repacked kernels); False serves with --no-repack",
    )
    parallel: int = setting(1, "parallel slots; --ctx-size is the context per slot x slots", _positive)
    api_key_file: Optional[str] = setting(
        None,
        "file on the control machine holding the API key (never printed; mode 600 or 400)",
        _control_file,
    )
    allow_unauthenticated: bool = setting(
        False,
        "True serves an API without a key on an address other than loopback: anyone who "
        "reaches server_listen may use it (a closed lab network)",
    )
    memory_reserve_mib: int = setting(
        DEFAULT_RESERVE_MIB, "card memory kept free of weights, KV cache and compute buffers (CUDA context, "
        "pools, and what the compute estimate misses: up to 654.5 MiB measured on an H200); a V100's or P100's "
        "cuBLAS prefill pool is planned beside it",
        _positive,
    )
    health_timeout: int = setting(
        600, "seconds a (re)started llama-server has to answer /health before rollback", _positive
    )
    # -- speculative decoding, with model_draft_repo --
    draft_max: int = setting(16, "most tokens the draft proposes per step (--spec-draft-n-max)", _positive)
    draft_min: int = setting(0, "fewest draft tokens worth verifying (--spec-draft-n-min)", _non_negative)
    draft_gpu_layers: Optional[int] = setting(
        None, "the draft's --spec-draft-ngl (-ngld); None: all of its layers", _non_negative
    )
    # -- the benchmark after a new build or model --
    bench: Literal["off", "beside", "stopped"] = setting(
        "stopped",
        "llama-bench (pp512, tg128, the served flags) after a new build or model, recorded in "
        "<root>/state/bench.json: stopped (llama-server is stopped for it and started again), "
        "beside (while it serves: the card is shared, the figures are lower), off",
    )


# Values restricted to a fixed set beyond what a Literal type says.
_CHOICES = {
    ("model", "quant"): QUANT_TYPES,
    ("model", "draft_quant"): QUANT_TYPES,
    ("server", "cache_type_k"): ("auto",) + KV_CACHE_TYPES,
    ("server", "cache_type_v"): ("auto",) + KV_CACHE_TYPES,
}

ROLE_SETTINGS = (
    GeneralSettings,
    DriverSettings,
    ToolchainSettings,
    PythonEnvSettings,
    LlamacppSettings,
    ModelSettings,
    ServerSettings,
)


@dataclass(frozen=True)
class Settings:
    """All of one host's settings, one frozen object per role."""

    host: str
    general: GeneralSettings
    driver: DriverSettings
    toolchain: ToolchainSettings
    python_env: PythonEnvSettings
    llamacpp: LlamacppSettings
    model: ModelSettings
    server: ServerSettings

    @property
    def layout(self) -> Layout:
        return self.general.layout


@dataclass(frozen=True)
class SettingInfo:
    """One setting as documentation and checks see it."""

    key: str
    role: type
    name: str
    type: Any
    default: Any
    doc: str
    check: Optional[Callable[[Any], Optional[str]]]
    choices: Optional[tuple]


@functools.cache
def all_settings() -> tuple[SettingInfo, ...]:
    """Every setting of every role, in declaration order. Made once per process: the roles'
    type hints cannot change, and each host's settings are loaded from it (3 ms a host)."""
    infos = []
    for role in ROLE_SETTINGS:
        hints = typing.get_type_hints(role)
        for f in dataclasses.fields(role):
            infos.append(
                SettingInfo(
                    key=f"{role.prefix}_{f.name}",
                    role=role,
                    name=f.name,
                    type=hints[f.name],
                    default=f.default,
                    doc=f.metadata["doc"],
                    check=f.metadata["check"],
                    choices=_CHOICES.get((role.prefix, f.name)) or _literal_choices(hints[f.name]),
                )
            )
    return tuple(infos)


def defaults() -> dict[str, Any]:
    return {info.key: info.default for info in all_settings()}


def _literal_choices(tp) -> Optional[tuple]:
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return None


def describe_type(info: SettingInfo) -> str:
    """A short human form of a setting's type, for errors and docs."""
    if info.choices:
        return "one of " + ", ".join(repr(c) for c in info.choices)
    tp, optional = _unwrap_optional(info.type)
    if typing.get_origin(tp) is tuple:
        text = f"a list of {typing.get_args(tp)[0].__name__}"
    else:
        text = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}[tp]
    return text + (" or None" if optional else "")


def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _control_characters(value: str) -> Optional[str]:
    # No setting is a multi-line text: a newline or other control character in one is an
    # injection (a unit's next line, a shell's next command), never a value.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "a single line of text (no newline, tab or other control character)"
    return None


def _coerce(info: SettingInfo, value: Any) -> tuple[Any, Optional[str]]:
    """Check one value against its setting; return (value, problem or None)."""
    tp, optional = _unwrap_optional(info.type)
    if value is None:
        return value, None if optional else describe_type(info)
    for text in value if isinstance(value, (list, tuple)) else (value,):
        problem = _control_characters(text) if isinstance(text, str) else None
        if problem:
            return value, problem

    if info.choices is not None:
        if value not in info.choices:
            return value, describe_type(info)
        return value, None

    if typing.get_origin(tp) is tuple:
        if isinstance(value, str):
            # From the command line: --data llamarack_roles=server,model
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            return value, describe_type(info)
        items = tuple(value)
        for item in items:
            problem = info.check(item) if info.check else None
            if problem:
                return value, problem
        return items, None

    # bool is an int in Python: never let True stand for 1 or 1 for True.
    if tp is bool and not isinstance(value, bool):
        return value, describe_type(info)
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        return value, describe_type(info)
    if tp is str and not isinstance(value, str):
        if isinstance(value, (int, float)):
            # pyinfra's --data turns 13.0 into a number, and 11.10 would become 11.1.
            return value, (
                f"a string; quote it: {info.key} = '{value}' in Python, "
                f"--data '{info.key}=\"{value}\"' on the command line"
            )
        return value, describe_type(info)
    if info.check:
        problem = info.check(value)
        if problem:
            return value, problem
    return value, None


_WARNED: set = set()


def unknown_keys(keys, known) -> list[tuple[str, str]]:
    """(key, the setting it looks like) for each host data key that no role knows but
    that is close to a setting's name: ``server-port``, ``llama_root``. Other keys
    (pyinfra's ``ssh_user``, the user's own) are not compared with anything."""
    found = []
    for key in keys:
        normal = key.strip().lower().replace("-", "_")
        close = [normal] if normal in known else difflib.get_close_matches(normal, known, n=1, cutoff=0.8)
        if close:
            found.append((key, close[0]))
    return found


def _warn_unknown(host_name: str, keys, known) -> None:
    """Warn once per host and key about data that looks like a setting but is none (it is
    ignored): a key without a role prefix may be pyinfra's or the user's, so no error."""
    for key, like in unknown_keys(keys, known):
        if (host_name, key) not in _WARNED:
            _WARNED.add((host_name, key))
            import logging  # here: most runs warn about nothing

            logging.getLogger("pyinfra").warning(
                f"{host_name}: {key!r} is no llamarack setting and is ignored; did you mean {like!r}?")


def load_settings(host_name: str, data: Mapping[str, Any]) -> Settings:
    """Build one host's settings from its data (inventory + group data).

    Keys that do not start with a llamarack role prefix belong to pyinfra or
    the user and are ignored. A key with a role prefix that names no setting
    is an error (most likely a typo), as is any value of the wrong type.
    All problems of a host are reported together.
    """
    infos = all_settings()
    by_key = {info.key: info for info in infos}
    prefixes = tuple(f"{role.prefix}_" for role in ROLE_SETTINGS)
    problems: list[str] = []

    for key in data:
        if not isinstance(key, str):
            problems.append(f"key {key!r}: a host data key is a string (a setting name such as 'server_port')")
        elif key.startswith(prefixes) and key not in by_key:
            close = difflib.get_close_matches(key, by_key, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"unknown setting {key!r}{hint}")
    _warn_unknown(host_name, [k for k in data if isinstance(k, str) and not k.startswith(prefixes)], by_key)

    values: dict[type, dict[str, Any]] = {role: {} for role in ROLE_SETTINGS}
    for info in infos:
        if info.key not in data:
            continue
        value, problem = _coerce(info, data[info.key])
        if problem:
            problems.append(f"{info.key}: given {data[info.key]!r}; allowed: {problem}")
        else:
            values[info.role][info.name] = value

    roles = {role: role(**values[role]) for role in ROLE_SETTINGS}
    settings = Settings(
        host=host_name,
        general=roles[GeneralSettings],
        driver=roles[DriverSettings],
        toolchain=roles[ToolchainSettings],
        python_env=roles[PythonEnvSettings],
        llamacpp=roles[LlamacppSettings],
        model=roles[ModelSettings],
        server=roles[ServerSettings],
    )
    problems.extend(_cross_checks(settings))
    if problems:
        raise SettingsError(host_name, problems)
    return settings


def _cross_checks(s: Settings) -> list[str]:
    """Checks that involve more than one setting."""
    problems = []
    if s.python_env.backend == "conda" and not s.python_env.conda_installer_sha256:
        problems.append(
            "python_env_conda_installer_sha256: given None; allowed: the installer's sha256 "
            "(required with python_env_backend='conda': downloads are pinned)"
        )
    if s.server.cache_type_v not in ("f16", "auto") and not s.server.flash_attn:
        problems.append(
            f"server_flash_attn: given False; allowed: True while server_cache_type_v is "
            f"{s.server.cache_type_v!r} (a quantized V cache needs flash attention)"
        )
    model = s.model
    if model.source in ("hf", "gguf") and model.repo and not model.revision:
        problems.append(
            f"model_revision: given None; allowed: a commit sha of {model.repo} "
            "(a branch can move under you)"
        )
    if model.source == "gguf" and model.repo and not model.file:
        problems.append("model_file: given None; allowed: the GGUF file name in model_repo")
    if model.source == "url" and not (model.url and model.sha256):
        problems.append("model_url/model_sha256: a url source needs both")
    if model.draft_repo and not model.draft_revision:
        problems.append(
            f"model_draft_revision: given None; allowed: a commit sha of {model.draft_repo} "
            "(a branch can move under you)"
        )
    if model.draft_repo and model.draft_source == "gguf" and not model.draft_file:
        problems.append("model_draft_file: given None; allowed: the draft GGUF's file name in model_draft_repo")
    if s.server.draft_min > s.server.draft_max:
        problems.append(
            f"server_draft_min: given {s.server.draft_min}; allowed: at most server_draft_max "
            f"({s.server.draft_max})"
        )
    if s.general.roles == ():
        problems.append("llamarack_roles: given []; allowed: at least one role name (None runs them all)")
    server = s.server
    if not (server.api_key_file or server.allow_unauthenticated or ipaddress.ip_address(server.listen).is_loopback):
        problems.append(
            f"server_listen: given {server.listen!r} with no server_api_key_file; allowed: a loopback "
            "address (127.0.0.1, ::1), or set server_api_key_file (clients then need the key), or "
            "server_allow_unauthenticated = True to serve an API anyone on that network may use"
        )
    return problems


def draft_settings(s: Settings) -> Optional[Settings]:
    """The settings the model role makes the draft artifact from: the model's, with the
    draft's source, repository, revision, file and quant; None when no draft is asked.
    Endpoint, token, include patterns, converter type and retries are the model's."""
    m = s.model
    if not m.draft_repo:
        return None
    draft = dataclasses.replace(m, source=m.draft_source, repo=m.draft_repo, revision=m.draft_revision,
                                file=m.draft_file, quant=m.draft_quant, url=None, sha256=None)  # fmt: skip
    return dataclasses.replace(s, model=draft)


def settings_for(host) -> Settings:
    """The one place that reads pyinfra host data: build the current host's settings."""
    return load_settings(host.name, host.data.dict())
