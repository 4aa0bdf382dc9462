"""The driver role's settings section (host-data keys ``driver_*``)."""

from __future__ import annotations

from dataclasses import dataclass

from llamarack.settings_fields import Section, dotted_version, setting


@dataclass(frozen=True)
class DriverSettings(Section):
    """Checks on the NVIDIA driver; llamarack never installs one unless asked."""

    prefix = "driver"

    min_version: str = setting("520.61.05", "lowest driver accepted (the toolkit's own floor applies as well)",
                               dotted_version)
    hold_packages: bool = setting(True, "apt-mark hold the installed driver packages so upgrades cannot move them; "
                                  "False unholds them (for a planned driver upgrade)")
    reboot_on_mismatch: bool = setting(False, "reboot a host whose driver library and loaded module differ, then "
                                       "check again")
