"""``llamarack plan-upgrade``: each drifted audit item becomes the step a deploy takes, with its why."""

from llamarack.audit import HostAudit, Item
from llamarack.upgrade import as_json, as_text, host_steps

BUILD = {"stamp": "a62b921473251a4e", "commit": "0c1e57098bba", "proof": "e487072496dec515", "files": "as sealed"}
UNIT = {"sha256": "1" * 64, "exec_start": "/opt/llamarack/builds/a62b921473251a4e/bin/llama-server --port 8080"}


def host(**changed) -> HostAudit:
    items = {
        "rules": Item([], [], drift=False),
        "llamarack": Item("0.1.0", "0.1.0"),
        "build": Item(dict(BUILD), {**BUILD, "inputs_changed": []}),
        "model": Item({"stamp": "9f", "untouched": True}, {"untouched": True}),
        "unit": Item(dict(UNIT), dict(UNIT)),
        "service": Item({"active": "active"}, {"active": "active"}),
        "health": Item(200, 200),
        "bench": Item({"key": 1}, {"key": 1}),
    }
    for name, item in changed.items():
        items[name] = item
    return HostAudit("lab-v100-32", items=items)


def steps(audit):
    return [(s.action, s.what) for s in host_steps(audit)]


def test_a_converged_host_changes_nothing():
    assert steps(host()) == []
    assert as_text([host()]) == "lab-v100-32: nothing changes\n"


def test_a_new_proof_reproves_in_place_and_restarts_nothing():
    audit = host(build=Item({**BUILD, "proof": None}, {**BUILD, "inputs_changed": []}, drift=True),
                 llamarack=Item("0.0.9", "0.1.0", drift=True))
    assert steps(audit) == [("re-prove", "llama.cpp build a62b921473251a4e"), ("record", "deployed-by")]
    text = as_text([audit])
    assert "proof without an id -> e487072496dec515; nothing is built" in text
    assert "last deployed by llamarack 0.0.9; this is 0.1.0" in text and "restart" not in text


def test_a_new_commit_rebuilds_and_restarts_naming_what_changed():
    wanted = {**BUILD, "stamp": "77aa", "inputs_changed": ["commit", "cmake_args"]}
    audit = host(build=Item(dict(BUILD), wanted, drift=True))
    assert steps(audit) == [("rebuild", "llama.cpp 77aa"), ("restart", "llama-server")]
    assert "commit, cmake_args changed (current build a62b921473251a4e)" in as_text([audit])


def test_a_unit_change_names_the_words_it_adds_and_drops():
    wanted = {**UNIT, "sha256": "2" * 64, "exec_start": UNIT["exec_start"] + " --metrics"}
    audit = host(unit=Item(dict(UNIT), wanted, drift=True))
    assert [(s.action, s.why) for s in host_steps(audit)] == [("restart", "its unit changes: adds --metrics")]


def test_a_build_that_failed_the_new_proof_is_rebuilt_beside_itself():
    audit = host(build=Item({**BUILD, "proof_failed": "5" * 16}, {**BUILD, "inputs_changed": ["the build in place"]},
                            drift=True))
    assert steps(audit)[0] == ("rebuild", "llama.cpp a62b921473251a4e beside itself")


def test_hosts_that_cannot_be_read_or_are_refused_say_so():
    down = HostAudit("lab-t4", reachable=False, error="timed out")
    refused = host(rules=Item(["lab-p40: gpu-on-bus: found no card"], [], drift=True))
    text = as_text([down, refused])
    assert "lab-t4: cannot tell: timed out" in text and "refused by preflight: lab-p40: gpu-on-bus" in text
    assert as_json([down])["hosts"]["lab-t4"] == {"error": "timed out", "refused": [], "steps": []}
    # a refused host gets nothing from the deploy, whatever else drifted there
    refused_too = host(rules=Item(["lab-p40: gpu-on-bus: found no card"], [], drift=True),
                       llamarack=Item("0.0.9", "0.1.0", drift=True))
    assert as_json([refused_too])["hosts"]["lab-v100-32"] == {
        "error": None, "refused": ["lab-p40: gpu-on-bus: found no card"], "steps": []}


def test_a_new_header_reader_records_the_shape_again_and_remakes_nothing():
    model = {"stamp": "9f", "repo": "r", "revision": "v", "quant": "Q4_K_M", "untouched": True}
    audit = host(model=Item({**model, "shape_recorded": False}, {**model, "shape_recorded": True}, drift=True))
    assert steps(audit) == [("record", "GGUF shape")]
    changed = host(model=Item({**model, "shape_recorded": False}, {**model, "quant": "Q8_0", "shape_recorded": True},
                              drift=True))
    assert steps(changed) == [("remake", "model artifact"), ("restart", "llama-server")]


def rebuilding(name: str, ship, held=(), mib: int = 20) -> HostAudit:
    wanted = {**BUILD, "stamp": "77aa", "inputs_changed": ["commit"], "ship": ship, "held": list(held)}
    audit = host(build=Item({**BUILD, "bytes": mib * 2**20}, wanted, drift=True))
    return HostAudit(name, items=audit.items)


def test_a_bump_says_which_build_compiles_once_and_who_receives_it_with_the_bytes():
    audits = [rebuilding(n, "77aa-cpu1") for n in ("lab-v100-a", "lab-v100-b", "lab-t4")]
    (made,) = as_json(audits)["builds"]
    assert made["compiles"] == 1 and made["hosts"] == ["lab-v100-a", "lab-v100-b", "lab-t4"]
    assert made["bytes_each"] == 20 * 2**20 and made["source"] is None
    assert ("builds:\n  77aa: compiled once, by the first of lab-v100-a, lab-v100-b, lab-t4 to reach it; the other 2 "
            "receive it through this machine: about 20 MiB each") in as_text(audits)  # fmt: skip


def test_hosts_of_other_cpus_compile_their_own_and_a_holder_compiles_nothing():
    audits = [rebuilding("a", "77aa-cpu1"), rebuilding("b", "77aa-cpu2"),
              rebuilding("c", "77aa-cpu2", held=["77aa"]), rebuilding("d", None)]  # fmt: skip
    made = {tuple(m["hosts"]): m for m in as_json(audits)["builds"]}
    assert made[("a",)]["compiles"] == 1
    assert made[("b",)]["compiles"] == 0 and made[("b",)]["source"] == "c"  # c holds it: b receives it from c
    assert made[("d",)]["compiles"] == 1 and not made[("d",)]["shared"]
    assert "77aa: compiled on each of d (not shipped)" in as_text(audits)


def test_a_converged_rack_makes_no_build():
    assert as_json([host()])["builds"] == [] and "builds:" not in as_text([host()])


def remaking(name: str, ship: bool = True, holds: bool = False, mib: int = 3) -> HostAudit:
    """A host whose model the deploy remakes (a llama.cpp bump plans the artifact ``5e1f`` from
    the served record), its blob cache holding the checkpoint or not."""
    found = {"stamp": "9f", "repo": "lab/tiny", "revision": "ab" * 20, "quant": "Q4_K_M", "untouched": True,
             "shape_recorded": True, "bytes": mib * 2**20}  # fmt: skip
    wanted = {**found, "stamp": "5e1f", "ship": ship, "cache_holds": holds}
    del wanted["bytes"]
    return HostAudit(name, items=host(model=Item(found, wanted, drift=True)).items)


def test_a_bump_says_which_host_makes_the_model_from_its_cache_and_who_receives_it():
    audits = [remaking("lab-v100-a"), remaking("lab-v100-32", holds=True), remaking("lab-t4")]
    (made,) = as_json(audits)["models"]
    assert made == {"model": "5e1f", "shared": True, "hosts": ["lab-v100-a", "lab-v100-32", "lab-t4"], "makes": 1,
                    "maker": "lab-v100-32", "bytes_each": 3 * 2**20, "line": made["line"]}  # fmt: skip
    assert ("models:\n  5e1f: made once, on lab-v100-32, whose blob cache holds the checkpoint (the hub is asked for "
            "none of it); the other 2 receive it through this machine: about 3 MiB each") in as_text(audits)


def test_without_a_cache_or_shipping_the_model_is_made_by_the_first_or_by_each():
    (made,) = as_json([remaking("a"), remaking("b")])["models"]
    assert made["maker"] is None and "made once, by the first of a, b to reach it" in made["line"]
    (each,) = as_json([remaking("a", ship=False, holds=True), remaking("b", ship=False)])["models"]
    assert each["makes"] == 2 and each["line"] == "5e1f: made on each of a, b (not shipped)"
    assert as_json([host()])["models"] == [] and "models:" not in as_text([host()])
