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

__all__ = ["MAX_REDACT_CHARS", "REDACTED", "is_secret_name", "redact_argv", "redact_env",
           "redact_obj", "redact_text", "redact_truncate"]

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

# Every pattern below runs in time linear in the text: a match may only start where a
# lookbehind (or a literal prefix) says a word starts, and every variable part is bounded or
# stops at a character class the next part cannot begin with. Python's backtracking engine is
# quadratic on a pattern like ``[A-Za-z_]\w*\s*=`` tried at every position of a 48 KiB token;
# these are not (benchmarks/bench_redact.py measures it).
_W = r"A-Za-z0-9_"
_NOT_IN_WORD = rf"(?<![{_W}.\-])"
# Token shapes, one alternation: the secret itself is replaced, its context kept.
_SHAPE_RE = re.compile(_NOT_IN_WORD + r"(?:"
    r"hf_[A-Za-z0-9]{20,}+"  # Hugging Face
    r"|api_org_[A-Za-z0-9]{20,}+"  # Hugging Face org tokens
    r"|gh[pousr]_[A-Za-z0-9]{20,}+"  # GitHub classic tokens
    r"|github_pat_[A-Za-z0-9_]{20,}+"  # GitHub fine-grained tokens
    r"|sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}+"  # OpenAI / Anthropic
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}+"  # Stripe
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}+"  # Slack
    r"|AIza[0-9A-Za-z_\-]{30,}+"  # Google API keys
    r"|ya29\.[0-9A-Za-z_\-]{20,}+"  # Google OAuth access tokens
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS key ids
    r"|eyJ[A-Za-z0-9_\-]{8,}+\.eyJ[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+"  # JWT
    r"|glpat-[A-Za-z0-9_\-]{20,}+"  # GitLab
    r"|npm_[A-Za-z0-9]{30,}+"  # npm
    r"|pypi-[A-Za-z0-9_\-]{40,}+"  # PyPI
    r"|dckr_pat_[A-Za-z0-9_\-]{20,}+"  # Docker Hub
    r")")
# PEM private keys: from BEGIN to END, or to the end of the text when END was cut off.
_PEM_BEGIN_RE = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END_RE = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
# A PEM body line (base64) or header line (Proc-Type:, DEK-Info:), for an END whose BEGIN was cut.
_PEM_LINE_RE = re.compile(r"[A-Za-z0-9+/=]*+|[A-Za-z\-]{1,32}: [^\n]{0,200}")
# user:password@host in URLs (keep the user and host: they help debugging and are not secret).
_URL_CRED_RE = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<pre>[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s:/@]{0,256}+:)"
    r"[^\s/@]{1,1024}+(?=@)")
# 40-hex W&B keys: only next to a word that says what they are, since git commit hashes are 40-hex.
_HEX40_RE = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{40}(?![0-9A-Za-z])")
_WANDB_WORD_RE = re.compile(r"wandb|api[_\-]?key", re.IGNORECASE)
# "Authorization: Bearer X", "Basic X", "token X" in a header quoted in a message.
_AUTH_SCHEME_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<pre>(?:[Bb]earer|BEARER|[Bb]asic|BASIC)\s{1,8}+)"
    r"(?P<val>[A-Za-z0-9._~+/\-]{8,}+=*+)")
# A name followed by its separator: ``name=``, ``name: ``, ``'name': ``, ``"name" => ``,
# ``--name=``, ``--name `` (a command line quoted in a message), ``?name=``/``&name=`` in URLs.
# Only the name and separator are matched: the value is read by hand, so that a harmless
# ``failed: token=X`` does not swallow the secret pair that follows it.
_NAME_SEP_RE = re.compile(
    rf"(?<![{_W}.\-])(?P<q>['\"]?)-{{0,2}}+(?P<name>[A-Za-z_][{_W}.\-]{{0,63}}+)(?P=q)"
    r"[ \t]{0,8}+(?:=>|[=:])(?![=:/])[ \t]{0,8}+")
# "--token abc" (a command line quoted in a message): a flag, blanks, and a value that is not
# another flag.
_FLAG_SEP_RE = re.compile(
    rf"(?<![{_W}.\-])--(?P<name>[A-Za-z][{_W}.\-]{{0,63}}+)[ \t]{{1,8}}+(?!-)")
_UNQUOTED_VAL_RE = re.compile(r"[^\s'\",;&)}\]]{1,4096}+")
_BLANKS_RE = re.compile(r"[ \t]{1,8}+")
_AUTH_WORDS = frozenset({"bearer", "basic", "token", "digest", "negotiate"})
# "KeyError: 'x'" in a traceback is an exception name, not a key/value pair.
_NOT_SECRET_SUFFIXES = ("Error", "Exception", "Warning", "Interrupt", "Exit")
_FLAG_RE = re.compile(r"^(?P<dashes>--?)(?P<name>[A-Za-z0-9][A-Za-z0-9_\-.]*)(?:=(?P<val>.*))?$")
#: Longest quoted value read as one secret (a longer one is cut at this many characters).
_MAX_QUOTED = 4096


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


@functools.lru_cache(maxsize=4096)
def _secret_pair_name(name: str) -> bool:
    return not name.endswith(_NOT_SECRET_SUFFIXES) and is_secret_name(name)


def _value_end(text: str, i: int) -> int:
    """End of the value that starts at ``text[i]`` (quoted, or a run of value characters, with
    an authorization scheme's credential after it); ``i`` when there is no value there."""
    n = len(text)
    if i >= n:
        return i
    q = text[i]
    if q in "'\"":
        stop = min(n, i + 1 + _MAX_QUOTED)
        j = text.find(q, i + 1, stop)
        nl = text.find("\n", i + 1, stop)
        if j < 0 or 0 <= nl < j:
            j = nl if nl >= 0 else stop
            return j
        return j + 1
    m = _UNQUOTED_VAL_RE.match(text, i)
    if m is None:
        return i
    end = m.end()
    if m.group(0).lower() in _AUTH_WORDS:  # "Authorization: Bearer X": X is the secret
        m2 = _BLANKS_RE.match(text, end)
        if m2 is not None:
            m3 = _UNQUOTED_VAL_RE.match(text, m2.end())
            if m3 is not None:
                end = m3.end()
    return end


def _redact_pairs(text: str, pattern: re.Pattern[str]) -> str:
    out: list[str] = []
    last = 0
    for m in pattern.finditer(text):
        if m.start() < last:
            continue  # inside a value already redacted
        if not _secret_pair_name(m.group("name")):
            continue
        i = m.end()
        end = _value_end(text, i)
        if end == i or text[i:end].strip("'\"") == REDACTED:
            continue
        quote = text[i] if text[i] in "'\"" else ""
        out.append(text[last:i])
        out.append(f"{quote}{REDACTED}{quote if end - i > 1 and text[end - 1] == quote else ''}")
        last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _pem_body_start(text: str, lo: int, end_at: int) -> int:
    """Where the body of a PEM key ending at ``end_at`` starts, walking back over base64 and
    header lines (not past ``lo`` nor a blank line): its BEGIN line was cut off."""
    j = end_at
    while j > lo:
        line_end = j - 1 if text[j - 1] == "\n" else j
        k = text.rfind("\n", lo, line_end)
        seg_start = k + 1 if k >= 0 else lo
        seg = text[seg_start:line_end]
        if not seg or not _PEM_LINE_RE.fullmatch(seg):
            break
        j = seg_start
    return j


def _redact_pem(text: str) -> str:
    if "PRIVATE KEY" not in text:
        return text
    out: list[str] = []
    pos = 0
    b = _PEM_BEGIN_RE.search(text)
    e = _PEM_END_RE.search(text)
    while b is not None or e is not None:
        if e is not None and (b is None or e.start() < b.start()):
            start = _pem_body_start(text, pos, e.start())  # END without its BEGIN
            stop = e.end()
        else:
            assert b is not None
            start = b.start()
            if e is None or e.start() < b.end():
                e = _PEM_END_RE.search(text, b.end())
            stop = e.end() if e is not None else len(text)
        out.append(text[pos:start])
        out.append(REDACTED)
        pos = stop
        # Each search starts past the last: every character is scanned a bounded number of times.
        if b is not None and b.start() < pos:
            b = _PEM_BEGIN_RE.search(text, pos)
        if e is not None and e.start() < pos:
            e = _PEM_END_RE.search(text, pos)
    out.append(text[pos:])
    return "".join(out)


def _wandb_sub(m: re.Match[str]) -> str:
    # A 40-hex W&B key is told from a git commit by a word before it on its line.
    s = m.string
    lo = max(0, m.start() - 48)
    nl = s.rfind("\n", lo, m.start())
    before = s[nl + 1 if nl >= 0 else lo:m.start()]
    return REDACTED if _WANDB_WORD_RE.search(before) else m.group(0)


def _auth_sub(m: re.Match[str]) -> str:
    # "Basic information" is prose; a credential has a digit, a symbol or mixed case.
    val = m.group("val")
    if val.isalpha() and (val.islower() or val.isupper()):
        return m.group(0)
    return m.group("pre") + REDACTED


def redact_text(text: str) -> str:
    """``text`` with every known token shape and secret-looking ``name=value`` replaced.

    Linear in ``len(text)``; apply it before cutting a text short (:func:`redact_truncate`),
    since a cut can leave a secret that no longer has its recognisable start.
    """
    if not text:
        return text
    text = _redact_pem(text)
    text = _SHAPE_RE.sub(REDACTED, text)
    text = _URL_CRED_RE.sub(lambda m: m.group("pre") + REDACTED, text)
    text = _HEX40_RE.sub(_wandb_sub, text)
    text = _AUTH_SCHEME_RE.sub(_auth_sub, text)
    return _redact_pairs(_redact_pairs(text, _NAME_SEP_RE), _FLAG_SEP_RE)


#: Texts longer than this are cut (at a line boundary) before they are redacted, so that a
#: pathological message costs bounded time; what is kept is redacted before the final cut.
MAX_REDACT_CHARS = 8 << 20


def redact_truncate(text: str, limit: int, keep: str = "head",
                    marker: str = "...(truncated)...") -> str:
    """``text`` redacted, then cut to ``limit`` characters (``keep="head"`` keeps the start,
    ``"tail"`` the end), with ``marker`` where it was cut.

    Redaction comes first: cutting first could keep the body of a PEM key without its BEGIN
    line, or the end of a token without its ``hf_``.
    """
    if len(text) > MAX_REDACT_CHARS:
        # Cut a pathological text at a line boundary first; the partial line at the cut is
        # dropped (it could be the middle of a token), and _redact_pem hides a key body whose
        # BEGIN line was cut off.
        if keep == "tail":
            piece = text[-MAX_REDACT_CHARS:]
            text = piece[piece.find("\n") + 1:] if "\n" in piece else ""
        else:
            piece = text[:MAX_REDACT_CHARS]
            text = piece[:piece.rfind("\n")] if "\n" in piece else ""
    text = redact_text(text)
    if len(text) <= limit:
        return text
    if keep == "tail":
        return marker + "\n" + text[-limit:]
    return text[:limit] + marker


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
