"""The lab's static package index (lab/llamarack_lab/wheels.py): pages, and pip installing from them.

pip really installs from the written files, served by a plain static file
server on 127.0.0.1 (as ``lab up`` serves them on 10.77.0.1), without any of
this machine's pip configuration. The wheels are real (``pip download``,
cached under the test cache): a first run downloads a few small ones.
"""

import functools
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llamarack_lab import services, wheels
from roles.settings import load_settings
from tests.support.cache import CACHE

SMALL = ["requests==2.32.3", "urllib3<2"]
PIP_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PIP_CONFIG_FILE": os.devnull,
           "HOME": "/nonexistent", "PIP_NO_CACHE_DIR": "1"}  # fmt: skip


class Static:
    """A static file server on 127.0.0.1 (what ``python3 -m http.server`` is), logging paths and codes."""

    def __init__(self, root: Path):
        self.log: list[tuple[str, int]] = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                server.log.append((self.path, int(code) if str(code).isdigit() else 0))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def house():
    return wheels.wheelhouse(SMALL, ["charset-normalizer<3.4"], cache=CACHE)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
    env = tmp_path_factory.mktemp("venv") / "v"
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([python, "-m", "venv", str(env)], check=True)
    return env / "bin" / "python"


def pip_install(python: Path, index: str, *reqs: str, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--isolated", "install", "--no-input", "--quiet",
                           "--target", str(target), "--index-url", index, *reqs],
                          capture_output=True, text=True, env=PIP_ENV, timeout=120)  # fmt: skip


def test_pages_link_each_wheel_relatively_with_its_sha256(tmp_path):
    page = wheels.project_page({"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": "ab" * 32})
    assert 'href="../../files/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=' + "ab" * 32 in page
    assert wheels.project("typing_extensions-4.12.2-py3-none-any.whl") == "typing-extensions"
    assert wheels.project("MarkupSafe-3.0.2-cp311-cp311-manylinux_2_17_x86_64.whl") == "markupsafe"


def test_index_files_layout_and_rewrite_only_when_the_wheels_change(house, tmp_path):
    out = tmp_path / "pypi"
    simple = wheels.write_index([house], out)
    names = sorted(p.name for p in house.glob("*.whl"))
    assert simple == out / "simple"
    assert sorted(p.name for p in (out / "files").iterdir()) == names
    assert (simple / "requests" / "index.html").is_file() and (simple / "index.html").is_file()
    text = (simple / "requests" / "index.html").read_text()
    sha = wheels.sha256_file(house / next(n for n in names if n.startswith("requests-")))
    assert f"#sha256={sha}" in text and 'href="../../files/requests-' in text
    # hard links, not copies, on one disk
    wheel = out / "files" / names[0]
    assert wheel.stat().st_ino == (house / names[0]).stat().st_ino
    stamp = (out / ".stamp").read_text()
    mtime = (simple / "requests" / "index.html").stat().st_mtime_ns
    wheels.write_index([house], out)  # unchanged: nothing rewritten
    assert (simple / "requests" / "index.html").stat().st_mtime_ns == mtime
    assert (out / ".stamp").read_text() == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pypi")]


def test_pip_installs_from_the_static_pages_over_http(house, venv_python, tmp_path):
    out = tmp_path / "srv" / "pypi"
    wheels.write_index([house], out)
    server = Static(tmp_path / "srv")
    try:
        r = pip_install(venv_python, f"{server.url}/pypi/simple", *SMALL, target=tmp_path / "t")
        assert r.returncode == 0, r.stdout + r.stderr
        installed = {p.name.split("-")[0].lower() for p in (tmp_path / "t").glob("*.dist-info")}
        assert {"requests", "urllib3", "idna", "certifi", "charset_normalizer"} <= installed
        assert all(code == 200 for _, code in server.log), server.log
        assert any(p.startswith("/pypi/files/requests-") for p, _ in server.log)

        # A wheel that is not the one the page names is refused.
        victim = next((out / "files").glob("idna-*.whl"))
        data = victim.read_bytes()
        victim.unlink()  # a hard link: do not touch the cached wheel
        victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        r = pip_install(venv_python, f"{server.url}/pypi/simple", "idna", target=tmp_path / "t2")
        assert r.returncode != 0 and "HASH" in (r.stdout + r.stderr).upper()
    finally:
        server.stop()


def test_lab_serves_the_steps_of_both_env_plans(monkeypatch):
    lines = ("numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6", "gguf>=0.1.0",
             "protobuf>=4.21.0,<5.0.0", "torch==2.11.0")  # fmt: skip
    monkeypatch.setattr(services, "converter_lines", lambda m, commit=None: lines)
    sets = services.requirement_sets(None)
    assert sets == [
        (("torch==2.13.0", "transformers==4.44.2", "accelerate==0.33.0", "datasets==3.0.1",
          "pyarrow==17.0.0", "zstandard==0.23.0"), ("torch==2.13.0", "numpy<2"), False),
        (("autoawq==0.2.7",), (), True),
        (("torch==2.13.0", "numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6",
          "gguf>=0.1.0", "protobuf>=4.21.0,<5.0.0"), ("torch==2.13.0",), False),
    ]  # fmt: skip


def test_lab_settings_point_every_python_and_model_source_at_the_lab():
    from llamarack_lab import LAB_GROUP_DATA, GATEWAY
    from llamarack_lab.tiny_model import TINY_MODEL_REVISION

    s = load_settings("lab", LAB_GROUP_DATA)
    index = f"http://{GATEWAY}:{services.SERVICES_PORT}/{services.PYPI_PATH}"
    assert s.python_env.index_url == s.python_env.torch_index_url == s.python_env.converter_torch_index_url == index
    assert s.model.hf_endpoint == f"http://{GATEWAY}:{services.HUB_PORT}"
    assert (s.model.repo, s.model.revision) == (services.HUB_REPO, TINY_MODEL_REVISION)
