"""The python env roles alone, for the local end-to-end test (pyinfra @local)."""

from pyinfra import host

from roles.settings import settings_for
from roles.python_env.deploy import converter_env, python_env

settings = settings_for(host)
python_env(settings)
if host.data.get("test_converter_requirements"):
    converter_env(settings, host.data.get("test_converter_requirements"))
