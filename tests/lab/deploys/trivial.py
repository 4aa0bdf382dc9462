"""A trivial deploy for lab tests: a file, a small package, a service."""

from io import StringIO

from pyinfra.operations import apt, files, server, systemd

files.put(
    name="lab marker file",
    src=StringIO("managed by llamarack lab tests\n"),
    dest="/etc/llamarack-lab-test.conf",
    mode="644",
)
files.directory(name="opt dir", path="/opt/llamarack-lab-test", mode="755")
apt.packages(
    name="small package",
    packages=["less"],
    update=True,
    cache_time=3600,
)
unit = files.put(
    name="hello unit",
    src=StringIO(
        "[Unit]\nDescription=lab test service\n\n"
        "[Service]\nExecStart=/bin/sleep infinity\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    ),
    dest="/etc/systemd/system/lab-hello.service",
    mode="644",
)
systemd.daemon_reload(name="reload units", _if=unit.did_change)
systemd.service(
    name="hello service",
    service="lab-hello.service",
    running=True,
    enabled=True,
)
server.service(name="ssh running", service="ssh", running=True)
