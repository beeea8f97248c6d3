"""API keys, the tenant each key belongs to, and each tenant's share of the queue.

With keys configured (``--api-key``, ``--api-key-file``: one ``key [tenant-name]`` per line, ``#``
comments), every route but ``/health`` needs ``Authorization: Bearer <key>`` (or ``x-api-key``),
else 401.  The key's tenant salts the prefix cache (``runtime/request.py``): the namespace
comes from the key, never from a client field, so a tenant only hits prefixes it computed
itself (a cached prefix is observably faster: CVE-2025-46570).  The one opt-in is
``--public-system-prompt FILE``: a chat request whose first message is a system message with
exactly that text shares the rendered system part (not tools, not later messages) across tenants.  A tenant may have at most
``cap`` requests running or waiting; beyond it, 429 with ``Retry-After``.  A request's session
(``user`` field or ``X-Session-Id`` header) is scoped by its tenant too.

The operator: with keys on, ``/metrics``, ``/debug/kv`` and the API docs (``/docs``, ``/redoc``,
``/openapi.json``) show every tenant's traffic, so only an operator key opens them (403 for
tenant keys).  An operator key is given with ``--operator-key`` or as a key-file line naming the
tenant ``@operator``; the operator is a tenant of its own for everything else.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvreuse.runtime.request import PUBLIC, CacheScope
from kvreuse.runtime.server.errors import APIError

OPEN_PATHS = frozenset({"/health"})
OPERATOR = "@operator"  # the tenant name of operator keys
OPERATOR_PATHS = frozenset(
    {"/metrics", "/v1/loads", "/debug/kv", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)


def load_keys(
    keys: list[str] | None, key_file: str | Path | None, operator_keys: list[str] | None = None
) -> dict[str, str]:
    """key -> tenant name; a key without a name is its own tenant, named by a digest (never the key);
    ``operator_keys`` belong to the tenant ``@operator``."""
    entries = [(k, None) for k in keys or []] + [(k, OPERATOR) for k in operator_keys or []]
    if key_file is not None:
        for n, line in enumerate(Path(key_file).read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) > 2:
                raise ValueError(f"{key_file}:{n}: expected 'key [tenant-name]', got {len(parts)} fields")
            entries.append((parts[0], parts[1] if len(parts) == 2 else None))
    out: dict[str, str] = {}
    for key, name in entries:
        out[key] = name or "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return out


class Tenants:
    """Authentication and per-tenant admission for one server."""

    def __init__(
        self, keys: dict[str, str], cap: int, retry_after_s: int = 1, public_system: str | None = None
    ) -> None:
        if cap < 1:
            raise ValueError(f"the per-tenant request cap must be >= 1, got {cap}")
        self.keys, self.cap, self.retry_after_s = keys, cap, retry_after_s
        self.public_system = public_system
        self.in_flight: Counter[str | None] = Counter()
        self.rejected: Counter[str | None] = Counter()

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, path: str, headers) -> str | None:
        """The caller's tenant (``None`` without keys); raises 401 when keys are set and it has none."""
        if not self.keys or path in OPEN_PATHS:
            return None
        auth = headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
        for key, tenant in self.keys.items():
            if given and hmac.compare_digest(given.encode(), key.encode()):
                if path in OPERATOR_PATHS and tenant != OPERATOR:
                    raise APIError(
                        403, f"{path} shows every tenant's traffic: it needs an operator key (--operator-key)",
                        type="permission_error", code="forbidden",
                    )  # fmt: skip
                return tenant
        raise APIError(
            401, "a valid API key is required (Authorization: Bearer <key>)",
            type="authentication_error", code="invalid_api_key",
        )  # fmt: skip

    def sees_all(self, tenant: str | None) -> bool:
        """Whether ``tenant`` may see figures of every tenant (no keys, or the operator)."""
        return not self.keys or tenant == OPERATOR

    def scope(self, tenant: str | None, session: str | None, public_len: int = 0) -> CacheScope:
        if tenant is None and session is None:
            return PUBLIC
        return CacheScope(tenant, public_len, None if session is None else (tenant, session))

    def public_len(self, prompt: Any) -> int:
        """Tokens of a chat prompt shared across tenants: the opted-in system prompt, when it opens it.

        Only the system message and template glue before anything else count: tools rendered
        into the system block, or any other message, end the public part.
        """
        messages = getattr(prompt, "messages", None)
        if self.public_system is None or not messages:
            return 0
        if messages[0]["role"] != "system" or messages[0]["content"] != self.public_system:
            return 0
        end = 0
        for seg in prompt.rendered.segments:
            if seg.message_index not in (None, 0) or seg.kind not in ("system", "message", "template"):
                break
            end = seg.token_end
        return end

    def admit(self, tenant: str | None, slots: int) -> None:
        if tenant is not None and self.in_flight[tenant] + slots > self.cap:
            self.rejected[tenant] += 1
            raise APIError(
                429, f"too many requests in flight for this key (limit {self.cap}); retry shortly",
                type="rate_limit_error", code="tenant_limit", headers={"Retry-After": str(self.retry_after_s)},
            )  # fmt: skip
        self.in_flight[tenant] += slots

    def release(self, tenant: str | None, slots: int) -> None:
        self.in_flight[tenant] -= slots


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its tenant (None without keys) and its ``X-Session-Id`` header.  A run asks
    it once for its cache scope, when it has rendered its prompt (the public part depends on it)."""

    tenants: Tenants
    tenant: str | None = None
    header_session: str | None = None

    def scope(self, session: str | None, prompt: Any = None) -> CacheScope:
        """The scope of a request naming ``session`` in its body (else the header's) for ``prompt``."""
        session = session or self.header_session
        return self.tenants.scope(self.tenant, session, self.tenants.public_len(prompt))
