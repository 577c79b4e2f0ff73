"""Redaction: secret names, token shapes, argv; and what must stay readable."""

from __future__ import annotations

import pytest

from memwatch.core.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_obj,
    redact_text,
)

# Fake secrets in the real formats (none of these is a live credential).
SHAPES = {
    "huggingface": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    "github": "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "openai": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx",
    "slack": "xoxb-123456789012-abcdefghijkl",
    "google": "AIzaSyA1234567890abcdefghijklmnopqrstu",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0",
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_token_shapes_are_removed_anywhere_in_text(kind: str) -> None:
    secret = SHAPES[kind]
    text = f"upload failed (credential {secret}) at step 5"
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out and out.startswith("upload failed") and out.endswith("at step 5")


def test_secret_pairs_urls_and_wandb_keys() -> None:
    hexkey = "0123456789abcdef0123456789abcdef01234567"
    text = (f"password=hunter2 api_key: 'k3y' https://bob:s3cret@example.com/x "
            f"WANDB_API_KEY={hexkey} wandb login {hexkey} --token abc123")
    out = redact_text(text)
    for s in ("hunter2", "k3y", "s3cret", hexkey, "abc123"):
        assert s not in out
    assert "https://bob:<redacted>@example.com/x" in out


def test_readable_text_is_kept() -> None:
    # Exception names, commit hashes without a key word, ordinary prose and numbers stay.
    text = ("KeyError: 'layer1'. Tried to allocate 2.00 GiB; the key insight is memory. commit "
            "0123456789abcdef0123456789abcdef01234567 author: alice lr=0.1")
    assert redact_text(text) == text


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASS",
                                  "MY_PASSWORD", "apiKey", "GITHUB_PAT_TOKEN", "SESSION_ID",
                                  "OPENAI_API_KEY", "AUTH_HEADER", "COOKIE", "PRIVATE_KEY_PATH",
                                  "PASSWD", "SERVICE_CREDENTIALS"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
                                  "AUTHOR", "SSH_AUTH_SOCK", "PWD", "WORLD_SIZE", "LOCAL_RANK"])
def test_harmless_names(name: str) -> None:
    assert not is_secret_name(name)


def test_env_and_argv() -> None:
    env = redact_env({"HF_TOKEN": "anything", "CUDA_VISIBLE_DEVICES": "0,1",
                      "NOTES": "see " + SHAPES["aws"]})
    assert env["HF_TOKEN"] == REDACTED and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert SHAPES["aws"] not in env["NOTES"]
    argv = redact_argv(["train.py", "--password=hunter2", "--api-key", "zzz", "--lr", "0.1",
                        "--token", "--verbose", SHAPES["huggingface"]])
    assert argv == ["train.py", f"--password={REDACTED}", "--api-key", REDACTED, "--lr", "0.1",
                    "--token", "--verbose", REDACTED]


def test_redact_obj_walks_containers() -> None:
    obj = {"meta": {"api_token": "plain", "n": 3, "items": [SHAPES["github"], ("x", 1)]},
           "b": SHAPES["slack"].encode()}
    out = redact_obj(obj)
    assert out["meta"]["api_token"] == REDACTED and out["meta"]["n"] == 3
    assert out["meta"]["items"][0] == REDACTED and out["meta"]["items"][1] == ("x", 1)
    assert SHAPES["slack"].encode() not in out["b"]
