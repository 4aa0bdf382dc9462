"""Reboot the lab hosts through pyinfra, as a real server would be."""

from pyinfra.operations import server

# delay must exceed the "sleep 1" pyinfra puts before the reboot command,
# or it reconnects to the host before it goes down.
server.reboot(name="reboot", delay=3, interval=1, reboot_timeout=120)
