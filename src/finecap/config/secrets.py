"""Secrets in a configuration: which keys hold one, how they are masked when a configuration leaves the process
(files, stdout, experiment trackers, lock files, model cards) and which keys look like one (never repeated in an error
message).

Two kinds of secret are masked:

- the values of :data:`SECRET_KEYS` (API keys given in a configuration);
- credentials inside a URL, in any string value of any option and in any command-line argument: the user information
  of ``scheme://user:password@host`` (all of it: a lone ``token@`` is a credential too, as GitHub and Hub tokens are
  given) and the values of query or fragment parameters named like a secret (``?api_key=...``, ``&token=...``,
  ``#access_token=...``), each name read percent-decoded as a server reads it (``?%74oken=...`` is ``token``,
  shown as given with its value masked). Which options hold a URL is not listed anywhere: every string is scanned,
  so a new option (or a data path, a model name, a Hub address) is covered without being named here.

A masked URL is no longer usable: a stored ``config.yaml`` reused (``finecap caption RUN``, a resume) needs the
credentials given again (an override, or better the environment of the tool that reads the URL).

Nor does a URL finecap requests carry its user information: httpx logs every request's URL (``HTTP Request: POST
http://user:password@host/...`` at INFO, which a training script's ``logging.basicConfig(level=logging.INFO)``
writes to its log file). Every HTTP client of finecap (the ``openai`` backend of boost and of the judge, the reward
server's client) takes it out of the URL first (:func:`split_credentials`) and sends it as HTTP basic authentication
(httpx's ``auth=``), as httpx would have sent it from the URL. A server (or proxy) that echoes the request's
``Authorization`` header in its error has the header's credential masked in the client's message
(:func:`masked_authorization`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any
from urllib.parse import unquote, unquote_plus

SECRET_KEYS: tuple[str, ...] = ("boost.llm_api_key", "boost.vlm_api_key")
"""Keys holding secrets: masked wherever a configuration is saved, printed or logged; finecap boost never writes them
(prefer the environment: ``boost.llm_api_key_env`` / ``boost.vlm_api_key_env``)."""

DEPRECATED_SECRETS: dict[str, str] = {"boost.llm_api_key": "boost.llm_api_key_env",
                                      "boost.vlm_api_key": "boost.vlm_api_key_env"}  # fmt: skip
"""The deprecated keys holding a secret, each with the option that replaces it: the name of an environment variable
holding the secret (docs/boost.md, "API keys come from the environment"). Setting one is warned about once
(:func:`deprecated_secret_message`)."""


def deprecated_secret_message(key: str) -> str:
    """The warning about setting the deprecated ``key`` (:data:`DEPRECATED_SECRETS`), which names its replacement.

    Example::

        >>> deprecated_secret_message("boost.llm_api_key")
        'boost.llm_api_key is deprecated: put the key in an environment variable and name it in boost.llm_api_key_env \
(default OPENAI_API_KEY) instead'
    """
    return f"{key} is deprecated: {environment_advice(key)}"


def environment_advice(key: str) -> str:
    """Where the secret of ``key`` (a :data:`SECRET_KEYS` key) goes instead: an environment variable named by the
    option replacing it (:data:`DEPRECATED_SECRETS`): said when it is set (:func:`deprecated_secret_message`) and
    when it is given on the command line (``finecap.app.cli.command_line_secrets``).

    Example::

        >>> environment_advice("boost.vlm_api_key")
        'put the key in an environment variable and name it in boost.vlm_api_key_env (default OPENAI_API_KEY) instead'
    """
    return (f"put the key in an environment variable and name it in {DEPRECATED_SECRETS.get(key, key + '_env')} "
            "(default OPENAI_API_KEY) instead")  # fmt: skip


def on_command_line_message(option: str, safer: str) -> str:
    """The warning about a secret given on the command line by ``option`` (``--token``, ``boost.llm_api_key=``):
    every user of the machine can read a process's arguments (``ps``, ``/proc/<pid>/cmdline``) while it runs, and
    finecap cannot reliably hide them once the process has started; ``safer`` says the route that keeps the secret
    off the command line (an environment variable, a token file).

    Example::

        >>> on_command_line_message("--token", "set $FINECAP_REVIEW_TOKEN instead")
        '--token: a secret on the command line is visible to every user of this machine (ps, /proc/<pid>/cmdline) \
while the command runs; set $FINECAP_REVIEW_TOKEN instead'
    """
    return (f"{option}: a secret on the command line is visible to every user of this machine (ps, "
            f"/proc/<pid>/cmdline) while the command runs; {safer}")  # fmt: skip


MASK = "***"
"""What a secret (:data:`SECRET_KEYS`) is written as. Read back (a stored ``config.yaml``), it means "not set": the key
then comes from the environment (``boost.llm_api_key_env``), never the mask itself."""

SECRET_WORDS: tuple[str, ...] = ("key", "token", "secret", "password", "passwd", "passphrase", "pwd", "auth",
                                 "credential", "signature", "sig", "bearer", "jwt", "cookie")  # fmt: skip
"""Words that make a name look like it holds a secret: a configuration key (:func:`looks_secret`) or a URL's query
parameter (:func:`masked_url_secrets`), read in each of the name's words (:func:`_secret_name`): ``api_key``,
``apiKey``, ``apikey``, ``accesskeyid``, ``oauth``, ``authorization``, ``X-Amz-Signature``, ``passphrase``,
``bearer``, ``jwt``, ``cookie``; the short :data:`EDGE_WORDS` only at a word's start or end (not in ``design``,
``assign``). A session's id is a secret too, read by its own rule (:data:`SESSION_ID`); ``private`` alone is none (a
repository's ``private=true``), ``private_key`` is one by ``key``."""

EDGE_WORDS: tuple[str, ...] = ("sig", "auth")
"""The :data:`SECRET_WORDS` that begin or sit inside common words (``signal``, ``sigma``, ``design``, ``author``),
so they count only at the start or end of a word of a name (``sig``, ``sigv``, ``urlsig``, ``oauth``,
``authorization``); the others count anywhere in one (``hftokenvalue``, ``accesskeyid``)."""

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*:/+)(?P<rest>[^\s'\"<>`]*)")
"""A URL inside a text: a scheme, ``://`` and everything up to white space or a quote (as pasted in a message). One
slash is enough: a URL taken for a path (``Path("https://u:p@h/x")``, a data path made absolute) reads ``https:/``."""
_PARAM = re.compile(r"(?P<sep>[?&;#])(?P<name>[^=&;#?]*)=(?P<value>[^&;#]*)")
"""One ``name=value`` parameter of a URL's query or fragment."""


TEXT_TOKENS = re.compile(r"tokeni[sz]|token_?ids?(?![a-z])")
"""Parts of a name that speak of a text's tokens, not of an access token: ``tokenizer`` / ``tokenise``,
``token_id(s)`` (``smile.shift_token_id``); and ``tokens`` as a word's end in a name that counts them
(:data:`TOKEN_COUNT`: ``max_new_tokens``, ``data.max_tokens``, ``tokens_per_batch``). They are left out before a
name is read for :data:`SECRET_WORDS`, so ``decode.max_new_tokens=20`` is repeated in an error as given, where
``hf_token``, ``access_token`` or ``api_token`` (one token) is a secret still, and so are ``access_tokens`` or
``refresh_tokens`` (tokens, but no count) and a word that only begins with ``tokens`` (``tokenstring``)."""

TOKEN_COUNT = re.compile(r"(?:^|_)(?:max|min|num|n|new|per|count|total|limit|budget)(?:_|$)")
"""A word of a name that makes its ``tokens`` a count of a text's tokens (:data:`TEXT_TOKENS`), read in the name's
lower-case words joined by ``_``: ``max_new_tokens``, ``num_tokens``, ``tokens_per_batch``."""


_ANYWHERE = "|".join(w for w in SECRET_WORDS if w not in EDGE_WORDS)
_AT_EDGE = "|".join(EDGE_WORDS)
_SECRET_IN_WORD = re.compile(rf"{_ANYWHERE}|authori[sz]|^(?:{_AT_EDGE})|(?:{_AT_EDGE})s?$")
"""A word of a name holding one of :data:`SECRET_WORDS` (``apikey``, ``hftoken``, ``clientsecret``, ``keyid``), one
of the :data:`EDGE_WORDS` at its start or end (``sig``, ``signed``, ``authorization``, ``oauth``, ``sigs``), or
``authoriz``/``authoris`` anywhere (``proxyauthorization``: no common word holds it)."""

COMMON_WORDS = re.compile(
    r"(?:mon|don|tur|hoc|joc|whis|lac)keys?"  # monkey, turkey, hockey, ...
    r"|key(?:point|word|frame|board|stroke|pad|note|stone|hole)s?"  # keypoints, keyword, keyframe, ...
    r"|sig(?:mas?|moids?|nals?|nal(?:l?ed|l?ing)|nifica[a-z]*|ils?)"  # sigma, sigmoid, signal, significant, sigil
    r"|author(?:s|ed|ing|ship|it[a-z]*)?"  # author, authors, authority (authorization and authorize are secrets)
    r"|secretar[a-z]*"  # secretary
)
"""Common words that hold one of :data:`SECRET_WORDS` as a secret's name would (:data:`_SECRET_IN_WORD`) and name no
secret: a user's dataset column ``author``, a reward's ``sigma``, ``keypoints``, the class ``monkey``. Only these
whole words are exempt: any other word holding a secret word is read as a secret's name, since masking too little
leaks a secret where masking too much only hides a value."""

SESSION_ID = re.compile(r"(?:^|_)[a-z]*sess(?:ion)?_?ids?(?:_|$)|^session$")
"""A session's id, which logs its holder in as a password would, read in a name's words joined by ``_``
(:func:`_name_words`): ``session_id``, ``sessionId``, ``sessionid``, ``JSESSIONID``, ``PHPSESSID``,
``ASP.NET_SessionId``, or a name that is ``session`` alone (Flask's cookie); ``session_token``, ``session_key`` and
``session_cookie`` are secrets by their other word. Other words beside ``session`` name no secret
(``sessions_per_epoch``, ``session_timeout``, ``session_name``): "session" is no secret word itself."""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
"""Where a camelCase name's words meet: ``apiKey``, ``XAmzSignature``, ``AWSAccessKeyId``."""


def _name_words(name: str) -> list[str]:
    """The words of ``name`` (a key's last part, a URL's query parameter), lower case: split at anything but a
    letter (``_``, ``-``, ``.``, digits) and where camelCase words meet, its words for a text's tokens
    (:data:`TEXT_TOKENS`) left out.

    >>> _name_words("X-Amz-Signature"), _name_words("AWSAccessKeyId"), _name_words("maxNewTokens")
    (['x', 'amz', 'signature'], ['aws', 'access', 'key', 'id'], ['max', 'new'])
    """
    lowered = TEXT_TOKENS.sub(" ", _CAMEL.sub("_", name).lower())
    if TOKEN_COUNT.search("_".join(re.findall(r"[a-z]+", lowered))):  # a count of tokens, not an access token's
        lowered = re.sub(r"tokens(?![a-z])", " ", lowered)
    return re.findall(r"[a-z]+", lowered)


def _secret_name(name: str) -> bool:
    """Whether ``name`` (a key's last part, a URL's query parameter) names a secret: one of its words
    (:func:`_name_words`) holds one of :data:`SECRET_WORDS` (``api_key``, ``apikey``, ``x-api-key``, ``accessToken``),
    one of the :data:`EDGE_WORDS` at its start or end (``sig``, ``oauth``; not ``design``), and is no common word
    (:data:`COMMON_WORDS`: ``sigma``, ``author``, ``keypoint``, ``monkey``).

    >>> [_secret_name(n) for n in ("hf_token", "api_key", "apikey", "auth_tokens", "X-Amz-Signature", "sig")]
    [True, True, True, True, True, True]
    >>> [_secret_name(n) for n in ("max_new_tokens", "tokenizer", "token_ids", "sigma", "design", "author", "monkey")]
    [False, False, False, False, False, False, False]
    >>> [_secret_name(n) for n in ("session_id", "JSESSIONID", "session", "sessions_per_epoch", "session_timeout")]
    [True, True, True, False, False]
    """
    words = _name_words(name)
    return bool(SESSION_ID.search("_".join(words))) or any(
        _SECRET_IN_WORD.search(w) and not COMMON_WORDS.fullmatch(w) for w in words
    )


def _authority(rest: str) -> tuple[str | None, str, str]:
    """The user information (``None`` without an ``@``), the host with its port, and what follows them (path, query,
    fragment) of a URL's ``rest``, after its scheme and slashes. The user information ends at the authority's last
    ``@``, as urllib and httpx read it."""
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, host = authority.rpartition("@")
    return userinfo if at else None, host, tail


def _masked_url(scheme: str, rest: str) -> str:
    """One URL (``scheme`` with its slashes, then the ``rest``) with its user information and its secret-named
    parameters masked (module docstring)."""
    userinfo, host, tail = _authority(rest)
    authority = host if userinfo is None else f"{MASK}@{host}"
    cut = min([i for i in (tail.find(c) for c in "?#") if i >= 0], default=len(tail))
    path, params = tail[:cut], tail[cut:]
    params = _PARAM.sub(
        lambda m: f"{m['sep']}{m['name']}={MASK}" if m["value"] and _secret_name(unquote_plus(m["name"])) else m[0],
        params,
    )  # a name is read as the server decodes it (?%74oken= is token=, api+key is 'api key'), shown as given
    return f"{scheme}{authority}{path}{params}"


def masked_url_secrets(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (module docstring): what a value, a command line or
    a message becomes before it is written or printed.

    Example::

        >>> masked_url_secrets("base https://user:pa55@host:8000/v1?api_key=k1&x=2 and file.json")
        'base https://***@host:8000/v1?api_key=***&x=2 and file.json'
        >>> masked_url_secrets("/work/https:/user:pa55@host/set.jsonl: no such file")
        '/work/https:/***@host/set.jsonl: no such file'
        >>> masked_url_secrets("http://localhost:8000/v1")
        'http://localhost:8000/v1'
    """
    return _URL.sub(lambda m: _masked_url(m["scheme"], m["rest"]), text) if ":/" in text else text


_AUTHORIZATION = re.compile(
    r"(?i)(?P<head>(?<![a-z0-9])(?:proxy[-_])?authorization(?:\\?[\"'])?\s*(?:[:=]|=>)\s*(?:\[\s*)?(?:b?\\?[\"'])?"
    r"(?:(?:bearer|basic|token)\s+)?)"
    r"(?!(?:bearer|basic|token)\s)(?P<value>[^\s\"'<>,;}\]\\]+)"
)
"""An ``Authorization`` (or ``Proxy-Authorization``) header's value as a server or proxy echoing the request writes
it in its reply (``Authorization: Bearer sk-...``, ``"authorization": "Basic YWxp..."``), also as a list (Go's
``http.Header`` in JSON: ``"Authorization":["Bearer sk-..."]``), a WSGI/CGI variable (``HTTP_AUTHORIZATION``), a
Python bytes literal (``b'Bearer sk-...'``) or inside a JSON string (``\\"Authorization\\": \\"Bearer sk-...\\"``):
the scheme kept, the credential after it (a placeholder such as ``<token>`` is none)."""


def masked_authorization(text: str) -> str:
    """``text`` (what a server answered) with the credential of every ``Authorization`` header in it masked: a
    server or proxy that echoes the request in its error (httpbin, a debugging proxy) repeats the bearer token or
    the basic authentication (:func:`split_credentials`: a URL's password, in base64) that finecap's HTTP clients
    sent, and the client's error message repeats the server's words.

    Example::

        >>> masked_authorization('denied {"headers": {"Authorization": "Bearer sk-1234", "Host": "h"}}')
        'denied {"headers": {"Authorization": "Bearer ***", "Host": "h"}}'
        >>> masked_authorization("authorization: Basic YWxpY2U6cGE1NQ== and send 'Authorization: Bearer <token>'")
        "authorization: Basic *** and send 'Authorization: Bearer <token>'"
    """
    return _AUTHORIZATION.sub(lambda m: f"{m['head']}{MASK}", text) if "uthorization" in text.lower() else text


def masked_reply(text: str) -> str:
    """What a server answered, as finecap repeats it in a message: the credentials of the URLs in it
    (:func:`masked_url_secrets`) and of an ``Authorization`` header it echoes (:func:`masked_authorization`) masked.
    The one rule of finecap's HTTP clients (the reward client's errors and retry lines, boost's and the judges'
    ``openai`` backend).

    >>> masked_reply('bad token for https://u:pw@h/v1: "Authorization": "Bearer sk-1"')
    'bad token for https://***@h/v1: "Authorization": "Bearer ***"'
    """
    return masked_authorization(masked_url_secrets(text))


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its user information, and the ``(user, password)`` it held, percent-decoded as httpx reads
    them (``None`` when it held none, or an empty one): what finecap's HTTP clients request and send as basic
    authentication (module docstring), so that the URL httpx logs carries no secret. A lone ``token@`` is a user
    with an empty password (as httpx sends it); a text that is no ``scheme://`` URL comes back as it is.

    Example::

        >>> split_credentials("http://alice:pa%40ss@host:8000/v1?x=1")
        ('http://host:8000/v1?x=1', ('alice', 'pa@ss'))
        >>> split_credentials("https://tok3n@host/v1"), split_credentials("http://localhost:8000/v1")
        (('https://host/v1', ('tok3n', '')), ('http://localhost:8000/v1', None))
    """
    scheme = _SCHEME.match(url)
    if scheme is None:
        return url, None
    userinfo, host, tail = _authority(url[scheme.end() :])
    if userinfo is None:
        return url, None
    user, _, password = userinfo.partition(":")
    return f"{scheme[0]}{host}{tail}", (unquote(user), unquote(password)) if user or password else None


def masked_url_values(value: Any) -> Any:
    """``value`` (a JSON-like value: strings, numbers, lists, tuples, dicts) with the credentials of every URL in each
    of its strings masked (:func:`masked_url_secrets`), keys kept: what a record of settings other than a whole
    configuration (:func:`redacted`) becomes before it is written, e.g. the header of ``finecap caption``'s partial
    results file, which holds the run's ``data`` and ``model`` options as the command line gave them.

    Example::

        >>> masked_url_values({"data": {"path": "https://u:pa55@h/set.json", "n": 2}, "ids": ["http://t@h"]})
        {'data': {'path': 'https://***@h/set.json', 'n': 2}, 'ids': ['http://***@h']}
    """
    if isinstance(value, str):
        return masked_url_secrets(value)
    if isinstance(value, list | tuple):
        return type(value)(masked_url_values(v) for v in value)
    if isinstance(value, dict):
        return {k: masked_url_values(v) for k, v in value.items()}
    return value


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of sections ``{section: {key: value}}`` with every non-empty :data:`SECRET_KEYS` value replaced by
    :data:`MASK` and the credentials of every URL in a string value masked (:func:`masked_url_secrets`): what
    :meth:`Config.save` writes, ``finecap config`` prints and trackers receive.

    Example::

        >>> redacted({"boost": {"llm_api_key": "sk-1", "vlm_api_key": "", "llm_base_url": "http://u:p@h/v1"}})["boost"]
        {'llm_api_key': '***', 'vlm_api_key': '', 'llm_base_url': 'http://***@h/v1'}
    """
    out = {name: masked_url_values(values) for name, values in data.items()}
    for dotted in SECRET_KEYS:
        section, key = dotted.split(".")
        values = out.get(section)
        if isinstance(values, dict) and values.get(key):
            values[key] = MASK
    return out


SECRET_TYPO_CUTOFF = 0.8
"""How close (:func:`difflib.get_close_matches`' ratio) a key must be to one of :data:`SECRET_KEYS` to be taken for a
mistyping of it (``boost.llm_api``: 0.87, ``boost.llm_api_kye``: 0.94); no other option's key comes this close (the
nearest, ``boost.llm_backend``, is under 0.8: ``tests/config/test_config_loading.py``)."""


def looks_secret(key: str) -> bool:
    """A key of :data:`SECRET_KEYS`, one named like a secret (a mistyped ``boost.llm_apikey``, ``hub.hf_token``) or
    one close to a secret key's name (a mistyped ``boost.llm_api_kye`` or ``boost.llm_api``,
    :data:`SECRET_TYPO_CUTOFF`): its value is never repeated in an error message. A name's words for a text's tokens
    are no secret (:data:`TEXT_TOKENS`: ``decode.max_new_tokens``).

    Example::

        >>> looks_secret("boost.llm_apikey"), looks_secret("boost.llm_api_kye"), looks_secret("train.lr")
        (True, True, False)
        >>> looks_secret("hub.hf_token"), looks_secret("decode.max_new_tokens")
        (True, False)
    """
    name = key.rsplit(".", 1)[-1]
    if key in SECRET_KEYS or _secret_name(name):
        return True
    return bool(difflib.get_close_matches(key, SECRET_KEYS, n=1, cutoff=SECRET_TYPO_CUTOFF))
