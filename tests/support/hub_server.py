"""The local hub server lives in the lab (it serves it to the lab hosts): lab/llamarack_lab/hub_server.py."""

from llamarack_lab.hub_server import *  # noqa: F401,F403
from llamarack_lab.hub_server import HubServer, Repo, RepoFile, git_blob_sha1  # noqa: F401
