"""Rack specs, names and addresses; the committed inventory/lab.py agrees
with the lab's default rack."""

import runpy
from pathlib import Path

import pytest

from llamarack_lab import DEFAULT_RACK, LAB_GROUP_DATA, paths, profiles

INVENTORY = Path(__file__).resolve().parent.parent.parent / "inventory/lab.py"


def test_default_rack():
    assert DEFAULT_RACK == [("lab-v100-a", "v100-16gb"), ("lab-v100-b", "v100-16gb"),
                            ("lab-v100-32", "v100-32gb"), ("lab-t4", "t4")]
    assert [ip for _, _, ip in profiles.rack_spec(profiles.rack_profiles())] == [
        "10.77.0.11", "10.77.0.12", "10.77.0.13", "10.77.0.14"]


def test_gpus_spec():
    assert profiles.parse_gpus_spec("v100-16gb*2,t4") == ["v100-16gb", "v100-16gb", "t4"]
    assert profiles.rack_profiles(6)[4:] == ["v100-16gb", "v100-16gb"]
    with pytest.raises(ValueError, match="unknown GPU profile"):
        profiles.parse_gpus_spec("a100")
    with pytest.raises(ValueError):
        profiles.rack_profiles(3, "t4")


def test_names_unique_for_big_racks():
    names = profiles.host_names(profiles.rack_profiles(40))
    assert len(set(names)) == 40
    assert profiles.host_names(["t4", "h200", "none"]) == ["lab-t4", "lab-h200", "lab-cpu"]


def test_gpu_json_values():
    (g,) = profiles.gpus_json("lab-t4", "t4")
    assert (g["name"], g["memory_mib"], g["compute_cap"]) == ("Tesla T4", 15360, "7.5")
    assert g["uuid"] == profiles.gpus_json("lab-t4", "t4")[0]["uuid"]  # stable
    assert profiles.gpus_json("lab-cpu", "none") == []


def test_committed_inventory_matches_default_rack():
    inv = runpy.run_path(str(INVENTORY))
    hosts, data = inv["lab"]
    gateway, _, gateway_ip = profiles.gateway_spec(len(DEFAULT_RACK))
    assert [(n, d["ssh_hostname"]) for n, d in hosts] == [
        (n, profiles.host_ip(i)) for i, (n, _) in enumerate(DEFAULT_RACK)] + [(gateway, gateway_ip)]
    assert [n for n, _ in inv["gateways"]] == ["lab-gw"] and gateway_ip == "10.77.0.15"
    expected = dict(LAB_GROUP_DATA, ssh_key=f"{paths.DEFAULT_STATE_DIR}/id_ed25519")
    assert data == expected
