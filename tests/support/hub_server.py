"""The local hub server lives in the product (the lab serves it): llamarack/lab/hub_server.py."""

from llamarack.lab.hub_server import *  # noqa: F401,F403
from llamarack.lab.hub_server import HubServer, Repo, RepoFile, git_blob_sha1  # noqa: F401
