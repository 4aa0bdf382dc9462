"""The model pipeline's steps run as their own user in a systemd sandbox (roles/model/sandbox.py).

The commands the model operation yields are read back as the shell and then
systemd hand them over (``tests.support.fake_systemd_run.steps``): every
step runs through ``systemd-run --quiet --wait --pipe --collect`` as the
pipeline's user with the served unit's kind of restrictions; convert and
quantize without the network and with the hub libraries offline, writing
only the work directory. Odd values reach the step word for word (run here,
through a stand-in ``systemd-run``), values systemd-run would read otherwise
are refused, this machine's ``systemd-run`` parses every option (asking a
private session bus, where no manager answers) and ``systemd-analyze`` reads
and rates the steps' properties. Root's
take-over of what the steps made runs here for real: it refuses links, and
leaves root the only writer of what is served.
"""

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


from roles.model import sandbox
from roles.model.plan import plan_model
from tests.roles.test_model_ops import LISTING, commands, on_host, settings
from tests.support import fake_systemd_run

PLAN = plan_model(settings(), LISTING)
W = f"{PLAN.staging}/work"
def new(plan) -> dict:
    """A host without the artifact, with the disk to make it (what the operation reads)."""
    return on_host(plan, None, free=100 << 30)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="owners are changed: needs root")
needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze")


def steps(plan=PLAN, **kwargs) -> dict:
    """The plan's sandboxed steps by name (fetch, convert, quantize)."""
    cmds, _ = commands(plan, new(plan), **kwargs)
    return {st.description.rsplit(" ", 1)[1]: st for c in cmds if isinstance(c, str)
            for st in fake_systemd_run.steps(c)}  # fmt: skip


def test_each_step_runs_as_the_pipeline_user_through_systemd_run():
    found = steps()
    assert sorted(found) == ["convert", "fetch", "quantize"]
    for st in found.values():
        assert st.flags == ["--quiet", "--wait", "--pipe", "--collect"]
        assert st.uid == "llamarack-model" == sandbox.PIPELINE_USER and st.workdir == W
        for prop in sandbox.CONFINED:
            assert prop in st.properties, prop
        assert ("NoNewPrivileges", "yes") in st.properties and ("ProtectSystem", "strict") in st.properties
        assert st.env["HOME"] == "/tmp"  # the user has no home; /tmp is the unit's own


def test_convert_and_quantize_have_no_network_and_write_only_the_work_directory():
    found = steps()
    for name in ("convert", "quantize"):
        st = found[name]
        assert {("PrivateNetwork", "yes"), ("IPAddressDeny", "any"), ("RestrictAddressFamilies", "AF_UNIX"),
                ("PrivateTmp", "yes"), ("ProtectHome", "yes"), ("PrivateDevices", "yes")} <= set(st.properties)
        assert st.values("ReadWritePaths") == [W]
        assert st.env["HF_HUB_OFFLINE"] == "1" and st.env["TRANSFORMERS_OFFLINE"] == "1"
        assert st.env["HF_HOME"].startswith("/tmp/")  # the hub's dynamic modules land in the private /tmp
    # the checkpoint is read-only even inside the work directory: its code cannot rewrite it
    assert found["convert"].values("ReadOnlyPaths") == [f"-{W}/hf"]
    assert "convert_hf_to_gguf.py" in found["convert"].argv[2] and "llama-quantize" in found["quantize"].argv[2]


def test_the_fetch_has_the_network_and_writes_only_under_the_root():
    st = steps()["fetch"]
    assert ("PrivateNetwork", "yes") not in st.properties and not st.values("IPAddressDeny")
    assert st.values("RestrictAddressFamilies") == ["AF_INET AF_INET6 AF_UNIX"]
    # one mount over the work directory and the blob cache: a cached blob is hardlinked, not copied
    assert st.values("ReadWritePaths") == ["/opt/lr"]
    assert st.argv[:3] == ["python3", "-c", sandbox.remote.source("model_fetch")] and "fetch" in st.argv


def test_no_step_word_leaves_a_dollar_for_systemd_to_expand():
    odd = {"convert_python": "/opt/$HOME/${USER}/$$/py", "quantize": "/opt/q$/llama-quantize"}
    for st in steps(tool_paths=odd).values():
        for word in st.words:
            assert "$" not in word.replace("$$", ""), word
    convert = steps(tool_paths=odd)["convert"]
    assert shlex.split(convert.argv[2])[0] == "/opt/$HOME/${USER}/$$/py"


TOOL = """#!/usr/bin/env python3
import json, os, sys
out = sys.argv[sys.argv.index("--outfile") + 1]
open(out, "w").write("GGUF")
json.dump({"argv": sys.argv[1:], "out": out, "cwd": os.getcwd()}, open(os.environ["LLAMARACK_TEST_ARGV"], "w"))
"""


@as_root
def test_an_odd_tool_path_reaches_the_step_word_for_word(tmp_path, monkeypatch):
    """Root's shell, systemd (the stand-in: ``$$`` made ``$``) and the step's ``sh -c`` each
    read their part: the tool runs under its odd name, with the plan's words."""
    monkeypatch.setenv("PATH", fake_systemd_run.path_with(fake_systemd_run.install(tmp_path / "bin")))
    monkeypatch.setenv("LLAMARACK_TEST_ARGV", str(tmp_path / "argv.json"))
    odd = tmp_path / "odd dir $HOME ${X} %h 'q' \"dq\" ;&|" / "py $$ x"
    odd.parent.mkdir()
    odd.write_text(TOOL)
    odd.chmod(0o755)
    plan = plan_model(settings(llamarack_root=str(tmp_path / "lr"), llamarack_allow_shared_dirs=True), LISTING)
    work = f"{plan.staging}/work"
    os.makedirs(f"{work}/hf")
    cmds, _ = commands(plan, new(plan), tool_paths={"convert_python": str(odd)}, user="nobody")
    convert = next(c for c in cmds if isinstance(c, str) and "model convert" in c)
    r = subprocess.run(["bash", "-c", convert], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + Path(plan.staging, "convert.log").read_text()
    seen = json.loads((tmp_path / "argv.json").read_text())
    script = f"{tmp_path}/lr/src/llama.cpp/convert_hf_to_gguf.py"
    assert seen["argv"][:4] == [script, f"{work}/hf", "--outtype", "f16"]
    # the temporary name carries the step's own shell's pid, and the file moved into place
    assert re.fullmatch(re.escape(f"{work}/model-f16.gguf.tmp.") + r"\d+", seen["out"]) and seen["cwd"] == work
    assert Path(work, "model-f16.gguf").read_text() == "GGUF"


@as_root
def test_a_failed_step_fails_the_operation_with_its_logs_tail(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_systemd_run.path_with(fake_systemd_run.install(tmp_path / "bin")))
    tool = tmp_path / "convert"
    tool.write_text("#!/bin/sh\necho 'the checkpoint says no' >&2\nexit 3\n")
    tool.chmod(0o755)
    plan = plan_model(settings(llamarack_root=str(tmp_path / "lr"), llamarack_allow_shared_dirs=True), LISTING)
    os.makedirs(f"{plan.staging}/work/hf")
    cmds, _ = commands(plan, new(plan), tool_paths={"convert_python": str(tool)}, user="nobody")
    convert = next(c for c in cmds if isinstance(c, str) and "model convert" in c)
    r = subprocess.run(["bash", "-c", convert], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "the checkpoint says no" in r.stderr, (r.returncode, r.stderr)
    assert "the checkpoint says no" in Path(plan.staging, "convert.log").read_text()
    assert not Path(plan.staging, "work", "model-f16.gguf").exists()


def test_values_systemd_run_would_read_otherwise_are_refused():
    ok = dict(user="llamarack-model", workdir="/opt/lr/w", props=sandbox.properties(["/opt/lr/w"]), env=())
    assert sandbox.command("convert", ["/bin/true"], **ok).startswith("systemd-run --quiet --wait --pipe --collect ")
    for bad in ({"workdir": "/opt/lr/a b"}, {"workdir": "relative"}, {"workdir": "/opt/lr/../etc"},
                {"props": sandbox.properties(["/opt/lr/a b"])}, {"props": sandbox.properties(["/w"], ["/x\ny"])},
                {"props": (("Environment", "A=$B"),)}, {"props": (("ProtectSystem", 'strict"'),)},
                {"env": (("HOME", "/tmp\nX=1"),)}, {"env": (("HOME", "$HOME"),)},
                {"user": "root"}, {"user": "Bad User"}, {"user": "a;b"}):  # fmt: skip
        with pytest.raises(sandbox.SandboxValueError):
            sandbox.command("convert", ["/bin/true"], **{**ok, **bad})


def unit_of(props, env) -> str:
    """The steps' properties as a unit file, for systemd's offline tools to read."""
    return ("[Service]\nType=oneshot\nUser=llamarack-model\nExecStart=/bin/true\n"
            + "".join(f"{k}={v}\n" for k, v in props) + "".join(f"Environment={k}={v}\n" for k, v in env))  # fmt: skip


@needs_analyze
@pytest.mark.parametrize("name, props, env, most", [
    ("convert", sandbox.properties(["/opt/lr/w"], ["/opt/lr/w/hf"]), sandbox.OFFLINE_ENV, 1.5),
    ("fetch", sandbox.properties(["/opt/lr"], network=True), sandbox.HOME_ENV, 2.0),
])  # fmt: skip
def test_systemd_reads_every_property_and_rates_the_steps_ok(name, props, env, most):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"llamarack-model-{name}.service"
        path.write_text(unit_of(props, env))
        verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        rating = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    assert verify.returncode == 0 and not re.search(r"Unknown|Failed to parse|Invalid", verify.stderr), verify.stderr
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", rating.stdout).group(1))
    assert score <= most, rating.stdout


@pytest.mark.skipif(not (shutil.which("systemd-run") and shutil.which("dbus-run-session")),
                    reason="needs systemd-run and dbus-run-session")
@pytest.mark.parametrize("name", ["fetch", "convert", "quantize"])
def test_this_machines_systemd_run_reads_every_option_of_the_step(name, tmp_path):
    """systemd-run parses each option and property itself before it asks the manager; here
    it asks a private session bus, where no manager answers: the ask, not a parse error."""
    st = steps()[name]
    argv = ["systemd-run", "--user", *st.flags, f"--uid={st.uid}", f"--description={st.description}",
            f"--working-directory={st.workdir}", *(w for k, v in st.properties for w in ("-p", f"{k}={v}")),
            *(f"--setenv={k}={v}" for k, v in st.env.items()), "--", "/bin/true"]  # fmt: skip
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # no user manager's socket there
    r = subprocess.run(["dbus-run-session", "--", *argv], capture_output=True, text=True, env=env, timeout=60)
    said = [line for line in r.stderr.splitlines() if not line.startswith("dbus-daemon")]
    assert not any(re.search(r"Unknown|Failed to parse|Invalid|unrecognized|not supported", x) for x in said), said
    assert r.returncode == 0 or any("Failed to start transient service unit" in x for x in said), said


def take_over(plan) -> str:
    cmds, _ = commands(plan, new(plan), user="nobody")
    return next(c for c in cmds if isinstance(c, str) and c.startswith(f"if [ -d {plan.staging}/work ]"))


def made(tmp_path, **data):
    """A staging as the steps leave it: the work directory the pipeline user's (nobody)."""
    plan = plan_model(settings(llamarack_root=str(tmp_path / "lr"), llamarack_allow_shared_dirs=True, **data), LISTING)
    s, w = Path(plan.staging), Path(plan.staging, "work")
    (w / "hf").mkdir(parents=True)
    blob = tmp_path / "lr" / "cache" / "blobs" / "sha256" / ("5" * 64)
    blob.parent.mkdir(parents=True)
    blob.write_text("weights")
    os.link(blob, w / "hf" / "model.safetensors")  # as the fetch links a cached blob
    (w / "model-f16.gguf").write_text("f16")
    (w / "model.gguf").write_text("GGUF")
    (w / "junk").write_text("x")
    nobody = pwd.getpwnam("nobody")
    for p in [s, w, blob, *w.rglob("*")]:
        os.lchown(p, nobody.pw_uid, nobody.pw_gid)
    (w / "model.gguf").chmod(0o6777)  # (chown cleared the set-id bits)
    return plan, s, w, blob


@as_root
def test_the_take_over_leaves_root_the_only_writer_and_the_cache_its_blobs(tmp_path):
    plan, s, w, blob = made(tmp_path)
    r = subprocess.run(["bash", "-c", take_over(plan)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not w.exists() and sorted(p.name for p in s.iterdir()) == ["model.gguf"]
    st = (s / "model.gguf").stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (0, 0, "0o755")  # no set-id bit, no other writer
    assert (s.stat().st_uid, oct(s.stat().st_mode & 0o777)) == (0, "0o700")
    # the checkpoint's files went, and the blob they linked is still the pipeline user's
    assert blob.stat().st_uid == pwd.getpwnam("nobody").pw_uid


@as_root
def test_the_take_over_keeps_the_intermediates_when_asked_owned_by_root(tmp_path):
    plan, s, w, blob = made(tmp_path, model_keep_intermediates=True)
    r = subprocess.run(["bash", "-c", take_over(plan)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in s.iterdir()) == ["hf", "model-f16.gguf", "model.gguf"]
    assert {p.stat().st_uid for p in s.rglob("*")} == {0}  # the kept blob's too: served files are root's


@pytest.mark.parametrize("plant", ["symlink", "fifo", "gguf"])
@as_root
def test_the_take_over_refuses_links_and_special_files(tmp_path, plant):
    plan, s, w, _ = made(tmp_path)
    if plant == "symlink":
        (w / "hf" / "x").symlink_to("/etc/shadow")
    elif plant == "fifo":
        os.mkfifo(w / "pipe")
    else:  # the GGUF itself: root would chmod what it points at
        (w / "model.gguf").unlink()
        (w / "model.gguf").symlink_to("/etc/shadow")
    shadow = os.stat("/etc/shadow")
    r = subprocess.run(["bash", "-c", take_over(plan)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"gpu01: model {plan.name}: its pipeline left links or special files in {w}" in r.stderr
    assert not w.exists() and not (s / "model.gguf").exists()
    assert os.stat("/etc/shadow") == shadow  # what a link pointed at: untouched


def test_the_token_never_lies_where_the_pipeline_user_writes(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    cmds, _ = commands(PLAN, new(PLAN), token_file=str(token))
    (upload,) = [c for c in cmds if isinstance(c, tuple) and "hf_secret" in c[2]]
    assert upload[1].startswith("/run/llamarack/") and not upload[1].startswith(PLAN.staging)


def test_the_pipeline_user_is_its_own_account_and_not_llama_servers(monkeypatch):
    import roles.model.deploy as role

    made, refused = [], []
    monkeypatch.setattr(role, "system_account", lambda **kw: made.append(kw))
    monkeypatch.setattr(role, "refuse", lambda **kw: refused.append(kw["reason"]))
    assert role.pipeline_user(settings()) is True
    assert made == [{"name": "Model pipeline user llamarack-model", "user": "llamarack-model", "home": "/nonexistent"}]
    made.clear()
    assert role.pipeline_user(settings(llamarack_service_user="llamarack-model")) is False
    assert made == [] and "llamarack_service_user: given 'llamarack-model'" in refused[0]


def test_the_operation_takes_the_user_it_is_given():
    cmds, _ = commands(PLAN, new(PLAN), user="llamarack-pipe")
    assert {st.uid for c in cmds if isinstance(c, str) for st in fake_systemd_run.steps(c)} == {"llamarack-pipe"}
    assert 'install -d -m 700 -o llamarack-pipe -g "$(id -g -- llamarack-pipe)"' in cmds[0]
