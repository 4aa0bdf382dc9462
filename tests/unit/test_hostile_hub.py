"""A hub's listing, the file paths it names and a model URL's secrets: each hostile case
ends in a refusal that names what is wrong, or a safe answer; never a traceback.

The control side reads the hub's JSON (``roles/model/hub.py``); the host's fetcher takes the
paths it names (``roles/model/files/model_fetch.py``); the artifact's record (``stamp.json``,
readable by all) keeps the model's URL (``roles/model/plan.py``).
"""

import contextlib
import dataclasses
import hashlib
import json
import re

import pytest

from llamarack.errors import ModelSourceError, SettingsError
from roles.model import hub
from roles.model.files import model_fetch
from roles.model.hub import HubFile, HubListing, listing_of, repo_files
from roles.model.plan import plan_from_pinned_record, plan_from_record, plan_model, recorded_url
from roles.model.reads import ArtifactState
from roles.settings import load_settings

SHA = "0123456789abcdef0123456789abcdef01234567"
BLOB = "b" * 40
LFS = "5" * 64
GOOD = {"rfilename": "model.safetensors", "size": 100, "blobId": BLOB, "lfs": {"sha256": LFS, "size": 100}}
CONFIG = {"rfilename": "config.json", "size": 2, "blobId": "c" * 40}


def answer(**changes):
    return {"sha": SHA, "siblings": [GOOD, CONFIG], **changes}


def sibling(**changes):
    return {**GOOD, **changes}


def refused(info, revision=SHA) -> str:
    with pytest.raises(ModelSourceError) as err:
        listing_of(info, "org/tiny", revision, "https://hub.example")
    text = str(err.value)
    # The hub's text is shown by its repr: no control character reaches the operator's terminal.
    assert text.isprintable() and len(text) < 400, text
    return text


def test_a_sound_listing_is_read():
    listing = listing_of(answer(), "org/tiny", SHA[:7], "https://hub.example")
    assert listing == HubListing("org/tiny", SHA, (HubFile("model.safetensors", 100, LFS, BLOB),
                                                   HubFile("config.json", 2, None, "c" * 40)))


@pytest.mark.parametrize("info, message", [
    ([], "without sha/siblings"),
    ("a listing", "without sha/siblings"),
    (None, "without sha/siblings"),
    ({"sha": SHA}, "without sha/siblings"),
    ({"siblings": []}, "without sha/siblings"),
    (answer(sha=123), "commit sha 123: not 40"),
    (answer(sha=None), "commit sha None: not 40"),
    (answer(sha=[SHA]), "not 40 lowercase hex digits"),
    (answer(sha={"x": 1}), "not 40 lowercase hex digits"),
    (answer(sha=SHA + "/../../x"), "not 40 lowercase hex digits"),
    (answer(sha=SHA.upper()), "not 40 lowercase hex digits"),
    (answer(sha=SHA[:39]), "not 40 lowercase hex digits"),
    (answer(sha=SHA + "0"), "not 40 lowercase hex digits"),
    (answer(sha="f" * 40), f"asked for revision {SHA}, the hub resolved it to ffff"),
    (answer(siblings=None), "siblings None: not a list"),
    (answer(siblings="config.json"), "siblings 'config.json': not a list"),
    (answer(siblings={"rfilename": "x"}), "not a list of files"),
    (answer(siblings=["config.json"]), "a file that is not an object: 'config.json'"),
    (answer(siblings=[None]), "a file that is not an object: None"),
    (answer(siblings=[GOOD, 7]), "a file that is not an object: 7"),
    (answer(siblings=[sibling(size="100")]), "the size '100': not a whole number"),
    (answer(siblings=[sibling(size=1.5)]), "the size 1.5: not a whole number"),
    (answer(siblings=[sibling(size=True)]), "the size True: not a whole number"),
    (answer(siblings=[sibling(size=-1)]), "the size -1: not a whole number"),
    (answer(siblings=[sibling(size=[100])]), "the size [100]: not a whole number"),
    (answer(siblings=[sibling(size=None)]), "gave no size/blobId for model.safetensors"),
    (answer(siblings=[sibling(blobId=None)]), "gave no size/blobId for model.safetensors"),
    (answer(siblings=[sibling(blobId=12345)]), "the blobId 12345: not 40"),
    (answer(siblings=[sibling(blobId="../../x")]), "the blobId '../../x': not 40"),
    (answer(siblings=[sibling(lfs="x")]), "the lfs entry 'x': not an object"),
    (answer(siblings=[sibling(lfs=[])]), "the lfs entry []: not an object"),
    (answer(siblings=[sibling(lfs={"sha256": 5})]), "the sha256 5: not 64"),
    (answer(siblings=[sibling(lfs={"sha256": "../" + "5" * 61})]), "not 64 lowercase hex digits"),
    (answer(siblings=[GOOD, GOOD]), "lists 'model.safetensors' more than once"),
])  # fmt: skip
def test_a_malformed_listing_is_refused_for_its_host(info, message):
    assert message in refused(info)


@pytest.mark.parametrize("path", ["", ".", "..", "../x", "a/../../x", "/etc/passwd", "a//b", "a/", "a/./b", None, 5,
                                  ["x"], "a\nb", "a\x1b[2Jb", "a\x85b", "a\u2028b", "x" * 256])  # fmt: skip
def test_a_listed_path_the_hosts_cannot_take_is_refused(path):
    assert "a file path the hosts cannot take" in refused(answer(siblings=[sibling(rfilename=path)]))


@pytest.mark.parametrize("revision", [SHA + "/../../x", "main", SHA + "0", "../" + SHA])
def test_only_a_sha_the_revision_begins_is_taken(revision):
    assert "asked for revision" in refused(answer(), revision)


class Reply:
    def __init__(self, body):
        self.status_code, self.body = 200, body

    def json(self):
        return json.loads(self.body)


@pytest.mark.parametrize("body, message", [
    ("<html>", "answered something that is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "answered something that is not JSON"),
    (json.dumps(answer(siblings=None)), "siblings None: not a list"),
    (json.dumps(answer(sha=7)), "commit sha 7"),
])  # fmt: skip
def test_the_hubs_reply_is_refused_not_a_traceback(monkeypatch, body, message):
    import requests

    monkeypatch.setattr(requests, "get", lambda *a, **k: Reply(body))
    repo_files.cache_clear()
    with pytest.raises(ModelSourceError, match=re.escape(message)):
        repo_files("https://hub.example", "org/tiny", SHA)
    repo_files.cache_clear()


def test_a_record_naming_a_path_out_of_the_fetch_is_not_planned_from():
    s = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu", "model_repo": "org/tiny",
                                "model_revision": SHA})  # fmt: skip
    plan = plan_model(s, listing_of(answer(), "org/tiny", SHA, s.model.hf_endpoint))
    record = json.loads(json.dumps(plan.record()))
    record["asked"]["llamacpp_commit"] = "f" * 40  # made by another llama.cpp: planned from its files
    assert plan_from_pinned_record(s, ArtifactState(plan.stamp, 1, 1, {**record, "gguf": {"size": 1}})) is not None
    for bad in ("../../etc/x", "", "a//b"):
        files = {**record["files"], bad: "sha256:" + LFS}
        sizes = {**record["sizes"], bad: 1}
        state = ArtifactState(plan.stamp, 1, 1, {**record, "files": files, "sizes": sizes, "gguf": {"size": 1}})
        assert plan_from_pinned_record(s, state) is None
    for files in ([], "x", None):
        assert plan_from_pinned_record(s, ArtifactState(plan.stamp, 1, 1, {**record, "files": files})) is None


# Every path the control side refuses (``repo_path_problem``), the host's fetcher refuses too.
UNTAKEABLE = ["", ".", "..", "../x", "a/../../x", "/etc/x", "a//b", "a/", "a/./b", "a\0b", None, "a\nb",
              "model\n.gguf", "a\rb", "a\x1b[2Jb", "a\x7fb", "a\x85b", "a\u2028b", "a\u2029b", "x" * 256]  # fmt: skip


@pytest.mark.parametrize("path", UNTAKEABLE)
def test_the_host_fetcher_refuses_a_path_that_is_not_a_file_under_its_destination(tmp_path, capsys, path):
    manifest = {"endpoint": "http://127.0.0.1:9", "repo": "org/tiny", "revision": SHA,
                "files": [{"path": "config.json", "size": 2, "git_sha1": "c" * 40},
                          {"path": path, "size": 2, "git_sha1": "c" * 40}]}  # fmt: skip
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    rc = model_fetch.main(["fetch", "--manifest", str(tmp_path / "m.json"), "--dest", str(dest), "--retries", "0"])
    err = capsys.readouterr().err
    assert rc == model_fetch.EXIT_FAILED and "refusing file path" in err and "Traceback" not in err
    assert list(dest.iterdir()) == []  # checked before the first byte


@pytest.mark.parametrize("path", UNTAKEABLE + ["model.safetensors", "tokenizer/tokenizer.json", "README (copy).md",
                                                "ünïcode.txt", "x" * 255])  # fmt: skip
def test_the_host_and_the_control_side_take_the_same_paths(tmp_path, path):
    refused = hub.repo_path_problem(path) is not None
    with pytest.raises(model_fetch.FetchError) if refused else contextlib.nullcontext():
        assert model_fetch.safe_join(str(tmp_path), path) == str(tmp_path.joinpath(*path.split("/")))


def test_the_host_fetcher_refuses_a_url_that_is_not_ascii_by_name(tmp_path, capsys):
    """A URL urllib cannot put on a request line (the settings refuse one; a manifest from
    elsewhere might hold one) is refused before the first byte, never a traceback."""
    manifest = {"files": [{"path": "model.gguf", "url": "https://files.example/mod\u00e8le.gguf", "sha256": LFS}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    rc = model_fetch.main(["fetch", "--manifest", str(tmp_path / "m.json"), "--dest", str(dest), "--retries", "0"])
    err = capsys.readouterr().err
    assert rc == model_fetch.EXIT_FAILED and "Traceback" not in err
    assert err.isascii() and "model.gguf: refusing the URL 'https://files.example/mod\\xe8le.gguf'" in err
    assert "not ASCII; write them percent-encoded (UTF-8)" in err
    assert list(dest.iterdir()) == []


def test_a_model_url_percent_encoded_fetches_the_file_of_that_name(tmp_path, capsys):
    from tests.support.hub_server import HubServer

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod\u00e8le.gguf").write_bytes(b"GGUF" + bytes(60))
    sha = hashlib.sha256((repo / "mod\u00e8le.gguf").read_bytes()).hexdigest()
    with HubServer({"org/tiny": repo}) as server:
        url = f"{server.url}/org/tiny/resolve/main/mod%C3%A8le.gguf"
        s = load_settings("gpu01", {"python_env_backend": "venv", "model_source": "url", "model_url": url,
                                    "model_sha256": sha})  # fmt: skip
        (tmp_path / "m.json").write_text(json.dumps(plan_model(s).manifest()))
        rc = model_fetch.main(["fetch", "--manifest", str(tmp_path / "m.json"), "--dest", str(tmp_path / "dest")])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "dest/model.gguf").read_bytes() == (repo / "mod\u00e8le.gguf").read_bytes()


@pytest.mark.parametrize("field, value", [("model_file", ""), ("model_file", "."), ("model_file", "../m.gguf"),
                                          ("model_file", "/m.gguf"), ("model_file", "a//m.gguf"),
                                          ("model_draft_file", "."), ("model_draft_file", "")])  # fmt: skip
def test_a_file_setting_that_is_no_path_in_the_repository_is_refused(field, value):
    data = {"python_env_backend": "venv", "model_source": "gguf", "model_repo": "org/tiny", "model_revision": SHA,
            "model_file": "m.gguf", "model_draft_repo": "org/draft", "model_draft_revision": SHA,
            "model_draft_source": "gguf", "model_draft_file": "d.gguf", field: value}  # fmt: skip
    with pytest.raises(SettingsError, match=f"{field}: given {re.escape(repr(value))}"):
        load_settings("gpu01", data)


@pytest.mark.parametrize("url, kept", [
    ("https://user:pass@mirror.example/m.gguf", "https://mirror.example/m.gguf"),
    ("https://token@mirror.example:8443/a/m.gguf", "https://mirror.example:8443/a/m.gguf"),
    ("https://bucket.example/m.gguf?X-Amz-Signature=abc", "https://bucket.example/m.gguf"),
    ("https://u:p@bucket.example/m.gguf?sig=abc#frag", "https://bucket.example/m.gguf"),
    ("https://mirror.example/m.gguf", "https://mirror.example/m.gguf"),
])  # fmt: skip
def test_the_artifacts_record_keeps_a_url_without_its_secrets(url, kept):
    assert recorded_url(url) == kept
    s = load_settings("gpu01", {"python_env_backend": "venv", "model_source": "url", "model_sha256": LFS,
                                "model_url": "https://mirror.example/m.gguf"})  # fmt: skip
    s = dataclasses.replace(s, model=dataclasses.replace(s.model, url=url))
    plan = plan_model(s)
    record = json.dumps(plan.record())
    assert json.loads(record)["url"] == kept and json.loads(record)["asked"]["url"] == kept
    for secret in ("pass", "token@", "Signature", "sig=", "frag"):
        assert secret not in record
    # Only the fetch's manifest (mode 700 staging, removed at the seal) carries the URL whole.
    assert plan.manifest()["files"][0]["url"] == url
    # The artifact made before records left the secrets out is still the one asked for.
    old = json.loads(record)
    old["asked"]["url"] = url
    assert plan_from_record(s, ArtifactState(plan.stamp, 1, 1, {**old, "gguf": {"size": 1}})) is not None


def test_a_hub_path_check_answers_none_for_real_names():
    for path in ("model.safetensors", "tokenizer/tokenizer.json", "README (copy).md", "ünïcode.txt", "x" * 255):
        assert hub.repo_path_problem(path) is None
