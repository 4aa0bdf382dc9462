"""Paths a local user of a host could use, each closed: uploads through a private directory of
a random name, a service user llamarack made or none, no index credential on a command line,
host keys pinned in the inventory meant to be copied."""

import hashlib
import json
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host
from pyinfra.facts.files import File, Sha1File

from llamarack.operations import UPLOAD_DIR_PREFIX, private_upload, put_file, secret_upload
from roles.driver.operations import record_gpus
from roles.driver.reads import DriverState, KernelModule, NvidiaSmi
from roles.preflight.reads import gather, preflight_reads
from roles.python_env.operations import converter_pins, pip_pins
from roles.python_env.plan import LockError, PipStep, awq_lock, awq_plan, locked_requirements
from roles.python_env.reads import PythonEnvPackages, RequirementsFile
from roles.server.operations import service, system_account
from roles.server.reads import SERVICE_USER_MARK, PasswdEntry, SystemGroup, SystemUser
from roles.preflight.facts import HostFacts
from roles.preflight.rules import evaluate
from roles.settings import load_settings
from tests.roles.test_server_ops import V100, facts as server_facts, settings as server_settings
from tests.support.facts import FACTS
from tests.support.ophost import FakeHost, FakeState, fact_key
from tests.unit.test_example_inventory import inventory_data

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = re.compile(re.escape(UPLOAD_DIR_PREFIX) + r"([0-9a-f]{32})")


def raw(op, facts: dict, **kwargs) -> list:
    """The commands ``op`` yields, as pyinfra gets them (uploads with their temporary names)."""
    with ctx_host.use(FakeHost(facts, state=FakeState(True))):
        return list(op._inner(**kwargs))


# --- every upload lies in a private directory of a random name --------------------------


def _gpu_record():
    return raw(record_gpus, {}, path="/opt/llamarack/state/gpus.json", gpus=(V100,), recorded=())


def _unit_and_key(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    key.chmod(0o600)
    return raw(service, server_facts(), settings=server_settings(server_api_key_file=str(key)), gpus=(V100,))


def _apt_sources():
    dest = "/etc/apt/sources.list.d/x.sources"
    return raw(put_file, {fact_key(File, path=dest): None, fact_key(Sha1File, path=dest): None}, text="Types: deb\n",
               dest=dest)


def _pip_indexes():
    plan = awq_plan(load_settings("h", {"python_env_backend": "venv"}), "/opt/llamarack/envs/awq")
    return raw(pip_pins, {fact_key(PythonEnvPackages, env=plan.env): None}, plan=plan)


UPLOADERS = {
    "gpu record": lambda tmp: _gpu_record(),
    "unit and api key": _unit_and_key,
    "apt sources": lambda tmp: _apt_sources(),
    "pip index file": lambda tmp: _pip_indexes(),
    "secret": lambda tmp: list(secret_upload("s", "/etc/llamarack/x", mode="600")),
}


@pytest.mark.parametrize("uploader", UPLOADERS, ids=list(UPLOADERS))
def test_every_upload_lies_in_a_private_directory_of_a_random_name(uploader, tmp_path):
    commands = UPLOADERS[uploader](tmp_path)
    uploads = [i for i, c in enumerate(commands) if isinstance(c, FileUploadCommand)]
    assert uploads
    for i in uploads:
        upload, made, removed = commands[i], commands[i - 1], commands[i + 1]
        found = PRIVATE.fullmatch(str(Path(upload.remote_temp_filename).parent))
        assert found and Path(upload.remote_temp_filename).name == "file"
        # pyinfra's own name: /tmp/pyinfra-<sha1 of the destination>, which anyone can compute
        assert hashlib.sha1(upload.dest.encode()).hexdigest() not in upload.remote_temp_filename
        private = found.group(0)
        # made as the SSH user (not root), mode 700, by mkdir (which fails on a name taken)
        assert made.connector_arguments == {"_sudo": False} == removed.connector_arguments
        assert made.get_raw_value() == (f"umask 077 && mkdir -m 700 {private} && "
                                        f"install -m 600 /dev/null {upload.remote_temp_filename}")  # fmt: skip
        assert removed.get_raw_value() == f"rm -rf {private}"
    again = UPLOADERS[uploader](tmp_path)
    names = {c.remote_temp_filename for c in commands + again if isinstance(c, FileUploadCommand)}
    assert len(names) == 2 * len(uploads)  # a new name each time: none can be made ahead


def test_private_upload_takes_text_or_a_file_object():
    text = list(private_upload("abc", "/x.new"))[1]
    assert text.src.getvalue() == "abc" and text.dest == "/x.new"


# lines that make a FileUploadCommand: only private_upload may
UPLOAD_MAKERS = re.compile(r"FileUploadCommand\(|files\.put\(|files\.put\._inner\(")
# the uploads of these files are changed where they are owned; each one still names
# the temporary pyinfra would foresee, and must go through private_upload
ELSEWHERE: set = set()


def test_no_upload_bypasses_the_private_helper():
    found = []
    for path in sorted([*ROOT.glob("llamarack/*.py"), *ROOT.glob("roles/*/*.py")]):
        rel = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if UPLOAD_MAKERS.search(line) and rel not in ELSEWHERE:
                found.append(f"{rel}:{number}: {line.strip()}")
    helper = [f for f in found if f.startswith("llamarack/operations.py:")]
    assert len(helper) == 1 and "remote_temp_filename=temp" in helper[0], found
    assert found == helper


# --- the service user: made by llamarack, or refused -------------------------------------

ROOT_DIR = "/opt/llamarack"
UIDS = (101, 999)
ACCOUNTS = {
    # Debian 12's: openssh-server, the backup system user, apt's sandbox user
    "sshd": (PasswdEntry("sshd", 104, 65534, "/run/sshd", "/usr/sbin/nologin", "", UIDS), None),
    "backup": (PasswdEntry("backup", 34, 34, "/var/backups", "/usr/sbin/nologin", "backup", UIDS), 34),
    "_apt": (PasswdEntry("_apt", 42, 65534, "/nonexistent", "/usr/sbin/nologin", "", UIDS), None),
    "alice": (PasswdEntry("alice", 1000, 1000, "/home/alice", "/bin/bash", "Alice,,,", UIDS), 1000),
    "toor": (PasswdEntry("toor", 0, 0, "/root", "/bin/sh", "", UIDS), 0),
    # a system account someone else made, with the llamarack root as its home
    "svc": (PasswdEntry("svc", 998, 998, ROOT_DIR, "/bin/sh", "", UIDS), 998),
    # the mark copied onto a login account
    "marked": (PasswdEntry("marked", 1001, 1001, ROOT_DIR, "/usr/sbin/nologin", SERVICE_USER_MARK, UIDS), 1001),
    # llamarack's mark, but the group of its name is not its own
    "llm": (PasswdEntry("llm", 990, 100, ROOT_DIR, "/usr/sbin/nologin", SERVICE_USER_MARK, UIDS), 991),
    # no account, but a group of that name (useradd would fail; the API key would go to it)
    "ops": (None, 27),
}


def service_facts(entry, group) -> HostFacts:
    return HostFacts(driver=DriverState("ok", (V100,)), module=KernelModule("550.127.05", False),
                     service_user=entry, service_group=group)  # fmt: skip


def account_settings(user: str, **data):
    return load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu",
                                   "llamarack_service_user": user, **data})  # fmt: skip


@pytest.mark.parametrize("user", ACCOUNTS, ids=list(ACCOUNTS))
def test_an_account_llamarack_did_not_make_is_refused_before_anything_is_touched(user):
    entry, group = ACCOUNTS[user]
    failures = evaluate(account_settings(user), service_facts(entry, group))
    assert [f.rule for f in failures] == ["service-user"]
    message = failures[0].message("gpu01")
    # the host, the account, what was found, and the fix
    assert message.startswith("gpu01: service-user: found ") and repr(user) in message
    taken_on = entry is None or entry.made_by_llamarack(ROOT_DIR)
    assert (f"gid {group}" if taken_on else entry.describe()) in message
    assert "Fix: set llamarack_service_user to a name no account or group of this host has" in message
    # the operation refuses as well, and neither useradd nor usermod runs
    commands = raw(system_account, account_facts(user, entry, group), **account_args(account_settings(user)))
    assert len(commands) == 1 and "exit 1" in str(commands[0]) and "service-user" in str(commands[0])


def fixture(fact: str, case: str):
    data = json.loads((ROOT / f"tests/facts/{fact}/{case}.json").read_text())
    return getattr(FACTS, fact)().process(data["output"])


def _lab_account():
    """What a lab host has after a deploy by llamarack before it marked its account."""
    entry = fixture("SystemUser", "service-user")
    return entry, entry.gid


CASES = {
    "fresh host": ((None, None), ["useradd --system --user-group --no-create-home --home-dir /opt/llamarack "
                                  f"--shell /usr/sbin/nologin --comment '{SERVICE_USER_MARK}' llamarack"]),
    "deployed before the mark": (_lab_account(), ["usermod --home /opt/llamarack --shell /usr/sbin/nologin "
                                                  f"--comment '{SERVICE_USER_MARK}' llamarack"]),
    "marked": ((fixture("SystemUser", "service-user-marked"), fixture("SystemGroup", "service-group")), []),
}


def account_facts(user: str, entry, group) -> dict:
    """What ``system_account`` reads: the one account and the one group of that name."""
    return {fact_key(SystemUser, user=user): entry, fact_key(SystemGroup, group=user): group}


def account_args(s) -> dict:
    """The service user's ``system_account`` arguments, as the server role's deploy passes them."""
    return {"user": s.general.service_user, "home": s.general.root, "setting": "llamarack_service_user"}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_lab_and_a_fresh_host_keep_their_service_user(case):
    (entry, group), wanted = CASES[case]
    s = account_settings("llamarack")
    assert evaluate(s, service_facts(entry, group)) == []
    commands = raw(system_account, account_facts(s.general.service_user, entry, group), **account_args(s))
    assert [c.get_raw_value() for c in commands] == wanted


def test_a_marked_account_moved_with_the_root_is_taken_on():
    entry, group = fixture("SystemUser", "service-user-marked"), fixture("SystemGroup", "service-group")
    s = account_settings("llamarack", llamarack_root="/srv/llamarack")
    assert evaluate(s, service_facts(entry, group)) == []
    commands = raw(system_account, account_facts(s.general.service_user, entry, group), **account_args(s))
    assert [c.get_raw_value() for c in commands] == [
        f"usermod --home /srv/llamarack --shell /usr/sbin/nologin --comment '{SERVICE_USER_MARK}' llamarack"]


def test_the_system_uid_range_is_the_hosts():
    lines = ["llamarack:x:450:450:llamarack service user:/opt/llamarack:/usr/sbin/nologin"]
    assert SystemUser().process(lines + ["login.defs UID_MIN 500"]).system_uids == (101, 499)
    narrow = SystemUser().process(lines + ["login.defs SYS_UID_MIN 100", "login.defs SYS_UID_MAX 400"])
    assert narrow.system_uids == (100, 400) and not narrow.made_by_llamarack(ROOT_DIR)


def test_preflight_reads_the_service_user_only_where_the_server_role_runs():
    both = {r.fact for r in preflight_reads(account_settings("llamarack"))}
    assert {SystemUser, SystemGroup} <= both
    alone = account_settings("llamarack", llamarack_roles="driver")
    assert not {SystemUser, SystemGroup} & {r.fact for r in preflight_reads(alone)}
    entry = fixture("SystemUser", "nobody")

    def read(fact, **kwargs):
        return {SystemUser: entry, SystemGroup: 65534, NvidiaSmi: DriverState("ok", ())}.get(fact, fact().default())

    assert gather(alone, read=read).service_user is None
    assert gather(account_settings("llamarack"), read=read).service_user == entry


# --- no index credential on a command line -----------------------------------------------

SECRET = "s3cr3t-pw"
TOKEN = "tok-9f8e7d"
INDEXES = (f"https://deploy:{SECRET}@pypi.example.org/simple", f"https://mirror.example.org/torch?token={TOKEN}")


def secret_plan():
    """The AWQ plan with index URLs that carry a password and a token."""
    plan = awq_plan(load_settings("h", {"python_env_backend": "venv"}), "/opt/llamarack/envs/awq")
    urls = {plan.steps[1].index_url: INDEXES[0], plan.steps[0].index_url: INDEXES[1]}
    return replace(plan, steps=tuple(replace(s, index_url=urls[s.index_url]) for s in plan.steps))


def _awq_commands():
    plan = secret_plan()
    return raw(pip_pins, {fact_key(PythonEnvPackages, env=plan.env): None}, plan=plan)


def _converter_commands():
    s = load_settings("h", {"python_env_backend": "venv", "python_env_index_url": "https://pypi.example.org/simple"})
    facts = {fact_key(RequirementsFile, path="/src/req.txt"): ("numpy~=1.26", "torch==2.13.0"),
             fact_key(PythonEnvPackages, env="/e"): None}
    commands = raw(converter_pins, facts, settings=s, requirements_path="/src/req.txt", env="/e")
    # the settings' URL stands for one with a credential: it must reach the host in the same way
    return [c for c in commands if not isinstance(c, FileUploadCommand)], "https://pypi.example.org/simple"


def shown(command) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


@pytest.mark.parametrize("env", ["awq", "converter"])
def test_no_index_url_is_on_a_command_line(env):
    if env == "awq":
        commands = _awq_commands()
        secrets = (SECRET, TOKEN, *INDEXES)
    else:
        commands, url = _converter_commands()
        secrets = (url,)
    lines = [shown(c) for c in commands if not isinstance(c, FileUploadCommand)]
    assert lines and not [s for s in secrets for line in lines if s in line]
    uploads = [c for c in commands if isinstance(c, FileUploadCommand)]
    if env == "awq":
        (upload,) = uploads
        assert upload.dest.endswith("/llamarack-indexes.json.new") and json.loads(upload.src.getvalue()) == [
            INDEXES[1], INDEXES[0]]
        made = lines[0]  # the file is mode 600 before a byte is written
        assert made.endswith(f"install -m 600 /dev/null {shlex.quote(upload.dest)}")


def pyenv_check_module():
    sys.path.insert(0, str(ROOT / "roles/python_env/files"))
    try:
        import pyenv_check
    finally:
        sys.path.pop(0)
    return pyenv_check


@pytest.mark.parametrize("command", ["resolve", "install"])
def test_pyenv_check_hands_the_urls_to_pip_in_its_environment(command, monkeypatch, tmp_path):
    check = pyenv_check_module()
    ran = []

    def run(args, env=None, **kwargs):
        ran.append((args, env))
        if "--report" in args:
            Path(args[args.index("--report") + 1]).write_text('{"install": []}')
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(check.subprocess, "run", run)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://stray.example/simple")  # the host's, dropped
    plan = secret_plan()
    indexes = tmp_path / "indexes.json"
    indexes.write_text(plan.indexes_json())
    step = ["1"] if command == "install" else []
    assert check.main(["pyenv_check", command, plan.to_json(), str(indexes), *step]) == 0
    assert ran
    for args, env in ran:
        assert not [s for s in (SECRET, TOKEN) for a in args if s in a]
        assert env["PIP_CONFIG_FILE"] == "/dev/null" and "stray" not in env.get("PIP_EXTRA_INDEX_URL", "")
        assert SECRET in env["PIP_INDEX_URL"] or TOKEN in env["PIP_INDEX_URL"]


# --- pip hash pinning for the AWQ env -----------------------------------------------------

H = "sha256:" + "ab" * 32
LOCK_PINS = ("torch==2.1.2", "transformers==4.44.2", "accelerate==0.33.0", "autoawq==0.2.7",
             "datasets==3.0.1", "pyarrow==17.0.0", "zstandard==0.23.0", "numpy==1.26.4")  # fmt: skip


def lock(*lines: str, pins=LOCK_PINS) -> str:
    return "".join(f"{p} \\\n    --hash={H}\n" for p in pins) + "".join(line + "\n" for line in lines)


def test_a_lock_installs_its_packages_hash_checked_without_dependencies():
    s = load_settings("h", {"python_env_backend": "venv"})
    text = "# pip-compile --generate-hashes\n" + lock('colorama==0.4.6 ; sys_platform == "win32" --hash=' + H)
    locked = locked_requirements(s, text, "awq.lock")
    plan = awq_plan(s, "/e", locked=locked)
    (step,) = plan.steps
    assert step.no_deps and step.requirements == LOCK_PINS and step.hashes == ((H,),) * len(LOCK_PINS)
    assert step.index_urls == ("https://pypi.org/simple", "https://download.pytorch.org/whl/cu118")
    # the settings' pins stay the env's constraints: a drift from them is put back
    assert plan.constraints == ("torch==2.1.2", "numpy<2") and "colorama==0.4.6" not in plan.require


def test_pyenv_check_writes_the_hashes_for_pip(tmp_path):
    check = pyenv_check_module()
    args = check.pip_args(str(tmp_path), ["torch==2.1.2"], (), True, [[H, H.replace("ab", "cd")]])
    assert args[-3:] == ["--require-hashes", "-r", str(tmp_path / "requirements.txt")] and "--no-deps" in args
    assert (tmp_path / "requirements.txt").read_text() == f"torch==2.1.2 --hash={H} --hash={H.replace('ab', 'cd')}\n"


LOCK_REFUSED = {
    "an index line": (lock("--index-url https://evil.example/simple"), "an option line: every index is a setting"),
    "an extra index": (lock("--extra-index-url=https://evil.example/simple"), "an option line"),
    "an editable": (lock("-e git+https://evil.example/x.git#egg=x"), "an option line"),
    "a URL": (lock(f"x @ https://evil.example/x.whl --hash={H}"), "not pinned to one version from the index"),
    "unpinned": (lock(f"tqdm>=4 --hash={H}"), "not pinned to one version"),
    "no hash": (lock("tqdm==4.66.5"), "no --hash"),
    "a bad hash": (lock("tqdm==4.66.5 --hash=md5:abc"), "is not sha256:, sha384: or sha512:"),
    "torch missing": (lock(pins=LOCK_PINS[1:]), "no torch: the settings pin torch==2.1.2"),
    "another torch": (lock(pins=("torch==2.5.1", *LOCK_PINS[1:])), "torch==2.5.1: the settings want torch==2.1.2"),
    "numpy 2": (lock(pins=(*LOCK_PINS[:-1], "numpy==2.2.6")), "numpy==2.2.6: the settings want numpy<2"),
    "empty": ("# nothing\n", "no requirement"),
}


@pytest.mark.parametrize("case", LOCK_REFUSED, ids=list(LOCK_REFUSED))
def test_a_lock_that_is_not_the_settings_set_with_hashes_is_refused(case):
    text, why = LOCK_REFUSED[case]
    with pytest.raises(LockError) as err:
        locked_requirements(load_settings("h", {"python_env_backend": "venv"}), text, "awq.lock")
    assert str(err.value).startswith("python_env_awq_lock_file: awq.lock: ") and why in str(err.value)
    assert "Fix: write the lock with pip-compile --generate-hashes" in str(err.value)


def test_the_lock_is_read_on_the_control_machine_when_set(tmp_path):
    assert awq_lock(load_settings("h", {"python_env_backend": "venv"})) is None
    path = tmp_path / "awq.lock"
    path.write_text(lock())
    s = load_settings("h", {"python_env_backend": "venv", "python_env_awq_lock_file": str(path)})
    assert [r for r, _ in awq_lock(s)] == list(LOCK_PINS)
    path.unlink()
    with pytest.raises(LockError, match=f"python_env_awq_lock_file: cannot read {path}: No such file"):
        awq_lock(s)


def test_a_plain_step_has_no_hashes_and_names_its_index_by_place():
    plan = awq_plan(load_settings("h", {"python_env_backend": "venv"}), "/e")
    data = json.loads(plan.to_json())
    assert all(s["hashes"] == [] for s in data["steps"]) and "index_url" not in plan.to_json()
    assert PipStep(("x==1",), "https://a/simple").index_urls == ("https://a/simple",)


# --- inventories: the one to copy pins host keys; the lab's says it is the lab's -----------


def test_the_example_inventory_pins_host_keys():
    from paramiko import SSHException
    from pyinfra.connectors.sshuserclient.client import get_host_keys, get_missing_host_key_policy

    for name, data in inventory_data("inventory/example_v100.py").items():
        assert data["ssh_strict_host_key_checking"] == "yes", name
        known = Path(data["ssh_known_hosts_file"])
        assert known == ROOT / "inventory/known_hosts" and known.is_file()
        # what pyinfra's SSH client does with them: only listed keys, a new one refused
        policy = get_missing_host_key_policy(data["ssh_strict_host_key_checking"])
        with pytest.raises(SSHException, match="No host key for"):
            policy.missing_host_key(None, data["ssh_hostname"], None)
        assert len(get_host_keys((str(known),))) == 0  # the operator fills it; comments only here
    text = (ROOT / "inventory/example_v100.py").read_text()
    assert "accept-new" not in text and '"off"' not in text and "/dev/null" not in text


def test_the_lab_inventory_says_it_is_for_the_lab_only():
    doc = (ROOT / "inventory/lab.py").read_text().split('"""')[1]
    assert "for the lab only" in doc and "Never copy this file" in doc
    assert "copy this file:" not in doc.lower()
    assert "inventory/example_v100.py" in doc
