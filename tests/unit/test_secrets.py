"""Secret files on the control machine: read only when the owner alone may read them."""

import pytest

from llamarack.errors import ModelSourceError
from llamarack.secrets import read_token


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620, 0o606])
def test_a_secret_others_may_read_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "hub-token"
    path.write_text("hf_secret_value\n")
    path.chmod(mode)
    with pytest.raises(ModelSourceError) as err:
        read_token(str(path), "model_hf_token_file")
    text = str(err.value)
    assert text.startswith(f"model_hf_token_file: {path} has mode {mode:04o}")
    assert f"chmod 600 {path}" in text and "hf_secret_value" not in text


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_secret_of_the_owner_alone_is_read(tmp_path, mode):
    path = tmp_path / "api-key"
    path.write_text("sk-test-123\n")
    path.chmod(mode)
    assert read_token(str(path), "server_api_key_file") == "sk-test-123"


def test_no_file_set_is_no_secret():
    assert read_token(None) is None
