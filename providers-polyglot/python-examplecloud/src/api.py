"""Example Cloud's REST API: the requests the provider sends, and how each answer maps onto the
contract (instance state, error class).

    POST   /projects/<p>/instances               {name, size, port, labels, userData}
    GET    /projects/<p>/instances/<name>
    DELETE /projects/<p>/instances/<name>
    GET    /projects/<p>/instances?label=<k>%3D<v>&label=...
    GET    /projects/<p>/health

An instance answers `{name, labels, status, ip, createdAt}`; errors answer
`{"error": {"code", "message"}}`.
"""

import json
from urllib.parse import quote

from componentize_py_types import Err
from wit_world.imports import http
from wit_world.imports.types import ErrorClass, Instance, InstanceState, ProviderError

# The labels every instance carries: the contract's marks (guest_sdk's LABEL_* constants).
LABEL_MANAGED = "egress-proxies.crawl.example.com/managed"
LABEL_UID = "egress-proxies.crawl.example.com/uid"
LABEL_INSTALLATION = "egress-proxies.crawl.example.com/installation"

STATES = {
    "running": InstanceState.RUNNING,
    "stopped": InstanceState.STOPPED,
    "terminated": InstanceState.TERMINATED,
    "deleting": InstanceState.TERMINATED,
}


def error(class_, reason, message):
    return Err(ProviderError(class_, message, reason))


def send(method, url, body=None):
    """Sends a request with a JSON body, if any. The URL names its resource; the body never
    appears in an error (it carries cloud-init)."""
    headers = [("accept", "application/json")]
    if body is not None:
        headers.append(("content-type", "application/json"))
        body = json.dumps(body, separators=(",", ":")).encode()
    request = http.Request(method, url, headers, body, None)
    try:
        return http.send(request)
    except Err as e:
        raise transport_error(method, url, e.value)


def transport_error(method, url, e):
    if isinstance(e, http.HttpError_Denied):
        return error(ErrorClass.PERMANENT, "Denied", f"{method} {url}: {e.value}")
    if isinstance(e, http.HttpError_Credential):
        return error(ErrorClass.PERMANENT, "Credential", f"{method} {url}: {e.value}")
    if isinstance(e, http.HttpError_Timeout):
        return error(ErrorClass.TRANSIENT, "Timeout", f"{method} {url} timed out")
    if isinstance(e, http.HttpError_TooLarge):
        return error(
            ErrorClass.TRANSIENT, "TooLarge", f"{method} {url}: answer larger than {e.value} bytes"
        )
    return error(ErrorClass.TRANSIENT, "Transport", f"{method} {url}: {e.value}")


def status_error(method, url, r):
    """The API's error answer as a classified error: 404 NotFound, 429 quota, 5xx transient,
    anything else permanent (the request itself is wrong)."""
    try:
        detail = json.loads(r.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = ""
    message = f"{method} {url}: HTTP {r.status} {detail}".rstrip()
    if r.status == 404:
        return error(ErrorClass.NOT_FOUND, "NotFound", message)
    if r.status == 429:
        return error(ErrorClass.QUOTA_EXCEEDED, "RateLimited", message)
    if 500 <= r.status <= 599:
        return error(ErrorClass.TRANSIENT, f"HTTP{r.status}", message)
    if r.status in (401, 403):
        return error(ErrorClass.PERMANENT, "Unauthorized", message)
    return error(ErrorClass.PERMANENT, f"HTTP{r.status}", message)


def is_success(r):
    return 200 <= r.status < 300


def answer_json(method, url, r):
    try:
        return json.loads(r.body)
    except ValueError as e:
        raise error(ErrorClass.TRANSIENT, "BadAnswer", f"{method} {url}: not JSON: {e}")


def from_json(v):
    """An instance answer as the contract's instance."""
    labels = v.get("labels") or {}
    state = STATES.get(v.get("status"), InstanceState.PROVISIONING)
    name = str(v.get("name") or "")
    ip = v.get("ip")
    return Instance(
        provider_id=name,
        name=name,
        uid=str(labels.get(LABEL_UID) or ""),
        installation=str(labels.get(LABEL_INSTALLATION) or ""),
        state=state,
        # Only a running instance serves; an address on a stopped one is stale.
        ip=ip if state == InstanceState.RUNNING and isinstance(ip, str) else None,
        created_at=str(v.get("createdAt") or ""),
    )


def query_value(s):
    """Percent-encodes a query value (labels contain `/` and `=`)."""
    return quote(s, safe="-_.~")
