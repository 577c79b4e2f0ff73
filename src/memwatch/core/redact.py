"""Secret redaction for everything memwatch writes to disk or uploads.

Two independent nets, both applied before anything leaves the process:

* **by name**: the value of an environment variable, a ``--flag=value`` argument or a
  ``key: value``/``key=value`` pair whose name looks secret (``TOKEN``, ``KEY``, ``SECRET``,
  ``PASSWORD``, ``PASS``, ``CREDENTIAL``, ``AUTH``, ``COOKIE``, ``SESSION``, ``PRIVATE``,
  ``API``...) is replaced whatever it looks like;
* **by shape**: known token formats are replaced wherever they appear (messages, tracebacks,
  metadata): Hugging Face ``hf_...``, GitHub ``ghp_``/``github_pat_``, OpenAI/Anthropic ``sk-...``,
  Slack ``xox.-``, Google ``AIza...``, AWS access key ids ``AKIA...``, JWTs, PEM private keys,
  ``user:password@`` in URLs, and 40-hex W&B keys next to a wandb/api-key word.

Redaction errs on the side of hiding: a false positive costs a ``<redacted>`` in a report, a false
negative leaks a credential.

Example::

    >>> from memwatch.core.redact import redact_text, redact_env
    >>> redact_text("push failed: token hf_abcdefghijklmnopqrstuvwxyz0123 rejected")
    'push failed: token <redacted> rejected'
    >>> redact_env({"HF_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "0"})
    {'HF_TOKEN': '<redacted>', 'CUDA_VISIBLE_DEVICES': '0'}
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact_argv", "redact_env", "redact_obj", "redact_text"]

REDACTED = "<redacted>"

# Words that mark a name as secret. A name is split into words (snake_case, kebab-case,
# camelCase); it is secret when a word is one of these, ends with one (APIKEY, HFTOKEN, DBPASS) or
# starts with one of the unambiguous ones (TOKENS, SECRETS, CREDENTIALS, PASSWORD_FILE...).
# Whole words, not substrings, so that AUTHOR, MONKEY, CAPITAL or COMPASS stay readable.
_SECRET_WORDS = frozenset({
    "TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "PWD", "CREDENTIAL", "CREDENTIALS",
    "CRED", "CREDS", "AUTH", "COOKIE", "SESSION", "PRIVATE", "API", "SIGNATURE", "APIKEY",
})
_SECRET_PREFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "SESSION",
                    "PRIVATE", "AUTHORIZATION", "APIKEY")
# Names that contain a secret word but are known harmless configuration (keeps reports useful).
_HARMLESS_NAMES = frozenset({
    "PWD", "OLDPWD", "PASSWORD_STORE_DIR", "KEYTIMEOUT", "SSH_AUTH_SOCK", "XDG_SESSION_TYPE",
    "XDG_SESSION_CLASS", "XDG_SESSION_ID", "XDG_SESSION_DESKTOP", "DBUS_SESSION_BUS_ADDRESS",
})
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT_RE = re.compile(r"[^A-Za-z0-9]+")

# Token shapes. Each pattern matches only the secret itself; the replacement keeps context.
_SHAPES: tuple[re.Pattern[str], ...] = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
               re.DOTALL),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"\bapi_org_[A-Za-z0-9]{20,}"),  # Hugging Face org tokens
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub classic tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),  # GitHub fine-grained tokens
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),  # Google API keys
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[A-Z0-9]{16}\b"),  # AWS key ids
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab
    re.compile(r"\bnpm_[A-Za-z0-9]{30,}"),  # npm
)
# user:password@host in URLs (keep the user and host: they help debugging and are not secret).
_URL_CRED_RE = re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s/@]+(?=@)")
# 40-hex W&B keys: only next to a word that says what they are, since git commit hashes are 40-hex.
_WANDB_HEX_RE = re.compile(
    r"(?P<pre>(?:wandb|api[_\-]?key|WANDB_API_KEY)[^\n]{0,40}?)\b[0-9a-f]{40}\b", re.IGNORECASE
)
# name=value / name: value / --name value with a secret-looking name, anywhere in free text.
_PAIR_RE = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>\s*[=:]\s*)(?P<q>['\"]?)"
    r"(?P<val>[^\s'\",;&)}\]]+)"
)
# "--token abc" inside free text (a command line quoted in a message).
_DASH_PAIR_RE = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<name>--[A-Za-z][A-Za-z0-9_.\-]*)(?P<sep>\s+)(?P<q>['\"]?)"
    r"(?P<val>[^\s'\",;&)}\]\-][^\s'\",;&)}\]]*)"
)
# "KeyError: 'x'" in a traceback is an exception name, not a key/value pair.
_NOT_SECRET_SUFFIXES = ("Error", "Exception", "Warning", "Interrupt", "Exit")
_FLAG_RE = re.compile(r"^(?P<dashes>--?)(?P<name>[A-Za-z0-9][A-Za-z0-9_\-.]*)(?:=(?P<val>.*))?$")


def is_secret_name(name: str) -> bool:
    """Whether a variable or option named ``name`` probably holds a secret."""
    if name.upper().strip("_-") in _HARMLESS_NAMES:
        return False
    for word in _WORD_SPLIT_RE.split(_CAMEL_RE.sub("_", name)):
        w = word.upper()
        if not w:
            continue
        if w in _SECRET_WORDS or w.startswith(_SECRET_PREFIXES):
            return True
        if any(w.endswith(s) for s in _SECRET_WORDS if len(s) >= 4 or s == "KEY"):
            return True
    return False


def _redact_pairs(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        sep = m.group("sep")
        if name.endswith(_NOT_SECRET_SUFFIXES) or m.group("val") == REDACTED:
            return m.group(0)
        if not is_secret_name(name.lstrip("-")):
            return m.group(0)
        return f"{name}{sep}{m.group('q')}{REDACTED}"

    return _DASH_PAIR_RE.sub(sub, _PAIR_RE.sub(sub, text))


def redact_text(text: str) -> str:
    """``text`` with every known token shape and secret-looking ``name=value`` replaced."""
    if not text:
        return text
    for pat in _SHAPES:
        text = pat.sub(REDACTED, text)
    text = _URL_CRED_RE.sub(lambda m: m.group("pre") + REDACTED, text)
    text = _WANDB_HEX_RE.sub(lambda m: m.group("pre") + REDACTED, text)
    return _redact_pairs(text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secret-named values hidden and token shapes removed from the rest."""
    out: dict[str, str] = {}
    for k, v in env.items():
        out[k] = REDACTED if is_secret_name(k) else redact_text(str(v))
    return out


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A copy of a command line with secret option values hidden.

    Handles ``--password=x``, ``--password x``, ``-p`` is left alone (too ambiguous), and token
    shapes in any argument.
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-"):
                out.append(REDACTED)
                continue
        m = _FLAG_RE.match(arg)
        if m and len(m.group("dashes")) == 2 and is_secret_name(m.group("name")):
            if m.group("val") is None:
                hide_next = True
                out.append(arg)
            else:
                out.append(f"--{m.group('name')}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


def redact_obj(obj: Any) -> Any:
    """Recursively redact a JSON-like structure: string values, and values under secret keys.

    Snapshots repeat the same file and function names hundreds of thousands of times, so each
    distinct string is redacted once per call (memoised).
    """
    memo: dict[str, str] = {}
    return _redact_obj(obj, 0, memo)


def _redact_str(s: str, memo: dict[str, str]) -> str:
    out = memo.get(s)
    if out is None:
        out = redact_text(s)
        if len(memo) < 1_000_000:
            memo[s] = out
    return out


def _redact_obj(obj: Any, depth: int, memo: dict[str, str]) -> Any:
    if depth > 32:
        return REDACTED  # pathological nesting: safer to drop than to walk forever
    if isinstance(obj, str):
        return _redact_str(obj, memo)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, bytes):
        try:
            return _redact_str(obj.decode("utf-8"), memo).encode("utf-8")
        except UnicodeDecodeError:
            return obj
    if isinstance(obj, Mapping):
        red: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and isinstance(v, (str, bytes)) and _secret_key(k):
                red[k] = REDACTED
            else:
                red[k] = _redact_obj(v, depth + 1, memo)
        return red
    if isinstance(obj, list):
        return [_redact_obj(v, depth + 1, memo) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_redact_obj(v, depth + 1, memo) for v in obj)
    return obj


@functools.lru_cache(maxsize=4096)
def _secret_key(name: str) -> bool:
    return is_secret_name(name)
