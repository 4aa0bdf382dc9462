"""Facts read together (one shell command) and the per-run store.

The together-read runs real commands here (``sh``, as on a host) and must
give each fact exactly what reading it alone gives; the store must answer
from what a host said until one of that host's operations ran a command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from pyinfra.api import FactBase
from pyinfra.api.operation import OperationMeta
from pyinfra.context import ctx_host
from pyinfra.facts.files import File, Link, Sha1File

from llamarack import remote
from llamarack.facts import FactRead, FreeDiskBytes, read, read_together
from roles.server.reads import SystemUser
from llamarack.facts.reading import MISSING_COMMAND, Answer, FactsTogether, _command_text
from tests.support.ophost import FakeHost, fact_key


class NeedsAbsentTool(FactBase):
    requires_command = "llamarack-no-such-tool"
    command = "llamarack-no-such-tool --version"

    def process(self, output):
        return output[0]


class Fails(FactBase):
    command = "echo partial; exit 3"


def sh(command: str) -> tuple[int, list[str]]:
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout.splitlines()


def alone(r: FactRead):
    """What pyinfra makes of the fact read on its own: its process() of the output, its
    default when there is none (or the guard says its command is missing)."""
    fact = r.fact()
    status, lines = sh(_command_text(fact, dict(r.kwargs)))
    assert status == 0
    return fact.default() if not lines or lines == [MISSING_COMMAND] else fact.process(lines)


@pytest.fixture
def reads(tmp_path):
    target = tmp_path / "build-1"
    target.mkdir()
    (tmp_path / "current").symlink_to("build-1")
    # A link's first read (readlink, as stat's %N does) sets its atime under relatime while the
    # atime is not after the ctime: the read together and the read alone then straddled a
    # second now and then. An atime ahead is left as it is.
    now = time.time_ns()
    os.utime(tmp_path / "current", ns=(now + 3600 * 10**9, now), follow_symlinks=False)
    unit = tmp_path / "unit with space.service"
    unit.write_text("[Unit]\nDescription=x\n")
    return (
        # /dev: a filesystem nothing writes to while the test runs (the disk's free space moves
        # between the two reads when other jobs write)
        FactRead.of(FreeDiskBytes, path="/dev"),
        FactRead.of(SystemUser, user="nobody"),
        FactRead.of(SystemUser, user="llamarack-nobody-here"),
        FactRead.of(Sha1File, path=str(unit)),
        FactRead.of(Sha1File, path=str(tmp_path / "missing")),
        FactRead.of(Link, path=str(tmp_path / "current")),
        FactRead.of(File, path=str(unit)),
        FactRead.of(NeedsAbsentTool),
    )


def test_each_fact_read_together_gets_what_it_gets_alone(reads):
    together = FactsTogether()
    status, lines = sh(together.command(reads=reads))
    assert status == 0
    answers = together.process(lines)
    assert sorted(answers) == list(range(len(reads)))
    for i, r in enumerate(reads):
        assert answers[i] == Answer(0, alone(r)), r
    assert answers[1].value.home == "/nonexistent" and answers[2].value is None
    assert answers[7].value is None  # the command is missing: the fact's default


def test_a_failing_section_is_reported_not_processed_and_the_rest_still_read(reads):
    mixed = (reads[0], FactRead.of(Fails), reads[1])
    together = FactsTogether()
    answers = together.process(sh(together.command(reads=mixed))[1])
    assert answers[1] == Answer(3)
    assert answers[0].value == alone(reads[0]) and answers[2].value == alone(reads[1])


def test_output_that_looks_like_a_marker_cannot_split_a_section():
    together = FactsTogether()
    command = together.command(reads=(FactRead.of(Fails), FactRead.of(SystemUser, user="nobody")))
    # another read's marker, printed by a fact: it differs from this read's
    forged = FactsTogether().command(reads=(FactRead.of(Fails),)).split()[1]
    status, lines = sh(command.replace("echo partial", f"echo {forged} 1; echo {forged} rc 0"))
    answers = together.process(lines)
    assert answers[0] == Answer(3) and answers[1].value.name == "nobody"


class CountingHost(FakeHost):
    """A host whose fact commands are counted, as pyinfra would run them."""

    def __init__(self, facts):
        super().__init__(facts)
        self.commands = []

    def get_fact(self, fact_cls, *args, **kwargs):
        self.commands.append(fact_cls.__name__)
        if fact_cls is FactsTogether:
            return {i: Answer(0, super(CountingHost, self).get_fact(r.fact, **dict(r.kwargs)))
                    for i, r in enumerate(kwargs["reads"])}  # fmt: skip
        return super().get_fact(fact_cls, *args, **kwargs)


def complete(host: CountingHost, op_hash: str, commands: list) -> None:
    """An operation of ``host`` finished, having executed ``commands``, as pyinfra records it."""
    meta = OperationMeta(op_hash, is_change=None)
    meta.set_complete(True, commands, [], 0, 0)
    host.op_hash_order.append(op_hash)
    host.state.ops.setdefault(host, {})[op_hash] = type("OpData", (), {"operation_meta": meta})()


def test_the_store_answers_until_an_operation_of_the_host_runs_a_command():
    host = CountingHost({fact_key(FreeDiskBytes, path="/opt"): 100, fact_key(SystemUser, user="llamarack"): None,
                         fact_key(Sha1File, path="/etc/x"): "ab", fact_key(FreeDiskBytes, path="/srv"): 300})  # fmt: skip
    with ctx_host.use(host):
        read_together(FactRead.of(FreeDiskBytes, path="/opt"), FactRead.of(SystemUser, user="llamarack"))
        assert host.commands == ["FactsTogether"]
        assert read(FreeDiskBytes, path="/opt") == 100 and read(SystemUser, user="llamarack") is None
        read(Sha1File, path="/etc/x")
        read(Sha1File, path="/etc/x")
        assert host.commands == ["FactsTogether", "Sha1File"]
        complete(host, "no-change", [])  # an operation with nothing to do changes nothing
        read(FreeDiskBytes, path="/opt")
        assert host.commands == ["FactsTogether", "Sha1File"]
        complete(host, "changed", ["rm -rf /opt/x"])
        host.facts[fact_key(FreeDiskBytes, path="/opt")] = 200
        assert read(FreeDiskBytes, path="/opt") == 200
        assert host.commands == ["FactsTogether", "Sha1File", "FreeDiskBytes"]
        # other arguments are another fact
        assert read(FreeDiskBytes, path="/srv") == 300
        assert host.commands[-1] == "FreeDiskBytes" and len(host.commands) == 4


def test_each_host_and_each_run_has_its_own_store():
    root = fact_key(FreeDiskBytes, path="/")
    first, second = CountingHost({root: 1}), CountingHost({root: 2})
    second.name = "gpu02"
    second.state = first.state
    for host, value in ((first, 1), (second, 2)):
        with ctx_host.use(host):
            assert read(FreeDiskBytes, path="/") == value
    rerun = CountingHost({root: 3})  # a new State: a new run
    with ctx_host.use(rerun):
        assert read(FreeDiskBytes, path="/") == 3


def test_the_together_command_fits_one_argument_under_sudo(reads):
    from roles.preflight.reads import preflight_reads, role_reads
    from roles.settings import load_settings

    from roles.audit import audit_reads

    settings = load_settings("gpu01", {"llamacpp_backend": "cuda", "python_env_backend": "venv",
                                       "model_draft_repo": "org/draft-GGUF", "model_draft_revision": "a" * 40})  # fmt: skip
    for reads in (preflight_reads(settings) + role_reads(settings), audit_reads(settings, verify=True)):
        command = FactsTogether().command(reads=reads)
        # sudo sh -c COMMAND: one argument, which Linux caps at 128 KiB
        assert len(command.encode()) < 128 * 1024 - 4096, len(command)


@pytest.fixture
def host_runs(tmp_path):
    """Facts that are one host module's run each, on real files here: an env, a
    requirements file with an include, a GGUF; and where each is absent."""
    from roles.model.reads import GgufShape
    from roles.python_env.reads import PythonEnvPackages, RequirementsFile
    from roles.llamacpp.files import llamacpp_proof

    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    (env / "lib" / "python3.11" / "site-packages" / "accelerate-0.33.0.dist-info").mkdir(parents=True)
    (tmp_path / "base.txt").write_text("numpy~=1.26\n--extra-index-url http://x\n")
    (tmp_path / "req.txt").write_text("-r base.txt\ntorch==2.13.0  # pinned\n")
    gguf = tmp_path / "model.gguf"
    llamacpp_proof.write_smoke_gguf(str(gguf))
    return (
        FactRead.of(PythonEnvPackages, env=str(env)),
        FactRead.of(PythonEnvPackages, env=str(tmp_path / "no-env")),
        FactRead.of(RequirementsFile, path=str(tmp_path / "req.txt")),
        FactRead.of(RequirementsFile, path=str(tmp_path / "no.txt")),
        FactRead.of(GgufShape, path=str(gguf)),
        FactRead.of(GgufShape, path=str(tmp_path / "no.gguf")),
        # /dev: a filesystem nothing writes to while the test runs (the disk's free space moves
        # between the two reads when other jobs write)
        FactRead.of(FreeDiskBytes, path="/dev"),
    )


def test_host_module_runs_read_together_carry_each_source_once_and_get_what_they_get_alone(host_runs):
    together = FactsTogether()
    command = together.command(reads=host_runs)
    for name in ("env_packages", "requirements_flatten", "gguf_header"):
        assert command.count(remote.argv(remote.source(name))) == 1, name  # each read twice or more
    status, lines = sh(command)
    answers = together.process(lines)
    assert status == 0 and sorted(answers) == list(range(len(host_runs)))
    for i, r in enumerate(host_runs[:-1]):
        assert answers[i] == Answer(0, alone(r)), r
    env, no_env, req, no_req, gguf, no_gguf, _ = (answers[i].value for i in range(len(host_runs)))
    assert env.python_version == "3.11.2" and env.packages == {"accelerate": "0.33.0"} and no_env is None
    assert req == ("numpy~=1.26", "torch==2.13.0") and no_req is None
    assert gguf["architecture"] == "llama" and no_gguf is None


def test_without_python3_each_host_module_fact_answers_as_it_would_alone(host_runs, tmp_path):
    bin_dir = tmp_path / "bin"  # sh's tools, but no python3
    bin_dir.mkdir()
    for tool in ("stat", "dirname"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                    text=True).stdout.strip())  # fmt: skip
    together = FactsTogether()
    r = subprocess.run(["/bin/sh", "-c", together.command(reads=host_runs)], capture_output=True, text=True,
                       env={"PATH": str(bin_dir)})  # fmt: skip
    answers = together.process(r.stdout.splitlines())
    assert answers[4] == answers[5] == Answer(0, None)  # GgufShape requires python3: missing, its default
    assert answers[0] == answers[2] == Answer(127)  # the shell's "not found", not kept
    assert answers[6].status == 0 and answers[6].value > 0


@pytest.fixture
def twins(tmp_path):
    """Facts whose shell commands only cat and stat files, each with its Python twin
    (``host_twin``), on real files here: present, absent, a directory, an empty file,
    a last line without its newline, a name with a space and a quote."""
    from pyinfra.facts.files import Directory, File, FileContents

    from roles.llamacpp.reads import BenchRecord, BuildRecord, LlamacppBuilds, LlamaServerFlags
    from llamarack.facts import FreeDiskBytes
    from roles.model.reads import ModelArtifact
    from roles.driver.reads import NvidiaKernelModule
    from roles.driver.reads import RecordedGpus

    root = tmp_path / "root"
    build = root / "builds" / "498d323e499aa37d"
    build.mkdir(parents=True)
    (build / "build-info.json").write_text('{"stamp": "498d323e499aa37d",\n "proof": {"runtime_args": ["--no-repack"]}}\n')
    help_text = os.path.join(os.path.dirname(__file__), "..", "fixtures", "llama-server", "help-0c1e57098.txt")
    (build / "server-help.txt").write_bytes(open(help_text, "rb").read())  # the pinned llama-server's --help
    (root / "builds" / "current").symlink_to(build)
    (root / "builds" / "9d0e4b1c2a3f5e6d").mkdir()  # partial: no build-info.json
    (root / "builds" / ".staging").mkdir()  # the shell's */ skips dot names
    (root / "builds" / "notes.txt").write_text("a file, not a build\n")
    os.utime(build / "build-info.json", ns=(1764441600_999999999, 1764441600_999999999))
    bare = tmp_path / "bare"  # a current build with no help saved
    (bare / "builds" / "x").mkdir(parents=True)
    (bare / "builds" / "current").symlink_to(bare / "builds" / "x")
    model = tmp_path / "models" / "a2edeea9af9ba732"
    model.mkdir(parents=True)
    (model / "model.gguf").write_bytes(b"GGUF" + bytes(60))
    (model / "stamp.json").write_text('{"stamp": "a2edeea9af9ba732", "gguf": {"size": 64}}\n')
    os.utime(model / "model.gguf", ns=(1764441600_123456789, 1764441600_123456789))
    unsealed = tmp_path / "models" / "unsealed"
    unsealed.mkdir()
    (unsealed / "model.gguf").write_bytes(b"GGUF")
    linked = tmp_path / "models" / "linked"  # model.gguf a symlink: stat(1) without -L stats the link
    linked.mkdir()
    (linked / "model.gguf").symlink_to(model / "model.gguf")
    (linked / "stamp.json").write_text('{"stamp": "linked", "gguf": {"size": 64}}\n')
    odd = tmp_path / "it's a file"
    odd.write_text("one\ntwo")  # no newline at the end
    (tmp_path / "empty").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "it's a link").symlink_to(build)
    (tmp_path / "back\\slash.service").write_text("[Unit]\n")  # sha1sum escapes the name
    (tmp_path / "gpus.json").write_text('[{"index": 0, "name": "Tesla V100-SXM2-16GB", "uuid": "GPU-5f1c",'
                                        ' "memory_mib": 16384, "compute_cap": "7.0"}]\n')
    # Reading a link or a directory may move its atime (relatime: the first read after a
    # change): an atime ahead of the clock and of mtime and ctime keeps it still, so the
    # stat lines printed a moment apart are the same.
    import time

    ahead = time.time_ns() + 3600 * 10**9
    for p in (root, root / "builds", root / "builds" / "current", tmp_path / "dangling", tmp_path / "it's a link",
              tmp_path / "gpus.json"):
        os.utime(p, ns=(ahead, 1764441600 * 10**9), follow_symlinks=False)
    here = {name: str(tmp_path / name) for name in ("gpus.json", "absent.json", "absent", "empty", "dangling",
                                                     "it's a link", "back\\slash.service", "no-root")}
    here["."], builds = str(tmp_path), str(root / "builds")
    paths = {  # fact: its cases, by name
        RecordedGpus: ("gpus.json", "absent.json", "."),
        BenchRecord: ("empty",),
        ModelArtifact: {"sealed": str(model), "unsealed": str(unsealed), "linked": str(linked),
                        "absent": str(tmp_path / "models" / "absent")},
        FileContents: {"odd": str(odd), "gpus.json": here["gpus.json"], "absent": here["absent"], ".": here["."]},
        Sha1File: {"odd": str(odd), "back\\slash.service": here["back\\slash.service"], "absent": here["absent"],
                   ".": here["."]},
        Link: {"current": builds + "/current", "builds": builds, "dangling": here["dangling"],
               "absent": here["absent"], "it's a link": here["it's a link"]},
        File: ("gpus.json",),
        Directory: {"root": str(root)},
        # a filesystem whose free blocks stay put between the two runs (proc: none, ever)
        FreeDiskBytes: {"proc": "/proc/self/status", "absent under proc": "/proc/llamarack-absent/a/b/"},
    }
    roots = {BuildRecord: (root, tmp_path / "no-root"), LlamaServerFlags: (root, bare),
             LlamacppBuilds: (root, bare, tmp_path / "no-root")}
    reads = {"NvidiaKernelModule": FactRead.of(NvidiaKernelModule)}
    for fact, cases in paths.items():
        for case, path in (cases.items() if isinstance(cases, dict) else ((c, here[c]) for c in cases)):
            reads[f"{fact.__name__} {case}"] = FactRead.of(fact, path=path)
    for fact, cases in roots.items():
        for case in cases:
            reads[f"{fact.__name__} {case.name}"] = FactRead.of(fact, root=str(case))
    return reads


def test_file_facts_read_together_answer_as_alone(twins, tmp_path):
    together = FactsTogether()
    reads = tuple(twins.values())
    status, lines = sh(together.command(reads=reads))
    answers = together.process(lines)
    assert status == 0
    answer = {name: answers.get(i) for i, name in enumerate(twins)}
    for name, r in twins.items():
        if name == "FileContents odd":
            assert answer[name] is None  # no newline at the end: glued to the section's end, as the shell's is
            continue
        assert answer[name] == Answer(0, alone(r)), r
    assert answer["ModelArtifact sealed"].value.signature["mtime_ns"] == 1764441600_123456789
    assert answer["LlamacppBuilds root"].value.verified == {"498d323e499aa37d": 1764441600}
    assert answer["LlamacppBuilds root"].value.partial == ("9d0e4b1c2a3f5e6d",)
    assert answer["LlamacppBuilds no-root"].value.current is None
    assert len(answer["Sha1File odd"].value) == 40 and answer["Sha1File absent"].value is None
    build = str(tmp_path / "root" / "builds" / "498d323e499aa37d")
    assert answer["Link current"].value["link_target"] == build and answer["Link builds"].value is False
    assert answer["Link absent"].value is None and answer["Link it's a link"].value["link_target"] == build
    assert answer["Directory root"].value["mode"] == 755
