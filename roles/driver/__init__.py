"""Driver: never installs or upgrades a driver; holds what is installed, reboots only when asked.

The driver itself is the operator's (a driver change on a rack of old GPUs is
a decision, not a side effect). This role keeps the installed one where it
is: ``driver_hold_packages`` apt-mark holds every installed NVIDIA driver
package (False unholds them, for a planned upgrade), and with
``driver_reboot_on_mismatch`` a host whose driver was upgraded without a
reboot ("Driver/library version mismatch") is rebooted and checked again.
Without that setting preflight has already refused such a host.
"""
