"""The rollout's driver upgrade (``roles.driver.upgrade.driver_upgrade``) against the fake driver's
real packaging: the set of Debian's non-free driver (the metapackage at exact versions, i386
copies of the libraries, a DKMS module package that builds at install; docs/lab.md). Every
package moves together and the project's deploy holds them all again; a host whose module
build fails stays drained and says why, while the rest of the rack rolls on and serves,
and the rollout resumes once the cause is fixed. Under the same load through the gateway
as ``test_rollout.py``, whose helpers this uses; the rack is put back on the default driver
and the base commit afterwards (its ``serving`` fixture)."""

import pytest

from llamarack_lab.fake_nvidia import deb
from tests.lab import deploying
from tests.lab.test_rollout import DRIVER_UPGRADE, GATEWAY, INVENTORY, MARK, MARKED, rollout, serving, under_load

pytestmark = pytest.mark.lab

OLD, NEW = deb.DEFAULT_VERSION, deb.UPGRADE_VERSION
UPGRADE = (str(DRIVER_UPGRADE), "--data", f"nvidia_driver_version={NEW}-1")
PACKAGES = "dpkg-query -W -f='${binary:Package} ${Version} ${Status}\\n' " + " ".join(deb.package_names())
# apt-mark's names: the native copy bare, the i386 one qualified
HELD = {name.removesuffix(":amd64") for name in deb.package_names()}


@pytest.fixture(scope="module")
def deployed(lab_rack, serving):
    """The serving hosts on the default driver, deployed by the project's deploy (the driver held)."""
    for h in serving:
        lab_rack.driver(h, version=OLD, state="ok")
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=INVENTORY, timeout=3600)
    assert rc == 0, out[-4000:]
    return serving


def packages(lab_rack, host: str) -> set:
    """(version, dpkg status) of the driver's packages on ``host``, each pair once."""
    lines = deploying.sh(lab_rack, host, PACKAGES).splitlines()
    assert len(lines) == len(deb.package_names()), lines
    return {tuple(line.split(" ", 2)[1:]) for line in lines}


def held(lab_rack, host: str) -> set:
    return set(deploying.sh(lab_rack, host, "apt-mark showhold").split())


def test_every_package_moves_and_the_deploy_holds_them_all_again(lab_rack, deployed):
    for h in deployed:
        assert packages(lab_rack, h) == {(f"{OLD}-1", "hold ok installed")}, h
        assert held(lab_rack, h) == HELD, h
    (rc, out, hosts), load = under_load(lab_rack, lambda: rollout(*UPGRADE))
    assert rc == 0, out[-6000:]
    assert {h: v["state"] for h, v in hosts.items()} == {h: "done" for h in deployed}
    assert load["failed"] == 0 and load["ok"] > 0, load
    for h in deployed:  # all 31 at the new version, the i386 copies too, and unheld until the deploy
        assert packages(lab_rack, h) == {(f"{NEW}-1", "install ok installed")}, h
        assert held(lab_rack, h) == set(), h
        assert deploying.sh(lab_rack, h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u") == NEW

    rc, out, hosts = rollout()  # the project's deploy, rolled
    assert rc == 0 and set(v["state"] for v in hosts.values()) == {"done"}, out[-6000:]
    for h in deployed:
        assert packages(lab_rack, h) == {(f"{NEW}-1", "hold ok installed")} and held(lab_rack, h) == HELD, h


def test_a_failed_module_build_leaves_its_host_drained_and_the_rack_serving(lab_rack, deployed):
    broken = deployed[1]  # after the canary: the rollout goes on past it with --max-fail 2
    for h in deployed:
        lab_rack.driver(h, version=OLD, state="ok")
    deploying.sh(lab_rack, broken, MARK)
    lab_rack.dkms_fails(broken, NEW)
    try:
        (rc, out, hosts), load = under_load(lab_rack, lambda: rollout(*UPGRADE, "--max-fail", "2"))
        assert rc == 1, out[-6000:]
        assert {h: v["state"] for h, v in hosts.items()} == {h: "failed" if h == broken else "done" for h in deployed}
        assert load["failed"] == 0 and load["ok"] > 0, load  # the others served all along
        # why, in the rollout's output: DKMS's error, then dpkg's
        assert "Error! Bad return status for module build on kernel: " in out
        assert f"Consult /var/lib/dkms/nvidia-current/{NEW}/build/make.log for more information." in out
        assert "nvidia-kernel-dkms package post-installation script subprocess returned error exit status 10" in out
        backends = deploying.audit_json(GATEWAY)["items"]["gateway"]["found"]["backends"]
        drained = {s: v for s, v in backends.items() if s.startswith(f"{broken}_")}
        # (HAProxy's state, then its check's: "DRAIN L7OK")
        assert drained and all(v.split()[0] == "DRAIN" for v in drained.values()), backends
        assert all(v.split()[0] == "UP" for s, v in backends.items() if not s.startswith(f"{broken}_")), backends
        assert "Error! Bad return status for module build" in hosts[broken]["why"], hosts[broken]
        # not rebooted: the old module still loaded, the new library beside it; the module package unconfigured
        assert deploying.sh(lab_rack, broken, MARKED) == "yes"
        assert "Driver/library version mismatch" in lab_rack.ssh(broken, "nvidia-smi").stdout
        status = deploying.sh(lab_rack, broken, "dpkg-query -W -f='${Status}' nvidia-kernel-dkms")
        assert status == "install ok half-configured"

        lab_rack.dkms_fails(broken, None)  # the cause fixed: the rollout goes on from the failed host
        (rc, out, hosts), load = under_load(lab_rack, lambda: rollout("--resume"))
        assert rc == 0 and set(v["state"] for v in hosts.values()) == {"done"}, out[-6000:]
        assert load["failed"] == 0, load
        assert packages(lab_rack, broken) == {(f"{NEW}-1", "install ok installed")}
        assert deploying.sh(lab_rack, broken, MARKED) == "no"  # rebooted onto the new driver
    finally:
        lab_rack.dkms_fails(broken, None)
