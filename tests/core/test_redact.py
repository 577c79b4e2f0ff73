"""Redaction: secret names, token shapes, argv; and what must stay readable."""

from __future__ import annotations

import time

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


# ---------------------------------------------------------------- shapes found on shared machines
@pytest.mark.parametrize("text, secret", [
    ("push failed: token=Zq1Zq2Zq3Zq4Zq5", "Zq1Zq2Zq3Zq4Zq5"),
    ("Authorization: Bearer Zq1Zq2Zq3Zq4Zq5", "Zq1Zq2Zq3Zq4Zq5"),
    ("headers={'Authorization': 'Bearer Zq1Zq2Zq3Zq4Zq5'}", "Zq1Zq2Zq3Zq4Zq5"),
    ('{"password": "Zq1Zq2 Zq3Zq4Zq5", "user": "bob"}', "Zq3Zq4Zq5"),
    ("GET https://hub.example/api?access_token=Zq1Zq2Zq3Zq4Zq5&page=2", "Zq1Zq2Zq3Zq4Zq5"),
    ("sent Basic dXNlcjpwYXNzd29yZA== upstream", "dXNlcjpwYXNzd29yZA"),
    ("curl -H 'X-Api-Key: Zq1Zq2Zq3Zq4Zq5' https://x", "Zq1Zq2Zq3Zq4Zq5"),
    ("login(token='Zq1Zq2Zq3Zq4Zq5')", "Zq1Zq2Zq3Zq4Zq5"),
    ("Cookie: session=Zq1Zq2Zq3Zq4Zq5; theme=dark", "Zq1Zq2Zq3Zq4Zq5"),
    ("ran: python train.py --api-key Zq1Zq2Zq3Zq4Zq5 --lr 0.1", "Zq1Zq2Zq3Zq4Zq5"),
    ("store['hf_Zq1Zq2Zq3Zq4Zq5Zq6Zq7Zq8']", "Zq1Zq2Zq3Zq4Zq5Zq6"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
     "-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAA"),
    ("sk_live_Zq1Zq2Zq3Zq4Zq5Zq6Zq7", "Zq1Zq2Zq3Zq4Zq5Zq6Zq7"),
    ("ya29.Zq1Zq2Zq3Zq4Zq5Zq6Zq7Zq8", "Zq1Zq2Zq3Zq4Zq5Zq6Zq7"),
])
def test_common_secret_shapes(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out
    assert redact_text(out) == out  # idempotent: a second pass changes nothing


def test_a_harmless_pair_does_not_hide_the_secret_after_it() -> None:
    # "failed: token=X": the harmless "failed:" must not swallow "token=X" as its value.
    assert redact_text("failed: token=abc123") == f"failed: token={REDACTED}"
    assert redact_text("a=1 b: 2, password=x y") == f"a=1 b: 2, password={REDACTED} y"


def test_prose_and_code_stay_readable() -> None:
    for text in ("a basic example of building blocks", "Basic information",
                 "torch::autograd::Node", "https://example.com/path?page=2&sort=asc",
                 "see http://x.org/a:b", "cuda:0, lr=0.1, momentum: 0.9",
                 "Token indices sequence length is longer than the specified maximum"):
        assert redact_text(text) == text


def test_a_key_whose_begin_line_was_cut_off_is_hidden() -> None:
    tail = "Zq1Zq2Zq3Zq4BODY\nAAAABBBBCCCC\n-----END RSA PRIVATE KEY-----\nafter"
    out = redact_text(tail)
    assert "BODY" not in out and "AAAABBBB" not in out and out.endswith("\nafter")


def test_redaction_comes_before_truncation() -> None:
    from memwatch.core.redact import redact_truncate

    # The cut at 4,030 characters from the end lands inside the token: cutting first would
    # keep "Zq1Zq1..." without the "hf_" that makes it recognisable.
    text = "x" * 100 + " hf_" + "Zq1" * 20 + " " + "y" * 4000
    out = redact_truncate(text, 4030, keep="tail")
    assert out.startswith("...(truncated)...") and "Zq1" not in out
    head = redact_truncate("y" * 20 + " hf_" + "Zq1" * 20, 30)
    assert "Zq1" not in head and head.endswith("...(truncated)...")


def test_redaction_is_linear_in_the_text() -> None:
    """Adversarial texts (a long token, runs of separators, repeated prefixes) take time
    proportional to their length: 16 times longer is far from 256 times slower. CPU time of
    this thread, so that other jobs on a loaded machine do not count."""
    import random

    rnd = random.Random(1)
    alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    shapes = {
        "token": lambda n: "".join(rnd.choice(alnum) for _ in range(n)),
        "pairs": lambda n: "a=" * (n // 2),
        "colons": lambda n: "x:" * (n // 2),
        "dash flags": lambda n: "--a " * (n // 4),
        "quotes": lambda n: "'a': '" * (n // 6),
        "urls": lambda n: "a://b:" * (n // 6),
        "bearer": lambda n: "Bearer " * (n // 7),
        "pem ends": lambda n: "-----END RSA PRIVATE KEY-----\n" * (n // 30),
    }
    for name, make in shapes.items():
        small, big = make(8_000), make(128_000)
        best = {}
        for label, text in (("small", small), ("big", big)):
            times = []
            for _ in range(3):
                t0 = time.thread_time()
                redact_text(text)
                times.append(time.thread_time() - t0)
            best[label] = min(times)
        # Linear: about 16x (measured 14-16x); quadratic: 256x.
        assert best["big"] < 0.5 and best["big"] / max(best["small"], 1e-5) < 40, (name, best)


def test_findings_are_redacted_at_birth() -> None:
    from memwatch.core.findings import Finding, Origin

    key = "hf_" + "Zq1Zq2Zq3Zq4Zq5Zq6Zq7Zq8"
    f = Origin(epoch=1).finding(
        rule="leak", kind="leak", metric="host.rss", severity="warning",
        message=f"host.rss grows; held by store['{key}']", culprit=f"store['{key}']",
        suggestions=[f"del store['{key}']"], evidence={"holder": f"store['{key}']",
                                                     "groups": [{"name": key}]})
    assert key not in repr(f.to_dict())
    assert f.evidence["holder"] == f"store['{REDACTED}']"
    again = Finding.from_dict(f.to_dict())
    assert again == f  # redaction is idempotent
