"""Webhook declarations (`[hooks.NAME]` in the config file) and how a delivery becomes a job.

A hook names the function its deliveries run (`func`), or a declared workflow each
delivery starts (`workflow`, its state `{"hook": <the argument>}`), and optionally a serial
`key`, a `secret_file` whose secret signs each body (HMAC-SHA256), an `idempotency_header`
to read a delivery id from, and `max_body` in bytes. No I/O besides reading the secret
file once at start-up; Hook objects are immutable and shared between threads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

from ..core import protocol
from ..core.protocol import QueueError

DEFAULT_MAX_BODY = 1 << 20  # bytes
SIGNATURE_HEADER = "X-Hub-Signature-256"  # "sha256=<hex>" as GitHub and many others send it
# Delivery ids that make a repeated delivery return the first job, checked in this order
# after the hook's own idempotency_header.
DELIVERY_HEADERS = ("X-Delivery-Id", "X-GitHub-Delivery", "Idempotency-Key")
# Credentials a sender (or a proxy) put on the request: never stored with a job, where
# anyone who may read jobs would see them. Matched by pattern, not by a list of names,
# because senders invent names (X-Api-Key, X-Auth, X-Secret...); the hook's own signature
# header goes too, whatever its name.
CREDENTIAL_WORDS = ("auth", "token", "secret", "key", "signature", "password", "cookie")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
# Job fields a hook may give its deliveries' jobs, as a job gives them (checked the same way).
JOB_FIELDS = ("concurrency_group", "concurrency_limit", "cost_units", "rate_limit")
_FIELDS = frozenset({"func", "workflow", "key", "secret_file", "idempotency_header", "max_body",
                     "signature_header", *JOB_FIELDS})


@dataclass(frozen=True)
class Hook:
    name: str
    func: str
    key: str | None = None
    secret: bytes | None = None
    idempotency_header: str | None = None
    signature_header: str = SIGNATURE_HEADER
    max_body: int = DEFAULT_MAX_BODY
    job: tuple[tuple[str, Any], ...] = ()  # JOB_FIELDS given, as (wire name, value)
    workflow: str | None = None  # a declared workflow each delivery starts, instead of a job

    def signature_ok(self, body: bytes, given: str | None) -> bool:
        """True when the hook has no secret, or `given` is the body's HMAC-SHA256 (hex,
        with or without a 'sha256=' prefix)."""
        if self.secret is None:
            return True
        if not given or not given.isascii():  # a non-ASCII header cannot be our hex digest
            return False
        given = given.strip()
        if given.lower().startswith("sha256="):
            given = given[7:]
        expected = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, given.lower())

    def delivery_id(self, headers: dict[str, str]) -> str | None:
        """The delivery id of a request, from the first idempotency header present."""
        lower = {k.lower(): v for k, v in headers.items()}
        names = ((self.idempotency_header,) if self.idempotency_header else ()) + DELIVERY_HEADERS
        for n in names:
            v = lower.get(n.lower())
            if v:
                return v.strip()
        return None

    def credential_header(self, name: str) -> bool:
        """True for a header that may carry a credential (its name contains one of
        CREDENTIAL_WORDS, or it is the hook's signature_header): it is never stored."""
        lower = name.lower()
        return lower == self.signature_header.lower() or any(w in lower for w in CREDENTIAL_WORDS)

    def payload(self, headers: dict[str, str], body: bytes, content_type: str) -> dict[str, Any]:
        """The job's one argument, less credential headers. JSON bodies are parsed
        (ValueError if they do not parse); others travel as base64 with their content type."""
        kept = {k: v for k, v in headers.items() if not self.credential_header(k)}
        arg: dict[str, Any] = {"hook": self.name, "headers": kept}
        if _is_json(content_type):
            arg["json"] = _decode_json(body)
        else:
            arg["body_b64"] = base64.b64encode(body).decode("ascii")
            arg["content_type"] = content_type
        return arg


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_json(body: bytes) -> Any:
    """Strict JSON (no NaN or Infinity, which could not be stored as JSON)."""
    text = body.decode("utf-8")
    # The body is the job's argument three levels down ([{"json": body}]): the same bound
    # as a request's, so the job can be read back.
    deepest = protocol.MAX_DEPTH - 3
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"the JSON body nests more than {deepest} levels deep") from None
    if protocol.too_deep(value, deepest):
        raise ValueError(f"the JSON body nests more than {deepest} levels deep")
    if "\\ud" in text.lower():  # a \uD800-\uDFFF escape: is it part of a valid pair?
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError is a ValueError
    return value


def _is_json(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def parse_hooks(table: dict[str, Any]) -> dict[str, Hook]:
    """Validate the `hooks` table → {name: Hook}. Raises ValueError naming the problem."""
    hooks: dict[str, Hook] = {}
    for name, spec in table.items():
        where = f"hooks.{name}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: a hook name is 1-100 letters, digits, '_', '-' or '.'")
        if not isinstance(spec, dict):
            raise ValueError(f"{where} must be a table")
        extra = spec.keys() - _FIELDS
        if extra:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        workflow = spec.get("workflow")
        if workflow is not None:
            if not isinstance(workflow, str) or not workflow or "func" in spec:
                raise ValueError(f"{where}: workflow must be the name of a declared workflow, and no func")
            func = ""
        else:
            try:
                func = protocol.normalize_func(spec.get("func"))
            except QueueError:
                raise ValueError(f"{where}: func must be 'module:function'") from None
        for field in ("key", "secret_file", "idempotency_header", "signature_header"):
            v = spec.get(field)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{where}: {field} must be a non-empty string")
        max_body = spec.get("max_body", DEFAULT_MAX_BODY)
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 0:
            raise ValueError(f"{where}: max_body must be a number of bytes")
        secret = None
        if spec.get("secret_file"):
            try:
                with open(spec["secret_file"], "rb") as f:
                    secret = f.read().strip()
            except OSError as e:
                raise ValueError(f"{where}: cannot read secret_file: {e.strerror or e}") from None
            if not secret:
                raise ValueError(f"{where}: secret_file {spec['secret_file']} is empty")
        job = []
        for field in JOB_FIELDS:
            if spec.get(field) is not None:
                try:
                    job.append((field, protocol.check_field(field, spec[field])))
                except QueueError as e:
                    raise ValueError(f"{where}: {e.message}") from None
        hooks[name] = Hook(name, func, spec.get("key"), secret, spec.get("idempotency_header"),
                           spec.get("signature_header") or SIGNATURE_HEADER, max_body, tuple(job), workflow)
    return hooks


def idempotency_key(hook: Hook, delivery_id: str) -> str:
    """The job's idempotency key for a delivery; long ids are hashed to fit the key limit."""
    key = f"hook:{hook.name}:{delivery_id}"
    if len(key) > protocol.MAX_KEY_LEN:
        key = f"hook:{hook.name}:sha256:{hashlib.sha256(delivery_id.encode()).hexdigest()}"
    return key
