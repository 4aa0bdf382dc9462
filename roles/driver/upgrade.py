"""A driver upgrade within the branch, as a deploy of its own: unhold, upgrade, reboot.

    llamarack rollout INVENTORY roles.driver.upgrade.driver_upgrade --data nvidia_driver_version=550.144.03-1
    llamarack rollout INVENTORY

The rollout drains each host, runs this on it alone and gates it (the unit is back,
on its cards, and completes a request); the second rollout, the project's deploy,
holds the driver again. A host already on the version is left alone (no reboot).
docs/rollout.md carries this file as the procedure; the lab's rollout bench runs it.
"""

import re

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, server

from .operations import driver_package_holds


def driver_upgrade():
    version = host.data.get("nvidia_driver_version")  # a Debian version, e.g. 580.95.05-1
    if version is not None and not re.fullmatch(r"([0-9]+:)?[0-9][0-9A-Za-z.+~]*-[0-9A-Za-z.+~]+", str(version)):
        raise SystemExit(f"{host.name}: nvidia_driver_version: given {version!r}; allowed: a Debian "
                         "version of the nvidia-driver package, e.g. 580.95.05-1")
    installed = host.get_fact(DebPackages).get("nvidia-driver", []) if version else []
    if version and "gateways" not in host.groups and version not in installed:
        driver_package_holds(name="Unhold the driver packages", hold=False)  # every one the deploy holds
        apt.packages(name=f"The NVIDIA driver {version}", packages=[f"nvidia-driver={version}"], update=True)
        server.reboot(name="Reboot onto the new driver", reboot_timeout=900)
